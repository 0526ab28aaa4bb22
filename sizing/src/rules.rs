//! The pure sizing rules. Inputs are host facts and operator overrides, all in
//! bytes; outputs are [`Decision`]s.
//!
//! Source: `docs/sizing.md` (with worked examples) and `docs/configuration.md`.

use crate::cgroup::MemoryLimit;
use crate::{fmt_gib, Decision, GIB};

/// Lower clamp of the derived L1 budget: 4 GiB.
pub const L1_MIN_BYTES: u64 = 4 * GIB;
/// Upper clamp of the derived L1 budget: 128 GiB.
pub const L1_MAX_BYTES: u64 = 128 * GIB;
/// The L1 a write-buffer-only server gets when the operator set the L1
/// budget to 0 but a disk tier exists: LMCache stages every chunk in L1 on its
/// way to L2, so it cannot run with none. 1 GiB holds 32 in-flight chunks of
/// the 32 MiB the default KV shape gives a 256-token chunk.
pub const WRITE_BUFFER_L1_BYTES: u64 = GIB;
/// The smallest disk tier worth configuring: 1 GiB. Below it the server runs
/// L1-only.
pub const MIN_DISK_TIER_BYTES: u64 = GIB;
/// The reserve left on the volume for whatever shares it is capped at 256 GiB.
pub const RESERVE_CAP_BYTES: u64 = 256 * GIB;
/// Clamp of the I/O worker count.
pub const IO_WORKERS_MIN: u32 = 4;
/// Clamp of the I/O worker count.
pub const IO_WORKERS_MAX: u32 = 32;
/// The buffer alignment LMCache's L1 uses (`--l1-align-bytes`, default 4096);
/// O_DIRECT needs the filesystem block size to divide it.
pub const ODIRECT_ALIGN_BYTES: u64 = 4096;

/// The L1 (CPU memory) budget in bytes, total across tensor-parallel ranks.
///
/// `explicit` is `EREBINE_AGENT_KV_OFFLOAD_SIZE_GB` in bytes when set. The
/// default is 25% of this node's share of the host's memory
/// (`memory_bytes / host_agent_count`), clamped to 4..=128 GiB. A
/// `host_agent_count` of 0 is treated as 1.
pub fn l1_budget(explicit: Option<u64>, memory_bytes: u64, host_agent_count: u32) -> Decision<u64> {
    if let Some(bytes) = explicit {
        return Decision::new(
            bytes,
            "explicit",
            format!(
                "EREBINE_AGENT_KV_OFFLOAD_SIZE_GB sets L1 to {}",
                fmt_gib(bytes)
            ),
        );
    }
    let agents = u64::from(host_agent_count.max(1));
    let share = memory_share(memory_bytes, host_agent_count);
    let quarter = share / 4;
    let value = quarter.clamp(L1_MIN_BYTES, L1_MAX_BYTES);
    let clamp = if quarter < L1_MIN_BYTES {
        ", raised to the 4 GiB floor"
    } else if quarter > L1_MAX_BYTES {
        ", lowered to the 128 GiB ceiling"
    } else {
        ""
    };
    Decision::new(
        value,
        "derived-25pct-ram",
        format!(
            "25% of this node's share of host memory ({} / {} node(s) = {}){}",
            fmt_gib(memory_bytes),
            agents,
            fmt_gib(share),
            clamp
        ),
    )
}

/// An L1 that no node here could hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} gives L1 {}, more than the {} of memory this node has ({}): the server would be OOM-killed as L1 fills. Set it to at most {}, what fits beside the engine ({}; docs/sizing.md, \"Memory-backed volumes\"), or leave it unset for 25% of the share", fmt_gib(*l1_bytes), fmt_gib(*memory_bytes), memory_reason, fmt_gib(MemoryBudget::new(*share_bytes).cache_bytes()), MemoryBudget::new(*share_bytes).describe())]
pub struct L1AboveMemory {
    /// Where the L1 was set (`EREBINE_AGENT_KV_OFFLOAD_SIZE_GB=<v>`, or
    /// `--l1-size-gb <v>` in `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`).
    pub setting: String,
    /// The L1, in bytes.
    pub l1_bytes: u64,
    /// The memory figure it was judged against, in bytes.
    pub memory_bytes: u64,
    /// Where that figure came from ([`memory`]'s reason).
    pub memory_reason: String,
    /// This node's share of it, in bytes.
    pub share_bytes: u64,
}

