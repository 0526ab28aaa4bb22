//! What kind of storage holds the disk tier, and how far its statistics can
//! be trusted: the rules that come before the capacity rule.
//!
//! A tier's capacity is derived from its volume's statvfs figures only when
//! those figures describe storage the tier really has. A memory-backed
//! volume (tmpfs, ramfs, a filesystem on a zram or RAM disk) has real
//! figures, but its pages are the node's memory: the tier competes with L1
//! and the engine. FUSE and network filesystems report what their daemon or
//! server chooses (s3fs: 16 MiB blocks x 2^32 = 64 PiB), and a volume shared
//! over the network changes under other writers: neither sizes a tier.
//!
//! Source: `docs/sizing.md`, "Filesystems" and "Memory-backed volumes".

use serde::Serialize;

use crate::rules::{
    at_least_minimum, disk_capacity, own_volume_capacity, round_down_mib, VolumeStats,
};
use crate::{fmt_gib, Decision, GIB};

/// The filesystem that holds a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Filesystem {
    /// Its type as the kernel's mount table names it (`ext4`, `xfs`,
    /// `tmpfs`, `overlay`, `fuse.s3fs`, `nfs4`, ...), else the name of its
    /// statfs magic number.
    pub fs_type: String,
    /// Whether it is mounted read-only (statvfs `ST_RDONLY`).
    pub read_only: bool,
    /// What is mounted, as the mount table names it (`/dev/nvme0n1p1`,
    /// `/dev/zram0`, `server:/export`, `tmpfs`); `None` when the type came
    /// from the statfs magic number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Whether the path is itself the mount point of a whole filesystem
    /// (its `/proc/self/mountinfo` entry has the root `/`): the volume holds
    /// what is under the path and nothing the node writes elsewhere, a disk
    /// of its own. A bind mount of a directory (a container's named volume,
    /// a subdirectory of a shared disk) is not, nor is a path below a mount
    /// point.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_volume: bool,
}

/// Filesystem types whose pages are memory: a tier there is RAM.
pub const MEMORY_TYPES: &[&str] = &["tmpfs", "ramfs", "devtmpfs", "rootfs", "shm"];

/// Kernel pseudo-filesystems: views of kernel state, not storage.
pub const PSEUDO_TYPES: &[&str] = &[
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "debugfs",
    "tracefs",
    "securityfs",
    "configfs",
    "bpf",
    "pstore",
    "efivarfs",
    "mqueue",
    "autofs",
    "binfmt_misc",
    "fusectl",
    "nsfs",
    "rpc_pipefs",
    "selinuxfs",
    "hugetlbfs",
];

/// Block devices whose blocks are memory (`/dev/zram0`, `/dev/ram0`): a
/// local filesystem on them is memory-backed too.
pub const MEMORY_DEVICE_PREFIXES: &[&str] = &["/dev/zram", "/dev/ram"];

/// Network and shared filesystems: their figures come from a server, and
/// other clients change them.
pub const NETWORK_TYPES: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smb2",
    "smbfs",
    "9p",
    "ceph",
    "glusterfs",
    "lustre",
    "gpfs",
    "beegfs",
    "wekafs",
    "afs",
    "ncpfs",
    "coda",
    "pvfs2",
    "orangefs",
    "virtiofs",
    "vboxsf",
    "ocfs2",
    "gfs2",
    "panfs",
];

/// Local filesystems on block storage: their figures describe the disk.
pub const LOCAL_TYPES: &[&str] = &[
    "ext2",
    "ext3",
    "ext4",
    "ext2/ext3/ext4",
    "xfs",
    "btrfs",
    "zfs",
    "f2fs",
    "bcachefs",
    "jfs",
    "reiserfs",
    "nilfs2",
    "overlay",
    "vfat",
    "exfat",
    "ntfs3",
];

