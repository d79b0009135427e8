//! The FUSE adapter: `fuser::Filesystem` as thin delegations to the overlay
//! core, errno and TTL replies, kernel cache flags and passthrough.
//! STUB: the core author replaces this file; the public items are the contract.

use std::sync::Arc;

use crate::config::Config;
use crate::policy::Policy;

/// Handle the daemon keeps after the filesystem moved into the session:
/// policy reloads (SIGHUP) and the kernel notifier go through it.
#[derive(Clone)]
pub struct FsHandle {
    _inner: Arc<()>,
}

impl FsHandle {
    /// Swap the policy in effect; requests already running finish with the old one.
    pub fn reload_policy(&self, _policy: Policy) {}
    /// Give the filesystem the session's notifier, for cache invalidations.
    pub fn set_notifier(&self, _notifier: fuser::Notifier) {}
}

pub struct LayerFs {
    handle: FsHandle,
}

impl LayerFs {
    /// Opens every layer root and the work dir; fails with a message naming
    /// the layer and the problem.
    pub fn new(_cfg: &Config) -> Result<LayerFs, String> {
        Ok(LayerFs {
            handle: FsHandle {
                _inner: Arc::new(()),
            },
        })
    }
    pub fn handle(&self) -> FsHandle {
        self.handle.clone()
    }
}

impl fuser::Filesystem for LayerFs {}

/// The fuser session settings for a config: worker threads, clone_fd, ACL.
pub fn session_config(cfg: &Config) -> fuser::Config {
    let mut c = fuser::Config::default();
    c.n_threads = Some(cfg.threads.max(1));
    c.clone_fd = true;
    c.acl = if cfg.allow_other {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    c
}
