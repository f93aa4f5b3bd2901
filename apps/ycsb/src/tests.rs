//! Tests of the C generator through its Rust wrapper: the operation mix, the distributions and
//! the keys against YCSB's `CoreWorkload` definitions, determinism and the field format.
//! Expected values are computed here independently (own FNV, own zeta sums), not by asking
//! the C code.

use super::generator::check_layout;
use super::*;
use std::collections::{HashMap, HashSet};

/// YCSB's `Utils.fnvhash64`, written again from its definition.
fn fnv_ref(mut val: u64) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for _ in 0..8 {
        h ^= val & 0xff;
        val >>= 8;
        h = h.wrapping_mul(1_099_511_628_211);
    }
    (h as i64).unsigned_abs()
}

/// sum_{i=1}^{n} i^-theta.
fn zeta_ref(n: u64, theta: f64) -> f64 {
    (1..=n).map(|i| (i as f64).powf(-theta)).sum()
}

/// The exact output distribution of Gray's algorithm as YCSB's `ZipfianGenerator.nextLong`
/// implements it, derived here from the formula (not from the C code): u < 1/zetan gives item
/// 0, u < zeta(2)/zetan item 1, otherwise floor(n * (eta*u - eta + 1)^alpha). Items 0 and 1
/// get exactly the zipfian mass; later items get Gray's continuous approximation of it.
struct GrayRef {
    n: f64,
    zetan: f64,
    zeta2: f64,
    eta: f64,
    theta: f64,
}

