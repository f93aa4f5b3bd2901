//! Committed HDM decoders as guest memory: each committed decoder's HPA range becomes a
//! KVM memslot onto the expander's host mapping of its DPA range, and goes at uncommit or
//! reset. The one place where an overlap would alias memory, so it is checked again here.

use cxl_t3::hdm::DecoderEvent;

use crate::vm::{MemSlot, SlotMapper, VmError};

/// Puts a decoded range into the guest's memory map; the VMM's is
/// [`SlotMapper`] (a KVM memslot), tests use a recorder.
pub(super) trait RangeMapper {
    /// Dropping it removes the range from the guest.
    type Slot;
    /// Maps guest-physical `[gpa, gpa + len)` onto host `[host, host + len)`.
    ///
    /// # Safety
    /// The host range must stay mapped for as long as the slot lives.
    unsafe fn map(&self, gpa: u64, host: u64, len: u64) -> Result<Self::Slot, VmError>;
}

impl RangeMapper for SlotMapper {
    type Slot = MemSlot;
    unsafe fn map(&self, gpa: u64, host: u64, len: u64) -> Result<MemSlot, VmError> {
        // SAFETY: forwarded from the caller's guarantee.
        unsafe { SlotMapper::map(self, gpa, host, len, false) }
    }
}

/// One live mapping of a committed decoder.
struct Mapped<S> {
    hpa: u64,
    dpa: u64,
    size: u64,
    _slot: S,
}

/// The guest mappings of one device's committed decoders: at most one per
/// decoder, made at commit and dropped at uncommit or reset. The decoder
/// model already keeps committed ranges disjoint; this checks it again at
/// the one place where an overlap would alias memory, and maps nothing
/// rather than a second view of a DPA (or a second slot over an HPA).
pub(super) struct DecoderMaps<M: RangeMapper> {
    mapper: M,
    /// By decoder index.
    slots: Vec<Option<Mapped<M::Slot>>>,
    /// The device's fixed memory window (HPA): nothing maps outside it.
    window: u64,
    window_size: u64,
    /// The DPA space in this process.
    host: u64,
    dpa_size: u64,
    /// Shut down: commits no longer map anything.
    stopped: bool,
}

impl<M: RangeMapper> DecoderMaps<M> {
    /// # Safety
    /// `[host, host + dpa_size)` must stay mapped for as long as this value
    /// holds mappings (drop it, or [`DecoderMaps::clear`] it, first).
    pub(super) unsafe fn new(
        mapper: M,
        decoders: usize,
        window: u64,
        window_size: u64,
        host: u64,
        dpa_size: u64,
    ) -> Self {
        DecoderMaps {
            mapper,
            slots: (0..decoders).map(|_| None).collect(),
            window,
            window_size,
            host,
            dpa_size,
            stopped: false,
        }
    }

    /// Shut down: drops every mapping, and commits from now on map nothing.
    pub(super) fn stop(&mut self) {
        self.stopped = true;
        self.clear();
    }

