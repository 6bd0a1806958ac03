"""Pod tuning in the shell: kopf indexes, the mutating webhook, and the re-tuning loop.

The webhook answers from in-memory indexes (which InferenceTuning targets which Deployment,
which ReplicaSet belongs to which Deployment); it makes no API call per admission request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import jsonpatch  # type: ignore[import-untyped]
import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from infertune import keys
from infertune.api.manifests import entry_in_force, in_force, pods_tuned_by, shown_rivals
from infertune.api.spec import (
    DEFAULT_BATCHING_KNOB,
    GROUP,
    PLURAL,
    VERSION,
    Engine,
    InferenceTuningSpec,
    Mode,
)
from infertune.api.status import ConditionType, TuningStatus
from infertune.api.tuning import RetuneStrategy
from infertune.controller.conditions import MAX_EVENT_MESSAGE, stored_reason
from infertune.controller.loops import STOP_TIMEOUT_S, Work, every, leader_of, snapshot
from infertune.controller.spec_cache import SPECS, applied_spec
from infertune.kube.client import evict_pod, read_deployment, server_message
from infertune.kube.webhooks import HANDLER_ID, OPT_OUT_LABEL, OPT_OUT_VALUE
from infertune.scaling.state import stored_time
from infertune.tuning.pod_patch import (
    LimitRangeView,
    PodContext,
    container_limits,
    container_memory,
    plan_pod_patch,
    planned_mig,
    revisions,
    serving_container,
)
from infertune.tuning.pod_shape import (
    controlling_replicaset,
    deployment_by_hash,
    pod_from_deployment,
)
from infertune.tuning.retune import (
    MEMORY_PROBLEM,
    Eviction,
    PodUpdates,
    PodView,
    RetuneStep,
    Rollout,
    plan_retune,
    pod_updates,
    template_rollout_note,
    template_rollout_problem,
)

RESOURCE = (GROUP, VERSION, PLURAL)
# Read once at import (`infertune run --retune-interval` sets it before importing this).
RETUNE_INTERVAL = float(os.environ.get("INFERTUNE_RETUNE_INTERVAL", "10"))
logger = logging.getLogger(__name__)


IN_PLACE_RETRY_S = 30.0
"""How long after an admission policy or RBAC refused a pod's in-place patch it is asked
again; each refusal in a row doubles it, up to IN_PLACE_RETRY_MAX_S. Asked at every pass, a
pod that a policy refuses cost a PATCH (and a policy evaluation) every 10 s for as long as
it stayed, and with PodTemplateAnnotation it stays until fixed or deleted."""
INDEX_LAG_S = 60.0
"""How long a pod patched in place counts as written while the pod index still shows it as it
was (`_update_pods`); past that, what the index shows is taken (a label changed back by
someone else is written again)."""
IN_PLACE_RETRY_MAX_S = 300.0
"""The longest wait between two asks (a policy fixed meanwhile is seen within it)."""
IN_PLACE_RETRIED = (f"a refused pod is asked again after {IN_PLACE_RETRY_S:g}s, then less "
                    f"often, up to every {IN_PLACE_RETRY_MAX_S / 60:g} minutes, and at once "
                    "after a change of the spec")
"""How the status message and the MemoryHighNotUpdated Event say when the refused pods are
asked again (the same words at every pass: an Event is posted once for a text)."""


class RefusedPatch(NamedTuple):
    """A pod's in-place patch that an admission policy or RBAC refused."""

    revision: str
    """The revision the patch would have written: after a change of the spec (another
    revision), the pod is asked again at once."""
    said: str
    """What the status message says of it."""
    again_at: float
    """When to ask again (monotonic)."""
    wait_s: float
    """The wait before `again_at`, doubled by the next refusal in a row."""


@dataclass
class PodTuningSettings:
    """Operator-wide settings and shared state of pod tuning, kept in kopf's memo.

    kopf hands each object a shallow copy of the memo, so state shared between the webhook
    (per pod) and the re-tuning loops (per InferenceTuning) must live in objects created up
    front.
    Keys are "namespace/tuning-name".
    """

    launcher_image: str
    static_cpu_manager: bool = True
    unreported: dict[str, tuple[tuple[str, ...], bool]] = field(default_factory=dict)
    """Pod problems seen by the webhook, waiting for re-tuning to post them as an Event."""
    latest_problems: dict[str, list[str]] = field(default_factory=dict)
    backfilled: dict[str, set[str]] = field(default_factory=dict)
    """The pods given the shape label (pod_updates' backfill), once each: a refusal (an older
    operator-pod-updates policy) is not asked again every pass."""
    written_in_place: dict[str, dict[str, tuple[str, float]]] = field(default_factory=dict)
    """Per tuning, the pods given a revision in place and when (monotonic): while kopf's pod
    index has not caught up with the patch, the pod is not patched (nor announced) again."""
    refused_in_place: dict[str, dict[str, RefusedPatch]] = field(default_factory=dict)
    """Per tuning, the pods whose in-place patch (a change of spec.memory) an admission
    policy or RBAC refused, and when to ask again (`_update_pods`)."""
    problems_revision: dict[str, str] = field(default_factory=dict)
    """The revision `latest_problems` were found for: the webhook's last admission, or a pass
    that gave pods a change of spec.memory in place."""
    reported: dict[str, tuple[str, ...]] = field(default_factory=dict)
    last_evictions: dict[str, Eviction] = field(default_factory=dict)
    """The last eviction of each tuning, for the untuned-replacement guard."""
    indexed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once kopf's indexes hold their first listing (`indexes_loaded`), or once a pod's
    admission waited INDEX_WAIT_S for it."""
    listed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once kopf's indexes hold their first listing (`indexes_loaded`) only: the
    operator's readiness goes by it (kube/webhooks.RegisteringWebhookServer.loaded)."""
    uids: dict[str, str] = field(default_factory=dict)
    """The uid of the tuning each key's re-tuning loop runs for: a tuning deleted and made
    again under its name has another, and what the old one's late pass or loop forgets is
    not the new one's."""
    stopped: dict[str, float] = field(default_factory=dict)
    """The uids of the tunings whose re-tuning loop stopped, and when (monotonic): a pass
    still in its worker thread then forgets again what it kept (`retune`), or a tuning made
    again under the same name inherited it (a refused pod's wait, what was said)."""
    excluded_namespaces: tuple[str, ...] = ()
    """The namespaces whose pods the webhook registration never sends (kube-system, the
    operator's own): their pods are never tuned, so none is replaced to tune it."""

    def forget(self, key: str) -> None:
        """Drop what is kept of tuning `key` ("namespace/name"), once it is deleted: a tuning
        made again under its name inherited it (its PodNotTuned Event was taken as said, and
        the old problems showed in its status)."""
        for table in (self.unreported, self.latest_problems, self.problems_revision,
                      self.reported, self.last_evictions, self.backfilled,
                      self.refused_in_place, self.written_in_place, self.uids):
            table.pop(key, None)
        # A copy first: passes of other tunings (worker threads) add keys meanwhile.
        for kept in [k for k in list(self.reported) if k.startswith(f"{key}#")]:
            self.reported.pop(kept, None)  # what was said apart (RetuneHeld, ...)


