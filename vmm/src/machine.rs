//! Puts the machine together: VM, legacy devices, PCI with its devices, ACPI,
//! boot payload and vCPUs, then waits for the guest to stop.

use locked::Locked;
use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};

use cxl_t3::expander::Expander;
use pci::virtio::{VirtioPci, VirtioPciError};
use pmo_pager::Pager;
use pmo_pager::PmoService;
use pmo_virtio::device::{DeviceError, PmoDevice};
use virtio_devices::pmem::{Pmem, PmemError};
use virtio_devices::VirtioDevice;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::acpi::{self, AcpiConfig};
use crate::boot::{self, BootError};
use crate::bus::{Bus, BusDevice, BusError};
use crate::config::{ConsoleOutput, VmConfig, CXL_ALIGN};
use crate::cpu::{CpuError, RefusedPages, Vcpu};
use crate::cxl::{self, CxlError, CxlMemdev, HostBridge};
use crate::exit::{ExitReason, VmExit};
use crate::layout;
use crate::legacy::{self, AcpiPower, I8042Reset, PvPanic, SerialConsole};
use crate::pci_root::{Ecam, PciError, PciRoot, PioConfig, Window};
use crate::sandbox::VmSandbox;
use crate::vm::{MemSlot, Vm, VmError};

/// The PMO window refuses pages that failed verification.
struct PmoRefused(Arc<Pager>);

impl RefusedPages for PmoRefused {
    fn any_refused(&self) -> bool {
        self.0.refused_pages() > 0
    }
    fn serve_zeros(&self) {
        self.0.zero_refused();
    }
}

