"""Per-tuning periodic passes (re-tuning, MIG) as plain loops in a kopf daemon.

Why not `@kopf.timer`: each timer run goes through kopf's handler machinery (it builds every
handler argument, hands a sync handler to a worker thread, records the outcome and logs a
line), and that machinery costs far more than a pass that finds nothing to do. At 1000 tunings
the re-tuning timer alone (every 10 s) was about a fifth of the time the operator held the
GIL, its handler a tenth of that (py-spy, bench/README.md). A loop pays only for the pass and
one hop to a worker thread.

What the timers did, the loop does too: it starts after `INITIAL_DELAY_S`, runs one pass at a
time and sleeps `interval_s` after each, waits `FAILURE_DELAY_S` after a pass that raised
(kopf's default back-off) and logs it, and ends when kopf stops the daemon (the tuning is
deleted, a `when` filter turns false, or the operator exits). The pass returns the status
blocks it owns (it is their only writer); they are written only when they differ from the
stored status.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from infertune.controller.status_patch import as_stored, write_status
from infertune.kube.lease import ALWAYS, Leader

INITIAL_DELAY_S = 1.0
FAILURE_DELAY_S = 60.0
"""After a pass that raised, as kopf retries a failed timer."""
STOP_TIMEOUT_S = 10.0
"""How long kopf waits for a cancelled daemon to finish. The daemons set no
cancellation_backoff, so kopf cancels them as soon as they do not return at the stop flag
(`pause`)."""

Work = Callable[[], dict[str, Any]]
"""One pass, in a worker thread (it may call the API): {status field: block} it owns."""
Read = Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], Work | None]
"""On the event loop: (spec, status, meta) as they are now -> the pass, or None to skip it.
kopf changes its views and indexes on the loop, so what a pass needs of them is read here:
read from a worker thread, an index can change size while it is iterated."""


async def every(interval_s: float, read: Read, *, what: str, stopped: kopf.DaemonStopped,
                namespace: str, name: str, body: kopf.Body, logger: kopf.Logger,
                leader: Leader = ALWAYS) -> None:
    """Run a pass every `interval_s` until kopf says stop, writing the blocks it returns.
    While `leader` says another operator process leads, passes are skipped."""
    loop = asyncio.get_running_loop()
    await pause(INITIAL_DELAY_S, stopped)
    while not stopped:
        spec, stored, meta = snapshot(body)
        delay = interval_s
        try:
            work = read(spec, stored, meta) if leader.leads() else None
            if work is not None:
                # The worker gets this context: kopf.event finds kopf's event queue in it.
                run = functools.partial(contextvars.copy_context().run, _pass_and_write, work,
                                        namespace, name, stored, leader)
                await until_stopped(loop.run_in_executor(None, run), stopped)
        except Exception:
            logger.exception(f"{what} failed; trying again in {FAILURE_DELAY_S:g}s")
            delay = FAILURE_DELAY_S
        if not stopped:  # told to stop during the pass: return now rather than be cancelled
            await pause(delay, stopped)


def leader_of(memo: kopf.Memo) -> Leader:
    """The operator's leader election (`infertune run --leader-elect`), or ALWAYS without."""
    leader: Leader = memo.get("leader", ALWAYS)
    return leader


async def pause(seconds: float, stopped: kopf.DaemonStopped) -> None:
    """Sleep between passes of a daemon's loop, until kopf says stop.

    Not `stopped.wait(seconds)`: each call of that creates two tasks and a `wait_for`, ~8% of
    the operator's GIL time at 1000 tunings (a call per pass). A plain sleep ends as promptly:
    kopf stops a daemon by setting `stopped`, gives it a few loop cycles to return, and then,
    with no cancellation_backoff, cancels its task, which ends the sleep (`until_stopped`)."""
    await until_stopped(asyncio.sleep(seconds), stopped)


async def until_stopped(awaitable: Awaitable[Any], stopped: kopf.DaemonStopped) -> None:
    """Await `awaitable` (a sleep, or a pass in a worker thread) in a daemon's loop. When kopf
    stops the daemon meanwhile, it cancels the task after a few loop cycles; that
    cancellation is taken as the stop it is, and the loop goes on to see `stopped` and
    return: kopf logs a warning for each daemon that ends cancelled, and a tuning deleted
    during a pass would log two. A pass already in its thread finishes there, as it would."""
    try:
        await awaitable
    except asyncio.CancelledError:
        if not stopped:
            raise  # not kopf's stop: let it through


def snapshot(body: kopf.Body) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(spec, status, metadata) of the tuning as kopf last saw it, as plain dicts.

    Through the body: each key read through kopf's `spec`, `status` or `meta` view resolves
    its whole path again, and `dict(status)` over those views was most of a pass. kopf never
    changes these dicts; it replaces the body with the next event's."""
    return (dict(body.get("spec") or {}), dict(body.get("status") or {}),
            dict(body.get("metadata") or {}))


def changed_blocks(blocks: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """The blocks `status` does not hold as they are (None values stay: they remove keys)."""
    return {field: block for field, block in blocks.items()
            if as_stored(status.get(field)) != as_stored(block)}


def _pass_and_write(work: Work, namespace: str, name: str, status: dict[str, Any],
                    leader: Leader = ALWAYS) -> None:
    if not leader.leads():
        return  # lost while the pass waited for a worker thread: another process leads
    blocks = work()
    changed = changed_blocks(blocks, status)
    if not changed or not leader.leads():
        # Nothing to send (the usual pass), or lost during the pass: the leader's own pass
        # says what it did.
        return
    try:
        # No resourceVersion: each block has this pass as its only writer, and a merge patch
        # leaves the other fields of status as they are.
        write_status(namespace, name, status, None, lambda _: changed)
    except ApiException as exc:
        if exc.status != 404:  # deleted meanwhile: kopf stops the loop next
            raise
