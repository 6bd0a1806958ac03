"""The operator's batching of autoscaling fetches: one fetch per interval slot for every tuning
due in it, parsed specs cached per generation. The source here records what it is asked;
the Prometheus side of a fetch is tested against the real server in test_prometheus_adapter.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from infertune.controller.autoscaling import AutoscalingSettings, signals_for, signals_if_due
from infertune.kube.lease import ALWAYS, Leader
from infertune.metrics.source import MetricsTarget
from infertune.scaling.signals import NOT_FETCHED, NOT_FETCHED_WINDOW, TargetSignals
from infertune.scaling.state import format_time

T0 = 1_700_000_010.0  # a multiple of 15 s plus 0 s: the start of a 15 s slot


class RecordingSource:
    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def fetch(self, targets: Sequence[MetricsTarget], now: float) -> Mapping[str, TargetSignals]:
        self.asked.append([t.key for t in targets])
        return {t.key: TargetSignals(NOT_FETCHED_WINDOW, NOT_FETCHED, NOT_FETCHED)
                for t in targets}


def entry(i: int, interval: str = "15s", generation: int = 1) -> dict[str, Any]:
    return {"name": f"t{i}", "uid": f"uid-{i}", "generation": generation,
            "spec": {"targetRef": {"name": f"llm-{i}"}, "engine": "vllm",
                     "autoscaling": {"interval": interval}}}


def index(*entries: dict[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    return {("ns", e["spec"]["targetRef"]["name"]): [e] for e in entries}


def tick(settings: AutoscalingSettings, idx: dict[tuple[str, str], list[dict[str, Any]]],
         name: str, now: float) -> bool:
    """What the timer does for one tuning before it decides; True when it was due."""
    e = next(e for entries in idx.values() for e in entries if e["name"] == name)
    parsed = settings.parse("ns", name, e["uid"], e["generation"], e["spec"])
    assert parsed is not None
    listed = settings.listing(idx, parsed, now)  # type: ignore[arg-type]
    got = signals_if_due(settings, f"ns/{name}", parsed, listed, now)
    return got is not None


def test_tunings_sharing_an_interval_cost_one_fetch_per_slot() -> None:
    source = RecordingSource()
    settings = AutoscalingSettings(source=source)
    idx = index(*(entry(i) for i in range(200)))
    for second in range(30):  # two 15 s slots; every timer ticks once a second
        for i in range(200):
            tick(settings, idx, f"t{i}", T0 + second + i / 400)
    assert len(source.asked) == 2
    assert all(len(keys) == 200 for keys in source.asked)


def test_after_the_clock_steps_back_each_slot_fetches_anew() -> None:
    """The clock stepped back 2 minutes (an NTP step, a resumed VM): the batch fetched at T0
    was "fetched in this slot" for every slot until T0 came again, and 8 evaluations decided
    on signals 2 minutes old, a breach or a spike since then unseen."""
    source = RecordingSource()
    settings = AutoscalingSettings(source=source)
    idx = index(entry(0), entry(1))
    assert tick(settings, idx, "t0", T0) and tick(settings, idx, "t1", T0 + 0.1)
    assert len(source.asked) == 1
    for k in range(1, 9):
        now = T0 - 120 + 15 * k
        assert tick(settings, idx, "t0", now) and tick(settings, idx, "t1", now + 0.1)
        assert len(source.asked) == 1 + k, k  # one fetch per slot, for both
        assert source.asked[-1] == ["ns/t0", "ns/t1"]


def test_a_tuning_evaluates_once_per_slot_of_its_own_interval() -> None:
    settings = AutoscalingSettings(source=RecordingSource())
    idx = index(entry(0, "15s"), entry(1, "5s"))
    ticks = [T0 + s for s in range(30)]
    assert sum(tick(settings, idx, "t0", t) for t in ticks) == 2
    assert sum(tick(settings, idx, "t1", t) for t in ticks) == 6


def test_a_spec_is_parsed_again_only_when_its_generation_changes() -> None:
    settings = AutoscalingSettings(source=RecordingSource())
    first = settings.parse("ns", "t0", "uid-0", 1, entry(0)["spec"])
    assert first is not None and first.interval_s == 15.0
    assert settings.parse("ns", "t0", "uid-0", 1, entry(0)["spec"]) is first
    changed = settings.parse("ns", "t0", "uid-0", 2, entry(0, "30s")["spec"])
    assert changed is not None and changed.interval_s == 30.0
    recreated = settings.parse("ns", "t0", "uid-new", 2, entry(0)["spec"])
    assert recreated is not None and recreated.interval_s == 15.0


def test_an_invalid_spec_is_skipped_and_not_fetched() -> None:
    source = RecordingSource()
    settings = AutoscalingSettings(source=source)
    bad = entry(1)
    bad["spec"]["autoscaling"] = {"interval": "soon"}
    idx = index(entry(0), bad)
    assert settings.parse("ns", "t1", "uid-1", 1, bad["spec"]) is None
    tick(settings, idx, "t0", T0)
    assert source.asked == [["ns/t0"]]


def test_deleted_tunings_are_forgotten() -> None:
    settings = AutoscalingSettings(source=RecordingSource())
    tick(settings, index(entry(0), entry(1)), "t0", T0)
    assert set(settings.batch) == {"ns/t0", "ns/t1"}
    settings.written["ns/t1"] = 3
    tick(settings, index(entry(0)), "t0", T0 + 15)
    assert set(settings.batch) == {"ns/t0"}
    assert "ns/t1" not in settings.parsed and "ns/t1" not in settings.last_slot
    # A tuning created again under the same name does not inherit the old one's last write
    # (a difference from it would count as a revert).
    assert "ns/t1" not in settings.written


def test_the_tunings_are_listed_once_per_slot_and_a_newer_one_joins_the_next_batch() -> None:
    """The listing is taken on the event loop once per slot. A tuning created after its slot's
    batch waits for the next slot instead of a query of its own, so creating many tunings
    does not add queries."""
    source = RecordingSource()
    settings = AutoscalingSettings(source=source)
    idx = index(entry(0), entry(1))
    tick(settings, idx, "t0", T0)
    first = settings.listings[15.0][1]
    tick(settings, idx, "t1", T0 + 1)
    assert settings.listings[15.0][1] is first  # not listed again within the slot
    idx.update(index(entry(2)))  # created in the same slot, after the listing and the batch
    assert not tick(settings, idx, "t2", T0 + 2)
    assert source.asked == [["ns/t0", "ns/t1"]]
    assert tick(settings, idx, "t2", T0 + 15)  # the next slot lists and fetches all three
    assert source.asked[1] == ["ns/t2", "ns/t0", "ns/t1"]
    assert tick(settings, idx, "t0", T0 + 16)  # due, and served from that batch
    assert len(source.asked) == 2


def test_tunings_that_marked_their_slot_while_another_fetched_are_in_its_batch() -> None:
    """Workers mark their slot before they wait for the lock; the batch is chosen by what was
    fetched, so they find their signals in it rather than fetching one by one."""
    source = RecordingSource()
    settings = AutoscalingSettings(source=source)
    idx = index(*(entry(i) for i in range(5)))
    parsed = {f"t{i}": settings.parse("ns", f"t{i}", f"uid-{i}", 1, entry(i)["spec"])
              for i in range(5)}
    for i in range(1, 5):  # these four are waiting for the lock, their slot already marked
        settings.last_slot[f"ns/t{i}"] = int(T0 // 15)
    tick(settings, idx, "t0", T0)
    for i in range(1, 5):
        listed = settings.listing(idx, parsed[f"t{i}"], T0)  # type: ignore[arg-type]
        got = signals_for(settings, f"ns/t{i}", parsed[f"t{i}"], listed,  # type: ignore[arg-type]
                          T0 + 0.1)
        assert got is not None
    assert source.asked == [["ns/t0", "ns/t1", "ns/t2", "ns/t3", "ns/t4"]]


def test_a_loop_sleeps_until_its_next_slot_once_it_has_evaluated() -> None:
    settings = AutoscalingSettings(source=RecordingSource())
    parsed = settings.parse("ns", "t0", "uid-0", 1, entry(0)["spec"])
    assert parsed is not None
    assert settings.until_due("ns/t0", parsed, T0 + 4) == 0  # never evaluated: due now
    assert tick(settings, index(entry(0)), "t0", T0 + 4)
    wait = settings.until_due("ns/t0", parsed, T0 + 4)
    assert 11 < wait < 11.1  # the next 15 s slot starts at T0 + 15
    assert not settings.due("ns/t0", parsed, T0 + 4 + wait - 0.01)
    assert settings.due("ns/t0", parsed, T0 + 4 + wait)


class StatusApi:
    """Stands in for CustomObjectsApi's status read (a plain call): what the API server holds."""

    def __init__(self, status: dict[str, Any], version: str = "42") -> None:
        # The tuning as _passes evaluates it: generation 1, with spec.autoscaling.
        self.stored = {"metadata": {"resourceVersion": version, "generation": 1},
                       "spec": entry(0)["spec"], "status": status}
        self.reads = 0

    def __call__(self) -> StatusApi:
        return self

    def get_namespaced_custom_object_status(self, *args: Any) -> dict[str, Any]:
        self.reads += 1
        return self.stored


