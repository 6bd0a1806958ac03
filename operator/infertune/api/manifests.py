"""Check manifests the way `infertune validate` does: each InferenceTuning against the models,
then against the Deployment it targets when that Deployment is in the same set of files."""

from __future__ import annotations

import json
import math
import re
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from infertune.api.canary import CANARY_NOT_ENFORCED
from infertune.api.errors import FieldError, field_errors
from infertune.api.scaling import BATCHING_UNUSED, batching_unused
from infertune.api.spec import (
    API_VERSION,
    GROUP,
    KIND,
    InferenceTuning,
    Mode,
    apply_problems,
    latency_target_unresolvable,
)
from infertune.tuning.memory import MemoryHighError, resolve_memory_high
from infertune.tuning.pod_shape import pod_from_deployment, template_problem


@dataclass(frozen=True)
class Document:
    """One YAML document and where it came from."""

    source: str
    index: int
    body: Any

    @property
    def label(self) -> str:
        if not isinstance(self.body, dict):
            return f"{self.source}[{self.index}]"
        meta = self.body.get("metadata") or {}
        name = meta.get("name", "<no name>") if isinstance(meta, dict) else "<no name>"
        namespace = meta.get("namespace") if isinstance(meta, dict) else None
        where = f"{namespace}/{name}" if namespace else str(name)
        return printable(f"{self.body.get('kind', '<no kind>')} {where}")


def printable(text: str) -> str:
    """`text` with its control characters escaped: a name holding a newline printed a second
    line that read like another object's result ("prod.yaml: ... valid")."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@dataclass
class Report:
    """The outcome for one document."""

    document: Document
    errors: list[FieldError] = field(default_factory=list)
    checked: bool = True
    unchecked: str | None = None
    """What could not be checked of a valid tuning, or what it asks for that is not acted on,
    said beside "valid" (its Deployment not among the files, a canary)."""

    def lines(self) -> list[str]:
        prefix = f"{self.document.source}: {self.document.label}"
        return [f"{prefix}: {error}" for error in self.errors]


STDIN = "-"
"""A file argument that stands for standard input, as with kubectl apply -f -."""


@cache
def _stdin_text() -> str:
    """Standard input, read once: `plan - --pod -` reads the same text twice."""
    if sys.stdin is None:
        raise OSError("standard input is closed")
    return sys.stdin.buffer.read().decode("utf-8")


def read_manifest_text(path: Path) -> str:
    """The UTF-8 text of `path`, or of standard input for STDIN (OSError or
    UnicodeDecodeError when it cannot be read)."""
    return _stdin_text() if str(path) == STDIN else path.read_text(encoding="utf-8")


def source_name(path: Path) -> str:
    return "<stdin>" if str(path) == STDIN else str(path)


MAX_EXPANDED = 100_000
"""The most values a document's aliases may expand it to where they multiply it more than
ALIAS_EXPANSION times: a manifest has hundreds; go-yaml refuses such a document as
"excessive aliasing"."""
ALIAS_EXPANSION = 100


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """The values `node` stands for with every alias expanded, each node counted once in
    `sizes` (so the count takes one step per node, however far the aliases multiply it; a
    node that holds itself counts once)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    sizes[key] = 1
    if isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, sizes) + _expanded_size(v, sizes)
                       for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(item, sizes) for item in node.value)
    else:
        size = 1
    sizes[key] = size
    return size


