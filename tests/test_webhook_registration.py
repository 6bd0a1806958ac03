"""The pod webhook's registration: which namespaces' pods the API server sends to the operator."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ReadTimeoutError

from infertune.controller import pods
from infertune.kube.webhook_tls import write_self_signed
from infertune.kube.webhooks import OPT_OUT_LABEL, WebhookRegistration, bundle_with

KOPF = {"url": "https://10.0.0.5:9443", "caBundle": "Q0E="}


def selector(registration: WebhookRegistration) -> list[dict[str, Any]]:
    expressions: list[dict[str, Any]] = registration.body(KOPF)["webhooks"][0][
        "namespaceSelector"]["matchExpressions"]
    return expressions


def test_a_cluster_wide_operator_sees_every_namespace_but_the_excluded() -> None:
    registration = WebhookRegistration(excluded_namespaces=("kube-system", "infertune-system",
                                                            "kube-system"))
    assert selector(registration) == [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                       "values": ["infertune-system", "kube-system"]}]


def test_a_namespaced_operator_is_sent_only_its_namespaces_pods() -> None:
    registration = WebhookRegistration(excluded_namespaces=("kube-system", "infertune-system"),
                                       included_namespaces=("team-b", "team-a", "team-b"))
    assert selector(registration) == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
         "values": ["infertune-system", "kube-system"]},
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]},
    ]


@pytest.mark.parametrize("pattern", ["team-*", "team-?", "!team-test", "team-*,!team-test",
                                     "team-[ab]"])
def test_kopf_patterns_fall_back_to_every_namespace(pattern: str) -> None:
    """A selector cannot express a glob: matching the pattern as a name would send the
    operator no pods at all, so its namespaces' pods would silently go untuned."""
    registration = WebhookRegistration(excluded_namespaces=("kube-system",),
                                       included_namespaces=("team-a", pattern))
    assert [e["operator"] for e in selector(registration)] == ["NotIn"]


def test_the_rest_of_the_registration_fails_safe() -> None:
    webhook = WebhookRegistration(excluded_namespaces=("kube-system",),
                                  included_namespaces=("team-a",)).body(KOPF)["webhooks"][0]
    assert webhook["failurePolicy"] == "Ignore"
    # What an operator that hangs adds to every pod creation; the admission's wait for the
    # indexes (pods.INDEX_WAIT_S) must fit inside it.
    assert webhook["timeoutSeconds"] == 5
    assert webhook["timeoutSeconds"] > pods.INDEX_WAIT_S
    assert webhook["objectSelector"]["matchExpressions"] == [
        {"key": OPT_OUT_LABEL, "operator": "NotIn", "values": ["disabled"]}]
    assert webhook["clientConfig"] == {"caBundle": "Q0E=",
                                       "url": "https://10.0.0.5:9443/tune-pods"}


def _ca(tmp: Path, days: int) -> tuple[str, x509.Certificate]:
    cert_path, _ = write_self_signed(tmp, ["infertune-webhook.infertune-system.svc"], days=days)
    pem = cert_path.read_bytes()
    return base64.b64encode(pem).decode(), x509.load_pem_x509_certificate(pem)


def _held(bundle: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(base64.b64decode(bundle))


def test_a_new_ca_bundle_keeps_the_newest_other_cas_that_have_not_expired(
        tmp_path: Path) -> None:
    """The operator pod a rolling upgrade replaces still answers for a few seconds with its
    own certificate: its CA stays trusted next to the new one. Also when the new pod crashes
    and starts again (a CA each time) or two upgrades follow each other: with one other CA
    kept, a dead process's pushed out the serving one's. OTHER_CAS at most."""
    first, first_cert = _ca(tmp_path / "1", 10)
    second, second_cert = _ca(tmp_path / "2", 10)
    third, third_cert = _ca(tmp_path / "3", 10)
    assert _held(bundle_with(second, first)) == [second_cert, first_cert]
    both = bundle_with(second, first)
    # The serving first one stays after the second crashed and started again as the third.
    three = bundle_with(third, both)
    assert _held(three) == [third_cert, second_cert, first_cert]
    # And after ten starts of a new pod in a crash loop (with three kept, the fourth pushed
    # the serving one out); the eleventh does.
    bundle, certs = three, [third_cert, second_cert, first_cert]
    for n in range(4, 12):
        ca, cert = _ca(tmp_path / str(n), 10)
        bundle, certs = bundle_with(ca, bundle), [cert, *certs]
    assert _held(bundle) == certs and certs[-1] == first_cert and len(certs) == 11
    ca, cert = _ca(tmp_path / "12", 10)
    assert _held(bundle_with(ca, bundle)) == [cert, *certs[:10]]  # the newest OTHER_CAS
    assert bundle_with(second, second) == second  # the same CA again
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=11)
    assert bundle_with(second, first, now=later) == second  # expired: dropped
    assert bundle_with(second, base64.b64encode(b"edited by hand").decode()) == second


