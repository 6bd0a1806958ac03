"""An InferenceTuning CRD that is not the operator's release's, end to end, on a control plane of
its own (the CRD is cluster-wide, and the session's operator and tests need the current one).

The operator runs with the chart's RBAC through its ServiceAccount's token. Helm installs a
chart's CRDs on the first install only; an upgrade leaves the older CRD in place, and the API
server prunes what its schema does not know. The operator says so (log, Event on the CRD,
gauge) until a CRD that keeps its fields is applied, and goes on working meanwhile; a newer
CRD, which drops none, is only noted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.conftest import own_control_plane
from e2e.fixtures.access import ClusterInfo
from e2e.fixtures.operator import CRD_NAME, apply_crd, start_operator
from e2e.fixtures.waiting import wait_for
from e2e.test_autoscaling import operator_samples
from infertune.api.crd import (
    SCHEMA_DIGEST_ANNOTATION,
    SCHEMA_GENERATION,
    SCHEMA_GENERATION_ANNOTATION,
    custom_resource_definition,
    schema_digest,
)
from infertune.controller.crd_check import CURRENT, OUTDATED

pytestmark = pytest.mark.e2e

GAUGE = "infertune_crd_schema_current"
NEWER = "sha256:fedcba9876543210"


def crd_events(api: client.ApiClient) -> list[Any]:
    """The Events about the CRD, oldest first."""
    events = client.CoreV1Api(api).list_namespaced_event(
        "default", field_selector=f"involvedObject.name={CRD_NAME}").items
    return sorted(events, key=lambda e: e.metadata.creation_timestamp)


def schema_node(crd: dict[str, Any], path: str) -> dict[str, Any]:
    node = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for name in path.split("."):
        node = node["properties"][name]
    return node


def replace_crd(api: client.ApiClient, body: dict[str, Any]) -> None:
    ext = client.ApiextensionsV1Api(api)
    body["metadata"]["resourceVersion"] = ext.read_custom_resource_definition(
        CRD_NAME).metadata.resource_version
    ext.replace_custom_resource_definition(CRD_NAME, body)


def test_an_older_crd_is_said_until_this_releases_is_applied(cluster: ClusterInfo,
                                                            tmp_path: Path) -> None:
    with own_control_plane(cluster, tmp_path, "needs a control plane of its own: the CRD is "
                           "cluster-wide, and the others need this release's") as api:
        operator = start_operator(api, tmp_path, tmp_path,
                                  extra_args=("--crd-check-interval", "1"))
        assert operator.metrics_url is not None and operator.log is not None
        url, log = operator.metrics_url, operator.log
        ext = client.ApiextensionsV1Api(api)
        try:
            ours = frozenset({("installed", schema_digest()), ("release", schema_digest())})
            wait_for(lambda: operator_samples(url).get(GAUGE) == {ours: 1.0},
                     "the gauge at 1", timeout_s=30)
            # A newer release's CRD (applied before the operator's upgrade, or kept by a
            # rollback): a field more, nothing dropped, nothing said but a note.
            newer = custom_resource_definition()
            newer["metadata"]["annotations"] = {
                SCHEMA_DIGEST_ANNOTATION: NEWER,
                SCHEMA_GENERATION_ANNOTATION: str(SCHEMA_GENERATION + 1)}
            schema_node(newer, "spec.autoscaling")["properties"]["newField"] = {
                "type": "string"}
            replace_crd(api, newer)
            noted = frozenset({("installed", NEWER), ("release", schema_digest())})
            wait_for(lambda: operator_samples(url)[GAUGE] == {noted: 1.0},
                     "the gauge at 1 for the newer CRD", timeout_s=30)
            # As the release before the backlog rules left it: no digest, no state.queue.
            older = custom_resource_definition()
            del older["metadata"]["annotations"]
            del schema_node(older, "status.autoscaling.state")["properties"]["queue"]
            replace_crd(api, older)
            outdated = frozenset({("installed", "none"), ("release", schema_digest())})
            wait_for(lambda: operator_samples(url)[GAUGE] == {outdated: 0.0},
                     "the gauge at 0", timeout_s=30)
            wait_for(lambda: [e.reason for e in crd_events(api)] == [OUTDATED],
                     "the Warning Event on the CRD", timeout_s=30)
            warning = crd_events(api)[0]
            assert warning.type == "Warning"
            assert warning.involved_object.kind == "CustomResourceDefinition"
            assert warning.involved_object.uid == ext.read_custom_resource_definition(
                CRD_NAME).metadata.uid
            assert "The fields: status.autoscaling.state.queue;" in warning.message
            assert "kubectl apply -f charts/infertune/crds/" in warning.message
            wait_for(lambda: "lacks 1 of this release's fields" in log.read_text(
                errors="replace"), "the error in the log", timeout_s=10)
            apply_crd(api)  # this release's
            # Both, in whichever order a clock of whole seconds sorts them.
            wait_for(lambda: sorted(e.reason for e in crd_events(api)) == sorted(
                [OUTDATED, CURRENT]), "the Normal Event on the CRD", timeout_s=30)
            assert operator_samples(url)[GAUGE] == {ours: 1.0}
            operator.check_running()
            text = log.read_text(errors="replace")
            assert text.count("lacks 1 of this release's fields") == 1, text  # said once
            assert text.count("is a newer release's") == 1, text
            assert "Forbidden" not in text and "forbidden" not in text
        finally:
            operator.stop()
