//! HDM (host-managed device memory) decoders of the component register
//! block: the guest programs an HPA range and a DPA skip and commits it;
//! the device validates and either marks it committed or sets the error
//! bit.
//!
//! A commit is the moment the VMM maps the decoded range as guest memory,
//! so the outcome is returned as a [`DecoderEvent`] to the caller instead of
//! being acted on here.
//!
//! # Why committed DPA ranges never overlap
//!
//! A decoder's DPA base is computed once, at commit, as the end of the
//! previous decoder's DPA range plus this decoder's skip (CXL 2.0
//! 8.2.5.12.20: `DPABase[m] = DPABase[m-1] + DPASize[m-1] + DPASkip[m]`),
//! and it is frozen while the decoder stays committed (its registers are
//! read-only then). Decoder `m` commits only if decoder `m - 1` is
//! committed and **no decoder above `m` is**; uncommitting is allowed in any
//! order (newer Linux uncommits out of order and recommits only after the
//! higher decoders are gone). So whenever a decoder commits it is the
//! highest committed one, directly above its committed predecessor, and by
//! induction the committed decoders' DPA ranges (and HPA ranges, which must
//! ascend the same way) are ordered by index and disjoint: an out-of-order
//! uncommit followed by a recommit can never map a DPA twice. The commit
//! check still compares the new range with every committed one before it
//! lets a commit through, so a mistake in that argument is a refused
//! commit, not aliased memory.

/// Decoding granularity of HPA base, size and DPA skip: 256 MiB.
pub const HDM_ALIGN: u64 = 256 << 20;

/// Decoders a memory device offers (advertised in the HDM capability).
pub const DECODER_COUNT: usize = 4;

// Register offsets inside the HDM decoder capability structure (CXL 2.0
// 8.2.5.12, HDM Decoder Capability Structure).

/// HDM Decoder Capability register (read-only): decoder count, target
/// count and which address bits interleaving may use.
pub const HDM_CAP: u64 = 0x00;
/// HDM Decoder Global Control register: bit 0 Poison On Decode Error
/// Enable, bit 1 HDM Decoder Enable ([`GLOBAL_ENABLE`]).
pub const HDM_GLOBAL_CTRL: u64 = 0x04;
/// Decoder `n`'s registers start at `DECODER_BASE + n * DECODER_STRIDE`.
pub const DECODER_BASE: u64 = 0x10;
/// Bytes between the register blocks of consecutive decoders.
pub const DECODER_STRIDE: u64 = 0x20;

// Register offsets inside one decoder's block (the `D_*` registers of
// decoder `n`, CXL 2.0 8.2.5.12). Base, size and skip keep only bits 63:28:
// they count in 256 MiB units ([`HDM_ALIGN`]).

/// Decoder Base Low: bits 31:28 of the HPA base; lower bits read as zero.
pub const D_BASE_LOW: u64 = 0x00;
/// Decoder Base High: bits 63:32 of the HPA base.
pub const D_BASE_HIGH: u64 = 0x04;
/// Decoder Size Low: bits 31:28 of the decoded size; lower bits read as zero.
pub const D_SIZE_LOW: u64 = 0x08;
/// Decoder Size High: bits 63:32 of the decoded size.
pub const D_SIZE_HIGH: u64 = 0x0c;
/// Decoder Control: interleave settings, lock, commit handshake and target
/// type (the `CTRL_*` bits).
pub const D_CTRL: u64 = 0x10;
/// Decoder DPA Skip Low (device decoders only): bits 31:28 of the DPA bytes
/// left unused between the previous decoder's DPA range and this one.
pub const D_SKIP_LOW: u64 = 0x14;
/// Decoder DPA Skip High: bits 63:32 of the DPA skip.
pub const D_SKIP_HIGH: u64 = 0x18;

// Decoder Control register bits (CXL 2.0 8.2.5.12, Decoder Control).

/// Bits 3:0, Interleave Granularity (IG): bytes per interleave step, as
/// 256 << IG. Stored; with 1-way decoding it changes nothing.
pub const CTRL_IG_MASK: u32 = 0xf;
/// Bits 7:4, Interleave Ways (IW): 0 means 1 way. Only 0 commits here
/// (see [`CommitError::Ways`]).
pub const CTRL_IW_MASK: u32 = 0xf << 4;
/// Bit 8, Lock On Commit: once committed, the decoder's registers ignore
/// writes until the device is reset.
pub const CTRL_LOCK_ON_COMMIT: u32 = 1 << 8;
/// Bit 9, Commit: software sets it to ask for a commit (a 0 to 1
/// transition) and clears it to uncommit.
pub const CTRL_COMMIT: u32 = 1 << 9;
/// Bit 10, Committed (read-only): the device accepted the commit and the
/// decoder is decoding.
pub const CTRL_COMMITTED: u32 = 1 << 10;
/// Bit 11, Error Not Committed (read-only): the device refused the last
/// commit; cleared when software clears Commit.
pub const CTRL_ERR_NOT_COMMITTED: u32 = 1 << 11;
/// Bit 12, Target Device Type: 1 for a Type 3 target (a memory expander
/// like this one), 0 for a Type 2 target (an accelerator with its own
/// memory). Stored, not interpreted.
pub const CTRL_TYPE: u32 = 1 << 12;
const CTRL_WRITABLE: u32 =
    CTRL_IG_MASK | CTRL_IW_MASK | CTRL_LOCK_ON_COMMIT | CTRL_COMMIT | CTRL_TYPE;

