//! The `resp` tiers behind the tier seam ([`lmcache_tier_spec::adapter`];
//! `docs/redis.md`). Nothing runs beside the server: the start reaches each
//! tier's Redis (`AUTH` and `INFO`), refuses one that would stop storing
//! once full ([`crate::judge`]), records the launch's cache identity
//! ([`crate::identity`]), and moves credentials written in a spec to the
//! server's environment (`LMCACHE_RESP_USERNAME`, `LMCACHE_RESP_PASSWORD`,
//! which LMCache 0.5.6 reads when the spec has none), so that no
//! command line carries them. While the server runs, each Redis is read
//! every [`WATCH_PERIOD`] and at every scrape (`INFO`, for the metrics and
//! `inspect`: [`RunningTiers::series`]); one that stops answering, or
//! restarts, is warned of: LMCache 0.5.6's RESP client never reconnects
//! to a Redis that restarted, so the tier stores nothing until the
//! server restarts (`docs/redis.md`, "A Redis that restarts").
//!
//! A launch checks and watches; the `erebine-lmcache server` it starts
//! learns so from [`RESP_CHECKED`] and does neither a second time.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lmcache_tier_spec::adapter::{
    RunningTiers, SeriesSource, StartContext, TierAdapter, TierSeries,
};
use lmcache_tier_spec::Cascade;

use crate::client::{self, InfoFailed, SCRAPE_TIMEOUT, START_TIMEOUT};
use crate::identity::{self, CacheIdentity};
use crate::info::RedisInfo;
use crate::judge::{judge, Verdict};
use crate::spec::{
    resp_tiers, Credentials, RespTier, PASSWORD, PASSWORD_ENV, USERNAME, USERNAME_ENV,
};
use crate::RespError;

/// The variable a process whose adapter checked and watches the `resp`
/// tiers sets for the server it starts (`1`): `erebine-lmcache server`
/// started by a launch then leaves them to the launch.
pub const RESP_CHECKED: &str = "EREBINE_LMCACHE_RESP_CHECKED";

/// How often each Redis is read while the server runs, scrapes or not.
pub const WATCH_PERIOD: Duration = Duration::from_secs(10);

/// What to check when a Redis cannot be used.
const UNREACHABLE_FIX: &str = "Start the Redis, or correct \"host\" and \"port\"; where it refused the credentials, correct \"username\" and \"password\" (or LMCACHE_RESP_USERNAME and LMCACHE_RESP_PASSWORD). A launch does not start a server whose tier cannot store";

/// The `resp` tiers of one cascade, not started.
#[derive(Debug)]
pub struct RespTiers {
    cascade: Cascade,
    identity: Option<CacheIdentity>,
}

impl RespTiers {
    /// The `resp` tiers of `cascade` (none: the adapter does nothing); a
    /// launch gives its cache `identity` to record in each Redis,
    /// `erebine-lmcache` run alone none.
    pub fn of(cascade: &Cascade, identity: Option<CacheIdentity>) -> Self {
        RespTiers {
            cascade: cascade.clone(),
            identity,
        }
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
        let tiers = resp_tiers(&self.cascade);
        let from_env = Credentials::default().or_from(context.env);
        let checked_by_parent = (context.env)(RESP_CHECKED).is_some();
        async move {
            let tiers = tiers?;
            if tiers.is_empty() || checked_by_parent {
                return Ok(RunningResp {
                    under_parent: checked_by_parent,
                    ..RunningResp::default()
                });
            }
            let identity = self.identity;
            tokio::task::spawn_blocking(move || start(tiers, &from_env, identity.as_ref()))
                .await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        }
    }
}

/// Reaches, judges and records each tier's Redis, in cascade order.
fn start(
    tiers: Vec<RespTier>,
    from_env: &Credentials,
    identity: Option<&CacheIdentity>,
) -> Result<RunningResp, RespError> {
    let moved = tiers
        .iter()
        .find(|t| t.credentials.any())
        .map(|t| t.credentials.clone());
    let mut watched = Vec::with_capacity(tiers.len());
    for tier in tiers {
        let credentials = match tier.credentials.any() {
            true => tier.credentials.clone(),
            false => from_env.clone(),
        };
        let unreachable = |detail: String| RespError::Unreachable {
            position: tier.position,
            address: tier.address(),
            detail,
            fix: UNREACHABLE_FIX,
        };
        let mut connection =
            client::connect(&tier, &credentials, START_TIMEOUT).map_err(unreachable)?;
        let info = match client::info(&mut connection, &credentials) {
            Ok(info) => {
                judged(&tier, &info)?;
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
        if let Some(identity) = identity {
            record(&tier, &mut connection, identity, &credentials);
        }
        watched.push(Watched {
            tier,
            credentials,
            connection: Mutex::new(Some(connection)),
            state: Mutex::new(Seen {
                answering: true,
                run_id: info.run_id,
            }),
            restarts: AtomicU64::new(0),
        });
    }
    let watched = Arc::new(watched);
    Ok(RunningResp {
        watcher: Some(watch(watched.clone())),
        watched,
        moved,
        under_parent: false,
    })
}

/// Reads every Redis of `watched` every [`WATCH_PERIOD`] on a thread of
/// its own, until the sender it returns is dropped.
fn watch(watched: Arc<Vec<Watched>>) -> Sender<()> {
    let (stop, stopped) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(WATCH_PERIOD) {
            for one in watched.iter() {
                one.info();
            }
        }
    });
    stop
}

