"""Autoscaling in the shell: one batched Prometheus fetch per cycle, a decision per tuning,
replicas written only through the scale subresource (DESIGN.md #5).

Every InferenceTuning with autoscaling has a loop (a kopf daemon) that sleeps until the next
slot of its own interval and evaluates once in it: a timer at the spec's interval. Slots are
aligned to the clock (as Prometheus aligns rule evaluations), so the tunings that share an
interval fall due together. The first of a slot fetches the signals of every tuning due in it
in one set of queries (the query count stays flat as tunings grow); the others reuse that
batch. Parsed specs and metrics targets are cached per (uid, generation).

Why not `@kopf.timer`: its interval is fixed when the handler is registered, so a per-spec
interval needed a 1 s timer that checked whether its slot had come. Each kopf timer run builds
the handler's arguments and goes through kopf's handler machinery; at 1000 tunings that was a
thousand runs a second that did nothing, most of the operator's CPU, and the due evaluations
queued behind them until tunings were evaluated once a minute instead of every 15 s
(bench/results/operator.md). A due pass lists the tunings from the kopf index on the event
loop, where kopf changes the index, and then fetches and decides in a worker thread, since the
Prometheus and Kubernetes calls block; the status is patched there too (a daemon has no patch
that kopf applies after each pass).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from urllib3.exceptions import HTTPError as Urllib3Error

from infertune.api.scaling import BatchingMode
from infertune.api.spec import (
    GROUP,
    PLURAL,
    VERSION,
    InferenceTuning,
    InferenceTuningSpec,
    Mode,
)
from infertune.api.status import ConditionStatus, ConditionType
from infertune.controller.conditions import (
    NOT_EVALUATED,
    condition_dict,
    merge_condition_dicts,
    stored_condition,
    stored_reason,
)
from infertune.controller.exported import (
    Counts,
    Reported,
    reported_conditions,
    reported_of,
)
from infertune.controller.fights import (
    REPLICAS_REVERTED,
    Fight,
    Writers,
    autoscaling_rivals,
    blocked_by,
    is_revert,
    lost_scale_event,
    next_fight,
    quiet_hold,
    recreated,
    revert_message,
    with_scale_event,
    writer_of,
    written_replicas,
)
from infertune.controller.loops import pause, snapshot, until_stopped
from infertune.controller.scaling_report import (
    FAILED_KEPT_S,
    SCALE_WRITE_FAILED,
    SCALE_WRITE_REFUSED,
    SCALED_IN,
    SCALED_OUT,
    SCALED_TO_ZERO,
    Blocked,
    Evaluation,
    appended_decisions,
    batching_event_type,
    plan_evaluation,
    status_over,
    stored_write_failure,
)
from infertune.controller.status_patch import Build, merge_patch, write_status
from infertune.kube.client import (
    OWN_SCALE_WRITE,
    DeploymentReplicas,
    deployment_replicas,
    server_message,
)
from infertune.kube.lease import ALWAYS, RETRY_PERIOD_S, Leader
from infertune.metrics.source import MetricsSource, MetricsTarget, target_for_tuning
from infertune.scaling.engine import ScaleDecision
from infertune.scaling.signals import TargetSignals, seconds
from infertune.scaling.state import ScaleEvent, format_time, stored_time
from infertune.tuning.pod_patch import (
    TemplateBatching,
    template_batching,
    unprobed_container,
)
from infertune.tuning.retune import PodView

RESOURCE = (GROUP, VERSION, PLURAL)
WORKERS = 16
"""Threads for due evaluations: each waits on the API server (the scale read, the scale write)
far longer than it computes, so more of them than cores keep a slot's evaluations short."""
Listed = list[tuple[str, "Parsed"]]
IDLE_S = 2.0
"""How often a tuning that cannot be evaluated (invalid spec, no Prometheus) is looked at."""
STOP_TIMEOUT_S = 10.0
"""With it set, kopf cancels a loop that does not end at once when told to stop (one waiting
on an API call, say) and waits this long for it to go; without it, kopf would only wait, for
ever, holding the tuning's deletion."""
SLOT_MARGIN_S = 0.005
"""Woken this much after a slot starts, so the clock reads the new slot."""
SLOT_LATENESS_S = 5.0
"""A pass at most this late evaluates as of the start of its slot (`_evaluate_if_due`)."""
SCALE_WRITE_ATTEMPTS = 2
"""Decisions per slot when another writer changes the scale between the read and the write."""
READY_TIME_RESOLUTION_S = 1.0
"""A pod condition's lastTransitionTime is written in whole seconds (metav1.Time): the pod
became Ready within the second after it (AutoscalingSettings.ready_since)."""
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Parsed:
    """One tuning's spec, validated once per generation."""

    spec: InferenceTuningSpec
    target: MetricsTarget
    interval_s: float


