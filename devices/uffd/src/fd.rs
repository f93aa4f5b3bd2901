//! The userfaultfd and the few ioctls the pagers need, on the stable kernel ABI directly (it
//! is tiny) rather than through a crate that needs bindgen and libclang at build time.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::PAGE_SIZE;

const UFFDIO: u64 = 0xaa;
const fn iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}
const fn ior(nr: u64, size: usize) -> u64 {
    (2 << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

const UFFD_API: u64 = 0xaa;
const UFFDIO_API: u64 = iowr(0x3f, std::mem::size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = iowr(0x00, std::mem::size_of::<UffdioRegister>());
const UFFDIO_WAKE: u64 = ior(0x02, std::mem::size_of::<UffdioRange>());
const UFFDIO_COPY: u64 = iowr(0x03, std::mem::size_of::<UffdioCopy>());
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, std::mem::size_of::<UffdioWriteprotect>());

const REGISTER_MODE_MISSING: u64 = 1 << 0;
const REGISTER_MODE_WP: u64 = 1 << 1;
const COPY_MODE_WP: u64 = 1 << 1;
const WRITEPROTECT_MODE_WP: u64 = 1 << 0;

const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const FEATURE_THREAD_ID: u64 = 1 << 8;

const EVENT_PAGEFAULT: u8 = 0x12;
const PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

/// One message as the kernel writes it (`struct uffd_msg`, 32 bytes).
#[repr(C, packed)]
#[derive(Clone, Copy)]
struct RawMsg {
    event: u8,
    _reserved1: u8,
    _reserved2: u16,
    _reserved3: u32,
    flags: u64,
    address: u64,
    ptid: u32,
    _pad: u32,
}
const _: () = assert!(std::mem::size_of::<RawMsg>() == 32);

/// A page fault reported by the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Faulting address (page aligned by us).
    pub address: u64,
    /// The access was a write.
    pub write: bool,
    /// The page is present but write-protected (first write after install or psync).
    pub wp: bool,
    /// Thread that faulted (a vCPU thread, or a host thread in benches).
    pub tid: u32,
}

/// Outcome of installing a page.
#[derive(Debug, PartialEq, Eq)]
pub enum Install {
    /// We put the page there and woke the faulting threads.
    Done,
    /// Someone else installed it first (a racing fault or a prefetch): it is there.
    AlreadyThere,
}

/// An owned userfaultfd with write-protect and thread-id features.
pub struct Uffd {
    fd: OwnedFd,
}

fn ioctl<T>(fd: RawFd, req: u64, arg: &mut T) -> io::Result<()> {
    // SAFETY: `arg` is a live, correctly sized `#[repr(C)]` struct matching
    // the request number, which encodes that size; the kernel only reads and
    // writes within it.
    let r = unsafe { libc::ioctl(fd, req as _, arg as *mut T) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Uffd {
    /// Opens a userfaultfd that reports faults from kernel mode too (KVM
    /// faults guest memory in through the kernel), with WP and thread ids.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; on success it returns a new fd we own.
        let raw =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as RawFd) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: FEATURE_PAGEFAULT_FLAG_WP | FEATURE_THREAD_ID,
            ioctls: 0,
        };
        ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api)?;
        Ok(Uffd { fd })
    }

    /// Registers `[start, start+len)` for missing-page and write-protect faults.
    pub fn register(&self, start: u64, len: u64) -> io::Result<()> {
        let mut reg = UffdioRegister {
            range: UffdioRange { start, len },
            mode: REGISTER_MODE_MISSING | REGISTER_MODE_WP,
            ioctls: 0,
        };
        ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER, &mut reg)
    }

    /// Reads one fault, or `None` if none is pending (the fd is non-blocking).
    pub fn read_fault(&self) -> io::Result<Option<Fault>> {
        let mut msg = std::mem::MaybeUninit::<RawMsg>::uninit();
        // SAFETY: reads at most 32 bytes into a 32-byte buffer.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                msg.as_mut_ptr().cast(),
                std::mem::size_of::<RawMsg>(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(e),
            };
        }
        if n as usize != std::mem::size_of::<RawMsg>() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "short uffd message",
            ));
        }
        // SAFETY: the kernel filled all 32 bytes; every bit pattern is a valid RawMsg.
        let msg = unsafe { msg.assume_init() };
        if msg.event != EVENT_PAGEFAULT {
            // Fork/remap/remove events are not registered for; skip anything else.
            return Ok(None);
        }
        let flags = msg.flags;
        Ok(Some(Fault {
            address: msg.address & !(PAGE_SIZE - 1),
            write: flags & PAGEFAULT_FLAG_WRITE != 0,
            wp: flags & PAGEFAULT_FLAG_WP != 0,
            tid: msg.ptid,
        }))
    }

    /// Copies `page` to `dst` atomically and wakes the faulting threads.
    /// With `write_protect`, the first write to it faults again (dirty tracking).
    pub fn copy(&self, dst: u64, page: &[u8], write_protect: bool) -> io::Result<Install> {
        let mut c = UffdioCopy {
            dst,
            src: page.as_ptr() as u64,
            len: page.len() as u64,
            mode: if write_protect { COPY_MODE_WP } else { 0 },
            copy: 0,
        };
        match ioctl(self.fd.as_raw_fd(), UFFDIO_COPY, &mut c) {
            Ok(()) => Ok(Install::Done),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                self.wake(dst, page.len() as u64)?;
                Ok(Install::AlreadyThere)
            }
            Err(e) => Err(e),
        }
    }

    /// Sets or clears write protection on present pages, waking waiters when clearing.
    pub fn write_protect(&self, start: u64, len: u64, protect: bool) -> io::Result<()> {
        let mut wp = UffdioWriteprotect {
            range: UffdioRange { start, len },
            mode: if protect { WRITEPROTECT_MODE_WP } else { 0 },
        };
        ioctl(self.fd.as_raw_fd(), UFFDIO_WRITEPROTECT, &mut wp)
    }

    /// [`Uffd::copy`], retried while the kernel answers `EAGAIN` (the address space is
    /// changing under a concurrent `madvise` or `munmap`): the one install loop every pager
    /// uses.
    pub fn install(&self, dst: u64, page: &[u8], write_protect: bool) -> io::Result<Install> {
        loop {
            match self.copy(dst, page, write_protect) {
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => std::hint::spin_loop(),
                r => return r,
            }
        }
    }

    /// Wakes threads waiting on faults in the range without installing anything.
    pub fn wake(&self, start: u64, len: u64) -> io::Result<()> {
        let mut r = UffdioRange { start, len };
        ioctl(self.fd.as_raw_fd(), UFFDIO_WAKE, &mut r)
    }
}

impl AsRawFd for Uffd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
