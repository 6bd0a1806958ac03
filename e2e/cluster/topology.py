"""Simulated node topology: a small YAML file turned into Node objects for kwok to run.

Schema (documented with an example in README.md)::

    nodes:
      - name: h200-0            # required; with count > 1 the names are h200-0-0, h200-0-1, ...
        count: 1                # optional, identical nodes
        cpu: "64"               # capacity == allocatable
        memory: 1Ti
        pods: 110
        gpu:                    # optional; GPU Feature Discovery labels + nvidia.com/gpu
          product: NVIDIA-H200
          count: 8              # nvidia.com/gpu.count
          memoryMiB: 143771     # nvidia.com/gpu.memory
          migCapable: true      # nvidia.com/mig.capable
          migStrategy: mixed    # optional nvidia.com/mig.strategy
          allocatable: 8        # optional nvidia.com/gpu capacity, default = count
        resources:              # optional extra extended resources, e.g. MIG slices
          nvidia.com/mig-3g.71gb: 16
        labels: {}
        taints: [{key: k, value: v, effect: NoSchedule}]
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

DEFAULT_NODES_FILE = Path(__file__).resolve().parent / "nodes" / "default.yaml"
# kwok manages exactly the nodes carrying this annotation (see stages.py).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"


class TopologyError(ValueError):
    """The node topology file is malformed; the message names the file and field."""


@dataclass(frozen=True)
class GpuSpec:
    product: str
    count: int
    memory_mib: int | None = None
    mig_capable: bool = False
    mig_strategy: str | None = None
    allocatable: int | None = None


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpu: str = "32"
    memory: str = "256Gi"
    pods: int = 110
    gpu: GpuSpec | None = None
    resources: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()


def load_topology(path: Path) -> list[NodeSpec]:
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise TopologyError(f"{path}: cannot read node topology: {error}") from error
    if not isinstance(document, dict) or not isinstance(document.get("nodes"), list):
        raise TopologyError(f"{path}: expected a mapping with a list under `nodes`")
    specs: list[NodeSpec] = []
    for index, entry in enumerate(document["nodes"]):
        specs.extend(_parse_node(entry, f"{path}: nodes[{index}]"))
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TopologyError(f"{path}: duplicate node names {duplicates}")
    if not specs:
        raise TopologyError(f"{path}: `nodes` is empty; the scheduler would have nowhere to go")
    return specs


def node_manifest(spec: NodeSpec) -> dict[str, Any]:
    """The Node object to create; its status carries the simulated capacity."""
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    resources: dict[str, str] = {"cpu": spec.cpu, "memory": spec.memory, "pods": str(spec.pods)}
    if spec.gpu is not None:
        labels |= _gpu_feature_discovery_labels(spec.gpu)
        gpus = spec.gpu.count if spec.gpu.allocatable is None else spec.gpu.allocatable
        resources["nvidia.com/gpu"] = str(gpus)
    labels |= spec.labels
    resources |= spec.resources
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE},
        },
        "spec": {"taints": [dict(t) for t in spec.taints]} if spec.taints else {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def _gpu_feature_discovery_labels(gpu: GpuSpec) -> dict[str, str]:
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": gpu.product,
        "nvidia.com/gpu.count": str(gpu.count),
        "nvidia.com/mig.capable": "true" if gpu.mig_capable else "false",
    }
    if gpu.memory_mib is not None:
        labels["nvidia.com/gpu.memory"] = str(gpu.memory_mib)
    if gpu.mig_strategy is not None:
        labels["nvidia.com/mig.strategy"] = gpu.mig_strategy
    return labels


def _parse_node(entry: Any, where: str) -> list[NodeSpec]:
    if not isinstance(entry, dict):
        raise TopologyError(f"{where}: expected a mapping, got {type(entry).__name__}")
    known = {"name", "count", "cpu", "memory", "pods", "gpu", "resources", "labels", "taints"}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise TopologyError(f"{where}: unknown fields {unknown}; known: {sorted(known)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise TopologyError(f"{where}.name: required, a DNS-1123 node name")
    count = _integer(entry.get("count", 1), f"{where}.count")
    gpu = _parse_gpu(entry["gpu"], f"{where}.gpu") if "gpu" in entry else None
    taints = entry.get("taints", [])
    if not isinstance(taints, list) or not all(
        isinstance(t, dict) and {"key", "effect"} <= set(t) for t in taints
    ):
        raise TopologyError(f"{where}.taints: expected a list of {{key, value, effect}}")
    template = NodeSpec(
        name=name,
        cpu=str(entry.get("cpu", NodeSpec.cpu)),
        memory=str(entry.get("memory", NodeSpec.memory)),
        pods=_integer(entry.get("pods", NodeSpec.pods), f"{where}.pods"),
        gpu=gpu,
        resources=_string_map(entry.get("resources", {}), f"{where}.resources"),
        labels=_string_map(entry.get("labels", {}), f"{where}.labels"),
        taints=tuple({k: str(v) for k, v in t.items()} for t in taints),
    )
    if count == 1:
        return [template]
    return [replace(template, name=f"{name}-{i}") for i in range(count)]


def _parse_gpu(entry: Any, where: str) -> GpuSpec:
    if not isinstance(entry, dict) or "product" not in entry or "count" not in entry:
        raise TopologyError(f"{where}: expected a mapping with at least `product` and `count`")
    memory = entry.get("memoryMiB")
    allocatable = entry.get("allocatable")
    strategy = entry.get("migStrategy")
    if strategy not in (None, "single", "mixed"):
        raise TopologyError(f"{where}.migStrategy: {strategy!r} is not `single` or `mixed`")
    return GpuSpec(
        product=str(entry["product"]),
        count=_integer(entry["count"], f"{where}.count"),
        memory_mib=None if memory is None else _integer(memory, f"{where}.memoryMiB"),
        mig_capable=bool(entry.get("migCapable", False)),
        mig_strategy=strategy,
        allocatable=None if allocatable is None else _integer(allocatable, f"{where}.allocatable"),
    )


def _integer(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TopologyError(f"{where}: expected a non-negative integer, got {value!r}")
    return value


def _string_map(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise TopologyError(f"{where}: expected a mapping of strings")
    return {str(k): str(v) for k, v in value.items()}
