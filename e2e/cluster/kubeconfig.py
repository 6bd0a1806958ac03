"""Kubeconfig files: client-certificate ones for the components, token ones for ServiceAccounts.

The CA and credentials are embedded (``*-data``), so a kubeconfig does not depend on files
in the cluster's work dir and can be copied anywhere while the cluster runs.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

CLUSTER_NAME = "infertune-e2e"


def write_client_cert_kubeconfig(
    path: Path, server: str, ca_pem: bytes, user: str, cert_pem: bytes, key_pem: bytes
) -> None:
    _write(
        path,
        server,
        ca_pem,
        user,
        {
            "client-certificate-data": _b64(cert_pem),
            "client-key-data": _b64(key_pem),
        },
        namespace="default",
    )


def write_token_kubeconfig(
    path: Path, server: str, ca_file: Path, token: str, namespace: str
) -> None:
    """A kubeconfig that authenticates with a bearer token (e.g. from the TokenRequest API)."""
    _write(path, server, ca_file.read_bytes(), "token-user", {"token": token}, namespace)


def _write(
    path: Path,
    server: str,
    ca_pem: bytes,
    user: str,
    credentials: dict[str, str],
    namespace: str,
) -> None:
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [
            {
                "name": user,
                "context": {"cluster": CLUSTER_NAME, "user": user, "namespace": namespace},
            }
        ],
        "current-context": user,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
