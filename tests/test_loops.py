"""The per-tuning loops (re-tuning, MIG): a pass every interval, kopf's back-off after a
failure, a prompt stop, and a status write only for blocks that changed."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits.aioenums import AsyncFlagWaiter, FlagSetter
from kopf._core.intents.handlers import DaemonHandler
from kubernetes.client.exceptions import ApiException

from infertune.controller import loops
from infertune.kube.lease import ALWAYS, Leader

LOGGER = logging.getLogger("test-loops")
Writes = list[tuple[str, str, Any, dict[str, Any] | None]]


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Writes:
    """Status writes the loop asks for: (namespace, name, resourceVersion, the patch built
    over the stored status). The API side of write_status is covered by the e2e tests."""
    seen: Writes = []

    def write_status(namespace: str, name: str, status: dict[str, Any],
                     resource_version: str | None,
                     build: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
        seen.append((namespace, name, resource_version, build(status)))

    monkeypatch.setattr(loops, "write_status", write_status)
    monkeypatch.setattr(loops, "INITIAL_DELAY_S", 0.0)
    return seen


def _run(read: loops.Read, setter: FlagSetter[Any], *, interval_s: float = 0.001,
         status: dict[str, Any] | None = None, spec: dict[str, Any] | None = None,
         leader: Leader = ALWAYS) -> None:
    body = kopf.Body({"metadata": {"generation": 1}, "spec": spec or {"a": 1},  # type: ignore[typeddict-unknown-key]
                      "status": status or {}})

    async def main() -> None:
        await asyncio.wait_for(loops.every(
            interval_s, read, what="re-tuning", stopped=AsyncFlagWaiter(setter),
            namespace="team-a", name="qwen", body=body, logger=LOGGER,  # type: ignore[arg-type]
            leader=leader), timeout=10)

    asyncio.run(main())


def test_passes_repeat_until_kopf_says_stop(writes: Writes) -> None:
    setter: FlagSetter[Any] = FlagSetter()
    passes = []

    def read(spec: dict[str, Any], status: dict[str, Any],
             meta: dict[str, Any]) -> loops.Work | None:
        passes.append((spec, meta))
        if len(passes) == 3:
            setter.set()
        return lambda: {}

    _run(read, setter)
    assert passes == [({"a": 1}, {"generation": 1})] * 3
    assert writes == []


def test_a_failed_pass_is_logged_and_tried_again_after_the_back_off(
        writes: Writes, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(loops, "FAILURE_DELAY_S", 0.01)
    setter: FlagSetter[Any] = FlagSetter()
    attempts = []

    def work() -> dict[str, Any]:
        attempts.append(1)
        if len(attempts) == 1:
            raise ApiException(status=500, reason="boom")
        return {}

    def read(*_: Any) -> loops.Work | None:
        if attempts:
            setter.set()  # the second pass is the last
        return work

    with caplog.at_level(logging.ERROR, logger=LOGGER.name):
        _run(read, setter, interval_s=30)  # a second pass only comes from the back-off
    assert len(attempts) == 2
    assert [r.getMessage() for r in caplog.records] == ["re-tuning failed; trying again in 0.01s"]
    assert caplog.records[0].exc_info is not None


def _hourly_loop(read: loops.Read, setter: FlagSetter[Any]) -> asyncio.Task[None]:
    """The re-tuning loop of team-a/qwen, a pass an hour, told to stop through `setter`."""
    return asyncio.create_task(loops.every(
        3600, read, what="re-tuning", stopped=AsyncFlagWaiter(setter), namespace="team-a",
        name="qwen", body=kopf.Body({}), logger=LOGGER))  # type: ignore[arg-type]


@pytest.mark.parametrize("told_to_stop", [True, False])
def test_a_stop_during_the_interval_ends_the_loop_at_once(writes: Writes,
                                                          told_to_stop: bool) -> None:
    """As kopf stops a daemon without cancellation_backoff: the flag, a few loop cycles to
    return, then the task is cancelled. The pause must end there, no pass follow, and the
    daemon return rather than end cancelled (kopf warns about each cancelled daemon). A
    cancellation that is not kopf's stop goes through."""
    setter: FlagSetter[Any] = FlagSetter()
    passes = []

    def read(*_: Any) -> loops.Work | None:
        passes.append(1)
        return None

    async def main() -> None:
        daemon = _hourly_loop(read, setter)
        await asyncio.sleep(0.05)  # the first pass, then the pause
        if told_to_stop:
            setter.set()
        for _ in range(10):
            await asyncio.sleep(0)
        daemon.cancel()
        await asyncio.wait([daemon], timeout=1)
        assert daemon.done()
        assert daemon.cancelled() is not told_to_stop

    asyncio.run(main())
    assert passes == [1]