/// Judges the L1 the server gets against the memory it has
/// (`docs/sizing.md`, "L1 judged against memory"): an L1 set by hand
/// (`setting`: the variable or flag with its value; `None` for the derived
/// one) above the node's memory is refused; one above this node's share
/// (memory / `host_agent_count`) is a warning, as is one above what fits
/// beside the engine in that share ([`MemoryBudget::cache_bytes`]: the
/// share less max(25%, 8 GiB)), and so is a derived L1 raised to its 4 GiB
/// floor above a quarter of the share. Returns the warnings.
///
/// # Errors
/// [`L1AboveMemory`] naming the setting, the figures and where the memory
/// figure came from.
pub fn judge_l1(
    l1_bytes: u64,
    setting: Option<&str>,
    memory: &Decision<u64>,
    host_agent_count: u32,
) -> Result<Vec<String>, L1AboveMemory> {
    let share = memory_share(memory.value, host_agent_count);
    let nodes = host_agent_count.max(1);
    let Some(setting) = setting else {
        return Ok(match l1_bytes > share / 4 && l1_bytes == L1_MIN_BYTES {
            true => vec![format!(
                "L1 is raised to its {} floor, above a quarter of this node's {} share of memory ({}, {nodes} node(s)): set EREBINE_AGENT_KV_OFFLOAD_SIZE_GB to what this node can spare (0 gives a write-buffer L1)",
                fmt_gib(L1_MIN_BYTES),
                fmt_gib(share),
                memory.reason
            )],
            false => Vec::new(),
        });
    };
    if l1_bytes > memory.value {
        return Err(L1AboveMemory {
            setting: setting.to_string(),
            l1_bytes,
            memory_bytes: memory.value,
            memory_reason: memory.reason.clone(),
            share_bytes: share,
        });
    }
    let budget = MemoryBudget::new(share);
    let advised = budget.cache_bytes();
    Ok(if l1_bytes > share {
        vec![format!(
            "{setting} gives L1 {}, above this node's {} share of memory ({}, {nodes} node(s)): the node's engine and the other nodes need the rest; set it to at most {}, what fits beside the engine ({})",
            fmt_gib(l1_bytes),
            fmt_gib(share),
            memory.reason,
            fmt_gib(advised),
            budget.describe()
        )]
    } else if l1_bytes > advised {
        vec![format!(
            "{setting} gives L1 {}, more than fits beside the engine in this node's {} share of memory ({}, {nodes} node(s)): as L1 fills, the engine is left {} and the server is likely to be OOM-killed; set it to at most {} ({})",
            fmt_gib(l1_bytes),
            fmt_gib(share),
            memory.reason,
            fmt_gib(share - l1_bytes),
            fmt_gib(advised),
            budget.describe()
        )]
    } else {
        Vec::new()
    })
}

/// This node's share of `memory_bytes`: the memory divided by the nodes
/// sharing the host (`host_agent_count`, 0 counted as 1).
pub fn memory_share(memory_bytes: u64, host_agent_count: u32) -> u64 {
    memory_bytes / u64::from(host_agent_count.max(1))
}

/// The smallest headroom left for the engine beside L1 and a memory-backed
/// tier: 8 GiB.
pub const MEMORY_HEADROOM_MIN_BYTES: u64 = 8 * GIB;

/// How much of the node's memory L1 and a memory-backed tier may use
/// together, in bytes.
///
/// The engine process (vLLM: Python, the CUDA context, the tokenizer, its
/// own CPU buffers), the LMCache server's own process and the kernel need
/// memory beside the cache. The headroom kept for them is max(25% of the
/// share, 8 GiB): the same quarter the L1 default takes, and at least what
/// one engine process with a loaded model uses on a small host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MemoryBudget {
    /// This node's share of memory: the host's RAM or cgroup limit divided
    /// by the nodes sharing the host.
    pub share_bytes: u64,
    /// What stays for the engine: max(25% of the share, 8 GiB).
    pub headroom_bytes: u64,
}

impl MemoryBudget {
    /// The budget of a node whose share of memory is `share_bytes`.
    pub fn new(share_bytes: u64) -> Self {
        MemoryBudget {
            share_bytes,
            headroom_bytes: (share_bytes / 4).max(MEMORY_HEADROOM_MIN_BYTES),
        }
    }

    /// What L1 and the tier may use together: the share less the headroom.
    pub fn cache_bytes(&self) -> u64 {
        self.share_bytes.saturating_sub(self.headroom_bytes)
    }

