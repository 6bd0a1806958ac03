"""The Prometheus adapter against the real server scraping exporters built on prometheus_client.

One exporter speaks the text format (colon names stored as written), one speaks OpenMetrics
(prometheus_client 0.26 writes the colon as an underscore, so Prometheus stores
`vllm_num_requests_waiting`): the adapter must find both. Values are set by the test.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from e2e.cluster.processes import free_port
from e2e.fixtures.loopback import LoopbackServer
from e2e.fixtures.prometheus import PROMETHEUS_BINARY, MetricsEndpoint, PrometheusServer
from e2e.fixtures.waiting import wait_for
from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from urllib3.exceptions import DecodeError

from infertune import cli
from infertune.api.spec import Engine, InferenceTuning
from infertune.autoscale_cli import add_autoscale_commands
from infertune.metrics import prometheus as prometheus_adapter
from infertune.metrics import promql
from infertune.metrics.access import PrometheusAccess
from infertune.metrics.presets import PRESETS, EngineMetrics, HistogramLatency, Template
from infertune.metrics.prometheus import PrometheusSource
from infertune.metrics.promql import Scope
from infertune.metrics.source import MetricsTarget, target_for_tuning
from infertune.scaling.signals import TargetSignals, Window

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(not PROMETHEUS_BINARY.exists(), reason="needs /usr/bin/prometheus"),
]

BUCKETS = (0.05, 0.1, 0.2, 0.5, 1.0)
OBSERVED = 0.15
P99 = 0.1 + (0.2 - 0.1) * 0.99  # every observation in (0.1, 0.2]: linear interpolation
OBSERVE_EVERY_S = 0.05
HOSTILE_NS = '"} or 1==1 or {x="\\\n'


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    waiting: float
    observe: bool = True


class Exporter:
    """vLLM's gauges and latency histogram for some pods, observed at a fixed pace."""

    def __init__(self, engine: str, pods: list[Pod]) -> None:
        self.registry = CollectorRegistry()
        labels = ["namespace", "pod", "model_name"]
        queue = PRESETS[Engine(engine)].queue_depth
        latency = PRESETS[Engine(engine)].latency
        assert hasattr(latency, "name")
        self.waiting = Gauge(queue, "waiting", labels, registry=self.registry)
        self.latency = Histogram(latency.name, "e2e", labels, buckets=BUCKETS,
                                 registry=self.registry)
        self.pods = pods
        for pod in pods:
            self.waiting.labels(pod.namespace, pod.name, "qwen").set(pod.waiting)
            self.latency.labels(pod.namespace, pod.name, "qwen")  # exported even if unobserved

    def tick(self) -> None:
        for pod in self.pods:
            if pod.observe:
                self.latency.labels(pod.namespace, pod.name, "qwen").observe(OBSERVED)


@pytest.fixture(scope="module")
def exporters() -> Iterator[tuple[Exporter, Exporter, Exporter]]:
    text = Exporter("vllm", [
        Pod("serving", "llm-5d4f8b9c7-bcdfg", 40),
        Pod("serving", "llm-5d4f8b9c7-fghjk", 20),
        Pod("serving", "llmx-5d4f8b9c7-bcdfg", 900),  # not llm's: must not be counted
        Pod("serving", "llm-node-x7k2p", 500),  # DaemonSet llm-node: not llm's either
        Pod("serving", "llm-warmup-q8z4w", 700),  # Job llm-warmup: nor this one
        Pod("serving", "llm-sft-x2z4k", 800),  # Job llm-sft (no vowel): nor this one
        Pod("idle", "quiet-6c7d8-kkkkk", 3, observe=False),
        Pod("serving", "nan-6c7d8-kkkkk", float("nan")),
        Pod("serving", "half-6c7d8-kkkkk", float("nan")),  # one pod's exporter is broken
        Pod("serving", "half-6c7d8-zzzzz", 6),
        Pod(HOSTILE_NS, "llm-5d4f8b9c7-zzzzz", 7),
    ])
    openmetrics = Exporter("sglang", [Pod("serving", "sgl-7f9d5-xz2k4", 12)])
    twice = Exporter("vllm", [Pod("twice", "llm-5d4f8b9c7-bcdfg", 40),
                              Pod("twice", "llm-5d4f8b9c7-fghjk", 20)])
    stop = threading.Event()

    def observe() -> None:
        while not stop.wait(OBSERVE_EVERY_S):
            text.tick()
            openmetrics.tick()
            twice.tick()

    threading.Thread(target=observe, daemon=True).start()
    yield text, openmetrics, twice
    stop.set()


@pytest.fixture(scope="module")
def prometheus(exporters: tuple[Exporter, Exporter, Exporter]
               ) -> Iterator[PrometheusServer]:
    text, openmetrics, twice = exporters
    server = PrometheusServer().start()
    port = free_port()
    httpd, _ = start_http_server(port, addr="127.0.0.1", registry=openmetrics.registry)
    try:
        with MetricsEndpoint(text.registry) as endpoint, \
                MetricsEndpoint(twice.registry) as twice_endpoint:
            server.add_scrape_job("text", [endpoint.target])
            server.add_scrape_job("openmetrics", [f"127.0.0.1:{port}"])
            # Namespace "twice": its pods scraped by two jobs, as the prometheus.io/scrape
            # annotation job (every pod label copied) beside a ServiceMonitor (endpoint,
            # service, container) does: every series twice, differing in more than the job.
            server.add_scrape_job("twice", [twice_endpoint.target],
                                  labels={"app": "llm", "pod_template_hash": "5d4f8b9c7"})
            server.add_scrape_job("twice-again", [twice_endpoint.target], labels={
                "endpoint": "http", "service": "llm", "container": "vllm"})
            # And one job that finds them through two Services (a ServiceMonitor with
            # jobLabel): copies that share their job, differing in the Service.
            server.add_scrape_job("twice-services", [twice_endpoint.target],
                                  {"service": "llm"}, "/metrics", {"service": "llm-headless"})
            for job in ("text", "openmetrics", "twice", "twice-again", "twice-services"):
                server.wait_for_targets_up(job)
            yield server
    finally:
        httpd.shutdown()
        server.stop()


def target(namespace: str, deployment: str, engine: Engine = Engine.VLLM,
           **fields: Any) -> MetricsTarget:
    # A queue target below the exported values, so the window's dip is returned (and its
    # samples, when it is short of a full one).
    base: dict[str, Any] = {"metrics": PRESETS[engine], "window": "5s",
                            "queue_history_s": 3.0, "latency_step_s": 2.0, "queue_target": 5.0}
    return MetricsTarget(f"{namespace}/{deployment}", namespace, deployment, **(base | fields))


def templated(name: str, engine: str, queries: dict[str, str]) -> MetricsTarget:
    """Tuning serving/`name` of Deployment llm, with `queries` as its spec.metrics.queries,
    as a target with the short windows of `target`."""
    tuning = InferenceTuning.model_validate({
        "metadata": {"name": name, "namespace": "serving"},
        "spec": {"targetRef": {"name": "llm"}, "engine": engine,
                 "metrics": {"window": "5s", "queries": queries}}})
    return dataclasses.replace(target_for_tuning(tuning), queue_history_s=3.0,
                               latency_step_s=2.0, queue_target=5.0)


