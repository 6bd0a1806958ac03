"""What the autoscaler keeps between evaluations: only what can still change a decision."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infertune.api.scaling import ScalingRules
from infertune.api.units import Duration
from infertune.scaling.behavior import stabilize
from infertune.scaling.state import (
    Breach,
    Recommendation,
    ScaleEvent,
    ScalingState,
    Serving,
    parse_time,
    stored_time,
)

NOW = 1_700_000_000.0


def rules(stabilization_s: int) -> ScalingRules:
    return ScalingRules(pods=4, percent=100, period=Duration("15s"),
                        stabilization=Duration(f"{stabilization_s}s"))


def record(state: ScalingState, now: float, replicas: int, keep_s: float = 300) -> ScalingState:
    return state.recorded(now, Recommendation(now, replicas), keep_s, 15)


def test_a_steady_recommendation_is_kept_once() -> None:
    state = ScalingState()
    for i in range(40):
        state = record(state, NOW + 15 * i, 3)
    assert state.recommendations == (Recommendation(NOW + 15 * 39, 3),)


def test_a_peak_is_kept_until_it_leaves_the_window() -> None:
    state = record(record(ScalingState(), NOW, 6), NOW + 15, 2)
    assert [r.replicas for r in state.recommendations] == [6, 2]
    later = record(state, NOW + 300, 2)
    assert [r.replicas for r in later.recommendations] == [2]  # the 6 is 300s old now


def test_a_recommendation_beaten_both_ways_by_later_ones_is_dropped() -> None:
    state = ScalingState()
    for i, replicas in enumerate([4, 5, 3, 4]):
        state = record(state, NOW + i, replicas)
    # The first 4 is matched by the last (both ways); 5 and 3 stay as the window's extremes.
    assert [r.replicas for r in state.recommendations] == [5, 3, 4]


def test_nothing_is_kept_when_both_windows_are_zero() -> None:
    assert record(ScalingState(), NOW, 3, keep_s=0).recommendations == ()


def test_old_scale_events_leave_after_their_period() -> None:
    state = ScalingState((), (ScaleEvent(NOW - 20, 2), ScaleEvent(NOW - 5, -1)))
    assert record(state, NOW, 3).scale_events == (ScaleEvent(NOW - 5, -1),)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(1, 120), st.integers(0, 12)), min_size=1, max_size=40),
    up_s=st.sampled_from([0, 15, 60, 300]),
    down_s=st.sampled_from([0, 15, 60, 300]),
    current=st.integers(1, 12),
    desired=st.integers(0, 12),
)
def test_stabilization_reads_the_same_from_the_kept_state_as_from_the_whole_history(
        steps: list[tuple[int, int]], up_s: int, down_s: int, current: int,
        desired: int) -> None:
    up, down = rules(up_s), rules(down_s)
    keep = max(up_s, down_s)
    state, history, now = ScalingState(), list[Recommendation](), NOW
    for gap, replicas in steps:
        now += gap
        # The engine stabilizes against the state recorded so far, then records.
        assert stabilize(current, desired, state.recommendations, up, down, now) == \
            stabilize(current, desired, tuple(history), up, down, now)
        state = record(state, now, replicas, keep_s=keep)
        history.append(Recommendation(now, replicas))
    assert len(state.recommendations) <= len(history)


def test_the_most_a_state_can_hold_fits_in_the_status_schema() -> None:
    """Every second a recommendation that no later one matches (rising by one) and a scale
    event, for longer than the longest stabilization window and rate-limit period the spec
    allows: the status the API server would store still validates. With 500 items allowed, a
    1s interval scaling every second for a 30m period outgrew it, and every status patch was
    refused after the replicas were written."""
    from infertune.api.scaling import MAX_PERIOD_S, MAX_STABILIZATION_S
    from infertune.api.status import MAX_RECOMMENDATIONS, MAX_SCALE_EVENTS, AutoscalingState

    state = ScalingState()
    for second in range(MAX_STABILIZATION_S + 120):
        now = NOW + second
        state = ScalingState(state.recommendations,
                             (*state.scale_events, ScaleEvent(now, 1)))
        state = state.recorded(now, Recommendation(now, second), MAX_STABILIZATION_S,
                               MAX_PERIOD_S)
    assert len(state.recommendations) == MAX_RECOMMENDATIONS - 1
    assert len(state.scale_events) == MAX_SCALE_EVENTS - 1
    AutoscalingState.model_validate(state.to_json())


def test_a_stored_entry_that_cannot_be_read_is_left_out_not_raised() -> None:
    """A time edited by hand raised in every evaluation: the tuning was never evaluated
    again, and ScalingActive went on saying Scaling."""
    good = {"time": "2026-12-03T10:00:00Z", "replicas": 3}
    state = ScalingState.from_json({
        "recommendations": [good, {"time": "yesterday", "replicas": 2}, {"replicas": 1}, None],
        "scaleEvents": [{"time": "2026-12-03T10:00:00Z", "change": "two"}],
        "metricsMissingSince": "soon", "serving": {"since": "bad", "replicas": 1, "of": 2}})
    assert [r.replicas for r in state.recommendations] == [3]
    assert state.scale_events == () and state.metrics_missing_since is None
    assert state.serving is None


@pytest.mark.parametrize("time", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_time_that_could_not_be_written_back_is_left_out(time: str) -> None:
    """A time before year 1 or after 9999 in UTC parses, and raised where it was written back
    (serving.since is carried over while the replicas stay): every evaluation failed."""
    state = ScalingState.from_json({
        "recommendations": [{"time": time, "replicas": 2}],
        "serving": {"since": time, "replicas": 4, "of": 4}})
    assert state.recommendations == () and state.serving is None
    assert stored_time(time) is None
    ScalingState(serving=Serving(4, 4, NOW)).to_json()  # the usual case still writes


def test_latency_breaches_round_trip_and_a_broken_one_is_left_out() -> None:
    from infertune.api.status import AutoscalingState

    state = ScalingState(breaches=(Breach(NOW - 60, 20.5, 2, "75ms", 0.99, "Cured", 0.2, 3.5,
                                          NOW - 300, overloaded=NOW - 60),
                                   Breach(NOW, 30.0, 2, "75ms", 0.99, latency=0.15, since=NOW)),
                         serving=Serving(2, 3, NOW - 30, NOW - 90))
    stored = state.to_json()
    assert stored["latencyBreaches"][1] == {
        "time": "2023-11-14T22:13:20Z", "requestRate": 30.0, "replicas": 2, "target": "75ms",
        "quantile": 0.99, "outcome": "Open", "latencySeconds": 0.15, "healthyPerReplica": 0.0,
        "since": "2023-11-14T22:13:20Z", "doubted": None, "queueOverloaded": None}
    assert stored["latencyBreaches"][0]["queueOverloaded"] == "2023-11-14T22:12:20Z"
    assert stored["serving"]["changed"] == "2023-11-14T22:11:50Z"
    AutoscalingState.model_validate(stored)
    assert ScalingState.from_json(json.loads(json.dumps(stored))) == state
    good = {"time": "2026-12-03T10:00:00Z", "requestRate": 5, "replicas": 1, "target": "75ms",
            "quantile": 0.99, "outcome": "Open", "latencySeconds": 0.1,
            "healthyPerReplica": 0, "since": "2026-12-03T10:00:00Z"}
    for broken in ({**good, "time": "soon"}, {**good, "requestRate": 0},
                   {**good, "requestRate": "NaN"}, {**good, "replicas": 0},
                   {**good, "requestRate": 5e-324, "replicas": 2},  # 0 per replica
                   {**good, "target": "soon"}, {**good, "outcome": "Maybe"},
                   {**good, "latencySeconds": -1}, {**good, "latencySeconds": "inf"},
                   {**good, "healthyPerReplica": -1}, {**good, "since": "then"},
                   {**good, "doubted": "then"}, {**good, "queueOverloaded": "then"},
                   {k: v for k, v in good.items() if k != "quantile"}, "a breach"):
        read = ScalingState.from_json({"recommendations": [{"time": good["time"], "replicas": 3}],
                                       "latencyBreaches": [good, broken]})
        assert len(read.breaches) == 1 and [r.replicas for r in read.recommendations] == [3], \
            broken
    assert ScalingState.from_json({"latencyBreaches": {"a": 1}}).breaches == ()
    # Stored before serving said when it changed: not known.
    older = ScalingState.from_json({"serving": {"replicas": 2, "of": 2, "since": good["time"]}})
    assert older.serving is not None and older.serving.changed is None
    # A time in the future (a clock that stepped back) counts as now.
    future = ScalingState(breaches=(Breach(NOW + 600, 20.0, 1, "75ms", 0.99, since=NOW + 500,
                                           doubted=NOW + 550),),
                          serving=Serving(1, 1, NOW + 60, NOW + 60)).as_of(NOW)
    breach = future.breaches[0]
    assert (breach.time, breach.since, breach.doubted) == (NOW, NOW, NOW)
    assert future.serving == Serving(1, 1, NOW, NOW)
    doubted = ScalingState(breaches=(Breach(NOW - 60, 20.0, 1, "75ms", 0.99, since=NOW - 60,
                                            doubted=NOW + 550),)).as_of(NOW)
    assert doubted.breaches[0].doubted == NOW
    # An entry written without `since` breached at its `time`.
    undated = {k: v for k, v in good.items() if k != "since"}
    assert ScalingState.from_json({"latencyBreaches": [undated]}).breaches[0].breached_at == \
        parse_time(good["time"])
    # Kept through the pruning of recommendations and scale events.
    kept = state.recorded(NOW + 15, Recommendation(NOW + 15, 2), 300, 15)
    assert kept.breaches == state.breaches


def test_the_queue_seen_round_trips_and_one_that_cannot_be_read_is_left_out() -> None:
    from infertune.api.status import AutoscalingState
    from infertune.scaling.state import QueueSeen

    state = ScalingState(recommendations=(Recommendation(NOW, 3),),
                         queue=QueueSeen(NOW, 96.5, 3, 4, NOW - 30, 120.0))
    stored = state.to_json()
    assert stored["queue"] == {"time": "2023-11-14T22:13:20Z", "waiting": 96.5, "pods": 3,
                               "replicas": 4, "fell": "2023-11-14T22:12:50Z",
                               "fallingFrom": 120.0}
    AutoscalingState.model_validate(stored)
    assert ScalingState.from_json(json.loads(json.dumps(stored))) == state
    # Kept through the pruning of recommendations, and with new breaches.
    assert state.recorded(NOW + 15, Recommendation(NOW + 15, 2), 300, 15).queue == state.queue
    assert state.with_breaches(()).queue == state.queue
    good = stored["queue"]
    for broken in ({**good, "time": "soon"}, {**good, "waiting": -1}, {**good, "waiting": "nan"},
                   {**good, "pods": 0}, {**good, "replicas": -1}, {**good, "fell": "then"},
                   {**good, "fallingFrom": -1}, {**good, "fallingFrom": "inf"},
                   {k: v for k, v in good.items() if k != "pods"}, "a queue"):
        read = ScalingState.from_json({**stored, "queue": broken})
        assert read.queue is None and read.recommendations == state.recommendations, broken
    # Stored before the queue was kept, or never seen fall.
    assert ScalingState.from_json({"recommendations": []}).queue is None
    assert ScalingState.from_json({"queue": {**good, "fell": None, "fallingFrom": None}}) \
        .queue == QueueSeen(NOW, 96.5, 3, 4)
    # Times in the future (a clock that stepped back) count as now.
    ahead = ScalingState(queue=QueueSeen(NOW + 60, 10.0, 1, 1, NOW + 45, 12.0)).as_of(NOW)
    assert ahead.queue == QueueSeen(NOW, 10.0, 1, 1, NOW, 12.0)


def test_what_a_replica_carried_round_trips_and_one_that_cannot_be_read_is_left_out() -> None:
    from infertune.api.status import AutoscalingState
    from infertune.scaling.state import Carried, QueueSeen

    state = ScalingState(recommendations=(Recommendation(NOW, 3),),
                         queue=QueueSeen(NOW, 0.0, 3, 3),
                         carried=Carried(7.25, NOW - 30, "75ms", 0.99))
    stored = state.to_json()
    assert stored["carried"] == {"perReplica": 7.25, "time": "2023-11-14T22:12:50Z",
                                 "target": "75ms", "quantile": 0.99, "failed": None}
    AutoscalingState.model_validate(stored)
    assert ScalingState.from_json(json.loads(json.dumps(stored))) == state
    # Kept through the pruning of recommendations, with new breaches and a new queue reading.
    assert state.recorded(NOW + 15, Recommendation(NOW + 15, 2), 300, 15).carried == \
        state.carried
    assert state.with_breaches(()).carried == state.carried
    good = stored["carried"]
    for broken in ({**good, "perReplica": 0}, {**good, "perReplica": "inf"},
                   {**good, "time": "then"}, {**good, "target": "fast"},
                   {k: v for k, v in good.items() if k != "quantile"}, "7.25"):
        read = ScalingState.from_json({**stored, "carried": broken})
        assert read.carried is None and read.queue == state.queue, broken
    # Stored before it was kept.
    assert ScalingState.from_json({"recommendations": []}).carried is None
    # A time in the future (a clock that stepped back) counts as now.
    assert ScalingState(carried=Carried(1.0, NOW + 60, "75ms", 0.99)).as_of(NOW).carried == \
        Carried(1.0, NOW, "75ms", 0.99)
