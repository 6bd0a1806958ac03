"""Pod tuning end to end: the real kube-apiserver calls the operator's webhook for every pod.

A Deployment that an InferenceTuning targets gets tuned pods (launcher, allocator env,
memory.high intent, ownership labels); every other pod is left alone; a changed tuning
re-creates pods by eviction within their PodDisruptionBudget.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.fixtures.access import exists
from e2e.fixtures.admission import without_the_check
from e2e.fixtures.operator import OPERATOR_NAMESPACE, SERVICE_ACCOUNT, OperatorProcess
from e2e.fixtures.waiting import wait_for
from e2e.test_operator import (
    GROUP,
    PLURAL,
    VERSION,
    create,
    deployment,
    documented_policy,
    events_for,
    get_tuning,
    tuning,
    wait_observed,
)
from infertune.kube.client import evict_pod
from infertune.kube.webhook_tls import write_self_signed
from infertune.kube.webhooks import (
    MATCH_REPLICASET,
    OTHER_CAS,
    REGISTERED_BY,
    WEBHOOK_CONFIGURATION,
    WebhookRegistration,
)

pytestmark = pytest.mark.e2e

REVISION = "infertune.io/revision"
LAUNCHER = "/infertune/infertune-launch"


def pods_of(api_client: client.ApiClient, namespace: str, app: str) -> list[Any]:
    pods = client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=f"app={app}")
    return [p for p in pods.items if p.metadata.deletion_timestamp is None]


def wait_pods(api_client: client.ApiClient, namespace: str, app: str, count: int,
              check: Any = None, timeout_s: float = 60) -> list[Any]:
    """Wait for `count` live pods of `app`, all Ready, all passing `check`."""
    def observe() -> list[Any] | None:
        pods = pods_of(api_client, namespace, app)
        ready = [p for p in pods if any(c.type == "Ready" and c.status == "True"
                                        for c in (p.status.conditions or []))]
        if len(pods) != count or len(ready) != count:
            return None
        return pods if check is None or all(check(p) for p in pods) else None

    return wait_for(observe, f"{count} Ready pods of {app}", timeout_s=timeout_s)


def create_tuning_first(api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
                        body: dict[str, Any]) -> None:
    """Create the tuning and wait until the operator has seen it (its status is written after
    kopf's indexes are updated), so the first pods of the Deployment meet a warm webhook."""
    create(api_client, namespace, body)
    wait_for(lambda: "observedGeneration" in get_tuning(api_client, namespace,
                                                         body["metadata"]["name"]).get(
        "status", {}), "the operator to observe the tuning")
    operator.check_running()


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or []}