class QuietHandler(BaseHTTPRequestHandler):
    """A fake Prometheus's request handler, without a log line per request."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def served(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on a free local port, as the URL of a (fake) Prometheus."""
    server = LoopbackServer(handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def fetch_when(source: PrometheusSource, targets: list[MetricsTarget],
               ready: str) -> dict[str, TargetSignals]:
    """Fetch until the target `ready` has 3s of queue history and two latency samples."""
    def attempt() -> dict[str, TargetSignals] | None:
        got = source.fetch(targets, time.time())
        signals = got[ready]
        queue = signals.queue
        full = queue.samples >= queue.expected_samples and len(signals.latency.points) >= 2
        return got if full else None

    return wait_for(attempt, f"signals for {ready}", timeout_s=20)


@contextmanager
def scraped_as(prometheus: PrometheusServer, job: str,
               registry: CollectorRegistry) -> Iterator[None]:
    """`registry` served and scraped by the session's Prometheus as scrape job `job` (up once
    the block starts) until the block ends; the job is removed then, so it reaches no later
    test."""
    with MetricsEndpoint(registry) as endpoint:
        prometheus.add_scrape_job(job, [endpoint.target])
        try:
            prometheus.wait_for_targets_up(job)
            yield
        finally:
            prometheus.remove_scrape_job(job)


@contextmanager
def observing(child: Any, value: float) -> Iterator[None]:
    """`value` observed by the histogram `child` every OBSERVE_EVERY_S (a steady latency)
    until the block ends."""
    stop = threading.Event()

    def observe() -> None:
        while not stop.wait(OBSERVE_EVERY_S):
            child.observe(value)

    threading.Thread(target=observe, daemon=True).start()
    try:
        yield
    finally:
        stop.set()


def test_adapter_reads_queue_latency_and_rate_of_the_deployments_pods(
        prometheus: PrometheusServer) -> None:
    llm = target("serving", "llm")
    got = fetch_when(PrometheusSource(prometheus.url), [llm], llm.key)[llm.key]
    assert (got.queue.last, got.queue.dip) == (30.0, None)  # (40+20)/2, never at or below 5
    assert got.latency.points[-1][1] == pytest.approx(P99)
    assert got.latency_kind == "p99"
    two_pods = 2 / OBSERVE_EVERY_S
    assert got.request_rate.points[-1][1] == pytest.approx(two_pods, rel=0.5)
    # The time the batch was read for goes with it: a pass later in the slot judges the
    # freshness of the queue window (ending at that time) against it.
    assert got.read_at is not None and got.queue.end == math.floor(got.read_at)


def test_a_pod_scraped_by_two_jobs_counts_once(prometheus: PrometheusServer) -> None:
    """Summed per pod, the two copies doubled the queue (80 on a pod with 40 waiting) and the
    request rate, and the Deployment scaled out on half its real queue."""
    copies = prometheus.query('vllm:num_requests_waiting{namespace="twice", '
                              'pod="llm-5d4f8b9c7-bcdfg"}')
    assert sorted(c["metric"]["job"] for c in copies) == [
        "twice", "twice-again", "twice-services", "twice-services"]
    llm = target("twice", "llm")
    got = fetch_when(PrometheusSource(prometheus.url), [llm], llm.key)[llm.key]
    assert got.queue.last == 30.0 and got.queue.pods == 2
    assert got.request_rate.points[-1][1] == pytest.approx(2 / OBSERVE_EVERY_S, rel=0.5)


def test_colon_trap_both_spellings_are_found(prometheus: PrometheusServer) -> None:
    stored = {s["metric"]["__name__"]
              for s in prometheus.query('{__name__=~"(vllm|sglang).num_(requests_waiting|'
                                        'queue_reqs)"}')}
    assert stored == {"vllm:num_requests_waiting", "sglang_num_queue_reqs"}
    sgl = target("serving", "sgl", Engine.SGLANG)
    got = fetch_when(PrometheusSource(prometheus.url), [sgl], sgl.key)[sgl.key]
    assert got.queue.last == 12.0
    assert got.latency.points[-1][1] == pytest.approx(P99)


def test_hostile_namespace_matches_only_itself(prometheus: PrometheusServer) -> None:
    hostile = target(HOSTILE_NS, "llm")
    got = fetch_when(PrometheusSource(prometheus.url), [hostile], hostile.key)[hostile.key]
    assert (got.queue.last, got.queue.dip) == (7.0, None)


def test_no_data_is_never_zero(prometheus: PrometheusServer) -> None:
    llm, quiet, nan, ghost = (target("serving", "llm"), target("idle", "quiet"),
                              target("serving", "nan"), target("serving", "ghost"))
    got = fetch_when(PrometheusSource(prometheus.url), [llm, quiet, nan, ghost], llm.key)
    assert got[quiet.key].latency.problem == "only NaN or infinite values"  # 0/0 quantile
    assert got[quiet.key].request_rate.points[-1][1] == 0.0
    assert got[nan.key].queue.problem == "only NaN or infinite values"
    # One pod of two exporting NaN: the queue is the other's, over the one pod reporting
    # (the mean of both was NaN, and held the Deployment as "only NaN" while it lasted).
    half = target("serving", "half")
    queue = fetch_when(PrometheusSource(prometheus.url), [half], half.key)[half.key].queue
    assert (queue.last, queue.pods, queue.problem) == (6.0, 1, None)
    missing = got[ghost.key].queue
    # The metric first, in both spellings of the colon trap, and what to check.
    assert missing.problem == ("no series of vllm:num_requests_waiting or "
                               "vllm_num_requests_waiting for the pods of Deployment "
                               "serving/ghost (ghost-*): are they scraped, and do they export "
                               "it?"), missing.problem
    assert "(?:ghost)" in missing.query and "(?:llm" not in missing.query


def test_a_batch_of_targets_costs_one_query_per_signal(prometheus: PrometheusServer) -> None:
    targets = [target("serving", "llm"), target("serving", "sgl", Engine.SGLANG),
               target("idle", "quiet"), target("serving", "ghost"),
               *(target(f"ns-{i}", "llm") for i in range(20))]
    source = PrometheusSource(prometheus.url)
    fetch_when(source, targets[:1], "serving/llm")  # the history exists (run alone, too)
    before = queries(prometheus)
    source.fetch(targets, time.time())
    first = queries(prometheus)
    got = source.fetch(targets, time.time())
    after = queries(prometheus)
    # Two query shapes (vLLM, SGLang): the queue window is an instant query, latency and
    # request rate are range queries. The histograms' bucket bounds of each latency plan are
    # read once per FLOOR_REFRESH_S: with the first fetch of these plans, not the second.
    assert {h: first[h] - before[h] for h in after} == {"/api/v1/query": 4,
                                                         "/api/v1/query_range": 4}
    assert {h: after[h] - first[h] for h in after} == {"/api/v1/query": 2,
                                                        "/api/v1/query_range": 4}
    assert got["serving/llm"].latency_floor_s == BUCKETS[0]
    assert got["serving/sgl"].latency_floor_s == BUCKETS[0]
    assert got["serving/llm"].queue.available
    # Neither llmx's 900 in the same answer, nor llm-node's or llm-warmup's pods.
    assert got["serving/llm"].queue.last == 30.0
    assert not got["serving/ghost"].queue.available


def test_plans_are_reused_for_the_same_targets_and_redone_when_they_change(
        prometheus: PrometheusServer, monkeypatch: pytest.MonkeyPatch) -> None:
    planned: list[int] = []
    real = prometheus_adapter.plan_queries

    def counting(targets: Any, resolution_s: float) -> Any:
        planned.append(len(targets))
        return real(targets, resolution_s)

    monkeypatch.setattr(prometheus_adapter, "plan_queries", counting)
    source = PrometheusSource(prometheus.url)
    first = [target("serving", "llm")]
    fetch_when(source, first, "serving/llm")
    assert source.fetch(list(first), time.time())["serving/llm"].queue.last == 30.0
    assert planned == [1], "the same target objects were planned again"
    planned.clear()
    # A new target, and an equal target that is another object: both are planned again. The
    # short lists name their Deployments, so a stale plan would leave sgl without data.
    grown = source.fetch([target("serving", "llm"), target("serving", "sgl", Engine.SGLANG)],
                         time.time())
    assert planned == [2]
    assert grown["serving/sgl"].queue.available and grown["serving/llm"].queue.last == 30.0
    # As many targets as before, not the same ones.
    swapped = source.fetch([target("serving", "sgl", Engine.SGLANG), target("idle", "quiet")],
                           time.time())
    assert planned == [2, 2] and swapped["serving/sgl"].queue.available


def queries(prometheus: PrometheusServer) -> dict[str, float]:
    with urllib.request.urlopen(f"{prometheus.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    counts = {"/api/v1/query": 0.0, "/api/v1/query_range": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name == "prometheus_http_requests":
            for sample in family.samples:
                handler = sample.labels.get("handler", "")
                if sample.name.endswith("_total") and handler in counts:
                    counts[handler] += sample.value
    return counts


def test_the_window_is_what_the_raw_history_says(prometheus: PrometheusServer,
                                                 exporters: tuple[Exporter, ...]) -> None:
    """Prometheus's summary (last, dip, whether the window is full, the newest step above
    target) of a queue that drops below target and comes back equals `Window.of_points` over
    the same per-second history, read as a range query."""
    text, *_ = exporters
    wave = text.waiting.labels("serving", "wave-5d4f8b9c7-bcdfg", "qwen")
    wave.set(40)
    time.sleep(2.5)
    wave.set(2)  # below the target of 5
    time.sleep(2.5)
    wave.set(40)
    wave_target = target("serving", "wave", queue_history_s=8.0)
    source = PrometheusSource(prometheus.url)

    def window_after_the_dip() -> Window | None:
        got = source.fetch([wave_target], time.time())[wave_target.key].queue
        return got if got.last == 40.0 and got.dip is not None else None

    window = wait_for(window_after_the_dip, "the wave pod back above target", timeout_s=10)
    scope = Scope("namespace", "pod", ("serving",), ("wave",))
    raw = prometheus.query_range(promql.gauge_query(scope, PRESETS[Engine.VLLM].queue_depth),
                                 window.end - window.span, window.end, window.step)
    points = [(float(t), float(v)) for t, v in raw[0]["values"]]
    expected = Window.of_points(points, window.end, window.span, window.step, threshold=5.0)
    # A full window's count is not returned (the adapter takes it full): its steps are not
    # compared, only that it is full (a window with a gap: the test below).
    assert (window.last, window.dip, window.complete) == (
        expected.last, expected.dip, expected.complete)
    assert 2.0 in {v for _, v in points}  # the dip is in the history compared
    # Back under target: the newest step above it in the window is returned (a latency
    # breach is then still the load's), and the stats of above target are not.
    wave.set(2)

    def window_under_after_the_rise() -> Window | None:
        got = source.fetch([wave_target], time.time())[wave_target.key].queue
        return got if got.last == 2.0 and got.rise is not None else None

    under = wait_for(window_under_after_the_rise, "the wave pod under target again",
                     timeout_s=10)
    raw = prometheus.query_range(promql.gauge_query(scope, PRESETS[Engine.VLLM].queue_depth),
                                 under.end - under.span, under.end, under.step)
    points = [(float(t), float(v)) for t, v in raw[0]["values"]]
    expected = Window.of_points(points, under.end, under.span, under.step, threshold=5.0)
    assert (under.last, under.rise) == (expected.last, expected.rise)
    # The history may be shorter than the window yet (the steps are then counted).
    assert under.dip is None and min(under.samples, under.expected_samples) == min(
        expected.samples, expected.expected_samples)
    assert under.rise is not None and under.end - under.span < under.rise < under.end


def test_a_queue_window_with_a_gap_says_how_many_steps_it_has(
        prometheus: PrometheusServer, exporters: tuple[Exporter, ...]) -> None:
    """A scrape that fails on every pod of a target leaves steps of its queue window empty
    (Prometheus marks the series stale): the window query says how many steps have data, as
    `Window.of_points` counts them over the same history, and the queue is then not known
    low for a latency breach. A full window says nothing (the adapter takes it full)."""
    text, *_ = exporters
    labels = ("serving", "gap-5d4f8b9c7-bcdfg", "qwen")
    text.waiting.labels(*labels).set(2)  # below the target of 5
    gap_target = target("serving", "gap", queue_history_s=8.0)
    source = PrometheusSource(prometheus.url)

    def queue() -> Window:
        return source.fetch([gap_target], time.time())[gap_target.key].queue

    full = wait_for(lambda: (w := queue()).last == 2.0 and w.dip is None and w.rise is None
                    and w.complete and w, "a full window of the gap pod", timeout_s=20)
    assert full.samples == full.expected_samples == 8  # not returned: taken full
    text.waiting.remove(*labels)
    time.sleep(3.5)  # three scrapes or more without it
    text.waiting.labels(*labels).set(2)
    short = wait_for(lambda: (w := queue()).last == 2.0 and not w.complete and w,
                     "the gap pod back, with a gap in its window", timeout_s=10)
    scope = Scope("namespace", "pod", ("serving",), ("gap",))
    raw = prometheus.query_range(promql.gauge_query(scope, PRESETS[Engine.VLLM].queue_depth),
                                 short.end - short.span, short.end, short.step)
    points = [(float(t), float(v)) for t, v in raw[0]["values"]]
    expected = Window.of_points(points, short.end, short.span, short.step, threshold=5.0)
    assert (short.samples, short.last) == (expected.samples, expected.last)
    assert short.samples < short.expected_samples


def test_a_window_is_read_at_a_multiple_of_its_step(prometheus: PrometheusServer) -> None:
    """A subquery's steps are the multiples of its step: read at a time between two (a 5 s
    step at :03), a series that began after the last step had a `last` and no steps, and its
    `samples`, not returned, read as a full window (sustained at once)."""
    sent: list[dict[str, Any]] = []

    class Recording(requests.Session):
        def request(self, method: str | bytes, url: str | bytes,  # type: ignore[override]
                    *args: Any, **kwargs: Any) -> requests.Response:
            sent.append(dict(kwargs.get("params") or {}))
            return super().request(method, url, *args, **kwargs)

    llm = target("serving", "llm", queue_history_s=10.0)
    fetch_when(PrometheusSource(prometheus.url), [llm], llm.key)  # data to read
    now = math.floor(time.time() / 5) * 5 - 2  # 3 s past a multiple of 5
    got = PrometheusSource(prometheus.url, resolution_s=5.0, session=Recording()).fetch(
        [llm], now)[llm.key]
    (window_time,) = [p["time"] for p in sent if '"last"' in str(p.get("query"))]
    assert float(window_time) == got.queue.end == now - 3
    assert got.queue.last is not None and got.queue.problem is None, got.queue


def test_stopped_prometheus_is_no_data() -> None:
    port = free_port()  # nothing listens here
    got = PrometheusSource(f"http://127.0.0.1:{port}", timeout_s=1).fetch(
        [target("serving", "llm")], time.time())["serving/llm"]
    for series in (got.queue, got.latency, got.request_rate):
        assert not series.available
        assert series.problem is not None and "cannot connect" in series.problem
        assert "llm" in series.query


def test_a_hanging_prometheus_times_out_as_no_data() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # accepts connections, never answers
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        got = PrometheusSource(url, timeout_s=0.3).fetch([target("a", "b")], time.time())
    assert time.monotonic() - started < 5
    assert "timed out after 0.3s" in (got["a/b"].queue.problem or "")


@pytest.mark.parametrize("gzipped", [False, True])
def test_an_answer_sent_slowly_is_no_data_after_the_cycles_longest_wait(gzipped: bool) -> None:
    """requests' timeout applies to each read: a Prometheus (or a proxy) that answers at once
    and then sends its body a byte at a time never reached it, and the fetch, which every
    evaluation waits for, took as long as the body did."""
    body = json.dumps({"status": "success", "data": {"resultType": "vector",
                                                     "result": []}}).encode()
    stop = threading.Event()

    server = ThreadingHTTPServer(("127.0.0.1", 0), trickling(body, stop, gzipped))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        source = PrometheusSource(f"http://127.0.0.1:{server.server_address[1]}",
                                  timeout_s=0.5)
        started = time.monotonic()
        got = source.fetch([target("a", "b")], time.time())["a/b"]
        took = time.monotonic() - started
        # The queries' threads stop reading too: one that read on after the batch gave up
        # held a thread of the pool for the whole body (the next cycles' queries were not
        # started within their budget).
        source._pool.shutdown(wait=True)
        freed = time.monotonic() - started
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
    assert took < 5, took  # 1.5 timeouts from its start (0.75 s), not the 20 s of the body
    assert freed < 10, freed
    assert got.queue.problem is not None and got.queue.problem.endswith(
        "failed: its answer did not arrive in full within 0.75s (it answers, but slowly)"), \
        got.queue.problem


def test_an_answer_larger_than_any_query_result_is_no_data_at_its_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: a URL that streams (a file server, a stream, not a query API) grew
    the operator's memory without bound (2.3 GB in 7.5 s; 14 GB with a longer timeout), and
    was said as a slow answer."""
    monkeypatch.setattr(prometheus_adapter, "MOST_DECODED", 1 << 20)
    stop = threading.Event()

    class Stream(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(100 << 30))
            self.end_headers()
            chunk = b" " * (64 << 10)
            try:
                while not stop.is_set():
                    self.wfile.write(chunk)
            except OSError:
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        source = PrometheusSource(f"http://127.0.0.1:{server.server_address[1]}",
                                  timeout_s=20)
        got = source.fetch([target("a", "b")], time.time())["a/b"]
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
    assert got.queue.problem is not None and got.queue.problem.endswith(
        "failed: answered, but its answer could not be decoded (the answer is more than 1 "
        "MiB (is this a Prometheus query API? check the URL))"), got.queue.problem


def trickling(body: bytes, stop: threading.Event, gzipped: bool) -> type[QuietHandler]:
    """A fake Prometheus that answers at once, then sends its answer a byte at a time for
    20 s, each byte within a timeout of 0.5 s, until `stop` is set: 100 spaces before `body`,
    or, gzipped (as Prometheus answers), the bytes before any of it decodes (the gzip header
    and the block's code tables), the answer holding enough series to have them."""
    if not gzipped:
        sent, slow = b" " * 100 + body, 100  # JSON allows leading whitespace
    else:
        sent = gzip.compress(json.dumps({"status": "success", "data": {
            "resultType": "vector", "result": [
                {"metric": {"namespace": f"team-{i}", "infertune_target": f"m-{i * 7919 % 997}"},
                 "value": [1700000000 + i, str(i * 0.37)]} for i in range(40)]}}).encode())
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        slow = next(i for i in range(1, len(sent)) if inflate.decompress(sent[i - 1:i]))
    delay = 20 / slow
    assert delay < 0.5, slow

    class Trickle(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(sent)))
            self.end_headers()
            try:
                for byte in sent[:slow]:
                    if stop.wait(delay):
                        return
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                self.wfile.write(sent[slow:])
            except OSError:
                pass

    return Trickle


@pytest.mark.parametrize("gzipped", [False, True])
def test_cli_evaluate_exits_when_prometheus_answers_slowly(gzipped: bool) -> None:
    """It printed its answer (no data, exit 3), then waited for the query's thread to read
    the rest of the body before the process could end."""
    body = json.dumps({"status": "success", "data": {"resultType": "vector",
                                                     "result": []}}).encode()
    stop = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), trickling(body, stop, gzipped))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    example = Path(__file__).resolve().parent.parent / "examples" / "vllm-qwen2-7b-h200-mig.yaml"
    try:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "infertune", "autoscale", "evaluate", str(example),
             "--prometheus", f"http://127.0.0.1:{server.server_address[1]}", "--timeout",
             "0.5", "--output", "json"], capture_output=True, text=True, timeout=60)
        took = time.monotonic() - started
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
    assert done.returncode == 3, done.stderr
    assert "did not arrive in full within 0.75s" in done.stdout
    assert took < 15, took  # not the 20 s of the body


