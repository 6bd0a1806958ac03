"""Admission check of InferenceTunings: an invalid spec is refused when it is applied.

Without it the API server stored any spec its schema took (`minReplicas` above
`maxReplicas`, a sustain past its bound), the sync that applied it succeeded, and the
tuning only said Ready=False (InvalidSpec) afterwards, where GitOps does not look. The check
is the one the controller makes (api/errors.stored_problems) plus what `infertune validate`
refuses in a spec the models take (api/spec.apply_problems), so a refusal here is the same
message the status or `validate` would give.

It ratchets, as Kubernetes' own validation does, so that an object stored with a problem
(before a release tightened a rule, or while the operator was down) can still be edited (a
label, another section) and deleted: an update of such an object is refused only for a
problem in a section of the spec it changes (spec.autoscaling, spec.mig, ...) that the stored
object did not show. A problem the check cannot tie to the stored one exactly (pydantic skips
a model's cross-field rules while one of its fields fails, so the stored object's list is not
complete) is judged by its section, and by the fields that section's rules read (a change
of spec.engine makes a spec.batching.knob wrong). The problems it keeps are returned as
warnings (saying which were stored before and which were let through unjudged), and the
status says InvalidSpec as before. An update of a valid object is refused any problem.

The check is a second webhook of the pod tuning's configuration (kube/webhooks.py): one
registration, CA and lifetime for both. A mutating webhook may refuse a request; this one
changes nothing. Its failurePolicy is Ignore, so a stopped operator never blocks an apply:
the controller still reports what this would have refused.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from kopf._cogs.structs.references import (  # how kopf matches --namespace
    NamespaceName,
    match_namespace,
)
from pydantic import ValidationError

from infertune.api.canary import CANARY_NOT_ENFORCED, canary_enabled
from infertune.api.errors import stored_problems
from infertune.api.manifests import entry_in_force, in_force, pods_tuned_by, shown_rivals
from infertune.api.scaling import BATCHING_UNUSED, batching_unused
from infertune.api.spec import (
    GROUP,
    PLURAL,
    VERSION,
    InferenceTuningSpec,
    apply_problems,
    latency_target_unresolvable,
)
from infertune.kube.webhooks import TUNING_HANDLER_ID

logger = logging.getLogger(__name__)

PLACEHOLDER_NAME = "generated"
"""Stands in for the name of an object created with metadata.generateName: the API server
generates the name after the mutating webhooks have run."""
MAX_MESSAGE = 4000
"""Characters of the refusal's message; the problems past it are counted."""
MAX_WARNING = 250
"""Characters of one warning: the API server may truncate longer ones."""


@dataclass(frozen=True)
class Verdict:
    refused: tuple[str, ...]
    """Problems the stored object did not have: the request is refused for them."""
    kept: tuple[str, ...]
    """Problems the stored object had already: let through, as a warning."""
    unjudged: tuple[str, ...] = ()
    """Problems of sections the request leaves as they were, in an object stored with
    problems that kept the checks across fields from running: whether it had them is not
    known. Let through, as a warning that says so."""


READS: dict[str, tuple[str, ...]] = {
    "batching": ("engine", "autoscaling"),
    "metrics": ("engine",),
}
"""The other fields of the spec the rules of a section read (spec._engine_rules: the
engine's knobs and presets; spec.apply_problems: batching with autoscaling): a change of one
of them can make a problem in a section the request leaves as it was."""


def section(problem: str) -> str | None:
    """The field of the spec a problem (`spec.<field>...: message`) is in; None for one of the
    spec as a whole."""
    path = problem.split(": ", 1)[0]
    if not path.startswith("spec."):
        return None
    return re.split(r"[.\[]", path[len("spec."):], maxsplit=1)[0]


def problems(obj: Mapping[str, Any]) -> list[str]:
    """What is wrong with the spec of `obj` (an object as the API server sends it), each as
    `field.path: message`. Metadata is the API server's to check; only the name and
    namespace are read."""
    return _checked(obj)[0]


