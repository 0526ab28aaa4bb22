//! The capacity bound of a tier with `max_capacity_gb`, shared by the
//! capacity guard of filesystem tiers (`docs/capacity-guard.md`) and the
//! bucket bound of `s3_bucket` tiers (`docs/s3-gateway.md`, "The bucket
//! bound"): how the keys are read, as LMCache 0.5.6 reads them
//! (`max_capacity_gb` in GiB, `eviction.trigger_watermark` and
//! `eviction.eviction_ratio` defaulting as in its
//! `_parse_eviction_config`), and where a cycle starts and ends. Pure: each
//! caller names the tier in its own errors and decides the role.

use serde_json::Value;

/// One GiB in bytes; LMCache's `max_capacity_gb` counts GiB.
pub const GIB: f64 = (1u64 << 30) as f64;
/// The capacity key, in GiB.
pub const MAX_CAPACITY_GB: &str = "max_capacity_gb";
/// The key of the eviction block.
pub const EVICTION: &str = "eviction";
/// The eviction block's watermark key.
pub const TRIGGER_WATERMARK: &str = "trigger_watermark";
/// The eviction block's ratio key.
pub const EVICTION_RATIO: &str = "eviction_ratio";
/// LMCache's default `trigger_watermark` (0.5.6, `_parse_eviction_config`).
pub const DEFAULT_TRIGGER_WATERMARK: f64 = 0.8;
/// LMCache's default `eviction_ratio` (0.5.6, `_parse_eviction_config`).
pub const DEFAULT_EVICTION_RATIO: f64 = 0.2;

/// A `max_capacity_gb` value as GiB: a finite JSON number, 0 or more;
/// `None` for anything else (the caller says what to write).
pub fn capacity_gib(value: &Value) -> Option<f64> {
    value.as_f64().filter(|gib| gib.is_finite() && *gib >= 0.0)
}

/// `gib` GiB in bytes, rounded down (`u64::MAX` for more than that).
pub fn capacity_bytes(gib: f64) -> u64 {
    (gib * GIB) as u64
}

/// The fraction `name` (`trigger_watermark` or `eviction_ratio`) of the
/// `eviction` block `block`: `default` when the block or the key is absent
/// (or the block is no object).
///
/// # Errors
/// The value when it is not a JSON number in (0, 1].
pub fn eviction_fraction<'a>(
    block: Option<&'a Value>,
    name: &str,
    default: f64,
) -> Result<f64, &'a Value> {
    match block.and_then(|block| block.get(name)) {
        None => Ok(default),
        Some(value) => value
            .as_f64()
            .filter(|f| *f > 0.0 && *f <= 1.0)
            .ok_or(value),
    }
}

/// A tier's bound as its spec writes it, read once for every kind (the
/// capacity guard's disk tiers, the bucket bound's `s3_bucket` tiers,
/// `resp` tiers, and the plan's warnings): `max_capacity_gb` above 0 and
/// its `eviction` block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierBound<'a> {
    /// `max_capacity_gb` as written (messages quote it).
    pub max_capacity_gb: &'a Value,
    /// The capacity, bytes: at least 1.
    pub capacity_bytes: u64,
    /// The `eviction` block, an object; `None` when absent or `null`
    /// (LMCache reads `null` as no block).
    pub eviction: Option<&'a Value>,
    /// `eviction.trigger_watermark`, in (0, 1]; LMCache's default when
    /// absent.
    pub trigger_watermark: f64,
    /// `eviction.eviction_ratio`, in (0, 1]; LMCache's default when absent.
    pub eviction_ratio: f64,
}

