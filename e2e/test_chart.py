"""The Helm chart, with the real Helm (built by `python -m e2e.cluster build`): it lints, it
refuses bad values naming them, and it installs on the real API server with the permissions
the operator acts with, among them the autoscaler's scale subresource.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes import client

from e2e.cluster.helm import helm_binary
from e2e.cluster.monitoring import monitoring_crds as monitoring_crds_files
from e2e.fixtures.access import ClusterInfo, Kubectl, exists
from e2e.fixtures.waiting import wait_for
from infertune.cli import build_parser
from infertune.kube.lease import DEFAULT_LEASE_NAME
from infertune.kube.webhooks import WebhookRegistration

pytestmark = pytest.mark.e2e

CHART = Path(__file__).resolve().parents[1] / "charts" / "infertune"
PROMETHEUS = "http://prometheus-operated.monitoring:9090"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = helm_binary()
    if not binary.exists():
        pytest.fail(f"Helm is not built ({binary} missing); run `python -m e2e.cluster build`",
                    pytrace=False)
    result = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def refusal(*values: str) -> str:
    """What `helm template` says when it must refuse `values` (it fails the test if it
    renders them)."""
    refused = helm("template", "t", str(CHART), *values, check=False)
    assert refused.returncode != 0, f"rendered with {values}"
    return refused.stderr


def operator_args(rendered: str) -> list[str]:
    """The operator container's arguments in `helm template` output."""
    for document in yaml.safe_load_all(rendered):
        if document and document.get("kind") == "Deployment":
            (container,) = document["spec"]["template"]["spec"]["containers"]
            return list(container["args"])
    raise AssertionError("the chart renders no Deployment")


@dataclass(frozen=True)
class Grants:
    """What `helm template` output grants the operator's ServiceAccount: the rules of the
    ClusterRoles bound to it, and of the Roles bound to it in each namespace."""

    cluster: tuple[dict[str, Any], ...]
    namespaced: dict[str, tuple[dict[str, Any], ...]]

    def allows(self, verb: str, group: str, resource: str, namespace: str | None = None,
               name: str | None = None) -> bool:
        """As RBAC decides a request (`namespace` None: a cluster-wide one)."""
        rules = self.cluster + (self.namespaced.get(namespace, ()) if namespace else ())
        return any(group in r.get("apiGroups", ()) and resource in r.get("resources", ())
                   and verb in r["verbs"]
                   and (not r.get("resourceNames") or name in r["resourceNames"])
                   for r in rules)


def granted(*values: str, namespace: str = "infertune-system") -> Grants:
    documents = [d for d in yaml.safe_load_all(helm("template", "t", str(CHART), "--namespace",
                                                     namespace, *values).stdout) if d]
    objects = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
               for d in documents]
    assert len(objects) == len(set(objects)), "an object is rendered twice"
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in documents if d["kind"] in ("ClusterRole", "Role")}
    cluster: list[dict[str, Any]] = []
    namespaced: dict[str, tuple[dict[str, Any], ...]] = {}
    for binding in documents:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        assert {"kind": "ServiceAccount", "name": "infertune-operator",
                "namespace": namespace} in binding["subjects"]
        where = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        rules = roles[(ref["kind"], None if ref["kind"] == "ClusterRole" else where,
                       ref["name"])]["rules"]
        if binding["kind"] == "ClusterRoleBinding":
            cluster += rules
        else:
            namespaced[where] = namespaced.get(where, ()) + tuple(rules)
    return Grants(tuple(cluster), namespaced)


def test_the_chart_lints_strictly() -> None:
    helm("lint", "--strict", str(CHART))


def test_prometheus_url_turns_autoscaling_on_and_is_left_out_when_empty() -> None:
    on = operator_args(helm("template", "t", str(CHART), "--set",
                            f"prometheus.url={PROMETHEUS}").stdout)
    assert f"--prometheus-url={PROMETHEUS}" in on
    off = operator_args(helm("template", "t", str(CHART)).stdout)
    assert not any(arg.startswith("--prometheus-url") for arg in off)


def test_an_ipv6_cluster_gets_the_webhook_and_health_endpoint_on_ipv6() -> None:
    """asyncio binds 0.0.0.0 to IPv4 only: in a cluster whose pods have only IPv6 addresses
    the kubelet's probes and the Service were refused, and the operator never became Ready."""
    default = operator_args(helm("template", "t", str(CHART)).stdout)
    assert {"--webhook-addr=0.0.0.0", "--liveness=http://0.0.0.0:8080/healthz"} <= set(default)
    ipv6 = operator_args(helm("template", "t", str(CHART), "--set", "ipFamily=IPv6").stdout)
    assert {"--webhook-addr=::", "--liveness=http://[::]:8080/healthz"} <= set(ipv6)
    assert "/ipFamily" in refusal("--set", "ipFamily=v6")

def test_the_operators_metrics_are_served_on_their_port_and_can_be_turned_off() -> None:
    on = rendered_deployment()
    pod = on["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert {"--metrics-addr=0.0.0.0", "--metrics-port=8081"} <= set(container["args"])
    assert {"name": "metrics", "containerPort": 8081} in container["ports"]
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "8081",
        "prometheus.io/path": "/metrics"}
    ipv6 = operator_args(helm("template", "t", str(CHART), "--set", "ipFamily=IPv6").stdout)
    assert "--metrics-addr=::" in ipv6
    off = rendered_deployment("--set", "metrics.enabled=false")
    container = off["spec"]["template"]["spec"]["containers"][0]
    assert not any(arg.startswith("--metrics") for arg in container["args"])
    assert all(port["name"] != "metrics" for port in container["ports"])
    assert "annotations" not in off["spec"]["template"]["metadata"]
    assert "metrics.port 9443 is webhook.port too" in refusal("--set", "metrics.port=9443")
    assert "/metrics/port" in refusal("--set", "metrics.port=8080")


ALERTS = CHART / "files" / "prometheus-alerts.yaml"
MONITORING = ["--set", "metrics.podMonitor.enabled=true",
              "--set", "metrics.prometheusRule.enabled=true"]
"""Both Prometheus Operator objects on."""


def monitoring_objects(*values: str, namespace: str = "infertune-system",
                       release: str = "t") -> dict[str, Any]:
    """The chart's monitoring.coreos.com objects by kind, as `helm template` renders them."""
    rendered = helm("template", release, str(CHART), "--namespace", namespace, *values).stdout
    return {d["kind"]: d for d in yaml.safe_load_all(rendered)
            if d and d["apiVersion"].startswith("monitoring.coreos.com/")}


def test_the_prometheus_operator_objects_are_made_only_when_asked_for() -> None:
    assert monitoring_objects() == {}
    assert monitoring_objects("--set", "metrics.podMonitor.enabled=true").keys() == {
        "PodMonitor"}
    assert monitoring_objects("--set", "metrics.prometheusRule.enabled=true").keys() == {
        "PrometheusRule"}
    # helm upgrade --reuse-values from a release before these settings: neither is made.
    assert monitoring_objects("--set", "metrics.podMonitor=null",
                              "--set", "metrics.prometheusRule=null") == {}


def test_the_podmonitor_scrapes_every_operator_pod_on_its_metrics_port() -> None:
    values = [*MONITORING, "--set", "metrics.port=9100", "--set", "metrics.podMonitor.interval=1m",
              "--set", "metrics.podMonitor.labels.release=kube-prometheus-stack"]
    monitor = monitoring_objects(*values, namespace="ops")["PodMonitor"]
    pod = rendered_deployment("--namespace", "ops", *values)["spec"]["template"]
    # It selects the operator's pods, in the release's namespace only, by the port's name.
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert monitor["metadata"]["namespace"] == "ops"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ops"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = pod["spec"]["containers"]
    assert {"name": endpoint["port"], "containerPort": 9100} in container["ports"]
    assert "--metrics-port=9100" in container["args"]
    # The tuning's own namespace label is kept (docs/autoscaling.md, "The operator's metrics").
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "1m",
                        "honorLabels": True}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/instance"] == "t"
    # Not also by the prometheus.io annotations: a Prometheus that discovers pods by them
    # too would scrape it a second time, without honorLabels.
    assert "annotations" not in pod["metadata"]
    assert monitoring_objects(*MONITORING)["PodMonitor"]["spec"]["podMetricsEndpoints"][0][
        "interval"] == "30s"


