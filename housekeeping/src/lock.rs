//! The lock that keeps two launches off one tier directory:
//! an exclusive `flock` (through `fs2`) on [`LOCK_FILE_NAME`] in the
//! directory, held for the life of the launch. The holder writes who it is
//! into the file so a second launch can say who is in the way.
//!
//! The lock file is never deleted (removing it would let two processes lock
//! two different files of the same name). The lock is released when the
//! [`TierLock`] is dropped or the process dies, however it dies.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::time::SystemTime;

use fs2::FileExt;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};

use crate::tier_dir::{TierDir, TierDirError};

/// File name of the lock file in a tier directory.
pub const LOCK_FILE_NAME: &str = ".lmcache-tier.lock";

/// Who holds the lock, as written in the lock file (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolder {
    /// Process id of the holder.
    pub pid: u32,
    /// Host name of the holder's machine (or container).
    pub hostname: String,
    /// When it took the lock, RFC 3339 UTC.
    pub since: String,
}

impl fmt::Display for LockHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {} on host {} since {}",
            self.pid, self.hostname, self.since
        )
    }
}

/// Failure to take the lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it. Nothing was changed in the directory.
    #[error("tier directory {dir} is in use by {holder} (lock file {path}): another launch or housekeeping owns it; stop that process or use another directory")]
    Held {
        /// The tier directory.
        dir: PathBuf,
        /// The lock file.
        path: PathBuf,
        /// The holder as its lock file says, or what the file held if it
        /// cannot be parsed (a holder between locking and writing).
        holder: String,
    },
    /// The lock file is not a plain file of its own: another name links
    /// to it (a hard link from elsewhere, which writing the holder would
    /// overwrite), or it is not a regular file. Nothing was written.
    #[error("lock file {path} is not a plain file of its own ({why}): something other than lmcache-tier put it there, and writing into it would change a file outside the tier; remove it and start again")]
    NotPlain {
        /// The lock file.
        path: PathBuf,
        /// What is wrong with it, e.g. `2 hard links`.
        why: String,
    },
    /// The directory was opened read-only.
    #[error(transparent)]
    Dir(#[from] TierDirError),
    /// Creating, locking or writing the lock file failed.
    #[error("cannot lock {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

/// An exclusive lock on a tier directory; released on drop.
#[derive(Debug)]
pub struct TierLock {
    file: File,
    holder: LockHolder,
}

impl TierLock {
    /// Takes the lock at once or fails; never waits.
    ///
    /// # Errors
    /// [`LockError::Held`] naming the holder when another process has it;
    /// [`LockError::Dir`] for a read-only [`TierDir`]; [`LockError::Io`].
    pub fn acquire(dir: &TierDir) -> Result<Self, LockError> {
        dir.require_writable()?;
        let path = dir.entry_path(LOCK_FILE_NAME);
        let io_err = |source: io::Error| LockError::Io {
            path: path.clone(),
            source,
        };
        let fd = openat(
            dir.fd(),
            LOCK_FILE_NAME,
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map_err(|e| io_err(e.into()))?;
        let mut file = File::from(fd);
        check_plain(&file, &path)?;
        if let Err(e) = file.try_lock_exclusive() {
            if e.kind() != fs2::lock_contended_error().kind() {
                return Err(io_err(e));
            }
            let mut text = String::new();
            let holder = match file.read_to_string(&mut text) {
                Ok(_) => match serde_json::from_str::<LockHolder>(&text) {
                    Ok(holder) => holder.to_string(),
                    Err(_) if text.trim().is_empty() => {
                        "a process that has not written its name yet".into()
                    }
                    Err(_) => format!("an unknown holder (lock file holds {:?})", text.trim()),
                },
                Err(e) => format!("an unknown holder (lock file unreadable: {e})"),
            };
            return Err(LockError::Held {
                dir: dir.path().to_path_buf(),
                path,
                holder,
            });
        }
        let holder = LockHolder {
            pid: std::process::id(),
            hostname: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_else(|e| format!("unknown ({e})")),
            since: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        };
        let text = serde_json::to_string(&holder).expect("a lock holder serialises") + "\n";
        file.set_len(0).map_err(io_err)?;
        file.seek(SeekFrom::Start(0)).map_err(io_err)?;
        file.write_all(text.as_bytes()).map_err(io_err)?;
        Ok(Self { file, holder })
    }

    /// Who we are, as written in the lock file.
    pub fn holder(&self) -> &LockHolder {
        &self.holder
    }
}

/// Refuses a lock file that is not a regular file with a single link: the
/// holder is written into it, and a hard link planted at the name would
/// carry that write to a file outside the tier.
fn check_plain(file: &File, path: &std::path::Path) -> Result<(), LockError> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata().map_err(|source| LockError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let why = if !meta.file_type().is_file() {
        "not a regular file".to_string()
    } else if meta.nlink() != 1 {
        format!("{} hard links", meta.nlink())
    } else {
        return Ok(());
    };
    Err(LockError::NotPlain {
        path: path.to_path_buf(),
        why,
    })
}

impl Drop for TierLock {
    fn drop(&mut self) {
        // Closing the file releases the flock as well; unlocking first only
        // makes the release independent of other descriptors of the file.
        let _ = FileExt::unlock(&self.file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier_dir::Access;

    #[test]
    fn a_second_lock_fails_at_once_naming_the_holder_and_the_first_release_frees_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = TierDir::open(tmp.path(), Access::ReadWrite).unwrap();
        let first = TierLock::acquire(&dir).unwrap();
        assert_eq!(first.holder().pid, std::process::id());
        // flock locks belong to the open file description: a second open in
        // the same process contends like another process would.
        match TierLock::acquire(&dir) {
            Err(LockError::Held { holder, path, .. }) => {
                assert!(
                    holder.contains(&format!("pid {}", std::process::id())),
                    "{holder}"
                );
                assert_eq!(path, tmp.path().join(LOCK_FILE_NAME));
            }
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        TierLock::acquire(&dir).unwrap();
    }

    #[test]
    fn a_lock_file_linked_from_outside_is_refused_and_left_unwritten() {
        let tmp = tempfile::tempdir().unwrap();
        let tier = tmp.path().join("tier");
        std::fs::create_dir(&tier).unwrap();
        let outside = tmp.path().join("precious");
        std::fs::write(&outside, b"keep me").unwrap();
        std::fs::hard_link(&outside, tier.join(LOCK_FILE_NAME)).unwrap();
        let dir = TierDir::open(&tier, Access::ReadWrite).unwrap();
        let e = TierLock::acquire(&dir).unwrap_err();
        assert!(matches!(e, LockError::NotPlain { .. }), "{e:?}");
        assert!(e.to_string().contains("2 hard links"), "{e}");
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep me");
    }

    #[test]
    fn read_only_directories_cannot_be_locked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = TierDir::open(tmp.path(), Access::ReadOnly).unwrap();
        assert!(matches!(TierLock::acquire(&dir), Err(LockError::Dir(_))));
    }
}
