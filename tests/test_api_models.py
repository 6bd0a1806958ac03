"""The InferenceTuning models: defaults from the incident and the cross-field rules."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from infertune.api.errors import field_errors
from infertune.api.spec import (
    InferenceTuning,
    InferenceTuningSpec,
    Mode,
    auto_batching_problem,
    batching_knob,
)
from infertune.api.status import InferenceTuningStatus


def _spec(**sections: Any) -> dict[str, Any]:
    return {"targetRef": {"name": "qwen"}, "engine": "vllm", **sections}


def _errors(**sections: Any) -> list[str]:
    with pytest.raises(ValidationError) as info:
        InferenceTuningSpec.model_validate(_spec(**sections))
    return [str(e) for e in field_errors(info.value, InferenceTuningSpec)]


def test_incident_defaults() -> None:
    spec = InferenceTuningSpec.model_validate(_spec(autoscaling={}))
    assert spec.autoscaling is not None
    assert spec.autoscaling.queue.target_per_replica == 32
    assert spec.autoscaling.queue.sustain.seconds == 30
    assert spec.autoscaling.latency.quantile == 0.99
    assert spec.autoscaling.latency.target.seconds == pytest.approx(0.075)
    assert spec.autoscaling.latency.consecutive_samples == 2
    assert spec.mode is Mode.ENFORCE
    assert spec.numa.policy.value == "gpu-local"
    assert spec.allocator.type.value == "jemalloc"


def test_hpa_like_rate_limit_defaults() -> None:
    scaling = InferenceTuningSpec.model_validate(_spec(autoscaling={})).autoscaling
    assert scaling is not None
    # kube HPA defaults: scale up max(100%, 4 pods)/15s at once; scale down 100%/15s after 5m.
    assert (scaling.scale_up.pods, scaling.scale_up.percent) == (4, 100)
    assert scaling.scale_up.stabilization.seconds == 0
    assert scaling.scale_down.stabilization.seconds == 300


@pytest.mark.parametrize(("direction", "given", "expected"), [
    # Every field left out keeps HPA's default for the direction, the limits included (a
    # limit left out cannot mean something else: an object stored before, or merged by
    # kubectl apply, holds the default the API server wrote).
    ("scaleDown", {"stabilization": "10m"}, (0, 100, "Max", "15s", "10m")),
    ("scaleUp", {"period": "1m"}, (4, 100, "Max", "1m", "0s")),
    ("scaleUp", {"selectPolicy": "Min"}, (4, 100, "Min", "15s", "0s")),
    ("scaleUp", {"pods": 2}, (2, 100, "Max", "15s", "0s")),
    ("scaleDown", {"pods": 0}, (0, 100, "Max", "15s", "300s")),
    ("scaleDown", {"percent": 10}, (0, 10, "Max", "15s", "300s")),
    ("scaleDown", {"selectPolicy": "Disabled"}, (0, 100, "Disabled", "15s", "300s")),
])
def test_a_partial_scaling_block_keeps_the_defaults_it_leaves_out(
        direction: str, given: dict[str, Any], expected: tuple[Any, ...]) -> None:
    scaling = InferenceTuningSpec.model_validate(
        _spec(autoscaling={direction: given})).autoscaling
    assert scaling is not None
    rules = scaling.scale_up if direction == "scaleUp" else scaling.scale_down
    got = (rules.pods, rules.percent, rules.select_policy.value, str(rules.period),
           str(rules.stabilization))
    assert got == expected
    # The other direction keeps all of its defaults.
    other = scaling.scale_down if direction == "scaleUp" else scaling.scale_up
    assert (other.pods, other.percent) == ((0, 100) if direction == "scaleUp" else (4, 100))


def test_values_round_trip_as_written() -> None:
    raw = _spec(memory={"high": "28Gi"}, autoscaling={"interval": "30s"})
    dumped = InferenceTuningSpec.model_validate(raw).model_dump(by_alias=True, exclude_unset=True)
    assert dumped["memory"] == {"high": "28Gi"}
    assert dumped["autoscaling"] == {"interval": "30s"}


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
         "autoscaling.minReplicas: 5 is above maxReplicas 2"),
        ({"memory": {"highRatio": 0}}, "memory.highRatio: 0: input should be greater than 0"),
        ({"memory": {"high": "0"}}, "memory.high: memory.high of 0 would throttle"),
        ({"memory": {"high": "500m"}}, "memory.high: memory.high of 500m would throttle"),
        ({"memory": {"high": "63Mi"}}, "memory.high: memory.high of 63Mi would throttle"),
        ({"canary": {"steps": [{"weight": 30}, {"weight": 30}]}},
         "canary.steps[1].weight: 30 does not rise above the previous step's 30"),
        ({"canary": {"routing": {"type": "GatewayAPI"}}},
         "canary.routing.httpRoute: type GatewayAPI needs httpRoute.name"),
        ({"canary": {"analysis": {"interval": "0s"}}},
         "canary.analysis.interval: 0s is too short a window to hold the Prometheus samples"),
        ({"canary": {"analysis": {"maxP99": "0s"}}},
         "canary.analysis.maxP99: 0s fails every check"),
        ({"numa": {"policy": "interleave", "node": 1}},
         "numa.node: is only used with policy node"),
        ({"mig": {}}, "mig.profile: set profile (for example 3g.71gb) or sizing"),
        ({"mig": {"profile": "3g.71gb", "layout": [{"profile": "2g.35gb"},
                                                   {"profile": "2g.35gb"}]}},
         "mig.layout: names a profile twice"),
        ({"mig": {"profile": "71gb"}}, "mig.profile: '71gb' is not a MIG profile name"),
        ({"allocator": {"type": "jemalloc", "arenaMax": 4}},
         "allocator.arenaMax: only applies to type glibc"),
        ({"allocator": {"libraryPath": "lib/libjemalloc.so"}},
         "allocator.libraryPath: 'lib/libjemalloc.so' must be one absolute path (starting with "
         "/) without whitespace or ':'"),
        # jemalloc stops reading at the NUL ("valid"), but the container cannot start with it.
        ({"allocator": {"mallocConf": "narenas:4\x00,bogus"}},
         "allocator.mallocConf: contains a NUL character, which no environment variable can "
         "carry; remove it"),
        ({"allocator": {"type": "glibc", "glibcTunables": "glibc.malloc.arena_max=2\x00"}},
         "allocator.glibcTunables: contains a NUL character"),
        ({"batching": {"min": 64, "max": 8}}, "batching.min: 64 is above max 8"),
        ({"batching": {"max": 2**31}},
         "batching.max: 2147483648: input should be less than or equal to 2147483647"),
        ({"autoscaling": {"interval": "500ms"}}, "autoscaling.interval: 500ms is too short"),
        ({"autoscaling": {"interval": "2h"}}, "autoscaling.interval: 2h is longer than 1h"),
        # Bounds that keep one tenant's spec from breaking or slowing the shared batch fetch.
        ({"autoscaling": {"queue": {"sustain": "11m"}}},
         "autoscaling.queue.sustain: 11m is too long"),
        # Echoed cut short: the whole value made a line as long as itself.
        ({"autoscaling": {"queue": {"sustain": "9" * 400 + "s"}}},
         "autoscaling.queue.sustain: '" + "9" * 40 + "'... (401 characters) is longer than any "
         "field here takes"),
        ({"autoscaling": {"latency": {"target": "0s"}}},
         "autoscaling.latency.target: 0s would count every request as a breach"),
        ({"autoscaling": {"latency": {"breachMemory": "25h"}}},
         "autoscaling.latency.breachMemory: 25h is longer than 24h"),
        ({"autoscaling": {"latency": {"target": "0s", "breachMemory": "2d"}}},
         "autoscaling.latency.breachMemory: '2d' is not a duration"),
        ({"autoscaling": {"scaleUp": {"pods": 4, "percent": 0, "period": "31m",
                                      "stabilization": "0s"}}},
         "autoscaling.scaleUp.period: 31m is outside 1ms..30m"),
        ({"autoscaling": {"scaleDown": {"pods": 1, "percent": 0, "period": "15s",
                                        "stabilization": "61m"}}},
         "autoscaling.scaleDown.stabilization: 61m is longer than 1h"),
        ({"autoscaling": {"scaleDown": {"pods": 0, "percent": 0, "period": "15s",
                                        "stabilization": "0s"}}},
         "autoscaling.scaleDown.pods: pods and percent are both 0, so replicas could never "
         "change in this direction; set at least one of them above 0, or selectPolicy: "
         "Disabled to say so"),
        ({"autoscaling": {"scaleDown": {"pods": 1, "percent": 0, "period": "15s",
                                        "stabilization": "0s", "selectPolicy": "Never"}}},
         "autoscaling.scaleDown.selectPolicy: 'Never' is not allowed; input should be 'Max', "
         "'Min' or 'Disabled'"),
        ({"metrics": {"window": "0s"}}, "metrics.window: '0s' is not a PromQL range: a whole "
         "number above 0 and one unit, ms, s, m or h (for example 1m or 90s)"),
        ({"autoscaling": {"queue": {"targetPerReplica": float("inf")}}},
         "autoscaling.queue.targetPerReplica: inf is not a finite number; give a number (the "
         "API server stores no .inf or .nan)"),
        # pydantic named its classes ("a valid dictionary or instance of NumaSpec").
        ({"numa": "gpu-local"}, "numa: 'gpu-local' is not a mapping; give its fields under it"),
        ({"canary": {"steps": {"weight": 10}}}, "canary.steps: {'weight': 10} is not a list"),
        ({"metrics": {"window": "2h"}}, "metrics.window: 2h is longer than 1h"),
        ({"metrics": {"podLabel": "__name__"}},
         "metrics.podLabel: '__name__' must be a Prometheus label name"),
        ({"metrics": {"namespaceLabel": "Inf"}},
         "metrics.namespaceLabel: 'Inf' is a PromQL keyword or number"),
        ({"metrics": {"podLabel": "without"}},
         "metrics.podLabel: 'without' is a PromQL keyword or number"),
        ({"engine": "custom", "metrics": {"queueDepth": "on", "latencyHistogram": "lat"}},
         "metrics.queueDepth: 'on' is a PromQL keyword or number"),
        ({"targetRef": {"name": "qwen", "kind": "StatefulSet"}},
         "targetRef.kind: 'StatefulSet' is not allowed"),
        # PromQL templates (spec.metrics.queries): the field and what to change.
        ({"engine": "custom", "metrics": {"queries": {"queueDepth": "q{$selector}"}}},
         "metrics.latencyHistogram: engine custom has no metric preset; name the metric "
         "(for example my_engine_request_latency_seconds), or give a PromQL template in "
         "metrics.queries.latencyBuckets"),
        ({"metrics": {"queries": {"queueDepth": "my_queue"}}},
         "metrics.queries.queueDepth: does not use $selector"),
        ({"metrics": {"queries": {"queueDepth": "q{$namespace}"}}},
         "metrics.queries.queueDepth: $namespace at character 3 is not a placeholder"),
        ({"metrics": {"queries": {"queueDepth": "q{pod=~\"x\"} or $selector"}}},
         "metrics.queries.queueDepth: $selector at character 16 must stand inside a "
         "selector's braces"),
        ({"metrics": {"queries": {"running": "rate(r{$selector}[1m]) > $window"}}},
         "metrics.queries.running: $window at character 26 must stand inside a range's"),
        ({"metrics": {"queries": {"queueDepth": "sum(q{$selector}"}}},
         "metrics.queries.queueDepth: '(' at character 4 is not closed"),
        ({"metrics": {"queries": {"queueDepth": "q{$selector, job=\"x}"}}},
         "metrics.queries.queueDepth: the string starting at character 18 is not closed"),
        ({"metrics": {"queries": {"queueDepth": "q{$selector}" + " " * 2000}}},
         "string should have at most 2000 characters"),
        ({"metrics": {"queries": {"latencyBuckets": "rate(b{$selector}[$window])"}}},
         "metrics.queries.requestRate: is needed with latencyBuckets"),
        ({"metrics": {"queries": {"queueDepth": "q{$selector} #\r), \"t\", \"x\", \"\", \"\")"}}},
         "metrics.queries.queueDepth: a control character (U+000D) at character 15"),
        ({"metrics": {"queueDepth": "q", "queries": {"queueDepth": "q{$selector}"}}},
         "metrics.queueDepth: give the metric name or queries.queueDepth, not both"),
        # pydantic's words: a raw pattern, "1e+20: unable to parse input string", and
        # "write it without quotes" for digits the API server does not read as a number.
        ({"mig": {"profile": "3g.71GB"}}, "mig.profile: '3g.71GB' is not a MIG profile name: "
         "lowercase, as NVIDIA writes it"),
        ({"autoscaling": {"maxReplicas": 1e20}}, "autoscaling.maxReplicas: 1e+20 is beyond "
         "any integer the API server stores (-2^63 to 2^63-1); give a number within the "
         "field's bounds"),
        ({"autoscaling": {"maxReplicas": "\uff13"}}, "autoscaling.maxReplicas: '\uff13' is not a "
         "number; give a number"),
        # The CRD's maxLength: the API server refuses it, validate passed it.
        ({"memory": {"minHeadroom": "0" * 61 + "28Gi"}},
         "memory.minHeadroom: '0000000000000000000000000000000000000000'... (65 characters): "
         "a quantity is at most 64 characters"),
    ],
)
def test_cross_field_and_range_rules(sections: dict[str, Any], expected: str) -> None:
    errors = _errors(**sections)
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize("engine,batching,problem", [
    # TGI sizes its batch at warmup for Flash Attention models, and logs the flag as
    # deprecated: each change re-created the pods for nothing, walking the knob to min.
    ("tgi", {"mode": "Auto", "min": 2048, "max": 32000}, "TGI ignores --max-batch-total-tokens "
     "for Flash Attention models"),
    ("custom", {"mode": "Auto", "knob": "max-batch-total-tokens", "min": 2048, "max": 32000},
     None),
    ("vllm", {"mode": "Auto", "knob": "max-num-batched-tokens", "min": 1024, "max": 16384},
     None),
    ("vllm", {"mode": "Auto"}, None),  # max-num-seqs counts requests: 1..256 fits it
    ("triton", {"mode": "Auto"}, "Triton reads max-queue-delay-microseconds from the model "
     "config"),
    ("tgi", {"mode": "Auto", "knob": "max-concurrent-requests"},
     "TGI refuses the requests above max-concurrent-requests"),
    ("tgi", {"mode": "Auto"}, "TGI ignores --max-batch-total-tokens"),
    ("custom", {"mode": "Auto", "knob": "max-batch-total-tokens"}, "spec.batching.min 1 is a "
     "request count, but max-batch-total-tokens counts tokens"),
    ("vllm", {"mode": "Auto", "knob": "max-num-batched-tokens", "min": 512, "max": 8192},
     "spec.batching.min 512 is a request count"),
])
def test_knobs_auto_must_not_drive_validate_and_are_refused_when_applied(
        engine: str, batching: dict[str, Any], problem: str | None) -> None:
    """Not a validation error: a stored tuning that validated before must keep its pod
    tuning after an upgrade. Auto then only recommends, and says why."""
    metrics = ({"metrics": {"queueDepth": "engine_queue", "latencyHistogram": "engine_seconds"}}
               if engine == "custom" else {})
    spec = InferenceTuningSpec.model_validate(_spec(engine=engine, batching=batching, **metrics))
    found = auto_batching_problem(spec.batching, batching_knob(spec.batching, spec.engine),
                                  spec.engine)
    assert (found is None) if problem is None else (problem in str(found)), found


def _manifest(**sections: Any) -> dict[str, Any]:
    return {"apiVersion": "infertune.io/v1alpha1", "kind": "InferenceTuning",
            "metadata": {"name": "q", "namespace": "ml"}, "spec": _spec(**sections)}


@pytest.mark.parametrize(("sections", "expected"), [
    # Read as group_left too (the colon trap): no query with it parsed.
    ({"metrics": {"queueDepth": "group:left"}},
     "spec.metrics.queueDepth: 'group:left' is read as 'group_left' too (a Prometheus "
     "scraping over OpenMetrics stores the colon as an underscore), a PromQL keyword"),
    ({"metrics": {"running": "Group:Right"}},
     "spec.metrics.running: 'Group:Right' is read as 'Group_Right' too"),
    # Labels the queries add or group by: the series collided, or none was found.
    ({"metrics": {"podLabel": "infertune_target"}},
     "spec.metrics.podLabel: 'infertune_target' is a label the operator's queries add to "
     "their results (infertune_target, infertune_stat), so it cannot hold the pod"),
    ({"metrics": {"namespaceLabel": "infertune_stat"}},
     "spec.metrics.namespaceLabel: 'infertune_stat' is a label the operator's queries add"),
    ({"metrics": {"podLabel": "le"}},
     "spec.metrics.podLabel: 'le' is a histogram bucket's bound, which the latency queries "
     "group by, so it cannot hold the pod"),
    ({"metrics": {"namespaceLabel": "pod"}},
     "spec.metrics.namespaceLabel: 'pod' is podLabel too; the queries group by the namespace "
     "and the pod, so they must be two labels"),
    # The latency query's step: Prometheus keeps time in milliseconds.
    ({"autoscaling": {"interval": "1s500us"}},
     "spec.autoscaling.interval: 1s500us is not a whole number of milliseconds"),
    ({"autoscaling": {"interval": "1.0005s"}},
     "spec.autoscaling.interval: 1.0005s is not a whole number of milliseconds"),
])
def test_what_the_queries_cannot_read_is_refused_by_validate_and_stored_ones_stay_valid(
        sections: dict[str, Any], expected: str) -> None:
    """Names and intervals the operator's queries cannot use, which the previous release
    took. `validate` refuses them; the models do not: a stored tuning turned InvalidSpec
    lost its pod tuning (new pods admitted untouched, no re-tuning, MIG pods Pending). The
    operator reads no data for it instead, and says why in MetricsAvailable (see
    test_a_target_whose_query_cannot_be_built_fails_alone)."""
    from infertune.api.errors import validate_stored
    from infertune.api.manifests import Document, validate_documents

    tuning, problems = validate_stored(_manifest(**sections))
    assert tuning is not None, problems
    (report,) = validate_documents([Document("t.yaml", 0, _manifest(**sections))])
    errors = [str(e) for e in report.errors]
    assert any(expected in e for e in errors), errors


def test_a_latency_histogram_is_read_by_its_suffixed_names_only() -> None:
    """The queries read <name>_bucket, _count and _sum, never the bare name: `group:left`
    (read as group_left_bucket too) was refused as if they read group_left."""
    from infertune.api.spec import apply_problems

    tuning = InferenceTuning.model_validate(_manifest(
        metrics={"latencyHistogram": "group:left"}))
    assert apply_problems(tuning) == []


@pytest.mark.parametrize("interval", ["1001ms", "1.5s", "1m0.001s", "15s"])
def test_intervals_in_whole_milliseconds_are_accepted(interval: str) -> None:
    from infertune.api.spec import apply_problems

    tuning = InferenceTuning.model_validate(_manifest(autoscaling={"interval": interval}))
    assert tuning.spec.autoscaling is not None
    assert tuning.spec.autoscaling.interval == interval
    assert apply_problems(tuning) == []


@pytest.mark.parametrize("label", ["_", "_pod", "pod_name", "k8s_namespace", "a"])
def test_label_names_prometheus_lets_users_choose_are_accepted(label: str) -> None:
    spec = InferenceTuningSpec.model_validate(_spec(metrics={"podLabel": label}))
    assert spec.metrics.pod_label == label


def test_every_problem_of_a_section_is_reported_at_once() -> None:
    errors = _errors(canary={"steps": [{"weight": 50}, {"weight": 20}, {"weight": 10}]})
    assert [e.split(":")[0] for e in errors] == ["canary.steps[1].weight",
                                                "canary.steps[2].weight"]


def test_status_round_trips_through_its_aliases() -> None:
    status = InferenceTuningStatus.model_validate({
        "observedGeneration": 3, "phase": "Active",
        "conditions": [{"type": "Ready", "status": "True", "observedGeneration": 3,
                        "lastTransitionTime": "2026-12-03T10:00:00Z", "reason": "Tuned"}],
        "autoscaling": {"currentReplicas": 2, "desiredReplicas": 4, "p99Ms": 2100.0},
    })
    dumped = status.model_dump(by_alias=True, exclude_none=True)
    assert dumped["conditions"][0]["observedGeneration"] == 3
    assert dumped["autoscaling"]["p99Ms"] == 2100.0


def test_full_object_needs_a_name() -> None:
    with pytest.raises(ValidationError) as info:
        InferenceTuning.model_validate({"metadata": {}, "spec": _spec()})
    assert [str(e) for e in field_errors(info.value, InferenceTuning)] == [
        "metadata.name: is required; add it"]


def test_thousands_of_problems_are_worded_up_to_a_bound_and_counted() -> None:
    """Each unknown field was compared with the known ones (did you mean): a review of
    480,000 of them held the operator's event loop for 23 s."""
    from infertune.api.errors import MAX_FIELD_ERRORS
    errors = _errors(**{"enigne": "vllm"}, **{f"x{i}": i for i in range(MAX_FIELD_ERRORS + 49)})
    assert len(errors) == MAX_FIELD_ERRORS + 1
    assert "enigne: unknown field; did you mean engine?" in errors
    assert errors[-1] == "and 50 more problems"
    assert len(_errors(**{f"x{i}": i for i in range(MAX_FIELD_ERRORS)})) == MAX_FIELD_ERRORS


