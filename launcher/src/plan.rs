//! From engine facts and the node's environment to a launch plan: the
//! `lmcache server` command line, its environment, and every decision with its
//! reason.
//!
//! Rules: seed `000_8f00d9f3f4ca4cb4.txt`, "LMCache", "LMCache Disk Tier" and
//! "LMCache Environment Variables"; the argv shape follows issue 2.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use lmcache_adapters::{fs_native_tier, Cascade};
use lmcache_sizing::probe;
use lmcache_sizing::rules::{self, OdirectProbe, VolumeStats, WRITE_BUFFER_L1_BYTES};
use lmcache_sizing::{fmt_gib, Decision, GIB};
use serde::Serialize;

use crate::env::{self, NodeEnv};
use crate::housekeep::DiskHousekeeping;
use lmcache_housekeeping::LaunchIdentity;

/// What the engine (vLLM) runs with: the facts a launch is planned from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineFacts {
    /// Served model name, as vLLM reports it to LMCache.
    pub model: String,
    /// Tensor-parallel size.
    pub tensor_parallel_size: u32,
    /// Pipeline-parallel size.
    pub pipeline_parallel_size: u32,
    /// Data-parallel size.
    pub data_parallel_size: u32,
    /// KV cache dtype (`auto`, `fp8`, ...).
    pub kv_cache_dtype: String,
    /// KV cache block size in tokens.
    pub block_size: u32,
    /// The engine's max batched tokens per step.
    pub max_num_batched_tokens: u32,
}

impl EngineFacts {
    /// GPU ranks of the engine: tensor x pipeline x data parallel sizes, the
    /// server's `--max-gpu-workers`.
    pub fn gpu_workers(&self) -> u32 {
        self.tensor_parallel_size
            .saturating_mul(self.pipeline_parallel_size)
            .saturating_mul(self.data_parallel_size)
    }
}

/// Facts about the host the sizing rules read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostFacts {
    /// Memory available to this node's container or host, in bytes.
    pub memory: Decision<u64>,
    /// Physical cores (hyper-threads counted once).
    pub physical_cores: u32,
}

impl HostFacts {
    /// Reads this host's memory and physical cores.
    pub fn probe() -> io::Result<Self> {
        Ok(HostFacts {
            memory: probe::memory_bytes()?,
            physical_cores: probe::physical_cores(),
        })
    }
}

/// A launch that cannot be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A variable with a bad value.
    #[error(transparent)]
    Config(#[from] env::ConfigError),
    /// The cache directory cannot be used.
    #[error("{variable}={path}: {problem}. {fix}")]
    DiskPath {
        /// The variable or flag that named the path.
        variable: &'static str,
        /// The path at fault.
        path: String,
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: &'static str,
    },
    /// Neither an L1 nor an L2 tier would hold anything.
    #[error("nothing to cache in: {reason}. Set EREBINE_AGENT_KV_OFFLOAD_SIZE_GB above 0, or give the node a disk tier (EREBINE_AGENT_LMCACHE_DISK_SIZE_GB, a larger volume under EREBINE_AGENT_LMCACHE_DISK_PATH, or EREBINE_AGENT_LMCACHE_L2_ADAPTER)")]
    NothingToCache {
        /// Why both budgets are zero.
        reason: String,
    },
    /// An engine fact out of range.
    #[error("--{flag} {value} is not valid: {expected}")]
    Engine {
        /// The flag at fault.
        flag: &'static str,
        /// Its value.
        value: String,
        /// What to give instead.
        expected: &'static str,
    },
}

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

/// The node's built-in disk tier as sized for this launch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiskTier {
    /// The cache directory (`EREBINE_AGENT_LMCACHE_DISK_PATH`).
    pub path: PathBuf,
    /// Statistics of the volume that holds it.
    pub volume: VolumeStats,
    /// Allocated bytes of cache objects already in the directory (R).
    pub reclaimable_bytes: u64,
    /// Capacity in bytes; 0 means no disk tier.
    pub capacity: Decision<u64>,
    /// fs_native I/O worker threads.
    pub io_workers: Decision<u32>,
    /// Whether the tier uses O_DIRECT.
    pub use_odirect: Decision<bool>,
}

/// Every decision of a launch, each with its reason.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decisions {
    /// Host facts the rules read.
    pub host: HostFacts,
    /// The L1 budget the operator asked for or the rule derived, in bytes.
    pub l1_budget: Decision<u64>,
    /// The L1 the server gets (`--l1-size-gb`), in bytes.
    pub l1_size: Decision<u64>,
    /// How L1 is run.
    pub l1_mode: L1Mode,
    /// Chunk size in tokens.
    pub chunk_size: Decision<u32>,
    /// The built-in disk tier; `None` when the operator's
    /// `EREBINE_AGENT_LMCACHE_L2_ADAPTER` replaces it.
    pub disk: Option<DiskTier>,
    /// Where the L2 cascade came from.
    pub cascade_source: Decision<()>,
}

