//! The per-PMO Merkle tree over page metadata.
//!
//! Leaves are the per-page metadata entries (version, generation, tag), 40 bytes each, stored in the PMO's
//! metadata region; interior levels hold 32-byte BLAKE3 hashes of 64-entry groups of the level
//! below; the top hash is the root, kept in the PMO record under a keyed MAC. So every page's
//! version and tag are authenticated by the key: swapping pages, editing a tag or rolling a page
//! back with its old tag all change a hash on the path to the root.
//!
//! An all-zero group hashes to all zeros, so a fresh (sparse) PMO needs no tree writes and an
//! unwritten page is simply a zero leaf (version 0 = reads as zeros). Forging a zero hash for a
//! non-zero group would need a BLAKE3 preimage.
//!
//! Verification is lazy: a fault verifies its leaf group and the groups above it up to the first
//! one already verified in this session ([`TreeCache`]); a psync updates only the groups on the
//! dirty pages' paths, so it costs O(dirty · log n), not O(PMO size).

use locked::{Locked, RwLocked};
use pmo_crypto::{KeyGen, Tag};
use pmo_media::{Medium, MediumError};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

/// Children per interior node.
pub const ARITY: u64 = 64;
/// Bytes of a leaf: version (u64) + generation (16) + tag (16).
pub const LEAF: usize = 40;
/// Bytes of an interior entry.
pub const NODE: usize = 32;

/// Tree errors.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// A group does not hash to what its parent (or the root) says.
    #[error("page metadata failed authentication (level {level}, group {group})")]
    Mismatch {
        /// Level of the group.
        level: usize,
        /// Group index.
        group: u64,
    },
    /// The medium failed.
    #[error(transparent)]
    Medium(#[from] MediumError),
}

/// Shape of the tree of a PMO with `npages` pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeLayout {
    counts: Vec<u64>,
    offs: Vec<u64>,
    size: u64,
}

impl TreeLayout {
    /// Layout for `npages` (>= 1) pages.
    pub fn new(npages: u64) -> Self {
        let mut counts = vec![npages.max(1)];
        loop {
            let n = counts[counts.len() - 1].div_ceil(ARITY);
            counts.push(n);
            if n == 1 {
                break;
            }
        }
        // counts[T] == 1 is the root, not stored; levels 0..T are stored.
        let mut offs = Vec::new();
        let mut at = 0u64;
        for (k, &c) in counts[..counts.len() - 1].iter().enumerate() {
            offs.push(at);
            at += c * entry_size(k) as u64;
        }
        Self {
            counts,
            offs,
            size: at.div_ceil(4096) * 4096,
        }
    }
    /// Index of the root level (T).
    pub fn top(&self) -> usize {
        self.counts.len() - 1
    }
    /// Bytes of the stored levels (page aligned).
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Number of groups at level `k` (k < T).
    pub fn groups(&self, k: usize) -> u64 {
        self.counts[k].div_ceil(ARITY)
    }
    /// Total number of groups over all stored levels.
    pub fn total_groups(&self) -> u64 {
        (0..self.top()).map(|k| self.groups(k)).sum()
    }
    /// (offset inside the metadata region, length) of group `g` of level `k`.
    pub fn group_range(&self, k: usize, g: u64) -> (u64, usize) {
        let first = g * ARITY;
        let n = (self.counts[k] - first).min(ARITY);
        let es = entry_size(k);
        (self.offs[k] + first * es as u64, n as usize * es)
    }
}

/// Entry size at level `k`.
pub fn entry_size(k: usize) -> usize {
    if k == 0 {
        LEAF
    } else {
        NODE
    }
}

/// Hash of group `g` of level `k` (the entry `g` of level `k + 1`).
pub fn group_hash(k: usize, g: u64, bytes: &[u8]) -> [u8; 32] {
    if bytes.iter().all(|b| *b == 0) {
        return [0u8; 32];
    }
    let mut h = blake3::Hasher::new();
    h.update(b"pmo tree");
    h.update(&(k as u64).to_le_bytes());
    h.update(&g.to_le_bytes());
    h.update(bytes);
    *h.finalize().as_bytes()
}

/// A leaf entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leaf {
    /// Page version (psync epoch); 0 = never written.
    pub version: u64,
    /// Generation of the session that sealed this version: selects its cipher key.
    pub gen: KeyGen,
    /// Page tag.
    pub tag: Tag,
}

