//! The expander's persistent media: a host file holding a checksummed header
//! block and then the DPA bytes, block `b` at file offset `4096 + b * 4096`.
//! The file is created sparse, so a large device costs only what was written.
//!
//! The header carries the shutdown state of CXL's GPF: a "running" flag set
//! durably at open and cleared durably by a clean shutdown, and the Dirty
//! Shutdown Count, incremented (durably) at open when the flag is still set,
//! i.e. when the previous run ended without flushing.
//!
//! Every block read (a cache fill) and block write (a write-back) is charged
//! the configured media latency, standing for NAND behind the device cache:
//! waits up to [`pmo_media::SPIN_LIMIT`] are spun (a sleep cannot wake that precisely);
//! longer ones sleep with the thread's timer slack tightened to 1 µs and
//! spin the last stretch.

use locked::Locked;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::cache::BLOCK;

/// Bytes before DPA 0 in the file.
pub const HEADER_LEN: u64 = 4096;
/// Identifies a pmovmm CXL media file.
pub const MAGIC: [u8; 8] = *b"PMOCXLM\x01";
/// Header layout version.
pub const VERSION: u32 = 1;
use pmo_media::charge;

const FLAG_RUNNING: u32 = 1;
/// Header bytes covered by the checksum (the checksum follows them).
const SUMMED: usize = 32;

/// Errors of the media file.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// A host file operation (open, lock, stat, size, read, write, sync)
    /// failed.
    #[error("{what}: {source}")]
    Io {
        /// The operation that failed, for the message.
        what: &'static str,
        /// What the host reported.
        source: io::Error,
    },
    /// The requested device size is zero, not a multiple of 4 KiB, or too
    /// large to add the header to.
    #[error("media size {0:#x} is not a non-zero multiple of 4 KiB")]
    BadSize(u64),
    /// The file's header does not start with [`MAGIC`].
    #[error("not a CXL media file (bad magic)")]
    Foreign,
    /// The header's checksum does not match its contents.
    #[error("media header checksum mismatch (corrupt header)")]
    Corrupt,
    /// The header has a layout version other than [`VERSION`].
    #[error("media header version {0} is not supported")]
    Version(u32),
    /// The file was made for a device of another size.
    #[error("media file is for a {file:#x}-byte device, not {want:#x}")]
    SizeMismatch {
        /// Device size recorded in the header.
        file: u64,
        /// Device size asked for at open.
        want: u64,
    },
    /// The file is shorter than a header, or than the header plus the
    /// device size it records.
    #[error("media file is {len} bytes, shorter than its header says")]
    Truncated {
        /// The file's length in bytes.
        len: u64,
    },
    /// Another process (or another open in this one) holds the file's
    /// exclusive lock.
    #[error("media file is in use by another owner")]
    InUse,
    /// A block index past the last block of the device.
    #[error("block {0} is beyond the media end")]
    OutOfRange(u64),
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> MediaError {
    move |source| MediaError::Io { what, source }
}

/// The shutdown state kept in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    size: u64,
    running: bool,
    dirty_shutdowns: u32,
}

impl Header {
    fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        let flags = if self.running { FLAG_RUNNING } else { 0 };
        b[12..16].copy_from_slice(&flags.to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..28].copy_from_slice(&self.dirty_shutdowns.to_le_bytes());
        let sum = fnv1a(&b[..SUMMED]);
        b[SUMMED..SUMMED + 8].copy_from_slice(&sum.to_le_bytes());
        b
    }

    fn decode(b: &[u8; 64]) -> Result<Self, MediaError> {
        if b[..8] != MAGIC {
            return Err(MediaError::Foreign);
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        if u64_at(SUMMED) != fnv1a(&b[..SUMMED]) {
            return Err(MediaError::Corrupt);
        }
        let version = u32_at(8);
        if version != VERSION {
            return Err(MediaError::Version(version));
        }
        Ok(Header {
            size: u64_at(16),
            running: u32_at(12) & FLAG_RUNNING != 0,
            dirty_shutdowns: u32_at(24),
        })
    }
}

