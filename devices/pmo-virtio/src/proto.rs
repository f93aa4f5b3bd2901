//! The virtio-pmo wire protocol (docs/virtio-pmo.md): every byte the device reads from or
//! writes to the guest is defined here, request parsing and the typed responses alike. The C
//! side of the same protocol is `guest/include/uapi/virtio_pmo.h`; `tests/c_layout.rs` checks
//! that both agree on every constant, size and offset.
//!
//! Every byte comes from the guest and is treated as hostile: each field is
//! checked here, before anything else sees it, and any violation becomes an
//! error status. Keys are copied into zeroizing buffers only.

use zeroize::Zeroizing;

use pmo_store::Perm;

/// Virtio device type of the PMO device (unassigned in virtio 1.3; see docs/virtio-pmo.md).
pub const VIRTIO_ID_PMO: u32 = 63;
/// Protocol version in every request header and in the config space.
pub const VERSION: u16 = 1;
/// Bytes of a name field on the wire (NUL-padded).
pub const NAME_FIELD: usize = 64;
/// Longest name: the store's limit, so a name the store holds always fits the wire with its
/// terminating NUL.
pub const MAX_NAME_LEN: usize = pmo_store::record::MAX_NAME;
const _: () = assert!(MAX_NAME_LEN + 1 == NAME_FIELD);
/// Bytes of a key field on the wire.
pub const KEY_FIELD: usize = 64;
/// Bytes of a design-name field.
pub const DESIGN_FIELD: usize = 16;
/// Request and response header size.
pub const HEADER_LEN: usize = 8;
/// Event buffer size.
pub const EVENT_LEN: usize = 32;

/// Buckets of the fault-latency histogram in STAT: `[2^i, 2^(i+1))` microseconds.
pub const HIST_BUCKETS: usize = 16;

/// Create a PMO: name, size, key.
pub const OP_CREATE: u16 = 1;
/// Destroy a PMO: name, key.
pub const OP_DESTROY: u16 = 2;
/// Attach a PMO: name, permission, key; answers an [`AttachResponse`].
pub const OP_ATTACH: u16 = 3;
/// Detach an attachment by handle.
pub const OP_DETACH: u16 = 4;
/// Make an attachment's writes durable; answers a [`PsyncResponse`].
pub const OP_PSYNC: u16 = 5;
/// An attachment's host-side counters; answers a [`StatResponse`].
pub const OP_STAT: u16 = 6;
/// Choose the design of later attach sessions by name.
pub const OP_SET_DESIGN: u16 = 7;
/// One entry of the store's catalog by index; answers a [`ListEntry`].
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
    /// Done.
    Ok = 0,
    /// EPERM: the attachment may not do that (psync of a reader).
    Perm = 1,
    /// ENOENT: no such PMO, handle or list index.
    NoEnt = 2,
    /// EIO: the medium failed.
    Io = 5,
    /// ENOMEM: no free run of the window is large enough.
    NoMem = 12,
    /// EACCES: wrong key.
    Access = 13,
    /// EBUSY: attached (destroy), or the one-writer rule.
    Busy = 16,
    /// EEXIST: the name is taken.
    Exist = 17,
    /// EINVAL: a malformed field.
    Inval = 22,
    /// ENOSPC: the store is full.
    NoSpc = 28,
    /// ENAMETOOLONG: a name longer than [`MAX_NAME_LEN`].
    NameTooLong = 36,
    /// ENOSYS: unknown op.
    NoSys = 38,
    /// EPROTO: bad header or version.
    Proto = 71,
    /// EBADMSG: a page failed verification (the attachment failed).
    BadMsg = 74,
}

