"""The parts of leader election that need no API server (the rest: e2e/test_leader_election.py)."""

from __future__ import annotations

import contextlib
import threading
from datetime import datetime
from typing import Any

import pytest
from kubernetes import client

from infertune.kube.lease import LeaseElection, default_identity, micro_time


def test_times_are_micro_times_and_never_on_a_whole_second() -> None:
    # The client sends a datetime on a whole second without its fraction, which the API
    # server refuses as a MicroTime.
    assert micro_time(1764878661.25) == "2025-12-04T20:04:21.250000Z"
    assert micro_time(1764878661.0) == "2025-12-04T20:04:21.000001Z"


@pytest.mark.parametrize(("duration", "deadline", "retry"),
                         [(15, 15, 2), (15, 10, 10), (15, 10, 0)])
def test_timings_that_would_let_two_processes_lead_are_refused(
        duration: int, deadline: float, retry: float) -> None:
    with pytest.raises(ValueError, match="retry < renew deadline < lease duration"):
        LeaseElection("infertune-system", duration_s=duration, renew_deadline_s=deadline,
                      retry_s=retry)


def test_two_processes_on_one_host_are_two_candidates() -> None:
    assert default_identity() != default_identity()


def test_a_candidate_that_never_held_the_lease_does_not_lead_or_release() -> None:
    election = LeaseElection("infertune-system")
    assert not election.leads()
    assert not election.release()  # no API call: it has nothing to hand back


def test_a_round_against_a_server_that_never_answers_ends_and_stop_returns(
        silent_server: str) -> None:
    """Without a timeout the round never ended: leadership lapsed without a word, the thread
    never tried again, and the operator hung at exit instead of releasing the Lease."""
    configuration = client.Configuration()
    configuration.host = silent_server
    configuration.retries = False
    api = client.CoordinationV1Api(client.ApiClient(configuration))
    election = LeaseElection("infertune-system", duration_s=3, renew_deadline_s=1.0,
                             retry_s=0.2, api=api)
    assert election.request_timeout_s == 0.5
    outcome: list[BaseException | bool] = []

    def round_() -> None:
        try:
            outcome.append(election.try_once())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=round_, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the round hung"
    assert isinstance(outcome[0], Exception) and not election.leads()
    election.start()
    stopper = threading.Thread(target=election.stop, daemon=True)
    stopper.start()
    stopper.join(timeout=30)
    assert not stopper.is_alive(), "stop() hung"


@pytest.mark.parametrize(("latency_s", "leading"), [(2.2, 1.0), (3.0, 0.6)])
def test_leadership_holds_between_renewals_that_each_take_two_slow_calls(
        latency_s: float, leading: float) -> None:
    """An API server that answers every call, slowly: a round of read and replace took
    4.4 s, the next one started 2 s after it ended, and leadership (10 s from a round's start)
    lapsed for a moment in every cycle; at 3 s a call, half of the time. A per-call timeout
    under the latency would not grant leadership at all."""
    from kubernetes.client.exceptions import ApiException as Refused

    now = [1000.0]
    samples: list[bool] = []
    election: LeaseElection

    def wait(seconds: float) -> None:  # time passes; leadership is looked at every 0.1 s
        end = now[0] + seconds
        while now[0] < end:
            now[0] = min(end, now[0] + 0.1)
            if election.term:  # once it first led
                samples.append(election.leads())

    def answer(timeout: Any) -> None:
        if timeout is not None and latency_s > timeout:
            wait(timeout)
            raise TimeoutError("read timed out")
        wait(latency_s)

    class SlowApi:
        lease: client.V1Lease | None = None
        version = 0

        def read_namespaced_lease(self, name: str, namespace: str,
                                  _request_timeout: Any = None) -> Any:
            answer(_request_timeout)
            if self.lease is None:
                raise Refused(status=404)
            return self.lease

        def create_namespaced_lease(self, namespace: str, body: Any,
                                    _request_timeout: Any = None) -> Any:
            return self.replace_namespaced_lease(body["metadata"]["name"], namespace, body,
                                                 _request_timeout)

        def replace_namespaced_lease(self, name: str, namespace: str, body: Any,
                                     _request_timeout: Any = None) -> Any:
            answer(_request_timeout)
            self.version += 1
            self.lease = client.V1Lease(
                metadata=client.V1ObjectMeta(name=name, resource_version=str(self.version)),
                spec=client.V1LeaseSpec(holder_identity=body["spec"]["holderIdentity"],
                                        lease_duration_seconds=15, lease_transitions=0))
            return self.lease

    election = LeaseElection("infertune-system", identity="me", clock=lambda: now[0],
                             wall_clock=lambda: now[0], api=SlowApi())  # type: ignore[arg-type]
    for _ in range(20):  # as _run does it
        started = now[0]
        with contextlib.suppress(TimeoutError):  # _run logs it and goes on
            election.try_once()
        wait(election.pause_after(started))
    assert len(samples) > 300, len(samples)
    assert sum(samples) / len(samples) >= leading, sum(samples) / len(samples)



