#!/usr/bin/env bash
# Prepares the kit that scripts/gpu-trial.sh runs from on a GPU node that
# cannot reach a package index: .gpu-trial/ (ignored by git) gets
#   wheels/      LMCache 0.5.6 for CPython 3.12 and the packages its server
#                and `lmcache bench server` need that a PyTorch image lacks,
#                at the versions the CPU test environment runs
#   csrc.tar.gz  the C++/CUDA sources of LMCache 0.5.6's sdist, to rebuild
#                lmcache.cuda_ops against the node's torch when the wheel's
#                does not load
#   bin/         lmcache-tier and erebine-lmcache, release, stripped, gzipped:
#                built here (about 6 minutes on 2 cores) unless --binaries
#                names them
# About 44 MiB in all (the binaries about 14). Run it on a machine with
# network access and Rust, then copy the checkout, .gpu-trial included (git
# ignores it), to the GPU node and run scripts/gpu-trial.sh there
# (docs/performance.md, "GPU node trial").
#
# --python-version X.Y  the GPU node's python3 (default 3.12): the wheels
#                       are built for one Python
# --binaries DIR        take lmcache-tier and erebine-lmcache from DIR (a
#                       release build's directory, such as target/release)
#                       instead of building them; both must be there
#
# Usage: scripts/gpu-trial-prepare.sh [--python-version X.Y] [--binaries DIR]
set -euo pipefail

PYTHON_VERSION=3.12
BINARIES=
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version | --binaries)
      [ -n "${2:-}" ] || { echo "gpu-trial-prepare: $1 needs a value (see --help)" >&2; exit 2; }
      case "$1" in
        --python-version) PYTHON_VERSION=$2 ;;
        --binaries) BINARIES=$2 ;;
      esac
      shift 2
      ;;
    -h | --help) sed -n '/^# Prepares/,/^# Usage/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "gpu-trial-prepare: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
KIT=$ROOT/.gpu-trial
LMCACHE_VERSION=0.5.6
# The sdist's sha256 as PyPI lists it.
SDIST_SHA256=d6951e60ce8818a76aa42d0866a4ba85f1c95cd919355fff30ff24dcc3243f1e
# What the server and the GPU bench import beyond a PyTorch image.
PACKAGES=(pydantic pydantic_core annotated-types typing-inspection fastapi
  starlette uvicorn pyzmq msgspec blake3 nvtx cachetools cryptography cffi
  importlib_metadata opentelemetry-api opentelemetry-sdk
  opentelemetry-semantic-conventions opentelemetry-exporter-prometheus)

say() { echo "gpu-trial-prepare: $*" >&2; }

# The version of each package in the CPU test environment, so that the GPU
# node runs what the tests ran; the newest otherwise.
pinned() {
  local venv=${EREBINE_TEST_LMCACHE_VENV:-$HOME/.cache/erebine/lmcache-$LMCACHE_VERSION}
  local name=$1 normal
  normal=$(echo "$name" | tr '_' '-' | tr '[:upper:]' '[:lower:]')
  if [ -x "$venv/bin/python" ]; then
    "$venv/bin/python" -m pip list --format=freeze 2>/dev/null |
      awk -F== -v n="$normal" '{k=tolower($1); gsub("_","-",k)} k==n {print $1"=="$2}'
  fi
}

fetch_wheels() {
  rm -rf "$KIT/wheels"
  mkdir -p "$KIT/wheels"
  local venv=${EREBINE_TEST_LMCACHE_VENV:-$HOME/.cache/erebine/lmcache-$LMCACHE_VERSION}
  [ -x "$venv/bin/python" ] ||
    say "no CPU test environment at $venv (scripts/setup-lmcache.sh makes it): the packages besides LMCache are the newest the index has, not the versions the tests ran"
  local specs=("lmcache==$LMCACHE_VERSION") name spec
  for name in "${PACKAGES[@]}"; do
    spec=$(pinned "$name")
    specs+=("${spec:-$name}")
  done
  say "downloading ${#specs[@]} wheels for CPython $PYTHON_VERSION"
  python3 -m pip download -q --no-deps --only-binary=:all: \
    --python-version "$PYTHON_VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$KIT/wheels" "${specs[@]}"
}

fetch_sources() {
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  local url
  url=$(curl -fsS "https://pypi.org/simple/lmcache/" |
    grep -o "https://[^\"#]*/lmcache-$LMCACHE_VERSION.tar.gz" | head -1)
  [ -n "$url" ] || { say "no sdist of lmcache $LMCACHE_VERSION on the index"; exit 1; }
  say "downloading the LMCache $LMCACHE_VERSION sdist for its CUDA sources"
  curl -fsS -o "$tmp/sdist.tar.gz" "$url"
  echo "$SDIST_SHA256  $tmp/sdist.tar.gz" | sha256sum -c --quiet
  tar -xzf "$tmp/sdist.tar.gz" -C "$tmp" "lmcache-$LMCACHE_VERSION/csrc"
  tar -czf "$KIT/csrc.tar.gz" -C "$tmp/lmcache-$LMCACHE_VERSION" csrc
}

BINS=(lmcache-tier erebine-lmcache)

# The binaries named by --binaries, checked before anything is downloaded.
check_binaries() {
  local bin
  for bin in "${BINS[@]}"; do
    [ -x "$BINARIES/$bin" ] || { say "no executable $BINARIES/$bin (--binaries names the directory that holds both)"; exit 2; }
  done
  "$BINARIES/lmcache-tier" --version 2>/dev/null | grep -q '^lmcache-tier ' ||
    { say "$BINARIES/lmcache-tier --version does not name lmcache-tier: not this project's binary"; exit 2; }
}

build_binaries() {
  local bin from
  if [ -n "$BINARIES" ]; then
    from=$BINARIES
    say "taking the binaries from $from: $("$from/lmcache-tier" --version)"
  else
    say "building the release binaries"
    (cd "$ROOT" && cargo build -q --release -p lmcache-tier --bins)
    from=${CARGO_TARGET_DIR:-$ROOT/target}/release
  fi
  rm -rf "${KIT:?}/bin"
  mkdir -p "$KIT/bin"
  for bin in "${BINS[@]}"; do
    strip -o "$KIT/bin/$bin" "$from/$bin"
    gzip -f "$KIT/bin/$bin"
  done
}

[ -z "$BINARIES" ] || check_binaries
mkdir -p "$KIT"
fetch_wheels
fetch_sources
build_binaries
say "kit ready: $(du -sh "$KIT" | cut -f1) in $KIT"
