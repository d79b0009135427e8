//! Where a daemon records its pid so `layerfs umount` can wait for it to
//! exit: one file per mountpoint, in a directory owned by the mounting user
//! (`/run/layerfs/pid` for root, `/run/user/UID/layerfs` or
//! `/tmp/layerfs-UID` for others).

use std::fs;
use std::hash::{Hash, Hasher};
use std::io;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::layer::safedir::{Role, SafeDir};

/// Candidate pid directories for mounts made by `uid`, preferred first.
fn dirs_for_uid(uid: u32) -> Vec<PathBuf> {
    if uid == 0 {
        vec![PathBuf::from("/run/layerfs/pid")]
    } else {
        vec![
            PathBuf::from(format!("/run/user/{uid}/layerfs")),
            PathBuf::from(format!("/tmp/layerfs-{uid}")),
        ]
    }
}

/// The pid file name for a mountpoint: the path with `/` turned into `-`
/// (other unusual bytes hex-escaped), or a hash when that is too long.
pub fn file_name(mountpoint: &Path) -> String {
    let mut name = String::new();
    for &b in mountpoint.as_os_str().as_bytes().iter().skip(1) {
        match b {
            b'/' => name.push('-'),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' => name.push(b as char),
            _ => name.push_str(&format!("\\x{b:02x}")),
        }
    }
    if name.len() > 200 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        mountpoint.hash(&mut h);
        name.truncate(100);
        name.push_str(&format!("~{:016x}", h.finish()));
    }
    format!("{name}.pid")
}

/// A pid file, removed when dropped (at daemon exit).
pub struct PidFile {
    /// The pid directory, checked and open (`layer::safedir`).
    dir: SafeDir,
    name: String,
    path: PathBuf,
}

impl PidFile {
    /// Records this process as the daemon of `mountpoint`, with the
    /// workspace's state directory.
    pub fn create(mountpoint: &Path, state: &Path) -> io::Result<PidFile> {
        let text = format!(
            "{}\n{}\n{}\n",
            std::process::id(),
            mountpoint.display(),
            state.display()
        );
        PidFile::write(file_name(mountpoint), &text)
    }

    /// Records this process as holding the workspace of `upper` (and its
    /// work dir `work`) in process, with no mount (the agent tools' core,
    /// `tools`). A mount that finds the upper locked by a process
    /// registered so for that upper refuses at once instead of waiting for
    /// it as for a daemon starting or stopping.
    ///
    /// One process may hold several workspaces (a library user, the test
    /// suite): each claim has an entry of its own, named
    /// `=in-process-PID-N.pid` (N counts this process's claims), which its
    /// drop removes. `file_name` never makes such a name (it escapes `=`),
    /// so it cannot shadow a mount's entry.
    pub fn in_process(upper: &Path, work: &Path) -> io::Result<PidFile> {
        static CLAIMS: AtomicU64 = AtomicU64::new(0);
        let n = CLAIMS.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let text = format!(
            "{pid}

{}
{}
",
            upper.display(),
            work.display()
        );
        PidFile::write(format!("{IN_PROCESS}{pid}-{n}.pid"), &text)
    }

    /// Writes the entry `name` in this user's first usable pid directory.
    ///
    /// The process is named `layerfs` first (its main thread's name, which
    /// `/proc/PID/stat` shows): `is_daemon_alive` tells a registered
    /// process from a later one given the same pid by that name, and a
    /// daemon started under another file name — `layerfs run`'s own,
    /// executed as `/proc/self/exe`, or a copied binary — would otherwise
    /// count as gone while it serves. Called on the main thread.
    fn write(name: String, text: &str) -> io::Result<PidFile> {
        if let Err(e) = nix::sys::prctl::set_name(c"layerfs") {
            tracing::warn!(
                "cannot name this process layerfs ({e}): state commands may not find it"
            );
        }
        let uid = nix::unistd::geteuid().as_raw();
        let mut last = io::Error::other("no pid directory");
        for path in dirs_for_uid(uid) {
            match private_dir(&path, uid) {
                Ok(dir) => {
                    let mut f = dir.open_file(
                        &name,
                        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
                        0o644,
                    )?;
                    f.write_all(text.as_bytes())?;
                    return Ok(PidFile {
                        path: dir.shown(&name),
                        dir,
                        name,
                    });
                }
                Err(e) => last = io::Error::new(e.kind(), format!("{}: {e}", path.display())),
            }
        }
        Err(last)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The start of an in-process holder's entry name (`PidFile::in_process`).
const IN_PROCESS: &str = "=in-process-";

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = self.dir.remove_file(&self.name);
    }
}

/// Creates `dir` (mode 0700) if missing and opens it checked
/// (`SafeDir`: no symlink, not writable by others) and owned by `uid`, so
/// no other user can plant pid files in it.
fn private_dir(dir: &Path, uid: u32) -> io::Result<SafeDir> {
    if let Some(parent) = dir.parent() {
        if uid == 0 {
            fs::create_dir_all(parent)?;
        } else if !parent.is_dir() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "parent missing"));
        }
    }
    let (d, _) = SafeDir::create(dir, Role::PidDir, 0o700)
        .map_err(|m| io::Error::new(io::ErrorKind::PermissionDenied, m))?;
    if d.owner() != uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "not a directory owned by this user",
        ));
    }
    Ok(d)
}

