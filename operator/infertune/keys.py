"""Every label, annotation and finalizer key the operator reads or writes, in one place."""

from __future__ import annotations

import hashlib
import re

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
SHAPE = f"{PREFIX}/shape"
"""Label: the tuning revision without spec.memory (pod_patch.shape_revision): a pod whose
revision is outdated but whose shape is current takes the change in place."""
MEMORY_HIGH = f"{PREFIX}/memory-high"
"""Annotation: the memory.high intent, in bytes, for the node agent."""
SERVING_CONTAINER = f"{PREFIX}/serving-container"
"""Annotation: the name of the container the webhook tuned (the memory.high intent is its)."""
DRY_RUN_PLAN = f"{PREFIX}/dry-run-plan"
"""Annotation: in DryRun, what the webhook would have changed."""
UNTUNED = f"{PREFIX}/untuned"
"""Annotation: `<revision>: <why>` on a pod of a tuning the webhook admitted untuned (it
refused to tune it): the verdict every operator process reads from the pods (re-tuning runs
in the leader, and any process's webhook may have admitted the pod)."""

# The operator's own objects.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "infertune"

LABEL_VALUE_MAX = 63
"""Kubernetes label values: at most 63 characters."""
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def label_problem(key: str, value: str) -> str | None:
    """What makes `key: value` no Kubernetes label (no node can carry it), None if it is one:
    the rules of the API server's validation (an optional DNS-subdomain prefix and "/", a name
    of at most 63 characters; a value of at most 63, possibly empty)."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and not (prefix and len(prefix) <= 253 and _LABEL_PREFIX.fullmatch(prefix)):
        return (f"the key's prefix {prefix!r} is not a DNS subdomain (lowercase a-z, 0-9, '-' "
                "and '.', at most 253 characters)")
    if not (len(name) <= LABEL_VALUE_MAX and _LABEL_NAME.fullmatch(name)):
        return (f"the key {key!r} is not a label key: its name must be 1 to 63 characters of "
                "a-z, A-Z, 0-9, '-', '_' and '.', starting and ending with a letter or digit")
    if value and not (len(value) <= LABEL_VALUE_MAX and _LABEL_NAME.fullmatch(value)):
        return (f"the value {value!r} is not a label value: at most 63 characters of a-z, A-Z, "
                "0-9, '-', '_' and '.', starting and ending with a letter or digit")
    return None


def label_value(text: str) -> str:
    """`text` (already of label-value characters) as a label value: a longer one keeps a
    prefix and ends in a hash of the whole, so it stays stable and distinct."""
    if len(text) <= LABEL_VALUE_MAX:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return f"{text[:LABEL_VALUE_MAX - len(digest) - 1].rstrip('-.')}-{digest}"
