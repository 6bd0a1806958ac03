"""PromQL building: hostile values stay inside their string literal and match only themselves."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from infertune.api.spec import PROMQL_RESERVED, Engine
from infertune.metrics import promql
from infertune.metrics.plan import Signal, plan_queries
from infertune.metrics.presets import (
    PRESETS,
    EngineMetrics,
    HistogramLatency,
    Template,
    TemplateLatency,
)
from infertune.metrics.promql import Scope
from infertune.metrics.source import MetricsTarget

HOSTILE = [
    'a"b',
    "back\\slash",
    'ends with backslash\\',
    '"} or 1==1 or {x="',
    '"} or vector(1) #',
    "new\nline",
    "carriage\rreturn",
    ".*",
    "a|b",
    "(?i)ns",
    "\\\"",
]


def unquote(text: str) -> tuple[str, str]:
    """Read one PromQL double-quoted literal from the start of `text` as the Prometheus lexer
    does; return (value, rest). Raises on a raw newline, as the lexer does."""
    assert text[0] == '"'
    out, i = [], 1
    escapes = {"\\": "\\", '"': '"', "n": "\n", "r": "\r", "t": "\t"}
    while text[i] != '"':
        if text[i] == "\n":
            raise ValueError("unterminated quoted string")
        if text[i] == "\\":
            out.append(escapes[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out), text[i + 1:]


@pytest.mark.parametrize("value", HOSTILE)
def test_quote_keeps_a_hostile_value_inside_one_literal(value: str) -> None:
    decoded, rest = unquote(promql.quote(value) + "}")
    assert (decoded, rest) == (value, "}")


@pytest.mark.parametrize("value", HOSTILE)
def test_regex_escape_matches_only_the_value_itself(value: str) -> None:
    pattern = promql.regex_escape(value)
    assert re.fullmatch(pattern, value)
    for near in (value + "x", "x" + value, value[:-1], "anything"):
        if near != value:
            assert not re.fullmatch(pattern, near)


def test_one_of_matches_each_value_and_nothing_in_between() -> None:
    pattern = promql.one_of(["a.b", "c|d", "a.b"])
    assert pattern == "a\\.b|c\\|d"
    assert all(re.fullmatch(pattern, v) for v in ("a.b", "c|d"))
    assert not any(re.fullmatch(pattern, v) for v in ("axb", "c", "d", "a.bc|d"))


def test_a_hostile_namespace_stays_a_label_value_in_the_whole_query() -> None:
    namespace = '"} or 1==1 or {x="\n'
    scope = Scope("namespace", "pod", (namespace,), ("llm",))
    query = promql.queue_query(scope, PRESETS[Engine.VLLM], 30.0, 1.0, 32.0)
    first = query.index('namespace=~"') + len("namespace=~")
    regex, rest = unquote(query[first:])
    assert re.fullmatch(regex, namespace)
    assert rest.startswith(',pod=~"')
    assert "\n" not in query


@pytest.mark.parametrize("name", ["up or vector(1)", "a{b}", "1abc", "x\n", ""])
def test_names_are_checked_again_before_they_are_spliced(name: str) -> None:
    with pytest.raises(ValueError):
        promql.spellings(name)
    with pytest.raises(ValueError):
        promql.label_name(name)


@pytest.mark.parametrize("name", ["group:left", "GROUP:RIGHT", "group:Left"])
def test_a_name_whose_underscored_spelling_is_a_keyword_is_refused(name: str) -> None:
    """`group:left` is read as `group_left` too (the colon trap), a keyword: the query did
    not parse, and its tunings never had data."""
    with pytest.raises(ValueError, match="also read as"):
        promql.spellings(name)
    assert promql.spellings("count:values") == ("count:values", "count_values")


@pytest.mark.parametrize("namespace_label, pod_label", [
    ("namespace", "infertune_target"), ("infertune_stat", "pod"), ("le", "pod"),
    ("namespace", "le"), ("pod", "pod")])
def test_the_pod_and_namespace_cannot_be_in_labels_the_queries_use(
        namespace_label: str, pod_label: str) -> None:
    """The queries add infertune_target and infertune_stat, and group by le and by the pod
    and namespace labels: reading the pod or namespace from one of them collided ("vector
    cannot contain metrics with the same labelset") or found nothing."""
    with pytest.raises(ValueError):
        Scope(namespace_label, pod_label)
    target = MetricsTarget("ns/a", "ns", "a", PRESETS[Engine.VLLM],
                           namespace_label=namespace_label, pod_label=pod_label)
    for plan in plan_queries([target], 1.0):
        with pytest.raises(ValueError):
            plan.query()


def test_an_interval_finer_than_a_millisecond_is_not_planned() -> None:
    """Prometheus keeps time in milliseconds: a finer step cannot end at the evaluation time,
    and 0.5 ms made Prometheus fail ("integer divide by zero")."""
    from infertune.metrics.plan import unsupported

    assert "not a whole number of milliseconds" in (
        unsupported(_target(0, latency_step_s=1.0005)) or "")
    assert unsupported(_target(0, latency_step_s=1.001)) is None
    assert promql.duration(1234.567) == "1234567ms" and promql.duration(2.0) == "2s"


def test_a_window_is_checked_again() -> None:
    with pytest.raises(ValueError):
        promql.window_text("1m]) or vector(1) #")


def test_colon_names_are_read_under_both_spellings() -> None:
    assert promql.spellings("vllm:num_requests_waiting") == (
        "vllm:num_requests_waiting", "vllm_num_requests_waiting")
    assert promql.spellings("tgi_queue_size") == ("tgi_queue_size",)
    scope = Scope("namespace", "pod", ("a",), ("llm",))
    query = promql.latency_query(scope, PRESETS[Engine.SGLANG], 0.99, "1m")
    assert "rate(sglang:e2e_request_latency_seconds_bucket{" in query
    assert " or rate(sglang_e2e_request_latency_seconds_bucket{" in query


def test_pod_pattern_matches_only_the_deployments_pods() -> None:
    scope = Scope("namespace", "pod", ("a",), ("llm", "llm-b"))
    pods = re.search(r'pod=~"([^"]*)"', scope.matchers())
    assert pods is not None
    pattern = pods.group(1).replace("\\\\", "\\")
    assert re.fullmatch(pattern, "llm-5d4f8b9c7-bcdfg")
    assert re.fullmatch(pattern, "llm-b-5d4f8b9c7-bcdfg")
    assert not re.fullmatch(pattern, "llmx-5d4f8b9c7-bcdfg")
    assert not re.fullmatch(pattern, "other-llm-5d4f8b9c7-bcdfg")
    assert not re.fullmatch(pattern, "llm-c-5d4f8b9c7-bcdfg")
    # Other workloads named after the Deployment: Kubernetes never generates a vowel, 0, 1 or
    # 3, so a word (DaemonSet llm-node, Job llm-warmup) or a CronJob's minute stamp is no
    # pod-template-hash.
    # Nor a word of up to three of its characters (Job llm-sft, DaemonSet llm-dp): the hash
    # is the decimal digits of a uint32, at least 4 but for a hash under 1000.
    assert re.fullmatch(pattern, "llm-5d4f-bcdfg")
    for other in ("llm-node-x7k2p", "llm-warmup-q8z4w", "llm-28501234-q8z4w",
                  "llm-5d4f8b9c7-bcdfa", "llm-sft-x2z4k", "llm-dp-bcdfg", "llm-v2-bcdfg"):
        assert not re.fullmatch(pattern, other), other


def _target(i: int, engine: Engine = Engine.VLLM, **fields: object) -> MetricsTarget:
    return MetricsTarget(f"ns{i % 7}/t{i}", f"ns{i % 7}", f"llm-{i}", PRESETS[engine],
                         **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [1, 10, 1000])
def test_query_count_stays_flat_as_tunings_grow(count: int) -> None:
    plans = plan_queries([_target(i) for i in range(count)], 1.0)
    assert sorted(p.signal for p in plans) == sorted(
        [Signal.QUEUE, Signal.LATENCY, Signal.REQUEST_RATE])


def test_distinct_query_shapes_get_their_own_queries() -> None:
    targets = [_target(0), _target(1, Engine.TGI), _target(2, quantile=0.95),
               _target(3, want_running=True), _target(4, queue_history_s=60.0),
               _target(5, queue_target=8.0), _target(6, queue_history_s=29.5)]
    plans = plan_queries(targets, 1.0)
    by_signal = {s: [p for p in plans if p.signal is s] for s in Signal}
    # vllm 30s/32 (with the 29.5s sustain, aligned to the 1s step), tgi, 60s, target 8
    assert len(by_signal[Signal.QUEUE]) == 4
    assert len(by_signal[Signal.LATENCY]) == 3  # vllm p99, vllm p95, tgi p99
    assert len(by_signal[Signal.RUNNING]) == 1
    shapes = {(p.lookback_s, p.threshold, len(p.members)) for p in by_signal[Signal.QUEUE]}
    assert shapes == {(30.0, 32.0, 4), (30.0, 32.0, 1), (60.0, 32.0, 1), (30.0, 8.0, 1)}
    sixty = next(p for p in by_signal[Signal.QUEUE] if p.lookback_s == 60.0).query() or ""
    assert "[60s:1s]" in sixty and "> 32.0" in sixty


def test_a_large_batch_names_namespaces_not_deployments() -> None:
    """The text must not grow with the number of tunings (long URLs are refused by proxies
    and cost CPU to encode); the adapter keeps only the Deployments it asked about."""
    few = plan_queries([_target(i) for i in range(3)], 1.0)[0].query() or ""
    assert '(?:llm-0|llm-1|llm-2)' in few  # short: Prometheus reads only these pods
    many = plan_queries([_target(i) for i in range(1000)], 1.0)[0].query() or ""
    more = plan_queries([_target(i) for i in range(5000)], 1.0)[0].query() or ""
    assert len(many) == len(more) < len(few) + 200
    assert "llm-1" not in many and 'namespace=~"ns0|ns1|' in many


def test_too_many_namespaces_select_every_namespace() -> None:
    targets = [MetricsTarget(f"team-{i}/t", f"team-{i}", "llm", PRESETS[Engine.VLLM])
               for i in range(400)]
    query = plan_queries(targets, 1.0)[0].query() or ""
    assert "namespace=~" not in query and f'pod=~"(?:llm){promql.POD_SUFFIX}"' in query
    alone = plan_queries(targets, 1.0)[0].query_for(targets[7])
    assert 'namespace=~"team-7"' in alone and 'pod=~"(?:llm)-' in alone


def test_window_query_reads_last_dip_samples_and_peak() -> None:
    query = promql.window_query("q", 30.0, 1.0, threshold=32.0, peak=True)
    for stat in ("last", "dip", "samples", "peak"):
        assert f'"infertune_stat", "{stat}"' in query
    assert "max_over_time(timestamp(((q) < Inf > -Inf) <= 32.0)[30s:1s])" in query
    assert promql.window_query("q", 2.5, 0.5).count("infertune_stat") == 1  # last only


@pytest.mark.parametrize("bad", [0.0, -1.0, 0.0004, float("nan")])
def test_subquery_durations_are_checked(bad: float) -> None:
    with pytest.raises(ValueError):
        promql.duration(bad)


def test_durations_and_numbers_are_spelled_for_promql() -> None:
    assert (promql.duration(30.0), promql.duration(1.5), promql.duration(0.25)) == (
        "30s", "1500ms", "250ms")
    assert promql.number(32) == "32.0"
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError):
            promql.number(bad)