/// A volume above this size is not a node's local storage (1 PiB): FUSE
/// daemons report 1 PiB (goofys), 64 PiB (s3fs) or 16 EiB when they have
/// no size to report.
pub const MAX_PLAUSIBLE_VOLUME_BYTES: u64 = 1 << 50;

/// What holds the tier, as far as sizing is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeKind {
    /// Local block storage: the statistics size the tier.
    Local,
    /// The node's memory: the statistics bound the tier, and so does the
    /// memory left beside L1 and the engine.
    Memory,
    /// FUSE, a network or shared filesystem, or figures that cannot be
    /// true: only an explicit size sizes the tier.
    Untrusted,
    /// A kernel pseudo-filesystem (`proc`, `sysfs`, ...): no tier lives
    /// there, whatever its size.
    NotStorage,
}

/// Classifies the volume of `filesystem` with statistics `volume`: kernel
/// pseudo-filesystems first (`pseudo-filesystem`), then memory-backed by
/// type or device (`memory-backed`), then FUSE
/// (`fuse`) and network or shared types (`network`), then figures that
/// cannot be true (`implausible-statistics`: no size, more free than size,
/// or 1 PiB and above), then an overlay (`overlay`: local, its upper
/// layer's figures), the known local types (`local`) and any other
/// type with plausible figures (`unrecognised-type`, trusted, with a
/// warning in its reason).
pub fn volume_kind(filesystem: &Filesystem, volume: &VolumeStats) -> Decision<VolumeKind> {
    let fs = filesystem.fs_type.as_str();
    if PSEUDO_TYPES.contains(&fs) {
        return Decision::new(
            VolumeKind::NotStorage,
            "pseudo-filesystem",
            format!("{fs} is a kernel pseudo-filesystem, not storage"),
        );
    }
    if let Some(why) = memory_backed(filesystem) {
        return Decision::new(
            VolumeKind::Memory,
            "memory-backed",
            format!("{fs} is memory-backed: {why}"),
        );
    }
    if fs == "fuse" || fs == "fuseblk" || fs.starts_with("fuse.") {
        return Decision::new(
            VolumeKind::Untrusted,
            "fuse",
            format!(
                "{fs} is a FUSE filesystem: its size figures come from its daemon, not from storage"
            ),
        );
    }
    if NETWORK_TYPES.contains(&fs) {
        return Decision::new(
            VolumeKind::Untrusted,
            "network",
            format!(
                "{fs} is a network or shared filesystem: its size figures come from a server and change under other clients"
            ),
        );
    }
    if let Some(why) = implausible(volume) {
        return Decision::new(
            VolumeKind::Untrusted,
            "implausible-statistics",
            format!("{fs} reports figures that cannot be true: {why}"),
        );
    }
    if fs == "overlay" {
        return Decision::new(
            VolumeKind::Local,
            "overlay",
            "overlay is a union of layers, such as a container's writable layer: its figures are those of the filesystem under its upper layer",
        );
    }
    if LOCAL_TYPES.contains(&fs) {
        return Decision::new(
            VolumeKind::Local,
            "local",
            format!("{fs} is a local filesystem: its figures describe the storage"),
        );
    }
    Decision::new(
        VolumeKind::Local,
        "unrecognised-type",
        format!(
            "{fs} is not a filesystem type this node knows; its figures are plausible and are used. If it is FUSE, network or memory-backed, set EREBINE_AGENT_LMCACHE_DISK_SIZE_GB"
        ),
    )
}

