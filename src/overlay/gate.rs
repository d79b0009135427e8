//! The write gate: every mutating operation holds it shared for its whole
//! duration; a pause holds it exclusively. Taking the pause waits for the
//! mutations in flight to finish and keeps new ones out until the pause
//! guard is dropped, so whoever holds it sees an upper that does not
//! change under it (a snapshot, a reset). Readers never touch the gate.
//!
//! Invariant relied on: a mutation takes the gate once, at its top level,
//! never again while holding it (a nested shared take could wait behind a
//! waiting pause that waits for the outer take: a deadlock).

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

#[derive(Default)]
pub struct WriteGate {
    lock: RwLock<()>,
}

/// Held by one mutating operation while it runs.
pub struct Pass<'a> {
    _guard: RwLockReadGuard<'a, ()>,
}

/// Held while writes are paused; dropping it lets them continue.
pub struct PauseGuard<'a> {
    _guard: RwLockWriteGuard<'a, ()>,
}

impl WriteGate {
    /// Enters without waiting: `None` while a pause is held or waiting for
    /// the mutations in flight (the caller then waits elsewhere).
    pub fn try_enter(&self) -> Option<Pass<'_>> {
        self.lock.try_read().map(|g| Pass { _guard: g })
    }

    /// Enters, waiting as long as writes are paused.
    pub fn enter(&self) -> Pass<'_> {
        Pass {
            _guard: self.lock.read(),
        }
    }

    /// Pauses mutations: waits for those in flight, then keeps new ones
    /// out until the guard is dropped.
    pub fn pause(&self) -> PauseGuard<'_> {
        PauseGuard {
            _guard: self.lock.write(),
        }
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
