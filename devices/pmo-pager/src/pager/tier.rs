//! The CXL tier for dirty pages demoted out of local DRAM: device memory of the expander.
//!
//! A clean page leaves local DRAM by being dropped (its ciphertext is in the store). A page
//! written since the last psync holds data that exists nowhere else, so it moves here: into
//! the expander's volatile device memory, which the device's TEE keeps under a range key.
//! The model holds only ciphertext: each page is sealed with AES-XTS-256 under a key drawn
//! at random for this run (volatile memory needs no key that outlives it), tweaked by its
//! slot and a sealing number never used before under that key, before it enters the region, and opened again on the way back. Plaintext of a
//! demoted page is therefore never outside local DRAM, neither here nor on media.
//!
//! A slot is owned by exactly one [`Spilled`] handle (not `Clone`), so two users can never
//! read or write the same slot. Transfers are counted; their latency is not charged (device
//! DRAM behind CXL costs about 75 ns more than local DRAM per access, far below a fault).

use locked::Locked;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use pmo_crypto::{random_bytes, XtsCipher, PAGE};
use uffd::AnonMap;
use zeroize::Zeroize;

/// Errors of the device tier.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// A capacity of no pages, or too many to address.
    #[error("device tier of {0} pages is not 1 to 2^32 pages")]
    BadCapacity(u64),
    /// The region cannot be mapped.
    #[error("map device memory: {0}")]
    Map(std::io::Error),
    /// No key could be drawn.
    #[error("device memory key: {0}")]
    Key(pmo_crypto::CryptoError),
    /// Every slot is in use.
    #[error("device memory is full ({0} pages)")]
    Full(u64),
    /// The cipher refused a page (cannot happen for whole pages).
    #[error("device memory cipher: {0}")]
    Cipher(pmo_crypto::XtsError),
}

/// One page held in the device tier; give it back with [`DeviceTier::take`] or
/// [`DeviceTier::free`]. Holds its slot and the sealing number its tweak was made of.
#[derive(Debug, PartialEq, Eq)]
pub struct Spilled {
    slot: u32,
    seal: u64,
}

/// Expander device memory holding sealed dirty pages.
pub struct DeviceTier {
    map: AnonMap,
    cipher: XtsCipher,
    capacity: u64,
    free: Mutex<Vec<u32>>,
    used: AtomicU64,
    /// Pages sealed so far: each seal's tweak is unique for this key.
    seals: AtomicU64,
}

impl DeviceTier {
    /// A region of `pages` pages (mapped lazily: only slots in use take host memory).
    pub fn new(pages: u64) -> Result<Self, TierError> {
        if pages == 0 || pages > 1 << 32 {
            return Err(TierError::BadCapacity(pages));
        }
        let len =
            usize::try_from(pages * PAGE as u64).map_err(|_| TierError::BadCapacity(pages))?;
        let map = AnonMap::new(len).map_err(TierError::Map)?;
        let mut key = [0u8; 64];
        random_bytes(&mut key).map_err(TierError::Key)?;
        let cipher = XtsCipher::new(&key);
        key.zeroize();
        // Highest slot last, so the lowest is handed out first (pop).
        let free = (0..pages).rev().map(|s| s as u32).collect();
        Ok(Self {
            map,
            cipher,
            capacity: pages,
            free: Mutex::new(free),
            used: AtomicU64::new(0),
            seals: AtomicU64::new(0),
        })
    }

