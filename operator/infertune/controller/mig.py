"""MIG in the shell: plan layouts, write the mig-parted ConfigMap, label nodes one at a time.

The GPU Operator's mig-manager does the partitioning (DESIGN.md #4). This loop only speaks its
contract: the ConfigMap it reads, the `nvidia.com/mig.config` label it watches, and the
`nvidia.com/mig.config.state` label it answers in.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import kopf
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from infertune.api.spec import GROUP, PLURAL, VERSION, InferenceTuningSpec, Mode
from infertune.api.status import MigNodeStatus, MigStatus
from infertune.api.tuning import MigStrategy
from infertune.api.units import parse_quantity
from infertune.controller.loops import STOP_TIMEOUT_S, Work, every, leader_of, until_stopped
from infertune.controller.spec_cache import SPECS
from infertune.kube.client import evict_pod, read_json, server_message
from infertune.kube.lease import ALWAYS, Leader
from infertune.kube.webhooks import is_pattern
from infertune.tuning.mig import Infeasible, LayoutPlan, describe, plan_layout, request_from_spec
from infertune.tuning.mig_nodes import (
    BUDGET_REFUSED,
    CLAIM_ANNOTATION,
    CORDONED_ANNOTATION,
    EVICTION_FAILED,
    LABELLED_AT_ANNOTATION,
    MIG_CAPABLE_LABEL,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    MIG_STRATEGY_LABEL,
    PRODUCT_LABEL,
    NodeReport,
    NodeState,
    NodeView,
    Release,
    StepKind,
    claims,
    cordons_to_release,
    drain_report,
    partitioned_after_drain,
    plan_mig_nodes,
    select_nodes,
    selects,
    unsettled_cordons,
)
from infertune.tuning.migparted import config_name, render_mig_parted_config

RESOURCE = (GROUP, VERSION, PLURAL)
CONFIG_MAP = "infertune-mig-parted-config"
CONFIG_KEY = "config.yaml"
WRITTEN_ANNOTATION = "infertune.io/configs-written"
"""On the ConfigMap: JSON, config name -> when (unix time) it last changed there."""
CONFIG_WRITE_ATTEMPTS = 3
CONFIG_DELAY_S = 120.0
"""How long after a config goes into the ConfigMap (or changes) before a node is labelled for
it. mig-manager reads the ConfigMap through a volume, which the kubelet updates on its pod
sync (every minute, with jitter) after a change: labelled sooner, mig-manager found no such
config, set nvidia.com/mig.config.state=failed, and waited for the label to change again
(which it does not: the operator stops at a failed node)."""
MIG_INTERVAL = 3.0
logger = logging.getLogger(__name__)


@dataclass
class MigSettings:
    """Operator-wide MIG settings and state shared between the tunings' loops (kopf copies
    the memo)."""

    namespace: str
    labelled_at: dict[str, float] = field(default_factory=dict)
    """node -> unix time it was labelled, for the mig-manager timeout (also kept on the node,
    LABELLED_AT_ANNOTATION, for a restarted operator)."""
    cluster_wide: bool = True
    """Whether the operator watches every namespace (not --namespace). Only then does the kopf
    index `gpu_pods_by_node` see every GPU pod on a node, which also runs other namespaces'
    pods (otherwise each MIG-capable node's pods are listed)."""
    watched: frozenset[str] = frozenset()
    """With --namespace: the namespaces it names exactly (kopf also takes patterns, which are
    left out here)."""
    unseen_changes: set[str] = field(default_factory=set)
    """Drained nodes whose changes came while this process did not lead: looked at once it
    does (`sweep_unseen_changes`)."""
    handler_context: contextvars.Context | None = None
    """The context of a kopf handler, in which kopf.event finds kopf's event queue (not set
    for the task a startup handler starts)."""
    config_delay_s: float = CONFIG_DELAY_S
    """CONFIG_DELAY_S, or --mig-config-delay."""
    drain_other_namespaces: bool = False
    """--mig-drain-other-namespaces: a tuning may evict any namespace's GPU pods on the nodes
    it drains, not only its own namespace's (mig_nodes.DRAIN_OTHER_NAMESPACES)."""
    configured: set[str] = field(default_factory=set)
    """Nodes this process last saw with mig-manager's `success` for the config they are
    labelled with: one seen in another state after that is mig-manager applying it again (a
    node rebooted, its pod restarted), timed from then, not from the label of days ago."""

    @classmethod
    def watching(cls, namespace: str, namespaces: Sequence[str],
                 config_delay_s: float = CONFIG_DELAY_S,
                 drain_other_namespaces: bool = False) -> MigSettings:
        """The settings of an operator in `namespace` watching `namespaces` (--namespace;
        none is every namespace)."""
        return cls(namespace, cluster_wide=not namespaces, watched=frozenset(
            n for n in namespaces if not is_pattern(n)), config_delay_s=config_delay_s,
            drain_other_namespaces=drain_other_namespaces)

    def sees(self, tuning: str) -> bool:
        """Whether the tuning NAMESPACE/NAME would be in the operator's index if it existed:
        only then does a node's claim by it, or its drain, lapse when it is not there."""
        return self.cluster_wide or tuning.split("/", 1)[0] in self.watched


GPU_RESOURCE, MIG_RESOURCE_PREFIX = "nvidia.com/gpu", "nvidia.com/mig-"
SHARED_GPU_PREFIX = "nvidia.com/gpu."
"""Renamed whole-GPU resources, such as the GPU Operator's time-slicing `nvidia.com/gpu.shared`
(renameByDefault): they hold the same GPUs."""
_ENDED = ("Succeeded", "Failed")


def _requests_gpus(containers: list[dict[str, Any]]) -> bool:
    """Whether a container asks for one GPU or slice or more: `nvidia.com/gpu: 0` (a chart's
    templated GPU count left at 0) holds none, and such pods made a node busy (never
    partitioned) or were evicted from it for nothing."""
    for container in containers:
        resources = container.get("resources") or {}
        for wanted in (resources.get("limits") or {}, resources.get("requests") or {}):
            if any((k == GPU_RESOURCE or k.startswith((MIG_RESOURCE_PREFIX, SHARED_GPU_PREFIX)))
                   and _positive(count) for k, count in wanted.items()):
                return True
    return False


def _positive(count: Any) -> bool:
    """A resource count above 0; one that cannot be read counts (the API server took it)."""
    try:
        return parse_quantity(str(count)) > 0
    except ValueError:
        return True


def gpu_node(pod: Mapping[str, Any]) -> str | None:
    """The node whose GPUs (whole or MIG slices) the pod holds, or None: not bound yet, ended
    (Succeeded or Failed), or no GPU resource in its containers. A pod being deleted still
    holds them until it is gone."""
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in _ENDED:
        return None
    # Init containers hold devices too: a native sidecar (restartPolicy Always) for the life
    # of the pod, and one that builds an engine while it runs.
    holders = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    return str(node) if _requests_gpus(holders) else None


GpuPods = Mapping[str, str]
"""A node's GPU pods: NAMESPACE/POD to the uid it was seen with ("" when not known)."""


@kopf.index("", "v1", "pods")  # type: ignore[arg-type]
async def gpu_pods_by_node(namespace: str, name: str, body: kopf.Body,
                           **_: Any) -> dict[str, tuple[str, str]] | None:
    """GPU pods by node (`gpu_node`): the pods a reconfiguration would disrupt. A coroutine,
    as the other index functions (pods.py).

    kopf already watches every pod for pods_by_deployment, so this costs no API call; each
    MIG pass used to list every pod in the cluster instead, every 3 s for every tuning with
    spec.mig."""
    node = gpu_node(body)
    uid = str((body.get("metadata") or {}).get("uid") or "")
    return None if node is None else {node: (f"{namespace}/{name}", uid)}


def gpu_pods_listed(core: client.CoreV1Api, node: str) -> GpuPods:
    """The GPU pods on `node` in every namespace, from the API server (`MigSettings.cluster_wide`
    false), by NAMESPACE/POD. Node names are DNS subdomains, so the field selector cannot be
    subverted."""
    # Read as plain dicts, the form kopf gives the index (the client's models are not).
    response: Any = core.list_pod_for_all_namespaces(
        field_selector=",".join([f"spec.nodeName={node}",
                                 *(f"status.phase!={phase}" for phase in _ENDED)]),
        _preload_content=False)
    pods = json.loads(response.data)["items"]
    return dict(sorted((f"{p['metadata']['namespace']}/{p['metadata']['name']}",
                        str(p["metadata"].get("uid") or "")) for p in pods if gpu_node(p) == node))


def _observe_nodes(gpu_pods: Mapping[str, GpuPods] | None) -> list[NodeView]:
    """The MIG-capable nodes (the only ones a plan can select) with the GPU pods on each:
    from `gpu_pods` (the index, copied), or listed per node when it is None."""
    core = client.CoreV1Api()
    # Read as plain dicts, the form kopf gives the watch on nodes (`node_view`).
    response: Any = core.list_node(label_selector=f"{MIG_CAPABLE_LABEL}=true",
                                   _preload_content=False)
    views = [node_view(raw) for raw in json.loads(response.data)["items"]]
    found = ({view.name: gpu_pods.get(view.name, {}) for view in views} if gpu_pods is not None
             else {view.name: gpu_pods_listed(core, view.name) for view in views})
    return [dataclasses.replace(view, gpu_pods=tuple(found[view.name]),
                                gpu_pod_uids=tuple(found[view.name].items()))
            for view in views]


MAX_AHEAD_S = 86400.0
"""How far ahead of this clock a time in an annotation may be and still be taken for one the
operator wrote (another replica's clock may be ahead). Past it, or not after 1970, it is taken
as absent: a time in milliseconds, or edited by hand, held a node "waiting" until the year
33658, and one past datetime's range stopped every pass of every tuning selecting the node."""


def _plausible_time(value: Any) -> float | None:
    """`value` as a unix time the operator could have written, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):  # not a number, or an integer past a float's range
        return None
    return number if 0 < number <= time.time() + MAX_AHEAD_S else None  # NaN compares False


def _unix_time(text: str | None) -> float | None:
    """An annotation's unix time; None when absent or not one the operator could have written
    (edited by hand: `_plausible_time`)."""
    return None if text is None else _plausible_time(text)


class ConfigMapUnusable(ValueError):
    """The shared ConfigMap holds something other than a mig-parted document (edited by
    hand): nothing is merged into it, and no node is labelled until it is fixed."""


def _configs_in(text: str, namespace: str) -> dict[str, Any]:
    """The `mig-configs` of the ConfigMap's `text` (mig-parted v1), or ConfigMapUnusable
    saying what is wrong and what to do: YAML of another shape (a list, a string) raised a
    bare TypeError or AttributeError at every pass, and status.mig kept its last message."""
    fix = ("; fix it, or delete the ConfigMap and the operator writes it again with the "
           "tunings' configs")
    where = f"the ConfigMap {namespace}/{CONFIG_MAP} ({CONFIG_KEY})"
    try:
        existing = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        said = " ".join(str(exc).split())[:200]
        raise ConfigMapUnusable(f"{where} is not YAML that parses ({said}){fix}") from None
    configs = existing.get("mig-configs") if isinstance(existing, dict) else None
    if not isinstance(existing, dict) or not isinstance(configs or {}, dict):
        raise ConfigMapUnusable(f"{where} is not a mig-parted document (a mapping whose "
                                f"mig-configs maps config names to device groups){fix}")
    return dict(configs or {})


def _write_config_map(namespace: str, configs: dict[str, LayoutPlan], now: float,
                      write: bool = True) -> dict[str, float]:
    """Merge our named configs into the shared ConfigMap (other tunings keep theirs), and
    say when each of ours last changed there (unix time; kept in WRITTEN_ANNOTATION). With
    `write` false (DryRun), write nothing, and say it only of those there already as they
    are (one DryRun would write is not waited for: it is never written).

    Written over the version read: the tunings' passes run at the same time, and a merge
    over an older read dropped the config another pass had just added (its node was then
    labelled for a config mig-manager could not find). A write that lost the race reads and
    merges again."""
    core = client.CoreV1Api()
    ours = render_mig_parted_config(configs, include_all_disabled=True)["mig-configs"]
    for _ in range(CONFIG_WRITE_ATTEMPTS):
        try:
            current = core.read_namespaced_config_map(CONFIG_MAP, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            current = None
        data = {} if current is None else current.data or {}
        merged = _configs_in(data.get(CONFIG_KEY) or "", namespace)
        meta = None if current is None else current.metadata
        annotations = {} if meta is None else meta.annotations or {}
        written = _written_times(annotations.get(WRITTEN_ANNOTATION))
        fresh = set()
        for name, groups in ours.items():
            if merged.get(name) != groups or name not in written:
                written[name] = now  # new or changed: mig-manager's copy may not have it
                fresh.add(name)
            merged[name] = groups
        written = {name: t for name, t in written.items() if name in merged}
        text = yaml.safe_dump({"version": "v1", "mig-configs": merged}, sort_keys=False)
        if not write:
            return {name: written[name] for name in ours if name not in fresh}
        stamps = json.dumps(written, sort_keys=True)
        body: dict[str, Any] = {"metadata": {
            "name": CONFIG_MAP, "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "infertune"},
            "annotations": {WRITTEN_ANNOTATION: stamps}}, "data": {CONFIG_KEY: text}}
        try:
            if current is None:
                core.create_namespaced_config_map(namespace, body)  # type: ignore[arg-type]
            elif data.get(CONFIG_KEY) != text or annotations.get(WRITTEN_ANNOTATION) != stamps:
                body["metadata"]["resourceVersion"] = None if meta is None else \
                    meta.resource_version
                core.patch_namespaced_config_map(CONFIG_MAP, namespace, body)
        except ApiException as exc:
            if exc.status == 409:  # another pass wrote (or created) it since the read
                continue
            raise
        return {name: written[name] for name in ours}
    raise RuntimeError(f"the ConfigMap {namespace}/{CONFIG_MAP} changed under every one of "
                       f"{CONFIG_WRITE_ATTEMPTS} writes; the next pass tries again")


def _written_times(text: str | None) -> dict[str, float]:
    """WRITTEN_ANNOTATION: config name -> unix time; what cannot be read counts as not
    written (its configs count as written now)."""
    try:
        loaded = json.loads(text) if text else {}
    except ValueError:
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {str(name): written for name, t in loaded.items()
            if not isinstance(t, str) and (written := _plausible_time(t)) is not None}


class Drained(NamedTuple):
    """The evictions a drain asked for that did not happen now (each asked again next pass)."""

    refused: tuple[str, ...]
    """NAMESPACE/POD a PodDisruptionBudget kept."""
    failed: tuple[str, ...] = ()
    """NAMESPACE/POD (STATUS: message) whose eviction the API server failed otherwise."""


def _drain(node: NodeView, owner: str, exists: Callable[[str], bool]) -> Drained | None:
    """Cordon the node and ask for its GPU pods' eviction: those not evicted now (asked again
    next pass), or None when the node changed since this pass read it. One pod whose eviction
    fails (a 500 for a pod two budgets cover, a 403) does not keep the others from being
    asked: it stopped the pass right after the cordon, and only the log said why."""
    marked = node.cordoned_for
    # Marked with the tuning, so that it is uncordoned once partitioned, or when that tuning
    # no longer will; a node already cordoned by someone else (maintenance) is not marked,
    # and stays cordoned. A mark of a tuning that is gone (or of an older release) is taken
    # over; a live one's stays (it hands the node over when it goes).
    mark = not node.unschedulable or (marked not in (None, owner)
                                      and ("/" not in marked or not exists(marked)))
    if mark and not _patch_as_seen(node.name, node.version, {
            "spec": {"unschedulable": True},
            "metadata": {"annotations": {CORDONED_ANNOTATION: owner}}}):
        return None  # changed since this pass read it (a cordon made meanwhile): decided again
    refused: list[str] = []
    failed: list[str] = []
    uids = dict(node.gpu_pod_uids)
    for ref in node.gpu_pods:
        namespace, name = ref.split("/", 1)
        try:
            if not evict_pod(namespace, name, uids.get(ref) or None):
                refused.append(ref)
        except ApiException as exc:
            said = server_message(exc)
            logger.warning(f"evicting {ref} from {node.name} failed: {exc.status} {said}")
            failed.append(f"{ref} ({exc.status}: {said[:200]})")
    return Drained(tuple(refused), tuple(failed))


def _patch_as_seen(node: str, version: str | None, patch: dict[str, Any]) -> bool:
    """Patch the node only if it is still at `version`, the resourceVersion the decision was
    made on (any version when None); False when it has changed since (409)."""
    if version is not None:
        patch = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": version}}
    try:
        client.CoreV1Api().patch_node(node, patch)
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
    return True


def _uncordon(node: str, version: str | None = None, mark_only: bool = False) -> bool:
    """Uncordon the node and remove the drain mark (only the mark with `mark_only`), if it is
    still at `version` (`_patch_as_seen`)."""
    patch: dict[str, Any] = {"metadata": {"annotations": {CORDONED_ANNOTATION: None}}}
    if not mark_only:
        patch["spec"] = {"unschedulable": False}
    return _patch_as_seen(node, version, patch)


def _label(node: NodeView, config: str, owner: str) -> bool:
    """Label the node for `config`, claimed by `owner`, if it is still as this pass read it
    (`_patch_as_seen`): two tunings' passes that both found it free labelled it one after the
    other, and the first one's mig-manager run then reported success for the second's
    config. False when it changed since; the next pass decides again."""
    # Clear the old state with the new config: a stale "success" belongs to the old layout.
    return _patch_as_seen(node.name, node.version, {"metadata": {
        "labels": {MIG_CONFIG_LABEL: config, MIG_STATE_LABEL: None},
        "annotations": {CLAIM_ANNOTATION: owner, LABELLED_AT_ANNOTATION: f"{time.time():.0f}"}}})


def _strategies_run(capable: list[NodeView]) -> list[str]:
    """The MIG strategies the selected MIG-capable nodes run (their MIG_STRATEGY_LABEL, where
    it is one), sorted. Plans are made for the strategy the nodes run: under single, the
    device plugin refuses a node with mixed profiles (and GFD labels its GPUs MIG-INVALID),
    whatever the spec says."""
    return sorted({n.labels.get(MIG_STRATEGY_LABEL, "") for n in capable}
                  & {s.value for s in MigStrategy})


def planned_strategy(spec: InferenceTuningSpec, nodes: list[NodeView],
                     owner: str | None = None) -> str:
    """The strategy `_plans` plans for (and so status.mig.strategy, which the pod webhook
    reads): the one the selected nodes run, else the spec's. A label `_plans` does not take
    (empty, `none`, `Mixed`) is not one: counted as the nodes' strategy there, the plan was
    single while status said mixed (or the reverse), and the pods asked for a resource the
    partitioned nodes do not offer."""
    assert spec.mig is not None
    strategies = _strategies_run(_capable(spec, nodes, owner))
    return strategies[0] if len(strategies) == 1 else spec.mig.strategy.value


def _capable(spec: InferenceTuningSpec, nodes: list[NodeView],
             owner: str | None = None) -> list[NodeView]:
    """The MIG-capable nodes spec.mig.nodeSelector (of the tuning `owner`) selects."""
    assert spec.mig is not None
    return [n for n in nodes if n.labels.get(MIG_CAPABLE_LABEL) == "true"
            and selects(spec.mig.node_selector.items(), n.labels, claimed=claims(n, owner))]


def _plans(spec: InferenceTuningSpec, nodes: list[NodeView], owner: str | None = None
           ) -> tuple[dict[str, LayoutPlan], list[str], list[NodeView]]:
    assert spec.mig is not None
    capable = _capable(spec, nodes, owner)
    products = sorted({n.labels[PRODUCT_LABEL] for n in capable if PRODUCT_LABEL in n.labels})
    plans: dict[str, LayoutPlan] = {}
    errors: list[str] = []
    strategies = _strategies_run(capable)
    mig_spec, run_by = spec.mig, ""
    if len(strategies) > 1:
        errors.append(f"the selected nodes run different MIG strategies ({MIG_STRATEGY_LABEL}: "
                      f"{', '.join(strategies)}); narrow spec.mig.nodeSelector to one of them")
    elif strategies and strategies[0] != spec.mig.strategy.value:
        mig_spec = spec.mig.model_copy(update={"strategy": MigStrategy(strategies[0])})
        run_by = (f" (the selected nodes run strategy {strategies[0]}: {MIG_STRATEGY_LABEL}, "
                  "from the GPU Operator's ClusterPolicy)")
    for product in products:
        result = plan_layout(product, request_from_spec(mig_spec))
        if isinstance(result, Infeasible):
            errors.append(result.reason + run_by)
        else:
            plans[product] = result
    profiles = {plan.product: plan.pod_profile for plan in plans.values()}
    if len(set(profiles.values())) > 1:
        # Every pod asks for status.mig.profile: the other products' nodes would be
        # partitioned for slices no pod requests.
        errors.append("the selected nodes hold GPUs whose plans give pods different profiles ("
                      + ", ".join(f"{p}: {profile}" for p, profile in sorted(profiles.items()))
                      + "); narrow spec.mig.nodeSelector to one product, for example with "
                      f"{PRODUCT_LABEL}")
    return plans, errors, select_nodes(nodes, products, spec.mig.node_selector, owner)


def config_names(plans: Mapping[str, LayoutPlan]) -> dict[str, str]:
    """GPU product label -> mig-parted config name. Named by the catalog's product: with
    strategy single, GPU Feature Discovery renames a partitioned GPU
    (NVIDIA-A100-SXM4-40GB-MIG-1g.5gb), and the config must keep its name, or a node already
    partitioned as asked would be taken for one that is not."""
    return {product: config_name(plan.product, plan) for product, plan in plans.items()}


def reconcile_mig(namespace: str, name: str, spec: InferenceTuningSpec, settings: MigSettings,
                  body: kopf.Body, gpu_pods: Mapping[str, GpuPods] | None,
                  tunings: frozenset[str] = frozenset(),
                  selectors: MigSelectors = (), leader: Leader = ALWAYS) -> MigStatus:
    """One MIG pass; `gpu_pods` are the GPU pods by node (`gpu_pods_by_node`, copied), or None
    to list them (`MigSettings.cluster_wide` false); `tunings` the InferenceTunings that exist
    (NAMESPACE/NAME), for the nodes another one claimed: a claim holds while its tuning
    exists (a spec.mig dropped by a mistaken apply for a moment does not hand its nodes to
    another tuning). `selectors` are the tunings that partition (`mig_selectors`), for the
    nodes another one drained: one that was deleted or dropped spec.mig will not finish its
    drain. `leader` is asked again before a node is labelled or drained: the pass's reads
    and writes before that may take long enough for another process to lead meanwhile."""
    assert spec.mig is not None
    nodes = _observe_nodes(gpu_pods)
    plans, errors, selected = _plans(spec, nodes, f"{namespace}/{name}")
    previous = ((body.get("status") or {}).get("mig") or {}).get("message")
    owner = f"{namespace}/{name}"

    def exists(tuning: str) -> bool:
        return tuning in tunings or not settings.sees(tuning)

    partitioning = frozenset(s.tuning for s in selectors if s.partitions)

    def partitions(tuning: str) -> bool:
        return tuning in partitioning or not settings.sees(tuning)

    holds = claim_holds(selectors)
    if errors or not plans:
        reason = "; ".join(errors) or ("no node matches nvidia.com/mig.capable=true and "
                                       "spec.mig.nodeSelector")
        kept = _last_plan(body, f"nothing is labelled: {reason}")
        if kept.message != previous:
            kopf.event(body, type="Warning", reason="MigInfeasible" if errors else "MigNoNodes",
                       message=kept.message)
        gone = ("spec.mig cannot be planned (status.mig.message says why)" if errors else
                "spec.mig no longer selects it")
        _release(body, cordons_to_release(nodes, (), owner=owner, exists=exists, gone=gone,
                                          successor=_successor(selectors, owner, nodes),
                                          partitions=partitions, holds=holds))
        return kept
    configs = config_names(plans)
    now = time.time()
    ready_at: dict[str, float] | None = None
    config_error: Exception | None = None
    try:
        # DryRun reads when each config went in and writes nothing: it reports the same
        # waits as Enforce.
        written = _write_config_map(settings.namespace,
                                    {configs[p]: plan for p, plan in plans.items()}, now,
                                    write=spec.mode is not Mode.DRY_RUN)
        ready_at = {name: t + settings.config_delay_s for name, t in written.items()}
    except Exception as exc:  # raised below, once the nodes are released
        # A ConfigMap that cannot be read or written (edited by hand into YAML that does not
        # parse, made immutable): no node is labelled, but the nodes mig-manager has
        # finished are still uncordoned, and drains that lapsed undone.
        config_error = exc
    for node in selected:
        ours = node.labels.get(MIG_CONFIG_LABEL) == configs.get(node.labels[PRODUCT_LABEL])
        applied = node.labels.get(MIG_STATE_LABEL, "") == "success"
        if ours and not applied and node.name in settings.configured:
            # mig-manager applies the config again (the node rebooted, its pod restarted):
            # timed from the label of days ago, it read as timed out at once, and held the
            # rollout behind a node that was only being set up again.
            settings.labelled_at[node.name] = now
        elif (ours and not applied and node.labelled_at is None
              and node.name not in settings.labelled_at):
            # Asked for our config, with no time of asking (its annotation removed, and this
            # process did not label it): it waited for mig-manager for good, holding the
            # rollout, as no timeout could start. Timed from when this process first saw it.
            settings.labelled_at[node.name] = now
        if ours and applied:
            settings.configured.add(node.name)
        else:
            settings.configured.discard(node.name)
    step = plan_mig_nodes(selected, configs, allow_disruption=spec.mig.allow_disruption,
                          labelled_at=settings.labelled_at, now=now, owner=owner,
                          exists=exists, config_ready_at=ready_at, holds=holds,
                          drains_namespace=None if settings.drain_other_namespaces
                          else namespace)
    first = next(iter(plans.values()))
    status = MigStatus(
        profile=first.pod_profile, layout=[describe(p.slices) for p in plans.values()],
        strategy=planned_strategy(spec, nodes, owner),
        config_map=f"{settings.namespace}/{CONFIG_MAP}",
        nodes=[MigNodeStatus(node=r.node, config=configs[_product(selected, r.node)],
                             state=r.state.value, message=r.message)
               for r in _shown_reports(step.reports, step.node)],
        message=step.reason + (unlisted := _unlisted(step.reports)))
    # In DryRun too: uncordoning undoes the operator's own drain (made in Enforce).
    for node in partitioned_after_drain(selected, step.reports, owner, partitions):
        try:
            if not _uncordon(node.name, node.version):
                continue  # changed since read: the next pass sees it as it is now
        except ApiException as exc:
            if exc.status == 404:  # gone
                continue
            raise
        kopf.event(body, type="Normal", reason="MigNodeUncordoned",
                   message=f"{node.name} partitioned by mig-manager; uncordoned")
    _release(body, cordons_to_release(nodes, step.reports, owner=owner, exists=exists,
                                      successor=_successor(selectors, owner),
                                      partitions=partitions, holds=holds,
                                      dry_run=spec.mode is Mode.DRY_RUN))
    if isinstance(config_error, ConfigMapUnusable):
        # Said where the tuning's users look, not only in the log: status.mig kept the
        # message of the pass before ("labelled for ...").
        logger.error("InferenceTuning %s: %s", owner, config_error)
        why = f"{config_error}; no node is labelled until then"
        return (_not_done(status, step.node, why, unlisted) if step.node is not None
                else status.model_copy(update={"message": why + unlisted}))
    if config_error is not None:
        raise config_error
    if spec.mode is Mode.DRY_RUN:
        acts = step.kind in (StepKind.LABEL, StepKind.DRAIN)
        # The node the step would act on says so: its report reads as done ("cordoned and
        # draining", "labelled for"), and nothing was.
        reports = [entry.model_copy(update={"message": f"dry run, not done: {entry.message}"})
                   if acts and entry.node == step.node else entry for entry in status.nodes]
        return status.model_copy(update={
            "message": f"dry run: {'would ' if acts else ''}{step.reason}{unlisted}",
            "nodes": reports})
    if (step.kind in (StepKind.LABEL, StepKind.DRAIN) and step.node is not None
            and not leader.leads()):
        # Lost while the pass read the nodes and wrote the ConfigMap (an API server under
        # load): the leader decides. Two processes labelling or draining at once put two
        # nodes out of service where the rollout takes one at a time.
        done = "labelled" if step.kind is StepKind.LABEL else "drained"
        return _not_done(status, step.node, f"{step.node} not {done} by this process: it no "
                         "longer leads (--leader-elect), and the leader decides", unlisted)
    if step.kind is StepKind.LABEL and step.node is not None:
        node = next(n for n in selected if n.name == step.node)
        if not _label(node, configs[_product(selected, step.node)], owner):
            logger.info(f"{step.node} changed since this pass read it; the next one decides")
            return _not_done(status, step.node,
                             f"{step.node} changed while deciding; decided again next pass",
                             unlisted)
        settings.labelled_at[step.node] = time.time()
        kopf.event(body, type="Normal", reason="MigNodeLabelled", message=step.reason)
    elif step.kind is StepKind.DRAIN and step.node is not None:
        drained = _drain(next(n for n in selected if n.name == step.node), owner, partitions)
        if drained is None:
            return _not_done(status, step.node,
                             f"{step.node} changed while deciding; decided again next pass",
                             unlisted)
        return _drain_reported(body, status, step.node, *drained)
    return status


MAX_NODES_LISTED = 100
"""The most nodes status.mig.nodes lists (~300 bytes each): a tuning whose nodeSelector
matched 5000 nodes made a status past etcd's 1.5 MiB, whose write then failed every pass.
The nodes being worked on come first; the message counts the others."""


def _shown_reports(reports: Sequence[NodeReport], step: str | None) -> list[NodeReport]:
    """At most MAX_NODES_LISTED of `reports`, in their order: the node of the step, then the
    ones not configured (claimed by another tuning, waiting, failed, ...), then configured."""
    if len(reports) <= MAX_NODES_LISTED:
        return list(reports)
    def rank(report: NodeReport) -> int:
        # The node mig-manager works on (pending), the one drained, one that failed or
        # timed out (the rollout stops there until a person looks): before the ones that
        # wait for it, and those before the ones done.
        if report.node == step:
            return 0
        if report.state is NodeState.CONFIGURED:
            return 3
        return 2 if report.state in (NodeState.WAITING, NodeState.BUSY,
                                     NodeState.CLAIMED) else 1
    kept = {r.node for r in sorted(reports, key=rank)[:MAX_NODES_LISTED]}
    return [r for r in reports if r.node in kept]


def _unlisted(reports: Sequence[NodeReport]) -> str:
    """What the message adds when status.mig.nodes does not list every selected node."""
    if len(reports) <= MAX_NODES_LISTED:
        return ""
    configured = sum(r.state is NodeState.CONFIGURED for r in reports)
    return (f" (status.mig.nodes lists {MAX_NODES_LISTED} of the {len(reports)} selected "
            f"nodes, {configured} of them configured: those worked on first)")


def _not_done(status: MigStatus, node: str, why: str, unlisted: str = "") -> MigStatus:
    """`status` with the step on `node` not taken: its entry read as done ("labelled for",
    "cordoned and draining") while the message said it was not. `unlisted`: what the
    message adds for the nodes status.mig.nodes leaves out (`_unlisted`)."""
    return status.model_copy(update={"message": why + unlisted, "nodes": [
        entry.model_copy(update={"message": f"not done: {why}"}) if entry.node == node
        else entry for entry in status.nodes]})


def _drain_reported(body: kopf.Body, status: MigStatus, node: str,
                    refused: Sequence[str], failed: Sequence[str] = ()) -> MigStatus:
    """status.mig with the evictions a PodDisruptionBudget refused in the drained node's
    message, and Events only when that message is not the one status.mig holds already: the
    pass runs every 3 s, and kopf posts a new Event object each time. A Warning when
    evictions start being refused: the drain cannot go on until the budget allows it."""
    stored = ((body.get("status") or {}).get("mig") or {}).get("nodes") or []
    before = next((str(entry.get("message") or "") for entry in stored
                   if isinstance(entry, dict) and entry.get("node") == node
                   and entry.get("state") == NodeState.DRAINING.value), None)
    planned = next(entry.message for entry in status.nodes if entry.node == node)
    report = drain_report(NodeReport(node, NodeState.DRAINING, planned), refused, failed)
    if report.message != before:
        blocked = ((bool(refused) and BUDGET_REFUSED not in (before or ""))
                   or (bool(failed) and EVICTION_FAILED not in (before or "")))
        if before is None or not blocked:  # the drain starts, or moves on
            kopf.event(body, type="Normal", reason="MigNodeDraining",
                       message=f"{node}: {planned if blocked else report.message}")
        if blocked:
            kopf.event(body, type="Warning", reason="MigNodeDrainBlocked",
                       message=f"{node}: {report.message}")
    return status.model_copy(update={"nodes": [
        entry.model_copy(update={"message": report.message}) if entry.node == node else entry
        for entry in status.nodes]})


def _last_plan(body: kopf.Body, message: str) -> MigStatus:
    """status.mig when spec.mig cannot be planned now: the last plan's profile, strategy,
    layout and ConfigMap, with `message`. The pods are admitted with that profile and the
    tuning revision holds it: dropped, every running pod was outdated and replaced by one
    asking for a whole GPU (which partitioned nodes no longer have), because one node of
    another product came to match the nodeSelector, or its labels were gone for a moment.
    Nothing was relabelled for the new spec, so the nodes still hold the last plan's
    slices."""
    stored = (body.get("status") or {}).get("mig") or {}
    try:
        last = MigStatus.model_validate(stored)
    except ValidationError:  # edited by hand: nothing to keep
        return MigStatus(message=message)
    if last.profile is None:
        return MigStatus(message=message)
    return MigStatus(profile=last.profile, layout=last.layout, strategy=last.strategy,
                     config_map=last.config_map,
                     message=f"{message}; pods keep being admitted with {last.profile}, the "
                             "last plan's profile")


def _release(body: kopf.Body, releases: list[Release]) -> None:
    """Uncordon the nodes `cordons_to_release` found, or hand them to the tuning that selects
    them too, each with an Event on the tuning; one node that cannot be changed does not
    stop the others."""
    for node, message, successor, version, mark_only in releases:
        try:
            changed = (_uncordon(node, version, mark_only) if successor is None else
                       _patch_as_seen(node, version, {"metadata": {"annotations": {
                           CORDONED_ANNOTATION: successor}}}))
        except ApiException as exc:
            if exc.status == 404:
                continue  # the node is gone
            failed = (f"could not change {node} ({exc.status} {exc.reason}): {message}; "
                      f"kubectl uncordon {node} if nothing partitions it")
            logger.error(failed)
            kopf.event(body, type="Warning", reason="MigNodeLeftCordoned", message=failed)
            continue
        if not changed:
            # Changed since it was read (cordoned again, say): its change is looked at on its
            # own, by the next pass and the watch on nodes.
            logger.info(f"{node} changed since it was read; left as it is for now")
            continue
        logger.info(message)
        kopf.event(body, type="Normal", reason="MigNodeHandedOver" if successor is not None
                   else "MigNodeMarkRemoved" if mark_only else "MigNodeUncordoned",
                   message=message)


class MigSelector(NamedTuple):
    """A tuning with a valid spec.mig (`mig_selectors`)."""

    tuning: str
    """NAMESPACE/NAME."""
    node_selector: tuple[tuple[str, str], ...]
    """spec.mig.nodeSelector items."""
    partitions: bool = True
    """False in DryRun: it labels and drains nothing, so it is no successor for a drained
    node, and one drained for it is released."""
    spec: InferenceTuningSpec | None = None
    """Its spec, to tell whether it can be planned on the nodes now (`_plannable`); None: not
    known, taken as it can."""


MigSelectors = tuple[MigSelector, ...]


def tuning_names(index: kopf.Index[tuple[str, str], dict[str, Any]]) -> frozenset[str]:
    """NAMESPACE/NAME of every tuning in the index (read on the event loop, as
    `mig_selectors`)."""
    return frozenset(f"{namespace}/{entry['name']}" for (namespace, _), entries in
                     index.items() for entry in entries)


def mig_selectors(index: kopf.Index[tuple[str, str], dict[str, Any]]) -> MigSelectors:
    """The tunings with a spec.mig, in a spec that validates (an invalid one's loop never runs
    a pass, so a node handed to it would stay cordoned); those in DryRun do not partition.
    Read on the event loop, where kopf changes the index (see loops.every)."""
    found = []
    for (namespace, _), entries in index.items():
        for entry in entries:
            spec = entry.get("spec") or {}
            mig = spec.get("mig")
            if not isinstance(mig, dict):
                continue
            parsed = SPECS.get(str(entry.get("uid") or ""), int(entry.get("generation") or 0),
                               spec)
            if parsed is not None:
                selector = mig.get("nodeSelector") or {}
                found.append(MigSelector(
                    f"{namespace}/{entry['name']}",
                    tuple(sorted((str(k), str(v)) for k, v in selector.items())),
                    parsed.mode is not Mode.DRY_RUN, parsed))
    return tuple(sorted(found, key=lambda s: s.tuning))


def _selected(node: NodeView, selector: tuple[tuple[str, str], ...]) -> bool:
    """Whether a spec.mig.nodeSelector (as `mig_selectors` keeps it) selects the node."""
    return selects(selector, node.labels)


def claim_holds(selectors: MigSelectors) -> Callable[[str, NodeView], bool]:
    """Whether a claimant's spec.mig still selects a node it claimed: one whose nodeSelector
    moved elsewhere no longer holds it; one with no valid spec.mig now (dropped for a moment
    by a mistaken apply) keeps its claim."""
    selector_of = {s.tuning: s.node_selector for s in selectors}

    def holds(tuning: str, node: NodeView) -> bool:
        selector = selector_of.get(tuning)
        return selector is None or selects(selector, node.labels, claimed=claims(node, tuning))
    return holds


def _successor(selectors: MigSelectors, leaving: str,
               nodes: Sequence[NodeView] | None = None) -> Callable[[NodeView, str], str | None]:
    """Another tuning (not `leaving`, nor the one the node was drained for, nor one in DryRun,
    which would not finish the drain) whose spec.mig.nodeSelector selects the node: it takes
    over a node the leaving one drained. With `nodes`, only one that can be planned on them
    (`_plannable`): `leaving` cannot, and two such tunings handed a node to each other every
    pass, with an Event each time, and it stayed cordoned while neither could. A node whose
    claim still holds goes to its claimant only, the one tuning that can relabel it (none
    when that is `leaving` or the drainer itself: the node is released instead)."""
    holds = claim_holds(selectors)
    partitioning = {s.tuning for s in selectors if s.partitions}

    def find(node: NodeView, drained_for: str) -> str | None:
        claimant = node.claimed_by
        if claimant is not None and claimant in partitioning and holds(claimant, node):
            # Labelled for a tuning whose claim still holds: any other heir could not
            # relabel it (and waited, cordoned, for as long as the claim held).
            return claimant if claimant not in (leaving, drained_for) else None
        return next((s.tuning for s in selectors
                     if s.partitions and s.tuning not in (leaving, drained_for)
                     and _selected(node, s.node_selector)
                     and (nodes is None or _plannable(s, nodes))), None)
    return find


def _plannable(selector: MigSelector, nodes: Sequence[NodeView]) -> bool:
    """Whether the tuning's spec.mig can be planned on `nodes` now (not known: it can)."""
    if selector.spec is None or selector.spec.mig is None:
        return True
    plans, errors, _ = _plans(selector.spec, list(nodes), selector.tuning)
    return bool(plans) and not errors


