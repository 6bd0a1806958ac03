"""`autoscale evaluate TUNING.yaml`: the operator's evaluation of a new tuning, as the command
prints it. Prometheus answers with recorded signals (the adapter has its own tests against the
real server in test_prometheus_adapter.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infertune.autoscale_cli import EXIT_STATUS, FILE_WRITE_NOTE
from infertune.cli import main
from infertune.controller.scaling_report import NOTHING_TUNES_BATCHING
from infertune.metrics.prometheus import PrometheusSource
from infertune.metrics.source import MetricsTarget
from infertune.scaling.signals import Series, TargetSignals, Window

Answer = Callable[[float], TargetSignals]
"""The signals Prometheus answers with for an evaluation at a time."""


def measured(queue: float, latency_s: float, rate: float = 10.0) -> Answer:
    """A queue per replica steady over the 30s sustain window, and two latency samples (the
    default consecutiveSamples) an interval apart, as the adapter returns them."""
    def at(now: float) -> TargetSignals:
        window = Window.of_points([(now - 30 + i, queue) for i in range(31)], now, 30.0, 1.0,
                                  32.0)
        return TargetSignals(window, Series(((now - 15, latency_s), (now, latency_s)), 15.0),
                             Series(((now - 15, rate), (now, rate)), 15.0))
    return at


def nothing(now: float) -> TargetSignals:
    return TargetSignals(Window.missing("no series for Deployment serving/llm", "q"),
                         Series.missing("no series for Deployment serving/llm", "l"),
                         Series.missing("no series for Deployment serving/llm", "r"))


@pytest.fixture
def prometheus(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Answer], None]]:
    """Makes Prometheus answer every query with the given signals."""
    def answer(signals: Answer) -> None:
        def fetch(self: PrometheusSource, targets: list[MetricsTarget],
                  now: float) -> dict[str, TargetSignals]:
            return {t.key: signals(now) for t in targets}
        monkeypatch.setattr(PrometheusSource, "fetch", fetch)
    yield answer


def evaluated(tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str = "json",
              replicas: int = 4, beside: tuple[dict[str, Any], ...] = (),
              **spec: Any) -> tuple[int, str]:
    """Evaluates tuning serving/llm with `spec`, the documents `beside` it in its file."""
    path = tmp_path / "tuning.yaml"
    path.write_text(yaml.safe_dump_all([{
        "apiVersion": "infertune.io/v1alpha1", "kind": "InferenceTuning",
        "metadata": {"name": "llm", "namespace": "serving"},
        "spec": {"targetRef": {"name": "llm"}, "engine": "vllm",
                 "autoscaling": {"minReplicas": 1, "maxReplicas": 20}, **spec}}, *beside]))
    code = main(["autoscale", "evaluate", str(path), "--prometheus", "http://127.0.0.1:9",
                 "--replicas", str(replicas), "--output", output])
    return code, capsys.readouterr().out


def test_a_file_gets_the_reason_the_operator_gives(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        prometheus: Callable[[Answer], None]) -> None:
    """A breach with a low queue is the batching's to act on. With batching Off (the
    default) nothing lowers the batch, so latency.action Auto scales out; with action
    TuneBatching the operator's reason says that nothing acts on it. The file's decision came
    from the engine alone and left both out."""
    prometheus(measured(queue=5.0, latency_s=0.15))
    code, out = evaluated(tmp_path, capsys)
    result = json.loads(out)
    assert code == 0
    assert {"signals", "desiredReplicas", "action", "reason"} <= set(result)
    assert (result["action"], result["desiredReplicas"]) == ("ScaleOut", 8)
    assert "but spec.batching.mode is Off, so nothing lowers the batch: scale out -> 8" \
        in result["reason"]
    assert result["batching"] is None  # Off: no step
    code, out = evaluated(tmp_path, capsys, autoscaling={
        "minReplicas": 1, "maxReplicas": 20, "latency": {"action": "TuneBatching"}})
    result = json.loads(out)
    assert (result["action"], result["desiredReplicas"]) == ("TuneBatching", 4)
    assert result["reason"].endswith(NOTHING_TUNES_BATCHING)
    code, out = evaluated(tmp_path, capsys, batching={"mode": "Recommend"})
    result = json.loads(out)
    assert (result["action"], result["desiredReplicas"]) == ("TuneBatching", 4)
    assert "spec.batching.mode is Off" not in result["reason"]
    assert result["reason"].endswith(
        f"mode Recommend applies nothing: set --max-num-seqs={result['batching']['recommended']}"
        " on the pod template (status.batching.recommended) where the value in use is above "
        "it (it is not known here: this is a step down from spec.batching.max), or "
        "spec.batching.mode to Auto")
    assert "lower max-num-seqs" in result["batching"]["reason"]


def deployment(namespace: str) -> dict[str, Any]:
    """Deployment llm, its pods run with --max-num-seqs 64."""
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "llm", "namespace": namespace},
            "spec": {"template": {"spec": {"containers": [{
                "name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                "command": ["vllm", "serve", "Qwen/Qwen2-7B-Instruct", "--max-num-seqs",
                            "64"]}]}}}}


@pytest.mark.parametrize(("namespace", "says"), [
    ("serving", "from 64 (on the pod template)"),
    # Another namespace's Deployment of that name is not the target: its knob was taken.
    ("staging", "current setting unknown"),
])
def test_batching_steps_from_the_target_in_the_tunings_namespace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        prometheus: Callable[[Answer], None], namespace: str, says: str) -> None:
    prometheus(measured(queue=5.0, latency_s=0.15))
    code, out = evaluated(tmp_path, capsys, beside=(deployment(namespace),),
                          batching={"mode": "Recommend"})
    assert code == 0
    assert says in json.loads(out)["batching"]["reason"], out


@pytest.mark.parametrize(("mode", "why", "notes"), [
    ("DryRun", "not written: mode DryRun", []),
    ("Enforce", "the operator writes 6 replicas through deployments/scale", [FILE_WRITE_NOTE]),
])
def test_a_file_says_whether_the_replicas_would_be_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        prometheus: Callable[[Answer], None], mode: str, why: str, notes: list[str]) -> None:
    """A DryRun tuning's scale out read as one the operator would make."""
    prometheus(measured(queue=48.0, latency_s=0.05))
    code, out = evaluated(tmp_path, capsys, mode=mode)
    result = json.loads(out)
    assert code == 0
    assert (result["action"], result["desiredReplicas"]) == ("ScaleOut", 6)
    assert result["write"] == {"replicas": 6 if mode == "Enforce" else None, "why": why,
                               "notes": notes}
    code, out = evaluated(tmp_path, capsys, output="text", mode=mode)
    assert (code, f"write: {why}" in out.splitlines()) == (0, True), out