def _passes(monkeypatch: pytest.MonkeyPatch, api: StatusApi,
            passes: list[tuple[float, dict[str, Any]]],
            leader: Leader = ALWAYS) -> list[tuple[float, dict[str, Any], str | None]]:
    """Runs `_evaluate_if_due` for tuning t0 at each (clock, kopf's copy of the status) and
    returns what `evaluate` was called with: (time, status, resourceVersion)."""
    from infertune.controller import autoscaling

    decided: list[tuple[float, dict[str, Any], str | None]] = []
    monkeypatch.setattr(autoscaling.client, "CustomObjectsApi", api)
    monkeypatch.setattr(autoscaling, "evaluate",
                        lambda *args, **_: decided.append((args[9], args[4], args[10])))
    settings = AutoscalingSettings(source=RecordingSource(), leader=leader)
    idx = index(entry(0))
    parsed = settings.parse("ns", "t0", "uid-0", 1, entry(0)["spec"])
    assert parsed is not None
    for clock, status in passes:
        monkeypatch.setattr(autoscaling, "time", types.SimpleNamespace(time=lambda at=clock: at))
        listed = settings.listing(idx, parsed, clock)  # type: ignore[arg-type]
        autoscaling._evaluate_if_due(settings, "ns/t0", parsed, listed, "ns", "t0", 1, status,
                                     "7", None, None)  # type: ignore[arg-type]
    return decided


