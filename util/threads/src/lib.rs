//! Every thread our crates start, started one way: [`spawn`] with a [`ThreadKind`].
//!
//! A VMM confines its threads by kind (a seccomp filter per kind, a Landlock domain), and a
//! confinement must be installed by the thread itself: seccomp filters and Landlock domains
//! apply to the calling thread and the threads it starts later, never to threads already
//! running. The device crates (the fault server, the pager's prefetch worker, the queue
//! worker, the CXL mailbox and expander, the store's background detach) start threads deep
//! inside their constructors and at run time, and must not know which VMM runs them or how it
//! confines them. So the VMM sets one process-wide start hook ([`set_start_hook`]) before it
//! builds anything, and [`spawn`] runs that hook inside each new thread, before the thread's
//! own work, with the thread's kind.
//!
//! Fail closed: if the hook fails, the thread's work never runs and [`spawn`] returns the
//! hook's error to its caller synchronously, as it would a failed `clone`. Without a hook (unit
//! tests, the harness, host tools) a spawn is a plain named thread.
//!
//! Why a global hook and not one passed through every constructor: the spawns sit four or five
//! constructors deep (`PmoDevice` -> `PmoService` -> `Pager` -> `FaultServer`), in six crates
//! used by three front ends; a parameter through all of them would put sandbox plumbing into
//! every signature, and one forgotten path would start an unconfined thread silently. A VMM
//! wants one policy for all its threads, set once, before the first spawn; [`set_start_hook`]
//! refuses to be set after a thread was already started without it, so none slips through.

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::thread::Thread;

/// What a thread does, which decides what it may do: each kind gets its own confinement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ThreadKind {
    /// Runs one vCPU (`KVM_RUN`) and the device emulation its exits reach.
    Vcpu,
    /// The virtio-pmo device's queue worker: the PMO service's requests (attach, psync, ...).
    PmoQueue,
    /// The virtio-pmem device's queue worker: flush requests.
    PmemQueue,
    /// A userfaultfd fault thread of the PMO window (the pager).
    PmoFault,
    /// The pager's prefetch worker: fills predicted pages.
    PmoPrefetch,
    /// A PMO store's background detach (re-encryption, journal scrub).
    PmoDetach,
    /// The CXL expander's mailbox worker: the guest's mailbox commands.
    CxlMailbox,
    /// A userfaultfd fault thread of a CXL expander's device memory (its DRAM cache).
    CxlFault,
    /// The VMM's signal waiter (SIGTERM).
    Signals,
    /// The VMM's console input (host stdin to the guest's serial port).
    ConsoleIn,
}

impl ThreadKind {
    /// Every kind, for tables and tests.
    pub const ALL: [ThreadKind; 10] = [
        ThreadKind::Vcpu,
        ThreadKind::PmoQueue,
        ThreadKind::PmemQueue,
        ThreadKind::PmoFault,
        ThreadKind::PmoPrefetch,
        ThreadKind::PmoDetach,
        ThreadKind::CxlMailbox,
        ThreadKind::CxlFault,
        ThreadKind::Signals,
        ThreadKind::ConsoleIn,
    ];

    /// The kind's name in messages and docs.
    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::PmoQueue => "pmo-queue",
            ThreadKind::PmemQueue => "pmem-queue",
            ThreadKind::PmoFault => "pmo-fault",
            ThreadKind::PmoPrefetch => "pmo-prefetch",
            ThreadKind::PmoDetach => "pmo-detach",
            ThreadKind::CxlMailbox => "cxl-mailbox",
            ThreadKind::CxlFault => "cxl-fault",
            ThreadKind::Signals => "signals",
            ThreadKind::ConsoleIn => "console-in",
        }
    }
}

impl fmt::Display for ThreadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a start hook refused a thread.
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// The start hook: runs inside every new thread, before its work, with its kind.
pub type StartHook = dyn Fn(ThreadKind) -> Result<(), HookError> + Send + Sync;

