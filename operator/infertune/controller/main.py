"""`infertune run`: start kopf with the handlers of this package."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import errno
import gc
import ipaddress
import logging
import os
import socket
import ssl
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import kopf
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from kubernetes.client.exceptions import ApiException

from infertune.api.spec import is_dns_label, is_dns_subdomain
from infertune.controller.crd_check import CrdCheck, post_event, read_installed
from infertune.kube.client import (
    api_server_url,
    check_api_server,
    configure,
    kubeconfig_missing,
    listen_family,
    route_source,
    unspecified,
)
from infertune.kube.lease import (
    ALWAYS,
    DEFAULT_LEASE_NAME,
    Leader,
    LeaseElection,
    describe_failure,
)
from infertune.kube.webhook_tls import write_self_signed
from infertune.kube.webhooks import RegisteringWebhookServer, WebhookRegistration, is_pattern
from infertune.tuning.pod_mig import MIG_OFF_ENV

if TYPE_CHECKING:  # imported where the handlers are registered (register_handlers)
    from infertune.controller.autoscaling import AutoscalingSettings

DEFAULT_NAMESPACE = "infertune-system"
WEBHOOK_CERT_DAYS = 3650
"""Validity of the self-signed webhook certificate: it is made once, at start, and never
renewed while the process runs (kopf serves the same file), so a year's certificate left an
operator pod that ran longer serving an expired one, and every pod was admitted untuned. It
is made again at every start; use webhook.certSecret (cert-manager) for rotation."""
logger = logging.getLogger(__name__)


def _webhook_server(args: argparse.Namespace, own_namespace: str, cleanup: ExitStack,
                    loaded: asyncio.Event | None = None,
                    leads: Callable[[], bool] | None = None) -> RegisteringWebhookServer:
    """The webhook server; a self-signed certificate made for it (no --webhook-cert) is written
    to a private directory that `cleanup` removes when the operator stops, so no run leaves a
    private key behind in the temporary directory."""
    service = webhook_service(args.webhook_service)
    host = _webhook_host(args, service is not None)
    if args.webhook_cert and args.webhook_key:
        cert, key = Path(args.webhook_cert), Path(args.webhook_key)  # cert-manager's files
        if service is None and not args.webhook_host and (
                problem := certificate_name_problem(cert, host)) is not None:
            # The address found for this machine is what the API server calls: checked as
            # --webhook-host is (check_webhook_options), or every call failed on the name and
            # every pod was admitted untuned while the operator reported Ready.
            raise SystemExit(f"--webhook-cert: {problem} (the address found for the webhook, "
                             "--webhook-host not given: give --webhook-host with a name the "
                             "certificate holds)")
    elif args.webhook_cert or args.webhook_key:
        raise SystemExit("--webhook-cert and --webhook-key go together")
    else:
        hosts = [host, "localhost"]
        if service is not None:
            dns = f"{service[1]}.{service[0]}.svc"
            hosts += [dns, f"{dns}.cluster.local"]
        tls_dir = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="infertune-tls-"))
        cert, key = write_self_signed(Path(tls_dir), hosts, days=WEBHOOK_CERT_DAYS)
    return RegisteringWebhookServer(
        registration=WebhookRegistration(excluded_namespaces=excluded_namespaces(own_namespace),
                                         included_namespaces=tuple(args.namespaces or ()),
                                         service=service, owned_by=args.webhook_owner),
        addr=args.webhook_addr, port=args.webhook_port, host=host,
        certfile=cert, pkeyfile=key, cafile=args.webhook_ca or cert,
        # The files are read again at each check, as the registration is: kopf serves a
        # certificate cert-manager renewed (and registers its CA) once it sees them change.
        file_check_interval=args.webhook_check_interval,
        check_s=args.webhook_check_interval, ready_file=args.ready_file, loaded=loaded,
        leads=leads,
    )


def excluded_namespaces(own_namespace: str) -> tuple[str, ...]:
    """The namespaces whose pods the webhook is never sent: the system's and the operator's
    own (the registration leaves them out, and re-tuning replaces none of their pods)."""
    return ("kube-system", own_namespace)


def webhook_service(value: str | None) -> tuple[str, str, int] | None:
    """--webhook-service NAMESPACE/NAME:PORT, the Service in front of the operator (the chart
    creates it), or SystemExit naming what is wrong with it."""
    if not value:
        return None
    ref, _, port = value.partition(":")
    ns, _, name = ref.partition("/")
    if not (ns and name and port.isdigit()):
        raise SystemExit("--webhook-service: expected NAMESPACE/NAME:PORT, for example "
                         "infertune-system/infertune-webhook:443")
    if not 1 <= int(port) <= 65535:
        raise SystemExit(f"--webhook-service: port {port} is not from 1 to 65535")
    for what, label in (("namespace", ns), ("Service name", name)):
        if not is_dns_label(label):
            raise SystemExit(f"--webhook-service: {what} {label!r} is not a DNS label "
                             "(lower-case letters, digits and '-', at most 63 characters)")
    return ns, name, int(port)


def check_webhook_options(args: argparse.Namespace) -> None:
    """What goes into the webhook registration and its certificate, checked before anything
    starts: refused by the API server, it stopped the operator with a traceback after it had
    started; some was accepted and left every pod untuned without a word."""
    service = webhook_service(args.webhook_service)
    for name in args.namespaces or []:
        # Names go into the registration's namespaceSelector; kopf patterns do not.
        if not is_pattern(name) and not is_dns_label(name):
            raise SystemExit(f"--namespace: {name!r} is not a namespace name (lower-case "
                             "letters, digits and '-', at most 63 characters), nor a kopf "
                             "pattern")
    own = args.operator_namespace or os.environ.get("INFERTUNE_NAMESPACE", DEFAULT_NAMESPACE)
    if not is_dns_label(own):  # excluded by name in the selector: no pattern
        raise SystemExit(f"--operator-namespace (or $INFERTUNE_NAMESPACE): {own!r} is not a "
                         "namespace name (lower-case letters, digits and '-', at most 63 "
                         "characters)")
    if bool(args.webhook_cert) != bool(args.webhook_key):
        # Said here, before anything talks to the cluster: it was said after the API server
        # check, the Lease and the CRD check (some 55 s against one not reachable yet).
        raise SystemExit("--webhook-cert and --webhook-key go together: give both (a "
                         "certificate and its key), or neither (one is generated)")
    if getattr(args, "no_mig", False):
        ignored = [option for option, given in (
            ("--mig-drain-other-namespaces", getattr(args, "mig_drain_other_namespaces", False)),
            ("--mig-config-delay", getattr(args, "mig_config_delay", None) is not None)) if given]
        if ignored:
            # Taken, and then nothing read them: MIG is off.
            raise SystemExit(f"{' and '.join(ignored)} {'has' if len(ignored) == 1 else 'have'} "
                             "no effect with --no-mig (MIG partitioning off): drop "
                             f"{'it' if len(ignored) == 1 else 'them'}, or --no-mig")
    if args.webhook_ca and not (args.webhook_cert and args.webhook_key):
        raise SystemExit("--webhook-ca is the CA of --webhook-cert: give it with "
                         "--webhook-cert and --webhook-key, or drop it (a generated "
                         "certificate is its own CA; the API server would not trust it)")
    host = args.webhook_host
    if host:
        if args.webhook_service:
            # It was dropped without a word: the Service is what the API server calls.
            raise SystemExit("--webhook-host is the address of a webhook the API server calls "
                             "by URL, and --webhook-service has it call the Service; give one")
        if host.startswith("[") or host.endswith("]"):
            raise SystemExit(f"--webhook-host: give an IPv6 address without brackets "
                             f"({host} -> {host.strip('[]')})")
        if ":" in host and not _is_ip(host):
            raise SystemExit(f"--webhook-host: {host!r} is not a host name or IP address; the "
                             "port is --webhook-port")
        if any(c.isspace() or c in "/?#@" for c in host):
            # The API server refused the registration (a 422 dump, after kopf had started).
            raise SystemExit(f"--webhook-host: {host!r} is not a host name or IP address")
    try:
        socket.getaddrinfo(str(args.webhook_addr), None, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        # kopf's bind failed with a traceback (socket.gaierror).
        raise SystemExit(f"--webhook-addr: {args.webhook_addr!r} is not an address to listen "
                         "on (0.0.0.0 or :: for every one)") from None
    for option, path in (("--webhook-cert", args.webhook_cert), ("--webhook-key", args.webhook_key),
                         ("--webhook-ca", args.webhook_ca)):
        if path and not os.access(path, os.R_OK):
            raise SystemExit(f"{option}: {path} cannot be read")
    if args.webhook_cert and args.webhook_key:
        _check_certificate(args.webhook_cert, args.webhook_key, args.webhook_ca)
        # The name the API server checks the certificate against: the Service's, or the host
        # of the URL (kopf finds one itself when --webhook-host is not given).
        called = (f"{service[1]}.{service[0]}.svc" if service is not None
                  else args.webhook_host)
        problem = None if called is None else certificate_name_problem(
            Path(args.webhook_cert), called)
        if problem is not None:
            raise SystemExit(f"--webhook-cert: {problem}")
    if not 0 <= args.webhook_port <= 65535:
        raise SystemExit(f"--webhook-port: {args.webhook_port} is not from 0 (any free port) "
                         "to 65535")
    if _liveness_port(getattr(args, "liveness", None)) == args.webhook_port:
        # kopf binds the probe first; the webhook's bind then failed after the start, with a
        # traceback.
        raise SystemExit(f"--webhook-port: {args.webhook_port} is the port of --liveness; "
                         "give each its own")
    taken = _port_taken(args.webhook_addr, args.webhook_port)
    if taken is not None:
        raise SystemExit(f"--webhook-port: {args.webhook_addr} port {args.webhook_port} is in "
                         f"use ({taken}); another infertune run there? kopf's server shares "
                         "a port silently (SO_REUSEPORT), and the API server's calls would be "
                         "split between the two")


def _liveness_port(url: str | None) -> int | None:
    """The port of --liveness as kopf reads it (80 when it names none); None without one, or
    for one that does not parse (_check_liveness says what is wrong with it)."""
    if not url:
        return None
    try:
        return urlsplit(url).port or 80
    except ValueError:
        return None


def _check_liveness(url: str) -> None:
    """--liveness as kopf serves it (http://ADDRESS:PORT/PATH): a wrong one stopped the
    operator with kopf's traceback ("Unsupported scheme", "Port out of range", a port in use)
    after it had started."""
    example = "for example http://0.0.0.0:8080/healthz"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise SystemExit(f"--liveness: {url!r}: {exc}; {example}") from None
    if parts.scheme != "http":
        raise SystemExit(f"--liveness: {url!r} must start with http:// (kopf serves the "
                         f"probe without TLS); {example}")
    # As kopf reads it: no host is localhost, no port 80.
    host, port = parts.hostname or "localhost", 80 if port is None else port
    if port == 0:
        raise SystemExit(f"--liveness: {url!r} needs a port from 1 to 65535; {example}")
    try:
        socket.getaddrinfo(host, port, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        raise SystemExit(f"--liveness: {url!r} names no address to listen on; "
                         f"{example}") from None
    taken = _port_taken(host, port)
    if taken is not None:
        raise SystemExit(f"--liveness: {host} port {port} is in use ({taken})")


def check_metrics_options(args: argparse.Namespace) -> None:
    """--metrics-port and --metrics-addr, checked before anything starts: a port in use
    stopped the operator with a traceback from the metrics server's thread."""
    if args.metrics_port is None:
        if args.metrics_addr != "0.0.0.0":
            raise SystemExit("--metrics-addr needs --metrics-port: without it nothing is "
                             "served")
        return
    if not 1 <= args.metrics_port <= 65535:
        raise SystemExit(f"--metrics-port: {args.metrics_port} is not from 1 to 65535")
    if args.metrics_port == args.webhook_port:
        raise SystemExit(f"--metrics-port: {args.metrics_port} is the webhook's port "
                         "(--webhook-port); give each its own")
    if _liveness_port(args.liveness) == args.metrics_port:
        raise SystemExit(f"--metrics-port: {args.metrics_port} is the port of --liveness; "
                         "give each its own")
    try:
        socket.getaddrinfo(args.metrics_addr, args.metrics_port, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        raise SystemExit(f"--metrics-addr: {args.metrics_addr!r} is not an address to listen "
                         "on") from None
    taken = _port_taken(args.metrics_addr, args.metrics_port)
    if taken is not None:
        raise SystemExit(f"--metrics-port: {args.metrics_addr} port {args.metrics_port} is in "
                         f"use ({taken})")


def _serve_metrics(args: argparse.Namespace, scaling: AutoscalingSettings,
                   crds: CrdCheck | None = None) -> None:
    """The operator's metrics (controller/exported.py) with the process's own (CPU, memory,
    the garbage collector), from a thread of the Prometheus client."""
    from prometheus_client import (
        GCCollector,
        PlatformCollector,
        ProcessCollector,
        start_http_server,
    )
    from prometheus_client.registry import CollectorRegistry

    from infertune.controller.crd_check import CrdCollector
    from infertune.controller.exported import AutoscalerCollector

    registry = CollectorRegistry()  # its own: the process-wide one holds one set at most
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(AutoscalerCollector(scaling.exported, scaling.counts,
                                          scaling.leader.leads))
    if crds is not None:
        registry.register(CrdCollector(crds))
    try:
        start_http_server(args.metrics_port, args.metrics_addr, registry=registry)
    except OSError as exc:
        # The check before could not see all of it (another process listening on the same
        # port of the other address family, where "::" takes both).
        raise SystemExit(f"--metrics-port: cannot listen on {args.metrics_addr} port "
                         f"{args.metrics_port}: {exc.strerror or exc}") from None
    logger.info("metrics served at http://%s:%d/metrics", args.metrics_addr, args.metrics_port)


def _check_certificate(cert: str, key: str, ca: str | None) -> None:
    """--webhook-cert and --webhook-key load as a certificate and its key, and --webhook-ca
    (when given) issued the certificate: a CA that did not (or an empty file) was registered,
    the API server trusted no answer, and every pod was admitted untuned while the operator
    reported Ready."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, ValueError) as exc:
        raise SystemExit(f"--webhook-cert/--webhook-key: {cert} and {key} are not a PEM "
                         f"certificate and its private key ({exc})") from None
    chain = x509.load_pem_x509_certificates(Path(cert).read_bytes())
    served, now = chain[0], dt.datetime.now(dt.UTC)
    if not served.not_valid_before_utc <= now < served.not_valid_after_utc:
        # The API server refuses it: every pod admitted untuned while the operator said
        # Ready (a hand-made Secret renewed by nobody).
        raise SystemExit(f"--webhook-cert: {cert} is valid from "
                         f"{served.not_valid_before_utc:%Y-%m-%d %H:%M} to "
                         f"{served.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, not now; renew it "
                         "(cert-manager renews its certificates), or leave --webhook-cert out "
                         "for the operator's own")
    if ca is None:
        return
    try:
        authorities = x509.load_pem_x509_certificates(Path(ca).read_bytes())
    except ValueError:
        authorities = []
    if not authorities:
        raise SystemExit(f"--webhook-ca: {ca} holds no PEM certificate")
    for issued in chain:  # the certificate, then any intermediates it comes with
        for authority in authorities:
            if issued == authority:
                return
            try:
                issued.verify_directly_issued_by(authority)
            except (ValueError, TypeError, InvalidSignature):
                continue
            return
    raise SystemExit(f"--webhook-ca: no certificate in {ca} issued {cert}: the API server "
                     "would trust none of the webhook's answers, and every pod would be "
                     "admitted untuned; give the CA of the certificate (cert-manager: the "
                     "Secret's ca.crt)")


def _unmapped(address: ipaddress.IPv4Address | ipaddress.IPv6Address
              ) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """`address`, an IPv4-mapped IPv6 address as its IPv4 one."""
    mapped = getattr(address, "ipv4_mapped", None)
    return address if mapped is None else mapped


def certificate_name_problem(cert: Path, host: str) -> str | None:
    """Why the API server, calling `host`, would refuse the certificate in `cert` for its
    names, None when it would not: Go checks the subject alternative names only (not the
    common name), a wildcard for one DNS label. Trusted by its CA but for another name (a
    cert-manager Certificate without the Service's dnsNames), every call failed, and every pod
    was admitted untuned while the operator reported Ready."""
    certificate = x509.load_pem_x509_certificates(cert.read_bytes())[0]
    try:
        names = certificate.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        names = x509.SubjectAlternativeName([])
    # Only the host loses a trailing dot: Go refuses a name written with one in the
    # certificate.
    dns = [n.lower() for n in names.get_values_for_type(x509.DNSName)]
    ips = names.get_values_for_type(x509.IPAddress)
    wanted = host.lower().rstrip(".")
    try:
        address = ipaddress.ip_address(wanted.strip("[]"))
    except ValueError:
        address = None
    # As Go's net.IP.Equal: an IPv4 address and its IPv4-mapped IPv6 form (::ffff:a.b.c.d)
    # are the same address.
    if address is not None and _unmapped(address) in {
            _unmapped(ip) for ip in ips
            if isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address)}:
        return None
    if address is None and any(
            name == wanted or (name.startswith("*.") and "." in wanted
                               and wanted.split(".", 1)[1] == name[2:])
            for name in dns):
        return None
    shown = [f"::ffff:{ip.ipv4_mapped}" if isinstance(ip, ipaddress.IPv6Address)
             and ip.ipv4_mapped is not None else str(ip) for ip in ips]
    held = ", ".join([*dns, *shown]) or "no subject alternative name"
    entry = "a dnsNames entry" if address is None else "an ipAddresses entry"
    return (f"{cert} is for {held}, not {host}, the name the API server calls the webhook "
            f"by: it would refuse every call, and pods would be admitted untuned; issue it "
            f"for {host} (cert-manager: {entry})")


def _port_taken(addr: str, port: int) -> str | None:
    """Why the webhook cannot have the port to itself, or None: a plain bind (without
    SO_REUSEPORT, which kopf's server sets) fails where another process listens. Every
    address kopf would bind is tried as it binds it (IPv6 only on IPv6, as asyncio does);
    anything but "address in use" is left for kopf to report."""
    try:
        addresses = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
    except OSError:
        return None
    for family, kind, proto, _, sockaddr in addresses:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is free
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return exc.strerror or "address in use"
    return None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _webhook_host(args: argparse.Namespace, through_service: bool) -> str:
    """The host the API server is told to call the webhook at (in its URL, and in the
    self-signed certificate): --webhook-host; else the listen address, unless it is a
    wildcard such as the default 0.0.0.0, which cannot be called; then this machine's address
    on its route to the API server. Logged, since a wrong one leaves pods untuned (the
    webhook fails open)."""
    if args.webhook_host:
        return str(args.webhook_host)
    addr = str(args.webhook_addr)
    if through_service or not unspecified(addr):
        return addr
    server = api_server_url()
    # In the family the webhook listens in: an IPv6 route for a 0.0.0.0 listener would be
    # registered where nothing answers.
    family = listen_family(addr)
    host = route_source(server, family) or ("::1" if family == socket.AF_INET6 else "127.0.0.1")
    logger.info(f"the webhook will be registered at https://{host}:{args.webhook_port}, this "
                f"machine's address towards the API server ({server}); if the API server "
                "reaches it at another address (a cluster in containers or VMs, NAT), set "
                "--webhook-host")
    return host


def _check_lease_name(args: argparse.Namespace) -> None:
    lease = args.leader_elect_lease
    if lease is None:
        return
    if not args.leader_elect:
        raise SystemExit("--leader-elect-lease names the Lease of --leader-elect; add "
                         "--leader-elect, or drop --leader-elect-lease")
    if not is_dns_subdomain(lease):
        raise SystemExit(f"--leader-elect-lease: {lease!r} is not a Kubernetes object name "
                         "(lower-case letters, digits, '-' and '.', starting and ending with "
                         "a letter or digit, at most 253 characters)")


def _elect(args: argparse.Namespace, own_namespace: str) -> LeaseElection:
    """The Lease election, with one round before kopf starts, so that a lone operator leads
    from its first autoscaling slot. Refused permissions stop the operator here: it would
    run, and serve the webhook, but never autoscale, re-tune or partition. Other failures
    (the API server not reachable yet) are retried, and logged, by the election's thread."""
    election = LeaseElection(own_namespace, args.leader_elect_lease or DEFAULT_LEASE_NAME)
    try:
        election.try_once()
    except ApiException as exc:
        if exc.status == 403:
            raise SystemExit(f"--leader-elect: {election.where}: "
                             f"{describe_failure(exc, election)}") from None
    except Exception:
        pass  # the thread's first round, right away, logs it
    election.start()  # says whether it leads, and who does if not
    return election


def register_handlers(mig: bool = True) -> ModuleType | None:
    """Import the controller modules, which registers their kopf handlers, indexes and
    daemons; the MIG controller (returned) only with `mig`: without it (--no-mig) nothing
    watches every namespace's pods or patches nodes, and tunings with spec.mig say so."""
    if not mig:
        os.environ[MIG_OFF_ENV] = "off"  # read by the webhook and the controller's messages
    from infertune.controller import admission, autoscaling, handlers, pods  # noqa: F401

    if not mig:
        return None
    from infertune.controller import mig as module

    return module


GC_THRESHOLDS = (50_000, 10, 10)
"""The garbage collector's thresholds in the operator process (CPython 3.11's are 700, 10, 10).
An autoscaling cycle over 1000 tunings leaves ~16,000 more container objects alive at its peak
than at its start (the fetched signals, the new statuses before the old ones are dropped), so
at 700 every cycle ran ~65 young collections and ~6 middle ones, and every other cycle a full
one: 13-21 ms of its CPU (bench/results/autoscale.md measures it, against these thresholds).
At 50,000 a cycle of 1000 tunings runs about one young collection in five. Only objects in
reference cycles are freed later (everything else goes with its last reference): one that
dies young waits for up to 50,000 net allocations, one that was still alive at a young
collection for a middle or full one, which now come ~70 times less often. So memory held by
dropped cycles (kopf's and the clients' futures, exceptions and tracebacks) can stay longer:
bench/results/operator.md records the whole process's resident memory with them. (CPython
3.14's incremental collector reads only the first two numbers.)"""


def prepare_garbage_collector() -> None:
    """Move what is loaded by now (modules, API models and their schemas, the Kubernetes
    client) out of the garbage collector's reach: it lives as long as the process, and a full
    collection would otherwise walk all of it again, pausing an autoscaling cycle over a
    thousand tunings for tens of milliseconds. Then set GC_THRESHOLDS."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _configure(kubeconfig: str | None) -> None:
    """`configure`, with what is wrong with the credentials said instead of a traceback."""
    import yaml
    from kubernetes.config import ConfigException

    try:
        configure(kubeconfig)
    except (ConfigException, OSError, UnicodeDecodeError, yaml.YAMLError, TypeError,
            AttributeError, LookupError, ValueError) as exc:
        # The client's own errors, and what it raises on a file that is YAML but no
        # kubeconfig (a string, a list: TypeError, AttributeError, KeyError).
        why = (str(exc).splitlines() or [""])[0][:300] or type(exc).__name__
        if isinstance(exc, UnicodeDecodeError):
            why = "not UTF-8 text (a kubeconfig is a YAML file)"
        elif isinstance(exc, yaml.YAMLError):
            why = f"not valid YAML ({why})"
        elif not isinstance(exc, ConfigException | OSError):
            why = f"not a kubeconfig ({type(exc).__name__}: {why})"
        if kubeconfig is None:
            raise SystemExit(f"no cluster credentials: not in a cluster, and $KUBECONFIG or "
                             f"~/.kube/config cannot be used ({why}); pass --kubeconfig") from None
        if kubeconfig_missing(kubeconfig):
            why = "no such file"
        raise SystemExit(f"--kubeconfig {kubeconfig}: {why}; give a kubeconfig file this user "
                         "can read") from None


def run_operator(args: argparse.Namespace) -> int:
    if args.ready_file is not None:
        # First: one left by a container that crashed (the pod's /tmp outlives it) made the
        # restarted one Ready through its startup, the first leader-election round included.
        args.ready_file.unlink(missing_ok=True)
    # kopf's formatter, prefixed: its per-object lines name the object ("[ns/name] ...").
    kopf.configure(verbose=args.verbose, log_prefix=True)
    if not args.verbose:
        # One access-log line per admission request would cost every pod start a write.
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    from infertune.metrics.access import (
        NO_ACCESS_OPTIONS,
        PROMETHEUS_URL_ENV,
        AccessError,
        access_from_args,
    )
    from infertune.metrics.prometheus import PrometheusSource

    prometheus = args.prometheus_url or os.environ.get(PROMETHEUS_URL_ENV)
    try:  # checked before anything starts
        access = access_from_args(args)
        if prometheus is None and access != NO_ACCESS_OPTIONS:
            raise SystemExit("the --prometheus-* access options need --prometheus-url (or "
                             "$INFERTUNE_PROMETHEUS_URL): without it nothing is queried")
        source = PrometheusSource(prometheus, access=access,
                                  templates=not args.no_promql_templates) if prometheus else None
    except AccessError as exc:
        raise SystemExit(str(exc)) from None
    except ValueError as exc:
        raise SystemExit(f"--prometheus-url (or $INFERTUNE_PROMETHEUS_URL): {exc}") from None
    _check_lease_name(args)
    check_webhook_options(args)
    if args.liveness:
        _check_liveness(args.liveness)
    check_metrics_options(args)
    if source is None:
        logger.warning("no --prometheus-url (or $INFERTUNE_PROMETHEUS_URL): spec.autoscaling is "
                       "not evaluated, and tunings that have it report ScalingActive=False "
                       "(NoPrometheus); the rest of tuning works")
    _configure(args.kubeconfig)
    check_api_server()
    if args.retune_interval is not None:
        os.environ["INFERTUNE_RETUNE_INTERVAL"] = str(args.retune_interval)
    mig = register_handlers(mig=not args.no_mig)
    from infertune.controller import autoscaling, handlers, pods

    own_namespace = args.operator_namespace or os.environ.get("INFERTUNE_NAMESPACE",
                                                              DEFAULT_NAMESPACE)
    namespaces = args.namespaces or []
    with ExitStack() as cleanup:
        leader: Leader = _elect(args, own_namespace) if args.leader_elect else ALWAYS
        scaling = autoscaling.AutoscalingSettings(source=source, leader=leader)
        # At once (in its own thread: a slow API server does not hold the start), then every
        # minute.
        crds = CrdCheck(read_installed, post_event, leader.leads,
                        *([] if args.crd_check_interval is None else [args.crd_check_interval]))
        crds.start()
        cleanup.callback(crds.stop)
        if isinstance(leader, LeaseElection):
            # Unwound after kopf has stopped the loops: their evaluations in flight finish,
            # and only then is the Lease handed to the next operator.
            cleanup.callback(leader.stop)
            cleanup.callback(scaling.executor.shutdown, wait=True)
        pod_tuning = pods.PodTuningSettings(
            launcher_image=args.launcher_image,
            static_cpu_manager=not args.no_static_cpu_manager,
            excluded_namespaces=excluded_namespaces(own_namespace))
        memo = kopf.Memo(
            pod_tuning=pod_tuning,
            # Ready once registered, and once the indexes are loaded or this process leads
            # (kube/webhooks.RegisteringWebhookServer.loaded).
            webhook_server=_webhook_server(args, own_namespace, cleanup, pod_tuning.listed,
                                           leader.leads),
            mig=None if mig is None else mig.MigSettings.watching(
                own_namespace, namespaces, *([] if args.mig_config_delay is None
                                             else [args.mig_config_delay]),
                drain_other_namespaces=args.mig_drain_other_namespaces),
            autoscaling=scaling,
            leader=leader,
        )
        if args.metrics_port is not None:
            _serve_metrics(args, scaling, crds)
        prepare_garbage_collector()
        kopf.run(
            standalone=args.standalone,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=args.liveness,
            memo=memo,
        )
    del handlers
    return 0
