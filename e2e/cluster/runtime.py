"""Start and stop a real control plane: etcd, kube-apiserver, controller-manager, scheduler, kwok.

Everything listens on free loopback ports and lives in one temporary work dir (certificates,
etcd data, kubeconfigs), removed on stop. Ready means: /readyz answers ``ok``, the
controller-manager and scheduler hold their leader leases, and every simulated node is Ready.
"""

from __future__ import annotations

import json
import shutil
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from e2e.cluster.certs import CertificateAuthority, service_account_signing_key
from e2e.cluster.kubeconfig import write_client_cert_kubeconfig, write_token_kubeconfig
from e2e.cluster.processes import (
    ClusterError,
    Component,
    free_port,
    start_component,
    stop_all,
    wait_until,
)
from e2e.cluster.stages import write_kwok_configuration
from e2e.cluster.topology import DEFAULT_NODES_FILE, load_topology, node_manifest

__all__ = ["Cluster", "ClusterError", "write_token_kubeconfig"]

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
READY_TIMEOUT_S = 90.0
# The controllers infertune relies on (deployments, replicasets, GC, PDBs, namespaces,
# service accounts and their tokens, kube-root-ca.crt), plus the ones charts and quotas need.
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "daemonset-controller",
    "job-controller",
    "garbage-collector-controller",
    "disruption-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "resourcequota-controller",
    "clusterrole-aggregation-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "pod-garbage-collector-controller",
    # Admission taints every new Node node.kubernetes.io/not-ready:NoSchedule; this controller
    # lifts the taint once kwok reports Ready (and would mark nodes whose lease lapses).
    "node-lifecycle-controller",
)
ADMISSION_PLUGINS = "MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ResourceQuota"


@dataclass
class Cluster:
    server: str
    kubeconfig: Path
    ca_file: Path
    log_dir: Path
    bin_dir: Path
    work_dir: Path
    node_names: list[str]
    seconds_to_ready: float
    _components: list[Component] = field(repr=False)

    @classmethod
    def start(
        cls,
        bin_dir: Path,
        nodes_file: Path = DEFAULT_NODES_FILE,
        log_dir: Path | None = None,
        pod_ready_delay: float = 1.0,
        kubeconfig: Path | None = None,
        timeout_s: float = READY_TIMEOUT_S,
    ) -> Cluster:
        """Start a cluster and return once it is ready; on failure nothing is left running.

        Logs go to `log_dir` (kept), or into the work dir (removed on stop) when it is None.
        """
        started = time.monotonic()
        nodes = [node_manifest(spec) for spec in load_topology(nodes_file)]
        work_dir = Path(tempfile.mkdtemp(prefix="infertune-e2e-"))
        log_dir = log_dir if log_dir is not None else work_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        components: list[Component] = []
        try:
            plan = _prepare(work_dir, kubeconfig or work_dir / "admin.kubeconfig")
            write_kwok_configuration(plan.kwok_config, pod_ready_delay)
            for name, argv in _commands(bin_dir, plan):
                components.append(start_component(name, argv, log_dir))
            api = _AdminApi(plan)
            wait_until(api.ready, timeout_s, "kube-apiserver /readyz", components)
            for node in nodes:
                api.request("POST", "/api/v1/nodes", node)
            names = [n["metadata"]["name"] for n in nodes]
            wait_until(
                lambda: api.leases_held(("kube-controller-manager", "kube-scheduler")),
                timeout_s,
                "controller-manager and scheduler leader leases",
                components,
            )
            wait_until(
                lambda: api.nodes_ready(names), timeout_s, f"nodes {names} Ready", components
            )
        except BaseException:
            stop_all(components)
            shutil.rmtree(work_dir, ignore_errors=True)
            raise
        return cls(
            server=plan.server,
            kubeconfig=plan.admin_kubeconfig,
            ca_file=plan.ca_file,
            log_dir=log_dir,
            bin_dir=bin_dir,
            work_dir=work_dir,
            node_names=names,
            seconds_to_ready=round(time.monotonic() - started, 1),
            _components=components,
        )

    def stop(self) -> None:
        stop_all(self._components)
        self._components = []
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def check_running(self) -> None:
        """Raise ClusterError if any component has exited."""
        for component in self._components:
            component.check_running()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


@dataclass(frozen=True)
class _Plan:
    """Files and ports of one cluster, decided before anything starts."""

    pki: Path
    etcd_data: Path
    etcd_client_port: int
    etcd_peer_port: int
    apiserver_port: int
    admin_kubeconfig: Path
    kwok_config: Path

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def ca_file(self) -> Path:
        return self.pki / "ca.crt"

    def kubeconfig_of(self, component: str) -> Path:
        return self.pki.parent / f"{component}.kubeconfig"


# (file stem, user, groups) of each client; names are the ones bootstrap RBAC grants to.
_CLIENTS = (
    ("admin", "infertune-e2e-admin", ("system:masters",)),
    ("kube-controller-manager", "system:kube-controller-manager", ()),
    ("kube-scheduler", "system:kube-scheduler", ()),
    # kwok plays kubelet for every node and edits any pod's status: trusted test machinery.
    ("kwok", "kwok-controller", ("system:masters",)),
)


