"""The check that the installed InferenceTuning CRD is this release's (controller/crd_check.py):
the digest the CRD carries, what is said when it differs, and when."""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
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
    SCHEMA_GENERATION,
    SCHEMA_GENERATION_ANNOTATION,
    custom_resource_definition,
    installed_digest,
    installed_generation,
    schema_digest,
)
from infertune.controller.crd_check import (
    CURRENT,
    MAX_EVENT_MESSAGE,
    MAX_NAMED,
    NEWER_GRACE_S,
    OUTDATED,
    PRESERVE,
    CrdCheck,
    CrdCollector,
    crd_finding,
    dropped_fields,
    read_installed,
)


def installed(digest: str | None, *without: str, adding: str | None = None,
              generation: int | None = None) -> dict[str, Any]:
    """This release's CRD as the API server returns it, carrying `digest` (None: none) and
    `generation` (None: none), its schema `without` the fields given (dotted paths from the
    root of the schema), and `adding` a field of a newer release (a dotted path)."""
    crd = copy.deepcopy(custom_resource_definition())
    crd["metadata"] = {**crd["metadata"], "uid": "c0ffee", "resourceVersion": "7"}
    annotations = {} if digest is None else {SCHEMA_DIGEST_ANNOTATION: digest}
    if generation is not None:
        annotations[SCHEMA_GENERATION_ANNOTATION] = str(generation)
    crd["metadata"]["annotations"] = annotations
    for path in without:
        *parents, name = path.split(".")
        del node(crd, *parents)["properties"][name]
    if adding is not None:
        *parents, name = adding.split(".")
        node(crd, *parents)["properties"][name] = {"type": "string"}
    return crd


def node(crd: dict[str, Any], *path: str) -> dict[str, Any]:
    """The schema of the field at `path` in `crd`."""
    found: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for name in path:
        found = found["properties"][name]
    return found


def ours() -> dict[str, Any]:
    return installed(schema_digest(), generation=SCHEMA_GENERATION)


OLD = "sha256:0123456789abcdef"
NEWER = "sha256:fedcba9876543210"
QUEUE = "status.autoscaling.state.queue"


def older() -> dict[str, Any]:
    """The CRD of the release before the backlog rules: no digest, no state.queue."""
    return installed(None, QUEUE)


def test_the_generated_crds_carry_the_digest_and_generation_of_their_spec() -> None:
    for path in (ROOT / "crds", ROOT / "charts" / "infertune" / "crds"):
        body = next(d for d in yaml.safe_load_all(
            (path / "infertune.io_inferencetunings.yaml").read_text()) if d)
        assert installed_digest(body) == schema_digest()
        assert installed_generation(body) == SCHEMA_GENERATION
    assert schema_digest().startswith("sha256:") and len(schema_digest()) == 7 + 16


GENERATIONS = {
    1: "sha256:f7193fc2e206ebad",
    2: "sha256:8fa5482b6405eb88",  # quantities: minimum 0 for the integer form
    3: "sha256:abce73fd23984474",  # status.autoscaling.state.carried
}
"""Each generation of the CRD's schema (api/crd.py SCHEMA_GENERATION) and its digest: a
schema change adds an entry, never edits one."""


def test_the_schema_generation_is_raised_whenever_the_schema_changes() -> None:
    assert max(GENERATIONS) == SCHEMA_GENERATION, (
        f"SCHEMA_GENERATION is {SCHEMA_GENERATION}: add its digest to GENERATIONS here")
    assert len(set(GENERATIONS.values())) == len(GENERATIONS), "a digest given twice"
    assert GENERATIONS[SCHEMA_GENERATION] == schema_digest(), (
        f"the CRD's schema changed (its digest is {schema_digest()}): raise SCHEMA_GENERATION "
        f"in operator/infertune/api/crd.py to {SCHEMA_GENERATION + 1}, add "
        f"{SCHEMA_GENERATION + 1}: \"{schema_digest()}\" to GENERATIONS here (leave the others "
        "as they are), and run `make crds`: an operator tells a newer CRD from an older one "
        "by the generation")


