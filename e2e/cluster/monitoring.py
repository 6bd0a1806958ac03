"""The Prometheus Operator's CRDs (PodMonitor, PrometheusRule), for the chart's tests.

The chart makes a PodMonitor and a PrometheusRule (metrics.podMonitor, metrics.prometheusRule).
The test control plane checks them against the Prometheus Operator's own CRDs, as a cluster
running it would: `go mod download` fetches the operator's Go module at PROMETHEUS_OPERATOR
(checked against the Go checksum database), whose example/prometheus-operator-crd directory
holds the CRDs its releases install, and the two the chart needs are copied into
``<cache>/prometheus-operator/<version>/`` (see build.cache_root). The Prometheus Operator
itself is not built or run: nothing here scrapes through the PodMonitor.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from e2e.cluster.build import BuildError, cache_root

PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
CRD_DIR = "example/prometheus-operator-crd"
CRD_FILES = ("monitoring.coreos.com_podmonitors.yaml",
             "monitoring.coreos.com_prometheusrules.yaml")


def monitoring_crds_dir() -> Path:
    """Where the CRDs of PROMETHEUS_OPERATOR_VERSION live (whether or not they are fetched)."""
    return cache_root() / "prometheus-operator" / PROMETHEUS_OPERATOR_VERSION


def monitoring_crds() -> list[Path]:
    """The CRD files, in CRD_FILES order; [] unless every one is there."""
    paths = [monitoring_crds_dir() / name for name in CRD_FILES]
    return paths if all(path.is_file() for path in paths) else []


def fetch_monitoring_crds(out: TextIO = sys.stdout) -> Path:
    """Fetch the CRDs unless they are cached; return their directory."""
    target = monitoring_crds_dir()
    if monitoring_crds():
        print(f"cached  {'prometheus-operator CRDs':<24} {target}", file=out)
        return target
    go = shutil.which("go")
    if go is None:
        raise BuildError("the Go toolchain (`go`) is not on PATH; it fetches the Prometheus "
                         "Operator's CRDs")
    module = f"{PROMETHEUS_OPERATOR}@{PROMETHEUS_OPERATOR_VERSION}"
    print(f"fetch   {'prometheus-operator CRDs':<24} from {module}", file=out)
    out.flush()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=target.parent))
    try:
        staging.chmod(0o755)  # it becomes the cache directory (mkdtemp makes it 0700)
        # Outside any module or workspace (the temporary directory), so no go.mod is read or
        # changed, and without the caller's GOFLAGS (-mod=vendor would be refused here).
        done = subprocess.run([go, "mod", "download", "-json", module],
                              env={**os.environ, "GOFLAGS": "", "GOWORK": "off"},
                              capture_output=True, text=True, cwd=staging)
        if done.returncode != 0:
            raise BuildError(f"go mod download {module} failed:\n"
                             + (done.stdout + done.stderr)[-4000:])
        source = Path(json.loads(done.stdout)["Dir"]) / CRD_DIR
        for name in CRD_FILES:
            if not (source / name).is_file():
                raise BuildError(f"{module} has no {CRD_DIR}/{name}")
            shutil.copyfile(source / name, staging / name)
        shutil.rmtree(target, ignore_errors=True)  # a copy with a file missing
        try:
            os.replace(staging, target)  # whole or not at all
        except OSError as exc:
            if monitoring_crds():  # another build put them there meanwhile
                return target
            raise BuildError(f"cannot move the CRDs into {target}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"fetched the prometheus-operator CRDs into {target}", file=out)
    return target
