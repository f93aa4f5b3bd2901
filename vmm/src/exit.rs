//! Why and when the VM stops: set once by whichever thread sees it first.

use locked::Locked;
use std::sync::Mutex;

use vmm_sys_util::eventfd::EventFd;

/// How the guest's run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitReason {
    /// The guest powered off (ACPI S5).
    PowerOff,
    /// The guest asked for a reset (reboot).
    Reset,
    /// The guest kernel panicked and said so through pvpanic.
    Panic,
    /// A vCPU triple-faulted: the guest crashed without a word.
    TripleFault,
    /// The VMM could not go on.
    Error(String),
}

impl ExitReason {
    /// Process exit code: 0 for a clean poweroff or reboot, 2 for a guest
    /// panic, 3 for a triple fault, 1 for VMM errors.
    pub fn exit_code(&self) -> i32 {
        match self {
            ExitReason::PowerOff | ExitReason::Reset => 0,
            ExitReason::Panic => 2,
            ExitReason::TripleFault => 3,
            ExitReason::Error(_) => 1,
        }
    }
}

/// The first exit reason wins; waiters are woken through an eventfd.
pub struct VmExit {
    reason: Mutex<Option<ExitReason>>,
    event: EventFd,
}

impl VmExit {
    /// No reason yet; fails only if the eventfd cannot be made.
    pub fn new() -> std::io::Result<Self> {
        Ok(VmExit {
            reason: Mutex::new(None),
            event: EventFd::new(0)?,
        })
    }

    /// Records `reason` unless another one came first, and wakes the waiter.
    pub fn set(&self, reason: ExitReason) {
        let mut r = self.reason.locked();
        if r.is_none() {
            *r = Some(reason);
            if let Err(e) = self.event.write(1) {
                log::error!("cannot signal VM exit: {e}");
            }
        }
    }

    /// Whether the VM is stopping (vCPU threads poll this between runs).
    pub fn is_set(&self) -> bool {
        self.reason.locked().is_some()
    }

    /// Blocks until an exit reason is set and returns it.
    pub fn wait(&self) -> ExitReason {
        loop {
            if let Some(r) = self.reason.locked().clone() {
                return r;
            }
            // A failed read (EINTR) just loops back to check again.
            let _ = self.event.read();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn first_reason_wins_and_wakes_the_waiter() {
        let exit = Arc::new(VmExit::new().unwrap());
        let e2 = exit.clone();
        let t = std::thread::spawn(move || e2.wait());
        exit.set(ExitReason::Panic);
        exit.set(ExitReason::PowerOff);
        assert_eq!(t.join().unwrap(), ExitReason::Panic);
        assert_eq!(exit.wait().exit_code(), 2);
    }
}
