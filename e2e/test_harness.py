"""The e2e harness itself: the control plane behaves like Kubernetes, with both real clients.

These are the promises the operator's end-to-end tests build on: apply/patch/scale/label/
delete/watch through kubectl and the Python client, Deployments that get ReplicaSets and
Ready pods on simulated GPU nodes, garbage collection, the scheduler refusing impossible GPU
requests, admission webhooks, RBAC, and a Prometheus that scrapes what a test serves.
"""

from __future__ import annotations

import json
import queue
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Gauge
from urllib3.exceptions import ProtocolError

from e2e.fixtures.access import ClusterInfo, Kubectl
from e2e.fixtures.prometheus import MetricsEndpoint, PrometheusServer
from e2e.fixtures.rbac import load_rules, service_account_kubeconfig
from e2e.fixtures.waiting import wait_for
from e2e.fixtures.webhook import AdmissionWebhookServer

pytestmark = pytest.mark.e2e


def typed_loosely(api_client: client.ApiClient) -> tuple[Any, Any, Any]:
    """Core, Apps and Admission APIs, typed Any on purpose.

    The client's models make every field Optional; these tests read fields the server always
    sets, and a None there fails the assertion as loudly as a type check would.
    """
    return (
        client.CoreV1Api(api_client),
        client.AppsV1Api(api_client),
        client.AdmissionregistrationV1Api(api_client),
    )


def deployment_manifest(name: str, replicas: int, resources: dict[str, Any] | None = None) -> str:
    container: dict[str, Any] = {"name": "server", "image": "registry.k8s.io/pause:3.10"}
    if resources:
        container["resources"] = resources
    return json.dumps(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [container]},
                },
            },
        }
    )


def pod_ready(pod: Any) -> bool:
    conditions = pod.status.conditions or []
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in conditions
    )


def gone(read: Callable[[], object]) -> bool:
    try:
        read()
    except ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def test_kubectl_and_python_client_see_each_others_writes(
    kubectl: Kubectl, api_client: client.ApiClient, namespace: str
) -> None:
    core, apps, _ = typed_loosely(api_client)
    settings = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}}
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(settings | {"data": {"a": "1"}}))
    kubectl("apply", "-n", namespace, "-f", "-", input=deployment_manifest("web", 1))
    assert core.read_namespaced_config_map("settings", namespace).data == {"a": "1"}

    kubectl("patch", "configmap", "settings", "-n", namespace, "--type=merge",
            "-p", '{"data": {"b": "2"}}')  # fmt: skip
    assert core.read_namespaced_config_map("settings", namespace).data == {"a": "1", "b": "2"}
    core.patch_namespaced_config_map("settings", namespace, {"data": {"c": "3"}})
    shown = kubectl("get", "configmap", "settings", "-n", namespace, "-o", "jsonpath={.data.c}")
    assert shown.stdout == "3"

    kubectl("scale", "deployment", "web", "-n", namespace, "--replicas=2")
    assert apps.read_namespaced_deployment_scale("web", namespace).spec.replicas == 2
    apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": 3}})
    shown = kubectl("get", "deployment", "web", "-n", namespace, "-o", "jsonpath={.spec.replicas}")
    assert shown.stdout == "3"

    kubectl("label", "configmap", "settings", "-n", namespace, "tier=gold")
    assert core.read_namespaced_config_map("settings", namespace).metadata.labels == {
        "tier": "gold"
    }

    kubectl("delete", "configmap", "settings", "-n", namespace)
    assert gone(lambda: core.read_namespaced_config_map("settings", namespace))
    refused = kubectl("get", "configmap", "settings", "-n", namespace, check=False)
    assert refused.returncode != 0
    assert "NotFound" in refused.stderr


def expect_event(events: queue.Queue[tuple[str, str]], kind: str, name: str) -> None:
    """Take events until (kind, name) arrives; other objects' events are not the test's."""
    seen: list[tuple[str, str]] = []

    def arrived() -> bool:
        try:
            seen.append(events.get(timeout=0.5))
        except queue.Empty:
            return False
        return seen[-1] == (kind, name)

    wait_for(arrived, f"watch event {kind} {name} (seen: {seen})", timeout_s=20)


