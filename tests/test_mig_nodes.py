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


OTHER = "infertune-h200-7x1g.18gb"


def _claimed(name: str, by: str, state: str = "success") -> NodeView:
    node = _node(name, config=OTHER, state=state)
    return NodeView(node.name, node.labels, claimed_by=by)


def test_a_node_another_live_tuning_claimed_is_left_to_it() -> None:
    """Two tunings selecting the same node with different layouts relabelled it back and
    forth (draining each other's pods with allowDisruption); the first to label it keeps it."""
    step = plan_mig_nodes([_claimed("a", "ml/big"), _node("b")], CONFIGS,
                          allow_disruption=True, labelled_at={}, now=100.0, owner="ml/small",
                          exists=lambda claimant: claimant == "ml/big")
    assert (step.kind, step.node) == (StepKind.LABEL, "b")  # the free node goes on
    claimed = step.reports[0]
    assert (claimed.node, claimed.state) == ("a", NodeState.CLAIMED)
    assert "InferenceTuning ml/big" in claimed.message
    only = plan_mig_nodes([_claimed("a", "ml/big")], CONFIGS, allow_disruption=True,
                          labelled_at={}, now=100.0, owner="ml/small", exists=lambda c: True)
    assert only.kind is StepKind.NONE and "claimed by another tuning" in only.reason


def test_a_claim_lapses_with_its_tuning_and_never_binds_its_owner() -> None:
    gone = plan_mig_nodes([_claimed("a", "ml/big")], CONFIGS, allow_disruption=False,
                          labelled_at={}, now=100.0, owner="ml/small", exists=lambda c: False)
    assert (gone.kind, gone.node) == (StepKind.LABEL, "a")
    mine = plan_mig_nodes([_claimed("a", "ml/small")], CONFIGS, allow_disruption=False,
                          labelled_at={}, now=100.0, owner="ml/small", exists=lambda c: True)
    assert (mine.kind, mine.node) == (StepKind.LABEL, "a")  # its own spec changed


def test_a_node_mig_manager_is_reconfiguring_is_not_relabelled_meanwhile() -> None:
    step = _plan([_node("a", config=OTHER, state="rebooting"), _node("b")])
    assert step.kind is StepKind.NONE
    assert step.reports[0].state is NodeState.WAITING
    assert "mig-manager is applying" in step.reports[0].message


def test_the_mig_manager_timeout_survives_an_operator_restart() -> None:
    """The time a node was labelled is kept on the node: a restarted operator (its memory
    empty) still sees a node stuck in pending time out, instead of waiting on it for good."""
    labelled = _node("a", config=CONFIGS["NVIDIA-H200"], state="pending")
    stuck = NodeView(labelled.name, labelled.labels, labelled_at=100.0)
    step = plan_mig_nodes([stuck], CONFIGS, allow_disruption=False, labelled_at={},
                          now=100.0 + 901)
    assert step.reports[0].state is NodeState.TIMED_OUT
    fresh = plan_mig_nodes([stuck], CONFIGS, allow_disruption=False, labelled_at={},
                           now=100.0 + 60)
    assert fresh.reports[0].state is NodeState.PENDING