def release_for_good(namespace: str, name: str, uid: str, body: kopf.Body, why: str,
                     selectors: MigSelectors = ()) -> None:
    """The tuning no longer partitions anything (`why`: deleted, or spec.mig removed):
    uncordon the nodes it drained that mig-manager is not at work on. The others stay
    cordoned, and a Warning names each (`unsettled_cordons`). Never raises: a failure is
    logged and posted, and must not hold the tuning's deletion."""
    owner = f"{namespace}/{name}"
    with _pass_lock(uid):  # a pass still in its thread could cordon a node after this
        try:
            nodes = _observe_nodes({})  # the GPU pods are not read
            _release(body, cordons_to_release(nodes, (), owner=owner, exists=lambda _: True,
                                              gone=why, successor=_successor(selectors, owner),
                                              holds=claim_holds(selectors)))
        except ApiException as exc:
            message = (f"could not uncordon the nodes drained for {owner} ({exc.status} "
                       f"{exc.reason}); kubectl uncordon the nodes annotated "
                       f"{CORDONED_ANNOTATION}={owner}")
            logger.error(message)
            kopf.event(body, type="Warning", reason="MigNodeLeftCordoned", message=message)
            return
    for _, message in unsettled_cordons(nodes, owner):
        logger.warning(message)
        kopf.event(body, type="Warning", reason="MigNodeLeftCordoned", message=message)


