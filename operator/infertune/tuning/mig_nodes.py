"""Which node to hand to the GPU Operator's mig-manager next, and what to report about each.

Pure: the controller lists the nodes and their GPU pods, calls `plan_mig_nodes`, and carries
out the one step it returns. The contract is the GPU Operator's (DESIGN.md #4): the operator
labels `nvidia.com/mig.config=<name>` and mig-manager answers in
`nvidia.com/mig.config.state` (pending, rebooting, success, failed). One node changes at a
time, and a node running GPU pods is never relabelled unless the spec allows the disruption,
in which case it is cordoned and drained first. Idle nodes go before any drain: a drain may
wait on a PodDisruptionBudget for long.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import NamedTuple

from infertune.tuning.mig import base_product

PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_CAPABLE_LABEL = "nvidia.com/mig.capable"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
CORDONED_ANNOTATION = "infertune.io/cordoned-for-mig"
"""On a node the operator cordoned to drain it: NAMESPACE/NAME of the InferenceTuning it was
drained for (releases before 2026-12 wrote the config name instead)."""
CLAIM_ANNOTATION = "infertune.io/mig-config-for"
"""NAMESPACE/NAME of the InferenceTuning whose config the node was labelled with: another
tuning that selects the node leaves it alone while that one exists, so two tunings asking for
different layouts do not relabel it back and forth."""
IN_FLIGHT_STATES = frozenset({"pending", "rebooting"})
LABELLED_AT_ANNOTATION = "infertune.io/mig-labelled-at"
"""Unix time the node was labelled, so the mig-manager timeout survives an operator restart."""
STATE_TIMEOUT_SECONDS = 900.0
"""How long mig-manager may take (it may reboot the node) before the step is reported as
timed out."""


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: Mapping[str, str]
    unschedulable: bool = False
    gpu_pods: tuple[str, ...] = ()
    """Pods on the node that request nvidia.com/gpu or a MIG resource and have not finished."""
    gpu_pod_uids: tuple[tuple[str, str], ...] = ()
    """(NAMESPACE/POD, uid) of those pods as seen, for the evictions of a drain: a pod of the
    same name made again since (a StatefulSet's, maybe on another node) is not the one meant."""
    claimed_by: str | None = None
    """CLAIM_ANNOTATION: the tuning whose config the node was labelled with."""
    labelled_at: float | None = None
    """LABELLED_AT_ANNOTATION: when (unix time) the operator labelled it."""
    cordoned_for: str | None = None
    """CORDONED_ANNOTATION: the operator cordoned it to drain it, for this tuning. It is
    uncordoned once mig-manager reports success, or when nobody will partition it any more
    (`cordons_to_release`). A node someone else cordoned is left as they left it."""
    version: str | None = None
    """The resourceVersion it was seen at: a release changes only the node as seen (a node
    cordoned again meanwhile is left as it is)."""

    @property
    def cordoned_by_us(self) -> bool:
        return self.cordoned_for is not None


class NodeState(StrEnum):
    CONFIGURED = "configured"
    PENDING = "pending"
    FAILED = "failed"
    TIMED_OUT = "timed-out"
    WAITING = "waiting"
    BUSY = "busy"
    DRAINING = "draining"
    CLAIMED = "claimed"


@dataclass(frozen=True)
class NodeReport:
    node: str
    state: NodeState
    message: str
    foreign_pods: bool = False
    """Busy because it runs GPU pods of another namespace than the tuning's, which the
    tuning may not evict (DRAIN_OTHER_NAMESPACES)."""


class StepKind(StrEnum):
    NONE = "none"
    LABEL = "label"
    DRAIN = "drain"


@dataclass(frozen=True)
class MigNodeStep:
    """At most one action, and a report for every selected node."""

    kind: StepKind
    node: str | None
    reports: tuple[NodeReport, ...] = field(default_factory=tuple)
    reason: str = ""


def select_nodes(nodes: Sequence[NodeView], products: Sequence[str],
                 node_selector: Mapping[str, str], owner: str | None = None) -> list[NodeView]:
    """MIG-capable nodes of the given GPU products that match the spec's node selector (of
    the tuning `owner`, NAMESPACE/NAME: see `selects` for the nodes it claims)."""
    wanted = set(products)
    return sorted(
        (n for n in nodes
         if n.labels.get(PRODUCT_LABEL) in wanted
         and n.labels.get(MIG_CAPABLE_LABEL) == "true"
         and selects(node_selector.items(), n.labels, claimed=claims(n, owner))),
        key=lambda n: n.name)


def claims(node: NodeView, owner: str | None) -> bool:
    """Whether `node` carries the claim of the tuning `owner` (NAMESPACE/NAME; None: of no
    tuning in particular, so not of one: an unclaimed node is no claimant's)."""
    return owner is not None and node.claimed_by == owner


SINGLE_REWRITES = ("nvidia.com/gpu.count", "nvidia.com/gpu.memory",
                   "nvidia.com/gpu.multiprocessors")
SINGLE_REWRITTEN_PREFIXES = ("nvidia.com/gpu.slices.", "nvidia.com/gpu.engines.")
"""Labels GPU Feature Discovery gives the values of one MIG device once a node is partitioned
under strategy single (NVIDIA/k8s-device-plugin docs/gpu-feature-discovery, "MIG 'single'
strategy"): gpu.count becomes the number of MIG devices, gpu.memory the memory of one."""


def rewritten_under_single(key: str) -> bool:
    """Whether GPU Feature Discovery rewrites label `key` on a node partitioned under strategy
    single (SINGLE_REWRITES)."""
    return key in SINGLE_REWRITES or key.startswith(SINGLE_REWRITTEN_PREFIXES)


def selects(selector: Iterable[tuple[str, str]], labels: Mapping[str, str],
            claimed: bool = False) -> bool:
    """Whether a spec.mig.nodeSelector selects a node with `labels`. Its GPU product matches
    with or without the -MIG-<profile> suffix GPU Feature Discovery adds once the node is
    partitioned under strategy single: a selector on the product (which the operator's own
    messages suggest) let go of every node it had partitioned, their claims lapsed, and the
    tuning ended with no node at all. `claimed`: the node carries the claim of the tuning
    whose selector this is (CLAIM_ANNOTATION), so it was selected when labelled; under
    strategy single the labels GPU Feature Discovery rewrites then (`rewritten_under_single`:
    nvidia.com/gpu.count: "8" for 8-GPU nodes) are not held against it, or the claim lapsed
    as soon as the node was partitioned and another tuning relabelled it."""
    single = claimed and labels.get(MIG_STRATEGY_LABEL) == "single"
    for key, value in selector:
        found = labels.get(key)
        if found != value and not (key == PRODUCT_LABEL and found is not None
                                   and base_product(found) == value) and not (
                single and rewritten_under_single(key)):
            return False
    return True


def _state_of(node: NodeView, config: str, labelled_at: float | None,
              now: float) -> NodeReport | None:
    """The report for a node already asked for `config`, or None if it has not been."""
    if node.labels.get(MIG_CONFIG_LABEL) != config:
        return None
    state = node.labels.get(MIG_STATE_LABEL, "")
    if state == "success":
        return NodeReport(node.name, NodeState.CONFIGURED, f"{config} applied by mig-manager")
    held = ("; it stays cordoned (infertune drained it): kubectl uncordon it once fixed"
            if node.cordoned_by_us else "")
    if state == "failed":
        return NodeReport(node.name, NodeState.FAILED, f"mig-manager reported failed for "
                          f"{config}; see the nvidia-mig-manager logs on {node.name}{held}")
    if labelled_at is not None and now - labelled_at > STATE_TIMEOUT_SECONDS:
        return NodeReport(node.name, NodeState.TIMED_OUT, f"no success from mig-manager "
                          f"{now - labelled_at:.0f}s after asking for {config} (state "
                          f"{state or 'unset'}){held}")
    return NodeReport(node.name, NodeState.PENDING, f"waiting for mig-manager to apply "
                      f"{config} (state {state or 'unset'})")


def _held_for_another(node: NodeView, config: str, owner: str,
                      exists: Callable[[str], bool], labelled_at: float | None = None,
                      now: float = 0.0,
                      holds: Callable[[str, NodeView], bool] = lambda t, n: True,
                      ) -> NodeReport | None:
    """The report for a node partitioned, or being partitioned, for another config than ours
    that is not ours to change; None when it may be. `labelled_at`: when the operator
    labelled it for the config it has; `holds(tuning, node)`: whether that tuning's
    spec.mig still selects the node (a claim lapses when it no longer does)."""
    current = node.labels.get(MIG_CONFIG_LABEL)
    if current is None or current == config:
        return None
    claimant = node.claimed_by
    if (claimant is not None and claimant != owner and exists(claimant)
            and holds(claimant, node)):
        return NodeReport(node.name, NodeState.CLAIMED, (
            f"labelled {current} for InferenceTuning {claimant}, which selects it too; "
            "tunings that select the same nodes must ask for the same layout, or select "
            "different nodes (spec.mig.nodeSelector)"))
    state = node.labels.get(MIG_STATE_LABEL, "")
    if state in IN_FLIGHT_STATES:
        return NodeReport(node.name, NodeState.WAITING, (
            f"mig-manager is applying {current} (state {state}); not relabelled meanwhile"))
    if not state and labelled_at is not None and now - labelled_at < STATE_TIMEOUT_SECONDS:
        # Labelled, and mig-manager has not said pending yet: it may be checking the config
        # already. Relabelled now, its run for the old config ends with "success" under the
        # new label, which read as the new layout applied (the node was uncordoned, and
        # reconfigured under the pods scheduled on it).
        return NodeReport(node.name, NodeState.WAITING, (
            f"labelled {current} at {_clock(labelled_at)}, which mig-manager has not "
            f"answered yet; not relabelled until it does, or until "
            f"{_clock(labelled_at + STATE_TIMEOUT_SECONDS)}"))
    return None


def _clock(t: float) -> str:
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):  # a time from a hand-edited annotation
        return f"unix time {t:g}"