impl Leaf {
    /// Encodes the leaf.
    pub fn encode(&self) -> [u8; LEAF] {
        let mut b = [0u8; LEAF];
        b[..8].copy_from_slice(&self.version.to_le_bytes());
        b[8..24].copy_from_slice(&self.gen);
        b[24..].copy_from_slice(&self.tag);
        b
    }
    /// Decodes a leaf (any 40 bytes are a leaf; authenticity comes from the tree).
    pub fn decode(b: &[u8]) -> Self {
        let mut v = [0u8; 8];
        let mut gen = [0u8; 16];
        let mut tag = [0u8; 16];
        if b.len() >= LEAF {
            v.copy_from_slice(&b[..8]);
            gen.copy_from_slice(&b[8..24]);
            tag.copy_from_slice(&b[24..LEAF]);
        }
        Self {
            version: u64::from_le_bytes(v),
            gen,
            tag,
        }
    }
}

type GroupMap = HashMap<(usize, u64), Arc<Vec<u8>>>;

/// The leaf group a run of lookups used last ([`TreeCache::leaf_at`]). Valid while the tree
/// does not change, i.e. within one fault run (psync applies under the session's exclusive
/// I/O lock, which the run holds shared).
#[derive(Default)]
pub struct GroupCursor(Option<(u64, Arc<Vec<u8>>)>);

/// Groups already verified in this session, and the trusted root: a fault re-verifies only up to
/// the first cached ancestor, so steady-state faults cost no hashing beyond the page tag.
pub struct TreeCache {
    groups: RwLock<GroupMap>,
    root: Mutex<[u8; 32]>,
}

/// New groups and root computed for a psync, applied to the cache only after it commits.
pub struct TreeUpdate {
    /// (level, group) -> new bytes.
    pub groups: BTreeMap<(usize, u64), Vec<u8>>,
    /// New root.
    pub root: [u8; 32],
}

impl TreeCache {
    /// A cache trusting `root` (checked against its MAC by the caller).
    pub fn new(root: [u8; 32]) -> Self {
        Self {
            groups: RwLock::new(HashMap::new()),
            root: Mutex::new(root),
        }
    }

