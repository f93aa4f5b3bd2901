//! virtio-pmem: a host file mapped straight into the guest as persistent memory.
//!
//! The guest's `virtio_pmem` driver sees the region announced in the config
//! space (`start`, `size`) as an NVDIMM region (`/dev/pmem0`); loads and stores
//! go to the host page cache of the file without exits. The only request is
//! FLUSH, which we answer after `fdatasync` so the data is durable on the host.
//! It is the unencrypted baseline the PMO designs are compared against.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use virtio_queue::Queue;
use vm_memory::{GuestMemoryMmap, Le32};
use zerocopy::{Immutable, IntoBytes};

use crate::worker::{QueueHandler, QueueWorker};
use crate::{
    drain_queue, read_config_bytes, ActivateContext, ActivateError, DeviceMemory, VirtioDevice,
    VirtioInterrupt, VIRTIO_F_VERSION_1,
};

/// Virtio device type of pmem.
pub const VIRTIO_ID_PMEM: u32 = 27;
const QUEUE_SIZE: u16 = 256;
const REQ_TYPE_FLUSH: u32 = 0;
const RESP_OK: u32 = 0;
const RESP_EIO: u32 = 1;
/// The region must be a whole number of 2 MiB pages: the guest maps it with huge pages.
pub const PMEM_ALIGN: u64 = 2 << 20;

/// Errors opening a pmem backing file.
#[derive(Debug, thiserror::Error)]
pub enum PmemError {
    /// The backing file could not be opened.
    #[error("pmem file {path}: {source}")]
    Open {
        /// The backing file.
        path: PathBuf,
        /// Why it failed.
        source: io::Error,
    },
    /// The guest maps the region with 2 MiB pages, so its size must be a multiple of that.
    #[error("pmem file {path}: size {size} is not a non-zero multiple of 2 MiB")]
    BadSize {
        /// The backing file.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
    },
    /// The backing file could not be mapped.
    #[error("pmem file {path}: mmap: {source}")]
    Mmap {
        /// The backing file.
        path: PathBuf,
        /// Why it failed.
        source: io::Error,
    },
}

