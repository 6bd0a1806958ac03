"""kopf handlers: read, call the core, write, report. Nothing else lives here."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes import client

from infertune import keys
from infertune.api.spec import GROUP, PLURAL, VERSION
from infertune.controller.conditions import now_rfc3339
from infertune.controller.diffbase import LeanAnnotationsDiffBaseStorage
from infertune.controller.reconcile import (
    ACCEPTED,
    CONTAINER_NOT_FOUND,
    SHARED,
    TARGET_NOT_FOUND,
    Assessment,
    TargetState,
    assess,
)
from infertune.controller.status_patch import write_status
from infertune.kube.client import connection_info, read_deployment

RESOURCE = (GROUP, VERSION, PLURAL)
logger = logging.getLogger(__name__)


def _target_state(deployment: client.V1Deployment | None) -> TargetState | None:
    if deployment is None:
        return None
    pod_spec = deployment.spec.template.spec if deployment.spec else None
    return TargetState(
        name=str(deployment.metadata.name if deployment.metadata else ""),
        # What the scale subresource says, as the autoscaler reads it; not pods that exist yet.
        replicas=int(deployment.spec.replicas or 0) if deployment.spec else 0,
        containers=tuple(str(c.name) for c in (pod_spec.containers if pod_spec else [])),
    )


@kopf.on.startup()
def configure_kopf(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Our CRD's structural schema prunes kopf's default status.kopf, so its bookkeeping goes
    # into annotations under our prefix.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=keys.KOPF_PREFIX)
    settings.persistence.diffbase_storage = LeanAnnotationsDiffBaseStorage(
        prefix=keys.KOPF_PREFIX, key=keys.LAST_HANDLED)
    settings.persistence.finalizer = f"{keys.PREFIX}/finalizer"
    # Only warnings and errors become Events by themselves; decisions are posted explicitly.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.admission.server = memo.webhook_server


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """Use the credentials `infertune run` loaded (--kubeconfig, in-cluster, or $KUBECONFIG)."""
    return kopf.ConnectionInfo(**connection_info())


def _assessed(body: Mapping[str, Any], namespace: str, gone: bool = False) -> Assessment:
    """The tuning assessed against its target Deployment as it is now (`gone`: known to be
    deleted, so not read)."""
    name = str(((body.get("spec") or {}).get("targetRef") or {}).get("name") or "")
    deployment = read_deployment(namespace, name) if name and not gone else None
    return assess(dict(body), _target_state(deployment), now_rfc3339())


def _post(body: Mapping[str, Any], result: Assessment) -> None:
    for notice in result.notices:
        kopf.event(body, type=notice.type,  # type: ignore[arg-type]  # a plain object works
                   reason=notice.reason, message=notice.message)


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE, field="spec")
def reconcile(body: kopf.Body, namespace: str | None, patch: kopf.Patch, **_: Any) -> None:
    """Report on the InferenceTuning and its target; retry while the target is missing.

    The status goes out with kopf's own patch, right after kopf's bookkeeping annotations: the
    fields only the controller writes as a merge patch, and the lists it shares with the
    autoscaler (conditions, decisions) as a patch function that kopf applies to the newest
    body and sends only while the tuning is still at that version (`Assessment.merge_lists`).
    Written from inside the handler instead (tried, to make the write conditional), it made a
    version without those annotations, and with a thousand tunings created at once kopf
    handled each creation about 3.5 times over (bench/operator_bench.py: 3749 "Creation is
    processed" for 1000 tunings, and three times the memory)."""
    result = _assessed(body, namespace or "default")
    patch.status.update(result.patch())
    patch.fns.append(result.merge_lists)  # type: ignore[arg-type]
    _post(body, result)
    if result.retry_after is not None:
        raise kopf.TemporaryError("target Deployment not found", delay=result.retry_after)


def _target_news(type: str | None, namespace: str, name: str,
                 tunings_by_target: kopf.Index[tuple[str, str], dict[str, Any]],
                 body: Mapping[str, Any] | None = None, **_: Any) -> bool:
    """A Deployment event the tunings that target it must hear of: it was deleted, it is
    back while one of them says TargetNotFound, or its containers no longer agree with what
    one of them says of spec.container (renamed into the pod template, so ContainerNotFound
    is over; or out of it, so Accepted is). Any other Deployment event is filtered out
    before kopf runs (and logs) a handler."""
    entries: list[dict[str, Any]] = list(tunings_by_target.get((namespace, name), []))
    if type == "DELETED" or not entries:
        return bool(entries)
    containers = _container_names(body)
    return any(entry.get("ready") == TARGET_NOT_FOUND or _container_news(entry, containers)
               for entry in entries)


def _container_names(body: Mapping[str, Any] | None) -> set[str] | None:
    template = (((body or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = template.get("containers")
    if not isinstance(containers, list):
        return None
    return {str(c.get("name")) for c in containers if isinstance(c, Mapping)}


def _container_news(entry: Mapping[str, Any], containers: set[str] | None) -> bool:
    wanted = (entry.get("spec") or {}).get("container")
    if containers is None or not isinstance(wanted, str):
        return False
    ready = str(entry.get("ready"))
    if ready not in (CONTAINER_NOT_FOUND, ACCEPTED):
        return False  # another reason (InvalidSpec): no container edit settles it
    return (ready == CONTAINER_NOT_FOUND) == (wanted in containers)


REASSESS_ATTEMPTS = 5
REASSESS_PAUSE_S = 1.0
"""The first pause before a failed assessment is tried again (then 2, 4, 8 s)."""
SETTLE_S = 5.0
"""How long after re-assessing a Deployment's tunings they are assessed once more: kopf writes
a tuning handler's status after the handler returns, so one that read the Deployment just
before this change can land after the re-assessment."""


@kopf.on.event("apps", "v1", "deployments", when=_target_news)  # type: ignore[arg-type]
async def target_changed(type: str | None, namespace: str, name: str,
                         tunings_by_target: kopf.Index[tuple[str, str], dict[str, Any]],
                         **_: Any) -> None:
    """The reconcile handler runs when a tuning changes, not when its Deployment does: a
    Deployment deleted later left Ready=True, and one re-created left TargetNotFound. A
    watching handler: no finalizer and no annotation on anyone's Deployments.

    kopf does not retry an event handler that fails, so each tuning is assessed on its own
    and a failure (a 500, a 429, a timeout) is tried again a few times: one failure left a
    tuning Ready=True for a Deployment that was gone, and the others of that Deployment were
    not looked at.

    Each is assessed once more SETTLE_S later: the tuning's own handler (a spec change, or
    the operator's start) may have read the Deployment just before it was deleted, and kopf
    writes that handler's Ready=True after this one's Ready=False; it stayed so, the
    Deployment being gone, until the tuning changed again."""
    tunings = [str(entry["name"]) for entry in tunings_by_target.get((namespace, name), [])]
    what = f"Deployment {name} {'deleted' if type == 'DELETED' else 'changed'}"
    for tuning in tunings:
        await _reassess(namespace, tuning, what, type == "DELETED")
    await asyncio.sleep(SETTLE_S)
    for tuning in tunings:
        # Read, not taken as gone: it may be back by now, and its return is news only to a
        # tuning the index already shows TargetNotFound for.
        await _reassess(namespace, tuning, what, False)


async def _reassess(namespace: str, tuning: str, what: str, gone: bool) -> None:
    """`reassess`, tried again after a failure (a 500, a 429, a timeout), then logged with
    `what` happened."""
    for attempt in range(REASSESS_ATTEMPTS):
        try:
            await asyncio.to_thread(reassess, namespace, tuning, gone)
            return
        except Exception as exc:  # any failure: this tuning again, then the next one
            if attempt + 1 == REASSESS_ATTEMPTS:
                logger.error("[%s/%s] %s, and the tuning could not be assessed again (%s); "
                             "it is at its next change or the operator's restart",
                             namespace, tuning, what, exc)
                return
            await asyncio.sleep(REASSESS_PAUSE_S * 2 ** attempt)


def reassess(namespace: str, name: str, gone: bool) -> None:
    """Assess the tuning again, as `reconcile` does, and write what changed."""
    api = client.CustomObjectsApi()
    try:
        body = cast(dict[str, Any], api.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name))
    except client.exceptions.ApiException as exc:
        if exc.status == 404:
            return
        raise
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        # Going, held only by kopf's finalizer (an Argo CD app deleted removes the Deployment
        # and the tuning together): a TargetNotFound Warning and decision said nothing.
        return
    result = _assessed(body, namespace, gone)
    said_before = [False]  # in the status the patch that landed was built over

    def build(stored: Mapping[str, Any]) -> dict[str, Any]:
        said_before[0] = result.said_in(stored)
        holder = {"spec": body.get("spec") or {}, "status": copy.deepcopy(dict(stored))}
        result.merge_lists(holder)
        removed = {block: None for block in ("autoscaling", "batching")
                   if block in stored and block not in holder["status"]}
        patch = result.patch()
        if ((stored.get("autoscaling") or {}).get("evaluated") is not None
                and "autoscaling" in patch):
            # The autoscaler evaluated since the first read (built again after a 409): the
            # count there is its own now (reconcile.assess leaves it alone then), and the
            # replicas read before it scaled would stand over it.
            del patch["autoscaling"]
        return {**patch, **removed, **{k: holder["status"][k] for k in SHARED
                                       if k in holder["status"]}}

    # Assessed for this spec: if it has changed since, the handler of the new one writes (and
    # posts its own Events).
    landed = write_status(namespace, name, body.get("status") or {},
                          body["metadata"]["resourceVersion"], build,
                          still=lambda stored: stored.get("spec") == body.get("spec"))
    if landed is not None and not said_before[0]:
        # Not when another writer said it meanwhile (a 409, then built over its status).
        _post(body, result)
