"""Specs are validated once per tuning generation, and an invalid one is not retried."""

from __future__ import annotations

from typing import Any

from infertune.controller.spec_cache import SpecCache

SPEC: dict[str, Any] = {"targetRef": {"name": "qwen"}, "engine": "vllm"}


def test_a_spec_is_validated_once_per_generation() -> None:
    cache = SpecCache()
    first = cache.get("u1", 1, SPEC)
    assert first is not None and first.target_ref.name == "qwen"
    assert cache.get("u1", 1, SPEC) is first and cache.validations == 1
    changed = cache.get("u1", 2, {**SPEC, "targetRef": {"name": "llama"}})
    assert changed is not None and changed.target_ref.name == "llama"
    assert cache.validations == 2


def test_an_invalid_spec_is_none_and_remembered_as_such() -> None:
    cache = SpecCache()
    bad = {**SPEC, "engine": "no-such-engine"}
    assert cache.get("u1", 1, bad) is None
    assert cache.get("u1", 1, bad) is None and cache.validations == 1


def test_without_uid_or_generation_nothing_is_cached() -> None:
    cache = SpecCache()
    assert cache.get("", 1, SPEC) is not None and cache.get("u1", 0, SPEC) is not None
    assert cache.validations == 0


def test_the_least_recently_used_spec_goes_first() -> None:
    cache = SpecCache(size=2)
    cache.get("a", 1, SPEC)
    cache.get("b", 1, SPEC)
    cache.get("a", 1, SPEC)  # used again: b is now the oldest
    cache.get("c", 1, SPEC)
    assert cache.validations == 3
    cache.get("a", 1, SPEC)
    assert cache.validations == 3
    cache.get("b", 1, SPEC)
    assert cache.validations == 4


def test_the_applied_spec_stands_in_only_for_a_later_generation() -> None:
    """status.appliedSpec is the newest valid generation: one at or past the stored spec's
    own generation is not an earlier valid one to fall back on."""
    from infertune.controller.spec_cache import applied_spec

    valid = {"targetRef": {"name": "qwen"}, "engine": "vllm"}
    # Fresh uids: nothing is in the cache for them, so only the rule decides.
    assert applied_spec({"generation": 4, "spec": valid}, 4, "applied-same") is None
    assert applied_spec({"generation": 5, "spec": valid}, 4, "applied-newer") is None
    got = applied_spec({"generation": 3, "spec": valid}, 4, "applied-older")
    assert got is not None and got[0] == 3 and got[1].target_ref.name == "qwen"
    assert applied_spec({"generation": 3, "spec": {"engine": "vllm"}}, 4, "bad") is None
    assert applied_spec({"generation": "x"}, 4, "malformed") is None
    assert applied_spec(None, 4, "none") is None
