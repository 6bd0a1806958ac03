"""Cost of one autoscaling evaluation cycle at 1, 100 and 1000 tunings, on the real Prometheus.

Run: ``python -m bench.autoscale_bench`` (~3 min). A synthetic vLLM exporter (a separate
process, so its CPU is not counted) serves the real metric names for 1000 Deployments of one
pod each; Prometheus scrapes it every second. After 35 s of history, each cycle is what the
operator does in one interval slot for N InferenceTunings, short of the Kubernetes API calls
themselves: every tuning's pass in the slot (the cached spec, the listing, `signals_if_due`,
whose first call fetches one batch for all of them), then `plan_evaluation` for each, as
`autoscaling.evaluate` calls it: the state read back from the status the last cycle left
(a varied history of 20 recommendations to start with), the decision, and the whole status
patch (conditions, `status.autoscaling` with the new state, decision records, the Event
text). Replicas follow the writes, as the scale subresource would return them. HTTP requests
are counted on the session; CPU is time.process_time over the cycle, and separately over the
fetch. Cycles are one interval (2 s) apart, as in the operator, which also lets Prometheus
finish its own work before the next one. The garbage collector is prepared first as
`infertune run` prepares it (main.prepare_garbage_collector: the startup objects frozen, the
thresholds raised).

Not counted: the Kubernetes API calls (the scale read, the scale write when replicas change,
the status patch; one or two per tuning per interval, as with HPA), and kopf's own work;
bench/operator_bench.py measures the whole operator process for those.

Goal: a query count that does not grow with N, and under 50 ms of CPU per cycle at 1000.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
from e2e.fixtures.prometheus import MetricsEndpoint, PrometheusServer
from e2e.fixtures.waiting import wait_for
from prometheus_client import CollectorRegistry, Gauge, Histogram

from infertune.controller.autoscaling import AutoscalingSettings, signals_if_due
from infertune.controller.main import prepare_garbage_collector
from infertune.controller.scaling_report import plan_evaluation
from infertune.metrics.prometheus import PrometheusSource
from infertune.metrics.source import MetricsTarget
from infertune.scaling.signals import TargetSignals
from infertune.scaling.state import Recommendation, ScaleEvent, ScalingState, format_time

RESULTS_DIR = Path(__file__).resolve().parent / "results"
MAX_TUNINGS = 1000
SCALES = ((1, 1.0), (100, 1.0), (1000, 1.0), (1000, 5.0))
"""(tunings, queue resolution in seconds): 1 s is the default; 5 s shows what the queue history
costs, since it is most of the data a cycle reads."""
PYTHON_GC_THRESHOLDS = (700, 10, 10)
"""CPython's own thresholds: the baseline the operator's (main.GC_THRESHOLDS) are measured
against."""
BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0)
HISTORY_S = 35


def deployment(i: int) -> tuple[str, str, str]:
    """(namespace, Deployment, pod) of synthetic tuning i."""
    return f"team-{i % 10}", f"qwen-{i}", f"qwen-{i}-5d4f8b9c7-bcdfg"


def serve_exporter(tunings: int, port_file: Path) -> None:
    registry = CollectorRegistry()
    labels = ["namespace", "pod", "model_name"]
    waiting = Gauge("vllm:num_requests_waiting", "w", labels, registry=registry)
    running = Gauge("vllm:num_requests_running", "r", labels, registry=registry)
    latency = Histogram("vllm:e2e_request_latency_seconds", "e2e", labels, buckets=BUCKETS,
                        registry=registry)
    children = []
    for i in range(tunings):
        ns, _, pod = deployment(i)
        waiting.labels(ns, pod, "qwen").set(i % 64)
        running.labels(ns, pod, "qwen").set(16)
        children.append((latency.labels(ns, pod, "qwen"), 0.05 + (i % 20) / 100))
    with MetricsEndpoint(registry) as endpoint:
        port_file.write_text(endpoint.target)
        while True:
            for child, value in children:
                child.observe(value)
            threading.Event().wait(0.5)


class CountingSession(requests.Session):
    requests_made = 0

    def request(self, *args: Any, **kwargs: Any) -> Any:
        self.requests_made += 1
        return super().request(*args, **kwargs)


class TimedSource(PrometheusSource):
    """The adapter, with the CPU time of its fetches added up."""

    fetch_cpu_s = 0.0

    def fetch(self, targets: Sequence[MetricsTarget], now: float) -> dict[str, TargetSignals]:
        started = time.process_time()
        try:
            return super().fetch(targets, now)
        finally:
            self.fetch_cpu_s += time.process_time() - started


INTERVAL = "2s"


def index(count: int) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The kopf index entries of `count` tunings, as the operator's tunings_by_target holds."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for i in range(count):
        ns, name, _ = deployment(i)
        out[(ns, name)] = [{"name": name, "uid": f"uid-{i}", "generation": 1, "spec": {
            "targetRef": {"name": name}, "engine": "vllm",
            "autoscaling": {"interval": INTERVAL}}}]
    return out


def stored_status(i: int, now: float) -> dict[str, Any]:
    """The status of tuning i as the last evaluation left it: conditions, and a state with a
    varied recommendation history over the 5 min scale-down window (20 evaluations at 15 s,
    between 1 and 6 replicas) and one scale event."""
    recs = tuple(Recommendation(now - 15 * k, 1 + (i * 7 + k * 3) % 6) for k in range(20, 0, -1))
    state = ScalingState(recs, (ScaleEvent(now - 100, 1),)).to_json()
    conditions = [{"type": t, "status": "True", "observedGeneration": 1,
                   "lastTransitionTime": format_time(now - 3600), "reason": "Earlier",
                   "message": "as it was"} for t in ("Ready", "MetricsAvailable", "ScalingActive")]
    return {"conditions": conditions, "autoscaling": {"state": state, "action": "Hold"}}


class CollectorTime:
    """CPU time spent in the garbage collector, from its start and stop callbacks."""

    def __init__(self) -> None:
        self.spent_s, self._started = 0.0, 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.spent_s += time.process_time() - self._started

    def __enter__(self) -> CollectorTime:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self)


def measure(url: str, count: int, resolution_s: float, cycles: int) -> dict[str, Any]:
    with CollectorTime() as collector:
        return _measure(url, count, resolution_s, cycles, collector)


def _measure(url: str, count: int, resolution_s: float, cycles: int,
             collector: CollectorTime) -> dict[str, Any]:
    session = CountingSession()
    source = TimedSource(url, session=session, timeout_s=30, resolution_s=resolution_s)
    settings = AutoscalingSettings(source=source)
    entries = index(count)
    start = time.time()
    status = {f"{ns}/{e['name']}": stored_status(i, start)
              for i, ((ns, _), (e,)) in enumerate(entries.items())}
    replicas = dict.fromkeys(status, 2)
    cpu, fetch_cpu, gc_cpu, wall, queries, with_data, kept, writes = [], [], [], [], [], 0, 0.0, []
    references: list[float] = []
    for _ in range(cycles):
        # The next slot (the cycle before started over 2 s ago), a reference round first.
        time.sleep(float(INTERVAL[:-1]) - 0.1)
        references.append(reference_round_ms())
        before, fetched, collected = session.requests_made, source.fetch_cpu_s, collector.spent_s
        t0, w0 = time.process_time(), time.perf_counter()
        now = time.time()
        planned = []
        for (ns, _), (entry,) in entries.items():
            key = f"{ns}/{entry['name']}"
            parsed = settings.parse(ns, entry["name"], entry["uid"], entry["generation"],
                                    entry["spec"])
            assert parsed is not None and parsed.spec.autoscaling is not None
            listed = settings.listing(entries, parsed, now)  # type: ignore[arg-type]
            signals = signals_if_due(settings, key, parsed, listed, now)
            assert signals is not None
            evaluation = plan_evaluation(parsed.spec, 1, status[key], signals, replicas[key],
                                         None, now)
            planned.append(evaluation)
            # What the API server would store and return next time (the calls are not made).
            status[key] = {**status[key], **evaluation.status}
            if evaluation.write is not None:
                replicas[key] = evaluation.write
        cpu.append((time.process_time() - t0) * 1000)
        fetch_cpu.append((source.fetch_cpu_s - fetched) * 1000)
        gc_cpu.append((collector.spent_s - collected) * 1000)
        wall.append((time.perf_counter() - w0) * 1000)
        queries.append(session.requests_made - before)
        with_data = sum(1 for e in planned if e.decision.signals.queue_per_replica is not None)
        writes.append(sum(1 for e in planned if e.write is not None))
        kept = statistics.mean(len(s["autoscaling"]["state"]["recommendations"])
                               for s in status.values())
    return {"tunings": count, "queue_resolution_s": resolution_s, "cycles": cycles,
            "queries_per_cycle": max(queries),
            "queries_per_cycle_median": statistics.median(queries), "fetches": settings.fetches,
            "cpu_ms_median": round(statistics.median(cpu), 1), "cpu_ms_max": round(max(cpu), 1),
            "fetch_cpu_ms_median": round(statistics.median(fetch_cpu), 1),
            "gc_cpu_ms_median": round(statistics.median(gc_cpu), 1),
            "wall_ms_median": round(statistics.median(wall), 1),
            "tunings_with_queue_data": with_data, "stored_recommendations_mean": round(kept, 1),
            "scale_writes_per_cycle": writes,
            "reference_ms_median": round(statistics.median(references), 1),
            "cycle_per_reference_median": round(statistics.median(
                c / r for c, r in zip(cpu, references, strict=True)), 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--serve-exporter", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_exporter:
        serve_exporter(MAX_TUNINGS, args.serve_exporter)
        return 0
    with exporter_scraped() as prometheus:
        time.sleep(HISTORY_S)  # the queue rule reads 30 s of history; it has to exist
        prepare_garbage_collector()  # as `infertune run` does before kopf starts
        results = [measure(prometheus.url, n, r, args.cycles) for n, r in SCALES]
        # The baseline: the same 1000-tuning cycle at Python's own collector thresholds.
        ours = gc.get_threshold()
        gc.set_threshold(*PYTHON_GC_THRESHOLDS)
        try:
            baseline = measure(prometheus.url, MAX_TUNINGS, 1.0, args.cycles)
        finally:
            gc.set_threshold(*ours)
        results.append({**baseline, "collector": "Python's default"})
    record(results)
    return 0


@contextmanager
def exporter_scraped() -> Iterator[PrometheusServer]:
    """The synthetic exporter of MAX_TUNINGS Deployments in its own process, and a real
    Prometheus scraping it every second (also used by operator_bench)."""
    port_file = Path(tempfile.mkdtemp(prefix="infertune-bench-")) / "exporter"
    exporter = subprocess.Popen([sys.executable, "-m", "bench.autoscale_bench",
                                 "--serve-exporter", str(port_file)])
    prometheus = PrometheusServer().start()
    try:
        target = wait_for(lambda: port_file.exists() and port_file.read_text(), "exporter")
        prometheus.add_scrape_job("vllm", [str(target)])
        prometheus.wait_for_targets_up("vllm", timeout_s=60)
        yield prometheus
    finally:
        prometheus.stop()
        exporter.terminate()
        exporter.wait()
        shutil.rmtree(port_file.parent, ignore_errors=True)


def reference_cpu_ms(rounds: int = 7) -> float:
    """CPU time of a fixed pure-Python workload made of what an evaluation is made of (small
    dicts and tuples, string formatting, a sort), the median of `rounds`. The shared machines
    this runs on are not all alike (Intel Xeon and AMD EPYC hosts, of different speeds):
    cycles measured on different machines compare as their ratio to this."""
    return round(statistics.median(reference_round_ms() for _ in range(rounds)), 1)


def reference_round_ms() -> float:
    """One round of the reference workload (`reference_cpu_ms`), in ms of CPU. Taken before
    each cycle too: the machine's speed changes from minute to minute (its reference went
    from 39 to 66 ms between two runs of a day), and a cycle compares best with a reference
    taken next to it."""
    started = time.process_time()
    rows = []
    for i in range(20_000):
        entry: dict[str, Any] = {"time": f"2026-12-07T00:{i % 60:02d}:{i % 59:02d}Z",
                                 "replicas": i % 7,
                                 "reason": f"queue {i / 3:.1f} per replica above 32"}
        rows.append((entry["replicas"], entry["time"], len(entry["reason"])))
    rows.sort()
    return (time.process_time() - started) * 1000


def record(results: list[dict[str, Any]]) -> None:
    meta: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(), "prometheus": "2.42 (Debian)",
        "cpus": _cpus(), "reference_cpu_ms": reference_cpu_ms(),
        "goal": "flat queries per cycle, < 50 ms CPU per cycle at 1000"}
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "autoscale.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    lines = [
        "# autoscaling evaluation cycle", "",
        f"{meta['cpus']}, Python {meta['python']}, Prometheus {meta['prometheus']}, "
        f"{meta['date']}. Produced by `python -m bench.autoscale_bench`.", "",
        f"Machine reference: {meta['reference_cpu_ms']} ms of CPU for a fixed pure-Python "
        "workload (`reference_cpu_ms`: dicts, tuples, formatting, a sort); the shared machines "
        "are not all alike, so compare cycles across machines as their ratio to it.",
        "",
        "One cycle = every tuning's pass in one interval slot (cached spec, listing, "
        "one batched fetch) + per tuning `plan_evaluation` as the operator calls it: the state "
        "read back from status, the decision, the whole status patch (conditions, "
        "`status.autoscaling`, decision records, Event text). Default spec except a 2 s "
        "interval (30 s queue window at the queue step, two latency samples); replicas follow "
        "the writes. The bucket bounds of the latency histograms are read in the first cycle "
        "(then every 10 minutes): the fourth query of the max. Not counted: the Kubernetes "
        "API calls and kopf's own work (see "
        "operator.md for the whole process). Per tuning = (cycle - fetch) / tunings. "
        "Garbage collector: as `infertune run` sets it (main.GC_THRESHOLDS), and in the last "
        f"row at Python's default thresholds {PYTHON_GC_THRESHOLDS}, the baseline.", "",
        "| tunings | queue step | collector | queries per cycle (median / max) | "
        "CPU per cycle (median / max) | "
        "of which fetch (median) | of which garbage collection (median) | "
        "evaluation per tuning | wall (median) | tunings with data | scale writes per cycle |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {r['tunings']} | {r['queue_resolution_s']:g} s | "
              f"{r.get('collector', 'operator')} | "
              f"{r['queries_per_cycle_median']:g} / {r['queries_per_cycle']} | "
              f"{r['cpu_ms_median']} / {r['cpu_ms_max']} ms | {r['fetch_cpu_ms_median']} ms | "
              f"{r['gc_cpu_ms_median']} ms | "
              f"{(r['cpu_ms_median'] - r['fetch_cpu_ms_median']) * 1000 / r['tunings']:.0f} µs | "
              f"{r['wall_ms_median']} ms | {r['tunings_with_queue_data']} | "
              f"{', '.join(map(str, r['scale_writes_per_cycle']))} |" for r in results]
    ours = next(r for r in results if r["tunings"] == MAX_TUNINGS and "collector" not in r
                and r["queue_resolution_s"] == 1.0)
    lines += ["", f"At {MAX_TUNINGS} tunings: {ours['cpu_ms_median']} ms per cycle = "
              f"{ours['cpu_ms_median'] / meta['reference_cpu_ms']:.2f} machine references "
              f"(the goal, 50 ms, is {50 / meta['reference_cpu_ms']:.2f} of this machine's). "
              "Each cycle against one round of the reference taken just before it: "
              f"{ours['cycle_per_reference_median']:.2f} references (median; the rounds "
              f"{ours['reference_ms_median']} ms, the goal "
              f"{50 / ours['reference_ms_median']:.2f} of them)."]
    python = next((r for r in results if "collector" in r), None)
    if python is not None:
        lines += ["", f"At {MAX_TUNINGS} tunings, operator / Python's default collector "
                  f"thresholds: {ours['cpu_ms_median']} / {python['cpu_ms_median']} ms per "
                  f"cycle = {ours['cpu_ms_median'] / python['cpu_ms_median']:.2f} "
                  f"(garbage collection {ours['gc_cpu_ms_median']} / "
                  f"{python['gc_cpu_ms_median']} ms)."]
    (RESULTS_DIR / "autoscale.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _cpus() -> str:
    try:
        model = next(line.split(":", 1)[1].strip() for line in
                     Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "unknown CPU"
    import os
    return f"{os.cpu_count()} vCPU ({model})"


if __name__ == "__main__":
    sys.exit(main())
