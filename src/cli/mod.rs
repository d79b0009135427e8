//! Command line: the clap definition of `layerfs` and dispatch to one file
//! per subcommand. Exit codes: 0 ok, 1 runtime failure, 2 usage error.

/// `println!` for the output of a command: a closed pipe (`layerfs log |
/// head -1`) ends the command quietly with status 0 (`out_line`). The one
/// way commands print their results; `diff` writes through its own
/// buffered writer with the same rule.
macro_rules! outln {
    () => {
        $crate::cli::out_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::cli::out_line(format_args!($($arg)*))
    };
}

mod checkpoint;
mod completions;
mod diff;
mod exit;
mod fs;
mod gc;
mod install;
mod instance;
mod log;
mod man;
mod mount;
pub mod mount_helper;
mod policy;
mod reset;
mod run;
mod serve;
mod snapshot;
mod state_arg;
mod status;
mod umount;

use std::io::IsTerminal;

use clap::{Parser, Subcommand};

use crate::daemon::logging;

const ABOUT: &str =
    "A copy-on-write union filesystem (FUSE) with a path policy, for agent workspaces";

const LONG_ABOUT: &str = "\
layerfs mounts a writable, per-user UPPER directory over one or more shared, \
read-only LOWER directories. Reads come from the highest layer that has a file; \
every change lands in the upper, in the format kernel overlayfs uses, so the \
lowers are never modified. A policy file can hide paths, make them read-only, \
or protect shared files from deletion; the filesystem enforces it for every tool.";

const EXAMPLES: &str = "\
Examples:
  # mount, use, unmount
  layerfs mount --lower /srv/shared --upper ~/ws/upper ~/ws/mnt
  echo hi > ~/ws/mnt/new.txt          # lands in ~/ws/upper/new.txt
  layerfs umount ~/ws/mnt

  # kernel-overlay style options, two lowers (first is topmost)
  layerfs mount -o lowerdir=/srv/team:/srv/base,upperdir=/ws/up,workdir=/ws/work /ws/mnt

  # run a command in a throwaway, sandboxed copy of the shared tree
  layerfs run --lower /srv/shared --ephemeral --json -- make test

  # check a policy and ask which rule decides a path
  layerfs policy check policy.txt
  layerfs policy explain policy.txt skills/deploy.md";

#[derive(Parser, Debug)]
#[command(
    name = "layerfs",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = EXAMPLES,
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the mount variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Mount a union of lower layers and an upper directory.
    Mount(mount::MountCmd),
    /// Unmount a layerfs mountpoint and wait for its daemon to exit.
    Umount(umount::UmountCmd),
    /// Check a policy file or explain what it says about a path.
    #[command(subcommand)]
    Policy(policy::PolicyCmd),
    /// Show what a workspace changed against its shared lowers.
    Diff(diff::DiffCmd),
    /// Discard a workspace's changes under some paths.
    Reset(reset::ResetCmd),
    /// Empty a workspace's scratch paths.
    Gc(gc::GcCmd),
    /// Save, restore, list or remove snapshots of a workspace's upper.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCmd),
    /// Show the change journal of a workspace.
    Log(log::LogCmd),
    /// Freeze a workspace's upper into a layer; list or remove checkpoints.
    Checkpoint(checkpoint::CheckpointCmd),
    /// Mount a new workspace branched from a checkpoint (nothing copied).
    Fork(checkpoint::ForkCmd),
    /// Take a workspace back to a checkpoint.
    Undo(checkpoint::UndoCmd),
    /// Merge a workspace's oldest checkpoint layers into one.
    Squash(checkpoint::SquashCmd),
    /// Show live mounts: layers, state dir, daemon, usage, journal health.
    Status(status::StatusCmd),
    /// Link /sbin/mount.fuse.layerfs to this binary, for mount(8) and fstab.
    InstallHelpers(install::InstallCmd),
    /// Write the manual pages (sections 1, 5 and 8) into a directory.
    Man(man::ManCmd),
    /// Print the completion script for bash, zsh, fish, elvish or powershell.
    Completions(completions::CompletionsCmd),
    /// Run a command in a sandboxed workspace; report its output and exit code.
    Run(run::RunCmd),
    /// The agent file tools on a workspace, mounted or not (no FUSE needed).
    #[command(subcommand)]
    Fs(fs::FsCmd),
    /// Serve the agent file tools over MCP (stdio, or a Unix socket).
    Serve(serve::ServeCmd),
    /// Internal: the sandbox process `layerfs run` starts.
    #[command(name = "__sandbox", hide = true)]
    Sandbox(crate::sandbox::Spec),
}

