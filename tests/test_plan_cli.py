"""`infertune plan` and `infertune allocator check` run the same code the operator runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

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
    for where, said in ((taken, "needs a directory it can write"),
                        # "File exists", from mkdir, said nothing of what was wrong.
                        (afile, "not a directory; give the directory")):
        assert main(["launcher", "install", str(where)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"launcher install {where}: ") and "Traceback" not in err, err
        assert said in err, err
    assert [p.name for p in taken.iterdir()] == ["infertune-launch"]  # no staged copy left
    # A usage error, as every command's: it exited 1, as a directory it cannot write.
    assert main(["launcher", "install", ""]) == 2
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


@pytest.mark.parametrize(("api_version", "says"), [
    (None, "apiVersion: is missing; set it to infertune.io/v1alpha1"),
    ("infertune.io/v1", "apiVersion: 'infertune.io/v1' is not served; use "
                        "infertune.io/v1alpha1"),
])
def test_plan_and_evaluate_refuse_the_api_version_validate_refuses(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], api_version: str | None,
        says: str) -> None:
    """A tuning without apiVersion (kubectl refuses it) was planned and evaluated, where
    validate refused it; a wrong one was said in other words than validate's."""
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    for doc in docs:
        if doc["kind"] == "InferenceTuning":
            doc.pop("apiVersion")
            if api_version is not None:
                doc["apiVersion"] = api_version
    path = tmp_path / "tuning.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    assert main(["validate", str(path)]) == 1
    assert says in capsys.readouterr().err
    assert main(["plan", str(path), "--pod", str(EXAMPLE)]) == 1
    assert f"{path}: {says}" in capsys.readouterr().err
    assert main(["autoscale", "evaluate", str(path), "--prometheus", "http://127.0.0.1:1",
                 "--timeout", "0.5"]) == 1
    assert f"{path}: {says}" in capsys.readouterr().err


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
    assert "1 to 65536" in capsys.readouterr().err


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


