"""MIG layouts: the catalog of MIG-capable GPUs and a planner that places instances on one GPU.

Pure: no I/O beyond reading the packaged catalog. The same functions serve the operator,
`infertune mig layout` and the tests. Placement follows NVIDIA's model (MIG User Guide,
nvidia-smi `-lgipp`, NVML nvmlGpuInstancePlacement_t): an instance occupies `width` memory
slices from a start index its profile allows, and instances may not overlap.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from infertune.api.tuning import MigSpec, MigStrategy

_SUFFIXES = re.compile(r"(-MIG-[0-9a-z.+]+)?(-SHARED)?$", re.IGNORECASE)
_GIB = 2**30


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile on one product, as NVIDIA names and places it."""

    name: str
    compute_slices: int
    memory_slices: int
    memory_gb: int
    max_instances: int
    placements: tuple[int, ...]
    media_extensions: bool
    reported_gib: float | None = None
    """What `nvidia-smi mig -lgip` reports, where that output is published (the catalog)."""

    @property
    def memory_bytes(self) -> int:
        """The memory sizing counts on: the driver's figure where known. The name's GB is
        above it on some boards (H200 1g.18gb is 16.00 GiB = 17.2e9 bytes), so it is used
        only where no lgip output says otherwise."""
        if self.reported_gib is not None:
            return int(self.reported_gib * 2**30)
        return self.memory_gb * 10**9

    @property
    def memory_text(self) -> str:
        if self.reported_gib is None:
            return f"{self.memory_gb} GB"
        return f"{self.reported_gib:g} GiB"


@dataclass(frozen=True)
class MigProduct:
    """A MIG-capable GPU: its slice counts and profiles, smallest first."""

    product: str
    aliases: tuple[str, ...]
    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]
    unverified: str | None = None

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)


@dataclass(frozen=True)
class NonMigProduct:
    """A GPU that cannot be partitioned with MIG."""

    product: str
    aliases: tuple[str, ...]


@dataclass(frozen=True)
class MigCatalog:
    """Every known product, looked up by its GFD `nvidia.com/gpu.product` value or an alias."""

    products: tuple[MigProduct, ...]
    without_mig: tuple[NonMigProduct, ...]
    _index: Mapping[str, MigProduct | NonMigProduct] = field(repr=False, compare=False)

    def lookup(self, product: str) -> MigProduct | NonMigProduct | None:
        return self._index.get(_normalise(product))

    @property
    def known_products(self) -> tuple[str, ...]:
        return tuple(p.product for p in self.products) + tuple(
            p.product for p in self.without_mig)


def base_product(product: str) -> str:
    """The product label without the suffixes GPU Feature Discovery adds (-MIG-<profile> under
    strategy single, -SHARED), as the product was labelled before the GPU was partitioned."""
    return _SUFFIXES.sub("", product.strip())


def _normalise(product: str) -> str:
    # GFD appends -MIG-<profile> (strategy single), then -SHARED (time-slicing, MPS): both
    # with time-slicing under strategy single (k8s-device-plugin, internal/lm/resource.go).
    return _SUFFIXES.sub("", product.strip()).lower()


def _build_products(raw: Mapping[str, Any]) -> tuple[MigProduct, ...]:
    products = []
    for name, entry in raw["products"].items():
        geometry = raw["geometries"][entry["geometry"]]
        profiles = []
        reported = entry.get("reported_gib") or {}
        for shape, gb in entry["memory_gb"].items():
            spec = geometry["shapes"][shape]
            me = shape.endswith("+me")
            profiles.append(MigProfile(
                name=f"{spec['compute']}g.{gb}gb" + ("+me" if me else ""),
                compute_slices=spec["compute"], memory_slices=spec["memory_slices"],
                memory_gb=gb, max_instances=spec["max_instances"],
                placements=tuple(spec["placements"]), media_extensions=me,
                reported_gib=reported.get(shape),
            ))
        profiles.sort(key=lambda p: (p.memory_slices, p.compute_slices, p.media_extensions))
        products.append(MigProduct(
            product=name, aliases=tuple(entry.get("aliases", ())),
            memory_slices=geometry["memory_slices"], compute_slices=geometry["compute_slices"],
            profiles=tuple(profiles), unverified=entry.get("unverified"),
        ))
    return tuple(products)


