//! The redo journal kept in a PMO's journal area (the papers' TSC, temporary shadow copy).
//!
//! A psync writes every new ciphertext page and every changed tree group into the journal area as
//! (destination, bytes) entries and persists them; only then does the PMO record commit to the
//! journal's length and checksum (state TC). Applying the journal copies the entries to their
//! destinations. Recovery re-applies a committed journal (idempotent) and discards an uncommitted
//! one, so a crash at any instant yields exactly the old or the new PMO.

use super::codec::{Dec, Enc};
use pmo_media::{Medium, MediumError};

const MAGIC: u64 = 0x4c4e_524a_4f4d_5021; // "!PMOJRNL"
/// Bytes reserved for the journal header.
pub const HEADER: u64 = 64;
const ENTRY_HEAD: u64 = 16;

/// Journal errors.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The journal does not fit the journal area.
    #[error("journal of {0} bytes exceeds the journal area")]
    TooBig(u64),
    /// Header, checksum or an entry is invalid.
    #[error("journal damaged: {0}")]
    Damaged(&'static str),
    /// The medium failed.
    #[error(transparent)]
    Medium(#[from] MediumError),
}

/// Bytes a journal entry of `len` data bytes takes.
pub fn entry_cost(len: u64) -> u64 {
    ENTRY_HEAD + len.div_ceil(8) * 8
}

/// Streams entries into the journal area at `base` (absolute offset), at most `cap` bytes.
pub struct JournalWriter<'a> {
    m: &'a dyn Medium,
    base: u64,
    cap: u64,
    at: u64,
    count: u64,
    hasher: blake3::Hasher,
}

impl<'a> JournalWriter<'a> {
    /// Starts a journal.
    pub fn new(m: &'a dyn Medium, base: u64, cap: u64) -> Self {
        Self {
            m,
            base,
            cap,
            at: HEADER,
            count: 0,
            hasher: blake3::Hasher::new(),
        }
    }

    /// Appends "copy `data` to extent-relative offset `dest`". `covered = false` leaves the data
    /// out of the journal checksum: used for ciphertext pages, which carry their own keyed tag
    /// (checked at every fault), so hashing them twice per psync buys nothing.
    pub fn append(&mut self, dest: u64, data: &[u8], covered: bool) -> Result<(), JournalError> {
        let cost = entry_cost(data.len() as u64);
        if self.at + cost > self.cap {
            return Err(JournalError::TooBig(self.at + cost));
        }
        let mut h = Enc::default();
        h.u64(dest).u32(data.len() as u32).u32(u32::from(!covered));
        self.m.write(self.base + self.at, &h.0)?;
        self.m.write(self.base + self.at + ENTRY_HEAD, data)?;
        let pad = (cost - ENTRY_HEAD) as usize - data.len();
        if pad > 0 {
            self.m.write(
                self.base + self.at + ENTRY_HEAD + data.len() as u64,
                &[0u8; 8][..pad],
            )?;
        }
        self.hasher.update(&h.0);
        if covered {
            self.hasher.update(data);
            self.hasher.update(&[0u8; 8][..pad]);
        }
        self.at += cost;
        self.count += 1;
        Ok(())
    }

    /// Writes the header and persists the whole journal. Returns (length, checksum) for the
    /// commit record.
    pub fn finish(self, epoch: u64) -> Result<(u64, [u8; 32]), JournalError> {
        let body = *self.hasher.finalize().as_bytes();
        let mut h = Enc::default();
        h.u64(MAGIC).u64(epoch).u64(self.count).u64(self.at);
        let sum = {
            let mut x = blake3::Hasher::new();
            x.update(&h.0);
            x.update(&body);
            *x.finalize().as_bytes()
        };
        self.m.write(self.base, &h.0)?;
        self.m.persist(self.base, self.at)?;
        Ok((self.at, sum))
    }
}