def test_the_text_says_no_data_and_rounds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        prometheus: Callable[[Answer], None]) -> None:
    """It printed Python's None and every digit of a float ("at 6.921833333333333 req/s");
    the JSON keeps the values as they are."""
    prometheus(measured(queue=6.9218333333, latency_s=0.1234567, rate=6.921833333333333))
    code, out = evaluated(tmp_path, capsys, output="text")
    assert "queue per replica: 6.92" in out.splitlines()
    assert "latency (p99): 123.5ms at 6.92 req/s, 2 samples above target" in out.splitlines()
    code, out = evaluated(tmp_path, capsys)
    signals = json.loads(out)["signals"]
    assert (signals["requestRate"], signals["latencySeconds"]) == (6.921833333333333, 0.1234567)
    prometheus(nothing)
    code, out = evaluated(tmp_path, capsys, output="text")
    assert code == 3
    assert "None" not in out, out
    assert "queue per replica: no data" in out.splitlines()
    assert "latency (p99): no data at an unknown request rate, 0 samples above target" in \
        out.splitlines()
    code, out = evaluated(tmp_path, capsys)
    assert json.loads(out)["signals"]["queuePerReplica"] is None


def test_the_text_says_a_latency_under_the_lowest_bucket_as_status_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        prometheus: Callable[[Answer], None]) -> None:
    """vLLM's histogram starts at 300 ms: a P99 under it reads as a fraction of the bound.
    The text printed "latency (p99): 297ms" as if measured, where status.autoscaling.p99 and
    the Latency column say "<=300ms"."""
    def under(now: float) -> TargetSignals:
        return measured(queue=20.0, latency_s=0.297)(now)._replace(latency_floor_s=0.3)

    prometheus(under)
    code, out = evaluated(tmp_path, capsys, output="text")
    assert code == 3  # MetricsAvailable False: LatencyTargetBelowResolution
    assert ("latency (p99): <=300ms (under the histogram's lowest bucket) at 10 req/s, 0 "
            "samples above target") in out.splitlines(), out
    code, out = evaluated(tmp_path, capsys)
    signals = json.loads(out)["signals"]
    assert (signals["latencySeconds"], signals["latencyFloorSeconds"]) == (0.297, 0.3)


