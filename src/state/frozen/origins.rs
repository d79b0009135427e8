//! Where the lower an origin record names is in a workspace's stack now
//! (`overlay::origin`): the one rule every reader of origin records
//! follows (`diff`'s drift and moves).
//!
//! - `c:NAME` is the checkpoint layer NAME, or, once a squash merged it,
//!   the squashed layer that holds it (`Record::includes`): the merged
//!   layer shows at NAME's paths what NAME showed there, as every layer
//!   above NAME in the merge lay above it in the stack too.
//! - `s:K` is the K-th shared lower, below the checkpoint layers.
//! - A version 1 record's index is taken as it is: it indexes the stack
//!   it was written under, which is the stack of now, as a squash is
//!   refused over an upper that may hold such records (`state::squash`).
//!
//! A checkpoint layer never changes (`state::frozen`): a record naming
//! one has not drifted, whatever the identity of the file now (a squash
//! links the files into the merged layer, which changes their ctime).
//!
//! Against the shared tree (`diff --base shared`, `Origins::shared_view`)
//! a record naming a checkpoint layer is followed down: the file it names
//! there was itself copied up when that layer was the upper, so its own
//! record says which shared file it came from (`Origins::resolve`). A
//! record in a layer names only layers below that layer, so the chase
//! ends; a file the checkpoint made has no record, and is new.

use std::path::PathBuf;
use std::sync::OnceLock;

use super::{Stack, Store};
use crate::layer::stack::rel_of;
use crate::layer::{sys, walk, LayerName};
use crate::overlay::origin::{LayerRef, Origin};

/// The names of a workspace's lowers, to find the layer a record names.
#[derive(Debug, Clone)]
pub struct Origins {
    /// The checkpoint layers, topmost first: the workspace's first lowers.
    layers: Vec<String>,
    /// How many shared lowers lie below them.
    shared: usize,
    /// The layer store, where a squashed layer's record says what it holds.
    store: Option<PathBuf>,
    /// For each of `layers`, the checkpoints merged into it; read only when
    /// a record names a checkpoint not on the stack.
    merged: OnceLock<Vec<Vec<String>>>,
    /// Records are resolved to the shared lowers only (`shared_view`).
    view: bool,
}

/// Where a record's layer is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// Its index among the workspace's lowers (checkpoint layers first).
    pub index: usize,
    /// Whether it is a checkpoint layer (which never changes).
    pub frozen: bool,
}

impl Origins {
    /// The lowers of a workspace standing on `stack` (its effective
    /// layers: a pending undo's) over `shared` shared lowers.
    pub fn new(stack: Option<&Stack>, shared: usize) -> Origins {
        Origins {
            layers: stack.map(|s| s.effective().to_vec()).unwrap_or_default(),
            shared,
            store: stack.map(|s| s.store.clone()),
            merged: OnceLock::new(),
            view: false,
        }
    }

    /// The lowers of `ws` seen from the shared tree: the merge of its
    /// upper and checkpoint layers compared with its shared lowers alone
    /// (`diff --base shared`). `resolve` then gives indices among the
    /// shared lowers, following records through the checkpoint layers.
    pub fn shared_view(
        ws: &crate::state::workspace::Workspace,
    ) -> Result<Origins, super::StackError> {
        Ok(Origins {
            view: true,
            ..Origins::of(ws)?
        })
    }

    /// The lowers of `ws` now.
    pub fn of(ws: &crate::state::workspace::Workspace) -> Result<Origins, super::StackError> {
        let stack = super::read(&ws.dir)?;
        let shared = match &stack {
            Some(s) => crate::state::checkpoint::shared_lowers(ws, s).len(),
            None => ws.lowers.len(),
        };
        Ok(Origins::new(stack.as_ref(), shared))
    }

    /// Where the layer `r` names is now; `None` when the stack holds it no
    /// more (an index or a shared lower past the end, a checkpoint that
    /// is gone).
    pub fn find(&self, r: &LayerRef) -> Option<Found> {
        let frozen = self.layers.len();
        let index = match r {
            LayerRef::Index(i) => *i,
            LayerRef::Named(LayerName::Shared(k)) => frozen + *k,
            LayerRef::Named(LayerName::Checkpoint(n)) => {
                match self.layers.iter().position(|l| l == n) {
                    Some(i) => i,
                    None => self.merged().iter().position(|m| m.contains(n))?,
                }
            }
        };
        (index < frozen + self.shared).then_some(Found {
            index,
            frozen: index < frozen,
        })
    }