/// Errors building or running the machine.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// The KVM VM or its guest memory.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// Loading the kernel, initrd or boot parameters.
    #[error(transparent)]
    Boot(#[from] BootError),
    /// Creating or running a vCPU.
    #[error(transparent)]
    Cpu(#[from] CpuError),
    /// Placing a device on the PCI bus.
    #[error(transparent)]
    Pci(#[from] PciError),
    /// A virtio-pci transport.
    #[error(transparent)]
    VirtioPci(#[from] VirtioPciError),
    /// A virtio-pmem device.
    #[error(transparent)]
    Pmem(#[from] PmemError),
    /// The PMO device or its store.
    #[error(transparent)]
    Pmo(#[from] DeviceError),
    /// Building the ACPI tables.
    #[error("ACPI: {0}")]
    Acpi(#[from] acpi::AcpiError),
    /// Two devices claiming one port or MMIO range.
    #[error("device bus: {0}")]
    Bus(#[from] BusError),
    /// The console log file cannot be created.
    #[error("console {path}: {source}")]
    Console {
        /// The `--console` file.
        path: String,
        /// Why it cannot be created.
        source: std::io::Error,
    },
    /// An eventfd, irqfd or thread the machine needs.
    #[error("{what}: {source}")]
    Io {
        /// What was being set up.
        what: &'static str,
        /// The system's answer.
        source: std::io::Error,
    },
    /// A CXL Type 3 expander or its host bridge.
    #[error(transparent)]
    Cxl(#[from] CxlError),
    /// The devices' memory regions do not fit the device-memory area of the address map.
    #[error("device memory area exhausted")]
    DeviceMemory,
    /// `pmo_on_cxl` names no expander of the configuration (a `VmConfig` not built by
    /// `VmConfig::from_args`).
    #[error("the PMO store's expander is not in the configuration")]
    PmoExpander,
}

/// A machine ready to run.
pub struct Machine {
    // Dropped first: the guest mappings of device memory go before the memory.
    _slots: Vec<MemSlot>,
    /// Owns the VM fd and guest RAM for as long as the guest runs.
    _vm: Vm,
    vcpus: Vec<Vcpu>,
    pio: Arc<Bus>,
    mmio: Arc<Bus>,
    exit: Arc<VmExit>,
    serial: Arc<Mutex<SerialConsole>>,
    /// pmem backing files, flushed when the machine stops so a guest
    /// poweroff leaves the host files complete.
    pmem_files: Vec<Arc<File>>,
    /// The PMO service, detached cleanly when the guest stops.
    pmo: Option<Arc<PmoService>>,
    /// CXL memory devices: unmapped from the guest, flushed and marked
    /// clean (GPF) when the machine stops.
    cxl_devs: Vec<Arc<Mutex<CxlMemdev>>>,
    /// The expander the PMO store lives on (`--pmo-store cxl=NAME`): flushed and marked clean
    /// after the PMO service has detached everything.
    pmo_expander: Option<Arc<Expander>>,
}

fn io_err(what: &'static str) -> impl Fn(std::io::Error) -> MachineError {
    move |source| MachineError::Io { what, source }
}

impl Machine {
    /// Builds the VM `cfg` describes: memory, devices, ACPI tables, the loaded kernel and
    /// vCPUs ready to run. Creates the files the devices need (pmem, store, media).
    pub fn new(cfg: &VmConfig) -> Result<Self, MachineError> {
        let vm = Vm::new(cfg.memory)?;
        let exit = Arc::new(VmExit::new().map_err(io_err("exit eventfd"))?);
        let pio = Arc::new(Bus::new());
        let mmio = Arc::new(Bus::new());

        // Console on COM1, its IRQ through an irqfd.
        let out: Box<dyn Write + Send> = match &cfg.console {
            ConsoleOutput::Stdout => Box::new(std::io::stdout()),
            ConsoleOutput::File(p) => {
                Box::new(File::create(p).map_err(|source| MachineError::Console {
                    path: p.display().to_string(),
                    source,
                })?)
            }
        };
        let serial_irq = EventFd::new(EFD_NONBLOCK).map_err(io_err("serial eventfd"))?;
        vm.fd()
            .register_irqfd(&serial_irq, layout::COM1_IRQ)
            .map_err(|e| MachineError::Io {
                what: "serial irqfd",
                source: std::io::Error::from_raw_os_error(e.errno()),
            })?;
        let serial = Arc::new(Mutex::new(SerialConsole::new(serial_irq, out)));
        pio.insert(u64::from(layout::COM1_PORT), 8, serial.clone())?;

        let power: Arc<Mutex<dyn BusDevice>> = Arc::new(Mutex::new(AcpiPower::new(exit.clone())));
        pio.insert(u64::from(layout::ACPI_SLEEP_CONTROL_PORT), 3, power)?;
        pio.insert(
            u64::from(layout::PVPANIC_PORT),
            1,
            Arc::new(Mutex::new(PvPanic::new(exit.clone()))),
        )?;
        pio.insert(
            u64::from(legacy::I8042_COMMAND_PORT),
            1,
            Arc::new(Mutex::new(I8042Reset::new(exit.clone()))),
        )?;

        // PCI root complex.
        let root = Arc::new(Mutex::new(PciRoot::new(mmio.clone())));
        pio.insert(
            u64::from(layout::PCI_CONFIG_ADDRESS_PORT),
            8,
            Arc::new(Mutex::new(PioConfig::new(root.clone(), {
                let exit = exit.clone();
                Box::new(move || exit.set(ExitReason::Reset))
            }))),
        )?;
        mmio.insert(
            layout::ECAM_START,
            layout::ECAM_SIZE,
            Arc::new(Mutex::new(Ecam(root.clone()))),
        )?;
        let mut mmio32 = Window::new(layout::MMIO32_START, layout::PCI0_MMIO32_SIZE);
        let mut devmem = Window::new(layout::DEVICE_MEM_START, layout::DEVICE_MEM_SIZE);

        let mut slots = Vec::new();
        let mapper = vm.slot_mapper();
        let mut pmem_files = Vec::new();
        for p in &cfg.pmem {
            let mut dev = Pmem::open(&p.path, Some(p.size))?;
            // Section-aligned so the guest could also use it as DAX memory.
            let gpa = devmem
                .alloc(dev.size(), 128 << 20)
                .map_err(|_| MachineError::DeviceMemory)?;
            dev.set_guest_address(gpa);
            for region in dev.device_memory() {
                // SAFETY: the region is the device's file mapping; the device
                // lives inside its transport, which the PCI root (owned by the
                // MMIO bus, owned by the machine) keeps alive;
                // `Machine` drops its slots before anything else.
                slots.push(unsafe { mapper.map(gpa, region.host_addr, region.len, false)? });
            }
            let file = dev.file();
            let transport = Arc::new(Mutex::new(VirtioPci::new(
                Box::new(dev) as Box<dyn VirtioDevice>,
                vm.fd().clone(),
                vm.memory().clone(),
                None,
            )?));
            let bar = mmio32.alloc(VirtioPci::bar0_size(), VirtioPci::bar0_size())?;
            transport.locked().set_bar0(bar);
            root.locked().add(transport.clone())?;
            pmem_files.push(file);
        }

        let mut mmio64 = Window::new(layout::MMIO64_START, layout::MMIO64_SIZE);
        let mut pmo_service = None;
        let mut refused: Option<Arc<dyn RefusedPages>> = None;
        let mut pmo_expander = None;
        if let Some(p) = &cfg.pmo {
            let dev = match &cfg.pmo_on_cxl {
                Some(on) => {
                    let c = cfg
                        .cxl_t3
                        .get(on.expander)
                        .ok_or(MachineError::PmoExpander)?;
                    let m = cxl::pmo_store_medium(c, on)?;
                    let mut dev = PmoDevice::with_medium(p, m.medium, m.blank)?;
                    let store_len = dev.service().store_len();
                    if let Some(area) = cxl::working_area(c, &m.expander, store_len, on)? {
                        log::info!(
                            "PMO store on {}: design c working area {:#x}+{:#x}, mapped into the guest",
                            c.media.display(),
                            area.start(),
                            area.len()
                        );
                        dev.set_working_area(area);
                    }
                    pmo_expander = Some(m.expander);
                    dev
                }
                None => PmoDevice::new(p)?,
            };
            let service = dev.service().clone();
            let mut transport = VirtioPci::new(
                Box::new(dev),
                vm.fd().clone(),
                vm.memory().clone(),
                Some(Box::new(vm.slot_mapper())),
            )?;
            let bar0 = mmio32.alloc(VirtioPci::bar0_size(), VirtioPci::bar0_size())?;
            transport.set_bar0(bar0);
            if let Some(size) = transport.shm_bar_size() {
                transport.set_shm_bar(mmio64.alloc(size, size)?);
            }
            refused = Some(Arc::new(PmoRefused(service.pager().clone())));
            root.locked().add(Arc::new(Mutex::new(transport)))?;
            pmo_service = Some(service);
        }

        // CXL memory expanders, each on a host bridge of its own.
        let mut bridges = Vec::new();
        let mut cxl_devs = Vec::new();
        // `guest=off` expanders have no host bridge: only the PMO store uses them.
        for (i, c) in cfg.cxl_t3.iter().filter(|c| c.guest).enumerate() {
            let window = devmem
                .alloc(c.size, CXL_ALIGN)
                .map_err(|_| MachineError::DeviceMemory)?;
            let bridge = HostBridge::new(i, window, c.size)?;
            let dev = CxlMemdev::new(c, bridge, vm.slot_mapper())?;
            let dev = Arc::new(Mutex::new(dev));
            cxl_devs.push(dev.clone());
            cxl::plug(&mut root.locked(), &bridge, dev)?;
            bridges.push(bridge);
        }
        let cxl_dsdt = cxl::dsdt(&bridges);
        let cedt = cxl::cedt(&bridges);

        let mut acpi_cfg = AcpiConfig::new(cfg.cpus);
        if !bridges.is_empty() {
            acpi_cfg.extra_dsdt.push(&cxl_dsdt);
            acpi_cfg.extra_tables.push(&cedt);
        }
        let rsdp = acpi::create_acpi_tables(vm.memory(), &acpi_cfg)?;
        let entry = boot::load(
            vm.memory(),
            cfg.memory,
            &cfg.kernel,
            cfg.initrd.as_deref(),
            &cfg.cmdline,
            rsdp,
        )?;

        let mut vcpus = Vec::with_capacity(usize::from(cfg.cpus));
        for id in 0..cfg.cpus {
            let mut vcpu = Vcpu::new(vm.kvm(), vm.fd(), id, cfg.cpus, (id == 0).then_some(&entry))?;
            if let Some(r) = &refused {
                vcpu.set_refused_pages(r.clone());
            }
            vcpus.push(vcpu);
        }
        Ok(Machine {
            _vm: vm,
            vcpus,
            pio,
            mmio,
            exit,
            serial,
            pmem_files,
            pmo: pmo_service,
            cxl_devs,
            pmo_expander,
            _slots: slots,
        })
    }

    /// Runs the guest until it powers off, resets, panics or fails, or the
    /// VMM gets SIGTERM (see [`block_sigterm`]). With a `sandbox`, the calling thread
    /// confines itself once the vCPUs run; if it cannot, the VM stops (fail closed).
    pub fn run(
        &mut self,
        interactive: bool,
        sandbox: Option<&VmSandbox>,
    ) -> Result<ExitReason, MachineError> {
        if interactive {
            legacy::spawn_stdin_reader(self.serial.clone());
        }
        spawn_sigterm_waiter(self.exit.clone());
        for vcpu in self.vcpus.drain(..) {
            // vCPU threads are not joined: they may sit in KVM_RUN; the
            // process exit (or VM teardown) ends them.
            vcpu.start(self.pio.clone(), self.mmio.clone(), self.exit.clone())?;
        }
        // After the vCPUs start, so they do not inherit the main thread's filter; the
        // main thread parses no guest input, and waits from here on.
        if let Some(sb) = sandbox {
            if let Err(e) = sb.confine_main() {
                self.exit.set(ExitReason::Error(format!("sandbox: {e}")));
            }
        }
        let reason = self.exit.wait();
        self.serial.locked().flush();
        if let Some(pmo) = &self.pmo {
            // Detach what the guest left attached: the store ends each session
            // as of its last psync, scrubs the shadows, and nothing is left to recover.
            pmo.detach_all();
        }
        if let Some(x) = &self.pmo_expander {
            match x.shutdown() {
                Ok(()) => log::info!("PMO store expander: flushed, {:?}", x.stats()),
                Err(err) => log::error!("PMO store expander: shutdown flush: {err}"),
            }
        }
        for f in &self.pmem_files {
            if let Err(e) = f.sync_data() {
                log::error!("flush pmem: {e}");
            }
        }
        for (i, dev) in self.cxl_devs.iter().enumerate() {
            // GPF. vCPUs may still run (SIGTERM): the device first leaves the
            // guest's memory map, so no store lands after the flush.
            let mut dev = dev.locked();
            match dev.shutdown() {
                Ok(()) => log::info!("cxl-t3 {i}: flushed, {:?}", dev.expander().stats()),
                Err(err) => log::error!("cxl-t3 {i}: shutdown flush: {err}"),
            }
        }
        Ok(reason)
    }
}

/// Blocks SIGTERM in the calling thread and every thread it starts later,
/// so that [`Machine::run`]'s waiter thread receives it and the machine
/// stops the ordinary way: device state (PMO sessions, pmem files, CXL
/// caches) reaches the host files before the process exits. Call it first
/// thing, before any thread exists.
pub fn block_sigterm() -> std::io::Result<()> {
    // SAFETY: plain signal-mask calls on a local, initialised sigset.
    let rc = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Waits for SIGTERM (blocked by [`block_sigterm`]) and ends the run.
fn spawn_sigterm_waiter(exit: Arc<VmExit>) {
    let spawned = threads::spawn(threads::ThreadKind::Signals, "sigterm", move || {
        // SAFETY: sigwait on a local, initialised set; `sig` is written by it.
        let (rc, sig) = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            let mut sig = 0;
            (libc::sigwait(&set, &mut sig), sig)
        };
        if rc == 0 && sig == libc::SIGTERM {
            exit.set(ExitReason::Error("terminated by SIGTERM".into()));
        }
    });
    if let Err(e) = spawned {
        log::warn!("no SIGTERM handling: {e}");
    }
}
