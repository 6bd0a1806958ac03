"""infertune-launch on fake sysfs/procfs trees under dash and bash --posix, then on this machine."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

LAUNCHER = (Path(__file__).resolve().parent.parent / "operator" / "infertune" / "launcher"
            / "infertune-launch")
SHELLS = [pytest.param(shell, id=shell[0], marks=pytest.mark.skipif(
              shutil.which(shell[0]) is None, reason=f"needs {shell[0]} (apt-get install "
              f"{shell[0]})")) for shell in (["dash"], ["bash", "--posix"])]
"""Every case runs under both: dash is /bin/sh in Debian images (the operator's own), bash
--posix stands for the others. A shell missing is a skip CI counts as a failure (conftest):
left out of the list, half of this file vanished without a word."""
DASH = [shell for shell in SHELLS if shell.id == "dash"]
COMMAND = ["vllm", "serve", "Qwen/Qwen2-7B", "--max-model-len", "8192 tokens"]


@dataclass(frozen=True)
class Gpu:
    uuid: str
    pci: str
    minor: int
    numa_node: str


@dataclass(frozen=True)
class Machine:
    """A node as the launcher sees it from inside the container."""

    nodes: dict[int, str] = field(default_factory=lambda: {0: "0-7", 1: "8-15"})
    gpus: tuple[Gpu, ...] = ()
    cpuset: str | None = "0-15"  # cgroup v2 cpuset.cpus.effective; None: no cgroup file
    mems: str | None = "0-1"
    status_cpus: str = "0-15"  # Cpus_allowed_list in /proc/self/status
    # the minors of the /dev/nvidia<N> the container has: under CDI, only its own GPUs'
    dev_minors: tuple[int, ...] = ()
    memory_max: str | None = None  # cgroup v2 memory.max, bytes or "max"; None: no file
    cpu_max: str | None = None  # cgroup v2 cpu.max, "QUOTA PERIOD" or "max PERIOD"
    node_memory_kb: int | None = None  # each node's MemTotal in node<N>/meminfo; None: no file
    # each node's huge page pools: page size in kB -> nr_hugepages as written; None: no file
    node_hugepages: dict[int, str | None] = field(default_factory=dict)

    def build(self, root: Path) -> None:
        sys_, proc = root / "sys", root / "proc"
        for node, cpus in self.nodes.items():
            write(sys_ / f"devices/system/node/node{node}/cpulist", cpus)
            if self.node_memory_kb is not None:
                write(sys_ / f"devices/system/node/node{node}/meminfo",
                      f"Node {node} MemTotal:       {self.node_memory_kb} kB\n"
                      f"Node {node} MemFree:        {self.node_memory_kb // 2} kB\n")
            for size_kb, count in self.node_hugepages.items():
                pool = sys_ / f"devices/system/node/node{node}/hugepages/hugepages-{size_kb}kB"
                pool.mkdir(parents=True, exist_ok=True)
                if count is not None:
                    write(pool / "nr_hugepages", count)
                    write(pool / "free_hugepages", count)
        write(proc / "self/cgroup", "0::/kubepods.slice/pod1.slice/cri-containerd-c1.scope\n")
        write(proc / "self/status", f"Name:\tsh\nCpus_allowed_list:\t{self.status_cpus}\n"
              f"Mems_allowed_list:\t{self.mems or '0-1'}\n")
        cgroup = sys_ / "fs/cgroup/kubepods.slice/pod1.slice/cri-containerd-c1.scope"
        if self.cpuset is not None:
            write(cgroup / "cpuset.cpus.effective", self.cpuset)
        if self.mems is not None:
            write(cgroup / "cpuset.mems.effective", self.mems)
        if self.memory_max is not None:
            write(cgroup / "memory.max", self.memory_max)
        if self.cpu_max is not None:
            write(cgroup / "cpu.max", self.cpu_max)
        for gpu in self.gpus:
            write(proc / f"driver/nvidia/gpus/{gpu.pci}/information",
                  f"Model: \t\t NVIDIA A100-SXM4-40GB\nIRQ:   \t\t 42\nGPU UUID: \t {gpu.uuid}\n"
                  f"Bus Location: \t {gpu.pci}\nDevice Minor: \t {gpu.minor}\n")
            write(sys_ / f"bus/pci/devices/{gpu.pci}/numa_node", gpu.numa_node)
        dev = root / "dev"
        (dev / "nvidia-caps").mkdir(parents=True, exist_ok=True)
        # character devices without mknod: the launcher takes the minor from the name
        for name in ("nvidiactl", "nvidia-uvm", *(f"nvidia{n}" for n in self.dev_minors)):
            (dev / name).symlink_to("/dev/null")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")


GPU0 = Gpu("GPU-0a1b2c3d-0000-1111-2222-333344445555", "0000:3b:00.0", 0, "0")
GPU1 = Gpu("GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff", "0000:86:00.0", 1, "1")
GPU2 = Gpu("GPU-11112222-aaaa-bbbb-cccc-ddddeeeeffff", "0000:af:00.0", 2, "1")
GPU_NO_NODE = Gpu("GPU-deadbeef-0000-0000-0000-000000000000", "0000:00:1e.0", 0, "-1")
GIB = 1024 ** 3
NODE_KB = 256 * 1024 * 1024
"""MemTotal of a 256 GiB NUMA node, in kB as node<N>/meminfo gives it."""
HUGE_234_GIB = {1048576: "200", 2048: "17408"}
"""Huge page pools reserving 200 GiB in 1 GiB pages and 34 GiB in 2 MiB pages: 22 GiB of a
256 GiB node's MemTotal is left to ordinary allocations."""


@dataclass(frozen=True)
class Launch:
    returncode: int
    argv: list[str] | None
    log: dict[str, str]
    stderr: str


def launch(shell: list[str], root: Path, env: dict[str, str], *args: str,
           numactl: str | None = None, cwd: Path | None = None) -> Launch:
    fake_numactl = root / "bin/numactl"
    write(fake_numactl, "#!/bin/sh\nexit 0\n")
    fake_numactl.chmod(0o755)
    full_env = {"PATH": "/usr/bin:/bin", "INFERTUNE_SYSFS_ROOT": str(root),
                "INFERTUNE_PROCFS_ROOT": str(root), "INFERTUNE_DEVFS_ROOT": str(root),
                "INFERTUNE_NUMACTL": numactl or str(fake_numactl), **env}
    done = subprocess.run([*shell, str(LAUNCHER), *args], env=full_env, capture_output=True,
                          text=True, timeout=30, check=False, cwd=cwd)
    log_lines = [line for line in done.stderr.splitlines()
                 if line.startswith("infertune-launch:")]
    assert len(log_lines) == 1, done.stderr
    log = dict(word.split("=", 1)
               for word in shlex.split(log_lines[0].removeprefix("infertune-launch:")))
    argv = shlex.split(done.stdout) if done.stdout else None
    return Launch(done.returncode, argv, log, done.stderr)


def bound(root: Path, *options: str) -> list[str]:
    return [str(root / "bin/numactl"), *options, "--", *COMMAND]


@dataclass(frozen=True)
class Case:
    machine: Machine
    env: dict[str, str]
    options: tuple[str, ...] | None  # numactl options; None: the command runs unbound
    log: dict[str, str]
    reason: str = ""


CASES = {
    "gpu_uuid_on_node_1_binds_to_node_1": Case(
        Machine(gpus=(GPU0, GPU1)), {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid},
        ("--cpunodebind=1", "--membind=1"),
        {"level": "info", "policy": "gpu-local", "gpus": GPU1.uuid, "node": "1",
         "allowed_cpus": "0-15", "action": "bind"}, "node 1 is local to the GPUs"),
    "gpu_index_maps_through_device_minor": Case(
        Machine(gpus=(GPU0, GPU1)), {"NVIDIA_VISIBLE_DEVICES": "1"},
        ("--cpunodebind=1", "--membind=1"), {"gpus": "1", "gpu_nodes": "1", "node": "1"}),
    "mig_device_of_a_known_gpu_uses_that_gpu": Case(
        Machine(gpus=(GPU0, GPU1)), {"NVIDIA_VISIBLE_DEVICES": f"MIG-{GPU1.uuid}/1/0"},
        ("--cpunodebind=1", "--membind=1"), {"node": "1"}),
    "gpus_across_nodes_take_the_node_with_most": Case(
        Machine(gpus=(GPU0, GPU1, GPU2)),
        {"NVIDIA_VISIBLE_DEVICES": f"{GPU0.uuid},{GPU1.uuid},{GPU2.uuid}"},
        ("--cpunodebind=1", "--membind=1"), {"gpu_nodes": "0,1,1", "node": "1"},
        "GPUs span nodes 0,1, chose node 1 holding 2 of 3"),
    "all_gpus_are_counted": Case(
        Machine(gpus=(GPU0, GPU1, GPU2)), {"NVIDIA_VISIBLE_DEVICES": "all"},
        ("--cpunodebind=1", "--membind=1"), {"node": "1"}, "holding 2 of 3"),
    "gpu_with_numa_node_minus_one_on_two_nodes_runs_unbound": Case(
        Machine(gpus=(GPU_NO_NODE,)),
        {"NVIDIA_VISIBLE_DEVICES": GPU_NO_NODE.uuid}, None,
        {"level": "warning", "action": "unbound", "node": ""}, "has numa_node -1"),
    "gpu_with_numa_node_minus_one_on_the_only_node_binds_to_it": Case(
        Machine(nodes={0: "0-15"}, mems="0", gpus=(GPU_NO_NODE,)),
        {"NVIDIA_VISIBLE_DEVICES": GPU_NO_NODE.uuid, "INFERTUNE_NUMA_STRICT": "true"},
        ("--cpunodebind=0", "--membind=0"),
        {"level": "info", "strict": "true", "action": "bind", "node": "0", "gpu_nodes": ""},
        "node 0 is the only NUMA node"),
    "no_gpu_on_the_only_node_still_runs_unbound": Case(
        Machine(nodes={0: "0-15"}, mems="0", gpus=(GPU_NO_NODE,)),
        {"NVIDIA_VISIBLE_DEVICES": "GPU-not-here"}, None, {"action": "unbound"},
        "GPU-not-here is not in"),
    "unknown_gpu_runs_unbound": Case(
        Machine(gpus=(GPU0,)), {"NVIDIA_VISIBLE_DEVICES": "GPU-not-here"}, None,
        {"action": "unbound"}, "GPU-not-here is not in"),
    "no_visible_gpus_runs_unbound": Case(
        Machine(gpus=(GPU0,), dev_minors=(0,)), {"NVIDIA_VISIBLE_DEVICES": "none"}, None,
        {"action": "unbound"}, "no GPU with a known NUMA node"),
    "unset_visible_devices_without_gpu_devices_runs_unbound": Case(
        Machine(gpus=(GPU0,)), {}, None, {"action": "unbound"},
        "NVIDIA_VISIBLE_DEVICES is unset and"),
    # CDI (the GPU Operator's default since v25.10): nvidia-ctk's spec sets
    # NVIDIA_VISIBLE_DEVICES=void and the container gets only its GPUs' /dev/nvidia<N>
    "cdi_void_finds_the_gpu_by_its_device_node": Case(
        Machine(gpus=(GPU0, GPU1, GPU2), dev_minors=(1,)),
        {"NVIDIA_VISIBLE_DEVICES": "void", "INFERTUNE_NUMA_STRICT": "true"},
        ("--cpunodebind=1", "--membind=1"),
        {"level": "info", "gpus": GPU1.uuid, "gpu_nodes": "1", "node": "1", "action": "bind"},
        "GPUs from the device nodes nvidia1 in "),
    "cdi_void_counts_every_device_node": Case(
        Machine(gpus=(GPU0, GPU1, GPU2), dev_minors=(0, 2)),
        {"NVIDIA_VISIBLE_DEVICES": "void"}, None,
        {"gpus": f"{GPU0.uuid},{GPU2.uuid}", "gpu_nodes": "0,1", "action": "unbound"},
        "GPUs span nodes 0,1 and none holds more than half of them (node 0 holds 1 of 2): "
        "bound to one node, the processes driving the others would run on CPUs and memory "
        "remote to their GPUs; GPUs from the device nodes nvidia0,nvidia2 in "),
    # A tensor-parallel pod with a GPU on each socket: bound to node 0, the worker of the
    # node-1 GPU ran on node 0's CPUs with its host buffers there, and half the CPUs were gone.
    "gpus_split_evenly_over_nodes_run_unbound": Case(
        Machine(gpus=(GPU0, GPU1)), {"NVIDIA_VISIBLE_DEVICES": f"{GPU0.uuid},{GPU1.uuid}"},
        None, {"level": "warning", "gpu_nodes": "0,1", "node": "", "action": "unbound"},
        "GPUs span nodes 0,1 and none holds more than half of them (node 0 holds 1 of 2): "
        "bound to one node, the processes driving the others would run on CPUs and memory "
        "remote to their GPUs; running unbound"),
    "strict_binds_gpus_split_evenly_to_the_lowest_node_and_warns": Case(
        Machine(gpus=(GPU0, GPU1)), {"NVIDIA_VISIBLE_DEVICES": f"{GPU0.uuid},{GPU1.uuid}",
                                     "INFERTUNE_NUMA_STRICT": "true"},
        ("--cpunodebind=0", "--membind=0"),
        {"level": "warning", "gpu_nodes": "0,1", "node": "0", "action": "bind"},
        "node 0 is local to the GPUs; GPUs span nodes 0,1, chose node 0 holding 1 of 2; no node "
        "holds more than half of them: bound all the same (strict), the processes driving the "
        "others run on CPUs and memory remote to their GPUs"),
    # A node without CPUs is memory of another kind (a CXL expander, a Grace Hopper GPU's).
    "gpu_with_numa_node_minus_one_on_the_only_node_with_cpus_binds_to_it": Case(
        Machine(nodes={0: "0-15", 1: ""}, gpus=(GPU_NO_NODE,)),
        {"NVIDIA_VISIBLE_DEVICES": GPU_NO_NODE.uuid}, ("--cpunodebind=0", "--membind=0"),
        {"level": "info", "action": "bind", "node": "0", "nodes": "0,1"},
        "node 0 is the only NUMA node with CPUs, so it holds the GPUs"),
    "unset_visible_devices_finds_gpus_by_device_nodes": Case(
        Machine(gpus=(GPU0, GPU1), dev_minors=(1,)), {}, ("--cpunodebind=1", "--membind=1"),
        {"gpus": GPU1.uuid}, "(NVIDIA_VISIBLE_DEVICES is unset)"),
    "empty_visible_devices_finds_gpus_by_device_nodes": Case(
        Machine(gpus=(GPU0, GPU1), dev_minors=(0,)), {"NVIDIA_VISIBLE_DEVICES": ""},
        ("--cpunodebind=0", "--membind=0"), {"gpus": GPU0.uuid},
        "(NVIDIA_VISIBLE_DEVICES is empty)"),
    # A privileged container sees every GPU's device node: they say nothing of its own GPU
    # (here GPU1 on node 1), and the node holding most of the machine's was taken.
    "privileged_container_does_not_take_device_nodes_for_its_gpus": Case(
        Machine(gpus=(GPU0, GPU1, GPU2), dev_minors=(0, 1, 2)),
        {"NVIDIA_VISIBLE_DEVICES": "void", "INFERTUNE_DEVICE_NODES": "ignore"}, None,
        {"action": "unbound", "gpus": "void"},
        "the container is privileged: its /dev shows every GPU's device node, on nodes 0,1, "
        "not which are its own"),
    # ...unless every GPU of the machine is on one node: then that node holds its own too
    # (strict then binds, as it did before the device nodes were read at all).
    "privileged_container_binds_where_every_gpu_is": Case(
        Machine(gpus=(GPU1, GPU2), dev_minors=(1, 2)),
        {"NVIDIA_VISIBLE_DEVICES": "void", "INFERTUNE_DEVICE_NODES": "ignore",
         "INFERTUNE_NUMA_STRICT": "true"}, ("--cpunodebind=1", "--membind=1"),
        {"action": "bind", "node": "1"}, "every GPU of the machine is on one node"),
    "privileged_container_on_one_numa_node_binds_to_it": Case(
        Machine(nodes={0: "0-7"}, gpus=(GPU_NO_NODE,), cpuset="0-7", mems="0",
                status_cpus="0-7", dev_minors=(0,)),
        {"INFERTUNE_DEVICE_NODES": "ignore", "INFERTUNE_NUMA_STRICT": "true"},
        ("--cpunodebind=0", "--membind=0"), {"action": "bind", "node": "0"},
        "node 0 is the only NUMA node"),
    "cdi_void_without_gpu_devices_runs_unbound": Case(
        Machine(gpus=(GPU0,)), {"NVIDIA_VISIBLE_DEVICES": "void"}, None,
        {"action": "unbound", "gpus": "void"},
        "NVIDIA_VISIBLE_DEVICES is void and there is no nvidia<N> device in "),
    "device_node_of_no_listed_gpu_runs_unbound": Case(
        Machine(gpus=(GPU0,), dev_minors=(3,)), {"NVIDIA_VISIBLE_DEVICES": "void"}, None,
        {"action": "unbound"}, "/dev/nvidia3 is not in "),
    "cpuset_excluding_the_gpu_node_runs_unbound": Case(
        Machine(gpus=(GPU1,), cpuset="0-7"), {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid}, None,
        {"action": "unbound", "allowed_cpus": "0-7"},
        "node 1 CPUs 8-15 are all outside the allowed cpuset 0-7"),
    # The CPU manager chose the cpuset without the GPU's node in mind (Topology Manager
    # none): bound there, the process got only the node's share of it, logged as info.
    "cpuset_mostly_off_the_gpu_node_runs_unbound": Case(
        Machine(gpus=(GPU1,), cpuset="0-6,8"), {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid}, None,
        {"level": "warning", "action": "unbound"},
        "node 1 holds 1 of the 8 CPUs the container is allowed (0-6,8): bound there, it "
        "would run on fewer than half of them; running unbound"),
    "strict_binds_to_a_sliver_of_the_cpuset_and_says_so": Case(
        Machine(gpus=(GPU1,), cpuset="0-6,8"),
        {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid, "INFERTUNE_NUMA_STRICT": "true"},
        ("--cpunodebind=1", "--membind=1"), {"level": "warning", "action": "bind"},
        "node 1 holds 1 of the 8 CPUs the container is allowed (0-6,8), and runs on those "
        "only"),
    "cpuset_half_on_the_gpu_node_binds_with_a_warning": Case(
        Machine(gpus=(GPU1,), cpuset="4-11"), {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid},
        ("--cpunodebind=1", "--membind=1"), {"level": "warning", "action": "bind"},
        "node 1 holds 4 of the 8 CPUs the container is allowed (4-11), and runs on those "
        "only"),
    "cpuset_within_the_gpu_node_binds_quietly": Case(
        Machine(gpus=(GPU1,), cpuset="8-11"), {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid},
        ("--cpunodebind=1", "--membind=1"), {"level": "info", "action": "bind"}),
    # No exclusive CPUs (the cpuset is the machine): the GPU's node all the same, but a CPU
    # limit it cannot hold is said at warning level (it was logged at info).
    "cpu_limit_above_the_gpu_node_binds_with_a_warning": Case(
        Machine(gpus=(GPU1,), cpu_max="1200000 100000"), {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid},
        ("--cpunodebind=1", "--membind=1"), {"level": "warning", "action": "bind"},
        "node 1 holds 8 CPUs the container may use, fewer than the 12 of its CPU limit "
        "(cpu.max), and runs on those only"),
    "cpu_limit_within_the_gpu_node_binds_quietly": Case(
        Machine(gpus=(GPU1,), cpu_max="750000 100000"), {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid},
        ("--cpunodebind=1", "--membind=1"), {"level": "info", "action": "bind"}),
    "no_cpu_limit_binds_quietly": Case(
        Machine(gpus=(GPU1,), cpu_max="max 100000"), {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid},
        ("--cpunodebind=1", "--membind=1"), {"level": "info", "action": "bind"}),
    "a_cpu_limit_is_rounded_up": Case(
        Machine(gpus=(GPU1,), cpu_max="850000 100000"), {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid},
        ("--cpunodebind=1", "--membind=1"), {"level": "warning", "action": "bind"},
        "fewer than the 9 of its CPU limit (cpu.max)"),
    "a_zero_period_is_no_limit": Case(
        Machine(gpus=(GPU1,), cpu_max="100000 0"), {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid},
        ("--cpunodebind=1", "--membind=1"), {"level": "info", "action": "bind"}),
    "an_unreadable_cpu_limit_is_no_limit": Case(
        Machine(gpus=(GPU1,), cpu_max="99999999999999999999 100000"),
        {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid},
        ("--cpunodebind=1", "--membind=1"), {"level": "info", "action": "bind"}),
    "cpus_from_proc_status_without_a_cgroup_file": Case(
        Machine(gpus=(GPU1,), cpuset=None, status_cpus="2-5"),
        {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid}, None, {"allowed_cpus": "2-5"},
        "outside the allowed cpuset 2-5"),
    "mems_excluding_the_node_runs_unbound": Case(
        Machine(mems="0"), {"INFERTUNE_NUMA_POLICY": "node:1"}, None, {"action": "unbound"},
        "node 1 memory is outside the allowed mems 0"),
    "node_policy_binds_to_that_node": Case(
        Machine(), {"INFERTUNE_NUMA_POLICY": "node:0"}, ("--cpunodebind=0", "--membind=0"),
        {"policy": "node:0", "node": "0", "action": "bind"}, "policy asks for node 0"),
    "node_policy_for_a_missing_node_runs_unbound": Case(
        Machine(), {"INFERTUNE_NUMA_POLICY": "node:5"}, None, {"action": "unbound"},
        "node 5 does not exist"),
    "interleave_spreads_over_the_allowed_nodes": Case(
        Machine(), {"INFERTUNE_NUMA_POLICY": "interleave"}, ("--interleave=0,1",),
        {"action": "interleave", "node": "0,1"}),
    "interleave_leaves_out_the_nodes_without_cpus": Case(
        Machine(nodes={0: "0-7", 1: "8-15", 2: "", 3: ""}, mems="0-3"),
        {"INFERTUNE_NUMA_POLICY": "interleave"}, ("--interleave=0,1",),
        {"level": "info", "action": "interleave", "node": "0,1", "nodes": "0,1,2,3"},
        "memory interleaved over the allowed nodes 0,1; not over 2,3, which have no CPUs "
        "(memory of another kind: a CXL expander, a GPU's)"),
    "interleave_with_only_memory_nodes_allowed_runs_unbound": Case(
        Machine(nodes={0: "0-7", 1: "8-15", 2: ""}, mems="2"),
        {"INFERTUNE_NUMA_POLICY": "interleave"}, None, {"action": "unbound"},
        "no NUMA node with CPUs is allowed to this container (nodes 0,1,2, allowed mems 2; "
        "without CPUs: 2); running unbound"),
    "interleave_keeps_to_the_allowed_mems": Case(
        Machine(nodes={0: "0-3", 1: "4-7", 2: "8-11"}, mems="1-2"),
        {"INFERTUNE_NUMA_POLICY": "interleave"}, ("--interleave=1,2",), {"nodes": "0,1,2"}),
    "none_runs_the_command_as_is": Case(
        Machine(gpus=(GPU1,)), {"INFERTUNE_NUMA_POLICY": "none"}, None,
        {"level": "info", "action": "none"}),
    "unknown_policy_runs_unbound": Case(
        Machine(), {"INFERTUNE_NUMA_POLICY": 'fast "est" \\o/'}, None,
        {"action": "unbound", "policy": 'fast "est" \\o/'}, 'unknown policy fast "est" \\o/'),
    "bad_strict_value_is_taken_as_false": Case(
        Machine(), {"INFERTUNE_NUMA_POLICY": "node:7", "INFERTUNE_NUMA_STRICT": "yes"}, None,
        {"strict": "false", "action": "unbound"}, "neither true nor false"),
    # --membind=N: the kernel OOM-kills the process when node N is full, below a larger cgroup
    # limit (a pod limited to 400Gi on 2 x 256 GiB nodes was killed at ~256 GiB)
    "memory_limit_above_the_node_prefers_its_memory": Case(
        Machine(gpus=(GPU1,), memory_max=str(400 * GIB), node_memory_kb=NODE_KB),
        {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid}, ("--cpunodebind=1", "--preferred=1"),
        {"level": "info", "action": "bind", "node": "1"},
        "node 1 is local to the GPUs; memory preferred on node 1, not bound: the container's "
        "memory limit of 409600 MiB (memory.max) is above node 1's 262144 MiB (MemTotal), and "
        "bound there the command would be OOM-killed when node 1 is full"),
    "no_memory_limit_prefers_the_node_memory": Case(
        Machine(memory_max="max", node_memory_kb=NODE_KB), {"INFERTUNE_NUMA_POLICY": "node:0"},
        ("--cpunodebind=0", "--preferred=0"), {"level": "info", "action": "bind"},
        "memory preferred on node 0, not bound: the container has no memory limit (memory.max "
        "max) and node 0 has 262144 MiB (MemTotal)"),
    "memory_limit_within_the_node_binds_it": Case(
        Machine(gpus=(GPU1,), memory_max=str(200 * GIB), node_memory_kb=NODE_KB),
        {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid}, ("--cpunodebind=1", "--membind=1"),
        {"level": "info", "action": "bind"}),
    "memory_limit_of_the_whole_node_binds_it": Case(
        Machine(memory_max=str(NODE_KB * 1024), node_memory_kb=NODE_KB),
        {"INFERTUNE_NUMA_POLICY": "node:0"}, ("--cpunodebind=0", "--membind=0"),
        {"level": "info"}),
    "unreadable_memory_limit_binds_memory_as_before": Case(
        Machine(node_memory_kb=NODE_KB), {"INFERTUNE_NUMA_POLICY": "node:0"},
        ("--cpunodebind=0", "--membind=0"), {"level": "info"}),
    "unreadable_node_memory_binds_memory_as_before": Case(
        Machine(memory_max=str(400 * GIB)), {"INFERTUNE_NUMA_POLICY": "node:0"},
        ("--cpunodebind=0", "--membind=0"), {"level": "info"}),
    "strict_binds_memory_above_the_node_and_warns_of_the_oom_kill": Case(
        Machine(memory_max=str(400 * GIB), node_memory_kb=NODE_KB),
        {"INFERTUNE_NUMA_POLICY": "node:0", "INFERTUNE_NUMA_STRICT": "true"},
        ("--cpunodebind=0", "--membind=0"), {"level": "warning", "action": "bind"},
        "memory bound to node 0 all the same (strict): the container's memory limit of 409600 "
        "MiB (memory.max) is above node 0's 262144 MiB (MemTotal), so the kernel OOM-kills the "
        "command when node 0 is full"),
    # MemTotal counts the node's huge pages, which ordinary allocations cannot take: a 200Gi
    # limit bound to a 256 GiB node holding 234 GiB of them was OOM-killed at about 22 GiB.
    "memory_limit_above_what_huge_pages_leave_prefers_the_node_memory": Case(
        Machine(gpus=(GPU1,), memory_max=str(200 * GIB), node_memory_kb=NODE_KB,
                node_hugepages=HUGE_234_GIB),
        {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid}, ("--cpunodebind=1", "--preferred=1"),
        {"level": "info", "action": "bind", "node": "1"},
        "memory preferred on node 1, not bound: the container's memory limit of 204800 MiB "
        "(memory.max) is above node 1's 22528 MiB (MemTotal 262144 MiB, less 239616 MiB of huge "
        "pages), and bound there the command would be OOM-killed when node 1 is full"),
    "memory_limit_within_what_huge_pages_leave_binds_it": Case(
        Machine(gpus=(GPU1,), memory_max=str(16 * GIB), node_memory_kb=NODE_KB,
                node_hugepages=HUGE_234_GIB),
        {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid}, ("--cpunodebind=1", "--membind=1"),
        {"level": "info", "action": "bind"}),
    "no_memory_limit_says_what_huge_pages_leave": Case(
        Machine(memory_max="max", node_memory_kb=NODE_KB, node_hugepages=HUGE_234_GIB),
        {"INFERTUNE_NUMA_POLICY": "node:0"}, ("--cpunodebind=0", "--preferred=0"),
        {"level": "info"}, "the container has no memory limit (memory.max max) and node 0 has "
        "22528 MiB (MemTotal 262144 MiB, less 239616 MiB of huge pages)"),
    "unreadable_huge_page_pools_count_as_none": Case(
        Machine(memory_max=str(200 * GIB), node_memory_kb=NODE_KB,
                node_hugepages={1048576: "100", 2048: None, 16777216: "many"}),
        {"INFERTUNE_NUMA_POLICY": "node:0"}, ("--cpunodebind=0", "--preferred=0"),
        {"level": "info"}, "above node 0's 159744 MiB (MemTotal 262144 MiB, less 102400 MiB of "
        "huge pages)"),
    "huge_page_pools_that_reserve_nothing_change_nothing": Case(
        Machine(memory_max=str(NODE_KB * 1024), node_memory_kb=NODE_KB,
                node_hugepages={1048576: "0", 2048: "0"}),
        {"INFERTUNE_NUMA_POLICY": "node:0"}, ("--cpunodebind=0", "--membind=0"),
        {"level": "info"}),
    "strict_binds_memory_above_what_huge_pages_leave_and_warns": Case(
        Machine(memory_max=str(200 * GIB), node_memory_kb=NODE_KB, node_hugepages=HUGE_234_GIB),
        {"INFERTUNE_NUMA_POLICY": "node:0", "INFERTUNE_NUMA_STRICT": "true"},
        ("--cpunodebind=0", "--membind=0"), {"level": "warning", "action": "bind"},
        "memory bound to node 0 all the same (strict): the container's memory limit of 204800 "
        "MiB (memory.max) is above node 0's 22528 MiB (MemTotal 262144 MiB, less 239616 MiB of "
        "huge pages), so the kernel OOM-kills the command when node 0 is full"),
}


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_dry_run_argv_and_log(shell: list[str], case: Case, tmp_path: Path) -> None:
    case.machine.build(tmp_path)
    result = launch(shell, tmp_path, case.env, "--dry-run", "--", *COMMAND)
    assert result.returncode == 0, result.stderr
    expected = COMMAND if case.options is None else bound(tmp_path, *case.options)
    assert result.argv == expected
    assert result.log.items() >= case.log.items(), result.log
    assert case.reason in result.log["reason"]


MIG_UUID = "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"


def nvidia_smi_listing(root: Path, listing: str, hang: int = 0,
                       ignores_term: bool = False) -> str:
    """An `nvidia-smi -L` that prints `listing` (NVIDIA's documented format), after `hang`
    seconds, ignoring SIGTERM if asked: the test machine has no GPU, so the launcher is
    pointed at it through INFERTUNE_NVIDIA_SMI."""
    script = root / "bin/nvidia-smi"
    trap = "trap '' TERM" if ignores_term else ""
    write(script, f"#!/bin/sh\n[ \"$1\" = -L ] || exit 2\n{trap}\n"
                  f"{f'sleep {hang}' if hang else ''}\ncat <<'EOF'\n{listing}EOF\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("names", [(GPU1.uuid,), ("1", "2"), (f"MIG-{GPU1.uuid}/1/0",), ("all",)],
                         ids=["uuid", "indices", "mig", "all"])
def test_volume_mounts_device_list_names_the_gpus_by_file_names(
        shell: list[str], names: tuple[str, ...], tmp_path: Path) -> None:
    """The device plugin's volume-mounts strategy sets NVIDIA_VISIBLE_DEVICES to
    /var/run/nvidia-container-devices and mounts /dev/null at <that>/<device id>
    (k8s-device-plugin internal/plugin/server.go, getAllocateResponse)."""
    Machine(gpus=(GPU0, GPU1, GPU2)).build(tmp_path)
    devices = tmp_path / "var/run/nvidia-container-devices"
    for name in names:
        (devices / name).parent.mkdir(parents=True, exist_ok=True)
        (devices / name).touch()
    result = launch(shell, tmp_path, {"NVIDIA_VISIBLE_DEVICES": str(devices),
                                      "INFERTUNE_NUMA_STRICT": "true"},
                    "--dry-run", "--", *COMMAND)
    assert result.returncode == 0, result.stderr
    assert result.argv == bound(tmp_path, "--cpunodebind=1", "--membind=1")
    assert f"GPUs from the file names in {devices}" in result.log["reason"]


@pytest.mark.parametrize("shell", SHELLS)
def test_an_empty_device_list_directory_falls_back_to_the_device_nodes(
        shell: list[str], tmp_path: Path) -> None:
    Machine(gpus=(GPU0, GPU1), dev_minors=(1,)).build(tmp_path)
    devices = tmp_path / "var/run/nvidia-container-devices"
    devices.mkdir(parents=True)
    result = launch(shell, tmp_path, {"NVIDIA_VISIBLE_DEVICES": str(devices)},
                    "--dry-run", "--", *COMMAND)
    assert result.argv == bound(tmp_path, "--cpunodebind=1", "--membind=1")
    assert f"({devices} names no device)" in result.log["reason"]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_current_mig_uuid_is_placed_by_the_gpu_nvidia_smi_lists_it_under(
        shell: list[str], tmp_path: Path) -> None:
    """Drivers since R470 name MIG devices MIG-<uuid>, without their GPU's UUID: the launcher
    ran such pods unbound (or failed them with strict)."""
    Machine(gpus=(GPU0, GPU1)).build(tmp_path)
    smi = nvidia_smi_listing(tmp_path, (
        f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {GPU0.uuid})\n"
        "  MIG 3g.20gb     Device  0: (UUID: MIG-11111111-2222-3333-4444-555555555555)\n"
        f"GPU 1: NVIDIA A100-SXM4-40GB (UUID: {GPU1.uuid})\n"
        f"  MIG 1g.5gb      Device  0: (UUID: {MIG_UUID})\n"))
    result = launch(shell, tmp_path, {"NVIDIA_VISIBLE_DEVICES": MIG_UUID,
                                      "INFERTUNE_NVIDIA_SMI": smi}, "--dry-run", "--", *COMMAND)
    assert result.returncode == 0, result.stderr
    assert result.argv == bound(tmp_path, "--cpunodebind=1", "--membind=1")
    unknown = launch(shell, tmp_path, {"NVIDIA_VISIBLE_DEVICES": "MIG-not-listed",
                                       "INFERTUNE_NVIDIA_SMI": smi}, "--dry-run", "--", *COMMAND)
    assert unknown.argv == COMMAND and unknown.log["action"] == "unbound"
    assert "MIG-not-listed: its GPU is unknown" in unknown.log["reason"]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("ignores_term", [False, True], ids=["stops_on_term", "ignores_term"])
