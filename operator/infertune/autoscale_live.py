"""What `infertune autoscale evaluate --live` reads from the cluster: what the operator itself
reads before it decides. That is the tuning (spec and status, where the windows and a replica
fight are stored), the Deployment's replicas and ready count, and whether an HPA also scales
it. Nothing is written.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple, cast

from infertune.api.spec import InferenceTuning, Mode
from infertune.controller.fights import (
    Fight,
    Writers,
    autoscaling_rivals,
    blocked_by,
    is_revert,
    next_fight,
    quiet_hold,
    writer_of,
    written_replicas,
)
from infertune.controller.scaling_report import Blocked
from infertune.tuning.pod_patch import (
    TemplateBatching,
    template_batching,
    unprobed_container,
)


class Live(NamedTuple):
    tuning: InferenceTuning
    replicas: int
    """Of the target, its spec.replicas."""
    status: dict[str, Any]
    generation: int
    hpa: str | None
    """An HPA on the same Deployment, which stops the operator's writes."""
    notes: tuple[str, ...] = ()
    """What could not be read and is therefore not taken into account."""
    rivals: tuple[str, ...] = ()
    """Other InferenceTunings that autoscale the same Deployment (they stop the writes)."""
    ready: int | None = None
    """Of the target, its status.readyReplicas (a latency breach is sized on the replicas
    known to serve)."""
    template: TemplateBatching | None = None
    """The batching knob on the target's pod template (batching starts from it)."""
    unprobed: str | None = None
    """The serving container when it has no readiness or startup probe (its pods' Ready
    then says only that they started: pod_patch.unprobed_container)."""
    own_write_last: bool = False
    """The Deployment's managedFields say the operator's scale write set its replicas last
    (kube.client.OWN_SCALE_WRITE)."""
    created: float | None = None
    """The Deployment's creationTimestamp (fights.recreated)."""
    writer: str | None = None
    """Who set its replicas, as its managedFields say (fights.writer_of)."""

    def fight(self, current: int, now: float) -> Fight | None:
        """The replica fight as the operator's evaluation now would see it: the stored one,
        counting a revert as the operator counts one (fights.is_revert), and ended by a spec
        change or a quiet time (fights.next_fight)."""
        spec = self.tuning.spec
        autoscaling = self.status.get("autoscaling") or {}
        written = written_replicas(self.status, spec.target_ref.name, self.created)
        writes = (spec.autoscaling is not None and spec.autoscaling.enabled
                  and spec.mode is Mode.ENFORCE)
        return next_fight(Fight.from_json(autoscaling.get("replicaFight")), self.generation,
                          is_revert(written, current, writes, self.own_write_last), now,
                          quiet_hold(spec), self.writer)

    def blocked(self, current: int, now: float) -> Blocked | None:
        """Why the operator would not write replicas now, as it decides it."""
        return blocked_by(self.tuning.spec.target_ref.name, Writers(self.hpa, self.rivals),
                          self.fight(current, now), now)


def namespace_problem(text: str) -> str | None:
    """Why `text` is no namespace name, None when it is one."""
    from infertune.api.spec import is_dns_label

    if is_dns_label(text):
        return None
    return (f"{text!r} is not a namespace name (a-z, 0-9 and '-', at most 63, starting and "
            "ending with a letter or digit)")


def split_ref(ref: str) -> tuple[str, str]:
    """(namespace, name) of --live's NAMESPACE/NAME, or ValueError saying what is wrong with
    it. Both go into the request's path: `..` there reached another resource."""
    from infertune.api.spec import is_dns_subdomain

    namespace, slash, name = ref.partition("/")
    if not (slash and namespace and name) or "/" in name:
        raise ValueError(f"--live {ref!r}: expected NAMESPACE/NAME, for example serving/qwen")
    if (problem := namespace_problem(namespace)) is not None:
        raise ValueError(f"--live {ref!r}: {problem}")
    if not is_dns_subdomain(name):
        raise ValueError(f"--live {ref!r}: {name!r} is not an object name (a-z, 0-9, '-' and "
                         "'.', at most 253, starting and ending with a letter or digit)")
    return namespace, name