/// Reads and checks a committed journal; returns its entry count. `limit` bounds destinations
/// (extent-relative), `cap` the journal area size. Streams: memory use does not depend on what the
/// (hostile) header claims.
fn scan(
    m: &dyn Medium,
    base: u64,
    cap: u64,
    len: u64,
    sum: &[u8; 32],
    epoch: u64,
    limit: u64,
) -> Result<u64, JournalError> {
    if len < HEADER || len > cap {
        return Err(JournalError::Damaged("length"));
    }
    let mut hb = [0u8; 32];
    m.read(base, &mut hb)?;
    let mut d = Dec::new(&hb);
    let bad = |_| JournalError::Damaged("header");
    let (magic, jepoch, count, jlen) = (
        d.u64().map_err(bad)?,
        d.u64().map_err(bad)?,
        d.u64().map_err(bad)?,
        d.u64().map_err(bad)?,
    );
    if magic != MAGIC || jepoch != epoch || jlen != len {
        return Err(JournalError::Damaged("header"));
    }
    let mut body = blake3::Hasher::new();
    let mut at = HEADER;
    let mut buf = vec![0u8; 1 << 16];
    for _ in 0..count {
        if at + ENTRY_HEAD > len {
            return Err(JournalError::Damaged("entry beyond end"));
        }
        let mut eh = [0u8; 16];
        m.read(base + at, &mut eh)?;
        let mut d = Dec::new(&eh);
        let dest = d.u64().map_err(bad)?;
        let elen = d.u32().map_err(bad)? as u64;
        let flags = d.u32().map_err(bad)?;
        if flags > 1 {
            return Err(JournalError::Damaged("entry flags"));
        }
        let cost = entry_cost(elen);
        if at + cost > len || dest.checked_add(elen).is_none_or(|e| e > limit) {
            return Err(JournalError::Damaged("entry bounds"));
        }
        body.update(&eh);
        let mut off = at + ENTRY_HEAD;
        let end = if flags == 1 { off } else { at + cost };
        while off < end {
            let n = ((end - off) as usize).min(buf.len());
            m.read(base + off, &mut buf[..n])?;
            body.update(&buf[..n]);
            off += n as u64;
        }
        at += cost;
    }
    if at != len {
        return Err(JournalError::Damaged("length mismatch"));
    }
    let mut h = Enc::default();
    h.u64(MAGIC).u64(epoch).u64(count).u64(len);
    let mut x = blake3::Hasher::new();
    x.update(&h.0);
    x.update(body.finalize().as_bytes());
    if x.finalize().as_bytes() != sum {
        return Err(JournalError::Damaged("checksum"));
    }
    Ok(count)
}

/// Copies entries held in memory to `ext_off + dest` and persists them (the psync fast path:
/// the same bytes were just written to the journal area, so there is no need to read them back).
pub fn apply_entries(
    m: &dyn Medium,
    ext_off: u64,
    entries: &[(u64, &[u8])],
) -> Result<(), JournalError> {
    let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(entries.len());
    for (dest, data) in entries {
        m.write(ext_off + dest, data)?;
        ranges.push((ext_off + dest, data.len() as u64));
    }
    persist_merged(m, ranges)
}

fn persist_merged(m: &dyn Medium, mut ranges: Vec<(u64, u64)>) -> Result<(), JournalError> {
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (o, l) in ranges {
        match merged.last_mut() {
            Some((mo, ml)) if *mo + *ml >= o => *ml = (*ml).max(o + l - *mo),
            _ => merged.push((o, l)),
        }
    }
    for (o, l) in merged {
        m.persist(o, l)?;
    }
    Ok(())
}

/// Verifies a committed journal, then copies every entry to `ext_off + dest` and persists it.
#[allow(clippy::too_many_arguments)]
pub fn apply(
    m: &dyn Medium,
    base: u64,
    cap: u64,
    len: u64,
    sum: &[u8; 32],
    epoch: u64,
    ext_off: u64,
    limit: u64,
) -> Result<(), JournalError> {
    let count = scan(m, base, cap, len, sum, epoch, limit)?;
    // Verified: walk the entries again and copy them, persisting runs of adjacent ranges.
    let mut buf = vec![0u8; 1 << 16];
    let mut run: Option<(u64, u64)> = None;
    let mut at = HEADER;
    for _ in 0..count {
        let mut eh = [0u8; 16];
        m.read(base + at, &mut eh)?;
        let mut d = Dec::new(&eh);
        let bad = |_| JournalError::Damaged("header");
        let dest = d.u64().map_err(bad)?;
        let elen = d.u32().map_err(bad)? as u64;
        let mut done = 0;
        while done < elen {
            let n = ((elen - done) as usize).min(buf.len());
            m.read(base + at + ENTRY_HEAD + done, &mut buf[..n])?;
            m.write(ext_off + dest + done, &buf[..n])?;
            done += n as u64;
        }
        let (o, l) = (ext_off + dest, elen);
        run = match run {
            Some((ro, rl)) if o >= ro && o <= ro + rl => Some((ro, rl.max(o + l - ro))),
            Some((ro, rl)) => {
                m.persist(ro, rl)?;
                Some((o, l))
            }
            None => Some((o, l)),
        };
        at += entry_cost(elen);
    }
    if let Some((ro, rl)) = run {
        m.persist(ro, rl)?;
    }
    Ok(())
}

/// Checks a committed journal without applying it (fsck).
pub fn check(
    m: &dyn Medium,
    base: u64,
    cap: u64,
    len: u64,
    sum: &[u8; 32],
    epoch: u64,
    limit: u64,
) -> Result<(), JournalError> {
    scan(m, base, cap, len, sum, epoch, limit).map(|_| ())
}
