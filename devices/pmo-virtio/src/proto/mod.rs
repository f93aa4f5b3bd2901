//! The virtio-pmo wire protocol (docs/virtio-pmo.md): every byte the device reads from or
//! writes to the guest is defined here, request parsing and the typed responses alike. The C
//! side of the same protocol is `guest/include/uapi/virtio_pmo.h`; `tests/c_layout.rs` checks
//! that both agree on every constant, size and offset.
//!
//! Every byte comes from the guest and is treated as hostile: each field is
//! checked here, before anything else sees it, and any violation becomes an
//! error status. Keys are copied into zeroizing buffers only.
//!
//! Files: this one holds the constants and statuses; `wire.rs` every wire structure (one
//! definition each, with the field table the C header is checked against); `request.rs` the
//! parsing of requests; `response.rs` the checked views of LIST entries and events.

mod request;
mod response;
pub mod wire;

pub use request::{parse, parse_name, KeyBytes, Request, MAX_REQUEST_LEN};
pub use response::{Event, ListEntry, LIST_DETACHED, LIST_READERS, LIST_WRITER};
pub use wire::{AttachResponse, DeviceConfig, PsyncResponse, StatResponse, TierStat};

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
    /// ESTALE: the host refused the PMO when it opened the store: its record may be an old
    /// copy (damaged, duplicated, or contradicted by the rollback anchor) and is not used
    /// until the host's operator repairs it.
    Stale = 116,
}

impl Status {
    /// Every status, for tests that check the C header agrees.
    pub const ALL: [Status; 15] = [
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
        Status::Stale,
    ];
}

/// Encodes a response: header, then the payload (a response payload is one of the fixed-size
/// wire structs, far below 4 GiB).
pub fn response(status: Status, payload: &[u8]) -> Vec<u8> {
    let hdr = wire::RespHeader {
        status: status as u32,
        len: payload.len() as u32,
    };
    [&hdr.encode()[..], payload].concat()
}

/// Builds a request (for tests and host tools that drive the device directly).
pub fn request(op: u16, payload: &[u8]) -> Vec<u8> {
    let hdr = wire::ReqHeader {
        version: VERSION,
        op,
        len: payload.len() as u32,
    };
    [&hdr.encode()[..], payload].concat()
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
    use pmo_store::Perm;
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
        st.tier.vm_bytes_moved = 8192;
        st.tier.dram_pages = 3;
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