/// Whether `pid` is a layerfs process still alive: running, or a zombie
/// main thread whose other threads have not all exited yet.
pub fn is_daemon_alive(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // Fields after the parenthesised comm: state is the first.
    let Some((comm_part, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let state = rest.trim_start().chars().next().unwrap_or('?');
    let comm = comm_part.split_once('(').map(|x| x.1).unwrap_or("");
    if comm != "layerfs" {
        return false;
    }
    if state != 'Z' && state != 'X' {
        return true;
    }
    // A zombie main thread is not yet a dead daemon: its other threads may
    // still be exiting and hold the files they share (the upper, the work
    // dir, the journal), so the upper's filesystem would still be busy.
    // They are gone once the group counts only the zombie itself.
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse::<u32>().ok())
        })
        .is_some_and(|threads| threads > 1)
}

/// A live daemon's registry entry.
#[derive(Debug, Clone)]
pub struct Entry {
    pub pid: u32,
    /// The workspace's state directory (absent in entries of older daemons).
    pub state: Option<PathBuf>,
}

/// The pid recorded for the daemon serving `mountpoint`, if one is alive.
/// `owner` is the uid that made the mount (from mountinfo), when known.
pub fn find_daemon(mountpoint: &Path, owner: Option<u32>) -> Option<u32> {
    find_entry(mountpoint, owner).map(|e| e.pid)
}

/// The registry entry of the live daemon serving `mountpoint`.
pub fn find_entry(mountpoint: &Path, owner: Option<u32>) -> Option<Entry> {
    let me = nix::unistd::geteuid().as_raw();
    let mut uids = vec![];
    for u in [owner, Some(me), Some(0)].into_iter().flatten() {
        if !uids.contains(&u) {
            uids.push(u);
        }
    }
    let name = file_name(mountpoint);
    for uid in uids {
        for dir in dirs_for_uid(uid) {
            let path = dir.join(&name);
            let Ok(md) = fs::symlink_metadata(&path) else {
                continue;
            };
            if md.uid() != uid || !md.is_file() {
                continue;
            }
            let Ok(text) = fs::read_to_string(&path) else {
                continue;
            };
            let mut lines = text.lines();
            let pid = lines.next().and_then(|l| l.trim().parse::<u32>().ok());
            let recorded = lines.next().map(PathBuf::from);
            let state = lines.next().filter(|l| !l.is_empty()).map(PathBuf::from);
            if let (Some(pid), Some(rec)) = (pid, recorded) {
                if rec == mountpoint && is_daemon_alive(pid) {
                    return Some(Entry { pid, state });
                }
            }
        }
    }
    None
}

/// What the registry says of process `pid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// It registered `mountpoint` (and the workspace's state dir).
    Serving {
        mountpoint: PathBuf,
        state: Option<PathBuf>,
    },
    /// It holds workspaces in process, with no mount (`tools`): the
    /// upper and work dirs of each of its claims.
    InProcess { held: Vec<PathBuf> },
    /// Its user's registry was read and names it nowhere: a daemon that
    /// has not registered yet, or has already removed its entry.
    Unregistered,
    /// Its user's registry cannot be read by this caller (another user's
    /// daemon), or it is no live layerfs process.
    Unknown,
}

/// The registry entry of process `pid`, from the registry of the user it
/// runs as.
pub fn registration_of_pid(pid: u32) -> Registration {
    let Ok(md) = fs::metadata(format!("/proc/{pid}")) else {
        return Registration::Unknown;
    };
    if !is_daemon_alive(pid) {
        return Registration::Unknown;
    }
    let mut read_any = false;
    let mut in_process = false;
    let mut held = Vec::new();
    for dir in dirs_for_uid(md.uid()) {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        read_any = true;
        for e in entries.flatten() {
            let Ok(text) = fs::read_to_string(e.path()) else {
                continue;
            };
            let mut lines = text.lines();
            if lines.next().and_then(|l| l.trim().parse::<u32>().ok()) != Some(pid) {
                continue;
            }
            if e.file_name().as_bytes().starts_with(IN_PROCESS.as_bytes()) {
                // "PID", "", then the directories this claim holds.
                held.extend(lines.skip(1).filter(|l| !l.is_empty()).map(PathBuf::from));
                in_process = true;
                continue;
            }
            let Some(mountpoint) = lines.next().map(PathBuf::from) else {
                continue;
            };
            let state = lines.next().filter(|l| !l.is_empty()).map(PathBuf::from);
            return Registration::Serving { mountpoint, state };
        }
    }
    if in_process {
        Registration::InProcess { held }
    } else if read_any {
        Registration::Unregistered
    } else {
        Registration::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_flat_and_readable() {
        assert_eq!(
            file_name(Path::new("/run/layerfs/ws1/mnt")),
            "run-layerfs-ws1-mnt.pid"
        );
        assert_eq!(file_name(Path::new("/tmp/a b-c")), "tmp-a\\x20b\\x2dc.pid");
        let long = PathBuf::from(format!("/{}", "x".repeat(300)));
        assert!(file_name(&long).len() < 255);
    }
}
