//! The launcher's use of the housekeeping crate: what a launch cleans before
//! the server starts (`docs/operations.md`, "Launch housekeeping"), from the
//! scan the launch measured the tier with.

use std::path::PathBuf;

use lmcache_capacity_guard::capacity::guard_spec;
use lmcache_capacity_guard::Watch;
use lmcache_housekeeping::{
    GuardBound, Housekeeping, HousekeepingError, LaunchIdentity, Mode, ScannedTier, TierPolicy,
};
use serde::Serialize;

use crate::env::{NodeEnv, Vars};
use crate::facts::{measure_disk_to_housekeep, Facts, MeasuredTier, TierScan};
use crate::launch_plan::{self, EngineFacts, HostFacts};
use lmcache_sizing::rules;

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

/// What `lmcache-tier housekeep` cleans on a node, as a launch on the same
/// variables and engine facts would (`docs/inspect.md`), each value with
/// where it came from. Only what housekeeping uses is read: no port,
/// executable or server Python is looked at, and the directory is only
/// read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeTier {
    /// The tier directory: `EREBINE_AGENT_LMCACHE_DISK_PATH`, else its
    /// default.
    pub path: PathBuf,
    /// The launch identity of the objects to keep.
    pub identity: LaunchIdentity,
    /// Where the chunk size came from: the given one (the command line's
    /// `--chunk-size`, which wins), else the plan's rule or
    /// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` (`docs/sizing.md`).
    pub chunk_size_source: String,
    /// The capacity the objects are trimmed to, in bytes, and its rule;
    /// `None` when the node's plan has no built-in disk tier (a custom
    /// cascade, or a size of 0).
    pub capacity: Option<lmcache_sizing::Decision<u64>>,
    /// The built-in tier's capacity guard, as [`DiskHousekeeping::guard`]
    /// (`None` without a capacity).
    pub guard: Option<GuardBound>,
}

/// The [`NodeTier`] of the node `vars` describe (its backend taken as
/// `lmcache`) for an engine of `engine`, with `chunk_size` (tokens) given on
/// the command line winning over every other source.
///
/// Errors: a bad variable or engine fact, an unusable cache directory or
/// volume ([`crate::PlanError`]).
pub fn node_tier(
    engine: &EngineFacts,
    vars: &Vars,
    chunk_size: Option<u32>,
) -> Result<NodeTier, crate::PlanError> {
    let node = NodeEnv::from_vars(vars)?;
    launch_plan::check_engine(engine)?;
    let chunk = match chunk_size {
        Some(tokens) => lmcache_sizing::Decision::new(tokens, "flag", "--chunk-size"),
        None => launch_plan::effective_chunk_size(engine, &node)?.1,
    };
    let capacity = match node.builtin_tier() {
        true => Some(node_capacity(&node)?).filter(|c| c.value > 0),
        false => None,
    };
    // The built-in tier as the launch writes it: its guard's bound.
    let guard = capacity.as_ref().and_then(|c| {
        let spec = lmcache_tier_spec::fs_native_tier(&node.disk_path, 1, false, c.value);
        guard_spec(0, &spec).ok().flatten().map(|g| g.bound())
    });
    Ok(NodeTier {
        path: node.disk_path.clone(),
        identity: engine.launch_identity(chunk.value),
        chunk_size_source: chunk.reason,
        capacity,
        guard,
    })
}

/// The built-in tier's capacity as a launch sizes it, from the volume
/// measured read-only.
fn node_capacity(node: &NodeEnv) -> Result<lmcache_sizing::Decision<u64>, crate::PlanError> {
    let host = Facts::host()?;
    let host = HostFacts {
        disk: Some(measure_disk_to_housekeep(&node.disk_path)?),
        ..HostFacts::from(&host)
    };
    let budget = rules::l1_budget(
        node.kv_offload_bytes,
        host.memory.value,
        node.host_agent_count,
    );
    let l1 = launch_plan::server_l1(node, budget)?.value;
    Ok(launch_plan::size_disk_tier(node, &host, l1)?.capacity)
}
