//! Every structure of the virtio-pmo wire, defined once: each is a `#[repr(C, packed)]` struct
//! whose bytes are the wire bytes (`zerocopy` derives prove at compile time that it has no
//! padding and that any bytes are a valid value), and each carries a table of its fields' names,
//! offsets and sizes. `tests/c_layout.rs` compares every table with what the C compiler says of
//! the same structure in `guest/include/uapi/virtio_pmo.h`, so a field added, moved, renamed or
//! resized on one side only fails that test.
//!
//! The fields are native integers and the wire is little endian: these structs are only right
//! on a little-endian host, which the assertion below makes a build error elsewhere (the VMM
//! runs on x86-64 KVM). The C side spells the same fields `__le16`/`__le32`/`__le64`.
//!
//! Requests are read through these types by `request.rs` (each field then checked); responses
//! are these types, except where a response has a checked Rust view (`ListEntry`, `Event` in
//! `response.rs`).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{DESIGN_FIELD, HIST_BUCKETS, KEY_FIELD, NAME_FIELD};

const _: () = assert!(
    cfg!(target_endian = "little"),
    "the wire structs hold native integers for little-endian wire fields"
);

/// One field of a wire structure, as the C header must have it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// The field's name, the same in C and Rust.
    pub name: &'static str,
    /// Bytes from the start of the structure.
    pub offset: usize,
    /// Bytes of the field.
    pub size: usize,
}

/// A wire structure's layout: what `tests/c_layout.rs` checks against the C header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The C structure's tag (`virtio_pmo_...`).
    pub c_name: &'static str,
    /// `sizeof` of the structure.
    pub size: usize,
    /// Its fields, in order.
    pub fields: &'static [Field],
}

