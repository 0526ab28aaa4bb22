//! The liveness watcher: polls the server's `/status` and turns what it sees
//! into [`Event`]s the agent subscribes to.
//!
//! Why: a server that still answers HTTP but has silently lost its engine
//! workers needs the engine restarted (`docs/inspect.md`); the watcher
//! reports that as [`Event::WorkersLost`], and a clean unregistration (an
//! engine that shut down and said so) as [`Event::WorkersDetached`].
//! LMCache 0.5.6's engine workers do not register again with a restarted
//! server (the engine has to restart), so workers of a previous start that
//! are not back within the reap grace are lost too
//! ([`LossCause::ServerRestarted`]). How the server ended is
//! [`Event::Exited`], its [`ExitCause`](crate::status::events::ExitCause) told from the kernel's own count of
//! OOM kills ([`crate::status::oom`]), never from the signal alone.
//!
//! [`Watcher`] is the state machine, fed one [`Poll`] at a time and the time
//! since the server was ready ([`Watcher::elapsed`]), unit-tested on
//! recorded bodies; [`spawn`] runs it on a tokio task and sends events on a
//! channel. [`crate::run::launch::run_with_events`] runs it beside the server it
//! supervises, adds [`Event::Exited`], and restarts a server that stays
//! unresponsive ([`WatchConfig::restart_unresponsive_after`]).

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::status::events::{Event, LossCause, Silence};
use crate::status::{Poll, ReaperRun, StatusClient, WorkerLiveness};

/// The default of [`WatchConfig::restart_unresponsive_after`] and of
/// `lmcache-tier launch --unresponsive-timeout`: 120 s, LMCache's default
/// reap timeout, 30 polls of a frozen server (`docs/inspect.md`, "A frozen
/// server" justifies the figure).
pub const UNRESPONSIVE_TIMEOUT: Duration = Duration::from_secs(120);

/// How the watcher polls and when it reports. Defaults: see each field.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchConfig {
    /// Time between polls once the server is ready. Default 2 s.
    pub interval: Duration,
    /// Time between polls until the first 200 answer. Default 0.5 s: start-up
    /// takes 20-25 s on a small host and readiness should be seen promptly.
    pub startup_interval: Duration,
    /// Per-request timeout. Default 2 s ([`crate::status::REQUEST_TIMEOUT`]).
    pub request_timeout: Duration,
    /// Polls in a row with a non-200 answer, an unusable body or a reported
    /// `is_healthy: false` before [`Event::Unhealthy`]. Default 3 (6 s).
    pub unhealthy_after: u32,
    /// Polls in a row without an HTTP answer before [`Event::Unresponsive`].
    /// Default 3 (6 s plus the timeouts).
    pub unresponsive_after: u32,
    /// Engine workers the node expects (TP x PP x DP ranks that register).
    /// With `Some(n)`, [`Event::WorkersAttached`] is sent once `n` or more
    /// are attached instead of on every rise. Default `None`.
    pub expected_workers: Option<u64>,
    /// How long a server that was ready may give no HTTP answer at all,
    /// counted from the first poll that got none, before the launch stops
    /// it and starts it again under its restart policy; `None`: never.
    /// Default [`UNRESPONSIVE_TIMEOUT`] (120 s). Only a supervising launch
    /// acts on it ([`Watcher::unresponsive_too_long`]); [`spawn`] cannot.
    pub restart_unresponsive_after: Option<Duration>,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            interval: Duration::from_secs(2),
            startup_interval: Duration::from_millis(500),
            request_timeout: crate::status::REQUEST_TIMEOUT,
            unhealthy_after: 3,
            unresponsive_after: 3,
            expected_workers: None,
            restart_unresponsive_after: Some(UNRESPONSIVE_TIMEOUT),
        }
    }
}

