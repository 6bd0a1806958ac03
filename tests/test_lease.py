"""The parts of leader election that need no API server (the rest: e2e/test_leader_election.py)."""

from __future__ import annotations

import pytest

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