def test_a_hung_nvidia_smi_is_given_up_on(shell: list[str], ignores_term: bool,
                                          tmp_path: Path) -> None:
    """`nvidia-smi -L` ran without a time limit: a hung driver held the container's start for
    ever. Out of time, the MIG device's GPU is not known. After TERM, timeout waits for its
    child: one that ignored TERM held the start as long as it hung."""
    Machine(gpus=(GPU0, GPU1)).build(tmp_path)
    smi = nvidia_smi_listing(tmp_path, (
        f"GPU 1: NVIDIA A100-SXM4-40GB (UUID: {GPU1.uuid})\n"
        f"  MIG 1g.5gb      Device  0: (UUID: {MIG_UUID})\n"), hang=8, ignores_term=ignores_term)
    started = time.monotonic()
    result = launch(shell, tmp_path, {"NVIDIA_VISIBLE_DEVICES": MIG_UUID,
                                      "INFERTUNE_NVIDIA_SMI": smi,
                                      "INFERTUNE_NVIDIA_SMI_TIMEOUT": "1"},
                    "--dry-run", "--", *COMMAND)
    assert time.monotonic() - started < 5
    assert result.argv == COMMAND and result.log["action"] == "unbound"
    assert (f"{MIG_UUID}: its GPU is unknown (not in nvidia-smi -L, no nvidia-smi, or no "
            "answer from it within 1s)") in result.log["reason"]


