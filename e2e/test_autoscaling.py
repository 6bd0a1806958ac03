"""Autoscaling end to end: a synthetic vLLM exporter, the real Prometheus scraping it every
second, the real operator deciding, and replicas changed through the scale subresource.

The exporter serves vLLM's real metric names (prometheus_client gauges and histograms) for
each live pod of the Deployment, with the queue and latency the test sets: load raises the
queue, replicas go up; load drops, replicas come down after stabilization; Prometheus stops,
replicas hold with MetricsAvailable=False; a P99 spike with a low queue yields TuneBatching.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families

from e2e.fixtures.access import Kubectl, column
from e2e.fixtures.operator import OperatorProcess
from e2e.fixtures.prometheus import MetricsEndpoint, PrometheusServer
from e2e.fixtures.waiting import wait_for
from e2e.test_operator import (
    condition,
    create,
    delete_tuning_and_wait,
    deployment,
    get_tuning,
    tuning,
)
from e2e.test_pod_tuning import pods_of
from infertune.api.spec import GROUP, PLURAL, VERSION
from infertune.cli import build_parser
from infertune.kube.client import FIELD_MANAGER, replicas_owners
from infertune.scaling.state import parse_time

pytestmark = pytest.mark.e2e

BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)


class FakeVllm:
    """vLLM's metrics for every live pod of one Deployment, with values the test controls."""

    def __init__(self, api_client: client.ApiClient, namespace: str, app: str) -> None:
        self.api_client, self.namespace, self.app = api_client, namespace, app
        self.registry = CollectorRegistry()
        labels = ["namespace", "pod", "model_name"]
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", labels,
                             registry=self.registry)
        self.running = Gauge("vllm:num_requests_running", "running", labels,
                             registry=self.registry)
        self.latency = Histogram("vllm:e2e_request_latency_seconds", "e2e latency", labels,
                                 buckets=BUCKETS, registry=self.registry)
        self.queue_per_pod = 0.0
        self.latency_s = 0.02
        self.requests_per_s = 20
        self.running_per_pod = 8.0
        self.stop = threading.Event()
        self.pods: set[str] = set()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            live = {p.metadata.name for p in pods_of(self.api_client, self.namespace, self.app)}
            for gone in self.pods - live:
                for metric in (self.waiting, self.running, self.latency):
                    metric.remove(self.namespace, gone, "qwen")
            self.pods = live
            for pod in live:
                labels = (self.namespace, pod, "qwen")
                self.waiting.labels(*labels).set(self.queue_per_pod)
                self.running.labels(*labels).set(self.running_per_pod)
                for _ in range(max(1, self.requests_per_s // 4)):
                    self.latency.labels(*labels).observe(self.latency_s)


@pytest.fixture
def fake_vllm(api_client: client.ApiClient, namespace: str,
              prometheus: PrometheusServer) -> Iterator[FakeVllm]:
    exporter = FakeVllm(api_client, namespace, "qwen")
    with MetricsEndpoint(exporter.registry) as endpoint:
        exporter.thread.start()
        prometheus.add_scrape_job(f"fake-vllm-{namespace}", [endpoint.target])
        yield exporter
        exporter.stop.set()
        exporter.thread.join()
        prometheus.remove_scrape_job(f"fake-vllm-{namespace}")


def replicas(api_client: client.ApiClient, namespace: str) -> int:
    scale = client.AppsV1Api(api_client).read_namespaced_deployment_scale("qwen", namespace)
    return int(scale.spec.replicas or 0)  # the scale's replicas are left out at 0


def seconds_between(earlier: str, later: str) -> float:
    """Seconds from one status time (RFC 3339, as the operator writes them) to another."""
    def parse(text: str) -> float:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return parse(later) - parse(earlier)


def autoscaling_status(api_client: client.ApiClient, namespace: str) -> dict[str, Any]:
    status: dict[str, Any] = (get_tuning(api_client, namespace, "qwen").get("status") or {}).get(
        "autoscaling") or {}
    return status


def evaluations_pass(api_client: client.ApiClient, namespace: str, count: int = 2,
                     name: str = "qwen", timeout_s: float = 30) -> dict[str, Any]:
    """Wait until `count` more evaluations of tuning `name` have written their status (its
    `evaluated` moved on `count` times), and return the last status.autoscaling: a check
    that nothing happened means something only after the operator looked (a fixed sleep
    proved nothing on a loaded machine)."""
    def block() -> dict[str, Any]:
        status = get_tuning(api_client, namespace, name).get("status") or {}
        return dict(status.get("autoscaling") or {})

    seen = [block().get("evaluated")]

    def moved_on() -> dict[str, Any] | None:
        now = block()
        if now.get("evaluated") not in (None, seen[-1]):
            seen.append(now["evaluated"])
        return now if len(seen) > count else None

    return wait_for(moved_on, f"{count} more evaluations of {name}", timeout_s=timeout_s)


def wait_scale_out_decisions(api_client: client.ApiClient, namespace: str,
                             timeout_s: float = 30) -> list[dict[str, Any]]:
    """The ScaleOut entries of status.decisions, once there is one."""
    return wait_for(lambda: [d for d in (get_tuning(api_client, namespace, "qwen").get(
        "status") or {}).get("decisions", []) if d["action"].startswith("ScaleOut")],
        "a ScaleOut decision in status", timeout_s=timeout_s)


SPEC = {
    "metrics": {"window": "10s"},
    "autoscaling": {
        "minReplicas": 1, "maxReplicas": 4, "interval": "2s",
        "queue": {"targetPerReplica": 32, "sustain": "4s"},
        "latency": {"target": "75ms", "consecutiveSamples": 2},
        "scaleUp": {"pods": 4, "percent": 100, "period": "2s", "stabilization": "0s"},
        "scaleDown": {"pods": 4, "percent": 100, "period": "2s", "stabilization": "8s"},
    },
}


def test_queue_scales_out_then_in_after_stabilization(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm,
) -> None:
    create(api_client, namespace, deployment("qwen"))
    create(api_client, namespace, tuning("qwen", "qwen", **SPEC))
    wait_for(lambda: autoscaling_status(api_client, namespace).get("evaluated"),
             "a first evaluation", timeout_s=30)
    assert replicas(api_client, namespace) == 1

    loaded_at = time.time()
    fake_vllm.queue_per_pod = 100.0  # 100 waiting on one replica against a target of 32
    wait_for(lambda: replicas(api_client, namespace) == 4, "scale out to 4", timeout_s=40)
    # The status patch lands just after the scale write: wait for the recorded decision.
    decisions = wait_scale_out_decisions(api_client, namespace)
    assert decisions[0]["applied"] is True and "queue" in decisions[0]["reason"]
    # Within the sustain window (4 s) and one interval (2 s) of the load, by the time the
    # operator decided as of (the decision's own time: no watch or API delay in it), plus
    # the scrape interval (1 s) and 3 s for a loaded machine; and only once Prometheus's
    # history had the queue above target for the whole sustain window.
    decided_after = parse_time(decisions[0]["time"]) - loaded_at
    assert decided_after <= 4 + 2 + 1 + 3, decided_after
    assert "above target for 4s -> " in decisions[0]["reason"], decisions[0]["reason"]
    events = wait_for(lambda: client.CoreV1Api(api_client).list_namespaced_event(
        namespace, field_selector="involvedObject.name=qwen,reason=ScaledOut").items,
        "a ScaledOut Event")
    assert "queue" in events[0].message
    # `kubectl get deploy --show-managed-fields` names the operator as the writer, and its
    # scale write alone owns spec.replicas (what tells a restarted operator its own write
    # that the status missed from another writer's).
    body = api_client.sanitize_for_serialization(
        client.AppsV1Api(api_client).read_namespaced_deployment("qwen", namespace))
    assert replicas_owners(body) == ((FIELD_MANAGER, "scale"),), body["metadata"].get(
        "managedFields")
    # 100 waiting on each of 4 replicas calls for 13: maxReplicas holds it, and says so.
    limited = wait_for(lambda: limited_by(api_client, namespace, "TooManyReplicas"),
                       "ScalingLimited TooManyReplicas at maxReplicas")
    assert limited["status"] == "True" and "maxReplicas (4)" in limited["message"]
    # The operator's own metrics say the same, for an alert.
    if operator.metrics_url is not None:
        labels = {"namespace": namespace, "name": "qwen", "deployment": "qwen"}
        limited_series = frozenset((labels | {"type": "ScalingLimited", "status": "True",
                                              "reason": "TooManyReplicas"}).items())

        def exported() -> dict[str, dict[frozenset[tuple[str, str]], float]] | None:
            got = operator_samples(operator.metrics_url or "")
            return got if limited_series in got.get("infertune_autoscaling_condition", {}) \
                else None

        samples = wait_for(exported, "the TooManyReplicas condition in the operator's metrics")
        key = frozenset(labels.items())
        assert samples["infertune_autoscaling_current_replicas"][key] == 4
        assert samples["infertune_autoscaling_queue_per_replica"][key] == 100
        assert samples["infertune_autoscaling_scale_writes_total"][frozenset(
            {"namespace": namespace, "name": "qwen", "direction": "out"}.items())] >= 1

    # The load drops: nothing waits, and each pod serves a fifth of the requests it served
    # (16 req/s on the 4, which one replica was measured to carry: 20 req/s each).
    fake_vllm.queue_per_pod, fake_vllm.requests_per_s = 0.0, 4
    loaded: list[str] = []  # `evaluated` of each evaluation that still saw the load

    def scaled_in() -> bool:
        status = autoscaling_status(api_client, namespace)
        # At 28.8 (target 32, tolerance 0.1) or more per replica the recommendation keeps 4.
        if (status.get("queueDepth") or 0) >= 28.8 and status["evaluated"] not in loaded:
            loaded.append(status["evaluated"])
        return replicas(api_client, namespace) == 1

    wait_for(scaled_in, "scale in to 1", timeout_s=60)
    scale_in = wait_for(lambda: [d for d in (get_tuning(api_client, namespace, "qwen").get(
        "status") or {}).get("decisions", []) if d["action"].startswith("ScaleIn")],
        "a ScaleIn decision in status")[-1]
    # Not before the stabilization window (8 s) after the last recommendation of 4: that is
    # the last evaluation that still saw the load, which may come a scrape after it dropped,
    # or up to an interval before the exporter's change reached Prometheus.
    assert loaded, "no evaluation saw the load after it was raised"
    # In one step: the load that went away takes the replicas with it.
    assert scale_in["action"] == "ScaleIn 4 -> 1", scale_in
    assert seconds_between(loaded[-1], scale_in["time"]) >= 8
    # Idle at minReplicas: as HPA says it.
    assert wait_for(lambda: limited_by(api_client, namespace, "TooFewReplicas"),
                    "ScalingLimited TooFewReplicas at minReplicas")["status"] == "True"


def test_pods_that_join_count_from_their_ready_time(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm,
) -> None:
    """The pods a scale-out added serve from when the last of them became Ready, as the
    pods' Ready condition says it (the second after it: the time is written in whole
    seconds), not from the evaluation that first reads them Ready. A 10 s interval puts the
    pods' Ready time (a second or two after the write) well between two evaluations."""
    spec = {**SPEC, "autoscaling": {**SPEC["autoscaling"], "interval": "10s"}}
    # With a readiness probe, as the docs ask: Ready then says that the engine serves.
    create(api_client, namespace, deployment("qwen", readinessProbe={
        "httpGet": {"path": "/health", "port": 8000}}))
    create(api_client, namespace, tuning("qwen", "qwen", **spec))
    wait_for(lambda: autoscaling_status(api_client, namespace).get("evaluated"),
             "a first evaluation", timeout_s=30)
    fake_vllm.queue_per_pod = 100.0
    scaled_at = parse_time(wait_scale_out_decisions(api_client, namespace, timeout_s=40)[0][
        "time"])
    serving = wait_for(lambda: (lambda s: s if s and s.get("replicas") == 4 else None)(
        (autoscaling_status(api_client, namespace).get("state") or {}).get("serving")),
        "4 replicas known to serve", timeout_s=40)
    ready_at = max(c.last_transition_time.timestamp()
                   for pod in pods_of(api_client, namespace, "qwen")
                   for c in pod.status.conditions if c.type == "Ready")
    counted_at = parse_time(serving["since"])  # the evaluation that read the 4 Ready
    # Added by the scale-out: Ready after the evaluation that wrote it, which read fewer.
    assert scaled_at < ready_at + 1
    # Counted from then; by the evaluation that read them only if they became Ready in the
    # second before it (10 s after the write: not on an idle machine).
    assert parse_time(serving["changed"]) == min(ready_at + 1, counted_at), (
        serving, ready_at, scaled_at)


def operator_samples(url: str) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    """The operator's metrics as Prometheus parses them: name -> labels -> value."""
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    out: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return out


def limited_by(api_client: client.ApiClient, namespace: str,
               reason: str) -> dict[str, Any] | None:
    """The ScalingLimited condition of tuning qwen, once its reason is `reason`."""
    found = condition(get_tuning(api_client, namespace, "qwen"), "ScalingLimited")
    return found if found is not None and found["reason"] == reason else None


def test_prometheus_outage_holds_replicas(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm, prometheus: PrometheusServer, kubectl: Kubectl,
) -> None:
    create(api_client, namespace, deployment("qwen", replicas=2))
    create(api_client, namespace, tuning("qwen", "qwen", **SPEC))
    fake_vllm.queue_per_pod = 30.0  # inside the tolerance band: hold at 2
    wait_for(lambda: autoscaling_status(api_client, namespace).get("queueDepth"),
             "a queue reading", timeout_s=30)
    prometheus.suspend()
    try:
        def unavailable() -> dict[str, Any] | None:
            body = get_tuning(api_client, namespace, "qwen")
            found = condition(body, "MetricsAvailable")
            reason = ((body.get("status") or {}).get("autoscaling") or {}).get("reason", "")
            down = found is not None and found["status"] == "False"
            return body if down and "no usable metrics" in reason else None

        body = wait_for(unavailable, "MetricsAvailable=False and a hold on no data",
                        timeout_s=30)
        assert body["status"]["autoscaling"]["action"] == "Hold"
        assert "holding 2 replicas" in body["status"]["autoscaling"]["reason"]
        assert replicas(api_client, namespace) == 2
        # Not "Scaling" while nothing is read, as HPA says it.
        scaling = condition(body, "ScalingActive")
        assert scaling is not None and (scaling["status"], scaling["reason"]) == (
            "False", "MetricsUnavailable"), scaling
        assert (condition(body, "ScalingLimited") or {}).get("status") == "Unknown"
        # And where `kubectl get` shows it (a printer column the API server takes).
        table = kubectl("get", "itune", "qwen", "-n", namespace, "-o", "wide").stdout
        assert column(table, "SCALING") == "MetricsUnavailable", table
        assert column(table, "LIMITED") == "NotDecided", table
        # And it lasts: evaluations past the 8 s scale-down window (and more) still hold 2,
        # where data read as none would have scaled in to 1 by then.
        first = parse_time(body["status"]["autoscaling"]["evaluated"])

        def held_past_the_window() -> dict[str, Any] | None:
            status = autoscaling_status(api_client, namespace)
            return status if parse_time(status["evaluated"]) >= first + 8 + 2 * 2 else None

        later = wait_for(held_past_the_window, "evaluations past the scale-down window",
                         timeout_s=40)
        assert later["action"] == "Hold" and "holding 2 replicas" in later["reason"], later
        assert replicas(api_client, namespace) == 2
        assert (condition(get_tuning(api_client, namespace, "qwen"), "MetricsAvailable")
                or {}).get("status") == "False"
    finally:
        prometheus.resume()
    wait_scaling_reason(api_client, namespace, "Scaling")  # and back once it answers


def batching_of(api_client: client.ApiClient, namespace: str) -> dict[str, Any]:
    """status.batching of tuning qwen ({} when it has none)."""
    status = get_tuning(api_client, namespace, "qwen").get("status") or {}
    return dict(status.get("batching") or {})


def test_latency_spike_with_a_low_queue_tunes_batching(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm,
) -> None:
    create(api_client, namespace, deployment("qwen"))
    create(api_client, namespace, tuning("qwen", "qwen", batching={"mode": "Recommend"},
                                         **SPEC))
    fake_vllm.queue_per_pod = 1.0
    fake_vllm.latency_s = 0.4  # P99 far above 75 ms while almost nothing waits
    status = wait_for(lambda: (s := autoscaling_status(api_client, namespace)).get(
        "action") == "TuneBatching" and s, "action TuneBatching", timeout_s=45)
    assert status["p99Ms"] > 75
    assert replicas(api_client, namespace) == 1
    # The breach is remembered in status, as the API server's schema takes it.
    breaches = wait_for(lambda: (autoscaling_status(api_client, namespace).get("state") or {})
                        .get("latencyBreaches"), "the breach in status.autoscaling.state",
                        timeout_s=10)
    assert breaches[-1]["replicas"] == 1 and breaches[-1]["requestRate"] > 0
    assert breaches[-1]["outcome"] == "Open"
    batching = get_tuning(api_client, namespace, "qwen")["status"].get("batching") or {}
    assert batching.get("knob") == "max-num-seqs" and batching.get("recommended")


def test_batching_auto_re_tunes_pods_with_the_applied_batch_size(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm, prometheus: PrometheusServer, kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The applied value reaches the pods, and the next step waits until every pod runs it and
    the latency was measured on them (10s window + 2 samples of 2s after re-tuning counts
    them), where it used to step every interval while the pods were being re-created. The
    first step starts from the value on the pod template's command line."""
    create(api_client, namespace, deployment("qwen", args=["--max-num-seqs", "48"]))
    # One replica: re-tuning never evicts the only Ready pod, so the Deployment rolls it
    # (a new pod first) through the pod template annotation.
    create(api_client, namespace, tuning("qwen", "qwen", batching={
        "mode": "Auto", "knob": "max-num-seqs", "min": 4, "max": 64},
        retune={"strategy": "PodTemplateAnnotation"}, **SPEC))
    fake_vllm.queue_per_pod = 1.0
    fake_vllm.latency_s = 0.4

    applied = wait_for(lambda: batching_of(api_client, namespace).get("applied"),
                       "status.batching.applied", timeout_s=45)
    assert applied == 24  # the template's 48, halved for a p99 at over twice the target
    assert "from 48 (on the pod template) to 24" in batching_of(api_client, namespace)["reason"]

    def announced() -> list[Any]:
        return [e for e in client.CoreV1Api(api_client).list_namespaced_event(namespace).items
                if e.reason == "BatchingApplied" and e.involved_object.name == "qwen"]

    # Each change re-creates the pods, so it says why, as a scale does.
    event = wait_for(announced, "a BatchingApplied Event", timeout_s=30)[0]  # kopf queues it
    assert event.message.startswith("max-num-seqs unset -> 24: new pods get it")

    def flag(pod: Any) -> int:
        args = list(pod.spec.containers[0].args)
        return int(args[args.index("--max-num-seqs") + 1])

    def carries_flag() -> list[Any] | None:
        pods = pods_of(api_client, namespace, "qwen")
        return pods if pods and all(flag(p) != 48 for p in pods) else None

    pods = wait_for(carries_flag, "pods re-created with --max-num-seqs", timeout_s=60)
    values = {flag(p) for p in pods}
    assert values == {applied}  # spec.batching bounds hold, and no step while they rolled
    assert batching_of(api_client, namespace)["applied"] == applied
    since = wait_for(lambda: batching_of(api_client, namespace).get("servingSince"),
                     "status.batching.servingSince", timeout_s=30)

    def held() -> dict[str, Any] | None:
        # An evaluation after every pod runs the value, less than a metrics window (10s)
        # after it: no sample was measured on the new pods alone yet.
        got = autoscaling_status(api_client, namespace)
        evaluated = parse_time(got["evaluated"])
        return got if parse_time(since) < evaluated < parse_time(since) + 10 else None

    # Above target, and not counted as a breach: the samples' windows reach back to the old
    # value's pods (engine.decide_scale's batch_changed); counted, the breach scaled out on
    # top of the lower.
    first = wait_for(held, "an evaluation while the new value is measured", timeout_s=10)
    assert first["p99Ms"] > 75 and first["breaches"] == 0, first["reason"]
    live = evaluate_cli(capsys, "--live", f"{namespace}/qwen", "--kubeconfig", str(kubeconfig),
                        "--prometheus", prometheus.url)  # what the operator does: it waits
    assert f"max-num-seqs stays at {applied} until its effect is measured" in \
        live["batching"]["reason"]

    def next_step() -> dict[str, Any] | None:
        status = get_tuning(api_client, namespace, "qwen").get("status") or {}
        return status if status["batching"].get("applied") != applied else None

    stepped = wait_for(next_step, "the next step, once the latency was measured on the pods",
                       timeout_s=45)
    assert 4 <= stepped["batching"]["applied"] < applied  # the latency stayed at 0.4s
    # Written with the evaluation that stepped: at least the settle time after `since`.
    elapsed = parse_time(stepped["autoscaling"]["evaluated"]) - parse_time(since)
    assert elapsed >= 10 + 2 * 2, (since, stepped["autoscaling"]["evaluated"])


def test_batching_auto_stops_changing_a_knob_the_pods_run_past(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm,
) -> None:
    """An engine whose entrypoint drops the flag the webhook appends runs more requests at
    once than the value applied: the exporter serves 40 running per pod while every pod is
    re-created with --max-num-seqs 24. Once every pod runs it and its effect could have been
    measured, the operator records it (status.batching.ignored), says so with a Warning
    Event, and changes the knob no more: each step would have been a rollout for nothing,
    down to min."""
    create(api_client, namespace, deployment("qwen", args=["--max-num-seqs", "48"]))
    # One replica at most: a rollout of one pod (re-tuning never evicts the only Ready one,
    # so the Deployment rolls it through the pod template annotation).
    one = {**SPEC, "autoscaling": {**SPEC["autoscaling"], "maxReplicas": 1}}
    create(api_client, namespace, tuning("qwen", "qwen", batching={
        "mode": "Auto", "knob": "max-num-seqs", "min": 4, "max": 64},
        retune={"strategy": "PodTemplateAnnotation"}, **one))
    fake_vllm.queue_per_pod = 1.0
    fake_vllm.latency_s = 0.4
    fake_vllm.running_per_pod = 40.0

    assert wait_for(lambda: batching_of(api_client, namespace).get("applied"),
                    "status.batching.applied", timeout_s=45) == 24
    ignored = wait_for(lambda: batching_of(api_client, namespace).get("ignored"),
                       "status.batching.ignored", timeout_s=60)
    assert (ignored["knob"], ignored["value"], ignored["peak"]) == ("max-num-seqs", 24, 40.0)

    def warned() -> list[Any]:
        return [e for e in client.CoreV1Api(api_client).list_namespaced_event(namespace).items
                if e.reason == "BatchingFlagIgnored" and e.involved_object.name == "qwen"]

    event = wait_for(warned, "a BatchingFlagIgnored Event", timeout_s=30)[0]
    assert event.type == "Warning"
    assert "with --max-num-seqs=24 set, which allows at most 24" in event.message
    # Intervals later, with the latency still above target: the knob stays where it is.
    evaluations_pass(api_client, namespace, count=4)
    after = batching_of(api_client, namespace)
    assert after["applied"] == 24 and after["ignored"] == ignored
    assert after["reason"].startswith("mode Auto cannot apply it, so it is only recommended")
    assert len(warned()) == 1


def test_batching_auto_reads_the_running_requests_per_engine_not_per_deployment(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm,
) -> None:
    """Two replicas at 20 running requests each, under the 24 applied: the flag is read (40
    in all is not one engine past 24), so Auto steps on to 12 rather than concluding that
    the engine ignores it. Summed per Deployment, every multi-replica vLLM would have been
    taken for one that ignores the flag, and Auto would have stopped."""
    create(api_client, namespace, deployment("qwen", replicas=2,
                                             args=["--max-num-seqs", "48"]))
    two = {**SPEC, "autoscaling": {**SPEC["autoscaling"], "minReplicas": 2,
                                   "maxReplicas": 2}}
    create(api_client, namespace, tuning("qwen", "qwen", batching={
        "mode": "Auto", "knob": "max-num-seqs", "min": 4, "max": 64}, **two))
    fake_vllm.queue_per_pod = 1.0
    fake_vllm.latency_s = 0.4
    fake_vllm.running_per_pod = 20.0

    assert wait_for(lambda: batching_of(api_client, namespace).get("applied"),
                    "status.batching.applied", timeout_s=45) == 24
    stepped = wait_for(
        lambda: (b := batching_of(api_client, namespace)).get("applied") != 24 and b,
        "the next step, once both pods run 24", timeout_s=120)
    assert stepped["applied"] == 12 and not stepped.get("ignored"), stepped


def wait_scaling_reason(api_client: client.ApiClient, namespace: str,
                          reason: str, name: str = "qwen") -> dict[str, Any]:
    """The ScalingActive condition of tuning `name`, once its reason is `reason`."""
    def observe() -> dict[str, Any] | None:
        found = condition(get_tuning(api_client, namespace, name), "ScalingActive")
        return found if found is not None and found["reason"] == reason else None

    return wait_for(observe, f"ScalingActive reason {reason}", timeout_s=30)


def test_a_writer_that_keeps_reverting_replicas_is_reported_not_fought(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm,
) -> None:
    create(api_client, namespace, deployment("qwen"))
    create(api_client, namespace, tuning("qwen", "qwen", **SPEC))
    fake_vllm.queue_per_pod = 100.0
    apps = client.AppsV1Api(api_client)
    for _ in range(2):  # GitOps without ignoreDifferences puts replicas back each time
        wait_for(lambda: replicas(api_client, namespace) > 1, "the operator scaling out",
                 timeout_s=40)
        apps.patch_namespaced_deployment_scale("qwen", namespace, {"spec": {"replicas": 1}})
    # The other writer owns spec.replicas now: a restarted operator would not take its count
    # for its own.
    body = api_client.sanitize_for_serialization(apps.read_namespaced_deployment(
        "qwen", namespace))
    assert (FIELD_MANAGER, "scale") not in replicas_owners(body)
    found = wait_scaling_reason(api_client, namespace, "ReplicaFight")
    # Named as the Deployment's managedFields say: this client's manager, through the scale
    # subresource (a guess at GitOps before).
    assert found["status"] == "False" and "through the scale subresource, as the " \
        "Deployment's managedFields say) reverted the replicas of qwen" in found["message"], \
        found["message"]
    # Remembered in status (a restarted operator keeps to it), with when writes resume.
    fight = autoscaling_status(api_client, namespace)["replicaFight"]
    assert fight["reverts"] == 2 and fight["retryAt"] in found["message"]
    assert 250 <= seconds_between(fight["lastRevert"], fight["retryAt"]) <= 300
    evaluations_pass(api_client, namespace)  # two more: the operator must not write again
    assert replicas(api_client, namespace) == 1
    # A spec change (here to the other writer's count, as a fix in Git would be) ends the
    # fight at once: writes resume and the block is removed.
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "qwen", {"spec": {"autoscaling": {"maxReplicas": 3}}})
    wait_for(lambda: replicas(api_client, namespace) > 1, "writes resumed after the spec change",
             timeout_s=30)
    wait_for(lambda: "replicaFight" not in autoscaling_status(api_client, namespace),
             "status.autoscaling.replicaFight removed", timeout_s=10)


def test_a_deployment_paused_at_zero_is_left_alone_and_resumes_without_a_fight(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm,
) -> None:
    """`kubectl scale --replicas=0` pauses a Deployment: taken for a revert of the operator's
    count, two pauses made a ReplicaFight that held the scale-out after the resume. Said
    once instead, with who scaled it (its managedFields)."""
    create(api_client, namespace, deployment("qwen"))
    create(api_client, namespace, tuning("qwen", "qwen", **SPEC))
    fake_vllm.queue_per_pod = 100.0
    apps = client.AppsV1Api(api_client)
    core = client.CoreV1Api(api_client)

    def pauses() -> list[Any]:
        return [e for e in core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=qwen").items
            if e.reason == "ScaledToZero"]

    for said, pause in enumerate((apps.patch_namespaced_deployment_scale,
                                  apps.patch_namespaced_deployment), start=1):
        wait_for(lambda: replicas(api_client, namespace) > 1, "the operator scaling out",
                 timeout_s=40)
        # As `kubectl scale` does, then as a Git manifest with replicas: 0 does.
        pause("qwen", namespace, {"spec": {"replicas": 0}})
        # This pause's Warning (the condition may still be the last pause's: the replicas
        # write lands before its evaluation's status write).
        wait_for(lambda said=said: len(pauses()) >= said, f"ScaledToZero Event {said}",
                 timeout_s=30)
        found = wait_scaling_reason(api_client, namespace, "ScaledToZero")
        assert found["status"] == "False"
        time.sleep(4)  # two intervals at 0: left there
        assert replicas(api_client, namespace) == 0
        apps.patch_namespaced_deployment_scale("qwen", namespace, {"spec": {"replicas": 1}})
    # Resumed twice: the load scales it out as before, with no revert counted.
    wait_for(lambda: replicas(api_client, namespace) > 1, "scaled out after the second resume",
             timeout_s=40)
    events = core.list_namespaced_event(namespace,
                                        field_selector="involvedObject.name=qwen").items
    reasons = [e.reason for e in events]
    assert "ReplicasReverted" not in reasons and "ReplicaFight" not in reasons, reasons
    paused = sorted(pauses(), key=lambda e: e.event_time or e.first_timestamp)
    assert [(e.type, e.count or 1) for e in paused] == [("Warning", 1)] * 2, paused
    # Through the scale subresource a 0 is left out of the Scale object, so its managedFields
    # name no writer of it; a Deployment patched to 0 names its writer.
    assert paused[0].message == ("Deployment qwen was scaled to 0 replicas; autoscaling "
                                 "leaves it at 0 until someone scales it up")
    assert "was scaled to 0 replicas (by " in paused[1].message and \
        "as its managedFields say)" in paused[1].message, paused[1].message
    assert "replicaFight" not in autoscaling_status(api_client, namespace)


def test_two_tunings_autoscaling_one_deployment_write_nothing(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm,
) -> None:
    """Each took the other's writes for reverts and they took turns (min 3 against max 2);
    now both say why they stop, and the replicas stay as they are."""
    create(api_client, namespace, deployment("qwen"))
    spec = SPEC["autoscaling"]
    create(api_client, namespace, tuning("qwen", "qwen", **{
        **SPEC, "autoscaling": {**spec, "minReplicas": 3, "maxReplicas": 4}}))
    create(api_client, namespace, tuning("qwen-small", "qwen", **{
        **SPEC, "autoscaling": {**spec, "minReplicas": 1, "maxReplicas": 2}}))
    found = wait_scaling_reason(api_client, namespace, "SeveralTunings")
    assert "InferenceTunings qwen-small also autoscale qwen" in found["message"]
    # Each tuning's evaluation writes its own status: the other's may land a moment later.
    wait_scaling_reason(api_client, namespace, "SeveralTunings", "qwen-small")
    evaluations_pass(api_client, namespace)  # two more of each
    evaluations_pass(api_client, namespace, name="qwen-small")
    assert replicas(api_client, namespace) == 1
    delete_tuning_and_wait(api_client, namespace, "qwen-small", "qwen-small deleted",
                           timeout_s=15)
    # Alone again: minReplicas 3 is applied.
    wait_for(lambda: replicas(api_client, namespace) == 3, "qwen scaling to its minimum",
             timeout_s=30)


def test_an_hpa_on_the_same_deployment_stops_writes(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm, prometheus: PrometheusServer, kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    create(api_client, namespace, deployment("qwen"))
    client.AutoscalingV2Api(api_client).create_namespaced_horizontal_pod_autoscaler(namespace, {
        "metadata": {"name": "qwen"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                    "name": "qwen"}, "minReplicas": 1, "maxReplicas": 3}})
    create(api_client, namespace, tuning("qwen", "qwen", **SPEC))
    fake_vllm.queue_per_pod = 100.0
    found = wait_scaling_reason(api_client, namespace, "HorizontalPodAutoscalerPresent")
    assert found["status"] == "False" and "HorizontalPodAutoscaler qwen" in found["message"]
    wait_for(lambda: autoscaling_status(api_client, namespace).get("desiredReplicas", 0) > 1,
             "a decision to scale out (which must not be written)", timeout_s=30)
    evaluations_pass(api_client, namespace)  # two more: still no write
    assert replicas(api_client, namespace) == 1
    # The CLI, reading what the operator reads, says the same and why.
    live = evaluate_cli(capsys, "--live", f"{namespace}/qwen", "--kubeconfig", str(kubeconfig),
                        "--prometheus", prometheus.url)
    assert live["desiredReplicas"] > 1 and live["write"]["replicas"] is None
    assert live["write"]["why"].startswith("not written (HorizontalPodAutoscalerPresent)")


def test_dry_run_reports_the_decision_and_writes_nothing(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm,
) -> None:
    create(api_client, namespace, deployment("qwen"))
    create(api_client, namespace, tuning("qwen", "qwen", mode="DryRun", **SPEC))
    fake_vllm.queue_per_pod = 100.0
    decision = wait_scale_out_decisions(api_client, namespace, timeout_s=40)[-1]
    assert decision["applied"] is False
    assert autoscaling_status(api_client, namespace)["desiredReplicas"] == 4
    assert replicas(api_client, namespace) == 1


def test_removing_autoscaling_removes_what_the_autoscaler_reported(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm,
) -> None:
    """ScalingActive, MetricsAvailable and status.autoscaling used to stay as last written
    once spec.autoscaling was removed: stale for good, and the written replicas were taken
    for a revert of someone's scaling once autoscaling came back."""
    create(api_client, namespace, deployment("qwen"))
    create(api_client, namespace, tuning("qwen", "qwen", **SPEC))
    wait_for(lambda: autoscaling_status(api_client, namespace).get("evaluated"),
             "an evaluation", timeout_s=30)
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "qwen", {"spec": {"autoscaling": None}})

    def cleared() -> dict[str, Any] | None:
        body = get_tuning(api_client, namespace, "qwen")
        status = body.get("status") or {}
        if (condition(body, "ScalingActive") is None
                and condition(body, "MetricsAvailable") is None
                and "autoscaling" not in status and condition(body, "Ready") is not None):
            return body
        return None

    body = wait_for(cleared, "the autoscaler's conditions and block removed", timeout_s=30)
    ready = condition(body, "Ready")
    assert ready is not None and ready["status"] == "True"
    time.sleep(4)  # two intervals: nothing writes them back
    assert cleared() is not None


def test_a_tuning_being_autoscaled_is_deleted_at_once(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm,
) -> None:
    """kopf removes its finalizer only after the tuning's autoscaling loop has ended: a loop
    that ignored kopf's stop held the deletion for ever."""
    create(api_client, namespace, deployment("qwen"))
    create(api_client, namespace, tuning("qwen", "qwen", **SPEC))
    wait_for(lambda: autoscaling_status(api_client, namespace).get("evaluated"),
             "a first evaluation", timeout_s=30)
    series = frozenset({"namespace": namespace, "name": "qwen", "deployment": "qwen"}.items())

    def exported() -> bool:
        assert operator.metrics_url is not None
        return series in operator_samples(operator.metrics_url).get(
            "infertune_autoscaling_current_replicas", {})

    if operator.metrics_url is not None:
        wait_for(exported, "the tuning's series in the operator's metrics")
    delete_tuning_and_wait(api_client, namespace, "qwen",
                           "the tuning deleted (its finalizer removed)", timeout_s=15)
    operator.check_running()
    assert replicas(api_client, namespace) == 1  # the Deployment is left as it was
    if operator.metrics_url is not None:
        # Its series go with it (they stayed until a restart, and a NotEvaluated alert
        # fired for good on a tuning that no longer existed).
        wait_for(lambda: not exported(), "the deleted tuning's series gone", timeout_s=10)


def test_autoscale_evaluate_live_decides_with_the_operators_stored_windows(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    fake_vllm: FakeVllm, prometheus: PrometheusServer, kubeconfig: Path,
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    """`autoscale evaluate --live` reads the replicas and the stabilization window the operator
    keeps in status: after a load spike, with the queue back to 0, it holds as the operator
    does, on the recommendations stored; the same tuning from a file (no status) holds as a
    new tuning does, on the current count taken as a recommendation made now."""
    spec = {**SPEC, "mode": "DryRun", "autoscaling": {
        **SPEC["autoscaling"], "scaleDown": {**SPEC["autoscaling"]["scaleDown"],
                                             "stabilization": "5m"}}}
    create(api_client, namespace, deployment("qwen", replicas=3))
    create(api_client, namespace, tuning("qwen", "qwen", **spec))
    fake_vllm.queue_per_pod = 200  # sustained: the window records a high recommendation
    wait_for(lambda: autoscaling_status(api_client, namespace).get("action") == "ScaleOut",
             "a (dry-run) ScaleOut recommendation", timeout_s=30)
    fake_vllm.queue_per_pod = 0
    held = wait_for(lambda: (s := autoscaling_status(api_client, namespace)).get(
        "queueDepth") == 0 and s.get("action") == "Hold" and s, "the queue back to 0, held")
    assert "scale-down stabilized at 3" in held["reason"]
    # The pods have no readiness probe: the operator says how it counts them instead.
    scaling = condition(get_tuning(api_client, namespace, "qwen"), "ScalingActive")
    assert scaling is not None and "container vllm has no readinessProbe or startupProbe" in \
        scaling["message"]

    apps = client.AppsV1Api(api_client)
    wait_for(lambda: apps.read_namespaced_deployment("qwen", namespace).status.ready_replicas
             == 3, "the 3 pods Ready")
    live = evaluate_cli(capsys, "--live", f"{namespace}/qwen", "--kubeconfig", str(kubeconfig),
                        "--prometheus", prometheus.url)
    assert (live["currentReplicas"], live["currentReplicasAssumed"]) == (3, False)
    # The Deployment's Ready pods that report the queue (no readiness probe), as the operator
    # reads them.
    assert live["signals"]["readyReplicas"] == 3
    assert (live["state"], live["action"], live["desiredReplicas"]) == (
        "status.autoscaling.state", "Hold", 3)
    assert "scale-down stabilized at 3" in live["reason"]
    assert "counts as one" not in live["reason"]  # the stored window, not a new one
    assert live["write"] == {"replicas": None, "why": "nothing to write: the replicas stay",
                             "notes": []}
    body = get_tuning(api_client, namespace, "qwen")
    manifest = write_manifest(body, tmp_path / "tuning.yaml")
    from_file = evaluate_cli(capsys, str(manifest), "--replicas", "3", "--prometheus",
                             prometheus.url)
    assert (from_file["state"], from_file["action"], from_file["desiredReplicas"]) == (
        "empty", "Hold", 3)
    assert "no recommendation in the last 5m before this one, so the current 3 counts as " \
        "one" in from_file["reason"]
    assert from_file["signals"]["readyReplicas"] is None  # no cluster read: not known
    assert replicas(api_client, namespace) == 3  # DryRun: nothing was written


def evaluate_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """`infertune autoscale evaluate ... --output json`, in this process."""
    args = build_parser().parse_args(["autoscale", "evaluate", *argv, "--output", "json"])
    try:
        assert args.handler(args) == 0, capsys.readouterr().err
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def write_manifest(body: dict[str, Any], path: Path) -> Path:
    """The tuning as a user would apply it: what `autoscale evaluate FILE` reads."""
    path.write_text(yaml.safe_dump({k: body[k] for k in ("apiVersion", "kind", "spec")} | {
        "metadata": {"name": body["metadata"]["name"],
                     "namespace": body["metadata"]["namespace"]}}))
    return path


def test_autoscale_evaluate_live_names_what_is_missing(
    api_client: client.ApiClient, namespace: str, kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    create(api_client, namespace, tuning("orphan", "nowhere", autoscaling={}))
    for ref, says in ((f"{namespace}/missing", f"InferenceTuning {namespace}/missing not found"),
                      (f"{namespace}/orphan", f"Deployment {namespace}/nowhere "
                                              "(spec.targetRef) not found")):
        args = build_parser().parse_args(["autoscale", "evaluate", "--live", ref,
                                          "--kubeconfig", str(kubeconfig),
                                          "--prometheus", "http://127.0.0.1:1"])
        try:
            assert args.handler(args) == 1
        finally:
            client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
        assert says in capsys.readouterr().err
