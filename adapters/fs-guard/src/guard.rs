//! The running guard: its thread, started on a tier directory (after a
//! count of its own or the launch's scan), stopped on drop; and the inotify
//! watch a launch adds before its scan.

use std::io;
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;

use inotify::{Inotify, WatchMask};
use lmcache_housekeeping::{Access, Inventory, TierDir};

use crate::capacity::GuardSpec;
use crate::error::{GuardError, Unwatched};
use crate::options::GuardOptions;
use crate::runner::Runner;

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
pub struct Watch(pub(crate) Inotify);

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
