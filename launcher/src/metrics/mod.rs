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

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lmcache_capacity_guard::capacity::GuardSpec;
use lmcache_capacity_guard::status::{read_status, Following, GuardStatus};
use lmcache_housekeeping::execute::Report;
use lmcache_housekeeping::{Access, TierDir};
use lmcache_s3_gateway::state::GatewayState;
use lmcache_s3_gateway::GatewaysView;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

pub use endpoint::{EndpointLimits, MetricsEndpoint, MetricsError};

use crate::launch_plan::LaunchPlan;
use crate::watch::{Event, ExitCause, LossCause};

/// The prefix of every family.
pub const PREFIX: &str = "lmcache_tier";

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
            register_plan(&mut registry, plan);
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

/// The text formats a scrape can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (`application/openmetrics-text`), what
    /// Prometheus asks for first.
    OpenMetrics,
    /// The Prometheus text format 0.0.4 (`text/plain`), for every other
    /// client (`curl`, `promtool check metrics`).
    Prometheus,
}

impl Format {
    /// The format the `Accept` header values `accept` ask for: OpenMetrics
    /// when one of their media ranges is `application/openmetrics-text`
    /// (any case) with a quality above 0.
    pub fn accepted<'a>(accept: impl IntoIterator<Item = &'a str>) -> Self {
        let wants_openmetrics =
            accept
                .into_iter()
                .flat_map(|value| value.split(','))
                .any(|range| {
                    let mut parts = range.split(';').map(str::trim);
                    let media = parts.next().unwrap_or("");
                    let quality = parts
                        .filter_map(|p| p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")))
                        .find_map(|q| q.parse::<f64>().ok())
                        .unwrap_or(1.0);
                    media.eq_ignore_ascii_case("application/openmetrics-text") && quality > 0.0
                });
        match wants_openmetrics {
            true => Format::OpenMetrics,
            false => Format::Prometheus,
        }
    }

    /// The `Content-Type` of this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// The plan's decisions: the numbers, and one info series with the rule
/// that chose each.
fn register_plan(registry: &mut Registry, plan: &LaunchPlan) {
    let d = &plan.decisions;
    let disk = d.disk.as_ref();
    let gauge = |value: u64| {
        let gauge = Gauge::<i64>::default();
        gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
        gauge
    };
    registry.register_with_unit(
        "plan_l1",
        "The L1 (CPU memory) the server gets",
        Unit::Bytes,
        gauge(d.l1_size.value),
    );
    let capacity = disk.map_or(0, |disk| disk.capacity.value);
    registry.register_with_unit(
        "plan_disk_capacity",
        "Capacity of the built-in disk tier; 0 when there is none",
        Unit::Bytes,
        gauge(capacity),
    );
    if let Some(disk) = disk {
        registry.register(
            "plan_io_workers",
            "I/O worker threads of the built-in disk tier",
            gauge(u64::from(disk.io_workers.value)),
        );
        registry.register(
            "plan_odirect",
            "1 when the built-in disk tier uses O_DIRECT",
            gauge(u64::from(disk.use_odirect.value)),
        );
    }
    let rule = |decision: Option<&'static str>| decision.unwrap_or("none").to_string();
    let labels = vec![
        ("l1_rule".to_string(), d.l1_size.rule.to_string()),
        (
            "cascade_source".to_string(),
            d.cascade_source.rule.to_string(),
        ),
        (
            "capacity_rule".to_string(),
            rule(disk.map(|x| x.capacity.rule)),
        ),
        (
            "volume_kind".to_string(),
            rule(disk.map(|x| x.volume_kind.rule)),
        ),
        (
            "io_workers_rule".to_string(),
            rule(disk.map(|x| x.io_workers.rule)),
        ),
        (
            "odirect_rule".to_string(),
            rule(disk.map(|x| x.use_odirect.rule)),
        ),
        ("chunk_size_rule".to_string(), d.chunk_size.rule.to_string()),
    ];
    registry.register(
        "plan",
        "The rule that chose each number of the plan (docs/sizing.md)",
        Info::new(labels),
    );
}

/// The liveness states a server is in, one series each (1 for the current).
const LIVENESS: [&str; 5] = ["starting", "ready", "unhealthy", "unresponsive", "exited"];

/// How a server process ended ([`ExitCause`]); one series per cause from
/// the start (at 0), so that `increase()` sees the first one.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExitLabels {
    /// `status` (an exit code), `signal`, `oom_kill` (SIGKILL with a rise
    /// of the kernel's OOM-kill count) or `unresponsive` (stopped by the
    /// launch for giving no answer).
    cause: &'static str,
}

/// Why engine workers were lost ([`LossCause`]); one series per cause from
/// the start (at 0).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LossLabels {
    /// `reaped` or `server_restarted`.
    cause: &'static str,
}

/// A liveness state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

/// The server's families, set from the launch's starts and [`Event`]s.
#[derive(Debug, Clone)]
pub struct ServerMetrics {
    up: Gauge,
    starts: Counter,
    restarts: Counter,
    exits: Family<ExitLabels, Counter>,
    liveness: Family<StateLabels, Gauge>,
    workers: Gauge,
    workers_lost: Family<LossLabels, Counter>,
    workers_detached: Counter,
    ready_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// When the server last started, for the time to ready.
    started_at: Arc<Mutex<Option<std::time::Instant>>>,
}

impl ServerMetrics {
    fn register(registry: &mut Registry) -> Self {
        let server = ServerMetrics {
            up: Gauge::default(),
            starts: Counter::default(),
            restarts: Counter::default(),
            exits: Family::default(),
            liveness: Family::default(),
            workers: Gauge::default(),
            workers_lost: Family::default(),
            workers_detached: Counter::default(),
            ready_seconds: Gauge::default(),
            started_at: Arc::default(),
        };
        registry.register(
            "server_up",
            "1 while the LMCache server answers /status healthily",
            server.up.clone(),
        );
        registry.register(
            "server_starts",
            "Starts of the LMCache server",
            server.starts.clone(),
        );
        registry.register(
            "server_restarts",
            "Restarts of the LMCache server after it ended",
            server.restarts.clone(),
        );
        registry.register(
            "server_exits",
            "Ends of the LMCache server process by cause (status, signal, oom_kill, unresponsive)",
            server.exits.clone(),
        );
        registry.register(
            "server_liveness",
            "1 for the server's liveness state now (starting, ready, unhealthy, unresponsive, exited)",
            server.liveness.clone(),
        );
        registry.register(
            "engine_workers",
            "Engine workers attached to the server (worker_liveness.tracked_instances)",
            server.workers.clone(),
        );
        registry.register(
            "engine_workers_lost",
            "Engine workers lost by cause: reaped (silent while the server answered), server_restarted (not back after a restart)",
            server.workers_lost.clone(),
        );
        registry.register(
            "engine_workers_detached",
            "Engine workers that unregistered cleanly",
            server.workers_detached.clone(),
        );
        registry.register_with_unit(
            "server_ready",
            "Seconds from the last start to the first healthy /status",
            Unit::Seconds,
            server.ready_seconds.clone(),
        );
        for cause in ExitCause::ALL {
            let labels = ExitLabels {
                cause: cause.as_str(),
            };
            server.exits.get_or_create(&labels).inc_by(0);
        }
        for cause in LossCause::ALL {
            let labels = LossLabels {
                cause: cause.as_str(),
            };
            server.workers_lost.get_or_create(&labels).inc_by(0);
        }
        for state in LIVENESS {
            let labels = StateLabels {
                state: state.to_string(),
            };
            server.liveness.get_or_create(&labels).set(0);
        }
        server
    }