def _status_of(exc: Any) -> dict[str, Any] | None:
    """The Kubernetes Status an API error's body holds, None when it holds none (another
    server's error page)."""
    try:
        body = json.loads(getattr(exc, "body", None) or "")
    except (TypeError, ValueError):
        return None
    return body if isinstance(body, dict) and body.get("kind") == "Status" else None


def _not_stored_shape(body: dict[str, Any]) -> str | None:
    """What in a tuning answered by the server the CRD's schema would never let it hold, of
    what the evaluation reads besides the spec and metadata (validated before); None when
    nothing.
    A status "hello" was said in Python's words ("dictionary update sequence element #0 has
    length 1; 2 is required"), a number as a TypeError's traceback."""
    status = body.get("status")
    if status is not None and not isinstance(status, dict):
        return "status is no object"
    autoscaling = (status or {}).get("autoscaling")
    if autoscaling is not None and not isinstance(autoscaling, dict):
        return "status.autoscaling is no object"
    generation = body["metadata"].get("generation")  # a mapping: validated before
    if generation is not None and (isinstance(generation, bool)
                                   or not isinstance(generation, int)):
        return "metadata.generation is no integer"
    return None


def read_live(ref: str, kubeconfig: str | None, timeout_s: float | None = None) -> Live:
    """The tuning NAMESPACE/NAME and what its evaluation reads; ValueError says what is
    missing, or that the cluster cannot be reached. `timeout_s`: of each request (the
    client's API_TIMEOUT_S when None)."""
    import yaml
    from urllib3.exceptions import HTTPError

    try:
        return _read_live(ref, kubeconfig, timeout_s)
    except yaml.YAMLError as exc:
        raise ValueError(f"--live: the kubeconfig is not valid YAML "
                         f"({str(exc).splitlines()[0]}); check --kubeconfig") from None
    except UnicodeDecodeError:
        raise ValueError("--live: the kubeconfig is not UTF-8 text; check --kubeconfig "
                         "(a kubeconfig is a YAML file)") from None
    except HTTPError as exc:
        reason = str(getattr(exc, "reason", "") or type(exc).__name__)[:200]
        raise ValueError(f"--live: the cluster cannot be reached ({reason}); check --kubeconfig "
                         "and that the API server is up") from None


