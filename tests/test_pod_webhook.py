"""The pod webhook's handler while the operator starts: kopf serves admission before its
indexes hold their first listing."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kopf
import pytest

from infertune.controller import pods
from infertune.controller.pods import PodTuningSettings, indexes_loaded, tune_pod

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {
    "name": "qwen-5d4f8b9c7-bcdfg", "namespace": "ml",
    "ownerReferences": [{"kind": "ReplicaSet", "name": "qwen-5d4f8b9c7", "controller": True}]},
    "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                             "command": ["vllm", "serve", "Qwen/Qwen2-7B-Instruct"]}]}}
TUNING = {"name": "qwen", "uid": "u1", "generation": 1,
          "spec": {"targetRef": {"name": "qwen"}, "engine": "vllm"}}


async def admit(memo: kopf.Memo, loaded: dict[str, Any],
                dryrun: bool = False) -> tuple[kopf.Patch, list[str]]:
    """The handler as kopf calls it; `loaded` holds the indexes as they are when it reads
    them (filled in place once listed)."""
    patch, warnings = kopf.Patch(), []
    await tune_pod(body=kopf.Body(POD), patch=patch, warnings=warnings, memo=memo,
                   tunings_by_target=loaded.setdefault("tunings", {}),
                   replicaset_owners=loaded.setdefault("owners", {}),
                   limit_ranges=loaded.setdefault("limits", {}), dryrun=dryrun)
    return patch, warnings


def test_a_pod_admitted_while_the_indexes_load_waits_for_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Read before the first listing, the indexes were empty: every pod created at a start or
    a rolling upgrade was admitted untuned, and evicted by re-tuning later."""
    # Longer than the test waits: the node event must wake it, not the fallback's timeout.
    monkeypatch.setattr(pods, "INDEX_WAIT_S", 60.0)
    memo = kopf.Memo(pod_tuning=PodTuningSettings(launcher_image="infertune:test"))
    loaded: dict[str, Any] = {}

    async def scenario() -> tuple[kopf.Patch, list[str]]:
        admission = asyncio.create_task(admit(memo, loaded))
        await asyncio.sleep(0.1)
        assert not admission.done()  # waiting, not admitting an empty answer
        loaded["owners"][("ml", "qwen-5d4f8b9c7")] = ["qwen"]  # kopf lists, then calls handlers
        loaded["tunings"][("ml", "qwen")] = [TUNING]
        await indexes_loaded(memo=memo)
        return await asyncio.wait_for(admission, 5)

    patch, warnings = asyncio.run(scenario())
    assert patch.fns, warnings  # tuned: the JSON patch is queued for kopf
    # ... and it tunes the pod as kopf applies it (in place, on the body it is given): a
    # patch that changed a copy passed every unit test.
    pod = copy.deepcopy(POD)
    for fn in patch.fns:
        fn(pod)
    (serving,) = pod["spec"]["containers"]
    assert serving["command"][:2] == ["/infertune/infertune-launch", "--"], serving
    assert pod["metadata"]["labels"]["infertune.io/tuned-by"] == "qwen"
    # Once loaded, nothing waits.
    assert asyncio.run(asyncio.wait_for(admit(memo, loaded), 0.5))[0].fns


