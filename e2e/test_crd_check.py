"""An InferenceTuning CRD that is not the operator's release's, end to end, on a control plane of
its own (the CRD is cluster-wide, and the session's operator and tests need the current one).

The operator runs with the chart's RBAC through its ServiceAccount's token. Helm installs a
chart's CRDs on the first install only; an upgrade leaves the older CRD in place, and the API
server prunes what its schema does not know. The operator says so (log, Event on the CRD,
gauge) until this release's CRD is applied, and goes on working meanwhile.
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
from infertune.api.crd import SCHEMA_DIGEST_ANNOTATION, schema_digest
from infertune.controller.crd_check import CURRENT, OUTDATED

pytestmark = pytest.mark.e2e

GAUGE = "infertune_crd_schema_current"


def crd_events(api: client.ApiClient) -> list[Any]:
    """The Events about the CRD, oldest first."""
    events = client.CoreV1Api(api).list_namespaced_event(
        "default", field_selector=f"involvedObject.name={CRD_NAME}").items
    return sorted(events, key=lambda e: e.metadata.creation_timestamp)


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
            assert operator_samples(url)[GAUGE] == {
                frozenset({("installed", schema_digest()), ("release", schema_digest())}): 1.0}
            assert crd_events(api) == []  # nothing to say at a start with the right one
            # As a release before the digest left it.
            ext.patch_custom_resource_definition(
                CRD_NAME, {"metadata": {"annotations": {SCHEMA_DIGEST_ANNOTATION: None}}})
            outdated = frozenset({("installed", "none"), ("release", schema_digest())})
            wait_for(lambda: operator_samples(url)[GAUGE].get(outdated) == 0.0,
                     "the gauge at 0", timeout_s=30)
            wait_for(lambda: [e.reason for e in crd_events(api)] == [OUTDATED],
                     "the Warning Event on the CRD", timeout_s=30)
            warning = crd_events(api)[0]
            assert warning.type == "Warning"
            assert warning.involved_object.kind == "CustomResourceDefinition"
            assert warning.involved_object.uid == ext.read_custom_resource_definition(
                CRD_NAME).metadata.uid
            assert SCHEMA_DIGEST_ANNOTATION in warning.message
            assert "kubectl apply -f charts/infertune/crds/" in warning.message
            wait_for(lambda: "is not this release's" in log.read_text(errors="replace"),
                     "the error in the log", timeout_s=10)
            apply_crd(api)  # this release's
            wait_for(lambda: [e.reason for e in crd_events(api)] == [OUTDATED, CURRENT],
                     "the Normal Event on the CRD", timeout_s=30)
            assert operator_samples(url)[GAUGE] == {
                frozenset({("installed", schema_digest()), ("release", schema_digest())}): 1.0}
            operator.check_running()
            text = log.read_text(errors="replace")
            assert text.count("is not this release's") == 1, text  # said once, not each second
            assert "Forbidden" not in text and "forbidden" not in text
        finally:
            operator.stop()