def _evaluated(at: float) -> dict[str, Any]:
    return {"autoscaling": {"evaluated": format_time(at)}}


def test_a_pass_close_to_its_slot_start_evaluates_as_of_the_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that waited for a worker read Prometheus and stamped its state when it ran, so
    rate-limit periods fell differently than for a pass on time (with period = interval, a
    scale event stamped 10 ms later could double the next step or not)."""
    api = StatusApi(_evaluated(T0 - 30))
    decided = _passes(monkeypatch, api, [(T0 + 0.4, _evaluated(T0 - 30)),
                                          (T0 + 15 + 4.9, _evaluated(T0))])
    assert [at for at, _, _ in decided] == [T0, T0 + 15]


def test_a_late_pass_evaluates_as_of_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator down at the slot's start, or a tuning created in the middle of a 30m
    slot, would otherwise decide on data up to an interval old (before its pods existed)."""
    decided = _passes(monkeypatch, StatusApi({}), [(T0 + 9.5, {})])
    assert [at for at, _, _ in decided] == [T0 + 9.5]


def test_a_late_pass_decides_now_on_the_batch_read_at_the_slot_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """t0 fetched the slot's batch at its start; t1's pass ran 6 s later (a slow fetch held
    the workers). t1 decides as of its own clock (its scale event then counts in the rate
    limits from when it is written), on signals that say when they were read, so the queue
    window ending at the slot start is not taken for a stale one."""
    from infertune.controller import autoscaling

    class StampingSource(RecordingSource):
        def fetch(self, targets: Sequence[MetricsTarget],
                  now: float) -> Mapping[str, TargetSignals]:
            return {k: v._replace(read_at=now) for k, v in super().fetch(targets, now).items()}

    decided: list[tuple[str, float, float | None]] = []
    monkeypatch.setattr(autoscaling.client, "CustomObjectsApi", StatusApi({}))
    monkeypatch.setattr(autoscaling, "evaluate", lambda *args, **_: decided.append(
        (args[1], args[9], args[5].read_at)))
    source = StampingSource()
    settings = AutoscalingSettings(source=source)
    idx = index(entry(0), entry(1))
    for name, clock in (("t0", T0 + 0.4), ("t1", T0 + 6.0)):
        e = entry(int(name[1]))
        parsed = settings.parse("ns", name, e["uid"], 1, e["spec"])
        assert parsed is not None
        monkeypatch.setattr(autoscaling, "time", types.SimpleNamespace(time=lambda at=clock: at))
        listed = settings.listing(idx, parsed, clock)  # type: ignore[arg-type]
        autoscaling._evaluate_if_due(settings, f"ns/{name}", parsed, listed, "ns", name, 1, {},
                                     "7", None, None)  # type: ignore[arg-type]
    assert len(source.asked) == 1
    assert decided == [("t0", T0, T0), ("t1", T0 + 6.0, T0)]


