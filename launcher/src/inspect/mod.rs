//! `lmcache-tier inspect`: what a node's tiers hold and do, from the server's
//! `/status` and from the disk tier itself, so it still says something when
//! the server is down.
//!
//! The JSON form ([`Inspection`], field names documented in
//! `docs/inspect.md`) is stable: fields are added, never renamed or removed.
//! Nothing secret is printed: adapter entries are read through the typed
//! model, which keeps only named fields ([`crate::status::L2AdapterStatus`]),
//! and endpoints lose any `user:password@` and query string. The text form
//! ([`Inspection::to_text`]) is in `text`; `inspect --watch` redraws it
//! with usage bars and change marks ([`live`]).

pub mod launch_metrics;
pub mod live;
mod text;
mod watch_view;

use lmcache_capacity_guard::status::{read_status, GuardStatus};

use crate::plan::gpu::GpuFacts;
use crate::plan::locate::LmcacheInstall;
use lmcache_s3_gateway::state::{self as gateway_state, GatewayState};
use lmcache_tier_spec::redact_endpoint;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use lmcache_housekeeping::{
    read_manifest, scan, Access, InventoryTotals, LaunchIdentity, ManifestRead, TierDir,
};
use serde::Serialize;

use crate::status::{Poll, ServerStatus, StoreController, WorkerLiveness};

/// Why `inspect` does not end with 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InspectError {
    /// The URL to poll is not one ([`check_url`]).
    #[error("--url {} is not an http:// URL of a /status endpoint: give e.g. http://127.0.0.1:8090/status", lmcache_tier_spec::shown_value(url))]
    BadUrl {
        /// The URL as given.
        url: String,
    },
    /// Nothing answered the poll.
    #[error("{url}: the server does not answer; is the node's lmcache-tier launch running, on this HTTP port?")]
    NoAnswer {
        /// The polled URL, redacted.
        url: String,
    },
    /// The server answered, but not as a healthy LMCache server.
    #[error("{url}: the server answers but is not healthy")]
    Unhealthy {
        /// The polled URL, redacted.
        url: String,
    },
    /// `--watch` was asked for with a stdout that is not a terminal, which
    /// it cannot redraw ([`live::check_terminal`]).
    #[error("--watch redraws the view in place on a terminal, and stdout is not a terminal: run lmcache-tier inspect without --watch (add --json for scripts)")]
    NotATerminal,
    /// The server's API key cannot be read ([`crate::plan::api_key`]).
    #[error(transparent)]
    ApiKey(#[from] crate::plan::api_key::ApiKeyError),
}

/// Checks that `url` can be polled: an `http://` URL with a host.
///
/// # Errors
/// [`InspectError::BadUrl`].
pub fn check_url(url: &str) -> Result<(), InspectError> {
    match reqwest::Url::parse(url) {
        Ok(u) if u.scheme() == "http" && u.host().is_some() => Ok(()),
        _ => Err(InspectError::BadUrl {
            url: url.to_string(),
        }),
    }
}

/// Everything `inspect` reports: one JSON object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inspection {
    /// The polled `/status` URL.
    pub url: String,
    /// What the poll saw.
    pub server: ServerSummary,
    /// L2 tiers in cascade order (empty when the server is unreachable).
    pub tiers: Vec<TierRow>,
    /// The L1 (CPU memory) tier, when reported.
    pub l1: Option<L1Row>,
    /// The store controller (either layout), when reported.
    pub store_controller: Option<StoreController>,
    /// `worker_liveness` as reported.
    pub worker_liveness: Option<WorkerLiveness>,
    /// Each local disk tier directory, read from disk.
    pub disk: Vec<DiskRow>,
    /// The stock `lmcache` a launch on this node runs, and its version
    /// (set by the caller: [`crate::plan::locate::LmcacheInstall`]); `None` when
    /// it cannot be found.
    pub lmcache: Option<LmcacheInstall>,
    /// On a node with a GPU, whether that LMCache's compiled extensions
    /// load ([`crate::plan::gpu::measure`], set by the caller); `None` on a node
    /// without one.
    pub gpu: Option<GpuFacts>,
    /// The launch's own figures from its metrics endpoint
    /// ([`Inspection::read_launch`]); `None` until read.
    pub launch: Option<launch_metrics::LaunchMetrics>,
}

/// The server's state in one word, for scripts: the `state` field of
/// `inspect --json` (`docs/inspect.md`), the same split as exit statuses 0,
/// 9 and 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerState {
    /// `/status` answered 200 and nothing reports `is_healthy: false`.
    Up,
    /// It answered HTTP, but not as a healthy server (exit 9).
    Unhealthy,
    /// No HTTP answer at all (exit 8).
    Down,
}

