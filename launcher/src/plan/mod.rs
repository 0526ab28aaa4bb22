//! The plan, facts first: what a launch measures once (the host, the
//! volume, the tier's scan, the executables; [`facts`]), the inputs the
//! rules read ([`inputs`]), and the pure plan made from them
//! ([`launch_plan`], with the housekeeping it runs). `docs/design.md`, "One
//! launch".

pub mod api_key;
pub mod bucket_warnings;
mod command_line;
mod disk_tier;
pub mod facts;
pub mod gpu;
pub mod housekeep;
pub mod inputs;
mod l1;
pub mod launch_plan;
pub mod lmcache_versions;
pub mod locate;
pub mod raw_block;
pub mod server_python;
pub mod verdict;
pub mod weights;

use crate::node::env::{self, KvCacheBackend, NodeEnv, Vars};
use inputs::{EngineFacts, HostFacts, PlanError};
use launch_plan::LaunchPlan;

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
/// [`Facts::measure`](facts::Facts::measure) read them from the same map ([`HostFacts::node`]),
/// then, for the `lmcache` backend,
/// plans the launch with [`launch_plan::plan_launch`] from `host`, the
/// facts [`Facts::measure`](facts::Facts::measure) measured. It creates and deletes nothing; the
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
