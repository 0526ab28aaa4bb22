//! Following the tier's inotify events: each batch read, each event
//! applied to the tracker.

use std::ffi::OsStr;
use std::io::{self};
use std::time::{Duration, SystemTime};

use inotify::EventMask;
use lmcache_housekeeping::codec::{parse_object_name, DATA_SUFFIX};
use lmcache_housekeeping::TierDir;
use nix::fcntl::AtFlags;
use nix::libc;
use nix::sys::stat::fstatat;

use super::Runner;
use crate::tracker::Tracker;

impl Runner {
    /// Reads and applies every queued event (no wait). A watch that ended
    /// (the directory removed, moved or unmounted) leaves the guard on
    /// rescans and asks for a look at the path first.
    pub(super) fn drain(&mut self, buffer: &mut [u8]) {
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
            self.watch_lost();
        }
        if overflow {
            self.overflowed();
        }
    }

    /// The directory's watch ended: the path is looked at and watched
    /// again if it still names the directory, and rescans follow it until
    /// then.
    fn watch_lost(&mut self) {
        tracing::warn!(
            "{}: the directory's inotify watch ended (directory removed, moved or unmounted); following it by rescans",
            self.label()
        );
        self.inotify = None;
        self.path_check_due = true;
        self.rewatch = true;
        self.schedule_rescan();
    }

    /// The event queue overflowed: counted, warned once, and the
    /// directory rescanned.
    fn overflowed(&mut self) {
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

/// Applies one inotify event about `name` to the tracker. Returns, for an
/// object written or renamed into place, how long after its last change
/// (its ctime: the write or the rename, which no writer can backdate, unlike
/// the mtime) the guard counted it.
pub(super) fn apply(
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