impl GrayRef {
    fn new(items: u64, theta: f64, zetan: f64) -> GrayRef {
        let n = items as f64;
        let zeta2 = 1.0 + 2f64.powf(-theta);
        let eta = (1.0 - (2.0 / n).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        GrayRef {
            n,
            zetan,
            zeta2,
            eta,
            theta,
        }
    }

    /// The u at which the formula reaches y: x(u) >= y iff u >= u_at(y).
    fn u_at(&self, y: f64) -> f64 {
        1.0 - (1.0 - (y / self.n).powf(1.0 - self.theta)) / self.eta
    }

    /// P(lo <= item < hi).
    fn mass(&self, lo: u64, hi: u64) -> f64 {
        let mut p = 0.0;
        if lo == 0 && hi > 0 {
            p += 1.0 / self.zetan;
        }
        if lo <= 1 && hi > 1 {
            p += (self.zeta2 - 1.0) / self.zetan;
        }
        let a = self.u_at(lo as f64).max(self.zeta2 / self.zetan);
        let b = self.u_at(hi as f64).min(1.0);
        p + (b - a).max(0.0)
    }
}

/// An acceptance band for an observed share of DRAWS draws: 5 binomial sigmas plus slack.
fn band(p: f64, draws: u64) -> f64 {
    5.0 * (p * (1.0 - p) / draws as f64).sqrt() + 1e-4
}

/// The shares of YCSB's workload files, by OpKind order.
fn ycsb_mix(w: Workload) -> [f64; 5] {
    match w {
        Workload::A => [0.5, 0.5, 0.0, 0.0, 0.0],
        Workload::B => [0.95, 0.05, 0.0, 0.0, 0.0],
        Workload::C => [1.0, 0.0, 0.0, 0.0, 0.0],
        Workload::D => [0.95, 0.0, 0.05, 0.0, 0.0],
        Workload::E => [0.0, 0.0, 0.05, 0.95, 0.0],
        Workload::F => [0.5, 0.0, 0.0, 0.0, 0.5],
    }
}

fn opts(ops: u64) -> Options {
    Options {
        ops,
        ..Options::default()
    }
}

#[test]
fn op_mix_matches_the_workload_files() {
    const N: u64 = 1_000_000;
    for w in Workload::ALL {
        let mut g = Generator::with_options(w, 10_000, 11, opts(N)).unwrap();
        let mut counts = [0u64; 5];
        for _ in 0..N {
            counts[g.next_op().kind() as usize] += 1;
        }
        let want = ycsb_mix(w);
        for k in OpKind::ALL {
            let share = counts[k as usize] as f64 / N as f64;
            // The binomial standard deviation is at most 0.0005 at N = 10^6: 0.003 is 6 sigma.
            assert!(
                (share - want[k as usize]).abs() < 0.003,
                "{w}: {} share {share}, YCSB {}",
                k.name(),
                want[k as usize]
            );
            if want[k as usize] == 0.0 {
                assert_eq!(counts[k as usize], 0, "{w}: no {} expected", k.name());
            }
            assert_eq!(w.proportion(k), want[k as usize]);
        }
    }
}

#[test]
fn unscrambled_zipfian_head_matches_theory() {
    const N: u64 = 1000;
    const DRAWS: u64 = 2_000_000;
    let mut z = Zipfian::new(0, N - 1, ZIPFIAN_CONSTANT, 3).unwrap();
    let mut counts = vec![0u64; N as usize];
    for _ in 0..DRAWS {
        let v = z.next_item();
        assert!(v < N);
        counts[v as usize] += 1;
    }
    let zn = zeta_ref(N, ZIPFIAN_CONSTANT);
    let p = |i: u64| (i as f64).powf(-ZIPFIAN_CONSTANT) / zn;
    let share = |i: usize| counts[i] as f64 / DRAWS as f64;
    // Gray's algorithm is exact for the first two items: 1/zeta(n) and 2^-theta/zeta(n).
    // sigma <= 0.00024 at 2*10^6 draws; 0.0015 is over 6 sigma.
    assert!(
        (share(0) - p(1)).abs() < 0.0015,
        "item 0: {} vs {}",
        share(0),
        p(1)
    );
    assert!(
        (share(1) - p(2)).abs() < 0.0015,
        "item 1: {} vs {}",
        share(1),
        p(2)
    );
    // Beyond them it is Gray's continuous approximation, which YCSB uses as is: each of the
    // first 50 items, and the head masses, follow that distribution.
    let gray = GrayRef::new(N, ZIPFIAN_CONSTANT, zn);
    for i in 0..50u64 {
        let want = gray.mass(i, i + 1);
        let got = share(i as usize);
        assert!(
            (got - want).abs() < band(want, DRAWS),
            "item {i}: {got} vs {want}"
        );
    }
    for k in [10u64, 100, 500] {
        let got: f64 = (0..k as usize).map(share).sum();
        let want = gray.mass(0, k);
        assert!(
            (got - want).abs() < band(want, DRAWS),
            "top {k}: {got} vs {want}"
        );
        // ... which stays close to the true zipfian law.
        let exact: f64 = (1..=k).map(p).sum();
        assert!(
            (want - exact).abs() < 0.02,
            "top {k}: Gray {want} vs zipf {exact}"
        );
    }
    // And the popularity falls with the rank.
    assert!(counts[0] > counts[1] && counts[1] > counts[2] && counts[2] > counts[10]);
    assert!(counts[10] > counts[100] && counts[100] > counts[900]);
}

#[test]
fn zeta_matches_an_independent_sum_and_yscb_constant() {
    for n in [1u64, 2, 10, 1000, 100_000] {
        let a = zeta(n, ZIPFIAN_CONSTANT);
        let b = zeta_ref(n, ZIPFIAN_CONSTANT);
        assert!((a - b).abs() < 1e-9 * b, "zeta({n}): {a} vs {b}");
    }
    // YCSB's ZETAN for 10^10 items: exact sum to 10^6 plus the midpoint-rule integral of the
    // tail (error far below 1e-9 for these sizes).
    let t = ZIPFIAN_CONSTANT;
    let head = zeta_ref(1_000_000, t);
    let tail =
        ((SCRAMBLED_ITEMS as f64 + 0.5).powf(1.0 - t) - (1_000_000.5f64).powf(1.0 - t)) / (1.0 - t);
    assert!((head + tail - SCRAMBLED_ZETAN).abs() < 1e-6);
}

#[test]
fn scrambled_zipfian_spreads_the_hot_set() {
    const N: u64 = 10_000;
    const DRAWS: u64 = 2_000_000;
    let mut s = ScrambledZipfian::new(0, N - 1, 5).unwrap();
    let mut counts = vec![0u64; N as usize];
    for _ in 0..DRAWS {
        counts[s.next_item() as usize] += 1;
    }
    let mut ranked: Vec<usize> = (0..N as usize).collect();
    ranked.sort_by_key(|&i| std::cmp::Reverse(counts[i]));
    // The hottest items are the hashes of the zipfian's first values, not 0, 1, 2...
    assert_eq!(ranked[0] as u64, fnv_ref(0) % N);
    assert_eq!(ranked[1] as u64, fnv_ref(1) % N);
    assert!(ranked[..10].iter().any(|&i| i >= 10));
    let hot_mean = ranked[..100].iter().sum::<usize>() as f64 / 100.0;
    assert!(
        (hot_mean - N as f64 / 2.0).abs() < N as f64 / 6.0,
        "hot keys cluster: mean {hot_mean}"
    );
    // Their mass is that of YCSB's underlying zipfian over 10^10 items (ZETAN): the first
    // item 1/ZETAN, the second 2^-0.99/ZETAN (plus collisions of the hash, ~1e-4 here).
    let share = |i: usize| counts[i] as f64 / DRAWS as f64;
    let p1 = 1.0 / SCRAMBLED_ZETAN;
    let p2 = 2f64.powf(-ZIPFIAN_CONSTANT) / SCRAMBLED_ZETAN;
    assert!(
        (share(ranked[0]) - p1).abs() < 0.001,
        "{} vs {p1}",
        share(ranked[0])
    );
    assert!(
        (share(ranked[1]) - p2).abs() < 0.001,
        "{} vs {p2}",
        share(ranked[1])
    );
    // The ten keys YCSB's definition makes hottest: fnv(v) % N for the zipfian's values
    // v = 0..9. Expected share of such a key: the mass of every value that hashes to it
    // (exact terms for v < 10^6) plus the rest beyond 10^6 spread evenly over the N keys.
    let gray = GrayRef::new(SCRAMBLED_ITEMS + 1, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN);
    let m = 1_000_000u64;
    let tail_each = (1.0 - gray.mass(0, m)) / N as f64;
    let mut expect: HashMap<u64, f64> = (0..10u64).map(|v| (fnv_ref(v) % N, tail_each)).collect();
    for v in 0..m {
        if let Some(e) = expect.get_mut(&(fnv_ref(v) % N)) {
            *e += gray.mass(v, v + 1);
        }
    }
    for (&key, &e) in &expect {
        let got = share(key as usize);
        assert!((got - e).abs() < band(e, DRAWS), "key {key}: {got} vs {e}");
    }
}

#[test]
fn workload_c_reads_the_scrambled_hot_keys() {
    // CoreWorkload: ScrambledZipfianGenerator(0, records + expectednewkeys), values above the
    // last inserted key rejected. C has no inserts: the item count is records + 1.
    const RECORDS: u64 = 10_000;
    let mut g = Generator::with_options(Workload::C, RECORDS, 9, opts(500_000)).unwrap();
    let mut counts: HashMap<u64, u64> = HashMap::new();
    for _ in 0..500_000 {
        let op = g.next_op();
        assert!(op.keynum() < RECORDS);
        *counts.entry(op.keynum()).or_default() += 1;
    }
    let hottest = counts
        .iter()
        .max_by_key(|(_, &c)| c)
        .map(|(&k, _)| k)
        .unwrap();
    let h0 = fnv_ref(0) % (RECORDS + 1);
    assert!(
        h0 < RECORDS,
        "pick RECORDS so that the hottest value is a loaded key"
    );
    assert_eq!(hottest, h0);
}

#[test]
fn latest_reads_recent_inserts() {
    const RECORDS: u64 = 100_000;
    const OPS: u64 = 200_000;
    let mut g = Generator::with_options(Workload::D, RECORDS, 21, opts(OPS)).unwrap();
    let mut last = RECORDS - 1;
    let (mut reads, mut newest, mut second, mut run_inserted) = (0u64, 0u64, 0u64, 0u64);
    let mut dists = Vec::new();
    for _ in 0..OPS {
        let op = g.next_op();
        match op.kind() {
            OpKind::Insert => {
                assert_eq!(op.keynum(), last + 1, "inserts take the next key number");
                last = op.keynum();
                assert_eq!(g.last_keynum(), last);
            }
            OpKind::Read => {
                assert!(op.keynum() <= last, "read of a key not inserted yet");
                let d = last - op.keynum();
                reads += 1;
                newest += u64::from(d == 0);
                second += u64::from(d == 1);
                run_inserted += u64::from(op.keynum() >= RECORDS);
                dists.push(d);
            }
            k => panic!("workload D has no {k:?}"),
        }
    }
    // SkewedLatestGenerator: distance from the newest key is zipfian over the current count
    // (100,000 .. 110,000 here; zeta changes by 0.1% over that range).
    let zn = zeta_ref(RECORDS, ZIPFIAN_CONSTANT);
    let p0 = newest as f64 / reads as f64;
    let p1 = second as f64 / reads as f64;
    assert!(
        (p0 - 1.0 / zn).abs() < 0.003,
        "newest key: {p0} vs {}",
        1.0 / zn
    );
    let want1 = 2f64.powf(-ZIPFIAN_CONSTANT) / zn;
    assert!((p1 - want1).abs() < 0.003, "second newest: {p1} vs {want1}");
    // Most requests go to recent keys: the median distance is tiny next to the key count
    // (a uniform choice would give ~50,000).
    dists.sort_unstable();
    let median = dists[dists.len() / 2];
    assert!(median < RECORDS / 100, "median distance {median}");
    // Keys inserted during the run are ~9% of the keys at the end but take most reads.
    let run_share = run_inserted as f64 / reads as f64;
    assert!(run_share > 0.4, "reads of run-inserted keys: {run_share}");
}

#[test]
fn scan_lengths_are_uniform_1_to_100() {
    const N: u64 = 1_000_000;
    let mut g = Generator::with_options(Workload::E, 10_000, 4, opts(N)).unwrap();
    let mut hist = [0u64; 101];
    let (mut scans, mut sum) = (0u64, 0u64);
    for _ in 0..N {
        let op = g.next_op();
        if let Some(len) = op.scan_len() {
            assert!((1..=100).contains(&len), "scan length {len}");
            hist[len as usize] += 1;
            scans += 1;
            sum += u64::from(len);
        } else {
            assert_eq!(op.kind(), OpKind::Insert);
        }
    }
    let mean = sum as f64 / scans as f64;
    // sigma of the mean: 28.9 / sqrt(950,000) = 0.03.
    assert!((mean - 50.5).abs() < 0.15, "mean scan length {mean}");
    assert!(hist[1] > 0 && hist[100] > 0);
    let each = scans as f64 / 100.0;
    for (len, &c) in hist.iter().enumerate().skip(1) {
        // sigma ~97 for ~9,500 expected: 10% is ~10 sigma.
        assert!(
            (c as f64 - each).abs() < 0.1 * each,
            "length {len}: {c} vs {each}"
        );
    }
}

#[test]
fn same_seed_same_sequence() {
    for w in Workload::ALL {
        let a: Vec<Op> = Generator::with_options(w, 5000, 77, opts(20_000))
            .unwrap()
            .take(20_000)
            .collect();
        let b: Vec<Op> = Generator::with_options(w, 5000, 77, opts(20_000))
            .unwrap()
            .take(20_000)
            .collect();
        let c: Vec<Op> = Generator::with_options(w, 5000, 78, opts(20_000))
            .unwrap()
            .take(20_000)
            .collect();
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.kind(), y.kind());
            assert_eq!(x.keynum(), y.keynum());
            assert_eq!(x.key(), y.key());
            assert_eq!(x.scan_len(), y.scan_len());
            assert_eq!(x.field(), y.field());
            assert_eq!(x.version(), y.version());
            for f in 0..FIELDS {
                assert_eq!(x.value(f), y.value(f));
            }
        }
        let same = a
            .iter()
            .zip(&c)
            .filter(|(x, y)| x.keynum() == y.keynum())
            .count();
        assert!(
            same < 10_000,
            "{w}: seeds 77 and 78 agree on {same} of 20000 keys"
        );
    }
}