DRAIN_OTHER_NAMESPACES = "--mig-drain-other-namespaces"
"""The `infertune run` option that lets a tuning with spec.mig.allowDisruption evict the GPU
pods of every namespace on the nodes it selects. Without it, a node that runs another
namespace's GPU pods is left alone (busy): whoever may create an InferenceTuning could
otherwise drain any MIG-capable node of the cluster and evict other teams' pods."""


def _pods_said(pods: Sequence[str], owner: str) -> str:
    """The GPU pods of a node as a tuning's status says them: by name those of its own
    namespace (of `owner`, NAMESPACE/NAME), by count the others. Whoever may read the tuning
    read other teams' pod names there."""
    namespace = owner.partition("/")[0]
    own = [pod for pod in pods if namespace and pod.startswith(f"{namespace}/")]
    said = own[:3] + ([f"{len(own) - 3} more"] if len(own) > 3 else [])
    others = len(pods) - len(own)
    if others:
        said.append(f"{others} of other namespaces")
    return ", ".join(said)


def plan_mig_nodes(nodes: Sequence[NodeView], configs: Mapping[str, str], *,
                   allow_disruption: bool, labelled_at: Mapping[str, float],
                   now: float, owner: str = "",
                   exists: Callable[[str], bool] = lambda claimant: True,
                   config_ready_at: Mapping[str, float] | None = None,
                   holds: Callable[[str, NodeView], bool] = lambda t, n: True,
                   drains_namespace: str | None = None,
                   ) -> MigNodeStep:
    """The next step over the selected `nodes`; `configs` maps GPU product -> config name.
    `drains_namespace`: the tuning's namespace, whose GPU pods alone it may evict (None: any
    namespace's, DRAIN_OTHER_NAMESPACES). `labelled_at` and `now` are unix times (a node's own
    annotation stands in for a time this process did not see). `owner` is the tuning
    planning (NAMESPACE/NAME), and `exists` says whether the tuning a node is claimed by is
    still there (a deleted one's claim lapses), and `holds(tuning, node)` whether its
    spec.mig still selects the node (when it no longer does, its claim lapses too).
    `config_ready_at`: config name -> when mig-manager's copy of the ConfigMap holds it for
    sure; no node is labelled for a config before then (mig-manager fails a config its copy
    does not have, and does not try again until the label changes)."""
    reports: list[NodeReport] = []
    todo: list[tuple[NodeView, str]] = []
    for node in nodes:
        config = configs[node.labels[PRODUCT_LABEL]]
        # The newer of this process's time and the node's own: another leader may have
        # labelled it since this one did.
        times = [t for t in (labelled_at.get(node.name), node.labelled_at) if t is not None]
        when = max(times) if times else None
        held = _held_for_another(node, config, owner, exists, when, now, holds)
        if held is not None:
            reports.append(held)
            continue
        report = _state_of(node, config, when, now)
        if report is None:
            todo.append((node, config))
        else:
            reports.append(report)
    in_flight = [r for r in reports
                 if r.state not in (NodeState.CONFIGURED, NodeState.CLAIMED)]
    if in_flight:
        # One node at a time; a failed or timed-out node stops the rollout until a person looks.
        for node, _config in todo:
            reports.append(_waiting(node, f"{in_flight[0].node} ({in_flight[0].state})"))
        return MigNodeStep(StepKind.NONE, None, _in_order(reports, nodes),
                           f"{in_flight[0].node}: {in_flight[0].message}")
    step: MigNodeStep | None = None
    for node, config in sorted(todo, key=_idle_first):
        if node.gpu_pods and not allow_disruption:  # whether another node takes the step
            reports.append(NodeReport(node.name, NodeState.BUSY, (
                f"runs GPU pods ({_pods_said(node.gpu_pods, owner)}); not reconfigured: set "
                "spec.mig.allowDisruption to cordon, drain and partition it")))
            continue
        foreign = [] if drains_namespace is None else [
            pod for pod in node.gpu_pods if not pod.startswith(f"{drains_namespace}/")]
        if foreign:
            reports.append(NodeReport(node.name, NodeState.BUSY, (
                f"runs GPU pods of other namespaces ({len(foreign)}); not drained: "
                f"a tuning evicts only its own namespace's pods ({drains_namespace}) unless "
                f"the operator runs with {DRAIN_OTHER_NAMESPACES} (chart: "
                "mig.drainOtherNamespaces)"), foreign_pods=True))
            continue
        if step is not None:
            reports.append(_waiting(node, step.node or ""))
            continue
        if node.gpu_pods:
            reports.append(NodeReport(node.name, NodeState.DRAINING, (
                f"cordoned and draining {len(node.gpu_pods)} GPU pods before {config}")))
            step = MigNodeStep(StepKind.DRAIN, node.name, reason=f"drain {node.name}")
            continue
        ready_at = (config_ready_at or {}).get(config)
        if ready_at is not None and now < ready_at:
            wait = (f"labelled for {config} from {_clock(ready_at)}: mig-manager reads the "
                    "ConfigMap through a volume, which the kubelet updates up to about a "
                    "minute after the config was written")
            reports.append(NodeReport(node.name, NodeState.WAITING, wait))
            step = MigNodeStep(StepKind.NONE, node.name, reason=f"{node.name} is {wait}")
            continue
        reports.append(NodeReport(node.name, NodeState.PENDING, f"labelled for {config}"))
        step = MigNodeStep(StepKind.LABEL, node.name, reason=f"label {node.name} "
                           f"{MIG_CONFIG_LABEL}={config}")
    if step is None:
        busy = [r.node for r in reports if r.state is NodeState.BUSY]
        claimed = [r for r in reports if r.state is NodeState.CLAIMED]
        reason = (f"{len(busy)} nodes busy, left alone" if busy else
                  f"{len(claimed)} nodes claimed by another tuning: {claimed[0].message}"
                  if claimed else
                  f"all {len(reports)} nodes configured" if reports else
                  "no node matches the GPU product, nvidia.com/mig.capable=true and "
                  "spec.mig.nodeSelector")
        return MigNodeStep(StepKind.NONE, None, _in_order(reports, nodes), reason)
    return MigNodeStep(step.kind, step.node, _in_order(reports, nodes), step.reason)