/// The server as one poll saw it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerSummary {
    /// Up, unhealthy or down, from [`ServerSummary::reachable`] and
    /// [`ServerSummary::healthy`].
    pub state: ServerState,
    /// Whether it answered HTTP at all.
    pub reachable: bool,
    /// Whether it answered 200 with a body in which nothing reports
    /// `is_healthy: false`.
    pub healthy: bool,
    /// The answer: `HTTP 200`, `HTTP 503`, `no answer (...)`, ...
    pub answer: String,
    /// Parts reporting `is_healthy: false` (`server`, `l2_adapters[1] (...)`).
    pub unhealthy_parts: Vec<String>,
    /// `engine_type`.
    pub engine_type: Option<String>,
    /// `chunk_size` in tokens.
    pub chunk_size: Option<u64>,
    /// `hash_algorithm`.
    pub hash_algorithm: Option<String>,
}

/// One L2 tier.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierRow {
    /// Position in the cascade, 0 first.
    pub position: usize,
    /// Adapter type as LMCache names it (`FSNativeL2Adapter`, ...).
    #[serde(rename = "type")]
    pub adapter_type: Option<String>,
    /// `base_path` of a filesystem tier, the device of a `raw_block` tier,
    /// or the redacted endpoint of S3.
    pub location: Option<String>,
    /// The tier's `is_healthy`.
    pub healthy: Option<bool>,
    /// I/O worker threads (fs_native).
    pub workers: Option<u64>,
    /// Whether it uses O_DIRECT.
    pub use_odirect: Option<bool>,
    /// Capacity in bytes: LMCache's eviction controller, else the S3 adapter's
    /// own, else the capacity guard's (a tier LMCache does not evict itself).
    pub capacity_bytes: Option<u64>,
    /// Bytes the tier really uses: for a filesystem tier whose directory
    /// was scanned, the allocated bytes of its objects on disk now
    /// (`disk[].usage`); otherwise LMCache's count. [`TierRow::used_source`]
    /// says which.
    pub used_bytes: Option<u64>,
    /// Where [`TierRow::used_bytes`] comes from: `disk` (a scan now),
    /// `bucket` (the gateway's listing of an S3 tier's prefix, with the
    /// node's requests since) or `lmcache` (LMCache's count); `None` when
    /// none is known.
    pub used_source: Option<&'static str>,
    /// LMCache's own count of the bytes used, since its start (eviction
    /// controller, else the S3 adapter's `current_size_bytes`). `fs_native`
    /// counts from 0 at each start, so after a restart it is below what is
    /// on disk (`docs/inspect.md`).
    pub lmcache_used_bytes: Option<u64>,
    /// Eviction policy, when LMCache evicts the tier.
    pub eviction_policy: Option<String>,
    /// The state of the launcher's S3 gateway behind this tier (an
    /// `S3L2Adapter` whose endpoint is on 127.0.0.1 and answers
    /// [`gateway_state::STATE_PATH`]); `None` for every other tier, and
    /// until [`Inspection::read_gateways`] ran.
    pub gateway: Option<GatewayState>,
    /// Why nothing answered on this tier's loopback endpoint (refused,
    /// silent): its gateway, or whatever should listen there, is down and
    /// LMCache's writes to the tier fail. `None` when something answered,
    /// and for every other tier.
    pub endpoint_down: Option<String>,
}

impl TierRow {
    /// The tier with its true usage: the objects on disk for a filesystem
    /// tier whose directory is among `disk` and was scanned, else LMCache's
    /// count. A tier LMCache does not evict itself takes its capacity from
    /// its capacity guard's state, when one ran there.
    fn with_usage(self, disk: &[DiskRow]) -> TierRow {
        let row = self
            .location
            .as_deref()
            .map(Path::new)
            .filter(|location| self.is_local() && location.is_absolute())
            .and_then(|location| disk.iter().find(|d| d.path == location));
        let (used_bytes, used_source) = match (row.and_then(|d| d.usage), self.lmcache_used_bytes) {
            (Some(usage), _) => (Some(usage.objects.bytes), Some("disk")),
            (None, Some(count)) => (Some(count), Some("lmcache")),
            (None, None) => (None, None),
        };
        let guarded = row.and_then(|d| d.guard.as_ref()).map(|g| g.capacity_bytes);
        TierRow {
            capacity_bytes: self.capacity_bytes.or(guarded),
            used_bytes,
            used_source,
            ..self
        }
    }

    /// For a tier whose gateway keeps a bucket bound: the bucket's usage
    /// as the gateway lists it, the true one (`used_source` `bucket`);
    /// LMCache's count stays beside it.
    fn use_bucket_usage(&mut self) {
        let bound = self.gateway.as_ref().and_then(|g| g.bucket_bound.as_ref());
        if let Some(bound) = bound {
            self.used_bytes = Some(bound.usage_bytes);
            self.used_source = Some("bucket");
        }
    }

    /// Whether LMCache keeps this tier in a local directory
    /// (`FSNativeL2Adapter`, `FSL2Adapter`).
    fn is_local(&self) -> bool {
        matches!(
            self.adapter_type.as_deref(),
            Some("FSNativeL2Adapter" | "FSL2Adapter")
        )
    }

