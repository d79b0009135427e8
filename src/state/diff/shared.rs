//! The shared tree beneath a path, merged across the lowers as the
//! mount shows it.

use std::ffi::{OsStr, OsString};

use crate::layer::stack::{base_lookup, base_names, lowers_at_path};
use crate::layer::walk::is_dir;

use super::{type_name, Layers};

/// One entry of a shared tree (`shared_entries`): its path below the
/// tree's root, the layer it is shown from, its type and, for a regular
/// file, its size.
pub struct SharedEntry {
    pub sub: OsString,
    pub layer: usize,
    pub ftype: &'static str,
    pub size: u64,
}

/// Every entry beneath the shared directory at lower path `rel` (relative,
/// no leading `/`), merged across the lowers as the mount shows them,
/// parents before their children; a directory for which `skip` (given its
/// lower path) answers true is left out with all beneath it. Unreadable
/// parts are left out.
pub fn shared_entries(
    layers: &Layers,
    rel: &OsStr,
    skip: impl Fn(&OsStr) -> bool,
) -> Vec<SharedEntry> {
    let nlowers = layers.lowers.len();
    let mut out = Vec::new();
    let mut stack = vec![OsString::new()];
    while let Some(sub) = stack.pop() {
        let dir = if sub.is_empty() {
            rel.to_os_string()
        } else {
            crate::layer::stack::join(rel, &sub)
        };
        let mut abs = OsString::from("/");
        abs.push(&dir);
        let base = lowers_at_path(layers, &abs);
        let Ok(names) = base_names(&base) else {
            continue;
        };
        for n in names.iter().rev() {
            let Ok(Some(e)) = base_lookup(&base, nlowers, n) else {
                continue;
            };
            let child = if sub.is_empty() {
                n.clone()
            } else {
                crate::layer::stack::join(&sub, n)
            };
            if skip(&crate::layer::stack::join(rel, &child)) {
                continue;
            }
            if is_dir(&e.st) {
                stack.push(child.clone());
            }
            let ftype = type_name(e.st.st_mode);
            let size = if ftype == "file" {
                e.st.st_size as u64
            } else {
                0
            };
            out.push(SharedEntry {
                sub: child,
                layer: e.layer,
                ftype,
                size,
            });
        }
    }
    out
}
