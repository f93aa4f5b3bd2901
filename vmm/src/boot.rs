//! Linux 64-bit boot protocol: load bzImage, initramfs and command line, build
//! the zero page with the E820 map, the identity page tables and the GDT, and
//! compute the register state the boot vCPU starts with.

use std::fs::File;
use std::path::Path;

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use linux_loader::loader::{bzimage::BzImage, load_cmdline, Cmdline, KernelLoader};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

use crate::layout::*;

/// Errors loading the guest's boot payload.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("kernel {path}: {source}")]
    KernelFile {
        path: String,
        source: std::io::Error,
    },
    #[error("kernel {path}: not a bzImage this loader accepts: {source}")]
    KernelLoad {
        path: String,
        source: linux_loader::loader::Error,
    },
    #[error("initrd {path}: {source}")]
    InitrdFile {
        path: String,
        source: std::io::Error,
    },
    #[error("initrd of {0} bytes does not fit in guest memory below the kernel's limit")]
    InitrdTooBig(u64),
    #[error("command line: {0}")]
    Cmdline(linux_loader::cmdline::Error),
    #[error("write {what} to guest memory: {source}")]
    GuestWrite {
        what: &'static str,
        source: vm_memory::GuestMemoryError,
    },
    #[error("write boot parameters: {0}")]
    BootParams(linux_loader::configurator::Error),
}

/// What the boot vCPU needs to start the kernel.
pub struct BootEntry {
    pub entry: GuestAddress,
}

const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;
const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;
const KERNEL_LOADER_OTHER: u8 = 0xff;
const KERNEL_MIN_ALIGNMENT: u32 = 0x0100_0000;
/// The 64-bit entry point sits 0x200 bytes into the protected-mode kernel.
const STARTUP_64_OFFSET: u64 = 0x200;

/// Loads everything and writes the zero page; returns the 64-bit entry point.
pub fn load(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    kernel: &Path,
    initrd: Option<&Path>,
    cmdline: &str,
    rsdp: GuestAddress,
) -> Result<BootEntry, BootError> {
    let kpath = kernel.display().to_string();
    let mut kfile = File::open(kernel).map_err(|source| BootError::KernelFile {
        path: kpath.clone(),
        source,
    })?;
    let loaded = BzImage::load(mem, None, &mut kfile, Some(GuestAddress(KERNEL_START))).map_err(
        |source| BootError::KernelLoad {
            path: kpath.clone(),
            source,
        },
    )?;

    let mut cl = Cmdline::new(CMDLINE_MAX_SIZE).map_err(BootError::Cmdline)?;
    cl.insert_str(cmdline).map_err(BootError::Cmdline)?;
    load_cmdline(mem, GuestAddress(CMDLINE_START), &cl).map_err(|e| match e {
        linux_loader::loader::Error::InvalidCommandLine => {
            BootError::Cmdline(linux_loader::cmdline::Error::InvalidAscii)
        }
        other => BootError::KernelLoad {
            path: "command line".into(),
            source: other,
        },
    })?;

    let mut params = boot_params::default();
    if let Some(hdr) = loaded.setup_header {
        params.hdr = hdr;
    }
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    params.hdr.header = KERNEL_HDR_MAGIC;
    params.hdr.cmd_line_ptr = CMDLINE_START as u32;
    params.hdr.cmdline_size = cmdline.len() as u32 + 1;
    params.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT;
    params.acpi_rsdp_addr = rsdp.0;

    if let Some(path) = initrd {
        let (addr, size) = load_initrd(mem, mem_size, path, params.hdr.initrd_addr_max)?;
        params.hdr.ramdisk_image = addr as u32;
        params.hdr.ramdisk_size = size as u32;
    }

    let mut e820 = Vec::new();
    e820.push((0, EBDA_START, E820_RAM));
    for (start, len) in ram_regions(mem_size) {
        let start = if start == 0 { KERNEL_START } else { start };
        let end = if start == KERNEL_START {
            len
        } else {
            start + len
        };
        e820.push((start, end - start, E820_RAM));
    }
    e820.push((ECAM_START, ECAM_SIZE, E820_RESERVED));
    for (i, (addr, size, kind)) in e820.iter().enumerate() {
        params.e820_table[i] = boot_e820_entry {
            addr: *addr,
            size: *size,
            r#type: *kind,
        };
    }
    params.e820_entries = e820.len() as u8;

    LinuxBootConfigurator::write_bootparams::<GuestMemoryMmap>(
        &BootParams::new::<boot_params>(&params, GuestAddress(ZERO_PAGE_START)),
        mem,
    )
    .map_err(BootError::BootParams)?;

    write_page_tables(mem)?;
    write_gdt(mem)?;
    Ok(BootEntry {
        entry: GuestAddress(loaded.kernel_load.0 + STARTUP_64_OFFSET),
    })
}

/// Places the initrd as high as the kernel allows in low RAM, page aligned.
fn load_initrd(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    path: &Path,
    addr_max: u32,
) -> Result<(u64, u64), BootError> {
    let ipath = path.display().to_string();
    let data = std::fs::read(path).map_err(|source| BootError::InitrdFile {
        path: ipath,
        source,
    })?;
    let size = data.len() as u64;
    let low_end = mem_size.min(RAM_LOW_END);
    let limit = low_end.min(u64::from(addr_max) + 1);
    let addr = limit
        .checked_sub(size)
        .map(|a| a & !(PAGE_SIZE - 1))
        .filter(|a| *a >= KERNEL_START + (64 << 20))
        .ok_or(BootError::InitrdTooBig(size))?;
    mem.write_slice(&data, GuestAddress(addr))
        .map_err(|source| BootError::GuestWrite {
            what: "initrd",
            source,
        })?;
    Ok((addr, size))
}

