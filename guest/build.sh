#!/usr/bin/env bash
# Builds the guest image and the nested test host image under <repo>/target/guest/.
#
#   target/guest/vmlinuz                 the Debian cloud kernel (bzImage), same for L1 and L2
#   target/guest/kernel-release          e.g. 6.1.0-56-cloud-amd64
#   target/guest/initramfs.cpio.gz       the L2 test guest (guest/init, scenarios, modules)
#   target/guest/testhost.cpio.gz        base initramfs of the nested test host (L1); the VM test
#                                        runner appends a payload archive (VMM, job) per run
#   target/guest/modules/                the kernel's module tree (depmod'ed), from the package
#   target/guest/kernel-build-dir        path of the matching kernel headers (KDIR for pmo.ko)
#
# Why this way: the kernel is Debian's own linux-image-<abi>-cloud-amd64, resolved from the
# metapackage so it follows security updates; it is extracted with dpkg-deb, never installed
# on the host. Results are cached: a second run only rebuilds the initramfs archives when
# their inputs changed, and takes about a second.
#
# Needs the packages that scripts/setup.sh installs; as root it installs missing headers.
set -euo pipefail

guest=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$guest/.." && pwd)
out="$repo/target/guest"
mkdir -p "$out"

log() { echo "guest/build.sh: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

for tool in apt-get apt-cache dpkg-deb depmod cpio gzip; do
    command -v "$tool" >/dev/null || die "$tool not found; run scripts/setup.sh as root"
done
busybox=/bin/busybox
[[ -x $busybox ]] || die "$busybox missing; run scripts/setup.sh (busybox-static)"
file_out=$(LC_ALL=C ldd "$busybox" 2>&1 || true)
[[ $file_out == *"not a dynamic executable"* ]] ||
    die "$busybox is dynamically linked; install busybox-static (scripts/setup.sh)"

release=$("$guest/kernel-release.sh")
kdir="$out/kernel/$release"

# 1. The kernel package, extracted and depmod'ed once per release.
if [[ ! -f "$kdir/.done" ]]; then
    log "fetching linux-image-$release"
    rm -rf "$kdir" "$out/debs"
    mkdir -p "$out/debs" "$kdir"
    sandbox=()
    # apt drops to user _apt for downloads, which cannot write into a root-owned target/.
    [[ $(id -u) -eq 0 ]] && sandbox=(-o APT::Sandbox::User=root)
    (cd "$out/debs" && apt-get download -q "${sandbox[@]}" "linux-image-$release" >&2) ||
        die "apt-get download linux-image-$release failed (stale apt lists? run scripts/setup.sh)"
    dpkg-deb -x "$out"/debs/linux-image-"$release"_*.deb "$kdir"
    # The package ships no modules.dep (its postinst runs depmod); make our own.
    depmod -b "$kdir" "$release"
    touch "$kdir/.done"
    # Keep only the current release.
    find "$out/kernel" -mindepth 1 -maxdepth 1 ! -name "$release" -exec rm -rf {} +
fi
moddir="$kdir/lib/modules/$release"
cp -u "$kdir/boot/vmlinuz-$release" "$out/vmlinuz"
echo "$release" >"$out/kernel-release.tmp" && mv "$out/kernel-release.tmp" "$out/kernel-release"
ln -sfn "kernel/$release/lib/modules/$release" "$out/modules"
ln -sfn "kernel/$release/boot/config-$release" "$out/kernel-config"

# 2. The matching headers, for out-of-tree guest modules.
headers="linux-headers-$release"
if [[ $(dpkg-query -W -f='${Status}' "$headers" 2>/dev/null || true) != "install ok installed" ]]; then
    if [[ $(id -u) -eq 0 ]]; then
        log "installing $headers"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$headers" >&2 ||
            die "apt-get install $headers failed (run scripts/setup.sh)"
    else
        die "$headers is not installed; run scripts/setup.sh as root"
    fi
fi
kbuild="/usr/src/linux-headers-$release"
[[ -f "$kbuild/Makefile" ]] || die "$kbuild/Makefile missing although $headers is installed"
echo "$kbuild" >"$out/kernel-build-dir"

# 2b. PMO guest side (owned with guest/driver): pmo.ko, libpmo, pmo CLI and test programs.
"$guest/build-pmo.sh" || die "guest/build-pmo.sh failed"

# 2c. CXL / NVDIMM user space: Debian's ndctl package (cxl, ndctl, daxctl) with the shared
# libraries they need. The packages are extracted (never installed); libraries that are not in
# them are taken from this machine (same Debian release as the guest kernel), found by ldd.
ndctl_pkgs=(ndctl daxctl libcxl1 libndctl6 libdaxctl1 libtraceevent1 libtracefs1 libiniparser1)
ndctl_dir="$out/ndctl"
if [[ ! -f "$ndctl_dir/.done" ]]; then
    log "fetching ${ndctl_pkgs[*]}"
    rm -rf "$ndctl_dir"
    mkdir -p "$ndctl_dir/debs" "$ndctl_dir/x" "$ndctl_dir/stage/usr/bin"
    sandbox=()
    [[ $(id -u) -eq 0 ]] && sandbox=(-o APT::Sandbox::User=root)
    (cd "$ndctl_dir/debs" && apt-get download -q "${sandbox[@]}" "${ndctl_pkgs[@]}" >&2) ||
        die "apt-get download ${ndctl_pkgs[*]} failed"
    for deb in "$ndctl_dir"/debs/*.deb; do dpkg-deb -x "$deb" "$ndctl_dir/x"; done
    xlib="$ndctl_dir/x/usr/lib/x86_64-linux-gnu"
    for b in cxl ndctl daxctl; do
        cp "$ndctl_dir/x/usr/bin/$b" "$ndctl_dir/stage/usr/bin/$b"
        libs=$(LD_LIBRARY_PATH="$xlib" ldd "$ndctl_dir/x/usr/bin/$b") || die "ldd $b failed"
        ! grep -q "not found" <<<"$libs" || die "$b: missing libraries: $(grep 'not found' <<<"$libs")"
        for lib in $(awk '/=>/ { print $3; next } /^\t\// { print $1 }' <<<"$libs"); do
            case "$lib" in
            "$xlib"/*) dst="$ndctl_dir/stage/lib/x86_64-linux-gnu/$(basename "$lib")" ;;
            /lib64/*) dst="$ndctl_dir/stage$lib" ;;
            *) dst="$ndctl_dir/stage/lib/x86_64-linux-gnu/$(basename "$lib")" ;;
            esac
            mkdir -p "$(dirname "$dst")"
            cp -L "$lib" "$dst"
        done
    done
    touch "$ndctl_dir/.done"
fi

# 2d. CXL test tools (static, musl): daxrw reads and writes a device-DAX namespace.
mkdir -p "$out/cxl-bin"
if [[ ! -x "$out/cxl-bin/daxrw" || "$guest/cxl/daxrw.c" -nt "$out/cxl-bin/daxrw" ]]; then
    musl-gcc -static -O2 -std=c11 -Wall -Wextra -Werror "$guest/cxl/daxrw.c" \
        -o "$out/cxl-bin/daxrw.tmp" || die "daxrw build failed"
    mv "$out/cxl-bin/daxrw.tmp" "$out/cxl-bin/daxrw"
fi

# resolve_modules LISTFILE: module paths (relative to $moddir) in load order, dependencies
# first, from modules.dep. Fails on a required module the kernel has neither as a module
# nor built in.
resolve_modules() {
    awk -v list="$1" -v builtin="$moddir/modules.builtin" '
        function norm(p,   n) {
            n = p; sub(/.*\//, "", n); sub(/\.ko(\.(xz|zst|gz))?$/, "", n); gsub(/-/, "_", n)
            return n
        }
        FNR == 1 { file++ }
        file == 1 {  # modules.dep: "path: dep1 dep2 ..." (deps listed last-to-load first)
            p = $1; sub(/:$/, "", p); n = norm(p)
            path[n] = p; ndeps[n] = NF - 1
            for (i = 2; i <= NF; i++) dep[n, i - 1] = $i
            next
        }
        file == 2 { inb[norm($0)] = 1; next }
        file == 3 {
            sub(/#.*/, ""); gsub(/[ \t]/, "")
            if ($0 == "") next
            opt = sub(/\?$/, ""); n = norm($0)
            if (!(n in path)) {
                if (n in inb) next
                if (opt) { print "guest/build.sh: optional module " n " not in this kernel" > "/dev/stderr"; next }
                print "guest/build.sh: error: module " n " is neither a module nor built in" > "/dev/stderr"
                bad = 1; next
            }
            for (i = ndeps[n]; i >= 1; i--) if (!(dep[n, i] in seen)) { seen[dep[n, i]] = 1; print dep[n, i] }
            if (!(path[n] in seen)) { seen[path[n]] = 1; print path[n] }
        }
        END { exit bad }
    ' "$moddir/modules.dep" "$moddir/modules.builtin" "$1"
}

