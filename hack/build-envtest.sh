#!/usr/bin/env bash
# Builds the envtest control plane (kube-apiserver and etcd) from the Go module
# proxy, once, into a cache outside the checkout, and prints the directory to
# use as KUBEBUILDER_ASSETS. Prebuilt envtest binaries cannot be downloaded on
# the machines this project is developed and tested on.
#
# A second run with the same versions is a no-op.
#
#   KUBE_VERSION  k8s.io/kubernetes version   (default v1.37.2)
#   ETCD_VERSION  go.etcd.io/etcd/server/v3   (default v3.6.16)
#   ENVTEST_CACHE cache root                  (default ${XDG_CACHE_HOME:-~/.cache}/redlock-operator/envtest)
#   KUBE_COMMANDS k8s.io/kubernetes/cmd/* to build (default kube-apiserver;
#                 the local cluster adds the controller manager, scheduler,
#                 kubelet and kubectl)
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
CACHE=${ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/redlock-operator/envtest}
OUT="$CACHE/k8s-$KUBE_VERSION-etcd-$ETCD_VERSION"
GO=${GO:-go}
KUBE_COMMANDS=${KUBE_COMMANDS:-kube-apiserver}

missing=()
for c in $KUBE_COMMANDS; do
	[ -x "$OUT/$c" ] || missing+=("$c")
done
if [ ${#missing[@]} -eq 0 ] && [ -x "$OUT/etcd" ] && [ -f "$OUT/.complete" ]; then
	echo "$OUT"
	exit 0
fi

log() { echo "build-envtest: $*" >&2; }

# progress WHAT CMD...: runs CMD, saying every 20 s that it is still
# running, so that a cold build (minutes) does not look like a hang.
progress() {
	local what=$1 start=$SECONDS ticker rc=0
	shift
	log "$what ..."
	(
		exec >/dev/null # never hold the caller's $(...) open
		while sleep 1; do
			[ $(((SECONDS - start) % 20)) -eq 0 ] && log "  still $what ($((SECONDS - start)) s)"
		done
	) &
	ticker=$!
	"$@" || rc=$?
	kill "$ticker" 2>/dev/null
	wait "$ticker" 2>/dev/null || true
	[ "$rc" -eq 0 ] && log "$what: done in $((SECONDS - start)) s"
	return "$rc"
}
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The staging modules are k8s.io/* at the matching v0 version.
staging=${KUBE_VERSION/v1./v0.}

# --- Kubernetes commands --------------------------------------------------------
if [ ${#missing[@]} -gt 0 ]; then
	log "building ${missing[*]} $KUBE_VERSION (several minutes on a cold cache)"
	mkdir -p "$work/kube"
	(
		cd "$work/kube"
		$GO mod init envtest.local/kube >/dev/null 2>&1
		gomod=$($GO mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
		[ -n "$gomod" ] || { log "cannot download k8s.io/kubernetes@$KUBE_VERSION"; exit 1; }
		# Every "k8s.io/x => ./staging/..." replace of kubernetes' go.mod becomes
		# a replace by the released staging module.
		args=(-require="k8s.io/kubernetes@$KUBE_VERSION")
		while read -r mod; do
			args+=(-replace="$mod=$mod@$staging")
		done < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$gomod")
		$GO mod edit "${args[@]}"
		{
			printf '//go:build tools\n\npackage tools\n\nimport (\n'
			for c in "${missing[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
			printf ')\n'
		} >tools.go
		progress "resolving the k8s.io/kubernetes modules" sh -c "$GO mod tidy >/dev/null 2>&1 || $GO mod tidy"
		major=$(echo "$KUBE_VERSION" | sed 's/^v\([0-9]*\)\..*/\1/')
		minor=$(echo "$KUBE_VERSION" | sed 's/^v[0-9]*\.\([0-9]*\)\..*/\1/')
		pkg=k8s.io/component-base/version
		i=0
		for c in "${missing[@]}"; do
			i=$((i + 1))
			progress "building $c ($i of ${#missing[@]})" env CGO_ENABLED=0 $GO build -trimpath -o "$OUT/$c" \
				-ldflags "-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor" \
				"k8s.io/kubernetes/cmd/$c"
		done
	)
fi

# --- etcd ---------------------------------------------------------------------
if [ ! -x "$OUT/etcd" ]; then
	log "etcd $ETCD_VERSION"
	mkdir -p "$work/etcd"
	(
		cd "$work/etcd"
		$GO mod init envtest.local/etcd >/dev/null 2>&1
		args=(-require="go.etcd.io/etcd/server/v3@$ETCD_VERSION")
		for m in api/v3 client/pkg/v3 client/v3 pkg/v3; do
			args+=(-replace="go.etcd.io/etcd/$m=go.etcd.io/etcd/$m@$ETCD_VERSION")
		done
		$GO mod edit "${args[@]}"
		cat >tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
		progress "resolving the etcd modules" sh -c "$GO mod tidy >/dev/null 2>&1 || $GO mod tidy"
		progress "building etcd" env CGO_ENABLED=0 $GO build -trimpath -ldflags "-s -w" -o "$OUT/etcd" go.etcd.io/etcd/server/v3
	)
fi

"$OUT/kube-apiserver" --version >&2
"$OUT/etcd" --version | head -n1 >&2
touch "$OUT/.complete"
echo "$OUT"