    /// A start of the server: the `start`-th of the launch (1 for the first).
    pub fn started(&self, start: u64) {
        self.starts.inc();
        if start > 1 {
            self.restarts.inc();
        }
        self.up.set(0);
        self.state("starting");
        if let Ok(mut at) = self.started_at.lock() {
            *at = Some(std::time::Instant::now());
        }
    }

    /// Counts and shows what `event` says.
    pub fn observe(&self, event: &Event) {
        match event {
            Event::Ready => {
                let since = self.started_at.lock().ok().and_then(|at| *at);
                if let Some(started) = since {
                    self.ready_seconds.set(started.elapsed().as_secs_f64());
                }
                self.up.set(1);
                self.state("ready");
            }
            Event::Recovered => {
                self.up.set(1);
                self.state("ready");
            }
            Event::WorkersAttached { count } => {
                self.workers.set(i64::try_from(*count).unwrap_or(i64::MAX));
            }
            Event::WorkersLost { before, now, cause } => {
                let labels = LossLabels {
                    cause: cause.as_str(),
                };
                self.workers_lost
                    .get_or_create(&labels)
                    .inc_by(before.saturating_sub(*now));
                // After a restart `now` counts those that came back at any
                // time of the grace; the gauge follows this start's own
                // attach and fall events instead.
                if *cause == LossCause::Reaped {
                    self.workers.set(i64::try_from(*now).unwrap_or(i64::MAX));
                }
            }
            Event::WorkersDetached { before, now } => {
                self.workers_detached.inc_by(before.saturating_sub(*now));
                self.workers.set(i64::try_from(*now).unwrap_or(i64::MAX));
            }
            Event::Unhealthy { .. } => {
                self.up.set(0);
                self.state("unhealthy");
            }
            Event::Unresponsive { .. } => {
                self.up.set(0);
                self.state("unresponsive");
            }
            Event::Exited { cause, .. } => {
                self.exits
                    .get_or_create(&ExitLabels {
                        cause: cause.as_str(),
                    })
                    .inc();
                self.up.set(0);
                self.workers.set(0);
                self.state("exited");
            }
        }
    }

    fn state(&self, now: &str) {
        for state in LIVENESS {
            let labels = StateLabels {
                state: state.to_string(),
            };
            self.liveness
                .get_or_create(&labels)
                .set(i64::from(state == now));
        }
    }
}

/// A housekeeping reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// One field of a purge by identity: its name and both values.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IdentityChangeLabels {
    field: String,
    stored: String,
    current: String,
}

/// What the launch's housekeeping did.
#[derive(Debug, Clone, Default)]
struct HousekeepingMetrics {
    deleted_objects: Family<ReasonLabels, Counter>,
    deleted_bytes: Family<ReasonLabels, Counter>,
    kept_objects: Gauge,
    kept_bytes: Gauge,
    foreign_entries: Gauge,
    duration: Gauge<f64, std::sync::atomic::AtomicU64>,
    last_run: Gauge<f64, std::sync::atomic::AtomicU64>,
    identity_purge: Gauge,
    identity_changes: Family<IdentityChangeLabels, Gauge>,
}

impl HousekeepingMetrics {
    fn register(registry: &mut Registry) -> Self {
        let hk = HousekeepingMetrics::default();
        let sub = registry.sub_registry_with_prefix("housekeeping");
        sub.register(
            "deleted_objects",
            "Entries housekeeping deleted, by reason",
            hk.deleted_objects.clone(),
        );
        sub.register_with_unit(
            "deleted",
            "Allocated bytes housekeeping deleted, by reason",
            Unit::Bytes,
            hk.deleted_bytes.clone(),
        );
        sub.register(
            "kept_objects",
            "Cache objects housekeeping kept",
            hk.kept_objects.clone(),
        );
        sub.register_with_unit(
            "kept",
            "Allocated bytes of the cache objects housekeeping kept",
            Unit::Bytes,
            hk.kept_bytes.clone(),
        );
        sub.register(
            "foreign_entries",
            "Entries in the tier directory that are not the cache's, left alone",
            hk.foreign_entries.clone(),
        );
        sub.register_with_unit(
            "duration",
            "How long the last housekeeping took",
            Unit::Seconds,
            hk.duration.clone(),
        );
        sub.register_with_unit(
            "last_run_timestamp",
            "When the last housekeeping ended, Unix time",
            Unit::Seconds,
            hk.last_run.clone(),
        );
        sub.register(
            "identity_purge",
            "1 when the last housekeeping purged more than half of the tier's bytes because the launch identity differed from what the tier holds",
            hk.identity_purge.clone(),
        );
        sub.register(
            "identity_change",
            "1 for each identity field that differed in that purge: field, the value the tier held, this launch's",
            hk.identity_changes.clone(),
        );
        hk
    }

    fn record(&self, report: &Report, took: Duration) {
        for total in &report.deleted {
            let labels = ReasonLabels {
                reason: total.reason.to_string(),
            };
            self.deleted_objects
                .get_or_create(&labels)
                .inc_by(total.count);
            self.deleted_bytes
                .get_or_create(&labels)
                .inc_by(total.bytes);
        }
        let set = |gauge: &Gauge, value: u64| gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
        set(&self.kept_objects, report.kept_objects.count);
        set(&self.kept_bytes, report.kept_objects.bytes);
        set(&self.foreign_entries, report.foreign.count);
        self.identity_purge
            .set(i64::from(report.identity_purge.is_some()));
        self.identity_changes.clear();
        for change in report.identity_purge.iter().flat_map(|p| &p.changes) {
            let labels = IdentityChangeLabels {
                field: change.field.to_string(),
                stored: change.stored.clone(),
                current: change.current.clone(),
            };
            self.identity_changes.get_or_create(&labels).set(1);
        }
        self.duration.set(took.as_secs_f64());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.last_run.set(now.as_secs_f64());
    }
}

/// A guarded tier whose guard's status a scrape reads.
#[derive(Debug, Clone)]
struct WatchedGuard {
    /// The tier directory, where the status file is.
    dir: PathBuf,
    /// `"shared": true`: rescanned every 10 s or more by design.
    shared: bool,
}

/// The status of one of this launch's guards, and whether its tier is
/// shared.
struct ServedGuard {
    status: GuardStatus,
    shared: bool,
}

/// The guards and gateways whose state a scrape reads.
#[derive(Debug)]
struct TierSources {
    guards: Mutex<Vec<WatchedGuard>>,
    /// [`NodeMetrics::guard_owner`].
    owner: Mutex<String>,
    gateways: Mutex<GatewaysView>,
}

impl TierSources {
    fn new() -> Self {
        TierSources {
            guards: Mutex::default(),
            owner: Mutex::new(new_owner()),
            gateways: Mutex::default(),
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

/// A tier's position in the cascade.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabels {
    tier: String,
}

/// A gateway request method.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    tier: String,
    method: String,
}

/// A gateway's identity.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GatewayLabels {
    tier: String,
    bucket: String,
    credential_source: String,
}

impl Collector for TierSources {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_guards(&mut encoder, &self.guard_statuses())?;
        encode_gateways(&mut encoder, &self.gateway_states())
    }
}

