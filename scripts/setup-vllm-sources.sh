#!/usr/bin/env bash
# Makes sure the Python sources of vLLM's KV-transfer configuration and
# connector factory are at hand for each vLLM version the connector check
# reads (default: 0.26.0, the version the GPU trial runs, and 0.33.0 and
# 0.34.0), and prints the directory that holds them on stdout:
# <dir>/<version>/vllm/... and <dir>/<version>/METADATA.
#
# No vLLM is installed and nothing is built: each version's wheel is
# downloaded from PyPI without its dependencies (about 300-450 MB each),
# the few files the check reads are unpacked, and the wheel is deleted:
# vllm/config/*.py, vllm/engine/arg_utils.py and the connector factory and
# LMCache connector under vllm/distributed/kv_transfer/kv_connector/.
#
# Where: $EREBINE_VLLM_SOURCES, else ~/.cache/erebine/vllm-sources (outside
# the clone, so every clone and CI run reuses it; a version already there is
# not downloaded again).
#
# Usage: scripts/setup-vllm-sources.sh [VERSION...]
set -euo pipefail
root="${EREBINE_VLLM_SOURCES:-$HOME/.cache/erebine/vllm-sources}"
python="${PYTHON:-python3}"
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(0.26.0 0.33.0 0.34.0)
files=('vllm/config/*.py' 'vllm/engine/arg_utils.py'
  'vllm/distributed/kv_transfer/kv_connector/factory.py'
  'vllm/distributed/kv_transfer/kv_connector/v1/lmcache_mp_connector.py')

for v in "${versions[@]}"; do
  dest="$root/$v"
  if [ -f "$dest/METADATA" ] && [ -f "$dest/vllm/config/kv_transfer.py" ]; then
    echo "setup-vllm-sources: reusing vLLM $v in $dest" >&2
    continue
  fi
  echo "setup-vllm-sources: vLLM $v: downloading its wheel (no dependencies, about 400 MB) for a few sources" >&2
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --platform manylinux_2_28_x86_64 --python-version 3.12 \
    "vllm==$v" -d "$tmp"
  wheel="$(ls "$tmp"/vllm-"$v"-*.whl)"
  rm -rf "$dest.partial"
  mkdir -p "$dest.partial"
  unzip -q "$wheel" "${files[@]}" -d "$dest.partial"
  unzip -p "$wheel" "vllm-$v.dist-info/METADATA" > "$dest.partial/METADATA"
  rm -rf "$dest" "$tmp"
  trap - EXIT
  mv "$dest.partial" "$dest"
done
echo "$root"
