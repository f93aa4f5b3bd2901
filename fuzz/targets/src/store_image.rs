//! `store_image`: the PMO store on images a keyless editor has changed.
//!
//! The attacker of docs/threat-model.md, first model: it rewrites any byte of the store and
//! recomputes every unkeyed checksum, so its edits get past the torn-write checks and reach the
//! keyed ones. Each input is a short program of edits applied to one of two genuine images,
//! then the store is opened (recovery), checked (fsck), attached with the right keys (and a
//! wrong one), every page faulted, one page psynced and read back, one PMO destroyed.
//!
//! Edits (structure-aware): a field of a record copy, re-encoded with its checksum; a field of
//! a superblock copy, re-encoded; tree bytes, with every group hash above them recomputed and
//! the new root written into the record; a journal byte, with the journal checksum recomputed
//! into the record; ciphertext bytes; a page (and its leaf) copied over another; two record
//! copies swapped; raw bytes anywhere.
//!
//! Oracle: nothing panics or hangs; a wrong key never attaches; **a fault that returns Ok
//! returns exactly the plaintext of a psync the key holder completed** (for the image caught
//! mid-commit, the commit before it is the other genuine state, and all pages of one attach
//! agree on which), a failed fault leaves no plaintext in the buffer; a psync that succeeds
//! reads back. The editor computes its checksums with its own code, not the store's: a bug
//! shared by verifier and forger would cancel out.

use locked::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use pmo_crypto::{KdfParams, Suite, UserKey, PAGE};
use pmo_media::{check_range, CrashMedium, CrashMode, Medium, MediumError};
use pmo_store::record::{Record, MAX_NAME};
use pmo_store::superblock::{Superblock, SB_SIZE, SLOT_SIZE};
use pmo_store::tree::{group_hash, TreeLayout, ARITY, LEAF, NODE};
use pmo_store::{CreateOptions, Design, Perm, Store, StoreError, StoreOptions};

use crate::common::Input;

const P: usize = PAGE;
const P64: u64 = PAGE as u64;

/// A store medium that keeps only the pages written (the golden images are 2 MiB, mostly the
/// zero PMO table): cloning one per input costs its few dozen pages, not a 2 MiB copy.
#[derive(Clone)]
struct Sparse {
    len: u64,
    pages: Arc<Mutex<HashMap<u64, Box<[u8; P]>>>>,
}

impl Sparse {
    fn from_image(img: &[u8]) -> Self {
        let mut pages = HashMap::new();
        for (i, c) in img.chunks(P).enumerate() {
            if c.iter().any(|b| *b != 0) {
                let mut p = Box::new([0u8; P]);
                p[..c.len()].copy_from_slice(c);
                pages.insert(i as u64, p);
            }
        }
        Sparse {
            len: img.len() as u64,
            pages: Arc::new(Mutex::new(pages)),
        }
    }

    fn deep_clone(&self) -> Self {
        let pages = self.pages.locked().clone();
        Sparse {
            len: self.len,
            pages: Arc::new(Mutex::new(pages)),
        }
    }

    fn get(&self, off: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        let _ = self.read(off, &mut v);
        v
    }

    fn put(&self, off: u64, data: &[u8]) {
        let _ = self.write(off, data);
    }
}

impl Medium for Sparse {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), MediumError> {
        check_range(self.len, off, buf.len() as u64)?;
        let pages = self.pages.locked();
        let mut at = 0usize;
        while at < buf.len() {
            let o = off + at as u64;
            let (pg, within) = (o / P64, (o % P64) as usize);
            let n = (P - within).min(buf.len() - at);
            match pages.get(&pg) {
                Some(p) => buf[at..at + n].copy_from_slice(&p[within..within + n]),
                None => buf[at..at + n].fill(0),
            }
            at += n;
        }
        Ok(())
    }

    fn write(&self, off: u64, data: &[u8]) -> Result<(), MediumError> {
        check_range(self.len, off, data.len() as u64)?;
        let mut pages = self.pages.locked();
        let mut at = 0usize;
        while at < data.len() {
            let o = off + at as u64;
            let (pg, within) = (o / P64, (o % P64) as usize);
            let n = (P - within).min(data.len() - at);
            let p = pages.entry(pg).or_insert_with(|| Box::new([0u8; P]));
            p[within..within + n].copy_from_slice(&data[at..at + n]);
            at += n;
        }
        Ok(())
    }

    fn persist(&self, off: u64, len: u64) -> Result<(), MediumError> {
        check_range(self.len, off, len)
    }
}

