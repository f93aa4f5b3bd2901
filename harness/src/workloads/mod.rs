//! The workloads: the papers' four microbenchmarks plus a sequential scan and a random page
//! touch, as kernels over a PMO's bytes.
//!
//! The four microbenchmarks follow docs/workloads.md exactly (initial values, operation order,
//! thread split, FNV-1a checksum), so the host harness and the guest `pmo_bench` give
//! bit-identical results. The two extra workloads exist for the predictor targets: `seq`
//! is the easy case for a stream buffer, `random` the case where prediction can only waste work.
//!
//! A workload's state lives entirely in the PMO (arrays found through the in-PMO heap of
//! [`crate::pmalloc`]); an iteration takes the PMO's bytes afresh, so a run continues after a
//! detach and re-attach at another window address.
//!
//! Here: what a workload is (kinds, sizes, presets) and one run over a PMO's bytes (heap
//! layout, initial values, iterations, checksum). Beside it: `kernels.rs` (one iteration of
//! each kernel and its split over threads), `plain.rs` (plain memory for the reference run).

use crate::pmalloc::{self, HeapError};

mod kernels;
mod plain;
#[cfg(test)]
mod tests;

pub(crate) use kernels::splitmix;
pub use plain::PlainMem;

use kernels::{
    back_substitute, conv_sweep, gauss_step, lu_step, random_touches, seq_segment, tmm_band,
};