def _checked(obj: Mapping[str, Any]) -> tuple[list[str], bool]:
    """`problems(obj)`, and whether every check ran (the spec passed the models; the
    checks across fields run only then)."""
    meta = obj.get("metadata") or {}
    body = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "metadata": {"name": meta.get("name") or PLACEHOLDER_NAME,
                         "namespace": meta.get("namespace")},
            "spec": obj.get("spec")}
    tuning, errors = stored_problems(body)
    if tuning is None:
        return [str(e) for e in errors], False
    return [f"{field}: {problem}" for field, problem in apply_problems(tuning)], True


def _unresolvable(spec: Any) -> str | None:
    """`latency_target_unresolvable` of a spec as admission sees it (a mapping), None when it
    does not pass the models (its problems are said otherwise)."""
    try:
        return latency_target_unresolvable(InferenceTuningSpec.model_validate(spec or {}))
    except ValidationError:
        return None


def verdict(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> Verdict:
    """The problems of `obj`, split by whether `old` (the stored object, None on a create)
    had them already. An update that leaves the spec as it was, or of an object being
    deleted, is not checked: kopf's finalizer and annotations must always go through."""
    if old is not None and (old.get("spec") == obj.get("spec")
                            or (obj.get("metadata") or {}).get("deletionTimestamp")):
        return Verdict((), ())
    found = problems(obj)
    if old is None or not found:
        return Verdict(tuple(found), ())
    said, every_check = _checked(old)
    before = set(said)
    if not before:  # stored valid: every check ran on it, so each problem is new
        return Verdict(tuple(found), ())
    spec, stored = obj.get("spec") or {}, old.get("spec") or {}

    def unchanged(problem: str) -> bool:
        # Every check ran on the stored object: a problem it did not have is new, in a
        # section the edit left alone too (a rule of one section reads another: a change of
        # spec.engine alone makes spec.batching.knob wrong, which was let through as
        # "stored with this problem before"). Where the stored object failed the models,
        # the checks across fields did not run on it: its section left as it was, with the
        # fields its rules read, stands in for them.
        field = section(problem)
        return (not every_check and field is not None
                and all(spec.get(f) == stored.get(f) for f in (field, *READS.get(field, ()))))

    kept = tuple(p for p in found if p in before)
    unjudged = tuple(p for p in found if p not in before and unchanged(p))
    return Verdict(tuple(p for p in found if p not in kept and p not in unjudged), kept,
                   unjudged)


def refusal(name: str, refused: tuple[str, ...]) -> str:
    """The message of a refusal: every problem (those past MAX_MESSAGE counted), then what to
    do."""
    shown: list[str] = []
    for problem in refused:
        if shown and sum(len(p) + 2 for p in shown) + len(problem) > MAX_MESSAGE:
            break
        shown.append(problem[:MAX_MESSAGE])
    left = len(refused) - len(shown)
    text = "; ".join(shown) + (f"; and {left} more" if left else "")
    return (f"InferenceTuning {name or '(generated name)'}: {text}. Fix the spec and apply it "
            "again; `infertune validate FILE` shows the same problems before an apply")


def rivals_warning(name: str, target: str, entries: Any, forced: bool = True) -> str | None:
    """A warning when other tunings of the namespace target the same Deployment and its pods
    are then tuned by another one or by none (manifests.pods_tuned_by: the pods of a
    Deployment two tunings in force target are tuned by neither; a trial, mode DryRun, beside
    the one in force leaves them to it). `forced`: this tuning is in force."""
    modes = {str(e.get("name")): entry_in_force(e) for e in entries or ()
             if e.get("name") != name}
    owner = pods_tuned_by([(name, forced), *modes.items()])
    if not modes or owner == name:
        return None
    if owner is not None:
        return (f"InferenceTuning {owner} (mode Enforce) tunes the pods of Deployment "
                f"{target}: this trial reports its plan in status and does not annotate "
                "them")[:MAX_WARNING]
    # Named: the ones in force beside one in force, every one beside a trial of trials.
    others = sorted(n for n, other_forced in modes.items() if other_forced or not forced)
    one = len(others) == 1
    return (f"InferenceTuning{'' if one else 's'} {shown_rivals(others)} "
            f"target{'s' if one else ''} "
            f"Deployment {target} too: its new pods are tuned by none of them until only one "
            "does")[:MAX_WARNING]


def watched(namespace: str, memo: kopf.Memo) -> bool:
    """Whether this operator acts on tunings in `namespace` (--namespace, kopf's patterns
    too: a registration cannot select by a glob, so the API server sends every namespace's
    tunings then)."""
    server = getattr(memo, "webhook_server", None)
    included = () if server is None else server.registration.included_namespaces
    return not included or any(match_namespace(NamespaceName(namespace), p) for p in included)


@kopf.on.validate(GROUP, VERSION, PLURAL, id=TUNING_HANDLER_ID,  # type: ignore[arg-type]
                  operations=["CREATE", "UPDATE"])
async def check_tuning(body: kopf.Body, old: kopf.Body | None, operation: str,
                       warnings: list[str],
                       tunings_by_target: kopf.Index[tuple[str, str], dict[str, Any]],
                       memo: kopf.Memo, **_: Any) -> None:
    """Refuse a spec with a problem the stored object did not have (`verdict`). It runs on
    the event loop (no I/O). A failure of the check itself admits the object with a warning:
    kopf answers an exception other than AdmissionError by refusing the request."""
    meta = body.get("metadata") or {}
    name = str(meta.get("name") or "")
    try:
        if not watched(str(meta.get("namespace") or ""), memo):
            return  # another operator's to check, or none's
        found = verdict(body, old if operation == "UPDATE" else None)
        spec = body.get("spec") or {}
        target = str((spec.get("targetRef") or {}).get("name") or "")
        before = (old.get("spec") or {}) if old is not None else None
        rivals = None
        # Said when the tuning comes to the Deployment, or into force (DryRun to Enforce).
        if not found.refused and target and (
                before is None or (before.get("targetRef") or {}).get("name") != target
                or in_force(before) != in_force(spec)):
            rivals = rivals_warning(
                name, target, tunings_by_target.get((str(meta.get("namespace") or ""),
                                                     target)), in_force(spec))
    except Exception:
        logger.exception("could not check InferenceTuning %s; it is admitted", name)
        warnings.append("infertune: the spec could not be checked; it is admitted, and the "
                        "tuning's Ready condition says whether it is valid")
        return
    if found.refused:
        raise kopf.AdmissionError(refusal(name, found.refused), code=422)
    for problem in found.kept:
        warnings.append(f"infertune: stored with this problem before: {problem}"[:MAX_WARNING])
    for problem in found.unjudged:
        warnings.append(("infertune: let through in a section this change leaves as it was "
                         f"(the stored spec has other problems): {problem}")[:MAX_WARNING])
    if rivals is not None:
        warnings.append(f"infertune: {rivals}")
    spec = body.get("spec") or {}
    if canary_enabled(spec) and (old is None or not canary_enabled(old.get("spec") or {})):
        # Said when asked for: a spec.canary was applied and read as guarding the rollouts.
        warnings.append(f"infertune: spec.canary is {CANARY_NOT_ENFORCED}")
    if batching_unused(spec) and (old is None or not batching_unused(old.get("spec") or {})):
        # Likewise: batching in Recommend or Auto, and nothing to read it.
        warnings.append(f"infertune: spec.batching is {BATCHING_UNUSED}"[:MAX_WARNING])
    unresolvable = _unresolvable(spec)
    if unresolvable is not None and (old is None or _unresolvable(old.get("spec")) is None):
        # Likewise: vLLM's 75 ms default target, which its histogram cannot measure.
        warnings.append(f"infertune: {unresolvable}"[:MAX_WARNING])