def catalog_from_mapping(raw: Mapping[str, Any]) -> MigCatalog:
    """Build a catalog from the YAML's structure (the packaged file, or a test's own)."""
    products = _build_products(raw)
    without = tuple(NonMigProduct(name, tuple(aliases or ()))
                    for name, aliases in raw.get("without_mig", {}).items())
    index: dict[str, MigProduct | NonMigProduct] = {}
    items: list[MigProduct | NonMigProduct] = [*products, *without]
    for item in items:
        for key in (item.product, *item.aliases):
            if _normalise(key) in index:
                raise ValueError(f"mig catalog: {key} is listed twice")
            index[_normalise(key)] = item
    return MigCatalog(products, without, index)


@cache
def load_catalog() -> MigCatalog:
    """The packaged catalog (`infertune/data/mig-catalog.yaml`), read once."""
    text = resources.files("infertune").joinpath("data/mig-catalog.yaml").read_text("utf-8")
    return catalog_from_mapping(yaml.safe_load(text))


# ---------------------------------------------------------------------------------------------
# Requests and results


Slices = tuple[tuple[str, int], ...]
"""A per-GPU layout as (profile, count) pairs, for example (("3g.71gb", 1), ("2g.35gb", 2))."""


@dataclass(frozen=True)
class SliceRequest:
    """An explicit per-GPU layout; the pod requests `pod_profile` (default: the first)."""

    slices: Slices
    pod_profile: str | None = None
    strategy: MigStrategy = MigStrategy.MIXED


@dataclass(frozen=True)
class ProfileRequest:
    """As many instances of one profile as fit on one GPU."""

    profile: str
    strategy: MigStrategy = MigStrategy.MIXED


@dataclass(frozen=True)
class MemoryRequest:
    """The smallest profile holding `need_bytes`; then as many as fit, or inside `layout`."""

    need_bytes: int
    layout: Slices = ()
    strategy: MigStrategy = MigStrategy.MIXED


LayoutRequest = SliceRequest | ProfileRequest | MemoryRequest


@dataclass(frozen=True)
class PlacedInstance:
    """One GPU instance: its profile and the memory slices [start, start + width) it takes."""

    profile: str
    start: int
    width: int


@dataclass(frozen=True)
class LayoutPlan:
    """A valid per-GPU layout with NVIDIA placements, and the profile the pod requests.

    `product` is the catalog's name for the GPU, whichever alias was asked for.
    """

    product: str
    instances: tuple[PlacedInstance, ...]
    pod_profile: str
    reason: str

    @property
    def slices(self) -> Slices:
        """(profile, count) pairs, largest profile first, as mig-parted's mig-devices wants."""
        counts = Counter(i.profile for i in self.instances)
        order = sorted(counts, key=lambda p: (-_width_of(self, p), p))
        return tuple((p, counts[p]) for p in order)


def _width_of(plan: LayoutPlan, profile: str) -> int:
    return next(i.width for i in plan.instances if i.profile == profile)


@dataclass(frozen=True)
class Infeasible:
    """No valid layout: `reason` names the product, the profiles and why."""

    product: str
    reason: str


def memory_need(weights: int, kv_cache: int, headroom_ratio: float) -> int:
    """Bytes a model needs in one MIG instance: (weights + KV cache) x (1 + headroom)."""
    return math.ceil((weights + kv_cache) * (1 + headroom_ratio))


def request_from_spec(spec: MigSpec) -> LayoutRequest:
    """The planner's request for an InferenceTuning's `spec.mig`."""
    layout = tuple((s.profile, s.count) for s in spec.layout)
    if spec.sizing is not None:
        need = memory_need(int(spec.sizing.weights.value), int(spec.sizing.kv_cache.value),
                           spec.sizing.headroom_ratio)
        return MemoryRequest(need, layout, spec.strategy)
    assert spec.profile is not None  # MigSpec's validator: profile or sizing
    if layout:
        return SliceRequest(layout, spec.profile, spec.strategy)
    return ProfileRequest(spec.profile, spec.strategy)