/// A planned launch: what to run, with which environment, and why.
#[derive(Debug, Clone)]
pub struct LaunchPlan {
    /// The executable that starts the server (`erebine-lmcache` or the one
    /// `EREBINE_AGENT_LMCACHE_PATH` names).
    pub executable: PathBuf,
    /// Arguments after the executable, starting with `server`.
    pub args: Vec<String>,
    /// Variables added to the server's environment.
    pub env: BTreeMap<String, String>,
    /// The L2 tiers, in cascade order.
    pub cascade: Cascade,
    /// The server's ZMQ port (127.0.0.1).
    pub mp_port: u16,
    /// The server's HTTP port (127.0.0.1), where `/status` answers.
    pub http_port: u16,
    /// Every decision with its reason.
    pub decisions: Decisions,
    /// The housekeeping of the node's disk tier that runs before the server
    /// starts; `None` without a built-in disk tier.
    pub housekeeping: Option<DiskHousekeeping>,
}

impl LaunchPlan {
    /// The `/status` URL of the planned server.
    pub fn status_url(&self) -> String {
        format!("http://127.0.0.1:{}/status", self.http_port)
    }

    /// The arguments with every adapter spec's secrets redacted: what logs and
    /// `--dry-run` may print.
    pub fn redacted_args(&self) -> Vec<String> {
        let mut tiers = self.cascade.tiers().iter();
        let mut out = Vec::with_capacity(self.args.len());
        let mut next_is_spec = false;
        for arg in &self.args {
            if next_is_spec {
                out.push(match tiers.next() {
                    Some(t) => t.redacted().to_string(),
                    None => arg.clone(),
                });
            } else {
                out.push(arg.clone());
            }
            next_is_spec = arg == "--l2-adapter";
        }
        out
    }

    /// The plan as one JSON object (secrets redacted): `executable`, `argv`,
    /// `env`, `status_url`, `cascade`, `decisions`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "executable": self.executable,
            "argv": self.redacted_args(),
            "env": self.env,
            "status_url": self.status_url(),
            "cascade": self.cascade.redacted(),
            "decisions": self.decisions,
            "housekeeping": self.housekeeping,
        })
    }

    /// The one launch log line: resolved adapters, disk path, worker count,
    /// O_DIRECT decision and capacity, each with its reason (seed: "The
    /// resolved adapter is logged once at launch").
    pub fn log_line(&self) -> String {
        let d = &self.decisions;
        let mut line = format!(
            "lmcache launch: l2_adapters={} ({}); l1={} ({}); l1_mode={}; chunk_size={} ({})",
            self.cascade.redacted(),
            d.cascade_source.reason,
            fmt_gib(d.l1_size.value),
            d.l1_size.reason,
            match d.l1_mode {
                L1Mode::Cache => "cache",
                L1Mode::WriteBuffer => "write-buffer",
            },
            d.chunk_size.value,
            d.chunk_size.reason,
        );
        if let Some(disk) = &d.disk {
            line.push_str(&format!(
                "; disk_path={}; capacity={} ({}); workers={} ({}); use_odirect={} ({})",
                disk.path.display(),
                fmt_gib(disk.capacity.value),
                disk.capacity.reason,
                disk.io_workers.value,
                disk.io_workers.reason,
                disk.use_odirect.value,
                disk.use_odirect.reason,
            ));
        }
        line
    }
}

/// Whether planning may create the cache directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskAccess {
    /// Create the directory (mode 0700) if missing: a real launch.
    Create,
    /// Touch nothing but a probe file: `size` and `--dry-run`. A missing
    /// directory is measured on its nearest existing ancestor.
    Inspect,
}