@dataclass
class AutoscalingSettings:
    """Shared across the tunings' loops (kopf copies the memo per object, not these objects)."""

    source: MetricsSource | None
    batch: dict[str, TargetSignals] = field(default_factory=dict)
    fetched_at: dict[str, float] = field(default_factory=dict)
    """key -> when its signals in `batch` were fetched."""
    fetched_for: dict[str, MetricsTarget] = field(default_factory=dict)
    """key -> the metrics target (of one spec generation) its signals in `batch` were read
    for: after a spec change they are not its signals any more."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_slot: dict[str, int] = field(default_factory=dict)
    """key -> the interval slot (floor(time / interval)) last evaluated."""
    evaluated_at: dict[str, float] = field(default_factory=dict)
    """key -> the time of this process's last evaluation that was written."""
    parsed: dict[str, tuple[tuple[str, int], Parsed | None]] = field(default_factory=dict)
    """key -> ((uid, generation), the parsed spec or None when it does not validate)."""
    written: dict[str, int | None] = field(default_factory=dict)
    """key -> the replicas we wrote, while they stand (None: changed since, or none written).
    Kept in status.autoscaling.writtenReplicas too, which a key not here is read from: a
    revert while the operator restarted is still a revert (the fight is in status too:
    fights.py)."""
    written_to: dict[str, str] = field(default_factory=dict)
    """key -> the Deployment `written` holds the replicas of: a count written to the target
    before spec.targetRef changed says nothing about the new one."""
    failures: dict[str, int] = field(default_factory=dict)
    """key -> evaluations in a row that raised (`FAILURES_REPORTED`)."""
    unwritten: dict[str, Unwritten] = field(default_factory=dict)
    """key -> what an evaluation whose replicas were written could not write into the
    status: the next evaluation decides over it (its scale event counts in the rate limits,
    its decision record is kept) until the stored status is as new."""
    status_unwritable: set[str] = field(default_factory=set)
    """Keys whose last evaluation decided and then failed to write its status (for the
    message of EvaluationFailed)."""
    write_failed_at: dict[str, float] = field(default_factory=dict)
    """key -> when this process's last replicas write met a server error (ScaleWriteFailed,
    kept by Holds for FAILED_KEPT_S from then)."""
    pods_left_by: dict[str, float] = field(default_factory=dict)
    """key -> `pods_gone_by` of the pods seen terminating that are gone from the index."""
    pods_leaving: dict[str, dict[str, float]] = field(default_factory=dict)
    """key -> pod name -> deletionTimestamp, of the pods seen terminating at the last look."""
    pods_ready: dict[str, tuple[int, float | None]] = field(default_factory=dict)
    """key -> (the target's pods Ready and not terminating as kopf's index holds them, when
    the last of them became Ready, None when one has no time or none is Ready)."""
    started: float = field(default_factory=time.time)
    fetches: int = 0
    """Batches fetched since start (for the benchmark and the logs)."""
    listings: dict[float, tuple[int, Listed]] = field(default_factory=dict)
    """interval -> (slot, every autoscaled tuning as listed in that slot)."""
    batched: dict[float, int] = field(default_factory=dict)
    """interval -> the last slot whose batch was fetched."""
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        WORKERS, thread_name_prefix="autoscale"))
    leader: Leader = ALWAYS
    """The operator's leader election: only the process that leads evaluates."""
    term: int = 0
    """The leader's term `written` and `evaluated_at` belong to (`begin_term`)."""
    reported: dict[str, Reported] = field(default_factory=dict)
    """key -> its last evaluation, for the operator's metrics (exported.py)."""
    scale_writes: dict[str, tuple[int, int]] = field(default_factory=dict)
    """key -> replicas writes that landed since start, (out, in) (metrics)."""
    failed_total: dict[str, int] = field(default_factory=dict)
    """key -> evaluations that raised since start (metrics; `failures` counts those in a
    row)."""
    autoscaled: set[str] = field(default_factory=set)
    """Keys whose autoscaling loop runs: the metrics export only these (an evaluation that
    ends in its worker thread after the loop stopped records it all the same)."""
    loops_ended: dict[str, int] = field(default_factory=dict)
    """key -> how many times its autoscaling loop ended (`stopped`): a pass still in its
    worker thread when the loop ended forgets, at its end, what it stored meanwhile."""
    paused: dict[str, bool] = field(default_factory=dict)
    """key -> whether its Deployment was at 0 replicas at this process's last evaluation
    (`_announce_pause`)."""

    def exported(self) -> dict[str, Reported]:
        """`reported` of the tunings autoscaled now, for the metrics (a copy: the loops change
        both in other threads)."""
        live = self.autoscaled.copy()
        return {key: got for key, got in self.reported.copy().items() if key in live}

    def counts(self) -> Counts:
        """The running totals the operator's metrics export."""
        live = self.autoscaled.copy()
        writes = {(key, direction): count
                  for key, (out, in_) in self.scale_writes.copy().items() if key in live
                  for direction, count in (("out", out), ("in", in_)) if count}
        failed = {key: count for key, count in self.failed_total.copy().items()
                  if key in live}
        return Counts(writes, failed, self.fetches)

    def wrote(self, key: str, replicas: int, current: int) -> None:
        """A replicas write of the operator landed (read back, or answered); it is made only
        for a change, so `replicas` differs from `current`."""
        self.written[key] = replicas
        # Not for a tuning whose loop stopped while this pass ran in its worker thread: a
        # tuning of the same name created next would start with its count.
        if key in self.autoscaled:
            out, in_ = self.scale_writes.get(key, (0, 0))
            self.scale_writes[key] = (out + 1, in_) if replicas > current else (out, in_ + 1)

    def stopped(self, key: str) -> None:
        """The tuning's autoscaling loop ended (deleted, spec.autoscaling removed, the
        operator stopping): its series go, and what this process wrote for it (`forget`):
        the replicas are the user's until the loop runs again. Kept, a count the user set
        while spec.autoscaling was removed was taken for a revert once it was back (the
        status, which the controller cleared with it, holds no count to defend then)."""
        self.autoscaled.discard(key)
        self.forget(key)
        self.paused.pop(key, None)
        self.loops_ended[key] = self.loops_ended.get(key, 0) + 1

    def parse(self, namespace: str, name: str, uid: str, generation: int,
              spec: dict[str, Any]) -> Parsed | None:
        """The tuning's spec, from the cache while its uid and generation are unchanged."""
        key, version = f"{namespace}/{name}", (uid, generation)
        cached = self.parsed.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        try:
            tuning = InferenceTuning.model_validate({
                "metadata": {"name": name, "namespace": namespace}, "spec": spec})
        except ValidationError:
            parsed = None  # reported by the controller
        else:
            scaling = tuning.spec.autoscaling
            parsed = None if scaling is None else Parsed(
                tuning.spec, target_for_tuning(tuning), scaling.interval.seconds)
        if parsed is None or (cached is not None and cached[0][0] != uid):
            # Another object of the same name (deleted and created again), or autoscaling
            # removed: what this process wrote for the old one is no longer its to defend.
            # Kept, a count set by hand meanwhile was a revert of the new tuning's.
            self.forget(key)
        self.parsed[key] = (version, parsed)
        return parsed

    def forget(self, key: str, *, signals: bool = False) -> None:
        """Drop what this process keeps of `key`'s evaluations and writes; with `signals`,
        its fetched signals and parsed spec too (a tuning gone from the listing)."""
        tables: list[dict[str, Any]] = [self.written, self.written_to, self.unwritten,
                                        self.evaluated_at, self.last_slot, self.failures,
                                        self.write_failed_at, self.reported,
                                        self.failed_total, self.scale_writes,
                                        self.pods_ready]
        self.status_unwritable.discard(key)
        if signals:
            tables += [self.batch, self.fetched_at, self.fetched_for, self.parsed]
        for table in tables:
            table.pop(key, None)

    def saw_pods(self, key: str, pods: Iterable[PodView], now: float,
                 stale_s: float) -> None:
        """Take in the target's pods as kopf's index holds them `now` (`pods_left_by` and
        `pods_leaving`, for `pods_gone_by`; `pods_ready`).

        A terminating pod is gone by its deletionTimestamp at the latest, and once it is gone
        from the index, by `stale_s` after that was seen if earlier: the kubelet removes the
        pod once its containers stopped, often long before its grace period ends (LLM
        servers set minutes to drain), and Prometheus returns its last samples for a scrape
        interval or so after that (the caller gives the metrics window). Counted to its
        deletionTimestamp, batching mode Auto could not yet tell that the pods ignore the
        value applied when its next step was due, and stepped again (another rollout for
        nothing). Counted from when it left, without the margin, the old pod's last sample
        could read as the new pods' running requests."""
        left_by = self.pods_left_by.get(key, self.started)
        leaving: dict[str, float] = {}
        ready, since, known = 0, -math.inf, True
        for pod in pods:
            if pod.gone_by is not None:
                leaving[pod.name] = pod.gone_by
            if pod.ready and not pod.terminating:
                ready += 1
                if pod.ready_since is None:
                    known = False
                elif pod.ready_since > since:
                    since = pod.ready_since
        for name, by in self.pods_leaving.get(key, {}).items():
            if name not in leaving:
                left_by = max(left_by, min(by, now + stale_s))
        self.pods_left_by[key], self.pods_leaving[key] = left_by, leaving
        self.pods_ready[key] = (ready, since if known and ready else None)

    def pods_gone_by(self, key: str) -> float | None:
        """When the last pod of the target seen terminating is gone at the latest, or when
        this process started: no metric of an older pod is newer (batching mode Auto reads
        the running requests only from after it). For a pod still terminating, its
        deletionTimestamp (its grace period's end); for one gone from the index since, as
        `saw_pods` bounds it. None before `saw_pods` saw the target's pods."""
        left_by = self.pods_left_by.get(key)
        if left_by is None:
            return None
        return max([left_by, *self.pods_leaving.get(key, {}).values()])

    def ready_since(self, key: str, ready: int | None) -> float | None:
        """When the last of the target's `ready` pods (the Deployment's readyReplicas) became
        Ready at the latest, from the pods seen (`saw_pods`): the second after the newest
        lastTransitionTime, which is written in whole seconds. None when not known, or when
        fewer pods were seen Ready than that (the index is behind: one not seen yet may be
        newer)."""
        seen = self.pods_ready.get(key)
        if ready is None or seen is None or seen[0] < ready or seen[1] is None:
            return None
        return seen[1] + READY_TIME_RESOLUTION_S

    def begin_term(self) -> None:
        """What this process remembers of its writes, forgotten when it leads again after
        another process did: the replicas it wrote may since have been changed by that
        leader, which is no revert, and its statuses are older than that leader's."""
        if self.term != self.leader.term:
            self.term = self.leader.term
            self.written.clear()
            self.written_to.clear()
            self.unwritten.clear()
            self.evaluated_at.clear()
            # What it decided before: another leader decided since.
            self.reported.clear()
            # What it saw of pauses: another leader may have said them since (the stored
            # ScalingActive reason tells).
            self.paused.clear()

    def due(self, key: str, parsed: Parsed, now: float) -> bool:
        return self.last_slot.get(key) != math.floor(now / parsed.interval_s)

    def stored_in_slot(self, key: str, parsed: Parsed, now: float,
                       status: Mapping[str, Any]) -> bool:
        """Whether the status already holds an evaluation of the current slot (made before a
        restart, or by the operator this one replaces); the slot then counts as evaluated.
        A second evaluation in one slot would decide from the state the first one left, which
        an operator that kept running never does. A stamp after the slot (a clock ahead, an
        edit) is not believed: it would hold autoscaling until then."""
        if not evaluated_in_slot(status, now, parsed.interval_s):
            return False
        self.last_slot[key] = math.floor(now / parsed.interval_s)
        return True

    def until_due(self, key: str, parsed: Parsed, now: float) -> float:
        """0 when `key` is due now, else the seconds until its next slot starts."""
        if self.due(key, parsed, now):
            return 0.0
        return until_next_slot(parsed.interval_s, now)

    def listing(self, index: kopf.Index[tuple[str, str], dict[str, Any]], parsed: Parsed,
                now: float) -> Listed:
        """Every autoscaled tuning, listed from the kopf index once per slot of `parsed`'s
        interval (every due tuning of the slot would otherwise list all of them again).

        Call it on the event loop: kopf changes the index there, so it is never seen half
        changed. Iterated from a worker thread instead, it failed with "dictionary changed
        size during iteration" whenever tunings were created, and kopf then retried that
        timer only a minute later."""
        slot = math.floor(now / parsed.interval_s)
        listed = self.listings.get(parsed.interval_s)
        if listed is None or listed[0] != slot:
            listed = (slot, list(autoscaled(self, index)))
            self.listings[parsed.interval_s] = listed
        return listed[1]


