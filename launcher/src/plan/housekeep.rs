//! The launcher's use of the housekeeping crate: what a launch cleans before
//! the server starts (`docs/operations.md`, "Launch housekeeping"), from the
//! scan the launch measured the tier with.

use std::path::PathBuf;

use lmcache_capacity_guard::Watch;
use lmcache_housekeeping::{
    GuardBound, Housekeeping, HousekeepingError, LaunchIdentity, Mode, ScannedTier, TierPolicy,
};
use serde::Serialize;

use crate::plan::inputs::{MeasuredTier, TierScan};

/// The housekeeping a launch runs on the node's disk tier: purge objects of
/// other launch identities, trim oldest-first to the capacity (or, for a
/// tier left at its capacity guard's trigger, to where the guard leaves
/// it), record the identity in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskHousekeeping {
    /// The tier directory (the node's disk path).
    pub path: PathBuf,
    /// The identity of the objects this launch writes.
    pub identity: LaunchIdentity,
    /// Capacity in bytes the remaining objects are trimmed to.
    pub capacity_bytes: u64,
    /// The tier's capacity guard: the objects left at or above its trigger
    /// are trimmed to its target instead (`docs/capacity-guard.md`,
    /// "Housekeeping and the guard"); `None` when no guard bounds the tier.
    pub guard: Option<GuardBound>,
    /// The scan the plan sized the tier from, housekept from here.
    #[serde(skip)]
    pub tier: MeasuredTier,
}

/// A tier after its housekeeping: the report, and the directory, lock,
/// scan and watch the capacity guard goes on from.
#[derive(Debug)]
pub struct Housekept {
    /// What was (or would be) deleted and kept.
    pub housekeeping: Housekeeping,
    /// The directory, its lock and the scan housekeeping planned from.
    pub tier: ScannedTier,
    /// The capacity guard's watch, added before the scan.
    pub watch: Option<Watch>,
}

impl DiskHousekeeping {
    /// Runs it from the plan's scan of the tier, taken once; without one (a
    /// plan from given facts, a second run, or a [`Mode::Apply`] run of a
    /// plan measured read-only) the tier is opened, locked for
    /// [`Mode::Apply`], and scanned here. `Mode::Apply` deletes and writes
    /// the manifest; the lock in [`Housekept::tier`] must live as long as
    /// the server. `Mode::DryRun` only plans.
    ///
    /// Errors: see [`HousekeepingError`]; a second launch on the same
    /// directory gets [`HousekeepingError::Lock`] naming the holder.
    pub fn run(&self, mode: Mode) -> Result<Housekept, HousekeepingError> {
        self.identity.validate()?;
        let TierScan { scanned, watch } = match self.tier.take() {
            Some(scan) if mode == Mode::DryRun || scan.scanned.lock.is_some() => scan,
            _ => TierScan::take(&self.path, mode)?,
        };
        let policy = TierPolicy {
            capacity_bytes: Some(self.capacity_bytes),
            shared: false,
            fence_only: false,
            guard: self.guard,
        };
        let housekeeping = scanned.housekeep(&self.identity, policy, mode)?;
        Ok(Housekept {
            housekeeping,
            tier: scanned,
            watch,
        })
    }
}