STOPPED_KEPT_S = 600.0
"""How long the uid of a tuning whose re-tuning loop stopped is kept (PodTuningSettings.
stopped): far longer than a pass, whose API calls time out."""
INDEX_WAIT_S = 3.0
"""How long a pod's admission waits for kopf's indexes to hold their first listing, when the
operator has just started: within the webhook's 5 s timeout."""


def _deployment_of(namespace: str, meta: dict[str, Any],
                   replicaset_owners: kopf.Index[tuple[str, str], str]) -> str | None:
    """The Deployment that owns a pod, through its controlling ReplicaSet."""
    rs_name = controlling_replicaset(meta)
    if rs_name is None:
        return None
    for deployment in replicaset_owners.get((namespace, rs_name), []):
        # "" for a ReplicaSet no Deployment controls: orphaned (`kubectl delete deployment
        # --cascade=orphan`, the way to change a selector), its pods are no Deployment's,
        # even of one named as its prefix is.
        return deployment or None
    # The index may lag the ReplicaSet by a moment: its name says whose it is.
    return deployment_by_hash(meta, rs_name)


# kopf's handler protocols do not model index kwargs or narrowed types; checked at runtime.
# The index functions are coroutines: kopf runs a sync one in a worker thread on every watch
# event (one per tuning per interval, from the autoscaler's status write), and they only read
# the body. They read it through `loops.snapshot`, not kopf's per-field views.
@kopf.index(*RESOURCE)  # type: ignore[arg-type]
async def tunings_by_target(namespace: str, name: str, uid: str, body: kopf.Body,
                            **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    spec, status, meta = snapshot(body)
    target = str((spec.get("targetRef") or {}).get("name") or "")
    generation = int(meta.get("generation") or 0)
    applied = status.get("appliedSpec")
    forced = in_force(spec)
    if applied is not None and SPECS.get(uid, generation, spec) is None:
        # While the spec is invalid, the pods the last valid one targets are the ones tuned
        # by it (as if the edit had been refused): filed under the new, invalid target, the
        # tuning tuned that Deployment's pods with a spec written for another, and left its
        # own untuned without a word. Its mode is that one's too (pods_tuned_by).
        fallback = applied_spec(applied, generation, uid)
        if fallback is not None:
            target = fallback[1].target_ref.name
            forced = fallback[1].mode is Mode.ENFORCE
    ready = stored_reason(status, ConditionType.READY)
    return {(namespace, target): {"name": name, "uid": uid, "spec": spec, "forced": forced,
                                  "generation": generation,
                                  "mig": dict(status.get("mig") or {}),
                                  "batching": applied_batching(status, spec), "ready": ready,
                                  "applied": applied}}


def applied_batching(status: Mapping[str, Any], spec: Mapping[str, Any]) -> int | None:
    """The knob value batching mode Auto applies, as the autoscaler wrote it in status, for
    the knob the spec names now: a value applied for another knob (spec.batching.knob or the
    engine changed) is not this one's (64 requests are not 64 tokens)."""
    stored = status.get("batching") or {}
    value = stored.get("applied")
    if value is None or stored.get("knob") != _knob_of(spec):
        return None
    return int(value)


def _knob_of(spec: Mapping[str, Any]) -> str | None:
    """The batching knob a spec (as stored) names, or its engine's default."""
    knob = (spec.get("batching") or {}).get("knob")
    if knob:
        return str(knob)
    try:
        default = DEFAULT_BATCHING_KNOB.get(Engine(str(spec.get("engine"))))
    except ValueError:
        return None
    return None if default is None else default.value


@kopf.index("apps", "v1", "replicasets")  # type: ignore[arg-type]
async def replicaset_owners(namespace: str, name: str, body: kopf.Body,
                            **_: Any) -> dict[tuple[str, str], str]:
    """Every ReplicaSet, with the Deployment that controls it, "" when none does."""
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Deployment" and ref.get("controller"):
            return {(namespace, name): str(ref["name"])}
    return {(namespace, name): ""}


@kopf.index("", "v1", "limitranges")  # type: ignore[arg-type]
async def limit_ranges(namespace: str, name: str, body: kopf.Body,
                       **_: Any) -> dict[str, LimitRangeView] | None:
    """The LimitRanges that constrain each container, by namespace: the webhook sizes the
    launcher's init container within them (pod_patch.launcher_resources)."""
    view = container_limits(name, body.get("spec") or {})
    return None if view is None else {namespace: view}


@kopf.index("", "v1", "pods")  # type: ignore[arg-type]
async def pods_by_deployment(namespace: str, name: str, body: kopf.Body,
                             replicaset_owners: kopf.Index[tuple[str, str], str],
                             **_: Any) -> dict[tuple[str, str], PodView] | None:
    pod_spec, status, meta = snapshot(body)
    deployment = _deployment_of(namespace, meta, replicaset_owners)
    if deployment is None or status.get("phase") in ("Succeeded", "Failed"):
        # A pod that ended (evicted by the kubelet, a node shut down) is no replica: the
        # ReplicaSet has already started another; counted, it blocked re-tuning for good.
        return None
    if (meta.get("labels") or {}).get(OPT_OUT_LABEL) == OPT_OUT_VALUE:
        # Opted out: the webhook is never called for it, nor for the pod that replaces it.
        # Counted as outdated, it was evicted, came back untuned, and was evicted again
        # every time the pause ran out (a model reload each time).
        return None
    ready_condition = next((c for c in status.get("conditions") or []
                            if isinstance(c, dict) and c.get("type") == "Ready"), {})
    ready = ready_condition.get("status") == "True"
    deleted = meta.get("deletionTimestamp")
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    memory, serving = annotations.get(keys.MEMORY_HIGH), annotations.get(keys.SERVING_CONTAINER)
    untuned = annotations.get(keys.UNTUNED)
    return {(namespace, deployment): PodView(
        name=name, revision=labels.get(keys.REVISION), ready=ready,
        terminating=deleted is not None, gone_by=stored_time(deleted),
        shape=labels.get(keys.SHAPE), serving=None if serving is None else str(serving),
        memory_high=None if memory is None else str(memory),
        memory=tuple((str(c.get("name")), *container_memory(c))
                     for c in pod_spec.get("containers") or ()),
        untuned=None if untuned is None else str(untuned),
        created=stored_time(meta.get("creationTimestamp")),
        ready_since=stored_time(ready_condition.get("lastTransitionTime")) if ready else None)}


def _owner_ref(namespace: str, entry: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceTuning",
            "metadata": {"name": entry["name"], "namespace": namespace, "uid": entry["uid"]}}


@kopf.on.mutate("", "v1", "pods", id=HANDLER_ID, operations=["CREATE"], ignore_failures=True)  # type: ignore[arg-type]
async def tune_pod(body: kopf.Body, patch: kopf.Patch, warnings: list[str], memo: kopf.Memo,
             tunings_by_target: kopf.Index[tuple[str, str], dict[str, Any]],
             replicaset_owners: kopf.Index[tuple[str, str], str],
             limit_ranges: kopf.Index[str, LimitRangeView], dryrun: bool = False,
             **_: Any) -> None:
    """Tune pods of Deployments that an InferenceTuning targets; leave every other pod alone.
    A dry run (`kubectl apply --dry-run=server`, or a review sent to the port by anyone) is
    answered the same and leaves no verdict behind for re-tuning.

    It never raises: kopf answers a failed handler by rejecting the pod, and a bug here must
    not stop pods from starting (DESIGN.md #9). Anything unexpected admits the pod unchanged.
    It is async because it does no I/O: it runs on the event loop instead of waiting for a
    thread of kopf's executor, which every pod start would otherwise pay for.
    """
    try:
        settings: PodTuningSettings = memo.pod_tuning
        if not settings.indexed.is_set():
            # kopf serves admission as soon as it starts, before its indexes hold their
            # first listing: read empty, every pod was admitted untuned (and evicted by
            # re-tuning later, a model load on a GPU), at each start or rolling upgrade.
            try:
                await asyncio.wait_for(settings.indexed.wait(), INDEX_WAIT_S)
            except TimeoutError:
                # No node event within the wait (none can be watched, or a slow listing):
                # the indexes are read as they are from now on, as before the wait, rather
                # than delaying every pod's admission.
                settings.indexed.set()
                logger.warning("no node event within %gs of the first pod admission: pods "
                               "are tuned from the indexes as loaded so far; a pod they miss "
                               "is replaced by re-tuning", INDEX_WAIT_S)
        _tune_pod(body, patch, warnings, memo, tunings_by_target, replicaset_owners,
                  limit_ranges, remember=not dryrun)
    except Exception:
        patch.clear()
        logger.exception("pod tuning failed; the pod is admitted unchanged")
        warnings.append("infertune: pod tuning failed; the pod is admitted unchanged")


def _indexes_loading(memo: kopf.Memo, **_: Any) -> bool:
    return not memo.pod_tuning.indexed.is_set()


@kopf.on.event("", "v1", "nodes", id="indexes-loaded", when=_indexes_loading)
async def indexes_loaded(memo: kopf.Memo, **_: Any) -> None:
    """kopf calls resource handlers only once every index holds its first listing, and every
    cluster that runs pods has a node: the first node event says the indexes are loaded."""
    memo.pod_tuning.indexed.set()
    memo.pod_tuning.listed.set()


def _tune_pod(body: kopf.Body, patch: kopf.Patch, warnings: list[str], memo: kopf.Memo,
              tunings_by_target: kopf.Index[tuple[str, str], dict[str, Any]],
              replicaset_owners: kopf.Index[tuple[str, str], str],
              limit_ranges: kopf.Index[str, LimitRangeView] | None = None,
              remember: bool = True) -> None:
    meta = dict(body.get("metadata") or {})
    namespace = str(meta.get("namespace") or "")
    deployment = _deployment_of(namespace, meta, replicaset_owners)
    if deployment is None:
        return
    entries = list(tunings_by_target.get((namespace, deployment), []))
    if not entries:
        return
    owner = pods_tuned_by((str(e["name"]), entry_in_force(e)) for e in entries)
    if owner is None:
        names = shown_rivals(sorted(str(e["name"]) for e in entries))
        warnings.append(f"infertune: several InferenceTunings ({names}) target {deployment}; "
                        "the pod is not tuned until only one of them is in mode Enforce")
        return
    # The only one, or the only one in force beside trials (mode DryRun), which change
    # nothing: a trial beside it kept every new pod from being tuned.
    entry = next(e for e in entries if str(e["name"]) == owner)
    uid, generation = str(entry.get("uid") or ""), int(entry.get("generation") or 0)
    spec = SPECS.get(uid, generation, entry["spec"])
    if spec is None:
        # The controller reports the invalid spec on the tuning (Ready=False, InvalidSpec).
        # The pod is tuned as the last valid generation said, as if the edit had been
        # refused: untuned, every pod a scale-out or a lost node re-created lost its binding
        # and allocator because of a mistake anywhere in the spec.
        # The index files such a tuning under the last valid spec's target, so this pod is
        # one of that Deployment's.
        fallback = applied_spec(entry.get("applied"), generation, uid)
        if fallback is None:
            warnings.append(f"infertune: InferenceTuning {entry['name']} is invalid (see its "
                            "Ready condition) and no earlier generation was valid; the pod is "
                            "not tuned")
            logger.warning("pod of %s/%s: not tuned, InferenceTuning %s is invalid",
                           namespace, deployment, entry["name"])
            return
        warnings.append(f"infertune: InferenceTuning {entry['name']} generation {generation} "
                        f"is invalid (see its Ready condition); the pod is tuned as generation "
                        f"{fallback[0]} said")
        spec = fallback[1]
    settings: PodTuningSettings = memo.pod_tuning
    mig_profile, mig_strategy = planned_mig(entry.get("mig") or {})
    plan = plan_pod_patch(spec, dict(body), PodContext(
        tuning_name=entry["name"], launcher_image=settings.launcher_image,
        static_cpu_manager=settings.static_cpu_manager, mig_profile=mig_profile,
        mig_strategy=mig_strategy, batching_value=entry.get("batching"),
        limit_ranges=tuple(sorted(limit_ranges.get(namespace, ()) if limit_ranges else ()))))
    for problem in plan.problems:
        warnings.append(f"infertune: {problem}")
    key = f"{namespace}/{entry['name']}"
    refusal = (plan.problems[0] if plan.problems else "refused") if plan.refused else None
    if remember:
        if plan.problems:
            # Events are posted by re-tuning: kopf's event poster is not reachable from
            # webhooks.
            settings.unreported[key] = (tuple(plan.problems), plan.refused)
        settings.latest_problems[key] = list(plan.problems)
        settings.problems_revision[key] = plan.revision
    if plan.patch:
        ops = list(plan.patch)
        patch.fns.append(lambda raw: jsonpatch.apply_patch(raw, ops, in_place=True))
    elif refusal is not None:
        # Said on the pod, where the leader's re-tuning reads it: this process's memory alone
        # told no other process, and the leader evicted pod after pod that came back untuned.
        verdict = f"{plan.revision}: {refusal}"[:MAX_UNTUNED]
        patch.fns.append(lambda raw: _annotated(raw, keys.UNTUNED, verdict))
    logger.info("pod of %s/%s: %s", namespace, deployment, "; ".join(
        plan.reasons or plan.problems))


MAX_UNTUNED = 1024
"""Characters of the infertune.io/untuned annotation (the revision and the first problem)."""


def _annotated(raw: kopf.RawBody, key: str, value: str) -> None:
    """Add annotation `key` to the pod `raw` (a kopf patch function)."""
    meta = raw.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), key: value}