_PASS_LOCKS: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
"""Kept while someone holds or waits for them: a tuning whose spec.mig was removed before it
was deleted never reaches the deletion handler, so nothing else would forget its lock."""
_PASS_LOCKS_GUARD = threading.Lock()


def _pass_lock(uid: str) -> threading.Lock:
    """Held by each MIG pass of the tuning `uid` and by its release: kopf stops the loop and
    runs the deletion handler at the same time, and a pass already in its thread finishes."""
    with _PASS_LOCKS_GUARD:  # two threads must not each make one
        lock = _PASS_LOCKS.get(uid)
        if lock is None:
            lock = _PASS_LOCKS[uid] = threading.Lock()
        return lock


async def _in_thread(fn: Callable[..., None], *args: Any) -> None:
    """`fn(*args)` in a worker thread with this context (kopf.event finds kopf's queue in it):
    it calls the API, which blocks."""
    run = functools.partial(contextvars.copy_context().run, fn, *args)
    await asyncio.get_running_loop().run_in_executor(None, run)


@kopf.on.delete(*RESOURCE, when=lambda spec, **_: bool(spec.get("mig")))  # type: ignore[arg-type]
async def release_deleted(namespace: str, name: str, uid: str, body: kopf.Body,
                          tunings_by_target: kopf.Index[tuple[str, str], dict[str, Any]],
                          **_: Any) -> None:
    """A handler, not the end of the loop: the finalizer makes it run also for a tuning
    deleted while the operator was down."""
    await _in_thread(release_for_good, namespace, name, uid, body, "the tuning was deleted",
                     mig_selectors(tunings_by_target))


