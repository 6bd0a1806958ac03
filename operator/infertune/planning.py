"""`infertune plan`: read a tuning and a pod from files and run the webhook's planner on them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from infertune.api.errors import field_errors
from infertune.api.spec import KIND, InferenceTuning
from infertune.tuning.pod_patch import PodContext, PodPlan, plan_pod_patch, pod_from_deployment


class PlanInputError(ValueError):
    """The files given to `infertune plan` do not hold what it needs."""


def _documents(path: Path) -> list[dict[str, Any]]:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    except OSError as exc:
        raise PlanInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise PlanInputError(f"{path}: not valid YAML: {exc}") from None
    return [d for d in docs if isinstance(d, dict)]


def load_tuning(path: Path) -> InferenceTuning:
    found = [d for d in _documents(path) if d.get("kind") == KIND]
    if len(found) != 1:
        raise PlanInputError(f"{path}: expected exactly one InferenceTuning, found {len(found)}")
    try:
        return InferenceTuning.model_validate(found[0])
    except ValidationError as exc:
        lines = [f"{path}: {e}" for e in field_errors(exc, InferenceTuning)]
        raise PlanInputError("\n".join(lines)) from None


def load_pod(path: Path) -> dict[str, Any]:
    """A Pod, or the pod a Deployment's template would create."""
    for doc in _documents(path):
        if doc.get("kind") == "Pod":
            return doc
        if doc.get("kind") == "Deployment":
            return pod_from_deployment(doc)
    raise PlanInputError(f"{path}: no Pod or Deployment found")


def render(plan: PodPlan, *, as_json: bool) -> str:
    if as_json:
        return json.dumps({"revision": plan.revision, "refused": plan.refused,
                           "patch": plan.patch, "reasons": plan.reasons,
                           "problems": plan.problems}, indent=2) + "\n"
    lines = [f"revision {plan.revision}" + (" (refused: pod admitted unchanged)"
                                            if plan.refused else "")]
    lines += [f"reason: {r}" for r in plan.reasons]
    lines += [f"problem: {p}" for p in plan.problems]
    lines += [f"patch: {json.dumps(op)}" for op in plan.patch]
    return "\n".join(lines) + "\n"


def plan_from_files(tuning_path: Path, pod_path: Path, launcher_image: str, *,
                    as_json: bool) -> str:
    tuning = load_tuning(tuning_path)
    pod = load_pod(pod_path)
    context = PodContext(tuning_name=tuning.metadata.name, launcher_image=launcher_image)
    return render(plan_pod_patch(tuning.spec, pod, context), as_json=as_json)