def test_watches_of_both_clients_see_a_new_object(
    kubectl: Kubectl, api_client: client.ApiClient, namespace: str
) -> None:
    core, _, _ = typed_loosely(api_client)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "sentinel"}})
    listed = core.list_namespaced_config_map(namespace)

    python_events: queue.Queue[tuple[str, str]] = queue.Queue()
    python_watch: Any = watch.Watch()  # type: ignore[no-untyped-call]

    def follow_python_watch() -> None:
        stream = python_watch.stream(
            core.list_namespaced_config_map,
            namespace,
            resource_version=listed.metadata.resource_version,
            timeout_seconds=60,
        )
        try:
            for event in stream:
                python_events.put((event["type"], event["object"].metadata.name))
        except ProtocolError:
            pass  # Watch.stop() takes effect at the next event; cluster teardown cuts the stream

    threading.Thread(target=follow_python_watch, daemon=True).start()
    # Without --watch-only kubectl lists first: once the sentinel shows, its watch is open.
    watcher = kubectl.popen(
        "get", "configmaps", "-n", namespace, "--watch", "--output-watch-events", "-o", "json"
    )
    kubectl_events: queue.Queue[tuple[str, str]] = queue.Queue()

    def follow_kubectl_watch() -> None:
        assert watcher.stdout is not None
        for line in watcher.stdout:
            event = json.loads(line)
            kubectl_events.put((event["type"], event["object"]["metadata"]["name"]))

    threading.Thread(target=follow_kubectl_watch, daemon=True).start()
    try:
        expect_event(kubectl_events, "ADDED", "sentinel")
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "fresh"}})
        expect_event(kubectl_events, "ADDED", "fresh")
        expect_event(python_events, "ADDED", "fresh")
        kubectl("delete", "configmap", "fresh", "-n", namespace)
        expect_event(kubectl_events, "DELETED", "fresh")
        expect_event(python_events, "DELETED", "fresh")
    finally:
        python_watch.stop()
        watcher.terminate()
        watcher.wait(timeout=10)


def test_deployment_gets_ready_pods_on_nodes_and_is_garbage_collected(
    kubectl: Kubectl, api_client: client.ApiClient, namespace: str
) -> None:
    core, apps, _ = typed_loosely(api_client)
    node_names = {n.metadata.name for n in core.list_node().items}
    kubectl("apply", "-n", namespace, "-f", "-", input=deployment_manifest("model", 3))

    replica_sets = wait_for(
        lambda: apps.list_namespaced_replica_set(namespace, label_selector="app=model").items,
        "a ReplicaSet for Deployment model",
    )
    assert [o.kind for o in replica_sets[0].metadata.owner_references] == ["Deployment"]

    def three_ready_pods() -> list[Any] | None:
        pods = core.list_namespaced_pod(namespace, label_selector="app=model").items
        return pods if len(pods) == 3 and all(pod_ready(p) for p in pods) else None

    pods = wait_for(three_ready_pods, "3 Running and Ready pods of model")
    assert {p.spec.node_name for p in pods} <= node_names
    assert all(p.metadata.owner_references[0].kind == "ReplicaSet" for p in pods)
    wait_for(
        lambda: (
            apps.read_namespaced_deployment_status("model", namespace).status.ready_replicas == 3
        ),
        "Deployment status readyReplicas=3",
    )

    apps.delete_namespaced_deployment(
        "model", namespace, body=client.V1DeleteOptions(propagation_policy="Foreground")
    )
    wait_for(
        lambda: gone(lambda: apps.read_namespaced_deployment("model", namespace)),
        "Deployment model deleted after its dependents",
    )
    assert apps.list_namespaced_replica_set(namespace).items == []
    wait_for(
        lambda: not core.list_namespaced_pod(namespace, label_selector="app=model").items,
        "pods of model garbage-collected",
    )


def test_pod_asking_for_more_gpus_than_any_node_has_stays_pending(
    api_client: client.ApiClient, namespace: str
) -> None:
    core, _, _ = typed_loosely(api_client)
    most = max(int((n.status.allocatable or {}).get("nvidia.com/gpu", "0"))
               for n in core.list_node().items)  # fmt: skip
    gpus = {"nvidia.com/gpu": str(most + 1)}
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "too-big"},
            "spec": {
                "containers": [
                    {
                        "name": "server",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": gpus, "limits": gpus},
                    }
                ]
            },
        },
    )

    def unschedulable() -> Any:
        pod = core.read_namespaced_pod("too-big", namespace)
        for condition in pod.status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False":
                return condition
        return None

    condition = wait_for(unschedulable, "PodScheduled=False on pod too-big")
    assert condition.reason == "Unschedulable"
    assert "nvidia.com/gpu" in condition.message
    pod = core.read_namespaced_pod("too-big", namespace)
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None