class _Failing:
    """A registration whose apply fails as the API server may."""

    name = "infertune-pod-tuning"

    def __init__(self, error: Exception) -> None:
        self.error, self.calls = error, 0

    def apply(self, config: dict[str, Any], keep_owner: bool = False) -> None:
        self.calls += 1
        raise self.error


def _server(registration: Any) -> Any:
    from infertune.kube.webhooks import RegisteringWebhookServer

    return RegisteringWebhookServer(registration=registration, check_s=0.01)


@pytest.mark.parametrize("error", [ApiException(status=503, reason="Service Unavailable"),
                                   ApiException(status=429, reason="Too Many Requests"),
                                   ReadTimeoutError(None, "/apis", "read timed out")])
def test_a_registration_the_api_server_may_get_over_is_tried_again_not_fatal(
        error: Exception) -> None:
    """Raised, it ended kopf's webhook server, and with it the whole operator (also when
    cert-manager rotated the certificate mid-life)."""
    registration = _Failing(error)

    async def scenario() -> bool:
        server = _server(registration)
        registered = await server.register({"url": "https://10.0.0.5:9443", "caBundle": "Q0E="})
        keeper = asyncio.create_task(server._keep({"url": "https://10.0.0.5:9443"}, registered))
        for _ in range(500):  # until tried again twice (a loaded machine is slow to get there)
            if registration.calls > 2 or keeper.done():
                break
            await asyncio.sleep(0.01)
        keeper.cancel()
        return registered

    assert asyncio.run(scenario()) is False
    assert registration.calls > 2  # tried again at the checks


class _Flaky:
    """Refused with a 503 `failures` times, then registered; `present` is what the API
    server holds."""

    name = "infertune-pod-tuning"

    def __init__(self, failures: int) -> None:
        self.failures, self.present = failures, False

    def apply(self, config: dict[str, Any], keep_owner: bool = False) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ApiException(status=503, reason="Service Unavailable")
        self.present = True

    def still_registered(self, config: dict[str, Any]) -> bool:
        return self.present

    def serves(self, config: dict[str, Any]) -> bool:
        return self.present


def test_the_ready_file_exists_only_while_this_process_is_registered(tmp_path: Path) -> None:
    """kopf listens before the registration is made: Ready on the port alone (the chart's
    probe was a TCP check), the pod took the Service's calls before the API server trusted
    its certificate, or while its registration failed, and the old pod stopped."""
    from infertune.kube.webhooks import RegisteringWebhookServer

    ready = tmp_path / "ready"
    ready.touch()  # left by a container that crashed: the pod's /tmp outlives it
    registration = _Flaky(failures=1)

    async def scenario() -> list[bool]:
        server = RegisteringWebhookServer(registration=registration, check_s=0.01,
                                          ready_file=ready)
        seen = [ready.exists()]
        seen.append(await server.register({"url": "x"}))
        seen.append(ready.exists())  # the first attempt failed: not ready
        keeper = asyncio.create_task(server._keep({"url": "x"}, False))

        async def until(ok: Callable[[], bool]) -> None:  # a loaded machine is slow
            for _ in range(500):
                if ok():
                    return
                await asyncio.sleep(0.01)

        await until(ready.exists)  # the next check registers
        seen.append(ready.exists())
        registration.present, registration.failures = False, 1000  # removed, and refused
        await until(lambda: not ready.exists())
        seen.append(ready.exists())
        keeper.cancel()
        return seen

    assert asyncio.run(scenario()) == [False, False, False, True, False]


