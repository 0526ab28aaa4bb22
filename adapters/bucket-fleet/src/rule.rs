//! The bucket bound's numbers: when a bound evicts and to where, from the
//! tier's `max_capacity_gb`, `eviction` block and `bucket_bound` periods
//! (`docs/s3-gateway.md`, "The bucket bound").

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Timing;
use lmcache_tier_spec::capacity::{BoundKeyError, CapacityRule};
use lmcache_tier_spec::TierSpec;

/// The share of the capacity (1/50, 2%) a node writes after which it
/// lists again on a store without conditional writes
/// ([`super::Mode::EveryNode`]). Every node of the fleet does the same,
/// so between two listings of a writing node the bucket grows by about 2%
/// of the capacity per writing node past what that node sees. The cost: a full
/// bucket of N objects lists in N/1,000 pages (ListObjectsV2 requests),
/// and the node wrote N/50 objects (PUT requests, the same price class on
/// S3) in between, so the listings add at most 5% to the node's own
/// request bill, whatever the bucket's size (`docs/s3-gateway.md`, "The
/// bucket bound").
pub const LISTING_SHARE: u64 = 50;
/// The shortest time between two listings, however fast this node writes.
pub const MIN_LISTING_GAP: Duration = Duration::from_secs(1);

/// Who acts first on the tier: LMCache ([`BoundRole::HardBound`]: it
/// evicts the keys its process stored at its watermark, and the gateway
/// acts halfway from there to the capacity, on what the bucket holds) or
/// the gateway ([`BoundRole::Evictor`]: no `eviction` block); the rule is
/// `lmcache-tier-spec`'s, shared with the capacity guard.
pub use lmcache_tier_spec::capacity::BoundRole;

/// A key of an `s3` tier the bound reads (`max_capacity_gb`, `eviction`,
/// `bucket_bound`, `s3_key_prefix`) that cannot work; the gateway reports
/// it as its own spec error, at the same place in the cascade.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("L2 tier {position} (s3): {key}: {problem}. {fix}")]
pub struct BoundSpecError {
    /// The tier's 0-based position in the cascade.
    pub position: usize,
    /// The key at fault (`bucket_bound.models` for a key inside the block).
    pub key: &'static str,
    /// What is wrong, the value quoted as
    /// [`shown_value`](lmcache_tier_spec::shown_value) quotes it.
    pub problem: String,
    /// What to do.
    pub fix: String,
}

/// When the gateway evicts from a bucket, and to where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundSpec {
    /// `max_capacity_gb` in bytes (GiB, rounded down).
    pub capacity_bytes: u64,
    /// Usage at or above which a cycle starts.
    pub trigger_bytes: u64,
    /// Usage a cycle ends at or below: the trigger less `eviction_ratio` x
    /// capacity, as LMCache's own cycles free.
    pub target_bytes: u64,
    /// Bytes this node writes after which it lists again: the capacity
    /// over [`LISTING_SHARE`].
    pub listing_every_bytes: u64,
    /// Evictor or hard bound.
    pub role: BoundRole,
    /// The fleet's periods: the lease, the reports, the listings.
    pub timing: Timing,
}

/// The tier key of the bound's periods: an object of whole seconds,
/// `{"lease_seconds": 30, "report_seconds": 60, "read_reports_seconds":
/// 10, "listing_seconds": 300, "abandoned_upload_seconds": 3600}`, each
/// optional ([`Timing`]'s defaults).
pub const BUCKET_BOUND: &str = "bucket_bound";

/// Where a key of [`BUCKET_BOUND`] goes in [`Timing`].
type TimingField = fn(&mut Timing) -> &mut Duration;

/// The keys of [`BUCKET_BOUND`], with the field each sets.
const TIMING_KEYS: [(&str, TimingField); 5] = [
    ("lease_seconds", |t| &mut t.lease),
    ("report_seconds", |t| &mut t.report),
    ("read_reports_seconds", |t| &mut t.read_reports),
    ("listing_seconds", |t| &mut t.listing),
    ("abandoned_upload_seconds", |t| &mut t.abandoned_upload),
];

