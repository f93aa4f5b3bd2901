//! ACPI tables for the guest.
//!
//! The stock Debian kernel ignores MP tables, so ACPI is how it learns about
//! its CPUs, interrupt controllers, the PCIe root complex (ECAM), the legacy
//! devices it should bind (COM1, pvpanic) and how to power off and reboot.
//!
//! The platform is "hardware-reduced" ACPI: there is no PM1 register block,
//! no GPEs and no SMI. Power-off goes through the FADT sleep control register
//! (the DSDT's `_S5_` tells the guest which SLP_TYP to write) and reboot
//! through the FADT reset register; both are single-byte I/O ports decoded
//! by the VMM (see [`crate::layout`]).
//!
//! Everything lands in `[ACPI_START, ACPI_START + ACPI_SIZE)` with the RSDP
//! first, so the guest finds it both through `boot_params.acpi_rsdp_addr`
//! and by scanning the BIOS area.
//!
//! Later features extend the tables without touching this file:
//! [`AcpiConfig::extra_dsdt`] appends AML to the DSDT (for example a CXL
//! `ACPI0017` device and an `ACPI0016` host bridge, or a `_PRT` inside
//! `Scope(\_SB.PCI0)`), [`AcpiConfig::extra_tables`] adds complete tables
//! (for example a CEDT) that the XSDT then lists.

use acpi_tables::aml;
use acpi_tables::fadt::{FADTBuilder, Flags as FadtFlags, PmProfile};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::madt::{EnabledStatus, IoApic, ProcessorLocalApic};
use acpi_tables::mcfg::MCFG;
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

use crate::layout;

/// OEM identification written into every table header.
const OEM_ID: [u8; 6] = *b"PMOVMM";
/// OEM table id; the spec wants the FADT's to match the one in the XSDT, we
/// simply use one id everywhere.
const OEM_TABLE_ID: [u8; 8] = *b"PMOVMMVM";
const OEM_REVISION: u32 = 1;

/// Size of the common System Description Table header.
const SDT_HEADER_LEN: usize = 36;
/// Tables are placed on 16-byte boundaries (the RSDP must be; the others
/// only need natural alignment, 16 keeps `iasl`/hexdumps readable).
const TABLE_ALIGN: u64 = 16;

/// DSDT compliance revision; >= 2 makes AML integers 64 bits wide, which the
/// 64-bit PCI window in `_CRS` needs.
const DSDT_REVISION: u8 = 6;
/// MADT revision of ACPI 6.x.
const MADT_REVISION: u8 = 5;

/// MADT flag: the platform also has dual 8259 PICs (KVM's in-kernel irqchip
/// emulates them), so Linux masks them when it switches to the IOAPIC.
const MADT_PCAT_COMPAT: u32 = 1 << 0;
/// MADT structure types we build by hand (the crate has no helpers for them).
const MADT_TYPE_INTERRUPT_SOURCE_OVERRIDE: u8 = 2;
const MADT_TYPE_LOCAL_APIC_NMI: u8 = 4;
/// MPS INTI flags: polarity bits 1:0 (01 = active high), trigger mode bits
/// 3:2 (11 = level).
const MPS_INTI_CONFORMS: u16 = 0;
const MPS_INTI_ACTIVE_HIGH_LEVEL: u16 = 0b01 | (0b11 << 2);

/// FADT IA-PC boot architecture flags (ACPI 6.5, 5.2.9.3). We set "VGA not
/// present", "do not enable ASPM" and, unless [`AcpiConfig::cmos_rtc`],
/// "no CMOS RTC". Deliberately absent: LEGACY_DEVICES, 8042 (Linux then
/// skips the i8042 probe) and MSI_NOT_SUPPORTED (virtio-pci needs MSI-X).
const IAPC_VGA_NOT_PRESENT: u16 = 1 << 2;
const IAPC_MSI_NOT_SUPPORTED: u16 = 1 << 3;
const IAPC_PCIE_ASPM_CONTROLS: u16 = 1 << 4;
const IAPC_CMOS_RTC_NOT_PRESENT: u16 = 1 << 5;
const IAPC_BOOT_ARCH: u16 = IAPC_VGA_NOT_PRESENT | IAPC_PCIE_ASPM_CONTROLS;
const _: () = assert!(IAPC_BOOT_ARCH & IAPC_MSI_NOT_SUPPORTED == 0);

/// `_OSC` UUID for PCI/PCIe host bridges (PCI Firmware Specification 3.3).
const PCI_HOST_BRIDGE_OSC_UUID: &str = "33DB4D5B-1FF7-401C-9657-7441C03DD766";
/// `_OSC` capabilities DWORD 1 error bits.
const OSC_UNRECOGNIZED_UUID: u8 = 1 << 2;
const OSC_UNRECOGNIZED_REVISION: u8 = 1 << 3;

/// Legacy PC ISA IRQ of the PIT, redirected to GSI 2 as on every PC.
const ISA_IRQ_PIT: u8 = 0;
const GSI_PIT: u32 = 2;

