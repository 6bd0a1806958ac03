"""memory.high for a serving container: the value from the spec, checked against its resources.

Pure: the same function serves `infertune validate`, the webhook and the node agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from infertune.api.tuning import MIN_MEMORY_HIGH, MemorySpec
from infertune.api.units import parse_quantity

PAGE = 4096
"""memory.high is kept in pages: the kernel rounds a value written to it down to a page (4 KiB
on x86-64), and the MemoryQoS formula (KEP-2570) floors to the page size too. Intents are
given rounded so, as the cgroup reads them back."""


def _pages(value: Decimal | int) -> int:
    return int(value) // PAGE * PAGE


@dataclass(frozen=True)
class MemoryHigh:
    """The memory.high to write (None: leave it at "max") and why."""

    value: int | None
    reason: str
    warning: str | None = None
    """A value the spec sets that is applied but likely too low, said as a problem."""


DEFAULT_FLOOR_OF_LIMIT = Decimal("0.5")
"""The default memory.high is never under this fraction of the memory limit: on a small
limit, minHeadroom takes most of it (76Mi of a 1100Mi Guaranteed container), which throttles
the server far below what it was given, as in the incident (64M); memory.high then stays at
max. A value the spec sets for a container whose request is its limit is refused under it:
`memory.high: 64Mi` on a 32Gi container was taken, the incident's own setting."""


class MemoryHighError(ValueError):
    """The spec asks for a memory.high that the container's resources cannot take. `partial`:
    the pod can still get the rest of the tuning, with memory.high left at max (the webhook
    reports it; `validate` refuses it all the same)."""

    def __init__(self, field: str, message: str, *, partial: bool = False) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.partial = partial

    def said_of_pod(self) -> str:
        """How the problem is said of a pod, by the webhook and by re-tuning alike (the same
        words are one Event): the field and why, and for a partial one what the pod gets."""
        said = f"spec.{self.field}: {self.message}"
        if self.partial:
            said += "; memory.high stays at max, and the rest of the tuning is applied"
        return said


def _gib(value: Decimal | int) -> str:
    return f"{Decimal(value) / 2**30:.2f}Gi"


