//! A full upper filesystem, seen through the mount: out of blocks in the
//! middle of a large copy-up (ext4), out of inodes (ext4 made with few
//! inodes), over a quota (btrfs qgroup: this kernel has no ext4/xfs/tmpfs
//! quota support). Each failing operation must report the filesystem's
//! errno, leave nothing half-done (no partial upper file, nothing in the
//! work dir, the lower intact, the object as it was), keep the mount
//! serving, and work again once space is freed.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::crash::{tree_view, view_diff};
use crate::harness::KernelOverlay;
use crate::harness::*;

/// A filesystem image of its own, loop-mounted for one test; unmounted on
/// drop (lazily if busy; `mount -o loop` frees the loop device with it).
pub struct LoopFs {
    pub mnt: PathBuf,
    pub img: PathBuf,
}

impl LoopFs {
    /// Makes an image of `size_mib` MiB at `dir/name.img` with `mkfs`
    /// (program and arguments before the image path) and mounts it at
    /// `dir/name`.
    pub fn new(dir: &Path, name: &str, size_mib: u64, mkfs: &[&str], opts: &str) -> LoopFs {
        let img = dir.join(format!("{name}.img"));
        let mnt = dir.join(name);
        fs::create_dir_all(&mnt).unwrap();
        fs::File::create(&img)
            .unwrap()
            .set_len(size_mib << 20)
            .unwrap();
        run(Command::new(mkfs[0]).args(&mkfs[1..]).arg(&img));
        let fs = LoopFs { mnt, img };
        fs.mount(opts);
        fs
    }

    /// Mounts an existing image `img` at `mnt`.
    pub fn attach(img: &Path, mnt: &Path, opts: &str) -> LoopFs {
        fs::create_dir_all(mnt).unwrap();
        let fs = LoopFs {
            mnt: mnt.to_path_buf(),
            img: img.to_path_buf(),
        };
        fs.mount(opts);
        fs
    }

    pub fn mount(&self, opts: &str) {
        let o = if opts.is_empty() {
            "loop".to_string()
        } else {
            format!("loop,{opts}")
        };
        run(Command::new("mount")
            .args(["-o", &o])
            .arg(&self.img)
            .arg(&self.mnt));
    }

    pub fn umount(&self) {
        let ok = Command::new("umount")
            .arg(&self.mnt)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }

    pub fn is_mounted(&self) -> bool {
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let want = self.mnt.to_string_lossy().to_string();
        info.lines()
            .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        while self.is_mounted() {
            let before = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            self.umount();
            if fs::read_to_string("/proc/self/mountinfo").unwrap_or_default() == before {
                break;
            }
        }
    }
}

/// Runs a command; panics with its output if it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A workspace whose upper and work dir live on `fs` (at `fs/sub/...`).
fn on(ws: &mut Workspace, base: &Path) {
    ws.upper = base.join("upper");
    ws.work = base.join("work");
    fs::create_dir_all(&ws.upper).unwrap();
    fs::create_dir_all(&ws.work).unwrap();
}

fn work_is_empty(ws: &Workspace) {
    let left: Vec<_> = fs::read_dir(&ws.work)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "work dir leftovers: {left:?}");
}

fn errno_of<T>(r: std::io::Result<T>, what: &str) -> i32 {
    match r {
        Ok(_) => panic!("{what}: succeeded, expected a full-filesystem error"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("{what}: no errno in {e}")),
    }
}

/// `len` bytes of a pattern that differs per `seed`.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn free_bytes(p: &Path) -> u64 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid NUL-terminated path and st a writable statvfs.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail * st.f_frsize
}

/// Waits until `at` has `want` bytes free again. The blocks of a file
/// removed right after its last close come back once the kernel's
/// asynchronous RELEASE (and FORGET) of it reach the daemon, which then
/// closes its descriptors: milliseconds, not at once as on a local
/// filesystem (every FUSE filesystem shares this).
fn space_comes_back(at: &Path, want: u64) {
    assert!(
        eventually(std::time::Duration::from_secs(10), || free_bytes(at)
            >= want),
        "{}: the space of a removed file did not come back: {} bytes free",
        at.display(),
        free_bytes(at)
    );
}

/// Writes `chunk`-sized pieces to a new file at `p` until the filesystem
/// refuses (the errno: ENOSPC or EDQUOT); `sync_all` after each piece so
/// a delayed-allocation error surfaces too.
fn fill(p: &Path, chunk: usize) -> i32 {
    let mut f = fs::File::create(p).unwrap();
    let buf = vec![0x5au8; chunk];
    for _ in 0..100_000 {
        if let Err(e) = f.write_all(&buf).and_then(|_| f.sync_all()) {
            return e.raw_os_error().expect("errno");
        }
    }
    panic!("{}: never ran out of space", p.display());
}

