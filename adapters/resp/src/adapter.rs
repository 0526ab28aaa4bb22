//! The `resp` tiers behind the tier seam ([`lmcache_tier_spec::adapter`];
//! `docs/redis.md`). Nothing runs beside the server: the start reaches each
//! tier's Redis (`AUTH`, `INFO`, a probe write), refuses one that cannot
//! take LMCache's stores or would stop taking them once full
//! ([`crate::judge`]), records the launch's cache identity
//! ([`crate::identity`]), and moves credentials written in a spec to the
//! server's environment (`LMCACHE_RESP_USERNAME`, `LMCACHE_RESP_PASSWORD`,
//! which LMCache 0.5.6 reads when the spec has none), so that no
//! command line carries them. The whole start is bounded
//! ([`START_DEADLINE`]). While the server runs, a thread reads each
//! Redis's `INFO` every [`WATCH_PERIOD`]; the metrics and `inspect` show
//! its last read ([`RunningTiers::series`]), so a scrape never waits on a
//! Redis. One that stops answering, or restarts, is warned of: LMCache
//! 0.5.6's RESP client never reconnects to a Redis that restarted, so the
//! tier stores nothing until the server restarts (`docs/redis.md`, "A
//! Redis that restarts").
//!
//! A launch checks and watches; the `erebine-lmcache server` it starts
//! learns so from [`RESP_CHECKED`] and does neither a second time.

use std::future::Future;
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lmcache_tier_spec::adapter::{
    RunningTiers, SeriesSource, StartContext, TierAdapter, TierSeries,
};
use lmcache_tier_spec::Cascade;

use crate::client::{self, InfoFailed, SCRAPE_TIMEOUT, START_TIMEOUT};
use crate::identity::{self, CacheIdentity};
use crate::info::RedisInfo;
use crate::judge::{judge, judge_clients, Verdict};
use crate::spec::{
    resp_tiers, Credentials, RespTier, PASSWORD, PASSWORD_ENV, USERNAME, USERNAME_ENV,
};
use crate::RespError;

/// The variable a process whose adapter checked and watches the `resp`
/// tiers sets for the server it starts (`1`): `erebine-lmcache server`
/// started by a launch then leaves them to the launch. A launch itself
/// never reads it.
pub const RESP_CHECKED: &str = "EREBINE_LMCACHE_RESP_CHECKED";

/// How often each Redis is read while the server runs.
pub const WATCH_PERIOD: Duration = Duration::from_secs(10);

/// The most the start's checks of every tier may take together: a Redis
/// that answers a byte at a time never trips a read's timeout.
pub const START_DEADLINE: Duration = Duration::from_secs(20);

/// Reads older than this many watch periods show the Redis as not
/// answering (the watcher is stuck in a read that never ends).
const STALE_PERIODS: u32 = 3;

/// What to check when a Redis cannot be used.
const UNREACHABLE_FIX: &str = "Start the Redis, or correct \"host\" and \"port\"; where it refused the credentials, correct \"username\" and \"password\" (or LMCACHE_RESP_USERNAME and LMCACHE_RESP_PASSWORD). A launch does not start a server whose tier cannot store";

/// The key of the start's probe write, deleted at once (and expiring in
/// 10 s should the delete fail).
const PROBE_KEY: &str = "lmcache-tier:probe";

/// The `resp` tiers of one cascade, not started.
#[derive(Debug)]
pub struct RespTiers {
    cascade: Cascade,
    identity: Option<CacheIdentity>,
    period: Duration,
}

impl RespTiers {
    /// The `resp` tiers of `cascade` (none: the adapter does nothing); a
    /// launch gives its cache `identity` to record in each Redis,
    /// `erebine-lmcache` run alone none.
    pub fn of(cascade: &Cascade, identity: Option<CacheIdentity>) -> Self {
        RespTiers {
            cascade: cascade.clone(),
            identity,
            period: WATCH_PERIOD,
        }
    }

