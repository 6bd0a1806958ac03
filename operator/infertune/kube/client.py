"""The one Kubernetes client wrapper: configuration and the reads the controller needs."""

from __future__ import annotations

import os

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException


def configure(kubeconfig: str | None) -> None:
    """Load credentials: the given kubeconfig, else in-cluster, else $KUBECONFIG/~/.kube."""
    if kubeconfig:
        # kopf logs in through the kubernetes client, which reads $KUBECONFIG.
        os.environ["KUBECONFIG"] = kubeconfig
        config.load_kube_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        return
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]


def read_deployment(namespace: str, name: str) -> client.V1Deployment | None:
    """The Deployment, or None when it does not exist."""
    try:
        return client.AppsV1Api().read_namespaced_deployment(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
