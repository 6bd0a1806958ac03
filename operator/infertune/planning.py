"""`infertune plan`: read a tuning and a pod from files and run the webhook's planner on them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from infertune.api.errors import field_errors
from infertune.api.manifests import load_documents, source_name
from infertune.api.spec import KIND, InferenceTuning
from infertune.tuning.pod_patch import PodContext, PodPlan, plan_pod_patch
from infertune.tuning.pod_shape import pod_from_deployment, pod_problem, template_problem


class PlanInputError(ValueError):
    """The files given to `infertune plan` do not hold what it needs."""


def _documents(path: Path) -> list[dict[str, Any]]:
    docs, problems = load_documents(path)
    if problems:
        raise PlanInputError("\n".join(problems))
    return [d.body for d in docs if isinstance(d.body, dict)]


def load_tuning(path: Path) -> InferenceTuning:
    return _tuning_of(_documents(path), source_name(path))


def load_tuning_and_template(path: Path) -> tuple[InferenceTuning, dict[str, Any] | None]:
    """The tuning, and spec.template.spec of the Deployment it targets when the file holds it
    beside the tuning (the examples do), None when it does not; the file (or standard input)
    is read once."""
    documents = _documents(path)
    tuning = _tuning_of(documents, source_name(path))
    named = [d for d in documents if d.get("kind") == "Deployment"
             and _name(d) == tuning.spec.target_ref.name]
    if not named:
        return tuning, None
    return tuning, _deployment_pod(named[0], source_name(path))["spec"]


def _tuning_of(documents: list[dict[str, Any]], source: str) -> InferenceTuning:
    found = [d for d in documents if d.get("kind") == KIND]
    if len(found) != 1:
        others = sorted({str(d.get("kind")) for d in documents if d.get("kind") != KIND})
        seen = f" (the file holds {', '.join(others)})" if others and not found else ""
        raise PlanInputError(f"{source}: expected exactly one InferenceTuning, found "
                             f"{len(found)}{seen}")
    # A status in the file is not read, as validate does not read it: the API server's
    # copy (`kubectl get -o yaml | infertune autoscale evaluate -`) may hold one that
    # another version of the operator wrote, which is no reason to refuse the spec.
    body = {key: value for key, value in found[0].items() if key != "status"}
    try:
        return InferenceTuning.model_validate(body, by_name=False)  # as validate
    except ValidationError as exc:
        lines = [f"{source}: {e}" for e in field_errors(exc, InferenceTuning)]
        raise PlanInputError("\n".join(lines)) from None


def load_pod(path: Path, target: str | None = None) -> tuple[dict[str, Any], str | None]:
    """The pod to plan for: the one the Deployment named `target` (spec.targetRef) would
    create, else a Pod, else the file's only Deployment's; and the name of the Deployment it
    comes from (None for a Pod)."""
    docs, source = _documents(path), source_name(path)
    deployments = [d for d in docs if d.get("kind") == "Deployment"]
    named = [d for d in deployments if _name(d) == target]
    pods = [d for d in docs if d.get("kind") == "Pod"]
    if named:
        chosen, pod = named[0], None
    elif pods:
        chosen, pod = pods[0], pods[0]
    elif len(deployments) == 1:
        chosen, pod = deployments[0], None
    elif deployments:
        raise PlanInputError(f"{source}: no Deployment named {target} (spec.targetRef.name) among "
                             f"{', '.join(sorted(_name(d) for d in deployments))}")
    else:
        raise PlanInputError(f"{source}: no Pod or Deployment found")
    if pod is None:
        return _deployment_pod(chosen, source), _name(chosen)
    problem = pod_problem(pod)
    if problem is not None:
        raise PlanInputError(f"{source}: Pod {_name(pod)}: {problem}")
    return pod, None


def _deployment_pod(deployment: dict[str, Any], source: str) -> dict[str, Any]:
    """The pod `deployment` would create, or PlanInputError naming what in its template has a
    type the planner cannot read."""
    problem = template_problem(deployment)
    if problem is not None:
        raise PlanInputError(f"{source}: Deployment {_name(deployment)}: {problem}")
    return pod_from_deployment(deployment)


def _name(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata")
    return str(meta.get("name")) if isinstance(meta, dict) else "(no name)"


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
    target = tuning.spec.target_ref.name
    pod, owner = load_pod(pod_path, target)
    context = PodContext(tuning_name=tuning.metadata.name, launcher_image=launcher_image)
    plan = plan_pod_patch(tuning.spec, pod, context)
    if owner is not None and owner != target:
        # The file's only Deployment, planned for although the operator would never tune
        # its pods: said, so that the preview is not read as what will happen.
        plan.problems.insert(0, f"Deployment {owner} is not the tuning's target "
                                f"(spec.targetRef.name {target}): the operator never tunes "
                                "its pods; planned as if it were")
    return render(plan, as_json=as_json)
