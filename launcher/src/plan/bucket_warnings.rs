//! The bounds LMCache keeps itself, and what the plan says of them: an `s3`
//! tier that bypasses the gateway (`max_capacity_gb` but no `s3_bucket`) is
//! bounded only per server process (`docs/s3-gateway.md`, "The bucket
//! bound"); a tier that LMCache bounds gets the `eviction` block without
//! which it deletes nothing; a bucket tier not marked `"shared": true` is
//! warned about (`docs/configuration.md`, "Bounds and shared tiers").

use lmcache_tier_spec::capacity::{
    DEFAULT_EVICTION_RATIO, DEFAULT_TRIGGER_WATERMARK, EVICTION, EVICTION_RATIO, TRIGGER_WATERMARK,
};
use lmcache_tier_spec::{redact_endpoint, Cascade, TierKind};
use serde_json::Value;

/// `cascade` with LMCache's default `eviction` block (`LRU`, watermark 0.8,
/// ratio 0.2) added to each tier that LMCache alone bounds and that has
/// `max_capacity_gb` above 0 but no block (or `"eviction": null`, which
/// LMCache reads as none), with a warning for each: LMCache
/// 0.5.4 to 0.5.7rc2 wires an adapter into its L2 eviction only when the
/// spec has an `eviction` block (`StorageManager._should_enable_l2_eviction`
/// returns false without one), so the capacity alone deletes nothing (public
/// LMCache report 4725). `fs` and `fs_native` tiers are left as they are
/// (their capacity guard bounds them, block or not), and so are `s3` tiers
/// with `s3_bucket` (the gateway's bucket bound does).
pub(crate) fn with_eviction_blocks(cascade: Cascade) -> (Cascade, Vec<String>) {
    let mut warnings = Vec::new();
    let tiers = cascade
        .0
        .into_iter()
        .enumerate()
        .map(|(position, tier)| {
            let ours = tier.is_disk_tier() || tier.kind().is_bucket();
            let has_block = tier.as_object().get(EVICTION).is_some_and(|v| !v.is_null());
            if ours || tier.max_capacity_bytes().is_none() || has_block {
                return tier;
            }
            warnings.push(format!(
                "L2 tier {position} ({}) has max_capacity_gb but no \"eviction\" block, without which LMCache deletes nothing from it: the plan adds LMCache's default, {{\"eviction_policy\":\"LRU\",\"trigger_watermark\":{DEFAULT_TRIGGER_WATERMARK},\"eviction_ratio\":{DEFAULT_EVICTION_RATIO}}}; write your own block to choose",
                tier.adapter_type()
            ));
            let block = serde_json::json!({
                "eviction_policy": "LRU",
                TRIGGER_WATERMARK: DEFAULT_TRIGGER_WATERMARK,
                EVICTION_RATIO: DEFAULT_EVICTION_RATIO,
            });
            tier.rewritten(&[], [(EVICTION, block)])
        })
        .collect();
    (Cascade(tiers), warnings)
}

/// A warning for each `s3` tier with `s3_bucket` that is not marked
/// `"shared": true`: the bucket bound exists because several nodes write
/// one bucket, and LMCache reads `shared` as "other nodes write this tier
/// too" (its backend identity; from 0.5.7 the residency of what it reads:
/// remote, not local).
pub(crate) fn unshared_bucket_warnings(cascade: &Cascade) -> Vec<String> {
    cascade
        .tiers()
        .iter()
        .enumerate()
        .filter(|(_, tier)| tier.kind().is_bucket())
        .filter(|(_, tier)| tier.as_object().get("shared").and_then(Value::as_bool) != Some(true))
        .map(|(position, _)| format!(
            "L2 tier {position} (s3 with s3_bucket) is not marked \"shared\": true: a bucket is the tier several nodes write, and LMCache then treats its objects as any node's; add \"shared\": true (docs/configuration.md, \"Bounds and shared tiers\")"
        ))
        .collect()
}

