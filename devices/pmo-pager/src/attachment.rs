//! An attached PMO: a store session serving either a slice of the pager's window or, for
//! design `c` on an expander with a working area, a working copy in the expander's memory.
//!
//! This is the one place that decides the order of an attachment's steps, for every front
//! end (a VMM's PMO device, the host-side harness and applications):
//! - attach: the session, then its place (a window slice with its predictor, or a verified
//!   working copy, mapped into the guest if a guest uses it); a failure drops the session,
//!   which runs the store's crash handler, so nothing of the PMO changes;
//! - psync: refused once the attachment failed; else the pages written since the last psync,
//!   checked once more for a failure at the last moment, in one atomic commit;
//! - detach: the plaintext leaves the window (or the guest's mapping) first, then the session
//!   ends in the background, with the attachment's failure, if any, reported.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cxl_t3::WorkingArea;
use pmo_crypto::PAGE;
use pmo_policies::PredictorSpec;
use pmo_store::{Design, DetachHandle, Perm, Session, StoreError};

use crate::direct::{DirectCopy, GuestMapper};
use crate::pager::{PageSets, Pager, PagerError, SliceStats, TierStats};
use crate::source::{Notify, SessionSource};
use crate::working::WorkingError;
use crate::Failure;

/// Errors of an [`Attachment`].
#[derive(Debug, thiserror::Error)]
pub enum AttachmentError {
    /// The pager refused (window full, slice gone, clearing the window failed).
    #[error("pager: {0}")]
    Pager(#[from] PagerError),
    /// The store refused the psync or the detach.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The design `c` working copy could not be made or persisted.
    #[error("working copy: {0}")]
    Working(#[from] WorkingError),
    /// The working copy could not be mapped into the guest.
    #[error("map the working copy into the guest: {0}")]
    Map(String),
    /// A page of the attachment failed earlier: nothing more is persisted.
    #[error("the attachment failed: {0}")]
    Failed(Failure),
    /// A reader cannot psync.
    #[error("the attachment is read-only")]
    ReadOnly,
    /// The session was already taken out by a detach.
    #[error("the attachment is detached")]
    Detached,
}

impl AttachmentError {
    /// What the front end's caller is told.
    pub fn failure(&self) -> Failure {
        match self {
            // A window that cannot take the attachment, whatever the reason.
            AttachmentError::Pager(PagerError::Detaching(_) | PagerError::NoSlice(_)) => {
                Failure::NotFound
            }
            AttachmentError::Pager(_) | AttachmentError::Map(_) => Failure::NoMemory,
            AttachmentError::Store(e) => e.into(),
            AttachmentError::Working(e) => e.into(),
            AttachmentError::Failed(f) => *f,
            AttachmentError::ReadOnly => Failure::NotPermitted,
            AttachmentError::Detached => Failure::NotFound,
        }
    }
}

/// Where design `c` working copies go, when the store has a working area.
#[derive(Clone, Copy)]
pub enum WorkingPlace<'a> {
    /// No working area: every design is served by the pager.
    None,
    /// In the area, touched by threads of this process at the copy's host address.
    Host(&'a Arc<WorkingArea>),
    /// In the area, mapped into the guest after a window of `window_len` bytes.
    Guest {
        /// The working area.
        area: &'a Arc<WorkingArea>,
        /// The VMM's means of mapping it.
        mapper: &'a dyn GuestMapper,
        /// Bytes of the pager's window before the area in the device's range.
        window_len: u64,
    },
}

/// How to attach.
pub struct AttachOptions<'a> {
    /// The PMO's name (for logs and for the front end's bookkeeping).
    pub name: &'a str,
    /// Prefetch predictor of a window slice.
    pub predictor: PredictorSpec,
    /// Who hears of failed pages.
    pub notify: Option<Notify>,
    /// Where a design `c` session's working copy goes.
    pub working: WorkingPlace<'a>,
}

/// Where the attachment's plaintext is.
enum Place {
    /// A slice of the pager's window at this byte offset.
    Window(u64),
    /// A working copy on the expander.
    Direct(DirectCopy),
}

/// What a detach leaves behind.
pub struct Detached {
    /// The store finishing the session in the background.
    pub pending: Option<DetachHandle>,
    /// The attachment failed (see [`SessionSource::failure`]): detached all the same, and the
    /// caller is told.
    pub failure: Option<Failure>,
}

/// What STAT reports of an attachment.
pub struct AttachmentStat {
    /// The PMO's size in bytes.
    pub size: u64,
    /// The pager's counters (all zero for a working copy on the expander).
    pub slice: Arc<SliceStats>,
    /// psyncs that persisted, their pages and their time.
    pub psyncs: u64,
    /// Pages those psyncs wrote.
    pub psync_pages: u64,
    /// Their total time.
    pub psync_ns_total: u64,
    /// The VM's tiering counters, when the window keeps a DRAM budget.
    pub tier: Option<TierStats>,
}

/// An attached PMO.
pub struct Attachment {
    name: String,
    perm: Perm,
    pager: Arc<Pager>,
    source: Arc<SessionSource>,
    place: Place,
    npages: u64,
    stats: Arc<SliceStats>,
    psyncs: AtomicU64,
    psync_pages: AtomicU64,
    psync_ns: AtomicU64,
    /// Set by the first detach: the offset may belong to a later attachment afterwards, so
    /// a second detach must not touch the pager.
    detached: AtomicBool,
}

impl Attachment {
    /// Gives `session` its place: a working copy when it is design `c` and `opts.working`
    /// offers an area, else a slice of `pager`'s window as large as its PMO. On failure the
    /// session is dropped, which runs the store's crash handler: nothing of the PMO changes.
    pub fn attach(
        pager: &Arc<Pager>,
        session: Session,
        opts: AttachOptions<'_>,
    ) -> Result<Self, AttachmentError> {
        let npages = session.pages();
        let perm = session.perm();
        let writable = perm == Perm::Write;
        let direct = match (session.design(), opts.working) {
            (Design::C, WorkingPlace::Host(area)) => Some(DirectCopy::on_host(&session, area)?),
            (
                Design::C,
                WorkingPlace::Guest {
                    area,
                    mapper,
                    window_len,
                },
            ) => Some(
                DirectCopy::in_guest(&session, area, mapper, window_len, writable)
                    .map_err(AttachmentError::Failed)?,
            ),
            _ => None,
        };
        let source = Arc::new(SessionSource::new(session, writable, opts.notify));
        let (place, stats) = match direct {
            Some(copy) => (Place::Direct(copy), Arc::new(SliceStats::default())),
            None => {
                let (offset, stats) = match pager.attach(source.clone(), npages) {
                    Ok(x) => x,
                    Err(e) => {
                        log::warn!("pmo: attach {:?}: {e}", opts.name);
                        drop(source.take());
                        return Err(e.into());
                    }
                };
                (Place::Window(offset), stats)
            }
        };
        let a = Attachment {
            name: opts.name.to_string(),
            perm,
            pager: pager.clone(),
            source,
            place,
            npages,
            stats,
            psyncs: AtomicU64::new(0),
            psync_pages: AtomicU64::new(0),
            psync_ns: AtomicU64::new(0),
            detached: AtomicBool::new(false),
        };
        if let Place::Window(offset) = a.place {
            if !opts.predictor.is_none() {
                if let Err(e) = pager.set_predictor(offset, Some(opts.predictor.build())) {
                    // The slice is fresh and nothing was stored through it.
                    let _ = a.detach().map(|d| d.pending.map(DetachHandle::wait));
                    return Err(e.into());
                }
            }
        }
        Ok(a)
    }

