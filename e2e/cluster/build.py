"""Build the control-plane binaries from the Go module next to this file, once per go.sum.

The binaries land in ``$INFERTUNE_E2E_CACHE/<digest>/bin`` (default cache
``~/.cache/infertune/e2e``), the digest of go.sum, go.mod, the build's recipe and the Go
toolchain (`go_sum_digest`), so a change of any of them gives a fresh directory and an
unchanged one is never rebuilt. Each build goes into a temporary directory on the same
filesystem and is moved into place with ``rename``, so a half-finished build is never seen.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

GO_MODULE_DIR = Path(__file__).resolve().parent
BUILD_FLAGS = ("-trimpath",)
"""`go build` flags besides -v, -ldflags and -o (part of the cache key)."""
CACHE_ENV = "INFERTUNE_E2E_CACHE"

# How often the build reports progress while `go build -v` prints package names, and how long
# it may stay silent (linking the big binaries prints nothing) before a heartbeat line.
PROGRESS_EVERY_S = 15.0
HEARTBEAT_EVERY_S = 30.0


class BuildError(RuntimeError):
    """The Go toolchain is missing or `go build` failed."""


@dataclass(frozen=True)
class Target:
    name: str  # file name in bin/
    package: str  # Go package path built from go.mod
    built_as: str  # name `go build -o DIR/` gives it (major-version suffixes are dropped)


TARGETS: tuple[Target, ...] = (
    Target("etcd", "go.etcd.io/etcd/server/v3", "server"),
    Target("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver"),
    Target(
        "kube-controller-manager",
        "k8s.io/kubernetes/cmd/kube-controller-manager",
        "kube-controller-manager",
    ),
    Target("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler", "kube-scheduler"),
    Target("kubectl", "k8s.io/kubernetes/cmd/kubectl", "kubectl"),
    Target("kwok", "sigs.k8s.io/kwok/cmd/kwok", "kwok"),
)


@dataclass
class BuildReport:
    bin_dir: str
    built: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    user_seconds: float = 0.0
    sys_seconds: float = 0.0
    packages_compiled: int = 0
    kubernetes_version: str = ""
    go_version: str = ""
    finished_at: str = ""
    source_digest: str = ""
    """`source_digest` of what was built: found by it when no Go is there to ask
    (`cached_bin_dir`)."""


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache/infertune/e2e"


TOOLCHAIN_ENV = ("GOVERSION", "CGO_ENABLED", "GOOS", "GOARCH", "GOAMD64")
"""What of the Go toolchain the binaries depend on (part of the cache key): a newer Go, or cgo
turned on or off, builds other binaries from the same go.sum."""


def toolchain(module_dir: Path = GO_MODULE_DIR) -> str:
    """`go env` of TOOLCHAIN_ENV as the build in `module_dir` would see it (go.mod's
    `toolchain` line can switch versions there); "no go" without a Go on PATH (nothing can be
    built then, and nothing cached under another toolchain is taken for this one)."""
    go = shutil.which("go")
    if go is None:
        return "no go"
    try:
        result = subprocess.run([go, "env", *TOOLCHAIN_ENV], cwd=module_dir,
                                capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"go env failed: {exc}"
    return result.stdout if result.returncode == 0 else f"go env failed: {result.stderr}"


def source_digest(module_dir: Path = GO_MODULE_DIR) -> str:
    """What the binaries are built from, the toolchain aside: go.sum, go.mod (its `go`,
    `toolchain` and `godebug` lines change the binaries without changing go.sum) and the
    build's own recipe (the targets, the flags, the version stamp). Keyed on go.sum alone,
    a reused machine kept binaries that a fresh one would build differently, and CI tested
    those."""
    return _digest(_sources(module_dir))


def go_sum_digest(module_dir: Path = GO_MODULE_DIR, go_toolchain: str | None = None) -> str:
    """The cache key: what `source_digest` covers and the toolchain (`toolchain`, read when
    not given)."""
    if go_toolchain is None:
        go_toolchain = toolchain(module_dir)
    return _digest((*_sources(module_dir), go_toolchain.encode()))


def _sources(module_dir: Path) -> tuple[bytes, ...]:
    recipe = repr((TARGETS, BUILD_FLAGS, version_ldflags("v0.0.0"))).encode()
    return (module_dir / "go.sum").read_bytes(), (module_dir / "go.mod").read_bytes(), recipe


def _digest(parts: tuple[bytes, ...]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def cached_bin_dir(module_dir: Path = GO_MODULE_DIR) -> Path:
    """Where the binaries for the current go.mod, go.sum, build recipe and Go toolchain live
    (whether or not they are built). Without a Go to ask (not on PATH, or `go env` failed),
    the newest build from the same sources (`source_digest`, kept in its timings.json): the
    tests and `up` only run the binaries, and a Go missing there made them look unbuilt."""
    current = toolchain(module_dir)
    if current == "no go" or current.startswith("go env failed"):
        built = _built_from(source_digest(module_dir))
        if built is not None:
            return built
    return cache_root() / go_sum_digest(module_dir, current) / "bin"


def _built_from(source: str) -> Path | None:
    """The bin/ of the newest build whose timings.json names `source`, if any."""
    found: list[tuple[str, Path]] = []
    for timings in cache_root().glob("*/timings.json"):
        try:
            recorded = json.loads(timings.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(recorded, dict) and recorded.get("source_digest") == source:
            found.append((str(recorded.get("finished_at") or ""), timings.parent / "bin"))
    return max(found)[1] if found else None


def missing_binaries(bin_dir: Path) -> list[Target]:
    return [t for t in TARGETS if not os.access(bin_dir / t.name, os.X_OK)]


def kubernetes_version(module_dir: Path = GO_MODULE_DIR) -> str:
    """The k8s.io/kubernetes version go.mod requires, e.g. ``v1.37.2``."""
    match = re.search(r"^\s*k8s\.io/kubernetes\s+(v\S+)", (module_dir / "go.mod").read_text(), re.M)
    if match is None:
        raise BuildError(f"{module_dir / 'go.mod'}: no requirement on k8s.io/kubernetes")
    return match.group(1)


def version_ldflags(version: str) -> str:
    # A plain `go build` leaves the version at v0.0.0-master; kube-apiserver reports it through
    # /version and clients (kubectl, kopf) compare it, so stamp the real release in.
    major, minor = version.lstrip("v").split(".")[:2]
    stamp = "k8s.io/component-base/version"
    return " ".join(
        [
            "-s -w",
            f"-X {stamp}.gitVersion={version}",
            f"-X {stamp}.gitMajor={major}",
            f"-X {stamp}.gitMinor={minor}",
            f"-X {stamp}.gitTreeState=clean",
        ]
    )


def build(module_dir: Path = GO_MODULE_DIR, out: TextIO = sys.stdout) -> BuildReport:
    """Build whatever binaries are missing for the current go.sum; report what was done."""
    bin_dir = cached_bin_dir(module_dir)
    report = BuildReport(bin_dir=str(bin_dir))
    todo = missing_binaries(bin_dir)
    for target in TARGETS:
        if target not in todo:
            report.cached.append(target.name)
            print(f"cached  {target.name:<24} {bin_dir / target.name}", file=out)
    if not todo:
        _record_source(bin_dir.parent / "timings.json", source_digest(module_dir))
        print(f"all binaries cached in {bin_dir}; nothing to build", file=out)
        return report

    go = shutil.which("go")
    if go is None:
        raise BuildError("the Go toolchain (`go`) is not on PATH; install Go >= the go.mod version")
    report.kubernetes_version = kubernetes_version(module_dir)
    report.go_version = subprocess.run(
        [go, "env", "GOVERSION"], capture_output=True, text=True, check=True
    ).stdout.strip()
    for target in todo:
        print(f"build   {target.name:<24} from {target.package}", file=out)

    bin_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=bin_dir.parent))
    try:
        staged = staging / "bin"
        staged.mkdir()
        command = [
            go,
            "build",
            "-v",
            *BUILD_FLAGS,
            "-ldflags",
            version_ldflags(report.kubernetes_version),
            "-o",
            f"{staged}/",
            *[t.package for t in todo],
        ]
        usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        report.packages_compiled = _run_with_progress(command, module_dir, out, started)
        usage_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        report.wall_seconds = round(time.monotonic() - started, 1)
        report.user_seconds = round(usage_after.ru_utime - usage_before.ru_utime, 1)
        report.sys_seconds = round(usage_after.ru_stime - usage_before.ru_stime, 1)
        for target in todo:
            if target.built_as != target.name:
                (staged / target.built_as).rename(staged / target.name)
        _install(staged, bin_dir, [t.name for t in todo])
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    report.built = [t.name for t in todo]
    report.finished_at = datetime.now(UTC).isoformat(timespec="seconds")
    report.source_digest = source_digest(module_dir)
    write_timings(bin_dir.parent / "timings.json", asdict(report))
    print(
        f"built {len(todo)} binaries into {bin_dir} in {_clock(report.wall_seconds)} wall "
        f"({_clock(report.user_seconds)} user, {report.packages_compiled} packages compiled)",
        file=out,
    )
    return report


def _run_with_progress(command: list[str], cwd: Path, out: TextIO, started: float) -> int:
    """Run `go build -v`, printing a throttled progress line; return packages compiled."""
    env = {**os.environ, "GOFLAGS": "-mod=readonly"}  # never let the build rewrite go.mod/go.sum
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    assert process.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True).start()

    compiled = 0
    latest = ""
    tail: deque[str] = deque(maxlen=60)  # kept for the error message if the build fails
    last_report = started
    last_count = 0
    while True:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            line = ""
        if line is None:
            break
        line = line.rstrip()
        if line:
            tail.append(line)
            if _is_package_line(line):
                compiled += 1
                latest = line
        now = time.monotonic()
        quiet_for = now - last_report
        if (compiled > last_count and quiet_for >= PROGRESS_EVERY_S) or (
            quiet_for >= HEARTBEAT_EVERY_S
        ):
            doing = f"last: {latest}" if compiled > last_count else "compiling/linking"
            print(f"  [{_clock(now - started)}] {compiled} packages compiled, {doing}", file=out)
            out.flush()
            last_report, last_count = now, compiled
    if process.wait() != 0:
        raise BuildError("go build failed:\n" + "\n".join(tail))
    return compiled


def _pump(stream: TextIO, lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _is_package_line(line: str) -> bool:
    # `go build -v` prints one bare import path per compiled package; errors contain spaces.
    return " " not in line and not line.startswith("#")


def _install(staged: Path, bin_dir: Path, names: list[str]) -> None:
    try:
        staged.rename(bin_dir)  # atomic when bin/ does not exist yet
    except OSError:
        # bin/ exists (a binary was missing, or a concurrent build won): replace one by one.
        bin_dir.mkdir(parents=True, exist_ok=True)
        for name in names:
            os.replace(staged / name, bin_dir / name)


def _record_source(path: Path, source: str) -> None:
    """Add `source_digest` to the timings.json of a build made before it was recorded."""
    try:
        timings = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(timings, dict) and timings.get("source_digest") != source:
        write_timings(path, {**timings, "source_digest": source})


def write_timings(path: Path, timings: dict[str, object]) -> None:
    """Write a build's timings.json whole or not at all."""
    partial = path.with_suffix(".json.tmp")
    partial.write_text(json.dumps(timings, indent=2) + "\n")
    os.replace(partial, path)


def _clock(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s"
