//! Plans, starts and watches the LMCache multiprocess server of an inference
//! node. This is the library the node agent links; the binaries
//! `lmcache-tier` (the operator's tool) and `erebine-lmcache` (the image's
//! drop-in for `lmcache`) are thin shells over it.
//!
//! Two steps, facts then rules (`docs/design.md`): [`Facts::measure`]
//! reads the host, the server executable and the cache directory's volume
//! once (one scan of the tier); [`plan()`], a pure function, takes engine
//! facts ([`EngineFacts`]), the node's environment as a map (the agent
//! passes it; the process environment is never read implicitly) and those
//! facts as the rules read them ([`HostFacts`]), and gives a [`Planned`]: either "nothing to launch" (the KV cache backend is not `lmcache`) or
//! a [`LaunchPlan`] with the server's argv and environment, the engine's
//! connector config, and every decision with its reason, serialisable to JSON
//! ([`LaunchPlan::to_json`], secrets redacted). [`run::launch::run`] runs a plan.
//! The agent starts a plan with [`run::launch::start`], which returns a
//! [`run::launch::LaunchHandle`]: the liveness events and a stop.
//! [`run::launch::run_with_events`] also delivers the liveness events of [`run::watch`]
//! (workers lost, unhealthy, unresponsive, exited with a hint; [`run::oom`]
//! tells an OOM kill from the kernel's own count); [`run::status`] is
//! the typed `/status` model; [`inspect`] builds what `lmcache-tier inspect`
//! prints.
//!
//! Every variable, its default and range are in
//! `docs/configuration.md`; what the log lines mean is in
//! `docs/operations.md`.
//!
//! ```
//! use lmcache_launcher::node::env::text_vars;
//! use lmcache_launcher::{plan, DiskFacts, EngineFacts, HostFacts, Planned};
//! use lmcache_sizing::volume::Filesystem;
//! use lmcache_sizing::{rules::{OdirectProbe, VolumeStats}, Decision, GIB};
//! # let dir = tempfile::tempdir()?;
//! # let erebine_lmcache = dir.path().join("erebine-lmcache");
//! # std::fs::write(&erebine_lmcache, "#!/bin/sh\n")?;
//! # std::fs::set_permissions(&erebine_lmcache, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
//!
//! let vars = text_vars([
//!     ("EREBINE_AGENT_KV_CACHE_BACKEND", "lmcache"),
//!     ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "16"),
//!     ("EREBINE_AGENT_LMCACHE_DISK_PATH", "/var/lib/inference/.cache/erebine/lmcache"),
//!     ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "150"),
//!     ("EREBINE_AGENT_LMCACHE_PATH", erebine_lmcache.to_str().unwrap()),
//! ]);
//! let facts = EngineFacts {
//!     model: "meta-llama/Llama-3.1-8B-Instruct".into(),
//!     tensor_parallel_size: 4,
//!     pipeline_parallel_size: 1,
//!     data_parallel_size: 1,
//!     kv_cache_dtype: "auto".into(),
//!     block_size: 16,
//!     max_num_batched_tokens: Some(2048),
//!     hybrid_attention: false,
//!     ..EngineFacts::default()
//! };
//! // A real node measures them (Facts::measure); fixed figures make the
//! // plan the same on every machine.
//! let host = HostFacts {
//!     memory: Decision::new(256 * GIB, "given", "example"),
//!     physical_cores: 32,
//!     executable: None,
//!     disk: Some(DiskFacts {
//!         measured_at: "/var/lib/inference/.cache/erebine/lmcache".into(),
//!         volume: VolumeStats { total_bytes: 1024 * GIB, free_bytes: 900 * GIB, block_size: 4096 },
//!         filesystem: Filesystem { fs_type: "xfs".into(), read_only: false, source: None, own_volume: false },
//!         reclaimable_bytes: 0,
//!         odirect: OdirectProbe::Succeeded,
//!         read_probe: None,
//!         tier: Default::default(),
//!     }),
//!     gpu: None,
//!     engine_gpu: None,
//!     odirect_tiers: Vec::new(),
//!     lmcache_version: Some("0.5.6".into()),
//!     node: None,
//! };
//! let Planned::Server(launch) = plan(&facts, &vars, &host)? else {
//!     unreachable!("the backend is lmcache");
//! };
//! assert_eq!(launch.args[..3], ["server", "--host", "127.0.0.1"]);
//! assert!(launch.args.windows(2).any(|w| w == ["--max-gpu-workers", "4"]));
//! assert_eq!(
//!     launch.kv_transfer_config(),
//!     r#"{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both","kv_connector_extra_config":{"lmcache.mp.host":"tcp://127.0.0.1","lmcache.mp.port":6555}}"#
//! );
//! assert_eq!(launch.decisions.disk.as_ref().unwrap().capacity.value, 150 * GIB);
//! println!("{}", launch.log_line());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod cli;
pub mod exit;
pub mod inspect;
pub mod metrics;
pub mod node;
pub mod output;
pub mod plan;
pub mod process;
pub mod run;

// The types a node agent starts from, at the crate's root; everything
// else by its wing's path (`lmcache_launcher::run::launch`, ...).
pub use node::env::{ConfigError, KvCacheBackend, NodeEnv, Vars};
pub use output::DEFAULT_LOG_FILTER;
pub use plan::facts::{DiskAccess, Facts};
pub use plan::inputs::{DiskFacts, EngineFacts, HostFacts, PlanError};
pub use plan::launch_plan::LaunchPlan;