def test_cli_evaluate_ends_at_ctrl_c_while_prometheus_does_not_answer() -> None:
    """Ctrl-C printed a traceback, and the process went on until the query's timeout (the
    interpreter joins the query threads before it exits); a second one printed another."""
    example = Path(__file__).resolve().parent.parent / "examples" / "vllm-qwen2-7b-h200-mig.yaml"
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(60)
        # SIGINT as a terminal has it: a shell's background job (a CI runner's) ignores it,
        # and a child that inherits that never sees the signal.
        process = subprocess.Popen(
            [sys.executable, "-m", "infertune", "autoscale", "evaluate", str(example),
             "--prometheus", f"http://127.0.0.1:{listener.getsockname()[1]}", "--timeout",
             "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            held, _ = listener.accept()  # a query is in flight, and never answered
            with held:
                process.send_signal(signal.SIGINT)
                _, err = process.communicate(timeout=30)  # not the query's 60 s timeout
        finally:
            process.kill()
    assert process.returncode == 130, err
    assert err.strip() == "infertune: interrupted"


INTERRUPTED_INSIDE_A_LOCK = """
import argparse, os, signal, sys, threading
from infertune import cli

def broken_lock():
    try:
        os.kill(os.getpid(), signal.SIGINT)
        threading.Event().wait(1)  # the interrupt lands here
    except KeyboardInterrupt:
        # What a KeyboardInterrupt inside a lock's release leaves behind (Thread.start() in
        # the main thread, starting a query's thread): the lock is broken.
        raise RuntimeError("release unlocked lock") from None

def handler(args):
    if sys.argv[1] == "raised":
        broken_lock()
    try:  # as the adapter takes any exception of a query for no data, and goes on
        broken_lock()
    except Exception:
        threading.Event().wait(30)  # to the other queries' timeout
        return 3
    return 0

parser = argparse.ArgumentParser()
parser.set_defaults(handler=handler)
cli.build_parser = lambda: parser
raise SystemExit(cli.main([]))
"""


@pytest.mark.parametrize(("sigint", "exception"), [
    ("default", "raised"), ("default", "caught"), ("ignored", "raised")])
def test_ctrl_c_that_breaks_a_lock_still_ends_the_command_as_interrupted(
        sigint: str, exception: str) -> None:
    """Ctrl-C that landed while the main thread started a query's thread left that thread's
    lock broken: a RuntimeError traceback, then a wait for the query's 60 s timeout (one run
    in about a hundred of the test above). Caught in the command, it went on, and waited
    for the other queries' timeout before it ended (the test above timed out in a full run).
    The script stands in for such a command (what a KeyboardInterrupt at that point would
    leave, caught or not, then a wait as long as a query's): ended from the signal handler
    now, no exception reaches it, and it ends at the Ctrl-C either way. Where SIGINT is
    ignored (a background job), the command is left alone."""
    ignore = sigint == "ignored"
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_INSIDE_A_LOCK, exception], capture_output=True,
        text=True,
        timeout=20, preexec_fn=lambda: signal.signal(
            signal.SIGINT, signal.SIG_IGN if ignore else signal.SIG_DFL))
    if ignore:
        assert (done.returncode, done.stderr) == (0, "")
    else:
        assert (done.returncode, done.stderr) == (130, "infertune: interrupted\n")


