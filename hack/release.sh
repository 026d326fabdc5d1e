#!/usr/bin/env bash
# Writes the release artefacts of VERSION into OUT (default
# dist/release/VERSION; build output, never committed):
#   install.yaml                  kustomize build config/default, image IMAGE_REPO:VERSION
#   redlock-operator-X.Y.Z.tgz    the chart, version X.Y.Z, appVersion VERSION (its default image tag)
#   kubectl-redlock               the kubectl plugin (linux/amd64 unless GOOS/GOARCH say), stamped VERSION
# The install.yaml and the chart install the same image. CHANGELOG.md
# (CHANGELOG) must have a section for VERSION, and the work tree must be
# clean (RELEASE_DIRTY=1 allows a dirty one, for tests). GNU sed. Nothing
# is written to OUT unless every step succeeded. Usage (make release does
# this):
#   hack/release.sh v0.2.0
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: hack/release.sh vX.Y.Z[-pre]}
if ! [[ $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "release: VERSION $version is not vMAJOR.MINOR.PATCH[-PRERELEASE]" >&2
	exit 1
fi
changelog=${CHANGELOG:-CHANGELOG.md}
if ! grep -q "^## \[${version}\]" "$changelog"; then
	echo "release: $changelog has no section '## [${version}]': write what changed first" >&2
	exit 1
fi
if [ -z "${RELEASE_DIRTY:-}" ] && ! git diff --quiet HEAD --; then
	echo "release: the work tree has changes: release from a clean checkout of the commit you tag" >&2
	exit 1
fi
chart_version=${version#v}
repo=${IMAGE_REPO:-redlock-operator}
out=${OUT:-dist/release/$version}
go=${GO:-go}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
stage=$tmp/out
mkdir -p "$stage"

# The manifests: config/default with the release's image.
$go tool -modfile=hack/tools/go.mod kustomize build config/default |
	sed "s|redlock-operator:dev|${repo}:${version}|g" >"$stage/install.yaml"

# The chart: a copy stamped with the version; its default image tag is the
# appVersion, its repository image.repository.
cp -r charts/redlock-operator "$tmp/"
sed -i -e "s|^version: .*|version: ${chart_version}|" -e "s|^appVersion: .*|appVersion: \"${version}\"|" "$tmp/redlock-operator/Chart.yaml"
sed -i -e "0,/^  repository: .*/s||  repository: ${repo}|" "$tmp/redlock-operator/values.yaml"
$go tool -modfile=hack/tools/helm/go.mod helm lint --strict --kube-version "${HELM_KUBE_VERSION:-v1.37.2}" "$tmp/redlock-operator" >/dev/null
$go tool -modfile=hack/tools/helm/go.mod helm package "$tmp/redlock-operator" --destination "$stage" >/dev/null

if [ "${RELEASE_BINARIES:-1}" != 0 ]; then
	CGO_ENABLED=0 $go build -trimpath -ldflags "-s -w -X github.com/redlock-operator/redlock-operator/internal/version.Version=${version}" \
		-o "$stage/kubectl-redlock" ./cmd/kubectl-redlock
fi
mkdir -p "$out"
cp "$stage"/* "$out"/
echo "release ${version} in ${out}:"
ls -1 "$out"
