"""A fight over replicas with another writer, remembered in status and given up in steps.

When something else puts the replicas back after the operator wrote them (GitOps without
`ignoreDifferences` on /spec/replicas, a person, a script), writing again would only make the
two oscillate. Each revert below FIGHT_LIMIT is said in a Warning Event; at FIGHT_LIMIT the
operator stops writing and says why. The fight is
kept in `status.autoscaling.replicaFight`, not in memory, so a restarted operator does not
start the oscillation over. It does not last forever either: writes are tried again after a
backoff that doubles with each further revert (so fixing the other writer is enough to resume),
at once when the tuning's spec changes (a new generation), and a fight with no revert for
QUIET_S, plus the longer scale period (a write the rate limits hold back comes that much later,
and only a write can be reverted), is over.

A pure function of what was stored, whether a revert was seen now, and the time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from pydantic import ValidationError

from infertune.api.spec import InferenceTuningSpec, Mode
from infertune.api.units import format_duration
from infertune.controller.scaling_report import HPA_PRESENT, SEVERAL_TUNINGS, Blocked
from infertune.kube.client import OWN_SCALE_WRITE
from infertune.scaling.state import (
    UNREADABLE,
    ScaleEvent,
    ScalingState,
    format_time,
    parse_time,
    stored_time,
)

FIGHT_LIMIT = 2
"""Reverts by another writer before the operator stops writing replicas."""
REPLICAS_REVERTED = "ReplicasReverted"
"""The reason of the Warning Event of a revert that does not stop writes yet."""
BACKOFF_S = 300.0
"""How long writes stop at FIGHT_LIMIT reverts; doubled for each revert after it."""
MAX_BACKOFF_S = 3600.0
MAX_DOUBLINGS = math.ceil(math.log2(MAX_BACKOFF_S / BACKOFF_S))
"""Doublings of the backoff that reach MAX_BACKOFF_S; more would not change it."""
QUIET_S = 3 * 3600.0
"""A fight with no revert for this long (and no longer blocking) is over. Longer than the
intervals GitOps tools put replicas back at: Argo CD's refresh (3 min), and a Flux
Kustomization's `interval`, which corrects drift at each reconcile (10 min to an hour is
common, plus jitter). At 10 minutes, a writer reverting every hour was never counted twice,
and each of its reverts took the replicas away again, without a word."""


class Fight(NamedTuple):
    reverts: int
    since: float
    """When the first revert of this fight was seen."""
    last_revert: float
    generation: int
    """The tuning's generation when it was last reverted; a new one ends the fight."""
    retry_at: float | None
    """Writes stop until then (None: below FIGHT_LIMIT, still writing)."""
    by: str | None = None
    """Who set the replicas at the last revert, as the Deployment's managedFields say
    (`writer_of`); None when they do not say."""

    def blocks(self, now: float) -> bool:
        return self.retry_at is not None and now < self.retry_at

    def as_of(self, now: float) -> Fight:
        """This fight with no time after `now` (and no retry later than its backoff from
        now). A time in the future was stored by a clock ahead, or before the clock stepped
        back: taken as now, as ScalingState.as_of takes it, so it blocks for the backoff
        and not for as long as the clocks were apart."""
        latest = now + backoff(self.reverts)
        if (self.since <= now and self.last_revert <= now
                and (self.retry_at is None or self.retry_at <= latest)):
            return self
        return self._replace(since=min(self.since, now),
                             last_revert=min(self.last_revert, now),
                             retry_at=None if self.retry_at is None
                             else min(self.retry_at, latest))

    def to_json(self) -> dict[str, Any]:
        """As api.status.ReplicaFight."""
        return {"reverts": self.reverts, "since": format_time(self.since),
                "lastRevert": format_time(self.last_revert),
                "observedGeneration": self.generation,
                "retryAt": None if self.retry_at is None else format_time(self.retry_at),
                "by": self.by}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Fight | None:
        """What `to_json` wrote; None for nothing or a block that cannot be read."""
        if not data:
            return None
        try:
            retry, by = data.get("retryAt"), data.get("by")
            return cls(int(data["reverts"]), parse_time(data["since"]),
                       parse_time(data["lastRevert"]), int(data["observedGeneration"]),
                       None if retry is None else parse_time(retry),
                       by if isinstance(by, str) else None)
        except UNREADABLE:
            return None


def backoff(reverts: int) -> float:
    # The exponent is capped first: 2.0 ** 1024 overflows (a fight of a thousand reverts).
    doublings = min(max(reverts - FIGHT_LIMIT, 0), MAX_DOUBLINGS)
    return min(BACKOFF_S * 2.0 ** doublings, MAX_BACKOFF_S)


