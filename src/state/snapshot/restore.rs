//! Restoring a snapshot as the upper: room checks, the staging directory
//! beside the upper, and the exchange.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, BufReader};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::extract::{extract, RootMeta};
use super::report::Report;
use super::scan::{prescan, Scan};
use super::store::{dir, file_name, info_in, open_snapshot, snapshots_dir, Info};
use super::{ctx, progress_bar, SnapshotError, IO_BUF, STAGING_PREFIX};
use crate::layer::safedir::{Role, SafeDir};
use crate::layer::sys;
use crate::policy::Policy;
use crate::state::snapshot_id;

/// Refuses a restore that would not fit: more file data or entries than
/// the workspace's quota allows, or than the upper's filesystem has room
/// for (`parent` is a descriptor on it).
fn check_room(
    parent: &OwnedFd,
    scan: &Scan,
    policy: &Policy,
    archive: &Path,
    where_: &Path,
) -> Result<(), SnapshotError> {
    let q = policy.quota();
    if let Some(limit) = q.bytes.filter(|&b| scan.data_bytes > b) {
        return Err(format!(
            "snapshot {} holds {} bytes of file data, more than the workspace's quota \
             (bytes={limit}); raise the quota in its policy file to restore it",
            archive.display(),
            scan.data_bytes
        )
        .into());
    }
    if let Some(limit) = q.inodes.filter(|&i| scan.entries > i) {
        return Err(format!(
            "snapshot {} holds {} entries, more than the workspace's quota (inodes={limit}); \
             raise the quota in its policy file to restore it",
            archive.display(),
            scan.entries
        )
        .into());
    }
    let st = sys::fstatfs(parent).map_err(ctx(format!("cannot statfs {}", where_.display())))?;
    #[allow(clippy::unnecessary_cast)]
    let (free, files, ffree) = (
        st.f_bavail as u64 * st.f_frsize as u64,
        st.f_files as u64,
        st.f_favail as u64,
    );
    if scan.data_bytes > free {
        return Err(format!(
            "snapshot {} needs {} bytes for its files, and the filesystem of {} has {free} \
             free: free some space and retry",
            archive.display(),
            scan.data_bytes,
            where_.display()
        )
        .into());
    }
    if files > 0 && scan.entries > ffree {
        return Err(format!(
            "snapshot {} holds {} entries, and the filesystem of {} has {ffree} free inodes: \
             free some and retry",
            archive.display(),
            scan.entries,
            where_.display()
        )
        .into());
    }
    Ok(())
}

/// Where a restore builds its staging tree: in the workspace's work dir
/// (checked, and created 0700 if missing as `mount` would) when it is on
/// the upper's filesystem, since `mount` cleans leftovers there; else
/// beside the upper, but only where nobody else can rename entries (the
/// staging dir is exchanged with the upper by name). Returns its path (for
/// messages), a descriptor and whether it is the work dir.
fn staging_parent(
    upper: &Path,
    work: Option<&Path>,
) -> Result<(PathBuf, OwnedFd, bool), SnapshotError> {
    let upper_dev = std::fs::symlink_metadata(upper)
        .map_err(ctx(format!("cannot stat upper dir {}", upper.display())))?
        .dev();
    if let Some(w) = work {
        let (d, _) = SafeDir::create(w, Role::Work, 0o700)?;
        if d.id().0 == upper_dev {
            return Ok((w.to_path_buf(), d.into_fd(), true));
        }
    }
    let parent = upper
        .parent()
        .ok_or_else(|| format!("upper dir {} has no parent directory", upper.display()))?;
    let pfd = SafeDir::stable_parent_fd(upper, Role::Staging)?;
    let st = sys::fstat(&pfd).map_err(ctx(format!("cannot stat {}", parent.display())))?;
    if st.st_dev != upper_dev {
        return Err(format!(
            "upper dir {} is a mount point: it cannot be replaced atomically; restore into a workspace whose upper is a plain directory",
            upper.display()
        ).into());
    }
    Ok((parent.to_path_buf(), pfd, false))
}

/// A snapshot extracted into a staging directory beside the upper (on its
/// filesystem), synced, ready to be exchanged with it.
pub struct Staged {
    pub info: Info,
    /// What the policy left out of the archive or changed.
    pub report: Report,
    /// Where the staging dir is (the work dir, or the upper's parent), for
    /// messages.
    pub parent: PathBuf,
    /// Whether that is the workspace's work dir.
    pub in_work: bool,
    /// A descriptor of it: the staging dir is reached through it.
    parent_fd: OwnedFd,
    /// Its name there (`.layerfs-restore.PID.NANOS`).
    pub name: OsString,
}

impl Staged {
    /// The staging dir's path, for messages.
    pub fn path(&self) -> PathBuf {
        self.parent.join(&self.name)
    }

