#!/usr/bin/env bash
# Installs Debian/Ubuntu packages when a command is missing; nothing is
# started here. Usage: hack/install-deb.sh COMMAND PACKAGE... 
# (hack/install-redis.sh and hack/install-prometheus.sh name theirs).
# The hint in $HINT is printed on other systems.
set -euo pipefail
cmd=$1
shift

if command -v "$cmd" >/dev/null 2>&1; then
	echo "$cmd present: $("$cmd" --version 2>&1 | head -n1)"
	exit 0
fi

if [ -r /etc/os-release ]; then
	. /etc/os-release
fi
case "${ID:-}:${ID_LIKE:-}" in
debian:* | ubuntu:* | *:*debian*) ;;
*)
	echo "$cmd is missing. ${HINT:-Install it with the package manager of this system.}" >&2
	exit 1
	;;
esac

if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1; then
		SUDO=sudo
	else
		echo "$cmd is missing and this is not root: run 'apt-get install $*' as root." >&2
		exit 1
	fi
else
	SUDO=
fi

export DEBIAN_FRONTEND=noninteractive
# Waits for the dpkg lock (a fresh machine's unattended upgrades hold it at
# first) for up to 10 minutes.
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
# Without recommends: prometheus would add node-exporter. A package's own
# service (a system redis-server on 6379) is not used.
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$@" >/dev/null
echo "installed: $("$cmd" --version 2>&1 | head -n1)"