    fn lock_groups(&self) -> std::sync::RwLockWriteGuard<'_, GroupMap> {
        self.groups.write_locked()
    }

    /// The trusted root.
    pub fn root(&self) -> [u8; 32] {
        *self.root.locked()
    }

    /// Returns group `g` of level `k`, verified up to the root.
    pub fn group(
        &self,
        layout: &TreeLayout,
        m: &dyn Medium,
        meta_off: u64,
        k: usize,
        g: u64,
    ) -> Result<Arc<Vec<u8>>, TreeError> {
        if let Some(x) = self.groups.read_locked().get(&(k, g)) {
            return Ok(x.clone());
        }
        let (off, len) = layout.group_range(k, g);
        let mut bytes = vec![0u8; len];
        m.read(meta_off + off, &mut bytes)?;
        let h = group_hash(k, g, &bytes);
        let expected = if k + 1 == layout.top() {
            self.root()
        } else {
            let parent = self.group(layout, m, meta_off, k + 1, g / ARITY)?;
            let i = (g % ARITY) as usize * NODE;
            let mut e = [0u8; 32];
            e.copy_from_slice(&parent[i..i + NODE]);
            e
        };
        if h != expected {
            return Err(TreeError::Mismatch { level: k, group: g });
        }
        let arc = Arc::new(bytes);
        self.lock_groups().insert((k, g), arc.clone());
        Ok(arc)
    }

    /// The verified leaf of `page`.
    pub fn leaf(
        &self,
        layout: &TreeLayout,
        m: &dyn Medium,
        meta_off: u64,
        page: u64,
    ) -> Result<Leaf, TreeError> {
        self.leaf_at(layout, m, meta_off, page, &mut GroupCursor::default())
    }

    /// The verified leaf of `page`, through `cursor`: lookups of pages in the group the
    /// cursor holds take neither the cache's lock nor a reference count, so a run of
    /// consecutive pages costs one cache lookup per group.
    pub fn leaf_at(
        &self,
        layout: &TreeLayout,
        m: &dyn Medium,
        meta_off: u64,
        page: u64,
        cursor: &mut GroupCursor,
    ) -> Result<Leaf, TreeError> {
        let g = page / ARITY;
        let i = (page % ARITY) as usize * LEAF;
        match &cursor.0 {
            Some((held, bytes)) if *held == g => Ok(Leaf::decode(&bytes[i..i + LEAF])),
            _ => {
                let bytes = self.group(layout, m, meta_off, 0, g)?;
                let leaf = Leaf::decode(&bytes[i..i + LEAF]);
                cursor.0 = Some((g, bytes));
                Ok(leaf)
            }
        }
    }

    /// Computes the groups and root after replacing the given leaves. Reads only verified data.
    pub fn plan(
        &self,
        layout: &TreeLayout,
        m: &dyn Medium,
        meta_off: u64,
        leaves: &BTreeMap<u64, Leaf>,
    ) -> Result<TreeUpdate, TreeError> {
        let mut touched: BTreeMap<(usize, u64), Vec<u8>> = BTreeMap::new();
        for (&p, leaf) in leaves {
            let g = p / ARITY;
            if let std::collections::btree_map::Entry::Vacant(e) = touched.entry((0, g)) {
                e.insert(self.group(layout, m, meta_off, 0, g)?.to_vec());
            }
            if let Some(grp) = touched.get_mut(&(0, g)) {
                let i = (p % ARITY) as usize * LEAF;
                grp[i..i + LEAF].copy_from_slice(&leaf.encode());
            }
        }
        let mut root = self.root();
        for k in 0..layout.top() {
            let keys: Vec<u64> = touched
                .range((k, 0)..(k + 1, 0))
                .map(|(&(_, g), _)| g)
                .collect();
            for g in keys {
                let h = match touched.get(&(k, g)) {
                    Some(b) => group_hash(k, g, b),
                    None => continue,
                };
                if k + 1 == layout.top() {
                    root = h;
                    continue;
                }
                let pg = g / ARITY;
                if let std::collections::btree_map::Entry::Vacant(e) = touched.entry((k + 1, pg)) {
                    e.insert(self.group(layout, m, meta_off, k + 1, pg)?.to_vec());
                }
                if let Some(parent) = touched.get_mut(&(k + 1, pg)) {
                    let i = (g % ARITY) as usize * NODE;
                    parent[i..i + NODE].copy_from_slice(&h);
                }
            }
        }
        Ok(TreeUpdate {
            groups: touched,
            root,
        })
    }

    /// Installs a committed update.
    pub fn apply(&self, up: &TreeUpdate) {
        let mut g = self.lock_groups();
        for (k, v) in &up.groups {
            g.insert(*k, Arc::new(v.clone()));
        }
        drop(g);
        *self.root.locked() = up.root;
    }

    /// Verifies every stored group against the root (keyless structural check; O(size)).
    pub fn verify_all(
        &self,
        layout: &TreeLayout,
        m: &dyn Medium,
        meta_off: u64,
    ) -> Result<(), TreeError> {
        for k in (0..layout.top()).rev() {
            for g in 0..layout.groups(k) {
                self.group(layout, m, meta_off, k, g)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmo_media::CrashMedium;

    #[test]
    fn layout_shapes() {
        let l = TreeLayout::new(1);
        assert_eq!(l.top(), 1);
        let l = TreeLayout::new(64 * 64 + 1);
        assert_eq!(l.top(), 3);
        assert_eq!(l.groups(0), 65);
        let big = TreeLayout::new(16 << 20); // 64 GiB
        assert_eq!(big.top(), 4);
        assert!(big.size() < (16u64 << 20) * 41);
    }

    #[test]
    fn update_then_verify_and_detect_rollback() {
        let layout = TreeLayout::new(5000);
        let m = CrashMedium::new(layout.size());
        let c = TreeCache::new([0; 32]);
        let mut leaves = BTreeMap::new();
        leaves.insert(
            7u64,
            Leaf {
                version: 1,
                gen: [1; 16],
                tag: [9; 16],
            },
        );
        leaves.insert(
            4999u64,
            Leaf {
                version: 1,
                gen: [1; 16],
                tag: [8; 16],
            },
        );
        let up = c.plan(&layout, &m, 0, &leaves).unwrap();
        for ((k, g), b) in &up.groups {
            m.write(layout.group_range(*k, *g).0, b).unwrap();
        }
        let old_leaf7 = {
            let mut b = [0u8; LEAF];
            m.read(layout.group_range(0, 0).0 + 7 * LEAF as u64, &mut b)
                .unwrap();
            b
        };
        let fresh = TreeCache::new(up.root);
        assert_eq!(fresh.leaf(&layout, &m, 0, 7).unwrap().version, 1);
        fresh.verify_all(&layout, &m, 0).unwrap();
        // second version of page 7, then roll the leaf back
        let mut l2 = BTreeMap::new();
        l2.insert(
            7u64,
            Leaf {
                version: 2,
                gen: [2; 16],
                tag: [1; 16],
            },
        );
        let up2 = fresh.plan(&layout, &m, 0, &l2).unwrap();
        for ((k, g), b) in &up2.groups {
            m.write(layout.group_range(*k, *g).0, b).unwrap();
        }
        m.write(layout.group_range(0, 0).0 + 7 * LEAF as u64, &old_leaf7)
            .unwrap();
        let after = TreeCache::new(up2.root);
        assert!(matches!(
            after.leaf(&layout, &m, 0, 7),
            Err(TreeError::Mismatch { .. })
        ));
    }
}
