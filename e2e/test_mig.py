"""MIG end to end: the mig-parted ConfigMap, node labels one at a time, the state wait, busy
nodes left alone, and pods that request their slice and are placed by the real scheduler.

A small test double plays the GPU Operator's mig-manager: when a node gets
`nvidia.com/mig.config`, it reads that config from the ConfigMap, reports `pending`, puts the
MIG devices in the node's capacity and reports `success`, as the real one does after
partitioning. Nothing else of the GPU Operator is imitated.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import kopf
import pytest
import yaml
from kubernetes import client

from e2e.fixtures.operator import MIG_CONFIG_DELAY_S, OPERATOR_NAMESPACE, OperatorProcess
from e2e.fixtures.waiting import wait_for
from e2e.test_operator import create, delete_tuning_and_wait, deployment, get_tuning, tuning
from e2e.test_pod_tuning import create_tuning_first, pods_of, wait_pods
from infertune.api.spec import GROUP, PLURAL, VERSION, InferenceTuningSpec
from infertune.api.tuning import MigSpec
from infertune.controller import mig
from infertune.controller.mig import MIG_INTERVAL, MigSelector, gpu_pods_listed
from infertune.kube.client import evict_pod
from infertune.kube.lease import ALWAYS, Leader
from infertune.tuning.mig import LayoutPlan, plan_layout, request_from_spec

pytestmark = pytest.mark.e2e

CONFIG_LABEL, STATE_LABEL = "nvidia.com/mig.config", "nvidia.com/mig.config.state"
POOL = "e2e.infertune.io/pool"
CORDONED = "infertune.io/cordoned-for-mig"
EVENT_WAIT_S = 30
"""How long an Event may take after the change it announces: kopf posts Events from a queue
of its own, retrying a failed post with backoffs, and on a loaded CI machine one came more
than 10 s after its node was uncordoned."""


class FakeMigManager:
    """Answers node labels the way mig-manager does, for the nodes of one pool."""

    def __init__(self, api_client: client.ApiClient, pool: str) -> None:
        self.core = client.CoreV1Api(api_client)
        self.pool = pool
        self.stop = threading.Event()
        self.applied: list[tuple[str, str]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            for node in self.core.list_node(label_selector=f"{POOL}={self.pool}").items:
                labels = node.metadata.labels or {}
                config = labels.get(CONFIG_LABEL)
                if config and STATE_LABEL not in labels:
                    self._apply(node.metadata.name, config)

    def _apply(self, node: str, config: str) -> None:
        self.core.patch_node(node, {"metadata": {"labels": {STATE_LABEL: "pending"}}})
        data = self.core.read_namespaced_config_map("infertune-mig-parted-config",
                                                    OPERATOR_NAMESPACE).data["config.yaml"]
        groups = yaml.safe_load(data)["mig-configs"][config]
        devices = {f"nvidia.com/mig-{p.replace('+', '.')}": str(n * 8) for g in groups
                   for p, n in (g.get("mig-devices") or {}).items()}
        self.core.patch_node_status(node, {"status": {
            "capacity": {**devices, "nvidia.com/gpu": "0"},
            "allocatable": {**devices, "nvidia.com/gpu": "0"}}})
        self.core.patch_node(node, {"metadata": {"labels": {STATE_LABEL: "success"}}})
        self.applied.append((node, config))


@contextmanager
def running_mig_manager(api_client: client.ApiClient, pool: str) -> Iterator[FakeMigManager]:
    manager = FakeMigManager(api_client, pool)
    manager.thread.start()
    try:
        yield manager
    finally:
        manager.stop.set()
        manager.thread.join()


@pytest.fixture
def mig_manager(api_client: client.ApiClient) -> Iterator[FakeMigManager]:
    with running_mig_manager(api_client, "mig-a") as manager:
        yield manager


def _node_labels(api_client: client.ApiClient, name: str) -> dict[str, str]:
    return dict(client.CoreV1Api(api_client).read_node(name).metadata.labels or {})


def _mig_status(api_client: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = (get_tuning(api_client, namespace, name).get("status") or {}).get(
        "mig") or {}
    return status


def test_mig_layout_is_planned_labelled_and_awaited(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    mig_manager: FakeMigManager,
) -> None:
    create(api_client, namespace, tuning("qwen", "qwen", mig={
        "profile": "2g.35gb", "layout": [{"profile": "3g.71gb"}, {"profile": "2g.35gb",
                                                                   "count": 2}],
        "nodeSelector": {POOL: "mig-a"}}))

    def configured() -> dict[str, Any] | None:
        status = _mig_status(api_client, namespace, "qwen")
        nodes = status.get("nodes") or []
        return status if nodes and all(n["state"] == "configured" for n in nodes) else None

    status = wait_for(configured, "status.mig with every node configured", timeout_s=30)
    name = "infertune-h200-1x3g.71gb-2x2g.35gb"
    assert mig_manager.applied == [("h200-pool-a", name)]
    assert [n["node"] for n in status["nodes"]] == ["h200-pool-a"]
    assert status["profile"] == "2g.35gb" and status["strategy"] == "mixed"
    assert _node_labels(api_client, "h200-pool-a")[CONFIG_LABEL] == name
    assert CONFIG_LABEL not in _node_labels(api_client, "h200-pool-b")  # other pool untouched
    text = client.CoreV1Api(api_client).read_namespaced_config_map(
        "infertune-mig-parted-config", OPERATOR_NAMESPACE).data["config.yaml"]
    document = yaml.safe_load(text)
    assert document["version"] == "v1"
    assert document["mig-configs"][name] == [{"devices": "all", "mig-enabled": True,
                                              "mig-devices": {"3g.71gb": 1, "2g.35gb": 2}}]
    assert document["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    # Labelled only once mig-manager's copy of the ConfigMap has the config for sure.
    written = json.loads(client.CoreV1Api(api_client).read_namespaced_config_map(
        "infertune-mig-parted-config", OPERATOR_NAMESPACE).metadata.annotations[
        "infertune.io/configs-written"])[name]
    node = client.CoreV1Api(api_client).read_node("h200-pool-a")
    labelled = float(node.metadata.annotations["infertune.io/mig-labelled-at"])
    assert labelled >= written + MIG_CONFIG_DELAY_S - 1  # the annotation has whole seconds



def test_a_plan_that_breaks_keeps_the_profile_pods_are_admitted_with(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    mig_manager: FakeMigManager,
) -> None:
    """An A100 node that comes to match the nodeSelector makes 2g.35gb infeasible: nothing is
    labelled, and status.mig keeps the last plan's profile. Dropped, it changed the tuning
    revision, and every running pod was replaced by one asking for a whole GPU."""
    create(api_client, namespace, tuning("qwen", "qwen", mig={
        "profile": "2g.35gb", "nodeSelector": {POOL: "mig-a"}}))
    wait_for(lambda: _mig_status(api_client, namespace, "qwen").get("profile") == "2g.35gb",
             "the first plan", timeout_s=30)
    core = client.CoreV1Api(api_client)
    pool = _node_labels(api_client, "a100-0").get(POOL)
    core.patch_node("a100-0", {"metadata": {"labels": {POOL: "mig-a"}}})
    try:
        status = wait_for(lambda: (s := _mig_status(api_client, namespace, "qwen")).get(
            "message", "").startswith("nothing is labelled") and s, "the plan refused",
            timeout_s=30)
        assert "2g.35gb does not exist on NVIDIA-A100-SXM4-80GB" in status["message"]
        assert "pods keep being admitted with 2g.35gb" in status["message"]
        assert (status["profile"], status["strategy"]) == ("2g.35gb", "mixed")
        assert CONFIG_LABEL not in _node_labels(api_client, "a100-0")
    finally:
        core.patch_node("a100-0", {"metadata": {"labels": {POOL: pool}}})


def test_a_layout_is_planned_for_the_strategy_the_nodes_run(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
) -> None:
    """Nodes whose GPU Operator runs strategy single get no mixed layout, whatever
    spec.mig.strategy says: the device plugin refuses such a node (and GFD labels its GPUs
    MIG-INVALID), after the relabel has disrupted it."""
    core = client.CoreV1Api(api_client)
    strategy = "nvidia.com/mig.strategy"
    core.patch_node("h200-pool-b", {"metadata": {"labels": {strategy: "single"}}})
    try:
        create(api_client, namespace, tuning("qwen", "qwen", mig={
            "profile": "2g.35gb", "layout": [{"profile": "3g.71gb"},
                                             {"profile": "2g.35gb", "count": 2}],
            "nodeSelector": {POOL: "mig-b"}}))
        status = wait_for(lambda: (s := _mig_status(api_client, namespace, "qwen")).get(
            "message") and s, "status.mig.message", timeout_s=30)
        assert "strategy single gives every MIG device on a node the same profile" in \
            status["message"], status
        assert "the selected nodes run strategy single" in status["message"]
        assert CONFIG_LABEL not in _node_labels(api_client, "h200-pool-b")
        delete_tuning_and_wait(api_client, namespace, "qwen", "the tuning gone", timeout_s=15)
    finally:
        core.patch_node("h200-pool-b", {"metadata": {"labels": {strategy: "mixed"}}})

def test_a_node_running_gpu_pods_is_left_alone(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    busy = deployment("busy", resources={"limits": {"nvidia.com/gpu": "1"}})
    busy["spec"]["template"]["spec"]["nodeSelector"] = {POOL: "mig-b"}
    create(api_client, namespace, busy)
    wait_pods(api_client, namespace, "busy", 1)
    create(api_client, namespace, tuning("qwen", "qwen", mig={
        "profile": "3g.71gb", "nodeSelector": {POOL: "mig-b"}}))

    def reported_busy() -> dict[str, Any] | None:
        nodes = _mig_status(api_client, namespace, "qwen").get("nodes") or []
        return nodes[0] if nodes and nodes[0]["state"] == "busy" else None

    node = wait_for(reported_busy, "h200-pool-b reported busy")
    assert "allowDisruption" in node["message"]
    assert CONFIG_LABEL not in _node_labels(api_client, "h200-pool-b")


def test_a_node_drained_for_partitioning_is_uncordoned_once_partitioned(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """allowDisruption: the busy node is cordoned (and marked so), its GPU pod evicted,
    labelled once empty, and uncordoned when mig-manager reports success; it used to stay
    cordoned for good."""
    core = client.CoreV1Api(api_client)
    busy = deployment("busy", resources={"limits": {"nvidia.com/gpu": "1"}})
    busy["spec"]["template"]["spec"]["nodeSelector"] = {POOL: "mig-c"}
    create(api_client, namespace, busy)
    first = wait_pods(api_client, namespace, "busy", 1)[0].metadata.name
    with running_mig_manager(api_client, "mig-c") as manager:
        create(api_client, namespace, tuning("qwen", "qwen", mig={
            "profile": "3g.71gb", "allowDisruption": True, "nodeSelector": {POOL: "mig-c"}}))

        def configured() -> dict[str, Any] | None:
            nodes = _mig_status(api_client, namespace, "qwen").get("nodes") or []
            return nodes[0] if nodes and nodes[0]["state"] == "configured" else None

        wait_for(configured, "h200-pool-c configured", timeout_s=60)
        assert [n for n, _ in manager.applied] == ["h200-pool-c"]

        def uncordoned() -> Any:
            node = core.read_node("h200-pool-c")
            return node if not node.spec.unschedulable else None

        node = wait_for(uncordoned, "h200-pool-c uncordoned", timeout_s=15)
    annotations = node.metadata.annotations or {}
    assert "infertune.io/cordoned-for-mig" not in annotations
    assert annotations["infertune.io/mig-config-for"] == f"{namespace}/qwen"  # its claim
    # When it was labelled, for the mig-manager timeout after an operator restart.
    assert abs(time.time() - float(annotations["infertune.io/mig-labelled-at"])) < 120
    pods = core.list_namespaced_pod(namespace, label_selector="app=busy").items
    assert first not in {p.metadata.name for p in pods}  # evicted; its replacement waits
    # kopf posts Events from a queue of its own: they may come just after the node changes.
    wanted = {"MigNodeDraining", "MigNodeLabelled", "MigNodeUncordoned"}
    wait_for(lambda: wanted <= {e.reason for e in core.list_namespaced_event(namespace).items},
             f"Events {sorted(wanted)}", timeout_s=EVENT_WAIT_S)


def _draining(api_client: client.ApiClient, namespace: str, pool: str,
              tuning_name: str = "qwen") -> str:
    """A GPU pod on the pool's node that a PodDisruptionBudget keeps there, and a tuning
    with allowDisruption: returns the node once the operator has cordoned it for the tuning.
    The eviction is refused, so the drain goes on until the test changes something."""
    if not pods_of(api_client, namespace, "busy"):
        busy = deployment("busy", resources={"limits": {"nvidia.com/gpu": "1"}})
        busy["spec"]["template"]["spec"]["nodeSelector"] = {POOL: pool}
        create(api_client, namespace, busy)
        wait_pods(api_client, namespace, "busy", 1)
        client.PolicyV1Api(api_client).create_namespaced_pod_disruption_budget(namespace, {
            "metadata": {"name": "busy"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "busy"}}}})
    create(api_client, namespace, tuning(tuning_name, "qwen", mig={
        "profile": "3g.71gb", "allowDisruption": True, "nodeSelector": {POOL: pool}}))
    core = client.CoreV1Api(api_client)
    node = str(core.list_node(label_selector=f"{POOL}={pool}").items[0].metadata.name)
    wait_for(lambda: _cordoned_for(api_client, node) == f"{namespace}/{tuning_name}",
             f"{node} cordoned for {namespace}/{tuning_name}", timeout_s=30)
    return node


def _left_by_earlier_tests(api_client: client.ApiClient, pool: str) -> None:
    """Waits until the pool's node runs no pod of an earlier test that drained it: its pods
    go with its namespace, and an eviction asked meanwhile is refused (403, the namespace is
    being terminated), which fails the pass."""
    core = client.CoreV1Api(api_client)
    node = str(core.list_node(label_selector=f"{POOL}={pool}").items[0].metadata.name)
    wait_for(lambda: not core.list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={node}").items, f"no pods left on {node}", timeout_s=30)


def _cordoned_for(api_client: client.ApiClient, node: str) -> str | None:
    """The tuning the node was cordoned for; None when it is schedulable (and "" when
    someone else cordoned it)."""
    got = client.CoreV1Api(api_client).read_node(node)
    if not got.spec.unschedulable:
        return None
    return str((got.metadata.annotations or {}).get(CORDONED, ""))


def _uncordoned(api_client: client.ApiClient, namespace: str, node: str) -> str:
    """Waits until `node` is schedulable again and unmarked; the Event's message."""
    core = client.CoreV1Api(api_client)

    def released() -> bool:
        got = core.read_node(node)
        return not got.spec.unschedulable and CORDONED not in (got.metadata.annotations or {})

    wait_for(released, f"{node} uncordoned", timeout_s=30)

    def announced() -> list[str]:
        return [e.message for e in core.list_namespaced_event(namespace).items
                if e.reason == "MigNodeUncordoned"]

    # kopf posts Events from a queue of its own: the Event may come just after the node.
    events = wait_for(announced, "the MigNodeUncordoned Event", timeout_s=EVENT_WAIT_S)
    time.sleep(0.5)  # a second one, if the operator posted two, has had time to come too
    events = announced()
    assert len(events) == 1, events
    assert CONFIG_LABEL not in _node_labels(api_client, node)  # never labelled: still busy
    return str(events[0])


