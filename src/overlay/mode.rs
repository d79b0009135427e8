//! Modes of new objects: a file, directory or node created through the
//! mount gets exactly the mode a local filesystem would give it.
//!
//! The kernel sends the caller's requested mode and umask unmasked
//! (`FUSE_DONT_MASK`), so the rule of the upper's own filesystem applies:
//! the umask masks the mode unless the parent directory has a default ACL,
//! which then decides (applied by the upper filesystem when the object is
//! created there).
//!
//! The daemon's own umask must not mask the result a second time: each
//! thread that creates objects gives itself a private umask of 0
//! (`unshare(CLONE_FS)` makes the umask per thread), whatever umask the
//! daemon was started with (a shell's, or systemd's `UMask=`). Where that
//! is refused, the mode is set again after creation instead.

use std::cell::Cell;
use std::os::fd::AsRawFd;

use super::{Ctx, Overlay};
use crate::layer::sys;

thread_local! {
    /// Whether this thread's umask is 0 (see the module comment).
    static UMASK_CLEARED: Cell<bool> = const { Cell::new(false) };
}

/// Gives the calling thread a private umask of 0; false if the kernel
/// refuses a private fs context (the thread's umask is then unknown).
fn clear_thread_umask() -> bool {
    UMASK_CLEARED.with(|done| {
        if done.get() {
            return true;
        }
        // The daemon works fd-relative: a private cwd and root change
        // nothing, and the umask now affects this thread only.
        if crate::sys::private_thread_umask_zero().is_err() {
            return false;
        }
        done.set(true);
        true
    })
}

/// How to create an object so it ends with the mode a local filesystem
/// would give it.
#[derive(Debug, Clone, Copy)]
pub struct NewMode {
    /// The mode to pass to open/mkdir/mknod.
    pub mode: u32,
    /// The object's mode must be set again after creation (this thread's
    /// umask could not be cleared, and no default ACL decides the mode).
    pub fix_after: bool,
}

impl Overlay {
    /// The creation mode for `mode` (permission bits, set-id and sticky
    /// bits included) asked by `ctx` in the upper directory `parent_upper`.
    pub(super) fn new_mode(&self, ctx: &Ctx, parent_upper: &impl AsRawFd, mode: u32) -> NewMode {
        let acl = has_default_acl(parent_upper);
        let mode = if acl { mode } else { mode & !ctx.umask };
        NewMode {
            mode,
            fix_after: !clear_thread_umask() && !acl,
        }
    }
}

/// Whether the directory behind `dir` has a default ACL.
fn has_default_acl(dir: &impl AsRawFd) -> bool {
    sys::getxattr(dir, c"system.posix_acl_default").is_ok_and(|v| !v.is_empty())
}