def test_without_a_node_event_the_indexes_are_read_as_they_are_after_one_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No node to watch (or a slow listing): the first pod waits once, then the indexes are
    read as loaded, as before the wait; later pods do not wait (the admission of every pod
    would have paid it)."""
    monkeypatch.setattr(pods, "INDEX_WAIT_S", 0.2)
    memo = kopf.Memo(pod_tuning=PodTuningSettings(launcher_image="infertune:test"))
    loaded = {"owners": {("ml", "qwen-5d4f8b9c7"): ["qwen"]},
              "tunings": {("ml", "qwen"): [TUNING]}}

    async def scenario() -> tuple[float, float]:
        started = asyncio.get_running_loop().time()
        first, _ = await admit(memo, loaded)
        waited = asyncio.get_running_loop().time() - started
        assert first.fns  # tuned from what the indexes hold
        started = asyncio.get_running_loop().time()
        second, _ = await admit(memo, loaded)
        assert second.fns
        return waited, asyncio.get_running_loop().time() - started

    waited, then = asyncio.run(scenario())
    assert waited >= 0.2 and then < 0.2
    # Readiness goes by the listing itself, which this fallback does not stand for: it made
    # a process Ready (and the old one of an upgrade stop) with the indexes still loading.
    assert memo.pod_tuning.indexed.is_set() and not memo.pod_tuning.listed.is_set()
    asyncio.run(indexes_loaded(memo=memo))
    assert memo.pod_tuning.listed.is_set()


def test_the_webhook_records_the_revision_of_the_problems_it_reports() -> None:
    """What status.tuning.problems shows is of that revision (re-tuning's in-place changes of
    spec.memory go by it)."""
    from infertune.api.spec import InferenceTuningSpec
    from infertune.tuning.pod_patch import tuning_revision

    memo = kopf.Memo(pod_tuning=PodTuningSettings(launcher_image="infertune:test"))
    memo.pod_tuning.indexed.set()
    loaded = {"owners": {("ml", "qwen-5d4f8b9c7"): ["qwen"]},
              "tunings": {("ml", "qwen"): [TUNING]}}
    asyncio.run(admit(memo, loaded))
    revision = tuning_revision(InferenceTuningSpec.model_validate(TUNING["spec"]))
    assert memo.pod_tuning.problems_revision["ml/qwen"] == revision
    refused = {**TUNING, "generation": 2,
               "spec": {**TUNING["spec"], "memory": {"highRatio": 0.9}}}  # no limit here
    loaded["tunings"][("ml", "qwen")] = [refused]
    asyncio.run(admit(memo, loaded))
    assert memo.pod_tuning.problems_revision["ml/qwen"] == tuning_revision(
        InferenceTuningSpec.model_validate(refused["spec"]))
    (why,) = memo.pod_tuning.latest_problems["ml/qwen"]
    assert why.startswith("spec.memory.highRatio"), why


def test_a_dry_run_is_answered_and_leaves_nothing_to_report() -> None:
    """A dry run (`kubectl apply --dry-run=server`, or a review anyone sent to the port)
    queued a PodNotTuned Event and problems in status for a pod that was never made."""
    refused = {**TUNING, "uid": "u-dry", "spec": {**TUNING["spec"], "memory": {"highRatio": 0.9}}}
    loaded = {"owners": {("ml", "qwen-5d4f8b9c7"): ["qwen"]},
              "tunings": {("ml", "qwen"): [refused]}}
    memo = kopf.Memo(pod_tuning=PodTuningSettings(launcher_image="infertune:test"))
    asyncio.run(indexes_loaded(memo=memo))
    dry, dry_warnings = asyncio.run(admit(memo, loaded, dryrun=True))
    settings = memo.pod_tuning
    assert (settings.problems_revision, settings.unreported, settings.latest_problems) == (
        {}, {}, {})
    real, real_warnings = asyncio.run(admit(memo, loaded))
    assert dry_warnings == real_warnings and len(dry.fns) == len(real.fns) == 1
    assert set(settings.problems_revision) == set(settings.unreported) == {"ml/qwen"}


def test_a_pod_admitted_untuned_says_why_on_itself_for_every_process() -> None:
    """Only the leader re-tunes, and any process's webhook may admit a pod: the verdict kept
    in the admitting process's memory told the leader nothing, and it evicted pod after pod
    that came back untuned (a model reload each), without a word of why."""
    from infertune import keys
    from infertune.api.spec import InferenceTuningSpec
    from infertune.tuning.pod_patch import tuning_revision

    refused = {**TUNING, "uid": "u-refused",  # parsed specs are cached by uid, generation
               "spec": {**TUNING["spec"], "memory": {"highRatio": 0.9}}}
    pod = _admitted([refused])
    revision = tuning_revision(InferenceTuningSpec.model_validate(refused["spec"]))
    said = pod["metadata"]["annotations"][keys.UNTUNED]
    assert said.startswith(f"{revision}: spec.memory.highRatio"), said
    assert pod["spec"] == POD["spec"]  # admitted unchanged but for the annotation
    # A tuned pod carries none.
    assert keys.UNTUNED not in (_admitted([TUNING])["metadata"].get("annotations") or {})


def test_a_pod_of_an_invalid_tuning_is_tuned_as_its_last_valid_generation_said() -> None:
    """An invalid edit anywhere in the spec (here, autoscaling's min above its max) left every
    new pod untuned, with no word on the pod: a scale-out or a lost node brought back pods
    without their binding and allocator while the old ones kept them."""
    from infertune.api.spec import InferenceTuningSpec
    from infertune.tuning.pod_patch import tuning_revision

    memo = kopf.Memo(pod_tuning=PodTuningSettings(launcher_image="infertune:test"))
    memo.pod_tuning.indexed.set()
    valid = {**TUNING["spec"], "memory": {"high": "6Gi"}}
    invalid = {**valid, "memory": {"high": "7Gi"},
               "autoscaling": {"minReplicas": 5, "maxReplicas": 3}}
    broken = {**TUNING, "uid": "u-invalid", "generation": 4, "spec": invalid,
              "applied": {"generation": 3, "spec": valid}}
    loaded = {"owners": {("ml", "qwen-5d4f8b9c7"): ["qwen"]},
              "tunings": {("ml", "qwen"): [broken]}}
    patch, warnings = asyncio.run(admit(memo, loaded))
    pod = copy.deepcopy(POD)
    for fn in patch.fns:
        fn(pod)
    assert pod["metadata"]["annotations"]["infertune.io/memory-high"] == str(6 * 2**30)
    assert pod["metadata"]["labels"]["infertune.io/revision"] == tuning_revision(
        InferenceTuningSpec.model_validate(valid))
    assert ("infertune: InferenceTuning qwen generation 4 is invalid (see its Ready "
            "condition); the pod is tuned as generation 3 said") in warnings, warnings

    # No valid generation before it (or one this operator finds invalid too): untuned, and
    # the pod says so.
    cases = (None, {"generation": 3, "spec": invalid}, {"generation": 4, "spec": valid})
    for number, applied in enumerate(cases):
        # A uid each: a (uid, generation) names one spec (SPECS caches it so).
        loaded["tunings"][("ml", "qwen")] = [{**broken, "uid": f"u-{number}",
                                              "applied": applied}]
        patch, warnings = asyncio.run(admit(memo, loaded))
        assert not patch.fns, applied
        assert any("no earlier generation was valid; the pod is not tuned" in w
                   for w in warnings), warnings


def test_an_invalid_edit_of_the_target_leaves_the_last_valid_target_tuned() -> None:
    """The index filed the tuning under the Deployment the invalid spec names: that one's pods
    were tuned with a spec written for another, and the one it tuned was left untuned without
    a word."""
    valid = {"targetRef": {"name": "qwen"}, "engine": "vllm", "memory": {"high": "6Gi"}}
    invalid = {**valid, "targetRef": {"name": "other"},
               "autoscaling": {"minReplicas": 5, "maxReplicas": 3}}
    body = {"metadata": {"name": "qwen", "namespace": "ml", "uid": "u-retarget",
                         "generation": 2},
            "spec": invalid, "status": {"appliedSpec": {"generation": 1, "spec": valid}}}
    index = asyncio.run(pods.tunings_by_target(namespace="ml", name="qwen", uid="u-retarget",
                                               body=kopf.Body(body)))
    assert list(index) == [("ml", "qwen")]
    memo = kopf.Memo(pod_tuning=PodTuningSettings(launcher_image="infertune:test"))
    memo.pod_tuning.indexed.set()
    loaded = {"owners": {("ml", "qwen-5d4f8b9c7"): ["qwen"]},
              "tunings": {key: [entry] for key, entry in index.items()}}
    patch, warnings = asyncio.run(admit(memo, loaded))
    assert patch.fns and any("tuned as generation 1 said" in w for w in warnings), warnings
    # Valid again, it is filed under the target it names.
    body["spec"], body["metadata"]["generation"] = {**valid, "targetRef": {"name": "other"}}, 3
    index = asyncio.run(pods.tunings_by_target(namespace="ml", name="qwen", uid="u-retarget",
                                               body=kopf.Body(body)))
    assert list(index) == [("ml", "other")]


def test_a_pod_several_tunings_target_is_not_tuned_and_the_warning_counts_them() -> None:
    """Every rival was named, a warning as long as their list (validate and the admission
    check name three and count the rest, as it does now)."""
    memo = kopf.Memo(pod_tuning=PodTuningSettings(launcher_image="infertune:test"))
    rivals = [{**TUNING, "name": f"qwen-{i:02d}", "uid": f"u{i}"} for i in range(40)]
    loaded = {"owners": {("ml", "qwen-5d4f8b9c7"): ["qwen"]},
              "tunings": {("ml", "qwen"): rivals}}
    asyncio.run(indexes_loaded(memo=memo))
    patch, warnings = asyncio.run(admit(memo, loaded))
    assert not patch.fns
    assert warnings == ["infertune: several InferenceTunings (qwen-00, qwen-01, qwen-02 and 37 "
                        "more) target qwen; the pod is not tuned until only one of them is in "
                        "mode Enforce"]


def _admitted(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """POD as the webhook admits it with `entries` targeting its Deployment."""
    memo = kopf.Memo(pod_tuning=PodTuningSettings(launcher_image="infertune:test"))
    loaded = {"owners": {("ml", "qwen-5d4f8b9c7"): ["qwen"]}, "tunings": {("ml", "qwen"): entries}}
    asyncio.run(indexes_loaded(memo=memo))
    patch, _ = asyncio.run(admit(memo, loaded))
    pod = copy.deepcopy(POD)
    for fn in patch.fns:
        fn(pod)
    return pod


def test_a_trial_beside_the_tuning_in_force_leaves_it_the_pods() -> None:
    """DESIGN.md #7, DryRun changes nothing: a trial created beside the tuning in force made
    every new pod of the Deployment untuned (a scale-out under load came up without its NUMA
    binding and allocator). Beside it, the one in force tunes them; two trials alone
    annotate none."""
    trial = {**TUNING, "name": "qwen-trial", "uid": "u2",
             "spec": {**TUNING["spec"], "mode": "DryRun"}}
    for entries in ([TUNING, trial], [trial, TUNING]):
        pod = _admitted(entries)
        assert pod["metadata"]["labels"]["infertune.io/tuned-by"] == "qwen"
        assert "infertune.io/dry-run-plan" not in (pod["metadata"].get("annotations") or {})
    alone = _admitted([trial])
    assert "infertune.io/dry-run-plan" in alone["metadata"]["annotations"]
    two = _admitted([trial, {**trial, "name": "other-trial", "uid": "u3"}])
    assert two == POD
    forced = _admitted([TUNING, {**TUNING, "name": "qwen-2", "uid": "u4"}, trial])
    assert forced == POD


def test_an_invalid_edit_counts_in_the_mode_of_the_spec_it_is_tuned_by() -> None:
    """While the stored spec is invalid, the pods are tuned by the last valid generation (as
    if the edit had been refused), and so is its mode: an invalid edit to DryRun, beside a
    trial, left the pods untuned as a second trial would."""
    valid = {"targetRef": {"name": "qwen"}, "engine": "vllm"}
    invalid = {**valid, "mode": "DryRun", "autoscaling": {"minReplicas": 5, "maxReplicas": 3}}
    body = {"metadata": {"name": "qwen", "namespace": "ml", "uid": "u-live", "generation": 2},
            "spec": invalid, "status": {"appliedSpec": {"generation": 1, "spec": valid}}}
    index = asyncio.run(pods.tunings_by_target(namespace="ml", name="qwen", uid="u-live",
                                               body=kopf.Body(body)))
    (entry,) = index.values()
    assert entry["forced"] is True
    trial = {**TUNING, "name": "qwen-trial", "uid": "u2",
             "spec": {**TUNING["spec"], "mode": "DryRun"}}
    pod = _admitted([entry, trial])
    assert pod["metadata"]["labels"]["infertune.io/tuned-by"] == "qwen"
    # The other way: an invalid edit to Enforce of a trial stays a trial.
    body["spec"] = {**invalid, "mode": "Enforce"}
    body["status"]["appliedSpec"]["spec"] = {**valid, "mode": "DryRun"}
    (entry,) = asyncio.run(pods.tunings_by_target(namespace="ml", name="qwen", uid="u-trial",
                                                  body=kopf.Body(body))).values()
    assert entry["forced"] is False
