"""Status writes: blocks written only when they change, and shared lists never overwritten.

A PATCH that changes nothing is not stored (the API server sees the no-op and keeps the
resourceVersion), but both sides still pay for it: the operator serialises and sends it, the
API server authenticates, decodes, merges and validates it. The loops that report a block
every few seconds (re-tuning every 10 s, MIG every 3 s) therefore compare it with what status
holds first (`loops.changed_blocks`): with 1000 tunings an unchanged re-tuning block alone
would be 100 requests a second.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from infertune.api.spec import GROUP, PLURAL, VERSION

CONFLICT_ATTEMPTS = 5
"""Tries of a conditional status write before giving up; each retry is preceded by a read, so
another writer would have to land inside that short window every time."""

Build = Callable[[Mapping[str, Any]], dict[str, Any] | None]
"""The status patch to write over a stored status (None: nothing to write)."""


def as_stored(value: Any) -> Any:
    """`value` as the API server stores it after a JSON merge patch: a None in an object
    removes that key, so it is never stored (lists are replaced whole, their objects too)."""
    if isinstance(value, Mapping):
        return {k: as_stored(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [as_stored(v) for v in value]
    return value


def merge_patch(stored: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`patch` applied to `stored` as the API server applies a JSON merge patch (RFC 7386):
    None removes a field, objects merge, anything else replaces."""
    out = dict(stored)
    for field_name, value in patch.items():
        if value is None:
            out.pop(field_name, None)
        elif isinstance(value, Mapping):
            before = out.get(field_name)
            out[field_name] = merge_patch(before if isinstance(before, Mapping) else {}, value)
        else:
            out[field_name] = value
    return out


def write_status(namespace: str, name: str, status: Mapping[str, Any],
                 resource_version: str | None, build: Build,
                 api: client.CustomObjectsApi | None = None,
                 still: Callable[[Mapping[str, Any]], bool] | None = None,
                 ) -> dict[str, Any] | None:
    """Write `build(status)` to the tuning's status, as a JSON merge patch that holds only while
    the tuning is still at `resource_version`; the patch that landed is returned.

    Several writers share `status.conditions` and `status.decisions` (the controller and the
    autoscaler), and a merge patch replaces a list whole: a writer that built its list from an
    older copy would silently drop what another wrote in between (a Ready condition, a decision
    record). With the resourceVersion in the patch the API server refuses such a write (409
    Conflict); the status is then read again and the patch built again from what is stored.
    `still`, given the object read again, says whether the write is still wanted: one planned
    for a spec that has changed since (autoscaling removed) must not be built over the new
    status, where it would put back what the new spec's handling took away.
    """
    api = api or client.CustomObjectsApi()
    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        patch = build(status)
        if not patch:
            return None
        body: dict[str, Any] = {"status": patch}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            api.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name,
                                                      body)
            return patch
        except ApiException as exc:
            if exc.status != 409 or attempt == CONFLICT_ATTEMPTS:
                raise
        stored: dict[str, Any] = api.get_namespaced_custom_object_status(  # type: ignore[assignment]
            GROUP, VERSION, namespace, PLURAL, name)
        if still is not None and not still(stored):
            return None
        status = stored.get("status") or {}
        resource_version = stored["metadata"]["resourceVersion"]
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises
