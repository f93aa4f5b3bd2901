//! The PMO store's [`Medium`] over an expander, so a store (PMO designs C,
//! CL, CF) can live on CXL memory: reads and writes go through the device
//! cache on the host path, `persist` writes the covered dirty blocks back
//! to media and `fdatasync`s it.

use std::sync::Arc;

use pmo_virtio::medium::{check_range, Medium, MediumError};

use super::{Expander, ExpanderError};

/// A window `[base, base+len)` of an expander's DPA space as a medium.
#[derive(Debug, Clone)]
pub struct CxlMedium {
    exp: Arc<Expander>,
    base: u64,
    len: u64,
}

impl CxlMedium {
    /// The whole DPA space.
    pub fn new(exp: Arc<Expander>) -> Self {
        let len = exp.size();
        Self { exp, base: 0, len }
    }

    /// A part of the DPA space (e.g. one keyed range).
    pub fn window(exp: Arc<Expander>, base: u64, len: u64) -> Result<Self, MediumError> {
        check_range(exp.size(), base, len)?;
        Ok(Self { exp, base, len })
    }

    /// The expander underneath.
    pub fn expander(&self) -> &Arc<Expander> {
        &self.exp
    }
}

fn to_medium(what: &'static str, e: ExpanderError) -> MediumError {
    MediumError::Io {
        what,
        source: std::io::Error::other(e.to_string()),
    }
}

impl Medium for CxlMedium {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), MediumError> {
        check_range(self.len, off, buf.len() as u64)?;
        self.exp
            .read(self.base + off, buf)
            .map_err(|e| to_medium("cxl read", e))
    }

    fn write(&self, off: u64, data: &[u8]) -> Result<(), MediumError> {
        check_range(self.len, off, data.len() as u64)?;
        self.exp
            .write(self.base + off, data)
            .map_err(|e| to_medium("cxl write", e))
    }

    fn persist(&self, off: u64, len: u64) -> Result<(), MediumError> {
        check_range(self.len, off, len)?;
        self.exp
            .persist(self.base + off, len)
            .map_err(|e| to_medium("cxl persist", e))
    }
}