    /// The loopback address an `S3L2Adapter` talks to, when it is
    /// `127.0.0.1:<port>` (where the launcher's gateways listen).
    fn loopback_endpoint(&self) -> Option<SocketAddr> {
        if self.adapter_type.as_deref() != Some("S3L2Adapter") {
            return None;
        }
        let location = self.location.as_deref()?;
        let addr: SocketAddr = location
            .strip_prefix("http://")
            .unwrap_or(location)
            .parse()
            .ok()?;
        (addr.ip() == Ipv4Addr::LOCALHOST).then_some(addr)
    }
}

/// The L1 tier.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct L1Row {
    /// Bytes used.
    pub used_bytes: Option<u64>,
    /// Bytes allocated.
    pub total_bytes: Option<u64>,
    /// Chunks held.
    pub objects: Option<u64>,
}

/// A disk tier directory as read from disk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiskRow {
    /// The directory.
    pub path: PathBuf,
    /// `found`, `missing` or `unusable` (then `problem` says why).
    pub manifest: &'static str,
    /// The launch identity recorded in `.lmcache-tier-identity.json`.
    pub identity: Option<LaunchIdentity>,
    /// When the manifest was written (RFC 3339 UTC).
    pub written_at: Option<String>,
    /// Why the manifest, the directory or the guard's state could not be
    /// read: every problem found, `; `-separated.
    pub problem: Option<String>,
    /// What a scan found: objects, stale temps, foreign entries, with
    /// allocated bytes.
    pub usage: Option<InventoryTotals>,
    /// The capacity guard's last state (`.lmcache-tier-guard.json`, written
    /// by `erebine-lmcache server` for a tier with `max_capacity_gb`; see
    /// `docs/capacity-guard.md`); `None` when no guard ever ran there.
    pub guard: Option<GuardStatus>,
    /// Whether the process that wrote [`DiskRow::guard`] still runs: a
    /// state left by a stopped guard is its last, not its current one.
    pub guard_running: Option<bool>,
    /// Seconds since [`DiskRow::guard`] was written.
    pub guard_state_age_seconds: Option<u64>,
}

impl Inspection {
    /// Builds the report from one poll of `url` and the directories in
    /// `disk_dirs` (duplicates and the base paths `/status` names are merged).
    /// `declares_capacity`: see [`ServerStatus::tiers`].
    pub fn build(
        url: &str,
        poll: &Poll,
        disk_dirs: &[PathBuf],
        declares_capacity: Option<&[bool]>,
    ) -> Inspection {
        let status = match poll {
            Poll::Up(s) => Some(s.as_ref()),
            _ => None,
        };
        let unhealthy_parts = status
            .map(ServerStatus::unhealthy_parts)
            .unwrap_or_default();
        let reachable = !matches!(poll, Poll::NoAnswer(_));
        let healthy = status.is_some() && unhealthy_parts.is_empty();
        let server = ServerSummary {
            state: match (reachable, healthy) {
                (_, true) => ServerState::Up,
                (true, false) => ServerState::Unhealthy,
                (false, false) => ServerState::Down,
            },
            reachable,
            healthy,
            answer: poll.describe(),
            unhealthy_parts,
            engine_type: status.and_then(|s| s.engine_type.clone()),
            chunk_size: status.and_then(|s| s.chunk_size),
            hash_algorithm: status.and_then(|s| s.hash_algorithm.clone()),
        };
        let tiers: Vec<TierRow> = status
            .map(|s| s.tiers(declares_capacity))
            .unwrap_or_default()
            .into_iter()
            .map(|t| {
                let a = t.adapter;
                let e = t.eviction;
                let core = a.core.unwrap_or_default();
                TierRow {
                    position: t.position,
                    adapter_type: a.adapter_type,
                    location: a
                        .base_path
                        .as_deref()
                        .or(a.endpoint.as_deref())
                        .or(core.device_path.as_deref())
                        .map(redact_endpoint),
                    healthy: a.is_healthy,
                    workers: a.num_workers,
                    use_odirect: a.use_odirect,
                    capacity_bytes: e
                        .as_ref()
                        .and_then(|e| e.total_capacity_bytes)
                        .or(a.max_capacity_bytes)
                        .or(core.usable_capacity_bytes),
                    used_bytes: None,
                    used_source: None,
                    lmcache_used_bytes: e
                        .as_ref()
                        .and_then(|e| e.total_bytes_used)
                        .or(a.current_size_bytes)
                        .or(core.used_bytes()),
                    eviction_policy: e.and_then(|e| e.eviction_policy),
                    gateway: None,
                    endpoint_down: None,
                }
            })
            .collect();
        let mut dirs: Vec<PathBuf> = disk_dirs.to_vec();
        for tier in &tiers {
            // A relative base path is the server's, relative to its working
            // directory, not to this process's: it is not read.
            let path = tier.location.as_deref().map(Path::new);
            if let (true, Some(path)) = (tier.is_local(), path.filter(|p| p.is_absolute())) {
                dirs.push(path.to_path_buf());
            }
        }
        let mut seen = Vec::new();
        dirs.retain(|d| {
            let fresh = !seen.contains(d);
            seen.push(d.clone());
            fresh
        });
        let disk: Vec<DiskRow> = dirs.iter().map(|d| read_disk(d)).collect();
        Inspection {
            url: lmcache_tier_spec::redact_endpoint(url),
            server,
            tiers: tiers.into_iter().map(|t| t.with_usage(&disk)).collect(),
            l1: status.and_then(ServerStatus::l1).map(|l1| L1Row {
                used_bytes: l1.memory_used_bytes,
                total_bytes: l1.memory_total_bytes,
                objects: l1.total_object_count,
            }),
            store_controller: status.and_then(|s| s.store_controller().cloned()),
            worker_liveness: status.and_then(|s| s.worker_liveness.clone()),
            disk,
            lmcache: None,
            gpu: None,
            launch: None,
        }
    }