def test_the_prometheusrule_holds_the_alerts_the_tests_run() -> None:
    """The rule file tests/test_alert_rules.py runs through promtool, as it is: its
    annotations' {{ $labels.x }} are left for Prometheus, not taken by Helm."""
    rule = monitoring_objects(
        *MONITORING, "--set", "metrics.prometheusRule.labels.role=alert-rules",
        "--set", "metrics.prometheusRule.labels.rules\\.example\\.com/team=sre",
    )["PrometheusRule"]
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    assert "{{ $labels.namespace }}" in json.dumps(rule["spec"])
    assert {"role": "alert-rules", "rules.example.com/team": "sre"}.items() <= \
        rule["metadata"]["labels"].items()


@pytest.fixture
def monitoring_crds(kubectl: Kubectl) -> Iterator[None]:
    """The Prometheus Operator's PodMonitor and PrometheusRule CRDs, established."""
    crds = monitoring_crds_files()
    if not crds:
        pytest.fail("the Prometheus Operator's CRDs are not fetched; run "
                    "`python -m e2e.cluster build`", pytrace=False)
    names = [yaml.safe_load(path.read_text())["metadata"]["name"] for path in crds]
    for path in crds:  # server-side: a client-side apply's annotation would not fit
        kubectl("apply", "--server-side", "-f", str(path))
    try:
        for name in names:
            kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
        yield
    finally:
        for name in names:
            kubectl("delete", "crd", name, "--ignore-not-found", "--wait=false")


def test_the_prometheus_operator_objects_install_against_its_own_crds(
        cluster: ClusterInfo, kubectl: Kubectl, namespace: str, monitoring_crds: None) -> None:
    """The API server checks them against the Prometheus Operator's CRD schemas; read back,
    they are as rendered (a field the schema does not know would have been pruned)."""
    release = "infertune-monitoring"
    values = [*MONITORING, "--set", "image.pullPolicy=Never",
              "--set", "metrics.podMonitor.labels.release=kube-prometheus-stack"]
    rendered = monitoring_objects(*values, namespace=namespace, release=release)
    helm("install", release, str(CHART), "--kubeconfig", str(cluster.kubeconfig),
         "--namespace", namespace, *values)
    try:
        for kind, resource in (("PodMonitor", "podmonitors"),
                               ("PrometheusRule", "prometheusrules")):
            stored = json.loads(kubectl("get", f"{resource}.monitoring.coreos.com",
                                        "infertune-operator", "-n", namespace,
                                        "-o", "json").stdout)
            assert stored["spec"] == rendered[kind]["spec"], kind
            assert rendered[kind]["metadata"]["labels"].items() <= \
                stored["metadata"]["labels"].items()
    finally:
        helm("uninstall", release, "--kubeconfig", str(cluster.kubeconfig),
             "--namespace", namespace)
    for resource in ("podmonitors", "prometheusrules"):
        left = kubectl("get", f"{resource}.monitoring.coreos.com", "-n", namespace, "-o",
                       "name").stdout
        assert left.strip() == "", left


POLICY_FILES = {"authorPermissions": CHART / "files" / "policies" / "author-permissions.yaml",
                "migNamespaces": CHART / "files" / "policies" / "mig-namespaces.yaml",
                "operatorPodUpdates": CHART / "files" / "policies" / "operator-pod-updates.yaml",
                "operatorDeploymentUpdates":
                    CHART / "files" / "policies" / "operator-deployment-updates.yaml"}
POLICIES = ["--set", "policies.authorPermissions=true", "--set", "policies.migNamespaces=true",
            "--set", "policies.operatorPodUpdates=true",
            "--set", "policies.operatorDeploymentUpdates=true"]


def policy_objects(*values: str, release: str = "t") -> dict[tuple[str, str], dict[str, Any]]:
    """The chart's ValidatingAdmissionPolicies and bindings by (kind, name), as rendered."""
    rendered = helm("template", release, str(CHART), *values).stdout
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered)
            if d and d["apiVersion"].startswith("admissionregistration.k8s.io/")
            and d["kind"].startswith("ValidatingAdmissionPolicy")}


def test_the_policies_are_their_files_and_made_only_when_asked_for() -> None:
    """The end-to-end tests run the files (e2e/test_operator.py); the chart renders them as
    they are, with its labels."""
    assert policy_objects() == {}
    # helm upgrade --reuse-values from a release before the setting: none is made.
    assert policy_objects("--set", "policies=null") == {}
    for name, path in POLICY_FILES.items():
        made = policy_objects("--set", f"policies.{name}=true")
        files = list(yaml.safe_load_all(path.read_text()))
        assert made.keys() == {(f["kind"], f["metadata"]["name"]) for f in files}, name
        for expected in files:
            got = made[(expected["kind"], expected["metadata"]["name"])]
            assert got["spec"] == expected["spec"], name
            assert got["metadata"]["labels"]["app.kubernetes.io/instance"] == "t"
    assert len(policy_objects(*POLICIES)) == 8
    assert "policies.authorPermissions needs Kubernetes 1.30 or later" in refusal(
        "--set", "policies.authorPermissions=true", "--kube-version", "1.29.0")
    assert "/policies/migNamespaces" in refusal("--set-string", "policies.migNamespaces=yes")
    assert "/policies" in refusal("--set", "policies.other=true")


NETWORK_POLICY = ["--set", "networkPolicy.enabled=true",
                  "--set", "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/24",
                  "--set", "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels"
                  ".kubernetes\\.io/metadata\\.name=monitoring"]


def network_policies(*values: str) -> list[dict[str, Any]]:
    rendered = helm("template", "t", str(CHART), *values).stdout
    return [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "NetworkPolicy"]


def test_the_network_policy_lets_in_only_the_webhooks_callers_and_the_scrapers() -> None:
    """The webhook port answers whoever reaches it and the metrics port is unauthenticated:
    the policy admits the given callers to each, by the container's port names, on the
    operator's own pods, and nothing else."""
    assert network_policies() == []
    assert network_policies("--set", "networkPolicy=null") == []  # --reuse-values from before
    policy, = network_policies(*NETWORK_POLICY)
    kubernetes_validate.validate(policy, "1.37", strict=True)
    deployment = rendered_deployment(*NETWORK_POLICY)
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    ports = {p["name"]: p["containerPort"]
             for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # the operator's calls go out freely
    assert policy["spec"]["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": "webhook"}],
         "from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]},
        {"ports": [{"protocol": "TCP", "port": "metrics"}],
         "from": [{"namespaceSelector": {"matchLabels": {
             "kubernetes.io/metadata.name": "monitoring"}}}]}]
    assert {"webhook", "metrics"} <= ports.keys()
    # Without webhookFrom, the webhook port from anywhere (the API server's addresses are the
    # cluster's); without metrics, no metrics rule.
    policy, = network_policies("--set", "networkPolicy.enabled=true",
                               "--set", "metrics.enabled=false")
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": "webhook"}]}]


@pytest.mark.parametrize(("values", "says"), [
    (["--set", "networkPolicy.enabled=true"],
     "networkPolicy.metricsFrom: name who scrapes the operator's metrics"),
    ([*NETWORK_POLICY, "--set", "metrics.enabled=false"],
     "networkPolicy.metricsFrom needs metrics.enabled"),
    ([*NETWORK_POLICY, "--set", "networkPolicy.webhookFrom[0].cidr=10.0.0.0/24"],
     "/networkPolicy/webhookFrom/0"),
    ([*NETWORK_POLICY, "--set", "networkPolicy.open=true"], "/networkPolicy"),
])
def test_network_policy_values_that_cannot_work_are_refused(values: list[str],
                                                            says: str) -> None:
    said = refusal(*values)
    assert says in said, said