    /// The PMO's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Read or write.
    pub fn perm(&self) -> Perm {
        self.perm
    }

    /// Where the PMO's first byte is in the front end's range: the window slice's offset, or
    /// the working copy's (after the window when the guest maps it).
    pub fn offset(&self) -> u64 {
        match &self.place {
            Place::Window(offset) => *offset,
            Place::Direct(copy) => copy.offset(),
        }
    }

    /// The PMO's size in pages.
    pub fn npages(&self) -> u64 {
        self.npages
    }

    /// The PMO's size in bytes.
    pub fn size(&self) -> u64 {
        self.npages.saturating_mul(PAGE as u64)
    }

    /// Host address of the PMO's first byte, where threads of this process touch it.
    pub fn host_addr(&self) -> u64 {
        match &self.place {
            Place::Window(offset) => self.pager.host_addr() + offset,
            Place::Direct(copy) => copy.host_addr(),
        }
    }

    /// True when the plaintext is a working copy on the expander, not in the pager's window.
    pub fn is_direct(&self) -> bool {
        matches!(self.place, Place::Direct(_))
    }

    /// The slice's counters (faults, prefetches, write-protect faults).
    pub fn stats(&self) -> &Arc<SliceStats> {
        &self.stats
    }

    /// Why the attachment failed, if a page of it did.
    pub fn failure(&self) -> Option<Failure> {
        self.source.failure()
    }

    /// Which pages came by demand fault and which by prefetch, this session (a window slice).
    pub fn page_sets(&self) -> Result<PageSets, AttachmentError> {
        match &self.place {
            Place::Window(offset) => Ok(self.pager.page_sets(*offset)?),
            Place::Direct(_) => Ok(PageSets::default()),
        }
    }

    /// What STAT reports.
    pub fn stat(&self) -> AttachmentStat {
        AttachmentStat {
            size: self.size(),
            slice: self.stats.clone(),
            psyncs: self.psyncs.load(Ordering::Relaxed),
            psync_pages: self.psync_pages.load(Ordering::Relaxed),
            psync_ns_total: self.psync_ns.load(Ordering::Relaxed),
            tier: self.pager.tier_stats(),
        }
    }

