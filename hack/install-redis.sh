#!/usr/bin/env bash
# Installs redis-server (and redis-cli) from the OS packages when missing.
# Tests start their own redis-server processes; nothing is started here.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1; then
	echo "redis-server present: $(redis-server --version | head -n1)"
	exit 0
fi

if [ -r /etc/os-release ]; then
	. /etc/os-release
fi
case "${ID:-}:${ID_LIKE:-}" in
debian:* | ubuntu:* | *:*debian*) ;;
*)
	echo "redis-server is missing. Install your distribution's Redis server package" >&2
	echo "(redis-server on Debian/Ubuntu, redis on Fedora/Alpine/Arch, 'brew install redis' on macOS)," >&2
	echo "or point REDIS_SERVER at a redis-server binary." >&2
	exit 1
	;;
esac

if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1; then
		SUDO=sudo
	else
		echo "redis-server is missing and this is not root: run 'apt-get install redis-server' as root." >&2
		exit 1
	fi
else
	SUDO=
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null
# The package may start a system instance on 6379; tests do not use it.
echo "installed: $(redis-server --version | head -n1)"