class _KubectlLoader(yaml.SafeLoader):
    """Reads plain scalars as kubectl does (sigs.k8s.io/yaml, on go-yaml v2), not as PyYAML's
    YAML 1.1: a manifest `validate` passes is then the object the API server receives.
    PyYAML read `container: n` as the string n and `maxReplicas: 1:30` as 90 (kubectl sends
    false and the string "1:30", which the API server refuses), and refused `maxReplicas: 1e3`,
    `tolerance: +.5` and `name: 2024-01-01` that kubectl sends as 1000, 0.5 and a string."""

    yaml_implicit_resolvers: dict[Any, Any] = {}
    bool_values = {**yaml.SafeLoader.bool_values, "y": True, "n": False}
    # go-yaml v2 knows YAML 1.1's escapes only: "\/" (JSON's, and YAML 1.2's) is "found
    # unknown escape character" to kubectl, and was read as "/" here.
    # (Final in the type stubs; the scanner reads it from the instance, so it is overridden.)
    ESCAPE_REPLACEMENTS = {k: v for k, v in  # type: ignore[misc]
                           yaml.SafeLoader.ESCAPE_REPLACEMENTS.items() if k != "/"}

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int | float | str:  # type: ignore[override]
        """As Go's strconv.ParseInt(text, 0, 64) after go-yaml drops every '_': 0x, 0o and 0b
        prefixes in either case, and a leading 0 for octal. What does not parse (`0x_`, only
        underscores after the prefix; thousands of digits) is read as a float, else as the
        string it is, as go-yaml does: the API server then says the field wants a number."""
        text = str(self.construct_scalar(node))
        plain = text.replace("_", "")
        try:
            octal = re.fullmatch(r"[-+]?0[0-7]+", plain) is not None
            value = int(plain, 8) if octal else int(plain, 0)
        except ValueError:
            return self._float_or_text(text)
        if -(2**63) <= value < 2**64:
            return value
        # Out of int64 and uint64: go-yaml then tries a float, which Go reads from decimal
        # digits only (a huge 0x... stays the string it is); Python's int took thousands of
        # hex digits and failed printing them in the error message.
        decimal = re.fullmatch(r"[-+]?[0-9]+", plain) is not None
        return self._float_or_text(text) if decimal else text

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> str:  # type: ignore[override]
        """An explicit !!timestamp, as its text: go-yaml v2 gives kubectl the string (into an
        interface{}, "for backward compatibility"), where PyYAML made a date, which an error
        then showed as datetime.date(2024, 1, 2), and a string field refused."""
        return str(self.construct_scalar(node))

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float | str:  # type: ignore[override]
        return self._float_or_text(str(self.construct_scalar(node)))

    def construct_document(self, node: yaml.Node) -> Any:
        """The document, once its aliases are known not to expand it past reason: a 532-byte
        file of anchors nested nine deep (10^9 values) held `validate` at gigabytes of memory
        until it was killed, while kubectl refuses it ("excessive aliasing")."""
        nodes: dict[int, int] = {}
        expanded = _expanded_size(node, nodes)
        if expanded > max(MAX_EXPANDED, ALIAS_EXPANSION * len(nodes)):
            raise yaml.constructor.ConstructorError(
                None, None, f"excessive aliasing: its anchors expand to more than "
                f"{MAX_EXPANDED:,} values (kubectl refuses it too)", node.start_mark)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """A mapping whose keys are the strings kubectl sends (sigs.k8s.io/yaml turns a key
        read as a number or a flag into its text: `2024: x` is the label "2024"), each given
        once as those strings: read as Python's 1 and True, `{1: a, true: b}` was one key
        (kubectl sends "1" and "true"), and a label key 2024 was "not a valid string". A key
        given twice is refused: PyYAML and kubectl keep the last one silently, so `mode:
        DryRun` then `mode: Enforce` is applied as Enforce, and a check before the sync says
        so (stricter than kubectl, on purpose)."""
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)  # the base class says why
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<" merges: its keys may be overridden, as YAML says
            key = self._key_text(key_node, deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found the key {key!r} twice (a mapping key is given once)",
                    key_node.start_mark)
            seen.add(key)
        self.flatten_mapping(node)  # the merged keys first, then the mapping's own
        return {self._key_text(key_node, deep): self.construct_object(value_node, deep=deep)
                for key_node, value_node in node.value}

    def _key_text(self, node: yaml.Node, deep: bool) -> str:
        """A mapping key as sigs.k8s.io/yaml's JSON has it; a key it refuses ("Unsupported
        map key": null, a list, an integer past int64) is an error naming the key."""
        key = self.construct_object(node, deep=deep)
        if isinstance(key, str):
            return key
        if isinstance(key, bool):
            return "true" if key else "false"
        if isinstance(key, int) and -(2**63) <= key < 2**63:
            return str(key)
        if isinstance(key, float):
            return _go_float32_text(key)
        raise yaml.constructor.ConstructorError(
            None, None, f"a mapping key kubectl cannot send ({shown_key(key)}); write it as "
            "a quoted string", node.start_mark)

    @staticmethod
    def _float_or_text(text: str) -> float | str:
        plain = text.replace("_", "")
        special = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}
        if plain.lower() in special:
            return special[plain.lower()]
        try:
            value = float(plain)
        except ValueError:  # `1e_`, `._`: underscores only where digits must be
            return text
        # strconv.ParseFloat refuses a number out of float64's range (an error, so a string).
        return value if math.isfinite(value) else text