    /// What a memory-backed tier beside an L1 of `l1_bytes` may use.
    pub fn tier_bytes(&self, l1_bytes: u64) -> u64 {
        self.cache_bytes().saturating_sub(l1_bytes)
    }

    /// The numbers in words: `"this node's memory share 23.50 GiB less
    /// 8.00 GiB headroom for the engine (max(25%, 8 GiB)) = 15.50 GiB for L1
    /// and the tier"`.
    pub fn describe(&self) -> String {
        format!(
            "this node's memory share {} less {} headroom for the engine (max(25%, 8 GiB)) = {} for L1 and the tier",
            fmt_gib(self.share_bytes),
            fmt_gib(self.headroom_bytes),
            fmt_gib(self.cache_bytes())
        )
    }
}

/// What the host says about its memory, in bytes: the facts
/// [`memory`] decides from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryFacts {
    /// The host's total RAM.
    pub ram_bytes: u64,
    /// The tightest memory limit of this process's cgroup and its
    /// ancestors, with the file it came from, when there is one
    /// ([`crate::cgroup::tightest_limit`]).
    pub cgroup_limit: Option<MemoryLimit>,
}

/// The memory this node may use, in bytes: the host's RAM, or the tightest
/// cgroup memory limit on its way to the root when that is lower (a node in a container
/// must not size L1 from RAM it cannot have; `docs/sizing.md`).
pub fn memory(facts: &MemoryFacts) -> Decision<u64> {
    let ram = facts.ram_bytes;
    match &facts.cgroup_limit {
        Some(limit) if limit.bytes < ram => Decision::new(
            limit.bytes,
            "cgroup-limit",
            format!(
                "cgroup memory limit {} in {} (host RAM {})",
                fmt_gib(limit.bytes),
                limit.file.display(),
                fmt_gib(ram)
            ),
        ),
        _ => Decision::new(ram, "host-ram", format!("host RAM {}", fmt_gib(ram))),
    }
}

/// Statistics of the volume that holds the cache directory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeStats {
    /// Size of the volume (V): blocks x fragment size.
    pub total_bytes: u64,
    /// Space free to an unprivileged writer (F): available blocks x fragment
    /// size. The blocks the filesystem reserves for root are left alone.
    pub free_bytes: u64,
    /// The filesystem's preferred I/O block size (statvfs `f_bsize`).
    pub block_size: u64,
}

/// Capacity of the node's disk tier in bytes; 0 means no disk tier.
///
/// With V = `volume.total_bytes`, F = `volume.free_bytes`, R = `reclaimable`
/// (allocated bytes of cache objects already in the directory):
/// - `explicit` (`EREBINE_AGENT_LMCACHE_DISK_SIZE_GB` in bytes) replaces the
///   derived value, still capped at 75% of V; `Some(0)` disables the tier;
/// - derived: room = F + R - min(10% of V, 256 GiB); capacity =
///   min(75% of V, max(8 x L1, 12.5% of V), room); when room is below 2% of V
///   the tier keeps min(2% of V, F + R);
/// - a result below 1 GiB configures no disk tier.
///
/// Because R counts as free, a restart with a populated cache gets the same
/// capacity a fresh start on the same volume would.
pub fn disk_capacity(
    volume: &VolumeStats,
    reclaimable: u64,
    l1_bytes: u64,
    explicit: Option<u64>,
) -> Decision<u64> {
    let v = u128::from(volume.total_bytes);
    let ceiling = (v * 3 / 4) as u64;
    let available = volume.free_bytes.saturating_add(reclaimable);
    let (value, rule, reason) = match explicit {
        Some(0) => {
            return Decision::new(
                0,
                "disabled-explicit",
                "EREBINE_AGENT_LMCACHE_DISK_SIZE_GB=0 disables the disk tier",
            )
        }
        Some(bytes) if bytes > ceiling => (
            ceiling,
            "explicit-capped-75pct",
            format!(
                "EREBINE_AGENT_LMCACHE_DISK_SIZE_GB asks {}, capped at 75% of the {} volume",
                fmt_gib(bytes),
                fmt_gib(volume.total_bytes)
            ),
        ),
        Some(bytes) => (
            bytes,
            "explicit",
            format!("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB sets {}", fmt_gib(bytes)),
        ),
        None => derived_capacity(volume, available, l1_bytes),
    };
    at_least_minimum(Decision::new(value, rule, reason))
}