def test_the_spec_examples_in_the_docs_validate() -> None:
    """Every YAML example of a spec in docs/ (those with an engine) is one the operator
    accepts: a user copies them."""
    import re
    from pathlib import Path

    import yaml

    checked = 0
    for doc in sorted((Path(__file__).parents[1] / "docs").glob("*.md")):
        for block in re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S):
            for body in yaml.safe_load_all(block):
                spec = body.get("spec") if isinstance(body, dict) else None
                if not isinstance(spec, dict) or "engine" not in spec:
                    continue
                InferenceTuningSpec.model_validate({"targetRef": {"name": "x"}, **spec})
                checked += 1
    assert checked >= 2


@pytest.mark.parametrize(("sections", "expected"), [
    # What pydantic alone turned into numbers and flags, and the API server refuses: a
    # `validate` that passed them sent users to a failed Argo CD sync instead.
    ({"autoscaling": {"minReplicas": "2"}},
     "autoscaling.minReplicas: '2' is a string, not a number; write it without quotes"),
    ({"autoscaling": {"minReplicas": True}},
     "autoscaling.minReplicas: true is a boolean, not a number; give a number"),
    # Not a number in quotes: "write it without quotes" was wrong advice.
    ({"autoscaling": {"minReplicas": "two"}},
     "autoscaling.minReplicas: 'two' is not a number; give a number"),
    ({"autoscaling": {"tolerance": "0.2"}},
     "autoscaling.tolerance: '0.2' is a string, not a number"),
    # Not numbers in YAML either: `.inf` is, and is refused as no target.
    ({"autoscaling": {"tolerance": "inf"}},
     "autoscaling.tolerance: 'inf' is not a number; give a number"),
    ({"autoscaling": {"maxReplicas": "1e400"}},
     "autoscaling.maxReplicas: 1e400 is out of range: a number beyond what a 64-bit float "
     "holds"),
    ({"autoscaling": {"queue": {"targetPerReplica": False}}},
     "autoscaling.queue.targetPerReplica: false is a boolean, not a number"),
    ({"autoscaling": {"enabled": "yes"}},
     "autoscaling.enabled: 'yes' is not true or false; write true or false without quotes"),
    ({"autoscaling": {"enabled": 1}}, "autoscaling.enabled: 1 is not true or false; write "
     "true or false"),
    ({"numa": {"policy": "node", "node": "1"}}, "numa.node: '1' is a string, not a number"),
    ({"memory": {"highRatio": "0.9"}}, "memory.highRatio: '0.9' is a string, not a number"),
    ({"autoscaling": {"metricsUnavailable": {"fallbackReplicas": "3"}}},
     "autoscaling.metricsUnavailable.fallbackReplicas: '3' is a string, not a number"),
    ({"canary": {"steps": [{"weight": "10"}]}},
     "canary.steps[0].weight: '10' is a string, not a number"),
])
def test_numbers_and_flags_are_taken_as_the_api_server_takes_them(
        sections: dict[str, Any], expected: str) -> None:
    errors = _errors(**sections)
    assert expected in " | ".join(errors), errors
    assert len(errors) == 1, errors  # said once, not once per branch of an optional field