def test_a_slot_the_status_says_was_evaluated_is_not_evaluated_again() -> None:
    settings = AutoscalingSettings(source=RecordingSource())
    parsed = settings.parse("ns", "t0", "uid-0", 1, entry(0)["spec"])
    assert parsed is not None

    def status(stamp: object) -> dict[str, Any]:
        return {"autoscaling": {"evaluated": stamp}}

    now = T0 + 7
    assert not settings.stored_in_slot("ns/t0", parsed, now, {})
    assert not settings.stored_in_slot("ns/t0", parsed, now, status(format_time(T0 - 15)))
    assert not settings.stored_in_slot("ns/t0", parsed, now, status(format_time(T0 + 15)))
    assert not settings.stored_in_slot("ns/t0", parsed, now, status("yesterday"))
    assert not settings.stored_in_slot("ns/t0", parsed, now, status(5))
    assert settings.due("ns/t0", parsed, now)
    assert settings.stored_in_slot("ns/t0", parsed, now, status(format_time(T0)))
    assert not settings.due("ns/t0", parsed, now)  # the loop sleeps until T0 + 15
    assert settings.due("ns/t0", parsed, T0 + 15)


def test_a_revert_while_the_operator_restarted_is_still_a_revert() -> None:
    """The replicas the operator wrote were kept in memory only: written, reverted by GitOps
    while the operator restarted, and the new process saw no revert, wrote again, and a
    crash-looping operator never stopped fighting."""
    from infertune.controller.autoscaling import _reverted

    stored = {"autoscaling": {"writtenReplicas": 6, "writtenTarget": "llm"}}
    fresh = AutoscalingSettings(source=RecordingSource())
    assert _reverted(fresh, "ns/t0", 4, stored, "llm")  # 4 put back while it was down
    assert not _reverted(fresh, "ns/t0", 4, stored, "llm")  # seen once, stale status aside
    standing = AutoscalingSettings(source=RecordingSource())
    assert not _reverted(standing, "ns/t0", 6, stored, "llm")
    assert not _reverted(standing, "ns/t0", 6, {}, "llm")  # memory first
    for junk in (True, "6", None):
        assert not _reverted(AutoscalingSettings(source=RecordingSource()), "ns/t0", 4,
                             {"autoscaling": {"writtenReplicas": junk}}, "llm")
    # Stored before writtenTarget existed: taken as the same target.
    assert _reverted(AutoscalingSettings(source=RecordingSource()), "ns/t0", 4,
                     {"autoscaling": {"writtenReplicas": 6}}, "llm")


def test_the_count_of_a_new_target_is_no_revert_of_what_the_old_one_was_given() -> None:
    """spec.targetRef moved from llm (6 written) to llm-v2 at 3 replicas: the 3 was taken
    for a revert of the 6, and one real revert later the tuning stopped with ReplicaFight."""
    from infertune.controller.autoscaling import _reverted

    stored = {"autoscaling": {"writtenReplicas": 6, "writtenTarget": "llm"}}
    fresh = AutoscalingSettings(source=RecordingSource())
    assert not _reverted(fresh, "ns/t0", 3, stored, "llm-v2")
    running = AutoscalingSettings(source=RecordingSource())
    assert not _reverted(running, "ns/t0", 6, stored, "llm")  # in memory: 6 for llm
    assert not _reverted(running, "ns/t0", 3, stored, "llm-v2")