def test_the_single_target_query_names_only_that_target() -> None:
    plan = plan_queries([_target(1), _target(2)], 1.0)[0]
    alone = plan.query_for(_target(2))
    assert "llm-2" in alone and "llm-1" not in alone


CUSTOM = EngineMetrics(
    Template('sum by (namespace, pod) (label_replace(router_queue{job="r", $selector}, '
             '"pod", "$1", "instance", "(.*)"))'),
    None,
    TemplateLatency(Template("rate(lat_seconds_bucket{$selector}[$window])"),
                    Template("rate(lat_seconds_count{$selector}[$window])")))


def test_a_template_gets_the_escaped_matchers_and_keeps_its_own_strings() -> None:
    """$selector becomes the same escaped matchers a preset's query has, inside the user's
    braces; the "$1" of the user's label_replace is a string and stays as written."""
    namespace = '"} or 1==1 or {x="\n'
    scope = Scope("namespace", "pod", (namespace,), ("llm",))
    query = promql.queue_query(scope, CUSTOM, 30.0, 1.0, 32.0)
    assert f'router_queue{{job="r", {scope.matchers()}}}' in query
    assert '"pod", "$1", "instance", "(.*)"' in query
    assert "$selector" not in query
    assert query.count("\n") == query.count("\n)")  # only before the closing parentheses
    first = query.index('namespace=~"') + len("namespace=~")
    regex, _ = unquote(query[first:])
    assert re.fullmatch(regex, namespace)
    latency = promql.latency_query(scope, CUSTOM, 0.95, "2m")
    assert latency.startswith("histogram_quantile(0.95, sum by (namespace, infertune_target, le)")
    assert f"(rate(lat_seconds_bucket{{{scope.matchers()}}}[2m])\n)" in latency
    rate = promql.request_rate_query(scope, CUSTOM, "2m")
    assert f"(rate(lat_seconds_count{{{scope.matchers()}}}[2m])\n)" in rate


