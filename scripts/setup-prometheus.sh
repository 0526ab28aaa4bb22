#!/usr/bin/env bash
# Makes sure Prometheus's `promtool` and `prometheus` are installed, from
# Debian's `prometheus` package, and prints the path of `promtool` on stdout.
# The metrics tests check a live scrape with `promtool check metrics`.
#
# The package's service is neither started nor left enabled
# (scripts/apt-install.sh): the tests start their own server on loopback.
# Installing needs root, or sudo.
set -euo pipefail
if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
  echo "setup-prometheus: reusing $(command -v promtool)" >&2
else
  echo "setup-prometheus: installing Debian's prometheus package (promtool, prometheus)" >&2
  "$(dirname "$0")/apt-install.sh" setup-prometheus --no-install-recommends prometheus
fi
command -v promtool
