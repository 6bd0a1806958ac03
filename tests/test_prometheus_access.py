"""A Prometheus that wants more than a URL: HTTPS with its own CA, credentials from a file
(rotated), extra headers. The options are checked up front; the adapter is held to a real
Prometheus that serves HTTPS and asks for basic auth (its own --web.config.file)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography.x509.oid import ExtendedKeyUsageOID
from e2e.fixtures.prometheus import PROMETHEUS_BINARY, MetricsEndpoint, PrometheusServer
from e2e.fixtures.waiting import wait_for
from prometheus_client import CollectorRegistry, Gauge, Histogram

from infertune.api.spec import Engine
from infertune.cli import build_parser
from infertune.kube.webhook_tls import write_self_signed
from infertune.metrics.access import AccessError, Credentials, PrometheusAccess
from infertune.metrics.presets import PRESETS
from infertune.metrics.prometheus import PrometheusSource
from infertune.metrics.source import MetricsTarget
from infertune.scaling.signals import TargetSignals

# ---- the options ---------------------------------------------------------------------------


def test_headers_are_parsed_and_kept_in_order() -> None:
    access = PrometheusAccess.parse(headers=["X-Scope-OrgID: team-a", "X-Extra:  a: b "])
    assert access.headers == (("X-Scope-OrgID", "team-a"), ("X-Extra", "a: b"))


@pytest.mark.parametrize(("header", "says"), [
    ("X-Scope-OrgID team-a", "is not NAME: VALUE"),
    ("X Scope: team-a", "is not NAME: VALUE"),
    (": team-a", "is not NAME: VALUE"),
    ("X-Scope-OrgID: team-a\r\nX-Evil: 1", "control character"),
    ("X-Scope-OrgID: team-a\nX-Evil: 1", "control character"),
    ("X-Scope-OrgID: a\x00b", "control character"),
    ("X-Scope-OrgID: équipe-🚀", "Latin-1 only"),  # every query failed on the codec
])
def test_a_header_that_could_not_be_sent_as_given_is_refused(header: str, says: str) -> None:
    with pytest.raises(AccessError, match=says) as caught:
        PrometheusAccess.parse(headers=[header])
    assert caught.value.option == "--prometheus-header"


def test_a_malformed_header_is_named_without_echoing_what_may_be_a_secret() -> None:
    with pytest.raises(AccessError) as caught:
        PrometheusAccess.parse(headers=["Authorization Bearer s3cr3t-token"])
    assert "'Authorization'" in str(caught.value) and "s3cr3t" not in str(caught.value)
    # A value given without its name: none of it is shown (its start was, 40 characters).
    with pytest.raises(AccessError) as caught:
        PrometheusAccess.parse(headers=["s3cr3tvalueNoColonWhatever1234567890abcd"])
    assert "s3cr3t" not in str(caught.value) and "has no ':'" in str(caught.value)
    # A name that is not one: only its leading run of name characters is shown.
    with pytest.raises(AccessError) as caught:
        PrometheusAccess.parse(headers=["X-Api-Key=s3cr3tT0ken: part2"])
    assert "'X-Api-Key'" in str(caught.value) and "s3cr3t" not in str(caught.value)


def test_a_header_given_twice_is_refused() -> None:
    with pytest.raises(AccessError, match="x-scope-orgid given more than once"):
        PrometheusAccess.parse(headers=["X-Scope-OrgID: a", "x-scope-orgid: b"])


@pytest.mark.parametrize("header", [
    "Authorization: Bearer s3cr3t-token", "authorization: Basic czNjcjN0",
    "Proxy-Authorization: Basic czNjcjN0"])
def test_credentials_in_a_header_are_refused_for_the_file_option(header: str) -> None:
    """A header is a command-line argument: every process list (and the chart's Deployment)
    shows it. Credentials come from a file only."""
    with pytest.raises(AccessError) as caught:
        PrometheusAccess.parse(headers=["X-Scope-OrgID: team-a", header])
    assert caught.value.option == "--prometheus-header"
    message = str(caught.value)
    assert message.startswith(f"--prometheus-header: {header.split(':')[0]} ")
    assert "--prometheus-credentials-file" in message and "prometheus.credentialsSecret" in message
    assert "s3cr3t" not in message and "czNjcjN0" not in message


def test_the_operator_refuses_credentials_in_a_header_at_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from infertune.controller import main

    monkeypatch.setattr(main.kopf, "configure", lambda **kwargs: None)  # the root logger
    argv = ["run", "--prometheus-url", "http://prometheus:9090",
            "--prometheus-header", "Authorization: Bearer s3cr3t-token"]
    with pytest.raises(SystemExit, match=r"^--prometheus-header: Authorization ") as caught:
        main.run_operator(build_parser().parse_args(argv))
    assert "s3cr3t" not in str(caught.value)


def test_credentials_come_one_way_only(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("abc\n")
    with pytest.raises(AccessError, match="needs --prometheus-credentials-file") as caught:
        PrometheusAccess.parse(auth_type="Basic")
    assert caught.value.option == "--prometheus-auth-type"
    with pytest.raises(AccessError, match="not an HTTP auth scheme"):
        PrometheusAccess.parse(credentials_file=str(token), auth_type="Bear er")


@pytest.mark.parametrize(("content", "says"), [
    (None, "cannot read"), ("", "is empty"), ("  \n", "is empty"),
    ("line one\nline two\n", "more than one line"), ("tok\ten", "control character"),
    ("tøken-€", "Latin-1 only")])
def test_a_credentials_file_is_read_before_anything_starts(
        tmp_path: Path, content: str | None, says: str) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(AccessError, match=says) as caught:
        PrometheusAccess.parse(credentials_file=str(path))
    assert caught.value.option == "--prometheus-credentials-file"


def test_a_ca_file_must_hold_a_certificate(tmp_path: Path) -> None:
    with pytest.raises(AccessError, match="does not exist"):
        PrometheusAccess.parse(ca_file=str(tmp_path / "missing.pem"))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(AccessError, match="no usable PEM certificate"):
        PrometheusAccess.parse(ca_file=str(junk))
    cert, _ = write_self_signed(tmp_path / "tls", ["127.0.0.1"])
    access = PrometheusAccess.parse(ca_file=str(cert))
    assert access.session_verify == str(cert)
    with pytest.raises(AccessError, match="is for an https URL"):
        PrometheusSource("http://prometheus:9090", access=access)


def test_rotated_credentials_are_read_again_and_a_vanished_file_keeps_the_last(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "token"
    path.write_text("first")
    credentials = Credentials(PrometheusAccess.parse(credentials_file=str(path)))
    assert credentials.current() == "Bearer first"
    path.write_text("second-token")
    assert credentials.current() == "Bearer second-token"
    path.unlink()
    with caplog.at_level(logging.WARNING):
        assert credentials.current() == "Bearer second-token"
    assert "keeping the last Prometheus credentials" in caplog.text


@pytest.mark.parametrize("argv", [
    ["run", "--prometheus-header", "X-Scope-OrgID: a\r\nX: 1"],
    ["run", "--prometheus-ca-file", "/nonexistent.pem", "--prometheus-url", "https://p:9090"],
    ["run", "--prometheus-header", "X-Scope-OrgID: a"],  # no URL: nothing would be queried
    ["run", "--prometheus-url", "http://prometheus:99999"],  # every query failed, as "no data"
])
def test_the_operator_refuses_to_start_with_access_options_that_cannot_work(
        monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    from infertune.controller import main

    monkeypatch.setattr(main.kopf, "configure", lambda **kwargs: None)  # the root logger
    monkeypatch.delenv("INFERTUNE_PROMETHEUS_URL", raising=False)
    with pytest.raises(SystemExit, match="--prometheus-"):
        main.run_operator(build_parser().parse_args(argv))


# ---- against a real Prometheus with TLS and basic auth --------------------------------------

needs_prometheus = pytest.mark.skipif(not PROMETHEUS_BINARY.exists(),
                                      reason="needs /usr/bin/prometheus")


@pytest.fixture(scope="module")
def secured() -> Iterator[PrometheusServer]:
    registry = CollectorRegistry()
    labels = ["namespace", "pod", "model_name"]
    Gauge(PRESETS[Engine.VLLM].queue_depth, "w", labels, registry=registry).labels(
        "serving", "llm-5d4f8b9c7-bcdfg", "qwen").set(12)
    latency = getattr(PRESETS[Engine.VLLM].latency, "name", None)
    assert latency is not None
    histogram = Histogram(latency, "e2e", labels, registry=registry).labels(
        "serving", "llm-5d4f8b9c7-bcdfg", "qwen")
    stop = threading.Event()
    threading.Thread(target=lambda: [histogram.observe(0.1) for _ in iter(
        lambda: stop.wait(0.05), True)], daemon=True).start()
    try:
        with scraped(registry, PrometheusServer(secured=True)) as server:
            yield server
    finally:
        stop.set()


@contextmanager
def scraped(registry: CollectorRegistry, server: PrometheusServer) -> Iterator[PrometheusServer]:
    """`server` started, scraping `registry` until the block ends."""
    server.start()
    try:
        with MetricsEndpoint(registry) as endpoint:
            server.add_scrape_job("vllm", [endpoint.target])
            server.wait_for_targets_up("vllm")
            yield server
    finally:
        server.stop()


TARGET = MetricsTarget("serving/llm", "serving", "llm", PRESETS[Engine.VLLM], window="5s",
                       queue_history_s=0.0, latency_step_s=2.0)


class RecordingSession(requests.Session):
    """A real session that also keeps the headers of each request it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[dict[str, str]] = []

    def request(self, *args: Any, **kwargs: Any) -> Any:
        self.sent.append(dict(kwargs.get("headers") or {}))
        return super().request(*args, **kwargs)


def credentials(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "credentials"
    path.write_text(text + "\n")
    return path


def fetched(source: PrometheusSource) -> TargetSignals:
    return source.fetch([TARGET], time.time())[TARGET.key]


@needs_prometheus
def test_the_adapter_reads_a_prometheus_behind_tls_and_basic_auth(
        secured: PrometheusServer, tmp_path: Path) -> None:
    assert secured.ca_file is not None
    access = PrometheusAccess.parse(
        ca_file=str(secured.ca_file), auth_type="Basic",
        credentials_file=str(credentials(tmp_path, secured.basic_credentials)),
        headers=["X-Scope-OrgID: team-a"])
    session = RecordingSession()
    session.verify = access.session_verify
    source = PrometheusSource(secured.url, access=access, session=session)
    # The latency and the request rate are rates over a window: they come a few scrapes
    # after the queue.
    got = wait_for(lambda: (s := fetched(source)).problems() == () and s,
                   "every signal through TLS and basic auth", timeout_s=30)
    assert got.queue.last == 12.0
    assert session.sent[-1]["X-Scope-OrgID"] == "team-a"
    assert session.sent[-1]["Authorization"] == f"Basic {secured.basic_credentials}"


@needs_prometheus
def test_refused_credentials_are_no_data_that_says_why_until_the_file_is_fixed(
        secured: PrometheusServer, tmp_path: Path) -> None:
    assert secured.ca_file is not None
    path = credentials(tmp_path, "aW5mZXJ0dW5lOndyb25n")  # infertune:wrong
    source = PrometheusSource(secured.url, access=PrometheusAccess.parse(
        ca_file=str(secured.ca_file), auth_type="Basic", credentials_file=str(path)))
    refused = fetched(source)
    assert refused.queue.last is None
    assert "HTTP Status Code 401: the credentials were refused; check " \
           "--prometheus-credentials-file" in (refused.queue.problem or "")
    path.write_text(secured.basic_credentials + "\n")  # rotated: read again on the next cycle
    assert wait_for(lambda: fetched(source).queue.last, "the queue after the fix") == 12.0


@needs_prometheus
def test_a_certificate_the_adapter_cannot_verify_is_reported_as_tls(
        secured: PrometheusServer, tmp_path: Path) -> None:
    other_ca, _ = write_self_signed(tmp_path / "other", ["127.0.0.1"])
    for access in (PrometheusAccess(), PrometheusAccess.parse(ca_file=str(other_ca))):
        got = fetched(PrometheusSource(secured.url, access=access, timeout_s=5))
        assert got.queue.last is None
        said = got.queue.problem or ""
        assert "TLS failed" in said and "--prometheus-ca-file" in said
        cause = said[said.index("TLS failed (") + len("TLS failed ("):said.index("); check")]
        assert cause.count("(") == cause.count(")"), said  # its last ")" was cut off


@needs_prometheus
def test_autoscale_evaluate_takes_the_same_access_options(
        secured: PrometheusServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert secured.ca_file is not None
    tuning = tmp_path / "tuning.yaml"
    tuning.write_text(TUNING)
    secret = credentials(tmp_path, secured.basic_credentials)
    argv = ["autoscale", "evaluate", str(tuning), "--prometheus", secured.url,
            "--prometheus-ca-file", str(secured.ca_file), "--prometheus-auth-type", "Basic",
            "--prometheus-credentials-file", str(secret), "--replicas", "1", "--output", "json"]
    args = build_parser().parse_args(argv)
    # The latency and the request rate are rates over a window: they come a few scrapes
    # after the queue (this said "the exporter serves the queue only", and passed while they
    # had not come yet).
    wait_for(lambda: fetched(PrometheusSource(secured.url, access=PrometheusAccess.parse(
        ca_file=str(secured.ca_file), auth_type="Basic", credentials_file=str(secret))
    )).problems() == (), "every signal", timeout_s=30)
    assert args.handler(args) == 0  # read through TLS and Basic auth
    signals = json.loads(capsys.readouterr().out)["signals"]
    assert signals["queuePerReplica"] == 12.0
    assert signals["problems"] == [] and signals["latencySeconds"] is not None
    # A value that cannot be used is a command line that does not parse (exit 2), said
    # before the file is read: it was exit 1, as bad input, and said after the file's error.
    for tuning_file in (str(tuning), str(tmp_path / "missing.yaml")):
        bad = build_parser().parse_args(["autoscale", "evaluate", tuning_file, *argv[3:5],
                                         "--prometheus-header", "X: a\nY: b"])
        assert bad.handler(bad) == 2
        assert "--prometheus-header: the value of X holds a control character" in \
            capsys.readouterr().err
        # A CA for a URL that is not https: it was exit 1, after the file (or the cluster)
        # was read.
        plain = build_parser().parse_args([
            "autoscale", "evaluate", tuning_file, "--prometheus", "http://127.0.0.1:1",
            "--prometheus-ca-file", str(secured.ca_file)])
        assert plain.handler(plain) == 2
        assert capsys.readouterr().err == (
            "--prometheus-ca-file: is for an https URL, and http://127.0.0.1:1 is not one; "
            "use https:// or drop the option\n")


TUNING = (Path(__file__).parent / "fixtures" / "autoscale" / "tuning.yaml").read_text()


def test_a_client_certificate_needs_its_key_and_both_must_load(tmp_path: Path) -> None:
    client = ExtendedKeyUsageOID.CLIENT_AUTH
    cert, key = write_self_signed(tmp_path / "a", ["infertune"], usage=client)
    other_cert, _ = write_self_signed(tmp_path / "b", ["other"], usage=client)
    with pytest.raises(AccessError, match="needs both") as caught:
        PrometheusAccess.parse(cert_file=str(cert))
    assert caught.value.option == "--prometheus-key-file"
    with pytest.raises(AccessError, match="does not exist") as caught:
        PrometheusAccess.parse(cert_file=str(tmp_path / "none.pem"), key_file=str(key))
    assert caught.value.option == "--prometheus-cert-file"
    with pytest.raises(AccessError, match="not a PEM certificate and its private key"):
        PrometheusAccess.parse(cert_file=str(other_cert), key_file=str(key))
    access = PrometheusAccess.parse(cert_file=str(cert), key_file=str(key))
    assert access.client_cert == (cert, key)
    with pytest.raises(AccessError, match="is for an https URL") as caught:
        PrometheusSource("http://prometheus:9090", access=access)
    assert caught.value.option == "--prometheus-cert-file"


@pytest.fixture(scope="module")
def mutual() -> Iterator[PrometheusServer]:
    """HTTPS that lets in only clients with the certificate it trusts (mutual TLS)."""
    registry = CollectorRegistry()
    Gauge(PRESETS[Engine.VLLM].queue_depth, "w", ["namespace", "pod"], registry=registry).labels(
        "serving", "llm-5d4f8b9c7-bcdfg").set(7)
    with scraped(registry, PrometheusServer(secured=True, mutual=True)) as server:
        yield server


@needs_prometheus
def test_the_adapter_presents_its_client_certificate_to_a_prometheus_that_asks(
        mutual: PrometheusServer, tmp_path: Path) -> None:
    assert mutual.ca_file is not None and mutual.client_cert is not None
    secret = str(credentials(tmp_path, mutual.basic_credentials))
    cert, key = map(str, mutual.client_cert)
    with_cert = PrometheusSource(mutual.url, access=PrometheusAccess.parse(
        ca_file=str(mutual.ca_file), cert_file=cert, key_file=key, auth_type="Basic",
        credentials_file=secret))
    assert wait_for(lambda: fetched(with_cert).queue.last, "the queue over mutual TLS") == 7.0
    without = fetched(PrometheusSource(mutual.url, access=PrometheusAccess.parse(
        ca_file=str(mutual.ca_file), auth_type="Basic", credentials_file=secret)))
    assert without.queue.last is None
    assert "TLS failed" in (without.queue.problem or ""), without.queue.problem


def test_credentials_sent_unencrypted_to_another_host_are_warned_of(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The chart suggests the operator's own ServiceAccount token as credentials: over
    http:// to another host, anyone on the way could take it, and its permissions with it."""
    from infertune.metrics.prometheus import PrometheusSource, cleartext_credentials
    token = tmp_path / "token"
    token.write_text("t0ken")
    access = PrometheusAccess.parse(credentials_file=str(token))
    said = cleartext_credentials("http://prometheus.monitoring:9090", access)
    assert said is not None and said.startswith(
        "Prometheus credentials are sent unencrypted to http://prometheus.monitoring:9090: "
        "use an https:// URL")
    assert cleartext_credentials("http://user:s3cret@prom:9090", PrometheusAccess()) == (
        "Prometheus credentials are sent unencrypted to http://***@prom:9090: use an https:// "
        "URL, or a token that may do nothing but read Prometheus (not the operator's own "
        "ServiceAccount token)")
    for quiet in ("https://prometheus.monitoring:9090", "http://localhost:9090",
                  "http://127.0.0.2:9090", "http://[::1]:9090"):
        assert cleartext_credentials(quiet, access) is None, quiet
    assert cleartext_credentials("http://prometheus:9090", PrometheusAccess()) is None
    with caplog.at_level("WARNING", logger="infertune.metrics.prometheus"):
        PrometheusSource("http://prometheus.monitoring:9090", access=access)
    assert [r.getMessage() for r in caplog.records] == [said]
