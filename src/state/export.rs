//! `layerfs checkpoint export` and `import`: a checkpoint moves between
//! hosts as one tar in the snapshot format (`state::snapshot`), so a fleet
//! can fork from one published state (docs/branch.md, "Export and
//! import").
//!
//! An export holds the tree the checkpoint's layers show together, as
//! one layer: the checkpoint's own layer when it stands on no other,
//! else the merge of its layers (`squash::build`, built aside in the store
//! from hard links and removed afterwards). Its whiteouts, opaque marks
//! and redirects apply to the shared lowers below, so an import over the
//! same shared lowers shows exactly the checkpoint's tree. The archive
//! does not record the shared lowers: an import records those of the
//! workspace it goes into.
//!
//! An import is an untrusted archive: it is checked and extracted as a
//! snapshot restore checks and extracts one (`snapshot::prescan`,
//! `snapshot::extract`, under the workspace's policy) into
//! `.NAME.PID.import` in the layer store, synced, its record written, and
//! renamed to `NAME`: the checkpoint exists whole or not at all (a crash
//! leaves at most the `.import` directory, which may be removed).

use std::ffi::OsStr;
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::checkpoint::{self, Layers};
use super::frozen::{io_ctx, Record, StackError, Store};
use super::snapshot::{self, Report, RootMeta};
use super::workspace::Workspace;
use crate::layer::safedir::{Role, SafeDir};
use crate::layer::sys;

/// What an export wrote.
pub struct Exported {
    /// Archive entries.
    pub entries: u64,
    /// How many layers it holds merged (1: the checkpoint's own).
    pub layers: usize,
}

/// Writes checkpoint `name` of `ws` to `file` (created; an existing file
/// is refused) as a snapshot-format tar of the tree its layers show.
pub fn export(ws: &Workspace, name: &str, file: &Path) -> Result<Exported, StackError> {
    let Layers { store, .. } = checkpoint::open(&ws.dir, None, false)
        .map_err(|_| StackError::Refused("this workspace has no checkpoint".into()))?;
    let record = store.checkpoint(name)?;
    let layers = record.stack();
    if let Some(l) = layers.iter().find(|l| !store.has_layer(l)) {
        return Err(StackError::Refused(format!(
            "checkpoint {name} stands on {l}, which is missing from {}",
            store.path().display()
        )));
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                StackError::Refused(format!(
                    "{} exists already: an export writes a new file; remove it or give \
                     another path",
                    file.display()
                ))
            } else {
                io_ctx(format!("cannot create {}", file.display()))(e)
            }
        })?;
    let tmp = (layers.len() > 1).then(|| Store::aside_name(name, std::process::id(), "export"));
    let result = (|| -> Result<u64, StackError> {
        let src = match &tmp {
            Some(t) => {
                super::squash::build(&store, &layers, t)?;
                store.path().join(t)
            }
            None => store.path().join(name),
        };
        let (out, entries) = snapshot::write_archive(&src, BufWriter::new(&f), &Default::default())
            .map_err(|e| StackError::Refused(format!("cannot export {name}: {e}")))?;
        let mut out = out
            .into_inner()
            .map_err(|e| io_ctx(format!("cannot write {}", file.display()))(e.into_error()))?;
        out.flush()
            .and_then(|()| f.sync_all())
            .map_err(io_ctx(format!("cannot write {}", file.display())))?;
        Ok(entries)
    })();
    if let Some(t) = &tmp {
        let _ = crate::layer::walk::remove_tree(&store.dir, OsStr::new(t));
    }
    match result {
        Ok(entries) => Ok(Exported {
            entries,
            layers: layers.len(),
        }),
        Err(e) => {
            let _ = std::fs::remove_file(file);
            Err(e)
        }
    }
}

/// Adds the archive `file` (an `export`, or any snapshot) to the layer
/// store of `ws` as checkpoint `name` (generated when `None`), standing
/// on no other checkpoint, over the shared lowers of `ws`. Returns the
/// name and what the workspace's policy left out or changed.
pub fn import(
    ws: &Workspace,
    file: &Path,
    name: Option<&str>,
) -> Result<(String, Report), StackError> {
    let policy = super::ops::workspace_policy(ws).map_err(StackError::Refused)?;
    let Layers { store, .. } = checkpoint::open(&ws.dir, None, true)?;
    let name = store.new_name(name)?;
    let f = File::open(file).map_err(io_ctx(format!("cannot open {}", file.display())))?;
    let bad = |e: snapshot::SnapshotError| {
        StackError::Refused(format!("{}: {e}; nothing was imported", file.display()))
    };
    snapshot::prescan(&f).map_err(bad)?;
    let root = RootMeta::of(&ws.upper).map_err(bad)?;
    store.sweep_aside();
    let tmp = Store::aside_name(&name, std::process::id(), "import");
    let what = || format!("cannot create {}", store.dir.shown(&tmp).display());
    sys::mkdirat(&store.dir, OsStr::new(&tmp), 0o700).map_err(io_ctx(what()))?;
    let mut report = Report::default();
    let result = (|| -> Result<(), StackError> {
        let parent = store
            .dir
            .as_fd()
            .try_clone_to_owned()
            .map_err(io_ctx(what()))?;
        let staging = SafeDir::open_at(
            &parent,
            OsStr::new(&tmp),
            store.dir.shown(&tmp),
            Role::Staging,
        )
        .map_err(StackError::Refused)?;
        snapshot::extract(BufReader::new(f), &staging, &policy, root, &mut report).map_err(bad)?;
        let sfd = staging.open_self().map_err(io_ctx(what()))?;
        crate::sys::syncfs(&sfd).map_err(io_ctx(what()))?;
        store.write_record(&Record {
            name: name.clone(),
            below: Vec::new(),
            lowers: checkpoint::shared_of(ws)?,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0),
            upper: ws.upper.clone(),
            squashed: Vec::new(),
        })?;
        store.place(&tmp, &name)?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = crate::layer::walk::remove_tree(&store.dir, OsStr::new(&tmp));
        if !store.has_layer(&name) {
            let _ = store.remove(&name);
        }
        return Err(e);
    }
    Ok((name, report))
}
