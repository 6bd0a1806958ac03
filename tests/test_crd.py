"""The generated CRD: in step with the models, structural, and valid for the official schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from infertune.api.crd import PRINTER_COLUMNS, custom_resource_definition, render_crds
from infertune.api.status import ConditionType

CRD_FILE = Path(__file__).resolve().parent.parent / "crds" / "infertune.io_inferencetunings.yaml"


def _schema() -> dict[str, Any]:
    version = custom_resource_definition()["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, child in node.get("properties", {}).items():
        found += _walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += _walk(node["additionalProperties"], f"{path}{{}}")
    return found


CHART_CRD_FILE = CRD_FILE.parents[1] / "charts" / "infertune" / "crds" / CRD_FILE.name


@pytest.mark.parametrize("path", [CRD_FILE, CHART_CRD_FILE], ids=["crds", "chart"])
def test_generated_crd_files_match_the_models(path: Path) -> None:
    assert path.read_text(encoding="utf-8") == render_crds(), (
        f"{path} drifted from operator/infertune/api; run `make crds` and commit the result")


def test_the_crd_text_spells_out_every_node_without_yaml_aliases() -> None:
    """scaleUp and scaleDown share their `required` and `selectPolicy` enum lists, which
    PyYAML wrote as an anchor and aliases (`&id001`, `*id001`)."""
    events = list(yaml.parse(render_crds()))
    assert not [e for e in events if isinstance(e, yaml.AliasEvent)
                or getattr(e, "anchor", None) is not None]


SERVER_SIDE_DEFAULTS = frozenset({
    ".spec.targetRef.apiVersion", ".spec.targetRef.kind", ".spec.mode", ".spec.metrics",
    ".spec.metrics.podLabel", ".spec.metrics.namespaceLabel", ".spec.metrics.window",
    ".spec.numa", ".spec.numa.policy", ".spec.numa.strict", ".spec.memory",
    ".spec.memory.throttlingFactor", ".spec.memory.minHeadroom", ".spec.allocator",
    ".spec.allocator.type", ".spec.allocator.libraryPath", ".spec.retune",
    ".spec.retune.strategy", ".spec.retune.maxUnavailable", ".spec.mig.sizing.kvCache",
    ".spec.mig.sizing.headroomRatio", ".spec.mig.layout", ".spec.mig.strategy",
    ".spec.mig.nodeSelector", ".spec.mig.allowDisruption", ".spec.autoscaling.enabled",
    ".spec.autoscaling.minReplicas", ".spec.autoscaling.maxReplicas",
    ".spec.autoscaling.interval", ".spec.autoscaling.tolerance", ".spec.autoscaling.queue",
    ".spec.autoscaling.queue.targetPerReplica", ".spec.autoscaling.queue.sustain",
    ".spec.autoscaling.latency", ".spec.autoscaling.latency.quantile",
    ".spec.autoscaling.latency.target", ".spec.autoscaling.latency.consecutiveSamples",
    ".spec.autoscaling.latency.action", ".spec.autoscaling.latency.minRequestRate",
    ".spec.autoscaling.scaleUp", ".spec.autoscaling.scaleUp.pods",
    ".spec.autoscaling.scaleUp.percent", ".spec.autoscaling.scaleUp.period",
    ".spec.autoscaling.scaleUp.stabilization", ".spec.autoscaling.scaleDown",
    ".spec.autoscaling.scaleDown.pods", ".spec.autoscaling.scaleDown.percent",
    ".spec.autoscaling.scaleDown.period", ".spec.autoscaling.scaleDown.stabilization",
    ".spec.autoscaling.metricsUnavailable", ".spec.autoscaling.metricsUnavailable.action",
    ".spec.autoscaling.metricsUnavailable.after", ".spec.batching", ".spec.batching.mode",
    ".spec.batching.min", ".spec.batching.max", ".spec.canary.enabled", ".spec.canary.steps",
    ".spec.canary.analysis", ".spec.canary.analysis.interval",
    ".spec.canary.analysis.maxP99Regression", ".spec.canary.analysis.maxErrorRate",
    ".spec.canary.analysis.minRequestCount", ".spec.canary.analysis.failureLimit",
    ".spec.canary.routing", ".spec.canary.routing.type",
})
"""The fields the API server fills in when they are left out, as of the release before
spec.metrics.latencyHistogramUnit (57c3154). A field added since must not join them
(api/base.no_schema_default): the API server writes a default into every stored object,
also into those of a section that defaults to {} (such as spec.metrics), and an operator a
rollback (or the old pod of an upgrade, once the new CRD is applied) brings back refuses
every tuning holding a field it does not know."""


def test_no_field_added_since_gets_a_server_side_default() -> None:
    """spec.metrics.latencyHistogramUnit went into the CRD with `default: s`: under the
    previous operator every tuning became InvalidSpec (an unknown field) while an upgrade
    waited for the new pod, and for good after a rollback."""
    defaults = {path for path, node in _walk(_schema()) if "default" in node}
    assert defaults - SERVER_SIDE_DEFAULTS == set(), (
        "a new field with a server-side default; use json_schema_extra=no_schema_default")
    assert SERVER_SIDE_DEFAULTS - defaults == set()  # a default removed: a list to update


def test_select_policy_has_no_server_side_default() -> None:
    """A default the API server writes into every stored object: an operator rolled back to a
    version without the field (Helm never downgrades the CRD) refuses each of them as holding
    an unknown field. The model's default (Max) applies when it is left out."""
    nodes = dict(_walk(_schema()))
    for direction in ("scaleUp", "scaleDown"):
        rules = nodes[f".spec.autoscaling.{direction}"]
        assert "default" not in rules["properties"]["selectPolicy"]
        assert rules["properties"]["pods"]["default"] == (4 if direction == "scaleUp" else 0)