fn append_byte(p: &Path) -> std::io::Result<()> {
    fs::OpenOptions::new().append(true).open(p)?.write_all(b"+")
}

/// The mount's view equals what kernel overlayfs shows for the same
/// lower+upper (after `m` is unmounted).
fn kernel_overlay_agrees(ws: &Workspace, view: &std::collections::BTreeMap<String, String>) {
    let kwork = ws.upper.with_file_name("kwork");
    let kmnt = ws.dir.path().join("kmnt");
    let k = KernelOverlay::mount(&[ws.lower()], &ws.upper, &kwork, &kmnt).unwrap();
    let kview = tree_view(&kmnt);
    drop(k);
    let d = view_diff(view, &kview);
    assert!(d.is_empty(), "layerfs and kernel overlayfs differ: {d:#?}");
}

/// The work dir's filesystem fills up in the middle of the copy-up of a
/// lower file larger than the free space (96 MiB into ~50 MiB free: the
/// proportion of a multi-GiB file on a nearly full disk): ENOSPC, no
/// partial upper file, the space given back, the lower intact; once a
/// filler is removed the same copy-up succeeds.
#[test]
fn a_copy_up_larger_than_the_free_space_fails_whole_and_succeeds_once_space_is_freed() {
    let mut ws = Workspace::new();
    let big = pattern(96 << 20, 1);
    fs::write(ws.lower().join("big"), &big).unwrap();
    let mid = pattern(24 << 20, 2);
    fs::write(ws.lower().join("mid"), &mid).unwrap();
    let img = LoopFs::new(ws.dir.path(), "ext4", 64, &["mkfs.ext4", "-q"], "");
    on(&mut ws, &img.mnt);
    let m = ws.mount();
    let free = free_bytes(&img.mnt);
    assert!(
        free < big.len() as u64,
        "image too large: {free} bytes free"
    );

    let e = errno_of(append_byte(&m.p("big")), "copy-up of 96 MiB into ~50 MiB");
    assert_eq!(e, libc::ENOSPC);
    assert!(
        fs::symlink_metadata(ws.upper.join("big")).is_err(),
        "partial upper copy"
    );
    work_is_empty(&ws);
    assert!(
        free_bytes(&img.mnt) + (1 << 20) >= free,
        "the partial copy's space was not given back: {} of {free} bytes free",
        free_bytes(&img.mnt)
    );
    assert!(
        fs::read(m.p("big")).unwrap() == big,
        "the mount shows the lower"
    );
    assert!(
        fs::read(ws.lower().join("big")).unwrap() == big,
        "lower changed"
    );

    // A filler through the mount takes all that is left: ENOSPC is
    // surfaced to the writer; the 24 MiB copy-up cannot fit either.
    let e = fill(&m.p("filler"), 1 << 20);
    assert_eq!(e, libc::ENOSPC);
    let e = errno_of(append_byte(&m.p("mid")), "copy-up into a full upper");
    assert_eq!(e, libc::ENOSPC);
    assert!(
        fs::symlink_metadata(ws.upper.join("mid")).is_err(),
        "partial upper copy"
    );
    work_is_empty(&ws);
    assert!(fs::read(m.p("mid")).unwrap() == mid);

    // Space freed: the same copy-up now works, and the mount still serves.
    fs::remove_file(m.p("filler")).unwrap();
    space_comes_back(&img.mnt, mid.len() as u64);
    append_byte(&m.p("mid")).unwrap();
    let mut want = mid.clone();
    want.push(b'+');
    assert!(fs::read(m.p("mid")).unwrap() == want, "copied-up content");
    assert!(
        fs::read(ws.upper.join("mid")).unwrap() == want,
        "upper content"
    );
    work_is_empty(&ws);
    let view = tree_view(&m.path);
    assert!(m.unmount(), "the daemon did not exit cleanly");
    kernel_overlay_agrees(&ws, &view);
}

/// One operation through the mount, by name.
type Op<'a> = Box<dyn Fn() -> std::io::Result<()> + 'a>;