def admitted_untuned(pods: Sequence[PodView], revision: str) -> tuple[str, str | None] | None:
    """What the webhook found for the newest pod of `revision` it admitted, as the pods say it
    (any operator process may have admitted it): (revision, why it was left untuned), or
    (revision, None) when that pod is tuned; None when no pod says."""
    prefix = f"{revision}: "
    newest: tuple[float, str | None] | None = None
    for pod in pods:
        if pod.terminating:
            continue
        if pod.revision == revision:
            why = None
        elif pod.untuned is not None and pod.untuned.startswith(prefix):
            why = pod.untuned[len(prefix):]
        else:
            continue
        if newest is None or (pod.created or 0.0) >= newest[0]:
            newest = (pod.created or 0.0, why)
    return None if newest is None else (revision, newest[1])


def _report_once(memo: kopf.Memo, namespace: str, entry: dict[str, Any], problems: list[str],
                 *, refused: bool, reason: str | None = None, topic: str | None = None) -> None:
    """An Event on the InferenceTuning when the problems change, not one per pod (`reason`:
    its own reason, remembered apart from the pods' problems; `topic`: remembered apart under
    that name, with the pods' reason)."""
    seen = memo.pod_tuning.reported
    apart = reason or topic
    key = f"{namespace}/{entry['name']}" + ("" if apart is None else f"#{apart}")
    if seen.get(key) == tuple(problems):
        return
    seen[key] = tuple(problems)
    kopf.event(_owner_ref(namespace, entry), type="Warning",  # type: ignore[arg-type]
               reason=reason or ("PodNotTuned" if refused else "PodPartlyTuned"),
               message="; ".join(problems)[:MAX_EVENT_MESSAGE])


