//! The checked Rust views of two answers whose wire form is not a plain value: a LIST entry
//! (its name is text the guest will trust) and an event (its reserved fields). Every other
//! answer is its wire struct (`wire.rs`).

use super::wire::{EventBuffer, ListResponse};
use super::*;

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
    pub const LEN: usize = ListResponse::LEN;

    /// The wire bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        ListResponse {
            name: name_field(&self.name),
            size: self.size,
            attached: self.attached,
            more: self.more,
        }
        .encode()
    }

    /// From the wire bytes (the name checked as a request's would be).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let w = ListResponse::decode(bytes)?;
        Some(ListEntry {
            name: parse_name(&w.name).ok()?,
            size: w.size,
            attached: w.attached,
            more: w.more,
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
    pub const LEN: usize = EventBuffer::LEN;

    /// The wire bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        EventBuffer {
            kind: self.kind,
            handle: self.handle,
            page: self.page,
            ..EventBuffer::default()
        }
        .encode()
    }

    /// From the wire bytes (reserved fields ignored).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let w = EventBuffer::decode(bytes)?;
        Some(Event {
            kind: w.kind,
            handle: w.handle,
            page: w.page,
        })
    }
}
