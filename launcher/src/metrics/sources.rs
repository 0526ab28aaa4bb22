//! The guards and gateways a scrape reads: each watched guard's status
//! file (only those this launch's guards wrote), the gateways' live
//! state, and every other adapter's neutral per-tier series, encoded at
//! every scrape (`docs/metrics.md`, "Capacity guards", "S3 gateways",
//! "Tier series").

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use lmcache_capacity_guard::status::read_status;
use lmcache_housekeeping::{Access, TierDir};
use lmcache_s3_gateway::state::GatewayState;
use lmcache_s3_gateway::GatewaysView;
use lmcache_tier_spec::adapter::SeriesSource;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::gateways::encode_gateways;
use super::guards::{encode_guards, ServedGuard};
use super::tier_family::encode_series;

/// A guarded tier whose guard's status a scrape reads.
#[derive(Debug, Clone)]
pub(super) struct WatchedGuard {
    /// The tier directory, where the status file is.
    pub(super) dir: PathBuf,
    /// `"shared": true`: rescanned every 10 s or more by design.
    pub(super) shared: bool,
}

/// The guards, gateways and series sources whose state a scrape reads.
pub(super) struct TierSources {
    pub(super) guards: Mutex<Vec<WatchedGuard>>,
    /// [`NodeMetrics::guard_owner`].
    pub(super) owner: Mutex<String>,
    pub(super) gateways: Mutex<GatewaysView>,
    /// [`NodeMetrics::watch_series`].
    pub(super) series: Mutex<Vec<Arc<dyn SeriesSource>>>,
}

impl std::fmt::Debug for TierSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sources = self.series.lock().map_or(0, |s| s.len());
        f.debug_struct("TierSources")
            .field("guards", &self.guards)
            .field("owner", &self.owner)
            .field("gateways", &self.gateways)
            .field("series", &sources)
            .finish()
    }
}

impl TierSources {
    pub(super) fn new() -> Self {
        TierSources {
            guards: Mutex::default(),
            owner: Mutex::new(new_owner()),
            gateways: Mutex::default(),
            series: Mutex::default(),
        }
    }

    /// The statuses of the watched guards written by a guard of this
    /// launch; any other is left out.
    fn guard_statuses(&self) -> Vec<ServedGuard> {
        let guards = self.guards.lock().map(|g| g.clone()).unwrap_or_default();
        let owner = self.owner.lock().map(|o| o.clone()).unwrap_or_default();
        guards
            .into_iter()
            .filter_map(|guard| {
                let dir = TierDir::open(&guard.dir, Access::ReadOnly).ok()?;
                let status = read_status(&dir).ok().flatten()?;
                (status.owner.as_deref() == Some(owner.as_str())).then_some(ServedGuard {
                    status,
                    shared: guard.shared,
                })
            })
            .collect()
    }

    fn gateway_states(&self) -> Vec<GatewayState> {
        let view = self.gateways.lock().map(|v| v.clone()).unwrap_or_default();
        view.states()
    }
}

/// A token naming this process among every process that ever ran a guard
/// in a tier directory, for
/// [`GuardOptions::owner`](lmcache_capacity_guard::GuardOptions::owner):
/// the process id and the time it was made, in nanoseconds. A pid alone
/// repeats: a container's launch has the same one at every start.
fn new_owner() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{}-{nanos}", std::process::id())
}

impl Collector for TierSources {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_guards(&mut encoder, &self.guard_statuses())?;
        encode_gateways(&mut encoder, &self.gateway_states())?;
        let sources = self.series.lock().map(|s| s.clone()).unwrap_or_default();
        let series: Vec<_> = sources.iter().flat_map(|s| s.series()).collect();
        encode_series(&mut encoder, &series)
    }
}
