//! [`Env`]: an LMDB environment on a directory, its data file either an ordinary file (stock
//! LMDB) or a PMO of a [`PmoBackend`].

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use libc::c_int;
use locked::Locked;

use crate::error::{check, from_rc, Error};
use crate::ffi;
use crate::pmo::{Bridge, PmoBackend};
use crate::txn::{RoTxn, RwTxn};

/// Mode of the files LMDB creates (data and lock file).
const FILE_MODE: libc::mode_t = 0o644;

/// Options of an environment; [`Env::builder`] makes one.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct EnvBuilder {
    map_size: Option<usize>,
    max_readers: Option<u32>,
}

impl EnvBuilder {
    /// The map size in bytes: the most the database can grow to (LMDB's default: 1 MiB). For a
    /// PMO it is the size the object is created with; an existing object keeps its own size.
    pub fn map_size(mut self, bytes: usize) -> Self {
        self.map_size = Some(bytes);
        self
    }

    /// The most read transactions at once (LMDB's default: 126).
    pub fn max_readers(mut self, n: u32) -> Self {
        self.max_readers = Some(n);
        self
    }

    /// Stock LMDB on `dir` (created if missing): data and lock file in it, durable commits
    /// (`fdatasync` / synchronous meta writes), no flags. The unencrypted baseline.
    pub fn open_dir(self, dir: &Path) -> Result<Env, Error> {
        self.open(dir, None)
    }

    /// LMDB on `dir` (created if missing) whose data file is a PMO of `backend`: attached at
    /// open, synced at every commit, detached at close. The lock file stays an ordinary file
    /// in `dir`. The directory's canonical path names the data file, so every spelling of it
    /// opens the same object.
    pub fn open_pmo(self, dir: &Path, backend: Arc<dyn PmoBackend>) -> Result<Env, Error> {
        self.open(dir, Some(Bridge::new(backend)))
    }

    fn open(self, dir: &Path, bridge: Option<Box<Bridge>>) -> Result<Env, Error> {
        let dir_err = |source| Error::Dir {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(dir_err)?;
        let dir = std::fs::canonicalize(dir).map_err(dir_err)?;
        let path =
            CString::new(dir.as_os_str().as_bytes()).map_err(|_| Error::NulInPath(dir.clone()))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: mdb_env_create writes a new handle (or nothing) into our local.
        check(unsafe { ffi::mdb_env_create(&mut raw) })?;
        // From here on the handle is owned by `env`: every early return closes it.
        let mut env = Env {
            raw,
            dbi: 0,
            writer: Mutex::new(None),
            bridge,
        };
        if let Some(n) = self.map_size {
            // SAFETY: a live handle, not opened yet.
            check(unsafe { ffi::mdb_env_set_mapsize(env.raw, n) })?;
        }
        if let Some(n) = self.max_readers {
            // SAFETY: a live handle, not opened yet.
            check(unsafe { ffi::mdb_env_set_maxreaders(env.raw, n) })?;
        }
        if let Some(b) = &env.bridge {
            let ops = b.ops();
            // SAFETY: a live handle, not opened yet; LMDB copies the table. Its context is the
            // boxed bridge, which `env` keeps until after mdb_env_close (see `Drop`).
            check(unsafe { ffi::mdb_env_set_pmo(env.raw, &ops) })?;
        }
        // SAFETY: a live handle; the path is NUL-terminated and outlives the call.
        let rc = unsafe { ffi::mdb_env_open(env.raw, path.as_ptr(), 0, FILE_MODE) };
        if rc != 0 {
            return Err(env.error(rc));
        }
        env.dbi = env.open_main_db()?;
        Ok(env)
    }
}

/// An open LMDB environment with its main database. `Send + Sync`: transactions are begun on
/// any thread; each transaction stays on the thread that began it.
pub struct Env {
    raw: *mut ffi::MDB_env,
    dbi: ffi::MDB_dbi,
    /// The thread holding this environment's write transaction, if any (a second one on the
    /// same thread would deadlock in LMDB).
    writer: Mutex<Option<ThreadId>>,
    /// The PMO bridge; dropped after `mdb_env_close` (fields drop after `Drop::drop`).
    bridge: Option<Box<Bridge>>,
}

// SAFETY: an LMDB environment handle may be used from any thread (LMDB's documented model:
// transactions are per thread, the environment is shared); the bridge is Send + Sync.
unsafe impl Send for Env {}
// SAFETY: as above; every `&self` method is an LMDB call documented thread-safe on an open
// environment, or takes `writer`'s lock.
unsafe impl Sync for Env {}

/// Statistics of the main database (`mdb_env_stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Page size in bytes.
    pub page_size: u32,
    /// Height of the B-tree.
    pub depth: u32,
    /// Branch (interior) pages.
    pub branch_pages: usize,
    /// Leaf pages.
    pub leaf_pages: usize,
    /// Overflow pages (values larger than a page).
    pub overflow_pages: usize,
    /// Key/value pairs.
    pub entries: usize,
}

