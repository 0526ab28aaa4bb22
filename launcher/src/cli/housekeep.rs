//! What `lmcache-tier housekeep` reads of a node before it cleans: the tier
//! directory, the launch identity and the capacity a launch on the same
//! variables and engine facts would use (`docs/inspect.md`).

use std::path::PathBuf;

use lmcache_capacity_guard::capacity::guard_spec;
use lmcache_housekeeping::{GuardBound, LaunchIdentity};
use serde::Serialize;

use crate::node::env::{NodeEnv, Vars};
use crate::plan::facts::{measure_disk_to_housekeep, Facts};
use crate::plan::inputs::{EngineFacts, HostFacts, PlanError};
use crate::plan::launch_plan;

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
    /// The built-in tier's capacity guard, as [`crate::plan::housekeep::DiskHousekeeping::guard`]
    /// (`None` without a capacity).
    pub guard: Option<GuardBound>,
    /// What a launch on the same variables would warn of about its sizes
    /// ([`launch_plan::Sizes::warnings`]).
    pub warnings: Vec<String>,
}

/// The [`NodeTier`] of the node `vars` describe (its backend taken as
/// `lmcache`) for an engine of `engine`, with `chunk_size` (tokens) given on
/// the command line winning over every other source.
///
/// Errors: a bad variable or engine fact, an unusable cache directory or
/// volume ([`PlanError`]).
pub fn node_tier(
    engine: &EngineFacts,
    vars: &Vars,
    chunk_size: Option<u32>,
) -> Result<NodeTier, PlanError> {
    let node = NodeEnv::from_vars(vars)?;
    launch_plan::check_engine(engine)?;
    let chunk = match chunk_size {
        Some(tokens) => lmcache_sizing::Decision::new(tokens, "flag", "--chunk-size"),
        None => {
            let gpu = match engine.max_num_batched_tokens {
                Some(_) => None,
                None => crate::plan::gpu::engine_gpu(vars),
            };
            let batched = launch_plan::engine_batched_tokens(engine, gpu.as_ref());
            launch_plan::effective_chunk_size(engine, &node, &batched)?.1
        }
    };
    let sizes = judge_node(&node)?;
    let capacity = sizes.disk.map(|disk| disk.capacity).filter(|c| c.value > 0);
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
        warnings: sizes.warnings,
    })
}

/// The node's sizes as a launch judges them ([`launch_plan::judge_sizes`]),
/// its built-in tier's volume measured read-only.
fn judge_node(node: &NodeEnv) -> Result<launch_plan::Sizes, PlanError> {
    let host = Facts::host()?;
    let disk = match node.builtin_tier() {
        true => Some(measure_disk_to_housekeep(&node.disk_path)?),
        false => None,
    };
    let host = HostFacts {
        disk,
        ..HostFacts::from(&host)
    };
    launch_plan::judge_sizes(node, &host, launch_plan::Tiers::AsPlanned)
}
