//! Whether a Redis can hold a `resp` tier, from its `maxmemory` and
//! `maxmemory-policy` and the tier's `max_capacity_gb` (`docs/redis.md`,
//! "What the launch checks"). Pure.
//!
//! LMCache's keys carry no expiry (its native client writes them with a
//! plain `SET`), so of Redis's policies only the `allkeys-*` ones ever
//! evict them; `noeviction` and every `volatile-*` policy leave a full
//! Redis refusing writes (`OOM command not allowed`), after which the tier
//! stores nothing new. LMCache bounds the tier itself only with
//! `max_capacity_gb` (and an `eviction` block, which the plan adds).

use crate::info::RedisInfo;
use crate::spec::RespTier;

/// How much of `maxmemory` a `max_capacity_gb` may take on a Redis that
/// does not evict: `used_memory` counts Redis's own overhead (keys,
/// allocator) beside the values LMCache counts.
pub const HEADROOM: f64 = 0.9;

/// The judgement of one tier against one Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to say.
    Fits,
    /// It works, with a cost the operator should know (the text says it and
    /// what to set).
    Warn(String),
    /// It would stop storing once full: the launch refuses it (the text says
    /// why and what to set).
    Refuse(String),
}

/// Whether the Redis takes LMCache's connections: `num_workers` of them
/// (each worker of its native client holds one) and the launch's own.
/// `None` when it fits, or says nothing of its clients.
pub fn judge_clients(tier: &RespTier, info: &RedisInfo) -> Option<Verdict> {
    let most = info.maxclients?;
    let needed = tier.num_workers + 1;
    let address = tier.address();
    let connected = info.connected_clients.unwrap_or(0);
    if most < needed {
        return Some(Verdict::Refuse(format!(
            "Redis at {address} takes at most {most} clients (maxclients), and LMCache's client opens num_workers = {} connections beside the launch's one: its workers past that get no connection and their stores fail. Raise maxclients, or lower \"num_workers\"",
            tier.num_workers
        )));
    }
    (connected + needed > most).then(|| Verdict::Warn(format!(
        "Redis at {address} has {connected} of its {most} clients (maxclients) connected, and LMCache's client opens {} more: stores fail while it has no room. Raise maxclients, or lower \"num_workers\"",
        tier.num_workers
    )))
}

/// Whether `policy` evicts keys without an expiry.
pub fn evicts_lmcache_keys(policy: &str) -> bool {
    policy.starts_with("allkeys-")
}

/// Judges `tier` against the Redis whose `INFO` is `info`.
pub fn judge(tier: &RespTier, info: &RedisInfo) -> Verdict {
    let address = tier.address();
    let maxmemory = info.maxmemory.unwrap_or(0);
    let policy = info.maxmemory_policy.as_deref().unwrap_or("noeviction");
    let capacity = tier.max_capacity_bytes;
    let gib = |bytes: u64| format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64);
    if maxmemory == 0 {
        return match capacity {
            Some(_) => Verdict::Fits,
            None => Verdict::Warn(format!(
                "Redis at {address} has no maxmemory, and the tier no max_capacity_gb: nothing bounds what LMCache stores there, and Redis takes memory until its host runs out. Set maxmemory and maxmemory-policy allkeys-lru in Redis, or max_capacity_gb on the tier"
            )),
        };
    }
    let evicts = evicts_lmcache_keys(policy);
    match (evicts, capacity) {
        (true, Some(bytes)) if bytes > maxmemory => Verdict::Warn(format!(
            "max_capacity_gb ({}) is above Redis's maxmemory ({}) at {address}: Redis evicts LMCache's keys first ({policy}), so LMCache counts keys that are gone. Set max_capacity_gb to at most {}",
            gib(bytes), gib(maxmemory), gib(maxmemory)
        )),
        (true, _) => Verdict::Fits,
        (false, None) => Verdict::Refuse(format!(
            "Redis at {address} has maxmemory {} with maxmemory-policy {policy}, which evicts none of LMCache's keys (they have no expiry): once full it refuses every store and the tier caches nothing new. Set maxmemory-policy allkeys-lru in Redis (CONFIG SET maxmemory-policy allkeys-lru, and in its redis.conf), or give the tier max_capacity_gb of at most {} so that LMCache evicts its own keys",
            gib(maxmemory), gib(headroom(maxmemory))
        )),
        (false, Some(bytes)) if bytes > maxmemory => Verdict::Refuse(format!(
            "max_capacity_gb ({}) is above Redis's maxmemory ({}) at {address}, whose maxmemory-policy {policy} evicts none of LMCache's keys: Redis refuses every store before LMCache evicts. Set max_capacity_gb to at most {}, or maxmemory-policy allkeys-lru in Redis",
            gib(bytes), gib(maxmemory), gib(headroom(maxmemory))
        )),
        (false, Some(bytes)) if bytes > headroom(maxmemory) => Verdict::Warn(format!(
            "max_capacity_gb ({}) leaves less than a tenth of Redis's maxmemory ({}) at {address} for Redis's own overhead, and its maxmemory-policy {policy} evicts none of LMCache's keys: Redis may refuse stores before LMCache evicts. Set max_capacity_gb to at most {}",
            gib(bytes), gib(maxmemory), gib(headroom(maxmemory))
        )),
        (false, Some(_)) => Verdict::Fits,
    }
}

