#!/usr/bin/env bash
# The s3_bucket gateway in front of a failing upstream: its resident memory
# (VmRSS sampled, VmHWM) while 8 streams keep sending 32 MiB PUTs and GETs
# to a stalled upstream, beside the same with a healthy upstream in the same
# run, and the time to the first error of each fault (stall before the
# answer, stall and reset mid-body, 503 SlowDown, 500 InternalError, closed
# port), for a plain client and for LMCache's own S3 client (awscrt).
#
# Upstream: s3s-fs 0.14.1 ($EREBINE_TEST_S3S_FS, else s3s-fs on PATH, else
# the one scripts/setup-s3s-fs.sh installs) on a free port on 127.0.0.1; the
# faults come from the fault proxy of the e2e crate in front of it. awscrt
# comes from LMCache's virtual environment ($EREBINE_TEST_LMCACHE_VENV, else
# ~/.cache/erebine/lmcache-0.5.6); without it that part is skipped. Extra
# variables: GATEWAY_BENCH_STREAMS, GATEWAY_BENCH_OBJECTS,
# GATEWAY_BENCH_FAULT_SECONDS, GATEWAY_BENCH_TRIALS (see
# adapters/s3-gateway/benches/gateway_faults.rs).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
s3s_fs="${EREBINE_TEST_S3S_FS:-$(command -v s3s-fs || echo "$HOME/.cache/erebine/s3s-fs-0.14.1/bin/s3s-fs")}"
if [ ! -x "$s3s_fs" ]; then
  echo "no s3s-fs at $s3s_fs: run scripts/setup-s3s-fs.sh or set EREBINE_TEST_S3S_FS" >&2
  exit 1
fi
venv="${EREBINE_TEST_LMCACHE_VENV:-$HOME/.cache/erebine/lmcache-0.5.6}"
if [ -x "$venv/bin/python" ]; then
  export GATEWAY_BENCH_AWSCRT_PYTHON="$venv/bin/python"
fi
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
export AWS_ACCESS_KEY_ID=benchkeyid AWS_SECRET_ACCESS_KEY=benchsecretbenchsecretbenchsecret1234
export GATEWAY_BENCH_UPSTREAM="127.0.0.1:$port" GATEWAY_BENCH_BUCKET=bench
mkdir -p "$work/root/bench"
"$s3s_fs" --host 127.0.0.1 --port "$port" --access-key "$AWS_ACCESS_KEY_ID" \
  --secret-key "$AWS_SECRET_ACCESS_KEY" "$work/root" >"$work/upstream.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do
  curl -s -o /dev/null "http://127.0.0.1:$port/" && break
  sleep 0.2
done
echo "upstream: s3s-fs $("$s3s_fs" --version 2>/dev/null | awk '{print $2}') on 127.0.0.1:$port"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg)"
cd "$root"
cargo build --quiet --release -p lmcache-s3-gateway --benches
cargo bench -p lmcache-s3-gateway --bench gateway_faults
