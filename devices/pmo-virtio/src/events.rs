//! How a failed page reaches the guest: the service's attachments post [`PageEvent`]s to an
//! [`EventSink`], and the device's queue thread moves them onto the event queue (each one
//! [`EventSink::next_event`] as wire bytes), so the driver unmaps the page. The sink is the
//! front end's whatever its queue types: pmovmm's device and Cloud Hypervisor's adapter both
//! use it.

use std::collections::VecDeque;
use std::sync::Mutex;

use locked::Locked;
use pmo_pager::{Detected, PageEvent, PageEvents};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::proto;

/// Most events kept for a driver that adds no buffers: a flood of failures keeps only the most
/// recent (the attachments stay failed whatever the guest hears).
const MAX_PENDING: usize = 1024;

/// Events waiting for a buffer on the event queue: (type, handle, page).
pub struct EventSink {
    pending: Mutex<VecDeque<(u32, u64, u64)>>,
    /// Wakes the queue thread: readable while events are pending.
    kick: EventFd,
}

impl EventSink {
    /// An empty sink with its own wake-up eventfd.
    pub fn new() -> std::io::Result<Self> {
        Ok(EventSink {
            pending: Mutex::new(VecDeque::new()),
            kick: EventFd::new(EFD_NONBLOCK)?,
        })
    }
}

impl EventSink {
    /// The eventfd that becomes readable when an event is posted (the queue thread polls it).
    pub fn kick(&self) -> &EventFd {
        &self.kick
    }

    /// The oldest pending event as the guest reads it, without taking it (no buffer may be
    /// free for it yet).
    pub fn next_event(&self) -> Option<[u8; proto::Event::LEN]> {
        let (kind, handle, page) = *self.pending.locked().front()?;
        Some(proto::Event { kind, handle, page }.encode())
    }

    /// Drops the oldest pending event (it reached the guest).
    pub fn pop(&self) {
        self.pending.locked().pop_front();
    }

    /// Events waiting, oldest first: (type, handle, page).
    pub fn pending(&self) -> Vec<(u32, u64, u64)> {
        self.pending.locked().iter().copied().collect()
    }
}

impl PageEvents for EventSink {
    fn post(&self, e: PageEvent) {
        let kind = match e.how {
            Detected::OnAccess => proto::EVENT_PAGE_POISONED,
            Detected::Ahead => proto::EVENT_PAGE_BAD,
        };
        let mut q = self.pending.locked();
        if q.len() >= MAX_PENDING {
            q.pop_front();
        }
        q.push_back((kind, e.handle, e.page));
        let _ = self.kick.write(1);
    }
}
