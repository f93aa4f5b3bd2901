//! The kernels of the workloads: one iteration of each over its arrays, and how an
//! iteration's rows, tiles or pages are split over the host threads that play the vCPUs.
//! The operation order is the definition (docs/workloads.md): host harness and guest
//! `pmo_bench` must stay bit-identical.

// `x = x - a * b` is spelled out as in docs/workloads.md: the operation order is the definition
// (`-=` would compute the same, but the kernels should read like the spec they must match).
#![allow(clippy::assign_op_pattern)]

use super::{WorkloadError, WORDS};

/// The 2dConv blur weights (docs/workloads.md).
pub(super) const W: [[f32; 3]; 3] = [[0.05, 0.1, 0.05], [0.1, 0.4, 0.1], [0.05, 0.1, 0.05]];
/// Seed of the random page-touch workload.
pub(super) const RANDOM_SEED: u64 = 0x5eed_0005;

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

pub(super) fn conv_sweep(
    src: &[f32],
    dst: &mut [f32],
    n: usize,
    p: usize,
) -> Result<(), WorkloadError> {
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

pub(super) fn gauss_step(
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

pub(super) fn back_substitute(m: &[f32], b: &[f32], x: &mut [f32], n: usize) {
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

pub(super) fn lu_step(m: &mut [f32], n: usize, k: usize, p: usize) -> Result<(), WorkloadError> {
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

pub(super) fn tmm_band(
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

pub(super) fn seq_segment(
    w: &mut [u64],
    seg: usize,
    s: usize,
    p: usize,
) -> Result<(), WorkloadError> {
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

pub(super) fn random_touches(
    w: &mut [u64],
    touches: usize,
    it: u64,
    p: usize,
) -> Result<(), WorkloadError> {
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