@pytest.mark.parametrize(("pool", "change", "why"), [
    ("mig-d", None, "the tuning was deleted"),
    ("mig-e", {"mig": None}, "spec.mig was removed"),
    ("mig-f", {"mig": {"nodeSelector": {POOL: "nowhere"}}}, "spec.mig no longer selects it"),
], ids=["deleted", "mig-removed", "no-longer-selected"])
def test_a_node_drained_for_a_tuning_that_will_not_partition_it_is_uncordoned(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, pool: str,
    change: dict[str, Any] | None, why: str,
) -> None:
    """The tuning goes away, or stops asking for the node, before mig-manager partitioned it
    (`change` None deletes it, else is patched into its spec): it stayed cordoned for good."""
    node = _draining(api_client, namespace, pool)
    if change is None:
        delete_tuning_and_wait(api_client, namespace, "qwen", "the tuning gone", timeout_s=30)
    else:
        _patch_spec(api_client, namespace, "qwen", change)
    message = _uncordoned(api_client, namespace, node)
    assert message == f"{node} uncordoned: drained for {namespace}/qwen, and {why}"


def test_a_node_two_tunings_drain_stays_cordoned_until_both_are_gone(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """Two tunings with the same layout drain the same node. It keeps the first one's mark
    (they took it from each other on every pass before), and the first one's deletion hands
    the node to the second, which still drains it, instead of uncordoning it."""
    node = _draining(api_client, namespace, "mig-g", "first")
    create(api_client, namespace, tuning("second", "qwen", mig={
        "profile": "3g.71gb", "allowDisruption": True, "nodeSelector": {POOL: "mig-g"}}))
    wait_for(lambda: "draining" in str(_mig_status(api_client, namespace, "second")),
             "the second tuning draining the node too", timeout_s=30)
    time.sleep(4)  # more than a MIG pass of each
    assert _cordoned_for(api_client, node) == f"{namespace}/first"
    delete_tuning_and_wait(api_client, namespace, "first", "the first tuning gone",
                           timeout_s=30)
    wait_for(lambda: _cordoned_for(api_client, node) == f"{namespace}/second",
             f"{node} handed to the second tuning", timeout_s=30)
    handed = wait_for(lambda: [e.message for e in client.CoreV1Api(
        api_client).list_namespaced_event(namespace).items
        if e.reason == "MigNodeHandedOver"], "the MigNodeHandedOver Event", timeout_s=EVENT_WAIT_S)
    assert handed == [f"{node} stays cordoned for {namespace}/second, which selects it too: "
                      f"drained for {namespace}/first, and the tuning was deleted"]
    delete_tuning_and_wait(api_client, namespace, "second", "the second tuning gone",
                           timeout_s=30)
    assert "the tuning was deleted" in _uncordoned(api_client, namespace, node)


@pytest.mark.parametrize(("change", "why"), [
    ({"mode": "DryRun"}, "InferenceTuning {namespace}/qwen is in DryRun, which would not "
                         "finish the drain"),
    ({"mode": "DryRun", "mig": {"allowDisruption": False}},
     "spec.mig.allowDisruption is off now, so its GPU pods are not evicted"),
], ids=["mode-only", "allow-disruption-off-too"])
def test_a_drain_is_undone_when_the_tuning_turns_to_dry_run(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    change: dict[str, Any], why: str,
) -> None:
    """DryRun writes nothing new, but it would not finish the drain either: the operator's
    own cordon is undone rather than left behind. With allowDisruption still on, the node
    stayed cordoned for good (both cases drain pool mig-h's node, one after the other)."""
    _left_by_earlier_tests(api_client, "mig-h")
    node = _draining(api_client, namespace, "mig-h")
    _patch_spec(api_client, namespace, "qwen", change)
    message = _uncordoned(api_client, namespace, node)
    assert message == (f"{node} uncordoned: drained for {namespace}/qwen, and "
                       f"{why.format(namespace=namespace)}")


def test_a_drain_a_budget_holds_up_is_announced_once_and_says_why_it_waits(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """A MigNodeDraining Event came every pass (every 3 s, a new Event object each) for as
    long as the drain lasted, and the node read "cordoned and draining" for ever while a
    PodDisruptionBudget refused every eviction. Runs on pool mig-d's node, which the
    "deleted" case above leaves uncordoned."""
    core = client.CoreV1Api(api_client)
    _left_by_earlier_tests(api_client, "mig-d")
    node = _draining(api_client, namespace, "mig-d")

    def held() -> str | None:
        entries = _mig_status(api_client, namespace, "qwen").get("nodes") or []
        message = next((str(e["message"]) for e in entries if e["node"] == node), "")
        return message if "PodDisruptionBudget refused" in message else None

    message = wait_for(held, f"{node}'s status naming the refused eviction", timeout_s=30)
    assert message.startswith("cordoned and draining 1 GPU pods before infertune-h200-")
    assert "refused the eviction of 1 of them" in message
    assert "turn spec.mig.allowDisruption off" in message
    time.sleep(4 * MIG_INTERVAL)  # passes that change nothing, and post nothing

    def reasons() -> list[str]:
        return sorted(e.reason for e in core.list_namespaced_event(namespace).items
                      if e.reason.startswith("MigNodeDrain"))

    assert reasons() == ["MigNodeDrainBlocked", "MigNodeDraining"]
    warning = next(e for e in core.list_namespaced_event(namespace).items
                   if e.reason == "MigNodeDrainBlocked")
    assert (warning.type, warning.message) == ("Warning", f"{node}: {message}")
    assert held() == message
    delete_tuning_and_wait(api_client, namespace, "qwen", "the tuning gone", timeout_s=30)
    wait_for(lambda: _cordoned_for(api_client, node) is None, f"{node} uncordoned",
             timeout_s=30)


@pytest.mark.parametrize(("pool", "change"), [("mig-i", None), ("mig-j", {"mig": None})],
                         ids=["deleted", "mig-removed"])
def test_a_node_left_cordoned_while_mig_manager_worked_is_uncordoned_when_it_is_done(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, pool: str,
    change: dict[str, Any] | None,
) -> None:
    """The tuning went away (deleted, or spec.mig removed) while mig-manager was applying a
    config to the node it drained: the node stays cordoned then, but it used to stay so for
    good once no tuning with spec.mig was left, since only their loops looked at nodes. The
    operator's watch on nodes uncordons it when mig-manager reports success."""
    node = _draining(api_client, namespace, pool)
    core = client.CoreV1Api(api_client)
    # mig-manager at work on a config (asked of it by a person, or an earlier plan).
    core.patch_node(node, {"metadata": {"labels": {CONFIG_LABEL: "all-disabled",
                                                   STATE_LABEL: "pending"}}})
    if change is None:
        delete_tuning_and_wait(api_client, namespace, "qwen", "the tuning gone", timeout_s=30)
    else:
        _patch_spec(api_client, namespace, "qwen", change)

    def left() -> list[str]:
        return [e.message for e in core.list_namespaced_event(namespace).items
                if e.reason == "MigNodeLeftCordoned"]

    warnings = wait_for(left, "a MigNodeLeftCordoned Warning", timeout_s=30)
    assert any(f"{node} stays cordoned: drained for {namespace}/qwen" in w for w in warnings)
    # A change of the node while mig-manager is still at work: the watch sees it, and
    # leaves the node cordoned.
    core.patch_node(node, {"metadata": {"labels": {"e2e.infertune.io/touched": "1"}}})
    time.sleep(3)  # more than a pass of every loop
    assert _cordoned_for(api_client, node) == f"{namespace}/qwen"
    core.patch_node(node, {"metadata": {"labels": {STATE_LABEL: "success"}}})
    wait_for(lambda: _cordoned_for(api_client, node) is None, f"{node} uncordoned",
             timeout_s=30)
    assert CORDONED not in (core.read_node(node).metadata.annotations or {})
    on_node = wait_for(lambda: [e.message for e in core.list_namespaced_event(
        "default", field_selector=f"involvedObject.kind=Node,involvedObject.name={node}").items
        if e.reason == "MigNodeUncordoned"], "the MigNodeUncordoned Event", timeout_s=EVENT_WAIT_S)
    gone = "no longer exists or no longer has spec.mig"
    assert on_node == [f"{node} uncordoned: drained for {namespace}/qwen, and InferenceTuning "
                       f"{namespace}/qwen, which drained it, {gone}"]


def test_a_cordon_made_after_someone_uncordoned_a_drained_node_is_left_alone(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """`kubectl uncordon` keeps the operator's drain mark; a cordon for maintenance made
    later carried it, and mig-manager's success then undid that cordon. The mark goes as
    soon as the operator sees the node uncordoned by someone else."""
    core = client.CoreV1Api(api_client)
    node = _draining(api_client, namespace, "mig-k")
    core.patch_node(node, {"metadata": {"labels": {CONFIG_LABEL: "all-disabled",
                                                   STATE_LABEL: "pending"}}})
    delete_tuning_and_wait(api_client, namespace, "qwen", "the tuning gone", timeout_s=30)
    core.patch_node(node, {"spec": {"unschedulable": False}})  # kubectl uncordon
    wait_for(lambda: CORDONED not in (core.read_node(node).metadata.annotations or {}),
             f"the drain mark removed from {node}", timeout_s=30)
    core.patch_node(node, {"spec": {"unschedulable": True}})  # kubectl cordon: maintenance
    core.patch_node(node, {"metadata": {"labels": {STATE_LABEL: "success"}}})
    time.sleep(3)  # more than a pass of every loop
    assert core.read_node(node).spec.unschedulable
    reasons = [e.reason for e in core.list_namespaced_event(
        "default", field_selector=f"involvedObject.kind=Node,involvedObject.name={node}").items]
    assert "MigNodeMarkRemoved" in reasons and "MigNodeUncordoned" not in reasons


def _patch_spec(api_client: client.ApiClient, namespace: str, name: str,
                spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": spec})


def test_an_eviction_by_uid_leaves_a_pod_made_again_under_the_same_name(
    api_client: client.ApiClient, namespace: str
) -> None:
    """A drain evicts the pods it saw: a StatefulSet pod deleted and made again under its name
    since then is another pod (perhaps on another node). On the real API server, the eviction
    with the old uid leaves the new pod alone and counts the old one as gone; with the new
    uid, it evicts."""
    core = client.CoreV1Api(api_client)
    body = {"metadata": {"name": "db-0"},
            # Never scheduled, so deleting it takes no kubelet.
            "spec": {"nodeSelector": {"e2e.infertune.io/nowhere": "true"},
                     "containers": [{"name": "c", "image": "busybox"}]}}
    old = core.create_namespaced_pod(namespace, body).metadata.uid
    core.delete_namespaced_pod("db-0", namespace, grace_period_seconds=0)
    wait_for(lambda: not [p for p in core.list_namespaced_pod(namespace).items
                          if p.metadata.name == "db-0"], "db-0 deleted")
    new = core.create_namespaced_pod(namespace, body).metadata.uid
    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    try:
        assert evict_pod(namespace, "db-0", old)
        assert core.read_namespaced_pod("db-0", namespace).metadata.uid == new
        assert evict_pod(namespace, "db-0", new)
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]

    def evicted() -> bool:
        try:
            pod = core.read_namespaced_pod("db-0", namespace)
        except client.ApiException as exc:
            return exc.status == 404
        return pod.metadata.uid != new or pod.metadata.deletion_timestamp is not None
    wait_for(evicted, "db-0 evicted")


def test_a_namespaced_operator_lists_every_namespaces_gpu_pods_on_a_node(
    api_client: client.ApiClient, namespace_factory: Callable[[], str],
    operator: OperatorProcess
) -> None:
    """What an operator run with --namespace reads instead of its pod index, which would miss
    other namespaces: the GPU pods on the node, from the API server."""
    mine, theirs = namespace_factory(), namespace_factory()
    for ns, name, limits in ((mine, "gpu", {"nvidia.com/gpu": "1"}),
                             (theirs, "gpu", {"nvidia.com/gpu": "1"}),
                             (theirs, "cpu", {"cpu": "1", "memory": "1Gi"})):
        body = deployment(name, resources={"limits": limits})
        body["spec"]["template"]["spec"]["nodeName"] = "h200-pool-b"
        create(api_client, ns, body)
        wait_pods(api_client, ns, name, 1)
    listed = gpu_pods_listed(client.CoreV1Api(api_client), "h200-pool-b")
    ours = sorted(ref for ref in listed if ref.split("/")[0] in (mine, theirs))
    assert [ref.split("/")[0] for ref in ours] == sorted([mine, theirs])
    assert all(ref.split("/")[1].startswith("gpu-") for ref in ours)
    core = client.CoreV1Api(api_client)
    assert [listed[ref] for ref in ours] == [  # the uid each was seen with, for the drain
        core.read_namespaced_pod(ref.split("/")[1], ref.split("/")[0]).metadata.uid
        for ref in ours]
    assert not [ref for ref in gpu_pods_listed(client.CoreV1Api(api_client), "h200-pool-a")
                if ref.split("/")[0] in (mine, theirs)]


def test_mig_on_a_gpu_without_mig_labels_nothing(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    create(api_client, namespace, tuning("qwen", "qwen", mig={
        "profile": "3g.71gb", "nodeSelector": {"topology.kubernetes.io/zone": "zone-b"}}))
    # zone-b holds the A100-80GB (no 3g.71gb there) and the L4 (no MIG at all).
    status = wait_for(lambda: (s := _mig_status(api_client, namespace, "qwen")).get(
        "message") and s, "status.mig.message")
    assert "3g.71gb does not exist on NVIDIA-A100-SXM4-80GB" in status["message"]
    assert CONFIG_LABEL not in _node_labels(api_client, "a100-0")


def test_pod_requests_its_slice_and_lands_where_the_slice_exists(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    # h200-mig-0 is already partitioned into 3g.71gb slices (see the topology file).
    body = deployment("qwen", resources={"requests": {"cpu": "2", "memory": "8Gi",
                                                      "nvidia.com/gpu": "1"},
                                         "limits": {"cpu": "2", "memory": "8Gi",
                                                    "nvidia.com/gpu": "1"}})
    create_tuning_first(api_client, namespace, operator, tuning("qwen", "qwen", mig={
        "profile": "3g.71gb", "nodeSelector": {"kubernetes.io/hostname": "h200-mig-0"}}))
    wait_for(lambda: _mig_status(api_client, namespace, "qwen").get("profile"),
             "status.mig.profile")
    create(api_client, namespace, body)
    pod = wait_pods(api_client, namespace, "qwen", 1)[0]
    limits = pod.spec.containers[0].resources.limits
    assert limits.get("nvidia.com/mig-3g.71gb") == "1" and "nvidia.com/gpu" not in limits
    # The real scheduler put it on a node that has the slice (h200-mig-0 from the topology, or
    # h200-pool-a once the first test's layout is applied), and on no other.
    node = client.CoreV1Api(api_client).read_node(pod.spec.node_name)
    assert int(node.status.allocatable.get("nvidia.com/mig-3g.71gb", "0")) > 0



def _h200_plan(profile: str) -> LayoutPlan:
    plan = plan_layout("NVIDIA-H200", request_from_spec(MigSpec(profile=profile)))
    assert isinstance(plan, LayoutPlan)
    return plan


def test_two_passes_writing_the_config_map_at_once_keep_both_configs(
    api_client: client.ApiClient, namespace: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another tuning's pass writes the ConfigMap between this pass's read and its write:
    written over the version read, this one's write is refused (409), and it merges again.
    Merged over its stale read, it dropped the other config, whose node was then labelled
    for a config mig-manager could not find."""
    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    try:
        now = time.time()
        first = mig._write_config_map(namespace, {"cfg-0": _h200_plan("3g.71gb")}, now - 600)
        assert first == {"cfg-0": now - 600, "all-disabled": now - 600}
        read = client.CoreV1Api.read_namespaced_config_map
        raced: list[str] = []

        def read_then_race(self: client.CoreV1Api, *args: Any, **kwargs: Any) -> Any:
            got = read(self, *args, **kwargs)
            if not raced:
                raced.append("b")
                mig._write_config_map(namespace, {"cfg-b": _h200_plan("2g.35gb")}, now)
            return got

        monkeypatch.setattr(client.CoreV1Api, "read_namespaced_config_map", read_then_race)
        written = mig._write_config_map(namespace, {"cfg-a": _h200_plan("1g.18gb")}, now + 1)
        assert raced == ["b"]
        stored = read(client.CoreV1Api(api_client), "infertune-mig-parted-config", namespace)
        configs = yaml.safe_load(stored.data["config.yaml"])["mig-configs"]
        assert set(configs) == {"cfg-0", "cfg-a", "cfg-b", "all-disabled"}
        # When each changed there: a node is labelled for one only a while after.
        times = json.loads(stored.metadata.annotations["infertune.io/configs-written"])
        assert times == {"cfg-0": now - 600, "all-disabled": now - 600, "cfg-b": now,
                         "cfg-a": now + 1}
        assert written == {"cfg-a": now + 1, "all-disabled": now - 600}
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]


def test_a_node_labelled_since_this_pass_read_it_is_not_labelled_over(
    api_client: client.ApiClient,
) -> None:
    """Two tunings' passes that both found a node free: the second label is refused (the node
    changed since it was read), so the second pass sees the first one's claim, instead of
    taking the node while mig-manager applies the first config."""
    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    core = client.CoreV1Api(api_client)
    node = "h200-pool-b"
    try:
        seen = mig.node_view(json.loads(core.read_node(node, _preload_content=False).data))
        assert mig._label(seen, "cfg-first", "ns-a/first")  # the first pass
        assert not mig._label(seen, "cfg-second", "ns-b/second")  # read before that label
        labels = _node_labels(api_client, node)
        assert labels[CONFIG_LABEL] == "cfg-first"
        again = mig.node_view(json.loads(core.read_node(node, _preload_content=False).data))
        assert again.claimed_by == "ns-a/first"
    finally:
        core.patch_node(node, {"metadata": {
            "labels": {CONFIG_LABEL: None, STATE_LABEL: None},
            "annotations": {"infertune.io/mig-config-for": None,
                            "infertune.io/mig-labelled-at": None}}})
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]


def test_a_pass_that_lost_the_lease_meanwhile_labels_or_drains_no_node(
    api_client: client.ApiClient, namespace: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Leadership is asked at the start of a pass, and its node reads and ConfigMap write may
    take long on an API server under load: a process that lost the Lease meanwhile labelled
    (or drained) a node the leader did not choose, two nodes out of service at once."""
    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    node, owner = "h200-pool-b", f"{namespace}/qwen"
    events: list[str] = []
    monkeypatch.setattr(mig.kopf, "event", lambda _, **event: events.append(event["reason"]))
    specs = [InferenceTuningSpec.model_validate({
        "targetRef": {"name": "qwen"}, "engine": "vllm", "mig": {
            "profile": "3g.71gb", "nodeSelector": {POOL: "mig-b"}, "allowDisruption": drain}})
        for drain in (False, True)]
    settings = mig.MigSettings(namespace, config_delay_s=0)  # its ConfigMap there
    body = kopf.Body({"metadata": {"namespace": namespace, "name": "qwen"}, "status": {}})

    def run(leader: Leader, gpu_pods: dict[str, dict[str, str]]) -> str:
        spec = specs[bool(gpu_pods)]
        return mig.reconcile_mig(namespace, "qwen", spec, settings, body, gpu_pods,
                                 frozenset({owner}), (MigSelector(owner, ((POOL, "mig-b"),)),),
                                 leader).message

    core = client.CoreV1Api(api_client)
    try:
        assert "not labelled by this process: it no longer leads" in run(_NotLeading(), {})
        assert CONFIG_LABEL not in _node_labels(api_client, node) and events == []
        # The same pass, leading: the node was free to label.
        assert run(ALWAYS, {}).startswith(f"label {node}")
        assert _node_labels(api_client, node)[CONFIG_LABEL].startswith("infertune-h200-")
        assert events == ["MigNodeLabelled"]
        # A node to drain first (GPU pods on it, allowDisruption): not cordoned either. Read
        # through its resourceVersion: an operator this session started uncordons, at once,
        # a node drained for a tuning that does not exist (this test's).
        _clear_mig_marks(core, node)
        events.clear()
        busy = {node: {f"{namespace}/gone-already": "uid-of-a-pod-gone-already"}}
        version = core.read_node(node).metadata.resource_version
        assert "not drained by this process: it no longer leads" in run(_NotLeading(), busy)
        assert core.read_node(node).metadata.resource_version == version and events == []
        assert run(ALWAYS, busy) == f"drain {node}"
        assert core.read_node(node).metadata.resource_version != version
        assert events == ["MigNodeDraining"]
    finally:
        _clear_mig_marks(core, node)
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]


def test_dry_run_says_the_node_it_would_change_is_not_changed(
    api_client: client.ApiClient, namespace: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node's report read "labelled for ..." (or "cordoned and draining") in DryRun,
    where nothing was done."""
    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    node, owner = "h200-pool-b", f"{namespace}/qwen"
    monkeypatch.setattr(mig.kopf, "event", lambda *_, **__: None)
    spec = InferenceTuningSpec.model_validate({
        "targetRef": {"name": "qwen"}, "engine": "vllm", "mode": "DryRun", "mig": {
            "profile": "3g.71gb", "nodeSelector": {POOL: "mig-b"}}})
    body = kopf.Body({"metadata": {"namespace": namespace, "name": "qwen"}, "status": {}})
    try:
        status = mig.reconcile_mig(namespace, "qwen", spec, mig.MigSettings(namespace), body,
                                   {}, frozenset({owner}),
                                   (MigSelector(owner, ((POOL, "mig-b"),), False),))
        assert status.message.startswith(f"dry run: would label {node}")
        (report,) = [n for n in status.nodes if n.node == node]
        assert report.message.startswith("dry run, not done: labelled for "), report.message
        assert CONFIG_LABEL not in _node_labels(api_client, node)
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]


def _clear_mig_marks(core: client.CoreV1Api, node: str) -> None:
    core.patch_node(node, {"spec": {"unschedulable": False}, "metadata": {
        "labels": {CONFIG_LABEL: None, STATE_LABEL: None},
        "annotations": {CORDONED: None, "infertune.io/mig-config-for": None,
                        "infertune.io/mig-labelled-at": None}}})


class _NotLeading:
    exclusive = True

    def leads(self) -> bool:
        return False


def test_a_config_map_that_cannot_be_read_does_not_keep_finished_nodes_cordoned(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
) -> None:
    """The shared ConfigMap edited by hand into YAML that does not parse: no node is
    labelled, but a node mig-manager has finished is still uncordoned (the pass stopped at
    the ConfigMap before it did)."""
    core = client.CoreV1Api(api_client)
    node, owner = "h200-pool-b", f"{namespace}/qwen"
    config = mig.config_names({"NVIDIA-H200": _h200_plan("3g.71gb")})["NVIDIA-H200"]
    core.patch_node(node, {"spec": {"unschedulable": True}, "metadata": {
        "labels": {CONFIG_LABEL: config, STATE_LABEL: "success"},
        "annotations": {CORDONED: owner, "infertune.io/mig-config-for": owner}}})
    name = "infertune-mig-parted-config"
    broken = {"data": {"config.yaml": "mig-configs: [unclosed"}}
    try:
        saved = core.read_namespaced_config_map(name, OPERATOR_NAMESPACE).data["config.yaml"]
        core.patch_namespaced_config_map(name, OPERATOR_NAMESPACE, broken)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        saved = None  # no tuning partitioned yet in this cluster
        core.create_namespaced_config_map(OPERATOR_NAMESPACE, {"metadata": {"name": name},
                                                               **broken})
    try:
        create(api_client, namespace, tuning("qwen", "qwen", mig={
            "profile": "3g.71gb", "nodeSelector": {POOL: "mig-b"}}))
        wait_for(lambda: _cordoned_for(api_client, node) is None, f"{node} uncordoned",
                 timeout_s=30)
        assert CORDONED not in (core.read_node(node).metadata.annotations or {})
        delete_tuning_and_wait(api_client, namespace, "qwen", "the tuning gone", timeout_s=15)
    finally:
        if saved is None:
            core.delete_namespaced_config_map(name, OPERATOR_NAMESPACE)
        else:
            core.patch_namespaced_config_map(name, OPERATOR_NAMESPACE,
                                             {"data": {"config.yaml": saved}})
        core.patch_node(node, {"spec": {"unschedulable": False}, "metadata": {
            "labels": {CONFIG_LABEL: None, STATE_LABEL: None},
            "annotations": {CORDONED: None, "infertune.io/mig-config-for": None,
                            "infertune.io/mig-labelled-at": None}}})


def test_dry_run_waits_for_a_config_as_enforce_does_and_writes_nothing(
    api_client: client.ApiClient, namespace: str,
) -> None:
    """DryRun says when a config already in the ConfigMap went in (Enforce waits from then),
    and writes nothing: a config it would add is not there, so it has no time."""
    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    try:
        now = time.time()
        mig._write_config_map(namespace, {"cfg-0": _h200_plan("3g.71gb")}, now - 60)
        before = client.CoreV1Api(api_client).read_namespaced_config_map(
            "infertune-mig-parted-config", namespace).metadata.resource_version
        seen = mig._write_config_map(namespace, {"cfg-0": _h200_plan("3g.71gb"),
                                                 "cfg-new": _h200_plan("2g.35gb")}, now,
                                     write=False)
        assert seen == {"cfg-0": now - 60, "all-disabled": now - 60}
        after = client.CoreV1Api(api_client).read_namespaced_config_map(
            "infertune-mig-parted-config", namespace).metadata.resource_version
        assert after == before
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
