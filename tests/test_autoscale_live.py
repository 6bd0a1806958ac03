"""`autoscale evaluate --live`: whether the operator would write, from what it stores."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from infertune.api.spec import InferenceTuning
from infertune.autoscale_cli import why_written
from infertune.autoscale_live import Live
from infertune.cli import main
from infertune.controller.fights import Fight
from infertune.controller.scaling_report import Blocked
from infertune.scaling.engine import ScaleAction, ScaleDecision
from infertune.scaling.state import ScalingState, format_time

NOW = 1_800_000_000.0


def tuning(mode: str = "Enforce", **autoscaling: Any) -> InferenceTuning:
    return InferenceTuning.model_validate({
        "metadata": {"name": "qwen", "namespace": "serving"},
        "spec": {"targetRef": {"name": "qwen"}, "engine": "vllm", "mode": mode,
                 "autoscaling": autoscaling}})


def live(hpa: str | None = None, fight: Fight | None = None) -> Live:
    status: dict[str, Any] = {"autoscaling": {} if fight is None else {
        "replicaFight": fight.to_json()}}
    return Live(tuning(), 3, status, 1, hpa)


def test_an_hpa_on_the_deployment_blocks_writes() -> None:
    blocked = live(hpa="qwen-hpa").blocked(3, NOW)
    assert blocked is not None and blocked.reason == "HorizontalPodAutoscalerPresent"
    assert "HorizontalPodAutoscaler qwen-hpa also scales qwen" in blocked.message


@pytest.mark.parametrize(("retry_in", "blocks"), [(60.0, True), (-1.0, False)])
def test_a_stored_fight_blocks_until_its_retry_time(retry_in: float, blocks: bool) -> None:
    fight = Fight(2, NOW - 100, NOW - 10, 1, NOW + retry_in)
    blocked = live(fight=fight).blocked(3, NOW)
    assert (blocked is not None and blocked.reason == "ReplicaFight") is blocks


def test_the_preview_counts_a_revert_as_the_operator_would() -> None:
    """One revert stored, and the replicas the operator wrote (8) put back to 4 since: the
    operator's next evaluation counts the second revert and stops writing; the preview said
    it would write. After a spec change the stored fight is over, and the preview still said
    ReplicaFight."""
    once = Fight(1, NOW - 100, NOW - 100, 1, None).to_json()
    status = {"autoscaling": {"replicaFight": once, "writtenReplicas": 8}}
    reverted = Live(tuning(), 4, status, 1, None)
    blocked = reverted.blocked(4, NOW)
    assert blocked is not None and blocked.reason == "ReplicaFight"
    assert reverted.blocked(8, NOW) is None  # still what it wrote: no revert
    backing_off = Fight(2, NOW - 100, NOW - 10, 1, NOW + 60).to_json()
    changed = Live(tuning(), 4, {"autoscaling": {"replicaFight": backing_off}}, 2, None)
    assert changed.blocked(4, NOW) is None  # generation 2: the fight ended with the spec


def test_the_preview_counts_no_revert_where_the_operator_counts_none() -> None:
    """The operator's own scale write set the replicas last (its status write was lost), or
    the tuning is in DryRun: the operator counts no revert, and the preview said it had
    stopped writing (ReplicaFight) at 3 a.m., in exactly the crash it was run to look at."""
    once = Fight(1, NOW - 100, NOW - 100, 1, None).to_json()
    status = {"autoscaling": {"replicaFight": once, "writtenReplicas": 4}}
    own = Live(tuning(), 6, status, 1, None, own_write_last=True)
    assert own.blocked(6, NOW) is None
    dry = Live(tuning("DryRun"), 6, status, 1, None)
    assert dry.blocked(6, NOW) is None
    # Neither: the same counts are a second revert.
    blocked = Live(tuning(), 6, status, 1, None).blocked(6, NOW)
    assert blocked is not None and blocked.reason == "ReplicaFight"


@pytest.mark.parametrize(("owners", "blocks"), [
    ((("infertune", "scale"),), False), ((("argocd-controller", ""),), True)])
def test_read_live_passes_on_who_set_the_replicas_last(
        monkeypatch: pytest.MonkeyPatch, owners: tuple[tuple[str, str], ...],
        blocks: bool) -> None:
    """The preview reads the Deployment's managedFields as the operator does: its own scale
    write last is no revert."""
    from infertune.kube.client import DeploymentReplicas

    live = live_of(monkeypatch, {"writtenReplicas": 4}, DeploymentReplicas(
        6, 6, {"containers": [{"name": "vllm", "image": "v"}]}, owners))
    blocked = live.blocked(6, NOW)
    assert (blocked is not None and blocked.reason == "ReplicaFight") is blocks, blocked


def live_of(monkeypatch: pytest.MonkeyPatch, autoscaling: dict[str, Any],
            read: Any) -> Live:
    """`read_live` of tuning serving/qwen, with one revert stored beside `autoscaling` (its
    status.autoscaling), over a cluster whose Deployment reads as `read` and has no HPA."""
    from infertune import autoscale_live
    from infertune.kube import client as kube_client

    once = Fight(1, NOW - 100, NOW - 100, 1, None).to_json()
    body = {"apiVersion": "infertune.io/v1alpha1", "kind": "InferenceTuning",
            "metadata": {"name": "qwen", "namespace": "serving", "generation": 1},
            "spec": {"targetRef": {"name": "qwen"}, "engine": "vllm", "autoscaling": {}},
            "status": {"autoscaling": {"replicaFight": once, **autoscaling}}}

    class Tunings:
        def get_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return body

        def list_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return {"items": [body]}

    class Autoscalers:
        def list_namespaced_horizontal_pod_autoscaler(self, *args: Any, **kwargs: Any) -> Any:
            return client.V2HorizontalPodAutoscalerList(items=[])

    monkeypatch.setattr(kube_client, "configure", lambda *args: None)
    monkeypatch.setattr(kube_client, "deployment_replicas", lambda *args: read)
    monkeypatch.setattr(client, "CustomObjectsApi", Tunings)
    monkeypatch.setattr(client, "AutoscalingV2Api", Autoscalers)
    return autoscale_live.read_live("serving/qwen", None)


def decision(current: int, desired: int) -> ScaleDecision:
    action = ScaleAction.HOLD if current == desired else ScaleAction.SCALE_OUT
    return ScaleDecision(current, desired, action, "why", None, ScalingState(),  # type: ignore[arg-type]
                         ScalingState())


@pytest.mark.parametrize(("mode", "desired", "blocked", "written", "says"), [
    ("Enforce", 5, None, 5, "the operator writes 5 replicas"),
    ("Enforce", 3, None, None, "nothing to write"),
    ("DryRun", 5, None, None, "not written: mode DryRun"),
    ("Enforce", 5, Blocked("ReplicaFight", "reverted twice"), None,
     "not written (ReplicaFight): reverted twice"),
])
def test_the_write_is_explained(mode: str, desired: int, blocked: Blocked | None,
                                written: int | None, says: str) -> None:
    assert why_written(tuning(mode), decision(3, desired), blocked, written).startswith(says)


@pytest.mark.parametrize(("kubeconfig", "says"), [
    ("apiVersion: v1\nkind: Config\ncurrent-context: x\n"
     "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
     "users: [{name: u, user: {token: t}}]\n"
     "contexts: [{name: x, context: {cluster: c, user: u}}]\n",
     "--live: the cluster cannot be reached"),
    ("a: [\n", "--live: the kubeconfig is not valid YAML"),
    (b"\xff\xfe\x00k", "--live: the kubeconfig is not UTF-8 text; check --kubeconfig"),
    ("just a string\n", "--live: the kubeconfig is not one (TypeError"),
    # A certificate in base64 that is not (it printed "Invalid base64-encoded string" alone).
    ("apiVersion: v1\nkind: Config\ncurrent-context: x\n"
     "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', "
     "certificate-authority-data: 'abc'}}]\n"
     "users: [{name: u, user: {token: t}}]\n"
     "contexts: [{name: x, context: {cluster: c, user: u}}]\n",
     "--live: the kubeconfig is not one (base64 data in it does not decode: "),
    (None, "no such file; give a kubeconfig file this user can read"),  # not "pass it"
])
def test_a_cluster_that_cannot_be_read_is_a_message_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kubeconfig: str | bytes | None,
        says: str) -> None:
    path = tmp_path / "kubeconfig"
    if isinstance(kubeconfig, bytes):
        path.write_bytes(kubeconfig)
    elif kubeconfig is not None:
        path.write_text(kubeconfig)
    try:
        code = main(["autoscale", "evaluate", "--live", "ml/qwen", "--kubeconfig", str(path),
                     "--prometheus", "http://127.0.0.1:1"])
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
    assert code == 1
    assert says in capsys.readouterr().err


class _NotAnApiServer(BaseHTTPRequestHandler):
    """Answers every request 200 with a web page, or with `body` when the test sets one."""

    body = b"<html><body>Sign in</body></html>"
    content_type = "text/html"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.mark.parametrize(("body", "content_type"), [
    (b"<html><body>Sign in</body></html>", "text/html"),
    (b'{"status": "ok"}', "application/json"),
])
def test_a_server_that_is_no_api_server_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], body: bytes,
        content_type: str) -> None:
    """A kubeconfig pointing at a web server that answers 200: its page was validated as the
    tuning, and the message said that the spec's metadata was required."""
    handler = type("Handler", (_NotAnApiServer,), {"body": body, "content_type": content_type})
    code, url = _evaluate_live_against(handler, tmp_path)
    err = capsys.readouterr().err
    assert code == 1
    assert f"--live: the server at {url} did not answer as a Kubernetes API server" in err, err
    assert "check the server in the kubeconfig" in err and "metadata" not in err