def test_the_digest_changes_with_the_schema_and_not_with_key_order() -> None:
    crd = custom_resource_definition()
    spec = crd["spec"]
    digest = crd_module._digest(spec)
    assert digest == schema_digest()
    pruned = copy.deepcopy(spec)
    status = pruned["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    del status["properties"]["autoscaling"]  # what an older release's schema lacked
    assert crd_module._digest(pruned) != digest
    assert crd_module._digest(dict(reversed(list(spec.items())))) == digest
    # Only the spec: the metadata (where the digest goes) is not in it.
    assert crd["metadata"]["annotations"] == {
        SCHEMA_DIGEST_ANNOTATION: digest, SCHEMA_GENERATION_ANNOTATION: str(SCHEMA_GENERATION)}


def test_a_generation_edited_by_hand_is_none() -> None:
    for value in ("²", "-1", "1e3", " 1", "9" * 10, 7):
        crd = ours()
        crd["metadata"]["annotations"][SCHEMA_GENERATION_ANNOTATION] = value
        assert installed_generation(crd) is None, value
    crd["metadata"]["annotations"][SCHEMA_GENERATION_ANNOTATION] = "12"
    assert installed_generation(crd) == 12


def test_this_releases_crd_is_no_problem() -> None:
    assert crd_finding(ours()) == (None, None, logging.INFO, None)


def test_a_crd_that_lacks_fields_names_them_and_the_fix_first() -> None:
    problem, note, _, _ = crd_finding(older())
    assert note is None and problem is not None
    assert "an older release's" in problem and "lacks 1 of this release's fields" in problem
    assert problem.endswith(f"The fields: {QUEUE}; without {QUEUE} the autoscaler's rules "
                            "that tell a draining backlog from the load stay off")
    assert SCHEMA_DIGEST_ANNOTATION in problem  # it has none
    # The fix before the fields: an Event message is cut at 1024 characters.
    assert problem.index("kubectl apply -f charts/infertune/crds/") < problem.index(QUEUE)
    problem = crd_finding(installed(OLD, "spec.autoscaling", QUEUE)).problem
    assert problem is not None and OLD in problem and schema_digest() in problem
    assert "The fields: spec.autoscaling, status.autoscaling.state.queue;" in problem
    assert "spec.autoscaling.interval" not in problem  # dropped whole: named once


def test_what_a_field_dropped_does_is_said_for_the_field_under_it_or_over_it() -> None:
    for gone in ("status.autoscaling.state", "status.autoscaling.state.queue.fallingFrom"):
        problem = crd_finding(installed(OLD, gone)).problem
        assert problem is not None and "backlog" in problem, gone
    problem = crd_finding(installed(OLD, "status.batching")).problem
    assert problem is not None and "backlog" not in problem


def test_many_dropped_fields_are_counted_past_the_first_named() -> None:
    gone = [f"spec.{name}" for name in node(ours(), "spec")["properties"]]
    assert len(gone) > MAX_NAMED
    problem = crd_finding(installed(OLD, *gone)).problem
    assert problem is not None
    assert f"lacks {len(gone)} of" in problem and f"and {len(gone) - MAX_NAMED} more" in problem


def test_a_reworded_crd_drops_nothing_and_is_only_noted() -> None:
    for crd in (installed(OLD, generation=SCHEMA_GENERATION), installed(None)):
        problem, note, level, _ = crd_finding(crd)
        assert problem is None and note is not None and "nothing is dropped" in note
        assert level == logging.INFO


def test_a_newer_crd_is_no_problem_and_what_it_drops_is_a_warning() -> None:
    """The upgrade as the docs say it: the new CRD applied first, while the older operator
    still runs; or a rollback, which keeps the newer CRD. A field more drops nothing; a
    field the newer release removed is dropped from this one's writes."""
    later = SCHEMA_GENERATION + 1
    problem, note, level, _ = crd_finding(installed(NEWER, adding="spec.newField",
                                                 generation=later))
    assert problem is None and level == logging.INFO
    assert note is not None and "a newer release's" in note and "nothing is dropped" in note
    problem, note, level, lasting = crd_finding(installed(NEWER, QUEUE, generation=later))
    assert lasting is not None and "longer than an upgrade takes" in lasting
    assert problem is None and level == logging.WARNING
    assert note is not None and "a newer release's" in note and QUEUE in note
    assert "backlog" in note
    # The same CRD from an older generation is the problem.
    assert crd_finding(installed(NEWER, QUEUE, generation=SCHEMA_GENERATION)).problem


def test_pruning_follows_the_api_servers_rules() -> None:
    obj = {"type": "object"}
    ab = {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "string"}, "c": {"type": "string"}}}}}
    only_b = {"type": "object", "properties": {"b": {"type": "string"}}}
    # A map whose values are schemas keeps the fields of its values' schema.
    assert dropped_fields(ab, {**obj, "additionalProperties": only_b}) == ["a.c"]
    # additionalProperties true keeps scalars and empties objects.
    assert dropped_fields(ab, {**obj, "additionalProperties": True}) == ["a.b", "a.c"]
    # Preserved: the fields it does not name stay whole; those it names are pruned by theirs.
    assert dropped_fields(ab, {**obj, PRESERVE: True}) == []
    assert dropped_fields(ab, {**obj, PRESERVE: True, "properties": {"a": only_b}}) == ["a.c"]
    # A map in both: its values' fields as theirs has them.
    assert dropped_fields({**obj, "additionalProperties": ab["properties"]["a"]},
                          {**obj, "additionalProperties": only_b}, "m") == ["m.*.c"]
    # A map here, a plain object there: every key goes.
    assert dropped_fields({**obj, "additionalProperties": {"type": "string"}}, obj, "m") == [
        "m.*"]
    assert dropped_fields({**obj, "additionalProperties": {"type": "string"}},
                          {**obj, PRESERVE: True}, "m") == []
    # Free-form here and not there.
    assert dropped_fields({**obj, PRESERVE: True}, obj, "x") == [
        "x (the fields it does not name)"]
    # Lists: their items; without a schema for them, objects are emptied; under a node that
    # preserves, the items keep what they do not name.
    items = {"type": "array", "items": ab}
    assert dropped_fields(items, {"type": "array", "items": {**obj, "properties": {
        "a": obj}}}, "list") == ["list[].a.b", "list[].a.c"]
    assert dropped_fields(items, {"type": "array"}, "list") == ["list[].a"]
    assert dropped_fields(items, {"type": "array", PRESERVE: True, "items": obj}, "l") == []
    # additionalProperties false is no schema for the values either: as true.
    assert dropped_fields(ab, {**obj, "additionalProperties": False}) == ["a.b", "a.c"]
    assert dropped_fields({**obj, "additionalProperties": {"type": "string"}},
                          {**obj, "additionalProperties": False}, "m") == []
    # Preserved with a schema for the values: the values are pruned by it.
    assert dropped_fields(ab, {**obj, PRESERVE: True, "additionalProperties": only_b}) == [
        "a.c"]
    # An embedded resource keeps its apiVersion, kind and metadata, not its other fields.
    resource = {**obj, "properties": {"kind": {"type": "string"}, "spec": ab}}
    assert dropped_fields({**obj, "properties": {"r": resource}}, {**obj, "properties": {
        "r": {**obj, "x-kubernetes-embedded-resource": True, PRESERVE: False}}}) == ["r.spec"]
    assert dropped_fields({**obj, "properties": {"r": resource}}, {**obj, "properties": {
        "r": obj}}) == ["r.kind", "r.spec"]
    # The root's apiVersion, kind and metadata are never pruned.
    root = node(ours())
    bare = {"type": "object", "properties": {k: v for k, v in root["properties"].items()
                                             if k in ("spec", "status")}}
    assert dropped_fields(root, bare) == []
    assert dropped_fields(root, {"type": "object", "properties": {}}) == ["spec", "status"]


