#!/usr/bin/env bash
# Runs the end-to-end smoke tests (the launch, capacity_guard and watch modules
# of tests/e2e)
# against each LMCache version given as arguments (default: 0.5.4 0.5.5 0.5.6
# and 0.5.7rc2, a pre-release, marked as such in the table) and prints a
# table: version, pass/fail per module, seconds spent in setup-lmcache.sh and
# in the tests.
#
#   scripts/compat.sh               # all four
#   scripts/compat.sh 0.5.7rc2      # one
#
# Each version gets its own environment from scripts/setup-lmcache.sh
# (~/.cache/erebine/lmcache-<version>, reused when present). A version not
# installed yet downloads about 6 GB from PyPI (torch and the CUDA libraries)
# and needs about 6.5 GB of disk; that took about 2 minutes here. The tests
# take about 6-7 minutes per version on 2 cores, so all three stable ones with nothing
# installed take about 25 minutes (four: about 33). The first run also builds s3s-fs
# (setup-s3s-fs.sh, about 2 minutes, from crates.io) and the tests.
# Per-version logs go to target/compat/<version>-<test>.log.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(0.5.4 0.5.5 0.5.6 0.5.7rc2)
tests=(launch capacity_guard watch)
logs="$root/target/compat"
mkdir -p "$logs"

EREBINE_TEST_S3S_FS="$(scripts/setup-s3s-fs.sh)"
export EREBINE_TEST_S3S_FS
# Build the tests (and the binaries Cargo builds for them) up front so the
# first version's seconds are mostly its tests.
cargo test -p lmcache-tier --test e2e --no-run
# The tests of module $1, by their exact names (a filter is a substring:
# "watch::" alone would take in inspect_watch:: too).
module_tests() {
  cargo test -q -p lmcache-tier --test e2e -- --list --format terse 2>/dev/null |
    sed -n "s/^\($1::[a-z0-9_]*\): test\$/\1/p"
}

rows=()
for v in "${versions[@]}"; do
  start=$SECONDS
  row="$v"
  # PEP 440 pre-releases and development builds: a, b, rc, dev.
  case "$v" in *[0-9]a[0-9]* | *[0-9]b[0-9]* | *rc[0-9]* | *dev*) row+="(pre-release)" ;; esac
  if venv="$(LMCACHE_VERSION="$v" scripts/setup-lmcache.sh)"; then
    setup=$((SECONDS - start))
    for t in "${tests[@]}"; do
      echo "compat: lmcache $v: $t" >&2
      # shellcheck disable=SC2046 # one argument per test name
      if EREBINE_TEST_LMCACHE_VENV="$venv" cargo test -p lmcache-tier --test e2e -- --exact $(module_tests "$t") >"$logs/$v-$t.log" 2>&1; then
        row+=" pass"
      else
        row+=" FAIL"
        echo "compat: lmcache $v: $t failed, see $logs/$v-$t.log" >&2
      fi
    done
  else
    setup=$((SECONDS - start))
    for t in "${tests[@]}"; do row+=" no-venv"; done
  fi
  rows+=("$row $setup $((SECONDS - start - setup))")
done

{
  echo "version ${tests[*]} setup_s tests_s"
  printf '%s\n' "${rows[@]}"
} | column -t
