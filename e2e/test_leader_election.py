"""Leader election (kube/lease.py) against the real API server: who leads, renewal, expiry on
the candidate's own clock, release, and two candidates writing at once. The clocks are the
candidates' own, injected, so expiry is tested without waiting for it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.conftest import new_namespace, own_control_plane
from e2e.fixtures.access import ClusterInfo
from e2e.fixtures.operator import OPERATOR_NAMESPACE, OperatorProcess, start_operator
from e2e.fixtures.prometheus import PrometheusServer
from e2e.fixtures.waiting import wait_for
from e2e.test_operator import create, deployment, get_tuning, tuning, wait_observed
from infertune.kube.lease import DEFAULT_LEASE_NAME, LeaseElection

pytestmark = pytest.mark.e2e
DURATION, DEADLINE, RETRY = 15, 10.0, 2.0
DRAINED_NODE = "h200-pool-a"
CORDONED = "infertune.io/cordoned-for-mig"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def candidate(api_client: client.ApiClient, namespace: str, identity: str,
              clock: Clock, api: client.CoordinationV1Api | None = None) -> LeaseElection:
    return LeaseElection(namespace, "infertune-e2e", identity, duration_s=DURATION,
                         renew_deadline_s=DEADLINE, retry_s=RETRY, clock=clock,
                         api=api or client.CoordinationV1Api(api_client))


def stored(api_client: client.ApiClient, namespace: str,
           name: str = "infertune-e2e") -> client.V1LeaseSpec:
    spec: client.V1LeaseSpec = client.CoordinationV1Api(api_client).read_namespaced_lease(
        name, namespace).spec
    return spec


def test_the_first_candidate_leads_and_the_next_waits_while_it_renews(
        api_client: client.ApiClient, namespace: str) -> None:
    clock_a, clock_b = Clock(), Clock()
    a = candidate(api_client, namespace, "operator-a", clock_a)
    b = candidate(api_client, namespace, "operator-b", clock_b)
    assert a.try_once() and a.leads()
    spec = stored(api_client, namespace)
    assert (spec.holder_identity, spec.lease_duration_seconds, spec.lease_transitions) == (
        "operator-a", DURATION, 0)
    assert not b.try_once() and not b.leads() and b.holder == "operator-a"
    for _ in range(10):  # 20 s in all, longer than the lease: it is renewed meanwhile
        clock_a.now += RETRY
        clock_b.now += RETRY
        assert a.try_once()
        assert not b.try_once()
    assert stored(api_client, namespace).holder_identity == "operator-a"


def test_a_leader_that_cannot_renew_stops_leading_before_anyone_takes_over(
        api_client: client.ApiClient, namespace: str) -> None:
    clock_a, clock_b = Clock(), Clock()
    a = candidate(api_client, namespace, "operator-a", clock_a)
    b = candidate(api_client, namespace, "operator-b", clock_b)
    assert a.try_once()
    assert not b.try_once()  # b sees the record here, on its own clock
    clock_a.now += DEADLINE  # no renewal got through (the API server was unreachable, say)
    assert not a.leads()
    clock_b.now += DURATION - 0.5
    assert not b.try_once()  # not expired yet as b measures it
    clock_b.now += 1
    assert b.try_once() and b.leads()
    spec = stored(api_client, namespace)
    assert (spec.holder_identity, spec.lease_transitions) == ("operator-b", 1)
    clock_a.now += RETRY
    assert not a.try_once() and a.holder == "operator-b"  # and it does not take it back
    assert stored(api_client, namespace).holder_identity == "operator-b"


def test_expiry_is_measured_from_when_the_record_last_changed_not_from_its_timestamps(
        api_client: client.ApiClient, namespace: str) -> None:
    """The holder's clock may be far off (its renewTime a day ahead or behind): only whether
    the record keeps changing counts."""
    clock_a, clock_b = Clock(), Clock()
    a = candidate(api_client, namespace, "operator-a", clock_a)
    a._wall_clock = clock_a  # its renewTime in 1970
    b = candidate(api_client, namespace, "operator-b", clock_b)
    assert a.try_once()
    assert not b.try_once()
    clock_b.now += DURATION - 1
    clock_a.now += DURATION - 1
    assert a.try_once()  # renewed, with a renewTime 56 years old: a new resourceVersion
    clock_b.now += 2
    assert not b.try_once()  # 16 s since b first saw it, 1 s since it changed


def test_a_released_lease_is_taken_over_at_the_next_round(
        api_client: client.ApiClient, namespace: str) -> None:
    clock = Clock()
    a = candidate(api_client, namespace, "operator-a", clock)
    b = candidate(api_client, namespace, "operator-b", clock)
    assert a.try_once()
    assert not b.try_once()
    assert a.release() and not a.leads()
    spec = stored(api_client, namespace)
    assert (spec.holder_identity, spec.lease_duration_seconds) == (None, 1)
    assert b.try_once()  # at once: no wait for the duration
    assert stored(api_client, namespace).holder_identity == "operator-b"
    assert not a.release()  # not its own any more: left alone
    assert stored(api_client, namespace).holder_identity == "operator-b"


class SlowRead(client.CoordinationV1Api):
    """The real API, whose reads take `seconds` on the candidate's clock (an API server
    under load)."""

    def __init__(self, api_client: client.ApiClient, clock: Clock, seconds: float) -> None:
        super().__init__(api_client)
        self.clock, self.seconds = clock, seconds

    def read_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        read = super().read_namespaced_lease(*args, **kwargs)
        self.clock.now += self.seconds
        return read


def test_a_record_seen_after_a_slow_read_is_dated_when_it_was_seen(
        api_client: client.ApiClient, namespace: str) -> None:
    """Dated from before the read, a record seen 7 s later expired 7 s early: the follower
    took over while the holder, which had renewed just before, still led."""
    clock_a, clock_b = Clock(), Clock()
    a = candidate(api_client, namespace, "operator-a", clock_a)
    b = candidate(api_client, namespace, "operator-b", clock_b,
                  SlowRead(api_client, clock_b, 7.0))
    assert a.try_once()
    assert not b.try_once()  # read from 1000 to 1007
    b._api = client.CoordinationV1Api(api_client)
    clock_b.now = 1000 + 7 + DURATION - 0.5
    assert not b.try_once()
    clock_b.now += 1
    assert b.try_once()


def test_terms_and_whether_a_term_began_by_taking_over(
        api_client: client.ApiClient, namespace: str) -> None:
    """A process that created the Lease may be replacing an operator of a version without an
    election, which still evaluates: not exclusive. One that took it over from a released
    or expired holder is."""
    clock = Clock()
    a = candidate(api_client, namespace, "operator-a", clock)
    b = candidate(api_client, namespace, "operator-b", clock)
    assert a.try_once() and (a.term, a.exclusive) == (1, False)
    clock.now += RETRY
    assert a.try_once() and (a.term, a.exclusive) == (1, False)  # a renewal: the same term
    clock.now += DEADLINE + 1  # no renewal got through for a while; nobody else took it
    assert not a.leads()
    assert a.try_once() and a.term == 1  # what it wrote still stands: the same term
    assert a.release()
    assert b.try_once() and (b.term, b.exclusive) == (1, True)
    assert b.release()
    assert a.try_once() and (a.term, a.exclusive) == (2, True)


def test_a_lease_deleted_and_led_by_another_meanwhile_starts_a_new_term(
        api_client: client.ApiClient, namespace: str) -> None:
    """Counted by leaseTransitions, a takeover after a deletion looked like a renewal: the
    autoscaler kept what it remembered of its writes from before another process led."""
    clock = Clock()
    first = candidate(api_client, namespace, "operator-0", clock)
    a = candidate(api_client, namespace, "operator-a", clock)
    b = candidate(api_client, namespace, "operator-b", clock)
    assert first.try_once() and first.release()
    assert a.try_once() and a.term == 1  # took over: leaseTransitions 1
    a._valid_until = -float("inf")  # its renewals stop getting through
    client.CoordinationV1Api(api_client).delete_namespaced_lease("infertune-e2e", namespace)
    assert b.try_once() and b.release()  # made again (leaseTransitions 0), led, released
    assert a.try_once() and (a.term, a.exclusive) == (2, True)  # leaseTransitions 1 again


class AnswerLost(client.CoordinationV1Api):
    """The real API, whose answer to an update is lost on the way back."""

    def replace_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        super().replace_namespaced_lease(*args, **kwargs)
        raise TimeoutError("read timed out")


def test_a_record_of_its_own_it_did_not_see_written_starts_a_term_not_claimed_exclusive(
        api_client: client.ApiClient, namespace: str) -> None:
    clock = Clock()
    first = candidate(api_client, namespace, "operator-0", clock)
    assert first.try_once() and first.release()
    a = candidate(api_client, namespace, "operator-a", clock, AnswerLost(api_client))
    with pytest.raises(TimeoutError):
        a.try_once()  # the takeover went through; a does not know
    assert not a.leads()
    a._api = client.CoordinationV1Api(api_client)
    assert a.try_once() and (a.term, a.exclusive) == (1, False)
    clock.now += RETRY
    assert a.try_once() and (a.term, a.exclusive) == (1, False)  # then renewals



def test_a_renewal_whose_answer_was_lost_is_still_a_renewal(
        api_client: client.ApiClient, namespace: str) -> None:
    """Its record stood at a resourceVersion it had not seen, and the next round started a
    new term: not exclusive any more, and the autoscaler forgot its writes and skipped a
    slot of every tuning. Its acquireTime and leaseTransitions say it is the same term."""
    clock = Clock()
    first = candidate(api_client, namespace, "operator-0", clock)
    assert first.try_once() and first.release()
    a = candidate(api_client, namespace, "operator-a", clock)
    assert a.try_once() and (a.term, a.exclusive) == (1, True)
    a._api = AnswerLost(api_client)
    clock.now += RETRY
    with pytest.raises(TimeoutError):
        a.try_once()  # the renewal went through; a does not know
    a._api = client.CoordinationV1Api(api_client)
    clock.now += RETRY
    assert a.try_once() and (a.term, a.exclusive) == (1, True)
    assert stored(api_client, namespace).lease_transitions == 1

class DeletesFirst(client.CoordinationV1Api):
    """The real API, with the Lease deleted between this candidate's read and its write."""

    def replace_namespaced_lease(self, name: str, namespace: str, *args: Any,
                                 **kwargs: Any) -> Any:
        self.delete_namespaced_lease(name, namespace)
        return super().replace_namespaced_lease(name, namespace, *args, **kwargs)


