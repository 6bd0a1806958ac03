"""What the operator process sets up once: one shared Kubernetes connection pool, and periodic
passes without kopf timers."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import kopf
import pytest
import urllib3
import yaml
from kubernetes import client

from infertune.controller import autoscaling, mig, pods  # noqa: F401 - registers the daemons
from infertune.controller.autoscaling import WORKERS
from infertune.kube import client as kube_client
from infertune.kube.client import POOL_SIZE, configure
from infertune.kube.webhook_tls import write_self_signed


@pytest.fixture
def no_default_client() -> Iterator[None]:
    client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
    yield
    client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]


def test_every_api_object_shares_one_client_after_configure(
        tmp_path: Path, no_default_client: None) -> None:
    """A new ApiClient per API object means a new connection pool, so a TLS handshake per
    call: configure() must leave one default that all of them use."""
    configure(str(_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:6443")))
    first, second = client.AppsV1Api().api_client, client.CoreV1Api().api_client
    assert first is second
    assert first.configuration.host == "https://127.0.0.1:6443"
    assert first.rest_client.pool_manager is client.CustomObjectsApi().api_client.rest_client \
        .pool_manager
    # Room for every autoscaling worker and kopf's own executor threads at once.
    assert first.configuration.connection_pool_maxsize == POOL_SIZE > WORKERS


def test_no_kopf_timer_runs_per_tuning() -> None:
    """The periodic passes (autoscaling, re-tuning, MIG) are loops in kopf daemons: a kopf timer
    builds every handler argument, uses a worker thread and logs a line on every run, which
    at 1000 tunings was a fifth of the operator's CPU and hundreds of lines a second."""
    spawning = kopf.get_default_registry()._spawning.get_all_handlers()
    assert not [str(h) for h in spawning if str(h).startswith("Timer ")]
    assert {"autoscale", "retune_pods", "partition_gpus"} <= {h.id for h in spawning}


def _kubeconfig(path: Path, server: str, **cluster: str) -> Path:
    """A token kubeconfig for `server` (`cluster`: more fields of its cluster entry)."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


@pytest.fixture
def silent_api_server(tmp_path: Path, silent_server: str) -> Path:
    """A kubeconfig for a server that accepts connections and reads requests but never
    answers: a connection whose other end is gone without a word looks like this."""
    return _kubeconfig(tmp_path / "kubeconfig", silent_server)


def _ends_within(call: Callable[[], object], seconds: float) -> BaseException | None:
    """What `call` raised, if it ended within `seconds`; fails the test if it did not."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"the call was still waiting after {seconds:g}s"
    return outcome[0]


def test_an_api_call_nobody_answers_times_out(
        silent_api_server: Path, no_default_client: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The client waits for ever by default: a dropped connection held the worker thread,
    and the tuning's loop with it. Reads are tried 4 times by the client, writes once."""
    monkeypatch.setattr(kube_client, "API_TIMEOUT_S", (0.5, 0.5))
    configure(str(silent_api_server))
    read = _ends_within(lambda: client.CoreV1Api().read_namespace("default"), 15)
    assert isinstance(read, urllib3.exceptions.MaxRetryError)
    assert isinstance(read.reason, urllib3.exceptions.ReadTimeoutError)
    evict = _ends_within(lambda: kube_client.evict_pod("default", "p"), 5)
    assert isinstance(evict, urllib3.exceptions.ReadTimeoutError)


def test_a_call_with_its_own_timeout_keeps_it(
        silent_api_server: Path, no_default_client: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The Lease's calls are shorter than the default (its renew deadline)."""
    monkeypatch.setattr(kube_client, "API_TIMEOUT_S", (1.0, 600.0))
    configure(str(silent_api_server))
    failed = _ends_within(lambda: client.CoreV1Api().create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name="n")), _request_timeout=0.5), 10)
    assert isinstance(failed, urllib3.exceptions.ReadTimeoutError)


@pytest.fixture
def breaking_api_server(tmp_path: Path) -> Iterator[tuple[Path, list[str], dict[str, str]]]:
    """A kubeconfig for an API server over TLS that reads each request whole (as a write that
    lands) and breaks the answer to the first one of each method as `breaks` says: "tls" (a
    record that is no TLS, as a connection cut mid-record), "close" (no answer at all). Later
    ones are answered: a GET with a Namespace, a write with the conflict a second copy of a
    landed write meets. Yields (kubeconfig, "METHOD path" of each request, breaks)."""
    cert, key = write_self_signed(tmp_path / "tls", ["127.0.0.1"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    requests: list[str] = []
    breaks: dict[str, str] = {}
    stop = threading.Event()

    def answer(connection: ssl.SSLSocket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = connection.recv(65536)
            if not chunk:
                return  # the client went away
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        length = next((int(line.split(":")[1]) for line in lines
                       if line.lower().startswith("content-length:")), 0)
        while len(body) < length:
            chunk = connection.recv(65536)
            if not chunk:
                return
            body += chunk
        method, path = lines[0].split(" ")[:2]
        requests.append(f"{method} {path}")
        first = sum(r.startswith(f"{method} ") for r in requests) == 1
        if first and breaks.get(method) == "tls":
            # Past TLS, on the socket itself: the client reads a record it cannot decrypt.
            socket.socket.send(connection, b"\x17\x03\x03\x00\x05hello")
            return
        if first and breaks.get(method) == "close":
            return
        if method == "GET":
            status, reply = "200 OK", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": "default"}}
        else:
            status, reply = "409 Conflict", {"kind": "Status", "apiVersion": "v1",
                                             "status": "Failure", "code": 409}
        sent = json.dumps(reply).encode()
        connection.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(sent)}\r\nConnection: close\r\n\r\n"
                           .encode() + sent)

    def serve() -> None:
        while not stop.is_set():
            try:
                raw = listener.accept()[0]
            except TimeoutError:
                continue
            if breaks.pop("handshake", None):  # closed before TLS: nothing went out
                raw.close()
                continue
            raw.settimeout(5)
            try:
                with context.wrap_socket(raw, server_side=True) as connection:
                    answer(connection)
            except (OSError, ValueError):
                continue  # a client that gave up on the connection

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig",
                             f"https://127.0.0.1:{listener.getsockname()[1]}",
                             **{"certificate-authority": str(cert)})
    yield kubeconfig, requests, breaks
    stop.set()
    thread.join()
    listener.close()


