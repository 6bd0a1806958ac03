"""Partitioning nodes through mig-manager: one node at a time, busy nodes left alone."""

from __future__ import annotations

import pytest

from infertune.tuning.mig_nodes import (
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    MigNodeStep,
    NodeState,
    NodeView,
    Release,
    StepKind,
    cordons_to_release,
    drain_report,
    partitioned_after_drain,
    plan_mig_nodes,
    select_nodes,
    unsettled_cordons,
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


def test_no_node_is_labelled_before_mig_managers_copy_of_the_config_map_has_the_config(
) -> None:
    """mig-manager reads the ConfigMap through a volume the kubelet updates a minute late: a
    node labelled for a config its copy lacks went to failed, for good."""
    config = CONFIGS["NVIDIA-H200"]
    waiting = plan_mig_nodes([_node("a"), _node("b")], CONFIGS, allow_disruption=False,
                             labelled_at={}, now=100.0, config_ready_at={config: 220.0})
    assert waiting.kind is StepKind.NONE
    assert [(r.node, r.state) for r in waiting.reports] == [("a", NodeState.WAITING),
                                                            ("b", NodeState.WAITING)]
    assert "labelled for infertune-h200-2x3g.71gb from 1970-01-01T00:03:40Z" in \
        waiting.reason
    ready = plan_mig_nodes([_node("a"), _node("b")], CONFIGS, allow_disruption=False,
                           labelled_at={}, now=220.0, config_ready_at={config: 220.0})
    assert (ready.kind, ready.node) == (StepKind.LABEL, "a")
    # A drain does not wait: it does not name the config.
    busy = plan_mig_nodes([_node("a", pods=("ns/p",))], CONFIGS, allow_disruption=True,
                          labelled_at={}, now=100.0, config_ready_at={config: 220.0})
    assert (busy.kind, busy.node) == (StepKind.DRAIN, "a")


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
    assert "stays cordoned" not in step.reports[0].message
    # Drained for it: the report says the node stays cordoned, as a failed one's does.
    drained = _drained("a", "ml/qwen", config=CONFIGS["NVIDIA-H200"], state="pending")
    late = _plan([drained], labelled_at={"a": 0.0}, now=10_000.0)
    assert late.reports[0].state is NodeState.TIMED_OUT
    assert "it stays cordoned (infertune drained it): kubectl uncordon it" in \
        late.reports[0].message


def test_busy_node_is_never_relabelled_without_opt_in() -> None:
    step = _plan([_node("a", pods=("vllm-0",)), _node("b")])
    assert (step.kind, step.node) == (StepKind.LABEL, "b")
    assert step.reports[0].state is NodeState.BUSY
    assert "allowDisruption" in step.reports[0].message


def test_busy_node_is_drained_first_with_opt_in() -> None:
    step = _plan([_node("a", pods=("vllm-0",))], allow=True)
    assert (step.kind, step.node) == (StepKind.DRAIN, "a")


def test_an_idle_node_is_labelled_before_any_drain_starts_or_goes_on() -> None:
    """A busy node earlier in name order took the one step, and the idle nodes after it
    waited for its drain, which a PodDisruptionBudget may hold up for good."""
    config = CONFIGS["NVIDIA-H200"]
    busy = _node("a", pods=("ml/busy-1",))
    first = _plan([busy, _node("b")], allow=True)
    assert (first.kind, first.node) == (StepKind.LABEL, "b")
    assert [(r.node, r.state, r.message) for r in first.reports] == [
        ("a", NodeState.WAITING, "waits for b"),
        ("b", NodeState.PENDING, f"labelled for {config}")]
    # A drain under way waits too, and says its node stays cordoned meanwhile.
    draining = _drained("a", "ml/qwen", pods=("ml/busy-1",))
    assert (_plan([draining, _node("b")], allow=True).node) == "b"
    applying = _plan([draining, _node("b", config=config, state="pending")], allow=True)
    assert applying.kind is StepKind.NONE  # still one node at a time
    assert applying.reports[0].message == ("waits for b (pending); cordoned for its drain, "
                                           "which goes on after")
    done = _plan([draining, _node("b", config=config, state="success")], allow=True)
    assert (done.kind, done.node) == (StepKind.DRAIN, "a")


def test_a_drain_under_way_goes_on_before_another_starts() -> None:
    """Switched to a busy node earlier in name order, the first stayed cordoned, half
    drained, beside the second: two nodes out of service."""
    step = _plan([_node("a", pods=("ml/busy-1",)),
                  _drained("b", "ml/qwen", pods=("ml/busy-2",))], allow=True)
    assert (step.kind, step.node) == (StepKind.DRAIN, "b")
    assert [r.node for r in step.reports] == ["a", "b"]  # reported in the nodes' order
    # A node its drain emptied (cordoned, no GPU pods left) is labelled before idle ones.
    emptied = _plan([_node("a"), _drained("b", "ml/qwen")], allow=True)
    assert (emptied.kind, emptied.node) == (StepKind.LABEL, "b")


def test_a_busy_node_is_reported_busy_and_released_whichever_node_takes_the_step() -> None:
    """A busy node after the labelled one in name order read "waits for" where it never
    would be partitioned, and its drain, no longer allowed, was not undone meanwhile."""
    node = _drained("b", "ml/qwen", pods=("ml/busy-1",))
    step = _plan([_node("a"), node], allow=False)
    assert (step.kind, step.node) == (StepKind.LABEL, "a")
    assert step.reports[1].state is NodeState.BUSY
    assert list(_released([_node("a"), node], allow=False)) == ["b"]


def test_a_drain_a_budget_holds_up_says_so() -> None:
    """"cordoned and draining" read the same for ever when a PodDisruptionBudget refused
    every eviction."""
    report = _plan([_node("a", pods=("ml/p-1", "ml/p-2"))], allow=True).reports[0]
    assert drain_report(report, ()) == report
    held = drain_report(report, ("ml/p-2",))
    assert held.state is NodeState.DRAINING
    assert held.message == (
        f"cordoned and draining 2 GPU pods before {CONFIGS['NVIDIA-H200']}; a "
        "PodDisruptionBudget refused the eviction of 1 of them (ml/p-2), asked again every "
        "pass: the drain goes on once the budget allows it (more ready replicas elsewhere, "
        "or a looser budget); turn spec.mig.allowDisruption off to stop the drain and "
        "uncordon the node")
    many = drain_report(report, tuple(f"ml/p-{i}" for i in range(5)))
    assert "5 of them (ml/p-0, ml/p-1, ml/p-2, ...)" in many.message
    failed = drain_report(report, ("ml/p-2",), ("ml/p-1 (500: This pod has more than one "
                                                "PodDisruptionBudget)",))
    assert failed.message == (
        f"cordoned and draining 2 GPU pods before {CONFIGS['NVIDIA-H200']}; a "
        "PodDisruptionBudget refused the eviction of 1 of them (ml/p-2), asked again every "
        "pass: the drain goes on once the budget allows it (more ready replicas elsewhere, "
        "or a looser budget); the Eviction API failed for 1 of them (ml/p-1 (500: This pod "
        "has more than one PodDisruptionBudget)), asked again every pass; turn "
        "spec.mig.allowDisruption off to stop the drain and uncordon the node")


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


def test_a_claim_lapses_when_its_tuning_no_longer_selects_the_node() -> None:
    """ml/big's nodeSelector moved to another pool: its claim held for as long as it
    existed, and ml/small was told, falsely, that ml/big "selects it too"."""
    node = _claimed("a", "ml/big")

    def plan(still_selects: bool) -> MigNodeStep:
        return plan_mig_nodes([node], CONFIGS, allow_disruption=False, labelled_at={},
                              now=100.0, owner="ml/small", exists=lambda c: True,
                              holds=lambda tuning, n: still_selects)

    assert plan(True).reports[0].state is NodeState.CLAIMED
    moved = plan(False)
    assert (moved.kind, moved.node) == (StepKind.LABEL, "a")


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


def test_a_node_labelled_and_not_answered_yet_is_not_relabelled() -> None:
    """mig-manager checks a new label for seconds before it says pending: relabelled then
    (a spec change, or another tuning after the claimant went), its run for the old config
    ended with success under the new label, read as the new layout applied."""
    labelled = _node("a", config=OTHER)
    asked = NodeView(labelled.name, labelled.labels, labelled_at=100.0, claimed_by="ml/qwen")
    step = plan_mig_nodes([asked], CONFIGS, allow_disruption=False, labelled_at={},
                          now=130.0, owner="ml/qwen")
    assert step.kind is StepKind.NONE and step.reports[0].state is NodeState.WAITING
    assert "which mig-manager has not answered yet" in step.reports[0].message
    # Not answered for the whole timeout: mig-manager is not coming, the node may be asked.
    late = plan_mig_nodes([asked], CONFIGS, allow_disruption=False, labelled_at={},
                          now=100.0 + 901, owner="ml/qwen")
    assert (late.kind, late.node) == (StepKind.LABEL, "a")
    # Answered (success for it): relabelled at once, as before.
    done = NodeView("a", {**labelled.labels, MIG_STATE_LABEL: "success"}, labelled_at=100.0,
                    claimed_by="ml/qwen")
    assert plan_mig_nodes([done], CONFIGS, allow_disruption=False, labelled_at={},
                          now=130.0, owner="ml/qwen").kind is StepKind.LABEL


def test_the_newer_label_time_counts_when_another_leader_labelled_since() -> None:
    """This process's own time, from before it lost the lease, beat the node's annotation
    of the newer label: timed out while mig-manager was rebooting the node."""
    labelled = _node("a", config=CONFIGS["NVIDIA-H200"], state="rebooting")
    node = NodeView(labelled.name, labelled.labels, labelled_at=10_000.0 - 60)
    step = plan_mig_nodes([node], CONFIGS, allow_disruption=False,
                          labelled_at={"a": 10_000.0 - 3600}, now=10_000.0)
    assert step.reports[0].state is NodeState.PENDING


def _drained(name: str, cordoned_for: str, *, config: str | None = None,
             state: str | None = None, pods: tuple[str, ...] = (),
             claimed_by: str | None = None) -> NodeView:
    node = _node(name, config=config, state=state, pods=pods)
    return NodeView(node.name, node.labels, unschedulable=True, gpu_pods=node.gpu_pods,
                    claimed_by=claimed_by, cordoned_for=cordoned_for)


def _released(nodes: list[NodeView], *, owner: str = "ml/qwen", allow: bool = True,
              selected: list[str] | None = None, live: frozenset[str] = frozenset(),
              ) -> dict[str, str]:
    """What a pass of `owner` releases, with `selected` the nodes its spec selects (all of
    them by default) and `live` the other tunings that exist."""
    chosen = [n for n in nodes if selected is None or n.name in selected]
    step = plan_mig_nodes(chosen, CONFIGS, allow_disruption=allow, labelled_at={}, now=100.0,
                          owner=owner, exists=lambda c: c in live)
    return {r.node: r.message for r in cordons_to_release(nodes, step.reports, owner=owner,
                                                          exists=lambda c: c in live)}


def test_a_node_drained_for_a_tuning_that_no_longer_selects_it_is_uncordoned() -> None:
    """A drained node stayed cordoned for good once its tuning stopped selecting it (a new
    nodeSelector) before mig-manager partitioned it: only success uncordoned it."""
    released = _released([_drained("a", "ml/qwen", pods=("ml/busy-1",)), _node("b")],
                         selected=["b"])
    assert list(released) == ["a"]
    assert released["a"] == ("a uncordoned: drained for ml/qwen, and spec.mig no longer "
                             "selects it")
    # Partitioned for someone else since (success), and not selected: released too.
    assert list(_released([_drained("a", "ml/qwen", config=OTHER, state="success")],
                          selected=[])) == ["a"]


@pytest.mark.parametrize("state", [None, "pending", "rebooting", "failed"])
def test_a_node_mig_manager_has_not_settled_stays_cordoned(state: str | None) -> None:
    """Labelled and not answered yet (mig-manager may start any moment), at work, or failed
    (the report asks a person to look): whether the tuning still selects it or not."""
    for selected in (None, []):
        labelled = _drained("a", "ml/qwen", config=CONFIGS["NVIDIA-H200"], state=state)
        assert _released([labelled], selected=selected) == {}
        other = _drained("a", "ml/qwen", config=OTHER, state=state)
        assert _released([other], selected=selected) == {}
    gone = _drained("a", "ml/gone", config=OTHER, state=state)
    assert _released([gone], selected=[]) == {}  # nor a deleted tuning's, by another pass
    assert unsettled_cordons([labelled, _drained("b", "ml/qwen")], "ml/qwen") == [
        ("a", f"a stays cordoned: drained for ml/qwen, and mig-manager has not reported "
              f"success for {CONFIGS['NVIDIA-H200']} (state {state or 'unset'}); the "
              "operator uncordons it when nvidia.com/mig.config.state turns to success, or "
              "when the config label is removed (kubectl uncordon it if mig-manager failed "
              "for good)")]


def test_a_node_being_drained_for_its_tuning_stays_cordoned() -> None:
    assert _released([_drained("a", "ml/qwen", pods=("ml/busy-1",))]) == {}


def test_success_uncordons_through_its_own_path_only() -> None:
    config = CONFIGS["NVIDIA-H200"]
    node = _drained("a", "ml/qwen", config=config, state="success")
    step = plan_mig_nodes([node], CONFIGS, allow_disruption=True, labelled_at={}, now=100.0)
    assert partitioned_after_drain([node], step.reports) == [node]
    # One someone uncordoned meanwhile only loses its mark (`cordons_to_release`).
    uncordoned = NodeView(node.name, node.labels, False, cordoned_for="ml/qwen")
    assert partitioned_after_drain([uncordoned], step.reports) == []
    assert _released([node]) == {}  # not twice


def test_a_node_drained_for_another_tuning_is_not_uncordoned_as_configured() -> None:
    """Two tunings share a pool: ml/other drains a node to take it from the config ml/qwen
    wants (and sees as done) to one of its own. ml/qwen's pass uncordoned it as partitioned,
    pods came back, ml/other evicted them again at its next pass, and so on."""
    config = CONFIGS["NVIDIA-H200"]
    node = _drained("a", "ml/other", config=config, state="success", claimed_by="ml/other",
                    pods=("team/vllm-0",))
    step = plan_mig_nodes([node], CONFIGS, allow_disruption=False, labelled_at={}, now=100.0,
                          owner="ml/qwen", exists=lambda t: True)
    assert [r.state for r in step.reports] == [NodeState.CONFIGURED]
    partitioning = {"ml/other", "ml/qwen"}
    assert partitioned_after_drain([node], step.reports, "ml/qwen",
                                   partitioning.__contains__) == []
    # Once ml/other no longer partitions (deleted, spec.mig dropped, DryRun), nobody else
    # finishes its drain: the node is configured as ml/qwen wants, and uncordoned.
    assert partitioned_after_drain([node], step.reports, "ml/qwen",
                                   {"ml/qwen"}.__contains__) == [node]
    # Its own drain, and a mark from a release that named no tuning, as before.
    own = _drained("a", "ml/qwen", config=config, state="success")
    assert partitioned_after_drain([own], step.reports, "ml/qwen",
                                   partitioning.__contains__) == [own]
    legacy = _drained("a", config, config=config, state="success")
    assert partitioned_after_drain([legacy], step.reports, "ml/qwen",
                                   partitioning.__contains__) == [legacy]
    # Drained for ml/other but labelled for (claimed by) ml/qwen: ml/other can never relabel
    # it while that claim holds, so deferring to it kept the node cordoned for good.
    mine = _drained("a", "ml/other", config=config, state="success", claimed_by="ml/qwen")
    claimed = plan_mig_nodes([mine], CONFIGS, allow_disruption=False, labelled_at={},
                             now=100.0, owner="ml/qwen", exists=lambda t: True)
    assert partitioned_after_drain([mine], claimed.reports, "ml/qwen",
                                   partitioning.__contains__) == [mine]


def test_a_drained_node_claimed_by_a_tuning_that_partitions_nothing_is_released() -> None:
    """Drained for ml/qwen, then labelled for ml/c (its config already there), which drops
    spec.mig and still exists: its claim keeps ml/qwen from relabelling the node, it has no
    pass to uncordon it on success, and the node stayed cordoned for good."""
    node = _drained("a", "ml/qwen", config=OTHER, state="success", claimed_by="ml/c")
    step = plan_mig_nodes([node], CONFIGS, allow_disruption=True, labelled_at={}, now=100.0,
                          owner="ml/qwen", exists=lambda t: True)
    assert [r.state for r in step.reports] == [NodeState.CLAIMED]

    def released(partitioning: set[str]) -> list[str]:
        return [r.message for r in cordons_to_release(
            [node], step.reports, owner="ml/qwen", exists=lambda t: True,
            partitions=partitioning.__contains__)]

    assert released({"ml/qwen"}) == [
        "a uncordoned: drained for ml/qwen, and it is labelled for ml/c, which holds it and "
        "partitions nothing now (no valid spec.mig, or DryRun)"]
    # One that partitions uncordons it itself on success.
    assert released({"ml/qwen", "ml/c"}) == []


def test_a_drain_that_allow_disruption_no_longer_allows_is_undone() -> None:
    released = _released([_drained("a", "ml/qwen", pods=("ml/busy-1",))], allow=False)
    assert released["a"] == ("a uncordoned: drained for ml/qwen, and "
                             "spec.mig.allowDisruption is off now, so its GPU pods are not "
                             "evicted")


def test_a_drain_another_namespaces_pods_stop_is_undone_and_says_so() -> None:
    """A node drained for ml/qwen that runs another namespace's GPU pods (one that tolerates
    the cordon, or a drain begun before the upgrade) is released with that reason: it read
    "allowDisruption is off now", which it was not."""
    node = _drained("a", "ml/qwen", pods=("ml/own-1", "other/pod-1"))
    step = plan_mig_nodes([node], CONFIGS, allow_disruption=True, labelled_at={}, now=100.0,
                          owner="ml/qwen", exists=lambda c: False, drains_namespace="ml")
    (release,) = cordons_to_release([node], step.reports, owner="ml/qwen",
                                    exists=lambda c: False)
    assert release.message == ("a uncordoned: drained for ml/qwen, and it runs GPU pods of "
                               "other namespaces, which InferenceTuning ml/qwen does not evict "
                               "(the operator runs without --mig-drain-other-namespaces)")


def test_a_drain_is_undone_when_its_tuning_is_in_dry_run() -> None:
    """DryRun with allowDisruption still on: the node stayed cordoned, drained for a tuning
    that would never finish the drain."""
    why = "InferenceTuning ml/qwen is in DryRun, which would not finish the drain"
    draining = _drained("a", "ml/qwen", pods=("ml/busy-1",))
    emptied = _drained("b", "ml/qwen")  # waits for a
    for dry_run, released in ((False, []), (True, ["a", "b"])):
        step = plan_mig_nodes([draining, emptied], CONFIGS, allow_disruption=True,
                              labelled_at={}, now=100.0, owner="ml/qwen")
        found = cordons_to_release([draining, emptied], step.reports, owner="ml/qwen",
                                   exists=lambda c: True, dry_run=dry_run)
        assert [r.node for r in found] == released
    assert found[0] == Release("a", f"a uncordoned: drained for ml/qwen, and {why}")
    # Another tuning that selects it and partitions takes it over, as when one goes away.
    heir = cordons_to_release([draining], step.reports, owner="ml/qwen",
                              exists=lambda c: True, dry_run=True,
                              successor=lambda n, t: "ml/other")
    assert heir == [Release("a", "a stays cordoned for ml/other, which selects it too: "
                                 f"drained for ml/qwen, and {why}", "ml/other")]
    # Not while mig-manager is at work, nor once it is done (uncordoned on success, once).
    config = CONFIGS["NVIDIA-H200"]
    for state in ("pending", "success"):
        node = _drained("a", "ml/qwen", config=config, state=state)
        step = plan_mig_nodes([node], CONFIGS, allow_disruption=True, labelled_at={},
                              now=100.0, owner="ml/qwen")
        assert cordons_to_release([node], step.reports, owner="ml/qwen",
                                  exists=lambda c: True, dry_run=True) == []


def test_a_drain_for_a_deleted_tuning_is_undone_by_another_tunings_pass() -> None:
    nodes = [_drained("a", "ml/gone"), _drained("b", "ml/other", pods=("ml/busy-1",))]
    released = _released(nodes, selected=[], live=frozenset({"ml/other"}))
    assert list(released) == ["a"]  # b's tuning exists and finishes it
    assert ("InferenceTuning ml/gone, which drained it, no longer exists or no longer has "
            "spec.mig") in released["a"]


def test_a_node_labelled_for_another_live_tuning_is_left_to_it() -> None:
    """Partitioned for ml/big, which selects it too: ml/big's own pass uncordons it on
    success; another pass must not, whoever drained it."""
    for drained_for in ("ml/qwen", "ml/gone"):
        node = _drained("a", drained_for, config=OTHER, state="success", claimed_by="ml/big")
        assert _released([node], selected=[], live=frozenset({"ml/big"})) == {}
        assert _released([node], live=frozenset({"ml/big"})) == {}  # reported claimed
        # Once ml/big is gone too, the node is nobody's: released.
        assert list(_released([node], selected=[])) == ["a"]


def test_a_node_whose_claimant_no_longer_selects_it_is_not_kept_for_it() -> None:
    """ml/big's nodeSelector moved away (its claim lapses): kept cordoned for ml/big, the node
    stayed cordoned for good, as ml/big's pass no longer looks at it."""
    node = _drained("a", "ml/qwen", config=OTHER, state="success", claimed_by="ml/big")
    step = plan_mig_nodes([], CONFIGS, allow_disruption=True, labelled_at={}, now=100.0,
                          owner="ml/qwen")
    kept = cordons_to_release([node], step.reports, owner="ml/qwen",
                              exists=lambda c: c == "ml/big")
    assert kept == []
    moved = cordons_to_release([node], step.reports, owner="ml/qwen",
                               exists=lambda c: c == "ml/big",
                               holds=lambda tuning, n: tuning != "ml/big")
    assert [r.node for r in moved] == ["a"] and "uncordoned" in moved[0].message


def test_a_node_someone_else_cordoned_is_never_uncordoned() -> None:
    """Maintenance cordons carry no annotation; a config name is what releases before the
    tuning's name was kept wrote, and whose tuning that was is not known."""
    maintenance = NodeView("a", _node("a").labels, unschedulable=True)
    legacy = _drained("b", "infertune-h200-2x3g.71gb")
    assert _released([maintenance, legacy], selected=[]) == {}


def test_the_end_of_a_tuning_releases_only_its_own_settled_nodes() -> None:
    nodes = [_drained("a", "ml/qwen", pods=("ml/busy-1",)),
             _drained("b", "ml/qwen", config=OTHER, state="pending"),
             _drained("c", "ml/other")]
    released = cordons_to_release(nodes, (), owner="ml/qwen", exists=lambda _: True,
                                  gone="the tuning was deleted")
    assert released == [Release("a", "a uncordoned: drained for ml/qwen, and the tuning was "
                                     "deleted")]


def test_a_node_another_tuning_selects_is_handed_to_it_not_uncordoned() -> None:
    """Two tunings with the same layout drain the same node; the one that goes away must not
    uncordon it while the other drains it: the other takes the mark and decides."""
    def heir(node: NodeView, drained_for: str) -> str | None:
        return "ml/other" if node.labels.get("pool") == "x" else None

    nodes = [_drained("a", "ml/qwen", pods=("ml/busy-1",)), _drained("b", "ml/qwen")]
    nodes[0] = NodeView("a", {**nodes[0].labels, "pool": "x"}, True, nodes[0].gpu_pods,
                        cordoned_for="ml/qwen")
    released = cordons_to_release(nodes, (), owner="ml/qwen", exists=lambda _: True,
                                  gone="the tuning was deleted", successor=heir)
    assert released == [
        Release("a", "a stays cordoned for ml/other, which selects it too: drained for "
                     "ml/qwen, and the tuning was deleted", "ml/other"),
        Release("b", "b uncordoned: drained for ml/qwen, and the tuning was deleted")]


def test_a_node_someone_uncordoned_loses_only_the_mark_so_a_later_cordon_is_theirs() -> None:
    """`kubectl uncordon` leaves the drain mark: a cordon made later for maintenance carried
    it, and was taken for the operator's and undone when mig-manager reported success."""
    for state in (None, "pending", "success"):  # whether mig-manager is done or not
        uncordoned = NodeView("a", _node("a", config=OTHER, state=state).labels,
                              unschedulable=False, cordoned_for="ml/live", version="7")
        (release,) = cordons_to_release([uncordoned], (), owner="", exists=lambda _: True)
        assert release.mark_only and release.successor is None and release.version == "7"
        assert release.message == ("a was uncordoned, not by the operator: its mark of the "
                                   "drain for ml/live is removed")
    drained = NodeView("b", _node("b").labels, unschedulable=True, cordoned_for="ml/gone",
                       version="9")
    (release,) = cordons_to_release([drained], (), owner="", exists=lambda _: False)
    assert not release.mark_only and release.version == "9"  # only the node as seen


def test_a_drain_lapses_without_spec_mig_but_a_claim_holds_while_its_tuning_exists() -> None:
    """A tuning that dropped spec.mig will not finish its drain, so its node is released; a
    node it claimed stays its own while it exists, so that spec.mig lost for a moment (a
    mistaken apply) does not hand its nodes to another tuning for good."""
    drained = _drained("a", "ml/edited")
    claimed = _drained("b", "ml/gone", config=OTHER, state="success", claimed_by="ml/edited")

    def released(partitions: bool) -> list[str]:
        return [r.node for r in cordons_to_release(
            [drained, claimed], (), owner="ml/qwen", exists=lambda t: t == "ml/edited",
            partitions=lambda t: partitions and t == "ml/edited")]

    assert released(partitions=True) == []
    # b is claimed by a tuning that exists: the claim keeps other tunings from relabelling
    # it (plan_mig_nodes), but that tuning will not uncordon it on success any more.
    assert released(partitions=False) == ["a", "b"]
    assert [r.node for r in cordons_to_release(
        [claimed], (), owner="ml/qwen", exists=lambda t: True,
        partitions=lambda t: t == "ml/edited")] == []  # a claimant that partitions: its own


def test_a_tuning_drains_only_its_own_namespaces_gpu_pods_unless_allowed() -> None:
    """Whoever could create a tuning with allowDisruption could cordon any MIG-capable node
    its selector matched and evict other teams' GPU pods there."""
    mixed = _node("a", pods=("team-a/p", "team-b/q"))
    own = _node("b", pods=("team-a/r",))
    step = plan_mig_nodes([mixed, own], CONFIGS, allow_disruption=True, labelled_at={},
                          now=100.0, drains_namespace="team-a")
    assert (step.kind, step.node) == (StepKind.DRAIN, "b")
    (report,) = [r for r in step.reports if r.node == "a"]
    assert report.state is NodeState.BUSY
    assert report.message.startswith("runs GPU pods of other namespaces (1); not "
                                     "drained: a tuning evicts only its own namespace's pods "
                                     "(team-a) unless the operator runs with "
                                     "--mig-drain-other-namespaces")
    # team-a's prefix is not a namespace: team-ab's pods are another's.
    prefixed = plan_mig_nodes([_node("c", pods=("team-ab/s",))], CONFIGS, allow_disruption=True,
                              labelled_at={}, now=100.0, drains_namespace="team-a")
    assert prefixed.kind is StepKind.NONE
    # Allowed (--mig-drain-other-namespaces): every namespace's.
    anyone = plan_mig_nodes([mixed], CONFIGS, allow_disruption=True, labelled_at={}, now=100.0)
    assert (anyone.kind, anyone.node) == (StepKind.DRAIN, "a")


def test_other_teams_pod_names_stay_out_of_a_tunings_status() -> None:
    """The reports go into status.mig, which whoever may read the tuning reads: the pod names
    of other namespaces on the node were among them. Its own namespace's are named, the
    others counted."""
    node = _node("a", pods=("team-a/p1", "team-b/secret-project-7", "team-a/p2",
                            "team-c/other"))
    step = plan_mig_nodes([node], CONFIGS, allow_disruption=False, labelled_at={}, now=100.0,
                          owner="team-a/qwen")
    (report,) = step.reports
    assert report.message.startswith("runs GPU pods (team-a/p1, team-a/p2, 2 of other "
                                      "namespaces); not reconfigured"), report.message
    many = _node("b", pods=tuple(f"team-a/p{i}" for i in range(5)))
    (report,) = plan_mig_nodes([many], CONFIGS, allow_disruption=False, labelled_at={},
                               now=100.0, owner="team-a/qwen").reports
    assert "(team-a/p0, team-a/p1, team-a/p2, 2 more)" in report.message
    step = plan_mig_nodes([node], CONFIGS, allow_disruption=True, labelled_at={}, now=100.0,
                          owner="team-a/qwen", drains_namespace="team-a")
    assert "secret-project" not in " ".join(r.message for r in step.reports)
