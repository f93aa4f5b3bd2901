//! HDM (host-managed device memory) decoders of the component register
//! block: the guest programs an HPA range and commits it; the device
//! validates and either marks it committed or sets the error bit.
//!
//! A commit is the moment the VMM maps the decoded range as guest memory,
//! so the outcome is returned as a [`DecoderEvent`] to the caller instead of
//! being acted on here.

/// Decoding granularity of HPA base and size: 256 MiB.
pub const HDM_ALIGN: u64 = 256 << 20;

/// Register offsets inside the HDM decoder capability structure.
pub const HDM_CAP: u64 = 0x00;
pub const HDM_GLOBAL_CTRL: u64 = 0x04;
const DECODER_BASE: u64 = 0x10;
const DECODER_STRIDE: u64 = 0x20;
const D_BASE_LOW: u64 = 0x00;
const D_BASE_HIGH: u64 = 0x04;
const D_SIZE_LOW: u64 = 0x08;
const D_SIZE_HIGH: u64 = 0x0c;
const D_CTRL: u64 = 0x10;
const D_SKIP_LOW: u64 = 0x14;
const D_SKIP_HIGH: u64 = 0x18;

/// Decoder control bits.
pub const CTRL_IG_MASK: u32 = 0xf;
pub const CTRL_IW_MASK: u32 = 0xf << 4;
pub const CTRL_LOCK_ON_COMMIT: u32 = 1 << 8;
pub const CTRL_COMMIT: u32 = 1 << 9;
pub const CTRL_COMMITTED: u32 = 1 << 10;
pub const CTRL_ERR_NOT_COMMITTED: u32 = 1 << 11;
pub const CTRL_TYPE: u32 = 1 << 12;
const CTRL_WRITABLE: u32 =
    CTRL_IG_MASK | CTRL_IW_MASK | CTRL_LOCK_ON_COMMIT | CTRL_COMMIT | CTRL_TYPE;

/// Global control: HDM decoder enable.
pub const GLOBAL_ENABLE: u32 = 1 << 1;
/// Capability: interleave on address bits 11:8 and 14:12 supported.
const CAP_IL_11_8: u32 = 1 << 8;
const CAP_IL_14_12: u32 = 1 << 9;

/// Why a commit was refused (also the reason logged by the VMM).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    #[error("decoder {0}: size is zero or not 256 MiB aligned")]
    Size(usize),
    #[error("decoder {0}: base is not 256 MiB aligned")]
    Base(usize),
    #[error("decoder {0}: committed before decoder {1}")]
    OutOfOrder(usize, usize),
    #[error("decoder {0}: HPA range overlaps decoder {1}")]
    Overlap(usize, usize),
    #[error("decoder {0}: DPA range is beyond the device capacity")]
    Dpa(usize),
    #[error("decoder {0}: DPA range overlaps decoder {1}")]
    DpaOverlap(usize, usize),
    #[error("decoder {0}: interleave ways other than 1 are not supported")]
    Ways(usize),
}

/// What a register write did that the VMM must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecoderEvent {
    /// Decoder `index` now decodes `[hpa, hpa + size)` to DPA `dpa..`.
    Committed {
        index: usize,
        hpa: u64,
        size: u64,
        dpa: u64,
    },
    /// Decoder `index` stopped decoding.
    Uncommitted { index: usize },
    /// A commit was refused; the error bit is set.
    Refused { index: usize, reason: CommitError },
}

#[derive(Clone, Copy, Debug, Default)]
struct Decoder {
    base: u64,
    size: u64,
    skip: u64,
    ctrl: u32,
    /// Where the decoder's DPA range starts (valid while committed).
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

/// The decoders of one endpoint and the capacity they may decode.
pub struct HdmDecoders {
    decoders: Vec<Decoder>,
    global_ctrl: u32,
    capacity: u64,
}

impl HdmDecoders {
    /// `count` decoders (1..=10) over `capacity` bytes of DPA. The
    /// capability's count field can only say 1 or an even number, so an odd
    /// count above 1 is rounded up: a decoder the guest is not told about
    /// must not exist (it could still be programmed and committed).
    pub fn new(count: usize, capacity: u64) -> Self {
        let count = match count.clamp(1, 10) {
            1 => 1,
            n => n.next_multiple_of(2),
        };
        HdmDecoders {
            decoders: vec![Decoder::default(); count],
            global_ctrl: 0,
            capacity,
        }
    }

