#!/usr/bin/env bash
# The crash-safety fault loop at full length: `kill -9` of erebine-lmcache
# during its capacity guard's evictions, of `lmcache-tier housekeep` and of
# `lmcache-tier launch` during their housekeeping deletions, each followed by
# the next run, which checks the tier (tests/e2e/kill_loop.rs).
# scripts/test.sh runs the same test with 8 kills.
#
#   scripts/kill-loop.sh [COUNT [SEED]]    # default 50 kills, a seed from the clock
#
# The seed is printed at the start and in any failure: pass it back to replay
# the same random choices.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
EREBINE_TEST_LMCACHE_VENV="$("$root/scripts/setup-lmcache.sh")"
export EREBINE_TEST_LMCACHE_VENV
export EREBINE_KILL_LOOP_COUNT="${1:-50}"
if [[ $# -ge 2 ]]; then
  export EREBINE_KILL_LOOP_SEED="$2"
fi
cd "$root"
cargo test -p lmcache-tier --test e2e kill_loop:: -- --nocapture
