//! The seam every tier adapter fills: what runs beside the LMCache server
//! for the tiers of one kind (the capacity guards of disk tiers, the
//! gateways of `s3_bucket` tiers), driven through the same steps by a
//! launch and by `erebine-lmcache` alike (`docs/design.md`, "Adding a tier
//! kind"). A launch runs `erebine-lmcache` as its server, so an adapter that
//! runs in both hands its tiers over through the server's tiers or
//! environment (a gateway's tiers point at it; the guards name the tiers
//! the launch guards), and a launch leaves nothing for step 3.
//!
//! 1. [`TierAdapter::check`]: reads only, before anything starts (a
//!    launch's housekeeping included); a tier whose spec or volume cannot
//!    work is refused here, with nothing created or deleted. What only a
//!    start can find (a bucket's credentials and answer) is found by the
//!    start.
//! 2. [`TierAdapter::start`]: before the server; what it started may point
//!    the server's tiers elsewhere ([`RunningTiers::server_tiers`]) and set
//!    its environment ([`RunningTiers::server_env`]).
//! 3. [`RunningTiers::server_listens`]: once the server has really started
//!    (a listener in its process tree), for work that must not run for a
//!    command LMCache refuses.
//! 4. [`RunningTiers::view`]: what `inspect` and the metrics read while it
//!    runs; [`RunningTiers::series`]: the same as neutral per-tier values
//!    ([`TierSeries`]) that the metrics and `inspect` render for any kind,
//!    with no code of the kind's in either.
//! 5. [`RunningTiers::stop`]: when the server is gone.

use std::future::Future;
use std::sync::Arc;

use crate::Cascade;

/// One value of one tier, as the metrics export it for any kind
/// (`docs/metrics.md`, "Tier series"): the family
/// `lmcache_tier_<family>` (with `_bytes` when `bytes`, `_total` when
/// `counter`), labelled `tier` (the position) and `kind` (the spec's
/// `type`). `inspect` reads every family with a `kind` label back into its
/// tier's block.
#[derive(Debug, Clone, PartialEq)]
pub struct TierSeries {
    /// The family's name after `lmcache_tier_` and before its unit and
    /// `_total`, e.g. `resp_used_memory`.
    pub family: &'static str,
    /// The family's help line.
    pub help: &'static str,
    /// The tier's 0-based position in the cascade.
    pub tier: usize,
    /// The tier's `type`, e.g. `resp`.
    pub kind: &'static str,
    /// The value is in bytes.
    pub bytes: bool,
    /// The value is a counter (it only grows while its source runs).
    pub counter: bool,
    /// The value.
    pub value: u64,
}

/// What a running adapter reads for [`TierSeries`] at every scrape (it may
/// ask the store, so each call is bounded by the adapter's own timeouts).
pub trait SeriesSource: Send + Sync {
    /// The series now, in a fixed order of families; a family whose source
    /// does not answer is left out.
    fn series(&self) -> Vec<TierSeries>;
}

/// What a start gets from its caller.
#[derive(Clone, Copy)]
pub struct StartContext<'a> {
    /// The environment the server gets, by name (an adapter reads its
    /// credentials from it, as the server would).
    pub env: &'a (dyn Fn(&str) -> Option<String> + Sync),
    /// The owner of what the adapters write for the metrics to read (the
    /// capacity guards' status files): whose endpoint serves it.
    pub owner: &'a str,
    /// A directory of this machine that outlives the launch and that only
    /// this launch uses while it runs (the disk tier's, under its lock);
    /// `None` for none. The gateways keep their bucket bound's node ids
    /// there, so a restart after a crash takes its lease back at once.
    pub node_dir: Option<&'a std::path::Path>,
}

/// The adapter of one tier kind, for the tiers of one cascade: built from
/// the cascade (or the plan's tiers) by the adapter's crate, checked, then
/// started once.
pub trait TierAdapter: Send {
    /// Why a tier cannot work, or its adapter cannot start; the tier's
    /// position and key are in the message.
    type Error: std::error::Error + Send + Sync + 'static;
    /// The started adapter.
    type Running: RunningTiers<Error = Self::Error>;

    /// Checks every tier of the adapter's kind against what it needs
    /// (keys, volume, ...), reading only.
    ///
    /// # Errors
    /// The first tier that cannot work.
    fn check(&self) -> Result<(), Self::Error>;

    /// Starts what the tiers need before the server starts.
    ///
    /// # Errors
    /// The first tier whose adapter could not start; whatever it had
    /// started is stopped.
    fn start(
        self,
        context: &StartContext<'_>,
    ) -> impl Future<Output = Result<Self::Running, Self::Error>> + Send;
}

/// A started [`TierAdapter`]: serves until [`RunningTiers::stop`] or drop.
pub trait RunningTiers: Send + Sync + 'static {
    /// What `inspect` and the metrics read of the running adapter, for a
    /// reader that outlives this borrow.
    type View;
    /// Why work left for [`RunningTiers::server_listens`] failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Points the tiers of `cascade` (the server's, in cascade order) that
    /// this adapter serves at what it started; the others are left as they
    /// are. The default changes nothing.
    fn server_tiers(&self, cascade: &mut Cascade) {
        let _ = cascade;
    }

    /// What the server's environment needs, in order: `(name, None)`
    /// removes a variable, `(name, Some(value))` sets one. Values may be
    /// secret: never printed. The default needs nothing.
    fn server_env(&self) -> Vec<(&'static str, Option<String>)> {
        Vec::new()
    }

    /// The server has really started: starts what waited for it. The
    /// default has nothing waiting.
    ///
    /// # Errors
    /// What could not start; the caller stops the server.
    fn server_listens(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }

    /// What `inspect` and the metrics read.
    fn view(&self) -> Self::View;

    /// The adapter's per-tier values for the metrics and `inspect`
    /// ([`TierSeries`]), read at every scrape; `None` (the default) for an
    /// adapter whose view the launcher renders itself.
    fn series(&self) -> Option<Arc<dyn SeriesSource>> {
        None
    }

    /// Stops everything the adapter started (a guard's last status is
    /// written before this returns; a gateway's runtime is told to stop).
    fn stop(self);
}
