"""The lean diff-base storage gives kopf the same essence as kopf's own, without copying
status and system metadata."""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest

from infertune import keys
from infertune.controller.diffbase import LeanAnnotationsDiffBaseStorage


class NotCopyable:
    """Stands for the bulk of a status: copying it is what the lean storage avoids."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        raise AssertionError("deep-copied")


def _body(status: Any = None, managed: Any = None) -> dict[str, Any]:
    return {
        "apiVersion": "infertune.io/v1alpha1", "kind": "InferenceTuning",
        "metadata": {
            "name": "qwen", "namespace": "team-a", "uid": "u1", "resourceVersion": "42",
            "generation": 3, "managedFields": managed or [{"manager": "kopf", "fieldsV1": {}}],
            "labels": {"team": "a"},
            "annotations": {
                f"{keys.KOPF_PREFIX}/{keys.LAST_HANDLED}": '{"spec":{}}\n',
                f"{keys.KOPF_PREFIX}/kopf-managed": "yes",
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
                "argocd.argoproj.io/tracking-id": "app:infertune.io/InferenceTuning:team-a/qwen",
            },
            "finalizers": [f"{keys.PREFIX}/finalizer"],
        },
        "spec": {"targetRef": {"name": "qwen"}, "engine": "vllm",
                 "autoscaling": {"interval": "15s"}},
        "status": status if status is not None else {
            "phase": "Ready", "autoscaling": {"state": {"recommendations": []}},
            "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _storages() -> tuple[kopf.AnnotationsDiffBaseStorage, LeanAnnotationsDiffBaseStorage]:
    args = {"prefix": keys.KOPF_PREFIX, "key": keys.LAST_HANDLED}
    return kopf.AnnotationsDiffBaseStorage(**args), LeanAnnotationsDiffBaseStorage(**args)


BODIES = {
    "full": _body(),
    "no labels or annotations": {**_body(), "metadata": {"name": "qwen", "uid": "u1"}},
    "no metadata": {k: v for k, v in _body().items() if k != "metadata"},
    "no status": {k: v for k, v in _body().items() if k != "status"},
    # kopf's key differs for a ReplicaSet a Deployment owns, and without its own marker the
    # annotation under the plain key stays in the essence.
    "owned by a Deployment": {**_body(), "kind": "ReplicaSet", "metadata": {
        "ownerReferences": [{"kind": "Deployment", "name": "d"}],
        "annotations": {f"{keys.KOPF_PREFIX}/{keys.LAST_HANDLED}": "{}"}}},
    "extra top-level stanza": {**_body(), "data": {"a": 1}},
}
EXTRA_FIELDS: dict[str, Any] = {
    "none": None,
    "spec": {("spec",)},
    "dotted spec field": ["spec.autoscaling"],
    "status field": {("status", "phase")},
    "metadata field": ["metadata.finalizers"],
}


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
@pytest.mark.parametrize("extra", EXTRA_FIELDS.values(), ids=EXTRA_FIELDS.keys())
def test_the_essence_is_what_kopf_builds(body: dict[str, Any], extra: Any) -> None:
    kopfs, lean = _storages()
    expected = kopfs.build(body=kopf.Body(copy.deepcopy(body)), extra_fields=extra)
    assert lean.build(body=kopf.Body(body), extra_fields=extra) == expected


def test_status_and_managed_fields_are_not_copied() -> None:
    kopfs, lean = _storages()
    body = _body(status={"autoscaling": NotCopyable()}, managed=[NotCopyable()])
    essence = lean.build(body=kopf.Body(body), extra_fields={("spec",)})
    assert essence["spec"] == body["spec"]
    assert "status" not in essence and "managedFields" not in essence.get("metadata", {})
    with pytest.raises(AssertionError, match="deep-copied"):
        kopfs.build(body=kopf.Body(body))


def test_the_essence_does_not_share_the_bodys_objects() -> None:
    _, lean = _storages()
    body = _body()
    essence = lean.build(body=kopf.Body(body))
    essence["spec"]["autoscaling"]["interval"] = "1m"
    essence["metadata"]["labels"]["team"] = "b"
    assert body["spec"]["autoscaling"]["interval"] == "15s"
    assert body["metadata"]["labels"]["team"] == "a"


def test_a_watched_status_field_is_kept() -> None:
    _, lean = _storages()
    essence = lean.build(body=kopf.Body(_body()), extra_fields=["status.phase"])
    assert essence["status"] == {"phase": "Ready"}