def test_a_lease_deleted_between_read_and_renewal_is_made_again_by_it(
        api_client: client.ApiClient, namespace: str) -> None:
    """Leases are created by an update when they do not exist (the API server's Lease
    strategy allows it), so the holder goes on leading."""
    clock = Clock()
    a = candidate(api_client, namespace, "operator-a", clock)
    assert a.try_once()
    a._api = DeletesFirst(api_client)
    clock.now += RETRY
    assert a.try_once() and a.leads() and a.term == 1
    assert stored(api_client, namespace).holder_identity == "operator-a"


class Racing(client.CoordinationV1Api):
    """The real API, with another candidate's round run just before this one writes: the
    two race for one Lease."""

    def __init__(self, api_client: client.ApiClient, other: LeaseElection) -> None:
        super().__init__(api_client)
        self.other = other

    def create_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        assert self.other.try_once()
        return super().create_namespaced_lease(*args, **kwargs)

    def replace_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        assert self.other.try_once()
        return super().replace_namespaced_lease(*args, **kwargs)


@pytest.mark.parametrize("free", ["absent", "released"])
def test_of_two_candidates_writing_at_once_one_leads(
        api_client: client.ApiClient, namespace: str, free: str) -> None:
    """Absent: both find no Lease, b creates it first and a's create is refused (409).
    Released: both read the released Lease, b takes it first and a's update, made over the
    resourceVersion it read, is refused."""
    clock = Clock()
    if free == "released":
        first = candidate(api_client, namespace, "operator-0", clock)
        assert first.try_once() and first.release()
    b = candidate(api_client, namespace, "operator-b", clock)
    a = candidate(api_client, namespace, "operator-a", clock, Racing(api_client, b))
    assert not a.try_once() and not a.leads()
    assert b.leads()
    assert stored(api_client, namespace).holder_identity == "operator-b"
    a._api = client.CoordinationV1Api(api_client)  # no more racing
    assert not a.try_once()  # the next round reads b's record: it waits for it to expire


