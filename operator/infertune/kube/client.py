"""The one Kubernetes client wrapper: configuration and the reads the controller needs."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError
from urllib3.util.retry import Retry

from infertune import __version__
from infertune.scaling.state import stored_time

POOL_SIZE = 32
API_TIMEOUT_S = (10.0, 60.0)
"""(connect, read) timeout of every Kubernetes API call the operator makes itself that does not
set its own (kopf's calls have kopf's timeouts, the Lease and webhook calls shorter ones).
Without one, the client waits for ever: a connection the API server's side dropped without a
word (a control-plane node replaced, a load balancer's idle timeout) held the worker thread of
that call for good, and with it the tuning's loop, and the autoscaling workers one by one. The
read timeout is the API server's own default --request-timeout (1 minute): it answers every
request it still works on by then, so only a call nobody will answer is cut."""
class _ReadsOnlyAfterAnError(Retry):
    """urllib3's Retry, except that after an error it classes as neither a connect nor a
    read error (a TLS error, before or after the request went out) only reads are sent
    again: its default sends any request again then."""

    def increment(self, method: str | None = None, url: str | None = None,
                  response: Any = None, error: Exception | None = None,
                  _pool: Any = None, _stacktrace: Any = None) -> _ReadsOnlyAfterAnError:
        if (error is not None and not self._is_connection_error(error)
                and not self._is_read_error(error)
                and (method is None or not self._is_method_retryable(method))):
            # As urllib3 says that it will not try again (other=0 did the same for every
            # method): the client turns a bare SSLError into a status-0 ApiException.
            raise MaxRetryError(_pool, url, error) from error
        return super().increment(method, url, response, error, _pool, _stacktrace)


RETRIES = _ReadsOnlyAfterAnError(total=3, allowed_methods=frozenset({"GET", "HEAD"}))
"""What the client sends again: any request that never went out (a refused connection, a
connect timeout), and a read whose answer timed out or was cut, or whose TLS handshake
failed (an API server or load balancer restarting). Never a write that may have reached the
API server: urllib3's default sends any request again after an error it does not class as a
connect or read error (a TLS error on the answer), and a PUT or DELETE after a read error. A
write that had landed then went out twice and its second copy was refused as a conflict
(the scale patch's test of the replicas, a Lease's resourceVersion): the operator took its
own write for another writer's."""


def bounded_retries(timeout_s: float) -> Retry:
    """RETRIES for a command that bounds each request by `timeout_s` (`autoscale evaluate
    --live`): nothing sent again after an error (a read that timed out cost four timeouts),
    and once after the API server's "wait and send it again" (429 or 503 with Retry-After,
    API Priority and Fairness), waiting at most `timeout_s`; the answer of a second one is
    the request's (an ApiException with its status, not "cannot be reached")."""

    class Bounded(_ReadsOnlyAfterAnError):
        def get_retry_after(self, response: Any) -> float | None:
            after = super().get_retry_after(response)
            return None if after is None else min(after, timeout_s)

    return Bounded(total=3, connect=0, read=0, other=0, status=1, raise_on_status=False,
                   allowed_methods=RETRIES.allowed_methods)


USER_AGENT = f"infertune/{__version__}"
FIELD_MANAGER = "infertune"
"""The manager of the operator's writes in managedFields (the user agent up to the "/")."""
OWN_SCALE_WRITE = (FIELD_MANAGER, "scale")
"""How the Deployment's managedFields name the operator's replicas writes."""


def kubeconfig_missing(kubeconfig: str) -> bool:
    """Whether no file of --kubeconfig exists, as the client reads it: a list of paths
    (os.pathsep), each with ~ expanded."""
    return not any(os.path.exists(os.path.expanduser(path))
                   for path in kubeconfig.split(os.pathsep))


def configure(kubeconfig: str | None, retries: Retry = RETRIES) -> None:
    """Load credentials: the given kubeconfig, else in-cluster, else $KUBECONFIG/~/.kube.

    Then one ApiClient is made the default that every `client.XxxApi()` uses. Without it, the
    client (v32 and later) builds a new ApiClient, with a new connection pool, for each API
    object, so every call of the operator paid a TLS handshake with the API server: at 1000
    tunings that was a fifth of the operator's CPU (bench/results/operator.md). Its calls time
    out (API_TIMEOUT_S) unless they set their own timeout, and a write that may have gone
    out is never sent again (RETRIES; `retries` in its place: a command that bounds each
    request by its own timeout sends none again).
    """
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        else:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except config.ConfigException:
                config.load_kube_config()  # type: ignore[no-untyped-call]
    except OSError as exc:
        raise config.ConfigException(unreadable(exc, kubeconfig)) from None
    shared = client.Configuration.get_default_copy()
    # Enough pooled connections for every thread that calls the API at once (the autoscaling
    # workers and kopf's executor): a full pool drops connections and reconnects over TLS.
    shared.connection_pool_maxsize = POOL_SIZE
    shared.retries = retries
    api = _TimedApiClient(shared)
    # The API server names the field manager of every write after the user agent: the
    # Deployment's managedFields then say that infertune set its replicas (subresource
    # scale), where they said OpenAPI-Generator, as for any script using this client.
    api.user_agent = USER_AGENT
    client.ApiClient.set_default(api)  # type: ignore[no-untyped-call]


def unreadable(exc: OSError, path: str | None = None) -> str:
    """A file that cannot be read, in words: the file (the one the error names, else `path`)
    and the system's reason. Python's own, "[Errno 13] Permission denied: '/home/me/kc'",
    was printed as the reason a kubeconfig could not be used."""
    name = exc.filename if exc.filename is not None else path
    reason = exc.strerror or type(exc).__name__
    reason = reason[:1].lower() + reason[1:]  # within a sentence
    return f"the file {name} cannot be read: {reason}" if name else f"cannot be read: {reason}"


class _TimedApiClient(client.ApiClient):
    """The shared ApiClient, with API_TIMEOUT_S on every call that sets no timeout."""

    def call_api(self, method: Any, url: Any, header_params: Any = None, body: Any = None,
                 post_params: Any = None, _request_timeout: Any = None) -> Any:
        return super().call_api(method, url, header_params, body, post_params,
                                 API_TIMEOUT_S if _request_timeout is None else _request_timeout)


def api_server_url() -> str:
    """The API server the loaded configuration talks to."""
    return str(client.Configuration.get_default_copy().host)


REACH_ATTEMPTS = 12
"""Tries of `check_api_server` on a server that does not answer, REACH_PAUSE_S apart: about
the minute kopf itself kept trying (an API server restarting in a control-plane upgrade, a
node whose network comes up after the pod)."""
REACH_PAUSE_S = 5.0
REACH_TIMEOUT_S = 5.0
"""The connect and read timeouts of each try of check_api_server."""

_log = logging.getLogger(__name__)


def check_api_server(attempts: int | None = None, pause_s: float | None = None) -> None:
    """One read of the API server with the loaded credentials (its version), before the
    operator starts: an unreachable server or credentials it refuses ended `infertune run` in
    a minute of kopf's retries and tracebacks, with kopf's advice to install an API client
    library. SystemExit with a line naming the server and the problem: credentials refused
    (401), a certificate not trusted, or no answer after `attempts` tries. Any other answer
    means that the server is there: what it says is kopf's to meet (a 403 where /version is
    not public, a 5xx while it restarts)."""
    server = api_server_url()
    attempts = REACH_ATTEMPTS if attempts is None else attempts
    pause_s = REACH_PAUSE_S if pause_s is None else pause_s
    # The client's own tries of each read would each log a warning first: the lines below
    # say it once.
    pool_log = logging.getLogger("urllib3.connectionpool")
    level = pool_log.level
    pool_log.setLevel(logging.ERROR)
    try:
        _reach(server, attempts, pause_s)
    finally:
        pool_log.setLevel(level)


def _reach(server: str, attempts: int, pause_s: float) -> None:
    """check_api_server's tries, within (attempts - 1) x pause_s and one try's timeout: each
    try is sent once (the shared client's RETRIES sent a read that timed out three more
    times, and a server that takes connections and never answers held the start for five
    minutes; the liveness probe killed the operator before it said why)."""
    shared = client.Configuration.get_default_copy()
    shared.retries = bounded_retries(REACH_TIMEOUT_S)
    with client.ApiClient(shared) as api:
        _tries(server, client.VersionApi(api), attempts, pause_s)


def _tries(server: str, versions: Any, attempts: int, pause_s: float) -> None:
    """_reach's tries of `versions` (a VersionApi)."""
    why = ""
    started, budget, tried = time.monotonic(), (attempts - 1) * pause_s, 0
    for attempt in range(attempts):
        tried += 1
        try:
            # Not decoded: a proxy's page, or a /version missing a field, is an answer too.
            answer = versions.get_code(_request_timeout=(REACH_TIMEOUT_S, REACH_TIMEOUT_S),
                                       _preload_content=False)
            close = getattr(answer, "close", None)  # the body is not read: not pooled again
            if callable(close):
                close()
            return
        except ApiException as exc:
            if exc.status == 401:
                raise SystemExit(
                    f"the API server at {server} refused the credentials (401 {exc.reason}: "
                    f"{server_message(exc)[:200]}): the kubeconfig's user (or the "
                    "ServiceAccount token) is not valid there, expired or for another "
                    "cluster; log in again or pass another --kubeconfig") from None
            if exc.status != 0:
                if exc.status >= 500:
                    _log.warning("the API server at %s answered %s %s; starting, and trying "
                                 "again as usual", server, exc.status, exc.reason)
                return
            why = str(exc.reason or exc)
        except (MaxRetryError, OSError, ValueError) as exc:
            why = str(getattr(exc, "reason", None) or exc)
        if "CERTIFICATE_VERIFY_FAILED" in why or "certificate verify failed" in why:
            raise SystemExit(
                f"the API server at {server} has a certificate the kubeconfig's CA does not "
                f"trust ({why[:300]}): check the cluster's certificate-authority data, or that "
                "the server is the cluster's") from None
        if attempt == 0 and attempts > 1:
            _log.warning("the API server at %s does not answer (%s); trying again for %.0f s",
                         server, why[:300], (attempts - 1) * pause_s)
        if attempt + 1 < attempts:
            if pause_s > 0 and time.monotonic() - started + pause_s > budget + REACH_TIMEOUT_S:
                break  # the tries took their timeouts: the time said is up
            time.sleep(pause_s)
    raise SystemExit(f"the API server at {server} cannot be reached ({why[:300]}) after "
                     f"{tried} tries in {time.monotonic() - started:.0f} s: check the cluster "
                     "of the kubeconfig (or the network to it), and that the API server runs")


def route_source(url: str, family: int = socket.AF_UNSPEC) -> str | None:
    """This machine's own address on the route to the host of `url` (in address `family`):
    the address that host most likely reaches this machine at. Nothing is sent (a UDP socket
    is only connected); None when the host cannot be resolved or routed to in that family."""
    parts = urlsplit(url)
    if not parts.hostname:
        return None
    try:
        port = parts.port or 443
        family, kind, proto, _, address = socket.getaddrinfo(
            parts.hostname, port, family=family, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0])
    except (OSError, ValueError):
        return None


