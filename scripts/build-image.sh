#!/usr/bin/env bash
# Builds the node's image (deploy/image/Containerfile) with podman and
# prints its name on stdout: localhost/lmcache-tier:<version>, also tagged
# :latest. docs/image.md says what is in it and how to run it.
#
#   scripts/build-image.sh                  # release build of the binaries
#   EREBINE_IMAGE_BIN_DIR=target/debug scripts/build-image.sh
#
# Steps, each reused when done before:
# 1. podman and its configuration (scripts/setup-podman.sh; CONTAINERS_CONF
#    is set to the containers.conf it writes unless already set);
# 2. the base: Debian bookworm (minbase) from debootstrap, kept as a tar in
#    ~/.cache/erebine/image and imported as localhost/erebine-base:bookworm-minbase
#    (no registry is needed);
# 3. the binaries `lmcache-tier` and `erebine-lmcache`: `cargo build
#    --release`, or those in $EREBINE_IMAGE_BIN_DIR;
# 4. `podman build` in docker format (podman keeps HEALTHCHECK only there),
#    with host networking for apt and pip, and a pip cache kept in
#    ~/.cache/erebine/image/pip, so a rebuild after a change of
#    LMCACHE_VERSION downloads nothing twice. Only the last layer (the
#    binaries) changes with the code: a rebuild after a code change takes
#    seconds.
#
# LMCACHE_VERSION (default 0.5.6) and EREBINE_IMAGE_VERSION (default: the
# package version and the commit) go to the build. Needs root; the first
# build downloads about 130 MB of Debian packages and 3 GB of Python
# wheels, and holds about 7 GB in podman's storage.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="$HOME/.cache/erebine/image"
base="localhost/erebine-base:bookworm-minbase"
lmcache_version="${LMCACHE_VERSION:-0.5.6}"
say() { echo "build-image: $*" >&2; }

CONTAINERS_CONF="${CONTAINERS_CONF:-$("$root/scripts/setup-podman.sh")/containers.conf}"
export CONTAINERS_CONF
mkdir -p "$cache/pip"

if podman image exists "$base"; then
  say "reusing the base $base"
else
  tar="$cache/debian-bookworm-minbase.tar"
  if [ ! -s "$tar" ]; then
    say "debootstrap of Debian bookworm (minbase) into a temporary folder (a few minutes)"
    rootfs="$(mktemp -d /var/tmp/erebine-rootfs.XXXXXX)"
    trap 'rm -rf "$rootfs"' EXIT
    PATH="$PATH:/usr/sbin:/sbin" debootstrap --variant=minbase bookworm "$rootfs" \
      http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 ||
      { say "debootstrap failed; see $cache/debootstrap.log"; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar --numeric-owner -C "$rootfs" -cf "$tar.tmp" .
    mv "$tar.tmp" "$tar"
  fi
  say "importing $tar as $base"
  podman import --quiet "$tar" "$base" >/dev/null
fi

if [ -n "${EREBINE_IMAGE_BIN_DIR:-}" ]; then
  bin_dir="$(cd "$EREBINE_IMAGE_BIN_DIR" && pwd)"
else
  say "cargo build --release of lmcache-tier and erebine-lmcache"
  (cd "$root" && cargo build --release --quiet --bin lmcache-tier --bin erebine-lmcache >&2)
  bin_dir="$root/target/release"
fi
context="$cache/context"
mkdir -p "$context/bin"
for bin in lmcache-tier erebine-lmcache; do
  [ -x "$bin_dir/$bin" ] || { say "no $bin in $bin_dir"; exit 1; }
  # Without debug information (a debug build's is about 250 MB), and
  # replaced only when changed, so that the layer's checksum (and podman's
  # cache) follows the binary's content.
  strip --strip-debug -o "$context/bin/$bin.new" "$bin_dir/$bin"
  if cmp -s "$context/bin/$bin.new" "$context/bin/$bin"; then
    rm "$context/bin/$bin.new"
  else
    mv "$context/bin/$bin.new" "$context/bin/$bin"
  fi
done
cp "$root/deploy/image/Containerfile" "$context/Containerfile"

package_version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)"
commit="$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
version="${EREBINE_IMAGE_VERSION:-$package_version-$commit}"
image="localhost/lmcache-tier:$version"
pip_args=()
[ -n "${PIP_INDEX_URL:-}" ] && pip_args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")
if [ -n "${PIP_CERT:-}" ]; then
  pip_args+=(--volume "$PIP_CERT:/run/build-ca.crt:ro" --build-arg PIP_CERT=/run/build-ca.crt)
fi
say "podman build $image (the first build takes about 6 minutes on 2 cores, more on a slow link: LMCache and torch, about 6.6 GB)"
podman build --format docker --network host --layers \
  --volume "$cache/pip:/root/.cache/pip" \
  "${pip_args[@]}" \
  --build-arg "BASE=$base" \
  --build-arg "LMCACHE_VERSION=$lmcache_version" \
  --build-arg "VERSION=$version" \
  --tag "$image" --tag localhost/lmcache-tier:latest \
  --file "$context/Containerfile" "$context" >&2
echo "$image"