def test_plan_prints_names_from_the_files_escaped(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A Deployment named with a newline and terminal escapes printed a line of its own
    ("reason: all good") and cleared the screen, as `validate` no longer did."""
    deployment, _ = _example()
    deployment["metadata"]["name"] = "x\x1b[2J\nreason: all good"
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump(deployment))
    assert main(["plan", str(EXAMPLE), "--pod", str(pod)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\nreason: all good" not in out
    assert "problem: Deployment x\\x1b[2J\\nreason: all good is not the tuning's target" in out


def test_what_plan_refuses_is_said_one_line_per_problem_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The errors of a tuning plan cannot read were printed as the file held them: an escape
    sequence in a field name reached the terminal, a newline made a line of its own."""
    _, tuning = _example()
    tuning["spec"]["bad\x1b[2Jkey\nx"] = 1
    tuning["spec"]["other"] = 2
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(tuning))
    assert main(["plan", str(path), "--pod", str(EXAMPLE)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert "\x1b" not in "".join(lines)
    assert [line.split(": ", 2)[1] for line in lines] == [
        "spec.bad\\x1b[2Jkey\\nx", "spec.other"], lines


def _example(**changes: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The example's Deployment and tuning (copies), with `changes` to the serving container."""
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    tuning = next(d for d in docs if d["kind"] == "InferenceTuning")
    deployment["spec"]["template"]["spec"]["containers"][0].update(changes)
    return deployment, tuning


def _planned(tmp_path: Path, capsys: pytest.CaptureFixture[str], *docs: dict[str, Any],
             options: tuple[str, ...] = ()) -> dict[str, Any]:
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    assert main(["plan", str(path), "--pod", str(path), "--output", "json", *options]) == 0, \
        capsys.readouterr().err
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_plan_skips_the_qos_checks_as_run_no_static_cpu_manager_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An operator run with --no-static-cpu-manager never reports QoS problems; `plan`
    reported them, as if the kubelets ran the static CPU manager."""
    burstable = {"requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": 1},
                 "limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 1}}
    docs = _example(resources=burstable)
    qos = "requests cpu below its limit, so the pod is not Guaranteed QoS"
    assert any(qos in p for p in _planned(tmp_path, capsys, *docs)["problems"])
    problems = _planned(tmp_path, capsys, *docs, options=("--no-static-cpu-manager",))[
        "problems"]
    assert not any("Guaranteed QoS" in p for p in problems), problems


GPU = {"requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 1},
       "limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 1}}


def test_plan_previews_the_mig_slice_of_a_planned_layout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With spec.mig the webhook asks for the slice status.mig names; offline there is no
    status.mig, and `plan` could only say "not planned yet (see status.mig)"."""
    docs = _example(resources=GPU)
    planned = _planned(tmp_path, capsys, *docs, options=("--mig-profile", "2g.35gb"))
    paths = {(op["op"], op["path"]) for op in planned["patch"]}
    assert ("add", "/spec/containers/0/resources/limits/nvidia.com~1mig-2g.35gb") in paths
    assert ("remove", "/spec/containers/0/resources/limits/nvidia.com~1gpu") in paths
    assert not any("MIG" in p for p in planned["problems"]), planned["problems"]
    unplanned = _planned(tmp_path, capsys, *docs)
    assert not any(op["path"].endswith("mig-2g.35gb") for op in unplanned["patch"])
    (mig,) = [p for p in unplanned["problems"] if "MIG" in p]
    assert "see status.mig" not in mig
    assert "until the operator has planned the MIG layout (status.mig in the cluster)" in mig
    assert "--mig-profile PROFILE previews it" in mig
    # The revision is the webhook's for that planned profile: pods labelled with it are
    # tuned, and not evicted by re-tuning.
    assert planned["revision"] != unplanned["revision"]


@pytest.mark.parametrize(("profile", "mig", "says"), [
    ("9g.1gb", {"profile": "2g.35gb"}, "--mig-profile '9g.1gb': no GPU in the MIG catalog "
     "has this profile"),
    ("3g.71gb", {"profile": "2g.35gb"}, "--mig-profile 3g.71gb: spec.mig.profile is 2g.35gb"),
    ("1g.18gb", {"sizing": {"weights": "15Gi"}, "layout": [{"profile": "3g.71gb"}]},
     "--mig-profile 1g.18gb: spec.mig.layout has no 1g.18gb"),
    ("2g.35gb", None, "--mig-profile 2g.35gb: the tuning has no spec.mig"),
    # The layout planner gives the smallest profile without +me that holds the model (30Gi x
    # 1.1 = 33 GiB): these two were accepted, and the preview asked for a slice no node has.
    ("1g.5gb", {"sizing": {"weights": "30Gi"}}, "--mig-profile 1g.5gb: the layout planner "
     "gives this tuning's pods 1g.45gb (NVIDIA-B200), 1g.47gb (NVIDIA-GB200), 3g.40gb "
     "(NVIDIA-A100-SXM4-80GB, NVIDIA-H100-80GB-HBM3), 3g.47gb (NVIDIA-H100-NVL), 3g.71gb "
     "(NVIDIA-H200), 7g.40gb (NVIDIA-A100-SXM4-40GB) under strategy mixed, never 1g.5gb "
     "(spec.mig.sizing: the model needs 33 GiB, and the pods get the smallest profile without "
     "media extensions that holds it); give one of those"),
    ("1g.10gb+me", {"sizing": {"weights": "30Gi"}}, "never 1g.10gb+me (spec.mig.sizing"),
    ("3g.40gb", {"sizing": {"weights": "30Gi"},
                 "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
     "--mig-profile 3g.40gb: the layout planner gives this tuning's pods 3g.71gb (NVIDIA-H200) "
     "under strategy mixed, never 3g.40gb"),
    ("7g.180gb", {"sizing": {"weights": "300Gi"}}, "--mig-profile 7g.180gb: spec.mig cannot be "
     "planned under strategy mixed on any GPU of the MIG catalog, so the operator gives the "
     "pods no MIG slice: model needs 330 GiB but the largest profile on NVIDIA-B200 is "
     "7g.180gb (180 GB)"),
    ("1g.5gb", {"profile": "1g.5gb", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
     "spec.mig cannot be planned under strategy mixed on any GPU spec.mig.nodeSelector allows "
     "(nvidia.com/gpu.product: NVIDIA-H200), so the operator gives the pods no MIG slice: "
     "1g.5gb does not exist on NVIDIA-H200"),
])
def test_plan_refuses_a_mig_profile_the_tuning_cannot_get(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], profile: str,
        mig: dict[str, Any] | None, says: str) -> None:
    assert _plan_mig(tmp_path, mig, "--mig-profile", profile) == 1
    assert says in capsys.readouterr().err


def _plan_mig(tmp_path: Path, mig: dict[str, Any] | None, *options: str) -> int:
    """`plan --output json` over the example with `mig` as its spec.mig (None: none)."""
    deployment, tuning = _example(resources=GPU)
    if mig is None:
        del tuning["spec"]["mig"]
    else:
        tuning["spec"]["mig"] = mig
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump_all([deployment, tuning]))
    return main(["plan", str(path), "--pod", str(path), "--output", "json", *options])


@pytest.mark.parametrize("profile", ["3g.71gb", "3g.40gb", "1g.45gb"])
def test_plan_takes_a_profile_the_sizing_gives_on_some_gpu(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], profile: str) -> None:
    assert _plan_mig(tmp_path, {"sizing": {"weights": "30Gi"}}, "--mig-profile", profile) == 0
    patch = json.loads(capsys.readouterr().out)["patch"]
    assert any(op["path"].endswith(f"nvidia.com~1mig-{profile}") for op in patch), patch


SINGLE = "mig: single strategy, nvidia.com/gpu is a 2g.35gb slice"


@pytest.mark.parametrize(("strategy", "option", "single"), [
    ("mixed", (), False), ("mixed", ("--mig-strategy", "single"), True),
    ("single", (), True), ("single", ("--mig-strategy", "mixed"), False)])
def test_plan_takes_the_mig_strategy_of_the_nodes_when_told(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], strategy: str,
        option: tuple[str, ...], single: bool) -> None:
    """The webhook reads status.mig.strategy, which the operator takes from the selected
    nodes' nvidia.com/mig.strategy (spec.mig.strategy only where they have none); `plan`
    took spec.mig.strategy whatever the nodes run."""
    mig = {"profile": "2g.35gb", "strategy": strategy}
    assert _plan_mig(tmp_path, mig, "--mig-profile", "2g.35gb", *option) == 0
    planned = json.loads(capsys.readouterr().out)
    requested = any(op["path"].endswith("nvidia.com~1mig-2g.35gb") for op in planned["patch"])
    assert (requested, SINGLE in planned["reasons"]) == (not single, single), planned


def test_plan_refuses_a_mixed_layout_under_strategy_single(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nodes on strategy single: the operator refuses the example's 3g.71gb + 2x2g.35gb
    layout, and no pod gets a slice."""
    _, tuning = _example()
    assert _plan_mig(tmp_path, tuning["spec"]["mig"], "--mig-profile", "2g.35gb",
                     "--mig-strategy", "single") == 1
    assert capsys.readouterr().err.strip() == (
        "--mig-profile 2g.35gb: spec.mig cannot be planned under strategy single on any GPU of "
        "the MIG catalog, so the operator gives the pods no MIG slice: 3g.71gb + 2x2g.35gb: "
        "strategy single gives every MIG device on a node the same profile; use one profile or "
        "strategy mixed")
    with pytest.raises(SystemExit):
        main(["plan", str(EXAMPLE), "--pod", str(EXAMPLE), "--mig-strategy", "none"])


def test_plan_refuses_a_mig_strategy_without_a_profile(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without --mig-profile the pod keeps its GPU request, so the strategy changed nothing:
    taken silently, it read as applied."""
    assert main(["plan", str(EXAMPLE), "--pod", str(EXAMPLE), "--mig-strategy", "single"]) == 2
    assert "--mig-strategy goes with --mig-profile" in capsys.readouterr().err


def test_plan_says_when_the_target_is_in_another_namespace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """spec.targetRef names a Deployment of the tuning's namespace; one of that name
    elsewhere was planned for without a word. The one in the tuning's namespace is taken
    first."""
    deployment, tuning = _example()
    elsewhere = {**deployment, "metadata": {**deployment["metadata"], "namespace": "staging"}}
    problems = _planned(tmp_path, capsys, elsewhere, tuning)["problems"]
    assert problems[0] == ("Deployment qwen2-7b is in namespace staging, not the tuning's "
                           "inference: spec.targetRef names a Deployment of the tuning's own "
                           "namespace, so the operator never tunes this one's pods; planned "
                           "as if it were")
    both = _planned(tmp_path, capsys, elsewhere, deployment, tuning)["problems"]
    assert not any("namespace" in p for p in both), both


def _pod(deployment: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    template = deployment["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {**template["metadata"], "name": "qwen2-7b-abc", **metadata},
            "spec": template["spec"]}


def _owned_by(replicaset: str) -> dict[str, Any]:
    return {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": replicaset, "uid": "u", "controller": True}],
            "labels": {"app": "qwen2-7b", "pod-template-hash": "5d9f7"}}


@pytest.mark.parametrize(("metadata", "says"), [
    ({}, "Pod qwen2-7b-abc has no controlling ReplicaSet in metadata.ownerReferences: the "
     "webhook tunes only the pods of a Deployment (created by its ReplicaSet) and admits "
     "this one unchanged"),
    ({"ownerReferences": [{"kind": "ReplicaSet", "name": "qwen2-7b-5d9f7", "uid": "u"}]},
     "has no controlling ReplicaSet"),  # not its controller
    (_owned_by("other-5d9f7"), "Pod qwen2-7b-abc belongs to Deployment other (ReplicaSet "
     "other-5d9f7), not the tuning's target (spec.targetRef.name qwen2-7b)"),
    ({**_owned_by("qwen2-7b-5d9f7"), "namespace": "staging"},
     "Pod qwen2-7b-abc is in namespace staging, not the tuning's inference"),
    (_owned_by("qwen2-7b-5d9f7"), None),
])
def test_plan_says_when_the_webhook_would_leave_a_pod_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], metadata: dict[str, Any],
        says: str | None) -> None:
    """The webhook tunes a pod through its controlling ReplicaSet's Deployment
    (controller/pods.py, _deployment_of); a bare Pod was planned as if it would be tuned."""
    deployment, tuning = _example()
    problems = _planned(tmp_path, capsys, _pod(deployment, **metadata), tuning)["problems"]
    if says is None:
        assert not any("Pod " in p for p in problems), problems
    else:
        assert any(says in p for p in problems), problems


@pytest.mark.parametrize(("text", "said"), [
    ("", "found 0 (the file is empty)"),
    ("- a\n- b\n", "holds no manifest (a YAML mapping with apiVersion, kind and metadata), "
     "only a list or a scalar"),
    ("hello\n", "holds no manifest"),
])
def test_a_tuning_file_without_a_manifest_says_what_it_holds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str) -> None:
    """A list or a scalar was called empty."""
    path = tmp_path / "t.yaml"
    path.write_text(text)
    assert main(["plan", str(path), "--pod", str(EXAMPLE)]) == 1
    assert said in capsys.readouterr().err
