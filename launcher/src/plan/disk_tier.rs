//! The node's built-in disk tier as a launch sizes it: its capacity from the
//! volume's figures beside the L1, what a volume of each kind allows, and
//! the refusals that need no scan (`docs/sizing.md`).

use std::path::PathBuf;

use lmcache_sizing::rules::{self, VolumeStats};
use lmcache_sizing::volume::{self, Filesystem, MemoryBudget, TierSizing, VolumeKind};
use lmcache_sizing::{fmt_gib, Decision};
use serde::Serialize;

use super::l1::server_l1;
use lmcache_sizing::disk_load::{tokens_per_second, ReadProbe, ReadRate};

use crate::node::env::{self, DiskRead, NodeEnv};
use crate::plan::inputs::{HostFacts, PlanError};

/// The node's built-in disk tier as sized for this launch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiskTier {
    /// The cache directory (`EREBINE_AGENT_LMCACHE_DISK_PATH`).
    pub path: PathBuf,
    /// Statistics of the volume that holds it.
    pub volume: VolumeStats,
    /// What kind of storage the volume is: local, memory-backed, or one
    /// whose figures are not trusted (`docs/sizing.md`, "Filesystems").
    pub volume_kind: Decision<VolumeKind>,
    /// Allocated bytes of cache objects already in the directory (R).
    pub reclaimable_bytes: u64,
    /// Capacity in bytes; 0 means no disk tier.
    pub capacity: Decision<u64>,
    /// fs_native I/O worker threads.
    pub io_workers: Decision<u32>,
    /// Whether the tier uses O_DIRECT.
    pub use_odirect: Decision<bool>,
    /// Tokens a second the tier can load at the volume's read rate, when
    /// the model's KV bytes a token and a read rate are known
    /// ([`lmcache_sizing::disk_load::tokens_per_second`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<Decision<u64>>,
    /// Why the read probe asked for could not measure the volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_probe_failed: Option<String>,
}

impl DiskTier {
    /// What an operator should know about this tier beside an L1 of
    /// `l1_bytes` on a host of `host_agent_count` nodes: a memory-backed
    /// volume, a tier smaller than L1, an explicit size above the volume's
    /// free space or above this node's share of it, a
    /// filesystem type the rules do not know, an overlay (a container's
    /// writable layer) (`docs/sizing.md`).
    pub fn warnings(&self, l1_bytes: u64, host_agent_count: u32) -> Vec<String> {
        let mut warnings = Vec::new();
        let capacity = self.capacity.value;
        if self.volume_kind.value == VolumeKind::Memory && capacity > 0 {
            warnings.push(format!(
                "the {} disk tier in {} is RAM beside the {} L1 and counts against a container's memory limit ({})",
                fmt_gib(capacity),
                self.path.display(),
                fmt_gib(l1_bytes),
                self.volume_kind.reason,
            ));
        }
        if let Some(warning) = volume::below_l1_warning(capacity, l1_bytes) {
            warnings.push(warning);
        }
        let available = self
            .volume
            .free_bytes
            .saturating_add(self.reclaimable_bytes);
        let measured = self.volume_kind.value != VolumeKind::Untrusted;
        let sizeless = self.volume.total_bytes == 0;
        if self.capacity.rule.starts_with("explicit") && measured && sizeless && capacity > 0 {
            warnings.push(format!(
                "the volume of {} reports no size (as ramfs does: it grows until the host's RAM runs out), so nothing but the tier's {} capacity and its guard bound what is stored there",
                self.path.display(),
                fmt_gib(capacity)
            ));
        } else if self.capacity.rule.starts_with("explicit") && measured && capacity > available {
            warnings.push(format!(
                "EREBINE_AGENT_LMCACHE_DISK_SIZE_GB gives the disk tier {}, more than the {} free on its volume (with {} of cache already there): as the tier fills, the volume fills for everything else on it",
                fmt_gib(capacity),
                fmt_gib(self.volume.free_bytes),
                fmt_gib(self.reclaimable_bytes)
            ));
        } else if measured && !sizeless {
            warnings.extend(share_warning(self, host_agent_count));
        }
        if self.volume_kind.rule == "unrecognised-type" {
            warnings.push(self.volume_kind.reason.clone());
        }
        if let Some(why) = &self.read_probe_failed {
            warnings.push(format!(
                "{}=probe: the read test in {} failed ({why}), so the plan cannot say how many tokens a second the disk tier loads; state the volume's rate in GB/s instead",
                env::DISK_READ_GBPS,
                self.path.display()
            ));
        }
        if self.volume_kind.rule == "overlay" && capacity > 0 {
            warnings.push(format!(
                "the {} disk tier in {} is on an overlay filesystem, such as a container's writable layer: its objects are lost with the container, and it competes with everything else written there ({} volume under the layer). Mount a volume at {}, best a disk of its own (then the tier may take 75% of it)",
                fmt_gib(capacity),
                self.path.display(),
                fmt_gib(self.volume.total_bytes),
                self.path.display(),
            ));
        }
        warnings
    }
}

