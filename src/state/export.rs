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
//! names the shared lowers the checkpoint was taken over (`SharedLower`,
//! in a PAX global header before the root entry, which tar and older
//! importers skip); an import over other shared lowers is refused unless
//! forced, and records those of the workspace it goes into. An archive
//! without that header (a snapshot, an older export) imports as before.
//!
//! An import is an untrusted archive: it is checked and extracted as a
//! snapshot restore checks and extracts one (`snapshot::prescan`,
//! `snapshot::extract`, under the workspace's policy) into
//! `.NAME.PID.import` in the layer store, synced, its record written
//! pending, renamed to `NAME`, and its record published: the checkpoint
//! exists whole or not at all (a crash leaves the `.import` directory,
//! which `Store::sweep_aside` removes once its process is gone, and a
//! pending record the workspace's next checkpoint, undo or squash settles).

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
        let mut out = BufWriter::new(&f);
        let shared = record
            .lowers
            .iter()
            .map(|l| SharedLower::of(l))
            .collect::<Result<Vec<_>, _>>()?;
        write_shared(&mut out, &shared)
            .map_err(io_ctx(format!("cannot write {}", file.display())))?;
        let (out, entries) = snapshot::write_archive(&src, out, &Default::default())
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
/// on no other checkpoint, over the shared lowers of `ws`, which must be
/// those the archive names (`SharedLower`) unless `force`. Returns the
/// name and what the workspace's policy left out or changed.
pub fn import(
    ws: &Workspace,
    file: &Path,
    name: Option<&str>,
    force: bool,
) -> Result<(String, Report), StackError> {
    crate::failpoint::init();
    let policy =
        super::ops::workspace_policy(ws).map_err(|e| StackError::Refused(e.to_string()))?;
    let shared = checkpoint::shared_of(ws)?;
    if !force {
        check_shared(file, &shared)?;
    }
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
        )?;
        snapshot::extract(BufReader::new(f), &staging, &policy, root, &mut report).map_err(bad)?;
        let sfd = staging.open_self().map_err(io_ctx(what()))?;
        crate::sys::syncfs(&sfd).map_err(io_ctx(what()))?;
        // Pending until the layer is in place: a kill between the two
        // leaves a record with no layer, which the workspace's next
        // checkpoint, undo or squash discards (`checkpoint::settle`),
        // freeing the name; a kill after the rename leaves a whole layer,
        // which it publishes.
        store.write_pending(
            &Record {
                name: name.clone(),
                below: Vec::new(),
                lowers: shared,
                created: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs() as i64)
                    .unwrap_or(0),
                upper: ws.upper.clone(),
                squashed: Vec::new(),
                includes: Vec::new(),
            },
            true,
        )?;
        crate::failpoint::crash("import", "record");
        store.place(&tmp, &name)?;
        crate::failpoint::crash("import", "layer");
        store.publish(&name)?;
        store.dir.sync().map_err(io_ctx(what()))?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = crate::layer::walk::remove_tree(&store.dir, OsStr::new(&tmp));
        if !store.has_layer(&name) {
            let _ = store.discard(&name);
        }
        return Err(e);
    }
    Ok((name, report))
}

/// The PAX key of the record of the shared lowers in an export.
const SHARED_KEY: &str = "LAYERFS.checkpoint.shared";

/// A shared lower as an export names it: its path where the checkpoint
/// was taken (shown, not compared: another host may keep the same tree
/// elsewhere) and a fingerprint of its top directory, cheap to compute
/// and the same for a copy of the tree (`cp -a`, a checkout of the same
/// commit): the names, types and sizes (regular files and symlinks) of
/// its entries, hashed (FNV-1a, 64 bits). It tells a different tree from
/// the right one; an edit below the top directory goes unnoticed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SharedLower {
    path: String,
    fingerprint: String,
    entries: u64,
}

impl SharedLower {
    fn of(lower: &Path) -> Result<SharedLower, StackError> {
        let what = || format!("cannot read shared lower {}", lower.display());
        let root = sys::open_root(lower).map_err(io_ctx(what()))?;
        let mut names: Vec<std::ffi::OsString> = sys::read_dir(&root)
            .map_err(io_ctx(what()))?
            .into_iter()
            .map(|e| e.name)
            .collect();
        names.sort();
        let mut h = Fnv::default();
        for n in &names {
            let st = sys::fstatat(&root, n).map_err(io_ctx(what()))?;
            let fmt = st.st_mode & libc::S_IFMT;
            let size = match fmt {
                libc::S_IFREG | libc::S_IFLNK => st.st_size as u64,
                _ => 0,
            };
            h.eat(n.as_encoded_bytes());
            h.eat(&[0]);
            h.eat(&fmt.to_le_bytes());
            h.eat(&size.to_le_bytes());
        }
        Ok(SharedLower {
            path: lower.to_string_lossy().into_owned(),
            fingerprint: format!("{:016x}", h.0),
            entries: names.len() as u64,
        })
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "path": self.path,
            "fingerprint": self.fingerprint,
            "entries": self.entries,
        })
    }

    fn from_json(v: &serde_json::Value) -> Option<SharedLower> {
        Some(SharedLower {
            path: v["path"].as_str()?.to_string(),
            fingerprint: v["fingerprint"].as_str()?.to_string(),
            entries: v["entries"].as_u64()?,
        })
    }

    fn shown(&self) -> String {
        format!(
            "{} (fingerprint {}, {} entries)",
            self.path, self.fingerprint, self.entries
        )
    }
}