/// Global Control bit 1, HDM Decoder Enable. Stored as written; this model
/// does not gate decoding on it.
pub const GLOBAL_ENABLE: u32 = 1 << 1;
/// Capability: interleave on address bits 11:8 and 14:12 supported.
const CAP_IL_11_8: u32 = 1 << 8;
const CAP_IL_14_12: u32 = 1 << 9;
/// Largest decoder count the CXL 2.0 capability field can express.
const MAX_DECODERS: usize = 10;

/// The register offset of decoder `index`'s register `reg` (`D_*`) inside
/// the capability, for drivers of the model (tests, fuzz targets).
pub fn decoder_reg(index: usize, reg: u64) -> u64 {
    DECODER_BASE + DECODER_STRIDE * index as u64 + reg
}

/// Why a commit was refused (also the reason logged by the VMM).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    /// The decoder's HPA base plus size overflows 64 bits (also reported
    /// for the previous decoder's range when that one wraps).
    #[error("decoder {0}: base + size wraps")]
    Wrap(usize),
    /// Commit of a decoder whose predecessor is not committed: decoders
    /// commit in index order.
    #[error("decoder {index}: committed before decoder {needs}")]
    OutOfOrder {
        /// The decoder asked to commit.
        index: usize,
        /// The uncommitted decoder below it.
        needs: usize,
    },
    /// Commit of a decoder while a decoder above it is still committed
    /// (possible after an out-of-order uncommit).
    #[error("decoder {index}: decoder {higher} above it is still committed")]
    HigherCommitted {
        /// The decoder asked to commit.
        index: usize,
        /// A committed decoder with a higher index.
        higher: usize,
    },
    /// The HPA base starts below the end of the previous decoder's HPA
    /// range: HPA ranges must ascend with the decoder index.
    #[error("decoder {index}: HPA base below the end of decoder {prev}")]
    HpaOrder {
        /// The decoder asked to commit.
        index: usize,
        /// The committed decoder just below it.
        prev: usize,
    },
    /// The HPA or DPA range would share bytes with a committed decoder's
    /// (the last-resort check; the ordering rules should prevent it).
    #[error("decoder {index}: range overlaps committed decoder {other}")]
    Overlap {
        /// The decoder asked to commit.
        index: usize,
        /// The committed decoder it would overlap.
        other: usize,
    },
    /// The DPA range (previous decoder's DPA end plus skip, then size)
    /// ends past the device capacity or overflows.
    #[error("decoder {0}: DPA range is beyond the device capacity")]
    Dpa(usize),
    /// The Interleave Ways field is not 0: only 1-way decoding is modelled.
    #[error("decoder {0}: interleave ways other than 1 are not supported")]
    Ways(usize),
}

/// What a register write did that the VMM must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecoderEvent {
    /// Decoder `index` now decodes `[hpa, hpa + size)` to DPA `dpa..`.
    /// `size` may be zero (a committed decoder that decodes nothing).
    Committed {
        /// Decoder number.
        index: usize,
        /// First host physical address decoded.
        hpa: u64,
        /// Bytes decoded (a multiple of [`HDM_ALIGN`]).
        size: u64,
        /// Device physical address that `hpa` maps to.
        dpa: u64,
    },
    /// Decoder `index` stopped decoding.
    Uncommitted {
        /// Decoder number.
        index: usize,
    },
    /// A commit was refused; the error bit is set.
    Refused {
        /// Decoder number.
        index: usize,
        /// Which commit rule failed.
        reason: CommitError,
    },
}

/// A committed decoder's translation: HPA `[hpa, hpa + size)` to DPA
/// `[dpa, dpa + size)` (1-way, so both have the same length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommittedRange {
    /// Decoder number.
    pub index: usize,
    /// First host physical address decoded.
    pub hpa: u64,
    /// Device physical address that `hpa` maps to.
    pub dpa: u64,
    /// Bytes decoded; may be zero.
    pub size: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Decoder {
    base: u64,
    size: u64,
    skip: u64,
    ctrl: u32,
    /// Where the decoder's DPA range starts; set at commit, meaningful
    /// only while committed.
    dpa: u64,
}