RETUNE_HELD = "RetuneHeld"
"""Warning Event reason when re-tuning does not replace outdated pods because the
Deployment's own rollout would take every serving pod down (PodTemplateAnnotation)."""


RETUNED = "PodsRetuned"
"""Event reason when re-tuning evicts pods to re-create them with the current revision."""


def _evict(namespace: str, pod: str) -> str | None:
    """Evict through the Eviction API (PDBs apply); the reason when it was refused."""
    if evict_pod(namespace, pod):
        return None
    return f"PodDisruptionBudget does not allow evicting {pod} now"


def _annotate_template(namespace: str, deployment: str, revision: str) -> None:
    client.AppsV1Api().patch_namespaced_deployment(deployment, namespace, {
        "spec": {"template": {"metadata": {"annotations": {keys.REVISION: revision}}}}})


MEMORY_UPDATED = "MemoryHighUpdated"
"""Event reason when re-tuning changes the memory.high intent of running pods in place."""
MEMORY_NOT_UPDATED = "MemoryHighNotUpdated"
"""Warning Event reason when pods could not take a change of spec.memory in place."""
KEEP_THEIR_MEMORY = "the running pods cannot take the new spec.memory"
"""How `_why_pods_cannot_be_tuned` begins the reason that stands on the running pods' own
limit: tuned by the spec before, they keep that tuning (not "not tuned")."""


class Untuned(NamedTuple):
    """Why a pod re-created now would come back untuned (`_why_pods_cannot_be_tuned`)."""

    problem: str
    keep_their_tuning: bool = False
    """The running pods' own limit refuses a change of spec.memory: tuned by the spec
    before, they keep that tuning (said so, not "not tuned")."""


UNTUNED = "untuned"
"""What re-tuning says of replacements that would come back untuned (PodNotTuned), kept apart
from the pods' problems."""


def _patch_pod_metadata(namespace: str, pod: str, metadata: dict[str, Any]) -> None:
    client.CoreV1Api().patch_namespaced_pod(pod, namespace, {"metadata": metadata})


def _backfill(namespace: str, entry: dict[str, Any], shape: str, updates: PodUpdates,
              done: set[str]) -> None:
    """Label the pods of `updates.backfill` with `shape` (and name their serving container),
    each once: pods tuned before the shape label, by the spec as it is."""
    for pod, serving in updates.backfill:
        if pod in done:
            continue
        metadata: dict[str, Any] = {"labels": {keys.SHAPE: shape}}
        if serving is not None:
            metadata["annotations"] = {keys.SERVING_CONTAINER: serving}
        try:
            _patch_pod_metadata(namespace, pod, metadata)
        except ApiException as exc:  # refused: it is re-created by the next change of memory
            logger.debug("[%s/%s] pod %s not labelled with its shape: %s %s", namespace,
                         entry["name"], pod, exc.status, exc.reason)
            if exc.status not in (403, 404, 422):
                continue  # a server error or a timeout: asked again at the next pass
        done.add(pod)


def _shown_bytes(value: str | None) -> str:
    return "removed (memory.high at max)" if value is None else (
        f"{int(value) / 2**30:.2f}Gi ({value} bytes)")


class InPlace(NamedTuple):
    """What `_update_pods` did."""

    written: set[str]
    """The pods that carry the revision now (or did at a pass before: `INDEX_LAG_S`)."""
    refused: set[str]
    """The pods whose patch failed, or waits to be asked again: they stay outdated."""
    gone: set[str]
    """The pods deleted meanwhile (the index still lists them)."""
    message: str
    """What to say of it in status.tuning.message ("" when nothing)."""


