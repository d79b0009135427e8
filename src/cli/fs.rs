//! `layerfs fs ls|cat|write|edit|grep|glob|rm|mv`: the workspace's file
//! tools (`tools::Workspace`) for scripts on hosts without FUSE. The
//! workspace is named by its first argument (a mountpoint, an upper or a
//! state dir) or by `--lower … --upper … [--policy FILE]`; `--json` prints
//! the typed result (or `{"error": …}`) as one JSON object.

use super::exit::CliError;
use std::io::{Read, Write};
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::json;

use crate::tools::{
    EditRequest, GlobRequest, GrepMode, GrepRequest, Layers, OpenOptions, ReadRequest, ToolError,
    Workspace, WriteRequest, DEFAULT_LIMIT,
};

/// Which workspace, and how to print.
#[derive(Args, Debug)]
pub struct Target {
    /// A lower layer (topmost first); with --upper instead of WORKSPACE.
    #[arg(long = "lower", value_name = "DIR")]
    lowers: Vec<PathBuf>,
    /// The upper dir; then no WORKSPACE argument is given.
    #[arg(long, value_name = "DIR")]
    upper: Option<PathBuf>,
    /// The policy file (with --upper).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
pub enum FsCmd {
    /// List a directory: [WORKSPACE] [PATH].
    Ls {
        #[command(flatten)]
        t: Target,
        #[arg(value_name = "[WORKSPACE] [PATH]")]
        args: Vec<String>,
    },
    /// Print a file: [WORKSPACE] PATH (raw; -n for numbered lines).
    Cat {
        #[command(flatten)]
        t: Target,
        /// Numbered lines (`     1<TAB>line`), as the read tool gives them.
        #[arg(short = 'n', long)]
        number: bool,
        /// Lines to skip (with -n or --json).
        #[arg(long, default_value_t = 0)]
        offset: usize,
        /// Lines to show at most (with -n or --json).
        #[arg(long, default_value_t = DEFAULT_LIMIT)]
        limit: usize,
        #[arg(value_name = "[WORKSPACE] PATH")]
        args: Vec<String>,
    },
    /// Create a file: [WORKSPACE] PATH [CONTENT] (stdin without CONTENT).
    Write {
        #[command(flatten)]
        t: Target,
        /// Replace an existing file (atomically).
        #[arg(long)]
        overwrite: bool,
        #[arg(value_name = "[WORKSPACE] PATH [CONTENT]")]
        args: Vec<String>,
    },
    /// Replace text in a file: [WORKSPACE] PATH OLD NEW.
    Edit {
        #[command(flatten)]
        t: Target,
        /// Replace every occurrence (else OLD must occur exactly once).
        #[arg(long)]
        replace_all: bool,
        #[arg(value_name = "[WORKSPACE] PATH OLD NEW")]
        args: Vec<String>,
    },
    /// Search text files: [WORKSPACE] PATTERN [PATH].
    Grep {
        #[command(flatten)]
        t: Target,
        /// Only files whose name (or path, with a `/`) matches this glob.
        #[arg(long, value_name = "GLOB")]
        glob: Option<String>,
        /// PATTERN is a regular expression (else a literal string).
        #[arg(long)]
        regex: bool,
        #[arg(short = 'i', long)]
        ignore_case: bool,
        /// Print only the paths of files with a match.
        #[arg(short = 'l', long, conflicts_with = "count")]
        files: bool,
        /// Print matching lines per file.
        #[arg(short = 'c', long)]
        count: bool,
        /// Search scratch paths too.
        #[arg(long)]
        scratch: bool,
        #[arg(value_name = "[WORKSPACE] PATTERN [PATH]")]
        args: Vec<String>,
    },
    /// Find entries by glob: [WORKSPACE] PATTERN [PATH].
    Glob {
        #[command(flatten)]
        t: Target,
        #[arg(value_name = "[WORKSPACE] PATTERN [PATH]")]
        args: Vec<String>,
    },
    /// Remove a file or directory: [WORKSPACE] PATH.
    Rm {
        #[command(flatten)]
        t: Target,
        /// Remove a directory and everything in it.
        #[arg(short = 'r', long)]
        recursive: bool,
        #[arg(value_name = "[WORKSPACE] PATH")]
        args: Vec<String>,
    },
    /// Rename: [WORKSPACE] FROM TO.
    Mv {
        #[command(flatten)]
        t: Target,
        /// Replace an existing TO.
        #[arg(long)]
        overwrite: bool,
        #[arg(value_name = "[WORKSPACE] FROM TO")]
        args: Vec<String>,
    },
}

/// A verb's failure: a usage error (exit 2) or the tool's (exit 1).
enum Failure {
    Usage(String),
    Tool(ToolError),
}

impl From<ToolError> for Failure {
    fn from(e: ToolError) -> Failure {
        Failure::Tool(e)
    }
}

type Out = Result<Option<serde_json::Value>, Failure>;

impl Target {
    /// Opens the workspace and returns the verb's own arguments, which
    /// must number between `min` and `max`.
    fn open(
        &self,
        args: &[String],
        min: usize,
        max: usize,
    ) -> Result<(Workspace, Vec<String>), Failure> {
        let opts = OpenOptions {
            read_only: false,
            client: Some("fs".into()),
            layerfs: None,
        };
        let (ws, rest) = match &self.upper {
            Some(upper) => {
                let layers = Layers {
                    lowers: self.lowers.clone(),
                    upper: upper.clone(),
                    policy: self.policy.clone(),
                };
                (Workspace::open_layers(&layers, &opts)?, args.to_vec())
            }
            None => {
                if !self.lowers.is_empty() || self.policy.is_some() {
                    return Err(Failure::Usage(
                        "--lower and --policy go with --upper (or name the WORKSPACE alone)".into(),
                    ));
                }
                let Some((first, rest)) = args.split_first() else {
                    return Err(Failure::Usage("give a WORKSPACE (or --upper DIR)".into()));
                };
                (Workspace::open(first.as_ref(), &opts)?, rest.to_vec())
            }
        };
        if rest.len() < min || rest.len() > max {
            return Err(Failure::Usage(format!(
                "expected {} argument{} after the workspace, got {}",
                if min == max {
                    min.to_string()
                } else {
                    format!("{min} to {max}")
                },
                if max == 1 { "" } else { "s" },
                rest.len()
            )));
        }
        Ok((ws, rest))
    }
}

fn value(v: impl Serialize) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

impl FsCmd {
    fn name(&self) -> &'static str {
        match self {
            FsCmd::Ls { .. } => "fs ls",
            FsCmd::Cat { .. } => "fs cat",
            FsCmd::Write { .. } => "fs write",
            FsCmd::Edit { .. } => "fs edit",
            FsCmd::Grep { .. } => "fs grep",
            FsCmd::Glob { .. } => "fs glob",
            FsCmd::Rm { .. } => "fs rm",
            FsCmd::Mv { .. } => "fs mv",
        }
    }