def test_with_autoscaling_disabled_the_replicas_are_the_users() -> None:
    """enabled: false writes nothing, so a person scaling the Deployment is no revert, and
    nothing is held against them once autoscaling is enabled again."""
    from infertune.controller.autoscaling import _reverted

    stored = {"autoscaling": {"writtenReplicas": 6, "writtenTarget": "llm"}}
    settings = AutoscalingSettings(source=RecordingSource())
    assert not _reverted(settings, "ns/t0", 9, stored, "llm", writes=False)
    assert not _reverted(settings, "ns/t0", 5, stored, "llm")  # enabled again: nothing held


def test_a_count_set_while_spec_autoscaling_was_removed_is_no_revert_once_it_is_back() -> None:
    """The operator wrote 4; spec.autoscaling was removed (kopf stops the loop, and the
    controller clears status.autoscaling), the user scaled to 2, and autoscaling came back:
    the 2 was taken for a revert of the 4 the process still remembered, with a
    ReplicasReverted Warning and a step toward a ReplicaFight."""
    from infertune.controller.autoscaling import _reverted

    settings = AutoscalingSettings(source=RecordingSource())
    settings.autoscaled.add("ns/t0")
    assert not _reverted(settings, "ns/t0", 2, {}, "llm")
    settings.wrote("ns/t0", 4, 2)
    settings.stopped("ns/t0")  # the loop's end, as kopf stops it
    assert not _reverted(settings, "ns/t0", 2, {}, "llm")
    # A loop that keeps running still defends its count.
    settings.autoscaled.add("ns/t0")
    settings.wrote("ns/t0", 4, 2)
    assert _reverted(settings, "ns/t0", 2, {}, "llm")


