"""Status blocks written only when they change.

kopf sends every non-empty patch. A PATCH that changes nothing is not stored (the API server
sees the no-op and keeps the resourceVersion), but both sides still pay for it: the operator
serialises and sends it, the API server authenticates, decodes, merges and validates it. The
timers that report a block every few seconds (re-tuning every 10 s, MIG every 3 s) therefore
compare it with what status holds first: with 1000 tunings an unchanged re-tuning block alone
would be 100 requests a second.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf


def as_stored(value: Any) -> Any:
    """`value` as the API server stores it after a JSON merge patch: a None in an object
    removes that key, so it is never stored (lists are replaced whole, their objects too)."""
    if isinstance(value, Mapping):
        return {k: as_stored(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [as_stored(v) for v in value]
    return value


def set_if_changed(patch: kopf.Patch, status: Mapping[str, Any], field: str,
                   block: dict[str, Any]) -> bool:
    """Put `block` in the status patch as `field` unless `status` holds it already; True when
    it was put. None values stay in the patch, so keys that lost their value are removed."""
    if as_stored(status.get(field)) == as_stored(block):
        return False
    patch.status[field] = block
    return True