    /// The original `o` names, and where its layer is now. For a shared
    /// view (`shared_view`), a record naming a checkpoint layer is followed
    /// through the record of the file it names there, down to a shared
    /// lower (`None` when the chain ends in a file a checkpoint made, or in
    /// a version 1 record of a layer, whose stack is not known here); the
    /// index is then among the shared lowers.
    pub fn resolve(&self, o: &Origin) -> Option<(Found, Origin)> {
        let frozen = self.layers.len();
        let mut o = o.clone();
        // Each step goes to a layer below the last: at most one per layer.
        for _ in 0..=frozen {
            let at = self.find(&o.layer)?;
            if !self.view {
                return Some((at, o));
            }
            if !at.frozen {
                let index = at.index - frozen;
                return Some((
                    Found {
                        index,
                        frozen: false,
                    },
                    o,
                ));
            }
            let root = self.store.as_ref()?.join(&self.layers[at.index]);
            let root = sys::open_root(&root).ok()?;
            let fd =
                walk::open_rel(&root, &rel_of(&o.path), libc::O_PATH | libc::O_NOFOLLOW).ok()?;
            if sys::fstat(&fd).ok()?.st_mode & libc::S_IFMT != libc::S_IFREG {
                return None;
            }
            let next = Origin::read(&fd)?;
            if matches!(next.layer, LayerRef::Index(_)) {
                return None;
            }
            o = next;
        }
        None
    }

    fn merged(&self) -> &[Vec<String>] {
        self.merged.get_or_init(|| {
            let store = self.store.as_ref().and_then(|p| Store::open(p, false).ok());
            self.layers
                .iter()
                .map(|l| {
                    store
                        .as_ref()
                        .and_then(|s| s.record(l).ok().flatten())
                        .map(|r| r.holds())
                        .unwrap_or_default()
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::safedir::{Role, SafeDir};

    #[test]
    fn names_find_their_layer_through_squashes() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open(&t.path().join("store"), true).unwrap();
        for (name, squashed, includes) in [
            ("top", vec![], vec![]),
            ("sq", vec!["b", "c"], vec!["a", "b", "c"]),
        ] {
            store.dir.mkdir(name, 0o755).unwrap();
            store
                .write_record(&super::super::Record {
                    name: name.into(),
                    below: vec![],
                    lowers: vec![],
                    created: 0,
                    upper: PathBuf::from("/u"),
                    squashed: squashed.into_iter().map(String::from).collect(),
                    includes: includes.into_iter().map(String::from).collect(),
                })
                .unwrap();
        }
        let (_state, _) = SafeDir::create(&t.path().join("s"), Role::State, 0o700).unwrap();
        let stack = Stack {
            store: store.path().to_path_buf(),
            layers: vec!["top".into(), "sq".into()],
            pending_undo: None,
            repeats: 0,
        };
        let o = Origins::new(Some(&stack), 2);
        let c = |n: &str| LayerRef::Named(LayerName::Checkpoint(n.into()));
        let at = |index, frozen| Some(Found { index, frozen });
        assert_eq!(o.find(&c("top")), at(0, true));
        assert_eq!(o.find(&c("sq")), at(1, true));
        // Merged by this squash, or by an earlier one into a merged layer.
        assert_eq!(o.find(&c("c")), at(1, true));
        assert_eq!(o.find(&c("a")), at(1, true));
        assert_eq!(o.find(&c("gone")), None);
        let s = |k| LayerRef::Named(LayerName::Shared(k));
        assert_eq!(o.find(&s(0)), at(2, false));
        assert_eq!(o.find(&s(1)), at(3, false));
        assert_eq!(o.find(&s(2)), None);
        assert_eq!(o.find(&LayerRef::Index(1)), at(1, true));
        assert_eq!(o.find(&LayerRef::Index(3)), at(3, false));
        assert_eq!(o.find(&LayerRef::Index(4)), None);
        // No stack: the shared lowers only.
        let o = Origins::new(None, 1);
        assert_eq!(o.find(&s(0)), at(0, false));
        assert_eq!(o.find(&c("top")), None);
    }
}