/// The periods of a tier's `bucket_bound` block (absent: the defaults).
///
/// # Errors
/// A block that is not an object, an unknown key, or a value that is not
/// a whole number of seconds from 1 to 86,400, naming the key.
pub fn timing_of(spec: &TierSpec, position: usize) -> Result<Timing, BoundSpecError> {
    let mut timing = Timing::default();
    let block = match spec.as_object().get(BUCKET_BOUND) {
        None | Some(Value::Null) => return Ok(timing),
        Some(Value::Object(block)) => block,
        Some(other) => {
            return Err(BoundSpecError {
                position,
                key: BUCKET_BOUND,
                problem: format!("{other} is not an object"),
                fix: "Give bucket_bound as an object of periods in seconds, such as {\"lease_seconds\": 30}.".into(),
            })
        }
    };
    for (name, value) in block.iter().filter(|(name, _)| *name != MODELS) {
        let Some((key, field)) = TIMING_KEYS.iter().find(|(k, _)| k == name) else {
            return Err(BoundSpecError {
                position,
                key: BUCKET_BOUND,
                problem: format!("{name:?} is not one of its keys"),
                fix: format!(
                    "Use only {}, {MODELS}.",
                    TIMING_KEYS.map(|(k, _)| k).join(", ")
                ),
            });
        };
        let seconds = value.as_u64().filter(|s| (1..=86_400).contains(s));
        let Some(seconds) = seconds else {
            return Err(BoundSpecError {
                position,
                key: BUCKET_BOUND,
                problem: format!(
                    "{key} = {value} is not a whole number of seconds from 1 to 86400"
                ),
                fix: format!("Give {key} as whole seconds, such as 30."),
            });
        };
        *field(&mut timing) = Duration::from_secs(seconds);
    }
    Ok(timing)
}

/// The key of [`BUCKET_BOUND`] that names the models whose objects the
/// bound counts from its start (`["meta-llama/Llama-3.1-8B"]`, as vLLM's
/// `--model` gives them); it learns the others as they are written
/// ([`super::models`]).
pub const MODELS: &str = "models";

/// The models of a tier's `bucket_bound.models` (absent: none).
///
/// # Errors
/// A value that is not an array of at most
/// [`MAX_MODELS`](super::models::MAX_MODELS) non-empty strings of at most
/// 1,024 bytes, naming the key.
pub fn models_of(spec: &TierSpec, position: usize) -> Result<Vec<String>, BoundSpecError> {
    let block = spec
        .as_object()
        .get(BUCKET_BOUND)
        .and_then(Value::as_object);
    let Some(value) = block.and_then(|b| b.get(MODELS)) else {
        return Ok(Vec::new());
    };
    let models: Option<Vec<String>> = value.as_array().and_then(|items| {
        items
            .iter()
            .map(|m| m.as_str().filter(|m| !m.is_empty() && m.len() <= 1024))
            .map(|m| m.map(str::to_string))
            .collect()
    });
    match models {
        Some(models) if models.len() <= super::models::MAX_MODELS => Ok(models),
        _ => Err(BoundSpecError {
            position,
            key: "bucket_bound.models",
            problem: format!(
                "{} is not a list of model names",
                lmcache_tier_spec::shown_value(&value.to_string())
            ),
            fix: format!(
                "Give the models whose objects the bound counts as vLLM's --model names them, at most {}, such as [\"meta-llama/Llama-3.1-8B\"].",
                super::models::MAX_MODELS
            ),
        }),
    }
}

/// A bound counts what is under its prefix, so the prefix must end where a
/// path segment ends (`docs/s3-gateway.md`, "The bucket bound"): under
/// `p`, the keys `p2/m@...` and `pm@...` of other tiers decode as
/// LMCache's for the models `2/m` and `m`.
///
/// # Errors
/// A `s3_key_prefix` that is not empty and does not end with `/`.
fn check_bound_prefix(spec: &TierSpec, position: usize) -> Result<(), BoundSpecError> {
    let prefix = spec
        .as_object()
        .get("s3_key_prefix")
        .and_then(Value::as_str)
        .unwrap_or("");
    if prefix.is_empty() || prefix.ends_with('/') {
        return Ok(());
    }
    Err(BoundSpecError {
        position,
        key: "s3_key_prefix",
        problem: format!(
            "{} does not end with / on a tier with max_capacity_gb: the bucket bound would count and evict every key that starts with it, other tiers' included",
            lmcache_tier_spec::shown_value(prefix)
        ),
        fix: format!(
            "End s3_key_prefix with /, such as {}.",
            lmcache_tier_spec::shown_value(&format!("{prefix}/"))
        ),
    })
}

