"""mig-parted configs for the GPU Operator's MIG manager, and the node-label names that pick them.

The format is mig-parted's `version: v1` (NVIDIA/mig-parted examples/config.yaml and the GPU
Operator's default-mig-parted-config): each named config is a list of device groups with
`devices` (`all` or GPU indices), `mig-enabled` and `mig-devices` (profile -> count per GPU).
mig-manager applies the config named by the node label `nvidia.com/mig.config`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from infertune.keys import label_value
from infertune.tuning.mig import LayoutPlan

GpuLayout = Mapping[str, int] | LayoutPlan
"""One GPU's MIG devices: profile -> count, or a planned layout."""

ALL_DISABLED = "all-disabled"
"""The entry every GPU Operator config carries; labelling a node with it turns MIG off."""

_UNSAFE = re.compile(r"[^a-z0-9.-]+")
_PROFILE = re.compile(r"^([0-9]+)g\.([0-9]+)gb")


def _largest_first(profile: str) -> tuple[int, int, str]:
    # "3g.71gb" -> (-3, -71): the order is the same whichever way the caller listed them.
    match = _PROFILE.match(profile)
    compute, memory = (int(match[1]), int(match[2])) if match else (0, 0)
    return (-compute, -memory, profile)


def mig_devices(layout: GpuLayout) -> dict[str, int]:
    """The `mig-devices` mapping for one GPU, largest profile first."""
    pairs = layout.slices if isinstance(layout, LayoutPlan) else tuple(layout.items())
    counts = {profile: count for profile, count in pairs if count > 0}
    return {profile: counts[profile] for profile in sorted(counts, key=_largest_first)}


def _device_groups(layout: GpuLayout | Sequence[GpuLayout]) -> list[dict[str, Any]]:
    if isinstance(layout, (LayoutPlan, Mapping)):
        return [{"devices": "all", "mig-enabled": True, "mig-devices": mig_devices(layout)}]
    # A list is one layout per GPU index; GPUs with the same layout share one group.
    groups: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for index, gpu in enumerate(layout):
        groups.setdefault(tuple(mig_devices(gpu).items()), []).append(index)
    return [{"devices": indices, "mig-enabled": True, "mig-devices": dict(devices)}
            for devices, indices in groups.items()]


def render_mig_parted_config(
    configs: Mapping[str, GpuLayout | Sequence[GpuLayout]], *, include_all_disabled: bool = True
) -> dict[str, Any]:
    """A mig-parted config document with one named config per entry of `configs`.

    A single layout applies to `devices: all`; a sequence gives one layout per GPU index.
    `all-disabled` comes first unless asked not to, so nodes can always be reset.
    """
    rendered: dict[str, Any] = {}
    if include_all_disabled:
        rendered[ALL_DISABLED] = [{"devices": "all", "mig-enabled": False}]
    for name, layout in configs.items():
        if name in rendered:
            raise ValueError(f"mig-parted config {name!r} is given twice")
        rendered[name] = _device_groups(layout)
    return {"version": "v1", "mig-configs": rendered}


def _short_product(product: str) -> str:
    name = product.lower().removeprefix("nvidia-").removeprefix("tesla-")
    return _UNSAFE.sub("-", name).strip("-.")


def config_name(product: str, layout: GpuLayout) -> str:
    """A stable, label-safe name for a layout, such as `infertune-h200-1x3g.71gb-2x2g.35gb`.

    Only [a-z0-9.-], at most 63 characters (`+me` becomes `.me`, as in the GPU Operator's
    `all-1g.10gb.me`); longer names keep a prefix and end in a hash of the full name.
    """
    devices = mig_devices(layout)
    parts = [f"{count}x{profile.replace('+', '.')}" for profile, count in devices.items()]
    return label_value(
        _UNSAFE.sub("-", "-".join(["infertune", _short_product(product), *parts]).lower()))
