"""Partitioning nodes through mig-manager: one node at a time, busy nodes left alone."""

from __future__ import annotations

from infertune.tuning.mig_nodes import (
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    MigNodeStep,
    NodeState,
    NodeView,
    StepKind,
    plan_mig_nodes,
    select_nodes,
)

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/mig.capable": "true"}
CONFIGS = {"NVIDIA-H200": "infertune-h200-2x3g.71gb"}


def _node(name: str, *, config: str | None = None, state: str | None = None,
          pods: tuple[str, ...] = (), **labels: str) -> NodeView:
    all_labels = {**H200, **labels}
    if config:
        all_labels[MIG_CONFIG_LABEL] = config
    if state:
        all_labels[MIG_STATE_LABEL] = state
    return NodeView(name, all_labels, gpu_pods=pods)


def _plan(nodes: list[NodeView], allow: bool = False, labelled_at: dict[str, float] | None = None,
          now: float = 100.0) -> MigNodeStep:
    return plan_mig_nodes(nodes, CONFIGS, allow_disruption=allow, labelled_at=labelled_at or {},
                          now=now)


def test_selection_needs_product_capability_and_selector() -> None:
    nodes = [_node("a", pool="x"), _node("b", pool="y"),
             NodeView("c", {"nvidia.com/gpu.product": "NVIDIA-H200",
                            "nvidia.com/mig.capable": "false", "pool": "x"}),
             NodeView("d", {"nvidia.com/gpu.product": "NVIDIA-L4", "pool": "x"})]
    assert [n.name for n in select_nodes(nodes, ["NVIDIA-H200"], {"pool": "x"})] == ["a"]


def test_labels_one_node_at_a_time() -> None:
    step = _plan([_node("a"), _node("b")])
    assert (step.kind, step.node) == (StepKind.LABEL, "a")
    assert [r.state for r in step.reports] == [NodeState.PENDING, NodeState.WAITING]


def test_waits_for_mig_manager_before_the_next_node() -> None:
    step = _plan([_node("a", config=CONFIGS["NVIDIA-H200"], state="pending"), _node("b")])
    assert step.kind is StepKind.NONE and "waiting for mig-manager" in step.reason


def test_moves_on_after_success() -> None:
    step = _plan([_node("a", config=CONFIGS["NVIDIA-H200"], state="success"), _node("b")])
    assert (step.kind, step.node) == (StepKind.LABEL, "b")


def test_failure_stops_the_rollout() -> None:
    step = _plan([_node("a", config=CONFIGS["NVIDIA-H200"], state="failed"), _node("b")])
    assert step.kind is StepKind.NONE
    assert {r.node: r.state for r in step.reports} == {"a": NodeState.FAILED,
                                                       "b": NodeState.WAITING}


def test_times_out_without_an_answer() -> None:
    step = _plan([_node("a", config=CONFIGS["NVIDIA-H200"], state="pending")],
                 labelled_at={"a": 0.0}, now=10_000.0)
    assert step.reports[0].state is NodeState.TIMED_OUT


def test_busy_node_is_never_relabelled_without_opt_in() -> None:
    step = _plan([_node("a", pods=("vllm-0",)), _node("b")])
    assert (step.kind, step.node) == (StepKind.LABEL, "b")
    assert step.reports[0].state is NodeState.BUSY
    assert "allowDisruption" in step.reports[0].message


def test_busy_node_is_drained_first_with_opt_in() -> None:
    step = _plan([_node("a", pods=("vllm-0",))], allow=True)
    assert (step.kind, step.node) == (StepKind.DRAIN, "a")


def test_nothing_selected_is_explained() -> None:
    assert "no node matches" in _plan([]).reason
