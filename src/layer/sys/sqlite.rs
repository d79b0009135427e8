//! The `layerfs-fd` SQLite VFS: the default one, except that a database
//! path under `/proc/self/fd/` is used as given (`sqlite_fd_vfs`).

use std::ffi::CStr;

/// Name of the SQLite VFS `sqlite_fd_vfs` registers.
pub const SQLITE_FD_VFS: &str = "layerfs-fd";

/// The default VFS's `xFullPathname`, which `fd_full_pathname` delegates to.
type FullPathname = unsafe extern "C" fn(
    *mut rusqlite::ffi::sqlite3_vfs,
    *const libc::c_char,
    libc::c_int,
    *mut libc::c_char,
) -> libc::c_int;

static DEFAULT_FULL_PATHNAME: std::sync::OnceLock<FullPathname> = std::sync::OnceLock::new();

/// `xFullPathname` of the `layerfs-fd` VFS: a path beginning with
/// `/proc/self/fd/` is used as given; any other goes to the default VFS.
unsafe extern "C" fn fd_full_pathname(
    vfs: *mut rusqlite::ffi::sqlite3_vfs,
    path: *const libc::c_char,
    n_out: libc::c_int,
    out: *mut libc::c_char,
) -> libc::c_int {
    // SAFETY: SQLite passes a NUL-terminated path.
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes_with_nul();
    if bytes.starts_with(b"/proc/self/fd/") {
        if bytes.len() > n_out.max(0) as usize {
            return rusqlite::ffi::SQLITE_CANTOPEN;
        }
        // SAFETY: `out` holds `n_out` bytes (SQLite's contract), at least
        // `bytes.len()` as just checked; the buffers are distinct.
        unsafe { std::ptr::copy_nonoverlapping(path, out, bytes.len()) };
        return rusqlite::ffi::SQLITE_OK;
    }
    match DEFAULT_FULL_PATHNAME.get() {
        // SAFETY: the default VFS's own function, with SQLite's arguments
        // passed on unchanged (it does not use the VFS pointer).
        Some(f) => unsafe { f(vfs, path, n_out, out) },
        None => rusqlite::ffi::SQLITE_CANTOPEN,
    }
}

/// Registers, once, an SQLite VFS named `SQLITE_FD_VFS`: the default one,
/// except that a database path beginning with `/proc/self/fd/` is used as
/// given. The default VFS turns every symbolic link in a path into its
/// target first, which would make the magic link of a checked directory's
/// descriptor (`layer::safedir`) the directory's path again, resolved by
/// name through directories others may write. Through this VFS the
/// database, its `-wal`, `-shm` and `-journal` files are all reached
/// through the descriptor. Returns whether the VFS is available.
pub fn sqlite_fd_vfs() -> bool {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REGISTERED.get_or_init(|| {
        // SAFETY: sqlite3_vfs_find(NULL) initializes SQLite and returns
        // the default VFS (or null), which SQLite never frees.
        let base = unsafe { rusqlite::ffi::sqlite3_vfs_find(std::ptr::null()) };
        if base.is_null() {
            return false;
        }
        // SAFETY: base points at a live, initialized sqlite3_vfs.
        let mut vfs: rusqlite::ffi::sqlite3_vfs = unsafe { *base };
        let Some(full) = vfs.xFullPathname else {
            return false;
        };
        let _ = DEFAULT_FULL_PATHNAME.set(full);
        vfs.zName = c"layerfs-fd".as_ptr();
        vfs.pNext = std::ptr::null_mut();
        vfs.xFullPathname = Some(fd_full_pathname);
        // The copy shares the default VFS's methods and app data (its
        // `xOpen` finds the I/O methods there), and is leaked: SQLite
        // keeps the pointer for the life of the process.
        let vfs = Box::into_raw(Box::new(vfs));
        // SAFETY: vfs is a valid sqlite3_vfs that lives forever.
        unsafe { rusqlite::ffi::sqlite3_vfs_register(vfs, 0) == rusqlite::ffi::SQLITE_OK }
    })
}
