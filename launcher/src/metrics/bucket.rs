//! The bucket bounds' families: one series per `s3_bucket` tier with
//! `max_capacity_gb`, from its gateway's state (`docs/metrics.md`, "S3
//! gateways"; `docs/s3-gateway.md`, "The bucket bound").

use lmcache_s3_gateway::bound::BoundState;
use lmcache_s3_gateway::fleet::view::IdentityUsage;
use lmcache_s3_gateway::fleet::Mode;
use lmcache_s3_gateway::state::GatewayState;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use super::names::{self, FamilyName};
use super::tier_family::{TierFamily, TierLabels};

/// A tier's position and its bound's figures.
type Bound = (usize, BoundState);

/// The families read from each [`BoundState`].
const BOUND_FAMILIES: [TierFamily<Bound>; 26] = [
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
    TierFamily {
        name: "gateway_bucket_evictor",
        help: "1 while this node lists and evicts for the prefix: it holds the prefix's lease (on a store without conditional writes, every node once its first listing is in)",
        bytes: false,
        counter: false,
        value: |(_, b)| u64::from(b.evictor),
    },
    TierFamily {
        name: "gateway_bucket_lease_mode",
        help: "1 when the nodes of the prefix elect one evictor through a lease, 0 when the store takes no conditional writes and every node evicts on its own",
        bytes: false,
        counter: false,
        value: |(_, b)| u64::from(b.mode == Mode::Lease),
    },
    TierFamily {
        name: "gateway_bucket_lease_taken",
        help: "Times this node took the prefix's lease",
        bytes: false,
        counter: true,
        value: |(_, b)| b.lease.taken,
    },
    TierFamily {
        name: "gateway_bucket_lease_lost",
        help: "Times this node lost the prefix's lease to another node (a renewal answered 412)",
        bytes: false,
        counter: true,
        value: |(_, b)| b.lease.lost,
    },
    TierFamily {
        name: "gateway_bucket_lease_requests",
        help: "GET and PUT requests of the prefix's lease object this node sent",
        bytes: false,
        counter: true,
        value: |(_, b)| b.lease.reads + b.lease.writes,
    },
    TierFamily {
        name: "gateway_bucket_lease_failures",
        help: "Lease requests that failed (network or 5xx)",
        bytes: false,
        counter: true,
        value: |(_, b)| b.lease.failures,
    },
    TierFamily {
        name: "gateway_bucket_reports_sent",
        help: "Reports of the bytes this node wrote, PUT for the prefix's evictor",
        bytes: false,
        counter: true,
        value: |(_, b)| b.reports_sent,
    },
    TierFamily {
        name: "gateway_bucket_reports_read",
        help: "Reports of other nodes this node read while it was the evictor",
        bytes: false,
        counter: true,
        value: |(_, b)| b.reports_read,
    },
    TierFamily {
        name: "gateway_bucket_reporters",
        help: "Nodes whose reports the prefix's evictor reads (as this node last saw them)",
        bytes: false,
        counter: false,
        value: |(_, b)| b.reporters,
    },
    TierFamily {
        name: "gateway_bucket_uploads_aborted",
        help: "Multipart uploads left behind under the prefix (unfinished for bucket_bound.abandoned_upload_seconds) that this node aborted",
        bytes: false,
        counter: true,
        value: |(_, b)| b.uploads_aborted,
    },
    TierFamily {
        name: "gateway_bucket_listing_skipped_keys",
        help: "Keys under the prefix the last listing did not count: not LMCache's, of a model no node of the prefix writes, or not decodable",
        bytes: false,
        counter: false,
        value: |(_, b)| b.listing_skipped,
    },
    TierFamily {
        name: "gateway_bucket_oversized_objects",
        help: "Objects the last listing gave a size past 5 TiB, the most an S3 object holds: the store's fault, neither counted nor evicted",
        bytes: false,
        counter: false,
        value: |(_, b)| b.oversized_objects,
    },
    TierFamily {
        name: "gateway_bucket_absurd_reports",
        help: "Nodes whose report claimed more than the capacity written since the evictor's last reading, each counted once while this node evicts: such a report counts as the capacity, and reports bring a listing, never a deletion",
        bytes: false,
        counter: true,
        value: |(_, b)| b.absurd_reports,
    },
    TierFamily {
        name: "gateway_bucket_upload_abort_failures",
        help: "Aborts of uploads left behind that failed (tried again at the next sweep)",
        bytes: false,
        counter: true,
        value: |(_, b)| b.upload_abort_failures,
    },
];

