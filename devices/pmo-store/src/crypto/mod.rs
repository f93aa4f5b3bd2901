//! Keys, the page cipher and the page MAC.
//!
//! A user key never touches the medium. Per PMO, Argon2id with a random salt and the cost stored
//! in the PMO record turns it into a root key ([`kdf`]); HKDF expands that into the key-check
//! value (KCV, stored and compared in constant time at attach), the page MAC key, the record MAC
//! key and the page cipher key, from which each writing session's cipher is expanded
//! ([`page_keys`]). All derived secrets are zeroized on drop and no type here prints them.
//!
//! Suites:
//! - [`Suite::AesGcm`] (the default of `d`, `wedi` and the `ip` designs): AES-256-GCM (ring)
//!   under the writing session's key, nonce = (page, version), AAD = (uid, page, version,
//!   generation). One pass encrypts and authenticates.
//! - [`Suite::XtsBlake3`] (the default of the `id` designs, which compute tags apart from the
//!   encryption): AES-XTS-256 with a tweak made of (page index, page version, PMO uid) under the
//!   writing session's key, and a keyed BLAKE3 tag (128 bits) over (PMO uid, page, version,
//!   generation, ciphertext).
//! - [`Suite::Paper`]: what the authors' kernel does: AES-XTS-256 with one per-PMO tweak for every
//!   page and an unkeyed SHA-256 of the ciphertext. Kept only so benches and tests can compare.
//! - [`Suite::TeeBlake3`]: no software cipher: the PMO's extent lies in a TEE range of the CXL
//!   expander, whose AES-XTS range key encrypts it on its way to the media (LPMO's CXL designs,
//!   seed 000 section 5.2); the CPU checks integrity with the same keyed BLAKE3 tag as
//!   `xts-blake3`, over the plaintext. The store refuses it on any extent the medium does not
//!   encrypt ([`crate::medium::Medium::extent_encrypted`]), at create and at every attach.
//! - `XtsNoMacBench`: **benchmark only, no page integrity**, compiled only with the
//!   `bench-nomac` feature, which only the design-comparison harness enables: `xts-blake3`'s
//!   encryption with an all-zero tag that is never checked. A product build cannot decode it
//!   from a store file.

pub mod extent;
pub mod kdf;
pub mod page_keys;
pub mod xts;

use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

pub use extent::{ExtentKeyring, RangeCipher};
pub use kdf::KdfParams;
pub use page_keys::{CipherCache, KeyGen, KeyParams, PageId, PmoKeys};
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

/// Which page cipher and tag a PMO uses; fixed at create time, stored in the PMO record and
/// bound under its record MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Suite {
    /// AES-XTS-256 with per-(page, version) tweak + keyed BLAKE3 MAC. The default of the
    /// designs that defer tags (its tag is computed apart from the encryption).
    XtsBlake3,
    /// The authors' scheme: one XTS tweak per PMO + unkeyed SHA-256. For comparison only.
    Paper,
    /// AES-256-GCM with a (page, version) nonce. The default of every design that does not
    /// defer tags: one pass encrypts and authenticates.
    AesGcm,
    /// No page cipher (the medium's TEE range key encrypts the extent) + keyed BLAKE3 MAC.
    /// Only on range-encrypted extents.
    TeeBlake3,
    /// Benchmark only: XTS encryption as `XtsBlake3` but no page MAC (all-zero tags, never
    /// checked), to measure the designs "without integrity". Offers no tamper detection.
    #[cfg(feature = "bench-nomac")]
    XtsNoMacBench,
}

impl Suite {
    /// Every suite this build knows.
    pub const ALL: &'static [Suite] = &[
        Suite::XtsBlake3,
        Suite::Paper,
        Suite::AesGcm,
        Suite::TeeBlake3,
        #[cfg(feature = "bench-nomac")]
        Suite::XtsNoMacBench,
    ];

    /// Stable on-media number.
    pub fn code(self) -> u8 {
        match self {
            Suite::XtsBlake3 => 1,
            Suite::Paper => 2,
            Suite::AesGcm => 3,
            #[cfg(feature = "bench-nomac")]
            Suite::XtsNoMacBench => 4,
            Suite::TeeBlake3 => 5,
        }
    }
    /// Parses the on-media number. Code 4 (the no-MAC benchmark suite) is unknown unless this
    /// build has the `bench-nomac` feature.
    pub fn from_code(c: u8) -> Result<Self, CryptoError> {
        Self::ALL
            .iter()
            .copied()
            .find(|s| s.code() == c)
            .ok_or_else(|| CryptoError::UnknownSuite(c.to_string()))
    }
    /// Name used on the command line and in docs.
    pub fn name(self) -> &'static str {
        match self {
            Suite::XtsBlake3 => "xts-blake3",
            Suite::Paper => "paper",
            Suite::AesGcm => "aes-gcm",
            Suite::TeeBlake3 => "tee-blake3",
            #[cfg(feature = "bench-nomac")]
            Suite::XtsNoMacBench => "xts-nomac-bench",
        }
    }
    /// True when pages are stored as plaintext for the medium to encrypt: such a PMO may only
    /// live on an extent the medium encrypts itself.
    pub fn needs_range_encryption(self) -> bool {
        self == Suite::TeeBlake3
    }
    /// Parses a command-line name.
    pub fn from_name(s: &str) -> Result<Self, CryptoError> {
        Self::ALL
            .iter()
            .copied()
            .find(|x| x.name() == s)
            .ok_or_else(|| CryptoError::UnknownSuite(s.chars().take(40).collect()))
    }
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

/// Unkeyed SHA-256 of a page, as the authors' implementation stores it (for the weakness tests).
pub fn paper_checksum(ct: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(ct);
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suite_codes_and_names_round_trip() {
        for s in Suite::ALL {
            assert_eq!(Suite::from_code(s.code()), Ok(*s));
            assert_eq!(Suite::from_name(s.name()), Ok(*s));
        }
    }

    /// A store file cannot select the no-MAC benchmark suite in a product build.
    #[cfg(not(feature = "bench-nomac"))]
    #[test]
    fn the_nomac_bench_suite_does_not_exist_in_a_product_build() {
        assert!(Suite::from_code(4).is_err());
        assert!(Suite::from_name("xts-nomac-bench").is_err());
        assert!(!Suite::ALL.iter().any(|s| s.code() == 4));
    }

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
