//! [`Backing`]: what a store is opened on, the medium's bytes with what the medium offers beside
//! them, so that wrapping the bytes (a timing model, a test hook) cannot drop the rest.

use crate::{CrashMedium, ExtentKeys, FileMedium, KillInPsync, Medium, Part, TimedMedium};
use std::sync::Arc;

/// A medium as a store uses it: its bytes, the keys of the PMO extents it encrypts itself
/// (none for a file), and whether its reads wait for modelled device time.
#[derive(Clone)]
pub struct Backing {
    medium: Arc<dyn Medium>,
    extent_keys: Option<Arc<dyn ExtentKeys>>,
    reads_wait: bool,
}

impl Backing {
    /// Plain bytes: no extent keys, reads that do not wait.
    pub fn new(medium: Arc<dyn Medium>) -> Self {
        Self {
            medium,
            extent_keys: None,
            reads_wait: false,
        }
    }

    /// The same media whose PMO extents `keys` encrypts inline.
    pub fn with_extent_keys(self, keys: Arc<dyn ExtentKeys>) -> Self {
        Self {
            extent_keys: Some(keys),
            ..self
        }
    }

    /// The same media, whose reads may (`true`) wait for modelled device time (media behind a
    /// device cache) long enough that a fault thread should let another serve faults
    /// meanwhile. A scheduling hint for the pager; nothing depends on it for correctness.
    pub fn with_reads_wait(self, reads_wait: bool) -> Self {
        Self { reads_wait, ..self }
    }

    /// The same media with its bytes wrapped by `wrap` (a timing model, a test hook); the
    /// extent keys and the hint stay.
    pub fn map_medium(self, wrap: impl FnOnce(Arc<dyn Medium>) -> Arc<dyn Medium>) -> Self {
        Self {
            medium: wrap(self.medium),
            ..self
        }
    }

    /// The bytes.
    pub fn medium(&self) -> &Arc<dyn Medium> {
        &self.medium
    }

    /// The extent keys, if the medium encrypts PMO extents itself.
    pub fn extent_keys(&self) -> Option<&Arc<dyn ExtentKeys>> {
        self.extent_keys.as_ref()
    }

    /// See [`Backing::with_reads_wait`].
    pub fn reads_wait(&self) -> bool {
        self.reads_wait
    }
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backing")
            .field("len", &self.medium.len())
            .field("extent_keys", &self.extent_keys.is_some())
            .field("reads_wait", &self.reads_wait)
            .finish()
    }
}

/// Bytes alone: what any medium is once it is a `dyn Medium`.
impl From<Arc<dyn Medium>> for Backing {
    fn from(medium: Arc<dyn Medium>) -> Self {
        Self::new(medium)
    }
}

// The media of this crate are bytes alone and convert without ceremony. There is no blanket
// conversion from every `Arc<impl Medium>`: a medium that keys extents (the expander's
// `CxlMedium`) converts through its own `From`, which keeps its keys, and could not be passed
// as bytes alone by accident.
macro_rules! plain_media {
    ($($t:ty),* $(,)?) => {$(
        impl From<Arc<$t>> for Backing {
            fn from(medium: Arc<$t>) -> Self {
                Self::new(medium)
            }
        }
    )*};
}

plain_media!(FileMedium, CrashMedium);

macro_rules! plain_wrapper {
    ($($t:ident),* $(,)?) => {$(
        impl<M: Medium + 'static> From<Arc<$t<M>>> for Backing {
            fn from(medium: Arc<$t<M>>) -> Self {
                Self::new(medium)
            }
        }
    )*};
}

plain_wrapper!(Part, TimedMedium, KillInPsync);