def describe(slices: Iterable[tuple[str, int]]) -> str:
    """`2x3g.20gb + 1g.5gb`: a layout as people write it."""
    return " + ".join(f"{n}x{p}" if n > 1 else p for p, n in slices)


def gib(value: int) -> str:
    text = f"{value / _GIB:.1f}".removesuffix(".0")
    return f"{text} GiB"


# ---------------------------------------------------------------------------------------------
# Planning


def plan_layout(
    product: str, request: LayoutRequest, catalog: MigCatalog | None = None
) -> LayoutPlan | Infeasible:
    """A valid per-GPU layout for `request` on `product` (a GFD gpu.product value), or why not."""
    catalog = catalog if catalog is not None else load_catalog()
    name = product.strip()
    found = catalog.lookup(name)
    if found is None:
        return Infeasible(name, f"unknown GPU product {name}; known: "
                          f"{', '.join(catalog.known_products)}")
    if isinstance(found, NonMigProduct):
        return Infeasible(name, f"{name} does not support MIG; use whole GPUs (nvidia.com/gpu) "
                          "or a MIG-capable GPU such as A100, A30, H100, H200 or B200")
    if isinstance(request, MemoryRequest):
        return _plan_for_memory(name, found, request)
    if isinstance(request, ProfileRequest):
        return _plan_fill(name, found, request.profile, "")
    return _plan_slices(name, found, request.slices, request.pod_profile, request.strategy, "")


def _plan_for_memory(name: str, gpu: MigProduct, request: MemoryRequest) -> LayoutPlan | Infeasible:
    need = gib(request.need_bytes)
    plain = [p for p in gpu.profiles if not p.media_extensions]
    holding = [p for p in plain if p.memory_bytes >= request.need_bytes]
    if not holding:
        largest = max(plain, key=lambda p: p.memory_bytes)
        return Infeasible(name, f"model needs {need} but the largest profile on {name} is "
                          f"{largest.name} ({largest.memory_text})")
    chosen = min(holding, key=lambda p: (p.memory_bytes, p.compute_slices))
    why = f"model needs {need}; {chosen.name} ({chosen.memory_text}) is the smallest profile " \
          "that holds it"
    if not request.layout:
        return _plan_fill(name, gpu, chosen.name, why + "; ")
    # The smallest of the layout's profiles that holds it: the smallest of the catalog's was
    # asked for, and a layout of 3x2g.10gb + 1g.5gb for 8 GiB was refused for want of a
    # 1g.10gb, which the advice to add would not have fitted beside them.
    given = {profile for profile, _ in request.layout}
    in_layout = [p for p in holding if p.name in given]
    if not in_layout:
        return Infeasible(name, f"{why}, and no profile of layout {describe(request.layout)} "
                          f"does; put {chosen.name} or a larger one in the layout, or leave "
                          "layout empty")
    fit = min(in_layout, key=lambda p: (p.memory_bytes, p.compute_slices))
    why = (f"model needs {need}; {fit.name} ({fit.memory_text}) is the smallest profile of the "
           "layout that holds it")
    return _plan_slices(name, gpu, request.layout, fit.name, request.strategy, why + "; ")


def _plan_fill(name: str, gpu: MigProduct, profile: str, why: str) -> LayoutPlan | Infeasible:
    found = gpu.profile(profile)
    if found is None:
        return _unknown_profiles(name, gpu, [profile])
    for count in range(found.max_instances, 0, -1):
        placed = _place([found] * count, gpu.memory_slices)
        if placed is not None:
            return LayoutPlan(gpu.product, placed, profile,
                              f"{why}{count}x{profile}: as many as fit on one {name} GPU")
    return Infeasible(name, f"{profile} has no valid placement on {name}")  # catalog error


