"""A Deployment's change re-assesses the tunings that target it; kopf does not retry an
event handler, so the handler retries each tuning itself."""

from __future__ import annotations

import asyncio

import pytest

from infertune.controller import handlers


def test_each_tuning_is_assessed_again_and_a_failure_is_retried(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """One failed re-check (a 500, a 429) left a tuning Ready=True for a Deployment that was
    gone, and the tunings after it in the loop were not looked at."""
    calls: list[tuple[str, bool]] = []
    failures = {"a": 2, "b": 99}  # a fails twice, b every time, c never

    def reassess(namespace: str, name: str, gone: bool) -> None:
        calls.append((name, gone))
        if failures.get(name, 0) > 0:
            failures[name] -= 1
            raise RuntimeError(f"500 for {name}")

    monkeypatch.setattr(handlers, "reassess", reassess)
    monkeypatch.setattr(handlers, "REASSESS_PAUSE_S", 0.0)
    monkeypatch.setattr(handlers, "SETTLE_S", 0.0)
    index = {("ml", "qwen"): [{"name": "a"}, {"name": "b"}, {"name": "c"}]}
    asyncio.run(handlers.target_changed(type="DELETED", namespace="ml", name="qwen",
                                        tunings_by_target=index))
    first = ["a"] * 3 + ["b"] * handlers.REASSESS_ATTEMPTS + ["c"]
    settled = ["a"] + ["b"] * handlers.REASSESS_ATTEMPTS + ["c"]  # once more, SETTLE_S later
    assert [n for n, _ in calls] == first + settled
    # Taken as gone at the event; read again after: it may be back by then.
    assert [gone for _, gone in calls] == [True] * len(first) + [False] * len(settled)
    records = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(records) == 2
    for record in records:
        assert "[ml/b] Deployment qwen deleted, and the tuning could not be assessed again " \
            "(500 for b)" in record.getMessage()


def test_reassessing_a_tuning_without_autoscaling_removes_the_autoscalers_blocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """spec.autoscaling removed: the re-assessment of a Deployment's change sends the
    removal of status.autoscaling and status.batching (a merge patch leaves out what it does
    not name); batching's applied value was kept, and came back with Auto."""
    from typing import Any

    from infertune.api.spec import GROUP, PLURAL, VERSION

    stored = {"autoscaling": {"writtenReplicas": 6, "currentReplicas": 6},
              "batching": {"knob": "max-num-seqs", "applied": 32}}
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceTuning",
            "metadata": {"name": "t", "namespace": "ml", "generation": 2, "uid": "u",
                         "resourceVersion": "9"},
            "spec": {"targetRef": {"name": "qwen"}, "engine": "vllm"}, "status": stored}
    sent: list[dict[str, Any]] = []
    posted: list[str] = []

    class Tunings:
        def get_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
            assert args[:4] == (GROUP, VERSION, "ml", PLURAL)
            return body

    def write_status(namespace: str, name: str, status: Any, version: str, build: Any,
                     still: Any = None) -> dict[str, Any]:
        patch = build(stored)
        sent.append(patch)
        return dict(patch)

    monkeypatch.setattr(handlers.client, "CustomObjectsApi", Tunings)
    monkeypatch.setattr(handlers, "write_status", write_status)
    monkeypatch.setattr(handlers, "read_deployment", lambda namespace, name: None)
    def event(_body: Any, *, type: str, reason: str, message: str) -> None:
        posted.append(reason)

    monkeypatch.setattr(handlers.kopf, "event", event)
    handlers.reassess("ml", "t", gone=True)
    (patch,) = sent
    assert patch["autoscaling"] is None and patch["batching"] is None, patch
    assert "BatchingApplied" in posted
    # Being deleted (held by kopf's finalizer, its Deployment deleted with it): nothing is
    # written or said of it.
    sent.clear()
    posted.clear()
    body["metadata"]["deletionTimestamp"] = "2026-12-07T06:00:00Z"
    handlers.reassess("ml", "t", gone=True)
    assert sent == [] and posted == []


def test_a_patch_built_again_after_the_autoscalers_first_evaluation_leaves_its_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-assessment reads the Deployment's replicas for status.autoscaling.currentReplicas
    until the autoscaler has evaluated; when its first evaluation (a scale from 1 to 3)
    landed before the write (a 409, built again over the newer status), the count read
    before it was written over the autoscaler's."""
    from types import SimpleNamespace
    from typing import Any

    from infertune.api.spec import GROUP, VERSION

    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceTuning",
            "metadata": {"name": "t", "namespace": "ml", "generation": 1, "uid": "u",
                         "resourceVersion": "9"},
            "spec": {"targetRef": {"name": "qwen"}, "engine": "vllm",
                     "autoscaling": {"minReplicas": 1, "maxReplicas": 8}},
            "status": {"observedGeneration": 1}}
    evaluated = {"autoscaling": {"evaluated": "2026-12-07T06:00:00Z", "currentReplicas": 3,
                                 "writtenReplicas": 3, "target": "qwen"}}
    sent: list[dict[str, Any]] = []

    class Tunings:
        def get_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
            return body

    def write_status(namespace: str, name: str, status: Any, version: str, build: Any,
                     still: Any = None) -> dict[str, Any]:
        sent.append(build(status))  # as first read
        sent.append(build(evaluated))  # after the 409, over the newer status
        return sent[-1]

    container = SimpleNamespace(name="vllm")
    deployment = SimpleNamespace(metadata=SimpleNamespace(name="qwen"), spec=SimpleNamespace(
        replicas=1, template=SimpleNamespace(spec=SimpleNamespace(containers=[container]))))
    monkeypatch.setattr(handlers.client, "CustomObjectsApi", Tunings)
    monkeypatch.setattr(handlers, "write_status", write_status)
    monkeypatch.setattr(handlers, "read_deployment", lambda namespace, name: deployment)
    monkeypatch.setattr(handlers.kopf, "event", lambda *args, **kwargs: None)
    handlers.reassess("ml", "t", gone=False)
    first, again = sent
    assert first["autoscaling"] == {"currentReplicas": 1}
    assert "autoscaling" not in again, again