/// Plans a launch. `executable` is what starts the server.
///
/// Errors: bad variables, an unusable cache directory, zero L1 with no L2
/// tier, engine facts out of range.
pub fn plan_launch(
    facts: &EngineFacts,
    node: &NodeEnv,
    host: &HostFacts,
    executable: PathBuf,
    access: DiskAccess,
) -> Result<LaunchPlan, PlanError> {
    check_engine(facts)?;
    let chunk_size = rules::chunk_size(node.chunk_size, facts.max_num_batched_tokens);
    let l1_budget = rules::l1_budget(
        node.kv_offload_bytes,
        host.memory.value,
        node.host_agent_count,
    );
    let (cascade, disk, cascade_source) = match &node.l2_adapter {
        Some(custom) => (
            custom.clone(),
            None,
            Decision::new(
                (),
                "custom",
                "EREBINE_AGENT_LMCACHE_L2_ADAPTER replaces the built-in tier; disk sizing does not apply",
            ),
        ),
        None => {
            let disk = size_disk_tier(node, host, l1_budget.value, access)?;
            let cascade = if disk.capacity.value > 0 {
                Cascade(vec![fs_native_tier(
                    &disk.path,
                    disk.io_workers.value,
                    disk.use_odirect.value,
                    disk.capacity.value,
                )])
            } else {
                Cascade::default()
            };
            let source = if disk.capacity.value > 0 {
                Decision::new((), "built-in", "built-in fs_native disk tier")
            } else {
                Decision::new((), "l1-only", "no disk tier: L1 only")
            };
            (cascade, Some(disk), source)
        }
    };
    let (l1_size, l1_mode) = match (l1_budget.value, cascade.tiers().is_empty()) {
        (0, true) => {
            return Err(PlanError::NothingToCache {
                reason: format!("the L1 budget is 0 and {}", cascade_source.reason),
            })
        }
        (0, false) => (
            Decision::new(
                WRITE_BUFFER_L1_BYTES,
                "write-buffer",
                "L1 budget is 0: L1 runs as a write buffer only (eviction noop, l2-store-policy skip_l1) with the smallest L1 that stages chunks, 1 GiB",
            ),
            L1Mode::WriteBuffer,
        ),
        _ => (l1_budget.clone(), L1Mode::Cache),
    };
    let decisions = Decisions {
        host: host.clone(),
        l1_budget,
        l1_size,
        l1_mode,
        chunk_size,
        disk,
        cascade_source,
    };
    let housekeeping = decisions
        .disk
        .as_ref()
        .filter(|disk| disk.capacity.value > 0)
        .map(|disk| DiskHousekeeping {
            path: disk.path.clone(),
            identity: LaunchIdentity {
                model: facts.model.clone(),
                tensor_parallel_size: facts.tensor_parallel_size,
                pipeline_parallel_size: facts.pipeline_parallel_size,
                kv_cache_dtype: facts.kv_cache_dtype.clone(),
                block_size: facts.block_size,
                chunk_size: decisions.chunk_size.value,
            },
            capacity_bytes: disk.capacity.value,
        });
    let args = server_args(facts, node, &decisions, &cascade);
    let mut env = BTreeMap::new();
    env.insert("LMCACHE_TRACK_USAGE".to_string(), "false".to_string());
    env.insert("PYTHONUNBUFFERED".to_string(), "1".to_string());
    if let Some(level) = &node.lmcache_log_level {
        env.insert("LMCACHE_LOG_LEVEL".to_string(), level.clone());
    }
    Ok(LaunchPlan {
        executable,
        args,
        env,
        cascade,
        mp_port: node.mp_port,
        http_port: node.http_port,
        decisions,
        housekeeping,
    })
}

fn check_engine(facts: &EngineFacts) -> Result<(), PlanError> {
    let positive = [
        ("tensor-parallel-size", facts.tensor_parallel_size),
        ("pipeline-parallel-size", facts.pipeline_parallel_size),
        ("data-parallel-size", facts.data_parallel_size),
        ("block-size", facts.block_size),
        ("max-num-batched-tokens", facts.max_num_batched_tokens),
    ];
    for (flag, value) in positive {
        if value == 0 {
            return Err(PlanError::Engine {
                flag,
                value: value.to_string(),
                expected: "give a whole number of at least 1",
            });
        }
    }
    if facts.model.is_empty() || facts.model.contains('@') {
        return Err(PlanError::Engine {
            flag: "model",
            value: format!("{:?}", facts.model),
            expected: "give the served model name: not empty, without '@' (LMCache separates object name fields with it)",
        });
    }
    Ok(())
}

/// `lmcache server` arguments in the order of issue 2.
fn server_args(
    facts: &EngineFacts,
    node: &NodeEnv,
    d: &Decisions,
    cascade: &Cascade,
) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "server".into(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        node.mp_port.to_string(),
        "--http-host".into(),
        "127.0.0.1".into(),
        "--http-port".into(),
        node.http_port.to_string(),
        "--chunk-size".into(),
        d.chunk_size.value.to_string(),
        "--l1-size-gb".into(),
        gib_arg(d.l1_size.value),
        "--eviction-policy".into(),
    ];
    match d.l1_mode {
        L1Mode::Cache => args.push("LRU".into()),
        L1Mode::WriteBuffer => {
            args.extend(["noop".into(), "--l2-store-policy".into(), "skip_l1".into()])
        }
    }
    args.push("--max-gpu-workers".into());
    args.push(facts.gpu_workers().to_string());
    for tier in cascade.tiers() {
        args.push("--l2-adapter".into());
        args.push(tier.to_arg());
    }
    args
}

