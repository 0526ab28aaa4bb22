//! From engine facts and the node's environment to a launch plan: the
//! `lmcache server` command line, its environment, and every decision with its
//! reason.
//!
//! Rules: `docs/configuration.md` (variables, the server command line, the
//! connector config, extra arguments) and `docs/sizing.md`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::node::extensions::{planned_tiers, ExtensionError, PlannedTier};
use lmcache_housekeeping::LaunchIdentity;
use lmcache_resp::spec::{resp_tiers, PASSWORD_ENV, USERNAME_ENV};
use lmcache_sizing::rules::{self, OdirectProbe};
use lmcache_sizing::{fmt_gib, Decision};
use lmcache_tier_spec::{Cascade, TierSpec};
use serde::Serialize;
use serde_json::Value;

use crate::node::env::{self, ConfigError, LookupHashLog, NodeEnv};
use crate::node::extra_args;
use crate::node::ports::{self, Listener};
use crate::node::server_flags::server_flags;
use crate::plan::housekeep::DiskHousekeeping;
use crate::plan::inputs::{
    EngineFacts, HostFacts, PlanError, TierOdirect, KV_SETTINGS, KV_SETTING_MAX_BYTES,
};
use crate::plan::raw_block;

use super::api_key::{self, ApiKeySource};
pub use super::command_line::{connector_config, Replaced};
use super::command_line::{node_flags, server_args, server_env, NodeValues};
pub(crate) use super::disk_tier::kind_name;
pub use super::disk_tier::{check_volume, size_disk_tier, DiskTier};
pub use super::l1::server_l1;
use super::lmcache_versions::{self, LmcacheRelease, Rendering};
pub use super::verdict::{judge_sizes, L1Mode, Sizes, Tiers};

/// An operator's disk tier the launch fences by the cache identity
/// ([`LaunchPlan::fenced_tiers`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FencedTier {
    /// The tier's position in the cascade (0-based).
    pub position: usize,
    /// Its `base_path`.
    pub path: PathBuf,
}

/// The disk tiers of `cascade` a launch fences ([`LaunchPlan::fenced_tiers`]),
/// but the node's own, which housekeeping keeps.
fn fenced_tiers(cascade: &Cascade, own: Option<&DiskHousekeeping>) -> Vec<FencedTier> {
    let own = own.map(|hk| hk.path.as_path());
    let shared = |tier: &TierSpec| tier.as_object().get("shared") == Some(&Value::Bool(true));
    cascade
        .tiers()
        .iter()
        .enumerate()
        .filter(|(_, tier)| tier.is_disk_tier() && !shared(tier))
        .filter_map(|(position, tier)| {
            let path = PathBuf::from(tier.base_path()?);
            (path.is_absolute() && Some(path.as_path()) != own)
                .then_some(FencedTier { position, path })
        })
        .collect()
}

/// LMCache 0.5.6's default `--worker-reap-timeout-seconds`: how long the
/// server keeps a worker that stopped PINGing. The reap grace of workers
/// after a restart when the plan does not set the flag (or sets 0, which
/// turns reaping off): `docs/inspect.md`, "Workers a restart loses".
pub const LMCACHE_REAP_TIMEOUT: Duration = Duration::from_secs(120);

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
    /// The engine's max batched tokens per step, given or vLLM's default
    /// on the node's GPU ([`lmcache_sizing::engine`]).
    pub max_num_batched_tokens: Decision<u32>,
    /// Chunk size in tokens.
    pub chunk_size: Decision<u32>,
    /// The built-in disk tier; `None` when the operator's
    /// `EREBINE_AGENT_LMCACHE_L2_ADAPTER` replaces it.
    pub disk: Option<DiskTier>,
    /// Where the L2 cascade came from.
    pub cascade_source: Decision<()>,
    /// The lookup-hash log the node configures; `None` when off or when
    /// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` sets `--lookup-hash-log-dir`.
    pub lookup_hash_log: Option<LookupHashLog>,
    /// The node's flags that `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` replaced.
    pub replaced_by_extra_args: Vec<Replaced>,
    /// What an operator should know about this plan, one sentence each
    /// with the numbers: a memory-backed disk tier, a disk tier smaller
    /// than L1, a filesystem type the rules do not know, a tier on an
    /// overlay (a container's writable layer). A launch logs each
    /// as a warning.
    pub warnings: Vec<String>,
}

