#!/usr/bin/env bash
# Prints the release string (e.g. 6.1.0-56-cloud-amd64) of the kernel that Debian's
# metapackage linux-image-cloud-amd64 currently points at.
#
# Why: the guest kernel, its headers (for pmo.ko) and the nested test host must all use the
# same kernel, and the ABI number changes with every Debian security update, so it is never
# hard-coded; it is read from the apt lists. Exits non-zero with a message when the apt lists
# do not know the metapackage (run scripts/setup.sh, which runs apt-get update if needed).
set -euo pipefail

meta=linux-image-cloud-amd64
# `apt-cache depends` shows the candidate version's dependencies; the metapackage depends on
# exactly one versioned image package.
pkg=$({ apt-cache depends "$meta" 2>/dev/null || true; } \
    | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-cloud-amd64\)$/\1/p')
if [[ -z "$pkg" ]]; then
    echo "kernel-release.sh: apt does not know $meta (no apt lists?); run scripts/setup.sh as root" >&2
    exit 1
fi
echo "${pkg#linux-image-}"
