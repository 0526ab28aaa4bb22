//! The inputs of a plan, shared by the code that measures them
//! ([`crate::plan::facts`]) and the planner ([`crate::plan::launch_plan`]): the engine
//! facts, the host facts as the sizing rules read them, the measured cache
//! volume with the one scan of its tier, and the error a plan ends with
//! (`docs/design.md`, "One launch"). Neither side imports the other for
//! them.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use lmcache_capacity_guard::Watch;
use lmcache_housekeeping::{scan, HousekeepingError, LaunchIdentity, Mode, ScannedTier};
use lmcache_sizing::rules::{self, OdirectProbe, VolumeStats};
use lmcache_sizing::volume::{Filesystem, SizingError};
use lmcache_sizing::Decision;
use lmcache_tier_spec::shown_path;
use serde::{Deserialize, Serialize};

use crate::node::env;
use crate::plan::weights::{self, Weights};

/// What the engine (vLLM) runs with: the facts a launch is planned from.
/// [`Default`] is vLLM's defaults with the model `default-model`.
///
/// The launch identity ([`EngineFacts::launch_identity`]) follows how
/// LMCache 0.5.6's vLLM connector names objects from the same engine flags
/// (`docs/configuration.md`, "The launch identity").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct EngineFacts {
    /// The model as vLLM's `--model` gives it (a hub id or a path):
    /// LMCache names every object after it (`model_config.model`).
    pub model: String,
    /// vLLM's `--served-model-name`: the name clients send. Not in any
    /// object name, so not part of the launch identity; recorded for the
    /// plan's log only.
    pub served_model_name: Option<String>,
    /// Tensor-parallel size.
    pub tensor_parallel_size: u32,
    /// Pipeline-parallel size.
    pub pipeline_parallel_size: u32,
    /// Data-parallel size.
    pub data_parallel_size: u32,
    /// Decode-context-parallel size (vLLM's
    /// `--decode-context-parallel-size`), >= 1.
    pub decode_context_parallel_size: u32,
    /// vLLM's `--cp-kv-cache-interleave-size` (tokens per DCP shard
    /// interleave), >= 1.
    pub cp_kv_cache_interleave_size: u32,
    /// KV cache dtype (`auto`, `fp8`, ...).
    pub kv_cache_dtype: String,
    /// KV cache block size in tokens.
    pub block_size: u32,
    /// The engine's max batched tokens per step (`--max-num-batched-tokens`);
    /// `None`: not given, vLLM's own default on the node's GPU
    /// ([`lmcache_sizing::engine::max_num_batched_tokens`]).
    pub max_num_batched_tokens: Option<u32>,
    /// Whether the model is hybrid-attention (attention layers mixed with
    /// state-space or linear-attention layers). Its chunk size must then be
    /// a multiple of `block_size` (`docs/sizing.md`, "Chunk size").
    pub hybrid_attention: bool,
    /// Whether the model uses multi-head latent attention (vLLM's
    /// `model_config.use_mla`: DeepSeek-V2/V3 and their kind). With
    /// `hybrid_attention` off, LMCache stores its KV once per pipeline
    /// stage and DCP shard, not once per TP rank.
    pub mla: bool,
    /// vLLM's `--revision` of a hub id (a branch, tag or commit); `None`:
    /// `main`.
    pub revision: Option<String>,
    /// vLLM's `--download-dir`: the Hugging Face cache the engine
    /// downloads into and loads from.
    pub download_dir: Option<String>,
    /// The fingerprint of the engine's weights, where the node agent
    /// knows it (a hash of its own, a release name): taken instead of
    /// measuring ([`crate::plan::weights`]).
    pub weights_fingerprint: Option<String>,
    /// The engine's settings that change the KV it computes, as given
    /// ([`KV_SETTINGS`]: vLLM flag names without dashes, `_` for `-`).
    pub kv_settings: BTreeMap<String, String>,
}