/// `capacity`, or no disk tier (rule `below-1gib`) when it is below the
/// 1 GiB minimum.
pub fn at_least_minimum(capacity: Decision<u64>) -> Decision<u64> {
    if capacity.value >= MIN_DISK_TIER_BYTES {
        return capacity;
    }
    Decision::new(
        0,
        "below-1gib",
        format!(
            "disk tier not configured: {} ({}) is below the 1 GiB minimum; \
             the server runs L1-only",
            fmt_gib(capacity.value),
            capacity.reason
        ),
    )
}

/// Capacity of a disk tier whose directory is a volume of its own (the
/// mount point of a whole filesystem), in bytes: the derived rule of
/// [`disk_capacity`] without its spill bound, min(75% of V, room), since
/// nothing else the node writes competes for that volume (`docs/sizing.md`,
/// "A volume of its own"). The reserve and the nearly-full rule stay: the
/// tier is still one writer among the filesystem's own needs.
pub fn own_volume_capacity(volume: &VolumeStats, reclaimable: u64) -> Decision<u64> {
    let available = volume.free_bytes.saturating_add(reclaimable);
    let (value, rule, reason) = derived_capacity_with(volume, available, None);
    at_least_minimum(Decision::new(value, rule, reason))
}

fn derived_capacity(
    volume: &VolumeStats,
    available: u64,
    l1_bytes: u64,
) -> (u64, &'static str, String) {
    derived_capacity_with(volume, available, Some(l1_bytes))
}

/// The derived rule; `l1_bytes` `None` for a volume of its own, which has
/// no spill bound.
fn derived_capacity_with(
    volume: &VolumeStats,
    available: u64,
    l1_bytes: Option<u64>,
) -> (u64, &'static str, String) {
    let v = u128::from(volume.total_bytes);
    let ceiling = (v * 3 / 4) as u64;
    let eighth = (v / 8) as u64;
    let two_pct = (v / 50) as u64;
    let reserve = volume_reserve(volume.total_bytes);
    let room = available.saturating_sub(reserve);
    let volume_txt = format!(
        "volume {}, free {} + reclaimable cache {} = {}",
        fmt_gib(volume.total_bytes),
        fmt_gib(volume.free_bytes),
        fmt_gib(available - volume.free_bytes),
        fmt_gib(available)
    );
    if room < two_pct {
        let value = two_pct.min(available);
        let room_txt = match available.checked_sub(reserve) {
            Some(room) => format!(
                "room after the {} reserve is {}",
                fmt_gib(reserve),
                fmt_gib(room)
            ),
            None => format!(
                "free + reclaimable is {} short of the {} reserve",
                fmt_gib(reserve - available),
                fmt_gib(reserve)
            ),
        };
        return (
            round_down_mib(value),
            "derived-nearly-full",
            format!(
                "volume nearly full: {room_txt}, below 2% of the volume; \
                 the tier keeps min(2% of volume, free + reclaimable) ({volume_txt})"
            ),
        );
    }
    let (spill, spill_rule) = match l1_bytes {
        // A volume of its own: no spill bound.
        None => (u64::MAX, ("", String::new())),
        Some(l1) if l1.saturating_mul(8) >= eighth => (
            l1.saturating_mul(8),
            ("derived-8x-l1", format!("8 x L1 ({})", fmt_gib(l1))),
        ),
        Some(_) => (
            eighth,
            ("derived-12.5pct-volume", "12.5% of the volume".to_string()),
        ),
    };
    let full = match l1_bytes {
        None => ("derived-75pct-own-volume", "75% of a volume of its own"),
        Some(_) => ("derived-75pct-volume", "75% of the volume"),
    };
    let (value, rule, why) = if ceiling <= spill && ceiling <= room {
        (ceiling, full.0, full.1.to_string())
    } else if spill <= room {
        (spill, spill_rule.0, spill_rule.1)
    } else {
        (
            room,
            "derived-room",
            format!("the room left after the {} reserve", fmt_gib(reserve)),
        )
    };
    (
        round_down_mib(value),
        rule,
        format!("bounded by {why} ({volume_txt})"),
    )
}

/// The free space kept on a cache volume for whatever else shares it, in
/// bytes: min(10% of the volume, 256 GiB) of `volume_total_bytes`
/// (`docs/sizing.md`, "Disk tier").
pub fn volume_reserve(volume_total_bytes: u64) -> u64 {
    (volume_total_bytes / 10).min(RESERVE_CAP_BYTES)
}

