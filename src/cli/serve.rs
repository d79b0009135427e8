//! `layerfs serve --mcp (WORKSPACE | --lower DIR… --upper DIR [--policy
//! FILE]) [--read-only] [--tools LIST] [--listen unix:PATH]`: the agent
//! tools as an MCP server (`serve::Server`) on stdio, or on a Unix socket
//! (one session per connection, one workspace for all).

use super::exit::{CliError, Context};
use std::path::PathBuf;

use clap::Args;
use rmcp::ServiceExt;

use crate::serve::Server;
use crate::tools::{Layers, OpenOptions, Workspace};

#[derive(Args, Debug)]
pub struct ServeCmd {
    /// Speak the Model Context Protocol (the one protocol served).
    #[arg(long, required = true)]
    mcp: bool,
    /// A workspace: its mountpoint, upper dir or state dir.
    #[arg(
        value_name = "WORKSPACE",
        conflicts_with = "upper",
        required_unless_present = "upper"
    )]
    workspace: Option<PathBuf>,
    /// A lower layer (topmost first), with --upper.
    #[arg(long = "lower", value_name = "DIR", requires = "upper")]
    lowers: Vec<PathBuf>,
    #[arg(long, value_name = "DIR")]
    upper: Option<PathBuf>,
    /// The policy file, with --upper.
    #[arg(long, value_name = "FILE", requires = "upper")]
    policy: Option<PathBuf>,
    /// Offer only the tools that change nothing (ls, read, grep, glob,
    /// stat, diff, log, snapshot_list, checkpoint_list); every change is
    /// refused.
    #[arg(long)]
    read_only: bool,
    /// Offer only these tools (comma-separated, e.g. read,grep,glob,diff):
    /// ls read write edit grep glob delete rename mkdir stat execute diff
    /// log reset snapshot_save snapshot_restore snapshot_list checkpoint
    /// checkpoint_list undo.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    tools: Option<Vec<String>>,
    /// Listen on a Unix socket instead of stdio: unix:PATH.
    #[arg(long, value_name = "unix:PATH")]
    listen: Option<String>,
}

impl ServeCmd {
    pub fn run(self) -> Result<(), CliError> {
        let listen = match self.listen.as_deref().map(|l| l.strip_prefix("unix:")) {
            Some(None) => return Err(CliError::usage("serve", "--listen takes unix:PATH")),
            Some(Some(p)) => Some(PathBuf::from(p)),
            None => None,
        };
        let opts = OpenOptions {
            read_only: self.read_only,
            client: Some("mcp".into()),
            layerfs: None,
        };
        let ws = match (&self.workspace, &self.upper) {
            (Some(w), _) => Workspace::open(w, &opts),
            (None, Some(u)) => Workspace::open_layers(
                &Layers {
                    lowers: self.lowers.clone(),
                    upper: u.clone(),
                    policy: self.policy.clone(),
                },
                &opts,
            ),
            (None, None) => unreachable!("clap requires one"),
        };
        let ws = ws.or_fail("serve")?;
        let server = Server::new(ws, self.tools.as_deref(), self.read_only).or_usage("serve")?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the runtime: {e}"))
            .or_fail("serve")?;
        let r = rt.block_on(async move {
            match listen {
                None => serve_stdio(server).await,
                Some(path) => serve_unix(server, path).await,
            }
        });
        r.or_fail("serve")
    }
}

async fn serve_stdio(server: Server) -> Result<(), String> {
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("MCP session failed to start: {e}"))?;
    running
        .waiting()
        .await
        .map_err(|e| format!("MCP session ended badly: {e}"))?;
    Ok(())
}

/// One MCP session per connection on the socket at `path` (created
/// mode 0600: the socket is the workspace's door). Ends on SIGINT/SIGTERM.
async fn serve_unix(server: Server, path: PathBuf) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    // Bound under a temporary name and linked to `path` once it listens:
    // a client that waits for the socket to appear never finds it refusing
    // connections (bind makes the file before listen). The link fails on
    // an existing `path`, as bind would.
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    // Created 0600 from the start (not chmod after bind, when another user
    // could already connect): no other thread creates files meanwhile.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = tokio::net::UnixListener::bind(&tmp);
    nix::sys::stat::umask(old);
    let listener = bound.map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    let placed = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    placed.map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    let mode = std::fs::symlink_metadata(&path).map(|m| m.permissions().mode() & 0o777);
    if !matches!(mode, Ok(0o600)) {
        return Err(format!(
            "{}: not created mode 0600 ({mode:?})",
            path.display()
        ));
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot catch SIGTERM: {e}"))?;
    let r = loop {
        tokio::select! {
            conn = listener.accept() => {
                let (stream, _) = match conn {
                    Ok(c) => c,
                    Err(e) => break Err(format!("accept on {}: {e}", path.display())),
                };
                let s = server.clone();
                tokio::spawn(async move {
                    match s.serve(stream.into_split()).await {
                        Ok(running) => { let _ = running.waiting().await; }
                        Err(e) => tracing::warn!("MCP session failed to start: {e}"),
                    }
                });
            }
            _ = tokio::signal::ctrl_c() => break Ok(()),
            _ = term.recv() => break Ok(()),
        }
    };
    let _ = std::fs::remove_file(&path);
    r
}