impl Decoder {
    fn committed(&self) -> bool {
        self.ctrl & CTRL_COMMITTED != 0
    }
    fn locked(&self) -> bool {
        self.committed() && self.ctrl & CTRL_LOCK_ON_COMMIT != 0
    }
}

/// `[a, a + alen)` and `[b, b + blen)` share a byte. Empty ranges share
/// none; ends saturate (callers only pass ranges already checked not to wrap).
fn overlaps(a: u64, alen: u64, b: u64, blen: u64) -> bool {
    alen != 0 && blen != 0 && a < b.saturating_add(blen) && b < a.saturating_add(alen)
}

/// The decoders of one endpoint and the capacity they may decode.
pub struct HdmDecoders {
    decoders: Vec<Decoder>,
    global_ctrl: u32,
    capacity: u64,
}

impl HdmDecoders {
    /// `count` decoders over `capacity` bytes of DPA. The capability field
    /// can only say 1, 2, 4, 6, 8 or 10 decoders, so `count` is rounded
    /// down to one of those (and up to 1), never advertised wrongly.
    pub fn new(count: usize, capacity: u64) -> Self {
        let count = match count.clamp(1, MAX_DECODERS) {
            1 => 1,
            n => n & !1,
        };
        HdmDecoders {
            decoders: vec![Decoder::default(); count],
            global_ctrl: 0,
            capacity,
        }
    }

    /// Number of decoders.
    pub fn count(&self) -> usize {
        self.decoders.len()
    }

    /// Bytes of register space the capability structure occupies.
    pub fn len(&self) -> u64 {
        DECODER_BASE + DECODER_STRIDE * self.decoders.len() as u64
    }

    /// Never empty: there is at least one decoder.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The translations of the committed decoders, by index. They never
    /// overlap in HPA or in DPA (the module doc says why).
    pub fn committed(&self) -> Vec<CommittedRange> {
        self.decoders
            .iter()
            .enumerate()
            .filter(|(_, d)| d.committed())
            .map(|(index, d)| CommittedRange {
                index,
                hpa: d.base,
                dpa: d.dpa,
                size: d.size,
            })
            .collect()
    }

    /// Back to the power-on state (every decoder uncommitted and unlocked);
    /// returns the decoders that were committed so their mappings go.
    pub fn reset(&mut self) -> Vec<DecoderEvent> {
        let mut ev = Vec::new();
        for (index, d) in self.decoders.iter_mut().enumerate() {
            if d.committed() {
                ev.push(DecoderEvent::Uncommitted { index });
            }
            *d = Decoder::default();
        }
        self.global_ctrl = 0;
        ev
    }

    /// The capability register's decoder count field (CXL 2.0 8.2.5.12.1):
    /// 0 means 1 decoder, n >= 1 means 2n.
    fn count_field(&self) -> u32 {
        (self.decoders.len() / 2) as u32
    }

    /// 32-bit register read at `offset` within the capability.
    pub fn read(&self, offset: u64) -> u32 {
        match offset {
            HDM_CAP => self.count_field() | (1 << 4) | CAP_IL_11_8 | CAP_IL_14_12,
            HDM_GLOBAL_CTRL => self.global_ctrl,
            o if o >= DECODER_BASE => {
                let Ok(idx) = usize::try_from((o - DECODER_BASE) / DECODER_STRIDE) else {
                    return 0;
                };
                let Some(d) = self.decoders.get(idx) else {
                    return 0;
                };
                match (o - DECODER_BASE) % DECODER_STRIDE {
                    D_BASE_LOW => d.base as u32 & 0xf000_0000,
                    D_BASE_HIGH => (d.base >> 32) as u32,
                    D_SIZE_LOW => d.size as u32 & 0xf000_0000,
                    D_SIZE_HIGH => (d.size >> 32) as u32,
                    D_CTRL => d.ctrl,
                    D_SKIP_LOW => d.skip as u32 & 0xf000_0000,
                    D_SKIP_HIGH => (d.skip >> 32) as u32,
                    _ => 0,
                }
            }
            _ => 0,
        }
    }

    /// 32-bit register write; returns what the VMM must do about it.
    pub fn write(&mut self, offset: u64, v: u32) -> Option<DecoderEvent> {
        if offset == HDM_GLOBAL_CTRL {
            self.global_ctrl = v & (GLOBAL_ENABLE | 1);
            return None;
        }
        if offset < DECODER_BASE {
            return None;
        }
        let idx = usize::try_from((offset - DECODER_BASE) / DECODER_STRIDE).ok()?;
        let reg = (offset - DECODER_BASE) % DECODER_STRIDE;
        let d = self.decoders.get_mut(idx)?;
        // Lock On Commit: read-only until reset.
        if d.locked() {
            return None;
        }
        if reg == D_CTRL {
            return self.write_ctrl(idx, v);
        }
        // Programming registers are frozen while the decoder is committed:
        // its DPA base was computed from them and must not move.
        if d.committed() {
            return None;
        }
        // Bits below 256 MiB are not storable, so whatever commits is aligned.
        let set_low = |x: u64| (x & !0xffff_ffff) | u64::from(v & 0xf000_0000);
        let set_high = |x: u64| (x & 0xffff_ffff) | (u64::from(v) << 32);
        match reg {
            D_BASE_LOW => d.base = set_low(d.base),
            D_BASE_HIGH => d.base = set_high(d.base),
            D_SIZE_LOW => d.size = set_low(d.size),
            D_SIZE_HIGH => d.size = set_high(d.size),
            D_SKIP_LOW => d.skip = set_low(d.skip),
            D_SKIP_HIGH => d.skip = set_high(d.skip),
            _ => {}
        }
        None
    }

