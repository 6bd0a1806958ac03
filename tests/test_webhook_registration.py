"""The pod webhook's registration: which namespaces' pods the API server sends to the operator."""

from __future__ import annotations

from typing import Any

import pytest

from infertune.kube.webhooks import OPT_OUT_LABEL, WebhookRegistration

KOPF = {"url": "https://10.0.0.5:9443", "caBundle": "Q0E="}


def selector(registration: WebhookRegistration) -> list[dict[str, Any]]:
    expressions: list[dict[str, Any]] = registration.body(KOPF)["webhooks"][0][
        "namespaceSelector"]["matchExpressions"]
    return expressions


def test_a_cluster_wide_operator_sees_every_namespace_but_the_excluded() -> None:
    registration = WebhookRegistration(excluded_namespaces=("kube-system", "infertune-system",
                                                            "kube-system"))
    assert selector(registration) == [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                       "values": ["infertune-system", "kube-system"]}]


def test_a_namespaced_operator_is_sent_only_its_namespaces_pods() -> None:
    registration = WebhookRegistration(excluded_namespaces=("kube-system", "infertune-system"),
                                       included_namespaces=("team-b", "team-a", "team-b"))
    assert selector(registration) == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
         "values": ["infertune-system", "kube-system"]},
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]},
    ]


@pytest.mark.parametrize("pattern", ["team-*", "team-?", "!team-test", "team-*,!team-test",
                                     "team-[ab]"])
def test_kopf_patterns_fall_back_to_every_namespace(pattern: str) -> None:
    """A selector cannot express a glob: matching the pattern as a name would send the
    operator no pods at all, so its namespaces' pods would silently go untuned."""
    registration = WebhookRegistration(excluded_namespaces=("kube-system",),
                                       included_namespaces=("team-a", pattern))
    assert [e["operator"] for e in selector(registration)] == ["NotIn"]


def test_the_rest_of_the_registration_fails_safe() -> None:
    webhook = WebhookRegistration(excluded_namespaces=("kube-system",),
                                  included_namespaces=("team-a",)).body(KOPF)["webhooks"][0]
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["objectSelector"]["matchExpressions"] == [
        {"key": OPT_OUT_LABEL, "operator": "NotIn", "values": ["disabled"]}]
    assert webhook["clientConfig"] == {"caBundle": "Q0E=",
                                       "url": "https://10.0.0.5:9443/tune-pods"}
