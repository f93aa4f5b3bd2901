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

// `x = x - a * b` is spelled out as in docs/workloads.md: the operation order is the definition
// (`-=` would compute the same, but the kernels should read like the spec they must match).
#![allow(clippy::assign_op_pattern)]

use crate::pmalloc::{self, HeapError};

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
/// The 2dConv blur weights (docs/workloads.md).
const W: [[f32; 3]; 3] = [[0.05, 0.1, 0.05], [0.1, 0.4, 0.1], [0.05, 0.1, 0.05]];
/// Seed of the random page-touch workload.
const RANDOM_SEED: u64 = 0x5eed_0005;

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

/// A SplitMix64 step: the random workloads' generator (fixed seed, reproducible).
pub(crate) fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs `work(t, item)` for every thread `t` in `0..items.len()`: thread 0 inline, the others
/// on scoped threads (host threads playing the vCPUs).
fn par<T: Send>(items: Vec<T>, work: impl Fn(usize, T) + Sync) -> Result<(), WorkloadError> {
    let work = &work;
    std::thread::scope(|s| {
        let mut it = items.into_iter().enumerate();
        let first = it.next();
        let handles: Vec<_> = it.map(|(t, x)| s.spawn(move || work(t, x))).collect();
        if let Some((t, x)) = first {
            work(t, x);
        }
        let mut ok = true;
        for h in handles {
            ok &= h.join().is_ok();
        }
        if ok {
            Ok(())
        } else {
            Err(WorkloadError::Thread)
        }
    })
}

/// Splits `rows` cyclically over `p` threads: row `r` to thread `r mod p`.
fn cyclic<T>(rows: impl Iterator<Item = T>, p: usize) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = (0..p).map(|_| Vec::new()).collect();
    for (r, x) in rows.enumerate() {
        if let Some(v) = out.get_mut(r % p) {
            v.push(x);
        }
    }
    out
}

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

fn conv_sweep(src: &[f32], dst: &mut [f32], n: usize, p: usize) -> Result<(), WorkloadError> {
    if src.len() != n * n || dst.len() != n * n {
        return Err(WorkloadError::Shape("2dconv", 0, src.len(), n * n));
    }
    let per = cyclic(dst.chunks_exact_mut(n).enumerate(), p);
    par(per, |_, rows| {
        for (i, row) in rows {
            let s = &src[i * n..(i + 1) * n];
            if i == 0 || i == n - 1 {
                row.copy_from_slice(s);
                continue;
            }
            let up = &src[(i - 1) * n..i * n];
            let dn = &src[(i + 1) * n..(i + 2) * n];
            row[0] = s[0];
            row[n - 1] = s[n - 1];
            for j in 1..n - 1 {
                let mut acc = 0.0f32;
                for (w, r) in W.iter().zip([up, s, dn]) {
                    acc = acc + w[0] * r[j - 1];
                    acc = acc + w[1] * r[j];
                    acc = acc + w[2] * r[j + 1];
                }
                row[j] = acc;
            }
        }
    })
}

fn gauss_step(
    m: &mut [f32],
    b: &mut [f32],
    n: usize,
    k: usize,
    p: usize,
) -> Result<(), WorkloadError> {
    if m.len() != n * n || b.len() != n || k + 1 >= n {
        return Err(WorkloadError::Shape("gauss", 0, m.len(), n * n));
    }
    let (head, tail) = m.split_at_mut((k + 1) * n);
    let pivot = &head[k * n..];
    let (bh, bt) = b.split_at_mut(k + 1);
    let bk = bh[k];
    let akk = pivot[k];
    let per = cyclic(tail.chunks_exact_mut(n).zip(bt.iter_mut()), p);
    par(per, |_, rows| {
        for (row, bi) in rows {
            let f = row[k] / akk;
            for (x, y) in row[k..].iter_mut().zip(&pivot[k..]) {
                *x = *x - f * *y;
            }
            *bi = *bi - f * bk;
        }
    })
}

