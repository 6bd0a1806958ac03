"""Spec sections that tune the serving pod itself: NUMA, memory.high, MIG and the allocator."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BeforeValidator, Field, model_validator

from infertune.api.base import (
    FLAG,
    NUMBER,
    ApiModel,
    CrossFieldProblems,
    no_schema_default,
    without_nulls,
)
from infertune.api.units import Quantity

# Debian/Ubuntu libjemalloc2 on amd64; the path most serving images based on them have.
DEFAULT_JEMALLOC_PATH = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
# kubelet MemoryQoS memoryThrottlingFactor in the releases that set one (KEP-2570).
KUBELET_THROTTLING_FACTOR = 0.9


class NumaPolicy(StrEnum):
    """How the launcher binds the serving process to NUMA nodes."""

    GPU_LOCAL = "gpu-local"
    NODE = "node"
    INTERLEAVE = "interleave"
    NONE = "none"


class NumaSpec(ApiModel):
    """NUMA CPU and memory binding, decided by the launcher on the node at container start."""

    policy: NumaPolicy = NumaPolicy.GPU_LOCAL
    """gpu-local binds CPUs and memory to the NUMA node of the container's GPUs; node binds to
    the node given in `node`; interleave spreads memory over all allowed nodes; none leaves the
    process unbound."""

    node: Annotated[int, Field(ge=0, le=1023), NUMBER] | None = None
    """The NUMA node id to bind to. Required with policy node, not allowed otherwise."""

    strict: Annotated[bool, FLAG] = False
    """When true the container fails to start if the binding cannot be applied (numactl
    missing, node outside the allowed cpuset, unknown GPU node). When false it starts unbound
    and logs a warning."""

    @model_validator(mode="after")
    def _node_matches_policy(self) -> NumaSpec:
        problems = CrossFieldProblems()
        if self.policy is NumaPolicy.NODE and self.node is None:
            problems.add("node", "policy node needs a node id; set node: 0 (or another id)")
        if self.policy is not NumaPolicy.NODE and self.node is not None:
            problems.add(
                "node", f"is only used with policy node (policy is {self.policy.value}); "
                "remove node or set policy: node",
            )
        problems.raise_if_any()
        return self


MIN_MEMORY_HIGH = 64 * 2**20
"""No inference server runs in less: a lower memory.high throttles it from its first
allocation (the incident's failure, made on purpose)."""


class MemorySpec(ApiModel):
    """cgroup v2 memory.high for the serving container, written by the node agent."""

    high: Quantity | None = None
    """memory.high as a quantity (for example 28Gi). Must stay below the container's memory
    limit by at least minHeadroom. Mutually exclusive with highRatio."""

    high_ratio: Annotated[float, Field(gt=0, lt=1), NUMBER] | None = None
    """memory.high as a fraction of the container's memory limit, strictly between 0 and 1
    (for example 0.9). Mutually exclusive with high."""

    throttling_factor: Annotated[float, Field(gt=0, lt=1), NUMBER] = KUBELET_THROTTLING_FACTOR
    """Used when neither high nor highRatio is set: memory.high = requests + factor *
    (limit - requests), kubelet's MemoryQoS formula (KEP-2570), capped at limit minus
    minHeadroom; left at max when that cap is under half the limit."""

    min_headroom: Quantity = Quantity("1Gi")
    """The smallest gap allowed between memory.high and the memory limit, so throttling starts
    before the OOM killer. Values that leave less are refused."""

    @model_validator(mode="after")
    def _one_way_to_set_high(self) -> MemorySpec:
        problems = CrossFieldProblems()
        if self.high is not None and self.high_ratio is not None:
            problems.add("highRatio", "set either high or highRatio, not both")
        if self.high is not None and int(self.high.value) < MIN_MEMORY_HIGH:
            problems.add("high", f"memory.high of {self.high} would throttle the server from "
                         "its first allocation (64Mi at least); use a quantity such as 28Gi "
                         "or remove it")
        problems.raise_if_any()
        return self


class MigStrategy(StrEnum):
    """How the GPU Operator exposes MIG devices (`nvidia.com/mig.strategy`)."""

    SINGLE = "single"
    MIXED = "mixed"


class MigSizing(ApiModel):
    """The model's memory need, from which the smallest MIG profile that holds it is chosen."""

    weights: Quantity
    """Memory taken by the model weights (for example 15Gi for Qwen2-7B in bf16)."""

    kv_cache: Quantity = Quantity("0")
    """Memory reserved for the KV cache."""

    headroom_ratio: Annotated[float, Field(ge=0, le=1), NUMBER] = 0.1
    """Extra fraction on top of weights + kvCache for activations and the CUDA context."""


LIBRARY_PATH = r"^/[^\t\n\v\f\r :\x00]*$"
"""One absolute path without whitespace, ':' or NUL (allocator.libraryPath)."""
MIG_PROFILE = r"^[1-7]g\.[0-9]+gb(\+me)?$"
"""A MIG profile name as NVIDIA writes it: 3g.71gb, 1g.18gb+me."""


class MigSlice(ApiModel):
    """A MIG profile and how many instances of it one GPU gets."""

    profile: Annotated[str, Field(pattern=MIG_PROFILE)]
    """A MIG profile name as NVIDIA writes it, for example 3g.71gb or 1g.18gb+me."""

    count: Annotated[int, Field(ge=1, le=7, json_schema_extra=no_schema_default), NUMBER] = 1
    """Instances of the profile per GPU. Default 1."""


class MigSpec(ApiModel):
    """MIG partitioning through the NVIDIA GPU Operator and the slice each pod requests."""

    profile: Annotated[str, Field(pattern=MIG_PROFILE)] | None = None
    """The MIG profile each serving pod requests, for example 3g.71gb on an H200. Mutually
    exclusive with sizing."""

    sizing: MigSizing | None = None
    """Choose the profile from the model's memory need instead of naming it."""

    layout: list[MigSlice] = Field(default_factory=list, max_length=7)
    """The full per-GPU layout to apply to the selected nodes. Empty means: as many instances
    of the pod's profile as fit on one GPU."""

    strategy: MigStrategy = MigStrategy.MIXED
    """The GPU Operator's MIG strategy: mixed requests nvidia.com/mig-<profile>, single
    requests nvidia.com/gpu."""

    node_selector: Annotated[dict[str, str], BeforeValidator(without_nulls)] = Field(
        default_factory=dict)
    """Only nodes with all these labels are partitioned, in addition to the GPU product and
    nvidia.com/mig.capable=true."""

    allow_disruption: Annotated[bool, FLAG] = False
    """Nodes that run GPU pods are never reconfigured unless this is true; when true they are
    cordoned and drained first."""

    @model_validator(mode="after")
    def _profile_or_sizing(self) -> MigSpec:
        problems = CrossFieldProblems()
        if self.profile is None and self.sizing is None:
            problems.add("profile", "set profile (for example 3g.71gb) or sizing (the model's "
                         "memory need); MIG needs one of them")
        if self.profile is not None and self.sizing is not None:
            problems.add("sizing", "set either profile or sizing, not both")
        if self.profile is not None and self.layout and not any(
            s.profile == self.profile for s in self.layout
        ):
            problems.add("layout", f"does not contain the pod's profile {self.profile}; "
                         "add it or leave layout empty")
        if len({s.profile for s in self.layout}) != len(self.layout):
            problems.add("layout", "names a profile twice; give each profile once with a count")
        problems.raise_if_any()
        return self


class AllocatorType(StrEnum):
    """The memory allocator the serving process runs with."""

    JEMALLOC = "jemalloc"
    GLIBC = "glibc"
    NONE = "none"


class AllocatorSpec(ApiModel):
    """The allocator preloaded into the serving process and its settings."""

    type: AllocatorType = AllocatorType.JEMALLOC
    """jemalloc preloads libjemalloc with MALLOC_CONF; glibc keeps the default allocator and
    sets its arena limits; none changes nothing."""

    # ASCII whitespace spelled out: `\s` is Unicode whitespace to pydantic's regex engine and
    # ASCII to the API server's (RE2), so a path the CRD took was refused by the operator.
    # NUL: no environment variable can carry it (the container would not start).
    library_path: Annotated[str, Field(pattern=LIBRARY_PATH, max_length=4096)] = (
        DEFAULT_JEMALLOC_PATH
    )
    """Absolute path of libjemalloc inside the serving image (LD_PRELOAD). The default is
    Debian's and Ubuntu's on amd64; /usr/$LIB/libjemalloc.so.2 lets the dynamic loader pick
    the multiarch directory (arm64 too). The NUMA launcher, when it wraps the command, leaves
    out a path the image does not have and says so in its log line."""

    malloc_conf: Annotated[str, Field(max_length=4096)] | None = None
    """jemalloc 5.3 MALLOC_CONF, for example background_thread:true,dirty_decay_ms:5000 (an
    option new in 5.3 is reported on each pod: 5.2 ignores it). When it
    leaves narenas and narenas_ratio unset, narenas is sized from the container's CPU
    limit."""

    arena_max: Annotated[int, Field(ge=1, le=1024), NUMBER] | None = None
    """glibc only: MALLOC_ARENA_MAX. Unset means sized from the container's CPU limit."""

    glibc_tunables: Annotated[str, Field(max_length=4096)] | None = None
    """glibc only: GLIBC_TUNABLES, for example glibc.malloc.trim_threshold=134217728."""

    @model_validator(mode="after")
    def _settings_match_type(self) -> AllocatorSpec:
        problems = CrossFieldProblems()
        for field, text in (("mallocConf", self.malloc_conf),
                            ("glibcTunables", self.glibc_tunables)):
            if text is not None and "\x00" in text:
                # Cut there by the C code that reads it, and refused in the container's
                # environment by the runtime: the pods would not start.
                problems.add(field, "contains a NUL character, which no environment variable "
                             "can carry; remove it")
        if self.type is not AllocatorType.JEMALLOC:
            if self.malloc_conf is not None:
                problems.add("mallocConf", f"only applies to type jemalloc (type is "
                             f"{self.type.value}); remove it or set type: jemalloc")
            if self.library_path != DEFAULT_JEMALLOC_PATH:
                problems.add("libraryPath", f"only applies to type jemalloc (type is "
                             f"{self.type.value})")
        if self.type is AllocatorType.JEMALLOC and self.malloc_conf is not None:
            # The real library ignores bad pairs with a message on stderr nobody reads; refuse.
            from infertune.tuning.mallocconf import check_malloc_conf

            for problem in check_malloc_conf(self.malloc_conf):
                problems.add("mallocConf", problem.message)
        if self.type is not AllocatorType.GLIBC:
            for field, value in (("arenaMax", self.arena_max),
                                 ("glibcTunables", self.glibc_tunables)):
                if value is not None:
                    problems.add(field, f"only applies to type glibc (type is "
                                 f"{self.type.value}); remove it or set type: glibc")
        problems.raise_if_any()
        return self


class RetuneStrategy(StrEnum):
    """How pods that carry an older tuning are replaced when the tuning changes."""

    EVICT = "Evict"
    POD_TEMPLATE_ANNOTATION = "PodTemplateAnnotation"


class RetuneSpec(ApiModel):
    """Re-tuning of running pods after the tuning changes (or for pods that predate it)."""

    strategy: RetuneStrategy = RetuneStrategy.EVICT
    """Evict re-creates outdated pods through the Eviction API, which respects
    PodDisruptionBudgets, and never edits the Deployment. PodTemplateAnnotation instead writes
    infertune.io/revision into the Deployment's pod template so the Deployment rolls out; Argo
    CD users must then ignore that annotation."""

    max_unavailable: Annotated[int, Field(ge=1, le=100), NUMBER] = 1
    """Pods evicted at a time; the next ones wait until the replacements are Ready."""
