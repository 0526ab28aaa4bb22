//! The node's Prometheus metrics (`docs/metrics.md`): what this project
//! knows and LMCache's own `/metrics` does not. That is the plan's
//! decisions, what housekeeping deleted, the capacity guards' usage and
//! evictions, the S3 gateways' traffic, and the server's starts, exits and
//! liveness.
//!
//! Every family has the prefix `lmcache_tier_`, base units (`_bytes`,
//! `_seconds`) and `_total` on counters; every label is bounded (a tier's
//! position, a method, a rule name), never an object key, a path per
//! object or a secret.
//!
//! One source of truth: the guards' and gateways' families are read at
//! scrape time from what `lmcache-tier inspect` reads too (each guard's
//! status file, each gateway's counters), so nothing is counted twice. The
//! plan, housekeeping and server families are set by the launch as it goes.

mod bucket;
mod connections;
mod endpoint;
mod format;
mod gateways;
mod guards;
mod housekeeping;
pub(crate) mod names;
mod plan;
mod server;
mod sources;
#[cfg(test)]
mod test_support;
mod tier_family;

use std::sync::Arc;
use std::time::Duration;

use lmcache_capacity_guard::capacity::GuardSpec;
use lmcache_housekeeping::execute::Report;
use lmcache_s3_gateway::GatewaysView;
use lmcache_tier_spec::adapter::SeriesSource;
use prometheus_client::registry::Registry;

pub use endpoint::{EndpointLimits, MetricsEndpoint, MetricsError};
pub use format::Format;
pub use names::PREFIX;
pub use server::ServerMetrics;

use crate::plan::launch_plan::LaunchPlan;
use housekeeping::HousekeepingMetrics;
use sources::{TierSources, WatchedGuard};

/// The metrics of one node: a registry, the families the launch sets, and
/// the sources read at scrape time.
#[derive(Debug)]
pub struct NodeMetrics {
    registry: Registry,
    server: ServerMetrics,
    /// A launch's with the built-in disk tier only: nothing else is
    /// housekept.
    housekeeping: Option<HousekeepingMetrics>,
    tiers: Arc<TierSources>,
    /// What the endpoint serving these metrics holds.
    endpoint: Arc<connections::EndpointState>,
}

impl NodeMetrics {
    /// The families of a node; `plan` (a launch's) adds the plan's, and
    /// housekeeping's when the plan housekeeps the built-in disk tier
    /// (`erebine-lmcache` run alone has neither).
    pub fn new(plan: Option<&LaunchPlan>) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        if let Some(plan) = plan {
            plan::register_plan(&mut registry, plan);
        }
        let server = ServerMetrics::register(&mut registry);
        let housekeeping = plan
            .filter(|plan| plan.housekeeping.is_some())
            .map(|_| HousekeepingMetrics::register(&mut registry));
        let tiers = Arc::new(TierSources::new());
        registry.register_collector(Box::new(tiers.clone()));
        let endpoint = connections::EndpointState::register(&mut registry);
        NodeMetrics {
            registry,
            server,
            housekeeping,
            tiers,
            endpoint,
        }
    }

    /// The server's families.
    pub fn server(&self) -> &ServerMetrics {
        &self.server
    }

    /// Records what the launch's housekeeping did, `took` long.
    pub fn housekept(&self, report: &Report, took: Duration) {
        if let Some(housekeeping) = &self.housekeeping {
            housekeeping.record(report, took);
        }
    }

    /// Reads the status file of each guard of `guarded` (its tier
    /// directory) at every scrape, from now on. Only a status that names
    /// [`NodeMetrics::guard_owner`] as its owner is served: one that an
    /// earlier launch, or a guard of another launch, left there is not this
    /// launch's (`docs/metrics.md`, "Capacity guards").
    pub fn watch_guards(&self, guarded: impl IntoIterator<Item = GuardSpec>) {
        let watched = guarded.into_iter().map(|spec| WatchedGuard {
            dir: spec.base_path,
            shared: spec.shared,
        });
        if let Ok(mut guards) = self.tiers.guards.lock() {
            guards.extend(watched);
        }
    }

    /// The owner this node's guards are started with
    /// ([`GuardOptions::owner`](lmcache_capacity_guard::GuardOptions::owner)),
    /// the only one whose statuses a scrape serves: a token made for this
    /// process at [`NodeMetrics::new`], or the one
    /// [`NodeMetrics::serve_guards_of`] gave.
    pub fn guard_owner(&self) -> String {
        self.tiers
            .owner
            .lock()
            .map(|owner| owner.clone())
            .unwrap_or_default()
    }

    /// Serves the statuses of the guards whose owner is `owner` from now on,
    /// instead of this process's own token: `erebine-lmcache` started by a
    /// launch runs its guards for that launch.
    pub fn serve_guards_of(&self, owner: &str) {
        if let Ok(mut ours) = self.tiers.owner.lock() {
            *ours = owner.to_string();
        }
    }

    /// Reads an adapter's per-tier series at every scrape, from now on
    /// (`docs/metrics.md`, "Tier series").
    pub fn watch_series(&self, source: Arc<dyn SeriesSource>) {
        if let Ok(mut sources) = self.tiers.series.lock() {
            sources.push(source);
        }
    }

    /// Reads the gateways' counters at every scrape, from now on.
    pub fn watch_gateways(&self, view: GatewaysView) {
        if let Ok(mut gateways) = self.tiers.gateways.lock() {
            *gateways = view;
        }
    }

    /// Every family in `format`, as a scrape gets it.
    ///
    /// Errors: formatting (only a bug can cause one).
    pub fn render(&self, format: Format) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        match format {
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut text, &self.registry)?
            }
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)?
            }
        }
        Ok(text)
    }
}
