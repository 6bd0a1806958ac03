"""Autoscaling in the shell: one batched Prometheus fetch per cycle, a decision per tuning,
replicas written only through the scale subresource (DESIGN.md #5).

Every InferenceTuning with autoscaling has a 1 s timer that acts once per slot of its own
interval: slots are aligned to the clock (as Prometheus aligns rule evaluations), so the
tunings that share an interval fall due together. The first timer of a slot fetches the
signals of every tuning due in it in one set of queries (the query count stays flat as tunings
grow); the others reuse that batch. Parsed specs and metrics targets are cached per
(uid, generation), so a tick that is not due costs a dictionary lookup.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from infertune.api.scaling import BatchingMode
from infertune.api.spec import GROUP, PLURAL, VERSION, InferenceTuning, InferenceTuningSpec, Mode
from infertune.api.status import (
    MAX_DECISIONS,
    AutoscalingState,
    AutoscalingStatus,
    BatchingStatus,
    Condition,
    ConditionStatus,
    ConditionType,
    Decision,
)
from infertune.api.units import format_duration
from infertune.controller.conditions import make_condition, set_condition
from infertune.metrics.source import MetricsSource, MetricsTarget, target_for_tuning
from infertune.scaling.batching import recommend_batching
from infertune.scaling.engine import ScaleAction, ScaleDecision, decide_scale
from infertune.scaling.signals import TargetSignals
from infertune.scaling.state import ScalingState, format_time

RESOURCE = (GROUP, VERSION, PLURAL)
FIGHT_LIMIT = 2
"""Reverts by another writer before the operator stops writing replicas."""
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Parsed:
    """One tuning's spec, validated once per generation."""

    spec: InferenceTuningSpec
    target: MetricsTarget
    interval_s: float


