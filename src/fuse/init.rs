//! The INIT handshake: which capabilities layerfs asks the kernel for,
//! passthrough, write size and queue limits, and whether requests will be
//! served through io_uring. What it settles (`Negotiated`) is kept for the
//! daemon and for the io_uring queues' own sessions.

use fuser::{InitFlags, KernelConfig};

use super::{io_mode, uring};
use crate::overlay::Overlay;

/// The outcome of the INIT handshake the daemon needs afterwards.
#[derive(Clone, Copy, Debug)]
pub struct Negotiated {
    /// The kernel agreed to serve requests through io_uring.
    pub uring: bool,
    /// Why not, when io_uring was asked for and is off.
    pub uring_refused: Option<&'static str>,
    pub init: uring::Negotiated,
    /// The capabilities layerfs asked for (the queues' own sessions ask
    /// for the same).
    pub requested: InitFlags,
}

/// A queue's own session: the kernel's INIT is over; ask for what the
/// mount asked for, so both sessions decode alike.
pub(super) fn queue_session(config: &mut KernelConfig, n: &Negotiated) {
    let _ = config.add_capabilities(n.requested & config.capabilities());
    let _ = config.set_max_write(n.init.max_write);
    if n.requested.contains(InitFlags::FUSE_PASSTHROUGH) {
        let _ = config.set_max_stack_depth(1);
    }
}

/// The mount's own INIT: asks for what layerfs wants of what the kernel
/// offers, and returns what was settled. `io` learns whether passthrough
/// is on.
pub(super) fn negotiate(
    config: &mut KernelConfig,
    ov: &Overlay,
    io: &io_mode::IoModes,
    want_uring: bool,
) -> Negotiated {
    let wanted = wanted(ov.reach().is_some());
    // Take what the kernel offers of them (the call adds all or none).
    let mut asked = wanted & config.capabilities();
    if let Err(missing) = config.add_capabilities(wanted) {
        tracing::debug!("kernel lacks {missing:?}");
        let _ = config.add_capabilities(wanted & !missing);
    }
    if io.passthrough_wanted() {
        let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok();
        if ok {
            asked |= InitFlags::FUSE_PASSTHROUGH;
        }
        io.set_passthrough(ok && !ov.quota().bytes_limited());
    }
    let max_write = match config.set_max_write(1 << 20) {
        Ok(_) => 1 << 20,
        Err(most) => {
            let _ = config.set_max_write(most);
            most
        }
    };
    let _ = config.set_max_background(64);
    let _ = config.set_congestion_threshold(48);
    let (uring, uring_refused) = if want_uring {
        ask_uring(config)
    } else {
        (false, None)
    };
    Negotiated {
        uring,
        uring_refused,
        init: uring::Negotiated {
            minor: config.kernel_abi().1,
            max_readahead: 128 * 1024,
            capabilities: config.capabilities().bits(),
            max_write,
        },
        requested: asked,
    }
}

/// The capabilities layerfs wants, `network` when a lower is a network
/// filesystem.
fn wanted(network: bool) -> InitFlags {
    let wanted = InitFlags::FUSE_PARALLEL_DIROPS
        | InitFlags::FUSE_DO_READDIRPLUS
        | InitFlags::FUSE_READDIRPLUS_AUTO
        | InitFlags::FUSE_CACHE_SYMLINKS
        | InitFlags::FUSE_ATOMIC_O_TRUNC
        | InitFlags::FUSE_POSIX_ACL
        // Modes arrive with the caller's umask unapplied: the core
        // applies it unless a default ACL decides (overlay::mode).
        | InitFlags::FUSE_DONT_MASK
        | InitFlags::FUSE_ASYNC_DIO
        | InitFlags::FUSE_MAX_PAGES
        // The daemon clears setuid/setgid bits itself (`killpriv`): the
        // kernel then asks for no `security.capability` before each write.
        | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
    // A network lower changes behind the kernel's back: let the
    // kernel check a file's attributes (and drop its cached pages and
    // listing when they changed) once they time out, before a read or
    // a listing from the start, rather than only at open.
    if network {
        wanted | InitFlags::FUSE_AUTO_INVAL_DATA
    } else {
        wanted
    }
}

/// io_uring, asked for: taken when offered. The kernel offers it only
/// while root has set fuse's `enable_uring` (which layerfs never
/// changes). Returns whether it is on, and why not.
fn ask_uring(config: &mut KernelConfig) -> (bool, Option<&'static str>) {
    if !config
        .capabilities()
        .contains(InitFlags::FUSE_OVER_IO_URING)
    {
        let why = if uring::kernel_allows() == Some(false) {
            "the kernel does not offer it: /sys/module/fuse/parameters/enable_uring is N"
        } else {
            "the kernel does not offer it"
        };
        return (false, Some(why));
    }
    let on = config
        .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
        .is_ok();
    (on, None)
}
