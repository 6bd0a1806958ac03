"""The suites run unchanged against kind: create a kind cluster and run the harness on it.

Skipped, with the reason printed, where docker or kind is missing (as on the CI machine,
which runs the built-in control plane instead). Inside run.sh (E2E_KUBECONFIG set) this test
skips itself rather than start a second kind cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

RUN_SH = Path(__file__).resolve().parent / "run.sh"
HARNESS = Path(__file__).resolve().parent.parent / "test_harness.py"


def missing_prerequisite() -> str | None:
    for tool in ("docker", "kind", "kubectl", "helm"):
        if shutil.which(tool) is None:
            return f"{tool} not found on PATH"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"docker daemon not reachable: {probe.stderr.strip().splitlines()[-1:]}"
    return None


def test_harness_passes_against_a_kind_cluster() -> None:
    if os.environ.get("E2E_KUBECONFIG"):
        pytest.skip("already running against an external cluster (E2E_KUBECONFIG is set)")
    reason = missing_prerequisite()
    if reason is not None:
        print(f"kind e2e skipped: {reason}")
        pytest.skip(f"kind e2e needs docker and kind: {reason}")
    result = subprocess.run(
        [str(RUN_SH), str(HARNESS)],
        env={**os.environ, "KEEP_CLUSTER": "0"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
