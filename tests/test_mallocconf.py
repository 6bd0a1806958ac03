"""The MALLOC_CONF checker, held to the real jemalloc 5.3 (Debian libjemalloc2) as its oracle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from infertune.tuning.mallocconf import (
    DEBIAN_5_3_0,
    NARENAS_LIMIT,
    MallocConfSyntaxError,
    aborting,
    check_malloc_conf,
    effective_malloc_conf,
    has_option,
    narenas_for_cpus,
    parse_malloc_conf,
)

JEMALLOC = next(iter(sorted(Path("/usr/lib").glob("*/libjemalloc.so.2"))),
                Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"))
"""The Debian package's library, on this machine's architecture."""
CORPUS = Path(__file__).parent / "fixtures" / "mallocconf" / "corpus.txt"
needs_jemalloc = pytest.mark.skipif(not JEMALLOC.exists(),
                                    reason=f"{JEMALLOC} is absent (apt-get install libjemalloc2)")

# Lines jemalloc prints that say something about this machine, not about the string: a kernel
# without THP, QEMU's MADV_DONTNEED, no room for a background thread (src/pages.c,
# src/background_thread.c, malloc_init_narenas). A test meeting one skips and shows it.
ENVIRONMENT_LINES = ("<jemalloc>: no MADV_HUGEPAGE", "<jemalloc>: MADV_DONTNEED",
                     "<jemalloc>: (This is the expected", "<jemalloc>: background thread",
                     "<jemalloc>: invalid configuration -- per physical CPU",
                     "<jemalloc>: perCPU arena getcpu()")
# What confirm_conf:true prints about every source and setting it read: not a complaint.
CONFIRMATION_LINES = ("<jemalloc>: malloc_conf #", "<jemalloc>: -- Set conf value")


def load_corpus() -> list[tuple[bool, str]]:
    cases = []
    for line in CORPUS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        verdict, rest = line.split(maxsplit=1)
        conf, _ = json.JSONDecoder().raw_decode(rest)
        cases.append((verdict == "valid", conf))
    return cases


@dataclass(frozen=True)
class JemallocRun:
    returncode: int
    complaints: list[str]


CPUS = len(os.sched_getaffinity(0))
"""What jemalloc counts in a process started from here (malloc_ncpus: the affinity mask)."""
NODE_CPUS = os.sysconf("SC_NPROCESSORS_CONF")


def run_jemalloc(conf: str, cwd: Path, cpus: int | None = None,
                 on_machine: Callable[[str], Any] = pytest.skip) -> JemallocRun:
    """/bin/true with jemalloc preloaded: what it printed about `conf`, on the first `cpus`
    CPUs of ours when given. exec, not a wrapper such as timeout or taskset, because every
    preloaded process prints its own copy. A remark on the machine, not on `conf`, is given to
    `on_machine` (a skip, by default), which must raise."""
    env = {"PATH": "/usr/bin:/bin", "LD_PRELOAD": str(JEMALLOC), "MALLOC_CONF": conf}
    mask = sorted(os.sched_getaffinity(0))[:cpus]
    done = subprocess.run(["/bin/true"], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=30, check=False,
                          preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(
                              0, mask))
    lines = [line for line in done.stderr.splitlines() if line.startswith("<jemalloc>:")]
    machine = [line for line in lines if line.startswith(ENVIRONMENT_LINES)]
    if machine:
        on_machine(f"jemalloc reports on this machine, not on {conf!r}: {machine}")
        raise AssertionError("on_machine must raise")
    return JemallocRun(done.returncode,
                       [line for line in lines if not line.startswith(CONFIRMATION_LINES)])


CASES = load_corpus()
CASE_IDS = [repr(conf) for _, conf in CASES]


def test_corpus_has_enough_valid_and_invalid_strings() -> None:
    valid = sum(1 for ok, _ in CASES if ok)
    assert len(CASES) >= 40 and valid >= 15 and len(CASES) - valid >= 15


@pytest.mark.parametrize(("valid", "conf"), CASES, ids=CASE_IDS)
def test_checker_verdict_matches_the_corpus(valid: bool, conf: str) -> None:
    problems = check_malloc_conf(conf)
    assert (problems == []) is valid, [p.message for p in problems]


@needs_jemalloc
@pytest.mark.parametrize(("valid", "conf"), CASES, ids=CASE_IDS)
def test_jemalloc_verdict_matches_the_corpus(valid: bool, conf: str, tmp_path: Path) -> None:
    run = run_jemalloc(conf, tmp_path)
    assert (run.complaints == []) is valid, run.complaints


@needs_jemalloc
@pytest.mark.parametrize(("conf", "aborts"), [
    ("abort_conf:true,lg_chunk:21", True),
    ("abort_conf:true,narenas:x", True),
    ("lg_chunk:21,abort_conf:true", True),  # abort comes after all parsing
    ("abort_conf:true,experimental_foo:1", False),  # reported, tolerated
    ("abort_conf:true,narenas:4", False),
    ("abort_conf:true,prof_leak_error:true", True),  # the check across options
])
def test_abort_conf_turns_a_reported_problem_into_abort(conf: str, aborts: bool,
                                                        tmp_path: Path) -> None:
    run = run_jemalloc(conf, tmp_path)
    assert (run.returncode == -signal.SIGABRT) is aborts
    assert check_malloc_conf(conf) != [] or not aborts


@pytest.mark.parametrize(("conf", "key", "says"), [
    ("lg_chunk:21", "lg_chunk", "lg_chunk was removed in jemalloc 5.0 (chunks are gone); use "
     "extent-based settings such as dirty_decay_ms / muzzy_decay_ms, or remove it"),
    ("decay_time:10", "decay_time", "dirty_decay_ms and muzzy_decay_ms"),
    ("lg_dirty_mult:3", "lg_dirty_mult", "use dirty_decay_ms"),
    ("lg_tcache_gc_sweep:1", "lg_tcache_gc_sweep", "tcache_gc_incr_bytes"),
    ("narenas:0", "narenas", "out of range; use 1..4094 (above 4094, jemalloc cuts it to 4094"),
    ("narenas:-1", "narenas", f"cuts it to {NARENAS_LIMIT}"),
    # A whole number past what malloc_strtoumax reads: it said "needs a whole number".
    ("narenas:99999999999999999999", "narenas", "is too large for jemalloc to read (at most "
     "2^64-1)"),
    ("narenas:089", "narenas", "needs a whole number"),  # 0-prefixed: octal, and 8 is none
    ("background_thread:yes", "background_thread", "takes true or false"),
    ("percpu_arena:bogus", "percpu_arena", "one of percpu, phycpu, disabled"),
    ("thp:maybe", "thp", "one of default, always, never"),
    ("dirty_decay_ms:-2", "dirty_decay_ms", "-1 means never purge"),
    ("dirty_decay_ms:1e3", "dirty_decay_ms", "no units, exponent"),
    ("narenss:4", "narenss", "did you mean narenas?"),
    ("utrace:true", "utrace", "needs --enable-utrace"),
    ("prof_leak_error:true", "prof_leak_error", "add prof_final:true"),
])
def test_problem_names_the_key_and_the_fix(conf: str, key: str, says: str) -> None:
    [problem] = check_malloc_conf(conf)
    assert problem.key == key
    assert says in problem.message


@pytest.mark.parametrize(("conf", "says"), [
    ("narenas4", "has no ':'"),
    ("narenas:4,", "ends with a comma"),
    ("narenas:4,,tcache:false", "remove the empty entry"),
    ("narenas=4", "not '='"),
    ("opt.narenas:4", "not opt.narenas"),
])
def test_syntax_error_is_raised_by_the_parser_with_its_fix(conf: str, says: str) -> None:
    with pytest.raises(MallocConfSyntaxError, match=r"(?s).*") as raised:
        parse_malloc_conf(conf)
    assert says in raised.value.problem.message


def test_checker_reports_a_syntax_error_after_the_pairs_jemalloc_still_applied() -> None:
    problems = check_malloc_conf("narenas:0,foo=1,lg_chunk:21")
    assert [p.key for p in problems] == ["narenas", None]  # lg_chunk is never read
    assert "ignores everything from there ('=1,lg_chunk:21')" in problems[1].message


@pytest.mark.parametrize(("conf", "pairs"), [
    ("", []),
    ("narenas:4", [("narenas", "4")]),
    ("a:b:c,d:", [("a", "b:c"), ("d", "")]),
    ("narenas:4 ,x: y", [("narenas", "4 "), ("x", " y")]),
])
def test_parser_splits_pairs_at_the_first_colon_and_each_comma(
        conf: str, pairs: list[tuple[str, str]]) -> None:
    assert parse_malloc_conf(conf) == pairs


@pytest.mark.parametrize(("conf", "key", "present"), [
    ("narenas:4", "narenas", True),
    ("narenas:0", "narenas", True),  # set, though badly: not ours to override
    ("background_thread:true", "narenas", False),
    ("foo,narenas:4", "narenas", False),  # jemalloc stops at the syntax error
    ("m:auto", "metadata_thp", True),  # jemalloc's prefix match on this key
    ("", "narenas", False),
])
def test_has_option_sees_what_jemalloc_reads(conf: str, key: str, present: bool) -> None:
    assert has_option(conf, key) is present


@pytest.mark.parametrize(("cpu_limit", "narenas"), [
    (None, None), (0.0, None), (-1.0, None), (float("nan"), None), (float("inf"), None),
    (0.25, 1), (1.0, 1), (3.2, 4), (8.0, 8), (10000.0, NARENAS_LIMIT),
])
def test_narenas_follows_the_container_cpu_limit(cpu_limit: float | None,
                                                 narenas: int | None) -> None:
    assert narenas_for_cpus(cpu_limit) == narenas


@pytest.mark.parametrize(("user_conf", "cpu_limit", "effective"), [
    (None, 4.0, "narenas:4"),
    ("", 2.5, "narenas:3"),
    ("background_thread:true", 8.0, "background_thread:true,narenas:8"),
    ("background_thread:true,", 8.0, "background_thread:true,narenas:8"),
    ("narenas:2", 8.0, "narenas:2"),
    ("narenas:default", 8.0, "narenas:default"),
    ("background_thread:true", None, "background_thread:true"),
    (None, None, ""),
    ("foo=1", 8.0, "foo=1"),  # jemalloc would never read an appended narenas
])
def test_effective_conf_adds_narenas_only_when_the_user_left_it_unset(
        user_conf: str | None, cpu_limit: float | None, effective: str) -> None:
    assert effective_malloc_conf(user_conf, cpu_limit) == effective


# ---- the settings reach a real process --------------------------------------------------

READ_BACK = textwrap.dedent("""
    import ctypes, json
    libc = ctypes.CDLL(None)
    def read(name, ctype):
        value, size = ctype(), ctypes.c_size_t(ctypes.sizeof(ctype))
        rc = libc.mallctl(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0)
        assert rc == 0, (name, rc)
        return value.value
    print(json.dumps({
        "opt.narenas": read("opt.narenas", ctypes.c_uint),
        "opt.dirty_decay_ms": read("opt.dirty_decay_ms", ctypes.c_ssize_t),
        "opt.background_thread": read("opt.background_thread", ctypes.c_bool),
        "config.prof": read("config.prof", ctypes.c_bool),
        "config.fill": read("config.fill", ctypes.c_bool),
        "config.utrace": read("config.utrace", ctypes.c_bool),
        "config.xmalloc": read("config.xmalloc", ctypes.c_bool),
    }))