def test_batching_off_over_a_stored_batching_block_is_previewed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Batching turned Off after Auto applied a value: the operator removes status.batching
    (its patch sends null), and the preview read that null as a block, with a traceback."""
    from infertune.autoscale_cli import evaluate
    from infertune.metrics.prometheus import PrometheusSource
    from infertune.scaling.signals import Series, TargetSignals, Window

    def fetch(self: PrometheusSource, targets: list[Any], now: float) -> dict[str, Any]:
        window = Window.of_points([(now - 30 + i, 5.0) for i in range(31)], now, 30.0, 1.0,
                                  32.0)
        steady = Series(((now - 15, 0.05), (now, 0.05)), 15.0)
        return {t.key: TargetSignals(window, steady, steady) for t in targets}

    monkeypatch.setattr(PrometheusSource, "fetch", fetch)
    stored = {"batching": {"knob": "max-num-seqs", "recommended": 32, "applied": 32}}
    result = evaluate(tuning(), "http://127.0.0.1:9", None, 1.0, NOW,
                      live=Live(tuning(), 3, stored, 1, None))
    assert result["batching"] is None


def _kubeconfig(path: Path, url: str) -> Path:
    path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: x\n"
                    f"clusters: [{{name: c, cluster: {{server: '{url}'}}}}]\n"
                    "users: [{name: u, user: {token: t}}]\n"
                    "contexts: [{name: x, context: {cluster: c, user: u}}]\n")
    return path


def _evaluate_live_against(handler: type[BaseHTTPRequestHandler], tmp_path: Path,
                           *options: str) -> tuple[int, str]:
    """(the exit code of `autoscale evaluate --live ml/qwen` against `handler` served as the
    API server, the server's URL)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        return main(["autoscale", "evaluate", "--live", "ml/qwen", "--kubeconfig",
                     str(_kubeconfig(tmp_path / "kubeconfig", url)), "--prometheus",
                     "http://127.0.0.1:1", *options]), url
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
        server.shutdown()
        server.server_close()


