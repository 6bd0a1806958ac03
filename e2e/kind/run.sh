#!/usr/bin/env sh
# Run the e2e suites against a kind cluster instead of the built-in control plane.
#   e2e/kind/run.sh [TEST PATHS / pytest args]   create or reuse the cluster, install the
#                                                operator, run the suites (default: e2e/)
#   KEEP_CLUSTER=0 e2e/kind/run.sh               delete the cluster afterwards
# Needs: docker, kind, kubectl, helm; Python test dependencies installed.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
name=${KIND_CLUSTER_NAME:-infertune-e2e}
image=${OPERATOR_IMAGE:-infertune:e2e}
kubeconfig=${E2E_KUBECONFIG:-$root/.e2e-kind.kubeconfig}
k8s_version=$(sed -n 's/^[[:space:]]*k8s\.io\/kubernetes[[:space:]]\{1,\}\(v[^[:space:]]*\).*/\1/p' \
  "$root/e2e/cluster/go.mod" | head -n 1)
node_image=${KIND_NODE_IMAGE:-kindest/node:$k8s_version}

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null 2>&1 || { echo "run.sh: $tool not found on PATH" >&2; exit 2; }
done

if ! kind get clusters | grep -qx "$name"; then
  kind create cluster --name "$name" --image "$node_image" \
    --config "$here/kind-config.yaml" --kubeconfig "$kubeconfig" --wait 120s
else
  kind get kubeconfig --name "$name" >"$kubeconfig"
fi

if [ -f "$root/Dockerfile" ]; then
  docker build -t "$image" "$root"
  kind load docker-image "$image" --name "$name"
  repository=${image%:*}
  tag=${image##*:}
  helm upgrade --install infertune "$root/charts/infertune" \
    --kubeconfig "$kubeconfig" --namespace infertune-system --create-namespace \
    --set image.repository="$repository" --set image.tag="$tag" --set image.pullPolicy=Never \
    --wait --timeout 180s
else
  echo "run.sh: no Dockerfile at $root; running the suites without installing the operator" >&2
fi

[ "$#" -gt 0 ] || set -- "$root/e2e"
status=0
E2E_KUBECONFIG="$kubeconfig" python -m pytest -m e2e -p no:cacheprovider "$@" || status=$?

if [ "${KEEP_CLUSTER:-1}" = "0" ]; then
  kind delete cluster --name "$name"
fi
exit "$status"