def test_the_text_says_a_failed_query_once_and_gives_the_query_on_its_own_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Prometheus not reachable (nothing listens on port 9 here): each problem line carried
    its 2 KB query, which the query lines give again, and the one fact that mattered was
    hard to find. The JSON keeps the query in each problem, as the condition has it."""
    code, out = evaluated(tmp_path, capsys, output="text")
    assert code == 3
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert problems == [f"problem: {signal}: Prometheus at http://127.0.0.1:9 failed: cannot "
                        "connect (refused or unreachable)"
                        for signal in ("queue", "latency", "requestRate")], problems
    queries = [line for line in out.splitlines() if line.startswith("query (")]
    assert len(queries) == 3 and all("vllm:" in q for q in queries), queries
    code, out = evaluated(tmp_path, capsys)
    assert all(" (query: " in p for p in json.loads(out)["signals"]["problems"])


def test_usage_errors_exit_2_as_the_help_says(capsys: pytest.CaptureFixture[str]) -> None:
    """The help listed 0, 1 and 3; argparse ends a command line it cannot parse with 2, as
    for every command."""
    for replicas in ("two", "-1", "999999999999999999999"):  # spec.replicas is 32-bit
        with pytest.raises(SystemExit) as exited:
            main(["autoscale", "evaluate", "t.yaml", "--prometheus", "http://p:9090",
                  "--replicas", replicas])
        assert exited.value.code == 2
    assert "argument --replicas: 999999999999999999999 is not a Deployment's replica count " \
        "from 0 to 2147483647" in capsys.readouterr().err
    # A value of the wrong form is such a command line too: these ended with 1, as bad input.
    for option, said in (
            (["--prometheus", "ftp://p"], "argument --prometheus/--prometheus-url: Prometheus "
             "URL 'ftp://p' must start with http:// or https://"),
            (["--prometheus", "http://p:99999"], "the port is not a number from 1 to 65535"),
            (["--prometheus", "http://me:secret@p:9090"], "'http://***@p:9090' holds a user "
             "and password"),
            (["--prometheus", "http://p:9090", "--live", "ab"], "argument --live: expected "
             "NAMESPACE/NAME, for example serving/qwen"),
            (["--prometheus", "http://p:9090", "--live", "ns/.x"], "argument --live: "
             "'.x' is not an object name")):
        with pytest.raises(SystemExit) as exited:
            main(["autoscale", "evaluate", *(["t.yaml"] if "--live" not in option else []),
                  *option])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and said in err and "secret" not in err, err
    assert "2 a command line that does not parse" in EXIT_STATUS
    with pytest.raises(SystemExit):
        main(["autoscale", "evaluate", "--help"])
    assert "2 a command line that does not parse" in " ".join(capsys.readouterr().out.split())


def test_a_tuning_without_a_namespace_takes_the_one_given_or_says_default(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        prometheus: Callable[[Answer], None]) -> None:
    """A GitOps manifest often gives no namespace (kubectl apply -n does): read as default
    without a word, the pods were looked for there, and the message blamed their scraping."""
    prometheus(measured(10.0, 0.05))
    path = tmp_path / "tuning.yaml"

    def run(namespace: str | None, *options: str) -> tuple[int, Any, str]:
        path.write_text(yaml.safe_dump({
            "apiVersion": "infertune.io/v1alpha1", "kind": "InferenceTuning",
            "metadata": {"name": "llm", **({"namespace": namespace} if namespace else {})},
            "spec": {"targetRef": {"name": "llm"}, "engine": "vllm", "autoscaling": {}}}))
        code = main(["autoscale", "evaluate", str(path), "--prometheus", "http://127.0.0.1:9",
                     "--output", "json", *options])
        out, err = capsys.readouterr()
        return code, json.loads(out)["tuning"] if out else None, err

    code, tuning, err = run(None)
    assert code == 0 and tuning == "default/llm"
    assert "infertune: the tuning gives no metadata.namespace: taken as default (give -n " \
           "NAMESPACE, as kubectl apply -n)" in err
    code, tuning, err = run(None, "-n", "serving")
    assert (code, tuning) == (0, "serving/llm") and "no metadata.namespace" not in err
    assert run("serving", "-n", "serving")[:2] == (0, "serving/llm")
    code, _, err = run("serving", "-n", "other")
    assert code == 2 and "-n other: the tuning's metadata.namespace is serving" in err
    code = main(["autoscale", "evaluate", "--live", "serving/llm", "-n", "serving",
                 "--prometheus", "http://127.0.0.1:9"])
    assert code == 2 and "-n is for a tuning file" in capsys.readouterr().err
    # Not a namespace name: refused as the command line is parsed (it asked whether the pods
    # of "Bad_NS" are scraped; "" was taken as default).
    for bad in ("Bad_NS", "", "evil\n\x1b[31m"):
        with pytest.raises(SystemExit) as exit_:
            main(["autoscale", "evaluate", str(path), "--prometheus", "http://127.0.0.1:9",
                  "-n", bad])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"argument -n/--namespace: {bad!r} is not a " \
            "namespace name" in err, err
