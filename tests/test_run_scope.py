"""What `infertune run --namespace` changes: a namespaced operator sees only its namespaces'
objects, so it must not trust its pod index for MIG, and the API server should send it only
its namespaces' pods."""

from __future__ import annotations

import gc
import tempfile
from pathlib import Path
from typing import Any

import pytest

from infertune.api.crd import custom_resource_definition
from infertune.cli import build_parser
from infertune.controller import main
from infertune.kube.webhook_tls import write_self_signed


@pytest.mark.parametrize(("argv", "namespaces"), [
    (["run"], ()), (["run", "--all-namespaces"], ()), (["run", "-n", "team-a"], ("team-a",)),
    (["run", "-n", "team-a", "-n", "team-b"], ("team-a", "team-b"))])
def test_the_scope_reaches_kopf_the_mig_loop_and_the_webhook(
        monkeypatch: pytest.MonkeyPatch, argv: list[str], namespaces: tuple[str, ...],
        tmp_path: Path) -> None:
    started: dict[str, Any] = {}
    # Loaded at start (a file that holds no certificate is refused before kopf runs).
    cert, key = write_self_signed(tmp_path, ["127.0.0.1"])
    monkeypatch.delenv("INFERTUNE_NAMESPACE", raising=False)
    monkeypatch.setattr(main, "configure", lambda kubeconfig: None)
    monkeypatch.setattr(main, "check_api_server", lambda: None)  # no API server here
    monkeypatch.setattr(main, "read_installed", custom_resource_definition)  # nor a CRD
    monkeypatch.setattr(main, "_port_taken", lambda addr, port: None)  # 9443 may be busy
    monkeypatch.setattr(main, "prepare_garbage_collector",
                        lambda: started.setdefault("gc prepared", not started))
    monkeypatch.setattr(main.kopf, "configure", lambda **kwargs: None)  # the root logger
    monkeypatch.setattr(main.kopf, "run", lambda **kwargs: started.update(kwargs))
    args = build_parser().parse_args([*argv, "--webhook-cert", str(cert), "--webhook-key",
                                      str(key)])
    assert main.run_operator(args) == 0
    assert started["gc prepared"] is True  # before kopf started
    cluster_wide = not namespaces
    assert started["clusterwide"] is cluster_wide
    assert tuple(started["namespaces"]) == namespaces
    # A namespaced operator's pod index misses other namespaces' GPU pods on the same node.
    # Nor its tunings: a claim on a node by a tuning it does not see holds.
    assert started["memo"].mig.cluster_wide is cluster_wide
    registration = started["memo"].webhook_server.registration
    assert registration.included_namespaces == namespaces
    assert set(registration.excluded_namespaces) == {"kube-system", "infertune-system"}


@pytest.mark.parametrize("fails", [False, True])
def test_a_self_signed_webhook_key_lives_only_as_long_as_the_operator(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fails: bool) -> None:
    """Without --webhook-cert the operator makes its own key pair in the temporary directory;
    each run used to leave its private key there."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    monkeypatch.setattr(main, "configure", lambda kubeconfig: None)
    monkeypatch.setattr(main, "check_api_server", lambda: None)  # no API server here
    monkeypatch.setattr(main, "read_installed", custom_resource_definition)  # nor a CRD
    monkeypatch.setattr(main, "_port_taken", lambda addr, port: None)  # 9443 may be busy
    monkeypatch.setattr(main, "prepare_garbage_collector", lambda: None)
    monkeypatch.setattr(main.kopf, "configure", lambda **kwargs: None)
    seen: list[Path] = []

    def kopf_run(memo: Any, **kwargs: Any) -> None:
        key = Path(memo.webhook_server.pkeyfile)
        assert key.read_bytes().startswith(b"-----BEGIN")  # kopf reads it while running
        assert key.parent.parent == tmp_path and key.parent.stat().st_mode & 0o077 == 0
        seen.append(key)
        if fails:
            raise RuntimeError("kopf stopped on an error")

    monkeypatch.setattr(main.kopf, "run", kopf_run)
    args = build_parser().parse_args(["run"])
    if fails:
        with pytest.raises(RuntimeError):
            main.run_operator(args)
    else:
        assert main.run_operator(args) == 0
    assert len(seen) == 1
    assert list(tmp_path.iterdir()) == []


def test_the_garbage_collector_is_prepared_for_autoscaling_cycles() -> None:
    """The startup objects are frozen and the thresholds raised (main.GC_THRESHOLDS): at
    Python's 700, a cycle over 1000 tunings spent 13-21 ms of its CPU collecting."""
    before = gc.get_threshold()
    try:
        main.prepare_garbage_collector()
        # The young and middle thresholds (CPython 3.14's incremental collector keeps no third).
        assert gc.get_threshold()[:2] == main.GC_THRESHOLDS[:2]
        assert main.GC_THRESHOLDS[0] >= 20_000  # above a 1000-tuning cycle's ~16,000
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
