//! The keys of one PMO and what they do to pages and records.
//!
//! ```text
//! user key --Argon2id(salt, m, t, p)--> root key --HKDF-SHA-256--> key-check value
//!                                                                  page MAC key
//!                                                                  record MAC key
//!                                                                  page cipher key --HKDF(gen)--> cipher of one generation
//! ```
//!
//! **Generations.** Every attach session that writes draws a random 128-bit generation and seals
//! its pages under a cipher key expanded from (page cipher key, generation); the generation is
//! stored in each page's tree leaf next to its version. A tweak or nonce is (page, version) under
//! that key, and a session never uses a version twice (its epoch counter lives in memory and only
//! grows). So one (key, page, version) never seals two plaintexts, even when the record or the
//! whole store was rolled back to an older copy and its epoch counter with it: the new session's
//! key is fresh. Readers derive the key of each generation they meet once and cache it.
//!
//! **External suites** ([`Suite::External`], see [`crate::external`]) get a key of their own,
//! `HKDF(root, "external suite" || code)`, and build each generation's cipher from it; the
//! generation cache and the tag check stay here.

use crate::xts::XtsCipher;
use crate::{
    kdf, wipe, CryptoError, ExternalCipher, ExternalSuite, ExternalSuites, KdfParams, Suite, Tag,
    UserKey, PAGE, TAG_LEN,
};
use hkdf::Hkdf;
use locked::RwLocked;
use sha2::Sha256;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

/// Random per writing session; selects the cipher key a page version was sealed under.
pub type KeyGen = [u8; 16];

/// Cipher keys of this many generations are kept per session; beyond, the cache starts over.
const GENERATION_CACHE: usize = 4096;

/// Identifies one sealed page version: what its tweak or nonce and its tag bind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageId {
    /// Random per-PMO identifier, stored in the PMO record.
    pub uid: u64,
    /// Page index inside the PMO.
    pub page: u32,
    /// Version: the psync epoch that wrote this page (never 0 for written pages).
    pub version: u64,
    /// Generation of the session that sealed it.
    pub gen: KeyGen,
}

/// The per-PMO public key-derivation inputs stored in the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyParams {
    /// Argon2id salt.
    pub salt: [u8; 32],
    /// A random per-PMO IV no built-in suite uses: the paper suite's single tweak (an
    /// external suite's business; the field keeps its name and place on media).
    pub paper_iv: [u8; 16],
    /// Suite.
    pub suite: Suite,
    /// PMO uid.
    pub uid: u64,
    /// Argon2id cost.
    pub kdf: KdfParams,
}

impl KeyParams {
    /// Fresh random parameters for a new PMO.
    pub fn generate(suite: Suite, kdf: KdfParams) -> Result<Self, CryptoError> {
        kdf.check()?;
        let mut salt = [0u8; 32];
        let mut iv = [0u8; 16];
        let mut uid = [0u8; 8];
        crate::random_bytes(&mut salt)?;
        crate::random_bytes(&mut iv)?;
        crate::random_bytes(&mut uid)?;
        Ok(Self {
            salt,
            paper_iv: iv,
            suite,
            uid: u64::from_le_bytes(uid),
            kdf,
        })
    }
}

/// One generation's cipher. Always behind an `Arc`, so the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum PageCipher {
    Xts(XtsCipher),
    Gcm(ring::aead::LessSafeKey),
    /// `tee-blake3`: pages leave in plaintext for the medium's range key; only the tag.
    RangeKeyed,
    /// A registered external suite's.
    External(Box<dyn ExternalCipher>),
}

/// The cipher a run of page operations used last: pages of one run mostly share a
/// generation, so [`PmoKeys::open_page_cached`] looks the generation up once per run instead
/// of once per page. Holds no key bytes of its own, only a reference to the keys' cipher.
#[derive(Default)]
pub struct CipherCache<'k>(Option<(KeyGen, Held<'k>)>);

/// A cipher of [`PmoKeys`]: borrowed when it is one that never leaves them (the first
/// generation's), so using it writes to no shared reference count.
enum Held<'k> {
    Borrowed(&'k PageCipher),
    Shared(Arc<PageCipher>),
}

impl Held<'_> {
    fn get(&self) -> &PageCipher {
        match self {
            Held::Borrowed(c) => c,
            Held::Shared(c) => c,
        }
    }
}

impl std::fmt::Debug for CipherCache<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CipherCache")
    }
}

/// A registered external suite and the PMO's key for it (its own, see [`crate::external`]).
type Registered = (Arc<dyn ExternalSuite>, Zeroizing<[u8; 32]>);

