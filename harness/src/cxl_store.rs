//! A PMO store on an emulated CXL expander, as the VMM makes one for `--pmo-store cxl=NAME`:
//! the expander's media in a scratch file, each PMO extent under its own XTS-256 range key
//! from a fixed benchmark master key. The tiering evaluation and the comparison's CXL designs
//! run on it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cxl_t3::expander::{CxlMedium, Expander, ExpanderConfig, ExpanderError};
use pmo_store::crypto::{CryptoError, ExtentKeyring, KdfParams};
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
    let media = dir.join("media.img");
    let _ = std::fs::remove_file(&media);
    let size = len.max(1).div_ceil(256 << 20).saturating_mul(256 << 20);
    let cfg = ExpanderConfig {
        cache_bytes: model.cache,
        media_latency_ns: model.media_latency_ns,
        ..ExpanderConfig::new(&media, size)
    };
    let expander = Expander::open(&cfg)?;
    let medium = Arc::new(CxlMedium::new(expander).with_keyring(ExtentKeyring::new(MASTER)?));
    let store = Store::create(
        medium,
        StoreOptions {
            slots: Some(slots),
            kdf: KdfParams::INSECURE_FAST,
            ..Default::default()
        },
    )?;
    let desc = format!(
        "emulated CXL expander: {} MiB media file in {}, {} MiB device cache, {} ns media latency per fill and write-back, per-PMO XTS-256 range keys",
        size >> 20,
        dir.display(),
        model.cache >> 20,
        model.media_latency_ns
    );
    Ok((store, media, desc))
}