def test_the_network_policy_installs_on_the_api_server(kubectl: Kubectl,
                                                       namespace: str) -> None:
    """The API server checks what the values schema does not (the port names, the CIDR,
    the selectors); read back, the policy is as rendered."""
    policy, = network_policies(*NETWORK_POLICY)
    policy["metadata"]["namespace"] = namespace
    kubectl("create", "-f", "-", input=json.dumps(policy))
    stored = json.loads(kubectl("get", "networkpolicies.networking.k8s.io",
                                policy["metadata"]["name"], "-n", namespace,
                                "-o", "json").stdout)
    assert _within(policy["spec"], stored["spec"]), stored["spec"]


def _within(expected: Any, stored: Any) -> bool:
    """Whether `stored` is `expected` with the API server's defaults added (keys of its own
    in objects, at any depth)."""
    if isinstance(expected, dict):
        return isinstance(stored, dict) and all(
            k in stored and _within(v, stored[k]) for k, v in expected.items())
    if isinstance(expected, list):
        return (isinstance(stored, list) and len(stored) == len(expected)
                and all(map(_within, expected, stored)))
    return bool(expected == stored)


def test_the_policies_install_on_the_api_server(cluster: ClusterInfo, kubectl: Kubectl,
                                               namespace: str) -> None:
    """The API server compiles their CEL at creation (a misspelt function fails the
    install); read back, they are as rendered. A Helm release removes them with it."""
    release = "infertune-policies"
    values = [*POLICIES, "--set", "image.pullPolicy=Never"]
    rendered = policy_objects(*values, release=release)
    helm("install", release, str(CHART), "--kubeconfig", str(cluster.kubeconfig),
         "--namespace", namespace, *values)
    try:
        for (kind, name), expected in rendered.items():
            resource = ("validatingadmissionpolicies" if kind == "ValidatingAdmissionPolicy"
                        else "validatingadmissionpolicybindings")
            stored = json.loads(kubectl("get", f"{resource}.admissionregistration.k8s.io",
                                        name, "-o", "json").stdout)
            assert _within(expected["spec"], stored["spec"]), (name, stored["spec"])
    finally:
        helm("uninstall", release, "--kubeconfig", str(cluster.kubeconfig),
             "--namespace", namespace)
    left = kubectl("get", "validatingadmissionpolicies.admissionregistration.k8s.io",
                   "-o", "name").stdout
    assert "infertune-" not in left, left


@pytest.mark.parametrize(("values", "says"), [
    (["--set", "metrics.enabled=false", "--set", "metrics.podMonitor.enabled=true"],
     "metrics.podMonitor.enabled needs metrics.enabled"),
    (["--set", "metrics.enabled=false", "--set", "metrics.prometheusRule.enabled=true"],
     "metrics.prometheusRule.enabled needs metrics.enabled"),
    (["--set", "metrics.podMonitor.labels.app\\.kubernetes\\.io/name=x"],
     "metrics.podMonitor.labels: app.kubernetes.io/name is one of the chart's own labels"),
    (["--set", "metrics.prometheusRule.labels.app\\.kubernetes\\.io/instance=x"],
     "metrics.prometheusRule.labels: app.kubernetes.io/instance is one of the chart's own"),
    (["--set", "metrics.podMonitor.interval=30"], "/metrics/podMonitor/interval"),
    (["--set", "metrics.podMonitor.interval=half a minute"], "/metrics/podMonitor/interval"),
    (["--set-string", "metrics.podMonitor.labels.release=kube prometheus"],
     "/metrics/podMonitor/labels/release"),
    (["--set", "metrics.prometheusRule.labels.bad\\ key=x"],
     'metrics.prometheusRule.labels: "bad key" is not a label key'),
    (["--set", f"metrics.podMonitor.labels.{'a' * 64}=x"],
     f"metrics.podMonitor.labels: \"{'a' * 64}\" is not a label key"),
    (["--set", "metrics.podMonitor.labels.-x=x"], 'metrics.podMonitor.labels: "-x" is not'),
    (["--set", "metrics.podMonitor.scrapeEvery=30s"], "scrapeEvery"),
])
def test_prometheus_operator_values_that_cannot_work_are_refused(values: list[str],
                                                                 says: str) -> None:
    said = refusal(*values)
    assert says in said, said


def test_promql_templates_can_be_turned_off() -> None:
    on = operator_args(helm("template", "t", str(CHART)).stdout)
    assert "--no-promql-templates" not in on
    off = operator_args(helm("template", "t", str(CHART), "--set",
                             "prometheus.templates=false").stdout)
    assert "--no-promql-templates" in off
    assert "/prometheus/templates" in refusal("--set-string", "prometheus.templates=no")


@pytest.mark.parametrize("value", ["prometheus:9090", "ftp://prometheus:9090",
                                   'http://x" --kubeconfig=/etc/evil',
                                   # In the Deployment's args: prometheus.credentialsSecret.
                                   "http://user:s3cret@prometheus:9090",
                                   "http://user:s3c/ret@prometheus:9090",
                                   "http:///prometheus", "http://:9090",  # no host
                                   "http://prometheus:99999", "http://[::1",
                                   # The operator refuses them too (the API paths follow).
                                   "http://prometheus:9090?x=1",
                                   "http://prometheus:9090/#graph"])
def test_a_bad_prometheus_url_is_refused_naming_the_value(value: str) -> None:
    assert "/prometheus/url" in refusal("--set-string", f"prometheus.url={value}")


