"""kopf handlers: read, call the core, write, report. Nothing else lives here."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from infertune import keys
from infertune.api.spec import GROUP, PLURAL, VERSION
from infertune.controller.conditions import now_rfc3339
from infertune.controller.reconcile import TargetState, assess
from infertune.controller.status_patch import write_status
from infertune.kube.client import connection_info, read_deployment

RESOURCE = (GROUP, VERSION, PLURAL)


def _target_state(deployment: client.V1Deployment | None) -> TargetState | None:
    if deployment is None:
        return None
    pod_spec = deployment.spec.template.spec if deployment.spec else None
    status = deployment.status
    return TargetState(
        name=str(deployment.metadata.name if deployment.metadata else ""),
        # What the scale subresource says, as the autoscaler reads it; not pods that exist yet.
        replicas=int(deployment.spec.replicas or 0) if deployment.spec else 0,
        ready_replicas=int(status.ready_replicas or 0) if status else 0,
        containers=tuple(str(c.name) for c in (pod_spec.containers if pod_spec else [])),
    )


@kopf.on.startup()
def configure_kopf(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Our CRD's structural schema prunes kopf's default status.kopf, so its bookkeeping goes
    # into annotations under our prefix.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=keys.KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
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


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE, field="spec")
def reconcile(body: kopf.Body, namespace: str | None, **_: Any) -> None:
    """Report on the InferenceTuning and its target; retry while the target is missing.

    The status is written here rather than through kopf's patch: it goes in only over the
    version this handler read (status_patch.write_status), because the autoscaler writes the
    same conditions and decisions lists."""
    spec = body.get("spec") or {}
    target_name = str((spec.get("targetRef") or {}).get("name") or "")
    deployment = read_deployment(namespace or "default", target_name) if target_name else None
    target = _target_state(deployment)
    now, assessed = now_rfc3339(), []

    def build(stored: Mapping[str, Any]) -> dict[str, Any]:
        # Over the status the event carried, or a newer one if someone wrote in between.
        assessed.append(assess({**body, "status": dict(stored)}, target, now))
        return assessed[-1].patch()

    try:
        write_status(namespace or "default", str(body["metadata"]["name"]),
                     body.get("status") or {}, (body.get("metadata") or {}).get("resourceVersion"),
                     build)
    except ApiException as exc:
        if exc.status == 404:
            return  # deleted since the event: nothing to report on
        raise
    result = assessed[-1]
    for notice in result.notices:
        kopf.event(body, type=notice.type, reason=notice.reason, message=notice.message)
    if result.retry_after is not None:
        raise kopf.TemporaryError("target Deployment not found", delay=result.retry_after)
