#!/usr/bin/env bash
# Builds the guest side of PMOs into <repo>/target/guest/:
#
#   pmo.ko           the virtio-pmo driver, against the guest kernel's headers
#                    (KDIR from target/guest/kernel-build-dir, written by guest/build.sh)
#   libpmo.a pmo.h   the C library for guest programs (musl, static), and virtio_pmo.h,
#                    which pmo.h includes
#   pmo              the CLI (static)
#   pmo-bin/         every static guest program to put into the image's /bin
#                    (pmo, pmo_list, pmo_probe, pmo_tier, pmo_bench; LMDB's mtests on PMOs,
#                    lmdb_mtest ... lmdb_mtest6, lmdb_check, lmdb_mdb_stat, from
#                    apps/lmdb/c; YCSB's programs from apps/ycsb/c when that
#                    directory has a Makefile; Filebench's fb_pmo from
#                    apps/filebench/c)
#
# Cached: nothing is rebuilt when the inputs (sources, this script, KDIR, compilers) are
# unchanged. Builds happen in target/guest/pmo-build and target/guest/libpmo-build, so the
# source tree stays clean. guest/build.sh calls this; it can also run on its own.
set -euo pipefail

guest=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$guest/.." && pwd)
out="$repo/target/guest"
mkdir -p "$out"

