//! The adapters of a server's tiers, one per kind that needs one, driven
//! through the tier seam ([`lmcache_tier_spec::adapter`]) by one loop, for
//! a launch ([`crate::run::launch`]) and for `erebine-lmcache`
//! ([`crate::run::drop_in`]) alike: all checked (reading only) before
//! anything starts,
//! then started in order (each watched by the metrics as it starts), the
//! server's tiers and environment taken from what they started, the work
//! that waits for the server started once it listens (by
//! `erebine-lmcache`, the process that sees the server listen: a launch's
//! adapters leave nothing waiting), and all stopped when dropped
//! (`docs/design.md`, "Adding a tier kind").
//!
//! The kinds: the gateways of `s3_bucket` tiers
//! ([`lmcache_s3_gateway::adapter`]), then the capacity guards of disk
//! tiers ([`lmcache_capacity_guard::adapter`]), then the Redis checks of
//! `resp` tiers ([`lmcache_resp::adapter`]). A kind with no adapter is
//! LMCache's alone. What an adapter gives as neutral per-tier series
//! ([`RunningTiers::series`]) the metrics serve with no code of its kind.

use std::fmt::Debug;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;

use lmcache_capacity_guard::adapter::GuardTiers;
use lmcache_capacity_guard::capacity::GuardSpec;
use lmcache_capacity_guard::GuardError;
use lmcache_resp::adapter::RespTiers;
use lmcache_resp::identity::CacheIdentity;
use lmcache_resp::RespError;
use lmcache_s3_gateway::adapter::GatewayTiers;
use lmcache_s3_gateway::{GatewayError, GatewaysView};
use lmcache_tier_spec::adapter::{RunningTiers, StartContext, TierAdapter};
use lmcache_tier_spec::Cascade;

use crate::metrics::NodeMetrics;