def test_an_integral_float_is_an_integer_and_an_integer_a_number() -> None:
    """As the API server takes them (it stores `4.0` for an integer field as written, and
    the operator reads it back)."""
    spec = InferenceTuningSpec.model_validate(_spec(autoscaling={
        "maxReplicas": 4.0, "tolerance": 0, "queue": {"targetPerReplica": 16}}))
    assert spec.autoscaling is not None
    assert spec.autoscaling.max_replicas == 4 and isinstance(spec.autoscaling.max_replicas, int)
    assert spec.autoscaling.tolerance == 0.0
    assert spec.autoscaling.queue.target_per_replica == 16.0
    assert "autoscaling.maxReplicas" in " ".join(_errors(autoscaling={"maxReplicas": 4.5}))


def test_every_number_and_flag_of_the_spec_is_checked_like_the_api_server() -> None:
    """A field added later as a plain int, float or bool would take "2" and true again."""
    import types
    import typing

    from pydantic import BaseModel

    from infertune.api.base import FLAG, NUMBER

    def leaves(annotation: Any, metadata: tuple[Any, ...]) -> list[tuple[Any, tuple[Any, ...]]]:
        if typing.get_origin(annotation) is typing.Annotated:
            return leaves(annotation.__origin__, (*metadata, *annotation.__metadata__))
        if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, tuple, dict):
            return [leaf for arg in typing.get_args(annotation)
                    for leaf in leaves(arg, metadata)]
        return [(annotation, metadata)]

    seen: set[type[BaseModel]] = set()
    checked, unchecked = [], []
    todo: list[type[BaseModel]] = [InferenceTuningSpec]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            for kind, metadata in leaves(field.annotation, tuple(field.metadata)):
                if isinstance(kind, type) and issubclass(kind, BaseModel):
                    todo.append(kind)
                elif kind in (int, float, bool):
                    wanted = FLAG if kind is bool else NUMBER
                    where = f"{model.__name__}.{name}"
                    (checked if wanted in metadata else unchecked).append(where)
    assert not unchecked, f"plain int/float/bool fields: {unchecked}"
    assert len(checked) >= 25, checked  # the walk reached the nested sections