/// Why the filesystem is memory-backed, or `None`.
fn memory_backed(filesystem: &Filesystem) -> Option<String> {
    if MEMORY_TYPES.contains(&filesystem.fs_type.as_str()) {
        return Some("its pages are this node's RAM".to_string());
    }
    let source = filesystem.source.as_deref()?;
    MEMORY_DEVICE_PREFIXES
        .iter()
        .any(|prefix| {
            source
                .strip_prefix(prefix)
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .then(|| format!("it is on {source}, a block device in RAM"))
}

/// Why `volume`'s figures cannot be those of real storage, or `None`.
fn implausible(volume: &VolumeStats) -> Option<String> {
    if volume.total_bytes == 0 {
        Some("a size of 0 bytes".to_string())
    } else if volume.free_bytes > volume.total_bytes {
        Some(format!(
            "{} free on a {} volume",
            fmt_gib(volume.free_bytes),
            fmt_gib(volume.total_bytes)
        ))
    } else if volume.total_bytes >= MAX_PLAUSIBLE_VOLUME_BYTES {
        Some(format!(
            "a size of {}, at or above the 1 PiB no node's local storage reaches",
            fmt_pib(volume.total_bytes)
        ))
    } else {
        None
    }
}

/// Formats a byte count as GiB with two decimals rounded down, for a
/// largest value to write: `"9.65 GiB"` for 9.6551 GiB.
fn fmt_gib_down(bytes: u64) -> String {
    format!(
        "{:.2} GiB",
        (bytes as f64 / GIB as f64 * 100.0).floor() / 100.0
    )
}

/// Formats a byte count as PiB with two decimals, e.g. `"64.00 PiB"`.
fn fmt_pib(bytes: u64) -> String {
    format!("{:.2} PiB", bytes as f64 / (1u64 << 50) as f64)
}

pub use crate::rules::{MemoryBudget, MEMORY_HEADROOM_MIN_BYTES};

/// A disk tier that cannot be sized from what was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizingError {
    /// The directory is on a kernel pseudo-filesystem.
    #[error("{why}: no disk tier can live there. Point EREBINE_AGENT_LMCACHE_DISK_PATH at a directory on a disk, or set EREBINE_AGENT_LMCACHE_DISK_SIZE_GB=0 for no disk tier")]
    NotStorage {
        /// The classification's reason, naming the filesystem type.
        why: String,
    },
    /// The volume's figures cannot size the tier and no size was given.
    #[error("{why}: the tier cannot be sized from its figures. Set EREBINE_AGENT_LMCACHE_DISK_SIZE_GB to the GiB the tier may use there (it is then used as given), or to 0 for no disk tier")]
    Unmeasurable {
        /// The classification's reason, naming the filesystem type.
        why: String,
    },
    /// An explicit size that, with L1, needs more memory than the node has
    /// for its cache.
    #[error("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB asks {} on a memory-backed volume ({why}): with the {} L1 that is {} of memory, above {}. Set it to at most {} (0 disables the tier), lower L1 (EREBINE_AGENT_KV_OFFLOAD_SIZE_GB), or put EREBINE_AGENT_LMCACHE_DISK_PATH on a disk",
        fmt_gib(*.asked_bytes), fmt_gib(*.l1_bytes), fmt_gib(.asked_bytes.saturating_add(*.l1_bytes)),
        .budget.describe(), fmt_gib_down(.budget.tier_bytes(*.l1_bytes)))]
    OverMemory {
        /// The tier asked for, in bytes (after the 75%-of-volume cap).
        asked_bytes: u64,
        /// The L1 the server gets, in bytes.
        l1_bytes: u64,
        /// The node's memory budget.
        budget: MemoryBudget,
        /// The classification's reason, naming the filesystem type.
        why: String,
    },
}

/// What the disk tier's capacity is decided from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierSizing<'a> {
    /// The volume's statistics.
    pub volume: &'a VolumeStats,
    /// What kind of storage the volume is ([`volume_kind`]).
    pub kind: &'a Decision<VolumeKind>,
    /// Allocated bytes of cache objects already in the directory (R).
    pub reclaimable_bytes: u64,
    /// The L1 the server gets, in bytes.
    pub l1_bytes: u64,
    /// `EREBINE_AGENT_LMCACHE_DISK_SIZE_GB` in bytes, when set.
    pub explicit: Option<u64>,
    /// Whether the directory is a volume of its own
    /// ([`Filesystem::own_volume`]).
    pub own_volume: bool,
    /// What L1 and a memory-backed tier may use together.
    pub memory: MemoryBudget,
}

