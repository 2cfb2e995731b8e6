//! Small named records that other processes of the same user read: files in `/dev/shm` (`/tmp`
//! where `/dev/shm` is missing), mode 0600, written fresh and renamed into place, removed when
//! the writer removes them or exits. hetmem's ACL shareable handles (`pid << 32 | n`, too small
//! to carry a 64-byte IPC handle) are such records; what a record holds is the caller's business.
//!
//! | function | syscalls |
//! |---|---|
//! | [`write`] | `open(2)` with `O_CREAT \| O_EXCL \| O_NOFOLLOW` (mode 0600) of `<name>.tmp` (a stale one `unlink(2)`ed first), `write(2)`, `rename(2)`; `atexit(3)` once per process |
//! | [`read`] | `open(2)` with `O_NOFOLLOW`, `fstat(2)` (owner must be `geteuid(2)`), `read(2)` |
//! | [`remove`] | `unlink(2)` |
//!
//! A record is never written through a link: the temporary name is made with `O_EXCL` (which
//! refuses any existing name, a planted symlink included) and `O_NOFOLLOW`, and only then renamed
//! over the final name. A record of another user is never read. The records this process wrote
//! and did not remove go at its exit (`atexit(3)`; a process killed by a signal leaves them);
//! a forked child that exits leaves its parent's records alone.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use std::sync::{Mutex, MutexGuard};

/// Records written by this process and not yet removed, with the pid that wrote them, for
/// [`remove_at_exit`].
static LIVE: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

/// The directory records live in: `/dev/shm`, or the temporary directory where it is missing.
pub fn dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// The path of record `name` ([`dir`] joined with it).
pub fn path(name: &str) -> PathBuf {
    dir().join(name)
}

/// Registered with `atexit(3)` at the first record: a process that exits without removing its
/// records leaves none behind. Only records written by this pid go.
extern "C" fn remove_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let me = std::process::id();
        if let Ok(live) = LIVE.try_lock() {
            for (pid, p) in live.iter() {
                if *pid == me {
                    let _ = std::fs::remove_file(p);
                }
            }
        }
    });
}

fn live() -> MutexGuard<'static, Vec<(u32, PathBuf)>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

fn track(path: &Path) {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: registers a plain extern "C" function with no arguments.
        unsafe { libc::atexit(remove_at_exit) };
    });
    let me = std::process::id();
    let mut live = live();
    if !live.iter().any(|(pid, p)| *pid == me && p == path) {
        live.push((me, path.to_path_buf()));
    }
}

/// Writes `bytes` as record `name` (replacing a record of that name atomically), readable and
/// writable by this user only, and removed at this process's exit unless [`remove`]d before.
/// `Err` names the file and the OS error.
pub fn write(name: &str, bytes: &[u8]) -> Result<(), String> {
    let path = path(name);
    // Unique per record (the final name is), so concurrent writers of two records never share it.
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    let io = |e: std::io::Error| format!("{tmp:?}: {e}");
    // A stale name from an earlier process of this pid is unlinked first (unlinking a symlink
    // never touches its target).
    let open = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&tmp)
    };
    let mut f = match open() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&tmp).map_err(io)?;
            open().map_err(io)?
        }
        r => r.map_err(io)?,
    };
    f.write_all(bytes).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    track(&path);
    Ok(())
}

/// The bytes of record `name`, if it is a file of this user (never read through a link). `Err`
/// names the file and why it cannot be read.
pub fn read(name: &str) -> Result<Vec<u8>, String> {
    let path = path(name);
    let read = || -> std::io::Result<Vec<u8>> {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if f.metadata()?.uid() != me {
            return Err(std::io::Error::other(format!(
                "the file belongs to another user, not uid {me}"
            )));
        }
        let mut b = Vec::new();
        f.read_to_end(&mut b)?;
        Ok(b)
    };
    read().map_err(|e| format!("{path:?}: {e}"))
}

/// Removes record `name` (nothing if there is none).
pub fn remove(name: &str) {
    let path = path(name);
    let _ = std::fs::remove_file(&path);
    live().retain(|(_, p)| *p != path);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_read_back_replaced_and_removed() {
        let name = format!("hetmem-linux-record-test.{}", std::process::id());
        write(&name, b"one").unwrap();
        assert_eq!(read(&name).unwrap(), b"one");
        write(&name, b"two!").unwrap();
        assert_eq!(read(&name).unwrap(), b"two!");
        remove(&name);
        let e = read(&name).unwrap_err();
        assert!(e.contains(&name), "{e}");
        assert!(!path(&name).exists());
    }
}
