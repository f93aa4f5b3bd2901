//! Transactions on the main database: [`RoTxn`] (a snapshot) and [`RwTxn`] (the one writer).
//! Both stay on the thread that began them; dropping one without commit aborts it.

use std::marker::PhantomData;

use libc::c_void;

use crate::env::Env;
use crate::error::Error;
use crate::ffi;

/// A record of a scan: key and value, borrowed from the transaction.
pub type Record<'a> = (&'a [u8], &'a [u8]);

/// A key or value as LMDB takes it. LMDB never writes through the data pointer of an input.
fn val(b: &[u8]) -> ffi::MDB_val {
    ffi::MDB_val {
        mv_size: b.len(),
        mv_data: b.as_ptr() as *mut c_void,
    }
}

/// The bytes LMDB returned in `v`.
///
/// # Safety
/// `v` was filled by LMDB in a transaction that stays alive (and, for a write transaction,
/// unmodified) for `'a`.
unsafe fn bytes<'a>(v: &ffi::MDB_val) -> &'a [u8] {
    if v.mv_size == 0 || v.mv_data.is_null() {
        return &[];
    }
    // SAFETY: LMDB points `v` at `mv_size` bytes of its map (or a page copy) that stay valid
    // while the transaction lives unmodified (the caller's contract).
    unsafe { std::slice::from_raw_parts(v.mv_data as *const u8, v.mv_size) }
}

/// A cursor, closed on drop.
struct Cursor(*mut ffi::MDB_cursor);

impl Drop for Cursor {
    fn drop(&mut self) {
        // SAFETY: a live cursor of a live transaction (it is dropped inside `scan`), closed once.
        unsafe { ffi::mdb_cursor_close(self.0) };
    }
}

/// `get` on any transaction.
///
/// # Safety
/// `txn` is a live transaction of `env`; the result is valid as `bytes` says.
unsafe fn get<'a>(
    env: &Env,
    txn: *mut ffi::MDB_txn,
    key: &[u8],
) -> Result<Option<&'a [u8]>, Error> {
    let mut k = val(key);
    let mut d = val(&[]);
    // SAFETY: a live transaction (contract); key and data are valid locals.
    let rc = unsafe { ffi::mdb_get(txn, env.dbi(), &mut k, &mut d) };
    match rc {
        // SAFETY: LMDB just filled `d`; the transaction outlives 'a (contract).
        0 => Ok(Some(unsafe { bytes(&d) })),
        ffi::MDB_NOTFOUND => Ok(None),
        rc => Err(env.error(rc)),
    }
}

/// `scan` on any transaction.
///
/// # Safety
/// `txn` is a live transaction of `env`; the results are valid as `bytes` says.
unsafe fn scan<'a>(
    env: &Env,
    txn: *mut ffi::MDB_txn,
    start: &[u8],
    n: usize,
) -> Result<Vec<Record<'a>>, Error> {
    let mut out = Vec::new();
    if n == 0 {
        return Ok(out);
    }
    let mut raw = std::ptr::null_mut();
    // SAFETY: a live transaction (contract); the cursor is written into our local.
    let rc = unsafe { ffi::mdb_cursor_open(txn, env.dbi(), &mut raw) };
    if rc != 0 {
        return Err(env.error(rc));
    }
    let cursor = Cursor(raw);
    let mut k = val(start);
    let mut d = val(&[]);
    // An empty key is not a key LMDB can position at: start at the first one.
    let mut op = if start.is_empty() {
        ffi::MDB_FIRST
    } else {
        ffi::MDB_SET_RANGE
    };
    while out.len() < n {
        // SAFETY: a live cursor; key and data are valid locals.
        let rc = unsafe { ffi::mdb_cursor_get(cursor.0, &mut k, &mut d, op) };
        match rc {
            // SAFETY: LMDB just filled both; the transaction outlives 'a (contract).
            0 => out.push(unsafe { (bytes(&k), bytes(&d)) }),
            ffi::MDB_NOTFOUND => break,
            rc => return Err(env.error(rc)),
        }
        op = ffi::MDB_NEXT;
    }
    Ok(out)
}

/// A read transaction: a consistent snapshot as of its begin. Aborted (its reader slot
/// released) on drop.
pub struct RoTxn<'env> {
    env: &'env Env,
    raw: *mut ffi::MDB_txn,
    /// LMDB ties a read transaction to its thread's reader slot: neither Send nor Sync.
    _thread: PhantomData<*mut ()>,
}