def shown_key(key: Any) -> str:
    """A mapping key that is no string, as a message shows it (YAML's words for null)."""
    return "null" if key is None else repr(key)[:40]


def _go_float32_text(value: float) -> str:
    """Go's strconv.FormatFloat(value, 'g', -1, 32), which sigs.k8s.io/yaml makes of a key
    read as a float: the fewest digits that read back as the same float32, as %e for an
    exponent under -4 or from 6 up (e+06), else as %f; YAML's words for the infinities and
    NaN."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    as32 = struct.unpack("f", struct.pack("f", value))[0]
    if as32 == 0:
        return "-0" if math.copysign(1, as32) < 0 else "0"
    for digits in range(1, 10):  # 9 significant digits always round-trip a float32
        text = f"{as32:.{digits - 1}e}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == as32:
            break
    mantissa, exponent = text.split("e")
    power = int(exponent)
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    if power < -4 or power >= 6:
        return f"{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"
    sign, body = ("-", mantissa[1:]) if mantissa.startswith("-") else ("", mantissa)
    figures = body.replace(".", "")
    if power < 0:
        return f"{sign}0.{'0' * (-power - 1)}{figures}"
    whole, frac = figures[:power + 1], figures[power + 1:]
    return f"{sign}{whole.ljust(power + 1, '0')}{'.' + frac if frac else ''}"


_KubectlLoader.add_constructor("tag:yaml.org,2002:int", _KubectlLoader.construct_yaml_int)
_KubectlLoader.add_constructor("tag:yaml.org,2002:timestamp",
                               _KubectlLoader.construct_yaml_timestamp)
_KubectlLoader.add_constructor("tag:yaml.org,2002:float", _KubectlLoader.construct_yaml_float)
for _tag, _pattern, _first in (
    ("bool", r"y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF",
     "yYnNtTfFoO"),
    ("null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    # go-yaml v2 tries an integer first, then a float; never a timestamp or base 60.
    ("int", r"[-+]?(?:0[bB][01_]+|0[oO][0-7_]+|0[xX][0-9a-fA-F_]+|0[0-7_]*|[1-9][0-9_]*)",
     "-+0123456789"),
    ("float", r"[-+]?(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9_]+)?"
     r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)", "-+.0123456789"),
    ("merge", r"<<", "<"),
):
    _KubectlLoader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}",
                                         re.compile(f"^(?:{_pattern})$"), list(_first))


def _json_object(text: str) -> list[Any] | None:
    """A file that is one JSON object, read as JSON, as kubectl reads it (tabs and numbers
    such as 1e-05 are JSON, and YAML 1.1 refuses or misreads them); None for anything else,
    which is read as YAML (a key given twice too, so that it is named)."""
    if not text.lstrip().startswith("{"):
        return None

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({key for key, _ in pairs}) != len(pairs):
            raise ValueError("a key given twice")
        return dict(pairs)

    try:
        return [json.loads(text, object_pairs_hook=unique)]
    except ValueError:
        return None


def load_documents(path: Path) -> tuple[list[Document], list[str]]:
    """The documents of a (multi-document) YAML file, or of standard input for STDIN, or the
    reason it cannot be read."""
    source = source_name(path)
    try:
        text = read_manifest_text(path)
    except OSError as exc:
        return [], [f"{source}: cannot read: {exc.strerror or exc}"]
    except UnicodeDecodeError:
        return [], [f"{source}: not UTF-8 text"]
    directive = next((i for i, line in enumerate(text.splitlines())
                      if re.match(r"%(YAML|TAG)\b", line)), None)
    if directive is not None:
        # kubectl reads the file in parts split on "---" lines, and refuses a part that holds
        # only the directive (with %YAML 1.2, the whole file): refused here the same way.
        return [], [f"{source}: line {directive + 1}: a YAML directive, which kubectl "
                    "refuses (it reads the file in parts split on '---' lines); remove it"]
    try:
        bodies = _json_object(text)
        if bodies is None:
            bodies = list(yaml.load_all(text, Loader=_KubectlLoader))
    except RecursionError:
        return [], [f"{source}: nested too deeply to be a manifest"]
    except ValueError as exc:  # a scalar no constructor above expected; never a traceback
        return [], [f"{source}: cannot be read as YAML: {str(exc)[:200]}"]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        if "unknown escape character '/'" in str(problem):
            problem = f"{problem}; write / without the backslash (kubectl refuses \\/ too)"
        return [], [f"{source}:{where}: not valid YAML: {problem}"]
    docs: list[Document] = []
    for i, body in enumerate(bodies):
        if (isinstance(body, dict) and str(body.get("kind")).endswith("List")
                and isinstance(body.get("items"), list)):
            # `kubectl get itune -o yaml` writes the objects as a v1 List, and kubectl applies
            # the items of any *List (InferenceTuningList too): each is checked (the List
            # itself was skipped as a kind of no interest, and so were they).
            docs += [Document(source, i, item) for item in body["items"] if item is not None]
        elif body is not None:
            docs.append(Document(source, i, body))
    return docs, []


def _deployment_key(body: dict[str, Any]) -> tuple[str | None, str]:
    """(namespace, None when unset; name) of a manifest."""
    meta = body.get("metadata") or {}
    if not isinstance(meta, dict):
        return None, ""  # no name: matches no tuning's targetRef
    return (str(meta["namespace"]) if meta.get("namespace") else None), str(meta.get("name"))


def same_namespace(one: str | None, other: str | None) -> bool:
    """Whether two manifests' namespaces (None: unset) are the same one: one left unset is
    taken as the other's, as kubectl puts both into the namespace of the context, or of
    --namespace (`validate` and `plan` match a tuning and its Deployment so)."""
    return one is None or other is None or one == other


def _target_of(tuning: InferenceTuning,
               deployments: list[tuple[tuple[str | None, str], dict[str, Any]]]
               ) -> dict[str, Any] | None:
    """The Deployment of the files the tuning targets: one of its namespace first, then one
    whose namespace (or the tuning's) is left unset. Only `default` on both counted, and a
    tuning without a namespace applied beside a Deployment of `inference` was called valid
    while `plan` refused its pods."""
    namespace = tuning.metadata.namespace
    found = [(key, body) for key, body in deployments
             if key[1] == tuning.spec.target_ref.name and same_namespace(key[0], namespace)]
    found.sort(key=lambda item: item[0][0] != namespace)
    return found[0][1] if found else None


SHOWN_RIVALS = 3
"""How many of the other tunings of a Deployment an error names; the rest are counted."""


def shown_rivals(names: list[str]) -> str:
    """The first SHOWN_RIVALS of `names`, the rest counted."""
    left = len(names) - SHOWN_RIVALS
    return ", ".join(names[:SHOWN_RIVALS]) + (f" and {left} more" if left > 0 else "")


def in_force(spec: Any) -> bool:
    """Whether a tuning's spec (a plain dict, as stored) is in force: mode Enforce, the
    default. A trial (mode DryRun) changes nothing (DESIGN.md #7)."""
    return not isinstance(spec, dict) or spec.get("mode") != Mode.DRY_RUN.value


def entry_in_force(entry: Any) -> bool:
    """Whether a tuning of the operator's tunings_by_target index is in force: by the spec
    the webhook tunes by (its `forced`, the last valid generation's mode while the stored
    spec is invalid), else by its stored spec."""
    forced = entry.get("forced") if isinstance(entry, dict) else None
    return forced if isinstance(forced, bool) else in_force(
        entry.get("spec") if isinstance(entry, dict) else None)


def pods_tuned_by(tunings: Iterable[tuple[str, bool]]) -> str | None:
    """Of the tunings of one Deployment, as (name, in force) pairs (a name given twice is one
    tuning), the one whose spec the pod webhook tunes its pods by: the only one, or the only
    one in force beside trials (mode DryRun), which change nothing: a trial beside the
    tuning in force stopped its pods being tuned. None when two or more in force, or two or
    more trials and none in force, target it: the pods are then tuned (or, by trials,
    annotated with a plan) by none of them."""
    named: dict[str, bool] = {}
    for name, forced in tunings:
        named[name] = named.get(name, False) or forced
    if len(named) == 1:
        return next(iter(named))
    forced_names = [name for name, forced in named.items() if forced]
    return forced_names[0] if len(forced_names) == 1 else None


def _rivals(tunings: list[InferenceTuning]) -> dict[int, list[FieldError]]:
    """By id of the tuning: an error naming the other tunings of the files that target the
    same Deployment when the webhook tunes its pods by none of them (`pods_tuned_by`); a
    trial beside the one tuning in force is none."""
    groups: dict[str, dict[str | None, list[InferenceTuning]]] = {}
    for tuning in tunings:
        by_namespace = groups.setdefault(tuning.spec.target_ref.name, {})
        by_namespace.setdefault(tuning.metadata.namespace, []).append(tuning)
    errors: dict[int, list[FieldError]] = {}
    for target, by_namespace in groups.items():
        for namespace, members in by_namespace.items():
            # One without a namespace lands in any: it meets every one of the target's.
            seen = ([t for ns in by_namespace.values() for t in ns] if namespace is None else
                    members + by_namespace.get(None, []))
            if len(seen) < 2 or pods_tuned_by(
                    (t.metadata.name, t.spec.mode is Mode.ENFORCE) for t in seen) is not None:
                continue
            any_forced = any(t.spec.mode is Mode.ENFORCE for t in seen)
            for tuning in members:
                if any_forced and tuning.spec.mode is not Mode.ENFORCE:
                    continue  # a trial: the ones in force are the problem
                # One name is one object, given twice (two files, a base and a copy): it
                # targets the Deployment once.
                others = sorted({t.metadata.name for t in seen
                                 if t.metadata.name != tuning.metadata.name
                                 and (t.spec.mode is Mode.ENFORCE or not any_forced)})
                if not others:
                    continue
                kind = "in mode Enforce " if any_forced else ""
                tuned = "tuned" if any_forced else "annotated with a trial's plan"
                errors[id(tuning)] = [FieldError(
                    "spec.targetRef.name", f"InferenceTuning {shown_rivals(others)} "
                    f"{kind}also target{'s' if len(others) == 1 else ''} Deployment {target}, "
                    f"and the pods of a Deployment more than one tuning {kind}targets are "
                    f"{tuned} by none; keep one tuning per Deployment (and trials in mode "
                    "DryRun beside it, if any)")]
    return errors


def _check_against_deployment(tuning: InferenceTuning, deployment: dict[str, Any]) -> list[
    FieldError
]:
    problem = template_problem(deployment)
    if problem is not None:  # what the planner could not read, the webhook could not either
        return [FieldError("spec.targetRef.name", f"the Deployment's {problem}")]
    containers = pod_from_deployment(deployment)["spec"].get("containers") or []
    if not containers:
        return [FieldError("spec.targetRef.name", "the Deployment has no containers")]
    wanted = tuning.spec.container
    if wanted is None:
        container = containers[0]
    else:
        container = next((c for c in containers if c.get("name") == wanted), None)
        if container is None:
            names = ", ".join(str(c.get("name")) for c in containers)
            return [FieldError("spec.container", f"{wanted!r} is not a container of Deployment "
                               f"{tuning.spec.target_ref.name}; its containers: {names}")]
    resources = container.get("resources") or {}
    limit = (resources.get("limits") or {}).get("memory")
    request = (resources.get("requests") or {}).get("memory", limit)
    try:
        resolve_memory_high(tuning.spec.memory, request=_str(request), limit=_str(limit))
    except MemoryHighError as exc:
        return [FieldError(f"spec.{exc.field}", exc.message)]
    except ValueError as exc:
        return [FieldError("spec.targetRef.name", f"the Deployment's container resources do "
                           f"not parse: {exc}")]
    return []


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def api_version_problem(body: dict[str, Any]) -> FieldError | None:
    """What is wrong with the apiVersion of a tuning manifest, None when it is the one
    served: `validate`, `plan` and `autoscale evaluate` check it the same way (a manifest
    without one, which kubectl refuses, was planned and evaluated)."""
    api_version = body.get("apiVersion")
    if api_version is None:
        return FieldError("apiVersion", f"is missing; set it to {API_VERSION}")
    if api_version != API_VERSION:
        return FieldError("apiVersion", f"{api_version!r} is not served; use "
                          f"{API_VERSION}")
    return None


def _check_tuning(document: Document) -> tuple[InferenceTuning | None, list[FieldError]]:
    body = document.body
    if (problem := api_version_problem(body)) is not None:
        return None, [problem]
    try:
        # by_name=False: the API has the camelCase names only (target_ref is unknown there).
        # A status in the file is not read: the API server drops it (the status subresource).
        tuning = InferenceTuning.model_validate(
            {k: v for k, v in body.items() if k != "status"}, by_name=False)
    except ValidationError as exc:
        return None, field_errors(exc, InferenceTuning)
    problems = apply_problems(tuning)
    if problems:
        return None, [FieldError(path, message) for path, message in problems]
    return tuning, []


def validate_documents(documents: Iterable[Document]) -> list[Report]:
    """A report per document; documents of other kinds are read for cross-checks only."""
    documents = list(documents)
    deployments = [
        (_deployment_key(doc.body), doc.body)
        for doc in documents
        if isinstance(doc.body, dict) and doc.body.get("kind") == "Deployment"
        and str(doc.body.get("apiVersion")) == "apps/v1"
    ]
    checked: list[tuple[Document, InferenceTuning | None, list[FieldError]]] = []
    reports: list[Report] = []
    for doc in documents:
        if not isinstance(doc.body, dict):
            reports.append(Report(doc, [FieldError("", "a manifest must be a YAML mapping with "
                                                   "apiVersion, kind and metadata")]))
            continue
        is_ours = doc.body.get("kind") == KIND or str(doc.body.get("apiVersion", "")).startswith(
            f"{GROUP}/")
        if not is_ours:
            reports.append(Report(doc, checked=False))
            continue
        if doc.body.get("kind") != KIND:
            reports.append(Report(doc, [FieldError("kind", f"{doc.body.get('kind')!r} is not a "
                                                   f"kind of {GROUP}; use {KIND}")]))
            continue
        tuning, errors = _check_tuning(doc)
        notes: list[str] = []
        if tuning is not None:
            target = _target_of(tuning, deployments)
            if target is not None:
                errors = _check_against_deployment(tuning, target)
            else:
                # "valid" read as checked against it, where the Deployment lives in another
                # file or repository (memory.high above its limit passed).
                notes.append(f"Deployment {tuning.spec.target_ref.name} is not among the "
                             "files: spec.container and memory.high not checked against it")
            if tuning.spec.canary is not None and tuning.spec.canary.enabled:
                # "valid" read as if the canary would run.
                notes.append(f"spec.canary is {CANARY_NOT_ENFORCED}")
            if batching_unused(tuning.spec):
                notes.append(f"spec.batching is {BATCHING_UNUSED}")
            if (unresolvable := latency_target_unresolvable(tuning.spec)) is not None:
                notes.append(unresolvable)
        unchecked = "; ".join(notes) or None
        checked.append((doc, tuning, errors))
        reports.append(Report(doc, errors, unchecked=unchecked))
    rivals = _rivals([tuning for _, tuning, _ in checked if tuning is not None])
    by_document = {id(doc): (tuning, errors) for doc, tuning, errors in checked}
    for number, report in enumerate(reports):
        tuning, errors = by_document.get(id(report.document), (None, []))
        if tuning is not None and id(tuning) in rivals:
            reports[number] = Report(report.document, errors + rivals[id(tuning)],
                                     unchecked=report.unchecked)
    return reports


def validate_paths(paths: Iterable[Path]) -> tuple[list[Report], list[str]]:
    """Reports for every document in `paths`, and the files that could not be read."""
    documents: list[Document] = []
    unreadable: list[str] = []
    seen: set[str] = set()
    for path in paths:
        if str(path) == STDIN and STDIN in seen:
            continue  # one stream: its documents once
        seen.add(str(path))
        docs, problems = load_documents(path)
        documents.extend(docs)
        unreadable.extend(problems)
    return validate_documents(documents), unreadable