def test_the_interrupt_handler_is_put_back_after_a_command(
        capsys: pytest.CaptureFixture[str]) -> None:
    """main() is called in-process too (tests, `python -m infertune` in a debugger): Python's
    own SIGINT handler is back when it returns. Set here: a CI runner's background job
    starts with SIGINT ignored, where main() leaves it alone."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert cli.main(["mig", "profiles", "NVIDIA-H100-80GB-HBM3"]) == 0
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        # Ignored (a background job): left ignored.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        assert cli.main(["mig", "profiles", "NVIDIA-H100-80GB-HBM3"]) == 0
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert "1g.10gb" in capsys.readouterr().out


def test_the_queries_of_a_batch_wait_for_a_hanging_prometheus_together() -> None:
    """Every tuning's evaluation waits for the batch: its plans are in flight at once, so a
    Prometheus that hangs costs one timeout, not one per plan."""
    held: list[socket.socket] = []
    accepted: list[float] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.1)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        done = threading.Event()

        def accept() -> None:
            while not done.is_set():
                try:
                    held.append(listener.accept()[0])  # read nothing, answer nothing
                except TimeoutError:
                    continue
                accepted.append(time.monotonic())

        acceptor = threading.Thread(target=accept)
        acceptor.start()
        try:
            # Two engines: two query shapes, six plans.
            targets = [target("a", "b"), target("a", "c", Engine.SGLANG)]
            got = PrometheusSource(url, timeout_s=2).fetch(targets, time.time())
        finally:
            done.set()
            acceptor.join()
            for connection in held:
                connection.close()
    assert "timed out after 2s" in (got["a/c"].latency.problem or "")
    # 6 plans, 4 at a time: four asked at once, the other two after the first timeouts.
    at_once = max(sum(1 for t in accepted if start <= t < start + 1) for start in accepted)
    assert (len(accepted), at_once) == (6, prometheus_adapter.PARALLEL_QUERIES), accepted


def test_slow_templates_hold_neither_the_presets_nor_the_batch_past_its_budget() -> None:
    """Twelve tunings with slow templates next to one on the preset. The presets' queries
    have their own pool and are answered. The templates' queue four at a time in theirs:
    those started within 1.5 timeouts run to their timeout, the others are no data for their
    own tunings, and a different four each cycle. Before, every tuning's evaluation waited a
    timeout per four slow templates."""
    class SlowForTemplates(QuietHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["query"][0]
            if "slow_metric" in query:
                time.sleep(3)
            kind = "matrix" if "query_range" in self.path else "vector"
            body = json.dumps({"status": "success",
                               "data": {"resultType": kind, "result": []}}).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the client gave up

    vllm = PRESETS[Engine.VLLM]
    slow = [MetricsTarget(f"t/s{i}", "t", f"s{i}", EngineMetrics(
        Template(f"slow_metric_{i}{{$selector}}"), None, vllm.latency)) for i in range(12)]
    left_out = []
    with served(SlowForTemplates) as url:
        source = PrometheusSource(url, timeout_s=1)
        for _ in range(2):
            got = source.fetch([target("t", "p"), *slow], time.time())
            assert (got["t/p"].queue.problem or "").startswith(  # answered
                "no series of vllm:num_requests_waiting or vllm_num_requests_waiting for "
                "the pods of Deployment t/p")
            problems = {t.key: got[t.key].queue.problem or "" for t in slow}
            timed_out = [k for k, p in problems.items() if "timed out after 1s" in p]
            not_started = [k for k, p in problems.items()
                           if "not started within 1.5s, this cycle's budget" in p]
            assert (len(timed_out), len(not_started)) == (8, 4), problems
            latency = {t.key: got[t.key].latency.problem for t in slow}
            assert latency == {t.key: "no series of vllm:e2e_request_latency_seconds_bucket "
                               "or vllm_e2e_request_latency_seconds_bucket for the pods of "
                               f"Deployment {t.namespace}/{t.deployment} ({t.deployment}-*): "
                               "are they scraped, and do they export it? Or is "
                               "spec.metrics.window (1m) under two scrape intervals? rate() "
                               "needs two samples in it"
                               for t in slow}, latency  # the preset's query
            left_out.append(set(not_started))
    assert left_out[0] != left_out[1]  # not the same tunings every cycle


def test_a_slow_prometheus_costs_a_batch_of_many_presets_the_budget_not_a_timeout_each(
) -> None:
    """Twelve preset plans (four engines) against a Prometheus that answers after 3 s, with
    a 1 s timeout: four start at once, four more when those time out, and the last four,
    not started within 1.5 timeouts, are no data at once. Before, the batch (and every
    tuning's evaluation) waited a timeout per four plans."""
    class Slow(QuietHandler):
        def do_GET(self) -> None:
            time.sleep(3)
            try:
                self.send_response(503)
                self.end_headers()
            except OSError:
                pass

    targets = [target("a", engine.value, engine)
               for engine in (Engine.VLLM, Engine.SGLANG, Engine.TGI, Engine.TRITON)]
    with served(Slow) as url:
        got = PrometheusSource(url, timeout_s=1).fetch(targets, time.time())
    problems = [s.problem or "" for t in targets
                for s in (got[t.key].queue, got[t.key].latency, got[t.key].request_rate)]
    assert len(problems) == 12
    assert sum("timed out after 1s" in p for p in problems) == 8, problems
    assert sum("not started within 1.5s, this cycle's budget" in p for p in problems) == 4


def test_a_running_template_counts_only_when_running_requests_are_read() -> None:
    vllm = PRESETS[Engine.VLLM]
    metrics = EngineMetrics(vllm.queue_depth, Template("r{$selector}"), vllm.latency)
    assert not MetricsTarget("a/b", "a", "b", metrics).uses_templates  # batching off
    assert MetricsTarget("a/b", "a", "b", metrics, want_running=True).uses_templates


def test_templates_turned_off_are_not_run_and_say_why() -> None:
    """infertune run --no-promql-templates: a template runs with the operator's access to
    Prometheus, so an administrator may refuse them; those tunings are told, the others are
    read as usual."""
    asked: list[str] = []

    class Recording(requests.Session):
        def request(self, method: str | bytes, url: str | bytes,  # type: ignore[override]
                    *args: Any, **kwargs: Any) -> requests.Response:
            asked.append(str((kwargs.get("params") or {}).get("query")))
            raise requests.ConnectionError("not asked in this test")

    vllm = PRESETS[Engine.VLLM]
    templated = MetricsTarget("t/x", "t", "x", EngineMetrics(Template("q{$selector}"), None,
                                                             vllm.latency))
    got = PrometheusSource("http://127.0.0.1:1", session=Recording(), templates=False).fetch(
        [templated, target("t", "p")], time.time())
    assert got["t/x"].queue.problem == prometheus_adapter.TEMPLATES_OFF
    assert "--no-promql-templates" in prometheus_adapter.TEMPLATES_OFF
    assert got["t/p"].queue.problem is not None and "cannot connect" in got["t/p"].queue.problem
    assert asked and not any("q{" in query for query in asked)


def test_custom_templates_read_what_the_preset_reads(prometheus: PrometheusServer) -> None:
    """engine custom with PromQL templates over the same vLLM series: the same queue, pods,
    p99 and request rate as the preset, through the real Prometheus. A template Prometheus
    refuses fails its own tunings only, with Prometheus's words and the query."""
    custom = templated("custom", "custom", {
        "queueDepth": "sum by (namespace, pod) "
                      "(vllm:num_requests_waiting{model_name=~'.+', $selector})"
                      " # a comment at the end",
        "latencyBuckets": "rate(vllm:e2e_request_latency_seconds_bucket{$selector}[$window])",
        "requestRate": "rate(vllm:e2e_request_latency_seconds_count{$selector}[$window])"})
    broken = MetricsTarget("serving/broken", "serving", "llm", EngineMetrics(
        Template("vllm:num_requests_waiting{$selector} +"), None, custom.metrics.latency),
        window="5s", queue_history_s=3.0, latency_step_s=2.0, queue_target=5.0)
    preset = target("serving", "llm")
    source = PrometheusSource(prometheus.url)
    fetch_when(source, [preset, custom, broken], custom.key)
    got = source.fetch([preset, custom, broken], math.floor(time.time()))
    mine, theirs = got[custom.key], got[preset.key]
    assert (mine.queue.last, mine.queue.pods) == (theirs.queue.last, theirs.queue.pods) \
        == (30.0, 2)
    assert mine.latency_kind == "p99"
    assert mine.latency.points[-1][1] == pytest.approx(P99)
    assert mine.request_rate.points[-1][1] == pytest.approx(
        theirs.request_rate.points[-1][1])
    refused = got[broken.key].queue
    assert refused.problem is not None and "bad_data" in refused.problem, refused.problem
    # Prometheus's words, not the client's dump of the answer's bytes (b'{"status":...').
    assert "HTTP Status Code 400 (bad_data): " in refused.problem and "parse error" in \
        refused.problem and "b'" not in refused.problem, refused.problem
    assert "vllm:num_requests_waiting{namespace=~" in (refused.query or "")
    assert got[broken.key].latency.problem is None  # only the refused query fails


def test_prometheus_errors_keep_other_series_label_values_out_of_status(
        prometheus: PrometheusServer) -> None:
    """A template that meets other series in an error ("found duplicate series ...") had
    Prometheus name them, label values and all, in the tuning's status: a tenant read what
    only numbers were to give back."""
    leaking = MetricsTarget("serving/leak", "serving", "llm", EngineMetrics(
        Template('(vector(1) or vllm:num_requests_waiting{$selector}) + on() group_left() '
                 '{__name__="up"}'), None, target("serving", "llm").metrics.latency),
        window="5s", queue_history_s=3.0, latency_step_s=2.0, queue_target=5.0)
    source = PrometheusSource(prometheus.url)
    problem = wait_for(lambda: source.fetch([leaking], time.time())[leaking.key].queue.problem,
                       "the template refused")
    assert "(execution)" in problem and "{...}" in problem, problem
    assert "instance=" not in problem and "job=" not in problem, problem


@pytest.mark.parametrize(("said", "shown"), [
    ('duplicate series [{__name__="up", uri="/users/{id}", team="payments"}, {pod="a"}] end',
     "duplicate series [{...}, {...}] end"),
    ('x {a="a}b", c="d"} y {} z {a}', "x {...} y {} z {a}"),  # a brace in a quoted value
    ('x {a="q\\"}", b="c"} y', "x {...} y"),  # an escaped quote
    ('cut short {a="b', "cut short {...}"),
])
def test_label_sets_are_cut_whatever_their_values_hold(said: str, shown: str) -> None:
    """A value with a brace of its own (Micrometer's uri="/users/{id}") ended the set early,
    and the labels after it went into status."""
    assert prometheus_adapter._without_label_sets(said) == shown


def test_a_negative_value_is_no_data(prometheus: PrometheusServer) -> None:
    """A template's subtraction (or delta()) can answer below 0, which no queue or rate can
    be: taken as it was, a queue of -30 per replica proposed fewer replicas, with no word
    of the template being wrong."""
    negative = templated("negative", "custom", {
        "queueDepth": "-sum by (namespace, pod) (vllm:num_requests_waiting{$selector})",
        "latencyBuckets": "rate(vllm:e2e_request_latency_seconds_bucket{$selector}[$window])",
        "requestRate": "-rate(vllm:e2e_request_latency_seconds_count{$selector}[$window])"})
    source = PrometheusSource(prometheus.url)

    def read() -> TargetSignals | None:
        got = source.fetch([negative], time.time())[negative.key]
        return got if len(got.latency.points) >= 2 else None

    got = wait_for(read, "two latency samples", timeout_s=20)
    assert got.queue.problem is not None and got.queue.problem.startswith(
        prometheus_adapter.NEGATIVE + " (-30)"), got.queue.problem
    assert got.request_rate.problem is not None and prometheus_adapter.NEGATIVE in \
        got.request_rate.problem
    assert got.latency.points[-1][1] == pytest.approx(P99)  # the latency is still read


def test_a_template_that_drops_the_pod_label_is_told_so(prometheus: PrometheusServer) -> None:
    """Its result had series, which cannot be told apart by Deployment; it read "no series
    for Deployment", as a selector that matches nothing does."""
    def problem(queries: dict[str, str]) -> str:
        """The queue's problem once the template's result has series (the pods' first scrape
        may be yet to come when this runs first)."""
        tuning = templated("summed", "vllm", queries)
        source = PrometheusSource(prometheus.url)

        def read() -> str | None:
            said = source.fetch([tuning], time.time())[tuning.key].queue.problem or ""
            return said if "the template's result" in said else None

        return wait_for(read, "a result without the labels", timeout_s=20)

    assert problem({"queueDepth": "sum(vllm:num_requests_waiting{$selector})"}) == (
        "no series for Deployment serving/llm: the template's result has series without the "
        "'namespace' label (spec.metrics.namespaceLabel) or the 'pod' label "
        "(spec.metrics.podLabel); keep 'namespace' and 'pod' in the result, for example sum by "
        "(namespace, pod) (...)")
    assert problem({"queueDepth": "sum by (namespace) (vllm:num_requests_waiting{$selector})"}
                   ).startswith("no series for Deployment serving/llm: the template's result "
                                "has series without the 'pod' label (spec.metrics.podLabel); "
                                "keep")
    # The namespace label summed away: told so too (it read "no series", with no hint).
    assert problem({"queueDepth": "sum by (pod) (vllm:num_requests_waiting{$selector})"}
                   ).startswith("no series for Deployment serving/llm: the template's result "
                                "has series without the 'namespace' label "
                                "(spec.metrics.namespaceLabel); keep")


@pytest.mark.parametrize("long", [False, True])
def test_a_template_that_fails_on_one_namespaces_data_fails_that_namespace_only(
        prometheus: PrometheusServer, long: bool) -> None:
    """One template in two namespaces: a group_left join fails ("many-to-many", "duplicate
    series") where the pods of namespace twice are scraped by several jobs, and so did the
    one query both read; serving lost its metrics to twice's series. Long (some 800
    characters), its query passed MAX_QUERY_URL and named no namespace any more: both
    namespaces read that one failing query again. Prometheus takes the long URL."""
    from infertune.metrics.plan import MAX_QUERY_URL, plan_queries, url_length

    models = "|".join(f"qwen2-7b-instruct-{i:03d}" for i in range(18)) if long else ""
    waiting = (f'vllm:num_requests_waiting{{$selector, model!~"{models}"}}' if long
               else "vllm:num_requests_waiting{$selector}")
    joined = EngineMetrics(Template(f"max by (namespace, pod) ({waiting}) * on (namespace, "
                                    f"pod) group_left () {waiting}"),
                           None, PRESETS[Engine.VLLM].latency)
    serving, twice = (replace(target(ns, "llm"), metrics=joined)
                      for ns in ("serving", "twice"))
    if long:
        assert isinstance(joined.queue_depth, Template) and len(joined.queue_depth.text) > 750
        assert any(url_length(plan.query() or "") > MAX_QUERY_URL
                   for plan in plan_queries([serving, twice], 1.0))
    got = fetch_when(PrometheusSource(prometheus.url), [serving, twice], serving.key)
    assert got[serving.key].queue.last == (40 * 40 + 20 * 20) / 2
    problem = got[twice.key].queue.problem or ""
    assert "duplicate series" in problem or "many-to-many" in problem, problem


def test_the_example_templates_parse_in_prometheus(prometheus: PrometheusServer) -> None:
    """The templates users copy (examples/, docs/autoscaling.md) are PromQL the real server
    parses once filled: their queries find no series here, and say so, rather than fail."""
    import re
    from pathlib import Path

    import yaml

    root = Path(__file__).parents[1]
    texts = [(root / "examples" / "custom-engine-promql.yaml").read_text()]
    texts += re.findall(r"```yaml\n(.*?)```", (root / "docs" / "autoscaling.md").read_text(),
                        re.S)
    tunings = []
    for text in texts:
        for body in yaml.safe_load_all(text):
            spec = (body or {}).get("spec") or {}
            if isinstance(spec, dict) and (spec.get("metrics") or {}).get("queries"):
                tunings.append(InferenceTuning.model_validate({
                    "metadata": {"name": f"t{len(tunings)}", "namespace": "examples"},
                    "spec": {"targetRef": {"name": "x"}, **spec}}))
    assert len(tunings) == 3
    targets = [target_for_tuning(t) for t in tunings]
    got = PrometheusSource(prometheus.url).fetch(targets, time.time())
    for t in targets:
        for series in (got[t.key].queue, got[t.key].latency, got[t.key].request_rate):
            # A preset's signal beside them (Triton's mean latency) names its metrics.
            problem = series.problem or ""
            assert problem.startswith("no series") and "Deployment examples/" in problem, problem


def test_the_documented_tensorrt_llm_templates_read_its_own_queue(
        prometheus: PrometheusServer) -> None:
    """Triton's pending-request count holds what Triton's scheduler queues, about 0 where the
    TensorRT-LLM backend takes each request at once and queues it itself: the templates
    docs/autoscaling.md gives read the backend's own gauge, per pod."""
    import re
    from pathlib import Path

    docs = (Path(__file__).parents[1] / "docs" / "autoscaling.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", docs, re.S)
                 if "nv_trt_llm_request_metrics" in b)
    queries = yaml.safe_load(block)["spec"]["metrics"]["queries"]
    registry = CollectorRegistry()
    labels = ["namespace", "pod", "model", "version"]
    pending = Gauge("nv_inference_pending_request_count", "pending", labels, registry=registry)
    backend = Gauge("nv_trt_llm_request_metrics", "TRT LLM request metrics",
                    [*labels, "request_type"], registry=registry)
    pod = "trt-5d4f8b9c7-bcdfg"
    pending.labels("serving", pod, "tensorrt_llm", "1").set(0)
    for kind, count in (("waiting", 7), ("scheduled", 3), ("active", 10), ("max", 64)):
        backend.labels("serving", pod, "tensorrt_llm", "1", kind).set(count)
    tuning = InferenceTuning.model_validate({
        "metadata": {"name": "trt", "namespace": "serving"},
        "spec": {"targetRef": {"name": "trt"}, "engine": "triton",
                 "metrics": {"window": "5s", "queries": queries}}})
    trt = dataclasses.replace(target_for_tuning(tuning), queue_history_s=3.0,
                              latency_step_s=2.0, queue_target=5.0, want_running=True)
    source = PrometheusSource(prometheus.url)

    def read() -> TargetSignals | None:
        got = source.fetch([trt], time.time())[trt.key]
        return got if got.queue.pods == 1 and got.running.last is not None else None

    with scraped_as(prometheus, "trt", registry):
        got = wait_for(read, "the TensorRT-LLM pod", timeout_s=20)
    assert (got.queue.last, got.running.last) == (7.0, 3.0)