def test_templates_are_planned_by_their_text() -> None:
    """Tunings with one template share its queries; another template is another plan (its
    errors are its own), and a $window in a gauge template splits the queue by window."""
    other = EngineMetrics(Template("q2{$selector}"), None, CUSTOM.latency)
    windowed = EngineMetrics(Template("avg_over_time(q{$selector}[$window])"), None,
                             CUSTOM.latency)
    targets = [MetricsTarget(f"ns/t{i}", "ns", f"llm-{i}", CUSTOM) for i in range(3)]
    targets += [MetricsTarget("ns/o", "ns", "other", other)]
    targets += [MetricsTarget(f"ns/w{w}", "ns", f"w-{w}", windowed, window=w)
                for w in ("1m", "2m")]
    plans = plan_queries(targets, 1.0)
    queue = [p for p in plans if p.signal is Signal.QUEUE]
    assert sorted(len(p.members) for p in queue) == [1, 1, 1, 3]
    assert {p.query().count("[2m]") > 0 for p in queue  # type: ignore[union-attr]
            if p.members[0].metrics is windowed} == {False, True}
    assert [t.latency_kind for t in targets[:1]] == ["p99"]


def test_templates_are_queried_per_namespace_and_presets_once_for_all() -> None:
    """A template can fail on the data (a group_left join is "many-to-many" where only
    team-a has duplicate series), and a failed query is no data for all it reads: team-b
    lost its metrics to team-a's series. Each namespace gets its template's own queries,
    shared by its tunings; the presets' queries, which data cannot make fail, stay one."""
    joined = Template("my_queue{$selector} * on(namespace, pod) group_left() "
                      "my_info{$selector}")
    templated = EngineMetrics(joined, joined, CUSTOM.latency)
    targets = [MetricsTarget(f"{ns}/t{i}", ns, f"llm-{i}", templated, want_running=True)
               for ns in ("team-a", "team-b") for i in range(3)]
    targets += [MetricsTarget(f"{ns}/p{i}", ns, f"vllm-{i}", PRESETS[Engine.VLLM],
                              want_running=True)
                for ns in ("team-a", "team-b") for i in range(3)]
    plans = plan_queries(targets, 1.0)
    for signal in Signal:
        mine = [p for p in plans if p.signal is signal and p.templated]
        assert sorted({t.namespace for t in p.members} for p in mine) == [
            {"team-a"}, {"team-b"}], signal
        assert [len(p.members) for p in mine] == [3, 3]  # flat in the tunings of a namespace
        assert all(p.scope().namespaces == (p.members[0].namespace,) for p in mine)
        (preset,) = [p for p in plans if p.signal is signal and not p.templated]
        assert len(preset.members) == 6


