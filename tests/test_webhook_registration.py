"""The pod webhook's registration: which namespaces' pods the API server sends to the operator."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from infertune.kube.webhook_tls import write_self_signed
from infertune.kube.webhooks import OPT_OUT_LABEL, WebhookRegistration, bundle_with

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


def _ca(tmp: Path, days: int) -> tuple[str, x509.Certificate]:
    cert_path, _ = write_self_signed(tmp, ["infertune-webhook.infertune-system.svc"], days=days)
    pem = cert_path.read_bytes()
    return base64.b64encode(pem).decode(), x509.load_pem_x509_certificate(pem)


def _held(bundle: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(base64.b64decode(bundle))


def test_a_new_ca_bundle_keeps_the_newest_other_ca_that_has_not_expired(
        tmp_path: Path) -> None:
    """The operator pod a rolling upgrade replaces still answers for a few seconds with its
    own certificate: its CA stays trusted next to the new one, and no more than that."""
    first, first_cert = _ca(tmp_path / "1", 10)
    second, second_cert = _ca(tmp_path / "2", 10)
    third, third_cert = _ca(tmp_path / "3", 10)
    assert _held(bundle_with(second, first)) == [second_cert, first_cert]
    both = bundle_with(second, first)
    assert _held(bundle_with(third, both)) == [third_cert, second_cert]  # two at most
    assert bundle_with(second, second) == second  # the same CA again
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=11)
    assert bundle_with(second, first, now=later) == second  # expired: dropped
    assert bundle_with(second, base64.b64encode(b"edited by hand").decode()) == second