    /// A write of decoder `idx`'s control register (not locked).
    fn write_ctrl(&mut self, idx: usize, v: u32) -> Option<DecoderEvent> {
        let d = self.decoders.get_mut(idx)?;
        let commit = v & CTRL_COMMIT != 0;
        if d.committed() {
            if commit {
                // Nothing else is writable while committed: the translation
                // (interleave, type) stays what was validated.
                return None;
            }
            d.ctrl &= !(CTRL_COMMIT | CTRL_COMMITTED | CTRL_ERR_NOT_COMMITTED);
            return Some(DecoderEvent::Uncommitted { index: idx });
        }
        let was = d.ctrl & CTRL_COMMIT != 0;
        d.ctrl = (d.ctrl & !CTRL_WRITABLE) | (v & CTRL_WRITABLE);
        if !commit {
            // Clearing Commit acknowledges a refused commit.
            d.ctrl &= !CTRL_ERR_NOT_COMMITTED;
            return None;
        }
        // Only a 0 -> 1 transition of Commit asks for a commit.
        if was {
            return None;
        }
        Some(self.commit(idx))
    }

    fn commit(&mut self, idx: usize) -> DecoderEvent {
        let result = self.validate(idx);
        let Some(d) = self.decoders.get_mut(idx) else {
            return DecoderEvent::Uncommitted { index: idx };
        };
        match result {
            Ok(dpa) => {
                d.dpa = dpa;
                d.ctrl = (d.ctrl | CTRL_COMMITTED) & !CTRL_ERR_NOT_COMMITTED;
                DecoderEvent::Committed {
                    index: idx,
                    hpa: d.base,
                    size: d.size,
                    dpa,
                }
            }
            Err(reason) => {
                d.ctrl = (d.ctrl | CTRL_ERR_NOT_COMMITTED) & !CTRL_COMMITTED;
                DecoderEvent::Refused { index: idx, reason }
            }
        }
    }