    /// Persists the pages written since the last psync, atomically, as one commit; returns
    /// how many there were. Only this attachment's pages are read, even if a later attachment
    /// got the same window offset after a detach. A failed attachment persists nothing: its
    /// PMO stays as of its last good psync.
    pub fn psync(&self) -> Result<u64, AttachmentError> {
        if self.perm != Perm::Write {
            return Err(AttachmentError::ReadOnly);
        }
        if let Some(f) = self.source.failure() {
            return Err(AttachmentError::Failed(f));
        }
        let start = Instant::now();
        let n = match &self.place {
            Place::Direct(copy) => {
                let n = self
                    .source
                    .with(|session| copy.psync(session))
                    .ok_or(AttachmentError::Detached)?;
                if let Some(page) = copy.failed_page() {
                    self.source.working_page_failed(page);
                }
                n?
            }
            Place::Window(offset) => self
                .source
                .with(|session| {
                    self.pager
                        .collect_dirty_of(*offset, &self.stats, |pages| {
                            // Checked again at the last moment before anything is written.
                            if let Some(f) = self.source.failure() {
                                return Err(AttachmentError::Failed(f));
                            }
                            Ok(session.psync(pages.iter().map(|(p, d)| (*p, &**d)))?)
                        })
                        .map_err(AttachmentError::from)
                })
                .ok_or(AttachmentError::Detached)???,
        };
        self.psyncs.fetch_add(1, Ordering::Relaxed);
        self.psync_pages.fetch_add(n, Ordering::Relaxed);
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.psync_ns.fetch_add(ns, Ordering::Relaxed);
        Ok(n)
    }

    /// Drops the plaintext from the window (or takes the working copy out of the guest), then
    /// ends the session in the background: stores since the last psync are lost. Returns the
    /// store's handle on that work and the attachment's failure, if it failed.
    pub fn detach(&self) -> Result<Detached, AttachmentError> {
        if self.detached.swap(true, Ordering::AcqRel) {
            return Err(AttachmentError::Detached);
        }
        if let Place::Direct(copy) = &self.place {
            if let Some(page) = copy.failed_page() {
                self.source.working_page_failed(page);
            }
        }
        let mut failure = self.source.failure();
        self.log_detach(failure);
        // Plaintext leaves the guest first; then the session ends (in the background).
        match &self.place {
            Place::Direct(copy) => copy.unmap(),
            Place::Window(offset) => {
                if let Err(e) = self.pager.detach(*offset) {
                    log::error!("pmo: detach {:?}: window slice: {e}", self.name);
                    failure.get_or_insert(Failure::Io);
                }
            }
        }
        let pending = self.source.take().map(Session::detach);
        Ok(Detached { pending, failure })
    }

    /// What the session did, at info level (and its prefetches, when it had any).
    fn log_detach(&self, failure: Option<Failure>) {
        let s = &self.stats;
        let load = |x: &AtomicU64| x.load(Ordering::Relaxed);
        if load(&s.pages_prefetched) + load(&s.triggers) > 0 {
            let est = s.estimate();
            let pct = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{:.0}%", r * 100.0));
            log::info!(
                "pmo: detach {:?}: {} pages prefetched, {} triggers ({} used, {} wasted), {} late; estimated accuracy {}, coverage {}, timeliness {}",
                self.name,
                load(&s.pages_prefetched),
                load(&s.triggers),
                load(&s.trigger_hits),
                load(&s.trigger_wasted),
                load(&s.prefetch_late),
                pct(est.accuracy),
                pct(est.coverage),
                pct(est.timeliness),
            );
        }
        log::info!(
            "pmo: detach {:?} ({}{}): {} faults ({} us total), {} pages decrypted, {} psyncs of {} pages ({} us; {} pages marked dirty were unchanged), {} integrity failures",
            self.name,
            if self.perm == Perm::Write { "w" } else { "r" },
            if failure.is_some() { ", failed" } else { "" },
            load(&s.faults),
            load(&s.fault_ns_total) / 1000,
            load(&s.pages_decrypted),
            load(&self.psyncs),
            load(&self.psync_pages),
            load(&self.psync_ns) / 1000,
            load(&s.psync_unchanged),
            load(&s.integrity_failures),
        );
        let on_device = load(&s.device_pages);
        if on_device > 0 {
            log::info!(
                "pmo: detach {:?}: working copy in expander device memory (design cf): {} pages",
                self.name,
                on_device,
            );
        }
        if let Some(vm) = self.pager.tier_stats() {
            log::info!(
                "pmo: detach {:?}: tiering: {} pages in DRAM, {} dirty in device memory (dropped), {} promotions, {} demotions, {} predictions left in CXL; VM: {} of {} budget pages in DRAM, {} bytes moved",
                self.name,
                load(&s.dram_pages),
                load(&s.cxl_dirty_pages),
                load(&s.promotions),
                load(&s.demotions),
                load(&s.prefetch_to_cxl),
                vm.resident_pages,
                vm.budget_pages,
                vm.bytes_moved(),
            );
        }
        if self.is_direct() {
            log::info!(
                "pmo: detach {:?}: working copy on the expander (design c)",
                self.name
            );
        }
    }
}

#[cfg(test)]
mod tests;
