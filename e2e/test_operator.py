"""The operator itself, as a real process against the real control plane.

It applies the CRD from crds/, runs `infertune run` with the chart's RBAC rules, and checks
what a user sees: status with observedGeneration, the Ready / DryRun conditions, Events, and
the printer columns of `kubectl get itune`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.fixtures.access import Kubectl, column
from e2e.fixtures.admission import without_the_check
from e2e.fixtures.operator import OperatorProcess
from e2e.fixtures.rbac import REPO_ROOT
from e2e.fixtures.waiting import wait_for
from infertune.api.spec import InferenceTuning

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "infertune.io", "v1alpha1", "inferencetunings"


def deployment(name: str, replicas: int = 1, **container: Any) -> dict[str, Any]:
    serving = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
               "command": ["vllm", "serve", "Qwen/Qwen2-7B-Instruct"],
               "resources": {"requests": {"cpu": "2", "memory": "8Gi"},
                             "limits": {"cpu": "2", "memory": "8Gi"}}}
    serving.update(container)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [serving]}}},
    }


def tuning(name: str, target: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceTuning",
            "metadata": {"name": name},
            "spec": {"targetRef": {"name": target}, "engine": "vllm", **spec}}


def get_tuning(api_client: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    body: dict[str, Any] = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name)
    return body


def delete_tuning_and_wait(api_client: client.ApiClient, namespace: str, name: str,
                           what: str, timeout_s: float) -> None:
    """Delete the tuning and wait until the API server no longer has it (the operator's
    finalizer removed)."""
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name)

    def gone() -> bool:
        try:
            get_tuning(api_client, namespace, name)
        except ApiException as error:
            return error.status == 404
        return False

    wait_for(gone, what, timeout_s=timeout_s)


def condition(body: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (body.get("status") or {}).get("conditions", [])
                 if c["type"] == kind), None)


def wait_observed(api_client: client.ApiClient, namespace: str, name: str, operator:
                  OperatorProcess, kind: str = "Ready", status: str = "True",
                  timeout_s: float = 30) -> dict[str, Any]:
    """Wait until status reflects the current generation with condition `kind` = `status`."""
    def observed() -> dict[str, Any] | None:
        operator.check_running()
        body = get_tuning(api_client, namespace, name)
        found = condition(body, kind)
        current = (body.get("status") or {}).get("observedGeneration") == (
            body["metadata"]["generation"])
        ok = current and found is not None and found["status"] == status
        return body if ok else None

    try:
        return wait_for(observed, f"{namespace}/{name} {kind}={status}", timeout_s=timeout_s)
    except AssertionError as error:
        raise AssertionError(f"{error}\noperator log:\n{operator.tail()}") from None


def events_for(api_client: client.ApiClient, namespace: str, name: str) -> list[Any]:
    events = client.CoreV1Api(api_client).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},involvedObject.kind="
        "InferenceTuning")
    return list(events.items)


def create(api_client: client.ApiClient, namespace: str, body: dict[str, Any]) -> None:
    if body["kind"] == "Deployment":
        client.AppsV1Api(api_client).create_namespaced_deployment(namespace, body)
    else:
        client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body)


def test_operator_reports_status_condition_and_event(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, kubectl: Kubectl
) -> None:
    create(api_client, namespace, deployment("qwen"))
    create(api_client, namespace, tuning("qwen", "qwen", autoscaling={"maxReplicas": 4}))
    body = wait_observed(api_client, namespace, "qwen", operator)
    ready = condition(body, "Ready")
    assert ready is not None and ready["reason"] == "Accepted"
    assert ready["observedGeneration"] == body["metadata"]["generation"]
    assert body["status"]["phase"] == "Active"
    assert condition(body, "DryRun")["status"] == "False"  # type: ignore[index]
    # Server-side defaults from the CRD reached the stored object.
    assert body["spec"]["autoscaling"]["queue"] == {"targetPerReplica": 32, "sustain": "30s"}
    assert body["spec"]["mode"] == "Enforce"

    accepted = wait_for(lambda: [e for e in events_for(api_client, namespace, "qwen")
                                 if e.reason == "Accepted"], "an Accepted Event")
    assert accepted[0].type == "Normal" and "Deployment qwen" in accepted[0].message

    table = kubectl("get", "itune", "-n", namespace).stdout
    header = table.splitlines()[0].split()
    assert header == ["NAME", "TARGET", "MODE", "PHASE", "SCALING", "REPLICAS", "LATENCY",
                      "QUEUE", "CANARY", "AGE"]
    assert [column(table, name) for name in ("NAME", "TARGET", "MODE", "PHASE", "REPLICAS")] == [
        "qwen", "qwen", "Enforce", "Active", "1"], table


def test_spec_change_moves_observed_generation(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    create(api_client, namespace, deployment("qwen"))
    create(api_client, namespace, tuning("qwen", "qwen"))
    wait_observed(api_client, namespace, "qwen", operator)
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "qwen", {"spec": {"mode": "DryRun"}})
    body = wait_observed(api_client, namespace, "qwen", operator, kind="DryRun")
    assert body["metadata"]["generation"] == 2
    assert body["status"]["phase"] == "DryRun"
    actions = [d["action"] for d in body["status"]["decisions"]]
    assert actions == ["generation 1: Accepted", "generation 2: Accepted"]


def test_missing_target_is_reported_then_found(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    create(api_client, namespace, tuning("late", "late"))
    body = wait_observed(api_client, namespace, "late", operator, status="False")
    assert condition(body, "Ready")["reason"] == "TargetNotFound"  # type: ignore[index]
    assert body["status"]["phase"] == "Pending"
    wait_for(lambda: [e for e in events_for(api_client, namespace, "late")
                      if e.reason == "TargetNotFound" and e.type == "Warning"],
             "a TargetNotFound warning Event")
    create(api_client, namespace, deployment("late"))
    # The operator looks again every 15 s.
    wait_observed(api_client, namespace, "late", operator, timeout_s=45)


def test_a_target_deleted_later_is_reported_and_its_return_too(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """The reconcile handler runs when the tuning changes; Ready used to stay True after the
    Deployment was deleted. The operator watches target Deployments for that (and for their
    return), without retries on a timer."""
    create(api_client, namespace, deployment("qwen"))
    create(api_client, namespace, tuning("qwen", "qwen"))
    wait_observed(api_client, namespace, "qwen", operator)
    client.AppsV1Api(api_client).delete_namespaced_deployment("qwen", namespace)
    gone = wait_observed(api_client, namespace, "qwen", operator, status="False", timeout_s=15)
    assert condition(gone, "Ready")["reason"] == "TargetNotFound"  # type: ignore[index]
    assert gone["status"]["phase"] == "Pending"
    create(api_client, namespace, deployment("qwen"))
    back = wait_observed(api_client, namespace, "qwen", operator, timeout_s=10)  # not 15 s
    assert condition(back, "Ready")["reason"] == "Accepted"  # type: ignore[index]
    reasons = [d["action"] for d in back["status"]["decisions"]]
    assert reasons[-2:] == ["generation 1: TargetNotFound", "generation 1: Accepted"], reasons


def test_renaming_the_container_in_the_deployment_settles_spec_container(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """Ready stayed ContainerNotFound after the Deployment was fixed, until the tuning itself
    changed; and Accepted after the container was renamed away."""
    create(api_client, namespace, deployment("qwen"))
    create(api_client, namespace, tuning("qwen", "qwen", container="engine"))
    missing = wait_observed(api_client, namespace, "qwen", operator, status="False")
    assert condition(missing, "Ready")["reason"] == "ContainerNotFound"  # type: ignore[index]
    apps = client.AppsV1Api(api_client)

    def rename(name: str) -> None:
        body = apps.read_namespaced_deployment("qwen", namespace)
        body.spec.template.spec.containers[0].name = name
        apps.replace_namespaced_deployment("qwen", namespace, body)

    rename("engine")
    fixed = wait_observed(api_client, namespace, "qwen", operator, timeout_s=15)
    assert condition(fixed, "Ready")["reason"] == "Accepted"  # type: ignore[index]
    rename("vllm")
    again = wait_observed(api_client, namespace, "qwen", operator, status="False",
                          timeout_s=15)
    assert condition(again, "Ready")["reason"] == "ContainerNotFound"  # type: ignore[index]


def test_examples_pass_the_api_servers_own_validation(
    operator: OperatorProcess, kubectl: Kubectl, namespace: str
) -> None:
    for example in sorted((REPO_ROOT / "examples").glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(example.read_text()) if d]
        for doc in docs:
            doc["metadata"].pop("namespace", None)  # into the test's namespace
        result = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                         input=yaml.safe_dump_all(docs), check=False)
        assert result.returncode == 0, (example.name, result.stderr)
        assert "created (server dry run)" in result.stdout, (example.name, result.stdout)


def read_by_both(kubectl: Kubectl, namespace: str, manifest: Path) -> tuple[
        subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """The API server's dry run of `manifest` through kubectl, and `infertune validate` of it."""
    server = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(manifest),
                     check=False)
    ours = subprocess.run([sys.executable, "-m", "infertune", "validate", str(manifest)],
                          capture_output=True, text=True, check=False)
    return server, ours


