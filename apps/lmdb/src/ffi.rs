//! The part of LMDB's C API (`lmdb.h` of 0.9.24 plus our patch's `mdb_env_set_pmo`) that this
//! crate calls, declared by hand. Values and layouts are those of `lmdb.h`; the tests check
//! them through behaviour (a wrong constant or layout fails a round trip, a stat or an info).

#![allow(non_camel_case_types)]

use libc::{c_char, c_int, c_uint, c_void, mode_t};

/// An LMDB environment (opaque).
#[repr(C)]
pub struct MDB_env {
    _opaque: [u8; 0],
}

/// An LMDB transaction (opaque).
#[repr(C)]
pub struct MDB_txn {
    _opaque: [u8; 0],
}

/// An LMDB cursor (opaque).
#[repr(C)]
pub struct MDB_cursor {
    _opaque: [u8; 0],
}

/// A database handle.
pub type MDB_dbi = c_uint;

/// A key or a value: size and address.
#[repr(C)]
pub struct MDB_val {
    pub mv_size: usize,
    pub mv_data: *mut c_void,
}

/// Statistics of a database (`mdb_size_t` is `size_t` in 0.9).
#[repr(C)]
#[derive(Default)]
pub struct MDB_stat {
    pub ms_psize: c_uint,
    pub ms_depth: c_uint,
    pub ms_branch_pages: usize,
    pub ms_leaf_pages: usize,
    pub ms_overflow_pages: usize,
    pub ms_entries: usize,
}

/// Information about an environment.
#[repr(C)]
pub struct MDB_envinfo {
    pub me_mapaddr: *mut c_void,
    pub me_mapsize: usize,
    pub me_last_pgno: usize,
    pub me_last_txnid: usize,
    pub me_maxreaders: c_uint,
    pub me_numreaders: c_uint,
}

/// Our patch: where the data file's memory comes from (see `lmdb.h`).
#[repr(C)]
pub struct MDB_pmo_ops {
    pub attach: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            name: *const c_char,
            size: *mut usize,
            writable: c_int,
        ) -> *mut c_void,
    >,
    pub sync: Option<unsafe extern "C" fn(ctx: *mut c_void, addr: *mut c_void) -> c_int>,
    pub detach: Option<unsafe extern "C" fn(ctx: *mut c_void, addr: *mut c_void) -> c_int>,
    pub ctx: *mut c_void,
}

/// `MDB_cursor_op` (a C enum, passed as `int`).
pub type MDB_cursor_op = c_int;
/// Position at the first key.
pub const MDB_FIRST: MDB_cursor_op = 0;
/// Position at the next key.
pub const MDB_NEXT: MDB_cursor_op = 8;
/// Position at the first key greater than or equal to the given one.
pub const MDB_SET_RANGE: MDB_cursor_op = 17;

/// Read-only transaction (`mdb_txn_begin` flag).
pub const MDB_RDONLY: c_uint = 0x20000;

/// The first of LMDB's own return codes (`MDB_KEYEXIST`).
pub const MDB_KEYEXIST: c_int = -30799;
/// The last of LMDB's own return codes (`MDB_BAD_DBI` in 0.9.24).
pub const MDB_LAST_ERRCODE: c_int = -30780;
/// No matching key or no more data.
pub const MDB_NOTFOUND: c_int = -30798;
/// The map (the data file, or the PMO) is full.
pub const MDB_MAP_FULL: c_int = -30792;

extern "C" {
    pub fn mdb_strerror(err: c_int) -> *mut c_char;

    pub fn mdb_env_create(env: *mut *mut MDB_env) -> c_int;
    pub fn mdb_env_set_mapsize(env: *mut MDB_env, size: usize) -> c_int;
    pub fn mdb_env_set_maxreaders(env: *mut MDB_env, readers: c_uint) -> c_int;
    pub fn mdb_env_set_pmo(env: *mut MDB_env, ops: *const MDB_pmo_ops) -> c_int;
    pub fn mdb_env_open(
        env: *mut MDB_env,
        path: *const c_char,
        flags: c_uint,
        mode: mode_t,
    ) -> c_int;
    pub fn mdb_env_close(env: *mut MDB_env);
    pub fn mdb_env_stat(env: *mut MDB_env, stat: *mut MDB_stat) -> c_int;
    pub fn mdb_env_info(env: *mut MDB_env, info: *mut MDB_envinfo) -> c_int;

    pub fn mdb_txn_begin(
        env: *mut MDB_env,
        parent: *mut MDB_txn,
        flags: c_uint,
        txn: *mut *mut MDB_txn,
    ) -> c_int;
    pub fn mdb_txn_commit(txn: *mut MDB_txn) -> c_int;
    pub fn mdb_txn_abort(txn: *mut MDB_txn);

    pub fn mdb_dbi_open(
        txn: *mut MDB_txn,
        name: *const c_char,
        flags: c_uint,
        dbi: *mut MDB_dbi,
    ) -> c_int;
    pub fn mdb_get(txn: *mut MDB_txn, dbi: MDB_dbi, key: *mut MDB_val, data: *mut MDB_val)
        -> c_int;
    pub fn mdb_put(
        txn: *mut MDB_txn,
        dbi: MDB_dbi,
        key: *mut MDB_val,
        data: *mut MDB_val,
        flags: c_uint,
    ) -> c_int;
    pub fn mdb_del(txn: *mut MDB_txn, dbi: MDB_dbi, key: *mut MDB_val, data: *mut MDB_val)
        -> c_int;

    pub fn mdb_cursor_open(txn: *mut MDB_txn, dbi: MDB_dbi, cursor: *mut *mut MDB_cursor) -> c_int;
    pub fn mdb_cursor_close(cursor: *mut MDB_cursor);
    pub fn mdb_cursor_get(
        cursor: *mut MDB_cursor,
        key: *mut MDB_val,
        data: *mut MDB_val,
        op: MDB_cursor_op,
    ) -> c_int;
}