/// LMCache's flag for how long a silent worker is kept
/// (`lmcache-server-flags.json`).
const REAP_TIMEOUT_FLAG: &str = "--worker-reap-timeout-seconds";

/// `--l2-adapter` with its value in the same argument.
const EQUALS_SPEC: &str = "--l2-adapter=";

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
    /// The environment the server starts from: the map the plan was made
    /// from ([`crate::plan()`] sets it), with [`LaunchPlan::env`] added on
    /// top. Empty means this process's environment. Passed on byte for
    /// byte. Never printed: it may hold credentials.
    pub base_env: crate::node::env::Vars,
    /// The L2 tiers the server gets, in cascade order (one per
    /// `--l2-adapter` in `args`, extra arguments included).
    pub cascade: Cascade,
    /// [`LaunchPlan::cascade`]'s tiers with the capacity guard's spec of
    /// each, read once: the guards the launch checks and starts come from
    /// here.
    pub tiers: Vec<PlannedTier>,
    /// The server's ZMQ port (127.0.0.1), as the server gets it.
    pub mp_port: u16,
    /// The server's HTTP port (127.0.0.1), where `/status` answers.
    pub http_port: u16,
    /// Every port the launch listens on, with the setting that chose it
    /// (no two alike: [`ports::check_distinct`]).
    pub listeners: Vec<Listener>,
    /// The node's metrics endpoint (`docs/metrics.md`); `None` when
    /// `EREBINE_AGENT_LMCACHE_METRICS_PORT` is 0.
    pub metrics: Option<Listener>,
    /// The engine's `--kv-transfer-config` JSON object:
    /// `{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both","kv_connector_extra_config":{"lmcache.mp.host":"tcp://127.0.0.1","lmcache.mp.port":<MP port>, ...}}`,
    /// with `EREBINE_AGENT_LMCACHE_EXTRA_CONFIG` merged into
    /// `kv_connector_extra_config` (its keys win).
    pub connector_config: Value,
    /// Every decision with its reason.
    pub decisions: Decisions,
    /// The housekeeping of the node's disk tier that runs before the server
    /// starts; `None` without a built-in disk tier.
    pub housekeeping: Option<DiskHousekeeping>,
    /// The API key file the server gets (`EREBINE_AGENT_LMCACHE_API_KEY_FILE`,
    /// where its LMCache version takes one): the launch creates it, 0600
    /// with a new key, when it is missing ([`api_key::ensure_file`]).
    pub api_key_file: Option<PathBuf>,
    /// The cache identity of this launch: what the objects it writes are
    /// computed from (the engine's flags, the weights' fingerprint). The
    /// disk tier's manifest records it, and each `s3_bucket` tier keeps its
    /// objects under its tag ([`LaunchIdentity::tag`],
    /// `docs/configuration.md`, "The cache identity").
    pub identity: LaunchIdentity,
    /// The operator's own disk tiers the launch fences by the cache
    /// identity before the server starts: each `fs` or `fs_native` tier
    /// of a custom cascade whose `base_path` is absolute and that is not
    /// `"shared": true` (its identity manifest purges it under another
    /// identity; `docs/configuration.md`, "The cache identity").
    pub fenced_tiers: Vec<FencedTier>,
    /// The commit the engine must be given as `--revision` for the cache
    /// to hold what it computes: a hub id whose revision the engine would
    /// otherwise resolve itself ([`crate::plan::weights::Weights::revision_to_pin`]).
    pub engine_revision: Option<String>,
}

impl LaunchPlan {
    /// The metrics endpoint's URL, `None` when it is off.
    pub(crate) fn metrics_url(&self) -> Option<String> {
        let m = self.metrics.as_ref()?;
        Some(format!(
            "http://{}/metrics",
            std::net::SocketAddr::new(m.host, m.port)
        ))
    }

    /// The `/status` URL of the planned server.
    pub fn status_url(&self) -> String {
        format!("http://127.0.0.1:{}/status", self.http_port)
    }

    /// Where a key the server accepts is found, for the requests of ours to
    /// its HTTP port ([`api_key::source`]: its `--api-key-file`, else its
    /// environment, read by `lookup`); `None` when it has no key, or its
    /// LMCache version has no API keys.
    pub fn api_key_source(&self, lookup: &dyn Fn(&str) -> Option<String>) -> Option<ApiKeySource> {
        let release = self.decisions.host.lmcache_version.as_deref();
        let release = release.and_then(LmcacheRelease::parse);
        lmcache_versions::rendering(release.as_ref())
            .api_key_file
            .then(|| api_key::source(&self.args, lookup))
            .flatten()
    }