def written_replicas(status: Mapping[str, Any], deployment: str,
                     created: float | None = None) -> int | None:
    """status.autoscaling.writtenReplicas: the replicas the operator wrote to `deployment`
    that still stood at its last evaluation; None when unset, not a count, or written to
    another Deployment (spec.targetRef changed since: the new target's count is no revert;
    or the Deployment was created again since, `recreated`)."""
    block = status.get("autoscaling") or {}
    stored = block.get("writtenReplicas")
    if block.get("writtenTarget", deployment) != deployment or recreated(status, created):
        return None
    return stored if isinstance(stored, int) and not isinstance(stored, bool) else None


def lost_scale_event(status: Mapping[str, Any], deployment: str, replicas: int,
                     own_write_last: bool, now: float,
                     remembered: int | None = None) -> ScaleEvent | None:
    """The scale event of a replicas write of the operator's that the stored status does not
    hold: the process that made it stopped before its status write (a crash, a rolling
    upgrade). The Deployment's managedFields say the operator's scale write set its
    `replicas` last (`own_write_last`); the count it changed is the last one the status
    stored, or `remembered`, the count the asking process wrote itself. Left out, the next
    process scaled again at once, past the rate limits. It is counted as made `now`: the API
    server keeps no time for the scale subresource's entry, and a time too late holds the
    next change at most one period longer, where one too early lets it through sooner than
    the user allows. None when nothing was lost."""
    if not own_write_last:
        return None
    block = status.get("autoscaling") or {}
    if block.get("target", deployment) != deployment:
        return None
    before = remembered
    if before is None:
        before = written_replicas(status, deployment)
    if before is None:
        stored = block.get("currentReplicas")
        before = stored if isinstance(stored, int) and not isinstance(stored, bool) else None
    if before is None or before == replicas:
        return None
    return ScaleEvent(now, replicas - before)


def with_scale_event(status: Mapping[str, Any], event: ScaleEvent) -> dict[str, Any]:
    """`status` with `event` added to the stored scaling state."""
    block = dict(status.get("autoscaling") or {})
    state = ScalingState.from_json(block.get("state"))
    block["state"] = state._replace(scale_events=(*state.scale_events, event)).to_json()
    return {**status, "autoscaling": block}


def recreated(status: Mapping[str, Any], created: float | None) -> bool:
    """Whether the target Deployment, created at `created` (its creationTimestamp, None
    when not known), is newer than the last evaluation the status holds: deleted and
    created again since (Argo CD's Replace=true, `helm --force`, a selector change), it is
    another object, whose replicas come from its manifest and revert nothing. Taken for a
    revert, two re-creations made a ReplicaFight that blamed GitOps and stopped the writes."""
    evaluated = stored_time((status.get("autoscaling") or {}).get("evaluated"))
    # creationTimestamp is in whole seconds: one in the second of the evaluation counts as
    # after it (at worst, a revert in the Deployment's first interval goes uncounted).
    return created is not None and evaluated is not None and created >= math.floor(evaluated)


def is_revert(written: int | None, current: int, writes: bool, own_write_last: bool) -> bool:
    """Whether `current` replicas undo the `written` ones the operator wrote last: only while
    it writes replicas (`writes`: autoscaling enabled, mode Enforce; otherwise they are the
    user's), and not when the Deployment's managedFields say its own scale write set them
    last (`own_write_last`: a write whose status write was lost, or that landed late). Nor
    at 0: scaling the Deployment to 0 is how it is paused (left alone, as HPA leaves it), and
    a pause twice in three hours read as a fight that held the scale-out after the resume."""
    return (writes and written is not None and current != written and current != 0
            and not own_write_last)


def next_fight(stored: Fight | None, generation: int, reverted: bool, now: float,
               hold_s: float = 0.0, by: str | None = None) -> Fight | None:
    """The fight after this evaluation: `reverted` says whether another writer changed the
    replicas the operator last wrote. `hold_s` is how long the rate limits may hold the next
    write back (the longer of the scale periods, `quiet_hold`): a quiet time in which no write
    could be reverted proves nothing, and with a 15 min period the fight ended before the
    next write, so the other writer was never counted twice and the two oscillated for good.
    `by`: who set the replicas now (`writer_of`), kept with a revert."""
    fight = (stored.as_of(now) if stored is not None and stored.generation == generation
             else None)
    if reverted:
        reverts = (fight.reverts if fight is not None else 0) + 1
        retry_at = now + backoff(reverts) if reverts >= FIGHT_LIMIT else None
        since = fight.since if fight is not None else now
        return Fight(reverts, since, now, generation, retry_at, by)
    if fight is not None and not fight.blocks(now) and (
        now - max(fight.last_revert, fight.retry_at or 0.0) >= QUIET_S + hold_s
    ):
        return None
    return fight