/// Defines the wire structures, each with its C name, field table, `LEN`, `encode` and
/// `decode`, and [`LAYOUTS`], the list of all of them: one list, so a structure cannot be
/// defined without being checked.
macro_rules! wire_structs {
    ($(
        $(#[$meta:meta])*
        pub struct $name:ident = $c_name:literal {
            $( $(#[$fmeta:meta])* pub $field:ident: $ty:ty, )*
        }
    )*) => {
        $(
            $(#[$meta])*
            #[derive(Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
            #[repr(C, packed)]
            pub struct $name {
                $( $(#[$fmeta])* pub $field: $ty, )*
            }

            impl $name {
                /// Bytes on the wire.
                pub const LEN: usize = core::mem::size_of::<Self>();

                /// Its layout, which the C header must match.
                pub const LAYOUT: Layout = Layout {
                    c_name: $c_name,
                    size: Self::LEN,
                    fields: &[$(Field {
                        name: stringify!($field),
                        offset: core::mem::offset_of!($name, $field),
                        size: core::mem::size_of::<$ty>(),
                    },)*],
                };

                /// The wire bytes.
                pub fn encode(&self) -> [u8; Self::LEN] {
                    let mut b = [0u8; Self::LEN];
                    b.copy_from_slice(self.as_bytes());
                    b
                }

                /// From exactly [`Self::LEN`] bytes; `None` for any other length.
                pub fn decode(bytes: &[u8]) -> Option<Self> {
                    Self::read_from_bytes(bytes).ok()
                }
            }
        )*

        /// Every wire structure's layout.
        pub const LAYOUTS: &[Layout] = &[$($name::LAYOUT,)*];
    };
}

wire_structs! {
    /// The device's configuration space.
    #[derive(Debug, Default)]
    pub struct DeviceConfig = "virtio_pmo_config" {
        /// [`super::VERSION`].
        pub version: u32,
        /// Bytes of a PMO page.
        pub page_size: u32,
        /// Bytes of the shared-memory window attached PMOs appear in.
        pub window_size: u64,
        /// [`super::MAX_NAME_LEN`].
        pub max_name_len: u32,
        /// Longest key.
        pub max_key_len: u32,
        /// Largest PMO.
        pub max_pmo_size: u64,
    }

    /// Every request starts with this.
    #[derive(Debug, Default)]
    pub struct ReqHeader = "virtio_pmo_req_hdr" {
        /// [`super::VERSION`].
        pub version: u16,
        /// `OP_*`.
        pub op: u16,
        /// Payload bytes that follow: exactly the op's.
        pub len: u32,
    }

    /// Every response starts with this.
    #[derive(Debug, Default)]
    pub struct RespHeader = "virtio_pmo_resp_hdr" {
        /// A [`super::Status`].
        pub status: u32,
        /// Payload bytes that follow (none unless the status is OK).
        pub len: u32,
    }

    /// CREATE's payload. No `Debug`: it holds a key.
    pub struct CreateReq = "virtio_pmo_create" {
        /// NUL-padded name.
        pub name: [u8; NAME_FIELD],
        /// Bytes, whole pages.
        pub size: u64,
        /// Bytes of `key` used, 1..=64.
        pub key_len: u32,
        /// The key.
        pub key: [u8; KEY_FIELD],
    }

    /// DESTROY's payload. No `Debug`: it holds a key.
    pub struct DestroyReq = "virtio_pmo_destroy" {
        /// NUL-padded name.
        pub name: [u8; NAME_FIELD],
        /// Bytes of `key` used, 1..=64.
        pub key_len: u32,
        /// The key.
        pub key: [u8; KEY_FIELD],
    }

    /// ATTACH's payload. No `Debug`: it holds a key.
    pub struct AttachReq = "virtio_pmo_attach" {
        /// NUL-padded name.
        pub name: [u8; NAME_FIELD],
        /// 1 read, 2 write.
        pub perm: u32,
        /// Bytes of `key` used, 1..=64.
        pub key_len: u32,
        /// The key.
        pub key: [u8; KEY_FIELD],
    }

    /// DETACH's, PSYNC's and STAT's payload.
    #[derive(Debug, Default)]
    pub struct HandleReq = "virtio_pmo_handle" {
        /// As ATTACH answered it.
        pub handle: u64,
    }

    /// SET_DESIGN's payload.
    #[derive(Debug)]
    pub struct SetDesignReq = "virtio_pmo_set_design" {
        /// NUL-padded design name.
        pub name: [u8; DESIGN_FIELD],
    }

    /// LIST's payload.
    #[derive(Debug, Default)]
    pub struct ListReq = "virtio_pmo_list" {
        /// 0, 1, 2, ...
        pub index: u32,
    }

    /// ATTACH's answer.
    #[derive(Debug, Default)]
    pub struct AttachResponse = "virtio_pmo_attach_resp" {
        /// Names the attachment in DETACH, PSYNC and STAT.
        pub handle: u64,
        /// Where the PMO's pages start in the window.
        pub window_offset: u64,
        /// Bytes of the PMO (whole pages).
        pub size: u64,
    }

    /// PSYNC's answer.
    #[derive(Debug, Default)]
    pub struct PsyncResponse = "virtio_pmo_psync_resp" {
        /// Pages made durable.
        pub pages_written: u64,
    }

    /// The tiering part of STAT: this attachment's pages per tier and moves, and the VM's
    /// budget and use. All zero without a DRAM budget.
    #[derive(Debug, Default)]
    pub struct TierStat = "virtio_pmo_tier_stat" {
        /// Pages of this attachment resident in local DRAM.
        pub dram_pages: u64,
        /// Pages of this attachment written since psync and demoted to expander device memory.
        pub cxl_dirty_pages: u64,
        /// Pages of this attachment brought back into DRAM.
        pub promotions: u64,
        /// Pages of this attachment moved out of DRAM.
        pub demotions: u64,
        /// Predicted pages left in the CXL tier for lack of room.
        pub prefetch_to_cxl: u64,
        /// The VM's DRAM budget in pages (0: none).
        pub vm_budget_pages: u64,
        /// Pages resident in DRAM across the VM's attachments.
        pub vm_dram_pages: u64,
        /// Dirty pages in device memory across the VM's attachments.
        pub vm_cxl_dirty_pages: u64,
        /// Bytes moved between DRAM and the CXL tier across the VM's attachments.
        pub vm_bytes_moved: u64,
    }

    /// STAT's answer: an attachment's host-side counters.
    #[derive(Debug, Default)]
    pub struct StatResponse = "virtio_pmo_stat" {
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
        /// Where the PMO's pages are, and what moved, under a DRAM budget (`--pmo-dram`).
        pub tier: TierStat,
    }

    /// LIST's answer as it travels; [`super::ListEntry`] is its checked view.
    #[derive(Debug)]
    pub struct ListResponse = "virtio_pmo_list_resp" {
        /// NUL-padded name.
        pub name: [u8; NAME_FIELD],
        /// Bytes of the PMO.
        pub size: u64,
        /// `LIST_*`.
        pub attached: u32,
        /// Non-zero if index + 1 exists.
        pub more: u32,
    }

    /// One event-queue buffer as it travels; [`super::Event`] is its view.
    #[derive(Debug, Default)]
    pub struct EventBuffer = "virtio_pmo_event" {
        /// `EVENT_*`.
        pub kind: u32,
        /// Zero.
        pub reserved: u32,
        /// The attachment.
        pub handle: u64,
        /// The page, from the PMO's start.
        pub page: u64,
        /// Zero.
        pub reserved2: u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_cover_every_byte_in_order() {
        for l in LAYOUTS {
            let mut at = 0;
            for f in l.fields {
                assert_eq!(f.offset, at, "{}.{} leaves a gap", l.c_name, f.name);
                at += f.size;
            }
            assert_eq!(at, l.size, "{} ends after its last field", l.c_name);
        }
        assert_eq!(super::super::HEADER_LEN, ReqHeader::LEN);
        assert_eq!(super::super::HEADER_LEN, RespHeader::LEN);
        assert_eq!(super::super::EVENT_LEN, EventBuffer::LEN);
    }
}