@pytest.mark.parametrize(("autoscaling", "refused"), [
    ({"minReplicas": "2"}, True),
    ({"minReplicas": True}, True),
    ({"enabled": "yes"}, True),
    ({"tolerance": "0.2"}, True),
    ({"maxReplicas": 4.0}, False),  # an integral float is an integer to both
    ({"tolerance": 0}, False),
    ({"minReplicas": None, "scaleUp": {"pods": None}}, False),  # pruned: the default
])
def test_validate_takes_numbers_flags_and_nulls_as_the_api_server_does(
    operator: OperatorProcess, kubectl: Kubectl, namespace: str, tmp_path: Path,
    autoscaling: dict[str, Any], refused: bool
) -> None:
    """`infertune validate` is the check before a GitOps sync: what it passes, the API
    server takes, and what the API server refuses, it refuses too."""
    doc = tuning("lax", "qwen", autoscaling=autoscaling)
    manifest = tmp_path / "lax.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    server, ours = read_by_both(kubectl, namespace, manifest)
    assert (server.returncode != 0) is refused, server.stderr
    assert (ours.returncode != 0) is refused, ours.stdout + ours.stderr
    if refused:
        field = f"spec.autoscaling.{next(iter(autoscaling))}"
        assert field in server.stderr and field in ours.stderr, (server.stderr, ours.stderr)