    fn json(&self) -> bool {
        match self {
            FsCmd::Ls { t, .. }
            | FsCmd::Cat { t, .. }
            | FsCmd::Write { t, .. }
            | FsCmd::Edit { t, .. }
            | FsCmd::Grep { t, .. }
            | FsCmd::Glob { t, .. }
            | FsCmd::Rm { t, .. }
            | FsCmd::Mv { t, .. } => t.json,
        }
    }

    pub fn run(self) -> Result<(), CliError> {
        let (name, json) = (self.name(), self.json());
        match self.exec(json) {
            Ok(Some(v)) if json => {
                outln!("{v}");
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(Failure::Usage(m)) => Err(CliError::usage(name, m)),
            Err(Failure::Tool(e)) => {
                if json {
                    let err = json!({"error": {"kind": e.kind(), "path": e.path, "message": e.to_string()}});
                    outln!("{err}");
                }
                Err(CliError::failure(name, e))
            }
        }
    }

    /// Runs the verb: prints its plain output, returns its JSON.
    ///
    /// Long on purpose: one arm per verb of `layerfs fs`, each a call into
    /// the `Workspace` and its plain output side by side; split, the verbs
    /// would scatter over as many functions as arms.
    fn exec(self, json: bool) -> Out {
        match self {
            FsCmd::Ls { t, args } => {
                let (ws, a) = t.open(&args, 0, 1)?;
                let list = ws.ls(a.first().map_or("/", String::as_str))?;
                if !json {
                    for e in &list {
                        let slash = if e.kind == crate::tools::store::Kind::Dir {
                            "/"
                        } else {
                            ""
                        };
                        outln!("{:>10}  {}{slash}", e.size, e.path);
                    }
                }
                Ok(Some(value(list)))
            }
            FsCmd::Cat {
                t,
                number,
                offset,
                limit,
                args,
            } => {
                let (ws, a) = t.open(&args, 1, 1)?;
                if !number && !json {
                    let data = ws.read_raw(&a[0], 0, None)?;
                    let mut out = std::io::stdout().lock();
                    if let Err(e) = out.write_all(&data).and_then(|()| out.flush()) {
                        if e.kind() != std::io::ErrorKind::BrokenPipe {
                            return Err(Failure::Usage(format!("cannot write to stdout: {e}")));
                        }
                    }
                    return Ok(None);
                }
                let r = ws.read(&ReadRequest {
                    path: a[0].clone(),
                    offset,
                    limit,
                })?;
                if !json {
                    if r.binary {
                        super::print_error(
                            "fs cat",
                            format!("{}: binary file, {} bytes", r.path, r.size),
                        );
                    } else if !r.content.is_empty() {
                        outln!("{}", r.content);
                    }
                }
                Ok(Some(value(r)))
            }
            FsCmd::Write { t, overwrite, args } => {
                let (ws, a) = t.open(&args, 1, 2)?;
                let content = match a.get(1) {
                    Some(c) => c.clone(),
                    None => {
                        let mut s = String::new();
                        std::io::stdin()
                            .read_to_string(&mut s)
                            .map_err(|e| Failure::Usage(format!("cannot read stdin: {e}")))?;
                        s
                    }
                };
                let r = ws.write(&WriteRequest {
                    path: a[0].clone(),
                    content,
                    overwrite,
                })?;
                Ok(Some(value(r)))
            }
            FsCmd::Edit {
                t,
                replace_all,
                args,
            } => {
                let (ws, a) = t.open(&args, 3, 3)?;
                let r = ws.edit(&EditRequest {
                    path: a[0].clone(),
                    old_string: a[1].clone(),
                    new_string: a[2].clone(),
                    replace_all,
                })?;
                Ok(Some(value(r)))
            }
            FsCmd::Grep {
                t,
                glob,
                regex,
                ignore_case,
                files,
                count,
                scratch,
                args,
            } => {
                let (ws, a) = t.open(&args, 1, 2)?;
                let output_mode = match (files, count) {
                    (true, _) => GrepMode::Files,
                    (_, true) => GrepMode::Count,
                    _ => GrepMode::Content,
                };
                let r = ws.grep(&GrepRequest {
                    pattern: a[0].clone(),
                    path: a.get(1).cloned().unwrap_or_else(|| "/".into()),
                    glob,
                    regex,
                    ignore_case,
                    output_mode,
                    scratch,
                })?;
                if !json {
                    for m in &r.matches {
                        outln!("{}:{}:{}", m.path, m.line, m.text);
                    }
                    for f in &r.files {
                        outln!("{f}");
                    }
                    for c in &r.counts {
                        outln!("{}:{}", c.path, c.count);
                    }
                }
                Ok(Some(value(r)))
            }
            FsCmd::Glob { t, args } => {
                let (ws, a) = t.open(&args, 1, 2)?;
                let list = ws.glob(&GlobRequest {
                    pattern: a[0].clone(),
                    path: a.get(1).cloned().unwrap_or_else(|| "/".into()),
                })?;
                if !json {
                    for e in &list {
                        outln!("{}", e.path);
                    }
                }
                Ok(Some(value(list)))
            }
            FsCmd::Rm { t, recursive, args } => {
                let (ws, a) = t.open(&args, 1, 1)?;
                ws.delete(&a[0], recursive)?;
                Ok(Some(json!({"path": a[0], "deleted": true})))
            }
            FsCmd::Mv { t, overwrite, args } => {
                let (ws, a) = t.open(&args, 2, 2)?;
                ws.rename(&a[0], &a[1], overwrite)?;
                Ok(Some(json!({"from": a[0], "to": a[1]})))
            }
        }
    }
}
