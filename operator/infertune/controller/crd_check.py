"""Whether the installed InferenceTuning CRD keeps every field of this release's schema.

Helm installs a chart's `crds/` on the first install only. An upgrade that leaves the older
CRD in place runs the new operator against the older schema, and the API server prunes,
without a word, every field that schema does not know: a spec field the new release added
(set in a manifest, and gone from the stored object), and what the operator stores in status
(the autoscaler's state, such as `status.autoscaling.state.queue`, which its backlog rules
read: pruned, they stay off and nothing says why).

The operator reads the installed CRD at start and every CHECK_S after. The CRD each release
generates carries the digest of its spec (api/crd.py, SCHEMA_DIGEST_ANNOTATION): the same
digest is this release's CRD. Another one (or none) is compared field by field with this
release's schema, and only the fields it would drop are a problem: a newer release's CRD
(applied before the operator's upgrade, as the docs say, or kept by a rollback) drops
nothing, nor does one that differs in descriptions. A problem is said as an error in the
log naming the fields, a Warning Event on the CRD (from the process that leads), and the
gauge `infertune_crd_schema_current` at 0, which the chart's alert InfertuneCRDOutdated
fires on. The operator goes on working meanwhile, as it would have without the check.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from functools import cache
from typing import Any, NamedTuple

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from infertune import __version__
from infertune.api import spec as api
from infertune.api.crd import (
    CRD_NAME,
    SCHEMA_DIGEST_ANNOTATION,
    custom_resource_definition,
    installed_digest,
    schema_digest,
)
from infertune.api.units import shown

logger = logging.getLogger(__name__)

CHECK_S = 60.0
"""How often the installed CRD is read again after start-up: once it is applied, the log,
the Event and the gauge say so within a minute, without a restart."""
REQUEST_TIMEOUT_S = 10.0
OUTDATED = "CRDOutdated"
"""Reason of the Warning Event when the installed CRD drops fields of this release's."""
CURRENT = "CRDCurrent"
"""Reason of the Normal Event when it keeps them again."""
MAX_EVENT_MESSAGE = 1024
MAX_NAMED = 8
"""The most dropped fields a message names (then how many more)."""
FIX = ("apply this release's CRD: `kubectl apply -f charts/infertune/crds/` from the chart of "
       "the release (Helm installs a chart's CRDs on the first install only), or "
       "`infertune crds | kubectl apply -f -` with its image")
PRESERVE = "x-kubernetes-preserve-unknown-fields"
CONSEQUENCES = {
    "status.autoscaling.state.queue": "without status.autoscaling.state.queue the autoscaler's "
                                      "rules that tell a draining backlog from the load stay "
                                      "off",
}
"""What the loss of a field does, where it is not plain from its name."""


class Finding(NamedTuple):
    problem: str | None
    """Why the installed CRD does not do (it drops fields of this release's schema, or is not
    installed); None when it does."""
    note: str | None = None
    """When it does but is not this release's: what it is (said once, as info)."""


def dropped_fields(ours: Mapping[str, Any], theirs: Mapping[str, Any],
                   path: str = "") -> list[str]:
    """The fields of structural schema `ours` that the API server prunes from an object under
    schema `theirs` (as `spec.x.y`, `status.conditions[].reason`; a field dropped whole is
    named, not what is under it)."""
    out: list[str] = []
    _dropped(ours, theirs, path, out)
    return out


def _dropped(ours: Mapping[str, Any], theirs: Any, path: str, out: list[str]) -> None:
    if not isinstance(theirs, Mapping) or theirs.get(PRESERVE) is True:
        return  # kept whole (or not a schema this can read: nothing is claimed)
    if ours.get(PRESERVE) is True:
        # Free-form here, not there: whatever `theirs` does not name is dropped.
        out.append(f"{path} (any field it does not name)")
        return
    named = theirs.get("properties")
    named = named if isinstance(named, Mapping) else {}
    extra = theirs.get("additionalProperties")
    for name, sub in (ours.get("properties") or {}).items():
        child = f"{path}.{name}" if path else str(name)
        if name in named:
            _dropped(sub, named[name], child, out)
        elif isinstance(extra, Mapping):
            _dropped(sub, extra, child, out)
        elif extra is not True:
            out.append(child)
    if isinstance(ours.get("items"), Mapping):
        _dropped(ours["items"], theirs.get("items"), f"{path}[]", out)
    if isinstance(ours.get("additionalProperties"), Mapping):
        _dropped(ours["additionalProperties"], extra, f"{path}.*", out)


