"""The GPU pods the MIG loop finds on a node, from the kopf index over pods (no pod listing)."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from infertune.api.spec import InferenceTuningSpec
from infertune.controller import mig as mig_controller
from infertune.controller.mig import gpu_pods_by_node
from infertune.tuning.mig_nodes import MIG_CAPABLE_LABEL, PRODUCT_LABEL, NodeView


def pod(node: str | None = "gpu-0", phase: str = "Running",
        **resources: dict[str, str]) -> dict[str, Any]:
    containers = [{"name": "sidecar"}, {"name": "server", "resources": resources}]
    return {"metadata": {"namespace": "team-a", "name": "qwen-1"},
            "spec": {"containers": containers, **({"nodeName": node} if node else {})},
            "status": {"phase": phase}}


def indexed(body: dict[str, Any]) -> dict[str, str] | None:
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
    assert indexed(pod(**resources)) == {"gpu-0": "team-a/qwen-1"}


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
    assert indexed(body) == {"gpu-0": "team-a/qwen-1"}


@pytest.mark.parametrize("phase", ["Pending", "Running", "Unknown"])
def test_a_pod_holds_its_gpus_until_it_has_ended(phase: str) -> None:
    assert indexed(pod(phase=phase, limits={"nvidia.com/gpu": "1"})) == {
        "gpu-0": "team-a/qwen-1"}


@pytest.mark.parametrize(("body", "why"), [
    (pod(limits={"cpu": "2", "memory": "1Gi"}), "no GPU resource"),
    (pod(limits={"example.com/gpu": "1"}), "another vendor's resource"),
    (pod(limits={"nvidia.com/gpus": "1"}), "not nvidia.com/gpu nor a renamed nvidia.com/gpu.*"),
    (pod(node=None, limits={"nvidia.com/gpu": "1"}), "not bound to a node yet"),
    (pod(phase="Succeeded", limits={"nvidia.com/gpu": "1"}), "ended"),
    (pod(phase="Failed", limits={"nvidia.com/gpu": "1"}), "ended"),
    ({"metadata": {"name": "bare"}}, "no spec at all"),
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
    holds = mig_controller.claim_holds((("ml/big", (("pool", "a"),)), ("ml/any", ())))
    in_a = NodeView("gpu-0", {"pool": "a"})
    in_b = NodeView("gpu-1", {"pool": "b"})
    assert holds("ml/big", in_a) and not holds("ml/big", in_b)
    assert holds("ml/any", in_b)  # no nodeSelector: every MIG-capable node
    assert holds("ml/dropped", in_b)  # no valid spec.mig now: kept, as for a moment
