//! The keys this project adds to LMCache's tier specs, checked before a
//! plan is made: `max_capacity_gb` and the `eviction` block of `fs` and
//! `fs_native` tiers (the capacity guard's rules, `docs/capacity-guard.md`)
//! and `s3_bucket` on `s3` tiers (the S3 gateway's rules,
//! `docs/s3-gateway.md`). Each check is the one its crate applies when the
//! server starts, so `--dry-run` refuses what `erebine-lmcache server` would.

use lmcache_capacity_guard::capacity::{
    check_guard_keys, guard_spec, guard_specs, CapacityError, GuardSpec,
};
use lmcache_resp::spec::resp_tiers;
use lmcache_resp::RespError;
use lmcache_s3_gateway::bound::BoundSpec;
use lmcache_s3_gateway::fleet::rule::{BUCKET_BOUND, MODELS};
use lmcache_s3_gateway::identity::CACHE_IDENTITY;
use lmcache_s3_gateway::spec::{
    check_default_chain, check_overlapping_prefixes, BucketSpecError, BucketTier,
};
use lmcache_tier_spec::capacity::EVICTION;
use lmcache_tier_spec::{Cascade, TierKind, TierSpec};

/// A tier the server would refuse at start because of a key we add.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ExtensionError {
    /// A bad `max_capacity_gb` or `eviction` block, or two guarded tiers in
    /// one directory.
    #[error(transparent)]
    Capacity(#[from] CapacityError),
    /// Unusable `s3_bucket` settings.
    #[error(transparent)]
    Bucket(#[from] BucketSpecError),
    /// A `resp` tier's keys LMCache would refuse, or credentials that
    /// differ between its tiers (`docs/redis.md`).
    #[error(transparent)]
    Resp(#[from] RespError),
    /// An `eviction` block LMCache refuses when the server starts: not an
    /// object, or without one of [`EVICTION_POLICIES`].
    #[error("L2 tier {position}: \"eviction\" = {block} has no eviction_policy LMCache takes, so the server would refuse the tier at start: write \"eviction_policy\": \"LRU\" (or \"ARC\", \"IsolatedLRU\", \"noop\") in the block, e.g. {{\"eviction_policy\":\"LRU\",\"trigger_watermark\":0.8,\"eviction_ratio\":0.2}}, or leave the block out")]
    EvictionPolicy {
        /// The tier's position in the cascade (0-based).
        position: usize,
        /// The block as written (at most 80 characters shown).
        block: String,
    },
    /// A `raw_block` tier whose block device something else uses (a
    /// mount, LVM, md): LMCache would overwrite it
    /// ([`crate::plan::raw_block::refusal`] words it).
    #[error("{0}")]
    RawBlockInUse(String),
}

/// The eviction policies LMCache takes in a tier's `eviction` block:
/// `L2AdapterConfigBase._parse_eviction_config` in LMCache 0.5.6 (and
/// 0.5.7rc2) refuses an `eviction` block without one of them, for every
/// adapter type, and the server does not start.
pub const EVICTION_POLICIES: [&str; 4] = ["LRU", "ARC", "IsolatedLRU", "noop"];

/// Every `eviction` block of `cascade` that is not `null` is an object
/// with one of [`EVICTION_POLICIES`].
fn check_eviction_policies(cascade: &Cascade) -> Result<(), ExtensionError> {
    for (position, tier) in cascade.tiers().iter().enumerate() {
        let block = match tier.as_object().get(EVICTION) {
            None | Some(serde_json::Value::Null) => continue,
            Some(block) => block,
        };
        let policy = block
            .get("eviction_policy")
            .and_then(serde_json::Value::as_str);
        if !policy.is_some_and(|p| EVICTION_POLICIES.contains(&p)) {
            return Err(ExtensionError::EvictionPolicy {
                position,
                block: lmcache_tier_spec::shown_value(&block.to_string()),
            });
        }
    }
    Ok(())
}

/// Checks the keys this project adds, as far as that is possible without
/// writing to the disk or reaching the network: the guard's
/// [`guard_specs`] (`max_capacity_gb`, the `eviction` block, two guarded
/// tiers in one directory) and, for each `s3` tier with `s3_bucket`,
/// [`BucketTier::from_spec`] (region, bucket name, endpoint, key prefix,
/// CA bundle readable, credential keys paired; `env` looks up the `AWS_*`
/// variables the server will get), and that every `eviction` block names
/// a policy LMCache takes ([`EVICTION_POLICIES`]). The volume's size and
/// the object store are checked when the server starts.
///
/// # Errors
/// The first problem, as the guard or the gateway words it: the tier by
/// position (and `base_path`), the key, the value, what to write.
pub fn check_extensions(
    cascade: &Cascade,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<(), ExtensionError> {
    guard_specs(cascade)?;
    for (position, tier) in cascade.tiers().iter().enumerate() {
        BucketTier::from_spec(tier, position, env)?;
    }
    check_bucket_bounds(cascade)?;
    resp_tiers(cascade)?;
    check_eviction_policies(cascade)
}

/// What [`check_extensions`] checks without reading any file: every value,
/// the pairing of credential keys, two guarded tiers whose `base_path`s
/// are one path written two ways, and, beside `s3_bucket` tiers, `s3`
/// tiers that would sign with the gateways' key ([`check_default_chain`]),
/// and the `eviction` blocks' policies. Not checked here: a CA bundle's contents,
/// the AWS files the environment names, and `base_path`s that meet through
/// a symlink.
///
/// # Errors
/// As [`check_extensions`].
pub fn check_extension_keys(
    cascade: &Cascade,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<(), ExtensionError> {
    check_guard_keys(cascade)?;
    for (position, tier) in cascade.tiers().iter().enumerate() {
        BucketTier::check_keys(tier, position, env)?;
    }
    check_default_chain(cascade.tiers())?;
    check_bucket_bounds(cascade)?;
    resp_tiers(cascade)?;
    check_eviction_policies(cascade)
}

/// The bucket bound's numbers of each `s3_bucket` tier
/// ([`BoundSpec::from_spec`]: `max_capacity_gb`, `eviction.trigger_watermark`,
/// `eviction.eviction_ratio`, a prefix that ends a path segment), and no
/// two such tiers whose prefixes overlap in one bucket
/// ([`check_overlapping_prefixes`]).
fn check_bucket_bounds(cascade: &Cascade) -> Result<(), ExtensionError> {
    check_overlapping_prefixes(cascade.tiers())?;
    let bucket_tiers = cascade.tiers().iter().enumerate();
    for (position, tier) in bucket_tiers.filter(|(_, t)| t.kind().is_bucket()) {
        BoundSpec::from_spec(tier, position).map_err(BucketSpecError::from)?;
    }
    Ok(())
}

/// One tier of a cascade with what the launch starts beside it, read once
/// from its spec: its kind and the capacity guard's spec (an `fs` or
/// `fs_native` tier with `max_capacity_gb`). The launch's volume check, its
/// guard and its metrics read the guard from here, never from the raw spec
/// again. (The S3 gateway reads its bucket bound from the spec it starts
/// from, in the launch as in `erebine-lmcache`.)
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTier {
    /// Its position in the cascade, 0 first.
    pub position: usize,
    /// Its spec, as the plan passes it to the server.
    pub spec: TierSpec,
    /// The capacity guard's spec ([`guard_spec`]), if the guard bounds it.
    pub guard: Option<GuardSpec>,
}

impl PlannedTier {
    /// What kind of tier it is ([`TierSpec::kind`]).
    pub fn kind(&self) -> TierKind<'_> {
        self.spec.kind()
    }
}

/// The tiers of `cascade`, each with its guard's spec, read once (`docs/design.md`, "Adding a tier kind"). Pure: two guarded tiers
/// in one directory are found by [`check_extensions`], which resolves the
/// paths.
///
/// # Errors
/// What [`check_extension_keys`] refuses of the guard's keys
/// ([`ExtensionError`]).
pub fn planned_tiers(cascade: &Cascade) -> Result<Vec<PlannedTier>, ExtensionError> {
    let mut planned = Vec::with_capacity(cascade.tiers().len());
    for (position, spec) in cascade.tiers().iter().enumerate() {
        planned.push(PlannedTier {
            position,
            spec: spec.clone(),
            guard: guard_spec(position, spec)?,
        });
    }
    Ok(planned)
}

/// `cascade` with `bucket_bound.models` set to `[model]` (vLLM's `--model`,
/// which names every LMCache object) on each `s3_bucket` tier with a bound
/// whose block names no models: the bound counts this node's model from
/// its start, and learns the others the prefix's nodes write
/// (`docs/s3-gateway.md`, "The bucket bound"). Tiers the checks refuse are
/// left as they are.
pub fn with_bound_models(cascade: Cascade, model: &str) -> Cascade {
    let tiers = cascade.0.into_iter().enumerate();
    Cascade(tiers.map(|(i, tier)| with_models(tier, i, model)).collect())
}

fn with_models(tier: TierSpec, position: usize, model: &str) -> TierSpec {
    let bounded =
        tier.kind().is_bucket() && matches!(BoundSpec::from_spec(&tier, position), Ok(Some(_)));
    let mut block = match tier.as_object().get(BUCKET_BOUND) {
        None | Some(serde_json::Value::Null) => serde_json::Map::new(),
        Some(serde_json::Value::Object(block)) => block.clone(),
        Some(_) => return tier,
    };
    if !bounded || block.contains_key(MODELS) {
        return tier;
    }
    block.insert(MODELS.into(), serde_json::json!([model]));
    tier.rewritten(&[], [(BUCKET_BOUND, serde_json::Value::Object(block))])
}

/// `cascade` with `cache_identity` set to `tag` (the launch's
/// [`lmcache_housekeeping::LaunchIdentity::tag`]) on each `s3_bucket` tier
/// that sets none: its gateway keeps LMCache's objects under that
/// identity's segment, so nodes of another identity never read them
/// (`docs/s3-gateway.md`, "The cache identity in a bucket"). A tier that
/// names its own `cache_identity` keeps it.
pub fn with_cache_identity(cascade: Cascade, tag: &str) -> Cascade {
    let tag = serde_json::Value::from(tag);
    let tiers = cascade.0.into_iter().map(|tier| {
        let bucket = tier.kind().is_bucket() && !tier.as_object().contains_key(CACHE_IDENTITY);
        match bucket {
            true => tier.rewritten(&[], [(CACHE_IDENTITY, tag.clone())]),
            false => tier,
        }
    });
    Cascade(tiers.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cascade(json: &str) -> Cascade {
        Cascade::parse(json, "t").unwrap()
    }

    #[test]
    fn an_eviction_block_without_a_policy_lmcache_takes_is_refused_on_every_kind() {
        let none = |_: &str| None;
        for block in [
            "{}",
            r#"{"eviction_policy":"FIFO"}"#,
            r#"{"eviction_policy":"lru"}"#,
            r#"{"trigger_watermark":0.8}"#,
            r#""LRU""#,
            "[]",
        ] {
            for tier in [
                r#"{"type":"mock""#,
                r#"{"type":"s3","s3_endpoint":"s3.example.net""#,
                r#"{"type":"fs_native","base_path":"/b""#,
            ] {
                let json = format!(r#"[{{"type":"mock"}},{tier},"eviction":{block}}}]"#);
                let e = check_extension_keys(&cascade(&json), &none).unwrap_err();
                assert!(
                    matches!(e, ExtensionError::EvictionPolicy { position: 1, .. }),
                    "{json}: {e}"
                );
                assert!(e.to_string().contains("L2 tier 1"), "{e}");
            }
        }
        for block in [
            "null",
            r#"{"eviction_policy":"noop"}"#,
            r#"{"eviction_policy":"IsolatedLRU"}"#,
        ] {
            let json = format!(r#"[{{"type":"mock","eviction":{block}}}]"#);
            assert_eq!(
                check_extension_keys(&cascade(&json), &none),
                Ok(()),
                "{json}"
            );
        }
    }

    #[test]
    fn each_tier_is_planned_once_with_its_guard() {
        let planned = planned_tiers(&cascade(
            r#"[{"type":"fs","base_path":"/a","max_capacity_gb":1},
                {"type":"fs_native","base_path":"/b"},
                {"type":"s3","s3_bucket":"kv","s3_key_prefix":"n/","max_capacity_gb":2},
                {"type":"s3","s3_endpoint":"s3.example.net","max_capacity_gb":3},
                {"type":"raw_block","device_path":"/dev/x","max_capacity_gb":4}]"#,
        ))
        .unwrap();
        let positions: Vec<usize> = planned.iter().map(|t| t.position).collect();
        assert_eq!(positions, [0, 1, 2, 3, 4]);
        let guarded: Vec<bool> = planned.iter().map(|t| t.guard.is_some()).collect();
        assert_eq!(guarded, [true, false, false, false, false]);
        assert_eq!(planned[0].guard.as_ref().unwrap().capacity_bytes, 1 << 30);
        assert_eq!(planned[4].kind(), TierKind::RawBlock);
        let refused = planned_tiers(&cascade(
            r#"[{"type":"fs","base_path":"/a"},{"type":"fs","base_path":"/b","max_capacity_gb":-1}]"#,
        ));
        assert!(
            matches!(refused, Err(ExtensionError::Capacity(_))),
            "{refused:?}"
        );
    }

    #[test]
    fn a_bound_tier_counts_the_launchs_model_unless_its_block_names_models() {
        let tiers = cascade(
            r#"[{"type":"s3","s3_bucket":"kv","max_capacity_gb":1,"bucket_bound":{"lease_seconds":5}},
                {"type":"s3","s3_bucket":"kv2","max_capacity_gb":1,"bucket_bound":{"models":["a","b"]}},
                {"type":"s3","s3_bucket":"kv3"},
                {"type":"fs","base_path":"/x","max_capacity_gb":1}]"#,
        );
        let out = with_bound_models(tiers, "org/m");
        let block = |i: usize| out.tiers()[i].as_object().get(BUCKET_BOUND).cloned();
        assert_eq!(
            block(0),
            Some(serde_json::json!({"lease_seconds": 5, "models": ["org/m"]}))
        );
        assert_eq!(block(1), Some(serde_json::json!({"models": ["a", "b"]})));
        assert_eq!((block(2), block(3)), (None, None));
    }

    #[test]
    fn two_tiers_of_one_bucket_whose_prefixes_overlap_stop_the_plan() {
        let tiers = cascade(
            r#"[{"type":"s3","s3_bucket":"kvc","s3_endpoint":"e:1","s3_region":"r","s3_key_prefix":"a/","aws_access_key_id":"AKIA","aws_secret_access_key":"s"},
                {"type":"s3","s3_bucket":"kvc","s3_endpoint":"e:1","s3_region":"r","aws_access_key_id":"AKIA","aws_secret_access_key":"s"}]"#,
        );
        let e = check_extension_keys(&tiers, &|_| None).unwrap_err();
        assert!(e.to_string().contains("overlaps the prefix"), "{e}");
    }
}
