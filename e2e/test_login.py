"""The credentials `infertune run` hands kopf, as the real API server takes them.

In a pod (the chart's mode) the Kubernetes client loads the ServiceAccount token as
"bearer <token>", in lower case. Taken for a bare token, it went out as "Bearer bearer
<token>", which the API server refused: every watch, patch and Event of kopf failed. The e2e
operator runs with a kubeconfig, whose token reads "Bearer <token>", so nothing showed it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import kopf
import pytest
import requests
import yaml
from kubernetes import client
from kubernetes.config.incluster_config import InClusterConfigLoader

from infertune.kube.client import connection_info

pytestmark = pytest.mark.e2e


def test_in_cluster_credentials_log_kopf_in(api_client: client.ApiClient, namespace: str,
                                            tmp_path: Path) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="reader")))
    issued = core.create_namespaced_service_account_token("reader", namespace,
                                                          client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(expiration_seconds=600)))
    token_file = tmp_path / "token"  # as the kubelet mounts it
    token_file.write_text(issued.status.token)
    server = urlsplit(api_client.configuration.host)
    ca = api_client.configuration.ssl_ca_cert
    configuration = client.Configuration()
    InClusterConfigLoader(token_filename=str(token_file), cert_filename=ca, environ={
        "KUBERNETES_SERVICE_HOST": str(server.hostname),
        "KUBERNETES_SERVICE_PORT": str(server.port)}).load_and_set(configuration)
    saved = getattr(client.Configuration, "_default", None)
    client.Configuration.set_default(configuration)
    try:
        info = kopf.ConnectionInfo(**connection_info())
    finally:
        client.Configuration._default = saved  # type: ignore[attr-defined]
    headers = info.as_http_headers()
    # What kopf sends, to the real API server: whoami answers for the ServiceAccount.
    review = requests.post(
        f"{api_client.configuration.host}/apis/authentication.k8s.io/v1/selfsubjectreviews",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        headers=headers, verify=ca, timeout=10)
    assert review.status_code == 201, review.text
    assert review.json()["status"]["userInfo"]["username"] == (
        f"system:serviceaccount:{namespace}:reader")
    assert headers["Authorization"].split(" ", 1)[1] == issued.status.token


def refused_start(api_client: client.ApiClient, tmp_path: Path, ca: str,
                  token: str) -> str:
    """The last line `infertune run` prints when it stops at start with a kubeconfig for the
    real API server with CA file `ca` and `token`; it must stop within a minute, with no
    traceback."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": api_client.configuration.host,
                                               "certificate-authority": ca}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
    with socket.socket() as free:  # the e2e operator may hold the default webhook port
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "INFERTUNE_PROMETHEUS_URL"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "infertune", "run", "--standalone",
                           "--kubeconfig", str(kubeconfig), "--webhook-port", str(port)],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "API client library" not in done.stderr
    assert time.monotonic() - started < 60
    return done.stderr.strip().splitlines()[-1]


@pytest.fixture
def cluster_ca(api_client: client.ApiClient) -> str:
    ca = api_client.configuration.ssl_ca_cert
    if not ca:  # E2E_KUBECONFIG of a cluster reached without a CA file
        pytest.skip("the cluster's kubeconfig gives no CA file")
    return str(ca)


def test_credentials_the_api_server_refuses_stop_run_with_one_line(
        api_client: client.ApiClient, tmp_path: Path, cluster_ca: str) -> None:
    """An expired or wrong token: kopf retried for a minute, then ended in tracebacks and its
    advice to install an API client library. The real API server's 401 is named at once."""
    last = refused_start(api_client, tmp_path, cluster_ca, "not-a-valid-token")
    assert last.startswith(f"the API server at {api_client.configuration.host} refused the "
                           "credentials (401 Unauthorized"), last


def test_a_server_certificate_the_kubeconfig_does_not_trust_is_named(
        api_client: client.ApiClient, tmp_path: Path, cluster_ca: str) -> None:
    """Another cluster's CA in the kubeconfig: said as the certificate it is, not as a server
    that cannot be reached after a minute of tries."""
    from e2e.cluster.certs import CertificateAuthority

    other = tmp_path / "other-ca.crt"
    other.write_bytes(CertificateAuthority.create("another cluster").cert_pem)
    last = refused_start(api_client, tmp_path, str(other), "any")
    assert last.startswith(f"the API server at {api_client.configuration.host} has a "
                           "certificate the kubeconfig's CA does not trust ("), last