def _idle_first(todo: tuple[NodeView, str]) -> tuple[bool, bool, str]:
    """The order nodes take the step in: idle ones before any drain, which a
    PodDisruptionBudget may hold up for long (they waited behind it, whatever its pace); a
    node the operator cordoned before others, so that it is out of service the least time
    and a drain begun goes on before another begins."""
    node = todo[0]
    return bool(node.gpu_pods), not node.cordoned_by_us, node.name


def _waiting(node: NodeView, other: str) -> NodeReport:
    """The report of a node that waits for `other`; one whose drain pauses says it stays
    cordoned meanwhile."""
    held = ("; cordoned for its drain, which goes on after"
            if node.gpu_pods and node.cordoned_by_us and node.unschedulable else "")
    return NodeReport(node.name, NodeState.WAITING, f"waits for {other}{held}")


def _in_order(reports: list[NodeReport], nodes: Sequence[NodeView]) -> tuple[NodeReport, ...]:
    """The reports in the order of `nodes` (status.mig.nodes keeps the nodes' order)."""
    position = {node.name: i for i, node in enumerate(nodes)}
    return tuple(sorted(reports, key=lambda r: position[r.node]))


BUDGET_REFUSED = "a PodDisruptionBudget refused"
EVICTION_FAILED = "the Eviction API failed for"


