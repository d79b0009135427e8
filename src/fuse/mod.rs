//! The FUSE adapter: `fuser::Filesystem` as thin delegations to the overlay
//! core, plus what only the kernel interface knows about: errno replies,
//! cache timeouts, init flags and passthrough (`io_mode`).
//!
//! Inside, dependencies point down: `ops` (the `Filesystem` impl) uses the
//! request bodies (`open`, `listing`, its own `Shared::lookup` and
//! `release`), the journal's mapping (`journal`) and the replies
//! (`reply`), all on `shared` (what every request shares); `fast` (the
//! io_uring queues' own answers) calls the same request bodies with replies
//! it encodes itself; `handle` (the daemon's side) uses `shared` too;
//! `init` negotiates with the kernel. Below
//! them: `contain`, `convert`, `io_mode`, `killpriv`, `long`, `record`, `invalidate`,
//! `watcher`, `sys` and `uring`, none of which knows `LayerFs`.

mod caller;
mod contain;
mod convert;
mod fast;
mod handle;
mod init;
mod invalidate;
mod io_mode;
mod journal;
mod killpriv;
mod listing;
mod long;
mod open;
mod ops;
mod prefetch;
mod record;
mod reply;
mod shared;
#[allow(unsafe_code)]
mod sys;
#[allow(unsafe_code)]
pub mod uring;
mod watcher;

use crate::config::Config;
pub use contain::Contained;
pub use fast::QueueAnswers;
pub use handle::{FsHandle, LowerWatch};
pub use init::Negotiated;
pub use shared::LayerFs;

/// The fuser session settings for a config: worker threads, clone_fd, ACL.
pub fn session_config(cfg: &Config) -> fuser::Config {
    let mut c = fuser::Config::default();
    // With io_uring the queues serve requests; `/dev/fuse` keeps only
    // FORGET and INTERRUPT (and everything, should the queues not start).
    c.n_threads = Some(if cfg.io_uring {
        cfg.threads.clamp(1, 2)
    } else {
        cfg.threads.max(1)
    });
    c.clone_fd = true;
    c.acl = if cfg.allow_other {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    c
}