impl Status {
    /// Every status, for tests that check the C header agrees.
    pub const ALL: [Status; 14] = [
        Status::Ok,
        Status::Perm,
        Status::NoEnt,
        Status::Io,
        Status::NoMem,
        Status::Access,
        Status::Busy,
        Status::Exist,
        Status::Inval,
        Status::NoSpc,
        Status::NameTooLong,
        Status::NoSys,
        Status::Proto,
        Status::BadMsg,
    ];
}

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
        /// UTF-8 up to the first NUL (the service checks the name).
        design: String,
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

/// Appends little-endian fields into a fixed-size wire struct.
struct Put<const N: usize> {
    buf: [u8; N],
    at: usize,
}

impl<const N: usize> Put<N> {
    fn new() -> Self {
        Put { buf: [0; N], at: 0 }
    }

    fn bytes(mut self, b: &[u8]) -> Self {
        self.buf[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
        self
    }

    fn u32(self, v: u32) -> Self {
        self.bytes(&v.to_le_bytes())
    }

    fn u64(self, v: u64) -> Self {
        self.bytes(&v.to_le_bytes())
    }

    /// The struct; every byte is written (checked in tests by round trips).
    fn done(self) -> [u8; N] {
        debug_assert_eq!(self.at, N, "wire struct not filled");
        self.buf
    }
}

/// Decodes a fixed-size wire struct: `None` unless `bytes` is exactly its size.
fn fields(bytes: &[u8], len: usize) -> Option<Fields<'_>> {
    (bytes.len() == len).then_some(Fields { buf: bytes })
}

/// The device's configuration space (`struct virtio_pmo_config`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// [`VERSION`].
    pub version: u32,
    /// Bytes of a PMO page.
    pub page_size: u32,
    /// Bytes of the shared-memory window attached PMOs appear in.
    pub window_size: u64,
    /// [`MAX_NAME_LEN`].
    pub max_name_len: u32,
    /// Longest key.
    pub max_key_len: u32,
    /// Largest PMO.
    pub max_pmo_size: u64,
}

impl DeviceConfig {
    /// Bytes on the wire.
    pub const LEN: usize = 32;

    /// The wire bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        Put::new()
            .u32(self.version)
            .u32(self.page_size)
            .u64(self.window_size)
            .u32(self.max_name_len)
            .u32(self.max_key_len)
            .u64(self.max_pmo_size)
            .done()
    }

    /// From the wire bytes.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut f = fields(bytes, Self::LEN)?;
        Some(DeviceConfig {
            version: f.u32().ok()?,
            page_size: f.u32().ok()?,
            window_size: f.u64().ok()?,
            max_name_len: f.u32().ok()?,
            max_key_len: f.u32().ok()?,
            max_pmo_size: f.u64().ok()?,
        })
    }
}

/// ATTACH's answer (`struct virtio_pmo_attach_resp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttachResponse {
    /// Names the attachment in DETACH, PSYNC and STAT.
    pub handle: u64,
    /// Where the PMO's pages start in the window.
    pub window_offset: u64,
    /// Bytes of the PMO (whole pages).
    pub size: u64,
}

impl AttachResponse {
    /// Bytes on the wire.
    pub const LEN: usize = 24;

    /// The wire bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        Put::new()
            .u64(self.handle)
            .u64(self.window_offset)
            .u64(self.size)
            .done()
    }

    /// From the wire bytes.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut f = fields(bytes, Self::LEN)?;
        Some(AttachResponse {
            handle: f.u64().ok()?,
            window_offset: f.u64().ok()?,
            size: f.u64().ok()?,
        })
    }
}

/// PSYNC's answer (`struct virtio_pmo_psync_resp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PsyncResponse {
    /// Pages made durable.
    pub pages_written: u64,
}

impl PsyncResponse {
    /// Bytes on the wire.
    pub const LEN: usize = 8;

    /// The wire bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        Put::new().u64(self.pages_written).done()
    }

    /// From the wire bytes.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut f = fields(bytes, Self::LEN)?;
        Some(PsyncResponse {
            pages_written: f.u64().ok()?,
        })
    }
}

