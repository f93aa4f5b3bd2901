//! The label storage area: a small persistent byte array in a host file
//! where the guest's nvdimm core keeps its namespace labels, so a region's
//! namespaces are found again after the VMM restarts.
//!
//! The mailbox reaches it through [`LabelArea`], so a test can stand in an
//! area that holds a command at a chosen point and a fuzz target can run on
//! [`MemLsa`] without files.

use locked::Locked;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Size of a new LSA, as QEMU and most devices use.
pub const DEFAULT_LSA_SIZE: u64 = 128 << 10;
/// Largest LSA we accept from a file (the IDENTIFY field is 32 bits, but
/// anything past a few MiB is a mistake).
pub const MAX_LSA_SIZE: u64 = 16 << 20;

/// Errors opening or accessing the LSA.
#[derive(Debug, thiserror::Error)]
pub enum LsaError {
    /// The host file could not be opened, sized, read or written.
    #[error("LSA {path}: {source}")]
    Io {
        /// The LSA file.
        path: PathBuf,
        /// What the host reported.
        source: std::io::Error,
    },
    /// An existing LSA file is larger than [`MAX_LSA_SIZE`].
    #[error("LSA {0}: size must be between 1 byte and 16 MiB")]
    Size(PathBuf),
    /// A read or write reaches past the end of the area (the mailbox
    /// answers Invalid Input).
    #[error("LSA access {offset:#x}+{len:#x} is outside its {size:#x} bytes")]
    Bounds {
        /// First byte of the access.
        offset: u64,
        /// Bytes accessed.
        len: u64,
        /// Size of the area.
        size: u64,
    },
}

/// What the mailbox's label commands need from a label storage area.
/// Accesses may block on the host's disk: the mailbox calls them from its
/// worker thread, never from a vCPU.
pub trait LabelArea: Send {
    /// Size in bytes (IDENTIFY reports it).
    fn size(&self) -> u64;
    /// Reads `len` bytes at `offset`; [`LsaError::Bounds`] outside the area.
    fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, LsaError>;
    /// Writes `data` at `offset`; durable once [`LabelArea::sync`] returns.
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), LsaError>;
    /// Makes every write so far durable.
    fn sync(&self) -> Result<(), LsaError>;
}

fn check_bounds(size: u64, offset: u64, len: u64) -> Result<(), LsaError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(LsaError::Bounds { offset, len, size }),
    }
}

/// A label area in memory: for tests and fuzz targets. Clones share the
/// bytes, so a test can look at what the guest wrote.
#[derive(Clone, Debug)]
pub struct MemLsa {
    bytes: Arc<Mutex<Vec<u8>>>,
}

impl MemLsa {
    /// `size` zero bytes.
    pub fn new(size: usize) -> Self {
        MemLsa {
            bytes: Arc::new(Mutex::new(vec![0; size])),
        }
    }

    /// A copy of the current contents.
    pub fn contents(&self) -> Vec<u8> {
        self.bytes.locked().clone()
    }
}

impl LabelArea for MemLsa {
    fn size(&self) -> u64 {
        self.bytes.locked().len() as u64
    }

    fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, LsaError> {
        let b = self.bytes.locked();
        check_bounds(b.len() as u64, offset, len)?;
        // In bounds of a Vec, so both fit in usize.
        Ok(b[offset as usize..(offset + len) as usize].to_vec())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), LsaError> {
        let mut b = self.bytes.locked();
        check_bounds(b.len() as u64, offset, data.len() as u64)?;
        b[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn sync(&self) -> Result<(), LsaError> {
        Ok(())
    }
}

/// An open label storage area in a host file.
pub struct Lsa {
    file: File,
    path: PathBuf,
    size: u64,
}

impl Lsa {
    /// Opens `path`, creating it with `DEFAULT_LSA_SIZE` zero bytes if it is
    /// missing or empty; an existing file keeps its size.
    pub fn open(path: &Path) -> Result<Lsa, LsaError> {
        let io = |source| LsaError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        let mut size = file.metadata().map_err(io)?.len();
        if size == 0 {
            file.set_len(DEFAULT_LSA_SIZE).map_err(io)?;
            size = DEFAULT_LSA_SIZE;
        }
        if size > MAX_LSA_SIZE {
            return Err(LsaError::Size(path.to_path_buf()));
        }
        Ok(Lsa {
            file,
            path: path.to_path_buf(),
            size,
        })
    }

    /// Size of the area in bytes (the file's size when it was opened).
    pub fn size(&self) -> u64 {
        self.size
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), LsaError> {
        check_bounds(self.size, offset, len)
    }

    /// Reads `len` bytes at `offset`.
    pub fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, LsaError> {
        self.check(offset, len)?;
        let mut buf = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|source| LsaError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(buf)
    }

    /// Writes `data` at `offset`; durable once [`Lsa::sync`] returns.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), LsaError> {
        self.check(offset, data.len() as u64)?;
        self.file
            .write_all_at(data, offset)
            .map_err(|source| LsaError::Io {
                path: self.path.clone(),
                source,
            })
    }

    /// Makes every write so far durable on the host.
    pub fn sync(&self) -> Result<(), LsaError> {
        self.file.sync_data().map_err(|source| LsaError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

impl LabelArea for Lsa {
    fn size(&self) -> u64 {
        Lsa::size(self)
    }
    fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, LsaError> {
        Lsa::read(self, offset, len)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), LsaError> {
        Lsa::write(self, offset, data)
    }
    fn sync(&self) -> Result<(), LsaError> {
        Lsa::sync(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cxl-lsa-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&d);
        d
    }

    #[test]
    fn created_persistent_and_bounded() {
        let p = tmp("a");
        let l = Lsa::open(&p).unwrap();
        assert_eq!(l.size(), DEFAULT_LSA_SIZE);
        l.write(100, b"label").unwrap();
        l.sync().unwrap();
        drop(l);
        let l = Lsa::open(&p).unwrap();
        assert_eq!(l.read(100, 5).unwrap(), b"label");
        assert!(matches!(
            l.read(DEFAULT_LSA_SIZE - 1, 2),
            Err(LsaError::Bounds { .. })
        ));
        assert!(matches!(
            l.write(u64::MAX, b"x"),
            Err(LsaError::Bounds { .. })
        ));
        assert!(l.read(DEFAULT_LSA_SIZE, 0).is_ok());
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn oversized_file_is_refused() {
        let p = tmp("b");
        std::fs::File::create(&p)
            .unwrap()
            .set_len(MAX_LSA_SIZE + 1)
            .unwrap();
        assert!(matches!(Lsa::open(&p), Err(LsaError::Size(_))));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn memory_area_is_bounded_like_the_file() {
        let m = MemLsa::new(16);
        m.write(10, b"abcdef").unwrap();
        assert_eq!(m.read(10, 6).unwrap(), b"abcdef");
        assert_eq!(&m.contents()[10..], b"abcdef");
        assert!(matches!(m.read(11, 6), Err(LsaError::Bounds { .. })));
        assert!(matches!(
            m.write(u64::MAX, b"x"),
            Err(LsaError::Bounds { .. })
        ));
        assert!(matches!(
            m.read(u64::MAX, u64::MAX),
            Err(LsaError::Bounds { .. })
        ));
        assert_eq!(LabelArea::size(&m), 16);
    }
}
