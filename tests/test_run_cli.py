"""`infertune run` refuses a bad Prometheus URL before it touches the cluster."""

from __future__ import annotations

import pytest

from infertune.cli import main


@pytest.mark.parametrize("url", ["prometheus:9090", "ftp://prometheus:9090"])
def test_a_prometheus_url_without_http_is_refused_naming_the_option(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # No cluster credentials anywhere: the URL must be refused before they are looked for.
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("INFERTUNE_PROMETHEUS_URL", raising=False)
    with pytest.raises(SystemExit) as refused:
        main(["run", "--prometheus-url", url])
    message = str(refused.value)
    assert message.startswith("--prometheus-url") and url in message and "http://" in message


def test_the_environment_variable_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.setenv("INFERTUNE_PROMETHEUS_URL", "prometheus:9090")
    with pytest.raises(SystemExit, match=r"INFERTUNE_PROMETHEUS_URL.*prometheus:9090"):
        main(["run"])