def listen_family(address: str) -> int:
    """The address family a listen address binds (asyncio binds :: as IPv6 only)."""
    try:
        return socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    except ValueError:
        return socket.AF_UNSPEC


def unspecified(address: str) -> bool:
    """A wildcard listen address (0.0.0.0, ::): it accepts calls, but cannot be called."""
    try:
        return ipaddress.ip_address(address).is_unspecified
    except ValueError:
        return False  # a host name


def server_message(exc: ApiException) -> str:
    """The API server's own words for a refusal (a Status message), else its reason."""
    try:
        message = json.loads(exc.body or "").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or exc.reason or exc.status)


def read_deployment(namespace: str, name: str) -> client.V1Deployment | None:
    """The Deployment, or None when it does not exist."""
    try:
        return client.AppsV1Api().read_namespaced_deployment(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


class DeploymentReplicas(NamedTuple):
    """What the autoscaler reads of its target Deployment (`deployment_replicas`)."""

    replicas: int
    """spec.replicas."""
    ready: int
    """status.readyReplicas."""
    pod_spec: dict[str, Any]
    """spec.template.spec: what the pods run (batching mode Auto reads the knob there)."""
    replicas_by: tuple[tuple[str, str], ...] = ()
    """(manager, subresource) of each writer that owns spec.replicas now (managedFields):
    ("infertune", "scale") when the operator's scale write is the last word on them."""
    rolled_out: bool = True
    """Whether every pod of the Deployment runs its current template: the Deployment
    controller has seen the template (status.observedGeneration) and counts each of its pods
    as updated (status.updatedReplicas is status.replicas)."""
    created: float | None = None
    """metadata.creationTimestamp (seconds since the epoch), None when not read: a
    Deployment deleted and created again under the same name is another object."""


def replicas_owners(body: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The managedFields entries of a Deployment `body` that own spec.replicas, as (manager,
    subresource): the API server moves a field to whoever last changed it."""
    owners = []
    for entry in (body.get("metadata") or {}).get("managedFields") or ():
        fields = (entry.get("fieldsV1") or {}) if isinstance(entry, Mapping) else {}
        if "f:replicas" in (fields.get("f:spec") or {}):
            owners.append((str(entry.get("manager") or ""),
                           str(entry.get("subresource") or "")))
    return tuple(owners)


def read_json(read: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
    """What the client call `read(*args, **kwargs)` reads, as JSON (plain dicts, the form kopf
    gives objects; the client's models cost a millisecond or more to build for a large one),
    None when it does not exist (404)."""
    try:
        response = read(*args, _preload_content=False, **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    body: dict[str, Any] = json.loads(response.data)
    return body


def deployment_replicas(namespace: str, name: str,
                        timeout_s: float | None = None) -> DeploymentReplicas:
    """The replicas, ready count and pod template of a Deployment, from one read (its scale
    subresource has no ready count). Read as JSON: the client's models cost about a
    millisecond to build for a whole Deployment, and the autoscaler reads one per
    evaluation. `timeout_s`: of the request, API_TIMEOUT_S when None."""
    response: Any = client.AppsV1Api().read_namespaced_deployment(
        name, namespace, _preload_content=False, _request_timeout=timeout_s)
    body = json.loads(response.data)
    spec, status = body.get("spec") or {}, body.get("status") or {}
    meta = body.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    rolled_out = (int(status.get("observedGeneration") or 0) >= generation
                  and int(status.get("updatedReplicas") or 0) == int(status.get("replicas") or 0))
    return DeploymentReplicas(int(spec.get("replicas") or 0),
                              int(status.get("readyReplicas") or 0),
                              dict((spec.get("template") or {}).get("spec") or {}),
                              replicas_owners(body), rolled_out,
                              stored_time(meta.get("creationTimestamp")))


def connection_info() -> dict[str, Any]:
    """The loaded credentials in the shape of kopf.ConnectionInfo, so kopf and this client
    always talk to the same server as the same user.

    The token is read through the client's `get_api_key_with_prefix`, which runs its refresh
    hook (in a pod the ServiceAccount token is re-read from its file as the kubelet rotates
    it; an exec plugin's is fetched again), and split into scheme and token as kopf's own
    login does: in a pod the client holds it as "bearer <token>", in lower case, and taken
    for a bare token it went out as "Bearer bearer <token>", which the API server refused,
    so the chart's operator could not log in at all."""
    cfg = client.Configuration.get_default_copy()
    header = (cfg.get_api_key_with_prefix("BearerToken")
              or cfg.get_api_key_with_prefix("authorization"))
    scheme, token = None, None
    if header:
        parts = str(header).split(" ", 1)
        scheme, token = (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return {
        "server": cfg.host,
        "ca_path": cfg.ssl_ca_cert,
        "insecure": not cfg.verify_ssl,
        "scheme": scheme,
        "token": token,
        "certificate_path": cfg.cert_file,
        "private_key_path": cfg.key_file,
    }


def evict_pod(namespace: str, name: str, uid: str | None = None) -> bool:
    """Evict through the Eviction API, so PodDisruptionBudgets apply. False when a budget
    refuses it now (429); a pod that is already gone counts as evicted, and so does one whose
    namespace is being deleted (the API server refuses any eviction there, 403, and the pod
    goes with its namespace): that refusal failed the whole MIG or re-tuning pass.

    With `uid`, only that pod is evicted: a pod of the same name made again since it was seen
    (a StatefulSet's, perhaps on another node) is left alone, and the one meant counts as
    gone (409). The API server checks the uid after it has counted the eviction against the
    budget of the pod it found, so such a pod may lose a disruption for the budget's
    DisruptedPods time (about 2 minutes); the pods are those the pass saw a moment before,
    so the window is small, and reading each first would cost a call and `get` on pods."""
    options = None if uid is None else client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid=uid))
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                             delete_options=options)
    try:
        client.CoreV1Api().create_namespaced_pod_eviction(name, namespace, body)
    except ApiException as exc:
        if exc.status == 429:
            return False
        if exc.status == 403 and "NamespaceTerminating" in str(exc.body or ""):
            return True
        if exc.status == 409 and uid is not None:
            return True
        if exc.status != 404:
            raise
    return True