/// A gauge of seconds (or another unit-less rate) per bound, for the bounds
/// where `value` gives one.
struct FloatFamily {
    name: FamilyName,
    help: &'static str,
    unit: Option<Unit>,
    value: fn(&BoundState) -> Option<f64>,
}

/// The float families read from each [`BoundState`].
const FLOAT_FAMILIES: [FloatFamily; 5] = [
    FloatFamily {
        name: names::GATEWAY_BUCKET_LAST_LISTING_DURATION,
        help: "How long the gateway's last listing of the tier's prefix took",
        unit: Some(Unit::Seconds),
        value: |b| Some(b.last_listing_millis as f64 / 1e3),
    },
    FloatFamily {
        name: names::GATEWAY_BUCKET_LEASE_UNCHANGED,
        help: "How long the prefix's lease has gone unchanged as this node sees it (the holder renews it every sixth of the lease period); past the period plus a third, the prefix has no evictor",
        unit: Some(Unit::Seconds),
        value: |b| b.lease_unchanged_millis.map(|ms| ms as f64 / 1e3),
    },
    FloatFamily {
        name: names::GATEWAY_BUCKET_NO_EVICTOR,
        help: "How long this node has seen no evictor of the prefix make progress: no renewal of its own lease, and no lease read whose holder changed or counted one more renewal; past twice the lease period the prefix has no evictor",
        unit: Some(Unit::Seconds),
        value: |b| b.no_evictor_millis.map(|ms| ms as f64 / 1e3),
    },
    FloatFamily {
        name: names::GATEWAY_BUCKET_LEASE_PERIOD,
        help: "The lease period of the prefix (bucket_bound.lease_seconds): a lease unchanged this long is taken over",
        unit: Some(Unit::Seconds),
        value: |b| (b.mode == Mode::Lease).then_some(b.spec.timing.lease.as_secs_f64()),
    },
    FloatFamily {
        name: names::GATEWAY_BUCKET_FLEET_WRITE_RATE,
        help: "Bytes a second the nodes of the prefix write, as the evictor reads their reports (on another node: what the lease's holder last published)",
        unit: None,
        value: |b| (b.mode == Mode::Lease).then_some(b.fleet_write_bytes_per_s as f64),
    },
];

/// One cache identity of a tier's bucket bound: the tier's position and
/// the identity's figures.
type Identity = (usize, IdentityUsage);

/// A tier's position and a cache identity's tag (`""` for objects under no
/// identity's segment).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IdentityLabels {
    tier: String,
    identity: String,
}

