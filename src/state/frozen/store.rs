//! A layer store: each frozen layer's directory, its record and its
//! holds, and what dead processes left aside (see the module above for
//! the format and its invariants).

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::*;
use crate::layer::safedir::{Role, SafeDir};

/// A checkpoint's record, `NAME.json` in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub name: String,
    /// The layers below it, topmost first: its stack is itself and these.
    pub below: Vec<String>,
    /// The shared lowers it was taken over, topmost first.
    pub lowers: Vec<PathBuf>,
    /// Unix time it was taken.
    pub created: i64,
    /// The upper it was frozen from.
    pub upper: PathBuf,
    /// For a layer `layerfs squash` made: the layers it replaced (removed
    /// after the switch; `state::squash`).
    pub squashed: Vec<String>,
    /// For a layer `layerfs squash` made: every checkpoint it holds, the
    /// layers it replaced and those they held in turn, so origin records
    /// naming any of them still find it (`frozen::origins`). Kept apart
    /// from `squashed`: only those are removed after a squash.
    pub includes: Vec<String>,
}

impl Record {
    /// Its stack: itself and the layers below it, topmost first.
    pub fn stack(&self) -> Vec<String> {
        std::iter::once(self.name.clone())
            .chain(self.below.iter().cloned())
            .collect()
    }

    /// The checkpoints merged into this layer (`includes`; for a layer
    /// squashed before that was written, `squashed`).
    pub fn holds(&self) -> Vec<String> {
        let mut all = self.includes.clone();
        for n in &self.squashed {
            if !all.contains(n) {
                all.push(n.clone());
            }
        }
        all
    }
}

/// The valid layer names in the list `v` (none when it is no list).
fn valid_names(v: &serde_json::Value) -> Vec<String> {
    names(v)
        .unwrap_or_default()
        .into_iter()
        .filter(|n| crate::state::snapshot_id::validate(OsStr::new(n)).is_ok())
        .collect()
}

/// A layer store, opened checked (`SafeDir`, role `Layers`).
pub struct Store {
    pub dir: SafeDir,
}

fn record_file(name: &str) -> String {
    format!("{name}.json")
}

fn holds_dir(name: &str) -> String {
    format!("{name}.holds")
}

/// The store's lock file (`Store::lock_for_fork`, `Store::remove_unused`).
const LOCK_FILE: &str = ".lock";

/// How long a removal waits for the forks in progress to place their
/// stacks (each takes milliseconds) before it gives up and says so.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A `flock` on the store's lock file, released when dropped (and when
/// its process dies: a fork killed midway never holds the store). A fork
/// holds it shared, a removal exclusive (see `Store::lock_for_fork`).
pub struct StoreLock {
    _file: std::fs::File,
}

/// The record of a checkpoint not yet on its workspace's stack.
fn pending_file(name: &str) -> String {
    format!(".{name}.pending.json")
}

/// The checkpoint a `pending_file` is for; `None` for any other name.
fn pending_name(file: &str) -> Option<&str> {
    file.strip_prefix('.')?
        .strip_suffix(".pending.json")
        .filter(|n| crate::state::snapshot_id::validate(OsStr::new(n)).is_ok())
}

