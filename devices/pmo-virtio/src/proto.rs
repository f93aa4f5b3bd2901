//! The virtio-pmo wire protocol (docs/virtio-pmo.md): request parsing and
//! response encoding.
//!
//! Every byte comes from the guest and is treated as hostile: each field is
//! checked here, before anything else sees it, and any violation becomes an
//! error status. Keys are copied into zeroizing buffers only.

use zeroize::Zeroizing;

use pmo_store::Perm;

pub const VERSION: u16 = 1;
/// Bytes of a name field on the wire (NUL-padded).
pub const NAME_FIELD: usize = 64;
/// Longest name: the field keeps room for a terminating NUL.
pub const MAX_NAME_LEN: usize = NAME_FIELD - 1;
/// Bytes of a key field on the wire.
pub const KEY_FIELD: usize = 64;
/// Bytes of a design-name field.
pub const DESIGN_FIELD: usize = 16;
/// Request and response header size.
pub const HEADER_LEN: usize = 8;
/// Event buffer size.
pub const EVENT_LEN: usize = 32;

pub const OP_CREATE: u16 = 1;
pub const OP_DESTROY: u16 = 2;
pub const OP_ATTACH: u16 = 3;
pub const OP_DETACH: u16 = 4;
pub const OP_PSYNC: u16 = 5;
pub const OP_STAT: u16 = 6;
pub const OP_SET_DESIGN: u16 = 7;
pub const OP_LIST: u16 = 8;

/// An access to a page was refused (it failed verification, or the medium
/// failed): the driver unmaps the page and signals the attaching process.
pub const EVENT_PAGE_POISONED: u32 = 1;
/// A prefetch found a page failing verification before anything touched it:
/// the driver unmaps it, so even a kernel-mode read of it fails cleanly.
pub const EVENT_PAGE_BAD: u32 = 2;

/// Status codes: 0 or a Linux errno value, so the driver can pass them on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    Ok = 0,
    Perm = 1,
    NoEnt = 2,
    Io = 5,
    NoMem = 12,
    Access = 13,
    Busy = 16,
    Exist = 17,
    Inval = 22,
    NoSpc = 28,
    NameTooLong = 36,
    NoSys = 38,
    Proto = 71,
    BadMsg = 74,
}

/// A user key as it arrived, wiped when dropped.
pub type KeyBytes = Zeroizing<Vec<u8>>;

/// A validated request.
#[derive(Debug)]
pub enum Request {
    Create {
        name: String,
        size: u64,
        key: KeyBytes,
    },
    Destroy {
        name: String,
        key: KeyBytes,
    },
    Attach {
        name: String,
        perm: Perm,
        key: KeyBytes,
    },
    Detach {
        handle: u64,
    },
    Psync {
        handle: u64,
    },
    Stat {
        handle: u64,
    },
    SetDesign {
        design: String,
    },
    List {
        index: u32,
    },
}

impl Request {
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
struct Fields<'a> {
    buf: &'a [u8],
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

    fn u32(&mut self) -> Result<u32, Status> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, Status> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn name(&mut self) -> Result<String, Status> {
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
            let design = std::str::from_utf8(&field[..len]).map_err(|_| Status::Inval)?;
            Request::SetDesign {
                design: design.to_string(),
            }
        }
        OP_LIST => Request::List { index: f.u32()? },
        _ => return Err(Status::NoSys),
    })
}

