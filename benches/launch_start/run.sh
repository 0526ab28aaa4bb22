#!/usr/bin/env bash
# Launch benchmark: on a tier of COUNT same-identity objects, side by side in
# one run, ROUNDS times each:
#   - one housekeeping scan of the tier (the release example);
#   - the stock `lmcache server` start on an empty tier, to /status 200;
#   - `lmcache-tier launch` on the full tier: the time from its start to the
#     start of the real server's process (python running `lmcache server`),
#     and to /status 200.
# Targets (docs/performance.md): the server's process starts within 1.15 x
# one scan plus process start-up; launch to ready is at most the stock start
# plus 1.15 x one scan.
#
# usage: benches/launch_start/run.sh [COUNT=1000000] [ROUNDS=3]
# env:   BENCH_DIR  parent of the scratch directory (default /var/tmp);
#        EREBINE_LMCACHE_VENV  the LMCache virtual environment
#        (default: what scripts/setup-lmcache.sh prints).
set -euo pipefail
cd "$(dirname "$0")/../.."
COUNT=${1:-1000000}
ROUNDS=${2:-3}
WORK=$(mktemp -d "${BENCH_DIR:-/var/tmp}/launch-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
VENV=${EREBINE_LMCACHE_VENV:-$(scripts/setup-lmcache.sh)}
cargo build --quiet --release -p lmcache-tier --bins
cargo build --quiet --release -p lmcache-housekeeping --example housekeeping-bench
echo "# machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(uname -r)"
echo "# volume: $(df -T "$WORK" | awk 'NR==2{print $2}')"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
exec python3 benches/launch_start/bench.py "$WORK" "$COUNT" "$ROUNDS" "$VENV" "${CARGO_TARGET_DIR:-target}/release"