/// FNV-1a, 64-bit: catches torn or scribbled headers (not an adversary).
fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What opening found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenReport {
    /// The file was created by this open.
    pub created: bool,
    /// The previous run ended without a clean shutdown.
    pub dirty: bool,
}

/// An open media file, exclusively locked.
pub struct Media {
    file: File,
    size: u64,
    latency: Duration,
    /// Block transfers charged the latency so far (fills and write-backs).
    transfers: std::sync::atomic::AtomicU64,
    header: Mutex<Header>,
}

impl std::fmt::Debug for Media {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Media")
            .field("size", &self.size)
            .field("latency", &self.latency)
            .finish()
    }
}

impl Media {
    /// The device size recorded in `path`'s header if the file is CXL media (starts with
    /// [`MAGIC`]), `None` if it is something else (or empty); a media header that is corrupt
    /// or of another version is an error. Reads without locking, for tools that must tell
    /// media from other files before they open it.
    pub fn probe(path: &Path) -> Result<Option<u64>, MediaError> {
        let file = std::fs::File::open(path).map_err(io_err("open media file"))?;
        let mut raw = [0u8; 64];
        match file.read_exact_at(&mut raw, 0) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(io_err("read media header")(e)),
        }
        match Header::decode(&raw) {
            Ok(h) => Ok(Some(h.size)),
            Err(MediaError::Foreign) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens (or creates, sparse) the media file for a device of `size`
    /// bytes, refuses a foreign, corrupt or differently sized one, and marks
    /// the run as started; a run that was still marked counts one more
    /// dirty shutdown.
    pub fn open(
        path: &Path,
        size: u64,
        latency: Duration,
    ) -> Result<(Media, OpenReport), MediaError> {
        if size == 0 || !size.is_multiple_of(BLOCK) {
            return Err(MediaError::BadSize(size));
        }
        let want_len = size
            .checked_add(HEADER_LEN)
            .ok_or(MediaError::BadSize(size))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io_err("open media file"))?;
        // SAFETY: plain syscall on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                MediaError::InUse
            } else {
                MediaError::Io {
                    what: "lock media file",
                    source: e,
                }
            });
        }
        let len = file.metadata().map_err(io_err("stat media file"))?.len();
        let created = len == 0;
        let mut header = if created {
            file.set_len(want_len).map_err(io_err("size media file"))?;
            sync_parent(path)?;
            Header {
                size,
                running: false,
                dirty_shutdowns: 0,
            }
        } else {
            let mut raw = [0u8; 64];
            if len < HEADER_LEN {
                return Err(MediaError::Truncated { len });
            }
            file.read_exact_at(&mut raw, 0)
                .map_err(io_err("read media header"))?;
            let h = Header::decode(&raw)?;
            if h.size != size {
                return Err(MediaError::SizeMismatch {
                    file: h.size,
                    want: size,
                });
            }
            if len < want_len {
                return Err(MediaError::Truncated { len });
            }
            h
        };
        let dirty = header.running;
        if dirty {
            header.dirty_shutdowns = header.dirty_shutdowns.saturating_add(1);
        }
        header.running = true;
        let media = Media {
            file,
            size,
            latency,
            transfers: std::sync::atomic::AtomicU64::new(0),
            header: Mutex::new(header),
        };
        media.write_header(&header)?;
        Ok((media, OpenReport { created, dirty }))
    }

    fn write_header(&self, h: &Header) -> Result<(), MediaError> {
        self.file
            .write_all_at(&h.encode(), 0)
            .map_err(io_err("write media header"))?;
        self.sync()
    }

    /// DPA bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Latency charged per block transfer.
    pub fn latency(&self) -> Duration {
        self.latency
    }

    /// Block transfers (fills and write-backs) charged the latency so far:
    /// the media time the device has modelled is `transfers() * latency()`.
    pub fn transfers(&self) -> u64 {
        self.transfers.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn charge(&self, start: Instant) {
        self.transfers
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        charge(start, self.latency);
    }

    /// Dirty shutdowns recorded so far (including the one found at this open).
    pub fn dirty_shutdown_count(&self) -> u32 {
        self.header.locked().dirty_shutdowns
    }

    fn offset(&self, block: u64) -> Result<u64, MediaError> {
        if block >= self.size / BLOCK {
            return Err(MediaError::OutOfRange(block));
        }
        Ok(HEADER_LEN + block * BLOCK)
    }

    /// Reads block `block` (a fill), charged the media latency.
    pub fn read_block(&self, block: u64, out: &mut [u8; BLOCK as usize]) -> Result<(), MediaError> {
        let off = self.offset(block)?;
        let start = Instant::now();
        self.file
            .read_exact_at(out, off)
            .map_err(io_err("read media block"))?;
        self.charge(start);
        Ok(())
    }

    /// Writes block `block` (a write-back), charged the media latency. Not
    /// durable until [`Media::sync`].
    pub fn write_block(&self, block: u64, data: &[u8; BLOCK as usize]) -> Result<(), MediaError> {
        let off = self.offset(block)?;
        let start = Instant::now();
        self.file
            .write_all_at(data, off)
            .map_err(io_err("write media block"))?;
        self.charge(start);
        Ok(())
    }

    /// Makes every earlier block write durable.
    pub fn sync(&self) -> Result<(), MediaError> {
        self.file.sync_data().map_err(io_err("fdatasync media"))
    }

    /// Records a clean shutdown durably (the caller flushed first).
    pub fn mark_clean(&self) -> Result<(), MediaError> {
        let mut h = self.header.locked();
        if !h.running {
            return Ok(());
        }
        let mut next = *h;
        next.running = false;
        self.write_header(&next)?;
        *h = next;
        Ok(())
    }

    /// Marks the run as started again (writes after a clean shutdown), durably.
    pub fn mark_running(&self) -> Result<(), MediaError> {
        let mut h = self.header.locked();
        if h.running {
            return Ok(());
        }
        let mut next = *h;
        next.running = true;
        self.write_header(&next)?;
        *h = next;
        Ok(())
    }
}

