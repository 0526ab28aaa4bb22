#!/usr/bin/env bash
# Makes sure a Python virtual environment with the real LMCache
# (lmcache==$LMCACHE_VERSION, default 0.5.6), boto3 and a local S3 server
# (moto) exists, and prints its path on stdout. boto3: LMCache's S3 adapter
# needs it to read the S3 gateway's per-launch key from the server's
# environment (docs/s3-gateway.md), and lmcache does not depend on it.
#
# Where: $EREBINE_LMCACHE_VENV, else ~/.cache/erebine/lmcache-$LMCACHE_VERSION
# (outside the clone, so every clone and CI run reuses it). An existing
# environment is reused when its lmcache version matches (boto3 or moto
# added to it when missing); otherwise it is rebuilt, but only if this
# script made it (the default place, or a .erebine-setup-lmcache marker):
# a folder of yours that EREBINE_LMCACHE_VENV names is never deleted. The
# first install downloads about 6 GB (torch) and takes a few minutes. Other
# versions than 0.5.6 are for scripts/compat.sh.
set -euo pipefail
LMCACHE_VERSION="${LMCACHE_VERSION:-0.5.6}"
default_venv="$HOME/.cache/erebine/lmcache-$LMCACHE_VERSION"
venv="${EREBINE_LMCACHE_VENV:-$default_venv}"
marker=".erebine-setup-lmcache"
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
missing_packages() {
  local p
  for p in boto3 "moto[server]" $extra; do
    "$venv/bin/python" -c "import importlib.metadata as m; m.version('${p%%[*}')" >/dev/null 2>&1 || echo "$p"
  done
}
# Whether this script may delete $venv to rebuild it.
ours() {
  [ ! -e "$venv" ] || [ -e "$venv/$marker" ] || [ "$venv" = "$default_venv" ] ||
    [ -z "$(ls -A "$venv" 2>/dev/null)" ]
}

if [ "$(installed_version)" = "$LMCACHE_VERSION" ] && [ -x "$venv/bin/lmcache" ]; then
  missing=$(missing_packages)
  if [ -n "$missing" ]; then
    echo "setup-lmcache: adding $(echo $missing) to $venv" >&2
    # shellcheck disable=SC2086 # $missing is a list of package names
    "$venv/bin/pip" install --quiet --disable-pip-version-check $missing
  fi
  echo "setup-lmcache: reusing $venv (lmcache $LMCACHE_VERSION)" >&2
elif ! ours; then
  echo "setup-lmcache: $venv holds no lmcache $LMCACHE_VERSION and was not made by this script: not touching it. Point EREBINE_LMCACHE_VENV at a new folder, or install lmcache==$LMCACHE_VERSION there yourself" >&2
  exit 1
else
  echo "setup-lmcache: installing lmcache==$LMCACHE_VERSION into $venv (a few minutes, about 6 GB)" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
  touch "$venv/$marker"
  # shellcheck disable=SC2086 # $extra is a list of package names
  "$venv/bin/pip" install --quiet --disable-pip-version-check "lmcache==$LMCACHE_VERSION" boto3 "moto[server]" $extra
  [ "$(installed_version)" = "$LMCACHE_VERSION" ] || { echo "setup-lmcache: lmcache $LMCACHE_VERSION did not install" >&2; exit 1; }
fi
echo "$venv"
