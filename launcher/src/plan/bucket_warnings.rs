//! The plan's warning for an `s3` tier that bypasses the gateway: one with
//! `max_capacity_gb` but no `s3_bucket` is bounded only per server process
//! (`docs/s3-gateway.md`, "The bucket bound").

use lmcache_tier_spec::{redact_endpoint, Cascade};
use serde_json::Value;

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
        .filter(|(_, tier)| tier.adapter_type() == "s3")
        .filter(|(_, tier)| !lmcache_s3_gateway::needs_gateway(tier))
        .filter(|(_, tier)| {
            tier.as_object()
                .get("max_capacity_gb")
                .and_then(Value::as_f64)
                .is_some_and(|gb| gb > 0.0)
        })
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
