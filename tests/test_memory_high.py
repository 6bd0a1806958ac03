"""memory.high resolution against the container's memory request and limit."""

from __future__ import annotations

import pytest

from infertune.api.tuning import MemorySpec
from infertune.api.units import parse_quantity
from infertune.tuning.memory import MemoryHighError, resolve_memory_high

GI = 2**30


@pytest.mark.parametrize(
    ("spec", "mem_request", "limit", "expected"),
    [
        # kubelet MemoryQoS: 16Gi + 0.9 * (32Gi - 16Gi) = 30.4Gi, floored to a 4 KiB page as
        # the formula (KEP-2570) and the kernel do: the cgroup reads back whole pages.
        ({}, "16Gi", "32Gi", int(30.4 * GI) // 4096 * 4096),
        ({"highRatio": 0.33}, "1Gi", "10Gi", 3543348019 // 4096 * 4096),  # 0.33 x 10Gi
        # Guaranteed: the formula gives the limit itself, so it is capped at limit - headroom.
        ({}, "32Gi", "32Gi", 31 * GI),
        ({"minHeadroom": "2Gi"}, "32Gi", "32Gi", 30 * GI),
        ({}, None, None, None),
        ({"high": "28Gi"}, "32Gi", "32Gi", 28 * GI),
        ({"highRatio": 0.5}, "8Gi", "32Gi", 16 * GI),
        # Burstable with no room between request and limit - headroom: leave it at max.
        ({}, "31.5Gi", "32Gi", None),
        # A limit at or under minHeadroom: no memory.high fits below it (this wrote -512Mi and
        # 0 for Guaranteed pods of 512Mi and 1Gi: throttled from the start).
        ({}, "512Mi", "512Mi", None),
        ({}, "1Gi", "1Gi", None),
        ({}, None, "1Gi", None),
        # minHeadroom would take most of a small limit: 76Mi of 1100Mi throttles the server
        # far below what it was given (the incident's 64M). Half the limit is the floor.
        ({}, "1Mi", "1100Mi", None),
        ({}, "1100Mi", "1100Mi", None),
        ({}, "1536Mi", "1536Mi", None),
        ({}, "2Gi", "2Gi", GI),
        ({}, "8Gi", "8Gi", 7 * GI),
        ({}, "1Gi", "4Gi", 3 * GI),  # Burstable, capped above its request
        ({"minHeadroom": "128Mi"}, "1100Mi", "1100Mi", 972 * 2**20),
        # Set in the spec: half the limit is the least a container that requests it all
        # takes; a Burstable one only has to stay above its request.
        ({"high": "16Gi"}, "32Gi", "32Gi", 16 * GI),
        ({"high": "2Gi"}, "1Gi", "32Gi", 2 * GI),
    ],
)
def test_resolved_values(spec: dict[str, object], mem_request: str | None, limit: str | None,
                         expected: int | None) -> None:
    assert resolve_memory_high(MemorySpec.model_validate(spec), request=mem_request,
                               limit=limit).value == expected


@pytest.mark.parametrize(("high", "mem_request", "warned"), [
    ("64Mi", "64Mi", True),  # the incident's, on a container that asks for 64Mi of 32Gi
    ("15Gi", "1Gi", True),
    ("16Gi", "1Gi", False),  # half the limit
    ("20Gi", "8Gi", False),
])
def test_a_burstable_memory_high_under_half_its_limit_is_applied_and_said(
        high: str, mem_request: str, warned: bool) -> None:
    """Above its request, a Burstable container's memory.high is taken; under half its
    limit it throttles the server far below what it may use, and nothing said so."""
    got = resolve_memory_high(MemorySpec.model_validate({"high": high}), request=mem_request,
                              limit="32Gi")
    assert got.value == parse_quantity(high)
    assert (got.warning is not None) is warned
    if warned:
        assert got.warning is not None and got.warning.startswith(
            f"spec.memory.high: {high} is under half the memory limit 32Gi")


@pytest.mark.parametrize(
    ("spec", "mem_request", "limit", "field", "message"),
    [
        ({"high": "32Gi"}, "32Gi", "32Gi", "memory.high", "use at most 31Gi"),
        ({"highRatio": 0.99}, "8Gi", "32Gi", "memory.highRatio", "minus minHeadroom 1Gi"),
        ({"highRatio": 0.9}, None, None, "memory.highRatio", "no memory limit"),
        ({"high": "4Gi"}, "8Gi", "32Gi", "memory.high", "below the container's memory request"),
        ({"high": "256Mi"}, "512Mi", "512Mi", "memory.high",
         "the memory limit 512Mi leaves no room"),
        # The incident's setting, on a container that requests 32Gi: it was taken.
        ({"high": "64Mi"}, "32Gi", "32Gi", "memory.high",
         "64Mi is under half the memory limit 32Gi, which the container requests whole"),
        ({"highRatio": 0.01}, None, "32Gi", "memory.highRatio", "use at least 16Gi, or lower "
         "the memory limit instead"),
    ],
)
def test_refused_values_name_the_field(spec: dict[str, object], mem_request: str | None,
                                       limit: str | None, field: str, message: str) -> None:
    with pytest.raises(MemoryHighError) as info:
        resolve_memory_high(MemorySpec.model_validate(spec), request=mem_request, limit=limit)
    assert info.value.field == field
    assert message in info.value.message


@pytest.mark.parametrize(("limit", "suggested"), [("3000Mi", "1976Mi"), ("3000.5Mi", "1976Mi")])
def test_the_value_an_error_suggests_is_accepted(limit: str, suggested: str) -> None:
    """"use at most 1.93Gi" for 1976Mi: rounded up, the suggestion was refused in turn."""
    with pytest.raises(MemoryHighError, match=f"use at most {suggested}$"):
        resolve_memory_high(MemorySpec.model_validate({"high": limit}), request=None,
                            limit=limit)
    value = resolve_memory_high(MemorySpec.model_validate({"high": suggested}), request=None,
                                limit=limit).value
    assert value is not None and value <= parse_quantity(limit) - GI
    with pytest.raises(MemoryHighError, match="is below 64Mi"):
        resolve_memory_high(MemorySpec.model_validate({"highRatio": 0.01}), request=None,
                            limit=limit)


def test_the_least_value_an_error_suggests_is_accepted() -> None:
    with pytest.raises(MemoryHighError, match="use at least 1501Mi, or lower"):
        resolve_memory_high(MemorySpec.model_validate({"high": "1Gi"}), request=None,
                            limit="3001Mi")
    assert resolve_memory_high(MemorySpec.model_validate({"high": "1501Mi"}), request=None,
                               limit="3001Mi").value == 1501 * 2**20
