"""Spec section for canary rollouts of new model versions (primary/canary model)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from infertune.api.base import (
    FLAG,
    NUMBER,
    ApiModel,
    CrossFieldProblems,
    int64,
    no_schema_default,
)
from infertune.api.units import Duration

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class CanaryStep(ApiModel):
    """One step of the rollout: send `weight` percent of traffic to the canary, then wait."""

    weight: Annotated[int, Field(ge=1, le=100), NUMBER]
    """Percent of traffic on the canary during this step."""

    pause: Annotated[Duration, Field(json_schema_extra=no_schema_default)] = Duration("1m")
    """How long to hold this weight, analysing every analysis interval, before the next step.
    Default 1m."""


class CanaryAnalysis(ApiModel):
    """Checks that compare the canary with the primary on the same window."""

    interval: Duration = Duration("1m")
    """How often the checks run and the window they cover."""

    max_p99_regression: Annotated[float, Field(ge=0, le=10), NUMBER] = 0.2
    """Largest allowed relative P99 increase of the canary over the primary (0.2 = +20%)."""

    max_p99: Duration | None = None
    """Absolute P99 ceiling for the canary, for example 500ms. Unset means no absolute check."""

    max_error_rate: Annotated[float, Field(ge=0, le=1), NUMBER] = 0.01
    """Largest allowed fraction of failed requests on the canary."""

    # Within an int64, as the API server takes integers, but not as a `maximum` in the CRD:
    # it keeps those as a float64 and refused 2^63-1, and a lower one would make objects
    # stored by the previous release (which had none) InvalidSpec on upgrade.
    min_request_count: Annotated[int, Field(ge=0), NUMBER, AfterValidator(int64)] = 100
    """Requests the canary must have served in a window for the window to count; with fewer
    the check neither passes nor fails."""

    failure_limit: Annotated[int, Field(ge=1, le=100), NUMBER] = 3
    """Failed checks before the canary is rolled back."""

    @model_validator(mode="after")
    def _windows_hold_samples(self) -> CanaryAnalysis:
        problems = CrossFieldProblems()
        if self.interval.seconds < 1:
            problems.add("interval", f"{self.interval} is too short a window to hold the "
                         "Prometheus samples a check judges; use 1s or more, better a few "
                         "scrape intervals such as 1m")
        if self.max_p99 is not None and self.max_p99.seconds <= 0:
            problems.add("maxP99", f"{self.max_p99} fails every check; give the P99 the canary "
                         "must stay under, such as 500ms, or leave it out")
        problems.raise_if_any()
        return self


class RoutingType(StrEnum):
    """How traffic is split between primary and canary."""

    REPLICA_RATIO = "ReplicaRatio"
    GATEWAY_API = "GatewayAPI"


class HTTPRouteRef(ApiModel):
    """A Gateway API HTTPRoute whose backend weights the operator sets."""

    name: Annotated[str, Field(pattern=_DNS_SUBDOMAIN, max_length=253)]
    """Name of the HTTPRoute, in the InferenceTuning's namespace."""

    primary_service: Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)] | None = None
    """Service of the primary track. Defaults to <target>-primary."""

    canary_service: Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)] | None = None
    """Service of the canary track. Defaults to <target>-canary."""


class CanaryRouting(ApiModel):
    """Traffic routing between primary and canary."""

    type: RoutingType = RoutingType.REPLICA_RATIO
    """ReplicaRatio splits traffic by the ratio of ready replicas behind one Service;
    GatewayAPI sets weights on an HTTPRoute."""

    http_route: HTTPRouteRef | None = None
    """The HTTPRoute to drive. Required with type GatewayAPI."""

    @model_validator(mode="after")
    def _route_matches_type(self) -> CanaryRouting:
        problems = CrossFieldProblems()
        if self.type is RoutingType.GATEWAY_API and self.http_route is None:
            problems.add("httpRoute", "type GatewayAPI needs httpRoute.name")
        if self.type is RoutingType.REPLICA_RATIO and self.http_route is not None:
            problems.add("httpRoute", "is only used with type GatewayAPI; remove it or set "
                         "type: GatewayAPI")
        problems.raise_if_any()
        return self


CANARY_NOT_ENFORCED = ("not enforced yet: canary rollouts are planned, new revisions roll out "
                       "as the Deployment says")
"""Said of an enabled spec.canary wherever a spec is judged (the Ready condition, `infertune
validate`, the admission warning): it is accepted and checked, and nothing acts on it."""


def canary_enabled(spec: object) -> bool:
    """Whether a raw spec (a mapping, as admission sees it) asks for a canary: a section
    present, not `enabled: false`."""
    canary = spec.get("canary") if isinstance(spec, Mapping) else None
    return isinstance(canary, Mapping) and canary.get("enabled", True) is not False


def _default_steps() -> list[CanaryStep]:
    return [CanaryStep(weight=10), CanaryStep(weight=25), CanaryStep(weight=50)]


class CanarySpec(ApiModel):
    """Canary rollout of a new revision of the target: weights rise step by step while the
    canary is compared with the primary, then it is promoted or rolled back."""

    enabled: Annotated[bool, FLAG] = True
    """Set to false to roll out new revisions directly."""

    steps: list[CanaryStep] = Field(default_factory=_default_steps, min_length=1, max_length=20)
    """Traffic steps, with strictly rising weights. After the last step the canary is promoted."""

    analysis: CanaryAnalysis = Field(default_factory=CanaryAnalysis)
    """Promotion and rollback checks."""

    routing: CanaryRouting = Field(default_factory=CanaryRouting)
    """How traffic is split."""

    @model_validator(mode="after")
    def _weights_rise(self) -> CanarySpec:
        problems = CrossFieldProblems()
        for index in range(1, len(self.steps)):
            before, now = self.steps[index - 1].weight, self.steps[index].weight
            if now <= before:
                problems.add(f"steps[{index}].weight", f"{now} does not rise above the previous "
                             f"step's {before}; canary weights must rise step by step")
        problems.raise_if_any()
        return self
