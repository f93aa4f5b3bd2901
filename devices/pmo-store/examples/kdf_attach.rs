//! What the password KDF costs an attach: attach + detach of a small PMO whose key derivation
//! is Argon2id at the default cost (64 MiB, 3 passes), against the same with the cheapest
//! cost, interleaved in rounds (default, cheap, default, cheap, ...) so both see the same
//! machine. Prints the median and the quartiles of each, and their ratio.
//! `cargo run --release -p pmo-virtio --example kdf_attach [-- ROUNDS]`.

use pmo_crypto::{KdfParams, UserKey, PAGE};
use pmo_media::{CrashMedium, Medium};
use pmo_store::{CreateOptions, Perm, Store, StoreOptions};
use std::sync::Arc;
use std::time::Instant;

fn quartiles(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.25), at(0.5), at(0.75))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20);
    let m: Arc<dyn Medium> = Arc::new(CrashMedium::new(64 << 20));
    let s = Store::create(
        m,
        StoreOptions {
            slots: Some(16),
            ..Default::default()
        },
    )?;
    let key = UserKey::new(b"a tenant's passphrase")?;
    let variants = [
        ("default", KdfParams::DEFAULT),
        ("cheapest", KdfParams::INSECURE_FAST),
    ];
    for (name, kdf) in variants {
        let opts = CreateOptions {
            kdf: Some(kdf),
            ..CreateOptions::default()
        };
        s.create_pmo_with(name, 16 * PAGE as u64, &key, opts)?;
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for _ in 0..rounds {
        for (i, (name, _)) in variants.iter().enumerate() {
            let t = Instant::now();
            let a = s.attach(name, Perm::Read, &key)?;
            let attached = t.elapsed();
            a.detach().wait()?;
            times[i].push(attached.as_secs_f64() * 1e3);
        }
    }
    println!("attach latency, {rounds} rounds interleaved (ms: 25% / median / 75%)");
    let mut medians = Vec::new();
    for ((name, kdf), t) in variants.iter().zip(times) {
        let (q1, q2, q3) = quartiles(t);
        medians.push(q2);
        println!("  {name:<9} {kdf}: {q1:.3} / {q2:.3} / {q3:.3}");
    }
    println!(
        "  default / cheapest median: {:.0}x",
        medians[0] / medians[1]
    );
    Ok(())
}
