//! LIST: the catalog one entry at a time, from a snapshot rebuilt only when a create or a
//! destroy changed the catalog, so a caller listing n PMOs one index at a time costs n
//! lookups, not n sorted copies of the catalog.

use std::sync::{Arc, Mutex};

use locked::Locked;
use pmo_store::Store;

/// Who holds a listed PMO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Listed {
    /// Nobody.
    Detached,
    /// Readers only.
    Readers,
    /// A writer.
    Writer,
}

/// One catalog entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    /// The PMO's name.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Who holds it.
    pub attached: Listed,
    /// An entry at the next index exists.
    pub more: bool,
}

/// PMO names and sizes in name order, and the catalog version they are of.
struct Snapshot {
    version: u64,
    entries: Arc<Vec<(String, u64)>>,
}

/// The snapshot LIST walks.
#[derive(Default)]
pub(super) struct ListCache(Mutex<Option<Snapshot>>);

impl ListCache {
    /// The catalog as LIST sees it: rebuilt only when a create or destroy changed it.
    pub fn entries(&self, store: &Store) -> Arc<Vec<(String, u64)>> {
        // Read the version first: a change racing the rebuild leaves a snapshot tagged older
        // than its contents, which only costs one more rebuild.
        let version = store.catalog_version();
        let mut snap = self.0.locked();
        if let Some(s) = snap.as_ref().filter(|s| s.version == version) {
            return s.entries.clone();
        }
        let entries: Arc<Vec<(String, u64)>> =
            Arc::new(store.list().into_iter().map(|i| (i.name, i.size)).collect());
        *snap = Some(Snapshot {
            version,
            entries: entries.clone(),
        });
        entries
    }
}
