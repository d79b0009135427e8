//! Test harness: temporary workspaces (lowers, upper, work, mountpoint) and a
//! mount guard that always unmounts and reaps its daemon, even on panic.

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The layerfs binary under test (LAYERFS_TEST_BIN overrides it: long
/// campaigns run a copy so a rebuild meanwhile does not change it).
pub fn bin() -> PathBuf {
    std::env::var_os("LAYERFS_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_layerfs")))
}

/// A temporary directory tree: `lower0..lowerN`, `upper`, `work`, `mnt`.
pub struct Workspace {
    pub dir: tempfile::TempDir,
    pub lowers: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub mnt: PathBuf,
}

impl Workspace {
    /// One lower layer.
    pub fn new() -> Workspace {
        Workspace::with_lowers(1)
    }

    /// `n` lower layers; `lowers[0]` is the topmost.
    pub fn with_lowers(n: usize) -> Workspace {
        Workspace::with_lowers_in(n, &test_root())
    }

    /// `n` lower layers, the workspace directory created under `root`.
    pub fn with_lowers_in(n: usize, root: &Path) -> Workspace {
        let dir = tempfile::Builder::new()
            .prefix("layerfs-test.")
            .tempdir_in(root)
            .expect("create test workspace");
        let lowers: Vec<PathBuf> = (0..n)
            .map(|i| dir.path().join(format!("lower{i}")))
            .collect();
        for l in &lowers {
            fs::create_dir(l).unwrap();
        }
        let upper = dir.path().join("upper");
        let work = dir.path().join("work");
        let mnt = dir.path().join("mnt");
        fs::create_dir(&upper).unwrap();
        fs::create_dir(&mnt).unwrap();
        Workspace {
            dir,
            lowers,
            upper,
            work,
            mnt,
        }
    }

    pub fn lower(&self) -> &Path {
        &self.lowers[0]
    }

    /// Mount with the default policy and no extra options.
    pub fn mount(&self) -> Mount {
        self.mount_with(&[])
    }

    /// Mount with extra `layerfs mount` arguments (e.g. `["--policy", path]`).
    pub fn mount_with(&self, extra: &[&str]) -> Mount {
        self.try_mount_with(extra)
            .unwrap_or_else(|e| panic!("mount failed: {e}"))
    }

    /// Mount in the foreground as a child process and wait until it is live.
    pub fn try_mount_with(&self, extra: &[&str]) -> Result<Mount, String> {
        self.try_mount_env(extra, &[])
    }

    /// `mount_with`, with extra environment for the daemon (e.g. RUST_LOG).
    pub fn mount_env(&self, extra: &[&str], env: &[(&str, &str)]) -> Mount {
        self.try_mount_env(extra, env)
            .unwrap_or_else(|e| panic!("mount failed: {e}"))
    }

    /// The daemon's log (its stderr), written beside the layers.
    pub fn daemon_log(&self) -> String {
        fs::read_to_string(self.mnt.with_file_name("daemon.log")).unwrap_or_default()
    }

    /// `mount_with`, with the daemon started under `umask` (its own umask
    /// must never show in the modes of what callers create).
    pub fn mount_daemon_umask(&self, extra: &[&str], umask: u32) -> Mount {
        self.try_mount_cmd(extra, &[], Some(umask))
            .unwrap_or_else(|e| panic!("mount failed: {e}"))
    }

    fn try_mount_env(&self, extra: &[&str], env: &[(&str, &str)]) -> Result<Mount, String> {
        self.try_mount_cmd(extra, env, None)
    }

