#!/usr/bin/env bash
# Makes sure OpenStack Swift (Debian's 2.30.1: proxy with s3api and tempauth,
# account, container and object servers, swift-ring-builder) and memcached
# are installed, and prints the directory holding their binaries on stdout.
# The end-to-end tests start a Swift-All-In-One of their own from there
# (lmcache-tier-e2e's `Swift`), on free loopback ports under their own
# temporary directory: nothing here configures or starts a server.
#
# The packages' services are neither started nor left enabled
# (scripts/apt-install.sh). Installing needs root, or sudo, and apt; about a
# minute.
set -euo pipefail
bins=(swift-proxy-server swift-account-server swift-container-server
  swift-object-server swift-ring-builder memcached)
missing=()
for bin in "${bins[@]}"; do
  command -v "$bin" >/dev/null || missing+=("$bin")
done
# The servers run on the system's Python (their #! line), not whichever
# python3 is first on PATH.
if [ ${#missing[@]} -eq 0 ] && /usr/bin/python3 -c 'import swift.common.middleware.s3api' 2>/dev/null; then
  echo "setup-swift: reusing swift $(dpkg-query -W -f '${Version}' swift 2>/dev/null) in $(dirname "$(command -v swift-proxy-server)")" >&2
else
  echo "setup-swift: installing swift, swift-proxy, swift-account, swift-container, swift-object and memcached with apt-get (about a minute)" >&2
  "$(dirname "$0")/apt-install.sh" setup-swift swift swift-proxy swift-account swift-container swift-object memcached
fi
for bin in "${bins[@]}"; do
  command -v "$bin" >/dev/null || { echo "setup-swift: $bin is still missing after the install" >&2; exit 1; }
done
dirname "$(command -v swift-proxy-server)"
