"""An operator started without Prometheus, on a control plane of its own: the session's
operator has Prometheus and handles every namespace, so the two would fight over the same
tunings. Autoscaling cannot be evaluated; the operator says so once, in the log and in the
ScalingActive condition, leaves replicas alone, and tunes everything else as usual."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from e2e.conftest import new_namespace, own_control_plane
from e2e.fixtures.access import ClusterInfo
from e2e.fixtures.operator import OperatorProcess, start_operator
from e2e.test_operator import condition, create, deployment, get_tuning, tuning, wait_observed

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def bare(cluster: ClusterInfo,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[client.ApiClient,
                                                                     OperatorProcess]]:
    """A second control plane and an operator on it without --prometheus-url."""
    work = tmp_path_factory.mktemp("no-prometheus")
    with own_control_plane(cluster, work, "needs a second control plane of its own: an "
                           "external cluster runs the chart's operator, with the Prometheus "
                           "the chart was given") as api:
        operator = start_operator(api, work, work / "logs")
        try:
            yield api, operator
        finally:
            operator.stop()


def test_an_operator_without_prometheus_says_so_and_leaves_replicas_alone(
        bare: tuple[client.ApiClient, OperatorProcess]) -> None:
    api, operator = bare
    namespace = new_namespace(api, "no-prometheus")
    create(api, namespace, deployment("qwen", replicas=2))
    create(api, namespace, tuning("qwen", "qwen", autoscaling={
        "minReplicas": 3, "maxReplicas": 4, "interval": "2s"}))
    body = wait_observed(api, namespace, "qwen", operator, kind="ScalingActive",
                         status="False")
    scaling = condition(body, "ScalingActive")
    assert scaling is not None and scaling["reason"] == "NoPrometheus"
    assert "--prometheus-url" in scaling["message"]
    ready = condition(body, "Ready")
    assert ready is not None and ready["status"] == "True", ready  # the rest is tuned
    assert "no --prometheus-url" in operator.tail(200)
    # Below minReplicas, an operator with Prometheus would scale to 3 at its first evaluation;
    # this one cannot evaluate anything, so it writes nothing.
    time.sleep(3 * 2)
    scale = client.AppsV1Api(api).read_namespaced_deployment_scale("qwen", namespace)
    assert scale.spec.replicas == 2
    status = get_tuning(api, namespace, "qwen").get("status") or {}
    # The controller records the replicas it saw; no decision was made or recorded.
    assert status["autoscaling"] == {"currentReplicas": 2}
    assert [d["feature"] for d in status["decisions"]] == ["controller"], status["decisions"]
    assert [c["reason"] for c in status["conditions"] if c["type"] == "ScalingActive"] == [
        "NoPrometheus"]