/// Why a tier's bound cannot be read; each reader words it for its kind,
/// with the tier's position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BoundKeyError<'a> {
    /// `max_capacity_gb` is not a JSON number of GiB, 0 or more (`null`
    /// included: LMCache refuses it).
    Capacity(&'a Value),
    /// `max_capacity_gb` is 2^64 bytes or more: LMCache 0.5.6 fails on
    /// such a value once the server starts (`OverflowError`).
    TooLarge(&'a Value),
    /// `max_capacity_gb` is above 0 but less than one byte.
    UnderAByte(&'a Value),
    /// `eviction` is neither an object nor `null`.
    Block(&'a Value),
    /// `eviction.<key>` is not a number in (0, 1].
    Fraction {
        /// `eviction.trigger_watermark` or `eviction.eviction_ratio`.
        key: &'static str,
        /// The value.
        value: &'a Value,
    },
}

impl crate::TierSpec {
    /// The tier's capacity in bytes: `max_capacity_gb` read as LMCache
    /// reads it (`None` when absent or 0).
    ///
    /// # Errors
    /// [`BoundKeyError::Capacity`], [`BoundKeyError::UnderAByte`].
    pub fn capacity(&self) -> Result<Option<(&Value, u64)>, BoundKeyError<'_>> {
        let Some(value) = self.as_object().get(MAX_CAPACITY_GB) else {
            return Ok(None);
        };
        let gib = capacity_gib(value).ok_or(BoundKeyError::Capacity(value))?;
        // LMCache turns the GiB into bytes as an int: past 2^64 bytes its
        // float is out of range, and far past it infinite (OverflowError).
        if gib * GIB >= u64::MAX as f64 {
            return Err(BoundKeyError::TooLarge(value));
        }
        match capacity_bytes(gib) {
            0 if gib > 0.0 => Err(BoundKeyError::UnderAByte(value)),
            0 => Ok(None),
            bytes => Ok(Some((value, bytes))),
        }
    }

    /// [`TierSpec::capacity`]'s bytes, for a spec the checks have already
    /// passed: `None` also for a value they refuse.
    ///
    /// [`TierSpec::capacity`]: crate::TierSpec::capacity
    pub fn max_capacity_bytes(&self) -> Option<u64> {
        self.capacity().ok().flatten().map(|(_, bytes)| bytes)
    }

    /// The tier's bound: its capacity and `eviction` block, the fractions
    /// defaulting to LMCache's; `None` without a capacity.
    ///
    /// # Errors
    /// The first key that cannot be read ([`BoundKeyError`]).
    pub fn bound(&self) -> Result<Option<TierBound<'_>>, BoundKeyError<'_>> {
        let Some((max_capacity_gb, capacity_bytes)) = self.capacity()? else {
            return Ok(None);
        };
        let eviction = match self.as_object().get(EVICTION) {
            None | Some(Value::Null) => None,
            Some(block @ Value::Object(_)) => Some(block),
            Some(other) => return Err(BoundKeyError::Block(other)),
        };
        let fraction = |key, name, default| {
            eviction_fraction(eviction, name, default)
                .map_err(|value| BoundKeyError::Fraction { key, value })
        };
        Ok(Some(TierBound {
            max_capacity_gb,
            capacity_bytes,
            eviction,
            trigger_watermark: fraction(
                "eviction.trigger_watermark",
                TRIGGER_WATERMARK,
                DEFAULT_TRIGGER_WATERMARK,
            )?,
            eviction_ratio: fraction(
                "eviction.eviction_ratio",
                EVICTION_RATIO,
                DEFAULT_EVICTION_RATIO,
            )?,
        }))
    }
}

/// Who acts first on a bounded tier: LMCache or this project's bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundRole {
    /// LMCache does not evict from the tier: the bound evicts at
    /// `trigger_watermark` x capacity.
    Evictor,
    /// LMCache evicts at its watermark on what it counts; the bound evicts
    /// only when the true usage reaches halfway from that watermark to the
    /// capacity (after a restart, LMCache counting from 0, or on a tier
    /// other writers fill).
    HardBound,
}

/// The numbers of a bound: a capacity, its watermark and ratio, its role.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CapacityRule {
    /// The capacity, bytes.
    pub capacity_bytes: u64,
    /// `eviction.trigger_watermark`, in (0, 1].
    pub trigger_watermark: f64,
    /// `eviction.eviction_ratio`, in (0, 1].
    pub eviction_ratio: f64,
    /// Evictor or hard bound.
    pub role: BoundRole,
}

impl CapacityRule {
    /// The usage in bytes at which a cycle starts: the watermark times the
    /// capacity for a [`BoundRole::Evictor`], halfway from the watermark to
    /// the capacity for a [`BoundRole::HardBound`]; rounded up.
    pub fn trigger_bytes(&self) -> u64 {
        let fraction = match self.role {
            BoundRole::Evictor => self.trigger_watermark,
            BoundRole::HardBound => (1.0 + self.trigger_watermark) / 2.0,
        };
        (fraction * self.capacity_bytes as f64).ceil() as u64
    }

    /// Bytes a regular cycle frees: `eviction_ratio` x capacity, rounded
    /// up, as LMCache's own cycles free.
    pub fn ratio_bytes(&self) -> u64 {
        (self.eviction_ratio * self.capacity_bytes as f64).ceil() as u64
    }

