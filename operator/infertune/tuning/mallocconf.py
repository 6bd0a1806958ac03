"""jemalloc 5.3 MALLOC_CONF: check it exactly as the library reads it, and size narenas.

Pure. Every rule mirrors jemalloc 5.3.0: src/jemalloc.c (the option handlers in
malloc_conf_init_helper, malloc_init_narenas); the tokenizer and the number readers are in
mallocconf_syntax.py. tests/test_mallocconf.py holds the real library to the same verdicts.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from infertune.tuning.mallocconf_syntax import (
    ConfProblem,
    MallocConfSyntaxError,
    parse_malloc_conf,
    read_fxp,
    read_number,
    scan,
    strtoumax,
)

__all__ = ["DEBIAN_5_3_0", "NARENAS_LIMIT", "ConfProblem", "JemallocBuild",
           "MallocConfSyntaxError", "aborting", "check_malloc_conf",
           "effective_malloc_conf", "has_option", "narenas_for_cpus", "parse_malloc_conf"]
# MALLOCX_ARENA_LIMIT - 1 (include/jemalloc/internal/jemalloc_internal_types.h): more arenas
# are cut down with "Reducing narenas to limit (4094)".
NARENAS_LIMIT = 4094
# NSTIME_SEC_MAX * 1000 (include/jemalloc/internal/nstime.h), the decay_ms ceiling.
_DECAY_MS_MAX = 18446744072 * 1000
# SC_LARGE_MAXCLASS on 64-bit (7 * 2**60), the oversize_threshold ceiling; measured.
_LARGE_MAXCLASS = 7 * 2**60


@dataclass(frozen=True)
class JemallocBuild:
    """Compile-time features of the library; options of absent ones are unknown keys to it.

    The defaults are Debian's libjemalloc2 5.3.0 (mallctl config.prof/fill true, utrace and
    xmalloc false; experimental_infallible_new accepted, log and lg_san_uaf_align not).
    """

    prof: bool = True
    fill: bool = True
    utrace: bool = False
    xmalloc: bool = False
    cxx: bool = True
    log: bool = False
    uaf_detection: bool = False


DEBIAN_5_3_0 = JemallocBuild()

# ---- option handlers: malloc_conf_init_helper() ---------------------------------------------

Check = Callable[[str, str], str | None]
"""(key, value) -> what is wrong with the value, or None when jemalloc takes it."""

_NUMBER_FORMS = "decimal, 0x hex or 0-prefixed octal, with no units, exponent or trailing space"


def _bool(key: str, value: str) -> str | None:
    if value in ("true", "false"):
        return None
    return f"{key} takes true or false (jemalloc accepts no other spelling, not yes/no/1/0)"


def _words(*names: str, prefix: bool = False) -> Check:
    """An enum; `prefix` handlers compare with strncmp(name, value, len(value)) so jemalloc
    takes any prefix of a name (even the empty one) as that name."""
    def check(key: str, value: str) -> str | None:
        if any(n.startswith(value) if prefix else n == value for n in names):
            return None
        return f"{key} must be one of {', '.join(names)}"
    return check


_WHOLE = re.compile(r"\s*[-+]?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
"""A whole number as malloc_strtoumax reads one (that it may still overflow)."""


def _number(low: int | None = None, high: int | None = None, *, signed: bool = False,
            hint: str = "", shown_high: int | None = None) -> Check:
    """An integer handler. Options that jemalloc clips get no bounds here: they never fail.
    `shown_high`: the most the message suggests where jemalloc takes more but cuts it."""
    def check(key: str, value: str) -> str | None:
        number = read_number(value, signed)
        if number is None and _WHOLE.fullmatch(value):
            # A whole number all the same: "needs a whole number" sent the user looking for
            # a typo.
            return f"{key}:{value} is too large for jemalloc to read (at most 2^64-1){hint}"
        if number is None:
            return f"{key} needs a whole number ({_NUMBER_FORMS}){hint}"
        if (low is not None and number < low) or (high is not None and number > high):
            shown = "" if number == read_number(value.strip(), False) else f" (read as {number})"
            most = high if high is not None else shown_high
            limits = f"{low}..{most if most is not None else 'max'}"
            return f"{key}:{value}{shown} is out of range; use {limits}{hint}"
        return None
    return check


def _ratio(*, at_most_one: bool = False, minus_one: bool = False) -> Check:
    def check(key: str, value: str) -> str | None:
        if minus_one and value == "-1":
            return None
        ratio = read_fxp(value)
        if ratio is None:
            return f"{key} needs a plain decimal such as 0.5 or 4 (below 65536)"
        if at_most_one and ratio > 1 << 16:
            return f"{key} is a fraction of a huge page; use a value from 0 to 1"
        return None
    return check


def _size_ranges(*, max_count: int | None) -> Check:
    """bin_shards / slab_sizes: start-end:count entries joined by '|' (malloc_conf_multi_
    sizes_next); bin_shards counts must be 1..BIN_SHARDS_MAX (64)."""
    def check(key: str, value: str) -> str | None:
        if key == "slab_sizes" and value == "default":
            return None
        rest = value
        while True:
            entry = _size_range(rest)
            if entry is None or (max_count is not None and not 0 < entry[0] <= max_count):
                limit = f", count 1..{max_count}" if max_count is not None else ""
                return (f"{key} needs start-end:count entries joined by '|', for example "
                        f"1-4096:1{limit}")
            rest = rest[entry[1]:]
            if rest == "":
                return None
    return check


def _size_range(text: str) -> tuple[int, int] | None:
    """One start-end:count entry: (count, characters used including a '|'), or None."""
    used = 0
    for separator in ("-", ":", ""):
        parsed = strtoumax(text[used:])
        if parsed is None or (separator and text[used + parsed[1]:][:1] != separator):
            return None
        used += parsed[1] + len(separator)
    if text[used:used + 1] == "|":
        used += 1
    assert parsed is not None
    return parsed[0], used


def _narenas(key: str, value: str) -> str | None:
    if value == "default":
        return None
    return _number(1, hint=f" (above {NARENAS_LIMIT}, jemalloc cuts it to {NARENAS_LIMIT} with a "
                   "warning); 'default' gives jemalloc's 4 per CPU", shown_high=NARENAS_LIMIT)(
        key, value)


def _any(key: str, value: str) -> str | None:
    return None  # free text (stats_print_opts ignores unknown letters, prof_prefix is a path)


_DECAY = _number(-1, _DECAY_MS_MAX, signed=True,
                 hint="; -1 means never purge, 0 purges immediately")
_CLIPPED = _number()  # read as a number; jemalloc silently clips it into its range

_CORE: dict[str, Check] = {
    "confirm_conf": _bool, "abort": _bool, "abort_conf": _bool, "trust_madvise": _bool,
    "metadata_thp": _words("disabled", "auto", "always", prefix=True), "retain": _bool,
    "dss": _words("disabled", "primary", "secondary", prefix=True), "narenas": _narenas,
    "narenas_ratio": _ratio(), "bin_shards": _size_ranges(max_count=64),
    "mutex_max_spin": _number(-1, signed=True), "dirty_decay_ms": _DECAY,
    "muzzy_decay_ms": _DECAY, "stats_print": _bool, "stats_print_opts": _any,
    "stats_interval": _number(-1, signed=True), "stats_interval_opts": _any,
    "tcache": _bool, "tcache_max": _CLIPPED, "lg_tcache_max": _CLIPPED,
    "lg_tcache_nslots_mul": _number(-16, 16, signed=True),
    "tcache_nslots_small_min": _CLIPPED, "tcache_nslots_small_max": _CLIPPED,
    "tcache_nslots_large": _CLIPPED, "tcache_gc_incr_bytes": _CLIPPED,
    "tcache_gc_delay_bytes": _CLIPPED, "lg_tcache_flush_small_div": _CLIPPED,
    "lg_tcache_flush_large_div": _CLIPPED, "oversize_threshold": _number(0, _LARGE_MAXCLASS),
    "lg_extent_max_active_fit": _number(0, 64),
    "percpu_arena": _words("percpu", "phycpu", "disabled", prefix=True),
    "background_thread": _bool, "max_background_threads": _CLIPPED, "hpa": _bool,
    "hpa_slab_max_alloc": _CLIPPED, "hpa_hugification_threshold": _CLIPPED,
    "hpa_hugification_threshold_ratio": _ratio(at_most_one=True),
    "hpa_hugify_delay_ms": _CLIPPED, "hpa_min_purge_interval_ms": _CLIPPED,
    "hpa_dirty_mult": _ratio(minus_one=True), "hpa_sec_nshards": _CLIPPED,
    "hpa_sec_max_alloc": _CLIPPED, "hpa_sec_max_bytes": _CLIPPED,
    "hpa_sec_bytes_after_flush": _CLIPPED, "hpa_sec_batch_fill_extra": _CLIPPED,
    "slab_sizes": _size_ranges(max_count=None),
    "thp": _words("default", "always", "never", prefix=True),
    "zero_realloc": _words("alloc", "free", "abort"),
    "san_guard_small": _CLIPPED, "san_guard_large": _CLIPPED,
}
_PROF: dict[str, Check] = {
    "prof": _bool, "prof_prefix": _any, "prof_active": _bool, "prof_thread_active_init": _bool,
    "lg_prof_sample": _CLIPPED, "prof_accum": _bool, "lg_prof_interval": _number(-1, 63,
                                                                               signed=True),
    "prof_gdump": _bool, "prof_final": _bool, "prof_leak": _bool, "prof_leak_error": _bool,
    "prof_log": _bool, "prof_recent_alloc_max": _number(-1, signed=True), "prof_stats": _bool,
    "prof_sys_thread_name": _bool, "prof_time_resolution": _words("default", "high"),
    "prof_unbias": _bool,
}
# Keys compared with strncmp(name, key, len(key)): any prefix of them, even "", selects them.
_PREFIX_KEYS = ("metadata_thp", "dss", "percpu_arena")


def _options(build: JemallocBuild) -> dict[str, Check]:
    options = dict(_CORE)
    features: list[tuple[bool, dict[str, Check]]] = [
        (build.fill, {"junk": _words("true", "false", "alloc", "free"), "zero": _bool}),
        (build.utrace, {"utrace": _bool}), (build.xmalloc, {"xmalloc": _bool}),
        (build.cxx, {"experimental_infallible_new": _bool}), (build.prof, _PROF),
        (build.log, {"log": _any}),
        (build.uaf_detection, {"lg_san_uaf_align": _number(-1, signed=True)}),
    ]
    for present, extra in features:
        if present:
            options.update(extra)
    return options


def _resolve(key: str, options: dict[str, Check]) -> str | None:
    """The option jemalloc applies `key` to, or None for an unknown key."""
    if key in options:
        return key
    return next((name for name in _PREFIX_KEYS if name.startswith(key)), None)



# Options that older jemalloc had and 5.x reports as "Invalid conf pair", with what replaced
# them (jemalloc ChangeLog: 5.0.0 "Incompatible changes", 3.0.0 "Removed features").
_REMOVED = {
    "lg_chunk": "lg_chunk was removed in jemalloc 5.0 (chunks are gone); use extent-based "
                "settings such as dirty_decay_ms / muzzy_decay_ms, or remove it",
    "lg_dirty_mult": "lg_dirty_mult was removed in jemalloc 5.0 with ratio-based purging; use "
                     "dirty_decay_ms (and muzzy_decay_ms) to say how fast unused pages go back",
    "decay_time": "decay_time (jemalloc 4.x) was removed in 5.0; it became dirty_decay_ms and "
                  "muzzy_decay_ms, in milliseconds",
    "purge": "purge was removed in jemalloc 5.0: decay is the only purging mode; tune "
             "dirty_decay_ms / muzzy_decay_ms instead",
    "quarantine": "quarantine was removed in jemalloc 5.0 with no replacement; use "
                  "AddressSanitizer to find use-after-free",
    "redzone": "redzone was removed in jemalloc 5.0 with no replacement; use AddressSanitizer "
               "to find overflows (junk:true still fills freed memory)",
    "valgrind": "valgrind was removed (4.0 mallctl, 5.0 support); remove it",
    "lg_tcache_gc_sweep": "lg_tcache_gc_sweep was removed in jemalloc 3.0; tcache garbage "
                          "collection is tuned by tcache_gc_incr_bytes / tcache_gc_delay_bytes",
    "lg_prof_tcmax": "lg_prof_tcmax was removed in jemalloc 3.0; remove it",
    "lg_prof_bt_max": "lg_prof_bt_max was removed in jemalloc 3.0; remove it",
    "lg_qspace_max": "lg_qspace_max was removed in jemalloc 3.0 with the size class rework",
    "lg_cspace_max": "lg_cspace_max was removed in jemalloc 3.0 with the size class rework",
    # The 5.3.0 ChangeLog lists opt.cache_oblivious, but only as a read-only mallctl: the
    # MALLOC_CONF handler for it is not in 5.3.0 (measured: "Invalid conf pair").
    "cache_oblivious": "cache_oblivious cannot be set through MALLOC_CONF in jemalloc 5.3.0 "
                       "(it is only a read-only mallctl there); remove it",
}
_BUILD_ONLY = {"utrace": "--enable-utrace", "xmalloc": "--enable-xmalloc",
               "log": "--enable-log", "lg_san_uaf_align": "--enable-uaf-detection",
               "junk": "--enable-fill", "zero": "--enable-fill",
               "experimental_infallible_new": "--enable-cxx",
               **{name: "--enable-prof" for name in _PROF}}


def _unknown_key(key: str, value: str, options: dict[str, Check]) -> ConfProblem:
    if key in _REMOVED:
        return ConfProblem(key, value, _REMOVED[key])
    if key in _BUILD_ONLY:
        return ConfProblem(key, value, f"{key} is not compiled into this jemalloc (it needs "
                           f"{_BUILD_ONLY[key]}); remove it")
    message = f"{key} is not a jemalloc 5.3 option (jemalloc: 'Invalid conf pair')"
    close = difflib.get_close_matches(key.lower(), options, n=1)
    if close:
        message += f"; did you mean {close[0]}?"
    if key.startswith("experimental_"):
        message += "; abort_conf does not abort on experimental_ keys, but they are reported"
    return ConfProblem(key, value, message, aborts=not key.startswith("experimental_"))


def _applied_narenas(pairs: list[tuple[str, str]]) -> int | None:
    """opt_narenas after parsing (the last accepted setting wins), as the C unsigned; None
    when it is left to the default ("default" sets it back to 0, which means that)."""
    applied = None
    for key, value in pairs:
        if key == "narenas" and _narenas(key, value) is None:
            applied = None if value == "default" else (read_number(value, False) or 0) % 2**32
    return applied or None  # a count that wraps around to 0 is the default, as "default"


Settings = list[tuple[str | None, str]]
"""(the option jemalloc applies a key to, None for an unknown key; the value), in order."""


def _settings(pairs: list[tuple[str, str]], options: dict[str, Check]) -> Settings:
    return [(_resolve(key, options), value) for key, value in pairs]


def _last_accepted(settings: Settings, key: str, check: Check) -> str | None:
    """The last valid value set for option `key`, by any spelling jemalloc applies to it
    (`p:percpu` sets percpu_arena)."""
    values = [v for k, v in settings if k == key and check(key, v) is None]
    return values[-1] if values else None


_PERCPU_MODES = ("percpu", "phycpu", "disabled")


def _cpu_problems(pairs: list[tuple[str, str]], settings: Settings, cpus: int | None,
                  pinned: bool) -> list[ConfProblem]:
    """The warnings that depend on the CPUs jemalloc sees (malloc_init_hard_a0_locked, then
    malloc_init_narenas). percpu_arena is turned off when the CPU count is not deterministic
    (the affinity mask leaves out some CPUs) and narenas is unset; phycpu wants an even count;
    and with narenas unset and no per-CPU arenas, jemalloc makes cpus x narenas_ratio arenas
    (malloc_narenas_default: 16.16 fixed point, fxp_mul keeps 32 bits, fxp_round_nearest
    rounds; at least 1, and 1 on one CPU), cut to the limit with a warning."""
    problems = []
    chosen = _last_accepted(settings, "percpu_arena", _words(*_PERCPU_MODES, prefix=True))
    mode = next(m for m in _PERCPU_MODES if m.startswith(chosen)) if chosen is not None \
        else "disabled"
    narenas = _applied_narenas(pairs)
    if mode != "disabled" and pinned and narenas is None:
        problems.append(ConfProblem("percpu_arena", str(chosen), (
            "percpu_arena on a process pinned to some of the node's CPUs (numactl, a static "
            "CPU manager): jemalloc cannot tell the CPU count for sure and turns per-CPU arenas "
            "off with a warning unless narenas is set; set narenas too, or drop percpu_arena"),
            opt_abort=True))
        mode = "disabled"
    if cpus is None:  # pinned, to CPUs not known yet: the checks of their count wait
        if mode == "phycpu" and pinned:
            # But phycpu's: an odd count of the CPUs it is pinned to (a NUMA node's share
            # of an exclusive cpuset, 7 CPUs from the static CPU manager) makes jemalloc
            # warn, and abort every process with abort:true, which admission cannot rule out.
            problems.append(ConfProblem("percpu_arena", str(chosen), (
                "percpu_arena:phycpu on a process pinned to some of the node's CPUs (numactl, "
                "a static CPU manager): jemalloc wants an even count of them (two hardware "
                "threads per core) and warns on an odd one, which is not known before the "
                "pod runs; use percpu"), aborts=False, opt_abort=True))
        return problems
    if mode == "phycpu" and cpus % 2:
        problems.append(ConfProblem("percpu_arena", str(chosen), (
            f"percpu_arena:phycpu on {cpus} CPUs: jemalloc wants an even count (two hardware "
            "threads per core) and warns; use percpu"), aborts=False, opt_abort=True))
    if mode != "disabled" or narenas is not None:
        return problems
    ratio_text = _last_accepted(settings, "narenas_ratio", _ratio()) or "4"
    ratio = read_fxp(ratio_text)
    assert ratio is not None
    goal = ((cpus << 16) * ratio >> 16) % 2**32
    arenas = 1 if cpus <= 1 else max((goal >> 16) + (goal & 0xFFFF >= 1 << 15), 1)
    if arenas > NARENAS_LIMIT:
        problems.append(ConfProblem("narenas_ratio", ratio_text, (
            f"narenas_ratio {ratio_text} on {cpus} CPUs makes {arenas} arenas, and jemalloc "
            f"cuts them to {NARENAS_LIMIT} with a warning; set narenas (1..{NARENAS_LIMIT}) or "
            "a smaller narenas_ratio"), aborts=False))
    return problems


def check_malloc_conf(text: str, *, build: JemallocBuild = DEBIAN_5_3_0,
                      cpus: int | None = None, pinned: bool = False) -> list[ConfProblem]:
    """Everything jemalloc 5.3 would print a warning for when given `text` as MALLOC_CONF;
    an empty list means the library takes it silently. Never raises.

    `cpus` is the CPU count jemalloc will see (the process's affinity mask, not its cgroup
    limit), and `pinned` says that mask leaves out some of the node's CPUs. A few warnings
    depend on them (`_cpu_problems`); without `cpus` (the node is not known yet, as when a
    spec is validated) those are not checked, but for per-CPU arenas in a `pinned` process
    (at admission, a pod the launcher will bind to a NUMA node's CPUs)."""
    options = _options(build)
    pairs, syntax = scan(text)
    problems: list[ConfProblem] = []
    settings = _settings(pairs, options)
    for (key, value), (name, _) in zip(pairs, settings, strict=True):
        if name is None:
            problems.append(_unknown_key(key, value, options))
        elif (message := options[name](name, value)) is not None:
            problems.append(ConfProblem(key, value, f"{message}; got {key}:{value}",
                                        aborts=not key.startswith("experimental_")))
    if syntax is not None:
        problems.append(syntax)
    narenas = _applied_narenas(pairs)
    if narenas is not None and narenas > NARENAS_LIMIT:
        problems.append(ConfProblem("narenas", str(narenas), (
            f"narenas comes out as {narenas} (a negative or huge count wraps around) and "
            f"jemalloc cuts it to {NARENAS_LIMIT} with a warning; use 1..{NARENAS_LIMIT}"),
            aborts=False))
    if (build.prof and _last_accepted(settings, "prof_leak_error", _bool) == "true"
            and _last_accepted(settings, "prof_final", _bool) != "true"):
        # malloc_conf_init_check_deps, once every option is read: a warning, and an abort
        # with abort_conf:true.
        problems.append(ConfProblem("prof_leak_error", "true", (
            "prof_leak_error reports leaks found by the final profile dump, and jemalloc warns "
            "that it is set without prof_final; add prof_final:true, or drop prof_leak_error")))
    if cpus is not None or pinned:
        problems += _cpu_problems(pairs, settings, cpus, pinned)
    return problems


def aborting(text: str, problems: list[ConfProblem]) -> ConfProblem | None:
    """The problem of `text` (`problems`, from `check_malloc_conf`) that makes jemalloc abort
    every process, if one does: under abort_conf:true one it aborts on (ConfProblem.aborts),
    under abort:true a per-CPU arena check (ConfProblem.opt_abort); the last setting of each
    counts."""
    abort_conf, opt_abort = _aborts(text)
    return next((p for p in problems
                 if (abort_conf and p.aborts) or (opt_abort and p.opt_abort)), None)


def aborts_on_invalid(text: str) -> bool:
    """Whether `text` leaves abort_conf true: jemalloc then aborts on any invalid option."""
    return _aborts(text)[0]


def _aborts(text: str) -> tuple[bool, bool]:
    """(abort_conf, abort) as `text` leaves them: the last setting of each counts."""
    settings = _settings(scan(text)[0], _options(DEBIAN_5_3_0))
    return (_last_accepted(settings, "abort_conf", _bool) == "true",
            _last_accepted(settings, "abort", _bool) == "true")


NEW_IN_5_3 = frozenset({
    "hpa", "hpa_dirty_mult", "hpa_hugification_threshold", "hpa_hugification_threshold_ratio",
    "hpa_hugify_delay_ms", "hpa_min_purge_interval_ms", "hpa_sec_batch_fill_extra",
    "hpa_sec_bytes_after_flush", "hpa_sec_max_alloc", "hpa_sec_max_bytes", "hpa_sec_nshards",
    "hpa_slab_max_alloc", "lg_tcache_flush_large_div", "lg_tcache_flush_small_div",
    "lg_tcache_nslots_mul", "mutex_max_spin", "narenas_ratio", "prof_leak_error",
    "prof_recent_alloc_max", "prof_stats", "prof_sys_thread_name", "prof_time_resolution",
    "prof_unbias", "san_guard_large", "san_guard_small", "stats_interval",
    "stats_interval_opts", "tcache_gc_delay_bytes", "tcache_gc_incr_bytes", "tcache_max",
    "tcache_nslots_large", "tcache_nslots_small_max", "tcache_nslots_small_min",
    "trust_madvise", "zero_realloc", "experimental_infallible_new"})
"""The options of this table that jemalloc 5.2.1 does not have (the keys of
malloc_conf_init_helper in src/jemalloc.c, tags 5.2.1 and 5.3.0). 5.2.1 is libjemalloc2 in
Ubuntu 22.04 and Debian 11, which many CUDA serving images are built on: it reports them as
"Invalid conf pair", ignores them, and with abort_conf:true aborts on them."""


def new_in_5_3(text: str) -> list[str]:
    """The options `text` sets that jemalloc 5.2 does not know (NEW_IN_5_3), in order."""
    options = _options(DEBIAN_5_3_0)
    found = [_resolve(k, options) for k, _ in scan(text)[0]]
    return list(dict.fromkeys(k for k in found if k in NEW_IN_5_3))


def has_option(text: str, key: str) -> bool:
    """Whether jemalloc reads a setting of `key` in `text` (valid or not); pairs after a syntax
    error are never read."""
    options = _options(DEBIAN_5_3_0)
    return any(_resolve(k, options) == key for k, _ in scan(text)[0])


def narenas_for_cpus(cpu_limit: float | None) -> int | None:
    """One arena per CPU of the container's limit, rounded up; None without a usable limit.

    jemalloc's default is 4 arenas per CPU in the affinity mask (malloc_ncpus uses
    sched_getaffinity), and a CPU limit (CFS quota) does not shrink that mask: a 4-CPU pod on a
    128-CPU node gets 512 arenas. More arenas than CPUs able to run add fragmentation without
    less contention (TUNING.md, narenas), so size to the limit, never to the node.
    """
    if cpu_limit is None or not math.isfinite(cpu_limit) or cpu_limit <= 0:
        return None
    return min(NARENAS_LIMIT, max(1, math.ceil(cpu_limit)))


def effective_malloc_conf(user_conf: str | None, cpu_limit: float | None) -> str:
    """The MALLOC_CONF to inject: the user's, plus narenas sized by narenas_for_cpus() when the
    user's leaves narenas and narenas_ratio unset (an explicit narenas overrides the ratio,
    which sizes the arenas by the CPUs already). Never raises; validate user_conf with
    check_malloc_conf."""
    conf = user_conf or ""
    narenas = narenas_for_cpus(cpu_limit)
    if narenas is None or has_option(conf, "narenas") or has_option(conf, "narenas_ratio"):
        return conf
    body = conf.removesuffix(",")
    if scan(body)[1] is not None:
        # jemalloc stops reading at a syntax error, so an appended narenas would be ignored.
        return conf
    return f"{body},narenas:{narenas}" if body else f"narenas:{narenas}"