def test_a_long_template_keeps_its_namespace_however_long_its_query() -> None:
    """A template of some 800 characters is repeated six times in the window query, past
    MAX_QUERY_URL: the Deployments, then the namespaces, were dropped, so each namespace's
    plan became the same query over every namespace, and one team's duplicate series failed
    the others' again (and Prometheus ran it once per namespace). The namespace stays named;
    a proxy that refuses the query fails that namespace's tunings only."""
    from infertune.metrics.plan import MAX_QUERY_URL, url_length

    models = "|".join(f"qwen2-7b-instruct-{i:03d}" for i in range(30))
    joined = Template(f'max by (namespace, pod) (my_queue{{$selector, model=~"{models}"}}) '
                      "* on (namespace, pod) group_left () my_info{$selector}")
    assert 750 <= len(joined.text) <= 850
    templated = EngineMetrics(joined, joined, TemplateLatency(
        Template(f'rate(lat_bucket{{$selector, model=~"{models}"}}[$window])'),
        Template(f'rate(lat_count{{$selector, model=~"{models}"}}[$window])')))
    namespaces = ("team-a", "team-b", "team-c")
    targets = [MetricsTarget(f"{ns}/t{i}", ns, f"llm-{i}", templated, want_running=True,
                             queue_target=5.0, queue_history_s=30.0)
               for ns in namespaces for i in range(2)]
    plans = [p for p in plan_queries(targets, 1.0) if p.templated]
    assert {p.signal for p in plans} == set(Signal)
    assert max(url_length(p.query() or "") for p in plans) > MAX_QUERY_URL  # the long case
    for plan in plans:
        (mine,) = {t.namespace for t in plan.members}
        query = plan.query() or ""
        assert f'namespace=~"{mine}"' in query, (plan.signal, mine)
        assert not any(ns in query for ns in namespaces if ns != mine), (plan.signal, mine)


