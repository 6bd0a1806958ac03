"""The autoscaler's decision: a pure function of the spec, the replicas, the signals and state.

It reads like HPA's replica calculator (kubernetes pkg/controller/podautoscaler): each signal
proposes ceil(current * value / target) outside a tolerance band, the highest proposal wins,
missing data never scales down, and the scale-down stabilization window and the rate limits
are applied afterwards (`behavior.py`). Every decision carries a reason with its numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import StrEnum
from typing import NamedTuple

from infertune.api.scaling import (
    MAX_BREACH_MEMORY_S,
    MAX_BREACHES,
    STARTING_S,
    AutoscalingSpec,
    LatencyAction,
    MetricsUnavailableAction,
)
from infertune.api.units import format_duration
from infertune.scaling.behavior import Limit, limit_rate, stabilize
from infertune.scaling.reading import Reading, queue_is_low, read_signals
from infertune.scaling.signals import (
    FLOAT_NOISE,
    TargetSignals,
    amount_text,
    distinct,
    latency_text,
    seconds,
)
from infertune.scaling.state import (
    CURED,
    NOT_LOAD,
    OPEN,
    Breach,
    Carried,
    QueueSeen,
    Recommendation,
    ScaleEvent,
    ScalingState,
    Serving,
)


class ScaleAction(StrEnum):
    SCALE_OUT = "ScaleOut"
    SCALE_IN = "ScaleIn"
    HOLD = "Hold"
    TUNE_BATCHING = "TuneBatching"
    FALLBACK = "Fallback"
    DISABLED = "Disabled"


class Outage(StrEnum):
    """What a decision made without any usable signal does (ScaleDecision.outage)."""

    HOLD = "Hold"
    """Replicas are held where they are (never scaled in on missing data)."""
    FALLBACK = "Fallback"
    """metricsUnavailable.action Fallback is in effect: replicas are raised to its count."""


class ScaleDecision(NamedTuple):
    current_replicas: int
    desired_replicas: int
    action: ScaleAction
    reason: str
    signals: Reading
    state: ScalingState
    """The state to store when the decision is applied (it records the scale event)."""
    held_state: ScalingState
    """The state to store when it is not applied (DryRun, or the scale call failed)."""
    wanted: int | None = None
    """The replicas the signals call for, before the stabilization window and the rate
    limits, at most maxReplicas (the state records the recommendation uncapped, and a window
    of 0s does not keep it); None when nothing was decided from them (disabled, 0 replicas,
    a count outside minReplicas..maxReplicas brought inside them, metrics missing)."""
    limited: Limit | None = None
    """What kept the replicas from `wanted` (maxReplicas, minReplicas, a rate limit), for the
    ScalingLimited condition; None when nothing did, or nothing was decided from the
    signals."""
    outage: Outage | None = None
    """Set when no signal had usable data: what the decision does about it."""


Stuck = str | Callable[[Reading], str | None] | None
"""Why nothing lowers the batch (decide_scale's `batching_stuck`), or how to tell from the
reading."""


class _Proposal(NamedTuple):
    replicas: int | None
    """None: this signal has no opinion (healthy latency, quiet traffic, missing data)."""
    why: str
    tune_batching: bool = False


def decide_scale(spec: AutoscalingSpec, current_replicas: int, signals: TargetSignals,
                 state: ScalingState, now: float, ready: int | None = None,
                 ready_pods: int | None = None,
                 batching_stuck: Stuck = None,
                 batch_changed: float | None = None,
                 ready_since: float | None = None) -> ScaleDecision:
    """`ready` is the Deployment's status.readyReplicas, None when not known; `ready_pods`
    that count where `ready` is what is taken for serving instead (Reading.ready_pods);
    `ready_since` when the last of the pods `ready` counts became Ready (their Ready
    conditions' lastTransitionTime), None when not known: pods that joined count from then,
    not from the evaluation that first reads them (_track_serving);
    `batching_stuck` why nothing lowers the batch for a breach (batching is Off, or already
    at spec.batching.min), for the reason: latency.action Auto scales out instead. As a
    function of the reading, it is called only for a breach that Auto would hand to
    batching. `batch_changed`: since when every pod serves with the batching value mode Auto
    last set, while its effect is not measured yet (`now` while they do not all run it);
    None when no change is being measured. A latency sample counts as a breach only once
    its window starts after it, as after the replicas change: the samples of the old batch,
    with the queue up while the pods were re-created, scaled out on top of the lower."""
    state = state.as_of(now)
    if ready is not None:
        state = _track_serving(state, current_replicas, ready, now, ready_since)
    # The pods that serve are as _track_serving left them for the rest of the evaluation.
    changed = _changed_at(state)
    state, falls = _track_queue(spec, state, signals, current_replicas, now, changed)
    reading = read_signals(spec, signals, now, ready,
                           changed if batch_changed is None
                           or (changed is not None and changed >= batch_changed)
                           else batch_changed)
    if ready_pods is not None:
        reading = reading._replace(ready_pods=ready_pods)
    drained = _drained_at(state, changed)
    falling = _falling(spec, state, now)
    if reading.latency_breached and (falling is not None or (
            drained is not None
            and not read_signals(spec, signals, now, ready, drained).latency_breached)):
        # The latency of a backlog the replicas drain (its samples reach back to when the
        # queue fell as one drains; or the queue fell by more than BACKLOG_FALL just now,
        # which the next reading confirms or not) is no breach of the load: it holds the
        # replicas (no scale-in), adds none, changes no batch and is not remembered. Taken
        # for one, the P99 of a burst's end, over a request rate whose window also held the
        # quiet after it, was remembered at 7 req/s per replica where 10 was the burst's
        # and held 11 replicas where 10 carried the load for a day, and with a low queue it
        # was handed to batching, which re-created every pod to lower the batch.
        kind = reading.latency_kind
        if falls is None and falling is not None:
            falls = (f"{falling}: the {kind} above target may be a backlog's (the next "
                     "reading tells), so it")
        else:
            falls = (falls or "the requests waiting last fell, as a backlog drains, "
                     f"{format_duration(round(now - (drained or now)))} ago") + (
                f": the {kind} above target is that backlog's, so it")
        falls += (" adds no replicas, changes no batch and is not remembered as what a replica "
                  "carries")
        reading = reading._replace(latency_breached=False, latency_backlog=falls)
    elif falls is not None and drained is not None:
        falls += ": a backlog the replicas drain"
    else:
        falls = None
    state = _track_missing(state, reading, now, current_replicas)
    if not spec.enabled:
        return _held(current_replicas, ScaleAction.DISABLED, "spec.autoscaling.enabled is false; "
                     f"keeping {current_replicas} replicas", reading, state)
    if current_replicas == 0:
        # As HPA: a target scaled to zero by someone else is left alone.
        return _held(0, ScaleAction.HOLD, "the target has 0 replicas; scaling is paused until "
                     "it is scaled up", reading, state)
    if not spec.min_replicas <= current_replicas <= spec.max_replicas:
        # As HPA: a count outside the bounds is brought inside them before any metric counts,
        # with metrics or without (the bounds are the spec's, not a reading of the data).
        bound = min(max(current_replicas, spec.min_replicas), spec.max_replicas)
        return _applied(spec, current_replicas, bound, f"{_count(current_replicas)} is outside "
                        f"minReplicas..maxReplicas ({spec.min_replicas}..{spec.max_replicas})",
                        reading, state, now, record=bound)._replace(wanted=None)
    if reading.queue_missing and reading.latency_missing:
        return _metrics_unavailable(spec, current_replicas, reading, state, now)
    return _decide_on_signals(spec, current_replicas, reading, state, now, batching_stuck,
                              falls, drained or changed)


def _decide_on_signals(spec: AutoscalingSpec, current: int, reading: Reading,
                       state: ScalingState, now: float, batching_stuck: Stuck = None,
                       falls: str | None = None, settled: float | None = None) -> ScaleDecision:
    """`falls`: what the queue falling as a backlog drains does to this decision, for the
    reason (None: nothing); `settled`: since when the pods that serve are the same and the
    queue has not fallen as a backlog drains (_changed_at, _drained_at), None when not
    known."""
    queue = _queue_proposal(spec, current, reading)
    serving = _serving(current, state)
    not_load = None
    if state.breaches or reading.latency_breached:  # the usual case: neither
        breaches, not_load = _breach_outcomes(spec, state.breaches, reading, serving, now)
        if breaches != state.breaches:
            state = state.with_breaches(breaches)
    fine = _fine_per_replica(spec, reading, serving)
    carried = _carried(spec, state.carried, fine, now)
    if carried is not None and reading.latency_breached and not_load is None:
        carried = carried._replace(failed=now)  # a breach of the load: no step for a while
    if carried is not state.carried:
        state = state._replace(carried=carried)
    overload = None
    # Right after a scale-in: the rate-limit periods (up to 30m) keep older ones, and the
    # paths that hold (Disabled, 0 replicas, no metrics) keep every one.
    scaled_in = (bool(state.scale_events) and state.scale_events[-1].change < 0
                 and now - state.scale_events[-1].time <= _scale_in_kept_s(spec))
    if ((state.breaches or scaled_in) and queue.replicas is not None and queue.replicas > current
            and serving == current and _falling(spec, state, now, BURST_END_FALL) is None
            and (settled is None or now - seconds(spec.queue.sustain) >= settled)):
        # Only once every replica serves and the queue stayed above target all through the
        # sustain window after that, and after it last fell as a backlog drains: a backlog
        # the replicas before built (or pods still loading their model) read as the load a
        # replica cannot carry, at a burst's end, and held 19 replicas where 10 carried it,
        # for up to a day.
        breaches, overload = _queue_overload(spec, state.breaches, reading, serving, now,
                                             scaled_in)
        if breaches != state.breaches:
            state = state.with_breaches(breaches)
    latency = _latency_proposal(spec, current, reading, serving, batching_stuck, not_load)
    pods = reading.queue_pods
    if (pods is not None and pods < current and queue.replicas is not None
            and latency.replicas is not None and latency.replicas > max(queue.replicas, current)
            and not queue_is_low(spec, reading)
            and (state.serving is None or serving < current)):
        # Requests queue at the pods that serve while the others load their model, and the
        # latency breaches with them: sized by the queue, which counts the replicas that are
        # coming. Sized on every replica, the breach doubled the count each interval (4, 8,
        # 16, 32, 64) until the new pods served. Only while replicas may still be starting
        # (not known to serve, for STARTING_S at most; always when readiness was never
        # read): a pod that serves but whose scrape fails, or one Pending for good, held
        # every breach for as long as it lasted.
        capped = max(queue.replicas, current)
        latency = _Proposal(capped, f"{latency.why}; the queue sizes it ({pods} of {current} "
                            f"pods report): {capped}", latency.tune_batching)
    opinions = [p.replicas for p in (queue, latency) if p.replicas is not None]
    raw = max(opinions, default=current)
    # What the signals call for, before a missing one or a breach holds the count (no
    # opinion at all, the queue missing and the latency quiet, is no call for anything).
    called = max(opinions, default=0)
    notes = [queue.why, latency.why, *([overload] if overload else [])]
    if falls is not None:
        notes.append(falls)
    # The request rate is a query of its own, which can fail alone: unknown, a low latency
    # may be one of too few requests, and a breach cannot be told the load's.
    missing = reading.queue_missing or reading.latency_missing or reading.request_rate is None
    if missing or reading.latency_bounds_unknown:
        # A latency that cannot be compared with its target (the histogram's bounds are not
        # known yet; read again every minute) is no data either: left to the queue alone, a
        # P99 28 times the target let a low queue take 8 replicas down to 2.
        if raw < current:
            notes.append("not scaling in while a signal is missing" if missing else
                         "not scaling in while the latency cannot be compared with its target")
        raw = max(raw, current)
    if (raw < current and seconds(spec.latency.breach_memory) > 0
            and (load := _limiting(spec, state.breaches, now))):
        # Within breachMemory only: an uncured breach is kept longer (UNCURED_KEPT_S) to tell
        # a breach the replicas did not lower, and with breachMemory 10m it held scale-ins
        # for an hour while nothing measured the latency fine (traffic under
        # minRequestRate).
        floor, held, used = _breach_floor(spec, load, reading, current, now)
        floor, held = _known_to_carry(spec, state.carried, used, reading, floor, held)
        if floor > raw and floor > spec.min_replicas:  # minReplicas holds those anyway
            raw = floor
            notes.append(held)
            # Remembered for breachMemory after the last scale-in it limited, too (and at
            # most MAX_BREACH_MEMORY_S after the breach): forgotten an hour after the breach,
            # the queue took the replicas away under the same load, and it breached again
            # every hour or so (9% of the samples above target with a noisy load).
            state = state.with_breaches(tuple(b._replace(time=now) if b is used else b
                                              for b in state.breaches))
    if (raw < current and not missing and state.carried is not None
            and not _limiting(spec, state.breaches, now)):
        # A healthy latency has no opinion, and a queue at 0 says only that the replicas keep
        # up: with no breach left to limit it, the queue took a Deployment serving 95 req/s
        # on 10 replicas to minReplicas (one replica) whenever the breach that had held it
        # was forgotten (24h after it, or cured at its own rate once), and P99 stayed over
        # 1 s for 18 minutes while the replicas came back. While a breach limits, its floor
        # knows more (a replica carries less than the breach's rate, more than what was
        # fine since).
        floor, held = _carried_floor(spec, state.carried, reading, current, now,
                                     probe=fine is not None and (
                                         state.carried.failed is None
                                         or now - state.carried.failed
                                         >= seconds(spec.latency.breach_memory)))
        if floor > raw and floor > spec.min_replicas:
            raw = floor
            notes.append(held)
    if raw < current and _window_empty(spec, state.recommendations, now):
        # Nothing recommended within the scale-down window, nor at the last interval (a first
        # evaluation, autoscaling enabled again, another targetRef, an operator or metrics
        # outage longer than the window): the current count counts as a recommendation made
        # now, as HPA starts the window of a target it sees for the first time, and is
        # stored with the state. An empty window let a new tuning take a busy Deployment from
        # 10 replicas to minReplicas at its first evaluation. A window no longer than the
        # interval is empty at every evaluation: seeded then, it held every scale-in.
        state = state._replace(
            recommendations=(*state.recommendations, Recommendation(now, current)))
        notes.append(f"no recommendation in the last {spec.scale_down.stabilization} before "
                     f"this one, so the current {current} counts as one")
    stabilized, why = stabilize(current, raw, state.recommendations, spec.scale_up,
                                spec.scale_down, now)
    notes += [why] if why else []
    desired, why, limited = limit_rate(current, stabilized, state.scale_events, spec.scale_up,
                                       spec.scale_down, spec.min_replicas, spec.max_replicas,
                                       now)
    notes += [why] if why else []
    if limited is None and desired == spec.max_replicas and called >= spec.max_replicas and (
            called > spec.max_replicas
            or _highest_in_window(spec, state.recommendations, now) > spec.max_replicas):
        # Held where maxReplicas would have held it anyway (a scale-up window kept the count
        # at the bound), or at the bound, the signals calling for it now and for more within
        # the scale-down window: still the bound that keeps it there. On this reading alone,
        # a saturated Deployment whose queue fell within the tolerance now and then turned
        # TooManyReplicas off and on (58 times in an hour, never 10 minutes on end: the
        # alert on it never fired). Not once the signals call for fewer (the load gone, or
        # maxReplicas lowered under an older call), a signal missing or not: `called`, not
        # `raw`, which a missing signal or a breach holds at the current count (no call for
        # it), and which is above maxReplicas only where `called` is. The window holds the
        # count then, not the bound. Not so at minReplicas, which is judged on the
        # stabilized count, as HPA does: a quiet queue moving between 0 and 3 per replica at
        # minReplicas 1 turned TooFewReplicas on and off every interval.
        limited = Limit.TOO_MANY
    tune = latency.tune_batching and desired == current
    return _applied(spec, current, desired, "; ".join(notes), reading, state, now, record=raw,
                    tune_batching=tune, limited=limited)


def _highest_in_window(spec: AutoscalingSpec, recommendations: tuple[Recommendation, ...],
                       now: float) -> int:
    """The highest recommendation within the scale-down stabilization window (0: none), as
    `stabilize` counts them."""
    cutoff = now - seconds(spec.scale_down.stabilization)
    return max((r.replicas for r in recommendations if r.time > cutoff), default=0)


def _window_empty(spec: AutoscalingSpec, recommendations: tuple[Recommendation, ...],
                  now: float) -> bool:
    """Whether the scale-down window (when it is not 0s) holds no recommendation and the
    newest is not the last slot's."""
    window = seconds(spec.scale_down.stabilization)
    if window <= 0:
        return False
    if not recommendations:
        return True
    newest, interval = recommendations[-1].time, spec.interval.seconds
    # Out of the window at its edge too (stabilize counts those after now - window), and not
    # from the last slot: a pass more than SLOT_LATENESS_S late is stamped with the clock,
    # so two evaluations in a row may be more than an interval apart. 1 ms: a slot start
    # read back from status (microseconds) may be just under it.
    return newest <= now - window and (
        math.floor((newest + 1e-3) / interval) < math.floor((now + 1e-3) / interval) - 1)


def _queue_proposal(spec: AutoscalingSpec, current: int, reading: Reading) -> _Proposal:
    queue, target = reading.queue_per_replica, spec.queue.target_per_replica
    if queue is None:
        return _Proposal(None, "queue: no data")
    ratio = queue / target
    # Told apart from the tolerance's edge it is compared with (as it is compared).
    shown = distinct(ratio, 1 + spec.tolerance if ratio >= 1 else 1 - spec.tolerance, 2,
                     FLOAT_NOISE)
    pods = reading.queue_pods
    # Told apart from the target too: "queue 0.0/replica vs target 0.01 (ratio 1.40)".
    queue_said = amount_text(queue, target)
    if pods is None or pods == current:
        base, said = current, f"queue {queue_said}/replica vs target {target:g} (ratio {shown})"
    else:
        # Sized on the pods that report, as HPA sizes on the pods it has metrics for: the
        # waiting requests over the target. Sized on their mean times every replica, a
        # scale-out doubled the count each interval while the new pods loaded their model
        # (4, 8, 16, 32, 64 for 256 requests that 8 take); pods that never report (Pending,
        # no GPU) do not hold a scale-in either, and the Deployment removes those first.
        base = pods
        said = (f"queue {queue_said}/pod over the {pods} pods reporting ({queue * pods:.0f} "
                f"waiting, {current} replicas) vs target {target:g} (ratio {shown})")
    if abs(ratio - 1) <= spec.tolerance + FLOAT_NOISE:  # 1.1 - 1 is 0.10000000000000009
        return _Proposal(current, f"{said}, within tolerance {spec.tolerance:g}")
    if ratio > 1 and base < current:
        # Over every replica, as HPA takes the pods without a metric on a scale-up (at 0):
        # one scrape that failed of 10 pods turned a queue 1.0125 times the target into +1.
        overall = base * ratio / current
        if abs(overall - 1) <= spec.tolerance + FLOAT_NOISE:
            shown = distinct(overall, 1 + spec.tolerance if overall >= 1 else
                             1 - spec.tolerance, 2, FLOAT_NOISE)
            return _Proposal(current, f"{said}; over all {current} replicas ratio {shown}, "
                             f"within tolerance {spec.tolerance:g}")
    proposed = _ceil(base * ratio)
    silent = _silent(current, reading)
    if ratio < 1 and silent:
        # Ready pods that do not report (a scrape that times out under load: their series
        # go stale) are taken to be at the target on a scale-in, as HPA takes the pods it
        # has no metric for; left out, 4 quiet pods of 10 took the other 6 away with them.
        said = f"{said}; {silent} Ready pods not reporting, counted at target"
        if abs((base * ratio + silent) / (base + silent) - 1) <= spec.tolerance + FLOAT_NOISE:
            return _Proposal(current, f"{said}: within tolerance {spec.tolerance:g}")
        proposed = _ceil(base * ratio + silent)
    if ratio < 1:
        if proposed >= current:
            # More pods report than there are replicas (a rollout's surge, pods still
            # terminating): which of them serve is not known, so nothing is taken away.
            return _Proposal(current, f"{said} -> {proposed}: not fewer than the {current} "
                             "replicas now")
        return _Proposal(proposed, f"{said} -> {proposed}")
    sustain = spec.queue.sustain
    if not reading.queue_sustained:
        return _Proposal(current, f"{said}, above target for "
                         f"{format_duration(reading.queue_above_for_s)} of {sustain}")
    if proposed <= current:
        return _Proposal(current, f"{said}, above target for {sustain} -> {proposed}: the "
                         f"{current} replicas cover it once they all serve")
    return _Proposal(proposed, f"{said}, above target for {sustain} -> {proposed}")


def _silent(current: int, reading: Reading) -> int:
    """The Ready replicas that do not report the queue now: 0 when the ready count or the
    reporting pods are not known, or more pods report than are Ready (those not Ready, or
    Pending for want of a GPU, are the Deployment's first to go on a scale-in)."""
    ready = reading.ready_replicas if reading.ready_pods is None else reading.ready_pods
    pods = reading.queue_pods
    if ready is None or pods is None:
        return 0
    return max(0, min(ready, current) - pods)


def _changed_at(state: ScalingState) -> float | None:
    """Since when the pods that serve have been the same, as far as the state knows: their
    last change (Serving.changed) once the Deployment's readiness is read, else the newest
    scale event. None when it knows neither."""
    if state.serving is not None:
        return state.serving.changed
    return state.scale_events[-1].time if state.scale_events else None


def _drained_at(state: ScalingState, changed: float | None) -> float | None:
    """When the queue was last seen falling as a backlog drains (QueueSeen.fell), where that
    is after the pods that serve last changed (`changed`); None otherwise."""
    fell = None if state.queue is None else state.queue.fell
    return fell if fell is not None and (changed is None or fell > changed) else None


BACKLOG_FALL = 0.1
"""How much the requests waiting fall, over evaluations in a row that each find fewer, for
a backlog the replicas drain (_track_queue): over two at least, as a queue that wavers
falls by as much from one to the next now and then. At one fall of more than this, a
latency breach is not taken for the load's until the next reading (_falling)."""
BACKLOG_ABOVE = 2.0
"""A fall counts as a backlog's where it began at this many times the queue's target or
more: a queue that wavers around its target fell by 10% twice in a row every few
evaluations, and held back the latency's scale-out for a P99 four times its target for up
to four minutes."""
BURST_END_FALL = 0.25
"""One fall of the requests waiting of more than this, where a burst ends, and the queue's
overload is not taken at that evaluation either (_queue_overload): its request rate is
over a window that also holds the quiet after the burst. Not at BACKLOG_FALL: a queue that
wavers by 15% fell by 11% where a scale-in had just left too few replicas, the overload
went unremembered, and 30 req/s went 4 -> 2 -> 6 -> 12 with a P99 of 30s."""


def _falling(spec: AutoscalingSpec, state: ScalingState, now: float,
             by: float = BACKLOG_FALL) -> str | None:
    """Said when this evaluation's queue (_track_queue) found more than `by` fewer requests
    waiting than where a fall that began at BACKLOG_ABOVE times the target or more began:
    perhaps a backlog the replicas drain, which the next reading tells (QueueSeen.fell).
    None otherwise."""
    queue = state.queue
    if (queue is None or queue.time != now or queue.falling_from is None
            or not queue.falling_from > spec.queue.target_per_replica * BACKLOG_ABOVE
            * queue.pods
            or not queue.waiting < queue.falling_from * (1 - by)):
        return None
    return (f"the requests waiting fell from {_waiting_text(queue.falling_from)} to "
            f"{_waiting_text(queue.waiting)}")


def _waiting_text(waiting: float) -> str:
    """A count of requests waiting (summed over pods, each a mean over its scrape): whole
    from 100, else to three figures (a queue target of 0.5 read "fell from 2 to 2")."""
    return f"{waiting:.0f}" if waiting >= 100 else f"{waiting:.3g}"


def _track_queue(spec: AutoscalingSpec, state: ScalingState, signals: TargetSignals,
                 current: int, now: float,
                 changed: float | None) -> tuple[ScalingState, str | None]:
    """The state with this evaluation's queue (QueueSeen), and, when the requests waiting
    have fallen as a backlog drains, since when and by how much (for the reason). `changed`:
    when the pods that serve last changed (_changed_at).

    A backlog drains where the requests waiting fall from BACKLOG_ABOVE times the target or
    more at two evaluations in a row or more (each at most two intervals after the one
    before, and taken from `changed` on), by more than BACKLOG_FALL from where they began, with no
    replica taken away and no pod that reported them missing (a scale-in takes its pods'
    requests with it, and a pod whose scrape times out takes its count out of the sum): the
    replicas then serve faster than requests come in, so what waits is a backlog of before
    (a burst, or fewer replicas), and the latency of its requests does not say what a
    replica carries.
    Remembered as a breach, a backlog that took minutes to drain at maxReplicas was cured
    at the same rate once it had drained, and forgotten with what was known before it, and
    the queue, at 0, took the 30 replicas 170 req/s needed to 1, every nine minutes."""
    per_pod = signals.queue.latest(signals.fresh_at(now))
    if per_pod is None or current <= 0:
        return state, None
    pods = signals.queue.pods or current
    waiting = per_pod * pods
    if not math.isfinite(waiting):  # a mean near float's limit, summed over the pods
        return state, None
    before = state.queue
    fell = None if before is None else before.fell
    began = said = None
    if (before is not None and before.time < now <= before.time + 2 * spec.interval.seconds + 1
            and (changed is None or before.time >= changed)
            and current >= before.replicas and pods >= before.pods and waiting < before.waiting):
        began = before.waiting if before.falling_from is None else before.falling_from
        if (before.falling_from is not None
                and began > spec.queue.target_per_replica * BACKLOG_ABOVE * before.pods
                and waiting < began * (1 - BACKLOG_FALL)):
            fell = now
            said = (f"the requests waiting fell from {_waiting_text(began)} to "
                    f"{_waiting_text(waiting)} over evaluations in a row")
    return ScalingState(state.recommendations, state.scale_events, state.metrics_missing_since,
                        state.serving, state.breaches,
                        QueueSeen(now, waiting, pods, current, fell, began), state.carried), said


UNCURED_KEPT_S = 3600.0
"""How long an uncured breach is kept with latency.breachMemory shorter than it (0s: no
scale-in limit), for telling a breach the replicas added did not lower (NOT_LOAD)."""


def _breach_outcomes(spec: AutoscalingSpec, breaches: tuple[Breach, ...], reading: Reading,
                     serving: int, now: float) -> tuple[tuple[Breach, ...], str | None]:
    """The breaches remembered after this reading (ScalingState.breaches), and why the
    breach it reads, if any, is not the load's (None when it is, or there is none).

    Remembered: within latency.breachMemory (an uncured one for UNCURED_KEPT_S at least), and
    of the latency target and quantile the spec has now. A latency measured at or under the
    target on the pods that serve now cures the open breaches (and forgets those found not
    the load's). A breach on more replicas than an uncured one, at a rate per replica lower
    beyond the tolerance, whose latency came down by less than a quarter of what that rate
    says (`latency x rate per replica now / then`), is not the load's: the replicas added
    did not lower it (a slow dependency, a bad release, longer requests). The uncured ones
    are marked so (and kept while it lasts), and it is not remembered. Any other breach is
    (_added): the older ones at a rate per replica as high or higher are dropped (it is
    lower and newer) but the lowest of the load's, and of more than MAX_BREACHES the lowest
    and the newest are kept, so the lowest is remembered for breachMemory after it (or
    after the last scale-in it limited, and at most MAX_BREACH_MEMORY_S after it) and the
    newest takes over then. A breach under one the queue overloaded at is not judged
    against that one's latency: the queue said it was the load's. A breach at a rate per
    replica the latency was measured fine at since an earlier one (its `healthy`) is taken
    for a burst of slow requests and not remembered (the earlier one `doubted`); a second
    such episode within breachMemory is remembered, and clears that `healthy` (a slower
    release). A breach on too few requests (`_too_few`) is remembered only with action
    ScaleOut, which added replicas for it (Auto with no queue data adds them too, but does
    not remember it: it would limit the scale-ins for up to a day once the queue is back,
    for one slow request)."""
    memory = seconds(spec.latency.breach_memory)
    target = seconds(spec.latency.target)
    if breaches:
        kept = memory if memory >= UNCURED_KEPT_S else UNCURED_KEPT_S
        breaches = tuple(b for b in breaches
                         if now - b.time < (memory if b.outcome == CURED else kept)
                         and now - b.breached_at < MAX_BREACH_MEMORY_S
                         and b.quantile == spec.latency.quantile and seconds(b.target) == target)
        latency = reading.latency_s
        if (latency is not None and latency <= target and reading.latency_settled
                and reading.latency_floor_s is None and not reading.latency_bounds_unknown):
            queue = reading.queue_per_replica
            breaches = _cured(breaches, reading.request_rate, serving,
                              queue is None or queue > spec.queue.target_per_replica)
    rate, latency = reading.request_rate, reading.latency_s
    if (not reading.latency_breached or rate is None or rate <= 0 or serving <= 0
            or latency is None or (spec.latency.action is not LatencyAction.SCALE_OUT
                                   and _too_few(spec, reading) is not None)):
        return breaches, None
    per_replica = rate / serving
    if not per_replica > 0:
        return breaches, None
    beyond = per_replica * (1 + spec.tolerance)
    # Not against a rate the queue overloaded at (its latency was not measured there), nor
    # one the queue overloaded under: the queue said so already.
    overloaded = min((b.per_replica for b in breaches if b.overloaded is not None),
                     default=math.inf)
    uncured = [b for b in breaches if b.outcome != CURED and b.overloaded is None
               and b.per_replica < overloaded and serving > b.replicas
               and b.per_replica > beyond
               and latency > b.latency * (0.75 + 0.25 * per_replica / b.per_replica)]
    if uncured:
        first = min(uncured, key=_per_replica)
        # Kept while the breach lasts: forgotten an hour into it, the next breach added
        # replicas again, every hour.
        breaches = tuple(b._replace(outcome=NOT_LOAD, time=now) if b in uncured else b
                         for b in breaches)
        return breaches, (
            f"it breached at {latency_text(first.latency)} with "
            f"{_per_replica_text(first.per_replica)} req/s per replica ({first.rate:.1f} req/s "
            f"on {first.replicas}) and is at {latency_text(latency)} with "
            f"{_per_replica_text(per_replica)} req/s per replica now: the replicas added did "
            "not lower it, so none are added for it")
    known_fine = [b for b in breaches if b.outcome == CURED and b.healthy >= per_replica]
    if known_fine:
        # Fine at this load since: a burst of slow requests, most likely, and not a measure
        # of the load (taken as one, each burst lowered the remembered rate per replica, up
        # to maxReplicas). A second episode within breachMemory is (a slower release).
        episode = max(seconds(spec.scale_down.stabilization),
                      (spec.latency.consecutive_samples + 4) * seconds(spec.interval))
        doubts = [b.doubted for b in known_fine if b.doubted is not None
                  and now - b.doubted < memory]
        if not doubts or now - max(doubts) < episode:
            if doubts:
                return breaches, None
            return tuple(b._replace(doubted=now) if b in known_fine else b
                         for b in breaches), None
        breaches = tuple(b._replace(healthy=0.0, doubted=None) if b in known_fine else b
                         for b in breaches)
    healthy = max((b.healthy for b in breaches if b.healthy <= per_replica), default=0.0)
    new = Breach(now, rate, serving, str(spec.latency.target), spec.latency.quantile, OPEN,
                 latency, healthy, now)
    return _added(breaches, new), None


def _added(breaches: tuple[Breach, ...], new: Breach) -> tuple[Breach, ...]:
    """`breaches` with `new`: those at a higher rate per replica than it are forgotten but
    the lowest of the load's, and of more than MAX_BREACHES the lowest and `new` are kept
    (a NotLoad one under `new` keeps its place then, and the one above goes).

    The one kept above it takes over when `new` turns out not to say what a replica carries
    (cured at its own rate: a backlog's latency, a burst of slow requests): forgotten with
    it, the queue at 0 took the replicas to minReplicas under a load that needed 20."""
    backup = min((b for b in breaches if b.per_replica > new.per_replica
                  and b.outcome != NOT_LOAD), key=_per_replica, default=None)
    kept = (*[b for b in breaches if b.per_replica < new.per_replica or b is backup], new)
    return kept if len(kept) <= MAX_BREACHES else (min(kept, key=_per_replica), new)


def _cured(breaches: tuple[Breach, ...], rate: float | None,
           serving: int, queued: bool = False) -> tuple[Breach, ...]:
    """The breaches after a latency at or under the target on the pods that serve now: the
    open ones cured, those not the load's forgotten, and the rate per replica carried now
    kept as `healthy` where it is the most under each breach's. A breach whose rate per
    replica is carried now is forgotten: it no longer says what a replica carries (a burst
    of slow requests, a batch lowered since, a faster release)."""
    per_replica = rate / serving if rate is not None and serving > 0 else 0.0
    out = []
    for b in breaches:
        # A rate the queue overloaded at (Breach.overloaded) is not carried while the queue
        # is still above target (`queued`, or not known), whatever the latency says: a
        # latency under its target forgot it at the next evaluation, and the scale-ins it
        # held went down to minReplicas.
        if b.outcome == NOT_LOAD or (per_replica >= b.per_replica
                                     and not (queued and b.overloaded is not None)):
            continue
        healthy = per_replica if b.healthy < per_replica < b.per_replica else b.healthy
        if b.outcome != CURED or healthy != b.healthy:
            b = Breach(b.time, b.rate, b.replicas, b.target, b.quantile, CURED, b.latency,
                       healthy, b.since, b.doubted, b.overloaded)
        out.append(b)
    return tuple(out)


def _too_few(spec: AutoscalingSpec, reading: Reading) -> str | None:
    """Why the latency quantile is too few requests' to size replicas on without the queue,
    None when it is not: under 1 / (1 - quantile) requests in its window (100 for P99), it is
    the slowest one or two of them, and one slow request reads as a breach."""
    requests, needed = reading.latency_requests, 1 / (1 - spec.latency.quantile) - FLOAT_NOISE
    if requests is None or requests >= needed or reading.latency_kind == "mean":
        return None  # a mean is not its slowest requests
    return (f"the {reading.latency_kind} is of about {requests:.0f} requests (under "
            f"{needed:.0f}), the slowest of them")


def _per_replica(breach: Breach) -> float:
    return breach.per_replica


def _per_replica_text(rate: float) -> str:
    return f"{rate:.1f}" if rate >= 0.1 else f"{rate:.2g}"


def _limiting(spec: AutoscalingSpec, breaches: tuple[Breach, ...],
              now: float) -> tuple[Breach, ...]:
    """The breaches that limit a scale-in now (_breach_floor): the load's, within
    latency.breachMemory."""
    memory = seconds(spec.latency.breach_memory)
    return tuple(b for b in breaches if b.outcome != NOT_LOAD and now - b.time < memory)


def _queue_overload(spec: AutoscalingSpec, breaches: tuple[Breach, ...], reading: Reading,
                    serving: int, now: float,
                    scaled_in: bool = False) -> tuple[tuple[Breach, ...], str | None]:
    """The breaches after the queue stayed above its target (a scale-out) at `serving`
    replicas: where the breach that sizes scale-ins (_breach_floor) lets a replica carry more
    than it carries now, a copy of it takes this rate per replica, which overloaded it, and
    the breach stays beside it (_added: a backlog the replicas drain reads as an overload
    too, and is cured at its own rate). The halfway count a scale-in goes to after a breach
    can be too few; until the latency has breached there for its window (a sample counts
    once its window starts after the change), the queue scales out first, and the floor
    stayed where it was: 14 -> 7 -> 14 at a steady load, every few minutes for hours.

    With no breach remembered, a scale-in that the queue's overload follows (`scaled_in`:
    the last scale event took replicas away) went too far, and that rate is remembered as a
    breach of its own: an engine whose queue is 0 until its batch is full (vLLM) proposed
    minReplicas whenever it was not full, and the queue scaled out again before a latency
    sample there counted, so no breach was ever measured: 30 req/s went 1 -> 5 -> 10 -> 1
    every seven minutes."""
    rate = reading.request_rate
    if rate is None or rate <= 0 or serving <= 0 or seconds(spec.latency.breach_memory) <= 0:
        return breaches, None
    per_replica = rate / serving
    load = _limiting(spec, breaches, now)
    if not load:
        if not scaled_in:
            return breaches, None
        new = Breach(now, rate, serving, str(spec.latency.target), spec.latency.quantile, OPEN,
                     0.0, 0.0, now, None, now)
        return _added(breaches, new), (
            f"the queue is above target at {_per_replica_text(per_replica)} req/s per replica "
            f"({rate:.1f} req/s on {serving}) after a scale-in: remembered as what a replica "
            "does not carry")
    lowest = min(load, key=_per_replica)
    if not lowest.per_replica * (1 - spec.tolerance) > per_replica:
        return breaches, None  # the floor keeps it under this already
    lowered = lowest._replace(time=now, rate=rate, replicas=serving, overloaded=now,
                              healthy=lowest.healthy if lowest.healthy < per_replica else 0.0)
    # The breach stays beside its lowered copy (_added), without a rate the queue has just
    # found overloaded as fine.
    kept = tuple(b._replace(healthy=0.0) if b is lowest and b.healthy >= per_replica else b
                 for b in breaches)
    return _added(kept, lowered), (
        f"the queue is above target at {_per_replica_text(per_replica)} req/s per replica "
        f"({rate:.1f} req/s on {serving}), under the "
        f"{_per_replica_text(lowest.per_replica)} the {reading.latency_kind} breach let a "
        "scale-in leave: remembered as what a replica does not carry")


SCALE_IN_PROBE = 1
"""The replicas a scale-in may always take away (_carried_floor), however close to what
was measured well the rest would run: how a Deployment learns that it has more replicas than
its load needs, one step per stabilization window, a breach stopping it."""


def _known_to_carry(spec: AutoscalingSpec, carried: Carried | None, breach: Breach,
                   reading: Reading, floor: int, held: str) -> tuple[int, str]:
    """The breach's floor (_breach_floor), at most the count that carried this request rate
    well at what a replica was measured to carry (ScalingState.carried), where that is under
    the breach's rate per replica less the tolerance: the two agree, and the count between
    them is known. Left above it, a step of one replica from 10 into a breach at 95 req/s
    held 11 for a day, where 10 had carried it. Not where the breach came at that rate or
    under it (a slower release): the breach is the newer word. `carried` is this reading's
    (_carried), so of the spec's latency target and quantile."""
    rate = reading.request_rate
    if (carried is None or rate is None
            or not carried.per_replica <= breach.per_replica * (1 - spec.tolerance)):
        return floor, held
    known = max(1, _ceil(rate / carried.per_replica))
    if known >= floor:
        return floor, held
    return known, (f"{held}, but it was under its target at "
                   f"{_per_replica_text(carried.per_replica)} req/s per replica, so {known} "
                   "carry it")


def _fine_per_replica(spec: AutoscalingSpec, reading: Reading, serving: int) -> float | None:
    """The requests per second per serving replica when this reading says a replica carries
    them well: the latency at or under its target, settled on the replicas there are now, of
    enough requests, its histogram's bounds known, the queue known and not above its target.
    None otherwise."""
    latency, rate, queue = reading.latency_s, reading.request_rate, reading.queue_per_replica
    if (latency is None or rate is None or queue is None or serving <= 0 or not rate > 0
            or latency > seconds(spec.latency.target) or not reading.latency_settled
            or reading.latency_floor_s is not None or reading.latency_bounds_unknown
            or queue > spec.queue.target_per_replica or _too_few(spec, reading) is not None):
        return None
    return rate / serving


def _carried(spec: AutoscalingSpec, carried: Carried | None, fine: float | None,
             now: float) -> Carried | None:
    """ScalingState.carried after this reading (`fine`: _fine_per_replica): the most
    requests per second per serving replica measured fine, kept for latency.breachMemory
    after the last reading that matched it within the tolerance (a steady load sits just
    under its own peak: renewed only by a higher one, it lapsed before the first scale-in it
    was for), then taken again from the next fine reading (kept until there is one:
    forgotten at a reading that was not, the queue took 20 replicas to 1 under 119 req/s).
    The same object when unchanged. Measured from the first fine reading, breach or none:
    measured only once a breach had been, a new tuning (or minReplicas lowered) let the
    queue, at 0 under vLLM until its batch is full, take 11 replicas serving 100 req/s well
    to 1 in one step, and P99 stayed over 1 s for minutes while they came back. None with
    breachMemory 0s, which turns the scale-in limits off."""
    memory, target = seconds(spec.latency.breach_memory), seconds(spec.latency.target)
    if memory <= 0:
        return None
    if carried is not None and (seconds(carried.target) != target
                                or carried.quantile != spec.latency.quantile):
        carried = None  # what was fine for another target says nothing of this one
    lapsed = carried is not None and now - carried.time >= memory
    if fine is None:
        return carried
    if carried is None or lapsed or fine >= carried.per_replica:
        return Carried(fine, now, str(spec.latency.target), spec.latency.quantile,
                       None if carried is None else carried.failed)
    if fine >= carried.per_replica * (1 - spec.tolerance):
        return carried._replace(time=now)
    return carried


def _carried_floor(spec: AutoscalingSpec, carried: Carried, reading: Reading, current: int,
                   now: float, probe: bool) -> tuple[int, str]:
    """The fewest replicas a scale-in may leave by what a replica was measured to carry well
    (ScalingState.carried), and why: enough that each carries at most the tolerance more than
    that, and never more than SCALE_IN_PROBE fewer than carry it at that rate (the tolerance
    of 102 replicas took 9 away at once, into a breach whose floor then held 114 where 97
    do); with `probe` (this reading is fine on the replicas there are now, and no breach of
    the load for latency.breachMemory: a step into a breach, cured at its own rate, was
    taken again every window), SCALE_IN_PROBE fewer than now at least. Not without it: with
    a stabilization window shorter than the latency's, the step took 10 replicas to 7 in
    30 s, before any reading at 9. The request rate, not the replicas: the load that goes
    away with the traffic lets them go with it at once."""
    rate = reading.request_rate
    assert rate is not None  # a rate not known holds every scale-in before this
    step = SCALE_IN_PROBE if probe else 0
    needed = _ceil(rate / (carried.per_replica * (1 + spec.tolerance)))
    known = _ceil(rate / carried.per_replica)
    floor = max(1, min(current - step, max(needed, known - step)))
    age = format_duration(round(now - carried.time))
    said = (f"the {reading.latency_kind} was under its target at "
            f"{_per_replica_text(carried.per_replica)} req/s per replica {age} ago")
    if floor < min(known, current):
        # A step to try, not what the load needs: "keeps at least 9" of 10 that carry it read
        # as the load needing 9.
        return floor, (f"{said}, at which {known} carry the {_per_replica_text(rate)} req/s "
                       f"now: one replica fewer is tried, {floor}")
    return floor, f"{said}: {_per_replica_text(rate)} req/s now keeps at least {floor}"


def _breach_floor(spec: AutoscalingSpec, breaches: tuple[Breach, ...], reading: Reading,
                  current: int, now: float) -> tuple[int, str, Breach]:
    """The fewest replicas a scale-in may leave after a latency breach (within
    latency.breachMemory), and why: enough that each carries less than the lowest request
    rate per replica that breached, less the tolerance. A healthy latency has no opinion of
    its own, so the queue alone took the replicas a breach had added away again (a queue at
    0 waiting, as vLLM's is while its batch takes every request), and the latency breached
    again: a scale-out and a scale-in every stabilization window, each with a breach. The
    rate, not the replicas: the load that goes away with the traffic lets them go with it."""
    breach = min(breaches, key=_per_replica)
    age = format_duration(round(now - breach.breached_at))  # whole seconds are enough
    said = (f"{reading.latency_kind} breached {age} ago at "
            f"{_per_replica_text(breach.per_replica)} req/s per replica ({breach.rate:.1f} "
            f"req/s on {breach.replicas})")
    if breach.overloaded is not None:
        said = (f"the queue was above target {format_duration(round(now - breach.overloaded))}"
                f" ago at {_per_replica_text(breach.per_replica)} req/s per replica "
                f"({breach.rate:.1f} req/s on {breach.replicas})")
        if breach.latency > 0:  # lowered from a latency breach; 0: the queue's own
            said = f"{reading.latency_kind} breached {age} ago, and {said}"
    rate = reading.request_rate
    # A rate that is not known holds every scale-in before this (_decide_on_signals).
    assert rate is not None
    carried = breach.per_replica * (1 - spec.tolerance)
    # Halfway to the most a replica carried under the target since (bisected by the breaches
    # and the healthy readings that follow): just under the breach, a step in load 15 times
    # what the replicas carried took six breaches to find the count, one replica each.
    good = max((b.healthy for b in breaches if b.healthy < carried), default=0.0)
    if good > 0:
        carried = (good + carried) / 2
        said = (f"{said}, and was under its target at {_per_replica_text(good)} req/s per "
                "replica")
    needed = rate / carried if carried > 0 else math.inf
    floor = current if not needed < current else math.floor(needed + FLOAT_NOISE) + 1
    floor = min(floor, current)
    return floor, f"{said}: {rate:.1f} req/s now keeps at least {floor}", breach


def _track_serving(state: ScalingState, current: int, ready: int, now: float,
                   ready_since: float | None = None) -> ScalingState:
    """The replicas known to serve, with this reading of the Deployment's ready count. Ready
    pods serve; those that served stay counted; a scale-in removes the pods not Ready first.
    The first reading takes every replica to serve, as before it. Short of the replicas and
    unchanged for STARTING_S, every replica counts again.

    Pods that joined changed the pods that serve when the last of them became Ready
    (`ready_since`), when that is known and not before the last change known; else now, when
    this reading first counts them. Counted from the reading, the change came up to an
    interval late while the operator ran; after a restart, pods Ready for minutes were taken
    to have changed at its first evaluation, and a breach on them waited one more latency
    window (75s more at a 1m window, on top of the downtime)."""
    before = state.serving
    if before is None:
        return state._replace(serving=Serving(current, current, now))
    count = min(current, max(before.replicas, ready))
    if count == before.replicas and current == before.of:
        if count < current and now - before.since >= STARTING_S:
            # Counted again, not changed: the pods that serve are the same.
            return state._replace(serving=Serving(current, current, now, before.changed))
        return state
    changed = before.changed
    if count != before.replicas:
        changed = now
        if count > before.replicas and ready_since is not None:
            changed = min(now, ready_since if before.changed is None
                          else max(ready_since, before.changed))
    return state._replace(serving=Serving(count, current, now, changed))


def _serving(current: int, state: ScalingState) -> int:
    """The replicas a latency breach is sized on: those known to serve (ScalingState.serving).
    Sized on every replica, a breach with a low queue (action ScaleOut, or no queue data)
    compounded while the new pods loaded their model: 4, 8, 16, 32 in three intervals for a
    P99 twice the target. Every replica counts until the Deployment's readiness is read."""
    return current if state.serving is None else min(current, state.serving.replicas)


def _latency_proposal(spec: AutoscalingSpec, current: int, reading: Reading,
                      serving: int, batching_stuck: Stuck = None,
                      not_load: str | None = None) -> _Proposal:
    signal = spec.latency
    kind, target = reading.latency_kind, signal.target
    if reading.latency_quiet:
        if reading.request_rate is not None and reading.request_rate >= signal.min_request_rate:
            return _Proposal(None, "latency: no requests (0 req/s), quantile ignored")
        rate_said = ("an unknown rate" if reading.request_rate is None else
                     f"{amount_text(reading.request_rate, signal.min_request_rate, 2)} req/s")
        return _Proposal(None, f"latency: {rate_said} is below "
                         f"minRequestRate {signal.min_request_rate:g}, quantile ignored")
    if reading.latency_s is None:
        return _Proposal(None, f"{kind}: no data")
    if reading.latency_bounds_unknown:
        return _Proposal(None, f"{kind} {latency_text(reading.latency_s)} not compared with "
                         f"target {target}: the bucket bounds of the latency histogram are "
                         "not known (see MetricsAvailable)")
    if reading.latency_floor_s is not None:
        return _Proposal(None, f"{kind} at most {latency_text(reading.latency_floor_s)} (under "
                         "the histogram's lowest bucket): cannot be compared with target "
                         f"{target}")
    rate = reading.request_rate
    said = (f"{kind} {latency_text(reading.latency_s, seconds(target))} vs target {target} at "
            + ("an unknown request rate" if rate is None else f"{_per_replica_text(rate)} req/s"))
    if reading.latency_s <= seconds(target):
        return _Proposal(None, said)
    said = f"{said}, {reading.breaches}/{signal.consecutive_samples} samples above target"
    if rate is None and signal.min_request_rate > 0:
        said += " (a sample counts with minRequestRate behind it, and the rate is unknown)"
    elif not reading.latency_settled and not reading.latency_breached:
        # "0/2 samples above target" under two samples above it: they were measured
        # (their rate window) partly before the replicas last changed.
        said += (" (a sample counts once its window starts after the replicas or their batch "
                 "last changed; "
                 "the newest does not yet)")
    if not reading.latency_breached:
        # An elevated latency vetoes scaling in even before it counts as a breach.
        return _Proposal(current, said)
    if signal.action is LatencyAction.TUNE_BATCHING:
        return _Proposal(current, f"{said}, action TuneBatching: tune batching",
                         tune_batching=True)
    if signal.action is LatencyAction.AUTO and queue_is_low(spec, reading):
        queue_target = spec.queue.target_per_replica
        low = (f"{said}, queue {amount_text(reading.queue_per_replica or 0.0, queue_target)}"
               f"/replica is not above target {queue_target:g}"
               + (f" (nor was it in the last {spec.queue.sustain} on these replicas)"
                  if seconds(spec.queue.sustain) > 0 else "")
               + " so the latency comes from batching")
        if callable(batching_stuck):
            batching_stuck = batching_stuck(reading)
        if batching_stuck is None:
            return _Proposal(current, f"{low}: tune batching", tune_batching=True)
        # Handed to a batching that does not lower the batch (Off, the default, or already
        # at its minimum), the breach was acted on by nothing for as long as it lasted:
        # replicas are the lever left, while they lower it.
        said = f"{low}, but {batching_stuck}"
        if not_load is not None:
            return _Proposal(current, f"{said}; {not_load}")
        if (few := _too_few(spec, reading)) is not None:
            return _Proposal(current, f"{said}; {few}, so no replicas are added for it")
        if reading.request_rate is None:
            # Counted without the rate only with minRequestRate 0 (_consecutive_breaches):
            # without it, neither a breach the replicas added did not lower nor one of a
            # handful of requests can be told, and each scaled out again up to maxReplicas.
            return _Proposal(current, f"{said}; the request rate is unknown, so whether it "
                             "is the load's cannot be told: no replicas are added for it")
        said = f"{said}: scale out"
    elif signal.action is LatencyAction.AUTO and (reading.queue_above_ago_s is not None
                                                  or reading.queue_steps is not None):
        # At or under target now, but not known low all through the window (queue_is_low):
        # above it earlier, the breach is the load's; with steps missing, it is not known,
        # and the SLO is the safe side, as with no queue data.
        queue_target = spec.queue.target_per_replica
        said = (f"{said}, queue "
                f"{amount_text(reading.queue_per_replica or 0.0, queue_target)}/replica is "
                f"not above target {queue_target:g} now but ")
        if reading.queue_above_ago_s is not None:
            said += (f"was {format_duration(round(reading.queue_above_ago_s))} ago, so the "
                     "latency is the load's")
        else:
            said += (f"has data for only {reading.queue_steps} steps of its "
                     f"{spec.queue.sustain} window, so it is not known to be low")
            if not_load is not None:
                # As with no queue data: a breach the replicas added did not lower is known
                # not to be the load's (a batch too large stalls the engine's /metrics too,
                # and its scrapes keep failing); without this it went to maxReplicas.
                return _Proposal(current, f"{said}; {not_load}")
    elif (signal.action is LatencyAction.AUTO and reading.queue_per_replica is None
          and not_load is not None):
        # No queue data is not low, so Auto scales out (the SLO is the safe side), but a
        # breach the replicas added did not lower is known not to be the load's (without
        # this check a P99 no replica count lowers took it to maxReplicas). The guards that
        # only doubt a breach (too few requests, the rate unknown) would hold a real
        # overload with nothing else to tell it: not here.
        return _Proposal(current, f"{said}, with no queue data; {not_load}")
    proposed = max(serving + 1, _ceil(serving * reading.latency_s / seconds(target)))
    if serving == current:
        return _Proposal(proposed, f"{said} -> {proposed}")
    said = (f"{said}, sized on the {serving} replicas serving ({current - serving} not Ready "
            f"since they were added) -> {proposed}")
    if proposed <= current:
        return _Proposal(current, f"{said}: the {current} replicas cover it once they are "
                         "Ready")
    return _Proposal(proposed, said)


UNBOUNDED = 2**31 - 1
"""The replicas proposed for a ratio past float's range (a queue over a targetPerReplica of
1e-320): more than any maxReplicas, which caps it. math.ceil of infinity raised, and every
evaluation of the tuning failed for good."""


def _ceil(replicas: float) -> int:
    """Rounded up, less float noise: 3 x 100ms / 75ms is 4.000000000000001 in floats, and a
    latency on a histogram bucket bound (0.1, 0.25) is common."""
    if not math.isfinite(replicas):
        return UNBOUNDED if replicas > 0 else 0
    return math.ceil(replicas - FLOAT_NOISE)


def _count(replicas: int) -> str:
    """"1 replica", "3 replicas"."""
    return f"{replicas} replica" + ("" if replicas == 1 else "s")


def _metrics_unavailable(spec: AutoscalingSpec, current: int, reading: Reading,
                         state: ScalingState, now: float) -> ScaleDecision:
    since = state.metrics_missing_since if state.metrics_missing_since is not None else now
    missing_for = now - since
    rule = spec.metrics_unavailable
    said = ("no usable metrics" if missing_for < 1 else
            f"no usable metrics for {format_duration(missing_for)}")
    fallback = rule.fallback_replicas
    if rule.action is MetricsUnavailableAction.FALLBACK and fallback is not None and (
        missing_for >= seconds(rule.after)
    ):
        wanted = max(current, fallback)  # Fallback raises replicas, never lowers them
        # At the scale-up rate limits, as KEDA's fallback goes through the HPA's behavior.
        desired, why, limited = limit_rate(current, wanted, state.scale_events, spec.scale_up,
                                           spec.scale_down, spec.min_replicas,
                                           spec.max_replicas, now)
        reason = (f"{said} (>= {rule.after}): fallback to {fallback} replicas, keeping "
                  f"{desired}" + (f"; {why}" if why else ""))
        # The count it raises to is recorded, as HPA records the recommendation KEDA's
        # fallback makes: data that comes back does not take it away before the scale-down
        # stabilization window has passed.
        decision = _applied(spec, current, desired, reason, reading, state, now, record=wanted,
                            limited=limited, outage=Outage.FALLBACK)
        if desired == current:
            return decision
        return decision._replace(action=ScaleAction.FALLBACK)
    wait = (f", fallback to {fallback} after {rule.after}"
            if rule.action is MetricsUnavailableAction.FALLBACK else "")
    return _held(current, ScaleAction.HOLD, f"{said}: holding {_count(current)}{wait}",
                 reading, state, Outage.HOLD)


def _track_missing(state: ScalingState, reading: Reading, now: float,
                   current: int) -> ScalingState:
    """The state with since when no signal has had data. A Deployment at 0 has no pods, so no
    metrics is no outage there (autoscaling disabled or not): counted, an hour at 0 read as
    an hour without metrics, and the Fallback raised the Deployment to fallbackReplicas the
    moment it was scaled up."""
    if current > 0 and reading.queue_missing and reading.latency_missing:
        if state.metrics_missing_since is None:
            return state._replace(metrics_missing_since=now)
        return state
    if state.metrics_missing_since is not None:
        return state._replace(metrics_missing_since=None)
    return state


def _scale_in_kept_s(spec: AutoscalingSpec) -> float:
    """How long after a scale-in the queue's overload is taken to follow from it
    (_queue_overload): its sustain window from when the pods that serve changed, and a few
    intervals."""
    return seconds(spec.queue.sustain) + 4 * spec.interval.seconds


def _applied(spec: AutoscalingSpec, current: int, desired: int, reason: str, reading: Reading,
             state: ScalingState, now: float, record: int,
             tune_batching: bool = False, limited: Limit | None = None,
             outage: Outage | None = None) -> ScaleDecision:
    keep_recs = max(seconds(spec.scale_up.stabilization), seconds(spec.scale_down.stabilization))
    keep_events = max(seconds(spec.scale_up.period), seconds(spec.scale_down.period))
    # The last scale-in, while the queue's overload after it is told from it
    # (_queue_overload): its sustain window from when the pods that serve changed, and a few
    # intervals.
    held = state.recorded(now, Recommendation(now, record), keep_recs, keep_events,
                          _scale_in_kept_s(spec))
    applied = held
    if desired != current:
        applied = held._replace(
            scale_events=(*held.scale_events, ScaleEvent(now, desired - current)))
        serving = held.serving
        if serving is not None and serving.replicas > desired:
            # The scale-in removes the pods not Ready first: no more serve than remain, even
            # if someone scales out again before the next reading.
            applied = applied._replace(serving=Serving(desired, desired, now, now))
    if desired > current:
        action = ScaleAction.SCALE_OUT
    elif desired < current:
        action = ScaleAction.SCALE_IN
    else:
        action = ScaleAction.TUNE_BATCHING if tune_batching else ScaleAction.HOLD
    return ScaleDecision(current, desired, action, f"{reason}; {current} -> {desired}",
                         reading, applied, held, min(record, spec.max_replicas), limited,
                         outage)


def with_reason(decision: ScaleDecision, reason: str) -> ScaleDecision:
    """`decision` with another reason (NamedTuple._replace costs several times more)."""
    return ScaleDecision(decision.current_replicas, decision.desired_replicas, decision.action,
                         reason, decision.signals, decision.state, decision.held_state,
                         decision.wanted, decision.limited, decision.outage)


def _held(current: int, action: ScaleAction, reason: str, reading: Reading,
          state: ScalingState, outage: Outage | None = None) -> ScaleDecision:
    return ScaleDecision(current, current, action, reason, reading, state, state, None, None,
                         outage)