/// STAT's answer (`struct virtio_pmo_stat`): an attachment's host-side counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatResponse {
    /// Bytes of the PMO.
    pub size: u64,
    /// Demand faults served.
    pub faults: u64,
    /// Their total service time.
    pub fault_ns_total: u64,
    /// Pages decrypted and verified.
    pub pages_decrypted: u64,
    /// Of those, by prefetch.
    pub pages_prefetched: u64,
    /// PSYNCs done.
    pub psyncs: u64,
    /// Pages they wrote.
    pub psync_pages: u64,
    /// Their total time.
    pub psync_ns_total: u64,
    /// Pages that failed verification.
    pub integrity_failures: u64,
    /// Fault latency histogram, `[2^i, 2^(i+1))` microseconds.
    pub fault_hist: [u64; HIST_BUCKETS],
    /// Prefetched pages marked as triggers (their first use predicts again).
    pub triggers: u64,
    /// Triggers used before detach.
    pub trigger_hits: u64,
    /// Triggers never used.
    pub trigger_wasted: u64,
    /// Faults on pages a prefetch was still filling.
    pub prefetch_late: u64,
    /// Demand faults no prediction had named.
    pub demand_unpredicted: u64,
}

impl StatResponse {
    /// Bytes on the wire.
    pub const LEN: usize = 8 * (9 + HIST_BUCKETS + 5);

    fn words(&self) -> [u64; Self::LEN / 8] {
        let mut w = [0u64; Self::LEN / 8];
        w[..9].copy_from_slice(&[
            self.size,
            self.faults,
            self.fault_ns_total,
            self.pages_decrypted,
            self.pages_prefetched,
            self.psyncs,
            self.psync_pages,
            self.psync_ns_total,
            self.integrity_failures,
        ]);
        w[9..9 + HIST_BUCKETS].copy_from_slice(&self.fault_hist);
        w[9 + HIST_BUCKETS..].copy_from_slice(&[
            self.triggers,
            self.trigger_hits,
            self.trigger_wasted,
            self.prefetch_late,
            self.demand_unpredicted,
        ]);
        w
    }

    /// The wire bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        self.words()
            .iter()
            .fold(Put::new(), |p, w| p.u64(*w))
            .done()
    }

    /// From the wire bytes.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut f = fields(bytes, Self::LEN)?;
        let mut w = [0u64; Self::LEN / 8];
        for x in &mut w {
            *x = f.u64().ok()?;
        }
        let mut fault_hist = [0u64; HIST_BUCKETS];
        fault_hist.copy_from_slice(&w[9..9 + HIST_BUCKETS]);
        let t = &w[9 + HIST_BUCKETS..];
        Some(StatResponse {
            size: w[0],
            faults: w[1],
            fault_ns_total: w[2],
            pages_decrypted: w[3],
            pages_prefetched: w[4],
            psyncs: w[5],
            psync_pages: w[6],
            psync_ns_total: w[7],
            integrity_failures: w[8],
            fault_hist,
            triggers: t[0],
            trigger_hits: t[1],
            trigger_wasted: t[2],
            prefetch_late: t[3],
            demand_unpredicted: t[4],
        })
    }
}

/// Who holds a PMO, in a [`ListEntry`].
pub const LIST_DETACHED: u32 = 0;
/// Readers hold it.
pub const LIST_READERS: u32 = 1;
/// A writer holds it.
pub const LIST_WRITER: u32 = 2;

/// LIST's answer (`struct virtio_pmo_list_resp`): one catalog entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListEntry {
    /// The PMO's name (at most [`MAX_NAME_LEN`] bytes).
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// [`LIST_DETACHED`], [`LIST_READERS`] or [`LIST_WRITER`].
    pub attached: u32,
    /// Non-zero if index + 1 exists.
    pub more: u32,
}

impl ListEntry {
    /// Bytes on the wire.
    pub const LEN: usize = NAME_FIELD + 8 + 4 + 4;

