#!/usr/bin/env bash
# Housekeeping benchmark: scan + plan of a tier of
# COUNT objects against `find -printf` and a plain-Python reference, side by
# side in the same run, then deleting DELETE_COUNT objects against
# `find -delete` on an identical set. Prints one line per run and a summary.
#
# usage: benches/housekeeping/run.sh [COUNT=1000000] [DELETE_COUNT=500000] [ROUNDS=3]
# env:   BENCH_DIR  parent of the scratch directories (default /var/tmp);
#                   put it on the volume you want to measure.
#        PARTS      which parts to run (default "scan delete").
#
# Files: names from make_tier.py (80% objects of the launch's model, 10% of
# another, 5% `bench l2`, 3% stale .tmp, 2% foreign); object and temp files
# hold 1 byte (one 4 KiB block on ext4), foreign files are empty; the delete
# sets are all empty files (freeing blocks on a `discard` mount costs the
# same to both and swamps the comparison: rm -rf of the 1M-file tier with
# blocks took over 10 minutes here). Page cache
# warm: a first `find` pass reads the directory before the timed rounds.
set -euo pipefail
cd "$(dirname "$0")/../.."

COUNT=${1:-1000000}
DELETE_COUNT=${2:-500000}
ROUNDS=${3:-3}
PARTS=${PARTS:-scan delete}
WORK=$(mktemp -d "${BENCH_DIR:-/var/tmp}/housekeeping-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

cargo build --quiet --release -p lmcache-housekeeping --example housekeeping-bench
BIN=${CARGO_TARGET_DIR:-target}/release/examples/housekeeping-bench
MAKE="python3 benches/housekeeping/make_tier.py"
REF="python3 benches/housekeeping/scan_reference.py"

echo "# machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(uname -r)"
echo "# volume: $(df -T "$WORK" | awk 'NR==2{print $2}') $(findmnt -no OPTIONS -T "$WORK" 2>/dev/null || true)"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"

# timed LABEL CMD...: runs CMD with stdout to /dev/null, prints wall s and peak RSS.
timed() {
    local label=$1
    shift
    /usr/bin/time -f "%e %M" -o "$WORK/time" "$@" >/dev/null
    read -r wall rss <"$WORK/time"
    echo "$label wall_s=$wall max_rss_kb=$rss"
}

if [[ " $PARTS " == *" scan "* ]]; then
echo "# creating $COUNT files in $WORK/tier"
start=$(date +%s)
$MAKE "$WORK/tier" "$COUNT"
echo "# created in $(($(date +%s) - start)) s"
find "$WORK/tier" -maxdepth 1 -printf '%s %T@ %f\n' >/dev/null

for round in $(seq 1 "$ROUNDS"); do
    timed "scan round=$round find-printf" find "$WORK/tier" -maxdepth 1 -printf '%s %T@ %f\n'
    timed "scan round=$round python-reference" $REF "$WORK/tier"
    timed "scan round=$round housekeeping" "$BIN" scan "$WORK/tier"
done
"$BIN" scan "$WORK/tier"
$REF "$WORK/tier"
rm -rf "$WORK/tier"
fi

if [[ " $PARTS " == *" delete "* ]]; then
for round in 1 2; do
    echo "# creating two identical sets of $DELETE_COUNT files"
    $MAKE "$WORK/find-set" "$DELETE_COUNT" "delete-$round" empty
    $MAKE "$WORK/our-set" "$DELETE_COUNT" "delete-$round" empty
    find "$WORK/find-set" "$WORK/our-set" -maxdepth 1 -printf '%f\n' >/dev/null
    if [ "$round" = 1 ]; then
        timed "delete round=$round find-delete" find "$WORK/find-set" -mindepth 1 -maxdepth 1 -delete
        timed "delete round=$round housekeeping" "$BIN" delete "$WORK/our-set"
    else
        timed "delete round=$round housekeeping" "$BIN" delete "$WORK/our-set"
        timed "delete round=$round find-delete" find "$WORK/find-set" -mindepth 1 -maxdepth 1 -delete
    fi
    echo "# left after delete: find-set $(find "$WORK/find-set" -mindepth 1 | wc -l), our-set $(find "$WORK/our-set" -mindepth 1 | wc -l) (the foreign 2%)"
    rm -rf "$WORK/find-set" "$WORK/our-set"
done
fi
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
