"""The admission check of InferenceTunings (controller/admission.py) and its registration."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import kopf
import pytest
from kubernetes import client

from infertune.controller import admission
from infertune.controller.admission import (
    MAX_MESSAGE,
    MAX_WARNING,
    check_tuning,
    refusal,
    rivals_warning,
    verdict,
)
from infertune.kube.webhook_tls import write_self_signed
from infertune.kube.webhooks import (
    HANDLER_ID,
    SPEC_CHANGED,
    TUNING_HANDLER_ID,
    WebhookRegistration,
)

VALID: dict[str, Any] = {
    "apiVersion": "infertune.io/v1alpha1", "kind": "InferenceTuning",
    "metadata": {"name": "llama", "namespace": "serving"},
    "spec": {"targetRef": {"name": "vllm"}, "engine": "vllm",
             # 500ms: vLLM's latency histogram cannot tell 75 ms (the default) apart.
             "autoscaling": {"minReplicas": 1, "maxReplicas": 4,
                             "latency": {"target": "500ms"}}},
}
BOUNDS = "spec.autoscaling.minReplicas: 5 is above maxReplicas 2"


def tuning(**spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(VALID)
    body["spec"].update(spec)
    return body


def inverted() -> dict[str, Any]:
    return tuning(autoscaling={"minReplicas": 5, "maxReplicas": 2})


def test_a_valid_spec_is_admitted() -> None:
    assert verdict(VALID, None) == admission.Verdict((), ())


def test_an_invalid_spec_is_refused_with_the_field_and_what_to_do() -> None:
    found = verdict(inverted(), None)
    assert len(found.refused) == 1
    assert found.refused[0].startswith(BOUNDS)
    assert "lower minReplicas or raise maxReplicas" in found.refused[0]
    message = refusal("llama", found.refused)
    assert message.startswith(f"InferenceTuning llama: {BOUNDS}")
    assert "infertune validate" in message


def test_every_problem_is_named() -> None:
    body = inverted()
    del body["spec"]["engine"]
    found = verdict(body, None)
    assert [p.split(":")[0] for p in found.refused] == ["spec.engine",
                                                        "spec.autoscaling.minReplicas"]


def test_a_spec_validate_refuses_but_the_models_take_is_refused_on_create() -> None:
    """api/spec.apply_problems: a selector no node can carry picks no node, without a word."""
    body = tuning(mig={"profile": "3g.40gb", "nodeSelector": {"gpu type": "a100"}})
    found = verdict(body, None)
    assert [p.split(":")[0] for p in found.refused] == ["spec.mig.nodeSelector['gpu type']"]


def test_a_missing_spec_is_refused() -> None:
    body = copy.deepcopy(VALID)
    del body["spec"]
    assert verdict(body, None).refused == ("spec: is required; add it",)


def test_a_generated_name_is_not_a_problem() -> None:
    """The API server generates the name after the mutating webhooks have run."""
    body = copy.deepcopy(VALID)
    body["metadata"] = {"generateName": "llama-", "namespace": "serving"}
    assert verdict(body, None) == admission.Verdict((), ())
    assert verdict({**inverted(), "metadata": body["metadata"]}, None).refused
    assert refusal("", ("x: y",)).startswith("InferenceTuning (generated name): x: y.")


def test_an_update_that_leaves_the_spec_is_not_checked() -> None:
    """kopf's finalizer and annotations on a tuning stored before a rule was tightened."""
    stored = inverted()
    labelled = copy.deepcopy(stored)
    labelled["metadata"]["labels"] = {"team": "a"}
    assert verdict(labelled, stored) == admission.Verdict((), ())


def test_an_object_being_deleted_is_not_checked() -> None:
    stored = tuning()
    going = inverted()
    going["metadata"]["deletionTimestamp"] = "2026-12-06T10:00:00Z"
    assert verdict(going, stored) == admission.Verdict((), ())


