//! The capacity guard of a filesystem tier (`docs/capacity-guard.md`): counts the objects a
//! tier directory holds at start, follows it live, and deletes the least
//! recently used objects when the usage reaches the trigger (see
//! [`crate::capacity`] for which tiers, and when).
//!
//! - Start-up count: the housekeeping scan ([`lmcache_housekeeping::scan()`]):
//!   objects whose names decode, allocated bytes (`st_blocks * 512`, as `du`
//!   counts), ordered by last use (atime or mtime).
//! - Live: inotify on the directory, added before the count so nothing falls
//!   between. `CREATE`, `CLOSE_WRITE` and `MOVED_TO` of an object name
//!   (LMCache renames finished objects into place) re-stat it and track it as
//!   just used; `OPEN` and `ACCESS` (a load) mark it used; `DELETE` and
//!   `MOVED_FROM` forget it. Names that do not decode are ignored.
//! - Rescans: on an inotify queue overflow (`IN_Q_OVERFLOW`, warned once),
//!   every [`GuardOptions::fallback_rescan`] when inotify cannot watch the
//!   directory (warned once), and every [`GuardOptions::shared_rescan`] on a
//!   `"shared": true` tier, whose other writers inotify may not see (network
//!   filesystems). A rescan is a full scan: the interval is stretched to 20x
//!   the last scan's duration, so rescans take at most 5% of a core.
//! - The directory it guards: the one `base_path` names, which is the one
//!   the server writes to (LMCache 0.5.6's `fs` adapter opens
//!   `base_path/<name>` at every store). Every
//!   [`GuardOptions::fallback_rescan`] the guard opens the path again: a
//!   directory made there, moved there or mounted over it is counted and
//!   guarded from then on (on its own volume, with a free-space line
//!   measured there); a symlink put at a path that was not one when the
//!   guard started is never followed; while the path names no directory
//!   the guard may use, it counts and deletes nothing anywhere.
//! - Eviction: one cycle deletes LRU objects until
//!   [`GuardSpec::reclaim_bytes`](capacity::GuardSpec::reclaim_bytes) are
//!   taken from the tier, each by `fstatat`
//!   (`AT_SYMLINK_NOFOLLOW`: still a regular file on the directory's
//!   filesystem) and `unlinkat` relative to the directory descriptor, never
//!   `AT_REMOVEDIR`: only names that decode as objects, only inside the
//!   directory, no symlink followed. One log line per cycle. What a cycle
//!   frees is counted as the filesystem frees it: a file's blocks when its
//!   last link goes, nothing for a file with other hard links.
//! - Free space: the guard keeps the line the launch planned to leave free
//!   on the tier's volume ([`lmcache_sizing::rules::free_space_line`],
//!   measured when it starts), and a line of free inodes (min(10% of the
//!   volume's inodes, 1,000,000, the free inodes at its start)). Every
//!   [`GuardOptions::free_check`] it reads the volume; below either line
//!   (another writer filled the volume or used up its inodes, LMCache's
//!   stores failing with `ENOSPC`) it evicts LRU objects of its own tier,
//!   the same way, until both lines are back or the tier holds nothing
//!   whose deletion frees anything, and at least a regular cycle
//!   (`eviction_ratio` x capacity), so that a tier giving way to another
//!   writer evicts in cycles. Objects with other hard links are left in
//!   place: deleting them would free nothing. A volume with no free byte or
//!   no free inode at all gets a cycle even when the line is 0.
//! - State: [`status`], a file in the tier directory.
//!
//! LMCache's `fs` adapter checks the disk on every lookup and treats a vanished
//! file as a miss (LMCache 0.5.6's `fs` adapter), so deleting under the running
//! server is safe.
pub mod adapter;
pub mod capacity;
mod error;
mod guard;
mod index;
mod options;
mod runner;
pub mod status;
pub mod tracker;

pub use error::GuardError;
pub use guard::{Guard, PriorScan, Watch};
pub use options::GuardOptions;
