"""The pod patch's MIG part, and the JSON pointers every part of the patch is addressed by."""

from __future__ import annotations

import os
from typing import Any

from infertune.api.spec import InferenceTuningSpec

Op = dict[str, Any]
"""One RFC 6902 operation."""
GPU_RESOURCE = "nvidia.com/gpu"


def pointer(*parts: str | int) -> str:
    """An RFC 6901 JSON pointer; '~' and '/' in keys (label names) are escaped."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def mig_resource(profile: str) -> str:
    """The extended resource the device plugin advertises a profile's slices as (mixed
    strategy). A `+` is not allowed in a resource name, so the plugin spells the media
    extensions `.me`: 1g.10gb+me is nvidia.com/mig-1g.10gb.me (k8s-device-plugin,
    internal/rm/rm.go)."""
    return "nvidia.com/mig-" + profile.replace("+", ".")


MIG_OFF_ENV = "INFERTUNE_MIG"


def mig_off() -> bool:
    """Whether this operator runs without MIG partitioning (`infertune run --no-mig`, which
    sets $INFERTUNE_MIG=off): spec.mig is then not acted on, by the webhook either."""
    return os.environ.get(MIG_OFF_ENV) == "off"


def mig_ops(spec: InferenceTuningSpec, base: str, serving: dict[str, Any],
            planned: tuple[str | None, str], reasons: list[str], problems: list[str]) -> list[Op]:
    """The serving container's GPU request as the planned (profile, strategy) wants it: under
    the mixed strategy the pod asks for its slice by name; under single, MIG devices are still
    called nvidia.com/gpu (GPU Operator docs, "MIG strategies")."""
    profile, strategy = planned
    if spec.mig is None:
        return []
    if mig_off():
        # No layout is planned, and one planned before MIG was turned off (status.mig) is
        # no slice any node offers for sure: the pod keeps its GPU request.
        reasons.append("mig: not acted on, this operator runs without MIG partitioning "
                       "(--no-mig); the pod keeps its GPU request")
        return []
    if profile is None:
        problems.append("the MIG layout is not planned yet (see status.mig); the pod keeps "
                        "its GPU request")
        return []
    if strategy != "mixed":
        reasons.append(f"mig: single strategy, {GPU_RESOURCE} is a {profile} slice")
        return []
    wanted = mig_resource(profile)
    resources = serving.get("resources") or {}
    ops: list[Op] = []
    counts: set[str] = set()
    for section in ("limits", "requests"):
        current = resources.get(section)
        if current is None or (GPU_RESOURCE not in current and wanted not in current):
            continue
        count = str(current.get(GPU_RESOURCE, current.get(wanted, "1")))
        counts.add(count)
        if GPU_RESOURCE in current:
            ops.append({"op": "remove", "path": _resource_pointer(base, section, GPU_RESOURCE)})
            ops.append({"op": "add", "path": _resource_pointer(base, section, wanted),
                        "value": count})
    if not counts:
        problems.append(f"container {serving.get('name')} requests no {GPU_RESOURCE}; add "
                        f"{wanted} to its limits to run on a MIG slice")
        return []
    if counts - {"1"}:
        # NVIDIA's MIG user guide: a CUDA process enumerates a single MIG device.
        problems.append(f"container {serving.get('name')} asks for {max(counts)} GPUs, so it "
                        f"gets {max(counts)} {profile} slices, but a CUDA process "
                        "uses only one MIG device: tensor parallelism across them fails; give "
                        "each pod one slice, or leave this Deployment out of MIG")
    replaced = any(op["op"] == "remove" for op in ops)
    reasons.append(f"mig: {GPU_RESOURCE} replaced by {wanted} (mixed strategy)" if replaced else
                   f"mig: the container already requests {wanted} (mixed strategy)")
    return ops


def _resource_pointer(base: str, section: str, name: str) -> str:
    return f"{base}{pointer('resources', section, name)}"
