"""Re-tuning: which outdated pods to evict next. Pure, like the HPA's replica calculator."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class PodView:
    """What re-tuning needs to know about one pod of the target."""

    name: str
    revision: str | None
    """The infertune.io/revision label; None for pods that were never tuned."""
    ready: bool
    terminating: bool = False
    created: str = ""
    """creationTimestamp (RFC 3339, UTC), which orders lexically."""


@dataclass(frozen=True)
class RetuneStep:
    """The pods to evict now, the counts for status, and why."""

    evict: tuple[str, ...]
    tuned: int
    outdated: int
    reason: str


def plan_retune(revision: str, pods: Iterable[PodView], max_unavailable: int,
                last_eviction: str | None = None) -> RetuneStep:
    """Evict outdated pods, at most `max_unavailable` pods down at any time.

    Eviction stops when a pod created after the last eviction is still outdated: the webhook
    did not tune the replacement, and evicting more would only churn pods.
    """
    pods = list(pods)
    live = [p for p in pods if not p.terminating]
    outdated = sorted((p for p in live if p.revision != revision),
                      key=lambda p: (p.ready, p.name))  # pods already unavailable go first
    tuned = len(live) - len(outdated)
    if not outdated:
        return RetuneStep((), tuned, 0, f"all {tuned} pods carry revision {revision}")
    missed = [p.name for p in outdated if last_eviction and p.created >= last_eviction]
    if missed:
        return RetuneStep((), tuned, len(outdated), f"eviction paused: {', '.join(missed)} "
                          f"came back without revision {revision} after eviction, so the "
                          "webhook did not tune it; check the operator's webhook")
    unavailable = sum(1 for p in pods if p.terminating or not p.ready)
    evict: list[str] = []
    for pod in outdated:
        # Evicting a pod that is not Ready costs no availability; a Ready one takes budget.
        if pod.ready and unavailable >= max_unavailable:
            break
        if pod.ready:
            unavailable += 1
        evict.append(pod.name)
    if not evict:
        return RetuneStep((), tuned, len(outdated), f"{len(outdated)} pods outdated; waiting "
                          f"for {unavailable} unavailable pods to be Ready (maxUnavailable "
                          f"{max_unavailable})")
    return RetuneStep(tuple(evict), tuned, len(outdated), f"{len(outdated)} pods outdated; "
                      f"evicting {', '.join(evict)} to re-create them with revision {revision}")