def quiet_hold(spec: InferenceTuningSpec) -> float:
    """How long after a revert the rate limits may hold the next write (next_fight's
    `hold_s`): the longer of the scale-up and scale-down periods."""
    scaling = spec.autoscaling
    if scaling is None:
        return 0.0
    return max(scaling.scale_up.period.seconds, scaling.scale_down.period.seconds)


def writer_of(owners: Iterable[tuple[str, str]]) -> str | None:
    """Who other than the operator owns a Deployment's spec.replicas, from its managedFields
    entries (manager, subresource) (kube.client.replicas_owners), for a message: "kubectl
    through the scale subresource", "argocd-controller"; None when no one does."""
    said = [f"{manager} through the {subresource} subresource" if subresource else manager
            for manager, subresource in owners
            if manager and (manager, subresource) != OWN_SCALE_WRITE]
    return ", ".join(said[:3]) or None


def _writer(fight: Fight) -> str:
    """Who reverted, for the messages: named when the managedFields said, else a guess."""
    if fight.by is not None:
        return f"another writer ({fight.by}, as the Deployment's managedFields say)"
    return "another writer (GitOps without ignoreDifferences on /spec/replicas?)"


def revert_message(fight: Fight, deployment: str, current: int, hold_s: float = 0.0) -> str:
    """The Warning Event of a revert that does not stop writes yet (below FIGHT_LIMIT);
    `hold_s` as for `next_fight`."""
    left = FIGHT_LIMIT - fight.reverts
    within = format_duration(QUIET_S + hold_s)
    return (f"{_writer(fight)} changed the replicas of {deployment} the operator had written "
            f"(now {current}); {left} more within {within} and the operator stops "
            f"writing them for {BACKOFF_S / 60:g} min (docs/autoscaling.md, Argo CD)")


def fight_message(fight: Fight, deployment: str) -> str:
    """Why replicas are not written, and when they will be again (a condition message: it
    changes only with the fight)."""
    assert fight.retry_at is not None
    return (f"{_writer(fight)} reverted the replicas of {deployment} {fight.reverts} times; "
            f"replicas are not written until {format_time(fight.retry_at)}, then tried "
            "again (at once if the spec changes)")


class Writers(NamedTuple):
    """The other writers of the Deployment's replicas that the operator knows of."""

    hpa: str | None = None
    """An HPA that scales it."""
    tunings: tuple[str, ...] = ()
    """Other InferenceTunings that autoscale it (each would count the others' writes as
    reverts, and they would take turns)."""


def autoscaling_rivals(entries: Iterable[Mapping[str, Any]], own: str) -> tuple[str, ...]:
    """The names of the tunings among `entries` (index entries or stored objects of the same
    Deployment) other than `own` that autoscale it. A tuning in mode DryRun writes no
    replicas, so it is no rival: a dry-run trial next to the tuning that scales the Deployment
    must not stop it. Nor is one whose spec does not validate (its status says why): it is
    never evaluated, and it held the valid tuning's writes until someone fixed or deleted
    it. Once it validates, both stop writing."""
    names = []
    for entry in entries:
        name = str((entry.get("metadata") or {}).get("name") or entry.get("name") or "")
        spec = entry.get("spec") or {}
        scaling = spec.get("autoscaling")
        if (name != own and isinstance(scaling, dict) and scaling.get("enabled", True)
                and spec.get("mode") != Mode.DRY_RUN.value and _validates(spec)):
            names.append(name)
    return tuple(sorted(names))


def _validates(spec: Mapping[str, Any]) -> bool:
    try:
        InferenceTuningSpec.model_validate(spec)
    except ValidationError:
        return False
    return True


def blocked_by(deployment: str, writers: Writers, fight: Fight | None,
               now: float) -> Blocked | None:
    """Why replicas are not written now although the spec says Enforce: other tunings that
    autoscale the same Deployment, an HPA on it, or a fight that is backing off; None when
    they may be."""
    if writers.tunings:
        return Blocked(SEVERAL_TUNINGS, f"InferenceTunings {', '.join(writers.tunings)} also "
                       f"autoscale {deployment}; replicas are not written until only one does")
    hpa = writers.hpa
    if hpa is not None:
        return Blocked(HPA_PRESENT, f"HorizontalPodAutoscaler {hpa} also "
                       f"scales {deployment}; remove the HPA, or set "
                       "spec.autoscaling.enabled to false")
    if fight is not None and fight.blocks(now):
        return Blocked("ReplicaFight", fight_message(fight, deployment))
    return None
