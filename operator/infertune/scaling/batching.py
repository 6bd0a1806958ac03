"""The batching recommender: a max batch size for the engine's knob from latency and queue.

Every knob we drive trades latency for throughput in the same direction (a smaller max batch,
token budget or queue delay lowers latency). So: when latency breaches while the queue is low,
the batch is the cause and the knob goes down in proportion to the overshoot; when latency has
headroom while requests wait, it goes up; otherwise it stays. Always within [min, max].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infertune.api.scaling import (
    AutoscalingSpec,
    BatchingKnob,
    BatchingMode,
    BatchingSpec,
    LatencyAction,
)
from infertune.api.spec import Engine, batching_knob
from infertune.api.units import format_duration
from infertune.scaling.reading import Reading, queue_is_low
from infertune.scaling.signals import FLOAT_NOISE, latency_text, seconds

# Knobs counted in requests, where the observed running requests show the batch in use.
REQUEST_KNOBS = frozenset({BatchingKnob.MAX_NUM_SEQS, BatchingKnob.MAX_RUNNING_REQUESTS,
                           BatchingKnob.MAX_CONCURRENT_REQUESTS})
MAX_DECREASE = 0.5
"""At most halve per step, so one noisy sample cannot collapse throughput."""
MIN_STEP = 0.25
"""A step moves the knob by at least this fraction: mode Auto applies only such moves (each
re-creates the pods), and a smaller one, computed again from the same applied value, would
never be applied while the latency stays above target."""
MAX_INCREASE = 1.25
HEADROOM = 0.8
"""Grow only while latency is at most 80% of target, so a step up does not itself breach."""
FULL = 0.9
"""A knob counted in requests is raised only while the peak of the requests running per
replica reaches this share of it: below, the batch is not what holds requests back (vLLM
queues them when its KV cache is full), and a larger one admits nothing more, while mode
Auto re-creates every pod for each step."""


@dataclass(frozen=True)
class BatchingRecommendation:
    knob: BatchingKnob
    current: int | None
    recommended: int
    reason: str
    direction: int = 0
    """What the latency and queue call for, before the bounds: -1 lower the knob, 1 raise it,
    0 no change."""
    from_max: bool = False
    """The step started from `max` because the setting in use is not known: the engine's
    default may be anywhere, so a "lower" from there may raise it."""
    base: int | None = None
    """The value the step started from (`current`, else the peak of the requests running per
    replica, else `max`)."""

    @property
    def changed(self) -> bool:
        return self.current != self.recommended


def recommend_batching(batching: BatchingSpec, engine: Engine, autoscaling: AutoscalingSpec,
                       reading: Reading, current: int | None,
                       origin: str = "applied") -> BatchingRecommendation | None:
    """None when mode is Off or no knob applies (engine custom without spec.batching.knob).

    `current` is the value the pods run with when the operator knows it (mode Auto: the value
    it applied; else the value on the pod template's command line), None otherwise, and
    `origin` says which. Never the last recommendation: one that nothing applied has not
    changed the latency, and stepping from it again would walk the knob down to `min` while
    the latency stays where it was.

    With latency.action ScaleOut a breach is the autoscaler's to act on (it adds replicas):
    the knob is not lowered for it as well, which would re-create the pods while replicas are
    added and over-correct."""
    knob = batching_knob(batching, engine)
    if batching.mode is BatchingMode.OFF or knob is None:
        return None
    base, origin = _base(batching, knob, reading, current, origin)
    target = seconds(autoscaling.latency.target)
    latency = reading.latency_s
    direction = -1
    if (reading.latency_breached and latency is not None and queue_is_low(autoscaling, reading)
            and autoscaling.latency.action is not LatencyAction.SCALE_OUT):
        factor = max(MAX_DECREASE, min(1 - MIN_STEP, target / latency))
        proposed = min(math.floor(base * factor + FLOAT_NOISE), base - 1)
        why = (f"{reading.latency_kind} {latency_text(latency, target)} above "
               f"{latency_text(target)} for "
               f"{reading.breaches} samples with the queue low: lower {knob.value} by "
               f"x{factor:.2f}")
    elif (latency is not None and latency <= HEADROOM * target and reading.queue_sustained
            and (not_full := _not_full(knob, reading, base)) is not None):
        proposed, direction = base, 0
        why = (f"{reading.latency_kind} {latency_text(latency)} has headroom under "
               f"{latency_text(target)} while the queue stays above target, but {not_full}: "
               f"a larger {knob.value} would admit nothing more")
    elif latency is not None and latency <= HEADROOM * target and reading.queue_sustained:
        direction = 1
        # A latency of 0 (a template's gauge at rest) has all the headroom there is; divided
        # by, it failed every evaluation, and the queue's scale-outs with it.
        factor = MAX_INCREASE if latency <= 0 else min(MAX_INCREASE, target / latency)
        proposed = max(math.ceil(base * factor - FLOAT_NOISE), base + 1)
        why = (f"{reading.latency_kind} {latency_text(latency)} has headroom under "
               f"{latency_text(target)} while the queue stays above target: raise {knob.value} "
               f"by x{factor:.2f}")
    else:
        proposed, direction = base, 0
        why = _unchanged(autoscaling, reading, target)
    recommended = min(max(proposed, batching.min), batching.max)
    if recommended != proposed:
        why += f" (kept within {batching.min}..{batching.max})"
    return BatchingRecommendation(knob, current, recommended,
                                  f"{why}; from {base} ({origin}) to {recommended}", direction,
                                  current is None and origin == FROM_MAX, base)


def _not_full(knob: BatchingKnob, reading: Reading, base: int) -> str | None:
    """Why the batch in use is not full, for a knob counted in requests whose running peak is
    known; None when it is full, or that cannot be told (a token budget, no running data)."""
    peak = reading.running_peak
    if knob not in REQUEST_KNOBS or peak is None or peak >= FULL * base - FLOAT_NOISE:
        return None
    return (f"the batch is not full: at most {peak:.4g} requests ran per replica of the "
            f"{base} it allows")


def _unchanged(autoscaling: AutoscalingSpec, reading: Reading, target: float) -> str:
    """Why the latency and queue call for no change, in their numbers: "do not call for a
    change" read as a contradiction beside a P99 five times its target."""
    latency = reading.latency_s
    if latency is None:
        return "no latency reading calls for a change"
    shown = f"{reading.latency_kind} {latency_text(latency, target)}"
    waiting = reading.queue_per_replica
    if (reading.latency_breached and autoscaling.latency.action is LatencyAction.SCALE_OUT
            and waiting is not None and waiting <= autoscaling.queue.target_per_replica):
        # Whether or not the queue is low all through its window (queue_is_low): with
        # ScaleOut, a breach never lowers the batch.
        return "the latency breach is scaled out (latency.action ScaleOut), not batched"
    if reading.latency_floor_s is not None or reading.latency_bounds_unknown:
        why = ("under the histogram's lowest bucket, where it cannot be told from the target"
               if reading.latency_floor_s is not None else
               "the histogram's bucket bounds are not known")
        return f"{shown} is not compared with {latency_text(target)} ({why})"
    if reading.latency_quiet:
        return f"{shown} is over too few requests to call for a change"
    if reading.latency_breached:
        queue_target = autoscaling.queue.target_per_replica
        if reading.queue_per_replica is None:
            queue, cause = "no queue reading", "it is not taken for the batch's"
        elif reading.queue_above_ago_s is not None:
            queue, cause = (f"the queue above its target {queue_target:g} "
                            f"{format_duration(round(reading.queue_above_ago_s))} ago (at "
                            f"{reading.queue_per_replica:.4g} per replica now)",
                            "replicas are short, not the batch")
        elif reading.queue_steps is not None:
            queue, cause = (f"the queue at {reading.queue_per_replica:.4g} per replica but data "
                            f"for only {reading.queue_steps} steps of its "
                            f"{autoscaling.queue.sustain} window",
                            "it is not known to be the batch's")
        else:
            queue, cause = (f"the queue at {reading.queue_per_replica:.4g} per replica, above "
                            f"its target {queue_target:g}", "replicas are short, not the batch")
        return (f"{shown} is above {latency_text(target)} with {queue}: {cause}, so it is not "
                "changed")
    if latency > target and reading.latency_backlog is not None:
        # Above target for every sample, and no breach: said as the autoscaling reason says
        # it ("2 of 2 samples: no change yet" read as a breach about to be acted on).
        return (f"{shown} is above {latency_text(target)}, but the requests waiting fell as "
                "a backlog the replicas drain, whose latency that is: it is not changed")
    if latency > target and not reading.latency_settled:
        # No sample counts then (reading._consecutive_breaches): the newest comes first.
        return (f"{shown} is above {latency_text(target)}, but was measured partly before the "
                "replicas or their batch last changed: no change yet")
    if latency > target:
        return (f"{shown} is above {latency_text(target)} for {reading.breaches} of "
                f"{autoscaling.latency.consecutive_samples} samples: no change yet")
    if latency > HEADROOM * target:
        return (f"{shown} is within {1 - HEADROOM:.0%} of {latency_text(target)}: no headroom "
                "to raise it, and no breach to lower it")
    if reading.queue_per_replica is None:
        return (f"{shown} has headroom under {latency_text(target)}, but there is no queue "
                "reading to say whether requests wait")
    return (f"{shown} has headroom under {latency_text(target)}, but the queue does not stay "
            "above its target: a larger batch would gain nothing")


def _base(batching: BatchingSpec, knob: BatchingKnob, reading: Reading,
          current: int | None, origin: str) -> tuple[int, str]:
    if current is not None:
        return current, origin
    if knob in REQUEST_KNOBS and reading.running_peak is not None:
        return max(1, math.ceil(reading.running_peak)), "peak running requests per replica"
    return batching.max, FROM_MAX


FROM_MAX = "current setting unknown, starting from max"
