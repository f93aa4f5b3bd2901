//! `paper`: the authors' scheme, one XTS tweak per PMO and an unkeyed hash.

use hkdf::Hkdf;
use pmo_crypto::{
    CryptoError, ExternalCipher, ExternalSuite, KeyGen, KeyParams, PageId, Tag, XtsCipher, PAGE,
    TAG_LEN,
};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

pub(crate) const CODE: u8 = 2;
pub(crate) const NAME: &str = "paper";
/// HKDF label of its one XTS key per PMO.
pub(crate) const LABEL: &str = "pmo-bench-suites: paper xts";

pub(crate) struct Paper;

/// One key and one tweak for every page and version of the PMO.
struct PaperCipher {
    xts: XtsCipher,
    tweak: [u8; 16],
}

impl ExternalSuite for Paper {
    fn code(&self) -> u8 {
        CODE
    }
    fn name(&self) -> &'static str {
        NAME
    }
    /// The same cipher for every generation: the authors have one key per PMO.
    fn cipher(
        &self,
        suite_key: &[u8; 32],
        params: &KeyParams,
        _gen: &KeyGen,
    ) -> Result<Box<dyn ExternalCipher>, CryptoError> {
        let hk = Hkdf::<Sha256>::from_prk(suite_key).map_err(|_| CryptoError::Aead)?;
        let mut k = Zeroizing::new([0u8; 64]);
        hk.expand(LABEL.as_bytes(), &mut k[..])
            .map_err(|_| CryptoError::Aead)?;
        Ok(Box::new(PaperCipher {
            xts: XtsCipher::new(&k),
            tweak: params.paper_iv,
        }))
    }
}

impl ExternalCipher for PaperCipher {
    fn encrypt(&self, _id: &PageId, data: &mut [u8; PAGE]) -> Result<(), CryptoError> {
        Ok(self.xts.encrypt(self.tweak, data)?)
    }
    fn decrypt(&self, _id: &PageId, data: &mut [u8; PAGE]) -> Result<(), CryptoError> {
        Ok(self.xts.decrypt(self.tweak, data)?)
    }
    fn tag(&self, _id: &PageId, ct: &[u8; PAGE]) -> Tag {
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&paper_checksum(ct)[..TAG_LEN]);
        tag
    }
}

/// Unkeyed SHA-256 of a page, as the authors' implementation stores it (for the weakness tests).
pub fn paper_checksum(ct: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(ct);
    h.finalize().into()
}
