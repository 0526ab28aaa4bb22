//! The guard's state as `lmcache-tier inspect` reads it: a JSON file in the
//! tier directory, [`GUARD_STATUS_FILE_NAME`], replaced atomically (written to
//! [`GUARD_STATUS_TEMP_FILE_NAME`] and renamed over it) after the start-up
//! count, after every eviction cycle and rescan, and at most once a second
//! while the usage changes. Housekeeping classifies both names as ours.
//!
//! A reader sees either the previous or the next whole file, never a torn
//! one. `updated_unix_ms` says how fresh it is and `pid` which process wrote
//! it; a file whose writer is gone is the last state of a stopped guard.

use std::io;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use lmcache_housekeeping::scan::{GUARD_STATUS_FILE_NAME, GUARD_STATUS_TEMP_FILE_NAME};

use crate::capacity::GuardRole;
use lmcache_housekeeping::tier_dir::{
    read_control_file, replace_control_file, ControlFileError, ReplaceError, ReplaceStep,
};
use lmcache_housekeeping::TierDir;

/// Version of the status file's shape; bumped when a field changes meaning.
pub const STATUS_VERSION: u32 = 1;

/// A count of objects and their allocated bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountBytes {
    /// Objects.
    pub objects: u64,
    /// Allocated bytes (`st_blocks * 512`, as `du` counts).
    pub bytes: u64,
}

/// What the start-up count found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartCount {
    /// Objects and bytes on disk when the guard started.
    #[serde(flatten)]
    pub found: CountBytes,
    /// How long the count took, in milliseconds.
    pub millis: u64,
}

/// One eviction cycle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cycle {
    /// When it ended, milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// Objects it deleted, and the bytes that gave back to the volume as
    /// the filesystem counts them: a file's allocated bytes when its last
    /// link went, nothing for a file with other hard links.
    #[serde(flatten)]
    pub deleted: CountBytes,
    /// How long it took, in milliseconds.
    pub millis: u64,
}

/// Every eviction since the guard started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evictions {
    /// Eviction cycles run.
    pub cycles: u64,
    /// Objects deleted and bytes freed on the volume, all cycles.
    #[serde(flatten)]
    pub deleted: CountBytes,
    /// The last cycle, if any.
    pub last_cycle: Option<Cycle>,
}

/// The free space the guard keeps on the tier's volume
/// (`docs/capacity-guard.md`, "The free-space line at run time"): the line
/// the launch planned to leave, measured when the guard started, the line
/// of free inodes beside it, and the evictions made to hold them when
/// something else fills the volume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeSpace {
    /// Size of the volume, in bytes (statvfs blocks x fragment size).
    pub volume_bytes: u64,
    /// The volume's reserve: min(10% of the volume, 256 GiB), in bytes.
    pub reserve_bytes: u64,
    /// The line: min(reserve, max(0, free + tier usage - capacity)) at the
    /// guard's start, in bytes. Below it the guard evicts.
    pub line_bytes: u64,
    /// Free space (available to an unprivileged writer) at the last check,
    /// in bytes.
    pub free_bytes: u64,
    /// The free inodes kept; `None` on a volume that reports no inodes
    /// (btrfs and others allocate them as needed), and in status files of
    /// guards from before it was kept.
    #[serde(default)]
    pub inodes: Option<FreeInodes>,
    /// When the free space last fell below the line with nothing of the
    /// tier left to evict, milliseconds since the Unix epoch; `None` once
    /// it is back above the line.
    pub short_since_unix_ms: Option<u64>,
    /// Times the free space fell below the line with nothing of the tier
    /// left to evict. On a volume without a free byte the status file
    /// cannot be replaced, so this is how the state read afterwards tells.
    pub shortages: u64,
    /// Evictions made to bring the free space back to the line.
    pub evictions: Evictions,
}

