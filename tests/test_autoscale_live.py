"""`autoscale evaluate --live`: whether the operator would write, from what it stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from infertune.api.spec import InferenceTuning
from infertune.autoscale_cli import why_written
from infertune.autoscale_live import Live
from infertune.cli import main
from infertune.controller.fights import Fight
from infertune.controller.scaling_report import Blocked
from infertune.scaling.engine import ScaleAction, ScaleDecision
from infertune.scaling.state import ScalingState

NOW = 1_800_000_000.0


def tuning(mode: str = "Enforce") -> InferenceTuning:
    return InferenceTuning.model_validate({
        "metadata": {"name": "qwen", "namespace": "serving"},
        "spec": {"targetRef": {"name": "qwen"}, "engine": "vllm", "mode": mode,
                 "autoscaling": {}}})


def live(hpa: str | None = None, fight: Fight | None = None) -> Live:
    status: dict[str, Any] = {"autoscaling": {} if fight is None else {
        "replicaFight": fight.to_json()}}
    return Live(tuning(), 3, status, 1, hpa)


def test_an_hpa_on_the_deployment_blocks_writes() -> None:
    blocked = live(hpa="qwen-hpa").blocked(3, NOW)
    assert blocked is not None and blocked.reason == "HorizontalPodAutoscalerPresent"
    assert "HorizontalPodAutoscaler qwen-hpa also scales qwen" in blocked.message


@pytest.mark.parametrize(("retry_in", "blocks"), [(60.0, True), (-1.0, False)])
def test_a_stored_fight_blocks_until_its_retry_time(retry_in: float, blocks: bool) -> None:
    fight = Fight(2, NOW - 100, NOW - 10, 1, NOW + retry_in)
    blocked = live(fight=fight).blocked(3, NOW)
    assert (blocked is not None and blocked.reason == "ReplicaFight") is blocks


def test_the_preview_counts_a_revert_as_the_operator_would() -> None:
    """One revert stored, and the replicas the operator wrote (8) put back to 4 since: the
    operator's next evaluation counts the second revert and stops writing; the preview said
    it would write. After a spec change the stored fight is over, and the preview still said
    ReplicaFight."""
    once = Fight(1, NOW - 100, NOW - 100, 1, None).to_json()
    status = {"autoscaling": {"replicaFight": once, "writtenReplicas": 8}}
    reverted = Live(tuning(), 4, status, 1, None)
    blocked = reverted.blocked(4, NOW)
    assert blocked is not None and blocked.reason == "ReplicaFight"
    assert reverted.blocked(8, NOW) is None  # still what it wrote: no revert
    backing_off = Fight(2, NOW - 100, NOW - 10, 1, NOW + 60).to_json()
    changed = Live(tuning(), 4, {"autoscaling": {"replicaFight": backing_off}}, 2, None)
    assert changed.blocked(4, NOW) is None  # generation 2: the fight ended with the spec


def decision(current: int, desired: int) -> ScaleDecision:
    action = ScaleAction.HOLD if current == desired else ScaleAction.SCALE_OUT
    return ScaleDecision(current, desired, action, "why", None, ScalingState(),  # type: ignore[arg-type]
                         ScalingState())


@pytest.mark.parametrize(("mode", "desired", "blocked", "written", "says"), [
    ("Enforce", 5, None, 5, "the operator writes 5 replicas"),
    ("Enforce", 3, None, None, "nothing to write"),
    ("DryRun", 5, None, None, "not written: mode DryRun"),
    ("Enforce", 5, Blocked("ReplicaFight", "reverted twice"), None,
     "not written (ReplicaFight): reverted twice"),
])
def test_the_write_is_explained(mode: str, desired: int, blocked: Blocked | None,
                                written: int | None, says: str) -> None:
    assert why_written(tuning(mode), decision(3, desired), blocked, written).startswith(says)


@pytest.mark.parametrize(("kubeconfig", "says"), [
    ("apiVersion: v1\nkind: Config\ncurrent-context: x\n"
     "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
     "users: [{name: u, user: {token: t}}]\n"
     "contexts: [{name: x, context: {cluster: c, user: u}}]\n",
     "--live: the cluster cannot be reached"),
    ("a: [\n", "--live: the kubeconfig is not valid YAML"),
    (b"\xff\xfe\x00k", "--live: the kubeconfig is not UTF-8 text; check --kubeconfig"),
    ("just a string\n", "--live: the kubeconfig is not one (TypeError"),
    (None, "no such file; give a kubeconfig file this user can read"),  # not "pass it"
])
def test_a_cluster_that_cannot_be_read_is_a_message_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kubeconfig: str | bytes | None,
        says: str) -> None:
    path = tmp_path / "kubeconfig"
    if isinstance(kubeconfig, bytes):
        path.write_bytes(kubeconfig)
    elif kubeconfig is not None:
        path.write_text(kubeconfig)
    try:
        code = main(["autoscale", "evaluate", "--live", "ml/qwen", "--kubeconfig", str(path),
                     "--prometheus", "http://127.0.0.1:1"])
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
    assert code == 1
    assert says in capsys.readouterr().err