def test_what_the_installed_schema_keeps_whole_is_not_dropped_but_what_it_names_is() -> None:
    crd = older()
    node(crd, "status", "autoscaling", "state")[PRESERVE] = True
    assert crd_finding(crd).problem is None  # queue is not named there: kept whole
    breach = node(crd, "status", "autoscaling", "state", "latencyBreaches")["items"]
    del breach["properties"]["queueOverloaded"]
    problem = crd_finding(crd).problem
    assert problem is not None
    assert "status.autoscaling.state.latencyBreaches[].queueOverloaded" in problem


def test_an_edited_crd_is_judged_by_its_fields_whatever_its_annotations_say() -> None:
    # `kubectl edit` keeps the annotations: this release's digest over a pruning schema.
    crd = installed(schema_digest(), QUEUE, generation=SCHEMA_GENERATION)
    problem = crd_finding(crd).problem
    assert problem is not None and "this release's, changed since it was applied" in problem
    assert problem.endswith(f"The fields: {QUEUE}; without {QUEUE} the autoscaler's rules "
                            "that tell a draining backlog from the load stay off")
    # Another build of the same generation is not called older.
    problem = crd_finding(installed(OLD, QUEUE, generation=SCHEMA_GENERATION)).problem
    assert problem is not None and "an older release's" not in problem
    assert f"another build of this release's schema generation {SCHEMA_GENERATION}" in problem
    # What it carries is said as it is.
    problem = crd_finding(installed(None, QUEUE, generation=SCHEMA_GENERATION - 1)).problem
    assert problem is not None and "an older release's" in problem
    assert (f"schema generation {SCHEMA_GENERATION - 1}, no {SCHEMA_DIGEST_ANNOTATION}"
            in problem)
    problem = crd_finding(installed(OLD, QUEUE)).problem
    assert problem is not None
    assert f"no {SCHEMA_GENERATION_ANNOTATION} annotation, digest {OLD}" in problem


