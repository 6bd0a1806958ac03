"""The admission check of InferenceTunings on the real API server: an invalid spec is refused
when it is applied (controller/admission.py), as the operator registered it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.fixtures.access import Kubectl
from e2e.fixtures.operator import OperatorProcess
from e2e.test_operator import GROUP, PLURAL, VERSION, create, get_tuning, tuning
from infertune.kube.webhooks import SPEC_CHANGED, WEBHOOK_CONFIGURATION

pytestmark = pytest.mark.e2e

CHECK = f"{PLURAL}.{GROUP}"
BOUNDS = "spec.autoscaling.minReplicas: 5 is above maxReplicas 2"


@contextlib.contextmanager
def without_the_check(api_client: client.ApiClient) -> Iterator[None]:
    """The configuration without the tunings' check, then as it was: what the API server
    does while the operator is down (the check's failurePolicy is Ignore), or under a
    release from before the check."""
    api = client.AdmissionregistrationV1Api(api_client)
    before = api.read_mutating_webhook_configuration(WEBHOOK_CONFIGURATION)
    hooks = [w for w in before.webhooks if w.name != CHECK]
    assert len(hooks) == len(before.webhooks) - 1
    api.patch_mutating_webhook_configuration(WEBHOOK_CONFIGURATION, [
        {"op": "replace", "path": "/webhooks", "value": api_client.sanitize_for_serialization(
            hooks)}])
    try:
        yield
    finally:
        now = api.read_mutating_webhook_configuration(WEBHOOK_CONFIGURATION)
        before.metadata.resource_version = now.metadata.resource_version
        api.replace_mutating_webhook_configuration(WEBHOOK_CONFIGURATION, before)


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
    # Where the API server's schema refuses too, the field is named either way.
    with pytest.raises(ApiException) as typed:
        create(api_client, namespace, tuning("typed", "qwen", mode="dryrun"))
    assert typed.value.status == 422 and "spec.mode" in message(typed.value)


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
    # The check is sent only what changes a spec: the matchCondition the API server compiled.
    registration = client.AdmissionregistrationV1Api(
        api_client).read_mutating_webhook_configuration(WEBHOOK_CONFIGURATION)
    check = next(w for w in registration.webhooks if w.name == CHECK)
    assert [(c.name, c.expression) for c in check.match_conditions] == [
        ("spec-changed", SPEC_CHANGED)]
    assert check.failure_policy == "Ignore"


def test_a_tuning_stored_invalid_can_still_be_edited_labelled_and_deleted(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, kubectl: Kubectl
) -> None:
    """Ratcheting: stored while the check was not there (the operator down, an older
    release), the tuning keeps its problem; an edit that adds none passes with a warning,
    and so does kopf's finalizer, and its deletion."""
    custom = client.CustomObjectsApi(api_client)
    with without_the_check(api_client):
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