def test_fill_replaces_placeholders_outside_strings_and_comments_only() -> None:
    from infertune.api.templates import fill

    text = 'label_replace(q{$selector}, "t", "$selector", "a", "b") # $window in a comment\n'
    assert fill(text, {"selector": 'pod="x"', "window": "1m"}) == (
        'label_replace(q{pod="x"}, "t", "$selector", "a", "b") # $window in a comment\n')


def test_latency_and_rate_queries_are_shared_beyond_the_queue_and_the_quantile() -> None:
    """The request rate used to be planned per quantile, and both per whole metric set: two
    quantiles cost two rate queries, and another queue gauge two more range queries."""
    vllm = PRESETS[Engine.VLLM]
    own_queue = EngineMetrics("my_queue", vllm.running, vllm.latency)
    targets = [MetricsTarget("a/p99", "a", "x", vllm),
               MetricsTarget("a/p90", "a", "y", vllm, quantile=0.9),
               MetricsTarget("a/q", "a", "z", own_queue)]
    plans = plan_queries(targets, 1.0)
    count = {s: sum(1 for p in plans if p.signal is s) for s in Signal}
    assert count == {Signal.QUEUE: 2, Signal.RUNNING: 0, Signal.LATENCY: 2,
                     Signal.REQUEST_RATE: 1}
    (rate,) = [p for p in plans if p.signal is Signal.REQUEST_RATE]
    assert len(rate.members) == 3


