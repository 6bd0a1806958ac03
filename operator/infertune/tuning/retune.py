"""Re-tuning: which outdated pods to evict next. Pure, like the HPA's replica calculator."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from infertune.api.spec import InferenceTuningSpec
from infertune.tuning.memory import MemoryHighError, resolve_memory_high

RETRY_S = 600.0
"""After an eviction whose replacement came back untuned (the webhook did not tune it),
eviction pauses this long before it tries again, twice as long after each further miss."""
RETRY_MAX_S = 6 * 3600.0


@dataclass(frozen=True)
class PodView:
    """What re-tuning needs to know about one pod of the target."""

    name: str
    revision: str | None
    """The infertune.io/revision label; None for pods that were never tuned."""
    ready: bool
    terminating: bool = False
    gone_by: float | None = None
    """metadata.deletionTimestamp of a terminating pod (seconds since the epoch): the kubelet
    has stopped its containers by then, so no metric of it is newer."""
    shape: str | None = None
    """The infertune.io/shape label (the revision without spec.memory); None for pods tuned
    by a release before it, or never tuned."""
    serving: str | None = None
    """The infertune.io/serving-container annotation: the container the webhook tuned."""
    memory_high: str | None = None
    """Its infertune.io/memory-high annotation; None when it has none."""
    memory: tuple[tuple[str, str | None, str | None], ...] = ()
    """(name, memory request, memory limit) of each of its containers, as the pod has them
    now (LimitRange defaults filled in at admission, a resize since)."""
    untuned: str | None = None
    """Its infertune.io/untuned annotation (`<revision>: <why>`): the webhook admitted it
    untuned. None when it has none."""
    created: float | None = None
    """metadata.creationTimestamp (seconds since the epoch); None when not known."""
    ready_since: float | None = None
    """The lastTransitionTime of its Ready condition while Ready (seconds since the epoch);
    None when it is not Ready or the time is not known."""


@dataclass(frozen=True)
class Eviction:
    """What re-tuning remembers of its last eviction for one tuning (in memory)."""

    revision: str
    known: frozenset[str]
    """The target's pods when it evicted: an outdated pod not among them is a replacement
    (or a new pod) the webhook did not tune. Names, not creation times: the API server's
    clock is not the operator's, and creation times have whole seconds."""
    evicted: frozenset[str]
    """The pods it evicted: unavailable, and never evicted again, while the index still
    shows them live (it lags the eviction)."""
    at: float
    """When (monotonic seconds)."""
    misses: int = 0
    """Evictions in a row that came after a replacement came back untuned."""

    def retry_at(self) -> float:
        return self.at + min(RETRY_S * 2.0 ** min(self.misses, 16), RETRY_MAX_S)


@dataclass(frozen=True)
class RetuneStep:
    """The pods to evict now, the counts for status, and why."""

    evict: tuple[str, ...]
    tuned: int
    outdated: int
    reason: str
    missed: tuple[str, ...] = ()
    """Outdated pods that appeared after the last eviction of this revision: the webhook
    did not tune them."""

    def eviction(self, revision: str, pods: Iterable[PodView], evicted: Iterable[str],
                 now: float, last: Eviction | None) -> Eviction:
        """What to remember once `evicted` (of `evict`) went through at `now`."""
        misses = 0
        if self.missed and last is not None and last.revision == revision:
            misses = last.misses + 1
        return Eviction(revision, frozenset(p.name for p in pods), frozenset(evicted), now,
                        misses)


