//! Requests: the header and each op's payload, parsed and validated field by field.

use zeroize::Zeroizing;

use pmo_store::{Design, Perm};

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

/// Cursor over the request payload; every read is bounds checked.
pub(super) struct Fields<'a> {
    pub(super) buf: &'a [u8],
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Status> {
        if self.buf.len() < n {
            return Err(Status::Inval);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub(super) fn u32(&mut self) -> Result<u32, Status> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(super) fn u64(&mut self) -> Result<u64, Status> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    pub(super) fn name(&mut self) -> Result<String, Status> {
        parse_name(self.take(NAME_FIELD)?)
    }

    fn key(&mut self) -> Result<KeyBytes, Status> {
        let len = self.u32()? as usize;
        let field = self.take(KEY_FIELD)?;
        if len == 0 || len > KEY_FIELD {
            return Err(Status::Inval);
        }
        Ok(Zeroizing::new(field[..len].to_vec()))
    }
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
        OP_CREATE => NAME_FIELD + 8 + 4 + KEY_FIELD,
        OP_DESTROY => NAME_FIELD + 4 + KEY_FIELD,
        OP_ATTACH => NAME_FIELD + 4 + 4 + KEY_FIELD,
        OP_DETACH | OP_PSYNC | OP_STAT => 8,
        OP_SET_DESIGN => DESIGN_FIELD,
        OP_LIST => 4,
        _ => return None,
    })
}

/// The largest request the device ever needs to read.
pub const MAX_REQUEST_LEN: usize = HEADER_LEN + NAME_FIELD + 8 + 4 + KEY_FIELD;

/// Parses and validates one request (header + payload).
pub fn parse(bytes: &[u8]) -> Result<Request, Status> {
    if bytes.len() < HEADER_LEN {
        return Err(Status::Proto);
    }
    let version = u16::from_le_bytes([bytes[0], bytes[1]]);
    let op = u16::from_le_bytes([bytes[2], bytes[3]]);
    let len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
    if version != VERSION {
        return Err(Status::Proto);
    }
    let expected = payload_len(op).ok_or(Status::NoSys)?;
    if len != expected || bytes.len() < HEADER_LEN + expected {
        return Err(Status::Inval);
    }
    let mut f = Fields {
        buf: &bytes[HEADER_LEN..HEADER_LEN + expected],
    };
    Ok(match op {
        OP_CREATE => {
            let name = f.name()?;
            let size = f.u64()?;
            let key = f.key()?;
            Request::Create { name, size, key }
        }
        OP_DESTROY => {
            let name = f.name()?;
            let key = f.key()?;
            Request::Destroy { name, key }
        }
        OP_ATTACH => {
            let name = f.name()?;
            let perm = match f.u32()? {
                1 => Perm::Read,
                2 => Perm::Write,
                _ => return Err(Status::Inval),
            };
            let key = f.key()?;
            Request::Attach { name, perm, key }
        }
        OP_DETACH => Request::Detach { handle: f.u64()? },
        OP_PSYNC => Request::Psync { handle: f.u64()? },
        OP_STAT => Request::Stat { handle: f.u64()? },
        OP_SET_DESIGN => {
            let field = f.take(DESIGN_FIELD)?;
            let len = field.iter().position(|&b| b == 0).unwrap_or(field.len());
            let name = std::str::from_utf8(&field[..len]).map_err(|_| Status::Inval)?;
            Request::SetDesign {
                design: name.parse().map_err(|_| Status::Inval)?,
            }
        }
        OP_LIST => Request::List { index: f.u32()? },
        _ => return Err(Status::NoSys),
    })
}
