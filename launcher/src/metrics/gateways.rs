//! The S3 gateways' families, read from their live state at every scrape
//! (`docs/metrics.md`, "S3 gateways").

use lmcache_s3_gateway::state::GatewayState;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;

use super::bucket;
use super::names;
use super::tier_family::{encode_per_tier, TierFamily, TierLabels};

/// A gateway request method.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    tier: String,
    method: String,
}

/// A gateway's identity.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GatewayLabels {
    tier: String,
    bucket: String,
    credential_source: String,
}

/// The S3 gateways' per-tier families, from their counters.
const GATEWAY_FAMILIES: [TierFamily<GatewayState>; 6] = [
    TierFamily {
        name: "gateway_upstream_errors",
        help: "Upstream answers with a 5xx status, and answers that broke off",
        bytes: false,
        counter: true,
        value: |s| s.upstream_errors,
    },
    TierFamily {
        name: "gateway_upstream_unreachable",
        help: "Requests the upstream did not answer (the gateway said 503)",
        bytes: false,
        counter: true,
        value: |s| s.upstream_unreachable,
    },
    TierFamily {
        name: "gateway_sent",
        help: "Request body bytes forwarded to the upstream",
        bytes: true,
        counter: true,
        value: |s| s.bytes_up,
    },
    TierFamily {
        name: "gateway_received",
        help: "Response body bytes received from the upstream",
        bytes: true,
        counter: true,
        value: |s| s.bytes_down,
    },
    TierFamily {
        name: "gateway_peer_refused",
        help: "Requests refused with 403 because their connection did not come from the LMCache server's uid (or its owner could not be found)",
        bytes: false,
        counter: true,
        value: |s| s.peer_refused,
    },
    TierFamily {
        name: "gateway_upstream_denied",
        help: "Upstream answers 401 or 403 to LMCache's requests: the store refused the real credentials (revoked, rotated, or lacking a permission)",
        bytes: false,
        counter: true,
        value: |s| s.upstream_denied,
    },
];

/// The kind of a gateway's credential source, for a label: `spec`,
/// `environment`, `profile`, `web_identity`, `container`,
/// `instance_metadata` or `other`. The source's full description (a file
/// path, a role ARN) stays in the gateway's state, which `inspect` shows.
fn credential_kind(source: &str) -> &'static str {
    match source {
        "the tier's aws_access_key_id" => "spec",
        "AWS_ACCESS_KEY_ID" => "environment",
        s if s.starts_with("profile ") => "profile",
        s if s.starts_with("web identity") => "web_identity",
        s if s.contains("ECS container") => "container",
        s if s.starts_with("EC2 instance metadata") => "instance_metadata",
        _ => "other",
    }
}

