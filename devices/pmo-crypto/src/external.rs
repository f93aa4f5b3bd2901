//! The registration point for page suites implemented outside this crate.
//!
//! The design-comparison harness compares the designs with suites no product may offer: the
//! authors' scheme (`paper`: one tweak per PMO, an unkeyed hash) and one without page
//! integrity (`xts-nomac-bench`). Their code lives in a crate only the harness links; a store
//! handle learns them from an [`ExternalSuites`] in its options. A program that never registers
//! them cannot create, seal or open such a PMO, whatever cargo features are unified.
//!
//! What stays here, for every suite: the key hierarchy (an external suite gets a key of its
//! own, expanded from the PMO's root key, never the root key or the MAC keys), the generation
//! cache, and the tag check (constant-time, before decryption, the page wiped on failure).

use crate::{CryptoError, KeyGen, KeyParams, PageId, Suite, Tag, PAGE};
use std::sync::Arc;

/// A page suite of another crate, under the code [`Suite::External`] carries.
pub trait ExternalSuite: Send + Sync {
    /// Its on-media code (nonzero, no built-in suite's: [`Suite::external_code`]).
    fn code(&self) -> u8;
    /// Its name, for the harness's options and reports.
    fn name(&self) -> &'static str;
    /// The cipher one writing generation `gen` of one PMO seals under (readers ask once per
    /// generation they meet), from the suite's own key of that PMO (`suite_key`, 32 bytes
    /// expanded from the PMO's root key for this suite alone) and the PMO's stored parameters.
    fn cipher(
        &self,
        suite_key: &[u8; 32],
        params: &KeyParams,
        gen: &KeyGen,
    ) -> Result<Box<dyn ExternalCipher>, CryptoError>;
}

/// One generation's cipher of an [`ExternalSuite`].
pub trait ExternalCipher: Send + Sync {
    /// Encrypts a page in place.
    fn encrypt(&self, id: &PageId, data: &mut [u8; PAGE]) -> Result<(), CryptoError>;
    /// Decrypts a page in place (its tag was checked before).
    fn decrypt(&self, id: &PageId, data: &mut [u8; PAGE]) -> Result<(), CryptoError>;
    /// The tag stored for a ciphertext page; the caller compares it in constant time.
    fn tag(&self, id: &PageId, ct: &[u8; PAGE]) -> Tag;
}

/// The external suites a store handle may use. Empty by default: a product program's.
#[derive(Clone, Default)]
pub struct ExternalSuites(Vec<Arc<dyn ExternalSuite>>);

impl ExternalSuites {
    /// No external suite.
    pub fn new() -> Self {
        Self::default()
    }

    /// These suites and `suite`; refused when its code is zero, a built-in suite's or
    /// registered already.
    pub fn with(mut self, suite: Arc<dyn ExternalSuite>) -> Result<Self, CryptoError> {
        let code = suite.code();
        if !Suite::external_code(code) || self.0.iter().any(|s| s.code() == code) {
            return Err(CryptoError::SuiteCodeTaken(code));
        }
        self.0.push(suite);
        Ok(self)
    }

    /// The implementation of `suite`, if it is an external suite registered here.
    pub fn get(&self, suite: Suite) -> Option<&Arc<dyn ExternalSuite>> {
        match suite {
            Suite::External(c) => self.0.iter().find(|s| s.code() == c),
            _ => None,
        }
    }

    /// True when pages of `suite` can be sealed and opened with these: a built-in suite, or
    /// an external one registered here.
    pub fn can_use(&self, suite: Suite) -> bool {
        !matches!(suite, Suite::External(_)) || self.get(suite).is_some()
    }

    /// The registered suite called `name`.
    pub fn named(&self, name: &str) -> Option<Suite> {
        self.0
            .iter()
            .find(|s| s.name() == name)
            .map(|s| Suite::External(s.code()))
    }

    /// The name of `suite`: its own for a built-in or a registered one, `None` for an
    /// external suite not registered here.
    pub fn name_of(&self, suite: Suite) -> Option<&'static str> {
        match suite {
            Suite::External(_) => self.get(suite).map(|s| s.name()),
            s => Some(s.name()),
        }
    }

    /// True when no suite is registered.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Equal when the same codes are registered (the implementations are not compared).
impl PartialEq for ExternalSuites {
    fn eq(&self, other: &Self) -> bool {
        let codes = |s: &Self| {
            let mut c: Vec<u8> = s.0.iter().map(|x| x.code()).collect();
            c.sort_unstable();
            c
        };
        codes(self) == codes(other)
    }
}

impl Eq for ExternalSuites {}

impl std::fmt::Debug for ExternalSuites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|s| (s.code(), s.name())))
            .finish()
    }
}