    /// The same, its Redis read every `period` instead of
    /// [`WATCH_PERIOD`] (tests that wait for a read).
    pub fn with_watch_period(self, period: Duration) -> Self {
        RespTiers { period, ..self }
    }
}

impl TierAdapter for RespTiers {
    type Error = RespError;
    type Running = RunningResp;

    fn check(&self) -> Result<(), RespError> {
        resp_tiers(&self.cascade).map(|_| ())
    }

    fn start(
        self,
        context: &StartContext<'_>,
    ) -> impl Future<Output = Result<RunningResp, RespError>> + Send {
        let env = context.env;
        let tiers = resp_tiers(&self.cascade).map(|tiers| {
            let with_credentials = |t: RespTier| {
                let credentials = t.credentials.or_from(env);
                (t, credentials)
            };
            tiers.into_iter().map(with_credentials).collect::<Vec<_>>()
        });
        let checked_by_parent = self.identity.is_none() && env(RESP_CHECKED).is_some();
        async move {
            let tiers = tiers?;
            if tiers.is_empty() || checked_by_parent {
                return Ok(RunningResp {
                    under_parent: checked_by_parent,
                    ..RunningResp::default()
                });
            }
            let addresses: Vec<(usize, String)> = tiers
                .iter()
                .map(|(t, _)| (t.position, t.address()))
                .collect();
            let at = Arc::new(AtomicUsize::new(0));
            let (identity, period, reached) = (self.identity, self.period, at.clone());
            // A thread of its own, not the runtime's blocking pool: one left
            // behind in a read that never ends must not hold up the
            // runtime's shutdown (it ends with the process).
            let (done, result) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let _ = done.send(start(tiers, identity.as_ref(), period, &reached));
            });
            match tokio::time::timeout(START_DEADLINE, result).await {
                Ok(Ok(started)) => started,
                Ok(Err(_)) => panic!("the resp tiers' start thread ended without an answer"),
                Err(_) => {
                    let (position, address) = addresses[at.load(Ordering::Relaxed)].clone();
                    Err(RespError::Unreachable {
                        position,
                        address,
                        detail: format!(
                            "its answers did not end within {} s",
                            START_DEADLINE.as_secs()
                        ),
                        fix: UNREACHABLE_FIX,
                    })
                }
            }
        }
    }
}

/// Reaches, judges, probes and records each tier's Redis, in cascade
/// order, storing in `at` the index of the tier it is at; then starts the
/// watcher.
fn start(
    tiers: Vec<(RespTier, Credentials)>,
    identity: Option<&CacheIdentity>,
    period: Duration,
    at: &AtomicUsize,
) -> Result<RunningResp, RespError> {
    let moved = tiers
        .iter()
        .find(|(t, _)| t.credentials.any())
        .map(|(t, _)| t.credentials.clone());
    let mut watched = Vec::with_capacity(tiers.len());
    for (index, (tier, credentials)) in tiers.into_iter().enumerate() {
        at.store(index, Ordering::Relaxed);
        let (connection, info) = reach(&tier, &credentials)?;
        watched.push(Watched {
            tier,
            credentials,
            connection: Mutex::new(Some(connection)),
            state: Mutex::new(Seen {
                answering: true,
                run_id: info.run_id.clone(),
                last: Some((Read::Info(info), Instant::now())),
            }),
            restarts: AtomicU64::new(0),
        });
        if let (Some(identity), Some(last)) = (identity, watched.last()) {
            last.record(identity);
        }
    }
    let watched = Arc::new(watched);
    Ok(RunningResp {
        watcher: Some(watch(watched.clone(), period)),
        watched,
        moved,
        under_parent: false,
        period,
    })
}