/// One PMO of the golden images.
struct Pmo {
    name: &'static str,
    key: &'static [u8],
    npages: u64,
    slot: u32,
    ext_off: u64,
    /// Plaintext after every completed psync, oldest first; the last is current.
    versions: Vec<Vec<[u8; P]>>,
}

struct Golden {
    /// Every session detached.
    settled: Sparse,
    /// A psync of "a" caught after its commit record and before its copy: recovery rolls it
    /// forward; the record copy before the commit is the previous genuine state.
    mid_commit: Sparse,
    pmos: Vec<Pmo>,
    slots: u32,
}

fn page(tag: u8, p: u64) -> [u8; P] {
    let mut b = [0u8; P];
    for (i, x) in b.iter_mut().enumerate() {
        *x = tag ^ (p as u8).wrapping_mul(29) ^ (i as u8).wrapping_mul(13);
    }
    b[..8].copy_from_slice(&p.to_le_bytes());
    b
}

fn key(k: &[u8]) -> UserKey {
    UserKey::new(k).unwrap_or_else(|_| unreachable!("keys here are not empty"))
}

fn golden() -> &'static Golden {
    static G: OnceLock<Golden> = OnceLock::new();
    G.get_or_init(build_golden)
}

/// Three PMOs: "a" (xts-blake3, d, 6 pages, two psyncs), "b" (aes-gcm, sp-id, 3 pages, one
/// psync), "c" (xts-blake3, bp-ip, 2 pages, never written); then a third psync of "a" caught
/// mid-commit for the second image.
fn build_golden() -> Golden {
    let m = Arc::new(CrashMedium::new(3 << 20));
    let opts = StoreOptions {
        slots: Some(4),
        kdf: KdfParams::INSECURE_FAST,
        ..StoreOptions::default()
    };
    let s = Store::create(m.clone(), opts).expect("golden store");
    let spec: [(&str, &[u8], u64, Suite, Design); 3] = [
        ("a", b"key-a", 6, Suite::XtsBlake3, Design::D),
        ("b", b"key-b", 3, Suite::AesGcm, Design::SpId),
        ("c", b"key-c", 2, Suite::XtsBlake3, Design::BpIp),
    ];
    let mut pmos = Vec::new();
    for (name, k, npages, suite, design) in spec {
        let o = CreateOptions {
            design,
            suite: Some(suite),
            kdf: None,
        };
        s.create_pmo_with(name, npages * P64, &key(k), o)
            .expect("golden PMO");
        pmos.push(Pmo {
            name,
            key: k,
            npages,
            slot: 0,
            ext_off: 0,
            versions: vec![vec![[0u8; P]; npages as usize]],
        });
    }
    let psync = |pmo: &mut Pmo, pages: &[(u64, u8)]| {
        let w = s
            .attach(pmo.name, Perm::Write, &key(pmo.key))
            .expect("golden attach");
        let mut next = pmo.versions[pmo.versions.len() - 1].clone();
        let data: Vec<(u64, [u8; P])> = pages.iter().map(|&(p, t)| (p, page(t, p))).collect();
        w.psync(data.iter().map(|(p, d)| (*p, d)))
            .expect("golden psync");
        for (p, d) in data {
            next[p as usize] = d;
        }
        pmo.versions.push(next);
        w.detach().wait().expect("golden detach");
    };
    psync(
        &mut pmos[0],
        &[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1)],
    );
    psync(&mut pmos[0], &[(1, 2), (4, 2)]);
    psync(&mut pmos[1], &[(1, 3)]);
    for (pmo, info) in pmos.iter_mut().zip(s.list()) {
        assert_eq!(pmo.name, info.name);
        pmo.slot = info.slot;
        pmo.ext_off = info.extent.0;
        // The first "version" (zeros before any psync) only stays for "c".
        if pmo.versions.len() > 1 {
            pmo.versions.remove(0);
        }
    }
    let settled = Sparse::from_image(&m.snapshot());
    // Persist points of a psync: EP record, journal, TC record (the commit), then the copy.
    let w = s
        .attach("a", Perm::Write, &key(b"key-a"))
        .expect("golden attach");
    m.crash_at_persist(4);
    let third = [page(7, 2), page(7, 5)];
    assert!(w.psync([(2u64, &third[0]), (5, &third[1])]).is_err());
    drop(w);
    let mid_commit = Sparse::from_image(&m.crash_image(CrashMode::DropAll));
    let mut next = pmos[0].versions[1].clone();
    next[2] = third[0];
    next[5] = third[1];
    pmos[0].versions.push(next);
    Golden {
        settled,
        mid_commit,
        pmos,
        slots: 4,
    }
}