def _update_pods(namespace: str, entry: dict[str, Any], revision: str, updates: PodUpdates,
                 memo: kopf.Memo, clock: float) -> InPlace:
    """Write the revision label and the memory.high intent on the pods `updates` names (a
    metadata patch each: nothing restarts). A pod refused by an admission policy or RBAC is
    not asked again until its wait is over (IN_PLACE_RETRY_S, doubled by each refusal in a
    row); it counts as refused meanwhile."""
    if not leader_of(memo).leads():
        return InPlace(set(), set(), set(), "")  # the pass says it, for all it does not do
    settings: PodTuningSettings = memo.pod_tuning
    key = f"{namespace}/{entry['name']}"
    waiting = settings.refused_in_place.setdefault(key, {})
    recent = settings.written_in_place.setdefault(key, {})
    asked = {pod for pod, _, _ in updates.changes}
    for pod in [p for p, r in waiting.items() if p not in asked or r.revision != revision]:
        del waiting[pod]  # current, gone, or of another spec: asked at once when outdated
    for pod in [p for p, (written_revision, at) in recent.items()
                if p not in asked or written_revision != revision or clock - at > INDEX_LAG_S]:
        del recent[pod]  # the index caught up (or never will: written again)
    said: list[str] = []
    written: set[str] = set()
    refused: set[str] = set()
    gone: set[str] = set()
    done: dict[str | None, list[str]] = {}
    failed: dict[str, None] = {}  # in order, once each (RBAC's is the same for every pod)

    def hold(pod: str, text: str) -> None:
        last = waiting.get(pod)
        wait_s = IN_PLACE_RETRY_S if last is None else min(2 * last.wait_s,
                                                            IN_PLACE_RETRY_MAX_S)
        waiting[pod] = RefusedPatch(revision, text, clock + wait_s, wait_s)

    for pod, value, changed in updates.changes:
        if pod in recent:  # written at a pass before: the index shows it as it was
            written.add(pod)
            continue
        held = waiting.get(pod)
        if held is not None and clock < held.again_at:
            failed[held.said] = None
            refused.add(pod)
            continue
        try:
            _patch_pod_metadata(namespace, pod, {"labels": {keys.REVISION: revision},
                                                 "annotations": {keys.MEMORY_HIGH: value}})
        except ApiException as exc:
            if exc.status == 404:
                gone.add(pod)  # its replacement comes through the webhook
                continue
            why = f"{exc.status} {exc.reason}: {server_message(exc)[:300]}"
            logger.debug("[%s/%s] pod %s could not take spec.memory in place: %s",
                         namespace, entry["name"], pod, why)
            if exc.status == 403 and 'cannot patch resource "pods"' in why:
                # RBAC: the same for every pod (a policy's 403 is of one pod), and said
                # without a pod's name, so that it is one Event however many are replaced.
                text = (f"the operator may not patch pods in namespace {namespace} (403): it "
                        "needs patch on pods, which the chart's RBAC grants")
                failed[text] = None
                for other, _, _ in updates.changes:
                    if other in written or other in gone or other in recent:
                        continue  # written, now or at a pass before (not reached yet)
                    refused.add(other)
                    kept = waiting.get(other)
                    if other == pod or kept is None or clock >= kept.again_at:
                        hold(other, text)  # one waiting already keeps its wait
                break
            text = f"{pod}: {why}"
            failed[text] = None
            refused.add(pod)
            if exc.status in (403, 422):
                hold(pod, text)
            else:  # a server error, a conflict, throttling: asked again at the next pass
                waiting.pop(pod, None)
            continue
        waiting.pop(pod, None)
        recent[pod] = (revision, clock)
        written.add(pod)
        if changed:
            done.setdefault(value, []).append(pod)
    if done:
        count = sum(len(pods) for pods in done.values())
        said.append(f"memory.high intent updated in place on {count} pods")
        kopf.event(_owner_ref(namespace, entry),  # type: ignore[arg-type]
                   type="Normal", reason=MEMORY_UPDATED, message=(
                       "memory.high intent changed in place, without re-creating the pods: "
                       + "; ".join(f"{_shown_bytes(value)} on {', '.join(pods)}"
                                   for value, pods in done.items()))[:MAX_EVENT_MESSAGE])
    if failed:
        texts = list(failed)
        problem = ("pods could not take spec.memory in place, and stay outdated: "
                   + "; ".join(texts[:3])
                   + (f" (and {len(texts) - 3} more)" if len(texts) > 3 else "")
                   + (f" ({IN_PLACE_RETRIED})" if waiting else ""))
        said.append(problem)
        _report_once(memo, namespace, entry, [problem], refused=False,
                     reason=MEMORY_NOT_UPDATED)
    if updates.problems and written:
        _report_once(memo, namespace, entry, list(updates.problems), refused=False)
    return InPlace(written, refused, gone, "; ".join(said))


def _why_pods_cannot_be_tuned(name: str, spec: InferenceTuningSpec,
                              deployment: client.V1Deployment, memo: kopf.Memo,
                              batching_value: int | None,
                              admitted: tuple[str, str | None] | None = None,
                              revision: str | None = None,
                              stored_refusal: str | None = None) -> Untuned | None:
    """Why a pod re-created now would come back untuned: as the webhook found for the newest
    pod of this revision, as the pods say it (`admitted_untuned`: it saw the pod with the
    namespace's LimitRange defaults filled in), else as a preview of the Deployment's
    template finds. Not from the webhook's memory of the reviews it answered: anyone in the
    cluster's network can send one to its port, and a forged verdict evicted pods that came
    back untuned, or held a rollout for good. Where the
    template gives the serving container no memory limit (a LimitRange's default gives it
    one), `stored_refusal` stands in for the preview on spec.memory: the running pods' own
    limit refuses it (pod_updates)."""
    if admitted is not None and admitted[0] == revision:
        return None if admitted[1] is None else Untuned(admitted[1])
    settings: PodTuningSettings = memo.pod_tuning
    raw = client.ApiClient().sanitize_for_serialization(deployment)  # type: ignore[no-untyped-call]
    pod = pod_from_deployment(raw)
    preview = plan_pod_patch(spec, pod, PodContext(
        tuning_name=name, launcher_image=settings.launcher_image,
        static_cpu_manager=settings.static_cpu_manager, batching_value=batching_value))
    if preview.refused:
        return Untuned(preview.problems[0])
    if stored_refusal is None:
        return None
    serving = serving_container(spec, (pod.get("spec") or {}).get("containers") or [])
    if serving is not None and container_memory(serving)[1] is not None:
        return None  # the template's own limit (a rollout brings it): the preview is right
    return Untuned(f"{KEEP_THEIR_MEMORY}, and a replacement (with the same default memory "
                   f"limit) would be admitted untuned: {stored_refusal}", True)


