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


@pytest.mark.parametrize(("argv", "from_index"), [
    (["run"], True), (["run", "--all-namespaces"], True), (["run", "-n", "team-a"], False)])
def test_only_an_operator_watching_every_namespace_trusts_its_pod_index(
        monkeypatch: pytest.MonkeyPatch, argv: list[str], from_index: bool) -> None:
    """A namespaced operator's pod index misses other namespaces' GPU pods on the same node;
    its MIG passes list each node's pods instead."""
    from infertune.cli import build_parser
    from infertune.controller import main

    started: dict[str, Any] = {}
    monkeypatch.setattr(main, "configure", lambda kubeconfig: None)
    monkeypatch.setattr(main, "freeze_startup_objects", lambda: None)
    monkeypatch.setattr(main.kopf, "configure", lambda **kwargs: None)  # the root logger
    monkeypatch.setattr(main.kopf, "run", lambda **kwargs: started.update(kwargs))
    args = build_parser().parse_args([*argv, "--webhook-cert", "c", "--webhook-key", "k"])
    assert main.run_operator(args) == 0
    assert started["clusterwide"] is from_index
    assert started["memo"].mig.pods_from_index is from_index
