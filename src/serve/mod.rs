//! `layerfs serve --mcp`: the workspace's file tools (`tools::Workspace`)
//! as Model Context Protocol tools, on the official Rust SDK (`rmcp`).
//!
//! Each tool has a JSON schema whose argument names follow the common
//! agent-tool schemas and a description an agent can act on unprompted.
//! A tool's failure (a refused path, a policy denial with its rule, an
//! edit's match count) is a tool result with `isError` and the message,
//! which clients show to the model; protocol errors are kept for unknown
//! tools and malformed arguments. Calls run on tokio's blocking pool: the
//! core and the mount are blocking system calls.

mod schema;

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde::Deserialize;
use serde_json::{json, Value};

pub use schema::{ToolDef, TOOLS};

use crate::tools::{
    DiffRequest, EditRequest, ExecuteRequest, GlobRequest, GrepRequest, LogRequest, ReadRequest,
    ResetRequest, ToolError, Workspace, WriteRequest,
};

/// A `--tools` list naming a tool there is not: the name, and the tools
/// there are.
#[derive(Debug, thiserror::Error)]
#[error("unknown tool `{name}` in --tools; known: {}", known.join(","))]
pub struct UnknownTool {
    pub name: String,
    pub known: Vec<&'static str>,
}

/// The server: one open workspace and the tools it offers.
#[derive(Clone)]
pub struct Server {
    ws: Arc<Workspace>,
    tools: Arc<Vec<&'static ToolDef>>,
}

impl Server {
    /// Offers `allowed` (every tool when `None`), minus the changing ones
    /// when `read_only`. An unknown name in `allowed` is an error naming it.
    pub fn new(
        ws: Workspace,
        allowed: Option<&[String]>,
        read_only: bool,
    ) -> Result<Server, UnknownTool> {
        if let Some(names) = allowed {
            if let Some(bad) = names
                .iter()
                .find(|n| !TOOLS.iter().any(|t| t.name == n.as_str()))
            {
                return Err(UnknownTool {
                    name: bad.clone(),
                    known: TOOLS.iter().map(|t| t.name).collect(),
                });
            }
        }
        let tools = TOOLS
            .iter()
            .filter(|t| allowed.is_none_or(|a| a.iter().any(|n| n == t.name)))
            .filter(|t| !(read_only && t.changes))
            .collect();
        Ok(Server {
            ws: Arc::new(ws),
            tools: Arc::new(tools),
        })
    }

    /// The names of the tools offered.
    pub fn names(&self) -> Vec<&'static str> {
        self.tools.iter().map(|t| t.name).collect()
    }

    fn tool(def: &ToolDef) -> Tool {
        let schema = match def.schema() {
            Value::Object(o) => o,
            _ => Default::default(),
        };
        Tool::new(def.name, def.description, schema).with_annotations(
            ToolAnnotations::new()
                .read_only(!def.changes)
                .destructive(def.destroys)
                .open_world(false),
        )
    }
}

fn args<T: for<'de> Deserialize<'de>>(tool: &str, v: Value) -> Result<T, ErrorData> {
    serde_json::from_value(v)
        .map_err(|e| ErrorData::invalid_params(format!("{tool}: bad arguments: {e}"), None))
}

#[derive(Deserialize)]
struct PathArg {
    #[serde(default = "root")]
    path: String,
}

#[derive(Deserialize)]
struct DeleteArgs {
    path: String,
    #[serde(default)]
    recursive: bool,
}

#[derive(Deserialize)]
struct RenameArgs {
    path: String,
    new_path: String,
    #[serde(default)]
    overwrite: bool,
}

#[derive(Deserialize)]
struct MkdirArgs {
    path: String,
    #[serde(default)]
    parents: bool,
}

#[derive(Deserialize)]
struct EncodingArg {
    #[serde(default)]
    encoding: Option<String>,
}

/// `read` with `encoding: "base64"`: bytes, not lines.
#[derive(Deserialize)]
struct RawReadArgs {
    path: String,
    #[serde(default)]
    offset: u64,
    #[serde(default = "raw_limit")]
    limit: u64,
}

/// Bytes a raw `read` returns when no limit is given.
const RAW_LIMIT: u64 = 1 << 20;

fn raw_limit() -> u64 {
    RAW_LIMIT
}

