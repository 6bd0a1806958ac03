"""HPA's behaviour rules: the stabilization window and the per-period rate limits.

Ported from kubernetes pkg/controller/podautoscaler/horizontal.go
(stabilizeRecommendationWithBehaviors, convertDesiredReplicasWithBehaviorRate,
calculateScaleUpLimitWithScalingRules, calculateScaleDownLimitWithBehaviors), with the
recommendations and events passed in instead of kept in the controller.
"""

from __future__ import annotations

from enum import StrEnum

from infertune.api.scaling import ScalingRules, SelectPolicy
from infertune.scaling.signals import seconds
from infertune.scaling.state import Recommendation, ScaleEvent


class Limit(StrEnum):
    """What kept the replicas from the count the signals called for, as HPA's ScalingLimited
    condition names it (its reason)."""

    TOO_MANY = "TooManyReplicas"
    """More than maxReplicas was called for."""
    TOO_FEW = "TooFewReplicas"
    """Fewer than minReplicas was called for (an idle Deployment at its minimum)."""
    SCALE_UP = "ScaleUpLimit"
    """The scale-up rate limits (spec.autoscaling.scaleUp) allowed fewer replicas."""
    SCALE_DOWN = "ScaleDownLimit"
    """The scale-down rate limits (spec.autoscaling.scaleDown) took fewer away."""


def stabilize(current: int, desired: int, recommendations: tuple[Recommendation, ...],
              up: ScalingRules, down: ScalingRules, now: float) -> tuple[int, str | None]:
    """The replicas after the stabilization windows, and why they differ from `desired`.

    Scaling up uses the lowest recommendation in the scale-up window, scaling down the highest
    in the scale-down window, so a brief spike or dip does not move replicas.
    """
    up_cutoff = now - seconds(up.stabilization)
    down_cutoff = now - seconds(down.stabilization)
    up_rec = down_rec = desired
    for time, replicas in recommendations:
        if time > up_cutoff and replicas < up_rec:
            up_rec = replicas
        if time > down_cutoff and replicas > down_rec:
            down_rec = replicas
    result = min(max(current, up_rec), down_rec)
    if result == desired:
        return result, None
    # The window's extreme, and the current count when that is beyond it (no scale-down to
    # a count above the current one, no scale-up to one below it).
    if result > desired:
        held = "" if result == down_rec else f", so the current {current} stays"
        return result, (f"scale-down stabilized at {result}: the highest recommendation in the "
                        f"last {down.stabilization} is {down_rec}{held}")
    held = "" if result == up_rec else f", so the current {current} stays"
    return result, (f"scale-up stabilized at {result}: the lowest recommendation in the last "
                    f"{up.stabilization} is {up_rec}{held}")


def _changes_in_period(events: tuple[ScaleEvent, ...], period_s: float,
                       now: float) -> tuple[int, int]:
    added = deleted = 0
    cutoff = now - period_s
    for time, change in events:
        if time > cutoff:
            if change > 0:
                added += change
            else:
                deleted -= change
    return added, deleted


