//! `grep` and `glob`: a walk of the union view through the store's
//! listings, in name order, never through a symlink. Hidden paths are
//! never listed (the policy hides them below the store); scratch paths
//! are left out unless asked for.

use regex::{Regex, RegexBuilder};

use super::error::{Result, ToolError, What};
use super::path::RelPath;
use super::request::{Entry, GrepCount, GrepMatch, GrepMode, GrepRequest, GrepResult};
use super::store::{Kind, Meta, Store};
use crate::policy::pattern::{build_glob, PathSet};

/// Every entry beneath directory `base` (not `base` itself), depth first
/// in name order; directories in `skip` are neither listed nor entered.
pub(crate) fn walk(
    store: &dyn Store,
    base: &RelPath,
    skip: &PathSet,
    each: &mut dyn FnMut(&RelPath, &Meta) -> Result<()>,
) -> Result<()> {
    let mut entries = store.list(base)?;
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, meta) in entries {
        let p = base.join(&name);
        if skip.matches(p.as_str()) {
            continue;
        }
        each(&p, &meta)?;
        if meta.kind == Kind::Dir {
            match walk(store, &p, skip, each) {
                // Gone or refused meanwhile: what is left is still walked.
                Err(e) if matches!(e.what, What::NotFound | What::Denied { .. }) => {}
                r => r?,
            }
        }
    }
    Ok(())
}

pub(crate) fn entry(p: &RelPath, m: &Meta) -> Entry {
    Entry {
        path: p.as_str().to_string(),
        kind: m.kind,
        size: m.size,
        mtime: m.mtime,
        mode: m.mode,
    }
}

/// The path of `p` relative to `base` (which `p` is beneath).
fn relative<'a>(p: &'a RelPath, base: &RelPath) -> &'a str {
    if base.is_root() {
        p.as_str()
    } else {
        &p.as_str()[base.as_str().len() + 1..]
    }
}

fn glob_matcher(pattern: &str) -> Result<globset::GlobMatcher> {
    build_glob(pattern)
        .map(|g| g.compile_matcher())
        .map_err(|e| ToolError::new(pattern, What::Pattern(e.kind().to_string())))
}

pub(crate) fn glob(store: &dyn Store, base: &RelPath, pattern: &str) -> Result<Vec<Entry>> {
    let m = glob_matcher(pattern.trim_start_matches('/'))?;
    let mut out = Vec::new();
    walk(store, base, &PathSet::default(), &mut |p, meta| {
        if m.is_match(relative(p, base)) {
            out.push(entry(p, meta));
        }
        Ok(())
    })?;
    Ok(out)
}

fn matcher(req: &GrepRequest) -> Result<Regex> {
    let source = if req.regex {
        req.pattern.clone()
    } else {
        regex::escape(&req.pattern)
    };
    RegexBuilder::new(&source)
        .case_insensitive(req.ignore_case)
        .build()
        .map_err(|e| ToolError::new(&req.pattern, What::Pattern(e.to_string())))
}

/// `grep` under `base` (a file or a directory); `scratch` holds the
/// workspace's scratch patterns (skipped unless the request asks).
pub(crate) fn grep(
    store: &dyn Store,
    base: &RelPath,
    req: &GrepRequest,
    scratch: &PathSet,
) -> Result<GrepResult> {
    let re = matcher(req)?;
    let filter = match &req.glob {
        Some(g) => Some((glob_matcher(g)?, g.contains('/'))),
        None => None,
    };
    let none = PathSet::default();
    let skip = if req.scratch { &none } else { scratch };
    let mut out = GrepResult::default();
    let mut file = |p: &RelPath| -> Result<()> {
        if let Some((m, by_path)) = &filter {
            let name = p.split_last().map_or("", |(_, n)| n);
            if !m.is_match(if *by_path { p.as_str() } else { name }) {
                return Ok(());
            }
        }
        let data = match store.read(p) {
            Ok(d) => d,
            // Gone, or refused, since the listing: not a match.
            Err(e) if matches!(e.what, What::NotFound | What::Denied { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let Some(text) = super::text::as_text(&data) else {
            return Ok(());
        };
        let mut count = 0;
        for (i, line) in text.lines().enumerate() {
            if re.is_match(line) {
                count += 1;
                if req.output_mode == GrepMode::Content {
                    out.matches.push(GrepMatch {
                        path: p.as_str().to_string(),
                        line: i + 1,
                        text: line.to_string(),
                    });
                }
            }
        }
        match (req.output_mode, count) {
            (_, 0) | (GrepMode::Content, _) => {}
            (GrepMode::Files, _) => out.files.push(p.as_str().to_string()),
            (GrepMode::Count, count) => out.counts.push(GrepCount {
                path: p.as_str().to_string(),
                count,
            }),
        }
        Ok(())
    };
    if store.stat(base)?.kind == Kind::File {
        file(base)?;
    } else {
        walk(store, base, skip, &mut |p, meta| {
            if meta.kind == Kind::File {
                file(p)?;
            }
            Ok(())
        })?;
    }
    Ok(out)
}
