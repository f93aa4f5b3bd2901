//! Which PMOs open admits: the PMO table as the medium has it, reconciled with the rollback
//! anchor, before anything is written.
//!
//! A keyless editor can damage a slot, copy a record into another slot, duplicate one, or put
//! back an old record with its old extent. Each old record still verifies where it was sealed
//! (its MAC binds the store and the slot), so open must never pick between two claims on a
//! name by slot order, nor let a PMO vanish unremarked. The rules (docs/store.md, "Admission"):
//!
//! 1. A record that decodes but fails validation refuses its name.
//! 2. A name held by two or more slots is refused at all of them.
//! 3. Two PMOs whose extents overlap are both refused.
//!
//! With an anchor (which knows, per slot, the number, PMO name and kind of the last commit):
//!
//! 4. A slot behind its entry refuses the whole store (`Anchor::check`, before these rules).
//! 5. A slot whose entry has a live PMO refuses that name if the slot is damaged, holds another
//!    name, or marks it destroyed at a commit the anchor has it live at.
//! 6. A slot whose entry has a destroyed PMO refuses its name if the slot holds it live again at
//!    or below the destroy's commit.
//! 7. A record of a name in any slot other than the one of the anchor's latest commit of that
//!    name, at or below that commit, is an old copy: the name is refused.
//!
//! A refused name is kept out of the catalog (attach, destroy and create of it fail with
//! `StoreError::Refused`) and its slots out of the free list (also a free record of that name,
//! which may be the PMO's own record with an edited state); its extent stays reserved when a
//! record gives one and it overlaps nothing live. A record ahead of its entry that no rule refuses is a commit a crash kept
//! from the anchor: the anchor catches up with it.

use crate::anchor::AnchorEntry;
use crate::record::{read_slot, Record, SlotContent};
use crate::superblock::{Superblock, SuperblockError, SLOT_SIZE};
use crate::tree::TreeLayout;
use crate::{validate_name, ExtentGeometry, PmoState, StoreError, EXTENT_ALIGN, MAX_PMO_SIZE};
use pmo_crypto::PAGE;
use pmo_media::Medium;
use std::collections::{BTreeMap, HashMap};

/// What one table slot holds, as open reads it.
pub(crate) enum Slot {
    /// Never used.
    Blank,
    /// Not blank, but no record copy decodes.
    Damaged,
    /// A destroyed PMO's record: the slot is free.
    Free { rec: Box<Record>, copy: u8 },
    /// A record that passed validation.
    Live {
        rec: Box<Record>,
        copy: u8,
        layout: TreeLayout,
    },
    /// A record that decodes but fails validation.
    Invalid { rec: Box<Record>, why: String },
}

impl Slot {
    /// The slot's commit number as the medium has it (`None`: damaged, unknown).
    pub fn commit(&self) -> Option<u64> {
        match self {
            Slot::Blank => Some(0),
            Slot::Damaged => None,
            Slot::Free { rec, .. } | Slot::Live { rec, .. } | Slot::Invalid { rec, .. } => {
                Some(rec.commit)
            }
        }
    }

    fn record(&self) -> Option<&Record> {
        match self {
            Slot::Free { rec, .. } | Slot::Live { rec, .. } | Slot::Invalid { rec, .. } => {
                Some(rec)
            }
            Slot::Blank | Slot::Damaged => None,
        }
    }

    /// The record of a PMO that is not free (its name is claimed here).
    fn claim(&self) -> Option<&Record> {
        match self {
            Slot::Live { rec, .. } | Slot::Invalid { rec, .. } => Some(rec),
            _ => None,
        }
    }
}

/// Checks a record's fields against the store before anything trusts them.
pub(crate) fn validate(
    sb: &Superblock,
    r: &Record,
) -> Result<(TreeLayout, ExtentGeometry), String> {
    validate_name(&r.name).map_err(|e| e.to_string())?;
    if r.npages == 0 || r.npages > MAX_PMO_SIZE / PAGE as u64 {
        return Err(format!("bad page count {}", r.npages));
    }
    let layout = TreeLayout::new(r.npages);
    let geo = ExtentGeometry::of(r.npages, &layout);
    let end = r.ext_off.checked_add(r.ext_len).ok_or("extent overflows")?;
    if r.ext_off < sb.data_off
        || end > sb.medium_len
        || r.ext_len < geo.total()
        || !r.ext_off.is_multiple_of(EXTENT_ALIGN)
        || !r.ext_len.is_multiple_of(EXTENT_ALIGN)
    {
        return Err("extent outside data area or too small".into());
    }
    if r.journal_len > geo.journal_len {
        return Err("journal longer than journal area".into());
    }
    // Bounded before any attach spends memory and time on them.
    r.keys.kdf.check().map_err(|e| e.to_string())?;
    Ok((layout, geo))
}

