//! The one judgement of a node's sizes: the L1 against the memory, the
//! built-in disk tier against its volume, and the refusals and warnings
//! they give. `launch` (and its dry run, and the library's
//! [`crate::plan()`]), `size` and `housekeep` all judge a node here, so
//! they refuse and warn alike for the same inputs (`docs/sizing.md`, "L1
//! judged against memory" and "Several nodes on one host").

use lmcache_sizing::rules;
use lmcache_sizing::Decision;
use lmcache_tier_spec::{fs_native_tier, Cascade};
use serde::Serialize;

use super::disk_tier::{size_disk_tier, DiskTier};
use super::l1::{
    extra_l1_bytes, judge_l1, server_l1, small_l1_warning, with_extra_l1, write_buffer_l1,
};
use crate::node::env::NodeEnv;
use crate::plan::inputs::{HostFacts, PlanError};

/// How the server's L1 is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum L1Mode {
    /// L1 is a cache: LRU eviction, chunks stay after they reach L2.
    Cache,
    /// The operator set L1 to 0: L1 only stages chunks on their way to L2
    /// (`--eviction-policy noop --l2-store-policy skip_l1`).
    WriteBuffer,
}

/// Which L2 tiers a node is judged with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tiers {
    /// Those its launch plans: a custom cascade, else the built-in tier.
    AsPlanned,
    /// The built-in `fs_native` tier whatever the variables (what `size`
    /// and `housekeep` clean and show).
    BuiltIn,
}

/// A node's sizes as judged, with what the operator should be told.
#[derive(Debug, Clone)]
pub struct Sizes {
    /// The L1 budget the operator asked for or the rule derived, in bytes.
    pub l1_budget: Decision<u64>,
    /// The node's own L1 (the budget, or the write buffer's), in bytes.
    pub own_l1: Decision<u64>,
    /// The L1 the server gets (`EREBINE_AGENT_LMCACHE_EXTRA_ARGS` wins),
    /// in bytes.
    pub l1_size: Decision<u64>,
    /// How L1 is run.
    pub l1_mode: L1Mode,
    /// The L2 cascade.
    pub cascade: Cascade,
    /// The built-in disk tier, when it is the node's.
    pub disk: Option<DiskTier>,
    /// Where the cascade came from.
    pub cascade_source: Decision<()>,
    /// The warnings of these sizes: the disk tier's, the L1's against the
    /// memory, an L1 below 1 GiB.
    pub warnings: Vec<String>,
}

/// Judges the sizes of `node` on `host` with `tiers`.
///
/// Errors: an L1 of 0 with no L2 tier ([`PlanError::NothingToCache`]), an
/// L1 set by hand above the node's memory ([`PlanError::L1AboveMemory`]),
/// a volume that cannot hold the tier as asked ([`PlanError::Sizing`]), a
/// bad extra `--l1-size-gb`, and [`PlanError::NotMeasured`] for the
/// built-in tier without disk facts.
pub fn judge_sizes(node: &NodeEnv, host: &HostFacts, tiers: Tiers) -> Result<Sizes, PlanError> {
    let l1_budget = rules::l1_budget(
        node.kv_offload_bytes,
        host.memory.value,
        node.host_agent_count,
    );
    let server = server_l1(node, l1_budget.clone())?.value;
    let (cascade, disk, cascade_source) = match (tiers, node.custom_cascade()) {
        (Tiers::AsPlanned, Some(custom)) => (custom.clone(), None, custom_source(node)),
        _ => builtin_cascade(node, host, server)?,
    };
    let extra_l1 = extra_l1_bytes(node)?;
    let (own_l1, l1_mode) = match (l1_budget.value, cascade.tiers().is_empty()) {
        (0, true) if extra_l1.unwrap_or(0) == 0 => {
            return Err(PlanError::NothingToCache {
                reason: format!("the L1 budget is 0 and {}", cascade_source.reason),
            })
        }
        (0, false) => (write_buffer_l1(), L1Mode::WriteBuffer),
        _ => (l1_budget.clone(), L1Mode::Cache),
    };
    let l1_size = with_extra_l1(node, own_l1.clone())?;
    let mut warnings = disk
        .as_ref()
        .map(|d| d.warnings(l1_size.value, node.host_agent_count))
        .unwrap_or_default();
    warnings.extend(judge_l1(node, &l1_size, &host.memory)?);
    warnings.extend(small_l1_warning(l1_size.value));
    Ok(Sizes {
        l1_budget,
        own_l1,
        l1_size,
        l1_mode,
        cascade,
        disk,
        cascade_source,
        warnings,
    })
}

/// Where a custom cascade came from: the `--l2-adapter`s of
/// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`, else `EREBINE_AGENT_LMCACHE_L2_ADAPTER`.
fn custom_source(node: &NodeEnv) -> Decision<()> {
    match node.extra_args.l2_adapters() {
        Some(_) => Decision::new(
            (),
            "extra-args",
            "EREBINE_AGENT_LMCACHE_EXTRA_ARGS --l2-adapter replaces the node's tiers (not added to them); disk sizing does not apply",
        ),
        None => Decision::new(
            (),
            "custom",
            "EREBINE_AGENT_LMCACHE_L2_ADAPTER replaces the built-in tier; disk sizing does not apply",
        ),
    }
}

/// The built-in `fs_native` tier sized beside an L1 of `l1_bytes` (none
/// when its capacity is 0).
fn builtin_cascade(
    node: &NodeEnv,
    host: &HostFacts,
    l1_bytes: u64,
) -> Result<(Cascade, Option<DiskTier>, Decision<()>), PlanError> {
    let disk = size_disk_tier(node, host, l1_bytes)?;
    if disk.capacity.value == 0 {
        let source = Decision::new((), "l1-only", "no disk tier: L1 only");
        return Ok((Cascade::default(), Some(disk), source));
    }
    let cascade = Cascade(vec![fs_native_tier(
        &disk.path,
        disk.io_workers.value,
        disk.use_odirect.value,
        disk.capacity.value,
    )]);
    let source = Decision::new((), "built-in", "built-in fs_native disk tier");
    Ok((cascade, Some(disk), source))
}