/// One family of per-tier values: `name`, `help`, `unit`, and for each
/// tier its labels and value; counters when `counter`.
fn encode_per_tier<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    counter: bool,
    series: &[(L, u64)],
) -> Result<(), std::fmt::Error> {
    if series.is_empty() {
        return Ok(());
    }
    let kind = match counter {
        true => ConstCounter::new(0u64).metric_type(),
        false => ConstGauge::new(0i64).metric_type(),
    };
    let mut family = encoder.encode_descriptor(name, help, unit, kind)?;
    for (labels, value) in series {
        let metric = family.encode_family(labels)?;
        match counter {
            true => ConstCounter::new(*value).encode(metric)?,
            false => ConstGauge::new(i64::try_from(*value).unwrap_or(i64::MAX)).encode(metric)?,
        }
    }
    Ok(())
}

/// One per-tier family read from each snapshot of type `S`: a counter
/// when `counter`, in bytes when `bytes`.
struct TierFamily<S> {
    name: &'static str,
    help: &'static str,
    bytes: bool,
    counter: bool,
    value: fn(&S) -> u64,
}

impl<S> TierFamily<S> {
    /// Encodes the family with one series per snapshot, labelled by
    /// `labels` of it.
    fn encode<L: EncodeLabelSet>(
        &self,
        encoder: &mut DescriptorEncoder,
        snapshots: &[S],
        labels: impl Fn(&S) -> L,
    ) -> Result<(), std::fmt::Error> {
        let series: Vec<(L, u64)> = snapshots
            .iter()
            .map(|s| (labels(s), (self.value)(s)))
            .collect();
        let unit = self.bytes.then_some(&Unit::Bytes);
        encode_per_tier(encoder, self.name, self.help, unit, self.counter, &series)
    }
}

/// The capacity guards' families, from their status files.
const GUARD_FAMILIES: [TierFamily<GuardStatus>; 11] = [
    TierFamily {
        name: "guard_usage",
        help: "Allocated bytes of the tier's cache objects, as the capacity guard counts them",
        bytes: true,
        counter: false,
        value: |s| s.tracked.bytes,
    },
    TierFamily {
        name: "guard_usage_objects",
        help: "Cache objects in the tier, as the capacity guard counts them",
        bytes: false,
        counter: false,
        value: |s| s.tracked.objects,
    },
    TierFamily {
        name: "guard_undeletable",
        help: "Allocated bytes of the tier's objects the capacity guard could not delete, counted in guard_usage",
        bytes: true,
        counter: false,
        value: |s| s.undeletable.bytes,
    },
    TierFamily {
        name: "guard_undeletable_objects",
        help: "The tier's objects the capacity guard could not delete (still on the disk and counted)",
        bytes: false,
        counter: false,
        value: |s| s.undeletable.objects,
    },
    TierFamily {
        name: "guard_capacity",
        help: "The tier's capacity",
        bytes: true,
        counter: false,
        value: |s| s.capacity_bytes,
    },
    TierFamily {
        name: "guard_trigger",
        help: "Usage at which the capacity guard starts an eviction cycle",
        bytes: true,
        counter: false,
        value: |s| s.trigger_bytes,
    },
    TierFamily {
        name: "guard_eviction_cycles",
        help: "Eviction cycles the capacity guard ran",
        bytes: false,
        counter: true,
        value: |s| s.evictions.cycles,
    },
    TierFamily {
        name: "guard_evicted_objects",
        help: "Cache objects the capacity guard deleted",
        bytes: false,
        counter: true,
        value: |s| s.evictions.deleted.objects,
    },
    TierFamily {
        name: "guard_evicted",
        help: "Bytes the capacity guard's deletions freed on the volume (nothing for a file with other hard links)",
        bytes: true,
        counter: true,
        value: |s| s.evictions.deleted.bytes,
    },
    TierFamily {
        name: "guard_rescans",
        help: "Full rescans of the tier (inotify queue overflows, rescans instead of inotify)",
        bytes: false,
        counter: true,
        value: |s| s.rescans,
    },
    TierFamily {
        name: "guard_inotify_overflows",
        help: "inotify queue overflows (IN_Q_OVERFLOW) of the guard's watch, each followed by a rescan",
        bytes: false,
        counter: true,
        value: |s| s.overflows,
    },
];

/// The families of the free space each guard keeps on its volume, for the
/// guards whose volume reports a size (read only from statuses that have
/// [`GuardStatus::free_space`]).
const FREE_SPACE_FAMILIES: [TierFamily<GuardStatus>; 5] = [
    TierFamily {
        name: "guard_volume_free",
        help: "Free space on the tier's volume at the guard's last check",
        bytes: true,
        counter: false,
        value: |s| s.free_space.unwrap_or_default().free_bytes,
    },
    TierFamily {
        name: "guard_free_space_line",
        help: "Free space the guard keeps on the volume: min(reserve, free + tier - capacity at start); below it the guard evicts",
        bytes: true,
        counter: false,
        value: |s| s.free_space.unwrap_or_default().line_bytes,
    },
    TierFamily {
        name: "guard_free_space_eviction_cycles",
        help: "Eviction cycles run because the volume's free space or inodes fell below the line",
        bytes: false,
        counter: true,
        value: |s| s.free_space.unwrap_or_default().evictions.cycles,
    },
    TierFamily {
        name: "guard_free_space_evicted_objects",
        help: "Cache objects deleted because the volume's free space or inodes fell below the line",
        bytes: false,
        counter: true,
        value: |s| s.free_space.unwrap_or_default().evictions.deleted.objects,
    },
    TierFamily {
        name: "guard_free_space_evicted",
        help: "Bytes freed on the volume by deletions because its free space or inodes fell below the line",
        bytes: true,
        counter: true,
        value: |s| s.free_space.unwrap_or_default().evictions.deleted.bytes,
    },
];

/// The families of the free inodes each guard keeps on its volume, for the
/// guards whose volume reports inodes (read only from statuses that have
/// [`FreeSpace::inodes`](lmcache_capacity_guard::status::FreeSpace::inodes)).
const INODE_FAMILIES: [TierFamily<GuardStatus>; 2] = [
    TierFamily {
        name: "guard_volume_free_inodes",
        help: "Free inodes on the tier's volume at the guard's last check",
        bytes: false,
        counter: false,
        value: |s| free_inodes(s).free_inodes,
    },
    TierFamily {
        name: "guard_free_space_line_inodes",
        help: "Free inodes the guard keeps on the volume: min(10% of its inodes, 1,000,000, free at start); below it the guard evicts",
        bytes: false,
        counter: false,
        value: |s| free_inodes(s).line_inodes,
    },
];

fn free_inodes(status: &GuardStatus) -> lmcache_capacity_guard::status::FreeInodes {
    status.free_space.and_then(|f| f.inodes).unwrap_or_default()
}