/// Reads every table slot. A record whose extent ends past the store's length but inside
/// the medium refuses the store: either the superblock's length was cut below a PMO (and
/// what lies past it, on an expander the working area, would overwrite the PMO) or the
/// record was edited; honest stores have neither.
pub(crate) fn scan(m: &dyn Medium, sb: &Superblock) -> Result<Vec<Slot>, StoreError> {
    check_table_tail(m, sb)?;
    let mut slots = Vec::with_capacity(sb.slots as usize);
    for slot in 0..sb.slots {
        let s = match read_slot(m, sb, slot)? {
            SlotContent::Blank => Slot::Blank,
            SlotContent::Damaged => Slot::Damaged,
            SlotContent::Valid { rec, copy } if rec.state == PmoState::Free => {
                Slot::Free { rec, copy }
            }
            SlotContent::Valid { rec, copy } => {
                let end = rec.ext_off.checked_add(rec.ext_len);
                if let Some(end) = end.filter(|e| *e > sb.medium_len && *e <= m.len()) {
                    if rec.ext_off >= sb.data_off {
                        return Err(SuperblockError::CutsExtent {
                            slot,
                            end,
                            store: sb.medium_len,
                        }
                        .into());
                    }
                }
                match validate(sb, &rec) {
                    Ok((layout, _)) => Slot::Live { rec, copy, layout },
                    Err(why) => Slot::Invalid { rec, why },
                }
            }
        };
        slots.push(s);
    }
    Ok(slots)
}

/// The slot right after the table, when it lies before the data area, must be all zero: the
/// store fills its table from the lowest free slot, so a slot past the count that was ever
/// used means the count was lowered, hiding every PMO beyond it.
fn check_table_tail(m: &dyn Medium, sb: &Superblock) -> Result<(), StoreError> {
    let at = sb.record_off(sb.slots, 0);
    if at
        .checked_add(SLOT_SIZE)
        .is_some_and(|end| end <= sb.data_off)
    {
        let mut b = vec![0u8; SLOT_SIZE as usize];
        m.read(at, &mut b)?;
        if b.iter().any(|x| *x != 0) {
            return Err(SuperblockError::TableTail { slots: sb.slots }.into());
        }
    }
    Ok(())
}

/// A PMO open admits.
pub(crate) struct Admitted {
    pub slot: u32,
    pub rec: Record,
    pub copy: u8,
    pub layout: TreeLayout,
}

/// The outcome of the rules: what goes into the catalog and what the report says.
#[derive(Default)]
pub(crate) struct Admission {
    pub live: Vec<Admitted>,
    /// Free slot -> (last seq, current copy).
    pub free_slots: BTreeMap<u32, (u64, u8)>,
    /// Refused names and why (one reason each, the first found).
    pub refused: BTreeMap<String, String>,
    /// Extents of refused records, kept from reuse where they do not overlap anything.
    pub refused_extents: Vec<(u64, u64)>,
    /// Slots that could not be decoded or failed validation.
    pub bad_slots: Vec<(u32, String)>,
    /// Slots whose record is ahead of the anchor and admitted: the anchor catches up.
    pub catch_up: Vec<(u32, crate::anchor::AnchorEntry)>,
}

