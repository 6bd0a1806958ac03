"""The GPU pods the MIG loop finds on a node, from the kopf index over pods (no pod listing)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import kopf
import pytest

from infertune.api.spec import InferenceTuningSpec
from infertune.api.status import MigNodeStatus, MigStatus
from infertune.controller import mig as mig_controller
from infertune.controller.mig import MigSelector, gpu_pods_by_node
from infertune.tuning.mig_nodes import (
    MIG_CAPABLE_LABEL,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    PRODUCT_LABEL,
    NodeView,
)


def pod(node: str | None = "gpu-0", phase: str = "Running",
        **resources: dict[str, str]) -> dict[str, Any]:
    containers = [{"name": "sidecar"}, {"name": "server", "resources": resources}]
    return {"metadata": {"namespace": "team-a", "name": "qwen-1", "uid": "u-1"},
            "spec": {"containers": containers, **({"nodeName": node} if node else {})},
            "status": {"phase": phase}}


def indexed(body: dict[str, Any]) -> dict[str, tuple[str, str]] | None:
    return asyncio.run(gpu_pods_by_node(namespace="team-a", name="qwen-1",
                                        body=kopf.Body(body)))


@pytest.mark.parametrize("resources", [
    {"limits": {"nvidia.com/gpu": "1"}},
    {"requests": {"nvidia.com/gpu": "1"}},
    {"limits": {"nvidia.com/mig-3g.71gb": "1", "cpu": "4"}},
    {"requests": {"cpu": "1"}, "limits": {"nvidia.com/mig-1g.18gb": "2"}},
    # The GPU Operator's time-slicing with renameByDefault: the same GPUs, shared.
    {"limits": {"nvidia.com/gpu.shared": "1"}},
])
def test_a_bound_pod_holding_gpus_is_indexed_by_its_node(resources: dict[str, Any]) -> None:
    assert indexed(pod(**resources)) == {"gpu-0": ("team-a/qwen-1", "u-1")}


@pytest.mark.parametrize("init", [
    {"name": "sidecar", "restartPolicy": "Always",
     "resources": {"limits": {"nvidia.com/mig-3g.71gb": "1"}}},  # holds it for the pod's life
    {"name": "build-engine", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
])
def test_a_pod_whose_init_container_holds_a_gpu_is_indexed(init: dict[str, Any]) -> None:
    """The kubelet gives devices to init containers too: such a pod was not seen, and its
    node counted as idle and was reconfigured under it."""
    body = pod(limits={"cpu": "1"})
    body["spec"]["initContainers"] = [init]
    assert indexed(body) == {"gpu-0": ("team-a/qwen-1", "u-1")}


@pytest.mark.parametrize("phase", ["Pending", "Running", "Unknown"])
def test_a_pod_holds_its_gpus_until_it_has_ended(phase: str) -> None:
    assert indexed(pod(phase=phase, limits={"nvidia.com/gpu": "1"})) == {
        "gpu-0": ("team-a/qwen-1", "u-1")}


@pytest.mark.parametrize(("body", "why"), [
    (pod(limits={"cpu": "2", "memory": "1Gi"}), "no GPU resource"),
    (pod(limits={"example.com/gpu": "1"}), "another vendor's resource"),
    (pod(limits={"nvidia.com/gpus": "1"}), "not nvidia.com/gpu nor a renamed nvidia.com/gpu.*"),
    (pod(node=None, limits={"nvidia.com/gpu": "1"}), "not bound to a node yet"),
    (pod(phase="Succeeded", limits={"nvidia.com/gpu": "1"}), "ended"),
    (pod(phase="Failed", limits={"nvidia.com/gpu": "1"}), "ended"),
    ({"metadata": {"name": "bare"}}, "no spec at all"),
    # A chart's templated GPU count left at 0: it holds none (the node was busy for it).
    (pod(limits={"nvidia.com/gpu": "0"}, requests={"nvidia.com/gpu": 0}), "asks for 0 GPUs"),
    (pod(limits={"nvidia.com/mig-1g.18gb": "0"}), "asks for 0 slices"),
])
def test_pods_that_hold_no_gpu_are_left_out(body: dict[str, Any], why: str) -> None:
    assert indexed(body) is None, why



def node(name: str, product: str, **labels: str) -> NodeView:
    return NodeView(name, {PRODUCT_LABEL: product, MIG_CAPABLE_LABEL: "true", **labels})


def test_config_names_do_not_change_when_gpu_feature_discovery_renames_the_product() -> None:
    """Strategy single: a partitioned A100's product label gains -MIG-1g.5gb. The config must
    keep its name, or the node (already as asked) reads as not configured."""
    spec = InferenceTuningSpec.model_validate({
        "targetRef": {"name": "qwen"}, "engine": "vllm",
        "mig": {"profile": "1g.5gb", "strategy": "single"}})
    renamed = "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    plans, errors, _ = mig_controller._plans(spec, [node("a", "NVIDIA-A100-SXM4-40GB"),
                                                    node("b", renamed)])
    assert errors == []
    names = mig_controller.config_names(plans)
    assert names[renamed] == names["NVIDIA-A100-SXM4-40GB"] == "infertune-a100-sxm4-40gb-7x1g.5gb"


def test_nodes_of_products_whose_pods_need_different_profiles_are_refused() -> None:
    """Pods ask for one profile (status.mig.profile): partitioning H200s for 1g.35gb while the
    pods ask for the A100's 3g.40gb would take them out of service for nothing."""
    spec = InferenceTuningSpec.model_validate({
        "targetRef": {"name": "qwen"}, "engine": "vllm",
        "mig": {"sizing": {"weights": "15Gi", "kvCache": "10Gi"}}})
    _, errors, _ = mig_controller._plans(spec, [node("a", "NVIDIA-A100-SXM4-80GB"),
                                                node("h", "NVIDIA-H200")])
    assert len(errors) == 1 and "narrow spec.mig.nodeSelector to one product" in errors[0]
    assert "NVIDIA-A100-SXM4-80GB: 3g.40gb" in errors[0]


