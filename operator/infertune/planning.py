"""`infertune plan`: read a tuning and a pod from files and run the webhook's planner on them."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from infertune.api.errors import field_errors
from infertune.api.manifests import (
    api_version_problem,
    load_documents,
    printable,
    same_namespace,
    source_name,
)
from infertune.api.spec import KIND, InferenceTuning
from infertune.api.tuning import MigSpec, MigStrategy
from infertune.tuning.mig import (
    Infeasible,
    MemoryRequest,
    MigProduct,
    gib,
    load_catalog,
    plan_layout,
    request_from_spec,
)
from infertune.tuning.mig_nodes import PRODUCT_LABEL
from infertune.tuning.pod_patch import PodContext, PodPlan, plan_pod_patch
from infertune.tuning.pod_shape import (
    controlling_replicaset,
    deployment_by_hash,
    pod_from_deployment,
    pod_problem,
    template_problem,
)


class PlanInputError(ValueError):
    """The files given to `infertune plan` do not hold what it needs: one problem per line,
    each with its control characters escaped (a Deployment named "x\nreason: all good"
    printed a forged line of its own)."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(printable(problem) for problem in problems))


def _documents(path: Path) -> list[dict[str, Any]]:
    docs, problems = load_documents(path)
    if problems:
        raise PlanInputError(*problems)
    mappings = [d.body for d in docs if isinstance(d.body, dict)]
    if docs and not mappings:  # it was said to be empty
        raise PlanInputError(f"{source_name(path)}: holds no manifest (a YAML mapping with "
                             "apiVersion, kind and metadata), only a list or a scalar")
    return mappings


def load_tuning(path: Path) -> InferenceTuning:
    return _tuning_of(_documents(path), source_name(path))


def load_tuning_and_template(path: Path) -> tuple[InferenceTuning, dict[str, Any] | None]:
    """The tuning, and spec.template.spec of the Deployment it targets when the file holds it
    beside the tuning (the examples do), None when it does not; the file (or standard input)
    is read once."""
    documents = _documents(path)
    tuning = _tuning_of(documents, source_name(path))
    # One of that name in another namespace is another Deployment: the operator reads the
    # one in the tuning's namespace.
    named = [d for d in documents if d.get("kind") == "Deployment"
             and _name(d) == tuning.spec.target_ref.name
             and _same_namespace(d, tuning.metadata.namespace)]
    if not named:
        return tuning, None
    return tuning, _deployment_pod(named[0], source_name(path))["spec"]


def _shown_name(document: dict[str, Any]) -> str:
    metadata = document.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    return f"{metadata.get('namespace') or '?'}/{metadata.get('name') or '?'}"


def _tuning_of(documents: list[dict[str, Any]], source: str) -> InferenceTuning:
    found = [d for d in documents if d.get("kind") == KIND]
    if len(found) > 1:
        names = ", ".join(_shown_name(d) for d in found)
        raise PlanInputError(f"{source}: expected exactly one InferenceTuning, found "
                             f"{len(found)} ({names}); give a file with one (`kubectl get "
                             "inferencetuning NAME -n NAMESPACE -o yaml` prints one, and `-` "
                             "reads it from standard input)")
    if not found:
        kinds = sorted({str(d["kind"]) for d in documents if d.get("kind")})
        if any(difflib.get_close_matches(k.lower(), [KIND.lower()], cutoff=0.8)
               for k in kinds):  # InferenceTunning, inferencetuning
            seen = f" (the file holds kind {', '.join(kinds)}; use kind {KIND})"
        elif kinds:
            seen = f" (the file holds {', '.join(kinds)})"
        elif documents:
            seen = (" (the file holds no kind: is it a Helm values file? give the "
                    "InferenceTuning manifest)")
        else:
            seen = " (the file is empty)"
        raise PlanInputError(f"{source}: expected exactly one InferenceTuning, found 0{seen}")
    # A status in the file is not read, as validate does not read it: the API server's
    # copy (`kubectl get -o yaml | infertune autoscale evaluate -`) may hold one that
    # another version of the operator wrote, which is no reason to refuse the spec.
    body = {key: value for key, value in found[0].items() if key != "status"}
    if (problem := api_version_problem(body)) is not None:  # as validate says it
        raise PlanInputError(f"{source}: {problem}")
    try:
        return InferenceTuning.model_validate(body, by_name=False)  # as validate
    except ValidationError as exc:
        lines = [f"{source}: {e}" for e in field_errors(exc, InferenceTuning)]
        raise PlanInputError(*lines) from None


