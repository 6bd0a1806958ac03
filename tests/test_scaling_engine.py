"""The autoscaler's decision engine and batching recommender, as a specification.

Signals are built as the Prometheus adapter returns them: the queue as a window over its
sustain window at a 1s step (summed up from per-second values the way the adapter's PromQL
does, `Window.of_points`), latency and request rate one point per evaluation interval.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from infertune.api.scaling import AutoscalingSpec, BatchingSpec
from infertune.api.spec import Engine
from infertune.scaling.batching import recommend_batching
from infertune.scaling.behavior import Limit
from infertune.scaling.engine import Outage, ScaleAction, ScaleDecision, decide_scale, with_reason
from infertune.scaling.reading import read_signals
from infertune.scaling.signals import Series, TargetSignals, Window
from infertune.scaling.state import (
    Breach,
    Carried,
    Recommendation,
    ScaleEvent,
    ScalingState,
    Serving,
)

NOW = 1_700_000_000.0


def spec(**fields: Any) -> AutoscalingSpec:
    base: dict[str, Any] = {"minReplicas": 1, "maxReplicas": 20}
    return AutoscalingSpec.model_validate(base | fields)


def queue(*values: float, now: float = NOW, target: float = 32.0) -> Window:
    """Queue per replica, one value per second ending at `now` (oldest first), as the 30s
    window of the default sustain against `target`."""
    points = [(now - (len(values) - 1 - i), v) for i, v in enumerate(values)]
    return Window.of_points(points, now, 30.0, 1.0, threshold=target)


def steady(value: float, seconds: int = 30, now: float = NOW) -> Window:
    return queue(*([value] * (seconds + 1)), now=now)


def gappy(value: float, missing: int, now: float = NOW) -> Window:
    """The 30s window at `value` with `missing` steps in its middle without data."""
    points = [(now - 30 + i, value) for i in range(31) if not 10 <= i < 10 + missing]
    return Window.of_points(points, now, 30.0, 1.0, threshold=32.0)


def per_interval(*values: float, now: float = NOW, step: float = 15.0) -> Series:
    return Series(tuple((now - (len(values) - 1 - i) * step, v) for i, v in enumerate(values)),
                  step)


def signals(q: Window, latency_ms: tuple[float, ...] = (50, 50), rate: float = 10.0,
            now: float = NOW) -> TargetSignals:
    lat = per_interval(*(ms / 1000 for ms in latency_ms), now=now)
    return TargetSignals(q, lat, per_interval(*([rate] * len(latency_ms)), now=now))


MISSING = Series.missing("no series for Deployment ns/llm", "sum by (...) (...)")
NO_QUEUE = Window.missing("no series for Deployment ns/llm", "avg by (...) (...)")
NO_SIGNALS = TargetSignals(NO_QUEUE, MISSING, MISSING)


def decide(sig: TargetSignals, current: int = 4, state: ScalingState | None = None,
           now: float = NOW, ready: int | None = None, **fields: Any) -> ScaleDecision:
    return decide_scale(spec(**fields), current, sig, state or ScalingState(), now, ready)


CARRIES_40 = ScalingState(carried=Carried(40.0, NOW - 60, "75ms", 0.99))
"""A replica measured to carry 40 req/s well a minute ago: the 10 req/s of `signals` need one
(the scale-in limit of what a replica carries leaves the queue's sizing alone)."""


@dataclass
class Case:
    name: str
    signals: TargetSignals
    desired: int
    action: ScaleAction
    current: int = 4
    spec: dict[str, Any] = field(default_factory=dict)
    state: ScalingState = field(default_factory=ScalingState)
    reason_has: tuple[str, ...] = ()
    reason_lacks: tuple[str, ...] = ()
    limited: Limit | None = None
    """What the ScalingLimited condition will say kept the replicas from the signals' count."""


CASES = [
    Case("queue_above_target_for_the_sustain_window_scales_out_proportionally",
         signals(steady(48)), 6, ScaleAction.SCALE_OUT,
         reason_has=("queue 48.0/replica vs target 32", "above target for 30s", "4 -> 6")),
    Case("queue_above_target_for_less_than_sustain_holds",
         signals(queue(*([10] * 20 + [48] * 11))), 4, ScaleAction.HOLD,
         reason_has=("above target for 10s of 30s",)),
    Case("queue_with_a_dip_inside_the_window_holds",
         signals(queue(*([48] * 15 + [20] + [48] * 15))), 4, ScaleAction.HOLD),
    Case("queue_history_shorter_than_sustain_holds",
         signals(steady(48, seconds=10)), 4, ScaleAction.HOLD),
    Case("queue_within_tolerance_holds", signals(steady(34)), 4, ScaleAction.HOLD,
         reason_has=("within tolerance 0.1",)),
    Case("low_queue_scales_in_when_no_stabilization",
         signals(steady(8)), 1, ScaleAction.SCALE_IN,
         spec={"scaleDown": {"pods": 0, "percent": 100, "period": "15s",
                             "stabilization": "0s"}},
         state=CARRIES_40),
    Case("scale_up_is_limited_to_the_larger_of_pods_and_percent",
         signals(steady(320)), 8, ScaleAction.SCALE_OUT,
         reason_has=("scale-up limited to 8 by max(+4 pods, +100%) per 15s",),
         limited=Limit.SCALE_UP),
    Case("scale_up_counts_changes_already_made_in_the_period",
         signals(steady(320)), 8, ScaleAction.SCALE_OUT, current=6,
         spec={"scaleUp": {"pods": 4, "percent": 0, "period": "60s", "stabilization": "0s"}},
         state=ScalingState(scale_events=(ScaleEvent(NOW - 30, 2),)),
         reason_has=("scale-up limited to 8 by +4 pods per 60s (from 4 at the start of the "
                     "period, now 6)",),
         limited=Limit.SCALE_UP),
    Case("scale_up_blocked_until_the_period_passes",
         signals(steady(320)), 4, ScaleAction.HOLD,
         spec={"scaleUp": {"pods": 2, "percent": 0, "period": "60s", "stabilization": "0s"}},
         state=ScalingState(scale_events=(ScaleEvent(NOW - 30, 2),)), current=4,
         limited=Limit.SCALE_UP),
    Case("scale_down_limited_by_pods_per_period",
         signals(steady(0)), 3, ScaleAction.SCALE_IN, current=4,
         spec={"scaleDown": {"pods": 1, "percent": 0, "period": "15s", "stabilization": "0s"}},
         reason_has=("scale-down limited to 3 by -1 pods per 15s",),
         limited=Limit.SCALE_DOWN,
         state=CARRIES_40),
    Case("max_replicas_caps_the_proposal",
         signals(steady(320)), 5, ScaleAction.SCALE_OUT, spec={"maxReplicas": 5},
         reason_has=("capped at maxReplicas 5",),
         limited=Limit.TOO_MANY),
    Case("min_replicas_floors_the_proposal",
         signals(steady(0)), 2, ScaleAction.SCALE_IN,
         spec={"minReplicas": 2, "scaleDown": {"pods": 0, "percent": 100, "period": "15s",
                                               "stabilization": "0s"}},
         limited=Limit.TOO_FEW,
         state=CARRIES_40),
    Case("replicas_below_min_are_raised_to_min_first",
         signals(steady(0)), 3, ScaleAction.SCALE_OUT, current=1, spec={"minReplicas": 3}),
    Case("replicas_above_max_are_lowered_to_max_first",
         signals(steady(100)), 20, ScaleAction.SCALE_IN, current=25),
    Case("zero_replicas_are_left_alone", signals(steady(100)), 0, ScaleAction.HOLD, current=0),
    Case("disabled_holds", signals(steady(100)), 4, ScaleAction.DISABLED,
         spec={"enabled": False}),
    Case("latency_breach_for_consecutive_samples_scales_out",
         signals(steady(40), latency_ms=(150, 150)), 8, ScaleAction.SCALE_OUT,
         reason_has=("p99 150ms vs target 75ms", "2/2 samples above target", "4 -> 8")),
    Case("one_latency_sample_above_target_is_not_a_breach",
         signals(steady(20), latency_ms=(50, 150)), 4, ScaleAction.HOLD,
         reason_has=("1/2 samples above target",)),
    Case("latency_with_low_queue_tunes_batching_in_auto",
         signals(steady(5), latency_ms=(150, 150)), 4, ScaleAction.TUNE_BATCHING,
         reason_has=("queue 5.0/replica is not above target 32", "latency comes from batching")),
    Case("latency_with_the_queue_low_now_but_not_all_through_the_window_scales_out_in_auto",
         # Low by its newest second alone, a queue at twice its target had the batch halved
         # (every pod re-created), and the next interval scaled out on the load's latency.
         signals(queue(*([64] * 20 + [20] * 11)), latency_ms=(150, 150)), 8,
         ScaleAction.SCALE_OUT,
         reason_has=("queue 20.0/replica is not above target 32 now but was 11s ago, so the "
                     "latency is the load's", "4 -> 8"),
         reason_lacks=("batching",)),
    Case("latency_with_the_queue_low_all_through_the_window_says_so",
         signals(queue(*([33] + [20] * 31)), latency_ms=(150, 150)), 4,
         ScaleAction.TUNE_BATCHING,
         # The step above target 31s ago is outside the window.
         reason_has=("queue 20.0/replica is not above target 32 (nor was it in the last 30s "
                     "on these replicas) so the latency comes from batching",)),
    Case("latency_with_the_queue_low_but_steps_of_its_window_missing_scales_out_in_auto",
         # Scrapes that time out under load leave the steps above target out: not known low.
         signals(gappy(5.0, missing=5), latency_ms=(150, 150)), 8, ScaleAction.SCALE_OUT,
         reason_has=("queue 5.0/replica is not above target 32 now but has data for only 26 "
                     "steps of its 30s window, so it is not known to be low", "4 -> 8"),
         reason_lacks=("batching",)),
    Case("latency_with_the_queue_low_and_one_step_missing_tunes_batching_in_auto",
         # One step missing is a skipped scrape, as the sustain rule takes it.
         signals(gappy(5.0, missing=1), latency_ms=(150, 150)), 4, ScaleAction.TUNE_BATCHING),
    Case("latency_with_the_queue_just_above_target_scales_out_in_auto",
         # Inside the queue's tolerance band, so the queue proposes no change; but the queue is
         # above target, so the latency comes from load: Auto scales out (the batching
         # recommender would not lower the batch either, so holding would leave the breach).
         signals(steady(34), latency_ms=(150, 150)), 8, ScaleAction.SCALE_OUT,
         reason_has=("within tolerance 0.1", "2/2 samples above target", "4 -> 8"),
         reason_lacks=("batching",)),
    Case("latency_tune_batching_says_the_spec_asked_for_it",
         signals(steady(34), latency_ms=(150, 150)), 4, ScaleAction.TUNE_BATCHING,
         spec={"latency": {"action": "TuneBatching"}},
         reason_has=("action TuneBatching: tune batching",), reason_lacks=("queue is low",)),
    Case("latency_on_a_bucket_bound_sizes_exactly",
         # 3 x 100ms / 75ms is 4 (4.000000000000001 in floats), not 5.
         signals(steady(40), latency_ms=(100, 100)), 4, ScaleAction.SCALE_OUT, current=3,
         spec={"latency": {"action": "ScaleOut"}}),
    Case("replicas_below_min_are_raised_to_min_without_metrics",
         NO_SIGNALS, 3, ScaleAction.SCALE_OUT, current=1, spec={"minReplicas": 3},
         reason_has=("1 replica is outside minReplicas..maxReplicas (3..20)",)),
    Case("replicas_above_max_are_lowered_to_max_without_metrics",
         NO_SIGNALS, 20, ScaleAction.SCALE_IN, current=25,
         spec={"metricsUnavailable": {"action": "Fallback", "fallbackReplicas": 6}},
         state=ScalingState(metrics_missing_since=NOW - 600)),
    Case("latency_with_low_queue_scales_out_when_asked_to",
         signals(steady(5), latency_ms=(150, 150)), 8, ScaleAction.SCALE_OUT,
         spec={"latency": {"action": "ScaleOut"}}),
    Case("latency_tune_batching_never_scales_out",
         signals(steady(32), latency_ms=(150, 150)), 4, ScaleAction.TUNE_BATCHING,
         spec={"latency": {"action": "TuneBatching"}}),
    Case("latency_below_min_request_rate_is_noise",
         signals(steady(32), latency_ms=(900, 900), rate=0.2), 4, ScaleAction.HOLD,
         reason_has=("below minRequestRate 1",)),
    Case("elevated_latency_vetoes_scale_in",
         signals(steady(0), latency_ms=(50, 150)), 4, ScaleAction.HOLD,
         spec={"scaleDown": {"pods": 0, "percent": 100, "period": "15s",
                             "stabilization": "0s"}}),
    Case("highest_proposal_of_the_signals_wins",
         signals(steady(96), latency_ms=(100, 100)), 12, ScaleAction.SCALE_OUT,
         spec={"scaleUp": {"pods": 100, "percent": 0, "period": "15s", "stabilization": "0s"}}),
    Case("missing_metrics_hold", NO_SIGNALS, 4, ScaleAction.HOLD,
         reason_has=("no usable metrics", "holding 4 replicas")),
    Case("missing_queue_never_scales_in",
         TargetSignals(NO_QUEUE, per_interval(0.01, 0.01), per_interval(10, 10)), 4,
         ScaleAction.HOLD, spec={"scaleDown": {"pods": 0, "percent": 100, "period": "15s",
                                               "stabilization": "0s"}}),
    Case("missing_queue_still_scales_out_on_latency",
         TargetSignals(NO_QUEUE, per_interval(0.3, 0.3), per_interval(10, 10)), 8,
         ScaleAction.SCALE_OUT,
         limited=Limit.SCALE_UP),
    Case("stale_queue_is_missing_not_zero",
         signals(steady(0, now=NOW - 120)), 4, ScaleAction.HOLD,
         spec={"scaleDown": {"pods": 0, "percent": 100, "period": "15s",
                             "stabilization": "0s"}}),
    Case("fallback_waits_for_after",
         NO_SIGNALS, 4, ScaleAction.HOLD,
         spec={"metricsUnavailable": {"action": "Fallback", "fallbackReplicas": 6}},
         state=ScalingState(metrics_missing_since=NOW - 60),
         reason_has=("fallback to 6 after 2m",)),
    Case("fallback_raises_replicas_after_after",
         NO_SIGNALS, 6, ScaleAction.FALLBACK,
         spec={"metricsUnavailable": {"action": "Fallback", "fallbackReplicas": 6}},
         state=ScalingState(metrics_missing_since=NOW - 120)),
    Case("fallback_goes_at_the_scale_up_rate_limit",  # as KEDA's, through HPA's behavior
         NO_SIGNALS, 2, ScaleAction.FALLBACK, current=1,
         spec={"metricsUnavailable": {"action": "Fallback", "fallbackReplicas": 10},
               "scaleUp": {"pods": 1, "percent": 0, "period": "60s", "stabilization": "0s"}},
         state=ScalingState(metrics_missing_since=NOW - 120),
         reason_has=("fallback to 10 replicas, keeping 2", "scale-up limited to 2 by +1 pods "
                     "per 60s"),
         limited=Limit.SCALE_UP),
    Case("fallback_never_lowers_replicas",
         NO_SIGNALS, 9, ScaleAction.HOLD, current=9,
         spec={"metricsUnavailable": {"action": "Fallback", "fallbackReplicas": 6}},
         state=ScalingState(metrics_missing_since=NOW - 600)),
    # selectPolicy, as HPA's behavior: Min takes the limit that allows the smaller change,
    # Disabled stops scaling in that direction but not the bounds.
    Case("select_policy_min_scales_up_by_the_smaller_limit",
         signals(steady(320)), 14, ScaleAction.SCALE_OUT, current=10,
         spec={"scaleUp": {"pods": 4, "percent": 100, "period": "15s", "stabilization": "0s",
                           "selectPolicy": "Min"}},
         reason_has=("scale-up limited to 14 by min(+4 pods, +100%) per 15s",),
         limited=Limit.SCALE_UP),
    Case("select_policy_max_scales_up_by_the_larger_limit",
         signals(steady(320)), 20, ScaleAction.SCALE_OUT, current=10,
         spec={"scaleUp": {"pods": 4, "percent": 100, "period": "15s", "stabilization": "0s",
                           "selectPolicy": "Max"}},
         reason_has=("capped at maxReplicas 20",),
         limited=Limit.TOO_MANY),
    Case("select_policy_min_scales_down_by_the_smaller_change",
         signals(steady(0)), 8, ScaleAction.SCALE_IN, current=10,
         spec={"scaleDown": {"pods": 2, "percent": 50, "period": "15s", "stabilization": "0s",
                             "selectPolicy": "Min"}},
         reason_has=("scale-down limited to 8 by min(-2 pods, -50%) per 15s",),
         limited=Limit.SCALE_DOWN,
         state=CARRIES_40),
    Case("select_policy_max_scales_down_by_the_larger_change",
         signals(steady(0)), 5, ScaleAction.SCALE_IN, current=10,
         spec={"scaleDown": {"pods": 2, "percent": 50, "period": "15s", "stabilization": "0s"}},
         reason_has=("scale-down limited to 5 by max(-2 pods, -50%) per 15s",),
         limited=Limit.SCALE_DOWN,
         state=CARRIES_40),
    Case("scale_down_disabled_keeps_the_replicas",
         signals(steady(0)), 10, ScaleAction.HOLD, current=10,
         spec={"minReplicas": 2, "scaleDown": {"pods": 0, "percent": 0, "period": "15s",
                                               "stabilization": "0s",
                                               "selectPolicy": "Disabled"}},
         reason_has=("scale-down to 2 disabled by scaleDown.selectPolicy Disabled",
                     "10 -> 10"),
         limited=Limit.SCALE_DOWN,
         state=CARRIES_40),
    Case("scale_down_disabled_still_scales_up",
         signals(steady(48)), 6, ScaleAction.SCALE_OUT,
         spec={"scaleDown": {"pods": 1, "percent": 0, "period": "15s", "stabilization": "0s",
                             "selectPolicy": "Disabled"}}),
    Case("scale_up_disabled_holds_a_latency_breach",
         signals(steady(40), latency_ms=(150, 150)), 4, ScaleAction.HOLD,
         spec={"scaleUp": {"pods": 4, "percent": 100, "period": "15s", "stabilization": "0s",
                           "selectPolicy": "Disabled"}},
         reason_has=("2/2 samples above target -> 8",
                     "scale-up to 8 disabled by scaleUp.selectPolicy Disabled"),
         limited=Limit.SCALE_UP),
    Case("scale_up_disabled_holds_the_fallback",
         NO_SIGNALS, 4, ScaleAction.HOLD,
         spec={"metricsUnavailable": {"action": "Fallback", "fallbackReplicas": 6},
               "scaleUp": {"pods": 4, "percent": 100, "period": "15s", "stabilization": "0s",
                           "selectPolicy": "Disabled"}},
         state=ScalingState(metrics_missing_since=NOW - 120),
         reason_has=("fallback to 6 replicas, keeping 4",
                     "scale-up to 6 disabled by scaleUp.selectPolicy Disabled"),
         limited=Limit.SCALE_UP),
    Case("scale_down_disabled_still_brings_replicas_within_max",  # as HPA
         signals(steady(100)), 20, ScaleAction.SCALE_IN, current=25,
         spec={"scaleDown": {"pods": 1, "percent": 0, "period": "15s", "stabilization": "0s",
                             "selectPolicy": "Disabled"}}),
    Case("scale_up_disabled_still_brings_replicas_within_min",  # as HPA
         signals(steady(0)), 3, ScaleAction.SCALE_OUT, current=1,
         spec={"minReplicas": 3, "scaleUp": {"pods": 4, "percent": 100, "period": "15s",
                                             "stabilization": "0s",
                                             "selectPolicy": "Disabled"}}),
    Case("a_scale_up_pods_limit_given_alone_keeps_the_percent_default",
         signals(steady(320)), 8, ScaleAction.SCALE_OUT,
         spec={"scaleUp": {"pods": 2}},
         reason_has=("scale-up limited to 8 by max(+2 pods, +100%) per 15s",),
         limited=Limit.SCALE_UP),
    Case("a_scale_up_pods_limit_alone_with_percent_0",
         signals(steady(320)), 6, ScaleAction.SCALE_OUT,
         spec={"scaleUp": {"pods": 2, "percent": 0}},
         reason_has=("scale-up limited to 6 by +2 pods per 15s",),
         limited=Limit.SCALE_UP),
    Case("scale_down_waits_for_the_stabilization_window",
         signals(steady(8)), 4, ScaleAction.HOLD,
         state=ScalingState(recommendations=(Recommendation(NOW - 200, 4),)),
         reason_has=("scale-down stabilized at 4",)),
    Case("scale_down_uses_the_highest_recommendation_in_the_window",
         signals(steady(8)), 3, ScaleAction.SCALE_IN,
         state=ScalingState(recommendations=(Recommendation(NOW - 400, 4),
                                             Recommendation(NOW - 200, 3)))),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decision(case: Case) -> None:
    decision = decide_scale(spec(**case.spec), case.current, case.signals, case.state, NOW)
    assert (decision.desired_replicas, decision.action) == (case.desired, case.action), \
        decision.reason
    assert decision.limited == case.limited, decision.reason
    for text in case.reason_has:
        assert text in decision.reason
    for text in case.reason_lacks:
        assert text not in decision.reason


def test_every_decision_has_a_reason_with_numbers() -> None:
    for case in CASES:
        decision = decide_scale(spec(**case.spec), case.current, case.signals, case.state, NOW)
        assert any(ch.isdigit() for ch in decision.reason), (case.name, decision.reason)


def test_missing_data_names_the_query_for_the_condition() -> None:
    decision = decide(NO_SIGNALS)
    assert decision.signals.problems == (
        "queue: no series for Deployment ns/llm (query: avg by (...) (...))",
        "latency: no series for Deployment ns/llm (query: sum by (...) (...))",
        "requestRate: no series for Deployment ns/llm (query: sum by (...) (...))")


def test_missing_since_is_remembered_and_cleared() -> None:
    first = decide(NO_SIGNALS)
    assert first.state.metrics_missing_since == NOW
    later = decide(NO_SIGNALS, state=first.state, now=NOW + 30)
    assert later.state.metrics_missing_since == NOW
    back = decide(signals(steady(32), now=NOW + 45), state=later.state, now=NOW + 45)
    assert back.state.metrics_missing_since is None


def test_an_outage_holds_the_replicas_for_as_long_as_it_lasts() -> None:
    """metricsUnavailable.action Hold (the default): no data, not even after the scale-down
    window, the fallback's `after` or a breach's memory, moves the replicas, down or up. The
    tests held only the first evaluations of an outage (a drop to minReplicas after 10 s
    without data passed them all)."""
    state, current, now = CARRIES_40, 4, NOW
    for _ in range(4):  # load, a scale-out and recommendations in the window before
        decision = decide(signals(steady(48), now=now), current=current, state=state, now=now)
        state, current, now = decision.state, decision.desired_replicas, now + 15
    assert current > 4
    held_at = current
    for step in range(2 * 3600 // 15):  # two hours without a signal
        decision = decide(NO_SIGNALS, current=current, state=state, now=now)
        assert (decision.action, decision.desired_replicas) == (ScaleAction.HOLD, held_at), (
            step, decision.reason)
        state, now = decision.state, now + 15


def test_time_at_zero_replicas_is_no_metrics_outage() -> None:
    """A Deployment scaled to 0 (paused) has no pods, so no metrics: counted as an outage, an
    hour at 0 and a resume with the new pod still loading its model scaled 1 -> 5 -> 8 at
    once, "no usable metrics for 1h (>= 2m): fallback to 8 replicas"."""
    rules = {"metricsUnavailable": {"action": "Fallback", "fallbackReplicas": 8,
                                    "after": "2m"}}
    state, t = ScalingState(), NOW
    for _ in range(240):  # an hour at 0
        paused = decide(NO_SIGNALS, current=0, state=state, now=t, **rules)
        assert paused.desired_replicas == 0
        state, t = paused.state, t + 15
    assert state.metrics_missing_since is None
    resumed = decide(NO_SIGNALS, current=1, state=state, now=t, **rules)
    assert (resumed.action, resumed.desired_replicas, resumed.outage) == (
        ScaleAction.HOLD, 1, Outage.HOLD), resumed.reason
    assert resumed.state.metrics_missing_since == t  # the outage starts with the pods
    # Missing since before the pause: the pause does not carry it over either.
    outage = decide(NO_SIGNALS, current=4, now=NOW - 600, **rules)
    assert outage.state.metrics_missing_since == NOW - 600
    zero = decide(NO_SIGNALS, current=0, state=outage.state, now=NOW, **rules)
    assert zero.state.metrics_missing_since is None
    # Paused with autoscaling disabled, then enabled and resumed: the same.
    off = decide(NO_SIGNALS, current=0, state=outage.state, now=NOW, enabled=False, **rules)
    assert off.state.metrics_missing_since is None
    on = decide(NO_SIGNALS, current=1, state=off.state, now=NOW + 3600, **rules)
    assert (on.action, on.desired_replicas) == (ScaleAction.HOLD, 1), on.reason


def test_with_min_request_rate_zero_a_missing_request_rate_does_not_void_the_latency() -> None:
    """The request-rate query failed alone (a timeout, a broken template): every latency
    sample was not counted, "0/2 samples above target (a sample counts with minRequestRate
    behind it, and the rate is unknown)", even with minRequestRate 0, which asks for no
    rate behind a sample; a P99 3 times its target held 4 replicas for as long."""
    slow = (150, 150)
    without_rate = TargetSignals(steady(0), per_interval(*(ms / 1000 for ms in slow)),
                                 MISSING)
    counted = decide(without_rate, latency={"minRequestRate": 0, "action": "ScaleOut"})
    assert (counted.signals.breaches, counted.action, counted.desired_replicas) == (
        2, ScaleAction.SCALE_OUT, 8), counted.reason
    assert "minRequestRate behind it" not in counted.reason
    assert "at an unknown request rate" in counted.reason
    # Action Auto with a low queue (a breach of batching's, batching Off): neither a breach
    # the replicas added did not lower nor one of a handful of requests can be told without
    # the rate, so it adds none (each would have scaled out again, up to maxReplicas).
    auto = decide_scale(spec(latency={"minRequestRate": 0}), 4, without_rate, ScalingState(),
                        NOW, batching_stuck="spec.batching.mode is Off, so nothing lowers the "
                        "batch")
    assert (auto.signals.breaches, auto.desired_replicas) == (2, 4), auto.reason
    assert "the request rate is unknown, so whether it is the load's cannot be told: no " \
           "replicas are added for it" in auto.reason
    # With no queue data as well, nothing says it is not the load's (the queue low did):
    # Auto scales out, as on a breach with no queue data at a known rate.
    blind = decide(TargetSignals(NO_QUEUE, without_rate.latency, MISSING),
                   latency={"minRequestRate": 0, "action": "Auto"})
    assert (blind.signals.breaches, blind.desired_replicas) == (2, 8), blind.reason
    assert "cannot be told" not in blind.reason
    # With a minimum, a sample needs the rate to be known to count, as before.
    held = decide(without_rate, latency={"action": "ScaleOut"})
    assert (held.signals.breaches, held.desired_replicas) == (0, 4), held.reason
    assert "(a sample counts with minRequestRate behind it, and the rate is unknown)" in \
        held.reason


def test_too_many_replicas_holds_at_the_bound_while_the_window_calls_for_more() -> None:
    """Saturated at maxReplicas, the queue per replica noisy around 1.1 times the target:
    each reading within the tolerance said DesiredWithinRange, so ScalingLimited turned off
    and on and the 10-minute alert on TooManyReplicas never fired. Within the scale-down
    window of a call for more, it is still the bound; past it, within range."""
    busy = decide(signals(steady(48)), current=8, maxReplicas=8)
    assert (busy.desired_replicas, busy.limited) == (8, Limit.TOO_MANY), busy.reason
    near = decide(signals(steady(34, now=NOW + 15), now=NOW + 15), current=8,
                  state=busy.state, now=NOW + 15, maxReplicas=8)
    assert "within tolerance" in near.reason
    assert (near.desired_replicas, near.limited) == (8, Limit.TOO_MANY), near.reason
    later = NOW + 300  # the call for 12 leaves the default 300s window
    past = decide(signals(steady(34, now=later), now=later), current=8, state=near.state,
                  now=later, maxReplicas=8)
    assert (past.desired_replicas, past.limited) == (8, None), past.reason
    # Below the bound, a high recommendation in the window is stabilization, not a limit.
    below = decide(signals(steady(34, now=NOW + 15), now=NOW + 15), current=6,
                   state=busy.state, now=NOW + 15, maxReplicas=8)
    assert below.limited is None, below.reason
    # The load gone: the window holds the count at the bound, but the signals call for
    # fewer, so the bound is not what keeps them (the alert told to raise maxReplicas for a
    # load of 1 replica, for the whole window).
    gone = decide(signals(steady(2, now=NOW + 15), now=NOW + 15), current=8,
                  state=busy.state, now=NOW + 15, maxReplicas=8)
    assert (gone.desired_replicas, gone.limited) == (8, None), gone.reason
    assert "scale-down stabilized at 8" in gone.reason
    # The same with a signal missing (the request rate's query failing), which holds the
    # count where it is: no call for the bound either.
    gone_rate = TargetSignals(steady(2, now=NOW + 15),
                              per_interval(0.05, 0.05, now=NOW + 15), MISSING)
    missing = decide(gone_rate, current=8, state=busy.state, now=NOW + 15, maxReplicas=8)
    assert "not scaling in while a signal is missing" in missing.reason
    assert (missing.desired_replicas, missing.limited) == (8, None), missing.reason
    # No opinion at all (the queue's query failing, the latency fine): no call either.
    silent = TargetSignals(NO_QUEUE, per_interval(0.05, 0.05, now=NOW + 15), MISSING)
    quiet = decide(silent, current=8, state=busy.state, now=NOW + 15, maxReplicas=8)
    assert (quiet.desired_replicas, quiet.limited) == (8, None), quiet.reason
    # maxReplicas lowered under an older call (12 recorded with maxReplicas 20): the same.
    lowered = decide(signals(steady(12, now=NOW + 15), now=NOW + 15), current=6,
                     state=busy.state, now=NOW + 15, maxReplicas=6)
    assert (lowered.desired_replicas, lowered.limited) == (6, None), lowered.reason


def test_a_fallback_count_is_held_by_the_scale_down_window_when_data_returns() -> None:
    """Fallback records the count it raises to, as HPA records the recommendation KEDA's
    fallback makes: data back after the outage does not take it away at once (it recorded
    the count before the raise, so Prometheus answering every other interval flapped)."""
    rules = {"metricsUnavailable": {"action": "Fallback", "fallbackReplicas": 6,
                                    "after": "1m"}}
    state, t = ScalingState(), NOW
    for _ in range(6):
        d = decide(NO_SIGNALS, current=2, state=state, now=t, **rules)
        state, t = d.state, t + 15
    assert (d.action, d.desired_replicas) == (ScaleAction.FALLBACK, 6), d.reason
    back = decide(signals(steady(20, now=t), now=t), current=6, state=state, now=t, **rules)
    assert back.desired_replicas == 6, back.reason  # the default 5m scale-down window
    assert "scale-down stabilized at 6" in back.reason


def test_applied_state_records_the_scale_event_and_held_state_does_not() -> None:
    decision = decide(signals(steady(48)))
    assert decision.state.scale_events == (ScaleEvent(NOW, 2),)
    assert decision.held_state.scale_events == ()
    assert decision.state.recommendations == (Recommendation(NOW, 6),)


def test_state_round_trips_through_status_json() -> None:
    state = ScalingState((Recommendation(NOW - 15, 3), Recommendation(NOW, 5)),
                         (ScaleEvent(NOW, 2),), NOW - 60)
    data = state.to_json()
    assert data["recommendations"][0] == {"time": "2023-11-14T22:13:05Z", "replicas": 3}
    assert ScalingState.from_json(data) == state
    assert ScalingState.from_json(None) == ScalingState()


def _run(series_of: list[float], spec_fields: dict[str, Any], current: int = 4,
         restart_every_cycle: bool = False) -> list[int]:
    """Evaluate every 15s over a queue that takes each value for 15s; return the replicas."""
    state, replicas, history = ScalingState(), current, []
    values: list[float] = []
    for i, value in enumerate(series_of):
        now = NOW + 15 * i
        values += [value] * 15
        window = values[-31:]
        decision = decide(signals(queue(*window, now=now), now=now), replicas, state, now,
                          **spec_fields)
        state, replicas = decision.state, decision.desired_replicas
        if restart_every_cycle:
            state = ScalingState.from_json(json.loads(json.dumps(state.to_json())))
        history.append(replicas)
    return history


def test_an_operator_restarted_every_cycle_decides_as_one_that_kept_running() -> None:
    """Sustain and breaches come from history; stabilization and rate limits from status."""
    load = [48, 48, 48, 10, 48, 10] + [4] * 24 + [320] * 3
    kept = _run(load, {})
    assert kept == _run(load, {}, restart_every_cycle=True)
    assert len(set(kept)) > 2  # the run exercised scale-out, stabilization and scale-in


def test_a_queue_hovering_around_target_does_not_flap() -> None:
    assert _run([30, 34, 31, 33, 30, 34, 32, 31] * 3, {}) == [4] * 24


def test_brief_spikes_shorter_than_sustain_do_not_scale_out() -> None:
    assert _run([30, 60, 30, 60, 30, 60, 30], {}) == [4] * 7


def test_alternating_load_scales_out_once_and_waits_to_scale_in() -> None:
    history = _run([48, 48, 48, 10, 48, 10, 10, 10], {})
    assert history[2] > 4
    assert history[3:] == [history[2]] * 5  # stabilization holds the peak; no oscillation


def test_scale_in_after_the_stabilization_window() -> None:
    history = _run([48] * 3 + [4] * 24, {})
    peak = max(history)
    assert history.index(peak) == 2
    first_lower = next(i for i, r in enumerate(history) if i > 2 and r < peak)
    assert (first_lower - 2) * 15 >= 300



def test_a_window_with_no_recommendation_in_it_starts_with_the_current_count() -> None:
    """As HPA starts the scale-down window of a target it sees for the first time: an empty
    window let a new tuning (or one enabled again, or retargeted, or evaluated again after an
    outage longer than the window) take a busy Deployment from 10 replicas to minReplicas at
    once. (The replicas are known to carry more than the load: CARRIES_40.)"""
    idle = signals(steady(0))
    first = decide(idle, current=10, state=CARRIES_40)
    assert (first.desired_replicas, first.action) == (10, ScaleAction.HOLD), first.reason
    assert "no recommendation in the last 300s before this one, so the current 10 counts " \
           "as one; scale-down stabilized at 10" in first.reason
    # Stored with the state: the next evaluations hold too, until the window has passed.
    state, replicas, at = first.state, 10, NOW
    while replicas == 10:
        at += 15
        decision = decide(signals(steady(0, now=at), now=at), current=10, state=state, now=at)
        state, replicas = decision.state, decision.desired_replicas
    assert at - NOW == 300 and replicas == 1, decision.reason
    # Only recommendations older than the window: an outage of 6 minutes starts it again.
    old = CARRIES_40._replace(recommendations=(Recommendation(NOW - 360, 1),))
    assert decide(idle, current=10, state=old).desired_replicas == 10
    # A recommendation within the window decides as before (the highest in it).
    recent = CARRIES_40._replace(recommendations=(Recommendation(NOW - 100, 6),))
    assert decide(idle, current=10, state=recent).desired_replicas == 6
    # A window no longer than the interval is empty at every evaluation (the last one's
    # recommendation is an interval old): the last evaluation's counts, nothing is started
    # again. Started at every evaluation, it held every scale-in for good.
    for interval, window in (("15s", "15s"), ("15s", "10s"), ("60s", "30s")):
        short = {"interval": interval, "scaleDown": {"stabilization": window}}
        last = CARRIES_40._replace(recommendations=(
            Recommendation(NOW - float(interval[:-1]), 10),))
        assert decide(idle, current=10, state=last, **short).desired_replicas == 1
        # ... and after a missed evaluation, it is started again.
        missed = CARRIES_40._replace(recommendations=(
            Recommendation(NOW - 2 * float(interval[:-1]), 10),))
        assert decide(idle, current=10, state=missed, **short).desired_replicas == 10
    # A recommendation exactly a window old is out of it (stabilize counts those after
    # now - window): after a restart that skips one slot, or an outage of whole slots.
    for window, gap in (("300s", 300.0), ("30s", 30.0)):
        edge = CARRIES_40._replace(recommendations=(Recommendation(NOW - gap, 10),))
        assert decide(idle, current=10, state=edge, interval="15s",
                      scaleDown={"stabilization": window}).desired_replicas == 10
    # A pass more than SLOT_LATENESS_S late is stamped with the clock: two evaluations in a
    # row 15.1 s apart at a 10 s interval are no missed slot (seeded, a 12 s window held
    # every other scale-in for good).
    late = CARRIES_40._replace(recommendations=(Recommendation(NOW - 10, 1),))
    later = signals(steady(0, now=NOW + 5.1), now=NOW + 5.1)
    assert decide(later, current=10, state=late, now=NOW + 5.1, interval="10s",
                  scaleDown={"stabilization": "12s"}).desired_replicas == 1
    # A slot start read back from status (microseconds) may be just under it: still the
    # last slot's (at 1.1 s, 60% of them read as the slot before, and seeded).
    slot = math.floor(NOW / 1.1) * 1.1  # a slot start, as slot_start computes it
    under = CARRIES_40._replace(recommendations=(
        Recommendation(slot - 1.1 - 1e-6, 1),))
    assert decide(signals(steady(0, now=slot), now=slot), current=10, state=under, now=slot,
                  interval="1100ms", scaleDown={"stabilization": "1s"}).desired_replicas == 1
    # No window, nothing to start: at once, as before.
    assert decide(idle, current=10, state=CARRIES_40,
                  scaleDown={"stabilization": "0s"}).desired_replicas == 1
    # A scale-out is not held by it (the scale-up window is HPA's 0s by default).
    busy = decide(signals(steady(96)), current=4)
    assert busy.action is ScaleAction.SCALE_OUT and "counts as one" not in busy.reason

def _reading(q: Window, latency_ms: tuple[float, ...], running: float | None = None) -> Any:
    sig = signals(q, latency_ms)
    if running is not None:
        sig = TargetSignals(sig.queue, sig.latency, sig.request_rate, steady(running))
    return read_signals(spec(), sig, NOW)


BATCHING_CASES = [
    ("breach_with_low_queue_lowers_in_proportion", steady(5), (150, 150), 128, 64,
     "lower max-num-seqs"),
    ("small_breach_lowers_by_the_overshoot", steady(5), (100, 100), 128, 96, "x0.75"),
    ("headroom_with_sustained_queue_raises", steady(48), (30, 30), 128, 160, "raise"),
    ("healthy_signals_keep_the_setting", steady(10), (60, 60), 128, 128,
     "p99 60ms has headroom under 75ms, but the queue does not stay above its target"),
    # Each "no change" says why in its numbers: "do not call for a change" read as a
    # contradiction beside a P99 many times its target.
    ("a_breach_under_load_is_the_replicas", steady(100), (2495, 2495), 64, 64,
     "p99 2495ms is above 75ms with the queue at 100 per replica, above its target 32: "
     "replicas are short, not the batch"),
    ("a_breach_after_the_queue_was_above_target_is_the_replicas",
     queue(*([64] * 20 + [20] * 11)), (150, 150), 128, 128,
     "p99 150ms is above 75ms with the queue above its target 32 11s ago (at 20 per replica "
     "now): replicas are short, not the batch"),
    ("a_breach_with_steps_of_the_queue_missing_is_not_known_the_batchs",
     gappy(5.0, missing=5), (150, 150), 128, 128,
     "p99 150ms is above 75ms with the queue at 5 per replica but data for only 26 steps of "
     "its 30s window: it is not known to be the batch's"),
    ("near_the_target_neither_way", steady(10), (70, 70), 128, 128,
     "p99 70ms is within 20% of 75ms: no headroom to raise it, and no breach to lower it"),
    ("one_sample_above_is_not_yet_a_breach", steady(5), (60, 150), 128, 128,
     "p99 150ms is above 75ms for 1 of 2 samples: no change yet"),
    ("never_above_max", steady(48), (10, 10), 250, 256, "kept within 1..256"),
    ("a_latency_of_zero_has_all_the_headroom", steady(48), (0, 0), 128, 160,
     "raise max-num-seqs by x1.25"),
    ("never_below_min", steady(5), (600, 600), 1, 1, "kept within 1..256"),
]


@pytest.mark.parametrize(("name", "q", "latency", "current", "expected", "reason"),
                         BATCHING_CASES, ids=[c[0] for c in BATCHING_CASES])
def test_batching_recommendation(name: str, q: Window, latency: tuple[float, ...],
                                 current: int, expected: int, reason: str) -> None:
    rec = recommend_batching(BatchingSpec(mode="Recommend"), Engine.VLLM, spec(),
                             _reading(q, latency), current)
    assert rec is not None
    assert rec.recommended == expected, rec.reason
    assert reason in rec.reason


def test_a_breach_scaled_out_says_so_whatever_the_queue_window_says() -> None:
    """With latency.action ScaleOut a breach never lowers the batch, and the recommendation
    says that, not why the queue is not low (from a review: with steps of its window missing
    it said "not known to be the batch's")."""
    scale_out = spec(latency={"action": "ScaleOut"})
    for q in (steady(5), gappy(5.0, missing=5), queue(*([64] * 20 + [20] * 11))):
        reading = read_signals(scale_out, signals(q, (150, 150)), NOW)
        rec = recommend_batching(BatchingSpec(mode="Recommend"), Engine.VLLM, scale_out,
                                 reading, 128)
        assert rec is not None and rec.recommended == 128
        assert "the latency breach is scaled out (latency.action ScaleOut), not batched" in \
            rec.reason, rec.reason


def test_a_batch_that_is_not_full_is_not_raised() -> None:
    """Headroom and a queue above target raised max-num-seqs 128 -> 160 -> ... -> 490 while
    50 requests ran per replica: vLLM queued them for its KV cache, not for the batch, and
    each step of mode Auto re-created every pod for nothing."""
    def raised(running: float) -> int:
        rec = recommend_batching(BatchingSpec(mode="Auto"), Engine.VLLM, spec(),
                                 _reading(steady(48), (30, 30), running=running), 128)
        assert rec is not None
        return rec.recommended

    assert raised(50) == 128
    rec = recommend_batching(BatchingSpec(mode="Auto"), Engine.VLLM, spec(),
                             _reading(steady(48), (30, 30), running=50), 128)
    assert rec is not None and rec.direction == 0
    assert ("but the batch is not full: at most 50 requests ran per replica of the 128 it "
            "allows: a larger max-num-seqs would admit nothing more") in rec.reason
    assert raised(115.2) == 160  # 90% of it: full
    assert raised(127) == 160
    # A token budget's use is not known from the running requests: raised as before.
    tokens = recommend_batching(
        BatchingSpec(mode="Recommend", knob="max-num-batched-tokens", max=65536),
        Engine.VLLM, spec(), _reading(steady(48), (30, 30), running=50), 8192)
    assert tokens is not None and tokens.recommended == 10240


def test_batching_off_or_without_knob_recommends_nothing() -> None:
    reading = _reading(steady(5), (150, 150))
    assert recommend_batching(BatchingSpec(), Engine.VLLM, spec(), reading, 128) is None
    assert recommend_batching(BatchingSpec(mode="Recommend"), Engine.CUSTOM, spec(), reading,
                              128) is None


def test_batching_without_current_starts_from_peak_running_requests() -> None:
    rec = recommend_batching(BatchingSpec(mode="Auto"), Engine.SGLANG, spec(),
                             _reading(steady(5), (150, 150), running=40), None)
    assert rec is not None
    assert (rec.knob.value, rec.recommended) == ("max-running-requests", 20)
    assert "peak running requests per replica" in rec.reason


@pytest.mark.parametrize("queue_per_replica", [q / 10 for q in range(250, 420, 4)])
def test_auto_tune_batching_is_what_the_batching_recommender_acts_on(
        queue_per_replica: float) -> None:
    """Around the queue target, Auto hands a latency breach to batching exactly when the
    recommender lowers the batch: never a TuneBatching that nothing acts on."""
    sig = signals(steady(queue_per_replica), latency_ms=(150, 150))
    decision = decide(sig)
    rec = recommend_batching(BatchingSpec(mode="Recommend"), Engine.VLLM, spec(),
                             decision.signals, 128)
    assert rec is not None
    lowers = rec.recommended < 128
    assert (decision.action is ScaleAction.TUNE_BATCHING) == lowers, (decision.reason,
                                                                        rec.reason)
    if not lowers:
        assert decision.desired_replicas > 4, decision.reason


def test_latency_sizing_is_exact_on_whole_ratios() -> None:
    """ceil(current x latency / target) computed in floats must not round a whole number up
    to the next one: latencies on histogram bucket bounds (0.1, 0.25) are common."""
    from fractions import Fraction

    rules = {"latency": {"action": "ScaleOut"}, "maxReplicas": 10000,
             "scaleUp": {"pods": 10000, "percent": 0, "period": "15s", "stabilization": "0s"}}
    checked = 0
    for current in range(1, 21):
        for tenths_ms in range(751, 3001, 7):  # 75.1ms .. 300ms
            exact = Fraction(current) * Fraction(tenths_ms, 10) / 75
            expected = max(current + 1, -(-exact.numerator // exact.denominator))
            ms = tenths_ms / 10
            got = decide(signals(steady(10), latency_ms=(ms, ms)), current=current, **rules)
            assert got.desired_replicas == expected, (current, ms, got.reason)
            checked += 1
    assert checked > 6000


def test_a_missing_latency_sample_breaks_the_run_of_breaches() -> None:
    """Points 30s apart with a 15s step: the sample between them is missing (a NaN dropped),
    so only the newest counts."""
    latency = Series(((NOW - 30, 0.15), (NOW, 0.15)), 15.0)
    rate = Series(((NOW - 30, 10.0), (NOW, 10.0)), 15.0)
    reading = read_signals(spec(), TargetSignals(steady(5), latency, rate), NOW)
    assert (reading.breaches, reading.latency_breached) == (1, False)
    whole = Series(((NOW - 15, 0.15), (NOW, 0.15)), 15.0)
    rate = Series(((NOW - 15, 10.0), (NOW, 10.0)), 15.0)
    assert read_signals(spec(), TargetSignals(steady(5), whole, rate), NOW).breaches == 2


def test_percent_rate_limits_are_exact() -> None:
    """HPA's ceil(start x (1 + p/100)) and floor(start x (1 - p/100)) in floats are a pod off
    where the product is whole: 50 at +10% gave 56, and 10 at -80% gave 1. Checked against
    exact fractions for every start and percent up to 100."""
    from fractions import Fraction

    from infertune.api.scaling import ScalingRules
    from infertune.scaling.behavior import scale_down_limit, scale_up_limit

    for start in range(1, 101):
        for percent in range(1, 101):
            rules = ScalingRules.model_validate(
                {"pods": 0, "percent": percent, "period": "15s", "stabilization": "0s"})
            up = Fraction(start) * (100 + percent) / 100
            assert scale_up_limit(start, (), rules, NOW)[0] == -(-up.numerator //
                                                                 up.denominator)
            down = Fraction(start) * (100 - percent) / 100
            assert scale_down_limit(start, (), rules, NOW)[0] == down.numerator // \
                down.denominator


def test_a_disabled_direction_allows_no_change_whatever_the_events() -> None:
    from infertune.api.scaling import ScalingRules
    from infertune.scaling.behavior import scale_down_limit, scale_up_limit

    rules = ScalingRules.model_validate({"pods": 0, "percent": 0, "period": "60s",
                                         "stabilization": "0s", "selectPolicy": "Disabled"})
    events = (ScaleEvent(NOW - 30, 2), ScaleEvent(NOW - 10, -1))
    assert scale_up_limit(6, events, rules, NOW) == (6, 5)
    assert scale_down_limit(6, events, rules, NOW) == (6, 5)


def test_a_queue_exactly_at_the_tolerance_edge_holds_either_way() -> None:
    """Inside means at most target x (1 +- tolerance): 1.1 - 1 is 0.10000000000000009 in
    floats, so 35.2 against 32 scaled out while 28.8 held."""
    for value in (35.2, 28.8):
        decision = decide(signals(steady(value)), current=10)
        assert decision.desired_replicas == 10, decision.reason
        assert "within tolerance" in decision.reason


def test_the_latency_reason_says_the_numbers_that_drove_it() -> None:
    """75.2ms read "75ms vs target 75ms" in a breach; a missing request rate read "at 0.0
    req/s, 0/2 samples above target" although both samples were above target."""
    breach = decide(signals(steady(40), latency_ms=(75.2, 75.2)), latency={"action": "ScaleOut"})
    assert "p99 75.2ms vs target 75ms" in breach.reason and "2/2 samples" in breach.reason
    unknown = TargetSignals(steady(10), per_interval(0.2, 0.2), MISSING)
    held = decide(unknown)
    assert "p99 200ms vs target 75ms at an unknown request rate, 0/2 samples above target " \
           "(a sample counts with minRequestRate behind it, and the rate is unknown)" \
        in held.reason, held.reason
    assert "0.0 req/s" not in held.reason


def _loading(total_waiting: float, reporting: int, now: float) -> Window:
    """The queue while new pods load their model: every waiting request sits at the
    `reporting` pods, whose mean is what the adapter reads, for the last 31 s."""
    return steady(total_waiting / reporting, now=now)._replace(pods=reporting)


@pytest.mark.parametrize("p99_ms", [50, 300])
def test_a_scale_out_waits_for_the_pods_it_started_instead_of_compounding(p99_ms: int) -> None:
    """256 requests waiting at 4 pods, target 32: 8 replicas take them. The new pods report
    nothing for two minutes (loading a model); sized on the mean of the 4 that report times
    every replica, each interval doubled the count: 4, 8, 16, 32, 64, held there 5 minutes.
    The latency breaches with such a queue, and sized on every replica it did the same."""
    replicas, state, history = 4, ScalingState(), []
    started: dict[float, int] = {}  # when each scale-out's pods come up
    for i in range(12):
        now = NOW + 15 * i
        reporting = min(replicas, 4 + sum(n for t, n in started.items() if now - t >= 120))
        decision = decide(signals(_loading(256, reporting, now), latency_ms=(p99_ms, p99_ms),
                                  now=now), replicas, state, now, maxReplicas=64)
        if decision.desired_replicas > replicas:
            started[now] = decision.desired_replicas - replicas
        state, replicas = decision.state, decision.desired_replicas
        history.append(replicas)
    assert history == [8] * 12, history


def test_the_queue_is_sized_on_the_pods_that_report_it() -> None:
    """As HPA sizes on the pods it has metrics for: the requests waiting over the target."""
    out = decide(signals(steady(96)._replace(pods=4)), current=8)  # 384 waiting, 4 of 8
    assert out.desired_replicas == 12, out.reason  # ceil(384 / 32), not ceil(8 x 3)
    assert "queue 96.0/pod over the 4 pods reporting (384 waiting, 8 replicas) vs target 32 " \
           "(ratio 3.00)" in out.reason
    covered = decide(signals(steady(40)._replace(pods=4)), current=8)  # 160: 5 would do
    assert covered.desired_replicas == 8 and "cover it once they all serve" in covered.reason
    # A rolling update's surge pods report too: 288 waiting take 9, not ceil(4 x 1.5) = 6.
    fast = {"scaleUp": {"pods": 10, "percent": 100, "period": "15s", "stabilization": "0s"}}
    assert decide(signals(steady(48)._replace(pods=6)), current=4, **fast).desired_replicas == 9


@pytest.mark.parametrize(("mean", "desired", "said"), [
    # 324 waiting over 10 replicas is 1.0125 x the target: inside the band, as HPA counts a
    # pod without a metric at 0 on a scale-up. Judged on the 9 that report (1.125), +1.
    (36.0, 10, "over all 10 replicas ratio 1.01, within tolerance 0.1"),
    (37.0, 10, "over all 10 replicas ratio 1.04, within tolerance 0.1"),
    # 360 waiting is 1.125 x over all of them too: out of the band, sized on the waiting.
    (40.0, 12, "(ratio 1.25), above target for 30s -> 12"),
])
def test_the_tolerance_of_a_scale_up_counts_every_replica(mean: float, desired: int,
                                                          said: str) -> None:
    """One pod of 10 whose scrape fails: its queue is not known, which is no reason to add a
    replica for a queue within tolerance over the Deployment."""
    fast = {"scaleUp": {"pods": 10, "percent": 100, "period": "15s", "stabilization": "0s"}}
    out = decide(signals(steady(mean)._replace(pods=9)), current=10, ready=10, **fast)
    assert out.desired_replicas == desired and said in out.reason, out.reason


def test_a_breach_is_not_held_by_a_pod_that_serves_without_reporting_the_queue() -> None:
    """4 replicas, all Ready, one whose scrape fails (or times out under load): 3 report a
    queue within tolerance, and the P99 is 4x the target. The queue sized the breach as if
    the fourth pod were still loading its model: held at 4 for as long as the scrape failed."""
    out = decide(signals(steady(34)._replace(pods=3), latency_ms=(300, 300)), current=4,
                 ready=4)
    assert out.desired_replicas == 8, out.reason
    assert "the queue sizes it" not in out.reason


def test_a_breach_is_held_by_a_pod_not_ready_for_starting_s_at_most() -> None:
    """One of 4 replicas Pending (no GPU for it) and so never reporting: the queue sizes the
    breach while it may still be loading its model, not for ever."""
    state, held = ScalingState(serving=Serving(3, 4, NOW)), []  # the fourth was added
    for i in range(50):  # 15 s apart: 12.5 minutes
        now = NOW + 15 * i
        out = decide(signals(steady(34, now=now)._replace(pods=3), latency_ms=(300, 300),
                             now=now), current=4, state=state, now=now, ready=3)
        if out.desired_replicas > 4:
            break
        held.append(now - NOW)
        state = out.held_state
    else:
        pytest.fail(f"the breach was held for 12.5 minutes: {out.reason}")
    assert max(held) < 600 <= max(held) + 15, held  # STARTING_S
    assert out.desired_replicas == 8, out.reason


def test_pods_that_never_report_do_not_hold_a_scale_in() -> None:
    """18 of 20 replicas Pending (no GPU for them), the load gone: counted as on target,
    they held 20 replicas for good, asking the cluster autoscaler for GPUs all along."""
    now_down = {"scaleDown": {"pods": 0, "percent": 100, "period": "15s", "stabilization": "0s"}}
    idle = decide(signals(steady(0)._replace(pods=2)), current=20, state=CARRIES_40,
                  **now_down)
    assert idle.desired_replicas == 1, idle.reason  # minReplicas
    light = decide(signals(steady(8)._replace(pods=4)), current=8, state=CARRIES_40,
                   **now_down)
    assert light.desired_replicas == 1, light.reason  # 32 waiting: one replica's worth


def test_ready_pods_that_stop_reporting_are_counted_at_target_on_a_scale_in() -> None:
    """10 replicas, all Ready; under load the scrapes of 6 time out (their series go stale)
    and the 4 left report 5 waiting each. Sized on those 4, the queue took 10 down to 1: the
    6 silent pods count at the target, as HPA counts the pods it has no metric for (7)."""
    now_down = {"scaleDown": {"pods": 0, "percent": 100, "period": "15s", "stabilization": "0s"}}
    quiet = signals(steady(5)._replace(pods=4))
    out = decide(quiet, current=10, ready=10, state=CARRIES_40, **now_down)
    assert (out.desired_replicas, out.action) == (7, ScaleAction.SCALE_IN), out.reason
    assert "queue 5.0/pod over the 4 pods reporting (20 waiting, 10 replicas) vs target 32 " \
        "(ratio 0.16); 6 Ready pods not reporting, counted at target -> 7" in out.reason
    # Counted with them, the mean is within the tolerance: nothing is taken away.
    near = decide(signals(steady(28)._replace(pods=4)), current=10, ready=10, state=CARRIES_40,
                  **now_down)
    assert near.desired_replicas == 10, near.reason
    assert "counted at target: within tolerance 0.1" in near.reason, near.reason
    # The 6 not Ready (Pending, no GPU for them): the Deployment removes those first.
    pending = decide(quiet, current=10, ready=4, state=CARRIES_40, **now_down)
    assert pending.desired_replicas == 1, pending.reason
    assert "not reporting" not in pending.reason
    # A scale-out sizes on the waiting requests alone, as before.
    busy = decide(signals(steady(96)._replace(pods=4)), current=8, ready=8)
    assert busy.desired_replicas == 12, busy.reason


def test_a_latency_breach_scales_out_whatever_the_queue_pods_say() -> None:
    """A queue gauge that only one pod exports (a router of a custom engine) must not mute
    the latency: the breach still adds replicas."""
    slow = decide(signals(steady(10)._replace(pods=1), latency_ms=(150, 150)), current=4,
                  latency={"action": "ScaleOut"})
    assert slow.desired_replicas == 8, slow.reason


def test_an_idle_deployment_is_quiet_not_missing_metrics() -> None:
    """No requests: the quantile over zero rates is NaN. That read as "latency: only NaN or
    infinite values", so an idle service had MetricsAvailable=False and `autoscale evaluate`
    exited 3, though its series were all there."""
    nan_latency = Series.of([(NOW - 15, float("nan")), (NOW, float("nan"))], 15.0, "q")
    idle = decide(TargetSignals(steady(0), nan_latency, per_interval(0.0, 0.0)))
    assert idle.signals.problems == () and idle.signals.latency_quiet
    assert "below minRequestRate" in idle.reason
    # Traffic just stopped: the newest quantile is NaN and dropped, the one before is older
    # than a step, so the adapter reads the latency as stale. Quiet all the same: the
    # condition flapped to MetricsAvailable=False for an interval every time traffic stopped.
    stopped = Series.missing("stale: the newest sample is from 2023-11-14T22:13:05Z", "q")
    after = decide(TargetSignals(steady(0), stopped, per_interval(3.0, 0.0)))
    assert after.signals.problems == () and after.signals.latency_quiet
    # Without the request rate nothing says the service is idle: still a problem.
    unknown = decide(TargetSignals(steady(0), nan_latency, MISSING))
    assert [p.split(":")[0] for p in unknown.signals.problems] == ["latency", "requestRate"]




def test_no_requests_is_quiet_with_min_request_rate_zero() -> None:
    """`minRequestRate: 0` ("count every sample") is valid: a rate of 0 was never below it,
    so the NaN quantile of an idle Deployment read as a missing signal, which held every
    scale-in (peak replicas overnight) and turned MetricsAvailable False."""
    nan_latency = Series.of([(NOW - 15, float("nan")), (NOW, float("nan"))], 15.0, "q")
    idle = decide(TargetSignals(steady(0), nan_latency, per_interval(0.0, 0.0)), current=10,
                  latency={"minRequestRate": 0}, scaleDown={"stabilization": "0s"})
    assert idle.signals.problems == () and idle.signals.latency_quiet
    assert (idle.action, idle.desired_replicas) == (ScaleAction.SCALE_IN, 1), idle.reason
    assert "latency: no requests (0 req/s), quantile ignored" in idle.reason
    # Requests at any rate are counted with it: the latency is read.
    busy = decide(signals(steady(0), latency_ms=(40, 40), rate=0.01), current=10,
                  latency={"minRequestRate": 0})
    assert not busy.signals.latency_quiet and busy.signals.latency_s is not None
def test_a_rate_limit_reason_never_names_a_negative_count() -> None:
    """The operator scaled 2 -> 6 and someone set 2 again within the period: the +4 is spent
    (as HPA counts it), and the reason said "from -2 at the start of the period"."""
    state = ScalingState(scale_events=(ScaleEvent(NOW - 10, 4),))
    out = decide(signals(steady(320)), current=2, state=state)
    assert out.desired_replicas == 2, out.reason
    assert "scale-up limited to 2 by max(+4 pods, +100%) per 15s (the period's scale events " \
           "add up to +4, now 2)" in out.reason, out.reason
    assert "-2" not in out.reason
    set_to_4 = decide(signals(steady(320)), current=4, state=state)  # start 0: as fictional
    assert "(the period's scale events add up to +4, now 4)" in set_to_4.reason, \
        set_to_4.reason
    grown = ScalingState(scale_events=(ScaleEvent(NOW - 10, 2),))
    assert "(from 4 at the start of the period, now 6)" in decide(
        signals(steady(320)), current=6, state=grown).reason


def test_signals_are_fresh_as_of_the_time_they_were_read_for() -> None:
    """A pass 6 s into the slot reads the batch fetched at its start: the queue window (1 s
    steps) ends then. Judged against the pass's own time it read as no data, and nothing
    said so (MetricsAvailable stayed True over "queue: no data")."""
    late = NOW + 6
    read = signals(steady(200), latency_ms=(300, 300))._replace(read_at=NOW)
    out = decide(read, now=late)
    assert out.signals.queue_per_replica == 200 and out.signals.latency_s == 0.3
    assert out.desired_replicas == 8 and out.signals.problems == ()
    assert out.state.scale_events[-1].time == late  # the write's time, for the rate limits
    # Without the time they were read for, data a step older than the evaluation is no
    # data, and said so, in words that stay the same while it lasts.
    old = decide(signals(steady(200, now=NOW - 20), latency_ms=(300, 300), now=NOW - 20))
    assert old.signals.queue_per_replica is None and old.signals.latency_s is None
    problems = old.signals.problems
    assert [p.split(":")[0] for p in problems] == ["queue", "latency", "requestRate"], problems
    assert problems[0] == ("queue: stale: the newest sample is more than a step (1s) older "
                           "than the time it was read for")
    assert old.desired_replicas == 4 and old.action is ScaleAction.HOLD


def test_a_stabilized_reason_names_the_windows_extreme_and_the_count_that_stays() -> None:
    """A window that held 7 with 5 replicas now keeps the 5 (no scale-down to 7): the reason
    says 7 is the window's highest and that the current 5 stays, not that 5 was."""
    state = CARRIES_40._replace(recommendations=(Recommendation(NOW - 60, 7),))
    held = decide(signals(steady(10)), current=5, state=state)
    assert held.desired_replicas == 5
    assert "scale-down stabilized at 5: the highest recommendation in the last 300s is 7, so " \
           "the current 5 stays" in held.reason
    lower = decide(signals(steady(10)), current=8, state=state)
    assert "scale-down stabilized at 7: the highest recommendation in the last 300s is 7;" \
        in lower.reason


def test_times_stored_in_the_future_count_as_now() -> None:
    """The clock stepped back 10 minutes after a scale-up 4 -> 8 (NTP, or the Lease moved to
    an operator on a node whose clock is behind): the future entries held every scale-up for
    those 10 minutes ("stabilized at 8: the lowest recommendation in the last 0s"). Taken as
    made now, the next period may scale up again."""
    ahead = NOW + 600
    state = ScalingState((Recommendation(ahead, 8),), (ScaleEvent(ahead, 4),), ahead)
    first = decide(signals(steady(96)), current=8, state=state)
    assert first.desired_replicas == 8, first.reason  # the +4 counts as just made
    assert "no usable metrics for -" not in first.reason
    later = decide(signals(steady(96, now=NOW + 15), now=NOW + 15), current=8,
                   state=first.held_state, now=NOW + 15)
    assert later.desired_replicas == 16, later.reason
    assert all(r.time <= NOW for r in first.held_state.recommendations)


def test_a_stored_state_out_of_order_is_read_in_time_order() -> None:
    stored = {"recommendations": [{"time": "2023-11-14T22:20:00Z", "replicas": 3},
                                  {"time": "2023-11-14T22:10:00Z", "replicas": 9}],
              "scaleEvents": [{"time": "2023-11-14T22:20:00Z", "change": 1},
                              {"time": "2023-11-14T22:10:00Z", "change": 2}]}
    state = ScalingState.from_json(stored)
    assert [r.replicas for r in state.recommendations] == [9, 3]
    assert [e.change for e in state.scale_events] == [2, 1]


@pytest.mark.parametrize("queue_kind", ["low", "missing"])
def test_a_latency_scale_out_waits_for_its_replicas_to_be_ready(queue_kind: str) -> None:
    """P99 twice the target with a low queue and action ScaleOut (or no queue data in Auto):
    4 replicas take it as 8. The new pods load their model for two minutes, not Ready, while
    the P99 stays where it was; sized on every replica, each interval compounded: 8, 16,
    32 (maxReplicas). Sized on those serving, 8 hold until the new ones are Ready, and the
    P99 then falls to target."""
    replicas, state, history = 4, ScalingState(), []
    started: dict[float, int] = {}
    action = "ScaleOut" if queue_kind == "low" else "Auto"
    for i in range(16):
        now = NOW + 15 * i
        ready = min(replicas, 4 + sum(n for t, n in started.items() if now - t >= 120))
        p99 = 150 * 4 / ready  # the load over the pods that serve
        q = steady(5, now=now)._replace(pods=ready) if queue_kind == "low" else NO_QUEUE
        decision = decide_scale(spec(maxReplicas=32, latency={"action": action}), replicas,
                                signals(q, latency_ms=(p99, p99), now=now), state, now,
                                ready=ready)
        if decision.desired_replicas > replicas:
            started[now] = decision.desired_replicas - replicas
        state, replicas = decision.state, decision.desired_replicas
        history.append(replicas)
        if i == 1:
            assert "sized on the 4 replicas serving (4 not Ready since they were added) -> 8: " \
                   "the 8 replicas cover it once they are Ready" in decision.reason
    assert history == [8] * 16, history
    assert state.serving is not None and state.serving.replicas == 8  # all Ready at the end


def test_a_latency_breach_on_fewer_ready_replicas_still_scales_past_those_coming() -> None:
    """4 serve and 4 added are loading; the P99 is 3x the target: 12 take it, not 8."""
    out = decide(signals(steady(5)._replace(pods=4), latency_ms=(225, 225)), current=8,
                 state=ScalingState(serving=Serving(4, 8, NOW - 30)),
                 latency={"action": "ScaleOut"}, ready=4)
    assert out.desired_replicas == 12, out.reason
    assert "sized on the 4 replicas serving" in out.reason


@pytest.mark.parametrize(("serving", "current", "ready", "known", "desired"), [
    # Readiness read for the first time: every replica is taken to serve, as before.
    (None, 4, 2, 4, 8),
    # Not read this time (`autoscale evaluate --live --replicas N`): the stored count stands.
    (2, 4, None, 2, 4),
    # Nothing stored and nothing read (a preview from a file): every replica counts.
    (None, 4, None, None, 8),
    # Pods that served and then failed their readiness probe (overload) still count.
    (4, 4, 2, 4, 8),
    # 2 added by anyone (the autoscaler, kubectl scale) and loading: sized on 2 -> 4.
    (2, 4, 2, 2, 4),
    # Added pods join once Ready.
    (2, 4, 3, 3, 6),
    # A scale-in removes the pods not Ready first: never more serve than there are.
    (8, 6, 4, 6, 12),
    # A rollout's surge pods: Ready ones above the replicas count as the replicas.
    (3, 4, 5, 4, 8),
])
def test_a_latency_breach_is_sized_on_the_replicas_known_to_serve(
        serving: int | None, current: int, ready: int | None, known: int | None,
        desired: int) -> None:
    stored = None if serving is None else Serving(serving, 4, NOW - 60)
    # One sample: the newest is measured after the pods that serve changed (now, in some).
    out = decide(signals(steady(5), latency_ms=(150, 150)), current=current,
                 state=ScalingState(serving=stored),
                 latency={"action": "ScaleOut", "consecutiveSamples": 1},
                 ready=ready, maxReplicas=20,
                 scaleUp={"pods": 20, "percent": 0, "stabilization": "0s"})
    assert out.desired_replicas == desired, out.reason
    got = out.state.serving
    assert (None if got is None else got.replicas) == known
    assert ScalingState.from_json(out.state.to_json()) == out.state


def test_a_scale_in_and_out_again_leaves_out_only_the_pods_still_loading() -> None:
    """4 serve; out to 8, in to 6 (the Deployment removes 2 loading pods), out to 8 again:
    2 + 2 pods are loading, and the 4 that serve are the breach's base."""
    state = ScalingState(serving=Serving(4, 4, NOW - 60))
    for replicas in (8, 6, 8):
        state = decide(signals(steady(32)), current=replicas, state=state, ready=4).state
    out = decide(signals(steady(5), latency_ms=(150, 150)), current=8, state=state,
                 latency={"action": "ScaleOut"}, ready=4)
    assert out.desired_replicas == 8, out.reason


def test_a_scale_in_lowers_the_replicas_known_to_serve_at_once() -> None:
    """The autoscaler takes 8 to 4 (the Deployment removes the pods not Ready first), and
    someone applies 8 again before the next reading: 4 serve, not 8."""
    down = {"scaleDown": {"pods": 0, "percent": 100, "stabilization": "0s"}}
    scaled_in = decide(signals(steady(0)), current=8,
                       state=CARRIES_40._replace(serving=Serving(8, 8, NOW - 600)), ready=6, **down)
    assert scaled_in.desired_replicas == 1
    assert scaled_in.state.serving == Serving(1, 1, NOW, changed=NOW)
    # The count not written (DryRun, blocked): the pods are all still there.
    assert scaled_in.held_state.serving == Serving(8, 8, NOW - 600)
    again = decide(signals(steady(5), latency_ms=(150, 150)), current=8,
                   state=scaled_in.state, latency={"action": "ScaleOut"}, ready=1,
                   now=NOW + 15)
    assert again.desired_replicas == 8, again.reason  # sized on 1 (-> 2): covered


def test_replicas_short_and_unchanged_for_starting_s_all_count_again() -> None:
    """A pod that never gets Ready (Pending for a GPU that does not come, a crash loop) or
    readiness that flaps under overload must not hold a latency breach for ever: 9 of 10
    known to serve and a P99 9% above target held 10 ("once they are Ready") indefinitely."""
    stuck = ScalingState(serving=Serving(9, 10, NOW - 590))
    held = decide(signals(steady(5), latency_ms=(82, 82)), current=10, state=stuck,
                  latency={"action": "ScaleOut"}, ready=9, maxReplicas=20)
    assert held.desired_replicas == 10 and "once they are Ready" in held.reason
    assert held.state.serving == stuck.serving  # unchanged: the time runs on
    later = decide(signals(steady(5, now=NOW + 10), latency_ms=(82, 82), now=NOW + 10),
                   current=10, state=held.state, latency={"action": "ScaleOut"}, ready=9,
                   maxReplicas=20, now=NOW + 10)
    assert later.desired_replicas == 11, later.reason
    # A change (progress, or a new scale-out) starts the time again.
    moved = decide(signals(steady(32)), current=12, state=stuck, ready=9)
    assert moved.state.serving == Serving(9, 12, NOW)


def test_a_latency_under_the_histograms_lowest_bucket_is_not_compared_with_a_lower_target(
) -> None:
    """vLLM's end-to-end histogram starts at 0.3 s: every request under it makes the P99
    0.297 s. With the default 75 ms target that was a breach for ever: scale-out to
    maxReplicas with action ScaleOut, or TuneBatching and no scale-in with Auto."""
    fast = signals(steady(10), latency_ms=(297, 297))._replace(latency_floor_s=0.3)
    for action in ("ScaleOut", "Auto"):
        held = decide(fast, latency={"action": action}, scaleDown={"stabilization": "0s"})
        assert (held.desired_replicas, held.action) == (2, ScaleAction.SCALE_IN), held.reason
        assert held.signals.breaches == 0 and not held.signals.latency_breached
        assert "p99 at most 300ms (under the histogram's lowest bucket): cannot be compared " \
            "with target 75ms" in held.reason
        assert held.signals.latency_floor_s == 0.3
        assert any("set latency.target to 300ms or more" in p for p in held.signals.problems)
    # Above the lowest bucket the quantile is measured: a breach as before.
    slow = signals(steady(10), latency_ms=(450, 450))._replace(latency_floor_s=0.3)
    breached = decide(slow, latency={"action": "ScaleOut"})
    assert breached.signals.latency_breached and breached.desired_replicas == 8
    # The target below the resolution is said above it too, in the same words: said only
    # under it, MetricsAvailable flapped at every interval with a P99 around 300 ms.
    assert breached.signals.problems == held.signals.problems
    # Finer buckets, under the target: the same 297 ms is measured, and a breach.
    judged = decide(fast._replace(latency_floor_s=0.05), latency={"action": "ScaleOut"})
    assert judged.signals.latency_breached and judged.signals.latency_floor_s is None


def test_a_latency_whose_histogram_bounds_are_not_known_is_not_compared() -> None:
    """The bounds read failed: the 297 ms of vLLM's lowest bucket was taken as measured,
    and breached the 75 ms target (a scale-out with action ScaleOut, TuneBatching with
    Auto). Not compared until the bounds are read, and said so; and, as a missing signal,
    it holds a scale-in: left to the low queue, a P99 far above the target let it take
    replicas away."""
    unknown = signals(steady(10), latency_ms=(297, 297))._replace(latency_floor_unknown=True)
    for action in ("ScaleOut", "Auto"):
        held = decide(unknown, latency={"action": action})
        assert (held.desired_replicas, held.action) == (4, ScaleAction.HOLD), held.reason
        assert held.wanted == 4, held.reason  # what the stabilization window keeps
        assert "-> 2; p99 297ms" in held.reason and "not scaling in while the latency " \
            "cannot be compared with its target; 4 -> 4" in held.reason, held.reason
        assert held.signals.breaches == 0 and not held.signals.latency_breached
        assert held.signals.latency_s == pytest.approx(0.297)
        assert "p99 297ms not compared with target 75ms: the bucket bounds of the latency " \
            "histogram are not known" in held.reason
        assert held.signals.problems == (
            "latency: the bucket bounds of the latency histogram could not be read, so the "
            "p99 may be an artefact of its lowest bucket; it is compared with the target "
            "once they are (read again every minute)",)
    # With why, as the adapter says it (the read's failure and the query).
    told = decide(unknown._replace(latency_floor_problem="the last read failed: timed out"))
    assert told.signals.problems[0].endswith(
        "(read again every minute): the last read failed: timed out")
    # Quiet traffic: nothing to compare anyway, and nothing to report.
    quiet = decide(signals(steady(10), latency_ms=(297, 297), rate=0.01)._replace(
        latency_floor_unknown=True))
    assert quiet.signals.problems == ()


@pytest.mark.parametrize(("latency_ms", "shown"), [
    ((75.04, 75.04), "p99 75.04ms vs target 75ms"),  # was "75ms vs target 75ms", scaling out
    ((75.0, 75.0), "p99 75ms vs target 75ms"),
    ((120.0, 120.0), "p99 120ms vs target 75ms"),
])
def test_a_latency_is_never_written_as_its_target_when_it_is_not(
        latency_ms: tuple[float, ...], shown: str) -> None:
    decision = decide(signals(steady(10.0), latency_ms=latency_ms))
    assert shown in decision.reason, decision.reason


@pytest.mark.parametrize(("per_replica", "shown", "action"), [
    # Target 32, tolerance 0.1: 35.2 is the edge; both used to read "ratio 1.10".
    (35.187, "(ratio 1.0996), within tolerance 0.1", ScaleAction.HOLD),
    (35.213, "(ratio 1.1004), above target", ScaleAction.SCALE_OUT),
    (48.0, "(ratio 1.50), above target", ScaleAction.SCALE_OUT),
])
def test_a_queue_ratio_is_told_apart_from_the_tolerance_it_is_compared_with(
        per_replica: float, shown: str, action: ScaleAction) -> None:
    decision = decide(signals(steady(per_replica)))
    assert shown in decision.reason and decision.action is action, decision.reason


@pytest.mark.parametrize(("value", "boundary", "places", "shown"), [
    (1.234, 2.0, 2, "1.23"),  # apart at `places` already
    (1.1, 1.1, 2, "1.10"),  # equal: said as equal
    (1.10001, 1.1, 2, "1.10001"),  # above the boundary, never "1.10"
    (0.09999, 0.1, 2, "0.09999"),
    (1.10000000001, 1.1, 2, "1.1000000000"),  # beyond 10 places: as far as it goes
    (1.1 - 2e-9, 1.1, 2, "1.099999998"),
    (75.04, 75.0, 1, "75.04"),
])
def test_distinct_never_reads_as_the_boundary_it_is_not(value: float, boundary: float,
                                                        places: int, shown: str) -> None:
    from infertune.scaling.signals import distinct
    assert distinct(value, boundary, places) == shown


@pytest.mark.parametrize(("per_replica", "target", "shown"), [
    # 3.3 / 3 is 1.0999999999999999 and 0.27 / 0.3 is 0.9000000000000001: float noise, within
    # the tolerance as the rule compares them, read "ratio 1.100000" and "ratio 0.900000".
    (3.3, 3, "(ratio 1.10), within tolerance 0.1"),
    (0.27, 0.3, "(ratio 0.90), within tolerance 0.1"),
])
def test_a_queue_ratio_at_the_tolerances_edge_by_float_noise_reads_as_the_edge(
        per_replica: float, target: float, shown: str) -> None:
    window = queue(*[per_replica] * 31, target=target)
    decision = decide(signals(window), queue={"targetPerReplica": target})
    assert shown in decision.reason and decision.action is ScaleAction.HOLD, decision.reason


@pytest.mark.parametrize(("latency", "target", "text"), [
    (0.075, None, "75ms"), (0.0755, None, "75.5ms"), (0.07504, 0.075, "75.04ms"),
    (0.075, 0.075, "75ms"), (2.1, None, "2100ms"), (0.00004, None, "0ms"),
])
def test_latency_text(latency: float, target: float | None, text: str) -> None:
    from infertune.scaling.signals import latency_text
    assert latency_text(latency, target) == text


def test_seconds_are_cached_but_a_bad_duration_still_raises_every_time() -> None:
    from infertune.api import units
    from infertune.api.units import Duration
    from infertune.scaling import signals
    assert signals.seconds(Duration("1m30s")) == 90.0
    assert signals.seconds("1m30s") == 90.0  # the same entry, from a plain str
    assert type(next(k for k in units._SECONDS if k == "1m30s")) is str
    assert Duration("1m30s").seconds == 90.0  # the spec's own reading shares the cache
    units._SECONDS["2m"] = 120.0  # read from the cache, not parsed again
    try:
        assert Duration("2m").seconds == 120.0
        units._SECONDS["2m"] = 7.0
        assert Duration("2m").seconds == signals.seconds("2m") == 7.0
    finally:
        units._SECONDS.pop("2m")
    for _ in range(2):
        with pytest.raises(ValueError, match="not a duration"):
            signals.seconds("30")
    assert "30" not in units._SECONDS


def test_a_ratio_past_floats_range_proposes_the_most_replicas_instead_of_raising() -> None:
    """queue.targetPerReplica 1e-320 passes validation (above 0): 4 waiting requests over it
    is infinite, math.ceil raised, and every evaluation of the tuning failed for good."""
    from infertune.api.spec import InferenceTuningSpec
    from infertune.controller.scaling_report import plan_evaluation

    spec = InferenceTuningSpec.model_validate({
        "targetRef": {"name": "llm"}, "engine": "vllm",
        "autoscaling": {"maxReplicas": 6, "queue": {"targetPerReplica": 1e-320}}})
    now = 1_700_000_000.0
    window = Window.of_points([(now - 30 + i, 4.0) for i in range(31)], now, 30.0, 1.0, 1e-320)
    signals = TargetSignals(window, Series(((now - 15, 0.05), (now, 0.05)), 15.0),
                            Series(((now - 15, 10.0), (now, 10.0)), 15.0))
    evaluation = plan_evaluation(spec, 1, {}, signals, 2, None, now)
    assert evaluation.decision.action is ScaleAction.SCALE_OUT
    assert 2 < evaluation.decision.desired_replicas <= 6
    assert evaluation.decision.wanted == 6  # capped at maxReplicas


def _hockey_stick_p99_s(rate: float, replicas: int) -> float:
    """A P99 flat at 50 ms up to 8 req/s per replica, then growing with the square of the load:
    78 ms at 10, 312 ms at 20. Nothing waits (the engine's batch takes every request), so the
    queue proposes minReplicas whatever the load."""
    per_replica = rate / replicas
    return 0.05 if per_replica <= 8 else 0.05 * (per_replica / 8) ** 2


def _closed_loop(rates: list[float], replicas: int, p99: Any = _hockey_stick_p99_s,
                 ready_after_s: float = 120.0, window_s: float = 60.0,
                 restart_every_cycle: bool = False, batching_stuck: str | None = None,
                 told_window_s: float | None = None, queue_missing: bool = False,
                 initial: ScalingState | None = None, queue_gappy: bool = False,
                 down: range = range(0), ready_times: bool = False,
                 **fields: Any) -> tuple[list[int], list[ScaleDecision]]:
    """Evaluate every 15s a Deployment whose P99 follows its load per Ready replica: each
    sample is the worst of the last `window_s` (a quantile over a window holds the requests
    served before), new pods are Ready `ready_after_s` after the write, a scale-in removes
    pods at once. `rates` gives the request rate of each interval; the signals say the window
    is `told_window_s` (default `window_s`); the queue is 0, or missing with `queue_missing`,
    or with five steps of its window missing with `queue_gappy`. The operator is down (does
    not evaluate) at the intervals in `down`; with `ready_times` it is told when the last
    Ready pod became Ready (decide_scale's ready_since).
    (Replicas after each evaluation, the decisions; neither has entries for `down`.)"""
    spec_fields = {"latency": {"action": "ScaleOut"}} | fields
    state, ready, pending = initial or ScalingState(), replicas, []
    history, decisions, instant, samples = [], [], [], []
    ready_since = NOW - 3600
    for i, rate in enumerate(rates):
        now = NOW + 15 * i
        joined = [at for at, _ in pending if at <= now]
        ready = min(replicas, ready + sum(n for at, n in pending if at <= now))
        ready_since = max([ready_since, *joined])
        pending = [(at, n) for at, n in pending if at > now]
        instant.append(p99(rate, max(ready, 1)))
        samples.append(max(instant[-max(1, int(window_s // 15)):]))
        sig = TargetSignals(NO_QUEUE if queue_missing else gappy(0.0, 5, now=now)
                            if queue_gappy else steady(0, now=now),
                            per_interval(*samples[-3:], now=now),
                            per_interval(*rates[max(0, i - 2):i + 1], now=now),
                            latency_window_s=window_s if told_window_s is None
                            else told_window_s)
        if i in down:
            continue
        decision = decide_scale(spec(**spec_fields), replicas, sig, state, now, ready,
                                batching_stuck=batching_stuck,
                                ready_since=ready_since if ready_times else None)
        if decision.desired_replicas > replicas:
            pending.append((now + ready_after_s, decision.desired_replicas - replicas))
        else:
            ready = min(ready, decision.desired_replicas)
        state, replicas = decision.state, decision.desired_replicas
        if restart_every_cycle:
            state = ScalingState.from_json(json.loads(json.dumps(state.to_json())))
        history.append(replicas)
        decisions.append(decision)
    return history, decisions


def _scale_outs(decisions: list[ScaleDecision]) -> list[int]:
    return [i for i, d in enumerate(decisions) if d.action is ScaleAction.SCALE_OUT]


def test_a_scale_in_does_not_take_away_the_replicas_a_breach_needed() -> None:
    """The oscillation of a latency scale-out under a queue at 0: a healthy latency has no
    opinion, so the queue took the replicas the breach had added away after each
    stabilization window, and the P99 breached again, 312 ms every 6 minutes for as long as
    the load lasted. The breach's request rate per replica is remembered: no scale-in leaves
    the replicas carrying it again. One more breach finds the count (a scale-in to 2 carries
    10 req/s each, under the 20 of the first breach), then it holds."""
    history, decisions = _closed_loop([20.0] * 240, 1)  # an hour at 20 req/s, from 1
    outs = _scale_outs(decisions)
    assert len(outs) == 2, [d.reason for d in decisions if d.action is not ScaleAction.HOLD]
    assert history[outs[1]:] == [3] * (240 - outs[1])
    limited = next(d for d in decisions if d.action is ScaleAction.SCALE_IN and
                   d.current_replicas == 5)
    assert ("p99 breached 5m45s ago at 20.0 req/s per replica (20.0 req/s on 1), and was under "
            "its target at 4.0 req/s per replica: 20.0 req/s now keeps at least 2; 5 -> 2") \
        in limited.reason
    # From 3, which carry it, before any breach: what they carried is measured from the
    # first reading, so the queue at 0 takes one replica away to try (2 carry 10 req/s
    # each), one breach, and the 3 come back for good. Measured only once a breach had
    # been, the queue took the 3 to 1 first (the P99 at 312 ms), as from 1 above.
    history, decisions = _closed_loop([20.0] * 240, 3)
    outs = _scale_outs(decisions)
    assert len(outs) == 1 and min(history) == 2, [
        d.reason for d in decisions if d.action is not ScaleAction.HOLD]
    assert history[outs[0]:] == [3] * (240 - outs[0])
    assert max(d.signals.latency_s or 0 for d in decisions) < 0.08  # 78 ms, the one breach
    # Turned off, the queue takes them away every window.
    _, cycling = _closed_loop([20.0] * 240, 3, latency={"action": "ScaleOut",
                                                         "breachMemory": "0s"})
    assert len(_scale_outs(cycling)) >= 6  # every 35 intervals


def test_a_breach_measured_before_the_pods_that_serve_changed_is_not_one() -> None:
    """A quantile over a 1m window still holds the slow requests of before a scale-out once
    the new pods are Ready: counted as a breach on them, it sized another scale-out (1 to 5
    to 20 replicas for a load 3 carry), and was remembered as a breach at 4 req/s per
    replica. It counts once its window lies after the pods changed."""
    history, decisions = _closed_loop([20.0] * 60, 1, ready_after_s=120.0)
    outs = _scale_outs(decisions)
    assert max(history) == 5 and history[outs[0]] == 5, history
    first = decisions[outs[0]]
    assert first.state.breaches[0][1:3] == (20.0, 1)  # the breach on the 1 replica
    # The samples after the 4 new pods were Ready: unsettled ones held, never sized.
    assert all(d.state.breaches[0][1:3] == (20.0, 1) for d in decisions[outs[0]:outs[0] + 20])
    # Not told the window, the lagged samples breach on the new pods and size on them.
    lagged, _ = _closed_loop([20.0] * 60, 1, ready_after_s=120.0, told_window_s=0.0)
    assert max(lagged) > 5


def test_pods_that_became_ready_while_the_operator_was_down_count_from_their_ready_time(
        ) -> None:
    """Counted as a change of the pods that serve at the first evaluation after a restart,
    pods Ready for minutes held a breach on them for one more latency window after it. Told
    when the pods became Ready, the operator acts on that breach at its first evaluation."""
    # 20 req/s on 1 replica breaches (312 ms): 1 -> 5 at the second evaluation, Ready 2
    # minutes later (interval 9). The operator is down from interval 3 to 19 (4 minutes);
    # the load goes to 80 req/s at 10: 16 per replica on the 5 is 200 ms, a breach.
    rates = [20.0] * 10 + [80.0] * 30
    down = range(3, 20)
    told, told_decisions = _closed_loop(rates, 1, down=down, ready_times=True)
    assert told[:3] == [1, 5, 5]
    back = told_decisions[3]  # the first evaluation after the restart (interval 20)
    assert back.action is ScaleAction.SCALE_OUT and told[3] == 10, back.reason
    assert back.state.serving is not None and back.state.serving.changed == NOW + 15 * 9
    assert "p99 200ms" in back.reason, back.reason
    # Not told, the pods changed at the restart: its breach waited until the samples' window
    # lay after it, a latency window (60s) and a sample later.
    blind, blind_decisions = _closed_loop(rates, 1, down=down)
    late = _scale_outs(blind_decisions)[1]
    assert all(d.action is ScaleAction.HOLD for d in blind_decisions[3:late])
    assert (late - 3) * 15 == 75 and blind[late] == 10, [d.reason for d in blind_decisions]


def test_a_ready_time_never_moves_the_change_before_what_is_known_or_after_now() -> None:
    """`ready_since` says when pods joined, no more: a time before the last change of the pods
    that serve known (a scale-in) or after the reading (a clock ahead) is not taken."""
    from infertune.scaling.engine import _track_serving
    # Scaled in 5 minutes ago, counted as it is since a reading 4 minutes ago.
    scaled_in = ScalingState(serving=Serving(2, 2, NOW - 240, NOW - 300))
    joined = _track_serving(scaled_in._replace(serving=Serving(2, 4, NOW - 60, NOW - 300)),
                            4, 4, NOW, ready_since=NOW - 40).serving
    assert joined == Serving(4, 4, NOW, NOW - 40)
    before_scale_in = _track_serving(scaled_in, 4, 4, NOW, ready_since=NOW - 900).serving
    assert before_scale_in is not None and before_scale_in.changed == NOW - 300
    ahead = _track_serving(scaled_in, 4, 4, NOW, ready_since=NOW + 30).serving
    assert ahead is not None and ahead.changed == NOW
    # No change known before: the Ready time alone, not after now either.
    first = _track_serving(ScalingState(serving=Serving(1, 3, NOW - 60)), 3, 3, NOW,
                           ready_since=NOW - 45).serving
    assert first is not None and first.changed == NOW - 45
    first_ahead = _track_serving(ScalingState(serving=Serving(1, 3, NOW - 60)), 3, 3, NOW,
                                 ready_since=NOW + 45).serving
    assert first_ahead is not None and first_ahead.changed == NOW
    # Fewer Ready (a scale-in, a probe failing) is no join: the time is not read.
    fewer = _track_serving(ScalingState(serving=Serving(4, 4, NOW - 60, NOW - 600)), 2, 2, NOW,
                           ready_since=NOW - 30).serving
    assert fewer is not None and fewer.changed == NOW


def test_the_breach_memory_lets_replicas_go_with_the_load_and_ends() -> None:
    # From 1 replica at 20 req/s (a breach first, then the count found), the load drops to
    # 4 req/s: 4 req/s on 1 replica is under the breach's 10 per replica, so the queue takes
    # them back after the scale-down window, with no breach.
    rates = [20.0] * 80 + [4.0] * 60
    history, decisions = _closed_loop(rates, 1)
    outs = _scale_outs(decisions)
    assert len(outs) == 2 and history[outs[1]:80] == [3] * (80 - outs[1])
    assert history[-1] == 1 and _hockey_stick_p99_s(4.0, 1) <= 0.075
    # The memory lasts breachMemory after the breach or the last scale-in it limited: at
    # the same load it keeps the count with no further breach; once the load no longer
    # needs it, it ends 10 minutes later.
    ten = {"latency": {"action": "ScaleOut", "breachMemory": "10m"}}
    history, decisions = _closed_loop([20.0] * 160 + [4.0] * 80, 1, **ten)
    outs = _scale_outs(decisions)
    assert len(outs) == 2 and history[outs[1]:160] == [3] * (160 - outs[1])
    assert history[-1] == 1 and decisions[-1].state.breaches == ()
    # The last scale-in it limited was the last interval at 20 req/s (159): 10 minutes on.
    assert decisions[198].state.breaches != () and decisions[199].state.breaches == ()
    # ... and an operator restarted at every evaluation decides the same (stored in status).
    assert _closed_loop([20.0] * 160 + [4.0] * 80, 1, restart_every_cycle=True,
                        **ten)[0] == history


def test_an_uncured_breach_limits_scale_ins_for_breach_memory_only() -> None:
    # Kept an hour to tell a breach the replicas did not lower, an uncured breach held the
    # scale-ins that long too, whatever breachMemory said: nothing cures it while the
    # traffic is under minRequestRate.
    quiet = {"latency": {"breachMemory": "10m", "minRequestRate": 25},
             "scaleDown": {"stabilization": "0s"}}
    for age_s, floor in ((5 * 60, 3), (20 * 60, 1), (50 * 60, 1)):
        state = ScalingState(breaches=(Breach(NOW - age_s, 20.0, 2, "75ms", 0.99,
                                              since=NOW - age_s),))
        decision = decide(signals(steady(0), rate=20.0), current=5, state=state, **quiet)
        assert decision.desired_replicas == floor, (age_s, decision.reason)
        # Still kept for the check it is kept for (its time is now where it limited one).
        assert [(b.rate, b.outcome, b.since) for b in decision.state.breaches] == [
            (20.0, "Open", NOW - age_s)]


def _breach_signals(rate: float, now: float = NOW, p99_s: float = 0.2) -> TargetSignals:
    return TargetSignals(steady(0, now=now), per_interval(p99_s, p99_s, now=now),
                         per_interval(rate, rate, now=now))


def test_the_breaches_remembered_are_the_lowest_rate_per_replica_and_the_newest() -> None:
    first = decide(_breach_signals(30.0), current=2)  # 15 req/s per replica
    assert first.state.breaches == (Breach(NOW, 30.0, 2, "75ms", 0.99, latency=0.2, since=NOW),)
    # A later one at a higher rate per replica (20) is kept beside it: it takes over when
    # the lowest is forgotten.
    later = decide(_breach_signals(40.0, NOW + 60), current=2, state=first.state, now=NOW + 60)
    assert later.state.breaches == (Breach(NOW, 30.0, 2, "75ms", 0.99, latency=0.2, since=NOW),
                                    Breach(NOW + 60, 40.0, 2, "75ms", 0.99, latency=0.2,
                                           since=NOW + 60))
    # A latency under the target on the same pods cures them (the floor still counts them).
    healthy = decide(signals(steady(0, now=NOW + 90), now=NOW + 90), current=2,
                     state=later.state, now=NOW + 90)
    assert [b.outcome for b in healthy.state.breaches] == ["Cured", "Cured"]
    # ... and the rate per replica it carried (10 req/s on 2) is known to be fine.
    assert [b.healthy for b in healthy.state.breaches] == [5.0, 5.0]
    # One at a lower rate per replica (10) replaces the newest, and keeps what was fine
    # under it; the lowest before it (15) stays beside it, and takes over if the new one
    # turns out not to say what a replica carries (cured at its own rate).
    lower = decide(_breach_signals(40.0, NOW + 120), current=4, state=healthy.state,
                   now=NOW + 120)
    before = healthy.state.breaches[0]
    assert before.per_replica == 15.0
    assert lower.state.breaches == (before, Breach(NOW + 120, 40.0, 4, "75ms", 0.99,
                                                   latency=0.2, healthy=5.0, since=NOW + 120))
    calm = NOW + 180
    cured = decide(signals(steady(0, now=calm), now=calm), current=4, state=lower.state,
                   now=calm)
    # (Its time is now: it limited this evaluation's scale-in, 1 -> 2.)
    assert cured.state.breaches == (before, Breach(calm, 40.0, 4, "75ms", 0.99, "Cured", 0.2,
                                                   5.0, NOW + 120))
    # Past breachMemory, it is forgotten; so it is at once when the target or the quantile
    # changes (a breach of 75ms says nothing of a 500ms target).
    gone = decide(signals(steady(0, now=calm + 3600), now=calm + 3600), current=4,
                  state=cured.state, now=calm + 3600)
    assert gone.state.breaches == ()
    for latency in ({"target": "500ms"}, {"quantile": 0.9}):
        moved = decide(signals(steady(0, now=calm), now=calm), current=4, state=cured.state,
                       now=calm, latency=latency, scaleDown={"stabilization": "0s"})
        # ... and what a replica carried with it: measured again from this reading (the
        # scale-in takes one replica to try).
        assert moved.state.breaches == () and moved.desired_replicas == 3, moved.reason
        assert moved.state.carried == Carried(2.5, calm, latency.get("target", "75ms"),
                                              latency.get("quantile", 0.99))


def test_with_the_request_rate_unknown_no_scale_in_is_made() -> None:
    """The request rate is a query of its own, and failed alone: MetricsAvailable said a
    signal was missing while a low queue took 8 replicas to 1 (missing data never scales
    down)."""
    unknown = TargetSignals(steady(0), per_interval(0.05, 0.05),
                            Series.missing("no series", "rate"))
    decision = decide(unknown, current=8, scaleDown={"stabilization": "0s"})
    assert decision.desired_replicas == 8, decision.reason
    assert decision.reason.endswith("not scaling in while a signal is missing; 8 -> 8")
    # Scaling out on the queue goes on.
    busy = TargetSignals(steady(96), per_interval(0.05, 0.05),
                         Series.missing("no series", "rate"))
    assert decide(busy, current=2, scaleDown={"stabilization": "0s"}).desired_replicas > 2


def test_with_the_request_rate_unknown_a_remembered_breach_holds_every_scale_in() -> None:
    state = ScalingState(breaches=(Breach(NOW - 60, 20.0, 1, "75ms", 0.99, "Cured"),))
    unknown = TargetSignals(steady(0), per_interval(0.05, 0.05),
                            Series.missing("no series", "rate"))
    decision = decide(unknown, current=4, state=state, scaleDown={"stabilization": "0s"})
    assert decision.desired_replicas == 4
    assert "not scaling in while a signal is missing" in decision.reason
    # Quiet traffic lets the replicas go: 0.5 req/s needs one replica.
    quiet = TargetSignals(steady(0), per_interval(0.05, 0.05), per_interval(0.5, 0.5))
    assert decide(quiet, current=4, state=state,
                  scaleDown={"stabilization": "0s"}).desired_replicas == 1


@pytest.mark.parametrize(("rate", "floor"), [(20.0, 3), (18.0, 3), (17.0, 2), (0.0, 1)])
def test_the_breach_floor_is_the_rate_per_replica_less_the_tolerance(rate: float,
                                                                      floor: int) -> None:
    """Breached at 10 req/s per replica: with tolerance 0.1 a replica may carry less than 9."""
    state = ScalingState(breaches=(Breach(NOW - 60, 20.0, 2, "75ms", 0.99, "Cured", 0.1, 9.0),))
    sig = TargetSignals(steady(0), per_interval(0.05, 0.05), per_interval(rate, rate))
    decision = decide(sig, current=8, state=state, scaleDown={"stabilization": "0s"},
                      latency={"minRequestRate": 0})
    assert decision.desired_replicas == floor, decision.reason


def test_a_rate_past_what_a_replica_count_can_hold_keeps_every_replica() -> None:
    from infertune.scaling.engine import _breach_floor
    breach = Breach(NOW - 60, 20.0, 2, "75ms", 0.99, "Cured", 0.1)
    reading = read_signals(spec(), TargetSignals(steady(0), per_interval(0.05, 0.05),
                                                 per_interval(1e308, 1e308)), NOW)
    assert _breach_floor(spec(), (breach,), reading, 8, NOW)[0] == 8


STUCK = "spec.batching.mode is Off, so nothing lowers the batch"


def test_a_breach_more_replicas_did_not_lower_adds_none_with_nothing_lowering_the_batch(
) -> None:
    """latency.action Auto with nothing to lower the batch sizes replicas on the latency. A
    P99 at 150 ms whatever the replicas (a slow dependency, a bad release) took 3 to 20, and
    the breaches, each at a lower rate per replica, held them for an hour. The first scale-out
    that does not lower it ends that: the breach is not the load's."""
    def flat(rate: float, replicas: int) -> float:
        return 0.15

    history, decisions = _closed_loop([20.0] * 60, 3, p99=flat, batching_stuck=STUCK,
                                      latency={})
    assert max(history) == 6 and len(_scale_outs(decisions)) == 1, history
    held = decisions[-1]
    assert ("but spec.batching.mode is Off, so nothing lowers the batch; it breached at 150ms "
            "with 6.7 req/s per replica (20.0 req/s on 3) and is at 150ms with 3.3 req/s per "
            "replica now: the replicas added did not lower it, so none are added for it") \
        in held.reason
    assert held.state.breaches[0].outcome == "NotLoad"
    # Once it is under the target again, it is forgotten: nothing of it holds the replicas,
    # which come down as far as what a replica was measured to carry lets them, a replica
    # per window (each step measured before the next: the P99 here is the same on any count).
    rates = [20.0] * 100

    def episode(rate: float, replicas: int, calls: list[int] = []) -> float:  # noqa: B006
        calls.append(1)
        return 0.15 if len(calls) <= 40 else 0.05

    history, decisions = _closed_loop(rates, 3, p99=episode, batching_stuck=STUCK,
                                      latency={})
    assert decisions[-1].state.breaches == ()
    assert [n for i, n in enumerate(history) if i == 0 or n != history[i - 1]] == [3, 6, 5, 4]
    # action ScaleOut sizes on it all the same: the user's call.
    scaled, _ = _closed_loop([20.0] * 60, 3, p99=flat)
    assert max(scaled) == 20


NOT_LOWERED = ("it breached at 150ms with 6.7 req/s per replica (20.0 req/s on 3) and is at "
               "150ms with 3.3 req/s per replica now: the replicas added did not lower it, so "
               "none are added for it")


@pytest.mark.parametrize(("queue_is", "said"), [
    # No queue data is not low.
    ({"queue_missing": True}, f"with no queue data; {NOT_LOWERED}"),
    # Nor is a window with steps missing (from a review: a batch too large stalls the
    # engine's /metrics too, its scrapes keep failing, and the breach went to maxReplicas).
    ({"queue_gappy": True}, f"so it is not known to be low; {NOT_LOWERED}"),
])
def test_a_breach_more_replicas_did_not_lower_adds_none_where_the_queue_is_not_known_low(
        queue_is: dict[str, bool], said: str) -> None:
    """latency.action Auto scales out on a breach where the queue is not known low, and a
    P99 that no replica count lowers took 3 to maxReplicas (20): the check that the replicas
    added lowered it held only where a low queue had handed the breach to a batching that
    does nothing. Without the queue, it is the only sign of whether the breach is the
    load's, and it ends the climb at the first scale-out that did not."""
    def flat(rate: float, replicas: int) -> float:
        return 0.15

    history, decisions = _closed_loop([20.0] * 60, 3, p99=flat, latency={"action": "Auto"},
                                      **queue_is)
    assert max(history) == 6 and len(_scale_outs(decisions)) == 1, history
    held = decisions[-1]
    assert held.desired_replicas == 6 and held.action is ScaleAction.HOLD, held.reason
    assert said in held.reason, held.reason


def test_a_breach_more_replicas_lower_is_the_loads_without_queue_data_in_auto() -> None:
    """The other side of the check above: a breach the replicas lower scales out to what
    carries it, and one over too few requests is not remembered."""
    def flat(rate: float, replicas: int) -> float:
        return 0.15

    # A breach the replicas do lower is the load's: 200 ms at 6.7 req/s per replica, 75 ms
    # at 2.5 (8 replicas) ends it.
    def load(rate: float, replicas: int) -> float:
        return 0.03 * rate / replicas

    loaded, _ = _closed_loop([20.0] * 60, 3, p99=load, queue_missing=True,
                             latency={"action": "Auto"})
    assert max(loaded) == loaded[-1] == 8, loaded
    # At 1.5 req/s the P99 is of too few requests (90 in the window): Auto with no queue data
    # scales out for it (nothing else tells a real overload at a low rate), and does not
    # remember it, so it cannot be found not the load's (docs/autoscaling.md): remembered,
    # one slow request in an outage of the queue's metric held replicas for a day after.
    few, decisions = _closed_loop([1.5] * 60, 1, p99=flat, queue_missing=True,
                                  latency={"action": "Auto"})
    assert all(d.state.breaches == () for d in decisions)
    assert few[-1] == 20, few
    # action ScaleOut sizes on it all the same: the user's call.
    scaled, _ = _closed_loop([20.0] * 60, 3, p99=flat, queue_missing=True)
    assert max(scaled) == 20


def test_a_quantile_of_too_few_requests_adds_no_replicas_with_nothing_lowering_the_batch(
) -> None:
    """A P99 of 72 requests (1.2 req/s over 1m) is their slowest one: one slow request took 2
    replicas to 6 with nothing to lower the batch, and 3 were kept for an hour."""
    def one_slow_request(rate: float, replicas: int, calls: list[int] = []) -> float:  # noqa: B006
        calls.append(1)
        return 0.4 if len(calls) == 10 else 0.05

    history, decisions = _closed_loop([1.2] * 60, 2, p99=one_slow_request,
                                      batching_stuck=STUCK, latency={})
    assert max(history) == 2 and not _scale_outs(decisions)
    said = next(d.reason for d in decisions if "slowest" in d.reason)
    assert "the p99 is of about 72 requests (under 100), the slowest of them, so no replicas " \
        "are added for it" in said
    assert all(d.state.breaches == () for d in decisions)
    # With no queue data, nothing but the quantile tells a real overload at a low rate: a
    # P99 three times the target at 1.5 req/s on 1 replica (90 requests in the window) is
    # scaled out, not held as one of too few requests (taken for one, it was held for good).
    def overloaded(rate: float, replicas: int) -> float:
        return 0.15 * rate / replicas

    history, decisions = _closed_loop([1.5] * 60, 1, p99=overloaded, queue_missing=True,
                                      latency={"action": "Auto"})
    assert history[-1] == max(history) == 3, history
    assert not any("slowest" in d.reason for d in decisions)


def test_a_scale_out_too_small_to_end_a_breach_is_still_the_loads() -> None:
    """A breach on more replicas at a lower rate per replica is not the load's only when the
    latency did not come down with it: a scale-out held to one pod by the rate limits (312
    to 78 ms), or a latency with a fixed part (50 ms + 5 ms per req/s per replica, which
    sizing on the ratio always falls short of), read as "did not lower it", and the
    Deployment stayed above its target with nothing acting."""
    limited, decisions = _closed_loop([20.0] * 120, 1, batching_stuck=STUCK, latency={},
                                      scaleUp={"pods": 1, "percent": 0, "period": "2m"})
    assert limited[-1] == 3 and all(d.state.breaches == () or d.state.breaches[0].outcome
                                    != "NotLoad" for d in decisions), limited

    def fixed_part(rate: float, replicas: int) -> float:
        return 0.05 + 0.005 * rate / replicas

    history, decisions = _closed_loop([40.0] * 240, 5, p99=fixed_part, batching_stuck=STUCK,
                                      latency={})
    assert fixed_part(40.0, history[-1]) <= 0.075, history
    assert not any("did not lower it" in d.reason for d in decisions)


def test_a_dip_in_the_request_rate_on_the_same_pods_is_not_a_breach_replicas_missed() -> None:
    """No replica added (pods still loading, DryRun, a blocked write): a breach at 17 req/s
    after one at 20 on the same 2 pods said "the replicas added did not lower it"."""
    first = decide_scale(spec(), 2, _breach_signals(20.0), ScalingState(), NOW, 2,
                         batching_stuck=STUCK)
    dip = decide_scale(spec(), 2, _breach_signals(17.0, NOW + 15), first.state, NOW + 15, 2,
                       batching_stuck=STUCK)
    assert dip.action is ScaleAction.SCALE_OUT and "did not lower" not in dip.reason
    # Remembered as the load's (the one before it kept beside it).
    assert [(b.per_replica, b.outcome) for b in dip.state.breaches] == [
        (10.0, "Open"), (8.5, "Open")]


def test_a_mean_latency_is_not_a_quantile_of_too_few_requests() -> None:
    few = TargetSignals(steady(0), per_interval(0.3, 0.3), per_interval(1.5, 1.5),
                        latency_kind="mean", latency_window_s=60.0)
    decision = decide_scale(spec(), 2, few, ScalingState(), NOW, batching_stuck=STUCK)
    assert decision.action is ScaleAction.SCALE_OUT, decision.reason
    p99 = few._replace(latency_kind="p99")
    held = decide_scale(spec(), 2, p99, ScalingState(), NOW, batching_stuck=STUCK)
    assert held.action is ScaleAction.HOLD and "of about 90 requests" in held.reason


def test_without_a_breach_memory_replicas_that_did_not_lower_a_breach_are_still_seen() -> None:
    """breachMemory 0s turns off the scale-in limit, not the check that ended a runaway."""
    def flat(rate: float, replicas: int) -> float:
        return 0.15

    history, decisions = _closed_loop([20.0] * 60, 3, p99=flat, batching_stuck=STUCK,
                                      latency={"breachMemory": "0s"})
    assert max(history) == 6 and len(_scale_outs(decisions)) == 1, history


def test_after_a_step_in_load_the_count_is_found_in_a_few_breaches_and_then_kept() -> None:
    """4 to 60 req/s on 1 replica: each scale-in goes halfway between the load per replica
    that breached and the most that was fine since, so three breaches find the count where
    just under the breach took six; and the count is kept at the same load (the memory lasts
    an hour after the last scale-in it limited), where it was tried again every hour and a
    half, three breaches each time."""
    history, decisions = _closed_loop([4.0] * 40 + [60.0] * 440, 1)
    outs = _scale_outs(decisions)
    episodes = [i for i in outs if i - 1 not in outs]
    assert len(episodes) <= 3 and outs[-1] < 130, outs
    assert len(set(history[130:])) == 1 and _hockey_stick_p99_s(60.0, history[-1]) <= 0.075


def test_bursts_of_slow_requests_at_a_load_known_fine_do_not_ratchet_the_replicas() -> None:
    """A burst breaches at the load per replica the latency was fine at just before: taken as
    the load's, each one lowered the remembered rate per replica, and a burst every 2.5
    hours took a Deployment that 5 replicas carry to 20 within 18 hours, held there."""
    bursts = {i for i in range(300, 5760, 600)}  # every 2.5 hours, for a day

    def bursty(rate: float, replicas: int, calls: list[int] = []) -> float:  # noqa: B006
        calls.append(1)
        return 0.3 if len(calls) - 1 in bursts else _hockey_stick_p99_s(rate, replicas)

    history, _ = _closed_loop([40.0] * 5760, 5, p99=bursty)
    # Each burst scales out (action ScaleOut sizes on it); between them it comes back to 5.
    assert [history[b - 1] for b in sorted(bursts)] == [5] * len(bursts), history[::300]
    assert history[-1] == 5


def test_a_breach_the_load_per_replica_is_carried_past_is_forgotten() -> None:
    """A latency at or under the target at the rate per replica of a breach says the breach
    no longer measures what a replica carries (a burst, a batch lowered since, a faster
    release): it was kept, and held replicas the load no longer needed."""
    state = ScalingState(breaches=(Breach(NOW - 600, 20.0, 2, "75ms", 0.99, "Cured", 0.2, 6.0,
                                          NOW - 600),))
    carried = decide(signals(steady(0), latency_ms=(20, 20)), current=3, state=state,
                     now=NOW, ready=3)  # 10 req/s on 3 replicas: 3.3 each
    # Under the breach's 10 per replica: still a measure (kept; it limited this scale-in).
    assert [b[1:] for b in carried.state.breaches] == [b[1:] for b in state.breaches]
    past = decide(TargetSignals(steady(0), per_interval(0.02, 0.02), per_interval(30.0, 30.0)),
                  current=3, state=state, now=NOW, ready=3)  # 10 req/s each, fine
    assert past.state.breaches == ()


def test_a_breach_kept_by_the_scale_ins_it_limits_ends_a_day_after_it() -> None:
    breach = Breach(NOW - 60, 20.0, 2, "75ms", 0.99, "Cured", 0.1, 0.0, NOW - 86000)
    held = decide(signals(steady(0)), current=4, state=ScalingState(breaches=(breach,)),
                  scaleDown={"stabilization": "0s"}, latency={"minRequestRate": 0})
    assert held.desired_replicas == 2 and held.state.breaches[0].time == NOW
    later = NOW + 400  # 86,460 s after the breach
    gone = decide(signals(steady(0, now=later), now=later), current=2, state=held.state,
                  now=later, scaleDown={"stabilization": "0s"})
    assert gone.state.breaches == () and gone.desired_replicas == 1


def test_a_steady_load_keeps_its_replicas_when_the_breach_that_held_them_ends() -> None:
    """Found by review: the breach that held the replicas ends a day after it, and the queue
    at 0 (the replicas keep up) took 3 replicas to 1 under the same 20 req/s, then 5, 2, 3:
    P99 at 312 ms and more for 10 minutes, every day. What a replica was measured to carry
    well holds them now: one replica fewer is tried, the latency breaches there, and the
    count is back at 3."""
    history, decisions = _closed_loop([20.0] * (25 * 240), 3, latency={"action": "Auto"},
                                      batching_stuck="spec.batching.mode is Off")
    day = 24 * 240
    assert history[day - 1] == 3 and min(history[240:]) == 2, history[day - 240:day + 240]
    outs = [i for i in _scale_outs(decisions) if i >= 240]
    assert len(outs) == 1 and day < outs[0] < day + 240, outs
    assert history[-1] == 3
    tried = next(d for d in decisions[day:] if d.action is ScaleAction.SCALE_IN)
    assert tried.desired_replicas == 2 and (
        "the p99 was under its target at 6.7 req/s per replica 0s ago, at which 3 carry the "
        "20.0 req/s now: one replica fewer is tried, 2; 3 -> 2") in tried.reason, tried.reason


def test_a_breach_cured_at_its_own_rate_leaves_what_a_replica_carried_to_the_scale_ins() -> None:
    """Found by review: a breach at 7.25 req/s per replica, one reading fine at 7.3 (124 req/s
    on 17) forgot it as no measure of the load, and 5 minutes later the queue at 0 took the
    17 replicas to 1 under 83 req/s."""
    breach = Breach(NOW - 1800, 79.8, 11, "75ms", 0.99, "Cured", 0.09, 7.0, NOW - 3000)
    state, current = ScalingState(breaches=(breach,), serving=Serving(17, 17, NOW - 3000)), 17
    for i, rate in enumerate([83.0, 124.0] + [83.0] * 22):  # 6 minutes
        now = NOW + 15 * i
        decision = decide(signals(steady(0, now=now), latency_ms=(60, 60), rate=rate, now=now),
                          current=current, state=state, now=now, ready=current,
                          maxReplicas=40)
        state, current = decision.state, decision.desired_replicas
        assert current >= 11, decision.reason  # 83 / (7.3 x 1.1) = 10.4
    assert state.breaches == () and current == 11
    assert state.carried == Carried(83.0 / 11, NOW + 15 * 23, "75ms", 0.99)
    # Fine at 7.5 per replica there: one replica fewer is tried after the next window, and
    # so on while the latency stays fine.


def test_what_a_replica_carried_outlasts_a_steady_load_just_under_its_peak() -> None:
    """Found by review: renewed only by a reading above it, the record of a peak (96 req/s on
    10) lapsed under a load just below it (95) before the first scale-in it was for (a
    scale-down window longer than breachMemory), turned itself off with no breach left, and
    the queue took the 10 replicas to 1: P99 4.5 s. A reading within the tolerance renews it
    now, and one fine reading takes it again once lapsed."""
    def knee_at_10(rate: float, replicas: int) -> float:
        per_replica = rate / replicas
        return 0.05 if per_replica <= 10 else 0.05 * (per_replica / 10) ** 2

    rates = [95.0 + (0.5 if i % 2 else -0.5) for i in range(200)]
    for memory, window in (("10m", "15m"), ("5m", "5m"), ("1h", "5m")):
        history, decisions = _closed_loop(
            rates, 10, p99=knee_at_10, initial=ScalingState(carried=Carried(9.6, NOW, "75ms",
                                                                            0.99)),
            latency={"action": "ScaleOut", "breachMemory": memory},
            scaleDown={"stabilization": window})
        # 8 carry it under 75 ms (11.9 req/s each: 71 ms); 7 do not (13.6: 92 ms).
        assert min(history) >= 7, (memory, window, history)
        assert max(d.signals.latency_s or 0 for d in decisions) < 0.1, (memory, window)
        assert all(d.state.carried is not None for d in decisions), (memory, window)


def test_the_one_replica_step_waits_for_a_reading_at_the_count_it_left() -> None:
    """Found by review: with a scale-down window shorter than the latency's, the step of one
    replica was taken at every interval, before any reading at the count it left: 10 -> 9
    -> 8 -> 7 in 30 s, into a breach."""
    def knee_at_15(rate: float, replicas: int) -> float:  # 6 carry 95 req/s, 5 do not
        per_replica = rate / replicas
        return 0.05 if per_replica <= 15 else 0.05 * (per_replica / 15) ** 2

    history, _ = _closed_loop([95.0] * 40, 10, p99=knee_at_15, window_s=60.0,
                              initial=ScalingState(carried=Carried(9.5, NOW, "75ms", 0.99)),
                              scaleDown={"stabilization": "0s"})
    steps = [i for i in range(len(history)) if history[i] < (history[i - 1] if i else 10)]
    assert len(steps) >= 3 and min(history) == 5, history  # 5 breaches, and is left
    # A reading at the new count takes the latency's window (60 s: 4 intervals) to settle.
    assert all(b - a >= 4 for a, b in itertools.pairwise(steps)), (steps, history)


def test_the_reading_that_cures_a_breach_at_its_own_rate_is_what_a_replica_carries() -> None:
    """Found by review: the reading fine at a breach's own rate forgets the breach in the same
    evaluation, and with no breach left the measure was never started: 10 -> 1 under the
    95 req/s the 10 had just carried well."""
    breach = Breach(NOW - 60, 95.0, 10, "75ms", 0.99, "Open", 0.2, 0.0, NOW - 60)
    cured = decide(signals(steady(0), rate=95.0), current=10,
                   state=ScalingState(breaches=(breach,)), scaleDown={"stabilization": "0s"})
    assert cured.state.breaches == ()
    assert cured.state.carried == Carried(9.5, NOW, "75ms", 0.99)
    assert cured.desired_replicas == 9, cured.reason


def test_a_scale_in_goes_at_most_one_replica_under_the_count_known_to_carry_the_rate() -> None:
    """Found by review: each replica allowed the tolerance more than was measured fine, 102
    replicas went to 79 at once with a tolerance of 0.3 (P99 113 ms), and the breach's floor
    held 114 after it where 97 carry the load."""
    state = ScalingState(carried=Carried(9.5, NOW - 60, "75ms", 0.99))
    for tolerance in (0.1, 0.3, 0.5):
        step = decide(signals(steady(0), rate=950.0), current=102, state=state, maxReplicas=200,
                      tolerance=tolerance, scaleDown={"stabilization": "0s"})
        assert step.desired_replicas == 99, (tolerance, step.reason)  # 950 / 9.5 = 100, - 1
    # The load that goes away takes them at once all the same (300 / 9.5 = 31.6: 32 carry it,
    # and one fewer is tried).
    quiet = decide(signals(steady(0), rate=300.0), current=102, state=state, maxReplicas=200,
                   scaleDown={"stabilization": "0s"})
    assert quiet.desired_replicas == 31, quiet.reason


def test_after_a_breach_of_the_load_no_replica_is_tried_away_for_breach_memory() -> None:
    """Found by review: the step into a breach was cured at its own rate minutes later, and
    the step was taken again every window (twice the scale-outs of before, with minReplicas
    just under the need)."""
    failed = Carried(9.5, NOW - 60, "75ms", 0.99, failed=NOW - 600)
    held = decide(signals(steady(0), rate=95.0), current=10, state=ScalingState(carried=failed),
                  scaleDown={"stabilization": "0s"})
    assert held.desired_replicas == 10, held.reason
    later = NOW + 3000  # breachMemory (1h) after the breach
    step = decide(signals(steady(0, now=later), rate=95.0, now=later), current=10, now=later,
                  state=ScalingState(carried=failed._replace(time=later - 60)),
                  scaleDown={"stabilization": "0s"})
    assert step.desired_replicas == 9, step.reason
    # A breach of the load is what stamps it.
    breached = decide(signals(steady(0), latency_ms=(90, 90), rate=95.0), current=10,
                      state=ScalingState(carried=Carried(9.5, NOW - 60, "75ms", 0.99)))
    assert breached.state.carried is not None and breached.state.carried.failed == NOW


def test_the_count_known_to_carry_the_load_caps_the_floor_of_the_breach_a_step_made() -> None:
    """Found by review: a step from 10 replicas to 9 breached at 10.6 req/s per replica, and
    the breach's floor (each replica under 90% of that: 9.5) held 11 for a day where the 10
    had carried 95 req/s at 9.5 each. The two agree on 10."""
    history, decisions = _closed_loop([95.0] * (3 * 240), 10, minReplicas=8, maxReplicas=13,
                                      initial=ScalingState(carried=Carried(9.5, NOW, "75ms",
                                                                           0.99)))
    assert min(history) == 9 and history[-1] == 10 and max(history[100:]) == 10, history[:80]
    said = next(d.reason for d in decisions if d.action is ScaleAction.SCALE_IN
                and d.current_replicas == 11)
    assert "but it was under its target at 9.5 req/s per replica, so 10 carry it" in said, said
    # Not where the breach came at the rate measured fine or under it: a slower release.
    slower = Breach(NOW - 60, 76.0, 10, "75ms", 0.99, "Cured", 0.09, 0.0, NOW - 60)
    held = decide(signals(steady(0), rate=95.0), current=14, maxReplicas=20,
                  state=ScalingState(breaches=(slower,),
                                     carried=Carried(9.5, NOW - 600, "75ms", 0.99)),
                  scaleDown={"stabilization": "0s"})
    assert held.desired_replicas == 14, held.reason  # 95 / (7.6 x 0.9) = 13.9


def test_what_a_replica_carried_lets_the_replicas_go_with_the_load_at_once() -> None:
    """The request rate, not the replicas: a load that goes away takes them with it in one
    step; only a count the load still needs is tried one replica at a time."""
    carried = Carried(9.5, NOW - 600, "75ms", 0.99)  # 95 req/s on 10, fine, 10 minutes ago
    state = ScalingState(carried=carried)
    quiet = decide(signals(steady(0), rate=30.0), current=10, state=state,
                   scaleDown={"stabilization": "0s"})
    assert quiet.desired_replicas == 3, quiet.reason  # 30 / (9.5 x 1.1) = 2.9
    assert quiet.state.carried == carried  # 3 per replica now: the most stays
    same = decide(signals(steady(0), rate=95.0), current=10, state=state,
                  scaleDown={"stabilization": "0s"})
    assert same.desired_replicas == 9 and same.state.carried == Carried(95 / 10, NOW, "75ms", 0.99)
    # For another target or quantile it says nothing: measured again from this reading, one
    # replica is taken to try (not the one 95 / (9.5 x 1.1) would leave at 75ms).
    for latency in ({"target": "50ms"}, {"quantile": 0.9}):
        alone = decide(signals(steady(0), rate=95.0), current=10, state=state, latency=latency,
                       scaleDown={"stabilization": "0s"})
        assert alone.desired_replicas == 9, alone.reason
        assert alone.state.carried == Carried(9.5, NOW, latency.get("target", "75ms"),
                                              latency.get("quantile", 0.99))
    # breachMemory (1h) after the last reading that matched it: taken again from a reading
    # fine now, else kept until there is one.
    lapsed = ScalingState(carried=carried._replace(time=NOW - 3600))
    again = decide(signals(steady(0), rate=60.0), current=10, state=lapsed,
                   scaleDown={"stabilization": "0s"})
    assert again.state.carried == Carried(6.0, NOW, "75ms", 0.99) and again.desired_replicas == 9
    kept = decide(signals(steady(0), latency_ms=(90, 90), rate=60.0), current=10, state=lapsed,
                  scaleDown={"stabilization": "0s"})
    assert lapsed.carried is not None
    assert kept.state.carried == lapsed.carried._replace(failed=NOW)  # and the breach is said
    # Renewed by a reading within the tolerance under it: a steady load sits just under its
    # own peak, and the record lapsed before the first scale-in it was for.
    near = decide(signals(steady(0), rate=86.0), current=10, state=state)
    assert near.state.carried == carried._replace(time=NOW)
    below = decide(signals(steady(0), rate=85.0), current=10, state=state)
    assert below.state.carried == carried
    # breachMemory 0s turns every scale-in limit off, this one with them.
    off = decide(signals(steady(0), rate=95.0), current=10, state=state,
                 latency={"breachMemory": "0s"}, scaleDown={"stabilization": "0s"})
    assert off.desired_replicas == 1 and off.state.carried is None


def test_what_a_replica_carries_is_measured_only_on_a_reading_that_says_so() -> None:
    """Only a latency at or under its target, with the queue known and not above its own: a
    breach, a queue above target or a signal missing say nothing of what a replica carries
    well. Breach or none: before any breach too (measured only once one had been, the queue
    at 0 took a new tuning's 11 replicas serving 100 req/s well to 1)."""
    breach = Breach(NOW - 60, 40.0, 2, "75ms", 0.99, "Cured", 0.1, 0.0, NOW - 60)
    remembered = ScalingState(breaches=(breach,))
    fine = decide(signals(steady(0), rate=40.0), current=8, state=remembered)
    assert fine.state.carried == Carried(5.0, NOW, "75ms", 0.99)
    first = decide(signals(steady(0), rate=40.0), current=8)
    assert first.state.carried == Carried(5.0, NOW, "75ms", 0.99)
    for sig in (signals(steady(0), latency_ms=(90, 90), rate=40.0),  # a breach
                signals(steady(40), rate=40.0),  # the queue above target
                signals(steady(0), rate=40.0, latency_ms=()),  # no latency
                TargetSignals(NO_QUEUE, per_interval(0.05, 0.05), per_interval(40.0, 40.0))):
        assert decide(sig, current=8, state=remembered).state.carried is None, sig


def test_with_action_scale_out_a_breach_of_few_requests_is_remembered() -> None:
    """ScaleOut added the replicas for it: not remembered, the queue took them away after
    each window and the latency breached again."""
    def low_rate(rate: float, replicas: int) -> float:
        return _hockey_stick_p99_s(rate * 16, replicas)  # the knee at 0.5 req/s per replica

    _, decisions = _closed_loop([1.5] * 240, 1, p99=low_rate)
    outs = _scale_outs(decisions)
    assert len([i for i in outs if i - 1 not in outs]) <= 2, outs
    assert any(d.state.breaches for d in decisions)


def test_a_slower_release_is_learnt_at_the_second_breach_at_a_load_known_fine() -> None:
    """The first breach at a load per replica the latency was fine at is taken for a burst;
    a second within breachMemory is a measure (a release that carries less per replica):
    never taken, the queue took the replicas back to the old count after every scale-out."""
    calls: list[int] = []

    def release(rate: float, replicas: int) -> float:
        calls.append(1)
        knee = 8 if len(calls) <= 400 else 4  # a release that carries half per replica
        per_replica = rate / replicas
        return 0.05 if per_replica <= knee else 0.05 * (per_replica / knee) ** 2

    history, decisions = _closed_loop([40.0] * 1200, 5, p99=release)
    outs = _scale_outs(decisions)
    after = [i for i in outs if i >= 400 and i - 1 not in outs]
    assert len(after) <= 3 and after[-1] < 500, outs
    assert len(set(history[500:])) == 1 and release(40.0, history[-1]) <= 0.075


@pytest.mark.parametrize(("change", "latency", "said"), [
    ({"latency_floor_s": 0.3, "breaches": 0, "latency_breached": False}, (200, 200),
     "p99 200ms is not compared with 75ms (under the histogram's lowest bucket"),
    ({"latency_bounds_unknown": True, "breaches": 0, "latency_breached": False}, (200, 200),
     "is not compared with 75ms (the histogram's bucket bounds are not known)"),
    ({"latency_quiet": True, "breaches": 0, "latency_breached": False}, (200, 200),
     "is over too few requests to call for a change"),
    ({"queue_per_replica": None, "queue_sustained": False}, (30, 30),
     "but there is no queue reading to say whether requests wait"),
])
def test_no_change_says_why_in_what_the_engine_read(change: dict[str, Any],
                                                    latency: tuple[float, ...], said: str) -> None:
    """"above 75ms for 0 of 2 samples: no change yet" for a latency that is never compared,
    and "the queue does not stay above its target" with no queue reading at all."""
    reading = _reading(steady(5), latency)._replace(**change)
    rec = recommend_batching(BatchingSpec(mode="Recommend"), Engine.VLLM, spec(), reading, 64)
    assert rec is not None and rec.recommended == 64
    assert said in rec.reason, rec.reason


def test_the_breaches_counted_are_at_most_the_tunings_own_samples() -> None:
    """The latency query is shared with tunings that ask for more samples, so its lookback
    holds more points: the reason said "5/2 samples above target", and the count in status
    changed with other teams' settings."""
    five = signals(steady(0), latency_ms=(150, 150, 150, 150, 150))
    decision = decide(five, current=4, latency={"consecutiveSamples": 2})
    assert decision.signals.breaches == 2
    assert "2/2 samples above target" in decision.reason, decision.reason
    assert decide(five, current=4, latency={"consecutiveSamples": 5}).signals.breaches == 5
    # Fewer than asked are counted as they are.
    assert decide(signals(steady(0), latency_ms=(50, 150, 150)), current=4,
                  latency={"consecutiveSamples": 5}).signals.breaches == 2


def test_a_breach_measured_before_the_replicas_changed_says_why_it_is_not_counted() -> None:
    """Both samples above target, and the reason said "0/2 samples above target": their
    window reaches back before the last scale event, which the reason did not say."""
    from infertune.scaling.state import ScaleEvent

    state = ScalingState(scale_events=(ScaleEvent(NOW - 30, 1),))
    early = signals(steady(0), latency_ms=(150, 150))._replace(latency_window_s=60.0)
    decision = decide(early, current=4, state=state)
    assert decision.desired_replicas == 4 and decision.signals.breaches == 0
    assert ("0/2 samples above target (a sample counts once its window starts after the "
            "replicas or their batch last changed; the newest does not yet)") in decision.reason
    # Long after the change, the samples count and say nothing of it.
    settled = decide(early, current=4, state=ScalingState(
        scale_events=(ScaleEvent(NOW - 600, 1),)))
    assert settled.signals.breaches == 2 and "replicas last changed" not in settled.reason


def test_the_bound_is_the_limit_where_a_stabilization_window_keeps_the_count_at_it() -> None:
    """At maxReplicas with a scale-up window holding a lower recommendation, the signals call
    for more all the same: ScalingLimited must say maxReplicas, not "within range"."""
    rules = {"maxReplicas": 10, "scaleUp": {"pods": 4, "percent": 100, "period": "15s",
                                            "stabilization": "1m"}}
    state = ScalingState(recommendations=(Recommendation(NOW - 30, 8),))
    decision = decide(signals(steady(320)), current=10, state=state, **rules)
    assert (decision.desired_replicas, decision.limited) == (10, Limit.TOO_MANY), \
        decision.reason
    # Kept above minReplicas by the scale-down window: stabilized, not limited.
    held = decide(signals(steady(0)), current=5,
                  state=ScalingState(recommendations=(Recommendation(NOW - 30, 5),)))
    assert (held.desired_replicas, held.limited) == (5, None), held.reason
    assert "scale-down stabilized at 5" in held.reason


def test_a_decision_without_signals_says_what_it_does_about_the_outage() -> None:
    rules = {"metricsUnavailable": {"action": "Fallback", "fallbackReplicas": 6,
                                    "after": "1m"}}
    held = decide(NO_SIGNALS, current=2, **rules)
    assert (held.outage, held.wanted, held.limited) == (Outage.HOLD, None, None)
    raised = decide(NO_SIGNALS, current=2, state=held.state, now=NOW + 60, **rules)
    assert (raised.action, raised.outage, raised.desired_replicas) == (
        ScaleAction.FALLBACK, Outage.FALLBACK, 6)
    # At the fallback count already: a Hold, with the fallback still in effect.
    kept = decide(NO_SIGNALS, current=6, state=raised.state, now=NOW + 75, **rules)
    assert (kept.action, kept.outage) == (ScaleAction.HOLD, Outage.FALLBACK)
    assert decide(signals(steady(20)), current=2).outage is None
    # A new reason keeps the rest (the report adds to reasons after the decision).
    assert with_reason(kept, "other")._replace(reason=kept.reason) == kept
    capped = decide(signals(steady(320)), current=10, maxReplicas=10)
    assert with_reason(capped, "other").limited is Limit.TOO_MANY


def test_a_rate_the_queue_overloaded_at_is_kept_while_the_queue_stays_above_target() -> None:
    """A latency under its target at the rate per replica the queue overloaded at does not
    say a replica carries it while the queue is still above target: forgotten at the next
    evaluation, it left nothing to hold the scale-ins, and 85 req/s went down to 1 replica."""
    rules = spec(maxReplicas=40)
    breach = Breach(NOW - 600, 100.0, 10, "75ms", 0.99, "Cured", 0.1, 0.0, NOW - 600)
    state = ScalingState(breaches=(breach,), serving=Serving(10, 10, NOW - 3600, NOW - 3600))
    current, t = 10, NOW
    for _ in range(3):  # the queue above target, the p99 under it; the new pods load
        d = decide_scale(rules, current, signals(steady(60.0, now=t), (60, 60), rate=85.0,
                                                  now=t), state, t, ready=10)
        state, current, t = d.state, d.desired_replicas, t + 15
        [backup, kept] = state.breaches  # the breach stays beside the rate that lowers it
        assert (backup.since, backup.per_replica) == (breach.since, 10.0), state.breaches
        assert kept.overloaded == NOW and kept.per_replica == 8.5, state.breaches
    assert current > 10
    for _ in range(60):  # then quiet, every replica serving: the floor holds 12 or more
        d = decide_scale(rules, current, signals(steady(0.0, now=t), (60, 60), rate=85.0,
                                                  now=t), state, t, ready=current)
        state, current, t = d.state, d.desired_replicas, t + 15
    assert current in (12, 13) and 85.0 / current < 8.5 * 0.9, d.reason  # 8.5 less 10%
    assert ("the queue was above target 15m30s ago at 8.5 req/s per replica (85.0 req/s on "
            "10)") in d.reason, d.reason


def test_a_queue_overload_long_after_a_scale_in_is_no_breach() -> None:
    """Only right after a scale-in (its sustain window and four intervals): a 30m scale-down
    period keeps the event for that long, and ordinary load growth 25 minutes after a
    scale-in was remembered as "after a scale-in", holding scale-ins for breachMemory."""
    rules = spec(maxReplicas=40, scaleDown={"period": "30m", "pods": 2})
    for ago, remembered in ((25 * 60, False), (60, True)):
        state = ScalingState(scale_events=(ScaleEvent(NOW - ago, -2),),
                             serving=Serving(10, 10, NOW - ago, NOW - ago))
        d = decide_scale(rules, 10, signals(steady(50.0), (60, 60), rate=100.0), state, NOW,
                         ready=10)
        assert d.desired_replicas > 10, d.reason
        assert bool(d.state.breaches) is remembered, d.reason
        assert ("after a scale-in: remembered" in d.reason) is remembered


def test_a_queue_breach_after_a_scale_in_keeps_two_breaches_at_most_and_no_copy() -> None:
    """Beside breaches the replicas did not lower (NotLoad, not in memory for scale-ins), the
    new one was kept twice, as the lowest and as the newest."""
    rules = spec(maxReplicas=40)
    old = (Breach(NOW - 600, 100.0, 5, "75ms", 0.99, "NotLoad", 0.2, 0.0, NOW - 600),
           Breach(NOW - 500, 120.0, 6, "75ms", 0.99, "NotLoad", 0.2, 0.0, NOW - 500))
    state = ScalingState(scale_events=(ScaleEvent(NOW - 60, -2),),
                         serving=Serving(3, 3, NOW - 60, NOW - 60), breaches=old)
    # One sample above the target: no breach of its own yet, and nothing cured.
    d = decide_scale(rules, 3, signals(steady(50.0), (60, 150), rate=30.0), state, NOW,
                     ready=3)
    kept = d.state.breaches
    assert len(kept) == len(set(kept)) <= 2, kept
    assert any(b.overloaded == NOW and b.per_replica == 10.0 for b in kept), kept


def test_a_backlog_drains_where_the_queue_falls_at_evaluations_in_a_row() -> None:
    """QueueSeen.fell: the requests waiting fall at two evaluations in a row or more (each at
    most two intervals after the one before), by more than 10% from where they began above
    the target, with no replica taken away (a scale-in takes its pods' requests with it) and
    no pod that reported them missing (a scrape that times out takes its count out of the
    sum). One fall is not: a queue that wavers falls by as much now and then."""
    from infertune.scaling.state import QueueSeen

    def seen(before: QueueSeen | None, per_pod: float, current: int = 10,
             pods: int | None = None, now: float = NOW) -> QueueSeen:
        window = steady(per_pod, now=now)._replace(pods=pods)
        d = decide(signals(window, rate=50.0, now=now), current=current,
                   state=ScalingState(queue=before), now=now)
        assert d.state.queue is not None
        return d.state.queue

    earlier = NOW - 600
    first = QueueSeen(NOW - 15, 1000.0, 10, 10, earlier)  # 100 waiting per pod
    once = seen(first, 94.0)  # one fall: where it began is kept, nothing more
    assert once == QueueSeen(NOW, 940.0, 10, 10, earlier, 1000.0)
    assert seen(once, 89.0, now=NOW + 15).fell == NOW + 15  # 11% in two
    assert seen(once, 91.0, now=NOW + 15).fell == earlier  # 9%
    assert seen(once, 95.0, now=NOW + 15) == QueueSeen(NOW + 15, 950.0, 10, 10, earlier)
    assert seen(first, 80.0).fell == earlier  # 20% at once is one fall all the same
    below = QueueSeen(NOW - 15, 300.0, 10, 10, None, 310.0)  # 31 per pod: not above 32
    assert seen(below, 20.0).fell is None
    assert seen(once, 80.0, current=8, now=NOW + 15).fell == earlier  # replicas taken away
    assert seen(once, 80.0, pods=9, now=NOW + 15).fell == earlier  # a pod stopped reporting
    assert seen(once, 80.0, now=NOW + 15 + 31).fell == earlier  # older than two intervals
    assert seen(once, 80.0, now=NOW + 30).fell == NOW + 30  # one evaluation missed
    # Across a change of the pods that serve, the fall is theirs, not a backlog's.
    changed = decide(signals(steady(80.0, now=NOW + 15), rate=50.0, now=NOW + 15),
                     current=10, now=NOW + 15, ready=10,
                     state=ScalingState(queue=once, serving=Serving(10, 10, NOW + 5, NOW + 5)))
    assert changed.state.queue is not None and changed.state.queue.fell == earlier
    # Replicas added drain it: what waits over all of them is what counts.
    assert seen(once, 55.0, current=16, now=NOW + 15).fell == NOW + 15  # 880 waiting
    assert seen(once, 60.0, current=16, now=NOW + 15).fell == earlier  # 960: no fall
    # No queue data: the last reading is kept as it was.
    kept = decide(signals(NO_QUEUE, rate=50.0), current=10, state=ScalingState(queue=once))
    assert kept.state.queue == once


def test_the_latency_of_a_backlog_the_replicas_drain_is_no_breach_of_the_load() -> None:
    """At maxReplicas, a backlog left by too few replicas drained for minutes, its latency
    above the target all the while: remembered as a breach at the rate the 20 replicas
    carry, it was cured at that same rate once the backlog had gone and forgotten with
    what was known before it, and the queue, at 0, took the replicas to 1 every nine
    minutes. Now it holds the replicas but adds none (the queue does, while it is above its
    target), and the breach of before stays, and limits the scale-in once it is over."""
    from infertune.scaling.state import QueueSeen

    rules = spec(maxReplicas=20)
    # The queue stayed above target at 170 req/s on 1 replica, right after a scale-in.
    before = Breach(NOW - 120, 170.0, 1, "75ms", 0.99, "Open", 0.0, 0.0, NOW - 120, None,
                    NOW - 120)
    state = ScalingState(breaches=(before,), serving=Serving(20, 20, NOW - 75, NOW - 75),
                         queue=QueueSeen(NOW - 15, 20 * 330.0, 20, 20, None, 20 * 350.0))
    draining = signals(steady(300.0), (20_000, 18_000), rate=170.0)
    # Below maxReplicas the queue adds replicas; the latency adds none, and says why.
    wider = decide_scale(spec(maxReplicas=40), 20, draining, state, NOW, ready=20)
    assert wider.desired_replicas == 40 and wider.state.breaches[0] == before, wider.reason
    assert ("p99 18000ms vs target 75ms at 170.0 req/s, 2/2 samples above target; the "
            "requests waiting fell from 7000 to 6000 over evaluations in a row: the p99 above "
            "target is that backlog's, so it adds no replicas, changes no batch and is not "
            "remembered as what a replica carries") in wider.reason, wider.reason
    assert "-> 4800" not in wider.reason  # the latency's own proposal
    current, t, waiting = 20, NOW, 300.0
    for step in range(12):  # the backlog drains by 7% an interval, the p99 far above target
        d = decide_scale(rules, current, signals(steady(waiting, now=t), (20_000, 18_000),
                                                  rate=170.0, now=t), state, t, ready=current)
        state, current, t, waiting = d.state, d.desired_replicas, t + 15, waiting * 0.93
        assert "is that backlog's, so it adds no replicas" in d.reason, d.reason
        assert all(b.latency == 0.0 for b in state.breaches), (step, d.reason)
        assert before in state.breaches  # beside the queue's overload, if any
    # The backlog gone: the queue at 0, the p99 under target at 170 req/s on 20.
    while current == 20 and t < NOW + 3600:
        d = decide_scale(rules, current, signals(steady(0.0, now=t), (60, 60), rate=170.0,
                                                  now=t), state, t, ready=current)
        state, current, t = d.state, d.desired_replicas, t + 15
    [cured] = state.breaches
    assert (cured.since, cured.outcome, cured.per_replica, cured.healthy) == (
        NOW - 120, "Cured", 170.0, 8.5)
    # Halfway between 8.5 and 170 less the tolerance: 80.75 req/s per replica, 3 replicas.
    assert current == 3, d.reason
    assert "the queue was above target" in d.reason and "keeps at least 3" in d.reason


def test_a_breach_is_remembered_once_its_samples_start_after_the_queue_fell() -> None:
    """Only samples that reach back to the fall are the backlog's (no replicas are added for
    them); a fall before the pods that serve last changed is the old pods' (their latency
    is not counted either)."""
    from infertune.scaling.state import QueueSeen

    breach = signals(steady(10.0), (150, 150), rate=60.0)._replace(latency_window_s=60.0)

    def remembered(fell: float, changed: float) -> bool:
        state = ScalingState(serving=Serving(4, 4, changed, changed),
                             queue=QueueSeen(NOW - 15, 40.0, 4, 4, fell))
        d = decide_scale(spec(latency={"action": "ScaleOut"}), 4, breach, state, NOW,
                         ready=4)
        assert (d.desired_replicas > 4) is bool(d.state.breaches), d.reason
        assert ("not remembered as what a replica carries" in d.reason) is not bool(
            d.state.breaches), d.reason
        return bool(d.state.breaches)

    assert remembered(fell=NOW - 80, changed=NOW - 3600)  # both samples' windows after it
    assert not remembered(fell=NOW - 70, changed=NOW - 3600)  # the older one's is not
    assert remembered(fell=NOW - 600, changed=NOW - 100)  # fell before the change
    # Nor does a fall before the change hold the queue's overload past its sustain window
    # after the change.
    lowest = Breach(NOW - 900, 100.0, 10, "75ms", 0.99, "Cured", 0.15, 0.0, NOW - 900)
    for changed, lowered in ((NOW - 20, False), (NOW - 40, True)):
        state = ScalingState(breaches=(lowest,), serving=Serving(10, 10, changed, changed),
                             queue=QueueSeen(NOW - 15, 600.0, 10, 10, NOW - 600))
        d = decide_scale(spec(maxReplicas=40), 10, signals(steady(60.0), (50, 50), rate=85.0),
                         state, NOW, ready=10)
        assert any(b.overloaded == NOW for b in d.state.breaches) is lowered, d.reason


def test_one_fall_of_more_than_a_tenth_holds_the_breach_for_an_evaluation() -> None:
    """Where a burst ends, the queue falls at once, the P99 is the burst's and the request
    rate's window holds the quiet after it: remembered, that breach (7 req/s per replica
    where 10 was the burst's) held 11 replicas for a day. The next reading tells a backlog
    from a queue that wavers; one fall of a tenth or less is not held at all."""
    from infertune.scaling.state import QueueSeen

    breach = signals(steady(60.0), (300, 300), rate=60.0)  # the p99 alone would say 16
    before = ScalingState(queue=QueueSeen(NOW - 15, 300.0, 4, 4))  # 75 per pod
    held = decide(breach, state=before)
    assert held.state.breaches == (), held.reason
    assert ("the requests waiting fell from 300 to 240: the p99 above target may be a "
            "backlog's (the next reading tells), so it adds no replicas" in held.reason), \
        held.reason
    assert held.desired_replicas == 8, held.reason  # the queue's 60 per pod, not the p99's
    assert held.state.queue == QueueSeen(NOW, 240.0, 4, 4, None, 300.0)
    small = decide(signals(steady(70.0), (150, 150), rate=60.0), state=before)  # 7%
    assert len(small.state.breaches) == 1 and "fell" not in small.reason, small.reason
    # From at or under the target (32 per pod), a fall is no backlog's.
    quiet = decide(signals(steady(20.0), (150, 150), rate=60.0),
                   state=ScalingState(queue=QueueSeen(NOW - 15, 120.0, 4, 4)))
    assert len(quiet.state.breaches) == 1, quiet.reason


def test_a_breach_lower_than_every_other_keeps_the_lowest_of_the_loads_above_it() -> None:
    from infertune.scaling.engine import _added

    def breach(rate: float, replicas: int, outcome: str = "Open", t: float = NOW) -> Breach:
        return Breach(t, rate, replicas, "75ms", 0.99, outcome, 0.2, 0.0, t)

    high, higher = breach(48.0, 4, "Cured", NOW - 60), breach(60.0, 4, t=NOW - 30)
    new = breach(64.0, 8)  # 8 per replica
    assert _added((high, higher), new) == (high, new)  # 12 kept, 15 forgotten
    # Not one the replicas added did not lower (NotLoad): it says nothing of the load.
    assert _added((breach(48.0, 4, "NotLoad"),), new) == (new,)
    # A lower one of the load's is what limits scale-ins: the higher ones go.
    low = breach(12.0, 2, t=NOW - 90)  # 6 per replica
    assert _added((low, high), new) == (low, new)
    # Two at most: a NotLoad one below keeps its place, and the one above goes.
    below = breach(10.0, 2, "NotLoad", NOW - 100)  # 5 per replica
    assert _added((below, high), new) == (below, new)


def test_the_breach_kept_beside_the_queues_overload_keeps_no_rate_it_found_fine() -> None:
    """The queue stayed above target at 8.5 req/s per replica where the latency breach at 10
    was measured fine at 8.5 (`healthy`): kept as it was beside its lowered copy, a real
    breach at 8 on 12 replicas read as a burst of slow requests under that `healthy` and
    was not remembered, or the breach at 10 was marked NotLoad by it."""
    rules = spec(maxReplicas=40)
    # Cured at 8.5 before; or still open, the P99 above target at one sample of two.
    for outcome, healthy, p99 in (("Cured", 8.5, (50, 50)), ("Open", 0.0, (50, 150))):
        first = Breach(NOW - 600, 80.0, 8, "75ms", 0.99, outcome, 0.15, healthy, NOW - 600)
        state = ScalingState(breaches=(first,), serving=Serving(10, 10, NOW - 300, NOW - 300))
        over = decide_scale(rules, 10, signals(steady(40.0), p99, rate=85.0), state, NOW,
                            ready=10)
        [kept, lowered] = over.state.breaches
        assert (kept.per_replica, kept.outcome, kept.healthy, lowered.per_replica,
                lowered.overloaded) == (10.0, outcome, 0.0, 8.5, NOW), over.state.breaches
        t = NOW + 600
        state = over.state._replace(serving=Serving(12, 12, t - 300, t - 300))
        real = decide_scale(rules, 12, signals(steady(36.0, now=t), (145, 145), rate=96.0,
                                                now=t), state, t, ready=12)
        assert [(b.per_replica, b.outcome) for b in real.state.breaches] == [
            (8.5, lowered.outcome), (8.0, "Open")], real.state.breaches
        assert "burst" not in real.reason and "did not lower" not in real.reason


def test_the_queues_overload_after_a_scale_in_is_taken_unless_the_queue_falls_by_a_quarter(
) -> None:
    """A queue that wavers by 15% fell by 11% at the evaluation where a scale-in had left too
    few replicas: skipped there, the overload went unremembered once the scale-out that
    followed changed the pods, and 30 req/s went 4 -> 2 -> 6 -> 12 with a P99 of 30s. Where a
    burst ends, the queue falls by far more, and the request rate's window holds the quiet
    after it too: that overload is not taken."""
    from infertune.scaling.state import QueueSeen

    def overload(fell_to: float) -> bool:
        state = ScalingState(scale_events=(ScaleEvent(NOW - 60, -1),),
                             serving=Serving(3, 3, NOW - 60, NOW - 60),
                             queue=QueueSeen(NOW - 15, 3 * 134.0, 3, 3))
        d = decide_scale(spec(maxReplicas=40), 3, signals(steady(fell_to), rate=30.0), state,
                         NOW, ready=3)
        assert d.desired_replicas > 3, d.reason  # the queue scales out either way
        return any(b.overloaded == NOW for b in d.state.breaches)

    assert overload(118.6)  # 11.5% under the reading before
    assert not overload(90.0)  # 33%


def test_a_queue_past_floats_range_is_not_kept() -> None:
    """A mean near float's limit summed over the pods is infinite: kept, it made the status
    patch JSON cannot carry, and the API server refused every status write."""
    from infertune.scaling.state import QueueSeen

    before = QueueSeen(NOW - 15, 400.0, 4, 4)
    d = decide(signals(steady(1e308), rate=50.0), state=ScalingState(queue=before))
    assert d.state.queue == before
    json.dumps(d.state.to_json(), allow_nan=False)


def test_the_requests_waiting_are_written_to_three_figures_under_a_hundred() -> None:
    """With a queue target of 0.5 per pod, a fall read "the requests waiting fell from 2 to
    2"."""
    from infertune.scaling.engine import _waiting_text

    assert [_waiting_text(v) for v in (1.8, 1.24, 0.05, 99.94, 100.4, 7000.0)] == [
        "1.8", "1.24", "0.05", "99.9", "100", "7000"]


def test_a_backlogs_latency_holds_the_replicas_where_the_queue_would_take_them_away() -> None:
    """The queue drained to 10 per pod, the P99 still over the backlog's requests: no
    scale-in while it is above its target, as for any latency above target."""
    from infertune.scaling.state import QueueSeen

    state = ScalingState(queue=QueueSeen(NOW - 15, 4 * 100.0, 4, 4, None, 4 * 300.0))
    d = decide(signals(steady(10.0), (300, 300), rate=20.0), state=state,
               scaleDown={"stabilization": "0s"})
    assert d.desired_replicas == 4 and d.state.breaches == (), d.reason
    assert "is that backlog's, so it adds no replicas" in d.reason, d.reason
    assert d.signals.latency_backlog is not None and not d.signals.latency_breached
    assert d.signals.to_json()["latencyBacklog"] == d.signals.latency_backlog


def test_a_queue_that_wavers_around_its_target_is_no_backlog() -> None:
    """From 40 to 36 to 33 per pod (the target 32) is more than 10% in two falls, but no
    backlog's: held back as one, a P99 four times its target went unanswered for minutes."""
    from infertune.scaling.state import QueueSeen

    state = ScalingState(queue=QueueSeen(NOW - 15, 4 * 36.0, 4, 4, None, 4 * 40.0))
    d = decide(signals(steady(33.0), (300, 300), rate=60.0), state=state,
               latency={"action": "ScaleOut"})
    assert d.state.queue is not None and d.state.queue.fell is None
    assert d.desired_replicas > 4 and len(d.state.breaches) == 1, d.reason


@pytest.mark.parametrize(("fields", "sig", "says"), [
    ({}, signals(steady(2), rate=0.999), "latency: 0.999 req/s is below minRequestRate 1"),
    ({"latency": {"minRequestRate": 0.005}}, signals(steady(2), rate=0.004),
     "latency: 0.004 req/s is below minRequestRate 0.005"),
    ({"queue": {"targetPerReplica": 0.01}}, signals(queue(0.014, target=0.01)),
     "queue 0.014/replica vs target 0.01 (ratio 1.40)"),
    ({"latency": {"minRequestRate": 0.01, "action": "ScaleOut"}},
     signals(steady(2), latency_ms=(200, 200), rate=0.04),
     "p99 200ms vs target 75ms at 0.04 req/s"),
])
def test_a_reason_never_shows_a_number_as_the_one_it_is_compared_with(
        fields: dict[str, Any], sig: TargetSignals, says: str) -> None:
    """Found by review: decimals cut small numbers to what they are compared with, or to 0:
    "1.00 req/s is below minRequestRate 1", "queue 0.0/replica vs target 0.01 (ratio 1.40)",
    "at 0.0 req/s" for a breach sized on 0.04."""
    reason = decide(sig, **fields).reason
    assert says in reason, reason


def test_a_queue_that_was_above_target_in_the_window_is_shown_in_the_signals() -> None:
    """`autoscale evaluate --output json` shows why a queue under target now is not low."""
    rose = decide(signals(queue(*([64] * 20 + [20] * 11)), latency_ms=(150, 150)))
    assert rose.signals.to_json()["queueAboveTargetSecondsAgo"] == 11.0
    # Above target now, the sustain rule says it instead (queueAboveTargetForSeconds).
    above = decide(signals(queue(*([20] * 20 + [64] * 11)), latency_ms=(150, 150)))
    assert above.signals.to_json()["queueAboveTargetSecondsAgo"] is None
    assert above.signals.to_json()["queueAboveTargetForSeconds"] == 10.0


def test_the_queue_of_before_the_replicas_changed_does_not_make_it_high() -> None:
    """The queue above target on fewer replicas, before a scale-out, says nothing of the load
    on the replicas that serve now: with the queue low since they serve and a breach
    measured on them, the breach is the batch's (from a review: it scaled out 8 -> 16 a
    second time on the queue that had caused the first)."""
    sustain = {"queue": {"sustain": "120s"}}
    history = [64.0] * 20 + [20.0] * 101  # above target until 101s ago
    points = [(NOW - 120 + i, v) for i, v in enumerate(history)]
    window = Window.of_points(points, NOW, 120.0, 1.0, threshold=32.0)
    breach = signals(window, latency_ms=(150, 150))._replace(latency_window_s=60.0)
    # Eight replicas serve since 100s ago: the queue above target was on the four of before.
    since = ScalingState(serving=Serving(8, 8, NOW - 100, NOW - 100))
    after = decide(breach, current=8, state=since, ready=8, **sustain)
    assert after.action is ScaleAction.TUNE_BATCHING, after.reason
    # Had they served since before it, the queue says the load is the replicas'.
    before = ScalingState(serving=Serving(8, 8, NOW - 200, NOW - 200))
    load = decide(breach, current=8, state=before, ready=8, **sustain)
    assert load.action is ScaleAction.SCALE_OUT, load.reason
    assert "was 1m41s ago, so the latency is the load's" in load.reason