@pytest.mark.parametrize(("high", "refused"), [
    # Each matched controller-gen's quantity pattern, so the API server stored it and the
    # operator then refused the tuning (InvalidSpec) after the GitOps sync had passed.
    ("-1Gi", True), ("3e1.5", True), ("30000000000e", True), ("0" * 61 + "28Gi", True),
    ("0" * 60 + "28Gi", False), ("3e10", False), ("+28Gi", False), ("28.5Gi", False),
    ("30000000000", False),
])
def test_validate_takes_quantities_as_the_api_server_does(
    operator: OperatorProcess, kubectl: Kubectl, namespace: str, tmp_path: Path, high: str,
    refused: bool
) -> None:
    manifest = tmp_path / "q.yaml"
    manifest.write_text(yaml.safe_dump(tuning("q", "qwen", memory={"high": high})))
    server, ours = read_by_both(kubectl, namespace, manifest)
    assert (server.returncode != 0) is refused, server.stdout + server.stderr
    assert (ours.returncode != 0) is refused, ours.stdout + ours.stderr
    if refused:
        assert "spec.memory.high" in server.stderr and "spec.memory.high" in ours.stderr, (
            server.stderr, ours.stderr)


@pytest.mark.parametrize(("spec", "refused"), [
    ("  targetRef: {name: qwen}\n  container: n\n", True),  # false to both
    ("  targetRef: {name: qwen}\n  autoscaling: {maxReplicas: 1:30}\n", True),  # a string
    ("  targetRef: {name: qwen}\n  autoscaling: {maxReplicas: 1e3, tolerance: +.5}\n", False),
    ("  targetRef: {name: 2024-01-01}\n  autoscaling: {maxReplicas: 0X1F}\n", False),
])
def test_validate_reads_yaml_as_kubectl_does(
    operator: OperatorProcess, kubectl: Kubectl, namespace: str, tmp_path: Path, spec: str,
    refused: bool
) -> None:
    """The same text, read by kubectl (sigs.k8s.io/yaml) and by validate: both accept it, or
    both refuse it."""
    manifest = tmp_path / "t.yaml"
    manifest.write_text(f"apiVersion: {GROUP}/{VERSION}\nkind: InferenceTuning\n"
                        f"metadata:\n  name: t\nspec:\n  engine: vllm\n{spec}")
    server, ours = read_by_both(kubectl, namespace, manifest)
    assert (server.returncode != 0) is refused, server.stderr
    assert (ours.returncode != 0) is refused, ours.stderr


