"""The credentials `infertune run` hands kopf, as the real API server takes them.

In a pod (the chart's mode) the Kubernetes client loads the ServiceAccount token as
"bearer <token>", in lower case. Taken for a bare token, it went out as "Bearer bearer
<token>", which the API server refused: every watch, patch and Event of kopf failed. The e2e
operator runs with a kubeconfig, whose token reads "Bearer <token>", so nothing showed it.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import kopf
import pytest
import requests
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
