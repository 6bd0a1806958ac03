"""The cache key of the e2e control-plane build: binaries built by another Go toolchain are
not taken for this one's (e2e/cluster/build.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from e2e.cluster.build import GO_MODULE_DIR, cached_bin_dir, go_sum_digest, toolchain


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


def test_without_go_nothing_built_by_one_is_taken(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `go` in it
    assert toolchain() == "no go"