def autoscaled(settings: AutoscalingSettings,
               index: kopf.Index[tuple[str, str], dict[str, Any]]) -> Iterator[tuple[str, Parsed]]:
    """(key, parsed) of every tuning with spec.autoscaling, from the kopf index. Those with
    enabled: false too: their signals are read and reported, and their evaluation hands the
    replicas to the user."""
    for (namespace, _target), entries in index.items():
        for entry in entries:
            if not entry["spec"].get("autoscaling"):
                continue
            parsed = settings.parse(namespace, entry["name"], entry.get("uid", ""),
                                    int(entry.get("generation") or 0), entry["spec"])
            if parsed is not None:
                yield f"{namespace}/{entry['name']}", parsed


def signals_if_due(settings: AutoscalingSettings, key: str, parsed: Parsed,
                   tunings: Iterable[tuple[str, Parsed]], now: float) -> TargetSignals | None:
    """None unless `key` is due in this slot of its interval; then its signals, and the slot
    counts as evaluated. `tunings` are all of them (`AutoscalingSettings.listing`)."""
    if not settings.due(key, parsed, now):
        return None
    settings.last_slot[key] = math.floor(now / parsed.interval_s)
    return signals_for(settings, key, parsed, tunings, now)


def signals_for(settings: AutoscalingSettings, key: str, own: Parsed,
                tunings: Iterable[tuple[str, Parsed]], now: float) -> TargetSignals | None:
    """`key`'s signals: from the batch if it was fetched in this slot, else one fetch for every
    tuning whose signals are not fetched in its current slot yet (most share the slot, so the
    others find the batch ready).

    Membership is by what was fetched, not by what was evaluated: a tuning that is waiting for
    the lock has already marked its slot, and leaving it out made it fetch alone, then the next
    one, a chain of fetches that held every worker. A tuning newer than its slot's batch (not
    in the listing it was built from) gets None and joins the next slot's batch, so creating
    tunings does not add queries."""
    assert settings.source is not None
    slot = math.floor(now / own.interval_s)
    with settings.lock:
        if (_fetched_in_slot(settings, key, own.interval_s, now)
                and key in settings.batch):
            # Read for an older generation of the spec (another queue target or window)
            # when it changed since this slot's fetch: the next slot reads it anew.
            return settings.batch[key] if settings.fetched_for.get(key) is own.target else None
        if settings.batched.get(own.interval_s) == slot:
            return None
        known: set[str] = {key}
        targets: list[MetricsTarget] = [own.target]
        for other, parsed in tunings:
            if other == key:
                continue
            known.add(other)
            if not _fetched_in_slot(settings, other, parsed.interval_s, now):
                targets.append(parsed.target)
        fetched = settings.source.fetch(targets, now)
        settings.fetches += 1
        settings.batched[own.interval_s] = slot
        for gone in [k for k in settings.batch if k not in known]:
            settings.forget(gone, signals=True)
        for target in targets:
            settings.fetched_for[target.key] = target
        for other, signals in fetched.items():
            settings.batch[other] = signals
            settings.fetched_at[other] = now
        return settings.batch.get(key)


def _fetched_in_slot(settings: AutoscalingSettings, key: str, interval_s: float,
                     now: float) -> bool:
    """Whether `key`'s signals were fetched in the slot `now` is in. One fetched in a later
    slot is not: after the clock stepped back, it stood for every slot until its time came
    again, and the evaluations decided on signals that old. (Later in the same slot is: a
    pass evaluated as of its slot's start uses a batch fetched a moment after it.)"""
    start = slot_start(now, interval_s)
    return start <= settings.fetched_at.get(key, -math.inf) < start + interval_s


@kopf.index("autoscaling", "v2", "horizontalpodautoscalers")  # type: ignore[arg-type]
async def hpas_by_target(namespace: str, name: str, body: kopf.Body,
                         **_: Any) -> dict[tuple[str, str], str] | None:
    """HPAs by the Deployment they scale, so each evaluation checks without an API call (a
    coroutine, as the other index functions: see pods.py)."""
    ref = (body.get("spec") or {}).get("scaleTargetRef") or {}
    if ref.get("kind") != "Deployment":
        return None
    return {(namespace, str(ref.get("name"))): name}


def _reverted(settings: AutoscalingSettings, key: str, current: int,
              status: Mapping[str, Any], deployment: str, writes: bool = True,
              owners: tuple[tuple[str, str], ...] = (), created: float | None = None) -> bool:
    """Whether another writer changed the replicas the operator last wrote to `deployment`
    (seen once). Where the operator does not write them (`writes` false: autoscaling.enabled
    false, DryRun, an HPA or another tuning on the Deployment) nothing is a revert: the
    replicas are another's. `owners` are the writers that own spec.replicas now
    (`replicas_owners`); `created` the Deployment's creationTimestamp (one created again
    since the last evaluation is another object: `fights.recreated`)."""
    # A process that has not written yet takes what the last one stored.
    remembered = _remembers(settings, key, deployment) and not recreated(status, created)
    written = (settings.written[key] if remembered
               else written_replicas(status, deployment, created))
    settings.written_to[key] = deployment
    if is_revert(written, current, writes, owners == (OWN_SCALE_WRITE,)):
        settings.written[key] = None
        return True
    # Disabled, nothing is written (the count is the user's); a count other than the one
    # written is then our own scale write that the status does not hold: the process that
    # made it stopped before its status write (a crash, a rolling upgrade), or a write of
    # this process with an unknown outcome landed late (after its read-back, even while the
    # next evaluation wrote). The API server says the operator changed them last; taken for
    # a revert, it started a fight.
    # At 0 the Deployment is paused, and its count the user's until it is scaled up: the
    # count it is scaled up to is theirs too (remembered as written, the resume was a revert).
    settings.written[key] = None if not writes or current == 0 else written \
        if written in (None, current) else current
    return False