def test_an_api_server_that_never_answers_costs_the_timeout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A server that takes the connection and says nothing (a load balancer without a
    backend): --timeout was Prometheus's only, and each read waited the client's 60 s, sent
    again three times."""
    held: list[socket.socket] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.1)

        def accept() -> None:  # taken, never answered
            while not stop.is_set():
                try:
                    held.append(listener.accept()[0])
                except OSError:
                    continue

        stop = threading.Event()
        threading.Thread(target=accept, daemon=True).start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        try:
            code = main(["autoscale", "evaluate", "--live", "ml/qwen", "--kubeconfig",
                         str(_kubeconfig(tmp_path / "kubeconfig", url)), "--prometheus",
                         "http://127.0.0.1:1", "--timeout", "0.5"])
        finally:
            client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
            stop.set()
        took = time.monotonic() - started
        for connection in held:
            connection.close()
    err = capsys.readouterr().err
    assert code == 1
    assert "--live: the cluster cannot be reached (" in err and "timed out" in err, err
    assert len(held) == 1  # sent once: not again after its read timed out
    assert took < 30, took  # one read of 0.5 s, not minutes


class _ApiServerButTheDeployment(_NotAnApiServer):
    """The tuning as an API server has it; the Deployment read answered by a web page."""

    def do_GET(self) -> None:
        if "/inferencetunings/" not in self.path:
            super().do_GET()
            return
        body = json.dumps({"apiVersion": "infertune.io/v1alpha1", "kind": "InferenceTuning",
                           "metadata": {"name": "qwen", "namespace": "ml", "generation": 1},
                           "spec": tuning().spec.model_dump(mode="json", by_alias=True,
                                                            exclude_none=True)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_deployment_read_that_is_no_api_answer_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It said "Expecting value: line 1 column 1 (char 0)" and nothing else."""
    code, url = _evaluate_live_against(_ApiServerButTheDeployment, tmp_path)
    err = capsys.readouterr().err
    assert code == 1
    assert (f"--live: the server at {url} did not answer as a Kubernetes API server "
            "(Deployment ml/") in err, err


