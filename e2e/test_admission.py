"""The admission check of InferenceTunings on the real API server: an invalid spec is refused
when it is applied (controller/admission.py), as the operator registered it."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.fixtures.access import Kubectl
from e2e.fixtures.admission import CHECK, check_unreachable, without_the_check
from e2e.fixtures.operator import OperatorProcess
from e2e.test_operator import GROUP, PLURAL, VERSION, create, get_tuning, tuning
from infertune.kube.webhooks import SPEC_CHANGED, WEBHOOK_CONFIGURATION

pytestmark = pytest.mark.e2e

BOUNDS = "spec.autoscaling.minReplicas: 5 is above maxReplicas 2"


def message(error: ApiException) -> str:
    text: str = json.loads(error.body)["message"]
    return text


def test_an_invalid_spec_is_refused_at_apply_and_nothing_is_stored(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    with pytest.raises(ApiException) as refused:
        create(api_client, namespace, tuning("bad", "qwen",
                                             autoscaling={"minReplicas": 5, "maxReplicas": 2}))
    assert refused.value.status == 422
    assert message(refused.value).startswith(
        f'admission webhook "{CHECK}" denied the request: InferenceTuning bad: {BOUNDS}; '
        "lower minReplicas or raise maxReplicas. Fix the spec"), message(refused.value)
    with pytest.raises(ApiException) as missing:
        get_tuning(api_client, namespace, "bad")
    assert missing.value.status == 404


def test_an_edit_is_checked_and_kopfs_own_updates_are_not_sent(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    custom = client.CustomObjectsApi(api_client)
    create(api_client, namespace, tuning("t", "qwen", autoscaling={"maxReplicas": 4}))
    stored = get_tuning(api_client, namespace, "t")
    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "t", {
            "spec": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}})
    assert refused.value.status == 422 and BOUNDS in message(refused.value)
    after = get_tuning(api_client, namespace, "t")
    assert after["metadata"]["generation"] == stored["metadata"]["generation"]
    assert after["spec"]["autoscaling"] == stored["spec"]["autoscaling"]
    registration = client.AdmissionregistrationV1Api(
        api_client).read_mutating_webhook_configuration(WEBHOOK_CONFIGURATION)
    check = next(w for w in registration.webhooks if w.name == CHECK)
    assert [(c.name, c.expression) for c in check.match_conditions] == [
        ("spec-changed", SPEC_CHANGED)]
    assert check.failure_policy == "Ignore"
    # The check is sent only what changes a spec (its matchCondition, as the API server
    # evaluates it): pointed at an address nothing answers, with failurePolicy Fail, a
    # label, an annotation (kopf's) and a finalizer go through; a spec change fails.
    with check_unreachable(api_client, namespace):
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "t", {
            "metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"},
                         "finalizers": ["example.com/test"]}})
        with pytest.raises(ApiException) as sent:
            custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "t", {
                "spec": {"mode": "DryRun"}})
        assert f'failed calling webhook "{CHECK}"' in message(sent.value), message(sent.value)
        held = get_tuning(api_client, namespace, "t")["metadata"]["finalizers"]
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "t", {
            "metadata": {"finalizers": [f for f in held if f != "example.com/test"]}})
    assert get_tuning(api_client, namespace, "t")["metadata"]["labels"] == {"team": "a"}


def test_a_tuning_stored_invalid_can_still_be_edited_labelled_and_deleted(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, kubectl: Kubectl
) -> None:
    """Ratcheting: stored while the check was not there (the operator down, an older
    release), the tuning keeps its problem; an edit that adds none passes with a warning,
    and so does kopf's finalizer, and its deletion."""
    custom = client.CustomObjectsApi(api_client)
    with without_the_check(api_client, namespace):
        create(api_client, namespace, tuning("old", "qwen",
                                             autoscaling={"minReplicas": 5, "maxReplicas": 2}))
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "old", {
        "metadata": {"labels": {"team": "a"}}})
    doc: dict[str, Any] = tuning("old", "qwen", mode="DryRun",
                                 autoscaling={"minReplicas": 5, "maxReplicas": 2})
    doc["metadata"]["labels"] = {"team": "a"}
    edited = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
    assert f"infertune: stored with this problem before: {BOUNDS}" in edited.stderr, (
        edited.stderr)
    assert get_tuning(api_client, namespace, "old")["spec"]["mode"] == "DryRun"
    doc["spec"]["autoscaling"]["maxReplicas"] = 1
    worse = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc),
                    check=False)
    assert worse.returncode != 0
    assert "spec.autoscaling.minReplicas: 5 is above maxReplicas 1" in worse.stderr
    kubectl("delete", "-n", namespace, "inferencetuning", "old", "--wait=true",
            timeout_s=60)


def test_a_server_dry_run_is_checked_too(
    namespace: str, operator: OperatorProcess, kubectl: Kubectl
) -> None:
    """What `kubectl apply --dry-run=server` and Argo CD's dry run show before a sync."""
    bad = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", check=False,
                  input=yaml.safe_dump(tuning("bad", "qwen", autoscaling={
                      "minReplicas": 5, "maxReplicas": 2})))
    assert bad.returncode != 0 and BOUNDS in bad.stderr, bad.stderr
    good = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                   input=yaml.safe_dump(tuning("good", "qwen")))
    assert "created (server dry run)" in good.stdout