// The tables store these in narrower fields: fail the build, not the guest,
// if the layout ever moves them out of range.
const _: () = assert!(layout::APIC_START <= u32::MAX as u64);
const _: () = assert!(layout::IOAPIC_START <= u32::MAX as u64);
const _: () = assert!(layout::ACPI_SCI_IRQ <= u8::MAX as u32);
const _: () = assert!(layout::COM1_IRQ <= u8::MAX as u32);
const _: () = assert!(layout::MMIO32_START + layout::MMIO32_SIZE <= 1 << 32);
const _: () = assert!(layout::ECAM_START + layout::ECAM_SIZE <= 1 << 32);
const _: () = assert!(layout::ECAM_SIZE == (layout::PCI_BUS_END as u64 + 1) << 20);
const _: () = assert!(layout::ACPI_START.is_multiple_of(TABLE_ALIGN));
const _: () = assert!(layout::ACPI_START + layout::ACPI_SIZE <= 0x10_0000);
// The motherboard device reserves the three fixed-hardware ports as one range.
const _: () = assert!(layout::ACPI_SLEEP_STATUS_PORT == layout::ACPI_SLEEP_CONTROL_PORT + 1);
const _: () = assert!(layout::ACPI_RESET_PORT == layout::ACPI_SLEEP_CONTROL_PORT + 2);

/// Errors from building or writing the ACPI tables.
#[derive(Debug, thiserror::Error)]
pub enum AcpiError {
    /// A guest without CPUs cannot boot; catches a config bug early.
    #[error("ACPI: at least one vCPU is required")]
    NoCpus,
    /// The tables (including caller-supplied ones) outgrew the ACPI area.
    #[error("ACPI tables need at least {needed:#x} bytes but the ACPI area holds {available:#x}")]
    TooLarge { needed: u64, available: u64 },
    /// A caller-supplied table is not a well-formed ACPI table.
    #[error("extra ACPI table #{index}: {reason}")]
    BadExtraTable { index: usize, reason: &'static str },
    /// The ACPI area is not backed by guest memory.
    #[error("writing ACPI tables at {addr:#x}: {source}")]
    GuestMemory {
        addr: u64,
        #[source]
        source: GuestMemoryError,
    },
}

/// What the ACPI tables describe beyond the fixed layout.
///
/// Everything else (APIC addresses, ECAM, PCI windows, ports) comes from
/// [`crate::layout`] so the tables cannot disagree with the rest of the VMM.
/// The extension points borrow the caller's AML objects because the
/// `acpi_tables` AML builders borrow their children; the tables are built
/// and copied into guest memory within [`create_acpi_tables`].
pub struct AcpiConfig<'a> {
    /// Number of vCPUs; vCPU `i` gets APIC ID `i` and ACPI processor UID `i`.
    pub cpus: u8,
    /// Whether the VMM emulates the CMOS RTC at ports 0x70/0x71. When it
    /// does not, the FADT says so and Linux leaves those ports alone (with
    /// kvmclock it does not need the RTC for wall-clock time).
    pub cmos_rtc: bool,
    /// AML appended to the DSDT body at the root of the namespace, after the
    /// built-in `\_SB` devices. Wrap devices in `Scope(\_SB)` (or
    /// `Scope(\_SB.PCI0)` for objects of the root bridge, such as `_PRT`).
    pub extra_dsdt: Vec<&'a dyn Aml>,
    /// Complete tables (header, length and checksum already final, e.g. an
    /// `acpi_tables` `Sdt` or `CEDT`) placed after the built-in ones and
    /// listed in the XSDT.
    pub extra_tables: Vec<&'a dyn Aml>,
}

impl AcpiConfig<'_> {
    /// The plain machine: `cpus` vCPUs and no extra AML or tables.
    pub fn new(cpus: u8) -> AcpiConfig<'static> {
        AcpiConfig {
            cpus,
            cmos_rtc: false,
            extra_dsdt: Vec::new(),
            extra_tables: Vec::new(),
        }
    }
}

/// Builds all ACPI tables and writes them into guest memory.
///
/// Returns the guest physical address of the RSDP, which is `ACPI_START`;
/// the boot code puts it into `boot_params.acpi_rsdp_addr`. Nothing is
/// written unless every table fits the ACPI area.
pub fn create_acpi_tables(
    mem: &GuestMemoryMmap,
    cfg: &AcpiConfig,
) -> Result<GuestAddress, AcpiError> {
    if cfg.cpus == 0 {
        return Err(AcpiError::NoCpus);
    }

    let mut extra = Vec::with_capacity(cfg.extra_tables.len());
    for (index, table) in cfg.extra_tables.iter().enumerate() {
        let bytes = aml_bytes(*table);
        check_table(&bytes).map_err(|reason| AcpiError::BadExtraTable { index, reason })?;
        extra.push(bytes);
    }

    let mut area = Area::new();
    let rsdp_addr = area.place(Rsdp::len())?;

    let dsdt = build_dsdt(cfg);
    let dsdt_addr = area.place(dsdt.len())?;
    let fadt = build_fadt(dsdt_addr, cfg.cmos_rtc);
    let madt = build_madt(cfg.cpus);
    let mcfg = build_mcfg();

    // Everything the XSDT lists, in order: the built-in tables, then the
    // caller's. The DSDT is reached through the FADT only.
    let mut listed = vec![fadt, madt, mcfg];
    listed.extend(extra);
    let mut placed = Vec::with_capacity(listed.len());
    for table in listed {
        let addr = area.place(table.len())?;
        placed.push((addr, table));
    }

    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    for (addr, _) in &placed {
        xsdt.add_entry(*addr);
    }
    let xsdt = aml_bytes(&xsdt);
    let xsdt_addr = area.place(xsdt.len())?;
    let rsdp = aml_bytes(&Rsdp::new(OEM_ID, xsdt_addr));

    write(mem, rsdp_addr, &rsdp)?;
    write(mem, dsdt_addr, &dsdt)?;
    for (addr, table) in &placed {
        write(mem, *addr, table)?;
    }
    write(mem, xsdt_addr, &xsdt)?;

    Ok(GuestAddress(rsdp_addr))
}

