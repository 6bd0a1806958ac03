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
that is how recent prometheus_client releases expose them over OpenMetrics. Templates
(spec.metrics.queries) are the user's PromQL and are read as written.
"""

from __future__ import annotations

from dataclasses import dataclass

from infertune.api.spec import Engine, InferenceTuningSpec


@dataclass(frozen=True)
class HistogramLatency:
    """A latency histogram; `name` without the _bucket/_count suffix. Its observations and
    bucket bounds times `to_seconds` are seconds (spec.metrics.latencyHistogramUnit)."""

    name: str
    to_seconds: float = 1.0


@dataclass(frozen=True)
class MeanLatency:
    """Mean latency from two counters: total time / requests, times `to_seconds`."""

    total: str
    requests: str
    to_seconds: float


@dataclass(frozen=True)
class Template:
    """The user's PromQL for a signal, per pod (spec.metrics.queries, api/templates.py):
    `$selector` and `$window` are filled in by promql.py."""

    text: str

    @property
    def uses_window(self) -> bool:
        return "$window" in self.text


@dataclass(frozen=True)
class TemplateLatency:
    """Latency from templates: bucket rates per pod and `le`, and requests per second per
    pod."""

    buckets: Template
    requests: Template


Latency = HistogramLatency | MeanLatency | TemplateLatency


@dataclass(frozen=True)
class EngineMetrics:
    queue_depth: str | Template
    running: str | Template | None
    latency: Latency

    @property
    def gauges_use_window(self) -> bool:
        """Whether the queue or running query depends on spec.metrics.window."""
        return any(isinstance(g, Template) and g.uses_window
                   for g in (self.queue_depth, self.running))


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
    queries = names.queries
    preset = PRESETS.get(spec.engine)

    def template(field: str) -> Template | None:
        text = None if queries is None else getattr(queries, field)
        return None if text is None else Template(text)

    queue = (template("queue_depth") or names.queue_depth
             or (preset.queue_depth if preset else None))
    running = template("running") or names.running or (preset.running if preset else None)
    latency: Latency | None = (
        HistogramLatency(names.latency_histogram, names.latency_histogram_unit.to_seconds)
        if names.latency_histogram
        else (preset.latency if preset else None))
    if queries is not None and queries.latency_buckets and queries.request_rate:
        latency = TemplateLatency(Template(queries.latency_buckets),
                                  Template(queries.request_rate))
    if queue is None or latency is None:
        raise ValueError(f"spec.metrics: engine {spec.engine.value} needs queueDepth and "
                         "latencyHistogram (or their templates in queries)")
    return EngineMetrics(queue, running, latency)
