"""What the operator process sets up once: one shared Kubernetes connection pool, and periodic
passes without kopf timers."""

from __future__ import annotations

import socket
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


@pytest.fixture
def no_default_client() -> Iterator[None]:
    client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
    yield
    client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]


def test_every_api_object_shares_one_client_after_configure(
        tmp_path: Path, no_default_client: None) -> None:
    """A new ApiClient per API object means a new connection pool, so a TLS handshake per
    call: configure() must leave one default that all of them use."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    configure(str(kubeconfig))
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


@pytest.fixture
def silent_api_server(tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig for a server that accepts connections and reads requests but never
    answers: a connection whose other end is gone without a word looks like this."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {
            "server": f"http://127.0.0.1:{listener.getsockname()[1]}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    yield kubeconfig
    stop.set()
    thread.join()
    for connection in held:  # ends a call still waiting (the test has failed then)
        connection.close()
    listener.close()


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