/// Bump allocator over the ACPI area; fails before anything is written.
struct Area {
    next: u64,
}

impl Area {
    fn new() -> Self {
        Area {
            next: layout::ACPI_START,
        }
    }

    fn place(&mut self, len: usize) -> Result<u64, AcpiError> {
        let addr = self.next.next_multiple_of(TABLE_ALIGN);
        let end = addr + len as u64;
        if end > layout::ACPI_START + layout::ACPI_SIZE {
            return Err(AcpiError::TooLarge {
                needed: end - layout::ACPI_START,
                available: layout::ACPI_SIZE,
            });
        }
        self.next = end;
        Ok(addr)
    }
}

fn write(mem: &GuestMemoryMmap, addr: u64, bytes: &[u8]) -> Result<(), AcpiError> {
    mem.write_slice(bytes, GuestAddress(addr))
        .map_err(|source| AcpiError::GuestMemory { addr, source })
}

fn aml_bytes(aml: &dyn Aml) -> Vec<u8> {
    let mut bytes = Vec::new();
    aml.to_aml_bytes(&mut bytes);
    bytes
}

/// Checks what the guest relies on in a table we did not build: a header,
/// a length field that matches, and a zero checksum.
fn check_table(bytes: &[u8]) -> Result<(), &'static str> {
    if bytes.len() < SDT_HEADER_LEN {
        return Err("shorter than an ACPI table header");
    }
    let length = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if usize::try_from(length).ok() != Some(bytes.len()) {
        return Err("header length does not match its size");
    }
    if bytes.iter().fold(0u8, |sum, b| sum.wrapping_add(*b)) != 0 {
        return Err("checksum is not zero");
    }
    Ok(())
}

/// FADT: hardware-reduced, with the sleep and reset registers the VMM
/// decodes and the DSDT reached through X_DSDT.
fn build_fadt(dsdt_addr: u64, cmos_rtc: bool) -> Vec<u8> {
    let io_byte = |port: u16| {
        GAS::new(
            AddressSpace::SystemIo,
            8,
            0,
            AccessSize::ByteAccess,
            port.into(),
        )
    };
    let mut fadt = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .dsdt_64(dsdt_addr)
        .preferred_pm_profile(PmProfile::EnterpriseServer)
        .flag(FadtFlags::HwReducedAcpi)
        .flag(FadtFlags::ResetRegSup)
        // No fixed-feature power or sleep buttons.
        .flag(FadtFlags::PwrButton)
        .flag(FadtFlags::SlpButton);
    fadt.sci_int = (layout::ACPI_SCI_IRQ as u16).into();
    let iapc_boot_arch = if cmos_rtc {
        IAPC_BOOT_ARCH
    } else {
        IAPC_BOOT_ARCH | IAPC_CMOS_RTC_NOT_PRESENT
    };
    fadt.iapc_boot_arch = iapc_boot_arch.into();
    fadt.reset_reg = io_byte(layout::ACPI_RESET_PORT);
    fadt.reset_value = layout::ACPI_RESET_VALUE;
    fadt.sleep_control_reg = io_byte(layout::ACPI_SLEEP_CONTROL_PORT);
    fadt.sleep_status_reg = io_byte(layout::ACPI_SLEEP_STATUS_PORT);
    aml_bytes(&fadt.finalize())
}

/// MADT: one local APIC per vCPU, the IOAPIC and the PC interrupt overrides.
///
/// Built on `Sdt` because the crate's MADT cannot set PCAT_COMPAT and has
/// no interrupt source override structure.
fn build_madt(cpus: u8) -> Vec<u8> {
    let mut madt = Sdt::new(
        *b"APIC",
        (SDT_HEADER_LEN + 8) as u32,
        MADT_REVISION,
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
    );
    madt.write_u32(SDT_HEADER_LEN, layout::APIC_START as u32);
    madt.write_u32(SDT_HEADER_LEN + 4, MADT_PCAT_COMPAT);
    for id in 0..cpus {
        madt.append_slice(&aml_bytes(&ProcessorLocalApic::new(
            id,
            id,
            EnabledStatus::Enabled,
        )));
    }
    madt.append_slice(&aml_bytes(&IoApic::new(0, layout::IOAPIC_START as u32, 0)));
    madt.append_slice(&interrupt_source_override(
        ISA_IRQ_PIT,
        GSI_PIT,
        MPS_INTI_CONFORMS,
    ));
    madt.append_slice(&interrupt_source_override(
        layout::ACPI_SCI_IRQ as u8,
        layout::ACPI_SCI_IRQ,
        MPS_INTI_ACTIVE_HIGH_LEVEL,
    ));
    madt.append_slice(&local_apic_nmi_all_lint1());
    madt.as_slice().to_vec()
}

/// MADT Interrupt Source Override (type 2): ISA IRQ `source` arrives on
/// `gsi` with the given MPS INTI flags.
fn interrupt_source_override(source: u8, gsi: u32, flags: u16) -> [u8; 10] {
    let mut s = [0u8; 10];
    s[0] = MADT_TYPE_INTERRUPT_SOURCE_OVERRIDE;
    s[1] = s.len() as u8;
    s[2] = 0; // bus: ISA
    s[3] = source;
    s[4..8].copy_from_slice(&gsi.to_le_bytes());
    s[8..10].copy_from_slice(&flags.to_le_bytes());
    s
}