def test_pods_of_a_tuned_deployment_arrive_tuned(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    create(api_client, namespace, tuning("qwen", "qwen", memory={"high": "7Gi"},
                                         allocator={"mallocConf": "background_thread:true"}))
    wait_observed(api_client, namespace, "qwen", operator, status="False")  # no target yet
    create(api_client, namespace, deployment("qwen", replicas=2))
    pods = wait_pods(api_client, namespace, "qwen", 2)
    for pod in pods:
        serving = pod.spec.containers[0]
        assert serving.command == [LAUNCHER, "--", "vllm", "serve", "Qwen/Qwen2-7B-Instruct"]
        assert [c.name for c in pod.spec.init_containers] == ["infertune-launcher"]
        assert pod.spec.init_containers[0].image == "infertune:e2e"
        env = env_of(pod)
        assert env["LD_PRELOAD"] == "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
        assert env["MALLOC_CONF"] == "background_thread:true,narenas:2"  # 2 CPUs
        assert env["INFERTUNE_NUMA_POLICY"] == "gpu-local"
        assert pod.metadata.annotations["infertune.io/memory-high"] == str(7 * 2**30)
        assert pod.metadata.labels["infertune.io/tuned-by"] == "qwen"
        assert REVISION in pod.metadata.labels
    # Sent to the webhook through its matchCondition (a pod a ReplicaSet controls), which the
    # API server compiled and kept: other pod creations never wait on the operator.
    registration = client.AdmissionregistrationV1Api(
        api_client).read_mutating_webhook_configuration(WEBHOOK_CONFIGURATION)
    assert [(c.name, c.expression) for c in registration.webhooks[0].match_conditions] == [
        ("replicaset-pods", MATCH_REPLICASET)]
    body = wait_for(lambda: (b := get_tuning(api_client, namespace, "qwen")).get(
        "status", {}).get("tuning", {}).get("tunedPods") == 2 and b, "status.tuning.tunedPods=2")
    assert body["status"]["tuning"]["outdatedPods"] == 0
    # Nothing in status moves while nothing changes (re-tuning runs every second here): a
    # field that did, a time say, would be an etcd write and a watch event every pass.
    time.sleep(3.5)
    assert get_tuning(api_client, namespace, "qwen")["metadata"]["resourceVersion"] == (
        body["metadata"]["resourceVersion"])


def test_a_pod_of_over_a_mebibyte_is_tuned(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """Its AdmissionReview passes aiohttp's default 1 MiB, which kopf's server keeps: it was
    answered 413, and the pod admitted untuned at every re-creation (re-tuning replaced it
    for that, again and again)."""
    create_tuning_first(api_client, namespace, operator, tuning("big", "big"))
    large = [{"name": "PROMPT_TEMPLATE", "value": "x" * 1_200_000}]
    create(api_client, namespace, deployment("big", env=large))
    (pod,) = wait_pods(api_client, namespace, "big", 1)
    assert pod.spec.containers[0].command[0] == LAUNCHER
    assert pod.metadata.labels["infertune.io/tuned-by"] == "big"


def test_pods_nobody_targets_are_left_alone(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    create_tuning_first(api_client, namespace, operator, tuning("qwen", "qwen"))
    create(api_client, namespace, deployment("other"))
    create(api_client, namespace, deployment("qwen"))
    pod = wait_pods(api_client, namespace, "other", 1)[0]
    assert pod.spec.init_containers is None
    assert pod.spec.containers[0].command[0] == "vllm"
    assert REVISION not in (pod.metadata.labels or {})
    # The webhook saw the tuning: its own Deployment's pod, beside it, is tuned.
    targeted = wait_pods(api_client, namespace, "qwen", 1)[0]
    assert REVISION in targeted.metadata.labels


def test_dry_run_pods_only_carry_the_plan(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    create_tuning_first(api_client, namespace, operator, tuning("qwen", "qwen", mode="DryRun"))
    create(api_client, namespace, deployment("qwen"))
    pod = wait_pods(api_client, namespace, "qwen", 1)[0]
    assert pod.spec.init_containers is None
    assert pod.spec.containers[0].command[0] == "vllm"
    plan = json.loads(pod.metadata.annotations["infertune.io/dry-run-plan"])
    assert any(op["path"] == "/spec/containers/0/command" for op in plan["patch"])


def test_a_trial_beside_the_tuning_in_force_leaves_it_the_pods(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """DESIGN.md #7: a trial (mode DryRun) changes nothing. Made beside the tuning in force,
    it was a second tuning of the Deployment: every new pod came up untuned, and re-tuning
    stopped. The pods stay the one in force's, and the trial says so."""
    create_tuning_first(api_client, namespace, operator, tuning("qwen", "qwen"))
    create_tuning_first(api_client, namespace, operator,
                        tuning("qwen-trial", "qwen", mode="DryRun", memory={"high": "6Gi"}))
    create(api_client, namespace, deployment("qwen", replicas=2))
    pods = wait_pods(api_client, namespace, "qwen", 2)
    for pod in pods:
        assert pod.metadata.labels["infertune.io/tuned-by"] == "qwen"
        assert [c.name for c in pod.spec.init_containers] == ["infertune-launcher"]
        assert "infertune.io/dry-run-plan" not in (pod.metadata.annotations or {})
    def trial_says() -> str | None:
        said = str(((get_tuning(api_client, namespace, "qwen-trial").get("status") or {})
                    .get("tuning") or {}).get("message"))
        return said if "tuned by InferenceTuning qwen" in said else None

    assert wait_for(trial_says, "the trial's status.tuning naming qwen") == (
        "dry run: 2 pods outdated, none replaced; the pods are tuned by InferenceTuning qwen "
        "(mode Enforce): this trial reports its plan here and does not annotate them")
    live = wait_for(lambda: (b := get_tuning(api_client, namespace, "qwen")).get(
        "status", {}).get("tuning", {}).get("tunedPods") == 2 and b, "qwen tunes both pods")
    assert live["status"]["tuning"]["outdatedPods"] == 0


def test_a_tuning_the_pod_cannot_take_admits_it_unchanged_and_says_why(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    create_tuning_first(api_client, namespace, operator,
                        tuning("qwen", "qwen", memory={"high": "9Gi"}))  # limit 8Gi
    create(api_client, namespace, deployment("qwen"))
    pod = wait_pods(api_client, namespace, "qwen", 1)[0]
    assert pod.spec.init_containers is None and REVISION not in pod.metadata.labels
    warning = wait_for(lambda: [e for e in events_for(api_client, namespace, "qwen")
                                if e.reason == "PodNotTuned"], "a PodNotTuned Event")
    assert "spec.memory.high: 9Gi is above the memory limit 8Gi" in warning[0].message


def test_pods_of_a_namespace_with_a_limit_range_are_tuned_within_it(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """LimitRanger fills in its defaults before the webhooks and checks every container after
    them: the launcher's init container under the namespace's min made a pod the API server
    refused, so the ReplicaSet could create no pod at all."""
    client.CoreV1Api(api_client).create_namespaced_limit_range(namespace, {
        "metadata": {"name": "floor"}, "spec": {"limits": [{
            "type": "Container", "min": {"cpu": "100m", "memory": "128Mi"}}]}})
    create_tuning_first(api_client, namespace, operator, tuning("qwen", "qwen"))
    create(api_client, namespace, deployment("qwen"))
    pod = wait_pods(api_client, namespace, "qwen", 1)[0]
    (init,) = pod.spec.init_containers
    assert init.name == "infertune-launcher"
    assert init.resources.requests == init.resources.limits == {"cpu": "100m",
                                                                 "memory": "128Mi"}
    assert pod.spec.containers[0].command[0] == LAUNCHER


def test_a_limit_range_default_gives_the_launcher_no_gpu(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """LimitRanger fills its defaults into containers again after the webhook changed the
    pod: the init container got the max as its GPU limit, and a pod that asked for one GPU
    held eight."""
    client.CoreV1Api(api_client).create_namespaced_limit_range(namespace, {
        "metadata": {"name": "gpus"}, "spec": {"limits": [{
            "type": "Container", "max": {"nvidia.com/gpu": "8"}}]}})
    create_tuning_first(api_client, namespace, operator, tuning("qwen", "qwen"))
    create(api_client, namespace, deployment("qwen"))
    pod = wait_pods(api_client, namespace, "qwen", 1)[0]
    (init,) = pod.spec.init_containers
    assert init.name == "infertune-launcher"
    assert init.resources.requests["nvidia.com/gpu"] == "0"
    assert init.resources.limits["nvidia.com/gpu"] == "0"
    assert pod.spec.containers[0].command[0] == LAUNCHER


def test_pods_of_an_invalid_edit_are_tuned_as_the_last_valid_spec_said(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """An edit the operator refuses (a cross-field rule: min above max) that the API server
    stored, while the admission check was not there (the operator down: its failurePolicy
    is Ignore): new pods were admitted untuned while the tuning said InvalidSpec, and a
    scale-out brought back pods without their binding and allocator."""
    create_tuning_first(api_client, namespace, operator,
                        tuning("qwen", "qwen", memory={"high": "6Gi"}))
    wait_for(lambda: get_tuning(api_client, namespace, "qwen")["status"].get("appliedSpec"),
             "status.appliedSpec")
    with without_the_check(api_client, namespace):
        client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "qwen", {"spec": {
                "memory": {"high": "7Gi"}, "autoscaling": {"minReplicas": 5, "maxReplicas": 3}}})

    def invalid() -> str | None:
        status = get_tuning(api_client, namespace, "qwen").get("status", {})
        ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
        return ready.get("message") if ready.get("reason") == "InvalidSpec" else None

    message = wait_for(invalid, "Ready=False InvalidSpec")
    assert message.endswith("Meanwhile new pods are tuned as generation 1 of the spec said "
                            "(status.appliedSpec)"), message
    create(api_client, namespace, deployment("qwen"))
    pod = wait_pods(api_client, namespace, "qwen", 1)[0]
    assert pod.metadata.annotations["infertune.io/memory-high"] == str(6 * 2**30)
    assert pod.spec.containers[0].command[0] == LAUNCHER


def test_changed_tuning_re_creates_pods_by_eviction(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    create(api_client, namespace, deployment("qwen", replicas=2))
    before = {p.metadata.name for p in wait_pods(api_client, namespace, "qwen", 2)}
    # Pods that predate the tuning are outdated too: eviction brings them in.
    create(api_client, namespace, tuning("qwen", "qwen"))
    first = wait_pods(api_client, namespace, "qwen", 2,
                      check=lambda p: REVISION in (p.metadata.labels or {}))
    assert before.isdisjoint(p.metadata.name for p in first)
    old_revision = first[0].metadata.labels[REVISION]

    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "qwen",
        {"spec": {"allocator": {"type": "glibc", "arenaMax": 2}}})
    second = wait_pods(api_client, namespace, "qwen", 2,
                       check=lambda p: p.metadata.labels[REVISION] != old_revision)
    assert all(env_of(p)["MALLOC_ARENA_MAX"] == "2" for p in second)
    retuned = wait_for(lambda: [e for e in events_for(api_client, namespace, "qwen")
                                if e.reason == "PodsRetuned"], "a PodsRetuned Event")
    assert retuned[0].type == "Normal" and retuned[0].message.startswith("evicted ")


def test_a_memory_change_is_taken_by_the_running_pods_without_re_creating_them(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """memory.high is an intent in a pod annotation (the node agent writes it into the live
    cgroup): a change of spec.memory re-created every pod, a model load each, for it. The
    operator patches the annotation of the running pods instead, and says so."""
    create_tuning_first(api_client, namespace, operator,
                        tuning("qwen", "qwen", memory={"high": "6Gi"}))
    create(api_client, namespace, deployment("qwen", replicas=2))
    first = wait_pods(api_client, namespace, "qwen", 2,
                      check=lambda p: REVISION in (p.metadata.labels or {}))
    wait_for(lambda: get_tuning(api_client, namespace, "qwen").get("status", {}).get(
        "tuning", {}).get("tunedPods") == 2, "both pods counted as tuned")
    # As a release before the shape label left them: the operator labels them again.
    core = client.CoreV1Api(api_client)
    for pod in first:
        core.patch_namespaced_pod(pod.metadata.name, namespace, {"metadata": {
            "labels": {"infertune.io/shape": None},
            "annotations": {"infertune.io/serving-container": None}}})
    wait_pods(api_client, namespace, "qwen", 2, check=lambda p: (
        "infertune.io/shape" in p.metadata.labels
        and p.metadata.annotations.get("infertune.io/serving-container") == "vllm"))
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "qwen", {"spec": {"memory": {"high": "7Gi"}}})
    second = wait_pods(api_client, namespace, "qwen", 2, check=lambda p: (
        p.metadata.annotations["infertune.io/memory-high"] == str(7 * 2**30)))
    # The same pods, labelled with the new revision (spec.memory is in it: an operator from
    # before this change, after a rollback, finds them current too).
    assert {p.metadata.uid for p in second} == {p.metadata.uid for p in first}
    old_revision = first[0].metadata.labels[REVISION]

    def new_revision() -> str | None:
        status = get_tuning(api_client, namespace, "qwen").get("status", {})
        revision = status.get("tuning", {}).get("revision")
        return revision if revision not in (None, old_revision) else None

    revision = wait_for(new_revision, "the new revision in status.tuning")
    assert all(p.metadata.labels[REVISION] == revision for p in second)
    assert get_tuning(api_client, namespace, "qwen")["status"]["tuning"]["outdatedPods"] == 0
    updated = wait_for(lambda: [e for e in events_for(api_client, namespace, "qwen")
                                if e.reason == "MemoryHighUpdated"], "a MemoryHighUpdated Event")
    assert updated[0].type == "Normal" and "7.00Gi" in updated[0].message
    assert not [e for e in events_for(api_client, namespace, "qwen")
                if e.reason == "PodsRetuned"]
    # A pod the Deployment adds later is admitted with the new value.
    client.AppsV1Api(api_client).patch_namespaced_deployment_scale(
        "qwen", namespace, {"spec": {"replicas": 3}})
    third = wait_pods(api_client, namespace, "qwen", 3)
    assert all(p.metadata.annotations["infertune.io/memory-high"] == str(7 * 2**30)
               for p in third)


def test_the_documented_policy_keeps_the_operators_pod_updates_to_its_own_keys(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """The chart's operator-pod-updates policy, as the API server runs it: the operator's
    in-place change of spec.memory passes; any other change of a pod by its ServiceAccount
    (an image, another label or annotation) is refused, while other users are not held."""
    as_operator = client.ApiClient(api_client.configuration)
    as_operator.set_default_header(
        "Impersonate-User", f"system:serviceaccount:{OPERATOR_NAMESPACE}:{SERVICE_ACCOUNT}")
    pods = client.CoreV1Api(as_operator)
    with documented_policy(api_client, namespace, "operator-pod-updates.yaml"):
        create_tuning_first(api_client, namespace, operator,
                            tuning("qwen", "qwen", memory={"high": "6Gi"}))
        create(api_client, namespace, deployment("qwen", replicas=1))
        first = wait_pods(api_client, namespace, "qwen", 1,
                          check=lambda p: REVISION in (p.metadata.labels or {}))[0]
        name = first.metadata.name

        def in_force() -> bool:  # the API server applies a new policy a moment later
            try:
                pods.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": {
                    "e2e-probe": str(time.monotonic())}}})
            except ApiException as exc:
                return exc.status == 403 and "infertune operator may change only" in str(
                    exc.body)
            return False

        wait_for(in_force, "the policy in force")
        client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "qwen", {"spec": {"memory": {"high": "7Gi"}}})
        pod = wait_pods(api_client, namespace, "qwen", 1, check=lambda p: (
            p.metadata.annotations["infertune.io/memory-high"] == str(7 * 2**30)))[0]
        assert pod.metadata.uid == first.metadata.uid  # taken in place, under the policy

        def refused(body: dict[str, Any]) -> str:
            with pytest.raises(ApiException) as info:
                pods.patch_namespaced_pod(name, namespace, body)
            assert info.value.status == 403, info.value
            return str(info.value.body)

        assert "not its spec" in refused({"spec": {"containers": [
            {"name": pod.spec.containers[0].name, "image": "attacker/image:1"}]}})
        assert "not its other labels" in refused({"metadata": {"labels": {"app": "other"}}})
        assert "not its other labels" in refused({"metadata": {"labels": {"extra": "1"}}})
        assert "not its other annotations" in refused(
            {"metadata": {"annotations": {"example.com/other": "x"}}})
        assert "not its owner references or finalizers" in refused(
            {"metadata": {"ownerReferences": None}})
        assert "not its owner references or finalizers" in refused(
            {"metadata": {"finalizers": ["e2e.infertune.io/hold"]}})
        pods.patch_namespaced_pod(name, namespace, {"metadata": {
            "labels": {REVISION: "0123456789"},
            "annotations": {"infertune.io/memory-high": str(6 * 2**30)}}})
        pods.patch_namespaced_pod(name, namespace, {"metadata": {
            "annotations": {"infertune.io/memory-high": None}}})  # memory.high at max
        # The shape and the serving container: added where missing (a pod tuned before
        # them), never changed nor removed.
        assert "not its other labels" in refused({"metadata": {"labels": {
            "infertune.io/shape": "0123456789"}}})
        assert "not its other labels" in refused({"metadata": {"labels": {
            "infertune.io/shape": None}}})
        assert "not its other annotations" in refused({"metadata": {"annotations": {
            "infertune.io/serving-container": "istio-proxy"}}})
        client.CoreV1Api(api_client).patch_namespaced_pod(name, namespace, {"metadata": {
            "labels": {"infertune.io/shape": None},
            "annotations": {"infertune.io/serving-container": None}}})
        pods.patch_namespaced_pod(name, namespace, {"metadata": {
            "labels": {"infertune.io/shape": "0123456789"},
            "annotations": {"infertune.io/serving-container": "vllm"}}})
        # Another user is not the policy's to hold (RBAC is); a pod the operator did not
        # tune is not the operator's to change at all.
        client.CoreV1Api(api_client).patch_namespaced_pod(
            name, namespace, {"metadata": {"labels": {"extra": "1"}}})
        client.CoreV1Api(api_client).create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare"},
            "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}})
        with pytest.raises(ApiException) as info:
            pods.patch_namespaced_pod("bare", namespace, {"metadata": {"annotations": {
                "infertune.io/memory-high": "1"}}})
        assert "may change only pods it tuned" in str(info.value.body)


def test_eviction_respects_the_pod_disruption_budget(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    # Two replicas: re-tuning itself never evicts the only Ready pod of a Deployment.
    create(api_client, namespace, deployment("qwen", replicas=2))
    wait_pods(api_client, namespace, "qwen", 2)
    client.PolicyV1Api(api_client).create_namespaced_pod_disruption_budget(namespace, {
        "metadata": {"name": "qwen"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "qwen"}}}})
    wait_for(lambda: client.PolicyV1Api(api_client).read_namespaced_pod_disruption_budget(
        "qwen", namespace).status.observed_generation, "the PDB observed by the controller")
    create(api_client, namespace, tuning("qwen", "qwen"))

    def refused() -> dict[str, Any] | None:
        status = get_tuning(api_client, namespace, "qwen").get("status", {})
        message = status.get("tuning", {}).get("message", "")
        return status if "PodDisruptionBudget" in message else None

    status = wait_for(refused, "a re-tuning held back by the PDB")
    assert status["tuning"]["outdatedPods"] == 2
    assert all(REVISION not in (p.metadata.labels or {})
               for p in pods_of(api_client, namespace, "qwen"))


def test_a_pod_whose_namespace_is_being_deleted_counts_as_evicted(
    api_client: client.ApiClient, namespace: str
) -> None:
    """The API server refuses every eviction in a namespace being deleted (403): it failed
    the whole MIG pass (and its drains) or re-tuning pass, while the pod goes with its
    namespace anyway."""
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": "held", "finalizers": ["e2e.infertune.io/hold"]},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    core.delete_namespace(namespace)
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="held",
                                                              namespace=namespace))

    def refused() -> bool:
        try:
            core.create_namespaced_pod_eviction("held", namespace, eviction)
        except ApiException as exc:
            return exc.status == 403 and "NamespaceTerminating" in str(exc.body)
        return False

    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    try:
        wait_for(refused, "evictions refused in the namespace being deleted")
        assert evict_pod(namespace, "held")
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
        core.patch_namespaced_pod("held", namespace, {"metadata": {"finalizers": None}})


def test_pod_template_annotation_strategy_rolls_the_deployment(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    create(api_client, namespace, deployment("qwen", replicas=1))
    wait_pods(api_client, namespace, "qwen", 1)
    rolled_out_by_template(api_client, namespace)


def rolled_out_by_template(api_client: client.ApiClient, namespace: str) -> Any:
    """Tune Deployment qwen (running) with retune.strategy PodTemplateAnnotation, and wait
    for its pod to come back with the revision the template carries; its template."""
    create(api_client, namespace, tuning("qwen", "qwen",
                                         retune={"strategy": "PodTemplateAnnotation"}))
    pods = wait_pods(api_client, namespace, "qwen", 1,
                     check=lambda p: REVISION in (p.metadata.labels or {}))
    template = client.AppsV1Api(api_client).read_namespaced_deployment(
        "qwen", namespace).spec.template
    assert template.metadata.annotations[REVISION] == pods[0].metadata.labels[REVISION]
    return template


def test_the_documented_policy_keeps_the_operators_deployment_updates_to_the_revision(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """The chart's operator-deployment-updates policy, as the API server runs it: the
    operator's PodTemplateAnnotation roll-out and its scale writes pass; any other change of a
    Deployment by its ServiceAccount (an image, a service account, replicas outside the scale
    subresource, a label) is refused, while other users are not held."""
    as_operator = client.ApiClient(api_client.configuration)
    as_operator.set_default_header(
        "Impersonate-User", f"system:serviceaccount:{OPERATOR_NAMESPACE}:{SERVICE_ACCOUNT}")
    apps = client.AppsV1Api(as_operator)
    with documented_policy(api_client, namespace, "operator-deployment-updates.yaml"):
        create(api_client, namespace, deployment("qwen", replicas=1))
        wait_pods(api_client, namespace, "qwen", 1)

        def refused(body: dict[str, Any]) -> str | None:
            try:
                apps.patch_namespaced_deployment("qwen", namespace, body)
            except ApiException as exc:
                assert exc.status == 403, exc
                return str(exc.body)
            return None

        wait_for(lambda: refused({"metadata": {"annotations": {
            "e2e-probe": str(time.monotonic())}}}), "the policy in force")
        spec = rolled_out_by_template(api_client, namespace).spec
        said = refused({"spec": {"template": {"spec": {"containers": [
            {"name": spec.containers[0].name, "image": "attacker/image:1"}]}}}})
        assert said is not None and "not the template's spec or labels" in said, said
        said = refused({"spec": {"template": {"spec": {"serviceAccountName": "admin"}}}})
        assert said is not None and "not the template's spec or labels" in said, said
        said = refused({"spec": {"template": {"metadata": {"labels": {"extra": "1"}}}}})
        assert said is not None and "not the template's spec or labels" in said, said
        said = refused({"spec": {"template": {"metadata": {"annotations": {
            "example.com/other": "x"}}}}})
        assert said is not None and "not its other annotations" in said, said
        said = refused({"spec": {"replicas": 5}})
        assert said is not None and "not the rest of its spec" in said, said
        said = refused({"spec": {"template": {"metadata": {"finalizers": ["e2e.io/hold"]}}}})
        assert said is not None and "not the template's finalizers" in said, said
        said = refused({"metadata": {"labels": {"extra": "1"}}})
        assert said is not None and "not the Deployment's labels" in said, said
        # What the operator does: the revision on the template, and replicas through scale.
        assert refused({"spec": {"template": {"metadata": {"annotations": {
            REVISION: "0123456789"}}}}}) is None
        apps.patch_namespaced_deployment_scale("qwen", namespace, {"spec": {"replicas": 2}})
        # Another user is not the policy's to hold.
        client.AppsV1Api(api_client).patch_namespaced_deployment(
            "qwen", namespace, {"metadata": {"labels": {"extra": "1"}}})


def test_webhook_never_sees_system_namespaces(
    api_client: client.ApiClient, operator: OperatorProcess
) -> None:
    config = client.AdmissionregistrationV1Api(api_client).read_mutating_webhook_configuration(
        "infertune-pod-tuning")
    hook = config.webhooks[0]
    assert hook.failure_policy == "Ignore"
    expression = hook.namespace_selector.match_expressions[0]
    assert expression.operator == "NotIn"
    assert {"kube-system", "infertune-system"} <= set(expression.values)


def test_a_registration_another_process_removed_is_made_again(
    api_client: client.ApiClient, operator: OperatorProcess
) -> None:
    """An operator process that stops removes the configuration it registered last, though
    another may still serve (the new pod of a rolled-back upgrade): nothing registered it
    again, and every pod was admitted untuned until the old one restarted."""
    admission = client.AdmissionregistrationV1Api(api_client)
    before = admission.read_mutating_webhook_configuration("infertune-pod-tuning")
    admission.delete_mutating_webhook_configuration("infertune-pod-tuning")
    # Checked every 2 s by the operator under test (30 s by default).
    back = wait_for(lambda: exists(lambda: admission.read_mutating_webhook_configuration(
        "infertune-pod-tuning")) and admission.read_mutating_webhook_configuration(
        "infertune-pod-tuning"), "the registration made again", timeout_s=20)
    assert back.webhooks[0].client_config == before.webhooks[0].client_config
    operator.check_running()


def test_a_namespaced_operators_registration_is_valid_to_the_api_server(
    api_client: client.ApiClient
) -> None:
    """`run --namespace team-a --namespace team-b` registers for those namespaces' pods only;
    the API server validates the selector (dry run: the session operator's stays)."""
    body = WebhookRegistration(excluded_namespaces=("kube-system", "infertune-system"),
                               included_namespaces=("team-b", "team-a")).body(
        {"url": "https://127.0.0.1:9443"})
    body["metadata"]["name"] = "infertune-namespaced-dry-run"
    created = client.AdmissionregistrationV1Api(api_client).create_mutating_webhook_configuration(
        body, dry_run="All")
    expressions = created.webhooks[0].namespace_selector.match_expressions
    assert [(e.key, e.operator, e.values) for e in expressions] == [
        ("kubernetes.io/metadata.name", "NotIn", ["infertune-system", "kube-system"]),
        ("kubernetes.io/metadata.name", "In", ["team-a", "team-b"])]


def test_a_stopping_operator_leaves_the_registration_its_successor_made(
    api_client: client.ApiClient
) -> None:
    """A rolling upgrade: the new operator registers before the old one stops. The old one
    used to delete the configuration on its way out, and every pod after that was admitted
    untuned until the next restart. With cert-manager both register the same clientConfig,
    so only the annotation tells them apart. (Under a name of its own: the session operator's
    registration stays.)"""
    kopf_config = {"url": "https://127.0.0.1:9443", "caBundle": "Q0E="}
    old, new = (WebhookRegistration(excluded_namespaces=("kube-system",),
                                    name="infertune-e2e-handover") for _ in range(2))
    admission = client.AdmissionregistrationV1Api(api_client)
    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    try:
        old.apply(kopf_config)
        new.apply(kopf_config)
        assert old.remove() is False
        stored = admission.read_mutating_webhook_configuration("infertune-e2e-handover")
        assert stored.metadata.annotations[REGISTERED_BY] == new.owner
        assert new.remove() is True
        assert not exists(lambda: admission.read_mutating_webhook_configuration(
            "infertune-e2e-handover"))
        assert new.remove() is False  # nothing left to remove
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
        if exists(lambda: admission.read_mutating_webhook_configuration(
                "infertune-e2e-handover")):
            admission.delete_mutating_webhook_configuration("infertune-e2e-handover")


def test_a_registration_left_by_a_local_run_is_replaced_by_the_charts(
    api_client: client.ApiClient
) -> None:
    """`infertune run` outside the cluster registers a url; the chart's operator a service.
    Patched, the two clientConfigs merged, the API server refused the configuration (exactly
    one of url and service), and the chart's operator stopped at every start."""
    name = "infertune-e2e-url-then-service"
    local = WebhookRegistration(excluded_namespaces=("kube-system",), name=name)
    chart = WebhookRegistration(excluded_namespaces=("kube-system",), name=name,
                                service=("infertune-system", "infertune-webhook", 443))
    admission = client.AdmissionregistrationV1Api(api_client)
    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    try:
        local.apply({"url": "https://192.0.2.2:9443", "caBundle": "Q0E="})
        chart.apply({"url": "https://0.0.0.0:9443", "caBundle": "Q0I="})
        hooks = admission.read_mutating_webhook_configuration(name).webhooks
        assert len(hooks) == 2  # the pods' and the tunings' check
        for webhook in hooks:
            assert webhook.client_config.url is None
            assert webhook.client_config.service.name == "infertune-webhook"
            assert webhook.client_config.ca_bundle == "Q0I="
        local.apply({"url": "https://192.0.2.2:9443", "caBundle": "Q0E="})  # and back
        hooks = admission.read_mutating_webhook_configuration(name).webhooks
        assert {w.name: (w.client_config.service, w.client_config.url) for w in hooks} == {
            "pods.infertune.io": (None, "https://192.0.2.2:9443/tune-pods"),
            "inferencetunings.infertune.io": (None, "https://192.0.2.2:9443/check-tunings")}
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
        if exists(lambda: admission.read_mutating_webhook_configuration(name)):
            admission.delete_mutating_webhook_configuration(name)

def test_an_upgrade_keeps_the_old_pods_ca_trusted_next_to_the_new_ones(
    api_client: client.ApiClient, tmp_path: Path
) -> None:
    """Two operator pods of a rolling upgrade, each with a self-signed certificate, behind
    one Service: the new one's registration keeps the old one's CA in the bundle (the old
    pod still answers for a few seconds); with only the new CA, those admission calls failed
    and the pods were admitted untuned."""
    name = "infertune-e2e-upgrade-ca"
    service = ("infertune-system", "infertune-webhook", 443)
    old, new = (WebhookRegistration(excluded_namespaces=("kube-system",), name=name,
                                    service=service) for _ in range(2))
    bundles = []
    for i in (1, 2):
        cert, _ = write_self_signed(tmp_path / str(i), ["infertune-webhook.infertune-system.svc"])
        bundles.append(base64.b64encode(cert.read_bytes()).decode())
    admission = client.AdmissionregistrationV1Api(api_client)
    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    try:
        old.apply({"url": "https://0.0.0.0:9443", "caBundle": bundles[0]})
        new.apply({"url": "https://0.0.0.0:9443", "caBundle": bundles[1]})
        wanted = [x509.load_pem_x509_certificate(base64.b64decode(b)) for b in bundles]
        for webhook in admission.read_mutating_webhook_configuration(name).webhooks:
            trusted = x509.load_pem_x509_certificates(
                base64.b64decode(webhook.client_config.ca_bundle))
            assert trusted == [wanted[1], wanted[0]], webhook.name
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
        if exists(lambda: admission.read_mutating_webhook_configuration(name)):
            admission.delete_mutating_webhook_configuration(name)

def test_a_pod_that_puts_its_ca_back_leaves_the_registration_to_its_successor(
    api_client: client.ApiClient, tmp_path: Path
) -> None:
    """The serving pod's CA pushed out of the bundle (new pods that crashed and started again,
    each with a CA): its check puts it back. It took over the registration doing so, and when
    it stopped at the end of the upgrade it removed the configuration its successor served
    by: nothing was registered, and pods were admitted untuned until the successor's check."""
    name = "infertune-e2e-ca-back"
    service = ("infertune-system", "infertune-webhook", 443)
    starts = OTHER_CAS + 2  # the serving one, then enough to push its CA out
    serving, *restarts = (WebhookRegistration(excluded_namespaces=("kube-system",), name=name,
                                              service=service) for _ in range(starts))
    bundles = []
    for i in range(starts):
        cert, _ = write_self_signed(tmp_path / str(i), ["infertune-webhook.infertune-system.svc"])
        bundles.append({"url": "https://0.0.0.0:9443",
                        "caBundle": base64.b64encode(cert.read_bytes()).decode()})
    admission = client.AdmissionregistrationV1Api(api_client)
    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    try:
        serving.apply(bundles[0])
        for registration, config in zip(restarts, bundles[1:], strict=True):
            registration.apply(config)  # each start of the new pod: its own CA
        assert not serving.still_registered(bundles[0])  # pushed out (OTHER_CAS)
        serving.apply(bundles[0], keep_owner=True)  # its check puts it back
        assert serving.still_registered(bundles[0])
        assert restarts[-1].still_registered(bundles[-1])
        assert not serving.remove()  # it stops: the successor's registration stays
        assert exists(lambda: admission.read_mutating_webhook_configuration(name))
        assert restarts[-1].remove()
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]
        if exists(lambda: admission.read_mutating_webhook_configuration(name)):
            admission.delete_mutating_webhook_configuration(name)


def test_a_pod_without_command_is_reported_in_status_and_events(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    body = deployment("qwen")
    del body["spec"]["template"]["spec"]["containers"][0]["command"]
    create_tuning_first(api_client, namespace, operator, tuning("qwen", "qwen"))
    create(api_client, namespace, body)
    pod = wait_pods(api_client, namespace, "qwen", 1)[0]
    assert pod.spec.init_containers is None and pod.spec.containers[0].command is None
    assert "LD_PRELOAD" in env_of(pod)  # the allocator does not need the command

    def reported() -> list[str] | None:
        problems = get_tuning(api_client, namespace, "qwen").get("status", {}).get(
            "tuning", {}).get("problems", [])
        return problems if any("has no command" in p for p in problems) else None

    wait_for(reported, "status.tuning.problems naming the missing command")
    wait_for(lambda: [e for e in events_for(api_client, namespace, "qwen")
                      if e.reason == "PodPartlyTuned" and "has no command" in e.message],
             "a PodPartlyTuned Event")
