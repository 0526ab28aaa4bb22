//! The launcher's use of the housekeeping crate: what a launch cleans before
//! the server starts (seed, "LMCache Disk Tier": "Launch housekeeping runs
//! before the server starts...").

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use lmcache_housekeeping::{
    housekeep, scan, Access, Housekeeping, HousekeepingError, LaunchIdentity, Mode, TierDir,
    TierPolicy,
};
use serde::Serialize;

/// Allocated bytes of cache objects and stale temp files in `dir` (R of the
/// sizing rules): what a launch's housekeeping could delete to make room.
pub(crate) fn reclaimable_bytes(dir: &Path) -> Result<u64, String> {
    with_progress(&format!("measuring the cache in {}", dir.display()), || {
        let dir = TierDir::open(dir, Access::ReadOnly).map_err(|e| e.to_string())?;
        let inventory = scan(&dir).map_err(|e| e.to_string())?;
        Ok(inventory.reclaimable_bytes())
    })
}

/// The housekeeping a launch runs on the node's disk tier: purge objects of
/// other launch identities, trim oldest-first to the capacity, record the
/// identity in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskHousekeeping {
    /// The tier directory (the node's disk path).
    pub path: PathBuf,
    /// The identity of the objects this launch writes.
    pub identity: LaunchIdentity,
    /// Capacity in bytes the remaining objects are trimmed to.
    pub capacity_bytes: u64,
}

impl DiskHousekeeping {
    /// Runs it: `Mode::Apply` locks the directory (the returned
    /// [`Housekeeping::lock`] must live as long as the server), deletes, and
    /// writes the manifest; `Mode::DryRun` only plans.
    ///
    /// Errors: see [`HousekeepingError`]; a second launch on the same
    /// directory gets [`HousekeepingError::Lock`] naming the holder.
    pub fn run(&self, mode: Mode) -> Result<Housekeeping, HousekeepingError> {
        let policy = TierPolicy {
            capacity_bytes: Some(self.capacity_bytes),
            shared: false,
        };
        with_progress(&format!("housekeeping {}", self.path.display()), || {
            housekeep(&self.path, &self.identity, policy, mode)
        })
    }
}

/// How long work runs before a spinner appears on the terminal.
const PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// Runs `work`, showing `message` with a spinner and the elapsed time on
/// stderr once it has taken longer than a second. Nothing is drawn when
/// stderr is not a terminal (logs and pipes stay clean).
pub fn with_progress<T>(message: &str, work: impl FnOnce() -> T) -> T {
    if !std::io::stderr().is_terminal() {
        return work();
    }
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            if done_rx.recv_timeout(PROGRESS_AFTER).is_ok() {
                return;
            }
            let spinner = ProgressBar::new_spinner().with_message(message.to_string());
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
                spinner.set_style(style);
            }
            spinner.enable_steady_tick(Duration::from_millis(120));
            let _ = done_rx.recv();
            spinner.finish_and_clear();
        });
        let out = work();
        let _ = done_tx.send(());
        out
    })
}