log() { echo "guest/build-pmo.sh: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

for tool in make gcc musl-gcc ar sha256sum readelf; do
    command -v "$tool" >/dev/null || die "$tool not found; run scripts/setup.sh as root"
done

if [[ -s "$out/kernel-build-dir" ]]; then
    kdir=$(cat "$out/kernel-build-dir")
else
    kdir="/usr/src/linux-headers-$("$guest/kernel-release.sh")"
fi
[[ -f "$kdir/Makefile" ]] || die "kernel headers $kdir missing; run guest/build.sh or scripts/setup.sh"

progs=(pmo pmo_list pmo_probe pmo_tier)
outputs=("$out/pmo.ko" "$out/libpmo.a" "$out/pmo.h" "$out/pmo")
for p in "${progs[@]}"; do outputs+=("$out/pmo-bin/$p"); done
outputs+=("$out/pmo-bin/pmo_bench")
lmdb_bins=(lmdb_mtest lmdb_mtest2 lmdb_mtest3 lmdb_mtest4 lmdb_mtest5 lmdb_mtest6 lmdb_check lmdb_mdb_stat)
for p in "${lmdb_bins[@]}"; do outputs+=("$out/pmo-bin/$p"); done
ycsb_mk="$repo/apps/ycsb/c/Makefile"
ycsb_bins=()
if [[ -f $ycsb_mk ]]; then
    read -r -a ycsb_bins < <(make -s -C "$repo/apps/ycsb/c" guest-bins) ||
        die "make -C apps/ycsb/c guest-bins failed"
    for p in "${ycsb_bins[@]}"; do outputs+=("$out/pmo-bin/$p"); done
fi
fb_dir="$repo/apps/filebench/c"
[[ -f $fb_dir/Makefile ]] || die "apps/filebench/c/Makefile missing"
fb_list=$(make -s -C "$fb_dir" guest-bins) || die "make -C apps/filebench/c guest-bins failed"
read -r -a fb_bins <<<"${fb_list//$'\n'/ }"
[[ ${#fb_bins[@]} -gt 0 ]] || die "make -C apps/filebench/c guest-bins printed no programs"
for p in "${fb_bins[@]}"; do outputs+=("$out/pmo-bin/$p"); done

stamp="$out/pmo-build.inputs"
sum=$( (
    echo "$kdir"
    cat "$kdir/include/config/kernel.release" 2>/dev/null || true
    gcc --version | head -1
    musl-gcc --version | head -1
    cd "$guest" && find build-pmo.sh include driver libpmo tools bench -type f ! -name '.gitignore' -print0 |
        LC_ALL=C sort -z | xargs -0 sha256sum
    # LMDB (fetch.sh, our patch, apps/lmdb/c), YCSB's and Filebench's C sides, when present.
    cd "$repo"
    apps=()
    for a in apps/lmdb/fetch.sh apps/lmdb/pmo.patch apps/lmdb/c apps/ycsb/c apps/filebench/c; do
        [[ -e $a ]] && apps+=("$a")
    done
    find "${apps[@]}" -type f ! -name '.gitignore' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
) | sha256sum | cut -d' ' -f1)
fresh=1
for f in "${outputs[@]}"; do [[ -f "$f" ]] || fresh=0; done
if [[ $fresh -eq 1 && -f "$stamp" && $(cat "$stamp") == "$sum" ]]; then
    log "up to date"
    exit 0
fi
rm -f "$stamp"

# 1. pmo.ko, from a copy so kbuild's files stay out of the tree.
log "building pmo.ko against $kdir"
build="$out/pmo-build"
rm -rf "$build"
mkdir -p "$build/driver" "$build/include/uapi"
cp "$guest"/driver/*.c "$guest"/driver/*.h "$guest/driver/Kbuild" "$build/driver/"
cp "$guest"/include/uapi/*.h "$build/include/uapi/"
make -s -C "$kdir" M="$build/driver" modules >"$build/kbuild.log" 2>&1 || {
    cat "$build/kbuild.log" >&2
    die "pmo.ko build failed"
}
# kbuild notes (e.g. BTF skipped without vmlinux) are fine; warnings are not.
if grep -E 'warning:|error:' "$build/kbuild.log" >&2; then
    die "pmo.ko built with warnings"
fi
cp "$build/driver/pmo.ko" "$out/pmo.ko.tmp" && mv "$out/pmo.ko.tmp" "$out/pmo.ko"

# 2. libpmo.a and pmo.h.
log "building libpmo.a"
libbuild="$out/libpmo-build"
make -s -C "$guest/libpmo" O="$libbuild" CC=musl-gcc all >&2 || die "libpmo build failed"
cp "$libbuild/libpmo.a" "$out/libpmo.a"
cp "$guest/libpmo/pmo.h" "$guest/include/uapi/virtio_pmo.h" "$out/"

# 3. Static guest programs.
log "building ${progs[*]}"
mkdir -p "$out/pmo-bin"
for p in "${progs[@]}"; do
    # pmo_probe's checks live beside it in probe_*.c (probe.h), one file per concern.
    srcs=("$guest/tools/$p.c")
    [[ $p == pmo_probe ]] && srcs+=("$guest"/tools/probe_*.c)
    musl-gcc -static -O2 -std=c11 -Wall -Wextra -Werror -I"$guest/libpmo" -I"$guest/include/uapi" -isystem "$libbuild/uapi" \
        "${srcs[@]}" "$libbuild/libpmo.a" -pthread -o "$out/pmo-bin/$p.tmp" ||
        die "$p build failed"
    if readelf -l "$out/pmo-bin/$p.tmp" | grep -q INTERP; then
        die "$p is dynamically linked"
    fi
    mv "$out/pmo-bin/$p.tmp" "$out/pmo-bin/$p"
done
cp "$out/pmo-bin/pmo" "$out/pmo"

# 4. pmo_bench, the papers' microbenchmarks (guest/bench, its own Makefile).
make -s -C "$guest/bench" O="$out/bench-build" LIBPMO="$libbuild" CC=musl-gcc all >&2 ||
    die "pmo_bench build failed"
if readelf -l "$out/bench-build/pmo_bench" | grep -q INTERP; then
    die "pmo_bench is dynamically linked"
fi
cp "$out/bench-build/pmo_bench" "$out/pmo-bin/pmo_bench.tmp" && mv "$out/pmo-bin/pmo_bench.tmp" "$out/pmo-bin/pmo_bench"

# 5. LMDB on PMOs (apps/lmdb/c: fetches and patches LMDB, builds its mtests on libpmo).
log "building LMDB on PMOs: ${lmdb_bins[*]}"
make -s -C "$repo/apps/lmdb/c" guest O="$out/lmdb-build" LIBPMO="$libbuild" >&2 ||
    die "LMDB (apps/lmdb/c) build failed"
copy_static() { # DIR PROG...: check each is static, copy it into pmo-bin
    local dir=$1 p
    shift
    for p in "$@"; do
        [[ -f $dir/$p ]] || die "$dir/$p was not built"
        if readelf -l "$dir/$p" | grep -q INTERP; then
            die "$p is dynamically linked"
        fi
        cp "$dir/$p" "$out/pmo-bin/$p.tmp" && mv "$out/pmo-bin/$p.tmp" "$out/pmo-bin/$p"
    done
}
copy_static "$out/lmdb-build" "${lmdb_bins[@]}"

# 6. YCSB on LMDB on PMOs, when apps/ycsb/c has its Makefile.
if [[ -f $ycsb_mk ]]; then
    log "building YCSB: ${ycsb_bins[*]}"
    make -s -C "$repo/apps/ycsb/c" guest O="$out/ycsb-build" LIBPMO="$libbuild" \
        LMDB="$out/lmdb-build" >&2 || die "YCSB (apps/ycsb/c) build failed"
    copy_static "$out/ycsb-build" "${ycsb_bins[@]}"
else
    log "no apps/ycsb/c/Makefile: YCSB not built"
fi

# 7. Filebench's personalities on PMOs (apps/filebench/c: fb_pmo, one PMO per file).
log "building Filebench: ${fb_bins[*]}"
make -s -C "$fb_dir" guest O="$out/filebench-build" LIBPMO="$libbuild" >&2 ||
    die "Filebench (apps/filebench/c) build failed"
copy_static "$out/filebench-build" "${fb_bins[@]}"

echo "$sum" >"$stamp"
log "ok: pmo.ko ($(uname -m) guest $(basename "$kdir")), libpmo.a, pmo.h, ${progs[*]} pmo_bench ${lmdb_bins[*]} ${ycsb_bins[*]} ${fb_bins[*]}"
