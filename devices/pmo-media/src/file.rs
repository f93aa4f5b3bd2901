//! A host file mapped into memory: the PM file of a store.

use super::{check_range, Medium, MediumError};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;

/// How a [`FileMedium`] makes writes durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// The file is on a DAX filesystem and mapped with `MAP_SYNC`: cache-line flushes + `sfence`
    /// are a durability point, no system call needed.
    DaxFlush,
    /// Page-cache backed: `msync(MS_SYNC)` of the covering pages.
    Msync,
}

/// An mmap of a (typically sparse) host file. Owns the mapping and the file descriptor; both are
/// released on drop.
pub struct FileMedium {
    ptr: *mut u8,
    len: u64,
    file: File,
    mode: Persistence,
    readonly: bool,
}

// SAFETY: the mapping is shared memory owned by this value; concurrent access is to disjoint
// ranges (the store's locks guarantee it) and all accesses go through copy functions.
unsafe impl Send for FileMedium {}
// SAFETY: see above; `&self` methods only copy bytes in and out of the mapping.
unsafe impl Sync for FileMedium {}

/// Smallest range `zero` deallocates instead of overwriting.
const PUNCH_MIN: u64 = 1 << 20;

fn io(what: &'static str) -> MediumError {
    MediumError::Io {
        what,
        source: std::io::Error::last_os_error(),
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

fn file_len(file: &File) -> Result<u64, MediumError> {
    file.metadata()
        .map(|m| m.len())
        .map_err(|source| MediumError::Io {
            what: "stat medium file",
            source,
        })
}

impl FileMedium {
    /// Creates (or truncates) `path` as a sparse file of `len` bytes and maps it.
    pub fn create(path: &Path, len: u64) -> Result<Self, MediumError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|source| MediumError::Io {
                what: "create medium file",
                source,
            })?;
        file.set_len(len).map_err(|source| MediumError::Io {
            what: "size medium file",
            source,
        })?;
        Self::map(file, len)
    }

    /// Opens `path`, or creates it as a sparse file of `len` bytes when it does not exist and
    /// a length is given; says whether it created it. An existing file is never truncated: the
    /// create is exclusive, so a file that appears in between is opened, not replaced.
    pub fn open_or_create(path: &Path, len: Option<u64>) -> Result<(Self, bool), MediumError> {
        let Some(len) = len else {
            return Ok((Self::open(path)?, false));
        };
        let created = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path);
        match created {
            Ok(file) => {
                file.set_len(len).map_err(|source| MediumError::Io {
                    what: "size medium file",
                    source,
                })?;
                Ok((Self::map(file, len)?, true))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Ok((Self::open(path)?, false))
            }
            Err(source) => Err(MediumError::Io {
                what: "create medium file",
                source,
            }),
        }
    }

    /// Opens an existing file and maps all of it.
    pub fn open(path: &Path) -> Result<Self, MediumError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| MediumError::Io {
                what: "open medium file",
                source,
            })?;
        let len = file_len(&file)?;
        Self::map(file, len)
    }

    /// Opens a store file read-only and without taking the owner lock, for inspection while a VMM
    /// may be using it (what it reads may be mid-update). Writes fail.
    pub fn open_readonly(path: &Path) -> Result<Self, MediumError> {
        let file = OpenOptions::new()
            .read(true)
            .open(path)
            .map_err(|source| MediumError::Io {
                what: "open medium file",
                source,
            })?;
        let len = file_len(&file)?;
        if len == 0 {
            return Err(MediumError::OutOfRange {
                off: 0,
                len: 0,
                end: 0,
            });
        }
        // SAFETY: a fresh read-only shared mapping of a file we own; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io("mmap medium file"));
        }
        Ok(Self {
            ptr: p.cast(),
            len,
            file,
            mode: Persistence::Msync,
            readonly: true,
        })
    }

    fn map(file: File, len: u64) -> Result<Self, MediumError> {
        // One owner per store file: a second VMM (or CLI) mapping it would corrupt it. The lock
        // goes away with the descriptor.
        // SAFETY: flock on our own descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Err(MediumError::InUse);
            }
            return Err(MediumError::Io {
                what: "lock medium file",
                source: e,
            });
        }
        if len == 0 {
            return Err(MediumError::OutOfRange {
                off: 0,
                len: 0,
                end: 0,
            });
        }
        let fd = file.as_raw_fd();
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh shared mapping of a file we own; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                prot,
                libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
                fd,
                0,
            )
        };
        let (p, mode) = if p == libc::MAP_FAILED {
            // Not DAX: fall back to the page cache.
            // SAFETY: as above, without MAP_SYNC.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len as usize,
                    prot,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(io("mmap medium file"));
            }
            (p, Persistence::Msync)
        } else {
            (p, Persistence::DaxFlush)
        };
        Ok(Self {
            ptr: p.cast(),
            len,
            file,
            mode,
            readonly: false,
        })
    }

    /// How persistence is achieved on this file.
    pub fn persistence(&self) -> Persistence {
        self.mode
    }

    fn flush_lines(&self, off: u64, len: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let start = off & !63;
            let end = off + len;
            if has_clflushopt() {
                // SAFETY: the instruction is present; the range lies inside the mapping.
                unsafe { flush_opt(self.ptr, start, end) };
            } else {
                let mut a = start;
                while a < end {
                    // SAFETY: `a` is inside the mapping (checked by the caller).
                    unsafe { std::arch::x86_64::_mm_clflush(self.ptr.add(a as usize)) };
                    a += 64;
                }
            }
            // SAFETY: sfence has no memory-safety preconditions.
            unsafe { std::arch::x86_64::_mm_sfence() };
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (off, len);
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// CPUID.(EAX=7,ECX=0):EBX bit 23 = CLFLUSHOPT.
#[cfg(target_arch = "x86_64")]
fn has_clflushopt() -> bool {
    static FLAG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FLAG.get_or_init(|| {
        let r = std::arch::x86_64::__cpuid_count(7, 0);
        r.ebx & (1 << 23) != 0
    })
}

/// Flushes every cache line of `[start, end)` with CLFLUSHOPT (weakly ordered; the caller
/// fences).
///
/// # Safety
/// The CPU must support CLFLUSHOPT and the range must lie inside the mapping at `base`.
#[cfg(target_arch = "x86_64")]
unsafe fn flush_opt(base: *mut u8, start: u64, end: u64) {
    let mut a = start;
    while a < end {
        // SAFETY: the caller guarantees support and that the address is mapped.
        unsafe {
            std::arch::asm!("clflushopt [{}]", in(reg) base.add(a as usize), options(nostack, preserves_flags))
        };
        a += 64;
    }
}

impl Drop for FileMedium {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping created in `map`; nothing refers to it any more.
        unsafe { libc::munmap(self.ptr.cast(), self.len as usize) };
    }
}

