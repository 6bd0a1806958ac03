"""Two writers of a tuning's status racing, in-process against a real API server of the
module's own: the session's operator handles every namespace, and its own writes would come
first (then neither race happens, and a test of it proves nothing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from e2e.conftest import delete_namespace, new_namespace, own_control_plane
from e2e.fixtures.access import ClusterInfo
from e2e.fixtures.operator import apply_crd
from e2e.fixtures.waiting import wait_for
from e2e.test_operator import GROUP, PLURAL, VERSION, condition, create, get_tuning, tuning
from infertune.controller import handlers

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def plane(cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[client.ApiClient]:
    work = tmp_path_factory.mktemp("status-races")
    with own_control_plane(cluster, work, "needs a control plane of its own: an external "
                           "cluster's operator writes these tunings' status first") as api:
        apply_crd(api)
        yield api


@pytest.fixture
def api_client(plane: client.ApiClient) -> client.ApiClient:
    """This module's control plane, under the name the tests use."""
    return plane


@pytest.fixture
def namespace(plane: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    name = new_namespace(plane, request.node.name)
    yield name
    delete_namespace(plane, name)


def test_a_late_write_of_the_tunings_own_handler_does_not_keep_a_deleted_target_ready(
    api_client: client.ApiClient, namespace: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf writes a tuning handler's status after the handler returns: one that read the
    Deployment just before it was deleted landed after the deletion's re-assessment, and
    Ready stayed True for a Deployment that was gone. In-process, against the real API
    server: the deletion handler runs, the late write comes, and the handler's second look
    SETTLE_S later puts it right."""
    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    monkeypatch.setattr(handlers.kopf, "event", lambda *_, **__: None)  # no kopf queue here
    monkeypatch.setattr(handlers, "SETTLE_S", 3.0)
    create(api_client, namespace, tuning("qwen", "qwen"))  # its Deployment already gone
    objects = client.CustomObjectsApi(api_client)

    def ready() -> str | None:
        found = condition(get_tuning(api_client, namespace, "qwen"), "Ready")
        return None if found is None else f"{found['status']} {found['reason']}"

    def late_write() -> None:
        # What the tuning's own handler had assessed before the deletion, landing now.
        wait_for(lambda: ready() == "False TargetNotFound", "the deletion reported")
        objects.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "qwen", {
            "status": {"phase": "Active", "conditions": [{
                "type": "Ready", "status": "True", "reason": "Accepted", "observedGeneration": 1,
                "lastTransitionTime": "2026-12-01T00:00:00Z",
                "message": "spec accepted for Deployment qwen"}]}})

    async def deletion_and_late_write() -> None:
        index = {(namespace, "qwen"): [{"name": "qwen"}]}
        handling = asyncio.create_task(handlers.target_changed(
            type="DELETED", namespace=namespace, name="qwen", tunings_by_target=index))
        await asyncio.to_thread(late_write)
        assert ready() == "True Accepted"  # before the second look
        await handling

    try:
        asyncio.run(deletion_and_late_write())
        assert ready() == "False TargetNotFound"
        assert get_tuning(api_client, namespace, "qwen")["status"]["phase"] == "Pending"
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]


def test_two_writers_of_one_deletion_record_and_announce_it_once(
    api_client: client.ApiClient, namespace: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both operators of a rolling upgrade handle a Deployment's deletion (and the resume
    handler and the Deployment watch do at a start): each decided from the status it read,
    so the decision was recorded twice and its Event posted twice. In-process against the
    real API server: the second writer's whole re-assessment lands between the first one's
    read and its write (409, built again over the status the second wrote)."""
    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    posted: list[str] = []
    monkeypatch.setattr(handlers.kopf, "event",
                        lambda _, **event: posted.append(event["reason"]))
    create(api_client, namespace, tuning("qwen", "qwen"))  # its Deployment already gone
    assessed = handlers._assessed
    raced: list[bool] = []

    def assessed_then_raced(*args: Any, **kwargs: Any) -> Any:
        result = assessed(*args, **kwargs)
        if not raced:
            raced.append(True)
            handlers.reassess(namespace, "qwen", True)  # the other writer, all of it
        return result

    monkeypatch.setattr(handlers, "_assessed", assessed_then_raced)
    try:
        handlers.reassess(namespace, "qwen", True)
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
    body = get_tuning(api_client, namespace, "qwen")
    assert condition(body, "Ready")["reason"] == "TargetNotFound"  # type: ignore[index]
    actions = [d["action"] for d in body["status"]["decisions"]]
    assert actions == ["generation 1: TargetNotFound"], actions
    assert posted == ["TargetNotFound"], posted