def test_the_ready_file_waits_for_the_indexes_to_load_while_another_leads(
        tmp_path: Path) -> None:
    """kopf runs no handler or loop before its indexes hold their first listing (minutes in
    a cluster of thousands of pods): Ready once registered, the new pod of a rolling upgrade
    let the old one (which leads) stop, and autoscaling, re-tuning and MIG stopped with it."""
    from infertune.kube.webhooks import RegisteringWebhookServer

    ready = tmp_path / "ready"

    async def scenario() -> list[bool]:
        loaded = asyncio.Event()
        server = RegisteringWebhookServer(registration=_Flaky(failures=0), check_s=0.01,
                                          ready_file=ready, loaded=loaded,
                                          leads=lambda: False)
        waiter = asyncio.create_task(server._ready_once_loaded(loaded))
        seen = [await server.register({"url": "x"}), ready.exists()]
        loaded.set()
        await waiter
        seen.append(ready.exists())
        server._mark_ready(False)  # deregistered: not ready, loaded or not
        seen.append(ready.exists())
        return seen

    assert asyncio.run(scenario()) == [True, False, True, False]

    async def never_loaded() -> bool:  # a cluster without nodes: Ready after the longest wait
        loaded = asyncio.Event()
        server = RegisteringWebhookServer(registration=_Flaky(failures=0), check_s=0.01,
                                          ready_file=ready, loaded=loaded,
                                          leads=lambda: False)
        await server.register({"url": "x"})
        before = ready.exists()
        await server._ready_once_loaded(loaded, longest_s=0.01)
        return not before and ready.exists()

    assert asyncio.run(never_loaded())


def test_a_process_that_leads_is_ready_once_registered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no other operator running (the only pod restarted, so it takes the Lease), or
    without an election, waiting for the indexes left the webhook without an endpoint for
    as long as they loaded: every pod created meanwhile was admitted untuned."""
    from infertune.kube import webhooks
    from infertune.kube.webhooks import RegisteringWebhookServer

    monkeypatch.setattr(webhooks, "LEADS_POLL_S", 0.01)
    ready = tmp_path / "ready"

    async def scenario() -> list[bool]:
        leading = [False]
        loaded = asyncio.Event()
        server = RegisteringWebhookServer(registration=_Flaky(failures=0), check_s=0.01,
                                          ready_file=ready, loaded=loaded,
                                          leads=lambda: leading[0])
        waiter = asyncio.create_task(server._ready_once_loaded(loaded))
        seen = [await server.register({"url": "x"}), ready.exists()]
        leading[0] = True  # the old pod stopped (or never was): the Lease is this one's
        await asyncio.wait_for(waiter, 5)
        seen.append(ready.exists())
        alone = RegisteringWebhookServer(registration=_Flaky(failures=0), check_s=0.01,
                                         ready_file=tmp_path / "alone", loaded=asyncio.Event())
        seen += [await alone.register({"url": "x"}), (tmp_path / "alone").exists()]
        return seen

    assert asyncio.run(scenario()) == [True, False, True, True, True]


def test_a_failed_registration_again_keeps_a_registration_that_still_serves(
        tmp_path: Path) -> None:
    """cert-manager's renewal restarts kopf's server, which registers again: a 429 then made
    the pod not Ready although the registration in place (the same CA) still served it, and
    the Service lost its only endpoint until the next check, 30 s later."""
    from infertune.kube.webhooks import RegisteringWebhookServer

    ready = tmp_path / "ready"
    registration = _Flaky(failures=0)

    async def scenario() -> list[bool]:
        server = RegisteringWebhookServer(registration=registration, check_s=0.01,
                                          ready_file=ready)
        seen = [await server.register({"url": "x"}), ready.exists()]
        registration.failures = 1
        seen += [await server.register({"url": "x"}), ready.exists()]
        registration.failures, registration.present = 1, False  # gone meanwhile
        seen += [await server.register({"url": "x"}), ready.exists()]
        return seen

    assert asyncio.run(scenario()) == [True, True, False, True, False, False]


def test_a_registration_the_api_server_refuses_is_raised() -> None:
    registration = _Failing(ApiException(status=422, reason="Unprocessable Entity"))
    with pytest.raises(ApiException):
        asyncio.run(_server(registration).register({"url": "https://10.0.0.5:9443"}))


def test_a_keeper_goes_on_after_a_refused_registration() -> None:
    """Raised inside the keeper, the refusal ended it unseen: the registration was not kept
    any more, and nothing said so."""
    registration = _Failing(ApiException(status=403, reason="Forbidden"))

    async def scenario() -> bool:
        keeper = asyncio.create_task(_server(registration)._keep({"url": "x"}, False))
        for _ in range(500):  # until tried again twice, or ended (the bug)
            if registration.calls > 2 or keeper.done():
                break
            await asyncio.sleep(0.01)
        done = keeper.done()
        keeper.cancel()
        return done

    assert asyncio.run(scenario()) is False
    assert registration.calls > 2


def _ca_named(tmp_path: Path, name: str) -> str:
    cert, _ = write_self_signed(tmp_path / name, ["localhost"], days=1)
    return base64.b64encode(cert.read_bytes()).decode()


class _FakeAdmission:
    """The API server's copy of the configuration, as the client reads it."""

    stored: Any = None

    def read_mutating_webhook_configuration(self, name: str, **_: Any) -> Any:
        if self.stored is None:
            raise ApiException(status=404, reason="Not Found")
        return self.stored

    def delete_mutating_webhook_configuration(self, name: str, **_: Any) -> None:
        type(self).stored = None


