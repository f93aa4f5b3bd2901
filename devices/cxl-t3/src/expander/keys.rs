//! TEE range keys: program, look up and clear the key of a DPA range; a key change first
//! drains the range's cached blocks, so no block is ever seen under two keys.

use super::*;

impl CachedMedia {
    /// Keys DPA `[dpa_start, dpa_end)` (4 KiB aligned, exclusive end) as
    /// range `id`; a 32-byte key selects XTS-AES-128, a 64-byte key
    /// XTS-AES-256 (one algorithm at a time, see [`crate::tee`]). The
    /// range's cached blocks are written back (as they were) and dropped
    /// first, so every later fill decrypts and every later write-back
    /// encrypts. Media already in the range is taken as ciphertext under
    /// this key: programming the key a range was written with makes it read
    /// as plaintext again.
    pub fn set_range_key(
        &self,
        id: u16,
        dpa_start: u64,
        dpa_end: u64,
        key: &[u8],
    ) -> Result<(), ExpanderError> {
        let _cfg = self.reconfig.write_locked();
        {
            let tee = self.tee_read();
            tee.check(id, dpa_start, dpa_end)?;
            self.drain_locked(dpa_start, dpa_end, &tee)?;
        }
        self.tee.write_locked().set(id, dpa_start, dpa_end, key)?;
        Ok(())
    }

    /// The `[start, end)` DPA range keyed as `id`, if any (never the key).
    pub fn range_key(&self, id: u16) -> Option<(u64, u64)> {
        self.tee_read().range_of(id)
    }

    /// Clears range `id`: its cached blocks are written back (encrypted)
    /// and dropped, then its key is wiped. From then on its blocks are
    /// filled without decryption: the range reads as its ciphertext.
    pub fn clear_range_key(&self, id: u16) -> Result<(), ExpanderError> {
        let _cfg = self.reconfig.write_locked();
        let (start, end) = {
            let tee = self.tee_read();
            let (s, e) = tee.range_of(id).ok_or(TeeError::NoSuchId(id))?;
            self.drain_locked(s, e, &tee)?;
            (s, e)
        };
        let cleared = self.tee.write_locked().clear(id)?;
        debug_assert_eq!(cleared, (start, end));
        Ok(())
    }
}