/// The free space, in bytes, a launch plans to leave on its tier's volume
/// when the tier is full: `min(reserve, max(0, free + reclaimable -
/// capacity))`, with `reserve` from [`volume_reserve`], `free_bytes` the
/// volume's free space, `reclaimable_bytes` what the tier holds now and
/// `capacity_bytes` the tier's capacity, all measured at launch
/// (`docs/capacity-guard.md`, "The reserve at run time"). A tier that grows
/// to its capacity never takes the volume's free space below this line by
/// itself, whichever rule sized it: the derived rules leave the reserve,
/// and a tier sized by the nearly-full rule or given an explicit size is
/// held to what it left.
pub fn free_space_line(
    reserve_bytes: u64,
    free_bytes: u64,
    reclaimable_bytes: u64,
    capacity_bytes: u64,
) -> u64 {
    free_bytes
        .saturating_add(reclaimable_bytes)
        .saturating_sub(capacity_bytes)
        .min(reserve_bytes)
}

pub(crate) fn round_down_mib(bytes: u64) -> u64 {
    bytes & !((1 << 20) - 1)
}

/// Number of I/O worker threads of the fs_native tier: half the host's
/// physical cores (not hyper-threads), rounded half up, clamped to 4..=32.
pub fn io_workers(physical_cores: u32) -> Decision<u32> {
    let half = physical_cores.div_ceil(2);
    let value = half.clamp(IO_WORKERS_MIN, IO_WORKERS_MAX);
    let clamp = if half < IO_WORKERS_MIN {
        ", raised to the minimum of 4"
    } else if half > IO_WORKERS_MAX {
        ", lowered to the maximum of 32"
    } else {
        ""
    };
    Decision::new(
        value,
        "half-physical-cores",
        format!("half of {physical_cores} physical core(s), rounded{clamp}"),
    )
}

/// Outcome of the O_DIRECT test write under the cache directory
/// (see [`crate::probe::probe_odirect`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OdirectProbe {
    /// An aligned 4096-byte write with O_DIRECT succeeded.
    Succeeded,
    /// The write was refused; the text says how (errno and call).
    Failed(String),
    /// No file could be created in the directory at all (permission denied,
    /// operation not permitted, read-only filesystem): the directory is not
    /// writable, whatever O_DIRECT would do. The text says how.
    NotWritable(String),
    /// The volume had no room for the test (`ENOSPC`, `EDQUOT`): whether
    /// O_DIRECT works is not known. The text says which call.
    VolumeFull(String),
}

/// Whether the fs_native tier uses O_DIRECT: only when the filesystem block
/// size divides the 4096-byte buffer alignment AND a test write with O_DIRECT
/// succeeded. Otherwise buffered writes are correct: with a block size that
/// does not divide the alignment every O_DIRECT read and write of LMCache
/// fails ("O_DIRECT buffer address is not aligned"; `docs/sizing.md`,
/// "O_DIRECT").
pub fn use_odirect(block_size: u64, probe: &OdirectProbe) -> Decision<bool> {
    if block_size == 0 || !ODIRECT_ALIGN_BYTES.is_multiple_of(block_size) {
        return Decision::new(
            false,
            "block-size-misaligned",
            format!("filesystem block size {block_size} does not divide the 4096-byte alignment"),
        );
    }
    match probe {
        OdirectProbe::Succeeded => Decision::new(
            true,
            "probe-succeeded",
            format!("block size {block_size} divides 4096 and an O_DIRECT test write succeeded"),
        ),
        OdirectProbe::Failed(why) | OdirectProbe::NotWritable(why) => Decision::new(
            false,
            "probe-failed",
            format!("the filesystem refused an O_DIRECT test write: {why}"),
        ),
        OdirectProbe::VolumeFull(why) => Decision::new(
            false,
            "probe-volume-full",
            format!(
                "the volume had no room for the O_DIRECT test write ({why}): buffered I/O until a launch finds room to test it"
            ),
        ),
    }
}

