//! An open tier directory: every other step (scan, manifest, lock, delete)
//! works relative to its descriptor, so they all act on the same directory
//! even if its path is renamed or replaced meanwhile.

use std::fmt;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{open, openat, renameat, OFlag};
use nix::libc::{S_IFLNK, S_IFMT};
use nix::sys::stat::{fstat, lstat, Mode};
use nix::sys::statvfs::{fstatvfs, FsFlags};
use nix::unistd::{faccessat, fsync, unlinkat, AccessFlags, UnlinkatFlags};

/// What the caller means to do with the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Scan and read the manifest only (sizing, `inspect`, `--dry-run`).
    ReadOnly,
    /// Also lock, delete and write the manifest (a launch, `housekeep`).
    ReadWrite,
}

/// Whether the volume updates access times, which decides the trim order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessTimes {
    /// Mounted without `noatime`: reads update atime (with `relatime`, the
    /// Linux default, at least once a day and whenever atime <= mtime).
    Recorded,
    /// Mounted `noatime`: atime says nothing about use.
    NotRecorded,
}

/// Why a tier directory cannot be used. Nothing has been deleted when one
/// of these is returned.
#[derive(Debug, thiserror::Error)]
pub enum TierDirError {
    /// The path does not exist: a tier that was never created holds nothing
    /// (sizing counts 0 reclaimable bytes); create it to use it.
    #[error("tier directory {path} does not exist: create it (mode 0700) or point the disk path elsewhere")]
    NotFound {
        /// The path given.
        path: PathBuf,
    },
    /// The path is not a directory.
    #[error("tier path {path} is not a directory: point the disk path at a directory")]
    NotADirectory {
        /// The path given.
        path: PathBuf,
    },
    /// The path is a symlink, and the caller asked for a directory at the
    /// path itself ([`TierDir::open_no_follow`]).
    #[error("tier path {path} is a symlink, which is not followed here")]
    Symlink {
        /// The path given.
        path: PathBuf,
    },
    /// The path is the filesystem root, never a tier.
    #[error("tier path {path} is the filesystem root: refusing to housekeep `/`; use a directory of its own")]
    FilesystemRoot {
        /// The path given.
        path: PathBuf,
    },
    /// [`Access::ReadWrite`] was asked and the directory cannot be written.
    #[error("tier directory {path} is not writable ({reason}): fix its owner/mode or mount, or use another directory")]
    NotWritable {
        /// The path given.
        path: PathBuf,
        /// `read-only filesystem` or the access(2) error.
        reason: String,
    },
    /// Any other failure to open or inspect it.
    #[error("cannot open tier directory {path}: {source}")]
    Io {
        /// The path given.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

/// An open tier directory (a descriptor, its device and its path).
#[derive(Debug)]
pub struct TierDir {
    path: PathBuf,
    fd: OwnedFd,
    device: u64,
    access: Access,
    access_times: AccessTimes,
    through_symlink: bool,
}

impl TierDir {
    /// Opens `path` (following a symlink at the path itself, never inside).
    ///
    /// # Errors
    /// [`TierDirError::NotFound`] when it does not exist (match it to treat a
    /// new tier as empty), `NotADirectory`, `FilesystemRoot` for `/`,
    /// `NotWritable` for [`Access::ReadWrite`] on a read-only mount or a
    /// directory this process may not write, `Io` otherwise.
    pub fn open(path: impl AsRef<Path>, access: Access) -> Result<Self, TierDirError> {
        Self::open_at_path(path.as_ref(), access, true)
    }

    /// Opens `path` as [`TierDir::open`] does, except that a symlink at the
    /// path itself is refused, not followed: the directory must be at the
    /// path. A capacity guard looks at its tier's path this way once it
    /// runs, so that a link put there later does not take it into another
    /// directory (`docs/capacity-guard.md`, "The directory it guards").
    ///
    /// # Errors
    /// As [`TierDir::open`], and [`TierDirError::Symlink`] when the path is
    /// a symlink.
    pub fn open_no_follow(path: impl AsRef<Path>, access: Access) -> Result<Self, TierDirError> {
        Self::open_at_path(path.as_ref(), access, false)
    }

    fn open_at_path(path: &Path, access: Access, follow: bool) -> Result<Self, TierDirError> {
        let path = path.to_path_buf();
        let io_err = |e: Errno| TierDirError::Io {
            path: path.clone(),
            source: io::Error::from(e),
        };
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        // The path itself first, without following a symlink there: Linux
        // answers ENOTDIR for a symlink as for any other non-directory.
        let (fd, through_symlink) = match open(&path, flags | OFlag::O_NOFOLLOW, Mode::empty()) {
            Ok(fd) => (fd, false),
            Err(Errno::ENOENT) => return Err(TierDirError::NotFound { path }),
            Err(Errno::ENOTDIR) => {
                let symlink = lstat(&path).is_ok_and(|st| st.st_mode & S_IFMT == S_IFLNK);
                match (symlink, follow) {
                    (false, _) => return Err(TierDirError::NotADirectory { path }),
                    (true, false) => return Err(TierDirError::Symlink { path }),
                    (true, true) => match open(&path, flags, Mode::empty()) {
                        Ok(fd) => (fd, true),
                        Err(Errno::ENOENT) => return Err(TierDirError::NotFound { path }),
                        Err(Errno::ENOTDIR) => return Err(TierDirError::NotADirectory { path }),
                        Err(e) => return Err(io_err(e)),
                    },
                }
            }
            Err(e) => return Err(io_err(e)),
        };
        let stat = fstat(&fd).map_err(io_err)?;
        let root = nix::sys::stat::stat("/").map_err(io_err)?;
        if stat.st_dev == root.st_dev && stat.st_ino == root.st_ino {
            return Err(TierDirError::FilesystemRoot { path });
        }
        let vfs = fstatvfs(&fd).map_err(io_err)?;
        if access == Access::ReadWrite {
            if vfs.flags().contains(FsFlags::ST_RDONLY) {
                return Err(TierDirError::NotWritable {
                    path,
                    reason: "read-only filesystem".into(),
                });
            }
            if let Err(e) = faccessat(
                &fd,
                ".",
                AccessFlags::W_OK | AccessFlags::X_OK,
                nix::fcntl::AtFlags::empty(),
            ) {
                return Err(TierDirError::NotWritable {
                    path,
                    reason: e.desc().to_owned(),
                });
            }
        }
        let access_times = if vfs.flags().contains(FsFlags::ST_NOATIME) {
            AccessTimes::NotRecorded
        } else {
            AccessTimes::Recorded
        };
        Ok(Self {
            path,
            fd,
            device: stat.st_dev,
            access,
            access_times,
            through_symlink,
        })
    }

    /// Whether the path was a symlink when it was opened: the directory is
    /// the link's target then.
    pub fn through_symlink(&self) -> bool {
        self.through_symlink
    }

    /// The path it was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's device (`st_dev`); entries on another are skipped.
    pub fn device(&self) -> u64 {
        self.device
    }

    /// How it was opened.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Whether its volume records access times.
    pub fn access_times(&self) -> AccessTimes {
        self.access_times
    }

    /// The path of an entry, for messages.
    pub fn entry_path(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }

    /// The directory's descriptor: every `*at` call on its entries is made
    /// relative to it.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub(crate) fn require_writable(&self) -> Result<(), TierDirError> {
        match self.access {
            Access::ReadWrite => Ok(()),
            Access::ReadOnly => Err(TierDirError::NotWritable {
                path: self.path.clone(),
                reason: "opened with Access::ReadOnly".into(),
            }),
        }
    }
}

/// Why a control file ([`read_control_file`]) cannot be used. The
/// messages are worded for the operator, after the file's path.
#[derive(Debug, thiserror::Error)]
pub enum ControlFileError {
    /// It is a symlink, which is never followed.
    #[error("it is a symlink, which is not followed")]
    Symlink,
    /// The OS refused to open it (permissions, ...).
    #[error("cannot open it: {}", .0.desc())]
    Open(
        /// The `openat` error.
        Errno,
    ),
    /// It is not a regular file (a directory, a FIFO, a socket, ...).
    #[error("it is not a regular file")]
    NotRegular,
    /// Its metadata cannot be read.
    #[error("cannot stat it: {0}")]
    Stat(
        /// The `fstat` error.
        #[source]
        io::Error,
    ),
    /// Reading it failed.
    #[error("cannot read it: {0}")]
    Read(
        /// The read error.
        #[source]
        io::Error,
    ),
    /// It holds more than the caller's limit.
    #[error("it is larger than {max_bytes} bytes")]
    TooLarge {
        /// The limit the caller gave.
        max_bytes: u64,
    },
}

/// Reads the control file `name` (the identity manifest, a capacity guard's
/// status) in the directory `dir`: only a regular file, never through a
/// symlink (`O_NOFOLLOW`), without blocking on a FIFO put there
/// (`O_NONBLOCK`), and at most `max_bytes`. Anything that can write a tier
/// directory could have put something else under the name.
///
/// Returns `Ok(None)` when there is no such entry.
///
/// # Errors
/// [`ControlFileError`]: what makes the file unusable, worded for the
/// operator ("it is a symlink, which is not followed", "cannot open it:
/// ...", "it is not a regular file", "cannot read it: ...", "it is larger
/// than N bytes").
pub fn read_control_file(
    dir: impl AsFd,
    name: &str,
    max_bytes: u64,
) -> Result<Option<Vec<u8>>, ControlFileError> {
    let fd = match openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(Errno::ELOOP) => return Err(ControlFileError::Symlink),
        Err(e) => return Err(ControlFileError::Open(e)),
    };
    let mut file = std::fs::File::from(fd);
    match file.metadata() {
        Ok(meta) if !meta.is_file() => return Err(ControlFileError::NotRegular),
        Ok(_) => {}
        Err(e) => return Err(ControlFileError::Stat(e)),
    }
    let mut bytes = Vec::new();
    (&mut file)
        .take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(ControlFileError::Read)?;
    if bytes.len() as u64 > max_bytes {
        return Err(ControlFileError::TooLarge { max_bytes });
    }
    Ok(Some(bytes))
}