/// FNV-1a, 64 bits: stable across hosts and builds.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn eat(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// Writes the PAX global header naming `shared` (first in the archive).
fn write_shared(out: &mut impl Write, shared: &[SharedLower]) -> std::io::Result<()> {
    let value = serde_json::Value::Array(shared.iter().map(SharedLower::json).collect());
    let rec = pax_record(SHARED_KEY, value.to_string().as_bytes());
    let mut h = tar::Header::new_ustar();
    h.set_path("pax_global_header")?;
    h.set_entry_type(tar::EntryType::XGlobalHeader);
    h.set_size(rec.len() as u64);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_cksum();
    out.write_all(h.as_bytes())?;
    out.write_all(&rec)?;
    let pad = (512 - rec.len() % 512) % 512;
    out.write_all(&vec![0u8; pad])
}

/// One PAX record: `LEN KEY=VALUE\n`, LEN counting itself.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let rest = key.len() + value.len() + 3;
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    let mut r = format!("{len} {key}=").into_bytes();
    r.extend_from_slice(value);
    r.push(b'\n');
    r
}

/// The shared lowers the archive `file` names; `None` when it names none
/// (a snapshot, an export of an older layerfs).
fn read_shared(file: &Path) -> Result<Option<Vec<SharedLower>>, StackError> {
    use std::io::Read;
    let f = File::open(file).map_err(io_ctx(format!("cannot open {}", file.display())))?;
    let bad = |why: String| {
        StackError::Refused(format!("{}: {why}; nothing was imported", file.display()))
    };
    let mut ar = tar::Archive::new(BufReader::new(f));
    let mut entries = ar
        .entries()
        .map_err(|e| bad(format!("cannot read the archive: {e}")))?;
    let Some(first) = entries.next() else {
        return Ok(None);
    };
    let mut first = first.map_err(|e| bad(format!("cannot read the archive: {e}")))?;
    if first.header().entry_type() != tar::EntryType::XGlobalHeader {
        return Ok(None);
    }
    let mut data = Vec::new();
    first
        .read_to_end(&mut data)
        .map_err(|e| bad(format!("cannot read the archive: {e}")))?;
    for ext in tar::PaxExtensions::new(&data) {
        let ext = ext.map_err(|e| bad(format!("bad PAX record: {e}")))?;
        if ext.key_bytes() != SHARED_KEY.as_bytes() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(ext.value_bytes())
            .map_err(|e| bad(format!("bad {SHARED_KEY} record: {e}")))?;
        let list = v
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(SharedLower::from_json)
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| bad(format!("bad {SHARED_KEY} record: not a list of lowers")))?;
        return Ok(Some(list));
    }
    Ok(None)
}

/// Refuses to import `file` over `shared` (the importing workspace's
/// shared lowers) when the archive names other shared lowers, saying
/// which differ and how to import anyway.
fn check_shared(file: &Path, shared: &[std::path::PathBuf]) -> Result<(), StackError> {
    let Some(named) = read_shared(file)? else {
        return Ok(());
    };
    let here = shared
        .iter()
        .map(|l| SharedLower::of(l))
        .collect::<Result<Vec<_>, _>>()?;
    let mut diffs = Vec::new();
    if named.len() != here.len() {
        diffs.push(format!(
            "it was taken over {} shared lower(s), this workspace has {}",
            named.len(),
            here.len()
        ));
    }
    for (i, (a, b)) in named.iter().zip(&here).enumerate() {
        if a.fingerprint != b.fingerprint {
            diffs.push(format!(
                "shared lower #{}: the checkpoint's was {}, this workspace's is {}",
                i + 1,
                a.shown(),
                b.shown()
            ));
        }
    }
    if diffs.is_empty() {
        return Ok(());
    }
    Err(StackError::Refused(format!(
        "{} was exported over other shared lowers than this workspace's: {}; a fork would \
         show the checkpoint's changes over another tree. Import into a workspace over the \
         same shared tree, or give --force to import it anyway; nothing was imported",
        file.display(),
        diffs.join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_records_count_their_own_length() {
        for v in [&b""[..], b"x", &[b'a'; 95][..], &[b'a'; 1000][..]] {
            let r = pax_record("K", v);
            let (len, _) = std::str::from_utf8(&r).unwrap().split_once(' ').unwrap();
            assert_eq!(len.parse::<usize>().unwrap(), r.len());
        }
        let r = pax_record(SHARED_KEY, b"[]");
        let got: Vec<_> = tar::PaxExtensions::new(&r)
            .map(|e| e.unwrap().value().unwrap().to_string())
            .collect();
        assert_eq!(got, ["[]"]);
    }
}