/// The free inodes the guard keeps on the tier's volume, beside its free
/// space (`docs/capacity-guard.md`, "The free-space line at run time"):
/// with none left, every store fails with `ENOSPC` however many bytes are
/// free.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeInodes {
    /// Inodes of the volume (statvfs `f_files`).
    pub volume_inodes: u64,
    /// The inode reserve: 10% of the volume's inodes, at most 1,000,000.
    pub reserve_inodes: u64,
    /// The inode line: min(reserve, the free inodes at the guard's start).
    /// Below it the guard evicts.
    pub line_inodes: u64,
    /// Free inodes (available to an unprivileged writer, `f_favail`) at the
    /// last check.
    pub free_inodes: u64,
}

impl Evictions {
    /// Counts one more cycle, `cycle`, as the last.
    pub fn add(&mut self, cycle: Cycle) {
        self.cycles += 1;
        self.deleted.objects += cycle.deleted.objects;
        self.deleted.bytes += cycle.deleted.bytes;
        self.last_cycle = Some(cycle);
    }
}

/// How the guard follows the tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Following {
    /// inotify on the tier directory.
    Inotify,
    /// Periodic rescans only: inotify could not watch the directory.
    Rescans,
}

/// The guard's state (the status file's content).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuardStatus {
    /// [`STATUS_VERSION`].
    pub version: u32,
    /// The writer's process id.
    pub pid: u32,
    /// [`crate::GuardOptions::owner`] of the guard that wrote it: which
    /// launch runs that guard; `None` from a guard started without one, or
    /// written before the field existed.
    #[serde(default)]
    pub owner: Option<String>,
    /// Position of the tier in the cascade (0-based).
    pub tier: usize,
    /// Adapter type (`fs`, `fs_native`).
    pub adapter_type: String,
    /// The tier directory.
    pub base_path: PathBuf,
    /// Evictor or hard bound.
    pub role: GuardRole,
    /// Capacity in bytes.
    pub capacity_bytes: u64,
    /// Usage at which a cycle starts, in bytes.
    pub trigger_bytes: u64,
    /// The spec's `eviction_ratio`.
    pub eviction_ratio: f64,
    /// Objects tracked now and their allocated bytes (the usage).
    pub tracked: CountBytes,
    /// The tracked objects the guard could not delete (an immutable file,
    /// a read-only remount): still on the disk and counted in `tracked`,
    /// passed over by eviction until they change or are tried again
    /// (`docs/capacity-guard.md`, "How it counts and follows the tier"). Zero in a
    /// file written before the field existed.
    #[serde(default)]
    pub undeletable: CountBytes,
    /// The start-up count.
    pub start: StartCount,
    /// Evictions so far.
    pub evictions: Evictions,
    /// inotify or rescans.
    pub following: Following,
    /// Full rescans since the start-up count (queue overflows, fallback,
    /// shared tier).
    pub rescans: u64,
    /// inotify queue overflows (`IN_Q_OVERFLOW`) since the start; each is
    /// followed by a rescan.
    #[serde(default)]
    pub overflows: u64,
    /// Event lag: in the last batch of inotify events that counted a
    /// written object, the longest time from an object's last change (its
    /// ctime: written or renamed into place) to the guard counting it, in
    /// milliseconds; `None` before the first.
    #[serde(default)]
    pub event_lag_ms: Option<u64>,
    /// The free space kept on the volume; `None` when the volume reports
    /// no size (a tmpfs without a size limit, ramfs): there is no line.
    #[serde(default)]
    pub free_space: Option<FreeSpace>,
    /// When this file was written, milliseconds since the Unix epoch.
    pub updated_unix_ms: u64,
}

