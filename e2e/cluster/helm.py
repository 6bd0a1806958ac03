"""Build Helm from its Go module, once per version, for the chart tests.

Helm is its own Go module with its own Kubernetes client versions, so it is not built from
e2e/cluster/go.mod with the control plane: `go install helm.sh/helm/v4/cmd/helm@VERSION` builds
it from the module's own go.mod and go.sum (checked against the Go checksum database). The
binary lands in ``<cache>/helm/<version>/helm`` (see build.cache_root), staged in a temporary
directory on the same filesystem and moved into place, so a half-finished build is never seen.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from e2e.cluster.build import BuildError, cache_root, write_timings

HELM_PACKAGE = "helm.sh/helm/v4/cmd/helm"
HELM_VERSION = "v4.3.2"


def helm_binary() -> Path:
    """Where the Helm of HELM_VERSION lives (whether or not it is built)."""
    return cache_root() / "helm" / HELM_VERSION / "helm"


def build_helm(out: TextIO = sys.stdout) -> Path:
    """Build Helm unless it is cached; return its path."""
    target = helm_binary()
    if os.access(target, os.X_OK):
        print(f"cached  {'helm':<24} {target}", file=out)
        return target
    go = shutil.which("go")
    if go is None:
        raise BuildError("the Go toolchain (`go`) is not on PATH; it builds Helm")
    print(f"build   {'helm':<24} from {HELM_PACKAGE}@{HELM_VERSION}", file=out)
    out.flush()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        done = subprocess.run(
            [go, "install", "-trimpath", "-ldflags", "-s -w", f"{HELM_PACKAGE}@{HELM_VERSION}"],
            env={**os.environ, "GOBIN": str(staging), "GOFLAGS": "-mod=mod"},
            capture_output=True, text=True, cwd=staging,
        )
        if done.returncode != 0:
            raise BuildError("go install of Helm failed:\n" + done.stderr[-4000:])
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = round(time.monotonic() - started, 1)
        os.replace(staging / "helm", target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    timings = {"version": HELM_VERSION, "wall_seconds": wall,
               "user_seconds": round(after.ru_utime - before.ru_utime, 1),
               "finished_at": datetime.now(UTC).isoformat(timespec="seconds")}
    write_timings(target.parent / "timings.json", timings)
    print(f"built helm {HELM_VERSION} into {target} in {wall:.0f}s wall", file=out)
    return target
