"""The CustomResourceDefinition, generated from the pydantic models.

pydantic writes JSON Schema 2020-12; a CRD needs a *structural* OpenAPI v3 schema: no $ref, a
type on every node, no `additionalProperties` beside `properties`, OpenAPI 3.0's boolean
`exclusiveMinimum`, and `anyOf` only inside a typed node (or as x-kubernetes-int-or-string).
This module does that translation so the models stay the single source of truth.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import core_schema, to_jsonable_python

from infertune.api import spec as api
from infertune.api.status import ConditionType, InferenceTuningStatus

Schema = dict[str, Any]

# Printer columns for `kubectl get itune`; paths point into the models above.
def _condition_reason(kind: ConditionType) -> str:
    """The JSONPath of the reason of condition `kind`, for a printer column."""
    return f'.status.conditions[?(@.type=="{kind}")].reason'


PRINTER_COLUMNS: list[Schema] = [
    {"name": "Target", "type": "string", "jsonPath": ".spec.targetRef.name",
     "description": "The Deployment being tuned"},
    {"name": "Mode", "type": "string", "jsonPath": ".spec.mode",
     "description": "Enforce or DryRun"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase",
     "description": "Whether the spec is accepted for its Deployment (Ready, DryRun): "
                    "Pending, Active, DryRun or Error"},
    # The phase sums up the controller's conditions; at 3 a.m. the question is whether the
    # autoscaler writes replicas, and if not why (MetricsUnavailable, ReplicaFight, ...).
    {"name": "Scaling", "type": "string",
     "jsonPath": _condition_reason(ConditionType.SCALING_ACTIVE),
     "description": "The ScalingActive condition's reason: Scaling when replicas follow the "
                    "signals, Fallback when no metrics raise them to fallbackReplicas, DryRun "
                    "when decisions are not written; any other says why replicas are not "
                    "written"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.autoscaling.currentReplicas",
     "description": "Replicas at the last evaluation"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.autoscaling.desiredReplicas",
     "description": "Replicas the autoscaler asked for", "priority": 1},
    # Not "P99": it is the quantile latency.quantile names (p50, p95), or the mean for
    # Triton (status.autoscaling.latencyKind says which).
    {"name": "Latency", "type": "string", "jsonPath": ".status.autoscaling.p99",
     "description": "The latency quantile (or mean) at the last evaluation: "
                    "status.autoscaling.latencyKind says which"},
    {"name": "Queue", "type": "number", "jsonPath": ".status.autoscaling.queueDepth",
     "description": "Requests waiting per replica at the last evaluation"},
    {"name": "Limited", "type": "string",
     "jsonPath": _condition_reason(ConditionType.SCALING_LIMITED),
     "description": "The ScalingLimited condition's reason: TooManyReplicas when the signals "
                    "call for more than maxReplicas", "priority": 1},
    {"name": "Canary", "type": "string", "jsonPath": ".status.canary.phase",
     "description": "Canary rollout phase"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


class _DefaultsFromFactories(GenerateJsonSchema):
    """Also emit defaults that come from default factories, so the API server fills them in.

    A nested model defaults to `{}` when all its fields have defaults: the API server then
    applies that model's own field defaults, so each default is written once, on the field that
    owns it. A model with required fields needs its whole default spelled out.
    """

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is None or schema.get("default_factory_takes_data"):
            return super().get_default_value(schema)
        value = factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            try:
                type(value).model_validate({})
            except ValidationError:
                # Required fields: the API server needs the whole default.
                return value.model_dump(by_alias=True, mode="json", exclude_none=True)
            return {}
        return to_jsonable_python(value, by_alias=True)


def _to_structural(node: Any, defs: Schema, *, keep_defaults: bool) -> Any:
    if isinstance(node, list):
        return [_to_structural(item, defs, keep_defaults=keep_defaults) for item in node]
    if not isinstance(node, dict):
        return node
    node, again = _resolved(dict(node), defs)
    if again:
        return _to_structural(node, defs, keep_defaults=keep_defaults)
    out: Schema = {}
    for key, value in node.items():
        _translate(out, key, value, defs, keep_defaults)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if "description" in out:
        out["description"] = " ".join(str(out["description"]).split())
    # A stable, readable order: what the node is first, then its constraints.
    first = [key for key in ("description", "type") if key in out]
    return {key: out[key] for key in first + sorted(set(out) - set(first))}


def _resolved(node: Schema, defs: Schema) -> tuple[Schema, bool]:
    """`node` with its `$ref`, single `allOf` or optional `anyOf` folded in, and whether the
    result still needs folding (a fold brought in another reference)."""
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**target, **node}  # the field's own description and default win
    if "allOf" in node and len(node["allOf"]) == 1:
        return {**node.pop("allOf")[0], **node}, True
    any_of = node.get("anyOf")
    if any_of is not None and not node.get("x-kubernetes-int-or-string"):
        # Optional[X] is `anyOf: [X, null]`; in a CRD an optional field is simply not required.
        options = [option for option in any_of if option != {"type": "null"}]
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {any_of!r} in a structural schema")
        del node["anyOf"]
        node = {**options[0], **node}
        return node, "$ref" in node
    return node, False


def _translate(out: Schema, key: str, value: Any, defs: Schema, keep_defaults: bool) -> None:
    """One JSON Schema keyword of pydantic's as a structural schema says it, into `out`."""
    if key in ("title", "$defs"):
        return
    if key == "default" and (value is None or not keep_defaults):
        return
    if key == "const":
        out["enum"] = [value]
    elif key == "exclusiveMinimum":
        out["minimum"], out["exclusiveMinimum"] = value, True
    elif key == "exclusiveMaximum":
        out["maximum"], out["exclusiveMaximum"] = value, True
    elif key == "additionalProperties" and value is False:
        return  # unknown fields are pruned by the API server and rejected by validate
    elif key == "properties":
        out[key] = {name: _to_structural(prop, defs, keep_defaults=keep_defaults)
                    for name, prop in value.items()}
    elif key in ("items", "additionalProperties", "anyOf"):
        out[key] = _to_structural(value, defs, keep_defaults=keep_defaults)
    else:
        out[key] = value