/// Runs the command line; returns the process exit code.
pub fn run() -> i32 {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if mount_helper::invoked_as_helper(argv.first()) {
        return mount_helper::run();
    }
    let cli = match Cli::try_parse_from(&argv) {
        Ok(c) => c,
        Err(e) => {
            let code = exit::clap_outcome(&e, &command_path(&argv));
            if e.kind() == clap::error::ErrorKind::InvalidSubcommand {
                if let Some(hint) = mount_helper::mount_fuse3_hint(&argv) {
                    eprintln!("note: {hint}");
                }
            }
            return code;
        }
    };
    let logs_to_terminal = match &cli.command {
        Command::Mount(m) => m.logs_to_terminal(),
        _ => true,
    };
    let ansi = logs_to_terminal && std::io::stderr().is_terminal();
    match &cli.command {
        // In-process tools and `run` (whose daemon logs to its own file)
        // show only warnings on the terminal.
        Command::Fs(_) | Command::Serve(_) | Command::Run(_) => logging::init_with(ansi, "warn"),
        _ => logging::init(ansi),
    }
    exit::finish(match cli.command {
        Command::Mount(m) => m.run(),
        Command::Umount(u) => exit::done(u.run()),
        Command::Policy(p) => p.run(),
        Command::Diff(d) => exit::done(d.run()),
        Command::Reset(r) => exit::done(r.run()),
        Command::Gc(g) => exit::done(g.run()),
        Command::Snapshot(s) => exit::done(s.run()),
        Command::Status(s) => exit::done(s.run()),
        Command::Log(l) => exit::done(l.run()),
        Command::Checkpoint(c) => c.run(),
        Command::Fork(f) => f.run(),
        Command::Undo(u) => exit::done(u.run()),
        Command::Squash(s) => exit::done(s.run()),
        Command::InstallHelpers(i) => exit::done(i.run()),
        Command::Man(m) => exit::done(m.run()),
        Command::Completions(c) => exit::done(c.run()),
        Command::Run(r) => Ok(r.run()),
        Command::Fs(f) => exit::done(f.run()),
        Command::Serve(s) => exit::done(s.run()),
        Command::Sandbox(s) => Ok(s.run()),
    })
}

/// The subcommand an argument list names, as errors name it (`snapshot
/// save`), or "" before one is recognised.
fn command_path(argv: &[std::ffi::OsString]) -> String {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let mut names = Vec::new();
    for a in argv.iter().skip(1).filter_map(|a| a.to_str()) {
        if a.starts_with('-') {
            continue;
        }
        let Some(sub) = cmd.find_subcommand(a).cloned() else {
            break;
        };
        names.push(sub.get_name().to_string());
        cmd = sub;
    }
    names.join(" ")
}

/// Prints a command's error (`layerfs CMD: …`) with every character a
/// terminal would act on escaped (`crate::quote::visible`): errors name
/// paths, and a path's name is whoever created it's choice.
pub(crate) fn print_error(cmd: &str, e: impl std::fmt::Display) {
    eprintln!(
        "{}: {}",
        exit::prefix(cmd),
        crate::quote::visible(&e.to_string())
    );
}

/// Leaves the trace of an undo operation that succeeded (`reset`, `gc`,
/// `snapshot save`/`restore`) in the workspace's journal, so `log`
/// explains every change of the upper; a journal that cannot be written
/// is a warning, never a failure of the operation already done.
pub(crate) fn journal_undo(
    cmd: &str,
    ws: &crate::state::workspace::Workspace,
    op: crate::overlay::events::EvOp,
    what: &str,
    entries: u64,
) {
    if let Err(e) = crate::state::journal::record_undo(&ws.journal_path(), op, what, entries) {
        print_error(cmd, format!("warning: not recorded in the journal: {e}"));
    }
}

/// Prints what a state operation warns of after it was done
/// (`state::ops::Done`): each line `layerfs CMD: WARNING` on stderr.
pub(crate) fn warn_all(cmd: &str, warnings: &[String]) {
    for w in warnings {
        print_error(cmd, w);
    }
}

/// Writes one line of a command's output to stdout. A reader that went
/// away (EPIPE: `| head`) ends the process quietly with status 0: what was
/// wanted has been read. Any other write error ends it with status 1 and a
/// message. Only for commands that print (never the daemon, which must
/// outlive its clients).
pub(crate) fn out_line(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let r = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    match r {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            print_error("output", format!("cannot write to stdout: {e}"));
            std::process::exit(exit::EXIT_FAILURE)
        }
    }
}