/// A warning for an explicit size on a local volume above this node's share
/// of its room, F / N + R with N = `host_agent_count` (`docs/sizing.md`,
/// "Several nodes on one host"): nodes on one host are taken to share its
/// volume, as the L1 rule takes them to share its memory, and nodes that
/// each take as much would fill it.
fn share_warning(tier: &DiskTier, host_agent_count: u32) -> Option<String> {
    let nodes = u64::from(host_agent_count.max(1));
    let capacity = tier.capacity.value;
    let share = (tier.volume.free_bytes / nodes).saturating_add(tier.reclaimable_bytes);
    let explicit = tier.capacity.rule.starts_with("explicit");
    let local = tier.volume_kind.value != VolumeKind::Memory;
    (explicit && local && nodes > 1 && capacity > share).then(|| {
        format!(
            "{}={} gives the disk tier {}, above this node's {} share of the room on its volume ({} free / {nodes} nodes, with {} of cache already there; {}={nodes}): nodes that each take as much fill the volume for everything on it; set it to at most {}",
            env::DISK_SIZE_GB,
            capacity as f64 / lmcache_sizing::GIB as f64,
            fmt_gib(capacity),
            fmt_gib(share),
            fmt_gib(tier.volume.free_bytes),
            fmt_gib(tier.reclaimable_bytes),
            env::HOST_AGENT_COUNT,
            fmt_gib(share)
        )
    })
}

/// A volume kind as the launch log and `size` name it.
pub(crate) fn kind_name(kind: VolumeKind) -> &'static str {
    match kind {
        VolumeKind::Local => "local",
        VolumeKind::Memory => "memory-backed",
        VolumeKind::Untrusted => "untrusted figures",
        VolumeKind::NotStorage => "not storage",
    }
}

/// Sizes the node's built-in disk tier under `node.disk_path` beside an L1
/// of `l1_bytes` (the L1 the server gets, [`server_l1`]) from the
/// measured disk facts in `host`: the kind of volume, the capacity, I/O
/// workers and O_DIRECT (`docs/sizing.md`).
///
/// Errors: [`PlanError::NotMeasured`] when `host` carries no disk facts;
/// [`PlanError::Sizing`] for a volume whose figures cannot size the tier
/// without an explicit size, or an explicit memory-backed tier beyond the
/// node's memory budget.
pub fn size_disk_tier(
    node: &NodeEnv,
    host: &HostFacts,
    l1_bytes: u64,
) -> Result<DiskTier, PlanError> {
    let disk = host.disk.as_ref().ok_or(PlanError::NotMeasured)?;
    let (volume_kind, capacity) = tier_capacity(
        node,
        host.memory.value,
        l1_bytes,
        &disk.volume,
        &disk.filesystem,
        disk.reclaimable_bytes,
    )?;
    let probe = disk.read_probe.as_ref();
    Ok(DiskTier {
        load: disk_load(node, probe),
        read_probe_failed: match probe {
            Some(ReadProbe::Failed { why }) => Some(why.clone()),
            _ => None,
        },
        capacity,
        io_workers: rules::io_workers(host.physical_cores),
        use_odirect: rules::use_odirect(disk.volume.block_size, &disk.odirect),
        path: node.disk_path.clone(),
        volume: disk.volume,
        volume_kind,
        reclaimable_bytes: disk.reclaimable_bytes,
    })
}

