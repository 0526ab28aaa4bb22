//! The guard's thread: its loop (events, rescans, the path, the
//! free-space check, status writes) and the state it keeps; the steps live
//! in the submodules.

mod events;
mod eviction;
mod follow;
mod free_space;

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use inotify::Inotify;
use lmcache_housekeeping::{scan, Inventory, TierDir};
use nix::errno::Errno;
use nix::libc;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::capacity::GuardSpec;
use crate::error::Unwatched;
use crate::options::GuardOptions;
use crate::status;
use crate::status::{
    CountBytes, Evictions, Following, FreeSpace, GuardStatus, StartCount, STATUS_VERSION,
};
use crate::tracker::Tracker;
use follow::Away;

/// Unlinks between two drains of the event queue during an eviction cycle,
/// so the guard's own `DELETE` events do not overflow it (the kernel default
/// `fs.inotify.max_queued_events` is 16,384).
const DRAIN_EVERY: usize = 1024;
/// Size of the buffer events are read into (about 500 events of object names).
const EVENT_BUFFER: usize = 64 * 1024;

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

/// The guard's thread.
pub(crate) struct Runner {
    pub(crate) spec: GuardSpec,
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
    pub(crate) fn new(
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

    pub(crate) fn run(&mut self, mut stopped: UnixStream, prior: Option<(Inventory, Vec<u32>)>) {
        let mut buffer = vec![0u8; EVENT_BUFFER];
        self.count_at_start(prior);
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
            let next = self.next_wake(dir_check, free_check, write_due);
            if self.stop_requested(&mut stopped, next) {
                break;
            }
        }
        if self.away.is_none() {
            self.write_status();
        }
    }

    /// The start-up count: the launch's scan taken over (`prior`), or a
    /// scan of its own; logged, then the free-space line measured and the
    /// first rescan scheduled.
    fn count_at_start(&mut self, prior: Option<(Inventory, Vec<u32>)>) {
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
    }

    /// When the loop must look again: the next path check, and while the
    /// guard holds its directory the next free-space check, undeletable
    /// retry, rescan and due status write (`write_due`).
    fn next_wake(
        &self,
        dir_check: Instant,
        free_check: Instant,
        write_due: Option<Instant>,
    ) -> Instant {
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
        next
    }

    /// Waits until `next`, an inotify event or a word on `stopped`; true
    /// when the guard is to stop (any byte, the other end closed, or a
    /// failed poll, warned).
    fn stop_requested(&self, stopped: &mut UnixStream, next: Instant) -> bool {
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
                return true;
            }
        }
        if fds[0].any().unwrap_or(true) {
            let mut byte = [0u8; 1];
            // Any byte or the other end closing means stop.
            let _ = stopped.read(&mut byte);
            return true;
        }
        false
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
