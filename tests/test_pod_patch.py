"""The pod tuning planner: what the webhook does to a pod, and what it refuses to do."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from infertune import keys
from infertune.api.spec import InferenceTuningSpec
from infertune.tuning.pod_patch import (
    LAUNCHER_INIT,
    LAUNCHER_PATH,
    LimitRangeView,
    PodContext,
    container_limits,
    plan_pod_patch,
    planned_mig,
    shape_revision,
    tuning_revision,
    unprobed_container,
)

CONTEXT = PodContext(tuning_name="qwen", launcher_image="infertune:test")


def _spec(**sections: Any) -> InferenceTuningSpec:
    return InferenceTuningSpec.model_validate(
        {"targetRef": {"name": "qwen"}, "engine": "vllm", **sections})


def _pod(**container: Any) -> dict[str, Any]:
    serving = {
        "name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
        "command": ["vllm", "serve", "Qwen/Qwen2-7B-Instruct"],
        "args": ["--port", "8000"],
        "resources": {"requests": {"cpu": "8", "memory": "32Gi"},
                      "limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}},
    }
    serving.update(container)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "qwen-abc-", "namespace": "ml",
                         "labels": {"app": "qwen"}},
            "spec": {"containers": [serving]}}


def _apply(spec: InferenceTuningSpec, pod: dict[str, Any]) -> dict[str, Any]:
    plan = plan_pod_patch(spec, pod, CONTEXT)
    assert not plan.refused, plan.problems
    result: dict[str, Any] = jsonpatch.apply_patch(pod, plan.patch)
    return result


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_launcher_wraps_the_command_and_keeps_args() -> None:
    tuned = _apply(_spec(), _pod())
    serving = tuned["spec"]["containers"][0]
    assert serving["command"] == [LAUNCHER_PATH, "--", "vllm", "serve", "Qwen/Qwen2-7B-Instruct"]
    assert serving["args"] == ["--port", "8000"]
    assert tuned["spec"]["initContainers"][0]["name"] == LAUNCHER_INIT
    assert tuned["spec"]["initContainers"][0]["image"] == "infertune:test"
    assert {"name": "infertune-launcher", "mountPath": "/infertune", "readOnly": True} in (
        serving["volumeMounts"])
    env = _env(serving)
    assert env["INFERTUNE_NUMA_POLICY"] == "gpu-local"
    assert env["INFERTUNE_NUMA_STRICT"] == "false"


@pytest.mark.parametrize(("container", "pod", "uid"), [
    (None, None, 65532),  # the image's user
    # OpenShift's restricted SCC gives the pod a UID from the namespace's range: 65532,
    # outside it, got every tuned pod refused.
    ({"runAsUser": 1000680000}, None, 1000680000),
    (None, {"runAsUser": 1001}, 1001),
    ({"runAsUser": 1002}, {"runAsUser": 1001}, 1002),
    # Root is not taken: with runAsNonRoot the kubelet would not start the init container.
    ({"runAsUser": 0}, None, 65532),
    ({"runAsUser": 0}, {"runAsUser": 1001}, 1001),
    (None, {"runAsUser": 0}, 65532),
])
def test_the_launcher_runs_as_the_serving_containers_user_unless_root(
        container: dict[str, Any] | None, pod: dict[str, Any] | None, uid: int) -> None:
    shape = _pod() if container is None else _pod(securityContext=container)
    if pod is not None:
        shape["spec"]["securityContext"] = pod
    init = _apply(_spec(), shape)["spec"]["initContainers"][0]
    assert init["securityContext"]["runAsUser"] == uid
    assert init["securityContext"]["runAsNonRoot"] is True


def test_jemalloc_preload_and_narenas_from_the_cpu_limit() -> None:
    tuned = _apply(_spec(allocator={"mallocConf": "background_thread:true"}), _pod())
    env = _env(tuned["spec"]["containers"][0])
    assert env["LD_PRELOAD"] == "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    assert env["MALLOC_CONF"].startswith("background_thread:true")
    assert "narenas:8" in env["MALLOC_CONF"]


def test_narenas_is_sized_without_any_malloc_conf() -> None:
    """Neither the spec nor the container sets MALLOC_CONF: jemalloc's default of 4 arenas
    per CPU of the node is still cut to the container's CPUs."""
    env = _env(_apply(_spec(), _pod())["spec"]["containers"][0])
    assert env["MALLOC_CONF"] == "narenas:8"


def test_user_narenas_is_left_alone() -> None:
    tuned = _apply(_spec(allocator={"mallocConf": "narenas:2"}), _pod())
    assert _env(tuned["spec"]["containers"][0])["MALLOC_CONF"] == "narenas:2"


def test_existing_ld_preload_is_kept_after_jemalloc() -> None:
    pod = _pod(env=[{"name": "LD_PRELOAD", "value": "/opt/libfoo.so"},
                    {"name": "HF_HOME", "value": "/cache"}])
    env = _env(_apply(_spec(), pod)["spec"]["containers"][0])
    assert env["LD_PRELOAD"] == "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2:/opt/libfoo.so"
    assert env["HF_HOME"] == "/cache"



def test_the_containers_malloc_conf_is_kept_under_the_specs() -> None:
    """jemalloc reads the pairs in order: the container's first, so the spec's win where
    both set an option and the container's others stay (they were dropped)."""
    pod = _pod(env=[{"name": "MALLOC_CONF", "value": "background_thread:true,narenas:16,"}])
    plan = plan_pod_patch(_spec(allocator={"mallocConf": "narenas:4,dirty_decay_ms:5000"}), pod,
                          CONTEXT)
    env = _env(jsonpatch.apply_patch(pod, plan.patch)["spec"]["containers"][0])
    assert env["MALLOC_CONF"] == "background_thread:true,narenas:16,narenas:4,dirty_decay_ms:5000"
    assert plan.problems == []
    # Without a mallocConf in the spec, the container's stays, with narenas sized if unset.
    own = _pod(env=[{"name": "MALLOC_CONF", "value": "background_thread:true"}])
    env = _env(_apply(_spec(), own)["spec"]["containers"][0])
    assert env["MALLOC_CONF"] == "background_thread:true,narenas:8"


@pytest.mark.parametrize(("own", "says"), [
    ("lg_chunk:21", "lg_chunk was removed in jemalloc 5.0"),
    ("narenas:4,oops", "has a syntax error, and jemalloc reads nothing after it"),
    # jemalloc ignores the whole string: its settings never applied, and are not made to.
    (",narenas:3", "has a syntax error, and jemalloc reads nothing after it"),
    (" narenas:3", "has a syntax error, and jemalloc reads nothing after it"),
])
def test_a_containers_malloc_conf_jemalloc_complains_about_is_reported(own: str,
                                                                       says: str) -> None:
    pod = _pod(env=[{"name": "MALLOC_CONF", "value": own}])
    plan = plan_pod_patch(_spec(allocator={"mallocConf": "narenas:2"}), pod, CONTEXT)
    assert not plan.refused
    assert any(says in p for p in plan.problems), plan.problems
    conf = _env(jsonpatch.apply_patch(pod, plan.patch)["spec"]["containers"][0])["MALLOC_CONF"]
    # After a syntax error jemalloc would not read the spec's part: it is replaced.
    assert conf == ("lg_chunk:21,narenas:2" if own.startswith("lg_chunk") else "narenas:2")


@pytest.mark.parametrize(("allocator", "name"), [
    ({}, "MALLOC_CONF"), ({"type": "glibc", "glibcTunables": "glibc.malloc.trim_threshold=1"},
                          "GLIBC_TUNABLES")])
