//! Fair shares of the daemon's fds for open files, on a mount other users
//! share (`--allow-other`).
//!
//! Every open file handle keeps one fd open in the daemon (see
//! `overlay::file` for why a handle keeps its own), so without a bound one
//! caller holding files open could take every fd the daemon may have and
//! make every other caller's `cat`, `ls` or create fail with `EMFILE`.
//! Handles may hold together the handle pool of the daemon's fd budget
//! (`layer::fds::handle_pool`), split so:
//!
//! - the **mount owner** — the daemon's user, root, and the user owning the
//!   upper directory — may use the whole pool;
//! - **every other uid** may hold at most a quarter of it, and all other
//!   uids together at most half: whatever they do, the owner keeps half
//!   the pool, and no single other user can fill the others' half.
//!
//! An open beyond its caller's share is answered `EMFILE`, to that caller
//! only (the open(2) error for "too many files open"), before anything is
//! changed. A share is taken before the fd is opened and given back when
//! the handle's fd is closed (`Charge` drops with the handle), so the
//! count is the number of fds the handles hold.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Errno, Result};
use crate::layer::fds;

/// What one uid holds and was refused.
#[derive(Default, Clone, Copy, Debug)]
struct Held {
    open: usize,
    refused: u64,
}

#[derive(Default)]
struct State {
    by_uid: HashMap<u32, Held>,
    /// Handles of owner uids, and of every other uid, together.
    owners: usize,
    others: usize,
}

/// The shares of one mount.
pub struct Shares {
    owners: Vec<u32>,
    st: Mutex<State>,
}

/// One fd of the handle pool, taken by `uid`; given back when dropped.
pub struct Charge {
    shares: Arc<Shares>,
    uid: u32,
}

impl Charge {
    pub fn uid(&self) -> u32 {
        self.uid
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.shares.give_back(self.uid);
    }
}

/// Open file handles per uid as `status` reports them
/// (`Shares::report`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Report {
    pub open: usize,
    /// The uids that count as the mount owner.
    pub owners: Vec<u32>,
    pub owner_limit: usize,
    pub others_limit: usize,
    pub per_user_limit: usize,
    pub by_uid: Vec<UidShare>,
}

/// One uid's open handles and refusals.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct UidShare {
    pub uid: u32,
    pub owner: bool,
    pub open: usize,
    pub refused: u64,
}

/// The limits in force now, from the current fd limit.
struct Limits {
    pool: usize,
    others: usize,
    per_other: usize,
}

fn limits() -> Limits {
    let pool = fds::handle_pool();
    Limits {
        pool,
        others: pool / 2,
        per_other: pool / 4,
    }
}

impl Shares {
    /// `owners`: the uids that count as the mount owner (root is always
    /// one).
    pub fn new(mut owners: Vec<u32>) -> Arc<Shares> {
        owners.push(0);
        owners.sort_unstable();
        owners.dedup();
        Arc::new(Shares {
            owners,
            st: Mutex::new(State::default()),
        })
    }

    pub fn is_owner(&self, uid: u32) -> bool {
        self.owners.contains(&uid)
    }

    /// Takes one fd of `uid`'s share, or `EMFILE` when it is used up.
    pub fn charge(self: &Arc<Self>, uid: u32) -> Result<Charge> {
        let lim = limits();
        let owner = self.is_owner(uid);
        let mut st = self.st.lock();
        let mine = st.by_uid.get(&uid).map_or(0, |h| h.open);
        let fits = if owner {
            st.owners + st.others < lim.pool
        } else {
            mine < lim.per_other && st.others < lim.others && st.owners + st.others < lim.pool
        };
        let held = st.by_uid.entry(uid).or_default();
        if !fits {
            held.refused += 1;
            let first = held.refused == 1;
            drop(st);
            // Once per uid at warn level: a caller looping on EMFILE must
            // not flood the log.
            if first {
                tracing::warn!(
                    uid,
                    open = mine,
                    limit = if owner { lim.pool } else { lim.per_other },
                    "open refused with EMFILE: this user holds its share of the daemon's \
                     descriptors (see `layerfs status`)"
                );
            } else {
                tracing::debug!(uid, open = mine, "open refused with EMFILE");
            }
            return Err(Errno(libc::EMFILE));
        }
        held.open += 1;
        if owner {
            st.owners += 1;
        } else {
            st.others += 1;
        }
        Ok(Charge {
            shares: self.clone(),
            uid,
        })
    }

    fn give_back(&self, uid: u32) {
        let owner = self.is_owner(uid);
        let mut st = self.st.lock();
        if let Some(h) = st.by_uid.get_mut(&uid) {
            h.open = h.open.saturating_sub(1);
            if h.open == 0 && h.refused == 0 {
                st.by_uid.remove(&uid);
            }
        }
        if owner {
            st.owners = st.owners.saturating_sub(1);
        } else {
            st.others = st.others.saturating_sub(1);
        }
    }

    /// Open handles per uid, with each uid's limit and refusals, for
    /// `status`.
    pub fn report(&self) -> Report {
        let lim = limits();
        let st = self.st.lock();
        let mut uids: Vec<(&u32, &Held)> = st.by_uid.iter().collect();
        uids.sort_by_key(|(u, _)| **u);
        Report {
            open: st.owners + st.others,
            owners: self.owners.clone(),
            owner_limit: lim.pool,
            others_limit: lim.others,
            per_user_limit: lim.per_other,
            by_uid: uids
                .into_iter()
                .map(|(uid, h)| UidShare {
                    uid: *uid,
                    owner: self.is_owner(*uid),
                    open: h.open,
                    refused: h.refused,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn others_are_bounded_and_the_owner_keeps_half_the_pool() {
        let s = Shares::new(vec![1000]);
        let lim = limits();
        assert!(lim.pool >= 8, "{}", lim.pool);
        let mut a = Vec::new();
        while let Ok(c) = s.charge(2001) {
            a.push(c);
        }
        assert_eq!(a.len(), lim.per_other);
        let mut b = Vec::new();
        while let Ok(c) = s.charge(2002) {
            b.push(c);
        }
        let mut c = Vec::new();
        while let Ok(x) = s.charge(2003) {
            c.push(x);
        }
        assert_eq!(a.len() + b.len() + c.len(), lim.others);
        let mut own = Vec::new();
        while let Ok(x) = s.charge(1000) {
            own.push(x);
        }
        assert_eq!(own.len(), lim.pool - lim.others);
        assert!(s.charge(0).is_err());
        // Closing gives the share back, to that user.
        a.truncate(a.len() - 1);
        own.pop();
        a.push(s.charge(2001).expect("the share a close gave back"));
        assert!(s.charge(2002).is_err());
        own.push(s.charge(0).expect("the share a close gave back"));
        drop((a, b, c, own));
        assert_eq!(s.report().open, 0);
    }
}
