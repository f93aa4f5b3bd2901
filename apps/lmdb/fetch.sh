#!/bin/bash
# Fetches LMDB's C source, pinned, from Debian's archive and applies our PMO patch.
#
#   apps/lmdb/fetch.sh            -> target/lmdb/src/libraries/liblmdb (patched)
#
# The tarball is Debian's lmdb_0.9.24.orig.tar.gz (the upstream release that bookworm ships),
# checked against its SHA-256 from the Debian source package. The download is cached in
# target/lmdb/; the patched tree is rebuilt whenever the patch is newer than it. Nothing of
# LMDB lives in this repository except our patch (apps/lmdb/pmo.patch).
set -euo pipefail

VERSION=0.9.24
SHA256=8e7200fdc9bb09b0cfad1d4eee8b20d539e43fe05c7ef9406247d64659c4a480
URL=http://deb.debian.org/debian/pool/main/l/lmdb/lmdb_${VERSION}.orig.tar.gz

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=$repo/target/lmdb
tarball=$out/lmdb_${VERSION}.orig.tar.gz
patch=$here/pmo.patch
src=$out/src
stamp=$src/.patched

mkdir -p "$out"
# One run at a time (cargo's build.rs and the Makefiles may call this concurrently): a second
# run waits, then finds the tree ready.
exec 9>"$out/.fetch.lock"
flock 9
if [ ! -f "$tarball" ] || ! echo "$SHA256  $tarball" | sha256sum -c --quiet - 2>/dev/null; then
    tmp=$tarball.part
    curl -fsSL --retry 3 -o "$tmp" "$URL" || {
        echo "fetch.sh: cannot download $URL" >&2
        exit 1
    }
    echo "$SHA256  $tmp" | sha256sum -c --quiet - || {
        echo "fetch.sh: $URL does not have the pinned SHA-256 $SHA256" >&2
        rm -f "$tmp"
        exit 1
    }
    mv "$tmp" "$tarball"
fi

if [ -f "$stamp" ] && [ "$stamp" -nt "$patch" ] && [ "$stamp" -nt "$0" ]; then
    exit 0
fi
rm -rf "$src" "$src.tmp"
mkdir -p "$src.tmp"
tar -xzf "$tarball" -C "$src.tmp" --strip-components=1
if [ -f "$patch" ]; then
    patch -d "$src.tmp" -p1 --quiet --forward <"$patch" || {
        echo "fetch.sh: $patch does not apply to LMDB $VERSION" >&2
        exit 1
    }
fi
touch "$src.tmp/.patched"
mv "$src.tmp" "$src"
echo "LMDB $VERSION ready in $src/libraries/liblmdb"