@pytest.mark.parametrize(("answers", "says"), [
    # Sent again once, after the wait (at most --timeout, not the 30 s asked for).
    ([(429, "30"), (404, None)], "--live: InferenceTuning ml/qwen not found"),
    ([(503, "1"), (404, None)], "--live: InferenceTuning ml/qwen not found"),
    # Throttled twice: said so (it read "cannot be reached" once urllib3 gave up).
    ([(429, "0"), (429, "0")], "--live: InferenceTuning ml/qwen not read: the API server is "
                               "throttling requests (HTTP 429); try again in a moment"),
])
def test_a_request_the_api_server_asks_to_send_again_is_sent_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        answers: list[tuple[int, str | None]], says: str) -> None:
    """API Priority and Fairness answers 429 with Retry-After under load: sent once only, the
    read ended as "not readable (HTTP 429)", which reads like a missing permission; sent
    again, it waited whatever the server asked (hours), whatever --timeout said."""
    asked: list[str] = []

    class Busy(_NotAnApiServer):
        def do_GET(self) -> None:
            asked.append(self.path)
            status, after = answers[min(len(asked), len(answers)) - 1]
            body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "code": status, **({"details": {
                                   "name": "qwen", "group": "infertune.io",
                                   "kind": "inferencetunings"}} if status == 404 else {})}
                              ).encode()
            self.send_response(status)
            if after is not None:
                self.send_header("Retry-After", after)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    started = time.monotonic()
    code, _ = _evaluate_live_against(Busy, tmp_path, "--timeout", "1")
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 1 and len(asked) == 2, asked
    assert says in err, err
    assert took < 15, took


@pytest.mark.parametrize(("created", "blocks"), [
    (NOW - 86400, True),  # the Deployment the operator wrote to: a second revert
    (NOW - 50, False),  # created again after the last evaluation: another object
    (float(int(NOW - 99.6)), False),  # ... in the very second of it
])
def test_read_live_sees_a_deployment_created_again_as_the_operator_does(
        monkeypatch: pytest.MonkeyPatch, created: float, blocks: bool) -> None:
    """evaluate --live counted a revert where the operator counts none: the Deployment was
    deleted and created again from Git since the last evaluation. And the writer named in
    the fight is the one the managedFields say, as in the operator's condition."""
    from infertune.kube.client import DeploymentReplicas

    live = live_of(monkeypatch, {"writtenReplicas": 4, "evaluated": format_time(NOW - 99.6)},
                   DeploymentReplicas(6, 6, {"containers": [{"name": "vllm", "image": "v"}]},
                                      (("argocd-controller", ""),), created=created))
    blocked = live.blocked(6, NOW)
    assert (blocked is not None and blocked.reason == "ReplicaFight") is blocks, blocked
    if blocked is not None:
        assert blocked.message.startswith("another writer (argocd-controller, as the "
                                          "Deployment's managedFields say)")