def rollout_of(deployment: client.V1Deployment) -> Rollout:
    """What the Deployment's own rollout does: its strategy, and how far it is (as `kubectl
    rollout status` judges it)."""
    spec, status, meta = deployment.spec, deployment.status, deployment.metadata
    replicas = spec.replicas if spec is not None and spec.replicas is not None else 1
    strategy = spec.strategy if spec is not None else None
    rolling = strategy.rolling_update if strategy is not None else None
    paused = bool(spec is not None and spec.paused)
    seen = None if status is None else status.observed_generation
    pending = settling = None
    if status is not None and seen is not None and not paused:
        updated = status.updated_replicas or 0
        conditions = {c.type: c for c in status.conditions or () if c is not None}
        progressing, failure = conditions.get("Progressing"), conditions.get("ReplicaFailure")
        if meta is not None and meta.generation is not None and seen < meta.generation:
            pending = "has not acted on its newest spec yet"
        elif updated < replicas or (status.replicas or 0) > updated:
            pending = f"is rolling out ({updated} of {replicas} pods updated"
            if progressing is not None and progressing.status == "False":
                pending += f"; stopped: {progressing.reason}: {progressing.message or ''}"
            elif failure is not None and failure.status == "True":
                pending += f"; {failure.reason}: {failure.message or ''}"
            elif (status.replicas or 0) > updated:
                pending += f", {(status.replicas or 0) - updated} old ones still running"
            pending = pending.strip() + ")"
        elif (status.available_replicas or 0) < updated:
            settling = (f"is rolling out ({status.available_replicas or 0} of {updated} "
                        "updated pods available)")
    return Rollout(replicas, recreate=strategy is not None and strategy.type == "Recreate",
                   max_unavailable=None if rolling is None else rolling.max_unavailable,
                   max_surge=None if rolling is None else rolling.max_surge,
                   paused=paused, observed=seen is not None, pending=pending,
                   settling=settling)


def _replace_outdated(namespace: str, spec: InferenceTuningSpec, step: RetuneStep,
                      revision: str, evicted: Callable[[str], None],
                      annotated: str | None = None,
                      on_annotated: Callable[[], None] = lambda: None,
                      rollout: Rollout | None = None,
                      on_held: Callable[[str], None] = lambda _: None) -> str:
    """Carry out one step with the spec's strategy; what to report about it. `annotated` is
    the revision the pod template carries now (PodTemplateAnnotation); `rollout` what the
    Deployment's own rollout does (None: not known); `on_held` is told why the template is
    not annotated."""
    if spec.mode is Mode.DRY_RUN:
        return f"dry run: {step.outdated} pods outdated, none replaced"
    target = spec.target_ref.name
    if spec.retune.strategy is RetuneStrategy.POD_TEMPLATE_ANNOTATION:
        if annotated == revision:
            # Written already. Written again every pass, it was a Deployment write each tick
            # while the pods rolled.
            carries = f"{step.outdated} pods outdated; the pod template carries revision {revision}"
            if rollout is not None and rollout.paused:
                return (f"{carries}, but Deployment {target} is paused: resume it (kubectl "
                        "rollout resume) to roll them out")
            if (rollout is None or not rollout.observed or rollout.pending is not None
                    or rollout.settling is not None):
                return f"{carries}, the Deployment rolls them out"
            # Said as if a rollout were under way for as long as they stayed.
            return (f"{carries} and Deployment {target} has rolled it out, but they do not "
                    "run it: the webhook did not tune them (see status.tuning.problems and "
                    "the PodNotTuned Events)")
        if rollout is not None and (problem := template_rollout_problem(
                rollout, target)) is not None:
            on_held(problem)
            return f"{step.outdated} pods outdated, none replaced: {problem}"
        try:
            _annotate_template(namespace, spec.target_ref.name, revision)
        except ApiException as exc:
            return f"{step.outdated} pods outdated; could not annotate the pod template: " \
                   f"{exc.status} {exc.reason}"
        on_annotated()
        note = None if rollout is None else template_rollout_note(
            rollout, spec.retune.max_unavailable)
        return (f"{step.outdated} pods outdated; pod template annotated with revision "
                f"{revision}, the Deployment rolls them out"
                + ("" if note is None else f" ({note})"))
    for pod in step.evict:
        try:
            refused = _evict(namespace, pod)
        except ApiException as exc:  # 403 (RBAC), 500 (a pod in two budgets), ...
            return (f"{step.outdated} pods outdated; evicting {pod} failed: {exc.status} "
                    f"{exc.reason}: {server_message(exc)[:300]}")
        if refused is not None:
            return f"{step.outdated} pods outdated; {refused}"
        evicted(pod)
    return step.reason


