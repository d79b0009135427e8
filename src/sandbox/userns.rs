//! Entering a new user namespace with its uid and gid maps written.
//!
//! A process that has unshared its user namespace cannot map ids beyond
//! its own (the kernel asks for `CAP_SETUID` in the *parent* namespace), so
//! a helper forked beforehand, still in the parent namespace, writes the
//! maps: root's helper may map every id, an unprivileged user's helper may
//! map exactly that user's own uid and gid (after denying `setgroups`).
//! The unsharing process keeps every capability in its new namespace
//! until it execs a program as a non-root uid.

use std::fs;
use std::io::{Read, Write};

use nix::sched::CloneFlags;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{getegid, geteuid, getpid, ForkResult};

use super::sys;

/// The id maps of a new user namespace, in `/proc/PID/uid_map` syntax.
#[derive(Debug, Clone)]
pub struct IdMap {
    uid_map: String,
    gid_map: String,
    /// Write `deny` to `setgroups` first (required for an unprivileged
    /// writer's `gid_map`).
    deny_setgroups: bool,
}

impl IdMap {
    /// The caller's effective uid and gid, each mapped to itself: all an
    /// unprivileged user may map. Other ids show as the overflow id
    /// (`nobody`).
    pub fn own() -> IdMap {
        IdMap {
            uid_map: format!("{0} {0} 1\n", geteuid()),
            gid_map: format!("{0} {0} 1\n", getegid()),
            deny_setgroups: true,
        }
    }

    /// Every id mapped to itself (root only): root inside keeps root's file
    /// permissions over every file, but holds no capability over anything
    /// the parent namespace owns (mounts, devices, the host's network).
    pub fn identity() -> IdMap {
        IdMap {
            uid_map: "0 0 4294967295\n".into(),
            gid_map: "0 0 4294967295\n".into(),
            deny_setgroups: false,
        }
    }
}

/// Why no user namespace with its id maps could be entered.
#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    #[error("pipe: {0}")]
    Pipe(#[source] std::io::Error),
    #[error("fork: {0}")]
    Fork(#[source] std::io::Error),
    /// `unshare(CLONE_NEWUSER | …)` refused, worded for the user.
    #[error("{}", unshare_error(*.0))]
    Unshare(#[source] nix::Error),
    /// What the id-mapping helper reported (the text of a `WriteMap`).
    #[error("{0}")]
    Helper(String),
    /// Writing `text` (its lines joined by `; `) to `path`.
    #[error("cannot write {path} ({text}): {source}")]
    WriteMap {
        path: String,
        text: String,
        source: std::io::Error,
    },
    /// The id-mapping helper ended without a word, with this status.
    #[error("the id-mapping helper ended with {0:?}")]
    HelperEnded(nix::Result<WaitStatus>),
}

/// Unshares a new user namespace together with `also`, and has a helper
/// in the current namespace write `map` for it.
pub fn enter(also: CloneFlags, map: &IdMap) -> Result<(), UsernsError> {
    let target = getpid();
    let (mut go_r, go_w) = std::io::pipe().map_err(UsernsError::Pipe)?;
    let (mut err_r, err_w) = std::io::pipe().map_err(UsernsError::Pipe)?;
    match sys::fork_single_threaded().map_err(UsernsError::Fork)? {
        ForkResult::Child => {
            drop(go_w);
            drop(err_r);
            let mut byte = [0u8; 1];
            // EOF: the parent failed to unshare (or died); map nothing.
            if !matches!(go_r.read(&mut byte), Ok(1)) {
                sys::exit_child(0);
            }
            match write_maps(target.as_raw(), map) {
                Ok(()) => sys::exit_child(0),
                Err(e) => {
                    let mut w = err_w;
                    let _ = w.write_all(e.to_string().as_bytes());
                    sys::exit_child(1)
                }
            }
        }
        ForkResult::Parent { child } => {
            drop(go_r);
            drop(err_w);
            let unshared = nix::sched::unshare(CloneFlags::CLONE_NEWUSER | also);
            let mut go_w = go_w;
            if unshared.is_ok() {
                let _ = go_w.write_all(b"1");
            }
            drop(go_w);
            let mut msg = String::new();
            let _ = err_r.read_to_string(&mut msg);
            let status = waitpid(child, None);
            if let Err(e) = unshared {
                return Err(UsernsError::Unshare(e));
            }
            match status {
                Ok(WaitStatus::Exited(_, 0)) if msg.is_empty() => Ok(()),
                _ if !msg.is_empty() => Err(UsernsError::Helper(msg)),
                other => Err(UsernsError::HelperEnded(other)),
            }
        }
    }
}

fn write_maps(pid: i32, map: &IdMap) -> Result<(), UsernsError> {
    let write = |file: &str, text: &str| {
        let path = format!("/proc/{pid}/{file}");
        fs::write(&path, text).map_err(|source| UsernsError::WriteMap {
            path,
            text: text.trim_end().replace('\n', "; "),
            source,
        })
    };
    if map.deny_setgroups {
        write("setgroups", "deny")?;
    }
    write("uid_map", &map.uid_map)?;
    write("gid_map", &map.gid_map)
}

/// Words a failed `unshare(CLONE_NEWUSER | …)` for the user.
pub fn unshare_error(e: nix::Error) -> String {
    let why = match e {
        nix::Error::EPERM => {
            "user namespaces are not allowed for this user here (e.g. the sysctl \
             kernel.unprivileged_userns_clone=0, or a security module forbids them)"
        }
        nix::Error::ENOSPC => {
            "the user namespace limit is reached (sysctl user.max_user_namespaces is 0 \
             or used up)"
        }
        nix::Error::EINVAL => "this kernel was built without user namespaces",
        nix::Error::EUSERS => "user namespaces are nested too deeply here",
        _ => "",
    };
    let mut msg = format!("cannot create a user namespace for the sandbox: {e}");
    if !why.is_empty() {
        msg.push_str(&format!(": {why}"));
    }
    msg.push_str(
        "; run `layerfs run` as root, or have the administrator allow unprivileged user \
         namespaces",
    );
    msg
}

/// Checks that this (unprivileged) process can create a user namespace,
/// before anything is mounted: a child tries it and exits.
pub fn probe() -> Result<(), UsernsError> {
    let mut cmd = std::process::Command::new(super::SELF_EXE);
    cmd.arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    crate::sys::ExecSetup::new()
        .unshare(CloneFlags::CLONE_NEWUSER)
        .apply(&mut cmd);
    match cmd.status() {
        Ok(_) => Ok(()),
        Err(e) => Err(UsernsError::Unshare(
            e.raw_os_error()
                .map(nix::Error::from_raw)
                .unwrap_or(nix::Error::EINVAL),
        )),
    }
}