impl Medium for FileMedium {
    fn len(&self) -> u64 {
        self.len
    }

    /// The mapping: valid for `len()` bytes while `self` lives (not for a read-only handle).
    fn as_ptr(&self) -> Option<*mut u8> {
        (!self.readonly).then_some(self.ptr)
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), MediumError> {
        check_range(self.len, off, buf.len() as u64)?;
        // SAFETY: the range was checked to lie inside the mapping; `buf` is a distinct allocation.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.add(off as usize), buf.as_mut_ptr(), buf.len())
        };
        Ok(())
    }

    fn write(&self, off: u64, data: &[u8]) -> Result<(), MediumError> {
        check_range(self.len, off, data.len() as u64)?;
        if self.readonly {
            return Err(MediumError::ReadOnly);
        }
        // SAFETY: the range was checked; the store serialises writers of one range.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off as usize), data.len())
        };
        Ok(())
    }

    fn persist(&self, off: u64, len: u64) -> Result<(), MediumError> {
        check_range(self.len, off, len)?;
        if self.readonly {
            return Err(MediumError::ReadOnly);
        }
        if len == 0 {
            return Ok(());
        }
        match self.mode {
            Persistence::DaxFlush => {
                self.flush_lines(off, len);
                Ok(())
            }
            Persistence::Msync => {
                let ps = page_size();
                let start = off / ps * ps;
                let end = (off + len).min(self.len);
                // SAFETY: [start, end) is inside the mapping and page aligned at the start.
                let r = unsafe {
                    libc::msync(
                        self.ptr.add(start as usize).cast(),
                        (end - start) as usize,
                        libc::MS_SYNC,
                    )
                };
                if r != 0 {
                    return Err(io("msync"));
                }
                Ok(())
            }
        }
    }

    fn zero_in_place(&self, off: u64, len: u64) -> Result<(), MediumError> {
        check_range(self.len, off, len)?;
        if self.readonly {
            return Err(MediumError::ReadOnly);
        }
        // SAFETY: the range was checked to lie inside the mapping; the store serialises
        // writers of one range.
        unsafe { std::ptr::write_bytes(self.ptr.add(off as usize), 0, len as usize) };
        Ok(())
    }

    fn zero(&self, off: u64, len: u64) -> Result<(), MediumError> {
        check_range(self.len, off, len)?;
        if self.readonly {
            return Err(MediumError::ReadOnly);
        }
        let ps = page_size();
        let a = off.div_ceil(ps) * ps;
        let b = (off + len) / ps * ps;
        // Punching a hole unmaps the range from every process mapping it (a TLB shootdown that
        // can stall for milliseconds on a busy host); only worth it for large ranges.
        if b > a && b - a >= PUNCH_MIN {
            // Punch out whole pages: the file stays sparse and the bytes read back as zero.
            // SAFETY: plain fallocate on our own descriptor.
            let r = unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    a as libc::off_t,
                    (b - a) as libc::off_t,
                )
            };
            if r == 0 {
                let z = [0u8; 4096];
                for (s, e) in [(off, a), (b, off + len)] {
                    let mut at = s;
                    while at < e {
                        let n = (e - at).min(z.len() as u64) as usize;
                        self.write(at, &z[..n])?;
                        at += n as u64;
                    }
                }
                if self.mode == Persistence::DaxFlush {
                    // SAFETY: fdatasync on our own descriptor makes the hole durable.
                    if unsafe { libc::fdatasync(self.file.as_raw_fd()) } != 0 {
                        return Err(io("fdatasync"));
                    }
                }
                return Ok(());
            }
        }
        // Filesystem without hole punching: write zeros.
        let z = vec![0u8; 65536];
        let mut at = off;
        while at < off + len {
            let n = (off + len - at).min(z.len() as u64) as usize;
            self.write(at, &z[..n])?;
            at += n as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_or_create_never_replaces_an_existing_file() {
        let dir = std::env::temp_dir().join(format!("pmo-fm-ooc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m");
        assert!(
            FileMedium::open_or_create(&path, None).is_err(),
            "missing, no size"
        );
        let (m, created) = FileMedium::open_or_create(&path, Some(1 << 20)).unwrap();
        assert!(created);
        assert_eq!(m.len(), 1 << 20);
        m.write(4096, b"kept").unwrap();
        m.persist(4096, 4).unwrap();
        drop(m);
        // A second call with another size opens the file as it is.
        let (m, created) = FileMedium::open_or_create(&path, Some(2 << 20)).unwrap();
        assert!(!created);
        assert_eq!(m.len(), 1 << 20);
        let mut b = [0u8; 4];
        m.read(4096, &mut b).unwrap();
        assert_eq!(&b, b"kept");
        drop(m);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sparse_file_round_trip_and_punch() {
        let dir = std::env::temp_dir().join(format!("pmo-fm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m");
        let m = FileMedium::create(&path, 1 << 30).unwrap();
        m.write(5 << 20, b"hello").unwrap();
        m.persist(5 << 20, 5).unwrap();
        drop(m);
        let meta = std::fs::metadata(&path).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert!(
            meta.blocks() * 512 < 1 << 20,
            "a 1 GiB medium must stay sparse"
        );
        let m = FileMedium::open(&path).unwrap();
        assert!(matches!(FileMedium::open(&path), Err(MediumError::InUse)));
        let ro = FileMedium::open_readonly(&path).unwrap();
        let mut r = [0u8; 5];
        ro.read(5 << 20, &mut r).unwrap();
        assert_eq!(&r, b"hello");
        assert!(matches!(ro.write(0, b"x"), Err(MediumError::ReadOnly)));
        drop(ro);
        let mut b = [0u8; 5];
        m.read(5 << 20, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        m.zero((5 << 20) - 10, 8192).unwrap();
        m.read(5 << 20, &mut b).unwrap();
        assert_eq!(b, [0; 5]);
        assert!(m.write((1 << 30) - 2, b"xyz").is_err());
        // A large scrub gives the space back to the file system.
        m.write(64 << 20, &vec![7u8; 4 << 20]).unwrap();
        m.persist(64 << 20, 4 << 20).unwrap();
        let used = |p: &std::path::Path| std::fs::metadata(p).unwrap().blocks() * 512;
        assert!(used(&path) >= 4 << 20);
        m.zero(64 << 20, 4 << 20).unwrap();
        m.persist(64 << 20, 4 << 20).unwrap();
        assert!(used(&path) < 1 << 20);
        let mut b2 = [1u8; 16];
        m.read((66 << 20) + 5, &mut b2).unwrap();
        assert_eq!(b2, [0u8; 16]);
        // A scrub in place (the journal area) zeroes as much and keeps the space, so the
        // next psync's journal writes allocate nothing.
        m.write(64 << 20, &vec![7u8; 4 << 20]).unwrap();
        m.persist(64 << 20, 4 << 20).unwrap();
        let before = used(&path);
        m.zero_in_place((64 << 20) + 3, (4 << 20) - 6).unwrap();
        m.persist(64 << 20, 4 << 20).unwrap();
        assert_eq!(used(&path), before);
        let mut edges = [0u8; 5];
        m.read((64 << 20) + 1, &mut edges[..3]).unwrap();
        m.read((68 << 20) - 4, &mut edges[3..]).unwrap();
        assert_eq!(edges, [7, 7, 0, 0, 7], "exactly the range");
        m.read((65 << 20) + 5, &mut b2).unwrap();
        assert_eq!(b2, [0u8; 16]);
        assert!(m.zero_in_place((1 << 30) - 2, 3).is_err(), "past the end");
        assert!(m.zero_in_place(u64::MAX, 2).is_err(), "no wrap");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
