//! Plans, starts and watches the LMCache multiprocess server of an inference
//! node. This is the library the node agent links; the binaries
//! `lmcache-tier` (the operator's tool) and `erebine-lmcache` (the image's
//! drop-in for `lmcache`) are thin shells over it.
//!
//! The flow of one launch (see `docs/design.md`):
//! [`env::NodeEnv`] + [`plan::EngineFacts`] + [`plan::HostFacts`] ->
//! [`plan::plan_launch`] -> [`plan::LaunchPlan`] (argv, env, every decision
//! with its reason) -> [`launch::run`].
//!
//! ```no_run
//! use std::collections::BTreeMap;
//! use lmcache_launcher::{env::NodeEnv, plan::{self, DiskAccess, EngineFacts, HostFacts}};
//!
//! let vars: BTreeMap<String, String> = std::env::vars().collect();
//! let node = NodeEnv::from_vars(&vars)?;
//! let facts = EngineFacts {
//!     model: "meta-llama/Llama-3.1-8B-Instruct".into(),
//!     tensor_parallel_size: 1,
//!     pipeline_parallel_size: 1,
//!     data_parallel_size: 1,
//!     kv_cache_dtype: "auto".into(),
//!     block_size: 16,
//!     max_num_batched_tokens: 2048,
//! };
//! let plan = plan::plan_launch(&facts, &node, &HostFacts::probe()?, "/usr/local/bin/erebine-lmcache".into(), DiskAccess::Inspect)?;
//! println!("{}", plan.log_line());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod env;
pub mod guards;
pub mod housekeep;
pub mod launch;
pub mod locate;
pub mod plan;
pub mod status;
pub mod supervise;
