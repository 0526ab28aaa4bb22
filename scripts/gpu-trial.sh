#!/usr/bin/env bash
# The GPU-node trial: the launcher with the real LMCache 0.5.6 server and
# LMCache's own GPU client, on a node with an NVIDIA GPU and no package
# index. Run scripts/gpu-trial-prepare.sh first (it fills .gpu-trial/), then
# this from the checkout's root on the GPU node. CI never runs it.
#
# It installs LMCache into the node's python3 environment, then checks:
#  1. the plan on this GPU node: --max-gpu-workers is the TP size; when the
#     shipped lmcache.cuda_ops does not load with the node's torch, the plan
#     warns (naming torch, the extension, the error); cuda_ops is then
#     rebuilt from LMCache's sources and the warning is gone. A later run on
#     the same node finds that rebuilt copy installed (pip keeps an
#     installed LMCache of the same version) and says so: the shipped copy
#     is then not tried, unless --reinstall puts it back first;
#  2. `lmcache-tier launch`, then `lmcache bench server --mode gpu`: every
#     checksum matches, the objects are on disk (no temp files left), and
#     the bench's clean unregistration is logged as a detach, never a loss;
#  3. a restart over the kept tier: inspect's usage is what is on disk while
#     LMCache's own count starts from 0, and every cold lookup hits, the data
#     read back equal to what was stored;
#  4. SIGTERM: exit 0, no LMCache process left, the port closed.
# trial.log and summary.json go to $OUT (or /tmp/gpu-trial-out), and every
# plan, log and report of the steps to details.tar.gz beside them. It works
# in /tmp/gpu-trial (removed first; it refuses while a process still runs
# from there), needs ports 6555 and 8090 free, and installs the wheels into
# the environment of the node's python3: run it on a machine that is yours
# to change, never on a serving node. It stops only the processes it
# started, by their ids. Exit status: 0 passed, 1 a check failed, 2 bad
# arguments.
#
# --tp-size N    the engine's tensor-parallel size: the plan must give
#                --max-gpu-workers N and the bench runs N workers (default 1)
# --requests N   bench requests, one 1024-token chunk each (default 20)
# --reinstall    install the LMCache wheel again even when the same version
#                is installed, so the shipped cuda_ops is the one tried
# --install-only install LMCache (and rebuild cuda_ops where needed), unpack
#                the binaries to /tmp/gpu-trial/bin, plan, then stop: what
#                scripts/vllm-trial.sh needs before it runs vLLM
# --rehearse     the same steps on a CPU machine before spending GPU time:
#                LMCache comes from $VIRTUAL_ENV, the bench runs in CPU
#                mode, cuda_ops is not rebuilt. The plan must still see a
#                GPU; as root, in a mount namespace of its own:
#                unshare -m --propagation private sh -c 'mount -t tmpfs gpu
#                /proc/driver && mkdir -p /proc/driver/nvidia/gpus/0 &&
#                exec scripts/gpu-trial.sh --rehearse'
#
# Usage: scripts/gpu-trial.sh [--tp-size N] [--requests N] [--reinstall] [--install-only] [--rehearse]
set -euo pipefail

usage() { sed -n '/^# The GPU-node trial/,/^# Usage/s/^# \{0,1\}//p' "$0"; }
value() {
  [ -n "${2:-}" ] || { echo "gpu-trial: $1 needs a value (see --help)" >&2; exit 2; }
  echo "$2"
}

TP=1
REQUESTS=20
REHEARSE=false
REINSTALL=false
INSTALL_ONLY=false
while [ $# -gt 0 ]; do
  case "$1" in
    --tp-size) TP=$(value "$@"); shift 2 ;;
    --requests) REQUESTS=$(value "$@"); shift 2 ;;
    --reinstall) REINSTALL=true; shift ;;
    --install-only) INSTALL_ONLY=true; shift ;;
    --rehearse) REHEARSE=true; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu-trial: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if $REHEARSE && $REINSTALL; then
  echo "gpu-trial: --rehearse installs nothing, so it takes no --reinstall" >&2
  exit 2
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
KIT=$ROOT/.gpu-trial
OUTPUT=${OUT:-/tmp/gpu-trial-out}
WORK=/tmp/gpu-trial
RESULTS=$WORK/results
MP_PORT=6555
HTTP_PORT=8090
# from_work: the processes still running from $WORK.
. "$ROOT/scripts/trial-processes.sh"
left=$(from_work)
if [ -n "$left" ]; then
  echo "gpu-trial: processes still run from $WORK; stop them before a new trial:" >&2
  echo "$left" >&2
  exit 1
