"""The operator's own metrics: what the autoscaler decided last, read at scrape time."""

from __future__ import annotations

import argparse
import socket
import urllib.request
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tests.test_scale_write_failures import T0, Cluster

from infertune.controller import autoscaling, main
from infertune.controller.exported import AutoscalerCollector, Counts, Reported
from infertune.controller.main import check_metrics_options

CONDITIONS = (("MetricsAvailable", "True", "Found"), ("ScalingActive", "True", "Scaling"),
              ("ScalingLimited", "True", "TooManyReplicas"))


def scrape(collector: AutoscalerCollector) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> [(labels, value)] as Prometheus reads the exposition."""
    registry = CollectorRegistry()
    registry.register(collector)
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_each_tunings_last_evaluation_is_a_set_of_samples() -> None:
    reported = {
        "prod/qwen": Reported("qwen-vllm", 8, 8, "Hold", 2.1, "p99", 80.0, T0, CONDITIONS,
                              False, 15.0),
        # An outage: no latency, no queue; a DryRun trial.
        "prod/trial": Reported("llama", 2, 2, "Hold", None, "p99", None, T0 + 1,
                               (("ScalingActive", "False", "MetricsUnavailable"),), True, 60.0),
    }
    counts = Counts({("prod/qwen", "out"): 3, ("prod/qwen", "in"): 1}, {"prod/trial": 2}, 40)
    got = scrape(AutoscalerCollector(lambda: reported, lambda: counts, lambda: True))
    qwen = {"namespace": "prod", "name": "qwen", "deployment": "qwen-vllm"}
    trial = {"namespace": "prod", "name": "trial", "deployment": "llama"}
    assert got["infertune_autoscaling_current_replicas"] == [(qwen, 8.0), (trial, 2.0)]
    assert got["infertune_autoscaling_latency_seconds"] == [(qwen | {"kind": "p99"}, 2.1)]
    assert got["infertune_autoscaling_queue_per_replica"] == [(qwen, 80.0)]
    assert got["infertune_autoscaling_last_evaluation_timestamp_seconds"] == [
        (qwen, T0), (trial, T0 + 1)]
    assert got["infertune_autoscaling_interval_seconds"] == [(qwen, 15.0), (trial, 60.0)]
    assert (trial | {"action": "Hold", "mode": "DryRun"}, 1.0) in got[
        "infertune_autoscaling_action"]
    assert (qwen | {"type": "ScalingLimited", "status": "True", "reason": "TooManyReplicas"},
            1.0) in got["infertune_autoscaling_condition"]
    assert len(got["infertune_autoscaling_condition"]) == 4
    assert got["infertune_autoscaling_scale_writes_total"] == [
        ({"namespace": "prod", "name": "qwen", "direction": "in"}, 1.0),
        ({"namespace": "prod", "name": "qwen", "direction": "out"}, 3.0)]
    assert got["infertune_autoscaling_evaluation_failures_total"] == [
        ({"namespace": "prod", "name": "trial"}, 2.0)]
    assert got["infertune_autoscaling_prometheus_fetches_total"] == [({}, 40.0)]


def test_a_process_that_does_not_lead_exports_no_autoscaler_series() -> None:
    """It evaluates nothing; one that lost the Lease would export what it decided before,
    beside the leader's."""
    reported = {"prod/qwen": Reported("qwen", 8, 8, "Hold", 2.1, "p99", 80.0, T0, (), False,
                                      15.0)}
    got = scrape(AutoscalerCollector(lambda: reported, lambda: Counts({}, {}, 1),
                                     lambda: False))
    assert got == {}


def test_evaluations_record_what_they_decided_and_count_the_writes_that_landed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    settings.autoscaled.add("ns/t")  # its loop runs
    assert cluster.evaluate(settings, T0) == 3
    got = settings.exported()["ns/t"]
    assert (got.deployment, got.current, got.desired, got.action, got.evaluated) == (
        "llm", 2, 3, "ScaleOut", T0)
    assert ("ScalingActive", "True", "Scaling") in got.conditions
    assert got.queue == 64.0 and got.latency_s == 0.05
    assert got.interval_s == 15.0  # the NotEvaluated alert's measure
    assert settings.counts().scale_writes == {("ns/t", "out"): 1}
    # Refused: decided, reported, not counted as a write.
    refusal = ApiException(status=403, reason="Forbidden")
    refusal.body = '{"message": "denied by policy"}'
    cluster.scale_refusal = refusal
    cluster.evaluate(settings, T0 + 75)
    assert settings.reported["ns/t"].evaluated == T0 + 75
    assert ("ScalingActive", "False", "ScaleWriteRefused") in settings.reported[
        "ns/t"].conditions
    assert settings.counts().scale_writes == {("ns/t", "out"): 1}
    # A write whose answer was lost, found when read back, counts once.
    cluster.scale_refusal = None
    cluster.scale_answer_lost = True
    assert cluster.evaluate(settings, T0 + 150) == 4
    assert settings.counts().scale_writes == {("ns/t", "out"): 2}
    # Its loop ends (the tuning deleted, spec.autoscaling removed): its series go, and an
    # evaluation that ends in its worker thread after that is not exported.
    settings.stopped("ns/t")
    assert settings.exported() == {} and settings.counts() == Counts({}, {}, 0)
    cluster.evaluate(settings, T0 + 225)
    assert settings.reported == {} and settings.exported() == {}
    # The same name autoscaled again: no counts of the one deleted.
    settings.autoscaled.add("ns/t")
    assert settings.counts().scale_writes == {}
    settings.stopped("ns/t")
    # A new term (another process led meanwhile): what it decided before is not exported.
    settings.autoscaled.add("ns/t")
    settings.leader = FlippingLeader()
    settings.begin_term()
    assert settings.exported() == {}


