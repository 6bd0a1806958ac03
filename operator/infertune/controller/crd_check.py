"""Whether the installed InferenceTuning CRD is this release's.

Helm installs a chart's `crds/` on the first install only. An upgrade that leaves the older
CRD in place runs the new operator against the older schema, and the API server prunes,
without a word, every field that schema does not know: a spec field the new release added
(set in a manifest, and gone from the stored object), and what the operator stores in status
(the autoscaler's state, such as `status.autoscaling.state.queue`, which its backlog rules
read: pruned, they stay off and nothing says why). The CRD this release generates carries
the digest of its spec (api/crd.py, SCHEMA_DIGEST_ANNOTATION); the operator reads the
installed one at start-up and every CHECK_S after, and says when they differ: an error in
its log, a Warning Event on the CRD (from the process that leads), and the gauge
`infertune_crd_schema_current` (0) that the chart's alert InfertuneCRDOutdated fires on.
It goes on working meanwhile, as it would have without the check.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from infertune import __version__
from infertune.api.crd import (
    CRD_NAME,
    SCHEMA_DIGEST_ANNOTATION,
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
"""Reason of the Warning Event when the installed CRD is not this release's."""
CURRENT = "CRDCurrent"
"""Reason of the Normal Event when it is again."""
MAX_EVENT_MESSAGE = 1024
FIX = ("apply this release's CRD: `kubectl apply -f charts/infertune/crds/` from the chart of "
       "the release (Helm installs a chart's CRDs on the first install only), or "
       "`infertune crds | kubectl apply -f -` with its image")


def crd_problem(installed: Mapping[str, Any] | None, ours: str | None = None) -> str | None:
    """What is wrong with the installed CRD (as the API server returns it; None when it is not
    installed), None when it is this release's (its digest is `ours`, schema_digest())."""
    ours = schema_digest() if ours is None else ours
    if installed is None:
        return (f"the InferenceTuning CRD ({CRD_NAME}) is not installed, so no InferenceTuning "
                f"can be created or handled: {FIX}")
    theirs = installed_digest(installed)
    if theirs == ours:
        return None
    said = (f"its schema is {_shown(theirs)}, infertune {__version__}'s is {ours}" if theirs else
            f"it carries no {SCHEMA_DIGEST_ANNOTATION} annotation: it is from a release "
            "before that annotation, or applied by hand")
    return (f"the installed InferenceTuning CRD ({CRD_NAME}) is not this release's ({said}): "
            "the API server drops every field its schema does not know, without a word, from "
            "spec (a field of this release set in a manifest is not stored) and from status "
            "(the autoscaler's state: status.autoscaling.state.queue, which the backlog rules "
            f"read, is lost at every write, and those rules stay off); {FIX}")


DIGEST = re.compile(r"sha256:[0-9a-f]{16}")


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
        """True while the installed CRD is this release's, False while it is not (or is not
        installed), None before it could be read (the gauge is absent then)."""
        self.installed: str | None = None
        """The installed CRD's digest ("" when it has none or is not installed; quoted and
        cut when it is no digest)."""
        self._said: str | None = None
        """The problem last logged ("" for none, None before the first reading)."""
        self._unreadable: str | None = None
        self._posted: str | None = None
        """The problem of the last Event posted ("" for the one saying it is current)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> str | None:
        """Read the installed CRD and report what changed; the problem found, None when there
        is none or the CRD could not be read."""
        try:
            installed = self._read()
        except Exception as exc:  # forbidden, unreachable: nothing is known, nothing is said
            why = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)
            if why != self._unreadable:
                logger.warning(f"cannot read the CRD {CRD_NAME} ({why}), so whether it is this "
                               "release's is not known (the operator needs get on "
                               "customresourcedefinitions); trying again every "
                               f"{self.interval_s:g}s")
            self._unreadable, self.current = why, None
            return None
        self._unreadable = None
        problem = crd_problem(installed)
        self.current = problem is None
        self.installed = "" if installed is None else _shown(installed_digest(installed) or "")
        if (problem or "") != self._said:
            if problem:
                logger.error(problem)
            elif self._said is not None:
                logger.info(f"the installed CRD {CRD_NAME} is now this release's "
                            f"({schema_digest()})")
            self._said = problem or ""
        if installed is not None and self._leads() and (problem or "") != (
                self._posted if self._posted is not None else ""):
            # An Event on the CRD: `kubectl describe crd` and `kubectl get events` show it.
            # The first one when it is outdated, then one on each change.
            try:
                if problem:
                    self._post("Warning", OUTDATED, problem[:MAX_EVENT_MESSAGE], installed)
                else:
                    self._post("Normal", CURRENT, f"the installed CRD is this release's "
                               f"({schema_digest()}, infertune {__version__})", installed)
                self._posted = problem or ""
            except Exception as exc:  # said again at the next check
                logger.warning(f"could not post an Event on the CRD {CRD_NAME}: {exc}")
        return problem

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="crd-check", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * REQUEST_TIMEOUT_S)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.check()


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
    """`infertune_crd_schema_current`: 1 while the installed CRD is this release's, 0 while
    it is not or is not installed; absent while it cannot be read."""

    def __init__(self, check: CrdCheck) -> None:
        self._check = check

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        current = self._check.current
        if current is not None:
            family.add_metric([self._check.installed or "none", schema_digest()],
                              1 if current else 0)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "infertune_crd_schema_current", "1 while the installed InferenceTuning CRD is "
            "this release's (its schema digest is the operator's), 0 while it is not or is "
            "not installed: the API server then drops the fields the older schema does not "
            "know.", labels=("installed", "release"))
