//! `layerfs status [--json] [WORKSPACE]`: what a live mount's daemon says
//! about itself (through its control socket); without WORKSPACE, every
//! layerfs mount this caller can see (from /proc/self/mountinfo and each
//! daemon's registry entry). An unmounted workspace shows its layers and
//! journal from the state directory.

use super::exit::{CliError, Context, Failed};
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::host::mounts;
use crate::layer::fds::Budget;
use crate::state::protocol::{
    Descriptors, JournalHealth, LowerStatus, OpenFiles, Request, Status, Transport, UpperUsage,
    Watches,
};
use crate::state::workspace::{self, Workspace};

const STATUS_HELP: &str = "\
Examples:
  layerfs status                 # every layerfs mount you can see
  layerfs status ~/ws/mnt        # one mount (or its upper directory)
  layerfs status --json ~/ws/mnt

WORKSPACE is a live mountpoint or, for an unmounted workspace, its upper
directory. --json prints one JSON object per workspace, one a line.";

#[derive(Args, Debug)]
#[command(after_help = STATUS_HELP)]
pub struct StatusCmd {
    /// One JSON object per workspace, one a line.
    #[arg(long)]
    json: bool,

    /// A layerfs mountpoint or an upper directory [default: every mount].
    #[arg(value_name = "WORKSPACE")]
    workspace: Option<PathBuf>,

    #[command(flatten)]
    state: super::state_arg::StateArg,
}

impl StatusCmd {
    pub fn run(self) -> Result<(), CliError> {
        // `--state DIR` alone names the workspace by its state dir.
        let arg = self.workspace.as_ref().or(self.state.state.as_ref());
        let reports = match arg {
            Some(w) => vec![one(w, &self.state).or_fail("status")?],
            None => every_mount().or_fail("status")?,
        };
        if self.json {
            for r in &reports {
                outln!("{r}");
            }
        } else if reports.is_empty() {
            outln!("no layerfs mounts");
        } else {
            for (i, r) in reports.iter().enumerate() {
                if i > 0 {
                    outln!();
                }
                let text = render(r);
                outln!("{}", text.strip_suffix('\n').unwrap_or(&text));
            }
        }
        Ok(())
    }
}

/// How long a daemon may take to answer `status`: it answers at once
/// (its own probe of a hung network lower is bounded to half a second).
const STATUS_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Asks the daemon of a live workspace for its status.
fn ask(state: &Path) -> Result<Value, Failed> {
    let mut c = crate::state::workspace::connect(state)?.answer_within(STATUS_WITHIN);
    // Passed on as the daemon sent it: `--json` keeps the fields this
    // client does not know.
    let req = serde_json::to_value(Request::Status).map_err(|e| e.to_string())?;
    let mut v = c.request(&req)?;
    if let Some(o) = v.as_object_mut() {
        o.remove("ok");
        o.insert("mounted".into(), Value::Bool(true));
    }
    Ok(v)
}

fn one(arg: &Path, state: &super::state_arg::StateArg) -> Result<Value, Failed> {
    let abs = std::path::absolute(arg).map_err(|e| format!("{}: {e}", arg.display()))?;
    let canon = std::fs::canonicalize(&abs).unwrap_or(abs.clone());
    if let Some(m) = mounts::find(&canon).or_else(|| mounts::find(&abs)) {
        if is_dead(&m) {
            return Ok(stale(&m));
        }
    }
    let ws = state.resolve(arg)?;
    let mut v = match ws.client() {
        Some(_) => ask(&ws.state)?,
        None => unmounted(&ws),
    };
    // The stack as the state dir has it now (live checkpoints and undos
    // included): the checkpoint layers over the shared lowers.
    if let Ok(Some(stack)) = crate::state::frozen::read(&ws.dir) {
        v["checkpoints"] = json!(stack.effective());
        v["layer_store"] = json!(stack.store.to_string_lossy());
    }
    Ok(v)
}