/// All keys of one PMO, derived from a user key. Secrets zeroize on drop; nothing here prints
/// them.
pub struct PmoKeys {
    params: KeyParams,
    kcv: [u8; 32],
    mac_key: Zeroizing<[u8; 32]>,
    record_key: Zeroizing<[u8; 32]>,
    cipher_key: Zeroizing<[u8; 32]>,
    /// An external suite's implementation (if registered) and its own key.
    external: Option<Registered>,
    /// The first generation's cipher, read without a lock: a PMO written by one session has
    /// only that one, and every fault of a reader asks for it.
    first: std::sync::OnceLock<(KeyGen, Arc<PageCipher>)>,
    ciphers: RwLock<HashMap<KeyGen, Arc<PageCipher>>>,
}

impl std::fmt::Debug for PmoKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmoKeys")
            .field("suite", &self.params.suite)
            .finish_non_exhaustive()
    }
}

fn expand(hk: &Hkdf<Sha256>, label: &[u8], out: &mut [u8]) -> Result<(), CryptoError> {
    hk.expand(label, out).map_err(|_| CryptoError::Aead)
}

impl PmoKeys {
    /// Derives every key of a PMO from the user key and its stored parameters: one Argon2id
    /// run (see [`kdf`]), then HKDF. An external suite's pages need its implementation in
    /// `suites`; without it the key check and the record MAC still work (so an edited record
    /// is refused as such), and page operations fail with [`CryptoError::SuiteUnavailable`].
    pub fn derive(
        user: &UserKey,
        params: KeyParams,
        suites: &ExternalSuites,
    ) -> Result<Self, CryptoError> {
        let root = kdf::root_key(user, &params.salt, params.kdf)?;
        let hk = Hkdf::<Sha256>::new(Some(b"pmovmm v2 pmo"), &root[..]);
        let mut kcv = [0u8; 32];
        let mut mac_key = Zeroizing::new([0u8; 32]);
        let mut record_key = Zeroizing::new([0u8; 32]);
        let mut cipher_key = Zeroizing::new([0u8; 32]);
        expand(&hk, b"key check", &mut kcv)?;
        expand(&hk, b"page mac", &mut mac_key[..])?;
        expand(&hk, b"record mac", &mut record_key[..])?;
        expand(&hk, b"page cipher", &mut cipher_key[..])?;
        let external = match (params.suite, suites.get(params.suite)) {
            (Suite::External(code), Some(suite)) => {
                let mut k = Zeroizing::new([0u8; 32]);
                expand(&hk, &[&b"external suite"[..], &[code]].concat(), &mut k[..])?;
                Some((suite.clone(), k))
            }
            _ => None,
        };
        Ok(Self {
            params,
            kcv,
            mac_key,
            record_key,
            cipher_key,
            external,
            first: std::sync::OnceLock::new(),
            ciphers: RwLock::new(HashMap::new()),
        })
    }

    /// A fresh generation for a session that will seal pages.
    pub fn new_generation() -> Result<KeyGen, CryptoError> {
        let mut g = [0u8; 16];
        crate::random_bytes(&mut g)?;
        Ok(g)
    }

    /// The key-check value to store at create time (public: it reveals nothing of the key).
    pub fn key_check_value(&self) -> [u8; 32] {
        self.kcv
    }

    /// Compares a stored KCV in constant time; `Err(WrongKey)` on mismatch.
    pub fn check(&self, stored: &[u8; 32]) -> Result<(), CryptoError> {
        if bool::from(self.kcv.ct_eq(stored)) {
            Ok(())
        } else {
            Err(CryptoError::WrongKey)
        }
    }

    /// The parameters these keys were derived with.
    pub fn params(&self) -> &KeyParams {
        &self.params
    }

    /// True when pages can be sealed and opened: a built-in suite, or an external one whose
    /// implementation was registered.
    pub fn suite_available(&self) -> bool {
        !matches!(self.params.suite, Suite::External(_)) || self.external.is_some()
    }