def test_an_operator_knows_which_tunings_it_would_see() -> None:
    """A node's claim, or its drain, lapses when the tuning is not in the index, but only for
    tunings the index would hold: with --namespace, those of the namespaces it names."""
    everywhere = mig_controller.MigSettings.watching("infertune-system", [])
    assert everywhere.cluster_wide and everywhere.sees("any/thing")
    some = mig_controller.MigSettings.watching("infertune-system", ["ml", "team-*", "!x"])
    assert not some.cluster_wide
    assert some.sees("ml/qwen")
    assert not some.sees("team-a/qwen")  # a pattern: not known here
    assert not some.sees("other/qwen") and not some.sees("x/qwen")


def test_a_pass_lock_is_shared_while_held_and_forgotten_once_nobody_holds_it() -> None:
    """A tuning whose spec.mig was removed before it was deleted never reaches the deletion
    handler that used to drop its lock: locks must not outlive their users."""
    held = mig_controller._pass_lock("uid-1")
    with held:
        assert mig_controller._pass_lock("uid-1") is held  # the release waits for the pass
        assert not mig_controller._pass_lock("uid-1").acquire(blocking=False)
    assert mig_controller._pass_lock("uid-2") is not held
    del held
    assert "uid-1" not in mig_controller._PASS_LOCKS
    assert "uid-2" not in mig_controller._PASS_LOCKS


def test_the_node_sweep_ends_with_the_operator() -> None:
    """Left running, kopf waited 5 s for it at every stop, and the Lease of
    `--leader-elect` went to the next operator that much later."""

    async def main() -> bool:
        memo = kopf.Memo(mig=mig_controller.MigSettings("infertune-system"))
        await mig_controller.start_sweeping(memo=memo, tunings_by_target={})
        sweeper = memo.mig_sweeper
        await asyncio.sleep(0)
        assert not sweeper.done()
        await mig_controller.stop_sweeping(memo=memo)
        return bool(sweeper.cancelled())

    assert asyncio.run(main())


def test_a_claim_holds_only_while_its_tunings_selector_matches_the_node() -> None:
    holds = mig_controller.claim_holds((MigSelector("ml/big", (("pool", "a"),)),
                                        MigSelector("ml/any", ())))
    in_a = NodeView("gpu-0", {"pool": "a"})
    in_b = NodeView("gpu-1", {"pool": "b"})
    assert holds("ml/big", in_a) and not holds("ml/big", in_b)
    assert holds("ml/any", in_b)  # no nodeSelector: every MIG-capable node
    assert holds("ml/dropped", in_b)  # no valid spec.mig now: kept, as for a moment