fn back_substitute(m: &[f32], b: &[f32], x: &mut [f32], n: usize) {
    for i in (0..n).rev() {
        let (Some(row), Some(bi)) = (m.get(i * n..(i + 1) * n), b.get(i)) else {
            return;
        };
        let mut s = *bi;
        for j in i + 1..n {
            s = s - row[j] * x[j];
        }
        x[i] = s / row[i];
    }
}

fn lu_step(m: &mut [f32], n: usize, k: usize, p: usize) -> Result<(), WorkloadError> {
    if m.len() != n * n || k + 1 >= n {
        return Err(WorkloadError::Shape("lu", 0, m.len(), n * n));
    }
    let (head, tail) = m.split_at_mut((k + 1) * n);
    let pivot = &head[k * n..];
    let akk = pivot[k];
    let per = cyclic(tail.chunks_exact_mut(n), p);
    par(per, |_, rows| {
        for row in rows {
            let l = row[k] / akk;
            row[k] = l;
            for (x, y) in row[k + 1..].iter_mut().zip(&pivot[k + 1..]) {
                *x = *x - l * *y;
            }
        }
    })
}

fn tmm_band(
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    n: usize,
    t: usize,
    it: usize,
    p: usize,
) -> Result<(), WorkloadError> {
    let ii = it * t;
    if a.len() != n * n || b.len() != n * n || c.len() != n * n || ii + t > n {
        return Err(WorkloadError::Shape("tmm", 2, c.len(), n * n));
    }
    let tiles = n / t;
    // Column tile jj of every row of the band, grouped by tile: tile -> rows (i, chunk).
    let mut by_tile: Vec<Vec<(usize, &mut [f32])>> = (0..tiles).map(|_| Vec::new()).collect();
    for (r, row) in c[ii * n..(ii + t) * n].chunks_exact_mut(n).enumerate() {
        for (jt, chunk) in row.chunks_exact_mut(t).enumerate() {
            if let Some(v) = by_tile.get_mut(jt) {
                v.push((ii + r, chunk));
            }
        }
    }
    let per = cyclic(by_tile.into_iter().enumerate(), p);
    par(per, |_, tiles_of_thread| {
        for (jt, mut rows) in tiles_of_thread {
            let jj = jt * t;
            for kk in (0..n).step_by(t) {
                for (i, chunk) in rows.iter_mut() {
                    let arow = &a[*i * n + kk..*i * n + kk + t];
                    for (dj, cij) in chunk.iter_mut().enumerate() {
                        let mut s = *cij;
                        for (dk, aik) in arow.iter().enumerate() {
                            s = s + *aik * b[(kk + dk) * n + jj + dj];
                        }
                        *cij = s;
                    }
                }
            }
        }
    })
}

fn seq_segment(w: &mut [u64], seg: usize, s: usize, p: usize) -> Result<(), WorkloadError> {
    let pages = w.len() / WORDS;
    if (s + 1) * seg > pages {
        return Err(WorkloadError::Shape("seq", 0, pages, (s + 1) * seg));
    }
    let first = s * seg;
    let region = &mut w[first * WORDS..(first + seg) * WORDS];
    // Contiguous halves: each thread walks its own part in order.
    let per_thread = seg.div_ceil(p) * WORDS;
    let items: Vec<(usize, &mut [u64])> = region
        .chunks_mut(per_thread.max(WORDS))
        .enumerate()
        .map(|(t, c)| (first + t * seg.div_ceil(p), c))
        .collect();
    par(items, |_, (base, words)| {
        for (i, page) in words.chunks_exact_mut(WORDS).enumerate() {
            let sum = page.iter().fold(0u64, |a, x| a.wrapping_add(*x));
            if (base + i) % 16 == 0 {
                page[0] = page[0].wrapping_add(sum);
            }
        }
    })
}

