#!/usr/bin/env bash
# Makes sure a Python virtual environment with the real LMCache
# (lmcache==$LMCACHE_VERSION, default 0.5.6), boto3 and a local S3 server
# (moto) exists, and prints its path on stdout. boto3: LMCache's S3 adapter
# needs it to read the S3 gateway's per-launch key from the server's
# environment (docs/s3-gateway.md), and lmcache does not depend on it.
#
# Where: $EREBINE_LMCACHE_VENV, else ~/.cache/erebine/lmcache-$LMCACHE_VERSION
# (outside the clone, so every clone and CI run reuses it). An existing
# environment is reused when its lmcache version matches; otherwise it is
# rebuilt. The first install downloads about 6 GB (torch) and takes a few
# minutes. Other versions than 0.5.6 are for scripts/compat.sh.
set -euo pipefail
LMCACHE_VERSION="${LMCACHE_VERSION:-0.5.6}"
venv="${EREBINE_LMCACHE_VENV:-$HOME/.cache/erebine/lmcache-$LMCACHE_VERSION}"
python="${PYTHON:-python3}"

# Packages a version needs that its own dependencies leave out.
case "$LMCACHE_VERSION" in
  # The `lmcache` command of 0.5.4 and 0.5.5 imports `openai` at start (for
  # `lmcache bench engine`) and fails without it; 0.5.6 imports it lazily.
  0.5.4 | 0.5.5) extra="openai" ;;
  *) extra="" ;;
esac

installed_version() {
  "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("lmcache"))' 2>/dev/null || true
}
has_packages() {
  local p
  for p in boto3 moto $extra; do
    "$venv/bin/python" -c "import importlib.metadata as m; m.version('$p')" >/dev/null 2>&1 || return 1
  done
}

if [ "$(installed_version)" = "$LMCACHE_VERSION" ] && has_packages && [ -x "$venv/bin/lmcache" ]; then
  echo "setup-lmcache: reusing $venv (lmcache $LMCACHE_VERSION)" >&2
else
  echo "setup-lmcache: installing lmcache==$LMCACHE_VERSION into $venv (a few minutes, about 6 GB)" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
  # shellcheck disable=SC2086 # $extra is a list of package names
  "$venv/bin/pip" install --quiet --disable-pip-version-check "lmcache==$LMCACHE_VERSION" boto3 "moto[server]" $extra
  [ "$(installed_version)" = "$LMCACHE_VERSION" ] || { echo "setup-lmcache: lmcache $LMCACHE_VERSION did not install" >&2; exit 1; }
fi
echo "$venv"