def test_a_rollback_that_stays_is_told_to_remove_the_newer_spec_fields_first() -> None:
    """Applied, the older CRD prunes the newer fields from the stored tunings too (on read):
    a histogram's unit gone, the older release reads it in seconds."""
    newer = installed(NEWER, QUEUE, adding="spec.metrics.latencyHistogramUnitV9",
                      generation=SCHEMA_GENERATION + 1)
    node(newer, "status", "autoscaling")["properties"]["newState"] = {"type": "string"}
    lasting = crd_finding(newer).lasting
    assert lasting is not None
    fix = lasting.index("first remove from the tunings the newer release's fields, which "
                        "this release's CRD drops (spec.metrics.latencyHistogramUnitV9), then "
                        "apply its CRD: `kubectl apply -f charts/infertune/crds/`")
    assert fix < lasting.index(QUEUE)  # the fix first: an Event is cut at 1024 characters
    assert "newState" not in lasting  # status: nothing to remove from the tunings
    # The same release's digest is not taken for a newer release's, whatever its generation.
    edited = installed(schema_digest(), QUEUE, generation=SCHEMA_GENERATION + 1)
    problem, _, _, lasting = crd_finding(edited)
    assert problem is not None and lasting is None
    assert "this release's, changed since it was applied" in problem


def test_a_newer_crd_that_does_not_serve_this_version_is_no_problem_yet() -> None:
    crd = installed(NEWER, generation=SCHEMA_GENERATION + 1)
    crd["spec"]["versions"][0]["served"] = False
    problem, note, level, lasting = crd_finding(crd)
    assert problem is None and lasting is not None and level == logging.WARNING
    assert note is not None and "does not serve infertune.io/v1alpha1" in note
    assert lasting is not None and lasting.endswith(
        "until then it does not serve infertune.io/v1alpha1 with a schema, so no "
        "InferenceTuning of this release's can be read or written")