/// The disk tier's capacity in bytes (0: no disk tier), by the kind of its
/// volume:
/// - local: [`disk_capacity`] from the figures, or, for a volume of its
///   own without an explicit size, [`own_volume_capacity`];
/// - untrusted: the explicit size as given (`explicit-unmeasured`), never
///   the figures; none given is [`SizingError::Unmeasurable`];
/// - memory-backed: the figures' capacity, lowered so that L1 plus the tier
///   stays within [`MemoryBudget::cache_bytes`] (`memory-bound`); a tmpfs
///   without a size limit (size 0) is bounded by memory alone. An explicit
///   size beyond that budget is [`SizingError::OverMemory`].
///
/// A tier below 1 GiB is none (`below-1gib`). A tier smaller than L1 is
/// kept, and its reason warns ([`below_l1_warning`]).
pub fn tier_capacity(tier: &TierSizing) -> Result<Decision<u64>, SizingError> {
    let capacity = match tier.kind.value {
        VolumeKind::Local if tier.own_volume && tier.explicit.is_none() => {
            own_volume_capacity(tier.volume, tier.reclaimable_bytes)
        }
        VolumeKind::Local => disk_capacity(
            tier.volume,
            tier.reclaimable_bytes,
            tier.l1_bytes,
            tier.explicit,
        ),
        VolumeKind::Untrusted => unmeasured_capacity(tier)?,
        VolumeKind::NotStorage if tier.explicit == Some(0) => {
            disk_capacity(tier.volume, 0, 0, Some(0))
        }
        VolumeKind::NotStorage => {
            return Err(SizingError::NotStorage {
                why: tier.kind.reason.clone(),
            })
        }
        VolumeKind::Memory => memory_capacity(tier)?,
    };
    Ok(match below_l1_warning(capacity.value, tier.l1_bytes) {
        Some(warning) => Decision {
            reason: format!("{}; warning: {warning}", capacity.reason),
            ..capacity
        },
        None => capacity,
    })
}

/// A warning when a tier of `capacity_bytes` is smaller than the
/// `l1_bytes` L1 above it (and is a tier at all).
pub fn below_l1_warning(capacity_bytes: u64, l1_bytes: u64) -> Option<String> {
    (capacity_bytes > 0 && capacity_bytes < l1_bytes).then(|| {
        format!(
            "the {} disk tier is smaller than the {} L1: LMCache writes every chunk through to L2, so the tier evicts most of what it stores; give it at least the L1's size, or 0 for no disk tier",
            fmt_gib(capacity_bytes),
            fmt_gib(l1_bytes)
        )
    })
}

fn unmeasured_capacity(tier: &TierSizing) -> Result<Decision<u64>, SizingError> {
    match tier.explicit {
        None => Err(SizingError::Unmeasurable {
            why: tier.kind.reason.clone(),
        }),
        Some(0) => Ok(disk_capacity(tier.volume, 0, 0, Some(0))),
        Some(bytes) => Ok(at_least_minimum(Decision::new(
            bytes,
            "explicit-unmeasured",
            format!(
                "EREBINE_AGENT_LMCACHE_DISK_SIZE_GB sets {}, used as given: {}",
                fmt_gib(bytes),
                tier.kind.reason
            ),
        ))),
    }
}