@pytest.fixture(scope="module")
def own_plane(cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[client.ApiClient, Path]]:
    """A control plane of its own: the session's operator runs without --leader-elect and
    handles every namespace, so it would act where this test needs the loops to wait."""
    work = tmp_path_factory.mktemp("leader-election")
    with own_control_plane(cluster, work, "needs a control plane of its own: an external "
                           "cluster runs the chart's operator") as api:
        yield api, work


def test_an_operator_runs_its_loops_only_while_it_holds_the_lease_and_hands_it_back(
        own_plane: tuple[client.ApiClient, Path]) -> None:
    """The rolling upgrade, with the test as the old operator: while it holds the Lease, the
    new operator answers events (Ready) but writes nothing from its loops (re-tuning's
    status.tuning, autoscaling's evaluation); once it is released, the new one takes over at
    its next round, at once rather than after the takeover wait, and hands the Lease back
    when it stops."""
    api, work = own_plane
    client.CoreV1Api(api).create_namespace(  # for the Lease, before the operator starts
        client.V1Namespace(metadata=client.V1ObjectMeta(name=OPERATOR_NAMESPACE)))
    old = LeaseElection(OPERATOR_NAMESPACE, DEFAULT_LEASE_NAME, "old-operator",
                        api=client.CoordinationV1Api(api))
    assert old.try_once()
    with ExitStack() as stack:
        old.start()  # renews every 2 s, as a running operator does
        stack.callback(old.stop)
        prometheus = PrometheusServer().start()  # scrapes nothing: every signal is missing
        stack.callback(prometheus.stop)
        new = start_operator(api, work, work / "logs", prometheus_url=prometheus.url,
                             extra_args=("--leader-elect",))
        stack.callback(new.stop)
        namespace = new_namespace(api, "leader-election")
        # A node the old operator drained for a tuning since deleted, whose mig-manager has
        # settled: released by whoever leads. Its changes came before the new one led.
        core = client.CoreV1Api(api)
        core.patch_node(DRAINED_NODE, {"spec": {"unschedulable": True}, "metadata": {
            "annotations": {CORDONED: f"{namespace}/deleted"}}})
        create(api, namespace, deployment("qwen"))
        create(api, namespace, tuning("qwen", "qwen", autoscaling={"interval": "1s"}))
        wait_observed(api, namespace, "qwen", new)  # its handlers run
        time.sleep(5)  # the re-tuning loop's interval is 1 s here, autoscaling's 1 s
        status = get_tuning(api, namespace, "qwen")["status"]
        assert "tuning" not in status, status
        assert "evaluated" not in status.get("autoscaling", {}), status
        assert "is held by old-operator" in new.tail(400)
        assert core.read_node(DRAINED_NODE).spec.unschedulable

        old.stop()  # its rounds end, then it releases the Lease, as an operator does
        released = time.monotonic()
        assert stored(api, OPERATOR_NAMESPACE, DEFAULT_LEASE_NAME).holder_identity != (
            "old-operator")

        def evaluated() -> dict[str, Any] | None:
            new.check_running()
            status = get_tuning(api, namespace, "qwen").get("status") or {}
            done = "tuning" in status and "evaluated" in status.get("autoscaling", {})
            return status if done else None

        status = wait_for(evaluated, "the loops of the operator that took over", timeout_s=15)
        # The next round (2 s) and the next slot (1 s), not the takeover wait of a process
        # without an election (it took the Lease over: `exclusive`); Hold, as Prometheus
        # has no series.
        assert time.monotonic() - released < 10
        assert status["autoscaling"]["action"] == "Hold"
        # No change of the node since: the new leader looked at it again by itself.
        wait_for(lambda: not core.read_node(DRAINED_NODE).spec.unschedulable,
                 f"{DRAINED_NODE} uncordoned by the new leader", timeout_s=15)
        wait_for(lambda: [e for e in core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={DRAINED_NODE}").items
            if e.reason == "MigNodeUncordoned"], "the Event on the node saying why",
            timeout_s=15)
        assert stored(api, OPERATOR_NAMESPACE, DEFAULT_LEASE_NAME).holder_identity not in (
            None, "old-operator")
        assert "leading: Lease" in new.tail(400)
    spec = stored(api, OPERATOR_NAMESPACE, DEFAULT_LEASE_NAME)
    assert spec.holder_identity is None, "the stopped operator did not hand the Lease back"
    assert "released Lease" in new.tail(100)


def test_an_operator_that_may_not_hold_its_lease_stops_at_start_saying_so(
        operator: OperatorProcess, tmp_path: Path) -> None:
    """Its loops would never run while it served the webhook and looked healthy. The chart's
    Role names one Lease; another name is refused (403)."""
    assert operator.kubeconfig is not None  # the chart's RBAC, as the session operator has
    done = subprocess.run(
        [sys.executable, "-m", "infertune", "run", "--kubeconfig", str(operator.kubeconfig),
         "--standalone", "--leader-elect", "--leader-elect-lease", "someone-elses",
         "--operator-namespace", OPERATOR_NAMESPACE, "--webhook-addr", "127.0.0.1",
         "--webhook-port", "0"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"})
    assert done.returncode != 0
    assert f"Lease {OPERATOR_NAMESPACE}/someone-elses: forbidden" in done.stderr, done.stderr
    assert "resourceNames: [someone-elses]" in done.stderr
