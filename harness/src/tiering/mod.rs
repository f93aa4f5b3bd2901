//! The tiering evaluation (issue 13): a PMO on an expander store, touched by host threads
//! through the real pager and userfaultfd, with the whole PMO allowed in DRAM or a DRAM
//! budget kept by a placement policy (`--pmo-dram` in the VMM).
//!
//! Each cell creates a PMO on the expander (each extent under its own TEE range key), writes
//! its initial contents (a marker on every page; not timed), attaches it through the pager,
//! runs a fixed number of accesses on `threads` host threads (timed), psyncs, detaches, and
//! reads the PMO back through the store to check that every write arrived: the sum of the
//! counters in the PMO equals the number of writes made. Variants run interleaved in rounds
//! with the same accesses, so ratios are taken within a round.

pub mod access;
pub mod report;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::cxl_store::{expander_store, CxlStoreError, ExpanderModel};
use pmo_crypto::{UserKey, PAGE};
use pmo_pager::Pager;
use pmo_pager::{AttachOptions, Attachment, WorkingPlace};
use pmo_store::{CreateOptions, Design, Perm, Store};

use access::{Pages, Rng};

/// Marks every page of a cell's PMO at rest: the media scan looks for it.
pub const MARKER: &[u8; 16] = b"PMO-TIER-MARKER!";

const KEY: &[u8] = b"tiering evaluation key";

