#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this Linux machine, as root, for
# the end-to-end tests: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet and containerd, all on loopback, built from the Go
# module proxy and Debian packages only (see LOCAL-CLUSTER facts in the docs).
#
#   hack/local-cluster/cluster.sh up     # build (cached), start, import images; prints KUBECONFIG
#   hack/local-cluster/cluster.sh down   # stop everything and restore the host
#   hack/local-cluster/cluster.sh run CMD...  # up, run CMD with KUBECONFIG set, always down
#
# The operator's image is this tree's, built as the Dockerfile builds it
# (redlock-operator:e2e), or with RELEASE_DIR=DIR the image of the release
# in DIR, imported from its OCI layout (make e2e does this).
# State lives in $CLUSTER_STATE (default /var/tmp/redlock-cluster); nothing
# is written into the checkout. `up` tears down again when it fails.
set -euo pipefail
# Errors stop the script inside command substitutions too: `up` runs in
# one (KUBECONFIG=$(up)), and a failed install must not go on to a build.
shopt -s inherit_errexit

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
STATE=${CLUSTER_STATE:-/var/tmp/redlock-cluster}
API_PORT=${API_PORT:-16443}
ETCD_PORT=${ETCD_PORT:-12379}
KUBELET_PORT=${KUBELET_PORT:-11250}
NODE=local-node
SOCK=$STATE/containerd/containerd.sock
TOKEN=redlock-e2e-admin-token
PAUSE_IMAGE=registry.k8s.io/pause:3.10
export PATH=$PATH:/usr/local/go/bin:/usr/sbin:/sbin

log() { echo "cluster: $*" >&2; }

need_root() { [ "$(id -u)" -eq 0 ] || { log "must run as root"; exit 1; }; }

