"""Every label, annotation and finalizer key the operator reads or writes, in one place."""

from __future__ import annotations

import hashlib

PREFIX = "infertune.io"

# kopf's own bookkeeping (handler progress, last handled spec) lives in annotations under our
# prefix: the CRD's structural schema would prune kopf's default status.kopf field.
KOPF_PREFIX = PREFIX
LAST_HANDLED = "last-handled-configuration"

# On pods tuned by the webhook.
TUNED_BY = f"{PREFIX}/tuned-by"
"""Label: the name of the InferenceTuning that tuned the pod."""
REVISION = f"{PREFIX}/revision"
"""Label: the tuning revision (hash of the tuning-relevant spec) the pod carries."""
MEMORY_HIGH = f"{PREFIX}/memory-high"
"""Annotation: the memory.high intent, in bytes, for the node agent."""
DRY_RUN_PLAN = f"{PREFIX}/dry-run-plan"
"""Annotation: in DryRun, what the webhook would have changed."""

# The operator's own objects.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "infertune"

LABEL_VALUE_MAX = 63
"""Kubernetes label values: at most 63 characters."""


def label_value(text: str) -> str:
    """`text` (already of label-value characters) as a label value: a longer one keeps a
    prefix and ends in a hash of the whole, so it stays stable and distinct."""
    if len(text) <= LABEL_VALUE_MAX:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return f"{text[:LABEL_VALUE_MAX - len(digest) - 1].rstrip('-.')}-{digest}"
