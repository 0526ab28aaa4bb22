#!/usr/bin/env bash
# The s3_bucket gateway against the same upstream reached directly: 32 MiB
# objects at 8 concurrent streams (PUT and GET), the median of small HEAD
# requests, and the gateway's peak resident memory.
#
# Upstream: s3s-fs when it is on PATH (`cargo install s3s-fs@0.14.1 --features
# binary`), else moto from the LMCache virtual environment. Both listen on a
# free port on 127.0.0.1. Extra variables: GATEWAY_BENCH_OBJECTS,
# GATEWAY_BENCH_STREAMS, GATEWAY_BENCH_SMALL (see adapters/s3-gateway/benches/s3_gateway.rs);
# PIN=1 gives the upstream the last core to itself and runs the client, the
# gateway and the relay on the others (taskset), as when the object store is
# another machine. GATEWAY_BASELINE=<another build of the s3_gateway bench
# binary> runs it and this tree's bench alternately against the same upstream,
# baseline first, two rounds each: a change is measured side by side with the
# code before it. GATEWAY_BENCH_BINARY=<a release build of the s3_gateway bench
# binary> runs that one instead of building this tree's (for a machine without
# cargo: copy the binary and s3s-fs there, s3s-fs on PATH). The bench's sides:
# direct, tcp relay, gateway, scraped (metrics read every 10 ms) and bounded
# (a bucket bound on a prefix that starts full: the bound on vs off is
# bounded vs gateway).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
export AWS_ACCESS_KEY_ID=benchkeyid AWS_SECRET_ACCESS_KEY=benchsecretbenchsecretbenchsecret1234
export GATEWAY_BENCH_UPSTREAM="127.0.0.1:$port" GATEWAY_BENCH_BUCKET=bench
upstream_cpus="" node_cpus=""
if [ "${PIN:-0}" = 1 ]; then
  last=$(($(nproc) - 1))
  upstream_cpus="taskset -c $last" node_cpus="taskset -c 0-$((last - 1))"
fi
if command -v s3s-fs >/dev/null; then
  upstream="s3s-fs $(s3s-fs --version 2>/dev/null | awk '{print $2}')"
  mkdir -p "$work/root/bench"
  $upstream_cpus s3s-fs --host 127.0.0.1 --port "$port" --access-key "$AWS_ACCESS_KEY_ID" \
    --secret-key "$AWS_SECRET_ACCESS_KEY" "$work/root" >"$work/upstream.log" 2>&1 &
  server_pid=$!
else
  venv="$("$root/scripts/setup-lmcache.sh")"
  upstream="moto_server (s3s-fs not installed)"
  $upstream_cpus "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$work/upstream.log" 2>&1 &
  server_pid=$!
fi
for _ in $(seq 100); do
  curl -s -o /dev/null "http://127.0.0.1:$port/" && break
  sleep 0.2
done
if ! command -v s3s-fs >/dev/null; then
  curl -sf -X PUT "http://127.0.0.1:$port/bench" >/dev/null
fi
export GATEWAY_BENCH_UPSTREAM_PID="$server_pid"
echo "upstream: $upstream on 127.0.0.1:$port"
echo "pinned: ${PIN:-0}${upstream_cpus:+ (upstream: $upstream_cpus; client, gateway, relay: $node_cpus)}"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg)"
cd "$root"
if [ -n "${GATEWAY_BENCH_BINARY:-}" ]; then
  current="$GATEWAY_BENCH_BINARY"
else
  cargo build --quiet --release -p lmcache-s3-gateway --benches
  current="$(cargo bench -p lmcache-s3-gateway --bench s3_gateway --no-run 2>&1 |
    sed -n 's/.*(\(.*deps\/s3_gateway-[0-9a-f]*\)).*/\1/p' | tail -n 1)"
fi
if [ -z "${GATEWAY_BASELINE:-}" ]; then
  $node_cpus "$current" --bench
else
  for round in 1 2; do
    echo "== baseline $GATEWAY_BASELINE, round $round"
    $node_cpus "$GATEWAY_BASELINE" --bench
    echo "== this tree $current, round $round"
    $node_cpus "$current" --bench
  done
fi