/// The vLLM flags besides the model's weights that change the bytes of
/// the KV a prefix gets, by name (`_` for `-`) with the flag's own
/// spelling, each value at most [`KV_SETTING_MAX_BYTES`]: the dtype the model runs
/// in, its quantization, the configuration it is built from (RoPE scaling
/// and friends through `hf_overrides`, another `hf_config_path`), which
/// files and code load it (`load_format`, `code_revision`, `model_impl`),
/// fp8 KV scales computed at run time, and LoRA (LMCache 0.5.6's keys do not
/// name an adapter). `docs/configuration.md`, "The cache identity", says
/// why the others are left out.
pub const KV_SETTINGS: &[(&str, &str)] = &[
    ("dtype", "dtype"),
    ("quantization", "quantization"),
    ("hf_overrides", "hf-overrides"),
    ("hf_config_path", "hf-config-path"),
    ("load_format", "load-format"),
    ("code_revision", "code-revision"),
    ("model_impl", "model-impl"),
    ("calculate_kv_scales", "calculate-kv-scales"),
    ("enable_lora", "enable-lora"),
];

impl Default for EngineFacts {
    fn default() -> Self {
        EngineFacts {
            model: "default-model".into(),
            served_model_name: None,
            tensor_parallel_size: 1,
            pipeline_parallel_size: 1,
            data_parallel_size: 1,
            decode_context_parallel_size: 1,
            cp_kv_cache_interleave_size: 1,
            kv_cache_dtype: "auto".into(),
            block_size: 16,
            max_num_batched_tokens: None,
            hybrid_attention: false,
            mla: false,
            revision: None,
            download_dir: None,
            weights_fingerprint: None,
            kv_settings: BTreeMap::new(),
        }
    }
}

impl EngineFacts {
    /// GPU ranks of the engine: tensor x pipeline x data parallel sizes, the
    /// server's `--max-gpu-workers`.
    pub(crate) fn gpu_workers(&self) -> u32 {
        self.tensor_parallel_size
            .saturating_mul(self.pipeline_parallel_size)
            .saturating_mul(self.data_parallel_size)
    }

    /// Where the engine's weights come from ([`crate::plan::weights::measure`]).
    pub fn weights_source(&self) -> weights::Source<'_> {
        weights::Source {
            model: &self.model,
            revision: self.revision.as_deref(),
            download_dir: self.download_dir.as_deref(),
            given: self.weights_fingerprint.as_deref(),
        }
    }

    /// The identity of the objects this engine writes with a server of
    /// `chunk_size` tokens from the `weights` the launch measured: the
    /// model as vLLM gives it to LMCache, the parallel layout LMCache names
    /// objects by (MLA-only is `mla` without `hybrid_attention`, LMCache's
    /// `mla_only`), and the fields no name carries: the weights'
    /// fingerprint and the engine's [`KV_SETTINGS`] (with the `revision`
    /// where the weights were not resolved to a commit).
    pub fn launch_identity(&self, chunk_size: u32, weights: Option<&Weights>) -> LaunchIdentity {
        let fingerprint = weights.and_then(Weights::fingerprint);
        let mut engine_settings = normalised_settings(&self.kv_settings);
        if let (None, Some(revision)) = (&fingerprint, &self.revision) {
            engine_settings.insert("revision".into(), revision.clone());
        }
        LaunchIdentity {
            model: self.model.clone(),
            tensor_parallel_size: self.tensor_parallel_size,
            pipeline_parallel_size: self.pipeline_parallel_size,
            kv_cache_dtype: self.kv_cache_dtype.clone(),
            block_size: self.block_size,
            chunk_size,
            decode_context_parallel_size: self.decode_context_parallel_size,
            cp_kv_cache_interleave_size: self.cp_kv_cache_interleave_size,
            mla_only: self.mla && !self.hybrid_attention,
            weights: fingerprint,
            engine_settings,
        }
    }
}

/// The largest value of one of [`EngineFacts::kv_settings`], in bytes
/// (an `hf_overrides` JSON with room to spare; the manifest holds the
/// whole identity within its 64 KiB).
pub const KV_SETTING_MAX_BYTES: usize = 4096;