    /// Reads the launch's figures from its metrics endpoint at `address`
    /// (`None`: the endpoint is off) within `timeout`.
    pub async fn read_launch(&mut self, address: Option<SocketAddr>, timeout: Duration) {
        self.launch = Some(match address {
            None => launch_metrics::LaunchMetrics::Off,
            Some(address) => {
                launch_metrics::read(&launch_metrics::metrics_url(address), timeout).await
            }
        });
    }

    /// Asks every `S3L2Adapter` tier whose endpoint is `127.0.0.1:<port>`
    /// for the gateway state ([`gateway_state::fetch`], waiting at most
    /// `timeout` each) and keeps it in [`TierRow::gateway`]; an endpoint that
    /// answers as something else leaves the tier as it was, one where
    /// nothing answers is noted in [`TierRow::endpoint_down`].
    pub async fn read_gateways(&mut self, timeout: Duration) {
        for tier in &mut self.tiers {
            if let Some(addr) = tier.loopback_endpoint() {
                match gateway_state::fetch(addr, timeout).await {
                    Ok(state) => tier.gateway = state,
                    Err(cause) => tier.endpoint_down = Some(cause.to_string()),
                }
                tier.use_bucket_usage();
            }
        }
    }

    /// What the report says of the server: `Ok` when it is healthy.
    ///
    /// # Errors
    /// [`InspectError::NoAnswer`] when it is unreachable,
    /// [`InspectError::Unhealthy`] when it answers but is not healthy
    /// (non-200, unusable body, or a part reporting `is_healthy: false`).
    pub fn verdict(&self) -> Result<(), InspectError> {
        let url = self.url.clone();
        match (&self.server.reachable, &self.server.healthy) {
            (false, _) => Err(InspectError::NoAnswer { url }),
            (true, false) => Err(InspectError::Unhealthy { url }),
            (true, true) => Ok(()),
        }
    }
}

fn read_disk(path: &Path) -> DiskRow {
    let mut disk = DiskRow {
        path: path.to_path_buf(),
        manifest: "missing",
        identity: None,
        written_at: None,
        problem: None,
        usage: None,
        guard: None,
        guard_running: None,
        guard_state_age_seconds: None,
    };
    let dir = match TierDir::open(path, Access::ReadOnly) {
        Ok(dir) => dir,
        Err(e) => {
            disk.manifest = "unusable";
            disk.problem = Some(e.to_string());
            return disk;
        }
    };
    match read_manifest(&dir) {
        ManifestRead::Missing => {}
        ManifestRead::Found(m) => {
            disk.manifest = "found";
            disk.identity = Some(m.identity);
            disk.written_at = Some(m.written_at);
        }
        ManifestRead::Unusable(w) => {
            disk.manifest = "unusable";
            disk.add_problem(w.to_string());
        }
    }
    match scan(&dir) {
        Ok(inventory) => disk.usage = Some(inventory.totals()),
        Err(e) => disk.add_problem(e.to_string()),
    }
    match read_status(&dir) {
        Ok(guard) => {
            disk.guard_running = guard
                .as_ref()
                .map(|g| guard_runs(g.pid, g.updated_unix_ms, &disk.path));
            disk.guard_state_age_seconds = guard.as_ref().map(|g| age_seconds(g.updated_unix_ms));
            disk.guard = guard;
        }
        Err(e) => disk.add_problem(e.to_string()),
    }
    disk
}

impl DiskRow {
    /// Adds `problem` to the ones already found, `; `-separated.
    fn add_problem(&mut self, problem: String) {
        self.problem = Some(match self.problem.take() {
            Some(earlier) => format!("{earlier}; {problem}"),
            None => problem,
        });
    }
}

/// Whether the guard that wrote its state at `updated_unix_ms` as process
/// `pid` still runs: that process exists, is not a zombie, started before
/// the state was written (a pid reused by a later process is not the
/// guard), and, where its descriptors can be read, holds the tier
/// directory `dir` open, as a guard does while it runs.
fn guard_runs(pid: u32, updated_unix_ms: u64, dir: &std::path::Path) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // pid (comm) state ppid ... starttime is field 22, the 20th after comm.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')').unwrap_or(0) + 2..)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let zombie = fields.first().is_none_or(|state| *state == "Z");
    let started_ms = fields
        .get(19)
        .and_then(|ticks| ticks.parse::<u64>().ok())
        .zip(boot_time_ms())
        .map(|(ticks, boot)| boot + ticks * 1000 / clock_ticks());
    let started_before = started_ms.is_none_or(|ms| ms <= updated_unix_ms + 1000);
    !zombie && started_before && holds_dir(pid, dir).unwrap_or(true)
}

