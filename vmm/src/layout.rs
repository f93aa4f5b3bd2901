//! The guest physical address map.
//!
//! One place decides where everything lives so that the boot code, the ACPI
//! tables, the E820 map and the PCI resource allocator can never disagree.
//!
//! ```text
//!   0x0000_0000 ..          low RAM (real-mode area, boot structures, kernel)
//!   0x000e_0000 .. 0x0010_0000  ACPI tables (RSDP first), not RAM in E820
//!   0x0010_0000 .. RAM_LOW_END  RAM
//!   0xc000_0000 .. 0xe000_0000  PCI 32-bit MMIO window (BARs)
//!   0xd000_0000 .. 0xe000_0000    the part of it behind CXL host bridges
//!   0xe000_0000 .. 0xf000_0000  PCIe ECAM (256 buses), reserved in E820
//!   0xf000_0000 .. +1 MiB       CXL host bridge component blocks (CEDT CHBS)
//!   0xfec0_0000                 IOAPIC
//!   0xfee0_0000                 local APIC
//!   0x1_0000_0000 ..            high RAM (whatever did not fit below 3 GiB)
//!   0x20_0000_0000 .. +128 GiB  device memory (virtio-pmem regions, CXL fixed memory windows)
//!   0x40_0000_0000 .. +256 GiB  PCI 64-bit MMIO window (BARs)
//! ```
//!
//! Everything stays below 2^39 so it is reachable with the 40 physical
//! address bits that the smallest CPU models (including QEMU's EPYC model
//! used by the nested test host) report.

/// Page size of the guest and of every region we map.
pub const PAGE_SIZE: u64 = 4096;

/// GDT built for the 64-bit boot protocol.
pub const BOOT_GDT_START: u64 = 0x500;
/// IDT (empty) loaded before entering the kernel.
pub const BOOT_IDT_START: u64 = 0x520;
/// Initial stack pointer handed to the kernel.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Linux `boot_params` ("zero page").
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Identity-mapping page tables: PML4, PDPT and PD, one page each.
pub const PML4_START: u64 = 0x9000;
pub const PDPTE_START: u64 = 0xa000;
pub const PDE_START: u64 = 0xb000;
/// Kernel command line.
pub const CMDLINE_START: u64 = 0x20000;
/// Largest command line we accept (the kernel's own limit on x86_64).
pub const CMDLINE_MAX_SIZE: usize = 2048;
/// End of the conventional low memory; the EBDA and BIOS area follow.
pub const EBDA_START: u64 = 0x9fc00;

/// ACPI tables: the RSDP sits at the start so the kernel also finds it by
/// scanning the BIOS area, the rest follows.
pub const ACPI_START: u64 = 0xe0000;
pub const ACPI_SIZE: u64 = 0x20000;

/// Where the kernel image is loaded (the 64-bit boot protocol default).
pub const KERNEL_START: u64 = 0x100000;

/// Top of RAM below the 32-bit hole.
pub const RAM_LOW_END: u64 = 0xc000_0000;

/// PCI 32-bit MMIO window for BARs.
pub const MMIO32_START: u64 = 0xc000_0000;
pub const MMIO32_SIZE: u64 = 0x2000_0000;

/// Buses and 32-bit window of the main root bridge (`\_SB.PCI0`); the
/// rest of each belongs to CXL host bridges.
pub const PCI0_BUS_END: u8 = 0x7f;
pub const PCI0_MMIO32_SIZE: u64 = 0x1000_0000;

/// CXL host bridges: bridge `i` owns buses `CXL_BUS_START + i * CXL_BUSES_PER_BRIDGE ..`
/// (its root bus, then the root port's secondary bus), a 1 MiB slice of the
/// 32-bit window at `CXL_MMIO32_START + i MiB`, and a 64 KiB component
/// block at `CXL_CHBS_START + i * 64 KiB`.
pub const CXL_MAX_HOST_BRIDGES: usize = 16;
pub const CXL_BUS_START: u8 = PCI0_BUS_END + 1;
pub const CXL_BUSES_PER_BRIDGE: u8 = 8;
pub const CXL_MMIO32_START: u64 = MMIO32_START + PCI0_MMIO32_SIZE;
pub const CXL_MMIO32_PER_BRIDGE: u64 = 1 << 20;
pub const CXL_CHBS_START: u64 = 0xf000_0000;
pub const CXL_CHBS_SIZE: u64 = 0x1_0000;