def _schema(crd: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The openAPIV3Schema of the CRD's version this release serves, if it serves it."""
    for version in (crd.get("spec") or {}).get("versions") or ():
        if isinstance(version, Mapping) and version.get("name") == api.VERSION:
            if version.get("served") is False:
                return None
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            return schema if isinstance(schema, Mapping) else None
    return None


def crd_finding(installed: Mapping[str, Any] | None,
                ours: Mapping[str, Any] | None = None) -> Finding:
    """What the installed CRD (as the API server returns it; None when it is not installed)
    means for this release, whose CRD is `ours` (custom_resource_definition())."""
    ours = _release_crd() if ours is None else ours
    if installed is None:
        return Finding(f"the InferenceTuning CRD ({CRD_NAME}) is not installed, so no "
                       f"InferenceTuning can be created or handled: {FIX}")
    digest = installed_digest(ours) or ""
    theirs = installed_digest(installed)
    if theirs == digest:
        return Finding(None)
    said = (f"its schema digest is {_shown(theirs)}, infertune {__version__}'s {digest}"
            if theirs else f"it has no {SCHEMA_DIGEST_ANNOTATION} annotation: a release "
            "before the annotation's, or applied by hand")
    schema, wanted = _schema(installed), _schema(ours)
    assert wanted is not None
    if schema is None:
        return Finding(f"the installed InferenceTuning CRD ({CRD_NAME}) does not serve "
                       f"{api.GROUP}/{api.VERSION} with a schema ({said}): {FIX}")
    dropped = dropped_fields(wanted, schema)
    if not dropped:
        return Finding(None, f"the installed CRD {CRD_NAME} is not this release's ({said}), "
                       "but keeps every field of its schema, so nothing is dropped (a newer "
                       "release's, or one that differs in descriptions or columns)")
    named = ", ".join(dropped[:MAX_NAMED]) + (
        f" and {len(dropped) - MAX_NAMED} more" if len(dropped) > MAX_NAMED else "")
    why = "".join(f"; {text}" for field, text in CONSEQUENCES.items() if field in dropped)
    return Finding(
        f"the installed InferenceTuning CRD ({CRD_NAME}) is not this release's ({said}): its "
        f"schema lacks {len(dropped)} of this release's fields, which the API server drops "
        f"from every write without a word ({named}){why}; {FIX}")


@cache
def _release_crd() -> Mapping[str, Any]:
    return custom_resource_definition()


DIGEST = re.compile(r"sha256:[0-9a-f]{16}")
NO_DIGEST = "none"
ABSENT = "absent"


def _shown(digest: str) -> str:
    """A digest as read from the cluster, for a message or a label: an annotation edited by
    hand may hold any text, up to the 256 kB of a whole object's annotations."""
    return digest if DIGEST.fullmatch(digest) else shown(digest)


class CrdCheck:
    """The check, its last finding, and the thread that repeats it every `interval_s`.

    `read` returns the installed CRD as JSON, None when it is not installed (404), and raises
    what the API raises otherwise; `post(type, reason, message, crd)` posts an Event about
    `crd`; `leads()` says whether this process leads (only the leader posts Events, so that
    the replicas of an HA install do not each post one)."""

    def __init__(self, read: Callable[[], Mapping[str, Any] | None],
                 post: Callable[[str, str, str, Mapping[str, Any]], None],
                 leads: Callable[[], bool] = lambda: True, interval_s: float = CHECK_S) -> None:
        self._read, self._post, self._leads = read, post, leads
        self.interval_s = interval_s
        self.current: bool | None = None
        """True while the installed CRD keeps every field of this release's schema, False
        while it does not (or is not installed), None before it was first read (the gauge is
        absent then). A read that fails keeps what the last one found."""
        self.installed = ""
        """The installed CRD's digest as the gauge labels it: NO_DIGEST when it has none,
        ABSENT when it is not installed, quoted and cut when it is no digest."""
        self._said: str | None = None
        """The problem last logged ("" for none, None before the first reading)."""
        self._noted: str | None = None
        self._unreadable: str | None = None
        self._posted: str | None = None
        """The problem of the last Warning Event this process posted, if it has not posted
        the Normal one since."""
        self._seen = False
        """This process found a problem the Normal Event has not been posted for: the one
        that leads once it is gone posts it, whichever posted the Warning."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> str | None:
        """Read the installed CRD and report what changed; the problem found, None when there
        is none or the CRD could not be read."""
        try:
            installed = self._read()
        except Exception as exc:  # forbidden, unreachable: what was known stays
            self._say_unreadable(exc)
            return None
        self._unreadable = None
        problem, note = crd_finding(installed)
        self.current = problem is None
        digest = None if installed is None else installed_digest(installed)
        self.installed = (ABSENT if installed is None else NO_DIGEST if digest is None
                          else _shown(digest))
        if (problem or "") != self._said:
            if problem:
                logger.error(problem)
            elif self._said is not None:
                logger.info(f"the installed CRD {CRD_NAME} keeps every field of this "
                            f"release's schema now ({self.installed})")
            self._said = problem or ""
        if note != self._noted:
            if note:
                logger.info(note)
            self._noted = note
        self._seen = self._seen or problem is not None
        if installed is not None:
            self._tell(problem, installed)
        return problem

    def _say_unreadable(self, exc: Exception) -> None:
        status = exc.status if isinstance(exc, ApiException) else None
        kind = f"{status} {exc.reason}" if isinstance(exc, ApiException) else type(exc).__name__
        if kind == self._unreadable:  # once per kind of failure, not every check
            return
        self._unreadable = kind
        hint = (" (the operator needs get on customresourcedefinitions)"
                if status in (401, 403) else "")
        said = kind if isinstance(exc, ApiException) else f"{kind}: {exc}"
        logger.warning(f"cannot read the CRD {CRD_NAME} ({said}){hint}; whether it keeps every "
                       "field of this release's schema is "
                       + ("not known" if self.current is None else "as the last read found")
                       + f"; trying again every {self.interval_s:g}s")

    def _tell(self, problem: str | None, installed: Mapping[str, Any]) -> None:
        """The Events on the CRD (`kubectl describe crd` and `kubectl get events` show
        them): a Warning when a problem is found or changes, a Normal one once it is gone."""
        if not self._leads():
            if problem is None:
                self._seen = False  # the leader says it
            return
        try:
            if problem is not None and problem != self._posted:
                self._post("Warning", OUTDATED, problem[:MAX_EVENT_MESSAGE], installed)
                self._posted = problem
            elif problem is None and self._seen:
                self._post("Normal", CURRENT, f"the installed CRD keeps every field of "
                           f"infertune {__version__}'s schema ({self.installed}; this "
                           f"release's is {schema_digest()})", installed)
                self._posted, self._seen = None, False
        except Exception as exc:  # said again at the next check
            logger.warning(f"could not post an Event on the CRD {CRD_NAME}: {exc}")

    def start(self) -> None:
        """The first check at once, then every `interval_s`, in a thread of its own: a slow
        API server does not hold the operator's start."""
        self._thread = threading.Thread(target=self._run, name="crd-check", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the checks; a read in flight is not waited for (the thread is a daemon)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _run(self) -> None:
        failed: str | None = None
        while not self._stop.is_set():
            try:
                self.check()
                failed = None
            except Exception as exc:  # a CRD this cannot read: said, and tried again
                if type(exc).__name__ != failed:
                    logger.exception(f"the check of the CRD {CRD_NAME} failed")
                failed = type(exc).__name__
            self._stop.wait(self.interval_s)


def read_installed(api: client.ApiextensionsV1Api | None = None) -> Mapping[str, Any] | None:
    """The installed CRD as the API server returns it (JSON, not the client's models: a
    schema of this size takes the client a good part of a second to turn into them); None
    when it is not installed."""
    api = api or client.ApiextensionsV1Api()
    try:
        response = api.read_custom_resource_definition(
            CRD_NAME, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    # _preload_content=False: the urllib3 response, whose body is the JSON.
    crd: Mapping[str, Any] = json.loads(response.data)  # type: ignore[attr-defined]
    return crd


def post_event(type: str, reason: str, message: str, crd: Mapping[str, Any],
               api: client.CoreV1Api | None = None) -> None:
    """A core/v1 Event about the CRD, in namespace default as for every cluster-scoped object
    (what kubectl describe looks up)."""
    metadata = crd.get("metadata") or {}
    now = datetime.now(UTC)
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name=f"{CRD_NAME}.", namespace="default"),
        involved_object=client.V1ObjectReference(
            api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition",
            name=CRD_NAME, uid=metadata.get("uid"),
            resource_version=metadata.get("resourceVersion")),
        reason=reason, message=message, type=type, count=1, first_timestamp=now,
        last_timestamp=now, source=client.V1EventSource(component="infertune"),
        reporting_component="infertune",
        reporting_instance=os.environ.get("HOSTNAME", "infertune")[:128])
    (api or client.CoreV1Api()).create_namespaced_event("default", event,
                                                          _request_timeout=REQUEST_TIMEOUT_S)


class CrdCollector(Collector):
    """`infertune_crd_schema_current`: 1 while the installed CRD keeps every field of this
    release's schema, 0 while it does not or is not installed; absent before it was read."""

    def __init__(self, check: CrdCheck) -> None:
        self._check = check

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        current = self._check.current
        if current is not None:
            family.add_metric([self._check.installed, schema_digest()], 1 if current else 0)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "infertune_crd_schema_current", "1 while the installed InferenceTuning CRD keeps "
            "every field of the operator's schema, 0 while it does not (the API server drops "
            "those fields from every write) or is not installed. installed: its schema digest "
            "(none without one, absent when it is not installed).",
            labels=("installed", "release"))
