#!/usr/bin/env bash
# Makes sure tmux is installed, from Debian's `tmux` package, and prints its
# path on stdout. The `inspect --watch` tests run the view in a detached tmux
# session and read its screen. Installing needs root, or sudo.
set -euo pipefail
if command -v tmux >/dev/null; then
  echo "setup-tmux: reusing $(command -v tmux)" >&2
else
  echo "setup-tmux: installing Debian's tmux package" >&2
  "$(dirname "$0")/apt-install.sh" setup-tmux --no-install-recommends tmux
fi
command -v tmux
