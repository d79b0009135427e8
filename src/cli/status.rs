//! `layerfs status [--json] [WORKSPACE]`: what a live mount's daemon says
//! about itself (through its control socket); without WORKSPACE, every
//! layerfs mount this caller can see (from /proc/self/mountinfo and each
//! daemon's registry entry). An unmounted workspace shows its layers and
//! journal from the state directory.

use super::exit::{CliError, Context};
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::{json, Value};

use crate::host::mounts;
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
fn ask(state: &Path) -> Result<Value, String> {
    let mut c = crate::state::workspace::connect(state)?.answer_within(STATUS_WITHIN);
    let mut v = c.request(&json!({"cmd": "status"}))?;
    if let Some(o) = v.as_object_mut() {
        o.remove("ok");
        o.insert("mounted".into(), Value::Bool(true));
    }
    Ok(v)
}

fn one(arg: &Path, state: &super::state_arg::StateArg) -> Result<Value, String> {
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
                       "error": e})
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

fn field(v: &Value, k: &str) -> String {
    match v.get(k) {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(x) => x.to_string(),
    }
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
fn lower_line(l: &Value) -> String {
    let mut s = format!("{}: {}", field(l, "path"), field(l, "fstype"));
    if l.get("network").and_then(Value::as_bool) == Some(true) {
        let ms = l
            .get("changes_show_within_ms")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        s.push_str(&format!(
            " from {}, network: changes made elsewhere show within {} ms plus its client's \
             caching",
            field(l, "source"),
            ms
        ));
    } else {
        s.push_str(", local: outside changes show at once (inotify)");
    }
    if l.get("state").and_then(Value::as_str) == Some("lost") {
        s.push_str(&format!(
            "; LOST since {} ({}): requests needing it fail with EIO",
            field(l, "lost_since"),
            field(l, "error")
        ));
    } else if let Some(n) = l.get("not_answering_seconds").and_then(Value::as_u64) {
        s.push_str(&format!("; NOT ANSWERING for {n} s"));
    }
    s
}

/// The daemon's fds: how many are open of its limit, and the cache's and
/// the pinned files' parts (`layer::fds`).
fn descriptors_line(d: &Value) -> String {
    let part = |k: &str| {
        let p = &d[k];
        format!("{}/{}", field(p, "open"), field(p, "limit"))
    };
    format!(
        "{} open of {} (object cache {}, removed files pinned {}, for open files {})",
        field(d, "open"),
        field(d, "limit"),
        part("cache"),
        part("pinned"),
        field(d, "handle_pool")
    )
}

/// Open files per uid, with each one's share and refusals
/// (`overlay::share`): "12: uid 0 4, uid 1001 8/80 (3 refused)".
fn open_files_line(f: &Value) -> String {
    let mut s = field(f, "open");
    let per_user = field(f, "per_user_limit");
    let users: Vec<String> = f["by_uid"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|u| {
                    let mut one = format!("uid {} {}", field(u, "uid"), field(u, "open"));
                    if u["owner"] != Value::Bool(true) {
                        one.push_str(&format!("/{per_user}"));
                    }
                    if u["refused"].as_u64().unwrap_or(0) > 0 {
                        one.push_str(&format!(" ({} refused)", field(u, "refused")));
                    }
                    one
                })
                .collect()
        })
        .unwrap_or_default();
    if !users.is_empty() {
        s.push_str(": ");
        s.push_str(&users.join(", "));
    }
    s
}

