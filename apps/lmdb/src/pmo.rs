//! Where a PMO environment's data file lives: the [`PmoBackend`] trait, and its bridge to the
//! patch's `MDB_pmo_ops` (C trampolines over a boxed context that outlives the environment).

use std::ffi::CStr;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use libc::{c_char, c_int, c_void};
use locked::Locked;

use crate::ffi;

/// Persistent memory for an LMDB data file: LMDB maps nothing itself, it uses the object's
/// memory and asks for durability at every commit.
pub trait PmoBackend: Send + Sync {
    /// Attaches the object for the data file `name` (a path), creating it zero-filled with
    /// `size` bytes (rounded as the backend needs) when it does not exist. Returns the address
    /// of its memory and its real size.
    fn attach(&self, name: &str, size: usize, writable: bool) -> io::Result<(NonNull<u8>, usize)>;
    /// Makes every store to the object at `addr` since the last sync durable, atomically.
    fn sync(&self, addr: NonNull<u8>) -> io::Result<()>;
    /// Detaches the object at `addr`: its memory is gone afterwards; stores since the last
    /// sync are lost.
    fn detach(&self, addr: NonNull<u8>) -> io::Result<()>;
}

/// The context the C side gets: the backend and the last error it reported (LMDB only sees
/// an errno; the environment turns it back into the backend's own error).
pub(crate) struct Bridge {
    backend: Arc<dyn PmoBackend>,
    last: Mutex<Option<io::Error>>,
}

impl Bridge {
    /// A boxed bridge: its address is the C context, stable until it is dropped.
    pub(crate) fn new(backend: Arc<dyn PmoBackend>) -> Box<Bridge> {
        Box::new(Bridge {
            backend,
            last: Mutex::new(None),
        })
    }

    /// The ops table for `mdb_env_set_pmo` (which copies it). The context is `self`: the
    /// caller keeps this bridge alive until `mdb_env_close` has returned.
    pub(crate) fn ops(&self) -> ffi::MDB_pmo_ops {
        ffi::MDB_pmo_ops {
            attach: Some(attach_trampoline),
            sync: Some(sync_trampoline),
            detach: Some(detach_trampoline),
            ctx: self as *const Bridge as *mut c_void,
        }
    }

    /// The backend's error behind errno `code`, if the last one it reported has that code.
    pub(crate) fn take_error(&self, code: c_int) -> Option<io::Error> {
        let mut last = self.last.locked();
        match last.as_ref() {
            Some(e) if errno_of(e) == code => last.take(),
            _ => None,
        }
    }

    /// Records `e` and returns its errno for the C side.
    fn fail(&self, e: io::Error) -> c_int {
        let code = errno_of(&e);
        *self.last.locked() = Some(e);
        code
    }
}

/// The errno LMDB gets for a backend error: the OS code if it has one, else one by kind.
fn errno_of(e: &io::Error) -> c_int {
    if let Some(code) = e.raw_os_error().filter(|c| *c > 0) {
        return code;
    }
    match e.kind() {
        io::ErrorKind::NotFound => libc::ENOENT,
        io::ErrorKind::PermissionDenied => libc::EACCES,
        io::ErrorKind::AlreadyExists => libc::EEXIST,
        io::ErrorKind::InvalidInput => libc::EINVAL,
        io::ErrorKind::ResourceBusy => libc::EBUSY,
        io::ErrorKind::StorageFull => libc::ENOSPC,
        io::ErrorKind::OutOfMemory => libc::ENOMEM,
        _ => libc::EIO,
    }
}

fn set_errno(code: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() = code };
}

/// Runs a backend call; a panic becomes `EIO` instead of unwinding into C.
fn guarded<T>(f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(io::Error::other("the PMO backend panicked")))
}

