"""Whether the installed InferenceTuning CRD keeps every field of this release's schema.

Helm installs a chart's `crds/` on the first install only. An upgrade that leaves the older
CRD in place runs the new operator against the older schema, and the API server prunes,
without a word, every field that schema does not know: a spec field the new release added
(set in a manifest, and gone from the stored object), and what the operator stores in status
(the autoscaler's state, such as `status.autoscaling.state.queue`, which its backlog rules
read: pruned, they stay off and nothing says why).

The operator reads the installed CRD at start and every CHECK_S after. Whatever its
annotations say, its schema is compared field by field with this release's by the API
server's pruning rules (dropped_fields), and only the fields it would drop count. The CRD
each release generates carries the digest of its spec and the generation of its schema
(api/crd.py), which tell whose CRD it is. Where one that is not a newer release's drops some,
or none is installed, the problem is said as an error in the log naming the fields, a
Warning Event on the CRD (from the process that leads), and the gauge
`infertune_crd_schema_current` at 0, which the chart's alert InfertuneCRDOutdated fires on.
A newer release's CRD (applied before the operator's upgrade, as the docs say) is noted in
the log only, a warning when it drops fields the newer release removed; after NEWER_GRACE_S,
longer than an upgrade takes, that is a rollback that is to stay, and the problem. The
operator goes on working meanwhile, as it would have without the check.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
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
    SCHEMA_GENERATION,
    SCHEMA_GENERATION_ANNOTATION,
    installed_digest,
    installed_generation,
    release_crd,
    schema_digest,
)
from infertune.api.units import format_duration, shown
from infertune.kube.client import read_json

logger = logging.getLogger(__name__)

CHECK_S = 60.0
"""How often the installed CRD is read again after start-up: once it is applied, the log,
the Event and the gauge say so within a minute, without a restart."""
REQUEST_TIMEOUT_S = 10.0
OUTDATED = "CRDOutdated"
"""Reason of the Warning Event when the installed CRD drops fields of this release's."""
CURRENT = "CRDCurrent"
"""Reason of the Normal Event when it keeps them again."""
NEWER_GRACE_S = 1800.0
"""How long a newer release's CRD that drops fields of this release's is taken for an upgrade
in progress (the older operator still running; ~6 minutes at 10,000 pods): longer, it is a
rollback that is to stay, and a problem."""
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
    "status.autoscaling.state.carried": "without status.autoscaling.state.carried the queue "
                                        "alone sizes the scale-ins no breach limits (a steady "
                                        "load can lose its replicas)",
}
"""What the loss of a field does, where it is not plain from its name."""


class Finding(NamedTuple):
    problem: str | None
    """Why the installed CRD does not do (it drops fields of this release's schema, or is not
    installed); None when it does."""
    note: str | None = None
    """When it does but is not this release's: what it is (said once, at `level`)."""
    level: int = logging.INFO
    lasting: str | None = None
    """For a newer release's CRD that drops fields of this release's (the note): the problem
    it is once it lasts longer than an upgrade does (CrdCheck, NEWER_GRACE_S)."""


META = ("apiVersion", "kind", "metadata")
"""Fields the API server never prunes at the root of an object (nor of an embedded one):
ObjectMeta has its own rules."""


def dropped_fields(ours: Mapping[str, Any], theirs: Mapping[str, Any] | None,
                   path: str = "") -> list[str]:
    """The fields of structural schema `ours` that the API server prunes from an object under
    schema `theirs` (as `spec.x.y`, `status.conditions[].reason`, `x.*` for the keys of a
    map; a field dropped whole is named, not what is under it), by the rules of its pruning
    (apiextensions-apiserver, schema/pruning): a field neither named nor allowed by
    `additionalProperties` is dropped, except where x-kubernetes-preserve-unknown-fields
    keeps the fields a node does not name (those it names are still pruned by their own
    schema); a node without a schema (`additionalProperties: true`, an array without
    `items`) keeps scalars and empties objects."""
    out: list[str] = []
    _dropped(ours, theirs, path, out)
    return out