def test_an_update_is_refused_only_for_problems_the_stored_object_did_not_have() -> None:
    stored = inverted()
    edited = copy.deepcopy(stored)
    edited["spec"]["mode"] = "DryRun"
    kept = verdict(edited, stored)
    assert kept.refused == ()
    assert len(kept.kept) == 1 and kept.kept[0].startswith(BOUNDS)

    worse = copy.deepcopy(edited)
    del worse["spec"]["engine"]
    found = verdict(worse, stored)
    assert [p.split(":")[0] for p in found.refused] == ["spec.engine"]
    assert len(found.kept) == 1

    # A problem the stored object had, with other numbers, is a new one.
    other = copy.deepcopy(stored)
    other["spec"]["autoscaling"]["minReplicas"] = 6
    assert verdict(other, stored).refused[0].startswith(
        "spec.autoscaling.minReplicas: 6 is above maxReplicas 2")


def test_a_problem_the_stored_object_hid_is_refused_in_the_section_edited_only() -> None:
    """pydantic skips a model's cross-field rules while one of its fields fails: the stored
    tuning's min above max was never listed, and the edit that fixed its sustain was
    refused for it as a new problem, while the docs promised otherwise."""
    stored = tuning(autoscaling={"minReplicas": 5, "maxReplicas": 2,
                                 "queue": {"sustain": "20m"}, "latency": {"target": "1s"}},
                    mig={"profile": "3g.40gb", "nodeSelector": {"gpu type": "a100"}})
    assert [p.split(":")[0] for p in verdict(stored, None).refused] == [
        "spec.autoscaling.queue.sustain"]  # the rest hidden behind it
    fixed = copy.deepcopy(stored)
    fixed["spec"]["autoscaling"]["queue"]["sustain"] = "30s"
    found = verdict(fixed, stored)
    # Its own section's hidden problem is said now; another section's is left as it was.
    assert [p.split(":")[0] for p in found.refused] == ["spec.autoscaling.minReplicas"]
    relabelled = copy.deepcopy(stored)
    relabelled["spec"]["mode"] = "DryRun"
    assert verdict(relabelled, stored).refused == ()
    # The autoscaling fixed whole: the MIG selector it hid (a problem only validate and this
    # check refuse) is kept, with a warning.
    whole = copy.deepcopy(fixed)
    whole["spec"]["autoscaling"]["minReplicas"] = 1
    found = verdict(whole, stored)
    assert found.refused == () and found.kept == ()
    assert [p.split(":")[0] for p in found.unjudged] == ["spec.mig.nodeSelector['gpu type']"]
    warned = check(whole, stored)
    assert len(warned) == 1 and warned[0].startswith(
        "infertune: let through in a section this change leaves as it was (the stored spec "
        "has other problems): spec.mig.nodeSelector['gpu type']"), warned