/// A digest of the first 1000 ops of each workload for seed 1; the C unit test checks the same
/// value (also built with musl-gcc), so host, guest and this crate draw one sequence.
#[test]
fn sequence_digest_is_pinned() {
    assert_eq!(
        sequence_digest(),
        GOLDEN_DIGEST,
        "got {:#018x}",
        sequence_digest()
    );
}

const GOLDEN_DIGEST: u64 = 0xefe6_f0f5_d22f_b8e8;

fn sequence_digest() -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    let mut mix = |v: u64| {
        for b in v.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    };
    for w in Workload::ALL {
        let mut g = Generator::with_options(w, 1000, 1, opts(1000)).unwrap();
        for _ in 0..1000 {
            let op = g.next_op();
            mix(op.kind() as u64);
            mix(op.keynum());
            mix(u64::from(op.scan_len().unwrap_or(0)));
            mix(op.field().map_or(u64::MAX, |f| f as u64));
            mix(op.version());
        }
    }
    h
}

#[test]
fn keys_are_ycsb_keys() {
    // Keys 0, 1, 2 of a YCSB load phase (insertorder=hashed, as YCSB prints them).
    assert_eq!(key_name(0), "user6284781860667377211");
    assert_eq!(key_name(1), "user8517097267634966620");
    assert_eq!(key_name(2), "user1820151046732198393");
    for k in (0..100_000u64).chain([u64::MAX / 2, 1 << 40]) {
        assert_eq!(fnv_hash64(k), fnv_ref(k), "fnv({k})");
        assert_eq!(key_name(k), format!("user{}", fnv_ref(k)));
    }
    let mut g = Generator::with_options(Workload::A, 1000, 2, opts(1000)).unwrap();
    for _ in 0..1000 {
        let op = g.next_op();
        let key = op.key();
        assert!(key.starts_with("user"));
        assert!(key.len() > 4 && key[4..].bytes().all(|b| b.is_ascii_digit()));
        assert_eq!(key, key_name(op.keynum()));
        assert_eq!(op.key_bytes(), key.as_bytes());
    }
}

