#!/usr/bin/env bash
# The vLLM trial on a GPU node: vLLM 0.26.0 with LMCache 0.5.6's MP
# connector against the LMCache server that `lmcache-tier launch` plans and
# supervises, on a node with an NVIDIA GPU and no package index. Run
# scripts/vllm-trial-prepare.sh and scripts/gpu-trial-prepare.sh first (they
# fill .vllm-trial/ and .gpu-trial/), then this from the checkout's root on
# the GPU node. CI never runs it.
#
# Steps:
#  1. stash: each part of .vllm-trial/parts in this copy goes, checked
#     against SHA256SUMS, to /tmp/vllm-trial-kit, where the parts brought by
#     earlier copies wait; --stash stops here. With every part there, the
#     kit is joined, checked whole and installed into
#     /tmp/vllm-trial-kit/site (once per kit);
#  2. LMCache: the install scripts/gpu-trial.sh left on the node (LMCache
#     0.5.6 whose cuda_ops loads), else scripts/gpu-trial.sh --install-only
#     from .gpu-trial/; the binaries from .gpu-trial/bin, else the ones
#     gpu-trial.sh left in /tmp/gpu-trial/bin;
#  3. the model of --shape: `small` is scripts/vllm-trial/config.json (a
#     Qwen2 of 8 layers, 2 KV heads of 128: 8 KiB of KV a token), `7b` is
#     config-7b.json (Qwen2-7B's shape: 28 layers, 4 KV heads of 128,
#     57,344 bytes of KV a token, 7.6G parameters), with seeded random
#     weights drawn on the node's GPU (engine.py says why not vLLM's dummy
#     weights), kept in /tmp/vllm-trial-kit/model-<shape> for the next run;
#  4. engine "cold", LMCache off (no kv_transfer_config): each prompt
#     twice, then the first prompt with its first 1024 tokens changed (how
#     far the logprobs move when the context differs); --no-cold skips it;
#  5. `lmcache-tier launch --model <the model's directory>`, the --model
#     vLLM gets; engine "lmcache": each prompt twice (the first computes and
#     stores it, the second loads it from L1); the objects reach the disk;
#  6. SIGTERM, then a new launch over the kept disk tier and a new engine
#     "disk": each prompt --disk-runs times (the first loads it from the
#     disk tier; the next, with the plan's L2 prefetch policy `retain`,
#     from L1); SIGTERM;
#  7. with --read-probe, the volume's read limit: O_DIRECT reads of 4 MiB
#     over the tier's objects at 1, 4, 16 and 64 parallel streams, beside
#     the rates the server logged while it loaded them.
# With --reseed, steps 4 to 6 are replaced by the cache identity's trial:
# weights of seed 1000; a launch and engine "lmcache" store each prompt;
# SIGTERM; other weights of the same shapes and size (seed 5000) written
# over model.safetensors at the same path; engine "cold-new" (LMCache off)
# on them; a new launch over the kept disk tier and engine "reseeded". It
# passes when the reseeded runs give the cold-new tokens with logprobs
# within the tolerance and nothing was loaded from the disk tier
# (num_cached_tokens 0, no key from L2): what a launch whose identity does
# not cover the weights fails (summary.json says what it served).
# Every engine: token-id prompts, enforce_eager, vLLM's own prefix cache
# off, greedy sampling with logprobs, VLLM_USE_FLASHINFER_SAMPLER=0,
# HF_HUB_OFFLINE=1, and a short warm-up request before its runs.
# It passes when, after the restart, each prompt is served with at least its
# whole chunks cached (num_cached_tokens) and the server's log counts them
# in L2 ("N/N retained keys (0 L1, N L2)"), and every run of a prompt
# gives the same tokens with logprobs within --logprob-tolerance of its
# first cold run (its first LMCache run with --no-cold), the cold runs
# among themselves too; the changed context
# must change the first token's top 5 or move its logprobs by more than 10
# times the tolerance, or the comparison could not tell a wrong cache from
# a right one. trial.log and summary.json
# (per prompt: time to first token cold, from L1 and from the disk tier;
# ready times, the counts, the differences, the read probe) go to $OUT (or
# /tmp/vllm-trial-out), every log to details.tar.gz beside them. It works
# in /tmp/vllm-trial (removed first; it refuses while a process still runs
# from there), needs the two ports free and stops only the processes it
# started, by their ids. Exit status: 0 passed, 1 a check failed, 2 bad
# arguments, 3 the kit is not all here yet (the missing parts are named).
#
# --stash                     only step 1's stash: keep the parts in this copy
# --install-only              steps 1 and 2 (the kits installed), then stop
# --vllm-installed            use the vLLM that python3 imports; no kit needed
# --shape small|7b            the model's shape (default small)
# --prompt-tokens N[,N...]    the long prompts (default 8200: 8 chunks of
#                             1024 and a few tokens)
# --max-num-batched-tokens N  the engine's and the launch's (default 2048)
# --chunk N                   the server's chunk size in tokens
#                             (EREBINE_AGENT_LMCACHE_CHUNK_SIZE; default:
#                             the plan's, half of the batched tokens)
# --disk-runs N               runs of each prompt after the restart (default 2)
# --no-cold                   no engine with LMCache off
# --read-probe                measure the volume's read limit (step 7)
# --mp-port N, --http-port N  the server's ports (default 6555 and 8090)
# --logprob-tolerance X       largest logprob difference allowed, in nats
#                             (default 0.001)
# --reseed                    the cache identity's trial (above) instead
# --binaries DIR              lmcache-tier and erebine-lmcache from DIR
#                             (gzipped or not), e.g. an older build
# --dummy-check               also run the prompt and the changed one on
#                             vLLM's dummy weights, LMCache off, to show
#                             what the context moves there
#
# Usage: scripts/vllm-trial.sh [--stash | --install-only] [--vllm-installed] [--reseed] [--binaries DIR] [--shape small|7b] [--prompt-tokens N[,N...]] [--max-num-batched-tokens N] [--chunk N] [--disk-runs N] [--no-cold] [--read-probe] [--mp-port N] [--http-port N] [--logprob-tolerance X] [--dummy-check]
set -euo pipefail

