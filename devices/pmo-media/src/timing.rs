//! Latency models: [`charge`], the one wait every modelled device uses (the CXL expander's
//! media and device memory), and a PM timing model in the spirit of PMBD.
//!
//! PMBD emulated slower persistent memory by measuring how long a copy took on DRAM and then
//! stalling for (factor - 1) times as long. [`TimedMedium`] does the same around any medium. Off
//! by default: factors of 1.0 add nothing.

use super::{Medium, MediumError};
use std::cell::Cell;
use std::time::{Duration, Instant};

/// Latency waits up to this long are spun rather than slept.
pub const SPIN_LIMIT: Duration = Duration::from_micros(200);

thread_local! {
    static SLACK_SET: Cell<bool> = const { Cell::new(false) };
}

/// Waits until `latency` has passed since `start` (the transfer itself counts). Waits up to
/// [`SPIN_LIMIT`] are spun (a sleep cannot wake that precisely); longer ones sleep with the
/// thread's timer slack tightened to 1 µs and spin the last stretch.
pub fn charge(start: Instant, latency: Duration) {
    if latency.is_zero() {
        return;
    }
    let deadline = start + latency;
    let left = deadline.saturating_duration_since(Instant::now());
    if left > SPIN_LIMIT {
        if !SLACK_SET.with(|s| s.replace(true)) {
            // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack (ns).
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0) };
        }
        std::thread::sleep(left - SPIN_LIMIT / 2);
    }
    while Instant::now() < deadline {
        std::hint::spin_loop();
    }
}

/// Read and write slowdown factors relative to the wrapped medium (1.0 = no slowdown).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PmTiming {
    /// Multiplier on the time spent reading.
    pub read_factor: f64,
    /// Multiplier on the time spent writing.
    pub write_factor: f64,
}

impl Default for PmTiming {
    fn default() -> Self {
        Self {
            read_factor: 1.0,
            write_factor: 1.0,
        }
    }
}

/// Wraps a medium and stalls after each copy so that it appears `factor` times slower.
pub struct TimedMedium<M> {
    inner: M,
    timing: PmTiming,
}

impl<M: Medium> TimedMedium<M> {
    /// Wraps `inner` with the given factors.
    pub fn new(inner: M, timing: PmTiming) -> Self {
        Self { inner, timing }
    }

    fn stall(elapsed: Duration, factor: f64) {
        if factor <= 1.0 || !factor.is_finite() {
            return;
        }
        charge(Instant::now(), elapsed.mul_f64(factor - 1.0));
    }
}

impl<M: Medium> Medium for TimedMedium<M> {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), MediumError> {
        let t = Instant::now();
        let r = self.inner.read(off, buf);
        Self::stall(t.elapsed(), self.timing.read_factor);
        r
    }
    fn write(&self, off: u64, data: &[u8]) -> Result<(), MediumError> {
        let t = Instant::now();
        let r = self.inner.write(off, data);
        Self::stall(t.elapsed(), self.timing.write_factor);
        r
    }
    fn persist(&self, off: u64, len: u64) -> Result<(), MediumError> {
        self.inner.persist(off, len)
    }
    fn zero(&self, off: u64, len: u64) -> Result<(), MediumError> {
        self.inner.zero(off, len)
    }
    fn zero_in_place(&self, off: u64, len: u64) -> Result<(), MediumError> {
        self.inner.zero_in_place(off, len)
    }
    // No `as_ptr`: direct access would bypass the timing model.
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CrashMedium;

    #[test]
    fn timed_medium_is_transparent_for_data() {
        let m = TimedMedium::new(
            CrashMedium::new(4096),
            PmTiming {
                read_factor: 3.0,
                write_factor: 5.0,
            },
        );
        m.write(10, b"abc").unwrap();
        let mut b = [0u8; 3];
        m.read(10, &mut b).unwrap();
        assert_eq!(&b, b"abc");
        assert_eq!(m.len(), 4096);
    }
}
