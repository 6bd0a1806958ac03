"""The check that the installed InferenceTuning CRD is this release's (controller/crd_check.py):
the digest the CRD carries, what is said when it differs, and when."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from prometheus_client.registry import CollectorRegistry
from tests.conftest import ROOT

from infertune.api import crd as crd_module
from infertune.api.crd import (
    SCHEMA_DIGEST_ANNOTATION,
    custom_resource_definition,
    installed_digest,
    schema_digest,
)
from infertune.controller.crd_check import CURRENT, OUTDATED, CrdCheck, CrdCollector, crd_problem


def installed(digest: str | None) -> dict[str, Any]:
    """This release's CRD as the API server returns it, carrying `digest` (None: none)."""
    crd = copy.deepcopy(custom_resource_definition())
    crd["metadata"] = {**crd["metadata"], "uid": "c0ffee", "resourceVersion": "7"}
    if digest is None:
        del crd["metadata"]["annotations"]
    else:
        crd["metadata"]["annotations"] = {SCHEMA_DIGEST_ANNOTATION: digest}
    return crd


OLD = "sha256:0123456789abcdef"


def test_the_generated_crds_carry_the_digest_of_their_spec() -> None:
    for path in (ROOT / "crds", ROOT / "charts" / "infertune" / "crds"):
        body = next(d for d in yaml.safe_load_all(
            (path / "infertune.io_inferencetunings.yaml").read_text()) if d)
        assert installed_digest(body) == schema_digest()
    assert schema_digest().startswith("sha256:") and len(schema_digest()) == 7 + 16


def test_the_digest_changes_with_the_schema_and_only_with_the_spec() -> None:
    spec = custom_resource_definition()["spec"]
    ours = crd_module._digest(spec)
    assert ours == schema_digest()
    pruned = copy.deepcopy(spec)
    status = pruned["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    del status["properties"]["autoscaling"]  # what an older release's schema lacked
    assert crd_module._digest(pruned) != ours
    # Key order is not the schema: the same spec in another order has the same digest.
    assert crd_module._digest(dict(reversed(list(spec.items())))) == ours


def test_this_releases_crd_is_no_problem() -> None:
    assert crd_problem(installed(schema_digest())) is None


def test_another_digest_is_said_with_both_digests_and_the_fix() -> None:
    problem = crd_problem(installed(OLD))
    assert problem is not None
    assert OLD in problem and schema_digest() in problem
    assert "status.autoscaling.state.queue" in problem
    assert "kubectl apply -f charts/infertune/crds/" in problem


def test_a_crd_without_the_digest_is_from_an_older_release() -> None:
    problem = crd_problem(installed(None))
    assert problem is not None and SCHEMA_DIGEST_ANNOTATION in problem
    # A hand-edited annotation that is no string is no digest either.
    crd = installed(None)
    crd["metadata"]["annotations"] = {SCHEMA_DIGEST_ANNOTATION: 7}
    assert installed_digest(crd) is None and crd_problem(crd) is not None


def test_a_missing_crd_is_said() -> None:
    problem = crd_problem(None)
    assert problem is not None and "is not installed" in problem


class Cluster:
    """What the check reads and posts: the CRD in turn, and the Events posted."""

    def __init__(self, *crds: Mapping[str, Any] | Exception | None) -> None:
        self.crds = list(crds)
        self.events: list[tuple[str, str, str, str]] = []
        self.leads = True
        self.post_fails = False

    def read(self) -> Mapping[str, Any] | None:
        crd = self.crds.pop(0)
        if isinstance(crd, Exception):
            raise crd
        return crd

    def post(self, kind: str, reason: str, message: str, crd: Mapping[str, Any]) -> None:
        if self.post_fails:
            raise ApiException(status=403, reason="Forbidden")
        self.events.append((kind, reason, message, crd["metadata"]["uid"]))

    def check(self) -> CrdCheck:
        return CrdCheck(self.read, self.post, lambda: self.leads)


def gauge(check: CrdCheck) -> list[tuple[dict[str, str], float]]:
    registry = CollectorRegistry()
    registry.register(CrdCollector(check))
    return [(s.labels, s.value) for family in registry.collect() for s in family.samples]


def test_an_outdated_crd_is_said_once_and_its_update_once(
        caplog: pytest.LogCaptureFixture) -> None:
    cluster = Cluster(installed(OLD), installed(OLD), installed(schema_digest()),
                      installed(schema_digest()))
    check = cluster.check()
    with caplog.at_level(logging.INFO, logger="infertune.controller.crd_check"):
        assert check.check() is not None
        assert check.check() is not None  # the same: not said again
        assert gauge(check) == [({"installed": OLD, "release": schema_digest()}, 0.0)]
        assert check.check() is None
        assert check.check() is None
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and OLD in errors[0].getMessage()
    assert sum("is now this release's" in r.getMessage() for r in caplog.records) == 1
    assert [(kind, reason) for kind, reason, _, _ in cluster.events] == [
        ("Warning", OUTDATED), ("Normal", CURRENT)]
    assert cluster.events[0][2] == crd_problem(installed(OLD))
    assert {uid for *_, uid in cluster.events} == {"c0ffee"}  # about the CRD
    assert gauge(check) == [({"installed": schema_digest(), "release": schema_digest()}, 1.0)]


def test_a_current_crd_at_start_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    cluster = Cluster(installed(schema_digest()))
    with caplog.at_level(logging.INFO, logger="infertune.controller.crd_check"):
        assert cluster.check().check() is None
    assert cluster.events == [] and caplog.records == []


def test_only_the_leader_posts_and_a_failed_post_is_tried_again() -> None:
    cluster = Cluster(installed(OLD), installed(OLD), installed(OLD))
    cluster.leads = False
    check = cluster.check()
    check.check()
    assert cluster.events == [] and check.current is False  # the gauge says it anyway
    cluster.leads, cluster.post_fails = True, True
    check.check()
    assert cluster.events == []
    cluster.post_fails = False
    check.check()
    assert [reason for _, reason, _, _ in cluster.events] == [OUTDATED]


def test_a_missing_crd_is_an_error_and_a_zero_but_no_event(
        caplog: pytest.LogCaptureFixture) -> None:
    cluster = Cluster(None)
    check = cluster.check()
    with caplog.at_level(logging.ERROR, logger="infertune.controller.crd_check"):
        assert check.check() is not None
    assert "is not installed" in caplog.text
    assert cluster.events == []  # nothing to post it about
    assert gauge(check) == [({"installed": "none", "release": schema_digest()}, 0.0)]


def test_a_crd_that_cannot_be_read_is_not_known(caplog: pytest.LogCaptureFixture) -> None:
    cluster = Cluster(installed(OLD), ApiException(status=403, reason="Forbidden"),
                      ApiException(status=403, reason="Forbidden"), installed(OLD))
    check = cluster.check()
    check.check()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="infertune.controller.crd_check"):
        assert check.check() is None and check.current is None
        assert gauge(check) == []  # absent, not a 1 nor a 0
        check.check()
        assert check.check() is not None
    # Said once, and the outdated CRD not said again when it reads once more.
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "403 Forbidden" in caplog.text
    assert [reason for _, reason, _, _ in cluster.events] == [OUTDATED]


def test_a_hand_edited_digest_is_cut_in_the_message_and_the_label() -> None:
    edited = "x" * 100_000
    cluster = Cluster(installed(edited))
    check = cluster.check()
    problem = check.check()
    assert problem is not None and len(problem) < 2000
    assert "(100000 characters)" in problem
    [(labels, value)] = gauge(check)
    assert len(labels["installed"]) < 100 and value == 0.0