#[derive(Deserialize)]
struct SnapshotSaveArgs {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    force: bool,
}

#[derive(Deserialize)]
struct IdArg {
    id: String,
}

#[derive(Deserialize)]
struct CheckpointArgs {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct UndoArgs {
    #[serde(default)]
    to: Option<String>,
}

fn root() -> String {
    "/".into()
}

/// `read` with `encoding: "base64"`: `limit` bytes from byte `offset`.
fn read_raw(ws: &Workspace, a: RawReadArgs) -> Answer {
    let size = ws.stat(&a.path)?.size;
    let data = ws.read_raw(&a.path, a.offset, Some(a.limit))?;
    let n = data.len() as u64;
    let eof = a.offset + n >= size;
    use base64::Engine as _;
    // Standard base64 (RFC 4648, with padding): raw bytes in a JSON string.
    let encoded = base64::engine::general_purpose::STANDARD.encode(&data);
    let text = format!(
        "{}: bytes {}-{} of {size}{}, base64:\n{encoded}",
        a.path,
        a.offset,
        a.offset + n,
        if eof { "" } else { " (more follow)" }
    );
    let v = json!({
        "path": a.path, "encoding": "base64", "offset": a.offset, "bytes": n,
        "size": size, "eof": eof, "data": encoded,
    });
    Ok((text, v))
}

/// A tool's answer: its text for the model and the typed result.
type Answer = Result<(String, Value), ToolError>;

fn typed(v: impl serde::Serialize) -> Answer {
    let v = serde_json::to_value(v).unwrap_or(Value::Null);
    Ok((v.to_string(), v))
}

/// Runs one tool call on the workspace (blocking).
///
/// Long on purpose: one arm per tool, each parsing its arguments and
/// calling the `Workspace`; the table of tools reads best as one match.
fn call(ws: &Workspace, name: &str, a: Value) -> Result<Answer, ErrorData> {
    Ok(match name {
        "ls" => {
            let a: PathArg = args(name, a)?;
            ws.ls(&a.path).and_then(typed)
        }
        "read" => {
            let enc: EncodingArg = args(name, a.clone())?;
            match enc.encoding.as_deref() {
                None | Some("text") => {}
                Some("base64") => return Ok(read_raw(ws, args(name, a)?)),
                Some(e) => {
                    return Err(ErrorData::invalid_params(
                        format!("read: encoding {e:?}: give text or base64"),
                        None,
                    ))
                }
            }
            let r: ReadRequest = args(name, a)?;
            ws.read(&r).map(|res| {
                let text = if res.binary {
                    format!("{}: binary file, {} bytes (not shown)", res.path, res.size)
                } else if res.truncated {
                    format!(
                        "{}\n(lines {}-{} of {}; read on with offset {})",
                        res.content,
                        r.offset + 1,
                        r.offset + res.lines,
                        res.total_lines,
                        r.offset + res.lines
                    )
                } else {
                    res.content.clone()
                };
                (text, serde_json::to_value(&res).unwrap_or(Value::Null))
            })
        }
        "write" => ws.write(&args::<WriteRequest>(name, a)?).and_then(typed),
        "edit" => ws.edit(&args::<EditRequest>(name, a)?).and_then(typed),
        "grep" => ws.grep(&args::<GrepRequest>(name, a)?).and_then(typed),
        "glob" => ws.glob(&args::<GlobRequest>(name, a)?).and_then(typed),
        "delete" => {
            let a: DeleteArgs = args(name, a)?;
            ws.delete(&a.path, a.recursive)
                .and_then(|()| typed(json!({"path": a.path, "deleted": true})))
        }
        "rename" => {
            let a: RenameArgs = args(name, a)?;
            ws.rename(&a.path, &a.new_path, a.overwrite)
                .and_then(|()| typed(json!({"path": a.path, "new_path": a.new_path})))
        }
        "mkdir" => {
            let a: MkdirArgs = args(name, a)?;
            ws.mkdir(&a.path, a.parents)
                .and_then(|()| typed(json!({"path": a.path, "created": true})))
        }
        "stat" => {
            let a: PathArg = args(name, a)?;
            ws.stat(&a.path).and_then(typed)
        }
        "execute" => {
            let r: ExecuteRequest = args(name, a)?;
            ws.execute(&r).map(|res| {
                let mut text = res.output.clone();
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                if res.truncated {
                    text.push_str(&format!(
                        "[output cut at {} of {} bytes]\n",
                        r.max_output, res.output_bytes
                    ));
                }
                if res.timed_out {
                    text.push_str(&format!("[killed after the timeout of {} s]\n", r.timeout));
                }
                text.push_str(&format!("[exit code {}]", res.exit_code));
                (text, serde_json::to_value(&res).unwrap_or(Value::Null))
            })
        }
        "diff" => {
            let r: DiffRequest = args(name, a)?;
            ws.diff(&r).map(|res| {
                let mut text = String::new();
                for c in &res.changes {
                    let kind = serde_json::to_value(c.kind).unwrap_or(Value::Null);
                    let kind = kind.as_str().unwrap_or("?");
                    match &c.from {
                        Some(f) => text.push_str(&format!("{kind} {f} -> {}", c.path)),
                        None => text.push_str(&format!("{kind} {}", c.path)),
                    }
                    if c.conflict {
                        text.push_str(" (conflict)");
                    }
                    text.push('\n');
                    if let Some(p) = &c.patch {
                        text.push_str(p);
                    }
                }
                if res.changes.is_empty() {
                    text.push_str("no changes\n");
                }
                (text, serde_json::to_value(&res).unwrap_or(Value::Null))
            })
        }
        "log" => {
            let r: LogRequest = args(name, a)?;
            ws.log(&r).map(|rows| {
                let text: Vec<&str> = rows.iter().map(|r| r.text.as_str()).collect();
                let text = if text.is_empty() {
                    "no rows".to_string()
                } else {
                    text.join("\n")
                };
                (text, json!({ "entries": rows }))
            })
        }
        "reset" => ws.reset(&args::<ResetRequest>(name, a)?).and_then(typed),
        "snapshot_save" => {
            let a: SnapshotSaveArgs = args(name, a)?;
            ws.snapshot_save(a.id.as_deref(), a.force).and_then(typed)
        }
        "snapshot_restore" => {
            let a: IdArg = args(name, a)?;
            ws.snapshot_restore(&a.id).and_then(typed)
        }
        "snapshot_list" => ws.snapshot_list().and_then(typed),
        "checkpoint" => {
            let a: CheckpointArgs = args(name, a)?;
            ws.checkpoint(a.name.as_deref())
                .and_then(|n| typed(json!({ "name": n })))
        }
        "checkpoint_list" => ws.checkpoint_list().and_then(typed),
        "undo" => {
            let a: UndoArgs = args(name, a)?;
            ws.undo(a.to.as_deref()).and_then(typed)
        }
        _ => return Err(ErrorData::invalid_params(format!("no tool `{name}`"), None)),
    })
}

impl ServerHandler for Server {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("layerfs", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "File tools on a layerfs workspace: a copy-on-write view of shared files. \
                 Paths are relative to the workspace root (a leading / is the root); `..` is \
                 refused. Changes land in the workspace only and can be reviewed and undone \
                 (layerfs diff/reset). Read a file before editing it; edit needs old_string \
                 to occur exactly once unless replace_all.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.tools.iter().map(|t| Server::tool(t)).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        if !self.tools.iter().any(|t| t.name == name) {
            return Err(ErrorData::invalid_params(
                format!("no tool `{name}` on this server (see tools/list)"),
                None,
            ));
        }
        let a = Value::Object(request.arguments.unwrap_or_default());
        let ws = self.ws.clone();
        let answer = tokio::task::spawn_blocking(move || call(&ws, &name, a))
            .await
            .map_err(|e| ErrorData::internal_error(format!("tool call failed: {e}"), None))??;
        Ok(match answer {
            Ok((text, v)) => {
                let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
                r.structured_content = Some(wrap(v));
                r
            }
            Err(e) => {
                let mut r = CallToolResult::error(vec![ContentBlock::text(e.to_string())]);
                r.structured_content = Some(json!({
                    "error": {"kind": e.kind(), "path": e.path, "message": e.to_string()}
                }));
                r
            }
        }
        .into())
    }
}

/// Structured content must be an object: a list is wrapped.
fn wrap(v: Value) -> Value {
    match v {
        Value::Object(_) => v,
        other => json!({ "entries": other }),
    }
}