    /// MAC over the canonical bytes of a record's bound fields (see `store::record`).
    pub fn record_mac(&self, bound: &[u8]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.record_key);
        h.update(b"pmovmm record v3");
        h.update(bound);
        *h.finalize().as_bytes()
    }

    /// Constant-time check of a record MAC.
    pub fn check_record_mac(&self, bound: &[u8], mac: &[u8; 32]) -> bool {
        bool::from(self.record_mac(bound).ct_eq(mac))
    }

    /// The cipher a page version was (or will be) sealed under.
    fn cipher(&self, gen: &KeyGen) -> Result<Arc<PageCipher>, CryptoError> {
        if let Some((g, c)) = self.first.get() {
            if g == gen {
                return Ok(c.clone());
            }
        }
        if let Some(c) = self.ciphers.read_locked().get(gen) {
            return Ok(c.clone());
        }
        let hk = Hkdf::<Sha256>::from_prk(&self.cipher_key[..]).map_err(|_| CryptoError::Aead)?;
        let mut info = [0u8; 17];
        info[0] = self.params.suite.code();
        info[1..].copy_from_slice(gen);
        let c = match self.params.suite {
            Suite::TeeBlake3 => PageCipher::RangeKeyed,
            Suite::AesGcm => {
                let mut k = Zeroizing::new([0u8; 32]);
                expand(&hk, &info, &mut k[..])?;
                let unbound = ring::aead::UnboundKey::new(&ring::aead::AES_256_GCM, &k[..])
                    .map_err(|_| CryptoError::Aead)?;
                PageCipher::Gcm(ring::aead::LessSafeKey::new(unbound))
            }
            Suite::XtsBlake3 => {
                let mut k = Zeroizing::new([0u8; 64]);
                expand(&hk, &info, &mut k[..])?;
                PageCipher::Xts(XtsCipher::new(&k))
            }
            Suite::External(code) => {
                let (suite, key) = self
                    .external
                    .as_ref()
                    .ok_or(CryptoError::SuiteUnavailable(code))?;
                PageCipher::External(suite.cipher(key, &self.params, gen)?)
            }
        };
        let c = Arc::new(c);
        if self.first.set((*gen, c.clone())).is_ok() {
            return Ok(c);
        }
        let mut cache = self.ciphers.write_locked();
        if cache.len() >= GENERATION_CACHE {
            cache.clear();
        }
        cache.insert(*gen, c.clone());
        Ok(c)
    }

    /// [`PmoKeys::cipher`], borrowed where it can be (see [`Held`]).
    fn held(&self, gen: &KeyGen) -> Result<Held<'_>, CryptoError> {
        match self.first.get() {
            Some((g, c)) if g == gen => Ok(Held::Borrowed(c)),
            _ => self.cipher(gen).map(Held::Shared),
        }
    }

    fn tweak(id: &PageId) -> [u8; 16] {
        let mut t = [0u8; 16];
        t[..4].copy_from_slice(&id.page.to_le_bytes());
        t[4..12].copy_from_slice(&id.version.to_le_bytes());
        t[12..].copy_from_slice(&(id.uid as u32).to_le_bytes());
        t
    }

    fn binding(id: &PageId) -> [u8; 36] {
        let mut b = [0u8; 36];
        b[..8].copy_from_slice(&id.uid.to_le_bytes());
        b[8..12].copy_from_slice(&id.page.to_le_bytes());
        b[12..20].copy_from_slice(&id.version.to_le_bytes());
        b[20..].copy_from_slice(&id.gen);
        b
    }

    /// Keyed BLAKE3 tag of a page as stored (`xts-blake3`, `tee-blake3`; GCM tags come out
    /// of `seal_page`, an external suite's out of its cipher).
    fn mac(&self, id: &PageId, ct: &[u8; PAGE]) -> Tag {
        let mut tag = [0u8; TAG_LEN];
        // Ciphertext first: chunk-aligned input lets BLAKE3 hash its four 1 KiB chunks in
        // parallel SIMD lanes; the fixed-size binding follows.
        let mut h = blake3::Hasher::new_keyed(&self.mac_key);
        h.update(ct);
        h.update(b"page");
        h.update(&Self::binding(id));
        tag.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
        tag
    }

    /// True when tags can be computed from ciphertext alone (not GCM; external suites tag
    /// ciphertext too), so an `id` design may defer them.
    pub fn tags_separable(&self) -> bool {
        self.params.suite != Suite::AesGcm
    }

    /// Encrypts a page in place without computing its tag (XTS suites; `id` designs).
    pub fn encrypt_page(&self, id: PageId, data: &mut [u8; PAGE]) -> Result<(), CryptoError> {
        match self.held(&id.gen)?.get() {
            PageCipher::Xts(x) => Ok(x.encrypt(Self::tweak(&id), data)?),
            PageCipher::RangeKeyed => Ok(()),
            PageCipher::External(x) => x.encrypt(&id, data),
            PageCipher::Gcm(_) => Err(CryptoError::Aead),
        }
    }

    /// The tag of a ciphertext page (every suite but GCM).
    pub fn tag_page(&self, id: PageId, ct: &[u8; PAGE]) -> Result<Tag, CryptoError> {
        match self.params.suite {
            Suite::AesGcm => Err(CryptoError::Aead),
            Suite::External(_) => match self.held(&id.gen)?.get() {
                PageCipher::External(x) => Ok(x.tag(&id, ct)),
                _ => Err(CryptoError::Aead),
            },
            _ => Ok(self.mac(&id, ct)),
        }
    }

    /// Encrypts a page in place and returns its tag.
    pub fn seal_page(&self, id: PageId, data: &mut [u8; PAGE]) -> Result<Tag, CryptoError> {
        match self.held(&id.gen)?.get() {
            PageCipher::Xts(x) => {
                x.encrypt(Self::tweak(&id), data)?;
                Ok(self.mac(&id, data))
            }
            PageCipher::RangeKeyed => Ok(self.mac(&id, data)),
            PageCipher::External(x) => {
                x.encrypt(&id, data)?;
                Ok(x.tag(&id, data))
            }
            PageCipher::Gcm(k) => {
                let tag = k
                    .seal_in_place_separate_tag(
                        gcm_nonce(&id),
                        ring::aead::Aad::from(Self::binding(&id)),
                        data,
                    )
                    .map_err(|_| CryptoError::Aead)?;
                let mut out = [0u8; TAG_LEN];
                out.copy_from_slice(tag.as_ref());
                Ok(out)
            }
        }
    }

    /// Verifies and decrypts a page in place. On failure `data` holds no plaintext (it is zeroed).
    pub fn open_page(
        &self,
        id: PageId,
        data: &mut [u8; PAGE],
        tag: &Tag,
    ) -> Result<(), CryptoError> {
        self.open_page_cached(id, data, tag, &mut CipherCache::default())
    }

    /// [`PmoKeys::open_page`] through `cache` (see [`CipherCache`]); the cache must be used
    /// with these keys only.
    pub fn open_page_cached<'k>(
        &'k self,
        id: PageId,
        data: &mut [u8; PAGE],
        tag: &Tag,
        cache: &mut CipherCache<'k>,
    ) -> Result<(), CryptoError> {
        if !matches!(&cache.0, Some((g, _)) if *g == id.gen) {
            match self.held(&id.gen) {
                Ok(c) => cache.0 = Some((id.gen, c)),
                Err(e) => {
                    wipe(data);
                    return Err(e);
                }
            }
        }
        let Some((_, cipher)) = &cache.0 else {
            wipe(data);
            return Err(CryptoError::Aead);
        };
        match cipher.get() {
            PageCipher::Xts(x) => {
                let t = self.mac(&id, data);
                if !bool::from(t.ct_eq(tag)) {
                    wipe(data);
                    return Err(CryptoError::BadTag);
                }
                x.decrypt(Self::tweak(&id), data)?;
                Ok(())
            }
            PageCipher::External(x) => {
                if !bool::from(x.tag(&id, data).ct_eq(tag)) {
                    wipe(data);
                    return Err(CryptoError::BadTag);
                }
                if let Err(e) = x.decrypt(&id, data) {
                    wipe(data);
                    return Err(e);
                }
                Ok(())
            }
            PageCipher::RangeKeyed => {
                if !bool::from(self.mac(&id, data).ct_eq(tag)) {
                    wipe(data);
                    return Err(CryptoError::BadTag);
                }
                Ok(())
            }
            PageCipher::Gcm(k) => {
                // ring authenticates while it decrypts, so `data` holds unverified plaintext
                // until the call returns; it is wiped before a failure is reported. `data` is
                // the caller's own buffer (`&mut`): nobody else sees it in between.
                let ok = k
                    .open_in_place_separate_tag(
                        gcm_nonce(&id),
                        ring::aead::Aad::from(Self::binding(&id)),
                        ring::aead::Tag::from(*tag),
                        &mut data[..],
                        0..,
                    )
                    .is_ok();
                if !ok {
                    wipe(data);
                    return Err(CryptoError::BadTag);
                }
                Ok(())
            }
        }
    }
}

fn gcm_nonce(id: &PageId) -> ring::aead::Nonce {
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(&id.page.to_le_bytes());
    n[4..].copy_from_slice(&id.version.to_le_bytes());
    ring::aead::Nonce::assume_unique_for_key(n)
}

#[cfg(test)]
mod tests;
