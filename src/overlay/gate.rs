//! The write gate: every mutating operation holds it shared for its whole
//! duration; a pause holds it exclusively. Taking the pause waits for the
//! mutations in flight to finish and keeps new ones out until the pause
//! guard is dropped, so whoever holds it sees an upper that does not
//! change under it (a snapshot, a reset). Readers never touch the gate.
//!
//! Invariant relied on: a mutation takes the gate once, at its top level,
//! never again while holding it (a nested shared take could wait behind a
//! waiting pause that waits for the outer take: a deadlock).

//!
//! The gate also counts mutations: `epoch` grows when each one ends (and
//! when the policy changes, `bump`). Whatever was computed from the
//! tree at epoch E is what a request would compute anew as long as the
//! epoch is still E (a shared directory listing relies on this).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

#[derive(Default)]
pub struct WriteGate {
    lock: RwLock<()>,
    epoch: AtomicU64,
}

/// Held by one mutating operation while it runs.
pub struct Pass<'a> {
    _guard: RwLockReadGuard<'a, ()>,
    epoch: &'a AtomicU64,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
}

/// Held while writes are paused; dropping it lets them continue.
pub struct PauseGuard<'a> {
    _guard: RwLockWriteGuard<'a, ()>,
}

impl WriteGate {
    /// Enters without waiting: `None` while a pause is held or waiting for
    /// the mutations in flight (the caller then waits elsewhere).
    pub fn try_enter(&self) -> Option<Pass<'_>> {
        self.lock.try_read().map(|g| Pass {
            _guard: g,
            epoch: &self.epoch,
        })
    }

    /// Enters, waiting as long as writes are paused.
    pub fn enter(&self) -> Pass<'_> {
        Pass {
            _guard: self.lock.read(),
            epoch: &self.epoch,
        }
    }

    /// Pauses mutations: waits for those in flight, then keeps new ones
    /// out until the guard is dropped.
    pub fn pause(&self) -> PauseGuard<'_> {
        PauseGuard {
            _guard: self.lock.write(),
        }
    }

    /// How many mutations have ended (see the module comment).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Counts a change that is not a mutating request (a policy swap).
    pub fn bump(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether a pause is held (or being taken).
    pub fn paused(&self) -> bool {
        self.lock.is_locked_exclusive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pause_keeps_writers_out_until_dropped() {
        let g = WriteGate::default();
        {
            let _p = g.try_enter().expect("free gate");
            assert!(g.try_enter().is_some(), "writers share the gate");
        }
        let pause = g.pause();
        assert!(g.paused());
        assert!(g.try_enter().is_none());
        drop(pause);
        assert!(!g.paused());
        assert!(g.try_enter().is_some());
    }
}