impl Store {
    /// Opens the store at `path`, creating it (0700) when `create`.
    pub fn open(path: &Path, create: bool) -> Result<Store, StackError> {
        let dir = if create {
            SafeDir::create(path, Role::Layers, 0o700).map(|(d, _)| d)?
        } else {
            SafeDir::open(path, Role::Layers)?.ok_or_else(|| {
                StackError::Refused(format!("layer store {} does not exist", path.display()))
            })?
        };
        Ok(Store { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Whether `name` is taken (a layer, a record of one, or a checkpoint
    /// being taken under that name).
    pub fn taken(&self, name: &str) -> bool {
        self.dir.stat(name).is_ok()
            || self.dir.stat(record_file(name)).is_ok()
            || self.dir.stat(pending_file(name)).is_ok()
    }

    /// The name a new layer takes: `given`, checked (a valid name not
    /// taken in this store, else an error saying so), or a fresh one.
    pub fn new_name(&self, given: Option<&str>) -> Result<String, StackError> {
        let Some(n) = given else {
            return Ok(crate::state::snapshot_id::generate(|n| self.taken(n)));
        };
        let n = crate::state::snapshot_id::validate_as(OsStr::new(n), "checkpoint name")
            .map_err(|e| StackError::Refused(e.to_string()))?;
        if self.taken(n) {
            return Err(StackError::Refused(format!(
                "checkpoint {n} exists already in {}; choose another name",
                self.path().display()
            )));
        }
        Ok(n.to_string())
    }

    /// Publishes the layer built aside as `tmp` under `name`: one rename
    /// that never replaces (a layer appears whole or not at all), made
    /// durable.
    pub fn place(&self, tmp: &str, name: &str) -> Result<(), StackError> {
        crate::layer::sys::renameat2(
            &self.dir,
            OsStr::new(tmp),
            &self.dir,
            OsStr::new(name),
            crate::layer::sys::RENAME_NOREPLACE,
        )
        .map_err(io_ctx(format!(
            "cannot rename {} to {}",
            self.dir.shown(tmp).display(),
            self.dir.shown(name).display()
        )))?;
        self.dir
            .sync()
            .map_err(io_ctx(format!("cannot sync {}", self.path().display())))
    }

    /// The record of checkpoint `name`, whose layer must be here too; an
    /// error pointing at `checkpoint list` otherwise.
    pub fn checkpoint(&self, name: &str) -> Result<Record, StackError> {
        self.record(name)?
            .filter(|_| self.has_layer(name))
            .ok_or_else(|| {
                StackError::Refused(format!(
                    "no checkpoint {name} in {}; see layerfs checkpoint list",
                    self.path().display()
                ))
            })
    }

    /// Whether the layer directory `name` exists.
    pub fn has_layer(&self, name: &str) -> bool {
        self.dir
            .stat(name)
            .is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFDIR)
    }

    /// The record of `name`; `None` when it has none (a checkpoint being
    /// taken has none yet: see `pending`).
    pub fn record(&self, name: &str) -> Result<Option<Record>, StackError> {
        self.read_record(name, &record_file(name))
    }

    /// The record of `name` in the file `file` of the store.
    fn read_record(&self, name: &str, file: &str) -> Result<Option<Record>, StackError> {
        // A power cut before a deferred checkpoint was synced may leave
        // its record's name without its data: as if it had none.
        if self.dir.stat(file).is_ok_and(|s| s.st_size == 0) {
            return Ok(None);
        }
        let Some(j) = read_json(&self.dir, file)? else {
            return Ok(None);
        };
        let (v, bad) = (&j.value, |why: &str| j.bad(why));
        let below = names(&v["below"]).ok_or_else(|| bad("no \"below\" list"))?;
        for n in &below {
            crate::state::snapshot_id::validate(OsStr::new(n)).map_err(|e| bad(&e.to_string()))?;
        }
        Ok(Some(Record {
            name: name.to_string(),
            below,
            lowers: names(&v["lowers"])
                .ok_or_else(|| bad("no \"lowers\" list"))?
                .into_iter()
                .map(PathBuf::from)
                .collect(),
            created: v["created"].as_i64().unwrap_or(0),
            upper: PathBuf::from(v["upper"].as_str().unwrap_or_default()),
            squashed: valid_names(&v["squashed"]),
            includes: valid_names(&v["includes"]),
        }))
    }

    /// Writes the record of a layer (atomically), durable when it returns.
    pub fn write_record(&self, r: &Record) -> Result<(), StackError> {
        self.put_record(r, &record_file(&r.name), true)
    }

    /// Writes the record of a checkpoint being taken as pending
    /// (`.NAME.pending.json`): it takes the name, but the checkpoint is
    /// no one's until `publish` (see `state::checkpoint::settle` for what
    /// becomes of one a crash left). `synced`: durable when it returns;
    /// else `sync_layer` makes it durable after (a deferred checkpoint).
    pub fn write_pending(&self, r: &Record, synced: bool) -> Result<(), StackError> {
        self.put_record(r, &pending_file(&r.name), synced)
    }

    /// Whether `name` is a checkpoint being taken, or left pending by a
    /// crash (`write_pending`).
    pub fn is_pending(&self, name: &str) -> bool {
        self.dir.stat(pending_file(name)).is_ok()
    }

    /// The checkpoints being taken, or left pending by a crash: their
    /// records (`write_pending`). Unreadable ones are skipped.
    pub fn pending(&self) -> Vec<Record> {
        let Ok(entries) = self.dir.read_dir() else {
            return Vec::new();
        };
        entries
            .iter()
            .filter_map(|e| {
                let file = e.name.to_str()?;
                let name = pending_name(file)?;
                self.read_record(name, file).ok().flatten()
            })
            .collect()
    }

    /// Makes the pending checkpoint `name` a checkpoint: its record
    /// renamed to `NAME.json` (durable at the store's next fsync). Done
    /// when the record is there already (a crash after the rename).
    pub fn publish(&self, name: &str) -> Result<(), StackError> {
        match self.dir.rename(pending_file(name), record_file(name), 0) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && self.record(name)?.is_some() => Ok(()),
            r => r.map_err(io_ctx(format!(
                "cannot rename {} to {}",
                self.dir.shown(pending_file(name)).display(),
                self.dir.shown(record_file(name)).display()
            ))),
        }
    }

    /// Removes the pending checkpoint `name`, which no stack names: its
    /// layer directory, holds, then its pending record (last: an
    /// interrupted removal is found and finished again).
    pub fn discard(&self, name: &str) -> Result<(), StackError> {
        let gone = |r: io::Result<()>| match r {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
        let what = || {
            format!(
                "cannot remove pending checkpoint {}",
                self.dir.shown(name).display()
            )
        };
        for n in [name.to_string(), holds_dir(name)] {
            gone(crate::layer::walk::remove_tree(&self.dir, OsStr::new(&n)))
                .map_err(io_ctx(what()))?;
        }
        gone(self.dir.remove_file(pending_file(name))).map_err(io_ctx(what()))?;
        self.dir.sync().map_err(io_ctx(what()))
    }

    fn put_record(&self, r: &Record, file: &str, synced: bool) -> Result<(), StackError> {
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let v = json!({
            "name": r.name,
            "below": r.below,
            "lowers": r.lowers.iter().map(|p| s(p)).collect::<Vec<_>>(),
            "created": r.created,
            "upper": s(&r.upper),
        });
        let mut v = v;
        if !r.squashed.is_empty() {
            v["squashed"] = json!(r.squashed);
        }
        if !r.includes.is_empty() {
            v["includes"] = json!(r.includes);
        }
        let mut text = serde_json::to_string_pretty(&v).unwrap_or_default();
        text.push('\n');
        let written = if synced {
            self.dir.replace_file(file, text.as_bytes())
        } else {
            self.dir.replace_file_unsynced(file, text.as_bytes())
        };
        written.map_err(io_ctx(format!(
            "cannot write {}",
            self.dir.shown(file).display()
        )))
    }

    /// Makes what `write_pending`, `publish`, `hold_unsynced` and the
    /// layer's directory put in the store durable: the record's data, the
    /// holds' names, the layer's and the record's names. A layer removed
    /// since (an undo went past it) has nothing left to sync.
    pub fn sync_layer(&self, name: &str) -> Result<(), StackError> {
        let gone = |r: io::Result<()>| match r {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
        let what = || format!("cannot sync layer {}", self.dir.shown(name).display());
        gone(
            self.dir
                .open_file(record_file(name), libc::O_RDONLY, 0)
                .and_then(|f| f.sync_all()),
        )
        .map_err(io_ctx(what()))?;
        if let Ok(Some(holds)) = self.dir.subdir(&holds_dir(name), Role::Layers, None) {
            gone(holds.sync()).map_err(io_ctx(what()))?;
        }
        self.dir.sync().map_err(io_ctx(what()))
    }

    /// Notes that the workspace whose state dir is `state` stacks on
    /// `name` (a symlink `NAME.holds/DEV-INO` to the state dir), durably.
    pub fn hold(&self, name: &str, state: &SafeDir) -> Result<(), StackError> {
        match self.hold_unsynced(name, state)? {
            Some(holds) => holds
                .sync()
                .map_err(io_ctx(format!("cannot sync {}", holds.path().display()))),
            None => Ok(()),
        }
    }

    /// `hold` without the fsync: returns the holds directory when a link
    /// was made in it (the caller fsyncs it before anything depends on
    /// the hold being durable), `None` when the hold was there already.
    pub fn hold_unsynced(
        &self,
        name: &str,
        state: &SafeDir,
    ) -> Result<Option<SafeDir>, StackError> {
        let holds = self
            .dir
            .subdir(&holds_dir(name), Role::Layers, Some(0o700))?
            .ok_or_else(|| StackError::Refused(format!("cannot create holds of {name}")))?;
        let (dev, ino) = state.id();
        let link = format!("{dev:x}-{ino:x}");
        match crate::layer::sys::symlinkat(state.path().as_os_str(), &holds, OsStr::new(&link)) {
            Ok(()) => Ok(Some(holds)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(io_ctx(format!(
                "cannot record a hold in {}",
                holds.path().display()
            ))(e)),
        }
    }

    /// Who stacks on `name`: the state dirs of the workspaces whose stack
    /// holds it (a hold whose workspace no longer stacks on it is
    /// removed), and the layers whose base holds it. `except` (a state
    /// dir) is not counted. A fork in progress has holds and no stack
    /// yet: only under the store's lock taken exclusive
    /// (`remove_unused`) are stale holds told from it.
    pub fn users(&self, name: &str, except: Option<&SafeDir>) -> Result<Vec<String>, StackError> {
        let mut users = Vec::new();
        if let Ok(Some(holds)) = self.dir.subdir(&holds_dir(name), Role::Layers, None) {
            for e in holds.read_dir().unwrap_or_default() {
                let Ok(target) = std::fs::read_link(holds.fd_path(&e.name)) else {
                    continue;
                };
                let live = match SafeDir::open(&target, Role::State) {
                    Ok(Some(d)) => {
                        if except.is_some_and(|x| *x == d) {
                            continue;
                        }
                        match read(&d) {
                            Ok(Some(s)) => {
                                s.store == self.path()
                                    && (s.layers.iter().any(|l| l == name)
                                        || s.effective().iter().any(|l| l == name))
                            }
                            Ok(None) => false,
                            Err(_) => true,
                        }
                    }
                    Ok(None) => false,
                    // Another user's workspace: it may stack on it.
                    Err(_) => true,
                };
                if live {
                    users.push(format!("workspace {}", target.display()));
                } else {
                    let _ = holds.remove_file(&e.name);
                }
            }
        }
        for e in self.dir.read_dir().map_err(io_ctx(format!(
            "cannot list layer store {}",
            self.path().display()
        )))? {
            let n = e.name.to_string_lossy();
            let Some(layer) = n.strip_suffix(".json") else {
                continue;
            };
            if layer.starts_with('.') || layer == name || !self.has_layer(layer) {
                continue;
            }
            if let Ok(Some(r)) = self.record(layer) {
                if r.below.iter().any(|b| b == name) {
                    users.push(format!("checkpoint {layer}"));
                }
            }
        }
        Ok(users)
    }

    /// Taken by a fork from before it looks up and holds its layers until
    /// its stack is in place (`checkpoint::StagedFork::place`). Between
    /// the two its holds name a state dir with no stack, which `users`
    /// alone would take for a stale hold; and a layer it found may be
    /// removed before its hold is made. Removals take the lock exclusive
    /// (`remove_unused`), so they see no fork half made. Forks share it.
    pub fn lock_for_fork(&self) -> Result<StoreLock, StackError> {
        let file = self.lock_file()?;
        crate::sys::flock(&file, libc::LOCK_SH).map_err(io_ctx(self.lock_what()))?;
        Ok(StoreLock { _file: file })
    }

    /// Removes the layer `name` if nothing stacks on it; returns who does
    /// otherwise (`users`, `except` not counted). Decided and done under
    /// the store's lock taken exclusive (`lock_for_fork`): waits for the
    /// forks in progress to place their stacks, up to `LOCK_WAIT`.
    pub fn remove_unused(
        &self,
        name: &str,
        except: Option<&SafeDir>,
    ) -> Result<Vec<String>, StackError> {
        let file = self.lock_file()?;
        let start = std::time::Instant::now();
        loop {
            match crate::sys::flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
                Ok(()) => break,
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                    if start.elapsed() > LOCK_WAIT {
                        return Err(StackError::Refused(format!(
                            "cannot remove layer {name}: forks of the layer store {} are \
                             still placing their stacks after {} s (a fork's daemon \
                             stuck in its start?); try again once they are mounted",
                            self.path().display(),
                            LOCK_WAIT.as_secs()
                        )));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(e) => return Err(io_ctx(self.lock_what())(e)),
            }
        }
        let users = self.users(name, except)?;
        if users.is_empty() {
            self.remove(name)?;
        }
        Ok(users)
    }

    fn lock_file(&self) -> Result<std::fs::File, StackError> {
        self.dir
            .open_file(
                LOCK_FILE,
                libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
                0o600,
            )
            .map_err(io_ctx(self.lock_what()))
    }

    fn lock_what(&self) -> String {
        format!("cannot lock {}", self.dir.shown(LOCK_FILE).display())
    }

    /// Removes the layer `name`: its directory, record and holds (the
    /// caller made sure nothing stacks on it, under the store's lock:
    /// `remove_unused`; or made it and nobody could fork it yet). The record goes last, so
    /// an interrupted removal leaves the name taken and `rm` can finish it.
    pub fn remove(&self, name: &str) -> Result<(), StackError> {
        let gone = |r: io::Result<()>| match r {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
        let what = || format!("cannot remove layer {}", self.dir.shown(name).display());
        for n in [name.to_string(), holds_dir(name)] {
            gone(crate::layer::walk::remove_tree(&self.dir, OsStr::new(&n)))
                .map_err(io_ctx(what()))?;
        }
        gone(self.dir.remove_file(record_file(name))).map_err(io_ctx(what()))?;
        self.dir.sync().map_err(io_ctx(what()))
    }

    /// The name of a directory process `pid` builds aside in the store
    /// for `label` (a checkpoint's name, or `view`) while it runs: an
    /// `import`, an `export` or the view a `diff` compares. The next
    /// `sweep_aside` removes it once that process is dead.
    pub fn aside_name(label: &str, pid: u32, kind: &str) -> String {
        debug_assert!(ASIDE.contains(&kind));
        format!(".{label}.{pid}.{kind}")
    }

    /// Removes what processes that died left aside in the store
    /// (`aside_name`: an interrupted import, export or diff), never what a
    /// live process owns (its pid runs; a pid reused since only delays
    /// the removal). Best effort; returns the names removed.
    pub fn sweep_aside(&self) -> Vec<String> {
        let Ok(entries) = self.dir.read_dir() else {
            return Vec::new();
        };
        let mut gone = Vec::new();
        for e in entries {
            let Some(n) = e.name.to_str() else { continue };
            let Some(pid) = aside_pid(n) else { continue };
            if pid_alive(pid) {
                continue;
            }
            if crate::layer::walk::remove_tree(&self.dir, &e.name).is_ok() {
                gone.push(n.to_string());
            }
        }
        gone
    }
}

/// The kinds of `Store::aside_name`.
const ASIDE: &[&str] = &["import", "export", "diff"];

/// The pid of an `aside_name` (`.LABEL.PID.KIND`); `None` for any other.
fn aside_pid(n: &str) -> Option<u32> {
    let rest = n.strip_prefix('.')?;
    let (rest, kind) = rest.rsplit_once('.')?;
    if !ASIDE.contains(&kind) {
        return None;
    }
    let (label, pid) = rest.rsplit_once('.')?;
    if label.is_empty() || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Whether process `pid` exists (a zombie counts as dead).
fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aside_names_parse() {
        let n = Store::aside_name("v1.2", 4242, "import");
        assert_eq!(n, ".v1.2.4242.import");
        assert_eq!(aside_pid(&n), Some(4242));
        assert_eq!(aside_pid(".x.7.diff"), Some(7));
        assert_eq!(aside_pid(".x.7.squash"), None);
        assert_eq!(aside_pid("x.7.import"), None);
        assert_eq!(aside_pid("..7.import"), None);
        assert_eq!(aside_pid(".x.7a.import"), None);
        assert!(pid_alive(std::process::id()));
    }

    #[test]
    fn a_pending_checkpoint_takes_its_name_and_is_published_or_discarded() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open(&t.path().join("store"), true).unwrap();
        let rec = |name: &str| Record {
            name: name.into(),
            below: vec![],
            lowers: vec![],
            created: 7,
            upper: PathBuf::from("/u"),
            squashed: Vec::new(),
            includes: Vec::new(),
        };
        assert_eq!(pending_name(".a.b.pending.json"), Some("a.b"));
        assert_eq!(pending_name("a.pending.json"), None);
        assert_eq!(pending_name("..pending.json"), None);
        for n in ["p", "q"] {
            store.write_pending(&rec(n), true).unwrap();
            store.dir.mkdir(n, 0o755).unwrap();
            assert!(store.taken(n) && store.is_pending(n));
            assert_eq!(
                store.record(n).unwrap(),
                None,
                "{n} has a record while pending"
            );
        }
        store.dir.remove_dir("q").unwrap();
        // Pending only: taken still, so no other checkpoint gets the name.
        assert!(store.taken("q"));
        let e = store.new_name(Some("q")).unwrap_err().to_string();
        assert!(e.contains("exists already"), "{e}");
        let mut found: Vec<String> = store.pending().into_iter().map(|r| r.name).collect();
        found.sort();
        assert_eq!(found, ["p", "q"]);
        store.publish("p").unwrap();
        store.publish("p").unwrap();
        assert_eq!(store.record("p").unwrap(), Some(rec("p")));
        assert!(!store.is_pending("p") && store.has_layer("p"));
        store.discard("q").unwrap();
        assert!(!store.taken("q"));
        assert!(store.pending().is_empty());
        // A checkpoint's record does not make it stand on its base while
        // pending: a squash of the base is not refused for it.
        store.dir.mkdir("base", 0o755).unwrap();
        store.write_record(&rec("base")).unwrap();
        let mut on_base = rec("r");
        on_base.below = vec!["base".into()];
        store.write_pending(&on_base, false).unwrap();
        store.dir.mkdir("r", 0o755).unwrap();
        assert!(store.users("base", None).unwrap().is_empty());
        store.publish("r").unwrap();
        assert_eq!(store.users("base", None).unwrap(), vec!["checkpoint r"]);
    }

    #[test]
    fn stack_round_trip_and_pending() {
        let t = tempfile::tempdir().unwrap();
        let (state, _) = SafeDir::create(&t.path().join("s"), Role::State, 0o700).unwrap();
        assert_eq!(read(&state).unwrap(), None);
        let mut s = Stack {
            store: t.path().join("store"),
            layers: vec!["b".into(), "a".into()],
            pending_undo: None,
            repeats: 0,
        };
        write(&state, &s).unwrap();
        assert_eq!(read(&state).unwrap().as_ref(), Some(&s));
        s.pending_undo = Some(vec!["a".into()]);
        write(&state, &s).unwrap();
        let back = read(&state).unwrap().unwrap();
        assert_eq!(back.effective(), ["a".to_string()]);
        assert_eq!(
            frozen_paths(&state).unwrap(),
            vec![t.path().join("store").join("a")]
        );
    }

    #[test]
    fn a_name_that_is_not_one_segment_is_corrupt() {
        let t = tempfile::tempdir().unwrap();
        let (state, _) = SafeDir::create(&t.path().join("s"), Role::State, 0o700).unwrap();
        state
            .replace_file(STACK_FILE, br#"{"store":"/x","layers":["../up"]}"#)
            .unwrap();
        assert!(matches!(read(&state), Err(StackError::Corrupt { .. })));
    }

    #[test]
    fn users_count_holds_and_bases() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open(&t.path().join("store"), true).unwrap();
        let (state, _) = SafeDir::create(&t.path().join("s"), Role::State, 0o700).unwrap();
        for (name, below) in [("a", vec![]), ("b", vec!["a".to_string()])] {
            store.dir.mkdir(name, 0o755).unwrap();
            store
                .write_record(&Record {
                    name: name.into(),
                    below,
                    lowers: vec![],
                    created: 0,
                    upper: PathBuf::from("/u"),
                    squashed: Vec::new(),
                    includes: Vec::new(),
                })
                .unwrap();
        }
        assert_eq!(store.users("a", None).unwrap(), vec!["checkpoint b"]);
        assert!(store.users("b", None).unwrap().is_empty());
        write(
            &state,
            &Stack {
                store: store.path().to_path_buf(),
                layers: vec!["b".into(), "a".into()],
                pending_undo: None,
                repeats: 0,
            },
        )
        .unwrap();
        store.hold("b", &state).unwrap();
        assert_eq!(store.users("b", None).unwrap().len(), 1);
        assert!(store.users("b", Some(&state)).unwrap().is_empty());
        // A workspace that no longer stacks on it: the hold is stale.
        write(
            &state,
            &Stack {
                store: store.path().to_path_buf(),
                layers: vec!["a".into()],
                pending_undo: None,
                repeats: 0,
            },
        )
        .unwrap();
        assert!(store.users("b", None).unwrap().is_empty());
        store.remove("b").unwrap();
        assert!(!store.taken("b"));
    }
}