/// Errors of [`set_start_hook`].
#[derive(Debug, thiserror::Error)]
pub enum ThreadsError {
    /// A hook is already set: the first one stays.
    #[error("a thread start hook is already set")]
    HookAlreadySet,
    /// Threads were started through [`spawn`] before the hook: they run unconfined.
    #[error("{0} thread(s) were started before the start hook was set")]
    SpawnedBeforeHook(u64),
}

static HOOK: OnceLock<Arc<StartHook>> = OnceLock::new();
static UNHOOKED: AtomicU64 = AtomicU64::new(0);

/// Sets the process-wide start hook, once, before the first [`spawn`]. Fails if one is already
/// set, or if a thread was already started without it (the caller would believe it confined).
pub fn set_start_hook(
    hook: impl Fn(ThreadKind) -> Result<(), HookError> + Send + Sync + 'static,
) -> Result<(), ThreadsError> {
    let before = UNHOOKED.load(Ordering::SeqCst);
    if before > 0 {
        return Err(ThreadsError::SpawnedBeforeHook(before));
    }
    HOOK.set(Arc::new(hook))
        .map_err(|_| ThreadsError::HookAlreadySet)
}

/// Whether a start hook is set.
pub fn hook_is_set() -> bool {
    HOOK.get().is_some()
}

/// An owned permission to join a thread started by [`spawn`] (as `std::thread::JoinHandle`).
pub struct JoinHandle<T> {
    inner: std::thread::JoinHandle<Option<T>>,
}

impl<T> JoinHandle<T> {
    /// Waits for the thread to finish and returns its result, or the payload of its panic.
    pub fn join(self) -> std::thread::Result<T> {
        match self.inner.join()? {
            Some(v) => Ok(v),
            // Only a thread whose hook failed returns nothing, and its handle never leaves
            // `spawn`; answer like a panicked thread rather than trust that.
            None => Err(Box::new("thread start hook failed") as Box<dyn Any + Send>),
        }
    }

    /// The thread's handle (its id and name).
    pub fn thread(&self) -> &Thread {
        self.inner.thread()
    }

    /// Whether the thread has finished.
    pub fn is_finished(&self) -> bool {
        self.inner.is_finished()
    }
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("thread", self.inner.thread())
            .finish()
    }
}

/// Starts thread `name` of kind `kind` running `f`. With a start hook set, the hook runs first
/// inside the new thread; if it fails, `f` is dropped unrun, the thread ends, and the hook's
/// error comes back here (kind `PermissionDenied`, naming the thread). Errors of the thread
/// creation itself come back as from `std::thread::Builder::spawn`.
pub fn spawn<F, T>(
    kind: ThreadKind,
    name: impl Into<String>,
    f: F,
) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let name = name.into();
    let builder = std::thread::Builder::new().name(name.clone());
    let Some(hook) = HOOK.get().cloned() else {
        UNHOOKED.fetch_add(1, Ordering::SeqCst);
        let inner = builder.spawn(move || Some(f()))?;
        return Ok(JoinHandle { inner });
    };
    let (tx, rx) = mpsc::sync_channel::<Result<(), String>>(1);
    let inner = builder.spawn(move || match hook(kind) {
        Ok(()) => {
            // The spawner waits for this answer; it cannot have gone away.
            let _ = tx.send(Ok(()));
            Some(f())
        }
        Err(e) => {
            let _ = tx.send(Err(e.to_string()));
            None
        }
    })?;
    let refused = |why: String| {
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("thread {name} ({kind}): start hook: {why}"),
        )
    };
    match rx.recv() {
        Ok(Ok(())) => Ok(JoinHandle { inner }),
        Ok(Err(why)) => {
            let _ = inner.join();
            Err(refused(why))
        }
        // The hook panicked (a panic=abort build never gets here).
        Err(_) => {
            let _ = inner.join();
            Err(refused("the hook panicked".into()))
        }
    }
}

#[cfg(test)]
mod tests;