/// Connects to `tier`'s Redis, reads and judges its `INFO` and probes a
/// write, as LMCache's client will need.
///
/// # Errors
/// [`RespError::Unreachable`] (no answer, no address LMCache can reach,
/// credentials refused), [`RespError::Refused`] (it would refuse stores).
fn reach(
    tier: &RespTier,
    credentials: &Credentials,
) -> Result<(redis::Connection, RedisInfo), RespError> {
    let unreachable = |detail: String| RespError::Unreachable {
        position: tier.position,
        address: tier.address(),
        detail,
        fix: UNREACHABLE_FIX,
    };
    ipv4_reachable(tier).map_err(unreachable)?;
    let mut connection = client::connect(tier, credentials, START_TIMEOUT).map_err(unreachable)?;
    let info = match client::info(&mut connection, credentials) {
        Ok(info) => {
            judged(tier, &info)?;
            info
        }
        Err(InfoFailed::Refused(detail)) => {
            tracing::warn!(
                "L2 tier {} (resp): Redis at {} refuses INFO ({detail}), so its maxmemory and maxmemory-policy go unjudged and the metrics show only whether it answers. Let the user run INFO (ACL: +info), or check those settings yourself (docs/redis.md)",
                tier.position,
                tier.address()
            );
            RedisInfo::default()
        }
        Err(InfoFailed::Unreachable(detail)) => return Err(unreachable(detail)),
    };
    probe_write(tier, &mut connection, credentials)?;
    Ok((connection, info))
}

/// `tier`'s host has an IPv4 address: LMCache 0.5.6's RESP client resolves
/// it for IPv4 only. A name that does not resolve is left to the connect,
/// which names it.
fn ipv4_reachable(tier: &RespTier) -> Result<(), String> {
    let Ok(addresses) = (tier.host.as_str(), tier.port).to_socket_addrs() else {
        return Ok(());
    };
    let addresses: Vec<_> = addresses.collect();
    match addresses.is_empty() || addresses.iter().any(|a| a.is_ipv4()) {
        true => Ok(()),
        false => Err("the host resolves to IPv6 addresses only, and LMCache 0.5.6's RESP client connects over IPv4 only; give an IPv4 address or a name with one".into()),
    }
}

/// Writes and deletes [`PROBE_KEY`] as the tier's user: a read-only
/// replica, a user without write rights or a full Redis refuses it, and
/// would refuse every store of LMCache's.
///
/// # Errors
/// [`RespError::Refused`], naming the Redis's answer; a broken connection
/// is [`RespError::Unreachable`].
fn probe_write(
    tier: &RespTier,
    connection: &mut redis::Connection,
    credentials: &Credentials,
) -> Result<(), RespError> {
    let written = redis::cmd("SET")
        .arg(PROBE_KEY)
        .arg(1)
        .arg("PX")
        .arg(10_000)
        .query::<()>(connection)
        .and_then(|()| redis::cmd("DEL").arg(PROBE_KEY).query::<()>(connection));
    let Err(e) = written else {
        return Ok(());
    };
    let detail = client::detail(&e, credentials);
    let position = tier.position;
    let address = tier.address();
    let reason = match e.code() {
        None => {
            return Err(RespError::Unreachable {
                position,
                address,
                detail,
                fix: UNREACHABLE_FIX,
            })
        }
        Some("READONLY") => format!("Redis at {address} is a read-only replica ({detail}): every store of LMCache's would fail. Point the tier at the primary"),
        Some("OOM") => format!("Redis at {address} is full and refuses writes ({detail}): every store of LMCache's would fail. Free it, or set maxmemory-policy allkeys-lru"),
        Some(_) => format!("Redis at {address} refuses a write as this user ({detail}): every store of LMCache's would fail. Give the user LMCache's commands (ACL: +set +get +exists +del, on every key)"),
    };
    Err(RespError::Refused { position, reason })
}

/// Reads every Redis of `watched` every `period` on a thread of its own,
/// until the sender it returns is dropped.
fn watch(watched: Arc<Vec<Watched>>, period: Duration) -> Sender<()> {
    let (stop, stopped) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(period) {
            for one in watched.iter() {
                one.read();
            }
        }
    });
    stop
}