class LeaseStore:
    """A Lease as the API server keeps it (times parsed as the client parses them, a new
    resourceVersion per write); with `lose_answer` set, the next write lands and its answer
    is lost on the way back."""

    def __init__(self, holder: str) -> None:
        self.version, self.lose_answer = 0, False
        self.lease = self._stored({"holderIdentity": holder, "leaseTransitions": 0,
                                   "acquireTime": micro_time(900.5)})

    def _stored(self, spec: dict[str, Any]) -> client.V1Lease:
        self.version += 1
        acquired = datetime.fromisoformat(spec["acquireTime"].replace("Z", "+00:00"))
        return client.V1Lease(
            metadata=client.V1ObjectMeta(name="l", resource_version=str(self.version)),
            spec=client.V1LeaseSpec(holder_identity=spec["holderIdentity"],
                                    lease_duration_seconds=15, acquire_time=acquired,
                                    lease_transitions=spec["leaseTransitions"]))

    def read_namespaced_lease(self, name: str, namespace: str,
                              _request_timeout: Any = None) -> client.V1Lease:
        return self.lease

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any],
                                 _request_timeout: Any = None) -> client.V1Lease:
        assert body["metadata"]["resourceVersion"] == str(self.version)
        self.lease = self._stored(body["spec"])
        if self.lose_answer:
            self.lose_answer = False
            raise TimeoutError("read timed out")
        return self.lease


@pytest.mark.parametrize(("lost", "term"), [
    ("renewal", (1, True)),  # its record stands: nobody led meanwhile
    ("takeover", (1, False)),  # a term it did not see begin: exclusivity not known
])
def test_a_write_whose_answer_was_lost_is_known_by_its_record(
        lost: str, term: tuple[int, bool]) -> None:
    """A renewal that landed, whose answer was lost, started a new term at the next round
    (its resourceVersion was one the process had not seen): the term was no longer
    exclusive, and the autoscaler forgot its writes and skipped a slot of every tuning."""
    now = [1000.0]
    store = LeaseStore(holder="operator-0")  # expired: taken over after its duration
    election = LeaseElection("infertune-system", "l", identity="me", clock=lambda: now[0],
                             wall_clock=lambda: now[0] + 0.25,
                             api=store)  # type: ignore[arg-type]
    assert not election.try_once()
    now[0] += 16
    if lost == "renewal":
        assert election.try_once() and (election.term, election.exclusive) == (1, True)
        now[0] += 2
    store.lose_answer = True
    with pytest.raises(TimeoutError):
        election.try_once()
    now[0] += 2
    assert election.try_once() and election.leads()
    assert (election.term, election.exclusive) == term
    assert store.lease.spec.lease_transitions == 1
    now[0] += 2
    assert election.try_once() and (election.term, election.exclusive) == term


def test_rounds_start_every_retry_period_from_their_start() -> None:
    """As client-go's renewals: the next round starts `retry_s` after this one started, so a
    round that took 0.5 s waits the rest, and one that took longer than the period goes on at
    once. A pause of 0 after every round renewed the Lease back to back, a request a moment
    per operator."""
    now = [1000.0]
    election = LeaseElection("infertune-system", identity="me", retry_s=2.0,
                             clock=lambda: now[0], api=None)  # type: ignore[arg-type]
    started = now[0]
    now[0] += 0.5
    assert election.pause_after(started) == pytest.approx(1.5)
    now[0] += 3.0
    assert election.pause_after(started) == 0.0


@pytest.mark.parametrize("release_fails", [False, True])
def test_a_round_still_in_flight_at_stop_writes_nothing_after_it(release_fails: bool) -> None:
    """stop() waits two calls' time for the round; the client retries a timed-out read (a
    round then lasts longer), and leadership lapses meanwhile: the release was skipped (not
    leading any more), and the round in flight renewed the Lease for the stopping process,
    so the next operator waited a whole Lease duration from that write. Released now; and
    where the release fails too, the round in flight writes nothing after stop()."""
    import time

    from kubernetes.client.exceptions import ApiException

    store = LeaseStore("nobody")
    slow = threading.Event()
    reads, writes = store.read_namespaced_lease, store.replace_namespaced_lease

    def read(name: str, namespace: str, _request_timeout: Any = None) -> client.V1Lease:
        if slow.is_set() and threading.current_thread().name == "leader-election":
            time.sleep(3.0)  # past stop()'s wait of 2 x 0.5 s + 1 s, and past the deadline
        return reads(name, namespace, _request_timeout)

    def write(name: str, namespace: str, body: dict[str, Any],
              _request_timeout: Any = None) -> client.V1Lease:
        if release_fails and threading.current_thread().name != "leader-election":
            raise ApiException(status=500, reason="Internal Server Error")
        return writes(name, namespace, body, _request_timeout)

    store.read_namespaced_lease = read  # type: ignore[method-assign]
    store.replace_namespaced_lease = write  # type: ignore[method-assign]
    store.lease.spec.holder_identity = None  # free: this candidate takes it at once
    election = LeaseElection("ns", "l", identity="stopping", duration_s=3, renew_deadline_s=1.0,
                             retry_s=0.2, api=store)  # type: ignore[arg-type]
    election.start()
    time.sleep(0.5)
    assert election.leads()
    slow.set()
    time.sleep(0.25)  # the next round's read is under way
    election.stop()
    stopped = store.version
    assert (store.lease.spec.holder_identity is None) is not release_fails
    time.sleep(2.5)  # the round in flight ends
    assert store.version == stopped, "written after stop()"