/// A warning for each `s3` tier with `max_capacity_gb` above 0 and no
/// `s3_bucket`: LMCache 0.5.6's S3 adapter counts from 0 at each start and
/// only its own process's stores, so the capacity bounds what one process
/// writes between two restarts, not the bucket; only a tier through the
/// gateway gets the bucket bound.
pub(crate) fn per_process_bound_warnings(cascade: &Cascade) -> Vec<String> {
    cascade
        .tiers()
        .iter()
        .enumerate()
        .filter(|(_, tier)| tier.kind() == TierKind::Object)
        .filter(|(_, tier)| tier.max_capacity_bytes().is_some())
        .map(|(position, tier)| {
            let endpoint = tier
                .as_object()
                .get("s3_endpoint")
                .and_then(Value::as_str)
                .map_or_else(|| "its s3_endpoint".to_string(), redact_endpoint);
            format!(
                "L2 tier {position} (s3 at {endpoint}) has no s3_bucket, so it bypasses the gateway: its max_capacity_gb bounds only what one LMCache process stores between two restarts (LMCache counts from 0 at each start, and only its own keys), not the bucket, which grows by about one capacity per node and per restart; name the bucket with \"s3_bucket\" (and the plain endpoint host in \"s3_endpoint\") to get the gateway's bucket bound (docs/s3-gateway.md, \"The bucket bound\")"
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tier_lmcache_bounds_gets_the_eviction_block_and_ours_are_left_alone() {
        let cascade = Cascade::parse(
            r#"[{"type":"s3","s3_endpoint":"a.example.net","max_capacity_gb":50},
                {"type":"s3","s3_endpoint":"b.example.net","max_capacity_gb":50,"eviction":{"eviction_policy":"LRU","trigger_watermark":0.9}},
                {"type":"s3","s3_endpoint":"c.example.net"},
                {"type":"s3","s3_endpoint":"s3.example.net","s3_bucket":"kv","max_capacity_gb":50},
                {"type":"fs","base_path":"/d","max_capacity_gb":5},
                {"type":"fs_native","base_path":"/e","max_capacity_gb":5},
                {"type":"mock","max_capacity_gb":1},
                {"type":"mock","max_capacity_gb":1,"eviction":null}]"#,
            "t",
        )
        .unwrap();
        let (rendered, warned) = with_eviction_blocks(cascade.clone());
        let added: Vec<usize> = (0..8)
            .filter(|&i| rendered.tiers()[i] != cascade.tiers()[i])
            .collect();
        assert_eq!(added, [0, 6, 7], "{warned:#?}");
        assert_eq!(warned.len(), 3);
        assert_eq!(
            rendered.tiers()[7].as_object()[EVICTION]["eviction_policy"],
            "LRU"
        );
        assert!(warned[0].starts_with("L2 tier 0 (s3) has max_capacity_gb but no \"eviction\""));
        let block = &rendered.tiers()[0].as_object()[EVICTION];
        assert_eq!(block["eviction_policy"], "LRU");
        assert_eq!(block[TRIGGER_WATERMARK], 0.8);
        assert_eq!(block[EVICTION_RATIO], 0.2);
        assert_eq!(
            rendered.tiers()[0].as_object()["s3_endpoint"],
            "a.example.net"
        );
    }

    #[test]
    fn a_bucket_tier_not_marked_shared_is_warned_about() {
        let cascade = Cascade::parse(
            r#"[{"type":"s3","s3_endpoint":"s3.example.net","s3_bucket":"kv"},
                {"type":"s3","s3_endpoint":"s3.example.net","s3_bucket":"kv2","shared":false},
                {"type":"s3","s3_endpoint":"s3.example.net","s3_bucket":"kv3","shared":true},
                {"type":"s3","s3_endpoint":"s3.example.net"},
                {"type":"fs","base_path":"/d"}]"#,
            "t",
        )
        .unwrap();
        let warned = unshared_bucket_warnings(&cascade);
        assert_eq!(warned.len(), 2, "{warned:#?}");
        assert!(warned[0].starts_with("L2 tier 0 (s3 with s3_bucket) is not marked"));
        assert!(warned[1].starts_with("L2 tier 1 "));
    }

    #[test]
    fn only_a_bounded_s3_tier_without_s3_bucket_is_warned_about() {
        let cascade = Cascade::parse(
            r#"[{"type":"s3","s3_endpoint":"kv.s3.example.net","max_capacity_gb":50},
                {"type":"s3","s3_endpoint":"kv.s3.example.net"},
                {"type":"s3","s3_endpoint":"s3.example.net","s3_bucket":"kv","max_capacity_gb":50},
                {"type":"fs","base_path":"/d","max_capacity_gb":5}]"#,
            "t",
        )
        .unwrap();
        let warned = per_process_bound_warnings(&cascade);
        assert_eq!(warned.len(), 1, "{warned:#?}");
        assert!(
            warned[0].starts_with(
                "L2 tier 0 (s3 at kv.s3.example.net) has no s3_bucket, so it bypasses the gateway"
            ),
            "{}",
            warned[0]
        );
    }
}