/// Logs what `tier`'s Redis is and what the judge says; a refusal is the
/// error. A Redis whose `maxclients` cannot take LMCache's connections
/// (`num_workers`, and ours) is refused too; one nearly there is warned of.
fn judged(tier: &RespTier, info: &RedisInfo) -> Result<(), RespError> {
    let position = tier.position;
    tracing::info!(
        "L2 tier {position} (resp): Redis {} at {}: maxmemory {} bytes, maxmemory-policy {}, used_memory {} bytes, {} keys",
        info.version.as_deref().unwrap_or("(version not given)"),
        tier.address(),
        info.maxmemory.unwrap_or(0),
        info.maxmemory_policy.as_deref().unwrap_or("(not given)"),
        info.used_memory.unwrap_or(0),
        info.keys,
    );
    for verdict in [Some(judge(tier, info)), judge_clients(tier, info)]
        .into_iter()
        .flatten()
    {
        match verdict {
            Verdict::Fits => {}
            Verdict::Warn(text) => tracing::warn!("L2 tier {position} (resp): {text}"),
            Verdict::Refuse(reason) => return Err(RespError::Refused { position, reason }),
        }
    }
    Ok(())
}

impl Watched {
    /// Records `identity` in the Redis and warns when it served others;
    /// a Redis that will not record it is warned of, not refused
    /// (LMCache's own keys are what the tier is for).
    fn record(&self, identity: &CacheIdentity) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut kept = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        let Some(connection) = kept.as_mut() else {
            return;
        };
        let (position, address) = (self.tier.position, self.tier.address());
        match identity::record(connection, identity, now) {
            Ok(others) if others.is_empty() => {}
            Ok(others) => tracing::warn!(
                "{}",
                identity::unfenced_warning(position, &address, identity, &others)
            ),
            Err(e) => tracing::warn!(
                "L2 tier {position} (resp): cannot record this launch's cache identity in Redis at {address} ({}), so a Redis shared with other identities of the model goes unwarned",
                client::detail(&e, &self.credentials)
            ),
        }
    }
}

/// One tier's Redis, watched: the connection of the start, kept for the
/// reads (made again after one fails), and what the last read saw.
struct Watched {
    tier: RespTier,
    credentials: Credentials,
    connection: Mutex<Option<redis::Connection>>,
    state: Mutex<Seen>,
    /// Restarts seen (a new `run_id`) since the start.
    restarts: AtomicU64,
}

/// What one read of a Redis got.
#[derive(Clone)]
enum Read {
    /// Its `INFO`.
    Info(RedisInfo),
    /// An error to `INFO` (renamed away, or not allowed): it answers.
    Refused,
    /// No answer.
    Down,
}

/// What the reads of a Redis saw.
struct Seen {
    /// Whether it answered the last time (for the log's transitions).
    answering: bool,
    run_id: Option<String>,
    /// The last read, and when it ended.
    last: Option<(Read, Instant)>,
}

/// The started `resp` tiers.
#[derive(Default)]
pub struct RunningResp {
    watched: Arc<Vec<Watched>>,
    /// The credentials written in the specs, moved to the server's
    /// environment.
    moved: Option<Credentials>,
    /// Dropped to stop the watcher thread.
    watcher: Option<Sender<()>>,
    /// The process that started this server checks and watches the tiers
    /// ([`RESP_CHECKED`]).
    under_parent: bool,
    /// How often the watcher reads.
    period: Duration,
}

impl RunningTiers for RunningResp {
    type View = ();
    type Error = RespError;

    /// The tiers without `username` and `password`: the server reads them
    /// from its environment ([`RunningTiers::server_env`]).
    fn server_tiers(&self, cascade: &mut Cascade) {
        for watched in self.watched.iter() {
            if let Some(spec) = cascade.0.get_mut(watched.tier.position) {
                *spec = spec.rewritten(&[USERNAME, PASSWORD], []);
            }
        }
    }

