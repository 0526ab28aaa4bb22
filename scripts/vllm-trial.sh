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
#  3. the model: scripts/vllm-trial/config.json (a small Qwen2: 8 layers,
#     2 KV heads of 128, 8 KiB of KV a token) with seeded random weights
#     written on the node (engine.py says why not vLLM's dummy weights);
#  4. engine "cold", LMCache off (no kv_transfer_config): the long prompt
#     twice, then the prompt with its first chunk changed (how far the
#     logprobs move when the context differs);
#  5. `lmcache-tier launch --model <the model's directory>`, the --model
#     vLLM gets; engine "lmcache": the prompt twice (the first computes and
#     stores it, the second loads it from L1); the objects reach the disk;
#  6. SIGTERM, then a new launch over the kept disk tier and a new engine
#     "disk": the prompt once; SIGTERM.
# Every engine: token-id prompts, enforce_eager, vLLM's own prefix cache
# off, greedy sampling with logprobs, VLLM_USE_FLASHINFER_SAMPLER=0,
# HF_HUB_OFFLINE=1, and a short warm-up request before its runs.
# It passes when, after the restart, the prompt is served with at least its
# whole chunks cached (num_cached_tokens) and the server's log counts them
# in L2 ("N/N retained keys (0 L1, N L2)"), and every run of the prompt
# gives the same tokens with logprobs within --logprob-tolerance of the
# first cold run, the cold runs among themselves too; the changed context
# must change the first token's top 5 or move its logprobs by more than 10
# times the tolerance, or the comparison could not tell a wrong cache from
# a right one. trial.log and summary.json
# (time to first token cold, from L1 and from the disk tier, ready times,
# the counts, the differences) go to $OUT (or /tmp/vllm-trial-out), every
# log to details.tar.gz beside them. It works in /tmp/vllm-trial (removed
# first; it refuses while a process still runs from there), needs ports
# 6555 and 8090 free and stops only the processes it started, by their ids.
# Exit status: 0 passed, 1 a check failed, 2 bad arguments, 3 the kit is
# not all here yet (the missing parts are named).
#
# --stash                 only step 1's stash: keep the parts in this copy
# --vllm-installed        use the vLLM that python3 imports; no kit needed
# --prompt-tokens N       the long prompt (default 8200: 8 chunks of 1024
#                         and a few tokens)
# --logprob-tolerance X   largest logprob difference allowed, in nats
#                         (default 0.001)
# --dummy-check           also run the prompt and the changed one on vLLM's
#                         dummy weights, LMCache off, to show what the
#                         context moves there
#
# Usage: scripts/vllm-trial.sh [--stash] [--vllm-installed] [--prompt-tokens N] [--logprob-tolerance X] [--dummy-check]
set -euo pipefail

usage() { sed -n '/^# The vLLM trial/,/^# Usage/s/^# \{0,1\}//p' "$0"; }
value() {
  [ -n "${2:-}" ] || { echo "vllm-trial: $1 needs a value (see --help)" >&2; exit 2; }
  echo "$2"
}

STASH_ONLY=false
VLLM_INSTALLED=false
PROMPT_TOKENS=8200
TOLERANCE=0.001
DUMMY_CHECK=false
while [ $# -gt 0 ]; do
  case "$1" in
    --stash) STASH_ONLY=true; shift ;;
    --vllm-installed) VLLM_INSTALLED=true; shift ;;
    --prompt-tokens) PROMPT_TOKENS=$(value "$@"); shift 2 ;;
    --logprob-tolerance) TOLERANCE=$(value "$@"); shift 2 ;;
    --dummy-check) DUMMY_CHECK=true; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "vllm-trial: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$PROMPT_TOKENS" in
  '' | *[!0-9]*) echo "vllm-trial: --prompt-tokens takes a whole number, not $PROMPT_TOKENS" >&2; exit 2 ;;