impl BoundSpec {
    /// The bound of the `s3` tier `spec` at `position`: `None` without a
    /// `max_capacity_gb` above 0 (nothing to bound). The role is
    /// [`BoundRole::HardBound`] when LMCache evicts the tier itself
    /// ([`TierSpec::lmcache_evicts`]), else [`BoundRole::Evictor`];
    /// `eviction.trigger_watermark` and `eviction.eviction_ratio` default
    /// to LMCache's 0.8 and 0.2.
    ///
    /// The periods come from the tier's [`BUCKET_BOUND`] block
    /// ([`timing_of`]).
    ///
    /// # Errors
    /// A `max_capacity_gb`, `eviction.trigger_watermark` or
    /// `eviction.eviction_ratio` that is not a number in range, a bad
    /// `bucket_bound` block, or a `s3_key_prefix` that does not end with
    /// `/` (`docs/s3-gateway.md`, "What it counts"), naming it.
    pub fn from_spec(spec: &TierSpec, position: usize) -> Result<Option<Self>, BoundSpecError> {
        let err = |key: &'static str, value: &Value, range: &str| BoundSpecError {
            position,
            key,
            problem: format!("{value} is not a number {range}"),
            fix: format!("Give {key} as a number {range}."),
        };
        let bound = spec.bound().map_err(|e| match e {
            BoundKeyError::Capacity(value) => err("max_capacity_gb", value, "of GiB, 0 or more"),
            BoundKeyError::UnderAByte(value) => err(
                "max_capacity_gb",
                value,
                "of GiB of at least one byte, or 0",
            ),
            BoundKeyError::TooLarge(value) => {
                err("max_capacity_gb", value, "of GiB below 2^64 bytes")
            }
            BoundKeyError::Block(value) => err("eviction", value, "block: an object"),
            BoundKeyError::Fraction { key, value } => err(key, value, "in (0, 1]"),
        })?;
        let Some(bound) = bound else {
            return Ok(None);
        };
        check_bound_prefix(spec, position)?;
        models_of(spec, position)?;
        let role = if spec.lmcache_evicts() {
            BoundRole::HardBound
        } else {
            BoundRole::Evictor
        };
        let timing = timing_of(spec, position)?;
        let bound = Self::new(
            bound.capacity_bytes,
            bound.trigger_watermark,
            bound.eviction_ratio,
            role,
        );
        Ok(Some(BoundSpec { timing, ..bound }))
    }

    /// The bound of a capacity of `capacity_bytes` evicted at `watermark`
    /// (for an [`BoundRole::Evictor`]; halfway from it to 1 for a
    /// [`BoundRole::HardBound`]) by `ratio` of the capacity per cycle,
    /// with the default [`Timing`].
    pub fn new(capacity_bytes: u64, watermark: f64, ratio: f64, role: BoundRole) -> Self {
        let rule = CapacityRule {
            capacity_bytes,
            trigger_watermark: watermark,
            eviction_ratio: ratio,
            role,
        };
        BoundSpec {
            capacity_bytes,
            trigger_bytes: rule.trigger_bytes(),
            target_bytes: rule.target_bytes(),
            listing_every_bytes: capacity_bytes / LISTING_SHARE,
            role,
            timing: Timing::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmcache_tier_spec::capacity::GIB;

    fn spec(json: &str) -> TierSpec {
        lmcache_tier_spec::Cascade::parse(json, "t")
            .unwrap()
            .0
            .remove(0)
    }

    #[test]
    fn the_role_follows_whether_lmcache_evicts_the_tier() {
        let evicting = spec(
            r#"{"type":"s3","max_capacity_gb":1,"eviction":{"eviction_policy":"LRU","trigger_watermark":0.8,"eviction_ratio":0.2}}"#,
        );
        let bound = BoundSpec::from_spec(&evicting, 1).unwrap().unwrap();
        assert_eq!(bound.role, BoundRole::HardBound);
        assert_eq!(bound.capacity_bytes, 1 << 30);
        assert_eq!(bound.trigger_bytes, (0.9 * GIB).ceil() as u64);
        assert_eq!(
            bound.target_bytes,
            bound.trigger_bytes - (0.2 * GIB).ceil() as u64
        );
        let counting = spec(r#"{"type":"s3","max_capacity_gb":2}"#);
        let bound = BoundSpec::from_spec(&counting, 1).unwrap().unwrap();
        assert_eq!(bound.role, BoundRole::Evictor);
        assert_eq!(bound.trigger_bytes, (1.6 * GIB).ceil() as u64);
        let unbounded = spec(r#"{"type":"s3","max_capacity_gb":0}"#);
        assert_eq!(BoundSpec::from_spec(&unbounded, 1).unwrap(), None);
        assert_eq!(
            BoundSpec::from_spec(&spec(r#"{"type":"s3"}"#), 1).unwrap(),
            None
        );
    }

    #[test]
    fn bad_numbers_are_errors_naming_the_key() {
        for (json, key) in [
            (
                r#"{"type":"s3","max_capacity_gb":"big"}"#,
                "max_capacity_gb",
            ),
            (r#"{"type":"s3","max_capacity_gb":-1}"#, "max_capacity_gb"),
            // LMCache refuses null; a capacity under a byte would bound
            // the bucket at 0.
            (r#"{"type":"s3","max_capacity_gb":null}"#, "max_capacity_gb"),
            (
                r#"{"type":"s3","max_capacity_gb":1e-12}"#,
                "max_capacity_gb",
            ),
            (
                r#"{"type":"s3","max_capacity_gb":1,"eviction":7}"#,
                "eviction",
            ),
            (
                r#"{"type":"s3","max_capacity_gb":1,"eviction":{"trigger_watermark":1.5}}"#,
                "eviction.trigger_watermark",
            ),
            (
                r#"{"type":"s3","max_capacity_gb":1,"eviction":{"eviction_ratio":0}}"#,
                "eviction.eviction_ratio",
            ),
        ] {
            let e = BoundSpec::from_spec(&spec(json), 2).unwrap_err();
            assert_eq!((e.position, e.key), (2, key), "{json}");
        }
    }

    #[test]
    fn a_bound_prefix_ends_where_a_path_segment_ends() {
        for prefix in ["", "p/", "lmcache/node-a/", "a.b/c/"] {
            let json = format!(r#"{{"type":"s3","max_capacity_gb":1,"s3_key_prefix":"{prefix}"}}"#);
            assert!(BoundSpec::from_spec(&spec(&json), 0).is_ok(), "{prefix}");
        }
        for prefix in ["p", "lmcache/node-a", "a/b.", "x-"] {
            let json = format!(r#"{{"type":"s3","max_capacity_gb":1,"s3_key_prefix":"{prefix}"}}"#);
            let e = BoundSpec::from_spec(&spec(&json), 3).unwrap_err();
            assert_eq!((e.position, e.key), (3, "s3_key_prefix"), "{prefix}");
            assert!(e.fix.contains(&format!("\"{prefix}/\"")), "{e}");
        }
        let unbounded = spec(r#"{"type":"s3","s3_key_prefix":"p"}"#);
        assert_eq!(BoundSpec::from_spec(&unbounded, 0).unwrap(), None);
    }

    #[test]
    fn the_models_of_the_block_are_model_names_and_bad_ones_are_named() {
        let tier = spec(
            r#"{"type":"s3","max_capacity_gb":1,"bucket_bound":{"models":["m","org/m-2"],"lease_seconds":5}}"#,
        );
        assert!(BoundSpec::from_spec(&tier, 0).is_ok());
        assert_eq!(models_of(&tier, 0).unwrap(), ["m", "org/m-2"]);
        assert!(models_of(&spec(r#"{"type":"s3"}"#), 0).unwrap().is_empty());
        let long = "x".repeat(100_000);
        for models in [
            r#""m""#.to_string(),
            r#"[""]"#.to_string(),
            "[1]".to_string(),
            format!(r#"["{}"]"#, "m".repeat(1025)),
            format!(r#"["{long}"]"#),
        ] {
            let json = format!(
                r#"{{"type":"s3","max_capacity_gb":1,"bucket_bound":{{"models":{models}}}}}"#
            );
            let e = BoundSpec::from_spec(&spec(&json), 1).unwrap_err();
            assert_eq!(e.key, "bucket_bound.models", "{models:.40}");
            assert!(
                e.to_string().len() < 600,
                "the error echoes too much: {e:.200}"
            );
        }
    }

    #[test]
    fn the_bucket_bound_block_sets_the_periods_and_bad_ones_are_named() {
        let tier = spec(
            r#"{"type":"s3","max_capacity_gb":1,"bucket_bound":{"lease_seconds":3,"read_reports_seconds":1}}"#,
        );
        let timing = BoundSpec::from_spec(&tier, 0).unwrap().unwrap().timing;
        assert_eq!(timing.lease, Duration::from_secs(3));
        assert_eq!(timing.read_reports, Duration::from_secs(1));
        assert_eq!(timing.report, Timing::default().report);
        for block in [
            r#""often""#,
            r#"{"lease":3}"#,
            r#"{"lease_seconds":0}"#,
            r#"{"report_seconds":1.5}"#,
            r#"{"listing_seconds":100000}"#,
        ] {
            let json = format!(r#"{{"type":"s3","max_capacity_gb":1,"bucket_bound":{block}}}"#);
            let e = BoundSpec::from_spec(&spec(&json), 4).unwrap_err();
            assert_eq!((e.position, e.key), (4, BUCKET_BOUND), "{block}");
        }
    }
}