    /// `LMCACHE_RESP_USERNAME` and `LMCACHE_RESP_PASSWORD`, set to the
    /// specs' credentials where a spec gave them (one it left out stays as
    /// the environment has it: LMCache falls back field by field); and
    /// [`RESP_CHECKED`], set when this adapter checked and watches tiers,
    /// removed when its parent did.
    fn server_env(&self) -> Vec<(&'static str, Option<String>)> {
        let mut env = Vec::new();
        if let Some(credentials) = &self.moved {
            if let Some(username) = &credentials.username {
                env.push((USERNAME_ENV, Some(username.clone())));
            }
            if let Some(password) = &credentials.password {
                env.push((PASSWORD_ENV, Some(password.clone())));
            }
        }
        if self.watcher.is_some() || self.under_parent {
            env.push((
                RESP_CHECKED,
                self.watcher.is_some().then(|| "1".to_string()),
            ));
        }
        env
    }

    fn view(&self) {}

    fn series(&self) -> Option<Arc<dyn SeriesSource>> {
        match self.watched.is_empty() {
            true => None,
            false => Some(Arc::new(RespSeries {
                watched: self.watched.clone(),
                stale: self.period * STALE_PERIODS,
            })),
        }
    }

    fn stop(self) {
        drop(self);
    }
}

/// The figures of every watched Redis, from the watcher's last reads.
struct RespSeries {
    watched: Arc<Vec<Watched>>,
    /// How old a read may be and still count.
    stale: Duration,
}

/// One family of [`RespSeries`]: its name, help, unit and counter-ness, and
/// the field of `INFO` it shows.
struct Family {
    family: &'static str,
    help: &'static str,
    bytes: bool,
    counter: bool,
    value: fn(&RedisInfo) -> Option<u64>,
}

/// The families, in the order a scrape shows them (`docs/metrics.md`,
/// "Tier series").
const FAMILIES: &[Family] = &[
    Family {
        family: "resp_used_memory",
        help: "Redis's used_memory: what it has allocated, its own overhead and every client's keys included.",
        bytes: true,
        counter: false,
        value: |i| i.used_memory,
    },
    Family {
        family: "resp_max_memory",
        help: "Redis's maxmemory, at which its maxmemory-policy acts; 0: none.",
        bytes: true,
        counter: false,
        value: |i| i.maxmemory,
    },
    Family {
        family: "resp_keys",
        help: "Keys in the Redis, every database and client.",
        bytes: false,
        counter: false,
        value: |i| Some(i.keys),
    },
    Family {
        family: "resp_evicted_keys",
        help: "Keys Redis evicted for maxmemory since it started, every client's.",
        bytes: false,
        counter: true,
        value: |i| i.evicted_keys,
    },
    Family {
        family: "resp_keyspace_hits",
        help: "Reads of a key that existed since Redis started, every client's (LMCache's lookups and loads included).",
        bytes: false,
        counter: true,
        value: |i| i.keyspace_hits,
    },
    Family {
        family: "resp_keyspace_misses",
        help: "Reads of a key that did not exist since Redis started, every client's (LMCache's lookups of chunks it does not hold included).",
        bytes: false,
        counter: true,
        value: |i| i.keyspace_misses,
    },
];

impl Watched {
    /// Reads the Redis's `INFO` now, over the kept connection, and once
    /// more over a new one if that fails (a Redis that restarted breaks
    /// the kept one); stores and logs what it saw ([`Watched::saw`]).
    fn read(&self) {
        let first = self.read_once();
        let read = match first {
            Read::Down => self.read_once(),
            other => other,
        };
        self.saw(read);
    }