/// The watcher's state machine: feed it every poll with [`Watcher::observe`],
/// and, once the server is ready, the time since with [`Watcher::elapsed`].
///
/// Before the first 200 answer the server is starting: 503s and refused
/// connections are expected then and report nothing.
#[derive(Debug, Clone)]
pub struct Watcher {
    config: WatchConfig,
    ready: bool,
    attached: u64,
    announced: u64,
    departures: Departures,
    bad_answers: u32,
    no_answers: u32,
    degraded: bool,
    /// Workers of the previous start still awaited; `None` once they are
    /// back, reported lost, or when there were none.
    rejoin: Option<Rejoin>,
    /// The time since ready last given to [`Watcher::elapsed`].
    since_ready: Option<Duration>,
    /// The time since ready at which [`Watcher::elapsed`] first saw the
    /// current streak of polls without an HTTP answer.
    silent_since: Option<Duration>,
}

/// Workers attached when the previous start ended, awaited at this one
/// (`docs/inspect.md`, "Workers a restart loses").
#[derive(Debug, Clone, Copy)]
struct Rejoin {
    /// Workers attached to the previous start when it ended.
    before: u64,
    /// The most workers seen attached to this start so far.
    back: u64,
    /// How long after Ready they may take.
    grace: Duration,
}

impl Watcher {
    /// A watcher of a server that has just started.
    pub fn new(config: WatchConfig) -> Self {
        Watcher {
            config,
            ready: false,
            attached: 0,
            announced: 0,
            departures: Departures::default(),
            bad_answers: 0,
            no_answers: 0,
            degraded: false,
            rejoin: None,
            since_ready: None,
            silent_since: None,
        }
    }

    /// A watcher of a server started again after a start that ended with
    /// `workers` engine workers to account for
    /// ([`Watcher::workers_to_carry`] of the previous watcher). Those not
    /// attached again within `grace` after Ready (the reap grace: the
    /// server's `--worker-reap-timeout-seconds`, else
    /// [`LMCACHE_REAP_TIMEOUT`](crate::plan::launch_plan::LMCACHE_REAP_TIMEOUT)) are reported as [`Event::WorkersLost`]
    /// with [`LossCause::ServerRestarted`] by [`Watcher::elapsed`].
    pub fn restarted(config: WatchConfig, workers: u64, grace: Duration) -> Self {
        let mut watcher = Watcher::new(config);
        watcher.rejoin = (workers > 0).then_some(Rejoin {
            before: workers,
            back: 0,
            grace,
        });
        watcher
    }

    /// The engine workers a restart after this start has to wait for: the
    /// workers attached as last seen, or, while workers of an earlier start
    /// are still awaited within their grace, that larger count.
    pub fn workers_to_carry(&self) -> u64 {
        let awaited = self.rejoin.map_or(0, |r| r.before);
        awaited.max(self.attached)
    }

    /// Tells the watcher that `since_ready` has passed since the server was
    /// ready (the supervise loop calls it after every poll; before Ready it
    /// does nothing). Returns the [`Event::WorkersLost`] of the workers of
    /// the previous start that are not back once the grace has passed, and
    /// keeps the time for [`Watcher::unresponsive_too_long`].
    pub fn elapsed(&mut self, since_ready: Duration) -> Vec<Event> {
        let mut events = Vec::new();
        if !self.ready {
            return events;
        }
        self.since_ready = Some(since_ready);
        if self.no_answers > 0 {
            self.silent_since.get_or_insert(since_ready);
        }
        if let Some(rejoin) = self.rejoin.filter(|r| since_ready >= r.grace) {
            self.rejoin = None;
            events.push(Event::WorkersLost {
                before: rejoin.before,
                now: rejoin.back,
                cause: LossCause::ServerRestarted,
            });
        }
        events
    }

    /// How long the server has given no HTTP answer, counted from the
    /// [`Watcher::elapsed`] call that first saw the streak, once that is
    /// [`WatchConfig::restart_unresponsive_after`] or more: the launch then
    /// stops the server and starts it again. `None` otherwise, and always
    /// when that setting is `None`.
    pub fn unresponsive_too_long(&self) -> Option<Silence> {
        let limit = self.config.restart_unresponsive_after?;
        let silent = self.since_ready?.saturating_sub(self.silent_since?);
        (silent >= limit).then_some(Silence { silent, limit })
    }

    /// Whether `/status` has answered 200 since the start.
    pub(crate) fn is_ready(&self) -> bool {
        self.ready
    }