def test_an_interval_of_a_fraction_of_a_second_reads_latency_at_every_second(
        prometheus: PrometheusServer) -> None:
    """interval 1.5s: the client rounded the range's start to a whole second, so on every
    other second the points missed the end and the latency read as stale."""
    llm = target("serving", "llm", latency_step_s=1.5)
    source = PrometheusSource(prometheus.url)
    fetch_when(source, [llm], llm.key)
    now = math.floor(time.time())
    for second in (now, now + 1):
        got = source.fetch([llm], second)[llm.key]
        assert got.latency.problem is None, (second, got.latency.problem)
        assert [t for t, _ in got.latency.points] == [second - 1.5, second]


@pytest.mark.parametrize("interval_s, step", [(1.001, "1001ms"), (1234.567, "1234567ms")])
def test_the_step_is_sent_exactly_so_the_newest_point_is_at_the_end(
        prometheus: PrometheusServer, interval_s: float, step: str) -> None:
    """The step went as f"{s:g}": 1234.567 s as 1234.57, so the points missed the end and
    the latency read as stale for ever. Even exact seconds are not: Prometheus multiplies
    them into nanoseconds in floating point and truncates (1.001 stepped 1 s). Sent as
    milliseconds, the newest point is at the end."""
    sent: list[dict[str, Any]] = []

    class Recording(requests.Session):
        def request(self, method: str | bytes, url: str | bytes,  # type: ignore[override]
                    *args: Any, **kwargs: Any) -> requests.Response:
            sent.append(dict(kwargs.get("params") or {}))
            return super().request(method, url, *args, **kwargs)

    fetch_when(PrometheusSource(prometheus.url), [target("serving", "llm")], "serving/llm")
    llm = target("serving", "llm", latency_step_s=interval_s)
    now = math.floor(time.time())
    got = PrometheusSource(prometheus.url, session=Recording()).fetch([llm], now)[llm.key]
    assert {p["step"] for p in sent if "step" in p} == {step}
    assert got.latency.problem is None, got.latency.problem
    assert got.latency.points[-1][0] == now


def test_every_query_carries_the_timeout_and_asks_for_a_whole_answer(
        prometheus: PrometheusServer) -> None:
    """The client gives up after timeout_s; Prometheus, told nothing, went on for its default
    2 minutes with every cycle's abandoned query. A Thanos Querier or VictoriaMetrics cluster
    answers with the stores that answered, by default: the pods of the one that failed went
    missing from the signals unsaid."""
    sent: list[dict[str, Any]] = []

    class Recording(requests.Session):
        def request(self, method: str | bytes, url: str | bytes,  # type: ignore[override]
                    *args: Any, **kwargs: Any) -> requests.Response:
            sent.append(dict(kwargs.get("params") or {}))
            return super().request(method, url, *args, **kwargs)

    llm = target("serving", "llm")
    fetch_when(PrometheusSource(prometheus.url), [llm], llm.key)  # latency data to read
    PrometheusSource(prometheus.url, timeout_s=2.5, session=Recording()).fetch(
        [llm], time.time())
    # The queue, latency and rate queries, and the latency histogram's bucket bounds.
    assert len(sent) == 4 and all(p.get("timeout") == "2.5" for p in sent), sent
    assert all(p.get("partial_response") == "false" and p.get("deny_partial_response") == "1"
               for p in sent), sent
    # Prometheus takes it: "2.5s" was refused as a duration, and every query with it.
    got = PrometheusSource(prometheus.url, timeout_s=2.5).fetch([target("serving", "nobody")],
                                                                 time.time())["serving/nobody"]
    assert "for the pods of Deployment serving/nobody" in (got.queue.problem or ""), \
        got.queue.problem


def test_an_http_error_is_no_data() -> None:
    class Unavailable(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"overloaded")

    with served(Unavailable) as url:
        got = PrometheusSource(url).fetch([target("a", "b")], time.time())["a/b"]
    assert "503" in (got.latency.problem or "")


@pytest.mark.parametrize("answer, says", [
    (b"<html><body>Sign in</body></html>", "answered with something other than JSON"),
    (b'{"status":"success","data":null}', "is not a Prometheus query result"),
    (b"[1,2]", "is not a Prometheus query result"),
    (b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},'
     b'"value":[1]}]}}', "is not a Prometheus query result"),
    (b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},'
     b'"value":[1,"x"]}]}}', "is not a Prometheus query result"),
    # Nested too deeply for the JSON decoder: its RecursionError left fetch, which every
    # tuning of the batch shares.
    (b"[" * 200_000, "is not a Prometheus query result (RecursionError"),
])
def test_an_answer_that_is_not_prometheus_is_no_data_that_says_so(answer: bytes,
                                                                   says: str) -> None:
    """A URL that reaches a login page or another service answers 200: that was reported as
    "cannot connect (refused or unreachable)", or as a bare Python error."""
    class NotPrometheus(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(answer)

        do_POST = do_GET

    with served(NotPrometheus) as url:
        got = PrometheusSource(url).fetch([target("a", "b")], time.time())["a/b"]
    for problem in (got.queue.problem, got.latency.problem):
        assert problem is not None and says in problem and "check the URL" in problem, problem


def test_an_error_answered_with_http_200_is_no_data_in_prometheus_words() -> None:
    """A Prometheus-compatible server (or a proxy) that answers an error with HTTP 200: the
    client's missing "data" was said as "not a Prometheus query result (KeyError: 'data');
    check the URL", and the server's own words, which say what is wrong, were lost."""
    class ErrorWith200(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({
                "status": "error", "errorType": "execution",
                "error": 'query limits: too many series for {tenant="team-a"}'}).encode())

        do_POST = do_GET

    with served(ErrorWith200) as url:
        got = PrometheusSource(url).fetch([target("a", "b")], time.time())["a/b"]
    for problem in (got.queue.problem, got.latency.problem, got.request_rate.problem):
        assert problem is not None and problem.startswith(
            f"Prometheus at {url} failed: answered with an error (execution): query limits: "
            "too many series for {...}"), problem  # label values cut, as other errors'

    class Forging(ErrorWith200):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps({
                "status": "error", "errorType": "x\ndecision: ScaleIn 4 -> 1" * 20,
                "error": "\nwrite: scaled 4 -> 40" * 500}).encode())

        do_POST = do_GET

    # Its words in one line, cut: a newline in them printed lines that read as the
    # evaluation's, 3,500 characters long.
    with served(Forging) as url:
        got = PrometheusSource(url).fetch([target("a", "b")], time.time())["a/b"]
    problem = got.latency.problem or ""
    assert "\n" not in problem and "\\n" in problem and len(problem) < 400 + len(url), problem