""")


def read_back(conf: str, cwd: Path) -> dict[str, object]:
    env = {**os.environ, "LD_PRELOAD": str(JEMALLOC), "MALLOC_CONF": conf}
    done = subprocess.run([sys.executable, "-c", READ_BACK], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60, check=True)
    assert "<jemalloc>" not in done.stderr, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


@needs_jemalloc
def test_injected_conf_takes_effect_in_a_real_process(tmp_path: Path) -> None:
    conf = effective_malloc_conf("background_thread:true,dirty_decay_ms:-1", 3.5)
    assert check_malloc_conf(conf) == []
    seen = read_back(conf, tmp_path)
    assert seen["opt.narenas"] == 4
    assert seen["opt.dirty_decay_ms"] == -1
    assert seen["opt.background_thread"] is True


@needs_jemalloc
def test_checker_build_features_are_the_installed_library(tmp_path: Path) -> None:
    seen = read_back("", tmp_path)
    assert (seen["config.prof"], seen["config.fill"], seen["config.utrace"],
            seen["config.xmalloc"]) == (DEBIAN_5_3_0.prof, DEBIAN_5_3_0.fill,
                                        DEBIAN_5_3_0.utrace, DEBIAN_5_3_0.xmalloc)


# ---- properties -------------------------------------------------------------------------


@given(st.text(max_size=60))
def test_checker_never_raises(text: str) -> None:
    check_malloc_conf(text)
    has_option(text, "narenas")
    effective_malloc_conf(text, 4.0)


NUMBERS = st.one_of(st.integers(-2**65, 2**65).map(str),
                    st.integers(0, 2**20).map(hex), st.sampled_from(["0", "08", "010", " 4"]))
WORDS = st.sampled_from(["true", "false", "yes", "default", "always", "never", "auto",
                         "disabled", "percpu", "primary", "alloc", "free", "abort", "", "al",
                         "1-4096:1", "1-160:64|2-3:1", ".5", "1.5", "-1"])
# Options whose effects print by design (stats, confirmation, profiles at exit, abort) or
# depend on the machine (phycpu) are left out.
KEYS = st.sampled_from([
    "narenas", "dirty_decay_ms", "muzzy_decay_ms", "background_thread", "tcache", "thp",
    "metadata_thp", "percpu_arena", "dss", "retain", "junk", "zero_realloc", "tcache_max",
    "lg_tcache_max", "oversize_threshold", "lg_extent_max_active_fit", "lg_tcache_nslots_mul",
    "mutex_max_spin", "stats_interval", "bin_shards", "slab_sizes", "narenas_ratio",
    "hpa_dirty_mult", "hpa_hugification_threshold_ratio", "lg_prof_interval", "lg_chunk",
    "m", "d", "NARENAS"])
PAIRS = st.tuples(KEYS, st.one_of(NUMBERS, WORDS)).map(lambda kv: f"{kv[0]}:{kv[1]}")
CONFS = st.lists(PAIRS, min_size=1, max_size=3).map(",".join)


@needs_jemalloc
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(CONFS)
def test_generated_confs_get_jemallocs_verdict(tmp_path: Path, conf: str) -> None:
    problems = check_malloc_conf(conf, cpus=CPUS, pinned=CPUS != NODE_CPUS)
    # One example jemalloc has a remark on the machine for (a background thread it cannot
    # start) is left out; a skip there skipped all forty.
    run = run_jemalloc(conf, tmp_path, on_machine=lambda _: reject())
    assert (problems == []) is (run.complaints == []), problems


DEFAULT_ARENA_CONFS = [
    "narenas_ratio:2048", "narenas_ratio:2047", "narenas_ratio:2047.5", "narenas_ratio:65535",
    "narenas_ratio:0.0001", "narenas_ratio:2048,narenas:8", "narenas_ratio:2048,narenas:default",
    "narenas:8,narenas:default,narenas_ratio:2048", "narenas_ratio:2048,percpu_arena:percpu",
    "narenas_ratio:2048,percpu_arena:d", "narenas_ratio:2048,percpu_arena:percpu,narenas:4",
    "percpu_arena:percpu", "percpu_arena:", "percpu_arena:phycpu",
]


@needs_jemalloc
@pytest.mark.parametrize("cpus", [1, 2])
@pytest.mark.parametrize("conf", DEFAULT_ARENA_CONFS)
def test_the_default_arena_count_is_checked_on_the_cpus_jemalloc_sees(
        tmp_path: Path, conf: str, cpus: int) -> None:
    """With narenas left to jemalloc it makes cpus x narenas_ratio arenas (1 on one CPU), and
    warns above the limit: the checker must know the CPU count to say so."""
    if cpus > CPUS:
        pytest.skip(f"this process may run on {CPUS} CPU(s)")
    problems = check_malloc_conf(conf, cpus=cpus, pinned=cpus != NODE_CPUS)
    run = run_jemalloc(conf, tmp_path, cpus)
    assert (problems == []) is (run.complaints == []), (problems, run.complaints)


def test_the_ratio_warning_names_the_arenas_and_what_to_set() -> None:
    [problem] = check_malloc_conf("narenas_ratio:2048", cpus=2)
    assert problem.key == "narenas_ratio"
    assert "on 2 CPUs makes 4096 arenas" in problem.message and "set narenas" in problem.message
    assert check_malloc_conf("narenas_ratio:2048") == []  # the CPUs are not known: unchecked
    assert check_malloc_conf("", cpus=1023) == []  # 4 per CPU: 4092 arenas
    assert [p.key for p in check_malloc_conf("", cpus=1024)] == ["narenas_ratio"]  # 4096


def test_percpu_arenas_on_a_pinned_process_need_narenas() -> None:
    [problem] = check_malloc_conf("percpu_arena:percpu", cpus=8, pinned=True)
    assert problem.key == "percpu_arena" and "set narenas too" in problem.message
    assert check_malloc_conf("percpu_arena:percpu,narenas:8", cpus=8, pinned=True) == []
    assert check_malloc_conf("percpu_arena:percpu", cpus=8) == []


def test_physical_cpu_arenas_want_an_even_cpu_count() -> None:
    """(The real library's line for this is taken for a machine report by run_jemalloc.)"""
    [problem] = check_malloc_conf("percpu_arena:phycpu,narenas:2", cpus=3)
    assert problem.key == "percpu_arena" and "use percpu" in problem.message
    assert check_malloc_conf("percpu_arena:phycpu,narenas:2", cpus=4) == []


def test_physical_cpu_arenas_in_a_process_pinned_to_cpus_not_counted_yet_are_said() -> None:
    """Pinned to CPUs whose count is not known (a NUMA node's share of the pod's): an odd
    one makes jemalloc warn, and abort under abort:true, so it is said before it runs."""
    conf = "abort:true,percpu_arena:phycpu,narenas:2"
    [problem] = check_malloc_conf(conf, pinned=True)
    assert problem.key == "percpu_arena" and "not known before the pod runs" in problem.message
    assert aborting(conf, [problem]) is not None
    assert check_malloc_conf(conf) == []  # not pinned: the node's count, even on any real node
    assert check_malloc_conf(conf, cpus=4, pinned=True) == []  # counted, and even


@needs_jemalloc
def test_the_specs_pairs_win_over_the_containers_in_the_merged_conf(tmp_path: Path) -> None:
    """pod_patch puts the container's own MALLOC_CONF first and the spec's after it: jemalloc
    takes the later of two settings, and keeps the container's others."""
    from infertune.api.spec import InferenceTuningSpec
    from infertune.tuning.pod_patch import PodContext, plan_pod_patch

    spec = InferenceTuningSpec.model_validate({
        "targetRef": {"name": "qwen"}, "engine": "vllm",
        "allocator": {"mallocConf": "narenas:4,dirty_decay_ms:5000"}})
    pod = {"metadata": {"labels": {}}, "spec": {"containers": [{
        "name": "vllm", "command": ["vllm", "serve"],
        "env": [{"name": "MALLOC_CONF", "value": "background_thread:true,narenas:16"}]}]}}
    plan = plan_pod_patch(spec, pod, PodContext("qwen", "img"))
    (conf,) = [op["value"]["value"] for op in plan.patch
               if isinstance(op.get("value"), dict) and op["value"].get("name") == "MALLOC_CONF"]
    seen = read_back(conf, tmp_path)
    assert (seen["opt.narenas"], seen["opt.dirty_decay_ms"], seen["opt.background_thread"]) == (
        4, 5000, True)


@needs_jemalloc
def test_a_merged_conf_that_would_abort_every_process_refuses_the_patch(tmp_path: Path) -> None:
    """The container's MALLOC_CONF and the spec's are each fine alone; together jemalloc
    aborts (prof_leak_error without prof_final, under abort_conf): the pod is left untuned.
    The other way round, the spec's prof_final settles the container's prof_leak_error."""
    from infertune.api.spec import InferenceTuningSpec
    from infertune.tuning.pod_patch import PodContext, plan_pod_patch

    def plan(own: str, spec_conf: str) -> Any:
        spec = InferenceTuningSpec.model_validate({
            "targetRef": {"name": "qwen"}, "engine": "vllm",
            "allocator": {"mallocConf": spec_conf}})
        pod = {"metadata": {"labels": {}}, "spec": {"containers": [{
            "name": "vllm", "command": ["vllm", "serve"],
            "env": [{"name": "MALLOC_CONF", "value": own}]}]}}
        return plan_pod_patch(spec, pod, PodContext("qwen", "img"))

    own = "prof:true,prof_final:true,prof_leak_error:true"
    spec_conf = "abort_conf:true,prof_final:false"
    alone = run_jemalloc(own, tmp_path)  # at exit it reports the leaks it was asked to
    assert alone.returncode != -signal.SIGABRT
    assert not [c for c in alone.complaints if "w/o prof_final" in c], alone.complaints
    assert run_jemalloc(spec_conf, tmp_path).complaints == []
    assert run_jemalloc(f"{own},{spec_conf}", tmp_path).returncode == -signal.SIGABRT
    refused = plan(own, spec_conf)
    assert refused.refused and refused.patch == []
    assert "makes jemalloc abort every process of the container (abort_conf or abort), on " \
        "prof_leak_error" in refused.problems[0]
    settled = plan("prof_leak_error:true", "prof_final:true")
    assert not settled.refused
    # Only that prof_leak_error is new in 5.3 (5.2 would ignore it) is said.
    assert [p for p in settled.problems if "MALLOC_CONF" in p] == [
        "MALLOC_CONF 'prof_leak_error:true,prof_final:true' sets prof_leak_error, new in "
        "jemalloc 5.3: the 5.2 of Ubuntu 22.04 and Debian 11 (the base of many CUDA images) "
        "ignores them; check the image's libjemalloc2 version"], settled.problems



@needs_jemalloc
@pytest.mark.parametrize(("conf", "aborts"), [
    ("abort_conf:true,narenas:5000", False),  # cut to the limit: a warning, no abort
    ("abort_conf:true,experimental_x:1", False),  # tolerated under abort_conf
    ("abort_conf:true,narenas:x", True),
    ("abort_conf:true,bogus:1", True),
    ("abort_conf:true,narenas:4,oops", True),  # a syntax error aborts too
    ("narenas:x", False),  # no abort_conf
])
def test_what_abort_conf_aborts_on_is_what_jemalloc_aborts_on(conf: str, aborts: bool,
                                                              tmp_path: Path) -> None:
    assert (aborting(conf, check_malloc_conf(conf)) is not None) is aborts
    assert (run_jemalloc(conf, tmp_path).returncode == -signal.SIGABRT) is aborts


@needs_jemalloc
def test_per_cpu_arenas_in_a_pinned_process_abort_under_abort_conf(tmp_path: Path) -> None:
    """The launcher binds the process to a NUMA node's CPUs: jemalloc cannot count them for
    sure, turns per-CPU arenas off, and under abort_conf aborts; with narenas it does not."""
    if CPUS < 2:
        pytest.skip("pinning to fewer CPUs than the process has needs two")
    # Any prefix of percpu_arena sets it; a narenas that wraps around to 0 is the default;
    # abort:true aborts on this check too, not only abort_conf:true.
    for conf in ("abort_conf:true,percpu_arena:percpu", "abort_conf:true,p:percpu",
                 "abort_conf:true,percpu_arena:percpu,narenas:4294967296",
                 "abort:true,percpu_arena:percpu"):
        found = check_malloc_conf(conf, pinned=True)
        assert aborting(conf, found) is not None, conf
        assert check_malloc_conf(conf) == []  # not pinned: nothing
        assert run_jemalloc(conf, tmp_path, cpus=1).returncode == -signal.SIGABRT, conf
    settled = "abort_conf:true,percpu_arena:percpu,narenas:4"
    assert check_malloc_conf(settled, pinned=True) == []
    assert run_jemalloc(settled, tmp_path, cpus=1).returncode == 0



@needs_jemalloc
def test_phycpu_on_an_odd_cpu_count_aborts_under_abort_only(tmp_path: Path) -> None:
    cases = (("abort_conf:true,percpu_arena:phycpu,narenas:2", False),
             ("abort:true,percpu_arena:phycpu,narenas:2", True))
    for conf, aborts in cases:
        found = check_malloc_conf(conf, cpus=1, pinned=True)
        assert found and (aborting(conf, found) is not None) is aborts
    if CPUS < 2:
        pytest.skip("one CPU here: pinned to it, jemalloc sees every CPU it may use")
    for conf, aborts in cases:
        # Run here directly: run_jemalloc takes this warning for a remark on the machine.
        cpu = sorted(os.sched_getaffinity(0))[0]
        done = subprocess.run(["/bin/true"], env={"LD_PRELOAD": str(JEMALLOC),
                                                  "MALLOC_CONF": conf}, cwd=tmp_path,
                              capture_output=True, text=True, timeout=30, check=False,
                              preexec_fn=lambda cpu=cpu: os.sched_setaffinity(0, [cpu]))
        assert "odd number (1) of CPUs" in done.stderr
        assert (done.returncode == -signal.SIGABRT) is aborts