/// A counter family of each gateway's values by one label `label`: a
/// series per (tier, value name) that `values` gives.
fn encode_labelled(
    encoder: &mut DescriptorEncoder,
    states: &[GatewayState],
    name: &str,
    help: &str,
    label: &str,
    values: fn(&GatewayState) -> Vec<(&'static str, u64)>,
) -> Result<(), std::fmt::Error> {
    let series: Vec<(Vec<(String, String)>, u64)> = states
        .iter()
        .flat_map(|s| {
            values(s).into_iter().map(|(value, count)| {
                let labels = vec![
                    ("tier".to_string(), s.tier.to_string()),
                    (label.to_string(), value.to_string()),
                ];
                (labels, count)
            })
        })
        .collect();
    encode_per_tier(encoder, name, help, None, true, &series)
}

/// Each gateway's answer durations as a Prometheus histogram.
fn encode_answer_seconds(
    encoder: &mut DescriptorEncoder,
    states: &[GatewayState],
) -> Result<(), std::fmt::Error> {
    let kind = Histogram::new([1.0]).metric_type();
    let mut family = encoder.encode_descriptor(
        names::GATEWAY_ANSWER_DURATION.name,
        "Seconds from a request's arrival at the gateway to its answer's headers",
        Some(&Unit::Seconds),
        kind,
    )?;
    for s in states {
        let (count, buckets) = own_counts(&s.answer_seconds);
        let labels = TierLabels {
            tier: s.tier.to_string(),
        };
        family
            .encode_family(&labels)?
            .encode_histogram::<NoLabelSet>(s.answer_seconds.sum, count, &buckets, None)?;
    }
    Ok(())
}

/// What prometheus-client's `encode_histogram` takes for the gateway
/// histogram `h`: the count of observations, and each bucket's upper bound
/// with the observations in that bucket alone (`+Inf` last), which it adds
/// up into the cumulative counts of the text formats. `h` holds them
/// cumulative already (`Histogram::cumulative`), so they are taken apart
/// here; handed on as they are, they would be summed twice. A count below
/// the last bucket's (a state read from elsewhere) is raised to it, so that
/// `+Inf` equals `_count` and no bucket falls, as both formats require.
fn own_counts(h: &lmcache_s3_gateway::state::Histogram) -> (u64, Vec<(f64, u64)>) {
    let mut below = 0;
    let mut buckets: Vec<(f64, u64)> = h
        .bounds
        .iter()
        .zip(&h.cumulative)
        .map(|(bound, cumulative)| {
            let own = cumulative.saturating_sub(below);
            below = below.max(*cumulative);
            (*bound, own)
        })
        .collect();
    let count = h.count.max(below);
    buckets.push((f64::INFINITY, count - below));
    (count, buckets)
}

pub(super) fn encode_gateways(
    encoder: &mut DescriptorEncoder,
    states: &[GatewayState],
) -> Result<(), std::fmt::Error> {
    if states.is_empty() {
        return Ok(());
    }
    encode_requests(encoder, states)?;
    encode_by_label(encoder, states)?;
    let labels = |s: &GatewayState| TierLabels {
        tier: s.tier.to_string(),
    };
    for family in &GATEWAY_FAMILIES {
        family.encode(encoder, states, labels)?;
    }
    encode_answer_seconds(encoder, states)?;
    encode_credential_expiry(encoder, states)?;
    encode_info(encoder, states)?;
    bucket::encode_bounds(encoder, states)
}

/// The requests LMCache sent to each gateway, by method.
fn encode_requests(
    encoder: &mut DescriptorEncoder,
    states: &[GatewayState],
) -> Result<(), std::fmt::Error> {
    let requests: Vec<(MethodLabels, u64)> = states
        .iter()
        .flat_map(|s| {
            let r = s.requests;
            [
                ("HEAD", r.head),
                ("GET", r.get),
                ("PUT", r.put),
                ("POST", r.post),
                ("DELETE", r.delete),
                ("other", r.other),
            ]
            .map(|(method, count)| {
                let labels = MethodLabels {
                    tier: s.tier.to_string(),
                    method: method.to_string(),
                };
                (labels, count)
            })
        })
        .collect();
    let help = "Requests LMCache sent to the tier's S3 gateway, by method";
    encode_per_tier(
        encoder,
        names::GATEWAY_REQUESTS.name,
        help,
        None,
        true,
        &requests,
    )
}

/// The answers by status class, the failed uploads by reason and the
/// refusals by reason.
fn encode_by_label(
    encoder: &mut DescriptorEncoder,
    states: &[GatewayState],
) -> Result<(), std::fmt::Error> {
    encode_labelled(
        encoder,
        states,
        names::GATEWAY_RESPONSES.name,
        "The gateway's answers to LMCache, by status class",
        "class",
        |s| {
            let a = s.answers;
            vec![
                ("2xx", a.success),
                ("3xx", a.redirection),
                ("4xx", a.client_error),
                ("5xx", a.server_error),
                ("other", a.other),
            ]
        },
    )?;
    encode_labelled(
        encoder,
        states,
        names::GATEWAY_CLIENT_UPLOAD_FAILURES.name,
        "Uploads their own client ended while the upstream waited for the body, by reason (stalled: no byte for 5 s, broke_off); not the upstream's failures",
        "reason",
        |s| {
            let f = s.client_upload_failures;
            vec![("stalled", f.stalled), ("broke_off", f.broke_off)]
        },
    )?;
    encode_labelled(encoder, states, names::GATEWAY_REJECTED.name, "Requests the gateway refused with 403, by reason (malformed, unknown_key, scope, time, signature)", "reason", |s| {
        let r = s.rejected_by_reason;
        vec![("malformed", r.malformed), ("unknown_key", r.unknown_key), ("scope", r.scope), ("time", r.time), ("signature", r.signature)]
    })
}

/// When each gateway's real credentials expire; no series for keys that
/// do not expire.
fn encode_credential_expiry(
    encoder: &mut DescriptorEncoder,
    states: &[GatewayState],
) -> Result<(), std::fmt::Error> {
    let expiring: Vec<(TierLabels, u64)> = states
        .iter()
        .filter_map(|s| {
            Some((
                TierLabels {
                    tier: s.tier.to_string(),
                },
                s.credential_expiry_unix?,
            ))
        })
        .collect();
    let help = "When the real credentials a gateway signs with expire, Unix time (no series for keys that do not expire)";
    encode_per_tier(
        encoder,
        names::GATEWAY_CREDENTIAL_EXPIRY.name,
        help,
        Some(&Unit::Seconds),
        false,
        &expiring,
    )
}

/// One series per gateway: its bucket and its credential source's kind.
fn encode_info(
    encoder: &mut DescriptorEncoder,
    states: &[GatewayState],
) -> Result<(), std::fmt::Error> {
    let info: Vec<(GatewayLabels, u64)> = states
        .iter()
        .map(|s| {
            let labels = GatewayLabels {
                tier: s.tier.to_string(),
                bucket: s.bucket.clone(),
                credential_source: credential_kind(&s.credential_source).to_string(),
            };
            (labels, 1)
        })
        .collect();
    let help = "One series per S3 gateway: its bucket and where its real credentials come from";
    encode_per_tier(encoder, names::GATEWAY_INFO.name, help, None, false, &info)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{answered, gateway_page, sample};
    use super::super::Format;
    use super::*;

    #[test]
    fn credential_sources_are_labelled_by_kind_without_paths_or_roles() {
        let kinds = [
            ("the tier's aws_access_key_id", "spec"),
            ("AWS_ACCESS_KEY_ID", "environment"),
            (
                "profile \"kv\" in /root/.aws/config and /root/.aws/credentials",
                "profile",
            ),
            (
                "web identity (role arn:aws:iam::123:role/r, token /var/run/t)",
                "web_identity",
            ),
            ("the ECS container endpoint", "container"),
            (
                "EC2 instance metadata at http://169.254.169.254",
                "instance_metadata",
            ),
            ("something new", "other"),
        ];
        for (source, kind) in kinds {
            assert_eq!(credential_kind(source), kind, "{source}");
        }
    }

    /// The `le` bound and value of each bucket of the answer histogram of
    /// `tier` in `text`, in order.
    fn answer_buckets(text: &str, tier: usize) -> Vec<(String, f64)> {
        let tier = format!("tier=\"{tier}\"");
        text.lines()
            .filter_map(|line| {
                let rest =
                    line.strip_prefix("lmcache_tier_gateway_answer_duration_seconds_bucket{")?;
                let (labels, value) = rest.split_once("} ")?;
                let labels: Vec<&str> = labels.split(',').collect();
                if !labels.contains(&tier.as_str()) {
                    return None;
                }
                let le = labels.iter().find_map(|l| l.strip_prefix("le=\""))?;
                Some((le.trim_end_matches('"').to_string(), value.parse().unwrap()))
            })
            .collect()
    }

    #[test]
    fn the_answer_histogram_carries_the_gateways_own_counts_in_both_formats() {
        use lmcache_s3_gateway::state::ANSWER_SECONDS_BOUNDS;
        // 1 answer within 1 ms, 2 within 5 ms, 3 within 0.5 s, 1 within
        // 10 s and 2 over 30 s; a second gateway with none; a third
        // whose count lags its buckets (a state read back from elsewhere).
        let busy = answered(1, &[1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1], 2, 75.5);
        let idle = answered(2, &[], 0, 0.0);
        let mut lagging = answered(3, &[4], 0, 0.004);
        lagging.answer_seconds.count = 3;
        let states = vec![busy.clone(), idle.clone(), lagging];
        for format in [Format::OpenMetrics, Format::Prometheus] {
            let text = gateway_page(states.clone(), format);
            for state in [&busy, &idle] {
                let h = &state.answer_seconds;
                let buckets = answer_buckets(&text, state.tier);
                let mut expected: Vec<f64> = h.cumulative.iter().map(|&n| n as f64).collect();
                expected.push(h.count as f64);
                let values: Vec<f64> = buckets.iter().map(|(_, v)| *v).collect();
                assert_eq!(values, expected, "{format:?}, tier {}:\n{text}", state.tier);
                assert_eq!(buckets.len(), ANSWER_SECONDS_BOUNDS.len() + 1);
                assert_eq!(buckets.last().unwrap().0, "+Inf");
                let series = |suffix: &str| {
                    format!(
                        "lmcache_tier_gateway_answer_duration_seconds_{suffix}{{tier=\"{}\"}}",
                        state.tier
                    )
                };
                assert_eq!(sample(&text, &series("count")), h.count as f64);
                assert_eq!(sample(&text, &series("sum")), h.sum);
            }
            let lagging = answer_buckets(&text, 3);
            assert_eq!(lagging.last().unwrap().1, 4.0, "{text}");
            assert!(lagging.windows(2).all(|w| w[0].1 <= w[1].1), "{text}");
            let count = r#"lmcache_tier_gateway_answer_duration_seconds_count{tier="3"}"#;
            assert_eq!(sample(&text, count), 4.0);
        }
    }
}
