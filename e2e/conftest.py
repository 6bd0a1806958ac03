"""Fixtures of the end-to-end suites: one real cluster per session, a namespace per test.

With ``E2E_KUBECONFIG`` set, the suites run against that cluster (kind, say) and start
nothing. Otherwise they start the control plane built by ``python -m e2e.cluster build``.
Component logs are deleted after a green session and kept (path printed) after a failure;
``E2E_LOG_DIR`` pins the log directory and keeps it always.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from e2e.cluster.build import cached_bin_dir, missing_binaries
from e2e.cluster.runtime import Cluster
from e2e.fixtures.access import (
    ClusterInfo,
    Kubectl,
    external_cluster_info,
    managed_cluster_info,
    wait_for_default_service_account,
)
from e2e.fixtures.operator import OperatorProcess, in_cluster_operator, start_operator
from e2e.fixtures.prometheus import PROMETHEUS_BINARY, PrometheusServer
from e2e.fixtures.rbac import delete_owned_cluster_objects
from e2e.fixtures.waiting import wait_for
from infertune.api.spec import GROUP, PLURAL, VERSION

FAILED = pytest.StashKey[bool]()
TUNING_DELETION_S = 30.0
"""How long a deleted InferenceTuning may take to go (the operator removes its finalizer)."""
POD_READY_DELAY_S = float(os.environ.get("E2E_POD_READY_DELAY", "0.5"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        item.session.stash[FAILED] = True
    return report


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[ClusterInfo]:
    bin_dir = cached_bin_dir()
    external = os.environ.get("E2E_KUBECONFIG")
    missing = missing_binaries(bin_dir)
    if missing and not external:
        pytest.fail(
            f"the e2e control plane is not built ({', '.join(t.name for t in missing)} missing "
            f"in {bin_dir}); run `python -m e2e.cluster build` first, or set E2E_KUBECONFIG",
            pytrace=False,
        )
    scratch = Path(tempfile.mkdtemp(prefix="infertune-e2e-session-"))
    try:
        if external:
            yield external_cluster_info(Path(external), scratch, bin_dir)
        else:
            yield from _managed_cluster(request, bin_dir, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _managed_cluster(
    request: pytest.FixtureRequest, bin_dir: Path, scratch: Path
) -> Iterator[ClusterInfo]:
    pinned = os.environ.get("E2E_LOG_DIR")
    log_dir = Path(pinned) if pinned else Path(tempfile.mkdtemp(prefix="infertune-e2e-logs-"))
    with Cluster.start(
        bin_dir=bin_dir,
        log_dir=log_dir,
        pod_ready_delay=POD_READY_DELAY_S,
        kubeconfig=scratch / "admin.kubeconfig",
    ) as managed:
        yield managed_cluster_info(managed)
    if request.session.stash.get(FAILED, False) or pinned:
        _say(request, f"e2e cluster component logs kept in {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def kubeconfig(cluster: ClusterInfo) -> Path:
    return cluster.kubeconfig


@pytest.fixture(scope="session")
def api_client(kubeconfig: Path) -> Iterator[client.ApiClient]:
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    yield api
    api.close()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="session")
def kubectl(cluster: ClusterInfo) -> Kubectl:
    """``kubectl(*args, input=None, check=True, timeout_s=60) -> CompletedProcess[str]``."""
    return Kubectl.locate(cluster.bin_dir, cluster.kubeconfig)


@pytest.fixture
def namespace(api_client: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace, with its `default` ServiceAccount, deleted after the test."""
    name = new_namespace(api_client, request.node.name)
    yield name
    delete_namespace(api_client, name)


@pytest.fixture
def namespace_factory(
    api_client: client.ApiClient, request: pytest.FixtureRequest
) -> Iterator[Callable[[], str]]:
    """For tests that need more than one namespace: each call makes another."""
    made: list[str] = []

    def make() -> str:
        made.append(new_namespace(api_client, request.node.name))
        return made[-1]

    yield make
    for name in made:
        delete_namespace(api_client, name)