usage() { sed -n '/^# The vLLM trial/,/^# Usage/s/^# \{0,1\}//p' "$0"; }
value() {
  [ -n "${2:-}" ] || { echo "vllm-trial: $1 needs a value (see --help)" >&2; exit 2; }
  echo "$2"
}

STASH_ONLY=false
INSTALL_ONLY=false
VLLM_INSTALLED=false
SHAPE=small
PROMPT_TOKENS=8200
BATCHED=2048
CHUNK_SIZE=
DISK_RUNS=2
COLD=true
READ_PROBE=false
MP_PORT=6555
HTTP_PORT=8090
TOLERANCE=0.001
DUMMY_CHECK=false
RESEED=false
BINARIES=
while [ $# -gt 0 ]; do
  case "$1" in
    --stash) STASH_ONLY=true; shift ;;
    --install-only) INSTALL_ONLY=true; shift ;;
    --vllm-installed) VLLM_INSTALLED=true; shift ;;
    --shape) SHAPE=$(value "$@"); shift 2 ;;
    --prompt-tokens) PROMPT_TOKENS=$(value "$@"); shift 2 ;;
    --max-num-batched-tokens) BATCHED=$(value "$@"); shift 2 ;;
    --chunk) CHUNK_SIZE=$(value "$@"); shift 2 ;;
    --disk-runs) DISK_RUNS=$(value "$@"); shift 2 ;;
    --no-cold) COLD=false; shift ;;
    --read-probe) READ_PROBE=true; shift ;;
    --mp-port) MP_PORT=$(value "$@"); shift 2 ;;
    --http-port) HTTP_PORT=$(value "$@"); shift 2 ;;
    --logprob-tolerance) TOLERANCE=$(value "$@"); shift 2 ;;
    --dummy-check) DUMMY_CHECK=true; shift ;;
    --reseed) RESEED=true; shift ;;
    --binaries) BINARIES=$(value "$@"); shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "vllm-trial: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$PROMPT_TOKENS" in
  '' | ,* | *, | *,,* | *[!0-9,]*) echo "vllm-trial: --prompt-tokens takes whole numbers separated by commas, not $PROMPT_TOKENS" >&2; exit 2 ;;
esac
whole_number() {
  case "$2" in
    '' | *[!0-9]* | 0) echo "vllm-trial: $1 takes a whole number of at least 1, not $2" >&2; exit 2 ;;
  esac
}
whole_number --max-num-batched-tokens "$BATCHED"
whole_number --disk-runs "$DISK_RUNS"
whole_number --mp-port "$MP_PORT"
whole_number --http-port "$HTTP_PORT"
[ -z "$CHUNK_SIZE" ] || whole_number --chunk "$CHUNK_SIZE"
case "$SHAPE" in
  small) CONFIG=config.json; MEMORY_SHARE=0.35 ;;
  7b) CONFIG=config-7b.json; MEMORY_SHARE=0.6 ;;
  *) echo "vllm-trial: --shape takes small or 7b, not $SHAPE" >&2; exit 2 ;;
esac
if $STASH_ONLY && $INSTALL_ONLY; then
  echo "vllm-trial: --stash and --install-only do not go together" >&2
  exit 2