    /// Bytes of register space the capability structure occupies.
    pub fn len(&self) -> u64 {
        DECODER_BASE + DECODER_STRIDE * self.decoders.len() as u64
    }

    /// Never empty: there is at least one decoder.
    pub fn is_empty(&self) -> bool {
        false
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

    /// 32-bit register read at `offset` within the capability.
    pub fn read(&self, offset: u64) -> u32 {
        match offset {
            HDM_CAP => {
                // Decoder count field: 0 means 1, n means 2n for n >= 1.
                let n = self.decoders.len() as u32;
                let field = if n <= 1 { 0 } else { n / 2 };
                field | (1 << 4) | CAP_IL_11_8 | CAP_IL_14_12
            }
            HDM_GLOBAL_CTRL => self.global_ctrl,
            o if o >= DECODER_BASE => {
                let idx = ((o - DECODER_BASE) / DECODER_STRIDE) as usize;
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
        let idx = ((offset - DECODER_BASE) / DECODER_STRIDE) as usize;
        let reg = (offset - DECODER_BASE) % DECODER_STRIDE;
        let d = self.decoders.get_mut(idx)?;
        if d.locked() {
            return None;
        }
        let set_low = |x: u64| (x & !0xffff_ffff) | u64::from(v & 0xf000_0000);
        let set_high = |x: u64| (x & 0xffff_ffff) | (u64::from(v) << 32);
        if reg != D_CTRL {
            // Programming registers are frozen while the decoder is committed.
            if d.committed() {
                return None;
            }
            match reg {
                D_BASE_LOW => d.base = set_low(d.base),
                D_BASE_HIGH => d.base = set_high(d.base),
                D_SIZE_LOW => d.size = set_low(d.size),
                D_SIZE_HIGH => d.size = set_high(d.size),
                D_SKIP_LOW => d.skip = set_low(d.skip),
                D_SKIP_HIGH => d.skip = set_high(d.skip),
                _ => {}
            }
            return None;
        }
        let was = d.ctrl & CTRL_COMMIT != 0;
        let commit = v & CTRL_COMMIT != 0;
        d.ctrl = (d.ctrl & !CTRL_WRITABLE) | (v & CTRL_WRITABLE);
        match (was || d.committed(), commit) {
            (_, true) if !d.committed() => Some(self.commit(idx)),
            (true, false) => {
                let committed = d.committed();
                d.ctrl &= !(CTRL_COMMITTED | CTRL_ERR_NOT_COMMITTED);
                committed.then_some(DecoderEvent::Uncommitted { index: idx })
            }
            _ => None,
        }
    }

    fn commit(&mut self, idx: usize) -> DecoderEvent {
        match self.validate(idx) {
            Ok(dpa) => {
                let d = &mut self.decoders[idx];
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
                let d = &mut self.decoders[idx];
                d.ctrl = (d.ctrl | CTRL_ERR_NOT_COMMITTED) & !CTRL_COMMITTED;
                DecoderEvent::Refused { index: idx, reason }
            }
        }
    }

    /// Checks decoder `idx` against the rules of a commit; returns its DPA base.
    fn validate(&self, idx: usize) -> Result<u64, CommitError> {
        let d = self.decoders[idx];
        if d.size == 0 || !d.size.is_multiple_of(HDM_ALIGN) {
            return Err(CommitError::Size(idx));
        }
        if !d.base.is_multiple_of(HDM_ALIGN) || d.base.checked_add(d.size).is_none() {
            return Err(CommitError::Base(idx));
        }
        if (d.ctrl & CTRL_IW_MASK) != 0 {
            return Err(CommitError::Ways(idx));
        }
        if idx > 0 && !self.decoders[idx - 1].committed() {
            return Err(CommitError::OutOfOrder(idx, idx - 1));
        }
        for (j, o) in self.decoders.iter().enumerate() {
            if j != idx && o.committed() && d.base < o.base + o.size && o.base < d.base + d.size {
                return Err(CommitError::Overlap(idx, j));
            }
        }
        // DPA follows on from the previous decoder, after this one's skip.
        let prev_end = match idx.checked_sub(1).and_then(|p| self.decoders.get(p)) {
            Some(p) => p.dpa + p.size,
            None => 0,
        };
        let dpa = prev_end.checked_add(d.skip).ok_or(CommitError::Dpa(idx))?;
        let end = match dpa.checked_add(d.size) {
            Some(end) if end <= self.capacity => end,
            _ => return Err(CommitError::Dpa(idx)),
        };
        // A decoder recommitted after a later one committed must not grow
        // into that one's DPA: two HPA ranges would alias the same media.
        for (j, o) in self.decoders.iter().enumerate() {
            if j != idx && o.committed() && dpa < o.dpa + o.size && o.dpa < end {
                return Err(CommitError::DpaOverlap(idx, j));
            }
        }
        Ok(dpa)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn dec(i: u64, reg: u64) -> u64 {
        DECODER_BASE + DECODER_STRIDE * i + reg
    }

    fn program(h: &mut HdmDecoders, i: u64, base: u64, size: u64, skip: u64) {
        h.write(dec(i, D_BASE_LOW), base as u32);
        h.write(dec(i, D_BASE_HIGH), (base >> 32) as u32);
        h.write(dec(i, D_SIZE_LOW), size as u32);
        h.write(dec(i, D_SIZE_HIGH), (size >> 32) as u32);
        h.write(dec(i, D_SKIP_LOW), skip as u32);
        h.write(dec(i, D_SKIP_HIGH), (skip >> 32) as u32);
    }

    #[test]
    fn good_commit_and_uncommit() {
        let mut h = HdmDecoders::new(2, 2 * GIB);
        program(&mut h, 0, 0x20_0000_0000, GIB, 0);
        let ev = h.write(dec(0, D_CTRL), CTRL_COMMIT);
        assert_eq!(
            ev,
            Some(DecoderEvent::Committed {
                index: 0,
                hpa: 0x20_0000_0000,
                size: GIB,
                dpa: 0
            })
        );
        assert_ne!(h.read(dec(0, D_CTRL)) & CTRL_COMMITTED, 0);
        assert_eq!(h.read(dec(0, D_BASE_HIGH)), 0x20);
        // Frozen while committed.
        h.write(dec(0, D_SIZE_LOW), 0);
        assert_eq!(h.read(dec(0, D_SIZE_LOW)), 0x4000_0000);
        // Second decoder follows in DPA after its skip.
        program(&mut h, 1, 0x21_0000_0000, HDM_ALIGN, HDM_ALIGN);
        assert_eq!(
            h.write(dec(1, D_CTRL), CTRL_COMMIT),
            Some(DecoderEvent::Committed {
                index: 1,
                hpa: 0x21_0000_0000,
                size: HDM_ALIGN,
                dpa: GIB + HDM_ALIGN
            })
        );
        assert_eq!(
            h.write(dec(1, D_CTRL), 0),
            Some(DecoderEvent::Uncommitted { index: 1 })
        );
        assert_eq!(h.read(dec(1, D_CTRL)) & CTRL_COMMITTED, 0);
    }

    fn refused(h: &mut HdmDecoders, i: u64) -> CommitError {
        match h.write(dec(i, D_CTRL), CTRL_COMMIT) {
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
    fn bad_commits_set_the_error_bit() {
        let mut h = HdmDecoders::new(2, GIB);
        // Bits below 256 MiB are not storable: a misaligned size or base
        // reads back aligned, so what commits is always aligned.
        program(&mut h, 0, 0x20_0000_0000 + 4096, HDM_ALIGN + 4096, 0);
        assert_eq!(h.read(dec(0, D_SIZE_LOW)), HDM_ALIGN as u32);
        assert_eq!(h.read(dec(0, D_BASE_LOW)), 0);
        program(&mut h, 0, 0x20_0000_0000, 0, 0);
        assert_eq!(refused(&mut h, 0), CommitError::Size(0));
        program(&mut h, 0, 0x20_0000_0000, 2 * GIB, 0);
        assert_eq!(refused(&mut h, 0), CommitError::Dpa(0));
        program(&mut h, 1, 0x30_0000_0000, HDM_ALIGN, 0);
        assert_eq!(refused(&mut h, 1), CommitError::OutOfOrder(1, 0));
        program(&mut h, 0, 0x20_0000_0000, HDM_ALIGN, 0);
        h.write(dec(0, D_CTRL), 0);
        assert!(matches!(
            h.write(dec(0, D_CTRL), CTRL_COMMIT),
            Some(DecoderEvent::Committed { .. })
        ));
        program(&mut h, 1, 0x20_0000_0000, HDM_ALIGN, 0);
        assert_eq!(refused(&mut h, 1), CommitError::Overlap(1, 0));
        program(&mut h, 1, 0x30_0000_0000, HDM_ALIGN, GIB);
        assert_eq!(refused(&mut h, 1), CommitError::Dpa(1));
        program(&mut h, 1, 0x30_0000_0000, HDM_ALIGN, 0);
        // 2-way interleave is not ours to decode.
        h.write(dec(1, D_CTRL), 1 << 4);
        assert_eq!(
            refused_with(&mut h, 1, CTRL_COMMIT | (1 << 4)),
            CommitError::Ways(1)
        );
    }

    fn refused_with(h: &mut HdmDecoders, i: u64, ctrl: u32) -> CommitError {
        match h.write(dec(i, D_CTRL), ctrl) {
            Some(DecoderEvent::Refused { reason, .. }) => reason,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// Found by fuzz target cxl_mailbox's oracle (committed DPA ranges
    /// disjoint): decoder 0 uncommitted and recommitted larger while
    /// decoder 1 stayed committed used to take decoder 1's DPA too.
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
        assert_eq!(refused(&mut h, 0), CommitError::DpaOverlap(0, 1));
        // Its old size still fits.
        program(&mut h, 0, 0x20_0000_0000, HDM_ALIGN, 0);
        h.write(dec(0, D_CTRL), 0);
        assert!(matches!(
            h.write(dec(0, D_CTRL), CTRL_COMMIT),
            Some(DecoderEvent::Committed { dpa: 0, .. })
        ));
    }

    #[test]
    fn lock_on_commit_holds_until_reset() {
        let mut h = HdmDecoders::new(1, GIB);
        program(&mut h, 0, 0x20_0000_0000, GIB, 0);
        assert!(matches!(
            h.write(dec(0, D_CTRL), CTRL_COMMIT | CTRL_LOCK_ON_COMMIT),
            Some(DecoderEvent::Committed { .. })
        ));
        assert_eq!(h.write(dec(0, D_CTRL), 0), None, "locked: uncommit ignored");
        assert_ne!(h.read(dec(0, D_CTRL)) & CTRL_COMMITTED, 0);
        assert_eq!(h.reset(), vec![DecoderEvent::Uncommitted { index: 0 }]);
        assert_eq!(h.read(dec(0, D_CTRL)), 0);
        assert_eq!(h.read(dec(0, D_BASE_HIGH)), 0);
    }

    #[test]
    fn capability_and_out_of_range_registers() {
        let mut h = HdmDecoders::new(1, GIB);
        assert_eq!(h.read(HDM_CAP) & 0xf, 0, "one decoder");
        assert_eq!(HdmDecoders::new(4, GIB).read(HDM_CAP) & 0xf, 2);
        // Found by fuzz target cxl_mailbox: 3 decoders were announced as 2.
        let three = HdmDecoders::new(3, GIB);
        assert_eq!(three.read(HDM_CAP) & 0xf, 2, "announced: 4");
        assert_eq!(
            three.len(),
            DECODER_BASE + 4 * DECODER_STRIDE,
            "and 4 exist"
        );
        h.write(HDM_GLOBAL_CTRL, 0xffff_ffff);
        assert_eq!(h.read(HDM_GLOBAL_CTRL), 3);
        assert_eq!(h.write(dec(7, D_CTRL), CTRL_COMMIT), None);
        assert_eq!(h.read(dec(7, D_CTRL)), 0);
        assert_eq!(h.len(), 0x30);
    }
}