def test_a_selector_on_the_gpu_product_keeps_the_nodes_it_partitioned() -> None:
    """Under strategy single, GPU Feature Discovery renames a partitioned GPU's product
    (NVIDIA-H200-MIG-3g.71gb): a nodeSelector on the product, as the operator's own messages
    suggest, let go of every node it had partitioned; their claims lapsed (another tuning
    could relabel them) and the tuning ended with no node at all."""
    product = "nvidia.com/gpu.product"
    selector = ((product, "NVIDIA-H200"),)
    holds = mig_controller.claim_holds((MigSelector("ml/qwen", selector),))
    partitioned = NodeView("gpu-0", {product: "NVIDIA-H200-MIG-3g.71gb",
                                     "nvidia.com/mig.capable": "true"})
    shared = NodeView("gpu-1", {product: "NVIDIA-H200-MIG-3g.71gb-SHARED",
                                "nvidia.com/mig.capable": "true"})
    other = NodeView("gpu-2", {product: "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb",
                               "nvidia.com/mig.capable": "true"})
    assert holds("ml/qwen", partitioned) and holds("ml/qwen", shared)
    assert not holds("ml/qwen", other)
    spec = InferenceTuningSpec.model_validate({
        "targetRef": {"name": "qwen"}, "engine": "vllm",
        "mig": {"profile": "3g.71gb", "strategy": "single", "nodeSelector": dict(selector)}})
    plans, errors, selected = mig_controller._plans(spec, [partitioned, shared, other])
    assert errors == [] and [n.name for n in selected] == ["gpu-0", "gpu-1"]
    assert set(plans) == {"NVIDIA-H200-MIG-3g.71gb", "NVIDIA-H200-MIG-3g.71gb-SHARED"}
    # Only the product label: another label is matched exactly.
    assert not mig_controller.claim_holds((MigSelector("ml/qwen", (("pool", "a"),)),))(
        "ml/qwen", NodeView("gpu-3", {"pool": "a-MIG-3g.71gb"}))


def test_a_selector_on_labels_single_rewrites_keeps_the_nodes_its_tuning_claimed() -> None:
    """Under strategy single, GPU Feature Discovery also gives gpu.count, gpu.memory (and
    the slices and engines) the values of one MIG device once a node is partitioned: with
    nvidia.com/gpu.count: "8" (8-GPU nodes) the tuning lost each node it partitioned, its
    claim lapsed, and another tuning relabelled the node for its own layout."""
    product, count = "nvidia.com/gpu.product", "nvidia.com/gpu.count"
    selector = ((count, "8"), (product, "NVIDIA-H100-80GB-HBM3"))
    holds = mig_controller.claim_holds((MigSelector("team-a/qwen", selector),
                                        MigSelector("team-b/llama", ((product, "x"),))))
    labels = {product: "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", "nvidia.com/mig.capable": "true",
              "nvidia.com/mig.strategy": "single", count: "16", "nvidia.com/gpu.memory": "40192"}
    claimed = NodeView("gpu-1", labels, claimed_by="team-a/qwen")
    assert holds("team-a/qwen", claimed)
    # Only for the tuning that claimed it, under single, and for the labels GFD rewrites.
    assert not holds("team-a/qwen", NodeView("gpu-2", labels))
    assert not holds("team-a/qwen", NodeView(
        "gpu-3", {**labels, "nvidia.com/mig.strategy": "mixed"}, claimed_by="team-a/qwen"))
    assert not mig_controller.claim_holds((MigSelector("team-a/qwen", (("pool", "a"),)),))(
        "team-a/qwen", NodeView("gpu-4", {**labels, "pool": "b"}, claimed_by="team-a/qwen"))
    # Its own plan keeps the node too (it read "no node matches" once it was partitioned).
    spec = InferenceTuningSpec.model_validate({
        "targetRef": {"name": "qwen"}, "engine": "vllm",
        "mig": {"profile": "3g.40gb", "strategy": "single", "nodeSelector": dict(selector)}})
    _, errors, selected = mig_controller._plans(spec, [claimed], "team-a/qwen")
    assert errors == [] and [n.name for n in selected] == ["gpu-1"]
    assert mig_controller._plans(spec, [claimed], "team-b/llama")[2] == []


