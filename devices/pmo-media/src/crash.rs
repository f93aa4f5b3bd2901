//! A medium in DRAM that models what survives a power loss, for crash-injection tests.

use super::{check_range, Medium, MediumError};
use locked::Locked;
use std::sync::Mutex;

const LINE: u64 = 64;

/// What a crash does to writes that no persist covered yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Every unpersisted write is lost.
    DropAll,
    /// Each dirty 64-byte line independently survives or not, chosen by a seeded generator
    /// (real PM may have evicted some lines before the crash).
    Random(u64),
}

struct Inner {
    current: Vec<u8>,
    durable: Vec<u8>,
    dirty: Vec<bool>,
    persists: u64,
    crash_at: Option<u64>,
    crashed: bool,
}

/// DRAM medium with a durable image, the visible image, and an injectable crash point.
pub struct CrashMedium {
    inner: Mutex<Inner>,
    len: u64,
}

impl CrashMedium {
    /// A zeroed medium of `len` bytes.
    pub fn new(len: u64) -> Self {
        Self::from_image(vec![0u8; len as usize])
    }

    /// A medium whose durable and visible contents are `image` (e.g. a crash image).
    pub fn from_image(image: Vec<u8>) -> Self {
        let len = image.len() as u64;
        let lines = len.div_ceil(LINE) as usize;
        Self {
            inner: Mutex::new(Inner {
                current: image.clone(),
                durable: image,
                dirty: vec![false; lines],
                persists: 0,
                crash_at: None,
                crashed: false,
            }),
            len,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panicking test thread must not hide the image from the others.
        self.inner.locked()
    }

    /// Arms the crash: the `k`-th persist call from now (1-based) does not happen; the medium
    /// is crashed from then on and every operation fails.
    pub fn crash_at_persist(&self, k: u64) {
        let mut g = self.lock();
        g.crash_at = Some(g.persists + k);
    }

    /// Cancels an armed crash that has not fired.
    pub fn disarm(&self) {
        self.lock().crash_at = None;
    }

    /// Number of persist points executed so far.
    pub fn persist_count(&self) -> u64 {
        self.lock().persists
    }

    /// True once an armed crash fired.
    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// What a reboot would find: the durable image plus, in `Random` mode, a subset of the
    /// unpersisted lines.
    pub fn crash_image(&self, mode: CrashMode) -> Vec<u8> {
        let g = self.lock();
        let mut img = g.durable.clone();
        if let CrashMode::Random(seed) = mode {
            let mut s = seed | 1;
            for (i, d) in g.dirty.iter().enumerate() {
                if !d {
                    continue;
                }
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                if s & 1 == 1 {
                    let a = i * LINE as usize;
                    let b = (a + LINE as usize).min(img.len());
                    img[a..b].copy_from_slice(&g.current[a..b]);
                }
            }
        }
        img
    }

    /// The visible contents (what a running system reads).
    pub fn snapshot(&self) -> Vec<u8> {
        self.lock().current.clone()
    }

    /// Overwrites bytes both visibly and durably: an attacker editing the medium at rest.
    pub fn tamper(&self, off: u64, data: &[u8]) {
        let mut g = self.lock();
        let a = off as usize;
        g.current[a..a + data.len()].copy_from_slice(data);
        g.durable[a..a + data.len()].copy_from_slice(data);
    }
}

impl Medium for CrashMedium {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), MediumError> {
        check_range(self.len, off, buf.len() as u64)?;
        let g = self.lock();
        if g.crashed {
            return Err(MediumError::Crashed);
        }
        buf.copy_from_slice(&g.current[off as usize..off as usize + buf.len()]);
        Ok(())
    }

    fn write(&self, off: u64, data: &[u8]) -> Result<(), MediumError> {
        check_range(self.len, off, data.len() as u64)?;
        let mut g = self.lock();
        if g.crashed {
            return Err(MediumError::Crashed);
        }
        let a = off as usize;
        g.current[a..a + data.len()].copy_from_slice(data);
        if !data.is_empty() {
            let first = (off / LINE) as usize;
            let last = ((off + data.len() as u64 - 1) / LINE) as usize;
            for d in &mut g.dirty[first..=last] {
                *d = true;
            }
        }
        Ok(())
    }

    fn persist(&self, off: u64, len: u64) -> Result<(), MediumError> {
        check_range(self.len, off, len)?;
        let mut g = self.lock();
        if g.crashed {
            return Err(MediumError::Crashed);
        }
        g.persists += 1;
        if g.crash_at == Some(g.persists) {
            g.crashed = true;
            return Err(MediumError::Crashed);
        }
        if len == 0 {
            return Ok(());
        }
        // Whole lines are written back, as clflush would.
        let first = off / LINE;
        let last = (off + len - 1) / LINE;
        let g = &mut *g;
        for line in first..=last {
            if g.dirty[line as usize] {
                let a = (line * LINE) as usize;
                let b = (a + LINE as usize).min(g.current.len());
                g.durable[a..b].copy_from_slice(&g.current[a..b]);
                g.dirty[line as usize] = false;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpersisted_writes_are_lost_and_persisted_ones_kept() {
        let m = CrashMedium::new(4096);
        m.write(0, b"kept").unwrap();
        m.persist(0, 4).unwrap();
        m.write(100, b"lost").unwrap();
        let img = m.crash_image(CrashMode::DropAll);
        assert_eq!(&img[..4], b"kept");
        assert_eq!(&img[100..104], &[0; 4]);
    }

    #[test]
    fn armed_crash_stops_everything_at_the_kth_persist() {
        let m = CrashMedium::new(4096);
        m.crash_at_persist(2);
        m.write(0, b"a").unwrap();
        m.persist(0, 1).unwrap();
        m.write(1, b"b").unwrap();
        assert!(matches!(m.persist(0, 2), Err(MediumError::Crashed)));
        assert!(m.crashed());
        assert!(m.write(2, b"c").is_err());
        assert_eq!(&m.crash_image(CrashMode::DropAll)[..2], b"a\0");
    }

    #[test]
    fn out_of_range_is_an_error() {
        let m = CrashMedium::new(10);
        assert!(m.write(8, b"abc").is_err());
        assert!(m.read(u64::MAX, &mut [0u8; 2]).is_err());
    }
}