def test_an_edit_of_a_tuning_stored_invalid_is_refused_for_what_it_breaks_elsewhere() -> None:
    """Stored failing the models (min above max), the checks across fields had not run on it:
    a change of spec.engine that makes spec.batching.knob wrong was let through, the
    batching section being as it was, with the warning that it was stored so before."""
    stored = tuning(engine="vllm", batching={"knob": "max-num-seqs", "mode": "Recommend"},
                    autoscaling={"minReplicas": 5, "maxReplicas": 2})
    edited = copy.deepcopy(stored)
    edited["spec"]["engine"] = "tgi"
    edited["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2}
    found = verdict(edited, stored)
    assert [p.split(":")[0] for p in found.refused] == ["spec.batching.knob"], found
    assert found.kept == found.unjudged == ()
    # A field no batching rule reads changes nothing of it: a fix of spec.metrics alone is
    # let through with the batching problem as it was (it was refused for it).
    stored = tuning(engine="vllm", batching={"knob": "max-batch-total-tokens",
                                             "mode": "Recommend"},
                    metrics={"queueDepth": "bad name!"})
    fixed = copy.deepcopy(stored)
    fixed["spec"]["metrics"] = {"queueDepth": "vllm:num_requests_waiting"}
    found = verdict(fixed, stored)
    assert found.refused == (), found
    assert [p.split(":")[0] for p in found.unjudged] == ["spec.batching.knob"]


def test_a_problem_an_edit_makes_in_a_section_it_left_alone_is_refused() -> None:
    """The stored tuning passed the models (a MIG selector key only this check refuses): every
    check ran on it, so a problem it did not have is new wherever it is said. A change of
    spec.engine alone makes spec.batching.knob wrong: it was let through as "stored with
    this problem before", and the operator then stopped autoscaling the tuning."""
    stored = tuning(engine="vllm", batching={"mode": "Recommend", "knob": "max-num-seqs"},
                    mig={"profile": "3g.40gb", "nodeSelector": {"bad key!": "x"}})
    assert [p.split(":")[0] for p in verdict(stored, None).refused] == [
        "spec.mig.nodeSelector['bad key!']"]
    edited = copy.deepcopy(stored)
    edited["spec"]["engine"] = "sglang"
    found = verdict(edited, stored)
    assert [p.split(":")[0] for p in found.refused] == ["spec.batching.knob"], found


def test_an_edit_of_a_tuning_stored_invalid_is_checked_in_the_sections_it_changes() -> None:
    stored = inverted()
    edited = copy.deepcopy(stored)
    edited["spec"]["mig"] = {"nodeSelector": {"pool": "a100"}}  # neither profile nor sizing
    found = verdict(edited, stored)
    assert [p.split(":")[0] for p in found.refused] == ["spec.mig.profile"]
    assert len(found.kept) == 1 and found.kept[0].startswith(BOUNDS)


@pytest.mark.parametrize(("problem", "field"), [
    ("spec.autoscaling.minReplicas: 5 is above", "autoscaling"),
    ("spec.mig.nodeSelector['a.b/c']: x", "mig"),
    ("spec.canary.steps[1].weight: x", "canary"),
    ("spec.engine: is required; add it", "engine"),
    ("spec: is required; add it", None),
])
def test_a_problem_is_tied_to_its_section_of_the_spec(problem: str, field: str | None) -> None:
    assert admission.section(problem) == field


def test_an_update_that_breaks_a_valid_spec_is_refused() -> None:
    assert verdict(inverted(), tuning()).refused[0].startswith(BOUNDS)


def test_a_long_refusal_counts_the_problems_it_leaves_out() -> None:
    problems = tuple(f"spec.x[{i}]: " + "y" * 300 for i in range(40))
    message = refusal("t", problems)
    shown = sum(f"spec.x[{i}]:" in message for i in range(40))
    assert 0 < shown < 40
    assert f"; and {40 - shown} more." in message
    assert len(message) < MAX_MESSAGE + 300
    # One problem longer than the whole is cut, not dropped.
    assert "spec.z: " in refusal("t", ("spec.z: " + "w" * (2 * MAX_MESSAGE),))


def test_rivals_are_named_and_the_tuning_itself_is_not() -> None:
    assert rivals_warning("a", "vllm", [{"name": "a"}]) is None
    assert rivals_warning("a", "vllm", None) is None
    assert rivals_warning("a", "vllm", [{"name": "a"}, {"name": "b"}]) == (
        "InferenceTuning b targets Deployment vllm too: its new pods are tuned by none of "
        "them until only one does")
    many = rivals_warning("a", "vllm", [{"name": n} for n in "edcbf"])
    assert many is not None
    assert many.startswith("InferenceTunings b, c, d and 2 more target Deployment vllm too")
    long = rivals_warning("a", "v" * 253, [{"name": "b" * 253}])
    assert long is not None and len(long) == MAX_WARNING


def test_a_trial_beside_the_tuning_in_force_is_no_rival() -> None:
    """A trial (mode DryRun) changes nothing: the one in force tunes the pods beside it."""
    trial = {"name": "t", "spec": {"mode": "DryRun"}}
    live = {"name": "a", "spec": {}}
    assert rivals_warning("a", "vllm", [live, trial]) is None
    assert rivals_warning("t", "vllm", [live, trial], forced=False) == (
        "InferenceTuning a (mode Enforce) tunes the pods of Deployment vllm: this trial "
        "reports its plan in status and does not annotate them")
    # Two in force: only they are named, beside the trial too.
    both = [live, {"name": "b", "spec": {"mode": "Enforce"}}, trial]
    assert rivals_warning("a", "vllm", both) == (
        "InferenceTuning b targets Deployment vllm too: its new pods are tuned by none of "
        "them until only one does")
    assert rivals_warning("t", "vllm", both, forced=False) == (
        "InferenceTunings a, b target Deployment vllm too: its new pods are tuned by none of "
        "them until only one does")
    # Two trials alone annotate none.
    assert rivals_warning("t", "vllm", [trial, {"name": "u", "spec": {"mode": "DryRun"}}],
                          forced=False) is not None


class Index(dict[tuple[str, str], list[dict[str, Any]]]):
    """Stands in for kopf's index: a mapping of keys to the stored values (kopf.Index)."""


def check(body: dict[str, Any], old: dict[str, Any] | None = None,
          index: dict[tuple[str, str], list[dict[str, Any]]] | None = None,
          memo: kopf.Memo | None = None) -> list[str]:
    warnings: list[str] = []
    asyncio.run(check_tuning(body=kopf.Body(body), old=None if old is None else kopf.Body(old),
                             operation="CREATE" if old is None else "UPDATE",
                             warnings=warnings, tunings_by_target=Index(index or {}),
                             memo=memo or kopf.Memo()))
    return warnings


def test_the_handler_refuses_with_a_422_admission_error() -> None:
    with pytest.raises(kopf.AdmissionError) as refused:
        check(inverted())
    assert refused.value.code == 422
    assert str(refused.value).startswith(f"InferenceTuning llama: {BOUNDS}")


def test_the_handler_warns_of_kept_problems_and_rivals() -> None:
    assert check(VALID) == []
    stored = inverted()
    edited = copy.deepcopy(stored)
    edited["spec"]["mode"] = "DryRun"
    warnings = check(edited, stored)
    assert len(warnings) == 1
    assert warnings[0].startswith(f"infertune: stored with this problem before: {BOUNDS}")
    assert all(len(w) <= MAX_WARNING for w in warnings)

    rivals = {("serving", "vllm"): [{"name": "other"}]}
    assert check(VALID, None, rivals) == [
        "infertune: InferenceTuning other targets Deployment vllm too: its new pods are tuned "
        "by none of them until only one does"]
    # Said when the target is chosen, not at every edit of a tuning that has one.
    moved = copy.deepcopy(VALID)
    moved["spec"]["numa"] = {"policy": "none"}
    assert check(moved, VALID, rivals) == []
    # ... and when it goes out of force, or into it (mode).
    trial = copy.deepcopy(VALID)
    trial["spec"]["mode"] = "DryRun"
    assert check(trial, VALID, rivals) == [
        "infertune: InferenceTuning other (mode Enforce) tunes the pods of Deployment vllm: "
        "this trial reports its plan in status and does not annotate them"]
    assert check(VALID, trial, rivals) == [
        "infertune: InferenceTuning other targets Deployment vllm too: its new pods are tuned "
        "by none of them until only one does"]
    # Not in another namespace.
    assert check(VALID, None, {("other", "vllm"): [{"name": "other"}]}) == []


def test_batching_without_autoscaling_is_said_to_be_not_acted_on_when_asked_for() -> None:
    """spec.batching in Recommend or Auto is read by the autoscaler's evaluations alone:
    without spec.autoscaling it was accepted without a word, and taken for tuned."""
    from infertune.api.scaling import BATCHING_UNUSED

    batching = copy.deepcopy(VALID)
    batching["spec"].pop("autoscaling", None)
    batching["spec"]["batching"] = {"mode": "Recommend"}
    said = [f"infertune: spec.batching is {BATCHING_UNUSED}"]
    assert said[0].startswith("infertune: spec.batching is not acted on without "
                              "spec.autoscaling")
    assert check(batching) == said
    off = copy.deepcopy(batching)
    off["spec"]["batching"]["mode"] = "Off"
    assert check(off) == [] and check(batching, off) == said
    # Once, not at every edit; and not with spec.autoscaling, which reads it.
    edited = copy.deepcopy(batching)
    edited["spec"]["numa"] = {"policy": "none"}
    assert check(edited, batching) == []
    scaled = copy.deepcopy(batching)
    scaled["spec"]["autoscaling"] = {"enabled": False, "latency": {"target": "1s"}}
    assert check(scaled) == []
    # The section with its defaults, as the models read it (but the latency target, which
    # vLLM's histogram cannot measure at 75ms).
    scaled["spec"]["autoscaling"] = {"latency": {"target": "1s"}}
    assert check(scaled) == []


def test_a_latency_target_under_the_engines_histogram_is_said_when_asked_for() -> None:
    """vLLM's end-to-end latency histogram starts at 300 ms: a target under it (the default
    75 ms) is never measured, and was accepted without a word, to say
    LatencyTargetBelowResolution only once Prometheus answered."""
    low = copy.deepcopy(VALID)
    low["spec"]["autoscaling"]["latency"] = {}  # the default, 75ms
    said = check(low)
    assert said == [
        "infertune: spec.autoscaling.latency.target 75ms is under 300ms, the lowest bucket of "
        "vllm's latency histogram, and cannot be measured (LatencyTargetBelowResolution); "
        "set 300ms or more, or a finer spec.metrics.latencyHistogram"]
    assert len(said[0]) <= admission.MAX_WARNING  # whole: the advice at its end is kept
    assert check(VALID) == [] and check(low, VALID) == said
    # Once, not at every edit; and not with a histogram of its own, or another engine.
    edited = copy.deepcopy(low)
    edited["spec"]["numa"] = {"policy": "none"}
    assert check(edited, low) == []
    finer = copy.deepcopy(low)
    finer["spec"]["metrics"] = {"latencyHistogram": "router_request_seconds"}
    assert check(finer) == []
    sglang = copy.deepcopy(low)
    sglang["spec"]["engine"] = "sglang"
    assert check(sglang) == []


def test_a_canary_is_said_to_be_not_enforced_when_asked_for() -> None:
    """Accepted and checked, and nothing acts on it yet: an applied spec.canary read as
    guarding the next rollout."""
    canary = copy.deepcopy(VALID)
    canary["spec"]["canary"] = {"steps": [{"weight": 10}, {"weight": 50}]}
    said = ["infertune: spec.canary is not enforced yet: canary rollouts are planned, new "
            "revisions roll out as the Deployment says"]
    assert check(canary) == said
    assert check(canary, VALID) == said
    off = copy.deepcopy(canary)
    off["spec"]["canary"]["enabled"] = False
    assert check(canary, off) == said
    # Once, not at every edit of a tuning that has one; and not for one turned off.
    edited = copy.deepcopy(canary)
    edited["spec"]["numa"] = {"policy": "none"}
    assert check(edited, canary) == []
    assert check(off) == [] and check(off, canary) == []


def test_tunings_outside_the_watched_namespaces_are_not_checked() -> None:
    """--namespace 'team-*' cannot be a namespaceSelector, so the API server sends every
    namespace's tunings: another operator's (or none's) were refused."""
    # kopf's reading: each --namespace is a pattern of its own, a namespace is watched when
    # one matches (so `-n 'team-*' -n '!team-test'` would be every namespace but team-test).
    registration = WebhookRegistration(excluded_namespaces=(),
                                       included_namespaces=("team-*,!team-test", "ml"))

    class Server:
        pass

    server = Server()
    server.registration = registration  # type: ignore[attr-defined]
    memo = kopf.Memo(webhook_server=server)
    outside = inverted()
    outside["metadata"]["namespace"] = "other"
    assert check(outside, memo=memo) == []
    excluded = copy.deepcopy(outside)
    excluded["metadata"]["namespace"] = "team-test"
    assert check(excluded, memo=memo) == []
    for namespace in ("team-a", "ml"):
        inside = copy.deepcopy(outside)
        inside["metadata"]["namespace"] = namespace
        with pytest.raises(kopf.AdmissionError):
            check(inside, memo=memo)
    # Cluster-wide: every namespace.
    with pytest.raises(kopf.AdmissionError):
        check(outside, memo=kopf.Memo(webhook_server=type("S", (), {
            "registration": WebhookRegistration(excluded_namespaces=())})()))


def test_a_failure_of_the_check_admits_the_tuning(monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """kopf refuses the request on any other exception: a bug in the check must not stop
    every apply."""
    def broken(*_: Any) -> admission.Verdict:
        raise RuntimeError("bug")

    monkeypatch.setattr(admission, "verdict", broken)
    warnings = check(inverted())
    assert warnings == ["infertune: the spec could not be checked; it is admitted, and the "
                        "tuning's Ready condition says whether it is valid"]
    assert "could not check InferenceTuning llama" in caplog.text


KOPF = {"url": "https://10.0.0.5:9443", "caBundle": "Q0E="}


def hooks(registration: WebhookRegistration) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in registration.body(KOPF)["webhooks"]}


def test_the_check_is_registered_next_to_the_pod_webhook() -> None:
    registration = WebhookRegistration(excluded_namespaces=("kube-system", "infertune-system"))
    found = hooks(registration)
    assert set(found) == {"pods.infertune.io", "inferencetunings.infertune.io"}
    hook = found["inferencetunings.infertune.io"]
    assert hook["rules"] == [{"apiGroups": ["infertune.io"], "apiVersions": ["v1alpha1"],
                              "resources": ["inferencetunings"],
                              "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}]
    assert hook["clientConfig"] == {"caBundle": "Q0E=",
                                    "url": f"https://10.0.0.5:9443/{TUNING_HANDLER_ID}"}
    assert found["pods.infertune.io"]["clientConfig"]["url"].endswith(f"/{HANDLER_ID}")
    # A stopped operator never blocks an apply.
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["matchConditions"] == [{"name": "spec-changed", "expression": SPEC_CHANGED}]
    # Cluster-wide: every namespace, the operator's and kube-system too (a refused tuning
    # stops no pod).
    assert hook["namespaceSelector"] == {"matchExpressions": []}

    namespaced = hooks(WebhookRegistration(excluded_namespaces=("kube-system",),
                                           included_namespaces=("team-b", "team-a")))
    assert namespaced["inferencetunings.infertune.io"]["namespaceSelector"] == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                              "values": ["team-a", "team-b"]}]}

    service = WebhookRegistration(excluded_namespaces=(),
                                  service=("infertune-system", "infertune-webhook", 443))
    assert hooks(service)["inferencetunings.infertune.io"]["clientConfig"] == {
        "caBundle": "Q0E=", "service": {"namespace": "infertune-system",
                                        "name": "infertune-webhook", "port": 443,
                                        "path": f"/{TUNING_HANDLER_ID}"}}


