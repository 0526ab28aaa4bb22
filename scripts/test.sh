#!/usr/bin/env bash
# Runs every test: unit, property, integration, and the end-to-end suite
# against the real LMCache 0.5.6 server (installed once by setup-lmcache.sh)
# and real S3 servers (moto in the same environment, s3s-fs installed once by
# setup-s3s-fs.sh), and Prometheus's promtool (setup-prometheus.sh).
# Extra arguments go to `cargo test`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
EREBINE_TEST_LMCACHE_VENV="$("$root/scripts/setup-lmcache.sh")"
export EREBINE_TEST_LMCACHE_VENV
EREBINE_TEST_S3S_FS="$("$root/scripts/setup-s3s-fs.sh")"
export EREBINE_TEST_S3S_FS
EREBINE_TEST_PROMTOOL="$("$root/scripts/setup-prometheus.sh")"
export EREBINE_TEST_PROMTOOL
cd "$root"
cargo test --workspace "$@"
