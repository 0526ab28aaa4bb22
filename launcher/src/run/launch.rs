//! Running a [`LaunchPlan`]: check the ports, start the server through the
//! planned executable, wait for `/status`, run until a terminating signal, stop.

use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::process::Command;
use tokio::sync::{mpsc, watch};

use lmcache_capacity_guard::adapter::{GuardTiers, ScannedTier};
use lmcache_capacity_guard::PriorScan;
use lmcache_housekeeping::{Mode, TierLock, TierPolicy};
use lmcache_resp::identity::CacheIdentity;
use std::os::unix::fs::DirBuilderExt;

use crate::metrics::{MetricsEndpoint, MetricsError, NodeMetrics};
use crate::node::env;
use crate::node::ports::{self, ListenError, Listener, PortSource};
use crate::plan::api_key::{self, ApiKey, ApiKeyError};
use crate::plan::housekeep::Housekept;
use crate::plan::launch_plan::LaunchPlan;
use crate::run::supervise::{
    describe, listener_owned_by_tree, signal_name, Output, Supervised, TerminatingSignals,
};
use crate::run::tiers::{AdapterError, RunningAdapters, TierAdapters};
use crate::run::watch::{WatchConfig, Watcher};
use crate::status::events::{Event, Silence};
use crate::status::{Poll, StatusClient};

/// How long a server whose tree holds no `/status` listener is given to
/// show that it has exited rather than lost its port to another process.
const OWNER_CHECK_GRACE: Duration = Duration::from_millis(500);

/// Settings of one run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// How long a start may take to answer `/status` with 200.
    pub ready_timeout: Duration,
    /// How long a stop waits after SIGTERM before SIGKILL.
    pub stop_grace: Duration,
    /// How `/status` is polled, when events are sent, and how long a
    /// ready server may stay silent before it is stopped and started again
    /// ([`WatchConfig::restart_unresponsive_after`]).
    pub watch: WatchConfig,
    /// When a server that exits is started again.
    pub restart: RestartPolicy,
    /// Shows long work before the start (the disk tier's housekeeping) to
    /// the operator: called with a message and the work, which it must
    /// run. The default shows nothing; `lmcache-tier` draws a spinner.
    pub progress: ShowProgress,
}

pub use crate::output::ShowProgress;

/// The variable a launch sets for the server's process with its
/// [`RunOptions::stop_grace`] in whole seconds, so that `erebine-lmcache
/// server`, told to stop (by the launch, or by its parent-death signal when
/// the launch itself was killed), kills a server that outlives the same
/// grace (`docs/operations.md`, "Stopping").
pub const STOP_GRACE: &str = "EREBINE_LMCACHE_STOP_GRACE_SECONDS";

impl Default for RunOptions {
    /// 180 s to become ready (LMCache takes 20-25 s on a small host, mostly
    /// imports), 30 s of grace on stop, the default watch and restart policy.
    fn default() -> Self {
        RunOptions {
            ready_timeout: Duration::from_secs(180),
            stop_grace: Duration::from_secs(30),
            watch: WatchConfig::default(),
            restart: RestartPolicy::default(),
            progress: crate::output::unseen,
        }
    }
}

/// When a server that exits (or does not become ready again) is restarted.
///
/// The first start is not retried: a server that never became ready runs a
/// command line that does not work, and the same command line will not work
/// the second time. Once it has been ready, an exit is a crash (an OOM kill,
/// a bug) and the server is started again after a backoff that doubles from
/// `first_backoff` up to `max_backoff`. A run shorter than `fast_failure`,
/// and a restart that never became ready (its ready timeout may be longer),
/// is a fast failure; `max_fast_failures` of them in a row end the launch
/// with [`LaunchError::GaveUp`]. A longer run that was ready resets the count
/// and the backoff.
#[derive(Debug, Clone, PartialEq)]
pub struct RestartPolicy {
    /// Wait before the first restart. Default 1 s.
    pub first_backoff: Duration,
    /// Longest wait between restarts. Default 30 s.
    pub max_backoff: Duration,
    /// A run shorter than this is a fast failure. Default 120 s: a start
    /// alone takes 20-25 s on a small host.
    pub fast_failure: Duration,
    /// Fast failures in a row that end the launch. Default 3.
    pub max_fast_failures: u32,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            fast_failure: Duration::from_secs(120),
            max_fast_failures: 3,
        }
    }
}