fn random_touches(w: &mut [u64], touches: usize, it: u64, p: usize) -> Result<(), WorkloadError> {
    let pages = w.len() / WORDS;
    let own = pages / p;
    if own == 0 {
        return Err(WorkloadError::Params(
            "random",
            "fewer pages than threads".into(),
        ));
    }
    // Thread t owns the pages p ≡ t (mod P), so no page is written by two threads.
    let mut per: Vec<Vec<&mut [u64]>> = (0..p).map(|_| Vec::new()).collect();
    for (i, page) in w.chunks_exact_mut(WORDS).enumerate() {
        if let Some(v) = per.get_mut(i % p) {
            v.push(page);
        }
    }
    let each = touches.div_ceil(p);
    par(per, |t, mut mine| {
        let mut state = RANDOM_SEED ^ (it << 16) ^ t as u64;
        for _ in 0..each {
            let r = splitmix(&mut state);
            let idx = (r % own as u64) as usize;
            if let Some(page) = mine.get_mut(idx) {
                let word = 1 + ((r >> 40) as usize % (WORDS - 1));
                let x = page[word];
                page[0] = page[0].wrapping_add(x ^ r);
            }
        }
    })
}

/// Page-aligned plain memory: the reference run and the compute baseline.
pub struct PlainMem(Vec<u64>);

impl PlainMem {
    /// `bytes` of zeroed memory, every page touched (resident) before any timing.
    pub fn new(bytes: usize) -> Self {
        let mut v = vec![0u64; bytes.div_ceil(8)];
        for x in v.iter_mut().step_by(WORDS) {
            // Touch each page so later timings see resident memory.
            // SAFETY: a valid, aligned element of the vector.
            unsafe { std::ptr::write_volatile(x, 0) };
        }
        PlainMem(v)
    }

