"""Status writes that share a list with another writer, against the real API server.

The controller and the autoscaler both write `status.conditions` and `status.decisions`, and a
JSON merge patch replaces a list whole. `status_patch.write_status` (the autoscaler) therefore
sends the resourceVersion it built its patch over; these tests hold the API server to refusing
a write over an older version, and `write_status` to building its patch again over the newer
status. The controller's lists go through kopf as a patch function (`Assessment.merge_lists`):
kopf sends the difference it makes as a JSON patch that tests the resourceVersion, and on a
refusal applies it again to the next body it sees; the last test holds the server and
merge_lists to that.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.fixtures.operator import OperatorProcess
from e2e.test_operator import create, deployment, wait_observed
from e2e.test_operator import tuning as tuning_body
from infertune.api.spec import GROUP, PLURAL, VERSION
from infertune.api.status import ConditionStatus, ConditionType
from infertune.controller.conditions import condition_dict, merge_condition_dicts
from infertune.controller.reconcile import assess
from infertune.controller.status_patch import write_status

pytestmark = pytest.mark.e2e

STAMP = "2026-12-04T08:00:00Z"
# Types no controller writes, so an operator that the session may be running leaves them
# alone (it removes the autoscaler's own, MetricsAvailable and ScalingActive, from a tuning
# without spec.autoscaling).
THEIRS = {**condition_dict(ConditionType.METRICS_AVAILABLE, ConditionStatus.TRUE, "Found",
                           "theirs", 1, STAMP), "type": "E2eTheirs"}
OURS = {**condition_dict(ConditionType.SCALING_ACTIVE, ConditionStatus.TRUE, "Scaling", "ours",
                         1, STAMP), "type": "E2eOurs"}


def record(who: str) -> dict[str, Any]:
    return {"time": STAMP, "feature": "autoscaling", "action": f"Hold by {who}",
            "reason": who, "applied": True}


def add(stored: Mapping[str, Any], condition: dict[str, Any], who: str) -> dict[str, Any]:
    """A writer's patch over `stored`: its condition merged in, its decision appended."""
    conditions = merge_condition_dicts(stored.get("conditions") or [], condition)
    return {"conditions": conditions or stored.get("conditions") or [],
            "decisions": [*(stored.get("decisions") or []), record(who)]}


@pytest.fixture
def tuning(api_client: client.ApiClient, namespace: str,
           operator: OperatorProcess) -> dict[str, Any]:
    """A tuning the operator has reconciled. Its target exists, so the controller writes its
    status once and is then quiet: the writes in these tests are the only ones."""
    create(api_client, namespace, deployment("target"))
    create(api_client, namespace, tuning_body("shared", "target"))
    return wait_observed(api_client, namespace, "shared", operator)


def stored(api: client.CustomObjectsApi, namespace: str) -> dict[str, Any]:
    return cast(dict[str, Any], api.get_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "shared"))


def other_writer(api: client.CustomObjectsApi, namespace: str) -> None:
    """Another writer lands a change after ours was planned (over the latest version: an
    operator that the session runs may be writing the new tuning too)."""
    for _ in range(10):
        now = stored(api, namespace)
        try:
            api.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, "shared",
                {"metadata": {"resourceVersion": now["metadata"]["resourceVersion"]},
                 "status": add(now.get("status") or {}, THEIRS, "them")})
            return
        except ApiException as error:
            if error.status != 409:
                raise
    raise AssertionError("the other writer kept conflicting")


def test_a_status_patch_over_an_older_resource_version_is_refused(
    api_client: client.ApiClient, namespace: str, tuning: dict[str, Any]
) -> None:
    api = client.CustomObjectsApi(api_client)
    old = tuning["metadata"]["resourceVersion"]
    other_writer(api, namespace)
    with pytest.raises(ApiException) as refused:
        api.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "shared",
            {"metadata": {"resourceVersion": old}, "status": add({}, OURS, "us")})
    assert refused.value.status == 409