def _busy_fetch(monkeypatch: pytest.MonkeyPatch, queue: float) -> None:
    """Prometheus answers a queue of `queue` requests held for 30 s, and a low latency."""
    from infertune.metrics.prometheus import PrometheusSource
    from infertune.scaling.signals import Series, TargetSignals, Window

    def fetch(self: PrometheusSource, targets: list[Any], now: float) -> dict[str, Any]:
        window = Window.of_points([(now - 30 + i, queue) for i in range(31)], now, 30.0, 1.0,
                                  32.0)
        steady = Series(((now - 15, 0.05), (now, 0.05)), 15.0)
        return {t.key: TargetSignals(window, steady, steady) for t in targets}

    monkeypatch.setattr(PrometheusSource, "fetch", fetch)


def test_the_preview_counts_a_scale_the_status_lost_as_the_operator_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator wrote 4 -> 8 and stopped before its status write: its next evaluation
    counts the +4 in the scale-up rate limit (autoscaling._lost_scale_event) and holds at 8;
    the preview, run at 3 a.m. for exactly that crash, said it would write 16."""
    from infertune.autoscale_cli import evaluate

    _busy_fetch(monkeypatch, 75.0)  # per replica, at 8: the queue calls for 19
    status = {"autoscaling": {"target": "qwen", "writtenReplicas": 4, "writtenTarget": "qwen",
                              "currentReplicas": 4}}
    spec = tuning(maxReplicas=32)
    crashed = Live(spec, 8, status, 1, None, own_write_last=True)
    result = evaluate(spec, "http://127.0.0.1:9", None, 1.0, NOW, live=crashed)
    assert (result["action"], result["desiredReplicas"]) == ("Hold", 8), result["reason"]
    assert "scale-up limited" in result["reason"], result["reason"]
    assert any(n.startswith("replicas +4 were the operator's own write")
               for n in result["write"]["notes"]), result["write"]
    # Set by someone else (or the status holds it): no scale of the operator's is lost.
    theirs = evaluate(spec, "http://127.0.0.1:9", None, 1.0, NOW,
                      live=Live(spec, 8, status, 1, None))
    assert theirs["write"]["notes"] == [] and theirs["desiredReplicas"] == 16, theirs["reason"]


def test_the_preview_says_when_it_decided_and_when_the_operator_decides_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rate-limit period or a window that ends before the operator's next slot does not
    hold it then: the answer says the time it is for, and the operator's next evaluation."""
    from infertune.autoscale_cli import _text, evaluate

    _busy_fetch(monkeypatch, 5.0)
    at = NOW + 7  # NOW is a multiple of the 15 s interval
    done = {"autoscaling": {"evaluated": format_time(NOW)}}  # this slot's made
    result = evaluate(tuning(), "http://127.0.0.1:9", None, 1.0, at,
                      live=Live(tuning(), 3, done, 1, None))
    assert result["evaluatedAt"] == format_time(at)
    assert result["operatorNextEvaluation"] == format_time(NOW + 15)
    assert (f"as of {format_time(at)}; the operator's next evaluation is the one of "
            f"{format_time(NOW + 15)}") in _text(result, 0.075)
    # This slot's not made yet (the operator is late, or the tuning new): it is next.
    # A stamp after the slot (a clock ahead) is not one of it, for the operator either.
    for stored in ({"autoscaling": {"evaluated": format_time(NOW - 15)}}, {},
                   {"autoscaling": {"evaluated": format_time(NOW + 60)}}):
        due = evaluate(tuning(), "http://127.0.0.1:9", None, 1.0, NOW + 2,
                       live=Live(tuning(), 3, stored, 1, None))
        assert due["operatorNextEvaluation"] == format_time(NOW), stored
    # From a file the tuning may run nowhere: no operator's evaluation is named.
    alone = evaluate(tuning(), "http://127.0.0.1:9", None, 1.0, at)
    assert alone["operatorNextEvaluation"] is None
    assert f"as of {format_time(at)}\n" in _text(alone, 0.075)