def test_crd_passes_the_official_apiextensions_schema() -> None:
    # strict: unknown fields anywhere in the CRD object are errors, as kubectl --validate=strict.
    kubernetes_validate.validate(yaml.safe_load(CRD_FILE.read_text()), "1.37", strict=True)


def test_official_schema_check_catches_a_broken_crd() -> None:
    broken = custom_resource_definition()
    broken["spec"]["versions"][0]["servedd"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.37", strict=True)


def test_schema_is_structural() -> None:
    for path, node in _walk(_schema()):
        assert "$ref" not in node and "allOf" not in node and "title" not in node, path
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            continue
        assert "type" in node, f"{path or '<root>'} has no type"
        assert "anyOf" not in node, path
        if "properties" in node:
            assert "additionalProperties" not in node, path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path


def test_quantities_are_int_or_string_and_fields_are_documented() -> None:
    nodes = dict(_walk(_schema()))
    for path in (".spec.memory.high", ".spec.memory.minHeadroom", ".spec.mig.sizing.weights"):
        assert nodes[path].get("x-kubernetes-int-or-string") is True, path
    undocumented = [p for p, n in nodes.items() if p.startswith(".spec.") and "[]" not in p
                    and "{}" not in p and not n.get("description")]
    assert undocumented == []


def test_defaults_and_enums_reach_the_schema() -> None:
    nodes = dict(_walk(_schema()))
    assert nodes[".spec.autoscaling.queue.targetPerReplica"]["default"] == 32
    assert nodes[".spec.autoscaling.queue.sustain"]["default"] == "30s"
    assert nodes[".spec.autoscaling.latency.target"]["default"] == "75ms"
    assert nodes[".spec.autoscaling.latency.consecutiveSamples"]["default"] == 2
    assert nodes[".spec.mode"]["enum"] == ["Enforce", "DryRun"]
    assert nodes[".spec.numa.policy"]["enum"] == ["gpu-local", "node", "interleave", "none"]
    assert nodes[".spec.engine"]["enum"] == ["vllm", "sglang", "tgi", "triton", "custom"]
    # Nested sections default to {} so the API server applies their own field defaults.
    assert nodes[".spec.numa"]["default"] == {}
    assert [s["weight"] for s in nodes[".spec.canary.steps"]["default"]] == [10, 25, 50]
    assert nodes[".spec"]["required"] == ["targetRef", "engine"]


def _default_is_complete(node: dict[str, Any], value: Any, path: str) -> list[str]:
    """What the API server checks: a default must itself validate, required fields included."""
    if not isinstance(value, dict) or node.get("type") != "object":
        return []
    props = node.get("properties", {})
    missing = [f"{path}.{k}" for k in node.get("required", [])
               if k not in value and "default" not in props.get(k, {})]
    for key, child in props.items():
        if key in value:
            missing += _default_is_complete(child, value[key], f"{path}.{key}")
        elif isinstance(child.get("default"), dict):
            missing += _default_is_complete(child, child["default"], f"{path}.{key}")
    return missing


def test_every_default_satisfies_its_own_schema() -> None:
    problems = [m for path, node in _walk(_schema()) if "default" in node
                for m in _default_is_complete(node, node["default"], path)]
    assert problems == []


def test_printer_columns_point_at_real_fields() -> None:
    nodes = dict(_walk(_schema()))
    names = [c["name"] for c in PRINTER_COLUMNS]
    for wanted in ("Target", "Mode", "Replicas", "Latency", "Queue", "Canary", "Age"):
        assert wanted in names
    conditions = {str(kind) for kind in ConditionType}
    for column in PRINTER_COLUMNS:
        path = column["jsonPath"]
        if path.startswith(".metadata"):
            continue
        if path.startswith(".status.conditions[?("):
            # A condition's reason: a condition type the operator sets, and fields the
            # condition model has.
            kind = path.split('"')[1]
            assert kind in conditions and path.endswith(f'"{kind}")].reason'), column
            assert ".status.conditions[].reason" in nodes
            continue
        assert path in nodes, column


def test_names_subresources_and_short_name() -> None:
    crd = custom_resource_definition()
    assert crd["metadata"]["name"] == "inferencetunings.infertune.io"
    assert crd["spec"]["names"]["shortNames"] == ["itune"]
    assert "infertune" in crd["spec"]["names"]["categories"]
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
