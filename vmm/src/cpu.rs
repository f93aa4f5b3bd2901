//! vCPUs: CPUID, MSRs, local APIC wiring, boot registers, and the run loop.

use std::sync::Arc;
use std::thread::JoinHandle;

use std::os::fd::AsRawFd;

use kvm_bindings::{kvm_fpu, kvm_msr_entry, kvm_x86_mce, CpuId, Msrs, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};

use crate::boot;
use crate::bus::Bus;
use crate::exit::{ExitReason, VmExit};

/// Errors setting up a vCPU.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("create vCPU {id}: {source}")]
    Create { id: u8, source: kvm_ioctls::Error },
    #[error("vCPU {id}: {what}: {source}")]
    Setup {
        id: u8,
        what: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("vCPU {id}: set {what}: fewer MSRs accepted than given")]
    Msrs { id: u8, what: &'static str },
    #[error("spawn vCPU thread: {0}")]
    Spawn(std::io::Error),
    #[error("vCPU {id}: {what}: {source}")]
    Mce {
        id: u8,
        what: &'static str,
        source: std::io::Error,
    },
}

/// Tells a vCPU which guest page its failed access hit, when the host
/// refused to map it (a PMO page that failed verification).
pub trait PoisonSource: Send + Sync {
    /// The guest physical address recorded for thread `tid`, taken once.
    fn take(&self, tid: u32) -> Option<u64>;
}

const KVMIO: u64 = 0xae;
const KVM_X86_SETUP_MCE: u64 = (1 << 30) | (8 << 16) | (KVMIO << 8) | 0x9c;
const KVM_X86_GET_MCE_CAP_SUPPORTED: u64 = (2 << 30) | (8 << 16) | (KVMIO << 8) | 0x9d;
const KVM_X86_SET_MCE: u64 = (1 << 30) | (64 << 16) | (KVMIO << 8) | 0x9e;
const MCG_CTL_P: u64 = 1 << 8;
const MCG_SER_P: u64 = 1 << 24;
const MCE_BANKS: u64 = 10;
/// The bank we report data-load errors in (as QEMU does).
const MCE_BANK: u8 = 9;
const MCI_STATUS_VAL: u64 = 1 << 63;
const MCI_STATUS_UC: u64 = 1 << 61;
const MCI_STATUS_EN: u64 = 1 << 60;
const MCI_STATUS_MISCV: u64 = 1 << 59;
const MCI_STATUS_ADDRV: u64 = 1 << 58;
const MCI_STATUS_S: u64 = 1 << 56;
const MCI_STATUS_AR: u64 = 1 << 55;
/// MCA error code: data load error ("DCU load" in Intel's terms).
const MCACOD_DATA_LOAD: u64 = 0x134;
const MCG_STATUS_EIPV: u64 = 1 << 1;
const MCG_STATUS_MCIP: u64 = 1 << 2;
/// MCi_MISC: physical address, valid down to bit 12 (one page).
const MCI_MISC_PHYS_PAGE: u64 = (2 << 6) | 12;

/// The machine check a vCPU gets for a refused page: an uncorrected,
/// action-required data load error at `gpa`, without a valid restart IP, so
/// the guest kernel kills the process that touched it (SIGBUS).
fn poison_mce(gpa: u64) -> kvm_x86_mce {
    kvm_x86_mce {
        status: MCI_STATUS_VAL
            | MCI_STATUS_UC
            | MCI_STATUS_EN
            | MCI_STATUS_MISCV
            | MCI_STATUS_ADDRV
            | MCI_STATUS_S
            | MCI_STATUS_AR
            | MCACOD_DATA_LOAD,
        addr: gpa,
        misc: MCI_MISC_PHYS_PAGE,
        mcg_status: MCG_STATUS_MCIP | MCG_STATUS_EIPV,
        bank: MCE_BANK,
        ..Default::default()
    }
}

const CPUID_HYPERVISOR: u32 = 1 << 31;
const CPUID_HTT: u32 = 1 << 28;