def test_a_crd_that_does_not_serve_this_version_is_a_problem() -> None:
    crd = installed(OLD)
    crd["spec"]["versions"][0]["served"] = False
    problem = crd_finding(crd).problem
    assert problem is not None and "does not serve infertune.io/v1alpha1" in problem
    crd["spec"]["versions"][0]["name"] = "v1beta1"
    assert crd_finding(crd).problem is not None


def test_a_hand_edited_digest_annotation_that_is_no_string_is_none() -> None:
    crd = installed(None)
    crd["metadata"]["annotations"] = {SCHEMA_DIGEST_ANNOTATION: 7}
    assert installed_digest(crd) is None


def test_a_missing_crd_is_said() -> None:
    problem = crd_finding(None).problem
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


def stale() -> dict[str, Any]:
    return installed(OLD, QUEUE)


def test_an_outdated_crd_is_said_once_and_its_update_once(
        caplog: pytest.LogCaptureFixture) -> None:
    cluster = Cluster(stale(), stale(), installed(schema_digest()), installed(schema_digest()))
    check = cluster.check()
    with caplog.at_level(logging.INFO, logger="infertune.controller.crd_check"):
        assert check.check() is not None
        assert check.check() is not None  # the same: not said again
        assert gauge(check) == [({"installed": OLD, "release": schema_digest()}, 0.0)]
        assert check.check() is None
        assert check.check() is None
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and QUEUE in errors[0].getMessage()
    assert sum("keeps every field of this release's schema now" in r.getMessage()
               for r in caplog.records) == 1
    assert [(kind, reason) for kind, reason, _, _ in cluster.events] == [
        ("Warning", OUTDATED), ("Normal", CURRENT)]
    assert cluster.events[0][2] == crd_finding(stale()).problem
    assert {uid for *_, uid in cluster.events} == {"c0ffee"}  # about the CRD
    assert gauge(check) == [({"installed": schema_digest(), "release": schema_digest()}, 1.0)]


def test_a_current_crd_at_start_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    cluster = Cluster(installed(schema_digest()))
    with caplog.at_level(logging.INFO, logger="infertune.controller.crd_check"):
        assert cluster.check().check() is None
    assert cluster.events == [] and caplog.records == []


def test_a_newer_crd_is_noted_once_and_neither_posted_nor_alerted_on(
        caplog: pytest.LogCaptureFixture) -> None:
    """The upgrade as the docs say it: the new CRD applied first, while the older operator
    still runs; or a rollback, which keeps the newer CRD."""
    later = SCHEMA_GENERATION + 1
    more = installed(NEWER, adding="spec.newField", generation=later)
    fewer = installed(NEWER, QUEUE, generation=later)  # the newer release removed a field
    cluster = Cluster(more, more, fewer, fewer)
    check = cluster.check()
    with caplog.at_level(logging.INFO, logger="infertune.controller.crd_check"):
        for _ in range(4):
            assert check.check() is None
            assert gauge(check) == [({"installed": NEWER, "release": schema_digest()}, 1.0)]
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.WARNING]
    assert QUEUE in caplog.records[1].getMessage()
    assert cluster.events == []


def test_only_the_leader_posts_and_a_failed_post_is_tried_again() -> None:
    cluster = Cluster(stale(), stale(), stale())
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


def test_the_process_that_leads_when_it_is_fixed_says_so_whoever_warned() -> None:
    """An HA install: another process posted the Warning; this one, which saw the problem
    too, leads when the CRD is applied."""
    cluster = Cluster(stale(), installed(schema_digest()), installed(schema_digest()))
    cluster.leads = False
    check = cluster.check()
    check.check()
    cluster.leads = True
    check.check()
    check.check()
    assert [reason for _, reason, _, _ in cluster.events] == [CURRENT]
    # A process that did not lead when it was fixed leaves that to the one that did.
    cluster = Cluster(stale(), installed(schema_digest()), installed(schema_digest()))
    cluster.leads = False
    check = cluster.check()
    check.check()
    check.check()
    cluster.leads = True
    check.check()
    assert cluster.events == []