def drain_report(report: NodeReport, refused: Sequence[str],
                 failed: Sequence[str] = ()) -> NodeReport:
    """The report of the node being drained once its pods' evictions were asked: `refused`
    are the pods a PodDisruptionBudget kept, `failed` those whose eviction the API server
    failed otherwise ("NAMESPACE/POD (STATUS: its message)": a pod covered by two budgets,
    which the Eviction API does not support, gets a 500), each asked again next pass.
    Without it, a drain that could not progress read "cordoned and draining" for ever."""
    if not refused and not failed:
        return report
    message = report.message
    if refused:
        names = ", ".join(refused[:3]) + (", ..." if len(refused) > 3 else "")
        message += (f"; {BUDGET_REFUSED} the eviction of {len(refused)} of them ({names}), "
                    "asked again every pass: the drain goes on once the budget allows it "
                    "(more ready replicas elsewhere, or a looser budget)")
    if failed:
        causes = "; ".join(failed[:3]) + ("; ..." if len(failed) > 3 else "")
        message += (f"; {EVICTION_FAILED} {len(failed)} of them ({causes}), asked again every "
                    "pass")
    return NodeReport(report.node, report.state, (
        f"{message}; turn spec.mig.allowDisruption off to stop the drain and uncordon the "
        "node"))


