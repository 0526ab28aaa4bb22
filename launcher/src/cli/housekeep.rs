//! What `lmcache-tier housekeep` reads of a node before it cleans: the tier
//! directory, the launch identity and the capacity a launch on the same
//! variables and engine facts would use (`docs/inspect.md`).

use std::path::PathBuf;

use lmcache_capacity_guard::capacity::guard_spec;
use lmcache_housekeeping::{
    GuardBound, InventoryTotals, LaunchIdentity, Manifest, Mode, Report, TierPolicy,
};
use serde::Serialize;

use crate::cli::{path_flag, CommandError};
use crate::node::env::{self, NodeEnv, Vars};
use crate::output::with_progress;
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
    let weights = crate::plan::weights::measure(engine.weights_source(), vars);
    let mut warnings = sizes.warnings;
    warnings.extend(weights.warning(&engine.model));
    let capacity = sizes.disk.map(|disk| disk.capacity).filter(|c| c.value > 0);
    // The built-in tier as the launch writes it: its guard's bound.
    let guard = capacity.as_ref().and_then(|c| {
        let spec = lmcache_tier_spec::fs_native_tier(&node.disk_path, 1, false, c.value);
        guard_spec(0, &spec).ok().flatten().map(|g| g.bound())
    });
    Ok(NodeTier {
        path: node.disk_path.clone(),
        identity: engine.launch_identity(chunk.value, Some(&weights)),
        chunk_size_source: chunk.reason,
        capacity,
        guard,
        warnings,
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

/// What `lmcache-tier housekeep` was asked for (its flags).
#[derive(Debug, Clone, Default)]
pub struct HousekeepRequest {
    /// The engine facts the launch identity comes from.
    pub engine: EngineFacts,
    /// The tier directory (`--path`); default: the node's.
    pub path: Option<PathBuf>,
    /// The chunk size in tokens (`--chunk-size`); default: the plan's.
    pub chunk_size: Option<u32>,
    /// The capacity to trim to, GiB (`--capacity-gb`); default: the plan's.
    pub capacity_gb: Option<f64>,
    /// Plan only: delete nothing, take no lock, write no manifest.
    pub dry_run: bool,
}

/// What `lmcache-tier housekeep` did: printed as text (the report) or as
/// one JSON object (`docs/inspect.md`).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum HousekeepOutcome {
    /// The node's plan has no built-in disk tier and no `--path` was given.
    NothingToClean {
        /// Why, in one sentence.
        nothing_to_clean: &'static str,
    },
    /// The tier was cleaned (or, with `--dry-run`, planned).
    Cleaned(Box<Cleaned>),
}

/// One tier housekept: its identity, where each setting came from, and
/// what housekeeping scanned, reported and wrote.
#[derive(Debug, Serialize)]
pub struct Cleaned {
    /// The launch identity of the objects kept.
    pub identity: LaunchIdentity,
    /// Where the directory, the chunk size and the capacity came from.
    pub sources: Sources,
    /// What the scan found.
    pub scanned: InventoryTotals,
    /// What was deleted (or would be), and why.
    pub report: Report,
    /// The identity manifest as it stands afterwards.
    pub manifest: Option<Manifest>,
}

/// Where each setting of a housekeeping run came from.
#[derive(Debug, Serialize)]
pub struct Sources {
    /// `--path` or `EREBINE_AGENT_LMCACHE_DISK_PATH`.
    pub path: String,
    /// The chunk size's rule ([`NodeTier::chunk_size_source`]).
    pub chunk_size: String,
    /// The capacity's reason, if there is a capacity.
    pub capacity: Option<String>,
}

/// Why `housekeep` has nothing to clean without a built-in disk tier.
const NOTHING_TO_CLEAN: &str = "the node's plan has no built-in disk tier (EREBINE_AGENT_LMCACHE_L2_ADAPTER replaces it, or its size is 0), so a launch cleans nothing: nothing to clean. Give --path to clean a directory anyway";

/// Housekeeps the tier of the node `vars` describe as `request` asks,
/// logging the plan's warnings and the run's settings. A purge that took
/// much of the tier is the caller's to log, after the report
/// ([`Report::purge_warning`]).
///
/// Errors: a bad variable, engine fact or directory
/// ([`CommandError::Plan`], naming `--path` when it was given), or a failed
/// scan, deletion or lock ([`CommandError::Housekeeping`]).
pub fn housekeep(
    request: HousekeepRequest,
    mut vars: Vars,
) -> Result<HousekeepOutcome, CommandError> {
    vars.insert(env::KV_CACHE_BACKEND.into(), "lmcache".into());
    let path_given = request.path.is_some();
    if let Some(path) = &request.path {
        vars.insert(env::DISK_PATH.into(), path.clone().into_os_string());
    }
    let target = node_tier(&request.engine, &vars, request.chunk_size).map_err(|e| match e {
        PlanError::Config(e) => PlanError::Config(path_flag(e, path_given)),
        other => other,
    })?;
    for warning in &target.warnings {
        tracing::warn!("{warning}");
    }
    if !path_given && target.capacity.is_none() {
        return Ok(HousekeepOutcome::NothingToClean {
            nothing_to_clean: NOTHING_TO_CLEAN,
        });
    }
    let capacity = match request.capacity_gb {
        Some(gib) => lmcache_sizing::gib_to_bytes(gib)
            .map(|bytes| lmcache_sizing::Decision::new(bytes, "flag", "--capacity-gb")),
        None => target.capacity.clone(),
    };
    // A capacity given here is trimmed to as given; the launch's own is
    // trimmed to where its capacity guard leaves the tier.
    let policy = TierPolicy {
        capacity_bytes: capacity.as_ref().map(|c| c.value),
        shared: false,
        fence_only: false,
        guard: target.guard.filter(|_| request.capacity_gb.is_none()),
    };
    let sources = Sources {
        path: match path_given {
            true => "--path".to_string(),
            false => env::DISK_PATH.to_string(),
        },
        chunk_size: target.chunk_size_source.clone(),
        capacity: capacity.as_ref().map(|c| c.reason.clone()),
    };
    tracing::info!(
        "housekeeping {} for model {:?} (world size {}), chunk size {} ({}), capacity {}",
        target.path.display(),
        target.identity.lmcache_model_name(),
        target.identity.kv_world_size(),
        target.identity.chunk_size,
        target.chunk_size_source,
        match &capacity {
            Some(c) => format!("{} ({})", lmcache_sizing::fmt_gib(c.value), c.reason),
            None => "none: no trim".to_string(),
        }
    );
    let (path, identity) = (target.path, target.identity);
    let mode = match request.dry_run {
        true => Mode::DryRun,
        false => Mode::Apply,
    };
    let done = with_progress(&format!("scanning {}", path.display()), || {
        lmcache_housekeeping::housekeep(&path, &identity, policy, mode)
    })?;
    Ok(HousekeepOutcome::Cleaned(Box::new(Cleaned {
        identity,
        sources,
        scanned: done.scanned,
        report: done.report,
        manifest: done.manifest,
    })))
}