fi
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)" "$TOLERANCE" 2>/dev/null ||
  { echo "vllm-trial: --logprob-tolerance takes a positive number, not $TOLERANCE" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PARTS=$ROOT/.vllm-trial/parts
GPU_KIT=$ROOT/.gpu-trial
STAGE=/tmp/vllm-trial-kit
OUTPUT=${OUT:-/tmp/vllm-trial-out}
WORK=/tmp/vllm-trial
RESULTS=$WORK/results
MODEL=$STAGE/model-$SHAPE
LONGEST=$(echo "$PROMPT_TOKENS" | tr ',' '\n' | sort -n | tail -1)
MAX_MODEL_LEN=$(((LONGEST + 64 + 1023) / 1024 * 1024))
[ "$MAX_MODEL_LEN" -ge 16384 ] || MAX_MODEL_LEN=16384
PY=$(command -v python3)

say() { echo "vllm-trial: $*"; }

# stash: copies the parts in this copy of the checkout to $STAGE/parts,
# each checked against SHA256SUMS, and says which are still missing.
# missing_parts is left holding their names.
missing_parts=
stash() {
  mkdir -p "$STAGE/parts"
  if [ -f "$PARTS/SHA256SUMS" ]; then
    if [ -f "$STAGE/parts/SHA256SUMS" ] && ! cmp -s "$PARTS/SHA256SUMS" "$STAGE/parts/SHA256SUMS"; then
      say "this copy brings another kit than the parts kept in $STAGE: those are dropped"
      rm -f "$STAGE"/parts/vllm-kit.tar.part-* "$STAGE/parts/SHA256SUMS"
    fi
    cp "$PARTS/SHA256SUMS" "$STAGE/parts/SHA256SUMS"
  fi
  [ -f "$STAGE/parts/SHA256SUMS" ] ||
    { say "no SHA256SUMS here or in $STAGE: bring .vllm-trial/parts/SHA256SUMS (scripts/vllm-trial-prepare.sh)"; exit 3; }
  local part name want got brought=
  for part in "$PARTS"/vllm-kit.tar.part-*; do
    [ -f "$part" ] || continue
    name=$(basename "$part")
    want=$(awk -v n="$name" '$2 == n {print $1}' "$STAGE/parts/SHA256SUMS")
    [ -n "$want" ] || { say "$name is not in SHA256SUMS: parts of another kit"; exit 1; }
    got=$(sha256sum "$part" | cut -d' ' -f1)
    [ "$got" = "$want" ] || { say "$name is damaged (sha256 $got, expected $want)"; exit 1; }
    cp "$part" "$STAGE/parts/$name.tmp" && mv "$STAGE/parts/$name.tmp" "$STAGE/parts/$name"
    brought="$brought ${name#vllm-kit.tar.part-}"
  done
  missing_parts=
  local have=0 total=0
  while read -r want name; do
    case "$name" in vllm-kit.tar.part-*) ;; *) continue ;; esac
    total=$((total + 1))
    if [ -f "$STAGE/parts/$name" ] && [ "$(sha256sum "$STAGE/parts/$name" | cut -d' ' -f1)" = "$want" ]; then
      have=$((have + 1))
    else
      missing_parts="$missing_parts $name"
    fi
  done < "$STAGE/parts/SHA256SUMS"
  say "parts brought by this copy:${brought:- none}; $have of $total kept in $STAGE/parts${missing_parts:+; missing:$missing_parts}"
}

if $STASH_ONLY; then
  stash
  exit 0
fi

# from_work: the processes still running from $WORK.
. "$ROOT/scripts/trial-processes.sh"
left=$(from_work)
if [ -n "$left" ]; then
  echo "vllm-trial: processes still run from $WORK; stop them before a new trial:" >&2
  echo "$left" >&2
  exit 1
fi
rm -rf "$WORK"
mkdir -p "$OUTPUT" "$RESULTS" "$WORK/bin" "$WORK/home"
exec > >(tee "$OUTPUT/trial.log") 2>&1
SECONDS=0

step() { echo "== [${SECONDS}s] $*"; }
keep_details() { tar -czf "$OUTPUT/details.tar.gz" -C "$RESULTS" . 2>/dev/null || true; }
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
json() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

step "node"
nvidia-smi -L || true
"$PY" -c 'import torch; print("torch", torch.__version__, "GPUs", torch.cuda.device_count())'

SITE=
if $VLLM_INSTALLED; then
  step "vLLM as python3 has it"
