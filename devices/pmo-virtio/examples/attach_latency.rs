//! Attach / psync / detach latency against PMO size for every design (the LOaPP experiment:
//! one session = attach, touch a page, psync it, detach). Reports the minimum and the median of
//! N runs by wall clock; the minimum is the figure least disturbed by other load on a shared
//! machine. `cargo run --release -p pmo-virtio --example attach_latency [-- 4k,16m,1g]`.
//!
//! PMOs here use the cheapest Argon2id cost, so the figures are the designs' own; the key
//! derivation adds a fixed cost per attach that `kdf_attach` measures.

use pmo_store::crypto::{UserKey, PAGE};
use pmo_store::medium::{FileMedium, Medium, PmTiming, TimedMedium};
use pmo_store::{Design, Perm, Store, StoreOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn stats(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(v[0]), us(v[v.len() / 2]))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "4k,16m,1g".into());
    let sizes: Vec<(String, u64)> = arg
        .split(',')
        .map(|s| (s.to_string(), sizes::parse_size(s)))
        .map(|(n, r)| r.map(|v| (n, v)))
        .collect::<Result<_, _>>()?;
    let dir = std::path::Path::new("/dev/shm");
    let dir = if dir.is_dir() {
        dir.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let key = UserKey::new(b"latency")?;
    println!("size   design  runs  attach(min/med us)   psync 1 page   detach+wait      total");
    for (label, size) in sizes {
        let path = dir.join(format!("pmo-latency-{}-{label}", std::process::id()));
        let file = FileMedium::create(&path, 3 * size + (64 << 20))?;
        // PMO_PM_TIMING="read,write" slowdown factors (the PMBD model), e.g. "2,6".
        let m: Arc<dyn Medium> = match std::env::var("PMO_PM_TIMING") {
            Ok(v) => {
                let mut it = v.split(',').map(|x| x.trim().parse::<f64>());
                let (Some(Ok(r)), Some(Ok(w))) = (it.next(), it.next()) else {
                    return Err(format!("PMO_PM_TIMING must be \"read,write\", got {v:?}").into());
                };
                let t = PmTiming {
                    read_factor: r,
                    write_factor: w,
                };
                Arc::new(TimedMedium::new(file, t))
            }
            Err(_) => Arc::new(file),
        };
        let s = Store::create(
            m,
            StoreOptions {
                slots: Some(16),
                kdf: pmo_store::crypto::KdfParams::INSECURE_FAST,
                ..Default::default()
            },
        )?;
        s.create_pmo("f", size, &key)?;
        // Write every page once so attach/fault decrypt real ciphertext.
        let npages = size / PAGE as u64;
        let w = s.attach_with("f", Perm::Write, &key, Some(Design::D))?;
        let page = [0x42u8; PAGE];
        let mut p = 0;
        while p < npages {
            let end = (p + 8192).min(npages);
            w.psync((p..end).map(|i| (i, &page)))?;
            p = end;
        }
        w.detach().wait()?;
        let runs = if size >= 1 << 30 { 3 } else { 15 };
        for design in Design::ON_ANY_MEDIUM {
            let (mut a, mut ps, mut d, mut t) = (vec![], vec![], vec![], vec![]);
            for _ in 0..runs {
                let t0 = Instant::now();
                let w = s.attach_with("f", Perm::Write, &key, Some(design))?;
                let mut out = [0u8; PAGE];
                w.fault(npages / 2, &mut out)?;
                let t1 = Instant::now();
                out[0] ^= 1;
                w.psync([(npages / 2, &out)])?;
                let t2 = Instant::now();
                w.detach().wait()?;
                let t3 = Instant::now();
                a.push(t1 - t0);
                ps.push(t2 - t1);
                d.push(t3 - t2);
                t.push(t3 - t0);
            }
            let (a, ps, d, t) = (stats(a), stats(ps), stats(d), stats(t));
            println!(
                "{label:<6} {:<7} {runs:>4}  {:>9.0} /{:>9.0}  {:>6.0} /{:>6.0}  {:>7.0} /{:>7.0}  {:>9.0} /{:>9.0}",
                design.name(),
                a.0,
                a.1,
                ps.0,
                ps.1,
                d.0,
                d.1,
                t.0,
                t.1
            );
        }
        drop(s);
        let _ = std::fs::remove_file(&path);
    }
    Ok(())
}