@kopf.on.update(*RESOURCE, field="spec.mig")  # type: ignore[arg-type]
async def release_unpartitioned(namespace: str, name: str, uid: str, body: kopf.Body, new: Any,
                                tunings_by_target: kopf.Index[tuple[str, str], dict[str, Any]],
                                **_: Any) -> None:
    """spec.mig removed while the operator was down (kopf compares with the spec it last
    handled); while it runs, the MIG loop's end does it too (see `partition_gpus`)."""
    if new is None:
        await _in_thread(release_for_good, namespace, name, uid, body, "spec.mig was removed",
                         mig_selectors(tunings_by_target))


def node_view(body: Mapping[str, Any]) -> NodeView:
    """A Node as kopf gives it, or as read as JSON (a plain body); its GPU pods are not
    read."""
    meta = body.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return NodeView(str(meta.get("name") or ""), dict(meta.get("labels") or {}),
                    bool((body.get("spec") or {}).get("unschedulable")),
                    claimed_by=annotations.get(CLAIM_ANNOTATION),
                    labelled_at=_unix_time(annotations.get(LABELLED_AT_ANNOTATION)),
                    cordoned_for=annotations.get(CORDONED_ANNOTATION),
                    version=meta.get("resourceVersion"))


@kopf.on.event("", "v1", "nodes",  # type: ignore[arg-type]
               annotations={CORDONED_ANNOTATION: kopf.PRESENT})
