#!/usr/bin/env bash
# The node's main job on this machine, from nothing: installs the real LMCache
# (once), builds the binaries, and runs `lmcache-tier launch` with the embedded
# defaults (EREBINE_AGENT_* variables you set are honoured). Stop it with Ctrl-C.
# Extra arguments go to `lmcache-tier launch` (try --help, or --dry-run --json).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$("$root/scripts/setup-lmcache.sh")"
cargo build --release -p lmcache-tier --bins --manifest-path "$root/Cargo.toml"
export VIRTUAL_ENV="$venv"
# The node's default backend is native (no cache server); this script is for
# the lmcache backend unless you say otherwise.
export EREBINE_AGENT_KV_CACHE_BACKEND="${EREBINE_AGENT_KV_CACHE_BACKEND:-lmcache}"
# Where cargo put it: CARGO_TARGET_DIR (relative to here) when set.
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
exec "$target/release/lmcache-tier" launch "$@"