/// A byte count as LMCache's GiB flag value: `"6"`, `"1.5"`.
fn gib_arg(bytes: u64) -> String {
    format!("{}", bytes as f64 / GIB as f64)
}

/// Sizes the node's built-in disk tier under `node.disk_path` for an L1 of
/// `l1_bytes`: volume statistics, reclaimable cache bytes, capacity, I/O
/// workers and O_DIRECT (seed, "LMCache Disk Tier").
///
/// Errors: an unusable cache directory (relative, not a directory, not
/// creatable or not writable, unreadable).
pub fn size_disk_tier(
    node: &NodeEnv,
    host: &HostFacts,
    l1_bytes: u64,
    access: DiskAccess,
) -> Result<DiskTier, PlanError> {
    let path = node.disk_path.clone();
    let measured_at = prepare_disk_path(&path, access)?;
    let volume = probe::volume_stats(&measured_at).map_err(|e| {
        disk_error(
            &path,
            format!("cannot read the volume statistics: {e}"),
            "Check that the path is on a mounted filesystem",
        )
    })?;
    let reclaimable_bytes = if measured_at == path {
        crate::housekeep::reclaimable_bytes(&path).map_err(|e| {
            disk_error(
                &path,
                format!("cannot scan the cache directory: {e}"),
                "Check its permissions",
            )
        })?
    } else {
        0
    };
    let capacity = rules::disk_capacity(&volume, reclaimable_bytes, l1_bytes, node.disk_size_bytes);
    let io_workers = rules::io_workers(host.physical_cores);
    let probe = probe::probe_odirect(&measured_at);
    if let OdirectProbe::Failed(why) = &probe {
        if why.starts_with("open") && is_permission_error(why) {
            return Err(disk_error(&path, format!("cannot create a file in {}: {why}", measured_at.display()), "Make the directory writable by this user, or point the variable at a writable directory"));
        }
    }
    let use_odirect = rules::use_odirect(volume.block_size, &probe);
    Ok(DiskTier {
        path,
        volume,
        reclaimable_bytes,
        capacity,
        io_workers,
        use_odirect,
    })
}

fn is_permission_error(why: &str) -> bool {
    why.contains("Permission denied") || why.contains("Read-only file system")
}

fn disk_error(path: &Path, problem: String, fix: &'static str) -> PlanError {
    PlanError::DiskPath {
        variable: env::DISK_PATH,
        path: path.display().to_string(),
        problem,
        fix,
    }
}

/// Checks the cache directory and returns the directory to measure: the
/// path itself, or (with [`DiskAccess::Inspect`] and a missing path) its
/// nearest existing ancestor.
fn prepare_disk_path(path: &Path, access: DiskAccess) -> Result<PathBuf, PlanError> {
    if !path.is_absolute() {
        return Err(disk_error(
            path,
            "the path is relative".into(),
            "Give an absolute path",
        ));
    }
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(path.to_path_buf()),
        Ok(meta) if meta.file_type().is_symlink() && path.is_dir() => Ok(path.to_path_buf()),
        Ok(_) => Err(disk_error(
            path,
            "it exists and is not a directory".into(),
            "Point it at a directory (it is created, mode 0700, if missing)",
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => match access {
            DiskAccess::Create => {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(path)
                    .map_err(|e| {
                        disk_error(
                            path,
                            format!("cannot create it: {e}"),
                            "Create it yourself or point the variable at a writable place",
                        )
                    })?;
                fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(|e| {
                    disk_error(
                        path,
                        format!("cannot set mode 0700: {e}"),
                        "Check who owns it",
                    )
                })?;
                Ok(path.to_path_buf())
            }
            DiskAccess::Inspect => {
                let mut ancestor = path.parent();
                while let Some(a) = ancestor {
                    if a.is_dir() {
                        return Ok(a.to_path_buf());
                    }
                    if a.exists() {
                        return Err(disk_error(
                            path,
                            format!("{} is not a directory", a.display()),
                            "Point the variable below a directory",
                        ));
                    }
                    ancestor = a.parent();
                }
                Ok(PathBuf::from("/"))
            }
        },
        Err(e) => Err(disk_error(
            path,
            format!("cannot read it: {e}"),
            "Check its permissions",
        )),
    }
}