def _remembers(settings: AutoscalingSettings, key: str, deployment: str) -> bool:
    """Whether this process keeps what it wrote to `deployment` for tuning `key`."""
    return key in settings.written and settings.written_to.get(key) == deployment


def _lost_scale_event(settings: AutoscalingSettings, key: str, status: Mapping[str, Any],
                      deployment: str, read: DeploymentReplicas,
                      now: float) -> ScaleEvent | None:
    """fights.lost_scale_event for this process: one that remembers its count finds only a
    write of its own whose outcome it did not know that landed late."""
    # A count of this process's that stands holds every write it knows (Unwritten keeps what
    # their status write missed); one that differs with the operator's scale write last is a
    # write of unknown outcome that landed late.
    remembered = None
    if _remembers(settings, key, deployment):
        remembered = settings.written[key]
        if remembered is None:  # changed since, or none written: nothing of ours stands
            return None
    return lost_scale_event(status, deployment, read.replicas,
                            read.replicas_by == (OWN_SCALE_WRITE,), now, remembered)


def evaluate(namespace: str, name: str, generation: int, spec: InferenceTuningSpec,
             status: dict[str, Any], signals: TargetSignals, settings: AutoscalingSettings,
             writers: Writers, body: kopf.Body, now: float,
             resource_version: str | None = None) -> ScaleDecision:
    """Decide, write replicas (unless DryRun, a fight or an HPA), and report. `status` is the
    tuning's at `resource_version`; the report is written only over that version, or built
    again over a newer one.

    The write is a JSON patch that first tests that the replicas are still those read: a
    count another writer set after the read is not overwritten unseen (a resourceVersion
    precondition, as HPA's update has, would also fail on the Deployment controller's status
    writes, which follow every change of replicas). When the test fails, the scale is read
    again and the decision made again once (the other writer's count then counts as a revert
    of ours, if it is one); a second failure leaves the slot.
    A write the API server refuses (an admission policy, RBAC) is reported as not applied,
    with its message, in ScalingActive and a Warning Event; one whose answer is lost or a
    server error is read back first, as it may have landed (`_read_back`); a conflict is
    another writer's change, even to the count planned (the client never sends a write twice);
    one that API Priority and Fairness did not take (429) is left to the next slot. The status
    is written only while this process leads, and never over a later evaluation."""
    key, deployment = f"{namespace}/{name}", spec.target_ref.name
    settings.status_unwritable.discard(key)
    apps = client.AppsV1Api()
    stored_status = status
    unwritten = settings.unwritten.get(key)
    if unwritten is not None and not _newer(unwritten.blocks, status):
        settings.unwritten.pop(key, None)  # the stored status is as new: it holds it
        unwritten = None
    if unwritten is not None:
        status = unwritten.over(status)  # decided over; written over the stored one
    stored_fight = Fight.from_json((status.get("autoscaling") or {}).get("replicaFight"))
    reverted = False
    lost_write: tuple[ScaleEvent, int] | None = None
    for attempt in range(SCALE_WRITE_ATTEMPTS):
        read = deployment_replicas(namespace, deployment)
        current, ready = read.replicas, read.ready
        lost = _lost_scale_event(settings, key, status, deployment, read, now)
        if lost is not None:
            lost_write = (lost, current)
            logger.info("%s: replicas %+d were this operator's write, which the status does "
                        "not hold (stopped before its status write); counted in the rate "
                        "limits as made now", key, lost.change)
            status = with_scale_event(status, lost)
        # A revert seen by the first attempt stays one when the second decides again.
        # In DryRun nothing is written either, so a count set by hand is no revert; nor
        # while an HPA or another tuning holds the writes (ScalingActive says so): the
        # HPA's counts, or one set by hand meanwhile, were stored as reverts, and one
        # kubectl scale after the HPA went stopped the writes for a fight.
        reverted = _reverted(settings, key, current, status, deployment,
                             spec.autoscaling is not None and spec.autoscaling.enabled
                             and spec.mode is Mode.ENFORCE and writers.hpa is None
                             and not writers.tunings,
                             read.replicas_by, read.created) or reverted
        fight = next_fight(stored_fight, generation, reverted, now, quiet_hold(spec),
                           writer_of(read.replicas_by))
        plan = functools.partial(plan_evaluation, spec, generation, status, signals, current,
                                 now=now, fight=None if fight is None else fight.to_json(),
                                 written=settings.written.get(key), ready=ready,
                                 template=_template_batching(spec, read.pod_spec,
                                                             read.rolled_out),
                                 unprobed=unprobed_container(spec, read.pod_spec),
                                 pods_gone_by=settings.pods_gone_by(key),
                                 ready_since=settings.ready_since(key, ready))
        blocked = blocked_by(deployment, writers, fight, now)
        planned = plan(blocked)
        if blocked is None and planned.write is None and spec.mode is Mode.ENFORCE:
            # A Hold after a write the API server refused (or failed): ScalingActive keeps
            # saying so until a write lands. It turned back to Scaling at the next Hold,
            # and the next refused write was news again (a Warning, a decision record).
            # Only while the Deployment and its count are the ones that write was for: a
            # failed write that landed late, or a new targetRef, ends it.
            kept = stored_write_failure(status)
            if (kept is not None and kept.reason == SCALE_WRITE_FAILED
                    and not now - settings.write_failed_at.get(key, -math.inf)
                    <= FAILED_KEPT_S):
                # A server error passes: kept by Holds for FAILED_KEPT_S after this
                # process met it (after a restart, not at all), not for as long as the
                # decision holds. Timed from the write, not from the condition, which keeps
                # the time it turned False for an earlier reason.
                kept = None
            before = status.get("autoscaling") or {}
            if (kept is not None and before.get("target") in (None, deployment)
                    and before.get("currentReplicas") == current):
                planned = plan(kept)
        refused: Blocked | None = None
        if planned.write is not None and _spec_changed(namespace, name, generation):
            # Decided with kopf's copy from before the fetch: a spec changed since (DryRun
            # set, enabled false, another targetRef, autoscaling removed) must not get the
            # old spec's write. The next slot decides with the new one.
            logger.info("%s: the spec changed while deciding; the next slot decides with it",
                        key)
            settings.written.pop(key, None)  # a revert it saw: the next one sees it again
            return planned.decision
        if planned.write is not None and not settings.leader.leads():
            # Lost while the reads above waited (an API server under load queues them): the
            # new leader may be writing already, and two writers take each other's counts
            # for reverts. The slot is not counted; the new leader decides.
            logger.info("%s: no longer leading; the new leader decides and writes", key)
            settings.last_slot.pop(key, None)
            # A revert this pass saw is not stored: forgotten here, the next evaluation (of
            # this process, leading again in the same term) sees it again from the status.
            settings.written.pop(key, None)
            return planned.decision
        if (to_write := planned.write) is not None:
            # Written before the status: if this call fails, the status keeps the old state.
            try:
                apps.patch_namespaced_deployment_scale(deployment, namespace, [
                    {"op": "test", "path": "/spec/replicas", "value": current},
                    {"op": "replace", "path": "/spec/replicas", "value": planned.write}])
            except Urllib3Error:
                # The answer was lost (a timeout, a dropped connection): the write may have
                # landed. If it did, it is ours: taken for someone else's, it counted as a
                # revert and its scale event was missing from the rate limits.
                if _read_back(settings, key, namespace, deployment) != planned.write:
                    # Not there now, and it may still land (the API server may go on with
                    # the request): forgotten, as when the read fails (`_read_back`).
                    settings.written.pop(key, None)
                    raise
                settings.wrote(key, to_write, current)
            except ApiException as exc:
                if exc.status == 429:
                    # API Priority and Fairness turned it away unprocessed: the API server
                    # is busy, nothing refused the write. The next slot decides again.
                    logger.warning("%s: the API server is busy (429) and did not take the "
                                   "replicas write; the next slot decides again", key)
                    # Nothing of this pass is stored (a revert it saw): the next one goes by
                    # the status.
                    settings.written.pop(key, None)
                    return planned.decision
                # A 5xx says nothing of whether the write landed. A conflict (409, 422: the
                # test of the replicas failed) says another writer changed them first, even
                # to this count: the client never sends a write a second time (RETRIES).
                uncertain = _may_have_landed(exc)
                found = (_read_back(settings, key, namespace, deployment)
                         if uncertain or exc.status in (409, 422) else None)
                if uncertain and found == planned.write:
                    settings.wrote(key, to_write, current)  # as with a lost answer
                elif uncertain:
                    # Not there when read again, and it may land later (a 504 "may still be
                    # processing"): not reported as refused, and what this process wrote
                    # before is forgotten (`_read_back`), so that a late landing is taken
                    # for the operator's own write, not for another writer's revert.
                    settings.written.pop(key, None)
                    settings.write_failed_at[key] = now
                    refused = Blocked(SCALE_WRITE_FAILED, (
                        f"writing {planned.write} replicas to deployments/scale of "
                        f"{deployment} failed ({exc.status}): {server_message(exc)}; a "
                        "server error does not say whether it landed, and the next "
                        "evaluation reads the Deployment again"))
                    planned = plan(refused)
                elif exc.status not in (409, 422) or found == current:
                    refused = Blocked(SCALE_WRITE_REFUSED, (
                        f"writing {planned.write} replicas to deployments/scale of "
                        f"{deployment} was refused ({exc.status}): {server_message(exc)}"))
                    planned = plan(refused)
                elif attempt + 1 < SCALE_WRITE_ATTEMPTS:
                    continue
                else:
                    logger.info("%s: the replicas of %s changed while deciding, twice; the "
                                "next slot decides again", key, deployment)
                    # A revert seen by either attempt is not stored: forgotten, the next
                    # evaluation sees it again from the status.
                    settings.written.pop(key, None)
                    return planned.decision
            else:
                settings.wrote(key, to_write, current)
        break
    # Over an evaluation whose status was not written, its blocks this one does not write
    # again, and its decision records, go with this one: the records onto the stored list
    # (another writer's entries and conditions written meanwhile stay).
    def build(stored: Mapping[str, Any]) -> dict[str, Any] | None:
        if not settings.leader.leads():
            # Lost since the scale read (the replicas write slow, a conflict read again):
            # the new leader may have evaluated after this one and written its status.
            raise NoLongerLeading
        if stored is not stored_status and _evaluated_since(stored, stored_status, now):
            return None  # written over, its state (scale events) would be this older one's
        if unwritten is None:
            return planned.status if stored is status else status_over(planned, stored)
        patch = planned.status if stored is stored_status else status_over(planned, stored)
        return unwritten.under(patch, stored, planned)

    _announce_pause(settings, key, body, status, deployment, current, read.replicas_by)
    try:
        landed = write_status(namespace, name, stored_status, resource_version, build,
                              still=_still_autoscaled)
    except Exception as exc:
        settings.status_unwritable.add(key)
        wrote = planned.write is not None and refused is None
        # `status` is not the stored one also when this pass found a lost scale event: kept
        # too, or the next evaluation (remembering its count) never looked for it again.
        if (wrote or unwritten is not None or planned.batching_news is not None
                or status is not stored_status):
            _announce_lost(body, lost_write, deployment)
            # Replicas (or the applied batching value) changed and the status does not say
            # so: the next evaluations decide over this patch until one is stored, and the
            # change is announced all the same, once.
            settings.unwritten[key] = Unwritten.of(planned, unwritten)
            if wrote and planned.event is not None:
                kopf.event(body, type="Normal", reason=planned.event[0],
                           message=planned.event[1])
            if planned.batching_news is not None:
                reason, message = planned.batching_news[1]
                kopf.event(body, type=batching_event_type(reason), reason=reason, message=message)
        elif reverted:
            # A revert seen by a pass that wrote nothing (a rate limit, the fight's limit):
            # its fight is in no status, and `_reverted` forgot the count it took back.
            # Forgotten here too, the next evaluation sees the revert again from the status;
            # kept, it saw none, and a second revert never stopped the writes.
            settings.written.pop(key, None)
        if isinstance(exc, NoLongerLeading):
            logger.info("%s: no longer leading; the status is left to the new leader", key)
            return planned.decision
        raise
    settings.unwritten.pop(key, None)
    _announce_lost(body, lost_write, deployment)
    if landed is not None and key in settings.autoscaled:  # (see `wrote`)
        decision = planned.decision
        reading = decision.signals
        settings.reported[key] = reported_of(
            deployment, decision.current_replicas, decision.desired_replicas,
            str(decision.action), reading.latency_s, reading.latency_kind,
            reading.queue_per_replica, now, planned.conditions, spec.mode is Mode.DRY_RUN,
            0.0 if spec.autoscaling is None else spec.autoscaling.interval.seconds)
    if landed is None and (planned.write is None or refused is not None):
        # spec.autoscaling went meanwhile, and nothing was written: nothing to announce. A
        # count that was written is announced all the same (DESIGN #8: every scale says why).
        return planned.decision
    if refused is not None:
        if planned.record is not None:  # news, as a decision record is: not every interval
            kopf.event(body, type="Warning", reason=refused.reason,
                       message=refused.message[:1000])
    elif planned.event is not None:
        kopf.event(body, type="Normal", reason=planned.event[0], message=planned.event[1])
    if landed is not None and planned.blocked_news is not None:
        kopf.event(body, type="Warning", reason=planned.blocked_news[0],
                   message=planned.blocked_news[1])
    elif landed is not None and reverted and fight is not None and fight.retry_at is None:
        # One revert does not stop writes: said all the same, at each one, so that a writer
        # that reverts now and then is seen before it is counted twice.
        kopf.event(body, type="Warning", reason=REPLICAS_REVERTED,
                   message=revert_message(fight, deployment, current, quiet_hold(spec)))
    if landed is not None and planned.batching_news is not None:
        # The applied value the webhook sets: it re-creates the pods, so it says why.
        reason, message = planned.batching_news[1]
        kopf.event(body, type=batching_event_type(reason), reason=reason, message=message)
    return planned.decision


