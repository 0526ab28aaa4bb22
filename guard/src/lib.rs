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
//! - Eviction: one cycle deletes LRU objects until
//!   [`GuardSpec::reclaim_bytes`] are freed, each by `fstatat`
//!   (`AT_SYMLINK_NOFOLLOW`: still a regular file on the directory's
//!   filesystem) and `unlinkat` relative to the directory descriptor, never
//!   `AT_REMOVEDIR`: only names that decode as objects, only inside the
//!   directory, no symlink followed. One log line per cycle.
//! - Free space: the guard keeps the line the launch planned to leave free
//!   on the tier's volume ([`lmcache_sizing::rules::free_space_line`],
//!   measured when it starts). Every [`GuardOptions::free_check`] it reads
//!   the volume's free space; below the line (another writer filled the
//!   volume, LMCache's stores failing with `ENOSPC`) it evicts LRU objects
//!   of its own tier, the same way, until the line is back or the tier is
//!   empty, and at least a regular cycle (`eviction_ratio` x capacity), so
//!   that a tier giving way to another writer evicts in cycles. A volume
//!   with no free space at all gets one even when the line is 0.
//! - State: [`status`], a file in the tier directory.
//!
//! LMCache's `fs` adapter checks the disk on every lookup and treats a vanished
//! file as a miss (LMCache 0.5.6's `fs` adapter), so deleting under the running
//! server is safe.

pub mod capacity;
pub mod status;
pub mod tracker;

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
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
    CountBytes, Cycle, Evictions, Following, FreeSpace, GuardStatus, StartCount, STATUS_VERSION,
};
use tracker::Tracker;

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
    /// Least time between rescans of a tier inotify cannot watch. Default 1 s.
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

/// Bytes to evict for the free space: 0 at or above the line; below it, or
/// on a full volume whatever the line (stores are failing with `ENOSPC`
/// there), what `free_bytes` lacks to reach `line_bytes` and at least
/// `regular_cycle`. A tier that gives way to another writer then evicts in
/// cycles, as at its watermark, not an object at each check while LMCache
/// goes on storing.
fn below_line(free_bytes: u64, line_bytes: u64, regular_cycle: u64) -> u64 {
    if free_bytes > 0 && free_bytes >= line_bytes {
        return 0;
    }
    line_bytes.saturating_sub(free_bytes).max(regular_cycle)
}

/// The guard's thread.
struct Runner {
    spec: GuardSpec,
    options: GuardOptions,
    dir: TierDir,
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
}