def test_windows_stored_for_another_deployment_are_said_not_to_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """spec.targetRef changed: the operator starts the new Deployment's windows afresh
    (plan_evaluation), and the preview said "stored by the operator"."""
    from infertune.autoscale_cli import _text, evaluate

    _busy_fetch(monkeypatch, 5.0)
    state = ScalingState(scale_events=()).to_json()
    stored = {"autoscaling": {"target": "llama", "state": state}}
    result = evaluate(tuning(), "http://127.0.0.1:9", None, 1.0, NOW,
                      live=Live(tuning(), 3, stored, 1, None))
    assert result["state"] == "empty"
    assert ("stabilization and rate-limit windows: empty (the stored ones are another "
            "Deployment's: see the notes)") in _text(result, 0.075)
    assert result["write"]["notes"][0].startswith(
        "status.autoscaling holds the windows of Deployment llama (spec.targetRef before)")
    own = evaluate(tuning(), "http://127.0.0.1:9", None, 1.0, NOW,
                   live=Live(tuning(), 3, {"autoscaling": {"target": "qwen"}}, 1, None))
    assert own["state"] == "status.autoscaling.state" and own["write"]["notes"] == []


def test_the_other_deployment_of_the_stored_windows_is_printed_escaped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """status.autoscaling.target was printed as stored: a newline in it printed a line of
    its own, which read as the evaluation's ("reason: ..."), and escape sequences reached
    the terminal."""
    from infertune.autoscale_cli import _text, evaluate

    _busy_fetch(monkeypatch, 5.0)
    forged = "llama\nreason: all good\x1b[2J"
    result = evaluate(tuning(), "http://127.0.0.1:9", None, 1.0, NOW,
                      live=Live(tuning(), 3, {"autoscaling": {"target": forged}}, 1, None))
    text = _text(result, 0.075)
    assert ("note: status.autoscaling holds the windows of Deployment "
            "llama\\nreason: all good\\x1b[2J (spec.targetRef before)") in text, text
    assert "\x1b" not in text and "\nreason: all good" not in text


class _ApiServerAnswering(_NotAnApiServer):
    """The tuning and its Deployment as an API server has them; `lists` answers the list of
    each other resource read (by a word of its path), a web page where it gives none."""

    deployment: Any = {"apiVersion": "apps/v1", "kind": "Deployment",
                       "metadata": {"name": "qwen", "namespace": "ml", "generation": 1},
                       "spec": {"replicas": 3, "template": {"spec": {"containers": []}}}}
    lists: dict[str, Any] = {}
    status: Any = None
    """The tuning's status, none when None."""
    generation: Any = 1

    def do_GET(self) -> None:
        if "/inferencetunings/" in self.path:
            answer: Any = {"apiVersion": "infertune.io/v1alpha1", "kind": "InferenceTuning",
                           "metadata": {"name": "qwen", "namespace": "ml",
                                        "generation": self.generation},
                           "spec": tuning().spec.model_dump(mode="json", by_alias=True,
                                                            exclude_none=True),
                           **({} if self.status is None else {"status": self.status})}
        elif "/deployments/" in self.path:
            answer = self.deployment
        else:
            answer = next((v for k, v in self.lists.items() if k in self.path), None)
            if answer is None:
                super().do_GET()
                return
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize(("deployment", "lists", "read"), [
    ([1, 2], {}, "Deployment ml/qwen"),
    # Printed whole as the current replicas, and in the reason.
    ({**_ApiServerAnswering.deployment, "spec": {"replicas": int("9" * 4000), "template": {
        "spec": {"containers": []}}}}, {}, "Deployment ml/qwen (spec.targetRef), whose "
     "replicas are no 32-bit count"),
    ({**_ApiServerAnswering.deployment, "status": {"readyReplicas": -1}}, {},
     "Deployment ml/qwen (spec.targetRef), whose replicas are no 32-bit count"),
    ({"spec": "x"}, {}, "Deployment ml/qwen"),
    (_ApiServerAnswering.deployment, {}, "HorizontalPodAutoscalers in ml"),
    (_ApiServerAnswering.deployment, {"horizontalpodautoscalers": {"items": []},
                                      "inferencetunings": {"kind": "Status"}},
     "InferenceTunings in ml"),
])
def test_an_answer_that_is_no_kubernetes_object_names_the_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], deployment: Any,
        lists: dict[str, Any], read: str) -> None:
    """A proxy or a stand-in between the command and the cluster that answers 200 with
    something else: a traceback (AttributeError, KeyError 'items'), or "Expecting value: line
    1 column 1 (char 0)" naming no read."""
    handler = type("Handler", (_ApiServerAnswering,), {"deployment": deployment,
                                                        "lists": lists})
    code, url = _evaluate_live_against(handler, tmp_path)
    err = capsys.readouterr().err
    assert code == 1
    assert (f"--live: the server at {url} did not answer as a Kubernetes API server "
            f"({read}") in err, err


