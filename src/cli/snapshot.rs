//! `layerfs snapshot save|restore|list|rm`: keep and bring back whole
//! states of a workspace's upper (see `state::snapshot`).

use super::exit::{CliError, Context, Failed};
use std::ffi::{OsStr, OsString};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::Subcommand;

use super::state_arg::StateArg;
use crate::state::snapshot;
use crate::state::{ops, snapshot_id};

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
        /// A live layerfs mountpoint, the upper directory of an unmounted
        /// workspace, or its state dir.
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
        /// A live layerfs mountpoint, the upper directory of an unmounted
        /// workspace, or its state dir.
        #[arg(value_name = "WORKSPACE")]
        workspace: PathBuf,
        #[command(flatten)]
        st: StateArg,
        /// The snapshot to restore (`layerfs snapshot list` shows them).
        #[arg(value_name = "ID")]
        id: OsString,
    },
    /// List snapshots: ID, size, time, number of entries.
    List {
        /// One JSON object per line: {"id","size","time","entries"}.
        #[arg(long)]
        json: bool,
        /// A live layerfs mountpoint, the upper directory of an unmounted
        /// workspace, or its state dir.
        #[arg(value_name = "WORKSPACE")]
        workspace: PathBuf,
        #[command(flatten)]
        st: StateArg,
    },
    /// Remove snapshot ID.
    Rm {
        /// A live layerfs mountpoint, the upper directory of an unmounted
        /// workspace, or its state dir.
        #[arg(value_name = "WORKSPACE")]
        workspace: PathBuf,
        #[command(flatten)]
        st: StateArg,
        /// The snapshot to remove (`layerfs snapshot list` shows them).
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

fn save(ws_arg: &Path, st: &StateArg, id: Option<&OsStr>, force: bool) -> Result<(), Failed> {
    // Invariant: a bad ID is refused before anything is read or written.
    id.map(snapshot_id::validate).transpose()?;
    let ws = st.resolve(ws_arg)?;
    let progress = std::io::stderr().is_terminal();
    let done = ops::snapshot_save(&ws, id, force, progress, None)?;
    super::warn_all("snapshot save", &done.warnings);
    let info = done.value;
    outln!(
        "saved snapshot {} ({}, {} entries) to {}",
        info.id,
        crate::quote::bytes(info.size),
        info.entries.unwrap_or(0),
        snapshot::path(&ws.state, &info.id).display()
    );
    Ok(())
}

fn restore(ws_arg: &Path, st: &StateArg, id: &OsStr, json: bool) -> Result<(), Failed> {
    snapshot_id::validate(id)?;
    let ws = st.resolve(ws_arg)?;
    let progress = std::io::stderr().is_terminal() && !json;
    let done = ops::snapshot_restore(&ws, id, progress, None)?;
    super::warn_all("snapshot restore", &done.warnings);
    let (info, report) = done.value;
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

fn list(ws_arg: &Path, st: &StateArg, json: bool) -> Result<(), Failed> {
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

fn rm(ws_arg: &Path, st: &StateArg, id: &OsStr) -> Result<(), Failed> {
    let id = snapshot_id::validate(id)?;
    let ws = st.resolve(ws_arg)?;
    snapshot::remove(&ws.dir, id)?;
    outln!("removed snapshot {id}");
    Ok(())
}
