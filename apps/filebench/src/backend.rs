//! What the engine runs on: a [`Backend`] of named objects and the [`Attachment`]s it hands
//! out.

use std::io;
use std::ptr::NonNull;

/// One attachment a [`Backend`] hands out: the whole object, mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attachment {
    /// Its first byte.
    pub addr: NonNull<u8>,
    /// Its size in bytes (the object's size).
    pub len: usize,
}

/// PMO calls on names, which the engine makes from several threads at once.
///
/// # Safety
///
/// The engine reads (and, for a writable attachment, writes) through what [`Backend::attach`]
/// returns, so an implementation must guarantee: `addr` points to `len` bytes that stay mapped,
/// readable (and writable when `writable`) until [`Backend::detach`] of that attachment;
/// nothing else writes them meanwhile while attached for writing, nor while the engine reads
/// them (a writable attachment is exclusive: attach fails with EBUSY when a writer holds the
/// object, or readers hold it and a writer asks); `create` makes a zero-filled object of `size`
/// bytes; `sync` and `detach` take the `addr` of a live attachment. Errors are `io::Error`s with
/// an errno (`from_raw_os_error`): EEXIST from `create`, ENOENT from `destroy` and `attach`
/// matter to the engine; anything without an errno becomes EIO.
pub unsafe trait Backend: Sync {
    /// Creates object `name` of `size` bytes (a multiple of 4096), zero-filled.
    fn create(&self, name: &str, size: usize) -> io::Result<()>;
    /// Destroys object `name` (EBUSY while attached).
    fn destroy(&self, name: &str) -> io::Result<()>;
    /// Attaches object `name` for reading, or reading and writing.
    fn attach(&self, name: &str, writable: bool) -> io::Result<Attachment>;
    /// Makes the object attached at `addr` durable (psync).
    fn sync(&self, addr: NonNull<u8>) -> io::Result<()>;
    /// Ends the attachment at `addr`.
    fn detach(&self, addr: NonNull<u8>) -> io::Result<()>;
}