    /// One read: [`Read::Down`] when the Redis does not answer within
    /// [`SCRAPE_TIMEOUT`] a read (the connection is then dropped).
    fn read_once(&self) -> Read {
        let mut kept = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        if kept.is_none() {
            *kept = client::connect(&self.tier, &self.credentials, SCRAPE_TIMEOUT).ok();
        }
        let read = match kept.as_mut() {
            None => Read::Down,
            Some(connection) => match connection.set_read_timeout(Some(SCRAPE_TIMEOUT)) {
                Err(_) => Read::Down,
                Ok(()) => match client::info(connection, &self.credentials) {
                    Ok(info) => Read::Info(info),
                    Err(InfoFailed::Refused(_)) => Read::Refused,
                    Err(InfoFailed::Unreachable(_)) => Read::Down,
                },
            },
        };
        if matches!(read, Read::Down) {
            *kept = None;
        }
        read
    }

    /// Stores `read` as the last one and logs what changed: the Redis
    /// stopped or started answering, or restarted (a new `run_id`,
    /// counted).
    fn saw(&self, read: Read) {
        let mut seen = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.log_answering(&mut seen, !matches!(read, Read::Down));
        if let Read::Info(RedisInfo {
            run_id: Some(run_id),
            ..
        }) = &read
        {
            if seen.run_id.as_ref().is_some_and(|before| before != run_id) {
                self.restarts.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "L2 tier {} (resp): Redis at {} restarted under the running LMCache server (a new run_id): LMCache 0.5.6's RESP client does not reconnect, so the tier stores and loads nothing until the LMCache server restarts. Restart the launch to reconnect (L1's contents are lost with it)",
                    self.tier.position,
                    self.tier.address()
                );
            }
            seen.run_id = Some(run_id.clone());
        }
        seen.last = Some((read, Instant::now()));
    }

    /// Logs a change of whether the Redis answers.
    fn log_answering(&self, seen: &mut Seen, answering: bool) {
        let (position, address) = (self.tier.position, self.tier.address());
        match (seen.answering, answering) {
            (true, false) => tracing::warn!(
                "L2 tier {position} (resp): Redis at {address} does not answer: the tier stores and loads nothing while it is down"
            ),
            (false, true) => tracing::info!("L2 tier {position} (resp): Redis at {address} answers again"),
            _ => {}
        }
        seen.answering = answering;
    }

    /// The last read, or [`Read::Down`] when it is older than `stale` (the
    /// watcher is stuck in a read that does not end), said once.
    fn last(&self, stale: Duration) -> Read {
        let mut seen = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match seen.last.clone() {
            Some((read, at)) if at.elapsed() <= stale => read,
            _ => {
                self.log_answering(&mut seen, false);
                Read::Down
            }
        }
    }
}

impl SeriesSource for RespSeries {
    fn series(&self) -> Vec<TierSeries> {
        let mut series = Vec::new();
        for watched in self.watched.iter() {
            let read = watched.last(self.stale);
            let tier = watched.tier.position;
            series.push(TierSeries {
                family: "resp_up",
                help: "1 when the tier's Redis answered the watcher's last read (INFO, or an error to it; read every 10 s), 0 when it did not.",
                tier,
                kind: "resp",
                bytes: false,
                counter: false,
                value: u64::from(!matches!(read, Read::Down)),
            });
            series.push(TierSeries {
                family: "resp_restarts_seen",
                help: "Restarts of the tier's Redis seen while the launch ran (a new run_id): LMCache 0.5.6's RESP client does not reconnect, so after one the tier stores nothing until the LMCache server restarts.",
                tier,
                kind: "resp",
                bytes: false,
                counter: true,
                value: watched.restarts.load(Ordering::Relaxed),
            });
            let Read::Info(info) = read else { continue };
            series.extend(FAMILIES.iter().filter_map(|family| {
                Some(TierSeries {
                    family: family.family,
                    help: family.help,
                    tier,
                    kind: "resp",
                    bytes: family.bytes,
                    counter: family.counter,
                    value: (family.value)(&info)?,
                })
            }));
        }
        series
    }
}