def test_a_pass_that_outlives_its_loop_forgets_what_it_stored(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf lets a pass in its worker thread finish after the loop ended (spec.autoscaling
    removed): the count it took as written, stored after the loop's end had forgotten the
    rest, was a revert once autoscaling was back and the user had scaled meanwhile."""
    from infertune.controller import autoscaling
    from infertune.controller.autoscaling import _reverted

    def evaluate(*args: Any, **_: Any) -> None:
        settings.stopped("ns/t0")  # the loop ends while the pass decides ...
        settings.written["ns/t0"] = 4  # ... and the pass stores its count (`_reverted`)
        settings.written_to["ns/t0"] = "llm"

    monkeypatch.setattr(autoscaling.client, "CustomObjectsApi", StatusApi({}))
    monkeypatch.setattr(autoscaling, "evaluate", evaluate)
    monkeypatch.setattr(autoscaling, "time", types.SimpleNamespace(time=lambda: T0 + 0.4))
    settings = AutoscalingSettings(source=RecordingSource())
    parsed = settings.parse("ns", "t0", "uid-0", 1, entry(0)["spec"])
    assert parsed is not None
    listed = settings.listing(index(entry(0)), parsed, T0 + 0.4)  # type: ignore[arg-type]
    autoscaling._evaluate_if_due(settings, "ns/t0", parsed, listed, "ns", "t0", 1, {}, "7",
                                 None, None)  # type: ignore[arg-type]
    assert "ns/t0" not in settings.written
    assert not _reverted(settings, "ns/t0", 2, {}, "llm")  # the user's 2, once it is back
    # A pass whose loop goes on keeps what it stored.
    monkeypatch.setattr(autoscaling, "evaluate",
                        lambda *args, **_: settings.written.__setitem__("ns/t0", 4))
    monkeypatch.setattr(autoscaling, "time", types.SimpleNamespace(time=lambda: T0 + 15.4))
    listed = settings.listing(index(entry(0)), parsed, T0 + 15.4)  # type: ignore[arg-type]
    autoscaling._evaluate_if_due(settings, "ns/t0", parsed, listed, "ns", "t0", 1, {}, "7",
                                 None, None)  # type: ignore[arg-type]
    assert settings.written.get("ns/t0") == 4


def test_a_disabled_tuning_is_in_the_batch_and_evaluated_every_slot() -> None:
    """enabled: false still reads and reports the signals (and hands the replicas to the
    user). It was left out of the listing, so when another tuning fetched first in the slot it
    got no signals at all: never evaluated, its status stale, and a user's scale while it was
    disabled counted as a revert once enabled again."""
    source = RecordingSource()
    settings = AutoscalingSettings(source=source)
    disabled = entry(1)
    disabled["spec"]["autoscaling"]["enabled"] = False
    idx = index(entry(0), disabled)
    for slot in range(3):
        now = T0 + 15 * slot
        assert tick(settings, idx, "t0", now)  # the enabled one fetches first
        assert tick(settings, idx, "t1", now), slot
    assert source.asked == [["ns/t0", "ns/t1"]] * 3


def test_signals_read_for_an_older_spec_are_not_handed_to_the_new_one() -> None:
    """The spec changed (another queue target) after its slot's batch was fetched: the
    engine got a window read against the old target, raised, and the evaluation was lost
    with a traceback. It now waits for the next slot's batch, read for the new spec."""
    source = RecordingSource()
    settings = AutoscalingSettings(source=source)
    assert tick(settings, index(entry(0), entry(1)), "t1", T0)
    changed = entry(0, generation=2)
    changed["spec"]["autoscaling"]["queue"] = {"targetPerReplica": 8}
    idx = index(changed, entry(1))
    assert not tick(settings, idx, "t0", T0 + 5)  # due, but no signals for this spec yet
    assert source.asked == [["ns/t1", "ns/t0"]]
    assert tick(settings, idx, "t0", T0 + 15)
    assert source.asked[-1][0] == "ns/t0"
    parsed = settings.parse("ns", "t0", "uid-0", 2, changed["spec"])
    assert parsed is not None and settings.fetched_for["ns/t0"] is parsed.target


def test_the_status_is_read_again_when_kopfs_copy_may_be_behind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a process's first evaluation of a tuning (in a rolling upgrade the operator it
    replaces may have just written: its copy took that write for a revert), and when kopf's
    copy predates this process's own last write (decided from it, the state written back
    dropped that evaluation's scale event)."""
    api = StatusApi(_evaluated(T0 - 30))
    stale, current = _evaluated(T0 - 45), _evaluated(T0 + 15)
    decided = _passes(monkeypatch, api, [(T0 + 1, stale), (T0 + 16, stale), (T0 + 31, current)])
    assert api.reads == 2  # the first pass, and the second (its copy older than the first)
    assert [(status, version) for _, status, version in decided] == [
        (api.stored["status"], "42"), (api.stored["status"], "42"), (current, "7")]


def test_a_slot_the_replaced_operator_evaluated_is_left_to_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Both operators of a rolling upgrade wake at the slot start; the new one's copy of the
    status does not show the old one's evaluation yet, the API server's does."""
    api = StatusApi(_evaluated(T0))
    assert _passes(monkeypatch, api, [(T0 + 0.2, _evaluated(T0 - 15))]) == []
    assert api.reads == 1


def test_a_slot_start_lies_in_its_own_slot_for_any_interval() -> None:
    """floor(k x 1.679 / 1.679) is k - 1 for some k in floats: the pass then took its slot
    for evaluated and its loop spun until the next slot, which was not evaluated either."""
    from infertune.controller.autoscaling import slot_start

    checked = 0
    for interval in (1.679, 1.1, 2.3, 7.7, 13.3, 45.7, 15.0):
        for k in range(1_060_154_854 // 100, 1_060_154_854 // 100 + 3000):
            clock = k * interval + 0.005
            slot = math.floor(clock / interval)
            start = slot_start(clock, interval)
            assert math.floor(start / interval) == slot and start <= clock
            assert start - slot * interval < 1e-6
            checked += 1
    assert checked == 21000


class ChangingStatusApi(StatusApi):
    """The API server's status as another operator changes it: one per read, in order."""

    def __init__(self, *statuses: dict[str, Any]) -> None:
        super().__init__(statuses[0])
        self.statuses = list(statuses)

    def get_namespaced_custom_object_status(self, *args: Any) -> dict[str, Any]:
        self.stored["status"] = self.statuses[min(self.reads, len(self.statuses) - 1)]
        return super().get_namespaced_custom_object_status(*args)