def _plan_slices(
    name: str, gpu: MigProduct, slices: Slices, pod_profile: str | None,
    strategy: MigStrategy, why: str,
) -> LayoutPlan | Infeasible:
    counts = _merge(slices)
    if not counts:
        return Infeasible(name, "the layout is empty; give at least one profile")
    unknown = [p for p in counts if gpu.profile(p) is None]
    if unknown:
        return _unknown_profiles(name, gpu, unknown)
    pod = pod_profile if pod_profile is not None else next(iter(counts))
    text = describe(counts.items())
    if pod not in counts:
        return Infeasible(name, f"{text} does not contain the pod's profile {pod}")
    problem = _count_problem(name, gpu, counts, strategy)
    if problem is not None:
        return Infeasible(name, f"{text}: {problem}")
    profiles = [gpu.profile(p) for p, n in counts.items() for _ in range(n)]
    placed = _place([p for p in profiles if p is not None], gpu.memory_slices)
    if placed is None:
        return Infeasible(name, f"{text}: memory slices exhausted: no placement without overlap "
                          f"({_placement_table(gpu, counts)})")
    return LayoutPlan(gpu.product, placed, pod, f"{why}{text} fits on one {name} GPU")


def _merge(slices: Slices) -> dict[str, int]:
    counts: dict[str, int] = {}
    for profile, count in slices:
        counts[profile] = counts.get(profile, 0) + count
    return {p: n for p, n in counts.items() if n > 0}


def _unknown_profiles(name: str, gpu: MigProduct, unknown: Sequence[str]) -> Infeasible:
    verb = "does" if len(unknown) == 1 else "do"
    return Infeasible(name, f"{', '.join(unknown)} {verb} not exist on {name}; valid: "
                      f"{', '.join(gpu.profile_names)}")


def _count_problem(
    name: str, gpu: MigProduct, counts: Mapping[str, int], strategy: MigStrategy
) -> str | None:
    """The first rule that slice counts alone break, before any placement is tried."""
    profiles = {p: gpu.profile(p) for p in counts}
    if strategy is MigStrategy.SINGLE and len(counts) > 1:
        return ("strategy single gives every MIG device on a node the same profile; use one "
                "profile or strategy mixed")
    for p, n in counts.items():
        found = profiles[p]
        if found is not None and n > found.max_instances:
            plural = "instance" if found.max_instances == 1 else "instances"
            return f"at most {found.max_instances} {plural} of {p} per GPU"
    media = sum(n for p, n in counts.items() if p.endswith("+me"))
    if media > 1:
        # One set of JPEG/OFA engines per GPU: "a single 1g profile can include media extensions".
        return "at most one +me (media extensions) instance per GPU"
    compute = sum(n * f.compute_slices for p, n in counts.items() if (f := profiles[p]))
    if compute > gpu.compute_slices:
        return f"needs {compute} compute slices, {name} has {gpu.compute_slices}"
    memory = sum(n * f.memory_slices for p, n in counts.items() if (f := profiles[p]))
    if memory > gpu.memory_slices:
        return (f"memory slices exhausted: needs {memory} of {gpu.memory_slices} "
                f"({_placement_table(gpu, counts)})")
    return None


def _placement_table(gpu: MigProduct, counts: Mapping[str, int]) -> str:
    parts = []
    for p in counts:
        found = gpu.profile(p)
        if found is not None:
            starts = ",".join(str(s) for s in found.placements)
            parts.append(f"{p} starts at {starts}, {found.memory_slices} wide")
    return "placements: " + "; ".join(parts)


def _place(profiles: Sequence[MigProfile], memory_slices: int) -> tuple[PlacedInstance, ...] | None:
    """Depth-first search over start indices; at most 8 slices, so it is exhaustive and fast."""
    # Widest first: they have the fewest starts, so dead ends show up early.
    order = sorted(profiles, key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
    chosen: list[PlacedInstance] = []

    def extend(i: int, occupied: int) -> bool:
        if i == len(order):
            return True
        profile = order[i]
        # Equal instances are interchangeable: keep their starts increasing, search each set once.
        after = chosen[-1].start if i and order[i - 1] == profile else -1
        for start in profile.placements:
            mask = ((1 << profile.memory_slices) - 1) << start
            if start <= after or occupied & mask or start + profile.memory_slices > memory_slices:
                continue
            chosen.append(PlacedInstance(profile.name, start, profile.memory_slices))
            if extend(i + 1, occupied | mask):
                return True
            chosen.pop()
        return False

    if not extend(0, 0):
        return None
    return tuple(sorted(chosen, key=lambda c: c.start))