def test_a_missing_crd_is_an_error_and_a_zero_but_no_event(
        caplog: pytest.LogCaptureFixture) -> None:
    cluster = Cluster(None)
    check = cluster.check()
    with caplog.at_level(logging.ERROR, logger="infertune.controller.crd_check"):
        assert check.check() is not None
    assert "is not installed" in caplog.text
    assert cluster.events == []  # nothing to post it about
    assert gauge(check) == [({"installed": "absent", "release": schema_digest()}, 0.0)]


def test_a_crd_without_the_digest_is_labelled_none() -> None:
    cluster = Cluster(older(), installed(None))
    check = cluster.check()
    assert check.check() is not None
    assert gauge(check) == [({"installed": "none", "release": schema_digest()}, 0.0)]
    assert check.check() is None  # the same fields as this release's, without annotations
    assert cluster.events[-1][2] == (
        "the installed CRD keeps every field of infertune 0.1.0's schema (no digest "
        f"annotation; this release's is {schema_digest()})")


def test_a_crd_that_cannot_be_read_keeps_what_was_known(
        caplog: pytest.LogCaptureFixture) -> None:
    timeout = ApiException(status=504, reason="Gateway Timeout")
    cluster = Cluster(ApiException(status=403, reason="Forbidden"), stale(), timeout, timeout,
                      ConnectionError("read timed out after 9.99966 s"),
                      ConnectionError("read timed out after 9.99912 s"), stale())
    check = cluster.check()
    with caplog.at_level(logging.WARNING, logger="infertune.controller.crd_check"):
        assert check.check() is None and check.current is None
        assert gauge(check) == []  # nothing known yet: absent, not a 1 nor a 0
        assert "needs get on customresourcedefinitions" in caplog.text
        caplog.clear()
        check.check()
        caplog.clear()
        for _ in range(4):
            assert check.check() is None
            # Known to be outdated: still 0, so that the alert's `for` goes on counting.
            assert gauge(check) == [({"installed": OLD, "release": schema_digest()}, 0.0)]
        assert check.check() is not None
    # Once per kind of failure, whatever its text; the outdated CRD not said again.
    assert [r.levelno for r in caplog.records] == [logging.WARNING] * 2
    assert "504 Gateway Timeout" in caplog.text and "ConnectionError" in caplog.text
    assert "customresourcedefinitions" not in caplog.text  # no RBAC hint for those
    assert caplog.text.count("as the last read found") == 2
    assert [reason for _, reason, _, _ in cluster.events] == [OUTDATED]


def test_a_failure_is_said_again_after_a_read_that_worked(
        caplog: pytest.LogCaptureFixture) -> None:
    forbidden = ApiException(status=403, reason="Forbidden")
    cluster = Cluster(forbidden, ours(), forbidden)
    check = cluster.check()
    with caplog.at_level(logging.WARNING, logger="infertune.controller.crd_check"):
        for _ in range(3):
            check.check()
    assert [r.levelno for r in caplog.records] == [logging.WARNING] * 2
    assert "is not known" in caplog.records[0].getMessage()
    assert "as the last read found" in caplog.records[1].getMessage()


def test_a_hand_edited_digest_is_cut_in_the_message_and_the_label() -> None:
    cluster = Cluster(installed("x" * 100_000, QUEUE))
    check = cluster.check()
    problem = check.check()
    assert problem is not None and len(problem) < 2500
    assert "(100000 characters)" in problem
    [(labels, value)] = gauge(check)
    assert len(labels["installed"]) < 100 and value == 0.0


def test_the_thread_checks_at_once_goes_on_after_a_failure_and_stops_at_once() -> None:
    reads: list[float] = []

    def read() -> Mapping[str, Any] | None:
        reads.append(time.monotonic())
        if len(reads) == 2:
            raise RuntimeError("a bug in a check")  # the next one still runs
        return stale()

    check = CrdCheck(read, lambda *_: None, interval_s=0.05)
    started = time.monotonic()
    check.start()
    deadline = started + 10
    while len(reads) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(reads) >= 4 and reads[0] - started < 1.0
    assert check.current is False
    stopping = time.monotonic()
    check.stop()
    assert time.monotonic() - stopping < 1.5
    count = len(reads)
    time.sleep(0.2)
    assert len(reads) == count


