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
//! [`run::launch::run_with_events`] also delivers the liveness events
//! ([`status::events`], sent by [`run::watch`]: workers lost, unhealthy,
//! unresponsive, exited with a hint; [`status::oom`]
//! tells an OOM kill from the kernel's own count); [`status`] is
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
//!     raw_block_devices: Vec::new(),
//!     lmcache_version: Some("0.5.6".into()),
//!     weights: None,
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
pub mod status;

// The types a node agent starts from, at the crate's root; everything
// else by its wing's path (`lmcache_launcher::run::launch`, ...).
pub use node::env::{ConfigError, KvCacheBackend, NodeEnv, Vars};
pub use output::DEFAULT_LOG_FILTER;
pub use plan::facts::{DiskAccess, Facts};
pub use plan::inputs::{DiskFacts, EngineFacts, HostFacts, PlanError};
pub use plan::launch_plan::LaunchPlan;
pub use plan::{plan, NothingToLaunch, Planned};