/// The host-supported CPUID, adjusted for vCPU `id` of `count`.
fn cpuid_for(base: &CpuId, id: u8, count: u8) -> CpuId {
    let mut cpuid = base.clone();
    for e in cpuid.as_mut_slice() {
        match e.function {
            1 => {
                e.ebx = (e.ebx & 0x0000_ffff) | (u32::from(id) << 24) | (u32::from(count) << 16);
                e.ecx |= CPUID_HYPERVISOR;
                if count > 1 {
                    e.edx |= CPUID_HTT;
                }
            }
            // Extended topology: one thread per core, `count` cores in a package.
            0xb | 0x1f => {
                e.edx = u32::from(id);
                match e.index {
                    0 => {
                        e.eax = 0;
                        e.ebx = 1;
                        e.ecx = 1 << 8;
                    }
                    1 => {
                        e.eax = 32 - u32::from(count.max(1) - 1).leading_zeros();
                        e.ebx = u32::from(count);
                        e.ecx = (2 << 8) | 1;
                    }
                    _ => {
                        e.eax = 0;
                        e.ebx = 0;
                        e.ecx = e.index;
                    }
                }
            }
            _ => {}
        }
    }
    cpuid
}

const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
/// Fast string operations on.
const MISC_ENABLE_FAST_STRING: u64 = 1;
/// MTRRs enabled, default type write-back: without it Linux maps RAM uncached-ish.
const MTRR_ENABLE_WB: u64 = (1 << 11) | 6;

fn boot_msrs() -> Vec<kvm_msr_entry> {
    let e = |index, data| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    };
    vec![
        e(MSR_IA32_SYSENTER_CS, 0),
        e(MSR_IA32_SYSENTER_ESP, 0),
        e(MSR_IA32_SYSENTER_EIP, 0),
        e(MSR_STAR, 0),
        e(MSR_CSTAR, 0),
        e(MSR_KERNEL_GS_BASE, 0),
        e(MSR_SYSCALL_MASK, 0),
        e(MSR_LSTAR, 0),
        e(MSR_IA32_TSC, 0),
        e(MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        e(MSR_MTRR_DEF_TYPE, MTRR_ENABLE_WB),
    ]
}

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

fn set_apic_delivery_mode(regs: &mut [i8], reg: usize, mode: u32) {
    let mut v = [0u8; 4];
    for (i, b) in v.iter_mut().enumerate() {
        *b = regs[reg + i] as u8;
    }
    let value = (u32::from_le_bytes(v) & !0x700) | (mode << 8);
    for (i, b) in value.to_le_bytes().iter().enumerate() {
        regs[reg + i] = *b as i8;
    }
}

/// One vCPU, configured and ready to run.
pub struct Vcpu {
    id: u8,
    fd: VcpuFd,
    poison: Option<Arc<dyn PoisonSource>>,
}

impl Vcpu {
    /// Creates vCPU `id` and sets CPUID, MSRs, FPU and LAPIC LINT pins.
    /// The boot vCPU (id 0) also gets the 64-bit entry state.
    pub fn new(
        kvm: &Kvm,
        vm: &VmFd,
        id: u8,
        count: u8,
        entry: Option<&boot::BootEntry>,
    ) -> Result<Self, CpuError> {
        let fd = vm
            .create_vcpu(u64::from(id))
            .map_err(|source| CpuError::Create { id, source })?;
        let setup = |what| move |source| CpuError::Setup { id, what, source };
        let base = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(setup("get supported CPUID"))?;
        fd.set_cpuid2(&cpuid_for(&base, id, count))
            .map_err(setup("CPUID"))?;

        let entries = boot_msrs();
        let msrs = Msrs::from_entries(&entries).map_err(|_| CpuError::Msrs { id, what: "MSRs" })?;
        let n = fd.set_msrs(&msrs).map_err(setup("MSRs"))?;
        if n != entries.len() {
            return Err(CpuError::Msrs { id, what: "MSRs" });
        }

        let fpu = kvm_fpu {
            fcw: 0x37f,
            mxcsr: 0x1f80,
            ..Default::default()
        };
        fd.set_fpu(&fpu).map_err(setup("FPU"))?;

        let mut lapic = fd.get_lapic().map_err(setup("get LAPIC"))?;
        set_apic_delivery_mode(&mut lapic.regs, APIC_LVT0, APIC_MODE_EXTINT);
        set_apic_delivery_mode(&mut lapic.regs, APIC_LVT1, APIC_MODE_NMI);
        fd.set_lapic(&lapic).map_err(setup("LAPIC"))?;
        setup_mce(kvm, &fd).map_err(|(what, source)| CpuError::Mce { id, what, source })?;

        if let Some(entry) = entry {
            let sregs = fd.get_sregs().map_err(setup("get sregs"))?;
            fd.set_sregs(&boot::boot_sregs(sregs))
                .map_err(setup("sregs"))?;
            fd.set_regs(&boot::boot_regs(entry.entry))
                .map_err(setup("regs"))?;
        }
        Ok(Vcpu {
            id,
            fd,
            poison: None,
        })
    }