@pytest.mark.parametrize("told_to_stop", [True, False])
def test_a_stop_during_a_pass_ends_the_loop_without_a_cancelled_daemon(
        writes: Writes, told_to_stop: bool) -> None:
    """A tuning deleted while a pass runs in its worker thread: kopf cancels the daemon's
    task, which is awaiting the thread. The daemon returns rather than ends cancelled (CI
    once saw kopf's warning for it), the pass finishes in its thread, and no pass follows."""
    setter: FlagSetter[Any] = FlagSetter()
    running, release, passes = threading.Event(), threading.Event(), []

    def work() -> dict[str, Any]:
        running.set()
        release.wait(5)
        return {}

    def read(*_: Any) -> loops.Work | None:
        passes.append(1)
        return work

    async def main() -> None:
        daemon = _hourly_loop(read, setter)
        while not running.is_set():
            await asyncio.sleep(0.01)
        if told_to_stop:
            setter.set()
        daemon.cancel()
        await asyncio.wait([daemon], timeout=1)
        release.set()
        assert daemon.done()
        assert daemon.cancelled() is not told_to_stop

    asyncio.run(main())
    assert passes == [1]


def test_the_daemons_are_cancelled_when_they_do_not_stop_at_once() -> None:
    """`loops.pause` relies on kopf cancelling these daemons right after the stop flag: with a
    cancellation_backoff it would wait that long first, holding deletions."""
    from infertune.controller import autoscaling, mig, pods  # noqa: F401 - registers them

    daemons = {h.id: h for h in kopf.get_default_registry()._spawning.get_all_handlers()
               if isinstance(h, DaemonHandler)}
    assert {"autoscale", "retune_pods", "partition_gpus"} <= set(daemons)
    for handler in daemons.values():
        assert handler.cancellation_backoff is None
        assert handler.cancellation_timeout == loops.STOP_TIMEOUT_S


def test_an_unchanged_block_is_not_written_and_a_changed_one_is_written_alone(
        writes: Writes) -> None:
    setter: FlagSetter[Any] = FlagSetter()
    stored = {"tuning": {"tunedPods": 2, "message": "2 pods tuned"}, "mig": {"message": "m"},
              "conditions": [{"type": "Ready"}]}
    blocks = [{"tuning": {"tunedPods": 2, "message": "2 pods tuned", "revision": None}},
              {"tuning": {"tunedPods": 1, "message": "1 pod outdated"}, "mig": {"message": "m"}}]

    def read(*_: Any) -> loops.Work | None:
        if len(blocks) == 1:
            setter.set()
        block = blocks.pop(0)
        return lambda: block

    _run(read, setter, status=stored)
    # Each block has one writer, so no resourceVersion; the stored mig and conditions stay.
    assert writes == [("team-a", "qwen", None,
                       {"tuning": {"tunedPods": 1, "message": "1 pod outdated"}})]


