#!/usr/bin/env bash
# Writes the release of VERSION into OUT (default dist/release/VERSION;
# build output, never committed), with no Docker and no registry:
#   image/                        the operator's image, an OCI image layout holding one
#                                 index of IMAGE_PLATFORMS (default linux/amd64,linux/arm64)
#   image.digest                  the index's digest
#   redlock-operator-image_VERSION.oci.tar
#                                 the same layout as one tar (ctr images import, skopeo, crane)
#   redlock-operator-OS-ARCH.spdx.json
#                                 an SPDX SBOM of each platform's image
#   install.yaml                  kustomize build config/default, image IMAGE_REPO@DIGEST
#   redlock-operator-X.Y.Z.tgz    the chart, version X.Y.Z, appVersion VERSION, image IMAGE_REPO@DIGEST
#   kubectl-redlock_VERSION_OS_ARCH.tar.gz
#                                 the plugin and its completion script, for PLUGIN_PLATFORMS
#                                 (default: linux, darwin and windows on amd64 and arm64)
#   redlock.yaml                  the krew manifest of those archives (at RELEASE_URL)
#   SHA256SUMS, SHA256SUMS.sig    the checksums of every file, signed with the ECDSA P-256
#                                 key RELEASE_SIGNING_KEY names (cosign verify-blob --key)
# IMAGE_REPO defaults to ghcr.io/redlock-operator/redlock-operator, a
# placeholder until a registry is chosen; a release is pushed there by
# .github/workflows/release.yml. CHANGELOG.md (CHANGELOG) must have a
# section for VERSION unless it is a development build (vX.Y.Z-dev… or
# +BUILD, as make e2e builds; those must be RELEASE_UNSIGNED=1), and the
# work tree must be clean (RELEASE_DIRTY=1
# allows a dirty one, for tests). The image's tag in image/ is VERSION
# with "+" written "_". RELEASE_UNSIGNED=1 skips the signature
# (a local build). GNU sed and tar. OUT must be empty or absent; nothing is
# written to it unless every step succeeded. Usage (make release does this):
#   RELEASE_SIGNING_KEY=release.key hack/release.sh v0.2.0
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: hack/release.sh vX.Y.Z[-pre]}
if ! [[ $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$ ]]; then
	echo "release: VERSION $version is not vMAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]" >&2
	exit 1
fi
# A development build (pre-release dev…, or +BUILD, as hack/version.sh
# names an untagged tree; make e2e installs one) is local only: unsigned,
# so that it is never published, and needs no CHANGELOG section.
dev=
if [[ $version == *+* || $version =~ ^v[0-9.]+-dev([.+]|$) ]]; then
	dev=1
	if [ "${RELEASE_UNSIGNED:-}" != 1 ]; then
		echo "release: $version is a development build (-dev or +BUILD): build it unsigned (RELEASE_UNSIGNED=1); a release is vMAJOR.MINOR.PATCH[-PRERELEASE]" >&2
		exit 1
	fi
fi
# Unsigned means unsigned, whatever key the environment names.
[ "${RELEASE_UNSIGNED:-}" = 1 ] && unset RELEASE_SIGNING_KEY
changelog=${CHANGELOG:-CHANGELOG.md}
if [ -z "$dev" ] && ! grep -q "^## \[${version}\]" "$changelog"; then
	echo "release: $changelog has no section '## [${version}]': write what changed first" >&2
	exit 1
fi
if [ -z "${RELEASE_DIRTY:-}" ] && ! git diff --quiet HEAD --; then
	echo "release: the work tree has changes: release from a clean checkout of the commit you tag" >&2
	exit 1
fi
if [ -z "${RELEASE_SIGNING_KEY:-}" ] && [ "${RELEASE_UNSIGNED:-}" != 1 ]; then
	echo "release: name the signing key: RELEASE_SIGNING_KEY=FILE (or RELEASE_UNSIGNED=1 for an unsigned build)" >&2
	exit 1