@pytest.mark.parametrize(("path", "refused"), [('"\\/usr\\/lib\\/libjemalloc.so.2"', True),
                                              ('"\\x2Fusr/lib/libjemalloc.so.2"', False)])
def test_validate_reads_escapes_as_kubectl_does(
    operator: OperatorProcess, kubectl: Kubectl, namespace: str, tmp_path: Path, path: str,
    refused: bool
) -> None:
    """"\\/" is JSON's escape and YAML 1.2's, not YAML 1.1's: kubectl (go-yaml v2) refuses
    it, and validate read it as "/"."""
    manifest = tmp_path / "t.yaml"
    manifest.write_text(f"apiVersion: {GROUP}/{VERSION}\nkind: InferenceTuning\n"
                        "metadata:\n  name: t\nspec:\n  engine: vllm\n  targetRef: {name: qwen}\n"
                        f"  allocator: {{libraryPath: {path}}}\n")
    server, ours = read_by_both(kubectl, namespace, manifest)
    assert (server.returncode != 0) is refused, server.stderr
    assert (ours.returncode != 0) is refused, ours.stderr


@pytest.mark.parametrize("directive", ["%YAML 1.2", "%YAML 1.1",
                                       "%TAG !e! tag:example.com,2000:app/"])
def test_validate_refuses_yaml_directives_as_kubectl_does(
    operator: OperatorProcess, kubectl: Kubectl, namespace: str, tmp_path: Path,
    directive: str
) -> None:
    """kubectl splits a file on '---' lines and refuses the part that holds only the
    directive; validate passed the file."""
    manifest = tmp_path / "t.yaml"
    manifest.write_text(f"{directive}\n---\napiVersion: {GROUP}/{VERSION}\n"
                        "kind: InferenceTuning\nmetadata:\n  name: t\nspec:\n  engine: vllm\n"
                        "  targetRef: {name: qwen}\n")
    server, ours = read_by_both(kubectl, namespace, manifest)
    assert server.returncode != 0, server.stdout
    assert ours.returncode != 0 and "a YAML directive" in ours.stderr, ours.stderr


def test_api_server_rejects_what_the_schema_forbids(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    with pytest.raises(ApiException) as info:
        create(api_client, namespace, tuning("bad", "qwen", mode="dryrun",
                                             numa={"policy": "everywhere"}))
    assert info.value.status == 422
    assert "spec.mode" in info.value.body and "spec.numa.policy" in info.value.body
    # A quantity the operator cannot read is refused at apply, as Kubernetes' own are: taken,
    # it made the tuning InvalidSpec after the GitOps sync had passed.
    with pytest.raises(ApiException) as info:
        create(api_client, namespace, tuning("bad", "qwen", memory={"high": "28GB"}))
    assert info.value.status == 422 and "spec.memory.high" in info.value.body
    # A negative quantity written as a number, which the pattern (strings only) let through:
    # refused by the schema itself, without the operator's check (as while it is down).
    with without_the_check(api_client, namespace), pytest.raises(ApiException) as info:
        create(api_client, namespace, tuning("bad", "qwen", memory={"minHeadroom": -1}))
    assert info.value.status == 422 and "spec.memory.minHeadroom" in info.value.body
    assert "greater than or equal to 0" in info.value.body, info.value.body
    create(api_client, namespace, tuning("good", "qwen", memory={"high": "28Gi",
                                                                 "minHeadroom": 1000000}))


POLICIES = REPO_ROOT / "charts" / "infertune" / "files" / "policies"
"""The ValidatingAdmissionPolicies the chart installs with `policies.*` (README.md)."""


@contextmanager
def documented_policy(api_client: client.ApiClient, namespace: str,
                      filename: str) -> Iterator[None]:
    """The ValidatingAdmissionPolicy of the chart's files/policies/`filename` and its
    binding, in force while the block runs: named for the test and bound to its namespace
    only, so that other tests are not affected. The API server applies it a moment after it
    is made."""
    policy, binding = yaml.safe_load_all((POLICIES / filename).read_text())
    suffix = f"-{namespace}"
    policy["metadata"]["name"] += suffix
    binding["metadata"]["name"] += suffix
    binding["spec"]["policyName"] += suffix
    binding["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": namespace}}}
    admission = client.AdmissionregistrationV1Api(api_client)
    admission.create_validating_admission_policy(policy)
    try:
        admission.create_validating_admission_policy_binding(binding)
        try:
            yield
        finally:
            admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
    finally:
        admission.delete_validating_admission_policy(policy["metadata"]["name"])