fn memory_capacity(tier: &TierSizing) -> Result<Decision<u64>, SizingError> {
    let room = tier.memory.tier_bytes(tier.l1_bytes);
    let by_volume = match (tier.explicit, tier.volume.total_bytes) {
        (Some(bytes), 0) if bytes > 0 => at_least_minimum(Decision::new(
            bytes,
            "explicit",
            format!("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB sets {}", fmt_gib(bytes)),
        )),
        (None, 0) => Decision::new(u64::MAX, "memory-bound", "the volume has no size limit"),
        (explicit, _) => {
            disk_capacity(tier.volume, tier.reclaimable_bytes, tier.l1_bytes, explicit)
        }
    };
    if tier.explicit.is_some() {
        if by_volume.value > room {
            return Err(SizingError::OverMemory {
                asked_bytes: by_volume.value,
                l1_bytes: tier.l1_bytes,
                budget: tier.memory,
                why: tier.kind.reason.clone(),
            });
        }
        return Ok(by_volume);
    }
    if by_volume.value == 0 {
        return Ok(by_volume);
    }
    if by_volume.value <= room {
        return Ok(Decision {
            reason: format!(
                "{}; memory-backed, within {}",
                by_volume.reason,
                tier.memory.describe()
            ),
            ..by_volume
        });
    }
    Ok(at_least_minimum(Decision::new(
        round_down_mib(room),
        "memory-bound",
        format!(
            "{}: L1 ({}) and the tier stay within {}, which leaves the tier {} (by the volume alone: {})",
            tier.kind.reason,
            fmt_gib(tier.l1_bytes),
            tier.memory.describe(),
            fmt_gib(round_down_mib(room)),
            by_volume.reason
        ),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs(fs_type: &str, source: Option<&str>) -> Filesystem {
        Filesystem {
            fs_type: fs_type.to_string(),
            read_only: false,
            source: source.map(str::to_string),
            own_volume: false,
        }
    }

    fn vol(total: u64, free: u64) -> VolumeStats {
        VolumeStats {
            total_bytes: total,
            free_bytes: free,
            block_size: 4096,
        }
    }

    const TIB: u64 = 1024 * GIB;

    #[test]
    fn every_family_is_classified() {
        let plain = vol(2 * TIB, TIB);
        let cases = [
            ("ext4", None, VolumeKind::Local, "local"),
            ("xfs", None, VolumeKind::Local, "local"),
            ("btrfs", None, VolumeKind::Local, "local"),
            ("overlay", None, VolumeKind::Local, "overlay"),
            ("ext2/ext3/ext4", None, VolumeKind::Local, "local"),
            ("tmpfs", None, VolumeKind::Memory, "memory-backed"),
            ("ramfs", None, VolumeKind::Memory, "memory-backed"),
            (
                "ext4",
                Some("/dev/zram0"),
                VolumeKind::Memory,
                "memory-backed",
            ),
            (
                "xfs",
                Some("/dev/ram12"),
                VolumeKind::Memory,
                "memory-backed",
            ),
            ("ext4", Some("/dev/ramdisk"), VolumeKind::Local, "local"),
            ("fuse.s3fs", None, VolumeKind::Untrusted, "fuse"),
            ("fuse.mountpoint-s3", None, VolumeKind::Untrusted, "fuse"),
            ("fuseblk", None, VolumeKind::Untrusted, "fuse"),
            ("fuse", None, VolumeKind::Untrusted, "fuse"),
            ("nfs4", None, VolumeKind::Untrusted, "network"),
            ("nfs", None, VolumeKind::Untrusted, "network"),
            ("cifs", None, VolumeKind::Untrusted, "network"),
            ("smb3", None, VolumeKind::Untrusted, "network"),
            ("9p", None, VolumeKind::Untrusted, "network"),
            ("ceph", None, VolumeKind::Untrusted, "network"),
            ("lustre", None, VolumeKind::Untrusted, "network"),
            ("virtiofs", None, VolumeKind::Untrusted, "network"),
            ("zonefs-new", None, VolumeKind::Local, "unrecognised-type"),
            ("proc", None, VolumeKind::NotStorage, "pseudo-filesystem"),
            ("sysfs", None, VolumeKind::NotStorage, "pseudo-filesystem"),
            ("cgroup2", None, VolumeKind::NotStorage, "pseudo-filesystem"),
            (
                "hugetlbfs",
                None,
                VolumeKind::NotStorage,
                "pseudo-filesystem",
            ),
            (
                "unknown (statfs magic 0x1234)",
                None,
                VolumeKind::Local,
                "unrecognised-type",
            ),
        ];
        for (fs_type, source, kind, rule) in cases {
            let d = volume_kind(&fs(fs_type, source), &plain);
            assert_eq!((d.value, d.rule), (kind, rule), "{fs_type} {source:?}");
            assert!(d.reason.starts_with(fs_type), "{}", d.reason);
        }
    }

    #[test]
    fn figures_that_cannot_be_true_are_not_trusted_on_any_local_type() {
        let s3fs = (16u64 << 20).saturating_mul(1 << 32);
        let cases = [
            (vol(0, 0), "a size of 0 bytes"),
            (vol(GIB, 2 * GIB), "2.00 GiB free on a 1.00 GiB volume"),
            (vol(s3fs, s3fs), "64.00 PiB"),
            (vol(1 << 50, 1 << 49), "1.00 PiB"),
            (vol(u64::MAX, u64::MAX), "16384.00 PiB"),
        ];
        for (figures, why) in cases {
            for fs_type in ["ext4", "xfs", "weird"] {
                let d = volume_kind(&fs(fs_type, None), &figures);
                assert_eq!(d.rule, "implausible-statistics", "{fs_type} {figures:?}");
                assert!(d.reason.contains(why), "{}", d.reason);
            }
        }
        let big_but_real = vol((1 << 50) - GIB, 1 << 49);
        assert_eq!(volume_kind(&fs("xfs", None), &big_but_real).rule, "local");
    }

    #[test]
    fn memory_is_recognised_whatever_its_figures() {
        for figures in [vol(0, 0), vol(u64::MAX, u64::MAX), vol(GIB, GIB)] {
            let d = volume_kind(&fs("tmpfs", None), &figures);
            assert_eq!(d.value, VolumeKind::Memory);
        }
    }

    fn sized(
        fs_type: &str,
        figures: VolumeStats,
        l1: u64,
        explicit: Option<u64>,
        share: u64,
    ) -> Result<Decision<u64>, SizingError> {
        let kind = volume_kind(&fs(fs_type, None), &figures);
        tier_capacity(&TierSizing {
            volume: &figures,
            kind: &kind,
            reclaimable_bytes: 0,
            l1_bytes: l1,
            explicit,
            own_volume: false,
            memory: MemoryBudget::new(share),
        })
    }

    #[test]
    fn a_tmpfs_tier_beside_l1_stays_within_the_memory_share_less_headroom() {
        // /dev/shm on a 23.5 GiB host, L1 8 GiB: the volume alone would
        // allow 75% of 23.5 GiB = 17.6 GiB, more than the host has left.
        let ram = 47 * GIB / 2;
        let d = sized("tmpfs", vol(ram, ram), 8 * GIB, None, ram).unwrap();
        assert_eq!((d.value, d.rule), (15 * GIB / 2, "memory-bound"));
        assert!(d.reason.contains("tmpfs is memory-backed"), "{}", d.reason);
        assert!(
            d.reason.contains("23.50 GiB less 8.00 GiB headroom"),
            "{}",
            d.reason
        );
        // The default L1 (25% of 23.5 GiB) leaves it more.
        let d = sized("tmpfs", vol(ram, ram), ram / 4, None, ram).unwrap();
        assert_eq!(d.value, round_down_mib(31 * GIB / 2 - ram / 4));
        // A ramfs or a zram disk is bounded the same way.
        assert_eq!(
            sized("ramfs", vol(ram, ram), 8 * GIB, None, ram)
                .unwrap()
                .value,
            15 * GIB / 2
        );
    }

    #[test]
    fn a_tmpfs_tier_within_the_memory_budget_keeps_the_volume_rule() {
        let d = sized("tmpfs", vol(512 * GIB, 512 * GIB), 128 * GIB, None, TIB).unwrap();
        assert_eq!((d.value, d.rule), (384 * GIB, "derived-75pct-volume"));
        assert!(d.reason.contains("memory-backed, within"), "{}", d.reason);
    }

    #[test]
    fn a_tmpfs_without_a_size_limit_is_bounded_by_memory_alone() {
        let d = sized("tmpfs", vol(0, 0), 16 * GIB, None, 128 * GIB).unwrap();
        assert_eq!((d.value, d.rule), (80 * GIB, "memory-bound"));
        assert!(d.reason.contains("no size limit"), "{}", d.reason);
        let d = sized("tmpfs", vol(0, 0), 16 * GIB, Some(40 * GIB), 128 * GIB).unwrap();
        assert_eq!((d.value, d.rule), (40 * GIB, "explicit"));
        for tiny in [1, GIB / 2] {
            let d = sized("ramfs", vol(0, 0), 16 * GIB, Some(tiny), 128 * GIB).unwrap();
            assert_eq!((d.value, d.rule), (0, "below-1gib"), "{tiny}");
        }
    }

    #[test]
    fn l1_that_fills_the_memory_budget_leaves_no_memory_backed_tier() {
        let d = sized("tmpfs", vol(16 * GIB, 16 * GIB), 8 * GIB, None, 16 * GIB).unwrap();
        assert_eq!((d.value, d.rule), (0, "below-1gib"));
        let small = sized("tmpfs", vol(GIB, GIB), 8 * GIB, None, 64 * GIB).unwrap();
        assert_eq!((small.value, small.rule), (0, "below-1gib"));
        assert!(!small.reason.contains("within"), "{}", small.reason);
    }

    #[test]
    fn the_largest_size_a_refusal_suggests_is_accepted() {
        // 23.54 GiB of memory, L1 5.89 GiB: the room is 9.6551 GiB.
        let share = 25_275_711_488;
        let l1 = share / 4;
        let text = sized("tmpfs", vol(0, 0), l1, Some(12 * GIB), share)
            .unwrap_err()
            .to_string();
        let most: f64 = text
            .split("Set it to at most ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        let bytes = crate::gib_to_bytes(most).unwrap();
        sized("tmpfs", vol(0, 0), l1, Some(bytes), share).unwrap();
    }

    #[test]
    fn an_explicit_memory_backed_tier_beyond_the_budget_is_refused_with_the_numbers() {
        let ram = 47 * GIB / 2;
        let err = sized("tmpfs", vol(ram, ram), 8 * GIB, Some(12 * GIB), ram).unwrap_err();
        let text = err.to_string();
        for needle in [
            "EREBINE_AGENT_LMCACHE_DISK_SIZE_GB asks 12.00 GiB",
            "tmpfs is memory-backed",
            "8.00 GiB L1 that is 20.00 GiB",
            "15.50 GiB for L1 and the tier",
            "at most 7.50 GiB",
        ] {
            assert!(text.contains(needle), "{needle:?} not in {text}");
        }
        let ok = sized("tmpfs", vol(ram, ram), 8 * GIB, Some(7 * GIB), ram).unwrap();
        assert_eq!((ok.value, ok.rule), (7 * GIB, "explicit"));
        let off = sized("tmpfs", vol(ram, ram), 8 * GIB, Some(0), ram).unwrap();
        assert_eq!(off.rule, "disabled-explicit");
    }

    #[test]
    fn untrusted_figures_never_size_a_tier_and_an_explicit_size_is_used_as_given() {
        let s3fs = (16u64 << 20).saturating_mul(1 << 32);
        for (fs_type, figures) in [
            ("fuse.s3fs", vol(s3fs, s3fs)),
            ("fuse.mountpoint-s3", vol(0, 0)),
            ("nfs4", vol(2 * TIB, TIB)),
            ("cifs", vol(TIB, TIB)),
            ("9p", vol(TIB, TIB)),
            ("ext4", vol(u64::MAX, u64::MAX)),
        ] {
            let err = sized(fs_type, figures, 8 * GIB, None, 64 * GIB).unwrap_err();
            let text = err.to_string();
            assert!(text.starts_with(fs_type), "{text}");
            assert!(
                text.contains("Set EREBINE_AGENT_LMCACHE_DISK_SIZE_GB"),
                "{text}"
            );
            let d = sized(fs_type, figures, 8 * GIB, Some(100 * GIB), 64 * GIB).unwrap();
            assert_eq!(
                (d.value, d.rule),
                (100 * GIB, "explicit-unmeasured"),
                "{fs_type}"
            );
            let off = sized(fs_type, figures, 8 * GIB, Some(0), 64 * GIB).unwrap();
            assert_eq!(off.rule, "disabled-explicit");
            let tiny = sized(fs_type, figures, 8 * GIB, Some(GIB / 2), 64 * GIB).unwrap();
            assert_eq!(tiny.rule, "below-1gib");
        }
    }

    #[test]
    fn no_tier_lives_on_a_pseudo_filesystem_whatever_its_size() {
        for explicit in [None, Some(100 * GIB)] {
            let err = sized("proc", vol(0, 0), 8 * GIB, explicit, 64 * GIB).unwrap_err();
            assert!(
                err.to_string()
                    .starts_with("proc is a kernel pseudo-filesystem, not storage"),
                "{err}"
            );
        }
        let off = sized("sysfs", vol(0, 0), 8 * GIB, Some(0), 64 * GIB).unwrap();
        assert_eq!(off.rule, "disabled-explicit");
    }

    #[test]
    fn a_tier_smaller_than_l1_is_kept_with_a_warning_naming_both() {
        let d = sized("ext4", vol(TIB, TIB), 16 * GIB, Some(2 * GIB), 64 * GIB).unwrap();
        assert_eq!((d.value, d.rule), (2 * GIB, "explicit"));
        assert!(
            d.reason
                .contains("warning: the 2.00 GiB disk tier is smaller than the 16.00 GiB L1"),
            "{}",
            d.reason
        );
        let d = sized("ext4", vol(TIB, TIB), 16 * GIB, Some(16 * GIB), 64 * GIB).unwrap();
        assert!(!d.reason.contains("warning"), "{}", d.reason);
        assert_eq!(below_l1_warning(0, 16 * GIB), None);
    }

    proptest::proptest! {
        #[test]
        fn a_derived_memory_backed_tier_and_l1_never_pass_the_budget(
            total in 0u64..(4 * TIB),
            used_pct in 0u64..=100,
            l1 in GIB..(256 * GIB),
            share in (4 * GIB)..(2 * TIB),
        ) {
            let figures = vol(total, total / 100 * (100 - used_pct));
            let d = sized("tmpfs", figures, l1, None, share).unwrap();
            if d.value > 0 {
                proptest::prop_assert!(l1 + d.value <= MemoryBudget::new(share).cache_bytes());
            }
        }
    }

    #[test]
    fn the_memory_budget_keeps_a_quarter_or_8_gib_for_the_engine() {
        let small = MemoryBudget::new(47 * GIB / 2);
        assert_eq!(small.headroom_bytes, 8 * GIB);
        assert_eq!(small.cache_bytes(), 31 * GIB / 2);
        assert_eq!(small.tier_bytes(8 * GIB), 15 * GIB / 2);
        assert_eq!(small.tier_bytes(16 * GIB), 0);
        let big = MemoryBudget::new(1024 * GIB);
        assert_eq!(big.headroom_bytes, 256 * GIB);
        assert_eq!(big.cache_bytes(), 768 * GIB);
        assert_eq!(MemoryBudget::new(4 * GIB).cache_bytes(), 0);
    }
}
