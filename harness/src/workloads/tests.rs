//! The kernels against plain-loop references, the guest's pinned checksums, presets and
//! errors.

// The references spell `x = x - a * b` out as docs/workloads.md does, like the kernels.
#![allow(clippy::assign_op_pattern)]

use super::kernels::{RANDOM_SEED, W};
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
