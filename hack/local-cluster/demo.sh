#!/usr/bin/env bash
# make demo: bring up the local single-node cluster (hack/local-cluster),
# deploy the operator in it from its locally built image with the config/
# manifests, and run the tour of test/demo with a live view. Ctrl-C (or the
# end of a bounded run, DEMO_DURATION=90s) stops everything it started and
# restores the host, as `make cluster-down` does.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# sudo's secure_path usually leaves Go out.
export PATH=$PATH:/usr/local/go/bin
ELSEWHERE="deploy to an existing cluster instead: see \"Install on a cluster\" in README.md"

if [ "$(uname -s)" != Linux ]; then
	echo "make demo runs a real Kubernetes node on this machine, which needs Linux; on $(uname -s), $ELSEWHERE." >&2
	exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "make demo runs containerd and a kubelet, which needs root (try: sudo make demo); or $ELSEWHERE." >&2
	exit 1
fi
if ! command -v apt-get >/dev/null; then
	echo "make demo installs containerd, runc and redis-server with apt, which needs Debian or Ubuntu; elsewhere, $ELSEWHERE." >&2
	exit 1
fi

state=${CLUSTER_STATE:-/var/tmp/redlock-cluster}
mkdir -p "$state/bin"
echo "demo: building the demo program" >&2
(cd "$ROOT" && go build -o "$state/bin/demo" ./hack/demo)
rc=0
# shellcheck disable=SC2016 # expanded by the inner shell, after `up`
"$ROOT/hack/local-cluster/cluster.sh" run sh -c '
	echo
	echo "demo: the cluster is up. In another terminal:"
	echo "  export KUBECONFIG=$KUBECONFIG"
	echo "  $KUBECTL get dlock,rms,pods -A"
	echo "demo: Ctrl-C stops the demo and tears the cluster down; if it is ever killed hard, run: make cluster-down"
	echo
	sleep 3
	cd "$0" && exec "$1" --duration "$2"
' "$ROOT" "$state/bin/demo" "${DEMO_DURATION:-0}" || rc=$?
# Ctrl-C is how an interactive demo ends.
if [ "$rc" -eq 130 ]; then
	echo "demo: stopped; the cluster is down and the host restored" >&2
	rc=0
fi
exit "$rc"
