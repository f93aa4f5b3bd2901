//! A PMO store on an emulated CXL expander, as the VMM makes one for `--pmo-store cxl=NAME`:
//! the expander's media in a scratch file, each PMO extent under its own XTS-256 range key
//! from a fixed benchmark master key. The tiering evaluation and the comparison's CXL designs
//! run on it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cxl_t3::expander::{CxlMedium, Expander, ExpanderConfig, ExpanderError};
use cxl_t3::WorkingArea;
use pmo_crypto::{CryptoError, ExtentKeyring, KdfParams};
use pmo_store::{Store, StoreError, StoreOptions};

/// The benchmark master key (the range keys are derived from it; nothing here is secret).
const MASTER: &[u8; 32] = b"pmo harness expander master key!";

/// Why the store could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CxlStoreError {
    /// The expander failed.
    #[error("expander: {0}")]
    Expander(#[from] ExpanderError),
    /// The store could not be formatted.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The keyring could not be made.
    #[error("key: {0}")]
    Key(#[from] CryptoError),
}

/// How the expander is modelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpanderModel {
    /// Device cache in bytes.
    pub cache: u64,
    /// Charged per block filled from or written back to the media, in ns.
    pub media_latency_ns: u64,
}

/// A formatted store of at least `len` bytes and `slots` PMO table slots on a new expander
/// whose media is `dir/media.img` (its size rounded up to the 256 MiB the CXL decoders work
/// in). Returns the store, the media file and a one-line description for reports.
pub fn expander_store(
    dir: &Path,
    len: u64,
    slots: u32,
    model: ExpanderModel,
) -> Result<(Store, PathBuf, String), CxlStoreError> {
    let s = expander_store_with_area(dir, len, slots, model, 0)?;
    Ok((s.store, s.media, s.desc))
}

/// A store on an expander, and the working area of design `c` after it.
pub struct ExpanderStore {
    /// The store.
    pub store: Store,
    /// The expander's media file.
    pub media: PathBuf,
    /// One line for reports.
    pub desc: String,
    /// `working` bytes at the end of the device for design `c`'s working copies, if asked.
    pub area: Option<Arc<WorkingArea>>,
}

/// [`expander_store`] with the last `working` bytes of the device (a multiple of 4 KiB, 0 for
/// none) kept out of the store as the working area of design `c`, as the VMM's
/// `--pmo-store cxl=NAME,direct=SIZE` does.
pub fn expander_store_with_area(
    dir: &Path,
    len: u64,
    slots: u32,
    model: ExpanderModel,
    working: u64,
) -> Result<ExpanderStore, CxlStoreError> {
    let media = dir.join("media.img");
    let _ = std::fs::remove_file(&media);
    let want = len.max(1).saturating_add(working);
    let size = want.div_ceil(256 << 20).saturating_mul(256 << 20);
    let cfg = ExpanderConfig {
        cache_bytes: model.cache,
        media_latency_ns: model.media_latency_ns,
        ..ExpanderConfig::new(&media, size)
    };
    let expander = Expander::open(&cfg)?;
    let medium = CxlMedium::new(expander.clone()).with_keyring(ExtentKeyring::new(MASTER)?);
    let store_len = size - working;
    let store = Store::create(
        medium,
        StoreOptions {
            slots: Some(slots),
            kdf: KdfParams::INSECURE_FAST,
            suites: pmo_bench_suites::suites(),
            len: (working > 0).then_some(store_len),
            ..Default::default()
        },
    )?;
    let area = match working {
        0 => None,
        _ => Some(WorkingArea::new(expander, store_len, size)?),
    };
    let desc = format!(
        "emulated CXL expander: {} MiB media file in {}, {} MiB device cache, {} ns media latency per fill and write-back, per-PMO XTS-256 range keys{}",
        size >> 20,
        dir.display(),
        model.cache >> 20,
        model.media_latency_ns,
        match working {
            0 => String::new(),
            w => format!(
                ", a {} MiB working area where design c's working copies live and are touched directly",
                w >> 20
            ),
        }
    );
    Ok(ExpanderStore {
        store,
        media,
        desc,
        area,
    })
}
