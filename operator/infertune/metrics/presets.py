"""The metric names each serving engine exports, checked against the engines' own sources.

- vLLM: vllm/v1/metrics/loggers.py (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
  histogram `vllm:e2e_request_latency_seconds`), the same names as the v0 engine.
- SGLang: python/sglang/srt/metrics/collector.py (`sglang:num_queue_reqs`,
  `sglang:num_running_reqs`, histogram `sglang:e2e_request_latency_seconds`).
- TGI: router/src (`tgi_queue_size`, `tgi_batch_current_size`, `tgi_request_duration`, a
  histogram because the router gives every name ending in "duration" buckets).
- Triton: docs/user_guide/metrics.md (`nv_inference_pending_request_count`; end-to-end latency
  only as the counters `nv_inference_request_duration_us` and `nv_inference_request_success`
  unless histograms are enabled, so the preset reads a mean, not a quantile).

Names with a colon are also looked up with the colon written as an underscore (promql.py):
that is how recent prometheus_client releases expose them over OpenMetrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from infertune.api.spec import Engine, InferenceTuningSpec


@dataclass(frozen=True)
class HistogramLatency:
    """A latency histogram in seconds; `name` without the _bucket/_count suffix."""

    name: str


@dataclass(frozen=True)
class MeanLatency:
    """Mean latency from two counters: total time / requests, times `to_seconds`."""

    total: str
    requests: str
    to_seconds: float


@dataclass(frozen=True)
class EngineMetrics:
    queue_depth: str
    running: str | None
    latency: HistogramLatency | MeanLatency


PRESETS: dict[Engine, EngineMetrics] = {
    Engine.VLLM: EngineMetrics("vllm:num_requests_waiting", "vllm:num_requests_running",
                               HistogramLatency("vllm:e2e_request_latency_seconds")),
    Engine.SGLANG: EngineMetrics("sglang:num_queue_reqs", "sglang:num_running_reqs",
                                 HistogramLatency("sglang:e2e_request_latency_seconds")),
    Engine.TGI: EngineMetrics("tgi_queue_size", "tgi_batch_current_size",
                              HistogramLatency("tgi_request_duration")),
    Engine.TRITON: EngineMetrics("nv_inference_pending_request_count", None,
                                 MeanLatency("nv_inference_request_duration_us",
                                             "nv_inference_request_success", 1e-6)),
}


def engine_metrics(spec: InferenceTuningSpec) -> EngineMetrics:
    """The preset of the spec's engine with spec.metrics names laid over it.

    Engine custom has no preset; its validation requires queueDepth and latencyHistogram.
    """
    names = spec.metrics
    preset = PRESETS.get(spec.engine)
    queue = names.queue_depth or (preset.queue_depth if preset else None)
    running = names.running or (preset.running if preset else None)
    latency: HistogramLatency | MeanLatency | None = (
        HistogramLatency(names.latency_histogram) if names.latency_histogram
        else (preset.latency if preset else None))
    if queue is None or latency is None:
        raise ValueError(f"spec.metrics: engine {spec.engine.value} needs queueDepth and "
                         "latencyHistogram")
    return EngineMetrics(queue, running, latency)
