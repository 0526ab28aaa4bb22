//! Redis (or Valkey) as an LMCache L2 tier: LMCache 0.5.6's `resp`
//! adapter (`RESPL2AdapterConfig`: `host`, `port`, `num_workers`,
//! `username`, `password`, `max_capacity_gb`), written through the native
//! RESP client of its wheel's `lmcache_redis` extension. LMCache runs the
//! tier; this crate is its adapter behind the tier seam
//! ([`lmcache_tier_spec::adapter`]; `docs/redis.md`):
//!
//! - [`spec`]: the tier's keys, checked before anything starts (pure);
//! - [`info`]: Redis's `INFO` answer, read (pure);
//! - [`judge`]: whether a Redis with that `maxmemory` and
//!   `maxmemory-policy` can hold the tier (pure);
//! - [`identity`]: the cache identities a Redis has served, for the
//!   warning that it is shared across identities;
//! - [`adapter`]: the seam itself: the Redis reached and judged at start,
//!   the credentials moved from the server's command line to its
//!   environment, and the figures the metrics and `inspect` show.

pub mod adapter;
mod client;
pub mod identity;
pub mod info;
pub mod judge;
pub mod spec;

/// Why a `resp` tier cannot work; every message names the tier by its
/// position in the cascade and says what to do.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RespError {
    /// A key of the spec is missing or unusable.
    #[error("L2 tier {position} (resp): {key}: {problem}. {fix}")]
    Spec {
        /// The tier's 0-based position in the cascade.
        position: usize,
        /// The key, e.g. `port`.
        key: &'static str,
        /// What is wrong with it.
        problem: String,
        /// What to write instead.
        fix: &'static str,
    },
    /// Two `resp` tiers give different credentials: the server reads one
    /// `LMCACHE_RESP_USERNAME` and `LMCACHE_RESP_PASSWORD` for all.
    #[error("L2 tier {position} (resp): its username and password differ from those of L2 tier {first}. The launch hands a resp tier's credentials to the LMCache server by LMCACHE_RESP_USERNAME and LMCACHE_RESP_PASSWORD, one pair for the whole server, never on its command line: give every resp tier of the cascade the same credentials (or none)")]
    Credentials {
        /// The tier whose credentials differ.
        position: usize,
        /// The first tier with credentials.
        first: usize,
    },
    /// The Redis did not answer, or refused the connection or the
    /// credentials.
    #[error("L2 tier {position} (resp): cannot use Redis at {address}: {detail}. {fix}")]
    Unreachable {
        /// The tier's position.
        position: usize,
        /// `host:port`.
        address: String,
        /// What failed (the client's words; never a credential).
        detail: String,
        /// What to check.
        fix: &'static str,
    },
    /// The Redis answers but would refuse the tier's stores
    /// ([`judge::Verdict::Refuse`]).
    #[error("L2 tier {position} (resp): {reason}")]
    Refused {
        /// The tier's position.
        position: usize,
        /// Why, and what to set.
        reason: String,
    },
}
