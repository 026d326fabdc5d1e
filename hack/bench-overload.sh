#!/usr/bin/env bash
# The overload sweep of docs/design/overload.md: bench-locks behind an
# apiproxy at each capacity, and stepped from 150 to 50 writes/s halfway
# through, for 1,000 locks at ttl 10s and 2,000 at ttl 30s; RUNS runs of
# each (BENCH_OVERLOAD_FLAGS, e.g. -hog, go to every run). Each run's table
# goes to bin/bench-overload/ with the manager's log (what it chose, when),
# and one summary table to stdout.
# Usage: hack/bench-overload.sh [RUNS]   (KUBEBUILDER_ASSETS set; make bench-overload)
# BENCH_OVERLOAD_SHAPES ("1000:10s 2000:30s") and BENCH_OVERLOAD_CAPACITIES
# ("40 75 110 150 step") choose a part of the sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1}
out=bin/bench-overload
mkdir -p "$out"
go build -o bin/benchlocks ./hack/benchlocks

# field prints the value column of the row of table $1 whose measure starts with $2.
field() { grep -F "| $2" "$1" | head -1 | awk -F'|' '{gsub(/^ +| +$/, "", $3); print $3}'; }

printf '| locks, ttl | capacity (writes/s) | run | granted / waiting | shed | capacity estimated | lapses of kept locks (locks) | overloads / locks they may lapse | shed late / samples | step: demand / bound / time to stable |\n'
printf '|---|---|---:|---|---:|---:|---:|---|---|---|\n'
for shape in ${BENCH_OVERLOAD_SHAPES:-1000:10s 2000:30s}; do
	locks=${shape%%:*} ttl=${shape#*:}
	for cap in ${BENCH_OVERLOAD_CAPACITIES:-40 75 110 150 step}; do
		for run in $(seq 1 "$runs"); do
			name="$locks-$ttl-$cap-$run"
			args=(-locks "$locks" -ttl "$ttl")
			if [ "$cap" = step ]; then
				args+=(-api-writes 150 -api-step-writes 50)
			else
				args+=(-api-writes "$cap")
			fi
			if [ "$locks" -gt 1000 ]; then
				args+=(-sample 5s -grant-timeout 10m -duration 4m)
			fi
			# shellcheck disable=SC2086 # the flags are words
			BENCH_MANAGER_LOG="$out/$name.log" bin/benchlocks "${args[@]}" ${BENCH_OVERLOAD_FLAGS:-} >"$out/$name.txt" 2>"$out/$name.err" || echo "run $name failed: see $out/$name.err" >&2
			t="$out/$name.txt"
			label=$cap
			[ "$cap" = step ] && label="150→50"
			printf '| %s, %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$locks" "$ttl" "$label" "$run" \
				"$(field "$t" 'locks granted when granting settled')" \
				"$(field "$t" 'locks shed (Held=False')" \
				"$(field "$t" 'manager overloaded at the end')" \
				"$(field "$t" 'lapses of locks kept') ($(field "$t" '… kept locks that lapsed' | cut -d/ -f1 | tr -d ' ') locks)" \
				"$(field "$t" 'overloads of the status writer')" \
				"$(field "$t" 'locks shed whose validity passed')" \
				"$(field "$t" 'step:')"
		done
	done
done