/// Why an adapter refused its tiers or could not start; each knows its
/// exit status (`HasExitStatus`, in `crate::exit`).
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    /// An `s3_bucket` tier cannot work, or its gateway cannot start.
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    /// A guarded tier's capacity is unusable, or its guard cannot start.
    #[error(transparent)]
    Guard(#[from] GuardError),
    /// A `resp` tier's spec is bad, or its Redis cannot be used or would
    /// refuse its stores.
    #[error(transparent)]
    Resp(#[from] RespError),
}

/// The adapters of one cascade, in the order they start; none started.
#[derive(Debug)]
pub struct TierAdapters(Vec<Box<dyn Adapter>>);

impl TierAdapters {
    /// The adapter of every kind that has one, for the server's `cascade`:
    /// its gateways, then `guards` (a launch's or a server's, which the
    /// caller picks: [`GuardTiers::of_launch`], [`GuardTiers::of_server`]),
    /// then its `resp` tiers, which record the launch's cache `identity`
    /// (`None` for `erebine-lmcache`, which has no engine flags).
    pub fn new(cascade: &Cascade, guards: GuardTiers, identity: Option<CacheIdentity>) -> Self {
        Self(vec![
            Box::new(GatewayTiers::of(cascade)),
            Box::new(guards),
            Box::new(RespTiers::of(cascade, identity)),
        ])
    }

    /// Checks every adapter's tiers, reading only.
    ///
    /// # Errors
    /// The first tier that cannot work, in start order.
    pub fn check(&self) -> Result<(), AdapterError> {
        self.0.iter().try_for_each(|adapter| adapter.check())
    }

    /// Starts every adapter in order, each watched by `metrics` from its
    /// start, with the server's environment `env`, `owner` as the owner
    /// of what they write for the metrics and `node_dir` as the
    /// directory the launch alone uses ([`StartContext::node_dir`]).
    ///
    /// # Errors
    /// The first adapter that could not start; those started before it
    /// are stopped.
    pub async fn start(
        self,
        env: &(dyn Fn(&str) -> Option<String> + Sync),
        owner: &str,
        node_dir: Option<&Path>,
        metrics: &NodeMetrics,
    ) -> Result<RunningAdapters, AdapterError> {
        let context = StartContext {
            env,
            owner,
            node_dir,
        };
        let mut running = RunningAdapters(Vec::with_capacity(self.0.len()));
        for adapter in self.0 {
            let started = adapter.start(&context).await?;
            started.watch(metrics);
            running.0.push(started);
        }
        Ok(running)
    }
}

/// The started adapters of one cascade; dropping them stops them, in
/// start order.
pub struct RunningAdapters(Vec<Box<dyn Running>>);

impl RunningAdapters {
    /// The server's tiers: `cascade` with each adapter's tiers pointed at
    /// what it started.
    pub fn server_tiers(&self, cascade: &Cascade) -> Cascade {
        let mut tiers = cascade.clone();
        for running in &self.0 {
            running.server_tiers(&mut tiers);
        }
        tiers
    }

    /// What the server's environment needs, every adapter's in start
    /// order: `(name, None)` to remove, `(name, Some(value))` to set.
    /// Values may be secret: never printed.
    pub fn server_env(&self) -> Vec<(&'static str, Option<String>)> {
        self.0.iter().flat_map(|r| r.server_env()).collect()
    }

    /// The server has really started: each adapter starts what waited.
    ///
    /// # Errors
    /// The first that could not start; the caller stops the server.
    pub fn server_listens(&mut self) -> Result<(), AdapterError> {
        self.0.iter_mut().try_for_each(|r| r.server_listens())
    }
}

/// Stops every adapter ([`RunningTiers::stop`]), in start order.
impl Drop for RunningAdapters {
    fn drop(&mut self) {
        for running in self.0.drain(..) {
            running.stop();
        }
    }
}

/// A view of a running adapter that the metrics read at every scrape.
trait Watched {
    /// Hands the view to `metrics`.
    fn watch_in(self, metrics: &NodeMetrics);
}

/// A kind whose whole view is its series ([`RunningTiers::series`]).
impl Watched for () {
    fn watch_in(self, _: &NodeMetrics) {}
}

impl Watched for GatewaysView {
    fn watch_in(self, metrics: &NodeMetrics) {
        metrics.watch_gateways(self);
    }
}

impl Watched for Vec<GuardSpec> {
    fn watch_in(self, metrics: &NodeMetrics) {
        metrics.watch_guards(self);
    }
}

/// A future that starts one adapter.
type Starting<'a> =
    Pin<Box<dyn Future<Output = Result<Box<dyn Running>, AdapterError>> + Send + 'a>>;

/// [`TierAdapter`] with its kind's types erased, so that one list holds
/// every kind.
trait Adapter: Send + Debug {
    fn check(&self) -> Result<(), AdapterError>;
    fn start<'a>(self: Box<Self>, context: &'a StartContext<'a>) -> Starting<'a>;
}

impl<A> Adapter for A
where
    A: TierAdapter + Debug + 'static,
    AdapterError: From<A::Error>,
    <A::Running as RunningTiers>::View: Watched,
{
    fn check(&self) -> Result<(), AdapterError> {
        Ok(TierAdapter::check(self)?)
    }

    fn start<'a>(self: Box<Self>, context: &'a StartContext<'a>) -> Starting<'a> {
        Box::pin(async move {
            let running = TierAdapter::start(*self, context).await?;
            Ok(Box::new(running) as Box<dyn Running>)
        })
    }
}

/// [`RunningTiers`] with its kind's types erased.
trait Running: Send + Sync {
    fn server_tiers(&self, cascade: &mut Cascade);
    fn server_env(&self) -> Vec<(&'static str, Option<String>)>;
    fn server_listens(&mut self) -> Result<(), AdapterError>;
    fn watch(&self, metrics: &NodeMetrics);
    fn stop(self: Box<Self>);
}

impl<R> Running for R
where
    R: RunningTiers,
    AdapterError: From<R::Error>,
    R::View: Watched,
{
    fn server_tiers(&self, cascade: &mut Cascade) {
        RunningTiers::server_tiers(self, cascade);
    }

    fn server_env(&self) -> Vec<(&'static str, Option<String>)> {
        RunningTiers::server_env(self)
    }

    fn server_listens(&mut self) -> Result<(), AdapterError> {
        Ok(RunningTiers::server_listens(self)?)
    }

    fn watch(&self, metrics: &NodeMetrics) {
        self.view().watch_in(metrics);
        if let Some(series) = self.series() {
            metrics.watch_series(series);
        }
    }

    fn stop(self: Box<Self>) {
        RunningTiers::stop(*self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmcache_capacity_guard::adapter::{GUARDED_BY_LAUNCH, GUARD_OWNER};
    use lmcache_capacity_guard::capacity::guard_specs;
    use lmcache_tier_e2e::answering_store;

    /// An `s3_bucket` tier on the loopback store at `port`, under `prefix`.
    fn bucket(port: u16, prefix: &str) -> String {
        format!(
            r#"{{"type":"s3","s3_endpoint":"127.0.0.1:{port}","s3_bucket":"kv-cache","s3_key_prefix":"{prefix}","s3_region":"us-east-1","disable_tls":true,"aws_access_key_id":"AKIATIERS","aws_secret_access_key":"TIERS-SECRET"}}"#
        )
    }

    /// A guarded `fs` tier of `gb` GiB in `dir`.
    fn disk(dir: &std::path::Path, gb: &str) -> String {
        format!(r#"{{"type":"fs","base_path":{dir:?},"max_capacity_gb":{gb}}}"#)
    }

    /// The adapters of `tiers` as `erebine-lmcache` makes them.
    fn adapters_of(tiers: &[String]) -> (Cascade, TierAdapters) {
        let cascade = Cascade::parse(&format!("[{}]", tiers.join(",")), "test").unwrap();
        let guards = GuardTiers::of_server(guard_specs(&cascade).unwrap(), &|_| None);
        let adapters = TierAdapters::new(&cascade, guards, None);
        (cascade, adapters)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_server_gets_each_adapters_tiers_and_environment_in_start_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = answering_store("200 OK");
        let (cascade, adapters) = adapters_of(&[disk(dir.path(), "0.001"), bucket(store, "")]);
        adapters.check().unwrap();
        let metrics = NodeMetrics::new(None);
        let running = adapters
            .start(&|_| None, "owner", None, &metrics)
            .await
            .unwrap();
        let server = running.server_tiers(&cascade);
        assert_eq!(
            server.tiers()[0],
            cascade.tiers()[0],
            "the disk tier as written"
        );
        let endpoint = &server.tiers()[1].as_object()["s3_endpoint"];
        let gateway = endpoint.as_str().and_then(|e| e.strip_prefix("127.0.0.1:"));
        assert!(
            gateway.is_some_and(|port| port != store.to_string()),
            "{endpoint}"
        );
        let env: Vec<(&str, bool)> = running
            .server_env()
            .into_iter()
            .map(|(name, value)| (name, value.is_some()))
            .collect();
        let key = env
            .iter()
            .position(|e| *e == ("AWS_SECRET_ACCESS_KEY", true));
        let guards = env.iter().position(|e| *e == (GUARDED_BY_LAUNCH, false));
        assert!(key.is_some() && key < guards, "{env:?}");
        assert_eq!(env.last(), Some(&(GUARD_OWNER, false)), "{env:?}");
    }

    #[test]
    fn a_refused_tier_keeps_its_kinds_error_and_nothing_starts() {
        let dir = tempfile::tempdir().unwrap();
        let (_, overlapping) = adapters_of(&[bucket(1, "a/"), bucket(1, "a/b/")]);
        let e = overlapping.check().unwrap_err();
        assert!(matches!(e, AdapterError::Gateway(_)), "{e:?}");
        assert!(e.to_string().contains("L2 tier 1"), "{e}");
        let (_, too_large) = adapters_of(&[disk(dir.path(), "1e9")]);
        let e = too_large.check().unwrap_err();
        assert!(matches!(e, AdapterError::Guard(_)), "{e:?}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