/// Logs what `tier`'s Redis is and what the judge says; a refusal is the
/// error.
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
    match judge(tier, info) {
        Verdict::Fits => Ok(()),
        Verdict::Warn(text) => {
            tracing::warn!("L2 tier {position} (resp): {text}");
            Ok(())
        }
        Verdict::Refuse(reason) => Err(RespError::Refused { position, reason }),
    }
}

/// Records `identity` in `tier`'s Redis and warns when it served others;
/// a Redis that will not record it is warned of, not refused (LMCache's
/// own keys are what the tier is for).
fn record(
    tier: &RespTier,
    connection: &mut redis::Connection,
    identity: &CacheIdentity,
    credentials: &Credentials,
) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    match identity::record(connection, identity, now) {
        Ok(others) if others.is_empty() => {}
        Ok(others) => tracing::warn!(
            "{}",
            identity::unfenced_warning(tier.position, &tier.address(), identity, &others)
        ),
        Err(e) => tracing::warn!(
            "L2 tier {} (resp): cannot record this launch's cache identity in Redis at {} ({}), so a Redis shared with other identities of the model goes unwarned",
            tier.position,
            tier.address(),
            client::detail(&e, credentials)
        ),
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
enum Read {
    /// Its `INFO`.
    Info(RedisInfo),
    /// An error to `INFO` (renamed away, or not allowed): it answers.
    Refused,
    /// No answer.
    Down,
}

/// What the last read of a Redis saw.
struct Seen {
    answering: bool,
    run_id: Option<String>,
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
    /// specs' credentials (one left out is removed, so that an inherited
    /// one does not pair with the other), when a spec gave any; and
    /// [`RESP_CHECKED`], set when this adapter checked and watches tiers,
    /// removed when its parent did.
    fn server_env(&self) -> Vec<(&'static str, Option<String>)> {
        let mut env = Vec::new();
        if let Some(credentials) = &self.moved {
            env.push((USERNAME_ENV, credentials.username.clone()));
            env.push((PASSWORD_ENV, credentials.password.clone()));
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
            false => Some(Arc::new(RespSeries(self.watched.clone()))),
        }
    }

    fn stop(self) {
        drop(self);
    }
}

/// The figures of every watched Redis, read at a scrape.
struct RespSeries(Arc<Vec<Watched>>);

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
    /// The Redis's `INFO` now, over the kept connection or a new one
    /// ([`Read::Down`] when it does not answer within [`SCRAPE_TIMEOUT`]).
    /// Each change of what it is seen to do is logged once
    /// ([`Watched::saw`]).
    fn info(&self) -> Read {
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
        self.saw(&read);
        read
    }

    /// Logs what changed since the last read: the Redis stopped or started
    /// answering, or restarted (a new `run_id`, counted).
    fn saw(&self, read: &Read) {
        let mut seen = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (position, address) = (self.tier.position, self.tier.address());
        let answering = !matches!(read, Read::Down);
        match (seen.answering, answering) {
            (true, false) => tracing::warn!(
                "L2 tier {position} (resp): Redis at {address} does not answer: the tier stores and loads nothing while it is down"
            ),
            (false, true) => tracing::info!("L2 tier {position} (resp): Redis at {address} answers again"),
            _ => {}
        }
        seen.answering = answering;
        let Read::Info(RedisInfo {
            run_id: Some(run_id),
            ..
        }) = read
        else {
            return;
        };
        let run_id = run_id.clone();
        if seen.run_id.as_ref().is_some_and(|before| *before != run_id) {
            self.restarts.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "L2 tier {position} (resp): Redis at {address} restarted under the running LMCache server (a new run_id): LMCache 0.5.6's RESP client does not reconnect, so the tier stores and loads nothing until the LMCache server restarts. Restart the launch to reconnect (L1's contents are lost with it)"
            );
        }
        seen.run_id = Some(run_id);
    }
}

impl SeriesSource for RespSeries {
    fn series(&self) -> Vec<TierSeries> {
        let mut series = Vec::new();
        for watched in self.0.iter() {
            let info = watched.info();
            let tier = watched.tier.position;
            series.push(TierSeries {
                family: "resp_up",
                help: "1 when the tier's Redis answered at this scrape (INFO, or an error to it), 0 when it did not.",
                tier,
                kind: "resp",
                bytes: false,
                counter: false,
                value: u64::from(!matches!(info, Read::Down)),
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
            let Read::Info(info) = info else { continue };
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
