"""The MutatingWebhookConfiguration for pod tuning, owned by the operator.

kopf can manage webhook configurations itself, but it writes no namespaceSelector, and the pod
webhook must never see kube-system or the operator's own namespace (a broken operator must not
stop its own pods from starting). So kopf serves the webhook and this module registers it,
with kopf's client config (URL and caBundle) and the selectors DESIGN.md asks for.

The same configuration holds a second webhook, the admission check of InferenceTunings
(controller/admission.py): one registration, CA and lifetime for both. It refuses an invalid
spec and changes nothing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime as dt
import logging
import os
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from infertune import keys
from infertune.api.spec import GROUP, PLURAL, VERSION

logger = logging.getLogger(__name__)

WEBHOOK_CONFIGURATION = "infertune-pod-tuning"
HANDLER_ID = "tune-pods"
TUNING_HANDLER_ID = "check-tunings"
"""The path and kopf handler id of the InferenceTuning admission check."""
REGISTER_ATTEMPTS = 3
REGISTRATION_CHECK_S = 30.0
"""How often a running operator checks that its webhook configuration is still there: an
operator process that stops removes the one it registered, though another may still serve
(an upgrade rolled back), and every pod was then admitted untuned until a restart."""
LEADS_POLL_S = 1.0
"""How often readiness looks at the Lease while it waits for kopf's indexes (`loaded`)."""
LOAD_WAIT_S = 900.0
"""How long readiness waits for kopf's indexes to load (RegisteringWebhookServer.loaded): the
first listing of every pod took six minutes in a cluster of 10,000 pods."""
REQUEST_TIMEOUT_S = 10.0
MATCH_REPLICASET = ("has(object.metadata.ownerReferences) && "
                    "object.metadata.ownerReferences.exists(r, r.kind == 'ReplicaSet' && "
                    "has(r.controller) && r.controller)")
"""The CEL matchCondition of the webhook: a pod a ReplicaSet controls (tuning/pod_shape.py's
controlling_replicaset). Kubernetes 1.30 makes matchConditions GA; an older API server that
does not know the field drops it, and every pod is sent, as before."""
SPEC_CHANGED = ("request.operation == 'CREATE' || "
                "(!has(object.metadata.deletionTimestamp) && object.spec != oldObject.spec)")
"""The CEL matchCondition of the InferenceTuning check: a create, or an update that changes
the spec of an object not being deleted. kopf's own updates (its finalizer, its annotations)
and a deletion are never sent: a slow operator does not slow them, a stopped one does not
add its timeout to them. The check itself does the same (admission.verdict) for an API
server that drops matchConditions."""
OPT_OUT_LABEL = f"{keys.PREFIX}/tuning"
"""Pods labelled infertune.io/tuning=disabled are never sent to the webhook."""
OPT_OUT_VALUE = "disabled"
REGISTERED_BY = f"{keys.PREFIX}/registered-by"
"""Annotation naming the operator process that registered the configuration last: the one
that may remove it."""
GLOB_CHARACTERS = "*?[]!,"
"""What makes a --namespace value a kopf pattern (globs, negation, several globs joined by
commas) rather than a name: namespace names never hold these."""


def is_pattern(namespace: str) -> bool:
    """Whether a --namespace value is one of kopf's patterns rather than a namespace name."""
    return bool(set(namespace) & set(GLOB_CHARACTERS))