/// `settings` as the identity records them: a value that is vLLM's own
/// default (`auto` for `dtype`, `load_format` and `model_impl`) left out,
/// as if not given, and `hf_overrides` as compact JSON with its keys
/// sorted, so spellings of the same settings are one identity.
fn normalised_settings(settings: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let vllm_default = |name: &str, value: &str| {
        ["dtype", "load_format", "model_impl"].contains(&name) && value == "auto"
    };
    settings
        .iter()
        .filter(|(name, value)| !vllm_default(name, value))
        .map(|(name, value)| {
            let value = match name.as_str() {
                "hf_overrides" => serde_json::from_str(value)
                    .map(|json| sorted_json(json).to_string())
                    .unwrap_or_else(|_| value.clone()),
                _ => value.clone(),
            };
            (name.clone(), value)
        })
        .collect()
}

/// `json` with the keys of every object in sorted order.
fn sorted_json(json: serde_json::Value) -> serde_json::Value {
    match json {
        serde_json::Value::Object(object) => {
            let sorted: BTreeMap<String, serde_json::Value> = object
                .into_iter()
                .map(|(key, value)| (key, sorted_json(value)))
                .collect();
            serde_json::Value::Object(sorted.into_iter().collect())
        }
        serde_json::Value::Array(items) => items.into_iter().map(sorted_json).collect(),
        other => other,
    }
}

/// Facts about the host as the sizing rules read them: the memory
/// decision, the cores, and the measured facts of the server executable and
/// the cache directory's volume.
///
/// [`crate::Facts::measure`] measures a host and converts (`From<&Facts>`);
/// tests and what-if planning build one by hand, so that nothing depends on
/// the machine the plan is made on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostFacts {
    /// Memory available to this node's container or host, in bytes.
    pub memory: Decision<u64>,
    /// Physical cores (hyper-threads counted once).
    pub physical_cores: u32,
    /// What starts the server; `None` has [`crate::plan()`] look it up.
    #[serde(skip)]
    pub executable: Option<PathBuf>,
    /// The cache directory's volume, when the node runs its built-in disk
    /// tier (the figures the plan used are in [`crate::plan::launch_plan::DiskTier`]).
    #[serde(skip)]
    pub disk: Option<DiskFacts>,
    /// The GPUs the server would see and whether LMCache's compiled
    /// extensions load there; `None` on a node without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<crate::plan::gpu::GpuFacts>,
    /// The GPU and the vLLM the engine's batched-token default is read
    /// from ([`crate::plan::gpu::engine_gpu`]); `None` on a node without a GPU,
    /// or when the engine's `--max-num-batched-tokens` is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_gpu: Option<lmcache_sizing::engine::EngineGpu>,
    /// The O_DIRECT test write in each custom `fs`/`fs_native` tier that
    /// sets `"use_odirect": true` ([`crate::Facts::odirect_tiers`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub odirect_tiers: Vec<TierOdirect>,
    /// The device of each `raw_block` tier of a custom cascade
    /// ([`crate::Facts::raw_block_devices`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub raw_block_devices: Vec<crate::plan::raw_block::TierDevice>,
    /// The installed LMCache's version ([`crate::Facts::lmcache_version`]):
    /// the plan renders for it ([`crate::plan::lmcache_versions`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lmcache_version: Option<String>,
    /// The weights behind the engine's `--model`
    /// ([`crate::plan::weights::measure`]); `None`: not measured (what-if
    /// planning, recorded facts), so the identity records no weights and
    /// the plan warns of nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<Weights>,
    /// The node's variables as [`crate::Facts::measure`] read them, from
    /// the same map [`crate::plan()`] is given; `None` has the plan read
    /// that map itself ([`env::NodeEnv::from_vars`]).
    #[serde(skip)]
    pub node: Option<env::NodeEnv>,
}

