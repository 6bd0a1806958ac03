"""`python -m e2e.cluster {build,path,up}`: build the binaries, locate them, run a cluster."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

from e2e.cluster.build import BuildError, build, cached_bin_dir, missing_binaries
from e2e.cluster.helm import build_helm
from e2e.cluster.monitoring import fetch_monitoring_crds
from e2e.cluster.processes import ClusterError
from e2e.cluster.runtime import Cluster
from e2e.cluster.topology import DEFAULT_NODES_FILE, TopologyError

READY_LINE = "infertune e2e cluster ready:"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build the control-plane binaries and Helm (and fetch "
                        "the Prometheus Operator's CRDs) into the cache")
    commands.add_parser("path", help="print the bin dir for the current go.sum (exit 1 if absent)")
    up = commands.add_parser("up", help="run a cluster until SIGINT/SIGTERM")
    up.add_argument("--kubeconfig", type=Path, required=True, help="admin kubeconfig to write")
    up.add_argument("--nodes", type=Path, default=DEFAULT_NODES_FILE, help="node topology YAML")
    up.add_argument("--log-dir", type=Path, help="component logs (default: a new temp dir, kept)")
    up.add_argument(
        "--pod-ready-delay",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how long kwok keeps a scheduled pod Pending before Running+Ready (default 1.0)",
    )
    up.add_argument("--bin-dir", type=Path, help="binaries (default: the build cache)")
    args = parser.parse_args(argv)

    try:
        if args.command == "build":
            build()
            build_helm()  # for the chart tests
            fetch_monitoring_crds()  # the chart's monitoring objects are checked against them
            return 0
        if args.command == "path":
            return _path()
        return _up(args)
    except (BuildError, ClusterError, TopologyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def _path() -> int:
    bin_dir = cached_bin_dir()
    missing = missing_binaries(bin_dir)
    if missing:
        names = ", ".join(t.name for t in missing)
        print(
            f"not built ({names} missing in {bin_dir}); run: python -m e2e.cluster build",
            file=sys.stderr,
        )
        return 1
    print(bin_dir)
    return 0


def _up(args: argparse.Namespace) -> int:
    bin_dir: Path = args.bin_dir or cached_bin_dir()
    missing = missing_binaries(bin_dir)
    if missing:
        raise ClusterError(
            f"{', '.join(t.name for t in missing)} not found in {bin_dir}; "
            "run: python -m e2e.cluster build"
        )
    log_dir: Path = args.log_dir or Path(tempfile.mkdtemp(prefix="infertune-e2e-logs-"))
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Installed before starting so a Ctrl-C during start-up still tears everything down.
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    with Cluster.start(
        bin_dir=bin_dir,
        nodes_file=args.nodes,
        log_dir=log_dir,
        pod_ready_delay=args.pod_ready_delay,
        kubeconfig=args.kubeconfig.resolve(),
    ) as cluster:
        print(
            f"{READY_LINE} server={cluster.server} kubeconfig={cluster.kubeconfig} "
            f"logs={cluster.log_dir} nodes={len(cluster.node_names)} "
            f"seconds={cluster.seconds_to_ready}",
            flush=True,
        )
        while not stop.wait(timeout=1.0):
            cluster.check_running()
        print("stopping cluster", flush=True)
    print(f"cluster stopped; logs kept in {log_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