/// The record copy `copy` of `slot`: where it is and what it decodes to.
fn record_at(m: &Sparse, sb: &Superblock, slot: u32, copy: u8) -> (u64, Option<Record>) {
    let at = sb.record_off(slot, copy);
    (at, Record::decode(&m.get(at, (SLOT_SIZE / 2) as usize)))
}

/// The current copy of `slot` (higher valid sequence), as the store picks it.
fn current_record(m: &Sparse, sb: &Superblock, slot: u32) -> Option<(u64, Record)> {
    let (a0, r0) = record_at(m, sb, slot, 0);
    let (a1, r1) = record_at(m, sb, slot, 1);
    match (r0, r1) {
        (Some(x), Some(y)) if y.seq > x.seq => Some((a1, y)),
        (Some(x), _) => Some((a0, x)),
        (None, Some(y)) => Some((a1, y)),
        (None, None) => None,
    }
}

fn edit_record_field(r: &mut Record, inp: &mut Input) {
    let v = match inp.u8() % 4 {
        0 => inp.u64(),
        1 => u64::from(inp.u8()),
        2 => u64::MAX - u64::from(inp.u8()),
        _ => 1u64 << (inp.u8() % 64),
    };
    let flip = |a: &mut [u8], inp: &mut Input| {
        let n = a.len();
        a[inp.below(n)] ^= inp.u8() | 1;
    };
    match inp.u8() % 22 {
        0 => r.seq = v,
        1 => r.seq = r.seq.wrapping_add(1 + v % 4),
        2 => r.npages = v,
        3 => r.ext_off = v,
        4 => r.ext_len = v,
        5 => r.keys.uid ^= v,
        6 => flip(&mut r.keys.salt, inp),
        7 => flip(&mut r.keys.paper_iv, inp),
        // An in-bounds cost makes an attach spend up to seconds (the bound is tested in the
        // store's attack tests): out of bounds, or cheap.
        8 => {
            r.keys.kdf.m_kib = if v & 1 == 1 {
                v as u32 | 1 << 31
            } else {
                8 + v as u32 % 64
            }
        }
        9 => {
            r.keys.kdf.t = if v & 1 == 1 {
                v as u32 | 1 << 31
            } else {
                1 + v as u32 % 3
            }
        }
        10 => flip(&mut r.kcv, inp),
        11 => r.epoch = v,
        12 => r.next_epoch = v,
        13 => flip(&mut r.root, inp),
        14 => r.commit = v,
        15 => r.pending_tags = v,
        16 => flip(&mut r.rec_mac, inp),
        17 => r.journal_len = v,
        18 => flip(&mut r.journal_sum, inp),
        19 => r.journal_dirty = v,
        20 => {
            let n = 1 + inp.below(MAX_NAME);
            r.name = (0..n).map(|_| char::from(b'a' + inp.u8() % 26)).collect();
        }
        _ => {
            // The CXL designs too: on this file medium the store must refuse them.
            r.design = *inp.pick(&Design::ALL);
            r.keys.suite = *inp.pick(Suite::ALL);
        }
    }
}