/// # Safety
/// `ctx` is the address of a live [`Bridge`] (see [`Bridge::ops`]); `name` is a NUL-terminated
/// string and `size` a valid `size_t`, both for the duration of the call (LMDB's contract).
unsafe extern "C" fn attach_trampoline(
    ctx: *mut c_void,
    name: *const c_char,
    size: *mut usize,
    writable: c_int,
) -> *mut c_void {
    // SAFETY: see the function's contract: the bridge outlives every call LMDB makes.
    let bridge = unsafe { &*(ctx as *const Bridge) };
    // SAFETY: LMDB passes its data file path, NUL-terminated, alive during the call.
    let name = unsafe { CStr::from_ptr(name) };
    // SAFETY: LMDB passes the address of its size variable, alive during the call.
    let want = unsafe { *size };
    let r = guarded(|| {
        let name = name
            .to_str()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "data file path not UTF-8"))?;
        bridge.backend.attach(name, want, writable != 0)
    });
    match r {
        Ok((addr, got)) => {
            // SAFETY: as above.
            unsafe { *size = got };
            addr.as_ptr().cast()
        }
        Err(e) => {
            set_errno(bridge.fail(e));
            std::ptr::null_mut()
        }
    }
}

/// Shared body of sync and detach: a backend call on an address, 0 or an errno.
///
/// # Safety
/// `ctx` is the address of a live [`Bridge`].
unsafe fn on_addr(
    ctx: *mut c_void,
    addr: *mut c_void,
    f: impl FnOnce(&dyn PmoBackend, NonNull<u8>) -> io::Result<()>,
) -> c_int {
    // SAFETY: see the function's contract.
    let bridge = unsafe { &*(ctx as *const Bridge) };
    let r = guarded(|| {
        let addr = NonNull::new(addr.cast::<u8>())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "null PMO address"))?;
        f(&*bridge.backend, addr)
    });
    match r {
        Ok(()) => 0,
        Err(e) => bridge.fail(e),
    }
}

/// # Safety
/// `ctx` is the address of a live [`Bridge`].
unsafe extern "C" fn sync_trampoline(ctx: *mut c_void, addr: *mut c_void) -> c_int {
    // SAFETY: the function's contract is on_addr's.
    unsafe { on_addr(ctx, addr, |b, a| b.sync(a)) }
}

/// # Safety
/// `ctx` is the address of a live [`Bridge`].
unsafe extern "C" fn detach_trampoline(ctx: *mut c_void, addr: *mut c_void) -> c_int {
    // SAFETY: the function's contract is on_addr's.
    unsafe { on_addr(ctx, addr, |b, a| b.detach(a)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend whose every call panics or fails.
    struct Broken;

    impl PmoBackend for Broken {
        fn attach(&self, _: &str, _: usize, _: bool) -> io::Result<(NonNull<u8>, usize)> {
            panic!("attach panics");
        }
        fn sync(&self, _: NonNull<u8>) -> io::Result<()> {
            Err(io::Error::new(io::ErrorKind::StorageFull, "no room"))
        }
        fn detach(&self, _: NonNull<u8>) -> io::Result<()> {
            Err(io::Error::from_raw_os_error(libc::EBUSY))
        }
    }

    #[test]
    fn a_panic_is_eio_and_errors_keep_their_errno_and_text() {
        let bridge = Bridge::new(Arc::new(Broken));
        let ops = bridge.ops();
        let mut size = 4096usize;
        let name = c"/x/data.mdb";
        // SAFETY: the bridge is alive, the name NUL-terminated, size a valid local.
        let p = unsafe { (ops.attach.unwrap())(ops.ctx, name.as_ptr(), &mut size, 1) };
        assert!(p.is_null());
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EIO));
        assert!(bridge.take_error(libc::EIO).is_some());
        let mut x = 0u8;
        let addr = (&mut x as *mut u8).cast();
        // SAFETY: the bridge is alive; the backend never touches the address.
        let rc = unsafe { (ops.sync.unwrap())(ops.ctx, addr) };
        assert_eq!(rc, libc::ENOSPC);
        assert!(
            bridge.take_error(libc::EIO).is_none(),
            "another code's error"
        );
        assert_eq!(
            bridge.take_error(libc::ENOSPC).unwrap().to_string(),
            "no room"
        );
        // SAFETY: as above.
        let rc = unsafe { (ops.detach.unwrap())(ops.ctx, addr) };
        assert_eq!(rc, libc::EBUSY);
        // SAFETY: as above; a null address is refused before the backend sees it.
        let rc = unsafe { (ops.sync.unwrap())(ops.ctx, std::ptr::null_mut()) };
        assert_eq!(rc, libc::EINVAL);
    }
}
