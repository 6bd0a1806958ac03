"""Status blocks reported by the re-tuning and MIG loops are only patched when they change,
and a value that is gone is removed rather than kept."""

from __future__ import annotations

from infertune.api.status import MigNodeStatus, MigStatus, TuningStatus
from infertune.controller.loops import changed_blocks
from infertune.controller.status_patch import as_stored


def test_as_stored_drops_none_at_every_depth_and_keeps_other_falsy_values() -> None:
    block = {"a": None, "b": 0, "c": "", "d": [], "e": {"f": None, "g": False},
             "h": [{"i": None, "j": 1}]}
    assert as_stored(block) == {"b": 0, "c": "", "d": [], "e": {"g": False},
                                "h": [{"j": 1}]}


def test_an_unchanged_block_is_not_patched() -> None:
    # No revision yet: the block sends revision None, which status never holds.
    tuning = TuningStatus(tuned_pods=2, message="2 pods tuned")
    stored = {"tuning": as_stored(tuning.model_dump(by_alias=True, mode="json"))}
    assert changed_blocks({"tuning": tuning.model_dump(by_alias=True, mode="json")},
                          stored) == {}


def test_a_changed_block_is_patched_whole() -> None:
    stored = {"tuning": {"revision": "r1", "tunedPods": 2, "outdatedPods": 0,
                         "message": "2 pods tuned", "problems": []}}
    block = TuningStatus(revision="r2", tuned_pods=1, outdated_pods=1,
                         message="1 pod outdated").model_dump(by_alias=True, mode="json")
    assert changed_blocks({"tuning": block}, stored) == {"tuning": block}


def test_a_block_is_patched_when_status_has_none() -> None:
    assert changed_blocks({"tuning": {"tunedPods": 0}}, {}) == {"tuning": {"tunedPods": 0}}


def test_only_the_changed_blocks_are_sent() -> None:
    stored = {"tuning": {"tunedPods": 1}, "mig": {"message": "m"}}
    assert changed_blocks({"tuning": {"tunedPods": 1}, "mig": {"message": "n"}},
                          stored) == {"mig": {"message": "n"}}


def test_a_value_that_is_gone_is_sent_as_none_so_the_merge_patch_removes_it() -> None:
    """A MIG status whose plan has no profile or ConfigMap any more: the earlier ones must not
    stay."""
    earlier = MigStatus(profile="2g.35gb", layout=["3g.71gb + 2x 2g.35gb"], strategy="mixed",
                        config_map="infertune-system/infertune-mig-parted",
                        nodes=[MigNodeStatus(node="gpu-1", config="c", state="configured")],
                        message="all nodes configured")
    stored = {"mig": as_stored(earlier.model_dump(by_alias=True, mode="json"))}
    now = MigStatus(message="nothing is labelled: no node matches").model_dump(
        by_alias=True, mode="json")
    sent = changed_blocks({"mig": now}, stored)["mig"]
    assert sent["profile"] is None and sent["configMap"] is None and sent["strategy"] is None
    assert sent["layout"] == [] and sent["nodes"] == []
