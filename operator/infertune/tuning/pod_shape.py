"""The pod the planner reads: built from a Deployment's template, and checked for the types of
what the planner reads from it, so a malformed manifest is named instead of failing inside."""

from __future__ import annotations

from typing import Any

from infertune.api.units import parse_quantity


def controlling_replicaset(meta: dict[str, Any]) -> str | None:
    """The name of the ReplicaSet that controls a pod (its controller ownerReference), if
    any: the webhook tunes only the pods a Deployment's ReplicaSet creates."""
    refs = meta.get("ownerReferences")
    owner = next((ref for ref in (refs if isinstance(refs, list) else [])
                  if isinstance(ref, dict) and ref.get("kind") == "ReplicaSet"
                  and ref.get("controller")), None)
    return None if owner is None else str(owner.get("name"))


def deployment_by_hash(meta: dict[str, Any], replicaset: str) -> str | None:
    """The Deployment a pod's ReplicaSet belongs to, by name: the Deployment controller names
    ReplicaSets <deployment>-<pod-template-hash>, and the pod carries that hash. None when
    the names do not say."""
    template_hash = (meta.get("labels") or {}).get("pod-template-hash")
    if template_hash and replicaset.endswith(f"-{template_hash}"):
        return replicaset[: -len(template_hash) - 1]
    return None


def pod_from_deployment(deployment: dict[str, Any]) -> dict[str, Any]:
    """The pod a Deployment's template would create, as the webhook would see it."""
    template = (deployment.get("spec") or {}).get("template") or {}
    meta = dict(template.get("metadata") or {})
    meta.setdefault("namespace", (deployment.get("metadata") or {}).get("namespace", "default"))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": template.get("spec") or {}}


def template_problem(deployment: dict[str, Any]) -> str | None:
    """What in a Deployment's pod template has a type the planner cannot read (`pod_problem`),
    checked before `pod_from_deployment`; None when it can be planned for."""
    if not isinstance(deployment.get("metadata") or {}, dict):
        return "metadata must be a mapping"
    spec = deployment.get("spec") or {}
    template = spec.get("template") if isinstance(spec, dict) else None
    if not isinstance(template, dict):
        return "spec.template must be a mapping"
    return pod_problem(template, "spec.template.")


def pod_problem(node: dict[str, Any], prefix: str = "") -> str | None:
    """What the planner reads from a pod (or a pod template, with `prefix`), checked for its
    type: a field of the wrong kind is named instead of failing inside the planner."""
    for key in ("metadata", "spec"):
        if not _absent_or(node.get(key), dict):
            return f"{prefix}{key} must be a mapping"
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    for key in ("labels", "annotations"):
        if not _absent_or(meta.get(key), dict):
            return f"{prefix}metadata.{key} must be a mapping"
    for key in ("containers", "initContainers", "volumes", "resourceClaims"):
        items = spec.get(key)
        if not _absent_or(items, list) or not all(isinstance(i, dict) for i in items or []):
            return f"{prefix}spec.{key} must be a list of mappings"
    for key in ("nodeSelector", "os", "securityContext", "resources"):
        if not _absent_or(spec.get(key), dict):
            return f"{prefix}spec.{key} must be a mapping"
    containers = [(f"{prefix}spec.{kind}[{i}]", container)
                  for kind in ("containers", "initContainers")
                  for i, container in enumerate(spec.get(kind) or [])]
    for where, container in containers:
        for key in ("resources", "securityContext", "env", "envFrom", "command", "args",
                    "volumeMounts", "volumeDevices"):
            value = container.get(key)
            wanted = dict if key in ("resources", "securityContext") else list
            if not _absent_or(value, wanted):
                return f"{where}.{key} must be {'a mapping' if wanted is dict else 'a list'}"
        for key in ("env", "envFrom", "volumeMounts", "volumeDevices"):
            if not all(isinstance(item, dict) for item in container.get(key) or []):
                return f"{where}.{key} must be a list of mappings"
        for key in ("command", "args"):
            # As the API server takes them. A list in there (YAML aliases nest them
            # cheaply: 9^9 items in a few lines) took a minute and all the memory to print.
            for j, item in enumerate(container.get(key) or []):
                if not isinstance(item, str):
                    return (f"{where}.{key}[{j}] must be a string (quote a number: the API "
                            "server takes only strings there)")
        resources = container.get("resources") or {}
        for key in ("limits", "requests"):
            amounts = resources.get(key)
            if not _absent_or(amounts, dict):
                return f"{where}.resources.{key} must be a mapping"
            for name, amount in (amounts or {}).items():
                try:
                    parse_quantity(str(amount))
                except ValueError as exc:
                    return f"{where}.resources.{key}.{name}: {exc}"
    return None


def _absent_or(value: Any, kind: type) -> bool:
    """Whether `value` is left out (None) or of `kind`: a falsy value of another type (0, "",
    []) is no more a mapping than 1 is, and it failed inside the planner."""
    return value is None or isinstance(value, kind)