    /// The server's `--worker-reap-timeout-seconds` as its arguments set it
    /// (the last one, as LMCache's argparse reads them; from
    /// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` or arguments added to the plan);
    /// `None` when they do not set it.
    pub fn worker_reap_timeout(&self) -> Option<Duration> {
        let args: Vec<&str> = self.args.iter().skip(1).map(String::as_str).collect();
        server_flags()
            .read(&args)
            .ok()?
            .into_iter()
            .rev()
            .find(|o| o.flag == REAP_TIMEOUT_FLAG)?
            .values
            .first()
            .and_then(|v| v.parse::<f64>().ok())
            .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
    }

    /// How long after a restarted server is ready the engine workers of the
    /// previous start may take to register with it before they are lost
    /// (`docs/inspect.md`, "Workers a restart loses"): the server's reap
    /// timeout ([`LaunchPlan::worker_reap_timeout`]), or LMCache's default
    /// ([`LMCACHE_REAP_TIMEOUT`], 120 s) when the arguments
    /// do not set one or set 0 (reaping off).
    pub fn rejoin_grace(&self) -> Duration {
        self.worker_reap_timeout()
            .filter(|timeout| !timeout.is_zero())
            .unwrap_or(LMCACHE_REAP_TIMEOUT)
    }

    /// The arguments with every adapter spec's secrets redacted: what logs and
    /// `--dry-run` may print.
    pub(crate) fn redacted_args(&self) -> Vec<String> {
        let past = |arg: &str| match Cascade::parse(arg, "--l2-adapter") {
            Ok(cascade) if cascade.tiers().len() == 1 => cascade.redacted()[0].to_string(),
            _ => "<redacted>".to_string(),
        };
        self.args_with(|tier| tier.redacted().to_string(), past)
    }

    /// The arguments the server starts with once the tiers' adapters run:
    /// [`LaunchPlan::args`] with the cascade's tiers written as `tiers` has
    /// them (the cascade as the started adapters pointed it,
    /// `RunningAdapters::server_tiers` in `run/tiers.rs`, in the same order).
    pub fn server_args(&self, tiers: &Cascade) -> Vec<String> {
        let mut rewritten = tiers.tiers().iter();
        self.args_with(
            |_| rewritten.next().map(TierSpec::to_arg).unwrap_or_default(),
            str::to_string,
        )
    }

    /// [`LaunchPlan::args`] with each `--l2-adapter` value, one per tier of
    /// [`LaunchPlan::cascade`] in order (the plan writes them so: `server`,
    /// the node's flags, then `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`), written
    /// by `write` from its tier; a value past the cascade (arguments added
    /// to the plan), or given in one argument (`--l2-adapter=JSON`), is
    /// written by `past` from its text.
    fn args_with(
        &self,
        mut write: impl FnMut(&TierSpec) -> String,
        past: impl Fn(&str) -> String,
    ) -> Vec<String> {
        let mut tiers = self.cascade.tiers().iter();
        let mut out = Vec::with_capacity(self.args.len());
        let mut next_is_spec = false;
        for arg in &self.args {
            match (next_is_spec, next_is_spec.then(|| tiers.next()).flatten()) {
                (true, Some(tier)) => out.push(write(tier)),
                (true, None) => out.push(past(arg)),
                (false, _) => match arg.strip_prefix(EQUALS_SPEC) {
                    Some(value) => out.push(format!("{EQUALS_SPEC}{}", past(value))),
                    None => out.push(arg.clone()),
                },
            }
            next_is_spec = arg == extra_args::L2_ADAPTER_FLAG;
        }
        out
    }