/// The boot time in milliseconds since the Unix epoch (`btime` in
/// `/proc/stat`).
fn boot_time_ms() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let seconds: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(seconds * 1000)
}

/// Clock ticks per second, the unit of `starttime`.
fn clock_ticks() -> u64 {
    // SAFETY: sysconf only reads a constant.
    match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        ticks if ticks > 0 => ticks as u64,
        _ => 100,
    }
}

/// Whether process `pid` has the directory `dir` open; `None` when its
/// descriptors cannot be read (another user's process).
fn holds_dir(pid: u32, dir: &std::path::Path) -> Option<bool> {
    let dir = dir.canonicalize().ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(
        fds.flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|target| target == dir),
    )
}

/// Seconds from `unix_ms` to now (0 for a time in the future).
fn age_seconds(unix_ms: u64) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    now.saturating_sub(unix_ms) / 1000
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::fixture;
    use lmcache_tier_e2e::answering_store;

    fn up(name: &str) -> Poll {
        Poll::Up(Box::new(ServerStatus::parse(&fixture(name)).unwrap()))
    }

    #[test]
    fn a_running_node_reports_every_tier_l1_controller_and_workers() {
        let report = Inspection::build(
            "http://127.0.0.1:8090/status",
            &up("status-worker-attached.json"),
            &[],
            None,
        );
        assert_eq!(report.exit_code(), 0);
        assert_eq!(report.tiers.len(), 3);
        assert_eq!(report.tiers[0].capacity_bytes, Some(2 << 30));
        assert_eq!(report.tiers[0].lmcache_used_bytes, Some(402653184));
        // Its directory does not exist here: the usage is LMCache's count.
        assert_eq!(report.tiers[0].used_bytes, Some(402653184));
        assert_eq!(report.tiers[0].used_source, Some("lmcache"));
        assert_eq!(
            report.tiers[2].location.as_deref(),
            Some("kvcache.localtest:5055")
        );
        assert_eq!(report.tiers[2].capacity_bytes, Some(5 << 30));
        assert_eq!(
            report.worker_liveness.as_ref().unwrap().tracked_instances,
            Some(1)
        );
        // The fixture's two local base paths are read from disk (they do not
        // exist here, which is reported, not fatal).
        assert_eq!(report.disk.len(), 2);
        assert!(report.disk[0].problem.is_some());
        let text = report.to_text();
        for needle in [
            "FSNativeL2Adapter",
            "1 tracked",
            "2.00 GiB",
            "0.38 GiB of 1.00 GiB",
            "store controller",
        ] {
            assert!(text.contains(needle), "{needle}:\n{text}");
        }
        let json = serde_json::to_value(&report).unwrap();
        for key in [
            "url",
            "server",
            "tiers",
            "l1",
            "store_controller",
            "worker_liveness",
            "disk",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
        assert_eq!(json["tiers"][0]["type"], "FSNativeL2Adapter");
    }

    #[test]
    fn a_raw_block_tier_shows_its_device_capacity_and_usage() {
        // The recorded body with its first tier replaced by a
        // `RawBlockL2Adapter` entry in the shape of LMCache 0.5.6's
        // `report_status` (no real one: the server here has no Rust
        // raw-block extension, without which the tier does not start).
        let mut body: serde_json::Value =
            serde_json::from_slice(&fixture("status-worker-attached.json")).unwrap();
        body["storage_manager"]["l2_adapters"][0] = serde_json::json!({
            "is_healthy": true, "type": "RawBlockL2Adapter", "fdp_enabled": false,
            "core": {"is_healthy": true, "type": "RawBlockCore", "device_path": "/dev/nvme1n1",
                     "slot_bytes": 4194304, "usable_capacity_bytes": 1073741824,
                     "indexed_key_count": 3, "worker_error": null}
        });
        let status = ServerStatus::parse(body.to_string().as_bytes()).unwrap();
        let report = Inspection::build(
            "http://127.0.0.1:8090/status",
            &Poll::Up(Box::new(status)),
            &[],
            Some(&[false, false, false]),
        );
        let tier = &report.tiers[0];
        assert_eq!(tier.location.as_deref(), Some("/dev/nvme1n1"));
        assert_eq!(tier.capacity_bytes, Some(1 << 30));
        assert_eq!(tier.lmcache_used_bytes, Some(3 * 4194304));
        assert_eq!(tier.used_source, Some("lmcache"));
        // A device is never read as a disk tier's directory.
        assert!(report
            .disk
            .iter()
            .all(|d| d.path != Path::new("/dev/nvme1n1")));
        let text = report.to_text();
        assert!(
            text.contains("RawBlockL2Adapter") && text.contains("/dev/nvme1n1"),
            "{text}"
        );
    }

    #[test]
    fn a_server_that_is_down_still_shows_the_disk_tier() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = TierDir::open(tmp.path(), Access::ReadWrite).unwrap();
        let identity = LaunchIdentity {
            model: "test-model".into(),
            tensor_parallel_size: 1,
            pipeline_parallel_size: 1,
            kv_cache_dtype: "auto".into(),
            block_size: 16,
            chunk_size: 256,
            decode_context_parallel_size: 1,
            cp_kv_cache_interleave_size: 1,
            mla_only: false,
            weights: None,
            engine_settings: Default::default(),
        };
        lmcache_housekeeping::write_manifest(&dir, &identity).unwrap();
        std::fs::write(
            tmp.path()
                .join(format!("test-model@0x01000100@0@{}.data", "ab".repeat(32))),
            vec![1u8; 8192],
        )
        .unwrap();
        let report = unreachable_with(tmp.path());
        assert_eq!(report.exit_code(), 8);
        assert!(report.tiers.is_empty());
        let disk = &report.disk[0];
        assert_eq!(disk.manifest, "found");
        assert_eq!(disk.identity.as_ref(), Some(&identity));
        assert_eq!(disk.usage.unwrap().objects.count, 1);
        let text = report.to_text();
        assert!(
            text.contains("UNREACHABLE") && text.contains("model test-model"),
            "{text}"
        );
    }

    #[test]
    fn after_a_restart_the_tier_shows_what_is_on_disk_and_lmcaches_count_apart() {
        let tmp = tempfile::tempdir().unwrap();
        for i in 0..3u8 {
            let name = format!(
                "test-model@0x01000100@0@{}.data",
                format!("{i:02x}").repeat(32)
            );
            std::fs::write(tmp.path().join(name), vec![i; 1 << 20]).unwrap();
        }
        let body = serde_json::json!({"is_healthy": true, "engine_type": "MPCacheServer",
            "storage_manager": {"is_healthy": true,
                "l2_adapters": [
                    {"type": "FSNativeL2Adapter", "is_healthy": true, "base_path": tmp.path()},
                    {"type": "S3L2Adapter", "is_healthy": true, "endpoint": "http://127.0.0.1:9",
                     "max_capacity_bytes": 5u64 << 30, "current_size_bytes": 4096}],
                "l2_eviction_controller": {"adapters": [
                    {"total_capacity_bytes": 2u64 << 30, "total_bytes_used": 0},
                    {"total_capacity_bytes": 5u64 << 30, "total_bytes_used": 4096}]}}});
        let poll = Poll::Up(Box::new(ServerStatus::from_value(body).unwrap()));
        let report = Inspection::build("http://127.0.0.1:8090/status", &poll, &[], None);
        let on_disk = report.disk[0].usage.unwrap().objects.bytes;
        assert!(on_disk >= 3 << 20, "{on_disk}");
        let native = &report.tiers[0];
        assert_eq!(
            (
                native.used_bytes,
                native.used_source,
                native.lmcache_used_bytes
            ),
            (Some(on_disk), Some("disk"), Some(0))
        );
        let s3 = &report.tiers[1];
        assert_eq!(
            (s3.used_bytes, s3.used_source, s3.lmcache_used_bytes),
            (Some(4096), Some("lmcache"), Some(4096))
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["tiers"][0]["used_bytes"], on_disk);
        assert_eq!(json["tiers"][0]["used_source"], "disk");
        assert_eq!(json["tiers"][0]["lmcache_used_bytes"], 0);
        let text = report.to_text();
        assert!(
            text.contains("LMCache's count") && text.contains("on disk  0.00 GiB"),
            "{text}"
        );
        assert!(
            text.contains("fs_native counts from 0 at each start"),
            "{text}"
        );
    }

    /// A capacity guard of a 1 MiB `fs` tier in `dir` (a tier LMCache does
    /// not evict itself), once it has written its state.
    fn guarded_fs_tier(dir: &Path) -> lmcache_capacity_guard::Guard {
        use lmcache_capacity_guard::capacity::guard_specs;
        use lmcache_capacity_guard::{Guard, GuardOptions};
        use lmcache_tier_spec::Cascade;

        let json = format!(
            r#"{{"type":"fs","base_path":"{}","max_capacity_gb":{}}}"#,
            dir.display(),
            1.0 / 1024.0
        );
        let cascade = Cascade::parse(&json, "V").unwrap();
        assert!(!cascade.tiers()[0].lmcache_evicts());
        let spec = guard_specs(&cascade).unwrap().remove(0);
        let guard = Guard::start(spec, GuardOptions::default()).unwrap();
        let tier = TierDir::open(dir, Access::ReadOnly).unwrap();
        let started = std::time::Instant::now();
        while read_status(&tier).unwrap().is_none() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "no guard status file"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        guard
    }

    #[test]
    fn a_tier_lmcache_does_not_evict_takes_its_capacity_from_its_guard() {
        let tmp = tempfile::tempdir().unwrap();
        let guard = guarded_fs_tier(tmp.path());
        let body = serde_json::json!({"is_healthy": true, "engine_type": "MPCacheServer",
            "storage_manager": {"is_healthy": true,
                "l2_adapters": [{"type": "FSL2Adapter", "is_healthy": true, "base_path": tmp.path()}],
                "l2_eviction_controller": {"adapters": []}}});
        let poll = Poll::Up(Box::new(ServerStatus::from_value(body).unwrap()));
        let report = Inspection::build("http://127.0.0.1:8090/status", &poll, &[], Some(&[false]));
        drop(guard);
        assert_eq!(report.tiers[0].capacity_bytes, Some(1 << 20));
        assert_eq!(report.tiers[0].lmcache_used_bytes, None);
    }

    #[test]
    fn a_relative_base_path_is_not_read_from_inspects_own_directory() {
        let body = serde_json::json!({"is_healthy": true, "engine_type": "MPCacheServer",
            "storage_manager": {"is_healthy": true,
                "l2_adapters": [{"type": "FSNativeL2Adapter", "is_healthy": true, "base_path": "."}],
                "l2_eviction_controller": {"adapters": [
                    {"total_capacity_bytes": 1u64 << 30, "total_bytes_used": 7}]}}});
        let poll = Poll::Up(Box::new(ServerStatus::from_value(body).unwrap()));
        let report = Inspection::build("http://127.0.0.1:8090/status", &poll, &[], None);
        assert!(report.disk.is_empty(), "{:?}", report.disk);
        assert_eq!(
            (report.tiers[0].used_bytes, report.tiers[0].used_source),
            (Some(7), Some("lmcache"))
        );
    }

    #[test]
    fn every_problem_of_a_disk_tier_is_kept() {
        let tmp = tempfile::tempdir().unwrap();
        for name in [".lmcache-tier-identity.json", ".lmcache-tier-guard.json"] {
            std::os::unix::fs::symlink("/etc/hostname", tmp.path().join(name)).unwrap();
        }
        let report = unreachable_with(tmp.path());
        let problem = report.disk[0].problem.as_deref().unwrap_or_default();
        assert_eq!(
            problem
                .matches("it is a symlink, which is not followed")
                .count(),
            2,
            "{problem}"
        );
        assert!(problem.contains("; "), "{problem}");
    }

    /// The report of a server that does not answer, with the disk tier `dir`.
    fn unreachable_with(dir: &std::path::Path) -> Inspection {
        Inspection::build(
            "http://127.0.0.1:1/status",
            &Poll::NoAnswer("connection refused".into()),
            &[dir.to_path_buf()],
            None,
        )
    }

    #[test]
    fn the_capacity_guard_state_of_a_disk_tier_is_shown() {
        let tmp = tempfile::tempdir().unwrap();
        let guard = guarded_fs_tier(tmp.path());
        let report = unreachable_with(tmp.path());
        drop(guard);
        let shown = report.disk[0].guard.as_ref().expect("the guard's state");
        assert_eq!(shown.capacity_bytes, 1 << 20);
        assert_eq!(report.disk[0].guard_running, Some(true));
        let text = report.to_text();
        assert!(
            text.contains("capacity guard") && text.contains("of <0.01 GiB"),
            "{text}"
        );
        assert!(text.contains("(running, state 0 s old)"), "{text}");
        assert!(
            text.contains("free space") && text.contains("to keep it"),
            "{text}"
        );
        assert!(
            serde_json::to_value(&report).unwrap()["disk"][0]["guard"]["capacity_bytes"] == 1 << 20
        );

        // The state a guard of a launch that has ended left behind.
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let file = tmp.path().join(".lmcache-tier-guard.json");
        let mut state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        state["pid"] = gone.id().into();
        state["updated_unix_ms"] = (state["updated_unix_ms"].as_u64().unwrap() - 3_600_000).into();
        std::fs::write(&file, serde_json::to_vec(&state).unwrap()).unwrap();
        let report = unreachable_with(tmp.path());
        assert_eq!(report.disk[0].guard_running, Some(false));
        assert!(report.disk[0].guard_state_age_seconds.unwrap() >= 3600);
        let text = report.to_text();
        assert!(text.contains("(STOPPED, last state 36"), "{text}");

        // A pid that a later process reuses, or one that does not hold the
        // directory: not the guard.
        let now_ms = state["updated_unix_ms"].as_u64().unwrap() + 3_600_000;
        let mut other = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        for (pid, updated) in [(std::process::id(), 1_000), (other.id(), now_ms)] {
            state["pid"] = pid.into();
            state["updated_unix_ms"] = updated.into();
            std::fs::write(&file, serde_json::to_vec(&state).unwrap()).unwrap();
            let report = unreachable_with(tmp.path());
            assert_eq!(report.disk[0].guard_running, Some(false), "pid {pid}");
        }
        let _ = other.kill();
        let _ = other.wait();
    }

    #[test]
    fn a_disk_tier_path_from_the_server_cannot_move_the_cursor() {
        let body = serde_json::json!({"is_healthy": true, "engine_type": "mp",
            "storage_manager": {"l2_adapters": [
                {"type": "FSL2Adapter", "base_path": "/x\u{1b}[2J/cache"}]}});
        let poll = Poll::Up(Box::new(
            ServerStatus::parse(body.to_string().as_bytes()).unwrap(),
        ));
        let text = Inspection::build("u", &poll, &[], None).to_text();
        assert!(text.contains("disk tier /x?[2J/cache"), "{text}");
        assert!(text.contains("  FSL2Adapter  /x?[2J/cache  "), "{text}");
        assert!(!text.contains('\u{1b}'), "{text}");
    }

    #[test]
    fn the_url_is_shown_without_credentials() {
        let report = Inspection::build(
            "http://u:PASS@127.0.0.1:1/status?token=SECRET",
            &Poll::NoAnswer("refused".into()),
            &[],
            None,
        );
        assert!(
            !report.url.contains("PASS") && !report.url.contains("SECRET"),
            "{}",
            report.url
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_s3_tier_behind_a_gateway_shows_the_gateway_state_and_others_show_none() {
        let store = answering_store("200 OK");
        let args = vec![
            "--l2-adapter".to_string(),
            format!(
                r#"{{"type":"s3","s3_endpoint":"127.0.0.1:{store}","s3_bucket":"kv-cache","s3_region":"us-east-1","disable_tls":true,"aws_access_key_id":"AKIAINSPECTKEY","aws_secret_access_key":"INSPECT-SECRET"}}"#
            ),
        ];
        let (_, gateways) = lmcache_s3_gateway::Gateways::start_args(&args, &|_| None, None)
            .await
            .unwrap();
        let (_, gateway) = gateways.addresses()[0];
        let not_a_gateway = answering_store("404 Not Found");
        let nothing = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let body = serde_json::json!({"is_healthy": true, "storage_manager": {"l2_adapters": [
            {"type": "S3L2Adapter", "endpoint": gateway.to_string(), "is_healthy": true},
            {"type": "S3L2Adapter", "endpoint": format!("127.0.0.1:{not_a_gateway}")},
            {"type": "S3L2Adapter", "endpoint": "kvcache.localtest:5055"},
            {"type": "FSL2Adapter", "base_path": format!("127.0.0.1:{}", gateway.port())},
            {"type": "S3L2Adapter", "endpoint": nothing.to_string()}
        ]}});
        let poll = Poll::Up(Box::new(
            ServerStatus::parse(body.to_string().as_bytes()).unwrap(),
        ));
        let mut report = Inspection::build("u", &poll, &[], None);
        report.read_gateways(Duration::from_secs(10)).await;
        let shown: Vec<bool> = report.tiers.iter().map(|t| t.gateway.is_some()).collect();
        assert_eq!(shown, [true, false, false, false, false]);
        let down: Vec<bool> = report
            .tiers
            .iter()
            .map(|t| t.endpoint_down.is_some())
            .collect();
        assert_eq!(down, [false, false, false, false, true]);
        let json = serde_json::to_value(&report).unwrap();
        let state = &json["tiers"][0]["gateway"];
        assert_eq!(state["bucket"], "kv-cache");
        assert_eq!(state["upstream"], format!("http://127.0.0.1:{store}"));
        assert_eq!(state["credential_source"], "the tier's aws_access_key_id");
        assert!(json["tiers"][1]["gateway"].is_null());
        let text = report.to_text();
        assert!(
            text.contains(&format!("S3 gateway of tier 0 on {gateway}"))
                && text.contains("bucket kv-cache")
                && text.contains(&format!("S3 tier 4 on {nothing}: nothing answers")),
            "{text}"
        );
        let everything = format!("{json}{text}");
        for secret in ["AKIAINSPECTKEY", "INSPECT-SECRET"] {
            assert!(!everything.contains(secret), "{everything}");
        }
    }

    #[test]
    fn a_503_or_an_unhealthy_part_exits_9() {
        let report = Inspection::build("u", &Poll::NotReady(503), &[], None);
        assert_eq!(report.exit_code(), 9);
        let sick = Poll::Up(Box::new(
            ServerStatus::parse(br#"{"is_healthy":false}"#).unwrap(),
        ));
        let report = Inspection::build("u", &sick, &[], None);
        assert_eq!(report.exit_code(), 9);
        assert!(report.to_text().contains("UNHEALTHY: server"));
    }

    #[test]
    fn endpoints_lose_credentials_and_queries() {
        assert_eq!(
            redact_endpoint("https://AKIA:s3cr3t@bucket.host:9000/p?X-Amz-Signature=abc"),
            "https://<redacted>@bucket.host:9000/p?<redacted>"
        );
        assert_eq!(
            redact_endpoint("kvcache.localtest:5055"),
            "kvcache.localtest:5055"
        );
    }
}