async def release_settled_cordon(body: kopf.Body, memo: kopf.Memo,
                                 tunings_by_target: kopf.Index[tuple[str, str], dict[str, Any]],
                                 **_: Any) -> None:
    """A node drained for a tuning that was deleted, or dropped spec.mig, while mig-manager
    was applying a config stays cordoned until mig-manager settles (`release_for_good`).
    The tuning's loop is gone by then, and with no other tuning with spec.mig, no loop would
    look at the node again: its own change (mig-manager's success label) releases it here,
    with an Event on the node. Only the leading operator acts (`--leader-elect`); a change
    that comes while another leads is looked at once this one does
    (`sweep_unseen_changes`). kopf stores nothing on nodes for an event handler."""
    settings: MigSettings = memo.mig
    name = str((body.get("metadata") or {}).get("name") or "")
    if not leader_of(memo).leads():
        if settings.handler_context is None:
            settings.handler_context = contextvars.copy_context()
        settings.unseen_changes.add(name)
        return
    settings.unseen_changes.discard(name)
    await _release_if_settled(node_view(body), settings, tunings_by_target, body)


async def _release_if_settled(node: NodeView, settings: MigSettings,
                              index: kopf.Index[tuple[str, str], dict[str, Any]],
                              body: Mapping[str, Any]) -> None:
    """Release `node` if it was drained for a tuning that no longer partitions it and
    mig-manager has settled (`cordons_to_release`); `body` gets the Event."""
    selectors = mig_selectors(index)  # on the event loop, where kopf changes the index
    partitioning = frozenset(s.tuning for s in selectors if s.partitions)
    existing = tuning_names(index)

    def exists(tuning: str) -> bool:
        return tuning in existing or (not settings.sees(tuning) and _read_mig(tuning)
                                      is not None)

    def partitions(tuning: str) -> bool:
        return tuning in partitioning or (not settings.sees(tuning) and bool(_read_mig(tuning)))

    def release() -> None:
        _release(body, cordons_to_release([node], (), owner="", exists=exists,  # type: ignore[arg-type]
                                          successor=_successor(selectors, ""),
                                          partitions=partitions, holds=claim_holds(selectors)))

    await _in_thread(release)