    /// The server's added variables as logs and `--dry-run` show them:
    /// [`LaunchPlan::env`], and, when the cascade has `s3_bucket` tiers,
    /// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`, which the launch
    /// sets to the S3 gateways' per-launch key once they start
    /// (`docs/s3-gateway.md`, "The per-launch key"), shown as
    /// `<redacted>`; and when a `resp` tier's spec gives credentials,
    /// `LMCACHE_RESP_USERNAME` and `LMCACHE_RESP_PASSWORD`, which the
    /// launch moves them to (`docs/redis.md`), shown as `<redacted>`.
    pub fn shown_env(&self) -> BTreeMap<String, String> {
        let mut env = self.env.clone();
        let mut redacted = Vec::new();
        if self.cascade.tiers().iter().any(|t| t.kind().is_bucket()) {
            redacted.extend(["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]);
        }
        let resp_credentials = resp_tiers(&self.cascade)
            .map(|tiers| tiers.into_iter().find(|t| t.credentials.any()))
            .ok()
            .flatten();
        if let Some(tier) = resp_credentials {
            let given = [
                (tier.credentials.username.is_some(), USERNAME_ENV),
                (tier.credentials.password.is_some(), PASSWORD_ENV),
            ];
            redacted.extend(
                given
                    .into_iter()
                    .filter(|(set, _)| *set)
                    .map(|(_, name)| name),
            );
        }
        for name in redacted {
            env.insert(name.to_string(), "<redacted>".to_string());
        }
        env
    }

    /// The engine's `--kv-transfer-config` value: [`LaunchPlan::connector_config`]
    /// as compact JSON.
    pub fn kv_transfer_config(&self) -> String {
        self.connector_config.to_string()
    }

    /// The plan as one JSON object (secrets redacted): `executable`, `argv`,
    /// `env` ([`LaunchPlan::shown_env`]), `status_url`, `listeners`, `connector_config`, `cascade`, `decisions`,
    /// `housekeeping`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "executable": self.executable,
            "argv": self.redacted_args(),
            "env": self.shown_env(),
            "status_url": self.status_url(),
            "listeners": self.listeners,
            "metrics_url": self.metrics_url(),
            "connector_config": self.connector_config,
            "cascade": self.cascade.redacted(),
            "decisions": self.decisions,
            "housekeeping": self.housekeeping,
            "fenced_tiers": self.fenced_tiers,
            "cache_identity": {
                "tag": self.identity.tag(),
                "identity": self.identity,
                "weights": self.decisions.host.weights,
                "engine_revision": self.engine_revision,
            },
        })
    }

    /// The one launch log line: resolved adapters, disk path, worker count,
    /// O_DIRECT decision and capacity, each with its reason, logged once per
    /// launch (`docs/operations.md`).
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
                "; disk_path={}; volume={} ({}); capacity={} ({}); workers={} ({}); use_odirect={} ({})",
                disk.path.display(),
                kind_name(disk.volume_kind.value),
                disk.volume_kind.reason,
                fmt_gib(disk.capacity.value),
                disk.capacity.reason,
                disk.io_workers.value,
                disk.io_workers.reason,
                disk.use_odirect.value,
                disk.use_odirect.reason,
            ));
            if let Some(load) = &disk.load {
                line.push_str(&format!(
                    "; disk_load={} tokens/s ({})",
                    load.value, load.reason
                ));
            }
        }
        if let Some(log) = &d.lookup_hash_log {
            line.push_str(&format!("; lookup_hash_log_dir={}", log.dir.display()));
        }
        for r in &d.replaced_by_extra_args {
            line.push_str(&format!(
                "; {} {} replaced by EREBINE_AGENT_LMCACHE_EXTRA_ARGS {}",
                r.flag, r.node, r.extra
            ));
        }
        line
    }
}