/// The S3 gateways' per-tier families, from their counters.
const GATEWAY_FAMILIES: [TierFamily<GatewayState>; 6] = [
    TierFamily {
        name: "gateway_upstream_errors",
        help: "Upstream answers with a 5xx status, and answers that broke off",
        bytes: false,
        counter: true,
        value: |s| s.upstream_errors,
    },
    TierFamily {
        name: "gateway_upstream_unreachable",
        help: "Requests the upstream did not answer (the gateway said 503)",
        bytes: false,
        counter: true,
        value: |s| s.upstream_unreachable,
    },
    TierFamily {
        name: "gateway_sent",
        help: "Request body bytes forwarded to the upstream",
        bytes: true,
        counter: true,
        value: |s| s.bytes_up,
    },
    TierFamily {
        name: "gateway_received",
        help: "Response body bytes received from the upstream",
        bytes: true,
        counter: true,
        value: |s| s.bytes_down,
    },
    TierFamily {
        name: "gateway_peer_refused",
        help: "Requests refused with 403 because their connection did not come from the LMCache server's uid (or its owner could not be found)",
        bytes: false,
        counter: true,
        value: |s| s.peer_refused,
    },
    TierFamily {
        name: "gateway_upstream_denied",
        help: "Upstream answers 401 or 403 to LMCache's requests: the store refused the real credentials (revoked, rotated, or lacking a permission)",
        bytes: false,
        counter: true,
        value: |s| s.upstream_denied,
    },
];