def load_pod(path: Path, target: str | None = None,
             namespace: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The pod to plan for: the one the Deployment named `target` (spec.targetRef) would
    create (the one in `namespace`, the tuning's, first), else a Pod, else the file's only
    Deployment's; and the problems that say why the webhook would not tune it so (another
    Deployment's, another namespace's, a Pod no Deployment owns)."""
    docs, source = _documents(path), source_name(path)
    deployments = [d for d in docs if d.get("kind") == "Deployment"]
    named = sorted((d for d in deployments if _name(d) == target),
                   key=lambda d: not _same_namespace(d, namespace))
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
        return _deployment_pod(chosen, source), _deployment_problems(chosen, target, namespace)
    problem = pod_problem(pod)
    if problem is not None:
        raise PlanInputError(f"{source}: Pod {_name(pod)}: {problem}")
    return pod, _pod_problems(pod, target, namespace)


def _deployment_problems(deployment: dict[str, Any], target: str | None,
                         namespace: str | None) -> list[str]:
    """Why the operator would not tune the pods of `deployment` (planned for all the same,
    and said, so that the preview is not read as what will happen)."""
    name = _name(deployment)
    if target is not None and name != target:
        return [f"Deployment {name} is not the tuning's target (spec.targetRef.name {target}): "
                "the operator never tunes its pods; planned as if it were"]
    if not _same_namespace(deployment, namespace):
        return [f"Deployment {name} is in namespace {_namespace(deployment)}, not the "
                f"tuning's {namespace}: spec.targetRef names a Deployment of the tuning's own "
                "namespace, so the operator never tunes this one's pods; planned as if it "
                "were"]
    return []


def _pod_problems(pod: dict[str, Any], target: str | None,
                  namespace: str | None) -> list[str]:
    """Why the webhook would admit `pod` unchanged: it tunes the pods a ReplicaSet of the
    target Deployment creates, in the tuning's namespace (controller/pods.py,
    `_deployment_of`)."""
    name, problems = _name(pod), []
    if not _same_namespace(pod, namespace):
        problems.append(f"Pod {name} is in namespace {_namespace(pod)}, not the tuning's "
                        f"{namespace}: the webhook tunes only pods of the tuning's namespace; "
                        "planned as if it were")
    meta = pod.get("metadata") or {}
    replicaset = controlling_replicaset(meta)
    if replicaset is None:
        problems.append(f"Pod {name} has no controlling ReplicaSet in "
                        "metadata.ownerReferences: the webhook tunes only the pods of a "
                        "Deployment (created by its ReplicaSet) and admits this one unchanged; "
                        "planned as if it were (or give the Deployment with --pod)")
        return problems
    deployment = deployment_by_hash(meta, replicaset)
    if deployment is not None and target is not None and deployment != target:
        problems.append(f"Pod {name} belongs to Deployment {deployment} (ReplicaSet "
                        f"{replicaset}), not the tuning's target (spec.targetRef.name "
                        f"{target}): the webhook admits it unchanged; planned as if it were")
    return problems


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


def _namespace(doc: dict[str, Any]) -> str | None:
    meta = doc.get("metadata")
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    return str(namespace) if namespace else None  # empty is unset, as kubectl takes it


def _same_namespace(doc: dict[str, Any], namespace: str | None) -> bool:
    """Whether `doc` is in `namespace` (manifests.same_namespace)."""
    return same_namespace(_namespace(doc), namespace)


def render(plan: PodPlan, *, as_json: bool) -> str:
    if as_json:
        return json.dumps({"revision": plan.revision, "refused": plan.refused,
                           "patch": plan.patch, "reasons": plan.reasons,
                           "problems": plan.problems}, indent=2) + "\n"
    lines = [f"revision {plan.revision}" + (" (refused: pod admitted unchanged)"
                                            if plan.refused else "")]
    # Escaped: they hold names from the files (a Deployment named with a newline and
    # terminal escapes printed a line of its own, "reason: all good").
    lines += [f"reason: {printable(r)}" for r in plan.reasons]
    lines += [f"problem: {printable(p)}" for p in plan.problems]
    lines += [f"patch: {json.dumps(op)}" for op in plan.patch]
    return "\n".join(lines) + "\n"


MIG_NOT_PLANNED = "the MIG layout is not planned yet"
"""How the planner's problem starts when spec.mig has no planned profile (tuning/pod_mig.py)."""


def plan_from_files(tuning_path: Path, pod_path: Path, launcher_image: str, *,
                    as_json: bool, static_cpu_manager: bool = True,
                    mig_profile: str | None = None, mig_strategy: str | None = None) -> str:
    """The webhook's plan for the pod in `pod_path`, as an operator run with
    `static_cpu_manager` (`run --no-static-cpu-manager`: False) would make it once the MIG
    layout gives the tuning's pods `mig_profile` (status.mig.profile; None: not planned) under
    `mig_strategy` (status.mig.strategy; None: spec.mig.strategy)."""
    tuning = load_tuning(tuning_path)
    target = tuning.spec.target_ref.name
    pod, problems = load_pod(pod_path, target, tuning.metadata.namespace)
    strategy = _mig_strategy(tuning, mig_strategy)
    context = PodContext(tuning_name=tuning.metadata.name, launcher_image=launcher_image,
                         static_cpu_manager=static_cpu_manager,
                         mig_profile=_mig_profile(tuning, mig_profile, strategy),
                         mig_strategy=strategy.value)
    plan = plan_pod_patch(tuning.spec, pod, context)
    if mig_profile is None:
        # The planner sends the webhook's reader to status.mig, which a file does not have.
        plan.problems[:] = [
            "spec.mig: the pod keeps its GPU request until the operator has planned the MIG "
            "layout (status.mig in the cluster), then the webhook asks for the planned "
            "profile's slice (nvidia.com/mig-<profile> under strategy mixed); --mig-profile "
            "PROFILE previews it"
            if p.startswith(MIG_NOT_PLANNED) else p for p in plan.problems]
    plan.problems[:0] = problems
    return render(plan, as_json=as_json)


