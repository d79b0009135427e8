//! The work dir and the state dir of a mount: found or created (0700,
//! checked by `layer::safedir`), and refused where they would nest with
//! the layers or the mountpoint. A work dir made for a mount that is then
//! refused is removed again.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::paths::{absolute, default_work_dir, existing_dir, is_within};
use super::{invalid, ConfigError};
use crate::layer::safedir::{Role, SafeDir};

/// A work dir this mount created, removed again (only if empty) when
/// dropped before `keep`: every refusal after its creation goes through
/// an early return.
#[must_use]
pub(super) struct CreatedDir(Option<PathBuf>);

impl CreatedDir {
    /// The mount goes ahead: keep the directory; says whether it was created.
    pub(super) fn keep(mut self) -> bool {
        self.0.take().is_some()
    }
}

impl Drop for CreatedDir {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            if let Err(e) = fs::remove_dir(&p) {
                tracing::warn!(
                    "cannot remove the work dir {} made for a refused mount: {e}",
                    p.display()
                );
            }
        }
    }
}

/// Finds or creates (mode 0700) the state directory, checks it (see
/// `layer::safedir`) and checks where it lies: never inside the upper, a
/// lower, the work dir (cleared at every mount) or the mountpoint (the
/// daemon would write through itself).
pub(super) fn resolve_state(
    given: Option<&Path>,
    upper: &Path,
    lowers: &[PathBuf],
    work: &Path,
    mountpoint: &Path,
) -> Result<PathBuf, ConfigError> {
    let raw = match given {
        Some(s) => absolute(s)?,
        None => crate::state::workspace::default_state_dir(upper),
    };
    // Checked before creating anything, then again once canonical.
    let check = |dir: &Path| -> Result<(), ConfigError> {
        let places = [
            (upper, "the upper"),
            (work, "the work dir"),
            (mountpoint, "the mountpoint"),
        ];
        for (place, what) in places
            .into_iter()
            .chain(lowers.iter().map(|l| (l.as_path(), "a lower")))
        {
            if is_within(dir, place) {
                return Err(invalid(format!(
                    "state dir {} is inside {what} {}: keep workspace state outside the layers, \
                     the work dir and the mountpoint (give another --state DIR)",
                    dir.display(),
                    place.display()
                )));
            }
        }
        Ok(())
    };
    check(&raw)?;
    // Created (0700) or opened without following a link at its name, and
    // refused if another user owns it or could write it (`SafeDir`): it
    // usually sits beside the upper, where others may be able to write.
    crate::state::workspace::create_state_dir(&raw).map_err(invalid)?;
    let state = existing_dir(&raw, "state dir", "--state (state=)")?;
    check(&state)?;
    Ok(state)
}

/// Finds or creates the work dir and checks where it lies. A work dir
/// created here is removed again if this or any later check refuses the
/// mount (the returned guard).
pub(super) fn resolve_work(
    given: Option<&Path>,
    upper: &Path,
    lowers: &[PathBuf],
) -> Result<(PathBuf, CreatedDir), ConfigError> {
    let raw = match given {
        Some(w) => absolute(w)?,
        None => default_work_dir(upper)?,
    };
    let mut created = CreatedDir(None);
    // Like the state dir: created 0700 or checked as found (`SafeDir`).
    let (_, made) = SafeDir::create(&raw, Role::Work, 0o700).map_err(invalid)?;
    if made {
        tracing::debug!("created work dir {}", raw.display());
        created = CreatedDir(Some(raw.clone()));
    }
    let work = existing_dir(&raw, "work dir", "--work (workdir=)")?;
    if is_within(&work, upper) || is_within(upper, &work) {
        return Err(invalid(format!(
            "work dir {} and upper {} nest: the work dir must be outside the upper tree \
             (and not contain it)",
            work.display(),
            upper.display()
        )));
    }
    for l in lowers {
        if is_within(&work, l) || is_within(l, &work) {
            return Err(invalid(format!(
                "work dir {} and lower {} nest: keep the work dir outside every lower",
                work.display(),
                l.display()
            )));
        }
    }
    let dev = |p: &Path| fs::metadata(p).map(|m| m.dev());
    match (dev(&work), dev(upper)) {
        (Ok(w), Ok(u)) if w == u => Ok((work, created)),
        (Ok(_), Ok(_)) => Err(invalid(format!(
            "work dir {} is on a different filesystem than upper {}: copy-up renames from \
             work into upper, so put the work dir next to the upper",
            work.display(),
            upper.display()
        ))),
        (Err(e), _) | (_, Err(e)) => Err(invalid(format!("work dir {}: {e}", work.display()))),
    }
}