def test_a_null_field_is_left_out_as_the_api_server_prunes_it() -> None:
    """No field of the CRD is nullable, so the API server drops `numa: null` and stores the
    default section: `validate` refused what it takes."""
    spec = InferenceTuningSpec.model_validate(_spec(
        numa=None, autoscaling={"minReplicas": None, "scaleUp": {"pods": None}}))
    assert spec.numa.policy.value == "gpu-local"
    assert spec.autoscaling is not None
    assert (spec.autoscaling.min_replicas, spec.autoscaling.scale_up.pods) == (1, 4)
    assert InferenceTuningSpec.model_validate(_spec(autoscaling=None)).autoscaling is None
    # A required field given as null is missing, as there.
    assert _errors(targetRef=None) == ["targetRef: is required; add it"]


@pytest.mark.parametrize(("selector", "expected"), [
    ({"pool[gpu]": "a"}, "spec.mig.nodeSelector['pool[gpu]']: the key 'pool[gpu]' is not a "
     "label key"),
    ({"nvidia.com/gpu.product ": "x"}, "is not a label key"),  # a stray space
    ({"Example.com/pool": "a"}, "the key's prefix 'Example.com' is not a DNS subdomain"),
    ({"/pool": "a"}, "the key's prefix '' is not a DNS subdomain"),
    ({"pool": "a b"}, "the value 'a b' is not a label value"),
    ({"pool": "x" * 64}, "is not a label value"),
])
def test_a_node_selector_no_node_can_match_is_refused_by_validate(selector: dict[str, str],
                                                                  expected: str) -> None:
    """The selector is matched against node labels: one no node can carry selected no node,
    and MIG did nothing without a word. Refused by validate, not by the model: a stored
    tuning the previous release accepted must not turn InvalidSpec (and its pods untuned)
    on upgrade."""
    from infertune.api.spec import apply_problems

    tuning = InferenceTuning.model_validate({"metadata": {"name": "q"}, "spec": _spec(
        mig={"profile": "3g.71gb", "nodeSelector": selector})})
    problems = [f"{field}: {message}" for field, message in apply_problems(tuning)]
    assert any(expected in p for p in problems), problems
    assert all("no node can have it" in p for p in problems), problems


