//! Helpers shared by the targets: a cursor that turns fuzz bytes into
//! choices, a seeded PRNG for the stable loops, and scratch directories.

use locked::Locked;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Reads choices from the fuzz input. Past the end every read is 0, so any
/// input (even an empty one) is a complete program: libFuzzer mutations that
/// cut an input short still run to the end instead of being rejected.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// Reads from `data`; past its end every value is zero.
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    /// Every byte has been taken.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next byte.
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    /// The next two bytes, little endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// The next four bytes, little endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// The next eight bytes, little endian.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// The low bit of the next byte.
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        debug_assert!(n > 0);
        if n <= 256 {
            usize::from(self.u8()) % n
        } else {
            self.u32() as usize % n
        }
    }

    /// One of `items` (not empty).
    pub fn pick<'b, T>(&mut self, items: &'b [T]) -> &'b T {
        &items[self.below(items.len())]
    }

    /// Up to `max` bytes, length first (zero-filled past the end of input).
    pub fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max + 1);
        let take = n.min(self.data.len());
        let (head, rest) = self.data.split_at(take);
        self.data = rest;
        let mut v = head.to_vec();
        v.resize(n, 0);
        v
    }
}

/// A small deterministic PRNG (SplitMix64) for the stable loops: the same
/// seed gives the same inputs on every machine, so a failure reproduces.
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence is fixed by `seed` (SplitMix64).
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next value of the sequence.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// An input of 0..`max_len` random bytes.
    pub fn input(&mut self, max_len: usize) -> Vec<u8> {
        let n = (self.next_u64() % (max_len as u64 + 1)) as usize;
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// A scratch directory removed when dropped. It lives in `/dev/shm` when
/// that exists (a tmpfs: store files and `fdatasync` cost no disk I/O, which
/// keeps executions per second up), else in the system temp dir.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// A fresh, empty directory whose name carries `tag`, the process id and a counter.
    pub fn new(tag: &str) -> std::io::Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!(
            "pmo-fuzz-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(ScratchDir(dir))
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Held by every input that builds a PMO service, so inputs of two such
/// targets never overlap (cargo test runs the loops on parallel threads)
/// and [`wait_threads_gone`] waits only for the threads of its own input.
pub fn service_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.locked()
}

/// How long background work started by an input may run on after it.
pub const BACKGROUND_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until no thread of this process has a name starting with `prefix`
/// (as `/proc/self/task/*/comm` shows it, 15 bytes at most); panics after
/// [`BACKGROUND_DEADLINE`]. The PMO service leaves threads that nobody
/// joins: the store finishes a detach on `pmo-detach-N`, and the pager's
/// `pmo-fault*` / `pmo-prefetch` threads are not joined when the last
/// owner of the pager is one of them. Waiting for every `pmo-` thread keeps
/// each input self-contained (no work of one input running into the next,
/// no exiting thread that LeakSanitizer sees half gone) and makes one that
/// never ends a failure instead of a silent straggler.
pub fn wait_threads_gone(prefix: &str) {
    let start = std::time::Instant::now();
    loop {
        let alive = std::fs::read_dir("/proc/self/task")
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
                    .any(|comm| comm.starts_with(prefix))
            })
            .unwrap_or(false);
        if !alive {
            return;
        }
        assert!(
            start.elapsed() < BACKGROUND_DEADLINE,
            "a {prefix}* thread still runs {BACKGROUND_DEADLINE:?} after the input"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_reads_zero_past_the_end() {
        let mut i = Input::new(&[1, 2, 3]);
        assert_eq!(i.u16(), 0x0201);
        assert_eq!(i.u32(), 3);
        assert_eq!(i.u64(), 0);
        assert!(i.is_empty());
        assert_eq!(i.bytes(10), Vec::<u8>::new());
    }

    #[test]
    fn waits_for_a_named_thread() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("fuzz-wait-test".into())
            .spawn(move || rx.recv())
            .expect("thread");
        // The thread names itself once it runs.
        let start = std::time::Instant::now();
        while !std::fs::read_dir("/proc/self/task")
            .expect("proc")
            .filter_map(|e| e.ok())
            .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
            .any(|c| c.starts_with("fuzz-wait-test"))
        {
            assert!(start.elapsed() < BACKGROUND_DEADLINE, "thread never named");
            std::thread::yield_now();
        }
        drop(tx);
        wait_threads_gone("fuzz-wait-test");
        t.join().expect("join").ok();
    }

    #[test]
    fn rng_is_deterministic() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let mut r = Rng::new(7);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        assert_ne!(a[0], a[1]);
    }
}
