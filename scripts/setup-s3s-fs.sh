#!/usr/bin/env bash
# Makes sure s3s-fs (a real S3 server on a local directory that checks SigV4
# signatures strictly) is installed, and prints the path of its binary on
# stdout. The end-to-end tests run the S3 gateway against it beside moto.
#
# Where: $EREBINE_S3S_FS_ROOT, else ~/.cache/erebine/s3s-fs-0.14.1 (outside the
# clone, so every clone and CI run reuses it). The first install builds it with
# cargo from crates.io: about 2 minutes on 2 cores. 0.14.1 is the newest that
# builds with Rust 1.94/1.95.
set -euo pipefail
S3S_FS_VERSION=0.14.1
root="${EREBINE_S3S_FS_ROOT:-$HOME/.cache/erebine/s3s-fs-$S3S_FS_VERSION}"
bin="$root/bin/s3s-fs"

if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q " $S3S_FS_VERSION\$"; then
  echo "setup-s3s-fs: reusing $bin" >&2
else
  echo "setup-s3s-fs: installing s3s-fs $S3S_FS_VERSION into $root (about 2 minutes)" >&2
  cargo install --quiet --locked --force "s3s-fs@$S3S_FS_VERSION" --features binary --root "$root"
fi
echo "$bin"