@pytest.fixture(scope="session")
def prometheus() -> Iterator[PrometheusServer]:
    """The real Prometheus (`.url`, `.add_scrape_job`, `.wait_for_targets_up`, `.query`)."""
    if not PROMETHEUS_BINARY.exists():
        pytest.fail(f"{PROMETHEUS_BINARY} not found: install the Debian package `prometheus`")
    server = PrometheusServer().start()
    yield server
    server.stop()


@contextmanager
def own_control_plane(cluster: ClusterInfo, work: Path,
                      why_not_external: str) -> Iterator[client.ApiClient]:
    """A second control plane, for a module whose operator the session's would get in the way
    of (it handles every namespace); skipped, saying `why_not_external`, on an external
    cluster."""
    if cluster.external or cluster.bin_dir is None:
        pytest.skip(why_not_external)
    with Cluster.start(bin_dir=cluster.bin_dir, log_dir=work / "logs",
                       pod_ready_delay=POD_READY_DELAY_S) as plane:
        api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(plane.kubeconfig))
        try:
            yield api
        finally:
            api.close()  # type: ignore[no-untyped-call]


def new_namespace(api_client: client.ApiClient, test_name: str) -> str:
    core = client.CoreV1Api(api_client)
    stem = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].rstrip("-")
    name = f"e2e-{stem}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(
        client.V1Namespace(
            metadata=client.V1ObjectMeta(name=name, labels={"e2e.infertune.io/test": "1"})
        )
    )
    wait_for_default_service_account(api_client, name)
    return name


def delete_namespace(api_client: client.ApiClient, name: str) -> None:
    delete_owned_cluster_objects(api_client, name)
    delete_tunings(api_client, name)
    try:
        client.CoreV1Api(api_client).delete_namespace(name)
    except ApiException as error:
        if error.status != 404:
            raise


def delete_tunings(api_client: client.ApiClient, namespace: str,
                   timeout_s: float = TUNING_DELETION_S) -> None:
    """Delete the namespace's InferenceTunings and wait until they are gone.

    The namespace itself is deleted without waiting, so a finalizer that never comes off (the
    operator's, if a handler or the autoscaling loop holds it) would go unnoticed. Each test's
    teardown therefore fails if one of its tunings outlives its deletion.
    """
    api = client.CustomObjectsApi(api_client)
    try:
        api.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    except ApiException as error:
        if error.status == 404:  # the CRD is not installed: no tunings
            return
        raise

    def gone() -> bool:
        listed = api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        return not listed["items"]

    try:
        wait_for(gone, f"InferenceTunings in {namespace} deleted", timeout_s=timeout_s)
    except AssertionError:
        left = api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        held = ", ".join(f"{t['metadata']['name']} (finalizers "
                         f"{t['metadata'].get('finalizers')})" for t in left)
        raise AssertionError(f"InferenceTunings still present {timeout_s:g}s after they were "
                             f"deleted: {held}") from None


def _say(request: pytest.FixtureRequest, message: str) -> None:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(message)
    else:
        print(message, file=sys.stderr)


@pytest.fixture(scope="session")
def operator(cluster: ClusterInfo, api_client: client.ApiClient,
             prometheus: PrometheusServer) -> Iterator[OperatorProcess]:
    """The operator: a real `infertune run` with the chart's RBAC and the session's real
    Prometheus, or the in-cluster one."""
    if cluster.external:
        yield in_cluster_operator()
        return
    assert cluster.log_dir is not None
    work = Path(tempfile.mkdtemp(prefix="infertune-e2e-operator-"))
    running = start_operator(api_client, work, cluster.log_dir, prometheus_url=prometheus.url)
    yield running
    running.stop()
    left = list((work / "tmp").iterdir())
    shutil.rmtree(work, ignore_errors=True)
    # kopf stops on SIGTERM and returns, and `run` removes its self-signed key pair then.
    assert not left, f"the stopped operator left {left} in its temporary directory"