def _at_most(value: Decimal | int) -> str:
    """`value` as a quantity no larger than it, to write into the spec: a rounded 1.93Gi was
    above the 1.9297Gi it stood for, and refused in turn."""
    mib = int(value) // 2**20
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def _at_least(value: Decimal | int) -> str:
    """`value` as a quantity no smaller than it, to write into the spec."""
    mib = -(-int(value) // 2**20)
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def resolve_memory_high(
    spec: MemorySpec, *, request: str | None, limit: str | None
) -> MemoryHigh:
    """memory.high in bytes for a container with these memory resources, or MemoryHighError."""
    limit_bytes = parse_quantity(limit) if limit is not None else None
    request_bytes = parse_quantity(request) if request is not None else Decimal(0)
    headroom = spec.min_headroom.value
    if spec.high is not None:
        value, field, how = spec.high.value, "memory.high", str(spec.high)
    elif spec.high_ratio is not None:
        if limit_bytes is None:
            raise MemoryHighError("memory.highRatio", "the container has no memory limit to take "
                                  "a ratio of; set resources.limits.memory or use memory.high")
        value, field = limit_bytes * Decimal(str(spec.high_ratio)), "memory.highRatio"
        how = f"{spec.high_ratio} x limit {limit} = {_gib(int(value))}"
    else:
        return _default_memory_high(spec, request_bytes, limit_bytes, limit)
    value = Decimal(int(value))
    if value < MIN_MEMORY_HIGH:
        raise MemoryHighError(field, f"{how} is below {_at_most(MIN_MEMORY_HIGH)}, which would "
                              "throttle the server from its first allocation; use a quantity "
                              "such as 28Gi, or leave memory.high unset")
    if limit_bytes is not None and limit_bytes - headroom < MIN_MEMORY_HIGH:
        raise MemoryHighError(field, f"the memory limit {limit} leaves no room for memory.high "
                              f"below it by minHeadroom {spec.min_headroom}; raise the limit, "
                              "lower memory.minHeadroom, or leave memory.high unset")
    if limit_bytes is not None and value > limit_bytes - headroom:
        raise MemoryHighError(field, f"{how} is above the memory limit {limit} minus minHeadroom "
                              f"{spec.min_headroom}, so the OOM killer could act before "
                              f"throttling; use at most {_at_most(limit_bytes - headroom)}")
    # Below the request only matters for Burstable pods: a Guaranteed pod (request == limit)
    # can only get headroom by throttling under its request, which is the point.
    burstable = request is not None and (limit_bytes is None or request_bytes < limit_bytes)
    if burstable and value < request_bytes:
        raise MemoryHighError(field, f"{how} is below the container's memory "
                              f"request {request}, so it would be throttled while using what it "
                              "asked for; raise it above the request")
    floor = None if limit_bytes is None else DEFAULT_FLOOR_OF_LIMIT * limit_bytes
    if not burstable and floor is not None and value < floor:
        # Partial: an earlier release applied such a value, and refusing the whole patch on
        # an upgrade took the binding and the allocator from new pods too.
        raise MemoryHighError(field, f"{how} is under half the memory limit {limit}, which the "
                              "container requests whole, so it would be throttled far below "
                              f"what it was given (the incident's 64M); use at least "
                              f"{_at_least(floor)}, or lower the memory limit instead",
                              partial=True)
    warning = None
    if floor is not None and value < floor:
        # Burstable: taken (the request is what it must stay above), but a value far under
        # what the container may use is the incident's, and nothing else said so.
        warning = (f"spec.{field}: {how} is under half the memory limit {limit}: the "
                   "container is throttled from there on (reclaim stalls, as the incident's "
                   "64M did), far below what it may use; applied as set: raise it, or leave "
                   "memory.high unset for the MemoryQoS default")
    return MemoryHigh(_pages(value), f"memory.high {how}", warning)


def _default_memory_high(
    spec: MemorySpec, request_bytes: Decimal, limit_bytes: Decimal | None, limit: str | None
) -> MemoryHigh:
    if limit_bytes is None:
        return MemoryHigh(None, "no memory limit: memory.high stays at max")
    # kubelet MemoryQoS (KEP-2570): requests + factor * (limit - requests).
    factor = Decimal(str(spec.throttling_factor))
    formula = request_bytes + factor * (limit_bytes - request_bytes)
    ceiling = limit_bytes - spec.min_headroom.value
    how = f"MemoryQoS formula with factor {spec.throttling_factor}"
    if ceiling < MIN_MEMORY_HIGH or formula < MIN_MEMORY_HIGH:
        # A small limit (512Mi with the default 1Gi headroom gave a negative memory.high).
        return MemoryHigh(None, f"limit {limit} leaves no useful memory.high below it by "
                          f"minHeadroom {spec.min_headroom}: memory.high stays at max")
    if formula <= ceiling:
        return MemoryHigh(_pages(formula), f"{how} = {_gib(formula)}")
    if ceiling < DEFAULT_FLOOR_OF_LIMIT * limit_bytes:
        return MemoryHigh(None, f"limit {limit} minus minHeadroom {spec.min_headroom} is "
                          f"{_gib(ceiling)}, under half the limit, which would throttle the "
                          "server far below what it was given: memory.high stays at max; "
                          "set memory.high, or a smaller memory.minHeadroom, to have one")
    if request_bytes < limit_bytes and ceiling <= request_bytes:
        # Throttling below the request would punish the container for using what it asked for.
        return MemoryHigh(None, f"limit {limit} leaves no minHeadroom {spec.min_headroom} above "
                          "the request: memory.high stays at max")
    return MemoryHigh(_pages(ceiling), f"{how} gives {_gib(formula)}, capped at limit {limit} "
                      f"minus minHeadroom {spec.min_headroom} = {_gib(ceiling)}")
