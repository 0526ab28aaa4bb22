//! The keys this project adds to LMCache's tier specs, checked before a
//! plan is made: `max_capacity_gb` and the `eviction` block of `fs` and
//! `fs_native` tiers (the capacity guard's rules, `docs/capacity-guard.md`)
//! and `s3_bucket` on `s3` tiers (the S3 gateway's rules,
//! `docs/s3-gateway.md`). Each check is the one its crate applies when the
//! server starts, so `--dry-run` refuses what `erebine-lmcache server` would.

use lmcache_capacity_guard::capacity::{check_guard_keys, guard_specs, CapacityError};
use lmcache_s3_gateway::bound::BoundSpec;
use lmcache_s3_gateway::fleet::rule::{BUCKET_BOUND, MODELS};
use lmcache_s3_gateway::spec::{
    check_default_chain, check_overlapping_prefixes, BucketSpecError, BucketTier,
};
use lmcache_tier_spec::{Cascade, TierSpec};

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
}

/// Checks the keys this project adds, as far as that is possible without
/// writing to the disk or reaching the network: the guard's
/// [`guard_specs`] (`max_capacity_gb`, the `eviction` block, two guarded
/// tiers in one directory) and, for each `s3` tier with `s3_bucket`,
/// [`BucketTier::from_spec`] (region, bucket name, endpoint, key prefix,
/// CA bundle readable, credential keys paired; `env` looks up the `AWS_*`
/// variables the server will get). The volume's size and the object store
/// are checked when the server starts.
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
    check_bucket_bounds(cascade)
}

/// What [`check_extensions`] checks without reading any file: every value,
/// the pairing of credential keys, two guarded tiers whose `base_path`s
/// are one path written two ways, and, beside `s3_bucket` tiers, `s3`
/// tiers that would sign with the gateways' key ([`check_default_chain`]). Not checked here: a CA bundle's contents,
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
    check_bucket_bounds(cascade)
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
        BoundSpec::from_spec(tier, position)?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cascade(json: &str) -> Cascade {
        Cascade::parse(json, "t").unwrap()
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