def _indexed_tuning(name: str, **spec: Any) -> dict[str, Any]:
    """An entry of the kopf index `tunings_by_target`."""
    return {"name": name, "uid": f"uid-{name}", "generation": 1, "spec": {
        "targetRef": {"name": name}, "engine": "vllm", **spec}}


def test_a_tuning_in_dry_run_takes_over_no_drained_node() -> None:
    """A drained node was handed to a tuning in DryRun that selects it too, which would not
    finish the drain: it stayed cordoned for that tuning, or was uncordoned a pass later
    after a needless hand-over."""
    mig = {"profile": "3g.71gb", "nodeSelector": {"pool": "a"}}
    index = {("ml", "qwen"): [_indexed_tuning("watching", mode="DryRun", mig=mig),
                              _indexed_tuning("enforcing", mig=mig)]}
    selectors = mig_controller.mig_selectors(index)  # type: ignore[arg-type]
    assert [(s.tuning, s.partitions) for s in selectors] == [("ml/enforcing", True),
                                                             ("ml/watching", False)]
    node = NodeView("gpu-0", {"pool": "a"}, True, cordoned_for="ml/gone")
    assert mig_controller._successor(selectors, "ml/gone")(node, "ml/gone") == "ml/enforcing"
    dry_only = tuple(s for s in selectors if not s.partitions)
    assert mig_controller._successor(dry_only, "ml/gone")(node, "ml/gone") is None
    # Its claims still hold where its nodeSelector selects (a spec.mode change is no reason
    # to hand its nodes to another layout).
    holds = mig_controller.claim_holds(selectors)
    assert holds("ml/watching", node)
    assert not holds("ml/watching", NodeView("gpu-1", {"pool": "b"}))


def test_a_drained_node_is_handed_only_to_a_tuning_that_can_be_planned() -> None:
    """Two tunings select the same pool, and a GPU of a product the catalog does not know
    joins it: neither can be planned, and each pass handed the node the other had drained
    back to it (a MigNodeHandedOver Event every pass), cordoned for as long as that lasted."""
    mig = {"profile": "3g.71gb", "nodeSelector": {"pool": "a"}}
    index = {("ml", "s"): [_indexed_tuning("s", mig=mig)],
             ("ml", "t"): [_indexed_tuning("t", mig=mig)]}
    selectors = mig_controller.mig_selectors(index)  # type: ignore[arg-type]
    drained = NodeView("gpu-0", {PRODUCT_LABEL: "NVIDIA-H200", MIG_CAPABLE_LABEL: "true",
                                 "pool": "a"}, True, cordoned_for="ml/s")
    unknown = node("gpu-9", "NVIDIA-X900", pool="a")
    assert not mig_controller._plannable(selectors[1], [drained, unknown])
    handed = mig_controller._successor(selectors, "ml/s", [drained, unknown])
    assert handed(drained, "ml/s") is None  # uncordoned instead: nobody finishes the drain
    # A tuning that can be planned still takes it over, as it may be draining it too.
    assert mig_controller._successor(selectors, "ml/s", [drained])(drained, "ml/s") == "ml/t"
    other_pool = {("ml", "t"): [_indexed_tuning("t", mig={**mig, "nodeSelector": {
        "pool": "a", "product": "h200"}})]}
    assert mig_controller._plannable(
        mig_controller.mig_selectors(other_pool)[0],  # type: ignore[arg-type]
        [drained, unknown]) is False  # selects neither node: nothing to plan on
    # Not known (a selector without its spec): as before, taken as it can.
    assert mig_controller._plannable(MigSelector("ml/t", (("pool", "a"),)), [unknown])
    # Labelled for ml/s, whose claim still holds: ml/t could not relabel it (and kept it
    # cordoned for as long as the claim held), so it is released instead.
    claimed = dataclasses.replace(drained, claimed_by="ml/s")
    assert mig_controller._successor(selectors, "ml/s", [claimed])(claimed, "ml/s") is None
    # Handed to the claimant when another tuning drained it and goes.
    assert mig_controller._successor(selectors, "ml/x", [claimed])(claimed, "ml/x") == "ml/s"