/// RAII shared mapping of a whole file.
struct FileMapping {
    addr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; the raw pointer is only an address
// and every access goes through the guest (KVM) or through `Drop`.
unsafe impl Send for FileMapping {}
// SAFETY: as above; we never create Rust references into the mapping.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    fn new(file: &File, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of `len` bytes of a file we opened
        // read-write; the kernel picks the address, so no existing memory is touched.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(FileMapping { addr, len })
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: `addr`/`len` describe exactly the mapping created in `new`.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

/// The config space layout of virtio-pmem (virtio spec 5.19.4): little-endian fields, native
/// integers (x86-64 host), no padding (the derives prove it).
#[derive(Clone, Copy, Default, IntoBytes, Immutable)]
#[repr(C, packed)]
struct PmemConfig {
    start: u64,
    size: u64,
}
const _: () = assert!(cfg!(target_endian = "little"));

/// A virtio-pmem device backed by a host file.
pub struct Pmem {
    file: Arc<File>,
    mapping: FileMapping,
    config: PmemConfig,
    acked_features: u64,
    worker: Option<QueueWorker>,
}

impl Pmem {
    /// Opens (or creates with `size`) the backing file and maps it.
    ///
    /// An existing file keeps its data; if `size` is given and differs, the
    /// file is grown or shrunk to it (the user asked for that size).
    pub fn open(path: &Path, size: Option<u64>) -> Result<Self, PmemError> {
        let open_err = |source| PmemError::Open {
            path: path.to_owned(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(size.is_some())
            .truncate(false)
            .open(path)
            .map_err(open_err)?;
        let len = match size {
            Some(s) => {
                if file.metadata().map_err(open_err)?.len() != s {
                    file.set_len(s).map_err(open_err)?;
                }
                s
            }
            None => file.metadata().map_err(open_err)?.len(),
        };
        if len == 0 || len % PMEM_ALIGN != 0 {
            return Err(PmemError::BadSize {
                path: path.to_owned(),
                size: len,
            });
        }
        let map_len = usize::try_from(len).map_err(|_| PmemError::BadSize {
            path: path.to_owned(),
            size: len,
        })?;
        let mapping = FileMapping::new(&file, map_len).map_err(|source| PmemError::Mmap {
            path: path.to_owned(),
            source,
        })?;
        Ok(Pmem {
            file: Arc::new(file),
            mapping,
            config: PmemConfig {
                start: 0,
                size: len,
            },
            acked_features: 0,
            worker: None,
        })
    }

    /// Size of the region in bytes.
    pub fn size(&self) -> u64 {
        self.config.size
    }

    /// Tells the device where the VMM mapped its region in guest physical memory.
    pub fn set_guest_address(&mut self, gpa: u64) {
        self.config.start = gpa;
    }

    /// The backing file, for the VMM to make it durable at shutdown after the
    /// device itself has moved into its transport.
    pub fn file(&self) -> Arc<File> {
        self.file.clone()
    }
}

impl VirtioDevice for Pmem {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_PMEM
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn ack_features(&mut self, features: u64) {
        self.acked_features = features & self.features();
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(self.config.as_bytes(), offset, data);
    }

    fn write_config(&mut self, offset: u64, _data: &[u8]) {
        log::warn!("virtio-pmem: guest wrote read-only config at {offset:#x}");
    }

    fn activate(&mut self, mut ctx: ActivateContext) -> Result<(), ActivateError> {
        if ctx.queues.len() != 1 {
            return Err(ActivateError::QueueCount {
                expected: 1,
                got: ctx.queues.len(),
            });
        }
        let q = ctx.queues.remove(0);
        let handler = FlushHandler {
            mem: ctx.mem,
            queue: q.queue,
            interrupt: ctx.interrupt,
            file: self.file.clone(),
        };
        self.worker = Some(QueueWorker::spawn(
            threads::ThreadKind::PmemQueue,
            "virtio-pmem",
            vec![(q.index, q.notify)],
            handler,
        )?);
        Ok(())
    }

    fn reset(&mut self) {
        self.worker = None;
    }

    fn device_memory(&self) -> Vec<DeviceMemory> {
        vec![DeviceMemory {
            host_addr: self.mapping.addr as u64,
            len: self.mapping.len as u64,
            runtime_len: 0,
        }]
    }
}

struct FlushHandler {
    mem: GuestMemoryMmap,
    queue: Queue,
    interrupt: Arc<dyn VirtioInterrupt>,
    file: Arc<File>,
}

/// Serves one request; returns the number of bytes written to the guest.
/// Public (hidden) so the descriptor-chain fuzz target drives exactly what
/// the request queue runs.
#[doc(hidden)]
pub fn serve_flush(file: &File, chain: virtio_queue::DescriptorChain<&GuestMemoryMmap>) -> u32 {
    let mem = chain.memory();
    let (Ok(mut reader), Ok(mut writer)) = (chain.clone().reader(mem), chain.clone().writer(mem))
    else {
        log::warn!("virtio-pmem: malformed descriptor chain");
        return 0;
    };
    let status = match reader.read_obj::<Le32>() {
        Ok(t) if t.to_native() == REQ_TYPE_FLUSH => match file.sync_data() {
            Ok(()) => RESP_OK,
            Err(e) => {
                log::error!("virtio-pmem: fdatasync: {e}");
                RESP_EIO
            }
        },
        Ok(t) => {
            log::warn!("virtio-pmem: unknown request type {}", t.to_native());
            RESP_EIO
        }
        Err(_) => {
            log::warn!("virtio-pmem: request too short");
            RESP_EIO
        }
    };
    match writer.write_obj(Le32::from(status)) {
        Ok(()) => 4,
        Err(_) => {
            log::warn!("virtio-pmem: no room for the response");
            0
        }
    }
}

impl QueueHandler for FlushHandler {
    fn process_queue(&mut self, index: u16) {
        let file = &self.file;
        if let Err(e) = drain_queue(&mut self.queue, &self.mem, &*self.interrupt, index, |c| {
            serve_flush(file, c)
        }) {
            log::error!("virtio-pmem: request queue: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "pmem-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn creates_file_of_requested_size_and_reports_config() {
        let p = tmpdir().join("a.img");
        let _ = std::fs::remove_file(&p);
        let mut dev = Pmem::open(&p, Some(4 << 20)).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 4 << 20);
        dev.set_guest_address(0x20_0000_0000);
        let mut buf = [0u8; 16];
        dev.read_config(0, &mut buf);
        assert_eq!(
            u64::from_le_bytes(buf[..8].try_into().unwrap()),
            0x20_0000_0000
        );
        assert_eq!(u64::from_le_bytes(buf[8..].try_into().unwrap()), 4 << 20);
        assert_eq!(dev.device_memory()[0].len, 4 << 20);
    }

    #[test]
    fn rejects_missing_and_misaligned_files() {
        let d = tmpdir();
        assert!(matches!(
            Pmem::open(&d.join("missing.img"), None),
            Err(PmemError::Open { .. })
        ));
        let p = d.join("odd.img");
        std::fs::write(&p, [0u8; 4096]).unwrap();
        assert!(matches!(
            Pmem::open(&p, None),
            Err(PmemError::BadSize { .. })
        ));
    }

    #[test]
    fn writes_through_the_mapping_reach_the_file() {
        let p = tmpdir().join("b.img");
        let _ = std::fs::remove_file(&p);
        let dev = Pmem::open(&p, Some(2 << 20)).unwrap();
        let region = dev.device_memory()[0];
        // SAFETY: the mapping is 2 MiB long and alive while `dev` lives.
        unsafe { std::ptr::copy_nonoverlapping(b"pmem!".as_ptr(), region.host_addr as *mut u8, 5) };
        dev.file().sync_data().unwrap();
        assert_eq!(&std::fs::read(&p).unwrap()[..5], b"pmem!");
    }
}
