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
//!   [`GuardSpec::reclaim_bytes`] are taken from the tier, each by `fstatat`
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

pub mod capacity;
mod index;
pub mod status;
pub mod tracker;

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use inotify::{EventMask, Inotify, WatchMask};
use lmcache_housekeeping::codec::{parse_object_name, DATA_SUFFIX};
use lmcache_housekeeping::{scan, Access, Inventory, TierDir, TierDirError};
use lmcache_sizing::rules::{free_space_line, volume_reserve};
use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::libc;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::stat::fstatat;
use nix::unistd::{unlinkat, UnlinkatFlags};

use crate::capacity::{CapacityError, GuardSpec};
use status::{
    CountBytes, Cycle, Evictions, Following, FreeInodes, FreeSpace, GuardStatus, StartCount,
    STATUS_VERSION,
};
use tracker::{Tracker, Victim};

/// Unlinks between two drains of the event queue during an eviction cycle,
/// so the guard's own `DELETE` events do not overflow it (the kernel default
/// `fs.inotify.max_queued_events` is 16,384).
const DRAIN_EVERY: usize = 1024;
/// Size of the buffer events are read into (about 500 events of object names).
const EVENT_BUFFER: usize = 64 * 1024;

/// Timing of a guard.
#[derive(Debug, Clone)]
pub struct GuardOptions {
    /// Least time between two writes of the status file while the usage
    /// changes. Default 1 s.
    pub status_interval: Duration,
    /// Least time between periodic rescans of a `"shared": true` tier.
    /// Default 10 s.
    pub shared_rescan: Duration,
    /// Least time between rescans of a tier inotify cannot watch, and
    /// between two looks at what the tier path names (a directory made,
    /// moved or mounted there; `docs/capacity-guard.md`, "The directory it
    /// guards"). Default 1 s.
    pub fallback_rescan: Duration,
    /// Follow the tier with inotify (default); `false` follows it by rescans
    /// only, as when inotify is unavailable.
    pub inotify: bool,
    /// Time between two reads of the volume's free space (a `statvfs`,
    /// microseconds). Default 250 ms: how soon stores that failed on a full
    /// volume find room again.
    pub free_check: Duration,
    /// Who runs the guard: a token of the launch, or of the `erebine-lmcache`
    /// process, that started it, written into the status file as
    /// [`GuardStatus::owner`] so that its metrics serve only its own guards'
    /// statuses, never one an earlier launch left in the directory
    /// (`docs/metrics.md`, "Capacity guards"). Default `None`.
    pub owner: Option<String>,
    /// Time between two tries again of the objects the guard could not
    /// delete (`docs/capacity-guard.md`, "How it counts and follows the tier"): each
    /// try is one failed `unlink` an object. Default 60 s.
    pub undeletable_retry: Duration,
}

impl Default for GuardOptions {
    fn default() -> Self {
        Self {
            status_interval: Duration::from_secs(1),
            shared_rescan: Duration::from_secs(10),
            fallback_rescan: Duration::from_secs(1),
            inotify: true,
            free_check: Duration::from_millis(250),
            owner: None,
            undeletable_retry: Duration::from_secs(60),
        }
    }
}