/// Writes `status` into the directory `dir` crash-safely (see the module
/// docs): [`replace_control_file`] writes [`GUARD_STATUS_TEMP_FILE_NAME`],
/// fsyncs it, renames it over [`GUARD_STATUS_FILE_NAME`] and fsyncs the
/// directory, so a guard killed at any point, or a power loss, leaves the
/// previous status or the next one, never a torn one. Never follows a
/// symlink at either name, nor writes through a link at the temp name.
///
/// Cost: two fsyncs a write, on the guard's own thread (the server never
/// waits on them; an eviction cycle's next drain does). The guard writes at
/// most once a second while the usage changes, plus once per eviction
/// cycle and rescan: 1.7 ms a write against 1.3 ms with the rename alone
/// on ext4 on a virtio disk (`docs/performance.md`, "Crash safety"); a
/// journal commit on a slow disk costs tens of milliseconds, a few percent
/// of that second at most.
pub(crate) fn write_status(dir: BorrowedFd<'_>, status: &GuardStatus) -> Result<(), ReplaceError> {
    let text = serde_json::to_vec_pretty(status).map_err(|e| ReplaceError {
        step: ReplaceStep::Write,
        source: io::Error::other(e),
    })?;
    replace_control_file(
        dir,
        GUARD_STATUS_TEMP_FILE_NAME,
        GUARD_STATUS_FILE_NAME,
        &text,
    )
}

/// The largest status file read: a guard writes well under 4 KiB.
const STATUS_MAX_BYTES: u64 = 1 << 20;

/// Why a status file that is there cannot be read; the message starts with
/// the file's path.
#[derive(Debug, thiserror::Error)]
pub enum StatusFileError {
    /// Not a small regular file that can be read ([`read_control_file`]).
    #[error("{}: {source}", .path.display())]
    Unreadable {
        /// The status file.
        path: PathBuf,
        /// What makes it unusable.
        #[source]
        source: ControlFileError,
    },
    /// Its content is not a [`GuardStatus`].
    #[error("{}: it is not a guard status: {source}", .path.display())]
    NotAStatus {
        /// The status file.
        path: PathBuf,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
}

/// Reads the status file of the tier directory `dir` (as
/// [`lmcache_housekeeping::read_manifest`] reads the manifest): `Ok(None)`
/// when no guard ever wrote one there. Only a regular file is read, never
/// through a symlink, without blocking (a FIFO put there) and at most
/// `STATUS_MAX_BYTES` ([`read_control_file`]): anything that can write the
/// tier directory could have put something else there.
///
/// # Errors
/// [`StatusFileError`]: the read error, or what makes the file unusable,
/// with the file's path.
pub fn read_status(dir: &TierDir) -> Result<Option<GuardStatus>, StatusFileError> {
    let path = || dir.entry_path(GUARD_STATUS_FILE_NAME);
    let bytes = match read_control_file(dir.fd(), GUARD_STATUS_FILE_NAME, STATUS_MAX_BYTES) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(None),
        Err(source) => {
            return Err(StatusFileError::Unreadable {
                path: path(),
                source,
            })
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| StatusFileError::NotAStatus {
            path: path(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmcache_housekeeping::Access;
    use nix::sys::stat::Mode;
    use std::path::Path;

    /// [`read_status`] of `dir`, its error as the operator reads it.
    fn read(dir: &Path) -> Result<Option<GuardStatus>, String> {
        read_status(&TierDir::open(dir, Access::ReadOnly).unwrap()).map_err(|e| e.to_string())
    }

    fn problem(dir: &Path) -> String {
        read(dir).expect_err("an unusable status file")
    }

    #[test]
    fn only_a_small_regular_file_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let path = dir.join(GUARD_STATUS_FILE_NAME);
        assert_eq!(read(dir), Ok(None));
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        assert!(problem(dir).contains("it is a symlink, which is not followed"));
        std::fs::remove_file(&path).unwrap();
        nix::unistd::mkfifo(&path, Mode::S_IRUSR | Mode::S_IWUSR).unwrap();
        assert!(problem(dir).contains("not a regular file"));
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, vec![b' '; STATUS_MAX_BYTES as usize + 1]).unwrap();
        assert!(problem(dir).contains("larger than"));
        std::fs::write(&path, "{}").unwrap();
        assert!(problem(dir).contains("not a guard status"));
    }
}