    /// Slots in use.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn slot_ptr(&self, slot: &Spilled) -> *mut u8 {
        (self.map.addr() + u64::from(slot.slot) * PAGE as u64) as *mut u8
    }

    /// Slot and sealing number: a slot reused for a new page never repeats a tweak, so two
    /// snapshots of device memory show no equal blocks between an old and a new page.
    fn tweak(slot: &Spilled) -> [u8; 16] {
        let mut t = [0u8; 16];
        t[..4].copy_from_slice(&slot.slot.to_le_bytes());
        t[8..].copy_from_slice(&slot.seal.to_le_bytes());
        t
    }

    /// Seals `page` into a free slot.
    pub fn put(&self, page: &[u8; PAGE]) -> Result<Spilled, TierError> {
        let slot = Spilled {
            slot: self
                .free
                .locked()
                .pop()
                .ok_or(TierError::Full(self.capacity))?,
            seal: self.seals.fetch_add(1, Ordering::Relaxed),
        };
        let mut sealed = Box::new(*page);
        if let Err(e) = self.cipher.encrypt(Self::tweak(&slot), &mut sealed[..]) {
            sealed.zeroize();
            self.free.locked().push(slot.slot);
            return Err(TierError::Cipher(e));
        }
        // SAFETY: the slot lies inside the mapping (slot < capacity) and is owned by
        // `slot` alone, so nothing else reads or writes these bytes.
        unsafe { std::ptr::copy_nonoverlapping(sealed.as_ptr(), self.slot_ptr(&slot), PAGE) };
        self.used.fetch_add(1, Ordering::Relaxed);
        Ok(slot)
    }

    /// Opens the page in `slot` into `out`; the slot stays in use.
    pub fn read(&self, slot: &Spilled, out: &mut [u8; PAGE]) -> Result<(), TierError> {
        // SAFETY: as in `put`; the slot holds a sealed page written by `put`.
        unsafe { std::ptr::copy_nonoverlapping(self.slot_ptr(slot), out.as_mut_ptr(), PAGE) };
        self.cipher
            .decrypt(Self::tweak(slot), &mut out[..])
            .map_err(|e| {
                out.zeroize();
                TierError::Cipher(e)
            })
    }

    /// Opens the page in `slot` into `out` and frees the slot.
    pub fn take(&self, slot: Spilled, out: &mut [u8; PAGE]) -> Result<(), TierError> {
        let r = self.read(&slot, out);
        self.free(slot);
        r
    }

    /// Frees `slot` (its sealed bytes are dropped).
    pub fn free(&self, slot: Spilled) {
        let addr = self.map.addr() + u64::from(slot.slot) * PAGE as u64;
        if let Err(e) = self.map.discard(addr, PAGE as u64) {
            // Sealed bytes only; the slot is reused and overwritten all the same.
            log::warn!("pmo: drop device memory slot {}: {e}", slot.slot);
        }
        self.used.fetch_sub(1, Ordering::Relaxed);
        self.free.locked().push(slot.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_round_trip_sealed_and_slots_are_reused() {
        let t = DeviceTier::new(2).unwrap();
        let a = [0xa5u8; PAGE];
        let mut b = [0u8; PAGE];
        b[..5].copy_from_slice(b"hello");
        let sa = t.put(&a).unwrap();
        let sb = t.put(&b).unwrap();
        assert!(matches!(t.put(&a), Err(TierError::Full(2))));
        assert_eq!(t.used(), 2);
        // The region holds ciphertext only.
        // SAFETY: both slots are inside the mapping; nothing writes them meanwhile.
        let raw = unsafe { std::slice::from_raw_parts(t.map.addr() as *const u8, 2 * PAGE) };
        assert!(!raw.windows(5).any(|w| w == b"hello"));
        assert!(raw[..PAGE].iter().any(|&x| x != 0xa5));
        let mut out = [0u8; PAGE];
        t.read(&sb, &mut out).unwrap();
        assert_eq!(out, b);
        t.take(sa, &mut out).unwrap();
        assert_eq!(out, a);
        assert_eq!(t.used(), 1);
        let again = t.put(&b).unwrap();
        t.take(again, &mut out).unwrap();
        assert_eq!(out, b);
        t.free(sb);
        assert_eq!(t.used(), 0);
        assert!(matches!(DeviceTier::new(0), Err(TierError::BadCapacity(0))));
    }

    #[test]
    fn a_reused_slot_never_repeats_a_ciphertext() {
        // An observer of device memory snapshots sees the same slot hold the same page twice:
        // with a slot-only tweak the two ciphertexts would be equal.
        let t = DeviceTier::new(1).unwrap();
        let page = [0x5au8; PAGE];
        let snapshot = |t: &DeviceTier| {
            // SAFETY: slot 0 is inside the mapping and held by the caller's handle.
            unsafe { std::slice::from_raw_parts(t.map.addr() as *const u8, PAGE) }.to_vec()
        };
        let first = t.put(&page).unwrap();
        let before = snapshot(&t);
        t.free(first);
        let second = t.put(&page).unwrap();
        let after = snapshot(&t);
        assert!(before.chunks(16).zip(after.chunks(16)).all(|(a, b)| a != b));
        let mut out = [0u8; PAGE];
        t.take(second, &mut out).unwrap();
        assert_eq!(out, page);
    }
}