/// Why a guard did not start. The server should not start either: its tier
/// would be unbounded.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The capacity is unusable (e.g. larger than the volume).
    #[error(transparent)]
    Capacity(#[from] CapacityError),
    /// The tier directory cannot be opened for deleting.
    #[error("L2 tier {position}: {source}")]
    Dir {
        /// Position of the tier in the cascade.
        position: usize,
        /// What is wrong with the directory.
        #[source]
        source: TierDirError,
    },
    /// The guard's thread or its stop channel could not be made.
    #[error("L2 tier {position}: cannot start the capacity guard: {source}")]
    Io {
        /// Position of the tier in the cascade.
        position: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// A running guard; stops (and writes its status a last time) when dropped.
#[derive(Debug)]
pub struct Guard {
    stop: Option<UnixStream>,
    thread: Option<JoinHandle<()>>,
}

impl Guard {
    /// Checks `spec` against the volume, opens the directory, starts
    /// watching it and counts it, then follows it on a thread of its own.
    /// The count runs on that thread, so the server can start meanwhile.
    ///
    /// # Errors
    /// [`GuardError`]: the capacity exceeds the volume, the directory cannot
    /// be created, opened or written, or the thread cannot start. A
    /// directory inotify cannot watch is not an error (rescans, one warning).
    pub fn start(spec: GuardSpec, options: GuardOptions) -> Result<Self, GuardError> {
        spec.check_volume()?;
        let position = spec.position;
        let dir = TierDir::open(&spec.base_path, Access::ReadWrite)
            .map_err(|source| GuardError::Dir { position, source })?;
        let watch = if options.inotify {
            Watch::add(&dir).map_err(Unwatched::Failed)
        } else {
            Err(Unwatched::Disabled)
        };
        let runner = Runner::new(spec, options, dir, watch.map(|w| w.0));
        Self::spawn(runner, None)
    }

    /// Starts a guard from a count already made: `prior` holds the tier's
    /// directory, the watch added before that count, and the count itself
    /// (a launch scans its tier once, for sizing and housekeeping, and hands
    /// the result here instead of a second scan). Events the watch queued
    /// meanwhile (housekeeping's own deletions among them) are applied
    /// first; a queue that overflowed is a rescan, as always.
    ///
    /// # Errors
    /// As [`Guard::start`]: the capacity exceeds the volume, or the thread
    /// cannot start.
    pub fn start_from_scan(
        spec: GuardSpec,
        options: GuardOptions,
        prior: PriorScan,
    ) -> Result<Self, GuardError> {
        spec.check_volume()?;
        // Without a watch from before the scan, one from now: what changed
        // in between is found by the next rescan.
        let watch = match (options.inotify, prior.watch) {
            (true, Some(watch)) => Ok(watch.0),
            (true, None) => Watch::add(&prior.dir)
                .map(|w| w.0)
                .map_err(Unwatched::Failed),
            (false, _) => Err(Unwatched::Disabled),
        };
        let runner = Runner::new(spec, options, prior.dir, watch);
        Self::spawn(runner, Some((prior.inventory, prior.deleted)))
    }

    fn spawn(mut runner: Runner, prior: Option<(Inventory, Vec<u32>)>) -> Result<Self, GuardError> {
        let position = runner.spec.position;
        let (stop, stopped) =
            UnixStream::pair().map_err(|source| GuardError::Io { position, source })?;
        let thread = std::thread::Builder::new()
            .name(format!("capacity-guard-{position}"))
            .spawn(move || runner.run(stopped, prior))
            .map_err(|source| GuardError::Io { position, source })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Stops the guard and waits for its last status write.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// An inotify watch on a tier directory, for the events the guard follows.
/// Added before a count of the directory, it keeps what changes during the
/// count for the guard to apply after it.
#[derive(Debug)]
pub struct Watch(Inotify);

impl Watch {
    /// Watches `dir` for the events the guard follows.
    ///
    /// # Errors
    /// The inotify error (`EMFILE`/`ENOSPC` when the user's instances or
    /// watches are exhausted).
    pub fn add(dir: &TierDir) -> io::Result<Self> {
        use std::os::fd::AsRawFd;
        let inotify = Inotify::init()?;
        // The directory the descriptor holds, whatever path led to it (a
        // symlink to the tier included): no second lookup of the path.
        let opened = format!("/proc/self/fd/{}", dir.fd().as_raw_fd());
        inotify.watches().add(
            opened,
            WatchMask::CREATE
                | WatchMask::CLOSE_WRITE
                | WatchMask::MOVED_TO
                | WatchMask::OPEN
                | WatchMask::ACCESS
                | WatchMask::DELETE
                | WatchMask::MOVED_FROM
                | WatchMask::DELETE_SELF
                | WatchMask::MOVE_SELF
                | WatchMask::ONLYDIR
                | WatchMask::EXCL_UNLINK,
        )?;
        Ok(Self(inotify))
    }
}

/// A count of a tier made before its guard starts, for
/// [`Guard::start_from_scan`].
#[derive(Debug)]
pub struct PriorScan {
    /// The tier directory, opened for writing.
    pub dir: TierDir,
    /// The watch added before `inventory` was scanned; `None` when inotify
    /// could not watch the directory (the guard then follows it by rescans).
    pub watch: Option<Watch>,
    /// The scan of the directory.
    pub inventory: Inventory,
    /// Indices into `inventory.objects()` of the objects deleted since the
    /// scan (housekeeping's deletions).
    pub deleted: Vec<u32>,
}

/// Why a guard follows its tier by rescans instead of inotify.
#[derive(Debug, thiserror::Error)]
enum Unwatched {
    /// [`GuardOptions::inotify`] is `false`.
    #[error("inotify disabled by the caller")]
    Disabled,
    /// inotify could not watch the directory.
    #[error(transparent)]
    Failed(
        /// The `inotify_init` or `inotify_add_watch` error.
        io::Error,
    ),
}

/// Lowers the calling thread's priority by 10 nice steps (threads it starts
/// inherit it); a thread that cannot keeps its priority.
fn yield_to_the_server() {
    // SAFETY: gettid and setpriority take no pointers; on Linux a thread id
    // names that one thread for PRIO_PROCESS.
    unsafe {
        let tid = libc::gettid();
        let now = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
        libc::setpriority(
            libc::PRIO_PROCESS,
            tid as libc::id_t,
            now.saturating_add(10),
        );
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// `bytes` in GiB, or in MiB below 1 GiB, where the free space of a small
/// volume would read 0.00 GiB.
fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => gib(b),
        b => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
    }
}

/// The inode reserve of a volume of `inodes` inodes: 10% of them, at most
/// a million (`docs/capacity-guard.md`, "The free-space line at run time").
/// A million free inodes let anything on a node create files; the cache's
/// objects are large, so a capacity's worth of them takes few.
fn inode_reserve(inodes: u64) -> u64 {
    (inodes / 10).min(1_000_000)
}

/// What an eviction for the free space must give back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shortfall {
    /// Bytes to free.
    bytes: u64,
    /// Inodes to free (objects whose last link goes).
    inodes: u64,
}

/// What an eviction for the free space must give back, `None` at or above
/// both lines. Below the space line, or on a volume with no free byte
/// (stores fail with `ENOSPC` there, whatever the line): what the free
/// space lacks to reach the line. Below the inode line, or with no free
/// inode: what the free inodes lack. Either way at least `regular_cycle`
/// bytes, so that a tier giving way to another writer evicts in cycles, as
/// at its watermark, not an object at each check while LMCache goes on
/// storing. `inodes` is (free, line), `None` on a volume that reports no
/// inodes.
fn shortfall(
    free: u64,
    line: u64,
    inodes: Option<(u64, u64)>,
    regular_cycle: u64,
) -> Option<Shortfall> {
    let space_short = free == 0 || free < line;
    let inodes_short = inodes.is_some_and(|(free, line)| free == 0 || free < line);
    if !space_short && !inodes_short {
        return None;
    }
    Some(Shortfall {
        bytes: line.saturating_sub(free).max(regular_cycle),
        inodes: inodes.map_or(0, |(free, line)| line.saturating_sub(free)),
    })
}

/// Why the guard holds no tier directory for now: the path names none it
/// may guard (`docs/capacity-guard.md`, "The directory it guards").
#[derive(Debug, Clone, PartialEq, Eq)]
enum Away {
    /// Nothing at the path: the directory was removed or moved away.
    Gone,
    /// A symlink put at the path, which was a directory when the guard
    /// started; its target, for the message.
    Link(PathBuf),
    /// Something at the path that is not a directory.
    NotADirectory,
}

impl std::fmt::Display for Away {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Gone => f.write_str(
                "the tier path names nothing now (the directory was removed or moved away)",
            ),
            Self::Link(target) => write!(
                f,
                "a symlink was put at the tier path (to {}): a guard never follows a link that was not there when it started, so the directory behind it is not guarded; remove the link, or restart the server to guard the tier there",
                target.display()
            ),
            Self::NotADirectory => f.write_str("the tier path names something that is not a directory"),
        }
    }
}

/// The guard's thread.
struct Runner {
    spec: GuardSpec,
    options: GuardOptions,
    dir: TierDir,
    /// The path was a symlink when the directory was opened: the operator
    /// names the tier through a link, which is followed whenever the path
    /// is opened again.
    follows_link: bool,
    /// Set while the path names no directory the guard may guard.
    away: Option<Away>,
    /// The inotify watch ended: look at the path before anything else.
    path_check_due: bool,
    /// The inotify watch ended while the path may still name the
    /// directory: watch it again if it does.
    rewatch: bool,
    inotify: Option<Inotify>,
    tracker: Tracker,
    start: StartCount,
    evictions: Evictions,
    rescans: u64,
    overflows: u64,
    /// The free space kept on the volume; `None` when it reports no size.
    free_space: Option<FreeSpace>,
    /// The largest event lag (ctime to counted) of the last batch that
    /// counted a written object.
    event_lag: Option<Duration>,
    rescan_due: Option<Instant>,
    last_scan: Duration,
    dirty: bool,
    last_write: Option<Instant>,
    warned: Warned,
    name: String,
    /// When the objects marked undeletable are tried again.
    undeletable_retry: Instant,
}

#[derive(Default)]
struct Warned {
    overflow: bool,
    status: bool,
    delete: bool,
    only_undeletable: bool,
    scan: bool,
    statvfs: bool,
    path: bool,
    no_size: bool,
}

impl Runner {
    fn new(
        spec: GuardSpec,
        options: GuardOptions,
        dir: TierDir,
        inotify: Result<Inotify, Unwatched>,
    ) -> Self {
        let inotify = match inotify {
            Ok(inotify) => Some(inotify),
            Err(e) => {
                tracing::warn!(
                    "capacity guard, L2 tier {} ({}): cannot watch the directory with inotify ({e}); following it by rescans every {} s or more instead. Raise fs.inotify.max_user_instances / max_user_watches if they are exhausted",
                    spec.position,
                    spec.base_path.display(),
                    options.fallback_rescan.as_secs_f64()
                );
                None
            }
        };
        let retry = options.undeletable_retry;
        Self {
            spec,
            options,
            follows_link: dir.through_symlink(),
            dir,
            away: None,
            path_check_due: false,
            rewatch: false,
            inotify,
            tracker: Tracker::new(),
            start: StartCount::default(),
            evictions: Evictions::default(),
            rescans: 0,
            overflows: 0,
            free_space: None,
            event_lag: None,
            rescan_due: None,
            last_scan: Duration::ZERO,
            dirty: true,
            last_write: None,
            warned: Warned::default(),
            name: String::new(),
            undeletable_retry: Instant::now() + retry,
        }
    }

    fn label(&self) -> String {
        format!(
            "capacity guard, L2 tier {} ({})",
            self.spec.position,
            self.spec.base_path.display()
        )
    }

    fn run(&mut self, mut stopped: UnixStream, prior: Option<(Inventory, Vec<u32>)>) {
        let mut buffer = vec![0u8; EVENT_BUFFER];
        let started = Instant::now();
        let counted = match &prior {
            Some(_) => "took over the launch's count of",
            None => "counted",
        };
        match prior {
            Some((inventory, deleted)) => self.take_over(&inventory, &deleted),
            None => {
                if let Some(inventory) = self.scan() {
                    self.tracker = Tracker::from_inventory(&inventory);
                }
            }
        }
        self.start = StartCount {
            found: CountBytes {
                objects: self.tracker.len() as u64,
                bytes: self.tracker.usage(),
            },
            millis: started.elapsed().as_millis() as u64,
        };
        tracing::info!(
            "{}: {counted} {} objects, {} at start in {} ms; capacity {}, evicts at {} ({:?}), following by {}",
            self.label(),
            self.start.found.objects,
            gib(self.start.found.bytes),
            self.start.millis,
            gib(self.spec.capacity_bytes),
            gib(self.spec.trigger_bytes()),
            self.spec.role,
            if self.inotify.is_some() { "inotify" } else { "rescans" },
        );
        self.free_space = self.measure_line();
        self.schedule_rescan();
        let mut dir_check = Instant::now() + self.options.fallback_rescan;
        let mut free_check = Instant::now();
        loop {
            if self.path_check_due || Instant::now() >= dir_check {
                self.path_check_due = false;
                self.follow_path();
                dir_check = Instant::now() + self.options.fallback_rescan;
            }
            if self.away.is_none() {
                self.drain(&mut buffer);
                self.retry_undeletable();
                self.evict_if_needed(&mut buffer);
                if Instant::now() >= free_check {
                    self.keep_free_space(&mut buffer);
                    free_check = Instant::now() + self.options.free_check;
                }
                if self.rescan_due.is_some_and(|due| Instant::now() >= due) {
                    self.rescan();
                    self.schedule_rescan();
                    continue;
                }
            }
            if self.path_check_due {
                continue;
            }
            let write_due = self.last_write.map(|t| t + self.options.status_interval);
            if self.dirty && write_due.is_none_or(|due| Instant::now() >= due) {
                self.write_status();
            }
            let mut next = dir_check;
            if self.away.is_none() {
                next = next.min(free_check);
                if self.tracker.undeletable().0 > 0 {
                    next = next.min(self.undeletable_retry);
                }
                if let Some(due) = self.rescan_due {
                    next = next.min(due);
                }
                if let (true, Some(due)) = (self.dirty, write_due) {
                    next = next.min(due);
                }
            }
            let timeout = PollTimeout::try_from(next.saturating_duration_since(Instant::now()))
                .unwrap_or(PollTimeout::MAX);
            let mut fds = vec![PollFd::new(stopped.as_fd(), PollFlags::POLLIN)];
            if let Some(inotify) = &self.inotify {
                fds.push(PollFd::new(inotify.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    tracing::warn!("{}: poll failed ({e}); stopping the guard", self.label());
                    break;
                }
            }
            if fds[0].any().unwrap_or(true) {
                let mut byte = [0u8; 1];
                // Any byte or the other end closing means stop.
                let _ = stopped.read(&mut byte);
                break;
            }
        }
        if self.away.is_none() {
            self.write_status();
        }
    }

    /// The tracker of a scan made before the guard started, less the
    /// objects deleted since. Built on threads of lowered priority (nice
    /// +10): it runs beside the server's start on the same cores, and the
    /// server comes first. Nothing can be evicted before it is done, and
    /// the tier was just housekept below the guard's trigger.
    fn take_over(&mut self, inventory: &Inventory, deleted: &[u32]) {
        self.tracker = std::thread::scope(|scope| {
            let build = scope.spawn(|| {
                yield_to_the_server();
                Tracker::from_inventory_less(inventory, deleted)
            });
            build
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
    }

    fn scan(&mut self) -> Option<lmcache_housekeeping::Inventory> {
        let started = Instant::now();
        let result = scan(&self.dir);
        self.last_scan = started.elapsed();
        match result {
            Ok(inventory) => Some(inventory),
            Err(e) => {
                if !std::mem::replace(&mut self.warned.scan, true) {
                    tracing::warn!(
                        "{}: {e}; usage may be undercounted until a scan succeeds",
                        self.label()
                    );
                }
                None
            }
        }
    }

    /// Opens the tier path again and guards what it names now
    /// (`docs/capacity-guard.md`, "The directory it guards"): the same
    /// directory, nothing to do; another directory (made anew, moved there,
    /// a volume or a bind mount over it, the operator's link pointed
    /// elsewhere), guarded from now on; nothing, a non-directory, or a
    /// symlink put at a path that was not one at the start, nothing guarded
    /// until that changes. A link put there that leads to the directory the
    /// guard holds changes nothing: the server still writes there. When
    /// the path cannot be opened for another reason (a read-only remount,
    /// descriptors exhausted), the guard keeps what it holds.
    fn follow_path(&mut self) {
        let path = &self.spec.base_path;
        let opened = match self.follows_link {
            true => TierDir::open(path, Access::ReadWrite),
            false => TierDir::open_no_follow(path, Access::ReadWrite),
        };
        if let Err(TierDirError::Symlink { .. }) = opened {
            match TierDir::open(path, Access::ReadWrite) {
                Ok(target) if same_dir(&target, &self.dir) => self.stay(),
                _ => {
                    let target = std::fs::read_link(path).unwrap_or_default();
                    self.go_away(Away::Link(target));
                }
            }
            return;
        }
        match opened {
            Ok(now) if same_dir(&now, &self.dir) => self.stay(),
            Ok(now) => self.take_up(now),
            Err(TierDirError::NotFound { .. }) => self.go_away(Away::Gone),
            Err(TierDirError::NotADirectory { .. } | TierDirError::FilesystemRoot { .. }) => {
                self.go_away(Away::NotADirectory)
            }
            Err(e) => {
                if !std::mem::replace(&mut self.warned.path, true) {
                    tracing::warn!(
                        "{}: cannot open the tier path to see what it names ({e}); guarding the directory it holds meanwhile (this warning is given once)",
                        self.label()
                    );
                }
            }
        }
    }

    /// Stops guarding anything until the path names a directory again: no
    /// count, no deletion, no status write, anywhere.
    fn go_away(&mut self, away: Away) {
        if self.away.as_ref() == Some(&away) {
            return;
        }
        tracing::warn!(
            "{}: {away}; nothing is counted or deleted until the path names a directory again",
            self.label()
        );
        self.away = Some(away);
        self.inotify = None;
        self.rewatch = false;
        self.tracker = Tracker::new();
        self.rescan_due = None;
        self.dirty = false;
    }

    /// The path names the directory the guard holds: after a time away,
    /// watch and count it again; after its watch ended (the directory moved
    /// and linked back from the path), watch it again and rescan it.
    fn stay(&mut self) {
        let away = self.away.take();
        if away.is_none() && !std::mem::take(&mut self.rewatch) {
            return;
        }
        self.rewatch = false;
        self.inotify = self.watch(&self.dir);
        match away {
            Some(_) => {
                tracing::warn!(
                    "{}: the tier path names the directory the guard held again; guarding it",
                    self.label()
                );
                self.recount();
            }
            None => self.rescan(),
        }
        self.schedule_rescan();
        self.write_status();
    }

    /// Guards `now`, the directory the path names now instead of the one
    /// the guard held: watched, counted, and on another volume, a
    /// free-space line measured there.
    fn take_up(&mut self, now: TierDir) {
        let other_volume = now.device() != self.dir.device();
        tracing::warn!(
            "{}: the tier path names another directory now{}; guarding that one from now on",
            self.label(),
            match other_volume {
                true => " on another filesystem (a volume mounted over the tier directory, or a link pointed at another volume)",
                false => " (the directory replaced, another bind-mounted over it, or a link pointed elsewhere)",
            }
        );
        self.inotify = self.watch(&now);
        self.dir = now;
        self.away = None;
        self.rewatch = false;
        self.recount();
        if other_volume {
            let before = self.free_space;
            self.free_space = self.measure_line().map(|mut line| {
                if let Some(before) = before {
                    line.evictions = before.evictions;
                    line.shortages = before.shortages;
                }
                line
            });
        }
        self.schedule_rescan();
        self.write_status();
    }

    /// An inotify watch on `dir`, `None` (warned) when inotify cannot
    /// watch it: the guard follows it by rescans then.
    fn watch(&self, dir: &TierDir) -> Option<Inotify> {
        match Watch::add(dir) {
            Ok(watch) => Some(watch.0),
            Err(e) => {
                tracing::warn!(
                    "{}: cannot watch the directory with inotify ({e}); following it by rescans",
                    self.label()
                );
                None
            }
        }
    }

    /// A fresh count of the directory, in place of everything tracked.
    fn recount(&mut self) {
        self.tracker = match self.scan() {
            Some(inventory) => Tracker::from_inventory(&inventory),
            None => Tracker::new(),
        };
        self.rescans += 1;
        self.dirty = true;
    }

    fn rescan(&mut self) {
        if let Some(inventory) = self.scan() {
            self.tracker.reconcile(&inventory);
        }
        self.rescans += 1;
        self.dirty = true;
    }

    fn schedule_rescan(&mut self) {
        let base = if self.inotify.is_none() {
            Some(self.options.fallback_rescan)
        } else if self.spec.shared {
            Some(self.options.shared_rescan)
        } else {
            None
        };
        self.rescan_due = base.map(|b| Instant::now() + b.max(self.last_scan * 20));
    }

    /// Reads and applies every queued event (no wait). A watch that ended
    /// (the directory removed, moved or unmounted) leaves the guard on
    /// rescans and asks for a look at the path first.
    fn drain(&mut self, buffer: &mut [u8]) {
        let mut overflow = false;
        let mut batch_lag: Option<Duration> = None;
        let mut lost_watch = false;
        while let Some(inotify) = &mut self.inotify {
            let events = match inotify.read_events(buffer) {
                Ok(events) => events,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(
                        "{}: reading inotify events failed ({e}); following by rescans from now on",
                        self.label()
                    );
                    lost_watch = true;
                    break;
                }
            };
            let mut any = false;
            for event in events {
                any = true;
                if event.mask.contains(EventMask::Q_OVERFLOW) {
                    overflow = true;
                } else if event.mask.intersects(
                    EventMask::IGNORED
                        | EventMask::DELETE_SELF
                        | EventMask::MOVE_SELF
                        | EventMask::UNMOUNT,
                ) {
                    lost_watch = true;
                } else if let Some(name) = event.name {
                    let dir = &self.dir;
                    let lag = apply(dir, &mut self.tracker, &mut self.dirty, event.mask, name);
                    batch_lag = batch_lag.max(lag);
                }
            }
            if !any || lost_watch {
                break;
            }
        }
        if batch_lag.is_some() {
            self.event_lag = batch_lag;
        }
        if lost_watch {
            tracing::warn!(
                "{}: the directory's inotify watch ended (directory removed, moved or unmounted); following it by rescans",
                self.label()
            );
            self.inotify = None;
            self.path_check_due = true;
            self.rewatch = true;
            self.schedule_rescan();
        }
        if overflow {
            self.overflows += 1;
            if !std::mem::replace(&mut self.warned.overflow, true) {
                tracing::warn!(
                    "{}: the inotify queue overflowed; rescanning the directory (this warning is given once; raise fs.inotify.max_queued_events if it recurs)",
                    self.label()
                );
            }
            self.rescan();
        }
    }

    /// Takes the undeletable marks off when their retry is due, so that
    /// the next cycle tries those objects again.
    fn retry_undeletable(&mut self) {
        if Instant::now() < self.undeletable_retry {
            return;
        }
        self.undeletable_retry = Instant::now() + self.options.undeletable_retry;
        if self.tracker.retry_undeletable() > 0 {
            self.warned.only_undeletable = false;
            self.dirty = true;
        }
    }

    fn evict_if_needed(&mut self, buffer: &mut [u8]) {
        let usage = self.tracker.usage();
        if usage < self.spec.trigger_bytes() {
            return;
        }
        let (stuck, stuck_bytes) = self.tracker.undeletable();
        if stuck == self.tracker.len() {
            if !std::mem::replace(&mut self.warned.only_undeletable, true) {
                tracing::warn!(
                    "{}: the tier is over its trigger ({} of {}) and holds only objects the guard cannot delete ({stuck}, {}): nothing to evict until they can be deleted (tried again every {} s)",
                    self.label(),
                    gib(usage),
                    gib(self.spec.trigger_bytes()),
                    gib(stuck_bytes),
                    self.options.undeletable_retry.as_secs()
                );
            }
            return;
        }
        let run = self.evict(self.spec.reclaim_bytes(usage), buffer);
        self.evictions.add(run.cycle);
        tracing::info!(
            "{}: evicted {} least recently used objects ({} freed{}) in {} ms at usage {} of capacity {}; now {} objects, {}{}",
            self.label(),
            run.cycle.deleted.objects,
            gib(run.cycle.deleted.bytes),
            run.links_deleted(),
            run.cycle.millis,
            gib(usage),
            gib(self.spec.capacity_bytes),
            self.tracker.len(),
            gib(self.tracker.usage()),
            run.misses()
        );
        self.write_status();
    }

    /// The free-space line of the tier's volume, measured now, after the
    /// count: `None` (and a log line) when the volume reports no size or
    /// cannot be measured. The inode line is kept beside it on a volume
    /// that reports inodes.
    fn measure_line(&mut self) -> Option<FreeSpace> {
        let volume = match volume_space(&self.dir) {
            Ok(volume) if volume.total > 0 => volume,
            Ok(_) => {
                tracing::info!(
                    "{}: the volume reports no size (tmpfs without a size limit, ramfs); no free-space line is kept",
                    self.label()
                );
                return None;
            }
            Err(e) => {
                tracing::warn!(
                    "{}: cannot measure the volume ({e}); no free-space line is kept",
                    self.label()
                );
                return None;
            }
        };
        let reserve_bytes = volume_reserve(volume.total);
        let line_bytes = free_space_line(
            reserve_bytes,
            volume.free,
            self.tracker.usage(),
            self.spec.capacity_bytes,
        );
        let inodes = (volume.inodes > 0).then(|| {
            let reserve_inodes = inode_reserve(volume.inodes);
            FreeInodes {
                volume_inodes: volume.inodes,
                reserve_inodes,
                line_inodes: reserve_inodes.min(volume.free_inodes),
                free_inodes: volume.free_inodes,
            }
        });
        let inode_line = match &inodes {
            Some(i) => format!(
                " and {} free inodes of {} (reserve {}; {} free at start)",
                i.line_inodes, i.volume_inodes, i.reserve_inodes, i.free_inodes
            ),
            None => String::from(" (it reports no inodes, so no inode line)"),
        };
        tracing::info!(
            "{}: keeps {} free on the {} volume (reserve {}; free {} + tier {} - capacity {} at start){inode_line}; evicts below that",
            self.label(),
            gib(line_bytes),
            gib(volume.total),
            gib(reserve_bytes),
            gib(volume.free),
            gib(self.tracker.usage()),
            gib(self.spec.capacity_bytes),
        );
        if self.spec.capacity_bytes > volume.total {
            tracing::warn!(
                "{}: the capacity {} is larger than the {} volume the tier is on now; the free-space line bounds it there",
                self.label(),
                gib(self.spec.capacity_bytes),
                gib(volume.total)
            );
        }
        Some(FreeSpace {
            volume_bytes: volume.total,
            reserve_bytes,
            line_bytes,
            free_bytes: volume.free,
            inodes,
            ..FreeSpace::default()
        })
    }

    /// Reads the volume's free space and inodes and, below a line, evicts
    /// LRU objects of the tier for the difference, at least a regular
    /// cycle ([`shortfall`]). With nothing left whose deletion frees
    /// anything it says so once, until the volume is back above the lines.
    fn keep_free_space(&mut self, buffer: &mut [u8]) {
        let Some(mut kept) = self.free_space else {
            return;
        };
        // One guard at a time in this process measures and evicts, so that
        // two tiers on one volume do not both evict for one shortfall.
        static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some(volume) = self.free_now() else {
            return;
        };
        // Published when it moves by a MiB or more, or by 1% of the
        // volume's inodes (the status is written at most once per status
        // interval).
        self.dirty |= volume.free.abs_diff(kept.free_bytes) >= 1 << 20;
        kept.free_bytes = volume.free;
        if let Some(inodes) = &mut kept.inodes {
            self.dirty |= volume.free_inodes.abs_diff(inodes.free_inodes) * 100
                >= inodes.volume_inodes.max(100);
            inodes.free_inodes = volume.free_inodes;
        }
        let regular_cycle = self.spec.reclaim_bytes(self.tracker.usage());
        let inodes = kept.inodes.map(|i| (i.free_inodes, i.line_inodes));
        match shortfall(kept.free_bytes, kept.line_bytes, inodes, regular_cycle) {
            None => self.back_above(&mut kept),
            Some(_) if self.tracker.unlinked() == 0 => self.nothing_to_evict(&mut kept),
            Some(want) => {
                if self.evict_for_free_space(&mut kept, want, buffer) == 0 {
                    self.nothing_to_evict(&mut kept);
                }
            }
        }
        self.free_space = Some(kept);
    }

    /// The volume's size, free space and inodes; `None`, warned once, when
    /// it cannot be measured or reports no size.
    fn free_now(&mut self) -> Option<VolumeSpace> {
        match volume_space(&self.dir) {
            Ok(volume) if volume.total == 0 => {
                if !std::mem::replace(&mut self.warned.no_size, true) {
                    tracing::warn!("{}: the volume reports no size now (remounted without a size limit?); the free-space line is not held while it does (this warning is given once)", self.label());
                }
                None
            }
            Ok(volume) => Some(volume),
            Err(e) => {
                if !std::mem::replace(&mut self.warned.statvfs, true) {
                    tracing::warn!("{}: cannot measure the volume's free space ({e}); the free-space line is not held meanwhile (this warning is given once)", self.label());
                }
                None
            }
        }
    }

    fn back_above(&mut self, kept: &mut FreeSpace) {
        if kept.short_since_unix_ms.take().is_some() {
            tracing::info!(
                "{}: the volume is back above its lines ({})",
                self.label(),
                describe_volume(kept)
            );
            self.dirty = true;
        }
    }

    fn nothing_to_evict(&mut self, kept: &mut FreeSpace) {
        if kept.short_since_unix_ms.is_none() {
            kept.short_since_unix_ms = Some(unix_ms());
            kept.shortages += 1;
            let left = match self.tracker.len() {
                0 => String::new(),
                n => format!(
                    " that would free anything: its {n} objects left have other hard links, which keep their blocks"
                ),
            };
            tracing::warn!(
                "{}: {} and the tier holds nothing more to evict{left}: something else fills the volume; free space there",
                self.label(),
                shortage(kept, "is below")
            );
            self.dirty = true;
        }
    }

    /// One eviction for the free space; returns the objects it deleted.
    fn evict_for_free_space(
        &mut self,
        kept: &mut FreeSpace,
        want: Shortfall,
        buffer: &mut [u8],
    ) -> u64 {
        let before = shortage(kept, "fell below");
        let run = self.evict_freeing(want, buffer);
        if run.cycle.deleted.objects == 0 {
            return 0;
        }
        kept.evictions.add(run.cycle);
        if let Ok(volume) = volume_space(&self.dir) {
            kept.free_bytes = volume.free;
            if let Some(inodes) = &mut kept.inodes {
                inodes.free_inodes = volume.free_inodes;
            }
        }
        let passed = match run.linked_kept {
            0 => String::new(),
            n => format!(
                "; {n} objects with other hard links left in place (deleting them frees nothing)"
            ),
        };
        tracing::warn!(
            "{}: {before} (something else is filling the volume); evicted {} least recently used objects ({} freed) in {} ms; now {}, the tier {} objects, {}{passed}{}",
            self.label(),
            run.cycle.deleted.objects,
            size(run.cycle.deleted.bytes),
            run.cycle.millis,
            describe_volume(kept),
            self.tracker.len(),
            size(self.tracker.usage()),
            run.misses()
        );
        run.cycle.deleted.objects
    }

    /// One eviction cycle for the capacity: deletes the least recently used
    /// objects until `bytes` are taken from the tier or it is empty.
    ///
    /// An object it cannot delete stays counted (its file is on the disk)
    /// and the cycle takes the next ones instead, so the usage still comes
    /// down by `bytes` where the tier holds enough other objects.
    fn evict(&mut self, bytes: u64, buffer: &mut [u8]) -> EvictionRun {
        let started = Instant::now();
        let mut run = EvictionRun::default();
        let target = self.tracker.usage().saturating_sub(bytes);
        loop {
            let now = self.tracker.usage() + run.undeletable_bytes();
            let victims = self.tracker.take_lru(now.saturating_sub(target));
            if now <= target || victims.is_empty() {
                break;
            }
            self.delete(&victims, false, &mut run, buffer);
        }
        self.put_back(&mut run);
        run.finish(started);
        self.dirty = true;
        run
    }

    /// Tracks again what a run left on the disk: objects with other hard
    /// links (marked linked) and objects it could not delete (marked
    /// undeletable), at their places in the use order.
    fn put_back(&mut self, run: &mut EvictionRun) {
        for victim in std::mem::take(&mut run.linked) {
            self.tracker.put_back(&victim);
        }
        for victim in std::mem::take(&mut run.undeletable) {
            self.tracker.put_back_undeletable(&victim);
        }
    }

    /// One eviction for the free space: deletes the least recently used
    /// objects whose deletion frees something until `want` is freed, as
    /// the filesystem counts it, or nothing such is left. Objects found
    /// with other hard links stay, tracked at their place and marked.
    fn evict_freeing(&mut self, want: Shortfall, buffer: &mut [u8]) -> EvictionRun {
        let started = Instant::now();
        let mut run = EvictionRun::default();
        loop {
            let bytes = want.bytes.saturating_sub(run.cycle.deleted.bytes);
            let inodes = want.inodes.saturating_sub(run.freed_inodes);
            let victims = self.tracker.take_lru_freeing(bytes, inodes);
            if victims.is_empty() {
                break;
            }
            self.delete(&victims, true, &mut run, buffer);
        }
        self.put_back(&mut run);
        run.finish(started);
        self.dirty = true;
        run
    }

    /// Deletes `victims` into `run`; with `keep_linked`, a victim whose
    /// file has other hard links is left in place and listed in
    /// `run.linked`.
    fn delete(
        &mut self,
        victims: &[Victim],
        keep_linked: bool,
        run: &mut EvictionRun,
        buffer: &mut [u8],
    ) {
        for (i, victim) in victims.iter().enumerate() {
            self.name.clear();
            // Writing into a String cannot fail.
            let _ = write!(self.name, "{}", self.tracker.file_name(&victim.key));
            match delete_object(&self.dir, &self.name, keep_linked) {
                Ok(Deleted::Freed(bytes)) => {
                    run.cycle.deleted.objects += 1;
                    run.cycle.deleted.bytes += bytes;
                    run.freed_inodes += 1;
                }
                Ok(Deleted::Unlinked) => {
                    run.cycle.deleted.objects += 1;
                    run.linked_deleted += 1;
                }
                Ok(Deleted::Linked) => {
                    run.linked_kept += 1;
                    run.linked.push(*victim);
                }
                Ok(Deleted::Gone) => run.vanished += 1,
                Err(e) => {
                    run.failed += 1;
                    run.undeletable.push(*victim);
                    if !std::mem::replace(&mut self.warned.delete, true) {
                        tracing::warn!(
                            "{}: cannot delete {}: {e}; the file stays, still counted in the tier's usage, and the guard evicts other objects around it (tried again every {} s; this warning is given once)",
                            self.label(),
                            self.dir.entry_path(&self.name).display(),
                            self.options.undeletable_retry.as_secs()
                        );
                    }
                }
            }
            if i % DRAIN_EVERY == DRAIN_EVERY - 1 {
                self.drain(buffer);
            }
        }
    }

    fn write_status(&mut self) {
        let status = GuardStatus {
            version: STATUS_VERSION,
            pid: std::process::id(),
            owner: self.options.owner.clone(),
            tier: self.spec.position,
            adapter_type: self.spec.adapter_type.clone(),
            base_path: self.spec.base_path.clone(),
            role: self.spec.role,
            capacity_bytes: self.spec.capacity_bytes,
            trigger_bytes: self.spec.trigger_bytes(),
            eviction_ratio: self.spec.eviction_ratio,
            tracked: CountBytes {
                objects: self.tracker.len() as u64,
                bytes: self.tracker.usage(),
            },
            undeletable: {
                let (objects, bytes) = self.tracker.undeletable();
                CountBytes {
                    objects: objects as u64,
                    bytes,
                }
            },
            start: self.start,
            evictions: self.evictions,
            following: if self.inotify.is_some() {
                Following::Inotify
            } else {
                Following::Rescans
            },
            rescans: self.rescans,
            overflows: self.overflows,
            event_lag_ms: self
                .event_lag
                .map(|lag| u64::try_from(lag.as_millis()).unwrap_or(u64::MAX)),
            free_space: self.free_space,
            updated_unix_ms: unix_ms(),
        };
        if let Err(e) = status::write_status(self.dir.fd(), &status) {
            if !std::mem::replace(&mut self.warned.status, true) {
                tracing::warn!(
                    "{}: cannot write {}: {e} (this warning is given once)",
                    self.label(),
                    status::GUARD_STATUS_FILE_NAME
                );
            }
        }
        self.dirty = false;
        self.last_write = Some(Instant::now());
    }
}

/// The volume's free space and inodes against their lines, for log lines:
/// `free 10.0 MiB (line 20.0 MiB), 0 free inodes (line 20)`.
fn describe_volume(kept: &FreeSpace) -> String {
    let mut text = format!(
        "free {} (line {})",
        size(kept.free_bytes),
        size(kept.line_bytes)
    );
    if let Some(inodes) = &kept.inodes {
        let _ = write!(
            text,
            ", {} free inodes (line {})",
            inodes.free_inodes, inodes.line_inodes
        );
    }
    text
}

/// What is short on the volume, for log lines: `the volume's free space
/// 1.0 MiB <verb> the 2.0 MiB line`, `the volume's free inodes 0 <verb> the
/// 20 line`, or both; the free space when neither is.
fn shortage(kept: &FreeSpace, verb: &str) -> String {
    let space = format!(
        "the volume's free space {} {verb} the {} line",
        size(kept.free_bytes),
        size(kept.line_bytes)
    );
    let space_short = kept.free_bytes == 0 || kept.free_bytes < kept.line_bytes;
    let inodes = kept
        .inodes
        .filter(|i| i.free_inodes == 0 || i.free_inodes < i.line_inodes)
        .map(|i| {
            format!(
                "the volume's free inodes {} {verb} the {} line",
                i.free_inodes, i.line_inodes
            )
        });
    match (space_short, inodes) {
        (true, Some(inodes)) => format!("{space} and {inodes}"),
        (false, Some(inodes)) => inodes,
        (_, None) => space,
    }
}

/// What one eviction did. `cycle.deleted` counts the objects deleted and
/// the bytes that freed on the volume.
#[derive(Default)]
struct EvictionRun {
    cycle: Cycle,
    /// Deleted objects that were their file's last link (each gave the
    /// volume an inode back).
    freed_inodes: u64,
    /// Deleted objects whose file has other hard links: nothing freed.
    linked_deleted: u64,
    /// Objects with other hard links left in place (free-space evictions).
    linked_kept: u64,
    /// Those objects, to track again.
    linked: Vec<Victim>,
    /// Victims already gone, or no longer regular files of the volume.
    vanished: u64,
    /// Victims that could not be deleted.
    failed: u64,
    /// Those victims, to track again.
    undeletable: Vec<Victim>,
}

impl EvictionRun {
    /// The bytes of the victims that could not be deleted.
    fn undeletable_bytes(&self) -> u64 {
        self.undeletable.iter().map(|v| v.bytes).sum()
    }

    fn finish(&mut self, started: Instant) {
        self.cycle.at_unix_ms = unix_ms();
        self.cycle.millis = started.elapsed().as_millis() as u64;
    }

    /// The part of a capacity cycle's log line about deleted objects with
    /// other hard links, if any.
    fn links_deleted(&self) -> String {
        match self.linked_deleted {
            0 => String::new(),
            n => format!(
                "; {n} of them had other hard links, which keep their blocks: nothing freed for those"
            ),
        }
    }

    /// The tail of a cycle's log line: victims gone or failed, if any.
    fn misses(&self) -> String {
        if self.vanished + self.failed == 0 {
            return String::new();
        }
        format!("; {} already gone, {} failed", self.vanished, self.failed)
    }
}

/// Size, free space and inodes of a volume.
struct VolumeSpace {
    /// Blocks x fragment size, in bytes.
    total: u64,
    /// Blocks available to an unprivileged writer x fragment size, in
    /// bytes, as the launch's sizing measures free space.
    free: u64,
    /// Inodes (`f_files`); 0 on a volume that reports none.
    inodes: u64,
    /// Inodes available to an unprivileged writer (`f_favail`).
    free_inodes: u64,
}

/// The size, free space and inodes of the volume that holds `dir`.
fn volume_space(dir: &TierDir) -> nix::Result<VolumeSpace> {
    let st = nix::sys::statvfs::fstatvfs(dir.fd())?;
    let fragment = st.fragment_size() as u64;
    Ok(VolumeSpace {
        total: (st.blocks() as u64).saturating_mul(fragment),
        free: (st.blocks_available() as u64).saturating_mul(fragment),
        inodes: st.files() as u64,
        free_inodes: st.files_available() as u64,
    })
}

/// Whether `now` is the directory `held` already holds: the same device
/// and inode, and `held` not removed (a removed directory has no links,
/// and its inode number may already be the new directory's).
fn same_dir(now: &TierDir, held: &TierDir) -> bool {
    let stat = |d: &TierDir| nix::sys::stat::fstat(d.fd());
    match (stat(now), stat(held)) {
        (Ok(a), Ok(b)) => (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) && b.st_nlink > 0,
        _ => false,
    }
}

/// Applies one inotify event about `name` to the tracker. Returns, for an
/// object written or renamed into place, how long after its last change
/// (its ctime: the write or the rename, which no writer can backdate, unlike
/// the mtime) the guard counted it.
fn apply(
    dir: &TierDir,
    tracker: &mut Tracker,
    dirty: &mut bool,
    mask: EventMask,
    name: &OsStr,
) -> Option<Duration> {
    if mask.contains(EventMask::ISDIR) {
        return None;
    }
    let name = name.to_str().filter(|n| n.ends_with(DATA_SUFFIX))?;
    let object = parse_object_name(name).ok()?;
    if mask.intersects(EventMask::DELETE | EventMask::MOVED_FROM) {
        *dirty |= tracker.remove(&object).is_some();
        return None;
    }
    if mask.intersects(EventMask::OPEN | EventMask::ACCESS) && tracker.touch(&object) {
        return None;
    }
    *dirty = true;
    // Written, renamed into place, or read but not tracked yet: look at it.
    match fstatat(dir.fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_dev == dir.device() => {
            let bytes = u64::try_from(st.st_blocks).unwrap_or(0) * 512;
            tracker.upsert(&object, bytes, st.st_nlink > 1);
            let written = mask.intersects(EventMask::CLOSE_WRITE | EventMask::MOVED_TO);
            let changed = SystemTime::UNIX_EPOCH
                + Duration::new(
                    u64::try_from(st.st_ctime).unwrap_or(0),
                    u32::try_from(st.st_ctime_nsec).unwrap_or(0),
                );
            written
                .then(|| SystemTime::now().duration_since(changed).ok())
                .flatten()
        }
        _ => {
            tracker.remove(&object);
            None
        }
    }
}

/// What [`delete_object`] did with one object file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deleted {
    /// Deleted, and it was the file's last link: the volume got its
    /// allocated bytes (and an inode) back once no process holds it open.
    Freed(u64),
    /// Deleted, but the file has other hard links, which keep its blocks:
    /// nothing freed.
    Unlinked,
    /// Left in place: the file has other hard links, so deleting it would
    /// free nothing (asked for with `keep_linked`).
    Linked,
    /// Already gone, or no longer a regular file on the directory's
    /// filesystem (left alone).
    Gone,
}

/// Deletes one object file, and says what that freed as the filesystem
/// counts it ([`Deleted`]); with `keep_linked`, a file with other hard
/// links is left in place.
fn delete_object(dir: &TierDir, name: &str, keep_linked: bool) -> Result<Deleted, Errno> {
    let st = match fstatat(dir.fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(Deleted::Gone),
        Err(e) => return Err(e),
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_dev != dir.device() {
        return Ok(Deleted::Gone);
    }
    let linked = st.st_nlink > 1;
    if linked && keep_linked {
        return Ok(Deleted::Linked);
    }
    match unlinkat(dir.fd(), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) if linked => Ok(Deleted::Unlinked),
        Ok(()) => Ok(Deleted::Freed(
            u64::try_from(st.st_blocks).unwrap_or(0) * 512,
        )),
        Err(Errno::ENOENT) => Ok(Deleted::Gone),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn below_the_line_a_cycle_covers_the_deficit_and_at_least_a_regular_cycle() {
        let bytes = |free, line, cycle| shortfall(free, line, None, cycle).map(|s| s.bytes);
        assert_eq!(bytes(300 * MIB, 200 * MIB, 50 * MIB), None);
        assert_eq!(bytes(200 * MIB, 200 * MIB, 50 * MIB), None);
        assert_eq!(bytes(190 * MIB, 200 * MIB, 50 * MIB), Some(50 * MIB));
        assert_eq!(bytes(100 * MIB, 200 * MIB, 50 * MIB), Some(100 * MIB));
        // A full volume: stores fail whatever the line.
        assert_eq!(bytes(0, 200 * MIB, 50 * MIB), Some(200 * MIB));
        assert_eq!(bytes(0, 0, 50 * MIB), Some(50 * MIB));
        assert_eq!(bytes(1, 0, 50 * MIB), None);
    }

    #[test]
    fn below_the_inode_line_a_cycle_frees_the_inodes_missing_and_a_regular_cycle() {
        let room = 300 * MIB;
        let short = |free_inodes, line_inodes| {
            shortfall(room, 200 * MIB, Some((free_inodes, line_inodes)), 50 * MIB)
        };
        assert_eq!(short(1_000, 100), None);
        assert_eq!(short(100, 100), None);
        assert_eq!(
            short(40, 100),
            Some(Shortfall {
                bytes: 50 * MIB,
                inodes: 60
            })
        );
        // No free inode: stores fail whatever the line.
        assert_eq!(
            short(0, 0),
            Some(Shortfall {
                bytes: 50 * MIB,
                inodes: 0
            })
        );
        // Short of both.
        assert_eq!(
            shortfall(100 * MIB, 200 * MIB, Some((0, 20)), 50 * MIB),
            Some(Shortfall {
                bytes: 100 * MIB,
                inodes: 20
            })
        );
        assert_eq!(shortfall(room, 200 * MIB, Some((1, 0)), 50 * MIB), None);
    }

    #[test]
    fn the_inode_reserve_is_a_tenth_of_the_inodes_and_at_most_a_million() {
        assert_eq!(inode_reserve(0), 0);
        assert_eq!(inode_reserve(200), 20);
        assert_eq!(inode_reserve(2_097_152), 209_715);
        assert_eq!(inode_reserve(61_054_976), 1_000_000);
    }

    #[test]
    fn a_deletion_frees_what_the_filesystem_frees() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tier");
        std::fs::create_dir(&dir).unwrap();
        let tier = TierDir::open(&dir, Access::ReadWrite).unwrap();
        let write = |name: &str| std::fs::write(dir.join(name), vec![1u8; 8192]).unwrap();
        let allocated = |name: &str| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(dir.join(name)).unwrap().blocks() * 512
        };
        write("a.data");
        let bytes = allocated("a.data");
        assert!(bytes >= 8192);
        assert_eq!(
            delete_object(&tier, "a.data", true),
            Ok(Deleted::Freed(bytes))
        );
        assert_eq!(delete_object(&tier, "a.data", true), Ok(Deleted::Gone));
        // Two and three links: one outside the tier, one more inside.
        for extra in [&["outside"][..], &["outside", "b.data"]] {
            write("a.data");
            for name in extra {
                let link = match *name {
                    "outside" => tmp.path().join("outside"),
                    other => dir.join(other),
                };
                let _ = std::fs::remove_file(&link);
                std::fs::hard_link(dir.join("a.data"), &link).unwrap();
            }
            assert_eq!(delete_object(&tier, "a.data", true), Ok(Deleted::Linked));
            assert!(dir.join("a.data").exists());
            assert_eq!(delete_object(&tier, "a.data", false), Ok(Deleted::Unlinked));
            assert!(!dir.join("a.data").exists());
        }
        // b.data now has one link inside the tier and the outside one.
        assert_eq!(delete_object(&tier, "b.data", false), Ok(Deleted::Unlinked));
        std::fs::remove_file(tmp.path().join("outside")).unwrap();
        // A symlink with an object's name is not a file of the tier.
        std::os::unix::fs::symlink(tmp.path(), dir.join("c.data")).unwrap();
        assert_eq!(delete_object(&tier, "c.data", false), Ok(Deleted::Gone));
        assert!(dir.join("c.data").symlink_metadata().is_ok());
    }
}
