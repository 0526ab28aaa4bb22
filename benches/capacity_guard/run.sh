#!/usr/bin/env bash
# Capacity guard benchmark, side by side in one run:
# heap per tracked object over a sweep of counts, event throughput against a
# generator thread, CPU at 1,000 events/s, the start-up count of COUNT
# objects against housekeeping's scan, and evicting a fifth of COUNT objects
# against `find ! -newer MARKER -delete` on the same fifth of an identical set.
#
# usage: benches/capacity_guard/run.sh [COUNT=1000000] [EVENTS=50000]
# env:   BENCH_DIR  parent of the scratch directories (default /var/tmp) for
#                   events, cpu and count; EVICT_DIR for the eviction sets
#                   (default /dev/shm: each set is COUNT 1-byte files, 4 KiB
#                   allocated each, and freeing blocks on a `discard` disk
#                   mount swamps the comparison, see the housekeeping bench).
#        MEMORY_COUNTS  the counts of the heap sweep (default below: round
#                   counts, and counts just past a power of two or 7/8 of
#                   one, where a table that doubles is emptiest).
#        GUARD_BASELINE  another build's guard-bench (e.g. of the commit
#                   before a change): the heap sweep, the start-up count and
#                   the eviction run with it too, alternating with this one.
set -euo pipefail
cd "$(dirname "$0")/../.."
COUNT=${1:-1000000}
EVENTS=${2:-50000}
MEMORY_COUNTS=${MEMORY_COUNTS:-"1000 10000 100000 131073 300000 600000 917505 1000000 1048577 2000000 2097153"}
WORK=$(mktemp -d "${BENCH_DIR:-/var/tmp}/guard-bench.XXXXXX")
EWORK=$(mktemp -d "${EVICT_DIR:-/dev/shm}/guard-bench.XXXXXX")
trap 'rm -rf "$WORK" "$EWORK"' EXIT
cargo build --quiet --release -p lmcache-capacity-guard --example guard-bench
BIN=${CARGO_TARGET_DIR:-target}/release/examples/guard-bench
BASE=${GUARD_BASELINE:-}
MAKE="python3 benches/housekeeping/make_tier.py"

# Runs `guard-bench ARGS` with this build, then with the baseline if any,
# each line prefixed by which.
both() {
    "$BIN" "$@" | sed 's/^/this: /'
    if [ -n "$BASE" ]; then "$BASE" "$@" | sed 's/^/baseline: /'; fi
}

echo "# machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(uname -r)"
echo "# volume: $(df -T "$WORK" | awk 'NR==2{print $2}'), eviction sets on $(df -T "$EWORK" | awk 'NR==2{print $2}')"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for n in $MEMORY_COUNTS; do both memory "$n"; done
mkdir "$WORK/events" && "$BIN" events "$WORK/events" "$EVENTS"
mkdir "$WORK/cpu" && "$BIN" cpu "$WORK/cpu" 10
rm -rf "$WORK/events" "$WORK/cpu"

$MAKE "$WORK/count" "$COUNT" count empty
find "$WORK/count" -maxdepth 1 -printf '%f\n' >/dev/null
# this, baseline, baseline, this: each side first once.
both count "$WORK/count"
if [ -n "$BASE" ]; then
    "$BASE" count "$WORK/count" | sed 's/^/baseline: /'
    "$BIN" count "$WORK/count" | sed 's/^/this: /'
fi
rm -rf "$WORK/count"

# Identical sets: the oldest fifth, then a marker, then the rest.
make_set() {
    $MAKE "$1" $((COUNT / 5)) evict-old
    sleep 0.1 && touch "$1.marker" && sleep 0.1
    $MAKE "$1" $((COUNT - COUNT / 5)) evict-new
}
for side in this ${BASE:+baseline}; do
    make_set "$EWORK/$side"
    case $side in
        this) "$BIN" evict "$EWORK/$side" | sed 's/^/this: /' ;;
        baseline) "$BASE" evict "$EWORK/$side" | sed 's/^/baseline: /' ;;
    esac
    echo "# left: $(find "$EWORK/$side" -maxdepth 1 -name '*.data' | wc -l) objects"
    rm -rf "$EWORK/$side"
done
make_set "$EWORK/find"
/usr/bin/time -f "find_delete_s=%e" find "$EWORK/find" -mindepth 1 -maxdepth 1 -name '*.data' ! -newer "$EWORK/find.marker" -delete
echo "# left: $(find "$EWORK/find" -maxdepth 1 -name '*.data' | wc -l) objects"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
