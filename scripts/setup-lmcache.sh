#!/usr/bin/env bash
# Makes sure a Python virtual environment with the real LMCache (lmcache==0.5.6)
# and a local S3 server (moto) exists, and prints its path on stdout.
#
# Where: $EREBINE_LMCACHE_VENV, else ~/.cache/erebine/lmcache-0.5.6 (outside the
# clone, so every clone and CI run reuses it). An existing environment is reused
# when its lmcache version matches; otherwise it is rebuilt. The first install
# downloads about 6 GB (torch) and takes a few minutes.
set -euo pipefail
LMCACHE_VERSION=0.5.6
venv="${EREBINE_LMCACHE_VENV:-$HOME/.cache/erebine/lmcache-$LMCACHE_VERSION}"
python="${PYTHON:-python3}"

installed_version() {
  "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("lmcache"))' 2>/dev/null || true
}
has_moto() {
  "$venv/bin/python" -c 'import importlib.metadata as m; m.version("moto")' >/dev/null 2>&1
}

if [ "$(installed_version)" = "$LMCACHE_VERSION" ] && has_moto && [ -x "$venv/bin/lmcache" ]; then
  echo "setup-lmcache: reusing $venv (lmcache $LMCACHE_VERSION)" >&2
else
  echo "setup-lmcache: installing lmcache==$LMCACHE_VERSION into $venv (a few minutes, about 6 GB)" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "lmcache==$LMCACHE_VERSION" "moto[server]"
  [ "$(installed_version)" = "$LMCACHE_VERSION" ] || { echo "setup-lmcache: lmcache $LMCACHE_VERSION did not install" >&2; exit 1; }
fi
echo "$venv"