fn encode_guards(
    encoder: &mut DescriptorEncoder,
    guards: &[ServedGuard],
) -> Result<(), std::fmt::Error> {
    let statuses: Vec<GuardStatus> = guards.iter().map(|g| g.status.clone()).collect();
    let statuses = statuses.as_slice();
    let labels = |s: &GuardStatus| TierLabels {
        tier: s.tier.to_string(),
    };
    let info: Vec<(Vec<(String, String)>, u64)> = guards
        .iter()
        .map(|g| {
            let following = match g.status.following {
                Following::Inotify => "inotify",
                Following::Rescans => "rescans",
            };
            let labels = vec![
                ("tier".to_string(), g.status.tier.to_string()),
                ("following".to_string(), following.to_string()),
                ("shared".to_string(), g.shared.to_string()),
            ];
            (labels, 1)
        })
        .collect();
    let help = "One series per capacity guard: how it follows its tier (following: inotify, or rescans when inotify cannot watch it) and whether the tier is shared (shared: true, rescanned every 10 s or more by design)";
    encode_per_tier(encoder, "guard_info", help, None, false, &info)?;
    for family in &GUARD_FAMILIES {
        family.encode(encoder, statuses, labels)?;
    }
    let measured: Vec<GuardStatus> = statuses
        .iter()
        .filter(|s| s.free_space.is_some())
        .cloned()
        .collect();
    for family in &FREE_SPACE_FAMILIES {
        family.encode(encoder, &measured, labels)?;
    }
    let counted: Vec<GuardStatus> = measured
        .into_iter()
        .filter(|s| s.free_space.is_some_and(|f| f.inodes.is_some()))
        .collect();
    for family in &INODE_FAMILIES {
        family.encode(encoder, &counted, labels)?;
    }
    let lags: Vec<(TierLabels, f64)> = statuses
        .iter()
        .filter_map(|s| Some((labels(s), s.event_lag_ms? as f64 / 1e3)))
        .collect();
    if lags.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(
        "guard_event_lag",
        "In the guard's last batch of inotify events, the longest time from an object's last change (ctime) to the guard counting it",
        Some(&Unit::Seconds),
        ConstGauge::new(0.0f64).metric_type(),
    )?;
    for (labels, seconds) in &lags {
        ConstGauge::new(*seconds).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// The kind of a gateway's credential source, for a label: `spec`,
/// `environment`, `profile`, `web_identity`, `container`,
/// `instance_metadata` or `other`. The source's full description (a file
/// path, a role ARN) stays in the gateway's state, which `inspect` shows.
fn credential_kind(source: &str) -> &'static str {
    match source {
        "the tier's aws_access_key_id" => "spec",
        "AWS_ACCESS_KEY_ID" => "environment",
        s if s.starts_with("profile ") => "profile",
        s if s.starts_with("web identity") => "web_identity",
        s if s.contains("ECS container") => "container",
        s if s.starts_with("EC2 instance metadata") => "instance_metadata",
        _ => "other",
    }
}

/// A counter family of each gateway's values by one label `label`: a
/// series per (tier, value name) that `values` gives.
fn encode_labelled(
    encoder: &mut DescriptorEncoder,
    states: &[GatewayState],
    name: &str,
    help: &str,
    label: &str,
    values: fn(&GatewayState) -> Vec<(&'static str, u64)>,
) -> Result<(), std::fmt::Error> {
    let series: Vec<(Vec<(String, String)>, u64)> = states
        .iter()
        .flat_map(|s| {
            values(s).into_iter().map(|(value, count)| {
                let labels = vec![
                    ("tier".to_string(), s.tier.to_string()),
                    (label.to_string(), value.to_string()),
                ];
                (labels, count)
            })
        })
        .collect();
    encode_per_tier(encoder, name, help, None, true, &series)
}

/// Each gateway's answer durations as a Prometheus histogram.
fn encode_answer_seconds(
    encoder: &mut DescriptorEncoder,
    states: &[GatewayState],
) -> Result<(), std::fmt::Error> {
    let kind = Histogram::new([1.0]).metric_type();
    let mut family = encoder.encode_descriptor(
        "gateway_answer_duration",
        "Seconds from a request's arrival at the gateway to its answer's headers",
        Some(&Unit::Seconds),
        kind,
    )?;
    for s in states {
        let (count, buckets) = own_counts(&s.answer_seconds);
        let labels = TierLabels {
            tier: s.tier.to_string(),
        };
        family
            .encode_family(&labels)?
            .encode_histogram::<NoLabelSet>(s.answer_seconds.sum, count, &buckets, None)?;
    }
    Ok(())
}

/// What prometheus-client's `encode_histogram` takes for the gateway
/// histogram `h`: the count of observations, and each bucket's upper bound
/// with the observations in that bucket alone (`+Inf` last), which it adds
/// up into the cumulative counts of the text formats. `h` holds them
/// cumulative already (`Histogram::cumulative`), so they are taken apart
/// here; handed on as they are, they would be summed twice. A count below
/// the last bucket's (a state read from elsewhere) is raised to it, so that
/// `+Inf` equals `_count` and no bucket falls, as both formats require.
fn own_counts(h: &lmcache_s3_gateway::state::Histogram) -> (u64, Vec<(f64, u64)>) {
    let mut below = 0;
    let mut buckets: Vec<(f64, u64)> = h
        .bounds
        .iter()
        .zip(&h.cumulative)
        .map(|(bound, cumulative)| {
            let own = cumulative.saturating_sub(below);
            below = below.max(*cumulative);
            (*bound, own)
        })
        .collect();
    let count = h.count.max(below);
    buckets.push((f64::INFINITY, count - below));
    (count, buckets)
}

fn encode_gateways(
    encoder: &mut DescriptorEncoder,
    states: &[GatewayState],
) -> Result<(), std::fmt::Error> {
    if states.is_empty() {
        return Ok(());
    }
    let tier = |s: &GatewayState| s.tier.to_string();
    let requests: Vec<(MethodLabels, u64)> = states
        .iter()
        .flat_map(|s| {
            let r = s.requests;
            [
                ("HEAD", r.head),
                ("GET", r.get),
                ("PUT", r.put),
                ("POST", r.post),
                ("DELETE", r.delete),
                ("other", r.other),
            ]
            .map(|(method, count)| {
                let labels = MethodLabels {
                    tier: tier(s),
                    method: method.to_string(),
                };
                (labels, count)
            })
        })
        .collect();
    let help = "Requests LMCache sent to the tier's S3 gateway, by method";
    encode_per_tier(encoder, "gateway_requests", help, None, true, &requests)?;
    encode_labelled(
        encoder,
        states,
        "gateway_responses",
        "The gateway's answers to LMCache, by status class",
        "class",
        |s| {
            let a = s.answers;
            vec![
                ("2xx", a.success),
                ("3xx", a.redirection),
                ("4xx", a.client_error),
                ("5xx", a.server_error),
                ("other", a.other),
            ]
        },
    )?;
    encode_labelled(
        encoder,
        states,
        "gateway_client_upload_failures",
        "Uploads their own client ended while the upstream waited for the body, by reason (stalled: no byte for 5 s, broke_off); not the upstream's failures",
        "reason",
        |s| {
            let f = s.client_upload_failures;
            vec![("stalled", f.stalled), ("broke_off", f.broke_off)]
        },
    )?;
    encode_labelled(encoder, states, "gateway_rejected", "Requests the gateway refused with 403, by reason (malformed, unknown_key, scope, time, signature)", "reason", |s| {
        let r = s.rejected_by_reason;
        vec![("malformed", r.malformed), ("unknown_key", r.unknown_key), ("scope", r.scope), ("time", r.time), ("signature", r.signature)]
    })?;
    for family in &GATEWAY_FAMILIES {
        family.encode(encoder, states, |s| TierLabels { tier: tier(s) })?;
    }
    encode_answer_seconds(encoder, states)?;
    let expiring: Vec<(TierLabels, u64)> = states
        .iter()
        .filter_map(|s| Some((TierLabels { tier: tier(s) }, s.credential_expiry_unix?)))
        .collect();
    let help = "When the real credentials a gateway signs with expire, Unix time (no series for keys that do not expire)";
    encode_per_tier(
        encoder,
        "gateway_credential_expiry_timestamp",
        help,
        Some(&Unit::Seconds),
        false,
        &expiring,
    )?;
    let info: Vec<(GatewayLabels, u64)> = states
        .iter()
        .map(|s| {
            let labels = GatewayLabels {
                tier: tier(s),
                bucket: s.bucket.clone(),
                credential_source: credential_kind(&s.credential_source).to_string(),
            };
            (labels, 1)
        })
        .collect();
    let help = "One series per S3 gateway: its bucket and where its real credentials come from";
    encode_per_tier(encoder, "gateway_info", help, None, false, &info)?;
    bucket::encode_bounds(encoder, states)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::text_vars;
    use crate::inputs::{EngineFacts, HostFacts};
    use crate::{plan, DiskFacts, Planned};
    use lmcache_sizing::rules::{OdirectProbe, VolumeStats};
    use lmcache_sizing::volume::Filesystem;
    use lmcache_sizing::{Decision, GIB};

    /// The plan of a node with an 8 GiB L1 and the built-in tier on a
    /// 1 TiB xfs volume.
    fn a_plan() -> LaunchPlan {
        let vars = text_vars([
            ("EREBINE_AGENT_KV_CACHE_BACKEND", "lmcache"),
            ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "8"),
            ("EREBINE_AGENT_LMCACHE_DISK_PATH", "/cache"),
            ("EREBINE_AGENT_LMCACHE_PATH", "/bin/sh"),
        ]);
        let engine = EngineFacts {
            model: "m".into(),
            tensor_parallel_size: 1,
            pipeline_parallel_size: 1,
            data_parallel_size: 1,
            kv_cache_dtype: "auto".into(),
            block_size: 16,
            max_num_batched_tokens: 2048,
            hybrid_attention: false,
            ..EngineFacts::default()
        };
        let host = HostFacts {
            memory: Decision::new(64 * GIB, "given", "test"),
            physical_cores: 16,
            executable: None,
            disk: Some(DiskFacts {
                measured_at: "/cache".into(),
                volume: VolumeStats {
                    total_bytes: 1024 * GIB,
                    free_bytes: 1024 * GIB,
                    block_size: 4096,
                },
                filesystem: Filesystem {
                    fs_type: "xfs".into(),
                    read_only: false,
                    source: None,
                },
                reclaimable_bytes: 0,
                odirect: OdirectProbe::Succeeded,
                tier: Default::default(),
            }),
            gpu: None,
            odirect_tiers: Vec::new(),
        };
        match plan(&engine, &vars, &host).unwrap() {
            Planned::Server(plan) => *plan,
            Planned::NothingToLaunch(why) => panic!("{}", why.reason),
        }
    }

    /// The value of the one sample of `series` (a name with its labels).
    fn sample(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .parse()
            .unwrap()
    }

    #[test]
    fn the_plan_is_exported_with_the_rule_of_each_number() {
        let text = NodeMetrics::new(Some(&a_plan()))
            .render(Format::OpenMetrics)
            .unwrap();
        assert_eq!(
            sample(&text, "lmcache_tier_plan_l1_bytes"),
            8.0 * GIB as f64
        );
        assert_eq!(
            sample(&text, "lmcache_tier_plan_disk_capacity_bytes"),
            128.0 * GIB as f64
        );
        assert_eq!(sample(&text, "lmcache_tier_plan_io_workers"), 8.0);
        assert_eq!(sample(&text, "lmcache_tier_plan_odirect"), 1.0);
        let info = text
            .lines()
            .find(|l| l.starts_with("lmcache_tier_plan_info{"))
            .unwrap();
        for label in [
            r#"l1_rule="explicit""#,
            r#"capacity_rule="derived-12.5pct-volume""#,
            r#"volume_kind="local""#,
            r#"odirect_rule="probe-succeeded""#,
        ] {
            assert!(info.contains(label), "{label} not in {info}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn starts_events_and_exits_are_counted_by_cause() {
        use crate::oom::OomReading;
        use std::os::unix::process::ExitStatusExt;
        use std::process::ExitStatus;

        let metrics = NodeMetrics::new(None);
        let before = metrics.render(Format::OpenMetrics).unwrap();
        for cause in ["status", "signal", "oom_kill", "unresponsive"] {
            let series = format!(r#"lmcache_tier_server_exits_total{{cause="{cause}"}}"#);
            assert_eq!(sample(&before, &series), 0.0, "{before}");
        }
        for cause in ["reaped", "server_restarted"] {
            let series = format!(r#"lmcache_tier_engine_workers_lost_total{{cause="{cause}"}}"#);
            assert_eq!(sample(&before, &series), 0.0, "{before}");
        }
        assert!(
            !before.contains("housekeeping"),
            "no housekeeping without a plan"
        );
        let reaped = r#"lmcache_tier_engine_workers_lost_total{cause="reaped"}"#;
        let restarted = r#"lmcache_tier_engine_workers_lost_total{cause="server_restarted"}"#;
        let server = metrics.server();
        server.started(1);
        server.observe(&Event::Ready);
        server.observe(&Event::WorkersAttached { count: 2 });
        server.observe(&Event::WorkersLost {
            before: 2,
            now: 1,
            cause: LossCause::Reaped,
        });
        let text = metrics.render(Format::OpenMetrics).unwrap();
        assert_eq!(sample(&text, "lmcache_tier_server_up"), 1.0);
        assert_eq!(sample(&text, "lmcache_tier_engine_workers"), 1.0);
        assert_eq!(sample(&text, reaped), 1.0);
        assert_eq!(
            sample(&text, "lmcache_tier_engine_workers_detached_total"),
            0.0
        );
        server.observe(&Event::WorkersDetached { before: 1, now: 0 });
        let text = metrics.render(Format::OpenMetrics).unwrap();
        assert_eq!(sample(&text, "lmcache_tier_engine_workers"), 0.0);
        assert_eq!(sample(&text, reaped), 1.0);
        assert_eq!(
            sample(&text, "lmcache_tier_engine_workers_detached_total"),
            1.0
        );
        assert_eq!(
            sample(&text, r#"lmcache_tier_server_liveness{state="ready"}"#),
            1.0
        );
        assert!(sample(&text, "lmcache_tier_server_ready_seconds") >= 0.0);
        let file: std::path::PathBuf = "/cg/memory.oom_control".into();
        let oom = OomReading::Rose {
            file: file.clone(),
            before: 0,
            after: 1,
        };
        let no_oom = OomReading::Unchanged { file, count: 1 };
        server.observe(&Event::exited(ExitStatus::from_raw(9), &oom));
        server.started(2);
        server.observe(&Event::exited(ExitStatus::from_raw(9), &no_oom));
        server.started(3);
        server.observe(&Event::Ready);
        server.observe(&Event::WorkersAttached { count: 1 });
        server.observe(&Event::WorkersLost {
            before: 3,
            now: 1,
            cause: LossCause::ServerRestarted,
        });
        let text = metrics.render(Format::OpenMetrics).unwrap();
        assert_eq!(sample(&text, restarted), 2.0);
        assert_eq!(
            sample(&text, "lmcache_tier_engine_workers"),
            1.0,
            "the attached gauge follows this start"
        );
        server.observe(&Event::stopped_unresponsive(
            ExitStatus::from_raw(143 << 8),
            crate::watch::Silence {
                silent: Duration::from_secs(130),
                limit: Duration::from_secs(120),
            },
        ));
        server.started(4);
        server.observe(&Event::exited(ExitStatus::from_raw(1 << 8), &no_oom));
        let text = metrics.render(Format::OpenMetrics).unwrap();
        assert_eq!(sample(&text, "lmcache_tier_server_up"), 0.0);
        assert_eq!(sample(&text, "lmcache_tier_server_starts_total"), 4.0);
        assert_eq!(sample(&text, "lmcache_tier_server_restarts_total"), 3.0);
        for (cause, count) in [
            ("oom_kill", 1.0),
            ("signal", 1.0),
            ("unresponsive", 1.0),
            ("status", 1.0),
        ] {
            let series = format!(r#"lmcache_tier_server_exits_total{{cause="{cause}"}}"#);
            assert_eq!(sample(&text, &series), count, "{cause}");
        }
        assert_eq!(
            sample(&text, r#"lmcache_tier_server_liveness{state="exited"}"#),
            1.0
        );
        assert_eq!(
            sample(&text, r#"lmcache_tier_server_liveness{state="ready"}"#),
            0.0
        );
    }

    #[test]
    fn a_guard_is_read_from_its_status_file_at_every_scrape() {
        use lmcache_capacity_guard::capacity::guard_specs;
        use lmcache_capacity_guard::{Guard, GuardOptions};
        use lmcache_tier_spec::Cascade;

        let tmp = tempfile::tempdir().unwrap();
        let json = format!(
            r#"{{"type":"fs","base_path":"{}","max_capacity_gb":1}}"#,
            tmp.path().display()
        );
        let spec = guard_specs(&Cascade::parse(&json, "V").unwrap())
            .unwrap()
            .remove(0);
        let metrics = NodeMetrics::new(None);
        metrics.watch_guards([spec.clone()]);
        assert!(!metrics
            .render(Format::OpenMetrics)
            .unwrap()
            .contains("guard_"));
        let options = GuardOptions {
            owner: Some(metrics.guard_owner()),
            ..GuardOptions::default()
        };
        let guard = Guard::start(spec, options).unwrap();
        let started = std::time::Instant::now();
        while !metrics
            .render(Format::OpenMetrics)
            .unwrap()
            .contains("lmcache_tier_guard_capacity_bytes")
        {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no guard status"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let text = metrics.render(Format::OpenMetrics).unwrap();
        drop(guard);
        assert_eq!(
            sample(&text, r#"lmcache_tier_guard_capacity_bytes{tier="0"}"#),
            GIB as f64
        );
        assert_eq!(
            sample(&text, r#"lmcache_tier_guard_usage_bytes{tier="0"}"#),
            0.0
        );
        assert_eq!(
            sample(&text, r#"lmcache_tier_guard_evicted_bytes_total{tier="0"}"#),
            0.0
        );
        assert!(
            text.contains("# TYPE lmcache_tier_guard_rescans counter"),
            "{text}"
        );
        assert!(
            sample(
                &text,
                r#"lmcache_tier_guard_free_space_line_bytes{tier="0"}"#
            ) > 0.0
        );
        assert!(sample(&text, r#"lmcache_tier_guard_volume_free_bytes{tier="0"}"#) > 0.0);
        // The free inodes, on a volume that counts them (btrfs reports none).
        if nix::sys::statvfs::statvfs(tmp.path()).unwrap().files() > 0 {
            assert!(sample(&text, r#"lmcache_tier_guard_volume_free_inodes{tier="0"}"#) > 0.0);
            assert!(
                sample(
                    &text,
                    r#"lmcache_tier_guard_free_space_line_inodes{tier="0"}"#
                ) > 0.0
            );
        }
        assert_eq!(
            sample(
                &text,
                r#"lmcache_tier_guard_free_space_eviction_cycles_total{tier="0"}"#
            ),
            0.0
        );
    }

    /// Renders `metrics` until `done` holds for the page (a guard writes its
    /// status once it has counted its tier), or panics after 20 s.
    fn render_until(metrics: &NodeMetrics, done: impl Fn(&str) -> bool) -> String {
        let started = std::time::Instant::now();
        loop {
            let text = metrics.render(Format::OpenMetrics).unwrap();
            if done(&text) {
                return text;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn only_the_statuses_of_this_launchs_guards_are_served() {
        use lmcache_capacity_guard::capacity::guard_specs;
        use lmcache_capacity_guard::status::GUARD_STATUS_FILE_NAME;
        use lmcache_capacity_guard::{Guard, GuardOptions};
        use lmcache_tier_spec::Cascade;

        let tmp = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = (0..4).map(|i| tmp.path().join(format!("t{i}"))).collect();
        for dir in &dirs {
            std::fs::create_dir(dir).unwrap();
        }
        // Tiers 0 and 1 of 1 GiB, 2 of 2 GiB, 3 shared.
        let json = format!(
            r#"[{{"type":"fs","base_path":"{}","max_capacity_gb":1}},{{"type":"fs","base_path":"{}","max_capacity_gb":1}},{{"type":"fs","base_path":"{}","max_capacity_gb":2}},{{"type":"fs","base_path":"{}","max_capacity_gb":1,"shared":true}}]"#,
            dirs[0].display(),
            dirs[1].display(),
            dirs[2].display(),
            dirs[3].display()
        );
        let specs = guard_specs(&Cascade::parse(&json, "V").unwrap()).unwrap();
        let metrics = NodeMetrics::new(None);
        metrics.watch_guards(specs.clone());
        let ours = GuardOptions {
            owner: Some(metrics.guard_owner()),
            ..GuardOptions::default()
        };
        let _first = Guard::start(specs[0].clone(), ours.clone()).unwrap();
        let shared = Guard::start(specs[3].clone(), ours.clone()).unwrap();
        let tier = |t: usize| format!(r#"lmcache_tier_guard_capacity_bytes{{tier="{t}"}}"#);
        render_until(&metrics, |text| {
            text.contains(&tier(0)) && text.contains(&tier(3))
        });
        // What other launches left, each claiming tier 0 with other
        // figures: the status of an earlier launch in tier 1 (the same pid,
        // as a container's launch has at every start), and one written
        // before statuses named an owner in tier 2.
        let read = |dir: &PathBuf| {
            let bytes = std::fs::read(dir.join(GUARD_STATUS_FILE_NAME)).unwrap();
            serde_json::from_slice::<GuardStatus>(&bytes).unwrap()
        };
        let mut stale = read(&dirs[0]);
        stale.tier = 0;
        stale.capacity_bytes = 7 * GIB;
        stale.owner = Some("an earlier launch".into());
        let write = |dir: &PathBuf, json: serde_json::Value| {
            std::fs::write(dir.join(GUARD_STATUS_FILE_NAME), json.to_string()).unwrap()
        };
        write(&dirs[1], serde_json::to_value(&stale).unwrap());
        let mut ownerless = serde_json::to_value(&stale).unwrap();
        ownerless.as_object_mut().unwrap().remove("owner");
        write(&dirs[2], ownerless);
        let text = metrics.render(Format::OpenMetrics).unwrap();
        let series = |text: &str, name: &str| {
            let prefix = format!("lmcache_tier_{name}{{");
            text.lines().filter(|l| l.starts_with(&prefix)).count()
        };
        assert_eq!(series(&text, "guard_capacity_bytes"), 2, "{text}");
        assert_eq!(sample(&text, &tier(0)), GIB as f64, "{text}");
        assert!(
            !text.contains(&tier(1)) && !text.contains(&tier(2)),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                r#"lmcache_tier_guard_info{tier="0",following="inotify",shared="false"}"#
            ),
            1.0
        );
        assert_eq!(
            sample(
                &text,
                r#"lmcache_tier_guard_info{tier="3",following="inotify",shared="true"}"#
            ),
            1.0
        );
        // The shared tier's status replaced by a guard of another launch
        // (another node writing the same directory), once this launch's
        // guard there has stopped and written its last.
        drop(shared);
        let mut elsewhere = read(&dirs[3]);
        elsewhere.owner = Some("another node's launch".into());
        write(&dirs[3], serde_json::to_value(&elsewhere).unwrap());
        let text = metrics.render(Format::OpenMetrics).unwrap();
        assert_eq!(series(&text, "guard_capacity_bytes"), 1, "{text}");
        assert_eq!(series(&text, "guard_info"), 1, "{text}");
        // This launch's guard of tier 1 replaces the earlier launch's
        // status with its own.
        let _second = Guard::start(specs[1].clone(), ours).unwrap();
        let text = render_until(&metrics, |text| text.contains(&tier(1)));
        assert_eq!(sample(&text, &tier(1)), GIB as f64, "{text}");
        assert_eq!(series(&text, "guard_usage_bytes"), 2, "{text}");
    }

    #[test]
    fn the_format_follows_the_accept_media_ranges_and_their_quality() {
        let open = [
            vec!["application/openmetrics-text;version=1.0.0,text/plain;q=0.5"],
            vec!["APPLICATION/OPENMETRICS-TEXT"],
            vec!["text/plain", "application/openmetrics-text; q=0.3"],
        ];
        for accept in open {
            assert_eq!(
                Format::accepted(accept.clone()),
                Format::OpenMetrics,
                "{accept:?}"
            );
        }
        let plain = [
            vec![],
            vec!["*/*"],
            vec!["application/openmetrics-text;q=0, text/plain"],
            vec!["text/plain;version=0.0.4"],
        ];
        for accept in plain {
            assert_eq!(
                Format::accepted(accept.clone()),
                Format::Prometheus,
                "{accept:?}"
            );
        }
    }

    #[test]
    fn credential_sources_are_labelled_by_kind_without_paths_or_roles() {
        let kinds = [
            ("the tier's aws_access_key_id", "spec"),
            ("AWS_ACCESS_KEY_ID", "environment"),
            (
                "profile \"kv\" in /root/.aws/config and /root/.aws/credentials",
                "profile",
            ),
            (
                "web identity (role arn:aws:iam::123:role/r, token /var/run/t)",
                "web_identity",
            ),
            ("the ECS container endpoint", "container"),
            (
                "EC2 instance metadata at http://169.254.169.254",
                "instance_metadata",
            ),
            ("something new", "other"),
        ];
        for (source, kind) in kinds {
            assert_eq!(credential_kind(source), kind, "{source}");
        }
    }

    #[test]
    fn housekeeping_is_counted_by_reason() {
        use lmcache_housekeeping::{housekeep, LaunchIdentity, Mode, TierPolicy};
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("notes.txt"), "not ours").unwrap();
        let identity = LaunchIdentity {
            model: "m".into(),
            tensor_parallel_size: 1,
            pipeline_parallel_size: 1,
            kv_cache_dtype: "auto".into(),
            block_size: 16,
            chunk_size: 256,
            decode_context_parallel_size: 1,
            cp_kv_cache_interleave_size: 1,
            mla_only: false,
        };
        let done = housekeep(tmp.path(), &identity, TierPolicy::default(), Mode::Apply).unwrap();
        let metrics = NodeMetrics::new(Some(&a_plan()));
        metrics.housekept(&done.report, Duration::from_millis(1500));
        let text = metrics.render(Format::OpenMetrics).unwrap();
        assert_eq!(
            sample(&text, "lmcache_tier_housekeeping_foreign_entries"),
            1.0
        );
        assert_eq!(sample(&text, "lmcache_tier_housekeeping_kept_objects"), 0.0);
        assert_eq!(
            sample(&text, "lmcache_tier_housekeeping_duration_seconds"),
            1.5
        );
        assert!(
            sample(
                &text,
                "lmcache_tier_housekeeping_last_run_timestamp_seconds"
            ) > 1.7e9
        );
        assert_eq!(
            sample(&text, "lmcache_tier_housekeeping_identity_purge"),
            0.0
        );
    }

    #[test]
    fn a_purge_of_most_of_the_tier_by_identity_is_flagged_with_its_fields() {
        use lmcache_housekeeping::{housekeep, Mode, TierPolicy};
        let tmp = tempfile::tempdir().unwrap();
        let name = format!("-SEP-models-SEP-m@0x01000100@0@{}.data", "ab".repeat(32));
        std::fs::write(tmp.path().join(name), vec![1u8; 8192]).unwrap();
        let identity = EngineFacts {
            model: "m".into(),
            ..EngineFacts::default()
        }
        .launch_identity(256);
        let done = housekeep(tmp.path(), &identity, TierPolicy::default(), Mode::Apply).unwrap();
        let metrics = NodeMetrics::new(Some(&a_plan()));
        metrics.housekept(&done.report, Duration::from_millis(10));
        let text = metrics.render(Format::OpenMetrics).unwrap();
        assert_eq!(
            sample(&text, "lmcache_tier_housekeeping_identity_purge"),
            1.0
        );
        assert_eq!(
            sample(
                &text,
                r#"lmcache_tier_housekeeping_identity_change{field="model",stored="/models/m",current="m"}"#
            ),
            1.0,
            "{text}"
        );
    }

    /// A gateway's state on `tier` whose answers fell `per_bucket` into the
    /// buckets of [`ANSWER_SECONDS_BOUNDS`] and `over` above the last, for
    /// `sum` seconds in all.
    fn answered(tier: usize, per_bucket: &[u64], over: u64, sum: f64) -> GatewayState {
        use lmcache_s3_gateway::state::{Histogram, ANSWER_SECONDS_BOUNDS};
        let mut running = 0;
        let cumulative = ANSWER_SECONDS_BOUNDS
            .iter()
            .enumerate()
            .map(|(i, _)| {
                running += per_bucket.get(i).copied().unwrap_or(0);
                running
            })
            .collect();
        GatewayState {
            tier,
            bucket: "kv".into(),
            key_prefix: String::new(),
            upstream: "http://127.0.0.1:9".into(),
            region: "r".into(),
            credential_source: "the tier's aws_access_key_id".into(),
            started_at: "2026-12-01T00:00:00Z".into(),
            requests: Default::default(),
            rejected: 0,
            upstream_errors: 0,
            upstream_unreachable: 0,
            bytes_up: 0,
            bytes_down: 0,
            last_upstream_error: None,
            answers: Default::default(),
            rejected_by_reason: Default::default(),
            answer_seconds: Histogram {
                bounds: ANSWER_SECONDS_BOUNDS.to_vec(),
                cumulative,
                sum,
                count: running + over,
            },
            credential_expiry_unix: None,
            peer_refused: 0,
            client_upload_failures: Default::default(),
            upstream_denied: 0,
            last_upstream_denied: None,
            bucket_bound: None,
        }
    }

    /// The gateway families of `states` in `format`, as a scrape renders
    /// them.
    fn gateway_page(states: Vec<GatewayState>, format: Format) -> String {
        #[derive(Debug)]
        struct States(Vec<GatewayState>);
        impl Collector for States {
            fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
                encode_gateways(&mut encoder, &self.0)
            }
        }
        let mut registry = Registry::with_prefix(PREFIX);
        registry.register_collector(Box::new(States(states)));
        let mut text = String::new();
        match format {
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut text, &registry).unwrap()
            }
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap()
            }
        }
        text
    }

    /// The `le` bound and value of each bucket of the answer histogram of
    /// `tier` in `text`, in order.
    fn answer_buckets(text: &str, tier: usize) -> Vec<(String, f64)> {
        let tier = format!("tier=\"{tier}\"");
        text.lines()
            .filter_map(|line| {
                let rest =
                    line.strip_prefix("lmcache_tier_gateway_answer_duration_seconds_bucket{")?;
                let (labels, value) = rest.split_once("} ")?;
                let labels: Vec<&str> = labels.split(',').collect();
                if !labels.contains(&tier.as_str()) {
                    return None;
                }
                let le = labels.iter().find_map(|l| l.strip_prefix("le=\""))?;
                Some((le.trim_end_matches('"').to_string(), value.parse().unwrap()))
            })
            .collect()
    }

    #[test]
    fn the_answer_histogram_carries_the_gateways_own_counts_in_both_formats() {
        use lmcache_s3_gateway::state::ANSWER_SECONDS_BOUNDS;
        // 1 answer within 1 ms, 2 within 5 ms, 3 within 0.5 s, 1 within
        // 10 s and 2 over 30 s; a second gateway with none; a third
        // whose count lags its buckets (a state read back from elsewhere).
        let busy = answered(1, &[1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1], 2, 75.5);
        let idle = answered(2, &[], 0, 0.0);
        let mut lagging = answered(3, &[4], 0, 0.004);
        lagging.answer_seconds.count = 3;
        let states = vec![busy.clone(), idle.clone(), lagging];
        for format in [Format::OpenMetrics, Format::Prometheus] {
            let text = gateway_page(states.clone(), format);
            for state in [&busy, &idle] {
                let h = &state.answer_seconds;
                let buckets = answer_buckets(&text, state.tier);
                let mut expected: Vec<f64> = h.cumulative.iter().map(|&n| n as f64).collect();
                expected.push(h.count as f64);
                let values: Vec<f64> = buckets.iter().map(|(_, v)| *v).collect();
                assert_eq!(values, expected, "{format:?}, tier {}:\n{text}", state.tier);
                assert_eq!(buckets.len(), ANSWER_SECONDS_BOUNDS.len() + 1);
                assert_eq!(buckets.last().unwrap().0, "+Inf");
                let series = |suffix: &str| {
                    format!(
                        "lmcache_tier_gateway_answer_duration_seconds_{suffix}{{tier=\"{}\"}}",
                        state.tier
                    )
                };
                assert_eq!(sample(&text, &series("count")), h.count as f64);
                assert_eq!(sample(&text, &series("sum")), h.sum);
            }
            let lagging = answer_buckets(&text, 3);
            assert_eq!(lagging.last().unwrap().1, 4.0, "{text}");
            assert!(lagging.windows(2).all(|w| w[0].1 <= w[1].1), "{text}");
            let count = r#"lmcache_tier_gateway_answer_duration_seconds_count{tier="3"}"#;
            assert_eq!(sample(&text, count), 4.0);
        }
    }

    #[test]
    fn a_gateway_with_a_bucket_bound_has_its_families_and_one_without_has_none() {
        use lmcache_s3_gateway::bound::{BoundRole, BoundSpec, BoundState};
        let mut bounded = answered(1, &[], 0, 0.0);
        bounded.bucket_bound = Some(BoundState {
            spec: BoundSpec::new(GIB, 0.8, 0.2, BoundRole::HardBound),
            usage_bytes: 900 << 20,
            objects: 28,
            listings: 5,
            listing_pages: 6,
            listing_failures: 1,
            last_listing_millis: 250,
            last_listing_unix: 1_800_000_000,
            others_added_objects: 9,
            others_added_bytes: 288 << 20,
            evicted_objects: 7,
            evicted_bytes: 224 << 20,
            eviction_failures: 0,
        });
        let plain = answered(2, &[], 0, 0.0);
        for format in [Format::OpenMetrics, Format::Prometheus] {
            let text = gateway_page(vec![bounded.clone(), plain.clone()], format);
            let total = |name: &str| format!("lmcache_tier_{name}_total{{tier=\"1\"}}");
            let gauge = |name: &str| format!("lmcache_tier_{name}{{tier=\"1\"}}");
            assert_eq!(
                sample(&text, &gauge("gateway_bucket_usage_bytes")),
                (900u64 << 20) as f64
            );
            assert_eq!(
                sample(&text, &gauge("gateway_bucket_capacity_bytes")),
                GIB as f64
            );
            assert_eq!(sample(&text, &total("gateway_bucket_evicted_objects")), 7.0);
            assert_eq!(sample(&text, &total("gateway_bucket_list_requests")), 6.0);
            assert_eq!(
                sample(&text, &total("gateway_bucket_others_added_bytes")),
                (288u64 << 20) as f64
            );
            assert_eq!(
                sample(
                    &text,
                    &gauge("gateway_bucket_last_listing_duration_seconds")
                ),
                0.25
            );
            assert!(
                !text.contains("gateway_bucket_usage_bytes{tier=\"2\"}"),
                "{text}"
            );
        }
    }
}
