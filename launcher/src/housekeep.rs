//! The launcher's use of the housekeeping crate.

use std::path::Path;

use lmcache_housekeeping::{scan, Access, TierDir};

/// Allocated bytes of cache objects and stale temp files in `dir` (R of the
/// sizing rules): what a launch's housekeeping could delete to make room.
pub(crate) fn reclaimable_bytes(dir: &Path) -> Result<u64, String> {
    let dir = TierDir::open(dir, Access::ReadOnly).map_err(|e| e.to_string())?;
    let inventory = scan(&dir).map_err(|e| e.to_string())?;
    Ok(inventory.reclaimable_bytes())
}
