//! The page and range ciphers of PMOs, apart from the store: keys, the page cipher and the
//! page MAC, and the keys of extents on media that encrypt ranges themselves.
//!
//! The PMO store seals and opens pages with [`PmoKeys`]; the CXL expander encrypts its TEE
//! ranges with [`XtsCipher`] under keys from an [`ExtentKeyring`]. Both use this crate and
//! neither depends on the other.
//!
//! A user key never touches the medium. Per PMO, Argon2id with a random salt and the cost stored
//! in the PMO record turns it into a root key ([`kdf`]); HKDF expands that into the key-check
//! value (KCV, stored and compared in constant time at attach), the page MAC key, the record MAC
//! key and the page cipher key, from which each writing session's cipher is expanded
//! ([`page_keys`]). All derived secrets are zeroized on drop and no type here prints them.
//!
//! Suites ([`Suite`]):
//! - [`Suite::AesGcm`] (the default of `d`, `wedi` and the `ip` designs): AES-256-GCM (ring)
//!   under the writing session's key, nonce = (page, version), AAD = (uid, page, version,
//!   generation). One pass encrypts and authenticates.
//! - [`Suite::XtsBlake3`] (the default of the `id` designs, which compute tags apart from the
//!   encryption): AES-XTS-256 with a tweak made of (page index, page version, PMO uid) under the
//!   writing session's key, and a keyed BLAKE3 tag (128 bits) over (PMO uid, page, version,
//!   generation, ciphertext).
//! - [`Suite::TeeBlake3`]: no software cipher: the PMO's extent lies in a TEE range of the CXL
//!   expander, whose AES-XTS range key encrypts it on its way to the media (LPMO's CXL designs,
//!   seed 000 section 5.2); the CPU checks integrity with the same keyed BLAKE3 tag as
//!   `xts-blake3`, over the plaintext. The store refuses it on any extent the medium does not
//!   encrypt (the medium's `ExtentKeys::extent_encrypted`), at create and at every attach.
//! - [`Suite::External`]: a suite this crate does not implement, known by its on-media code;
//!   only a store handle given its implementation ([`ExternalSuite`], [`ExternalSuites`]) seals
//!   or opens its pages. The design-comparison harness's benchmark-only suites are such (the
//!   authors' `paper` scheme and `xts-nomac-bench`, which has no page integrity): they live in
//!   a crate only the harness links, so no product program contains them.

pub mod extent;
pub mod external;
pub mod kdf;
pub mod page_keys;
mod suite;
pub mod xts;

use zeroize::Zeroizing;

pub use extent::{ExtentKeyring, RangeCipher};
pub use external::{ExternalCipher, ExternalSuite, ExternalSuites};
pub use kdf::KdfParams;
pub use page_keys::{CipherCache, KeyGen, KeyParams, PageId, PmoKeys};
pub use suite::Suite;
pub use xts::{XtsCipher, XtsError};

/// Size of a PMO page.
pub const PAGE: usize = 4096;
/// Size of a stored per-page tag: 128 bits, as GCM's.
pub const TAG_LEN: usize = 16;

/// A per-page authentication tag.
pub type Tag = [u8; TAG_LEN];

/// Errors of the crypto layer. Messages never contain key material.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CryptoError {
    /// The page tag did not verify.
    #[error("page authentication failed")]
    BadTag,
    /// The key check value did not match: wrong key.
    #[error("wrong key")]
    WrongKey,
    /// The operating system random source failed.
    #[error("random source failed")]
    Random,
    /// A key of zero length was offered.
    #[error("empty key")]
    EmptyKey,
    /// Unknown suite number or name.
    #[error("unknown crypto suite {0}")]
    UnknownSuite(String),
    /// A suite of another crate ([`Suite::External`]) that this store handle was not given.
    #[error("crypto suite {0} is not available here (no implementation was registered)")]
    SuiteUnavailable(u8),
    /// Registering an external suite under a code that is taken (built in, zero, or twice).
    #[error("crypto suite code {0} is taken")]
    SuiteCodeTaken(u8),
    /// The AEAD library refused a key or an operation.
    #[error("aead failure")]
    Aead,
    /// A master key shorter than the minimum.
    #[error("master key shorter than {0} bytes")]
    ShortMaster(usize),
    /// Key-derivation cost outside the accepted bounds.
    #[error("key derivation parameters out of bounds: {0}")]
    KdfParams(KdfParams),
    /// A key-derivation option that does not parse.
    #[error("bad key derivation option {0:?} (m=SIZE,t=PASSES,p=LANES or fast)")]
    KdfSpec(String),
    /// XTS length error.
    #[error(transparent)]
    Xts(#[from] XtsError),
}

/// A user key as handed in by the guest. Zeroized on drop; `Debug` prints nothing of it.
pub struct UserKey(Zeroizing<Vec<u8>>);

impl UserKey {
    /// Wraps the caller's key bytes (copied; the caller should wipe its own copy).
    pub fn new(bytes: &[u8]) -> Result<Self, CryptoError> {
        if bytes.is_empty() {
            return Err(CryptoError::EmptyKey);
        }
        Ok(Self(Zeroizing::new(bytes.to_vec())))
    }
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for UserKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserKey(<redacted>)")
    }
}

/// Fills `buf` from the kernel's random source.
pub fn random_bytes(buf: &mut [u8]) -> Result<(), CryptoError> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: the pointer and length describe the writable tail of `buf`.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(CryptoError::Random);
        }
        done += n as usize;
    }
    Ok(())
}

/// Wipes a buffer that held plaintext: one memset, then a compiler fence and `black_box` so the
/// stores cannot be elided as dead. `Zeroize` on a byte slice issues one volatile store per byte,
/// which costs about 1 us per 4 KiB page and over a second for a 1 GiB `wedi` copy.
pub fn wipe(buf: &mut [u8]) {
    buf.fill(0);
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    std::hint::black_box(buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_key_is_rejected() {
        assert!(matches!(UserKey::new(b""), Err(CryptoError::EmptyKey)));
    }

    #[test]
    fn wipe_clears_every_byte() {
        let mut v = vec![0xA5u8; 3 * PAGE + 7];
        wipe(&mut v);
        assert!(v.iter().all(|b| *b == 0));
    }
}