fn edit_superblock(m: &Sparse, inp: &mut Input) {
    let copy = u64::from(inp.u8() % 2);
    let raw = m.get(copy * SB_SIZE, 128);
    let Ok(mut sb) = Superblock::decode(&raw) else {
        return;
    };
    let v = inp.u64();
    match inp.u8() % 5 {
        0 => sb.medium_len = v,
        1 => sb.slots = v as u32,
        2 => sb.table_off = v,
        3 => sb.data_off = v,
        _ => {
            let i = inp.below(16);
            sb.uuid[i] ^= inp.u8() | 1;
        }
    }
    m.put(copy * SB_SIZE, &sb.encode());
}

/// Recomputes every group hash of a PMO's tree bottom up (as an editor can: the tree hashes
/// are unkeyed) and writes the new root into the current record, re-encoded.
fn rehash_tree(m: &Sparse, sb: &Superblock, pmo: &Pmo) {
    let layout = TreeLayout::new(pmo.npages);
    let meta = pmo.ext_off + pmo.npages * P64;
    let mut root = [0u8; 32];
    for k in 0..layout.top() {
        for g in 0..layout.groups(k) {
            let (off, len) = layout.group_range(k, g);
            let h = group_hash(k, g, &m.get(meta + off, len));
            if k + 1 == layout.top() {
                root = h;
            } else {
                let (poff, _) = layout.group_range(k + 1, g / ARITY);
                m.put(meta + poff + (g % ARITY) * NODE as u64, &h);
            }
        }
    }
    if let Some((at, mut r)) = current_record(m, sb, pmo.slot) {
        r.root = root;
        m.put(at, &r.encode());
    }
}

/// The journal checksum as the editor computes it from the bytes in the TSC (header and
/// entries, covered data), written into the current record.
fn rechecksum_journal(m: &Sparse, sb: &Superblock, pmo: &Pmo, tsc: u64) {
    let Some((at, mut r)) = current_record(m, sb, pmo.slot) else {
        return;
    };
    let hdr = m.get(tsc, 32);
    let word = |b: &[u8], i: usize| {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[i * 8..i * 8 + 8]);
        u64::from_le_bytes(x)
    };
    let (count, len) = (word(&hdr, 2), word(&hdr, 3));
    let mut body = blake3::Hasher::new();
    let mut pos = 64u64;
    for _ in 0..count.min(64) {
        let eh = m.get(tsc + pos, 16);
        let elen = u64::from(u32::from_le_bytes([eh[8], eh[9], eh[10], eh[11]]));
        let flags = u32::from_le_bytes([eh[12], eh[13], eh[14], eh[15]]);
        let cost = 16 + elen.div_ceil(8) * 8;
        body.update(&eh);
        if flags == 0 && cost <= 1 << 20 {
            body.update(&m.get(tsc + pos + 16, (cost - 16) as usize));
        }
        pos = pos.saturating_add(cost);
    }
    let mut x = blake3::Hasher::new();
    x.update(&hdr);
    x.update(body.finalize().as_bytes());
    r.journal_sum = *x.finalize().as_bytes();
    r.journal_len = len;
    m.put(at, &r.encode());
}