/// The LMCache chunk size in tokens: `explicit`
/// (`EREBINE_AGENT_LMCACHE_CHUNK_SIZE`) when set, else half of the engine's
/// max batched tokens (at least 1).
///
/// `hybrid_block_size` is the engine's KV block size (tokens) when the model
/// is hybrid-attention, else `None`. A hybrid model's chunk size must be a
/// multiple of that block size, so the value (explicit or derived) is raised
/// to the next multiple of it; in particular an explicit value below the block
/// size is raised to the block size (`docs/sizing.md`, "Chunk size"). A block
/// size of 0 is treated as 1.
pub fn chunk_size(
    explicit: Option<u32>,
    max_num_batched_tokens: u32,
    hybrid_block_size: Option<u32>,
) -> Decision<u32> {
    let base = match explicit {
        Some(tokens) => Decision::new(
            tokens,
            "explicit",
            format!("EREBINE_AGENT_LMCACHE_CHUNK_SIZE sets {tokens} tokens"),
        ),
        None => Decision::new(
            (max_num_batched_tokens / 2).max(1),
            "half-max-batched-tokens",
            format!("half of the engine's {max_num_batched_tokens} max batched tokens"),
        ),
    };
    let Some(block) = hybrid_block_size.map(|b| b.max(1)) else {
        return base;
    };
    let raised = base.value.max(1).div_ceil(block).saturating_mul(block);
    if raised == base.value {
        return Decision::new(
            base.value,
            base.rule,
            format!(
                "{}; a multiple of the hybrid-attention model's {block}-token block size",
                base.reason
            ),
        );
    }
    let rule = if explicit.is_some() {
        "explicit-raised-hybrid-block"
    } else {
        "derived-raised-hybrid-block"
    };
    Decision::new(
        raised,
        rule,
        format!(
            "{} ({}), raised to {raised}: a hybrid-attention model needs a multiple of its {block}-token block size",
            base.reason, base.value
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TIB: u64 = 1024 * GIB;

    fn vol(total: u64, free: u64) -> VolumeStats {
        VolumeStats {
            total_bytes: total,
            free_bytes: free,
            block_size: 4096,
        }
    }

    #[test]
    fn l1_default_is_a_quarter_of_the_node_share_of_memory() {
        let d = l1_budget(None, 64 * GIB, 1);
        assert_eq!(d.value, 16 * GIB);
        assert_eq!(d.rule, "derived-25pct-ram");
        assert_eq!(l1_budget(None, 64 * GIB, 2).value, 8 * GIB);
    }

    #[test]
    fn l1_default_is_clamped_to_4_and_128_gib() {
        let low = l1_budget(None, 8 * GIB, 1);
        assert_eq!(low.value, 4 * GIB);
        assert!(low.reason.contains("4 GiB floor"), "{}", low.reason);
        let high = l1_budget(None, 2 * TIB, 1);
        assert_eq!(high.value, 128 * GIB);
        assert!(high.reason.contains("128 GiB ceiling"));
    }

    #[test]
    fn l1_zero_host_agents_counts_as_one() {
        assert_eq!(l1_budget(None, 64 * GIB, 0).value, 16 * GIB);
    }

    #[test]
    fn l1_explicit_wins() {
        let d = l1_budget(Some(GIB), 64 * GIB, 1);
        assert_eq!((d.value, d.rule), (GIB, "explicit"));
    }

    /// Worked example 1 of docs/sizing.md: 2 TiB volume, 30% used, 32 GiB L1.
    #[test]
    fn two_tib_volume_30pct_used_with_32gib_l1() {
        let v = vol(2 * TIB, 2 * TIB * 7 / 10);
        let d = disk_capacity(&v, 0, 32 * GIB, None);
        // reserve = min(204.8 GiB, 256 GiB); room = 1433.6 - 204.8 = 1228.8 GiB;
        // spill = max(256 GiB, 256 GiB) = 256 GiB; ceiling = 1536 GiB.
        assert_eq!(d.value, 256 * GIB);
        assert_eq!(d.rule, "derived-8x-l1");
    }

    /// Whatever rule sized the tier, a tier grown to its capacity leaves at
    /// least the line free: free + reclaimable - capacity >= line.
    #[test]
    fn a_full_tier_leaves_the_free_space_line_under_every_rule() {
        let cases = [
            (vol(2 * TIB, TIB), 0, None),
            (vol(252 * GIB, 24 * GIB), 0, None),
            (vol(252 * GIB, 20 * GIB), 10 * GIB, None),
            (vol(100 * GIB, 50 * GIB), 0, Some(45 * GIB)),
            (vol(100 * GIB, 50 * GIB), 0, Some(70 * GIB)),
        ];
        for (v, reclaimable, explicit) in cases {
            let capacity = disk_capacity(&v, reclaimable, 4 * GIB, explicit).value;
            let reserve = volume_reserve(v.total_bytes);
            let line = free_space_line(reserve, v.free_bytes, reclaimable, capacity);
            assert!(line <= reserve, "{v:?}");
            let free_when_full = (v.free_bytes + reclaimable).saturating_sub(capacity);
            assert!(free_when_full >= line, "{v:?} {explicit:?}: {capacity}");
        }
        assert_eq!(volume_reserve(2 * TIB), 2 * TIB / 10);
        assert_eq!(volume_reserve(4 * TIB), RESERVE_CAP_BYTES);
        assert_eq!(
            free_space_line(10 * GIB, 30 * GIB, 5 * GIB, 20 * GIB),
            10 * GIB
        );
        assert_eq!(
            free_space_line(10 * GIB, 12 * GIB, 2 * GIB, 10 * GIB),
            4 * GIB
        );
        assert_eq!(free_space_line(10 * GIB, 5 * GIB, 0, 10 * GIB), 0);
    }

    /// A disk of its own: no 8 x L1 bound, so an empty 100 GiB disk gives
    /// 75 GiB where a shared one beside a 1 GiB L1 gives 12.5 GiB; the
    /// reserve and the nearly-full rule still hold there.
    #[test]
    fn a_volume_of_its_own_takes_75pct_within_its_room() {
        let empty = vol(100 * GIB, 99 * GIB);
        let own = own_volume_capacity(&empty, 0);
        assert_eq!(
            (own.value, own.rule),
            (75 * GIB, "derived-75pct-own-volume")
        );
        assert!(
            own.reason.contains("75% of a volume of its own"),
            "{}",
            own.reason
        );
        let shared = disk_capacity(&empty, 0, GIB, None);
        assert_eq!(shared.rule, "derived-12.5pct-volume");
        let half_full = vol(100 * GIB, 50 * GIB);
        let d = own_volume_capacity(&half_full, 20 * GIB);
        assert_eq!((d.value, d.rule), (60 * GIB, "derived-room"));
        let full = own_volume_capacity(&vol(100 * GIB, 5 * GIB), 0);
        assert_eq!((full.value, full.rule), (2 * GIB, "derived-nearly-full"));
        let small = own_volume_capacity(&vol(GIB, GIB), 0);
        assert_eq!((small.value, small.rule), (0, "below-1gib"));
    }

    /// Worked example 2: a volume 99% full, nothing cached.
    #[test]
    fn a_volume_short_of_its_reserve_says_by_how_much() {
        let d = disk_capacity(&vol(252 * GIB, 24 * GIB), 0, 6 * GIB, None);
        assert_eq!(d.rule, "derived-nearly-full");
        assert!(
            d.reason
                .contains("free + reclaimable is 1.20 GiB short of the 25.20 GiB reserve"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn volume_99pct_full_keeps_what_is_free() {
        let v = vol(TIB, TIB / 100);
        let d = disk_capacity(&v, 0, 16 * GIB, None);
        // room = 10.24 - 102.4 < 0 -> min(2% = 20.48 GiB, F = 10.24 GiB)
        assert_eq!(d.value, round_down_mib(TIB / 100));
        assert_eq!(d.rule, "derived-nearly-full");
    }

    /// Worked example 3: a 1 GiB volume gives no disk tier.
    #[test]
    fn one_gib_volume_gives_no_disk_tier() {
        let v = vol(GIB, GIB);
        let d = disk_capacity(&v, 0, 4 * GIB, None);
        assert_eq!(d.value, 0);
        assert_eq!(d.rule, "below-1gib");
        assert!(d.reason.contains("L1-only"));
    }

    /// Worked example 4: an explicit size above 75% of the volume is capped.
    #[test]
    fn explicit_above_75pct_is_capped() {
        let v = vol(400 * GIB, 10 * GIB);
        let d = disk_capacity(&v, 0, 4 * GIB, Some(350 * GIB));
        assert_eq!(d.value, 300 * GIB);
        assert_eq!(d.rule, "explicit-capped-75pct");
    }

    #[test]
    fn explicit_zero_disables_and_small_explicit_is_below_minimum() {
        let v = vol(TIB, TIB);
        assert_eq!(disk_capacity(&v, 0, GIB, Some(0)).rule, "disabled-explicit");
        let d = disk_capacity(&v, 0, GIB, Some(GIB / 2));
        assert_eq!((d.value, d.rule), (0, "below-1gib"));
    }

    #[test]
    fn empty_large_volume_is_bounded_by_twelve_and_a_half_percent() {
        let v = vol(8 * TIB, 8 * TIB);
        let d = disk_capacity(&v, 0, 4 * GIB, None);
        assert_eq!((d.value, d.rule), (TIB, "derived-12.5pct-volume"));
    }

    #[test]
    fn huge_l1_is_bounded_by_75pct_of_the_volume() {
        let v = vol(100 * GIB, 100 * GIB);
        let d = disk_capacity(&v, 0, 128 * GIB, None);
        assert_eq!((d.value, d.rule), (75 * GIB, "derived-75pct-volume"));
    }

    #[test]
    fn tight_volume_is_bounded_by_room_after_reserve() {
        let v = vol(TIB, 200 * GIB);
        let d = disk_capacity(&v, 0, 32 * GIB, None);
        assert_eq!(d.rule, "derived-room");
        assert_eq!(d.value, round_down_mib(200 * GIB - TIB / 10));
    }

    #[test]
    fn workers_are_half_the_physical_cores_clamped() {
        assert_eq!(io_workers(2).value, 4);
        assert_eq!(io_workers(9).value, 5);
        assert_eq!(io_workers(16).value, 8);
        assert_eq!(io_workers(128).value, 32);
        assert_eq!(io_workers(0).value, 4);
    }

    #[test]
    fn odirect_needs_divisible_block_size_and_a_successful_probe() {
        assert!(use_odirect(4096, &OdirectProbe::Succeeded).value);
        assert!(use_odirect(512, &OdirectProbe::Succeeded).value);
        let odd = use_odirect(65536, &OdirectProbe::Succeeded);
        assert_eq!((odd.value, odd.rule), (false, "block-size-misaligned"));
        let refused = use_odirect(4096, &OdirectProbe::Failed("EINVAL".into()));
        assert_eq!((refused.value, refused.rule), (false, "probe-failed"));
        assert!(!use_odirect(0, &OdirectProbe::Succeeded).value);
    }

    #[test]
    fn chunk_size_defaults_to_half_the_batched_tokens() {
        assert_eq!(chunk_size(None, 2048, None).value, 1024);
        assert_eq!(chunk_size(None, 1, None).value, 1);
        assert_eq!(chunk_size(Some(256), 2048, None).value, 256);
        assert_eq!(chunk_size(Some(100), 2048, None).rule, "explicit");
    }

    #[test]
    fn hybrid_attention_chunk_size_is_a_multiple_of_the_block_size() {
        // (explicit, max batched tokens, block size) -> (tokens, rule)
        let cases = [
            (Some(256), 2048, 528, 528, "explicit-raised-hybrid-block"),
            (Some(1056), 2048, 528, 1056, "explicit"),
            (Some(600), 2048, 528, 1056, "explicit-raised-hybrid-block"),
            (None, 2048, 16, 1024, "half-max-batched-tokens"),
            (None, 2048, 768, 1536, "derived-raised-hybrid-block"),
            (None, 512, 1024, 1024, "derived-raised-hybrid-block"),
        ];
        for (explicit, batched, block, tokens, rule) in cases {
            let d = chunk_size(explicit, batched, Some(block));
            assert_eq!(
                (d.value, d.rule),
                (tokens, rule),
                "{explicit:?} {batched} {block}"
            );
            assert_eq!(d.value % block, 0);
            assert!(d.reason.contains("hybrid-attention"), "{}", d.reason);
        }
    }

    proptest! {
        /// "A restart with a populated cache gets the capacity a fresh start
        /// on the same volume would" (`docs/sizing.md`, "Disk tier capacity").
        #[test]
        fn restart_with_cache_equals_fresh_start(
            total in 1u64..(64 * TIB),
            used_pct in 0u64..=100,
            cached_pct in 0u64..=100,
            l1 in 0u64..(256 * GIB),
        ) {
            let free_fresh = total / 100 * (100 - used_pct);
            let cached = free_fresh / 100 * cached_pct;
            let populated = disk_capacity(&vol(total, free_fresh - cached), cached, l1, None);
            let fresh = disk_capacity(&vol(total, free_fresh), 0, l1, None);
            prop_assert_eq!(populated.value, fresh.value);
        }

        /// The tier never exceeds 75% of the volume nor what is free to it.
        #[test]
        fn capacity_never_exceeds_ceiling_or_available(
            total in 1u64..(64 * TIB),
            free_pct in 0u64..=100,
            l1 in 0u64..(256 * GIB),
            explicit in proptest::option::of(0u64..(128 * TIB)),
        ) {
            let free = total / 100 * free_pct;
            let d = disk_capacity(&vol(total, free), 0, l1, explicit);
            prop_assert!(d.value <= total / 4 * 3 + 3);
            if explicit.is_none() {
                prop_assert!(d.value <= free);
            }
            prop_assert!(d.value == 0 || d.value >= MIN_DISK_TIER_BYTES);
        }
    }
}