def retune(namespace: str, name: str, uid: str, spec: InferenceTuningSpec,
           pods: list[PodView], memo: kopf.Memo, batching_value: int | None = None,
           mig: tuple[str | None, str] = (None, "mixed"),
           rivals: tuple[str, ...] = (), tuned_by: str | None = None,
           rivals_forced: bool = True,
           stored: Mapping[str, Any] | None = None) -> TuningStatus:
    """One re-tuning pass: report the counts and replace outdated pods as the spec says.
    `mig` is the planned (profile, strategy) from status.mig (`planned_mig`); `rivals` the
    names of the other InferenceTunings of the same Deployment when the webhook does not tune
    its pods by this one (manifests.pods_tuned_by), so none is replaced (`rivals_forced`:
    they are in mode Enforce; else trials, as this one); `tuned_by` the one in force it
    tunes them by instead, when this one is a trial beside it; `stored` status.tuning as
    the last pass wrote it (this process's, or another's before a restart or a failover).
    A pass whose loop stopped meanwhile (the tuning deleted) keeps nothing of what it found."""
    settings: PodTuningSettings = memo.pod_tuning
    key = f"{namespace}/{name}"
    try:
        revision, shape = revisions(spec, batching_value, mig)
        updates = pod_updates(spec, revision, shape, pods)
        entry = {"name": name, "uid": uid}
        evictions = settings.last_evictions
        said_now: list[str] = []
        if key not in settings.latest_problems:
            _problems_as_stored(settings, key, revision, stored)
        if key in settings.unreported:
            problems, refused = settings.unreported.pop(key)
            _report_once(memo, namespace, entry, list(problems), refused=refused)
            said_now = list(problems) if refused else []
        elif settings.latest_problems.get(key) == []:
            # The newest pod admitted had none: the same problem coming back is news again
            # (remembered, it was never said a second time).
            settings.reported.pop(key, None)
        in_place, untuned = "", []
        failed_in_place: set[str] = set()
        # Pods are changed in place only by the tuning in force that tunes them, where the
        # webhook is sent them.
        changes_pods = (spec.mode is Mode.ENFORCE and not rivals
                        and namespace not in settings.excluded_namespaces)
        if updates.changes and changes_pods:
            # Before the count: a pod that takes the change in place is current once written,
            # and one whose patch failed stays outdated (and is replaced as before).
            updated = _update_pods(namespace, entry, revision, updates, memo, time.monotonic())
            failed_in_place, in_place = updated.refused, updated.message
            pods = [replace(p, revision=revision) if p.name in updated.written else p
                    for p in pods if p.name not in updated.gone]
            if updated.written and settings.problems_revision.get(key) != revision:
                # What the last pod admitted was told of spec.memory was of another spec, and
                # the pods are not re-created to be told again.
                settings.latest_problems[key] = [
                    *(p for p in settings.latest_problems.get(key, [])
                      if not p.startswith(MEMORY_PROBLEM)), *updates.problems]
                settings.problems_revision[key] = revision
        if not (updates.changes and changes_pods):
            settings.refused_in_place.pop(key, None)  # nothing to ask: the waits are over
            settings.written_in_place.pop(key, None)
        if not failed_in_place:  # none now: the next one is news
            settings.reported.pop(f"{key}#{MEMORY_NOT_UPDATED}", None)
        if updates.backfill and changes_pods and leader_of(memo).leads():
            labelled = settings.backfilled.setdefault(key, set())
            labelled &= {p.name for p in pods}  # the pods gone are forgotten
            _backfill(namespace, entry, shape, updates, labelled)
        last = evictions.get(key)
        clock = time.monotonic()
        step = plan_retune(revision, pods, spec.retune.max_unavailable, last, clock)
        message = step.reason
        target = spec.target_ref.name
        if namespace in settings.excluded_namespaces:
            # The registration never sends these pods: a replacement comes back untuned, so
            # replacing them only costs availability (and a model reload each).
            return TuningStatus(
                revision=revision, tuned_pods=step.tuned, outdated_pods=step.outdated,
                message=f"pods of namespace {namespace} are never sent to the operator's webhook "
                "(it leaves out kube-system and the operator's own namespace): none is tuned or "
                "replaced; move the workload to another namespace")
        # Read the Deployment only when something is outdated: most ticks have nothing to do.
        deployment = read_deployment(namespace, target) if step.outdated and not rivals else None
        rollout = None if deployment is None else rollout_of(deployment)
        template = (deployment.spec.template
                    if deployment is not None and deployment.spec is not None else None)
        annotated = ((template.metadata.annotations or {}).get(keys.REVISION)
                     if template is not None and template.metadata is not None else None)
        if not step.outdated:
            pass
        elif tuned_by is not None:
            message = (f"dry run: {step.outdated} pods outdated, none replaced; the pods are "
                       f"tuned by InferenceTuning {tuned_by} (mode Enforce): this trial reports "
                       "its plan here and does not annotate them")
        elif rivals and spec.mode is Mode.DRY_RUN and not rivals_forced:
            message = (f"dry run: {step.outdated} pods outdated, none replaced; InferenceTunings "
                       f"{', '.join(sorted((name, *rivals)))} are all trials (mode DryRun) of "
                       f"Deployment {target}, and none annotates its pods until only one is left")
        elif rivals and spec.mode is Mode.DRY_RUN:
            message = (f"dry run: {step.outdated} pods outdated, none replaced; InferenceTunings "
                       f"{', '.join(rivals)} all target Deployment {target} in mode Enforce, and "
                       "the webhook tunes its pods by none of them")
        elif rivals:
            message = (f"{step.outdated} pods outdated, none replaced: InferenceTunings "
                       f"{', '.join(sorted((name, *rivals)))} all target Deployment {target} in "
                       "mode Enforce, and the webhook tunes its pods only when exactly one does; "
                       "delete the others, or set them to mode DryRun")
        elif deployment is None:
            message = (f"{step.outdated} pods outdated, none replaced: Deployment "
                       f"{namespace}/{target} not found")
        elif not leader_of(memo).leads():
            # Lost while the Deployment read waited (an API server under load): the new leader
            # replaces them; two processes evicting at once took twice the pods down.
            message = (f"{step.outdated} pods outdated, none replaced by this process: it no "
                       "longer leads (--leader-elect), and the leader replaces them")
        elif (why := _why_pods_cannot_be_tuned(name, spec, deployment, memo, batching_value,
                                                admitted_untuned(pods, revision),
                                                revision, updates.refused)
              ) is not None:
            # Re-created pods would come back untuned: replacing them only costs availability.
            message = (f"{step.outdated} pods outdated, none replaced: they keep the tuning they "
                       f"have; {why.problem}" if why.keep_their_tuning else
                       f"{step.outdated} pods not tuned, none replaced: {why.problem}")
            untuned = [why.problem]
        elif (spec.retune.strategy is RetuneStrategy.POD_TEMPLATE_ANNOTATION and failed_in_place
              and step.tuned and {p.name for p in pods if not p.terminating
                                  and p.revision != revision} <= failed_in_place
              and (annotated != revision or (
                  rollout is not None and rollout.observed and not rollout.paused
                  and rollout.pending is None and rollout.settling is None))):
            # Annotating the template for them would roll every pod, the ones current (updated
            # in place) too; and where it carries the revision already and the Deployment has
            # rolled it out (a change back), nothing would replace them. While it rolls (or is
            # paused), what it does is said as for any rollout.
            message = (f"{step.outdated} pods outdated, none replaced: they could not take "
                       "spec.memory in place (see the MemoryHighNotUpdated Event), and with "
                       "retune.strategy PodTemplateAnnotation the Deployment would roll every pod "
                       "for them; fix what refused the patch, or delete them to have them "
                       "re-created")
        elif (spec.mode is Mode.ENFORCE and spec.retune.strategy is RetuneStrategy.EVICT
              and rollout is not None and (rolling := rollout.pending) is not None):
            # An old pod evicted mid-rollout is re-created by the old ReplicaSet (a model load
            # and a GPU) only to be scaled away, and its GPU may be the one the next new pod
            # needs; the pods the rollout starts come through the webhook anyway.
            message = (f"{step.outdated} pods outdated, none evicted while Deployment {target} "
                       f"{rolling}: the pods it starts come through the webhook")
        else:
            # Counted against the replicas the Deployment wants: a pod not created yet (a quota,
            # a scale-up under way) is as unavailable as one that is not Ready.
            desired = deployment.spec.replicas if deployment.spec is not None else None
            step = plan_retune(revision, pods, spec.retune.max_unavailable, last, clock, desired)
            done: list[str] = []
            held: list[str] = []

            def retuned(message: str) -> None:
                # Pods restarted by the operator: said where the tuning's story is told.
                kopf.event(_owner_ref(namespace, entry),  # type: ignore[arg-type]
                           type="Normal", reason=RETUNED, message=message[:MAX_EVENT_MESSAGE])

            message = _replace_outdated(
                namespace, spec, step, revision, done.append, annotated,
                lambda: retuned(f"pod template of {target} annotated with revision {revision}: "
                                f"the Deployment rolls out the {step.outdated} outdated pods"),
                rollout,
                lambda why: held.append(why))
            if held:
                _report_once(memo, namespace, entry, held, refused=True, reason=RETUNE_HELD)
            else:  # not held this pass: the next hold is news
                settings.reported.pop(f"{key}#{RETUNE_HELD}", None)
            if done:
                evictions[key] = step.eviction(revision, pods, done, clock, last)
                retuned(f"evicted {', '.join(done)} to re-create them with revision {revision} "
                        f"({step.outdated} pods were outdated)")
        if untuned and untuned == said_now:
            # Said by the webhook's report just now, in the same words: remembered, not twice.
            settings.reported[f"{key}#{UNTUNED}"] = tuple(untuned)
        elif untuned:
            # Apart from the pods' problems, which a pod admitted without any forgets at each
            # pass: said again every pass while it lasted.
            _report_once(memo, namespace, entry, untuned, refused=True, topic=UNTUNED)
        else:
            settings.reported.pop(f"{key}#{UNTUNED}", None)
        if in_place:
            message = f"{message}; {in_place}"
        # A trial beside the one in force admits no pod: what it last said of one is not now.
        said = [] if tuned_by is not None else settings.latest_problems.get(key, [])[:20]
        return TuningStatus(revision=revision, tuned_pods=step.tuned, outdated_pods=step.outdated,
                            message=message, problems=said)
    finally:
        if uid in settings.stopped and settings.uids.get(key) in (None, uid):
            settings.forget(key)


