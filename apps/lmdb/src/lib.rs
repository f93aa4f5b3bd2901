//! LMDB with a small safe API, its data file either an ordinary file or an encrypted PMO.
//!
//! The build fetches LMDB 0.9.24, applies `apps/lmdb/pmo.patch` (`mdb_env_set_pmo`: the data
//! file's memory comes from attach / sync / detach callbacks, commits sync the object) and
//! compiles it for the host. On top:
//!
//! - [`Env`]: [`EnvBuilder::open_dir`] is stock LMDB on a file (the unencrypted baseline);
//!   [`EnvBuilder::open_pmo`] puts the data file in a PMO of a [`PmoBackend`];
//! - [`RoTxn`] (`get`, `scan`) and [`RwTxn`] (`get`, `scan`, `put`, `del`, `commit`) on the
//!   main database;
//! - [`StoreBackend`]: the real thing, a `pmo_store::Store` on a file whose PMOs are served by
//!   the `pmo_pager` userfaultfd pager, the threads running LMDB playing the vCPUs.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use lmdb_pmo::{Env, StoreBackend, StoreConfig};
//!
//! let backend = Arc::new(StoreBackend::open_file(
//!     "/tmp/store.img".as_ref(), 64 << 20, b"tenant key", StoreConfig::default())?);
//! let env = Env::builder().map_size(16 << 20).open_pmo("/tmp/db".as_ref(), backend)?;
//! let mut txn = env.write_txn()?;
//! txn.put(b"user1", b"fields")?;
//! txn.commit()?; // durable: the PMO was psynced
//! assert_eq!(env.read_txn()?.get(b"user1")?, Some(&b"fields"[..]));
//! # Ok(()) }
//! ```

mod env;
mod error;
mod ffi;
mod pmo;
mod store_backend;
mod txn;

pub use env::{Env, EnvBuilder, Info, Stat};
pub use error::Error;
pub use pmo::PmoBackend;
pub use store_backend::{BackendError, StoreBackend, StoreConfig};
pub use txn::{Record, RoTxn, RwTxn};

#[cfg(test)]
mod tests;