@pytest.mark.parametrize("shell", SHELLS)
def test_nvidia_smi_is_asked_once_for_every_mig_device(shell: list[str], tmp_path: Path) -> None:
    """It was run once per MIG-<uuid>, so a hung driver held the start a timeout per device."""
    Machine(gpus=(GPU0, GPU1)).build(tmp_path)
    others = [f"MIG-{n}1111111-2222-3333-4444-555555555555" for n in (7, 8)]
    smi = nvidia_smi_listing(tmp_path, (
        f"GPU 1: NVIDIA A100-SXM4-40GB (UUID: {GPU1.uuid})\n"
        + "".join(f"  MIG 1g.5gb      Device  {i}: (UUID: {u})\n"
                  for i, u in enumerate([MIG_UUID, *others]))))
    calls = tmp_path / "calls"
    counting = tmp_path / "bin/counting-nvidia-smi"
    write(counting, f"#!/bin/sh\necho called >> {calls}\nexec {smi} \"$@\"\n")
    counting.chmod(0o755)
    result = launch(shell, tmp_path, {"NVIDIA_VISIBLE_DEVICES": ",".join([MIG_UUID, *others]),
                                      "INFERTUNE_NVIDIA_SMI": str(counting)},
                    "--dry-run", "--", *COMMAND)
    assert result.argv == bound(tmp_path, "--cpunodebind=1", "--membind=1"), result.stderr
    assert calls.read_text().count("called") == 1


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(("value", "seconds"), [("00", 5), ("0", 5), ("007", 7), ("1.5", 5),
                                                ("-3", 5), ("", 5), ("soon", 5),
                                                ("99999", 99999), ("100000", 5),
                                                ("99999999999999999999", 5)])