def scale_up_limit(current: int, events: tuple[ScaleEvent, ...], rules: ScalingRules,
                   now: float) -> tuple[int, int]:
    """The most replicas allowed now, counted from the replicas at the start of the period:
    the larger of the pods and percent limits (selectPolicy Max) or the smaller (Min); 0
    disables a limit; Disabled allows none. Never below `current`. Returns (limit, replicas
    at the start of the period)."""
    added, deleted = _changes_in_period(events, seconds(rules.period), now)
    start = current - added + deleted
    if rules.select_policy is SelectPolicy.DISABLED:
        return current, start
    proposals = []
    if rules.pods > 0:
        proposals.append(start + rules.pods)
    if rules.percent > 0:
        # Rounded up, or a small Deployment could never grow (horizontal.go). In integers:
        # 50 x (1 + 10/100) is 55.00000000000001 in floats, which rounded up to 56.
        proposals.append(-(-start * (100 + rules.percent) // 100))
    chosen = min(proposals) if rules.select_policy is SelectPolicy.MIN else max(proposals)
    return max(chosen, current), start


def scale_down_limit(current: int, events: tuple[ScaleEvent, ...], rules: ScalingRules,
                     now: float) -> tuple[int, int]:
    """The fewest replicas allowed now, counted from the start of the period: the larger
    change of the two limits (the lower count, selectPolicy Max) or the smaller (Min); 0
    disables a limit; Disabled allows none. Never above `current`. Returns (limit, replicas
    at the start of the period)."""
    added, deleted = _changes_in_period(events, seconds(rules.period), now)
    start = current - added + deleted
    if rules.select_policy is SelectPolicy.DISABLED:
        return current, start
    proposals = []
    if rules.pods > 0:
        proposals.append(start - rules.pods)
    if rules.percent > 0:
        # In integers: 10 x (1 - 80/100) is 1.9999999999999996 in floats, which floored to 1.
        proposals.append(start * (100 - rules.percent) // 100)
    chosen = max(proposals) if rules.select_policy is SelectPolicy.MIN else min(proposals)
    return min(chosen, current), start


def limit_rate(current: int, desired: int, events: tuple[ScaleEvent, ...], up: ScalingRules,
               down: ScalingRules, min_replicas: int, max_replicas: int,
               now: float) -> tuple[int, str | None, Limit | None]:
    """`desired` within minReplicas..maxReplicas and the rate limits, why if it moved, and
    which of them moved it."""
    if desired > current:
        limit, start = scale_up_limit(current, events, up, now)
        if limit < max_replicas and desired > limit:
            if up.select_policy is SelectPolicy.DISABLED:  # the limit is the current count
                return limit, (f"scale-up to {min(desired, max_replicas)} disabled by "
                               "scaleUp.selectPolicy Disabled"), Limit.SCALE_UP
            return limit, (f"scale-up limited to {limit} by {rule_text(up, '+')} "
                           f"({_counted_from(start, current)})"), Limit.SCALE_UP
        if desired > max_replicas:
            return max_replicas, f"capped at maxReplicas {max_replicas}", Limit.TOO_MANY
    elif desired < current:
        limit, start = scale_down_limit(current, events, down, now)
        if limit > min_replicas and desired < limit:
            if down.select_policy is SelectPolicy.DISABLED:  # the limit is the current count
                return limit, (f"scale-down to {max(desired, min_replicas)} disabled by "
                               "scaleDown.selectPolicy Disabled"), Limit.SCALE_DOWN
            return limit, (f"scale-down limited to {limit} by {rule_text(down, '-')} "
                           f"({_counted_from(start, current)})"), Limit.SCALE_DOWN
        if desired < min_replicas:
            return min_replicas, f"floored at minReplicas {min_replicas}", Limit.TOO_FEW
    return desired, None, None


def _counted_from(start: int, current: int) -> str:
    if start == current:
        return f"from {current}"
    if start <= 0:
        # Scaled out in the period and then set lower by someone else: the change made is
        # spent all the same (as HPA counts it), and a start of -2 or 0 replicas (which the
        # operator never scales from) says nothing to a person.
        return f"the period's scale events add up to {current - start:+d}, now {current}"
    return f"from {start} at the start of the period, now {current}"


def rule_text(rules: ScalingRules, sign: str) -> str:
    """The rate limits of `rules` as a person writes them: "+4 pods per 1m",
    "max(+4 pods, +100%) per 15s"."""
    parts = [f"{sign}{rules.pods} pods"] if rules.pods else []
    parts += [f"{sign}{rules.percent}%"] if rules.percent else []
    pick = "min" if rules.select_policy is SelectPolicy.MIN else "max"
    both = f"{pick}({', '.join(parts)})" if len(parts) == 2 else parts[0]
    return f"{both} per {rules.period}"
