//! Legacy platform devices: the 16550 console, ACPI power/reset registers,
//! the i8042 and port-0xcf9 reset paths, and pvpanic.

use locked::Locked;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;
use crate::exit::{ExitReason, VmExit};
use crate::layout;

/// Raises the serial IRQ through an irqfd.
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// COM1: guest output goes to `out`, input can be queued from a host thread.
pub struct SerialConsole {
    inner: Serial<IrqTrigger, NoEvents, Box<dyn Write + Send>>,
}

impl SerialConsole {
    pub fn new(irq: EventFd, out: Box<dyn Write + Send>) -> Self {
        SerialConsole {
            inner: Serial::new(IrqTrigger(irq), out),
        }
    }

    /// Queues host input for the guest; returns how many bytes fit in the FIFO.
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> usize {
        let room = self.inner.fifo_capacity();
        let n = room.min(bytes.len());
        if n > 0 {
            if let Err(e) = self.inner.enqueue_raw_bytes(&bytes[..n]) {
                log::debug!("serial input dropped: {e:?}");
                return 0;
            }
        }
        n
    }

    pub fn flush(&mut self) {
        let _ = self.inner.writer_mut().flush();
    }
}

impl BusDevice for SerialConsole {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let (Some(b), Ok(off)) = (data.first_mut(), u8::try_from(offset)) {
            *b = self.inner.read(off);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Some(&b), Ok(off)) = (data.first(), u8::try_from(offset)) {
            if let Err(e) = self.inner.write(off, b) {
                log::debug!("serial write: {e:?}");
            }
        }
    }
}

/// Feeds the host's stdin to the guest console (for interactive use).
pub fn spawn_stdin_reader(serial: Arc<Mutex<SerialConsole>>) {
    let r = threads::spawn(threads::ThreadKind::ConsoleIn, "console-in", move || {
        let mut buf = [0u8; 64];
        loop {
            // SAFETY: reading into a stack buffer of the given length.
            let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return;
            }
            let mut pending = &buf[..n as usize];
            while !pending.is_empty() {
                let taken = serial.locked().enqueue_input(pending);
                pending = &pending[taken..];
                if taken == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            }
        }
    });
    if let Err(e) = r {
        log::warn!("no console input: {e}");
    }
}

const SLP_EN: u8 = 1 << 5;
const SLP_TYP_SHIFT: u8 = 2;

/// ACPI hardware-reduced sleep control/status and reset registers (3 ports).
pub struct AcpiPower {
    exit: Arc<VmExit>,
}

impl AcpiPower {
    pub fn new(exit: Arc<VmExit>) -> Self {
        AcpiPower { exit }
    }
}

impl BusDevice for AcpiPower {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&v) = data.first() else { return };
        let port = layout::ACPI_SLEEP_CONTROL_PORT + offset as u16;
        if port == layout::ACPI_SLEEP_CONTROL_PORT
            && v & SLP_EN != 0
            && (v >> SLP_TYP_SHIFT) & 0x7 == layout::ACPI_S5_SLP_TYP
        {
            self.exit.set(ExitReason::PowerOff);
        } else if port == layout::ACPI_RESET_PORT && v == layout::ACPI_RESET_VALUE {
            self.exit.set(ExitReason::Reset);
        }
    }
}

/// The i8042 reset path Linux may try (command 0xfe at port 0x64). Status
/// reads answer 0 (no data, input buffer empty) so the kernel's probe does not wait.
pub struct I8042Reset {
    exit: Arc<VmExit>,
}

impl I8042Reset {
    pub fn new(exit: Arc<VmExit>) -> Self {
        I8042Reset { exit }
    }
}

pub const I8042_COMMAND_PORT: u16 = 0x64;
const I8042_CMD_RESET: u8 = 0xfe;

impl BusDevice for I8042Reset {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        if data.first() == Some(&I8042_CMD_RESET) {
            self.exit.set(ExitReason::Reset);
        }
    }
}

const PVPANIC_PANICKED: u8 = 1 << 0;
const PVPANIC_CRASH_LOADED: u8 = 1 << 1;

/// pvpanic: the guest kernel writes here when it panics.
pub struct PvPanic {
    exit: Arc<VmExit>,
}

impl PvPanic {
    pub fn new(exit: Arc<VmExit>) -> Self {
        PvPanic { exit }
    }
}

impl BusDevice for PvPanic {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let Some(b) = data.first_mut() {
            *b = PVPANIC_PANICKED | PVPANIC_CRASH_LOADED;
        }
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        if data.first().is_some_and(|v| v & PVPANIC_PANICKED != 0) {
            self.exit.set(ExitReason::Panic);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s5_powers_off_and_other_sleep_states_do_not() {
        let exit = Arc::new(VmExit::new().unwrap());
        let mut p = AcpiPower::new(exit.clone());
        p.write(0, &[(3 << SLP_TYP_SHIFT) | SLP_EN]);
        p.write(0, &[layout::ACPI_S5_SLP_TYP << SLP_TYP_SHIFT]);
        assert!(!exit.is_set());
        p.write(0, &[(layout::ACPI_S5_SLP_TYP << SLP_TYP_SHIFT) | SLP_EN]);
        assert_eq!(exit.wait(), ExitReason::PowerOff);
    }

    #[test]
    fn reset_register_and_legacy_paths_reset() {
        let exit = Arc::new(VmExit::new().unwrap());
        let mut p = AcpiPower::new(exit.clone());
        p.write(2, &[0x55]);
        assert!(!exit.is_set());
        p.write(2, &[layout::ACPI_RESET_VALUE]);
        assert_eq!(exit.wait(), ExitReason::Reset);

        let exit = Arc::new(VmExit::new().unwrap());
        let mut k = I8042Reset::new(exit.clone());
        k.write(0, &[0xd1]);
        assert!(!exit.is_set());
        k.write(0, &[0xfe]);
        assert_eq!(exit.wait(), ExitReason::Reset);
    }

    #[test]
    fn pvpanic_reports_panic() {
        let exit = Arc::new(VmExit::new().unwrap());
        let mut p = PvPanic::new(exit.clone());
        let mut caps = [0u8];
        p.read(0, &mut caps);
        assert_eq!(caps[0] & PVPANIC_PANICKED, PVPANIC_PANICKED);
        p.write(0, &[PVPANIC_PANICKED]);
        assert_eq!(exit.wait(), ExitReason::Panic);
    }
}