def test_the_nvidia_smi_time_limit_is_whole_seconds_above_zero(
        shell: list[str], value: str, seconds: int, tmp_path: Path) -> None:
    """timeout reads 0 as no limit: 00 passed the check for 0 and turned the limit off; and
    busybox's refuses a number past its range, so nvidia-smi never ran."""
    Machine(gpus=(GPU0, GPU1)).build(tmp_path)
    smi = nvidia_smi_listing(tmp_path, f"GPU 1: NVIDIA A100-SXM4-40GB (UUID: {GPU1.uuid})\n")
    result = launch(shell, tmp_path, {"NVIDIA_VISIBLE_DEVICES": MIG_UUID,
                                      "INFERTUNE_NVIDIA_SMI": smi,
                                      "INFERTUNE_NVIDIA_SMI_TIMEOUT": value},
                    "--dry-run", "--", *COMMAND)
    assert f"no answer from it within {seconds}s)" in result.log["reason"]


def busybox_timeout_before_1_30(root: Path) -> Path:
    """A directory holding a `timeout` with busybox's syntax before 1.30, `timeout [-t SECS]
    [-s SIG] PROG ARGS` (SECS 10 by default): `timeout 5 nvidia-smi -L` runs a program named
    5 (coreutils/timeout.c of busybox 1.29)."""
    script = root / "busybox-1.29/timeout"
    write(script, "#!/bin/sh\nsecs=10 sig=TERM\nwhile :; do case $1 in\n"
                  "-t) secs=$2; shift 2 ;;\n-s) sig=$2; shift 2 ;;\n*) break ;;\nesac; done\n"
                  'exec /usr/bin/timeout -s "$sig" "$secs" "$@"\n')
    script.chmod(0o755)
    return script.parent