    /// The time to wait before the next poll.
    pub(crate) fn next_interval(&self) -> Duration {
        if self.ready {
            self.config.interval
        } else {
            self.config.startup_interval
        }
    }

    /// Engine workers attached as last seen.
    pub fn attached(&self) -> u64 {
        self.attached
    }

    /// The events one poll causes, in order.
    pub fn observe(&mut self, poll: &Poll) -> Vec<Event> {
        let mut events = Vec::new();
        let bad_answer = match poll {
            Poll::Up(status) => {
                if !self.ready {
                    self.ready = true;
                    events.push(Event::Ready);
                }
                self.no_answers = 0;
                if let Some(liveness) = &status.worker_liveness {
                    self.workers(liveness, &mut events);
                }
                let parts = status.unhealthy_parts();
                (!parts.is_empty()).then(|| format!("is_healthy false in {}", parts.join(", ")))
            }
            _ if !self.ready => return events,
            Poll::Malformed(_) | Poll::NotReady(_) => Some(poll.describe()),
            Poll::NoAnswer(error) => {
                self.bad_answers = 0;
                self.no_answers += 1;
                if self.no_answers == self.config.unresponsive_after {
                    self.degraded = true;
                    events.push(Event::Unresponsive {
                        polls: self.no_answers,
                        error: error.clone(),
                    });
                }
                return events;
            }
        };
        self.no_answers = 0;
        self.silent_since = None;
        match bad_answer {
            Some(reason) => {
                self.bad_answers += 1;
                if self.bad_answers == self.config.unhealthy_after {
                    self.degraded = true;
                    events.push(Event::Unhealthy {
                        polls: self.bad_answers,
                        reason,
                    });
                }
            }
            None => {
                self.bad_answers = 0;
                if std::mem::take(&mut self.degraded) {
                    events.push(Event::Recovered);
                }
            }
        }
        events
    }

    fn workers(&mut self, liveness: &WorkerLiveness, events: &mut Vec<Event>) {
        let Some(now) = liveness.tracked_instances else {
            return;
        };
        self.departures.count_reaps(liveness.reaper);
        if now < self.attached {
            self.departures.fell(self.attached, now);
            self.attached = now;
            self.announced = self.announced.min(now);
        }
        self.departures.settle(liveness, events);
        if let Some(rejoin) = &mut self.rejoin {
            rejoin.back = rejoin.back.max(now);
            if rejoin.back >= rejoin.before {
                self.rejoin = None;
            }
        }
        if now > self.attached {
            self.attached = now;
            let enough = self.config.expected_workers.is_none_or(|n| now >= n);
            if enough && now > self.announced {
                self.announced = now;
                events.push(Event::WorkersAttached { count: now });
            }
        }
    }
}

/// Workers gone and not yet reported: how the watcher tells a reaped worker
/// from a detached one. LMCache 0.5.6 lowers `tracked_instances` both when a
/// worker unregisters and when its reaper drops a silent one; only the
/// reaper's run summary (`reaped=N`) tells them apart. A poll reads
/// `/status` and then the reaper's route, so a reap may show in either
/// first: a fall the reaper has not explained waits one poll for it, and a
/// reap no fall has matched is forgotten after one poll.
#[derive(Debug, Clone, Default)]
struct Departures {
    /// The reaper's `total_runs` at the last poll that read it.
    reaper_runs: Option<u64>,
    /// Workers the reaper reaped that no fall has matched yet, and whether
    /// they have already waited a poll.
    reaped: (u64, bool),
    /// A fall not reported yet.
    pending: Option<Fall>,
}

/// A fall in `tracked_instances` not reported yet.
#[derive(Debug, Clone, Copy)]
struct Fall {
    /// Workers attached before it.
    before: u64,
    /// Workers gone since.
    gone: u64,
    /// Whether it has already waited a poll for the reaper.
    waited: bool,
}

