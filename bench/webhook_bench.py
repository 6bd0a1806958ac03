"""Admission latency of the pod-tuning webhook over real HTTPS, at fixed request rates.

Run: ``python -m bench.webhook_bench`` (the e2e control plane built first). It starts the e2e
cluster and a real `infertune run`, creates an InferenceTuning and its Deployment so the
operator's indexes are warm, then POSTs AdmissionReviews for pods of that Deployment to the
webhook at 50 and 200 requests/s (open loop: requests are sent on schedule whether or not
earlier ones finished) and records p50/p99 latency and the rate actually held. A pod nobody
targets is measured the same way as the baseline: the ratio shows what tuning itself costs.

Goal: p99 under 5 ms, because every pod start waits on this call.
"""

from __future__ import annotations

import argparse
import base64
import json
import platform
import ssl
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from http.client import HTTPSConnection
from pathlib import Path
from typing import Any

from e2e.cluster.build import cached_bin_dir, missing_binaries
from e2e.cluster.runtime import Cluster
from e2e.fixtures.operator import WEBHOOK_CONFIGURATION, start_operator
from e2e.fixtures.waiting import wait_for
from kubernetes import client, config

from bench import scratch

RESULTS_DIR = Path(__file__).resolve().parent / "results"
NAMESPACE = "bench"


def _review(pod: dict[str, Any]) -> bytes:
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1",
                                                       "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "operation": "CREATE", "namespace": NAMESPACE, "object": pod,
                    "userInfo": {"username": "system:serviceaccount:kube-system:rs"},
                    "dryRun": False},
    }).encode()


def _pod(replicaset: str, template_hash: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": f"{replicaset}-", "namespace": NAMESPACE,
                     "labels": {"app": "qwen", "pod-template-hash": template_hash},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                          "name": replicaset, "uid": "u", "controller": True}]},
        "spec": {"containers": [{
            "name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
            "command": ["vllm", "serve", "Qwen/Qwen2-7B-Instruct"],
            "resources": {"requests": {"cpu": "8", "memory": "32Gi"},
                          "limits": {"cpu": "8", "memory": "32Gi"}}}]},
    }


class _Client:
    """One keep-alive HTTPS connection per worker thread, as the API server keeps them."""

    def __init__(self, url: str, ca_bundle: bytes) -> None:
        rest = url.removeprefix("https://")
        self.host, _, path = rest.partition("/")
        self.path = "/" + path
        self.context = ssl.create_default_context(cadata=ca_bundle.decode())
        self.local = threading.local()

    def post(self, body: bytes) -> float:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            host, _, port = self.host.partition(":")
            conn = self.local.conn = HTTPSConnection(host, int(port), context=self.context)
        started = time.perf_counter()
        conn.request("POST", self.path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        payload = json.loads(response.read())
        elapsed = time.perf_counter() - started
        if response.status != 200 or not payload["response"]["allowed"]:
            raise RuntimeError(f"webhook answered {response.status}: {payload}")
        return elapsed


def _run_rate(http: _Client, body: bytes, rate: float, seconds: float) -> dict[str, Any]:
    count = int(rate * seconds)
    latencies: list[float] = []
    lock = threading.Lock()
    start = time.perf_counter() + 0.2

    def one(index: int) -> None:
        delay = start + index / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        elapsed = http.post(body)
        with lock:
            latencies.append(elapsed)

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(one, range(count)))
    wall = time.perf_counter() - start
    ordered = sorted(latencies)
    return {"rate_asked": rate, "requests": count, "rate_held": round(count / wall, 1),
            "p50_ms": round(statistics.median(ordered) * 1000, 2),
            "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1000, 2)}


def _setup(api: client.ApiClient) -> tuple[str, str]:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "infertune.io", "v1alpha1", NAMESPACE, "inferencetunings", {
            "apiVersion": "infertune.io/v1alpha1", "kind": "InferenceTuning",
            "metadata": {"name": "qwen"},
            "spec": {"targetRef": {"name": "qwen"}, "engine": "vllm",
                     "memory": {"high": "30Gi"}}})
    apps.create_namespaced_deployment(NAMESPACE, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "qwen"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "qwen"}},
                 "template": {"metadata": {"labels": {"app": "qwen"}}, "spec": {"containers": [
                     {"name": "vllm", "image": "x", "command": ["vllm"]}]}}}})
    rs = wait_for(lambda: apps.list_namespaced_replica_set(NAMESPACE).items, "a ReplicaSet")[0]
    return rs.metadata.name, rs.metadata.labels["pod-template-hash"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.webhook_bench", description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rates", type=float, nargs="+", default=[50.0, 200.0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    bin_dir = cached_bin_dir()
    if missing_binaries(bin_dir):
        print("binaries not built; run: python -m e2e.cluster build", file=sys.stderr)
        return 1
    with scratch("infertune-bench-webhook-") as work, \
            Cluster.start(bin_dir=bin_dir, log_dir=work / "logs") as cluster:
        api = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(cluster.kubeconfig))
        operator = start_operator(api, work, cluster.log_dir, retune_interval=60, verbose=False)
        try:
            replicaset, template_hash = _setup(api)
            hook = client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(
                WEBHOOK_CONFIGURATION).webhooks[0].client_config
            http = _Client(hook.url, base64.b64decode(hook.ca_bundle))
            tuned = _review(_pod(replicaset, template_hash))
            untargeted = _review(_pod("other-5d8f7c", "5d8f7c"))
            http.post(tuned)  # the first request warms the connection and the code path
            rows = []
            for rate in args.rates:
                rows.append({"pod": "tuned", **_run_rate(http, tuned, rate, args.seconds)})
                rows.append({"pod": "untargeted (baseline)",
                             **_run_rate(http, untargeted, rate, args.seconds)})
        finally:
            operator.stop()
    results = {"when": datetime.now(UTC).isoformat(timespec="seconds"),
               "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
               "python": platform.python_version(), "seconds_per_rate": args.seconds,
               "rows": rows}
    _write(results, args.out)
    return 0


def _write(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "webhook.json").write_text(json.dumps(results, indent=2) + "\n")
    base = {r["rate_asked"]: r for r in results["rows"] if r["pod"].startswith("untargeted")}
    lines = ["# Pod-tuning webhook admission latency", "",
             f"Real HTTPS to `infertune run`, {results['python']} on {results['machine']}, "
             f"{results['when']}; {results['seconds_per_rate']:.0f} s per rate, open loop. "
             "Produced by `python -m bench.webhook_bench`. Goal: p99 < 5 ms.", "",
             "| pod | rate asked | rate held | p50 | p99 | p99 vs baseline |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in results["rows"]:
        ratio = row["p99_ms"] / base[row["rate_asked"]]["p99_ms"]
        lines.append(f"| {row['pod']} | {row['rate_asked']:.0f}/s | {row['rate_held']}/s | "
                     f"{row['p50_ms']} ms | {row['p99_ms']} ms | {ratio:.2f}x |")
    (out / "webhook.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