esac
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)" "$TOLERANCE" 2>/dev/null ||
  { echo "vllm-trial: --logprob-tolerance takes a positive number, not $TOLERANCE" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PARTS=$ROOT/.vllm-trial/parts
GPU_KIT=$ROOT/.gpu-trial
STAGE=/tmp/vllm-trial-kit
OUTPUT=${OUT:-/tmp/vllm-trial-out}
WORK=/tmp/vllm-trial
RESULTS=$WORK/results
MODEL=$WORK/model
MP_PORT=6555
HTTP_PORT=8090
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

# Processes whose command line names $WORK: an earlier trial still running,
# or what this one left. Only looked at, never signalled.
from_work() { { pgrep -f -- "$WORK/" || true; } | while read -r pid; do echo "$pid $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)"; done; }
left=$(from_work)
if [ -n "$left" ]; then
  echo "vllm-trial: processes still run from $WORK; stop them before a new trial:" >&2
  echo "$left" >&2
  exit 1
fi
rm -rf "$WORK"
mkdir -p "$OUTPUT" "$RESULTS" "$WORK/bin" "$WORK/home" "$MODEL"
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
  if [ -f "$GPU_KIT/bin/$bin.gz" ]; then
    gunzip -c "$GPU_KIT/bin/$bin.gz" > "$WORK/bin/$bin"
  elif [ -x "/tmp/gpu-trial/bin/$bin" ]; then
    cp "/tmp/gpu-trial/bin/$bin" "$WORK/bin/$bin"
  else
    fail "no $bin: bring $GPU_KIT or run scripts/gpu-trial.sh first"
  fi
  chmod +x "$WORK/bin/$bin"
done
"$WORK/bin/lmcache-tier" --version

step "the model in $MODEL"
cp "$ROOT/scripts/vllm-trial/config.json" "$MODEL/config.json"
"${ENGINE_ENV[@]}" "$PY" "$ROOT/scripts/vllm-trial/engine.py" --make-weights "$MODEL" ||
  fail "writing the weights failed"

export VIRTUAL_ENV=$PREFIX HOME=$WORK/home
export EREBINE_AGENT_KV_CACHE_BACKEND=lmcache
export EREBINE_AGENT_LMCACHE_DISK_PATH=$WORK/cache
export EREBINE_AGENT_LMCACHE_MP_PORT=$MP_PORT EREBINE_AGENT_LMCACHE_HTTP_PORT=$HTTP_PORT
export LMCACHE_TRACK_USAGE=false LMCACHE_DISABLE_BANNER=1
BATCHED=2048
LAUNCH=("$WORK/bin/lmcache-tier" launch --model "$MODEL" --tensor-parallel-size 1
  --max-num-batched-tokens "$BATCHED")

step "plan"
"${LAUNCH[@]}" --dry-run --json > "$RESULTS/plan.json" 2> "$RESULTS/plan.log" ||
  fail "the dry run failed: $(cat "$RESULTS/plan.log")"
json "$RESULTS/plan.json" 'json.dumps(d["connector_config"])' > "$RESULTS/kv.json"
echo "connector config: $(cat "$RESULTS/kv.json")"
CHUNK=$(json "$RESULTS/plan.json" 'd["argv"][d["argv"].index("--chunk-size") + 1]')
CHUNKS=$((PROMPT_TOKENS / CHUNK))
WHOLE=$((CHUNKS * CHUNK))
[ "$CHUNKS" -gt 0 ] || fail "a prompt of $PROMPT_TOKENS tokens holds no whole chunk of $CHUNK"
echo "chunk size $CHUNK: the prompt of $PROMPT_TOKENS tokens holds $CHUNKS whole chunks ($WHOLE tokens)"
for port in "$MP_PORT" "$HTTP_PORT"; do
  ! "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null ||
    fail "port $port is taken: another server runs on this node; the trial needs 6555 and 8090"
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
    --max-num-batched-tokens "$BATCHED" "$@" > "$RESULTS/engine-$phase.log" 2>&1 || status=$?
  grep -E "^(ENGINE|RUN) " "$RESULTS/engine-$phase.log" || true
  grep -m3 -iE "backend|KV cache memory|kv_connector" "$RESULTS/engine-$phase.log" | cut -c1-200 || true
  [ "$status" = 0 ] || fail "engine $phase exited $status: $(tail -30 "$RESULTS/engine-$phase.log")"
}
data_objects() { find "$WORK/cache" -maxdepth 1 -name '*.data' 2>/dev/null | wc -l; }

step "engine cold: LMCache off, the prompt twice, then a changed context"
engine cold --runs 2 --context-check
if $DUMMY_CHECK; then
  step "engine dummy: vLLM's dummy weights, LMCache off, the prompt and the changed context"
  engine dummy --runs 1 --context-check --weights dummy
fi

step "launch, then engine lmcache: the prompt twice"
start_launch launch-1.log
engine lmcache --runs 2 --kv-config "$RESULTS/kv.json"
for _ in $(seq 60); do
  [ "$(data_objects)" -ge "$CHUNKS" ] && [ -z "$(find "$WORK/cache" -maxdepth 1 -name '*.tmp')" ] && break
  sleep 0.5
done
[ "$(data_objects)" -ge "$CHUNKS" ] || fail "$(data_objects) objects on disk, $CHUNKS expected"
echo "on disk: $(data_objects) objects, $(du -sh "$WORK/cache" | cut -f1)"
grep -E "engine workers|WARN" "$RESULTS/launch-1.log" | cut -c1-300 || true
stop_launch

step "launch again over the kept disk tier, then a new engine: the prompt once"
start_launch launch-2.log
grep -m2 "housekeeping" "$RESULTS/launch-2.log" | cut -c1-300 || true
[ "$(data_objects)" -ge "$CHUNKS" ] || fail "after the restart $(data_objects) objects are left on disk ($CHUNKS stored)"
engine disk --runs 1 --kv-config "$RESULTS/kv.json"
sleep 1
grep -E "retained keys" "$RESULTS/launch-2.log" | cut -c1-300 || true
grep -E "engine workers|WARN" "$RESULTS/launch-2.log" | cut -c1-300 || true
stop_launch

