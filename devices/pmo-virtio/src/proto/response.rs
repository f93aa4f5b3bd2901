//! Responses and events: typed structures of a fixed size, encoded and decoded in one place.

use super::request::Fields;
use super::*;

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
    /// Where the PMO's pages are, and what moved, under a DRAM budget (`--pmo-dram`).
    pub tier: TierStat,
}

/// The tiering part of STAT: this attachment's pages per tier and moves, and the VM's
/// budget and use. All zero without a DRAM budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStat {
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

impl TierStat {
    const WORDS: usize = 9;

    fn words(&self) -> [u64; Self::WORDS] {
        [
            self.dram_pages,
            self.cxl_dirty_pages,
            self.promotions,
            self.demotions,
            self.prefetch_to_cxl,
            self.vm_budget_pages,
            self.vm_dram_pages,
            self.vm_cxl_dirty_pages,
            self.vm_bytes_moved,
        ]
    }

    fn from_words(w: &[u64]) -> Option<Self> {
        let w: &[u64; Self::WORDS] = w.try_into().ok()?;
        Some(TierStat {
            dram_pages: w[0],
            cxl_dirty_pages: w[1],
            promotions: w[2],
            demotions: w[3],
            prefetch_to_cxl: w[4],
            vm_budget_pages: w[5],
            vm_dram_pages: w[6],
            vm_cxl_dirty_pages: w[7],
            vm_bytes_moved: w[8],
        })
    }
}

impl StatResponse {
    /// Bytes on the wire.
    pub const LEN: usize = 8 * (9 + HIST_BUCKETS + 5 + TierStat::WORDS);

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
        w[9 + HIST_BUCKETS..14 + HIST_BUCKETS].copy_from_slice(&[
            self.triggers,
            self.trigger_hits,
            self.trigger_wasted,
            self.prefetch_late,
            self.demand_unpredicted,
        ]);
        w[14 + HIST_BUCKETS..].copy_from_slice(&self.tier.words());
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
            tier: TierStat::from_words(&t[5..])?,
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