/// A launch that cannot be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A variable with a bad value.
    #[error(transparent)]
    Config(#[from] env::ConfigError),
    /// The executable that starts the server is missing.
    #[error(transparent)]
    Executable(#[from] crate::plan::locate::NotFound),
    /// A port of the launch cannot be listened on
    /// ([`crate::node::ports::check_free`], a real launch only).
    #[error(transparent)]
    Listen(#[from] crate::node::ports::ListenError),
    /// The server's Python cannot import a module the cascade's tier kinds
    /// need ([`crate::plan::server_python`]: boto3 for `s3_bucket` tiers,
    /// LMCache's Rust raw-block extension for `raw_block` ones).
    #[error("{variable}: {source}")]
    ServerModule {
        /// The variable that gave the tiers (`EREBINE_AGENT_LMCACHE_L2_ADAPTER`,
        /// or `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` for its `--l2-adapter`s).
        variable: &'static str,
        /// What the Python could not import.
        source: crate::plan::server_python::ModuleError,
    },
    /// A key the server would read at start (the node's key file, or
    /// LMCache's own `LMCACHE_API_KEY*` variables) that it would refuse.
    #[error(transparent)]
    ApiKey(#[from] crate::plan::api_key::ApiKeyError),
    /// The cache directory (or the lookup-hash log directory) cannot be used.
    #[error("{variable}={}: {problem}. {fix}", shown_path(path))]
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
    /// The cache directory's volume cannot hold the tier as asked: its
    /// figures cannot size it (FUSE, network, implausible) and no size was
    /// given, or an explicit size on memory passes the node's budget.
    #[error("{variable}={}: {source}", shown_path(path))]
    Sizing {
        /// The variable that named the directory.
        variable: &'static str,
        /// The cache directory.
        path: String,
        /// What the sizing rules refused.
        source: SizingError,
    },
    /// The host's memory size could not be read.
    #[error("cannot read the host's memory size: {0}")]
    Memory(#[source] io::Error),
    /// The tier is held by another launch, or cannot be locked.
    #[error(transparent)]
    Tier(#[from] lmcache_housekeeping::HousekeepingError),
    /// The plan needs the cache directory's volume, and the host facts
    /// given carry none.
    #[error("the cache directory's volume was not measured: plan from Facts::measure, or give HostFacts a disk")]
    NotMeasured,
    /// An L1 set by hand above the node's memory.
    #[error(transparent)]
    L1AboveMemory(#[from] rules::L1AboveMemory),
    /// A host fact no host has (given by hand, not measured).
    #[error("HostFacts.{field} = {value} cannot be a host's: give {expected}")]
    HostFact {
        /// The field at fault.
        field: &'static str,
        /// Its value.
        value: String,
        /// What to give instead.
        expected: &'static str,
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

/// The O_DIRECT test write in the directory of one tier of a custom
/// cascade (the nearest existing ancestor while it does not exist).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierOdirect {
    /// The tier's position in the cascade.
    pub position: usize,
    /// Its adapter type (`fs`, `fs_native`).
    pub adapter: String,
    /// Its `base_path`.
    pub base_path: PathBuf,
    /// What the test write did.
    pub odirect: OdirectProbe,
}

/// What the cache directory's volume and contents are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiskFacts {
    /// The directory measured: the cache directory, or its nearest existing
    /// ancestor when it does not exist yet (a dry run creates nothing).
    pub measured_at: PathBuf,
    /// The volume's size, free bytes and block size.
    pub volume: VolumeStats,
    /// The volume's filesystem type and read-only flag.
    pub filesystem: Filesystem,
    /// Allocated bytes of cache objects and stale temp files already in the
    /// directory (R of `docs/sizing.md`): what housekeeping could delete.
    pub reclaimable_bytes: u64,
    /// What the O_DIRECT test write did.
    pub odirect: OdirectProbe,
    /// What the read test did, when `EREBINE_AGENT_LMCACHE_DISK_READ_GBPS`
    /// asks for it ([`lmcache_sizing::disk_load::probe_read`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_probe: Option<lmcache_sizing::disk_load::ReadProbe>,
    /// The scan these figures came from, for housekeeping and the guard.
    #[serde(skip)]
    pub tier: MeasuredTier,
}

/// One scan of the tier, with the lock and the capacity guard's watch
/// taken before it; handed on once (to the launch that housekeeps from it).
/// Figures and plans that share it compare equal whatever it holds: it is
/// a resource, not a fact.
#[derive(Clone, Default)]
pub struct MeasuredTier(Arc<Mutex<Option<TierScan>>>);

/// What [`MeasuredTier`] hands on.
#[derive(Debug)]
pub struct TierScan {
    /// The directory, its lock (a launch) and its inventory.
    pub scanned: ScannedTier,
    /// The capacity guard's watch, added before the scan (a launch).
    pub watch: Option<Watch>,
}

impl MeasuredTier {
    pub(crate) fn new(scan: TierScan) -> Self {
        Self(Arc::new(Mutex::new(Some(scan))))
    }

    /// The scan, once: `None` after the first call, or when nothing was
    /// scanned (facts given by hand).
    pub fn take(&self) -> Option<TierScan> {
        self.0.lock().ok()?.take()
    }
}

impl fmt::Debug for MeasuredTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self.0.lock().map(|s| s.is_some()).unwrap_or(false);
        write!(f, "MeasuredTier {{ held: {held} }}")
    }
}

impl PartialEq for MeasuredTier {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for MeasuredTier {}

impl TierScan {
    /// Opens the tier at `path`, for [`Mode::Apply`] locks it and adds the
    /// capacity guard's watch, then scans it.
    ///
    /// Errors: the directory, the lock or the scan ([`HousekeepingError`]);
    /// a watch inotify cannot add is a warning (the guard then rescans).
    pub fn take(path: &Path, mode: Mode) -> Result<Self, HousekeepingError> {
        let (dir, lock) = ScannedTier::lock(path, mode)?;
        let watch = match mode {
            Mode::Apply => Watch::add(&dir)
                .inspect_err(|e| {
                    tracing::warn!(
                        "cannot watch {} with inotify ({e}); its capacity guard follows it by rescans",
                        path.display()
                    )
                })
                .ok(),
            Mode::DryRun => None,
        };
        let started = std::time::Instant::now();
        let inventory = scan(&dir)?;
        tracing::debug!(
            "scanned {}: {} objects in {} ms",
            path.display(),
            inventory.objects().len(),
            started.elapsed().as_millis()
        );
        Ok(TierScan {
            scanned: ScannedTier {
                dir,
                lock,
                inventory,
            },
            watch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(settings: &[(&str, &str)]) -> LaunchIdentity {
        let engine = EngineFacts {
            kv_settings: settings
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..EngineFacts::default()
        };
        engine.launch_identity(256, None)
    }

    /// Spellings of the same engine are one identity: vLLM's own defaults
    /// given or not, an `hf_overrides` JSON in any key order and spacing.
    #[test]
    fn spellings_of_the_same_settings_are_one_identity() {
        let none = with(&[]);
        assert_eq!(
            with(&[
                ("dtype", "auto"),
                ("load_format", "auto"),
                ("model_impl", "auto")
            ]),
            none
        );
        assert_ne!(with(&[("dtype", "bfloat16")]), none);
        let a = with(&[(
            "hf_overrides",
            r#"{"rope_scaling":{"factor":4.0,"rope_type":"yarn"},"a":1}"#,
        )]);
        let b = with(&[(
            "hf_overrides",
            r#"{ "a": 1, "rope_scaling": {"rope_type": "yarn", "factor": 4.0} }"#,
        )]);
        assert_eq!(a, b);
        assert_ne!(a, with(&[("hf_overrides", r#"{"a":2}"#)]));
        assert_eq!(
            with(&[("hf_overrides", "not json")]).engine_settings["hf_overrides"],
            "not json"
        );
    }

    /// Without a weights fingerprint the revision as given stands in for
    /// it; with one, it adds nothing.
    #[test]
    fn the_revision_counts_only_where_the_weights_were_not_resolved() {
        let engine = EngineFacts {
            revision: Some("v2".into()),
            ..EngineFacts::default()
        };
        let unseen = engine.launch_identity(256, None);
        assert_eq!(unseen.engine_settings["revision"], "v2");
        let given = Weights::Given {
            fingerprint: "release 7".into(),
        };
        let seen = engine.launch_identity(256, Some(&given));
        assert!(seen.engine_settings.is_empty());
        assert_eq!(seen.weights.as_deref(), Some("release 7"));
    }
}
