//! vCPUs: CPUID, MSRs, local APIC wiring, boot registers, and the run loop.

use std::sync::Arc;
use threads::{JoinHandle, ThreadKind};

use kvm_bindings::{kvm_fpu, kvm_msr_entry, CpuId, Msrs, KVM_MAX_CPUID_ENTRIES};
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
}

/// Tells a vCPU whether the host refuses some guest pages on purpose (PMO
/// pages that failed verification): then `EFAULT` from `KVM_RUN` is the
/// guest touching one, and the vCPU retries until the guest driver has
/// unmapped the page, after which the access faults inside the guest.
pub trait RefusedPages: Send + Sync {
    fn any_refused(&self) -> bool;
    /// Serve refused pages as zeros: the guest did not unmap them in time.
    /// Never silent: the refusal already failed the attachment and told the
    /// guest driver, which signals the process (docs/pmo-device.md).
    fn serve_zeros(&self);
}

/// How long a vCPU retries an access to a refused page before the page is
/// served as zeros (the guest did not unmap it: typically its kernel copying
/// from the page on a process's behalf, on a vCPU that never yields to the
/// driver's work).
const REFUSED_ZERO_AFTER: std::time::Duration = std::time::Duration::from_millis(500);
/// How long before the VM is stopped: even zeros did not let the access finish.
const REFUSED_RETRY_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);
/// Pause between retries, so the guest's event work gets to run.
const REFUSED_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_micros(100);

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
    refused: Option<Arc<dyn RefusedPages>>,
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
            refused: None,
        })
    }

    /// Where to learn whether `EFAULT` means a refused page.
    pub fn set_refused_pages(&mut self, refused: Arc<dyn RefusedPages>) {
        self.refused = Some(refused);
    }

    /// Runs the vCPU on its own thread until the VM exits.
    pub fn start(
        mut self,
        pio: Arc<Bus>,
        mmio: Arc<Bus>,
        exit: Arc<VmExit>,
    ) -> Result<JoinHandle<()>, CpuError> {
        threads::spawn(ThreadKind::Vcpu, format!("vcpu{}", self.id), move || {
            self.run(&pio, &mmio, &exit)
        })
        .map_err(CpuError::Spawn)
    }

    fn run(&mut self, pio: &Bus, mmio: &Bus, exit: &VmExit) {
        // When the current streak of refused-page retries began.
        let mut refused_since: Option<std::time::Instant> = None;
        let mut served_zeros = false;
        loop {
            if exit.is_set() {
                return;
            }
            let r = self.fd.run();
            if r.is_ok() {
                refused_since = None;
                served_zeros = false;
            }
            match r {
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
                Err(e)
                    if e.errno() == libc::EFAULT
                        && self.refused.as_ref().is_some_and(|r| r.any_refused()) =>
                {
                    let since = *refused_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() > REFUSED_ZERO_AFTER && !served_zeros {
                        log::warn!(
                            "vcpu{}: the guest did not unmap a refused PMO page; serving it as zeros (its attachment is failed, the guest was told)",
                            self.id
                        );
                        if let Some(r) = &self.refused {
                            r.serve_zeros();
                        }
                        served_zeros = true;
                    }
                    if since.elapsed() > REFUSED_RETRY_LIMIT {
                        exit.set(ExitReason::Error(format!(
                            "vCPU {}: the guest kept touching a PMO page that failed verification",
                            self.id
                        )));
                        return;
                    }
                    std::thread::sleep(REFUSED_RETRY_PAUSE);
                    continue;
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

#[cfg(test)]
mod tests {
    use super::*;

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
