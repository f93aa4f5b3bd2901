//! `xts-nomac-bench`: `xts-blake3`'s encryption without page integrity.

use hkdf::Hkdf;
use pmo_crypto::{
    CryptoError, ExternalCipher, ExternalSuite, KeyGen, KeyParams, PageId, Tag, XtsCipher, PAGE,
    TAG_LEN,
};
use sha2::Sha256;
use zeroize::Zeroizing;

pub(crate) const CODE: u8 = 4;
pub(crate) const NAME: &str = "xts-nomac-bench";
/// HKDF label prefix of one generation's XTS key.
pub(crate) const LABEL: &str = "pmo-bench-suites: nomac generation";

pub(crate) struct NoMac;

struct NoMacCipher(XtsCipher);

impl ExternalSuite for NoMac {
    fn code(&self) -> u8 {
        CODE
    }
    fn name(&self) -> &'static str {
        NAME
    }
    /// A key per writing generation, as `xts-blake3`.
    fn cipher(
        &self,
        suite_key: &[u8; 32],
        _params: &KeyParams,
        gen: &KeyGen,
    ) -> Result<Box<dyn ExternalCipher>, CryptoError> {
        let hk = Hkdf::<Sha256>::from_prk(suite_key).map_err(|_| CryptoError::Aead)?;
        let mut k = Zeroizing::new([0u8; 64]);
        hk.expand(&[LABEL.as_bytes(), &gen[..]].concat(), &mut k[..])
            .map_err(|_| CryptoError::Aead)?;
        Ok(Box::new(NoMacCipher(XtsCipher::new(&k))))
    }
}

/// `xts-blake3`'s tweak: (page, version, low half of the uid).
fn tweak(id: &PageId) -> [u8; 16] {
    let mut t = [0u8; 16];
    t[..4].copy_from_slice(&id.page.to_le_bytes());
    t[4..12].copy_from_slice(&id.version.to_le_bytes());
    t[12..].copy_from_slice(&(id.uid as u32).to_le_bytes());
    t
}

impl ExternalCipher for NoMacCipher {
    fn encrypt(&self, id: &PageId, data: &mut [u8; PAGE]) -> Result<(), CryptoError> {
        Ok(self.0.encrypt(tweak(id), data)?)
    }
    fn decrypt(&self, id: &PageId, data: &mut [u8; PAGE]) -> Result<(), CryptoError> {
        Ok(self.0.decrypt(tweak(id), data)?)
    }
    /// No integrity: the stored tag is zero and so is the recomputed one.
    fn tag(&self, _id: &PageId, _ct: &[u8; PAGE]) -> Tag {
        [0u8; TAG_LEN]
    }
}