fn mutate(m: &Sparse, g: &Golden, inp: &mut Input) {
    let Ok(sb) = Superblock::read(m) else { return };
    let pmo = inp.pick(&g.pmos);
    let layout = TreeLayout::new(pmo.npages);
    let meta = pmo.ext_off + pmo.npages * P64;
    let tsc = meta + layout.size();
    match inp.u8() % 9 {
        0 | 1 => {
            // A record field, through the record's own encoding (checksum recomputed).
            let slot = inp.below(g.slots as usize) as u32;
            let copy = inp.u8() % 2;
            let (at, rec) = record_at(m, &sb, slot, copy);
            match rec {
                Some(mut r) => {
                    for _ in 0..1 + inp.below(3) {
                        edit_record_field(&mut r, inp);
                    }
                    m.put(at, &r.encode());
                }
                None => {
                    let off = inp.below((SLOT_SIZE / 2) as usize) as u64;
                    m.put(at + off, &inp.bytes(16));
                }
            }
        }
        2 => edit_superblock(m, inp),
        3 => {
            // Tree bytes, then every hash above them and the root in the record.
            let k = inp.below(layout.top());
            let grp = inp.below(layout.groups(k) as usize) as u64;
            let (off, len) = layout.group_range(k, grp);
            let at = meta + off + inp.below(len) as u64;
            let b = m.get(at, 1)[0];
            m.put(at, &[b ^ (inp.u8() | 1)]);
            if !inp.u8().is_multiple_of(4) {
                rehash_tree(m, &sb, pmo);
            }
        }
        4 => {
            // A journal byte (header, entry header or data), then its checksum.
            let at = tsc + inp.below(8192) as u64;
            let b = m.get(at, 1)[0];
            m.put(at, &[b ^ (inp.u8() | 1)]);
            if inp.bool() {
                rechecksum_journal(m, &sb, pmo, tsc);
            }
        }
        5 => {
            // Ciphertext bytes.
            let at = pmo.ext_off + inp.below((pmo.npages * P64) as usize) as u64;
            let b = m.get(at, 1)[0];
            m.put(at, &[b ^ (inp.u8() | 1)]);
        }
        6 => {
            // A page and, maybe, its leaf copied over another page (of any PMO).
            let other = inp.pick(&g.pmos);
            let (from, to) = (
                inp.below(other.npages as usize) as u64,
                inp.below(pmo.npages as usize) as u64,
            );
            m.put(
                pmo.ext_off + to * P64,
                &m.get(other.ext_off + from * P64, P),
            );
            if inp.bool() {
                let leaf = LEAF as u64;
                let other_meta = other.ext_off + other.npages * P64;
                m.put(meta + to * leaf, &m.get(other_meta + from * leaf, LEAF));
                if inp.bool() {
                    rehash_tree(m, &sb, pmo);
                }
            }
        }
        7 => {
            // Two record copies swapped (across slots, or the two copies of one slot).
            let a = sb.record_off(inp.below(g.slots as usize) as u32, inp.u8() % 2);
            let b = sb.record_off(inp.below(g.slots as usize) as u32, inp.u8() % 2);
            let (ra, rb) = (m.get(a, 512), m.get(b, 512));
            m.put(a, &rb);
            m.put(b, &ra);
        }
        _ => {
            // Raw bytes anywhere.
            let at = inp.u64() % m.len;
            let bytes = inp.bytes(32);
            let n = bytes.len().min((m.len - at) as usize);
            m.put(at, &bytes[..n]);
        }
    }
}

/// Which genuine versions of `pmo` an attach may still show.
struct Allowed {
    versions: Vec<usize>,
}

impl Allowed {
    fn check(&mut self, pmo: &Pmo, p: u64, got: &[u8; P]) {
        self.versions
            .retain(|&v| pmo.versions[v][p as usize] == *got);
        assert!(
            !self.versions.is_empty(),
            "PMO {} page {p}: a fault returned bytes that no completed psync wrote (or a mix)",
            pmo.name
        );
    }
}

/// Ends a session: a detach (on a thread of the store's) or a drop (the crash handler, inline).
/// Threads are slow to start under AddressSanitizer, so most inputs drop.
fn end(session: pmo_store::Session, detach: bool) {
    if detach {
        let _ = session.detach().wait();
    }
}