def test_an_allocator_variable_from_value_from_refuses_the_patch(allocator: dict[str, Any],
                                                                 name: str) -> None:
    pod = _pod(env=[{"name": name, "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}])
    plan = plan_pod_patch(_spec(allocator=allocator), pod, CONTEXT)
    assert plan.refused and plan.patch == [] and f"{name} on the serving container" in \
        plan.problems[0]


def test_glibc_tunables_of_the_container_are_kept_before_the_specs() -> None:
    pod = _pod(env=[{"name": "GLIBC_TUNABLES", "value": "glibc.pthread.rseq=0"}])
    spec = _spec(allocator={"type": "glibc",
                            "glibcTunables": "glibc.malloc.trim_threshold=134217728"})
    env = _env(_apply(spec, pod)["spec"]["containers"][0])
    assert env["GLIBC_TUNABLES"] == "glibc.pthread.rseq=0:glibc.malloc.trim_threshold=134217728"


def test_allocator_variables_env_from_could_set_are_reported() -> None:
    pod = _pod(envFrom=[{"configMapRef": {"name": "runtime"}}])
    plan = plan_pod_patch(_spec(), pod, CONTEXT)
    assert any("envFrom: LD_PRELOAD or MALLOC_CONF there is overridden" in p
               for p in plan.problems), plan.problems
    assert not any("envFrom" in p for p in plan_pod_patch(_spec(), _pod(), CONTEXT).problems)
    # glibc: the count sized to the CPU limit is set in env, over one envFrom may set.
    glibc = plan_pod_patch(_spec(allocator={"type": "glibc"}), pod, CONTEXT)
    assert any("envFrom: MALLOC_ARENA_MAX there is overridden" in p
               for p in glibc.problems), glibc.problems
    # Not when no count is set: the container's own is kept, or the spec's tunable sets it.
    kept = _pod(envFrom=[{"configMapRef": {"name": "runtime"}}],
                env=[{"name": "MALLOC_ARENA_MAX", "value": "2"}])
    tunable = _spec(allocator={"type": "glibc", "glibcTunables": "glibc.malloc.arena_max=4"})
    assert not any("MALLOC_ARENA_MAX there" in p for p in plan_pod_patch(
        _spec(allocator={"type": "glibc"}), kept, CONTEXT).problems)
    assert not any("MALLOC_ARENA_MAX" in p and "envFrom" in p
                   for p in plan_pod_patch(tunable, pod, CONTEXT).problems)

def test_glibc_arenas_are_sized_to_the_container() -> None:
    env = _env(_apply(_spec(allocator={"type": "glibc"}), _pod())["spec"]["containers"][0])
    assert env["MALLOC_ARENA_MAX"] == "8"
    assert "LD_PRELOAD" not in env


@pytest.mark.parametrize(("own", "said"), [
    ([{"name": "MALLOC_ARENA_MAX", "value": "2"}], "the container's own MALLOC_ARENA_MAX=2"),
    ([{"name": "GLIBC_TUNABLES", "value": "glibc.malloc.arena_max=2:glibc.pthread.rseq=0"}],
     "the container's own GLIBC_TUNABLES glibc.malloc.arena_max=2"),
])
def test_the_containers_own_glibc_arena_count_is_kept(
        own: list[dict[str, Any]], said: str) -> None:
    """A low count set to bound the memory arenas take was raised to the CPU limit (8 here),
    unseen; the jemalloc path keeps a container's narenas the same way."""
    pod = _pod(env=own)
    before = copy.deepcopy(pod)
    plan = plan_pod_patch(_spec(allocator={"type": "glibc"}), pod, CONTEXT)
    assert pod == before  # planning reads the pod, the patch changes it
    env = _env(_apply(_spec(allocator={"type": "glibc"}), pod)["spec"]["containers"][0])
    assert env.get("MALLOC_ARENA_MAX") == next(
        (e.get("value") for e in own if e["name"] == "MALLOC_ARENA_MAX"), None)
    assert any(said in r for r in plan.reasons), plan.reasons
    # The spec's arenaMax still wins, in what glibc reads (`_glibc_arena_max`).
    spec = _spec(allocator={"type": "glibc", "arenaMax": 4})
    tuned = _env(_apply(spec, pod)["spec"]["containers"][0])
    assert tuned["MALLOC_ARENA_MAX"] == "4"
    if not LOADER.exists():
        pytest.skip(f"needs glibc's loader ({LOADER}) to read the tunables as glibc does")
    assert _glibc_arena_max(tuned) == 4


LOADER = next((path for pattern in ("/lib64/ld-linux-*.so.2", "/lib/ld-linux-*.so.1")
               for path in sorted(Path("/").glob(pattern.lstrip("/")))),
              Path("/lib64/ld-linux-x86-64.so.2"))
"""glibc's dynamic loader on this machine's architecture (x86-64's, aarch64's)."""


def _glibc_arena_max(env: dict[str, str]) -> int:
    """glibc.malloc.arena_max as the real glibc reads `env` (ld.so --list-tunables)."""
    shown = subprocess.run([str(LOADER), "--list-tunables"], capture_output=True, text=True,
                           check=True, env={k: v for k, v in env.items()
                                            if k in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES")})
    line = next(x for x in shown.stdout.splitlines() if x.startswith("glibc.malloc.arena_max"))
    return int(line.split(":")[1].split()[0], 16)


@pytest.mark.skipif(not LOADER.exists(), reason=f"needs glibc's loader ({LOADER})")
@pytest.mark.parametrize(("own", "allocator", "count"), [
    # The container's tunable: glibc takes it over MALLOC_ARENA_MAX in either order, so the
    # spec's count was reported applied while the container's 64 was the one used.
    ("glibc.malloc.arena_max=64", {"arenaMax": 4}, 4),
    # The spec's own tunables setting one too: arenaMax wins, as it does over the container's.
    (None, {"arenaMax": 4, "glibcTunables": "glibc.malloc.arena_max=16"}, 4),
    # The spec's tunable alone: no CPU-sized MALLOC_ARENA_MAX said to be applied beside it.
    (None, {"glibcTunables": "glibc.malloc.arena_max=16"}, 16),
    ("glibc.malloc.arena_max=2:glibc.pthread.rseq=0", {}, 2),  # the container's own, kept
    (None, {}, 8),  # sized to the 8-CPU limit
])
def test_the_arena_count_said_is_the_one_glibc_reads(
        own: str | None, allocator: dict[str, Any], count: int) -> None:
    pod = _pod(env=[] if own is None else [{"name": "GLIBC_TUNABLES", "value": own}])
    spec = _spec(allocator={"type": "glibc", **allocator})
    plan = plan_pod_patch(spec, pod, CONTEXT)
    env = _env(jsonpatch.apply_patch(pod, plan.patch)["spec"]["containers"][0])
    assert _glibc_arena_max(env) == count
    said = next(r for r in plan.reasons if r.startswith("allocator: glibc"))
    assert re.search(rf"(MALLOC_ARENA_MAX|glibc\.malloc\.arena_max)={count}\b", said), said


def test_a_glibc_arena_count_from_value_from_is_kept_and_the_pod_tuned() -> None:
    """Without arenaMax the container's own count is kept, so nothing is merged with one from
    a ConfigMap: the pod was refused, launcher and all, as if it were to be written over."""
    own = {"name": "MALLOC_ARENA_MAX",
           "valueFrom": {"configMapKeyRef": {"name": "alloc", "key": "arenas"}}}
    pod = _pod(env=[own])
    plan = plan_pod_patch(_spec(allocator={"type": "glibc"}), pod, CONTEXT)
    assert not plan.refused, plan.problems
    tuned = jsonpatch.apply_patch(pod, plan.patch)["spec"]["containers"][0]
    assert [e for e in tuned["env"] if e["name"] == "MALLOC_ARENA_MAX"] == [own]
    assert tuned["command"][0] == LAUNCHER_PATH
    assert any("the container's own MALLOC_ARENA_MAX (from valueFrom)" in r
               for r in plan.reasons), plan.reasons
    # With arenaMax it would be written over: that is still refused, as documented.
    assert plan_pod_patch(_spec(allocator={"type": "glibc", "arenaMax": 4}), pod,
                          CONTEXT).refused


@pytest.mark.parametrize("allocator", [{"type": "glibc", "arenaMax": 2}, {"type": "glibc"}])
def test_glibc_tunables_from_value_from_are_said_to_be_unread(allocator: dict[str, Any]) -> None:
    """A GLIBC_TUNABLES from a ConfigMap, which the spec's tunables do not merge with: an
    arena count in it stands beside the MALLOC_ARENA_MAX the reasons gave, and nothing said
    so."""
    tunables = {"name": "GLIBC_TUNABLES",
                "valueFrom": {"configMapKeyRef": {"name": "alloc", "key": "tunables"}}}
    plan = plan_pod_patch(_spec(allocator=allocator), _pod(env=[tunables]), CONTEXT)
    assert not plan.refused, plan.problems
    assert any(p.startswith("GLIBC_TUNABLES on the serving container comes from valueFrom, "
                            "which the operator cannot read") for p in plan.problems), \
        plan.problems
    plain = plan_pod_patch(_spec(allocator=allocator), _pod(env=[
        {"name": "GLIBC_TUNABLES", "value": "glibc.pthread.rseq=0"}]), CONTEXT)
    assert not any("valueFrom" in p for p in plain.problems), plain.problems
    if "arenaMax" in allocator:
        return
    # No MALLOC_ARENA_MAX set here: without a CPU limit (none is sized), or the container's
    # own kept. Nothing to take the place of, nothing said.
    for pod in (_pod(env=[tunables], resources={"limits": {"memory": "16Gi"}}),
                _pod(env=[tunables, {"name": "MALLOC_ARENA_MAX", "value": "2"}])):
        quiet = plan_pod_patch(_spec(allocator=allocator), pod, CONTEXT)
        assert not any("valueFrom" in p for p in quiet.problems), quiet.problems


def test_memory_high_intent_and_ownership_labels() -> None:
    spec = _spec(memory={"high": "30Gi"})
    tuned = _apply(spec, _pod())
    assert tuned["metadata"]["annotations"][keys.MEMORY_HIGH] == str(30 * 2**30)
    assert tuned["metadata"]["labels"][keys.TUNED_BY] == "qwen"
    assert tuned["metadata"]["labels"][keys.REVISION] == tuning_revision(spec)
    assert tuned["metadata"]["labels"]["app"] == "qwen"


def test_mutating_twice_wraps_once() -> None:
    spec = _spec()
    once = _apply(spec, _pod())
    again = plan_pod_patch(spec, copy.deepcopy(once), CONTEXT)
    assert again.patch == []
    # Even without the revision label (an older tuning), the command is not wrapped twice.
    del once["metadata"]["labels"][keys.REVISION]
    twice = _apply(spec, once)
    serving = twice["spec"]["containers"][0]
    assert serving["command"].count(LAUNCHER_PATH) == 1
    assert [c["name"] for c in twice["spec"]["initContainers"]].count(LAUNCHER_INIT) == 1


def _with(pod: dict[str, Any], **spec: Any) -> dict[str, Any]:
    pod["spec"].update(spec)
    return pod


@pytest.mark.parametrize(("pod", "says"), [
    (_with(_pod(), containers=[_pod()["spec"]["containers"][0],
                               {"name": "infertune-launcher", "image": "sidecar:1"}]),
     "the pod's container infertune-launcher has the name of the launcher's init container"),
    (_with(_pod(), initContainers=[{"name": "infertune-launcher", "image": "x:1",
                                    "command": ["sh", "-c", "true"]}]),
     "the pod's init container infertune-launcher has the name of the launcher's"),
    (_with(_pod(), volumes=[{"name": "infertune-launcher", "configMap": {"name": "c"}}]),
     "the pod's volume infertune-launcher has the name of the launcher's volume"),
    (_with(_pod(volumeMounts=[{"name": "models", "mountPath": "/infertune/"}]),
           volumes=[{"name": "models", "emptyDir": {}}]),
     "container vllm mounts volume models at /infertune, where the launcher goes"),
    # Inside the launcher's read-only volume the runtime cannot make the mount point: the
    # container failed at every start.
    (_with(_pod(volumeMounts=[{"name": "cache", "mountPath": "/infertune/cache"}]),
           volumes=[{"name": "cache", "emptyDir": {}}]),
     "container vllm mounts volume cache at /infertune/cache, inside /infertune"),
    (_with(_pod(volumeMounts=[{"name": "cache", "mountPath": "//infertune//x/"}]),
           volumes=[{"name": "cache", "emptyDir": {}}]),
     "container vllm mounts volume cache at //infertune//x/, inside /infertune"),
    # /infertune spelled otherwise: the API server compares paths as strings, and the runtime
    # mounted both there, the launcher's read-only volume hiding the container's data.
    *[(_with(_pod(volumeMounts=[{"name": "models", "mountPath": path}]),
             volumes=[{"name": "models", "emptyDir": {}}]),
       "container vllm mounts volume models at /infertune, where the launcher goes")
      for path in ("/infertune/.", "/./infertune", "//infertune", "/x/../infertune",
                   "infertune")],
])
def test_a_pod_whose_names_or_paths_the_launcher_needs_is_admitted_unchanged(
        pod: dict[str, Any], says: str) -> None:
    """Patched, it was a pod the API server refuses (a duplicate name, a mountPath twice),
    which failurePolicy: Ignore does not cover: the ReplicaSet could create no pod at all."""
    plan = plan_pod_patch(_spec(), pod, CONTEXT)
    assert plan.refused and plan.patch == [], plan
    assert plan.problems[0].startswith(says), plan.problems


def test_the_launchers_own_pieces_from_an_earlier_admission_are_no_clash() -> None:
    once = _apply(_spec(), _pod())
    del once["metadata"]["labels"][keys.REVISION]  # as a copy of a tuned pod would be
    again = plan_pod_patch(_spec(), once, CONTEXT)
    assert not again.refused, again.problems


def test_no_command_is_reported_not_guessed() -> None:
    pod = _pod()
    del pod["spec"]["containers"][0]["command"]
    plan = plan_pod_patch(_spec(), pod, CONTEXT)
    assert any("has no command" in p for p in plan.problems)
    tuned = jsonpatch.apply_patch(pod, plan.patch)
    assert "command" not in tuned["spec"]["containers"][0]
    assert "initContainers" not in tuned["spec"]
    assert "LD_PRELOAD" in _env(tuned["spec"]["containers"][0])  # the allocator still applies


def test_burstable_pod_is_reported_for_the_cpu_manager() -> None:
    pod = _pod(resources={"requests": {"cpu": "7.5", "memory": "16Gi"},
                          "limits": {"cpu": "7.5", "memory": "32Gi"}})
    problems = plan_pod_patch(_spec(), pod, CONTEXT).problems
    assert any("requests memory below its limit" in p for p in problems)
    assert any("whole numbers" in p for p in problems)


def test_guaranteed_pod_stays_guaranteed() -> None:
    plan = plan_pod_patch(_spec(), _pod(), CONTEXT)
    assert plan.problems == []
    init = jsonpatch.apply_patch(_pod(), plan.patch)["spec"]["initContainers"][0]
    assert init["resources"]["requests"] == init["resources"]["limits"]


def test_a_memory_high_the_pod_cannot_take_refuses_everything() -> None:
    plan = plan_pod_patch(_spec(memory={"high": "40Gi"}), _pod(), CONTEXT)
    assert plan.refused and plan.patch == []
    assert plan.problems[0].startswith("spec.memory.high: 40Gi is above the memory limit")


def test_ld_preload_from_value_from_refuses_everything() -> None:
    pod = _pod(env=[{"name": "LD_PRELOAD", "valueFrom": {"configMapKeyRef": {
        "name": "x", "key": "y"}}}])
    plan = plan_pod_patch(_spec(), pod, CONTEXT)
    assert plan.refused and plan.patch == []


def test_missing_container_refuses() -> None:
    plan = plan_pod_patch(_spec(container="server"), _pod(), CONTEXT)
    assert plan.refused and "containers: vllm" in plan.problems[0]


def test_dry_run_only_annotates() -> None:
    pod = _pod()
    plan = plan_pod_patch(_spec(mode="DryRun"), pod, CONTEXT)
    assert all(op["path"].startswith("/metadata/annotations") for op in plan.patch)
    tuned = jsonpatch.apply_patch(pod, plan.patch)
    described = json.loads(tuned["metadata"]["annotations"][keys.DRY_RUN_PLAN])
    assert any(op["path"] == "/spec/containers/0/command" for op in described["patch"])
    assert tuned["spec"] == pod["spec"]


def test_numa_none_needs_no_launcher() -> None:
    tuned = _apply(_spec(numa={"policy": "none"}), _pod())
    assert "initContainers" not in tuned["spec"]
    assert tuned["spec"]["containers"][0]["command"][0] == "vllm"


@pytest.mark.parametrize(("numa", "expected"), [
    ({"policy": "node", "node": 1}, "node:1"), ({"policy": "interleave"}, "interleave")])
def test_numa_policy_reaches_the_launcher(numa: dict[str, Any], expected: str) -> None:
    env = _env(_apply(_spec(numa=numa), _pod())["spec"]["containers"][0])
    assert env["INFERTUNE_NUMA_POLICY"] == expected


def test_revision_changes_with_tuning_not_with_scaling() -> None:
    base = tuning_revision(_spec())
    assert tuning_revision(_spec(autoscaling={"maxReplicas": 20})) == base
    assert tuning_revision(_spec(memory={"high": "20Gi"})) != base
    assert tuning_revision(_spec(numa={"policy": "interleave"})) != base


def test_the_shape_is_the_revision_without_memory() -> None:
    """What only a new pod can take: a pod of another spec.memory is not re-created for it."""
    base = shape_revision(_spec())
    assert shape_revision(_spec(memory={"high": "20Gi"})) == base
    assert shape_revision(_spec(numa={"policy": "interleave"})) != base
    assert shape_revision(_spec(allocator={"type": "glibc"})) != base
    assert shape_revision(_spec(mode="DryRun")) != base
    assert shape_revision(_spec(container="engine")) != base
    auto = _spec(batching={"mode": "Auto", "knob": "max-num-seqs", "min": 8, "max": 128})
    assert shape_revision(auto, 64) != shape_revision(auto, 96)
    assert shape_revision(_spec(mig={"profile": "3g.71gb"}), None, ("3g.71gb", "mixed")) != \
        shape_revision(_spec(mig={"profile": "3g.71gb"}), None, (None, "mixed"))


def test_a_tuned_pod_says_its_shape_and_its_serving_container() -> None:
    """Re-tuning reads the pod as stored, where a webhook after this one (a service mesh's)
    may have put its proxy first."""
    spec = _spec(memory={"high": "20Gi"})
    tuned = _apply(spec, _pod())
    assert tuned["metadata"]["labels"][keys.SHAPE] == shape_revision(spec)
    assert tuned["metadata"]["annotations"][keys.SERVING_CONTAINER] == "vllm"
    dry = _apply(_spec(mode="DryRun"), _pod())
    assert keys.SHAPE not in (dry["metadata"].get("labels") or {})
    assert keys.SERVING_CONTAINER not in dry["metadata"]["annotations"]


def test_label_keys_are_escaped_in_pointers() -> None:
    plan = plan_pod_patch(_spec(), _pod(), CONTEXT)
    assert any(op["path"] == "/metadata/labels/infertune.io~1revision" for op in plan.patch)


def _gpu_pod() -> dict[str, Any]:
    return _pod(resources={"requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
                           "limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}})


def test_mixed_strategy_requests_the_mig_slice_by_name() -> None:
    context = PodContext("qwen", "img", mig_profile="2g.35gb", mig_strategy="mixed")
    spec = _spec(mig={"profile": "2g.35gb"})
    plan = plan_pod_patch(spec, _gpu_pod(), context)
    resources = jsonpatch.apply_patch(_gpu_pod(), plan.patch)["spec"]["containers"][0][
        "resources"]
    for section in ("limits", "requests"):
        assert resources[section]["nvidia.com/mig-2g.35gb"] == "1"
        assert "nvidia.com/gpu" not in resources[section]
    assert "mig: nvidia.com/gpu replaced by nvidia.com/mig-2g.35gb (mixed strategy)" in (
        plan.reasons)
    # A pod that asks for the slice already: nothing is replaced, and the reason says so.
    sliced = _gpu_pod()
    for section in ("limits", "requests"):
        sliced["spec"]["containers"][0]["resources"][section] = {
            "nvidia.com/mig-2g.35gb": "1"}
    again = plan_pod_patch(spec, sliced, context)
    assert "mig: the container already requests nvidia.com/mig-2g.35gb (mixed strategy)" in (
        again.reasons)
    assert not [op for op in again.patch if "resources" in op["path"]], again.patch


def test_a_media_extensions_slice_is_requested_as_the_device_plugin_names_it() -> None:
    """`+` is not allowed in a resource name (the API server refused every pod): the device
    plugin advertises 1g.18gb+me as nvidia.com/mig-1g.18gb.me."""
    context = PodContext("qwen", "img", mig_profile="1g.18gb+me", mig_strategy="mixed")
    plan = plan_pod_patch(_spec(mig={"profile": "1g.18gb+me"}), _gpu_pod(), context)
    limits = jsonpatch.apply_patch(_gpu_pod(), plan.patch)["spec"]["containers"][0][
        "resources"]["limits"]
    (name,) = (k for k in limits if k.startswith("nvidia.com/mig-"))
    assert name == "nvidia.com/mig-1g.18gb.me"
    # apimachinery's qualified name: the part after the prefix
    assert re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", name.split("/", 1)[1])


def test_several_mig_slices_for_one_pod_are_reported() -> None:
    context = PodContext("qwen", "img", mig_profile="2g.35gb", mig_strategy="mixed")
    pod = _pod(resources={"limits": {"nvidia.com/gpu": "2"}})
    plan = plan_pod_patch(_spec(mig={"profile": "2g.35gb"}), pod, context)
    assert any("uses only one MIG device" in p for p in plan.problems), plan.problems
    assert not plan.refused
    single = plan_pod_patch(_spec(mig={"profile": "2g.35gb"}), _gpu_pod(), context)
    assert not any("MIG device" in p for p in single.problems)


def test_single_strategy_keeps_nvidia_gpu() -> None:
    context = PodContext("qwen", "img", mig_profile="2g.35gb", mig_strategy="single")
    plan = plan_pod_patch(_spec(mig={"profile": "2g.35gb"}), _gpu_pod(), context)
    tuned = jsonpatch.apply_patch(_gpu_pod(), plan.patch)
    assert tuned["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_unplanned_mig_layout_is_reported_and_the_gpu_request_kept() -> None:
    plan = plan_pod_patch(_spec(mig={"profile": "2g.35gb"}), _gpu_pod(), CONTEXT)
    assert any("not planned yet" in p for p in plan.problems)
    tuned = jsonpatch.apply_patch(_gpu_pod(), plan.patch)
    assert tuned["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


AUTO_BATCHING = {"mode": "Auto", "knob": "max-num-seqs", "min": 8, "max": 128}


def test_batching_auto_edits_a_command_that_is_wrapped_already() -> None:
    """A pod created from a template that already holds the wrapped command (or mutated
    twice): the new value must reach the command, not only the reasons."""
    pod = _pod(command=[LAUNCHER_PATH, "--", "vllm", "serve", "m", "--max-num-seqs", "64"])
    plan = plan_pod_patch(_spec(batching=AUTO_BATCHING), pod,
                          PodContext("qwen", "img", batching_value=96))
    tuned = jsonpatch.apply_patch(pod, plan.patch)
    assert tuned["spec"]["containers"][0]["command"] == [
        LAUNCHER_PATH, "--", "vllm", "serve", "m", "--max-num-seqs", "96"]


@pytest.mark.parametrize("container", [
    {"command": ["sh", "-c"], "args": ["exec vllm serve m --max-num-seqs 64"]},
    {"command": ["/bin/bash", "-c", "vllm serve m"]},
    {"command": None, "args": None},
])
def test_batching_auto_reports_what_it_cannot_edit_instead_of_appending(
        container: dict[str, Any]) -> None:
    """A flag after `sh -c SCRIPT` is the script's $0, and args on a container without any
    replace the image's CMD: both were appended and reported as applied."""
    pod = _pod(**container)
    plan = plan_pod_patch(_spec(batching=AUTO_BATCHING, numa={"policy": "none"}), pod,
                          PodContext("qwen", "img", batching_value=96))
    assert not any(r.startswith("batching:") for r in plan.reasons), plan.reasons
    assert any("max-num-seqs" in p for p in plan.problems), plan.problems
    tuned = jsonpatch.apply_patch(pod, plan.patch)["spec"]["containers"][0]
    assert (tuned.get("command"), tuned.get("args")) == (
        pod["spec"]["containers"][0].get("command"), pod["spec"]["containers"][0].get("args"))


def test_a_pod_admitted_before_the_layout_was_planned_is_outdated_once_it_is() -> None:
    """It keeps its whole GPU; the revision it was labelled with must not match the one the
    planned layout gives, or re-tuning never moves it onto its slice."""
    spec = _spec(mig={"sizing": {"weights": "15Gi", "kvCache": "10Gi"}})
    early = jsonpatch.apply_patch(_gpu_pod(), plan_pod_patch(spec, _gpu_pod(), CONTEXT).patch)
    planned = PodContext("qwen", "img", mig_profile="2g.35gb", mig_strategy="mixed")
    again = plan_pod_patch(spec, early, planned)
    assert again.revision != early["metadata"]["labels"][keys.REVISION]
    assert not any(r.startswith("already tuned") for r in again.reasons)
    retuned = jsonpatch.apply_patch(_gpu_pod(), plan_pod_patch(spec, _gpu_pod(), planned).patch)
    assert retuned["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "8", "memory": "32Gi", "nvidia.com/mig-2g.35gb": "1"}
    # What re-tuning computes from status.mig is what the webhook labels pods with.
    assert tuning_revision(spec, None, planned_mig({"profile": "2g.35gb"})) == again.revision


def test_batching_auto_rewrites_the_knob_inside_the_wrapped_command() -> None:
    spec = _spec(batching={"mode": "Auto", "knob": "max-num-seqs", "min": 8, "max": 128})
    pod = _pod(command=["vllm", "serve", "m", "--max-num-seqs", "64"])
    context = PodContext("qwen", "img", batching_value=96)
    tuned = jsonpatch.apply_patch(pod, plan_pod_patch(spec, pod, context).patch)
    assert tuned["spec"]["containers"][0]["command"] == [
        LAUNCHER_PATH, "--", "vllm", "serve", "m", "--max-num-seqs", "96"]


@pytest.mark.parametrize("binder", [["numactl", "--interleave=all"], ["taskset", "-c", "0-7"]])
def test_batching_auto_edits_a_command_that_binds_itself(binder: list[str]) -> None:
    """No launcher wraps a command that binds itself, and the edit was held back for one:
    the pods kept --max-num-seqs 64 under a revision (and a reason) that said 96, and Auto
    re-created them at every step for nothing, walking the knob down to its min."""
    spec = _spec(batching={"mode": "Auto", "knob": "max-num-seqs", "min": 8, "max": 128})
    pod = _pod(command=[*binder, "vllm", "serve", "m", "--max-num-seqs", "64"])
    plan = plan_pod_patch(spec, pod, PodContext("qwen", "img", batching_value=96))
    tuned = jsonpatch.apply_patch(pod, plan.patch)
    assert tuned["spec"]["containers"][0]["command"] == [
        *binder, "vllm", "serve", "m", "--max-num-seqs", "96"]


def test_batching_auto_adds_the_flag_within_bounds() -> None:
    spec = _spec(batching={"mode": "Auto", "min": 8, "max": 128})
    context = PodContext("qwen", "img", batching_value=500)
    tuned = jsonpatch.apply_patch(_pod(), plan_pod_patch(spec, _pod(), context).patch)
    assert tuned["spec"]["containers"][0]["args"][-1] == "--max-num-seqs=128"


def test_a_new_applied_batch_size_is_a_new_revision() -> None:
    spec = _spec(batching={"mode": "Auto"})
    assert tuning_revision(spec, 64) != tuning_revision(spec, 96)
    assert tuning_revision(_spec(), 64) == tuning_revision(_spec())  # Off: ignored


def test_a_long_tuning_name_becomes_a_valid_label_value() -> None:
    """A tuning may be named with 253 characters, a label value holds 63: the API server would
    refuse every pod the webhook labelled with the whole name."""
    name = "a" * 100
    plan = plan_pod_patch(_spec(), _pod(), PodContext(name, "img"))
    tuned = jsonpatch.apply_patch(_pod(), plan.patch)
    value = tuned["metadata"]["labels"][keys.TUNED_BY]
    assert len(value) <= 63 and value.startswith("a" * 50) and value[-1].isalnum()
    other = plan_pod_patch(_spec(), _pod(), PodContext("a" * 99 + "b", "img")).patch
    other_value = jsonpatch.apply_patch(_pod(), other)["metadata"]["labels"][keys.TUNED_BY]
    assert other_value != value  # a hash of the whole name, not only its prefix
    short = jsonpatch.apply_patch(_pod(), plan_pod_patch(_spec(), _pod(), CONTEXT).patch)
    assert short["metadata"]["labels"][keys.TUNED_BY] == "qwen"


@pytest.mark.parametrize(("containers", "container", "unprobed"), [
    ([{"name": "vllm"}], None, "vllm"),
    ([{"name": "vllm", "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}}}],
     None, None),
    ([{"name": "vllm", "startupProbe": {"httpGet": {"path": "/health", "port": 8000}}}],
     None, None),  # the kubelet reports no container Ready before its startup probe passes
    # The serving container's probes count, not a sidecar's.
    ([{"name": "proxy", "readinessProbe": {"tcpSocket": {"port": 80}}}, {"name": "vllm"}],
     "vllm", "vllm"),
    ([{"name": "proxy"}, {"name": "vllm", "readinessProbe": {"exec": {"command": ["true"]}}}],
     "vllm", None),
    ([{"name": "proxy"}], "vllm", None),  # not in the template: template_batching says so
])
def test_unprobed_container_is_the_serving_one_without_readiness_or_startup_probe(
        containers: list[dict[str, Any]], container: str | None, unprobed: str | None) -> None:
    fields: dict[str, Any] = {"targetRef": {"name": "llm"}, "engine": "vllm"}
    if container is not None:
        fields["container"] = container
    spec = InferenceTuningSpec.model_validate(fields)
    assert unprobed_container(spec, {"containers": containers}) == unprobed


RUNTIME_DEFAULT = {"seccompProfile": {"type": "RuntimeDefault"}}


@pytest.mark.parametrize(("container", "pod_context", "reported"), [
    ({"securityContext": RUNTIME_DEFAULT}, None, True),
    ({}, RUNTIME_DEFAULT, True),  # the pod's profile, the container setting none
    ({"securityContext": {**RUNTIME_DEFAULT, "capabilities": {"add": ["SYS_NICE"]}}}, None,
     False),
    ({"securityContext": {**RUNTIME_DEFAULT, "capabilities": {"add": ["CAP_SYS_NICE"]}}}, None,
     False),
    ({"securityContext": {**RUNTIME_DEFAULT, "capabilities": {"add": ["ALL"]}}}, None, False),
    ({"securityContext": {**RUNTIME_DEFAULT, "privileged": True}}, None, False),
    ({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}, RUNTIME_DEFAULT, False),
    ({}, None, False),
])
def test_a_seccomp_profile_that_refuses_memory_binding_is_reported(
        container: dict[str, Any], pod_context: dict[str, Any] | None, reported: bool) -> None:
    pod = _pod(**container)
    if pod_context is not None:
        pod["spec"]["securityContext"] = pod_context
    plan = plan_pod_patch(_spec(), pod, CONTEXT)
    assert not plan.refused
    says = [p for p in plan.problems if "without CAP_SYS_NICE" in p]
    assert bool(says) is reported, plan.problems
    if reported:
        assert "gets its NUMA node's CPUs only" in says[0]


def test_strict_numa_under_a_profile_that_refuses_memory_binding_refuses_the_patch() -> None:
    """The launcher would stop the container at every start (exit 78): the pod is admitted
    unchanged instead, and the reason says what to change."""
    plan = plan_pod_patch(_spec(numa={"policy": "gpu-local", "strict": True}),
                          _pod(securityContext=RUNTIME_DEFAULT), CONTEXT)
    assert plan.refused and plan.patch == []
    assert "numa.strict would stop the container (exit 78)" in plan.problems[0]
    assert "add SYS_NICE" in plan.problems[0]


def test_a_mig_profile_the_plan_has_not_followed_leaves_the_revision() -> None:
    """A new spec.mig.profile that cannot be planned keeps the last plan (status.mig), and
    the pods would come back the same: the revision stays, so none is replaced for nothing.
    Once the plan follows the spec, the pods are outdated."""
    planned = ("3g.71gb", "mixed")
    before = tuning_revision(_spec(mig={"profile": "3g.71gb"}), None, planned)
    assert tuning_revision(_spec(mig={"profile": "2g.35gb"}), None, planned) == before
    assert tuning_revision(_spec(mig={"profile": "2g.35gb"}), None,
                           ("2g.35gb", "mixed")) != before
    # Not planned yet: the spec's profile counts, as it always did.
    assert tuning_revision(_spec(mig={"profile": "3g.71gb"}), None, (None, "mixed")) != \
        tuning_revision(_spec(mig={"profile": "2g.35gb"}), None, (None, "mixed"))


@pytest.mark.parametrize(("mig", "planned", "revision"), [
    ({"sizing": {"weights": "15Gi", "kvCache": "10Gi"}}, ("2g.35gb", "mixed"), "6bc0f6b1a5"),
    ({"profile": "3g.71gb"}, ("3g.71gb", "mixed"), "f7998d699c"),
    ({"profile": "3g.71gb"}, (None, "mixed"), "45ae281cae"),
    (None, (None, "mixed"), "5ac25ad323"),
])
def test_the_revision_of_running_pods_survives_an_operator_upgrade(
        mig: dict[str, Any] | None, planned: tuple[str | None, str], revision: str) -> None:
    """What the release before computed for these specs: a new hash makes every running pod
    outdated, and re-tuning re-creates each one (reloading its model) for nothing."""
    spec = _spec(**({} if mig is None else {"mig": mig}))
    assert tuning_revision(spec, None, planned) == revision


@pytest.mark.parametrize(("own", "numa", "refused", "says"), [
    # Pinned to a node's CPUs by the launcher, with no CPU limit to size narenas from:
    # jemalloc cannot count the CPUs, and under abort_conf aborts every process, on a node
    # with several NUMA nodes (most GPU nodes): reported only, it was a crash loop there.
    ("abort_conf:true,percpu_arena:percpu", "gpu-local", True,
     "makes jemalloc abort (abort_conf or abort) in a process pinned to some of the node's "
     "CPUs, as the NUMA binding pins it"),
    # Without abort_conf it only warns there (per-CPU arenas off): reported.
    ("percpu_arena:percpu", "gpu-local", False,
     "in a process pinned to some of the node's CPUs (NUMA binding, static CPU manager): "
     "percpu_arena on a process pinned"),
    ("abort_conf:true,percpu_arena:percpu", "none", False, None),  # not pinned
    ("abort_conf:true,narenas:5000", "gpu-local", False, "cuts it to 4094"),  # no abort
    # Aborts anywhere: untuned, naming what it aborts on (not the experimental_ key).
    ("abort_conf:true,experimental_x:1,lg_chunk:21", "gpu-local", True,
     "(abort_conf or abort), on lg_chunk: lg_chunk was removed"),
])
def test_a_malloc_conf_that_would_abort_in_the_tuned_process_leaves_the_pod_untuned(
        own: str, numa: str, refused: bool, says: str | None) -> None:
    pod = _pod(resources={"requests": {"memory": "32Gi"}, "limits": {"memory": "32Gi"}},
               env=[{"name": "MALLOC_CONF", "value": own}])
    plan = plan_pod_patch(_spec(numa={"policy": numa}), pod, CONTEXT)
    assert plan.refused is refused, plan.problems
    said = [p for p in plan.problems if "MALLOC_CONF" in p]
    assert (says is None and not said) or any(str(says) in p for p in said), plan.problems


def test_a_container_malloc_conf_of_commas_only_is_no_setting() -> None:
    """jemalloc ignores a string that starts with a comma: "," followed by the spec's made
    the spec's settings apply to nothing."""
    pod = _pod(env=[{"name": "MALLOC_CONF", "value": ","}])
    conf = _env(_apply(_spec(allocator={"mallocConf": "background_thread:true"}), pod)[
        "spec"]["containers"][0])["MALLOC_CONF"]
    assert conf == "background_thread:true,narenas:8"



def test_the_last_entry_of_a_duplicated_variable_is_the_one_merged_and_checked() -> None:
    """The container gets the last entry of a name: the first was merged and replaced, and
    the second, which jemalloc aborted on, stayed after it."""
    pod = _pod(env=[{"name": "MALLOC_CONF", "value": "background_thread:true"},
                    {"name": "MALLOC_CONF", "value": "abort_conf:true,lg_chunk:21"}])
    plan = plan_pod_patch(_spec(), pod, CONTEXT)
    assert plan.refused and "on lg_chunk" in plan.problems[0]
    fine = _pod(env=[{"name": "MALLOC_CONF", "value": "abort_conf:true,lg_chunk:21"},
                     {"name": "MALLOC_CONF", "value": "background_thread:true"}])
    env = jsonpatch.apply_patch(fine, plan_pod_patch(_spec(), fine, CONTEXT).patch)[
        "spec"]["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == "MALLOC_CONF"] == [
        "abort_conf:true,lg_chunk:21", "background_thread:true,narenas:8"]


def test_variable_references_are_checked_as_the_kubelet_expands_them() -> None:
    """`$(NARENAS)` is a number once the kubelet expands it: checked literally, the pod was
    left untuned for a conf jemalloc runs. The reference stays in the value, for the
    kubelet."""
    pod = _pod(env=[{"name": "NARENAS", "value": "4"},
                    {"name": "MALLOC_CONF", "value": "abort_conf:true,narenas:$(NARENAS)"}])
    plan = plan_pod_patch(_spec(), pod, CONTEXT)
    assert not plan.refused and not [p for p in plan.problems if "MALLOC_CONF" in p]
    env = _env(jsonpatch.apply_patch(pod, plan.patch)["spec"]["containers"][0])
    assert env["MALLOC_CONF"] == "abort_conf:true,narenas:$(NARENAS)"
    # One to a variable whose value is not known here is said so, not refused.
    hidden = _pod(env=[{"name": "NARENAS", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
                       {"name": "MALLOC_CONF", "value": "abort_conf:true,narenas:$(NARENAS)"}])
    plan = plan_pod_patch(_spec(), hidden, CONTEXT)
    assert not plan.refused
    assert any("is not checked" in p for p in plan.problems), plan.problems
    # $$ escapes a dollar: $$(NARENAS) is the literal text, which jemalloc refuses.
    literal = _pod(env=[{"name": "NARENAS", "value": "4"},
                        {"name": "MALLOC_CONF", "value": "abort_conf:true,narenas:$$(NARENAS)"}])
    assert plan_pod_patch(_spec(), literal, CONTEXT).refused


def test_a_container_malloc_conf_longer_than_the_operator_reads_is_refused_unread() -> None:
    """Checking a MALLOC_CONF is not linear in its length, and runs in the webhook on the
    operator's event loop: 90 kB of unknown keys held it 8 s (every pod created meanwhile
    admitted untuned). Past MAX_CONTAINER_MALLOC_CONF (after $(VAR) expansion) it is not
    read, and the pod is left untuned with the reason."""
    from infertune.tuning.pod_patch import MAX_CONTAINER_MALLOC_CONF

    keys = ",".join(f"xq{i}:1" for i in range(20000))
    plan = plan_pod_patch(_spec(), _pod(env=[{"name": "MALLOC_CONF", "value": keys}]), CONTEXT)
    assert plan.refused and plan.patch == []
    assert any("is longer than the 4096 characters the operator reads" in p
               and "shorten it" in p for p in plan.problems), plan.problems
    # Long only once the kubelet expands it.
    chunk = "a" * 3000
    expanded = _pod(env=[{"name": "A", "value": chunk},
                         {"name": "MALLOC_CONF", "value": "$(A)$(A)"}])
    assert plan_pod_patch(_spec(), expanded, CONTEXT).refused
    # Each variable twice the one before it: 1.3 kB of env expanded to half a gigabyte
    # before the length was looked at. It is cut as it grows (20 entries: 32 MiB uncut).
    from infertune.tuning.pod_patch import _EnvPlan

    chain = [{"name": "V0", "value": "x" * 64}] + [
        {"name": f"V{i}", "value": f"$(V{i - 1})$(V{i - 1})"} for i in range(1, 20)]
    env = [*chain, {"name": "MALLOC_CONF", "value": "$(V19)"}]
    text, known = _EnvPlan("/spec/containers/0", env).expanded("MALLOC_CONF")
    assert known and len(text) == MAX_CONTAINER_MALLOC_CONF + 1
    assert plan_pod_patch(_spec(), _pod(env=env), CONTEXT).refused
    # At the limit it is read (and its unknown keys reported, five of them).
    pairs = "xq:1," * (MAX_CONTAINER_MALLOC_CONF // 5 - 1)
    at_limit = pairs + "xq:" + "1" * (MAX_CONTAINER_MALLOC_CONF - len(pairs) - 3)
    assert len(at_limit) == MAX_CONTAINER_MALLOC_CONF
    read = plan_pod_patch(_spec(), _pod(env=[{"name": "MALLOC_CONF", "value": at_limit}]),
                          CONTEXT)
    assert any("xq is not a jemalloc 5.3 option" in p for p in read.problems), read.problems


def test_per_cpu_arenas_under_the_static_cpu_manager_are_reported_without_numa_binding(
) -> None:
    """A Guaranteed pod with whole CPUs runs on CPUs of its own: pinned as by numactl."""
    pod = _pod(env=[{"name": "MALLOC_CONF", "value": "percpu_arena:percpu,narenas:default"}])
    plan = plan_pod_patch(_spec(numa={"policy": "none"}), pod, CONTEXT)
    assert any("percpu_arena on a process pinned" in p for p in plan.problems), plan.problems
    shared = plan_pod_patch(_spec(numa={"policy": "none"}), pod,
                            PodContext("qwen", "img", static_cpu_manager=False))
    assert not any("percpu_arena" in p for p in shared.problems), shared.problems


@pytest.mark.parametrize(("cpu", "numa", "refused", "says"), [
    # The static CPU manager's 7 CPUs alone: jemalloc sees 7, an odd count, and with abort
    # aborts every process (it was admitted without a word, a crash loop).
    ("7", "none", True, "percpu_arena:phycpu on 7 CPUs"),
    ("8", "none", False, None),  # an even count: nothing to say
    # The launcher binds it to a NUMA node's share of them: a count not known here.
    ("8", "gpu-local", True, "which is not known before the pod runs"),
    ("7.5", "none", False, None),  # shared CPUs: not pinned, the node's count
])
def test_physical_cpu_arenas_are_checked_on_the_cpus_a_pinned_process_gets(
        cpu: str, numa: str, refused: bool, says: str | None) -> None:
    resources = {"requests": {"cpu": cpu, "memory": "32Gi"},
                 "limits": {"cpu": cpu, "memory": "32Gi", "nvidia.com/gpu": "1"}}
    pod = _pod(resources=resources,
               env=[{"name": "MALLOC_CONF", "value": "abort:true,percpu_arena:phycpu"}])
    plan = plan_pod_patch(_spec(numa={"policy": numa}), pod, CONTEXT)
    assert plan.refused is refused, plan.problems
    phycpu = [p for p in plan.problems if "phycpu" in p]
    assert (says is None and not phycpu) or any(str(says) in p for p in phycpu), plan.problems


def test_a_reference_through_a_variable_not_known_here_is_not_known_either() -> None:
    """N refers to CPUS, which comes from valueFrom: the kubelet gives N a number, so
    MALLOC_CONF's $(N) is not known here either (it was checked as the text $(CPUS))."""
    pod = _pod(env=[{"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                    {"name": "N", "value": "$(CPUS)"},
                    {"name": "MALLOC_CONF", "value": "abort_conf:true,narenas:$(N)"}])
    plan = plan_pod_patch(_spec(), pod, CONTEXT)
    assert not plan.refused
    assert any("is not checked, and no narenas is added" in p for p in plan.problems)


def test_narenas_is_added_when_the_expanded_conf_leaves_it_unset() -> None:
    """$(BASE) holds the settings: narenas is decided on what jemalloc reads, and added to
    the value set; a narenas a reference sets is kept."""
    unset = _pod(env=[{"name": "BASE", "value": "abort_conf:true,percpu_arena:percpu"},
                      {"name": "MALLOC_CONF", "value": "$(BASE)"}])
    env = _env(_apply(_spec(), unset)["spec"]["containers"][0])
    assert env["MALLOC_CONF"] == "$(BASE),narenas:8"
    chosen = _pod(env=[{"name": "REST", "value": "true,narenas:2"},
                       {"name": "MALLOC_CONF", "value": "background_thread:$(REST)"}])
    env = _env(_apply(_spec(), chosen)["spec"]["containers"][0])
    assert env["MALLOC_CONF"] == "background_thread:$(REST)"


def test_a_variable_with_an_empty_value_is_known_and_empty() -> None:
    """The API server leaves out an empty value: {"name": "EXTRA"} is "", not valueFrom."""
    pod = _pod(env=[{"name": "EXTRA"},
                    {"name": "MALLOC_CONF", "value": "abort_conf:true,lg_chunk:21$(EXTRA)"}])
    plan = plan_pod_patch(_spec(), pod, CONTEXT)
    assert plan.refused and "on lg_chunk" in plan.problems[0]
    empty = plan_pod_patch(_spec(), _pod(env=[{"name": "MALLOC_CONF"}]), CONTEXT)
    assert not empty.refused, empty.problems


JEMALLOC = str(next(iter(sorted(Path("/usr/lib").glob("*/libjemalloc.so.2"))),
                   "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"))
"""The Debian package's library, on this machine's architecture."""


@pytest.mark.parametrize(("spec_conf", "value"), [
    ("dirty_decay_ms:5000", "background_thread:true,$(EXTRA)dirty_decay_ms:5000,narenas:8"),
    (None, "background_thread:true,$(EXTRA)narenas:8"),
])
def test_a_reference_that_expands_to_nothing_at_the_end_gets_no_second_comma(
        spec_conf: str | None, value: str) -> None:
    """An optional $(EXTRA) left empty: the spec's settings and narenas followed a comma of
    their own, so jemalloc read "...true,,dirty..." as malformed and dropped them, and the
    string checked (a reconstruction) was a valid one."""
    pod = _pod(env=[{"name": "EXTRA"},
                    {"name": "MALLOC_CONF", "value": "background_thread:true,$(EXTRA)"}])
    plan = plan_pod_patch(_spec(allocator={"mallocConf": spec_conf}), pod, CONTEXT)
    env = _env(jsonpatch.apply_patch(pod, plan.patch)["spec"]["containers"][0])
    assert env["MALLOC_CONF"] == value
    assert not [p for p in plan.problems if "MALLOC_CONF" in p], plan.problems
    if not Path(JEMALLOC).exists():
        pytest.skip(f"{JEMALLOC} is absent (apt-get install libjemalloc2)")
    expanded = value.replace("$(EXTRA)", "")  # what the real library makes of it
    done = subprocess.run(["/bin/true"], capture_output=True, text=True, check=True, env={
        "PATH": "/usr/bin:/bin", "LD_PRELOAD": JEMALLOC, "MALLOC_CONF": expanded})
    assert "Malformed" not in done.stderr and "Invalid" not in done.stderr, done.stderr


def test_a_reference_that_leaves_two_commas_is_reported_as_the_process_reads_it() -> None:
    pod = _pod(env=[{"name": "A", "value": ""}, {"name": "B", "value": ""},
                    {"name": "MALLOC_CONF", "value": "background_thread:true,$(A),$(B)"}])
    plan = plan_pod_patch(_spec(allocator={"mallocConf": "dirty_decay_ms:5000"}), pod, CONTEXT)
    assert any("MALLOC_CONF 'background_thread:true,,dirty_decay_ms:5000" in p
               for p in plan.problems), plan.problems


def test_narenas_ratio_gets_no_narenas_that_would_override_it() -> None:
    """jemalloc takes an explicit narenas over narenas_ratio: the ratio the spec asked for
    was cancelled by the narenas sized from the CPU limit, without a word."""
    env = _env(_apply(_spec(allocator={"mallocConf": "narenas_ratio:2"}), _pod())[
        "spec"]["containers"][0])
    assert env["MALLOC_CONF"] == "narenas_ratio:2"


def test_no_malloc_conf_is_set_when_there_is_nothing_to_set() -> None:
    """No settings and no CPU limit to size narenas from: an empty MALLOC_CONF overrode the
    one from envFrom (or the image's ENV) unseen."""
    pod = _pod(resources={"limits": {"memory": "32Gi"}}, envFrom=[{"configMapRef": {"name": "je"}}])
    plan = plan_pod_patch(_spec(), pod, CONTEXT)
    env = _env(jsonpatch.apply_patch(pod, plan.patch)["spec"]["containers"][0])
    assert "MALLOC_CONF" not in env and env["LD_PRELOAD"] == JEMALLOC
    assert any("MALLOC_CONF not set" in r for r in plan.reasons), plan.reasons


def test_a_jemalloc_the_container_preloads_already_is_not_preloaded_twice() -> None:
    """Two copies are two allocators in one process, each with its arenas and threads."""
    own = "/usr/local/lib/libjemalloc.so.2"
    pod = _pod(env=[{"name": "LD_PRELOAD", "value": own}])
    plan = plan_pod_patch(_spec(), pod, CONTEXT)
    assert _env(jsonpatch.apply_patch(pod, plan.patch)["spec"]["containers"][0])[
        "LD_PRELOAD"] == own
    assert any(f"allocator: preload {own} " in r for r in plan.reasons), plan.reasons
    # Behind another allocator it served nothing: it goes first.
    behind = _pod(env=[{"name": "LD_PRELOAD", "value": f"/usr/lib/libtcmalloc.so.4:{own}"}])
    assert _env(jsonpatch.apply_patch(behind, plan_pod_patch(_spec(), behind, CONTEXT).patch)[
        "spec"]["containers"][0])["LD_PRELOAD"] == f"{own}:/usr/lib/libtcmalloc.so.4"
    tcmalloc = _pod(env=[{"name": "LD_PRELOAD", "value": "/usr/lib/libtcmalloc_minimal.so.4"}])
    problems = plan_pod_patch(_spec(), tcmalloc, CONTEXT).problems
    assert any("also preloads /usr/lib/libtcmalloc_minimal.so.4, another allocator" in p
               for p in problems), problems


NO_GPU = {"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"cpu": "8", "memory": "32Gi"}}


def test_gpu_local_on_a_container_given_no_gpu_is_reported() -> None:
    """The launcher finds no GPU to take the node from: it runs unbound, or with strict
    exits 78 at every start. Reported, not refused: a GPU may come another way the webhook
    cannot see (a runtime default), and the pod keeps its other settings."""
    strict = plan_pod_patch(_spec(numa={"policy": "gpu-local", "strict": True}),
                            _pod(resources=NO_GPU), CONTEXT)
    assert not strict.refused and strict.patch
    assert any("spec.numa.policy gpu-local takes the NUMA node of the GPUs of container "
               "vllm, which requests none: numa.strict stops it (exit 78) at every start" in p
               for p in strict.problems), strict.problems
    loose = plan_pod_patch(_spec(), _pod(resources=NO_GPU), CONTEXT)
    assert not loose.refused
    assert any("which requests none: it runs unbound" in p for p in loose.problems)


@pytest.mark.parametrize("given", [
    {"resources": {"limits": {"nvidia.com/mig-3g.71gb": "1"}}},
    {"resources": {**NO_GPU, "claims": [{"name": "gpu"}]}},
    {"resources": NO_GPU, "securityContext": {"privileged": True}},
    {"resources": NO_GPU, "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]},
    {"resources": NO_GPU, "envFrom": [{"configMapRef": {"name": "gpus"}}]},
    {"resources": {"limits": {"aliyun.com/gpu-mem": "16"}}},  # another vendor's GPU share
])
def test_a_gpu_given_another_way_is_not_called_missing(given: dict[str, Any]) -> None:
    plan = plan_pod_patch(_spec(numa={"policy": "gpu-local", "strict": True}), _pod(**given),
                          CONTEXT)
    assert not plan.refused and not [p for p in plan.problems if "requests none" in p]


@pytest.mark.parametrize(("conf", "says"), [
    ("tcache_max:65536", "sets tcache_max, new in jemalloc 5.3: the 5.2 of Ubuntu 22.04 and "
                         "Debian 11 (the base of many CUDA images) ignores them;"),
    ("abort_conf:true,narenas_ratio:2,hpa:true", "sets narenas_ratio, hpa, new in jemalloc 5.3"
     ": the 5.2 of Ubuntu 22.04 and Debian 11 (the base of many CUDA images) ignores them, "
     "and with abort_conf:true aborts every process of the container on them"),
    ("abort_conf:false,tcache_max:1", "ignores them;"),
])
def test_options_new_in_jemalloc_5_3_are_reported(conf: str, says: str) -> None:
    """Called valid "for jemalloc 5.x": Ubuntu 22.04's libjemalloc2 (5.2.1) ignores them,
    and with abort_conf:true every process of the container aborts on them."""
    plan = plan_pod_patch(_spec(allocator={"mallocConf": conf}), _pod(), CONTEXT)
    assert not plan.refused
    assert any(says in p for p in plan.problems), plan.problems
    assert not [p for p in plan_pod_patch(_spec(allocator={"mallocConf": "narenas:4"}), _pod(),
                                          CONTEXT).problems if "5.3" in p]


def test_a_privileged_container_tells_the_launcher_its_device_nodes_are_not_its_gpus() -> None:
    """It sees every GPU's /dev/nvidia<N>: under CDI the launcher took them for its own and
    bound it to the node holding most of the machine's GPUs."""
    privileged = _env(_apply(_spec(), _pod(securityContext={"privileged": True}))[
        "spec"]["containers"][0])
    assert privileged["INFERTUNE_DEVICE_NODES"] == "ignore"
    assert "INFERTUNE_DEVICE_NODES" not in _env(_apply(_spec(), _pod())["spec"]["containers"][0])


def test_complaints_about_a_long_malloc_conf_stay_short() -> None:
    """Each of 200 complaints quoted the whole 3.5 KB MALLOC_CONF: the dry-run plan annotation
    passed the API server's 256 KiB for annotations, so a DryRun pod, which must change
    nothing, was refused; the same text went into admission warnings and status."""
    conf = ",".join(f"bogus_option_{i}:1" for i in range(200))
    pod = _pod(env=[{"name": "MALLOC_CONF", "value": conf}])
    plan = plan_pod_patch(_spec(mode="DryRun"), pod, CONTEXT)
    malloc = [p for p in plan.problems if "MALLOC_CONF" in p or "more problems" in p]
    assert len(malloc) == 6 and malloc[-1] == "and 195 more problems in MALLOC_CONF", malloc
    assert all(len(p) < 400 for p in malloc), max(map(len, malloc))
    annotation = jsonpatch.apply_patch(pod, plan.patch)["metadata"]["annotations"][
        keys.DRY_RUN_PLAN]
    assert len(annotation) < 32 * 1024, len(annotation)


def test_the_dry_run_plan_of_a_long_inline_script_stays_short() -> None:
    """The annotation carried the whole patch, a 180 KB `sh -c` script twice over (the
    command and its wrapped copy): the API server refuses annotations over 256 KiB, so a
    DryRun pod, which must change nothing, could not be created."""
    script = "\n".join(f"echo step {i}; sleep 0" for i in range(9000))
    pod = _pod(command=["sh", "-c", script], args=[])
    plan = plan_pod_patch(_spec(mode="DryRun"), pod, CONTEXT)
    annotations = jsonpatch.apply_patch(pod, plan.patch)["metadata"]["annotations"]
    described = json.loads(annotations[keys.DRY_RUN_PLAN])
    assert len(annotations[keys.DRY_RUN_PLAN]) <= 32 * 1024
    (command,) = [op for op in described["patch"] if op["path"] == "/spec/containers/0/command"]
    assert command["value"].startswith("<") and "infertune plan" in command["value"]
    # A short one is kept whole.
    short = json.loads(jsonpatch.apply_patch(_pod(), plan_pod_patch(
        _spec(mode="DryRun"), _pod(), CONTEXT).patch)["metadata"]["annotations"][
        keys.DRY_RUN_PLAN])
    assert [op["value"] for op in short["patch"]
            if op["path"] == "/spec/containers/0/command"] == [
        [LAUNCHER_PATH, "--", "vllm", "serve", "Qwen/Qwen2-7B-Instruct"]]


def _annotated(pod: dict[str, Any], size: int) -> dict[str, Any]:
    """`pod` with annotations of its own of `size` bytes (keys and values) in all."""
    pod["metadata"]["annotations"] = {"team.example.com/notes": "x" * (
        size - len("team.example.com/notes"))}
    return pod


def _annotation_bytes(pod: dict[str, Any]) -> int:
    return sum(len(k.encode()) + len(v.encode())
               for k, v in (pod["metadata"].get("annotations") or {}).items())


def test_the_dry_run_plan_fits_in_what_the_pods_own_annotations_leave() -> None:
    """The plan was cut to 32 KiB, but the pod's own annotations were not counted: 235 KB of
    them and the plan passed the API server's 256 KiB, and the DryRun pod, which must change
    nothing, was refused (failurePolicy: Ignore does not cover that)."""
    script = "\n".join(f"echo step {i}; sleep 0" for i in range(9000))
    for own in (235_000, 260_000, 262_000):
        pod = _annotated(_pod(command=["sh", "-c", script], args=[]), own)
        plan = plan_pod_patch(_spec(mode="DryRun"), pod, CONTEXT)
        tuned = jsonpatch.apply_patch(pod, plan.patch)
        assert _annotation_bytes(tuned) <= 256 * 1024, own
        if own < 262_000:  # shortened to what is left
            assert keys.DRY_RUN_PLAN in tuned["metadata"]["annotations"]
        else:  # nothing left: not annotated, and said
            assert plan.patch == [] and any(
                p.startswith("the pod's annotations leave no room for the plan")
                for p in plan.problems), plan.problems


def test_a_pod_whose_annotations_leave_no_room_for_the_operators_is_refused() -> None:
    pod = _annotated(_pod(), 256 * 1024 - 10)
    plan = plan_pod_patch(_spec(), pod, CONTEXT)
    assert plan.refused and plan.patch == [], plan
    assert plan.problems[0].startswith("the pod's annotations leave no room for the "
                                       "operator's"), plan.problems
    roomy = _annotated(_pod(), 200_000)
    tuned = jsonpatch.apply_patch(roomy, plan_pod_patch(_spec(), roomy, CONTEXT).patch)
    assert keys.SERVING_CONTAINER in tuned["metadata"]["annotations"]


def _limits(name: str, **item: dict[str, str]) -> LimitRangeView:
    view = container_limits(name, {"limits": [{"type": "Container", **item},
                                              {"type": "Pod", "max": {"cpu": "1m"}}]})
    assert view is not None
    return view


def _init_resources(context: PodContext) -> dict[str, Any]:
    plan = plan_pod_patch(_spec(), _pod(), context)
    assert not plan.refused, plan.problems
    (init,) = jsonpatch.apply_patch(_pod(), plan.patch)["spec"]["initContainers"]
    resources: dict[str, Any] = init["resources"]
    assert resources["requests"] == resources["limits"]  # a Guaranteed pod stays so
    return dict(resources["requests"])


def test_the_launcher_is_sized_within_the_namespaces_limit_ranges() -> None:
    """LimitRanger checks containers after the webhooks: an init container under a min (or
    over a max) made a pod the API server refuses, and the ReplicaSet could create none."""
    assert _init_resources(CONTEXT) == {"cpu": "50m", "memory": "64Mi"}
    raised = dataclasses.replace(CONTEXT, limit_ranges=(
        _limits("floor", min={"cpu": "100m", "memory": "128Mi"}),
        _limits("storage", min={"ephemeral-storage": "2Mi"}, max={"memory": "1Gi"})))
    assert _init_resources(raised) == {"cpu": "100m", "memory": "128Mi",
                                       "ephemeral-storage": "2Mi"}
    lowered = dataclasses.replace(CONTEXT, limit_ranges=(
        _limits("small", max={"cpu": "20m", "memory": "48Mi"}, maxLimitRequestRatio={
            "ephemeral-storage": "2"}),))
    assert _init_resources(lowered) == {"cpu": "20m", "memory": "48Mi",
                                        "ephemeral-storage": "1Mi"}


def test_every_resource_a_limit_range_names_is_set_on_the_launcher() -> None:
    """LimitRanger fills its defaults into the init container after the webhook: left out, a
    GPU max of 8 made a one-GPU pod hold eight."""
    named = dataclasses.replace(CONTEXT, limit_ranges=(
        _limits("gpus", max={"nvidia.com/gpu": "8"}, default={"hugepages-2Mi": "1Gi"}),
        _limits("storage", defaultRequest={"ephemeral-storage": "1Gi"}),
        _limits("each", min={"example.com/nic": "1"}, maxLimitRequestRatio={
            "example.com/nic": "1"})))
    assert _init_resources(named) == {
        "cpu": "50m", "memory": "64Mi", "ephemeral-storage": "1Mi", "nvidia.com/gpu": "0",
        "hugepages-2Mi": "0", "example.com/nic": "1"}


@pytest.mark.parametrize(("limits", "said"), [
    ({"max": {"memory": "16Mi"}}, "LimitRange tiny allows at most 16Mi memory per container, "
     "and the launcher's init container needs 32Mi or more"),
    ({"min": {"cpu": "2"}, "max": {"cpu": "1"}}, "needs 10m or more (and at least 2"),
    # Every container must then request some, and the launcher has no use for a GPU.
    ({"maxLimitRequestRatio": {"nvidia.com/gpu": "1"}}, "LimitRange tiny sets a "
     "maxLimitRequestRatio for nvidia.com/gpu, so every container must request some"),
])
def test_a_limit_range_the_launcher_cannot_fit_refuses_the_patch(
        limits: dict[str, dict[str, str]], said: str) -> None:
    """Admitted untuned and said why, rather than patched into a pod the API server
    refuses."""
    context = dataclasses.replace(CONTEXT, limit_ranges=(_limits("tiny", **limits),))
    plan = plan_pod_patch(_spec(), _pod(), context)
    assert plan.refused and plan.patch == []
    assert said in plan.problems[0], plan.problems
    # Without the launcher (no NUMA binding) nothing is refused.
    assert not plan_pod_patch(_spec(numa={"policy": "none"}), _pod(), context).refused


def test_only_container_limits_of_a_limit_range_count() -> None:
    assert container_limits("pods-only", {"limits": [
        {"type": "Pod", "min": {"cpu": "1"}},
        {"type": "PersistentVolumeClaim", "min": {"storage": "1Gi"}}]}) is None
    defaults = container_limits("defaults", {"limits": [
        {"type": "Container", "defaultRequest": {"cpu": "1"}}]})
    assert defaults is not None and defaults.named == ("cpu",)


def test_without_mig_partitioning_a_pod_keeps_its_gpu_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--no-mig: spec.mig is not acted on by the webhook either. Every pod was reported "the
    MIG layout is not planned yet" for good, and a profile status.mig kept from before MIG
    was turned off still replaced nvidia.com/gpu with a slice no node may offer."""
    spec = _spec(mig={"profile": "1g.10gb"})
    stale = dataclasses.replace(CONTEXT, mig_profile="1g.10gb", mig_strategy="mixed")
    planned = plan_pod_patch(spec, _pod(), stale)  # MIG on: the planned slice
    limits = jsonpatch.apply_patch(_pod(), planned.patch)["spec"]["containers"][0][
        "resources"]["limits"]
    assert "nvidia.com/gpu" not in limits and limits["nvidia.com/mig-1g.10gb"] == "1"
    monkeypatch.setenv("INFERTUNE_MIG", "off")
    assert planned_mig({"profile": "1g.10gb", "strategy": "mixed"}) == (None, "mixed")
    plan = plan_pod_patch(spec, _pod(), stale)
    assert not any("MIG" in p for p in plan.problems), plan.problems
    assert any("mig: not acted on" in r for r in plan.reasons), plan.reasons
    limits = jsonpatch.apply_patch(_pod(), plan.patch)["spec"]["containers"][0]["resources"][
        "limits"]
    assert limits["nvidia.com/gpu"] == "1" and not any("mig-" in k for k in limits)


@pytest.mark.parametrize("command", [
    ["taskset", "-c", "0-7", "vllm", "serve", "Qwen/Qwen2-7B-Instruct"],
    ["/usr/bin/tini", "--", "numactl", "--interleave=all", "--", "vllm", "serve", "q"],
    ["env", "OMP_NUM_THREADS=8", "/usr/bin/numactl", "-N", "0", "vllm", "serve", "q"],
    # Wrapper options that take a value: the value was read as the program, and the
    # numactl or taskset after it was wrapped in the launcher.
    ["tini", "-p", "SIGTERM", "--", "numactl", "-N", "0", "vllm", "serve", "q"],
    ["tini", "-gpSIGTERM", "-e", "143", "taskset", "-c", "0-7", "vllm", "serve", "q"],
    ["dumb-init", "--rewrite", "15:2", "--", "taskset", "-c", "0-7", "vllm", "serve", "q"],
    ["dumb-init", "-c", "-r", "15:2", "taskset", "-c", "0-7", "vllm", "serve", "q"],
    ["env", "-u", "CUDA_VISIBLE_DEVICES", "-C", "/models", "numactl", "-N", "0", "vllm"],
    ["/usr/bin/env", "-S", "HF_HOME=/data numactl -N 0", "vllm", "serve", "q"],
    ["env", "--split-string=numactl --interleave=all", "vllm", "serve", "q"],
    ["gosu", "vllm", "taskset", "-c", "0-7", "vllm", "serve", "q"],
    ["nice", "-n", "5", "numactl", "-N", "0", "vllm", "serve", "q"],
    ["su-exec", "app:app", "numactl", "-N", "0", "vllm", "serve", "q"],
    ["stdbuf", "-oL", "-e", "L", "taskset", "-c", "0-7", "vllm", "serve", "q"],
    ["timeout", "-s", "TERM", "-k", "30", "24h", "numactl", "-N", "0", "vllm", "serve"],
    ["chrt", "-r", "10", "taskset", "-c", "0-7", "vllm", "serve", "q"],
    ["tini", "--", "env", "--", "numactl", "-N", "0", "vllm", "serve", "q"],
])
def test_a_command_that_binds_itself_is_not_wrapped(command: list[str]) -> None:
    """Inside the launcher, taskset replaced its CPUs and left memory bound to its node
    (CPUs on node 0, memory on node 1), and numactl its whole policy, while the launcher
    logged action=bind: the binding the operator reported was not the one in effect."""
    spec = _spec(numa={"policy": "node", "node": 1})
    pod = _pod(command=command)
    plan = plan_pod_patch(spec, pod, CONTEXT)
    assert not plan.refused, plan.problems
    tuned = jsonpatch.apply_patch(pod, plan.patch)
    serving = tuned["spec"]["containers"][0]
    assert serving["command"] == command
    assert "INFERTUNE_NUMA_POLICY" not in {e["name"] for e in serving.get("env") or []}
    assert not tuned["spec"].get("initContainers")
    binder = "taskset" if "taskset" in command else "numactl"
    assert any(p.startswith(f"container vllm runs its command under {binder}, which binds "
                            "it itself") for p in plan.problems), plan.problems


@pytest.mark.parametrize("command", [["taskset", "-c", "0-7", "vllm", "serve", "q"],
                                     ["numactl", "-N", "0", "--", "vllm", "serve", "q"]])
def test_a_command_that_pins_itself_is_checked_as_pinned(command: list[str]) -> None:
    """Not wrapped (it binds itself), it was not checked as a pinned process either: jemalloc
    aborted every process under abort_conf with per-CPU arenas and no narenas."""
    pod = _pod(command=command,
               resources={"requests": {"memory": "32Gi"}, "limits": {"memory": "32Gi"}},
               env=[{"name": "MALLOC_CONF", "value": "abort_conf:true,percpu_arena:percpu"}])
    plan = plan_pod_patch(_spec(numa={"policy": "none"}), pod, CONTEXT)
    assert plan.refused and "in a process pinned to some of the node's CPUs" in \
        plan.problems[0], plan.problems


def _refusal(pod: dict[str, Any], spec: InferenceTuningSpec | None = None) -> str:
    plan = plan_pod_patch(spec or _spec(), pod, CONTEXT)
    assert plan.refused and plan.patch == [], plan
    return plan.problems[0]


def test_pods_the_api_server_would_refuse_once_patched_are_admitted_unchanged() -> None:
    """Each was patched, and the API server then refused the pod (failurePolicy: Ignore does
    not cover that): the ReplicaSet could create none."""
    windows = _pod()
    windows["spec"]["os"] = {"name": "windows"}  # no seccomp profile, no capabilities there
    assert ("the pod runs on Windows (spec.os.name, its nodeSelector or its required node "
            "affinity)") in _refusal(windows)
    for path in ("/infertune", "/infertune/disk"):
        device = _pod(volumeDevices=[{"name": "raw", "devicePath": path}])
        assert (f"attaches volume raw as the device {path}, where the launcher's volume goes"
                in _refusal(device))
    small = _pod()
    small["spec"]["resources"] = {"requests": {"cpu": "40m"}}  # pod-level resources
    assert ("the pod's own resources.requests.cpu is 40m, under the 50m the launcher's init "
            "container asks for") in _refusal(small)
    # Room for it, or no launcher at all: tuned.
    small["spec"]["resources"] = {"requests": {"cpu": "9", "memory": "33Gi"}}
    assert not plan_pod_patch(_spec(), small, CONTEXT).refused
    small["spec"]["resources"] = {"requests": {"cpu": "40m"}}
    assert not plan_pod_patch(_spec(numa={"policy": "none"}), small, CONTEXT).refused
    # Pod-level limits are checked against the regular containers only (the API server takes
    # an init container's limit above them).
    small["spec"]["resources"] = {"requests": {"cpu": "9"}, "limits": {"cpu": "9",
                                                                       "memory": "33Gi"}}
    assert not plan_pod_patch(_spec(), small, CONTEXT).refused
    # Pinned to Windows nodes by its selector, the pod is one too.
    pinned = _pod()
    pinned["spec"]["nodeSelector"] = {"kubernetes.io/os": "windows"}
    assert "the pod runs on Windows" in _refusal(pinned)
    # And by its required node affinity: given the Linux launcher, it never left Init.
    def placed(*terms: list[dict[str, Any]]) -> dict[str, Any]:
        pod = _pod()
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuring"
                                                    "Execution": {"nodeSelectorTerms": [
                                                        {"matchExpressions": t} for t in terms]}}}
        return pod

    on_windows = [{"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]}]
    build = [{"key": "node.kubernetes.io/windows-build", "operator": "Exists"}]
    assert "the pod runs on Windows" in _refusal(placed(on_windows))
    assert "the pod runs on Windows" in _refusal(placed(on_windows, build))
    # Linux nodes still admitted by a term, or by the expression: tuned.
    either = [{"key": "kubernetes.io/os", "operator": "In", "values": ["windows", "linux"]}]
    gpu = [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]
    for pod in (placed(either), placed(on_windows, gpu), placed(gpu)):
        assert not plan_pod_patch(_spec(), pod, CONTEXT).refused
    empty = _pod()
    empty["spec"]["containers"] = []
    assert _refusal(empty) == "the pod has no containers"


@pytest.mark.parametrize(("env", "env_from", "read"), [
    # Defined after it: the kubelet leaves $(EXTRA) as written, and jemalloc reads that.
    ([{"name": "MALLOC_CONF", "value": "$(EXTRA)"},
      {"name": "EXTRA", "value": "abort_conf:true"}], False, "syntax"),
    # What envFrom or a Service may define is not known at admission: not checked.
    ([{"name": "MALLOC_CONF", "value": "$(EXTRA)"}], True, "unknown"),
    ([{"name": "MALLOC_CONF", "value": "$(CACHE_SERVICE_HOST)"}], False, "unknown"),
    ([{"name": "EXTRA", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
      {"name": "MALLOC_CONF", "value": "$(EXTRA)"}], False, "unknown"),
])
def test_a_reference_is_read_as_the_kubelet_expands_it(
        env: list[dict[str, Any]], env_from: bool, read: str) -> None:
    """A $(VAR) to a variable defined later in the list is not expanded by the kubelet: it
    was taken for one whose value comes from elsewhere, and the string jemalloc reads (and
    drops whole, with the spec's settings) was not checked."""
    pod = _pod(env=env, **({"envFrom": [{"configMapRef": {"name": "c"}}]} if env_from else {}))
    plan = plan_pod_patch(_spec(allocator={"mallocConf": "background_thread:true"}), pod,
                          CONTEXT)
    said = " ".join(plan.problems)
    if read == "syntax":
        assert "has a syntax error" in said, plan.problems
        assert _env(jsonpatch.apply_patch(pod, plan.patch)["spec"]["containers"][0])[
            "MALLOC_CONF"].startswith("background_thread:true")
    else:
        assert "whose values are not known here" in said, plan.problems


def test_a_memory_high_under_half_a_guaranteed_limit_leaves_only_memory_high_out() -> None:
    """Refused whole, as the other misfits are, it took the binding and the allocator from
    the new pods of a tuning an earlier release had tuned fully."""
    plan = plan_pod_patch(_spec(memory={"high": "10Gi"}), _pod(), CONTEXT)  # limit 32Gi
    assert not plan.refused
    assert any(p.startswith("spec.memory.high: 10Gi is under half the memory limit 32Gi")
               and p.endswith("memory.high stays at max, and the rest of the tuning is applied")
               for p in plan.problems), plan.problems
    pod = jsonpatch.apply_patch(_pod(), plan.patch)
    assert keys.MEMORY_HIGH not in (pod["metadata"].get("annotations") or {})
    assert pod["spec"]["containers"][0]["command"][0] == LAUNCHER_PATH
    assert "MALLOC_CONF" in _env(pod["spec"]["containers"][0])


def test_a_memory_high_annotation_from_the_template_goes_where_memory_high_stays_at_max(
) -> None:
    """Copied from a tuned pod's YAML into the template: kept, the node agent would write
    it (64Mi, the incident's), while the pod was labelled as tuned with memory.high at max."""
    pod = _pod(resources={"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}})
    pod["metadata"]["annotations"] = {keys.MEMORY_HIGH: "67108864", "team": "ml"}
    plan = plan_pod_patch(_spec(), pod, CONTEXT)
    tuned = jsonpatch.apply_patch(pod, plan.patch)
    assert tuned["metadata"]["annotations"] == {"team": "ml", keys.SERVING_CONTAINER: "vllm"}
    assert any(f"{keys.MEMORY_HIGH} from the pod template removed" in r for r in plan.reasons)
    # A value of its own replaces it.
    ours = _apply(_spec(memory={"high": "700Mi", "minHeadroom": "256Mi"}), pod)
    assert ours["metadata"]["annotations"][keys.MEMORY_HIGH] == str(700 * 2**20)
    # DryRun changes nothing: the plan says it.
    dry = plan_pod_patch(_spec(mode="DryRun"), pod, CONTEXT)
    shown = jsonpatch.apply_patch(pod, dry.patch)["metadata"]["annotations"]
    assert shown[keys.MEMORY_HIGH] == "67108864"
    assert "/metadata/annotations/infertune.io~1memory-high" in shown[keys.DRY_RUN_PLAN]


def test_a_burstable_memory_high_under_half_the_limit_is_applied_and_reported() -> None:
    pod = _pod(resources={"requests": {"memory": "1Gi"}, "limits": {"memory": "32Gi"}})
    plan = plan_pod_patch(_spec(memory={"high": "2Gi"}), pod, CONTEXT)
    tuned = jsonpatch.apply_patch(pod, plan.patch)
    assert tuned["metadata"]["annotations"][keys.MEMORY_HIGH] == str(2 * 2**30)
    assert any(p.startswith("spec.memory.high: 2Gi is under half the memory limit 32Gi")
               for p in plan.problems), plan.problems


def test_a_command_of_many_wrapper_words_is_read_through_to_its_program() -> None:
    """Walked by cutting words off the front, a command of 100,000 words (`env A0=1 ...`,
    `env env ...`) took 13 s of the event loop, and every other pod's admission waited past
    its timeout; read by position, it is read to the program after them all."""
    from infertune.tuning.pod_patch import MAX_SPLITS, _after_wrappers

    many = ["env", *(f"A{i}=1" for i in range(100_000)), "numactl", "-N", "0", "vllm"]
    assert _after_wrappers({"command": many}) == ["numactl", "-N", "0", "vllm"]
    nested = ["env"] * 50_000 + ["tini", "--", "taskset", "-c", "0", "vllm"]
    assert _after_wrappers({"command": nested}) == ["taskset", "-c", "0", "vllm"]
    # Each env -S string copies what follows it: past MAX_SPLITS the rest is no program.
    split = [*(["env", "-S", "env"] * (MAX_SPLITS + 5)), "numactl", "vllm"]
    assert _after_wrappers({"command": split}) == []
    assert _after_wrappers({"command": split[3 * (MAX_SPLITS - 1):]})[:1] == ["numactl"]


def test_an_env_split_string_that_does_not_split_is_no_failure() -> None:
    """env -S with an unbalanced quote: shlex raised, and a failure there fails the webhook's
    planning of every pod of the target (and every evaluation reading the template)."""
    pod = _pod(command=["env", "-S", "'unbalanced numactl", "vllm", "serve", "q"])
    plan = plan_pod_patch(_spec(), pod, CONTEXT)
    assert not plan.refused, plan.problems


@pytest.mark.parametrize("quantity", ["10E", "1e19", "9223372036854775808"])
def test_a_quantity_beyond_what_the_parser_takes_refuses_the_pod_with_its_reason(
        quantity: str) -> None:
    """A decimal above 2^63-1, which the API server stores as given: the planner raised, the
    pod was admitted with "pod tuning failed" alone, and every re-tuning pass (which previews
    the template) failed with a traceback and wrote no status."""
    for resources in ({"limits": {"memory": quantity, "cpu": "8"}},
                      {"limits": {"memory": "16Gi", "cpu": quantity}}):
        plan = plan_pod_patch(_spec(), _pod(resources=resources), CONTEXT)
        assert plan.refused and plan.patch == [], plan
        assert plan.problems[0].startswith("a resource quantity of the pod cannot be read ("), \
            plan.problems
        assert quantity in plan.problems[0] and plan.problems[0].endswith(
            "fix that quantity in the pod template")


def test_a_missing_spec_container_names_a_few_containers_not_thousands() -> None:
    pod = _pod()
    pod["spec"]["containers"] += [{"name": f"sidecar-{i}", "image": "s:1"} for i in range(3000)]
    plan = plan_pod_patch(_spec(container="absent"), pod, CONTEXT)
    assert plan.refused and plan.problems[0].endswith(
        "sidecar-8 and 2991 more); fix spec.container"), plan.problems[0][-200:]
    assert len(plan.problems[0]) < 400
