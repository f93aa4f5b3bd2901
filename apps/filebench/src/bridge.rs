//! The `extern "C"` trampolines that let the C engine call a Rust [`Backend`].
//!
//! The engine's `ctx` pointer is a [`Bridge`]. Every trampoline catches a panic of the backend
//! (no unwinding crosses into C): it records it, answers `EIO`, and the caller turns the
//! record into [`crate::Error::BackendPanicked`] once the engine returns.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::ffi::FbPmoOps;
use crate::Backend;

/// What the trampolines reach through the engine's `ctx`.
pub(crate) struct Bridge<'a> {
    backend: &'a dyn Backend,
    panicked: AtomicBool,
}

impl<'a> Bridge<'a> {
    /// A bridge to `backend`.
    pub(crate) fn new(backend: &'a dyn Backend) -> Self {
        Self {
            backend,
            panicked: AtomicBool::new(false),
        }
    }

    /// Whether a callback panicked since the last call; clears the record.
    pub(crate) fn take_panic(&self) -> bool {
        self.panicked.swap(false, Ordering::SeqCst)
    }

    /// The callbacks with `ctx` pointing at `self`; valid while `self` does not move.
    pub(crate) fn ops(&self) -> FbPmoOps {
        FbPmoOps {
            create: tr_create,
            destroy: tr_destroy,
            attach: tr_attach,
            sync: tr_sync,
            detach: tr_detach,
            ctx: self as *const Bridge<'a> as *mut c_void,
        }
    }
}

/// The errno value for `e` (EIO when it carries none).
fn errno_of(e: &io::Error) -> c_int {
    match e.raw_os_error() {
        Some(code) if code > 0 => code,
        _ => libc::EIO,
    }
}

/// Runs `f` on the bridge behind `ctx`; a panic becomes `Err(EIO)` and is recorded.
fn guarded<T>(ctx: *mut c_void, f: impl FnOnce(&dyn Backend) -> io::Result<T>) -> Result<T, c_int> {
    // SAFETY: the engine passes back the ctx of `Bridge::ops`, a live Bridge that the owning
    // Fileset keeps in a Box (it does not move) for as long as the engine can call.
    let bridge = unsafe { &*(ctx as *const Bridge<'_>) };
    match catch_unwind(AssertUnwindSafe(|| f(bridge.backend))) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(errno_of(&e)),
        Err(_) => {
            bridge.panicked.store(true, Ordering::SeqCst);
            Err(libc::EIO)
        }
    }
}

/// The name the engine passed (its names are ASCII); EINVAL if it is not UTF-8.
fn name_of<'n>(name: *const c_char) -> io::Result<&'n str> {
    // SAFETY: the engine passes a NUL-terminated name buffer that lives for the call.
    let name = unsafe { CStr::from_ptr(name) };
    name.to_str()
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// 0 or the errno value.
fn status(r: Result<(), c_int>) -> c_int {
    r.err().unwrap_or(0)
}

extern "C" fn tr_create(ctx: *mut c_void, name: *const c_char, size: usize) -> c_int {
    status(guarded(ctx, |b| b.create(name_of(name)?, size)))
}

extern "C" fn tr_destroy(ctx: *mut c_void, name: *const c_char) -> c_int {
    status(guarded(ctx, |b| b.destroy(name_of(name)?)))
}

extern "C" fn tr_attach(
    ctx: *mut c_void,
    name: *const c_char,
    writable: c_int,
    size: *mut usize,
) -> *mut c_void {
    match guarded(ctx, |b| b.attach(name_of(name)?, writable != 0)) {
        Ok(a) => {
            // SAFETY: the engine passes a valid out-pointer for the size.
            unsafe { *size = a.len };
            a.addr.as_ptr().cast()
        }
        Err(code) => {
            // SAFETY: errno is this thread's; the engine reads it right after the call.
            unsafe { *libc::__errno_location() = code };
            null_mut()
        }
    }
}

/// The address the engine passed (never NULL for an attachment); EINVAL otherwise.
fn addr_of(addr: *mut c_void) -> io::Result<NonNull<u8>> {
    NonNull::new(addr.cast()).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

extern "C" fn tr_sync(ctx: *mut c_void, addr: *mut c_void) -> c_int {
    status(guarded(ctx, |b| b.sync(addr_of(addr)?)))
}

extern "C" fn tr_detach(ctx: *mut c_void, addr: *mut c_void) -> c_int {
    status(guarded(ctx, |b| b.detach(addr_of(addr)?)))
}