/// Why a launch did not run to a requested stop.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A port the launch needs is taken, or cannot be listened on
    /// ([`crate::node::ports::check_free`]).
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// The executable could not be started.
    #[error("cannot start {executable}: {detail}")]
    Spawn {
        /// The executable.
        executable: String,
        /// The OS error.
        detail: String,
    },
    /// The server exited before it answered `/status`.
    #[error("the LMCache server exited before it was ready ({status}); its last lines:\n{}", tail.join("\n"))]
    ExitedBeforeReady {
        /// How it ended.
        status: String,
        /// Its last output lines.
        tail: Vec<String>,
    },
    /// The server did not answer `/status` in time.
    #[error("the LMCache server did not answer {url} within {}s (last poll: {last}); it was stopped. Its last lines:\n{}", timeout.as_secs(), tail.join("\n"))]
    NotReady {
        /// The polled URL.
        url: String,
        /// The timeout.
        timeout: Duration,
        /// What the last poll saw.
        last: String,
        /// Its last output lines.
        tail: Vec<String>,
    },
    /// The server exited while it was serving.
    #[error("the LMCache server exited ({status}); its last lines:\n{}", tail.join("\n"))]
    Exited {
        /// How it ended.
        status: String,
        /// Its last output lines.
        tail: Vec<String>,
    },
    /// The server kept failing soon after each restart.
    #[error("the LMCache server failed {failures} times in a row, each within {}s of its start or before it became ready; not restarting it again. Last: {status}; its last lines:\n{}", within.as_secs(), tail.join("\n"))]
    GaveUp {
        /// Fast failures in a row.
        failures: u32,
        /// The run length under which a failure counts as fast.
        within: Duration,
        /// How the last run ended.
        status: String,
        /// Its last output lines.
        tail: Vec<String>,
    },
    /// A tier's adapter refused it or could not start: an `s3_bucket` tier
    /// cannot work (bad key, unreachable endpoint, refused credentials), a
    /// guarded tier's capacity exceeds its volume, or the disk tier's
    /// capacity guard could not start; the server was not started.
    #[error("{0}; the server was not started")]
    Adapter(#[from] AdapterError),
    /// The metrics endpoint cannot listen; the server was not started.
    #[error("{0}; the server was not started")]
    Metrics(#[from] MetricsError),
    /// An operator's disk tier to fence by the cache identity
    /// ([`LaunchPlan::fenced_tiers`]) whose directory cannot be made; the
    /// server was not started.
    #[error("L2 tier {position}: cannot make its base_path {}: {source}; make the directory (owned by this user) or fix the tier's base_path", .path.display())]
    FencedTier {
        /// The tier's position in the cascade.
        position: usize,
        /// Its `base_path`.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Housekeeping of the disk tier failed; the server was not started.
    #[error("housekeeping of the disk tier failed, the server was not started: {0}")]
    Housekeeping(#[from] lmcache_housekeeping::HousekeepingError),
    /// The server's API key file cannot be made or read; the server was
    /// not started.
    #[error("{0}; the server was not started")]
    ApiKey(#[from] ApiKeyError),
    /// Waiting on the server failed.
    #[error("lost track of the LMCache server: {0}")]
    Io(#[from] std::io::Error),
}

/// Starts the planned server, waits until `/status` answers, and runs until
/// a terminating signal ([`crate::run::supervise::terminating_signals`]), then stops it; a server that exits after it was ready
/// is restarted (see [`RestartPolicy`]). Every [`Event`] is logged. Returns
/// the server's status after a requested stop.
///
/// Errors: a taken port, an executable that does not start, a first start
/// that exits or does not become ready, repeated fast failures (each error
/// quotes the server's last lines).
pub async fn run(plan: &LaunchPlan, options: &RunOptions) -> Result<ExitStatus, LaunchError> {
    run_with_events(plan, options, None).await
}

/// A launch started with [`start`]: its liveness events and its stop.
///
/// Dropping the handle stops the server as [`LaunchHandle::stop`] does.
pub struct LaunchHandle {
    /// Every [`Event`] of the launch, in order (also logged).
    pub events: mpsc::UnboundedReceiver<Event>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<ExitStatus, LaunchError>>,
}

impl LaunchHandle {
    /// Asks for a graceful stop: SIGTERM to the server, then SIGKILL after
    /// [`RunOptions::stop_grace`]. Returns at once; [`LaunchHandle::wait`]
    /// gives the outcome.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Waits for the launch to end: the server's status after a stop, or why
    /// it ended on its own (see [`run`]).
    pub async fn wait(self) -> Result<ExitStatus, LaunchError> {
        let LaunchHandle { task, stop, .. } = self;
        let outcome = task.await;
        drop(stop);
        outcome.unwrap_or_else(|e| Err(LaunchError::Io(std::io::Error::other(e))))
    }
}

/// Starts `plan` on the current tokio runtime for a caller that is not a
/// command-line process (the node agent): like [`run`], but the launch ends
/// on [`LaunchHandle::stop`] (or when the handle is dropped) instead of on
/// SIGTERM/SIGINT, which stay the caller's, and its events arrive on
/// [`LaunchHandle::events`].
///
/// The server's parent-death signal follows the thread that spawned it: on a
/// multi-thread runtime call this from a task on a runtime worker thread (the
/// default), never from a `spawn_blocking` thread, which may exit early.
pub fn start(plan: LaunchPlan, options: RunOptions) -> LaunchHandle {
    let (events_tx, events) = mpsc::unbounded_channel();
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        run_launch(&plan, &options, Some(events_tx), Stop::Handle(stop_rx)).await
    });
    LaunchHandle { events, stop, task }
}

/// [`run`], also sending every [`Event`] on `events` (the agent's
/// subscription). A dropped receiver stops nothing: events are still logged.
///
/// The housekeeping of the disk tier runs once, before the first start, and
/// its lock is held until this function returns, across restarts. A restart
/// does not housekeep again: the launch identity is the same and the lock kept
/// every other launch out, so there is nothing of another identity to purge,
/// and the capacity is enforced while the server runs (fs_native eviction, the
/// capacity guard), not by a trim between starts.
pub async fn run_with_events(
    plan: &LaunchPlan,
    options: &RunOptions,
    events: Option<mpsc::UnboundedSender<Event>>,
) -> Result<ExitStatus, LaunchError> {
    let signals = TerminatingSignals::install()?;
    run_launch(plan, options, events, Stop::Signals(signals)).await
}

/// [`run`] with the terminating signals already caught: a command-line
/// launch installs them ([`TerminatingSignals::install`]) before it plans,
/// so that a signal during planning stops it cleanly too (it then starts
/// nothing).
pub async fn run_with_signals(
    plan: &LaunchPlan,
    options: &RunOptions,
    signals: TerminatingSignals,
) -> Result<ExitStatus, LaunchError> {
    run_launch(plan, options, None, Stop::Signals(signals)).await
}

async fn run_launch(
    plan: &LaunchPlan,
    options: &RunOptions,
    events: Option<mpsc::UnboundedSender<Event>>,
    stop: Stop,
) -> Result<ExitStatus, LaunchError> {
    // A signal during planning, the housekeeping or the adapters' start
    // lets that work finish and starts no server.
    let mut signals = Signals::new(stop);
    if let Some(why) = signals.already_received().await {
        tracing::info!("{why} received before the LMCache server started: not starting it");
        return Ok(ExitStatus::from_raw(0));
    }
    let metrics = Arc::new(NodeMetrics::new(Some(plan)));
    let _endpoint = start_metrics(plan, &metrics)?;
    let prepared = prepare(plan, options, &metrics).await?;
    if let Some(why) = signals.already_received().await {
        tracing::info!("{why} received before the LMCache server started: not starting it");
        return Ok(ExitStatus::from_raw(0));
    }
    let emit = |event: Event| {
        metrics.server().observe(&event);
        match &event {
            // The "LMCache server ready in ..." line right after says it.
            Event::Ready => tracing::debug!(event = ?event, "{event}"),
            Event::WorkersAttached { .. } | Event::WorkersDetached { .. } | Event::Recovered => {
                tracing::info!(event = ?event, "{event}")
            }
            _ => tracing::warn!(event = ?event, "{event}"),
        }
        if let Some(tx) = &events {
            let _ = tx.send(event);
        }
    };
    let mut restarts = Restarts::new(plan.status_url(), options);
    // Engine workers of the previous start that the next one must see
    // register again (`docs/inspect.md`, "Workers a restart loses").
    let mut carried = 0;
    loop {
        metrics.server().started(restarts.starts);
        let run = start_once(
            plan,
            &prepared,
            options,
            &mut signals,
            &emit,
            (restarts.starts, carried),
        )
        .await?;
        let ended = match run {
            Run::Stopped(status) => return Ok(status),
            Run::Ended(ended) => ended,
        };
        carried = ended.workers;
        let backoff = restarts.after(ended)?;
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            why = signals.recv() => {
                tracing::info!("{why} received while waiting to restart the LMCache server: not restarting");
                return Ok(ExitStatus::from_raw(0));
            }
        }
    }
}

/// What a launch holds from before the first start until it returns.
struct Prepared {
    /// The server's arguments, its tiers pointed at what the adapters
    /// started (`s3_bucket` specs at the gateways).
    args: Vec<String>,
    /// The tiers' adapters, started ([`crate::run::tiers`]); stopped when
    /// dropped, before the lock.
    adapters: RunningAdapters,
    /// The disk tier's lock: no other launch or housekeeping may touch the
    /// directory while the server runs.
    _lock: Option<lmcache_housekeeping::TierLock>,
    /// The fenced tiers' directories and locks ([`fence_tiers`]), held as
    /// long.
    _fences: Vec<(PathBuf, TierLock)>,
}

/// The server's listeners: the plan's, less the metrics endpoint, which
/// the launch itself holds while the server starts.
fn server_listeners(plan: &LaunchPlan) -> Vec<Listener> {
    plan.listeners
        .iter()
        .filter(|l| Some(*l) != plan.metrics.as_ref())
        .cloned()
        .collect()
}

/// The plan's metrics endpoint, started; `None` when it is off.
fn start_metrics(
    plan: &LaunchPlan,
    metrics: &Arc<NodeMetrics>,
) -> Result<Option<MetricsEndpoint>, LaunchError> {
    let Some(listener) = &plan.metrics else {
        return Ok(None);
    };
    let address = std::net::SocketAddr::new(listener.host, listener.port);
    let endpoint = MetricsEndpoint::start(address, &listener.setting(), metrics.clone())?;
    tracing::info!("metrics on http://{}/metrics", endpoint.address());
    Ok(Some(endpoint))
}

/// Everything before the first start: every tier's adapter checked
/// (refused here, before anything starts, with the reason: exit 2, not a
/// server that exits at once), the API key made or read, the disk tier
/// housekept from the plan's scan, and the adapters started (the disk
/// tier's capacity guard from that scan); each of them then read by
/// `metrics`.
async fn prepare(
    plan: &LaunchPlan,
    options: &RunOptions,
    metrics: &NodeMetrics,
) -> Result<Prepared, LaunchError> {
    // The ports were found free by the facts' measure (`DiskAccess::Create`,
    // before anything was created); a restart checks them again below.
    adapters(plan, Vec::new()).check()?;
    let lookup = server_lookup(plan);
    ensure_api_key_file(plan)?;
    server_api_key(plan, &lookup)?;
    let (lock, scans) = housekeep(plan, options, metrics)?;
    let fences = fence_tiers(plan)?;
    let started = Instant::now();
    let owner = metrics.guard_owner();
    // A disk tier's directory, held under its lock from here on: the
    // built-in tier's, else the first fenced tier's.
    let housekept = lock.as_ref().and(plan.housekeeping.as_ref());
    let node_dir = housekept
        .map(|hk| hk.path.as_path())
        .or_else(|| fences.first().map(|(path, _)| path.as_path()));
    let adapters = adapters(plan, scans)
        .start(&lookup, &owner, node_dir, metrics)
        .await?;
    tracing::debug!(
        "started the tiers' adapters in {} ms",
        started.elapsed().as_millis()
    );
    Ok(Prepared {
        args: plan.server_args(&adapters.server_tiers(&plan.cascade)),
        adapters,
        _lock: lock,
        _fences: fences,
    })
}

/// The adapters of the plan's tiers ([`TierAdapters`]): its guarded tiers
/// those of a launch, `scans` being the scans it made of its tiers.
fn adapters(plan: &LaunchPlan, scans: Vec<ScannedTier>) -> TierAdapters {
    let guarded = plan.tiers.iter().filter_map(|t| t.guard.clone()).collect();
    let identity = CacheIdentity {
        model: plan.identity.model.clone(),
        tag: plan.identity.tag(),
    };
    let guards = GuardTiers::of_launch(guarded, scans);
    TierAdapters::new(&plan.cascade, guards, Some(identity))
}

/// Housekeeps the plan's disk tier, if it has one, from the plan's scan;
/// returns the tier's lock and its scan, for its capacity guard.
///
/// # Errors
/// What kept housekeeping from its end.
fn housekeep(
    plan: &LaunchPlan,
    options: &RunOptions,
    metrics: &NodeMetrics,
) -> Result<(Option<TierLock>, Vec<ScannedTier>), LaunchError> {
    let Some(hk) = &plan.housekeeping else {
        return Ok((None, Vec::new()));
    };
    let started = Instant::now();
    let mut housekept = None;
    (options.progress)(&format!("housekeeping {}", hk.path.display()), &mut || {
        housekept = Some(hk.run(Mode::Apply));
    });
    // A display that did not run the work leaves it to be done here.
    let mut housekept = housekept.unwrap_or_else(|| hk.run(Mode::Apply))?;
    tracing::info!("{}", housekept.housekeeping.report);
    if let Some(warning) = housekept.housekeeping.report.purge_warning() {
        tracing::warn!("{warning}");
    }
    metrics.housekept(&housekept.housekeeping.report, started.elapsed());
    let lock = housekept.tier.lock.take();
    tracing::debug!(
        "housekept {} in {} ms",
        hk.path.display(),
        started.elapsed().as_millis()
    );
    Ok((lock, vec![(hk.path.clone(), prior_scan(housekept))]))
}

/// Fences the operator's own disk tiers by the cache identity
/// ([`LaunchPlan::fenced_tiers`]): each directory made if missing (0700),
/// locked, purged whole when its identity manifest records another
/// identity (or is unusable), then given this launch's manifest; the
/// report and a purge's warning are logged. Returns each tier's directory
/// and lock.
///
/// # Errors
/// A directory that cannot be made, locked, scanned or cleaned.
fn fence_tiers(plan: &LaunchPlan) -> Result<Vec<(PathBuf, TierLock)>, LaunchError> {
    let policy = TierPolicy {
        fence_only: true,
        ..TierPolicy::default()
    };
    let mut locks = Vec::new();
    for tier in &plan.fenced_tiers {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&tier.path)
            .map_err(|source| LaunchError::FencedTier {
                position: tier.position,
                path: tier.path.clone(),
                source,
            })?;
        let done =
            lmcache_housekeeping::housekeep(&tier.path, &plan.identity, policy, Mode::Apply)?;
        tracing::info!("L2 tier {}: {}", tier.position, done.report);
        if let Some(warning) = done.report.purge_warning() {
            tracing::warn!("L2 tier {}: {warning}", tier.position);
        }
        locks.extend(done.lock.map(|lock| (tier.path.clone(), lock)));
    }
    Ok(locks)
}

/// The scan housekeeping made, for the tier's capacity guard.
fn prior_scan(housekept: Housekept) -> PriorScan {
    PriorScan {
        dir: housekept.tier.dir,
        watch: housekept.watch,
        inventory: housekept.tier.inventory,
        deleted: housekept.housekeeping.deleted_objects,
    }
}

/// The server's environment, by name: the plan's (the node's variables),
/// else this process's.
fn server_lookup(plan: &LaunchPlan) -> impl Fn(&str) -> Option<String> + '_ {
    move |k: &str| match plan.base_env.is_empty() {
        true => std::env::var(k).ok(),
        false => crate::node::env::text_var(&plan.base_env, k),
    }
}

