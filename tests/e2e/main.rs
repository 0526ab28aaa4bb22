//! The end-to-end suite, one test binary with a module per concern: each
//! runs the binaries Cargo built for it (`lmcache-tier`, `erebine-lmcache`)
//! against the real LMCache 0.5.6 server, real S3 servers and a real
//! Prometheus, through the harness of `lmcache-tier-e2e`.
//!
//! Every test starts with `require_lmcache!()`: without the LMCache
//! environment `scripts/setup-lmcache.sh` installs, it prints `skipped:`
//! and why, and passes; `scripts/test.sh` installs it and runs them all.

mod bucket_bound;
mod cache_identity;
mod capacity_guard;
mod frozen_server;
mod gateway_faults;
mod gpu_extensions;
mod housekeeping;
mod identity;
mod image;
mod inspect_watch;
mod kill_loop;
mod launch;
mod library;
mod metrics;
mod next_lmcache;
mod oom_kill;
mod prometheus;
mod redis;
mod restart_workers;
mod s3_gateway;
mod s3_keys;
mod swift;
mod unix;
mod vllm_connector;
mod volume_faults;
mod watch;