def _announce_lost(body: Any, lost_write: tuple[ScaleEvent, int] | None,
                   deployment: str) -> None:
    """An Event for a replicas write of the operator's that no status or Event holds (the
    process that made it stopped between its replicas write and its status write, or a
    write whose outcome was not known landed late), once, when it is found: every change of
    replicas says what it was (DESIGN #8), and it was only logged."""
    if lost_write is None:
        return
    lost, current = lost_write
    kopf.event(body, type="Normal", reason=SCALED_OUT if lost.change > 0 else SCALED_IN,
               message=f"{current - lost.change} -> {current} replicas of {deployment}: a "
               "write of the operator's that no status held (it stopped between its "
               "replicas write and its status write, or a write of unknown outcome landed "
               "late), found now; the reason it was decided for was not kept, and it counts "
               "in the rate limits from now")


def _announce_pause(settings: AutoscalingSettings, key: str, body: Any,
                   status: Mapping[str, Any], deployment: str, current: int,
                   owners: tuple[tuple[str, str], ...]) -> None:
    """A Warning Event when the Deployment turns to 0 replicas. A scale to 0 is no revert (a
    pause, left alone as an HPA leaves it), so nothing else says who stopped the serving (a
    script, a Git manifest with replicas: 0): said once per pause, with the writer where its
    managedFields name one, before the status write (whether or not that lands), in DryRun
    and disabled too. Told by what this process saw at its last evaluation; a process that
    saw none (a restart, a new leader) goes by the stored ScalingActive reason."""
    was = settings.paused.get(key)
    if key in settings.autoscaled:  # not for a loop that stopped meanwhile (as `wrote`)
        settings.paused[key] = current == 0
    if current != 0 or was or (
            was is None and stored_reason(status, ConditionType.SCALING_ACTIVE)
            == SCALED_TO_ZERO):
        return
    by = writer_of(owners)
    kopf.event(body, type="Warning", reason=SCALED_TO_ZERO, message=(
        f"Deployment {deployment} was scaled to 0 replicas"
        + (f" (by {by}, as its managedFields say)" if by else "")
        + "; autoscaling leaves it at 0 until someone scales it up"))