/// Makes the plan's key file where it is missing ([`api_key::ensure_file`]).
///
/// Errors: a key file that cannot be created or read, or is not one key
/// on one line (LMCache would refuse it at start).
fn ensure_api_key_file(plan: &LaunchPlan) -> Result<(), ApiKeyError> {
    if let Some(file) = &plan.api_key_file {
        if api_key::ensure_file(file)? {
            tracing::info!(
                "created the LMCache API key file {} (mode 0600, a new key)",
                file.display()
            );
        }
    }
    Ok(())
}

/// The key the server accepts, read as it starts (it reads its key files
/// at each start, so a key changed in the file is the one a restarted
/// server takes): the server's `--api-key-file`, else its environment
/// (`lookup`); `None` when it has no key.
///
/// Errors: a key that cannot be read or is not one key on one line.
fn server_api_key(
    plan: &LaunchPlan,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<ApiKey>, ApiKeyError> {
    let Some(source) = plan.api_key_source(lookup) else {
        return Ok(None);
    };
    let key = source.read(lookup)?;
    tracing::debug!("requests to the server's HTTP port carry its API key, from {source}");
    Ok(Some(key))
}

/// How one start ended.
enum Run {
    /// Stopped on request: the launch returns this status.
    Stopped(ExitStatus),
    /// Ended by itself, or not ready in time: a restart may follow.
    Ended(Ending),
}

/// How a start ended by itself, for the restart policy.
struct Ending {
    /// How it ended, in words.
    status: String,
    /// Whether the server had answered `/status` with 200.
    was_ready: bool,
    /// How long it ran.
    ran: Duration,
    /// The last poll, when it was stopped for not becoming ready.
    last_poll: Option<String>,
    /// Its last output lines.
    tail: Vec<String>,
    /// The engine workers the next start must see again
    /// ([`Watcher::workers_to_carry`]).
    workers: u64,
}

/// One start of the server, the `start`-th, supervised until it stops or
/// ends; `carried` engine workers of the previous start are awaited.
async fn start_once(
    plan: &LaunchPlan,
    prepared: &Prepared,
    options: &RunOptions,
    signals: &mut Signals,
    emit: &impl Fn(Event),
    (start, carried): (u64, u64),
) -> Result<Run, LaunchError> {
    if start > 1 {
        // The last server's processes may still be letting go of them.
        let deadline = Instant::now() + options.stop_grace;
        while let Err(e) = ports::check_free(&server_listeners(plan)) {
            if Instant::now() >= deadline {
                return Err(e.into());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    // Read before the server starts, as the server reads it.
    let api_key = server_api_key(plan, &server_lookup(plan))?;
    let mut server = spawn(plan, prepared, options.stop_grace)?;
    tracing::info!(pid = server.pid(), start, executable = %plan.executable.display(), "LMCache server started; waiting for {}", plan.status_url());
    let started = Instant::now();
    let client = StatusClient::with_timeout(plan.status_url(), options.watch.request_timeout)
        .with_api_key(api_key);
    let mut watcher = match start {
        1 => Watcher::new(options.watch.clone()),
        _ => Watcher::restarted(options.watch.clone(), carried, plan.rejoin_grace()),
    };
    let ended = supervise(
        &mut server,
        &client,
        &mut watcher,
        signals,
        options,
        emit,
        plan,
    )
    .await;
    // The server's own processes, when its wrapper died before them:
    // gone before the lock is released or the next start.
    server.reap_orphans(options.stop_grace).await;
    let (status, last_poll) = match ended? {
        Ended::Stopped(status) => return Ok(Run::Stopped(status)),
        Ended::Exited(status) => {
            // Whatever the server left in its group goes with it.
            server.signal(Signal::SIGKILL);
            emit(Event::exited(status, &server.oom_reading()));
            (describe(status), None)
        }
        Ended::Unresponsive { status, silence } => {
            server.signal(Signal::SIGKILL);
            emit(Event::stopped_unresponsive(status, silence));
            (
                format!(
                    "stopped after {:.0}s without an HTTP answer: {}",
                    silence.silent.as_secs_f64(),
                    describe(status)
                ),
                None,
            )
        }
        Ended::NotReady(last) => (
            format!(
                "no 200 from /status within {}s",
                options.ready_timeout.as_secs()
            ),
            Some(last),
        ),
    };
    Ok(Run::Ended(Ending {
        status,
        was_ready: watcher.is_ready(),
        ran: started.elapsed(),
        last_poll,
        tail: server.tail(),
        workers: watcher.workers_to_carry(),
    }))
}

/// The server's process: the plan's executable with the prepared
/// arguments, in the plan's environment less every secret.
fn spawn(
    plan: &LaunchPlan,
    prepared: &Prepared,
    stop_grace: Duration,
) -> Result<Supervised, LaunchError> {
    let mut command = Command::new(&plan.executable);
    if !plan.base_env.is_empty() {
        command.env_clear().envs(&plan.base_env);
    }
    // The operator's adapter JSON may carry real credentials: the
    // server's environment never does, nor do the credential variables
    // the gateways use; it gets the gateways' per-launch key instead.
    command
        .args(&prepared.args)
        .envs(&plan.env)
        .env_remove(env::L2_ADAPTER);
    // Each adapter's: the gateways' per-launch key, and which tiers this
    // launch guards itself (one inherited would leave a tier unguarded).
    for (variable, value) in prepared.adapters.server_env() {
        match value {
            Some(value) => command.env(variable, value),
            None => command.env_remove(variable),
        };
    }
    // The launch serves the metrics; `erebine-lmcache` would take its port.
    command.env(env::METRICS_PORT, "0");
    command.env(STOP_GRACE, stop_grace.as_secs().to_string());
    Supervised::spawn(command, Output::Tee).map_err(|e| LaunchError::Spawn {
        executable: plan.executable.display().to_string(),
        detail: e.to_string(),
    })
}

/// The restart policy's count of one launch (see [`RestartPolicy`]).
struct Restarts<'a> {
    policy: &'a RestartPolicy,
    /// The `/status` URL and the ready timeout, for a start that never
    /// became ready.
    url: String,
    ready_timeout: Duration,
    /// Starts so far, the next one included.
    starts: u64,
    backoff: Duration,
    fast_failures: u32,
}

impl<'a> Restarts<'a> {
    fn new(url: String, options: &'a RunOptions) -> Self {
        let policy = &options.restart;
        Self {
            policy,
            url,
            ready_timeout: options.ready_timeout,
            starts: 1,
            backoff: policy.first_backoff,
            fast_failures: 0,
        }
    }

    /// The wait before the next start after `ended`, or the error that ends
    /// the launch: a first start that never became ready, or too many fast
    /// failures in a row.
    fn after(&mut self, ended: Ending) -> Result<Duration, LaunchError> {
        let policy = self.policy;
        if self.starts == 1 && !ended.was_ready {
            return Err(match ended.last_poll {
                None => {
                    let status = match python_failure(&ended.tail) {
                        Some(failure) => format!("{}: {failure}", ended.status),
                        None => ended.status,
                    };
                    LaunchError::ExitedBeforeReady {
                        status,
                        tail: ended.tail,
                    }
                }
                Some(last) => LaunchError::NotReady {
                    url: self.url.clone(),
                    timeout: self.ready_timeout,
                    last,
                    tail: ended.tail,
                },
            });
        }
        // A restart that never became ready failed however long it ran
        // (the ready timeout can outlast `fast_failure`): counted, so such
        // restarts end the launch instead of repeating for ever.
        if ended.ran < policy.fast_failure || !ended.was_ready {
            self.fast_failures += 1;
        } else {
            self.fast_failures = 0;
            self.backoff = policy.first_backoff;
        }
        if self.fast_failures >= policy.max_fast_failures {
            return Err(LaunchError::GaveUp {
                failures: self.fast_failures,
                within: policy.fast_failure,
                status: ended.status,
                tail: ended.tail,
            });
        }
        let backoff = self.backoff;
        tracing::warn!(
            "LMCache server ended ({}) after {:.0}s; restarting it in {:.0}s ({} fast failures in a row, {} allowed)",
            ended.status,
            ended.ran.as_secs_f64(),
            backoff.as_secs_f64(),
            self.fast_failures,
            policy.max_fast_failures
        );
        self.backoff = (backoff * 2).min(policy.max_backoff);
        self.starts += 1;
        Ok(backoff)
    }
}

/// Why a server ended, from its last output lines:
/// - LMCache 0.5.6 warns `No compute backend loaded; CLI-only mode (...).
///   Reason: <why>` when its kernels do not load, and then takes the path
///   of the lightweight command below: `<why>` is the cause, e.g.
///   `LMCache loaded no compute backend: cannot cache function ...: no
///   locator available for file ...` where numba cannot write its cache
///   beside LMCache's files (a read-only or another user's environment),
///   which names `NUMBA_CACHE_DIR` as the way out;
/// - LMCache 0.5.6 catches a failed import of its server's modules, warns
///   `lmcache-cli (lightweight) detected (<why>)`, and then refuses every
///   server flag: the import is the cause, e.g. `cannot import what the
///   server needs: No module named 'msgspec'`;
/// - LMCache 0.5.4 and 0.5.5 swallow that import error and say only `The
///   'lmcache server' command requires the full lmcache installation ...`:
///   that line;
/// - otherwise the last line shaped `<Name>Error: ...` or
///   `<Name>Exception: ...` (a traceback's last line), e.g.
///   `ModuleNotFoundError: No module named 'openai'`, which LMCache 0.5.4
///   prints when `openai` is missing.
pub(crate) fn python_failure(tail: &[String]) -> Option<String> {
    no_compute_backend(tail).or_else(|| import_or_exception(tail))
}

/// The reason of LMCache's `No compute backend loaded` warning, if any.
fn no_compute_backend(tail: &[String]) -> Option<String> {
    const NO_BACKEND: &str = "No compute backend loaded";
    const REASON: &str = "Reason: ";
    let line = tail.iter().rev().find(|line| line.contains(NO_BACKEND))?;
    let why = &line[line.find(REASON)? + REASON.len()..];
    // The logger's colour codes and its ` (file.py:N:module)` suffix.
    let why = why.split('\x1b').next().unwrap_or(why);
    let why = match why.rfind(" (") {
        Some(at) if why.trim_end().ends_with(')') => &why[..at],
        _ => why,
    };
    let advice = match why.contains("no locator available") {
        true => " (numba cannot write its cache beside LMCache's files: set NUMBA_CACHE_DIR to a directory the server's user can write)",
        false => "",
    };
    Some(format!(
        "LMCache loaded no compute backend: {}{advice}",
        why.trim()
    ))
}

/// A failed import of the server's modules, else a traceback's last line.
fn import_or_exception(tail: &[String]) -> Option<String> {
    const LIGHTWEIGHT: &str = "lmcache-cli (lightweight) detected (";
    const ADVICE: &str = "); install the full lmcache package";
    let import = tail.iter().rev().find_map(|line| {
        let why = &line[line.find(LIGHTWEIGHT)? + LIGHTWEIGHT.len()..];
        let why = why.find(ADVICE).map_or(why, |end| &why[..end]);
        Some(format!("cannot import what the server needs: {why}"))
    });
    const FULL_INSTALL: &str = "command requires the full lmcache installation";
    let import = import.or_else(|| {
        let line = tail.iter().rev().find(|line| line.contains(FULL_INSTALL))?;
        Some(format!(
            "cannot import what the server needs: {}",
            line.trim()
        ))
    });
    import.or_else(|| {
        let line = tail.iter().rev().map(|line| line.trim()).find(|line| {
            line.split_once(": ").is_some_and(|(name, _)| {
                (name.ends_with("Error") || name.ends_with("Exception"))
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
            })
        })?;
        Some(line.to_string())
    })
}

/// How one start of the server ended.
enum Ended {
    /// Stopped on request (a terminating signal, or the handle).
    Stopped(ExitStatus),
    /// Exited by itself.
    Exited(ExitStatus),
    /// Stopped by the launch after it gave no HTTP answer for too long
    /// ([`WatchConfig::restart_unresponsive_after`]).
    Unresponsive {
        /// How it ended once stopped.
        status: ExitStatus,
        /// How long it had given no answer, and how long it could.
        silence: Silence,
    },
    /// Did not answer 200 within the ready timeout and was stopped; the last poll.
    NotReady(String),
}

/// What ends a launch on request.
enum Stop {
    /// Any terminating signal to this process (the command-line tools; see
    /// [`crate::run::supervise::terminating_signals`]), caught from before the
    /// launch.
    Signals(TerminatingSignals),
    /// [`LaunchHandle::stop`], or the handle dropped (the library).
    Handle(watch::Receiver<bool>),
}

/// The stop requests of one launch.
enum Signals {
    Process(TerminatingSignals),
    Handle(watch::Receiver<bool>),
}

impl Signals {
    fn new(stop: Stop) -> Self {
        match stop {
            Stop::Signals(signals) => Signals::Process(signals),
            Stop::Handle(rx) => Signals::Handle(rx),
        }
    }

    /// Waits for the next stop request and names it.
    async fn recv(&mut self) -> String {
        match self {
            Signals::Process(signals) => signal_name(signals.recv().await),
            Signals::Handle(rx) => {
                // A dropped handle (Err) is a stop request too.
                let _ = rx.wait_for(|stop| *stop).await;
                "a stop request".to_string()
            }
        }
    }

    /// A stop request that came while the launch was busy before a start.
    async fn already_received(&mut self) -> Option<String> {
        match self {
            Signals::Process(signals) => signals.already_received().await.map(signal_name),
            Signals::Handle(rx) => (*rx.borrow()).then(|| "a stop request".to_string()),
        }
    }
}

/// Watches one start of the server until it exits, is stopped on request,
/// or misses the ready timeout.
async fn supervise(
    server: &mut Supervised,
    client: &StatusClient,
    watcher: &mut Watcher,
    signals: &mut Signals,
    options: &RunOptions,
    emit: &impl Fn(Event),
    plan: &LaunchPlan,
) -> Result<Ended, LaunchError> {
    let started = Instant::now();
    let mut ready_at = None;
    loop {
        let poll = tokio::select! {
            status = server.wait() => return Ok(Ended::Exited(status?)),
            why = signals.recv() => return stop(server, why, options).await.map(Ended::Stopped),
            poll = client.poll() => poll,
        };
        let was_ready = watcher.is_ready();
        if let (Poll::Up(_), false) = (&poll, was_ready) {
            // Two launches on one port both pass the port check; the loser's
            // server fails to bind, and the winner's answers its polls.
            if listener_owned_by_tree(plan.http_port, server.pid()) == Some(false) {
                // A server that dies right after its answer leaves no
                // listener in its tree either: that is an exit, not a port
                // taken by someone else.
                if let Ok(status) = tokio::time::timeout(OWNER_CHECK_GRACE, server.wait()).await {
                    return Ok(Ended::Exited(status?));
                }
                server.stop(options.stop_grace).await?;
                let listener = plan
                    .listeners
                    .iter()
                    .find(|l| l.port == plan.http_port)
                    .cloned()
                    .unwrap_or(Listener {
                        role: "the server's HTTP port",
                        source: PortSource::Variable(env::HTTP_PORT),
                        host: Ipv4Addr::LOCALHOST.into(),
                        port: plan.http_port,
                    });
                return Err(ListenError::PortInUse {
                    listener,
                    port: plan.http_port,
                    detail:
                        "another process answers /status there, not the server this launch started"
                            .into(),
                }
                .into());
            }
        }
        for event in watcher.observe(&poll) {
            emit(event);
        }
        if watcher.is_ready() && !was_ready {
            ready_at = Some(Instant::now());
            tracing::info!(
                "LMCache server ready in {:.1}s: {} answers; ZMQ on tcp://127.0.0.1:{}",
                started.elapsed().as_secs_f64(),
                plan.status_url(),
                plan.mp_port
            );
        }
        if let Some(ready) = ready_at {
            for event in watcher.elapsed(ready.elapsed()) {
                emit(event);
            }
        }
        if let Some(silence) = watcher.unresponsive_too_long() {
            tracing::warn!(
                "the LMCache server (pid {}) has given no HTTP answer for {:.0}s, over the {}s a ready server may go without one (--unresponsive-timeout): stopping it (SIGTERM and SIGCONT, SIGKILL after {}s) to start it again",
                server.pid(),
                silence.silent.as_secs_f64(),
                silence.limit.as_secs(),
                options.stop_grace.as_secs()
            );
            let status = server.stop(options.stop_grace).await?;
            return Ok(Ended::Unresponsive { status, silence });
        }
        if !watcher.is_ready() && started.elapsed() >= options.ready_timeout {
            server.stop(options.stop_grace).await?;
            return Ok(Ended::NotReady(poll.describe()));
        }
        tokio::select! {
            status = server.wait() => return Ok(Ended::Exited(status?)),
            why = signals.recv() => return stop(server, why, options).await.map(Ended::Stopped),
            _ = tokio::time::sleep(watcher.next_interval()) => {}
        }
    }
}
async fn stop(
    server: &mut Supervised,
    why: String,
    options: &RunOptions,
) -> Result<ExitStatus, LaunchError> {
    tracing::info!(
        "{why} received: stopping the LMCache server (pid {})",
        server.pid()
    );
    let status = server.stop(options.stop_grace).await?;
    // 143 is how LMCache's Python process reports the SIGTERM it was sent.
    let sigterm = Signal::SIGTERM as i32;
    if status.success() || status.code() == Some(128 + sigterm) || status.signal() == Some(sigterm)
    {
        tracing::info!(
            "LMCache server stopped cleanly on SIGTERM ({})",
            describe(status)
        );
    } else {
        tracing::warn!(
            "LMCache server did not stop cleanly after SIGTERM: {}",
            describe(status)
        );
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ending(ran_s: u64, was_ready: bool) -> Ending {
        Ending {
            status: "no 200 from /status within 180s".into(),
            was_ready,
            ran: Duration::from_secs(ran_s),
            last_poll: None,
            tail: Vec::new(),
            workers: 0,
        }
    }

    #[test]
    fn restarts_that_never_become_ready_end_the_launch_however_long_they_ran() {
        let options = RunOptions::default();
        let mut restarts = Restarts::new("http://127.0.0.1:9/status".into(), &options);
        assert!(restarts.after(ending(3600, true)).is_ok());
        // Each runs the whole 180 s ready timeout, longer than the 120 s
        // under which a run is fast.
        assert!(restarts.after(ending(180, false)).is_ok());
        assert!(restarts.after(ending(180, false)).is_ok());
        match restarts.after(ending(180, false)) {
            Err(e @ LaunchError::GaveUp { failures: 3, .. }) => {
                assert!(e.to_string().contains("before it became ready"), "{e}")
            }
            other => panic!("expected GaveUp, got {other:?}"),
        }
    }

    #[test]
    fn a_long_ready_run_resets_the_count() {
        let options = RunOptions::default();
        let mut restarts = Restarts::new("http://127.0.0.1:9/status".into(), &options);
        assert!(restarts.after(ending(3600, true)).is_ok());
        for _ in 0..5 {
            assert!(restarts.after(ending(180, false)).is_ok());
            assert!(restarts.after(ending(30, true)).is_ok());
            assert!(restarts.after(ending(600, true)).is_ok());
        }
    }

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn the_exception_that_ended_the_server_is_named() {
        let tail = lines(
            "Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n    import openai\nModuleNotFoundError: No module named 'openai'\n",
        );
        assert_eq!(
            python_failure(&tail).as_deref(),
            Some("ModuleNotFoundError: No module named 'openai'")
        );
        let tail =
            lines("ValueError: first\nlmcache.errors.ConfigException: second\nINFO: shutting down");
        assert_eq!(
            python_failure(&tail).as_deref(),
            Some("lmcache.errors.ConfigException: second")
        );
        let tail = lines("INFO: Error: not an exception line\nWARNING: an Error: here");
        assert_eq!(python_failure(&tail), None);
        let tail = lines(concat!(
            "[2026-12-01 05:30:41,948] LMCache WARNING: lmcache-cli (lightweight) detected ",
            "(No module named 'msgspec'); install the full lmcache package to use 'server' ",
            "and 'bench'. (server.py:63:lmcache.cli.commands.server)\n",
            "lmcache: error: unrecognized arguments: --l1-size-gb 1",
        ));
        assert_eq!(
            python_failure(&tail).as_deref(),
            Some("cannot import what the server needs: No module named 'msgspec'")
        );
        let tail = lines(concat!(
            "\x1b[33;20m[2026-12-05 23:47:56,676] LMCache WARNING:\x1b[0m No compute backend ",
            "loaded; CLI-only mode (torch/numba not installed). Reason: cannot cache function ",
            "'_encode_single_channel': no locator available for file '/opt/lmcache/k.py' ",
            "\x1b[3m(__init__.py:30:lmcache)\x1b[0m\n",
            "[2026-12-05 23:47:56,700] LMCache WARNING: lmcache-cli (lightweight) detected ",
            "(cannot import name 'device_ops' from 'lmcache'); install the full lmcache package",
        ));
        assert_eq!(
            python_failure(&tail).as_deref(),
            Some("LMCache loaded no compute backend: cannot cache function '_encode_single_channel': no locator available for file '/opt/lmcache/k.py' (numba cannot write its cache beside LMCache's files: set NUMBA_CACHE_DIR to a directory the server's user can write)")
        );
        let tail = lines(
            "LMCache WARNING: No compute backend loaded; CLI-only mode (torch/numba not installed). Reason: No module named 'torch' (__init__.py:30:lmcache)",
        );
        assert_eq!(
            python_failure(&tail).as_deref(),
            Some("LMCache loaded no compute backend: No module named 'torch'")
        );
        let tail = lines(concat!(
            "The 'lmcache server' command requires the full lmcache installation with CUDA extensions.\n",
            "Install with: pip install lmcache",
        ));
        assert_eq!(
            python_failure(&tail).as_deref(),
            Some("cannot import what the server needs: The 'lmcache server' command requires the full lmcache installation with CUDA extensions.")
        );
    }
}
