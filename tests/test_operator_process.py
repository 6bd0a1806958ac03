"""What the operator process sets up once: one shared Kubernetes connection pool, and periodic
passes without kopf timers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kopf
import pytest
import yaml
from kubernetes import client

from infertune.controller import autoscaling, mig, pods  # noqa: F401 - registers the daemons
from infertune.controller.autoscaling import WORKERS
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
