"""kopf's last-handled-configuration storage, built without copying what it throws away.

On every watch event kopf builds the object's "essence" (the body less status and system
metadata) to compare it with the one it stored. `AnnotationsDiffBaseStorage.build` deep-copies
the whole body first and deletes status and metadata afterwards. An InferenceTuning's status
(the autoscaling state, conditions, decisions) and its metadata.managedFields are most of the
object, and the autoscaler's status write makes one watch event per tuning per interval: that
copy was ~9% of the operator's CPU at 1000 tunings (bench/README.md). This storage hands kopf
the body without them, so the essence and what kopf stores are exactly what they were.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

import kopf

KEPT_METADATA = ("labels", "annotations", "ownerReferences")
"""What kopf reads of metadata: the essence keeps labels and annotations (less some
annotations), and the storage's key depends on the owners (`CollisionEvadingConvention`)."""


class LeanAnnotationsDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    def build(self, *, body: Any, extra_fields: Iterable[Any] | None = None) -> Any:
        fields = list(extra_fields or ())
        if any(_top(field) in ("status", "metadata") for field in fields):
            # A handler watches a status or metadata field: kopf needs the whole body.
            return super().build(body=body, extra_fields=fields)
        metadata: Mapping[str, Any] = body.get("metadata") or {}
        lean = {key: value for key, value in body.items() if key not in ("status", "metadata")}
        kept = {key: metadata[key] for key in KEPT_METADATA if key in metadata}
        if kept:
            lean["metadata"] = kept
        return super().build(body=kopf.Body(cast(kopf.RawBody, lean)), extra_fields=fields)


def _top(field: Any) -> str:
    """The first key of a kopf field spec: "a.b", ["a", "b"] or ("a", "b")."""
    if isinstance(field, str):
        return field.split(".", 1)[0]
    return str(next(iter(field), ""))