class Response:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


class Extensions:
    """The two answers of ApiextensionsV1Api.read_custom_resource_definition that
    read_installed tells apart (the real API server's are in e2e/test_crd_check.py)."""

    def __init__(self, status: int | None) -> None:
        self.status = status
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def read_custom_resource_definition(self, name: str, **kwargs: Any) -> Response:
        self.asked.append((name, kwargs))
        if self.status is not None:
            raise ApiException(status=self.status, reason="Not Found")
        return Response(installed(schema_digest()))


def test_read_installed_reads_the_json_and_a_404_is_none() -> None:
    api = Extensions(None)
    crd = read_installed(api)  # type: ignore[arg-type]
    assert crd is not None and installed_digest(crd) == schema_digest()
    [(name, options)] = api.asked
    assert name == "inferencetunings.infertune.io"
    assert options["_preload_content"] is False and options["_request_timeout"] > 0
    assert read_installed(Extensions(404)) is None  # type: ignore[arg-type]
    with pytest.raises(ApiException):
        read_installed(Extensions(403))  # type: ignore[arg-type]


def test_stop_does_not_wait_for_a_read_in_flight() -> None:
    """An API server that does not answer holds the read for its timeout and retries (tens of
    seconds): the operator's shutdown does not wait for it."""
    reading, release = threading.Event(), threading.Event()

    def read() -> Mapping[str, Any] | None:
        reading.set()
        release.wait(30)
        return ours()  # after the test: nothing to log into another test's

    check = CrdCheck(read, lambda *_: None)
    check.start()
    try:
        assert reading.wait(5)
        stopping = time.monotonic()
        check.stop()
        assert time.monotonic() - stopping < 2.5
    finally:
        release.set()


def test_a_newer_crd_that_drops_fields_is_a_problem_once_it_lasts_longer_than_an_upgrade(
        caplog: pytest.LogCaptureFixture) -> None:
    """An upgrade is over in minutes; a rollback that is to stay keeps the newer CRD, and this
    release's fields are lost from its writes for as long as it does."""
    fewer = installed(NEWER, QUEUE, generation=SCHEMA_GENERATION + 1)
    cluster = Cluster(*[fewer] * 4, installed(schema_digest(), generation=SCHEMA_GENERATION))
    clock = [0.0]
    check = CrdCheck(cluster.read, cluster.post, lambda: True, clock=lambda: clock[0])
    with caplog.at_level(logging.INFO, logger="infertune.controller.crd_check"):
        assert check.check() is None
        clock[0] = NEWER_GRACE_S - 1
        assert check.check() is None and check.current is True and cluster.events == []
        clock[0] = NEWER_GRACE_S
        problem = check.check()
        assert problem is not None and "longer than an upgrade takes" in problem
        assert "kubectl apply -f charts/infertune/crds/" in problem
        assert check.current is False
        check.check()
        assert check.check() is None  # this release's CRD applied
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.ERROR, logging.INFO]
    assert [reason for _, reason, _, _ in cluster.events] == [OUTDATED, CURRENT]
    assert cluster.events[1][2] == ("the installed CRD keeps every field of infertune "
                                    f"0.1.0's schema (this release's digest, {schema_digest()})")


def test_an_event_message_is_cut_to_what_an_event_holds() -> None:
    crd = installed("x" * 5000)
    breach = node(crd, "status", "autoscaling", "state", "latencyBreaches")["items"]
    breach["properties"] = {}  # eleven fields of some sixty characters each, eight named
    cluster = Cluster(crd)
    assert len(cluster.check().check() or "") > MAX_EVENT_MESSAGE
    [(_, _, message, _)] = cluster.events
    assert len(message) == MAX_EVENT_MESSAGE
    assert "kubectl apply -f charts/infertune/crds/" in message  # the fix comes first