@pytest.mark.skipif(not Path("/usr/bin/timeout").exists(), reason="needs coreutils timeout")
@pytest.mark.parametrize("shell", SHELLS)
def test_a_busybox_timeout_before_1_30_is_given_its_own_syntax(shell: list[str],
                                                               tmp_path: Path) -> None:
    """Given SECS first, busybox before 1.30 ran SECS as the program: nvidia-smi never ran,
    and every MIG-<uuid> device counted as having no GPU."""
    Machine(gpus=(GPU0, GPU1)).build(tmp_path)
    old = busybox_timeout_before_1_30(tmp_path)
    listing = (f"GPU 1: NVIDIA A100-SXM4-40GB (UUID: {GPU1.uuid})\n"
               f"  MIG 1g.5gb      Device  0: (UUID: {MIG_UUID})\n")
    env = {"NVIDIA_VISIBLE_DEVICES": MIG_UUID, "PATH": f"{old}:/usr/bin:/bin",
           "INFERTUNE_NVIDIA_SMI": nvidia_smi_listing(tmp_path, listing),
           "INFERTUNE_NVIDIA_SMI_TIMEOUT": "1"}
    result = launch(shell, tmp_path, env, "--dry-run", "--", *COMMAND)
    assert result.argv == bound(tmp_path, "--cpunodebind=1", "--membind=1"), result.stderr
    env["INFERTUNE_NVIDIA_SMI"] = nvidia_smi_listing(tmp_path, listing, hang=8,
                                                     ignores_term=True)
    started = time.monotonic()
    hung = launch(shell, tmp_path, env, "--dry-run", "--", *COMMAND)
    assert time.monotonic() - started < 5
    assert hung.argv == COMMAND and "no answer from it within 1s" in hung.log["reason"]