@pytest.mark.parametrize(("status", "generation", "says"), [
    ("hello", 1, "status is no object"),
    (5, 1, "status is no object"),
    ({"autoscaling": "hello"}, 1, "status.autoscaling is no object"),
    ({}, "abc", "metadata.generation is no integer"),
])
def test_a_tuning_no_api_server_would_hold_names_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], status: Any, generation: Any,
        says: str) -> None:
    """A stand-in for the API server that answers a tuning whose status the CRD's schema
    refuses: said in Python's words ("dictionary update sequence element #0 has length 1;
    2 is required", "invalid literal for int()"), or a TypeError's traceback."""
    handler = type("Handler", (_ApiServerAnswering,), {
        "status": status, "generation": generation,
        "lists": {"horizontalpodautoscalers": {"items": []},
                  "inferencetunings": {"items": []}}})
    code, url = _evaluate_live_against(handler, tmp_path)
    err = capsys.readouterr().err
    assert code == 1
    assert (f"--live: the server at {url} did not answer as a Kubernetes API server "
            f"(InferenceTuning ml/qwen, whose {says}); check the server in the kubeconfig") \
        in err, err


def test_an_empty_kubeconfig_option_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """`--kubeconfig "$KCFG"` with the variable unset: taken as not given, the default
    credentials evaluated a tuning of whatever cluster they name, and said nothing."""
    for command in (["autoscale", "evaluate", "--live", "ml/qwen", "--prometheus",
                     "http://127.0.0.1:1"], ["run"]):
        with pytest.raises(SystemExit) as refused:
            main([*command, "--kubeconfig", ""])
        assert refused.value.code == 2
        assert "argument --kubeconfig: an empty path" in capsys.readouterr().err


@pytest.mark.parametrize(("body", "says"), [
    # Prometheus, or a web server, at the kubeconfig's address: "not found" sent the user
    # looking for an object that was there, not at the kubeconfig.
    (b"404 page not found", "did not answer as a Kubernetes API server (HTTP 404 without a "
                            "Kubernetes Status for InferenceTuning ml/qwen)"),
    # The API server's 404 for a path it does not serve: no object named in it.
    (json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                 "reason": "NotFound", "message": "the server could not find the requested "
                 "resource", "details": {}}).encode(),
     "--live: InferenceTuning ml/qwen not found, nor its kind: the API server serves no "
     "inferencetunings.infertune.io (is the CRD installed?)"),
])
def test_a_404_says_whether_the_object_its_kind_or_the_server_is_missing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], body: bytes, says: str) -> None:
    class NotFound(_NotAnApiServer):
        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    code, _ = _evaluate_live_against(NotFound, tmp_path)
    err = capsys.readouterr().err
    assert code == 1 and says in err, err