class FlippingLeader:
    """A leader in its second term."""

    term = 2

    def leads(self) -> bool:
        return True


def test_evaluations_that_keep_failing_say_so_in_the_metrics_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """EvaluationFailed was written to the tuning while the metrics kept ScalingActive=True
    from the last evaluation that ran: the NotScaling alert could not fire."""
    import asyncio

    monkeypatch.setattr(autoscaling, "_write_if_present", lambda *args: None)
    settings = autoscaling.AutoscalingSettings(source=None)
    settings.autoscaled.add("ns/t")
    settings.reported["ns/t"] = Reported("llm", 2, 2, "Hold", 0.05, "p99", 1.0, T0,
                                         CONDITIONS, False, 15.0)

    async def fail() -> None:
        for _ in range(2):
            await autoscaling._after_failure(asyncio.get_running_loop(), settings, "ns", "t",
                                             1, {}, "1", RuntimeError("boom"))

    asyncio.run(fail())
    assert ("ScalingActive", "False", "EvaluationFailed") in settings.exported()[
        "ns/t"].conditions
    assert settings.counts().failures == {"ns/t": 2}


def test_the_metrics_server_serves_the_autoscaler_and_the_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = autoscaling.AutoscalingSettings(source=None)
    settings.autoscaled.add("prod/qwen")
    settings.reported["prod/qwen"] = Reported("qwen", 3, 4, "ScaleOut", 0.2, "p99", 40.0, T0,
                                              CONDITIONS, False, 15.0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    main._serve_metrics(args(metrics_port=port, metrics_addr="127.0.0.1"), settings)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    assert ('infertune_autoscaling_desired_replicas{deployment="qwen",name="qwen",'
            'namespace="prod"} 4.0') in text
    assert "process_cpu_seconds_total" in text
    # Its port taken since (by itself here): refused with the reason, not a traceback.
    with pytest.raises(SystemExit) as refused:
        main._serve_metrics(args(metrics_port=port, metrics_addr="127.0.0.1"), settings)
    assert str(refused.value).startswith(f"--metrics-port: cannot listen on 127.0.0.1 port "
                                         f"{port}: ")


def args(**given: Any) -> argparse.Namespace:
    base: dict[str, Any] = {"metrics_port": None, "metrics_addr": "0.0.0.0",
                            "webhook_port": 9443, "liveness": None}
    return argparse.Namespace(**(base | given))


@pytest.mark.parametrize(("given", "error"), [
    ({"metrics_addr": "127.0.0.1"}, "--metrics-addr needs --metrics-port"),
    ({"metrics_port": 0}, "--metrics-port: 0 is not from 1 to 65535"),
    ({"metrics_port": 70000}, "--metrics-port: 70000 is not from 1 to 65535"),
    ({"metrics_port": 9443}, "--metrics-port: 9443 is the webhook's port (--webhook-port)"),
    ({"metrics_port": 8080, "liveness": "http://0.0.0.0:8080/healthz"},
     "--metrics-port: 8080 is the port of --liveness"),
    ({"metrics_port": 80, "liveness": "http://0.0.0.0/healthz"},
     "--metrics-port: 80 is the port of --liveness"),
    ({"metrics_port": 8081, "metrics_addr": "no such host.invalid"},
     "--metrics-addr: 'no such host.invalid' is not an address to listen on"),
])
def test_metrics_options_are_refused_before_anything_starts(given: dict[str, Any],
                                                            error: str) -> None:
    with pytest.raises(SystemExit) as refused:
        check_metrics_options(args(**given))
    assert str(refused.value).startswith(error), refused.value


def test_a_metrics_port_another_process_listens_on_is_refused() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(SystemExit) as refused:
            check_metrics_options(args(metrics_port=port, metrics_addr="127.0.0.1"))
    assert f"--metrics-port: 127.0.0.1 port {port} is in use" in str(refused.value)
    check_metrics_options(args(metrics_port=port, metrics_addr="127.0.0.1"))  # free again


def test_no_prometheus_leaves_the_conditions_to_the_controller_while_the_target_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --prometheus-url and without the Deployment, the controller wrote TargetNotFound
    into ScalingActive every 15 s and the autoscaler NoPrometheus back every interval: the
    SCALING column flipped between them, two status writes for nothing."""
    import asyncio

    writes: list[str] = []
    monkeypatch.setattr(autoscaling, "_write_if_present", lambda *args: writes.append(args[1]))
    settings = autoscaling.AutoscalingSettings(source=None)

    def report(target_found: str) -> None:
        status = {"conditions": [{"type": "TargetFound", "status": target_found,
                                  "reason": "x", "message": "m", "lastTransitionTime": T0}]}
        async def run() -> None:
            await autoscaling._report_no_prometheus(asyncio.get_running_loop(), settings, "ns",
                                                    f"t-{target_found}", 1, status, "1")

        asyncio.run(run())

    report("False")
    report("True")
    assert writes == ["t-True"]
