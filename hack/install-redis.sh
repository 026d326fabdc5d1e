#!/usr/bin/env bash
# Installs redis-server (and redis-cli) from the OS packages when missing.
# Tests start their own redis-server processes; nothing is started here.
set -euo pipefail
HINT="Install your distribution's Redis server package (redis-server on Debian/Ubuntu, redis on Fedora/Alpine/Arch, 'brew install redis' on macOS), or point REDIS_SERVER at a redis-server binary." \
	exec "$(dirname "$0")/install-deb.sh" redis-server redis-server redis-tools