/// Plans a launch of the LMCache server for `facts` with the node's
/// configuration `node` on `host`. `executable` is what starts the server.
///
/// The backend is not consulted here: [`crate::plan()`] answers "nothing to
/// launch" for a node whose backend is not `lmcache`.
///
/// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` is applied last: a node flag it repeats
/// is dropped from the node's part of the command line, its `--l2-adapter`s
/// replace the node's cascade (no disk sizing, no housekeeping), and the
/// plan's ports, chunk size, L1 size and cascade describe what the server
/// really gets.
///
/// A pure function of its inputs: it reads no file and creates nothing
/// ([`crate::Facts::measure`] did that).
///
/// Errors: bad variables, zero L1 with no L2 tier, engine facts out of
/// range, an extra `--chunk-size` that is not a multiple of a
/// hybrid-attention model's block size, a `raw_block` tier whose device
/// something else uses ([`raw_block::refusal`]), and
/// [`PlanError::NotMeasured`] when the built-in disk tier is planned
/// without disk facts.
pub fn plan_launch(
    facts: &EngineFacts,
    node: &NodeEnv,
    host: &HostFacts,
    executable: PathBuf,
) -> Result<LaunchPlan, PlanError> {
    check_engine(facts)?;
    check_host(host)?;
    let listeners = ports::listeners(node);
    ports::check_distinct(&listeners)?;
    let extra = &node.extra_args;
    let batched = engine_batched_tokens(facts, host.engine_gpu.as_ref());
    let (node_chunk, chunk_size) = effective_chunk_size(facts, node, &batched)?;
    let identity = facts.launch_identity(chunk_size.value, host.weights.as_ref());
    let mut sizes = judge_sizes(node, host, Tiers::AsPlanned)?;
    sizes
        .warnings
        .extend(lmcache_sizing::engine::warning(&batched));
    check_writable(node, host, sizes.disk.as_ref())?;
    if let Some(problem) = host.raw_block_devices.iter().find_map(raw_block::refusal) {
        let variable = node.custom_tiers().map_or(env::L2_ADAPTER, |(v, _)| v);
        let problem = ExtensionError::RawBlockInUse(problem);
        return Err(ConfigError::Tier { variable, problem }.into());
    }
    let release = host
        .lmcache_version
        .as_deref()
        .and_then(LmcacheRelease::parse);
    let render = lmcache_versions::rendering(release.as_ref());
    check_extra_args_for(extra, render)?;
    let cascade = crate::node::extensions::with_bound_models(sizes.cascade, &facts.model);
    let cascade = crate::node::extensions::with_cache_identity(cascade, &identity.tag());
    sizes.warnings.extend(
        host.weights
            .as_ref()
            .and_then(|weights| weights.warning(&facts.model)),
    );
    sizes.warnings.extend(lora_warning(facts));
    let (cascade, version_warnings) =
        lmcache_versions::cascade_for(cascade, render, release.as_ref());
    sizes.warnings.extend(version_warnings);
    let (cascade, eviction_warnings) = crate::plan::bucket_warnings::with_eviction_blocks(cascade);
    sizes.warnings.extend(eviction_warnings);
    sizes
        .warnings
        .extend(crate::plan::bucket_warnings::unshared_bucket_warnings(
            &cascade,
        ));
    sizes
        .warnings
        .extend(version_flag_warnings(node, render, release.as_ref()));
    let api_key_file = node.api_key_file.clone().filter(|_| render.api_key_file);
    let own = NodeValues {
        api_key_file: api_key_file.clone(),
        chunk_size: node_chunk,
        l1_bytes: sizes.own_l1.value,
        l1_mode: sizes.l1_mode,
        tiers: match (&node.l2_adapter, extra.l2_adapters()) {
            (_, None) => cascade.redacted().to_string(),
            (Some(custom), Some(_)) => custom.redacted().to_string(),
            (None, Some(_)) => "the built-in fs_native tier (not sized)".to_string(),
        },
    };
    let lookup_hash_log = node
        .lookup_hash_log
        .clone()
        .filter(|_| !extra.replaces("--lookup-hash-log-dir"));
    let mut decisions = Decisions {
        // The record of what the rules read: the scan it may hold stays
        // with the housekeeping below.
        host: HostFacts {
            executable: None,
            disk: None,
            node: None,
            ..host.clone()
        },
        l1_budget: sizes.l1_budget,
        l1_size: sizes.l1_size,
        l1_mode: sizes.l1_mode,
        max_num_batched_tokens: batched,
        chunk_size,
        disk: sizes.disk,
        cascade_source: sizes.cascade_source,
        lookup_hash_log,
        replaced_by_extra_args: Vec::new(),
        warnings: sizes.warnings,
    };
    decisions
        .warnings
        .extend(unbounded_tier_warnings(&cascade, &decisions.cascade_source));
    decisions
        .warnings
        .extend(crate::plan::bucket_warnings::per_process_bound_warnings(
            &cascade,
        ));
    decisions
        .warnings
        .extend(host.odirect_tiers.iter().filter_map(odirect_tier_warning));
    decisions.warnings.extend(
        host.raw_block_devices
            .iter()
            .filter_map(|device| raw_block::warning(device, cascade.tiers().get(device.position)?)),
    );
    decisions
        .warnings
        .extend(host.gpu.as_ref().and_then(crate::plan::gpu::warning));
    // Read once; the node's variables passed these checks already, and
    // what the plan added (bound models, eviction blocks) are defaults.
    let tiers = planned_tiers(&cascade).map_err(|problem| ConfigError::Tier {
        variable: node.custom_tiers().map_or(env::L2_ADAPTER, |(v, _)| v),
        problem,
    })?;
    let housekeeping = disk_housekeeping(&identity, host, &decisions, &tiers);
    let node_flags = node_flags(facts, node, &own, &cascade);
    let (args, replaced) = server_args(node_flags, own.tiers, extra);
    decisions.replaced_by_extra_args = replaced;
    let mp_port = ports::zmq_listener(node).port;
    let http_port = ports::http_listener(node).port;
    let fenced = fenced_tiers(&cascade, housekeeping.as_ref());
    Ok(LaunchPlan {
        executable,
        args,
        env: server_env(node),
        base_env: BTreeMap::new(),
        cascade,
        tiers,
        mp_port,
        http_port,
        listeners,
        metrics: ports::metrics_listener(node),
        connector_config: connector_config(mp_port, &node.extra_config),
        api_key_file,
        decisions,
        housekeeping,
        fenced_tiers: fenced,
        engine_revision: host
            .weights
            .as_ref()
            .and_then(|w| w.revision_to_pin())
            .map(str::to_string),
        identity,
    })
}