def test_the_chart_installs_and_grants_what_the_autoscaler_acts_with(
        cluster: ClusterInfo, kubectl: Kubectl, namespace: str) -> None:
    release = "infertune-e2e"
    kubeconfig = str(cluster.kubeconfig)
    helm("install", release, str(CHART), "--kubeconfig", kubeconfig, "--namespace", namespace,
         "--set", f"prometheus.url={PROMETHEUS}", "--set", "image.pullPolicy=Never")
    try:
        deployment = json.loads(kubectl("get", "deployment", "infertune-operator", "-n",
                                        namespace, "-o", "json").stdout)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert f"--prometheus-url={PROMETHEUS}" in container["args"]
        account = f"system:serviceaccount:{namespace}:infertune-operator"
        # What one autoscaling evaluation does, in any namespace: read the Deployment, write
        # replicas through the scale subresource, check for an HPA, report in status, post an
        # Event.
        needed = [
            ("get", "deployments.apps", ""), ("patch", "deployments.apps", "scale"),
            ("watch", "horizontalpodautoscalers.autoscaling", ""),
            ("patch", "inferencetunings.infertune.io", "status"),
            ("create", "events", ""),
        ]
        for verb, resource, subresource in needed:
            extra = [f"--subresource={subresource}"] if subresource else []
            answer = kubectl("auth", "can-i", verb, resource, *extra, "--as", account,
                             "--all-namespaces", check=False)
            assert answer.stdout.strip() == "yes", (verb, resource, subresource, answer.stderr)
        # Replicas are never written on the Deployment itself (DESIGN.md #5).
        answer = kubectl("auth", "can-i", "update", "deployments.apps", "--as", account,
                         "--all-namespaces", check=False)
        assert answer.stdout.strip() == "no"
        # Only what the code writes: its own ConfigMap in its own namespace (not, say,
        # kube-system/aws-auth), its own webhook configuration, and its own Lease (not the
        # control plane's).
        lease = f"leases.coordination.k8s.io/{DEFAULT_LEASE_NAME}"
        refused = [("patch", "configmaps/aws-auth", "-n", "kube-system"),
                   ("patch", "configmaps/infertune-mig-parted-config", "-n", "kube-system"),
                   ("delete", "mutatingwebhookconfigurations/istio-sidecar-injector"),
                   ("update", "leases.coordination.k8s.io", "-n", "kube-system"),
                   ("update", "leases.coordination.k8s.io/kube-scheduler", "-n", namespace),
                   ("update", lease, "-n", "kube-system"),
                   ("get", "clusterroles.rbac.authorization.k8s.io/cluster-admin")]
        allowed = [("patch", "configmaps/infertune-mig-parted-config", "-n", namespace),
                   ("create", "configmaps", "-n", namespace),
                   ("delete", "mutatingwebhookconfigurations/infertune-pod-tuning"),
                   ("patch", "nodes"),
                   ("get", lease, "-n", namespace), ("update", lease, "-n", namespace),
                   ("create", "leases.coordination.k8s.io", "-n", namespace),
                   ("get", "clusterroles.rbac.authorization.k8s.io/infertune-operator")]
        for expected, checks in (("no", refused), ("yes", allowed)):
            for check in checks:
                answer = kubectl("auth", "can-i", *check, "--as", account, check=False)
                assert answer.stdout.strip() == expected, (check, answer.stderr)
    finally:
        helm("uninstall", release, "--kubeconfig", kubeconfig, "--namespace", namespace)
    gone = kubectl("get", "clusterrole", "infertune-operator", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_mig_can_be_turned_off_with_the_permissions_only_it_needs() -> None:
    """Only MIG patches nodes and evicts (and watches) the pods of every namespace: a
    platform without MIG GPUs had to grant the operator all of that. mig.enabled=false runs
    it with --no-mig and leaves those rules out; with watchNamespaces, pods are watched and
    evicted only there. Values reused from a chart before mig.enabled keep MIG on."""
    team = ("--set", "watchNamespaces={team-a}")
    on, off = granted(*team), granted(*team, "--set", "mig.enabled=false")
    for grants in (on, off):
        # Re-tuning in the watched namespace, whichever.
        assert grants.allows("create", "", "pods/eviction", "team-a")
        assert grants.allows("watch", "", "pods", "team-a")
        assert grants.allows("patch", "", "pods", "team-a")  # the memory.high intent
        assert grants.allows("watch", "", "nodes")  # the indexes-loaded event
    assert on.allows("patch", "", "nodes") and not off.allows("patch", "", "nodes")
    # The mig-parted ConfigMap in the operator's namespace, MIG's alone (with create, which
    # cannot be limited by name).
    for verb, name in (("create", None), ("patch", "infertune-mig-parted-config")):
        assert on.allows(verb, "", "configmaps", "infertune-system", name)
        assert not off.allows(verb, "", "configmaps", "infertune-system", name)
    assert off.allows("update", "coordination.k8s.io", "leases", "infertune-system",
                      "infertune-operator")
    # Every namespace's GPU pods on a node are listed (whether it is busy); evicted there
    # only with mig.drainOtherNamespaces (a tuning drains its own namespace's otherwise).
    assert on.allows("list", "", "pods", "kube-system")
    assert not off.allows("list", "", "pods", "kube-system")
    drains = granted(*team, "--set", "mig.drainOtherNamespaces=true")
    for verb, resource in (("create", "pods/eviction"), ("watch", "pods")):
        assert not on.allows(verb, "", resource, "kube-system"), (verb, resource)
        assert not off.allows(verb, "", resource, "kube-system"), (verb, resource)
    assert drains.allows("create", "", "pods/eviction", "kube-system")
    # With MIG off it would do nothing: refused, naming it (it was dropped without a word).
    refused = helm("template", "t", str(CHART), *team, "--set", "mig.drainOtherNamespaces=true",
                   "--set", "mig.enabled=false", check=False)
    assert refused.returncode != 0 and "mig.drainOtherNamespaces has no effect with " \
        "mig.enabled=false" in refused.stderr, refused.stderr
    assert not off.allows("get", "infertune.io", "inferencetunings", "kube-system")
    assert "--no-mig" in operator_args(helm("template", "t", str(CHART), "--set",
                                            "mig.enabled=false").stdout)
    default = helm("template", "t", str(CHART)).stdout
    assert "--no-mig" not in operator_args(default)
    # A values file from before mig.enabled (helm upgrade --reuse-values): MIG stays on.
    reused = helm("template", "t", str(CHART), "--set", "mig=null").stdout
    assert "--no-mig" not in operator_args(reused)
    assert "resources: [\"nodes\"]\n  verbs: [\"patch\"]" in reused
    # The operator's own parser reads the flag the chart passes.
    assert build_parser().parse_args(operator_args(helm(
        "template", "t", str(CHART), "--set", "mig.enabled=false").stdout)).no_mig


def test_watch_namespaces_grant_the_writes_there_and_nowhere_else(
        cluster: ClusterInfo, kubectl: Kubectl, namespace: str) -> None:
    """The Roles the chart renders for listed namespaces, as the real API server authorizes
    them: the writes on tunings and Deployments there, not in any other namespace, and what
    MIG needs across the cluster."""
    release, team = "infertune-e2e-scoped", f"{namespace}-team"
    kubeconfig = str(cluster.kubeconfig)
    kubectl("create", "namespace", team)
    try:
        helm("install", release, str(CHART), "--kubeconfig", kubeconfig, "--namespace",
             namespace, "--set", f"watchNamespaces={{{team}}}", "--set",
             "image.pullPolicy=Never")
        try:
            account = f"system:serviceaccount:{namespace}:infertune-operator"
            writes = [("patch", "deployments.apps", "--subresource=scale"),
                      ("patch", "deployments.apps"),
                      ("patch", "inferencetunings.infertune.io", "--subresource=status"),
                      ("patch", "inferencetunings.infertune.io")]
            for check in writes:
                for where, expected in ((team, "yes"), ("default", "no"),
                                        ("kube-system", "no")):
                    answer = kubectl("auth", "can-i", *check, "-n", where, "--as", account,
                                     check=False)
                    assert answer.stdout.strip() == expected, (check, where, answer.stderr)
            # MIG lists the GPU pods of every namespace on a node, drains the tunings'
            # namespaces' (others' only with mig.drainOtherNamespaces), and labels the nodes.
            for check, expected in (
                    (("create", "pods", "--subresource=eviction", "-n", team), "yes"),
                    (("create", "pods", "--subresource=eviction", "-n", "default"), "no"),
                    (("list", "pods", "--all-namespaces"), "yes"), (("patch", "nodes"), "yes"),
                    (("list", "inferencetunings.infertune.io", "-n", team), "yes")):
                answer = kubectl("auth", "can-i", *check, "--as", account, check=False)
                assert answer.stdout.strip() == expected, (check, answer.stderr)
        finally:
            helm("uninstall", release, "--kubeconfig", kubeconfig, "--namespace", namespace)
    finally:
        kubectl("delete", "namespace", team, "--wait=false", check=False)


def test_helm_uninstall_takes_the_webhook_configuration_with_it(
        api_client: client.ApiClient, cluster: ClusterInfo, namespace: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """The operator removes its registration when it stops, but `helm uninstall` deletes its
    permissions at the same time as its pod, so that removal could be refused and leave a
    configuration behind that every pod creation in the cluster then calls in vain. Owned by
    the chart's ClusterRole (--webhook-owner, which the chart sets), it goes with it: the
    garbage collector of the real kube-controller-manager deletes it."""
    release, kubeconfig = "infertune-e2e-owner", str(cluster.kubeconfig)
    admission = client.AdmissionregistrationV1Api(api_client)
    kopf_config = {"url": "https://127.0.0.1:9443", "caBundle": "Q0E="}
    args = build_parser().parse_args(operator_args(helm("template", "t", str(CHART)).stdout))
    assert args.webhook_owner == "infertune-operator"
    owned = WebhookRegistration(excluded_namespaces=("kube-system",),
                                name="infertune-e2e-owned", owned_by=args.webhook_owner)
    orphan = WebhookRegistration(excluded_namespaces=("kube-system",),
                                 name="infertune-e2e-orphan", owned_by="no-such-role")
    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    helm("install", release, str(CHART), "--kubeconfig", kubeconfig, "--namespace", namespace,
         "--set", "image.pullPolicy=Never")
    try:
        role = client.RbacAuthorizationV1Api(api_client).read_cluster_role(args.webhook_owner)
        owned.apply(kopf_config)
        (reference,) = admission.read_mutating_webhook_configuration(
            owned.name).metadata.owner_references
        assert (reference.kind, reference.name, reference.uid) == (
            "ClusterRole", args.webhook_owner, role.metadata.uid)
        # Without its ClusterRole it is registered all the same, and the log says why it
        # will outlive an uninstall.
        orphan.apply(kopf_config)
        assert admission.read_mutating_webhook_configuration(
            orphan.name).metadata.owner_references is None
        assert "no-such-role: it does not exist" in caplog.text
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
        helm("uninstall", release, "--kubeconfig", kubeconfig, "--namespace", namespace)
        if exists(lambda: admission.read_mutating_webhook_configuration(orphan.name)):
            admission.delete_mutating_webhook_configuration(orphan.name)
    wait_for(lambda: not exists(lambda: admission.read_mutating_webhook_configuration(
        owned.name)), "the garbage collector deleting the owned configuration", timeout_s=60)


ACCESS = ["--set", "prometheus.url=https://thanos-querier.monitoring:9091",
          "--set", "prometheus.caConfigMap.name=service-ca",
          "--set", "prometheus.clientCertSecret=prometheus-client",
          "--set", "prometheus.credentialsSecret.name=prometheus-token",
          "--set", "prometheus.credentialsSecret.key=token",
          "--set-string", "prometheus.headers.X-Scope-OrgID=team-a"]


def rendered_deployment(*values: str) -> dict[str, Any]:
    for document in yaml.safe_load_all(helm("template", "t", str(CHART), *values).stdout):
        if document and document.get("kind") == "Deployment":
            return dict(document)
    raise AssertionError("the chart renders no Deployment")


def test_prometheus_access_values_become_options_and_mounted_files(
        api_client: client.ApiClient, namespace: str) -> None:
    deployment = rendered_deployment(*ACCESS)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][-6:] == [
        "--prometheus-ca-file=/etc/infertune/prometheus-ca/ca.crt",
        "--prometheus-cert-file=/etc/infertune/prometheus-client/tls.crt",
        "--prometheus-key-file=/etc/infertune/prometheus-client/tls.key",
        "--prometheus-credentials-file=/etc/infertune/prometheus-credentials/credentials",
        "--prometheus-auth-type=Bearer", "--prometheus-header=X-Scope-OrgID: team-a"]
    # The operator's own parser takes the arguments as rendered.
    args = build_parser().parse_args(container["args"])
    assert args.prometheus_headers == ["X-Scope-OrgID: team-a"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["prometheus-ca"]["configMap"] == {
        "name": "service-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert volumes["prometheus-credentials"]["secret"] == {
        "secretName": "prometheus-token", "items": [{"key": "token", "path": "credentials"}]}
    assert volumes["prometheus-client"]["secret"]["secretName"] == "prometheus-client"
    # No subPath: a mounted Secret follows its updates, and the operator reads the file again.
    assert not any("subPath" in m for m in container["volumeMounts"])
    deployment["metadata"]["namespace"] = namespace
    client.AppsV1Api(api_client).create_namespaced_deployment(namespace, deployment,
                                                              dry_run="All")


def test_without_access_values_nothing_is_mounted_or_passed() -> None:
    deployment = rendered_deployment("--set", f"prometheus.url={PROMETHEUS}")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert [a for a in container["args"] if a.startswith("--prometheus")] == [
        f"--prometheus-url={PROMETHEUS}"]
    assert [v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]] == ["tmp"]


@pytest.mark.parametrize(("values", "says"), [
    (["--set", "prometheus.caConfigMap.name=ca"], "need prometheus.url"),
    (["--set", f"prometheus.url={PROMETHEUS}", "--set", "prometheus.credentialsFile=/t",
      "--set", "prometheus.credentialsSecret.name=s"], "set one"),
    (["--set", f"prometheus.url={PROMETHEUS}", "--set-string",
      "prometheus.headers.X-Scope-OrgID=a\nX-Evil: 1"], "/prometheus/headers/X-Scope-OrgID"),
    (["--set", f"prometheus.url={PROMETHEUS}", "--set-string", "prometheus.headers.X A=a"],
     'prometheus.headers: "X A" is not an HTTP header name'),
    (["--set", f"prometheus.url={PROMETHEUS}", "--set-string",
      'prometheus.credentialsFile=/t" --kubeconfig=/etc/evil'], "/prometheus/credentialsFile"),
    # What `infertune run` refuses at start, refused at render instead of a crash loop:
    (["--set", f"prometheus.url={PROMETHEUS}", "--set", "prometheus.caConfigMap.name=ca"],
     "are for an https:// prometheus.url"),
    (["--set", f"prometheus.url={PROMETHEUS}", "--set", "prometheus.clientCertSecret=c"],
     "are for an https:// prometheus.url"),
    (["--set", f"prometheus.url={PROMETHEUS}", "--set-string", "prometheus.headers.X-A=1",
      "--set-string", "prometheus.headers.x-a=2"], "is given twice"),
    # Credentials in a header would be written into the Deployment's arguments.
    (["--set", f"prometheus.url={PROMETHEUS}", "--set", "prometheus.credentialsFile=/t",
      "--set-string", "prometheus.headers.authorization=Bearer x"],
     "prometheus.headers: authorization carries credentials"),
    (["--set", f"prometheus.url={PROMETHEUS}",
      "--set-string", "prometheus.headers.Authorization=Bearer x"],
     "use prometheus.credentialsSecret"),
    (["--set", f"prometheus.url={PROMETHEUS}",
      "--set-string", "prometheus.headers.Proxy-Authorization=Basic eA=="],
     "prometheus.headers: Proxy-Authorization carries credentials"),
    # Not Latin-1: the operator refuses it at start (an HTTP header cannot carry it).
    (["--set", f"prometheus.url={PROMETHEUS}", "--set-string", "prometheus.headers.X-Team=t→a"],
     "/prometheus/headers/X-Team"),
])
def test_prometheus_access_values_that_cannot_work_are_refused(
        values: list[str], says: str) -> None:
    assert says in refusal(*values)


@pytest.mark.parametrize(("values", "says"), [
    # A second replica: one that stops removes the webhook configuration until the other
    # registers it again, and two self-signed certificates sit behind one webhook Service.
    (["--set", "replicas=2"], "/replicas"),
    # Longer than the operator takes (a day): it exited at start, in a crash loop.
    (["--set", "retuneInterval=172800"], "/retuneInterval"),
    (["--set", "webhook.port=8080"], "/webhook/port"),  # the health endpoint's port
    # Non-root without capabilities: below 1024 only where the runtime lowers
    # net.ipv4.ip_unprivileged_port_start, and the operator crash-looped elsewhere.
    (["--set", "webhook.port=443"], "/webhook/port"),
    (["--set", "webhook.port=1023"], "/webhook/port"),
    (["--set-string", "image.tag=1.0\n            - --kubeconfig=/etc/evil"], "/image/tag"),
    (["--set", "image.repository=Registry/Infertune"], "/image/repository"),
    # A tag in the repository rendered ghcr.io/acme/infertune:1.2:0.1.0.
    (["--set", "image.repository=ghcr.io/acme/infertune:1.2"], "/image/repository"),
    (["--set", "image.repository=localhost:5000/infertune:1.2"], "/image/repository"),
    (["--set", "image.repository=registry:5000"], "/image/repository"),
    # An option and its value are one item, so that each item is an option.
    (["--set-string", "extraArgs={--mig-config-delay,60}"], "/extraArgs/1"),
    (["--set", "extraArgs={-n=team-a}"], "/extraArgs/0"),
    (["--set-string", "extraArgs[0]=--verbose\n            - --kubeconfig=/etc/evil"],
     "/extraArgs/0"),
    # An option the chart sets from a value: argparse keeps the last one, and the container's
    # port, its probes or its Roles no longer match (with -n beside -A it exits).
    (["--set", "extraArgs={--webhook-port=9444}"],
     "--webhook-port, which the chart sets from webhook.port"),
    (["--set", "extraArgs={--webhook-p=9444}"],  # argparse takes an abbreviation
     "--webhook-port, which the chart sets from webhook.port"),
    (["--set", "extraArgs={--namespace=team-a}"], "sets from watchNamespaces"),
    (["--set-string", "extraArgs[0]=--prometheus-header=Authorization: Bearer x"],
     "sets from prometheus.headers"),
    (["--set", "extraArgs={--operator-namespace=kube-system}"], "leave it out"),
    # The chart's Role grants only its own Lease: another name crash-looped the operator.
    (["--set", "extraArgs={--leader-elect-lease=mine}"], "leave it out"),
    (["--set", "extraArgs={--no-mig}"], "sets from mig.enabled"),
    # Not an option: the operator exited on argparse's error, in a crash loop.
    (["--set", "extraArgs={--no-such-flag}"], "is not an option of infertune run"),
    # A flag with a value, an option without one: argparse's error too.
    (["--set", "extraArgs={--verbose=true}"], "--verbose takes no value"),
    (["--set", "extraArgs={--no-static=1}"], "--no-static-cpu-manager takes no value"),
    (["--set", "extraArgs={--webhook-check-interval}"],
     "--webhook-check-interval takes a value, in the same item"),
    (["--set", "extraArgs={--kubeconfig}"], "--kubeconfig takes a value"),
    # A value argparse refuses: rendered, and the operator stopped at start, in a crash loop.
    (["--set", "extraArgs={--kubeconfig=}"], "--kubeconfig is given no value"),
    (["--set", "extraArgs={--crd-check-interval=1m}"],
     "--crd-check-interval takes a number of seconds, such as 60 (no unit)"),
    (["--set", "extraArgs={--crd-check-interval=0}"],
     "--crd-check-interval takes seconds above 0, at most 86400"),
    (["--set", "extraArgs={--mig-config-delay=90000}"],
     "--mig-config-delay takes seconds from 0, at most 86400"),
    # The operator stops at start on it with --no-mig, which mig.enabled=false renders.
    (["--set", "mig.enabled=false", "--set", "extraArgs={--mig-config-delay=30}"],
     "--mig-config-delay has no effect with mig.enabled=false"),
    (["--set-string", "podAnnotations.example\\.com/x/y=v"],
     'podAnnotations: "example.com/x/y" is not an annotation key'),
    # An abbreviation argparse refuses as ambiguous: it blamed --mig-config-delay's value.
    (["--set", "extraArgs={--mig}"], "--mig is ambiguous: --mig-config-delay, "
     "--mig-drain-other-namespaces begin with it"),
    (["--set", "webhook.certSecret=a b"], "/webhook/certSecret"),
    # A misspelt value was ignored: here the operator fell back to a self-signed certificate.
    (["--set", "webhook.certsecret=cert-manager-tls"], "'certsecret' not allowed"),
    (["--set", "imagePullSecret=regcred"], "'imagePullSecret' not allowed"),
    (["--set", "nodeSelector=gpu"], "/nodeSelector"),
    # Rendered, and the install failed on the API server's words (a release left failed).
    (["--set", "resources.limits.memory=lots"], "/resources/limits/memory"),
    # The API server's quantity pattern lets these through, and the install then failed.
    (["--set", "resources.limits.memory=-512Mi"], "/resources/limits/memory"),
    (["--set", "resources.limits.memory=1.2.3Mi"], "/resources/limits/memory"),
    (["--set", "resources.limits.cpu=-1"], "/resources/limits/cpu"),  # a number, not a text
    (["--set", "resources.requests.cpu=abc"], "/resources/requests/cpu"),
    # Not a namespace name: the operator refused it at start, in a crash loop.
    (["--set", "watchNamespaces={team-}"], "/watchNamespaces/0"),
    (["--set", "watchNamespaces={" + "a" * 64 + "}"], "/watchNamespaces/0"),
])
def test_values_that_would_break_or_subvert_the_operator_are_refused(
        values: list[str], says: str) -> None:
    assert says in refusal(*values)


@pytest.mark.parametrize(("value", "says"), [
    # Helm drops a value set to null before it checks the schema: each rendered broken (an
    # argument without its value, an image without its repository, a volume item without its
    # key) or, for templates, turned the option off.
    ("retuneInterval", "/retuneInterval"), ("webhook.port", "/webhook/port"),
    ("webhook", "/webhook"), ("image.repository", "/image/repository"),
    ("image.pullPolicy", "/image/pullPolicy"), ("image", "/image"), ("replicas", "/replicas"),
    ("ipFamily", "/ipFamily"), ("resources", "/resources"), ("prometheus", "/prometheus"),
    ("image.tag", "/image/tag"), ("metrics", "/metrics"), ("metrics.port", "/metrics/port"),
    ("metrics.enabled", "/metrics/enabled"),
    ("prometheus.templates", "/prometheus/templates"),
    ("prometheus.authType", "/prometheus/authType"),
    ("prometheus.caConfigMap", "/prometheus/caConfigMap"),
    ("prometheus.caConfigMap.key", "/prometheus/caConfigMap/key"),
    ("prometheus.credentialsSecret", "/prometheus/credentialsSecret"),
    ("prometheus.credentialsSecret.key", "/prometheus/credentialsSecret/key"),
])
def test_a_value_set_to_null_is_refused_naming_it(value: str, says: str) -> None:
    said = refusal("--set", f"{value}=null")
    # Named by the schema, not by a template's nil pointer.
    parent, _, name = says.rpartition("/")
    assert f"at '{parent}': missing property '{name}'" in said, said


DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(("values", "image"), [
    ([], "ghcr.io/infertune/infertune:0.1.0"),
    (["--set", f"image.digest={DIGEST}"], f"ghcr.io/infertune/infertune@{DIGEST}"),
    (["--set", f"image.digest={DIGEST}", "--set", "image.tag=v1"],
     f"ghcr.io/infertune/infertune:v1@{DIGEST}"),
])
def test_the_image_by_digest_pins_the_operator_and_the_launcher_it_injects(
        values: list[str], image: str) -> None:
    """A private mirror pinned by digest could not be named: the tag pattern refused it, and
    the launcher init container of every tuned pod runs the same image."""
    deployment = rendered_deployment(*values)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == image
    assert f"--launcher-image={image}" in container["args"]


def test_values_reused_from_the_previous_chart_render_the_same_image() -> None:
    """`helm upgrade --reuse-values` keeps the old release's values, which have neither
    image.digest nor imagePullSecrets: required, the upgrade failed; unset, the image lost
    its tag."""
    old = yaml.safe_load((CHART / "values.yaml").read_text())
    del old["image"]["digest"], old["imagePullSecrets"]
    scratch = Path(tempfile.mkdtemp(prefix="infertune-chart-"))
    try:
        # The chart with the old release's values as its only values, as the upgrade has.
        chart = scratch / "infertune"
        shutil.copytree(CHART, chart)
        (chart / "values.yaml").write_text(yaml.safe_dump(old))
        rendered = helm("template", "t", str(chart)).stdout
    finally:
        shutil.rmtree(scratch)
    deployment = next(d for d in yaml.safe_load_all(rendered)
                      if d and d.get("kind") == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/infertune/infertune:0.1.0"
    assert "imagePullSecrets" not in deployment["spec"]["template"]["spec"]


def test_image_pull_secrets_reach_the_operator_pod() -> None:
    pod = rendered_deployment("--set", "imagePullSecrets[0].name=regcred")["spec"]["template"][
        "spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert "imagePullSecrets" not in rendered_deployment()["spec"]["template"]["spec"]
    refused = helm("template", "t", str(CHART), "--set", "image.digest=sha256:abc",
                   check=False)
    assert refused.returncode != 0 and "/image/digest" in refused.stderr


def test_extra_args_pass_the_options_the_chart_has_no_value_for() -> None:
    """docs/pod-tuning.md has kubelets without the static CPU manager run the operator with
    --no-static-cpu-manager, which the chart had no value for (and its schema refuses unknown
    values)."""
    default = operator_args(helm("template", "t", str(CHART)).stdout)
    args = operator_args(helm("template", "t", str(CHART), "--set",
                              "extraArgs={--no-static-cpu-manager,--mig-config-delay=60}").stdout)
    assert args == [*default, "--no-static-cpu-manager", "--mig-config-delay=60"]
    parsed = build_parser().parse_args(args)
    assert parsed.no_static_cpu_manager and parsed.mig_config_delay == 60
    # The seconds the chart's check takes, argparse takes too.
    edges = ["--mig-config-delay=0", "--crd-check-interval=.5", "--webhook-check-interval=8.64e4"]
    args = operator_args(helm("template", "t", str(CHART), "--set",
                              f"extraArgs={{{','.join(edges)}}}").stdout)
    parsed = build_parser().parse_args(args)
    assert (parsed.mig_config_delay, parsed.crd_check_interval,
            parsed.webhook_check_interval) == (0, 0.5, 86400)


@pytest.mark.parametrize("repository", ["localhost:5000/infertune", "ghcr.io:443/acme/infertune",
                                        "registry.acme.io/team_a/infer-tune"])
def test_an_image_repository_may_name_a_registry_port(repository: str) -> None:
    (container,) = rendered_deployment("--set", f"image.repository={repository}")["spec"][
        "template"]["spec"]["containers"]
    assert container["image"] == f"{repository}:0.1.0"


@pytest.mark.parametrize("name", ["0123", "1234", "null", "on", "true"])
def test_names_that_read_as_yaml_numbers_or_booleans_render_as_names(name: str) -> None:
    """A Kubernetes name may be all digits or a YAML 1.1 word: unquoted, each rendered a
    number (0123 as octal 83), a boolean or null, which the API server refuses."""
    rendered = helm("template", name, str(CHART), "--namespace", name,
                    "--set", "prometheus.url=https://prometheus:9091",
                    "--set-string", f"webhook.certSecret={name}",
                    "--set-string", f"prometheus.caConfigMap.name={name}",
                    "--set-string", f"prometheus.credentialsSecret.name={name}",
                    "--set-string", f"prometheus.clientCertSecret={name}",
                    "--set-string", f"watchNamespaces[0]={name}").stdout
    documents = [d for d in yaml.safe_load_all(rendered) if d]
    for document in documents:
        kubernetes_validate.validate(document, "1.37", strict=True)
        assert document["metadata"]["labels"]["app.kubernetes.io/instance"] == name
        if document["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert document["metadata"]["namespace"] == name, document["kind"]
        for subject in document.get("subjects", ()):
            assert subject["namespace"] == name
    assert {(d["kind"], d["metadata"]["name"]) for d in documents} >= {
        ("Role", "infertune-operator-tunings"), ("RoleBinding", "infertune-operator-tunings")}
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == name
    assert volumes["prometheus-ca"]["configMap"]["name"] == name
    assert volumes["prometheus-credentials"]["secret"]["secretName"] == name
    assert volumes["prometheus-client"]["secret"]["secretName"] == name


def test_the_operator_writes_only_to_an_in_memory_tmp_on_a_read_only_root() -> None:
    """The one file the operator writes is its self-signed webhook certificate, in Python's
    temporary directory (controller/main.py), which is /tmp where neither the image nor the
    Deployment sets TMPDIR, TEMP or TMP."""
    pod = rendered_deployment()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert not mount.get("readOnly")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mount["name"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Mi"}
    temporary = {"TMPDIR", "TEMP", "TMP"}
    assert not temporary & {e["name"] for e in container.get("env", ())}
    dockerfile = (Path(__file__).resolve().parents[1] / "Dockerfile").read_text()
    assert not re.search(r"\b(TMPDIR|TEMP|TMP)\b", dockerfile)
    # OpenShift's restricted SCC assigns the UID and refuses a fixed one; the image's numeric
    # USER satisfies runAsNonRoot.
    assert "runAsUser" not in pod["securityContext"]
    assert "runAsUser" not in container["securityContext"]


def test_the_lowest_port_a_non_root_container_binds_is_a_webhook_port() -> None:
    args = operator_args(helm("template", "t", str(CHART), "--set", "webhook.port=1024").stdout)
    assert "--webhook-port=1024" in args


def test_only_one_operator_of_an_upgrade_runs_the_loops_that_write() -> None:
    """The old and the new pod of a rolling upgrade run side by side for a few seconds; the
    Lease (kube/lease.py) lets one of them autoscale, re-tune and drain at a time."""
    args = build_parser().parse_args(operator_args(helm("template", "t", str(CHART)).stdout))
    assert args.leader_elect and args.leader_elect_lease is None  # DEFAULT_LEASE_NAME


def test_an_upgrade_keeps_an_operator_serving_the_webhook() -> None:
    """The new pod registers the webhook and is ready before the old one stops, which then
    leaves the registration to it (kube/webhooks.py): pods created meanwhile are tuned."""
    deployment = rendered_deployment()
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    # The new pod may wait for kopf's first listing (at most LOAD_WAIT_S) before it is Ready.
    from infertune.kube.webhooks import LOAD_WAIT_S
    assert deployment["spec"]["progressDeadlineSeconds"] > LOAD_WAIT_S
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # Ready once registered, not once the port listens (kopf listens first).
    assert container["readinessProbe"]["exec"] == {
        "command": ["test", "-f", "/tmp/infertune-ready"]}
    assert "--ready-file=/tmp/infertune-ready" in container["args"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    # The old pod serves a few seconds after it is marked for deletion, while the Service's
    # endpoints catch up (kopf closes the port at SIGTERM), within the grace period.
    assert container["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    grace = deployment["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    assert grace > 5 + 10  # the sleep, and the operator's own stop (loops, Lease)
    # /healthz answers from the event loop, which kopf's first listing of a large cluster
    # holds for seconds: at the default 1 s the operator was restarted into it again.
    assert container["livenessProbe"]["timeoutSeconds"] >= 5
    # And a minute of a held loop before a restart, which starts the listing again.
    liveness = container["livenessProbe"]
    assert liveness.get("periodSeconds", 10) * liveness["failureThreshold"] >= 60


def test_the_chart_renders_as_a_subchart() -> None:
    """Helm passes `global` to every subchart: refused by the schema, the chart could not be
    a dependency of an umbrella chart at all."""
    helm("template", "t", str(CHART), "--set", "global.imageRegistry=registry.example")


def test_header_values_in_latin_1_are_taken() -> None:
    rendered = helm("template", "t", str(CHART), "--set", f"prometheus.url={PROMETHEUS}",
                    "--set-string", "prometheus.headers.X-Team=café\tb").stdout
    assert "--prometheus-header=X-Team: café\tb" in operator_args(rendered)


def test_watch_namespaces_scope_the_operator_and_default_to_all() -> None:
    assert operator_args(helm("template", "t", str(CHART)).stdout)[:2] == [
        "run", "--all-namespaces"]
    scoped = operator_args(helm("template", "t", str(CHART), "--set",
                                "watchNamespaces={team-a,team-b}").stdout)
    assert scoped[:3] == ["run", "--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in scoped
    args = build_parser().parse_args(scoped)
    assert args.namespaces == ["team-a", "team-b"]


NAMESPACED_WRITES = [("patch", "apps", "deployments"), ("patch", "apps", "deployments/scale"),
                     ("patch", "infertune.io", "inferencetunings"),
                     ("patch", "infertune.io", "inferencetunings/status")]
"""What the operator writes only in the namespace of the tuning that asks for it (re-tuning,
autoscaling, the controller)."""


def test_listed_watch_namespaces_get_the_namespaced_writes_and_no_other_does() -> None:
    grants = granted("--set", "watchNamespaces={team-a,team-b}")
    for verb, group, resource in NAMESPACED_WRITES:
        assert not grants.allows(verb, group, resource), (verb, resource)
        assert not grants.allows(verb, group, resource, "team-c"), (verb, resource)
        assert grants.allows(verb, group, resource, "team-a"), (verb, resource)
        assert grants.allows(verb, group, resource, "team-b"), (verb, resource)
    # MIG works across namespaces: the GPU pods on a node, whoever runs them, are listed
    # (evicted only in the tunings' namespaces, without mig.drainOtherNamespaces), nodes are
    # labelled and cordoned, and the tuning a node names is read. kopf lists namespaces and
    # watches CRDs, and posts Events about nodes in "default".
    assert not grants.allows("create", "", "pods/eviction", "team-c")
    for verb, group, resource, namespace in [
            ("list", "", "pods", None),
            ("patch", "", "nodes", None), ("get", "infertune.io", "inferencetunings", "team-c"),
            ("watch", "", "namespaces", None),
            ("watch", "apiextensions.k8s.io", "customresourcedefinitions", None),
            ("create", "", "events", "default")]:
        assert grants.allows(verb, group, resource, namespace), (verb, resource, namespace)


def test_listed_watch_namespaces_lose_no_permission_there() -> None:
    everywhere = granted()
    scoped = granted("--set", "watchNamespaces={team-a,infertune-system}")
    for namespace in ("team-a", "infertune-system"):
        for rule in everywhere.cluster:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [None]:
                            assert scoped.allows(verb, group, resource, namespace, name), (
                                verb, group, resource, name, namespace)
    # The operator's own namespace keeps its Role (the MIG ConfigMap, the Lease) beside the
    # one it gets as a watched namespace.
    assert scoped.allows("patch", "", "configmaps", "infertune-system",
                         "infertune-mig-parted-config")
    documents = yaml.safe_load_all(helm("template", "t", str(CHART), "--namespace",
                                        "infertune-system", "--set",
                                        "watchNamespaces={team-a,team-a}").stdout)
    for document in documents:
        if document:
            kubernetes_validate.validate(document, "1.37", strict=True)


@pytest.mark.parametrize("namespaces", ["{team-*}", "{team-a,!team-b}", "{team-a,team-?}",
                                        "{team-[ab]}"])
def test_a_watch_namespace_pattern_keeps_the_namespaced_writes_cluster_wide(
        namespaces: str) -> None:
    """A Role cannot be bound in the namespaces a pattern will match."""
    grants = granted("--set", f"watchNamespaces={namespaces}")
    assert grants == granted()
    for verb, group, resource in NAMESPACED_WRITES:
        assert grants.allows(verb, group, resource), (verb, resource)


@pytest.mark.parametrize(("verb", "group", "resource"), [
    # kopf runs --standalone: it never reads or writes its peering objects.
    ("list", "kopf.dev", "clusterkopfpeerings"), ("patch", "kopf.dev", "kopfpeerings"),
    # Nothing reads budgets: the Eviction API enforces them.
    ("list", "policy", "poddisruptionbudgets"),
    # kopf posts core/v1 Events, and only creates them.
    ("create", "events.k8s.io", "events"), ("patch", "", "events"),
    # Every write is a patch (kopf's and the operator's own) or, for the webhook
    # configuration, an update; replicas are read from the Deployment, not its scale.
    ("update", "infertune.io", "inferencetunings"),
    ("update", "infertune.io", "inferencetunings/status"),
    ("update", "apps", "deployments/scale"), ("get", "apps", "deployments/scale"),
    ("patch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
])
def test_the_operator_is_granted_nothing_it_never_uses(verb: str, group: str,
                                                       resource: str) -> None:
    grants = granted()
    assert not grants.allows(verb, group, resource, name="infertune-pod-tuning")
    assert not grants.allows(verb, group, resource, "infertune-system")


def test_the_operator_is_granted_what_it_calls() -> None:
    grants = granted()
    for verb, group, resource in [
            ("create", "", "events"), ("patch", "apps", "deployments/scale"),
            ("get", "infertune.io", "inferencetunings/status"),
            ("patch", "infertune.io", "inferencetunings/status"),
            ("patch", "infertune.io", "inferencetunings"), ("create", "", "pods/eviction"),
            ("patch", "", "pods")]:
        assert grants.allows(verb, group, resource), (verb, group, resource)
    for verb in ("create", "get", "update", "delete"):
        assert grants.allows(verb, "admissionregistration.k8s.io",
                             "mutatingwebhookconfigurations", name="infertune-pod-tuning")
    own = "infertune-system"
    assert grants.allows("patch", "", "configmaps", own, "infertune-mig-parted-config")
    assert not grants.allows("update", "", "configmaps", own, "infertune-mig-parted-config")


@pytest.mark.parametrize("value", ["team a", "Team-A", 'x" --kubeconfig=/etc/evil', ""])
def test_a_watch_namespace_that_is_no_name_or_pattern_is_refused(value: str) -> None:
    refused = helm("template", "t", str(CHART), "--set-string", f"watchNamespaces[0]={value}",
                   check=False)
    assert refused.returncode != 0
    assert "/watchNamespaces/0" in refused.stderr


def test_the_operator_pod_takes_platform_settings_without_losing_the_charts_own() -> None:
    """A service mesh's namespace needs sidecar.istio.io/inject: "false" on the operator's
    pod (the API server calls the webhook without the mesh's mTLS), a platform its priority
    class and affinity: the schema refused them all. A label of the selector given again
    keeps the chart's value (else the Deployment would own no pod)."""
    deployment = rendered_deployment(
        "--set-string", "podAnnotations.sidecar\\.istio\\.io/inject=false",
        "--set-string", "podAnnotations.prometheus\\.io/path=/other",
        "--set", "podLabels.team=ml", "--set", "podLabels.app\\.kubernetes\\.io/name=x",
        "--set", "priorityClassName=system-cluster-critical",
        "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                 ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
        "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                 ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        "--set", "metrics.enabled=true")
    template = deployment["spec"]["template"]
    assert template["metadata"]["labels"] == {"app.kubernetes.io/name": "infertune",
                                              "app.kubernetes.io/component": "operator",
                                              "team": "ml"}
    assert template["metadata"]["labels"].items() >= deployment["spec"]["selector"][
        "matchLabels"].items()
    annotations = template["metadata"]["annotations"]
    assert annotations["sidecar.istio.io/inject"] == "false"
    assert annotations["prometheus.io/path"] == "/metrics"  # the chart's own
    assert template["spec"]["priorityClassName"] == "system-cluster-critical"
    assert template["spec"]["affinity"]["nodeAffinity"]
    plain = rendered_deployment()["spec"]["template"]
    assert "priorityClassName" not in plain["spec"] and "affinity" not in plain["spec"]
    # Keys are checked by the templates, naming them: the schema's propertyNames failure was
    # reported at another value each time (/nodeSelector, /webhook, /mig), and an annotation
    # key was not checked at all (the API server refused the Deployment at apply).
    # An annotation key's prefix is checked in lower case, as the API server checks it.
    assert rendered_deployment("--set-string", "podAnnotations.Example\\.COM/x=y")["spec"][
        "template"]["metadata"]["annotations"]["Example.COM/x"] == "y"
    for values, says in ((["--set", "podLabels.team=not a value"], "/podLabels/team"),
                         (["--set", "priorityClassName=Not_A_Name"], "/priorityClassName"),
                         (["--set", "podAnnotations.a=1"], "/podAnnotations/a"),
                         (["--set", "podLabels.bad_=x"], 'podLabels: "bad_" is not a label key'),
                         (["--set", "podLabels.Example\\.com/x=y"],
                          'podLabels: "Example.com/x" is not a label key'),
                         (["--set-string", "podAnnotations.bad key=x"],
                          'podAnnotations: "bad key" is not an annotation key')):
        refused = helm("template", "t", str(CHART), *values, check=False)
        assert refused.returncode != 0 and says in refused.stderr, (values, refused.stderr)