def test_a_batch_query_stays_under_the_url_a_proxy_accepts() -> None:
    """The matchers are repeated in every selector of a query: at 53 tunings with long names
    the queue query's URL was 17 KB, and behind ingress-nginx (8 KiB) every tuning read as no
    data. Past the limit the Deployments, then the namespaces, are no longer named."""
    import requests

    from infertune.metrics.plan import MAX_QUERY_URL

    def targets(n: int) -> list[MetricsTarget]:
        return [MetricsTarget(f"inference-team-{i:03d}/t{i}", f"inference-team-{i:03d}",
                              f"qwen2-7b-instruct-{i:03d}", PRESETS[Engine.VLLM],
                              want_running=True) for i in range(n)]

    def request_line(query: str) -> tuple[str, int]:
        """The request line requests sends (range query parameters, as the adapter's), and
        the length of the query in it: measured on what goes out, not with the planner's own
        measure of it."""
        prepared = requests.Request("GET", "http://prometheus:9090/api/v1/query_range", params={
            "query": query, "start": "1796474860.000", "end": "1796474890", "step": "15",
            "timeout": "5"}).prepare()
        assert prepared.path_url is not None
        sent = prepared.path_url.split("query=", 1)[1].split("&", 1)[0]
        return f"GET {prepared.path_url} HTTP/1.1", len(sent)

    for n in range(1, 120, 4):
        for plan in plan_queries(targets(n), 1.0):
            line, query_length = request_line(plan.query() or "")
            assert query_length <= MAX_QUERY_URL, (n, plan.signal, query_length)
            assert len(line) <= 8 * 1024 - 1024, (n, plan.signal)  # ingress-nginx's buffer
    few = next(p for p in plan_queries(targets(2), 1.0) if p.signal is Signal.QUEUE)
    assert "(?:qwen2-7b-instruct-000|qwen2-7b-instruct-001)" in (few.query() or "")


def test_a_comment_ending_a_template_cannot_hide_what_follows_it() -> None:
    """`... # per pod` passed the check, and the operator's closing text after it on the same
    line was commented out: every query of the template failed to parse."""
    commented = EngineMetrics(Template("sum by (namespace, pod) (q{$selector}) # per pod"),
                              None, CUSTOM.latency)
    scope = Scope("namespace", "pod", ("a",), ("llm",))
    query = promql.gauge_query(scope, commented.queue_depth)
    line = next(line for line in query.splitlines() if "# per pod" in line)
    assert line.endswith("# per pod")  # nothing of the operator's after it


PROMTOOL = Path("/usr/bin/promtool")  # Debian package `prometheus`, as the server
PROMQL_WORDS = (
    # The PromQL lexer's keywords and aggregators, and its number words.
    "and", "or", "unless", "atan2", "by", "without", "on", "ignoring", "group_left",
    "group_right", "bool", "offset", "start", "end", "sum", "avg", "count", "min", "max",
    "group", "stddev", "stdvar", "topk", "bottomk", "count_values", "quantile", "limitk",
    "limit_ratio", "inf", "nan", "Inf", "NaN")