class NoLongerLeading(Exception):
    """The process lost the Lease before an evaluation's status write: it writes no status.
    What the write would have held is kept (`Unwritten`) for when it leads again in the same
    term; a new term forgets it (`AutoscalingSettings.begin_term`)."""


def _evaluated_since(stored: Mapping[str, Any], read: Mapping[str, Any], now: float) -> bool:
    """Whether `stored`, the status read again after a conflict, holds an evaluation later
    than this one (made at `now`) that `read`, the status it decided over, did not: the next
    leader's, when this process lost the Lease while its status write waited. A later stamp
    that was there already (a clock ahead, an edit) is no evaluation made since."""
    made = stored_evaluation(stored)
    return made is not None and made > now + 1e-3 and made != stored_evaluation(read)


def _read_back(settings: AutoscalingSettings, key: str, namespace: str,
               deployment: str) -> int:
    """The replicas, read again after a write whose outcome is not known. When this read fails
    too, the write may have landed unseen: what this process remembers writing is forgotten,
    so that the next evaluation goes by the status and the managedFields, which know the
    operator's own scale write (`_lost_scale_event`). Remembered, the old count took that
    write for another writer's revert, and its scale event was lost."""
    try:
        return deployment_replicas(namespace, deployment).replicas
    except Exception:
        settings.written.pop(key, None)
        raise


def _may_have_landed(exc: ApiException) -> bool:
    """Whether a write answered with `exc` may have been stored all the same: a 5xx (a 504
    "may still be processing", a 500 from an etcd timeout) says nothing of it. A 429 from
    API Priority and Fairness, or a 4xx refusal, was not processed."""
    return isinstance(exc.status, int) and exc.status >= 500


def _template_batching(spec: InferenceTuningSpec, pod_spec: Mapping[str, Any],
                       rolled_out: bool) -> TemplateBatching | None:
    """The batching knob on the target's pod template, read only when batching is on."""
    if spec.batching.mode is BatchingMode.OFF:
        return None
    return template_batching(spec, pod_spec, rolled_out)


class Unwritten(NamedTuple):
    """What evaluations that changed replicas (or the applied batching value) could not
    write into the status."""

    blocks: dict[str, Any]
    """Their own status blocks (status.autoscaling, status.batching), the newest."""
    records: tuple[dict[str, Any], ...]
    """Their decision records, oldest first."""

    @classmethod
    def of(cls, planned: Evaluation, before: Unwritten | None) -> Unwritten:
        own = {k: v for k, v in planned.status.items() if k not in ("conditions", "decisions")}
        if before is None:
            return cls(own, _records(planned))
        return cls({**before.blocks, **own}, (*before.records, *_records(planned)))

    def over(self, status: Mapping[str, Any]) -> dict[str, Any]:
        """`status` as it would be had they been written."""
        out = merge_patch(status, self.blocks)
        out["decisions"] = appended_decisions(status, *self.records)
        return out

    def under(self, patch: Mapping[str, Any], stored: Mapping[str, Any],
              planned: Evaluation) -> dict[str, Any]:
        """`patch`, the status patch of `planned` over `stored` (or over `over(stored)`), with
        them: their blocks it does not write again, and their records and its own on the
        stored list (another writer's entries and conditions written meanwhile stay)."""
        return {**self.blocks, **patch,
                "decisions": appended_decisions(stored, *self.records, *_records(planned))}


def _records(planned: Evaluation) -> tuple[dict[str, Any], ...]:
    """The decision records of an evaluation: its scale decision's, its batching change's."""
    batching = None if planned.batching_news is None else planned.batching_news[0]
    return tuple(r for r in (planned.record, batching) if r is not None)


