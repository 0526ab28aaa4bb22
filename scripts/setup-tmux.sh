#!/usr/bin/env bash
# Makes sure tmux is installed, from Debian's `tmux` package, and prints its
# path on stdout. The `inspect --watch` tests run the view in a detached tmux
# session and read its screen. Installing needs root, or sudo.
set -euo pipefail
if command -v tmux >/dev/null; then
  echo "setup-tmux: reusing $(command -v tmux)" >&2
else
  echo "setup-tmux: installing Debian's tmux package" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup-tmux: run as root, or install the tmux package" >&2; exit 1; }
    sudo=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y --no-install-recommends tmux >&2 \
    || { $sudo apt-get update >&2 && $sudo apt-get install -y --no-install-recommends tmux >&2; }
fi
command -v tmux