/// PCIe enhanced configuration access mechanism (1 MiB per bus).
pub const ECAM_START: u64 = 0xe000_0000;
pub const ECAM_SIZE: u64 = 0x1000_0000;
/// Highest bus number the ECAM range covers.
pub const PCI_BUS_END: u8 = 0xff;

/// IOAPIC and local APIC register pages (fixed by the architecture).
pub const IOAPIC_START: u64 = 0xfec0_0000;
pub const APIC_START: u64 = 0xfee0_0000;

/// RAM that did not fit below the hole continues here.
pub const RAM_HIGH_START: u64 = 0x1_0000_0000;

/// Device memory that is not a BAR (virtio-pmem regions).
pub const DEVICE_MEM_START: u64 = 0x20_0000_0000;
pub const DEVICE_MEM_SIZE: u64 = 0x20_0000_0000;

/// PCI 64-bit MMIO window for BARs (the PMO window lives here).
pub const MMIO64_START: u64 = 0x40_0000_0000;
pub const MMIO64_SIZE: u64 = 0x40_0000_0000;

/// Legacy I/O ports.
pub const COM1_PORT: u16 = 0x3f8;
pub const COM1_IRQ: u32 = 4;
/// PCI configuration mechanism #1.
pub const PCI_CONFIG_ADDRESS_PORT: u16 = 0xcf8;
/// ACPI fixed-hardware replacement: sleep control (S5 = power off), sleep
/// status and reset registers, one byte each.
pub const ACPI_SLEEP_CONTROL_PORT: u16 = 0x600;
pub const ACPI_SLEEP_STATUS_PORT: u16 = 0x601;
pub const ACPI_RESET_PORT: u16 = 0x602;
/// Value written to the reset register to reboot.
pub const ACPI_RESET_VALUE: u8 = 0x1;
/// SLP_TYP the DSDT's `_S5_` object announces.
pub const ACPI_S5_SLP_TYP: u8 = 5;
/// pvpanic port (ACPI `QEMU0001`): the guest writes here when it panics.
pub const PVPANIC_PORT: u16 = 0x505;
/// SCI interrupt announced in the FADT (unused by a hardware-reduced guest).
pub const ACPI_SCI_IRQ: u32 = 9;

/// Where the RAM map lands for a guest of `mem_size` bytes: (start, len).
pub fn ram_regions(mem_size: u64) -> Vec<(u64, u64)> {
    if mem_size <= RAM_LOW_END {
        vec![(0, mem_size)]
    } else {
        vec![(0, RAM_LOW_END), (RAM_HIGH_START, mem_size - RAM_LOW_END)]
    }
}

const _: () = assert!(MMIO64_START + MMIO64_SIZE <= 1 << 39);
const _: () = assert!(ECAM_START + ECAM_SIZE <= IOAPIC_START);
const _: () = assert!(
    CXL_BUS_START as usize + CXL_MAX_HOST_BRIDGES * CXL_BUSES_PER_BRIDGE as usize
        <= PCI_BUS_END as usize + 1
);
const _: () = assert!(
    CXL_MMIO32_START + CXL_MAX_HOST_BRIDGES as u64 * CXL_MMIO32_PER_BRIDGE
        <= MMIO32_START + MMIO32_SIZE
);
const _: () = assert!(ECAM_START + ECAM_SIZE <= CXL_CHBS_START);
const _: () = assert!(CXL_CHBS_START + CXL_MAX_HOST_BRIDGES as u64 * CXL_CHBS_SIZE <= IOAPIC_START);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap() {
        let fixed = [
            (ACPI_START, ACPI_SIZE),
            (MMIO32_START, MMIO32_SIZE),
            (ECAM_START, ECAM_SIZE),
            (DEVICE_MEM_START, DEVICE_MEM_SIZE),
            (MMIO64_START, MMIO64_SIZE),
            (CXL_CHBS_START, CXL_MAX_HOST_BRIDGES as u64 * CXL_CHBS_SIZE),
        ];
        for (i, a) in fixed.iter().enumerate() {
            for b in fixed.iter().skip(i + 1) {
                assert!(
                    a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0,
                    "{a:x?} overlaps {b:x?}"
                );
            }
        }
    }

    #[test]
    fn ram_splits_around_the_hole() {
        assert_eq!(ram_regions(1 << 30), vec![(0, 1 << 30)]);
        let big = ram_regions(4 << 30);
        assert_eq!(
            big,
            vec![(0, RAM_LOW_END), (RAM_HIGH_START, (4 << 30) - RAM_LOW_END)]
        );
        let total: u64 = big.iter().map(|r| r.1).sum();
        assert_eq!(total, 4 << 30);
    }
}