class Release(NamedTuple):
    """A node a drain left cordoned that its tuning will not partition: uncordoned, or handed
    to `successor`, another tuning whose spec.mig selects it, to finish or release; only its
    mark removed (`mark_only`) when someone uncordoned it already, so that a cordon they make
    later (maintenance) is not taken for the operator's."""

    node: str
    message: str
    successor: str | None = None
    version: str | None = None
    """The resourceVersion the node was seen at (NodeView.version)."""
    mark_only: bool = False


def cordons_to_release(nodes: Sequence[NodeView], reports: Sequence[NodeReport], *,
                       owner: str, exists: Callable[[str], bool],
                       gone: str = "spec.mig no longer selects it",
                       successor: Callable[[NodeView, str], str | None] = lambda n, t: None,
                       partitions: Callable[[str], bool] | None = None,
                       holds: Callable[[str, NodeView], bool] = lambda t, n: True,
                       dry_run: bool = False) -> list[Release]:
    """The nodes a drain left cordoned that nobody is going to partition now.

    `nodes` are all the MIG-capable nodes, `reports` this pass's reports for the ones `owner`
    selects (none when the tuning is going away; `gone` then says why). A node is released
    when it was drained for `owner` or for a tuning that no longer partitions anything
    (`partitions` false: deleted, without a valid spec.mig, or in DryRun; `exists` when not
    given), and `owner` is not partitioning it: it is not selected, or busy now that
    allowDisruption is off, or `dry_run` (owner is in DryRun, which would not finish a
    drain; a node it partitioned is uncordoned by `partitioned_after_drain`). Never while
    mig-manager has a config to apply that it has not reported success for
    (asked, pending, rebooting, failed, timed out: `_settled`), and never when the node is
    labelled for another live tuning, whose pass uncordons it on success
    (`partitioned_after_drain`). `successor(node, drained_for)` names another live tuning
    that selects the node: it is handed the node instead, as it may be draining it too.
    `holds(claimant, node)`: whether a claimant still selects the node (a claim that
    lapsed keeps no node cordoned: the claimant's pass does not look at it).
    """
    planned = {r.node: r.state for r in reports}
    foreign = {r.node for r in reports if r.foreign_pods}
    still_partitions = exists if partitions is None else partitions
    released: list[Release] = []
    for node in nodes:
        drained_for = node.cordoned_for
        if drained_for is None or "/" not in drained_for:
            continue  # not drained by us, or by a release that wrote no tuning name
        if not node.unschedulable:
            # `kubectl uncordon` keeps the mark, and a cordon made later (maintenance) would
            # carry it and be undone as the operator's. A drain still wanted marks it again.
            released.append(Release(node.name, f"{node.name} was uncordoned, not by the "
                                    f"operator: its mark of the drain for {drained_for} is "
                                    "removed", None, node.version, True))
            continue
        if drained_for != owner and still_partitions(drained_for):
            continue  # its own tuning is still there to finish it
        claimant = node.claimed_by
        # A claimant that partitions uncordons it on success; one that does not (deleted, or
        # without spec.mig) never will, whatever its claim keeps from other tunings' labels.
        if not _settled(node) or (claimant not in (None, owner, drained_for)
                                  and still_partitions(claimant) and holds(claimant, node)):
            continue
        state = planned.get(node.name)
        if state is None:
            why = gone if drained_for == owner else (
                f"InferenceTuning {drained_for}, which drained it, no longer exists or no "
                "longer has spec.mig")
        elif state is NodeState.BUSY and node.name in foreign:
            why = (f"it runs GPU pods of other namespaces, which InferenceTuning {owner} does "
                   f"not evict (the operator runs without {DRAIN_OTHER_NAMESPACES})")
        elif state is NodeState.BUSY:
            why = "spec.mig.allowDisruption is off now, so its GPU pods are not evicted"
        elif dry_run and state is not NodeState.CONFIGURED:
            why = f"InferenceTuning {owner} is in DryRun, which would not finish the drain"
        elif (state is NodeState.CLAIMED and claimant not in (None, owner)
              and not still_partitions(claimant)):
            # Labelled since for a tuning that has no spec.mig now: its claim keeps `owner`
            # from relabelling the node (a spec.mig dropped for a moment keeps its nodes),
            # and it has no pass to uncordon it on success.
            why = (f"it is labelled for {claimant}, which holds it and partitions nothing now "
                   "(no valid spec.mig, or DryRun)")
        else:
            continue  # being drained or partitioned for `owner`
        # Kept from an heir only when busy: the owner drains it again once allowed.
        heir = successor(node, drained_for) if state is None or dry_run else None
        if heir is not None:
            released.append(Release(node.name, f"{node.name} stays cordoned for {heir}, "
                                    f"which selects it too: drained for {drained_for}, and "
                                    f"{why}", heir, node.version))
        else:
            released.append(Release(node.name, f"{node.name} uncordoned: drained for "
                                    f"{drained_for}, and {why}", None, node.version))
    return released