def plan_retune(revision: str, pods: Iterable[PodView], max_unavailable: int,
                last: Eviction | None = None, now: float = 0.0,
                desired: int | None = None) -> RetuneStep:
    """Evict outdated pods, at most `max_unavailable` pods down at any time, counted against
    the Deployment's `desired` replicas when known (a pod not created yet is down too), and
    never the last Ready one: its replacement loads the model for minutes, and the Deployment
    would serve nothing meanwhile.

    Eviction pauses when a pod that appeared after the last eviction is still outdated: the
    webhook did not tune the replacement, and evicting more would only churn pods. It tries
    again after RETRY_S, doubling with each miss.
    """
    pods = list(pods)
    gone = last.evicted if last is not None else frozenset()
    live = [p for p in pods if not p.terminating and p.name not in gone]
    outdated = sorted((p for p in live if p.revision != revision),
                      key=lambda p: (p.ready, p.name))  # pods already unavailable go first
    tuned = len(live) - len(outdated)
    if not outdated:
        return RetuneStep((), tuned, 0, f"all {tuned} pods carry revision {revision}")
    missed: tuple[str, ...] = ()
    retry_at = 0.0
    if last is not None and last.revision == revision:
        missed = tuple(p.name for p in outdated if p.name not in last.known)
        retry_at = last.retry_at()
    if missed and now < retry_at:
        wait = retry_at - now
        return RetuneStep((), tuned, len(outdated), f"eviction paused: {', '.join(missed)} "
                          f"came back without revision {revision} after eviction, so the "
                          "webhook did not tune it; check the operator's webhook (trying "
                          f"again in {wait / 60:.0f} min)", missed)
    ready = sum(1 for p in live if p.ready)
    unavailable = len(pods) - ready if desired is None else max(len(pods), desired) - ready
    # In all, not Ready ones included, as the Deployment controller caps even its clean-up of
    # unhealthy pods (maxScaledDown): what stays above the replicas less maxUnavailable,
    # less the tuned pods not Ready yet. Uncapped, a readiness blip under load (every pod of
    # a changed revision outdated) had every replica evicted in one pass, and a blip of
    # seconds became minutes of model reload on all of them.
    wanted = len(pods) if desired is None else desired
    loading = sum(1 for p in live if p.revision == revision and not p.ready)
    cap = len(live) - (wanted - max_unavailable) - loading
    evict: list[str] = []
    last_ready: str | None = None
    for pod in outdated:
        if len(evict) >= cap:
            break
        # Evicting a pod that is not Ready costs no availability; a Ready one takes budget.
        if pod.ready and unavailable >= max_unavailable:
            break
        if pod.ready and ready <= 1:
            last_ready = pod.name
            break
        if pod.ready:
            unavailable += 1
            ready -= 1
        evict.append(pod.name)
    if not evict and last_ready is not None:
        return RetuneStep((), tuned, len(outdated), (
            f"{len(outdated)} pods outdated; {last_ready} is the only Ready pod and is "
            "not evicted: nothing would serve while its replacement loads. Run 2 or more "
            "replicas, or set spec.retune.strategy: PodTemplateAnnotation where the "
            "Deployment's rolling update starts the new pod first (maxSurge 1 or more and "
            "maxUnavailable 0, as its default 25% is for one replica; not strategy "
            "Recreate)"), missed)
    if not evict:
        return RetuneStep((), tuned, len(outdated), f"{len(outdated)} pods outdated; waiting "
                          f"for {unavailable} unavailable pods to be Ready (maxUnavailable "
                          f"{max_unavailable})", missed)
    return RetuneStep(tuple(evict), tuned, len(outdated), f"{len(outdated)} pods outdated; "
                      f"evicting {', '.join(evict)} to re-create them with revision {revision}",
                      missed)


@dataclass(frozen=True)
class Rollout:
    """What a Deployment's own rollout does, as its spec.strategy and status say."""

    replicas: int
    """spec.replicas (1 when unset, as the API server defaults it)."""
    recreate: bool = False
    """strategy.type Recreate: every pod goes before the new ones start."""
    max_unavailable: int | str | None = None
    """strategy.rollingUpdate.maxUnavailable as given (a count or a percentage; None: 25%)."""
    max_surge: int | str | None = None
    """strategy.rollingUpdate.maxSurge as given (None: 25%)."""
    paused: bool = False
    observed: bool = False
    """Whether its status says how far its rollout is (status.observedGeneration set)."""
    pending: str | None = None
    """Why the Deployment is rolling out now (its newest spec not yet acted on, fewer updated
    pods than replicas, old pods still running beside them), None when it is not, is paused,
    or its status is not known."""
    settling: str | None = None
    """Rolled out, but not every updated pod is available yet (None: all are, or not
    known)."""


