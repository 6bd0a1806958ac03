"""The chart's namespace-scoped install (`watchNamespaces`), end to end, on a control plane of
its own (the session's operator handles every namespace and would act on these tunings too).

The operator runs with the arguments `helm template` renders for one watched namespace, and
with the ServiceAccount, ClusterRole, Roles and bindings it renders, through the account's real
token: a permission the scoped install lacks fails here as it would in a cluster. It tunes and
autoscales the tunings of the watched namespace, leads through its Lease, leaves another
namespace's tunings and Deployments alone, and is refused nothing on the way.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils

from e2e.conftest import new_namespace, own_control_plane
from e2e.fixtures.access import ClusterInfo
from e2e.fixtures.operator import (
    OPERATOR_NAMESPACE,
    SERVICE_ACCOUNT,
    WEBHOOK_CONFIGURATION,
    OperatorProcess,
    apply_crd,
    chart_operator_options,
    launch_operator,
)
from e2e.fixtures.prometheus import PrometheusServer
from e2e.fixtures.rbac import token_kubeconfig
from e2e.fixtures.waiting import wait_for
from e2e.test_chart import CHART, helm, operator_args
from e2e.test_operator import condition, create, deployment, get_tuning, tuning, wait_observed
from infertune.kube.lease import DEFAULT_LEASE_NAME

pytestmark = pytest.mark.e2e

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
REFUSED = ("Forbidden", "forbidden")
"""How a refused request shows in the log (kopf's APIForbiddenError, the client's reason)."""


@dataclass
class Scoped:
    api: client.ApiClient
    operator: OperatorProcess
    watched: str
    other: str


@pytest.fixture(scope="module", params=["mig-on", "mig-off"])
def scoped(cluster: ClusterInfo, prometheus: PrometheusServer,
           tmp_path_factory: pytest.TempPathFactory,
           request: pytest.FixtureRequest) -> Iterator[Scoped]:
    """The chart's operator for one namespace, with MIG on (the default) and with
    mig.enabled=false, whose ClusterRole leaves out what only MIG needs (patching nodes,
    the pods of every namespace): the tests below find no refused request in either."""
    mig_off = request.param == "mig-off"
    work = tmp_path_factory.mktemp("namespace-scoped")
    with own_control_plane(cluster, work, "needs a control plane of its own: an external "
                           "cluster runs the chart's operator for every namespace") as api:
        apply_crd(api)
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=OPERATOR_NAMESPACE)))
        watched, other = new_namespace(api, "watched"), new_namespace(api, "other")
        rendered = helm("template", "infertune", str(CHART), "--namespace", OPERATOR_NAMESPACE,
                        "--set", f"watchNamespaces={{{watched}}}",
                        "--set", f"prometheus.url={prometheus.url}",
                        *(["--set", "mig.enabled=false"] if mig_off else [])).stdout
        documents = [d for d in yaml.safe_load_all(rendered) if d]
        applied = [d for d in documents if d["kind"] in RBAC_KINDS]
        # What makes the install namespace-scoped: the tunings' rules in a Role there.
        assert any(d["kind"] == "Role" and d["metadata"]["namespace"] == watched
                   for d in applied), "the chart renders no Role in the watched namespace"
        for document in applied:
            utils.create_from_dict(api, document)
        kubeconfig = token_kubeconfig(api, OPERATOR_NAMESPACE, SERVICE_ACCOUNT,
                                      work / "operator.kubeconfig")
        options, liveness_port = chart_operator_options(operator_args(rendered))
        assert f"--namespace={watched}" in options and "--leader-elect" in options, options
        assert ("--no-mig" in options) == mig_off, options
        operator = launch_operator(api, kubeconfig, [*options, "--verbose"], liveness_port,
                                   work, work / "operator.log",
                                   env={"INFERTUNE_NAMESPACE": OPERATOR_NAMESPACE})
        # The chart's readiness probe: the file exists once the configuration is registered
        # (launch_operator waited for that) and kopf's indexes are loaded, and goes when the
        # operator stops.
        ready = Path(next(o.split("=", 1)[1] for o in options if o.startswith("--ready-file=")))
        try:
            wait_for(ready.exists, "the ready file, the webhook registered and the indexes "
                     "loaded", timeout_s=30)
            yield Scoped(api, operator, watched, other)
        finally:
            operator.stop()
        assert not ready.exists(), "the ready file outlived the operator"


def replicas(api: client.ApiClient, namespace: str, name: str) -> int:
    scale = client.AppsV1Api(api).read_namespaced_deployment_scale(name, namespace)
    return int(scale.spec.replicas)


def refusals(operator: OperatorProcess) -> list[str]:
    assert operator.log is not None
    return [line for line in operator.log.read_text(errors="replace").splitlines()
            if any(word in line for word in REFUSED)]


def test_the_watched_namespace_is_tuned_and_autoscaled(scoped: Scoped) -> None:
    api, namespace = scoped.api, scoped.watched
    create(api, namespace, deployment("qwen", replicas=2))
    create(api, namespace, tuning("qwen", "qwen", autoscaling={
        "minReplicas": 3, "maxReplicas": 4, "interval": "2s"}))
    body = wait_observed(api, namespace, "qwen", scoped.operator)
    assert body["metadata"]["finalizers"], body["metadata"]
    # Below minReplicas: the first evaluation writes 3 through the scale subresource, which
    # only the Role in this namespace grants.
    wait_for(lambda: replicas(api, namespace, "qwen") == 3, "replicas written to 3",
             timeout_s=30)
    body = wait_for(lambda: (b := get_tuning(api, namespace, "qwen")).get("status", {}).get(
        "autoscaling", {}).get("desiredReplicas") == 3 and b, "status.autoscaling written")
    # Nothing the Role withholds blocks it: Scaling, or, from the second evaluation,
    # MetricsUnavailable (nothing exports this Deployment's metrics here).
    scaling = condition(body, "ScalingActive")
    assert scaling is not None and scaling["reason"] in ("Scaling", "MetricsUnavailable"), \
        scaling
    # The pods it admitted are tuned (the webhook's indexes read pods of this namespace).
    pods = wait_for(lambda: [p for p in client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector="app=qwen").items
        if (p.metadata.labels or {}).get("infertune.io/tuned-by") == "qwen"],
        "tuned pods of qwen", timeout_s=30)
    assert pods[0].spec.init_containers[0].name == "infertune-launcher"
    # It leads through the Lease in its own namespace, which its Role there grants.
    lease = client.CoordinationV1Api(api).read_namespaced_lease(DEFAULT_LEASE_NAME,
                                                                OPERATOR_NAMESPACE)
    assert lease.spec.holder_identity, lease.spec
    assert not refusals(scoped.operator), scoped.operator.tail(80)


def test_another_namespace_is_left_alone(scoped: Scoped) -> None:
    api, namespace = scoped.api, scoped.other
    create(api, namespace, deployment("qwen", replicas=2))
    create(api, namespace, tuning("qwen", "qwen", autoscaling={
        "minReplicas": 3, "maxReplicas": 4, "interval": "2s"}))
    # A tuning in the watched namespace, created after, is handled: by then the operator
    # would have seen the other one too, had it watched that namespace.
    create(api, scoped.watched, deployment("later", replicas=1))
    create(api, scoped.watched, tuning("later", "later"))
    wait_observed(api, scoped.watched, "later", scoped.operator)
    time.sleep(3 * 2)  # three autoscaling intervals
    body: dict[str, Any] = get_tuning(api, namespace, "qwen")
    assert "status" not in body and not body["metadata"].get("finalizers"), body
    assert replicas(api, namespace, "qwen") == 2
    # Its pods are not sent to the webhook at all: the registration selects the watched
    # namespace only.
    registration = client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(
        WEBHOOK_CONFIGURATION)
    expressions = registration.webhooks[0].namespace_selector.match_expressions
    assert ("kubernetes.io/metadata.name", "In", [scoped.watched]) in [
        (e.key, e.operator, e.values) for e in expressions], expressions
    # Nor are its tunings to the admission check: they are not this operator's to refuse.
    check = next(w for w in registration.webhooks if w.name == "inferencetunings.infertune.io")
    assert [(e.key, e.operator, e.values) for e in check.namespace_selector.match_expressions
            ] == [("kubernetes.io/metadata.name", "In", [scoped.watched])]
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector="app=qwen").items
    assert pods and not any((p.metadata.labels or {}).get("infertune.io/tuned-by")
                            for p in pods), [p.metadata.labels for p in pods]
    assert not refusals(scoped.operator), scoped.operator.tail(80)


def test_deleting_a_watched_tuning_completes(scoped: Scoped) -> None:
    """The finalizer comes off with only the Role's permissions (patching the tuning)."""
    api, namespace = scoped.api, scoped.watched
    create(api, namespace, deployment("gone", replicas=1))
    create(api, namespace, tuning("gone", "gone"))
    wait_observed(api, namespace, "gone", scoped.operator)
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        "infertune.io", "v1alpha1", namespace, "inferencetunings", "gone")

    def deleted() -> bool:
        try:
            get_tuning(api, namespace, "gone")
        except client.ApiException as error:
            return error.status == 404
        return False

    wait_for(deleted, "the tuning deleted (finalizer removed)", timeout_s=30)
    assert not refusals(scoped.operator), scoped.operator.tail(80)