def test_nodes_carry_simulated_gpu_capacity_and_feature_discovery_labels(
    cluster: ClusterInfo, api_client: client.ApiClient
) -> None:
    if cluster.external:
        pytest.skip("the simulated GPU topology exists only in the cluster this session starts")
    core, _, _ = typed_loosely(api_client)
    nodes = {n.metadata.name: n for n in core.list_node().items}
    h200 = nodes["h200-0"]
    assert h200.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert h200.metadata.labels["nvidia.com/mig.capable"] == "true"
    assert h200.status.allocatable["nvidia.com/gpu"] == "8"
    assert nodes["h200-mig-0"].status.allocatable["nvidia.com/mig-3g.71gb"] == "16"
    assert nodes["l4-0"].metadata.labels["nvidia.com/mig.capable"] == "false"
    assert "nvidia.com/gpu" not in (nodes["cpu-0"].status.allocatable or {})


def test_mutating_webhook_served_by_the_test_patches_pod_creation(
    cluster: ClusterInfo, api_client: client.ApiClient, namespace: str
) -> None:
    if cluster.external:
        pytest.skip("the API server of an external cluster cannot reach this process's loopback")
    core, _, admission = typed_loosely(api_client)

    def label_pods(request: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"op": "add", "path": "/metadata/labels/e2e.infertune.io~1seen", "value": "yes"}]

    with AdmissionWebhookServer(label_pods) as server:
        name = f"e2e-{namespace}"
        admission.create_mutating_webhook_configuration(
            {
                "metadata": {"name": name},
                "webhooks": [
                    {
                        "name": "pods.e2e.infertune.io",
                        "clientConfig": {"url": server.url, "caBundle": server.ca_bundle},
                        "rules": [
                            {
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE"],
                                "resources": ["pods"],
                            }
                        ],
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": namespace}
                        },
                        "failurePolicy": "Fail",
                        "sideEffects": "None",
                        "admissionReviewVersions": ["v1"],
                        "timeoutSeconds": 5,
                    }
                ],
            }
        )
        try:
            pod = core.create_namespaced_pod(
                namespace,
                {
                    "metadata": {"name": "tuned", "labels": {"app": "tuned"}},
                    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
                },
            )
        finally:
            admission.delete_mutating_webhook_configuration(name)

    assert pod.metadata.labels == {"app": "tuned", "e2e.infertune.io/seen": "yes"}
    assert core.read_namespaced_pod("tuned", namespace).metadata.labels["e2e.infertune.io/seen"]
    [seen] = [r for r in server.requests if r["namespace"] == namespace]
    assert (seen["operation"], seen["kind"]["kind"], seen["object"]["metadata"]["name"]) == (
        "CREATE",
        "Pod",
        "tuned",
    )


def test_operator_rules_allow_deployments_but_not_other_namespaces_secrets(
    api_client: client.ApiClient,
    namespace_factory: Callable[[], str],
    kubectl: Kubectl,
    tmp_path: Path,
) -> None:
    home, elsewhere = namespace_factory(), namespace_factory()
    core, _, _ = typed_loosely(api_client)
    core.create_namespaced_secret(
        elsewhere, {"metadata": {"name": "model-token"}, "stringData": {"token": "s3cret"}}
    )
    path = service_account_kubeconfig(
        api_client, home, "infertune", load_rules(), tmp_path / "operator.kubeconfig"
    )
    operator: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(path)
    )
    try:
        assert client.AppsV1Api(operator).list_namespaced_deployment(elsewhere).items == []
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(operator).read_namespaced_secret("model-token", elsewhere)
        assert refused.value.status == 403
    finally:
        operator.close()  # type: ignore[no-untyped-call]
    as_operator = Kubectl(kubectl.binary, path)
    denied = as_operator("get", "secrets", "-n", elsewhere, check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr
    assert "system:serviceaccount:" + home + ":infertune" in denied.stderr


@pytest.mark.prometheus
def test_prometheus_scrapes_a_target_the_test_serves(prometheus: PrometheusServer) -> None:
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_waiting", "Requests waiting", registry=registry).set(7)
    job = f"engine-{uuid.uuid4().hex[:6]}"
    with MetricsEndpoint(registry) as endpoint:
        prometheus.add_scrape_job(job, [endpoint.target])
        try:
            prometheus.wait_for_targets_up(job)
            samples = wait_for(
                lambda: prometheus.query(f'vllm:num_requests_waiting{{job="{job}"}}'),
                "the engine's queue-depth gauge in Prometheus, under its real name",
            )
        finally:
            prometheus.remove_scrape_job(job)
    assert samples[0]["value"][1] == "7"
