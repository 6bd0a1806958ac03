"""Leader election through a coordination.k8s.io/v1 Lease: one operator process at a time runs
the loops that write (autoscaling, re-tuning, MIG partitioning).

The chart's rolling upgrade starts the new operator before it stops the old one, so for a few
seconds two processes run. Without a leader, both evaluated the same autoscaling slot (each
took the other's replica write for a revert), and both drained MIG nodes. With
`infertune run --leader-elect`, the process that holds the Lease leads; the other waits, and
takes over when the Lease is released (the old process releases it on its way out, once its
loops have stopped) or when it has not been renewed for its duration (the old process died).

The rules are client-go's (k8s.io/client-go/tools/leaderelection), with its default timings:
- a Lease counts as expired when its record has not changed for `leaseDurationSeconds` as
  measured on this process's own clock since it last saw it change, so clocks that disagree
  between machines do not matter;
- the leader renews every `RETRY_PERIOD_S`, and stops leading `RENEW_DEADLINE_S` after its
  last successful renewal, before anyone else may take over (`LEASE_DURATION_S`);
- every write carries the resourceVersion it read: of two processes that try at once, one
  gets a 409 Conflict and waits for the next round;
- a release empties holderIdentity and sets a 1 s duration, so the next process takes over at
  its next round instead of after the full duration.

The webhook and kopf's event handlers run in every process: the webhook must answer during an
upgrade, and the handlers' writes are idempotent.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from infertune.kube.client import server_message

LEASE_DURATION_S = 15
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 2.0
REQUEST_TIMEOUT_S = 5.0
DEFAULT_LEASE_NAME = "infertune-operator"
logger = logging.getLogger(__name__)


class Leader(Protocol):
    @property
    def exclusive(self) -> bool:
        """Whether leading now means that no other operator process runs the loops: this
        one took the Lease over from another that released it or let it expire. Not when
        there is no election, nor when this process created the Lease (the operator it
        replaces may be a version without an election); the autoscaler then waits a slot
        before it takes over a tuning that another process evaluated just before."""

    @property
    def term(self) -> int:
        """Counts the times this process started leading: what it remembers of its own
        writes from an earlier term may have been overwritten by another leader since."""

    def leads(self) -> bool:
        """Whether this process may run the loops that write now."""


class Always:
    """No election (a single operator, `infertune run` without --leader-elect)."""

    exclusive = False
    term = 0

    def leads(self) -> bool:
        return True


ALWAYS = Always()


def micro_time(unix: float) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC), never on a whole second.

    The Kubernetes client (v32 and later) turns the body into its model, so this string into a
    datetime, and sends that as `datetime.isoformat()`, which leaves the fraction out on a
    whole second; the API server then refuses the Lease (400, cannot parse as ".000000"):
    one renewal in a million, and every write of a clock that keeps whole seconds."""
    when = datetime.fromtimestamp(unix, tz=UTC)
    if when.microsecond == 0:
        when += timedelta(microseconds=1)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    """The host name (a pod's name in a cluster) and a random suffix, as client-go's callers
    use: two processes on one host are still two candidates."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class LeaseElection:
    """Candidate for the Lease `namespace/name`. `try_once` is one round (read, then create,
    renew or take over); `start` runs rounds in a thread every `retry_s` until `stop`, which
    releases the Lease."""

    def __init__(self, namespace: str, name: str = DEFAULT_LEASE_NAME,
                 identity: str | None = None, *, duration_s: int = LEASE_DURATION_S,
                 renew_deadline_s: float = RENEW_DEADLINE_S, retry_s: float = RETRY_PERIOD_S,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 api: client.CoordinationV1Api | None = None) -> None:
        if not 0 < renew_deadline_s < duration_s or not 0 < retry_s < renew_deadline_s:
            raise ValueError("expected 0 < retry < renew deadline < lease duration, got "
                             f"{retry_s:g}, {renew_deadline_s:g}, {duration_s:g}")
        self.namespace, self.name = namespace, name
        self.identity = identity or default_identity()
        self.duration_s, self.renew_deadline_s, self.retry_s = (duration_s, renew_deadline_s,
                                                                retry_s)
        self._clock, self._wall_clock, self._api = clock, wall_clock, api
        self.request_timeout_s = min(REQUEST_TIMEOUT_S, renew_deadline_s / 2)
        """Per API call: a connection that hangs (a load balancer failing over) would
        otherwise hold the rounds for good, and with them the leadership. Not shorter: an
        API server slower than the timeout would never grant leadership at all (with rounds
        every retry period from their start, calls of up to a quarter of the renew deadline
        keep it without a gap, and slower ones with gaps)."""
        self._valid_until = -float("inf")
        self._observed: tuple[str | None, float] = (None, 0.0)
        """(resourceVersion last seen, when it was first seen on `clock`)."""
        self.holder: str | None = None
        """The holder as last read (None: nobody, or not read yet)."""
        self.term = 0
        self._took_over = False
        self._written: str | None = None
        """The resourceVersion of this process's last write that it knows went through."""
        self._tenure: tuple[str | None, int] | None = None
        """The `_tenure` of that write's record: its renewals keep it."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def where(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    def leads(self) -> bool:
        return self._clock() < self._valid_until

    @property
    def exclusive(self) -> bool:
        return self._took_over

    def try_once(self) -> bool:
        """One round; whether this process leads after it. API errors other than a lost race
        (409) are raised: the caller logs them, and leadership lapses at the renew deadline."""
        started = self._clock()
        api = self._api or client.CoordinationV1Api()
        timeout = self.request_timeout_s
        try:
            lease = api.read_namespaced_lease(self.name, self.namespace,
                                              _request_timeout=timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return self._write(started, lambda body: api.create_namespaced_lease(
                self.namespace, body, _request_timeout=timeout),  # type: ignore[arg-type]
                self._record(0, None), took_over=False, renewal=False)
        version = _version(lease)
        if version != self._observed[0]:
            # When it was seen, which is after the read: dated from before a slow read, the
            # record would expire early, while its holder still leads.
            self._observed = (version, self._clock())
        spec = lease.spec or client.V1LeaseSpec()
        self.holder = spec.holder_identity or None
        transitions = int(spec.lease_transitions or 0)
        if self.holder == self.identity:
            record = self._record(transitions, spec.acquire_time)
            # A renewal of the record it last wrote, or of its own renewal since, whose answer
            # was lost (same acquireTime and transitions, a resourceVersion it never saw): a
            # new term there dropped the exclusivity, and the autoscaler forgot its writes
            # and skipped a slot. Any other record of its own (the Lease deleted and made
            # again by another, which led meanwhile; a takeover whose answer was lost) starts
            # a term, whose exclusivity is not known, so not claimed.
            renewal = ((version is not None and version == self._written)
                       or _tenure(spec) == self._tenure)
            took_over = self._took_over if renewal else False
        else:
            duration = int(spec.lease_duration_seconds or self.duration_s)
            if self.holder is not None and started < self._observed[1] + duration:
                self._valid_until = -float("inf")  # taken over while we were away
                return False
            record, took_over, renewal = self._record(transitions + 1, None), True, False
        record["metadata"]["resourceVersion"] = version
        return self._write(started, lambda body: api.replace_namespaced_lease(
            self.name, self.namespace, body, _request_timeout=timeout),  # type: ignore[arg-type]
            record, took_over, renewal)

    def _record(self, transitions: int, acquired: Any) -> dict[str, Any]:
        now = micro_time(self._wall_clock())
        acquire = micro_time(acquired.timestamp()) if isinstance(acquired, datetime) else now
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity,
                         "leaseDurationSeconds": self.duration_s, "acquireTime": acquire,
                         "renewTime": now, "leaseTransitions": transitions}}

    def _write(self, started: float, send: Callable[[dict[str, Any]], Any],
               record: dict[str, Any], took_over: bool, renewal: bool) -> bool:
        if self._stop.is_set():
            # A round still in flight when `stop` gave up waiting for it (a read the client
            # retried) renewed the Lease for a process on its way out, after its release:
            # the next operator waited a Lease duration from that write.
            return False
        try:
            written = send(record)
        except ApiException as exc:
            if exc.status == 409:
                # Another candidate wrote since the read: read again next round, and lead
                # only once the Lease says so.
                self._valid_until = -float("inf")
                return False
            raise
        self._observed = (_version(written), started)
        self._written = _version(written)
        self._tenure = _tenure(written.spec or client.V1LeaseSpec())
        self.holder = self.identity
        if not renewal:
            # A new term: created, taken over, or a record it did not write. A renewal after
            # a lapse is not one: its own record still stood, so nobody led meanwhile.
            self.term += 1
            self._took_over = took_over
        self._valid_until = started + self.renew_deadline_s
        return True

    def release(self) -> bool:
        """Hand the Lease back, if this process holds it: the next candidate takes over at its
        next round. Whether it was released."""
        was_leading, self._valid_until = self.leads(), -float("inf")
        if not was_leading and self._written is None:
            return False  # it never wrote a record of its own
        # Also when its leadership has lapsed (a slow round at shutdown): the record read
        # says whether it still holds the Lease, and the write holds only at that version.
        api = self._api or client.CoordinationV1Api()
        try:
            lease = api.read_namespaced_lease(self.name, self.namespace,
                                              _request_timeout=self.request_timeout_s)
            spec = lease.spec or client.V1LeaseSpec()
            if spec.holder_identity != self.identity:
                return False
            record = self._record(int(spec.lease_transitions or 0), None)
            record["metadata"]["resourceVersion"] = _version(lease)
            record["spec"].update(holderIdentity=None, leaseDurationSeconds=1)
            api.replace_namespaced_lease(self.name, self.namespace, record,  # type: ignore[arg-type]
                                         _request_timeout=self.request_timeout_s)
        except Exception as exc:  # an API error, a timeout: it expires instead
            why = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)
            logger.warning(f"could not release {self.where} ({why}); the next operator takes "
                           f"over once it expires ({self.duration_s}s)")
            return False
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the rounds, then release the Lease (call it once the loops have stopped)."""
        self._stop.set()
        if self._thread is not None:  # a round lasts two calls at most
            self._thread.join(timeout=2 * self.request_timeout_s + 1)
        if self.release():
            logger.info(f"released {self.where}")

    def pause_after(self, started: float) -> float:
        """Seconds until the next round, for one that started at `started`: rounds start every
        `retry_s` from their start, as client-go's renewals do. Counted from their end, rounds
        of 4 s (2 s per call under load, every one answered) left leadership lapsed for a
        moment every cycle, since it runs `renew_deadline_s` from a round's start."""
        return max(0.0, self.retry_s - (self._clock() - started))

    def _run(self) -> None:
        leading, problem, waiting_for = False, None, None
        while not self._stop.is_set():
            started = self._clock()
            try:
                self.try_once()
                problem = None
            except ApiException as exc:
                if problem != exc.status:  # once per kind of failure, not every round
                    logger.error(f"{self.where}: {describe_failure(exc, self)}")
                problem = exc.status
            except Exception as exc:  # the API server unreachable, say: try again
                if problem != type(exc).__name__:
                    logger.error(f"{self.where}: {exc}; trying again every {self.retry_s:g}s")
                problem = type(exc).__name__
            if self.leads() != leading:
                leading = not leading
                if leading:
                    logger.info(f"leading: {self.where} is held by {self.identity}; the "
                                "autoscaling, re-tuning and MIG loops run in this process")
                else:
                    logger.warning(f"no longer leading: {self.where} was not renewed within "
                                   f"{self.renew_deadline_s:g}s or was taken over; the "
                                   "autoscaling, re-tuning and MIG loops pause")
            if not leading and self.holder not in (None, self.identity, waiting_for):
                logger.info(f"{self.where} is held by {self.holder}: the autoscaling, "
                            "re-tuning and MIG loops wait until it is released or expires "
                            f"({self.duration_s}s without renewal)")
            waiting_for = None if leading else self.holder
            self._stop.wait(self.pause_after(started))