/// MADT Local APIC NMI (type 4): LINT1 of every processor (UID 0xff) is
/// the NMI input, as KVM's local APIC wires it.
fn local_apic_nmi_all_lint1() -> [u8; 6] {
    let mut s = [0u8; 6];
    s[0] = MADT_TYPE_LOCAL_APIC_NMI;
    s[1] = s.len() as u8;
    s[2] = 0xff; // all processors
    s[3..5].copy_from_slice(&MPS_INTI_CONFORMS.to_le_bytes());
    s[5] = 1; // LINT1
    s
}

/// MCFG: the single ECAM allocation of segment 0.
fn build_mcfg() -> Vec<u8> {
    let mut mcfg = MCFG::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    mcfg.add_ecam(layout::ECAM_START, 0, 0, layout::PCI_BUS_END);
    aml_bytes(&mcfg)
}

/// DSDT: `_S5_`, the devices under `\_SB`, then the caller's AML.
fn build_dsdt(cfg: &AcpiConfig) -> Vec<u8> {
    let mut body = Vec::new();

    let s5_typ = layout::ACPI_S5_SLP_TYP;
    aml::Name::new(
        "_S5_".into(),
        &aml::Package::new(vec![&s5_typ, &s5_typ, &aml::ZERO, &aml::ZERO]),
    )
    .to_aml_bytes(&mut body);

    let pci0 = pci_host_bridge();
    let com1 = com1();
    let pvpanic = pvpanic();
    let motherboard = motherboard_resources();
    aml::Scope::new("\\_SB_".into(), vec![&pci0, &com1, &pvpanic, &motherboard])
        .to_aml_bytes(&mut body);

    for aml in &cfg.extra_dsdt {
        aml.to_aml_bytes(&mut body);
    }

    let mut dsdt = Sdt::new(
        *b"DSDT",
        SDT_HEADER_LEN as u32,
        DSDT_REVISION,
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
    );
    dsdt.append_slice(&body);
    dsdt.as_slice().to_vec()
}

/// A Device object serialised to bytes, so the builders can return it
/// without the borrowed children outliving the function.
struct RawAml(Vec<u8>);

impl Aml for RawAml {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        sink.vec(&self.0);
    }
}

/// `\_SB.PCI0`: the PCIe root bridge over the ECAM, with its bus range,
/// the config-space ports it decodes and the windows BARs come from.
fn pci_host_bridge() -> RawAml {
    // The upper buses and the upper part of the 32-bit window belong to
    // CXL host bridges (see crate::cxl).
    let bus = aml::AddressSpace::<u16>::new_bus_number(0, layout::PCI0_BUS_END.into());
    let cfg_ports = aml::IO::new(
        layout::PCI_CONFIG_ADDRESS_PORT,
        layout::PCI_CONFIG_ADDRESS_PORT,
        1,
        8,
    );
    let io_low = aml::AddressSpace::<u16>::new_io(0x0000, 0x0cf7, None);
    let io_high = aml::AddressSpace::<u16>::new_io(0x0d00, 0xffff, None);
    let mmio32 = aml::AddressSpace::<u32>::new_memory(
        aml::AddressSpaceCacheable::NotCacheable,
        true,
        layout::MMIO32_START as u32,
        (layout::MMIO32_START + layout::PCI0_MMIO32_SIZE - 1) as u32,
        None,
    );
    let mmio64 = aml::AddressSpace::<u64>::new_memory(
        aml::AddressSpaceCacheable::NotCacheable,
        true,
        layout::MMIO64_START,
        layout::MMIO64_START + layout::MMIO64_SIZE - 1,
        None,
    );
    let crs =
        aml::ResourceTemplate::new(vec![&bus, &cfg_ports, &io_low, &io_high, &mmio32, &mmio64]);

    let hid = aml::Name::new("_HID".into(), &aml::EISAName::new("PNP0A08"));
    let cid = aml::Name::new("_CID".into(), &aml::EISAName::new("PNP0A03"));
    let adr = aml::Name::new("_ADR".into(), &aml::ZERO);
    let seg = aml::Name::new("_SEG".into(), &aml::ZERO);
    let uid = aml::Name::new("_UID".into(), &aml::ZERO);
    let bbn = aml::Name::new("_BBN".into(), &aml::ZERO);
    let crs = aml::Name::new("_CRS".into(), &crs);
    let osc = pci_osc();
    RawAml(aml_bytes(&aml::Device::new(
        "PCI0".into(),
        vec![&hid, &cid, &adr, &seg, &uid, &bbn, &crs, &osc],
    )))
}

/// `_OSC` of the root bridge: grant every control the OS requests (there
/// is no firmware that wants to keep any), flag unknown UUIDs/revisions.
///
/// ```text
/// Method (_OSC, 4) {
///     CreateDWordField (Arg3, 0, CDW1)
///     If (Arg0 != ToUUID (PCI host bridge)) { CDW1 |= 4 }  // unrecognized UUID
///     ElseIf (Arg1 != 1) { CDW1 |= 8 }                     // unrecognized revision
///     Return (Arg3)                                        // CDW3 = requested
/// }
/// ```
fn pci_osc() -> RawAml {
    let cdw1 = aml::Path::new("CDW1");
    let create_cdw1 = aml::CreateDWordField::new(&cdw1, &aml::Arg(3), &aml::ZERO);
    let uuid = aml::Uuid::new(PCI_HOST_BRIDGE_OSC_UUID);
    let uuid_bad = aml::NotEqual::new(&aml::Arg(0), &uuid);
    let set_uuid_bad = aml::Or::new(&cdw1, &cdw1, &OSC_UNRECOGNIZED_UUID);
    let if_uuid_bad = aml::If::new(&uuid_bad, vec![&set_uuid_bad]);
    let rev_bad = aml::NotEqual::new(&aml::Arg(1), &aml::ONE);
    let set_rev_bad = aml::Or::new(&cdw1, &cdw1, &OSC_UNRECOGNIZED_REVISION);
    let if_rev_bad = aml::If::new(&rev_bad, vec![&set_rev_bad]);
    let else_rev = aml::Else::new(vec![&if_rev_bad]);
    let ret = aml::Return::new(&aml::Arg(3));
    RawAml(aml_bytes(&aml::Method::new(
        "_OSC".into(),
        4,
        false,
        vec![&create_cdw1, &if_uuid_bad, &else_rev, &ret],
    )))
}