use node::env;
use plan::{facts, launch_plan};

/// What a node runs beside its engine.
#[derive(Debug, Clone)]
pub enum Planned {
    /// The backend is `lmcache`: the LMCache server to start.
    Server(Box<LaunchPlan>),
    /// The backend is `native` or `none`: no cache server.
    NothingToLaunch(NothingToLaunch),
}

/// Why a node runs no LMCache server.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NothingToLaunch {
    /// The node's `EREBINE_AGENT_KV_CACHE_BACKEND` (or `--kv-cache-backend`).
    pub backend: KvCacheBackend,
    /// One sentence for the log.
    pub reason: String,
}

impl Planned {
    /// The server plan, if there is one.
    pub fn server(&self) -> Option<&LaunchPlan> {
        match self {
            Planned::Server(plan) => Some(plan),
            Planned::NothingToLaunch(_) => None,
        }
    }

    /// As JSON: [`LaunchPlan::to_json`] plus `"backend": "lmcache"`, or
    /// `{"backend": "native"|"none", "nothing_to_launch": <reason>}`.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Planned::Server(plan) => {
                let mut json = plan.to_json();
                json["backend"] = KvCacheBackend::Lmcache.to_string().into();
                json
            }
            Planned::NothingToLaunch(n) => serde_json::json!({
                "backend": n.backend,
                "nothing_to_launch": n.reason,
            }),
        }
    }
}

/// Plans what the node runs: reads every variable from `vars` (name ->
/// value; see [`NodeEnv::from_vars`]) unless `host` carries them as
/// [`Facts::measure`] read them from the same map ([`HostFacts::node`]),
/// then, for the `lmcache` backend,
/// plans the launch with [`launch_plan::plan_launch`] from `host`, the
/// facts [`Facts::measure`] measured. It creates and deletes nothing; the
/// one thing it may look up is the executable, when `host` does not name it
/// (`EREBINE_AGENT_LMCACHE_PATH`, else `erebine-lmcache` beside the running
/// program, else on `PATH`).
///
/// Every variable is checked even when the backend is not `lmcache`, so a
/// typo is found before the node is switched over.
///
/// ```
/// use lmcache_launcher::node::env::text_vars;
/// use lmcache_launcher::{plan, DiskAccess, EngineFacts, Facts, HostFacts, KvCacheBackend, Planned};
///
/// let facts = EngineFacts {
///     model: "m".into(),
///     tensor_parallel_size: 1,
///     pipeline_parallel_size: 1,
///     data_parallel_size: 1,
///     kv_cache_dtype: "auto".into(),
///     block_size: 16,
///     max_num_batched_tokens: Some(2048),
///     hybrid_attention: false,
///     ..EngineFacts::default()
/// };
/// // No EREBINE_AGENT_KV_CACHE_BACKEND: the node's default, `native` (`docs/configuration.md`).
/// let home = text_vars([("HOME", "/home/node")]);
/// let measured = Facts::measure(&facts, &home, DiskAccess::Inspect)?;
/// let planned = plan(&facts, &home, &HostFacts::from(&measured))?;
/// let Planned::NothingToLaunch(why) = planned else { unreachable!() };
/// assert_eq!(why.backend, KvCacheBackend::Native);
///
/// let bad = text_vars([("HOME", "/home/node"), ("EREBINE_AGENT_KV_CACHE_BACKEND", "LMCache2")]);
/// let err = Facts::measure(&facts, &bad, DiskAccess::Inspect).unwrap_err();
/// assert!(err.to_string().contains("EREBINE_AGENT_KV_CACHE_BACKEND"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Errors: [`PlanError::Config`] for a bad variable (it names the variable,
/// quotes the value and says what to write), [`PlanError::Executable`] when
/// the server executable is missing, and the other [`PlanError`]s of
/// [`launch_plan::plan_launch`].
pub fn plan(facts: &EngineFacts, vars: &Vars, host: &HostFacts) -> Result<Planned, PlanError> {
    let parsed;
    let node = match &host.node {
        Some(node) => node,
        None => {
            parsed = NodeEnv::from_vars(vars)?;
            &parsed
        }
    };
    let reason = match node.kv_cache_backend {
        KvCacheBackend::Lmcache => {
            let executable = match &host.executable {
                Some(found) => found.clone(),
                None => facts::server_executable(node, vars)?,
            };
            let mut launch = launch_plan::plan_launch(facts, node, host, executable)?;
            launch.base_env = vars.clone();
            return Ok(Planned::Server(Box::new(launch)));
        }
        KvCacheBackend::Native => "vLLM's built-in CPU offload holds the KV cache",
        KvCacheBackend::None => "the node runs without a KV cache backend",
    };
    let setting = match vars.contains_key(std::ffi::OsStr::new(env::KV_CACHE_BACKEND)) {
        true => format!("{}={}", env::KV_CACHE_BACKEND, node.kv_cache_backend),
        false => format!(
            "{} is unset (default {})",
            env::KV_CACHE_BACKEND,
            node.kv_cache_backend
        ),
    };
    Ok(Planned::NothingToLaunch(NothingToLaunch {
        backend: node.kv_cache_backend,
        reason: format!(
            "{setting}: {reason}; there is no LMCache server to launch (set it to lmcache for one)"
        ),
    }))
}
