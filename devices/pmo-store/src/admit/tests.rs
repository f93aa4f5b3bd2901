//! The admission rules on hand-made tables (the attacks that lead to them are in
//! `tests/moved_records.rs`).

use super::*;
use crate::Design;
use pmo_crypto::{KdfParams, KeyParams, Suite};

fn rec(name: &str, commit: u64, state: PmoState, ext: u64) -> Box<Record> {
    Box::new(Record {
        seq: 1,
        state,
        design: Design::D,
        name: name.into(),
        npages: 1,
        ext_off: ext << 20,
        ext_len: 1 << 20,
        keys: KeyParams {
            salt: [1; 32],
            paper_iv: [2; 16],
            suite: Suite::AesGcm,
            uid: 7,
            kdf: KdfParams::INSECURE_FAST,
        },
        kcv: [3; 32],
        epoch: 0,
        next_epoch: 1,
        root: [0; 32],
        commit,
        pending_tags: 0,
        rec_mac: [0; 32],
        journal_len: 0,
        journal_sum: [0; 32],
        journal_dirty: 0,
    })
}

fn live(name: &str, commit: u64, ext: u64) -> Slot {
    Slot::Live {
        rec: rec(name, commit, PmoState::Detached, ext),
        copy: 0,
        layout: TreeLayout::new(1),
    }
}

fn free(name: &str, commit: u64) -> Slot {
    Slot::Free {
        rec: rec(name, commit, PmoState::Free, 0),
        copy: 0,
    }
}

fn entry(name: &str, commit: u64, destroyed: bool) -> AnchorEntry {
    AnchorEntry {
        commit,
        name: name.into(),
        destroyed,
    }
}

fn refused(a: &Admission) -> Vec<&str> {
    a.refused.keys().map(String::as_str).collect()
}

fn admitted(a: &Admission) -> Vec<(u32, &str)> {
    a.live
        .iter()
        .map(|p| (p.slot, p.rec.name.as_str()))
        .collect()
}

#[test]
fn without_an_anchor_duplicates_overlaps_and_invalid_records_refuse_their_names() {
    let slots = vec![
        live("a", 3, 2),
        live("b", 4, 4),
        live("a", 2, 6),
        Slot::Invalid {
            rec: rec("c", 5, PmoState::Detached, 8),
            why: "bad page count 0".into(),
        },
        live("d", 6, 10),
        live("e", 7, 10), // d's extent
        Slot::Damaged,
        Slot::Blank,
        free("f", 1),
    ];
    let a = admit(slots, None);
    assert_eq!(refused(&a), ["a", "c", "d", "e"]);
    assert!(
        a.refused["a"].contains("slots [0, 2]"),
        "{}",
        a.refused["a"]
    );
    assert!(a.refused["e"].contains("overlaps \"d\"'s (slot 4)"));
    assert_eq!(admitted(&a), [(1, "b")]);
    // Refused slots are neither live nor free; their extents stay reserved.
    assert_eq!(a.free_slots.keys().copied().collect::<Vec<_>>(), [7, 8]);
    assert_eq!(a.refused_extents.len(), 4);
    assert_eq!(a.bad_slots.len(), 2);
    assert!(a.catch_up.is_empty());
}

#[test]
fn the_anchor_refuses_what_its_names_contradict_and_catches_up_the_rest() {
    let slots = vec![
        Slot::Damaged,     // anchor: "a" live -> refuse a
        live("x", 9, 2),   // anchor: "b" live -> refuse b and x
        free("c", 5),      // anchor: "c" live at 5 -> destroyed at the same commit
        live("d", 4, 4),   // anchor: "d" destroyed at 4 -> live again at 4
        live("e", 3, 6),   // anchor never; "e" destroyed in slot 5 at 8 -> old copy
        free("e", 8),      // consistent
        live("g", 12, 10), // anchor "g" live at 10: a psync the anchor missed
        free("h", 11),     // anchor "h" live at 6: a destroy the anchor missed
        live("i", 13, 12), // anchor never: a create the anchor missed
        free("j", 2),      // anchor "j" destroyed at 2
    ];
    let entries = vec![
        entry("a", 7, false),
        entry("b", 6, false),
        entry("c", 5, false),
        entry("d", 4, true),
        AnchorEntry::default(),
        entry("e", 8, true),
        entry("g", 10, false),
        entry("h", 6, false),
        AnchorEntry::default(),
        entry("j", 2, true),
    ];
    let a = admit(slots, Some(&entries));
    assert_eq!(refused(&a), ["a", "b", "c", "d", "e", "x"]);
    assert!(a.refused["a"].contains("slot 0 is damaged"));
    assert!(a.refused["c"].contains("marks it destroyed at commit 5"));
    assert!(a.refused["d"].contains("where the anchor has it destroyed"));
    assert!(a.refused["e"].contains("an old copy"), "{}", a.refused["e"]);
    assert_eq!(admitted(&a), [(6, "g"), (8, "i")]);
    // The free records of refused names (c's, its state perhaps edited; e's) keep their
    // slots; h's and j's are free.
    assert_eq!(a.free_slots.keys().copied().collect::<Vec<_>>(), [7, 9]);
    let caught: Vec<(u32, &str, u64, bool)> = a
        .catch_up
        .iter()
        .map(|(i, e)| (*i, e.name.as_str(), e.commit, e.destroyed))
        .collect();
    assert_eq!(
        caught,
        [(6, "g", 12, false), (7, "h", 11, true), (8, "i", 13, false)]
    );
}