def _settled(node: NodeView) -> bool:
    """mig-manager has nothing to do on the node: no config asked of it, or success reported
    for the one asked. A node labelled and not answered yet may be reconfigured any moment,
    and one that failed or timed out waits for a person (the report says so)."""
    return (MIG_CONFIG_LABEL not in node.labels
            or node.labels.get(MIG_STATE_LABEL) == "success")


def unsettled_cordons(nodes: Sequence[NodeView], owner: str) -> list[tuple[str, str]]:
    """(node, message) for the nodes drained for `owner` that stay cordoned when it goes
    away, because mig-manager has not reported success for the config they are labelled
    with."""
    return [(n.name, f"{n.name} stays cordoned: drained for {owner}, and mig-manager has not "
                     f"reported success for {n.labels.get(MIG_CONFIG_LABEL)} (state "
                     f"{n.labels.get(MIG_STATE_LABEL) or 'unset'}); the operator uncordons "
                     "it when nvidia.com/mig.config.state turns to success, or when the "
                     "config label is removed (kubectl uncordon it if mig-manager failed "
                     "for good)")
            for n in nodes if n.cordoned_for == owner and n.unschedulable and not _settled(n)]


def partitioned_after_drain(nodes: Sequence[NodeView], reports: Sequence[NodeReport],
                            owner: str = "",
                            partitions: Callable[[str], bool] = lambda _: False,
                            ) -> list[NodeView]:
    """The nodes the operator cordoned to drain them that mig-manager has configured since as
    `owner` wants them (and that are still cordoned: a mark on one someone uncordoned goes by
    itself, `cordons_to_release`). Not one drained for another tuning that still partitions
    (`partitions`): it is taking the node from the config `owner` sees as done to one of its
    own, and uncordoning it there let pods back onto it, which that tuning evicted again at
    its next pass, and so on; its own pass uncordons it once mig-manager has applied its
    config (or `cordons_to_release` when it stops partitioning)."""
    configured = {r.node for r in reports if r.state is NodeState.CONFIGURED}
    return [n for n in nodes if n.cordoned_by_us and n.unschedulable and n.name in configured
            and not _drained_for_another(n, owner, partitions)]


def _drained_for_another(node: NodeView, owner: str, partitions: Callable[[str], bool]) -> bool:
    """Whether `node` was drained for a tuning other than `owner` that still partitions and
    can relabel it: no one else's claim is on it (a mark without a tuning name is from a
    release that wrote none: nobody's drain). One handed a node another tuning's claim holds
    could never relabel it, and deferring to it kept the node cordoned for good."""
    drained_for = node.cordoned_for
    return (drained_for is not None and "/" in drained_for and drained_for != owner
            and partitions(drained_for) and node.claimed_by in (None, drained_for))
