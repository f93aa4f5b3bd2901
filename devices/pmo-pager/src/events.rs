//! How a failed page reaches whoever must hear of it: the front end gives each attachment a
//! [`PageEvents`] sink (a virtio device posts to its event queue, so the guest driver unmaps
//! the page), and the attachment's page source posts to it once per refused page.

use crate::pager::Detected;

/// One page of an attachment that cannot be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageEvent {
    /// The attachment, as the front end named it ([`crate::source::Notify::handle`]).
    pub handle: u64,
    /// The page, from the PMO's start.
    pub page: u64,
    /// Whether an access was refused ([`Detected::OnAccess`]) or the page was found bad before
    /// anything touched it ([`Detected::Ahead`]).
    pub how: Detected,
}

/// A front end's sink for [`PageEvent`]s. Called from fault and prefetch threads while the
/// attachment is live, and from psync and detach: it must not block for long.
pub trait PageEvents: Send + Sync {
    /// Queues `event` for the front end's caller.
    fn post(&self, event: PageEvent);
}
