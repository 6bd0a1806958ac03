"""How fast the e2e control plane is: build, start-up, list and watch latency.

Run: ``python -m bench.cluster_bench`` (binaries built first with ``python -m e2e.cluster
build``). Writes bench/results/cluster.json and cluster.md.

- start-up: `Cluster.start` to ready (readyz, leader leases, all simulated nodes Ready).
- build: the first (cold) build is recorded from this machine's log, since repeating it means
  emptying the Go caches for ten minutes; the cached `build` run is measured each time.
- list: p50/p99 of a full LIST of N ConfigMaps in one namespace, on the wire (bytes read,
  no Python deserialisation) and once more through the typed Python client.
- watch fan-out: W watches open on one namespace; the time from the start of a CREATE until
  every watch has received the ADDED event, over R rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from e2e.cluster.build import cached_bin_dir, kubernetes_version, missing_binaries
from e2e.cluster.runtime import Cluster
from kubernetes import client, config
from urllib3.exceptions import ProtocolError

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent
# First build of the six binaries on this machine (2 vCPU, empty Go build and module caches),
# from /tmp/e2ebuild.log: `time go build ...` printed real 9m2.724s, user 14m21.727s.
COLD_BUILD = {"wall_seconds": 542.7, "user_seconds": 861.7, "sys_seconds": 148.8}
# `python -m e2e.cluster build` into an empty cache dir with the Go build cache warm (only
# linking), from that run's timings.json on this machine.
RELINK_WARM_GO_CACHE = {"wall_seconds": 36.2, "user_seconds": 37.3, "sys_seconds": 15.5}
# Helm v4.3.2 for the chart tests (`go install`, its own module graph), on this machine: with
# empty module and build caches for its dependencies (downloads included; the control plane
# had been built) 203 s wall; again with the modules downloaded and other build flags, 132 s
# wall, 3m35s user (timings.json of e2e/cluster/helm.py).
HELM_BUILD = {"first_wall_seconds": 203.0, "rebuild_wall_seconds": 132.0,
              "rebuild_user_seconds": 215.5}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_bench", description=__doc__)
    parser.add_argument("--startup-runs", type=int, default=3)
    parser.add_argument("--configmaps", type=int, default=2000)
    parser.add_argument("--lists", type=int, default=50)
    parser.add_argument("--watches", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)

    bin_dir = cached_bin_dir()
    if missing_binaries(bin_dir):
        print("binaries not built; run: python -m e2e.cluster build", file=sys.stderr)
        return 1
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": _machine(),
        "kubernetes_version": kubernetes_version(),
        "build": {
            "cold": COLD_BUILD,
            "relink_warm_go_cache": RELINK_WARM_GO_CACHE,
            "helm": HELM_BUILD,
            "cached": _cached_build(),
        },
    }
    startups: list[float] = []
    for run in range(args.startup_runs):
        cluster = Cluster.start(bin_dir=bin_dir)
        startups.append(cluster.seconds_to_ready)
        print(f"start-up run {run + 1}: {cluster.seconds_to_ready:.1f}s to ready", flush=True)
        if run < args.startup_runs - 1:
            cluster.stop()
    results["startup_seconds"] = {"runs": startups, "median": statistics.median(startups)}
    try:
        api = _api_client(cluster.kubeconfig, pool=args.watches + 16)
        results["list"] = _list_latency(api, args.configmaps, args.lists)
        results["watch_fanout"] = _watch_fanout(api, args.watches, args.rounds)
    finally:
        cluster.stop()

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cluster.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "cluster.md").write_text(_markdown(results))
    print((args.out / "cluster.md").read_text())
    return 0


def _cached_build() -> dict[str, float]:
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "e2e.cluster", "build"], cwd=REPO_ROOT, check=True,
        capture_output=True,
    )  # fmt: skip
    return {"wall_seconds": round(time.monotonic() - started, 2)}


def _api_client(kubeconfig: Path, pool: int) -> client.ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig), client_configuration=configuration
    )
    configuration.connection_pool_maxsize = pool  # one connection per concurrent watch
    return client.ApiClient(configuration)


def _list_latency(api: client.ApiClient, count: int, lists: int) -> dict[str, Any]:
    core: Any = client.CoreV1Api(api)  # Any: _preload_content=False returns the raw response
    namespace = "bench-list"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    payload = {"model": "Qwen2-7B", "engine": "vllm", "notes": "x" * 200}

    def create(index: int) -> None:
        core.create_namespaced_config_map(
            namespace,
            client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"cm-{index:05d}"), data=payload),
        )

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(create, range(count)))
    create_seconds = time.monotonic() - started

    wire: list[float] = []
    size = 0
    for _ in range(lists):
        began = time.perf_counter()
        response = core.list_namespaced_config_map(namespace, _preload_content=False)
        body = response.read()
        wire.append(time.perf_counter() - began)
        size = len(body)
        # count + kube-root-ca.crt, which the root-CA publisher puts in every namespace
        assert len(json.loads(body)["items"]) == count + 1
    typed: list[float] = []
    for _ in range(max(3, lists // 10)):
        began = time.perf_counter()
        assert len(core.list_namespaced_config_map(namespace).items) == count + 1
        typed.append(time.perf_counter() - began)
    print(f"list of {count} ConfigMaps: p50 {_ms(_pct(wire, 50))} on the wire", flush=True)
    return {
        "configmaps": count,
        "lists": lists,
        "response_bytes": size,
        "create_all_seconds": round(create_seconds, 2),
        "wire_ms": _summary(wire),
        "typed_python_client_ms": _summary(typed),
    }


def _watch_fanout(api: client.ApiClient, watches: int, rounds: int) -> dict[str, Any]:
    core: Any = client.CoreV1Api(api)  # Any: _preload_content=False returns the raw response
    namespace = "bench-watch"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    version = core.list_namespaced_config_map(namespace).metadata.resource_version
    arrivals: dict[str, list[float]] = {}
    lock = threading.Lock()
    responses = [
        # Returns once the API server has sent the headers, i.e. the watch is registered.
        core.list_namespaced_config_map(
            namespace, watch=True, resource_version=version, _preload_content=False
        )
        for _ in range(watches)
    ]

    stopping = threading.Event()

    def follow(response: Any) -> None:
        try:
            read_events(response)
        except ProtocolError:
            if not stopping.is_set():
                raise  # only the teardown at the end may cut a watch

    def read_events(response: Any) -> None:
        buffer = b""
        for chunk in response.stream(amt=None, decode_content=False):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                event = json.loads(line)
                if event["type"] == "ADDED":
                    seen = time.perf_counter()
                    with lock:
                        arrivals.setdefault(event["object"]["metadata"]["name"], []).append(seen)

    threads = [threading.Thread(target=follow, args=(r,), daemon=True) for r in responses]
    for thread in threads:
        thread.start()

    all_seen: list[float] = []
    each_seen: list[float] = []
    for index in range(rounds):
        name = f"probe-{index:03d}"
        began = time.perf_counter()
        core.create_namespaced_config_map(
            namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name))
        )
        deadline = time.monotonic() + 30
        while len(arrivals.get(name, [])) < watches:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {len(arrivals.get(name, []))}/{watches} watches saw {name}"
                )
            time.sleep(0.001)  # spin on a 1 ms grain: the quantity measured is milliseconds
        with lock:
            seen = [t - began for t in arrivals[name]]
        all_seen.append(max(seen))
        each_seen.extend(seen)
    stopping.set()
    print(f"{watches} watches all saw a create: p50 {_ms(_pct(all_seen, 50))}", flush=True)
    return {
        "watches": watches,
        "rounds": rounds,
        "all_watches_saw_it_ms": _summary(all_seen),
        "each_watch_ms": _summary(each_seen),
    }


def _summary(seconds: list[float]) -> dict[str, float]:
    return {
        "p50": round(_pct(seconds, 50) * 1000, 1),
        "p99": round(_pct(seconds, 99) * 1000, 1),
        "max": round(max(seconds) * 1000, 1),
    }


def _pct(values: list[float], percentile: int) -> float:
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(percentile / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]  # nearest-rank percentile


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _machine() -> dict[str, Any]:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )  # fmt: skip
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "python": platform.python_version()}


def _markdown(results: dict[str, Any]) -> str:
    build, listing, fanout = results["build"], results["list"], results["watch_fanout"]
    cold = build["cold"]
    startup = results["startup_seconds"]
    rows = [
        ("first (cold) build, 6 binaries", f"{_clock(cold['wall_seconds'])} wall, "
         f"{_clock(cold['user_seconds'])} user"),
        ("Helm v4.3.2 for the chart tests, first build (downloads included)",
         f"{_clock(build['helm']['first_wall_seconds'])} wall"),
        ("build into an empty cache, Go build cache warm (link only)",
         f"{build['relink_warm_go_cache']['wall_seconds']:.0f} s wall"),
        ("`build` with binaries cached", f"{build['cached']['wall_seconds']:.2f} s"),
        ("start-up to ready", f"median {startup['median']:.1f} s "
         f"(runs: {', '.join(f'{s:.1f}' for s in startup['runs'])})"),
        (f"LIST {listing['configmaps']} ConfigMaps, on the wire "
         f"({listing['response_bytes'] // 1024} KiB)",
         f"p50 {listing['wire_ms']['p50']} ms, p99 {listing['wire_ms']['p99']} ms "
         f"({listing['lists']} lists)"),
        (f"LIST {listing['configmaps']} ConfigMaps, typed Python client",
         f"p50 {listing['typed_python_client_ms']['p50']} ms"),
        (f"{fanout['watches']} watches all see a new object",
         f"p50 {fanout['all_watches_saw_it_ms']['p50']} ms, "
         f"p99 {fanout['all_watches_saw_it_ms']['p99']} ms ({fanout['rounds']} rounds)"),
    ]  # fmt: skip
    machine = results["machine"]
    lines = [
        "# e2e control plane benchmarks",
        "",
        f"Kubernetes {results['kubernetes_version']}, {machine['cpus']} vCPU "
        f"({machine['cpu_model']}), Python {machine['python']}, {results['date']}. "
        "Produced by `python -m bench.cluster_bench`.",
        "",
        "| measure | result |",
        "| --- | --- |",
        *[f"| {name} | {value} |" for name, value in rows],
        "",
    ]
    return "\n".join(lines)


def _clock(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)  # truncated, as `time` prints it
    return f"{minutes}m{rest:02d}s"


if __name__ == "__main__":
    sys.exit(main())
