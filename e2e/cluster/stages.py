"""kwok's configuration: which nodes it manages and the Stages that move nodes and pods.

kwok v0.8 has no built-in lifecycle; it plays the Stage objects it is given. The Stages in
kwok/ are unchanged copies of kwok's own "fast" set (node-initialize, node heartbeat with
lease, pod-ready, pod-complete, pod-delete). The only change made here is a delay on
pod-ready, so tests can watch a pod sit in Pending before it turns Running and Ready.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from e2e.cluster.topology import KWOK_NODE_ANNOTATION, KWOK_NODE_ANNOTATION_VALUE

STAGES_DIR = Path(__file__).resolve().parent / "kwok"
STAGE_FILES = (
    "node-initialize.yaml",
    "node-heartbeat-with-lease.yaml",
    "pod-ready.yaml",
    "pod-complete.yaml",
    "pod-delete.yaml",
)
# kwokctl's default; kwok renews each node's Lease well inside it, so nodes stay Ready.
NODE_LEASE_DURATION_S = 40


def kwok_configuration(pod_ready_delay_s: float) -> list[dict[str, Any]]:
    """The documents of kwok's --config file."""
    options = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "manageNodesWithAnnotationSelector": (
                f"{KWOK_NODE_ANNOTATION}={KWOK_NODE_ANNOTATION_VALUE}"
            ),
            "nodeLeaseDurationSeconds": NODE_LEASE_DURATION_S,
            # kwok applies its defaults to flags, not to a --config file: spell them out.
            "nodeLeaseParallelism": 4,
            "nodePlayStageParallelism": 4,
            "podPlayStageParallelism": 4,
            "podsOnNodeSyncParallelism": 1,
            "enablePodsOnNodeSyncListPager": True,
            "enablePodsOnNodeSyncStreamWatch": False,
            "cidr": "10.244.0.0/16",
            "nodeIP": "10.0.0.1",
        },
    }
    stages = [yaml.safe_load((STAGES_DIR / name).read_text()) for name in STAGE_FILES]
    for stage in stages:
        if stage["metadata"]["name"] == "pod-ready" and pod_ready_delay_s > 0:
            stage["spec"]["delay"] = {"durationMilliseconds": round(pod_ready_delay_s * 1000)}
    return [options, *stages]


def write_kwok_configuration(path: Path, pod_ready_delay_s: float) -> None:
    path.write_text(yaml.safe_dump_all(kwok_configuration(pod_ready_delay_s), sort_keys=False))