@pytest.mark.prometheus
@pytest.mark.skipif(not PROMTOOL.exists(), reason="needs promtool (Debian package prometheus)")
def test_every_word_that_breaks_a_query_as_a_name_is_refused_by_the_spec(
        tmp_path: Path) -> None:
    """Each word in one place at a time (every metric name, the pod label, the namespace
    label): the queries the operator builds are parsed by the real Prometheus parser
    (promtool), and none may fail there; the words refused when building are the reserved
    ones the spec validation refuses too. `without` was missing: `podLabel: without`
    validated, and its tuning's queue query was refused at every evaluation ("unexpected
    <without> in grouping opts"). Placed everywhere at once, the metric name's check refused
    the word first, and a label check that let it through went unseen."""
    plain = EngineMetrics("queue_waiting", "requests_running", HistogramLatency("latency"))
    places: dict[str, Callable[[str], MetricsTarget]] = {
        "metric": lambda word: MetricsTarget("ns/a", "ns", "a", EngineMetrics(
            word, word, HistogramLatency(word)), want_running=True),
        "pod label": lambda word: MetricsTarget("ns/a", "ns", "a", plain, pod_label=word,
                                                want_running=True),
        "namespace label": lambda word: MetricsTarget("ns/a", "ns", "a", plain,
                                                      namespace_label=word, want_running=True),
    }
    files: dict[Path, str] = {}
    refused: dict[str, set[str]] = {place: set() for place in places}
    for place, target in places.items():
        for word in PROMQL_WORDS:
            try:
                queries = [q for plan in plan_queries([target(word)], 1.0)
                           for q in (plan.query(), plan.floor_query()) if q is not None]
            except ValueError:
                refused[place].add(word)
                continue
            rules = [{"record": f"r{i}", "expr": q} for i, q in enumerate(queries)]
            path = tmp_path / f"{place.replace(' ', '_')}-{word}.yaml"
            path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": rules}]}))
            files[path] = f"{word} as the {place}"
    checked = subprocess.run([str(PROMTOOL), "check", "rules", *map(str, files)],
                             capture_output=True, text=True, timeout=60)
    broken = sorted(text for path, text in files.items() if f"{path.name}: " in checked.stderr)
    assert broken == [] and checked.returncode == 0, (broken, checked.stderr[:2000])
    assert checked.stdout.count("SUCCESS") == len(files), checked.stdout
    reserved = {word for word in PROMQL_WORDS if word.lower() in PROMQL_RESERVED}
    assert reserved, "the reserved words are among those tried"
    assert refused == dict.fromkeys(places, reserved), refused


COLON_WORDS = tuple(word.replace("_", ":") for word in PROMQL_WORDS if "_" in word)
"""The words with an underscore, spelled with a colon: a Prometheus scraping over OpenMetrics
stores `group:left` as `group_left`, and the queries read both spellings."""


@pytest.mark.prometheus
@pytest.mark.skipif(not PROMTOOL.exists(), reason="needs promtool (Debian package prometheus)")
def test_a_colon_name_whose_other_spelling_breaks_a_query_is_refused(tmp_path: Path) -> None:
    """`group:left` validated, and its queries, which read `group_left` too, never parsed:
    the tuning had no data for ever. Every metric name `validate` accepts must build queries
    that parse (promtool), and every one it refuses must not be built at all. The latency
    histogram is read as `<name>_bucket` (group_left_bucket), never bare: it is accepted."""
    from infertune.api.spec import InferenceTuning, apply_problems

    read_by = {Signal.QUEUE: "queueDepth", Signal.RUNNING: "running",
               Signal.LATENCY: "latencyHistogram", Signal.REQUEST_RATE: "latencyHistogram"}
    files, refused, unbuilt = [], set(), set()
    for word in COLON_WORDS:
        tuning = InferenceTuning.model_validate({"metadata": {"name": "q"}, "spec": {
            "targetRef": {"name": "llm"}, "engine": "vllm",
            "metrics": {"queueDepth": word, "running": word, "latencyHistogram": word}}})
        refused |= {(word, field) for field, _ in apply_problems(tuning)}
        target = MetricsTarget("ns/llm", "ns", "llm",
                               EngineMetrics(word, word, HistogramLatency(word)),
                               want_running=True)
        queries = []
        for plan in plan_queries([target], 1.0):
            try:
                queries += [q for q in (plan.query(), plan.floor_query()) if q is not None]
            except ValueError:
                unbuilt.add((word, f"spec.metrics.{read_by[plan.signal]}"))
        rules = [{"record": f"r{i}", "expr": q} for i, q in enumerate(queries)]
        path = tmp_path / f"{word.replace(':', '-')}.yaml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": rules}]}))
        files.append(path)
    # The builder refuses exactly what validate refuses (a stored tuning's own queries fail).
    assert refused == unbuilt == {(word, f"spec.metrics.{field}")
                                  for word in ("group:left", "group:right")
                                  for field in ("queueDepth", "running")}
    checked = subprocess.run([str(PROMTOOL), "check", "rules", *map(str, files)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