/// With vLLM's `--enable-lora`: LMCache 0.5.6's keys (its vLLM
/// connector's `IPCCacheServerKey`: model, world size, token ids, cache
/// salt, request configs) do not name a request's LoRA adapter, so two
/// adapters' requests with one prefix would read each other's KV. vLLM's
/// per-request `cache_salt` is in the key: a salt per adapter keeps them
/// apart.
fn lora_warning(facts: &EngineFacts) -> Option<String> {
    facts.kv_settings.contains_key("enable_lora").then(|| {
        "the engine runs with --enable-lora, and LMCache's object keys do not name a request's LoRA adapter: requests of two adapters (or of an adapter and the base model) with the same prefix read each other's KV. Give every request of an adapter a cache_salt naming it (vLLM's per-request cache_salt is part of LMCache's key; docs/configuration.md, \"The cache identity\")".to_string()
    })
}

/// The housekeeping of the built-in disk tier before the server starts,
/// from the launch's scan in `host`, with the bound of the tier's capacity
/// guard among `tiers`; `None` without a disk tier.
fn disk_housekeeping(
    identity: &LaunchIdentity,
    host: &HostFacts,
    decisions: &Decisions,
    tiers: &[PlannedTier],
) -> Option<DiskHousekeeping> {
    let disk = decisions.disk.as_ref().filter(|d| d.capacity.value > 0)?;
    let guard = tiers
        .iter()
        .filter_map(|tier| tier.guard.as_ref())
        .find(|spec| spec.base_path == disk.path)
        .map(|spec| spec.bound());
    Some(DiskHousekeeping {
        path: disk.path.clone(),
        identity: identity.clone(),
        capacity_bytes: disk.capacity.value,
        guard,
        tier: host
            .disk
            .as_ref()
            .map(|d| d.tier.clone())
            .unwrap_or_default(),
    })
}

/// The engine's max batched tokens: its flag, else vLLM's default for the
/// GPU `gpu` ([`lmcache_sizing::engine::max_num_batched_tokens`]).
pub(crate) fn engine_batched_tokens(
    facts: &EngineFacts,
    gpu: Option<&lmcache_sizing::engine::EngineGpu>,
) -> Decision<u32> {
    lmcache_sizing::engine::max_num_batched_tokens(facts.max_num_batched_tokens, gpu)
}

/// The chunk size rule on the engine's `batched` tokens, then an
/// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` `--chunk-size`, which must respect a
/// hybrid-attention model's block size (the node does not rewrite a
/// passed-through value).
///
/// Returns the node's own value and the effective decision.
pub(crate) fn effective_chunk_size(
    facts: &EngineFacts,
    node: &NodeEnv,
    batched: &Decision<u32>,
) -> Result<(u32, Decision<u32>), PlanError> {
    let hybrid = facts.hybrid_attention.then_some(facts.block_size);
    let mut rule = rules::chunk_size(node.chunk_size, batched.value, hybrid);
    if node.chunk_size.is_none() && batched.rule != "explicit" {
        rule.reason = format!("{} ({})", rule.reason, batched.reason);
    }
    let Some(text) = node.extra_args.value("--chunk-size") else {
        return Ok((rule.value, rule));
    };
    let invalid = |expected: String| ConfigError::Invalid {
        variable: format!("{} (--chunk-size)", env::LMCACHE_EXTRA_ARGS),
        value: text.to_string(),
        expected,
    };
    let variable = format!("{} (--chunk-size)", env::LMCACHE_EXTRA_ARGS);
    let tokens = env::parse_whole(&variable, text, 1, u32::MAX, "a chunk size in tokens")?;
    if facts.hybrid_attention && !tokens.is_multiple_of(facts.block_size) {
        return Err(invalid(format!(
            "write a multiple of the hybrid-attention model's {} -token block size, e.g. {}, or drop it and let the node choose",
            facts.block_size,
            tokens.div_ceil(facts.block_size).saturating_mul(facts.block_size)
        ))
        .into());
    }
    Ok((
        rule.value,
        Decision::new(
            tokens,
            "extra-args",
            format!(
                "EREBINE_AGENT_LMCACHE_EXTRA_ARGS --chunk-size {tokens} replaces the node's {} ({})",
                rule.value, rule.reason
            ),
        ),
    ))
}