def _dropped(ours: Mapping[str, Any], theirs: Any, path: str, out: list[str],
             keeps_unnamed: bool = False) -> None:
    theirs = theirs if isinstance(theirs, Mapping) else {}
    # Preserved here, or under a node that preserves (the API server's skipPrune goes on
    # into array items that way).
    keeps_unnamed = keeps_unnamed or theirs.get(PRESERVE) is True
    named = theirs.get("properties")
    named = named if isinstance(named, Mapping) else {}
    extra = theirs.get("additionalProperties")
    # true or false alike (the API server's StructuralOrBool): no schema for the values, so
    # scalars stay and objects are emptied.
    extra = {} if isinstance(extra, bool) else extra if isinstance(extra, Mapping) else None
    embedded = not path or theirs.get("x-kubernetes-embedded-resource") is True
    for name, sub in (ours.get("properties") or {}).items():
        child = f"{path}.{name}" if path else str(name)
        if embedded and name in META:
            continue
        if name in named:
            _dropped(sub, named[name], child, out)
        elif extra is not None:
            _dropped(sub, extra, child, out)
        elif not keeps_unnamed:
            out.append(child)
    if ours.get(PRESERVE) is True and extra is None and not keeps_unnamed:
        # Free-form here: what this release writes beyond the fields named goes.
        out.append(f"{path} (the fields it does not name)")
    if isinstance(ours.get("items"), Mapping):
        _dropped(ours["items"], theirs.get("items"), f"{path}[]", out, keeps_unnamed)
    ours_extra = ours.get("additionalProperties")
    if isinstance(ours_extra, (Mapping, bool)):
        if extra is not None:
            _dropped({} if isinstance(ours_extra, bool) else ours_extra, extra, f"{path}.*",
                     out)
        elif not keeps_unnamed:
            out.append(f"{path}.*")


