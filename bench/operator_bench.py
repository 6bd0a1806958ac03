"""What the whole operator process costs at 0, 100 and 1000 InferenceTunings, on the real
control plane.

Run: ``python -m bench.operator_bench`` (~10 min; the control plane built first with
``python -m e2e.cluster build``). Writes bench/results/operator.json and operator.md.

autoscale_bench.py times the evaluation path in-process. This one runs the real
`infertune run` (kopf, its 1 s autoscaling timers, the re-tune timers, the indexes, the status
patches and scale reads) against the e2e API server, with the real Prometheus scraping the
synthetic vLLM exporter of autoscale_bench (1000 Deployments' pods). For each N, N Deployments
of one pod and N InferenceTunings with autoscaling are created, spread over 10 namespaces.
Their targets are above what the exporter serves, so decisions Hold and no pods churn: the
steady state an operator spends most of its life in. After the first evaluation of all N and
a settling period, it records over a fixed window:

- the operator's CPU (utime + stime from /proc, all threads), per second and per 15 s
  evaluation interval (the default spec.autoscaling.interval);
- its resident memory;
- the requests it makes of the API server, by verb and resource (apiserver_request_total);
- the Prometheus queries it runs (prometheus_http_requests_total), per interval.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from e2e.cluster.build import cached_bin_dir, missing_binaries
from e2e.cluster.runtime import Cluster
from e2e.fixtures.access import wait_for_default_service_account
from e2e.fixtures.operator import start_operator
from e2e.fixtures.waiting import wait_for
from kubernetes import client, config

from bench import scratch
from bench.autoscale_bench import MAX_TUNINGS, deployment, exporter_scraped
from infertune.api.spec import GROUP, PLURAL, VERSION

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCALES = (0, 100, 1000)
INTERVAL_S = 15.0
"""The default spec.autoscaling.interval: CPU per evaluation cycle is CPU per second times it."""
NAMESPACES = sorted({deployment(i)[0] for i in range(10)})
CLOCK_TICKS = 100  # os.sysconf("SC_CLK_TCK") on Linux
SPEC = {
    "engine": "vllm",
    "autoscaling": {
        "minReplicas": 1, "maxReplicas": 4,
        # Above the exporter's queue (0..63) and latency (50..240 ms): every decision Holds.
        "queue": {"targetPerReplica": 100, "sustain": "30s"},
        "latency": {"target": "5s", "consecutiveSamples": 2},
    },
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=60.0,
                        help="seconds measured at each scale (default 60: four intervals)")
    parser.add_argument("--settle", type=float, default=30.0,
                        help="seconds waited after every tuning was evaluated once")
    parser.add_argument("--only", type=int, choices=SCALES, help="measure this N alone")
    parser.add_argument("--hold", type=float, default=0.0,
                        help="keep everything running this many seconds after the last "
                             "measurement, to inspect the operator (py-spy, kubectl)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--render", action="store_true",
                        help="only write operator.md again from operator.json")
    args = parser.parse_args(argv)
    if args.render:
        recorded = json.loads((args.out / "operator.json").read_text())
        _record(recorded["results"], args.out, recorded["meta"]["window_s"])
        return 0
    bin_dir = cached_bin_dir()
    if missing_binaries(bin_dir):
        print("the control plane is not built: run `python -m e2e.cluster build` first",
              file=sys.stderr)
        return 2
    with scratch("infertune-operator-bench-") as work, exporter_scraped() as prometheus, \
            Cluster.start(bin_dir=bin_dir, log_dir=work / "logs") as cluster:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        for namespace in NAMESPACES:
            client.CoreV1Api(api).create_namespace(
                client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
            wait_for_default_service_account(api, namespace)
        operator = start_operator(api, work, work / "logs", retune_interval=10.0,
                                  verbose=False, prometheus_url=prometheus.url)
        try:
            assert operator.process is not None
            results = []
            made = 0
            for count in ([args.only] if args.only is not None else SCALES):
                _create(api, made, count)
                made = count
                _wait_evaluated(api, count, operator)
                time.sleep(args.settle)
                results.append(_measure(api, operator.process.pid, prometheus.url, count,
                                        args.window))
                operator.check_running()
                print(json.dumps(results[-1]), flush=True)
            if args.hold:
                print(f"holding {args.hold:g} s: operator pid {operator.process.pid}, "
                      f"admin kubeconfig {cluster.kubeconfig}", flush=True)
                time.sleep(args.hold)
        finally:
            operator.stop()
    _record(results, args.out, args.window)
    return 0


def _create(api: client.ApiClient, start: int, stop: int) -> None:
    """Deployments and InferenceTunings start..stop-1 (of one small pod each)."""
    apps, custom = client.AppsV1Api(api), client.CustomObjectsApi(api)

    def one(i: int) -> None:
        namespace, name, _ = deployment(i)
        apps.create_namespaced_deployment(namespace, {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {
                         "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                         "resources": {"requests": {"cpu": "10m",
                                                                    "memory": "16Mi"}}}]}}}})
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceTuning",
            "metadata": {"name": name}, "spec": {"targetRef": {"name": name}, **SPEC}})

    assert stop <= MAX_TUNINGS
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(start, stop)))


def _wait_evaluated(api: client.ApiClient, count: int, operator: Any) -> None:
    """Until every tuning has been reconciled (status.observedGeneration) and evaluated once
    (status.autoscaling.evaluated)."""
    custom = client.CustomObjectsApi(api)

    def all_evaluated() -> bool:
        operator.check_running()
        items = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
        done = sum(1 for t in items
                   if (status := t.get("status") or {}).get("observedGeneration")
                   and (status.get("autoscaling") or {}).get("evaluated"))
        return done >= count

    wait_for(all_evaluated, f"{count} tunings reconciled and evaluated once", timeout_s=600)

    def creations_handled() -> bool:
        # kopf writes the main resource (finalizer, last-handled annotation) while it works
        # through created tunings; the steady state starts when it stops.
        before = _api_requests(api)
        time.sleep(5)
        return _api_requests(api)["PATCH inferencetunings"] == before["PATCH inferencetunings"]

    wait_for(creations_handled, "kopf done with the created tunings", timeout_s=600)


def _measure(api: client.ApiClient, pid: int, prometheus_url: str, count: int,
             window: float) -> dict[str, Any]:
    cpu0, api0, prom0, t0 = _cpu_s(pid), _api_requests(api), _queries(prometheus_url), \
        time.monotonic()
    time.sleep(window)
    cpu1, api1, prom1, t1 = _cpu_s(pid), _api_requests(api), _queries(prometheus_url), \
        time.monotonic()
    elapsed = t1 - t0
    per_s = (cpu1 - cpu0) / elapsed
    requests = {k: round((api1[k] - api0.get(k, 0)) / elapsed, 2) for k in api1
                if api1[k] > api0.get(k, 0)}
    # One read of the target per evaluation: its scale subresource before 2026-12-05, the
    # Deployment itself (replicas and ready count) since.
    reads = ("GET deployments", "GET deployments/scale")
    scale_reads = sum(api1[k] - api0.get(k, 0) for k in reads)
    return {"tunings": count, "window_s": round(elapsed, 1),
            "evaluated_per_interval": round(scale_reads / elapsed * INTERVAL_S / count, 2)
            if count else None,
            "cpu_share_of_one_core": round(per_s, 3),
            "cpu_ms_per_interval": round(per_s * INTERVAL_S * 1000, 1),
            "rss_mib": round(_rss_kib(pid) / 1024, 1),
            "api_requests_per_s": dict(sorted(requests.items())),
            "prometheus_queries_per_interval": round((prom1 - prom0) / elapsed * INTERVAL_S,
                                                     1)}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def _rss_kib(pid: int) -> int:
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmRSS:"))
    return int(line.split()[1])


_SAMPLE = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def _api_requests(api: client.ApiClient) -> Counter[str]:
    """apiserver_request_total by "VERB resource[/subresource]" for what only the operator
    asks for (InferenceTunings, GETs of a Deployment and its scale subresource; the control
    plane's own controllers make the other requests, from their watch caches)."""
    response = api.call_api("GET", f"{api.configuration.host}/metrics")
    response.read()
    text = response.data.decode()
    out: Counter[str] = Counter()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
        if labels.get("verb") == "WATCH":
            continue
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        verb = labels.get("verb")
        if (resource.startswith("inferencetunings") or resource == "deployments/scale"
                or (resource == "deployments" and verb == "GET")):
            out[f"{verb} {resource}"] += int(float(match["value"]))
    return out


def _queries(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("prometheus_http_requests_total{")
               and re.search(r'handler="/api/v1/query(_range)?"', line))


def _record(results: list[dict[str, Any]], out: Path, window: float) -> None:
    meta = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
            "python": platform.python_version(), "window_s": window,
            "interval_s": INTERVAL_S}
    out.mkdir(parents=True, exist_ok=True)
    (out / "operator.json").write_text(json.dumps({"meta": meta, "results": results},
                                                  indent=2) + "\n")
    baseline_file = RESULTS_DIR / "operator-baseline.json"
    baseline = json.loads(baseline_file.read_text()) if baseline_file.exists() else None
    before = {r["tunings"]: r for r in baseline["results"]} if baseline else {}
    lines = [
        "# the whole operator at N tunings", "",
        f"Python {meta['python']}, {meta['date']}, {window:g} s measured at each N. Produced "
        "by `python -m bench.operator_bench`: the real `infertune run` against the e2e API "
        "server and the real Prometheus, every decision Hold (the steady state). CPU is the "
        "operator process's (all threads); per interval = per second x 15 s, the default "
        "spec.autoscaling.interval.", "",
    ]
    if baseline:
        lines += [f"Baseline (before -> now, and now / before): {baseline['meta']['code']}, "
                  f"measured {baseline['meta']['date']}.", ""]
    lines += [
        "| tunings | evaluations per tuning per interval | CPU (share of one core) | "
        "CPU per 15 s interval | CPU per evaluation | RSS | Prometheus queries per interval | "
        "API requests per second |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        was = before.get(r["tunings"])
        calls = ", ".join(f"{k}: {v:g}" for k, v in r["api_requests_per_s"].items()) or "-"
        cpu = f"{r['cpu_share_of_one_core']:.1%}"
        per_interval = f"{r['cpu_ms_per_interval']:g} ms"
        if was is not None:
            cpu = f"{was['cpu_share_of_one_core']:.1%} -> {cpu}"
            ratio = (f" ({r['cpu_ms_per_interval'] / was['cpu_ms_per_interval']:.2f}x)"
                     if was["cpu_ms_per_interval"] else "")
            per_interval = f"{was['cpu_ms_per_interval']:g} -> {per_interval}{ratio}"
            old_calls = ", ".join(f"{k}: {v:g}" for k, v in was["api_requests_per_s"].items())
            calls = f"{old_calls or '-'} -> {calls}"
        done = r.get("evaluated_per_interval")
        evaluated = "-" if done is None else f"{done:g}"
        if was is not None and was.get("evaluated_per_interval") is not None:
            evaluated = f"{was['evaluated_per_interval']:g} -> {evaluated}"
        rss = f"{r['rss_mib']:g} MiB"
        if was is not None:
            rss = f"{was['rss_mib']:g} -> {rss}"
        each = _per_evaluation(r)
        if was is not None and _per_evaluation(was) != "-":
            each = f"{_per_evaluation(was)} -> {each}"
        lines.append(f"| {r['tunings']} | {evaluated} | {cpu} | {per_interval} | {each} | "
                     f"{rss} | "
                     f"{r['prometheus_queries_per_interval']:g} | {calls} |")
    (out / "operator.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _per_evaluation(r: dict[str, Any]) -> str:
    """Everything the process spent in an interval, over the evaluations it made in it."""
    done = r.get("evaluated_per_interval")
    if not done:
        return "-"
    return f"{r['cpu_ms_per_interval'] / (done * r['tunings']):.1f} ms"


if __name__ == "__main__":
    sys.exit(main())