/// `\_SB.COM1`: the 16550 on ttyS0, so 8250_pnp claims it with its IRQ.
fn com1() -> RawAml {
    let io = aml::IO::new(layout::COM1_PORT, layout::COM1_PORT, 1, 8);
    let irq = aml::Interrupt::new(true, true, false, false, layout::COM1_IRQ);
    let crs = aml::ResourceTemplate::new(vec![&io, &irq]);
    let hid = aml::Name::new("_HID".into(), &aml::EISAName::new("PNP0501"));
    let uid = aml::Name::new("_UID".into(), &aml::ZERO);
    let crs = aml::Name::new("_CRS".into(), &crs);
    RawAml(aml_bytes(&aml::Device::new(
        "COM1".into(),
        vec![&hid, &uid, &crs],
    )))
}

/// `\_SB.PEVT`: pvpanic (`QEMU0001`), so the guest's pvpanic driver tells
/// the VMM when the kernel panics.
fn pvpanic() -> RawAml {
    let io = aml::IO::new(layout::PVPANIC_PORT, layout::PVPANIC_PORT, 1, 1);
    let crs = aml::ResourceTemplate::new(vec![&io]);
    let hid = aml::Name::new("_HID".into(), &"QEMU0001");
    let crs = aml::Name::new("_CRS".into(), &crs);
    RawAml(aml_bytes(&aml::Device::new(
        "PEVT".into(),
        vec![&hid, &crs],
    )))
}