impl<'env> RoTxn<'env> {
    pub(crate) fn new(env: &'env Env, raw: *mut ffi::MDB_txn) -> Self {
        RoTxn {
            env,
            raw,
            _thread: PhantomData,
        }
    }

    /// The value of `key`, or `None`. The bytes live in the map for as long as the transaction.
    pub fn get(&self, key: &[u8]) -> Result<Option<&[u8]>, Error> {
        // SAFETY: our live transaction; the result borrows `self`, which keeps it alive.
        unsafe { get(self.env, self.raw, key) }
    }

    /// Up to `n` records from the first key `>= start` on (from the first key when `start` is
    /// empty), in key order.
    pub fn scan(&self, start: &[u8], n: usize) -> Result<Vec<Record<'_>>, Error> {
        // SAFETY: as in `get`.
        unsafe { scan(self.env, self.raw, start, n) }
    }
}

impl Drop for RoTxn<'_> {
    fn drop(&mut self) {
        // SAFETY: our live transaction (cursors are closed inside `scan`), ended once.
        unsafe { ffi::mdb_txn_abort(self.raw) };
    }
}

/// The write transaction: its changes become visible, and durable, at [`RwTxn::commit`];
/// dropped without it, they are discarded.
pub struct RwTxn<'env> {
    env: &'env Env,
    /// Null once ended.
    raw: *mut ffi::MDB_txn,
    /// LMDB's writer lock belongs to this thread: neither Send nor Sync.
    _thread: PhantomData<*mut ()>,
}

impl<'env> RwTxn<'env> {
    pub(crate) fn new(env: &'env Env, raw: *mut ffi::MDB_txn) -> Self {
        RwTxn {
            env,
            raw,
            _thread: PhantomData,
        }
    }

    /// The value of `key` as this transaction sees it, or `None`. The borrow ends before the
    /// next change (a change may move or overwrite the bytes).
    pub fn get(&self, key: &[u8]) -> Result<Option<&[u8]>, Error> {
        // SAFETY: our live transaction; the result borrows `self`, and every change takes
        // `&mut self`, so it is unmodified while the bytes are borrowed.
        unsafe { get(self.env, self.raw, key) }
    }

    /// As [`RoTxn::scan`], with this transaction's own changes.
    pub fn scan(&self, start: &[u8], n: usize) -> Result<Vec<Record<'_>>, Error> {
        // SAFETY: as in `get`.
        unsafe { scan(self.env, self.raw, start, n) }
    }

    /// Sets `key` to `value` (replacing an old value). A key is 1 to 511 bytes.
    /// [`Error::MapFull`] when there is no room; then the transaction can only be dropped.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        let mut k = val(key);
        let mut d = val(value);
        // SAFETY: our live transaction; key and value are valid for the call and only read.
        let rc = unsafe { ffi::mdb_put(self.raw, self.env.dbi(), &mut k, &mut d, 0) };
        if rc != 0 {
            return Err(self.env.error(rc));
        }
        Ok(())
    }

    /// Deletes `key`; says whether it was there.
    pub fn del(&mut self, key: &[u8]) -> Result<bool, Error> {
        let mut k = val(key);
        // SAFETY: our live transaction; the key is valid for the call; no data: every value.
        let rc = unsafe { ffi::mdb_del(self.raw, self.env.dbi(), &mut k, std::ptr::null_mut()) };
        match rc {
            0 => Ok(true),
            ffi::MDB_NOTFOUND => Ok(false),
            rc => Err(self.env.error(rc)),
        }
    }

    /// Commits: the changes become visible and durable (for a PMO: one or more syncs of the
    /// object) before this returns `Ok`.
    pub fn commit(mut self) -> Result<(), Error> {
        let raw = self.end();
        // SAFETY: our live transaction, ended once: commit frees it even when it fails.
        let rc = unsafe { ffi::mdb_txn_commit(raw) };
        if rc != 0 {
            return Err(self.env.error(rc));
        }
        Ok(())
    }

    /// Discards the changes (what dropping does).
    pub fn abort(self) {}

    /// Takes the handle out (so `drop` does nothing more) and frees the thread's writer mark.
    fn end(&mut self) -> *mut ffi::MDB_txn {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        self.env.writer_done();
        raw
    }
}

impl Drop for RwTxn<'_> {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let raw = self.end();
        // SAFETY: our live transaction, ended once.
        unsafe { ffi::mdb_txn_abort(raw) };
    }
}