/// Errors of a tiering cell.
#[derive(Debug, thiserror::Error)]
pub enum TieringError {
    /// The expander store could not be made.
    #[error("{0}")]
    CxlStore(#[from] CxlStoreError),
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] pmo_store::StoreError),
    /// The pager failed.
    #[error("pager: {0}")]
    Pager(#[from] pmo_pager::PagerError),
    /// An attachment failed.
    #[error("attachment: {0}")]
    Attachment(#[from] pmo_pager::AttachmentError),
    /// The placement policy name is bad.
    #[error("{0}")]
    Policy(#[from] pmo_policies::TieringError),
    /// A key could not be made.
    #[error("key: {0}")]
    Key(#[from] pmo_crypto::CryptoError),
    /// A scratch file failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The PMO read back does not hold every write.
    #[error("{variant}: the PMO holds {got} increments, {want} were made")]
    Lost {
        /// The variant's label.
        variant: String,
        /// Sum of the counters read back.
        got: u64,
        /// Writes made.
        want: u64,
    },
    /// A parameter is out of range.
    #[error("{0}")]
    Params(String),
}

/// Where a cell's plaintext may live.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Variant {
    /// No budget: every touched page stays in local DRAM.
    AllDram,
    /// At most `fraction` of the PMO's pages in local DRAM, demoted by `policy`.
    Budget {
        /// `hotness` or `fifo`.
        policy: &'static str,
        /// Of the PMO's pages, in (0, 1].
        fraction: f64,
    },
}

impl Variant {
    /// The label in reports: `all-DRAM`, `hotness 25%`.
    pub fn label(&self) -> String {
        match self {
            Variant::AllDram => "all-DRAM".into(),
            Variant::Budget { policy, fraction } => format!("{policy} {}%", fraction * 100.0),
        }
    }
}

/// What one cell measured.
#[derive(Debug, Clone, Default)]
pub struct TierCell {
    /// Wall time of the accesses.
    pub ns: u64,
    /// Accesses made.
    pub ops: u64,
    /// Missing-page faults the pager served (first touches and promotions).
    pub faults: u64,
    /// Pages brought back into DRAM.
    pub promotions: u64,
    /// Pages moved out of DRAM.
    pub demotions: u64,
    /// Bytes moved between the tiers.
    pub bytes_moved: u64,
}

impl TierCell {
    /// Accesses served from local DRAM without a fault.
    pub fn hit_ratio(&self) -> f64 {
        1.0 - self.faults as f64 / self.ops.max(1) as f64
    }

    /// Promotions and demotions per second of the run.
    pub fn migrations_per_s(&self) -> f64 {
        (self.promotions + self.demotions) as f64 / (self.ns.max(1) as f64 / 1e9)
    }
}

/// The expander store the cells run on (media in a scratch directory, removed on drop).
pub struct TierEnv {
    store: Store,
    key: UserKey,
    dir: PathBuf,
    media: PathBuf,
    next: u64,
    /// The expander's configuration, for the report.
    pub medium: String,
}

impl TierEnv {
    /// An expander big enough for PMOs of `max_pmo` bytes, its device cache `cache` bytes and
    /// its media latency `latency_ns` per fill and write-back.
    pub fn new(max_pmo: u64, cache: u64, latency_ns: u64) -> Result<Self, TieringError> {
        let dir = std::env::temp_dir().join(format!("pmo-tiering-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let model = ExpanderModel {
            cache,
            media_latency_ns: latency_ns,
        };
        // A primary and a shadow copy per PMO plus the tables.
        let len = max_pmo.saturating_mul(4) + (64 << 20);
        let (store, media, medium) = expander_store(&dir, len, 16, model)?;
        Ok(Self {
            store,
            key: UserKey::new(KEY)?,
            dir,
            medium,
            media,
            next: 0,
        })
    }

    /// The media file, for the plaintext scan.
    pub fn media(&self) -> &std::path::Path {
        &self.media
    }

    /// Runs one cell: `ops` accesses drawn from `pages` (seeded by `seed`) over a PMO of
    /// `npages` pages on `threads` threads, in `variant`.
    pub fn run_cell(
        &mut self,
        pages: &Pages,
        npages: u64,
        ops: u64,
        threads: usize,
        variant: Variant,
        seed: u64,
    ) -> Result<TierCell, TieringError> {
        self.next += 1;
        let name = format!("tier-{}", self.next);
        self.store.create_pmo_with(
            &name,
            npages * PAGE as u64,
            &self.key,
            // The product's PMO: design `d` with its default suite.
            CreateOptions {
                design: Design::D,
                suite: None,
                kdf: None,
            },
        )?;
        let r = self.run_created(&name, pages, npages, ops, threads, variant, seed);
        let d = self.store.destroy_pmo(&name, &self.key);
        let r = r?;
        d?;
        Ok(r)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_created(
        &self,
        name: &str,
        pages: &Pages,
        npages: u64,
        ops: u64,
        threads: usize,
        variant: Variant,
        seed: u64,
    ) -> Result<TierCell, TieringError> {
        let threads = threads.max(1);
        // Initial contents: the marker and the page number; counters at 0.
        {
            let s = self
                .store
                .attach_with(name, Perm::Write, &self.key, Some(Design::D))?;
            let mut init = vec![[0u8; PAGE]; npages as usize];
            for (p, page) in init.iter_mut().enumerate() {
                page[..16].copy_from_slice(MARKER);
                page[16..24].copy_from_slice(&(p as u64).to_le_bytes());
            }
            s.psync(init.iter().enumerate().map(|(p, page)| (p as u64, page)))?;
            s.detach().wait()?;
        }
        let pager = Pager::new(npages * PAGE as u64, 2)?;
        if let Variant::Budget { policy, fraction } = variant {
            let budget = ((npages as f64 * fraction).ceil() as u64).clamp(1, npages);
            pager.set_dram_budget(budget, pmo_policies::placement_from_name(policy)?, npages)?;
        }
        let session = self
            .store
            .attach_with(name, Perm::Write, &self.key, Some(Design::D))?;
        let opts = AttachOptions {
            name,
            predictor: pmo_policies::PredictorSpec::None,
            notify: None,
            working: WorkingPlace::None,
        };
        let a = Attachment::attach(&pager, session, opts)?;
        let base = a.host_addr();
        let per_thread = ops / threads as u64;
        let writes = AtomicU64::new(0);
        let start = Instant::now();
        std::thread::scope(|s| {
            for t in 0..threads {
                let writes = &writes;
                s.spawn(move || {
                    let mut rng = Rng(seed ^ (t as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
                    let (mut w, mut sum) = (0u64, 0u64);
                    for _ in 0..per_thread {
                        let (page, write) = pages.next(&mut rng);
                        // Words 3.. of the page are counters (0..3 hold marker and number).
                        let word = 3 + rng.below((PAGE / 8 - 3) as u64);
                        let addr = base + page * PAGE as u64 + word * 8;
                        // SAFETY: `addr` is an 8-byte-aligned word of this attachment's slice
                        // (page < npages), mapped for as long as `a` is attached (until after
                        // this scope); the pager serves its faults; all threads use it
                        // atomically.
                        let cell = unsafe { &*(addr as *const AtomicU64) };
                        if write {
                            cell.fetch_add(1, Ordering::Relaxed);
                            w += 1;
                        } else {
                            sum = sum.wrapping_add(cell.load(Ordering::Relaxed));
                        }
                    }
                    std::hint::black_box(sum);
                    writes.fetch_add(w, Ordering::Relaxed);
                });
            }
        });
        let ns = start.elapsed().as_nanos() as u64;
        let stats = a.stats().clone();
        let tier = pager.tier_stats().unwrap_or_default();
        a.psync()?;
        if let Some(h) = a.detach()?.pending {
            h.wait()?;
        }
        drop(pager);
        // Every write is in the store.
        let s = self
            .store
            .attach_with(name, Perm::Read, &self.key, Some(Design::D))?;
        let mut page = [0u8; PAGE];
        let mut got = 0u64;
        for p in 0..npages {
            s.fault(p, &mut page)?;
            got = page[24..]
                .chunks_exact(8)
                .filter_map(|c| c.try_into().ok().map(u64::from_le_bytes))
                .fold(got, u64::wrapping_add);
        }
        s.detach().wait()?;
        let want = writes.load(Ordering::Relaxed);
        if got != want {
            return Err(TieringError::Lost {
                variant: variant.label(),
                got,
                want,
            });
        }
        Ok(TierCell {
            ns,
            ops: per_thread * threads as u64,
            faults: stats.faults.load(Ordering::Relaxed),
            promotions: tier.promotions_clean + tier.promotions_dirty,
            demotions: tier.demotions_clean + tier.demotions_dirty,
            bytes_moved: tier.bytes_moved(),
        })
    }
}

impl Drop for TierEnv {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether `path` holds [`MARKER`] anywhere (read in 16 MiB pieces with an overlap).
pub fn media_has_marker(path: &std::path::Path) -> std::io::Result<bool> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 16 << 20];
    let keep = MARKER.len() - 1;
    let mut have = 0;
    loop {
        let n = f.read(&mut buf[have..])?;
        if n == 0 {
            return Ok(false);
        }
        let end = have + n;
        if buf[..end].windows(MARKER.len()).any(|w| w == MARKER) {
            return Ok(true);
        }
        let tail = end.saturating_sub(keep);
        buf.copy_within(tail..end, 0);
        have = end - tail;
    }
}

#[cfg(test)]
mod tests {
    use super::access::Pattern;
    use super::*;

    #[test]
    fn a_small_cell_keeps_every_write_under_each_variant_and_leaves_no_plaintext() {
        let mut env = TierEnv::new(1 << 20, 1 << 20, 0).unwrap();
        let npages = 64;
        let pages = Pages::new(Pattern::HotSet, npages, 5);
        let variants = [
            Variant::AllDram,
            Variant::Budget {
                policy: "hotness",
                fraction: 0.25,
            },
            Variant::Budget {
                policy: "fifo",
                fraction: 0.125,
            },
        ];
        for v in variants {
            let c = env.run_cell(&pages, npages, 20_000, 2, v, 9).unwrap();
            assert_eq!(c.ops, 20_000);
            if v == Variant::AllDram {
                assert_eq!(c.promotions + c.demotions, 0);
                // Each thread may fault once on a page the other is faulting in.
                assert!(c.faults <= 2 * npages, "{c:?}");
            } else {
                assert!(c.demotions > 0, "{}: {c:?}", v.label());
            }
        }
        assert!(!media_has_marker(env.media()).unwrap());
    }

    #[test]
    fn the_marker_scan_finds_a_marker_across_a_piece_boundary() {
        let dir = std::env::temp_dir().join(format!("pmo-marker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("m");
        let mut data = vec![0u8; (16 << 20) + 64];
        let at = (16 << 20) - 7;
        data[at..at + 16].copy_from_slice(MARKER);
        std::fs::write(&f, &data).unwrap();
        assert!(media_has_marker(&f).unwrap());
        std::fs::write(&f, vec![0u8; 100]).unwrap();
        assert!(!media_has_marker(&f).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