# stage_modules LISTFILE ROOT: copy the resolved modules (decompressed) into ROOT and write
# ROOT/etc/modules.load in load order.
stage_modules() {
    local list=$1 root=$2 mods m dst
    mods=$(resolve_modules "$list") || die "cannot resolve modules of $list"
    mkdir -p "$root/etc"
    : >"$root/etc/modules.load"
    for m in $mods; do
        dst="$root/lib/modules/$release/${m%.*}"
        case "$m" in
        *.ko) dst="$root/lib/modules/$release/$m" ;;
        esac
        mkdir -p "$(dirname "$dst")"
        case "$m" in
        *.ko.xz) xz -dc "$moddir/$m" >"$dst" ;;
        *.ko.zst) zstd -q -dc "$moddir/$m" >"$dst" ;;
        *.ko.gz) gzip -dc "$moddir/$m" >"$dst" ;;
        *) cp "$moddir/$m" "$dst" ;;
        esac
        echo "${dst#"$root/lib/modules/$release/"}" >>"$root/etc/modules.load"
    done
}

# make_cpio ROOT OUT: gzip'ed newc archive of ROOT, reproducible (sorted, fixed owner/mtime).
make_cpio() {
    local root=$1 dst=$2
    find "$root" -exec touch -h -d @0 {} +
    (cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --reproducible --quiet) |
        gzip -6 -n >"$dst.tmp"
    mv "$dst.tmp" "$dst"
}