@dataclass(frozen=True)
class WebhookRegistration:
    """Where and for whom the pod webhook is registered."""

    excluded_namespaces: tuple[str, ...]
    included_namespaces: tuple[str, ...] = ()
    """The namespaces a namespaced operator watches (--namespace): pods elsewhere are never
    sent to it, as it has no tunings there. Empty: every namespace but the excluded ones; so
    is a list with a kopf glob pattern (`team-*`, `!team-test`), which a namespaceSelector
    cannot express (kopf reads `*`, `?`, `!` and commas in them)."""
    service: tuple[str, str, int] | None = None
    """(namespace, name, port) of a Service in front of the webhook, for in-cluster use; when
    None the URL kopf reports is used (local runs and the test cluster)."""
    timeout_seconds: int = 5
    name: str = WEBHOOK_CONFIGURATION
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}/{os.getpid()}/"
                                               f"{uuid.uuid4().hex[:8]}")
    """This process, as the annotation REGISTERED_BY says it: in a rolling upgrade the new
    operator registers before the old one stops, and the old one must not remove the new
    one's registration on its way out (its clientConfig may be the same, with cert-manager)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)
    """Held by `apply` and `remove`: a registration in flight at shutdown (the periodic check,
    in a thread the task's cancellation does not stop) re-created the configuration after
    `remove`, pointing at a stopped server."""
    _removed: threading.Event = field(default_factory=threading.Event, compare=False,
                                      repr=False)
    _urls_said: set[str] = field(default_factory=set, compare=False, repr=False)
    """URLs of other processes' registrations this one has said it is not called through."""
    owned_by: str | None = None
    """A ClusterRole whose deletion deletes the configuration (Kubernetes' garbage collector
    follows its ownerReference): the chart's own, so that `helm uninstall` takes the
    configuration with it even when the operator's permissions are deleted before the
    operator has stopped and removed it itself."""

    def client_config(self, kopf_config: dict[str, Any],
                      handler: str = HANDLER_ID) -> dict[str, Any]:
        config: dict[str, Any] = {}
        if kopf_config.get("caBundle"):
            config["caBundle"] = kopf_config["caBundle"]
        if self.service is not None:
            namespace, name, port = self.service
            config["service"] = {"namespace": namespace, "name": name, "port": port,
                                 "path": f"/{handler}"}
        else:
            config["url"] = f"{str(kopf_config['url']).rstrip('/')}/{handler}"
        return config

    def body(self, kopf_config: dict[str, Any],
             owner_uid: str | None = None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name,
                                    "labels": {keys.MANAGED_BY_LABEL: keys.MANAGED_BY},
                                    "annotations": {REGISTERED_BY: self.owner}}
        if self.owned_by is not None and owner_uid is not None:
            metadata["ownerReferences"] = [{
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "name": self.owned_by, "uid": owner_uid}]
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": metadata,
            "webhooks": [{
                "name": f"pods.{keys.PREFIX}",
                "clientConfig": self.client_config(kopf_config),
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                           "operations": ["CREATE"], "scope": "Namespaced"}],
                # Fail safe (DESIGN.md #9): an unreachable operator never blocks pod creation.
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "matchPolicy": "Equivalent",
                "reinvocationPolicy": "Never",
                "namespaceSelector": {"matchExpressions": self._namespace_expressions()},
                "objectSelector": {"matchExpressions": [{
                    "key": OPT_OUT_LABEL, "operator": "NotIn", "values": [OPT_OUT_VALUE]}]},
                # Only the pods a ReplicaSet creates (the webhook tunes no other): every
                # other pod creation (a DaemonSet's, the CNI's, a Job's) was sent too, and
                # waited up to the timeout while the operator was slow or gone.
                "matchConditions": [{"name": "replicaset-pods", "expression": MATCH_REPLICASET}],
                "timeoutSeconds": self.timeout_seconds,
                "admissionReviewVersions": ["v1"],
            }, {
                "name": f"{PLURAL}.{keys.PREFIX}",
                "clientConfig": self.client_config(kopf_config, TUNING_HANDLER_ID),
                "rules": [{"apiGroups": [GROUP], "apiVersions": [VERSION], "resources": [PLURAL],
                           "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}],
                # A stopped operator never blocks an apply: the controller reports an
                # invalid spec in the tuning's status all the same.
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "matchPolicy": "Equivalent",
                "reinvocationPolicy": "Never",
                # Only where this operator acts on tunings (--namespace); no exclusions: a
                # refused InferenceTuning stops no pod.
                "namespaceSelector": {"matchExpressions": self._namespace_expressions(
                    excluding=False)},
                "matchConditions": [{"name": "spec-changed", "expression": SPEC_CHANGED}],
                "timeoutSeconds": self.timeout_seconds,
                "admissionReviewVersions": ["v1"],
            }],
        }

    def _namespace_expressions(self, excluding: bool = True) -> list[dict[str, Any]]:
        """The namespaceSelector's expressions: the namespaces this operator watches, and
        (`excluding`) none of the excluded ones."""
        name = "kubernetes.io/metadata.name"  # set by the API server on every namespace
        expressions: list[dict[str, Any]] = [] if not excluding else [
            {"key": name, "operator": "NotIn", "values": sorted(set(self.excluded_namespaces))}]
        if self.included_namespaces and not any(map(is_pattern, self.included_namespaces)):
            expressions.append({"key": name, "operator": "In",
                                "values": sorted(set(self.included_namespaces))})
        return expressions

    def apply(self, kopf_config: dict[str, Any], keep_owner: bool = False) -> None:
        """Create the configuration, or replace the one there whole: a patch merged our
        clientConfig into the old one, and a `url` left by an operator run outside the
        cluster next to the chart's `service` was refused (exactly one of them is allowed),
        which stopped the operator at every start. `keep_owner`: one there keeps the process
        that registered it last (REGISTERED_BY) while this one only puts its CA back in:
        taken over, the configuration went with this process when it stopped, although the
        one that had registered it since still served."""
        with self._lock:
            if not self._removed.is_set():  # stopping: nothing is registered any more
                self._apply(kopf_config, keep_owner)

    def _apply(self, kopf_config: dict[str, Any], keep_owner: bool = False) -> None:
        api = client.AdmissionregistrationV1Api()
        body = self.body(kopf_config, self._owner_uid())
        for _ in range(REGISTER_ATTEMPTS):
            try:
                api.create_mutating_webhook_configuration(body)  # type: ignore[arg-type]
                break
            except ApiException as exc:
                if exc.status != 409:
                    raise
            try:
                current = api.read_mutating_webhook_configuration(self.name)
                version = current.metadata.resource_version if current.metadata else None
                metadata = {**body["metadata"], "resourceVersion": version}
                owner = ((current.metadata.annotations if current.metadata else None)
                         or {}).get(REGISTERED_BY)
                if keep_owner and owner:
                    metadata["annotations"] = {**metadata["annotations"], REGISTERED_BY: owner}
                api.replace_mutating_webhook_configuration(self.name, {  # type: ignore[arg-type]
                    **body, "metadata": metadata,
                    "webhooks": [self._also_trusting(webhook, current)
                                 for webhook in body["webhooks"]]})
                break
            except ApiException as exc:
                if exc.status not in (404, 409):  # deleted, or changed, since the read
                    raise
        else:
            raise RuntimeError(f"{self.name} changed under each of {REGISTER_ATTEMPTS} "
                               "registrations")
        selected = {e["operator"]: ", ".join(e["values"]) for e in self._namespace_expressions()}
        logger.info("registered %s for pods in %s, excluding namespaces %s", self.name,
                    selected.get("In", "every namespace"),
                    selected["NotIn"])

    def _also_trusting(self, webhook: dict[str, Any], current: Any) -> dict[str, Any]:
        """`webhook` whose caBundle also holds the CAs the configuration in place trusts for
        the same Service (the newest others that have not expired, `bundle_with`). In a
        rolling upgrade without a shared certificate (webhook.certSecret), each operator pod
        serves one it made itself, and the old pod still answers for a few seconds after the
        new one registers: trusting only the new one, the API server failed those calls, and
        the pods created meanwhile were admitted untuned."""
        config = webhook["clientConfig"]
        # A webhook this release adds (the tunings' check) trusts what the others trust.
        configs = sorted((w for w in current.webhooks or [] if w.client_config is not None),
                         key=lambda w: w.name != webhook["name"])
        before = configs[0].client_config if configs else None
        if before is None or before.service is None or not before.ca_bundle:
            return webhook
        if (self.service is None or not config.get("caBundle")
                or _service_of(before) != self.service):
            return webhook
        return {**webhook, "clientConfig": {**config, "caBundle": bundle_with(
            config["caBundle"], before.ca_bundle)}}

    def _owner_uid(self) -> str | None:
        """The uid of the `owned_by` ClusterRole; None (and a warning: the configuration is
        then registered without an owner, and outlives the chart) when it cannot be read."""
        if self.owned_by is None:
            return None
        try:
            role = client.RbacAuthorizationV1Api().read_cluster_role(self.owned_by)
        except ApiException as exc:
            why = ("it does not exist" if exc.status == 404 else
                   "the operator may not get it (rbac-rules.yaml grants get on its own)"
                   if exc.status == 403 else f"{exc.status} {exc.reason}")
            logger.warning(f"{self.name} is registered without an owner, so it outlives an "
                           f"uninstall: --webhook-owner ClusterRole {self.owned_by}: {why}")
            return None
        return str(role.metadata.uid) if role.metadata and role.metadata.uid else None

    def still_registered(self, kopf_config: dict[str, Any]) -> bool:
        """Whether the configuration is there for this process: it exists and, through the
        same Service, trusts this process's CA. One registered since by another process at
        another URL is theirs (not fought over); a missing one was removed by another
        process that stopped (a rolled-back upgrade's new pod) while this one still serves."""
        current = self._current()
        if current is None:
            return False
        ours = self.client_config(kopf_config)
        if self.service is None or "caBundle" not in ours:
            return True
        there = next((w.client_config for w in current.webhooks or []
                      if w.client_config is not None and w.client_config.service is not None),
                     None)
        if there is None or there.service is None:
            # At a URL now: another process's (an `infertune run` outside the cluster), not
            # fought over. Said once per URL: left by one that stopped without removing it,
            # nothing in the cluster calls this process, and every pod is admitted untuned.
            self._said_at_url(current)
            return True
        if _service_of(there) != self.service:
            return True
        if {w["name"] for w in self.body(kopf_config)["webhooks"]} - {
                w.name for w in current.webhooks or []}:
            # Through this Service, but without one of this release's webhooks: the old pod
            # of an upgrade registered again, with the pods' webhook alone, and the tunings
            # were left unchecked until this process restarted. (More webhooks than this
            # release's, a newer one's, are left alone: the two would take turns.)
            return False
        return _holds(str(there.ca_bundle or ""), ours["caBundle"])

    def _said_at_url(self, current: Any) -> None:
        url = next((w.client_config.url for w in current.webhooks or []
                    if w.client_config is not None and w.client_config.url), None)
        if url is None or url in self._urls_said:
            return
        self._urls_said.add(url)
        by = ((current.metadata.annotations or {}).get(REGISTERED_BY)
              if current.metadata is not None else None)
        logger.warning("%s is registered at %s%s (an infertune run outside the cluster): the "
                       "API server calls that process, not this one; once it has stopped, "
                       "restart this operator (it registers again at start), or delete the "
                       "configuration and let this process make it again, or pods are "
                       "admitted untuned", self.name, url, f" by {by}" if by else "")

    def serves(self, kopf_config: dict[str, Any]) -> bool:
        """Whether the configuration in place brings the API server's calls to this process:
        through its Service (or at its URL), trusting its CA. Stricter than
        `still_registered`, which also says yes to another process's registration, to leave
        it alone: for readiness, that made a process Ready the API server could not call."""
        current = self._current()
        if current is None:
            return False
        ours = self.client_config(kopf_config)
        there = next((w.client_config for w in current.webhooks or []
                      if w.client_config is not None), None)
        if there is None:
            return False
        if self.service is not None:
            if _service_of(there) != self.service:
                return False
        elif there.url != ours.get("url"):
            return False
        return "caBundle" not in ours or _holds(str(there.ca_bundle or ""), ours["caBundle"])

    def _current(self) -> Any:
        """The configuration as the API server holds it, None when there is none."""
        try:
            return client.AdmissionregistrationV1Api().read_mutating_webhook_configuration(
                self.name, _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def remove(self) -> bool:
        """Delete the configuration if this process registered it last; whether it did. No
        registration is made after it."""
        with self._lock:
            self._removed.set()
            return self._remove()

    def _remove(self) -> bool:
        api = client.AdmissionregistrationV1Api()
        try:
            meta = api.read_mutating_webhook_configuration(self.name).metadata
            owner = ((meta.annotations if meta else None) or {}).get(REGISTERED_BY)
            if owner != self.owner:
                logger.info("left %s in place: registered since by %s", self.name, owner)
                return False
            # Only that version: a registration made after the read is not ours to remove.
            api.delete_mutating_webhook_configuration(self.name, body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(
                    resource_version=meta.resource_version if meta else None)))
        except ApiException as exc:
            if exc.status in (404, 409):  # gone already, or registered again meanwhile
                return False
            raise
        return True