def _read_mig(tuning: str) -> dict[str, Any] | None:
    """spec.mig of the tuning NAMESPACE/NAME read from the API server ({} when it has none,
    or is in DryRun), for a tuning outside the kopf index (a namespace this operator matches
    by a pattern); None when it does not exist. Unreadable counts as partitioning: nothing is
    released."""
    namespace, _, name = tuning.partition("/")
    try:
        found: dict[str, Any] = client.CustomObjectsApi().get_namespaced_custom_object(  # type: ignore[assignment]
            GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        logger.warning(f"could not read InferenceTuning {tuning} ({exc.status} {exc.reason}): "
                       "the nodes drained for it stay as they are")
        return {"unreadable": True}
    meta, spec = found.get("metadata") or {}, found.get("spec") or {}
    mig = spec.get("mig")
    parsed = SPECS.get(str(meta.get("uid") or ""), int(meta.get("generation") or 0), spec)
    if not isinstance(mig, dict) or parsed is None:
        return {}  # no valid spec.mig: it partitions nothing (its loop runs no pass)
    if parsed.mode is Mode.DRY_RUN:
        return {}  # it labels and drains nothing either
    return dict(mig)


SWEEP_INTERVAL_S = 2.0


@kopf.on.startup()  # type: ignore[arg-type]
async def start_sweeping(memo: kopf.Memo,
                         tunings_by_target: kopf.Index[tuple[str, str], dict[str, Any]],
                         **_: Any) -> None:
    """The task that looks at the drained nodes whose changes came while another operator
    led (kopf hands the index to startup handlers too; it is filled before any node change is
    handled)."""
    memo.mig_sweeper = asyncio.get_running_loop().create_task(
        sweep_unseen_changes(memo, tunings_by_target))


@kopf.on.cleanup()
async def stop_sweeping(memo: kopf.Memo, **_: Any) -> None:
    """Ended with the operator: left running, kopf would wait 5 s for it at every stop, and
    the Lease would be handed over that much later."""
    sweeper: asyncio.Task[None] | None = memo.get("mig_sweeper")
    if sweeper is not None:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper


async def sweep_unseen_changes(memo: kopf.Memo,
                               index: kopf.Index[tuple[str, str], dict[str, Any]]) -> None:
    """Once this process leads, each node in `unseen_changes` is read again and released if
    it should be: without this, a node that changed while another operator led (the first
    listing of a new operator of a rolling upgrade, mig-manager's success meanwhile) would
    wait for its next change, which on an idle node may never come."""
    settings: MigSettings = memo.mig
    while True:
        await asyncio.sleep(SWEEP_INTERVAL_S)
        if not settings.unseen_changes or not leader_of(memo).leads():
            continue
        for name in sorted(settings.unseen_changes):
            settings.unseen_changes.discard(name)
            try:
                raw = await asyncio.to_thread(_read_node, name)
                if raw is not None and CORDONED_ANNOTATION in (
                        (raw.get("metadata") or {}).get("annotations") or {}):
                    # In a handler's context, where its Event can be posted.
                    context = (settings.handler_context or contextvars.copy_context()).copy()
                    await asyncio.get_running_loop().create_task(_release_if_settled(
                        node_view(raw), settings, index, raw), context=context)
            except Exception:  # one node must not stop the others, nor the task
                logger.exception(f"looking at node {name} again failed; its next change will")


def _read_node(name: str) -> dict[str, Any] | None:
    return read_json(client.CoreV1Api().read_node, name)


def _product(nodes: list[NodeView], node: str) -> str:
    return next(n.labels[PRODUCT_LABEL] for n in nodes if n.name == node)


@kopf.daemon(*RESOURCE, cancellation_timeout=STOP_TIMEOUT_S,  # type: ignore[arg-type]
             when=lambda spec, **_: bool(spec.get("mig")))
async def partition_gpus(stopped: kopf.DaemonStopped, namespace: str, name: str, uid: str,
                         body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                         gpu_pods_by_node: kopf.Index[str, tuple[str, str]],
                         tunings_by_target: kopf.Index[tuple[str, str], dict[str, Any]],
                         **_: Any) -> None:
    """Every MIG_INTERVAL: plan the layout, write the ConfigMap, label or drain one node, and
    report in status.mig (a loop, not a kopf timer: see loops.py). When the tuning is deleted
    or drops spec.mig, the nodes it drained are uncordoned (`release_for_good`)."""

    def read(spec: dict[str, Any], _: dict[str, Any], meta: dict[str, Any]) -> Work | None:
        parsed = SPECS.get(uid, int(meta.get("generation") or 0), spec)
        if parsed is None:
            return None
        # Copied here, on the event loop, where kopf changes the index (see loops.every).
        gpu_pods = ({node: dict(sorted(pods)) for node, pods in gpu_pods_by_node.items()}
                    if memo.mig.cluster_wide else None)
        tunings = tuning_names(tunings_by_target)
        selectors = mig_selectors(tunings_by_target)

        def work() -> dict[str, Any]:
            with _pass_lock(uid):
                status = reconcile_mig(namespace, name, parsed, memo.mig, body, gpu_pods,
                                       tunings, selectors, leader_of(memo))
            # None values are sent, so a profile or ConfigMap from an earlier plan does not
            # linger.
            return {"mig": status.model_dump(by_alias=True, mode="json")}

        return work

    await every(MIG_INTERVAL, read, what="MIG partitioning", stopped=stopped,
                namespace=namespace, name=name, body=body, logger=logger,
                leader=leader_of(memo))
    reason = stopped.reason or kopf.DaemonStoppingReason(0)
    if (reason & kopf.DaemonStoppingReason.FILTERS_MISMATCH
            and not reason & kopf.DaemonStoppingReason.RESOURCE_DELETED):
        # spec.mig removed. Also `release_unpartitioned`'s, which runs only once kopf has
        # handled the creation (not while a tuning waits for its Deployment), and this one
        # only while the operator runs: whichever comes second finds nothing left to do.
        run = functools.partial(contextvars.copy_context().run, release_for_good, namespace,
                                name, uid, body, "spec.mig was removed",
                                mig_selectors(tunings_by_target))
        # Shielded: kopf cancels a stopping daemon after a few loop cycles; the release
        # finishes in its thread all the same.
        await until_stopped(asyncio.shield(asyncio.get_running_loop().run_in_executor(
            None, run)), stopped)