fi
rm -rf "$WORK"
mkdir -p "$OUTPUT" "$RESULTS" "$WORK/bin" "$WORK/home"
exec > >(tee "$OUTPUT/trial.log") 2>&1
SECONDS=0

step() { echo "== [${SECONDS}s] $*"; }
keep_details() { tar -czf "$OUTPUT/details.tar.gz" -C "$RESULTS" . 2>/dev/null || true; }
# descendants PID: the processes under PID, by their parent ids.
descendants() {
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}
launch_pid=
# Stops the launch this script started, if it still runs: SIGTERM to its
# pid, then, after 30 s, SIGKILL to it and to the processes under it.
stop_started() {
  [ -n "$launch_pid" ] && kill -0 "$launch_pid" 2>/dev/null || return 0
  local tree pid
  tree=$(descendants "$launch_pid")
  kill -TERM "$launch_pid" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$launch_pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$launch_pid" 2>/dev/null; then
    echo "the launch (pid $launch_pid) did not stop in 30 s of SIGTERM: SIGKILL to it and its processes"
    for pid in "$launch_pid" $tree; do kill -KILL "$pid" 2>/dev/null || true; done
  fi
  wait "$launch_pid" 2>/dev/null || true
  launch_pid=
}
fail() {
  echo "TRIAL FAILED: $*"
  stop_started
  keep_details
  exit 1
}
# json FILE EXPR: prints EXPR evaluated on the JSON in FILE (as `d`).
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

[ -d "$KIT/bin" ] || fail "no $KIT: run scripts/gpu-trial-prepare.sh and carry .gpu-trial"
BENCH_MODE=(--mode gpu)
if $REHEARSE; then
  PY=${VIRTUAL_ENV:?--rehearse needs VIRTUAL_ENV}/bin/python3
  BENCH_MODE=(--mode cpu --transfer-mode lmcache_driven)
else
  PY=$(command -v python3)
fi
PREFIX=$("$PY" -c 'import sys; print(sys.prefix)')
LMCACHE_WHEEL=$(find "$KIT/wheels" -maxdepth 1 -name 'lmcache-0.5.6-*.whl' | head -1)
[ -n "$LMCACHE_WHEEL" ] || fail "no LMCache 0.5.6 wheel in $KIT/wheels: run scripts/gpu-trial-prepare.sh again"

step "node"
nvidia-smi -L || true
"$PY" -c 'import torch; print("torch", torch.__version__, "GPUs", torch.cuda.device_count())'