/// The text form of one status object.
fn render(v: &Value) -> String {
    let mut out = String::new();
    // Every value may hold names a user chose (paths, errors naming
    // files): escaped so none can forge a line or drive the terminal.
    let mut line =
        |k: &str, val: String| out.push_str(&format!("{k:<12} {}\n", crate::quote::visible(&val)));
    let mounted = v.get("mounted").and_then(Value::as_bool).unwrap_or(false);
    line(
        "mountpoint",
        if mounted {
            field(v, "mountpoint")
        } else {
            "(not mounted)".into()
        },
    );
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        line("error", e.to_string());
        return out;
    }
    line("upper", field(v, "upper"));
    if let Some(m) = v
        .pointer("/policy_reload_failure/message")
        .and_then(Value::as_str)
    {
        line("policy", m.to_string());
    }
    if let Some(ls) = v.get("lowers").and_then(Value::as_array) {
        let ls: Vec<String> = ls
            .iter()
            .filter_map(|l| l.as_str().map(String::from))
            .collect();
        line("lowers", ls.join(", "));
    }
    if let Some(cs) = v.get("checkpoints").and_then(Value::as_array) {
        let cs: Vec<&str> = cs.iter().filter_map(Value::as_str).collect();
        line(
            "checkpoints",
            format!(
                "{} (top first, over the shared lowers; store {})",
                cs.join(", "),
                field(v, "layer_store")
            ),
        );
    }
    if let Some(ls) = v.pointer("/layers/lowers").and_then(Value::as_array) {
        for (i, l) in ls.iter().enumerate() {
            line(&format!("lower #{}", i + 1), lower_line(l));
        }
        let refused = v
            .pointer("/layers/refused_requests")
            .and_then(Value::as_u64);
        let stalled = v
            .pointer("/layers/stalled_requests")
            .and_then(Value::as_u64);
        if refused.unwrap_or(0) + stalled.unwrap_or(0) > 0 {
            line(
                "lower I/O",
                format!(
                    "{} requests stuck for over 5 s, {} refused with ETIMEDOUT",
                    stalled.unwrap_or(0),
                    refused.unwrap_or(0)
                ),
            );
        }
    }
    if let Some(w) = v.get("watches").filter(|w| !w.is_null()) {
        let s = if w.get("enabled").and_then(Value::as_bool) == Some(true) {
            let mut s = format!(
                "{} of {} inotify watches on lower directories",
                field(w, "used"),
                field(w, "cap")
            );
            if let Some(n) = w
                .get("dirs_over_cap")
                .and_then(Value::as_u64)
                .filter(|n| *n > 0)
            {
                s.push_str(&format!(
                    "; {n} directories beyond the cap show outside changes within \
                     --lower-timeout"
                ));
            }
            if w.get("live").and_then(Value::as_bool) == Some(false) {
                s.push_str("; NOT LIVE: every lower change shows within --lower-timeout");
            }
            s
        } else {
            "none (inotify unavailable): lower changes show within --lower-timeout".into()
        };
        line("watches", s);
    }
    line("state", field(v, "state"));
    if mounted {
        let up = v
            .get("uptime_seconds")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        line("pid", format!("{}, up {}", field(v, "pid"), duration(up)));
        if v.get("paused").and_then(Value::as_bool) == Some(true) {
            line("writes", "PAUSED".into());
        }
    }
    if let Some(u) = v.get("upper_usage") {
        let bytes = u.get("bytes").and_then(Value::as_u64).unwrap_or(0);
        let mut s = format!(
            "{}, {} inodes",
            crate::quote::bytes(bytes),
            field(u, "inodes")
        );
        if let Some(q) = u.get("quota_bytes").and_then(Value::as_u64) {
            s.push_str(&format!(
                " (quota {} bytes: {:.0}%)",
                crate::quote::bytes(q),
                100.0 * bytes as f64 / q.max(1) as f64
            ));
        }
        if let Some(q) = u.get("quota_inodes").and_then(Value::as_u64) {
            let n = u.get("inodes").and_then(Value::as_u64).unwrap_or(0);
            s.push_str(&format!(
                " (quota {q} inodes: {:.0}%)",
                100.0 * n as f64 / q.max(1) as f64
            ));
        }
        line("upper use", s);
    }
    if let Some(c) = v.get("counters") {
        line(
            "activity",
            format!(
                "{} copy-ups, {} denials, {} requests ({} /s)",
                field(c, "copy_ups"),
                field(c, "denials"),
                field(c, "requests"),
                field(c, "requests_per_second")
            ),
        );
    }
    if let Some(t) = v.get("transport").filter(|t| !t.is_null()) {
        let s = if t.get("kind").and_then(Value::as_str) == Some("io_uring") {
            let per_queue: Vec<String> = t
                .get("ring_requests")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(|n| n.to_string()).collect())
                .unwrap_or_default();
            format!(
                "io_uring, {} queues of {} entries (requests per CPU: {})",
                field(t, "queues"),
                field(t, "entries_per_queue"),
                per_queue.join(" ")
            )
        } else {
            match t.get("io_uring_refused").and_then(Value::as_str) {
                Some(why) => format!("/dev/fuse (io_uring asked for, not used: {why})"),
                None => "/dev/fuse".to_string(),
            }
        };
        line("transport", s);
    }
    if let Some(d) = v.get("descriptors").filter(|d| !d.is_null()) {
        line("fds", descriptors_line(d));
    }
    if let Some(f) = v.get("open_files").filter(|f| !f.is_null()) {
        line("open files", open_files_line(f));
    }
    if let Some(j) = v.get("journal").filter(|j| !j.is_null()) {
        let mut s = if j.get("enabled").and_then(Value::as_bool) == Some(false) {
            "off".to_string()
        } else {
            match (j.get("dropped"), j.get("dropped_recorded")) {
                (Some(d), _) if !d.is_null() => {
                    let mut s = format!("{} rows", field(j, "rows"));
                    if let (Some(b), Some(cap)) = (
                        j.get("bytes").and_then(Value::as_u64),
                        j.get("max_bytes").and_then(Value::as_u64),
                    ) {
                        s.push_str(&format!(
                            " ({} of {})",
                            crate::quote::bytes(b),
                            crate::quote::bytes(cap)
                        ));
                    }
                    s.push_str(&format!(", {} dropped", field(j, "dropped")));
                    if let Some(t) = j.get("trimmed").and_then(Value::as_u64).filter(|t| *t > 0) {
                        s.push_str(&format!(", {t} trimmed"));
                    }
                    s
                }
                // Unmounted: the sum of the journal's own journal-dropped
                // rows (events lost over every earlier mount, as far as
                // the journal could record the loss).
                (_, Some(d)) if !d.is_null() => {
                    let mut s = format!(
                        "{} rows, {} events lost while mounted",
                        field(j, "rows"),
                        field(j, "dropped_recorded")
                    );
                    if let Some(t) = j
                        .get("trimmed_recorded")
                        .and_then(Value::as_u64)
                        .filter(|t| *t > 0)
                    {
                        s.push_str(&format!(", {t} trimmed"));
                    }
                    s
                }
                _ => format!("{} rows", field(j, "rows")),
            }
        };
        if let Some(e) = j.get("last_error").and_then(Value::as_str) {
            s.push_str(&format!("; last error: {e}"));
        }
        line("journal", s);
    }
    out
}