/// The families of each cache identity under a bound's prefix
/// (`docs/s3-gateway.md`, "The cache identity in a bucket").
const IDENTITY_FAMILIES: [TierFamily<Identity>; 2] = [
    TierFamily {
        name: "gateway_bucket_identity",
        help: "Bytes of LMCache objects under the tier's prefix written by launches of one cache identity (label identity: its tag, empty for objects under no identity's segment), as the evictor's view counts them; in a rolling upgrade the old identity's shrink",
        bytes: true,
        counter: false,
        value: |(_, i)| i.bytes,
    },
    TierFamily {
        name: "gateway_bucket_identity_objects",
        help: "LMCache objects of that cache identity, counted as gateway_bucket_identity_bytes",
        bytes: false,
        counter: false,
        value: |(_, i)| i.objects,
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
    for family in &FLOAT_FAMILIES {
        encode_float(encoder, family, &bounds, labels)?;
    }
    let identities: Vec<Identity> = bounds
        .iter()
        .flat_map(|(tier, b)| b.identities.iter().map(|i| (*tier, i.clone())))
        .collect();
    let identity_labels = |(tier, i): &Identity| IdentityLabels {
        tier: tier.to_string(),
        identity: i.tag.clone(),
    };
    for family in &IDENTITY_FAMILIES {
        family.encode(encoder, &identities, identity_labels)?;
    }
    Ok(())
}

/// Encodes `family` with one series per bound that has a value; nothing
/// when none has.
fn encode_float(
    encoder: &mut DescriptorEncoder,
    family: &FloatFamily,
    bounds: &[Bound],
    labels: impl Fn(&Bound) -> TierLabels,
) -> Result<(), std::fmt::Error> {
    let series: Vec<(TierLabels, f64)> = bounds
        .iter()
        .filter_map(|bound| Some((labels(bound), (family.value)(&bound.1)?)))
        .collect();
    if series.is_empty() {
        return Ok(());
    }
    let mut encoder = encoder.encode_descriptor(
        family.name.name,
        family.help,
        family.unit.as_ref(),
        ConstGauge::new(0.0f64).metric_type(),
    )?;
    for (labels, value) in &series {
        ConstGauge::new(*value).encode(encoder.encode_family(labels)?)?;
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
        use lmcache_s3_gateway::fleet::{lease::ElectionFigures, view::IdentityUsage, Mode};
        let mut bounded = answered(1, &[], 0, 0.0);
        bounded.bucket_bound = Some(BoundState {
            spec: BoundSpec::new(GIB, 0.8, 0.2, BoundRole::HardBound),
            mode: Mode::Lease,
            node: "0123456789abcdef".to_string(),
            evictor: true,
            lease_holder: "0123456789abcdef".to_string(),
            lease_holder_since_unix: 1_800_000_000,
            lease: ElectionFigures {
                taken: 2,
                lost: 1,
                failures: 0,
                reads: 30,
                writes: 12,
            },
            lease_unchanged_millis: Some(4_500),
            reports_sent: 0,
            report_failures: 0,
            reports_read: 40,
            reporters: 3,
            fleet_write_bytes_per_s: 5 << 20,
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
            upload_listings: 3,
            uploads_aborted: 2,
            upload_abort_failures: 0,
            models: vec!["org/m".to_string()],
            identities: vec![
                IdentityUsage {
                    tag: "0123456789abcdef".into(),
                    objects: 20,
                    bytes: 600 << 20,
                },
                IdentityUsage {
                    tag: "fedcba9876543210".into(),
                    objects: 8,
                    bytes: 300 << 20,
                },
            ],
            listing_skipped: 4,
            oversized_objects: 0,
            absurd_reports: 3,
            no_evictor_millis: Some(61_000),
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
            assert_eq!(sample(&text, &gauge("gateway_bucket_evictor")), 1.0);
            assert_eq!(sample(&text, &total("gateway_bucket_lease_taken")), 2.0);
            assert_eq!(sample(&text, &total("gateway_bucket_lease_requests")), 42.0);
            assert_eq!(sample(&text, &gauge("gateway_bucket_reporters")), 3.0);
            assert_eq!(sample(&text, &total("gateway_bucket_uploads_aborted")), 2.0);
            assert_eq!(
                sample(&text, &gauge("gateway_bucket_lease_unchanged_seconds")),
                4.5
            );
            assert_eq!(
                sample(&text, &gauge("gateway_bucket_no_evictor_seconds")),
                61.0
            );
            assert_eq!(sample(&text, &total("gateway_bucket_absurd_reports")), 3.0);
            assert_eq!(
                sample(&text, &gauge("gateway_bucket_lease_period_seconds")),
                30.0
            );
            assert_eq!(
                sample(&text, &gauge("gateway_bucket_fleet_write_bytes_per_second")),
                (5u64 << 20) as f64
            );
            assert_eq!(
                sample(
                    &text,
                    r#"lmcache_tier_gateway_bucket_identity_bytes{tier="1",identity="fedcba9876543210"}"#
                ),
                (300u64 << 20) as f64
            );
            assert_eq!(
                sample(
                    &text,
                    r#"lmcache_tier_gateway_bucket_identity_objects{tier="1",identity="0123456789abcdef"}"#
                ),
                20.0
            );
            assert!(
                !text.contains("gateway_bucket_usage_bytes{tier=\"2\"}"),
                "{text}"
            );
        }
    }
}
