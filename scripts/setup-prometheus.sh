#!/usr/bin/env bash
# Makes sure Prometheus's `promtool` and `prometheus` are installed, from
# Debian's `prometheus` package, and prints the path of `promtool` on stdout.
# The metrics tests check a live scrape with `promtool check metrics`.
#
# The package is installed without starting its service (the tests start
# their own server on loopback). Installing needs root, or sudo.
set -euo pipefail
if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
  echo "setup-prometheus: reusing $(command -v promtool)" >&2
else
  echo "setup-prometheus: installing Debian's prometheus package (promtool, prometheus)" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup-prometheus: run as root, or install the prometheus package" >&2; exit 1; }
    sudo=sudo
  fi
  # policy-rc.d keeps the package's service from starting, where the
  # system would start it.
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y --no-install-recommends prometheus >&2 \
    || { $sudo apt-get update >&2 && $sudo apt-get install -y --no-install-recommends prometheus >&2; }
fi
command -v promtool