@dataclass
class AutoscalingSettings:
    """Shared across timers (kopf copies the memo per object, not these objects)."""

    source: MetricsSource | None
    batch: dict[str, TargetSignals] = field(default_factory=dict)
    fetched_at: dict[str, float] = field(default_factory=dict)
    """key -> when its signals in `batch` were fetched."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_slot: dict[str, int] = field(default_factory=dict)
    """key -> the interval slot (floor(time / interval)) last evaluated."""
    parsed: dict[str, tuple[tuple[str, int], Parsed | None]] = field(default_factory=dict)
    """key -> ((uid, generation), the parsed spec or None when it does not validate)."""
    written: dict[str, tuple[int, int]] = field(default_factory=dict)
    """key -> (replicas before our write, replicas we wrote)."""
    fights: dict[str, int] = field(default_factory=dict)
    fetches: int = 0
    """Batches fetched since start (for the benchmark and the logs)."""

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
        self.parsed[key] = (version, parsed)
        return parsed

    def due(self, key: str, parsed: Parsed, now: float) -> bool:
        return self.last_slot.get(key) != math.floor(now / parsed.interval_s)


def autoscaled(settings: AutoscalingSettings,
               index: kopf.Index[tuple[str, str], dict[str, Any]]) -> Iterator[tuple[str, Parsed]]:
    """(key, parsed) of every tuning with autoscaling enabled, from the kopf index."""
    for (namespace, _target), entries in index.items():
        for entry in entries:
            scaling = entry["spec"].get("autoscaling")
            if not scaling or scaling.get("enabled") is False:
                continue
            parsed = settings.parse(namespace, entry["name"], entry.get("uid", ""),
                                    int(entry.get("generation") or 0), entry["spec"])
            if parsed is not None:
                yield f"{namespace}/{entry['name']}", parsed


def signals_if_due(settings: AutoscalingSettings, key: str, parsed: Parsed,
                   index: kopf.Index[tuple[str, str], dict[str, Any]],
                   now: float) -> TargetSignals | None:
    """None unless `key` is due in this slot of its interval; then its signals, and the slot
    counts as evaluated."""
    if not settings.due(key, parsed, now):
        return None
    slot = math.floor(now / parsed.interval_s)
    settings.last_slot[key] = slot
    return signals_for(settings, key, slot * parsed.interval_s, autoscaled(settings, index), now)


def signals_for(settings: AutoscalingSettings, key: str, slot_start: float,
                tunings: Iterator[tuple[str, Parsed]], now: float) -> TargetSignals | None:
    """`key`'s signals: from the batch if it was fetched in this slot, else one fetch for every
    tuning due now (most of them share the slot, so their timers find the batch ready)."""
    assert settings.source is not None
    with settings.lock:
        if settings.fetched_at.get(key, -math.inf) >= slot_start and key in settings.batch:
            return settings.batch[key]
        known: set[str] = set()
        targets: list[MetricsTarget] = []
        for other, parsed in tunings:
            known.add(other)
            if other == key or settings.due(other, parsed, now):
                targets.append(parsed.target)
        fetched = settings.source.fetch(targets, now)
        settings.fetches += 1
        for gone in [k for k in settings.batch if k not in known]:
            for table in (settings.batch, settings.fetched_at, settings.last_slot,
                          settings.parsed):
                table.pop(gone, None)
        for other, signals in fetched.items():
            settings.batch[other] = signals
            settings.fetched_at[other] = now
        return settings.batch.get(key)


@kopf.index("autoscaling", "v2", "horizontalpodautoscalers")  # type: ignore[arg-type]
def hpas_by_target(namespace: str, name: str, spec: kopf.Spec,
                   **_: Any) -> dict[tuple[str, str], str] | None:
    """HPAs by the Deployment they scale, so each evaluation checks without an API call."""
    ref = spec.get("scaleTargetRef") or {}
    if ref.get("kind") != "Deployment":
        return None
    return {(namespace, str(ref.get("name"))): name}


def _fight(settings: AutoscalingSettings, key: str, current: int) -> bool:
    """True once another writer has put replicas back FIGHT_LIMIT times after our writes."""
    written = settings.written.get(key)
    if written is not None and current != written[1]:
        settings.fights[key] = settings.fights.get(key, 0) + 1
        settings.written.pop(key)
    return settings.fights.get(key, 0) >= FIGHT_LIMIT


def _condition(kind: ConditionType, ok: bool, reason: str, message: str, generation: int,
               now: str) -> Condition:
    status = ConditionStatus.TRUE if ok else ConditionStatus.FALSE
    return make_condition(kind, status, reason, message, generation, now)


def _set_conditions(patch: kopf.Patch, status: dict[str, Any], *new: Condition) -> None:
    """Write `new` over the stored conditions, keeping the others (the list is replaced whole)."""
    conditions = [Condition.model_validate(c) for c in status.get("conditions") or []]
    for condition in new:
        conditions = set_condition(conditions, condition)
    patch.status["conditions"] = [c.model_dump(by_alias=True, mode="json", exclude_none=True)
                                  for c in conditions]


def _status_block(decision: ScaleDecision, state: ScalingState, stamp: str,
                  last_scale: str | None) -> AutoscalingStatus:
    reading = decision.signals
    latency = reading.latency_s
    return AutoscalingStatus(
        current_replicas=decision.current_replicas, desired_replicas=decision.desired_replicas,
        p99_ms=None if latency is None else round(latency * 1000, 1),
        p99=None if latency is None else format_duration(latency),
        queue_depth=None if reading.queue_per_replica is None else round(
            reading.queue_per_replica, 2),
        breaches=reading.breaches, reason=decision.reason, action=decision.action.value,
        latency_kind=reading.latency_kind, evaluated=stamp, last_scale_time=last_scale,
        state=AutoscalingState.model_validate(state.to_json()))


def evaluate(namespace: str, name: str, generation: int, spec: InferenceTuningSpec,
             status: dict[str, Any], signals: TargetSignals, settings: AutoscalingSettings,
             hpas: kopf.Index[tuple[str, str], str], body: kopf.Body, patch: kopf.Patch,
             now: float) -> ScaleDecision:
    """Decide, write replicas (unless DryRun, a fight or an HPA), and report."""
    assert spec.autoscaling is not None
    key, stamp = f"{namespace}/{name}", format_time(now)
    apps = client.AppsV1Api()
    deployment = spec.target_ref.name
    scale = apps.read_namespaced_deployment_scale(deployment, namespace)
    current = int(scale.spec.replicas or 0) if scale.spec else 0
    previous = status.get("autoscaling") or {}
    state = ScalingState.from_json(previous.get("state"))
    decision = decide_scale(spec.autoscaling, current, signals, state, now)

    hpa = next(iter(hpas.get((namespace, deployment), [])), None)
    fight = _fight(settings, key, current)
    blocked = ("HorizontalPodAutoscalerPresent", f"HorizontalPodAutoscaler {hpa} also scales "
               f"{deployment}; remove it or disable spec.autoscaling") if hpa else (
        "ReplicaFight", f"another writer reverted the replicas of {deployment} "
        f"{settings.fights.get(key, 0)} times (GitOps without ignoreDifferences on "
        "/spec/replicas?); replicas are no longer written") if fight else None
    changes = decision.desired_replicas != current
    applied = changes and spec.mode is Mode.ENFORCE and blocked is None
    last_scale = previous.get("lastScaleTime")
    if applied:
        apps.patch_namespaced_deployment_scale(deployment, namespace,
                                               {"spec": {"replicas": decision.desired_replicas}})
        settings.written[key] = (current, decision.desired_replicas)
        last_scale = stamp
    kept = decision.state if applied else decision.held_state

    problems = "; ".join(decision.signals.problems)
    _set_conditions(patch, status, _condition(
        ConditionType.METRICS_AVAILABLE, not problems, "MetricsMissing" if problems else "Found",
        problems or "queue and latency series found", generation, stamp), _condition(
        ConditionType.SCALING_ACTIVE, blocked is None, blocked[0] if blocked else (
            "DryRun" if spec.mode is Mode.DRY_RUN else "Scaling"),
        blocked[1] if blocked else decision.reason, generation, stamp))
    block = _status_block(decision, kept, stamp, last_scale)
    patch.status["autoscaling"] = block.model_dump(by_alias=True, mode="json", exclude_none=True)
    _report(decision, changes, applied, spec, status, patch, body, stamp)
    if spec.batching.mode.value != "Off":
        rec = recommend_batching(spec.batching, spec.engine, spec.autoscaling, decision.signals,
                                 (status.get("batching") or {}).get("recommended"))
        if rec is not None:
            knob_value = _applied(spec, (status.get("batching") or {}).get("applied"),
                                  rec.recommended)
            patch.status["batching"] = BatchingStatus(
                knob=rec.knob.value, current=rec.current, recommended=rec.recommended,
                applied=knob_value, reason=rec.reason,
            ).model_dump(by_alias=True, mode="json", exclude_none=True)
    return decision


APPLY_STEP = 0.25
"""Batching mode Auto follows the recommendation only when it moves by this fraction: every
change re-creates the pods."""


def _applied(spec: InferenceTuningSpec, previous: int | None, recommended: int) -> int | None:
    if spec.batching.mode is not BatchingMode.AUTO or spec.mode is Mode.DRY_RUN:
        return None
    if previous is None or abs(recommended - previous) >= APPLY_STEP * previous:
        return recommended
    return int(previous)


def _report(decision: ScaleDecision, changes: bool, applied: bool, spec: InferenceTuningSpec,
            status: dict[str, Any], patch: kopf.Patch, body: kopf.Body, stamp: str) -> None:
    """An Event and a decision record for each scale action (or would-be action)."""
    previous_action = (status.get("autoscaling") or {}).get("action")
    batching_news = (decision.action is ScaleAction.TUNE_BATCHING
                     and previous_action != ScaleAction.TUNE_BATCHING.value)
    if not changes and not batching_news:
        return
    reason = {ScaleAction.SCALE_OUT: "ScaledOut", ScaleAction.SCALE_IN: "ScaledIn",
              ScaleAction.FALLBACK: "ScaledToFallback",
              ScaleAction.TUNE_BATCHING: "TuneBatching"}.get(decision.action, "Scaled")
    prefix = "" if applied or not changes else (
        "dry run, not applied: " if spec.mode is Mode.DRY_RUN else "not applied: ")
    kopf.event(body, type="Normal", reason=reason, message=(prefix + decision.reason)[:1000])
    decisions = [*(status.get("decisions") or []), Decision(
        time=stamp, feature="autoscaling",
        action=f"{decision.action.value} {decision.current_replicas} -> "
               f"{decision.desired_replicas}",
        reason=decision.reason[:1000], applied=applied).model_dump(by_alias=True,
                                                                   mode="json")][-MAX_DECISIONS:]
    patch.status["decisions"] = decisions


@kopf.timer(*RESOURCE, interval=1.0, initial_delay=1.0,  # type: ignore[arg-type]
            when=lambda spec, **_: bool(spec.get("autoscaling")))
def autoscale(namespace: str, name: str, spec: kopf.Spec, status: kopf.Status, meta: kopf.Meta,
              body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo,
              tunings_by_target: kopf.Index[tuple[str, str], dict[str, Any]],
              hpas_by_target: kopf.Index[tuple[str, str], str], **_: Any) -> None:
    settings: AutoscalingSettings = memo.autoscaling
    generation = int(meta.get("generation") or 0)
    parsed = settings.parse(namespace, name, str(meta.get("uid") or ""), generation, dict(spec))
    if parsed is None:
        return  # invalid (reported by the controller) or without autoscaling
    if settings.source is None:
        _set_conditions(patch, dict(status), _condition(
            ConditionType.SCALING_ACTIVE, False, "NoPrometheus", "the operator runs without "
            "--prometheus-url, so spec.autoscaling cannot be evaluated",
            generation, format_time(time.time())))
        return
    now = time.time()
    signals = signals_if_due(settings, f"{namespace}/{name}", parsed, tunings_by_target, now)
    if signals is None:
        return
    try:
        evaluate(namespace, name, generation, parsed.spec, dict(status), signals, settings,
                 hpas_by_target, body, patch, now)
    except ApiException as exc:
        if exc.status == 404:
            return  # the target is missing; the controller reports it
        raise