    fn try_mount_cmd(
        &self,
        extra: &[&str],
        env: &[(&str, &str)],
        umask: Option<u32>,
    ) -> Result<Mount, String> {
        let mut cmd = Command::new(bin());
        if let Some(mask) = umask {
            use std::os::unix::process::CommandExt;
            // SAFETY: umask is async-signal-safe and touches only the child.
            unsafe {
                cmd.pre_exec(move || {
                    libc::umask(mask as libc::mode_t);
                    Ok(())
                });
            }
        }
        cmd.envs(env.iter().copied());
        cmd.arg("mount").arg("--foreground");
        for l in &self.lowers {
            cmd.arg("--lower").arg(l);
        }
        cmd.arg("--upper")
            .arg(&self.upper)
            .arg("--work")
            .arg(&self.work);
        cmd.args(extra);
        // The whole suite can run over io_uring queues (root must have set
        // fuse's enable_uring first): LAYERFS_TEST_IO_URING=1.
        if std::env::var_os("LAYERFS_TEST_IO_URING").is_some_and(|v| v == "1")
            && !extra.contains(&"--io-uring")
        {
            cmd.arg("--io-uring");
        }
        cmd.arg(&self.mnt);
        // The daemon's log goes to a file beside the layers: a pipe nobody
        // drains would fill up and stall the daemon's worker threads.
        let log_path = self.mnt.with_file_name("daemon.log");
        let log = fs::File::create(&log_path)
            .map_err(|e| format!("create {}: {e}", log_path.display()))?;
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        if std::env::var_os("RUST_LOG").is_none() && !env.iter().any(|(k, _)| *k == "RUST_LOG") {
            cmd.env("RUST_LOG", "warn");
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", bin().display()))?;
        let mut m = Mount {
            path: self.mnt.clone(),
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if is_mounted(&m.path) {
                return Ok(m);
            }
            if let Some(child) = m.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let err = fs::read_to_string(&log_path).unwrap_or_default();
                    m.child = None;
                    return Err(format!("daemon exited with {status}: {err}"));
                }
            }
            if Instant::now() > deadline {
                return Err("mount did not become live within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Where test workspaces live (override with LAYERFS_TEST_DIR).
pub fn test_root() -> PathBuf {
    std::env::var_os("LAYERFS_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// Whether `path` is a layerfs mountpoint right now.
pub fn is_mounted(path: &Path) -> bool {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy().to_string();
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let Some(sep) = f.iter().position(|x| *x == "-") else {
            return false;
        };
        f.get(4).map(|p| unescape(p)) == Some(want.clone())
            && f.get(sep + 1).is_some_and(|t| t.starts_with("fuse"))
    })
}

fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// A live mount. Dropping it unmounts (lazily if busy) and reaps the daemon.
pub struct Mount {
    pub path: PathBuf,
    child: Option<Child>,
}

impl Mount {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path` inside the mount.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    /// Daemon pid (the foreground child).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Unmount now and wait for the daemon; returns its exit status success.
    pub fn unmount(mut self) -> bool {
        self.cleanup()
    }

    fn cleanup(&mut self) -> bool {
        if is_mounted(&self.path) {
            let ok = Command::new("umount")
                .arg(&self.path)
                .stderr(Stdio::null())
                .status();
            if !matches!(ok, Ok(s) if s.success()) {
                let _ = Command::new("umount").arg("-l").arg(&self.path).status();
            }
        }
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(s)) => return s.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return false;
                }
            }
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// A process a test started, killed (SIGKILL) and reaped when dropped if
/// it is still running: a test that fails half-way leaves no server
/// behind.
pub struct Spawned(pub std::process::Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Runs a shell command (bash -c) in `dir` and returns its output, whether
/// it succeeded or not.
pub fn bash(dir: &Path, script: &str) -> std::process::Output {
    Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("run bash")
}

/// Run a shell command (bash -c) in `dir`; panics with its output if it fails.
pub fn sh(dir: &Path, script: &str) -> String {
    let out = bash(dir, script);
    assert!(
        out.status.success(),
        "`{script}` failed in {}: {}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Applies `patch` (from `layerfs diff --patch`) with `git apply` to a
/// copy of the tree `shared`, made in `scratch` as `applied` (the patch
/// written beside it as `p.patch`); panics with git's message and the
/// patch if it is refused. Returns the patched copy.
pub fn apply_patch(scratch: &Path, shared: &Path, patch: impl AsRef<[u8]>) -> PathBuf {
    let tree = scratch.join("applied");
    sh(
        scratch,
        &format!("cp -a {} {}", shared.display(), tree.display()),
    );
    std::fs::write(scratch.join("p.patch"), patch.as_ref()).unwrap();
    let out = bash(&tree, "git apply ../p.patch");
    assert!(
        out.status.success(),
        "git apply: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(patch.as_ref())
    );
    tree
}

/// `apply_patch`, and the patched copy is `view` file for file (`diff -r`,
/// symbolic links compared as links). Returns the patched copy.
pub fn assert_patch_gives(
    scratch: &Path,
    shared: &Path,
    patch: impl AsRef<[u8]>,
    view: &Path,
) -> PathBuf {
    let tree = apply_patch(scratch, shared, patch);
    sh(
        scratch,
        &format!(
            "diff -r --no-dereference {} {}",
            tree.display(),
            view.display()
        ),
    );
    tree
}

/// The errno of an io::Error (panics if it has none).
pub fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error()
        .unwrap_or_else(|| panic!("no errno in {e}"))
}

/// Write a policy file into the workspace dir and return its path.
pub fn policy_file(ws: &Workspace, text: &str) -> PathBuf {
    let p = ws.dir.path().join("policy");
    fs::write(&p, text).unwrap();
    p
}

/// Polls `cond` every 25 ms until it returns true (true) or `limit` passes
/// (false): for effects that arrive asynchronously (signals, watches).
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A tmpfs mounted for a test, unmounted (lazily) when dropped.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `64M`), mode 0700, on `dir` (created).
    pub fn new(dir: &Path, size: &str) -> Tmpfs {
        fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .unwrap();
        assert!(ok.success(), "mount tmpfs on {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn read_only(&self) {
        let ok = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(ok.success());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = fs::remove_dir(&self.0);
    }
}

/// Writes a tree under `root` from a table of (relative path, content);
/// a path ending in `/` is a directory. Parents are created as needed.
pub fn populate(root: &Path, files: &[(&str, &str)]) {
    for (rel, content) in files {
        let p = root.join(rel);
        if rel.ends_with('/') {
            fs::create_dir_all(&p).unwrap();
        } else {
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, content).unwrap();
        }
    }
}

/// A kernel overlayfs mount (the reference the tests compare layerfs
/// with), unmounted on drop (lazily if busy).
pub struct KernelOverlay {
    mnt: PathBuf,
}

impl KernelOverlay {
    /// Mounts `lowers` (topmost first) and `upper` at `mnt` with
    /// `redirect_dir=on`; `work` and `mnt` are created if missing.
    pub fn mount(
        lowers: &[&Path],
        upper: &Path,
        work: &Path,
        mnt: &Path,
    ) -> Result<KernelOverlay, String> {
        KernelOverlay::mount_with(lowers, upper, work, mnt, "redirect_dir=on")
    }

    /// The same with `extra` as the last mount options.
    pub fn mount_with(
        lowers: &[&Path],
        upper: &Path,
        work: &Path,
        mnt: &Path,
        extra: &str,
    ) -> Result<KernelOverlay, String> {
        for d in [work, mnt] {
            fs::create_dir_all(d).map_err(|e| format!("create {}: {e}", d.display()))?;
        }
        let lowers: Vec<String> = lowers.iter().map(|l| l.display().to_string()).collect();
        let opts = format!(
            "lowerdir={},upperdir={},workdir={},{extra}",
            lowers.join(":"),
            upper.display(),
            work.display()
        );
        let out = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(mnt)
            .output()
            .map_err(|e| format!("run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t overlay -o {opts} {}: {}",
                mnt.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(KernelOverlay {
            mnt: mnt.to_path_buf(),
        })
    }

    /// Over all of a workspace's lowers and its upper (unmounted by the
    /// caller first), at `kmnt` with the work dir `kwork` beside them.
    pub fn of_workspace(ws: &Workspace) -> Result<KernelOverlay, String> {
        let lowers: Vec<&Path> = ws.lowers.iter().map(PathBuf::as_path).collect();
        let dir = ws.dir.path();
        KernelOverlay::mount(&lowers, &ws.upper, &dir.join("kwork"), &dir.join("kmnt"))
    }

    pub fn path(&self) -> &Path {
        &self.mnt
    }
}

impl Drop for KernelOverlay {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.mnt)
            .stderr(Stdio::null())
            .status();
        if !matches!(ok, Ok(s) if s.success()) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// `layerfs ARGS...`, its output whatever its status (stdin empty; logs
/// as RUST_LOG says, `info` by default).
pub fn layerfs<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run layerfs")
}

/// The same with `RUST_LOG=warn`: stderr holds only warnings and errors,
/// for tests that read it for one message.
pub fn layerfs_quiet<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    Command::new(bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run layerfs")
}

/// Opens `dir/d/d/…` (`levels` deep) by one `openat` per level, as tar and
/// rm -rf do past PATH_MAX; with `create`, each level is made first.
pub fn descend(dir: &Path, levels: usize, create: bool) -> std::os::fd::OwnedFd {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut fd: OwnedFd = fs::File::open(dir).unwrap().into();
    for level in 0..levels {
        if create {
            // SAFETY: a valid dir fd and a NUL-terminated name.
            let r = unsafe { libc::mkdirat(fd.as_raw_fd(), c"d".as_ptr(), 0o755) };
            assert_eq!(
                r,
                0,
                "mkdirat at level {level}: {}",
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: as above; the result is checked before it is owned.
        let r = unsafe {
            libc::openat(
                fd.as_raw_fd(),
                c"d".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        assert!(
            r >= 0,
            "openat at level {level}: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a fresh fd nobody else owns.
        fd = unsafe { OwnedFd::from_raw_fd(r) };
    }
    fd
}

/// The file `name` in the directory `dir`, opened with `flags`.
pub fn open_in(dir: &std::os::fd::OwnedFd, name: &std::ffi::CStr, flags: i32) -> fs::File {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: a valid dir fd and a NUL-terminated name; checked below.
    let r = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            0o644,
        )
    };
    assert!(
        r >= 0,
        "openat {name:?}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh fd nobody else owns.
    unsafe { fs::File::from_raw_fd(r) }
}

pub fn read_all(mut f: fs::File) -> String {
    let mut s = String::new();
    std::io::Read::read_to_string(&mut f, &mut s).unwrap();
    s
}
