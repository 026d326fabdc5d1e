#!/usr/bin/env bash
# Installs Debian's prometheus package (prometheus and promtool) when
# promtool is missing. make test checks the alerting rules and the Grafana
# dashboard's queries with promtool; make e2e runs a real Prometheus server
# of its own on a free loopback port. Nothing is started here.
set -euo pipefail
HINT="Install your distribution's Prometheus package (prometheus on Debian/Ubuntu), or put prometheus and promtool from a Prometheus release on PATH." \
	exec "$(dirname "$0")/install-deb.sh" promtool prometheus