def test_a_drain_is_announced_when_its_message_changes_not_every_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A MigNodeDraining Event every pass (every 3 s, a new Event object each) while a
    PodDisruptionBudget held the drain up; now one Event per change of the node's message,
    a Warning when evictions start being refused."""
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(mig_controller.kopf, "event",
                        lambda _, **event: posted.append((event["type"], event["reason"])))
    status = MigStatus(nodes=[MigNodeStatus(node="gpu-0", config="cfg", state="draining",
                                            message="cordoned and draining 2 GPU pods")])

    def drain(stored: MigStatus | None, refused: tuple[str, ...]) -> MigStatus:
        body = kopf.Body({"status": {} if stored is None else {
            "mig": stored.model_dump(by_alias=True, mode="json")}})
        return mig_controller._drain_reported(body, status, "gpu-0", refused)

    started = drain(None, ("ml/a", "ml/b"))
    assert posted == [("Normal", "MigNodeDraining"), ("Warning", "MigNodeDrainBlocked")]
    assert "a PodDisruptionBudget refused the eviction of 2 of them (ml/a, ml/b)" in \
        started.nodes[0].message
    posted.clear()
    assert drain(started, ("ml/a", "ml/b")) == started and posted == []  # nothing new
    fewer = drain(started, ("ml/a",))  # the budget let one go
    assert posted == [("Normal", "MigNodeDraining")]
    posted.clear()
    assert drain(fewer, ()).nodes[0].message == "cordoned and draining 2 GPU pods"
    assert posted == [("Normal", "MigNodeDraining")]


def test_times_in_annotations_that_the_operator_could_not_have_written_are_absent() -> None:
    """infertune.io/mig-labelled-at in milliseconds held a node "waiting" until the year
    33658, and a time past datetime's range (or an integer past a float's) stopped every
    pass of every tuning selecting the node."""
    import time

    from infertune.tuning.mig_nodes import _clock

    now = time.time()
    assert mig_controller._unix_time(f"{now:.0f}") == float(f"{now:.0f}")
    assert mig_controller._unix_time(f"{now + 3600:.0f}") is not None  # a clock ahead
    for bad in (f"{now * 1000:.0f}", "1e300", "9" * 400, "nan", "inf", "-5", "0", "soon"):
        assert mig_controller._unix_time(bad) is None, bad
    whole, huge = int(now), "1" + "0" * 400
    written = mig_controller._written_times(
        f'{{"a": {whole * 1000}, "b": {whole}, "c": {huge}, "d": true, "e": "{whole}", '
        '"f": -1}')
    assert written == {"b": float(int(now))}
    assert _clock(1e20).startswith("unix time")  # said, not raised


def test_a_drain_evicts_each_pod_by_the_uid_it_was_seen_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Evicted by name alone, a StatefulSet pod deleted and made again since the pass saw it
    (maybe on another node, which no drain concerns) was evicted in its place."""
    asked: list[tuple[str, str, str | None]] = []

    def evict(namespace: str, name: str, uid: str | None = None) -> bool:
        asked.append((namespace, name, uid))
        return True

    monkeypatch.setattr(mig_controller, "evict_pod", evict)
    monkeypatch.setattr(mig_controller, "_patch_as_seen", lambda *_: True)
    node = NodeView("gpu-0", {}, gpu_pods=("ml/db-0", "ml/old"),
                    gpu_pod_uids=(("ml/db-0", "u-db"), ("ml/old", "")))
    assert mig_controller._drain(node, "ml/qwen", lambda _: True) == mig_controller.Drained(())
    assert asked == [("ml", "db-0", "u-db"), ("ml", "old", None)]  # "": not known


