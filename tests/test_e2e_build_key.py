"""The cache key of the e2e control-plane build: binaries built by another Go toolchain are
not taken for this one's (e2e/cluster/build.py)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from e2e.cluster.build import (
    GO_MODULE_DIR,
    TARGETS,
    build,
    cached_bin_dir,
    go_sum_digest,
    source_digest,
    toolchain,
    write_timings,
)


def test_the_key_changes_with_the_toolchain_and_only_with_it() -> None:
    first = go_sum_digest(GO_MODULE_DIR, "go1.26.8\n1\nlinux\namd64\nv1\n")
    assert go_sum_digest(GO_MODULE_DIR, "go1.26.8\n1\nlinux\namd64\nv1\n") == first
    for other in ("go1.26.9\n1\nlinux\namd64\nv1\n",  # a newer Go
                  "go1.26.8\n0\nlinux\namd64\nv1\n",  # cgo off
                  "go1.26.8\n1\nlinux\namd64\nv3\n",  # another amd64 level
                  "no go"):
        assert go_sum_digest(GO_MODULE_DIR, other) != first, other


def test_the_key_changes_with_go_mod(tmp_path: Path) -> None:
    for name in ("go.mod", "go.sum"):
        shutil.copy(GO_MODULE_DIR / name, tmp_path / name)
    same = go_sum_digest(tmp_path, "go1.26.8")
    assert same == go_sum_digest(GO_MODULE_DIR, "go1.26.8")
    with (tmp_path / "go.mod").open("a") as mod:
        mod.write("\ngodebug tlsrsakex=1\n")  # changes the binaries, not go.sum
    assert go_sum_digest(tmp_path, "go1.26.8") != same


@pytest.mark.skipif(shutil.which("go") is None, reason="needs the Go toolchain on PATH")
def test_the_toolchain_is_read_from_go_env_in_the_module() -> None:
    version, cgo, goos, goarch, _level = toolchain().splitlines()
    assert version.startswith("go1.")
    assert cgo in ("0", "1")
    assert (goos, goarch) != ("", "")
    assert cached_bin_dir().parent.name == go_sum_digest(GO_MODULE_DIR, toolchain())


def test_without_go_the_newest_build_of_the_same_sources_is_taken(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The tests and `up` only run the binaries: a Go missing from PATH there made a complete
    build look unbuilt. The toolchain it was built with cannot be asked then; the newest
    build of the same go.mod, go.sum and recipe is taken, and one of other sources never."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("INFERTUNE_E2E_CACHE", str(cache))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no `go` in it
    assert toolchain() == "no go"
    source = source_digest()
    for name, recorded in (("old", {"source_digest": source, "finished_at": "2026-12-01"}),
                           ("new", {"source_digest": source, "finished_at": "2026-12-05"}),
                           ("other", {"source_digest": "0" * 16, "finished_at": "2026-12-09"}),
                           ("unread", None)):
        (cache / name / "bin").mkdir(parents=True)
        write_timings(cache / name / "timings.json", recorded or {})
    assert cached_bin_dir() == cache / "new" / "bin"
    for name in ("old", "new"):
        (cache / name / "timings.json").unlink()
    assert cached_bin_dir() == cache / go_sum_digest(GO_MODULE_DIR, "no go") / "bin"


def test_a_build_made_before_the_sources_were_recorded_gets_them(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`build` with everything cached records the sources in the build's timings.json, so
    a machine whose cache predates it finds its binaries without a Go too."""
    monkeypatch.setenv("INFERTUNE_E2E_CACHE", str(tmp_path))
    bin_dir = cached_bin_dir()
    bin_dir.mkdir(parents=True)
    for target in TARGETS:
        (bin_dir / target.name).write_text("#!/bin/sh\n")
        (bin_dir / target.name).chmod(0o755)
    write_timings(bin_dir.parent / "timings.json", {"go_version": "go1.26.8"})
    report = build(out=io.StringIO())
    assert report.built == [] and len(report.cached) == len(TARGETS)
    recorded = json.loads((bin_dir.parent / "timings.json").read_text())
    assert recorded == {"go_version": "go1.26.8", "source_digest": source_digest()}
