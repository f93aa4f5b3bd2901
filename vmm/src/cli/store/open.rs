//! How a store command reaches its store: a store file, or the DPA space of the CXL expander
//! whose media file it is (keyed from a master key), and closing the expander cleanly after.

use std::path::Path;
use std::sync::Arc;

use cxl_t3::expander::{Expander, ExpanderConfig};
use cxl_t3::media::{Media, MediaError};
use pmo_crypto::RangeCipher;
use pmo_media::{Backing, FileMedium};
use pmo_store::{OpenOptions, RecoveryReport, Store};

use super::StoreCliError;
use crate::cxl::{keyed_store_medium, CxlError};

/// A store file and, optionally, its rollback anchor (`--anchor FILE`) and the keys of the
/// expander media it lives on (`--master-key FILE`).
#[derive(Debug, Clone, Copy)]
pub struct StoreFile<'a> {
    /// The store file, or the expander media file the store lives on.
    pub path: &'a Path,
    /// The anchor file: refuses a store older than it; created from the store if missing.
    pub anchor: Option<&'a Path>,
    /// The store lives on CXL expander media: how its extents are keyed.
    pub cxl: Option<CxlAccess<'a>>,
}

/// How the PMO extents of a store on expander media are keyed.
#[derive(Debug, Clone, Copy)]
pub struct CxlAccess<'a> {
    /// The master key file.
    pub master_key: &'a Path,
    /// The cipher of the TEE ranges.
    pub cipher: RangeCipher,
}

impl<'a> StoreFile<'a> {
    /// A store file without an anchor.
    pub fn plain(path: &'a Path) -> Self {
        Self {
            path,
            anchor: None,
            cxl: None,
        }
    }

    /// The device size if the file is expander media; refuses media without keys and keys
    /// without media.
    pub(super) fn media_size(&self) -> Result<Option<u64>, StoreCliError> {
        let size = match Media::probe(self.path) {
            Ok(size) => size,
            // A store file that does not exist yet is not media.
            Err(MediaError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                None
            }
            Err(source) => {
                return Err(StoreCliError::Media {
                    path: self.path.to_path_buf(),
                    source,
                })
            }
        };
        match (size, self.cxl) {
            (Some(_), None) => Err(StoreCliError::NeedsMasterKey(self.path.to_path_buf())),
            (None, Some(_)) => Err(StoreCliError::NotMedia(self.path.to_path_buf())),
            _ => Ok(size),
        }
    }

    /// The medium under the store: the file itself (created with `create_size` if given), or
    /// the keyed DPA space of the expander whose media the file is.
    pub(super) fn medium(&self, create_size: Option<u64>) -> Result<StoreMedium, StoreCliError> {
        match (self.media_size()?, self.cxl) {
            (Some(size), Some(keys)) => {
                // Host tools charge no media latency: they are not the modelled device.
                let cfg = ExpanderConfig {
                    media_latency_ns: 0,
                    ..ExpanderConfig::new(self.path, size)
                };
                let m = keyed_store_medium(&cfg, keys.master_key, keys.cipher)?;
                Ok(StoreMedium {
                    medium: m.medium,
                    expander: Some(OpenExpander(Some(m.expander))),
                    blank: m.blank,
                })
            }
            _ => {
                let (medium, blank): (Backing, bool) = match create_size {
                    Some(len) => (Arc::new(FileMedium::create(self.path, len)?).into(), true),
                    None => (Arc::new(FileMedium::open(self.path)?).into(), false),
                };
                Ok(StoreMedium {
                    medium,
                    expander: None,
                    blank,
                })
            }
        }
    }
}

/// What a store is opened on.
pub(super) struct StoreMedium {
    pub(super) medium: Backing,
    /// The expander whose media holds the store, if it is on one.
    pub(super) expander: Option<OpenExpander>,
    /// Nothing is on the medium yet: it may be formatted.
    pub(super) blank: bool,
}

/// An expander a host tool opened: flushed and marked clean when the tool is done with it.
pub(super) struct OpenExpander(Option<Arc<Expander>>);

impl OpenExpander {
    fn shut_down(&mut self) -> Result<(), StoreCliError> {
        match self.0.take() {
            Some(x) => x.shutdown().map_err(|source| {
                StoreCliError::Cxl(CxlError::Expander {
                    media: "store media".into(),
                    source,
                })
            }),
            None => Ok(()),
        }
    }
}

impl Drop for OpenExpander {
    fn drop(&mut self) {
        if let Err(e) = self.shut_down() {
            log::warn!("{e}");
        }
    }
}

/// An open store and, when it lives on expander media, that expander (shut down after the
/// store is dropped: fields drop in order).
pub(super) struct OpenStore {
    pub(super) store: Store,
    pub(super) expander: Option<OpenExpander>,
}

impl OpenStore {
    /// Drops the store, then shuts its expander down, reporting a failure to flush.
    pub(super) fn close(self) -> Result<(), StoreCliError> {
        let OpenStore { store, expander } = self;
        drop(store);
        match expander {
            Some(mut x) => x.shut_down(),
            None => Ok(()),
        }
    }
}

pub(super) fn open_store(f: StoreFile<'_>) -> Result<(OpenStore, RecoveryReport), StoreCliError> {
    let m = f.medium(None)?;
    let opts = OpenOptions {
        anchor: f.anchor.map(Path::to_path_buf),
        // A store file spans its file: a superblock that says otherwise was edited. On
        // expander media the store may leave the rest to design c's working area.
        len: m.expander.is_none().then(|| m.medium.medium().len()),
        ..OpenOptions::default()
    };
    let (store, rep) = Store::open_with(m.medium, &opts)?;
    Ok((
        OpenStore {
            store,
            expander: m.expander,
        },
        rep,
    ))
}
