"""A fight over replicas: counted, stopped at the limit, given up in steps, and remembered in
status rather than in memory."""

from __future__ import annotations

import pytest

from infertune.api.status import ReplicaFight
from infertune.controller.fights import (
    BACKOFF_S,
    FIGHT_LIMIT,
    MAX_BACKOFF_S,
    QUIET_S,
    Fight,
    Writers,
    autoscaling_rivals,
    blocked_by,
    fight_message,
    next_fight,
)
from infertune.scaling.state import format_time

T0 = 1_700_000_000.0


def reverted_at(*times: float, generation: int = 1) -> Fight | None:
    fight = None
    for t in times:
        fight = next_fight(fight, generation, True, t)
    return fight


def test_the_first_revert_is_counted_and_writing_goes_on() -> None:
    fight = reverted_at(T0)
    assert fight is not None and fight.reverts == 1 and not fight.blocks(T0 + 1)
    assert FIGHT_LIMIT == 2


def test_at_the_limit_writes_stop_for_the_backoff_then_are_tried_again() -> None:
    fight = reverted_at(T0, T0 + 30)
    assert fight is not None and fight.reverts == 2 and fight.since == T0
    assert fight.blocks(T0 + 30 + BACKOFF_S - 1)
    assert not fight.blocks(T0 + 30 + BACKOFF_S)
    # Nothing seen while blocked (no writes, so no reverts): the fight is carried unchanged.
    assert next_fight(fight, 1, False, T0 + 100) == fight


@pytest.mark.parametrize(("reverts", "backoff_s"), [
    (2, BACKOFF_S), (3, 2 * BACKOFF_S), (4, 4 * BACKOFF_S), (5, 8 * BACKOFF_S), (6, MAX_BACKOFF_S),
    (12, MAX_BACKOFF_S), (1100, MAX_BACKOFF_S),  # 2.0 ** 1024 overflowed, every revert
])
def test_each_revert_after_a_retry_doubles_the_backoff_up_to_a_cap(reverts: int,
                                                                   backoff_s: float) -> None:
    times = [T0 + 4000.0 * i for i in range(reverts)]  # each after the previous backoff
    fight = reverted_at(*times)
    assert fight is not None and fight.reverts == reverts
    assert fight.retry_at == times[-1] + backoff_s


def test_times_stored_by_a_clock_ahead_count_as_now() -> None:
    """A fight stored by an operator whose clock was a day ahead (or before the clock
    stepped back): its retryAt blocked writes for a day, not for the backoff, and its
    lastRevert kept it from ever being quiet until then."""
    ahead = T0 + 86400
    stored = Fight(2, ahead - 30, ahead, 1, ahead + BACKOFF_S)
    fight = next_fight(stored, 1, False, T0)
    assert fight is not None and fight.retry_at == T0 + BACKOFF_S
    assert fight.since == fight.last_revert == T0
    assert not fight.blocks(T0 + BACKOFF_S)
    assert next_fight(fight, 1, False, T0 + BACKOFF_S + QUIET_S) is None
    counted = next_fight(stored, 1, True, T0)  # one more revert, seen now
    assert counted is not None and counted.reverts == 3
    assert counted.retry_at == T0 + 2 * BACKOFF_S and counted.since == T0


def test_a_fight_survives_a_restart_through_status() -> None:
    fight = reverted_at(T0, T0 + 30)
    assert fight is not None
    stored = fight.to_json()
    ReplicaFight.model_validate(stored)  # the shape the CRD is generated from
    # A new operator process: nothing in memory, only what status holds.
    again = next_fight(Fight.from_json(stored), 1, False, T0 + 60)
    assert again == fight and again.blocks(T0 + 60)


def test_a_spec_change_ends_the_fight_and_a_later_revert_starts_counting_again() -> None:
    fight = reverted_at(T0, T0 + 30)
    assert next_fight(fight, 2, False, T0 + 60) is None
    restarted = next_fight(fight, 2, True, T0 + 60)
    assert restarted is not None and restarted.reverts == 1 and restarted.generation == 2
    assert not restarted.blocks(T0 + 61)


