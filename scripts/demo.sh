#!/usr/bin/env bash
# Sets up and runs the main job: boots a stock Debian guest under pmovmm with a virtio-pmem
# disk and the PMO device, and shows them working:
#   boot 1: the guest writes to /dev/pmem0, creates an encrypted PMO with the pmo CLI, writes,
#           psyncs and reads it back, and builds a linked list with p_malloc inside another PMO;
#   boot 2: a new VMM process on the same files reads the pmem data back and walks the list.
# Then the host lists the store and checks that it holds no plaintext of what the guest wrote.
#
#   scripts/demo.sh           the run above (about two minutes here)
#   scripts/demo.sh --shell   a guest shell instead: try `pmo create notes 64K`, `pmo write
#                             notes 0 hello`, `pmo read notes 0 5`, `pmo ls` (key: PMO_KEY)
# Files stay in target/demo/ (store.img, pmem.img) for a second look.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

scripts/setup.sh
guest/build.sh
cargo build --release -q -p pmovmm -p pmo-integration --bin pmovmm --bin pmo-vm

mkdir -p target/demo
store=$repo/target/demo/store.img
pmem=$repo/target/demo/pmem.img
pmovmm=$repo/target/release/pmovmm
pmo_vm=$repo/target/release/pmo-vm

if [[ ${1:-} == --shell ]]; then
    exec "$pmo_vm" --cpus 2 --pmem "$pmem,64M" --pmo-store "$store,256M" --shell
fi

rm -f "$store" "$pmem"
marker="DEMO-SECRET-$(date +%s)"
"$pmo_vm" --cpus 2 --pmem "$pmem,64M" --pmo-store "$store,256M" \
    --param pattern="$marker" \
    --boot boot_info,pmem_write,pmo_basic,pmo_list_build \
    --boot pmem_read,pmo_list_check

echo
echo "== the store on the host (no key needed to list it)"
"$pmovmm" store ls "$store"
"$pmovmm" store fsck "$store"
echo
echo "== plaintext the guest wrote"
printf 'pmem file (unencrypted baseline): %s occurrence(s) of the marker\n' \
    "$(grep -c -a "$marker" "$pmem" || true)"
printf 'PMO store (encrypted):            %s occurrence(s) of the marker\n' \
    "$(grep -c -a "$marker" "$store" || true)"