    /// A path to the staging dir through its parent's descriptor (to
    /// remove it), valid while this lives.
    pub fn fd_path(&self) -> PathBuf {
        let mut p = PathBuf::from(format!("/proc/self/fd/{}", self.parent_fd.as_raw_fd()));
        p.push(&self.name);
        p
    }

    /// Removes the staging dir (after an exchange: the old upper).
    pub fn remove(&self) -> io::Result<()> {
        crate::layer::walk::remove_path(&self.fd_path())
    }
}

/// Extracts snapshot `id` of the checked state dir into a new staging
/// directory (see `staging_parent`) under the workspace's `policy`, and
/// syncs it. On error nothing is left behind.
pub fn stage(
    upper: &Path,
    work: Option<&Path>,
    state: &SafeDir,
    id: &str,
    policy: &Policy,
    progress: bool,
) -> Result<Staged, SnapshotError> {
    snapshot_id::validate(OsStr::new(id))?;
    let snaps = snapshots_dir(state, false)?.ok_or_else(|| {
        format!(
            "no snapshot `{id}`: {} does not exist (see: layerfs snapshot list WORKSPACE)",
            dir(state.path()).display()
        )
    })?;
    let mut info = info_in(&snaps, id)?;
    let shown = snaps.shown(file_name(id));
    let f = open_snapshot(&snaps, id)?;
    let scan = prescan(&f).map_err(SnapshotError::in_file(&shown))?;
    info.entries = Some(scan.entries);
    let root = RootMeta::of(upper)?;
    let (parent, parent_fd, in_work) = staging_parent(upper, work)?;
    check_room(&parent_fd, &scan, policy, &shown, &parent)?;
    let name = OsString::from(format!(
        "{}{}.{}",
        STAGING_PREFIX,
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    ));
    sys::mkdirat(&parent_fd, &name, 0o700).map_err(ctx(format!(
        "cannot create staging dir {}",
        parent.join(&name).display()
    )))?;
    let mut staged = Staged {
        info,
        report: Report::default(),
        parent,
        in_work,
        parent_fd,
        name,
    };
    // Invariant: every failure removes the staging tree.
    let extracted = (|| -> Result<(), SnapshotError> {
        let staging = SafeDir::open_at(
            &staged.parent_fd,
            &staged.name,
            staged.path(),
            Role::Staging,
        )?;
        let bar = progress_bar(progress, Some(staged.info.size), &format!("restoring {id}"));
        extract(
            BufReader::with_capacity(IO_BUF, bar.wrap_read(f)),
            &staging,
            policy,
            root,
            &mut staged.report,
        )
        .map_err(SnapshotError::in_file(&shown))?;
        bar.finish_and_clear();
        // One syncfs makes the whole staging tree durable before it
        // becomes the upper (cheaper than an fsync per file).
        let sfd = staging
            .open_self()
            .map_err(ctx(format!("cannot open {}", staging.path().display())))?;
        crate::sys::syncfs(&sfd)
            .map_err(ctx(format!("cannot sync {}", staging.path().display())))?;
        Ok(())
    })();
    if let Err(e) = extracted {
        let _ = staged.remove();
        return Err(e);
    }
    Ok(staged)
}

/// Replaces the upper by the contents of snapshot `id`, atomically (see
/// the module invariants), under the workspace's `policy`. The upper must
/// not be in use by a daemon (a live mount's daemon does the exchange
/// itself: `daemon::restore`).
pub fn restore(
    upper: &Path,
    work: Option<&Path>,
    state: &SafeDir,
    id: &str,
    policy: &Policy,
    progress: bool,
) -> Result<(Info, Report), SnapshotError> {
    let upper_name = upper
        .file_name()
        .ok_or_else(|| format!("upper dir {} has no name", upper.display()))?;
    let upper_parent = upper
        .parent()
        .ok_or_else(|| format!("upper dir {} has no parent directory", upper.display()))?;
    let staged = stage(upper, work, state, id, policy, progress)?;
    let ufd = sys::open_root(upper_parent)
        .map_err(ctx(format!("cannot open {}", upper_parent.display())))?;
    if let Err(e) = sys::renameat2(
        &staged.parent_fd,
        &staged.name,
        &ufd,
        upper_name,
        sys::RENAME_EXCHANGE,
    ) {
        let _ = staged.remove();
        return Err(ctx(format!(
            "cannot exchange {} with upper dir {}",
            staged.path().display(),
            upper.display()
        ))(e));
    }
    for (fd, d) in [
        (&ufd, upper_parent),
        (&staged.parent_fd, staged.parent.as_path()),
    ] {
        sys::open_dir(fd)
            .and_then(|f| File::from(f).sync_all())
            .map_err(ctx(format!("cannot sync {}", d.display())))?;
    }
    // The staging dir now holds the old upper.
    staged.remove().map_err(ctx(format!(
        "restored, but cannot remove the old upper (now {}); remove it by hand",
        staged.path().display()
    )))?;
    Ok((staged.info, staged.report))
}