def test_the_documented_policy_keeps_spec_mig_to_the_namespaces_allowed(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """The chart's mig-namespaces policy, as the API server runs it: a tuning with spec.mig
    is refused in a namespace not labelled infertune.io/mig=allowed, and taken in one that is."""
    # One made before the policy: it must still take updates that leave spec.mig alone (its
    # finalizer's removal), or it stays Terminating for good.
    create(api_client, namespace, tuning("before", "qwen", mode="DryRun",
                                         mig={"profile": "3g.71gb"}))
    with documented_policy(api_client, namespace, "mig-namespaces.yaml"):
        def refused() -> str | None:
            try:
                create(api_client, namespace, tuning("mig", "qwen", mode="DryRun",
                                                     mig={"profile": "3g.71gb"}))
            except ApiException as exc:  # the policy is seen a moment after it is made
                return str(exc.body) if exc.status == 403 else None
            delete_tuning_and_wait(api_client, namespace, "mig", "the tuning deleted",
                                   timeout_s=30)
            return None

        body = wait_for(refused, "the policy to refuse spec.mig")
        assert "allowed only in namespaces labelled infertune.io/mig=allowed" in body
        client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "before", {"metadata": {"labels": {"a": "b"}}})
        delete_tuning_and_wait(api_client, namespace, "before", "the tuning made before "
                               "the policy deleted (its finalizer removed)", timeout_s=30)
        create(api_client, namespace, tuning("plain", "qwen"))  # no spec.mig: taken
        client.CoreV1Api(api_client).patch_namespace(namespace, {"metadata": {
            "labels": {"infertune.io/mig": "allowed"}}})
        wait_for(lambda: _created(api_client, namespace, tuning(
            "mig", "qwen", mode="DryRun", mig={"profile": "3g.71gb"})),
            "spec.mig taken once the namespace is labelled")