def test_node_selector_labels_kubernetes_takes_are_accepted() -> None:
    selector = {"nvidia.com/gpu.product": "NVIDIA-H200", "pool": "", "a.b-c/X_y.z": "v-1_2.3",
                "k" * 63: "v" * 63}
    spec = InferenceTuningSpec.model_validate(_spec(mig={"profile": "3g.71gb",
                                                         "nodeSelector": selector}))
    assert spec.mig is not None and spec.mig.node_selector == selector


def test_an_error_path_keeps_a_users_map_key_and_drops_pydantics_own_steps() -> None:
    from infertune.api.errors import format_path

    assert format_path(("metadata", "labels", "app[0]")) == "metadata.labels.app[0]"
    assert format_path(("spec", "mig", "function-after[_check(), str]", "profile")) == \
        "spec.mig.profile"
    assert format_path(("spec", "canary", "steps", 1, "weight")) == "spec.canary.steps[1].weight"


def test_every_integer_of_the_spec_has_a_bound_the_api_server_takes() -> None:
    """The API server refuses an integer above 2^63-1; one field had no upper bound, so
    validate passed what kubectl apply then refused. The bound is not a CRD `maximum`: the
    API server keeps those as float64 and refused the CRD with 2^63-1, and a lower one would
    turn objects the previous release stored (3e9, say) InvalidSpec on upgrade."""
    assert "canary.analysis.minRequestCount: 9223372036854775808 is beyond what the API " \
        "server stores" in " ".join(_errors(canary={
            "steps": [{"weight": 10}], "analysis": {"minRequestCount": 2**63}}))
    spec = InferenceTuningSpec.model_validate(_spec(canary={
        "steps": [{"weight": 10}], "analysis": {"minRequestCount": 2**63 - 1}}))
    assert spec.canary is not None
    # minReplicas had none: 2^63 was "above maxReplicas 10", where the API server refuses it.
    assert "autoscaling.minReplicas: 9223372036854775808 is beyond what the API server " \
        "stores" in " ".join(_errors(autoscaling={"minReplicas": 2**63}))
    fields = dict(_integer_fields(InferenceTuningSpec, "spec"))
    assert {"spec.numa.node", "spec.autoscaling.metricsUnavailable.fallbackReplicas",
            "spec.canary.steps.weight"} <= fields.keys()  # the walk reaches them all
    unbounded = [path for path, bounded in fields.items() if not bounded]
    assert not unbounded, f"give these a `le` or AfterValidator(int64): {unbounded}"