install_packages() {
	local missing=()
	command -v containerd >/dev/null || missing+=(containerd)
	command -v runc >/dev/null || missing+=(runc)
	[ -x /usr/lib/cni/loopback ] || missing+=(containernetworking-plugins)
	command -v openssl >/dev/null || missing+=(openssl)
	command -v iptables >/dev/null || missing+=(iptables) # the e2e suite cuts an agent off with it
	[ -x /bin/busybox ] || missing+=(busybox-static)
	if [ ${#missing[@]} -gt 0 ]; then
		log "installing ${missing[*]} (waiting up to 10 minutes for the dpkg lock: a fresh machine's unattended upgrades hold it at first)"
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq ||
			{ log "apt-get update failed (above): fix the package sources and run again"; exit 1; }
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
			{ log "installing ${missing[*]} failed (above): nothing was built or started"; exit 1; }
	fi
	"$ROOT/hack/install-redis.sh" >/dev/null || { log "installing redis-server failed (above)"; exit 1; }
}

build() {
	BIN=$(KUBE_COMMANDS="kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl" "$ROOT/hack/build-envtest.sh")
	mkdir -p "$STATE/bin"
	(cd "$ROOT/hack/local-cluster" && CGO_ENABLED=0 go build -o "$STATE/bin/" ./cmd/...)
	if [ -z "${RELEASE_DIR:-}" ]; then
		log "building the operator's binaries"
		make -s -C "$ROOT" binaries BIN="$STATE/bin/operator" >/dev/null
	fi
}

# record_host saves what the kubelet changes so that down restores it.
record_host() {
	mkdir -p "$STATE"
	[ -f "$STATE/host.before" ] && return
	{
		for s in vm.overcommit_memory kernel.panic kernel.panic_on_oops; do
			echo "sysctl $s $(sysctl -n $s)"
		done
		for p in /var/log/containers /var/log/pods /var/lib/kubelet /var/lib/cni /run/containerd /etc/cni; do
			if [ -e "$p" ]; then echo "existed $p"; fi
		done
	} >"$STATE/host.before"
}

start() { # name, command...
	local name=$1
	shift
	"$@" >"$STATE/log/$name.log" 2>&1 &
	echo $! >"$STATE/pid/$name"
}

wait_for() { # what, seconds, command...
	local what=$1 secs=$2
	shift 2
	for _ in $(seq $((secs * 5))); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	log "timed out waiting for $what"
	return 1
}

write_configs() {
	mkdir -p "$STATE"/{pki,log,pid,etcd,kubelet,cni/bin,cni/conf,containerd}
	[ -f "$STATE/pki/sa.key" ] || openssl genrsa -out "$STATE/pki/sa.key" 2048 2>/dev/null
	openssl rsa -in "$STATE/pki/sa.key" -pubout -out "$STATE/pki/sa.pub" 2>/dev/null
	echo "$TOKEN,admin,admin,system:masters" >"$STATE/pki/tokens.csv"
	cat >"$STATE/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:$API_PORT", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: "$TOKEN"}
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
KC
	cp "$STATE/bin/cni-nominal" /usr/lib/cni/loopback "$STATE/cni/bin/"
	cat >"$STATE/cni/conf/10-nominal.conflist" <<CNI
{"cniVersion": "1.0.0", "name": "nominal", "plugins": [{"type": "cni-nominal"}]}
CNI
	cat >"$STATE/containerd/config.toml" <<TOML
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$STATE/cni/bin"
    conf_dir = "$STATE/cni/conf"
TOML
	cat >"$STATE/kubelet/config.yaml" <<KL
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzPort: 0
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://$SOCK
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 64
serializeImagePulls: false
KL
}

# image NAME TAG ENTRYPOINT ROOTFS: pack and import.
import_image() {
	"$STATE/bin/mkimage" -rootfs "$4" -tag "$2" -entrypoint "$3" -o "$STATE/images/$1.tar"
	ctr -a "$SOCK" -n k8s.io images import "$STATE/images/$1.tar" >/dev/null
}

build_images() {
	mkdir -p "$STATE/images"
	local r
	r=$(mktemp -d)
	mkdir -p "$r/pause"
	cp "$STATE/bin/pause" "$r/pause/pause"
	import_image pause "$PAUSE_IMAGE" /pause "$r/pause"
	# Redis: the real server binary (Debian's redis-server is a symlink that
	# picks its mode from argv[0]) and the libraries ldd lists.
	local redis
	redis=$(readlink -f "$(command -v redis-server)")
	mkdir -p "$r/redis/usr/bin" "$r/redis/tmp" "$r/redis/etc" "$r/redis/data"
	cp "$redis" "$r/redis/usr/bin/redis-server"
	for lib in $(ldd "$redis" | awk '/=>/ {print $3} /^\t\// {print $1}'); do
		mkdir -p "$r/redis$(dirname "$lib")"
		cp -L "$lib" "$r/redis$lib"
	done
	echo "root:x:0:0:root:/:/bin/false" >"$r/redis/etc/passwd"
	import_image redis redis:7-local /usr/bin/redis-server "$r/redis"
	# A shell for the workloads the e2e suite gates on locks.
	mkdir -p "$r/busybox/bin"
	cp /bin/busybox "$r/busybox/bin/busybox"
	for t in sh cat sleep echo date; do ln -s busybox "$r/busybox/bin/$t"; done
	import_image busybox busybox:local /bin/sh "$r/busybox"
	if [ -n "${RELEASE_DIR:-}" ]; then
		release_image
	else
		operator_image "$r"
	fi
	rm -rf "$r"
}

# release_image imports the operator's image of the release in RELEASE_DIR
# (make release, or make e2e-release for this host) from its OCI layout,
# under the names its install.yaml and chart use: REPO@DIGEST, and
# REPO:TAG. Nothing is pulled: the pods' pull policy may stay IfNotPresent.
release_image() {
	local archive image
	archive=$(ls "$RELEASE_DIR"/redlock-operator-image_*.oci.tar 2>/dev/null | head -n 1)
	image=$(sed -n 's/^ *image: \(.*@sha256:[0-9a-f]*\)$/\1/p' "$RELEASE_DIR/install.yaml" 2>/dev/null | head -n 1)
	if [ -z "$archive" ] || [ -z "$image" ]; then
		log "RELEASE_DIR=$RELEASE_DIR holds no release (an image .oci.tar and an install.yaml naming it by digest)"
		return 1
	fi
	ctr -a "$SOCK" -n k8s.io images import --base-name "${image%@*}" --digests "$archive" >/dev/null
	ctr -a "$SOCK" -n k8s.io images ls -q | grep -qx "$image" || { log "importing $archive did not name $image"; return 1; }
	log "imported $image from $archive"
}

# operator_image lays the operator's binaries out as the Dockerfile's final
# stage does (its COPY --from=builder lines, USER, WORKDIR, ENTRYPOINT), so
# the local image and the released one cannot drift; the e2e suite checks
# the imported image against the Dockerfile.
operator_image() {
	local r=$1 final=$1/final entry user workdir src dest
	awk '/^FROM /{s=""} {s=s $0 "\n"} END{printf "%s", s}' "$ROOT/Dockerfile" >"$final"
	mkdir -p "$r/op"
	while read -r _ _ src dest; do
		cp "$STATE/bin/operator/$(basename "$src")" "$r/op$dest"
	done < <(grep '^COPY --from=builder ' "$final")
	entry=$(sed -n 's/^ENTRYPOINT \["\([^"]*\)"\]$/\1/p' "$final")
	user=$(sed -n 's/^USER //p' "$final")
	workdir=$(sed -n 's/^WORKDIR //p' "$final")
	"$STATE/bin/mkimage" -rootfs "$r/op" -tag redlock-operator:e2e -entrypoint "$entry" -user "$user" -workdir "$workdir" -o "$STATE/images/operator.tar"
	ctr -a "$SOCK" -n k8s.io images import "$STATE/images/operator.tar" >/dev/null
}

up() {
	need_root
	if [ -d "$STATE/pid" ] && [ -n "$(ls -A "$STATE/pid" 2>/dev/null)" ]; then
		log "a previous cluster is still here: tearing it down first"
		down
	fi
	install_packages
	build
	record_host
	write_configs
	trap 'log "up failed at line $LINENO: $BASH_COMMAND; tearing down"; down' ERR
	local k="--kubeconfig=$STATE/kubeconfig"
	# A throwaway cluster: etcd does not fsync, so that a slow disk does not
	# stall the API server (and the leader election leases behind it).
	start etcd "$BIN/etcd" --unsafe-no-fsync --data-dir "$STATE/etcd" --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--advertise-client-urls "http://127.0.0.1:$ETCD_PORT" --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
		--initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-cluster "default=http://127.0.0.1:$((ETCD_PORT + 1))"
	start kube-apiserver "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
		--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --endpoint-reconciler-type none --secure-port "$API_PORT" \
		--cert-dir "$STATE/pki" --token-auth-file "$STATE/pki/tokens.csv" --authorization-mode Node,RBAC \
		--service-account-key-file "$STATE/pki/sa.pub" --service-account-signing-key-file "$STATE/pki/sa.key" \
		--service-account-issuer https://kubernetes.default.svc.cluster.local --service-cluster-ip-range 10.96.0.0/16 \
		--kubelet-port "$KUBELET_PORT" --kubelet-preferred-address-types InternalIP
	wait_for "kube-apiserver" 60 "$BIN/kubectl" "$k" get --raw /readyz
	start kube-controller-manager "$BIN/kube-controller-manager" "$k" --leader-elect=false --bind-address 127.0.0.1 \
		--secure-port 0 --service-account-private-key-file "$STATE/pki/sa.key" --root-ca-file "$STATE/pki/apiserver.crt" \
		--use-service-account-credentials=false --controllers '*'
	start kube-scheduler "$BIN/kube-scheduler" "$k" --leader-elect=false --bind-address 127.0.0.1 --secure-port 0
	start containerd containerd --config "$STATE/containerd/config.toml"
	wait_for "containerd" 30 ctr -a "$SOCK" version
	build_images
	start kubelet "$BIN/kubelet" "$k" --config "$STATE/kubelet/config.yaml" --root-dir "$STATE/kubelet/root" \
		--cert-dir "$STATE/kubelet/pki" --hostname-override "$NODE" --node-ip 127.0.0.1
	wait_for "node Ready" 60 sh -c "'$BIN/kubectl' $k get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q True"
	wait_for "default ServiceAccount" 60 "$BIN/kubectl" "$k" get serviceaccount default
	trap - ERR
	log "up: KUBECONFIG=$STATE/kubeconfig (kubectl: $BIN/kubectl)"
	echo "$STATE/kubeconfig"
}

down() {
	set +e
	for name in kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do
		[ -f "$STATE/pid/$name" ] && kill "$(cat "$STATE/pid/$name")" 2>/dev/null
	done
	# Containers first (their shims hold mounts), then containerd.
	if [ -S "$SOCK" ]; then
		for t in $(ctr -a "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
			ctr -a "$SOCK" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1
		done
	fi
	pkill -f "containerd-shim.*$STATE" 2>/dev/null
	[ -f "$STATE/pid/containerd" ] && kill "$(cat "$STATE/pid/containerd")" 2>/dev/null
	sleep 1
	for name in kubelet kube-scheduler kube-controller-manager kube-apiserver etcd containerd; do
		[ -f "$STATE/pid/$name" ] && kill -9 "$(cat "$STATE/pid/$name")" 2>/dev/null
		rm -f "$STATE/pid/$name"
	done
	pkill -9 -f "containerd-shim.*$STATE" 2>/dev/null
	# Strays of this state directory whose pid file was lost or rewritten
	# (a containerd still serving the socket would break the next up).
	if pkill -9 -f -- "$STATE/(containerd/config.toml|etcd|kubelet/root|pki|kubeconfig)" 2>/dev/null; then
		log "down: killed stray processes of $STATE"
		sleep 1
	fi
	# Rules the e2e suite adds to cut an agent off (tagged redlock-e2e),
	# left by a run that was killed.
	if command -v iptables >/dev/null; then
		for table in filter mangle; do
			iptables -t "$table" -S 2>/dev/null | grep -E -- '--comment redlock-e2e( |$)' | sed 's/^-A/-D/' |
				while read -ra rule; do iptables -t "$table" "${rule[@]}" 2>/dev/null; done
		done
	fi
	grep " $STATE" /proc/mounts | awk '{print $2}' | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
	for c in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
		[ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
	done
	if [ -f "$STATE/host.before" ]; then
		while read -r kind a b; do
			[ "$kind" = sysctl ] && sysctl -q -w "$a=$b"
		done <"$STATE/host.before"
		for p in /var/log/containers /var/log/pods /var/lib/kubelet /var/lib/cni /run/containerd /etc/cni; do
			grep -q "existed $p\$" "$STATE/host.before" || rm -rf "$p"
		done
	fi
	rm -rf "$STATE"/{etcd,kubelet,containerd,pid,images,cni,active} "$STATE/host.before"
	log "down: host restored"
	set -e
}

case "${1:-}" in
up) up ;;
down) need_root; down ;;
run)
	shift
	need_root
	trap down EXIT
	trap 'exit 130' INT TERM # exit through the EXIT trap: always down
	KUBECONFIG=$(up)
	BIN=$(KUBE_COMMANDS="kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl" "$ROOT/hack/build-envtest.sh") # cached
	export KUBECONFIG KUBECTL="$BIN/kubectl" CLUSTER_STATE="$STATE"
	"$@"
	;;
*)
	echo "usage: $0 up|down|run CMD..." >&2
	exit 2
	;;
esac