    /// Drops every mapping.
    pub(super) fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
    }

    /// How many decoders are mapped now.
    #[cfg(test)]
    fn live(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Maps or unmaps guest memory for a decoder change.
    pub(super) fn on_event(&mut self, ev: DecoderEvent) {
        match ev {
            DecoderEvent::Committed {
                index,
                hpa,
                size,
                dpa,
            } => self.commit(index, hpa, size, dpa),
            DecoderEvent::Uncommitted { index } => {
                if let Some(s) = self.slots.get_mut(index) {
                    *s = None;
                }
            }
            DecoderEvent::Refused { index, reason } => {
                log::warn!("cxl-t3: decoder {index} commit refused: {reason}");
            }
        }
    }

    fn commit(&mut self, index: usize, hpa: u64, size: u64, dpa: u64) {
        if self.stopped {
            return;
        }
        // A decoder has one mapping at most: a stale one goes first.
        let Some(slot) = self.slots.get_mut(index) else {
            log::warn!("cxl-t3: decoder {index} is not ours: not mapped");
            return;
        };
        *slot = None;
        if size == 0 {
            // Legal (CXL 2.0 8.2.5.12.20); a zero-sized memslot would be a
            // KVM slot deletion, so there is nothing to map.
            log::info!("cxl-t3: decoder {index} committed with size 0: decodes nothing");
            return;
        }
        let inside = hpa >= self.window
            && hpa.checked_add(size).is_some_and(|end| {
                self.window
                    .checked_add(self.window_size)
                    .is_some_and(|wend| end <= wend)
            });
        let in_dpa = dpa
            .checked_add(size)
            .is_some_and(|end| end <= self.dpa_size);
        if !inside || !in_dpa {
            log::warn!(
                "cxl-t3: decoder {index} committed at HPA {hpa:#x}+{size:#x} (DPA {dpa:#x}), \
                 outside the memory window {:#x}+{:#x} or the device: not mapped",
                self.window,
                self.window_size
            );
            return;
        }
        let overlaps =
            |a: u64, b: u64, len: u64| a < b.saturating_add(len) && b < a.saturating_add(size);
        if let Some((other, _)) = self.slots.iter().enumerate().find(|(_, s)| {
            s.as_ref()
                .is_some_and(|m| overlaps(hpa, m.hpa, m.size) || overlaps(dpa, m.dpa, m.size))
        }) {
            log::error!("cxl-t3: decoder {index} overlaps mapped decoder {other}: not mapped");
            return;
        }
        // SAFETY: `dpa + size` is within the DPA space (checked above),
        // which `new`'s caller keeps mapped while mappings exist.
        match unsafe { self.mapper.map(hpa, self.host + dpa, size) } {
            Ok(s) => {
                if let Some(slot) = self.slots.get_mut(index) {
                    *slot = Some(Mapped {
                        hpa,
                        dpa,
                        size,
                        _slot: s,
                    });
                }
                log::info!("cxl-t3: decoder {index}: HPA {hpa:#x}+{size:#x} -> DPA {dpa:#x}");
            }
            Err(e) => log::error!("cxl-t3: map decoder {index}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cxl_t3::hdm::{self, HdmDecoders, CTRL_COMMIT, HDM_ALIGN as U};
    use std::cell::RefCell;
    use std::rc::Rc;

    /// Live mappings as (gpa, host, len), shared with the slots.
    #[derive(Clone, Default)]
    struct Recorder(Rc<RefCell<Vec<(u64, u64, u64)>>>);

    struct RecSlot {
        rec: Recorder,
        gpa: u64,
    }

    impl Drop for RecSlot {
        fn drop(&mut self) {
            self.rec.0.borrow_mut().retain(|m| m.0 != self.gpa);
        }
    }

    impl RangeMapper for Recorder {
        type Slot = RecSlot;
        unsafe fn map(&self, gpa: u64, host: u64, len: u64) -> Result<RecSlot, VmError> {
            self.0.borrow_mut().push((gpa, host, len));
            Ok(RecSlot {
                rec: self.clone(),
                gpa,
            })
        }
    }

    const WINDOW: u64 = 0x20_0000_0000;
    const HOST: u64 = 0x7f00_0000_0000;

    fn maps(rec: &Recorder, dpa_size: u64) -> DecoderMaps<Recorder> {
        // SAFETY: the recorder maps nothing; the host range is never touched.
        unsafe {
            DecoderMaps::new(
                rec.clone(),
                hdm::DECODER_COUNT,
                WINDOW,
                8 * U,
                HOST,
                dpa_size,
            )
        }
    }

    fn committed(index: usize, hpa: u64, size: u64, dpa: u64) -> DecoderEvent {
        DecoderEvent::Committed {
            index,
            hpa,
            size,
            dpa,
        }
    }

    #[test]
    fn one_slot_per_committed_decoder_and_never_an_alias() {
        let rec = Recorder::default();
        let mut m = maps(&rec, 8 * U);
        m.on_event(committed(0, WINDOW, 2 * U, 0));
        assert_eq!(*rec.0.borrow(), vec![(WINDOW, HOST, 2 * U)]);
        // Overlapping DPA or HPA (which the decoder model never commits) is
        // not mapped a second time.
        m.on_event(committed(1, WINDOW + 2 * U, U, U));
        m.on_event(committed(2, WINDOW + U, U, 4 * U));
        assert_eq!(m.live(), 1);
        // Size 0, outside the window, past the DPA space: nothing mapped.
        m.on_event(committed(3, WINDOW + 3 * U, 0, 2 * U));
        m.on_event(committed(3, WINDOW + 8 * U, U, 2 * U));
        m.on_event(committed(3, WINDOW + 7 * U, U, 8 * U));
        m.on_event(committed(3, u64::MAX - U + 1, U, 2 * U));
        m.on_event(committed(9, WINDOW + 3 * U, U, 2 * U));
        assert_eq!(m.live(), 1);
        // A disjoint one maps; a recommit of the same decoder replaces its slot.
        m.on_event(committed(1, WINDOW + 2 * U, U, 2 * U));
        m.on_event(committed(1, WINDOW + 3 * U, U, 3 * U));
        assert_eq!(
            *rec.0.borrow(),
            vec![(WINDOW, HOST, 2 * U), (WINDOW + 3 * U, HOST + 3 * U, U)]
        );
        m.on_event(DecoderEvent::Uncommitted { index: 0 });
        assert_eq!(*rec.0.borrow(), vec![(WINDOW + 3 * U, HOST + 3 * U, U)]);
        m.stopped = true;
        m.on_event(committed(0, WINDOW, U, 0));
        m.clear();
        assert!(rec.0.borrow().is_empty());
    }

    /// Random programming, in- and out-of-order commits and uncommits and
    /// resets of the real decoder model, fed to the mappings as the VMM
    /// feeds them: the live slots are exactly the committed non-empty
    /// decoders, and no two share a guest or a host byte.
    #[test]
    fn random_decoder_sequences_never_alias_a_mapping() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut max_live = 0;
        for _run in 0..200 {
            let rec = Recorder::default();
            let mut m = maps(&rec, 8 * U);
            let mut h = HdmDecoders::new(hdm::DECODER_COUNT, 8 * U);
            for _step in 0..100 {
                let i = next(hdm::DECODER_COUNT as u64) as usize;
                let mut events = Vec::new();
                match next(10) {
                    0..=2 => {
                        // Mostly ascending by index, so that commits often succeed.
                        let (base, size, skip) = (2 * i as u64 + next(3), next(3), next(2));
                        for (reg, v) in [
                            (hdm::D_BASE_LOW, (WINDOW + base * U) as u32),
                            (hdm::D_BASE_HIGH, ((WINDOW + base * U) >> 32) as u32),
                            (hdm::D_SIZE_LOW, (size * U) as u32),
                            (hdm::D_SIZE_HIGH, 0),
                            (hdm::D_SKIP_LOW, (skip * U) as u32),
                        ] {
                            events.extend(h.write(hdm::decoder_reg(i, reg), v));
                        }
                    }
                    3..=5 => events.extend(h.write(hdm::decoder_reg(i, hdm::D_CTRL), CTRL_COMMIT)),
                    6..=8 => events.extend(h.write(hdm::decoder_reg(i, hdm::D_CTRL), 0)),
                    _ => events.extend(h.reset()),
                }
                for ev in events {
                    m.on_event(ev);
                }
                let live = rec.0.borrow().clone();
                let want: Vec<_> = h
                    .committed()
                    .into_iter()
                    .filter(|c| c.size > 0 && c.hpa + c.size <= WINDOW + 8 * U)
                    .map(|c| (c.hpa, HOST + c.dpa, c.size))
                    .collect();
                let mut sorted = live.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, want, "slots are the committed decoders");
                for (k, a) in live.iter().enumerate() {
                    for b in &live[k + 1..] {
                        assert!(
                            a.0 + a.2 <= b.0 || b.0 + b.2 <= a.0,
                            "HPA alias {a:?} {b:?}"
                        );
                        assert!(
                            a.1 + a.2 <= b.1 || b.1 + b.2 <= a.1,
                            "DPA alias {a:?} {b:?}"
                        );
                    }
                }
                max_live = max_live.max(live.len());
            }
        }
        // The sequences did reach several decoders at once.
        assert!(max_live >= 3, "max live mappings {max_live}");
    }
}