/// Errors of the workloads.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The in-PMO heap refused an allocation or lookup.
    #[error("heap: {0}")]
    Heap(#[from] HeapError),
    /// A workload found an array of another size than its parameters imply.
    #[error("{0}: array {1} has {2} elements, expected {3}")]
    Shape(&'static str, usize, usize, usize),
    /// The size parameters are zero, too large, or inconsistent with each other.
    #[error("{0}: bad parameters: {1}")]
    Params(&'static str, String),
    /// The caller asked for an iteration past the workload's last one.
    #[error("iteration {0} beyond the {1} iterations of the workload")]
    Iteration(u64, u64),
    /// A worker thread of a multi-threaded workload panicked.
    #[error("a workload thread panicked")]
    Thread,
}

/// The kinds of workload the harness knows, by command-line name.
pub const NAMES: [&str; 6] = ["2dconv", "gauss", "lu", "tmm", "seq", "random"];

/// One workload and its size parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Workload {
    /// 3×3 stencil over an `n`×`n` f32 image, `sweeps` ping-pong sweeps (one per iteration).
    Conv2d {
        /// Image side, in elements.
        n: usize,
        /// Number of sweeps (iterations).
        sweeps: usize,
    },
    /// Gaussian elimination with right-hand side and back substitution (`n` iterations).
    Gauss {
        /// Order of the linear system.
        n: usize,
    },
    /// In-place Doolittle LU (`n - 1` iterations).
    Lu {
        /// Order of the square matrix.
        n: usize,
    },
    /// Tiled `C = A·B`, one row band of `tile` rows per iteration.
    Tmm {
        /// Order of the square matrices.
        n: usize,
        /// Rows per band (and tile side).
        tile: usize,
    },
    /// Sequential scan of `pages` pages, `seg` pages per iteration, `passes` times over; reads
    /// every word, writes one word in every 16th page.
    Seq {
        /// Pages scanned.
        pages: usize,
        /// Pages per iteration.
        seg: usize,
        /// Times the whole range is scanned.
        passes: usize,
    },
    /// `touches` random page touches per iteration (fixed seed), `iters` iterations; each touch
    /// reads a word of the page and updates the page's first word.
    Random {
        /// Pages the touches are drawn from.
        pages: usize,
        /// Touches per iteration.
        touches: usize,
        /// Number of iterations.
        iters: usize,
    },
}

const PAGE: usize = 4096;
const WORDS: usize = PAGE / 8;
const F32: usize = 4;

/// Initial value of an array with seed `s` at `(i, j)` (docs/workloads.md).
fn v(i: usize, j: usize, s: usize) -> f32 {
    let k = (i as u64 * 31 + j as u64 * 17 + s as u64) % 1000 + 1;
    k as f32 / 1000.0f32
}

/// Fills an `n`×`n` matrix with `v(i, j, s)`; diagonally dominant if `dominant`.
fn fill(m: &mut [f32], n: usize, s: usize, dominant: bool) {
    for (i, row) in m.chunks_exact_mut(n).enumerate() {
        for (j, x) in row.iter_mut().enumerate() {
            *x = v(i, j, s);
        }
        if dominant {
            if let Some(d) = row.get_mut(i) {
                *d += n as f32;
            }
        }
    }
}

/// FNV-1a 64 over bytes, continuing from `h`.
pub fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// FNV-1a offset basis.
pub const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

impl Workload {
    /// Parses a workload name with the given size preset (`quick` for the tiny sizes).
    pub fn preset(name: &str, quick: bool) -> Option<Workload> {
        Some(match (name, quick) {
            ("2dconv", false) => Workload::Conv2d { n: 1024, sweeps: 8 },
            ("2dconv", true) => Workload::Conv2d { n: 128, sweeps: 4 },
            ("gauss", false) => Workload::Gauss { n: 1024 },
            ("gauss", true) => Workload::Gauss { n: 96 },
            ("lu", false) => Workload::Lu { n: 1024 },
            ("lu", true) => Workload::Lu { n: 96 },
            ("tmm", false) => Workload::Tmm { n: 512, tile: 16 },
            ("tmm", true) => Workload::Tmm { n: 64, tile: 8 },
            ("seq", false) => Workload::Seq {
                pages: 8192,
                seg: 512,
                passes: 2,
            },
            ("seq", true) => Workload::Seq {
                pages: 256,
                seg: 32,
                passes: 2,
            },
            ("random", false) => Workload::Random {
                pages: 8192,
                touches: 1024,
                iters: 32,
            },
            ("random", true) => Workload::Random {
                pages: 256,
                touches: 64,
                iters: 8,
            },
            _ => return None,
        })
    }

    /// The papers' size of a microbenchmark (`--paper-sizes`), or `None` for the two scans,
    /// which are ours. 2dConv, LU and TMM take LPMO's sizes (Table 3: 256x1024 read as 256
    /// sweeps over a 1024x1024 image, LU 6144, TMM 4096 with 16-row tiles); Gauss takes
    /// LOaPP's 8192, because LPMO's 18432 (25x the work) would take about 20 minutes a cell
    /// on this 2-core host (docs/compare.md).
    pub fn paper(name: &str) -> Option<Workload> {
        Some(match name {
            "2dconv" => Workload::Conv2d {
                n: 1024,
                sweeps: 256,
            },
            "gauss" => Workload::Gauss { n: 8192 },
            "lu" => Workload::Lu { n: 6144 },
            "tmm" => Workload::Tmm { n: 4096, tile: 16 },
            _ => return None,
        })
    }

    /// The same workload with its main size replaced: the matrix order N (2dConv, Gauss, LU,
    /// TMM) or the number of pages (`seq`: segments of N/16 pages; `random`). Checked when run.
    pub fn with_size(&self, size: usize) -> Workload {
        match self.clone() {
            Workload::Conv2d { sweeps, .. } => Workload::Conv2d { n: size, sweeps },
            Workload::Gauss { .. } => Workload::Gauss { n: size },
            Workload::Lu { .. } => Workload::Lu { n: size },
            Workload::Tmm { tile, .. } => Workload::Tmm { n: size, tile },
            Workload::Seq { passes, .. } => Workload::Seq {
                pages: size,
                seg: (size / 16).max(1),
                passes,
            },
            Workload::Random { touches, iters, .. } => Workload::Random {
                pages: size,
                touches,
                iters,
            },
        }
    }

    /// Command-line name.
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Conv2d { .. } => "2dconv",
            Workload::Gauss { .. } => "gauss",
            Workload::Lu { .. } => "lu",
            Workload::Tmm { .. } => "tmm",
            Workload::Seq { .. } => "seq",
            Workload::Random { .. } => "random",
        }
    }

    /// Size parameters, for reports.
    pub fn params(&self) -> String {
        match self {
            Workload::Conv2d { n, sweeps } => format!("N={n} M={sweeps}"),
            Workload::Gauss { n } | Workload::Lu { n } => format!("N={n}"),
            Workload::Tmm { n, tile } => format!("N={n} T={tile}"),
            Workload::Seq { pages, seg, passes } => {
                format!("{pages} pages, {seg}/iter, {passes} passes")
            }
            Workload::Random {
                pages,
                touches,
                iters,
            } => format!("{pages} pages, {touches} touches x {iters}"),
        }
    }

    /// Number of iterations of the outer loop (the unit of the psync cadence).
    pub fn iters(&self) -> u64 {
        (match *self {
            Workload::Conv2d { sweeps, .. } => sweeps,
            Workload::Gauss { n } => n,
            Workload::Lu { n } => n.saturating_sub(1),
            Workload::Tmm { n, tile } => n.checked_div(tile).unwrap_or(0),
            Workload::Seq { pages, seg, passes } => pages.checked_div(seg).unwrap_or(0) * passes,
            Workload::Random { iters, .. } => iters,
        }) as u64
    }

    /// The psync cadence (iterations per psync) giving about eight psyncs per run.
    pub fn default_cadence(&self) -> u64 {
        (self.iters() / 8).max(1)
    }

    /// Validates the parameters.
    pub fn check(&self) -> Result<(), WorkloadError> {
        let bad = |why: &str| Err(WorkloadError::Params(self.name(), why.to_string()));
        match *self {
            Workload::Conv2d { n, sweeps } if n < 3 || sweeps == 0 => bad("N >= 3, M >= 1"),
            Workload::Gauss { n } | Workload::Lu { n } if n < 2 => bad("N >= 2"),
            Workload::Tmm { n, tile } if tile == 0 || n == 0 || n % tile != 0 => {
                bad("N a multiple of T")
            }
            Workload::Seq { pages, seg, passes }
                if seg == 0 || passes == 0 || pages == 0 || pages % seg != 0 =>
            {
                bad("pages a multiple of the segment")
            }
            Workload::Random {
                pages,
                touches,
                iters,
            } if pages < 2 || touches == 0 || iters == 0 => bad("pages >= 2"),
            _ => Ok(()),
        }
    }

    /// Byte sizes of the arrays, in allocation order.
    fn alloc_lens(&self) -> Vec<usize> {
        match *self {
            Workload::Conv2d { n, .. } => vec![n * n * F32; 2],
            Workload::Gauss { n } => vec![n * n * F32, n * F32, n * F32],
            Workload::Lu { n } => vec![n * n * F32],
            Workload::Tmm { n, .. } => vec![n * n * F32; 3],
            Workload::Seq { pages, .. } | Workload::Random { pages, .. } => vec![pages * PAGE],
        }
    }

    /// Size of the PMO the workload needs (heap header and block headers included), in bytes.
    pub fn pmo_bytes(&self) -> usize {
        pmalloc::heap_size(&self.alloc_lens()).next_multiple_of(PAGE)
    }

    /// Formats the heap in `mem`, allocates the arrays and writes their initial values.
    pub fn init(&self, mem: &mut [u8]) -> Result<(), WorkloadError> {
        self.check()?;
        pmalloc::format(mem)?;
        let lens = self.alloc_lens();
        for len in &lens {
            pmalloc::p_malloc(mem, *len)?;
        }
        match *self {
            Workload::Conv2d { n, .. } => {
                let mut a = self.views(mem, lens.len())?;
                fill(a[0], n, 1, false);
                a[1].fill(0.0);
            }
            Workload::Gauss { n } => {
                let mut a = self.views(mem, lens.len())?;
                fill(a[0], n, 1, true);
                for (i, b) in a[1].iter_mut().enumerate() {
                    *b = v(i, 0, 3);
                }
                a[2].fill(0.0);
            }
            Workload::Lu { n } => {
                let mut a = self.views(mem, lens.len())?;
                fill(a[0], n, 1, true);
            }
            Workload::Tmm { n, .. } => {
                let mut a = self.views(mem, lens.len())?;
                fill(a[0], n, 1, false);
                fill(a[1], n, 2, false);
                a[2].fill(0.0);
            }
            Workload::Seq { .. } | Workload::Random { .. } => {
                let w = pmalloc::u64_view(mem, 0)?;
                for (i, x) in w.iter_mut().enumerate() {
                    *x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                }
            }
        }
        Ok(())
    }

    /// The f32 arrays, each checked against the shape the parameters give.
    fn views<'a>(&self, mem: &'a mut [u8], k: usize) -> Result<Vec<&'a mut [f32]>, WorkloadError> {
        let lens = self.alloc_lens();
        let views = pmalloc::f32_views(mem, k)?;
        for (i, (v, len)) in views.iter().zip(&lens).enumerate() {
            if v.len() * F32 != *len {
                return Err(WorkloadError::Shape(self.name(), i, v.len(), len / F32));
            }
        }
        Ok(views)
    }

    /// Runs iteration `it` over the PMO's bytes with `threads` threads.
    pub fn run_iter(&self, mem: &mut [u8], it: u64, threads: usize) -> Result<(), WorkloadError> {
        self.check()?;
        if it >= self.iters() {
            return Err(WorkloadError::Iteration(it, self.iters()));
        }
        let p = threads.max(1);
        let k = it as usize;
        match *self {
            Workload::Conv2d { n, .. } => {
                let mut a = self.views(mem, 2)?.into_iter();
                let (Some(x), Some(y)) = (a.next(), a.next()) else {
                    return Err(WorkloadError::Shape(self.name(), 0, 0, n * n));
                };
                let (src, dst): (&[f32], &mut [f32]) =
                    if k.is_multiple_of(2) { (x, y) } else { (y, x) };
                conv_sweep(src, dst, n, p)
            }
            Workload::Gauss { n } => {
                let mut a = self.views(mem, 3)?.into_iter();
                let (Some(m), Some(b), Some(x)) = (a.next(), a.next(), a.next()) else {
                    return Err(WorkloadError::Shape(self.name(), 0, 0, n * n));
                };
                if k + 1 < n {
                    gauss_step(m, b, n, k, p)
                } else {
                    back_substitute(m, b, x, n);
                    Ok(())
                }
            }
            Workload::Lu { n } => {
                let m = self
                    .views(mem, 1)?
                    .into_iter()
                    .next()
                    .ok_or(WorkloadError::Shape(self.name(), 0, 0, n * n))?;
                lu_step(m, n, k, p)
            }
            Workload::Tmm { n, tile } => {
                let mut a = self.views(mem, 3)?.into_iter();
                let (Some(am), Some(bm), Some(cm)) = (a.next(), a.next(), a.next()) else {
                    return Err(WorkloadError::Shape(self.name(), 0, 0, n * n));
                };
                tmm_band(am, bm, cm, n, tile, k, p)
            }
            Workload::Seq { seg, pages, .. } => {
                let w = pmalloc::u64_view(mem, 0)?;
                if w.len() != pages * WORDS {
                    return Err(WorkloadError::Shape(self.name(), 0, w.len(), pages * WORDS));
                }
                seq_segment(w, seg, k % (pages / seg), p)
            }
            Workload::Random { pages, touches, .. } => {
                let w = pmalloc::u64_view(mem, 0)?;
                if w.len() != pages * WORDS {
                    return Err(WorkloadError::Shape(self.name(), 0, w.len(), pages * WORDS));
                }
                random_touches(w, touches, k as u64, p)
            }
        }
    }

    /// The checksum of the workload's output (docs/workloads.md for the four microbenchmarks;
    /// the whole region for `seq` and `random`). `finished_iters` picks 2dConv's output array.
    pub fn checksum(&self, mem: &[u8], finished_iters: u64) -> Result<u64, WorkloadError> {
        let outputs: Vec<usize> = match *self {
            Workload::Conv2d { .. } => vec![if finished_iters % 2 == 1 { 1 } else { 0 }],
            Workload::Gauss { .. } => vec![0, 1, 2],
            Workload::Lu { .. } | Workload::Seq { .. } | Workload::Random { .. } => vec![0],
            Workload::Tmm { .. } => vec![2],
        };
        let mut h = FNV_BASIS;
        for i in outputs {
            let r = pmalloc::region(mem, i)?;
            h = fnv1a(h, mem.get(r).ok_or(HeapError::Damaged(i))?);
        }
        Ok(h)
    }
}