impl Departures {
    /// Adds the workers the reaper's newer runs reaped. The reaper runs
    /// every 7.5 s or more and the watcher polls every 2 s, so it normally
    /// sees every run; when it did not (more than one new run, as after
    /// polls without an answer), or the new run's summary is not
    /// `reaped=N` (a run that failed), what was reaped is unknown, and any
    /// fall it could explain counts as reaped: the safe side.
    fn count_reaps(&mut self, run: Option<ReaperRun>) {
        let Some(run) = run else { return };
        let Some(previous) = self.reaper_runs.replace(run.total_runs) else {
            return;
        };
        let reaped = match (run.total_runs.checked_sub(previous), run.reaped) {
            (None | Some(0), _) => return,
            (Some(1), Some(n)) => n,
            _ => u64::MAX,
        };
        if reaped > 0 {
            self.reaped = (self.reaped.0.saturating_add(reaped), false);
        }
    }

    /// `tracked_instances` fell from `before` to `now`.
    fn fell(&mut self, before: u64, now: u64) {
        let fall = self.pending.get_or_insert(Fall {
            before,
            gone: 0,
            waited: false,
        });
        fall.gone += before - now;
        fall.waited = false;
    }

    /// Reports the pending fall once it is explained, or has waited a poll:
    /// the reaped part as [`Event::WorkersLost`], the rest as
    /// [`Event::WorkersDetached`].
    fn settle(&mut self, liveness: &WorkerLiveness, events: &mut Vec<Event>) {
        let Some(fall) = self.pending else {
            self.forget_old_reaps();
            return;
        };
        let reaping = liveness.enabled != Some(false);
        let lost = match (reaping, liveness.reaper) {
            (false, _) => 0,
            (true, None) => fall.gone,
            (true, Some(_)) => fall.gone.min(self.reaped.0),
        };
        if lost < fall.gone && reaping && !fall.waited {
            self.pending = Some(Fall {
                waited: true,
                ..fall
            });
            return;
        }
        self.pending = None;
        self.reaped.0 = self.reaped.0.saturating_sub(lost);
        if lost > 0 {
            events.push(Event::WorkersLost {
                before: fall.before,
                now: fall.before - lost,
                cause: LossCause::Reaped,
            });
        }
        if lost < fall.gone {
            events.push(Event::WorkersDetached {
                before: fall.before - lost,
                now: fall.before - fall.gone,
            });
        }
    }

    /// Drops reaps that no fall matched within a poll.
    fn forget_old_reaps(&mut self) {
        self.reaped = match self.reaped {
            (0, _) | (_, true) => (0, false),
            (n, false) => (n, true),
        };
    }
}

