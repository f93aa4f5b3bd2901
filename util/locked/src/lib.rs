//! One way to take a `std::sync` lock across the workspace.
//!
//! A poisoned lock means another thread panicked while holding it. Nothing in this project
//! leaves shared state half-updated across a panic point that a later holder could misread
//! (every invariant a lock guards is restored before code that can panic runs, and a panic
//! in a device thread already ends the VM), so every caller wants the guard either way.
//! Writing `lock().unwrap_or_else(|e| e.into_inner())` at each of 130 call sites said that
//! 130 times; these traits say it once.

use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Takes a mutex, recovering the guard if a panicking holder poisoned it.
pub trait Locked<T: ?Sized> {
    /// Blocks until the lock is held and returns its guard.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Takes a reader-writer lock, recovering the guard if a panicking holder poisoned it.
pub trait RwLocked<T: ?Sized> {
    /// Blocks until a shared (read) hold is granted.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// Blocks until the exclusive (write) hold is granted.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLocked<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// Waits on a condition variable, recovering the guard if the mutex was poisoned meanwhile.
pub trait Waited {
    /// Releases `guard`, sleeps until notified (or spuriously woken) and takes the lock again.
    fn wait_locked<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T>;
}

impl Waited for Condvar {
    fn wait_locked<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.wait(guard).unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_poisoned_mutex_still_yields_its_value() {
        let m = Arc::new(Mutex::new(7));
        let m2 = Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.locked(), 7);
    }

    #[test]
    fn a_poisoned_rwlock_still_yields_its_value() {
        let l = Arc::new(RwLock::new(3));
        let l2 = Arc::clone(&l);
        let _ = std::thread::spawn(move || {
            let _g = l2.write().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(l.is_poisoned());
        assert_eq!(*l.read_locked(), 3);
        *l.write_locked() = 4;
        assert_eq!(*l.read_locked(), 4);
    }
}