/// What the state directory says about a workspace nobody serves.
fn unmounted(ws: &Workspace) -> Value {
    let s = |p: &Path| p.to_string_lossy().into_owned();
    json!({
        "mounted": false,
        "mountpoint": null,
        "upper": s(&ws.upper),
        "lowers": ws.lowers.iter().map(|l| s(l)).collect::<Vec<_>>(),
        "work": s(&ws.work),
        "state": s(&ws.state),
        "journal": crate::state::journal::offline_health(&ws.journal_path()),
    })
}

/// Whether the layerfs mount `m` is stale. Only a mount with no live
/// registered daemon is probed: a stat of a live mount whose daemon is
/// stopped would wait for it (`status` must not).
fn is_dead(m: &mounts::MountEntry) -> bool {
    workspace::state_of_mount(&m.mount_point).is_none() && m.is_stale()
}

/// A layerfs mount whose daemon is gone.
fn stale(m: &mounts::MountEntry) -> Value {
    let mp = m.mount_point.to_string_lossy().into_owned();
    json!({
        "mounted": true,
        "stale": true,
        "mountpoint": mp,
        "owner_uid": m.owner_uid(),
        "error": format!(
            "stale: run `layerfs umount {mp}` (its daemon is gone; the mount answers nothing)"
        ),
    })
}

/// Every layerfs mount in this mount namespace; the ones whose daemon
/// cannot be asked say why.
fn every_mount() -> Result<Vec<Value>, String> {
    let list = mounts::list().map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    let mut out = Vec::new();
    for m in list.into_iter().filter(|m| m.is_layerfs()) {
        let mp = m.mount_point.to_string_lossy().into_owned();
        if is_dead(&m) {
            out.push(stale(&m));
            continue;
        }
        let v = match workspace::state_of_mount(&m.mount_point) {
            Some(state) => ask(&state).unwrap_or_else(|e| {
                json!({"mounted": true, "mountpoint": mp, "state": state.to_string_lossy(),
                       "error": e.to_string()})
            }),
            None => json!({
                "mounted": true,
                "mountpoint": mp,
                "owner_uid": m.owner_uid(),
                "error": "no registry entry naming its state dir is readable by you (another \
                          user's mount, a daemon from an older layerfs, or the daemon is gone)",
            }),
        };
        out.push(v);
    }
    Ok(out)
}

/// One workspace as `status` shows it: the daemon's `Status`, or what
/// the state dir says of an unmounted one, or why neither is known
/// (`error`). The `--json` output is the object itself, unknown fields
/// included; the text form reads it through this type.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Report {
    mounted: bool,
    error: Option<String>,
    /// The checkpoint layers, top first, and their store (`status` adds
    /// them from the state dir's stack).
    #[serde(default)]
    checkpoints: Vec<String>,
    layer_store: Option<String>,
    #[serde(flatten)]
    status: Status,
}

