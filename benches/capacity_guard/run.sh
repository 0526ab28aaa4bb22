#!/usr/bin/env bash
# Capacity guard benchmark, side by side in one run:
# event throughput against a generator thread, CPU at 1,000 events/s, heap
# per tracked object, the start-up count of COUNT objects against
# housekeeping's scan, and evicting a fifth of COUNT objects against
# `find ! -newer MARKER -delete` on the same fifth of an identical set.
#
# usage: benches/capacity_guard/run.sh [COUNT=1000000] [EVENTS=50000]
# env:   BENCH_DIR  parent of the scratch directories (default /var/tmp) for
#                   events, cpu and count; EVICT_DIR for the eviction sets
#                   (default /dev/shm: each set is COUNT 1-byte files, 4 KiB
#                   allocated each, and freeing blocks on a `discard` disk
#                   mount swamps the comparison, see the housekeeping bench).
set -euo pipefail
cd "$(dirname "$0")/../.."
COUNT=${1:-1000000}
EVENTS=${2:-50000}
WORK=$(mktemp -d "${BENCH_DIR:-/var/tmp}/guard-bench.XXXXXX")
EWORK=$(mktemp -d "${EVICT_DIR:-/dev/shm}/guard-bench.XXXXXX")
trap 'rm -rf "$WORK" "$EWORK"' EXIT
cargo build --quiet --release -p lmcache-capacity-guard --example guard-bench
BIN=${CARGO_TARGET_DIR:-target}/release/examples/guard-bench
MAKE="python3 benches/housekeeping/make_tier.py"

echo "# machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(uname -r)"
echo "# volume: $(df -T "$WORK" | awk 'NR==2{print $2}'), eviction sets on $(df -T "$EWORK" | awk 'NR==2{print $2}')"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$BIN" memory "$COUNT"
mkdir "$WORK/events" && "$BIN" events "$WORK/events" "$EVENTS"
mkdir "$WORK/cpu" && "$BIN" cpu "$WORK/cpu" 10
rm -rf "$WORK/events" "$WORK/cpu"

$MAKE "$WORK/count" "$COUNT" count empty
find "$WORK/count" -maxdepth 1 -printf '%f\n' >/dev/null
for round in 1 2; do "$BIN" count "$WORK/count"; done
rm -rf "$WORK/count"

# Two identical sets: the oldest fifth, then a marker, then the rest.
make_set() {
    $MAKE "$1" $((COUNT / 5)) evict-old
    sleep 0.1 && touch "$1.marker" && sleep 0.1
    $MAKE "$1" $((COUNT - COUNT / 5)) evict-new
}
make_set "$EWORK/ours"
"$BIN" evict "$EWORK/ours"
echo "# left: $(find "$EWORK/ours" -maxdepth 1 -name '*.data' | wc -l) objects"
rm -rf "$EWORK/ours"
make_set "$EWORK/find"
/usr/bin/time -f "find_delete_s=%e" find "$EWORK/find" -mindepth 1 -maxdepth 1 -name '*.data' ! -newer "$EWORK/find.marker" -delete
echo "# left: $(find "$EWORK/find" -maxdepth 1 -name '*.data' | wc -l) objects"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