def test_a_fight_with_no_revert_for_the_quiet_time_is_over() -> None:
    once = reverted_at(T0)
    assert next_fight(once, 1, False, T0 + QUIET_S - 1) == once
    assert next_fight(once, 1, False, T0 + QUIET_S) is None
    blocked = reverted_at(T0, T0 + 30)
    assert blocked is not None and blocked.retry_at is not None
    # Quiet counts from the retry: writes have to hold for QUIET_S after they resume.
    assert next_fight(blocked, 1, False, blocked.retry_at + QUIET_S - 1) == blocked
    assert next_fight(blocked, 1, False, blocked.retry_at + QUIET_S) is None


@pytest.mark.parametrize("stored", [None, {}, {"reverts": 2}, {"reverts": "x", "since": 1},
                                    {"reverts": 2, "since": "yesterday", "lastRevert": "",
                                     "observedGeneration": 1},
                                    # Before year 1 in UTC: read, it raised when written back.
                                    {"reverts": 2, "since": "0001-01-01T00:00:00+01:00",
                                     "lastRevert": "2026-12-03T10:00:00Z",
                                     "observedGeneration": 1},
                                    {"reverts": 2, "since": 1700000000, "lastRevert": 1,
                                     "observedGeneration": 1}])
def test_a_missing_or_unreadable_block_is_no_fight(stored: dict[str, object] | None) -> None:
    assert Fight.from_json(stored) is None


def test_the_message_says_until_when_and_how_to_resume() -> None:
    fight = reverted_at(T0, T0 + 30)
    assert fight is not None
    message = fight_message(fight, "qwen")
    assert "qwen 2 times" in message and "/spec/replicas" in message
    assert format_time(T0 + 30 + BACKOFF_S) in message and "spec changes" in message


def test_other_tunings_autoscaling_the_same_deployment_block_every_one_of_them() -> None:
    """Two tunings on one Deployment each took the other's write for a revert, and after two
    of them blamed GitOps for a fight they were having with each other."""
    ref = {"targetRef": {"name": "qwen"}, "engine": "vllm"}
    entries = [{"name": "a", "spec": {**ref, "autoscaling": {"minReplicas": 5}}},
               {"name": "b", "spec": {**ref, "autoscaling": {"maxReplicas": 2}}},
               {"name": "c", "spec": {**ref, "autoscaling": {"enabled": False}}},
               {"name": "d", "spec": ref},  # tunes pods only: writes no replicas
               {"metadata": {"name": "e"}, "spec": {**ref, "autoscaling": {}}},  # stored
               # A dry-run trial writes no replicas: no rival of the one that scales.
               {"name": "f", "spec": {**ref, "mode": "DryRun", "autoscaling": {}}},
               # A spec that does not validate is never evaluated, so it never writes: it
               # held the valid tuning's writes until someone fixed or deleted it.
               {"name": "g", "spec": {**ref, "autoscaling": {"minReplicas": 5,
                                                             "maxReplicas": 2}}}]
    assert autoscaling_rivals(entries, "a") == ("b", "e")
    assert autoscaling_rivals(entries, "d") == ("a", "b", "e")
    assert autoscaling_rivals(entries, "f") == ("a", "b", "e")
    blocked = blocked_by("qwen", Writers(hpa="qwen-hpa", tunings=("b", "e")), None, T0)
    assert blocked is not None and blocked.reason == "SeveralTunings"
    assert blocked.message.startswith("InferenceTunings b, e also autoscale qwen")
    alone = blocked_by("qwen", Writers(tunings=autoscaling_rivals(entries[:1], "a")), None, T0)
    assert alone is None


def test_the_quiet_time_waits_out_a_write_the_rate_limits_hold_back() -> None:
    """With a 15 min period the next write comes 15 min after a revert; a 10 min quiet time
    ended the fight before it, so no revert was ever the second."""
    once = reverted_at(T0)
    assert next_fight(once, 1, False, T0 + QUIET_S + 1, hold_s=900.0) == once
    assert next_fight(once, 1, False, T0 + QUIET_S + 900.0, hold_s=900.0) is None