/// Watches `client`'s server on a new tokio task until the receiver is
/// dropped: polls at the configured intervals and sends every event. It
/// cannot see the process, so it never sends [`Event::Exited`]; a server that
/// goes away shows as [`Event::Unresponsive`].
pub fn spawn(client: StatusClient, config: WatchConfig) -> (mpsc::Receiver<Event>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(64);
    let task = tokio::spawn(async move {
        let mut watcher = Watcher::new(config);
        loop {
            let poll = client.poll().await;
            for event in watcher.observe(&poll) {
                if tx.send(event).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                _ = tx.closed() => return,
                _ = tokio::time::sleep(watcher.next_interval()) => {}
            }
        }
    });
    (rx, task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::fixture;
    use crate::status::ServerStatus;

    fn up(name: &str) -> Poll {
        Poll::Up(Box::new(ServerStatus::parse(&fixture(name)).unwrap()))
    }

    fn idle() -> Poll {
        up("status-idle.json")
    }

    fn attached() -> Poll {
        up("status-worker-attached.json")
    }

    fn reaped() -> Poll {
        up("status-worker-reaped.json")
    }

    fn run(watcher: &mut Watcher, polls: &[Poll]) -> Vec<Event> {
        polls.iter().flat_map(|p| watcher.observe(p)).collect()
    }

    fn refused() -> Poll {
        Poll::NoAnswer("connection refused".into())
    }

    fn lost(before: u64, now: u64) -> Event {
        Event::WorkersLost {
            before,
            now,
            cause: LossCause::Reaped,
        }
    }

    #[test]
    fn start_up_noise_is_silent_until_the_first_answer() {
        let mut w = Watcher::new(WatchConfig::default());
        let events = run(
            &mut w,
            &[
                refused(),
                refused(),
                refused(),
                Poll::NotReady(503),
                Poll::NotReady(503),
                Poll::NotReady(503),
            ],
        );
        assert!(events.is_empty(), "{events:?}");
        assert!(!w.is_ready());
        assert_eq!(w.next_interval(), Duration::from_millis(500));
        assert_eq!(run(&mut w, &[idle()]), [Event::Ready]);
        assert_eq!(w.next_interval(), Duration::from_secs(2));
    }

    /// The recorded bodies carry no reaper run: a fall that cannot be
    /// explained with reaping on is reported as a loss.
    #[test]
    fn a_worker_that_is_reaped_while_the_server_answers_is_lost() {
        let mut w = Watcher::new(WatchConfig::default());
        let events = run(
            &mut w,
            &[idle(), attached(), attached(), reaped(), reaped()],
        );
        assert_eq!(
            events,
            [
                Event::Ready,
                Event::WorkersAttached { count: 1 },
                lost(1, 0),
            ]
        );
        assert_eq!(
            run(&mut w, &[attached()]),
            [Event::WorkersAttached { count: 1 }]
        );
    }

    /// A recorded body with `tracked` workers, reaping on, and the reaper's
    /// last run as `runs` runs of which the last reaped `reaped`.
    fn with_reaper(tracked: u64, runs: u64, reaped: u64) -> Poll {
        let mut status = ServerStatus::parse(&fixture("status-worker-attached.json")).unwrap();
        let liveness = status.worker_liveness.as_mut().unwrap();
        assert_eq!(liveness.enabled, Some(true));
        liveness.tracked_instances = Some(tracked);
        liveness.reaper = Some(ReaperRun {
            total_runs: runs,
            reaped: Some(reaped),
        });
        Poll::Up(Box::new(status))
    }

    #[test]
    fn a_fall_after_reaper_runs_the_watcher_missed_is_a_loss() {
        let mut w = Watcher::new(WatchConfig::default());
        run(&mut w, &[with_reaper(0, 5, 0), with_reaper(1, 5, 0)]);
        let mut events = run(&mut w, &[refused(), refused(), refused(), refused()]);
        events.extend(run(&mut w, &[with_reaper(0, 7, 0), with_reaper(0, 7, 0)]));
        assert!(events.contains(&lost(1, 0)), "{events:?}");
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, Event::WorkersDetached { .. })),
            "{events:?}"
        );
    }

    #[test]
    fn a_fall_with_a_reaper_run_whose_summary_is_unreadable_is_a_loss() {
        let mut w = Watcher::new(WatchConfig::default());
        run(&mut w, &[with_reaper(0, 5, 0), with_reaper(1, 5, 0)]);
        let mut failed = with_reaper(0, 6, 0);
        if let Poll::Up(status) = &mut failed {
            status.worker_liveness.as_mut().unwrap().reaper = Some(ReaperRun {
                total_runs: 6,
                reaped: None,
            });
        }
        assert_eq!(run(&mut w, &[failed.clone(), failed]), [lost(1, 0)]);
    }

    #[test]
    fn a_fall_no_reaper_run_explains_is_a_clean_detach_after_one_poll() {
        let mut w = Watcher::new(WatchConfig::default());
        let events = run(
            &mut w,
            &[
                with_reaper(0, 5, 0),
                with_reaper(1, 5, 0),
                with_reaper(1, 6, 0),
            ],
        );
        assert_eq!(events, [Event::Ready, Event::WorkersAttached { count: 1 }]);
        assert!(run(&mut w, &[with_reaper(0, 6, 0)]).is_empty());
        assert_eq!(
            run(&mut w, &[with_reaper(0, 7, 0)]),
            [Event::WorkersDetached { before: 1, now: 0 }]
        );
        assert!(run(&mut w, &[with_reaper(0, 8, 0)]).is_empty());
    }

    #[test]
    fn a_reap_is_a_loss_whether_it_shows_with_the_fall_or_a_poll_before_or_after() {
        let attach = [with_reaper(0, 5, 0), with_reaper(1, 5, 0)];
        let orders: [&[Poll]; 3] = [
            &[with_reaper(0, 6, 1)],
            &[with_reaper(1, 6, 1), with_reaper(0, 6, 1)],
            &[with_reaper(0, 5, 0), with_reaper(0, 6, 1)],
        ];
        for polls in orders {
            let mut w = Watcher::new(WatchConfig::default());
            run(&mut w, &attach);
            assert_eq!(run(&mut w, polls), [lost(1, 0)], "{polls:?}");
        }
    }

    #[test]
    fn one_reaped_and_one_detached_worker_are_told_apart() {
        let mut w = Watcher::new(WatchConfig::default());
        run(&mut w, &[with_reaper(0, 5, 0), with_reaper(2, 5, 0)]);
        assert!(run(&mut w, &[with_reaper(0, 6, 1)]).is_empty());
        assert_eq!(
            run(&mut w, &[with_reaper(0, 6, 1)]),
            [lost(2, 1), Event::WorkersDetached { before: 1, now: 0 },]
        );
    }

    #[test]
    fn a_reap_no_fall_matches_is_forgotten_after_a_poll() {
        let mut w = Watcher::new(WatchConfig::default());
        run(&mut w, &[with_reaper(0, 5, 0), with_reaper(1, 5, 0)]);
        assert!(run(&mut w, &[with_reaper(1, 6, 1), with_reaper(1, 6, 1)]).is_empty());
        let events = run(&mut w, &[with_reaper(0, 6, 1), with_reaper(0, 7, 0)]);
        assert_eq!(events, [Event::WorkersDetached { before: 1, now: 0 }]);
    }

    #[test]
    fn with_reaping_off_every_fall_is_a_detach_at_once() {
        let off = |n: u64| {
            let body =
                format!(r#"{{"worker_liveness":{{"enabled":false,"tracked_instances":{n}}}}}"#);
            Poll::Up(Box::new(ServerStatus::parse(body.as_bytes()).unwrap()))
        };
        let mut w = Watcher::new(WatchConfig::default());
        run(&mut w, &[off(0), off(3)]);
        assert_eq!(
            run(&mut w, &[off(1)]),
            [Event::WorkersDetached { before: 3, now: 1 }]
        );
    }

    #[test]
    fn with_an_expected_count_attachment_is_reported_once_complete() {
        let two = Poll::Up(Box::new(
            ServerStatus::parse(br#"{"worker_liveness":{"tracked_instances":2}}"#).unwrap(),
        ));
        let mut w = Watcher::new(WatchConfig {
            expected_workers: Some(2),
            ..WatchConfig::default()
        });
        assert_eq!(run(&mut w, &[idle(), attached()]), [Event::Ready]);
        assert_eq!(
            run(&mut w, std::slice::from_ref(&two)),
            [Event::WorkersAttached { count: 2 }]
        );
        assert_eq!(run(&mut w, &[attached()]), [lost(2, 1)]);
        assert_eq!(run(&mut w, &[two]), [Event::WorkersAttached { count: 2 }]);
    }

    #[test]
    fn a_body_without_worker_liveness_changes_no_worker_state() {
        let mut w = Watcher::new(WatchConfig::default());
        let bare = Poll::Up(Box::new(ServerStatus::parse(b"{}").unwrap()));
        let events = run(&mut w, &[idle(), attached(), bare.clone(), bare]);
        assert_eq!(events, [Event::Ready, Event::WorkersAttached { count: 1 }]);
        assert_eq!(w.attached(), 1);
    }

    #[test]
    fn malformed_bodies_and_503s_count_towards_unhealthy_once_per_streak() {
        let mut w = Watcher::new(WatchConfig::default());
        let garbage =
            |text: &[u8]| Poll::Malformed(ServerStatus::parse(text).unwrap_err().to_string());
        let events = run(
            &mut w,
            &[
                idle(),
                garbage(b"<html>oops"),
                Poll::NotReady(503),
                garbage(b"[]"),
                garbage(b"null"),
                Poll::NotReady(500),
            ],
        );
        assert_eq!(events.len(), 2, "{events:?}");
        match &events[1] {
            Event::Unhealthy { polls: 3, reason } => assert!(reason.contains("array"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(run(&mut w, &[idle()]), [Event::Recovered]);
        assert!(run(&mut w, &[idle()]).is_empty());
    }

    #[test]
    fn is_healthy_false_is_unhealthy_and_names_the_part() {
        let sick = Poll::Up(Box::new(
            ServerStatus::parse(
                br#"{"is_healthy":false,"storage_manager":{"l2_adapters":[{"type":"S3L2Adapter","is_healthy":false}]}}"#,
            )
            .unwrap(),
        ));
        let mut w = Watcher::new(WatchConfig {
            unhealthy_after: 2,
            ..WatchConfig::default()
        });
        let events = run(&mut w, &[idle(), sick.clone(), idle(), sick.clone(), sick]);
        assert_eq!(events.len(), 2, "{events:?}");
        match &events[1] {
            Event::Unhealthy { polls: 2, reason } => {
                assert!(
                    reason.contains("server") && reason.contains("S3L2Adapter"),
                    "{reason}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_answer_after_ready_is_unresponsive_and_an_answer_recovers() {
        let mut w = Watcher::new(WatchConfig::default());
        let events = run(
            &mut w,
            &[idle(), refused(), refused(), refused(), refused()],
        );
        assert_eq!(
            events,
            [
                Event::Ready,
                Event::Unresponsive {
                    polls: 3,
                    error: "connection refused".into()
                }
            ]
        );
        assert_eq!(
            run(&mut w, &[attached()]),
            [Event::WorkersAttached { count: 1 }, Event::Recovered]
        );
    }

    #[test]
    fn an_answer_breaks_an_unresponsive_streak() {
        let mut w = Watcher::new(WatchConfig::default());
        let events = run(
            &mut w,
            &[
                idle(),
                refused(),
                refused(),
                Poll::NotReady(503),
                refused(),
                refused(),
            ],
        );
        assert_eq!(events, [Event::Ready]);
    }

    /// A watcher of a restarted server awaiting `workers` for `grace` s.
    fn after_restart(workers: u64, grace: u64) -> Watcher {
        Watcher::restarted(WatchConfig::default(), workers, Duration::from_secs(grace))
    }

    fn tracked(n: u64) -> Poll {
        with_reaper(n, 1, 0)
    }

    fn restarted_lost(before: u64, now: u64) -> Event {
        Event::WorkersLost {
            before,
            now,
            cause: LossCause::ServerRestarted,
        }
    }

    #[test]
    fn workers_that_do_not_come_back_within_the_grace_are_lost_to_the_restart() {
        let mut w = after_restart(1, 30);
        assert_eq!(w.elapsed(Duration::from_secs(40)), [], "not ready yet");
        assert_eq!(run(&mut w, &[refused(), tracked(0)]), [Event::Ready]);
        assert_eq!(w.workers_to_carry(), 1);
        for t in [0, 2, 28] {
            assert!(w.elapsed(Duration::from_secs(t)).is_empty(), "{t}");
            assert!(run(&mut w, &[tracked(0)]).is_empty());
        }
        assert_eq!(w.elapsed(Duration::from_secs(30)), [restarted_lost(1, 0)]);
        assert!(
            w.elapsed(Duration::from_secs(60)).is_empty(),
            "reported once"
        );
        assert_eq!(w.workers_to_carry(), 0);
    }

    #[test]
    fn workers_that_come_back_in_time_are_not_lost() {
        let mut w = after_restart(2, 30);
        run(&mut w, &[tracked(0)]);
        assert!(w.elapsed(Duration::from_secs(2)).is_empty());
        assert_eq!(
            run(&mut w, &[tracked(2)]),
            [Event::WorkersAttached { count: 2 }]
        );
        assert!(w.elapsed(Duration::from_secs(30)).is_empty());
        assert!(w.elapsed(Duration::from_secs(90)).is_empty());
    }

    #[test]
    fn workers_partly_back_leave_the_rest_lost() {
        let mut w = after_restart(3, 30);
        run(&mut w, &[tracked(0), tracked(1), tracked(2)]);
        // One of those back unregisters again: the two that came back are
        // accounted for; its detach is the watcher's usual report.
        run(&mut w, &[tracked(1), tracked(1)]);
        assert_eq!(w.elapsed(Duration::from_secs(31)), [restarted_lost(3, 2)]);
    }

    #[test]
    fn a_second_restart_within_the_grace_carries_the_larger_count() {
        // Two workers at the first restart; one back before the second.
        let mut w = after_restart(2, 30);
        run(&mut w, &[tracked(0), tracked(1)]);
        assert!(w.elapsed(Duration::from_secs(10)).is_empty());
        assert_eq!(w.workers_to_carry(), 2);
        let mut next = after_restart(w.workers_to_carry(), 30);
        run(&mut next, &[tracked(0)]);
        assert_eq!(
            next.elapsed(Duration::from_secs(30)),
            [restarted_lost(2, 0)]
        );
        // More attached than awaited: those are carried.
        let mut w = after_restart(1, 30);
        run(&mut w, &[tracked(0), tracked(3)]);
        assert_eq!(w.workers_to_carry(), 3);
    }

    #[test]
    fn a_restarted_server_that_dies_before_ready_carries_the_workers_on() {
        let mut w = after_restart(2, 30);
        run(&mut w, &[refused(), Poll::NotReady(503)]);
        assert!(w.elapsed(Duration::from_secs(100)).is_empty());
        assert_eq!(w.workers_to_carry(), 2);
        let fresh = Watcher::new(WatchConfig::default());
        assert_eq!(fresh.workers_to_carry(), 0);
    }

    #[test]
    fn silence_past_the_limit_asks_for_a_restart_and_an_answer_resets_it() {
        let mut w = Watcher::new(WatchConfig {
            restart_unresponsive_after: Some(Duration::from_secs(10)),
            ..WatchConfig::default()
        });
        run(&mut w, &[idle()]);
        w.elapsed(Duration::from_secs(2));
        assert_eq!(w.unresponsive_too_long(), None);
        run(&mut w, &[refused()]);
        w.elapsed(Duration::from_secs(6));
        run(&mut w, &[refused()]);
        w.elapsed(Duration::from_secs(10));
        assert_eq!(w.unresponsive_too_long(), None, "4 s of silence");
        // A 503 is an answer: the streak starts again.
        run(&mut w, &[Poll::NotReady(503), refused()]);
        w.elapsed(Duration::from_secs(14));
        run(&mut w, &[refused()]);
        w.elapsed(Duration::from_secs(22));
        assert_eq!(w.unresponsive_too_long(), None, "8 s of silence");
        run(&mut w, &[refused()]);
        w.elapsed(Duration::from_secs(26));
        assert_eq!(
            w.unresponsive_too_long(),
            Some(Silence {
                silent: Duration::from_secs(12),
                limit: Duration::from_secs(10)
            })
        );

        let mut never = Watcher::new(WatchConfig {
            restart_unresponsive_after: None,
            ..WatchConfig::default()
        });
        run(&mut never, &[idle(), refused()]);
        never.elapsed(Duration::from_secs(1));
        run(&mut never, &[refused()]);
        never.elapsed(Duration::from_secs(86_400));
        assert_eq!(never.unresponsive_too_long(), None);
    }

    #[test]
    fn a_server_that_never_answered_is_not_silent() {
        let mut w = Watcher::new(WatchConfig {
            restart_unresponsive_after: Some(Duration::from_secs(1)),
            ..WatchConfig::default()
        });
        run(&mut w, &[refused(), refused()]);
        w.elapsed(Duration::from_secs(100));
        assert_eq!(w.unresponsive_too_long(), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_spawned_watcher_reports_an_unreachable_server_only_after_ready() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = StatusClient::new(format!("http://127.0.0.1:{port}/status"));
        let (mut rx, task) = spawn(
            client,
            WatchConfig {
                startup_interval: Duration::from_millis(10),
                ..WatchConfig::default()
            },
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(rx.try_recv().is_err(), "a starting server is not reported");
        drop(rx);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the task ends once the receiver is dropped")
            .unwrap();
    }
}
