#!/usr/bin/env bash
# Makes sure podman (Debian's 4.3.1), runc, catatonit and debootstrap are
# installed, and podman-compose 1.2.0 in a virtual environment, writes the
# containers.conf the image's tests run podman with, and prints the
# directory that holds both on stdout:
#
#   <dir>/containers.conf     the tests set CONTAINERS_CONF to it
#   <dir>/bin/podman-compose  podman-compose 1.2.0
#
# Nothing under /etc/containers is changed.
#
# podman-compose comes from PyPI, not Debian: Debian's 1.0.3 adds a
# project network to every container, and podman refuses a second network
# beside `network_mode: host` ("cannot set multiple networks without bridge
# network mode"), the only mode the tests use (loopback only).
#
# containers.conf holds what a small shared machine needs and a node does
# not:
# - `runtime = "runc"`: crun 1.8 cannot set up a container on a host whose
#   cgroup v1 tree is mixed with a cgroup v2 mount (the "hybrid" layout);
#   runc can.
# - `default_ulimits`: podman asks for 1,048,576 open files and 4,194,304
#   processes by default, and a host whose hard limits are lower refuses to
#   start the container (runc: `error setting rlimits ... operation not
#   permitted`). Open files: the host's hard limit. Processes: 32,768, the
#   most such a host was seen to grant (65,536 was refused where the hard
#   limit read 96,369), or the hard limit when lower.
#
# Where: $EREBINE_PODMAN_DIR, else ~/.cache/erebine/podman. Installing
# needs root and apt; about a minute.
set -euo pipefail
dir="${EREBINE_PODMAN_DIR:-$HOME/.cache/erebine/podman}"
compose_version=1.2.0
python="${PYTHON:-python3}"
bins=(podman runc catatonit debootstrap)
missing=()
for bin in "${bins[@]}"; do
  PATH="$PATH:/usr/sbin:/sbin" command -v "$bin" >/dev/null || missing+=("$bin")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-podman: reusing podman $(podman --version | sed 's/.* //')" >&2
else
  echo "setup-podman: installing podman, runc, catatonit and debootstrap with apt-get (about a minute)" >&2
  "$(dirname "$0")/apt-install.sh" setup-podman podman runc catatonit debootstrap uidmap
fi

venv="$dir/podman-compose-$compose_version"
if [ "$("$venv/bin/podman-compose" --version 2>/dev/null | sed -n 's/^podman-compose version //p')" != "$compose_version" ]; then
  echo "setup-podman: installing podman-compose==$compose_version into $venv" >&2
  rm -rf "$venv"
  mkdir -p "$dir"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "podman-compose==$compose_version" >&2
fi
mkdir -p "$dir/bin"
ln -sfn "$venv/bin/podman-compose" "$dir/bin/podman-compose"

nofile="$(ulimit -Hn)"
nproc="$(ulimit -Hu)"
[ "$nofile" = unlimited ] && nofile=1048576
if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
cat >"$dir/containers.conf.tmp" <<CONF
# Written by scripts/setup-podman.sh of lmcache-tier (see that script).
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
CONF
mv "$dir/containers.conf.tmp" "$dir/containers.conf"
echo "$dir"
