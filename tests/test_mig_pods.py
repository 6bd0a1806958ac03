"""The GPU pods the MIG loop finds on a node, from the kopf index over pods (no pod listing)."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from infertune.controller.mig import gpu_pods_by_node


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
])
def test_a_bound_pod_holding_gpus_is_indexed_by_its_node(resources: dict[str, Any]) -> None:
    assert indexed(pod(**resources)) == {"gpu-0": "team-a/qwen-1"}


@pytest.mark.parametrize("phase", ["Pending", "Running", "Unknown"])
def test_a_pod_holds_its_gpus_until_it_has_ended(phase: str) -> None:
    assert indexed(pod(phase=phase, limits={"nvidia.com/gpu": "1"})) == {
        "gpu-0": "team-a/qwen-1"}


@pytest.mark.parametrize(("body", "why"), [
    (pod(limits={"cpu": "2", "memory": "1Gi"}), "no GPU resource"),
    (pod(limits={"example.com/gpu": "1"}), "another vendor's resource"),
    (pod(node=None, limits={"nvidia.com/gpu": "1"}), "not bound to a node yet"),
    (pod(phase="Succeeded", limits={"nvidia.com/gpu": "1"}), "ended"),
    (pod(phase="Failed", limits={"nvidia.com/gpu": "1"}), "ended"),
    ({"metadata": {"name": "bare"}}, "no spec at all"),
])
def test_pods_that_hold_no_gpu_are_left_out(body: dict[str, Any], why: str) -> None:
    assert indexed(body) is None, why