def _prepare(work_dir: Path, admin_kubeconfig: Path) -> _Plan:
    pki = work_dir / "pki"
    pki.mkdir()
    plan = _Plan(
        pki=pki,
        etcd_data=work_dir / "etcd",
        etcd_client_port=free_port(),
        etcd_peer_port=free_port(),
        apiserver_port=free_port(),
        admin_kubeconfig=admin_kubeconfig,
        kwok_config=work_dir / "kwok.yaml",
    )
    ca = CertificateAuthority.create("infertune-e2e-ca")
    plan.ca_file.write_bytes(ca.cert_pem)
    ca.issue_serving(
        "kube-apiserver",
        dns_names=[
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        ips=["127.0.0.1", SERVICE_IP],
    ).write(pki / "apiserver.crt", pki / "apiserver.key")
    private, public = service_account_signing_key()
    (pki / "sa.key").write_bytes(private)
    (pki / "sa.key").chmod(0o600)
    (pki / "sa.pub").write_bytes(public)
    for stem, user, groups in _CLIENTS:
        client = ca.issue_client(user, groups)
        client.write(pki / f"{stem}.crt", pki / f"{stem}.key")
        path = admin_kubeconfig if stem == "admin" else plan.kubeconfig_of(stem)
        write_client_cert_kubeconfig(
            path, plan.server, ca.cert_pem, user, client.cert_pem, client.key_pem
        )
    return plan


def _commands(bin_dir: Path, plan: _Plan) -> list[tuple[str, list[str]]]:
    etcd_url = f"http://127.0.0.1:{plan.etcd_client_port}"
    peer_url = f"http://127.0.0.1:{plan.etcd_peer_port}"
    pki = plan.pki
    return [
        (
            "etcd",
            [
                str(bin_dir / "etcd"),
                "--name=e2e",
                f"--data-dir={plan.etcd_data}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=e2e={peer_url}",
                "--unsafe-no-fsync=true",  # throw-away data: durability buys nothing here
                "--log-level=warn",
            ],
        ),
        (
            "kube-apiserver",
            [
                str(bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # The `kubernetes` Service's endpoints may not be loopback; nothing in-cluster
                # dials it here (pods are simulated), so do what envtest does and skip them.
                "--endpoint-reconciler-type=none",
                f"--secure-port={plan.apiserver_port}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={plan.ca_file}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--authorization-mode=Node,RBAC",
                f"--enable-admission-plugins={ADMISSION_PLUGINS}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ],
        ),
        (
            "kube-controller-manager",
            [
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={plan.kubeconfig_of('kube-controller-manager')}",
                f"--controllers={','.join(CONTROLLERS)}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={plan.ca_file}",
                "--secure-port=0",
                "--kube-api-qps=100",
                "--kube-api-burst=200",
                "--v=1",
            ],
        ),
        (
            "kube-scheduler",
            [
                str(bin_dir / "kube-scheduler"),
                f"--kubeconfig={plan.kubeconfig_of('kube-scheduler')}",
                "--secure-port=0",
                "--v=1",
            ],
        ),
        (
            "kwok",
            [
                str(bin_dir / "kwok"),
                f"--kubeconfig={plan.kubeconfig_of('kwok')}",
                f"--config={plan.kwok_config}",
            ],
        ),
    ]


class _AdminApi:
    """Just enough HTTPS to bring the cluster up; tests use the official clients instead."""

    def __init__(self, plan: _Plan) -> None:
        self._server = plan.server
        self._context = ssl.create_default_context(cafile=str(plan.ca_file))
        self._context.load_cert_chain(plan.pki / "admin.crt", plan.pki / "admin.key")

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self._server + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, context=self._context, timeout=10) as response:
                payload = response.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")
            raise ClusterError(f"{method} {path}: HTTP {error.code}: {detail}") from error
        return json.loads(payload) if payload.startswith(b"{") else payload.decode()

    def ready(self) -> bool:
        try:
            return bool(self.request("GET", "/readyz") == "ok")
        except (OSError, ClusterError):
            return False  # not listening yet, or a post-start hook still running

    def leases_held(self, names: tuple[str, ...]) -> bool:
        leases = self.request("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases")
        holders = {
            item["metadata"]["name"]: item.get("spec", {}).get("holderIdentity")
            for item in leases.get("items", [])
        }
        return all(holders.get(name) for name in names)

    def nodes_ready(self, names: list[str]) -> bool:
        """Every node Ready and free of the taints that keep the scheduler away."""
        ready = set()
        for node in self.request("GET", "/api/v1/nodes").get("items", []):
            conditions = node.get("status", {}).get("conditions", [])
            taints = {t["key"] for t in node.get("spec", {}).get("taints", [])}
            if (
                any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
                and not taints & _NODE_CONDITION_TAINTS
            ):
                ready.add(node["metadata"]["name"])
        return ready >= set(names)


_NODE_CONDITION_TAINTS = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