def _stored(ca: str | None, service: tuple[str, str, int] | None, url: str | None = None,
            hooks: tuple[str, ...] = ("pods.infertune.io", "inferencetunings.infertune.io"),
            ) -> Any:
    from kubernetes import client as k8s

    ref = None if service is None else k8s.AdmissionregistrationV1ServiceReference(
        namespace=service[0], name=service[1], port=service[2], path="/tune-pods")
    return k8s.V1MutatingWebhookConfiguration(
        metadata=k8s.V1ObjectMeta(name="infertune-pod-tuning", resource_version="7",
                                  annotations={}),
        webhooks=[k8s.V1MutatingWebhook(
            name=name, admission_review_versions=["v1"], side_effects="None",
            client_config=k8s.AdmissionregistrationV1WebhookClientConfig(
                ca_bundle=ca, service=ref, url=url)) for name in hooks])


SERVICE = ("infertune-system", "infertune-webhook", 443)


def test_still_registered_says_when_to_register_again(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from infertune.kube import webhooks

    monkeypatch.setattr(webhooks.client, "AdmissionregistrationV1Api", _FakeAdmission)
    ours, other = _ca_named(tmp_path, "ours"), _ca_named(tmp_path, "other")
    through = WebhookRegistration(excluded_namespaces=("kube-system",), service=SERVICE)
    config = {"url": "https://10.0.0.5:9443", "caBundle": ours}
    _FakeAdmission.stored = None
    assert through.still_registered(config) is False  # removed by another process
    _FakeAdmission.stored = _stored(bundle_with(ours, other), SERVICE)
    assert through.still_registered(config) is True  # trusts ours (and the other's)
    _FakeAdmission.stored = _stored(other, SERVICE)
    assert through.still_registered(config) is False  # replaced without ours
    # Trusting ours, but with the pods' webhook alone: an older release's pod registered
    # again during an upgrade, and the tunings went unchecked until a restart.
    _FakeAdmission.stored = _stored(bundle_with(ours, other), SERVICE,
                                    hooks=("pods.infertune.io",))
    assert through.still_registered(config) is False
    # A newer release's, with one more: not fought over (the two would take turns).
    _FakeAdmission.stored = _stored(bundle_with(ours, other), SERVICE, hooks=(
        "pods.infertune.io", "inferencetunings.infertune.io", "later.infertune.io"))
    assert through.still_registered(config) is True
    _FakeAdmission.stored = _stored(other, ("elsewhere", "webhook", 443))
    assert through.still_registered(config) is True  # another Service's: not fought over
    at_url = WebhookRegistration(excluded_namespaces=("kube-system",))
    _FakeAdmission.stored = _stored(other, None, url="https://10.0.0.6:9443/tune-pods")
    assert at_url.still_registered(config) is True  # another process's URL: last one wins


def test_a_registration_at_another_processs_url_is_left_alone_and_said_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An `infertune run` outside the cluster registered at its URL: not fought over (the
    API server, not this pod, can tell whether it answers), but said, since once that
    process stops without removing it every pod is admitted untuned until someone acts."""
    import logging

    from infertune.kube import webhooks

    monkeypatch.setattr(webhooks.client, "AdmissionregistrationV1Api", _FakeAdmission)
    ours, other = _ca_named(tmp_path, "ours"), _ca_named(tmp_path, "other")
    through = WebhookRegistration(excluded_namespaces=("kube-system",), service=SERVICE)
    config = {"url": "https://10.0.0.5:9443", "caBundle": ours}
    _FakeAdmission.stored = _stored(other, None, url="https://192.0.2.9:9443/tune-pods")
    with caplog.at_level(logging.WARNING, logger=webhooks.__name__):
        assert [through.still_registered(config) for _ in range(3)] == [True] * 3
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(
        "infertune-pod-tuning is registered at https://192.0.2.9:9443/tune-pods (an "
        "infertune run outside the cluster)"), said
    assert "restart this operator" in said[0]


def test_serves_is_true_only_for_a_registration_that_reaches_this_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Readiness after a failed registration went by `still_registered`, which also says yes
    to another process's registration (to leave it alone): the pod was Ready where the API
    server could not call it."""
    from infertune.kube import webhooks

    monkeypatch.setattr(webhooks.client, "AdmissionregistrationV1Api", _FakeAdmission)
    ours, other = _ca_named(tmp_path, "ours"), _ca_named(tmp_path, "other")
    through = WebhookRegistration(excluded_namespaces=("kube-system",), service=SERVICE)
    at_url = WebhookRegistration(excluded_namespaces=("kube-system",))
    config = {"url": "https://10.0.0.5:9443", "caBundle": ours}
    mine = "https://10.0.0.5:9443/tune-pods"
    for stored, registration, serves in [
        (None, through, False),
        (_stored(bundle_with(ours, other), SERVICE), through, True),
        (_stored(other, SERVICE), through, False),  # not trusting this process's CA
        (_stored(ours, ("elsewhere", "webhook", 443)), through, False),  # another Service
        (_stored(ours, None, url=mine), through, False),  # at a URL
        (_stored(ours, None, url=mine), at_url, True),
        (_stored(ours, None, url="https://10.0.0.6:9443/tune-pods"), at_url, False),
        (_stored(other, None, url=mine), at_url, False),
        (_stored(ours, SERVICE), at_url, False),
    ]:
        _FakeAdmission.stored = stored
        assert registration.serves(config) is serves, (stored, registration.service)


def test_nothing_is_registered_once_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check's registration in flight at shutdown re-created the configuration after the
    removal, pointing at a stopped server."""
    from infertune.kube import webhooks

    monkeypatch.setattr(webhooks.client, "AdmissionregistrationV1Api", _FakeAdmission)
    registration = WebhookRegistration(excluded_namespaces=("kube-system",))
    _FakeAdmission.stored = None
    registration.remove()
    monkeypatch.setattr(WebhookRegistration, "_apply",
                        lambda self, config: pytest.fail("registered after the removal"))
    registration.apply({"url": "https://10.0.0.5:9443"})


class _Recording:
    """Records what is registered; the API server always holds it."""

    name = "infertune-pod-tuning"

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []

    def apply(self, config: dict[str, Any], keep_owner: bool = False) -> None:
        self.applied.append(config)

    def still_registered(self, config: dict[str, Any]) -> bool:
        return True

    def serves(self, config: dict[str, Any]) -> bool:
        return True

    def remove(self) -> None:
        pass


def _served_certificate(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw) as tls:
        served = tls.getpeercert(binary_form=True)
    assert served is not None
    return served


def test_a_certificate_renewed_in_its_files_is_served_and_its_ca_registered(
        tmp_path: Path) -> None:
    """cert-manager renews the Secret's files in place (90-day certificates, renewed 30
    days early): the server must serve the new certificate and register its CA while it
    runs, or every pod is admitted untuned once the first one expires."""
    from infertune.kube.webhooks import RegisteringWebhookServer

    cert, key = write_self_signed(tmp_path / "live", ["127.0.0.1", "localhost"])
    renewed = write_self_signed(tmp_path / "renewed", ["127.0.0.1", "localhost"])
    registration = _Recording()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def scenario() -> tuple[list[Any], bytes, bytes]:
        server = RegisteringWebhookServer(
            registration=registration, addr="127.0.0.1", port=port, host="127.0.0.1",
            certfile=cert, pkeyfile=key, cafile=cert, check_s=0.2, file_check_interval=0.2)

        async def review(*_: Any, **__: Any) -> dict[str, Any]:
            return {}

        configs = server(review)
        first = await configs.__anext__()
        before = await asyncio.to_thread(_served_certificate, port)
        # As kopf's consumer does, ask for the next configuration before the files change.
        following = asyncio.ensure_future(configs.__anext__())
        await asyncio.sleep(0.5)
        for source, live in zip(renewed, (cert, key), strict=True):
            live.write_bytes(source.read_bytes())
        second = await asyncio.wait_for(following, timeout=30)
        after = await asyncio.to_thread(_served_certificate, port)
        await configs.aclose()
        return [first, second], before, after

    (first, second), before, after = asyncio.run(scenario())
    assert before != after
    assert base64.b64decode(second["caBundle"]) == renewed[0].read_bytes()
    assert first["caBundle"] != second["caBundle"]
    assert [c["caBundle"] for c in registration.applied][-1] == second["caBundle"]


def test_the_operator_reads_the_certificate_files_at_each_check(tmp_path: Path) -> None:
    """kopf's own default is a minute, whatever --webhook-check-interval says."""
    from contextlib import ExitStack

    from infertune.cli import build_parser
    from infertune.controller.main import _webhook_server

    cert, key = write_self_signed(tmp_path, ["127.0.0.1"])
    args = build_parser().parse_args([
        "run", "--webhook-cert", str(cert), "--webhook-key", str(key),
        "--webhook-host", "127.0.0.1", "--webhook-check-interval", "7"])
    with ExitStack() as cleanup:
        server = _webhook_server(args, "infertune-system", cleanup)
    assert server.file_check_interval == server.check_s == 7.0