fn read_all(s: &Store, pmo: &Pmo, allowed: Vec<usize>, detach: bool) {
    let Ok(r) = s.attach(pmo.name, Perm::Read, &key(pmo.key)) else {
        return;
    };
    let mut ok = Allowed { versions: allowed };
    for p in 0..pmo.npages {
        let mut out = [0x5au8; P];
        match r.fault(p, &mut out) {
            Ok(()) => ok.check(pmo, p, &out),
            Err(_) => assert!(out.iter().all(|b| *b == 0), "a failed fault left bytes"),
        }
    }
    end(r, detach);
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let g = golden();
    let mut inp = Input::new(data);
    let mid = inp.u8() & 1 == 1;
    let m = if mid { &g.mid_commit } else { &g.settled }.deep_clone();
    for _ in 0..1 + inp.below(6) {
        mutate(&m, g, &mut inp);
    }
    let medium: Arc<dyn Medium> = Arc::new(m.clone());
    let Ok((s, _report)) = Store::open(medium) else {
        return;
    };
    let _ = s.fsck();
    let detach = inp.u8() & 7 == 0;
    // One Argon2id run per attach: a wrong key is tried on one PMO in four inputs.
    if inp.u8() & 3 == 0 {
        let pmo = inp.pick(&g.pmos);
        assert!(
            s.attach(pmo.name, Perm::Read, &key(b"not-the-key"))
                .is_err(),
            "a wrong key attached {}",
            pmo.name
        );
    }
    for (i, pmo) in g.pmos.iter().enumerate() {
        let last = pmo.versions.len() - 1;
        // The image caught mid-commit holds two genuine states of "a": the commit (rolled
        // forward) and, in the record copy before it, the psync before.
        let allowed = if mid && i == 0 {
            vec![last - 1, last]
        } else if mid {
            vec![last]
        } else if i == 0 {
            vec![last - 1]
        } else {
            vec![last]
        };
        read_all(&s, pmo, allowed, detach);
    }
    // A psync through the edited store either fails or reads back.
    let pmo = inp.pick(&g.pmos);
    let p = inp.below(pmo.npages as usize) as u64;
    let fresh = page(0xe0 | inp.u8(), p);
    if let Ok(w) = s.attach(pmo.name, Perm::Write, &key(pmo.key)) {
        let synced = w.psync([(p, &fresh)]).is_ok();
        let _ = w.detach().wait();
        if synced {
            if let Ok(r) = s.attach(pmo.name, Perm::Read, &key(pmo.key)) {
                let mut out = [0u8; P];
                if r.fault(p, &mut out).is_ok() {
                    assert!(
                        out == fresh,
                        "PMO {} page {p}: psynced data not read back",
                        pmo.name
                    );
                }
                let _ = r.detach().wait();
            }
        }
    }
    // Destroy with the key, then nothing of it attaches.
    let pmo = inp.pick(&g.pmos);
    if s.destroy_pmo(pmo.name, &key(pmo.key)).is_ok() {
        assert!(matches!(
            s.attach(pmo.name, Perm::Read, &key(pmo.key)),
            Err(StoreError::NotFound(_))
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The golden images hold what the model says, and an empty program (no edit but the
    /// mandatory first, which an all-zero input makes a record-copy no-op) passes the oracle.
    #[test]
    fn golden_images_match_the_model_and_the_oracle_bites() {
        let g = golden();
        let (s, _) =
            Store::open(pmo_media::Backing::new(Arc::new(g.settled.deep_clone()))).unwrap();
        for pmo in &g.pmos {
            let r = s.attach(pmo.name, Perm::Read, &key(pmo.key)).unwrap();
            for p in 0..pmo.npages {
                let mut out = [0u8; P];
                r.fault(p, &mut out).unwrap();
                let want = if pmo.name == "a" {
                    &pmo.versions[pmo.versions.len() - 2]
                } else {
                    &pmo.versions[pmo.versions.len() - 1]
                };
                assert!(out == want[p as usize], "{} {p}", pmo.name);
            }
            r.detach().wait().unwrap();
        }
        let (s, rep) =
            Store::open(pmo_media::Backing::new(Arc::new(g.mid_commit.deep_clone()))).unwrap();
        assert_eq!(rep.actions.len(), 1, "{rep:?}");
        let a = &g.pmos[0];
        let r = s.attach("a", Perm::Read, &key(a.key)).unwrap();
        let mut out = [0u8; P];
        r.fault(5, &mut out).unwrap();
        assert!(out == a.versions[a.versions.len() - 1][5], "rolled forward");
        // The oracle rejects a page that no psync wrote.
        let mut allowed = Allowed {
            versions: vec![0, 1],
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            allowed.check(a, 0, &[0x77u8; P])
        }));
        assert!(r.is_err());
        run(&[]);
        run(&[1]);
    }
}