def _newer(patch: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether `patch` holds a later evaluation than the one `status` stores."""
    made = stored_evaluation(patch)
    stored = stored_evaluation(status)
    return made is not None and (stored is None or made > stored)


def _spec_changed(namespace: str, name: str, generation: int) -> bool:
    """Whether the tuning's spec is no longer the one of `generation` (or it is gone): read
    just before a scale write, one GET per write, not per evaluation."""
    try:
        fresh: Any = client.CustomObjectsApi().get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    # Any change of the spec (autoscaling removed too) moves the generation.
    return int((fresh.get("metadata") or {}).get("generation") or 0) != generation


def _still_autoscaled(stored: Mapping[str, Any]) -> bool:
    """Whether the tuning read again still has spec.autoscaling: an evaluation that met a
    conflict with its removal would otherwise put back the conditions and status.autoscaling
    the controller removed with it."""
    return bool((stored.get("spec") or {}).get("autoscaling"))


@kopf.daemon(*RESOURCE, initial_delay=1.0,  # type: ignore[arg-type]
             cancellation_timeout=STOP_TIMEOUT_S,
             when=lambda spec, **_: bool(spec.get("autoscaling")))
async def autoscale(stopped: kopf.DaemonStopped, namespace: str, name: str, body: kopf.Body,
                    memo: kopf.Memo, logger: kopf.Logger,
                    tunings_by_target: kopf.Index[tuple[str, str], dict[str, Any]],
                    hpas_by_target: kopf.Index[tuple[str, str], str],
                    pods_by_deployment: kopf.Index[tuple[str, str], PodView],
                    **_: Any) -> None:
    """The tuning's autoscaling loop: asleep until the next slot of its interval, then one
    evaluation. `body` is kopf's live view, so every pass reads the tuning as it is now
    (`loops.snapshot`). It ends when kopf says stop (the tuning is deleted or loses
    spec.autoscaling, or the operator exits): kopf waits for that before it removes its
    finalizer, and cancels the loop if it does not return at once (`loops.pause`)."""
    settings: AutoscalingSettings = memo.autoscaling
    key = f"{namespace}/{name}"
    settings.autoscaled.add(key)
    try:
        await _autoscale(stopped, namespace, name, body, settings, key, logger,
                         tunings_by_target, hpas_by_target, pods_by_deployment)
    finally:
        settings.stopped(key)


async def _autoscale(stopped: kopf.DaemonStopped, namespace: str, name: str, body: kopf.Body,
                     settings: AutoscalingSettings, key: str, logger: kopf.Logger,
                     tunings_by_target: kopf.Index[tuple[str, str], dict[str, Any]],
                     hpas_by_target: kopf.Index[tuple[str, str], str],
                     pods_by_deployment: kopf.Index[tuple[str, str], PodView]) -> None:
    """The loop of `autoscale`."""
    loop = asyncio.get_running_loop()
    while not stopped:
        spec_now, status_now, meta_now = snapshot(body)
        generation = int(meta_now.get("generation") or 0)
        parsed = settings.parse(namespace, name, str(meta_now.get("uid") or ""), generation,
                                spec_now)
        if parsed is None or settings.source is None:
            if parsed is not None and settings.leader.leads():
                await until_stopped(_report_no_prometheus(
                    loop, settings, namespace, name, generation, status_now,
                    _version(meta_now)), stopped)
            # Invalid (the controller reports it), or nothing to evaluate with: look again
            # shortly, as a spec change may mend it.
            await pause(IDLE_S, stopped)
            continue
        now = time.time()
        if not settings.leader.leads():
            # Another operator process evaluates (`infertune run --leader-elect`). Looked at
            # again at each election round, so that a slot the other one left is evaluated
            # once this one leads: its first pass reads the status afresh, and a slot the
            # other one evaluated is not evaluated again.
            await pause(min(until_next_slot(parsed.interval_s, now), RETRY_PERIOD_S), stopped)
            continue
        settings.begin_term()
        wait = settings.until_due(key, parsed, now)
        if wait > 0 or settings.stored_in_slot(key, parsed, now, status_now):
            await pause(wait or settings.until_due(key, parsed, now), stopped)
            continue
        tunings = settings.listing(tunings_by_target, parsed, now)
        target = (namespace, parsed.spec.target_ref.name)
        writers = Writers(next(iter(hpas_by_target.get(target, [])), None),
                          autoscaling_rivals(tunings_by_target.get(target, []), name))
        settings.saw_pods(key, pods_by_deployment.get(target, []), now,
                          seconds(parsed.spec.metrics.window))
        # The worker thread gets this context: kopf.event finds kopf's event queue through it.
        # Status and resourceVersion are read together here, on the loop, so they match.
        run = functools.partial(contextvars.copy_context().run, _evaluate_if_due, settings, key,
                                parsed, tunings, namespace, name, generation, status_now,
                                _version(meta_now), writers, body)
        try:
            await until_stopped(loop.run_in_executor(settings.executor, run), stopped)
        except Exception as exc:  # one failed pass must not end the loop
            logger.exception("autoscaling evaluation failed; the next slot tries again")
            await until_stopped(_after_failure(loop, settings, namespace, name, generation,
                                               status_now, _version(meta_now), exc), stopped)
            await pause(IDLE_S, stopped)
        else:
            settings.failures.pop(key, None)



def _version(meta: Mapping[str, Any]) -> str | None:
    return str(meta.get("resourceVersion") or "") or None


async def _report_no_prometheus(loop: asyncio.AbstractEventLoop, settings: AutoscalingSettings,
                                namespace: str, name: str, generation: int,
                                status: dict[str, Any], resource_version: str | None) -> None:
    # MetricsAvailable too: an earlier operator's True would stand beside it, saying Found.
    await _report_not_evaluated(
        loop, settings, namespace, name, generation, status, resource_version, "NoPrometheus",
        "the operator runs without --prometheus-url, so spec.autoscaling cannot be evaluated",
        "not read: the operator runs without --prometheus-url")


async def _report_not_evaluated(loop: asyncio.AbstractEventLoop, settings: AutoscalingSettings,
                                namespace: str, name: str, generation: int,
                                status: dict[str, Any], resource_version: str | None,
                                reason: str, scaling: str, metrics: str,
                                limited: str = "nothing is decided (see ScalingActive)",
                                others: str = NOT_EVALUATED) -> None:
    """ScalingActive False with `reason`, MetricsAvailable and ScalingLimited Unknown with
    reason `others`: NotEvaluated (as the controller says them while nothing is evaluated:
    one name for one state, where alerts and dashboards key on it; ScalingActive says why),
    or NOT_RECORDED; with these messages, unless they say so already (written once while it
    lasts), and only while this process leads."""
    stamp = format_time(time.time())
    conditions = (
        condition_dict(ConditionType.SCALING_ACTIVE, ConditionStatus.FALSE, reason, scaling,
                       generation, stamp),
        condition_dict(ConditionType.METRICS_AVAILABLE, ConditionStatus.UNKNOWN, others,
                       metrics, generation, stamp),
        condition_dict(ConditionType.SCALING_LIMITED, ConditionStatus.UNKNOWN, others,
                       limited, generation, stamp))

    key = f"{namespace}/{name}"
    if (last := settings.reported.get(key)) is not None:
        # The metrics say it too: they kept the last evaluation's ScalingActive=True.
        settings.reported[key] = last._replace(conditions=reported_conditions(conditions))

    def build(stored: Mapping[str, Any]) -> dict[str, Any] | None:
        if not settings.leader.leads():
            return None
        if (stored_condition(stored, ConditionType.TARGET_FOUND) or {}).get("status") == \
                ConditionStatus.FALSE.value:
            # The controller says TargetNotFound in these three while the Deployment is
            # missing, and is their only writer then: written over every interval, the two
            # wrote them back and forth (every 15 s, for as long as it was missing).
            return None
        merged = merge_condition_dicts(stored.get("conditions") or [], *conditions)
        return None if merged is None else {"conditions": merged}

    if build(status) is not None:
        await loop.run_in_executor(settings.executor, _write_if_present, namespace, name,
                                   status, resource_version, build)


FAILURES_REPORTED = 2
"""Evaluations in a row that raise before ScalingActive says so (EvaluationFailed): one, an API
server's hiccup, would make the condition flap; every one that follows is logged too. They
kept saying Scaling and Found from the last evaluation that ran, for as long as it lasted."""
EVALUATION_FAILED = "EvaluationFailed"
NOT_RECORDED = "NotRecorded"
"""MetricsAvailable's and ScalingLimited's reason (Unknown) while evaluations decide and
write replicas but their status cannot be written."""


async def _after_failure(loop: asyncio.AbstractEventLoop, settings: AutoscalingSettings,
                         namespace: str, name: str, generation: int, status: dict[str, Any],
                         resource_version: str | None, exc: Exception) -> None:
    """Count an evaluation that raised, and report it in status from the FAILURES_REPORTED-th
    in a row (by the leader only: another process's evaluations may be going well)."""
    key = f"{namespace}/{name}"
    failures = settings.failures[key] = settings.failures.get(key, 0) + 1
    settings.failed_total[key] = settings.failed_total.get(key, 0) + 1
    if failures < FAILURES_REPORTED or not settings.leader.leads():
        return
    try:
        await _report_failure(loop, settings, namespace, name, generation, status,
                              resource_version, exc)
    except Exception:  # the API server that failed the pass may fail this too
        logger.exception("%s: the failed evaluations could not be reported in status", key)


async def _report_failure(loop: asyncio.AbstractEventLoop, settings: AutoscalingSettings,
                          namespace: str, name: str, generation: int, status: dict[str, Any],
                          resource_version: str | None, exc: Exception) -> None:
    """ScalingActive False (EvaluationFailed, with the error) and MetricsAvailable Unknown."""
    cause = (f"{exc.status} {server_message(exc)}" if isinstance(exc, ApiException)
             else f"{type(exc).__name__}: {exc}")
    if f"{namespace}/{name}" in settings.status_unwritable:
        # The evaluations decide and write replicas; only their status write fails (it is
        # kept for the next one, `Unwritten`). "Neither decided nor written" was false.
        scaling = (f"the status of evaluations cannot be written: {cause[:500]}; replicas "
                   "are still decided and written (each change with its Event), and the "
                   "status catches up once a write lands (the operator log has the "
                   "traceback)")
        metrics = limited = "not recorded: see ScalingActive"
        others = NOT_RECORDED  # evaluated, but not said: not NotEvaluated
    else:
        scaling = (f"evaluations keep failing, so replicas are neither decided nor written: "
                   f"{cause[:500]}; tried again every interval (the operator log has the "
                   "traceback)")
        metrics = "not evaluated: see ScalingActive"
        limited = "nothing is decided (see ScalingActive)"
        others = NOT_EVALUATED
    await _report_not_evaluated(
        loop, settings, namespace, name, generation, status, resource_version,
        EVALUATION_FAILED, scaling, metrics, limited, others)


def _write_if_present(namespace: str, name: str, status: dict[str, Any],
                      resource_version: str | None, build: Build) -> None:
    """Write `build` over the tuning's status while it still has spec.autoscaling (read again
    after a conflict: conditions put back over its removal would stay for good)."""
    try:
        write_status(namespace, name, status, resource_version, build,
                     still=_still_autoscaled)
    except ApiException as exc:
        if exc.status != 404:  # deleted meanwhile
            raise


def _evaluate_if_due(settings: AutoscalingSettings, key: str, parsed: Parsed, tunings: Listed,
                     namespace: str, name: str, generation: int, status: dict[str, Any],
                     resource_version: str | None, writers: Writers, body: kopf.Body) -> None:
    """The blocking part of a due pass, in a worker thread. A pass that runs close to the
    start of its slot evaluates as of that start (Prometheus read at that time, the state
    stamped with it), so a pass that waited for a worker decides as one that ran on time,
    and rate-limit periods do not hang on milliseconds. A later one (the operator was down
    at the start, or the tuning is new) evaluates as of now: its data would otherwise be up
    to an interval old (the batch it reads may have been fetched earlier in the slot: its
    signals say when, TargetSignals.read_at)."""
    clock = time.time()
    start = slot_start(clock, parsed.interval_s)
    now = start if clock - start <= SLOT_LATENESS_S else clock
    signals = signals_if_due(settings, key, parsed, tunings, now)
    if signals is None:
        return
    ended = settings.loops_ended.get(key, 0)
    try:
        _evaluate_now(settings, key, parsed, namespace, name, generation, status,
                      resource_version, writers, body, now, signals)
    finally:
        if settings.loops_ended.get(key, 0) != ended:
            # The loop ended while this pass ran in its thread (kopf lets it finish): what
            # it stored (the count it took as written) is forgotten again, or a count set
            # while spec.autoscaling was removed was a revert once it was back.
            settings.forget(key)


def _evaluate_now(settings: AutoscalingSettings, key: str, parsed: Parsed, namespace: str,
                  name: str, generation: int, status: dict[str, Any],
                  resource_version: str | None, writers: Writers, body: kopf.Body,
                  now: float, signals: TargetSignals) -> None:
    """`_evaluate_if_due`'s pass once its signals are read."""
    try:
        if _read_again(settings, key, status):
            api = client.CustomObjectsApi()
            fresh: dict[str, Any] = api.get_namespaced_custom_object_status(  # type: ignore[assignment]
                GROUP, VERSION, namespace, PLURAL, name)
            status = fresh.get("status") or {}
            resource_version = str(fresh["metadata"]["resourceVersion"])
            if (not _still_autoscaled(fresh)
                    or int(fresh["metadata"].get("generation") or 0) != generation):
                # The spec changed since kopf's copy this pass decided with (spec.autoscaling
                # removed, DryRun set): nothing is written for the old one. The slot counts as
                # done, and the next one decides with the new spec: evaluated again at once,
                # the loop would spin, reading the tuning, until kopf's copy caught up.
                return
            if settings.stored_in_slot(key, parsed, now, status):
                return  # evaluated in this slot by the operator this one replaces
            if (key not in settings.evaluated_at and not settings.leader.exclusive
                    and _another_evaluates(parsed, now, status)):
                return  # looked at again next slot: taken over once it stops
        if not settings.leader.leads():
            # Lost meanwhile (the API server slow): the new leader evaluates; the slot is not
            # counted, so that this process evaluates it if it leads again within it.
            settings.last_slot.pop(key, None)
            return
        evaluate(namespace, name, generation, parsed.spec, status, signals, settings, writers,
                 body, now, resource_version)
        settings.evaluated_at[key] = now
    except ApiException as exc:
        if exc.status == 404:
            # The target (or the tuning) is missing; the controller reports it. Its series
            # go: they said Scaling and TooManyReplicas for a Deployment gone.
            settings.reported.pop(key, None)
            return
        raise


TAKEOVER_MAX_INTERVAL_S = 60.0
"""Up to this interval, a process's first evaluation of a tuning waits while another operator
evaluates it (`_another_evaluates`); longer intervals would hold autoscaling too long after a
restart, and two operators rarely meet at one of their slot starts."""


def _another_evaluates(parsed: Parsed, now: float, status: Mapping[str, Any]) -> bool:
    """Whether the status shows an evaluation of the previous slot: another operator may be
    evaluating this tuning (the old one of a rolling upgrade, which runs for a few seconds
    beside the new one). Then this process waits a slot; when one passes without a new
    evaluation, it takes over. Two operators evaluating one slot would each take the other's
    write for a revert, and decide from a state without the other's scale event. After a
    restart (the last evaluation was this operator's own) it costs one to two intervals."""
    if parsed.interval_s > TAKEOVER_MAX_INTERVAL_S:
        return False
    evaluated = stored_evaluation(status)
    start = slot_start(now, parsed.interval_s)
    return evaluated is not None and start - parsed.interval_s - 1e-3 <= evaluated < start


def until_next_slot(interval_s: float, now: float) -> float:
    """Seconds from `now` until just after the next slot of `interval_s` starts."""
    next_slot = (math.floor(now / interval_s) + 1) * interval_s
    return next_slot - now + SLOT_MARGIN_S


def slot_start(clock: float, interval_s: float) -> float:
    """The start of the slot `clock` is in, as a time whose own slot is that slot: k x 1.679
    in floats can be a hair below k x 1.679, whose floor(t / interval) is then k - 1, and
    the pass then found its slot evaluated and the loop spun until the next one."""
    slot = math.floor(clock / interval_s)
    start = slot * interval_s
    while math.floor(start / interval_s) < slot:
        start = math.nextafter(start, math.inf)
    return start


def _read_again(settings: AutoscalingSettings, key: str, status: Mapping[str, Any]) -> bool:
    """Whether to read the tuning's status from the API server rather than decide from kopf's
    copy: on this process's first evaluation of it (during a rolling upgrade the operator it
    replaces may have just evaluated and written, and a stale copy would take that write for
    a revert), and when the copy predates this process's own last write (the watch lags:
    the state written back would lack that evaluation's scale event)."""
    last = settings.evaluated_at.get(key)
    if last is None:
        return True
    evaluated = stored_evaluation(status)
    return evaluated is None or evaluated < last - 1e-3


def evaluated_in_slot(status: Mapping[str, Any], now: float, interval_s: float) -> bool:
    """Whether `status` holds an evaluation of the slot `now` is in (stamped with its start,
    `slot_start`); a stamp after the slot (a clock ahead, an edit) is not one."""
    evaluated = stored_evaluation(status)
    start = slot_start(now, interval_s)
    return evaluated is not None and start - 1e-3 <= evaluated < start + interval_s


def stored_evaluation(status: Mapping[str, Any]) -> float | None:
    """When the evaluation stored in status.autoscaling.evaluated was made (unix time); None
    when there is none, or it is not a time (edited by hand)."""
    return stored_time((status.get("autoscaling") or {}).get("evaluated"))