/// An upper filesystem out of inodes (ext4 made with `-N 64`): create,
/// mkdir, mknod, symlink, copy-up, whiteout (rm of a lower file), link
/// copy-up and the rename of a lower directory all fail with ENOSPC and
/// leave the view as it was; after files are removed they all work.
#[test]
fn an_upper_out_of_inodes_refuses_every_new_object_with_enospc_and_recovers() {
    let mut ws = Workspace::new();
    let l = ws.lower().to_path_buf();
    fs::write(l.join("shared"), b"shared\n").unwrap();
    fs::write(l.join("gone"), b"gone\n").unwrap();
    fs::write(l.join("linked"), b"linked\n").unwrap();
    fs::create_dir(l.join("dir")).unwrap();
    for i in 0..5 {
        fs::write(l.join(format!("dir/f{i}")), format!("{i}\n")).unwrap();
    }
    fs::create_dir(l.join("updir")).unwrap();
    fs::write(l.join("updir/f"), b"f\n").unwrap();
    fs::write(l.join("upfile"), b"upfile\n").unwrap();
    let img = LoopFs::new(
        ws.dir.path(),
        "ext4",
        16,
        &["mkfs.ext4", "-q", "-N", "64"],
        "",
    );
    on(&mut ws, &img.mnt);
    let m = ws.mount();
    // Already copied up: renaming these needs only the whiteout's inode.
    fs::set_permissions(m.p("updir"), fs::Permissions::from_mode(0o750)).unwrap();
    fs::set_permissions(m.p("upfile"), fs::Permissions::from_mode(0o640)).unwrap();

    // Use up every inode with new files through the mount.
    let mut made = 0;
    let e = loop {
        match fs::write(m.p(&format!("n{made}")), b"x") {
            Ok(()) => made += 1,
            Err(e) => break e.raw_os_error().expect("errno"),
        }
        assert!(made < 1000, "the image has more inodes than expected");
    };
    assert_eq!(e, libc::ENOSPC, "create with no inode left");
    assert!(made > 10, "only {made} files fit");
    assert!(
        fs::symlink_metadata(m.p(&format!("n{made}"))).is_err(),
        "a failed create left its name"
    );

    let before = tree_view(&m.path);
    let upper_before = tree_view(&ws.upper);
    let cases: Vec<(&str, Op)> = vec![
        ("mkdir", Box::new(|| fs::create_dir(m.p("newdir")))),
        (
            "symlink",
            Box::new(|| std::os::unix::fs::symlink("shared", m.p("sl"))),
        ),
        (
            "mkfifo",
            Box::new(|| {
                let c = std::ffi::CString::new(m.p("fifo").into_os_string().into_encoded_bytes())
                    .unwrap();
                // SAFETY: c is a valid NUL-terminated path.
                match unsafe { libc::mkfifo(c.as_ptr(), 0o644) } {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            }),
        ),
        ("copy-up", Box::new(|| append_byte(&m.p("shared")))),
        ("whiteout", Box::new(|| fs::remove_file(m.p("gone")))),
        (
            "link copy-up",
            Box::new(|| fs::hard_link(m.p("linked"), m.p("linked2"))),
        ),
        (
            "rename of a lower dir",
            Box::new(|| fs::rename(m.p("dir"), m.p("dir2"))),
        ),
        (
            "rename of a copied-up lower dir",
            Box::new(|| fs::rename(m.p("updir"), m.p("updir2"))),
        ),
        (
            "rename of a copied-up lower file",
            Box::new(|| fs::rename(m.p("upfile"), m.p("upfile2"))),
        ),
    ];
    for (what, op) in &cases {
        assert_eq!(errno_of(op(), what), libc::ENOSPC, "{what}");
        work_is_empty(&ws);
        let now = tree_view(&m.path);
        let d = view_diff(&now, &before);
        assert!(
            d.is_empty(),
            "after the failed {what} the view changed: {d:#?}"
        );
    }
    assert_eq!(tree_view(&ws.upper), upper_before, "the upper changed");
    assert_eq!(fs::read(m.p("shared")).unwrap(), b"shared\n");

    // Free a few inodes: everything works again.
    for i in 0..12 {
        fs::remove_file(m.p(&format!("n{i}"))).unwrap();
    }
    for (what, op) in &cases {
        op().unwrap_or_else(|e| panic!("{what} after inodes were freed: {e}"));
    }
    assert_eq!(fs::read(m.p("shared")).unwrap(), b"shared\n+");
    assert!(fs::symlink_metadata(m.p("gone")).is_err());
    assert_eq!(
        fs::metadata(m.p("linked")).unwrap().ino(),
        fs::metadata(m.p("linked2")).unwrap().ino()
    );
    assert_eq!(fs::read(m.p("dir2/f3")).unwrap(), b"3\n");
    assert_eq!(fs::read(m.p("updir2/f")).unwrap(), b"f\n");
    assert_eq!(fs::read(m.p("upfile2")).unwrap(), b"upfile\n");
    assert!(fs::symlink_metadata(m.p("updir")).is_err());
    assert!(fs::symlink_metadata(m.p("upfile")).is_err());
    assert!(fs::symlink_metadata(m.p("dir")).is_err());
    work_is_empty(&ws);
    // Kernel overlayfs needs a few inodes of its own to mount.
    for i in 12..made {
        fs::remove_file(m.p(&format!("n{i}"))).unwrap();
    }
    let view = tree_view(&m.path);
    drop(cases);
    assert!(m.unmount(), "the daemon did not exit cleanly");
    kernel_overlay_agrees(&ws, &view);
}

/// The upper over its quota: the kernel's own quota, a btrfs qgroup limit
/// on the subvolume holding upper and work (ext4, xfs and tmpfs quotas are
/// not built into this kernel: CONFIG_QFMT_V2, CONFIG_XFS_QUOTA and
/// CONFIG_TMPFS_QUOTA are off). A copy-up over the limit and writes to a
/// new file get EDQUOT; nothing partial stays; after a removal (and the
/// commit that returns the space to the qgroup) writes work again.
#[test]
fn an_upper_over_its_quota_gets_edquot_and_leaves_nothing_half_written() {
    let mut ws = Workspace::new();
    let big = pattern(24 << 20, 3);
    fs::write(ws.lower().join("big"), &big).unwrap();
    let small = pattern(2 << 20, 4);
    fs::write(ws.lower().join("small"), &small).unwrap();
    let img = LoopFs::new(ws.dir.path(), "btrfs", 256, &["mkfs.btrfs", "-q"], "");
    run(Command::new("btrfs")
        .args(["quota", "enable"])
        .arg(&img.mnt));
    let sv = img.mnt.join("sv");
    run(Command::new("btrfs").args(["subvolume", "create"]).arg(&sv));
    run(Command::new("btrfs")
        .args(["qgroup", "limit", "16M"])
        .arg(&sv));
    on(&mut ws, &sv);
    let m = ws.mount();

    let e = errno_of(
        append_byte(&m.p("big")),
        "copy-up of 24 MiB under a 16 MiB quota",
    );
    assert_eq!(e, libc::EDQUOT);
    assert!(
        fs::symlink_metadata(ws.upper.join("big")).is_err(),
        "partial upper copy"
    );
    work_is_empty(&ws);
    assert!(
        fs::read(m.p("big")).unwrap() == big,
        "the mount shows the lower"
    );
    assert!(
        fs::read(ws.lower().join("big")).unwrap() == big,
        "lower changed"
    );

    assert_eq!(
        fill(&m.p("filler"), 1 << 20),
        libc::EDQUOT,
        "writing past the quota"
    );
    let e = errno_of(append_byte(&m.p("small")), "copy-up over the quota");
    assert_eq!(e, libc::EDQUOT, "daemon log:\n{}", ws.daemon_log());
    assert!(
        fs::symlink_metadata(ws.upper.join("small")).is_err(),
        "partial upper copy"
    );
    work_is_empty(&ws);

    fs::remove_file(m.p("filler")).unwrap();
    // btrfs gives freed space back to the qgroup when the transaction
    // commits, and under load its accounting may take a few commits to
    // catch up: sync and try again for a bounded time (a copy-up that
    // failed leaves nothing behind, checked above, so a retry is clean).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        run(Command::new("sync").arg("-f").arg(&sv));
        match append_byte(&m.p("small")) {
            Ok(()) => break,
            Err(e)
                if e.raw_os_error() == Some(libc::EDQUOT)
                    && std::time::Instant::now() < deadline =>
            {
                work_is_empty(&ws);
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            Err(e) => panic!(
                "append after freeing: {e}\ndaemon log:\n{}",
                ws.daemon_log()
            ),
        }
    }
    let mut want = small.clone();
    want.push(b'+');
    assert!(fs::read(m.p("small")).unwrap() == want, "copied-up content");
    fs::write(m.p("after"), b"room again\n").unwrap();
    work_is_empty(&ws);
    let view = tree_view(&m.path);
    assert!(m.unmount(), "the daemon did not exit cleanly");
    kernel_overlay_agrees(&ws, &view);
}