def test_a_new_process_takes_over_only_once_no_other_operator_evaluates(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The old and the new operator of a rolling upgrade run side by side for a few seconds:
    the new one waits while the status shows the previous slot evaluated, and takes over
    after a slot without a new evaluation."""
    # What the new one reads at T0 + 1, T0 + 16, T0 + 31: the old one evaluated T0 - 15 and
    # T0, then stopped.
    api = ChangingStatusApi(_evaluated(T0 - 15), _evaluated(T0), _evaluated(T0))
    decided = _passes(monkeypatch, api, [(T0 + 1, {}), (T0 + 16, {}), (T0 + 31, {})])
    assert api.reads == 3
    assert [at for at, _, _ in decided] == [T0 + 30]


class Elected:
    """A process that holds the leader-election Lease (kube/lease.py), taken over from
    another; `until` questions later it has lost it."""

    exclusive = True

    def __init__(self, until: int = 10**9, term: int = 1) -> None:
        self.asked, self.until, self.term = 0, until, term

    def leads(self) -> bool:
        self.asked += 1
        return self.asked <= self.until


def test_an_evaluation_whose_process_lost_the_lease_meanwhile_writes_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its Prometheus read or status read outlasted the renew deadline: another process may
    lead by now."""
    decided = _passes(monkeypatch, StatusApi({}), [(T0 + 1, {})], leader=Elected(until=0))
    assert decided == []
    decided = _passes(monkeypatch, StatusApi({}), [(T0 + 1, {})], leader=Elected())
    assert [at for at, _, _ in decided] == [T0]


def test_leading_again_forgets_what_the_last_term_wrote() -> None:
    """Another leader wrote in between: the replicas this process wrote before are no
    measure of a revert, and its last evaluation no longer tells whether its status copy is
    stale."""
    leader = Elected()
    settings = AutoscalingSettings(source=RecordingSource(), leader=leader)
    settings.begin_term()
    settings.written["ns/t0"], settings.evaluated_at["ns/t0"] = 4, T0
    settings.begin_term()  # the same term: kept
    assert settings.written == {"ns/t0": 4} and settings.evaluated_at == {"ns/t0": T0}
    leader.term = 2
    settings.begin_term()
    assert settings.written == {} and settings.evaluated_at == {}


def test_with_an_election_the_new_process_takes_over_without_waiting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The Lease passes to the new operator only once the old one has stopped its loops and
    released it: nobody else evaluates, so no slot is lost to the takeover wait. The slot the
    old one evaluated last is still not evaluated again."""
    # What the new one reads at T0 + 1, T0 + 16, T0 + 31: the old one evaluated T0, then
    # handed over; then its own evaluation of T0 + 15.
    statuses = (_evaluated(T0), _evaluated(T0), _evaluated(T0 + 15))
    passes: list[tuple[float, dict[str, Any]]] = [(T0 + 1, {}), (T0 + 16, {}), (T0 + 31, {})]
    elected = _passes(monkeypatch, ChangingStatusApi(*statuses), passes, leader=Elected())
    assert [at for at, _, _ in elected] == [T0 + 15, T0 + 30]
    # Without an election, the status alone cannot tell the old operator's evaluations from
    # a restart's, so it waits.
    alone = _passes(monkeypatch, ChangingStatusApi(*statuses), passes)
    assert [at for at, _, _ in alone] == []


def test_the_takeover_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from infertune.controller.autoscaling import _another_evaluates

    settings = AutoscalingSettings(source=RecordingSource())
    parsed = settings.parse("ns", "t0", "uid-0", 1, entry(0)["spec"])
    slow = settings.parse("ns", "t1", "uid-1", 1, entry(1, interval="5m")["spec"])
    assert parsed is not None and slow is not None
    now = T0 + 2
    assert _another_evaluates(parsed, now, _evaluated(T0 - 15))  # the previous slot
    assert not _another_evaluates(parsed, now, _evaluated(T0 - 30))  # a slot passed: over
    assert not _another_evaluates(parsed, now, {})  # never evaluated
    assert not _another_evaluates(parsed, now, {"autoscaling": {"evaluated": "soon"}})
    assert not _another_evaluates(slow, now, _evaluated(T0 - 300))  # long intervals: no wait