#[test]
fn field_bytes_are_recomputable() {
    let mut seen_update = 0;
    let mut seen_insert = 0;
    for w in [Workload::A, Workload::D, Workload::F] {
        let mut g = Generator::with_options(w, 1000, 3, opts(5000)).unwrap();
        for _ in 0..5000 {
            let op = g.next_op();
            if !op.kind().writes() {
                assert_eq!(op.version(), 0);
                assert!((0..FIELDS).all(|f| op.value(f).is_none()));
                continue;
            }
            assert!(op.version() > 0);
            if op.kind() == OpKind::Insert {
                seen_insert += 1;
                assert!(op.writes_all_fields());
                let rec = op.record().unwrap();
                let info = check_record(op.key_bytes(), rec).unwrap();
                assert_eq!(info.keynum, op.keynum());
                assert_eq!(info.versions, [op.version(); FIELDS]);
            } else {
                seen_update += 1;
                let f = op.field().unwrap();
                assert!(op.value((f + 1) % FIELDS).is_none());
            }
            for f in 0..FIELDS {
                if let Some(v) = op.value(f) {
                    assert_eq!(v, &field_value(op.keynum(), f, op.version()));
                    assert_eq!(check_field(op.keynum(), f, v), Ok(op.version()));
                }
            }
        }
    }
    assert!(seen_update > 1000 && seen_insert > 100);

    // The format itself, and that any change is caught.
    let v = field_value(0x1234, 7, 0xabcdef);
    assert_eq!(&v[..36], b"0000000000001234:0000000000abcdef:7:");
    assert!(v[36..]
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/'));
    assert_eq!(check_field(0x1234, 7, &v), Ok(0xabcdef));
    assert_eq!(check_field(0x1234, 6, &v), Err(Error::BadField));
    assert_eq!(check_field(0x1235, 7, &v), Err(Error::BadField));
    assert_eq!(check_field(0x1234, 7, &v[..99]), Err(Error::BadField));
    for i in 0..FIELD_LEN {
        let mut bad = v;
        bad[i] ^= 0x01;
        assert_eq!(
            check_field(0x1234, 7, &bad),
            Err(Error::BadField),
            "byte {i}"
        );
    }

    let load = Op::load(5);
    assert_eq!(load.kind(), OpKind::Insert);
    assert_eq!(load.version(), 0);
    let rec = load.record().unwrap().to_vec();
    assert_eq!(
        check_record(load.key_bytes(), &rec).unwrap().versions,
        [0; FIELDS]
    );
    assert_eq!(check_record(b"user1", &rec), Err(Error::BadRecord));
    let mut bad = rec.clone();
    bad[RECORD_LEN - 1] ^= 0x02;
    assert_eq!(check_record(load.key_bytes(), &bad), Err(Error::BadRecord));
}

#[test]
fn write_all_fields_option() {
    let o = Options {
        ops: 1000,
        write_all_fields: true,
        ..Options::default()
    };
    let mut g = Generator::with_options(Workload::A, 1000, 8, o).unwrap();
    let mut updates = 0;
    for _ in 0..1000 {
        let op = g.next_op();
        if op.kind() == OpKind::Update {
            updates += 1;
            assert!(op.writes_all_fields() && op.field().is_none());
            let info = check_record(op.key_bytes(), op.record().unwrap()).unwrap();
            assert_eq!(info.versions, [op.version(); FIELDS]);
        }
    }
    assert!(updates > 400);
}

#[test]
fn threads_insert_disjoint_keys_and_read_only_existing_ones() {
    const RECORDS: u64 = 500;
    const T: u32 = 3;
    let mut all_inserts = HashSet::new();
    for w in [Workload::D, Workload::E] {
        all_inserts.clear();
        for t in 0..T {
            let o = Options {
                ops: 20_000,
                thread: t,
                threads: T,
                write_all_fields: false,
            };
            let mut g = Generator::with_options(w, RECORDS, 13, o).unwrap();
            let mut mine = HashSet::new();
            for _ in 0..20_000 {
                let op = g.next_op();
                if op.kind() == OpKind::Insert {
                    assert!(op.keynum() >= RECORDS);
                    assert_eq!((op.keynum() - RECORDS) % u64::from(T), u64::from(t));
                    assert!(all_inserts.insert(op.keynum()), "key inserted twice");
                    mine.insert(op.keynum());
                    // Versions are unique across threads too.
                    assert_eq!(
                        op.version() % u64::from(T),
                        (u64::from(t) + 1) % u64::from(T)
                    );
                } else {
                    assert!(
                        op.keynum() < RECORDS || mine.contains(&op.keynum()),
                        "{w} thread {t} chose key {} it has not inserted",
                        op.keynum()
                    );
                }
            }
            assert!(!mine.is_empty());
        }
    }
}

#[test]
fn workload_names_parse() {
    assert_eq!("a".parse(), Ok(Workload::A));
    assert_eq!("F".parse(), Ok(Workload::F));
    assert_eq!("workloade".parse(), Ok(Workload::E));
    assert!("g".parse::<Workload>().is_err());
    assert!("a\0".parse::<Workload>().is_err());
    assert_eq!(Workload::D.to_string(), "workloadd");
    assert!(Generator::new(Workload::A, 0, 1).is_err());
    assert!(Generator::new(Workload::D, 1, 1).is_err());
    let bad = Options {
        thread: 4,
        threads: 4,
        ..Options::default()
    };
    assert_eq!(
        Generator::with_options(Workload::A, 10, 1, bad).err(),
        Some(Error::InvalidParameters)
    );
}

#[test]
fn layout_matches_c() {
    check_layout().unwrap();
    // SAFETY: pure functions of the C library.
    let size = unsafe { ffi::ycsb_op_sizeof() };
    assert_eq!(size, std::mem::size_of::<ffi::RawOp>());
}