def test_an_admission_review_over_a_mebibyte_is_read() -> None:
    """kopf's server is an aiohttp application with aiohttp's 1 MiB request limit: a bigger
    review (a pod with a long inline script or env) was answered 413, the pod admitted
    untuned, replaced by re-tuning, and its replacement admitted untuned again. Served here
    by a real aiohttp server, as kopf builds its own (aiohttp.web.Application())."""
    import json

    import aiohttp
    import kopf
    from aiohttp import web

    from infertune.kube.webhooks import MAX_REVIEW_BYTES, RegisteringWebhookServer

    seen: list[int] = []

    async def fn(data: dict[str, Any], **_: Any) -> dict[str, Any]:
        seen.append(len(data["request"]["object"]["spec"]["containers"][0]["args"][0]))
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": data["request"]["uid"], "allowed": True}}

    async def exchange(server: type, size: int) -> int:
        async def serve(request: web.Request) -> web.Response:
            return await server._serve(fn, request)  # type: ignore[no-any-return]

        app = web.Application()
        app.add_routes([web.post("/{id:.*}", serve)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "u", "object": {"spec": {"containers": [
                      {"name": "c", "args": ["x" * size]}]}}}}
        try:
            async with aiohttp.ClientSession() as session, session.post(
                    f"http://127.0.0.1:{port}/pods", data=json.dumps(review)) as answer:
                return answer.status
        finally:
            await runner.cleanup()

    size = 1_400_000  # under etcd's 1.5 MiB per object
    assert asyncio.run(exchange(RegisteringWebhookServer, size)) == 200
    assert seen == [size]
    assert asyncio.run(exchange(kopf.WebhookServer, size)) == 413  # kopf's own limit
    assert asyncio.run(exchange(RegisteringWebhookServer, MAX_REVIEW_BYTES + 1)) == 413
