#!/usr/bin/env bash
# Runs every test: unit, property, integration, and the end-to-end suite
# against the real LMCache 0.5.6 server (installed once by setup-lmcache.sh).
# Extra arguments go to `cargo test`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
EREBINE_TEST_LMCACHE_VENV="$("$root/scripts/setup-lmcache.sh")"
export EREBINE_TEST_LMCACHE_VENV
cd "$root"
cargo test --workspace "$@"
