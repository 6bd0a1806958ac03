"""What the autoscaler remembers between evaluations, as plain data the operator keeps in status.

HPA keeps its recommendations and scale events in memory, so a restarted kube-controller-manager
forgets its stabilization window. We store them in status instead, so a restarted operator
resumes with the same window and the same rate-limit periods.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from datetime import UTC, datetime
from functools import lru_cache
from operator import itemgetter
from typing import Any, NamedTuple

from infertune.api.units import duration_seconds

TIME_CACHE = 65536
"""Entries of the time caches: the stored states of 1000 tunings hold ~21,000 distinct times
(20 recommendations each at the default interval), and each evaluation reads and writes them
all again; a cache smaller than that set would miss on every one."""


UNREADABLE = (KeyError, TypeError, ValueError, AttributeError)
"""What reading a status entry edited by hand into another shape raises."""


@lru_cache(maxsize=TIME_CACHE)
def format_time(t: float) -> str:
    """RFC 3339 in UTC, the format of every time in status (cached: see TIME_CACHE)."""
    return datetime.fromtimestamp(t, tz=UTC).isoformat().replace("+00:00", "Z")


@lru_cache(maxsize=TIME_CACHE)
def parse_time(text: str) -> float:
    """The time `format_time` wrote (cached: see TIME_CACHE). ValueError for text that is not
    one, and for a time `format_time` cannot write back: `0001-01-01T00:00:00+01:00`
    (edited by hand; the CRD types times as plain strings) lies before year 1 in UTC, and
    carried on into the status written next, it raised at every evaluation."""
    t = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    datetime.fromtimestamp(t, tz=UTC)  # ValueError (year 0 or 10000) where format_time fails
    return t


def stored_time(value: Any) -> float | None:
    """A time a status field holds, or None when it holds none, or something that is not
    one (edited by hand)."""
    if not isinstance(value, str):
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


class Recommendation(NamedTuple):
    """One unstabilized recommendation (HPA's timestampedRecommendation)."""

    time: float
    replicas: int


class ScaleEvent(NamedTuple):
    """One applied change of replicas, positive up and negative down (timestampedScaleEvent)."""

    time: float
    change: int


class Serving(NamedTuple):
    """The replicas known to serve (engine._serving), and what they were counted against."""

    replicas: int
    """The most that were Ready at once since, never more than the replicas since (a
    scale-in removes the pods not Ready first). Pods added later, by anyone, join only once
    Ready; a pod that served and then failed its readiness probe stays."""
    of: int
    """The Deployment's replicas when `replicas` was counted."""
    since: float
    """Since when both have been as they are."""
    changed: float | None = None
    """When the pods that serve last changed (Ready pods joined, or a scale-in removed some):
    a latency sample reaching back before it was measured on other pods. None when no change
    was seen since the first reading."""


OPEN, CURED, NOT_LOAD = "Open", "Cured", "NotLoad"
OUTCOMES = (OPEN, CURED, NOT_LOAD)
"""What a Breach's `outcome` may be."""


class Breach(NamedTuple):
    """A latency breach, for what it says of the load a replica can carry
    (engine._breach_floor): the request rate per replica at which the latency stayed above
    its target."""

    time: float
    """When it last mattered (the breach, or the last scale-in it limited): it is remembered
    for spec.autoscaling.latency.breachMemory after it."""
    rate: float
    """Requests per second across the target (finite, above 0)."""
    replicas: int
    """The replicas serving then (the latency was measured on them; at least 1)."""
    target: str
    """latency.target then: a breach of another target says nothing of this one."""
    quantile: float
    """latency.quantile then."""
    outcome: str = OPEN
    """OPEN while no latency at or under the target was measured since, CURED once one was,
    NOT_LOAD once the replicas added did not lower it (engine._breach_outcomes): the latency
    is then not the load's."""
    latency: float = 0.0
    """The latency then, in seconds (0: not known)."""
    healthy: float = 0.0
    """The most requests per second per replica, under this breach's, that the latency was
    measured at or under the target with since (0: none)."""
    since: float | None = None
    """When it breached (`time` is when it last mattered: the breach, or the last scale-in
    it limited); None: at `time`."""

    doubted: float | None = None
    """When a breach at a rate per replica under `healthy` was taken for a burst and not
    remembered (engine._breach_outcomes); None when none was within breachMemory."""

    overloaded: float | None = None
    """When the queue last stayed above its target at a rate per replica under this
    breach's, which `rate` and `replicas` then are (engine._queue_overload); None: they are
    the latency breach's own."""

    @property
    def breached_at(self) -> float:
        return self.time if self.since is None else self.since

    @property
    def per_replica(self) -> float:
        return self.rate / self.replicas


class QueueSeen(NamedTuple):
    """The queue as the last evaluation that had it read it, to tell a backlog the replicas
    drain from the load they do not carry (engine._track_queue)."""

    time: float
    """When it was read (the evaluation's time)."""
    waiting: float
    """Requests waiting across the pods that reported it."""
    pods: int
    """The pods that reported it (the replicas when not known; at least 1)."""
    replicas: int
    """The Deployment's replicas then."""
    fell: float | None = None
    """When the requests waiting were last seen falling as a backlog drains
    (engine._track_queue): from engine.BACKLOG_ABOVE times the target or more, at
    evaluations in a row, by more than engine.BACKLOG_FALL. None: never seen so."""
    falling_from: float | None = None
    """The requests waiting when the fall this reading is part of began (the reading
    before its first); None: this reading found no fewer than the one before."""


class Carried(NamedTuple):
    """The most requests per second per replica the latency was measured at or under its
    target with, the queue not above its own (engine._carried): no scale-in leaves a replica
    much more than that (engine._carried_floor)."""

    per_replica: float
    """Requests per second per serving replica then (finite, above 0)."""
    time: float
    """When it was measured, or last renewed by a reading within the tolerance under it:
    kept for latency.breachMemory after that (a higher reading takes its place), then taken
    again from the next reading measured fine."""
    target: str
    """latency.target then: what was fine for another target or quantile says nothing of
    this one."""
    quantile: float
    """latency.quantile then."""
    failed: float | None = None
    """When the latency last breached with the load's (engine._carried_floor: no step of
    one replica for latency.breachMemory after it); None: not since it was measured."""


_time: Callable[[Recommendation | ScaleEvent | Breach], float] = itemgetter(0)
"""An entry's time (the first field of both), as a sort and bisect key: a C function, called
for each entry of every state read back."""


class ScalingState(NamedTuple):
    """A named tuple, as the other per-cycle values: one or two are built per tuning per
    evaluation, and a frozen dataclass costs several times more to build."""

    recommendations: tuple[Recommendation, ...] = ()
    scale_events: tuple[ScaleEvent, ...] = ()
    metrics_missing_since: float | None = None
    """When every signal went missing; None while at least one signal has data."""
    serving: Serving | None = None
    """None until an evaluation reads the Deployment's readiness."""
    breaches: tuple[Breach, ...] = ()
    """Latency breaches within breachMemory, at most MAX_BREACHES (engine._breach_outcomes,
    engine._added)."""
    queue: QueueSeen | None = None
    """The queue at the last evaluation that read it; None before one did."""
    carried: Carried | None = None
    """The most a replica was measured to carry well within latency.breachMemory; None: not
    measured (or breachMemory 0s)."""

    def with_breaches(self, breaches: tuple[Breach, ...]) -> ScalingState:
        """This state with `breaches` (positional: NamedTuple._replace costs several times
        more, once per tuning per cycle)."""
        return ScalingState(self.recommendations, self.scale_events, self.metrics_missing_since,
                            self.serving, breaches, self.queue, self.carried)

    def recorded(self, now: float, recommendation: Recommendation, keep_recommendations_s: float,
                 keep_events_s: float, keep_last_scale_in_s: float = 0.0) -> ScalingState:
        """This state with `recommendation` added, keeping only what a stabilization window or a
        rate-limit period can still read.

        A recommendation older than both windows is dropped, and so is one that a later
        recommendation matches or beats in both directions (one as high or higher, one as low
        or lower): that later one stays in every window at least as long, so the highest and
        the lowest in any window are the same without it. A steady load keeps one entry, not
        one per evaluation. Both tuples are in time order, so the old ones are a prefix.
        """
        cutoff = now - keep_recommendations_s
        recent = self.recommendations[bisect_right(self.recommendations, cutoff, key=_time):]
        kept = [recommendation] if recommendation.time > cutoff else []
        low = high = recommendation.replicas
        for older in reversed(recent):  # newest first: low/high are the extremes after it
            if older.replicas > high:
                high = older.replicas
            elif older.replicas < low:
                low = older.replicas
            else:
                continue
            kept.append(older)
        kept.reverse()
        first_event = bisect_right(self.scale_events, now - keep_events_s, key=_time)
        events = self.scale_events[first_event:]
        if (not events and self.scale_events and self.scale_events[-1].change < 0
                and self.scale_events[-1].time > now - keep_last_scale_in_s):
            # The last change, a scale-in, for `keep_last_scale_in_s`: the queue's overload
            # that follows it says it went too far (engine._queue_overload). It counts in no
            # rate limit past their periods.
            events = self.scale_events[-1:]
        return ScalingState(tuple(kept), events, self.metrics_missing_since, self.serving,
                            self.breaches, self.queue, self.carried)

    def as_of(self, now: float) -> ScalingState:
        """This state with no time after `now`. A stored time in the future means the clock
        stepped back (NTP), or the operator that stored it ran on a node whose clock is ahead:
        such an entry is taken as made now, so a window holds it as long as one made now,
        not for as long as the clocks were apart (a future scale-up held every later one).
        Both tuples are in time order (`from_json` sorts them), so only the last entries
        can be in the future."""
        recs, events, missing = self.recommendations, self.scale_events, self.metrics_missing_since
        if ((not recs or recs[-1].time <= now) and (not events or events[-1].time <= now)
                and (missing is None or missing <= now)
                and (self.serving is None or (self.serving.since <= now and (
                    self.serving.changed is None or self.serving.changed <= now)))
                and all(b.time <= now and b.breached_at <= now
                        and (b.doubted is None or b.doubted <= now)
                        and (b.overloaded is None or b.overloaded <= now)
                        for b in self.breaches)
                and (self.queue is None or (self.queue.time <= now and (
                    self.queue.fell is None or self.queue.fell <= now)))
                and (self.carried is None or (self.carried.time <= now and (
                    self.carried.failed is None or self.carried.failed <= now)))):
            return self
        return ScalingState(
            tuple(r if r.time <= now else Recommendation(now, r.replicas) for r in recs),
            tuple(e if e.time <= now else ScaleEvent(now, e.change) for e in events),
            None if missing is None else min(missing, now),
            None if (serving := self.serving) is None else serving._replace(
                since=min(serving.since, now),
                changed=None if serving.changed is None else min(serving.changed, now)),
            tuple(b if b.time <= now and b.breached_at <= now
                  and (b.doubted is None or b.doubted <= now)
                  and (b.overloaded is None or b.overloaded <= now)
                  else b._replace(time=min(b.time, now), since=min(b.breached_at, now),
                                  doubted=None if b.doubted is None else min(b.doubted, now),
                                  overloaded=None if b.overloaded is None
                                  else min(b.overloaded, now))
                  for b in self.breaches),
            None if (queue := self.queue) is None else queue._replace(
                time=min(queue.time, now),
                fell=None if queue.fell is None else min(queue.fell, now)),
            None if (carried := self.carried) is None else carried._replace(
                time=min(carried.time, now),
                failed=None if carried.failed is None else min(carried.failed, now)))

    def to_json(self) -> dict[str, Any]:
        """The shape stored in status (camelCase, RFC 3339 times)."""
        return {
            "recommendations": [{"time": format_time(r.time), "replicas": r.replicas}
                                for r in self.recommendations],
            "scaleEvents": [{"time": format_time(e.time), "change": e.change}
                            for e in self.scale_events],
            "metricsMissingSince": (None if self.metrics_missing_since is None
                                    else format_time(self.metrics_missing_since)),
            "serving": None if (serving := self.serving) is None else {
                "replicas": serving.replicas, "of": serving.of,
                "since": format_time(serving.since),
                "changed": None if serving.changed is None else format_time(serving.changed)},
            "latencyBreaches": [{"time": format_time(b.time), "requestRate": b.rate,
                                 "replicas": b.replicas, "target": b.target,
                                 "quantile": b.quantile, "outcome": b.outcome,
                                 "latencySeconds": b.latency,
                                 "healthyPerReplica": b.healthy,
                                 "since": format_time(b.breached_at),
                                 "doubted": None if b.doubted is None
                                 else format_time(b.doubted),
                                 "queueOverloaded": None if b.overloaded is None
                                 else format_time(b.overloaded)}
                                for b in self.breaches],
            "queue": None if (queue := self.queue) is None else {
                "time": format_time(queue.time), "waiting": queue.waiting, "pods": queue.pods,
                "replicas": queue.replicas,
                "fell": None if queue.fell is None else format_time(queue.fell),
                "fallingFrom": queue.falling_from},
            "carried": None if (carried := self.carried) is None else {
                "perReplica": carried.per_replica, "time": format_time(carried.time),
                "target": carried.target, "quantile": carried.quantile,
                "failed": None if carried.failed is None else format_time(carried.failed)},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ScalingState:
        """Read what `to_json` wrote; a missing or partial block gives an empty state, and an
        entry that cannot be read (a time edited by hand) is left out: raised, it stopped
        every evaluation of the tuning for good, with ScalingActive still saying Scaling."""
        if not data:
            return cls()
        try:
            return cls._read(data)
        except UNREADABLE:
            return cls._read(data, tolerant=True)

    @classmethod
    def _read(cls, data: dict[str, Any], tolerant: bool = False) -> ScalingState:
        missing, serving = data.get("metricsMissingSince"), data.get("serving")
        breaches, queue = data.get("latencyBreaches"), data.get("queue")
        carried = data.get("carried")
        if tolerant:
            data = {
                "recommendations": _readable(data.get("recommendations"), ("time", "replicas")),
                "scaleEvents": _readable(data.get("scaleEvents"), ("time", "change"))}
            missing = missing if _readable([{"time": missing}], ("time",)) else None
            serving = serving if _readable([serving], ("since", "replicas", "of")) else None
            if serving and serving.get("changed") is not None and not _readable(
                    [{"time": serving.get("changed")}], ("time",)):
                serving = {**serving, "changed": None}
            breaches = [b for b in breaches if _reads(_breach, b)] \
                if isinstance(breaches, list) else None
            queue = queue if _reads(_queue, queue) else None
            carried = carried if _reads(_carried, carried) else None
        # Sorted: a state stored across a clock step, or edited by hand, may be out of order,
        # and `recorded` drops old entries as a prefix.
        return cls(
            tuple(sorted([Recommendation(parse_time(r["time"]), int(r["replicas"]))
                          for r in data.get("recommendations") or ()], key=_time)),
            tuple(sorted([ScaleEvent(parse_time(e["time"]), int(e["change"]))
                          for e in data.get("scaleEvents") or ()], key=_time)),
            None if missing is None else parse_time(missing),
            None if not serving else Serving(
                int(serving["replicas"]), int(serving["of"]), parse_time(serving["since"]),
                None if serving.get("changed") is None else parse_time(serving["changed"])),
            tuple(sorted([_breach(b) for b in breaches or ()], key=_time)),
            None if not queue else _queue(queue),
            None if not carried else _carried(carried),
        )


def _readable(entries: Any, fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """The entries whose `fields` read as a time (the first) and integers (the others)."""
    out = []
    for entry in entries if isinstance(entries, list) else ():
        try:
            parse_time(entry[fields[0]])
            for name in fields[1:]:
                int(entry[name])
        except UNREADABLE:
            continue
        out.append(entry)
    return out


def _breach(data: dict[str, Any]) -> Breach:
    """A stored latencyBreaches entry; ValueError when it cannot be one (a rate per replica
    needs a finite rate and at least one replica, and a rate per replica that is a number
    above 0)."""
    breach = Breach(parse_time(data["time"]), float(data["requestRate"]), int(data["replicas"]),
                    str(data["target"]), float(data["quantile"]), str(data["outcome"]),
                    float(data["latencySeconds"]), float(data["healthyPerReplica"]),
                    None if data.get("since") is None else parse_time(data["since"]),
                    None if data.get("doubted") is None else parse_time(data["doubted"]),
                    None if data.get("queueOverloaded") is None
                    else parse_time(data["queueOverloaded"]))
    duration_seconds(breach.target)  # compared with the spec's as a duration
    if breach.outcome not in OUTCOMES:
        raise ValueError(f"latencyBreaches entry {data} has no outcome of {OUTCOMES}")
    if not (math.isfinite(breach.rate) and breach.replicas >= 1 and breach.per_replica > 0
            and math.isfinite(breach.latency) and breach.latency >= 0
            and math.isfinite(breach.healthy) and breach.healthy >= 0):
        raise ValueError(f"latencyBreaches entry {data} is not a breach")
    return breach


def _queue(data: dict[str, Any]) -> QueueSeen:
    """A stored `queue`; ValueError when it cannot be one (a finite count waiting, 0 or
    more, over at least one pod)."""
    queue = QueueSeen(parse_time(data["time"]), float(data["waiting"]), int(data["pods"]),
                      int(data["replicas"]),
                      None if data.get("fell") is None else parse_time(data["fell"]),
                      None if data.get("fallingFrom") is None else float(data["fallingFrom"]))
    if not (math.isfinite(queue.waiting) and queue.waiting >= 0 and queue.pods >= 1
            and queue.replicas >= 0 and (queue.falling_from is None or (
                math.isfinite(queue.falling_from) and queue.falling_from >= 0))):
        raise ValueError(f"queue {data} is not a reading of the queue")
    return queue


def _carried(data: dict[str, Any]) -> Carried:
    """A stored `carried`; ValueError when it cannot be one (a finite rate above 0)."""
    carried = Carried(float(data["perReplica"]), parse_time(data["time"]), str(data["target"]),
                      float(data["quantile"]),
                      None if data.get("failed") is None else parse_time(data["failed"]))
    duration_seconds(carried.target)  # compared with the spec's as a duration
    if not (math.isfinite(carried.per_replica) and carried.per_replica > 0):
        raise ValueError(f"carried {data} is not a request rate per replica")
    return carried


def _reads(read: Callable[[Any], object], data: Any) -> bool:
    """Whether `read` (_breach, _queue) reads `data` as stored, without raising."""
    try:
        read(data)
    except UNREADABLE:
        return False
    return True
