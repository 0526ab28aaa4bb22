//! The end-to-end suite, one test binary with a module per concern: each
//! runs the binaries Cargo built for it (`lmcache-tier`, `erebine-lmcache`)
//! against the real LMCache 0.5.6 server, real S3 servers and a real
//! Prometheus, through the harness of `lmcache-tier-e2e`.
//!
//! Every test starts with `require_lmcache!()`: without the LMCache
//! environment `scripts/setup-lmcache.sh` installs, it prints `skipped:`
//! and why, and passes; `scripts/test.sh` installs it and runs them all.

/// A fleet of launches shares one bucket within its `max_capacity_gb`.
mod bucket_bound;
/// Each cache identity's objects kept apart on tiers that outlive a server.
mod cache_identity;
/// The capacity guard holds a disk tier across a restart under the CPU bench.
mod capacity_guard;
/// A frozen server is stopped and restarted (`--unresponsive-timeout`).
mod frozen_server;
/// The S3 gateway in front of a failing object store, fault by fault.
mod gateway_faults;
/// LMCache's compiled extensions on a GPU node, tried with stand-ins.
mod gpu_extensions;
/// Launch housekeeping keeps the cache across restarts of one identity.
mod housekeeping;
/// The launch identity against the names LMCache's own code gives objects.
mod identity;
/// The node's image under podman, run as the node runs it.
mod image;
/// `inspect --watch` on a real terminal (tmux).
mod inspect_watch;
/// `kill -9` during deletions never leaves a tier broken.
mod kill_loop;
/// `launch` runs the real server on the built-in disk tier.
mod launch;
/// The library as the node agent uses it: plan, start, events, stop.
mod library;
/// The metrics endpoint during a CPU bench: promtool and OpenMetrics clean.
mod metrics;
/// The same launches against LMCache 0.5.7rc2.
mod next_lmcache;
/// A real OOM kill in a memory cgroup is counted as one.
mod oom_kill;
/// A real Prometheus scrapes two launches; the alerting rules load.
mod prometheus;
/// Debian's `redis-server` as a `resp` tier: stores, loads, checks, warnings.
mod redis;
/// A restart that loses the engine's workers is told.
mod restart_workers;
/// `s3_bucket` tiers through the gateway to moto; real keys never reach LMCache.
mod s3_gateway;
/// Model names with path syntax through the gateway, on every store.
mod s3_keys;
/// OpenStack Swift as the store of `s3_bucket` tiers.
mod swift;
/// The launcher as a Unix process: signals, closed outputs, locks.
mod unix;
/// The engine's `--kv-transfer-config` parsed by each vLLM's own code.
mod vllm_connector;
/// A volume something else fills under the CPU bench, and its recovery.
mod volume_faults;
/// `launch` watches the server: workers detached, lost, reaped.
mod watch;