fi
chart_version=${version#v}
repo=${IMAGE_REPO:-ghcr.io/redlock-operator/redlock-operator}
out=${OUT:-dist/release/$version}
if [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
	echo "release: $out is not empty: remove it, or name another OUT" >&2
	exit 1
fi
url=${RELEASE_URL:-https://github.com/redlock-operator/redlock-operator/releases/download/$version}
image_platforms=${IMAGE_PLATFORMS:-linux/amd64,linux/arm64}
plugin_platforms=${PLUGIN_PLATFORMS:-linux/amd64,linux/arm64,darwin/amd64,darwin/arm64,windows/amd64,windows/arm64}
go=${GO:-go}
root=$PWD
revision=$(git rev-parse HEAD)
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
stage=$tmp/out
mkdir -p "$stage"

# build OS/ARCH CMD...: the binaries, static, stamped with the version.
build() {
	local os=${1%/*} arch=${1#*/} cmd ext=
	shift
	[ "$os" = windows ] && ext=.exe
	for cmd in "$@"; do
		echo "build $os/$arch $cmd" >&2
		CGO_ENABLED=0 GOOS=$os GOARCH=$arch $go build -trimpath \
			-ldflags "-s -w -X github.com/redlock-operator/redlock-operator/internal/version.Version=${version}" \
			-o "$tmp/bin/${os}_${arch}/$cmd$ext" "./cmd/$cmd"
	done
}
for p in ${image_platforms//,/ }; do build "$p" manager gate agent kubectl-redlock; done
for p in ${plugin_platforms//,/ }; do
	[ -e "$tmp/bin/${p/\//_}/kubectl-redlock" ] || build "$p" kubectl-redlock
done
pack() { (cd hack/release && $go run . "$@"); }
pack image -bin "$tmp/bin" -platforms "$image_platforms" -version "$version" -revision "$revision" -created "$epoch" -out "$stage"
pack plugin -bin "$tmp/bin" -platforms "$plugin_platforms" -version "$version" -url "$url" -root "$root" -created "$epoch" -out "$stage"
image="${repo}@$(cat "$stage/image.digest")"
tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
	-C "$stage/image" -cf "$stage/redlock-operator-image_${version}.oci.tar" .

# The manifests: config/default with the release's image, by digest.
$go tool -modfile=hack/tools/go.mod kustomize build config/default |
	sed "s|redlock-operator:dev|${image}|g" >"$stage/install.yaml"
[ "$(grep -c "image: ${image}\$" "$stage/install.yaml")" = 1 ] || { echo "release: install.yaml does not name ${image}" >&2; exit 1; }

# The chart: a copy stamped with the version and the image's digest.
cp -r charts/redlock-operator "$tmp/"
sed -i -e "s|^version: .*|version: ${chart_version}|" -e "s|^appVersion: .*|appVersion: \"${version}\"|" "$tmp/redlock-operator/Chart.yaml"
sed -i -e "0,/^  repository: .*/s||  repository: ${repo}|" -e "0,/^  digest: .*/s||  digest: \"$(cat "$stage/image.digest")\"|" "$tmp/redlock-operator/values.yaml"
grep -q "^  digest: \"sha256:" "$tmp/redlock-operator/values.yaml" || { echo "release: values.yaml has no image.digest to set" >&2; exit 1; }
$go tool -modfile=hack/tools/helm/go.mod helm lint --strict --kube-version "${HELM_KUBE_VERSION:-v1.37.2}" "$tmp/redlock-operator" >/dev/null
$go tool -modfile=hack/tools/helm/go.mod helm package "$tmp/redlock-operator" --destination "$stage" >/dev/null
pack chart -tgz "$stage/redlock-operator-${chart_version}.tgz" -created "$epoch"

pack sign -dir "$stage" ${RELEASE_SIGNING_KEY:+-key "$(realpath "$RELEASE_SIGNING_KEY")"}
mkdir -p "$out"
cp -rp "$stage"/* "$out"/ # -p: the files keep their dates (the chart's is SOURCE_DATE_EPOCH)
echo "release ${version} in ${out}: image ${image}"
ls -1 "$out"
