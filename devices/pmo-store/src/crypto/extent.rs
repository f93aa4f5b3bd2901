//! Keys for PMO extents on media that encrypt ranges themselves (the CXL expander's TEE).

use super::CryptoError;
use hkdf::Hkdf;
use sha2::Sha256;
use zeroize::Zeroizing;

/// The PMO service's source of inline-encryption keys for PMO extents on a
/// medium that encrypts ranges itself (the CXL expander's TEE).
///
/// Each extent gets its own AES-XTS-256 key, derived from a master key the
/// VMM was given (a key file) and the extent's table slot and place, so no
/// range key is ever stored: the store announces its extents at create and
/// at open (`Medium::extent_in_use`) and the key is derived again each time.
/// A different master derives different keys, and the media then reads as
/// ciphertext that the store's own page MACs reject.
pub struct ExtentKeyring {
    master: Zeroizing<Vec<u8>>,
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
        })
    }

    /// The 64-byte XTS-256 key of the extent `[off, off+len)` in table slot `slot`.
    pub fn extent_key(&self, slot: u32, off: u64, len: u64) -> Zeroizing<Vec<u8>> {
        let hk = Hkdf::<Sha256>::new(Some(b"pmovmm v1 tee extent"), &self.master);
        let mut info = [0u8; 20];
        info[..4].copy_from_slice(&slot.to_le_bytes());
        info[4..12].copy_from_slice(&off.to_le_bytes());
        info[12..].copy_from_slice(&len.to_le_bytes());
        let mut key = Zeroizing::new(vec![0u8; 64]);
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

    #[test]
    fn extent_keys_differ_per_extent_and_master_and_repeat() {
        let k = ExtentKeyring::new(&[7u8; 32]).unwrap();
        let a = k.extent_key(0, 0x10_0000, 0x2_0000);
        assert_eq!(a.len(), 64);
        assert_eq!(
            a,
            k.extent_key(0, 0x10_0000, 0x2_0000),
            "derived again, same key"
        );
        assert_ne!(a, k.extent_key(1, 0x10_0000, 0x2_0000));
        assert_ne!(a, k.extent_key(0, 0x20_0000, 0x2_0000));
        assert_ne!(a, k.extent_key(0, 0x10_0000, 0x3_0000));
        let other = ExtentKeyring::new(&[8u8; 32]).unwrap();
        assert_ne!(a, other.extent_key(0, 0x10_0000, 0x2_0000));
        // The two XTS halves differ (XTS needs distinct data and tweak keys).
        assert_ne!(a[..32], a[32..]);
        assert_eq!(
            ExtentKeyring::new(&[1u8; 31]).err(),
            Some(CryptoError::ShortMaster(32))
        );
        assert_eq!(format!("{k:?}"), "ExtentKeyring(<redacted>)");
    }
}
