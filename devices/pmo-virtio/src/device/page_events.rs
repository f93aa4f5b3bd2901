//! How a failed page reaches the guest: an attachment's page source records that the attachment
//! failed (its later PSYNCs persist nothing, its DETACH reports it) and posts an event naming
//! the page on the event queue, so the driver unmaps it.

use super::*;

/// A device attachment's page source: its store session, and whom to tell when a page of it
/// fails.
pub(super) struct AttachmentSource {
    pub(super) session: SessionSource,
    handle: u64,
    events: Arc<EventSink>,
    /// 0, or the status every later PSYNC and the DETACH of this attachment
    /// answer: a page failed (see [`AttachmentSource::failure`]).
    failed: AtomicU32,
}

impl AttachmentSource {
    pub(super) fn new(session: SessionSource, handle: u64, events: Arc<EventSink>) -> Self {
        AttachmentSource {
            session,
            handle,
            events,
            failed: AtomicU32::new(0),
        }
    }

    /// Why the attachment failed, if it did: a page of it was refused to an
    /// access or found failing verification. From then on its PSYNCs persist
    /// nothing (the PMO stays as of its last good psync) and its DETACH
    /// reports the failure, so tampering never goes unnoticed.
    pub(super) fn failure(&self) -> Option<Status> {
        match self.failed.load(Ordering::SeqCst) {
            0 => None,
            s if s == Status::Io as u32 => Some(Status::Io),
            _ => Some(Status::BadMsg),
        }
    }

    /// A page of a design `c` working copy came back from the media other than it was
    /// written (the expander served it as zeros): the attachment fails as when a fault is
    /// refused, and the guest hears of the page once.
    pub(super) fn direct_page_failed(&self, page: u64) {
        let was = self.failed.swap(Status::BadMsg as u32, Ordering::SeqCst);
        if was != Status::BadMsg as u32 {
            self.events.post(proto::EVENT_PAGE_BAD, self.handle, page);
        }
    }
}

impl PageSource for AttachmentSource {
    fn fill(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), FillError> {
        self.session.fill(page, out)
    }

    fn writable(&self) -> bool {
        self.session.writable()
    }

    fn working_copy_on_device(&self) -> bool {
        self.session.working_copy_on_device()
    }

    fn page_failed(&self, page: u64, error: &FillError, how: Detected) {
        // An integrity failure outranks a medium error.
        match error {
            FillError::Integrity(_) => self.failed.store(Status::BadMsg as u32, Ordering::SeqCst),
            FillError::Other { .. } => {
                let _ = self.failed.compare_exchange(
                    0,
                    Status::Io as u32,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
        }
        let kind = match how {
            Detected::OnAccess => proto::EVENT_PAGE_POISONED,
            Detected::Ahead => proto::EVENT_PAGE_BAD,
        };
        self.events.post(kind, self.handle, page);
    }
}

/// Events waiting for a buffer on the event queue: (type, handle, page).
pub(super) struct EventSink {
    pub(super) pending: Mutex<VecDeque<(u32, u64, u64)>>,
    pub(super) kick: EventFd,
}

impl EventSink {
    fn post(&self, kind: u32, handle: u64, page: u64) {
        let mut q = self.pending.locked();
        // Bounded: a flood of failures keeps only the most recent events
        // (the attachments stay failed whatever the guest hears).
        if q.len() >= 1024 {
            q.pop_front();
        }
        q.push_back((kind, handle, page));
        let _ = self.kick.write(1);
    }
}
