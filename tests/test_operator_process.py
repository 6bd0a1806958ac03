"""What the operator process sets up once: one shared Kubernetes connection pool, and logs
without a line per timer tick."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import kopf
import pytest
import yaml
from kubernetes import client

from infertune.controller import autoscaling, mig, pods  # noqa: F401 - registers the timers
from infertune.controller.autoscaling import WORKERS
from infertune.controller.main import TICKING_TIMERS, QuietTimerTicks
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


def _record(message: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("kopf.objects", level, __file__, 1, message, None, None)


def test_the_ticking_timers_are_the_registered_ones_and_their_successes_are_dropped() -> None:
    registered = {str(h): h.id for h in kopf.get_default_registry()._spawning.get_all_handlers()
                  if str(h).startswith("Timer ")}
    assert set(registered.values()) == set(TICKING_TIMERS)
    quiet = QuietTimerTicks()
    for shown in registered:  # as kopf words it: f"{handler} succeeded."
        assert not quiet.filter(_record(f"{shown} succeeded."))


@pytest.mark.parametrize("message, level", [
    ("Timer 'retune_pods' failed with an exception and will try again in 60 seconds: boom",
     logging.ERROR),
    ("Handler 'reconcile' succeeded.", logging.INFO),
    ("Timer 'retune_pods' succeeded.", logging.WARNING),
])
def test_failures_and_other_handlers_still_get_through(message: str, level: int) -> None:
    assert QuietTimerTicks().filter(_record(message, level))