def _integer_fields(model: type, path: str) -> Iterator[tuple[str, bool]]:
    """(path, whether it has an upper bound: a `le`/`lt` or the int64 validator) of every
    integer field of `model` and the models under it."""
    import typing

    import annotated_types
    from pydantic import BaseModel
    from pydantic.fields import FieldInfo
    from pydantic.functional_validators import AfterValidator

    from infertune.api.base import int64

    assert isinstance(model, type) and issubclass(model, BaseModel)
    for name, field in model.model_fields.items():
        parts, todo = [], [field.annotation]
        while todo:  # the annotation's types and metadata, through unions and Annotated
            part = todo.pop()
            parts.append(part)
            todo.extend(typing.get_args(part))
        metadata = [*field.metadata, *parts]
        metadata += [m for p in parts if isinstance(p, FieldInfo) for m in p.metadata]
        at = f"{path}.{field.alias or name}"
        for part in parts:
            if isinstance(part, type) and issubclass(part, BaseModel) and part is not model:
                yield from _integer_fields(part, at)
        if int in parts and bool not in parts:
            yield at, any(isinstance(m, annotated_types.Le | annotated_types.Lt)
                          or (isinstance(m, AfterValidator) and m.func is int64)
                          for m in metadata)


def test_null_map_entries_are_taken_as_the_api_server_stores_them() -> None:
    """A label or nodeSelector entry given as null is dropped there, an annotation stored
    empty: validate refused all three."""
    tuning = InferenceTuning.model_validate({
        "metadata": {"name": "q", "labels": {"a": None, "b": "x"},
                     "annotations": {"example.com/a": None}},
        "spec": _spec(mig={"profile": "3g.71gb", "nodeSelector": {"pool": None}})})
    assert tuning.metadata.labels == {"b": "x"}
    assert tuning.metadata.annotations == {"example.com/a": ""}
    assert tuning.spec.mig is not None and tuning.spec.mig.node_selector == {}


