"""A real Kubernetes control plane for end-to-end tests, built from the official Go modules.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl come from the
Kubernetes release pinned in ``go.mod``; nodes are simulated by kwok. See README.md.
"""

from e2e.cluster.build import BuildError, cached_bin_dir
from e2e.cluster.runtime import Cluster, ClusterError, write_token_kubeconfig

__all__ = ["BuildError", "Cluster", "ClusterError", "cached_bin_dir", "write_token_kubeconfig"]