SCALE_PATCH = [{"op": "test", "path": "/spec/replicas", "value": 2},
               {"op": "replace", "path": "/spec/replicas", "value": 3}]
LEASE = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
         "metadata": {"name": "l", "namespace": "ns", "resourceVersion": "7"},
         "spec": {"holderIdentity": "me"}}


@pytest.mark.parametrize(("method", "broken", "call"), [
    ("PATCH", "tls", lambda: client.AppsV1Api().patch_namespaced_deployment_scale(
        "llm", "ns", SCALE_PATCH)),
    ("PUT", "close", lambda: client.CoordinationV1Api().replace_namespaced_lease(
        "l", "ns", LEASE)),
])
def test_a_write_whose_answer_broke_is_not_sent_again(
        breaking_api_server: tuple[Path, list[str], dict[str, str]],
        no_default_client: None, method: str, broken: str,
        call: Callable[[], object]) -> None:
    """urllib3's default retries sent the scale PATCH again after a TLS error on its answer
    (it checks the method only for read errors), and a Lease PUT after a cut answer: the
    first copy had landed, the second failed its test of the replicas (422) or its
    resourceVersion (409), and the operator took its own write for another writer's."""
    kubeconfig, requests, breaks = breaking_api_server
    breaks[method] = broken
    configure(str(kubeconfig))
    failed = _ends_within(call, 15)
    assert isinstance(failed, urllib3.exceptions.HTTPError)  # not the second copy's 409
    assert [r.split(" ")[0] for r in requests] == [method]


def test_a_read_whose_answer_was_cut_is_sent_again(
        breaking_api_server: tuple[Path, list[str], dict[str, str]],
        no_default_client: None) -> None:
    """What the client sends again still includes a read whose connection was dropped (a
    pooled connection the API server had closed)."""
    kubeconfig, requests, breaks = breaking_api_server
    breaks["GET"] = "close"
    configure(str(kubeconfig))
    assert client.CoreV1Api().read_namespace("default").metadata.name == "default"
    assert requests == ["GET /api/v1/namespaces/default"] * 2


def test_a_read_whose_tls_handshake_failed_is_sent_again(
        breaking_api_server: tuple[Path, list[str], dict[str, str]],
        no_default_client: None) -> None:
    """urllib3 classes a TLS error as neither a connect nor a read error: with its "other"
    retries turned off altogether, a read met by an API server or load balancer restarting
    mid-handshake failed at once."""
    kubeconfig, requests, breaks = breaking_api_server
    breaks["handshake"] = "close"
    configure(str(kubeconfig))
    assert client.CoreV1Api().read_namespace("default").metadata.name == "default"
    assert requests == ["GET /api/v1/namespaces/default"]


@pytest.mark.parametrize("call", [
    lambda: client.CoreV1Api().read_namespace("default"),
    lambda: client.AppsV1Api().patch_namespaced_deployment_scale("llm", "ns", SCALE_PATCH),
])
def test_a_request_that_could_not_connect_is_sent_again(
        tmp_path: Path, no_default_client: None, caplog: pytest.LogCaptureFixture,
        call: Callable[[], object]) -> None:
    """Nothing went out, so a write may be sent again too."""
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    configure(str(_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")))
    failed = _ends_within(call, 15)
    assert isinstance(failed, urllib3.exceptions.MaxRetryError)
    assert isinstance(failed.reason, urllib3.exceptions.NewConnectionError)
    assert sum("Retrying" in r.getMessage() for r in caplog.records) == 3


@pytest.mark.parametrize("mig_on", [True, False])
def test_no_mig_registers_nothing_of_mig(mig_on: bool) -> None:
    """--no-mig (the chart's mig.enabled=false, whose ClusterRole leaves out patching nodes
    and the pods of every namespace): the MIG controller is not even imported, so neither
    its daemon nor its index over every namespace's pods runs, and tunings with spec.mig say
    MIG is off. In a fresh process: kopf's registry is the process's."""
    script = (
        "import sys, kopf\n"
        "from infertune.controller.main import register_handlers\n"
        f"module = register_handlers(mig={mig_on})\n"
        "from infertune.tuning.pod_mig import mig_off\n"
        "registry = kopf.get_default_registry()\n"
        "ids = {h.id for h in registry._spawning.get_all_handlers()}\n"
        "ids |= {h.id for h in registry._indexing.get_all_handlers()}\n"
        "print(module is not None, 'partition_gpus' in ids, 'gpu_pods_by_node' in ids,\n"
        "      'infertune.controller.mig' in sys.modules, mig_off(),\n"
        "      'retune_pods' in ids, 'pods_by_deployment' in ids)\n")
    env = {k: v for k, v in os.environ.items() if k != "INFERTUNE_MIG"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True, env=env)
    assert done.stdout.split() == [str(mig_on)] * 4 + [str(not mig_on)] + ["True", "True"], \
        done.stdout + done.stderr