/// Makes a new file's directory entry durable.
fn sync_parent(path: &Path) -> Result<(), MediaError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("sync media directory"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("cxl-media-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&d);
        d
    }

    #[test]
    fn created_sparse_and_blocks_round_trip() {
        let p = tmp("rt");
        let (m, r) = Media::open(&p, 1 << 30, Duration::ZERO).unwrap();
        assert_eq!(
            r,
            OpenReport {
                created: true,
                dirty: false
            }
        );
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(meta.len(), HEADER_LEN + (1 << 30));
        use std::os::unix::fs::MetadataExt;
        assert!(meta.blocks() * 512 < 1 << 20, "file is sparse");
        let mut b = [0u8; 4096];
        m.read_block(5, &mut b).unwrap();
        assert_eq!(b, [0u8; 4096]);
        b.fill(0x42);
        m.write_block(5, &b).unwrap();
        let mut c = [0u8; 4096];
        m.read_block(5, &mut c).unwrap();
        assert_eq!(c, b);
        let raw = std::fs::read(&p).unwrap();
        assert_eq!(raw[(HEADER_LEN + 5 * 4096) as usize], 0x42);
        assert!(matches!(
            m.read_block(1 << 18, &mut c),
            Err(MediaError::OutOfRange(_))
        ));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn probe_tells_media_from_other_files() {
        let p = tmp("probe");
        std::fs::write(&p, b"").unwrap();
        assert_eq!(Media::probe(&p).unwrap(), None, "empty");
        std::fs::write(&p, vec![7u8; 8192]).unwrap();
        assert_eq!(Media::probe(&p).unwrap(), None, "foreign");
        std::fs::remove_file(&p).unwrap();
        drop(Media::open(&p, 1 << 20, Duration::ZERO).unwrap());
        assert_eq!(Media::probe(&p).unwrap(), Some(1 << 20));
        let mut raw = std::fs::read(&p).unwrap();
        raw[17] ^= 1;
        std::fs::write(&p, &raw).unwrap();
        assert!(matches!(Media::probe(&p), Err(MediaError::Corrupt)));
        let _ = std::fs::remove_file(&p);
        assert!(matches!(Media::probe(&p), Err(MediaError::Io { .. })));
    }

    #[test]
    fn dirty_shutdowns_are_counted_and_clean_ones_not() {
        let p = tmp("dsc");
        let (m, _) = Media::open(&p, 1 << 20, Duration::ZERO).unwrap();
        assert_eq!(m.dirty_shutdown_count(), 0);
        drop(m); // no mark_clean: a dirty shutdown
        let (m, r) = Media::open(&p, 1 << 20, Duration::ZERO).unwrap();
        assert!(r.dirty);
        assert_eq!(m.dirty_shutdown_count(), 1);
        m.mark_clean().unwrap();
        drop(m);
        let (m, r) = Media::open(&p, 1 << 20, Duration::ZERO).unwrap();
        assert!(!r.dirty);
        assert_eq!(m.dirty_shutdown_count(), 1);
        drop(m);
        let (m, _) = Media::open(&p, 1 << 20, Duration::ZERO).unwrap();
        assert_eq!(m.dirty_shutdown_count(), 2);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn foreign_corrupt_and_mismatched_files_are_refused() {
        let p = tmp("bad");
        std::fs::write(&p, vec![7u8; 8192]).unwrap();
        assert!(matches!(
            Media::open(&p, 4096, Duration::ZERO),
            Err(MediaError::Foreign)
        ));
        std::fs::write(&p, b"short").unwrap();
        assert!(matches!(
            Media::open(&p, 4096, Duration::ZERO),
            Err(MediaError::Truncated { len: 5 })
        ));
        let _ = std::fs::remove_file(&p);
        drop(Media::open(&p, 1 << 20, Duration::ZERO).unwrap());
        assert!(matches!(
            Media::open(&p, 2 << 20, Duration::ZERO),
            Err(MediaError::SizeMismatch {
                file: 0x10_0000,
                want: 0x20_0000
            })
        ));
        // One flipped bit in the count breaks the checksum.
        let mut raw = std::fs::read(&p).unwrap();
        raw[24] ^= 1;
        std::fs::write(&p, &raw).unwrap();
        assert!(matches!(
            Media::open(&p, 1 << 20, Duration::ZERO),
            Err(MediaError::Corrupt)
        ));
        assert!(matches!(
            Media::open(&p, 1000, Duration::ZERO),
            Err(MediaError::BadSize(1000))
        ));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_second_owner_is_refused() {
        let p = tmp("lock");
        let (_m, _) = Media::open(&p, 1 << 20, Duration::ZERO).unwrap();
        assert!(matches!(
            Media::open(&p, 1 << 20, Duration::ZERO),
            Err(MediaError::InUse)
        ));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn latency_is_charged_per_transfer() {
        let p = tmp("lat");
        let (m, _) = Media::open(&p, 1 << 20, Duration::from_micros(300)).unwrap();
        let mut b = [0u8; 4096];
        for i in 0..10 {
            m.read_block(i, &mut b).unwrap();
            m.write_block(i, &b).unwrap();
        }
        // Every fill and write-back is one charged transfer; header writes are not.
        assert_eq!(m.transfers(), 20);
        m.mark_clean().unwrap();
        assert_eq!(m.transfers(), 20);
        assert_eq!(m.latency(), Duration::from_micros(300));
        let _ = std::fs::remove_file(&p);
    }
}
