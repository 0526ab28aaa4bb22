//! The server's families: starts, restarts, exits by cause, liveness and
//! engine workers, set from the launch's starts and liveness events
//! (`docs/metrics.md`, "The server").

use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::names;
use crate::status::events::{Event, ExitCause, LossCause};

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
    pub(super) fn register(registry: &mut Registry) -> Self {
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
        server.register_families(registry);
        server.zero_series();
        server
    }

    /// Registers each family in `registry`.
    fn register_families(&self, registry: &mut Registry) {
        registry.register(
            names::SERVER_UP.name,
            "1 while the LMCache server answers /status healthily",
            self.up.clone(),
        );
        registry.register(
            names::SERVER_STARTS.name,
            "Starts of the LMCache server",
            self.starts.clone(),
        );
        registry.register(
            names::SERVER_RESTARTS.name,
            "Restarts of the LMCache server after it ended",
            self.restarts.clone(),
        );
        registry.register(
            names::SERVER_EXITS.name,
            "Ends of the LMCache server process by cause (status, signal, oom_kill, unresponsive)",
            self.exits.clone(),
        );
        registry.register(
            names::SERVER_LIVENESS.name,
            "1 for the server's liveness state now (starting, ready, unhealthy, unresponsive, exited)",
            self.liveness.clone(),
        );
        registry.register(
            names::ENGINE_WORKERS.name,
            "Engine workers attached to the server (worker_liveness.tracked_instances)",
            self.workers.clone(),
        );
        registry.register(
            names::ENGINE_WORKERS_LOST.name,
            "Engine workers lost by cause: reaped (silent while the server answered), server_restarted (not back after a restart)",
            self.workers_lost.clone(),
        );
        registry.register(
            names::ENGINE_WORKERS_DETACHED.name,
            "Engine workers that unregistered cleanly",
            self.workers_detached.clone(),
        );
        registry.register_with_unit(
            names::SERVER_READY.name,
            "Seconds from the last start to the first healthy /status",
            Unit::Seconds,
            self.ready_seconds.clone(),
        );
    }

    /// Gives each labelled family its series at 0 (or off), so that
    /// `increase()` sees the first count.
    fn zero_series(&self) {
        for cause in ExitCause::ALL {
            let labels = ExitLabels {
                cause: cause.as_str(),
            };
            self.exits.get_or_create(&labels).inc_by(0);
        }
        for cause in LossCause::ALL {
            let labels = LossLabels {
                cause: cause.as_str(),
            };
            self.workers_lost.get_or_create(&labels).inc_by(0);
        }
        for state in LIVENESS {
            let labels = StateLabels {
                state: state.to_string(),
            };
            self.liveness.get_or_create(&labels).set(0);
        }
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

#[cfg(test)]
mod tests {
    use super::super::test_support::sample;
    use super::super::{Format, NodeMetrics};
    use crate::status::events::{Event, LossCause};
    use std::time::Duration;

    #[test]
    fn starts_events_and_exits_are_counted_by_cause() {
        use crate::status::oom::OomReading;
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
            crate::status::events::Silence {
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
}