def _read_live(ref: str, kubeconfig: str | None, timeout_s: float | None = None) -> Live:
    import binascii

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException

    from infertune.api.errors import validate_stored
    from infertune.api.scaling import MOST_REPLICAS
    from infertune.api.spec import GROUP, KIND, PLURAL, VERSION
    from infertune.kube.client import (
        OWN_SCALE_WRITE,
        RETRIES,
        api_server_url,
        bounded_retries,
        configure,
        deployment_replicas,
        kubeconfig_missing,
    )

    namespace, name = split_ref(ref)
    try:
        configure(kubeconfig, RETRIES if timeout_s is None else bounded_retries(timeout_s))
    except (ConfigException, OSError) as exc:
        if kubeconfig is None:
            raise ValueError(f"--live: no cluster credentials ({exc}); pass --kubeconfig"
                             ) from None
        # It was passed: "pass --kubeconfig" sent the user to what they had done.
        why = "no such file" if kubeconfig_missing(kubeconfig) else str(exc)[:300]
        raise ValueError(f"--live: --kubeconfig {kubeconfig}: {why}; give a kubeconfig file "
                         "this user can read") from None
    except UnicodeDecodeError:
        raise  # said by read_live
    except (TypeError, AttributeError, LookupError, ValueError) as exc:
        # YAML, but not a kubeconfig (binascii.Error: base64 of a certificate that is not)
        said = (f"base64 data in it does not decode: {exc}" if isinstance(exc, binascii.Error)
                else f"{type(exc).__name__}: {str(exc)[:200]}")
        raise ValueError(f"--live: the kubeconfig is not one ({said}); check "
                         "--kubeconfig") from None
    what = f"InferenceTuning {namespace}/{name}"

    def not_an_api_server(read: str) -> ValueError:
        return ValueError(f"--live: the server at {api_server_url()} did not answer as a "
                          f"Kubernetes API server ({read}); check the server in the "
                          "kubeconfig (--kubeconfig)")

    try:
        answer: object = client.CustomObjectsApi().get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, _request_timeout=timeout_s)
        if not (isinstance(answer, dict) and answer.get("kind") == KIND
                and answer.get("apiVersion") == f"{GROUP}/{VERSION}"):
            # A 200 from something else at that address (a web page, a proxy's login form):
            # validated, it read as a tuning whose metadata was missing.
            raise ValueError(f"--live: the server at {api_server_url()} did not answer as a "
                             f"Kubernetes API server (no {KIND} object in its answer for "
                             f"{namespace}/{name}); check the server in the kubeconfig "
                             "(--kubeconfig)")
        body = cast(dict[str, Any], answer)
        tuning, problems = validate_stored(body)
        if tuning is None:
            raise ValueError(f"--live: the InferenceTuning's spec ({namespace}/{name}) does not "
                             f"validate: {problems}")
        if (shape := _not_stored_shape(body)) is not None:
            raise not_an_api_server(f"{what}, whose {shape}")
        target = tuning.spec.target_ref.name
        what = f"Deployment {namespace}/{target} (spec.targetRef)"
        try:
            read = deployment_replicas(namespace, target, timeout_s)
        except (ValueError, AttributeError, LookupError, TypeError):
            # JSON (or UTF-8) that is not, or JSON that is no Deployment: a 200 from
            # something else
            raise not_an_api_server(what) from None
        if not all(0 <= count <= MOST_REPLICAS for count in (read.replicas, read.ready)):
            # Its thousands of digits were printed as the current replicas, and the reason's.
            raise not_an_api_server(f"{what}, whose replicas are no 32-bit count")
    except ApiException as exc:
        status = _status_of(exc)
        if exc.status == 404 and status is None:
            # A 404 page of another server (Prometheus, a web server) at that address: read
            # as "not found", it sent the user looking for an object, not at the kubeconfig.
            raise not_an_api_server(f"HTTP 404 without a Kubernetes Status for {what}") \
                from None
        named = ((status or {}).get("details") or {}).get("name")  # the object's, not a path's
        found = ("not found" if exc.status == 404 and named else
                 f"not found, nor its kind: the API server serves no {PLURAL}.{GROUP} (is the "
                 "CRD installed?)" if exc.status == 404 else
                 "not read: the API server is throttling requests (HTTP 429); try again in a "
                 "moment" if exc.status == 429 else f"not readable (HTTP {exc.status})")
        raise ValueError(f"--live: {what} {found}") from None
    hpa: str | None = None
    notes: tuple[str, ...] = ()
    try:
        hpa = next((str(h.metadata.name) for h in client.AutoscalingV2Api()
                    .list_namespaced_horizontal_pod_autoscaler(
                        namespace, _request_timeout=timeout_s).items
                    if h.metadata and h.spec.scale_target_ref.kind == "Deployment"
                    and h.spec.scale_target_ref.name == target), None)
    except ApiException as exc:
        notes = (f"HorizontalPodAutoscalers in {namespace} not readable (HTTP {exc.status}): "
                 "one on the same Deployment would stop the operator's writes",)
    except (ValueError, AttributeError, LookupError, TypeError):
        raise not_an_api_server(f"HorizontalPodAutoscalers in {namespace}") from None
    try:
        listed = cast(dict[str, Any], client.CustomObjectsApi().list_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, _request_timeout=timeout_s))["items"]
        rivals = autoscaling_rivals((t for t in listed if ((t.get("spec") or {}).get(
            "targetRef") or {}).get("name") == target), name)
    except ApiException as exc:
        rivals = ()
        notes += (f"InferenceTunings in {namespace} not readable (HTTP {exc.status}): another "
                  "one autoscaling the same Deployment would stop the operator's writes",)
    except (ValueError, AttributeError, LookupError, TypeError):
        raise not_an_api_server(f"InferenceTunings in {namespace}") from None
    return Live(tuning, read.replicas, dict(body.get("status") or {}),
                int((body.get("metadata") or {}).get("generation") or 0), hpa, notes, rivals,
                read.ready, template_batching(tuning.spec, read.pod_spec, read.rolled_out),
                unprobed_container(tuning.spec, read.pod_spec),
                read.replicas_by == (OWN_SCALE_WRITE,), read.created,
                writer_of(read.replicas_by))
