#!/usr/bin/env bash
# The node's image against the same launch on the host (docs/performance.md,
# "The image"):
#
#   benches/image/run.sh [ROUNDS] [cold]
#
# Prints, as a Markdown table each:
# - the image's size and what takes it (one row a layer);
# - the build's time with every layer cached (scripts/build-image.sh again),
#   and with `cold` also a build that reuses nothing (`--no-cache`, about 6
#   minutes and 7 GB more of podman's storage while it runs; the image it
#   makes is removed);
# - per round, side by side: `lmcache-tier launch` on the host and a
#   container of the image (podman run --network host, a named volume),
#   each from its start to `/status` answering, and from SIGTERM (`podman
#   stop` for the container) to its exit; then the medians and the ratio.
#
# Both launches get the same binaries, a 1 GiB L1 and an empty disk tier.
# Needs root (podman), LMCache (scripts/setup-lmcache.sh) and the binaries
# in $EREBINE_IMAGE_BIN_DIR (default: a release build).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
rounds="${1:-3}"
cold="${2:-}"
venv="$("$root/scripts/setup-lmcache.sh")"
CONTAINERS_CONF="$("$root/scripts/setup-podman.sh")/containers.conf"
export CONTAINERS_CONF
if [ -z "${EREBINE_IMAGE_BIN_DIR:-}" ]; then
  (cd "$root" && cargo build --release --quiet --bin lmcache-tier --bin erebine-lmcache)
  EREBINE_IMAGE_BIN_DIR="$root/target/release"
fi
export EREBINE_IMAGE_BIN_DIR
bin="$EREBINE_IMAGE_BIN_DIR"
work="$(mktemp -d /var/tmp/erebine-image-bench.XXXXXX)"
trap 'podman rm -f -t 0 erebine-image-bench >/dev/null 2>&1 || true; podman volume rm -f erebine-image-bench >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_ready() { until curl -sf "http://127.0.0.1:$1/status" >/dev/null; do sleep 0.05; done; }

start="$(now)"
image="$("$root/scripts/build-image.sh" 2>"$work/build.log")"
cached="$(secs "$start" "$(now)")"

echo "image: $image"
echo
echo "| layer | size |"
echo "| --- | --- |"
podman history --format '{{.Size}}|{{.CreatedBy}}' "$image" |
  awk -F'|' '$1 != "0 B" { sub(/^\/bin\/sh -c (#\(nop\) )?/, "", $2); printf "| `%s` | %s |\n", substr($2, 1, 60), $1 }'
echo "| the image | $(podman image inspect --format '{{.Size}}' "$image" | awk '{ printf "%.2f GB", $1 / 1e9 }') |"
echo
echo "| build | time |"
echo "| --- | --- |"
echo "| every layer cached | ${cached} s |"
if [ "$cold" = cold ]; then
  context="$HOME/.cache/erebine/image/context"
  start="$(now)"
  podman build --no-cache --format docker --network host \
    --build-arg BASE=localhost/erebine-base:bookworm-minbase \
    --tag localhost/lmcache-tier:bench-cold -f "$context/Containerfile" "$context" >"$work/cold.log" 2>&1
  echo "| nothing cached (the base reused) | $(secs "$start" "$(now)") s |"
  podman rmi -f localhost/lmcache-tier:bench-cold >/dev/null
fi
echo

host_round() {
  local mp http metrics dir pid t0 ready t1
  mp="$(port)" http="$(port)" metrics="$(port)" dir="$work/host-$1"
  mkdir -p "$dir"
  t0="$(now)"
  env -i PATH=/usr/bin:/bin HOME="$dir" VIRTUAL_ENV="$venv" \
    EREBINE_AGENT_KV_CACHE_BACKEND=lmcache EREBINE_AGENT_KV_OFFLOAD_SIZE_GB=1 \
    EREBINE_AGENT_LMCACHE_DISK_PATH="$dir/cache" EREBINE_AGENT_LMCACHE_MP_PORT="$mp" \
    EREBINE_AGENT_LMCACHE_HTTP_PORT="$http" EREBINE_AGENT_LMCACHE_METRICS_PORT="$metrics" \
    "$bin/lmcache-tier" launch --model test-model >"$dir/launch.log" 2>&1 &
  pid=$!
  wait_ready "$http"
  ready="$(secs "$t0" "$(now)")"
  t1="$(now)"
  kill -TERM "$pid"
  wait "$pid"
  echo "$ready $(secs "$t1" "$(now)")"
}

container_round() {
  local mp http metrics t0 ready t1
  mp="$(port)" http="$(port)" metrics="$(port)"
  podman volume rm -f erebine-image-bench >/dev/null 2>&1 || true
  t0="$(now)"
  podman run -d --name erebine-image-bench --network host \
    -v erebine-image-bench:/var/lib/inference/.cache/erebine/lmcache \
    -e EREBINE_AGENT_KV_OFFLOAD_SIZE_GB=1 -e EREBINE_AGENT_LMCACHE_MP_PORT="$mp" \
    -e EREBINE_AGENT_LMCACHE_HTTP_PORT="$http" -e EREBINE_AGENT_LMCACHE_METRICS_PORT="$metrics" \
    "$image" --model test-model >/dev/null 2>&1
  wait_ready "$http"
  ready="$(secs "$t0" "$(now)")"
  t1="$(now)"
  podman stop erebine-image-bench >/dev/null 2>&1
  local stopped
  stopped="$(secs "$t1" "$(now)")"
  [ "$(podman inspect --format '{{.State.ExitCode}}' erebine-image-bench)" = 0 ] ||
    { echo "the container did not stop cleanly" >&2; exit 1; }
  podman rm erebine-image-bench >/dev/null
  echo "$ready $stopped"
}

echo "| round | host: start to ready | container: start to ready | host: SIGTERM to exit | container: podman stop |"
echo "| --- | --- | --- | --- | --- |"
: >"$work/rounds"
for round in $(seq "$rounds"); do
  read -r host_ready host_stop < <(host_round "$round")
  read -r box_ready box_stop < <(container_round)
  echo "$host_ready $box_ready $host_stop $box_stop" >>"$work/rounds"
  echo "| $round | $host_ready s | $box_ready s | $host_stop s | $box_stop s |"
done
col() { awk -v c="$1" '{ print $c }' "$work/rounds" | median; }
echo "| median | $(col 1) s | $(col 2) s | $(col 3) s | $(col 4) s |"
echo
awk -v h="$(col 1)" -v c="$(col 2)" 'BEGIN { printf "container / host, start to ready: %.2f\n", c / h }'