/// A value, or "-" when it is unknown.
fn or_dash<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn duration(secs: f64) -> String {
    let s = secs as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// One lower of a live mount: its filesystem, how soon outside changes
/// show, and whether a network lower answers.
fn lower_line(l: &LowerStatus) -> String {
    let mut s = format!("{}: {}", l.path, l.fstype);
    if l.network {
        s.push_str(&format!(
            " from {}, network: changes made elsewhere show within {} ms plus its client's \
             caching",
            l.source,
            l.changes_show_within_ms.unwrap_or(0)
        ));
    } else {
        s.push_str(", local: outside changes show at once (inotify)");
    }
    if l.state == "lost" {
        s.push_str(&format!(
            "; LOST since {} ({}): requests needing it fail with EIO",
            or_dash(l.lost_since.as_deref()),
            or_dash(l.error.as_deref())
        ));
    } else if let Some(n) = l.not_answering_seconds {
        s.push_str(&format!("; NOT ANSWERING for {n} s"));
    }
    s
}

/// The daemon's fds: how many are open of its limit, and the cache's and
/// the pinned files' parts (`layer::fds`).
fn descriptors_line(d: &Descriptors) -> String {
    let part = |b: &Budget| format!("{}/{}", b.open, b.limit);
    format!(
        "{} open of {} (object cache {}, removed files pinned {}, for open files {})",
        or_dash(d.open),
        d.limit,
        part(&d.cache),
        part(&d.pinned),
        d.handle_pool
    )
}

/// Open files per uid, with each one's share and refusals
/// (`overlay::share`): "12: uid 0 4, uid 1001 8/80 (3 refused)".
fn open_files_line(f: &OpenFiles) -> String {
    let mut s = f.open.to_string();
    let users: Vec<String> = f
        .by_uid
        .iter()
        .map(|u| {
            let mut one = format!("uid {} {}", u.uid, u.open);
            if !u.owner {
                one.push_str(&format!("/{}", f.per_user_limit));
            }
            if u.refused > 0 {
                one.push_str(&format!(" ({} refused)", u.refused));
            }
            one
        })
        .collect();
    if !users.is_empty() {
        s.push_str(": ");
        s.push_str(&users.join(", "));
    }
    s
}

/// The inotify watches on lower directories.
fn watches_line(w: &Watches) -> String {
    if !w.enabled {
        return "none (inotify unavailable): lower changes show within --lower-timeout".into();
    }
    let mut s = format!(
        "{} of {} inotify watches on lower directories",
        or_dash(w.used),
        or_dash(w.cap)
    );
    if let Some(n) = w.dirs_over_cap.filter(|n| *n > 0) {
        s.push_str(&format!(
            "; {n} directories beyond the cap show outside changes within --lower-timeout"
        ));
    }
    if w.live == Some(false) {
        s.push_str("; NOT LIVE: every lower change shows within --lower-timeout");
    }
    s
}

/// Bytes and inodes the upper holds, against the quota.
fn usage_line(u: &UpperUsage) -> String {
    let bytes = u.bytes.unwrap_or(0);
    let mut s = format!(
        "{}, {} inodes",
        crate::quote::bytes(bytes),
        or_dash(u.inodes)
    );
    if let Some(q) = u.quota_bytes {
        s.push_str(&format!(
            " (quota {} bytes: {:.0}%)",
            crate::quote::bytes(q),
            100.0 * bytes as f64 / q.max(1) as f64
        ));
    }
    if let Some(q) = u.quota_inodes {
        let n = u.inodes.unwrap_or(0);
        s.push_str(&format!(
            " (quota {q} inodes: {:.0}%)",
            100.0 * n as f64 / q.max(1) as f64
        ));
    }
    s
}

/// How requests reach the daemon.
fn transport_line(t: &Transport) -> String {
    if t.kind == "io_uring" {
        let per_queue = |v: &Option<Vec<u64>>| -> String {
            let v: Vec<String> = v.iter().flatten().map(|n| n.to_string()).collect();
            v.join(" ")
        };
        format!(
            "io_uring, {} queues of {} entries (requests per CPU: {}; answered by the \
             queue threads themselves: {})",
            or_dash(t.queues),
            or_dash(t.entries_per_queue),
            per_queue(&t.ring_requests),
            per_queue(&t.ring_answered)
        )
    } else {
        match &t.io_uring_refused {
            Some(why) => format!("/dev/fuse (io_uring asked for, not used: {why})"),
            None => "/dev/fuse".to_string(),
        }
    }
}

/// The journal: its rows and what it lost, since the mount (a live
/// mount's counters) or over every earlier mount (as its rows record).
fn journal_line(j: &JournalHealth) -> String {
    let rows = or_dash(j.rows);
    let mut s = if j.enabled == Some(false) {
        "off".to_string()
    } else if let Some(dropped) = j.dropped {
        let mut s = format!("{rows} rows");
        if let (Some(b), Some(cap)) = (j.bytes, j.max_bytes) {
            s.push_str(&format!(
                " ({} of {})",
                crate::quote::bytes(b),
                crate::quote::bytes(cap)
            ));
        }
        s.push_str(&format!(", {dropped} dropped"));
        if let Some(t) = j.trimmed.filter(|t| *t > 0) {
            s.push_str(&format!(", {t} trimmed"));
        }
        s
    } else if let Some(lost) = j.dropped_recorded {
        // Unmounted: the sum of the journal's own journal-dropped rows
        // (events lost over every earlier mount, as far as the journal
        // could record the loss).
        let mut s = format!("{rows} rows, {lost} events lost while mounted");
        if let Some(t) = j.trimmed_recorded.filter(|t| *t > 0) {
            s.push_str(&format!(", {t} trimmed"));
        }
        s
    } else {
        format!("{rows} rows")
    };
    if let Some(e) = &j.last_error {
        s.push_str(&format!("; last error: {e}"));
    }
    s
}

/// The text form of one status object.
fn render(v: &Value) -> String {
    let r: Report = match serde_json::from_value(v.clone()) {
        Ok(r) => r,
        Err(e) => Report {
            error: Some(format!("cannot read the status ({e}): {v}")),
            ..Report::default()
        },
    };
    let st = &r.status;
    let mut out = String::new();
    // Every value may hold names a user chose (paths, errors naming
    // files): escaped so none can forge a line or drive the terminal.
    let mut line =
        |k: &str, val: String| out.push_str(&format!("{k:<12} {}\n", crate::quote::visible(&val)));
    line(
        "mountpoint",
        if r.mounted {
            or_dash(st.mountpoint.as_deref())
        } else {
            "(not mounted)".into()
        },
    );
    if let Some(e) = &r.error {
        line("error", e.clone());
        return out;
    }
    line("upper", or_dash(st.upper.as_deref()));
    if let Some(f) = &st.policy_reload_failure {
        line("policy", f.message.clone());
    }
    line("lowers", st.lowers.join(", "));
    if !r.checkpoints.is_empty() {
        line(
            "checkpoints",
            format!(
                "{} (top first, over the shared lowers; store {})",
                r.checkpoints.join(", "),
                or_dash(r.layer_store.as_deref())
            ),
        );
    }
    if let Some(layers) = &st.layers {
        for (i, l) in layers.lowers.iter().enumerate() {
            line(&format!("lower #{}", i + 1), lower_line(l));
        }
        let refused = layers.refused_requests.unwrap_or(0);
        let stalled = layers.stalled_requests.unwrap_or(0);
        if refused + stalled > 0 {
            line(
                "lower I/O",
                format!("{stalled} requests stuck for over 5 s, {refused} refused with ETIMEDOUT"),
            );
        }
    }
    if let Some(w) = &st.watches {
        line("watches", watches_line(w));
    }
    line("state", or_dash(st.state.as_deref()));
    if r.mounted {
        line(
            "pid",
            format!("{}, up {}", or_dash(st.pid), duration(st.uptime_seconds)),
        );
        if st.paused {
            line("writes", "PAUSED".into());
        }
    }
    if let Some(u) = &st.upper_usage {
        line("upper use", usage_line(u));
    }
    if let Some(c) = &st.counters {
        line(
            "activity",
            format!(
                "{} copy-ups, {} denials, {} requests ({} /s)",
                c.copy_ups, c.denials, c.requests, c.requests_per_second
            ),
        );
    }
    if let Some(t) = &st.transport {
        line("transport", transport_line(t));
    }
    if let Some(d) = &st.descriptors {
        line("fds", descriptors_line(d));
    }
    if let Some(f) = &st.open_files {
        line("open files", open_files_line(f));
    }
    if let Some(j) = &st.journal {
        line("journal", journal_line(j));
    }
    out
}