/// Encodes a response: header, then as much payload as `room` allows.
pub fn response(status: Status, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + payload.len());
    v.extend_from_slice(&(status as u32).to_le_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// Builds a request (for tests and host tools that drive the device directly).
pub fn request(op: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + payload.len());
    v.extend_from_slice(&VERSION.to_le_bytes());
    v.extend_from_slice(&op.to_le_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// Wire encoding of a name field.
pub fn name_field(name: &str) -> [u8; NAME_FIELD] {
    let mut f = [0u8; NAME_FIELD];
    let n = name.len().min(NAME_FIELD);
    f[..n].copy_from_slice(&name.as_bytes()[..n]);
    f
}

/// Wire encoding of (key_len, key field).
pub fn key_field(key: &[u8]) -> Vec<u8> {
    let mut v = (key.len() as u32).to_le_bytes().to_vec();
    let mut f = [0u8; KEY_FIELD];
    let n = key.len().min(KEY_FIELD);
    f[..n].copy_from_slice(&key[..n]);
    v.extend_from_slice(&f);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn create(name: &str, size: u64, key: &[u8]) -> Vec<u8> {
        let mut p = name_field(name).to_vec();
        p.extend_from_slice(&size.to_le_bytes());
        p.extend_from_slice(&key_field(key));
        request(OP_CREATE, &p)
    }

    #[test]
    fn well_formed_requests_parse() {
        match parse(&create("db.main-1", 8192, b"secret")).unwrap() {
            Request::Create { name, size, key } => {
                assert_eq!(name, "db.main-1");
                assert_eq!(size, 8192);
                assert_eq!(&key[..], b"secret");
            }
            r => panic!("{r:?}"),
        }
        let mut p = name_field("x").to_vec();
        p.extend_from_slice(&2u32.to_le_bytes());
        p.extend_from_slice(&key_field(b"k"));
        assert!(matches!(
            parse(&request(OP_ATTACH, &p)).unwrap(),
            Request::Attach {
                perm: Perm::Write,
                ..
            }
        ));
        assert!(matches!(
            parse(&request(OP_PSYNC, &7u64.to_le_bytes())).unwrap(),
            Request::Psync { handle: 7 }
        ));
    }

    #[test]
    fn bad_headers_and_fields_are_rejected() {
        assert_eq!(parse(&[1, 0, 1]).err(), Some(Status::Proto));
        let mut r = create("a", 4096, b"k");
        r[0] = 2;
        assert_eq!(parse(&r).err(), Some(Status::Proto));
        assert_eq!(parse(&request(99, &[])).err(), Some(Status::NoSys));
        // Length field disagrees with the op, or the buffer is short.
        assert_eq!(
            parse(&request(OP_DETACH, &[0; 4])).err(),
            Some(Status::Inval)
        );
        let r = create("a", 4096, b"k");
        assert_eq!(parse(&r[..r.len() - 1]).err(), Some(Status::Inval));
        // Names.
        assert_eq!(parse(&create("", 4096, b"k")).err(), Some(Status::Inval));
        assert_eq!(
            parse(&create(".hidden", 4096, b"k")).err(),
            Some(Status::Inval)
        );
        assert_eq!(parse(&create("a/b", 4096, b"k")).err(), Some(Status::Inval));
        assert_eq!(
            parse(&create(&"n".repeat(64), 4096, b"k")).err(),
            Some(Status::NameTooLong)
        );
        let mut r = create("ab", 4096, b"k");
        r[HEADER_LEN + 3] = b'x'; // a byte after the terminating NUL
        assert_eq!(parse(&r).err(), Some(Status::Inval));
        // Keys.
        assert_eq!(parse(&create("a", 4096, b"")).err(), Some(Status::Inval));
        let mut r = create("a", 4096, b"k");
        r[HEADER_LEN + NAME_FIELD + 8..HEADER_LEN + NAME_FIELD + 12]
            .copy_from_slice(&65u32.to_le_bytes());
        assert_eq!(parse(&r).err(), Some(Status::Inval));
        // Permissions.
        let mut p = name_field("x").to_vec();
        p.extend_from_slice(&3u32.to_le_bytes());
        p.extend_from_slice(&key_field(b"k"));
        assert_eq!(parse(&request(OP_ATTACH, &p)).err(), Some(Status::Inval));
    }

    #[test]
    fn responses_carry_status_and_length() {
        let r = response(Status::Busy, &[1, 2, 3]);
        assert_eq!(&r[..4], &16u32.to_le_bytes());
        assert_eq!(&r[4..8], &3u32.to_le_bytes());
        assert_eq!(&r[8..], &[1, 2, 3]);
    }

    proptest! {
        /// Whatever the guest sends, parsing returns (never panics), and a
        /// parsed name always obeys the name rules.
        #[test]
        fn hostile_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(Request::Create { name, .. } | Request::Attach { name, .. } | Request::Destroy { name, .. }) = parse(&bytes) {
                prop_assert!(!name.is_empty() && name.len() <= MAX_NAME_LEN && !name.starts_with('.'));
            }
        }

        /// Valid headers with random payloads exercise the field checks.
        #[test]
        fn random_payloads_never_panic(op in 0u16..10, payload in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse(&request(op, &payload));
        }
    }
}
