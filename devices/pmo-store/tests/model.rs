//! Model-based property test: random sequences of operations (psync, fault, detach/attach with a
//! random design, injected crashes, clean reopen) against a plain in-memory model of "the PMO as
//! of its last completed psync".

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use pmo_crypto::PAGE;
use pmo_media::{CrashMedium, CrashMode, Medium};
use pmo_store::{CreateOptions, Design, Perm, Session, Store};
use proptest::prelude::*;
use std::sync::Arc;

const NP: u64 = 6;

#[derive(Debug, Clone)]
enum Op {
    Psync(Vec<(u64, u8)>),
    Fault(u64),
    Reattach(usize),
    CrashDuringPsync {
        k: u64,
        random: bool,
        pages: Vec<(u64, u8)>,
    },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    let pages = prop::collection::vec((0..NP, any::<u8>()), 1..4);
    prop_oneof![
        3 => pages.clone().prop_map(Op::Psync),
        3 => (0..NP).prop_map(Op::Fault),
        1 => (0..Design::ON_ANY_MEDIUM.len()).prop_map(Op::Reattach),
        2 => (1u64..10, any::<bool>(), pages).prop_map(|(k, random, pages)| Op::CrashDuringPsync { k, random, pages }),
        1 => Just(Op::Reopen),
    ]
}

fn attach(s: &Store, d: Design) -> Session {
    s.attach_with("m", Perm::Write, &key("k"), Some(d)).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn store_matches_model(ops in prop::collection::vec(op(), 1..12)) {
        let mut m = Arc::new(CrashMedium::new(4 << 20));
        let mut s = Store::create(m.clone() as Arc<dyn Medium>, fast_options(4)).unwrap();
        s.create_pmo_with("m", NP * PAGE as u64, &key("k"), CreateOptions::default()).unwrap();
        let mut model: Vec<[u8; PAGE]> = vec![[0u8; PAGE]; NP as usize];
        let mut design = Design::D;
        let mut sess = Some(attach(&s, design));
        for op in ops {
            match op {
                Op::Psync(pages) => {
                    let data: Vec<(u64, [u8; PAGE])> = pages.iter().map(|&(p, t)| (p, page_of(t, p))).collect();
                    sess.as_ref().unwrap().psync(data.iter().map(|(p, d)| (*p, d))).unwrap();
                    for (p, d) in data { model[p as usize] = d; }
                }
                Op::Fault(p) => {
                    let mut out = [0u8; PAGE];
                    sess.as_ref().unwrap().fault(p, &mut out).unwrap();
                    prop_assert_eq!(&out[..], &model[p as usize][..]);
                }
                Op::Reattach(d) => {
                    sess.take().unwrap().detach();
                    design = Design::ON_ANY_MEDIUM[d];
                    sess = Some(attach(&s, design));
                }
                Op::CrashDuringPsync { k, random, pages } => {
                    let data: Vec<(u64, [u8; PAGE])> = pages.iter().map(|&(p, t)| (p, page_of(t, p))).collect();
                    let mut new = model.clone();
                    for (p, d) in &data { new[*p as usize] = *d; }
                    m.crash_at_persist(k);
                    let r = sess.as_ref().unwrap().psync(data.iter().map(|(p, d)| (*p, d)));
                    if !m.crashed() {
                        m.disarm();
                        r.unwrap();
                        model = new;
                        continue;
                    }
                    drop(sess.take());
                    drop(s);
                    let mode = if random { CrashMode::Random(k) } else { CrashMode::DropAll };
                    m = Arc::new(CrashMedium::from_image(m.crash_image(mode)));
                    s = Store::open(m.clone() as Arc<dyn Medium>).unwrap().0;
                    let r = s.attach("m", Perm::Read, &key("k")).unwrap();
                    let mut got = Vec::new();
                    for p in 0..NP {
                        let mut out = [0u8; PAGE];
                        r.fault(p, &mut out).unwrap();
                        got.push(out);
                    }
                    r.detach().wait().unwrap();
                    prop_assert!(got == model || got == new, "mixed state after crash");
                    model = got;
                    sess = Some(attach(&s, design));
                }
                Op::Reopen => {
                    sess.take().unwrap().detach().wait().unwrap();
                    drop(s);
                    m = Arc::new(CrashMedium::from_image(m.crash_image(CrashMode::DropAll)));
                    let (s2, rep) = Store::open(m.clone() as Arc<dyn Medium>).unwrap();
                    prop_assert!(rep.actions.is_empty());
                    s = s2;
                    sess = Some(attach(&s, design));
                }
            }
        }
        sess.take().unwrap().detach().wait().unwrap();
        prop_assert!(s.fsck().problems.is_empty());
    }
}
