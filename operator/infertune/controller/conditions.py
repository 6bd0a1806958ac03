"""Conditions by the Kubernetes API conventions: one per type, lastTransitionTime kept until
the status really changes, observedGeneration on each."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from infertune.api.status import Condition, ConditionStatus, ConditionType, Phase

MAX_MESSAGE = 32000
"""Condition messages are capped below metav1.Condition's 32768 characters."""
MAX_EVENT_MESSAGE = 1000
"""Event messages are cut here (events.k8s.io allows a 1 KiB note); the condition says all."""
NOT_EVALUATED = "NotEvaluated"
"""MetricsAvailable's and ScalingLimited's reason (Unknown) while the autoscaler evaluates
nothing, whatever the cause (ScalingActive's reason says it): one name for one state."""


def now_rfc3339() -> str:
    """Now, at the second resolution the API server writes (creationTimestamp and friends)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_condition(kind: ConditionType, status: ConditionStatus, reason: str, message: str,
                   generation: int, now: str) -> Condition:
    return Condition(type=kind.value, status=status, reason=reason,
                     message=message[:MAX_MESSAGE], observed_generation=generation,
                     last_transition_time=now)


def set_condition(conditions: Iterable[Condition], new: Condition) -> list[Condition]:
    """`conditions` with `new` in place of its type; the transition time moves only on change."""
    out: list[Condition] = []
    replaced = False
    for current in conditions:
        if current.type != new.type:
            out.append(current)
            continue
        replaced = True
        if current.status == new.status:
            new = new.model_copy(update={"last_transition_time": current.last_transition_time})
        out.append(new)
    if not replaced:
        out.append(new)
    return out


def condition_dict(kind: ConditionType, status: ConditionStatus, reason: str, message: str,
                   generation: int, now: str) -> dict[str, Any]:
    """`make_condition` as stored in status (camelCase), for the autoscaler, which builds two
    per tuning per cycle: a model to validate and dump would cost more than the decision."""
    # str(): the members' text (`.value` is a Python-level property of Enum, str() is not).
    return {"type": str(kind), "status": str(status), "observedGeneration": generation,
            "lastTransitionTime": now, "reason": reason,
            "message": message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE]}


def merge_condition_dicts(stored: Iterable[Any],
                          *new: dict[str, Any]) -> list[dict[str, Any]] | None:
    """`set_condition` for conditions as stored in status (plain dicts, camelCase): each of
    `new` replaces the one of its type, keeping its lastTransitionTime while the status is the
    same. None when each of `new` is stored as it is already (the transition time aside): the
    caller then leaves the list out of its patch instead of writing it again unchanged."""
    stored = list(stored)
    for condition in new:
        if not _stored_as_is(stored, condition):
            break
    else:
        return None
    by_type = {c["type"]: c for c in new}
    out: list[dict[str, Any]] = []
    for current in stored:
        kind = current.get("type") if isinstance(current, dict) else None
        replacement = by_type.pop(kind, None) if kind is not None else None
        if replacement is None:
            out.append(current)
            continue
        if current.get("status") == replacement["status"] and current.get("lastTransitionTime"):
            replacement = {**replacement, "lastTransitionTime": current["lastTransitionTime"]}
        out.append(replacement)
    out.extend(by_type.values())
    return out


def _stored_as_is(stored: list[Any], condition: dict[str, Any]) -> bool:
    kind = condition["type"]
    for old in stored:
        if isinstance(old, dict) and old.get("type") == kind:
            return bool(old.get("status") == condition["status"]
                        and old.get("reason") == condition["reason"]
                        and old.get("message") == condition["message"]
                        and old.get("observedGeneration") == condition["observedGeneration"])
    return False


def find(conditions: Iterable[Condition], kind: ConditionType) -> Condition | None:
    return next((c for c in conditions if c.type == kind.value), None)


def stored_condition(status: Mapping[str, Any], kind: ConditionType) -> dict[str, Any] | None:
    """The condition `kind` as stored in status (a plain dict), if any."""
    wanted = str(kind)
    for condition in status.get("conditions") or ():
        if isinstance(condition, dict) and condition.get("type") == wanted:
            return condition
    return None


def stored_reason(status: Mapping[str, Any], kind: ConditionType) -> str | None:
    """The reason of the condition `kind` as stored in status (plain dicts), if any."""
    reason = (stored_condition(status, kind) or {}).get("reason")
    return reason if isinstance(reason, str) else None


def phase_of(conditions: Iterable[Condition]) -> Phase:
    """The one-word summary printed by `kubectl get itune`."""
    conditions = list(conditions)
    ready = find(conditions, ConditionType.READY)
    if ready is None or ready.status is ConditionStatus.UNKNOWN:
        return Phase.PENDING
    if ready.status is ConditionStatus.FALSE:
        return Phase.ERROR if ready.reason == "InvalidSpec" else Phase.PENDING
    dry_run = find(conditions, ConditionType.DRY_RUN)
    if dry_run is not None and dry_run.status is ConditionStatus.TRUE:
        return Phase.DRY_RUN
    return Phase.ACTIVE