    /// The wire bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        Put::new()
            .bytes(&name_field(&self.name))
            .u64(self.size)
            .u32(self.attached)
            .u32(self.more)
            .done()
    }

    /// From the wire bytes (the name checked as a request's would be).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut f = fields(bytes, Self::LEN)?;
        Some(ListEntry {
            name: f.name().ok()?,
            size: f.u64().ok()?,
            attached: f.u32().ok()?,
            more: f.u32().ok()?,
        })
    }
}

/// One event-queue buffer (`struct virtio_pmo_event`): a page of an attachment failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// [`EVENT_PAGE_POISONED`] or [`EVENT_PAGE_BAD`].
    pub kind: u32,
    /// The attachment.
    pub handle: u64,
    /// The page, from the PMO's start.
    pub page: u64,
}

impl Event {
    /// Bytes on the wire (reserved fields are zero).
    pub const LEN: usize = EVENT_LEN;

    /// The wire bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        Put::new()
            .u32(self.kind)
            .u32(0)
            .u64(self.handle)
            .u64(self.page)
            .u64(0)
            .done()
    }

    /// From the wire bytes.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut f = fields(bytes, Self::LEN)?;
        let kind = f.u32().ok()?;
        f.u32().ok()?;
        Some(Event {
            kind,
            handle: f.u64().ok()?,
            page: f.u64().ok()?,
        })
    }
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
    fn a_64_byte_name_is_too_long_and_63_is_not() {
        let n63 = "n".repeat(63);
        assert!(matches!(
            parse(&create(&n63, 4096, b"k")),
            Ok(Request::Create { name, .. }) if name == n63
        ));
        // A name filling the whole field leaves no NUL: 64 bytes, one too many.
        let mut r = create("x", 4096, b"k");
        r[HEADER_LEN..HEADER_LEN + NAME_FIELD].fill(b'n');
        assert_eq!(parse(&r).err(), Some(Status::NameTooLong));
        assert_eq!(MAX_NAME_LEN, 63);
    }

    #[test]
    fn typed_responses_round_trip_and_refuse_wrong_lengths() {
        let c = DeviceConfig {
            version: 1,
            page_size: 4096,
            window_size: 1 << 30,
            max_name_len: 63,
            max_key_len: 64,
            max_pmo_size: 64 << 30,
        };
        assert_eq!(DeviceConfig::decode(&c.encode()), Some(c));
        let a = AttachResponse {
            handle: 7,
            window_offset: 1 << 20,
            size: 8192,
        };
        assert_eq!(AttachResponse::decode(&a.encode()), Some(a));
        let p = PsyncResponse { pages_written: 3 };
        assert_eq!(PsyncResponse::decode(&p.encode()), Some(p));
        let mut st = StatResponse {
            size: 1,
            demand_unpredicted: 99,
            ..StatResponse::default()
        };
        st.fault_hist[15] = 5;
        assert_eq!(StatResponse::decode(&st.encode()), Some(st));
        let l = ListEntry {
            name: "db".into(),
            size: 4096,
            attached: LIST_WRITER,
            more: 1,
        };
        assert_eq!(ListEntry::decode(&l.encode()), Some(l.clone()));
        let e = Event {
            kind: EVENT_PAGE_BAD,
            handle: 2,
            page: 9,
        };
        assert_eq!(Event::decode(&e.encode()), Some(e));
        // Reserved event fields are zero on the wire.
        assert_eq!(&e.encode()[4..8], &[0; 4]);
        assert_eq!(&e.encode()[24..], &[0; 8]);
        assert_eq!(AttachResponse::decode(&a.encode()[1..]), None);
        assert_eq!(StatResponse::decode(&[0; StatResponse::LEN + 1]), None);
        assert_eq!(
            ListEntry::decode(&[0xff; ListEntry::LEN]),
            None,
            "not a name"
        );
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
