//! The keys this project adds to LMCache's tier specs, checked before a
//! plan is made: `max_capacity_gb` and the `eviction` block of `fs` and
//! `fs_native` tiers (the capacity guard's rules, `docs/capacity-guard.md`)
//! and `s3_bucket` on `s3` tiers (the S3 gateway's rules,
//! `docs/s3-gateway.md`). Each check is the one its crate applies when the
//! server starts, so `--dry-run` refuses what `erebine-lmcache server` would.

use lmcache_capacity_guard::capacity::{check_guard_keys, guard_specs, CapacityError};
use lmcache_s3_gateway::bound::BoundSpec;
use lmcache_s3_gateway::spec::{check_default_chain, BucketSpecError, BucketTier};
use lmcache_tier_spec::Cascade;

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
/// `eviction.eviction_ratio`).
fn check_bucket_bounds(cascade: &Cascade) -> Result<(), ExtensionError> {
    let bucket_tiers = cascade.tiers().iter().enumerate();
    for (position, tier) in bucket_tiers.filter(|(_, t)| lmcache_s3_gateway::needs_gateway(t)) {
        BoundSpec::from_spec(tier, position)?;
    }
    Ok(())
}