#[derive(Default)]
struct Warned {
    overflow: bool,
    status: bool,
    delete: bool,
    scan: bool,
    statvfs: bool,
    other_filesystem: bool,
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
        Self {
            spec,
            options,
            dir,
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
            if Instant::now() >= dir_check {
                self.check_dir_removed();
                dir_check = Instant::now() + self.options.fallback_rescan;
            }
            self.drain(&mut buffer);
            self.evict_if_needed(&mut buffer);
            if Instant::now() >= free_check {
                self.keep_free_space(&mut buffer);
                free_check = Instant::now() + self.options.free_check;
            }
            if self.rescan_due.is_some_and(|due| Instant::now() >= due) {
                if self.inotify.is_none() {
                    self.follow_replaced_dir();
                }
                self.rescan();
                self.schedule_rescan();
                continue;
            }
            let write_due = self.last_write.map(|t| t + self.options.status_interval);
            if self.dirty && write_due.is_none_or(|due| Instant::now() >= due) {
                self.write_status();
            }
            let mut next = Some(
                self.rescan_due
                    .map_or(dir_check, |due| due.min(dir_check))
                    .min(free_check),
            );
            if self.dirty {
                next = match (next, write_due) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            let timeout = match next {
                Some(at) => PollTimeout::try_from(at.saturating_duration_since(Instant::now()))
                    .unwrap_or(PollTimeout::MAX),
                None => PollTimeout::NONE,
            };
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
        self.write_status();
    }

    /// The tracker of a scan made before the guard started, less the
    /// objects deleted since. Built on threads of lowered priority (nice
    /// +10): it runs beside the server's start on the same cores, and the
    /// server comes first. Nothing can be evicted before it is done, and
    /// the tier was just housekept to its capacity.
    fn take_over(&mut self, inventory: &Inventory, deleted: &[u32]) {
        self.tracker = std::thread::scope(|scope| {
            let build = scope.spawn(|| {
                yield_to_the_server();
                let mut tracker = Tracker::from_inventory(inventory);
                let objects = inventory.objects();
                for &i in deleted {
                    if let Some(object) = objects.get(i as usize) {
                        tracker.remove(&inventory.names().name(&object.key));
                    }
                }
                tracker
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

    /// Notices that the directory the guard holds was removed: inotify
    /// reports no removal while the guard's own descriptor keeps it, so
    /// its link count is looked at every [`GuardOptions::fallback_rescan`].
    /// Then the guard follows the path by rescans, and a directory made
    /// there again ([`Runner::follow_replaced_dir`]).
    fn check_dir_removed(&mut self) {
        let removed = nix::sys::stat::fstat(self.dir.fd()).is_ok_and(|st| st.st_nlink == 0);
        if !removed || self.inotify.is_none() {
            return;
        }
        tracing::warn!(
            "{}: the tier directory was removed; following its path by rescans",
            self.label()
        );
        self.inotify = None;
        self.follow_replaced_dir();
        self.schedule_rescan();
    }

    /// Follows a tier directory that was removed and made again, or
    /// replaced by another at `base_path`: when the path now names another
    /// directory than the one the guard holds, the guard opens that one,
    /// watches it and counts it. Until the path names a directory again,
    /// the guard rescans the one it holds (which a removal left empty).
    fn follow_replaced_dir(&mut self) {
        let Ok(now) = TierDir::open(&self.spec.base_path, Access::ReadWrite) else {
            return;
        };
        if same_dir(&now, &self.dir) {
            return;
        }
        if now.device() != self.dir.device() {
            if !std::mem::replace(&mut self.warned.other_filesystem, true) {
                tracing::warn!(
                    "{}: the path now names a directory on another filesystem; not followed (a guard never enters another filesystem): restart the server to guard the tier there",
                    self.label()
                );
            }
            return;
        }
        tracing::warn!(
            "{}: the tier directory was replaced; following the new one",
            self.label()
        );
        self.inotify = Watch::add(&now).ok().map(|watch| watch.0);
        self.dir = now;
        self.rescan();
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

    /// Reads and applies every queued event (no wait).
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
            self.follow_replaced_dir();
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

    fn evict_if_needed(&mut self, buffer: &mut [u8]) {
        let usage = self.tracker.usage();
        if usage < self.spec.trigger_bytes() {
            return;
        }
        let run = self.evict(self.spec.reclaim_bytes(usage), buffer);
        self.evictions.add(run.cycle);
        tracing::info!(
            "{}: evicted {} least recently used objects ({}) in {} ms at usage {} of capacity {}; now {} objects, {}{}",
            self.label(),
            run.cycle.deleted.objects,
            gib(run.cycle.deleted.bytes),
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
    /// start-up count: `None` (and a log line) when the volume reports no
    /// size or cannot be measured.
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
        tracing::info!(
            "{}: keeps {} free on the {} volume (reserve {}; free {} + tier {} - capacity {} at start); evicts below that",
            self.label(),
            gib(line_bytes),
            gib(volume.total),
            gib(reserve_bytes),
            gib(volume.free),
            gib(self.tracker.usage()),
            gib(self.spec.capacity_bytes),
        );
        Some(FreeSpace {
            volume_bytes: volume.total,
            reserve_bytes,
            line_bytes,
            free_bytes: volume.free,
            ..FreeSpace::default()
        })
    }

    /// Reads the volume's free space and, below the line, evicts LRU
    /// objects of the tier for the difference, at least a regular cycle
    /// ([`below_line`]). With nothing left to evict it says so once, until
    /// the free space is back.
    fn keep_free_space(&mut self, buffer: &mut [u8]) {
        let Some(mut kept) = self.free_space else {
            return;
        };
        // One guard at a time in this process measures and evicts, so that
        // two tiers on one volume do not both evict for one shortfall.
        static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some(free) = self.free_now() else {
            return;
        };
        // Published when it moves by a MiB or more (the status is written at
        // most once per status interval).
        self.dirty |= free.abs_diff(kept.free_bytes) >= 1 << 20;
        kept.free_bytes = free;
        let regular_cycle = self.spec.reclaim_bytes(self.tracker.usage());
        match below_line(free, kept.line_bytes, regular_cycle) {
            0 => self.back_above(&mut kept),
            _ if self.tracker.is_empty() => self.nothing_to_evict(&mut kept),
            want => self.evict_for_free_space(&mut kept, want, buffer),
        }
        self.free_space = Some(kept);
    }

    /// The volume's free space in bytes; `None`, warned once, when it
    /// cannot be measured.
    fn free_now(&mut self) -> Option<u64> {
        match volume_space(&self.dir) {
            Ok(volume) if volume.total == 0 => {
                if !std::mem::replace(&mut self.warned.no_size, true) {
                    tracing::warn!("{}: the volume reports no size now (remounted without a size limit?); the free-space line is not held while it does (this warning is given once)", self.label());
                }
                None
            }
            Ok(volume) => Some(volume.free),
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
                "{}: the volume's free space {} is back above the {} line",
                self.label(),
                size(kept.free_bytes),
                size(kept.line_bytes)
            );
            self.dirty = true;
        }
    }

    fn nothing_to_evict(&mut self, kept: &mut FreeSpace) {
        if kept.short_since_unix_ms.is_none() {
            kept.short_since_unix_ms = Some(unix_ms());
            kept.shortages += 1;
            tracing::warn!(
                "{}: the volume's free space {} is below the {} line and the tier holds nothing more to evict: something else fills the volume; free space there",
                self.label(),
                size(kept.free_bytes),
                size(kept.line_bytes)
            );
            self.dirty = true;
        }
    }

    fn evict_for_free_space(&mut self, kept: &mut FreeSpace, want: u64, buffer: &mut [u8]) {
        let free = kept.free_bytes;
        let run = self.evict(want, buffer);
        kept.evictions.add(run.cycle);
        kept.free_bytes = volume_space(&self.dir).map_or(free, |v| v.free);
        tracing::warn!(
            "{}: the volume's free space {} fell below the {} line (something else is filling the volume); evicted {} least recently used objects ({}) in {} ms; now {} free, the tier {} objects, {}{}",
            self.label(),
            size(free),
            size(kept.line_bytes),
            run.cycle.deleted.objects,
            size(run.cycle.deleted.bytes),
            run.cycle.millis,
            size(kept.free_bytes),
            self.tracker.len(),
            size(self.tracker.usage()),
            run.misses()
        );
    }

    /// One eviction cycle: deletes the least recently used objects until
    /// `bytes` are freed or the tier is empty.
    fn evict(&mut self, bytes: u64, buffer: &mut [u8]) -> EvictionRun {
        let started = Instant::now();
        let victims = self.tracker.take_lru(bytes);
        let mut run = EvictionRun::default();
        for (i, victim) in victims.iter().enumerate() {
            self.name.clear();
            // Writing into a String cannot fail.
            let _ = write!(self.name, "{}", self.tracker.file_name(&victim.key));
            match delete_object(&self.dir, &self.name) {
                Ok(Some(bytes)) => {
                    run.cycle.deleted.objects += 1;
                    run.cycle.deleted.bytes += bytes;
                }
                Ok(None) => run.vanished += 1,
                Err(e) => {
                    run.failed += 1;
                    if !std::mem::replace(&mut self.warned.delete, true) {
                        tracing::warn!(
                            "{}: cannot delete {}: {e}; the file stays (this warning is given once)",
                            self.label(),
                            self.dir.entry_path(&self.name).display()
                        );
                    }
                }
            }
            if i % DRAIN_EVERY == DRAIN_EVERY - 1 {
                self.drain(buffer);
            }
        }
        run.cycle.at_unix_ms = unix_ms();
        run.cycle.millis = started.elapsed().as_millis() as u64;
        self.dirty = true;
        run
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

/// What one eviction cycle did.
#[derive(Default)]
struct EvictionRun {
    cycle: Cycle,
    /// Victims already gone, or no longer regular files of the volume.
    vanished: u64,
    /// Victims that could not be deleted.
    failed: u64,
}

impl EvictionRun {
    /// The tail of a cycle's log line: victims gone or failed, if any.
    fn misses(&self) -> String {
        if self.vanished + self.failed == 0 {
            return String::new();
        }
        format!("; {} already gone, {} failed", self.vanished, self.failed)
    }
}

/// Size and free space of a volume, in bytes.
struct VolumeSpace {
    /// Blocks x fragment size.
    total: u64,
    /// Blocks available to an unprivileged writer x fragment size, as the
    /// launch's sizing measures free space.
    free: u64,
}

/// The size and free space of the volume that holds `dir`.
fn volume_space(dir: &TierDir) -> nix::Result<VolumeSpace> {
    let st = nix::sys::statvfs::fstatvfs(dir.fd())?;
    let fragment = st.fragment_size() as u64;
    Ok(VolumeSpace {
        total: (st.blocks() as u64).saturating_mul(fragment),
        free: (st.blocks_available() as u64).saturating_mul(fragment),
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
            tracker.upsert(&object, u64::try_from(st.st_blocks).unwrap_or(0) * 512);
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

/// Deletes one object file: `Ok(Some(bytes))` when deleted, `Ok(None)` when
/// it is gone or no longer a regular file on the directory's filesystem
/// (left alone).
fn delete_object(dir: &TierDir, name: &str) -> Result<Option<u64>, Errno> {
    let st = match fstatat(dir.fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_dev != dir.device() {
        return Ok(None);
    }
    match unlinkat(dir.fd(), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => Ok(Some(u64::try_from(st.st_blocks).unwrap_or(0) * 512)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::below_line;

    #[test]
    fn below_the_line_a_cycle_covers_the_deficit_and_at_least_a_regular_cycle() {
        const MIB: u64 = 1 << 20;
        assert_eq!(below_line(300 * MIB, 200 * MIB, 50 * MIB), 0);
        assert_eq!(below_line(200 * MIB, 200 * MIB, 50 * MIB), 0);
        assert_eq!(below_line(190 * MIB, 200 * MIB, 50 * MIB), 50 * MIB);
        assert_eq!(below_line(100 * MIB, 200 * MIB, 50 * MIB), 100 * MIB);
        // A full volume: stores fail whatever the line.
        assert_eq!(below_line(0, 200 * MIB, 50 * MIB), 200 * MIB);
        assert_eq!(below_line(0, 0, 50 * MIB), 50 * MIB);
        assert_eq!(below_line(1, 0, 50 * MIB), 0);
    }
}
