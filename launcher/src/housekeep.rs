//! The launcher's use of the housekeeping crate: what a launch cleans before
//! the server starts (seed, "LMCache Disk Tier": "Launch housekeeping runs
//! before the server starts...").

use std::path::{Path, PathBuf};

use lmcache_housekeeping::{
    housekeep, scan, Access, Housekeeping, HousekeepingError, LaunchIdentity, Mode, TierDir,
    TierPolicy,
};
use serde::Serialize;

/// Allocated bytes of cache objects and stale temp files in `dir` (R of the
/// sizing rules): what a launch's housekeeping could delete to make room.
pub(crate) fn reclaimable_bytes(dir: &Path) -> Result<u64, String> {
    let dir = TierDir::open(dir, Access::ReadOnly).map_err(|e| e.to_string())?;
    let inventory = scan(&dir).map_err(|e| e.to_string())?;
    Ok(inventory.reclaimable_bytes())
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
        housekeep(&self.path, &self.identity, policy, mode)
    }
}