# build_image NAME OUTFILE INPUTS... -- FUNCTION: rebuild OUTFILE with FUNCTION ROOT only when
# the hash of the inputs (and of this script and the kernel release) changed.
build_image() {
    local name=$1 dst=$2 fn=$3
    shift 3
    local stamp="$dst.inputs" sum root
    sum=$( (
        echo "$release"
        sha256sum "${BASH_SOURCE[0]}" "$busybox"
        find "$@" -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    ) | sha256sum | cut -d' ' -f1)
    if [[ -f "$dst" && -f "$stamp" && $(cat "$stamp") == "$sum" ]]; then
        log "$name up to date"
        return
    fi
    log "building $name"
    root=$(mktemp -d "$out/.root.XXXXXX")
    mkdir -p "$root/bin"
    cp "$busybox" "$root/bin/busybox"
    "$fn" "$root"
    make_cpio "$root" "$dst"
    rm -rf "$root"
    echo "$sum" >"$stamp"
    log "$name: $(du -h "$dst" | cut -f1)"
}

# 3. The L2 test guest.
guest_root() {
    local root=$1
    install -m 0755 "$guest/init" "$root/init"
    mkdir -p "$root/lib" "$root/scenarios" "$root/lib/modules/extra"
    cp "$guest/lib/pmotest.sh" "$root/lib/pmotest.sh"
    cp "$guest"/scenarios/* "$root/scenarios/"
    stage_modules "$guest/modules.list" "$root"
    # PMO driver and static programs from guest/build-pmo.sh (/init insmods extra/*.ko).
    cp "$out/pmo.ko" "$root/lib/modules/extra/pmo.ko"
    cp "$out"/pmo-bin/* "$root/bin/"
    # cxl, ndctl, daxctl and their libraries (step 2c).
    cp -a "$ndctl_dir/stage/." "$root/"
    cp "$out"/cxl-bin/* "$root/bin/"
}
build_image "guest initramfs" "$out/initramfs.cpio.gz" guest_root \
    "$guest/init" "$guest/lib" "$guest/scenarios" "$guest/modules.list" \
    "$out/pmo.ko" "$out/pmo-bin" "$ndctl_dir/stage" "$out/cxl-bin"

# 4. The nested test host (L1) base image; see tests/integration/README.md.
testhost="$repo/tests/integration/testhost"
testhost_root() {
    local root=$1
    install -m 0755 "$testhost/init" "$root/init"
    stage_modules "$testhost/modules.list" "$root"
}
build_image "test host initramfs" "$out/testhost.cpio.gz" testhost_root \
    "$testhost/init" "$testhost/modules.list"

log "ok: kernel $release, images in $out"
