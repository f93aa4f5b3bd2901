//! How a failed page reaches the guest: the service's attachments post [`PageEvent`]s here,
//! and the queue thread moves them onto the event queue, so the driver unmaps the page.

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
pub(crate) struct EventSink {
    pub(crate) pending: Mutex<VecDeque<(u32, u64, u64)>>,
    /// Wakes the queue thread.
    pub(crate) kick: EventFd,
}

impl EventSink {
    pub(crate) fn new() -> std::io::Result<Self> {
        Ok(EventSink {
            pending: Mutex::new(VecDeque::new()),
            kick: EventFd::new(EFD_NONBLOCK)?,
        })
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