pub(crate) fn check_engine(facts: &EngineFacts) -> Result<(), PlanError> {
    let positive = [
        ("tensor-parallel-size", facts.tensor_parallel_size),
        ("pipeline-parallel-size", facts.pipeline_parallel_size),
        ("data-parallel-size", facts.data_parallel_size),
        (
            "decode-context-parallel-size",
            facts.decode_context_parallel_size,
        ),
        (
            "cp-kv-cache-interleave-size",
            facts.cp_kv_cache_interleave_size,
        ),
        ("block-size", facts.block_size),
        (
            "max-num-batched-tokens",
            facts.max_num_batched_tokens.unwrap_or(1),
        ),
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
            value: lmcache_tier_spec::shown_value(&facts.model),
            expected: "give vLLM's --model as the engine gets it: not empty, without '@' (LMCache separates object name fields with it)",
        });
    }
    let known = |name: &str| KV_SETTINGS.iter().find(|(n, _)| *n == name);
    if let Some(unknown) = facts.kv_settings.keys().find(|name| known(name).is_none()) {
        return Err(PlanError::Engine {
            flag: "kv-settings",
            value: lmcache_tier_spec::shown_value(unknown),
            expected: "name one of vLLM's flags that change the KV's bytes: dtype, quantization, hf_overrides, hf_config_path, load_format, code_revision, model_impl, calculate_kv_scales, enable_lora (docs/configuration.md, \"The cache identity\")",
        });
    }
    let too_long = facts
        .kv_settings
        .iter()
        .filter(|(_, value)| value.len() > KV_SETTING_MAX_BYTES)
        .find_map(|(name, value)| Some((known(name)?.1, value)));
    if let Some((flag, value)) = too_long {
        return Err(PlanError::Engine {
            flag,
            value: lmcache_tier_spec::shown_value(value),
            expected: "give it in at most 4096 bytes, as the engine gets it (the cache identity records it whole)",
        });
    }
    let fingerprint = facts.weights_fingerprint.as_deref();
    if fingerprint
        .is_some_and(|f| f.trim().is_empty() || f.len() > 256 || f.contains(char::is_control))
    {
        return Err(PlanError::Engine {
            flag: "weights-fingerprint",
            value: lmcache_tier_spec::shown_value(fingerprint.unwrap_or_default()),
            expected: "give 1 to 256 bytes of text without control characters, the same on every node that runs these weights (a content hash, a release name)",
        });
    }
    Ok(())
}

/// Refuses host facts no host has (a library caller's [`HostFacts`] built
/// by hand; [`crate::Facts::measure`] never gives them): no memory, no
/// cores. The rules would otherwise size from them silently (a 4 GiB L1,
/// its floor, from 0 bytes).
fn check_host(host: &HostFacts) -> Result<(), PlanError> {
    let impossible = |field: &'static str, value: String| PlanError::HostFact {
        field,
        value,
        expected: "a measured figure above 0 (Facts::measure gives it)",
    };
    if host.memory.value == 0 {
        return Err(impossible("memory", "0 bytes".into()));
    }
    if host.physical_cores == 0 {
        return Err(impossible("physical_cores", "0".into()));
    }
    Ok(())
}

/// Refuses a built-in disk tier on a read-only volume: no object could be
/// stored there. (Housekeeping only reads the tier, and does not ask.)
fn check_writable(
    node: &NodeEnv,
    host: &HostFacts,
    disk: Option<&DiskTier>,
) -> Result<(), PlanError> {
    let Some(facts) = host.disk.as_ref().filter(|d| d.filesystem.read_only) else {
        return Ok(());
    };
    if disk.is_none_or(|d| d.capacity.value == 0) {
        return Ok(());
    }
    Err(PlanError::DiskPath {
        variable: env::DISK_PATH,
        path: node.disk_path.display().to_string(),
        problem: format!(
            "its volume ({}) is mounted read-only, so no object could be stored there",
            facts.filesystem.fs_type
        ),
        fix: "Point it at a writable volume, or set EREBINE_AGENT_LMCACHE_DISK_SIZE_GB=0 for no disk tier",
    })
}