/// `\_SB.MBRS`: motherboard resources. Linux only trusts the MCFG's ECAM
/// range if a PNP0C02 device reserves it; the ACPI fixed-hardware ports are
/// reserved too so the PCI core never hands them to an I/O BAR.
fn motherboard_resources() -> RawAml {
    let ecam = aml::Memory32Fixed::new(true, layout::ECAM_START as u32, layout::ECAM_SIZE as u32);
    let acpi_ports = aml::IO::new(
        layout::ACPI_SLEEP_CONTROL_PORT,
        layout::ACPI_SLEEP_CONTROL_PORT,
        1,
        3,
    );
    let crs = aml::ResourceTemplate::new(vec![&ecam, &acpi_ports]);
    let hid = aml::Name::new("_HID".into(), &aml::EISAName::new("PNP0C02"));
    let uid = aml::Name::new("_UID".into(), &aml::ZERO);
    let crs = aml::Name::new("_CRS".into(), &crs);
    RawAml(aml_bytes(&aml::Device::new(
        "MBRS".into(),
        vec![&hid, &uid, &crs],
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// Guest memory covering the ACPI area with a little room either side.
    fn guest_memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20_0000)]).expect("guest memory")
    }

    fn read(mem: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        mem.read_slice(&mut buf, GuestAddress(addr)).expect("read");
        buf
    }

    fn u16_at(b: &[u8], off: usize) -> u16 {
        u16::from_le_bytes([b[off], b[off + 1]])
    }

    fn u32_at(b: &[u8], off: usize) -> u32 {
        u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
    }

    fn u64_at(b: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
    }

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |s, x| s.wrapping_add(*x))
    }

    /// Reads the table at `addr` from guest memory and checks what every
    /// table must satisfy: inside the ACPI area, sane length, zero checksum.
    fn table_at(mem: &GuestMemoryMmap, addr: u64) -> Vec<u8> {
        assert_eq!(addr % TABLE_ALIGN, 0, "table at {addr:#x} misaligned");
        let header = read(mem, addr, SDT_HEADER_LEN);
        let sig = String::from_utf8_lossy(&header[0..4]).into_owned();
        let len = u32_at(&header, 4) as u64;
        assert!(len >= SDT_HEADER_LEN as u64, "{sig}: length {len}");
        assert!(addr >= layout::ACPI_START, "{sig} below the ACPI area");
        assert!(
            addr + len <= layout::ACPI_START + layout::ACPI_SIZE,
            "{sig} at {addr:#x}+{len:#x} beyond the ACPI area"
        );
        let table = read(mem, addr, len as usize);
        assert_eq!(sum(&table), 0, "{sig}: checksum");
        assert_eq!(&table[10..16], &OEM_ID, "{sig}: OEM id");
        table
    }

    struct Tables {
        rsdp: Vec<u8>,
        xsdt: Vec<u8>,
        /// Tables listed in the XSDT, by address.
        listed: Vec<(u64, Vec<u8>)>,
        dsdt: Vec<u8>,
    }

    impl Tables {
        fn get(&self, sig: &[u8; 4]) -> &[u8] {
            let found: Vec<_> = self.listed.iter().filter(|t| &t.1[0..4] == sig).collect();
            assert_eq!(
                found.len(),
                1,
                "{} listed {} times",
                String::from_utf8_lossy(sig),
                found.len()
            );
            &found[0].1
        }
    }

    /// Walks the tables the way a guest does: RSDP -> XSDT -> tables, and
    /// FADT -> DSDT.
    fn walk(mem: &GuestMemoryMmap, rsdp_addr: GuestAddress) -> Tables {
        assert_eq!(rsdp_addr.0, layout::ACPI_START, "RSDP must come first");
        let rsdp = read(mem, rsdp_addr.0, 36);
        assert_eq!(&rsdp[0..8], b"RSD PTR ");
        assert_eq!(sum(&rsdp[0..20]), 0, "RSDP ACPI 1.0 checksum");
        assert_eq!(sum(&rsdp), 0, "RSDP extended checksum");
        assert_eq!(rsdp[15], 2, "RSDP revision");
        assert_eq!(u32_at(&rsdp, 20), 36, "RSDP length");

        let xsdt = table_at(mem, u64_at(&rsdp, 24));
        assert_eq!(&xsdt[0..4], b"XSDT");
        assert_eq!((xsdt.len() - SDT_HEADER_LEN) % 8, 0, "XSDT entries");
        let listed: Vec<_> = xsdt[SDT_HEADER_LEN..]
            .chunks(8)
            .map(|e| {
                let addr = u64::from_le_bytes(e.try_into().unwrap());
                (addr, table_at(mem, addr))
            })
            .collect();
        let fadt = listed
            .iter()
            .find(|t| &t.1[0..4] == b"FACP")
            .expect("XSDT lists the FADT");
        let dsdt = table_at(mem, u64_at(&fadt.1, 140));
        assert_eq!(&dsdt[0..4], b"DSDT");
        Tables {
            rsdp,
            xsdt,
            listed,
            dsdt,
        }
    }

    /// Tables never overlap each other.
    fn assert_disjoint(t: &Tables, rsdp: u64) {
        let xsdt_addr = u64_at(&t.rsdp, 24);
        let fadt = t.get(b"FACP");
        let mut spans = vec![
            (rsdp, 36u64),
            (xsdt_addr, t.xsdt.len() as u64),
            (u64_at(fadt, 140), t.dsdt.len() as u64),
        ];
        spans.extend(t.listed.iter().map(|(a, b)| (*a, b.len() as u64)));
        spans.sort();
        for w in spans.windows(2) {
            assert!(
                w[0].0 + w[0].1 <= w[1].0,
                "{:x?} overlaps {:x?}",
                w[0],
                w[1]
            );
        }
    }

    #[test]
    fn tables_are_well_formed_and_linked() {
        for cpus in [1u8, 2, 64, 255] {
            let mem = guest_memory();
            let rsdp = create_acpi_tables(&mem, &AcpiConfig::new(cpus)).unwrap();
            let t = walk(&mem, rsdp);
            let mut sigs: Vec<_> = t.listed.iter().map(|x| x.1[0..4].to_vec()).collect();
            sigs.sort();
            assert_eq!(
                sigs,
                vec![b"APIC".to_vec(), b"FACP".to_vec(), b"MCFG".to_vec()]
            );
            assert_disjoint(&t, rsdp.0);
        }
    }

    #[test]
    fn writes_nothing_outside_the_acpi_area() {
        let mem = guest_memory();
        let fill = vec![0xa5u8; 0x1000];
        mem.write_slice(&fill, GuestAddress(layout::ACPI_START - 0x1000))
            .unwrap();
        mem.write_slice(&fill, GuestAddress(layout::ACPI_START + layout::ACPI_SIZE))
            .unwrap();
        create_acpi_tables(&mem, &AcpiConfig::new(255)).unwrap();
        assert_eq!(read(&mem, layout::ACPI_START - 0x1000, 0x1000), fill);
        assert_eq!(
            read(&mem, layout::ACPI_START + layout::ACPI_SIZE, 0x1000),
            fill
        );
    }

    #[test]
    fn fadt_is_hardware_reduced_with_sleep_and_reset_registers() {
        let mem = guest_memory();
        let t = walk(&mem, create_acpi_tables(&mem, &AcpiConfig::new(2)).unwrap());
        let fadt = t.get(b"FACP");
        assert_eq!(fadt.len(), 276, "FADT length (ACPI 6.x)");
        assert_eq!(fadt[8], 6, "FADT major revision");
        assert_eq!(fadt[131], 5, "FADT minor revision");
        assert_eq!(u32_at(fadt, 40), 0, "32-bit DSDT unused");
        assert_eq!(u64_at(fadt, 140) % TABLE_ALIGN, 0, "X_DSDT");
        assert_eq!(u16_at(fadt, 46) as u32, layout::ACPI_SCI_IRQ, "SCI_INT");
        let flags = u32_at(fadt, 112);
        assert_ne!(flags & (1 << 20), 0, "HW_REDUCED_ACPI");
        assert_ne!(flags & (1 << 10), 0, "RESET_REG_SUP");
        let iapc = u16_at(fadt, 109);
        assert_eq!(iapc & IAPC_MSI_NOT_SUPPORTED, 0, "MSI must not be disabled");
        assert_ne!(
            iapc & IAPC_CMOS_RTC_NOT_PRESENT,
            0,
            "no CMOS RTC by default"
        );
        let io_byte_gas = |off: usize, port: u16| {
            assert_eq!(fadt[off], 1, "GAS at {off}: SystemIO");
            assert_eq!(fadt[off + 1], 8, "GAS at {off}: bit width");
            assert_eq!(fadt[off + 2], 0, "GAS at {off}: bit offset");
            assert_eq!(fadt[off + 3], 1, "GAS at {off}: byte access");
            assert_eq!(u64_at(fadt, off + 4), u64::from(port), "GAS at {off}: port");
        };
        io_byte_gas(116, layout::ACPI_RESET_PORT);
        assert_eq!(fadt[128], layout::ACPI_RESET_VALUE);
        io_byte_gas(244, layout::ACPI_SLEEP_CONTROL_PORT);
        io_byte_gas(256, layout::ACPI_SLEEP_STATUS_PORT);

        let mut cfg = AcpiConfig::new(1);
        cfg.cmos_rtc = true;
        let mem = guest_memory();
        let t = walk(&mem, create_acpi_tables(&mem, &cfg).unwrap());
        assert_eq!(u16_at(t.get(b"FACP"), 109) & IAPC_CMOS_RTC_NOT_PRESENT, 0);
    }

    #[test]
    fn madt_describes_cpus_ioapic_and_overrides() {
        let cpus = 4u8;
        let mem = guest_memory();
        let t = walk(
            &mem,
            create_acpi_tables(&mem, &AcpiConfig::new(cpus)).unwrap(),
        );
        let madt = t.get(b"APIC");
        assert_eq!(u32_at(madt, 36) as u64, layout::APIC_START);
        assert_eq!(u32_at(madt, 40) & MADT_PCAT_COMPAT, MADT_PCAT_COMPAT);
        let mut apic_ids = Vec::new();
        let mut ioapics = Vec::new();
        let mut overrides = Vec::new();
        let mut nmis = 0;
        let mut off = 44;
        while off < madt.len() {
            let (kind, len) = (madt[off], madt[off + 1] as usize);
            assert!(len >= 2 && off + len <= madt.len(), "MADT entry at {off}");
            let e = &madt[off..off + len];
            match kind {
                0 => {
                    assert_eq!(len, 8);
                    assert_eq!(e[2], e[3], "processor UID = APIC ID");
                    assert_eq!(u32_at(e, 4), 1, "enabled");
                    apic_ids.push(e[3]);
                }
                1 => {
                    assert_eq!(len, 12);
                    ioapics.push((e[2], u32_at(e, 4) as u64, u32_at(e, 8)));
                }
                2 => {
                    assert_eq!(len, 10);
                    assert_eq!(e[2], 0, "ISA bus");
                    overrides.push((e[3], u32_at(e, 4), u16_at(e, 8)));
                }
                4 => {
                    assert_eq!(len, 6);
                    nmis += 1;
                }
                other => panic!("unexpected MADT entry type {other}"),
            }
            off += len;
        }
        assert_eq!(off, madt.len());
        assert_eq!(apic_ids, (0..cpus).collect::<Vec<_>>());
        assert_eq!(ioapics, vec![(0, layout::IOAPIC_START, 0)]);
        let sci = layout::ACPI_SCI_IRQ;
        assert_eq!(overrides, vec![(0, 2, 0), (sci as u8, sci, 0b1101)]);
        assert_eq!(nmis, 1);
    }

    #[test]
    fn mcfg_covers_the_ecam() {
        let mem = guest_memory();
        let t = walk(&mem, create_acpi_tables(&mem, &AcpiConfig::new(1)).unwrap());
        let mcfg = t.get(b"MCFG");
        assert_eq!(mcfg.len(), 44 + 16, "one allocation");
        assert_eq!(u64_at(mcfg, 44), layout::ECAM_START);
        assert_eq!(u16_at(mcfg, 52), 0, "segment");
        assert_eq!(mcfg[54], 0, "start bus");
        assert_eq!(mcfg[55], layout::PCI_BUS_END);
    }

    #[test]
    fn dsdt_contains_the_devices() {
        let mem = guest_memory();
        let t = walk(&mem, create_acpi_tables(&mem, &AcpiConfig::new(1)).unwrap());
        let body = &t.dsdt[SDT_HEADER_LEN..];
        let has = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
        for name in [
            &b"_S5_"[..],
            b"PCI0",
            b"_OSC",
            b"COM1",
            b"PEVT",
            b"MBRS",
            b"QEMU0001\0",
        ] {
            assert!(has(name), "DSDT lacks {}", String::from_utf8_lossy(name));
        }
        assert_eq!(t.dsdt[8], DSDT_REVISION);
    }

    #[test]
    fn extra_tables_and_aml_are_included() {
        let mut extra = Sdt::new(*b"CEDT", 40, 1, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
        extra.write_u32(36, 0x1234_5678);
        let hid = aml::Name::new("_HID".into(), &"ACPI0017");
        let dev = aml::Device::new("CXLM".into(), vec![&hid]);
        let scope = aml::Scope::new("\\_SB_".into(), vec![&dev]);
        let cfg = AcpiConfig {
            cpus: 1,
            cmos_rtc: false,
            extra_dsdt: vec![&scope],
            extra_tables: vec![&extra],
        };
        let mem = guest_memory();
        let t = walk(&mem, create_acpi_tables(&mem, &cfg).unwrap());
        assert_eq!(t.get(b"CEDT"), extra.as_slice());
        let body = &t.dsdt[SDT_HEADER_LEN..];
        assert!(body.windows(9).any(|w| w == b"ACPI0017\0"));
    }

    #[test]
    fn rejects_bad_extra_tables() {
        let mut bad_sum = Sdt::new(*b"TEST", 40, 1, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
        bad_sum.write_u32(36, 1);
        let mut bytes = bad_sum.as_slice().to_vec();
        bytes[36] ^= 0xff;
        let bad_sum = RawAml(bytes);
        let short = RawAml(b"SHRT".to_vec());
        let mut wrong_len = Sdt::new(*b"TEST", 40, 1, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
        wrong_len.write_u32(4, 44);
        for (table, want) in [
            (&bad_sum as &dyn Aml, "checksum is not zero"),
            (&short, "shorter than an ACPI table header"),
            (&wrong_len, "header length does not match its size"),
        ] {
            let mut cfg = AcpiConfig::new(1);
            cfg.extra_tables.push(table);
            match create_acpi_tables(&guest_memory(), &cfg) {
                Err(AcpiError::BadExtraTable { index: 0, reason }) => assert_eq!(reason, want),
                other => panic!("expected BadExtraTable({want}), got {other:?}"),
            }
        }
    }

    #[test]
    fn rejects_no_cpus_and_oversized_tables() {
        assert!(matches!(
            create_acpi_tables(&guest_memory(), &AcpiConfig::new(0)),
            Err(AcpiError::NoCpus)
        ));

        let huge_len = layout::ACPI_SIZE as u32;
        let huge = Sdt::new(*b"HUGE", huge_len, 1, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
        let mut cfg = AcpiConfig::new(1);
        cfg.extra_tables.push(&huge);
        let mem = guest_memory();
        let err = create_acpi_tables(&mem, &cfg).unwrap_err();
        assert!(
            matches!(err, AcpiError::TooLarge { available, .. } if available == layout::ACPI_SIZE)
        );
        assert!(
            err.to_string().starts_with("ACPI tables need at least 0x"),
            "{err}"
        );
        // Nothing was written, not even the RSDP.
        assert_eq!(read(&mem, layout::ACPI_START, 8), vec![0u8; 8]);
    }

    #[test]
    fn reports_missing_guest_memory() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
        let err = create_acpi_tables(&mem, &AcpiConfig::new(1)).unwrap_err();
        assert!(matches!(err, AcpiError::GuestMemory { addr, .. } if addr == layout::ACPI_START));
    }

    /// A scratch directory for iasl, removed when dropped.
    struct ScratchDir(PathBuf);

    impl ScratchDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("pmovmm-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("scratch dir");
            ScratchDir(dir)
        }
    }

    impl Drop for ScratchDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Runs iasl in `dir`; fails the test (never skips) if it is missing.
    fn iasl(dir: &Path, args: &[&str]) -> String {
        let out = match Command::new("iasl").args(args).current_dir(dir).output() {
            Ok(out) => out,
            Err(e) => panic!(
                "cannot run iasl ({e}): run scripts/setup.sh (it installs acpica-tools) and retry"
            ),
        };
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "iasl {args:?} failed:\n{text}");
        text
    }

    /// Disassembles every table with iasl (which also validates the static
    /// tables field by field), then recompiles the DSDT: both must be free
    /// of errors and warnings.
    #[test]
    fn iasl_accepts_every_table() {
        let hid = aml::Name::new("_HID".into(), &"ACPI0017");
        let dev = aml::Device::new("CXLM".into(), vec![&hid]);
        let scope = aml::Scope::new("\\_SB_".into(), vec![&dev]);
        let mut cfg = AcpiConfig::new(2);
        cfg.extra_dsdt.push(&scope);
        let mem = guest_memory();
        let t = walk(&mem, create_acpi_tables(&mem, &cfg).unwrap());
        let dir = ScratchDir::new("acpi-iasl");

        let mut tables: Vec<&[u8]> = t.listed.iter().map(|x| x.1.as_slice()).collect();
        tables.push(&t.xsdt);
        tables.push(&t.dsdt);
        for table in tables {
            let sig = String::from_utf8_lossy(&table[0..4]).to_lowercase();
            std::fs::write(dir.0.join(format!("{sig}.dat")), table).unwrap();
            let out = iasl(&dir.0, &["-d", &format!("{sig}.dat")]);
            assert!(!out.contains("Error"), "iasl -d {sig}:\n{out}");
            assert!(!out.contains("Warning"), "iasl -d {sig}:\n{out}");
            let dsl = std::fs::read_to_string(dir.0.join(format!("{sig}.dsl"))).unwrap();
            assert!(!dsl.contains("**** "), "iasl flagged {sig}:\n{dsl}");
        }

        let dsl = std::fs::read_to_string(dir.0.join("dsdt.dsl")).unwrap();
        for needle in [
            "Name (_S5, Package (0x04)",
            "Device (PCI0)",
            "EisaId (\"PNP0A08\")",
            "EisaId (\"PNP0A03\")",
            "Method (_OSC, 4, NotSerialized)",
            "Device (COM1)",
            "EisaId (\"PNP0501\")",
            "Device (PEVT)",
            "\"QEMU0001\"",
            "Device (MBRS)",
            "EisaId (\"PNP0C02\")",
            "\"ACPI0017\"",
        ] {
            assert!(dsl.contains(needle), "DSDT lacks {needle}:\n{dsl}");
        }

        // To look at the tables: PMOVMM_ACPI_DUMP=/some/dir cargo test iasl
        if let Some(dump) = std::env::var_os("PMOVMM_ACPI_DUMP") {
            std::fs::create_dir_all(&dump).unwrap();
            for entry in std::fs::read_dir(&dir.0).unwrap() {
                let p = entry.unwrap().path();
                std::fs::copy(&p, Path::new(&dump).join(p.file_name().unwrap())).unwrap();
            }
        }

        let out = iasl(&dir.0, &["-p", "recompiled", "dsdt.dsl"]);
        assert!(
            out.contains("Compilation successful. 0 Errors"),
            "iasl recompile:\n{out}"
        );
        // The one accepted warning: PCI0 has both _HID and _ADR (as QEMU's
        // does; Linux ignores _ADR on a host bridge).
        for line in out.lines().filter(|l| l.starts_with("Warning")) {
            assert!(
                line.contains("either a _HID or _ADR"),
                "iasl recompile:\n{out}"
            );
        }
    }
}