step "compare"
sed -i 's/\x1b\[[0-9;]*m//g' "$RESULTS"/launch-*.log
for n in 1 2; do
  grep -o 'LMCache server ready in [0-9.]*s' "$RESULTS/launch-$n.log" | head -1 | grep -o '[0-9.]*' > "$RESULTS/ready-$n" || true
done
verdict=0
"$PY" - "$RESULTS" "$OUTPUT/summary.json" "$TOLERANCE" "$WHOLE" "$CHUNKS" "$SECONDS" <<'PY' || verdict=$?
import json, re, sys
results, summary_path, tol, whole, chunks, secs = sys.argv[1:]
tol, whole, chunks = float(tol), int(whole), int(chunks)
runs = [json.loads(line) for line in open(f"{results}/runs.jsonl")]
by = {(r["phase"], str(r["run"])): r for r in runs}
cold0, cold1 = by[("cold", "0")], by[("cold", "1")]
lm0, lm1, disk = by[("lmcache", "0")], by[("lmcache", "1")], by[("disk", "0")]

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
prompt_runs = [cold0, cold1, lm0, lm1, disk]
tokens = {tuple(r["output_token_ids"]) for r in prompt_runs}
if len(tokens) != 1:
    problems.append("the runs of the prompt gave different tokens: "
                    + "; ".join(f'{r["phase"]}/{r["run"]} {r["output_token_ids"]}' for r in prompt_runs))
spread = {f'{r["phase"]}/{r["run"]}': diff(cold0, r) for r in prompt_runs[1:]}
cold_spread = max(spread["cold/1"][0], spread["lmcache/0"][0])
for name, (worst, same) in spread.items():
    if not same:
        problems.append(f"{name}: its top-k tokens differ from cold/0's")
if cold_spread > tol:
    problems.append(f"the cold runs differ by {cold_spread:.3g} among themselves, over the tolerance {tol:g}")
if spread["lmcache/1"][0] > tol:
    problems.append(f"from L1 the logprobs differ from the cold run's by {spread['lmcache/1'][0]:.3g} (tolerance {tol:g})")
if spread["disk/0"][0] > tol:
    problems.append(f"after the restart the logprobs differ from the cold run's by {spread['disk/0'][0]:.3g} (tolerance {tol:g})")
context = by.get(("cold", "context"))
effect, moved = first_position_effect(cold0, context)
if not moved and (effect is None or effect <= 10 * tol):
    problems.append(f"a changed context moves the logprobs by {effect} only: the comparison cannot tell (tolerance {tol:g})")
if disk["num_cached_tokens"] < whole:
    problems.append(f"after the restart num_cached_tokens is {disk['num_cached_tokens']}, not {whole}")
if lm1["num_cached_tokens"] < whole:
    problems.append(f"the second run (L1) had num_cached_tokens {lm1['num_cached_tokens']}, not {whole}")
retained = re.compile(r"(\d+)/(\d+) retained keys \((\d+) L1, (\d+) L2\)")
found = [tuple(map(int, m.groups())) for m in retained.finditer(open(f"{results}/launch-2.log").read())]
l2 = max((m[3] for m in found), default=0)
if l2 < chunks:
    elsewhere = retained.findall(open(f"{results}/engine-disk.log").read())
    problems.append(f"the server's log after the restart counts {l2} keys from L2, not {chunks}"
                    + ("" if found else " (no 'retained keys' line in the launch's log")
                    + (f"; the engine's log has {len(elsewhere)})" if elsewhere and not found else ")" if not found else ""))
dummy = by.get(("dummy", "0")), by.get(("dummy", "context"))

def ready(n):
    try:
        return float(open(f"{results}/ready-{n}").read().strip())
    except (OSError, ValueError):
        return None

summary = {
    "passed": not problems,
    "problems": problems,
    "prompt_tokens": disk["prompt_tokens"],
    "weights": cold0["weights"],
    "ttft_s": {"cold_lmcache_off": [cold0["ttft_s"], cold1["ttft_s"]],
               "cold_lmcache_first_run": lm0["ttft_s"], "l1_same_engine": lm1["ttft_s"],
               "disk_after_restart_new_engine": disk["ttft_s"]},
    "generate_s": {f'{r["phase"]}/{r["run"]}': r["generate_s"] for r in prompt_runs},
    "num_cached_tokens": {f'{r["phase"]}/{r["run"]}': r["num_cached_tokens"] for r in prompt_runs},
    "server_retained_keys_after_restart": [{"hit": m[0], "asked": m[1], "l1": m[2], "l2": m[3]} for m in found],
    "engine_ready_s": {"cold": cold0["engine_ready_s"], "lmcache": lm0["engine_ready_s"],
                       "disk": disk["engine_ready_s"]},
    "launch_ready_s": {"first": ready(1), "restart": ready(2)},
    "logprob_tolerance": tol,
    "logprob_max_diff_to_cold0": {k: v[0] for k, v in spread.items()},
    "cold_spread": cold_spread,
    "changed_context_first_token": {"max_diff": effect, "top_k_changed": moved},
    "output_token_ids": cold0["output_token_ids"],
    "trial_seconds": int(secs),
}
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