    /// The usage in bytes a cycle ends at or below: the trigger less
    /// [`CapacityRule::ratio_bytes`] (0 at least).
    pub fn target_bytes(&self) -> u64 {
        self.trigger_bytes().saturating_sub(self.ratio_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trigger_is_the_watermark_or_halfway_to_the_capacity() {
        let rule = |role| CapacityRule {
            capacity_bytes: 1 << 30,
            trigger_watermark: 0.8,
            eviction_ratio: 0.2,
            role,
        };
        let evictor = rule(BoundRole::Evictor);
        assert_eq!(evictor.trigger_bytes(), (0.8 * GIB).ceil() as u64);
        assert_eq!(
            evictor.target_bytes(),
            (0.8 * GIB).ceil() as u64 - (0.2 * GIB).ceil() as u64
        );
        let hard = rule(BoundRole::HardBound);
        assert_eq!(hard.trigger_bytes(), (0.9 * GIB).ceil() as u64);
        let tiny = CapacityRule {
            capacity_bytes: 10,
            trigger_watermark: 0.1,
            eviction_ratio: 1.0,
            role: BoundRole::Evictor,
        };
        assert_eq!(tiny.target_bytes(), 0);
    }

    #[test]
    fn fractions_default_when_absent_and_are_refused_out_of_range() {
        let block: Value = serde_json::json!({"trigger_watermark": 0.5, "eviction_ratio": 1.5});
        assert_eq!(
            eviction_fraction(Some(&block), TRIGGER_WATERMARK, 0.8),
            Ok(0.5)
        );
        assert_eq!(
            eviction_fraction(Some(&block), EVICTION_RATIO, 0.2),
            Err(&serde_json::json!(1.5))
        );
        assert_eq!(eviction_fraction(None, EVICTION_RATIO, 0.2), Ok(0.2));
        let not_an_object = serde_json::json!("LRU");
        assert_eq!(
            eviction_fraction(Some(&not_an_object), TRIGGER_WATERMARK, 0.8),
            Ok(0.8)
        );
        assert_eq!(capacity_gib(&serde_json::json!(-1)), None);
        assert_eq!(capacity_gib(&serde_json::json!("big")), None);
        assert_eq!(capacity_bytes(2.0), 2 << 30);
    }

    fn spec(json: &str) -> crate::TierSpec {
        crate::Cascade::parse(json, "test").unwrap().0.remove(0)
    }

    #[test]
    fn a_bound_is_read_once_for_every_kind_as_lmcache_reads_it() {
        for kind in [
            r#""fs","base_path":"/a""#,
            r#""s3","s3_bucket":"kv""#,
            r#""resp","host":"h","port":1"#,
        ] {
            let bounded = spec(&format!(
                r#"{{"type":{kind},"max_capacity_gb":2,"eviction":{{"eviction_policy":"LRU","trigger_watermark":0.5}}}}"#
            ));
            let bound = bounded.bound().unwrap().unwrap();
            assert_eq!(bound.capacity_bytes, 2 << 30, "{kind}");
            assert_eq!((bound.trigger_watermark, bound.eviction_ratio), (0.5, 0.2));
            assert!(bound.eviction.is_some());
            assert_eq!(bounded.max_capacity_bytes(), Some(2 << 30));
        }
        for json in [r#"{"type":"fs"}"#, r#"{"type":"fs","max_capacity_gb":0}"#] {
            assert_eq!(spec(json).bound(), Ok(None), "{json}");
        }
        let null_block = spec(r#"{"type":"fs","max_capacity_gb":1,"eviction":null}"#);
        assert_eq!(null_block.bound().unwrap().unwrap().eviction, None);
        let refused = [
            (r#"{"type":"fs","max_capacity_gb":null}"#, "Capacity"),
            (r#"{"type":"fs","max_capacity_gb":"8"}"#, "Capacity"),
            (r#"{"type":"fs","max_capacity_gb":-1}"#, "Capacity"),
            (r#"{"type":"fs","max_capacity_gb":1e300}"#, "TooLarge"),
            (r#"{"type":"fs","max_capacity_gb":17179869184}"#, "TooLarge"),
            (r#"{"type":"fs","max_capacity_gb":1e-12}"#, "UnderAByte"),
            (
                r#"{"type":"fs","max_capacity_gb":1,"eviction":"LRU"}"#,
                "Block",
            ),
            (
                r#"{"type":"fs","max_capacity_gb":1,"eviction":{"eviction_ratio":0}}"#,
                "Fraction",
            ),
        ];
        for (json, kind) in refused {
            let tier = spec(json);
            let e = tier.bound().unwrap_err();
            assert!(format!("{e:?}").starts_with(kind), "{json}: {e:?}");
            assert_eq!(
                tier.max_capacity_bytes().is_some(),
                kind == "Block" || kind == "Fraction"
            );
        }
    }
}
