#!/usr/bin/env sh
# Prints the version a build of this tree names itself: the tag when HEAD is
# a tagged release, else the next release (hack/next-version, which a release
# bumps) marked as a development build of this commit, e.g.
# v0.2.0-dev+3f9c2a1b4d5e (.dirty with uncommitted changes). No checkout: dev.
cd "$(dirname "$0")/.." || exit 1
if tag=$(git describe --exact-match --tags 2>/dev/null) && git diff --quiet HEAD -- 2>/dev/null; then
	echo "$tag"
	exit 0
fi
sha=$(git rev-parse --short=12 HEAD 2>/dev/null) || { echo dev; exit 0; }
dirty=
git diff --quiet HEAD -- 2>/dev/null || dirty=.dirty
echo "$(cat hack/next-version)-dev+${sha}${dirty}"
