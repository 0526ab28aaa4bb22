//! Following the tier's path: a directory made, moved or mounted there is
//! taken up, one gone is left (`docs/capacity-guard.md`).

use std::path::PathBuf;

use inotify::Inotify;
use lmcache_housekeeping::{Access, TierDir, TierDirError};

use super::Runner;
use crate::tracker::Tracker;
use crate::Watch;

/// Why the guard holds no tier directory for now: the path names none it
/// may guard (`docs/capacity-guard.md`, "The directory it guards").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Away {
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

impl Runner {
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
    pub(super) fn follow_path(&mut self) {
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
    pub(super) fn go_away(&mut self, away: Away) {
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
    pub(super) fn stay(&mut self) {
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
    pub(super) fn take_up(&mut self, now: TierDir) {
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
    pub(super) fn watch(&self, dir: &TierDir) -> Option<Inotify> {
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
}

/// Whether `now` is the directory `held` already holds: the same device
/// and inode, and `held` not removed (a removed directory has no links,
/// and its inode number may already be the new directory's).
pub(super) fn same_dir(now: &TierDir, held: &TierDir) -> bool {
    let stat = |d: &TierDir| nix::sys::stat::fstat(d.fd());
    match (stat(now), stat(held)) {
        (Ok(a), Ok(b)) => (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) && b.st_nlink > 0,
        _ => false,
    }
}
