//! Keys for PMO extents on media that encrypt ranges themselves (the CXL expander's TEE).

use super::CryptoError;
use hkdf::Hkdf;
use sha2::Sha256;
use zeroize::Zeroizing;

/// The cipher of the expander's TEE ranges that hold PMO extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RangeCipher {
    /// AES-XTS with two 128-bit keys (32 key bytes).
    Xts128,
    /// AES-XTS with two 256-bit keys (64 key bytes): the default.
    #[default]
    Xts256,
}

impl RangeCipher {
    /// Parses `xts-128` or `xts-256`.
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "xts-128" => Some(Self::Xts128),
            "xts-256" => Some(Self::Xts256),
            _ => None,
        }
    }

    /// The name [`RangeCipher::from_name`] parses.
    pub fn name(self) -> &'static str {
        match self {
            Self::Xts128 => "xts-128",
            Self::Xts256 => "xts-256",
        }
    }

    /// Key bytes the range needs (both XTS halves).
    pub fn key_len(self) -> usize {
        match self {
            Self::Xts128 => 32,
            Self::Xts256 => 64,
        }
    }

    /// HKDF salt: keys of the two ciphers are independent, never prefixes of each other.
    /// Version 2 binds the extent's owner (version 1 keys depended on the place alone).
    fn salt(self) -> &'static [u8] {
        match self {
            Self::Xts128 => b"pmovmm v2 tee extent xts-128",
            Self::Xts256 => b"pmovmm v2 tee extent",
        }
    }
}

/// The PMO service's source of inline-encryption keys for PMO extents on a
/// medium that encrypts ranges itself (the CXL expander's TEE).
///
/// Each extent gets its own AES-XTS key (256-bit by default, 128-bit by
/// choice: [`ExtentKeyring::with_cipher`]), derived from a master key the
/// VMM was given (a key file), the extent's table slot and place, and its
/// owner (a digest the store makes of the PMO's random uid, salt and key-check
/// value), so no range key is ever stored: the store announces its extents at
/// create and at open (`ExtentKeys::extent_in_use` of `pmo-media`) and the key
/// is derived again each time. A PMO created later in a destroyed PMO's slot
/// and place has another owner and so another key. A different master derives
/// different keys, and the media then reads as ciphertext that the store's own
/// page MACs reject.
pub struct ExtentKeyring {
    master: Zeroizing<Vec<u8>>,
    cipher: RangeCipher,
}

impl ExtentKeyring {
    /// Shortest master key accepted, in bytes.
    pub const MIN_MASTER: usize = 32;

    /// A keyring over `master` (at least [`Self::MIN_MASTER`] bytes; the caller wipes its copy).
    pub fn new(master: &[u8]) -> Result<Self, CryptoError> {
        if master.len() < Self::MIN_MASTER {
            return Err(CryptoError::ShortMaster(Self::MIN_MASTER));
        }
        Ok(Self {
            master: Zeroizing::new(master.to_vec()),
            cipher: RangeCipher::default(),
        })
    }

    /// The same keyring deriving keys for `cipher`. A store must be reopened with the cipher
    /// it was written with: another derives other keys, and its pages then fail their MACs.
    pub fn with_cipher(self, cipher: RangeCipher) -> Self {
        Self { cipher, ..self }
    }

    /// The cipher its keys are for.
    pub fn cipher(&self) -> RangeCipher {
        self.cipher
    }

    /// The key of the extent `[off, off+len)` in table slot `slot` owned by `owner`: 64
    /// bytes for XTS-256, 32 for XTS-128.
    pub fn extent_key(
        &self,
        slot: u32,
        off: u64,
        len: u64,
        owner: &[u8; 32],
    ) -> Zeroizing<Vec<u8>> {
        let hk = Hkdf::<Sha256>::new(Some(self.cipher.salt()), &self.master);
        let mut info = [0u8; 52];
        info[..4].copy_from_slice(&slot.to_le_bytes());
        info[4..12].copy_from_slice(&off.to_le_bytes());
        info[12..20].copy_from_slice(&len.to_le_bytes());
        info[20..].copy_from_slice(owner);
        let mut key = Zeroizing::new(vec![0u8; self.cipher.key_len()]);
        // 64 bytes is far below HKDF-SHA256's 8160-byte limit: expand cannot fail.
        if hk.expand(&info, &mut key).is_err() {
            key.fill(0);
        }
        key
    }
}

impl std::fmt::Debug for ExtentKeyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExtentKeyring(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: [u8; 32] = [9u8; 32];

    #[test]
    fn extent_keys_differ_per_extent_owner_and_master_and_repeat() {
        let k = ExtentKeyring::new(&[7u8; 32]).unwrap();
        let a = k.extent_key(0, 0x10_0000, 0x2_0000, &OWNER);
        assert_eq!(a.len(), 64);
        assert_eq!(
            a,
            k.extent_key(0, 0x10_0000, 0x2_0000, &OWNER),
            "derived again, same key"
        );
        assert_ne!(a, k.extent_key(1, 0x10_0000, 0x2_0000, &OWNER));
        assert_ne!(a, k.extent_key(0, 0x20_0000, 0x2_0000, &OWNER));
        assert_ne!(a, k.extent_key(0, 0x10_0000, 0x3_0000, &OWNER));
        // Same slot and place, another PMO (another owner): another key.
        let mut later = OWNER;
        later[31] ^= 1;
        assert_ne!(a, k.extent_key(0, 0x10_0000, 0x2_0000, &later));
        let other = ExtentKeyring::new(&[8u8; 32]).unwrap();
        assert_ne!(a, other.extent_key(0, 0x10_0000, 0x2_0000, &OWNER));
        // The two XTS halves differ (XTS needs distinct data and tweak keys).
        assert_ne!(a[..32], a[32..]);
        assert_eq!(
            ExtentKeyring::new(&[1u8; 31]).err(),
            Some(CryptoError::ShortMaster(32))
        );
        assert_eq!(format!("{k:?}"), "ExtentKeyring(<redacted>)");
    }

    #[test]
    fn xts_128_keys_are_half_as_long_and_independent_of_xts_256() {
        let k256 = ExtentKeyring::new(&[7u8; 32]).unwrap();
        let k128 = ExtentKeyring::new(&[7u8; 32])
            .unwrap()
            .with_cipher(RangeCipher::Xts128);
        assert_eq!(k128.cipher(), RangeCipher::Xts128);
        let (a, b) = (
            k256.extent_key(3, 0, 0x1000, &OWNER),
            k128.extent_key(3, 0, 0x1000, &OWNER),
        );
        assert_eq!((a.len(), b.len()), (64, 32));
        assert_ne!(a[..32], b[..], "not a prefix of the 256-bit key");
        assert_ne!(b[..16], b[16..]);
        for c in [RangeCipher::Xts128, RangeCipher::Xts256] {
            assert_eq!(RangeCipher::from_name(c.name()), Some(c));
        }
        assert_eq!(RangeCipher::from_name("xts-512"), None);
    }
}
