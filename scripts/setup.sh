#!/usr/bin/env bash
# Installs the Debian packages that building the guest image and running the VM tests need.
#
# Idempotent and fast when everything is already there: it only runs `apt-get update` and
# `apt-get install` when a package is missing. Run as root on Debian 12 (bookworm).
#
# What and why:
#   qemu-system-x86      the nested QEMU-TCG test host (this machine's /dev/kvm cannot run Linux)
#   busybox-static       /init and tools of the guest and test-host initramfs (static: no libc inside)
#   cpio gzip xz-utils zstd   building initramfs archives, unpacking compressed kernel modules
#   kmod                 modinfo/depmod for inspecting the guest kernel's modules
#   build-essential      building the guest kernel module pmo.ko
#   musl-tools           static C programs for the guest (musl-gcc)
#   acpica-tools         iasl, to disassemble/check the VMM's ACPI tables
#   linux-headers-<abi>-cloud-amd64   headers of the guest kernel, for pmo.ko
#   python3-matplotlib   the PNG plot of scripts/compare.sh (the design comparison)
#   curl patch           apps/lmdb/fetch.sh: LMDB's pinned source from Debian's archive, our patch
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)

pkgs=(qemu-system-x86 busybox-static cpio gzip xz-utils zstd kmod build-essential musl-tools acpica-tools
      python3-matplotlib curl patch)

export DEBIAN_FRONTEND=noninteractive

as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        echo "setup.sh: need root to run: $*" >&2
        exit 1
    fi
}

installed() {
    [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true) == "install ok installed" ]]
}

updated=0
apt_update() {
    if [[ $updated -eq 0 ]]; then
        echo "setup.sh: apt-get update" >&2
        as_root apt-get update -qq
        updated=1
    fi
}

# The headers' name comes from the apt lists; on a fresh machine they are empty, so update first.
if ! release=$("$repo/guest/kernel-release.sh" 2>/dev/null); then
    apt_update
    release=$("$repo/guest/kernel-release.sh")
fi
pkgs+=("linux-headers-$release")

missing=()
for p in "${pkgs[@]}"; do
    installed "$p" || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "setup.sh: all packages present (guest kernel $release)"
    exit 0
fi

# Lists may be stale (Debian replaces security packages), so refresh before installing.
apt_update
# The metapackage may have moved on after the update; install the headers it points at now.
release=$("$repo/guest/kernel-release.sh")
missing=()
for p in "${pkgs[@]:0:${#pkgs[@]}-1}" "linux-headers-$release"; do
    installed "$p" || missing+=("$p")
done
echo "setup.sh: installing ${missing[*]}" >&2
as_root apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup.sh: done (guest kernel $release)"