def test_the_documented_policy_asks_the_author_for_what_the_operator_does(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """The chart's author-permissions policy, as the API server runs it: a user allowed to
    create InferenceTunings but not to change a Deployment cannot have the operator change
    it. Each permission is asked for where the spec has the operator use it; an update that
    leaves the spec alone (a label, the operator's finalizer) is not checked, and a write of
    status.appliedSpec (which the pod webhook tunes by) is checked as a spec is."""
    rbac = client.RbacAuthorizationV1Api(api_client)

    def grant(user: str, name: str, rules: list[dict[str, Any]]) -> None:
        role = f"{user}-{name}"
        rbac.create_namespaced_role(namespace, {"metadata": {"name": role}, "rules": rules})
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": user}]})

    def as_user(user: str) -> client.ApiClient:
        api = client.ApiClient(api_client.configuration)
        api.set_default_header("Impersonate-User", user)
        return api

    tunings = [{"apiGroups": [GROUP], "resources": [PLURAL],
                "verbs": ["create", "get", "update", "patch"]}]
    grant("alice", "tunings", tunings)
    alice = as_user("alice")

    def answer(body: dict[str, Any]) -> str:
        """The policy's refusal of alice's `body`; "" when it is taken (then deleted)."""
        try:
            create(alice, namespace, body)
        except ApiException as exc:
            if exc.status != 403:
                raise
            return str(exc.body)
        delete_tuning_and_wait(api_client, namespace, body["metadata"]["name"],
                               "alice's tuning deleted", timeout_s=30)
        return ""

    def refused(body: dict[str, Any], said: str) -> None:
        # RBAC and the policy are applied a moment after they are made: wait for the answer.
        found = wait_for(lambda: got if said in (got := answer(body)) else None,
                         f"the policy to refuse with {said!r}")
        assert "infertune-author-permissions" in found, found

    def taken(body: dict[str, Any]) -> None:
        wait_for(lambda: answer(body) == "", f"{body['spec']} taken")

    enforce = tuning("t", "qwen", autoscaling={"maxReplicas": 4})
    dry_run = tuning("t", "qwen", mode="DryRun", autoscaling={"maxReplicas": 4})
    by_template = {"retune": {"strategy": "PodTemplateAnnotation"}}
    with documented_policy(api_client, namespace, "author-permissions.yaml"):
        refused(enforce, f"alice may not patch Deployment qwen in namespace {namespace}, "
                "whose pods this InferenceTuning (spec) has the operator tune and re-create: "
                "ask for patch on deployments")
        # A trial annotates the pods with its plan.
        refused(dry_run, "alice may not patch Deployment qwen in namespace "
                f"{namespace}, whose pods this InferenceTuning (spec) has the operator "
                "annotate with its plan (mode DryRun)")
        # Allowed to change that Deployment only: evicting pods and scaling it are each
        # asked for where the spec has the operator do them.
        grant("alice", "editor", [{"apiGroups": ["apps"], "resources": ["deployments"],
                                   "resourceNames": ["qwen"], "verbs": ["patch"]}])
        taken(dry_run)
        refused(tuning("t", "other"), "alice may not patch Deployment other")
        refused(tuning("t", "qwen"), "alice may not evict pods in namespace "
                f"{namespace}, which this InferenceTuning (spec) has the operator do "
                "(retune.strategy Evict, the default,")
        taken(tuning("t", "qwen", **by_template))
        refused(tuning("t", "qwen", **by_template, mig={"profile": "3g.71gb",
                                                        "allowDisruption": True}),
                "(mig.allowDisruption drains the nodes it partitions)")
        refused(tuning("t", "qwen", **by_template, autoscaling={"maxReplicas": 4}),
                "alice may not scale Deployment qwen")
        taken(tuning("t", "qwen", **by_template,
                     autoscaling={"maxReplicas": 4, "enabled": False}))
        grant("alice", "evictor", [{"apiGroups": [""], "resources": ["pods/eviction"],
                                    "verbs": ["create"]}])
        grant("alice", "scaler", [{"apiGroups": ["apps"], "resources": ["deployments/scale"],
                                   "resourceNames": ["qwen"], "verbs": ["patch"]}])
        taken(enforce)
        # The edit ClusterRole, bound in the namespace, has every permission asked for.
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": "carol-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": "carol"}]})
        grant("carol", "tunings", tunings)
        carol = as_user("carol")
        wait_for(lambda: _created(carol, namespace, {**enforce, "metadata": {"name": "c"}}),
                 "carol's tuning taken")

        # Bob may edit InferenceTunings and their status only: a label is his to change, the
        # spec is not, nor the spec the pod webhook falls back to (status.appliedSpec).
        grant("bob", "tunings", [*tunings, {"apiGroups": [GROUP],
                                           "resources": [f"{PLURAL}/status"],
                                           "verbs": ["update", "patch"]}])
        create(api_client, namespace, enforce)  # its author is allowed (cluster admin)
        # The operator's own write of status.appliedSpec goes through the policy's check (an
        # expression that failed on it would refuse it: failurePolicy Fail).
        wait_for(lambda: ((get_tuning(api_client, namespace, "t").get("status") or {})
                          .get("appliedSpec") or {}).get("generation") == 1,
                 "the operator's status.appliedSpec written under the policy")
        bob = client.CustomObjectsApi(as_user("bob"))

        def labelled() -> bool:
            try:
                bob.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "t",
                                                   {"metadata": {"labels": {"team": "b"}}})
            except ApiException as exc:  # bob's Role is applied a moment after it is made
                if exc.status != 403 or "infertune-author-permissions" in str(exc.body):
                    raise
                return False
            return True

        wait_for(labelled, "bob's label taken")
        with pytest.raises(ApiException) as info:
            bob.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "t",
                                               {"spec": {"autoscaling": {"maxReplicas": 40}}})
        assert info.value.status == 403 and "bob may not patch Deployment qwen" in \
            str(info.value.body)
        forged = {"status": {"appliedSpec": {"generation": 1, "spec": {
            "targetRef": {"name": "other"}, "engine": "vllm", "mode": "Enforce",
            "retune": {"strategy": "PodTemplateAnnotation"}, "autoscaling": None}}}}
        with pytest.raises(ApiException) as info:
            bob.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "t",
                                                      forged)
        assert info.value.status == 403 and "bob may not patch Deployment other in " \
            f"namespace {namespace}, whose pods this InferenceTuning " \
            "(status.appliedSpec.spec) has the operator tune" in str(info.value.body)
        # Another field of the status is not checked; the same appliedSpec from someone
        # allowed is taken.
        bob.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "t",
                                                  {"status": {"phase": "Pending"}})
        client.CustomObjectsApi(api_client).patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "t", forged)
        # The operator's finalizer comes off as the tuning is deleted.
        delete_tuning_and_wait(api_client, namespace, "t", "the tuning deleted (its "
                               "finalizer removed under the policy)", timeout_s=30)


