//! Requests: the header and each op's payload, read through their wire structs (`wire.rs`)
//! and validated field by field into a [`Request`].

use zerocopy::{FromBytes, Immutable, KnownLayout, Unaligned};
use zeroize::Zeroizing;

use pmo_store::{Design, Perm};

use super::wire::{AttachReq, CreateReq, DestroyReq, HandleReq, ListReq, ReqHeader, SetDesignReq};
use super::*;

/// A user key as it arrived, wiped when dropped.
pub type KeyBytes = Zeroizing<Vec<u8>>;

/// A validated request.
#[derive(Debug)]
pub enum Request {
    /// [`OP_CREATE`].
    Create {
        /// A valid PMO name.
        name: String,
        /// Bytes, as the guest asked (the store checks it).
        size: u64,
        /// 1..=64 bytes.
        key: KeyBytes,
    },
    /// [`OP_DESTROY`].
    Destroy {
        /// A valid PMO name.
        name: String,
        /// 1..=64 bytes.
        key: KeyBytes,
    },
    /// [`OP_ATTACH`].
    Attach {
        /// A valid PMO name.
        name: String,
        /// Read or write.
        perm: Perm,
        /// 1..=64 bytes.
        key: KeyBytes,
    },
    /// [`OP_DETACH`].
    Detach {
        /// As [`AttachResponse::handle`] gave it (looked up, never trusted).
        handle: u64,
    },
    /// [`OP_PSYNC`].
    Psync {
        /// As [`AttachResponse::handle`] gave it.
        handle: u64,
    },
    /// [`OP_STAT`].
    Stat {
        /// As [`AttachResponse::handle`] gave it.
        handle: u64,
    },
    /// [`OP_SET_DESIGN`].
    SetDesign {
        /// One of the store's designs, by name (UTF-8 up to the first NUL); any other name is
        /// refused here.
        design: Design,
    },
    /// [`OP_LIST`].
    List {
        /// 0, 1, 2, ... while [`ListEntry::more`] says there is another.
        index: u32,
    },
}

impl Request {
    /// The op's name, for logs.
    pub fn op_name(&self) -> &'static str {
        match self {
            Request::Create { .. } => "create",
            Request::Destroy { .. } => "destroy",
            Request::Attach { .. } => "attach",
            Request::Detach { .. } => "detach",
            Request::Psync { .. } => "psync",
            Request::Stat { .. } => "stat",
            Request::SetDesign { .. } => "set-design",
            Request::List { .. } => "list",
        }
    }
}

/// The key of a request: `len` bytes of `field`, 1..=64.
fn key(len: u32, field: &[u8; KEY_FIELD]) -> Result<KeyBytes, Status> {
    let len = usize::try_from(len).map_err(|_| Status::Inval)?;
    if len == 0 || len > KEY_FIELD {
        return Err(Status::Inval);
    }
    Ok(Zeroizing::new(field[..len].to_vec()))
}

/// A NUL-padded name: 1..=63 bytes of `[A-Za-z0-9._-]`, not starting with
/// `.`, and nothing but NULs after the first NUL.
pub fn parse_name(field: &[u8]) -> Result<String, Status> {
    let len = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    if field[len..].iter().any(|&b| b != 0) {
        return Err(Status::Inval);
    }
    if len > MAX_NAME_LEN {
        return Err(Status::NameTooLong);
    }
    let name = &field[..len];
    let ok = !name.is_empty()
        && name[0] != b'.'
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
        return Err(Status::Inval);
    }
    // Checked ASCII above, so this cannot fail.
    String::from_utf8(name.to_vec()).map_err(|_| Status::Inval)
}

/// Size of each op's payload.
fn payload_len(op: u16) -> Option<usize> {
    Some(match op {
        OP_CREATE => CreateReq::LEN,
        OP_DESTROY => DestroyReq::LEN,
        OP_ATTACH => AttachReq::LEN,
        OP_DETACH | OP_PSYNC | OP_STAT => HandleReq::LEN,
        OP_SET_DESIGN => SetDesignReq::LEN,
        OP_LIST => ListReq::LEN,
        _ => return None,
    })
}

/// The largest request the device ever needs to read.
pub const MAX_REQUEST_LEN: usize = HEADER_LEN + CreateReq::LEN;
const _: () = assert!(CreateReq::LEN >= AttachReq::LEN && CreateReq::LEN >= DestroyReq::LEN);

/// The op's payload read as its wire struct, borrowed from the request (keys are not copied
/// out of it here). Its length was checked against the op before.
fn payload<T: FromBytes + KnownLayout + Immutable + Unaligned>(p: &[u8]) -> Result<&T, Status> {
    T::ref_from_bytes(p).map_err(|_| Status::Inval)
}

/// Parses and validates one request (header + payload).
pub fn parse(bytes: &[u8]) -> Result<Request, Status> {
    let (hdr, rest) = ReqHeader::read_from_prefix(bytes).map_err(|_| Status::Proto)?;
    if hdr.version != VERSION {
        return Err(Status::Proto);
    }
    let expected = payload_len(hdr.op).ok_or(Status::NoSys)?;
    if usize::try_from(hdr.len).ok() != Some(expected) {
        return Err(Status::Inval);
    }
    let p = rest.get(..expected).ok_or(Status::Inval)?;
    Ok(match hdr.op {
        OP_CREATE => {
            let c: &CreateReq = payload(p)?;
            let name = parse_name(&c.name)?;
            let key = key(c.key_len, &c.key)?;
            Request::Create {
                name,
                size: c.size,
                key,
            }
        }
        OP_DESTROY => {
            let d: &DestroyReq = payload(p)?;
            let name = parse_name(&d.name)?;
            let key = key(d.key_len, &d.key)?;
            Request::Destroy { name, key }
        }
        OP_ATTACH => {
            let a: &AttachReq = payload(p)?;
            let name = parse_name(&a.name)?;
            let perm = match a.perm {
                1 => Perm::Read,
                2 => Perm::Write,
                _ => return Err(Status::Inval),
            };
            let key = key(a.key_len, &a.key)?;
            Request::Attach { name, perm, key }
        }
        OP_DETACH => Request::Detach {
            handle: payload::<HandleReq>(p)?.handle,
        },
        OP_PSYNC => Request::Psync {
            handle: payload::<HandleReq>(p)?.handle,
        },
        OP_STAT => Request::Stat {
            handle: payload::<HandleReq>(p)?.handle,
        },
        OP_SET_DESIGN => {
            let field = &payload::<SetDesignReq>(p)?.name;
            let len = field.iter().position(|&b| b == 0).unwrap_or(field.len());
            let name = std::str::from_utf8(&field[..len]).map_err(|_| Status::Inval)?;
            Request::SetDesign {
                design: name.parse().map_err(|_| Status::Inval)?,
            }
        }
        OP_LIST => Request::List {
            index: payload::<ListReq>(p)?.index,
        },
        _ => return Err(Status::NoSys),
    })
}
