"""Shared fixtures for the unit and integration tests."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUIRE_COMPONENTS = "INFERTUNE_REQUIRE_COMPONENTS"
"""Set to 1 (.ci/run sets it), a test skipped for want of a real component the machine should
have (Prometheus, promtool, numactl, libjemalloc) fails instead: a package install that did
not happen would otherwise leave CI green with a hundred tests of the real thing skipped."""
MISSING_COMPONENT = ("needs ", "is absent (apt")
"""How the reason of such a skip reads (`needs /usr/bin/prometheus`, `... is absent (apt-get
install libjemalloc2)`); other skips (the kernel refused a binding, one CPU) stay skips."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and os.environ.get(REQUIRE_COMPONENTS) == "1":
        reason = _skip_reason(report.longrepr)
        if reason.startswith(MISSING_COMPONENT[0]) or MISSING_COMPONENT[1] in reason:
            report.outcome = "failed"
            report.longrepr = (f"skipped for want of a component, which {REQUIRE_COMPONENTS}=1 "
                               f"makes a failure: {reason}")
    return report


def _skip_reason(longrepr: Any) -> str:
    """The reason of a skip report (pytest keeps it as (path, line, "Skipped: reason"))."""
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return str(text).removeprefix("Skipped: ")


@pytest.fixture(autouse=True)
def kubernetes_client_defaults() -> Generator[None, None, None]:
    """The Kubernetes client's process-wide defaults (configuration, ApiClient) as they were
    before the test: a test that loads a kubeconfig (of a fake server, with a token) left
    them for every test after it, whose client calls would then go there."""
    from kubernetes import client

    configuration = getattr(client.Configuration, "_default", None)
    api_client = getattr(client.ApiClient, "_default", None)
    yield
    client.Configuration._default = configuration  # type: ignore[attr-defined]
    client.ApiClient._default = api_client  # type: ignore[attr-defined]


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def silent_server() -> Iterator[str]:
    """The URL of a server that accepts connections and reads requests but never answers (a
    half-open connection through a load balancer that failed over)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for connection in accepted:  # ends a call still waiting (its test has failed then)
        connection.close()
    listener.close()