def test_a_tuning_deleted_before_the_write_is_not_an_error(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(loops, "INITIAL_DELAY_S", 0.0)

    def gone(*_: Any) -> None:
        raise ApiException(status=404, reason="Not Found")

    monkeypatch.setattr(loops, "write_status", gone)
    setter: FlagSetter[Any] = FlagSetter()

    def read(*_: Any) -> loops.Work | None:
        setter.set()
        return lambda: {"tuning": {"tunedPods": 1}}

    with caplog.at_level(logging.ERROR, logger=LOGGER.name):
        _run(read, setter)
    assert caplog.records == []


def test_a_snapshot_is_the_body_as_it_was_and_the_next_one_sees_the_next_event() -> None:
    raw: dict[str, Any] = {"metadata": {"generation": 1}, "spec": {"a": 1},
                           "status": {"tuning": {"tunedPods": 1}}}
    body = kopf.Body(raw)  # type: ignore[arg-type]
    spec, status, meta = loops.snapshot(body)
    assert (spec, status, meta) == ({"a": 1}, {"tuning": {"tunedPods": 1}}, {"generation": 1})
    assert all(type(d) is dict for d in (spec, status, meta))
    body._replace_with({"metadata": {"generation": 2}, "spec": {"a": 2}})  # the next event
    assert (spec, status, meta) == ({"a": 1}, {"tuning": {"tunedPods": 1}}, {"generation": 1})
    assert loops.snapshot(body) == ({"a": 2}, {}, {"generation": 2})


class Turns:
    """Leads from its `since`-th question on (another operator held the Lease before)."""

    exclusive = True

    def __init__(self, since: int) -> None:
        self.asked, self.since = 0, since

    def leads(self) -> bool:
        self.asked += 1
        return self.asked >= self.since


def test_no_pass_runs_while_another_operator_leads(writes: Writes) -> None:
    setter: FlagSetter[Any] = FlagSetter()
    leader = Turns(since=4)
    passes: list[int] = []

    def read(spec: dict[str, Any], status: dict[str, Any],
             meta: dict[str, Any]) -> loops.Work | None:
        passes.append(leader.asked)
        if len(passes) == 2:
            setter.set()
        return lambda: {"tuning": {"tunedPods": 1}}

    _run(read, setter, leader=leader)
    # The three rounds before it led did not even read; each pass asks again in its thread,
    # before its work and before its write.
    assert passes == [4, 7]
    assert [w[3] for w in writes] == [{"tuning": {"tunedPods": 1}}] * 2


def test_a_pass_that_lost_the_lease_while_it_waited_for_a_thread_does_nothing(
        writes: Writes) -> None:
    setter: FlagSetter[Any] = FlagSetter()
    leader = Turns(since=1)
    worked: list[int] = []

    def read(spec: dict[str, Any], status: dict[str, Any],
             meta: dict[str, Any]) -> loops.Work | None:
        leader.since = 10**9  # lost right after the pass was read
        setter.set()
        return lambda: worked.append(1) or {"tuning": {}}  # type: ignore[func-returns-value]

    _run(read, setter, leader=leader)
    assert worked == [] and writes == []


def test_a_pass_that_lost_the_lease_during_its_work_writes_nothing(writes: Writes) -> None:
    """The work's own API calls (a Deployment read under load) outlasted the leadership: its
    status went on top of the new leader's."""
    setter: FlagSetter[Any] = FlagSetter()
    leader = Turns(since=1)

    def work() -> dict[str, Any]:
        leader.since = 10**9  # lost during the pass
        return {"tuning": {"tunedPods": 1}}

    def read(spec: dict[str, Any], status: dict[str, Any],
             meta: dict[str, Any]) -> loops.Work | None:
        setter.set()
        return work

    _run(read, setter, leader=leader)
    assert writes == []


def test_a_memo_without_an_election_always_leads() -> None:
    assert loops.leader_of(kopf.Memo()) is ALWAYS
    election = Turns(1)
    assert loops.leader_of(kopf.Memo(leader=election)) is election