@pytest.mark.parametrize("shell", SHELLS)
def test_visible_devices_are_not_file_name_patterns(shell: list[str], tmp_path: Path) -> None:
    """NVIDIA_VISIBLE_DEVICES was split with pathname expansion on: GPU-* named a file of
    that name in the working directory, and the command was bound to that GPU's node."""
    Machine(gpus=(GPU0, GPU1)).build(tmp_path)
    work = tmp_path / "work"
    write(work / GPU1.uuid, "")
    result = launch(shell, tmp_path, {"NVIDIA_VISIBLE_DEVICES": "GPU-*"},
                    "--dry-run", "--", *COMMAND, cwd=work)
    assert result.argv == COMMAND and result.log["action"] == "unbound"
    assert "GPU-* is not in" in result.log["reason"]


STRICT_FAILURES = {
    "gpu_without_numa_node_on_two_nodes": (Machine(gpus=(GPU_NO_NODE,)),
                                           {"NVIDIA_VISIBLE_DEVICES": GPU_NO_NODE.uuid},
                                           "numa_node -1"),
    "node_outside_cpuset": (Machine(cpuset="0-7"), {"INFERTUNE_NUMA_POLICY": "node:1"},
                            "outside the allowed cpuset 0-7"),
    "missing_node": (Machine(), {"INFERTUNE_NUMA_POLICY": "node:3"}, "node 3 does not exist"),
    "no_gpu": (Machine(), {}, "NVIDIA_VISIBLE_DEVICES is unset"),
    "cdi_without_gpu_devices": (Machine(gpus=(GPU1,)), {"NVIDIA_VISIBLE_DEVICES": "void"},
                                "no nvidia<N> device in "),
}


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(("machine", "env", "reason"), STRICT_FAILURES.values(),
                         ids=STRICT_FAILURES.keys())
def test_strict_failure_exits_78_with_the_reason(shell: list[str], machine: Machine,
                                                 env: dict[str, str], reason: str,
                                                 tmp_path: Path) -> None:
    machine.build(tmp_path)
    for args in (("--dry-run", "--", *COMMAND), ("--", "touch", str(tmp_path / "ran"))):
        result = launch(shell, tmp_path, {**env, "INFERTUNE_NUMA_STRICT": "true"}, *args)
        assert result.returncode == 78
        assert result.argv is None
        assert result.log["level"] == "error" and result.log["action"] == "fail"
        assert reason in result.log["reason"]
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("strict", ["false", "true"])
def test_missing_numactl_runs_unbound_unless_strict(shell: list[str], strict: str,
                                                    tmp_path: Path) -> None:
    Machine(gpus=(GPU1,)).build(tmp_path)
    env = {"NVIDIA_VISIBLE_DEVICES": GPU1.uuid, "INFERTUNE_NUMA_STRICT": strict}
    result = launch(shell, tmp_path, env, "--", "sh", "-c", "echo ran",
                    numactl=str(tmp_path / "no/numactl"))
    assert "numactl not found" in result.log["reason"]
    if strict == "true":
        assert (result.returncode, result.argv, result.log["action"]) == (78, None, "fail")
    else:
        assert (result.returncode, result.argv, result.log["action"]) == (0, ["ran"], "unbound")
        assert result.log["level"] == "warning"


@pytest.mark.parametrize("shell", SHELLS)
def test_numactl_that_refuses_the_binding_falls_back(shell: list[str], tmp_path: Path) -> None:
    Machine().build(tmp_path)
    refusing = tmp_path / "bin/refusing-numactl"
    write(refusing, "#!/bin/sh\necho 'set_mempolicy: Operation not permitted' >&2\nexit 1\n")
    refusing.chmod(0o755)
    result = launch(shell, tmp_path, {"INFERTUNE_NUMA_POLICY": "node:0"}, "--", "echo", "ran",
                    numactl=str(refusing))
    assert (result.returncode, result.argv, result.log["action"]) == (0, ["ran"], "unbound")
    assert "refused: set_mempolicy: Operation not permitted" in result.log["reason"]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("strict", ["false", "true"])
@pytest.mark.parametrize("memory_max", [None, "max"], ids=["membind", "preferred"])
def test_memory_binding_refused_binds_the_cpus_only_unless_strict(
        shell: list[str], strict: str, memory_max: str | None, tmp_path: Path) -> None:
    """A seccomp profile such as RuntimeDefault refuses the memory policy calls without
    CAP_SYS_NICE, not CPU binding: the CPUs are still bound (memory is then local by the
    kernel's default policy), unless strict asks for the whole binding. The memory guarantee
    is gone, so it is said at level warning."""
    Machine(memory_max=memory_max, node_memory_kb=NODE_KB).build(tmp_path)
    numactl = tmp_path / "bin/memory-refusing-numactl"
    write(numactl, "#!/bin/sh\ncase \"$*\" in *--membind* | *--preferred*) echo 'set_mempolicy: "
                   "Operation not permitted' >&2; exit 1 ;; esac\necho numactl \"$@\"\n")
    numactl.chmod(0o755)
    result = launch(shell, tmp_path, {"INFERTUNE_NUMA_POLICY": "node:0",
                                      "INFERTUNE_NUMA_STRICT": strict}, "--",
                    "echo", "ran", numactl=str(numactl))
    if strict == "true":
        assert (result.returncode, result.log["action"]) == (78, "fail")
        assert "refused: set_mempolicy: Operation not permitted" in result.log["reason"]
        return
    assert result.returncode == 0 and result.log["action"] == "bind"
    assert result.log["level"] == "warning"
    assert result.argv == ["numactl", "--cpunodebind=0", "--", "echo", "ran"]
    assert "need CAP_SYS_NICE" in result.log["reason"]
    assert "CPUs bound only" in result.log["reason"]
    assert "memory preferred" not in result.log["reason"]


@pytest.mark.parametrize("shell", SHELLS)
def test_the_trial_run_has_the_memory_option_of_the_exec(shell: list[str],
                                                          tmp_path: Path) -> None:
    Machine(memory_max="max", node_memory_kb=NODE_KB).build(tmp_path)
    calls = tmp_path / "numactl-calls"
    numactl = tmp_path / "bin/recording-numactl"
    write(numactl, f'#!/bin/sh\nprintf "%s\\n" "$*" >> {shlex.quote(str(calls))}\n')
    numactl.chmod(0o755)
    result = launch(shell, tmp_path, {"INFERTUNE_NUMA_POLICY": "node:0"}, "--", "echo", "ran",
                    numactl=str(numactl))
    assert result.returncode == 0 and result.log["action"] == "bind", result.stderr
    assert calls.read_text().splitlines() == ["--cpunodebind=0 --preferred=0 -- /bin/sh -c :",
                                              "--cpunodebind=0 --preferred=0 -- echo ran"]


def execing_numactl(root: Path) -> str:
    """A numactl that execs the command after `--`, and exits 1 when that cannot work, as
    numactl does when its execvp fails ("numactl: execution of `x': No such file or
    directory", status 1)."""
    script = root / "bin/execing-numactl"
    write(script, '#!/bin/sh\nwhile [ "$1" != -- ]; do shift; done\nshift\n'
                  'case $1 in */*) [ -f "$1" ] && [ -x "$1" ] || exit 1 ;;\n'
                  '*) command -v "$1" >/dev/null || exit 1 ;; esac\nexec "$@"\n')
    script.chmod(0o755)
    return str(script)


# what sh's exec exits with when it cannot run the command (both dash and bash --posix)
ENGINE_FAILURES = {
    "missing_name": ("no-such-engine", 127, "not found"),
    "missing_path": ("{root}/no/engine", 127, "not found"),
    "non_executable_file": ("{root}/engine.txt", 126, "not an executable file"),
    "non_executable_file_in_path": ("engine.txt", 126, "not an executable file"),
    "directory": ("{root}/bin", 126, "not an executable file"),
}


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("policy", ["none", "node:0", "interleave", "node:9"])
@pytest.mark.parametrize(("engine", "status", "reason"), ENGINE_FAILURES.values(),
                         ids=ENGINE_FAILURES.keys())