/// Identity-maps the first GiB with 2 MiB pages: enough for the kernel's
/// 64-bit entry code, which builds its own tables right away.
fn write_page_tables(mem: &GuestMemoryMmap) -> Result<(), BootError> {
    let w = |what, v: u64, a: u64| {
        mem.write_obj(v, GuestAddress(a))
            .map_err(|source| BootError::GuestWrite { what, source })
    };
    w("PML4", PDPTE_START | 0x03, PML4_START)?;
    w("PDPT", PDE_START | 0x03, PDPTE_START)?;
    for i in 0..512u64 {
        w("PD", (i << 21) | 0x83, PDE_START + i * 8)?;
    }
    Ok(())
}

/// GDT entries: null, 64-bit code, data, TSS.
const GDT: [u64; 4] = [
    0,
    gdt_entry(0xa09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0x808b, 0, 0xfffff),
];

const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << 32)
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0xffff)
        | ((limit as u64 & 0xf_0000) << 32)
        | ((flags as u64 & 0xf0ff) << 40)
}

fn write_gdt(mem: &GuestMemoryMmap) -> Result<(), BootError> {
    for (i, e) in GDT.iter().enumerate() {
        mem.write_obj(*e, GuestAddress(BOOT_GDT_START).unchecked_add(i as u64 * 8))
            .map_err(|source| BootError::GuestWrite {
                what: "GDT",
                source,
            })?;
    }
    mem.write_obj(0u64, GuestAddress(BOOT_IDT_START))
        .map_err(|source| BootError::GuestWrite {
            what: "IDT",
            source,
        })
}

fn segment(index: u16) -> kvm_segment {
    let e = GDT[index as usize];
    kvm_segment {
        base: ((e >> 16) & 0xff_ffff) | ((e >> 32) & 0xff00_0000),
        limit: {
            let l = ((e & 0xffff) | ((e >> 32) & 0xf_0000)) as u32;
            if (e >> 55) & 1 == 1 {
                (l << 12) | 0xfff
            } else {
                l
            }
        },
        selector: index * 8,
        type_: ((e >> 40) & 0xf) as u8,
        present: ((e >> 47) & 1) as u8,
        dpl: ((e >> 45) & 3) as u8,
        db: ((e >> 54) & 1) as u8,
        s: ((e >> 44) & 1) as u8,
        l: ((e >> 53) & 1) as u8,
        g: ((e >> 55) & 1) as u8,
        avl: ((e >> 52) & 1) as u8,
        unusable: 0,
        padding: 0,
    }
}

const X86_CR0_PE: u64 = 0x1;
const X86_CR0_ET: u64 = 0x10;
const X86_CR0_PG: u64 = 0x8000_0000;
const X86_CR4_PAE: u64 = 0x20;
const EFER_LME: u64 = 0x100;
const EFER_LMA: u64 = 0x400;

/// Long mode with paging on, flat segments from our GDT.
pub fn boot_sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    let code = segment(1);
    let data = segment(2);
    let tss = segment(3);
    sregs.gdt.base = BOOT_GDT_START;
    sregs.gdt.limit = (GDT.len() * 8 - 1) as u16;
    sregs.idt.base = BOOT_IDT_START;
    sregs.idt.limit = 7;
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = tss;
    sregs.cr3 = PML4_START;
    sregs.cr4 |= X86_CR4_PAE;
    sregs.cr0 |= X86_CR0_PE | X86_CR0_PG | X86_CR0_ET;
    sregs.efer |= EFER_LME | EFER_LMA;
    sregs
}

/// General registers at the kernel's 64-bit entry: RSI points at the zero page.
pub fn boot_regs(entry: GuestAddress) -> kvm_regs {
    kvm_regs {
        rflags: 0x2,
        rip: entry.0,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        rsi: ZERO_PAGE_START,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdt_segments_decode_to_flat_long_mode() {
        let cs = segment(1);
        assert_eq!((cs.l, cs.db, cs.present, cs.s, cs.type_), (1, 0, 1, 1, 0xb));
        assert_eq!(cs.limit, 0xffff_ffff);
        assert_eq!(cs.selector, 8);
        let ds = segment(2);
        assert_eq!((ds.l, ds.db, ds.type_), (0, 1, 3));
        let tr = segment(3);
        assert_eq!((tr.type_, tr.s), (0xb, 0));
    }

    #[test]
    fn page_tables_identity_map_the_first_gib() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 21)]).unwrap();
        write_page_tables(&mem).unwrap();
        let pde: u64 = mem.read_obj(GuestAddress(PDE_START + 8 * 511)).unwrap();
        assert_eq!(pde, (511 << 21) | 0x83);
    }

    #[test]
    fn missing_kernel_is_a_clear_error() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 24)]).unwrap();
        let err = load(
            &mem,
            1 << 24,
            Path::new("/nonexistent/bzImage"),
            None,
            "console=ttyS0",
            GuestAddress(ACPI_START),
        )
        .err()
        .unwrap();
        assert_eq!(
            err.to_string(),
            "kernel /nonexistent/bzImage: No such file or directory (os error 2)"
        );
    }
}
