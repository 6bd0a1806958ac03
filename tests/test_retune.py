"""Re-tuning picks outdated pods to evict without taking more than maxUnavailable down."""

from __future__ import annotations

from infertune.tuning.retune import PodView, plan_retune


def _pods(*specs: tuple[str, str | None, bool]) -> list[PodView]:
    return [PodView(name, revision, ready) for name, revision, ready in specs]


def test_nothing_to_do_when_every_pod_is_current() -> None:
    step = plan_retune("r2", _pods(("a", "r2", True), ("b", "r2", True)), 1)
    assert step.evict == () and (step.tuned, step.outdated) == (2, 0)


def test_one_ready_outdated_pod_at_a_time() -> None:
    step = plan_retune("r2", _pods(("a", "r1", True), ("b", None, True), ("c", "r2", True)), 1)
    assert step.evict == ("a",) and step.outdated == 2


def test_waits_while_a_replacement_is_not_ready() -> None:
    step = plan_retune("r2", _pods(("a", "r1", True), ("b", "r2", False)), 1)
    assert step.evict == () and "waiting" in step.reason


def test_terminating_pods_count_as_unavailable_and_are_not_evicted_again() -> None:
    pods = [PodView("a", "r1", True, terminating=True), PodView("b", "r1", True)]
    assert plan_retune("r2", pods, 1).evict == ()


def test_unready_outdated_pods_go_first_and_cost_no_budget() -> None:
    step = plan_retune("r2", _pods(("a", "r1", True), ("b", "r1", False)), 1)
    assert step.evict == ("b",)


def test_max_unavailable_allows_several() -> None:
    step = plan_retune("r2", _pods(("a", "r1", True), ("b", "r1", True), ("c", "r1", True)), 2)
    assert step.evict == ("a", "b")


def test_eviction_pauses_when_a_replacement_comes_back_untuned() -> None:
    pods = [PodView("old", None, True, created="2026-12-03T10:00:00Z"),
            PodView("new", None, True, created="2026-12-03T10:05:01Z")]
    step = plan_retune("r2", pods, 1, last_eviction="2026-12-03T10:05:00Z")
    assert step.evict == () and "webhook did not tune" in step.reason
    assert plan_retune("r2", pods, 1).evict == ("new",)