else
  step "the vLLM kit"
  stash
  if [ -n "$missing_parts" ]; then
    echo "the kit is not all here: bring$missing_parts (with .vllm-trial/parts/SHA256SUMS), with --stash or in this run"
    keep_details
    exit 3
  fi
  SITE=$STAGE/site
  whole=$(awk '$2 == "vllm-kit.tar" {print $1}' "$STAGE/parts/SHA256SUMS")
  if [ -f "$SITE/.kit-sha256" ] && [ "$(cat "$SITE/.kit-sha256")" = "$whole" ]; then
    echo "vLLM already installed from this kit in $SITE"
  else
    got=$(cat "$STAGE"/parts/vllm-kit.tar.part-* | sha256sum | cut -d' ' -f1)
    [ "$got" = "$whole" ] || fail "the joined parts are not the kit (sha256 $got, expected $whole)"
    rm -rf "$STAGE/kit" "$SITE"
    mkdir -p "$STAGE/kit"
    cat "$STAGE"/parts/vllm-kit.tar.part-* | tar -xf - -C "$STAGE/kit"
    echo "installing $(find "$STAGE/kit" -name '*.whl' | wc -l) wheels into $SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
      "$STAGE"/kit/vllm-*.whl "$STAGE"/kit/wheels/*.whl > "$RESULTS/pip-install.log" 2>&1 ||
      fail "pip install failed: $(tail -20 "$RESULTS/pip-install.log")"
    echo "$whole" > "$SITE/.kit-sha256"
    rm -rf "$STAGE/kit"
  fi
fi
ENGINE_ENV=(env HOME="$WORK/home" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
  VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 LMCACHE_TRACK_USAGE=false PYTHONUNBUFFERED=1)
[ -z "$SITE" ] || ENGINE_ENV+=(PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}")
"${ENGINE_ENV[@]}" "$PY" -c 'import vllm; print("vllm", vllm.__version__, "from", vllm.__file__)' ||
  fail "vllm does not import"

step "LMCache"
PREFIX=$("$PY" -c 'import sys; print(sys.prefix)')
lmcache_ready() {
  "$PY" -c 'import importlib.metadata as m, torch, lmcache.cuda_ops
assert m.version("lmcache") == "0.5.6"' 2>/dev/null
}
if lmcache_ready && [ -x "$PREFIX/bin/lmcache" ]; then
  echo "LMCache 0.5.6 is installed in $PREFIX and its cuda_ops loads: using it"
elif [ -d "$GPU_KIT/bin" ]; then
  echo "installing it with scripts/gpu-trial.sh --install-only (log: lmcache-install/trial.log)"
  OUT=$RESULTS/lmcache-install "$ROOT/scripts/gpu-trial.sh" --install-only > /dev/null 2>&1 ||
    fail "scripts/gpu-trial.sh --install-only failed: $(tail -20 "$RESULTS/lmcache-install/trial.log")"
  grep -E "cuda_ops|LMCache installed" "$RESULTS/lmcache-install/trial.log" || true
  lmcache_ready || fail "LMCache 0.5.6 with a loading cuda_ops is still not there"
else
  fail "LMCache 0.5.6 with a loading cuda_ops is not installed and there is no $GPU_KIT: bring it (scripts/gpu-trial-prepare.sh) or run scripts/gpu-trial.sh first"
fi
for bin in lmcache-tier erebine-lmcache; do
  if [ -n "$BINARIES" ]; then
    if [ -f "$BINARIES/$bin.gz" ]; then gunzip -c "$BINARIES/$bin.gz" > "$WORK/bin/$bin"
    elif [ -f "$BINARIES/$bin" ]; then cp "$BINARIES/$bin" "$WORK/bin/$bin"
    else fail "no $bin in $BINARIES"; fi
  elif [ -f "$GPU_KIT/bin/$bin.gz" ]; then
    gunzip -c "$GPU_KIT/bin/$bin.gz" > "$WORK/bin/$bin"
  elif [ -x "/tmp/gpu-trial/bin/$bin" ]; then
    cp "/tmp/gpu-trial/bin/$bin" "$WORK/bin/$bin"
  else
    fail "no $bin: bring $GPU_KIT or run scripts/gpu-trial.sh first"
  fi
  chmod +x "$WORK/bin/$bin"
done
"$WORK/bin/lmcache-tier" --version
if $INSTALL_ONLY; then
  step "installed: vLLM and LMCache are ready for a trial"
  keep_details
  exit 0
fi

# weights SEED: draws the model's weights of SEED and puts them at
# $MODEL/model.safetensors (the same path and size for every seed).
weights() {
  mkdir -p "$MODEL/new"
  cp "$ROOT/scripts/vllm-trial/$CONFIG" "$MODEL/new/config.json"
  "${ENGINE_ENV[@]}" "$PY" "$ROOT/scripts/vllm-trial/engine.py" --make-weights "$MODEL/new" \
    --weights-seed "$1" || fail "writing the weights failed"
  mv "$MODEL/new/model.safetensors" "$MODEL/model.safetensors"
  mv "$MODEL/new/config.json" "$MODEL/config.json"
  rmdir "$MODEL/new"
}
step "the model ($SHAPE) in $MODEL"
if $RESEED; then
  weights 1000
elif [ -f "$MODEL/model.safetensors" ] && [ ! -f "$MODEL/reseeded" ] &&
  cmp -s "$ROOT/scripts/vllm-trial/$CONFIG" "$MODEL/config.json"; then
  echo "its weights are there from an earlier run"
else
  rm -rf "$MODEL"
  weights 1000
fi
rm -f "$MODEL/reseeded"

export VIRTUAL_ENV=$PREFIX HOME=$WORK/home
export EREBINE_AGENT_KV_CACHE_BACKEND=lmcache
export EREBINE_AGENT_LMCACHE_DISK_PATH=$WORK/cache
export EREBINE_AGENT_LMCACHE_MP_PORT=$MP_PORT EREBINE_AGENT_LMCACHE_HTTP_PORT=$HTTP_PORT
export LMCACHE_TRACK_USAGE=false LMCACHE_DISABLE_BANNER=1
if [ -n "$CHUNK_SIZE" ]; then export EREBINE_AGENT_LMCACHE_CHUNK_SIZE=$CHUNK_SIZE; fi
LAUNCH=("$WORK/bin/lmcache-tier" launch --model "$MODEL" --tensor-parallel-size 1
  --max-num-batched-tokens "$BATCHED")

step "plan"
"${LAUNCH[@]}" --dry-run --json > "$RESULTS/plan.json" 2> "$RESULTS/plan.log" ||
  fail "the dry run failed: $(cat "$RESULTS/plan.log")"
json "$RESULTS/plan.json" 'json.dumps(d["connector_config"])' > "$RESULTS/kv.json"
echo "connector config: $(cat "$RESULTS/kv.json")"
CHUNK=$(json "$RESULTS/plan.json" 'd["argv"][d["argv"].index("--chunk-size") + 1]')
CHUNKS=0
for tokens in ${PROMPT_TOKENS//,/ }; do
  [ $((tokens / CHUNK)) -gt 0 ] || fail "a prompt of $tokens tokens holds no whole chunk of $CHUNK"
  CHUNKS=$((CHUNKS + tokens / CHUNK))
  echo "chunk size $CHUNK: the prompt of $tokens tokens holds $((tokens / CHUNK)) whole chunks ($((tokens / CHUNK * CHUNK)) tokens)"
done
for port in "$MP_PORT" "$HTTP_PORT"; do
  ! "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null ||
    fail "port $port is taken: another server runs on this node; pick others with --mp-port and --http-port"
done

wait_ready() {
  local start=$SECONDS
  until "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$HTTP_PORT/status', timeout=2)" 2>/dev/null; do
    kill -0 "$launch_pid" 2>/dev/null || fail "the launch ended: $(tail -20 "$1")"
    [ $((SECONDS - start)) -lt 300 ] || fail "not ready in 300 s: $(tail -20 "$1")"
    sleep 0.5
  done
  # The launch logs its own figure just after its own poll answers.
  for _ in $(seq 10); do grep -q 'LMCache server ready in' "$1" && break; sleep 0.5; done
  echo "/status answers after $((SECONDS - start)) s; $(sed 's/\x1b\[[0-9;]*m//g' "$1" | grep -o 'LMCache server ready in [0-9.]*s' | head -1)"
}
start_launch() {
  "${LAUNCH[@]}" > "$RESULTS/$1" 2>&1 &
  launch_pid=$!
  wait_ready "$RESULTS/$1"
}
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
  echo "stopped in $((SECONDS - start)) s, exit 0, none of its processes left"
}
# engine PHASE ARGS...: one engine process; its records go to runs.jsonl.
engine() {
  local phase=$1 status=0
  shift
  timeout -k 10 420 "${ENGINE_ENV[@]}" "$PY" "$ROOT/scripts/vllm-trial/engine.py" --phase "$phase" \
    --model "$MODEL" --out "$RESULTS/runs.jsonl" --prompt-tokens "$PROMPT_TOKENS" \
    --max-num-batched-tokens "$BATCHED" --max-model-len "$MAX_MODEL_LEN" \
    --gpu-memory-utilization "$MEMORY_SHARE" "$@" > "$RESULTS/engine-$phase.log" 2>&1 || status=$?
  grep -E "^(ENGINE|RUN) " "$RESULTS/engine-$phase.log" || true
  grep -m3 -iE "backend|KV cache memory|kv_connector" "$RESULTS/engine-$phase.log" | cut -c1-200 || true
  [ "$status" = 0 ] || fail "engine $phase exited $status: $(tail -30 "$RESULTS/engine-$phase.log")"
}
data_objects() { find "$WORK/cache" -maxdepth 1 -name '*.data' 2>/dev/null | wc -l; }

if $RESEED; then
  step "launch, then engine lmcache: each prompt once, on the weights of seed 1000"
  start_launch launch-1.log
  grep -m1 "launch identity" "$RESULTS/launch-1.log" | cut -c1-300 || true
  engine lmcache --runs 1 --kv-config "$RESULTS/kv.json"
  for _ in $(seq 60); do
    [ "$(data_objects)" -ge "$CHUNKS" ] && [ -z "$(find "$WORK/cache" -maxdepth 1 -name '*.tmp')" ] && break
    sleep 0.5
  done
  stored=$(data_objects)
  echo "on disk: $stored objects"
  stop_launch
  step "other weights at the same path (seed 5000), then engine cold-new: LMCache off"
  touch "$MODEL/reseeded"
  weights 5000
  touch "$MODEL/reseeded"
  engine cold-new --runs 1
  step "launch again over the kept disk tier, then engine reseeded"
  start_launch launch-2.log
  grep -E "launch identity|housekeeping|purged" "$RESULTS/launch-2.log" | cut -c1-400 || true
  kept=$(data_objects)
  engine reseeded --runs 1 --kv-config "$RESULTS/kv.json"
  sleep 1
  grep -E "retained keys" "$RESULTS/launch-2.log" | cut -c1-300 || true
  stop_launch
  sed -i 's/\x1b\[[0-9;]*m//g' "$RESULTS"/launch-*.log
  verdict=0
  "$PY" - "$RESULTS" "$OUTPUT/summary.json" "$TOLERANCE" "$stored" "$kept" "$("$WORK/bin/lmcache-tier" --version)" <<'PY' || verdict=$?
import json, re, sys
results, summary_path, tol, stored, kept, version = sys.argv[1:]
tol = float(tol)
runs = [json.loads(line) for line in open(f"{results}/runs.jsonl")]
by = {(r["phase"], r["prompt_tokens"]): r for r in runs if r["run"] == 0}
lengths = sorted({n for (_, n) in by})
log = open(f"{results}/launch-2.log").read()
retained = [tuple(map(int, m.groups())) for m in
            re.finditer(r"(\d+)/(\d+) retained keys \((\d+) L1, (\d+) L2\)", log)]
problems, prompts = [], {}
for n in lengths:
    new, served = by[("cold-new", n)], by[("reseeded", n)]
    worst = 0.0
    for pa, pb in zip(new["logprobs"], served["logprobs"]):
        for token in set(pa) & set(pb):
            worst = max(worst, abs(pa[token] - pb[token]))
    same = new["output_token_ids"] == served["output_token_ids"]
    first_diff = next((i for i, (a, b) in enumerate(zip(new["output_token_ids"], served["output_token_ids"])) if a != b), None)
    prompts[str(n)] = {"same_tokens_as_cold_new": same, "first_differing_token": first_diff,
                       "logprob_max_diff_to_cold_new": worst,
                       "num_cached_tokens": served["num_cached_tokens"],
                       "tokens_cold_new": new["output_token_ids"], "tokens_served": served["output_token_ids"]}
    if not same or worst > tol:
        problems.append(f"prompt {n}: served tokens {'equal' if same else 'differ from token ' + str(first_diff)}, logprobs {worst:.3g} from a cold run of the new weights")
    if served["num_cached_tokens"]:
        problems.append(f"prompt {n}: {served['num_cached_tokens']} tokens loaded from LMCache after the weights changed")
l2 = sum(m[3] for m in retained)
if l2:
    problems.append(f"the server loaded {l2} keys from the disk tier after the weights changed")
summary = {"mode": "reseed", "passed": not problems, "problems": problems, "binaries": version,
           "objects_stored": int(stored), "objects_left_after_restart": int(kept),
           "l2_keys_loaded_after_restart": l2, "logprob_tolerance": tol, "prompts": prompts,
           "housekeeping": [l for l in log.splitlines() if "housekeeping" in l][:3]}
json.dump(summary, open(summary_path, "w"), indent=2)
print(json.dumps(summary, indent=2))
sys.exit(1 if problems else 0)
PY
  keep_details
  [ "$verdict" = 0 ] || { echo "TRIAL FAILED: stale KV served, see $OUTPUT/summary.json"; exit 1; }
  step "TRIAL PASSED: nothing of the old weights was served"
  exit 0
fi

if $COLD; then
  step "engine cold: LMCache off, each prompt twice, then a changed context"
  engine cold --runs 2 --context-check
fi
if $DUMMY_CHECK; then
  step "engine dummy: vLLM's dummy weights, LMCache off, the prompt and the changed context"
  engine dummy --runs 1 --context-check --weights dummy
fi

step "launch, then engine lmcache: the prompt twice"
start_launch launch-1.log
if $COLD; then
  engine lmcache --runs 2 --kv-config "$RESULTS/kv.json"
else
  engine lmcache --runs 2 --kv-config "$RESULTS/kv.json" --context-check
fi
for _ in $(seq 60); do
  [ "$(data_objects)" -ge "$CHUNKS" ] && [ -z "$(find "$WORK/cache" -maxdepth 1 -name '*.tmp')" ] && break
  sleep 0.5
done
[ "$(data_objects)" -ge "$CHUNKS" ] || fail "$(data_objects) objects on disk, $CHUNKS expected"
echo "on disk: $(data_objects) objects, $(du -sh "$WORK/cache" | cut -f1)"
grep -E "engine workers|WARN" "$RESULTS/launch-1.log" | cut -c1-300 || true
stop_launch

step "launch again over the kept disk tier, then a new engine: each prompt $DISK_RUNS times"
start_launch launch-2.log
grep -m2 "housekeeping" "$RESULTS/launch-2.log" | cut -c1-300 || true
[ "$(data_objects)" -ge "$CHUNKS" ] || fail "after the restart $(data_objects) objects are left on disk ($CHUNKS stored)"
engine disk --runs "$DISK_RUNS" --kv-config "$RESULTS/kv.json"
sleep 1
grep -E "retained keys" "$RESULTS/launch-2.log" | cut -c1-300 || true
grep -iE "prefetch" "$RESULTS/launch-2.log" | cut -c1-300 | tail -20 || true
grep -E "engine workers|WARN" "$RESULTS/launch-2.log" | cut -c1-300 || true
stop_launch
if $READ_PROBE; then
  step "the volume's read limit: O_DIRECT reads of 4 MiB over the tier's objects"
  "$PY" "$ROOT/scripts/vllm-trial/read_probe.py" "$WORK/cache" > "$RESULTS/read-probe.json" ||
    fail "the read probe failed"
  cat "$RESULTS/read-probe.json"
fi

step "compare"
sed -i 's/\x1b\[[0-9;]*m//g' "$RESULTS"/launch-*.log
for n in 1 2; do
  grep -o 'LMCache server ready in [0-9.]*s' "$RESULTS/launch-$n.log" | head -1 | grep -o '[0-9.]*' > "$RESULTS/ready-$n" || true
done
verdict=0
"$PY" - "$RESULTS" "$OUTPUT/summary.json" "$TOLERANCE" "$CHUNK" "$CHUNKS" "$SECONDS" "$SHAPE" "$BATCHED" <<'PY' || verdict=$?
import json, os, re, sys
results, summary_path, tol, chunk, chunks, secs, shape, batched = sys.argv[1:]
tol, chunk, chunks = float(tol), int(chunk), int(chunks)
runs = [json.loads(line) for line in open(f"{results}/runs.jsonl")]
by = {(r["phase"], str(r["run"]), r["prompt_tokens"]): r for r in runs}
lengths = sorted({r["prompt_tokens"] for r in runs if r["run"] not in ("warmup", "context")})
disk_runs = sorted({r["run"] for r in runs if r["phase"] == "disk" and r["run"] not in ("warmup", "context")})
cold = any(r["phase"] == "cold" for r in runs)

def diff(a, b):
    """Largest |logprob a - b| over each position's top-k tokens, and
    whether the positions have the same top-k token sets."""
    worst, same = 0.0, len(a["logprobs"]) == len(b["logprobs"])
    for pa, pb in zip(a["logprobs"], b["logprobs"]):
        same = same and set(pa) == set(pb)
        for token in set(pa) & set(pb):
            worst = max(worst, abs(pa[token] - pb[token]))
    return worst, same

def first_position_effect(a, b):
    pa, pb = a["logprobs"][0], b["logprobs"][0]
    common = set(pa) & set(pb)
    return max((abs(pa[t] - pb[t]) for t in common), default=None), set(pa) != set(pb)

problems = []
prompts = {}
reference_phase = "cold" if cold else "lmcache"
for n in lengths:
    whole = n // chunk * chunk
    ref = by[(reference_phase, "0", n)]
    mine = [r for r in runs if r["prompt_tokens"] == n and r["run"] not in ("warmup", "context")]
    name = lambda r: f'{r["phase"]}/{r["run"]}'
    if len({tuple(r["output_token_ids"]) for r in mine}) != 1:
        problems.append(f"prompt {n}: the runs gave different tokens: "
                        + "; ".join(f'{name(r)} {r["output_token_ids"]}' for r in mine))
    spread = {name(r): diff(ref, r) for r in mine if r is not ref}
    for key, (worst, same) in spread.items():
        if not same:
            problems.append(f"prompt {n}: {key}: its top-k tokens differ from {reference_phase}/0's")
        if worst > tol:
            problems.append(f"prompt {n}: {key}: the logprobs differ from {reference_phase}/0's by {worst:.3g} (tolerance {tol:g})")
    disk = [by[("disk", str(k), n)] for k in disk_runs]
    if disk[0]["num_cached_tokens"] < whole:
        problems.append(f"prompt {n}: after the restart num_cached_tokens is {disk[0]['num_cached_tokens']}, not {whole}")
    lm1 = by[("lmcache", "1", n)]
    if lm1["num_cached_tokens"] < whole:
        problems.append(f"prompt {n}: the second run (L1) had num_cached_tokens {lm1['num_cached_tokens']}, not {whole}")
    ttft = lambda phase, run: (by.get((phase, str(run), n)) or {}).get("ttft_s")
    prompts[str(n)] = {
        "whole_chunk_tokens": whole,
        "ttft_s": {"lmcache_off": [ttft("cold", 0), ttft("cold", 1)] if cold else None,
                   "first_run": ttft("lmcache", 0), "l1": ttft("lmcache", 1),
                   "disk_after_restart": [r["ttft_s"] for r in disk]},
        "num_cached_tokens": {name(r): r["num_cached_tokens"] for r in mine},
        "generate_s": {name(r): r["generate_s"] for r in mine},
        "logprob_max_diff_to_reference": {k: v[0] for k, v in spread.items()},
    }
context = by.get((reference_phase, "context", lengths[0]))
effect, moved = first_position_effect(by[(reference_phase, "0", lengths[0])], context)
if not moved and (effect is None or effect <= 10 * tol):
    problems.append(f"a changed context moves the logprobs by {effect} only: the comparison cannot tell (tolerance {tol:g})")
retained = re.compile(r"(\d+)/(\d+) retained keys \((\d+) L1, (\d+) L2\)")
found = [tuple(map(int, m.groups())) for m in retained.finditer(open(f"{results}/launch-2.log").read())]
l2 = sum(m[3] for m in found)
if l2 < chunks:
    problems.append(f"the server's log after the restart counts {l2} keys from L2, not {chunks}"
                    + ("" if found else " (no 'retained keys' line in the launch's log)"))

def ready(k):
    try:
        return float(open(f"{results}/ready-{k}").read().strip())
    except (OSError, ValueError):
        return None

summary = {
    "passed": not problems,
    "problems": problems,
    "shape": shape,
    "max_num_batched_tokens": int(batched),
    "chunk_size": chunk,
    "weights": runs[0]["weights"],
    "reference": f"{reference_phase}/0",
    "prompts": prompts,
    "server_retained_keys_after_restart": [{"hit": m[0], "asked": m[1], "l1": m[2], "l2": m[3]} for m in found],
    "engine_ready_s": {p: next((r["engine_ready_s"] for r in runs if r["phase"] == p), None)
                       for p in ("cold", "lmcache", "disk")},
    "launch_ready_s": {"first": ready(1), "restart": ready(2)},
    "logprob_tolerance": tol,
    "changed_context_first_token": {"max_diff": effect, "top_k_changed": moved},
    "trial_seconds": int(secs),
}
probe = f"{results}/read-probe.json"
if os.path.exists(probe):
    summary["read_probe"] = json.load(open(probe))
dummy = by.get(("dummy", "0", lengths[0])), by.get(("dummy", "context", lengths[0]))
if dummy[0] and dummy[1]:
    e, m = first_position_effect(*dummy)
    summary["dummy_weights_changed_context"] = {"max_diff": e, "top_k_changed": m,
                                                "same_tokens": dummy[0]["output_token_ids"] == dummy[1]["output_token_ids"]}
json.dump(summary, open(summary_path, "w"), indent=2)
print(json.dumps(summary, indent=2))
sys.exit(1 if problems else 0)
PY
keep_details
[ "$verdict" = 0 ] || { echo "TRIAL FAILED: see problems in $OUTPUT/summary.json"; exit 1; }
step "TRIAL PASSED"
