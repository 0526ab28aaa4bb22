//! What `lmcache-tier size` prints: the built-in disk tier of a node as a
//! launch would size it, measured read-only but for the O_DIRECT test write
//! and the read test asked for (`docs/sizing.md`).

use std::fmt;
use std::path::PathBuf;

use lmcache_sizing::fmt_gib;
use lmcache_sizing::volume::VolumeKind;
use serde::Serialize;

use crate::node::env::NodeEnv;
use crate::output::{self, with_progress};
use crate::plan::facts::{measure_node_disk, probe_disk_read, DiskAccess, Facts};
use crate::plan::inputs::{HostFacts, PlanError};
use crate::plan::launch_plan;

/// The sizing of a node's built-in disk tier, each figure with the rule
/// that chose it: `--json` prints it as one object (sizes in bytes, keys in
/// this order), the text form as one row per decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SizeReport {
    /// The cache directory.
    pub path: PathBuf,
    /// The size of its volume, in bytes.
    pub volume_bytes: u64,
    /// The volume's bytes free to an unprivileged writer.
    pub free_bytes: u64,
    /// The volume's block size, in bytes.
    pub block_size: u64,
    /// The volume's filesystem type.
    pub fs_type: String,
    /// Whether the volume is mounted read-only.
    pub read_only: bool,
    /// Local, memory-backed, or figures not trusted (`docs/sizing.md`,
    /// "Filesystems").
    pub volume_kind: VolumeKind,
    /// The rule that chose [`SizeReport::volume_kind`].
    pub volume_kind_rule: &'static str,
    /// Why, in words.
    pub volume_kind_reason: String,
    /// Allocated bytes of cache objects already in the directory.
    pub reclaimable_bytes: u64,
    /// The memory the rules read, in bytes.
    pub memory_bytes: u64,
    /// Where it came from (RAM, or the cgroup limit).
    pub memory_reason: String,
    /// Physical cores (hyper-threads counted once).
    pub physical_cores: u32,
    /// The server's L1, in bytes.
    pub l1_bytes: u64,
    /// The rule that chose it.
    pub l1_rule: &'static str,
    /// Why, in words.
    pub l1_reason: String,
    /// The disk tier's capacity, in bytes; 0 is no disk tier.
    pub capacity_bytes: u64,
    /// The rule that chose it.
    pub capacity_rule: &'static str,
    /// Why, in words.
    pub capacity_reason: String,
    /// The fs_native tier's I/O worker threads.
    pub io_workers: u32,
    /// Why, in words.
    pub io_workers_reason: String,
    /// Whether the tier uses O_DIRECT.
    pub use_odirect: bool,
    /// The rule that chose it.
    pub odirect_rule: &'static str,
    /// Why, in words.
    pub odirect_reason: String,
    /// Tokens a second the tier can load at the volume's read rate, when
    /// `EREBINE_AGENT_LMCACHE_KV_BYTES_PER_TOKEN` and a read rate are given
    /// (`docs/sizing.md`, "What the disk tier delivers").
    pub disk_load_tokens_per_s: Option<u64>,
    /// How, in words.
    pub disk_load_reason: Option<String>,
    /// What a launch would warn of ([`launch_plan::Sizes::warnings`]).
    pub warnings: Vec<String>,
}

impl SizeReport {
    /// Measures the host and the volume of `node`'s cache directory
    /// read-only (a spinner on a terminal while it scans; the read test
    /// when `EREBINE_AGENT_LMCACHE_DISK_READ_GBPS` is `probe`), and judges its
    /// sizes as a launch would ([`launch_plan::judge_sizes`], with the
    /// built-in tier): the L1 first, then the disk tier beside it, with the
    /// same refusals and warnings.
    ///
    /// Errors: the host's memory, an unusable cache directory or volume, or
    /// a size the rules refuse ([`PlanError`]).
    pub fn measure(node: &NodeEnv) -> Result<Self, PlanError> {
        let mut facts = Facts::host()?;
        let message = format!("measuring the cache in {}", node.disk_path.display());
        let mut measured =
            with_progress(&message, || measure_node_disk(node, DiskAccess::Inspect))?;
        measured.read_probe = probe_disk_read(
            node,
            &measured.measured_at,
            facts.physical_cores,
            output::spinner,
        );
        let filesystem = measured.filesystem.clone();
        facts.disk = Some(measured);
        let host = HostFacts::from(&facts);
        let sizes = launch_plan::judge_sizes(node, &host, launch_plan::Tiers::BuiltIn)?;
        let (l1, disk) = (sizes.l1_size, sizes.disk.ok_or(PlanError::NotMeasured)?);
        Ok(SizeReport {
            warnings: sizes.warnings,
            path: disk.path,
            volume_bytes: disk.volume.total_bytes,
            free_bytes: disk.volume.free_bytes,
            block_size: disk.volume.block_size,
            fs_type: filesystem.fs_type,
            read_only: filesystem.read_only,
            volume_kind: disk.volume_kind.value,
            volume_kind_rule: disk.volume_kind.rule,
            volume_kind_reason: disk.volume_kind.reason,
            reclaimable_bytes: disk.reclaimable_bytes,
            memory_bytes: host.memory.value,
            memory_reason: host.memory.reason,
            physical_cores: host.physical_cores,
            l1_bytes: l1.value,
            l1_rule: l1.rule,
            l1_reason: l1.reason,
            capacity_bytes: disk.capacity.value,
            capacity_rule: disk.capacity.rule,
            capacity_reason: disk.capacity.reason,
            io_workers: disk.io_workers.value,
            io_workers_reason: disk.io_workers.reason,
            use_odirect: disk.use_odirect.value,
            odirect_rule: disk.use_odirect.rule,
            odirect_reason: disk.use_odirect.reason,
            disk_load_tokens_per_s: disk.load.as_ref().map(|l| l.value),
            disk_load_reason: disk.load.map(|l| l.reason),
        })
    }

    /// The text form's rows: name, value, reason.
    fn rows(&self) -> Vec<(&'static str, String, String)> {
        let capacity = match self.capacity_bytes {
            0 => "none".to_string(),
            bytes => fmt_gib(bytes),
        };
        let volume = format!(
            "free {}, reclaimable cache {}, block size {}, {}{}",
            fmt_gib(self.free_bytes),
            fmt_gib(self.reclaimable_bytes),
            self.block_size,
            self.fs_type,
            if self.read_only { " (read-only)" } else { "" }
        );
        let mut rows = vec![
            (
                "cache directory",
                self.path.display().to_string(),
                String::new(),
            ),
            ("volume", fmt_gib(self.volume_bytes), volume),
            (
                "volume kind",
                launch_plan::kind_name(self.volume_kind).to_string(),
                self.volume_kind_reason.clone(),
            ),
            ("L1", fmt_gib(self.l1_bytes), self.l1_reason.clone()),
            ("disk capacity", capacity, self.capacity_reason.clone()),
            (
                "I/O workers",
                self.io_workers.to_string(),
                self.io_workers_reason.clone(),
            ),
            (
                "O_DIRECT",
                if self.use_odirect { "on" } else { "off" }.to_string(),
                self.odirect_reason.clone(),
            ),
        ];
        if let (Some(tokens), Some(reason)) = (self.disk_load_tokens_per_s, &self.disk_load_reason)
        {
            rows.push(("disk load", format!("{tokens} tok/s"), reason.clone()));
        }
        rows
    }
}

/// The text form: one row per decision (name, value, reason), a line each.
impl fmt::Display for SizeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, value, reason) in self.rows() {
            writeln!(f, "{name:<16} {value:<12} {reason}")?;
        }
        Ok(())
    }
}
