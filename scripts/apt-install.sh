#!/usr/bin/env bash
# Installs Debian packages for the tests, leaving the machine's services as
# they were: `scripts/apt-install.sh <name> <apt-get install argument>...`
# runs apt-get install (and apt-get update, then again, when the install
# fails without it),
# with a policy-rc.d that denies every service start for the length of the
# install, and afterwards disables each systemd unit the install enabled
# (prometheus, memcached, the Swift servers...). The tests start the
# servers they need themselves, on loopback, from the installed binaries.
# `<name>` prefixes its lines on stderr. Needs root, or sudo.
set -euo pipefail
name="$1"
shift
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "$name: run as root, or install: $*" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive

# The units enabled now, as the symbolic links of the targets' .wants/.
enabled() {
  find /etc/systemd/system -path '*.wants/*' -printf '%f\n' 2>/dev/null | sort -u
}
before="$(enabled)"

# A policy-rc.d of our own, unless the machine has one (then it decides).
policy=/usr/sbin/policy-rc.d
ours=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# scripts/apt-install.sh: no service starts during the install.\nexit 101\n' |
    $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
  ours=1
fi
cleanup() { [ -z "$ours" ] || $sudo rm -f "$policy"; }
trap cleanup EXIT

$sudo apt-get install -y -q "$@" >&2 ||
  { $sudo apt-get update -q >&2 && $sudo apt-get install -y -q "$@" >&2; }

# What the install enabled, disabled again: systemctl disables a unit
# whether or not systemd runs (it removes the links; Debian's maintainer
# scripts then keep it disabled on upgrades); without systemctl, the links
# are removed.
for unit in $(comm -13 <(printf '%s\n' "$before") <(enabled)); do
  if command -v systemctl >/dev/null; then
    $sudo systemctl disable --quiet "$unit" >&2 2>/dev/null || true
  else
    $sudo find /etc/systemd/system -path "*.wants/$unit" -delete
  fi
  echo "$name: $unit left disabled, as it was before the install" >&2
done