def test_prometheus_warnings_come_with_the_signals_and_are_logged_once(
        prometheus: PrometheusServer, caplog: pytest.LogCaptureFixture, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A real Prometheus whose remote read fails answers with its local data and a warning
    (the data may lack what the remote store holds); the client drops warnings, so the
    operator read the answer as whole."""
    llm = target("serving", "llm")
    source = PrometheusSource(prometheus.url)
    assert fetch_when(source, [llm], llm.key)[llm.key].warnings == ()
    dead = f"http://127.0.0.1:{free_port()}/api/v1/read"
    prometheus.set_remote_read([dead])
    path = tmp_path / "tuning.yaml"
    path.write_text(TUNING)
    try:
        with caplog.at_level("WARNING", logger=prometheus_adapter.__name__):
            cycles = [source.fetch([llm], time.time())[llm.key] for _ in range(2)]
        logged = [r.getMessage() for r in caplog.records if "warned" in r.getMessage()]
        capsys.readouterr()
        assert run_cli(["autoscale", "evaluate", str(path), "--prometheus", prometheus.url,
                        "--replicas", "2"]) == 0
        printed = capsys.readouterr().out.splitlines()
    finally:
        prometheus.set_remote_read([])
    for got in cycles:
        assert got.queue.available and got.latency.available  # the local data, as before
        # Once, though each of the queue, latency and request-rate answers carried it.
        assert len(got.warnings) == 1 and got.warnings[0].startswith("remote_read: "), got
        assert dead in got.warnings[0]
    assert len(logged) == 1 and "queries of 1 tuning(s)" in logged[0], logged
    assert source.fetch([llm], time.time())[llm.key].warnings == ()
    assert [line for line in printed if line.startswith("warning: ")] == [
        f"warning: Prometheus warned with its answer: {cycles[0].warnings[0]}"]


@pytest.mark.parametrize(("said", "kept"), [
    ("x" * 400, "x" * 300 + "..."),
    ('found series {job="a", team="payments"}\nNEXT', "found series {...}\\nNEXT"),
])
def test_warnings_are_kept_short_without_label_values_or_control_characters(
        said: str, kept: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert prometheus_adapter._warnings((said, said)) == (kept,)
    # Cut before it is cleaned: cleaned whole, 89 MB of warning took minutes of CPU.
    cleaned: list[int] = []
    clean = prometheus_adapter._without_label_sets
    monkeypatch.setattr(prometheus_adapter, "_without_label_sets",
                        lambda text: cleaned.append(len(text)) or clean(text))
    assert prometheus_adapter._warnings(("{a}" * 1_000_000,)) == ("{a}" * 100 + "...",)
    assert cleaned == [1200]


def test_a_warning_is_logged_again_only_after_no_cycle_had_it_for_ten_minutes(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tunings of two intervals have batches that alternate: logged whenever the batch before
    had not had it, a lasting warning was logged every few cycles."""
    source = PrometheusSource("http://127.0.0.1:9")
    clock = [1000.0]
    monkeypatch.setattr(prometheus_adapter.time, "monotonic", lambda: clock[0])
    warned = {"a/b": {"remote_read: down": None}}
    with caplog.at_level("WARNING", logger=prometheus_adapter.__name__):
        for batch, at in ((warned, 0), ({}, 15), (warned, 60), ({}, 120), (warned, 599),
                          (warned, 1300), ({}, 1310), (warned, 1320)):
            clock[0] = 1000.0 + at
            source._log_warnings(batch)
    logged = [r.getMessage() for r in caplog.records if "warned" in r.getMessage()]
    # At 0, and at 1300: 701 s after the last batch that had it (599).
    assert len(logged) == 2 and logged[0] == (
        "Prometheus at http://127.0.0.1:9 warned, with the answer of the queries of 1 "
        "tuning(s): remote_read: down"), logged


def test_a_template_that_returns_native_histograms_is_told_to_take_a_number_of_them() -> None:
    """A result of native histograms is a Prometheus answer: it read as one that is no query
    result, "check the URL"."""
    histogram = {"count": "4", "sum": "1.5", "buckets": [[0, "0.1", "0.2", "4"]]}

    class Histograms(QuietHandler):
        def do_GET(self) -> None:
            ranged = self.path.startswith("/api/v1/query_range")
            item: dict[str, Any] = {"metric": {"namespace": "a", "pod": "b-5d4f8b9c7-bcdfg"}}
            if ranged:
                item["histograms"] = [[time.time(), histogram]]
            else:
                item["histogram"] = [time.time(), histogram]
            body = json.dumps({"status": "success", "data": {
                "resultType": "matrix" if ranged else "vector", "result": [item]}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

    with served(Histograms) as url:
        got = PrometheusSource(url).fetch([target("a", "b")], time.time())["a/b"]
    for problem in (got.queue.problem, got.latency.problem):
        assert problem is not None and problem.startswith(
            "the query returns native histograms, not numbers"), problem
        assert "check the URL" not in problem


def test_a_connection_closed_without_an_answer_is_not_said_to_be_refused() -> None:
    """A Prometheus (or proxy) that accepts the connection and closes it without answering
    (crashing, restarting) read "cannot connect (refused or unreachable)", which sends the
    reader to the network."""
    class Hangup(QuietHandler):
        def do_GET(self) -> None:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

        do_POST = do_GET

    with served(Hangup) as url:
        got = PrometheusSource(url).fetch([target("a", "b")], time.time())["a/b"]
    for problem in (got.queue.problem, got.latency.problem):
        assert problem is not None and "closed without an answer" in problem, problem
        assert "refused" not in problem


def test_a_host_name_that_does_not_resolve_is_said_to_be_one() -> None:
    """A mistyped Service name read "cannot connect (refused or unreachable)", as a
    Prometheus that is down does. `.invalid` never resolves (RFC 6761)."""
    got = PrometheusSource("http://prometheus.no-such-namespace.invalid:9090").fetch(
        [target("a", "b")], time.time())["a/b"]
    for problem in (got.queue.problem, got.latency.problem):
        assert problem is not None and "cannot resolve its host name" in problem, problem
        assert "refused" not in problem


def test_a_long_deployment_name_is_refused_with_a_reason(prometheus: PrometheusServer) -> None:
    long = replace(target("serving", "x" * 50), key="serving/long")
    got = PrometheusSource(prometheus.url).fetch([long], time.time())["serving/long"]
    assert "longer than 46 characters" in (got.queue.problem or "")


@pytest.mark.parametrize("bad", [{"pod_label": "__name__"}, {"namespace_label": "inf"},
                                 {"queue_history_s": math.inf},
                                 {"pod_label": "infertune_target"},
                                 {"namespace_label": "pod"}, {"latency_step_s": 2.0005},
                                 {"metrics": EngineMetrics("group:left", None,
                                                           PRESETS[Engine.VLLM].latency)}])
def test_a_target_whose_query_cannot_be_built_fails_alone(prometheus: PrometheusServer,
                                                          bad: dict[str, Any]) -> None:
    """`validate` (or the spec validation) refuses these; one stored before the check (the
    models take the last four, so as not to stop its pod tuning) goes without data alone,
    not every tuning of the batch."""
    llm, broken = target("serving", "llm"), target("serving", "sgl", Engine.SGLANG, **bad)
    source = PrometheusSource(prometheus.url)
    got = fetch_when(source, [llm, broken], llm.key)
    assert got[llm.key].queue.last == 30.0
    problem = got[broken.key].queue.problem or got[broken.key].latency.problem or ""
    assert any(why in problem for why in ("cannot be built", "beyond what a query can read",
                                          "not a whole number of milliseconds")), \
        got[broken.key]


TUNING = (Path(__file__).parent / "fixtures" / "autoscale" / "tuning.yaml").read_text()


def run_cli(argv: list[str]) -> int:
    """The exit status, argparse's own (2, a command line that does not parse) included."""
    parser = argparse.ArgumentParser(prog="infertune")
    add_autoscale_commands(parser.add_subparsers(dest="command", required=True))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exited:
        return int(exited.code or 0)
    result: int = args.handler(args)
    return result


def test_cli_evaluate_prints_signals_decision_and_reason(
        prometheus: PrometheusServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tuning.yaml"
    path.write_text(TUNING)
    fetch_when(PrometheusSource(prometheus.url), [target("serving", "llm")], "serving/llm")
    argv = ["autoscale", "evaluate", str(path), "--prometheus", prometheus.url,
            "--replicas", "2", "--output", "json"]
    assert run_cli(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"signals", "desiredReplicas", "action", "reason"} <= set(out)
    assert out["signals"]["queuePerReplica"] == 30.0
    assert out["signals"]["queuePods"] == 2  # llm's two pods, not llmx's
    assert out["signals"]["latencyBreaches"] == 2  # p99 0.199s against a 100ms target
    # Latency breached with the queue at target (Auto): the batch is the cause, not the load,
    # but with batching Off nothing lowers it, so replicas do: ceil(2 x 0.199s / 100ms).
    assert (out["action"], out["desiredReplicas"]) == ("ScaleOut", 4)
    assert "nothing lowers the batch: scale out -> 4" in out["reason"]
    assert "queue 30.0/replica vs target 32" in out["reason"]
    # The queries, with every signal found too (they were "" then), each as a person would
    # paste it: for llm alone, and answering with its numbers.
    queries = out["queries"]
    assert set(queries) == {"queue", "latency", "requestRate"}
    last = [s for s in prometheus.query(queries["queue"])
            if s["metric"].get("infertune_stat") == "last"]
    assert [(s["metric"]["infertune_target"], float(s["value"][1])) for s in last] == [
        ("llm", 30.0)]
    for name in ("latency", "requestRate"):
        assert {s["metric"]["infertune_target"] for s in prometheus.query(queries[name])} \
            == {"llm"}, name
    assert run_cli(argv[:-2]) == 0
    assert f"query (queue): {queries['queue']}" in capsys.readouterr().out


DEPLOYMENT = """
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: llm, namespace: serving}
spec:
  selector: {matchLabels: {app: llm}}
  template:
    metadata: {labels: {app: llm}}
    spec:
      containers:
      - name: vllm
        image: vllm/vllm-openai:v0.11.0
        command: [vllm, serve, Qwen/Qwen2-7B-Instruct, --max-num-seqs, "64"]
"""


@pytest.mark.parametrize("beside", [True, False])
def test_cli_evaluate_steps_batching_from_the_deployment_in_the_file(
        prometheus: PrometheusServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        beside: bool) -> None:
    """The operator steps from the knob on the pod template; the command ignored the
    Deployment beside the tuning and stepped from max (256 -> 128, where the operator says
    64 -> 32)."""
    path = tmp_path / "tuning.yaml"
    path.write_text(TUNING + "  batching: {mode: Recommend}\n" + (DEPLOYMENT if beside else ""))
    fetch_when(PrometheusSource(prometheus.url), [target("serving", "llm")], "serving/llm")
    argv = ["autoscale", "evaluate", str(path), "--prometheus", prometheus.url,
            "--replicas", "2", "--output", "json"]
    assert run_cli(argv) == 0
    batching = json.loads(capsys.readouterr().out)["batching"]
    if beside:
        assert "from 64 (on the pod template)" in batching["reason"], batching
        assert batching["recommended"] < 64
    else:
        assert "current setting unknown" in batching["reason"], batching


def test_cli_reports_bad_input_without_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tuning.yaml"
    path.write_text(TUNING.replace("  autoscaling:\n", "  unused:\n"))
    assert run_cli(["autoscale", "evaluate", str(path), "--prometheus", "http://x:1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(path) in err


@pytest.mark.parametrize(("where", "says", "code"), [
    # Options that do not go together: a command line error, exit 2 as argparse's own.
    ([], "give either TUNING.yaml or --live NAMESPACE/NAME", 2),
    (["tuning.yaml", "--live", "serving/llm"], "give either TUNING.yaml or --live", 2),
    (["tuning.yaml", "--kubeconfig", "k"], "--kubeconfig is only read with --live", 2),
    # A reference of the wrong form: a value of the wrong type, exit 2 too.
    (["--live", "llm"], "expected NAMESPACE/NAME", 2),
    (["--live", "serving/llm/x"], "expected NAMESPACE/NAME", 2),
    (["--live", "/llm"], "expected NAMESPACE/NAME", 2),
    # Both parts go into the request's path: ".." reached another resource.
    (["--live", "../llm"], "'..' is not a namespace name", 2),
    (["--live", "serving/.."], "'..' is not an object name", 2),
])
def test_cli_says_where_the_tuning_comes_from_before_reading_anything(
        where: list[str], says: str, code: int, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tuning.yaml").write_text(TUNING)
    assert run_cli(["autoscale", "evaluate", *where, "--prometheus", "http://x:1"]) == code
    assert says in capsys.readouterr().err


def test_the_queue_is_summed_per_pod_and_pods_are_counted_not_series(
        prometheus: PrometheusServer, exporters: tuple[Exporter, ...]) -> None:
    """An engine that exports its queue once per model (Triton) or per data-parallel rank has
    several series per pod: counted as series, 4 of them made one pod look like 4 replicas
    reporting, and the queue was their mean instead of the pod's total."""
    text, *_ = exporters
    for model, waiting in (("a", 30), ("b", 10), ("c", 2), ("d", 6)):
        text.waiting.labels("serving", "multi-5d4f8b9c7-bcdfg", model).set(waiting)
    text.waiting.labels("serving", "multi-5d4f8b9c7-fghjk", "a").set(12)
    multi = target("serving", "multi")
    source = PrometheusSource(prometheus.url)

    def both_pods() -> Window | None:
        got = source.fetch([multi], time.time())[multi.key].queue
        return got if got.pods == 2 else None

    window = wait_for(both_pods, "the multi pods scraped", timeout_s=10)
    assert window.last == (48 + 12) / 2  # the mean of the pods' totals


def test_data_parallel_ranks_sum_their_queue_and_average_their_batch(
        prometheus: PrometheusServer, exporters: tuple[Exporter, ...]) -> None:
    """A vLLM pod running two data-parallel ranks exports each gauge once per rank: the pod's
    queue is what waits at both, while the batch (max-num-seqs is per engine process) is
    each rank's: summed per pod, the running peak seeded a batch size twice too high."""
    text, *_ = exporters
    running = Gauge("vllm:num_requests_running", "running", ["namespace", "pod", "model_name"],
                    registry=text.registry)
    for rank, (waiting, serving) in (("r0", (4, 10)), ("r1", (6, 30))):
        text.waiting.labels("serving", "dp-5d4f8b9c7-bcdfg", rank).set(waiting)
        running.labels("serving", "dp-5d4f8b9c7-bcdfg", rank).set(serving)
    dp = target("serving", "dp", want_running=True)
    source = PrometheusSource(prometheus.url)

    def read() -> TargetSignals | None:
        got = source.fetch([dp], time.time())[dp.key]
        return got if got.queue.pods == 1 and got.running.last is not None else None

    got = wait_for(read, "the dp pod scraped", timeout_s=10)
    assert got.queue.last == 10  # 4 + 6 waiting at the one pod
    assert got.running.last == 20  # each rank serves 20 on average


def test_sglang_tensor_parallel_copies_of_a_queue_count_once(
        prometheus: PrometheusServer) -> None:
    """SGLang with --enable-metrics-for-all-schedulers: each tensor-parallel rank's scheduler
    exports the waiting queue it was broadcast, one series per `tp_rank`. Summed per pod, a
    queue of 10 at tp-size 4 read 40, and the Deployment scaled out on load that was not
    there. Data-parallel ranks (`dp_rank`) hold queues of their own, which add up."""
    registry = CollectorRegistry()
    labels = ["namespace", "pod", "model_name", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank"]
    queue = Gauge("sglang:num_queue_reqs", "queue", labels, registry=registry)
    latency = Histogram("sglang:e2e_request_latency_seconds", "e2e",
                        ["namespace", "pod", "model_name"], buckets=BUCKETS, registry=registry)
    tp, dp = "ranks-7f9d5c8b6-xz2k4", "ranks-7f9d5c8b6-bcdfg"
    for rank in range(4):  # one queue of 10, seen by each tensor-parallel rank (--ep-size 4)
        queue.labels("serving", tp, "qwen", str(rank), "0", str(rank), "").set(10)
    for rank, waiting in ((0, 4), (1, 6)):  # two data-parallel ranks, one queue each
        for tp_rank in range(2):
            queue.labels("serving", dp, "qwen", str(tp_rank), "0", "0", str(rank)).set(waiting)
    for pod in (tp, dp):
        latency.labels("serving", pod, "qwen").observe(OBSERVED)
    sglang = target("serving", "ranks", Engine.SGLANG)
    source = PrometheusSource(prometheus.url)

    def both() -> Window | None:
        got = source.fetch([sglang], time.time())[sglang.key].queue
        return got if got.pods == 2 else None

    with scraped_as(prometheus, "ranks", registry):
        window = wait_for(both, "both SGLang pods", timeout_s=20)
    assert window.last == 10.0, window  # (10 + (4 + 6)) / 2 pods; read 40 and 20 before


def test_cli_evaluate_refuses_templates_as_an_operator_that_does(
        prometheus: PrometheusServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The preview of a tuning with a template, as an operator run with --no-promql-templates
    sees it: no data, saying why (and exit 3), rather than data the operator does not read."""
    body = yaml.safe_load(TUNING)
    body["spec"]["metrics"] = {"queries": {
        "queueDepth": "sum by (namespace, pod) (vllm:num_requests_waiting{$selector})"}}
    path = tmp_path / "tuning.yaml"
    path.write_text(yaml.safe_dump(body))
    argv = ["autoscale", "evaluate", str(path), "--prometheus", prometheus.url,
            "--replicas", "2", "--output", "json"]
    assert run_cli([*argv, "--no-promql-templates"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert any("--no-promql-templates" in p for p in out["signals"]["problems"])
    fetch_when(PrometheusSource(prometheus.url), [target("serving", "llm")], "serving/llm")
    assert run_cli(argv) == 0  # the template reads what the preset reads
    assert json.loads(capsys.readouterr().out)["signals"]["queuePerReplica"] == 30.0


def refuse_bounds_reads(monkeypatch: pytest.MonkeyPatch, source: PrometheusSource) -> None:
    """Every read of the histograms' bucket bounds fails, as with a Prometheus that refuses
    or times out on that one query."""
    def refused(*_: Any) -> dict[Any, float]:
        raise requests.ConnectionError("refused")

    monkeypatch.setattr(source, "_read_floors", refused)


VLLM_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
"""vllm:e2e_request_latency_seconds as vLLM V1 exports it (vllm/v1/metrics/loggers.py)."""


def test_each_deployment_gets_its_own_histograms_lowest_bucket(
        prometheus: PrometheusServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """With vLLM's own buckets a P99 of 50 ms reads as 297 ms. The bound is each target's:
    read once for the whole plan, a Deployment with finer buckets hid another's coarse ones
    (its 297 ms then counted as a breach), and the other way round a real breach of the
    fine one was taken for the coarse one's resolution."""
    registry = CollectorRegistry()
    labels = ["namespace", "pod", "model_name"]
    latency = Histogram("vllm:e2e_request_latency_seconds", "e2e", labels,
                        buckets=VLLM_E2E_BUCKETS, registry=registry)
    Gauge("vllm:num_requests_waiting", "waiting", labels, registry=registry).labels(
        "serving", "coarse-5d4f8b9c7-bcdfg", "qwen").set(1)
    pod = latency.labels("serving", "coarse-5d4f8b9c7-bcdfg", "qwen")
    coarse, fine = target("serving", "coarse"), target("serving", "llm")
    source = PrometheusSource(prometheus.url)
    with observing(pod, 0.05):
        fetch_when(source, [coarse, fine], fine.key)  # the bounds read: none for coarse yet

        def latency_of_both() -> dict[str, TargetSignals] | None:
            got = source.fetch([coarse, fine], time.time())
            return got if all(len(got[t.key].latency.points) >= 2
                              for t in (coarse, fine)) else None

        with scraped_as(prometheus, "coarse", registry):
            got = wait_for(latency_of_both, "latency of both", timeout_s=30)
    assert got[coarse.key].latency.points[-1][1] == pytest.approx(0.99 * 0.3)
    # Read with the new Deployment's first latency data, not FLOOR_RETRY_S after the last
    # read: for a minute its 297 ms counted as a breach of 75 ms.
    assert got[coarse.key].latency_floor_s == 0.3 and not got[coarse.key].latency_floor_unknown
    assert got[fine.key].latency_floor_s == BUCKETS[0]


def test_a_latency_whose_bounds_could_not_be_read_is_marked_unknown(
        prometheus: PrometheusServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounds read failed (a 503, or it did not answer within the batch's budget): the
    quantile was compared with the target as if it were exact, and vLLM's 297 ms for a
    50 ms P99 breached the default 75 ms. Bounds read before are kept through a failure."""
    source = PrometheusSource(prometheus.url)
    llm = target("serving", "llm")
    refuse_bounds_reads(monkeypatch, source)
    got = fetch_when(source, [llm], llm.key)
    assert got[llm.key].latency.available
    assert got[llm.key].latency_floor_s is None and got[llm.key].latency_floor_unknown
    # Why, and the query, for MetricsAvailable: that the latency is not compared holds
    # every scale-in, and it said only "could not be read".
    problem = got[llm.key].latency_floor_problem
    assert problem.startswith("the last read failed: cannot connect"), problem
    assert "(query: " in problem and 'infertune_target' in problem and "llm" in problem
    monkeypatch.undo()
    later = time.monotonic() + prometheus_adapter.FLOOR_RETRY_S
    monkeypatch.setattr(prometheus_adapter.time, "monotonic", lambda: later)
    read = source.fetch([llm], time.time())[llm.key]
    assert read.latency_floor_s == BUCKETS[0] and not read.latency_floor_unknown
    assert read.latency_floor_problem == ""
    refuse_bounds_reads(monkeypatch, source)
    even_later = later + prometheus_adapter.FLOOR_REFRESH_S
    monkeypatch.setattr(prometheus_adapter.time, "monotonic", lambda: even_later)
    kept = source.fetch([llm], time.time())[llm.key]
    assert kept.latency_floor_s == BUCKETS[0] and not kept.latency_floor_unknown


def test_bounds_read_before_survive_a_new_batch_whose_read_fails(
        prometheus: PrometheusServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tuning joining the batch changes the bounds query (it names the Deployments); its
    first read failed, and every Deployment of the batch lost the bounds read a moment
    before: their latency was not compared, and MetricsAvailable flapped for a minute."""
    source = PrometheusSource(prometheus.url)
    llm, other = target("serving", "llm"), target("serving", "llmx")
    assert fetch_when(source, [llm], llm.key)[llm.key].latency_floor_s == BUCKETS[0]
    refuse_bounds_reads(monkeypatch, source)
    got = source.fetch([llm, other], time.time())[llm.key]
    assert got.latency_floor_s == BUCKETS[0] and not got.latency_floor_unknown


def test_bounds_of_another_histogram_are_not_borrowed(
        prometheus: PrometheusServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuning switched its latency histogram (spec.metrics) and the first read of the
    new one's bounds failed: the old histogram's lowest bucket (0.05 s) stood for the new
    one's (0.3 s), and its 297 ms artefact breached 75 ms."""
    registry = CollectorRegistry()
    coarse = Histogram("other_latency_seconds", "coarse", ["namespace", "pod"],
                       buckets=(0.3, 1.0, 5.0), registry=registry)
    pod = coarse.labels("serving", "llm-5d4f8b9c7-bcdfg")
    source = PrometheusSource(prometheus.url)
    llm = target("serving", "llm")
    other = replace(llm, metrics=replace(
        llm.metrics, latency=HistogramLatency("other_latency_seconds")))
    with observing(pod, 0.05):
        assert fetch_when(source, [llm], llm.key)[llm.key].latency_floor_s == BUCKETS[0]
        refuse_bounds_reads(monkeypatch, source)
        with scraped_as(prometheus, "other", registry):
            got = wait_for(lambda: (lambda s: s if len(s.latency.points) >= 2 else None)(
                source.fetch([other], time.time())[other.key]), "the other histogram",
                timeout_s=30)
    assert got.latency.points[-1][1] == pytest.approx(0.99 * 0.3)
    assert got.latency_floor_s is None and got.latency_floor_unknown


def test_a_histogram_in_milliseconds_is_read_in_seconds(prometheus: PrometheusServer) -> None:
    """Triton's nv_inference_first_response_histogram_ms (spec.metrics.latencyHistogramUnit:
    ms): read as seconds, its 50 ms were 50 s, and its lowest bound 10 s."""
    registry = CollectorRegistry()
    ms = Histogram("nv_inference_first_response_histogram_ms", "first response", [
        "namespace", "pod"], buckets=(10.0, 50.0, 100.0, 500.0), registry=registry)
    pod = ms.labels("triton", "tri-5d4f8b9c7-bcdfg")
    source = PrometheusSource(prometheus.url)
    base = target("triton", "tri")
    tri = replace(base, metrics=replace(base.metrics, latency=HistogramLatency(
        "nv_inference_first_response_histogram_ms", 1e-3)))
    with observing(pod, 40.0), MetricsEndpoint(registry) as endpoint:
        prometheus.add_scrape_job("ms", [endpoint.target])
        try:
            prometheus.wait_for_targets_up("ms")
            got = wait_for(lambda: (lambda s: s if len(s.latency.points) >= 2
                                    and s.latency_floor_s is not None else None)(
                source.fetch([tri], time.time())[tri.key]), "the ms histogram",
                timeout_s=30)
        finally:
            prometheus.remove_scrape_job("ms")
    # Every request in (10, 50] ms: the quantile interpolates to 49.6 ms.
    assert got.latency.points[-1][1] == pytest.approx(0.0496)
    assert got.latency_floor_s == pytest.approx(0.010)


def test_bounds_no_batch_uses_any_more_are_forgotten(prometheus: PrometheusServer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounds are kept per floor query, which names the batch's Deployments: with
    tunings coming and going, the ones nobody asks for any more were kept for ever."""
    source = PrometheusSource(prometheus.url)
    llm, sgl = target("serving", "llm"), target("serving", "sgl", Engine.SGLANG)
    fetch_when(source, [llm], llm.key)
    assert len(source._floors) == 1
    later = time.monotonic() + prometheus_adapter.FLOOR_FORGET_S + 1
    monkeypatch.setattr(prometheus_adapter.time, "monotonic", lambda: later)
    got = source.fetch([sgl], time.time())
    assert got[sgl.key].latency_floor_s == BUCKETS[0]
    assert len(source._floors) == 1 and "sglang" in next(iter(source._floors))


def test_the_lowest_bound_is_one_every_pod_of_the_target_has(
        prometheus: PrometheusServer) -> None:
    """Two pods of one Deployment with other bucket layouts (a rollout across engine
    versions): the quantile of their summed buckets resolves no finer than the coarse one,
    but the bound read was the fine one's, and the coarse pod's fast requests read as a P99
    near its lowest bound, a breach of the target."""
    registries = []
    for pod, buckets in (("llm-5d4f8b9c7-bcdfg", BUCKETS), ("llm-6f7c9d8b5-fghjk",
                                                          (0.3, 1.0, 2.0))):
        registry = CollectorRegistry()
        Histogram("vllm:e2e_request_latency_seconds", "e2e", ["namespace", "pod"],
                  buckets=buckets, registry=registry).labels("mixed", pod).observe(0.05)
        registries.append(registry)
    mixed = target("mixed", "llm")
    source = PrometheusSource(prometheus.url)
    with MetricsEndpoint(registries[0]) as fine, MetricsEndpoint(registries[1]) as coarse:
        prometheus.add_scrape_job("mixed-fine", [fine.target])
        prometheus.add_scrape_job("mixed-coarse", [coarse.target])
        try:
            prometheus.wait_for_targets_up("mixed-fine")
            prometheus.wait_for_targets_up("mixed-coarse")
            text = promql.latency_floor_query(mixed_scope(mixed), PRESETS[Engine.VLLM], "5s")
            assert text is not None
            wait_for(lambda: len(prometheus.query(
                'count by (pod) (vllm:e2e_request_latency_seconds_bucket{namespace="mixed"})'))
                == 2, "both pods scraped")
            # Read at a whole second: one after both pods' first scrape, never before.
            time.sleep(2.0)
            bounds = sorted(float(s["metric"]["le"]) for s in prometheus.query(text))
            assert bounds == [1.0, math.inf]  # not 0.05: only the fine pod has it
            floors = source._read_floors(text, "namespace", time.time())
            assert floors == {("mixed", "llm"): 1.0}
        finally:
            prometheus.remove_scrape_job("mixed-fine")
            prometheus.remove_scrape_job("mixed-coarse")


class _BoundNotANumber:
    """A bucket series whose `le` is no number, as a tenant's exporter may serve it."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        bucket = GaugeMetricFamily("vllm:e2e_request_latency_seconds_bucket", "not a bound",
                                   labels=["namespace", "pod", "le"])
        bucket.add_metric(["tenant", "evil-5d4f8b9c7-bcdfg", "abc"], 1)
        yield bucket


def test_a_bound_that_is_no_number_costs_no_other_target_its_bounds(
        prometheus: PrometheusServer) -> None:
    """One pod's `le="abc"` failed the whole read of the bounds, which every namespace of a
    latency plan shares: none of their latencies was compared with its target, and none
    scaled in, for as long as the pod served it."""
    registry = CollectorRegistry()
    Histogram("vllm:e2e_request_latency_seconds", "e2e", ["namespace", "pod"],
              buckets=BUCKETS, registry=registry).labels(
        "victim", "llm-5d4f8b9c7-bcdfg").observe(0.05)
    registry.register(_BoundNotANumber())  # type: ignore[arg-type]
    victim, tenant = target("victim", "llm"), target("tenant", "evil")
    scope = Scope("namespace", "pod", ("tenant", "victim"), ("evil", "llm"))
    text = promql.latency_floor_query(scope, PRESETS[Engine.VLLM], "5s")
    assert text is not None
    with MetricsEndpoint(registry) as endpoint:
        prometheus.add_scrape_job("bound-not-a-number", [endpoint.target])
        try:
            prometheus.wait_for_targets_up("bound-not-a-number")
            wait_for(lambda: {s["metric"]["le"] for s in prometheus.query(text)
                              if s["metric"]["namespace"] == "tenant"} == {"abc"},
                     "the tenant's bucket in the bounds query")
            # Read at a whole second (as _read_floors asks): one after the first scrape.
            time.sleep(2.0)
            floors = PrometheusSource(prometheus.url)._read_floors(text, "namespace",
                                                                   time.time())
        finally:
            prometheus.remove_scrape_job("bound-not-a-number")
    assert floors == {victim.series_key: BUCKETS[0]}
    assert tenant.series_key not in floors


def mixed_scope(t: MetricsTarget) -> Scope:
    return Scope(t.namespace_label, t.pod_label, (t.namespace,), (t.deployment,))


def test_two_engine_processes_on_two_ports_of_a_pod_add_up(
        prometheus: PrometheusServer) -> None:
    """Two engines in one pod (two ports, one scrape job): two instances whose queues add up.
    Taking the copies of a double scrape once must not take these once too."""
    registries = []
    for waiting in (20.0, 10.0):
        registry = CollectorRegistry()
        Gauge("vllm:num_requests_waiting", "waiting", ["namespace", "pod"],
              registry=registry).labels("ports", "llm-5d4f8b9c7-bcdfg").set(waiting)
        registries.append(registry)
    llm = target("ports", "llm")
    with MetricsEndpoint(registries[0]) as first, MetricsEndpoint(registries[1]) as second:
        prometheus.add_scrape_job("ports", [first.target, second.target])
        try:
            prometheus.wait_for_targets_up("ports")
            source = PrometheusSource(prometheus.url)

            def window() -> Window | None:  # the 3 s history both instances are in
                queue = source.fetch([llm], time.time())[llm.key].queue
                full = queue.available and queue.samples >= queue.expected_samples
                return queue if full else None

            got = wait_for(window, "the queue of both processes", timeout_s=20)
        finally:
            prometheus.remove_scrape_job("ports")
    assert (got.last, got.pods) == (30.0, 1)


USERINFO_REFUSED = ("holds a user and password, and a command-line argument or an "
                    "environment variable is shown to whoever lists processes or reads the pod")


@pytest.mark.parametrize(("url", "says"), [
    ("http://user:s3cret@127.0.0.1:1", f"'http://***@127.0.0.1:1' {USERINFO_REFUSED}"),
    ("http://user:s3c@s3cret@127.0.0.1:1", f"'http://***@127.0.0.1:1' {USERINFO_REFUSED}"),
    ("user:s3cret@prometheus:1", "'***@prometheus:1' must start with http:// or https://"),
    # urlsplit ends the host at the "/": refused for its port.
    ("http://user:s3c/s3cret@127.0.0.1:1", "'http://***@127.0.0.1:1': the port is not a number"),
])
def test_a_password_in_the_url_is_refused_and_not_repeated(url: str, says: str) -> None:
    """requests sent user:password@ in the URL as Basic credentials, from a command line every
    process list shows (and the chart's Deployment), where the Authorization header is
    refused for that reason. Without a scheme, the message repeated the password."""
    with pytest.raises(ValueError) as refused:
        PrometheusSource(url, timeout_s=0.5)
    assert "s3c" not in str(refused.value)
    assert str(refused.value).startswith(f"Prometheus URL {says}"), refused.value
    if USERINFO_REFUSED in says:
        assert "--prometheus-credentials-file and --prometheus-auth-type Basic" in \
            str(refused.value)


@pytest.mark.parametrize(("status", "says"), [
    (404, "HTTP Status Code 404: no Prometheus query API at that address (another service, "
          "or a path prefix missing from the URL?); check the URL"),
    (502, "HTTP Status Code 502, with an HTML page instead of Prometheus's answer; check the "
          "URL"),
    (414, "HTTP Status Code 414: the query is longer than Prometheus, or a proxy in front "
          "of it, takes in a URL; its PromQL template is repeated in it, so shorten "
          "spec.metrics.queries or raise the proxy's limit"),
])
def test_an_http_error_page_is_said_in_words_not_in_markup(status: int, says: str) -> None:
    """A URL without Prometheus's path prefix, or a proxy's error page: the condition held 300
    characters of escaped HTML. A proxy's 414 (a template's long query) said to check the
    Prometheus URL, which was right."""
    class Page(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<!DOCTYPE HTML>\n<html lang='en'><head><title>Error</title>"
                             b"</head><body>" + b"x" * 400 + b"</body></html>")

    with served(Page) as url:
        got = PrometheusSource(url).fetch([target("a", "b")], time.time())["a/b"]
    assert got.queue.problem is not None and got.queue.problem.endswith(says), got.queue.problem
    assert "<" not in got.queue.problem


def test_series_that_carry_the_operators_own_labels_fail_no_other_tuning(
        prometheus: PrometheusServer) -> None:
    """A pod exporting two copies of its gauges and histogram that differ only in
    `infertune_target` (any tenant can): set to its Deployment, they were one label set, and
    Prometheus refused the whole shared query (422 "vector cannot contain metrics with the
    same labelset"): every tuning of the batch lost its queue pod count, its running batch
    and the bounds of its latency histogram."""
    registry = CollectorRegistry()
    labels = ["namespace", "pod", promql.TARGET_LABEL]
    waiting = Gauge("vllm:num_requests_waiting", "waiting", labels, registry=registry)
    running = Gauge("vllm:num_requests_running", "running", labels, registry=registry)
    latency = Histogram("vllm:e2e_request_latency_seconds", "e2e", labels, buckets=BUCKETS,
                        registry=registry)
    for value in ("x", "y"):
        waiting.labels("spoof", "app-5d4f8b9c7-bcdfg", value).set(1)
        running.labels("spoof", "app-5d4f8b9c7-bcdfg", value).set(1)
        latency.labels("spoof", "app-5d4f8b9c7-bcdfg", value).observe(OBSERVED)
    llm = target("serving", "llm", want_running=True)
    spoof = target("spoof", "app", want_running=True)
    source = PrometheusSource(prometheus.url)

    def fetched() -> dict[str, TargetSignals] | None:
        got = source.fetch([llm, spoof], time.time())
        return got if got[spoof.key].running.available else None

    with scraped_as(prometheus, "spoof", registry):
        got = wait_for(fetched, "the spoofing pod's running batch", timeout_s=20)
    mine = got[llm.key]
    assert mine.queue.problem is None and mine.queue.pods == 2, mine.queue.problem
    assert not mine.latency_floor_unknown and mine.latency_floor_s == BUCKETS[0]
    # The spoofing pod's own copies are taken once, as copies of a double scrape are (the
    # running batch is a mean over series: refused with the rest before).
    theirs = got[spoof.key]
    assert (theirs.queue.pods, theirs.running.last) == (1, 1.0), theirs.running.problem


def test_answers_are_decoded_as_their_content_encoding_says() -> None:
    """The adapter decodes what it reads itself (to keep the reading within its time)."""
    body = b'{"status": "success"}'
    decoded = prometheus_adapter._decoded
    assert decoded(gzip.compress(body), "gzip") == body
    assert decoded(gzip.compress(body[:5]) + gzip.compress(body[5:]), "x-gzip") == body
    assert decoded(zlib.compress(body), "deflate") == body
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert decoded(raw.compress(body) + raw.flush(), "deflate") == body  # as some servers do
    assert decoded(body, "") == decoded(body, "identity") == body
    # An empty body (a proxy's 401 or 503) is empty whatever its encoding: its status says.
    assert decoded(b"", "gzip") == decoded(b"", "deflate") == b""
    # What follows the last member and is none is left, as urllib3 leaves it.
    for tail in (b"\n", b"\x00" * 8):
        assert decoded(gzip.compress(body) + tail, "gzip") == body
    with pytest.raises(DecodeError, match="cut short"):
        decoded(gzip.compress(body)[:-12], "gzip")
    with pytest.raises(DecodeError, match="'br' was not asked for"):
        decoded(body, "br")


def test_an_answer_is_decoded_within_its_time_and_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A few MiB of gzip that decode to GiB (a hostile or broken proxy) took 6 GiB and 20 s,
    decoded whole after the time the batch had given up on it."""
    monkeypatch.setattr(prometheus_adapter, "MOST_DECODED", 1 << 20)
    monkeypatch.setattr(prometheus_adapter, "DECODE_STEP", 1 << 16)
    bomb = gzip.compress(b"\0" * (4 << 20))
    with pytest.raises(DecodeError, match="decodes to more than 1 MiB"):
        prometheus_adapter._decoded(bomb, "gzip")
    with pytest.raises(DecodeError, match="decodes to more than 1 MiB"):
        prometheus_adapter._decoded(zlib.compress(b"\0" * (4 << 20)), "deflate")
    with pytest.raises(requests.exceptions.ReadTimeout, match="not decoded within its time"):
        prometheus_adapter._decoded(gzip.compress(b"{}"), "gzip", time.monotonic() - 1)
    assert prometheus_adapter._decoded(gzip.compress(b"\0" * (1 << 19)), "gzip") == \
        b"\0" * (1 << 19)
    # The limit is the whole answer's, not each gzip member's.
    many = b"".join(gzip.compress(b"\0" * (1 << 18)) for _ in range(8))
    with pytest.raises(DecodeError, match="decodes to more than 1 MiB"):
        prometheus_adapter._decoded(many, "gzip")
    # A member longer than a step ends within a step: what follows it was read twice (the
    # next member decoded twice, or for ever when it was as long).
    two = gzip.compress(b"A" * 300_000) + gzip.compress(b"tail")
    assert prometheus_adapter._decoded(two, "gzip") == b"A" * 300_000 + b"tail"
    both_long = gzip.compress(b"A" * 300_000) + gzip.compress(b"B" * 300_000)
    assert prometheus_adapter._decoded(both_long, "gzip", time.monotonic() + 60) == \
        b"A" * 300_000 + b"B" * 300_000
    # A deflate stream cut short is said so, as a gzip one is.
    with pytest.raises(DecodeError, match="deflate stream is cut short"):
        prometheus_adapter._decoded(zlib.compress(os.urandom(20_000))[:5_000], "deflate")


def test_the_answers_encoding_is_asked_for_as_given_or_as_the_adapter_decodes() -> None:
    """requests asks for br and zstd too where their modules are installed, which the
    adapter does not decode; an Accept-Encoding given with --prometheus-header goes as it is."""
    seen: list[str | None] = []

    class Recording(QuietHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Accept-Encoding"))
            body = b'{"status": "success", "data": {"resultType": "vector", "result": []}}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with served(Recording) as url:
        PrometheusSource(url, timeout_s=2.0)._client.custom_query("up")
        given = PrometheusAccess.parse(headers=["Accept-Encoding: identity"])
        PrometheusSource(url, timeout_s=2.0, access=given)._client.custom_query("up")
    assert seen == ["gzip, deflate", "identity"]


def test_an_answer_that_cannot_be_decoded_is_said_so() -> None:
    """A proxy that answers with an encoding not asked for: Prometheus (or the proxy)
    answered, and MetricsAvailable said it could not be connected to."""

    class Brotli(QuietHandler):
        def do_GET(self) -> None:
            body = b"not really brotli"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Encoding", "br")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with served(Brotli) as url:
        got = PrometheusSource(url, timeout_s=2.0).fetch([target("a", "b")], time.time())
    problem = got["a/b"].queue.problem or ""
    assert "failed: answered, but its answer could not be decoded (" in problem, problem
    assert "'br' was not asked for" in problem


def test_any_error_text_is_said_without_control_characters_or_label_sets() -> None:
    """The last resort for an error's words (an exception none of the known kinds is) cut
    label sets and length, but kept control characters: one that carried what a server
    sent, with a newline in it, printed lines that read as the evaluation's own."""
    said = prometheus_adapter._describe(
        ValueError('upstream said\nvalid {team="payments"} \x1b[2J' + "x" * 400), 1.0)
    assert "\n" not in said and "\x1b" not in said, said
    assert said.startswith("upstream said\\nvalid {...} \\x1b[2J"), said
    assert "payments" not in said and len(said) == 303 and said.endswith("..."), said
