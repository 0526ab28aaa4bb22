#!/usr/bin/env bash
# Makes sure Debian's `redis-server` is installed and prints its path on
# stdout. The `resp` tier tests start their own Redis on loopback, with a
# configuration of their own, from this binary.
#
# The package's service is neither started nor left enabled
# (scripts/apt-install.sh). Installing needs root, or sudo.
set -euo pipefail
if command -v redis-server >/dev/null; then
  echo "setup-redis: reusing $(command -v redis-server)" >&2
else
  echo "setup-redis: installing Debian's redis-server package" >&2
  "$(dirname "$0")/apt-install.sh" setup-redis --no-install-recommends redis-server
fi
command -v redis-server