    /// Where to look up refused pages when `KVM_RUN` fails with `EFAULT`.
    pub fn set_poison_source(&mut self, source: Arc<dyn PoisonSource>) {
        self.poison = Some(source);
    }

    /// Delivers a machine check for `gpa` to this vCPU.
    fn inject_poison(&self, gpa: u64) -> std::io::Result<()> {
        let mce = poison_mce(gpa);
        // SAFETY: KVM_X86_SET_MCE reads one `kvm_x86_mce` (64 bytes, the size
        // encoded in the request) from the pointer; `mce` outlives the call.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), KVM_X86_SET_MCE as _, &mce) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Runs the vCPU on its own thread until the VM exits.
    pub fn start(
        mut self,
        pio: Arc<Bus>,
        mmio: Arc<Bus>,
        exit: Arc<VmExit>,
    ) -> Result<JoinHandle<()>, CpuError> {
        std::thread::Builder::new()
            .name(format!("vcpu{}", self.id))
            .spawn(move || self.run(&pio, &mmio, &exit))
            .map_err(CpuError::Spawn)
    }

    fn run(&mut self, pio: &Bus, mmio: &Bus, exit: &VmExit) {
        loop {
            if exit.is_set() {
                return;
            }
            match self.fd.run() {
                Ok(VcpuExit::IoIn(port, data)) => {
                    pio.read(u64::from(port), data);
                }
                Ok(VcpuExit::IoOut(port, data)) => {
                    pio.write(u64::from(port), data);
                }
                Ok(VcpuExit::MmioRead(addr, data)) => {
                    if !mmio.read(addr, data) {
                        log::debug!("vcpu{}: unhandled MMIO read at {addr:#x}", self.id);
                    }
                }
                Ok(VcpuExit::MmioWrite(addr, data)) => {
                    if !mmio.write(addr, data) {
                        log::debug!("vcpu{}: unhandled MMIO write at {addr:#x}", self.id);
                    }
                }
                Ok(VcpuExit::Hlt) => {
                    // With the in-kernel LAPIC, HLT only exits if the guest disabled interrupts for good.
                    exit.set(ExitReason::Error(format!("vCPU {} halted", self.id)));
                    return;
                }
                Ok(VcpuExit::Shutdown) => {
                    exit.set(ExitReason::TripleFault);
                    return;
                }
                Ok(VcpuExit::SystemEvent(kind, _)) => {
                    let reason = match kind {
                        kvm_bindings::KVM_SYSTEM_EVENT_SHUTDOWN => ExitReason::PowerOff,
                        kvm_bindings::KVM_SYSTEM_EVENT_RESET => ExitReason::Reset,
                        k => ExitReason::Error(format!("unexpected system event {k}")),
                    };
                    exit.set(reason);
                    return;
                }
                Ok(VcpuExit::FailEntry(reason, cpu)) => {
                    exit.set(ExitReason::Error(format!(
                        "KVM entry failed on vCPU {} (hardware reason {reason:#x}, cpu {cpu})",
                        self.id
                    )));
                    return;
                }
                Ok(VcpuExit::InternalError) => {
                    exit.set(ExitReason::Error(format!(
                        "KVM internal error on vCPU {} (is /dev/kvm able to run this guest?)",
                        self.id
                    )));
                    return;
                }
                Ok(VcpuExit::Intr) => {}
                Ok(other) => {
                    log::warn!("vcpu{}: unhandled exit {other:?}", self.id);
                }
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {}
                Err(e) if e.errno() == libc::EFAULT => {
                    // SAFETY: gettid has no preconditions.
                    let tid = unsafe { libc::gettid() } as u32;
                    match self.poison.as_ref().and_then(|p| p.take(tid)) {
                        Some(gpa) => {
                            log::warn!(
                                "vcpu{}: guest touched refused page {gpa:#x}; injecting a machine check",
                                self.id
                            );
                            if let Err(e) = self.inject_poison(gpa) {
                                exit.set(ExitReason::Error(format!(
                                    "vCPU {}: inject machine check: {e}",
                                    self.id
                                )));
                                return;
                            }
                        }
                        None => {
                            exit.set(ExitReason::Error(format!(
                                "KVM_RUN on vCPU {}: bad address",
                                self.id
                            )));
                            return;
                        }
                    }
                }
                Err(e) => {
                    exit.set(ExitReason::Error(format!(
                        "KVM_RUN on vCPU {}: {e}",
                        self.id
                    )));
                    return;
                }
            }
        }
    }
}

/// Enables machine-check banks so refused pages can be reported to the guest.
fn setup_mce(kvm: &Kvm, fd: &VcpuFd) -> Result<(), (&'static str, std::io::Error)> {
    let mut supported: u64 = 0;
    // SAFETY: the ioctl writes one u64 into `supported`.
    let r = unsafe {
        libc::ioctl(
            kvm.as_raw_fd(),
            KVM_X86_GET_MCE_CAP_SUPPORTED as _,
            &mut supported,
        )
    };
    if r < 0 {
        return Err(("get MCE capabilities", std::io::Error::last_os_error()));
    }
    // The supported value carries capability bits only; KVM accepts up to 32 banks.
    let cap = MCE_BANKS | (supported & (MCG_CTL_P | MCG_SER_P));
    // SAFETY: the ioctl reads one u64 from `cap`.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), KVM_X86_SETUP_MCE as _, &cap) };
    if r < 0 {
        return Err(("set up MCE banks", std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poison_mce_is_an_action_required_data_load_error() {
        let m = poison_mce(0x40_0000_3000);
        assert_eq!(m.addr, 0x40_0000_3000);
        assert_eq!(m.status & 0xffff, MCACOD_DATA_LOAD);
        for bit in [
            MCI_STATUS_VAL,
            MCI_STATUS_UC,
            MCI_STATUS_ADDRV,
            MCI_STATUS_S,
            MCI_STATUS_AR,
        ] {
            assert_ne!(m.status & bit, 0);
        }
        // No restart IP: the guest must not simply retry the load.
        assert_eq!(m.mcg_status & 1, 0);
        assert_eq!(m.misc & 0x3f, 12);
        assert!(u64::from(m.bank) < MCE_BANKS);
        assert_eq!(std::mem::size_of::<kvm_x86_mce>(), 64);
    }

    #[test]
    fn cpuid_carries_apic_id_and_topology() {
        let base = CpuId::from_entries(&[
            kvm_bindings::kvm_cpuid_entry2 {
                function: 1,
                ebx: 0xffff_0800,
                ..Default::default()
            },
            kvm_bindings::kvm_cpuid_entry2 {
                function: 0xb,
                index: 1,
                ..Default::default()
            },
        ])
        .unwrap();
        let c = cpuid_for(&base, 3, 4);
        let e = c.as_slice();
        assert_eq!(e[0].ebx >> 24, 3);
        assert_eq!((e[0].ebx >> 16) & 0xff, 4);
        assert_eq!(e[0].ebx & 0xffff, 0x0800);
        assert_ne!(e[0].ecx & CPUID_HYPERVISOR, 0);
        assert_eq!(e[1].edx, 3);
        assert_eq!(e[1].ebx, 4);
        assert_eq!(e[1].eax, 2);
    }

    #[test]
    fn lint_pins_get_their_delivery_modes() {
        let mut regs = [0i8; 1024];
        regs[APIC_LVT0] = 0x10;
        regs[APIC_LVT0 + 1] = 0x0f;
        set_apic_delivery_mode(&mut regs, APIC_LVT0, APIC_MODE_EXTINT);
        assert_eq!(regs[APIC_LVT0] as u8, 0x10);
        assert_eq!(regs[APIC_LVT0 + 1] as u8, 0x08 | 0x07);
    }
}
