"""`infertune run`: a bad Prometheus URL is refused before it touches the cluster, and the
webhook is registered at an address the API server can call."""

from __future__ import annotations

import argparse
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from infertune.cli import build_parser, main
from infertune.controller.main import _webhook_host
from infertune.kube.client import route_source, unspecified

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "vllm-qwen2-7b-h200-mig.yaml"


def refused_run(monkeypatch: pytest.MonkeyPatch, *options: str) -> str:
    """Why `infertune run OPTIONS` stops before it starts: with no cluster credentials
    anywhere, anything that got past the option checks would fail on them instead."""
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("INFERTUNE_PROMETHEUS_URL", raising=False)
    with pytest.raises(SystemExit) as refused:
        main(["run", *options])
    return str(refused.value)


@pytest.mark.parametrize("url", ["prometheus:9090", "ftp://prometheus:9090"])
def test_a_prometheus_url_without_http_is_refused_naming_the_option(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # No cluster credentials anywhere: the URL must be refused before they are looked for.
    message = refused_run(monkeypatch, "--prometheus-url", url)
    assert message.startswith("--prometheus-url") and url in message and "http://" in message


@pytest.mark.parametrize(("options", "says"), [
    (["--leader-elect-lease", "infertune-a"], "add --leader-elect"),
    (["--leader-elect", "--leader-elect-lease", "Infertune_A"], "'Infertune_A' is not a"),
    (["--leader-elect", "--leader-elect-lease", "a" * 254], "at most 253"),
    (["--leader-elect", "--leader-elect-lease", "x/../../secrets"], "not a Kubernetes object"),
])
def test_a_lease_name_that_cannot_work_is_refused_before_anything_starts(
        options: list[str], says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    message = refused_run(monkeypatch, *options)
    assert message.startswith("--leader-elect-lease") and says in message


@pytest.mark.parametrize(("options", "says"), [
    # The API server refused these in the registration (422): a traceback after start.
    (["-n", "team a"], "--namespace: 'team a' is not a namespace name"),
    (["-n", "t" * 64], "at most 63 characters"),
    (["--operator-namespace", "Infertune"], "'Infertune' is not a namespace name"),
    (["--operator-namespace", "team-*"], "--operator-namespace (or $INFERTUNE_NAMESPACE): "
                                         "'team-*' is not a namespace name"),
    (["--webhook-service", "infertune-system/infertune-webhook:99999"],
     "--webhook-service: port 99999 is not from 1 to 65535"),
    (["--webhook-service", "infertune-system/Webhook:443"],
     "--webhook-service: Service name 'Webhook' is not a DNS label"),
    (["--webhook-service", "bad"], "--webhook-service: expected NAMESPACE/NAME:PORT"),
    # Accepted, and every pod went untuned: the CA registered was not the one served.
    (["--webhook-ca", "/etc/hostname"], "--webhook-ca is the CA of --webhook-cert"),
    # Said after the API server check, the Lease and the CRD read (55 s when unreachable).
    (["--webhook-cert", "/etc/hostname"], "--webhook-cert and --webhook-key go together"),
    (["--webhook-key", "/etc/hostname"], "--webhook-cert and --webhook-key go together"),
    # Taken, and nothing read them with MIG off.
    (["--no-mig", "--mig-drain-other-namespaces"],
     "--mig-drain-other-namespaces has no effect with --no-mig (MIG partitioning off): drop "
     "it, or --no-mig"),
    (["--no-mig", "--mig-config-delay", "5", "--mig-drain-other-namespaces"],
     "--mig-drain-other-namespaces and --mig-config-delay have no effect with --no-mig"),
    (["--webhook-host", "[fd00::1]"], "without brackets ([fd00::1] -> fd00::1)"),
    (["--webhook-host", "10.0.0.5:9443"], "the port is --webhook-port"),
    (["--webhook-cert", "/nonexistent/tls.crt", "--webhook-key", "/nonexistent/tls.key"],
     "--webhook-cert: /nonexistent/tls.crt cannot be read"),
    # kopf binds the probe first, and the webhook's bind failed after the start.
    (["--webhook-port", "18080", "--liveness", "http://0.0.0.0:18080/healthz"],
     "--webhook-port: 18080 is the port of --liveness; give each its own"),
    # Dropped without a word (the Service is what the API server calls).
    (["--webhook-host", "1.2.3.4", "--webhook-service", "infertune-system/webhook:443"],
     "--webhook-host is the address of a webhook the API server calls by URL"),
    # The API server's 422 dump, once kopf had started.
    (["--webhook-host", "bad host"], "--webhook-host: 'bad host' is not a host name or IP"),
    # kopf's bind: a socket.gaierror traceback.
    (["--webhook-addr", "webhook.invalid"],
     "--webhook-addr: 'webhook.invalid' is not an address to listen on"),
])
def test_webhook_options_that_cannot_work_are_refused_before_anything_starts(
        options: list[str], says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert says in refused_run(monkeypatch, *options)


@pytest.mark.parametrize(("url", "says"), [
    ("foo", "must start with http://"),
    ("https://0.0.0.0:8080/healthz", "must start with http://"),
    ("http://0.0.0.0:99999/healthz", "Port out of range"),
    ("http://0.0.0.0:0/healthz", "needs a port from 1 to 65535"),
    ("http://liveness.invalid:8080/healthz", "names no address to listen on"),
])
def test_a_liveness_url_kopf_cannot_serve_is_refused_by_name(
        url: str, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf's traceback after the operator had started ("Unsupported scheme: foo")."""
    message = refused_run(monkeypatch, "--webhook-port", "0", "--liveness", url)
    assert message.startswith("--liveness: ") and says in message, message


def test_a_liveness_port_another_process_listens_on_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        message = refused_run(monkeypatch, "--webhook-port", "0", "--liveness",
                              f"http://127.0.0.1:{port}/healthz")
    assert message.startswith(f"--liveness: 127.0.0.1 port {port} is in use"), message


@pytest.mark.parametrize("options", [
    ["--webhook-addr", "localhost"],  # kopf binds a host name
    ["--webhook-host", "host.docker.internal."],
    ["--webhook-host", "my_host"],
    ["--liveness", "http://:8080/healthz"],  # kopf: localhost
])
def test_addresses_kopf_and_the_api_server_take_are_not_refused(
        options: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """They worked before the start-up checks: the run goes on to the cluster credentials."""
    from infertune.controller import main as controller

    monkeypatch.setattr(controller, "_port_taken", lambda addr, port: None)
    assert refused_run(monkeypatch, "--webhook-port", "0", *options).startswith(
        "no cluster credentials")


def test_webhook_certificate_files_that_cannot_serve_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CA that did not issue the certificate, or an empty one, was registered: the API
    server trusted no answer and every pod was admitted untuned, while the operator was
    Ready. Files that hold no certificate and key ended in ssl.SSLError's traceback."""
    from infertune.controller import main as controller
    from infertune.controller.main import check_webhook_options
    from infertune.kube.webhook_tls import write_self_signed

    monkeypatch.setattr(controller, "_port_taken", lambda addr, port: None)  # 9443 may be busy
    cert, key = write_self_signed(tmp_path / "ours", ["127.0.0.1"])
    other, _ = write_self_signed(tmp_path / "other", ["127.0.0.1"])
    empty = tmp_path / "empty.crt"
    empty.write_text("")

    def refused(*options: str | Path) -> str:
        args = build_parser().parse_args(["run", *map(str, options)])
        with pytest.raises(SystemExit) as stopped:
            check_webhook_options(args)
        return str(stopped.value)

    given = ("--webhook-cert", cert, "--webhook-key", key)
    assert check_webhook_options(build_parser().parse_args(
        ["run", *map(str, given), "--webhook-ca", str(cert)])) is None  # its own CA
    assert refused(*given, "--webhook-ca", other).startswith(
        f"--webhook-ca: no certificate in {other} issued {cert}")
    assert refused(*given, "--webhook-ca", empty) == f"--webhook-ca: {empty} holds no PEM " \
        "certificate"
    assert refused("--webhook-cert", key, "--webhook-key", cert).startswith(
        "--webhook-cert/--webhook-key: ")
    assert refused("--webhook-cert", cert, "--webhook-key", other).startswith(
        "--webhook-cert/--webhook-key: ")
    # Expired (a hand-made Secret nobody renewed): the API server refuses it at every call.
    expired, expired_key = write_self_signed(tmp_path / "expired", ["127.0.0.1"], days=0)
    said = refused("--webhook-cert", expired, "--webhook-key", expired_key)
    assert said.startswith(f"--webhook-cert: {expired} is valid from ") and "not now" in said


@pytest.mark.parametrize(("hosts", "called", "refused"), [
    (["infertune-webhook.infertune-system.svc"], "service", False),
    (["*.infertune-system.svc"], "service", False),  # a wildcard for one label
    (["wrong.example"], "service", True),
    (["infertune-webhook.other.svc"], "service", True),
    (["*.svc"], "service", True),  # not two labels
    (["127.0.0.1"], "192.0.2.7", True),
    (["192.0.2.7"], "192.0.2.7", False),
    # The same address as Go compares them (net.IP.Equal): IPv4 and its IPv4-mapped form.
    (["192.0.2.7"], "::ffff:192.0.2.7", False),
    (["::ffff:192.0.2.7"], "192.0.2.7", False),
    (["::ffff:192.0.2.8"], "192.0.2.7", True),
    (["operator.example"], "OPERATOR.example.", False),
    (["infertune-webhook.infertune-system.svc."], "service", True),  # Go refuses it
])
def test_a_webhook_certificate_for_another_name_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hosts: list[str], called: str,
        refused: bool) -> None:
    """cert-manager's Certificate without the Service's dnsNames: trusted by its CA, the
    certificate was refused by the API server for its name at every call, and every pod was
    admitted untuned while the operator was Ready."""
    from infertune.controller import main as controller
    from infertune.controller.main import check_webhook_options
    from infertune.kube.webhook_tls import write_self_signed

    monkeypatch.setattr(controller, "_port_taken", lambda addr, port: None)
    cert, key = write_self_signed(tmp_path, hosts)
    where = (["--webhook-service", "infertune-system/infertune-webhook:443"]
             if called == "service" else ["--webhook-host", called])
    args = build_parser().parse_args(["run", "--webhook-cert", str(cert), "--webhook-key",
                                      str(key), *where])
    if not refused:
        assert check_webhook_options(args) is None
        return
    with pytest.raises(SystemExit) as stopped:
        check_webhook_options(args)
    wanted = ("infertune-webhook.infertune-system.svc" if called == "service" else called)
    assert str(stopped.value).startswith(f"--webhook-cert: {cert} is for {hosts[0]}, not "
                                         f"{wanted}"), stopped.value


def test_a_webhook_certificate_for_another_name_than_the_address_found_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --webhook-host or --webhook-service, the address found for this machine is the
    one the API server calls: the name check was skipped then, and every call failed on it
    while the operator reported Ready."""
    from contextlib import ExitStack

    from infertune.controller import main as controller
    from infertune.kube.webhook_tls import write_self_signed

    cert, key = write_self_signed(tmp_path, ["webhook.example.com"])
    monkeypatch.setattr(controller, "_webhook_host", lambda args, in_cluster: "192.0.2.2")
    args = build_parser().parse_args(["run", "--webhook-cert", str(cert), "--webhook-key",
                                      str(key)])
    with ExitStack() as cleanup, pytest.raises(SystemExit) as stopped:
        controller._webhook_server(args, "infertune-system", cleanup)
    assert str(stopped.value).startswith(
        f"--webhook-cert: {cert} is for webhook.example.com, not 192.0.2.2"), stopped.value
    assert "give --webhook-host with a name the certificate holds" in str(stopped.value)
    # A certificate for the address found serves.
    cert, key = write_self_signed(tmp_path / "ok", ["192.0.2.2"])
    args = build_parser().parse_args(["run", "--webhook-cert", str(cert), "--webhook-key",
                                      str(key)])
    with ExitStack() as cleanup:
        assert controller._webhook_server(args, "infertune-system", cleanup) is not None


def test_a_webhook_port_another_process_listens_on_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf's server binds with SO_REUSEPORT: a second operator on the same port started,
    the kernel split the API server's calls between the two, and only one's CA was
    registered."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert f"127.0.0.1 port {port} is in use" in refused_run(
            monkeypatch, "--webhook-addr", "127.0.0.1", "--webhook-port", str(port))


def test_the_operator_namespace_from_the_environment_is_checked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERTUNE_NAMESPACE", "infertune system")
    assert "'infertune system' is not a namespace name" in refused_run(monkeypatch)


def test_a_port_only_an_ipv4_listener_holds_is_free_for_an_ipv6_only_webhook() -> None:
    """asyncio (so kopf) binds :: for IPv6 only: an IPv4 listener on the port does not stop
    it, and was taken for one that did."""
    from infertune.controller.main import _port_taken

    with socket.socket() as ipv4:
        ipv4.bind(("0.0.0.0", 0))
        ipv4.listen()
        port = ipv4.getsockname()[1]
        assert _port_taken("0.0.0.0", port) is not None
        if socket.has_ipv6:
            assert _port_taken("::", port) is None


def test_kopf_patterns_and_ipv6_hosts_pass_the_webhook_checks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from infertune.controller import main as controller
    from infertune.controller.main import check_webhook_options

    monkeypatch.setattr(controller, "_port_taken", lambda addr, port: None)  # 9443 may be busy

    args = build_parser().parse_args(["run", "-n", "team-*", "-n", "!team-test",
                                      "--webhook-host", "fd00::1"])
    assert check_webhook_options(args) is None  # nothing refused


def test_the_environment_variable_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.setenv("INFERTUNE_PROMETHEUS_URL", "prometheus:9090")
    with pytest.raises(SystemExit, match=r"INFERTUNE_PROMETHEUS_URL.*prometheus:9090"):
        main(["run"])


def _run_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


@pytest.fixture
def api_server(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Points the configured client at an API server URL (nothing is called there)."""
    def at(url: str) -> None:
        configuration = client.Configuration()
        configuration.host = url
        monkeypatch.setattr(client.Configuration, "get_default_copy",
                            staticmethod(lambda: configuration))
    return at


def test_the_webhook_is_never_registered_at_a_wildcard_address(
        api_server: Callable[[str], None]) -> None:
    """The default listen address 0.0.0.0 was also the URL the API server was told to call;
    a remote API server cannot call it. It is now this machine's address on the way to the
    API server."""
    api_server("https://127.0.0.1:6443")
    assert _webhook_host(_run_args(), through_service=False) == "127.0.0.1"
    remote = "https://198.51.100.7:6443"  # elsewhere (TEST-NET-2; nothing is sent)
    if route_source(remote) is not None:  # a machine with a route off itself
        api_server(remote)
        elsewhere = _webhook_host(_run_args(), through_service=False)
        assert not unspecified(elsewhere) and not elsewhere.startswith("127.")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as own:
            own.bind((elsewhere, 0))  # an address of this machine's own
    api_server("https://no-such-host.invalid:6443")
    assert _webhook_host(_run_args(), through_service=False) == "127.0.0.1"


def test_a_given_webhook_host_or_listen_address_is_kept(
        api_server: Callable[[str], None]) -> None:
    api_server("https://127.0.0.1:6443")
    assert _webhook_host(_run_args("--webhook-host", "op.example.com"), False) == \
        "op.example.com"
    assert _webhook_host(_run_args("--webhook-addr", "10.1.2.3"), False) == "10.1.2.3"
    assert _webhook_host(_run_args("--webhook-addr", "::"), True) == "::"  # the Service's
    assert unspecified("::") and unspecified("0.0.0.0") and not unspecified("10.0.0.1")
    assert not unspecified("operator.local")


def test_route_source_sends_nothing_and_says_none_when_unroutable() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.settimeout(0.2)
        assert route_source(f"https://127.0.0.1:{listener.getsockname()[1]}") == "127.0.0.1"
        with pytest.raises(TimeoutError):
            listener.recv(1)  # connecting a UDP socket sent no datagram
    assert route_source("not a url") is None


def test_the_webhook_host_is_in_the_family_the_webhook_listens_in(
        api_server: Callable[[str], None]) -> None:
    """asyncio binds 0.0.0.0 to IPv4 and :: to IPv6 only: an API server reached over IPv6
    from a 0.0.0.0 listener got an IPv6 URL where nothing answers."""
    api_server("https://[::1]:6443")
    assert _webhook_host(_run_args(), through_service=False) == "127.0.0.1"
    assert _webhook_host(_run_args("--webhook-addr", "::"), through_service=False) == "::1"
    api_server("https://127.0.0.1:6443")
    assert _webhook_host(_run_args("--webhook-addr", "::"), through_service=False) == "::1"


@pytest.mark.parametrize(("content", "says"), [
    (None, "no such file"),
    ("a: [\n", "not valid YAML (while parsing a flow node)"),
    ("just a string\n", "not a kubeconfig (TypeError"),
    (b"\xff\xfe\x00k", "not UTF-8 text"),
    ("apiVersion: v1\nkind: Config\n", "Expected key current-context"),
])
def test_a_kubeconfig_that_cannot_be_used_is_a_message_not_a_traceback(
        content: str | bytes | None, says: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's own `infertune run --kubeconfig ~/.kube/config` on a machine without
    that file printed a traceback."""
    path = tmp_path / "kubeconfig"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    message = refused_run(monkeypatch, "--kubeconfig", str(path))
    assert message.startswith(f"--kubeconfig {path}: ") and says in message, message
    assert message.endswith("give a kubeconfig file this user can read")


@pytest.mark.parametrize(("unreadable", "reason"), [
    (PermissionError(13, "Permission denied"), "permission denied"),
    (None, "is a directory"),  # the path of a directory: as open() refuses it
])
def test_a_kubeconfig_that_cannot_be_read_is_said_in_words(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        unreadable: OSError | None, reason: str) -> None:
    """"[Errno 13] Permission denied: '/home/me/kc'", Python's words, was the reason given;
    and for `infertune autoscale evaluate --live` too."""
    from kubernetes import config

    path = tmp_path / "kubeconfig"
    path.mkdir()
    if unreadable is not None:
        def refuse(**_: Any) -> None:
            assert unreadable is not None
            raise type(unreadable)(unreadable.errno, unreadable.strerror, str(path))

        monkeypatch.setattr(config, "load_kube_config", refuse)
    said = f"--kubeconfig {path}: the file {path} cannot be read: {reason}; give a " \
        "kubeconfig file this user can read"
    assert refused_run(monkeypatch, "--kubeconfig", str(path)) == said
    try:
        assert main(["autoscale", "evaluate", "--live", "ml/qwen", "--kubeconfig", str(path),
                     "--prometheus", "http://127.0.0.1:1"]) == 1
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
    assert capsys.readouterr().err.strip().endswith(f"\n--live: {said}")


def _kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig at `path` whose one context reaches `server` with a token."""
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return path


def test_an_api_server_that_does_not_answer_is_a_message_not_a_minute_of_tracebacks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kubeconfig whose server nothing answers at: kopf retried for a minute, then ended
    in tracebacks. It is tried a few times (the API server may be starting), then named."""
    from infertune.kube import client as kube_client

    with socket.socket() as closed:  # a port nothing listens on once this is closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    path = _kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}")
    monkeypatch.setattr(kube_client, "REACH_PAUSE_S", 0.0)
    monkeypatch.setattr(kube_client, "REACH_ATTEMPTS", 3)
    tries: list[float] = []
    original = kube_client.client.VersionApi.get_code

    def get_code(self: Any, **kwargs: Any) -> Any:
        tries.append(1)
        return original(self, **kwargs)

    monkeypatch.setattr(kube_client.client.VersionApi, "get_code", get_code)
    message = refused_run(monkeypatch, "--kubeconfig", str(path), "--webhook-port", "0")
    assert message.startswith(f"the API server at https://127.0.0.1:{port} cannot be reached ("), \
        message
    assert " after 3 tries in " in message and message.endswith(
        " s: check the cluster of the kubeconfig (or the network to it), and that the API "
        "server runs"), message
    assert len(tries) == 3


def test_an_api_server_that_takes_connections_and_never_answers_is_named_in_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each try was sent four times (a read that timed out is sent again), and with the
    timeouts the check said "trying again for 55 s" and took five minutes: the chart's
    liveness probe killed the operator before it said why. Each try goes once now, within
    the time said."""
    from infertune.kube import client as kube_client

    accepted: list[socket.socket] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])  # held open, never answered
            except TimeoutError:
                continue

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    path = _kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}")
    monkeypatch.setattr(kube_client, "REACH_TIMEOUT_S", 0.3)
    monkeypatch.setattr(kube_client, "REACH_PAUSE_S", 0.1)
    monkeypatch.setattr(kube_client, "REACH_ATTEMPTS", 6)
    try:
        message = refused_run(monkeypatch, "--kubeconfig", str(path), "--webhook-port", "0")
    finally:
        stop.set()
        acceptor.join()
        for conn in accepted:
            conn.close()
        listener.close()
    assert message.startswith(f"the API server at https://127.0.0.1:{port} cannot be reached")
    tries = int(message.split(" after ")[1].split(" tries")[0])
    assert 1 <= tries <= 6 and len(accepted) == tries, (message, len(accepted))


def test_a_ready_file_left_by_a_crashed_container_goes_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod's /tmp (an emptyDir) outlives its container: a file left there made the
    restarted container Ready (the chart's probe is test -f) through its whole start, the
    first leader-election round included, before anything listened or was registered."""
    ready = tmp_path / "ready"
    ready.touch()
    refused_run(monkeypatch, "--ready-file", str(ready), "--kubeconfig",
                str(tmp_path / "missing"))
    assert not ready.exists()


def test_no_credentials_anywhere_is_a_message_not_a_traceback(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    message = refused_run(monkeypatch)
    assert message.startswith("no cluster credentials: not in a cluster, and $KUBECONFIG or "
                              "~/.kube/config cannot be used") and "pass --kubeconfig" in message


@pytest.mark.parametrize(("options", "says"), [
    (["--retune-interval", "0"], "argument --retune-interval: 0 must be a number of seconds "
                                 "above 0"),
    (["--retune-interval", "nan"], "argument --retune-interval: 'nan' is not a number of "
                                   "seconds written with the digits 0-9 (30, 0.5)"),
    # float() took them: ten, a full-width 5, and spaces around a number.
    (["--retune-interval", "1_0"], "argument --retune-interval: '1_0' is not a number of "
                                   "seconds"),
    (["--retune-interval", "\uff15"], "argument --retune-interval: '\uff15' is not a number"),
    (["--retune-interval", " 5 "], "argument --retune-interval: ' 5 ' is not a number"),
    (["--retune-interval", "-0"], "argument --retune-interval: -0 must be a number of "
                                  "seconds above 0"),
    (["--retune-interval", "1e999"], "argument --retune-interval: 1e999 must be at most 86400 "
                                     "seconds"),
    (["--retune-interval", "9" * 5000], "argument --retune-interval: 99999999999999999999... "
                                        "(5000 characters) must be at most 86400 seconds"),
    (["--launcher-image", ""], "argument --launcher-image: '' is not an image reference"),
    (["--launcher-image", "bad image"], "'bad image' is not an image reference"),
    (["--launcher-image", "Infertune:1"], "'Infertune:1' is not an image reference"),
    # Digests the kubelet refuses (InvalidImageName in every tuned pod's init container).
    (["--launcher-image", f"infertune@sha256:{'a' * 32}"], "is not an image reference"),
    (["--launcher-image", f"infertune@sha256:{'A' * 64}"], "is not an image reference"),
    (["--launcher-image", f"infertune@md5:{'a' * 32}"], "is not an image reference"),
    (["--webhook-check-interval", "1e300"], "argument --webhook-check-interval: 1e300 must be "
                                            "at most 86400 seconds"),
    # Read back to back, the CRD of 40 kB would be fetched without a pause.
    (["--crd-check-interval", "0"], "argument --crd-check-interval: 0 must be a number of "
                                    "seconds above 0"),
])
def test_run_options_that_cannot_work_are_refused_by_name(
        options: list[str], says: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """--retune-interval 0 ran every tuning's re-tuning pass back to back; an empty or
    malformed --launcher-image went into the init container of every tuned pod."""
    refused_run(monkeypatch, *options)
    assert says in capsys.readouterr().err


def test_an_evaluation_timeout_past_what_a_clock_can_wait_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    """1e10 overflowed the wait on the queries, with a traceback."""
    with pytest.raises(SystemExit):
        main(["autoscale", "evaluate", str(EXAMPLE), "--prometheus",
              "http://127.0.0.1:1", "--timeout", "1e10"])
    assert "argument --timeout: 1e10 must be at most 3600 seconds" in capsys.readouterr().err


@pytest.mark.parametrize("image", [
    "ghcr.io/infertune/infertune:0.1.0", "infertune:e2e", "localhost:5000/team/infertune",
    f"ghcr.io/infertune/infertune:0.1.0@sha256:{'0f' * 32}",
    f"registry.example.com:5000/infertune@sha512:{'ab' * 64}"])
def test_image_references_the_chart_and_registries_use_are_taken(image: str) -> None:
    assert build_parser().parse_args(["run", "--launcher-image", image]).launcher_image == image


@pytest.mark.parametrize(("status", "body", "warned"), [
    (403, b'{"kind":"Status","status":"Failure","reason":"Forbidden","code":403}', False),
    (503, b"upstream connect error or disconnect/reset before headers", True),
    (200, b"<html><body>Sign in to the corporate proxy</body></html>", False),
])
def test_any_answer_of_the_api_server_lets_the_operator_start(
        status: int, body: bytes, warned: bool, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The start check stops `infertune run` only for credentials refused (401), a
    certificate not trusted, or no answer at all. Any other answer says the server is there:
    a 403 where /version is not public, a 5xx while it restarts (said, then kopf tries again
    as usual), a proxy's page. Each is taken at its first try, not retried for a minute."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from kubernetes import config

    from infertune.kube import client as kube_client

    asked: list[str] = []

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    path = _kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setattr(client.Configuration, "_default", None)  # put back after the test
    try:
        config.load_kube_config(str(path))
        with caplog.at_level("WARNING", logger=kube_client.__name__):
            kube_client.check_api_server(attempts=3, pause_s=0.0)
    finally:
        server.shutdown()
        server.server_close()
    assert asked == ["/version/"], asked
    said = [r.getMessage() for r in caplog.records if r.name == kube_client.__name__]
    if warned:
        assert said == [f"the API server at http://127.0.0.1:{server.server_address[1]} "
                        f"answered {status} Service Unavailable; starting, and trying again "
                        "as usual"], said
    else:
        assert said == [], said