def test_an_engine_that_cannot_run_exits_as_sh_would_bound_or_not(
        shell: list[str], policy: str, engine: str, status: int, reason: str,
        tmp_path: Path) -> None:
    """Under numactl a failed exec exits 1, unbound sh exits 127 or 126: the launcher checks
    the command first, so the status does not depend on the binding."""
    Machine().build(tmp_path)
    write(tmp_path / "engine.txt", "#!/bin/sh\necho ran\n")
    command = engine.format(root=tmp_path)
    env = {"INFERTUNE_NUMA_POLICY": policy, "PATH": f"{tmp_path}:/usr/bin:/bin"}
    result = launch(shell, tmp_path, env, "--", command, "serve",
                    numactl=execing_numactl(tmp_path))
    unwrapped = subprocess.run([*shell, "-c", 'exec "$@"', "sh", command], env=env,
                               capture_output=True, timeout=30, check=False)
    assert result.returncode == unwrapped.returncode == status, result.stderr
    if policy in ("node:0", "interleave"):  # to be bound: said before numactl would exec it
        assert (result.log["level"], result.log["action"]) == ("error", "fail")
        assert f"{command}: {reason} (exit {status})" in result.log["reason"]
    else:  # unbound, sh's own exec says it, as without the launcher
        assert result.log["action"] != "fail"


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("policy", ["none", "node:0"])
def test_a_command_found_through_an_empty_path_element_runs(shell: list[str], policy: str,
                                                            tmp_path: Path) -> None:
    """sh and execvp read an empty PATH element (here a trailing one, from PATH=$PATH:$EXTRA
    with EXTRA empty) as the current directory; split on ":", it was dropped, and the
    launcher exited 127 at every start for a command sh runs."""
    Machine().build(tmp_path)
    engine = tmp_path / "work/engine"
    write(engine, "#!/bin/sh\necho engine ran\n")
    engine.chmod(0o755)
    full_env = {"PATH": "/usr/bin:/bin:", "INFERTUNE_SYSFS_ROOT": str(tmp_path),
                "INFERTUNE_PROCFS_ROOT": str(tmp_path), "INFERTUNE_DEVFS_ROOT": str(tmp_path),
                "INFERTUNE_NUMACTL": execing_numactl(tmp_path), "INFERTUNE_NUMA_POLICY": policy}
    done = subprocess.run([*shell, str(LAUNCHER), "--", "engine"], env=full_env,
                          cwd=engine.parent, capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 0 and "engine ran" in done.stdout, done.stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_an_engine_found_later_in_path_runs_bound(shell: list[str], tmp_path: Path) -> None:
    """sh and execvp skip a non-executable file of the same name earlier in PATH."""
    Machine().build(tmp_path)
    write(tmp_path / "shadow/echo", "not a program\n")
    result = launch(shell, tmp_path, {"INFERTUNE_NUMA_POLICY": "node:0",
                                      "PATH": f"{tmp_path}/shadow:/usr/bin:/bin"},
                    "--", "echo", "ran", numactl=execing_numactl(tmp_path))
    assert (result.returncode, result.argv, result.log["action"]) == (0, ["ran"], "bind")


@pytest.mark.parametrize("shell", SHELLS)
def test_a_strict_failure_keeps_exit_78_when_the_engine_is_missing_too(
        shell: list[str], tmp_path: Path) -> None:
    Machine().build(tmp_path)
    result = launch(shell, tmp_path, {"INFERTUNE_NUMA_POLICY": "node:9",
                                      "INFERTUNE_NUMA_STRICT": "true"}, "--", "no-such-engine")
    assert result.returncode == 78 and "node 9 does not exist" in result.log["reason"]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("args", [(), ("--dry-run",), ("vllm",), ("--", ), ("--dry-run", "x")])
def test_usage_errors_exit_64(shell: list[str], args: tuple[str, ...], tmp_path: Path) -> None:
    done = subprocess.run([*shell, str(LAUNCHER), *args], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 64
    assert "usage: infertune-launch [--dry-run] -- command args..." in done.stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_dry_run_quotes_every_argument_so_the_shell_reads_it_back(shell: list[str],
                                                                  tmp_path: Path) -> None:
    Machine().build(tmp_path)
    odd = ["echo", "it's", "a b", "", "$HOME", 'say "hi"', "*", "--x=1", "ends\n\n", "''",
           "a'b'c"]
    result = launch(shell, tmp_path, {"INFERTUNE_NUMA_POLICY": "none"}, "--dry-run", "--", *odd)
    assert result.argv == odd


def test_launcher_is_posix_sh_that_parses() -> None:
    assert LAUNCHER.read_text().startswith("#!/bin/sh\n")
    assert os.access(LAUNCHER, os.X_OK)
    for shell in ("sh", "dash", "bash"):
        if shutil.which(shell):
            subprocess.run([shell, "-n", str(LAUNCHER)], check=True)


# ---- the real numactl on this machine's /sys -----------------------------------------------


def expand(cpulist: str) -> set[int]:
    cpus: set[int] = set()
    for part in cpulist.strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


real_numactl = pytest.mark.skipif(
    shutil.which("numactl") is None
    or not Path("/sys/devices/system/node/node0/cpulist").exists(),
    reason="needs numactl, and a kernel that shows NUMA node 0 in /sys")


def _launch_on_node_0(shell: list[str], preexec_fn: Callable[[], None] | None = None,
                      fake_root: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real launcher with policy node:0 (not strict), running a command that prints the
    CPUs it may run on and its numactl policy; the launcher reads fake_root's sys/ and proc/
    when given, numactl the kernel all the same."""
    report = "grep Cpus_allowed_list /proc/self/status; numactl --show"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "INFERTUNE_NUMA_POLICY": "node:0",
           "INFERTUNE_NUMA_STRICT": "false"}
    if fake_root is not None:
        env |= {"INFERTUNE_SYSFS_ROOT": str(fake_root), "INFERTUNE_PROCFS_ROOT": str(fake_root),
                "INFERTUNE_DEVFS_ROOT": str(fake_root)}
    done = subprocess.run([*shell, str(LAUNCHER), "--", "sh", "-c", report], env=env,
                          capture_output=True, text=True, timeout=60, check=False,
                          preexec_fn=preexec_fn)
    assert done.returncode == 0, done.stderr
    return done


def _assert_on_node_0_cpus(done: subprocess.CompletedProcess[str]) -> None:
    """The command ran on node 0's CPUs that this process may use."""
    node0 = expand(Path("/sys/devices/system/node/node0/cpulist").read_text())
    allowed = expand(re.search(r"Cpus_allowed_list:\s*(\S+)",
                               Path("/proc/self/status").read_text())[1])  # type: ignore[index]
    seen = re.search(r"Cpus_allowed_list:\s*(\S+)", done.stdout)
    assert seen is not None, done.stdout
    assert expand(seen[1]) == node0 & allowed


@real_numactl
@pytest.mark.parametrize("shell", SHELLS)
def test_real_numactl_binds_to_node_0(shell: list[str]) -> None:
    done = _launch_on_node_0(shell)
    refused = "Operation not permitted" in done.stderr  # the kernel's word, not ours
    if refused and "action=unbound" in done.stderr:
        pytest.skip(f"the kernel refused the binding here: {done.stderr.strip()}")
    assert "action=bind" in done.stderr, done.stderr
    _assert_on_node_0_cpus(done)
    if refused:  # the memory policy calls (without CAP_SYS_NICE under seccomp): CPUs only
        pytest.skip(f"the kernel refused the memory policy here: {done.stderr.strip()}")
    # "membind: 0" alone is also what an unbound process shows on a one-node machine.
    assert re.search(r"^policy: bind\s*$", done.stdout, re.MULTILINE), done.stdout
    assert re.search(r"^membind: 0\s*$", done.stdout, re.MULTILINE), done.stdout


@real_numactl
@pytest.mark.parametrize("shell", SHELLS)
def test_real_numactl_with_a_missing_engine_exits_127_as_unbound(shell: list[str]) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "INFERTUNE_NUMA_POLICY": "node:0"}
    done = subprocess.run([*shell, str(LAUNCHER), "--", "no-such-engine"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 127, done.stderr


@real_numactl
@pytest.mark.parametrize("shell", SHELLS)
def test_real_numactl_prefers_node_0_memory_under_a_larger_limit(shell: list[str],
                                                                 tmp_path: Path) -> None:
    """This machine's node 0, seen by the launcher with no memory limit above it: the real
    numactl takes --cpunodebind with --preferred, in the trial and the exec."""
    cpus = Path("/sys/devices/system/node/node0/cpulist").read_text().strip()
    Machine(nodes={0: cpus}, cpuset=None, mems="0", status_cpus=cpus, memory_max="max",
            node_memory_kb=NODE_KB).build(tmp_path)
    done = _launch_on_node_0(shell, fake_root=tmp_path)
    if "Operation not permitted" in done.stderr:
        pytest.skip(f"the kernel refused the memory policy here: {done.stderr.strip()}")
    assert "action=bind" in done.stderr and "memory preferred on node 0" in done.stderr, \
        done.stderr
    _assert_on_node_0_cpus(done)
    assert re.search(r"^policy: preferred\s*$", done.stdout, re.MULTILINE), done.stdout
    assert re.search(r"^preferred node: 0\s*$", done.stdout, re.MULTILINE), done.stdout


def _deny_memory_policy() -> None:
    """In the child: the rule of the runtimes' default seccomp profile for a container
    without CAP_SYS_NICE (containerd contrib/seccomp/seccomp_default.go: get_mempolicy, mbind
    and set_mempolicy are allowed only with that capability)."""
    import errno

    import pyseccomp as seccomp

    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in ("get_mempolicy", "mbind", "set_mempolicy"):
        rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
    rules.load()


@real_numactl
@pytest.mark.parametrize("shell", SHELLS)
def test_real_numactl_under_a_seccomp_filter_without_sys_nice_binds_the_cpus(
        shell: list[str]) -> None:
    # A reason CI (INFERTUNE_REQUIRE_COMPONENTS=1) turns into a failure: it is a test extra.
    pytest.importorskip("pyseccomp", reason="needs pyseccomp (pip install -e '.[test]')")
    done = _launch_on_node_0(shell, _deny_memory_policy)
    assert "action=bind" in done.stderr and "CPUs bound only" in done.stderr, done.stderr
    _assert_on_node_0_cpus(done)
    assert re.search(r"^policy: default\s*$", done.stdout, re.MULTILINE), done.stdout


@real_numactl
@pytest.mark.parametrize("shell", SHELLS)
def test_the_binding_trial_does_not_look_for_sh_in_path(shell: list[str],
                                                       tmp_path: Path) -> None:
    """numactl tried the binding on `sh` found through PATH: a PATH without sh (the engine's
    own bin directory) read as the kernel refusing the binding, and the container ran
    unbound (with strict, it exited 78)."""
    Machine().build(tmp_path)
    tools = tmp_path / "tools"
    tools.mkdir()
    for directory in ("/bin", "/usr/bin"):  # every tool the image may have but sh
        for tool in Path(directory).iterdir():
            if tool.name != "sh" and not (tools / tool.name).exists():
                (tools / tool.name).symlink_to(tool)
    program = shutil.which(shell[0])
    assert program is not None
    result = launch([program, *shell[1:]], tmp_path, {
        "INFERTUNE_NUMA_POLICY": "node:0", "INFERTUNE_NUMA_STRICT": "true",
        "PATH": str(tools)}, "--", "printf", "ran", numactl=shutil.which("numactl"))
    assert (result.returncode, result.log["action"]) == (0, "bind"), result.stderr


JEMALLOC = next(iter(sorted(Path("/usr/lib").glob("*/libjemalloc.so.2"))),
                Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"))
"""The Debian package's library, on this machine's architecture."""


@real_numactl
@pytest.mark.skipif(not JEMALLOC.exists(), reason=f"{JEMALLOC} is absent (apt install "
                    "libjemalloc2)")
@pytest.mark.parametrize("shell", DASH)
def test_only_the_command_gets_the_preloaded_allocator(shell: list[str]) -> None:
    """The webhook's LD_PRELOAD and MALLOC_CONF reached every tool the launcher runs: with
    stats_print:true, six statistics reports instead of the command's one (with prof_final,
    a heap profile each in the engine's directory). Under dash only: bash forks its subshells
    with the allocator loaded at its own start, and they run its exit handlers, so the tools'
    own reports are gone and theirs stay (docs/launcher.md)."""
    report = 'echo "preload=$LD_PRELOAD conf=$MALLOC_CONF"; /bin/true'
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "INFERTUNE_NUMA_POLICY": "node:0",
           "INFERTUNE_NUMA_STRICT": "false", "LD_PRELOAD": str(JEMALLOC),
           "MALLOC_CONF": "stats_print:true"}
    done = subprocess.run([*shell, str(LAUNCHER), "--", "sh", "-c", report], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert f"preload={JEMALLOC} conf=stats_print:true" in done.stdout
    # /bin/true's, which exits (a shell may leave without running exit handlers); the
    # launcher's shell and numactl exec, so never theirs.
    assert done.stderr.count("Begin jemalloc statistics") == 1, done.stderr[:2000]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_preload_the_image_does_not_have_is_left_out_and_said(shell: list[str],
                                                                 tmp_path: Path) -> None:
    """The default libjemalloc path is Debian's on amd64: on an arm64 or RHEL image ld.so
    printed an error in every process of the container, and nothing said why."""
    Machine().build(tmp_path)
    present = tmp_path / "lib/libother.so"
    write(present, "")
    missing = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2.absent"
    shown = 'echo "preload=${LD_PRELOAD-unset} conf=$MALLOC_CONF"'
    result = launch(shell, tmp_path, {"INFERTUNE_NUMA_POLICY": "none",
                                      "LD_PRELOAD": f"{missing}:/usr/$LIB/x.so {present}",
                                      "MALLOC_CONF": "narenas:2"}, "--", "sh", "-c", shown)
    assert result.returncode == 0, result.stderr
    assert result.log["level"] == "warning"
    assert (f"LD_PRELOAD names {missing}, which this image does not have: left out, the "
            "command runs with the default allocator") in result.log["reason"]
    alone = launch(shell, tmp_path, {"INFERTUNE_NUMA_POLICY": "none", "LD_PRELOAD": missing},
                   "--", "sh", "-c", shown)
    assert alone.log["level"] == "warning"
    done = subprocess.run(
        [*shell, str(LAUNCHER), "--", "sh", "-c", shown], capture_output=True, text=True,
        check=True, env={"PATH": "/usr/bin:/bin", "INFERTUNE_NUMA_POLICY": "none",
                         "LD_PRELOAD": f"{missing}:/usr/$LIB/x.so {present}",
                         "MALLOC_CONF": "narenas:2"})
    assert f"preload=/usr/$LIB/x.so:{present} conf=narenas:2" in done.stdout
    done = subprocess.run(
        [*shell, str(LAUNCHER), "--", "sh", "-c", shown], capture_output=True, text=True,
        check=True, env={"PATH": "/usr/bin:/bin", "INFERTUNE_NUMA_POLICY": "none",
                         "LD_PRELOAD": missing})
    # Said by ld.so once, for the launcher's own shell, started with it; before, once more
    # for each tool the launcher ran and for the command.
    assert "preload=unset" in done.stdout and done.stderr.count("cannot be preloaded") == 1


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("kept", ["lib/libtcmalloc_minimal.so.4", "opt/lib/libjemalloc.so.2"])
def test_a_missing_preload_names_the_allocator_left_in_its_place(shell: list[str], kept: str,
                                                                 tmp_path: Path) -> None:
    """The note said the command ran with the default allocator while another allocator of
    LD_PRELOAD was kept and served the allocations."""
    Machine().build(tmp_path)
    write(tmp_path / "lib/libother.so", "")
    write(tmp_path / kept, "")
    missing = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2.absent"
    preload = f"{missing}:{tmp_path}/lib/libother.so:{tmp_path}/{kept}"
    result = launch(shell, tmp_path, {"INFERTUNE_NUMA_POLICY": "none", "LD_PRELOAD": preload},
                    "--", "true")
    assert result.log["level"] == "warning"
    assert (f"left out, the command runs with {tmp_path}/{kept}, which LD_PRELOAD also names "
            "(set spec.allocator.libraryPath") in result.log["reason"]
