//! The bucket bounds' families: one series per `s3_bucket` tier with
//! `max_capacity_gb`, from its gateway's state (`docs/metrics.md`, "S3
//! gateways"; `docs/s3-gateway.md`, "The bucket bound").

use lmcache_s3_gateway::bound::BoundState;
use lmcache_s3_gateway::state::GatewayState;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use super::names;
use super::tier_family::{TierFamily, TierLabels};

/// A tier's position and its bound's figures.
type Bound = (usize, BoundState);

/// The families read from each [`BoundState`].
const BOUND_FAMILIES: [TierFamily<Bound>; 12] = [
    TierFamily {
        name: "gateway_bucket_usage",
        help: "Bytes of LMCache objects under the tier's prefix, as the gateway's last listing and this node's requests since count them",
        bytes: true,
        counter: false,
        value: |(_, b)| b.usage_bytes,
    },
    TierFamily {
        name: "gateway_bucket_objects",
        help: "LMCache objects under the tier's prefix, counted as gateway_bucket_usage_bytes",
        bytes: false,
        counter: false,
        value: |(_, b)| b.objects,
    },
    TierFamily {
        name: "gateway_bucket_capacity",
        help: "The tier's max_capacity_gb in bytes, which the gateway holds for the whole bucket prefix",
        bytes: true,
        counter: false,
        value: |(_, b)| b.spec.capacity_bytes,
    },
    TierFamily {
        name: "gateway_bucket_trigger",
        help: "Usage at which the gateway starts deleting the oldest objects",
        bytes: true,
        counter: false,
        value: |(_, b)| b.spec.trigger_bytes,
    },
    TierFamily {
        name: "gateway_bucket_evicted_objects",
        help: "Objects the gateway's bucket bound deleted",
        bytes: false,
        counter: true,
        value: |(_, b)| b.evicted_objects,
    },
    TierFamily {
        name: "gateway_bucket_evicted",
        help: "Bytes of the objects the gateway's bucket bound deleted",
        bytes: true,
        counter: true,
        value: |(_, b)| b.evicted_bytes,
    },
    TierFamily {
        name: "gateway_bucket_eviction_failures",
        help: "Deletions of the bucket bound that failed (tried again at the next cycle)",
        bytes: false,
        counter: true,
        value: |(_, b)| b.eviction_failures,
    },
    TierFamily {
        name: "gateway_bucket_listings",
        help: "Listings of the tier's prefix",
        bytes: false,
        counter: true,
        value: |(_, b)| b.listings,
    },
    TierFamily {
        name: "gateway_bucket_list_requests",
        help: "ListObjectsV2 requests of those listings (one per page of up to 1,000 keys)",
        bytes: false,
        counter: true,
        value: |(_, b)| b.listing_pages,
    },
    TierFamily {
        name: "gateway_bucket_listing_failures",
        help: "Listings that failed (the bound goes on with what it knew)",
        bytes: false,
        counter: true,
        value: |(_, b)| b.listing_failures,
    },
    TierFamily {
        name: "gateway_bucket_others_added_objects",
        help: "Objects a listing found that this node did not know of: what other nodes wrote",
        bytes: false,
        counter: true,
        value: |(_, b)| b.others_added_objects,
    },
    TierFamily {
        name: "gateway_bucket_others_added",
        help: "Bytes of those objects",
        bytes: true,
        counter: true,
        value: |(_, b)| b.others_added_bytes,
    },
];

/// Encodes the bound families of the gateways in `states` that have a
/// bound; nothing when none has.
pub(super) fn encode_bounds(
    encoder: &mut DescriptorEncoder,
    states: &[GatewayState],
) -> Result<(), std::fmt::Error> {
    let bounds: Vec<Bound> = states
        .iter()
        .filter_map(|s| Some((s.tier, s.bucket_bound.clone()?)))
        .collect();
    if bounds.is_empty() {
        return Ok(());
    }
    let labels = |(tier, _): &Bound| TierLabels {
        tier: tier.to_string(),
    };
    for family in &BOUND_FAMILIES {
        family.encode(encoder, &bounds, labels)?;
    }
    let mut family = encoder.encode_descriptor(
        names::GATEWAY_BUCKET_LAST_LISTING_DURATION.name,
        "How long the gateway's last listing of the tier's prefix took",
        Some(&Unit::Seconds),
        ConstGauge::new(0.0f64).metric_type(),
    )?;
    for bound in &bounds {
        let seconds = bound.1.last_listing_millis as f64 / 1e3;
        ConstGauge::new(seconds).encode(family.encode_family(&labels(bound))?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{answered, gateway_page, sample};
    use super::super::Format;
    use lmcache_sizing::GIB;

    #[test]
    fn a_gateway_with_a_bucket_bound_has_its_families_and_one_without_has_none() {
        use lmcache_s3_gateway::bound::{BoundRole, BoundSpec, BoundState};
        let mut bounded = answered(1, &[], 0, 0.0);
        bounded.bucket_bound = Some(BoundState {
            spec: BoundSpec::new(GIB, 0.8, 0.2, BoundRole::HardBound),
            usage_bytes: 900 << 20,
            objects: 28,
            listings: 5,
            listing_pages: 6,
            listing_failures: 1,
            last_listing_millis: 250,
            last_listing_unix: 1_800_000_000,
            others_added_objects: 9,
            others_added_bytes: 288 << 20,
            evicted_objects: 7,
            evicted_bytes: 224 << 20,
            eviction_failures: 0,
        });
        let plain = answered(2, &[], 0, 0.0);
        for format in [Format::OpenMetrics, Format::Prometheus] {
            let text = gateway_page(vec![bounded.clone(), plain.clone()], format);
            let total = |name: &str| format!("lmcache_tier_{name}_total{{tier=\"1\"}}");
            let gauge = |name: &str| format!("lmcache_tier_{name}{{tier=\"1\"}}");
            assert_eq!(
                sample(&text, &gauge("gateway_bucket_usage_bytes")),
                (900u64 << 20) as f64
            );
            assert_eq!(
                sample(&text, &gauge("gateway_bucket_capacity_bytes")),
                GIB as f64
            );
            assert_eq!(sample(&text, &total("gateway_bucket_evicted_objects")), 7.0);
            assert_eq!(sample(&text, &total("gateway_bucket_list_requests")), 6.0);
            assert_eq!(
                sample(&text, &total("gateway_bucket_others_added_bytes")),
                (288u64 << 20) as f64
            );
            assert_eq!(
                sample(
                    &text,
                    &gauge("gateway_bucket_last_listing_duration_seconds")
                ),
                0.25
            );
            assert!(
                !text.contains("gateway_bucket_usage_bytes{tier=\"2\"}"),
                "{text}"
            );
        }
    }
}