/// [`HEADROOM`] of `maxmemory`, in bytes.
fn headroom(maxmemory: u64) -> u64 {
    (maxmemory as f64 * HEADROOM) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Credentials;

    const GIB: u64 = 1 << 30;

    fn tier(capacity: Option<u64>) -> RespTier {
        RespTier {
            position: 0,
            host: "127.0.0.1".into(),
            port: 6379,
            credentials: Credentials::default(),
            num_workers: 8,
            max_capacity_bytes: capacity,
        }
    }

    fn info(maxmemory: u64, policy: &str) -> RedisInfo {
        RedisInfo {
            maxmemory: Some(maxmemory),
            maxmemory_policy: Some(policy.into()),
            ..RedisInfo::default()
        }
    }

    fn kind(verdict: &Verdict) -> &'static str {
        match verdict {
            Verdict::Fits => "fits",
            Verdict::Warn(_) => "warn",
            Verdict::Refuse(_) => "refuse",
        }
    }

    #[test]
    fn every_policy_and_bound_has_its_verdict() {
        let cases = [
            (0, "noeviction", None, "warn"),
            (0, "allkeys-lru", None, "warn"),
            (0, "noeviction", Some(GIB), "fits"),
            (4 * GIB, "allkeys-lru", None, "fits"),
            (4 * GIB, "allkeys-lfu", Some(2 * GIB), "fits"),
            (4 * GIB, "allkeys-random", Some(5 * GIB), "warn"),
            (4 * GIB, "noeviction", None, "refuse"),
            (4 * GIB, "volatile-lru", None, "refuse"),
            (4 * GIB, "volatile-ttl", Some(5 * GIB), "refuse"),
            (4 * GIB, "noeviction", Some(4 * GIB - 1), "warn"),
            (4 * GIB, "volatile-lfu", Some(3 * GIB), "fits"),
        ];
        for (maxmemory, policy, capacity, expected) in cases {
            let verdict = judge(&tier(capacity), &info(maxmemory, policy));
            assert_eq!(
                kind(&verdict),
                expected,
                "{maxmemory} {policy} {capacity:?}: {verdict:?}"
            );
        }
    }

    #[test]
    fn lmcaches_connections_must_fit_maxclients() {
        let clients = |most, connected| RedisInfo {
            maxclients: Some(most),
            connected_clients: Some(connected),
            ..RedisInfo::default()
        };
        let tier = tier(None);
        assert_eq!(judge_clients(&tier, &RedisInfo::default()), None);
        assert_eq!(judge_clients(&tier, &clients(10_000, 3)), None);
        assert!(matches!(
            judge_clients(&tier, &clients(4, 1)),
            Some(Verdict::Refuse(_))
        ));
        assert!(matches!(
            judge_clients(&tier, &clients(12, 5)),
            Some(Verdict::Warn(_))
        ));
        assert_eq!(
            judge_clients(&tier, &clients(9, 0)),
            None,
            "8 workers and the launch"
        );
    }

    #[test]
    fn a_refusal_says_what_to_set_with_the_figures() {
        let Verdict::Refuse(text) = judge(&tier(None), &info(GIB, "noeviction")) else {
            panic!("not refused");
        };
        assert!(text.contains("127.0.0.1:6379"), "{text}");
        assert!(
            text.contains("maxmemory 1.00 GiB with maxmemory-policy noeviction"),
            "{text}"
        );
        assert!(
            text.contains("CONFIG SET maxmemory-policy allkeys-lru"),
            "{text}"
        );
        assert!(
            text.contains("max_capacity_gb of at most 0.90 GiB"),
            "{text}"
        );
        let unknown = RedisInfo::default();
        assert_eq!(
            kind(&judge(&tier(None), &unknown)),
            "warn",
            "no maxmemory read: none set"
        );
    }
}