    /// The bytes.
    pub fn bytes(&mut self) -> &mut [u8] {
        let len = self.0.len() * 8;
        // SAFETY: the vector's storage viewed as bytes (u8 has no alignment or validity needs);
        // the borrow of `self` keeps it alive and unaliased.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a workload in plain memory; returns its checksum.
    fn run(w: &Workload, threads: usize) -> u64 {
        let mut m = PlainMem::new(w.pmo_bytes());
        w.init(m.bytes()).unwrap();
        for it in 0..w.iters() {
            w.run_iter(m.bytes(), it, threads).unwrap();
        }
        w.checksum(m.bytes(), w.iters()).unwrap()
    }

    /// Straightforward reference implementations of the four microbenchmarks on Vecs.
    fn reference(w: &Workload) -> Vec<f32> {
        match *w {
            Workload::Conv2d { n, sweeps } => {
                let mut a: Vec<f32> = (0..n * n).map(|x| v(x / n, x % n, 1)).collect();
                let mut b = vec![0.0f32; n * n];
                for t in 0..sweeps {
                    let (src, dst) = if t % 2 == 0 {
                        (&a, &mut b)
                    } else {
                        (&b, &mut a)
                    };
                    for i in 0..n {
                        for j in 0..n {
                            if i == 0 || j == 0 || i == n - 1 || j == n - 1 {
                                dst[i * n + j] = src[i * n + j];
                                continue;
                            }
                            let mut acc = 0.0f32;
                            for di in 0..3 {
                                for dj in 0..3 {
                                    acc = acc + W[di][dj] * src[(i + di - 1) * n + j + dj - 1];
                                }
                            }
                            dst[i * n + j] = acc;
                        }
                    }
                }
                if sweeps % 2 == 1 {
                    b
                } else {
                    a
                }
            }
            Workload::Gauss { n } => {
                let mut a = dominant(n);
                let mut b: Vec<f32> = (0..n).map(|i| v(i, 0, 3)).collect();
                let mut x = vec![0.0f32; n];
                for k in 0..n - 1 {
                    for i in k + 1..n {
                        let f = a[i * n + k] / a[k * n + k];
                        for j in k..n {
                            a[i * n + j] = a[i * n + j] - f * a[k * n + j];
                        }
                        b[i] = b[i] - f * b[k];
                    }
                }
                for i in (0..n).rev() {
                    let mut s = b[i];
                    for j in i + 1..n {
                        s = s - a[i * n + j] * x[j];
                    }
                    x[i] = s / a[i * n + i];
                }
                a.extend(b);
                a.extend(x);
                a
            }
            Workload::Lu { n } => {
                let mut a = dominant(n);
                for k in 0..n - 1 {
                    for i in k + 1..n {
                        a[i * n + k] = a[i * n + k] / a[k * n + k];
                        for j in k + 1..n {
                            a[i * n + j] = a[i * n + j] - a[i * n + k] * a[k * n + j];
                        }
                    }
                }
                a
            }
            Workload::Tmm { n, .. } => {
                let a: Vec<f32> = (0..n * n).map(|x| v(x / n, x % n, 1)).collect();
                let b: Vec<f32> = (0..n * n).map(|x| v(x / n, x % n, 2)).collect();
                let mut c = vec![0.0f32; n * n];
                for i in 0..n {
                    for j in 0..n {
                        let mut s = 0.0f32;
                        for k in 0..n {
                            s = s + a[i * n + k] * b[k * n + j];
                        }
                        c[i * n + j] = s;
                    }
                }
                c
            }
            _ => unreachable!(),
        }
    }

    fn dominant(n: usize) -> Vec<f32> {
        let mut a: Vec<f32> = (0..n * n).map(|x| v(x / n, x % n, 1)).collect();
        for i in 0..n {
            a[i * n + i] += n as f32;
        }
        a
    }

    fn fnv_f32(v: &[f32]) -> u64 {
        v.iter().fold(FNV_BASIS, |h, x| fnv1a(h, &x.to_le_bytes()))
    }

    #[test]
    fn kernels_match_plain_references_bit_for_bit_with_one_and_two_threads() {
        for w in [
            Workload::Conv2d { n: 17, sweeps: 3 },
            Workload::Conv2d { n: 9, sweeps: 4 },
            Workload::Gauss { n: 23 },
            Workload::Lu { n: 21 },
            Workload::Tmm { n: 24, tile: 8 },
        ] {
            let want = fnv_f32(&reference(&w));
            assert_eq!(run(&w, 1), want, "{w:?} 1 thread");
            assert_eq!(run(&w, 2), want, "{w:?} 2 threads");
        }
    }

    /// Plain-loop references of `seq` and `random` over the initial words.
    fn scan_reference(w: &Workload, threads: usize) -> u64 {
        let (pages, words) = match *w {
            Workload::Seq { pages, .. } | Workload::Random { pages, .. } => (pages, pages * WORDS),
            _ => unreachable!(),
        };
        let mut m: Vec<u64> = (0..words as u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        match *w {
            Workload::Seq { seg, .. } => {
                for it in 0..w.iters() as usize {
                    let s = it % (pages / seg);
                    for p in s * seg..(s + 1) * seg {
                        let sum = m[p * WORDS..(p + 1) * WORDS]
                            .iter()
                            .fold(0u64, |a, x| a.wrapping_add(*x));
                        if p % 16 == 0 {
                            m[p * WORDS] = m[p * WORDS].wrapping_add(sum);
                        }
                    }
                }
            }
            Workload::Random { touches, .. } => {
                let own = pages / threads;
                for it in 0..w.iters() {
                    for t in 0..threads {
                        let mut state = RANDOM_SEED ^ (it << 16) ^ t as u64;
                        for _ in 0..touches.div_ceil(threads) {
                            let r = splitmix(&mut state);
                            let p = (r % own as u64) as usize * threads + t;
                            let word = 1 + ((r >> 40) as usize % (WORDS - 1));
                            let x = m[p * WORDS + word];
                            m[p * WORDS] = m[p * WORDS].wrapping_add(x ^ r);
                        }
                    }
                }
            }
            _ => unreachable!(),
        }
        m.iter().fold(FNV_BASIS, |h, x| fnv1a(h, &x.to_le_bytes()))
    }

    #[test]
    fn seq_and_random_match_plain_loop_references() {
        let seq = Workload::Seq {
            pages: 48,
            seg: 16,
            passes: 2,
        };
        let random = Workload::Random {
            pages: 40,
            touches: 37,
            iters: 3,
        };
        for threads in [1, 2] {
            assert_eq!(run(&seq, threads), scan_reference(&seq, threads));
            assert_eq!(run(&random, threads), scan_reference(&random, threads));
        }
    }

    #[test]
    fn seq_and_random_are_deterministic_and_change_the_data() {
        for w in [
            Workload::Seq {
                pages: 32,
                seg: 8,
                passes: 2,
            },
            Workload::Random {
                pages: 32,
                touches: 50,
                iters: 3,
            },
        ] {
            let mut m = PlainMem::new(w.pmo_bytes());
            w.init(m.bytes()).unwrap();
            let before = w.checksum(m.bytes(), 0).unwrap();
            for threads in [1, 2] {
                assert_eq!(run(&w, threads), run(&w, threads));
            }
            assert_ne!(run(&w, 1), before, "{w:?} wrote nothing");
        }
        // Seq's result does not depend on the split.
        let w = Workload::Seq {
            pages: 32,
            seg: 8,
            passes: 2,
        };
        assert_eq!(run(&w, 1), run(&w, 2));
    }

    #[test]
    fn checksums_match_the_guest_pmo_bench_pinned_values() {
        // guest/bench/test_kernels.c pins these for the same definitions (docs/workloads.md):
        // host harness and guest must stay bit-identical.
        for (w, want) in [
            (
                Workload::Conv2d { n: 16, sweeps: 4 },
                0x40fb_36dd_42f6_ee9a_u64,
            ),
            (Workload::Gauss { n: 16 }, 0x0e94_c06d_38df_3446),
            (Workload::Lu { n: 16 }, 0x9226_7288_e96c_846a),
            (Workload::Tmm { n: 16, tile: 4 }, 0xa8e2_6d6b_00c0_cf48),
        ] {
            assert_eq!(run(&w, 1), want, "{w:?}");
            assert_eq!(run(&w, 2), want, "{w:?}");
        }
        assert_eq!(fnv1a(FNV_BASIS, b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn paper_sizes_are_valid_and_only_for_the_papers_kernels() {
        for name in NAMES {
            match Workload::paper(name) {
                Some(w) => {
                    assert_eq!(w.name(), name);
                    w.check().unwrap();
                    // Each is more work than the preset (2dConv: the same image, 32x the
                    // sweeps) and fits this 24 GiB host many times.
                    let preset = Workload::preset(name, false).unwrap();
                    assert!(w.iters() > preset.iters(), "{name}");
                    assert!(w.pmo_bytes() >= preset.pmo_bytes(), "{name}");
                    assert!(w.pmo_bytes() < 1 << 30, "{name}: {}", w.pmo_bytes());
                }
                None => assert!(["seq", "random"].contains(&name), "{name}"),
            }
        }
    }

    #[test]
    fn damaged_heap_or_bad_params_are_errors() {
        let w = Workload::Lu { n: 8 };
        let mut m = PlainMem::new(w.pmo_bytes());
        assert!(w.run_iter(m.bytes(), 0, 1).is_err(), "no heap yet");
        w.init(m.bytes()).unwrap();
        assert!(
            w.run_iter(m.bytes(), 7, 1).is_err(),
            "beyond the iterations"
        );
        m.bytes()[0] ^= 0xff;
        assert!(w.run_iter(m.bytes(), 0, 1).is_err());
        assert!(Workload::Tmm { n: 10, tile: 3 }.init(m.bytes()).is_err());
    }
}