def test_one_eviction_the_api_server_fails_does_not_stop_the_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pod two PodDisruptionBudgets cover gets a 500 from the Eviction API: the pass
    stopped right after the cordon, the pods after it were never asked to leave, and
    neither status.mig nor an Event said why."""
    from kubernetes.client.exceptions import ApiException

    asked: list[str] = []

    def evict(namespace: str, name: str, uid: str | None = None) -> bool:
        asked.append(f"{namespace}/{name}")
        if name == "two-budgets":
            error = ApiException(status=500, reason="Internal Server Error")
            error.body = ('{"kind": "Status", "message": "This pod has more than one '
                          'PodDisruptionBudget, which the eviction subresource does not '
                          'support."}')
            raise error
        return name != "held"

    monkeypatch.setattr(mig_controller, "evict_pod", evict)
    monkeypatch.setattr(mig_controller, "_patch_as_seen", lambda *_: True)
    pods = ("ml/two-budgets", "ml/held", "ml/free")
    drained = mig_controller._drain(NodeView("gpu-0", {}, gpu_pods=pods), "ml/qwen",
                                    lambda _: True)
    assert asked == list(pods)
    assert drained == mig_controller.Drained(("ml/held",), (
        "ml/two-budgets (500: This pod has more than one PodDisruptionBudget, which the "
        "eviction subresource does not support.)",))
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(mig_controller.kopf, "event",
                        lambda _, **event: posted.append((event["type"], event["reason"])))
    status = MigStatus(nodes=[MigNodeStatus(node="gpu-0", config="cfg", state="draining",
                                            message="cordoned and draining 3 GPU pods")])
    reported = mig_controller._drain_reported(kopf.Body({"status": {}}), status, "gpu-0",
                                              *drained)
    assert "the Eviction API failed for 1 of them (ml/two-budgets (500:" in \
        reported.nodes[0].message
    assert posted == [("Normal", "MigNodeDraining"), ("Warning", "MigNodeDrainBlocked")]
    # Only the failure: a Warning too, once.
    posted.clear()
    only = mig_controller._drain_reported(kopf.Body({"status": {}}), status, "gpu-0", (),
                                          drained.failed)
    assert posted == [("Normal", "MigNodeDraining"), ("Warning", "MigNodeDrainBlocked")]
    posted.clear()
    stored = kopf.Body({"status": {"mig": only.model_dump(by_alias=True, mode="json")}})
    assert mig_controller._drain_reported(stored, status, "gpu-0", (), drained.failed) == only
    assert posted == []


@pytest.mark.parametrize(("labels", "planned"), [
    (["single", ""], "single"),  # one without the label: the nodes still run single
    (["none"], "mixed"),  # not a strategy: the spec's
    (["Mixed"], "mixed"),
    (["single", "single"], "single"),
    ([], "mixed"),
])
def test_status_says_the_strategy_the_layout_was_planned_for(
        labels: list[str], planned: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod webhook asks for the MIG resource by status.mig.strategy. Status took every
    label value, the planner only single and mixed: nodes labelled single and "" were planned
    (and labelled) for single while status said mixed, and the re-tuned pods asked for
    nvidia.com/mig-2g.35gb, which a single node never offers: Pending for good."""
    nodes = [NodeView(f"n{i}", {PRODUCT_LABEL: "NVIDIA-H200", MIG_CAPABLE_LABEL: "true",
                                **({"nvidia.com/mig.strategy": label} if label else {})})
             for i, label in enumerate(labels or ["", ""])]
    status = _reconciled(monkeypatch, nodes)
    assert status.strategy == planned, status


PROFILE_2G = InferenceTuningSpec.model_validate({
    "targetRef": {"name": "qwen"}, "engine": "vllm", "mig": {"profile": "2g.35gb"}})
"""A tuning of team-a/qwen asking for 2g.35gb slices (`_reconciled`)."""


def _reconciled(monkeypatch: pytest.MonkeyPatch, nodes: list[NodeView],
                patched: bool = True,
                settings: mig_controller.MigSettings | None = None) -> MigStatus:
    """reconcile_mig of PROFILE_2G over `nodes`, the API calls replaced: node patches answer
    `patched` (False: the node changed since it was read), and the ConfigMap was written long
    ago. `settings`: kept from one pass to the next, as the operator keeps them."""
    monkeypatch.setattr(mig_controller, "_observe_nodes", lambda gpu_pods: nodes)
    monkeypatch.setattr(mig_controller, "_write_config_map",
                        lambda namespace, configs, now, write=True: {n: 0.0 for n in configs})
    monkeypatch.setattr(mig_controller, "_patch_as_seen", lambda *_: patched)
    monkeypatch.setattr(mig_controller.kopf, "event", lambda *_, **__: None)
    return mig_controller.reconcile_mig(
        "team-a", "qwen", PROFILE_2G, settings or mig_controller.MigSettings("gpu-operator"),
        kopf.Body({"status": {}}), {}, frozenset({"team-a/qwen"}))