def _mig_strategy(tuning: InferenceTuning, strategy: str | None) -> MigStrategy:
    """The strategy status.mig.strategy would say: the operator takes the selected nodes'
    nvidia.com/mig.strategy when they all carry the same one (controller/mig.py), which a file
    does not show; spec.mig.strategy where they carry none."""
    if strategy is not None:
        return MigStrategy(strategy)
    return MigStrategy.MIXED if tuning.spec.mig is None else tuning.spec.mig.strategy


def _mig_profile(tuning: InferenceTuning, profile: str | None,
                 strategy: MigStrategy) -> str | None:
    """--mig-profile checked against the tuning and the MIG catalog, as the layout planner
    could give it to the tuning's pods under `strategy`."""
    mig = tuning.spec.mig
    if profile is None:
        return None
    if mig is None:
        raise PlanInputError(f"--mig-profile {profile}: the tuning has no spec.mig, so its pods "
                             "get no MIG slice; leave --mig-profile out")
    known = {p.name for product in load_catalog().products for p in product.profiles}
    if profile not in known:
        raise PlanInputError(f"--mig-profile {profile!r}: no GPU in the MIG catalog has this "
                             "profile; give one as NVIDIA names it, for example 2g.35gb or "
                             "1g.18gb+me (`infertune mig profiles PRODUCT` lists a GPU's)")
    if mig.profile is not None and profile != mig.profile:
        raise PlanInputError(f"--mig-profile {profile}: spec.mig.profile is {mig.profile}, the "
                             "profile the operator gives the tuning's pods; give that one")
    if mig.layout and all(s.profile != profile for s in mig.layout):
        raise PlanInputError(f"--mig-profile {profile}: spec.mig.layout has no {profile}, and "
                             "the pods get a profile of the layout; give one of "
                             f"{', '.join(s.profile for s in mig.layout)}")
    _check_planned(profile, mig.model_copy(update={"strategy": strategy}))
    return profile


def _check_planned(profile: str, planned: MigSpec) -> None:
    """PlanInputError unless the layout planner gives the pods `profile` on some GPU that
    `planned` (spec.mig under the strategy assumed) can select."""
    strategy = planned.strategy
    given, infeasible = _planned_profiles(planned)
    if not given:
        # Said for the GPUs that have the profile asked for: the others' reasons are theirs.
        having = [reason for product, reason in infeasible.items()
                  if _has_profile(product, profile)]
        raise PlanInputError(f"--mig-profile {profile}: spec.mig cannot be planned under "
                             f"strategy {strategy.value} on any GPU {_products_text(planned)}, "
                             "so the operator gives the pods no MIG slice: "
                             + "; ".join(having or infeasible.values()))
    if profile not in given:
        choices = ", ".join(f"{p} ({', '.join(products)})"
                            for p, products in sorted(given.items()))
        request = request_from_spec(planned)
        why = "" if not isinstance(request, MemoryRequest) else (
            f" (spec.mig.sizing: the model needs {gib(request.need_bytes)}, and the pods get "
            "the smallest profile without media extensions that holds it)")
        raise PlanInputError(f"--mig-profile {profile}: the layout planner gives this tuning's "
                             f"pods {choices} under strategy {strategy.value}, never "
                             f"{profile}{why}; give "
                             + ("that profile" if len(given) == 1 else "one of those"))


def _planned_profiles(mig: MigSpec) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The profile the layout planner gives the pods on each GPU that spec.mig can select
    (profile -> products), as the operator plans status.mig.profile per product
    (controller/mig.py, `_plans`), and why it gives none on the others (product -> reason)."""
    catalog = load_catalog()
    named = mig.node_selector.get(PRODUCT_LABEL)
    products = [named] if named is not None else [p.product for p in catalog.products]
    request = request_from_spec(mig)
    given: dict[str, list[str]] = {}
    infeasible: dict[str, str] = {}
    for product in products:
        result = plan_layout(product, request, catalog)
        if isinstance(result, Infeasible):
            infeasible[product] = result.reason
        else:
            given.setdefault(result.pod_profile, []).append(result.product)
    return given, infeasible


def _has_profile(product: str, profile: str) -> bool:
    found = load_catalog().lookup(product)
    return isinstance(found, MigProduct) and found.profile(profile) is not None


def _products_text(mig: MigSpec) -> str:
    named = mig.node_selector.get(PRODUCT_LABEL)
    if named is None:
        return "of the MIG catalog"
    return f"spec.mig.nodeSelector allows ({PRODUCT_LABEL}: {named})"