def test_the_metadata_the_api_server_returns_is_read() -> None:
    """Every field of a stored object's metadata (managedFields and the rest) is known."""
    from infertune.api.spec import ObjectMeta

    stored = {"name": "q", "namespace": "ml", "uid": "u", "resourceVersion": "7",
              "generation": 2, "creationTimestamp": "2026-12-03T10:00:00Z",
              "managedFields": [{"manager": "kubectl"}], "finalizers": ["infertune.io/x"],
              "labels": {"app.kubernetes.io/name": "qwen"},
              "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}}
    assert ObjectMeta.model_validate(stored).name == "q"


@pytest.mark.parametrize(("path", "valid"), [
    ("/opt/lib/libjemalloc.so.2", True),
    ("/opt/lib\u00a0x/libjemalloc.so", True),  # no separator to ld.so, and RE2 takes it
    ("/opt/lib x/libjemalloc.so", False), ("/opt/a\tb.so", False), ("/opt/a\vb.so", False),
    ("/a:b.so", False),  # LD_PRELOAD splits on spaces and colons
    ("/opt/libjemalloc.so.2\x00", False),  # no environment variable carries a NUL
])
def test_the_library_path_pattern_means_the_same_to_the_api_server(path: str,
                                                                   valid: bool) -> None:
    """`\\s` is Unicode whitespace to pydantic and ASCII to the API server's RE2: a path the
    API server stored (a no-break space) was refused by the operator, and \\v the other way."""
    try:
        InferenceTuningSpec.model_validate(_spec(allocator={"libraryPath": path}))
    except ValidationError:
        assert not valid
    else:
        assert valid


def test_what_validate_alone_refuses_does_not_make_a_stored_tuning_invalid() -> None:
    """Checks the previous release did not make (metadata, nodeSelector labels) are for
    `validate`: a stored tuning holding such a value stays valid, and its pods tuned."""
    from infertune.api.errors import validate_stored
    from infertune.api.spec import apply_problems

    stored = {"apiVersion": "infertune.io/v1alpha1", "kind": "InferenceTuning",
              "metadata": {"name": "q", "namespace": "ml", "clusterName": "",
                           "annotations": {"Team.Example.com/owner": "ml"}},
              "spec": _spec(mig={"profile": "3g.71gb", "nodeSelector": {"gpu pool": "a"}},
                            canary={"steps": [{"weight": 10}],
                                    "analysis": {"minRequestCount": 3_000_000_000}})}
    tuning, problems = validate_stored(stored)
    assert tuning is not None, problems
    found = apply_problems(tuning)
    # The API server checks annotation keys in lower case: Team.Example.com/owner is fine.
    assert [field for field, _ in found] == ["metadata.clusterName",
                                             "spec.mig.nodeSelector['gpu pool']"]


def test_annotations_over_the_api_servers_total_are_refused_by_validate() -> None:
    """The API server refuses an object whose annotations (keys and values, in bytes) pass
    256 KiB: validate said valid, and the apply failed."""
    from infertune.api.spec import MAX_ANNOTATIONS_BYTES, apply_problems

    def tuning(value: str) -> InferenceTuning:
        return InferenceTuning.model_validate({
            "apiVersion": "infertune.io/v1alpha1", "kind": "InferenceTuning",
            "metadata": {"name": "q", "namespace": "ml", "annotations": {"note": value}},
            "spec": _spec()})

    fits = "x" * (MAX_ANNOTATIONS_BYTES - len("note"))
    assert apply_problems(tuning(fits)) == []
    wide = "é" * ((MAX_ANNOTATIONS_BYTES - len("note")) // 2 + 1)  # 2 bytes each in UTF-8
    assert apply_problems(tuning(wide)) == [(
        "metadata.annotations", f"{MAX_ANNOTATIONS_BYTES + 2} bytes in all; the API server "
        f"takes at most {MAX_ANNOTATIONS_BYTES} (keys and values together)")]


@pytest.mark.parametrize(("name", "unit", "problem"), [
    ("nv_inference_first_response_histogram_ms", "s", "set latencyHistogramUnit: ms"),
    ("engine_latency_milliseconds", "s", "set latencyHistogramUnit: ms"),
    ("engine_latency_us", "ms", "set latencyHistogramUnit: us"),
    ("engine_latency_microseconds", "s", "set latencyHistogramUnit: us"),
    ("Engine_Latency_MS", "s", "set latencyHistogramUnit: ms"),  # Prometheus allows case
    ("nv_inference_first_response_histogram_ms", "ms", None),
    ("engine_latency_seconds", "s", None),
    ("engine_latency_seconds", "ms", None),  # the user's word against no suffix
    ("engine_terms", "s", None),  # "ms" as part of a word is no unit
])
def test_a_histogram_named_in_another_unit_than_its_unit_is_refused_by_validate(
        name: str, unit: str, problem: str | None) -> None:
    """Triton's nv_inference_first_response_histogram_ms read in seconds: 150 ms was 150 s,
    and the tuning scaled to maxReplicas."""
    from infertune.api.spec import apply_problems

    tuning = InferenceTuning.model_validate(_manifest(
        engine="triton", metrics={"latencyHistogram": name, "latencyHistogramUnit": unit}))
    found = [f"{field}: {message}" for field, message in apply_problems(tuning)]
    if problem is None:
        assert found == []
    else:
        (only,) = found
        assert only.startswith("spec.metrics.latencyHistogramUnit: ") and problem in only


def test_a_latency_unit_without_a_histogram_is_refused() -> None:
    with pytest.raises(ValidationError) as refused:
        InferenceTuningSpec.model_validate(_spec(metrics={"latencyHistogramUnit": "ms"}))
    assert "latencyHistogramUnit" in str(refused.value)
    assert "name the histogram, or remove the unit" in str(refused.value)


def test_the_unit_reaches_the_query_and_the_preset_stays_in_seconds() -> None:
    from infertune.metrics import promql
    from infertune.metrics.presets import engine_metrics
    from infertune.metrics.promql import Scope

    ms = engine_metrics(InferenceTuningSpec.model_validate(_spec(engine="triton", metrics={
        "latencyHistogram": "nv_inference_first_response_histogram_ms",
        "latencyHistogramUnit": "ms"})))
    scope = Scope("namespace", "pod", ("serving",), ("tri",))
    text = promql.latency_query(scope, ms, 0.99, "1m")
    assert text.startswith("histogram_quantile(0.99, ") and text.endswith(") * 0.001")
    preset = engine_metrics(InferenceTuningSpec.model_validate(_spec()))
    in_seconds = promql.latency_query(scope, preset, 0.99, "1m")
    assert in_seconds.startswith("histogram_quantile(0.99, ") and in_seconds.endswith("))")


@pytest.mark.parametrize(("engine", "batching", "refused"), [
    ("tgi", {"mode": "Recommend"}, True),  # 1..256 tokens: no TGI starts with 128
    ("tgi", {"mode": "Recommend", "min": 4096, "max": 65536}, False),
    ("vllm", {"mode": "Recommend"}, False),  # max-num-seqs counts requests
    ("vllm", {"mode": "Recommend", "knob": "max-num-batched-tokens"}, True),
    ("tgi", {"mode": "Off"}, False),
])
def test_a_token_knob_recommended_within_request_counts_is_refused_by_validate(
        engine: str, batching: dict[str, Any], refused: bool) -> None:
    from infertune.api.spec import apply_problems

    tuning = InferenceTuning.model_validate(_manifest(engine=engine, autoscaling={},
                                                      batching=batching))
    found = [f"{field}: {message}" for field, message in apply_problems(tuning)]
    assert bool(found) is refused, found
    if refused:
        (only,) = found
        # The field once: "spec.batching.min: spec.batching.min 1 is ..." said it twice.
        assert only.startswith("spec.batching.min: 1 is a request count, but "), only
