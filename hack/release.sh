#!/usr/bin/env bash
# Writes the release artefacts of VERSION into OUT (default
# dist/release/VERSION; build output, never committed):
#   install.yaml                  kustomize build config/default, image IMAGE_REPO:VERSION
#   redlock-operator-X.Y.Z.tgz    the chart, version X.Y.Z, appVersion VERSION (its default image tag)
#   kubectl-redlock               the kubectl plugin (linux/amd64 unless GOOS/GOARCH say), stamped VERSION
# The install.yaml and the chart install the same image; CHANGELOG.md must
# have a section for VERSION. Usage (make release does this):
#   hack/release.sh v0.2.0
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: hack/release.sh vX.Y.Z[-pre]}
if ! [[ $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "release: VERSION $version is not vMAJOR.MINOR.PATCH[-PRERELEASE]" >&2
	exit 1
fi
if ! grep -q "^## \[${version}\]" CHANGELOG.md; then
	echo "release: CHANGELOG.md has no section '## [${version}]': write what changed first" >&2
	exit 1
fi
chart_version=${version#v}
repo=${IMAGE_REPO:-redlock-operator}
out=${OUT:-dist/release/$version}
go=${GO:-go}
mkdir -p "$out"

# The manifests: config/default with the release's image.
$go tool -modfile=hack/tools/go.mod kustomize build config/default |
	sed "s|redlock-operator:dev|${repo}:${version}|g" >"$out/install.yaml"

# The chart: a copy stamped with the version; its default image tag is the
# appVersion, its repository image.repository.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r charts/redlock-operator "$tmp/"
sed -i -e "s|^version: .*|version: ${chart_version}|" -e "s|^appVersion: .*|appVersion: \"${version}\"|" "$tmp/redlock-operator/Chart.yaml"
sed -i -e "0,/^  repository: .*/s||  repository: ${repo}|" "$tmp/redlock-operator/values.yaml"
$go tool -modfile=hack/tools/helm/go.mod helm lint --strict --kube-version "${HELM_KUBE_VERSION:-v1.37.2}" "$tmp/redlock-operator" >/dev/null
$go tool -modfile=hack/tools/helm/go.mod helm package "$tmp/redlock-operator" --destination "$out" >/dev/null

if [ "${RELEASE_BINARIES:-1}" != 0 ]; then
	CGO_ENABLED=0 $go build -trimpath -ldflags "-s -w -X github.com/redlock-operator/redlock-operator/internal/version.Version=${version}" \
		-o "$out/kubectl-redlock" ./cmd/kubectl-redlock
fi
echo "release ${version} in ${out}:"
ls -1 "$out"