/// Information about the environment (`mdb_env_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Info {
    /// Size of the map in bytes (for a PMO: the object's size).
    pub map_size: usize,
    /// Number of the last page in use.
    pub last_page: usize,
    /// Id of the last committed transaction.
    pub last_txn: usize,
    /// Reader slots.
    pub max_readers: u32,
    /// Reader slots ever used.
    pub num_readers: u32,
}

impl Env {
    /// Options for a new environment.
    pub fn builder() -> EnvBuilder {
        EnvBuilder::default()
    }

    /// Begins a read transaction: a snapshot as of the last commit. One per thread at a time.
    pub fn read_txn(&self) -> Result<RoTxn<'_>, Error> {
        let raw = self.begin(ffi::MDB_RDONLY)?;
        Ok(RoTxn::new(self, raw))
    }

    /// Begins the write transaction, waiting while another thread holds it.
    pub fn write_txn(&self) -> Result<RwTxn<'_>, Error> {
        let me = std::thread::current().id();
        if *self.writer.locked() == Some(me) {
            return Err(Error::NestedWrite);
        }
        let raw = self.begin(0)?;
        *self.writer.locked() = Some(me);
        Ok(RwTxn::new(self, raw))
    }

    /// Statistics of the main database as of the last commit.
    pub fn stat(&self) -> Result<Stat, Error> {
        let mut s = ffi::MDB_stat::default();
        // SAFETY: an open environment; LMDB fills our local.
        check(unsafe { ffi::mdb_env_stat(self.raw, &mut s) })?;
        Ok(Stat {
            page_size: s.ms_psize,
            depth: s.ms_depth,
            branch_pages: s.ms_branch_pages,
            leaf_pages: s.ms_leaf_pages,
            overflow_pages: s.ms_overflow_pages,
            entries: s.ms_entries,
        })
    }

    /// Map size, last page, last transaction and reader slots.
    pub fn info(&self) -> Result<Info, Error> {
        let mut i = ffi::MDB_envinfo {
            me_mapaddr: std::ptr::null_mut(),
            me_mapsize: 0,
            me_last_pgno: 0,
            me_last_txnid: 0,
            me_maxreaders: 0,
            me_numreaders: 0,
        };
        // SAFETY: an open environment; LMDB fills our local.
        check(unsafe { ffi::mdb_env_info(self.raw, &mut i) })?;
        Ok(Info {
            map_size: i.me_mapsize,
            last_page: i.me_last_pgno,
            last_txn: i.me_last_txnid,
            max_readers: i.me_maxreaders,
            num_readers: i.me_numreaders,
        })
    }

    fn begin(&self, flags: libc::c_uint) -> Result<*mut ffi::MDB_txn, Error> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: an open environment; the new transaction is written into our local.
        let rc = unsafe { ffi::mdb_txn_begin(self.raw, std::ptr::null_mut(), flags, &mut raw) };
        if rc != 0 {
            return Err(self.error(rc));
        }
        Ok(raw)
    }

    /// The main (unnamed) database's handle, opened in a read transaction that is committed
    /// so the handle stays valid for the environment's life.
    fn open_main_db(&self) -> Result<ffi::MDB_dbi, Error> {
        let mut txn = std::ptr::null_mut();
        // SAFETY: an open environment; the new transaction is written into our local.
        let rc = unsafe {
            ffi::mdb_txn_begin(self.raw, std::ptr::null_mut(), ffi::MDB_RDONLY, &mut txn)
        };
        if rc != 0 {
            return Err(self.error(rc));
        }
        let mut dbi = 0;
        // SAFETY: a live read transaction; a null name is the main database.
        let rc = unsafe { ffi::mdb_dbi_open(txn, std::ptr::null(), 0, &mut dbi) };
        if rc != 0 {
            // SAFETY: the live transaction, ended once.
            unsafe { ffi::mdb_txn_abort(txn) };
            return Err(self.error(rc));
        }
        // SAFETY: the live transaction, ended once (commit frees it even when it fails).
        let rc = unsafe { ffi::mdb_txn_commit(txn) };
        if rc != 0 {
            return Err(self.error(rc));
        }
        Ok(dbi)
    }

    pub(crate) fn dbi(&self) -> ffi::MDB_dbi {
        self.dbi
    }

    /// The write transaction of this thread ended.
    pub(crate) fn writer_done(&self) {
        *self.writer.locked() = None;
    }

    /// The error of return code `rc`: the backend's own error when it caused it.
    pub(crate) fn error(&self, rc: c_int) -> Error {
        if rc > 0 {
            if let Some(e) = self.bridge.as_ref().and_then(|b| b.take_error(rc)) {
                return Error::Backend(e);
            }
        }
        from_rc(rc)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // SAFETY: the handle is live and no transaction is (each borrows the Env); closed once.
        // For a PMO, LMDB detaches through the bridge, which is still alive here.
        unsafe { ffi::mdb_env_close(self.raw) };
    }
}
