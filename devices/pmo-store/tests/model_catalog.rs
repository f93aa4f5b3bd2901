//! Model-based property test of the catalog: create / destroy / psync on several PMOs with
//! crashes injected at random persist points, against a model of which PMOs exist and what they
//! hold. Also checks that no space leaks: free bytes + live extents = the data area.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use pmo_crypto::PAGE;
use pmo_media::{CrashMedium, CrashMode, Medium};
use pmo_store::{Perm, Store, StoreError};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

const NP: u64 = 4;
const LEN: u64 = 4 << 20;

#[derive(Debug, Clone)]
enum Op {
    Create(u8),
    Destroy(u8),
    Psync(u8, u64, u8),
    Crash { k: u64, op: Box<Op> },
}

fn base_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..3).prop_map(Op::Create),
        (0u8..3).prop_map(Op::Destroy),
        (0u8..3, 0..NP, any::<u8>()).prop_map(|(n, p, t)| Op::Psync(n, p, t)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => base_op(),
        1 => (1u64..6, base_op()).prop_map(|(k, op)| Op::Crash { k, op: Box::new(op) }),
    ]
}

type Model = BTreeMap<String, Vec<[u8; PAGE]>>;

fn name(n: u8) -> String {
    format!("pmo{n}")
}

/// Runs one op; returns the model after it.
fn run(s: &Store, model: &Model, op: &Op) -> Result<Model, StoreError> {
    let mut m = model.clone();
    match op {
        Op::Create(n) => match s.create_pmo(&name(*n), NP * PAGE as u64, &key("k")) {
            Ok(()) => {
                m.insert(name(*n), vec![[0u8; PAGE]; NP as usize]);
            }
            Err(StoreError::Exists(_)) => {}
            Err(e) => return Err(e),
        },
        Op::Destroy(n) => match s.destroy_pmo(&name(*n), &key("k")) {
            Ok(()) => {
                m.remove(&name(*n));
            }
            Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(e),
        },
        Op::Psync(n, p, t) => {
            if !m.contains_key(&name(*n)) {
                return Ok(m);
            }
            let w = s.attach(&name(*n), Perm::Write, &key("k"))?;
            let d = page_of(*t, *p);
            w.psync([(*p, &d)])?;
            w.detach().wait()?;
            if let Some(c) = m.get_mut(&name(*n)) {
                c[*p as usize] = d;
            }
        }
        Op::Crash { .. } => {}
    }
    Ok(m)
}

fn observe(s: &Store) -> Model {
    let mut got = Model::new();
    for info in s.list() {
        let r = s.attach(&info.name, Perm::Read, &key("k")).unwrap();
        let mut pages = Vec::new();
        for p in 0..NP {
            let mut out = [0u8; PAGE];
            r.fault(p, &mut out).unwrap();
            pages.push(out);
        }
        r.detach().wait().unwrap();
        got.insert(info.name, pages);
    }
    got
}

fn no_leak(s: &Store) {
    let used: u64 = s.list().iter().map(|i| i.extent.1).sum();
    let area = s.superblock().medium_len - s.superblock().data_off;
    assert_eq!(s.free_bytes() + used, area, "space leaked");
    assert!(s.fsck().problems.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn catalog_matches_model(ops in prop::collection::vec(op(), 1..14)) {
        let mut m = Arc::new(CrashMedium::new(LEN));
        let mut s = Store::create(m.clone() as Arc<dyn Medium>, fast_options(3)).unwrap();
        let mut model = Model::new();
        for op in ops {
            match &op {
                Op::Crash { k, op: inner } => {
                    m.crash_at_persist(*k);
                    let r = run(&s, &model, inner);
                    if !m.crashed() {
                        m.disarm();
                        model = r.unwrap();
                        continue;
                    }
                    let new = run_model_only(&model, inner);
                    drop(s);
                    m = Arc::new(CrashMedium::from_image(m.crash_image(CrashMode::Random(*k))));
                    s = Store::open(m.clone() as Arc<dyn Medium>).unwrap().0;
                    let got = observe(&s);
                    prop_assert!(got == model || got == new, "after crash in {inner:?}: neither old nor new");
                    model = got;
                    no_leak(&s);
                }
                other => {
                    model = run(&s, &model, other).unwrap();
                }
            }
        }
        prop_assert!(observe(&s) == model);
        no_leak(&s);
    }
}

/// The model's next state for an op, without touching a store.
fn run_model_only(model: &Model, op: &Op) -> Model {
    let mut m = model.clone();
    match op {
        Op::Create(n) => {
            m.entry(name(*n))
                .or_insert_with(|| vec![[0u8; PAGE]; NP as usize]);
        }
        Op::Destroy(n) => {
            m.remove(&name(*n));
        }
        Op::Psync(n, p, t) => {
            if let Some(c) = m.get_mut(&name(*n)) {
                c[*p as usize] = page_of(*t, *p);
            }
        }
        Op::Crash { .. } => {}
    }
    m
}