def structural_schema(model: type[BaseModel], *, keep_defaults: bool = True) -> Schema:
    """The structural OpenAPI v3 schema of one model."""
    raw = model.model_json_schema(by_alias=True, schema_generator=_DefaultsFromFactories)
    defs = raw.pop("$defs", {})
    result: Schema = _to_structural(raw, defs, keep_defaults=keep_defaults)
    return result


def custom_resource_definition() -> Schema:
    """The InferenceTuning CRD as a plain dict, ready for YAML or the API server."""
    spec_schema = structural_schema(api.InferenceTuningSpec)
    status_schema = structural_schema(InferenceTuningStatus, keep_defaults=False)
    root = {
        "type": "object",
        "description": (api.InferenceTuning.__doc__ or "").strip(),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    spec = {
        "group": api.GROUP,
        "scope": "Namespaced",
        "names": {
            "kind": api.KIND,
            "listKind": f"{api.KIND}List",
            "plural": api.PLURAL,
            "singular": api.SINGULAR,
            "shortNames": list(api.SHORT_NAMES),
            "categories": list(api.CATEGORIES),
        },
        "versions": [
            {
                "name": api.VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": root},
            }
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/part-of": "infertune"},
            "annotations": {SCHEMA_DIGEST_ANNOTATION: _digest(spec),
                            SCHEMA_GENERATION_ANNOTATION: str(SCHEMA_GENERATION)},
        },
        "spec": spec,
    }


CRD_NAME = f"{api.PLURAL}.{api.GROUP}"
SCHEMA_DIGEST_ANNOTATION = f"{api.GROUP}/schema-digest"
"""On the CRD: the digest of its spec as this release generates it (`schema_digest`). The
operator compares the installed CRD with its own at start and every minute
(controller/crd_check.py): Helm installs a chart's CRDs on its first install only, and an
upgrade that leaves the old CRD in place has the API server prune, without a word, every
field the old schema does not know."""


SCHEMA_GENERATION = 3
"""The generation of the CRD's schema: raised by one whenever its digest changes (a field
added, removed, retyped or described anew), so that the operator tells a newer release's CRD
from an older one (controller/crd_check.py): tests/test_crd_check.py holds the digest of this
generation and fails, saying so, when the schema changes without it."""
SCHEMA_GENERATION_ANNOTATION = f"{api.GROUP}/schema-generation"
"""On the CRD: SCHEMA_GENERATION of the release that generated it."""


def _digest(spec: Mapping[str, Any]) -> str:
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


@cache
def release_crd() -> Mapping[str, Any]:
    """custom_resource_definition(), built once (a few tens of milliseconds) for those that
    only read it; not to be changed."""
    return custom_resource_definition()


def schema_digest() -> str:
    """The digest of this release's CRD spec (names, schema, printer columns), as its
    SCHEMA_DIGEST_ANNOTATION says it."""
    return str(release_crd()["metadata"]["annotations"][SCHEMA_DIGEST_ANNOTATION])


def installed_digest(crd: Mapping[str, Any]) -> str | None:
    """The SCHEMA_DIGEST_ANNOTATION of an installed CRD (as the API server returns it), None
    when it has none (a CRD from a release before the annotation, or written by hand)."""
    value = _annotation(crd, SCHEMA_DIGEST_ANNOTATION)
    return value if isinstance(value, str) else None


def installed_generation(crd: Mapping[str, Any]) -> int | None:
    """The SCHEMA_GENERATION_ANNOTATION of an installed CRD, None when it has none or it is
    no whole number (edited by hand)."""
    value = _annotation(crd, SCHEMA_GENERATION_ANNOTATION)
    if not isinstance(value, str) or not re.fullmatch(r"[0-9]{1,9}", value):
        return None
    return int(value)


def _annotation(crd: Mapping[str, Any], key: str) -> object:
    metadata = crd.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return annotations.get(key) if isinstance(annotations, Mapping) else None


HEADER = (
    "# Generated by `infertune crds` from operator/infertune/api/. Do not edit by hand:\n"
    "# change the models and run `make crds`.\n"
)


class _PlainDumper(yaml.SafeDumper):
    """Writes a list or mapping the schema holds twice (scaleUp and scaleDown share one) in
    full each time: PyYAML would write an anchor and an alias (`&id001`, `*id001`), which
    not every tool that reads a CRD resolves, and no reader expects in one."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def render_crds() -> str:
    """The YAML text `infertune crds` prints and `crds/` holds."""
    body = yaml.dump(custom_resource_definition(), Dumper=_PlainDumper, sort_keys=False,
                     width=100)
    return HEADER + "---\n" + body