/// A warning for each `fs` or `fs_native` tier of a custom cascade without
/// `max_capacity_gb`: LMCache 0.5.6 never evicts such a tier, and nothing
/// else bounds it (no capacity guard either), so it grows until its volume
/// is full (public LMCache reports of a 4,000 GB tier at 14 TB). The node
/// does not rewrite what the operator wrote; the built-in tier always has
/// a capacity.
/// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` read again with the flag table of
/// the installed LMCache (`render`): the node's variables were read before
/// the version was known, with 0.5.6's table, else 0.5.7rc2's.
///
/// Errors: what that version's server would refuse at start.
fn check_extra_args_for(extra: &extra_args::ExtraArgs, render: Rendering) -> Result<(), PlanError> {
    let table = match render.next_flags {
        true => crate::node::server_flags::next_server_flags(),
        false => server_flags(),
    };
    let args: Vec<&str> = extra.args().iter().map(String::as_str).collect();
    table
        .read(&args)
        .map(drop)
        .map_err(|e| PlanError::Config(ConfigError::ExtraArgs(e)))
}

/// What the node asks of the server that the LMCache `release` renders
/// differently: an API key file on a version without API keys, a
/// `--l2-prefetch-max-in-flight` in `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` that
/// the version ignores (`docs/configuration.md`, "LMCache versions").
fn version_flag_warnings(
    node: &NodeEnv,
    render: Rendering,
    release: Option<&LmcacheRelease>,
) -> Vec<String> {
    let version = release.map_or_else(|| "of unknown version".to_string(), |r| r.to_string());
    let mut warnings = Vec::new();
    if node.api_key_file.is_some() && !render.api_key_file {
        warnings.push(format!(
            "{} is set, but LMCache {version} has no API key (--api-key-file comes with 0.5.7): not passed; the server's HTTP port answers every local process",
            crate::node::env::API_KEY_FILE
        ));
    }
    let ignored = lmcache_versions::PREFETCH_MAX_IN_FLIGHT;
    if render.ignores_prefetch_max_in_flight && node.extra_args.sets(ignored) {
        warnings.push(format!(
            "EREBINE_AGENT_LMCACHE_EXTRA_ARGS: LMCache {version} ignores {ignored}; give --l2-prefetch-inflight-watermark (a fraction of L1, default 0.5) instead"
        ));
    }
    warnings
}

fn unbounded_tier_warnings(cascade: &Cascade, source: &Decision<()>) -> Vec<String> {
    if source.rule == "built-in" {
        return Vec::new();
    }
    cascade
        .tiers()
        .iter()
        .enumerate()
        .filter(|(_, tier)| tier.is_disk_tier())
        .filter(|(_, tier)| tier.max_capacity_bytes().is_none())
        .map(|(position, tier)| {
            format!(
                "L2 tier {position} ({} at {}) has no max_capacity_gb: LMCache never evicts from it and nothing else bounds it, so it grows until its volume is full; add \"max_capacity_gb\": <GiB> to its spec ({}), which also gives it a capacity guard",
                tier.adapter_type(),
                tier.base_path().unwrap_or("its base_path"),
                source.reason
            )
        })
        .collect()
}

/// A warning for a custom tier that sets `"use_odirect": true` where the
/// O_DIRECT test write did not succeed (`docs/sizing.md`, "O_DIRECT"):
/// LMCache would fail every store to it while `/status` says healthy. The
/// node does not rewrite the operator's spec.
fn odirect_tier_warning(tier: &TierOdirect) -> Option<String> {
    let what = match &tier.odirect {
        OdirectProbe::Succeeded => return None,
        OdirectProbe::Failed(why) => format!("an O_DIRECT test write there failed ({why}): every store LMCache makes to it will fail while /status says healthy"),
        OdirectProbe::NotWritable(why) => format!("no file can be created there ({why})"),
        OdirectProbe::VolumeFull(why) => format!("O_DIRECT could not be tested there: the volume is full ({why})"),
    };
    Some(format!(
        "L2 tier {} ({} at {}) sets \"use_odirect\": true, and {what}; set \"use_odirect\": false in its spec unless the filesystem takes O_DIRECT",
        tier.position,
        tier.adapter,
        tier.base_path.display()
    ))
}