def _tenure(spec: client.V1LeaseSpec) -> tuple[str | None, int]:
    """(acquireTime, leaseTransitions) of a Lease record: what its holder's renewals keep."""
    acquired: Any = spec.acquire_time
    if isinstance(acquired, datetime):
        acquired = micro_time(acquired.timestamp())
    return (None if acquired is None else str(acquired)), int(spec.lease_transitions or 0)


def _version(lease: client.V1Lease) -> str | None:
    meta = lease.metadata
    return None if meta is None else (str(meta.resource_version or "") or None)


def describe_failure(exc: ApiException, election: LeaseElection) -> str:
    if exc.status == 403:
        return (f"forbidden ({server_message(exc)}): the operator needs create on leases "
                f"(coordination.k8s.io) in namespace {election.namespace}, and get and update "
                f"on the Lease {election.name} (a Role rule with resourceNames: "
                f"[{election.name}]; the chart's Role, "
                "charts/infertune/files/rbac-namespace-rules.yaml, names "
                f"{DEFAULT_LEASE_NAME} only)")
    if exc.status == 404:
        return (f"namespace {election.namespace} does not exist: create it, or set "
                "--operator-namespace (or $INFERTUNE_NAMESPACE) to the operator's namespace")
    return (f"{exc.status} {exc.reason}; trying again every {election.retry_s:g}s, and the "
            "loops pause once the Lease is not renewed for "
            f"{election.renew_deadline_s:g}s")