def test_write_status_builds_again_over_what_another_writer_stored(
    api_client: client.ApiClient, namespace: str, tuning: dict[str, Any]
) -> None:
    api = client.CustomObjectsApi(api_client)
    planned_over = tuning.get("status") or {}
    other_writer(api, namespace)
    built_over: list[Mapping[str, Any]] = []

    def build(status: Mapping[str, Any]) -> dict[str, Any]:
        built_over.append(status)
        return add(status, OURS, "us")

    landed = write_status(namespace, "shared", planned_over,
                          tuning["metadata"]["resourceVersion"], build, api=api)
    assert len(built_over) >= 2 and built_over[0] is planned_over
    status = stored(api, namespace)["status"]
    assert landed is not None
    types = {c["type"] for c in status["conditions"]}
    assert {"E2eTheirs", "E2eOurs"} <= types
    assert [d["reason"] for d in status["decisions"] if d["feature"] == "autoscaling"] == [
        "them", "us"]


def test_without_the_resource_version_the_other_writers_entries_are_lost(
    api_client: client.ApiClient, namespace: str, tuning: dict[str, Any]
) -> None:
    """The failure the resourceVersion prevents, shown on the same server."""
    api = client.CustomObjectsApi(api_client)
    planned_over = tuning.get("status") or {}
    other_writer(api, namespace)
    write_status(namespace, "shared", planned_over, None, lambda s: add(s, OURS, "us"), api=api)
    status = stored(api, namespace)["status"]
    assert "E2eTheirs" not in {c["type"] for c in status["conditions"]}
    assert "them" not in [d["reason"] for d in status["decisions"]]


def as_kopf_sends(body: dict[str, Any], fn: Any) -> list[dict[str, Any]]:
    """The JSON patch kopf sends to the status subresource for a patch function over `body`
    (kopf.Patch.as_json_patch, then only the status ops, after a test of the version)."""
    ops = kopf.Patch(fns=[fn]).as_json_patch(body)  # type: ignore[arg-type]
    return [{"op": "test", "path": "/metadata/resourceVersion",
             "value": body["metadata"]["resourceVersion"]},
            *[op for op in ops if op["path"].startswith("/status/")]]


def test_the_controllers_lists_are_refused_over_an_older_version_and_merged_into_the_newer(
    api_client: client.ApiClient, namespace: str, tuning: dict[str, Any]
) -> None:
    api = client.CustomObjectsApi(api_client)
    handled = stored(api, namespace)  # the event the controller handles
    # The target gone: the controller changes two conditions and records a decision.
    result = assess(handled, None, "2026-12-04T09:00:00Z")
    other_writer(api, namespace)  # lands between the event and kopf's patch
    with pytest.raises(ApiException) as refused:
        api.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "shared", as_kopf_sends(handled, result.merge_lists),
            _content_type="application/json-patch+json")
    assert refused.value.status == 422  # what kopf takes as "apply it again on the next cycle"
    newer = stored(api, namespace)
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "shared", as_kopf_sends(newer, result.merge_lists),
        _content_type="application/json-patch+json")
    status = stored(api, namespace)["status"]
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["E2eTheirs"]["message"] == "theirs"
    assert by_type["TargetFound"]["status"] == "False"
    assert by_type["Ready"]["reason"] == "TargetNotFound"
    reasons = [d["reason"] for d in status["decisions"]]
    assert "them" in reasons and reasons[-1].startswith("Deployment target not found")


def test_a_write_planned_for_a_spec_that_changed_meanwhile_is_dropped(
    api_client: client.ApiClient, namespace: str, tuning: dict[str, Any]
) -> None:
    """An autoscaler evaluation planned before spec.autoscaling was removed met the conflict,
    read the status again and built its blocks over it: it put back what the controller had
    just removed with the spec. With `still` the write is dropped when the spec it was
    planned for is gone."""
    api = client.CustomObjectsApi(api_client)
    planned_over = tuning.get("status") or {}
    version = tuning["metadata"]["resourceVersion"]
    api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "shared",
                                       {"spec": {"mode": "DryRun"}})
    landed = write_status(namespace, "shared", planned_over, version,
                          lambda s: add(s, OURS, "us"), api=api,
                          still=lambda obj: obj["spec"].get("mode") != "DryRun")
    assert landed is None
    status = stored(api, namespace).get("status") or {}
    assert "E2eOurs" not in {c["type"] for c in status.get("conditions") or []}
    assert "us" not in [d["reason"] for d in status.get("decisions") or []]
