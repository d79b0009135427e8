//! `layerfs snapshot save|restore|list|rm`: keep and bring back whole
//! states of a workspace's upper (see `state::snapshot`).

use super::exit::{CliError, Context};
use std::ffi::{OsStr, OsString};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::Subcommand;

use super::state_arg::StateArg;
use crate::overlay::events::EvOp;
use crate::policy::Policy;
use crate::state::protocol::{Paused, Request, Restored, Resumed};
use crate::state::scratch;
use crate::state::snapshot::{self, SaveOptions};
use crate::state::snapshot_id;
use crate::state::workspace::Workspace;

const SNAPSHOT_HELP: &str = "\
WORKSPACE is a live layerfs mountpoint or, for an unmounted workspace, its
upper directory. Snapshots live in the state dir's snapshots/ as ID.tar
(plain tar files: `tar tvf` lists them). An ID is 1-128 characters of
A-Z a-z 0-9 . _ -, not starting with `.`. A restore checks the archive
against the workspace's policy and names everything it leaves out or
changes (device nodes, setuid bits, foreign xattrs, symlinks out, the
root's mode); --json lists them all.

Examples:
  layerfs snapshot save ~/ws/mnt before-refactor
  layerfs snapshot save ~/ws/mnt                 # ID from the UTC time
  layerfs snapshot list ~/ws/mnt
  layerfs snapshot list --json ~/ws/upper
  layerfs snapshot restore ~/ws/mnt before-refactor
  layerfs snapshot restore ~/ws/upper before-refactor   # unmounted
  layerfs snapshot restore --json ~/ws/mnt from-elsewhere
  layerfs snapshot rm ~/ws/mnt before-refactor";

#[derive(Subcommand, Debug)]
#[command(after_help = SNAPSHOT_HELP)]
pub enum SnapshotCmd {
    /// Save the upper as snapshot ID (a consistent capture: writes through
    /// the mount are paused while it is taken; reads go on).
    Save {
        /// Replace an existing snapshot of the same ID.
        #[arg(long)]
        force: bool,
        #[arg(value_name = "WORKSPACE")]
        workspace: PathBuf,
        #[command(flatten)]
        st: StateArg,
        /// Snapshot ID [default: the UTC time, e.g. 20261203T150102.123Z].
        #[arg(value_name = "ID")]
        id: Option<OsString>,
    },
    /// Replace the upper by snapshot ID, atomically. On a live mount the
    /// mount shows the restored state at once; refused while the mount
    /// owner's files are open for writing in it (files open for reading
    /// keep their old contents).
    ///
    /// The archive is checked against the workspace's policy (its policy
    /// file, else the defaults) as the mount checks what it creates: device
    /// nodes, setuid/setgid bits, file capabilities, symlinks the policy
    /// refuses and xattrs outside what a workspace keeps are left out, the
    /// upper root keeps its own mode and owner, and each such change is
    /// listed by name.
    Restore {
        /// Print one JSON object: the snapshot and every change made to it.
        #[arg(long)]
        json: bool,
        #[arg(value_name = "WORKSPACE")]
        workspace: PathBuf,
        #[command(flatten)]
        st: StateArg,
        #[arg(value_name = "ID")]
        id: OsString,
    },
    /// List snapshots: ID, size, time, number of entries.
    List {
        /// One JSON object per line: {"id","size","time","entries"}.
        #[arg(long)]
        json: bool,
        #[arg(value_name = "WORKSPACE")]
        workspace: PathBuf,
        #[command(flatten)]
        st: StateArg,
    },
    /// Remove snapshot ID.
    Rm {
        #[arg(value_name = "WORKSPACE")]
        workspace: PathBuf,
        #[command(flatten)]
        st: StateArg,
        #[arg(value_name = "ID")]
        id: OsString,
    },
}

impl SnapshotCmd {
    pub fn run(self) -> Result<(), CliError> {
        let (what, r) = match self {
            SnapshotCmd::Save {
                force,
                workspace,
                st,
                id,
            } => ("save", save(&workspace, &st, id.as_deref(), force)),
            SnapshotCmd::Restore {
                json,
                workspace,
                st,
                id,
            } => ("restore", restore(&workspace, &st, &id, json)),
            SnapshotCmd::List {
                json,
                workspace,
                st,
            } => ("list", list(&workspace, &st, json)),
            SnapshotCmd::Rm { workspace, st, id } => ("rm", rm(&workspace, &st, &id)),
        };
        r.or_fail(&format!("snapshot {what}"))
    }
}

fn save(ws_arg: &Path, st: &StateArg, id: Option<&OsStr>, force: bool) -> Result<(), String> {
    // Invariant: a bad ID is refused before anything is read or written.
    let given = id.map(snapshot_id::validate).transpose()?;
    let ws = st.resolve(ws_arg)?;
    let id = match given {
        Some(id) => id.to_string(),
        None => snapshot_id::generate(|c| snapshot::exists(&ws.dir, c)),
    };
    let opts = SaveOptions {
        exclude: scratch::of_workspace(&ws)?,
        force,
        progress: std::io::stderr().is_terminal(),
    };
    // On a live mount, hold the daemon's write pause for the capture:
    // writes in flight complete first, later ones wait; closing the
    // connection (also when this process dies) ends the pause.
    let pause = match ws.client() {
        None => None,
        Some(client) => {
            let mut c = client?;
            let r: Paused = c.call(&Request::Pause { wait_ms: None })?;
            if !r.busy.is_empty() {
                // Each with the uid holding it (`holders`), where the
                // daemon says.
                let named: Vec<String> = if r.holders.is_empty() {
                    r.busy
                } else {
                    r.holders
                        .iter()
                        .map(|h| format!("{} (uid {})", h.path, h.uid))
                        .collect()
                };
                return Err(format!(
                    "files are open for writing through passthrough, whose writes cannot be \
                     paused: {}; close them and retry",
                    named.join(", ")
                ));
            }
            Some(c)
        }
    };
    let info = snapshot::save(&ws.upper, &ws.dir, &id, &opts)?;
    if let Some(mut c) = pause {
        // Dropping the connection also resumes; asking says so explicitly.
        let _ = c.call::<Resumed>(&Request::Resume);
    }
    let entries = info.entries.unwrap_or(0);
    super::journal_undo("snapshot save", &ws, EvOp::SnapshotSave, &info.id, entries);
    outln!(
        "saved snapshot {} ({}, {} entries) to {}",
        info.id,
        crate::quote::bytes(info.size),
        info.entries.unwrap_or(0),
        snapshot::path(&ws.state, &info.id).display()
    );
    Ok(())
}

fn restore(ws_arg: &Path, st: &StateArg, id: &OsStr, json: bool) -> Result<(), String> {
    let id = snapshot_id::validate(id)?;
    let ws = st.resolve(ws_arg)?;
    let policy = workspace_policy(&ws)?;
    let progress = std::io::stderr().is_terminal() && !json;
    let (info, report) = match ws.client() {
        None => snapshot::restore(&ws.upper, Some(&ws.work), &ws.dir, id, &policy, progress)?,
        Some(client) => live_restore(&ws, client?, id, &policy, progress)?,
    };
    // The restored upper is a new directory: it records again where its
    // state is (`state::place`).
    if let Err(e) = crate::state::place::record(&ws.upper, &ws.state) {
        eprintln!(
            "layerfs snapshot restore: cannot record the state dir on {}: {e}; once \
             unmounted, give state commands --state {}",
            ws.upper.display(),
            ws.state.display()
        );
    }
    let entries = info.entries.unwrap_or(0);
    super::journal_undo(
        "snapshot restore",
        &ws,
        EvOp::SnapshotRestore,
        &info.id,
        entries,
    );
    if json {
        let mut v = report.to_json();
        v["restored"] = serde_json::json!(info.id);
        v["size"] = serde_json::json!(info.size);
        v["upper"] = serde_json::json!(ws.upper.to_string_lossy());
        outln!("{v}");
    } else {
        outln!(
            "restored snapshot {} ({}) into {}",
            info.id,
            crate::quote::bytes(info.size),
            ws.upper.display()
        );
    }
    if !report.is_empty() {
        eprintln!(
            "layerfs snapshot restore: the snapshot held what the workspace's policy does \
             not allow; it was restored without it:"
        );
        for l in report.lines(20) {
            eprintln!("  {l}");
        }
    }
    Ok(())
}

/// The policy a restore checks the archive against: the workspace's
/// policy file (named in its workspace.json), else the defaults.
fn workspace_policy(ws: &Workspace) -> Result<Policy, String> {
    match &ws.policy {
        Some(p) => Policy::load(p).map_err(|e| {
            format!(
                "{e}: a restore checks the snapshot against the workspace's policy; fix the \
                 policy file (or remount without it) and retry"
            )
        }),
        None => Ok(Policy::default()),
    }
}

/// Restores on a live mount: the snapshot is extracted into a staging dir
/// in the work dir while the mount goes on serving, then the daemon
/// exchanges it with the upper, writes paused (see `daemon::restore`), and
/// the old tree is removed.
fn live_restore(
    ws: &Workspace,
    mut client: crate::state::control::Client,
    id: &str,
    policy: &Policy,
    progress: bool,
) -> Result<(snapshot::Info, snapshot::Report), String> {
    let staged = snapshot::stage(&ws.upper, Some(&ws.work), &ws.dir, id, policy, progress)?;
    if !staged.in_work {
        let _ = staged.remove();
        return Err(format!(
            "work dir {} is not on the upper's filesystem: a live restore needs it there",
            ws.work.display()
        ));
    }
    let answer = client.call::<Restored>(&Request::Restore {
        staging: staged.name.to_string_lossy().into_owned(),
    });
    // Either way the staging dir is to go: on success it holds the old
    // upper, else the unused restored tree. (Killed here, it stays in the
    // work dir, which the next mount cleans.)
    let removed = staged.remove();
    let answer = answer.map_err(|e| format!("the mount was not changed: {e}"))?;
    if answer.invalidated.pending {
        eprintln!(
            "layerfs snapshot restore: warning: the kernel's caches are still being \
             invalidated; the mount may show old attributes for a moment"
        );
    }
    if let Err(e) = removed {
        eprintln!(
            "layerfs snapshot restore: warning: restored, but cannot remove the old upper \
             (now {}): {e}; remove it by hand (or it goes at the next mount)",
            staged.path().display()
        );
    }
    Ok((staged.info, staged.report))
}

fn list(ws_arg: &Path, st: &StateArg, json: bool) -> Result<(), String> {
    let ws = st.resolve(ws_arg)?;
    let all = snapshot::list(&ws.dir, true)?;
    if json {
        for i in &all {
            outln!("{}", i.to_json());
        }
        return Ok(());
    }
    if all.is_empty() {
        eprintln!("no snapshots in {}", snapshot::dir(&ws.state).display());
        return Ok(());
    }
    let w = all.iter().map(|i| i.id.len()).max().unwrap_or(2).max(2);
    outln!(
        "{:<w$}  {:>10}  {:<20}  {:>8}",
        "ID",
        "SIZE",
        "TIME",
        "ENTRIES"
    );
    for i in &all {
        outln!(
            "{:<w$}  {:>10}  {:<20}  {:>8}",
            i.id,
            crate::quote::bytes(i.size),
            snapshot_id::rfc3339(i.time),
            i.entries.map_or("?".to_string(), |n| n.to_string())
        );
    }
    Ok(())
}

fn rm(ws_arg: &Path, st: &StateArg, id: &OsStr) -> Result<(), String> {
    let id = snapshot_id::validate(id)?;
    let ws = st.resolve(ws_arg)?;
    snapshot::remove(&ws.dir, id)?;
    outln!("removed snapshot {id}");
    Ok(())
}
