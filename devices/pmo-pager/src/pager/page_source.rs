//! The pager's side of a page source: where an attachment's verified plaintext comes from
//! (the crate's `source.rs` is the store session that implements it).

use super::{FillError, PAGE};

/// How the pager learnt that a page cannot be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detected {
    /// An access to the page was refused: whoever touched it is kept out.
    OnAccess,
    /// A prefetch found the page bad before anything touched it.
    Ahead,
}

/// Where an attachment's verified plaintext comes from (a store session).
pub trait PageSource: Send + Sync {
    /// Writes the verified plaintext of `page` into `out`; on error `out` holds no plaintext.
    fn fill(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), FillError>;
    /// Fills the consecutive pages `first ..`, one per buffer of `out`, in order (a prefetch
    /// run). On a failure at `first + i` returns `i` with the error: `out[i]` holds no
    /// plaintext, `out[..i]` is filled, nothing after `i` was read. A source that can share
    /// work across a run (a store session: one lock, one cipher lookup) overrides this.
    fn fill_run(&self, first: u64, out: &mut [[u8; PAGE]]) -> Result<(), (usize, FillError)> {
        for (i, o) in out.iter_mut().enumerate() {
            self.fill(first + i as u64, o).map_err(|e| (i, e))?;
        }
        Ok(())
    }
    /// Writable attachments track dirty pages.
    fn writable(&self) -> bool;
    /// The attachment's working copy stands for the CXL expander's device memory (LPMO CF)
    /// rather than local DRAM: every page moved into or out of it is charged the device
    /// memory latency ([`Pager::set_device_memory_latency`](super::Pager::set_device_memory_latency))
    /// and the DRAM budget does not count it.
    fn working_copy_on_device(&self) -> bool {
        false
    }
    /// A fill may wait for modelled media time (a store on the expander): the fault thread
    /// hands its watch over first, so other vCPUs' faults are served meanwhile.
    fn fill_waits(&self) -> bool {
        false
    }
    /// Told once per refusal of `page` (`OnAccess`, any error) and per page a
    /// prefetch found failing verification (`Ahead`), so the owner can fail
    /// the attachment and tell the guest. Called while the slice is live.
    fn page_failed(&self, _page: u64, _error: &FillError, _how: Detected) {}
}