    /// Checks decoder `idx` against the rules of a commit; returns its DPA
    /// base.
    fn validate(&self, idx: usize) -> Result<u64, CommitError> {
        let d = *self.decoders.get(idx).ok_or(CommitError::Dpa(idx))?;
        if (d.ctrl & CTRL_IW_MASK) != 0 {
            return Err(CommitError::Ways(idx));
        }
        d.base.checked_add(d.size).ok_or(CommitError::Wrap(idx))?;
        // In order: the previous decoder is committed ...
        let prev = match idx.checked_sub(1) {
            Some(p) => {
                let pd = self.decoders.get(p).filter(|pd| pd.committed()).ok_or(
                    CommitError::OutOfOrder {
                        index: idx,
                        needs: p,
                    },
                )?;
                Some((p, pd))
            }
            None => None,
        };
        // ... and none above is (it may have stayed committed through an
        // out-of-order uncommit of this one; its DPA follows the old range).
        if let Some(higher) = (idx + 1..self.decoders.len()).find(|&j| self.decoders[j].committed())
        {
            return Err(CommitError::HigherCommitted { index: idx, higher });
        }
        // HPA and DPA both ascend from the previous decoder.
        let (prev_hpa_end, prev_dpa_end) = match prev {
            Some((p, pd)) => (
                pd.base.checked_add(pd.size).ok_or(CommitError::Wrap(p))?,
                pd.dpa.checked_add(pd.size).ok_or(CommitError::Dpa(p))?,
            ),
            None => (0, 0),
        };
        if let Some((p, _)) = prev {
            if d.base < prev_hpa_end {
                return Err(CommitError::HpaOrder {
                    index: idx,
                    prev: p,
                });
            }
        }
        let dpa = prev_dpa_end
            .checked_add(d.skip)
            .ok_or(CommitError::Dpa(idx))?;
        match dpa.checked_add(d.size) {
            Some(end) if end <= self.capacity => {}
            _ => return Err(CommitError::Dpa(idx)),
        }
        // The rules above make these disjoint; check it anyway, so a flaw
        // in them refuses a commit instead of aliasing memory.
        for (j, o) in self.decoders.iter().enumerate() {
            if j != idx
                && o.committed()
                && (overlaps(d.base, d.size, o.base, o.size)
                    || overlaps(dpa, d.size, o.dpa, o.size))
            {
                return Err(CommitError::Overlap {
                    index: idx,
                    other: j,
                });
            }
        }
        Ok(dpa)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;
    const U: u64 = HDM_ALIGN;

    fn dec(i: usize, reg: u64) -> u64 {
        decoder_reg(i, reg)
    }

    fn program(h: &mut HdmDecoders, i: usize, base: u64, size: u64, skip: u64) {
        h.write(dec(i, D_BASE_LOW), base as u32);
        h.write(dec(i, D_BASE_HIGH), (base >> 32) as u32);
        h.write(dec(i, D_SIZE_LOW), size as u32);
        h.write(dec(i, D_SIZE_HIGH), (size >> 32) as u32);
        h.write(dec(i, D_SKIP_LOW), skip as u32);
        h.write(dec(i, D_SKIP_HIGH), (skip >> 32) as u32);
    }

    fn commit(h: &mut HdmDecoders, i: usize) -> Option<DecoderEvent> {
        h.write(dec(i, D_CTRL), CTRL_COMMIT)
    }

    fn uncommit(h: &mut HdmDecoders, i: usize) -> Option<DecoderEvent> {
        h.write(dec(i, D_CTRL), 0)
    }

    fn committed_at(i: usize, hpa: u64, size: u64, dpa: u64) -> Option<DecoderEvent> {
        Some(DecoderEvent::Committed {
            index: i,
            hpa,
            size,
            dpa,
        })
    }

    /// Commits `i` expecting a refusal; checks the control bits; returns why.
    fn refused(h: &mut HdmDecoders, i: usize) -> CommitError {
        // A refusal needs a fresh 0 -> 1 edge of Commit.
        uncommit(h, i);
        match commit(h, i) {
            Some(DecoderEvent::Refused { reason, .. }) => {
                let c = h.read(dec(i, D_CTRL));
                assert_ne!(c & CTRL_ERR_NOT_COMMITTED, 0);
                assert_eq!(c & CTRL_COMMITTED, 0);
                reason
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn good_commit_and_uncommit() {
        let mut h = HdmDecoders::new(2, 2 * GIB);
        program(&mut h, 0, 0x20_0000_0000, GIB, 0);
        assert_eq!(commit(&mut h, 0), committed_at(0, 0x20_0000_0000, GIB, 0));
        assert_ne!(h.read(dec(0, D_CTRL)) & CTRL_COMMITTED, 0);
        assert_eq!(h.read(dec(0, D_BASE_HIGH)), 0x20);
        // Frozen while committed, control bits included.
        h.write(dec(0, D_SIZE_LOW), 0);
        assert_eq!(h.read(dec(0, D_SIZE_LOW)), 0x4000_0000);
        assert_eq!(h.write(dec(0, D_CTRL), CTRL_COMMIT | (1 << 4)), None);
        assert_eq!(h.read(dec(0, D_CTRL)) & CTRL_IW_MASK, 0);
        // Second decoder follows in DPA after its skip.
        program(&mut h, 1, 0x21_0000_0000, U, U);
        assert_eq!(
            commit(&mut h, 1),
            committed_at(1, 0x21_0000_0000, U, GIB + U)
        );
        assert_eq!(
            uncommit(&mut h, 1),
            Some(DecoderEvent::Uncommitted { index: 1 })
        );
        assert_eq!(h.read(dec(1, D_CTRL)) & CTRL_COMMITTED, 0);
        assert_eq!(uncommit(&mut h, 1), None, "already uncommitted");
    }

    #[test]
    fn bad_commits_set_the_error_bit() {
        let mut h = HdmDecoders::new(2, GIB);
        // Bits below 256 MiB are not storable: a misaligned size or base
        // reads back aligned, so what commits is always aligned.
        program(&mut h, 0, 0x20_0000_0000 + 4096, U + 4096, 4096);
        assert_eq!(h.read(dec(0, D_SIZE_LOW)), U as u32);
        assert_eq!(h.read(dec(0, D_BASE_LOW)), 0);
        assert_eq!(h.read(dec(0, D_SKIP_LOW)), 0);
        program(&mut h, 0, 0x20_0000_0000, 2 * GIB, 0);
        assert_eq!(refused(&mut h, 0), CommitError::Dpa(0));
        program(&mut h, 0, 0x20_0000_0000, U, GIB);
        assert_eq!(refused(&mut h, 0), CommitError::Dpa(0), "skip past the end");
        program(&mut h, 0, !(U - 1), U, 0);
        assert_eq!(refused(&mut h, 0), CommitError::Wrap(0));
        program(&mut h, 0, 0, U, !(U - 1));
        assert_eq!(refused(&mut h, 0), CommitError::Dpa(0), "skip overflows");
        program(&mut h, 1, 0x30_0000_0000, U, 0);
        assert_eq!(
            refused(&mut h, 1),
            CommitError::OutOfOrder { index: 1, needs: 0 }
        );
        program(&mut h, 0, 0x20_0000_0000, U, 0);
        uncommit(&mut h, 0);
        assert!(matches!(
            commit(&mut h, 0),
            Some(DecoderEvent::Committed { .. })
        ));
        // HPA must ascend: decoder 1 below decoder 0's end.
        program(&mut h, 1, 0x20_0000_0000, U, 0);
        assert_eq!(
            refused(&mut h, 1),
            CommitError::HpaOrder { index: 1, prev: 0 }
        );
        program(&mut h, 1, 0x10_0000_0000, U, 0);
        assert_eq!(
            refused(&mut h, 1),
            CommitError::HpaOrder { index: 1, prev: 0 }
        );
        program(&mut h, 1, 0x30_0000_0000, U, GIB);
        assert_eq!(refused(&mut h, 1), CommitError::Dpa(1));
        program(&mut h, 1, 0x30_0000_0000, U, 0);
        // 2-way interleave is not ours to decode.
        h.write(dec(1, D_CTRL), 1 << 4);
        assert!(matches!(
            h.write(dec(1, D_CTRL), CTRL_COMMIT | (1 << 4)),
            Some(DecoderEvent::Refused {
                reason: CommitError::Ways(1),
                ..
            })
        ));
    }

    #[test]
    fn only_a_commit_edge_commits_and_clearing_commit_clears_the_error() {
        let mut h = HdmDecoders::new(1, GIB);
        program(&mut h, 0, 0x20_0000_0000, 2 * GIB, 0);
        assert!(matches!(
            commit(&mut h, 0),
            Some(DecoderEvent::Refused { .. })
        ));
        // Commit still set: fixing the size and writing Commit again is no edge.
        program(&mut h, 0, 0x20_0000_0000, GIB, 0);
        assert_eq!(commit(&mut h, 0), None);
        assert_ne!(h.read(dec(0, D_CTRL)) & CTRL_ERR_NOT_COMMITTED, 0);
        // Linux clears Commit after an error: the error bit goes with it.
        assert_eq!(uncommit(&mut h, 0), None);
        assert_eq!(h.read(dec(0, D_CTRL)) & CTRL_ERR_NOT_COMMITTED, 0);
        assert_eq!(commit(&mut h, 0), committed_at(0, 0x20_0000_0000, GIB, 0));
    }

    /// The sequence: with decoders 0 and 1 committed, uncommit 0,
    /// reprogram it larger and commit it again. The old rules let that map
    /// DPA [1G, 2G) through both decoders.
    #[test]
    fn out_of_order_uncommit_and_recommit_cannot_map_a_dpa_twice() {
        let mut h = HdmDecoders::new(4, 4 * GIB);
        program(&mut h, 0, 0x20_0000_0000, GIB, 0);
        program(&mut h, 1, 0x21_0000_0000, GIB, 0);
        assert_eq!(commit(&mut h, 0), committed_at(0, 0x20_0000_0000, GIB, 0));
        assert_eq!(commit(&mut h, 1), committed_at(1, 0x21_0000_0000, GIB, GIB));
        // Out-of-order uncommit is allowed (newer Linux does it) ...
        assert_eq!(
            uncommit(&mut h, 0),
            Some(DecoderEvent::Uncommitted { index: 0 })
        );
        program(&mut h, 0, 0x22_0000_0000, 2 * GIB, 0);
        // ... but no recommit while a higher decoder is committed.
        assert_eq!(
            refused(&mut h, 0),
            CommitError::HigherCommitted {
                index: 0,
                higher: 1
            }
        );
        assert_eq!(
            h.committed(),
            vec![CommittedRange {
                index: 1,
                hpa: 0x21_0000_0000,
                dpa: GIB,
                size: GIB
            }]
        );
        // Decoder 2 may commit above decoder 1: its DPA follows 1's.
        program(&mut h, 2, 0x30_0000_0000, U, 0);
        assert_eq!(
            commit(&mut h, 2),
            committed_at(2, 0x30_0000_0000, U, 2 * GIB)
        );
        assert_eq!(
            refused(&mut h, 0),
            CommitError::HigherCommitted {
                index: 0,
                higher: 1
            }
        );
        uncommit(&mut h, 2);
        // Once decoder 1 is gone, 0 commits with its new size and 1 follows it.
        assert_eq!(
            uncommit(&mut h, 1),
            Some(DecoderEvent::Uncommitted { index: 1 })
        );
        uncommit(&mut h, 0);
        assert_eq!(
            commit(&mut h, 0),
            committed_at(0, 0x22_0000_0000, 2 * GIB, 0)
        );
        program(&mut h, 1, 0x24_0000_0000, GIB, 0);
        assert_eq!(
            commit(&mut h, 1),
            committed_at(1, 0x24_0000_0000, GIB, 2 * GIB)
        );
    }

    #[test]
    fn a_zero_size_decoder_commits_and_decodes_nothing() {
        let mut h = HdmDecoders::new(4, GIB);
        program(&mut h, 0, 0x20_0000_0000, 0, U);
        assert_eq!(commit(&mut h, 0), committed_at(0, 0x20_0000_0000, 0, U));
        program(&mut h, 1, 0x20_0000_0000, 2 * U, U);
        assert_eq!(
            commit(&mut h, 1),
            committed_at(1, 0x20_0000_0000, 2 * U, 2 * U)
        );
        // Decoder 1 ends at the capacity: no room for a non-empty decoder 2.
        program(&mut h, 2, 0x30_0000_0000, U, 0);
        assert_eq!(refused(&mut h, 2), CommitError::Dpa(2));
        program(&mut h, 2, 0x30_0000_0000, 0, 0);
        uncommit(&mut h, 2);
        assert_eq!(commit(&mut h, 2), committed_at(2, 0x30_0000_0000, 0, GIB));
    }

    /// Found independently by fuzz target cxl_mailbox's oracle (committed DPA
    /// ranges disjoint): decoder 0 uncommitted and recommitted larger while
    /// decoder 1 stayed committed used to take decoder 1's DPA too. Now no
    /// recommit happens below a committed decoder, whatever its size.
    #[test]
    fn a_recommit_cannot_grow_into_a_committed_dpa_range() {
        let mut h = HdmDecoders::new(2, 2 * GIB);
        program(&mut h, 0, 0x20_0000_0000, HDM_ALIGN, 0);
        assert!(matches!(
            h.write(dec(0, D_CTRL), CTRL_COMMIT),
            Some(DecoderEvent::Committed { .. })
        ));
        program(&mut h, 1, 0x21_0000_0000, HDM_ALIGN, 0);
        assert!(matches!(
            h.write(dec(1, D_CTRL), CTRL_COMMIT),
            Some(DecoderEvent::Committed { dpa: HDM_ALIGN, .. })
        ));
        h.write(dec(0, D_CTRL), 0);
        program(&mut h, 0, 0x20_0000_0000, 2 * HDM_ALIGN, 0);
        let higher = CommitError::HigherCommitted {
            index: 0,
            higher: 1,
        };
        assert_eq!(refused(&mut h, 0), higher);
        program(&mut h, 0, 0x20_0000_0000, HDM_ALIGN, 0);
        assert_eq!(refused(&mut h, 0), higher);
    }

    #[test]
    fn lock_on_commit_holds_until_reset() {
        let mut h = HdmDecoders::new(2, 2 * GIB);
        program(&mut h, 0, 0x20_0000_0000, GIB, 0);
        assert!(matches!(
            h.write(dec(0, D_CTRL), CTRL_COMMIT | CTRL_LOCK_ON_COMMIT),
            Some(DecoderEvent::Committed { .. })
        ));
        assert_eq!(uncommit(&mut h, 0), None, "locked: uncommit ignored");
        assert_ne!(h.read(dec(0, D_CTRL)) & CTRL_COMMITTED, 0);
        // A decoder above a locked one still commits and uncommits.
        program(&mut h, 1, 0x21_0000_0000, GIB, 0);
        assert!(matches!(
            commit(&mut h, 1),
            Some(DecoderEvent::Committed { .. })
        ));
        let mut ev = h.reset();
        ev.sort_by_key(|e| format!("{e:?}"));
        assert_eq!(
            ev,
            vec![
                DecoderEvent::Uncommitted { index: 0 },
                DecoderEvent::Uncommitted { index: 1 }
            ]
        );
        assert_eq!(h.read(dec(0, D_CTRL)), 0);
        assert_eq!(h.read(dec(0, D_BASE_HIGH)), 0);
        assert!(h.committed().is_empty());
    }

    #[test]
    fn capability_and_out_of_range_registers() {
        let mut h = HdmDecoders::new(1, GIB);
        assert_eq!(h.read(HDM_CAP) & 0xf, 0, "one decoder");
        for (asked, count, field) in [
            (0, 1, 0),
            (2, 2, 1),
            (3, 2, 1),
            (4, 4, 2),
            (10, 10, 5),
            (99, 10, 5),
        ] {
            let h = HdmDecoders::new(asked, GIB);
            assert_eq!(h.count(), count, "asked {asked}");
            assert_eq!(h.read(HDM_CAP) & 0xf, field, "asked {asked}");
        }
        h.write(HDM_GLOBAL_CTRL, 0xffff_ffff);
        assert_eq!(h.read(HDM_GLOBAL_CTRL), 3);
        assert_eq!(h.write(dec(7, D_CTRL), CTRL_COMMIT), None);
        assert_eq!(h.read(dec(7, D_CTRL)), 0);
        assert_eq!(h.write(u64::MAX, u32::MAX), None);
        assert_eq!(h.read(u64::MAX), 0);
        assert_eq!(h.len(), 0x30);
        assert_eq!(HdmDecoders::new(DECODER_COUNT, GIB).len(), 0x90);
    }

    /// One guest action on the decoders, in units of 256 MiB so that
    /// random programs often commit.
    #[derive(Debug, Clone)]
    enum Op {
        Program {
            i: usize,
            base: u64,
            size: u64,
            skip: u64,
        },
        Commit(usize),
        CommitLocked(usize),
        Uncommit(usize),
        Reset,
        /// Any 32-bit write anywhere in (and past) the capability.
        Raw {
            offset: u64,
            value: u32,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..DECODER_COUNT, 0u64..12, 0u64..4, 0u64..3)
                .prop_map(|(i, base, size, skip)| Op::Program { i, base, size, skip }),
            4 => (0..DECODER_COUNT).prop_map(Op::Commit),
            1 => (0..DECODER_COUNT).prop_map(Op::CommitLocked),
            4 => (0..DECODER_COUNT).prop_map(Op::Uncommit),
            1 => Just(Op::Reset),
            1 => (0u64..0xa0, any::<u32>()).prop_map(|(o, value)| Op::Raw { offset: o & !3, value }),
        ]
    }

    /// What the VMM would have mapped: decoder index -> (hpa, dpa, size),
    /// kept only from the events, as `vmm/src/cxl/decoders.rs` does.
    type Mappings = std::collections::BTreeMap<usize, (u64, u64, u64)>;

    fn apply(maps: &mut Mappings, ev: DecoderEvent) -> Result<(), TestCaseError> {
        match ev {
            DecoderEvent::Committed {
                index,
                hpa,
                size,
                dpa,
            } => {
                prop_assert!(
                    maps.insert(index, (hpa, dpa, size)).is_none(),
                    "decoder {} committed twice",
                    index
                );
            }
            DecoderEvent::Uncommitted { index } => {
                prop_assert!(
                    maps.remove(&index).is_some(),
                    "decoder {} was not mapped",
                    index
                );
            }
            DecoderEvent::Refused { .. } => {}
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any sequence of programming, commits and uncommits (in or out of
        /// order), locks, resets and raw register writes keeps the
        /// committed decoders' HPA and DPA ranges disjoint, inside the
        /// capacity, and exactly what the events told the VMM to map.
        #[test]
        fn committed_ranges_never_overlap(ops in proptest::collection::vec(op(), 1..60)) {
            const CAP: u64 = 8 * U;
            let base0 = 0x20_0000_0000u64;
            let mut h = HdmDecoders::new(DECODER_COUNT, CAP);
            let mut maps = Mappings::new();
            for op in ops {
                match op {
                    Op::Program { i, base, size, skip } => {
                        program(&mut h, i, base0 + base * U, size * U, skip * U);
                    }
                    Op::Commit(i) => {
                        if let Some(ev) = commit(&mut h, i) { apply(&mut maps, ev)?; }
                    }
                    Op::CommitLocked(i) => {
                        if let Some(ev) = h.write(dec(i, D_CTRL), CTRL_COMMIT | CTRL_LOCK_ON_COMMIT) {
                            apply(&mut maps, ev)?;
                        }
                    }
                    Op::Uncommit(i) => {
                        if let Some(ev) = uncommit(&mut h, i) { apply(&mut maps, ev)?; }
                    }
                    Op::Reset => {
                        for ev in h.reset() { apply(&mut maps, ev)?; }
                    }
                    Op::Raw { offset, value } => {
                        if let Some(ev) = h.write(offset, value) { apply(&mut maps, ev)?; }
                    }
                }
                let c = h.committed();
                let from_events: Vec<_> = maps
                    .iter()
                    .map(|(&index, &(hpa, dpa, size))| CommittedRange { index, hpa, dpa, size })
                    .collect();
                prop_assert_eq!(&c, &from_events, "events and registers disagree");
                for (k, a) in c.iter().enumerate() {
                    prop_assert!(a.dpa.checked_add(a.size).is_some_and(|e| e <= CAP));
                    prop_assert!(a.hpa.checked_add(a.size).is_some());
                    prop_assert_ne!(h.read(dec(a.index, D_CTRL)) & CTRL_COMMITTED, 0);
                    for b in &c[k + 1..] {
                        prop_assert!(!overlaps(a.dpa, a.size, b.dpa, b.size), "DPA alias: {:?} {:?}", a, b);
                        prop_assert!(!overlaps(a.hpa, a.size, b.hpa, b.size), "HPA alias: {:?} {:?}", a, b);
                        // Ordered by index in both spaces (which implies
                        // the above; the above is what matters).
                        prop_assert!(a.dpa + a.size <= b.dpa && a.hpa + a.size <= b.hpa, "order: {:?} {:?}", a, b);
                    }
                }
            }
        }
    }
}
