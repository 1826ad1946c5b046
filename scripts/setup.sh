#!/usr/bin/env bash
# Installs what building and testing need, plus any Debian packages named as arguments (scripts/bench.sh adds
# runsc), idempotently: nothing is installed twice, and apt-get update runs only when a package is missing.
# python-is-python3 and python3-pip give sandboxes E2B's `python` and `pip` (the e2b template reads the host's /usr);
# node-typescript, openjdk-17-jdk-headless and r-base-core give the code interpreter its TypeScript, Java and R
# kernels.
#
#   scripts/setup.sh [PACKAGE...]
set -euo pipefail

packages=(gcc g++ make nodejs node-typescript openjdk-17-jdk-headless r-base-core python3 python-is-python3 python3-pip python3-numpy python3-pandas python3-matplotlib python3-requests bubblewrap iproute2 util-linux curl git openssl "$@")
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

# The gvisor tier needs runsc, which Debian ships in bookworm-backports: add that suite (from the mirror the system's
# own sources already name) and install runsc from it.
if ! command -v runsc >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: runsc is missing (the gvisor tier); run as root to install it" >&2
    exit 1
  fi
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  backports=/etc/apt/sources.list.d/sandkasten-backports.sources
  if ! grep -rqs "${codename}-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    mirror=$(grep -hm1 -oE '^URIs: *[^ ]+/debian/?$' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}')
    [ -n "$mirror" ] || mirror=$(grep -hm1 -oE '^deb +[^ ]+/debian/? ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}')
    if [ -z "$mirror" ]; then
      echo "setup: cannot find the Debian mirror in the apt sources to add ${codename}-backports" >&2
      exit 1
    fi
    printf 'Types: deb\nURIs: %s\nSuites: %s-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$mirror" "$codename" > "$backports"
  fi
  apt-get update -qq
  # --reinstall: the package may be installed with its binary gone (removed by hand).
  reinstall=
  dpkg -s runsc >/dev/null 2>&1 && reinstall=--reinstall
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $reinstall -t "${codename}-backports" runsc
fi

# The microvm tier: QEMU (from the backports suite added above), the guest kernel, initramfs and root image.
"$(dirname "$0")/setup-microvm.sh"

command -v cargo-nextest >/dev/null 2>&1 || cargo install --locked cargo-nextest
"$(dirname "$0")/setup-e2b.sh"
"$(dirname "$0")/setup-python-sdk.sh"
"$(dirname "$0")/setup-mcp.sh"
"$(dirname "$0")/setup-s3-test-server.sh"