/// A step of [`replace_control_file`], named in its error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplaceStep {
    /// Unlinking a temp file a killed writer left.
    RemoveStaleTemp,
    /// Creating the temp file.
    Create,
    /// Writing the content into the temp file.
    Write,
    /// `fsync` of the temp file.
    SyncFile,
    /// Renaming the temp file over the control file.
    Rename,
    /// `fsync` of the directory.
    SyncDirectory,
}

impl ReplaceStep {
    /// The step as the error message names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RemoveStaleTemp => "remove stale temp",
            Self::Create => "create",
            Self::Write => "write",
            Self::SyncFile => "fsync",
            Self::Rename => "rename",
            Self::SyncDirectory => "fsync directory",
        }
    }

    /// Whether the step acts on the temp file (else on the control file
    /// or the directory), for the path an error names.
    pub fn on_temp_file(self) -> bool {
        matches!(
            self,
            Self::RemoveStaleTemp | Self::Create | Self::Write | Self::SyncFile
        )
    }
}

impl fmt::Display for ReplaceStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why [`replace_control_file`] failed: the step and the OS error. The
/// control file is then still the previous one, or absent if there was
/// none.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
pub struct ReplaceError {
    /// The step that failed.
    pub step: ReplaceStep,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

/// Replaces the control file `name` in the directory `dir` with `bytes`,
/// crash-safely: the content goes to the temp file `temp_name`, which is
/// fsynced, renamed over `name`, and then the directory is fsynced (the
/// identity manifest, a capacity guard's status). A process killed at any
/// point leaves the previous file or the new one, never a torn one, plus
/// perhaps a stale temp; with the two fsyncs the same holds after a power
/// loss, which a rename alone does not promise (ext4 and xfs may persist
/// the rename before the data).
///
/// The temp file is created with `O_EXCL | O_NOFOLLOW` after any entry at
/// `temp_name` is unlinked (never `AT_REMOVEDIR`): a stale temp is
/// replaced, and a symlink or a hard link someone put there to a file
/// elsewhere is unlinked, never written through. The file gets mode 0644.
///
/// # Errors
/// [`ReplaceError`] naming the step that failed.
pub fn replace_control_file(
    dir: BorrowedFd<'_>,
    temp_name: &str,
    name: &str,
    bytes: &[u8],
) -> Result<(), ReplaceError> {
    let fail = |step: ReplaceStep| {
        move |e: Errno| ReplaceError {
            step,
            source: io::Error::from(e),
        }
    };
    match unlinkat(dir, temp_name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(fail(ReplaceStep::RemoveStaleTemp)(e)),
    }
    let fd = openat(
        dir,
        temp_name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(fail(ReplaceStep::Create))?;
    let mut file = std::fs::File::from(fd);
    let written = file
        .write_all(bytes)
        .map_err(|source| ReplaceError {
            step: ReplaceStep::Write,
            source,
        })
        .and_then(|()| {
            file.sync_all().map_err(|source| ReplaceError {
                step: ReplaceStep::SyncFile,
                source,
            })
        });
    drop(file);
    let renamed = written
        .and_then(|()| renameat(dir, temp_name, dir, name).map_err(fail(ReplaceStep::Rename)));
    if renamed.is_err() {
        // A full volume, say: the temp goes now rather than at the next
        // housekeeping (a kill still leaves it to that).
        let _ = unlinkat(dir, temp_name, UnlinkatFlags::NoRemoveDir);
    }
    renamed?;
    fsync(dir).map_err(fail(ReplaceStep::SyncDirectory))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const TEMP: &str = "control.json.tmp";
    const NAME: &str = "control.json";

    fn replace(dir: &Path, bytes: &[u8]) -> Result<(), ReplaceError> {
        let tier = TierDir::open(dir, Access::ReadWrite).unwrap();
        replace_control_file(tier.fd(), TEMP, NAME, bytes)
    }

    #[test]
    fn a_control_file_is_replaced_whole_and_no_temp_stays() {
        let tmp = tempfile::tempdir().unwrap();
        replace(tmp.path(), b"first").unwrap();
        assert_eq!(fs::read(tmp.path().join(NAME)).unwrap(), b"first");
        // A temp a killed writer left, longer than the new content.
        fs::write(tmp.path().join(TEMP), b"a stale temp, longer than the rest").unwrap();
        replace(tmp.path(), b"second").unwrap();
        assert_eq!(fs::read(tmp.path().join(NAME)).unwrap(), b"second");
        assert!(!tmp.path().join(TEMP).exists());
    }

    #[test]
    fn links_at_the_temp_name_are_never_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        let tier = tmp.path().join("tier");
        fs::create_dir(&tier).unwrap();
        fs::write(&outside, b"not ours").unwrap();
        fs::hard_link(&outside, tier.join(TEMP)).unwrap();
        replace(&tier, b"status").unwrap();
        std::os::unix::fs::symlink(&outside, tier.join(TEMP)).unwrap();
        replace(&tier, b"status again").unwrap();
        assert_eq!(fs::read(&outside).unwrap(), b"not ours");
        assert_eq!(fs::read(tier.join(NAME)).unwrap(), b"status again");
        assert!(!tier.join(TEMP).exists());
    }

    #[test]
    fn a_symlink_at_the_path_is_followed_by_open_and_refused_by_open_no_follow() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tier");
        fs::create_dir(&dir).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let file = tmp.path().join("file");
        fs::write(&file, b"not a directory").unwrap();
        let file_link = tmp.path().join("file-link");
        std::os::unix::fs::symlink(&file, &file_link).unwrap();

        let direct = TierDir::open(&dir, Access::ReadOnly).unwrap();
        assert!(!direct.through_symlink());
        let linked = TierDir::open(&link, Access::ReadOnly).unwrap();
        assert!(linked.through_symlink());
        assert_eq!(
            fstat(linked.fd()).unwrap().st_ino,
            fstat(direct.fd()).unwrap().st_ino
        );
        assert!(!TierDir::open_no_follow(&dir, Access::ReadOnly)
            .unwrap()
            .through_symlink());
        assert!(matches!(
            TierDir::open_no_follow(&link, Access::ReadOnly),
            Err(TierDirError::Symlink { .. })
        ));
        for path in [&file, &file_link] {
            assert!(matches!(
                TierDir::open(path, Access::ReadOnly),
                Err(TierDirError::NotADirectory { .. })
            ));
        }
        assert!(matches!(
            TierDir::open_no_follow(&file, Access::ReadOnly),
            Err(TierDirError::NotADirectory { .. })
        ));
        fs::remove_dir(&dir).unwrap();
        assert!(matches!(
            TierDir::open(&link, Access::ReadOnly),
            Err(TierDirError::NotFound { .. })
        ));
    }

    #[test]
    fn a_directory_at_the_temp_name_is_an_error_naming_the_step() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join(TEMP)).unwrap();
        let err = replace(tmp.path(), b"x").unwrap_err();
        assert_eq!(err.step, ReplaceStep::RemoveStaleTemp, "{err}");
        assert!(tmp.path().join(TEMP).is_dir());
        assert!(!tmp.path().join(NAME).exists());
    }
}
