"""The pod tuning planner: (InferenceTuning spec, Pod) -> an RFC 6902 patch and its reasons.

Pure: no I/O, no clock. The webhook, `infertune plan` and the tests call the same function, so
what a user previews is exactly what admission does. The patch is all or nothing: when any part
of the tuning cannot be applied to this pod safely, the plan is refused and the pod is admitted
unchanged, with the reason reported.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re
import shlex
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from infertune import keys
from infertune.api.scaling import BatchingMode
from infertune.api.spec import (
    InferenceTuningSpec,
    Mode,
    auto_batching_problem,
    batching_knob,
)
from infertune.api.tuning import AllocatorType, NumaPolicy
from infertune.api.units import QuantityError, parse_quantity
from infertune.tuning.mallocconf import (
    aborting,
    aborts_on_invalid,
    check_malloc_conf,
    effective_malloc_conf,
    new_in_5_3,
)
from infertune.tuning.mallocconf_syntax import scan
from infertune.tuning.memory import MemoryHigh, MemoryHighError, resolve_memory_high
from infertune.tuning.pod_mig import Op, mig_off, mig_ops
from infertune.tuning.pod_mig import pointer as _pointer

PLAIN_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
"""Resources that are no device: any other (nvidia.com/gpu, a vendor's GPU share) may be."""
OTHER_ALLOCATORS = ("libtcmalloc", "libmimalloc", "libhoard", "libsnmalloc")
"""File name starts of other malloc replacements a container may preload."""
LAUNCHER_DIR = "/infertune"
LAUNCHER_PATH = f"{LAUNCHER_DIR}/infertune-launch"
LAUNCHER_VOLUME = "infertune-launcher"
LAUNCHER_INIT = "infertune-launcher"


@dataclass(frozen=True)
class PodContext:
    """What the planner needs to know beyond the spec and the pod."""

    tuning_name: str
    launcher_image: str
    static_cpu_manager: bool = True
    """Whether kubelets run the static CPU manager, so exclusive CPUs need Guaranteed QoS and
    integer CPU requests."""
    mig_profile: str | None = None
    """The MIG profile the layout planner chose for this tuning (None: not planned yet)."""
    mig_strategy: str = "mixed"
    """The GPU Operator's MIG strategy, as the selected nodes' nvidia.com/mig.strategy says."""
    batching_value: int | None = None
    """Batching mode Auto: the knob value to set (status.batching.applied)."""
    limit_ranges: tuple[LimitRangeView, ...] = ()
    """The pod's namespace's LimitRanges (`container_limits`): the launcher's init container
    is sized within them."""


class LimitRangeView(NamedTuple):
    """What a LimitRange requires of each container (its items of type Container)."""

    name: str
    minimum: tuple[tuple[str, str], ...] = ()
    """(resource, quantity): the least each container may request (and limit)."""
    maximum: tuple[tuple[str, str], ...] = ()
    """(resource, quantity): the most each container may limit (and request)."""
    ratios: tuple[str, ...] = ()
    """Resources with a maxLimitRequestRatio: a container must request and limit them."""
    named: tuple[str, ...] = ()
    """Every resource the LimitRange names for containers (also in `default` and
    `defaultRequest`): LimitRanger fills in a default for each one a container leaves out,
    the webhook's init container too (it runs again after the webhooks)."""


DEFAULTING = ("default", "defaultRequest")
"""A LimitRange item's fields that LimitRanger fills into a container that leaves a resource
out (`max` and `min` do too, as the default limit and request)."""


def container_limits(name: str, spec: Mapping[str, Any]) -> LimitRangeView | None:
    """The constraints of a LimitRange's spec on each container, None when it has none."""
    minimum: dict[str, str] = {}
    maximum: dict[str, str] = {}
    ratios: set[str] = set()
    named: set[str] = set()
    for item in spec.get("limits") or ():
        if not isinstance(item, Mapping) or item.get("type") != "Container":
            continue
        for target, field_name in ((minimum, "min"), (maximum, "max")):
            for resource, quantity in (item.get(field_name) or {}).items():
                target[str(resource)] = str(quantity)
        ratios.update(str(r) for r in item.get("maxLimitRequestRatio") or {})
        for field_name in DEFAULTING:
            named.update(str(r) for r in item.get(field_name) or {})
    named.update(minimum, maximum, ratios)
    if not named:
        return None
    return LimitRangeView(name, tuple(sorted(minimum.items())), tuple(sorted(maximum.items())),
                          tuple(sorted(ratios)), tuple(sorted(named)))


def planned_mig(status_mig: Mapping[str, Any]) -> tuple[str | None, str]:
    """(profile, strategy) as status.mig gives them to the webhook (PodContext); none planned
    without MIG partitioning (--no-mig), whatever status.mig kept from before."""
    if mig_off():
        return None, "mixed"
    profile = status_mig.get("profile")
    return (None if profile is None else str(profile), str(status_mig.get("strategy") or "mixed"))


@dataclass(frozen=True)
class PodPlan:
    """The patch for one pod, why each part is there, and what could not be done."""

    revision: str
    patch: list[Op] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Things the operator reports (status and Events) but that do not block admission."""
    refused: bool = False
    """True when the pod is admitted unchanged because the tuning cannot apply to it."""


def tuning_revision(spec: InferenceTuningSpec, batching_value: int | None = None,
                    mig_planned: tuple[str | None, str] = (None, "mixed")) -> str:
    """A short hash of what the webhook sets on a pod (the spec's tuning, in batching mode Auto
    the applied knob value, and with spec.mig the planned profile and strategy: `mig_planned`,
    from status.mig); it labels tuned pods, and a change makes them outdated. A pod admitted
    before the layout was planned keeps its whole GPU, so it is outdated once the plan names a
    slice. A pod that differs only in spec.memory (its `shape_revision` is current) is not
    re-created: re-tuning gives it the new memory.high intent in place."""
    return _digest(_relevant(spec, batching_value, mig_planned))


def shape_revision(spec: InferenceTuningSpec, batching_value: int | None = None,
                   mig_planned: tuple[str | None, str] = (None, "mixed")) -> str:
    """`tuning_revision` without spec.memory: what only a new pod can take (its command, its
    environment, its resources). memory.high is an intent in an annotation, which a running
    pod takes in place and the node agent writes into its live cgroup; re-creating every pod
    of the Deployment (a model load each) for it was the cost of a change of spec.memory."""
    return revisions(spec, batching_value, mig_planned)[1]


def revisions(spec: InferenceTuningSpec, batching_value: int | None = None,
              mig_planned: tuple[str | None, str] = (None, "mixed")) -> tuple[str, str]:
    """(tuning_revision, shape_revision) from one reading of the spec: each pod admission and
    each re-tuning pass needs both."""
    relevant = _relevant(spec, batching_value, mig_planned)
    revision = _digest(relevant)
    del relevant["memory"]
    return revision, _digest(relevant)


def _relevant(spec: InferenceTuningSpec, batching_value: int | None,
              mig_planned: tuple[str | None, str]) -> dict[str, Any]:
    """What the revisions are a hash of."""
    relevant = spec.model_dump(mode="json", by_alias=True,
                               include={"mode", "container", "numa", "memory", "allocator"})
    if spec.batching.mode is BatchingMode.AUTO and batching_value is not None:
        relevant["batching"] = {"knob": _knob(spec), "value": batching_value}
    if spec.mig is not None:
        # A spec.mig.profile counts as planned once there is a plan: one the plan has not
        # followed (a new one that cannot be planned, and the last plan kept; or one not
        # planned yet) leaves the pods as they are, and must not replace every one of them
        # with the same pod. Where they agree, and for mig.sizing (no profile in the spec),
        # the hash is what it always was: a changed hash re-creates every pod on upgrade.
        planned = mig_planned[0]
        profile = spec.mig.profile
        relevant["mig"] = {"profile": planned if planned and profile else profile,
                           "strategy": spec.mig.strategy.value, "planned": list(mig_planned)}
    return relevant


def _digest(relevant: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:10]


def _cpu_limit(container: dict[str, Any]) -> float | None:
    limits = (container.get("resources") or {}).get("limits") or {}
    return float(parse_quantity(str(limits["cpu"]))) if "cpu" in limits else None


def container_memory(container: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(memory request, memory limit) of a container; the request is the limit when only the
    limit is set, as the API server defaults it."""
    resources = container.get("resources") or {}
    limit = (resources.get("limits") or {}).get("memory")
    request = (resources.get("requests") or {}).get("memory", limit)
    return (None if request is None else str(request), None if limit is None else str(limit))


def _qos_problems(pod_spec: dict[str, Any], serving: dict[str, Any]) -> list[str]:
    """Why kubelet's static CPU manager would not give the serving container exclusive CPUs."""
    problems: list[str] = []
    for container in [*(pod_spec.get("containers") or []),
                      *(pod_spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        for resource in ("cpu", "memory"):
            if resource not in limits:
                problems.append(f"container {container.get('name')} has no {resource} limit, so "
                                "the pod is not Guaranteed QoS")
            elif resource in requests and parse_quantity(str(requests[resource])) != (
                parse_quantity(str(limits[resource]))
            ):
                problems.append(f"container {container.get('name')} requests {resource} "
                                "below its limit, so the pod is not Guaranteed QoS")
    cpu = _cpu_limit(serving)
    if cpu is not None and cpu != math.floor(cpu):
        problems.append(f"container {serving.get('name')} asks for {cpu:g} CPUs; the static CPU "
                        "manager gives exclusive CPUs only for whole numbers")
    if problems:
        problems.append("without exclusive CPUs, numactl still keeps the process on its NUMA "
                        "node, but shares that node's CPUs with other pods")
    return problems


def _exclusive_cpus(pod_spec: dict[str, Any], serving: dict[str, Any]) -> bool:
    """Whether kubelet's static CPU manager pins the serving container to CPUs of its own
    (Guaranteed QoS, whole CPUs)."""
    return _cpu_limit(serving) is not None and not _qos_problems(pod_spec, serving)


class _EnvPlan:
    """Env changes on one container as patch ops, keeping variables the user set elsewhere."""

    def __init__(self, base: str, env: list[dict[str, Any]] | None,
                 env_from: bool = False) -> None:
        self.base, self.env, self.env_from = base, env, env_from
        self.values: dict[str, str] = {}

    def _last(self, name: str) -> int | None:
        """The index of the entry of `name` the container gets: the last one, when it is
        there twice."""
        return max((i for i, e in enumerate(self.env or []) if e.get("name") == name),
                   default=None)

    def existing(self, name: str) -> dict[str, Any] | None:
        """The entry of `name` the container gets."""
        index = self._last(name)
        return None if index is None else (self.env or [])[index]

    def expanded(self, name: str) -> tuple[str, bool]:
        """The value of `name` as the kubelet gives it to the process: `$(VAR)` replaced by
        the value of a plain entry before it, `$$` by `$`, and left as written when nothing
        before it can define VAR (one defined later in the list is not expanded); and whether
        every reference could be read (one to a valueFrom or envFrom variable, or to a
        Service's, cannot be at admission)."""
        env = self.env or []
        index = self._last(name)
        if index is None:
            return "", True
        known: dict[str, str] = {}
        unknown: set[str] = set()
        for entry in env[:index]:
            before = str(entry.get("name"))
            # No value and no valueFrom: the API server left out an empty value.
            value, resolved = _expand(str(entry.get("value") or ""), known, unknown,
                                      self.env_from)
            if "valueFrom" in entry or not resolved:
                known.pop(before, None)  # its value is not known here, nor what refers to it
                unknown.add(before)
            else:
                known[before] = value
                unknown.discard(before)
        return _expand(str(env[index].get("value") or ""), known, unknown, self.env_from)

    def set(self, name: str, value: str) -> None:
        self.values[name] = value

    def build(self) -> list[Op]:
        if not self.values:
            return []
        items = [{"name": n, "value": v} for n, v in self.values.items()]
        if self.env is None:
            return [{"op": "add", "path": f"{self.base}/env", "value": items}]
        ops: list[Op] = []
        for item in items:
            index = self._last(item["name"])  # the one the container gets
            if index is None:
                ops.append({"op": "add", "path": f"{self.base}/env/-", "value": item})
            else:
                ops.append({"op": "replace", "path": f"{self.base}/env/{index}", "value": item})
        return ops


SERVICE_VARIABLE = re.compile(r"_SERVICE_(HOST|PORT)|_PORT(_[0-9]+_(TCP|UDP|SCTP)"
                              r"(_(PROTO|PORT|ADDR))?)?$")
"""The names of the variables the kubelet gives a container for each Service of its
namespace (FOO_SERVICE_HOST, FOO_PORT_80_TCP_ADDR): an env value may refer to them."""


def _expand(text: str, known: Mapping[str, str], unknown: Collection[str] = (),
            env_from: bool = True) -> tuple[str, bool]:
    """Kubernetes' expansion of an env value: `$(VAR)` by `known[VAR]` (left as it is when
    unknown), `$$` by `$`; and whether every reference was read. One to a variable nothing
    before it defines is left as written by the kubelet too, so it is read as written, unless
    it may come from what is not known here: `unknown` (valueFrom entries, or ones that refer
    to such), `env_from` (the container's envFrom may define any name), a Service's. Cut past
    MAX_CONTAINER_MALLOC_CONF characters (a string that long is only said to be too long):
    each variable may refer to the one before it twice, and 22 entries of 1.3 kB in all
    expanded to half a gigabyte on the operator's event loop."""
    out: list[str] = []
    size, resolved, i = 0, True, 0
    while i < len(text) and size <= MAX_CONTAINER_MALLOC_CONF:
        dollar = text.find("$", i)
        if dollar != i:  # plain text up to the next `$`, or to the end
            piece, i = (text[i:], len(text)) if dollar == -1 else (text[i:dollar], dollar)
        elif text.startswith("$$", i):
            piece, i = "$", i + 2
        elif text.startswith("$(", i) and (end := text.find(")", i + 2)) != -1:
            name = text[i + 2:end]
            if name in known:
                piece = known[name]
            else:
                piece = text[i:end + 1]
                if env_from or name in unknown or SERVICE_VARIABLE.search(name):
                    resolved = False
            i = end + 1
        else:
            piece, i = "$", i + 1
        out.append(piece)
        size += len(piece)
    return "".join(out)[:MAX_CONTAINER_MALLOC_CONF + 1], resolved


def _numa_env(spec: InferenceTuningSpec) -> str:
    if spec.numa.policy is NumaPolicy.NODE:
        return f"node:{spec.numa.node}"
    return spec.numa.policy.value


def _allocator(spec: InferenceTuningSpec, env: _EnvPlan, cpu: float | None,
               reasons: list[str], problems: list[str], env_from: bool = False,
               pins: bool = False, pinned_cpus: int | None = None) -> str | None:
    """Fill `env` with the allocator settings, merged with what the container sets itself;
    return a refusal reason if they cannot apply. `env_from`: the container also takes
    variables from envFrom, which its env (and so the operator's) overrides unseen. `pins`:
    the process runs pinned to some of the node's CPUs (the launcher's NUMA binding, the
    command's own, or the static CPU manager); `pinned_cpus` how many, where that is known
    (the static CPU manager's alone)."""
    allocator = spec.allocator
    cpus = f"{cpu:g} CPUs" if cpu is not None else "no CPU limit"
    if allocator.type is AllocatorType.NONE:
        return None
    own, specs_count, kept = "", None, None
    if allocator.type is AllocatorType.JEMALLOC:
        names = ["LD_PRELOAD", "MALLOC_CONF"]
    else:
        # The container's GLIBC_TUNABLES, the count the spec's tunables set, and the count the
        # container sets itself (kept unless arenaMax or the spec's tunables set one).
        found = env.existing("GLIBC_TUNABLES")
        own = str(found.get("value", "")).strip(":") if found else ""
        specs_count = _arena_max_tunable(allocator.glibc_tunables or "")
        kept = (_own_arena_max(env, own)
                if allocator.arena_max is None and specs_count is None else None)
        # MALLOC_ARENA_MAX is written over the container's only for arenaMax: without it,
        # the container's own is kept (a valueFrom one too), and the CPU-sized count is set
        # only where it has none.
        names = ["MALLOC_ARENA_MAX"] if allocator.arena_max else []
        names += ["GLIBC_TUNABLES"] if allocator.glibc_tunables is not None else []
        sets_count = allocator.arena_max is not None or (kept is None and cpu is not None)
        if (found is not None and "valueFrom" in found and allocator.glibc_tunables is None
                and sets_count):
            # Not merged (the spec sets no tunables), and not readable here: a
            # glibc.malloc.arena_max in it would stand beside the MALLOC_ARENA_MAX this sets
            # (arenaMax, or the CPU-sized count), unseen.
            problems.append("GLIBC_TUNABLES on the serving container comes from valueFrom, "
                            "which the operator cannot read: a glibc.malloc.arena_max in it "
                            "may take the place of the MALLOC_ARENA_MAX set here; set it as "
                            "a plain value to have it checked")
    for name in names:
        found = env.existing(name)
        if found is not None and "valueFrom" in found:
            return (f"{name} on the serving container comes from valueFrom, so the allocator "
                    "settings cannot be merged with it; set it as a plain value or use "
                    "allocator type none")
    # What an envFrom source may set that the env written here overrides: also the CPU-sized
    # MALLOC_ARENA_MAX, set where the container's env has none.
    overridden = names
    if (allocator.type is AllocatorType.GLIBC and allocator.arena_max is None
            and specs_count is None and kept is None and cpu is not None):
        overridden = ["MALLOC_ARENA_MAX", *names]
    if env_from and overridden:
        problems.append("the serving container takes variables from envFrom: "
                        f"{' or '.join(overridden)} there is overridden by the allocator "
                        "settings; set it in env instead, where it is merged with them")
    if allocator.type is AllocatorType.JEMALLOC:
        preload = env.existing("LD_PRELOAD")
        current = str(preload.get("value", "")) if preload else ""
        paths = [p for p in current.replace(" ", ":").split(":") if p]
        # A jemalloc the container preloads already (its own build, another path) is the
        # one: a second copy is a second allocator in the process, each with its arenas.
        library = next((p for p in paths if _basename(p).startswith("libjemalloc")),
                       allocator.library_path)
        # First: the first library that defines malloc serves the allocations.
        paths = [library, *(p for p in paths if p != library)]
        others = [p for p in paths if _basename(p).startswith(OTHER_ALLOCATORS)]
        if others:
            problems.append(f"LD_PRELOAD also preloads {', '.join(others)}, another allocator: "
                            f"{library} comes first and serves the allocations, so the other "
                            "is loaded for nothing; remove it, or set allocator type none to "
                            "keep it")
        env.set("LD_PRELOAD", ":".join(paths))
        own_conf, _ = env.expanded("MALLOC_CONF")
        if len(own_conf) > MAX_CONTAINER_MALLOC_CONF:
            return (f"the serving container's MALLOC_CONF is longer than the "
                    f"{MAX_CONTAINER_MALLOC_CONF} characters the operator reads (its $(VAR) "
                    "references expanded); jemalloc has a few dozen options, so shorten it, "
                    "or set allocator type none to leave it alone")
        conf, read = _merged_conf(env, allocator.malloc_conf, problems)
        if read is not None:
            # narenas is added when the string jemalloc reads leaves it unset (a $(VAR) may
            # set it), and the same suffix goes on the value set, references and all.
            sized = effective_malloc_conf(read, cpu)
            conf += sized[len(read):] if sized.startswith(read) else ""
            read = sized
            # What jemalloc reads: the container's settings and the spec's together (a
            # check across options can fail on the two and on neither alone). What it would
            # abort on anywhere leaves the pod untuned, and so does what it would abort on
            # in a pinned process (below). What depends on the node and only warns is
            # reported: per-CPU arenas in a process pinned to some of its CPUs (the
            # launcher's binding on a node with several NUMA nodes, or the static CPU
            # manager) need narenas.
            complaints = check_malloc_conf(read)
            fatal = aborting(read, complaints)
            if fatal is not None:
                return (f"MALLOC_CONF {_quoted(read)} makes jemalloc abort every process of "
                        f"the container (abort_conf or abort), on {fatal.key}: "
                        f"{fatal.message}; fix the serving container's MALLOC_CONF or "
                        "allocator.mallocConf")
            problems += _at_most([f"MALLOC_CONF {_quoted(read)}: {p.message}"
                                  for p in complaints], "problems in MALLOC_CONF")
            newer = new_in_5_3(read)
            if newer:
                problems.append(
                    f"MALLOC_CONF {_quoted(read)} sets {', '.join(newer)}, new in jemalloc "
                    "5.3: the 5.2 of Ubuntu 22.04 and Debian 11 (the base of many CUDA images) "
                    "ignores "
                    + ("them, and with abort_conf:true aborts every process of the container "
                       "on them" if aborts_on_invalid(read) else "them")
                    + "; check the image's libjemalloc2 version")
            seen = set(complaints)
            pinned = [p for p in check_malloc_conf(read, pinned=pins, cpus=pinned_cpus)
                      if p not in seen]
            fatal = next((p for p in pinned if aborting(read, [p])), None)
            if fatal is not None:
                # On a node with several NUMA nodes (most GPU nodes) the launcher pins it to
                # some of the node's CPUs, and every process of the container aborted there:
                # a crash loop the tuning caused, which was only reported.
                return (f"MALLOC_CONF {_quoted(read)} makes jemalloc abort (abort_conf or "
                        "abort) in a process pinned to some of the node's CPUs, as the NUMA "
                        "binding pins it on a node with several NUMA nodes (or the command's "
                        "own taskset or numactl, or the static CPU manager), on "
                        f"{fatal.key}: {fatal.message}; set narenas (or a CPU limit, which "
                        "sets it), drop percpu_arena, or set spec.numa.policy to interleave "
                        "or none")
            problems += _at_most(
                [f"MALLOC_CONF {_quoted(read)} in a process pinned to some of the node's CPUs "
                 f"(NUMA binding, static CPU manager): {p.message}"
                 + ("; jemalloc aborts there (abort_conf or abort)"
                    if aborting(read, [p]) else "") for p in pinned],
                "problems in MALLOC_CONF for a pinned process")
        if conf or env.existing("MALLOC_CONF") is not None:
            env.set("MALLOC_CONF", conf)
            reasons.append(f"allocator: preload {library} with MALLOC_CONF={conf} ({cpus})")
        else:
            # Set empty, it overrode one from envFrom or the image's ENV, unseen.
            reasons.append(f"allocator: preload {library}, MALLOC_CONF not set (no settings, "
                           f"and {cpus} to size narenas from)")
    else:
        arenas = allocator.arena_max
        # Read in order, the later setting of a tunable wins: the spec's.
        tunables = [t for t in (own, allocator.glibc_tunables) if t]
        if kept is not None:
            # The container's own, as a MALLOC_CONF narenas is kept: a low count set to
            # bound the memory arenas take was raised to the CPU limit, unseen.
            reasons.append(f"allocator: glibc with the container's own {kept} ({cpus}; "
                           "allocator.arenaMax overrides it)")
        elif arenas is None and specs_count is not None:
            reasons.append(f"allocator: glibc with glibc.malloc.arena_max={specs_count} from "
                           f"allocator.glibcTunables ({cpus})")
        else:
            if arenas is None and cpu is not None:
                # glibc's default is 8 arenas per core of the *node*; size to the container.
                arenas = max(1, math.ceil(cpu))
            if arenas is not None:
                env.set("MALLOC_ARENA_MAX", str(arenas))
                if any(_arena_max_tunable(t) is not None for t in tunables):
                    # glibc takes glibc.malloc.arena_max in GLIBC_TUNABLES over
                    # MALLOC_ARENA_MAX, in whichever order they come: the count was reported
                    # applied and the container's (or the spec's) tunable was the one used.
                    tunables.append(f"{ARENA_MAX_TUNABLE}={arenas}")
            reasons.append(f"allocator: glibc with MALLOC_ARENA_MAX={arenas or 'unset'} "
                           f"({cpus})")
        if allocator.glibc_tunables is not None or len(tunables) > (1 if own else 0):
            env.set("GLIBC_TUNABLES", ":".join(tunables))
    return None


ARENA_MAX_TUNABLE = "glibc.malloc.arena_max"


def _arena_max_tunable(tunables: str) -> str | None:
    """The value glibc.malloc.arena_max has in a GLIBC_TUNABLES string (its last setting),
    None when it has none."""
    values = [t.split("=", 1)[1] if "=" in t else "" for t in tunables.split(":")
              if t.split("=", 1)[0].strip() == ARENA_MAX_TUNABLE]
    return values[-1] if values else None


def _own_arena_max(env: _EnvPlan, tunables: str) -> str | None:
    """How the container sets glibc's arena count itself, if it does: MALLOC_ARENA_MAX (one
    from valueFrom is refused before this), or glibc.malloc.arena_max in GLIBC_TUNABLES."""
    found = env.existing("MALLOC_ARENA_MAX")
    if found is not None:
        if "valueFrom" in found:
            return "MALLOC_ARENA_MAX (from valueFrom)"
        return f"MALLOC_ARENA_MAX={found.get('value', '')}"
    value = _arena_max_tunable(tunables)
    return None if value is None else f"GLIBC_TUNABLES {ARENA_MAX_TUNABLE}={value}"


def _merged_conf(env: _EnvPlan, spec_conf: str | None,
                 problems: list[str]) -> tuple[str, str | None]:
    """(the MALLOC_CONF to set, the one the process will read: None when that cannot be known
    at admission). The container's own MALLOC_CONF comes first, the spec's after it: jemalloc
    reads the pairs in order, so the spec's win where both set an option and the
    container's others stay (a background_thread:true the image relies on). One jemalloc
    cannot read to its end (a syntax error, after which it reads nothing) is replaced, and
    said so. `$(VAR)` references in the container's stay, for the kubelet to expand; they
    are expanded here as it will to check the string, when they refer to plain values."""
    spec_part = spec_conf or ""
    found = env.existing("MALLOC_CONF")
    raw = str(found.get("value", "")) if found else ""
    expanded, known = env.expanded("MALLOC_CONF")
    if not expanded.strip():
        return spec_part, spec_part
    # Only a trailing comma goes (jemalloc read the pairs before it, and the spec's follow
    # one): a leading comma or a space makes jemalloc ignore the whole string, so it stays
    # as it is, to be reported as the syntax error it is, not fixed into settings that
    # never applied.
    own = raw.rstrip(",")
    own_read = expanded[:len(expanded) - (len(raw) - len(own))]  # what `own` expands to
    read = own_read.rstrip(",")
    if not read:  # commas only: no settings, and the spec's must not follow a comma
        return spec_part, spec_part
    if not known:
        problems.append(f"the serving container's MALLOC_CONF {raw!r} refers to variables "
                        "whose values are not known here (valueFrom, envFrom, a Service's), "
                        "so the "
                        "string jemalloc reads is not known here: it is not checked, and no "
                        "narenas is added to it")
        return _joined(own, spec_part), None
    _, syntax = scan(read)
    if syntax is not None:
        problems.append(f"the serving container's MALLOC_CONF {_quoted(read)} has a syntax "
                        "error, and jemalloc reads nothing after it: it is replaced by the spec's "
                        "allocator.mallocConf; fix it to keep its settings")
        return spec_part, spec_part
    # A trailing comma a reference expands to stays (an optional $(EXTRA) left empty): the
    # spec's follow it without another, which jemalloc would read as a malformed string and
    # drop with everything after it. The string checked is the one the process gets.
    sep = "" if own_read.endswith(",") else ","
    return _joined(own, spec_part, sep), _joined(own_read, spec_part, sep)


def _joined(own: str, spec_part: str, sep: str = ",") -> str:
    return f"{own}{sep}{spec_part}" if spec_part else own


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


LAUNCHER_RESOURCES = {"cpu": ("50m", "10m"), "memory": ("64Mi", "32Mi"),
                      "ephemeral-storage": ("1Mi", "0")}
"""Per resource, (what the launcher's init container asks, the least it can do with): it
copies a small file (about 15 MB of memory at its peak). Ephemeral storage is set only where a
LimitRange names it: the container writes nothing of its own. Any other resource a LimitRange
names (a GPU, huge pages) is set to 0, or to the LimitRange's min: left out, LimitRanger gave
the init container its default, and `max: {nvidia.com/gpu: 8}` made a one-GPU pod hold a
node's eight GPUs."""


def launcher_resources(limit_ranges: tuple[LimitRangeView, ...]) -> dict[str, str] | str:
    """The launcher's requests (== limits, so a Guaranteed pod stays Guaranteed) within the
    namespace's LimitRanges, or why no such values exist. LimitRanger checks containers after
    the webhooks: an init container outside min..max made a pod the API server refuses, and the
    ReplicaSet could create none. It also fills in its defaults again after a webhook changed
    the pod (the API server runs its own mutating plugins again), so every resource a
    LimitRange names is set here."""
    chosen: dict[str, str] = {}
    for resource, (wanted, least) in LAUNCHER_RESOURCES.items():
        lows = [(parse_quantity(q), q, r.name) for r in limit_ranges for res, q in r.minimum
                if res == resource]
        highs = [(parse_quantity(q), q, r.name) for r in limit_ranges for res, q in r.maximum
                 if res == resource]
        if resource == "ephemeral-storage" and not any(
                resource in r.named for r in limit_ranges):
            continue
        value, text = parse_quantity(wanted), wanted
        low = max(lows, default=None)
        if low is not None and low[0] > value:
            value, text = low[0], low[1]
        high = min(highs, default=None)
        if high is not None and high[0] < value:
            if high[0] < parse_quantity(least) or (low is not None and high[0] < low[0]):
                return (f"LimitRange {high[2]} allows at most {high[1]} {resource} per "
                        f"container, and the launcher's init container needs {least} or more"
                        + ("" if low is None else f" (and at least {low[1]}, LimitRange "
                           f"{low[2]})")
                        + "; raise the LimitRange's max, or set spec.numa.policy to none")
            value, text = high[0], high[1]
        chosen[resource] = text
    others = sorted({res for r in limit_ranges for res in r.named} - set(LAUNCHER_RESOURCES))
    for resource in others:
        # The least the LimitRange allows: a min is at most what the pod's own containers
        # request (it holds for them too), and an init container's request counts only as
        # far as it exceeds theirs, so the pod asks for no more than before.
        mins = [(parse_quantity(q), q) for r in limit_ranges for res, q in r.minimum
                if res == resource]
        floor = max(mins, default=None)
        if floor is None or floor[0] <= 0:
            ratio = next((r.name for r in limit_ranges if resource in r.ratios), None)
            if ratio is not None:
                return (f"LimitRange {ratio} sets a maxLimitRequestRatio for {resource}, so "
                        f"every container must request some, and the launcher's init "
                        f"container uses none; remove {resource} from the LimitRange's "
                        "maxLimitRequestRatio, or set spec.numa.policy to none")
            chosen[resource] = "0"
        else:
            chosen[resource] = floor[1]
    return chosen


LAUNCHER_UID = 65532
"""The user of the operator's image (Dockerfile), which the launcher's init container runs as
unless the serving container runs as another user than root (`_launcher_user`)."""


def _launcher_user(pod_spec: Mapping[str, Any], serving: Mapping[str, Any]) -> int:
    """The UID of the launcher's init container: the serving container's runAsUser, or the
    pod's, when it is a user other than root (what admits the serving container admits that
    one: OpenShift's restricted SCC gives each pod a UID from its namespace's range, and
    65532, outside it, got every tuned pod refused); else LAUNCHER_UID (as root, with
    runAsNonRoot, the kubelet would not start it)."""
    for context in (serving.get("securityContext"), pod_spec.get("securityContext")):
        uid = context.get("runAsUser") if isinstance(context, Mapping) else None
        if isinstance(uid, int) and not isinstance(uid, bool) and uid > 0:
            return uid
    return LAUNCHER_UID


def _launcher_ops(pod_spec: dict[str, Any], index: int, serving: dict[str, Any],
                  context: PodContext, resources: Mapping[str, str]) -> list[Op]:
    ops: list[Op] = []
    volume = {"name": LAUNCHER_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    if not any(v.get("name") == LAUNCHER_VOLUME for v in pod_spec.get("volumes") or []):
        ops.append({"op": "add", "path": "/spec/volumes/-", "value": volume}
                   if pod_spec.get("volumes") else
                   {"op": "add", "path": "/spec/volumes", "value": [volume]})
    init = {
        "name": LAUNCHER_INIT,
        "image": context.launcher_image,
        "command": [*LAUNCHER_INSTALL, LAUNCHER_DIR],
        "volumeMounts": [{"name": LAUNCHER_VOLUME, "mountPath": LAUNCHER_DIR}],
        # requests == limits keeps a Guaranteed pod Guaranteed.
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True,
                            "runAsUser": _launcher_user(pod_spec, serving),
                            "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if not any(c.get("name") == LAUNCHER_INIT for c in pod_spec.get("initContainers") or []):
        # First, so the launcher is in place before any other init container might need it.
        ops.append({"op": "add", "path": "/spec/initContainers/0", "value": init}
                   if pod_spec.get("initContainers") else
                   {"op": "add", "path": "/spec/initContainers", "value": [init]})
    base = _pointer("spec", "containers", index)
    mount = {"name": LAUNCHER_VOLUME, "mountPath": LAUNCHER_DIR, "readOnly": True}
    mounts = serving.get("volumeMounts")
    if not any(_launcher_mount(m) for m in mounts or []):
        ops.append({"op": "add", "path": f"{base}/volumeMounts/-", "value": mount} if mounts
                   else {"op": "add", "path": f"{base}/volumeMounts", "value": [mount]})
    command = list(serving["command"])
    wrapped = command if command[:1] == [LAUNCHER_PATH] else [LAUNCHER_PATH, "--", *command]
    # Compared with the pod's own command: batching may have edited an already wrapped one.
    if wrapped != list(pod_spec["containers"][index].get("command") or []):
        ops.append({"op": "replace", "path": f"{base}/command", "value": wrapped})
    return ops


LAUNCHER_INSTALL = ["python", "-m", "infertune", "launcher", "install"]
"""How the launcher's init container starts: what tells it from a container of that name."""


def _at_launcher_dir(mount: Mapping[str, Any]) -> bool:
    """Whether `mount` is at LAUNCHER_DIR, however it is spelled (`/infertune/.`,
    `//infertune`, `/x/../infertune`): the API server compares mount paths as strings, and the
    runtime mounted both there, the launcher's read-only volume hiding the container's."""
    path = str(mount.get("mountPath") or "")
    return bool(path) and _absolute(path) == LAUNCHER_DIR


def _launcher_mount(mount: Mapping[str, Any]) -> bool:
    return mount.get("name") == LAUNCHER_VOLUME and _at_launcher_dir(mount)


def _launcher_clash(pod_spec: Mapping[str, Any], serving: Mapping[str, Any]) -> str | None:
    """What of the pod's own takes a name or path the launcher needs (its pieces from an
    earlier admission are recognised by what they are, not by name alone)."""
    for container in pod_spec.get("containers") or []:
        if container.get("name") == LAUNCHER_INIT:
            return (f"the pod's container {LAUNCHER_INIT} has the name of the launcher's init "
                    "container, and names are unique in a pod; rename the container")
    for container in pod_spec.get("initContainers") or []:
        if (container.get("name") == LAUNCHER_INIT
                and list(container.get("command") or [])[:5] != LAUNCHER_INSTALL):
            return (f"the pod's init container {LAUNCHER_INIT} has the name of the launcher's "
                    "init container, and names are unique in a pod; rename it")
    for volume in pod_spec.get("volumes") or []:
        if volume.get("name") == LAUNCHER_VOLUME and "emptyDir" not in volume:
            return (f"the pod's volume {LAUNCHER_VOLUME} has the name of the launcher's volume "
                    "(an emptyDir), and names are unique in a pod; rename the volume")
    for mount in serving.get("volumeMounts") or []:
        if _at_launcher_dir(mount) and not _launcher_mount(mount):
            return (f"container {serving.get('name')} mounts volume {mount.get('name')} at "
                    f"{LAUNCHER_DIR}, where the launcher goes, and a path is mounted once; "
                    "mount it elsewhere")
        path = str(mount.get("mountPath") or "")
        if _absolute(path).startswith(LAUNCHER_DIR + "/"):
            # Inside the launcher's read-only emptyDir, the runtime cannot make the mount
            # point (kubernetes/kubernetes#121294): the container would fail at every start,
            # which failurePolicy: Ignore does not cover.
            return (f"container {serving.get('name')} mounts volume {mount.get('name')} at "
                    f"{path}, inside {LAUNCHER_DIR} where the launcher's read-only volume "
                    "goes, and the runtime cannot make a mount point in it; mount it elsewhere")
    for device in serving.get("volumeDevices") or []:
        path = _absolute(str(device.get("devicePath") or ""))
        if path == LAUNCHER_DIR or path.startswith(LAUNCHER_DIR + "/"):
            # The API server refuses a mountPath that is a devicePath too, and a device node
            # cannot be made inside the launcher's read-only volume.
            return (f"container {serving.get('name')} attaches volume {device.get('name')} as "
                    f"the device {path}, where the launcher's volume goes; attach it elsewhere")
    return None


def _absolute(path: str) -> str:
    """`path` normalized and read from `/` (`/infertune/./a//b` is `/infertune/a/b`), to be
    compared with LAUNCHER_DIR."""
    return "/" + posixpath.normpath(path).lstrip("/")


def _pod_level_shortfall(pod_spec: Mapping[str, Any], resources: Mapping[str, str]) -> str | None:
    """Why the pod's own resources (spec.resources, pod-level) cannot hold the launcher's init
    container, None when they can or set none: the API server refuses a pod whose pod-level
    requests are under what its containers ask, the first init container's included (its
    limits are checked against the regular containers only)."""
    own = pod_spec.get("resources")
    if not isinstance(own, Mapping):
        return None
    for resource, value in (own.get("requests") or {}).items():
        wanted = resources.get(str(resource))
        if wanted is None:
            continue
        try:
            short = parse_quantity(str(value)) < parse_quantity(wanted)
        except ValueError:
            continue  # the API server took it: not a number this parser reads
        if short:
            return (f"the pod's own resources.requests.{resource} is {value}, under the "
                    f"{wanted} the launcher's init container asks for; raise it, or set "
                    "spec.numa.policy to none")
    return None


QUOTED_CHARACTERS = 120
"""How much of a value a problem quotes: the problems go into admission warnings, status and
the dry-run plan annotation, one per complaint about it."""
PROBLEMS_OF_A_KIND = 5
"""How many complaints of one kind (about one MALLOC_CONF) are listed; the rest are counted."""
MAX_CONTAINER_MALLOC_CONF = 4096
"""The longest MALLOC_CONF of the serving container the webhook reads (the spec's own
allocator.mallocConf has the same limit). Checking one is not linear in its length, and runs
in the webhook on the operator's event loop: 90 kB of unknown keys held it 8 s, every pod
creation meanwhile admitted untuned at the webhook's timeout."""


def _quoted(value: str) -> str:
    """`value` quoted, cut to QUOTED_CHARACTERS: each of 200 complaints about a 3.5 KB
    MALLOC_CONF quoted all of it, and the dry-run plan annotation of a pod grew past the API
    server's 256 KiB, so a DryRun pod was refused."""
    return repr(value if len(value) <= QUOTED_CHARACTERS else value[:QUOTED_CHARACTERS] + "...")


def _at_most(problems: list[str], what: str) -> list[str]:
    if len(problems) <= PROBLEMS_OF_A_KIND:
        return problems
    more = len(problems) - PROBLEMS_OF_A_KIND
    return [*problems[:PROBLEMS_OF_A_KIND], f"and {more} more {what}"]


def _knob(spec: InferenceTuningSpec) -> str | None:
    knob = batching_knob(spec.batching, spec.engine)
    return knob.value if knob is not None else None


def _flag_problem(spec: InferenceTuningSpec, serving: Mapping[str, Any]) -> str | None:
    """Why batching mode Auto cannot set `--<knob>` on the serving container's command line,
    None when it can."""
    driven = batching_knob(spec.batching, spec.engine)
    knob = None if driven is None else driven.value
    problem = auto_batching_problem(spec.batching, driven, spec.engine)
    if problem is not None or knob is None:
        return f"batching mode Auto cannot drive {knob or 'a knob'}: {problem}"
    flag = f"--{knob}"
    if _runs_shell_script(serving):
        return (f"container {serving.get('name')} runs a shell script (-c): batching mode Auto "
                f"cannot set {flag} inside it; put the engine's command line in command/args, "
                "or use mode Recommend")
    if not serving.get("command") and not serving.get("args"):
        return (f"container {serving.get('name')} sets neither command nor args: adding {flag} "
                "as args would replace the image's CMD; set the engine's command line in the "
                "pod template, or use mode Recommend")
    return None


def _flag_at(argv: list[Any], flag: str) -> int | None:
    """Where `flag` is in `argv` (as `--flag N` or `--flag=N`, or with underscores as vLLM's
    parser also takes it), None when it is not. The last one: argparse takes the last value
    of a flag given twice (a chart's extra args appended to its own)."""
    spellings = (flag, "--" + flag[2:].replace("-", "_"))
    found = None
    for i, arg in enumerate(argv):
        text = str(arg)
        if (text in spellings and i + 1 < len(argv)) or (text.partition("=")[0] in spellings \
                and "=" in text):
            found = i
    return found


def unprobed_container(spec: InferenceTuningSpec, pod_spec: Mapping[str, Any]) -> str | None:
    """The serving container's name when it has neither a readinessProbe nor a startupProbe,
    else None (also when it is not in the template: `template_batching` says so). Without
    either, the kubelet reports the container Ready as soon as it starts, minutes before an
    inference engine has loaded its model and serves."""
    containers = list(pod_spec.get("containers") or [])
    index = _serving_index(spec, containers)
    if index is None or not isinstance(containers[index], Mapping):
        return None
    serving = containers[index]
    if serving.get("readinessProbe") or serving.get("startupProbe"):
        return None
    return str(serving.get("name") or f"containers[{index}]")


class TemplateBatching(NamedTuple):
    """What a Deployment's pod template says about the batching knob (`template_batching`)."""

    value: int | None
    """The knob's value on the serving container's command line; None when it is not there
    (the engine's default applies) or is not a number."""
    problem: str | None
    """Why mode Auto cannot set the knob on these pods; None when it can."""
    container: str | None = None
    """A digest of the serving container's image, command, args and environment; None when
    not read, or while the Deployment rolls out (some pods still run another template). A
    knob the pods were seen to ignore (status.batching.ignored) is tried again once it
    changes."""


def template_batching(spec: InferenceTuningSpec, pod_spec: Mapping[str, Any],
                      rolled_out: bool = True) -> TemplateBatching:
    """The batching knob as the pods of `pod_spec` (a Deployment's spec.template.spec) run it,
    and whether mode Auto can change it there. Without this, a knob the webhook cannot set was
    stepped all the same: every step re-created the pods, which still ran the old value.
    `rolled_out`: every pod of the Deployment runs this template (DeploymentReplicas)."""
    containers = list(pod_spec.get("containers") or [])
    index = _serving_index(spec, containers)
    if index is None:
        return TemplateBatching(None, f"spec.container {spec.container!r} is not in the pod "
                                "template; fix spec.container")
    serving, knob = containers[index], _knob(spec)
    value = None
    if knob is not None:
        flag = f"--{knob}"
        for field_name in ("args", "command"):
            argv = list(serving.get(field_name) or [])
            at = _flag_at(argv, flag)
            if at is not None:
                _, equals, text = str(argv[at]).partition("=")
                text = text if equals else str(argv[at + 1])
                # At most 9 digits: a longer one is no batch size, and past 4300 digits
                # int() raised, failing every evaluation of the tuning.
                value = (int(text) if text.isascii() and text.isdigit() and len(text) <= 9
                         else None)
                break
    return TemplateBatching(value, _flag_problem(spec, serving),
                            container_digest(serving) if rolled_out else None)


def container_digest(container: Mapping[str, Any]) -> str:
    """A digest of what decides how a container's arguments reach its program: its image
    (the entrypoint), command and args, and its environment (an entrypoint that reads its
    flags from a variable)."""
    what = [container.get(key) for key in ("image", "command", "args", "env", "envFrom")]
    return hashlib.sha256(json.dumps(what, default=str).encode()).hexdigest()[:16]


def _batching_ops(spec: InferenceTuningSpec, base: str, serving: dict[str, Any],
                  context: PodContext, reasons: list[str], problems: list[str]) -> list[Op]:
    """Batching mode Auto: set `--<knob> <value>` on the serving command line."""
    if spec.batching.mode is not BatchingMode.AUTO or context.batching_value is None:
        return []
    knob = _knob(spec)
    problem = _flag_problem(spec, serving)
    if problem is not None:
        problems.append(problem)
        return []
    value = min(spec.batching.max, max(spec.batching.min, context.batching_value))
    flag = f"--{knob}"
    for field_name in ("args", "command"):
        argv = list(serving.get(field_name) or [])
        at = _flag_at(argv, flag)
        if at is None:
            continue
        name, equals, _ = str(argv[at]).partition("=")
        if equals:
            argv[at] = f"{name}={value}"
        else:
            argv[at + 1] = str(value)
        reasons.append(f"batching: {flag} {value} (mode Auto)")
        return [{"op": "replace", "path": f"{base}/{field_name}", "value": argv}]
    # Not on the command line yet: args come after command, so appending to args adds it.
    reasons.append(f"batching: {flag}={value} added (mode Auto)")
    if serving.get("args") is None:
        return [{"op": "add", "path": f"{base}/args", "value": [f"{flag}={value}"]}]
    return [{"op": "add", "path": f"{base}/args/-", "value": f"{flag}={value}"}]


SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh"})
class Wrapper(NamedTuple):
    """How a program that runs the command after it takes its own options."""

    valued: str = ""
    """Its short options that take a value (`-p SIGTERM` or `-pSIGTERM`)."""
    valued_long: frozenset[str] = frozenset()
    """Its long options that take a value (`--rewrite 15:2` or `--rewrite=15:2`)."""
    users: int = 0
    """Words it takes before the command (gosu's and su-exec's user)."""
    assignments: bool = False
    """VAR=value words before the command (env)."""
    split: str = ""
    """The option whose value is split into more words of its command line (env -S)."""


INIT_WRAPPERS: dict[str, Wrapper] = {
    # tini: -p SIGNAL (parent death signal), -e CODE (an exit code taken for success).
    "tini": Wrapper("pe"), "tini-static": Wrapper("pe"),
    "dumb-init": Wrapper("r", frozenset({"rewrite"})),
    "catatonit": Wrapper(),
    # GNU env: -u NAME, -C DIR, -a ARG0, -S STRING (split into words, as a shebang line).
    "env": Wrapper("uCaS", frozenset({"unset", "chdir", "argv0", "split-string"}),
                   assignments=True, split="S"),
    "nice": Wrapper("n", frozenset({"adjustment"})),
    "gosu": Wrapper(users=1), "su-exec": Wrapper(users=1),
    # stdbuf -o L; timeout [-s SIG] [-k D] DURATION; chrt [-f|-r|...] PRIORITY.
    "stdbuf": Wrapper("ioe", frozenset({"input", "output", "error"})),
    "timeout": Wrapper("sk", frozenset({"signal", "kill-after"}), users=1),
    "chrt": Wrapper("TPD", frozenset({"sched-runtime", "sched-period", "sched-deadline"}),
                    users=1),
}
"""Programs that run the command after them, after their options (`--` ends them), and how
they take those. An option that takes a value and was read as a flag made its value the
program: `tini -p SIGTERM -- numactl ...` hid the numactl from the checks."""


def _runs_shell_script(container: Mapping[str, Any]) -> bool:
    """`sh -c "vllm serve ..."` (or `bash -lc`, `bash -o pipefail -c`, behind tini, env or
    our launcher): the command line is one string to a shell, where a flag appended after it
    would only become the script's $0. Only the shell's own options count: in
    `sh entrypoint.sh -c x` the -c is the script's."""
    argv = _after_wrappers(container)
    if not argv or _program(argv[0]) not in SHELLS:
        return False
    options = iter(argv[1:])
    for word in options:
        if word in ("-o", "+o", "-O", "+O"):  # set an option by name: the next word is it
            next(options, None)
        elif not word.startswith(("-", "+")) or word in ("-", "--"):
            return False  # the script file, or the end of the shell's options
        elif not word.startswith("--") and "c" in word[1:]:
            return True
    return False


MAX_SPLITS = 16
"""`env -S` strings read in one command line; past them the rest is taken as it is (each
one copies what follows it)."""


def _after_wrappers(container: Mapping[str, Any]) -> list[str]:
    """The container's command line from the program the init wrappers (and our launcher)
    run on. Walked by position, each word once: cut off word by word, a command of tens of
    thousands of words (`env A0=1 A1=1 ...`, `env env env ...`) took seconds of the event
    loop, while every other pod's admission waited past its timeout."""
    argv = [str(a) for a in (*(container.get("command") or []), *(container.get("args") or []))]
    at = 0
    if argv[:1] == [LAUNCHER_PATH]:
        at = 2 if argv[1:2] == ["--"] else 1
    splits = [0]
    while at < len(argv) and (wrapper := INIT_WRAPPERS.get(_program(argv[at]))) is not None:
        argv, at = _wrapped(wrapper, argv, at + 1, splits)
    return argv[at:]


def _wrapped(wrapper: Wrapper, argv: list[str], at: int,
             splits: list[int]) -> tuple[list[str], int]:
    """Where the command line a wrapper runs starts in `argv`, from `at`, the word after the
    wrapper's name (as getopt reads them: options up to the first other word, or up to `--`);
    with an `env -S` string, a new argv (its words, then the rest). `splits` counts those
    read (MAX_SPLITS)."""
    while at < len(argv):
        word = argv[at]
        if word == "--":
            at += 1
            # GNU env takes VAR=value words after `--` too (`env -i -- PATH=/bin cmd`).
            while wrapper.assignments and at < len(argv) and "=" in argv[at]:
                at += 1
            return argv, min(at + wrapper.users, len(argv))
        if word == "-" and wrapper.assignments:
            at += 1  # env's old spelling of -i
            continue
        if word.startswith("--"):
            name, equals, value = word[2:].partition("=")
            taken = 2 if name in wrapper.valued_long and not equals else 1
            if name == "split-string" and "split-string" in wrapper.valued_long:
                if splits[0] >= MAX_SPLITS:
                    return argv, len(argv)
                splits[0] += 1
                argv, at = _split(value if equals else "".join(argv[at + 1:at + 2])) + \
                    argv[at + taken:], 0
                continue
            at += taken
        elif word.startswith("-") and word != "-":
            for offset, letter in enumerate(word[1:], start=2):
                if letter in wrapper.valued:
                    value = word[offset:] or "".join(argv[at + 1:at + 2])
                    rest = at + 1 if word[offset:] else at + 2
                    if letter == wrapper.split:
                        if splits[0] >= MAX_SPLITS:
                            return argv, len(argv)
                        splits[0] += 1
                        argv, at = _split(value) + argv[rest:], 0
                    else:
                        at = rest
                    break
            else:
                at += 1
        elif wrapper.assignments and "=" in word:
            at += 1
        else:
            return argv, min(at + wrapper.users, len(argv))
    return argv, len(argv)


def _split(value: str) -> list[str]:
    """env -S's string as its words (quotes as a shell takes them; one that does not split
    stays one word)."""
    try:
        return shlex.split(value)
    except ValueError:
        return [value]


SELF_BINDING = frozenset({"numactl", "taskset"})
"""Programs that set the CPUs or memory policy of the command they run: inside the launcher
they replace its binding in part (taskset the CPUs, leaving memory bound to the launcher's
node) or whole."""


def _binds_itself(container: Mapping[str, Any]) -> str | None:
    """The program in the container's command that binds it itself (numactl, taskset), if
    any."""
    argv = _after_wrappers(container)
    program = _program(argv[0]) if argv else ""
    return program if program in SELF_BINDING else None


def _program(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _meta_ops(pod: dict[str, Any], section: str, values: dict[str, str]) -> list[Op]:
    current = (pod.get("metadata") or {}).get(section)
    if current is None:
        return [{"op": "add", "path": _pointer("metadata", section), "value": dict(values)}]
    return [{"op": "add", "path": _pointer("metadata", section, k), "value": v}
            for k, v in values.items() if current.get(k) != v]


def plan_pod_patch(spec: InferenceTuningSpec, pod: dict[str, Any],
                   context: PodContext) -> PodPlan:
    """The patch that tunes `pod` as `spec` says, or a refusal with its reason."""
    try:
        return _plan_pod_patch(spec, pod, context)
    except QuantityError as exc:
        # A quantity the API server stored and this parser does not take (a decimal above
        # 2^63-1, such as a memory limit of 10E): raised, the pod was admitted with only
        # "pod tuning failed", and every re-tuning pass, which previews the template, failed
        # with a traceback and wrote no status.
        revision = revisions(spec, context.batching_value,
                             (context.mig_profile, context.mig_strategy))[0]
        return PodPlan(revision, refused=True, problems=[
            f"a resource quantity of the pod cannot be read ({str(exc)[:300]}), so the pod is "
            "left as it is; fix that quantity in the pod template"])


WINDOWS_BUILD = "node.kubernetes.io/windows-build"
"""A node label only Windows nodes carry (the kubelet sets it there)."""


def _windows_by_affinity(pod_spec: Mapping[str, Any]) -> bool:
    """Whether the pod's required node affinity admits Windows nodes only: every one of its
    terms (they are ORed) asks for kubernetes.io/os In [windows] or for a Windows build.
    Placed so without spec.os, it was given the Linux launcher and never left Init."""
    affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if not isinstance(terms, list) or not terms:
        return False

    def windows(term: Any) -> bool:
        for expression in (term.get("matchExpressions") or []) if isinstance(term, Mapping) \
                else []:
            if not isinstance(expression, Mapping):
                continue
            key, operator = expression.get("key"), expression.get("operator")
            values = [str(v).lower() for v in expression.get("values") or []]
            if key == "kubernetes.io/os" and operator == "In" and values and set(values) == {
                    "windows"}:
                return True
            if key == WINDOWS_BUILD and operator in ("In", "Exists"):
                return True
        return False

    return all(windows(term) for term in terms)


def _plan_pod_patch(spec: InferenceTuningSpec, pod: dict[str, Any],
                    context: PodContext) -> PodPlan:
    revision, shape = revisions(spec, context.batching_value,
                                (context.mig_profile, context.mig_strategy))
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if labels.get(keys.REVISION) == revision:
        return PodPlan(revision, reasons=[f"already tuned to revision {revision}"])
    pod_spec = pod.get("spec") or {}
    selector = pod_spec.get("nodeSelector") or {}
    if (str((pod_spec.get("os") or {}).get("name") or "").lower() == "windows"
            or str(selector.get("kubernetes.io/os") or "").lower() == "windows"
            or _windows_by_affinity(pod_spec)):
        # The launcher is a shell script, and the API server refuses a Windows pod whose
        # container has a seccomp profile or Linux capabilities, as the launcher's has.
        return PodPlan(revision, refused=True, problems=[
            "the pod runs on Windows (spec.os.name, its nodeSelector or its required node "
            "affinity): NUMA binding, the launcher and the "
            "allocator settings are for Linux, so it is left as it is; point spec.targetRef "
            "at a Linux Deployment"])
    containers = pod_spec.get("containers") or []
    index = _serving_index(spec, containers)
    if not containers:
        return PodPlan(revision, refused=True, problems=["the pod has no containers"])
    if index is None:
        names = ", ".join(str(c.get("name"))[:63] for c in containers[:10]) + (
            f" and {len(containers) - 10} more" if len(containers) > 10 else "")
        return PodPlan(revision, refused=True, problems=[
            f"spec.container {spec.container!r} is not in the pod (containers: {names}); fix "
            "spec.container"])
    serving = containers[index]
    name = str(serving.get("name"))
    reasons: list[str] = [f"serving container: {name}"]
    problems: list[str] = []

    request, limit = container_memory(serving)
    try:
        memory_high = resolve_memory_high(spec.memory, request=request, limit=limit)
    except MemoryHighError as exc:
        if not exc.partial:
            return PodPlan(revision, refused=True, problems=[exc.said_of_pod()])
        memory_high = MemoryHigh(None, "memory.high stays at max (see the problem)")
        problems.append(exc.said_of_pod())
    reasons.append(f"memory: {memory_high.reason}")
    if memory_high.warning is not None:
        problems.append(memory_high.warning)

    binder = _binds_itself(serving)
    # Whether the launcher wraps the serving command (and binds it).
    launcher = (spec.numa.policy is not NumaPolicy.NONE and bool(serving.get("command"))
                and binder is None)
    env = _EnvPlan(_pointer("spec", "containers", index), serving.get("env"),
                   bool(serving.get("envFrom")))
    binds = ((spec.numa.policy in (NumaPolicy.NODE, NumaPolicy.GPU_LOCAL)
              and bool(serving.get("command"))) or binder is not None)
    exclusive = context.static_cpu_manager and _exclusive_cpus(pod_spec, serving)
    cpu = _cpu_limit(serving)
    refusal = _allocator(spec, env, cpu, reasons, problems,
                         bool(serving.get("envFrom")),
                         # The launcher pins it, or the command's own taskset or numactl.
                         pins=binds or exclusive, pinned_cpus=(
                             # The static CPU manager's CPUs alone: as many as the limit.
                             int(cpu) if exclusive and not binds and cpu is not None else None))
    if refusal is not None:
        return PodPlan(revision, refused=True, problems=[refusal])

    gpuless = _gpu_local_without_gpu(spec, pod_spec, serving) if launcher else None
    if gpuless is not None:
        # Reported, not refused: a GPU can come another way the webhook cannot see (a
        # runtime's default, an image's ENV), and the launcher finds it at start.
        fate = ("numa.strict stops it (exit 78) at every start" if spec.numa.strict else
                "it runs unbound")
        problems.append(f"{gpuless}: {fate}; request nvidia.com/gpu (or set spec.mig), or "
                        "set spec.numa.policy to node or interleave")
    refused = _memory_policy_refused(pod_spec, serving) if launcher else None
    if refused is not None and spec.numa.strict:
        return PodPlan(revision, refused=True, problems=[
            f"{refused}, and numa.strict would stop the container (exit 78) at every start; "
            "add SYS_NICE to its securityContext.capabilities.add, or set numa.strict to "
            "false (its CPUs are then bound, and its memory is local by the kernel's "
            "default)"])
    if refused is not None:
        gets = ("it runs unbound" if spec.numa.policy is NumaPolicy.INTERLEAVE else
                "it gets its NUMA node's CPUs only, its memory local by the kernel's default "
                "rather than bound")
        problems.append(f"{refused}: {gets}; add SYS_NICE to its "
                        "securityContext.capabilities.add for the whole binding")

    clash = _launcher_clash(pod_spec, serving) if launcher else None
    if clash is not None:
        # Patched, the pod is one the API server refuses (a duplicate name, a mountPath twice),
        # which failurePolicy: Ignore does not cover: the ReplicaSet could create no pod.
        return PodPlan(revision, refused=True, problems=[clash])
    try:
        resources = launcher_resources(context.limit_ranges) if launcher else {}
    except ValueError as exc:  # a quantity the API server took and this parser did not
        resources = f"a LimitRange of the namespace cannot be read: {exc}"
    if isinstance(resources, str):
        return PodPlan(revision, refused=True, problems=[resources])
    shortfall = _pod_level_shortfall(pod_spec, resources)
    if shortfall is not None:
        return PodPlan(revision, refused=True, problems=[shortfall])
    ops: list[Op] = []
    for op in _batching_ops(spec, _pointer("spec", "containers", index), serving, context,
                            reasons, problems):
        if op["path"].endswith("/command") and launcher:
            # The launcher rewrites the command anyway; let it wrap the edited one. Without
            # it (a command that binds itself with numactl or taskset) the edit is the
            # command's only change: held back for a launcher that never came, the new value
            # was dropped, while the pods were labelled as running it.
            serving = {**serving, "command": op["value"]}
        else:
            ops.append(op)
    ops += _numa_ops(spec, pod_spec, index, serving, binder, context, env, reasons, problems,
                     resources)
    ops += env.build()
    ops += mig_ops(spec, _pointer("spec", "containers", index), serving,
                   (context.mig_profile, context.mig_strategy), reasons, problems)
    annotations = {} if memory_high.value is None else {keys.MEMORY_HIGH: str(memory_high.value)}
    if memory_high.value is None and keys.MEMORY_HIGH in (
            (pod.get("metadata") or {}).get("annotations") or {}):
        # One the pod template carries (copied from a tuned pod's YAML, or set by hand): kept,
        # the node agent would write it, while the pod is labelled as tuned to this revision
        # and its reason says memory.high stays at max.
        ops.append({"op": "remove", "path": _pointer("metadata", "annotations",
                                                     keys.MEMORY_HIGH)})
        reasons.append(f"memory: {keys.MEMORY_HIGH} from the pod template removed (memory.high "
                       "stays at max)")
    if spec.mode is Mode.DRY_RUN:
        plan = {"revision": revision, "patch": ops + _meta_ops(pod, "annotations", annotations),
                "reasons": reasons, "problems": problems}
        text = _dry_run_plan(plan, _annotation_room(pod, keys.DRY_RUN_PLAN))
        if text is None:
            return PodPlan(revision, [], ["dry run: nothing changed", *reasons], [
                *problems, f"the pod's annotations leave no room for the plan in "
                f"{keys.DRY_RUN_PLAN} (the API server takes {MAX_ANNOTATION_BYTES // 1024} "
                "KiB of annotations in all): the pod is not annotated; `infertune plan "
                "TUNING.yaml --pod POD.yaml` shows the plan"])
        dry = _meta_ops(pod, "annotations", {keys.DRY_RUN_PLAN: text})
        return PodPlan(revision, dry, ["dry run: nothing changed", *reasons], problems)
    # Which container is the serving one, as chosen here: a webhook after this one (a
    # service mesh's) may put its proxy first, and re-tuning (and the node agent) read the
    # pod as stored.
    annotations[keys.SERVING_CONTAINER] = name
    if _annotation_bytes(annotations) > _annotation_room(pod, *annotations):
        # Patched, the pod is one the API server refuses, which failurePolicy: Ignore does
        # not cover: the ReplicaSet could create no pod at all.
        return PodPlan(revision, refused=True, problems=[
            f"the pod's annotations leave no room for the operator's "
            f"({', '.join(annotations)}): the API server takes "
            f"{MAX_ANNOTATION_BYTES // 1024} KiB of annotations in all; shorten the pod "
            "template's annotations"])
    ops += _meta_ops(pod, "annotations", annotations)
    # A tuning's name may have 253 characters, a label value 63: the API server would refuse
    # the patched pod.
    ops += _meta_ops(pod, "labels", {
        keys.TUNED_BY: keys.label_value(context.tuning_name), keys.REVISION: revision,
        keys.SHAPE: shape})
    return PodPlan(revision, ops, reasons, problems)


DRY_RUN_PLAN_MAX = 32 * 1024
"""The most the dry-run plan annotation holds: the API server refuses a pod whose annotations
pass 256 KiB in all, and a DryRun pod, which must change nothing, was refused with a patch
that carried a long inline script twice (the command, and its wrapped copy)."""
LEFT_OUT = ("left out to keep the annotation under 32 KiB; `infertune plan TUNING.yaml --pod "
            "POD.yaml` shows it whole")


MAX_ANNOTATION_BYTES = 256 * 1024
"""What the API server takes of a pod's annotations in all: the lengths of their keys and
values added up (apimachinery's TotalAnnotationSizeLimitB)."""


def _annotation_bytes(annotations: Mapping[str, Any]) -> int:
    """The bytes of keys and values of `annotations`, as the API server counts them."""
    return sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())


def _annotation_room(pod: Mapping[str, Any], *keys_set: str) -> int:
    """How many bytes of keys and values the pod's annotations leave under
    MAX_ANNOTATION_BYTES for `keys_set` (their values now, if any, are replaced)."""
    own = (pod.get("metadata") or {}).get("annotations") or {}
    return MAX_ANNOTATION_BYTES - _annotation_bytes(
        {k: v for k, v in own.items() if k not in keys_set})


def _dry_run_plan(plan: dict[str, Any], room: int = MAX_ANNOTATION_BYTES) -> str | None:
    """The plan as the annotation holds it: whole when it fits DRY_RUN_PLAN_MAX (and `room`,
    what the pod's annotations leave for it, its key included), else with the long values of
    its operations left out (their paths stay), else without the patch; None when not even
    that fits."""
    limit = min(DRY_RUN_PLAN_MAX, room - len(keys.DRY_RUN_PLAN))
    text = json.dumps(plan, sort_keys=True)
    if len(text.encode()) <= limit:
        return text
    shortened = []
    for op in plan["patch"]:
        value = json.dumps(op.get("value"))
        if len(value) > 512:
            op = {**op, "value": f"<{len(value)} characters of JSON, {LEFT_OUT}>"}
        shortened.append(op)
    text = json.dumps({**plan, "patch": shortened}, sort_keys=True)
    if len(text.encode()) <= limit:
        return text
    for lines, characters in ((50, 1000), (10, 200)):
        text = json.dumps({**plan, "patch": f"<{len(plan['patch'])} operations, {LEFT_OUT}>",
                           "reasons": [r[:characters] for r in plan["reasons"]][:lines],
                           "problems": [p[:characters] for p in plan["problems"]][:lines]},
                          sort_keys=True)
        if len(text.encode()) <= limit:
            return text
    return None


def _serving_index(spec: InferenceTuningSpec, containers: list[dict[str, Any]]) -> int | None:
    """The serving container: spec.container, or the first one when it is not set."""
    return next((i for i, c in enumerate(containers)
                 if spec.container is None or c.get("name") == spec.container), None)


def serving_container(spec: InferenceTuningSpec,
                      containers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The container the webhook tunes among `containers` (`_serving_index`), if any."""
    index = _serving_index(spec, containers)
    return None if index is None else containers[index]


def _gpu_local_without_gpu(spec: InferenceTuningSpec, pod_spec: Mapping[str, Any],
                           serving: Mapping[str, Any]) -> str | None:
    """Why numa.policy gpu-local looks unable to bind the serving container: it asks for no
    device at all (no extended resource, such as nvidia.com/gpu or another vendor's GPU
    share; no MIG from the spec; no dynamic resource claim; no NVIDIA_VISIBLE_DEVICES of its
    own or from envFrom; not privileged), so the launcher is unlikely to find a GPU to take
    the NUMA node from. Asked only of a command the launcher wraps."""
    if spec.numa.policy is not NumaPolicy.GPU_LOCAL:
        return None
    if spec.mig is not None or pod_spec.get("resourceClaims") or serving.get("envFrom"):
        return None
    resources = serving.get("resources") or {}
    named = [str(n) for n in (*(resources.get("limits") or {}),
                              *(resources.get("requests") or {}))]
    if (any(n not in PLAIN_RESOURCES and not n.startswith("hugepages-") for n in named)
            or resources.get("claims")):
        return None
    if _privileged(serving):
        return None  # sees every device of the node
    if any(e.get("name") == "NVIDIA_VISIBLE_DEVICES" for e in serving.get("env") or ()):
        return None
    return (f"spec.numa.policy gpu-local takes the NUMA node of the GPUs of container "
            f"{serving.get('name')}, which requests none")


def _privileged(container: Mapping[str, Any]) -> bool:
    return bool((container.get("securityContext") or {}).get("privileged"))


def _memory_policy_refused(pod_spec: Mapping[str, Any],
                           serving: Mapping[str, Any]) -> str | None:
    """Why the serving container cannot have numactl's memory binding, if it is known at
    admission: the runtimes' default seccomp profile (RuntimeDefault) allows the memory policy
    calls (set_mempolicy, mbind) only with CAP_SYS_NICE (containerd,
    contrib/seccomp/seccomp_default.go), which containers do not get by default. (A kubelet
    that defaults every pod to RuntimeDefault, seccompDefault, cannot be seen here: the
    launcher then binds the CPUs only, or under strict exits 78 at every start.) Asked only
    of a command the launcher wraps."""
    context = serving.get("securityContext") or {}
    profile = (context.get("seccompProfile")
               or (pod_spec.get("securityContext") or {}).get("seccompProfile") or {})
    if profile.get("type") != "RuntimeDefault" or _privileged(serving):
        return None  # a privileged container runs without the profile
    added = {str(c).upper().removeprefix("CAP_")
             for c in (context.get("capabilities") or {}).get("add") or []}
    if added & {"SYS_NICE", "ALL"}:
        return None
    return (f"container {serving.get('name')} runs under the seccomp profile RuntimeDefault "
            "without CAP_SYS_NICE, which refuses numactl's memory binding (set_mempolicy)")


def _numa_ops(spec: InferenceTuningSpec, pod_spec: dict[str, Any], index: int,
              serving: dict[str, Any], binder: str | None, context: PodContext,
              env: _EnvPlan, reasons: list[str], problems: list[str],
              resources: Mapping[str, str]) -> list[Op]:
    """The launcher that binds the serving command to its NUMA node, and its settings.
    `binder`: the program of the command that binds it itself (`_binds_itself`)."""
    if spec.numa.policy is NumaPolicy.NONE:
        return []
    if not serving.get("command"):
        problems.append(f"container {serving.get('name')} has no command: the image entrypoint "
                        "cannot be known at admission, so it is not wrapped and NUMA binding "
                        "is skipped; set command in the Deployment's pod template")
        return []
    if binder is not None:
        problems.append(f"container {serving.get('name')} runs its command under {binder}, "
                        "which binds it itself and would replace the launcher's binding in "
                        "part or whole (CPUs on one NUMA node, memory bound to another): it is "
                        f"not wrapped and NUMA binding is skipped; remove {binder} from the "
                        "command to have spec.numa bind it, or set spec.numa.policy to none")
        return []
    env.set("INFERTUNE_NUMA_POLICY", _numa_env(spec))
    env.set("INFERTUNE_NUMA_STRICT", "true" if spec.numa.strict else "false")
    if _privileged(serving):
        # It sees every GPU's /dev/nvidia<N>: under CDI (NVIDIA_VISIBLE_DEVICES=void) they
        # would stand for its own GPUs, and bind it to the node holding most of the node's.
        env.set("INFERTUNE_DEVICE_NODES", "ignore")
    reasons.append(f"numa: launcher wraps the command, policy {_numa_env(spec)}, "
                   f"strict {str(spec.numa.strict).lower()}")
    if context.static_cpu_manager:
        problems += _qos_problems(pod_spec, serving)
    return _launcher_ops(pod_spec, index, serving, context, resources)