def _created(api_client: client.ApiClient, namespace: str, body: dict[str, Any]) -> bool:
    try:
        create(api_client, namespace, body)
    except ApiException as exc:
        if exc.status == 403:
            return False
        raise
    return True


def test_a_partial_scaling_block_keeps_hpas_defaults_for_what_it_leaves_out(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """The API server fills each field of scaleUp/scaleDown left out with HPA's default for
    the direction, except selectPolicy: stored, an operator rolled back to a version without
    it (the CRD stays) would refuse every autoscaled tuning as holding an unknown field."""
    create(api_client, namespace, tuning("partial", "qwen", autoscaling={
        "scaleUp": {"pods": 2}, "scaleDown": {"stabilization": "10m"}}))
    create(api_client, namespace, tuning("none", "qwen", autoscaling={"maxReplicas": 4}))
    partial = get_tuning(api_client, namespace, "partial")["spec"]["autoscaling"]
    assert partial["scaleUp"] == {"pods": 2, "percent": 100, "period": "15s",
                                  "stabilization": "0s"}
    assert partial["scaleDown"] == {"pods": 0, "percent": 100, "period": "15s",
                                    "stabilization": "10m"}
    none = get_tuning(api_client, namespace, "none")["spec"]["autoscaling"]
    assert none["scaleUp"] == {"pods": 4, "percent": 100, "period": "15s",
                               "stabilization": "0s"}
    assert none["scaleDown"] == {"pods": 0, "percent": 100, "period": "15s",
                                 "stabilization": "300s"}
    spec = InferenceTuning.model_validate(get_tuning(api_client, namespace, "partial"))
    assert spec.spec.autoscaling is not None
    assert spec.spec.autoscaling.scale_down.stabilization.seconds == 600


def test_a_deleted_tuning_ends_its_loops_without_warnings(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """The re-tuning and autoscaling loops sleep between passes; deleting the tuning ends
    them there, and kopf must not log its warning for a daemon that ended cancelled."""
    create(api_client, namespace, deployment("quiet"))
    create(api_client, namespace, tuning("quiet", "quiet", autoscaling={"interval": "5s"}))
    wait_observed(api_client, namespace, "quiet", operator)

    def both_passed() -> bool:  # each loop has written its block, so both are asleep next
        status = get_tuning(api_client, namespace, "quiet").get("status") or {}
        return "tuning" in status and "evaluated" in (status.get("autoscaling") or {})

    wait_for(both_passed, "a re-tuning pass and an evaluation", timeout_s=30)
    delete_tuning_and_wait(api_client, namespace, "quiet", "the tuning deleted", timeout_s=30)
    assert operator.log is not None
    ours = [line for line in operator.log.read_text(errors="replace").splitlines()
            if f"[{namespace}/quiet]" in line]
    assert ours, "the operator logged nothing for the tuning"
    assert not [line for line in ours if "cancelled" in line], "\n".join(ours[-20:])
