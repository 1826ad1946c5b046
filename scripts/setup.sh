#!/usr/bin/env bash
# Installs what building and testing need, plus any Debian packages named as arguments (scripts/bench.sh adds
# runsc), idempotently: nothing is installed twice, and apt-get update runs only when a package is missing.
#
#   scripts/setup.sh [PACKAGE...]
set -euo pipefail

packages=(gcc nodejs python3 python3-numpy python3-pandas python3-matplotlib python3-requests bubblewrap iproute2 util-linux curl git openssl "$@")
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages: ${missing[*]} (run as root to install them)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

command -v cargo-nextest >/dev/null 2>&1 || cargo install --locked cargo-nextest
"$(dirname "$0")/setup-e2b.sh"