def test_a_check_added_by_an_upgrade_trusts_the_ca_the_pod_webhook_trusted(
        tmp_path: Path) -> None:
    """Registered by the new pod of a rolling upgrade from a release without the check: the
    old pod, which still answers through the same Service, is trusted for it too."""
    import base64

    old_cert, _ = write_self_signed(tmp_path / "old", ["infertune-webhook.infertune-system.svc"],
                                    days=30)
    new_cert, _ = write_self_signed(tmp_path / "new", ["infertune-webhook.infertune-system.svc"],
                                    days=30)
    old_ca = base64.b64encode(old_cert.read_bytes()).decode()
    new_ca = base64.b64encode(new_cert.read_bytes()).decode()
    registration = WebhookRegistration(
        excluded_namespaces=(), service=("infertune-system", "infertune-webhook", 443))
    current = client.V1MutatingWebhookConfiguration(webhooks=[client.V1MutatingWebhook(
        name="pods.infertune.io", admission_review_versions=["v1"], side_effects="None",
        client_config=client.AdmissionregistrationV1WebhookClientConfig(
            ca_bundle=old_ca, service=client.AdmissionregistrationV1ServiceReference(
                namespace="infertune-system", name="infertune-webhook", port=443)))])
    for hook in registration.body({"caBundle": new_ca})["webhooks"]:
        bundle = registration._also_trusting(hook, current)["clientConfig"]["caBundle"]
        held = base64.b64decode(bundle)
        assert old_cert.read_bytes().strip() in held, hook["name"]
        assert held.startswith(new_cert.read_bytes().strip()), hook["name"]