/// Applies the rules to the scanned table; `anchor` holds one entry per slot, if the store
/// has an anchor (whose `check` already passed).
pub(crate) fn admit(slots: Vec<Slot>, anchor: Option<&[AnchorEntry]>) -> Admission {
    let mut a = Admission::default();
    // Rules 1 and 2: invalid records, names held twice.
    let mut holders: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for (i, s) in slots.iter().enumerate() {
        let i = i as u32;
        match s {
            Slot::Damaged => a.bad_slots.push((i, "no valid record copy".into())),
            Slot::Invalid { rec, why } => {
                a.bad_slots.push((i, why.clone()));
                refuse(
                    &mut a.refused,
                    &rec.name,
                    format!("its record in table slot {i} is invalid: {why}"),
                );
            }
            _ => {}
        }
        if let Some(rec) = s.claim() {
            holders.entry(&rec.name).or_default().push(i);
        }
    }
    for (name, at) in &holders {
        if at.len() > 1 {
            refuse(
                &mut a.refused,
                name,
                format!("table slots {at:?} all hold it (a record copied from another slot)"),
            );
        }
    }
    if let Some(entries) = anchor {
        anchor_rules(&slots, entries, &mut a.refused);
    }
    // Rule 3 over what is left.
    let mut candidates: Vec<(u64, u64, u32, &str)> = slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            Slot::Live { rec, .. } if !a.refused.contains_key(&rec.name) => Some((
                rec.ext_off,
                rec.ext_off + rec.ext_len,
                i as u32,
                rec.name.as_str(),
            )),
            _ => None,
        })
        .collect();
    candidates.sort_unstable();
    let mut reach: Option<(u64, u32, &str)> = None;
    let mut overlaps = Vec::new();
    for &(off, end, slot, name) in &candidates {
        if let Some((r_end, r_slot, r_name)) = reach {
            if off < r_end {
                overlaps.push((name, slot, r_name, r_slot));
            }
            if end <= r_end {
                continue;
            }
        }
        reach = Some((end, slot, name));
    }
    for (n1, s1, n2, s2) in overlaps {
        let why = |other: &str, at: u32| format!("its extent overlaps {other:?}'s (slot {at})");
        refuse(&mut a.refused, n1, why(n2, s2));
        refuse(&mut a.refused, n2, why(n1, s1));
    }
    for (i, s) in slots.into_iter().enumerate() {
        let i = i as u32;
        let entry = anchor.and_then(|e| e.get(i as usize));
        let ahead = |rec: &Record| entry.is_some_and(|e| rec.commit > e.commit);
        match s {
            Slot::Blank => {
                a.free_slots.insert(i, (0, 1));
            }
            // A free record of a refused name may be that PMO's record with its state edited
            // (rule 5): neither its slot nor its extent is handed out before repair.
            Slot::Free { rec, .. } if a.refused.contains_key(&rec.name) => {
                a.refused_extents.push((rec.ext_off, rec.ext_len));
            }
            Slot::Free { rec, copy } => {
                if ahead(&rec) {
                    a.catch_up.push((i, AnchorEntry::of(&rec)));
                }
                a.free_slots.insert(i, (rec.seq, copy));
            }
            Slot::Live { rec, copy, layout } => {
                if a.refused.contains_key(&rec.name) {
                    a.refused_extents.push((rec.ext_off, rec.ext_len));
                    continue;
                }
                if ahead(&rec) {
                    a.catch_up.push((i, AnchorEntry::of(&rec)));
                }
                a.live.push(Admitted {
                    slot: i,
                    rec: *rec,
                    copy,
                    layout,
                });
            }
            Slot::Damaged | Slot::Invalid { .. } => {}
        }
    }
    a
}

/// Refuses `name` for `why` (the first reason found stays). A string that is not a PMO name
/// can never be asked for: there is nothing to refuse.
fn refuse(refused: &mut BTreeMap<String, String>, name: &str, why: String) {
    if validate_name(name).is_ok() {
        refused.entry(name.to_string()).or_insert(why);
    }
}

/// Rules 5 to 7: the table against what the anchor last learned.
fn anchor_rules(slots: &[Slot], entries: &[AnchorEntry], refused: &mut BTreeMap<String, String>) {
    // The anchor's latest commit of each name, and its slot.
    let mut latest: HashMap<&str, (u64, u32)> = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        if e.commit == 0 || e.name.is_empty() {
            continue;
        }
        let l = latest.entry(&e.name).or_insert((e.commit, i as u32));
        if e.commit > l.0 {
            *l = (e.commit, i as u32);
        }
    }
    for (i, (s, e)) in slots.iter().zip(entries).enumerate() {
        if e.is_live() {
            match s.record() {
                None if matches!(s, Slot::Damaged) => refuse(
                    refused,
                    &e.name,
                    format!(
                        "its table slot {i} is damaged (the anchor has it there at commit {})",
                        e.commit
                    ),
                ),
                None => {}
                Some(rec) if rec.name != e.name => {
                    let why = format!(
                        "table slot {i} holds {:?} at commit {} where the anchor has {:?} at \
                         commit {}",
                        rec.name, rec.commit, e.name, e.commit
                    );
                    refuse(refused, &e.name, why.clone());
                    if s.claim().is_some() {
                        refuse(refused, &rec.name, why);
                    }
                }
                Some(rec) if rec.state.is_destroyed() && rec.commit <= e.commit => refuse(
                    refused,
                    &e.name,
                    format!(
                        "table slot {i} marks it destroyed at commit {}, where the anchor has \
                         it live",
                        rec.commit
                    ),
                ),
                Some(_) => {}
            }
        } else if e.destroyed {
            if let Some(rec) = s.claim() {
                if rec.name == e.name && !rec.state.is_destroyed() && rec.commit <= e.commit {
                    refuse(
                        refused,
                        &e.name,
                        format!(
                            "table slot {i} holds it live at commit {}, where the anchor has it \
                             destroyed at commit {}",
                            rec.commit, e.commit
                        ),
                    );
                }
            }
        }
    }
    for (i, s) in slots.iter().enumerate() {
        let Some(rec) = s.claim() else { continue };
        if let Some(&(commit, at)) = latest.get(rec.name.as_str()) {
            if at != i as u32 && rec.commit <= commit {
                refuse(
                    refused,
                    &rec.name,
                    format!(
                        "table slot {i} holds it at commit {}, but the anchor's last commit of it \
                         is {commit}, in slot {at}: an old copy",
                        rec.commit
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
