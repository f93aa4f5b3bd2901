//! [`FileBackend`]: a TEST backend with one ordinary file per "PMO" in a directory.
//!
//! Objects are files mapped `MAP_SHARED`; sync is `msync(MS_SYNC)`. It is neither atomic (a
//! crash during msync leaves a mix of old and new pages) nor encrypted: it runs and tests the
//! engine where no PMO store is at hand. It keeps the PMO rules the engine relies on: names of
//! 1..63 of `[A-Za-z0-9._-]` not starting with '.', sizes in whole pages, one writer or many
//! readers per object (EBUSY), no destroy while attached (EBUSY).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Mutex;

use locked::Locked;

use crate::{Attachment, Backend};

/// Page size objects are made of.
const PAGE: usize = 4096;

/// One live mapping.
struct Mapped {
    name: String,
    addr: usize,
    len: usize,
    writable: bool,
}

/// One file per object in a directory; see the module documentation.
pub struct FileBackend {
    dir: PathBuf,
    mapped: Mutex<Vec<Mapped>>,
}

/// An io::Error of errno `code`.
fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

impl FileBackend {
    /// A backend on `dir`, created if missing.
    pub fn new(dir: impl AsRef<Path>) -> io::Result<Self> {
        fs::create_dir_all(dir.as_ref())?;
        Ok(Self {
            dir: dir.as_ref().to_path_buf(),
            mapped: Mutex::new(Vec::new()),
        })
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Names of the objects that exist, sorted.
    pub fn names(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    /// The file of object `name`, after checking the name as libpmo does.
    fn path(&self, name: &str) -> io::Result<PathBuf> {
        let ok_char = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-');
        if name.len() > 63 {
            return Err(errno(libc::ENAMETOOLONG));
        }
        if name.is_empty() || name.starts_with('.') || !name.bytes().all(ok_char) {
            return Err(errno(libc::EINVAL));
        }
        Ok(self.dir.join(name))
    }

    /// Maps `file` of `len` bytes.
    fn map(file: &File, len: usize, writable: bool) -> io::Result<NonNull<u8>> {
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: a fresh shared mapping of an open file descriptor chosen by the kernel; it
        // overlaps nothing of ours and stays valid after the descriptor closes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast()).ok_or_else(|| errno(libc::EIO))
    }

    /// The mapping containing `addr`: (index, start, len).
    fn find(mapped: &[Mapped], addr: NonNull<u8>) -> io::Result<(usize, usize, usize)> {
        let a = addr.as_ptr() as usize;
        mapped
            .iter()
            .enumerate()
            .find(|(_, m)| a >= m.addr && a < m.addr + m.len)
            .map(|(i, m)| (i, m.addr, m.len))
            .ok_or_else(|| errno(libc::EINVAL))
    }
}

// SAFETY: attach maps the whole file MAP_SHARED with the asked protection and keeps the mapping
// until detach (or drop of the backend, after the engine is done); a writable attachment is
// exclusive within this backend (EBUSY otherwise). Other processes writing the files break the
// contract; nothing in this project does that to a test directory in use.
unsafe impl Backend for FileBackend {
    fn create(&self, name: &str, size: usize) -> io::Result<()> {
        let path = self.path(name)?;
        if size == 0 || !size.is_multiple_of(PAGE) {
            return Err(errno(libc::EINVAL));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        // A sparse file of zeros, as pcreate makes a zero-filled object.
        file.set_len(size as u64).inspect_err(|_| {
            let _ = fs::remove_file(&path);
        })
    }

    fn destroy(&self, name: &str) -> io::Result<()> {
        let path = self.path(name)?;
        let mapped = self.mapped.locked();
        if mapped.iter().any(|m| m.name == name) {
            return Err(errno(libc::EBUSY));
        }
        fs::remove_file(path)
    }

    fn attach(&self, name: &str, writable: bool) -> io::Result<Attachment> {
        let path = self.path(name)?;
        let mut mapped = self.mapped.locked();
        if mapped
            .iter()
            .any(|m| m.name == name && (writable || m.writable))
        {
            return Err(errno(libc::EBUSY));
        }
        let file = OpenOptions::new().read(true).write(writable).open(path)?;
        let len = usize::try_from(file.metadata()?.len()).map_err(|_| errno(libc::EIO))?;
        if len == 0 || !len.is_multiple_of(PAGE) {
            return Err(errno(libc::EIO));
        }
        let addr = Self::map(&file, len, writable)?;
        mapped.push(Mapped {
            name: name.to_owned(),
            addr: addr.as_ptr() as usize,
            len,
            writable,
        });
        Ok(Attachment { addr, len })
    }

    fn sync(&self, addr: NonNull<u8>) -> io::Result<()> {
        let (_, start, len) = Self::find(&self.mapped.locked(), addr)?;
        // SAFETY: [start, start + len) is a live mapping of ours: only its holder detaches it,
        // and the holder is the caller.
        if unsafe { libc::msync(start as *mut libc::c_void, len, libc::MS_SYNC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn detach(&self, addr: NonNull<u8>) -> io::Result<()> {
        let m = {
            let mut mapped = self.mapped.locked();
            let (i, _, _) = Self::find(&mapped, addr)?;
            mapped.swap_remove(i)
        };
        // SAFETY: the mapping was made by map() and is removed from the table, so nothing of
        // ours uses it again.
        if unsafe { libc::munmap(m.addr as *mut libc::c_void, m.len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for FileBackend {
    fn drop(&mut self) {
        for m in self
            .mapped
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            // SAFETY: a mapping of ours still in the table; nobody can use it past the drop.
            unsafe { libc::munmap(m.addr as *mut libc::c_void, m.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fb-files-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn keeps_the_pmo_rules() {
        let dir = temp("rules");
        let b = FileBackend::new(&dir).unwrap();
        b.create("a", 8192).unwrap();
        assert_eq!(
            b.create("a", 8192).unwrap_err().raw_os_error(),
            Some(libc::EEXIST)
        );
        assert_eq!(
            b.create("b", 100).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            b.create(".b", 4096).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            b.create("a/b", 4096).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            b.destroy("nope").unwrap_err().raw_os_error(),
            Some(libc::ENOENT)
        );
        let w = b.attach("a", true).unwrap();
        assert_eq!(w.len, 8192);
        assert_eq!(
            b.attach("a", false).unwrap_err().raw_os_error(),
            Some(libc::EBUSY)
        );
        assert_eq!(
            b.destroy("a").unwrap_err().raw_os_error(),
            Some(libc::EBUSY)
        );
        // SAFETY: w is a live writable mapping of 8192 bytes.
        unsafe { w.addr.as_ptr().copy_from(b"hello".as_ptr(), 5) };
        // SAFETY: an address inside the attachment.
        b.sync(unsafe { w.addr.add(100) }).unwrap();
        b.detach(w.addr).unwrap();
        let r1 = b.attach("a", false).unwrap();
        let r2 = b.attach("a", false).unwrap();
        // SAFETY: r1 is a live readable mapping of 8192 bytes.
        let head = unsafe { std::slice::from_raw_parts(r1.addr.as_ptr(), 5) };
        assert_eq!(head, b"hello");
        assert_eq!(
            b.attach("a", true).unwrap_err().raw_os_error(),
            Some(libc::EBUSY)
        );
        b.detach(r1.addr).unwrap();
        b.detach(r2.addr).unwrap();
        assert_eq!(
            b.detach(r2.addr).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        b.destroy("a").unwrap();
        assert_eq!(
            b.attach("a", false).unwrap_err().raw_os_error(),
            Some(libc::ENOENT)
        );
        assert!(b.names().unwrap().is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