def _problems_as_stored(settings: PodTuningSettings, key: str, revision: str,
                        stored: Mapping[str, Any] | None) -> None:
    """Take the problems status.tuning shows as this process's, where the pass that stored
    them was of the current revision: they are kept in memory, and a restarted operator (or a
    new leader) showed none until a pod was admitted again, which may not be for days (a
    memory problem found in place is said of no admitted pod at all). Their Event is not
    posted again: a pod admitted with them posts it, as after any restart."""
    if not stored or stored.get("revision") != revision:
        return
    shown = stored.get("problems")
    if not isinstance(shown, list):
        return
    problems = [p for p in shown if isinstance(p, str)][:20]
    if problems:
        # Not taken as found for this revision (`problems_revision`): status.tuning.revision
        # is the pass's, and the spec.memory ones may be of the spec before, shown while its
        # in-place patch was refused; the next pod written in place says them anew.
        settings.latest_problems[key] = problems


@kopf.daemon(*RESOURCE, cancellation_timeout=STOP_TIMEOUT_S)  # type: ignore[arg-type]
async def retune_pods(stopped: kopf.DaemonStopped, namespace: str, name: str, uid: str,
                      body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                      pods_by_deployment: kopf.Index[tuple[str, str], PodView],
                      tunings_by_target: kopf.Index[tuple[str, str], dict[str, Any]],
                      **_: Any) -> None:
    """Every RETUNE_INTERVAL: count tuned and outdated pods into status.tuning and replace
    the outdated ones (a loop, not a kopf timer: see loops.py)."""
    # Started again for the same tuning (kopf resumes a daemon it stopped, as when peering
    # pauses the operator): its passes keep what they find again.
    memo.pod_tuning.stopped.pop(uid, None)
    memo.pod_tuning.uids[f"{namespace}/{name}"] = uid

    def read(spec: dict[str, Any], status: dict[str, Any],
             meta: dict[str, Any]) -> Work | None:
        parsed = SPECS.get(uid, int(meta.get("generation") or 0), spec)
        if parsed is None:
            return None  # the controller reports the invalid spec
        target = (namespace, parsed.target_ref.name)
        pods = list(pods_by_deployment.get(target, []))
        others = {str(e["name"]): entry_in_force(e)
                  for e in tunings_by_target.get(target, []) if e.get("uid") != uid}
        forced = parsed.mode is Mode.ENFORCE
        owner = pods_tuned_by([(name, forced), *others.items()])
        # The tunings that keep the pods from this one's: beside one in force, the others in
        # force (two trials alone: the other trials); a trial beside the one in force: it.
        rivals = () if owner == name else tuple(sorted(
            other for other, other_forced in others.items()
            if other_forced or not any(others.values())))
        tuned_by = None if owner in (None, name) else owner
        batching = applied_batching(status, spec)
        mig = planned_mig(status.get("mig") or {})
        rivals_forced = forced or any(others.values())
        stored = status.get("tuning")
        return lambda: {"tuning": retune(namespace, name, uid, parsed, pods, memo,
                                         batching, mig, rivals, tuned_by, rivals_forced,
                                         stored if isinstance(stored, dict) else None
                                         ).model_dump(by_alias=True, mode="json")}

    try:
        await every(RETUNE_INTERVAL, read, what="re-tuning", stopped=stopped,
                    namespace=namespace, name=name, body=body, logger=logger,
                    leader=leader_of(memo))
    finally:
        # kopf stops the daemon when the tuning is deleted (or the operator exits).
        settings: PodTuningSettings = memo.pod_tuning
        clock = time.monotonic()
        for old in [u for u, at in settings.stopped.items() if clock - at > STOPPED_KEPT_S]:
            del settings.stopped[old]
        settings.stopped[uid] = clock
        if settings.uids.get(f"{namespace}/{name}") in (None, uid):  # not a new one's
            settings.forget(f"{namespace}/{name}")