/// The tokens a second the tier loads: the node's KV bytes a token over
/// the stated read rate, or the one `probe` measured. `None` without a KV
/// size, a rate, or (a dry run) the probe's result.
fn disk_load(node: &NodeEnv, probe: Option<&ReadProbe>) -> Option<Decision<u64>> {
    let rate = match (node.disk_read?, probe) {
        (DiskRead::Stated(bytes_per_s), _) => ReadRate::Stated(bytes_per_s),
        (DiskRead::Probe, Some(probe)) => ReadRate::Probed(probe),
        (DiskRead::Probe, None) => return None,
    };
    tokens_per_second(node.kv_bytes_per_token?, rate)
}

/// The refusals of [`size_disk_tier`] for a volume with figures `volume`
/// of `filesystem` on a host with `memory_bytes` for the node: they depend
/// on neither the tier's contents nor the O_DIRECT probe, so a launch
/// checks them before it creates or locks the cache directory.
///
/// Errors: [`PlanError::Sizing`], and a bad extra `--l1-size-gb`.
pub fn check_volume(
    node: &NodeEnv,
    memory_bytes: u64,
    volume: &VolumeStats,
    filesystem: &Filesystem,
) -> Result<(), PlanError> {
    let budget = rules::l1_budget(node.kv_offload_bytes, memory_bytes, node.host_agent_count);
    let l1_bytes = server_l1(node, budget)?.value;
    tier_capacity(node, memory_bytes, l1_bytes, volume, filesystem, 0).map(drop)
}

/// The kind of the volume and the tier's capacity on it.
fn tier_capacity(
    node: &NodeEnv,
    memory_bytes: u64,
    l1_bytes: u64,
    volume: &VolumeStats,
    filesystem: &Filesystem,
    reclaimable_bytes: u64,
) -> Result<(Decision<VolumeKind>, Decision<u64>), PlanError> {
    let kind = volume::volume_kind(filesystem, volume);
    let share = rules::memory_share(memory_bytes, node.host_agent_count);
    // Several nodes on one host share its volume as they share its memory
    // (`docs/sizing.md`, "Several nodes on one host"): a derived size on a
    // local volume comes from this node's share of its figures.
    let nodes = u64::from(node.host_agent_count.max(1));
    let shared = nodes > 1 && node.disk_size_bytes.is_none() && kind.value == VolumeKind::Local;
    let node_volume = VolumeStats {
        total_bytes: volume.total_bytes / nodes,
        free_bytes: volume.free_bytes / nodes,
        ..*volume
    };
    let mut capacity = volume::tier_capacity(&TierSizing {
        volume: if shared { &node_volume } else { volume },
        kind: &kind,
        reclaimable_bytes,
        l1_bytes,
        explicit: node.disk_size_bytes,
        own_volume: filesystem.own_volume,
        memory: MemoryBudget::new(share),
    })
    .map_err(|source| PlanError::Sizing {
        variable: env::DISK_PATH,
        path: node.disk_path.display().to_string(),
        source,
    })?;
    if shared {
        capacity.reason = format!(
            "{}; from this node's 1/{nodes} share of the volume ({} of {}, {} of {} free; EREBINE_AGENT_HOST_AGENT_COUNT={nodes})",
            capacity.reason,
            fmt_gib(node_volume.total_bytes),
            fmt_gib(volume.total_bytes),
            fmt_gib(node_volume.free_bytes),
            fmt_gib(volume.free_bytes)
        );
    }
    Ok((kind, capacity))
}