def _scaled(value: int | str | None, replicas: int, round_up: bool) -> int:
    """A rollingUpdate count as the Deployment controller resolves it: a percentage of the
    replicas, rounded down for maxUnavailable and up for maxSurge; None is 25%."""
    if value is None:
        value = "25%"
    if isinstance(value, int):
        return max(value, 0)
    text = str(value).strip()
    if not text.endswith("%"):
        return max(int(text), 0) if text.isdigit() else 0
    try:
        percent = float(text[:-1])
    except ValueError:
        return 0
    exact = replicas * percent / 100
    return max(int(-(-exact // 1)) if round_up else int(exact // 1), 0)


def rollout_unavailable(rollout: Rollout) -> int:
    """How many pods a rollout of the pod template may take down at once: all of them with
    Recreate, else maxUnavailable (1 when both it and maxSurge resolve to 0, as the
    Deployment controller makes it)."""
    if rollout.recreate:
        return rollout.replicas
    unavailable = _scaled(rollout.max_unavailable, rollout.replicas, round_up=False)
    if unavailable == 0 and _scaled(rollout.max_surge, rollout.replicas, round_up=True) == 0:
        return 1
    return unavailable


def template_rollout_problem(rollout: Rollout, name: str) -> str | None:
    """Why annotating the pod template (retune.strategy PodTemplateAnnotation) would take
    every serving pod down, where eviction would not (it never evicts the only Ready pod):
    the Deployment's own strategy rolls the template out. None when its rollout keeps one
    serving."""
    if rollout.replicas < 1:
        return None
    down = rollout_unavailable(rollout)
    if down < rollout.replicas:
        return None
    how = ("strategy Recreate, which stops every pod before the new ones start"
           if rollout.recreate else
           f"a rolling update that takes up to {down} pod{'' if down == 1 else 's'} down")
    every = "its only replica" if rollout.replicas == 1 else f"all {rollout.replicas} replicas"
    return (f"annotating the pod template would roll Deployment {name} out with {how}: "
            f"{every} down while the new pods load, nothing serving; give it strategy "
            "RollingUpdate with maxUnavailable under its replicas and maxSurge 1 or more, or "
            "set spec.retune.strategy to Evict")


def template_rollout_note(rollout: Rollout, max_unavailable: int) -> str | None:
    """What to add when the Deployment's rolling update takes more pods down at once than
    spec.retune.maxUnavailable, which only Evict keeps to (its strategy decides, as for any
    change of its template); None when it does not."""
    down = rollout_unavailable(rollout)
    if down <= max_unavailable:
        return None
    return (f"its rolling update takes up to {down} pods down at once, more than "
            f"spec.retune.maxUnavailable ({max_unavailable}), which only Evict keeps to")


MEMORY_PROBLEM = "spec.memory."
"""How the webhook's problems about spec.memory start (pod_patch: `spec.<field>: ...`)."""


@dataclass(frozen=True)
class PodUpdates:
    """Pods that differ from the revision only in spec.memory, and what to write on them in
    place: their metadata only, so none restarts."""

    changes: tuple[tuple[str, str | None, bool], ...] = ()
    """(pod, its memory.high annotation's value, None for none; whether that changes it): each
    is written with the revision label, and counted current once written."""
    problems: tuple[str, ...] = ()
    """What the new spec.memory leaves undone on them (memory.high stays at max), as the
    webhook says it of a pod it admits."""
    refused: str | None = None
    """Why the webhook would admit such a pod untuned under the new spec.memory (above its
    limit less minHeadroom), as its resources are stored (a LimitRange's default limit
    included): a replacement would come back untuned, so none is replaced."""
    backfill: tuple[tuple[str, str | None], ...] = ()
    """Pods of the revision tuned by a release before the shape label: (pod, its serving
    container where it can be told, else None). Labelled with the shape (and annotated with
    the container), a later change of spec.memory finds them current but for it."""


def pod_updates(spec: InferenceTuningSpec, revision: str, shape: str,
                pods: Iterable[PodView]) -> PodUpdates:
    """What to change in place on `pods`: a pod whose revision is outdated but whose shape
    (pod_patch.shape_revision) is current was tuned as the spec says now but for spec.memory.
    It gets the memory.high intent the webhook would give its serving container now (from
    its resources as they are) with the revision label, instead of being re-created (a model
    load each)."""
    changes: list[tuple[str, str | None, bool]] = []
    problems: dict[str, None] = {}
    refused: str | None = None
    backfill: list[tuple[str, str | None]] = []
    for pod in pods:
        if not pod.terminating and pod.revision == revision and pod.shape is None:
            # Tuned by this very spec (the revision holds all of it), before the shape label.
            backfill.append((pod.name, _serving_of(spec, pod)))
            continue
        if (pod.terminating or pod.revision is None or pod.revision == revision
                or pod.shape != shape or pod.serving is None):
            continue
        serving = next((c for c in pod.memory if c[0] == pod.serving), None)
        if serving is None:
            continue  # renamed since: not known
        try:
            wanted = resolve_memory_high(spec.memory, request=serving[1], limit=serving[2])
        except MemoryHighError as exc:
            if not exc.partial:
                refused = refused or exc.said_of_pod()
                continue
            # As the webhook admits such a pod, and in its words (said once for both).
            problems[exc.said_of_pod()] = None
            value = None
        except ValueError:  # a quantity the API server took and this parser did not
            continue
        else:
            value = None if wanted.value is None else str(wanted.value)
            if wanted.warning is not None:  # as the webhook says it of such a pod
                problems[wanted.warning] = None
        changes.append((pod.name, value, value != pod.memory_high))
    return PodUpdates(tuple(changes), tuple(problems), refused, tuple(backfill))


def _serving_of(spec: InferenceTuningSpec, pod: PodView) -> str | None:
    """The container the webhook tuned, where the stored pod tells it: spec.container, or the
    only container. Else None: a webhook after ours (a mesh's) may have put its proxy first."""
    if pod.serving is not None:
        return pod.serving
    names = [c[0] for c in pod.memory]
    if spec.container is not None:
        return spec.container if spec.container in names else None
    return names[0] if len(names) == 1 else None