@pytest.mark.parametrize(("text", "says"), [
    ("mig-configs: [all-disabled]", "is not a mig-parted document"),
    ('"just a string"', "is not a mig-parted document"),
    ("- a\n- b", "is not a mig-parted document"),
    ("mig-configs: [unclosed", "is not YAML that parses"),
])
def test_a_config_map_edited_into_another_shape_is_said_in_status(
        monkeypatch: pytest.MonkeyPatch, text: str, says: str) -> None:
    """YAML of another shape raised a bare ValueError or AttributeError at every pass, and
    status.mig kept the message of the pass before ("labelled for ...")."""
    with pytest.raises(mig_controller.ConfigMapUnusable) as unusable:
        mig_controller._configs_in(text, "gpu-operator")
    assert str(unusable.value).startswith(
        f"the ConfigMap gpu-operator/infertune-mig-parted-config (config.yaml) {says}")
    assert str(unusable.value).endswith("; fix it, or delete the ConfigMap and the operator "
                                        "writes it again with the tunings' configs")
    assert mig_controller._configs_in("", "ns") == {}
    assert mig_controller._configs_in("version: v1\nmig-configs: {a: []}", "ns") == {"a": []}

    def unusable_config_map(*_: Any, **__: Any) -> dict[str, float]:
        raise unusable.value

    nodes = [node("n0", "NVIDIA-H200")]
    monkeypatch.setattr(mig_controller, "_observe_nodes", lambda gpu_pods: nodes)
    monkeypatch.setattr(mig_controller, "_write_config_map", unusable_config_map)
    labelled: list[Any] = []
    monkeypatch.setattr(mig_controller, "_patch_as_seen", lambda *a: labelled.append(a))
    monkeypatch.setattr(mig_controller.kopf, "event", lambda *_, **__: None)
    status = mig_controller.reconcile_mig(
        "team-a", "qwen", PROFILE_2G, mig_controller.MigSettings("gpu-operator"),
        kopf.Body({"status": {}}), {}, frozenset({"team-a/qwen"}))
    assert labelled == []
    assert status.message.startswith(str(unusable.value)) and status.message.endswith(
        "; no node is labelled until then"), status.message
    assert [n.message[:9] for n in status.nodes] == ["not done:"]


