//! [`Suite`]: which page cipher and tag a PMO uses, by its stable on-media code.

use crate::CryptoError;

/// Which page cipher and tag a PMO uses; fixed at create time, stored in the PMO record and
/// bound under its record MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Suite {
    /// AES-XTS-256 with per-(page, version) tweak + keyed BLAKE3 MAC. The default of the
    /// designs that defer tags (its tag is computed apart from the encryption).
    XtsBlake3,
    /// AES-256-GCM with a (page, version) nonce. The default of every design that does not
    /// defer tags: one pass encrypts and authenticates.
    AesGcm,
    /// No page cipher (the medium's TEE range key encrypts the extent) + keyed BLAKE3 MAC.
    /// Only on range-encrypted extents.
    TeeBlake3,
    /// A suite this crate does not implement, by its on-media code (never 0 and never a
    /// built-in suite's): a record naming it decodes, but its pages are sealed and opened
    /// only through an [`ExternalSuite`](crate::ExternalSuite) the store handle was given.
    /// The benchmark-only suites of the design-comparison harness are such.
    External(u8),
}

impl Suite {
    /// Every suite this crate implements: what a product program can create.
    pub const ALL: &'static [Suite] = &[Suite::XtsBlake3, Suite::AesGcm, Suite::TeeBlake3];

    /// Stable on-media number. Codes 2 and 4 are the harness's benchmark suites (`paper`,
    /// `xts-nomac-bench`).
    pub fn code(self) -> u8 {
        match self {
            Suite::XtsBlake3 => 1,
            Suite::AesGcm => 3,
            Suite::TeeBlake3 => 5,
            Suite::External(c) => c,
        }
    }

    /// Parses the on-media number: a built-in suite, or [`Suite::External`] for any other
    /// nonzero code (whether it can be used is up to the store handle's registered suites).
    pub fn from_code(c: u8) -> Result<Self, CryptoError> {
        if c == 0 {
            return Err(CryptoError::UnknownSuite(c.to_string()));
        }
        Ok(Self::ALL
            .iter()
            .copied()
            .find(|s| s.code() == c)
            .unwrap_or(Suite::External(c)))
    }

    /// True for a code [`Suite::External`] may carry: nonzero, no built-in suite's.
    pub fn external_code(c: u8) -> bool {
        c != 0 && !Self::ALL.iter().any(|s| s.code() == c)
    }

    /// Name used on the command line and in docs; `external` for a suite of another crate
    /// (its own name is with its implementation, [`ExternalSuites::name_of`](crate::ExternalSuites::name_of)).
    pub fn name(self) -> &'static str {
        match self {
            Suite::XtsBlake3 => "xts-blake3",
            Suite::AesGcm => "aes-gcm",
            Suite::TeeBlake3 => "tee-blake3",
            Suite::External(_) => "external",
        }
    }

    /// True when pages are stored as plaintext for the medium to encrypt: such a PMO may only
    /// live on an extent the medium encrypts itself.
    pub fn needs_range_encryption(self) -> bool {
        self == Suite::TeeBlake3
    }

    /// Parses a command-line name: the built-in suites only, so no product tool creates a
    /// suite of another crate.
    pub fn from_name(s: &str) -> Result<Self, CryptoError> {
        Self::ALL
            .iter()
            .copied()
            .find(|x| x.name() == s)
            .ok_or_else(|| CryptoError::UnknownSuite(s.chars().take(40).collect()))
    }
}

impl std::fmt::Display for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Suite::External(c) => write!(f, "external suite {c}"),
            s => f.write_str(s.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suite_codes_and_names_round_trip() {
        for s in Suite::ALL {
            assert_eq!(Suite::from_code(s.code()), Ok(*s));
            assert_eq!(Suite::from_name(s.name()), Ok(*s));
            assert!(!Suite::external_code(s.code()));
        }
    }

    /// Another crate's suite decodes from a record (its code survives), but no name of one
    /// parses: a product tool cannot ask for it.
    #[test]
    fn other_codes_are_external_and_not_nameable() {
        assert!(Suite::from_code(0).is_err());
        assert!(!Suite::external_code(0));
        for c in [2u8, 4, 6, 200, 255] {
            assert_eq!(Suite::from_code(c), Ok(Suite::External(c)));
            assert_eq!(Suite::External(c).code(), c);
            assert!(Suite::external_code(c));
        }
        for name in ["paper", "xts-nomac-bench", "external"] {
            assert!(Suite::from_name(name).is_err(), "{name}");
        }
        assert_eq!(Suite::External(4).to_string(), "external suite 4");
        assert_eq!(Suite::AesGcm.to_string(), "aes-gcm");
    }
}