def _schema(crd: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The openAPIV3Schema of the CRD's version this release serves, if it serves it."""
    for version in (crd.get("spec") or {}).get("versions") or ():
        if isinstance(version, Mapping) and version.get("name") == api.VERSION:
            if version.get("served") is False:
                return None
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            return schema if isinstance(schema, Mapping) else None
    return None


def _consequences(dropped: list[str]) -> str:
    """What the loss of `dropped` does, where a field of CONSEQUENCES is one of them, under
    one, or holds one."""
    def touches(field: str, gone: str) -> bool:
        return any(a == b or a.startswith(f"{b}.") or a.startswith(f"{b}[")
                   for a, b in ((field, gone), (gone, field)))

    return "".join(f"; {text}" for field, text in CONSEQUENCES.items()
                   if any(touches(field, gone) for gone in dropped))


def _named(dropped: list[str]) -> str:
    return ", ".join(dropped[:MAX_NAMED]) + (
        f" and {len(dropped) - MAX_NAMED} more" if len(dropped) > MAX_NAMED else "")


def crd_finding(installed: Mapping[str, Any] | None) -> Finding:
    """What the installed CRD (as the API server returns it; None when it is not installed)
    means for this release. The fields it would drop are found whatever its annotations say
    (a `kubectl edit` keeps them); the annotations only tell a newer release's CRD from
    another."""
    if installed is None:
        return Finding(f"the InferenceTuning CRD ({CRD_NAME}) is not installed, so no "
                       f"InferenceTuning can be created or handled: {FIX}")
    digest, generation = schema_digest(), SCHEMA_GENERATION
    theirs, their_generation = installed_digest(installed), installed_generation(installed)
    newer = theirs != digest and (their_generation or 0) > generation
    if theirs == digest:
        kind, said = "this release's, changed since it was applied", f"digest {digest}"
    else:
        kind = ("a newer release's" if newer else "an older release's"
                if their_generation is None or their_generation < generation else
                f"another build of this release's schema generation {generation} (from "
                "another branch, or edited)")
        said = ", ".join([
            f"schema generation {their_generation}" if their_generation is not None else
            f"no {SCHEMA_GENERATION_ANNOTATION} annotation",
            f"digest {_shown(theirs)}" if theirs else f"no {SCHEMA_DIGEST_ANNOTATION}",
        ]) + f"; infertune {__version__}'s: generation {generation}, digest {digest}"
    schema, wanted = _schema(installed), _schema(release_crd())
    assert wanted is not None
    upgrade = "while an upgrade rolls out, the newer operator takes over"
    if schema is None:
        unserved = (f"does not serve {api.GROUP}/{api.VERSION} with a schema, so no "
                    "InferenceTuning of this release's can be read or written")
        if newer:
            return Finding(None, f"the installed CRD {CRD_NAME} is {kind} ({said}) and "
                           f"{unserved}: {upgrade}", logging.WARNING,
                           _lasting(kind, said, _rollback([]), f"it {unserved}"))
        return Finding(f"the installed InferenceTuning CRD ({CRD_NAME}) is {kind} ({said}) "
                       f"and {unserved}: {FIX}")
    dropped = dropped_fields(wanted, schema)
    if not dropped:
        if theirs == digest:
            return Finding(None)
        return Finding(None, f"the installed CRD {CRD_NAME} is {kind} ({said}), and keeps "
                       "every field of this release's schema: nothing is dropped")
    lost = f"{_named(dropped)}{_consequences(dropped)}"
    if newer:
        # The operator is the older one: an upgrade that applied the new CRD first, as the
        # docs say, while the older operator still runs; or a rollback, which keeps it
        # (CrdCheck makes it a problem once it lasts longer than an upgrade).
        losing = (f"the API server drops {len(dropped)} of this release's fields from the "
                  f"writes that carry them: {lost}")
        return Finding(None, (
            f"the installed CRD {CRD_NAME} is {kind} ({said}): {upgrade}; if this release is to "
            f"stay (a rollback), until its CRD is applied {losing}"), logging.WARNING,
            _lasting(kind, said, _rollback(dropped_fields(schema, wanted)), losing))
    return Finding(
        f"the installed InferenceTuning CRD ({CRD_NAME}) is {kind} ({said}): its schema "
        f"lacks {len(dropped)} of this release's fields, which the API server drops from the "
        f"writes that carry them, without a word; {FIX}. The fields: {lost}")


def _rollback(newer_only: list[str]) -> str:
    """What to do when this release is to stay under a newer release's CRD whose fields
    `newer_only` this release's CRD would drop: those of spec first (the API server prunes
    them from the stored tunings too, on read, once the older CRD is applied)."""
    spec = [field for field in newer_only if field.startswith("spec.")]
    first = ("first remove from the tunings the newer release's fields, which this "
             f"release's CRD drops ({_named(spec)}), then " if spec else "")
    return (f"if this release is to stay (a rollback), {first}apply its CRD: `kubectl apply "
            "-f charts/infertune/crds/` from its chart")


def _lasting(kind: str, said: str, rollback: str, losing: str) -> str:
    return (f"the installed InferenceTuning CRD ({CRD_NAME}) is {kind} ({said}) and has been "
            f"for {format_duration(NEWER_GRACE_S)}, longer than an upgrade takes: {rollback}; "
            f"until then {losing}")


DIGEST = re.compile(r"sha256:[0-9a-f]{16}")
NO_DIGEST = "none"
ABSENT = "absent"


def _said(label: str) -> str:
    """The installed CRD as the gauge labels it, for a message."""
    if label == schema_digest():
        return f"this release's digest, {label}"
    return (("no digest annotation" if label == NO_DIGEST else f"digest {label}")
            + f"; this release's is {schema_digest()}")


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
                 leads: Callable[[], bool] = lambda: True, interval_s: float = CHECK_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read, self._post, self._leads, self._clock = read, post, leads, clock
        self.interval_s = interval_s
        self._newer_since: float | None = None
        """Since when (`clock`) a newer release's CRD drops fields of this release's."""
        self.gauge: tuple[str, bool] | None = None
        """(the installed CRD's digest as the gauge labels it, whether it keeps every field
        of this release's schema), None before it was first read (the gauge is absent then).
        One tuple, set at once: a scrape reads both from the same check. The digest is
        NO_DIGEST when it has none, ABSENT when it is not installed, quoted and cut when it is
        no digest. A read that fails keeps what the last one found."""
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

    @property
    def current(self) -> bool | None:
        return None if self.gauge is None else self.gauge[1]

    def check(self) -> str | None:
        """Read the installed CRD and report what changed; the problem found, None when there
        is none or the CRD could not be read."""
        try:
            installed = self._read()
        except Exception as exc:  # forbidden, unreachable: what was known stays
            self._say_unreadable(exc)
            return None
        self._unreadable = None
        problem, note, level, lasting = crd_finding(installed)
        if lasting is None:
            self._newer_since = None
        elif self._newer_since is None:
            self._newer_since = self._clock()
        elif self._clock() - self._newer_since >= NEWER_GRACE_S:
            problem = lasting  # no upgrade takes this long: a rollback that is to stay
        digest = None if installed is None else installed_digest(installed)
        label = ABSENT if installed is None else NO_DIGEST if digest is None else _shown(digest)
        self.gauge = (label, problem is None)
        if (problem or "") != self._said:
            if problem:
                logger.error(problem)
            elif self._said is not None:
                logger.info(f"the installed CRD {CRD_NAME} keeps every field of this "
                            f"release's schema now ({_said(label)})")
            self._said = problem or ""
        if note != self._noted:
            if note:
                logger.log(level, note)
            self._noted = note
        self._seen = self._seen or problem is not None
        if installed is not None:
            self._tell(problem, installed, label)
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

    def _tell(self, problem: str | None, installed: Mapping[str, Any], label: str) -> None:
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
                           f"infertune {__version__}'s schema ({_said(label)})", installed)
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
    return read_json(api.read_custom_resource_definition, CRD_NAME,
                     _request_timeout=REQUEST_TIMEOUT_S)


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
        gauge = self._check.gauge  # once: the label and the value of the same check
        if gauge is not None:
            family.add_metric([gauge[0], schema_digest()], 1 if gauge[1] else 0)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "infertune_crd_schema_current", "1 while the installed InferenceTuning CRD keeps "
            "every field of the operator's schema, 0 while it does not (the API server drops "
            "those fields from every write) or is not installed. installed: its schema digest "
            "(none without one, absent when it is not installed).",
            labels=("installed", "release"))