MAX_REVIEW_BYTES = 8 * 1024 * 1024
"""The largest AdmissionReview the webhook reads. aiohttp's default (1 MiB, kopf's server
keeps it) answered a bigger one 413: a pod of over 1 MiB (an inline script, a long env; etcd
keeps objects up to 1.5 MiB, and an update's review carries the object twice) was admitted
untuned, re-tuning replaced it, and its replacement came back untuned, again and again."""


class RegisteringWebhookServer(kopf.WebhookServer):
    """kopf's HTTPS webhook server that also keeps our webhook configuration registered."""

    @staticmethod
    async def _serve(fn: Any, request: Any) -> Any:
        # kopf's own, over the request with MAX_REVIEW_BYTES as its limit.
        return await kopf.WebhookServer._serve(
            fn, request.clone(client_max_size=MAX_REVIEW_BYTES))

    def __init__(self, *, registration: WebhookRegistration,
                 check_s: float = REGISTRATION_CHECK_S, ready_file: Path | None = None,
                 loaded: asyncio.Event | None = None,
                 leads: Callable[[], bool] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.registration = registration
        self.check_s = check_s
        self.ready_file = ready_file
        """Exists while the configuration is registered for this process (`infertune run
        --ready-file`, the chart's readiness probe): kopf listens before it registers, and a
        pod Ready on a listening port alone took the Service's calls before the API server
        trusted its certificate, or while its registration failed, and the old pod it
        replaced stopped (pods admitted untuned meanwhile)."""
        self.loaded = loaded
        """Set once kopf's indexes hold their first listing (pods.PodTuningSettings.listed).
        kopf runs no handler, daemon or loop before that, which took minutes in a cluster of
        thousands of pods; Ready at once, the new pod of a rolling upgrade let the old one
        stop, and autoscaling, re-tuning and MIG stopped with it for as long. So while
        another process leads (`leads` false: the old pod of an upgrade, which serves the
        webhook meanwhile), the ready file waits for it too. A process that leads, or that
        runs without an election, is Ready once registered: with no other operator running
        (the only pod restarted), waiting would leave the webhook without an endpoint."""
        self.leads = leads
        self._registered = False
        # One left by a container that crashed: the pod's /tmp outlives it (an emptyDir).
        self._mark_ready(False)

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        keeper: asyncio.Task[None] | None = None
        waiter = (None if self.loaded is None or self.ready_file is None else
                  asyncio.create_task(self._ready_once_loaded(self.loaded)))
        try:
            async for kopf_config in super().__call__(fn):
                config = copy.deepcopy(dict(kopf_config))
                registered = await self.register(config)
                if keeper is not None:
                    keeper.cancel()
                keeper = asyncio.create_task(self._keep(config, registered))
                yield kopf_config
        finally:
            self._mark_ready(False)
            if keeper is not None:
                keeper.cancel()
            if waiter is not None:
                waiter.cancel()
            # A configuration pointing at a stopped server would add its timeout to every pod
            # creation in the cluster; remove it on the way out.
            try:
                await asyncio.to_thread(self.registration.remove)
            except Exception:  # pragma: no cover - best effort at shutdown
                logger.warning("could not remove %s", self.registration.name, exc_info=True)

    async def register(self, config: dict[str, Any], keep_owner: bool = False) -> bool:
        """Register; whether it was. A failure the API server may get over (429, 5xx, a
        timeout, a lost connection) is logged and tried again at the next check: raised, it
        stopped the whole operator (kopf ends on a failed webhook server), also when
        cert-manager rotated the certificate mid-life. A refusal (400, 403, 422) is raised."""
        try:
            await asyncio.to_thread(self.registration.apply, config, keep_owner)
        except ApiException as exc:
            if exc.status != 429 and (not isinstance(exc.status, int) or exc.status < 500):
                self._mark_ready(False)
                raise
            why = f"{exc.status} {exc.reason}"
        except (Urllib3Error, OSError) as exc:
            why = type(exc).__name__
        else:
            self._mark_ready(True)
            return True
        # A registration made before that still serves this process (the same CA, when
        # cert-manager's renewal restarted the server) keeps it Ready: not Ready for a
        # 429, the Service lost its only endpoint until the next check, 30 s later.
        still = await self._serves(config)
        self._mark_ready(still)
        logger.warning("could not register %s (%s); tried again in %gs%s",
                       self.registration.name, why, self.check_s,
                       "; the registration in place still serves this process" if still else
                       ", pods are admitted untuned meanwhile")
        return False

    async def _serves(self, config: dict[str, Any]) -> bool:
        """Whether the registration in place serves this process (`serves`)."""
        try:
            return await asyncio.to_thread(self.registration.serves, config)
        except Exception:  # the API server that failed the registration may fail this too
            return False

    async def _keep(self, config: dict[str, Any], registered: bool = True) -> None:
        """Check the registration every `check_s`, and register again when it is not there
        for this process (`still_registered`), or the last attempt failed."""
        while True:
            await asyncio.sleep(self.check_s)
            try:
                if registered and await asyncio.to_thread(self.registration.still_registered,
                                                          config):
                    continue
            except (ApiException, Urllib3Error, OSError) as exc:
                logger.debug("could not read %s: %s", self.registration.name, exc)
                continue
            if registered:
                logger.warning("%s is gone, no longer trusts this process's certificate, "
                               "or lacks one of its webhooks (another operator process "
                               "removed or replaced it): registering again",
                               self.registration.name)
            try:
                # Registered before: only its CA is put back, the process that registered
                # since stays the one that removes it (WebhookRegistration.apply).
                registered = await self.register(config, keep_owner=registered)
            except Exception:  # refused: said, and tried again at the next check
                logger.exception("could not register %s again", self.registration.name)
                registered = False

    async def _ready_once_loaded(self, loaded: asyncio.Event,
                                 longest_s: float = LOAD_WAIT_S) -> None:
        """Mark ready (if registered) once the indexes are loaded, or this process leads:
        the Lease is looked at every LEADS_POLL_S."""
        deadline = asyncio.get_running_loop().time() + longest_s
        while not self._loaded_or_leading():
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                # No node event (a cluster without nodes, a watch refused): Ready as before
                # rather than never.
                logger.warning("kopf's indexes did not report loaded within %gs; Ready once "
                               "registered from now on", longest_s)
                loaded.set()
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(loaded.wait(), min(LEADS_POLL_S, left))
        self._mark_ready(self._registered)

    def _loaded_or_leading(self) -> bool:
        return (self.loaded is None or self.loaded.is_set()
                or self.leads is None or self.leads())

    def _mark_ready(self, ready: bool) -> None:
        """Ready while registered and, with `loaded`, once the indexes are loaded or this
        process leads (`loaded`)."""
        self._registered = ready
        if not self._loaded_or_leading():
            ready = False
        if self.ready_file is None:
            return
        try:
            if ready:
                self.ready_file.touch()
            else:
                self.ready_file.unlink(missing_ok=True)
        except OSError as exc:  # a readiness probe that fails says more than a crash
            logger.warning("could not %s %s: %s", "create" if ready else "remove",
                           self.ready_file, exc)


def _service_of(client_config: Any) -> tuple[str, str, int] | None:
    """(namespace, name, port) of the Service a webhook's clientConfig calls, if any."""
    service = client_config.service
    return None if service is None else (service.namespace, service.name, service.port)


def _holds(bundle: str, ours: str) -> bool:
    """Whether the base64 PEM `bundle` holds every certificate of `ours`."""
    try:
        held = x509.load_pem_x509_certificates(base64.b64decode(bundle))
        wanted = x509.load_pem_x509_certificates(base64.b64decode(ours))
    except ValueError:
        return bundle == ours
    return all(c in held for c in wanted)


OTHER_CAS = 10
"""The CAs of other operator processes a registration keeps trusting (the newest ones): the
serving pod of a rolling upgrade stays trusted when a new pod crashes and starts again (each
start makes a CA), or two upgrades come one after the other. With one, the CA of a dead
process pushed out the serving one's, and pods were admitted untuned until its next check;
with three, the fourth start of a new pod in a crash loop (OOM-killed while it lists the
cluster) did. A CA is about 1.1 KB of PEM."""


def bundle_with(new: str, current: str, now: dt.datetime | None = None) -> str:
    """The base64 caBundle `new` followed by the newest OTHER_CAS certificates of `current`
    that are not in it and have not expired: a bundle does not grow with every restart."""
    now = now or dt.datetime.now(dt.UTC)
    try:
        fresh = x509.load_pem_x509_certificates(base64.b64decode(new))
        held = x509.load_pem_x509_certificates(base64.b64decode(current))
    except ValueError:  # not PEM (edited by hand): ours alone
        return new
    kept = [c for c in held if c not in fresh and c.not_valid_after_utc > now]
    if not kept:
        return new
    newest = sorted(kept, key=lambda c: c.not_valid_before_utc, reverse=True)[:OTHER_CAS]
    pem = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in [*fresh, *newest])
    return base64.b64encode(pem).decode()
