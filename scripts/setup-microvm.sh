#!/usr/bin/env bash
# Installs what the microvm tier needs, idempotently, into /var/lib/sandkasten/microvm (the `[microvm] dir`):
#   vmlinuz      Debian's cloud kernel (extracted from its package, not installed: the host's boot is untouched)
#   initrd.img   busybox (static, from Debian's package), the virtio and overlay modules of that kernel, and
#                resources/microvm/init
#   rootfs.ext4  the guest's read-only root: the files of the host's packages that sandboxes use (root_packages
#                below: the shells and tools, python3 with numpy/pandas/matplotlib, node with typescript, the JDK,
#                R, git, curl, wget, gcc) with everything they depend on, the links update-alternatives made for them,
#                plus the host /etc files that the process tier shows too
# and QEMU (qemu-system-x86 from bookworm-backports, which setup.sh has added). A stamp records what was built from
# what; a changed input rebuilds.
#
#   scripts/setup-microvm.sh
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${SANDKASTEN_MICROVM_DIR:-/var/lib/sandkasten/microvm}
kernel_package=linux-image-cloud-amd64
root_packages=(bash coreutils dash findutils grep sed gawk tar gzip procps iproute2 hostname util-linux python3 python-is-python3
  python3-pip python3-numpy python3-pandas python3-matplotlib python3-requests nodejs node-typescript openjdk-17-jdk-headless
  r-base-core git curl wget openssl ca-certificates gcc libc6-dev make)

if [ "$(id -u)" -ne 0 ]; then
  echo "setup-microvm: run as root (installs QEMU and writes $dir)" >&2
  exit 1
fi
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t "${codename}-backports" qemu-system-x86
fi
missing=()
for package in "${root_packages[@]}" e2fsprogs; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# The kernel package's exact version: what the stamp names.
kernel_image=$(apt-cache depends "$kernel_package" 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
if [ -z "$kernel_image" ]; then
  echo "setup-microvm: apt does not know $kernel_package (run apt-get update?)" >&2
  exit 1
fi
stamp="kernel=$kernel_image init=$(sha256sum resources/microvm/init | cut -c1-16) script=$(sha256sum "$0" | cut -c1-16) packages=$(dpkg-query -W "${root_packages[@]}" | sha256sum | cut -c1-16)"
if [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$stamp" ] && [ -f "$dir/rootfs.ext4" ]; then
  exit 0
fi
echo "setup-microvm: building $dir ($stamp)"
mkdir -p "$dir"
work=$(mktemp -d /var/tmp/sandkasten-microvm.XXXXXX)
trap 'rm -rf "$work"' EXIT

# Kernel and busybox: downloaded and unpacked, never installed.
(cd "$work" && apt-get download -qq "$kernel_image" busybox-static 2>/dev/null)
dpkg-deb -x "$work"/linux-image-*.deb "$work/kernel"
dpkg-deb -x "$work"/busybox-static_*.deb "$work/busybox"
release=$(ls "$work/kernel/lib/modules")
modules="$work/kernel/lib/modules/$release/kernel"

initrd="$work/initrd"
mkdir -p "$initrd/bin" "$initrd/modules" "$initrd/dev" "$initrd/proc" "$initrd/sys"
cp "$work/busybox/bin/busybox" "$initrd/bin/busybox"
for module in drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_mmio drivers/block/virtio_blk \
  drivers/char/virtio_console fs/overlayfs/overlay; do
  cp "$modules/$module.ko" "$initrd/modules/"
done
install -m 0755 resources/microvm/init "$initrd/init"
(cd "$initrd" && find . | sort | "$work/busybox/bin/busybox" cpio -o -H newc 2>/dev/null) > "$work/initrd.img"

# The root: every file of the packages above and of what they depend on (as installed on this host).
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
  --no-enhances "${root_packages[@]}" 2>/dev/null | grep -v '^ ' | grep -v '^<' | sort -u)
installed=$( (dpkg-query -W -f '${binary:Package} ${db:Status-Status}\n' $closure 2>/dev/null || true) | awk '$2 == "installed" {print $1}')
rootfs="$work/rootfs"
mkdir -p "$rootfs/usr"
for link in bin sbin lib lib64; do
  if [ -L "/$link" ]; then ln -s "$(readlink "/$link")" "$rootfs/$link"; fi
done
# On a merged-/usr host, /bin is a link to usr/bin: name every file by its path under usr, so that the links made
# above are never replaced by directories.
merged_usr() {
  local rules=()
  for link in bin sbin lib lib64; do
    if [ "$(readlink "/$link")" = "usr/$link" ]; then rules+=(-e "s#^$link/#usr/$link/#"); fi
  done
  if [ "${#rules[@]}" -gt 0 ]; then sed "${rules[@]}"; else cat; fi
}
{ dpkg -L $installed 2>/dev/null || true; } | sort -u | while read -r path; do
  if [ -f "$path" ] || [ -L "$path" ]; then printf '%s\n' "${path#/}"; fi
done | merged_usr | sort -u > "$work/files"
tar -C / --no-recursion -T "$work/files" -cf - 2>/dev/null | tar -C "$rootfs" --keep-directory-symlink -xf -
for path in /etc/ssl /etc/ca-certificates /etc/ld.so.conf /etc/ld.so.conf.d /etc/alternatives /etc/localtime /etc/R \
  /etc/protocols /etc/services /etc/mime.types /etc/gai.conf; do
  if [ -e "$path" ] || [ -L "$path" ]; then cp -a --parents "$path" "$rootfs/"; fi
done
# The links update-alternatives made (awk → gawk, java → the JDK's, libblas.so.3 → OpenBLAS, …), which no package's
# file list holds: every link and slave link of the host's alternatives whose chosen file the root has.
for name in $(ls /var/lib/dpkg/alternatives); do
  update-alternatives --query "$name" 2>/dev/null | awk '/^$/ {done = 1} !done && /^Link: / {print $2} !done && /^ / {print $2}'
done | sort -u | while read -r link; do
  if [ -L "$link" ] && [[ "$(readlink "$link")" == /etc/alternatives/* ]] && [ -e "$rootfs$(readlink -f "$link")" ]; then
    mkdir -p "$rootfs$(dirname "$link")"
    cp -a "$link" "$rootfs$link"
  fi
done
ldconfig -r "$rootfs" 2>/dev/null || true
for mountpoint in dev proc sys tmp run workspace .sandkasten/agent; do
  mkdir -p "$rootfs/$mountpoint"
done
chmod 1777 "$rootfs/tmp"
size_mib=$(( $(du -sm "$rootfs" | cut -f1) * 12 / 10 + 64 ))
truncate -s "${size_mib}M" "$work/rootfs.ext4"
mkfs.ext4 -q -F -L sandkasten-root -O ^has_journal -d "$rootfs" "$work/rootfs.ext4"

install -m 0644 "$work/kernel/boot/vmlinuz-$release" "$dir/vmlinuz"
install -m 0644 "$work/initrd.img" "$dir/initrd.img"
mv "$work/rootfs.ext4" "$dir/rootfs.ext4"
chmod 0644 "$dir/rootfs.ext4"
echo "$stamp" > "$dir/stamp"
echo "setup-microvm: $dir ready (kernel $release, root $(du -sh "$dir/rootfs.ext4" | cut -f1))"