if ! $REHEARSE; then
  step "install LMCache 0.5.6 and what it needs into $PREFIX"
  "$PY" -m pip install -q --no-index --no-deps --no-cache-dir --no-compile "$KIT"/wheels/*.whl
  if $REINSTALL; then
    echo "installing the LMCache wheel again: the shipped cuda_ops is the one tried"
    "$PY" -m pip install -q --no-index --no-deps --no-cache-dir --no-compile --force-reinstall "$LMCACHE_WHEEL"
  fi
fi
[ -x "$PREFIX/bin/lmcache" ] || fail "no $PREFIX/bin/lmcache"
PACKAGE=$("$PY" -c 'import importlib.util as u; print(list(u.find_spec("lmcache").submodule_search_locations)[0])')
# A rebuild leaves this beside the copy it installed: the copy's sha256 and
# the torch it was built against.
REBUILT_MARK=$PACKAGE/cuda_ops.rebuilt-on-this-node
for bin in lmcache-tier erebine-lmcache; do
  gunzip -c "$KIT/bin/$bin.gz" > "$WORK/bin/$bin"
  chmod +x "$WORK/bin/$bin"
done

export VIRTUAL_ENV=$PREFIX HOME=$WORK/home
export EREBINE_AGENT_KV_CACHE_BACKEND=lmcache
export EREBINE_AGENT_LMCACHE_DISK_PATH=$WORK/cache
export EREBINE_AGENT_LMCACHE_MP_PORT=$MP_PORT EREBINE_AGENT_LMCACHE_HTTP_PORT=$HTTP_PORT
export LMCACHE_TRACK_USAGE=false LMCACHE_DISABLE_BANNER=1
LAUNCH=("$WORK/bin/lmcache-tier" launch --model test-model --tensor-parallel-size "$TP")

# plan NAME: the dry run's JSON in $RESULTS/NAME.json.
plan() {
  "${LAUNCH[@]}" --dry-run --json > "$RESULTS/$1.json" 2> "$RESULTS/$1.log" ||
    fail "the dry run failed: $(cat "$RESULTS/$1.log")"
}
gpu_warnings() { json "$1" '"\n".join(w for w in d["decisions"]["warnings"] if "GPU" in w)'; }

# cuda_ops_copy: which lmcache.cuda_ops is installed: "shipped" (the
# wheel's own bytes), "rebuilt" (the copy a rebuild on this node left, per
# its mark), "missing", or "unknown" (neither).
cuda_ops_copy() {
  local wheel=$LMCACHE_WHEEL
  $REHEARSE && wheel=
  "$PY" - "$PACKAGE" "$REBUILT_MARK" "$wheel" <<'PY'
import glob, hashlib, os, sys, zipfile
package, mark, wheel = sys.argv[1:]
installed = sorted(glob.glob(os.path.join(package, "cuda_ops.*.so")))
if not installed:
    print("missing")
    sys.exit()
digest = hashlib.sha256(open(installed[0], "rb").read()).hexdigest()
rebuilt = open(mark).read().split()[0] if os.path.exists(mark) else None
if wheel:
    with zipfile.ZipFile(wheel) as z:
        shipped = {hashlib.sha256(z.read(n)).hexdigest() for n in z.namelist()
                   if n.startswith("lmcache/cuda_ops.") and n.endswith(".so")}
    print("shipped" if digest in shipped else "rebuilt" if digest == rebuilt else "unknown")
else:
    # --rehearse: the environment's copy came from its own wheel.
    print("rebuilt" if digest == rebuilt else "shipped")
PY
}

step "plan on this node"
copy=$(cuda_ops_copy)
case "$copy" in
  shipped) echo "lmcache.cuda_ops installed: the copy the wheel shipped" ;;
  rebuilt) echo "lmcache.cuda_ops installed: the copy an earlier run rebuilt on this node ($(cut -d' ' -f2- "$REBUILT_MARK")); the shipped copy is not tried (--reinstall tries it)" ;;
  missing) fail "no lmcache.cuda_ops in $PACKAGE" ;;
  *) echo "lmcache.cuda_ops installed: neither the wheel's copy nor one rebuilt by this script" ;;
esac
plan plan-installed
json "$RESULTS/plan-installed.json" 'd["facts"]["gpu"]'
workers=$(json "$RESULTS/plan-installed.json" 'd["argv"][d["argv"].index("--max-gpu-workers") + 1]')
[ "$workers" = "$TP" ] || fail "the plan gives --max-gpu-workers $workers for TP $TP"
installed=$(json "$RESULTS/plan-installed.json" 'd["facts"]["gpu"]["extensions"]["state"]')
cuda_ops_failed=$(json "$RESULTS/plan-installed.json" \
  'any(f["extension"] == "lmcache.cuda_ops" for f in d["facts"]["gpu"]["extensions"].get("failures", []))')
warning=$(gpu_warnings "$RESULTS/plan-installed.json")
if [ "$copy" = shipped ]; then
  shipped=$installed
  echo "shipped extensions: $shipped; warning: ${warning:-none}"
else
  shipped="not tried"
  echo "extensions with the $copy cuda_ops: $installed; warning: ${warning:-none}"
fi
if [ "$cuda_ops_failed" = True ]; then
  torch=$(json "$RESULTS/plan-installed.json" 'd["facts"]["gpu"]["extensions"]["torch"]')
  case "$warning" in
    *"torch $torch"*lmcache.cuda_ops*Error*) ;;
    *) fail "cuda_ops does not load but the warning does not name torch, the extension and the error: $warning" ;;
  esac
fi
if [ "$cuda_ops_failed" = True ] && ! $REHEARSE; then

  step "rebuild lmcache.cuda_ops from LMCache's sources against torch $torch (sm_90)"
  mkdir -p "$WORK/src"
  tar -xzf "$KIT/csrc.tar.gz" -C "$WORK/src"
  TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=$(nproc) "$PY" - "$WORK/src/csrc" "$PACKAGE" "$REBUILT_MARK" <<'PY'
import glob, hashlib, os, shutil, sys, sysconfig
import torch
from torch.utils import cpp_extension
csrc, package, mark = sys.argv[1:]
sources = [os.path.join(csrc, "cuda", name) for name in (
    "pybind.cpp", "mem_kernels.cu", "mp_mem_kernels.cu", "phase_timing_recorder.cu",
    "blend_kernels.cu", "cal_cdf.cu", "ac_enc.cu", "ac_dec.cu", "pos_kernels.cu",
    "mem_alloc.cpp", "utils.cpp", "event_recorder.cpp", "completion_recorder.cpp")]
build = "/tmp/gpu-trial/cuda_ops-build"
os.makedirs(build, exist_ok=True)
cpp_extension.load(name="cuda_ops", sources=sources, extra_include_paths=[csrc],
                   extra_cuda_cflags=["--threads=4"], build_directory=build,
                   is_python_module=True, verbose=False)
suffix = sysconfig.get_config_var("EXT_SUFFIX")
for old in glob.glob(os.path.join(package, "cuda_ops.*.so")):
    os.remove(old)
target = os.path.join(package, "cuda_ops" + suffix)
shutil.copy(os.path.join(build, "cuda_ops.so"), target)
with open(mark, "w") as f:
    f.write(f"{hashlib.sha256(open(target, 'rb').read()).hexdigest()} against torch {torch.__version__}\n")
print("rebuilt", target)
PY
  copy="rebuilt in this run"
  plan plan-rebuilt
  rebuilt=$(json "$RESULTS/plan-rebuilt.json" 'd["facts"]["gpu"]["extensions"]["state"]')
  [ "$rebuilt" = loaded ] || fail "after the rebuild the extensions are $rebuilt"
  [ -z "$(gpu_warnings "$RESULTS/plan-rebuilt.json")" ] || fail "a GPU warning after the rebuild"
  echo "after the rebuild: extensions $rebuilt, no warning"
fi

if $INSTALL_ONLY; then
  keep_details
  step "LMCache installed in $PREFIX (cuda_ops: $copy), binaries in $WORK/bin"
  exit 0
fi

# port_free PORT: true when nothing listens on 127.0.0.1:PORT.
port_free() { ! python3 -c "import socket; socket.create_connection(('127.0.0.1', $1), 1)" 2>/dev/null; }
for port in "$MP_PORT" "$HTTP_PORT"; do
  port_free "$port" || fail "port $port is taken: another server runs on this node; the trial needs 6555 and 8090"
done

# wait_ready LOG: seconds until /status answers 200 (at most 300).
wait_ready() {
  local start=$SECONDS
  until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$HTTP_PORT/status', timeout=2)" 2>/dev/null; do
    kill -0 "$launch_pid" 2>/dev/null || fail "the launch ended: $(tail -20 "$1")"
    [ $((SECONDS - start)) -lt 300 ] || fail "not ready in 300 s: $(tail -20 "$1")"
    sleep 0.5
  done
  echo "/status answers after $((SECONDS - start)) s"
}
start_launch() {
  "${LAUNCH[@]}" > "$RESULTS/$1" 2>&1 &
  launch_pid=$!
  wait_ready "$RESULTS/$1"
}
# stop_launch: SIGTERM to the launch; it must exit 0 and leave none of the
# processes it started.
stop_launch() {
  local start=$SECONDS status=0 tree pid alive=
  tree=$(descendants "$launch_pid")
  kill -TERM "$launch_pid"
  wait "$launch_pid" || status=$?
  launch_pid=
  [ "$status" = 0 ] || fail "the launch exited $status on SIGTERM"
  sleep 1
  for pid in $tree; do
    kill -0 "$pid" 2>/dev/null && alive="$alive $pid ($(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null))"
  done
  [ -z "$alive" ] || fail "the launch exited but left running:$alive"
  echo "stopped in $((SECONDS - start)) s, exit 0, none of its $(echo "$tree" | wc -w) processes left"
}
bench() {
  "$PREFIX/bin/lmcache" bench server "${BENCH_MODE[@]}" --tp-size "$TP" \
    --rpc-url "tcp://127.0.0.1:$MP_PORT" --url "http://127.0.0.1:$HTTP_PORT" \
    --start 0 --end "$REQUESTS" --interval 0.1 --num-tokens 1024 > "$RESULTS/$1" 2>&1 ||
    fail "the bench failed: $(tail -20 "$RESULTS/$1")"
  sed -i 's/\x1b\[[0-9;]*m//g' "$RESULTS/$1"
}
inspect_json() {
  "$WORK/bin/lmcache-tier" inspect --json --url "http://127.0.0.1:$HTTP_PORT/status" > "$RESULTS/$1" ||
    fail "inspect failed"
}

step "launch and the GPU bench ($REQUESTS requests, TP $TP)"
start_launch launch-1.log
bench bench-1.log
matched=$(grep -c "CHECKSUM MATCH OK" "$RESULTS/bench-1.log" || true)
[ "$matched" = "$REQUESTS" ] || fail "$matched of $REQUESTS checksums matched"
grep -c "UNREGISTER_KV_CACHE: OK" "$RESULTS/bench-1.log" | grep -qx "$TP" || fail "not every worker unregistered"
for _ in $(seq 20); do grep -q "engine workers detached" "$RESULTS/launch-1.log" && break; sleep 0.5; done
grep "engine workers" "$RESULTS/launch-1.log" || true
grep -q "engine workers attached: $TP" "$RESULTS/launch-1.log" || fail "$TP workers never attached"
grep -q "engine workers detached: [0-9]* -> 0" "$RESULTS/launch-1.log" || fail "no detach logged"
! grep -q "engine workers lost" "$RESULTS/launch-1.log" || fail "a clean detach was logged as a loss"
objects=$(find "$WORK/cache" -maxdepth 1 -name '*.data' | wc -l)
temps=$(find "$WORK/cache" -maxdepth 1 -name '*.tmp' | wc -l)
if [ "$objects" -lt "$REQUESTS" ] || [ "$temps" != 0 ]; then fail "$objects objects and $temps temp files on disk"; fi
echo "$matched checksums matched; $objects objects on disk ($(du -sh "$WORK/cache" | cut -f1)), no temp file"
inspect_json inspect-1.json
stop_launch

step "restart over the kept tier"
start_launch launch-2.log
grep -m1 "housekeeping" "$RESULTS/launch-2.log" || true
inspect_json inspect-2.json
json "$RESULTS/inspect-2.json" '{k: d["tiers"][0][k] for k in ("type", "used_bytes", "used_source", "lmcache_used_bytes")}'
[ "$(json "$RESULTS/inspect-2.json" 'd["tiers"][0]["used_source"]')" = disk ] || fail "inspect's usage is not from disk"
[ "$(json "$RESULTS/inspect-2.json" 'd["tiers"][0]["lmcache_used_bytes"]')" = 0 ] || fail "LMCache's count is not 0 after the restart"
bench bench-2.log
hits=$(grep "/cold] LOOKUP:" "$RESULTS/bench-2.log" | awk '{split($4, h, "/"); if (h[1] == h[2] && h[1] > 0) n++} END {print n+0}')
[ "$hits" = "$REQUESTS" ] || fail "$hits of $REQUESTS cold lookups hit after the restart"
checksums() { grep "/$2] CHECKSUM:" "$RESULTS/$1" | awk '{split($2, s, "/"); print s[1], $4}' | sort; }
stored=$(checksums bench-1.log cold)
read_back=$(checksums bench-2.log warm)
[ -n "$stored" ] || fail "no checksum in the first bench's output"
[ "$stored" = "$read_back" ] || fail "the data read back after the restart differs from what was stored"
echo "$hits of $REQUESTS cold lookups hit; the data read back equals what was stored"
stop_launch

step "nothing left"
left=$(from_work)
[ -z "$left" ] || fail "left running: $left"
port_free "$HTTP_PORT" || fail "port $HTTP_PORT still open"

p50() { grep "$2" "$RESULTS/$1" | grep -o '[0-9.]* ms' | awk '{print $1}' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
python3 - "$OUTPUT" "$TP" "$REQUESTS" "$shipped" "$copy" "$SECONDS" \
  "$(p50 bench-1.log '/cold] STORE')" "$(p50 bench-1.log '/warm] RETRIEVE')" \
  "$(p50 bench-1.log '/warm] LOOKUP')" "$(p50 bench-2.log '/cold] LOOKUP')" \
  "$(grep -o 'ready in [0-9.]*s' "$RESULTS/launch-1.log" | head -1)" \
  "$(grep -o 'ready in [0-9.]*s' "$RESULTS/launch-2.log" | head -1)" <<'PY'
import json, sys
out, tp, n, shipped, copy, secs, store, retrieve, lookup, cold, ready1, ready2 = sys.argv[1:]
summary = {"tp_size": int(tp), "requests": int(n), "shipped_extensions": shipped,
           "cuda_ops": copy,
           "store_p50_ms": store, "retrieve_p50_ms": retrieve, "warm_lookup_p50_ms": lookup,
           "lookup_after_restart_p50_ms": cold, "first_start": ready1, "restart": ready2,
           "trial_seconds": int(secs)}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(summary, indent=2))
PY
keep_details
step "TRIAL PASSED"
