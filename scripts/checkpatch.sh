#!/usr/bin/env bash
# Runs the kernel's checkpatch.pl --strict on the guest driver and its uapi headers.
#
# checkpatch.pl is not in Debian's headers packages; it ships in linux-source-6.1. We download
# that package once (apt-get download, no install) and keep only checkpatch.pl and the two data
# files it reads, under target/checkpatch/.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir="$repo/target/checkpatch"
tool="$dir/scripts/checkpatch.pl"

if [[ ! -x $tool ]]; then
    mkdir -p "$dir"
    work=$(mktemp -d)
    chmod 755 "$work" # apt-get download drops privileges to _apt
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && apt-get download -q linux-source-6.1 >/dev/null)
    deb=$(ls "$work"/linux-source-6.1_*.deb)
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work" --wildcards './usr/src/linux-source-6.1.tar.xz'
    tar -xJf "$work/usr/src/linux-source-6.1.tar.xz" -C "$dir" --strip-components=1 \
        linux-source-6.1/scripts/checkpatch.pl \
        linux-source-6.1/scripts/spelling.txt \
        linux-source-6.1/scripts/const_structs.checkpatch
fi

cd "$repo"
files=(guest/driver/*.c guest/driver/*.h guest/include/uapi/*.h)
"$tool" --strict --no-tree --terse -f "${files[@]}"
echo "checkpatch.sh: ${files[*]} clean"