def test_mig_manager_applying_a_config_again_is_timed_from_then(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node labelled days ago that mig-manager sets up again (a reboot) read as timed out
    at once, timed from the label, and held the rollout behind it."""
    config = mig_controller.config_names(mig_controller._plans(
        PROFILE_2G, [node("n", "NVIDIA-H200")])[0])["NVIDIA-H200"]
    days_ago = time.time() - 86400

    def seen(state: str) -> NodeView:
        return dataclasses.replace(node("n0", "NVIDIA-H200", **{
            MIG_CONFIG_LABEL: config, MIG_STATE_LABEL: state}),
            labelled_at=days_ago, claimed_by="team-a/qwen")

    settings = mig_controller.MigSettings("gpu-operator")
    assert _reconciled(monkeypatch, [seen("success")], settings=settings).nodes[0].state == \
        "configured"
    again = _reconciled(monkeypatch, [seen("pending")], settings=settings)
    assert again.nodes[0].state == "pending", again.nodes[0]
    # Not seen applied by this process (it started meanwhile): timed from the label, as it was.
    fresh = _reconciled(monkeypatch, [seen("pending")])
    assert fresh.nodes[0].state == "timed-out", fresh.nodes[0]


def test_status_lists_a_hundred_nodes_with_the_one_worked_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """~300 bytes a node: a nodeSelector matching 5000 nodes made a status past etcd's
    1.5 MiB, and its write failed at every pass."""
    nodes = [node(f"n{i:04d}", "NVIDIA-H200") for i in range(250)]
    status = _reconciled(monkeypatch, nodes)
    assert len(status.nodes) == mig_controller.MAX_NODES_LISTED
    labelled = [n for n in status.nodes if n.message.startswith("labelled for")]
    assert len(labelled) == 1, [n.message for n in status.nodes[:3]]
    assert status.message.endswith("(status.mig.nodes lists 100 of the 250 selected nodes, 0 "
                                   "of them configured: those worked on first)"), status.message
    few = _reconciled(monkeypatch, nodes[:5])
    assert len(few.nodes) == 5 and "lists" not in few.message


def test_a_label_not_made_is_not_reported_as_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node changed since the pass read it (409): the message said so, and the node's
    entry still read "labelled for ..."."""
    status = _reconciled(monkeypatch, [node("n1", "NVIDIA-H200")], patched=False)
    assert status.message == "n1 changed while deciding; decided again next pass"
    (entry,) = status.nodes
    assert entry.message == f"not done: {status.message}"
    # With more nodes than are listed, the message still counts them.
    many = _reconciled(monkeypatch, [node(f"n{i:03d}", "NVIDIA-H200") for i in range(150)],
                       patched=False)
    assert many.message.startswith("n000 changed while deciding") and (
        "lists 100 of the 150 selected nodes" in many.message), many.message


@pytest.mark.parametrize("state", ["failed", "pending"])
def test_the_node_mig_manager_works_on_or_failed_is_listed_among_a_hundred(
        state: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a node is pending (mig-manager at work) or failed (the rollout stops there
    until a person looks), no step is taken and the others wait for it: the first 100 by
    name were listed, all "waits for", and the node itself was not."""
    from infertune.tuning.mig_nodes import MIG_CONFIG_LABEL, MIG_STATE_LABEL

    nodes = [node(f"n{i:04d}", "NVIDIA-H200") for i in range(250)]
    plans, _, _ = mig_controller._plans(PROFILE_2G, nodes)
    config = mig_controller.config_names(plans)["NVIDIA-H200"]
    labels = {MIG_CONFIG_LABEL: config, **({MIG_STATE_LABEL: state} if state == "failed"
                                           else {})}
    nodes[200] = node("n0200", "NVIDIA-H200", **labels)
    status = _reconciled(monkeypatch, nodes)
    listed = {n.node: n.state for n in status.nodes}
    assert len(listed) == 100 and listed.get("n0200") == state, listed.get("n0200")
    assert "lists 100 of the 250" in status.message


def test_a_node_asked_for_our_config_with_no_time_of_asking_times_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its mig-labelled-at annotation removed and the operator restarted: no time of asking,
    so no timeout could start, and the node held the rollout as pending for good. Timed from
    when the operator first sees it."""
    import time

    from infertune.tuning.mig_nodes import MIG_CONFIG_LABEL

    plans, _, _ = mig_controller._plans(PROFILE_2G, [node("n1", "NVIDIA-H200")])
    config = mig_controller.config_names(plans)["NVIDIA-H200"]
    asked = [node("n1", "NVIDIA-H200", **{MIG_CONFIG_LABEL: config})]
    clock = [1_800_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    settings = mig_controller.MigSettings("gpu-operator")

    def state() -> str:
        return _reconciled(monkeypatch, asked, settings=settings).nodes[0].state

    assert state() == "pending"
    clock[0] += 600
    assert state() == "pending"
    clock[0] += 301
    assert state() == "timed-out"



def test_an_eviction_by_uid_holds_to_the_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The precondition goes with the eviction, and its 409 (a pod made again under the name)
    counts the pod meant as gone; without a uid a 409 is an error as before."""
    from kubernetes.client.exceptions import ApiException

    from infertune.kube import client as kube_client

    asked: list[Any] = []

    class Core:
        def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Any) -> None:
            options = body.delete_options
            asked.append(None if options is None else options.preconditions.uid)
            raise ApiException(status=409, reason="Conflict")

    monkeypatch.setattr(kube_client.client, "CoreV1Api", Core)
    assert kube_client.evict_pod("ml", "db-0", "u-old") and asked == ["u-old"]
    with pytest.raises(ApiException):
        kube_client.evict_pod("ml", "db-0")
    assert asked == ["u-old", None]
