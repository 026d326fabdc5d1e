#!/usr/bin/env bash
# Fail when a file tracked by git (or staged) is larger than LIMIT bytes
# (default 1 MiB): build outputs and binaries do not belong in the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${LIMIT:-1048576}
big=0
while IFS= read -r -d '' f; do
	[ -f "$f" ] || continue
	size=$(stat -c %s -- "$f")
	if [ "$size" -gt "$limit" ]; then
		echo "tracked file over $limit bytes: $f ($size bytes)" >&2
		big=1
	fi
done < <(git ls-files -z --cached)
if [ "$big" -ne 0 ]; then
	echo "remove it from git (git rm --cached) and ignore it in .gitignore" >&2
	exit 1
fi
