"""`infertune plan` and `infertune allocator check` run the same code the operator runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonpatch
import pytest
import yaml

from infertune.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "vllm-qwen2-7b-h200-mig.yaml"


def test_plan_prints_the_patch_and_reasons_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLE), "--pod", str(EXAMPLE), "--output", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) >= {"patch", "reasons", "revision", "problems", "refused"}
    assert result["refused"] is False
    template = next(d for d in yaml.safe_load_all(EXAMPLE.read_text())
                    if d["kind"] == "Deployment")["spec"]["template"]
    pod = {"metadata": template["metadata"], "spec": template["spec"]}
    tuned = jsonpatch.apply_patch(pod, result["patch"])
    assert tuned["spec"]["containers"][0]["command"][0] == "/infertune/infertune-launch"
    assert any("memory.high 30Gi" in r for r in result["reasons"])


def test_plan_text_output_lists_each_operation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLE), "--pod", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("revision ")
    assert '"path": "/spec/containers/0/command"' in out


def test_plan_reports_an_invalid_tuning_by_field(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = ROOT / "tests" / "fixtures" / "invalid" / "min-above-max.yaml"
    assert main(["plan", str(bad), "--pod", str(EXAMPLE)]) == 1
    assert "spec.autoscaling.minReplicas: 8 is above maxReplicas 4" in capsys.readouterr().err


@pytest.mark.parametrize(("conf", "code"), [("background_thread:true,dirty_decay_ms:5000", 0),
                                            ("lg_chunk:21", 1), ("narenas:0", 1)])
def test_allocator_check_exit_status(conf: str, code: int) -> None:
    assert main(["allocator", "check", conf]) == code


def test_launcher_install_copies_an_executable(tmp_path: Path) -> None:
    assert main(["launcher", "install", str(tmp_path / "bin")]) == 0
    installed = tmp_path / "bin" / "infertune-launch"
    assert installed.read_text().startswith("#!/bin/sh")
    assert installed.stat().st_mode & 0o111


def test_launcher_install_that_cannot_write_says_why_and_leaves_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It is the init container's command: a traceback in its log, a staged copy left per
    try, and `install ""` wrote into the working directory."""
    taken = tmp_path / "taken"
    (taken / "infertune-launch").mkdir(parents=True)  # a directory where the file goes
    afile = tmp_path / "afile"
    afile.write_text("x")
    for where in (taken, afile):
        assert main(["launcher", "install", str(where)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"launcher install {where}: ") and "Traceback" not in err, err
        assert "needs a directory it can write" in err
    assert [p.name for p in taken.iterdir()] == ["infertune-launch"]  # no staged copy left
    assert main(["launcher", "install", ""]) == 1
    assert "DIR is empty" in capsys.readouterr().err


def test_plan_and_evaluate_leave_the_stored_status_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kubectl get -o yaml | infertune autoscale evaluate -` (docs/autoscaling.md): a status
    another operator version wrote refused the spec, as validate never did."""
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    for doc in docs:
        if doc["kind"] == "InferenceTuning":
            doc["status"] = {"phase": "Ready", "futureField": 1}
    stored = tmp_path / "stored.yaml"
    stored.write_text(yaml.safe_dump_all(docs))
    assert main(["validate", str(stored)]) == 0
    capsys.readouterr()
    assert main(["plan", str(stored), "--pod", str(EXAMPLE), "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["refused"] is False
    code = main(["autoscale", "evaluate", str(stored), "--prometheus", "http://127.0.0.1:1",
                 "--timeout", "0.5", "--output", "json"])
    assert code == 3, capsys.readouterr().err  # evaluated; Prometheus cannot be reached
    assert "status" not in capsys.readouterr().err


def test_launcher_install_as_the_init_container_runs_it_imports_no_api_model(
        tmp_path: Path) -> None:
    """Every tuned pod's init container runs it under a 50m CPU limit: the whole command line
    imported pydantic and the API models, 0.3 s of CPU and some 6 s of wall time there."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys, runpy; sys.argv = ['infertune', 'launcher', "
         f"'install', {str(tmp_path)!r}]; code = 0\ntry:\n    runpy.run_module('infertune', "
         "run_name='__main__')\nexcept SystemExit as e:\n    code = e.code\n"
         "print(code, sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', "
         "'yaml', 'kubernetes', 'kopf') or m.startswith('infertune.api')))"],
        capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "0 []", done.stdout + done.stderr
    assert (tmp_path / "infertune-launch").stat().st_mode & 0o111


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to the init container's uid 65532")
def test_launcher_install_runs_again_as_the_init_containers_user() -> None:
    """After a pod sandbox restart the init container (uid 65532) runs again into the same
    emptyDir, where its earlier copy is read-only: copying over it failed, and the pod kept
    restarting its init container. (As root the old copy could be overwritten, so the test
    takes the init container's uid.)"""
    scratch = Path(tempfile.mkdtemp(prefix="infertune-launcher-"))
    try:
        scratch.chmod(0o777)
        os.seteuid(65532)
        try:
            for _ in range(2):
                assert main(["launcher", "install", str(scratch)]) == 0
        finally:
            os.seteuid(0)
        installed = scratch / "infertune-launch"
        assert installed.stat().st_uid == 65532 and installed.stat().st_mode & 0o777 == 0o555
        assert [p.name for p in scratch.iterdir()] == ["infertune-launch"]  # nothing staged
    finally:
        shutil.rmtree(scratch)


def test_allocator_check_takes_the_cpus_for_what_depends_on_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["allocator", "check", "narenas_ratio:2048"]) == 0
    assert main(["allocator", "check", "narenas_ratio:2048", "--cpus", "2"]) == 1
    assert "makes 4096 arenas" in capsys.readouterr().err
    assert main(["allocator", "check", "percpu_arena:percpu", "--cpus", "8", "--pinned"]) == 1
    assert main(["allocator", "check", "percpu_arena:percpu", "--pinned"]) == 2
    with pytest.raises(SystemExit):
        main(["allocator", "check", "narenas:4", "--cpus", "0"])
    assert "1 or more" in capsys.readouterr().err


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_example_holds_the_deployment_it_tunes(
        example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """README applies the examples to a cluster and says they come with their Deployments;
    three of them had none, so the tuning waited with TargetNotFound and `plan` could not
    run on them."""
    docs = [d for d in yaml.safe_load_all(example.read_text()) if d]
    tuning = next(d for d in docs if d["kind"] == "InferenceTuning")
    targets = [d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"] == tuning["spec"]["targetRef"]["name"]
               and d["metadata"]["namespace"] == tuning["metadata"]["namespace"]]
    assert len(targets) == 1
    assert main(["plan", str(example), "--pod", str(example), "--output", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert not result["refused"] and result["patch"], result


def test_plan_says_when_the_files_only_deployment_is_not_the_target(
        capsys: pytest.CaptureFixture[str]) -> None:
    """It plans for the file's only Deployment, as documented; but the operator never tunes
    the pods of one the tuning does not target, and the preview read as what would happen."""
    other = ROOT / "examples" / "tgi-l4-no-mig.yaml"
    assert main(["plan", str(EXAMPLE), "--pod", str(other), "--output", "json"]) == 0
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert problems[0] == ("Deployment mistral-7b is not the tuning's target "
                           "(spec.targetRef.name qwen2-7b): the operator never tunes its pods; "
                           "planned as if it were")
    assert main(["plan", str(EXAMPLE), "--pod", str(EXAMPLE), "--output", "json"]) == 0
    assert not any("is not the tuning's target" in p
                   for p in json.loads(capsys.readouterr().out)["problems"])
