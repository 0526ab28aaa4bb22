//! Families with one series per tier, encoded at scrape time from a
//! snapshot per tier (a guard's status, a gateway's state): the shared
//! encoder and the typed table row each family is declared by.

use lmcache_tier_spec::adapter::TierSeries;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// A tier's position in the cascade and its `type`: the labels of the
/// adapters' neutral series ([`TierSeries`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabels {
    pub(super) tier: String,
    pub(super) kind: String,
}

/// The adapters' neutral series (`docs/metrics.md`, "Tier series"): one
/// family per name, in the order each first appears, each series
/// labelled by its tier and kind.
pub(super) fn encode_series(
    encoder: &mut DescriptorEncoder,
    series: &[TierSeries],
) -> Result<(), std::fmt::Error> {
    let mut families: Vec<&TierSeries> = Vec::new();
    for one in series {
        if !families.iter().any(|f| f.family == one.family) {
            families.push(one);
        }
    }
    for family in families {
        let values: Vec<(KindLabels, u64)> = series
            .iter()
            .filter(|s| s.family == family.family)
            .map(|s| {
                let labels = KindLabels {
                    tier: s.tier.to_string(),
                    kind: s.kind.to_string(),
                };
                (labels, s.value)
            })
            .collect();
        let unit = family.bytes.then_some(&Unit::Bytes);
        encode_per_tier(
            encoder,
            family.family,
            family.help,
            unit,
            family.counter,
            &values,
        )?;
    }
    Ok(())
}

/// A tier's position in the cascade.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TierLabels {
    pub(super) tier: String,
}

/// One family of per-tier values: `name`, `help`, `unit`, and for each
/// tier its labels and value; counters when `counter`.
pub(super) fn encode_per_tier<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    counter: bool,
    series: &[(L, u64)],
) -> Result<(), std::fmt::Error> {
    if series.is_empty() {
        return Ok(());
    }
    let kind = match counter {
        true => ConstCounter::new(0u64).metric_type(),
        false => ConstGauge::new(0i64).metric_type(),
    };
    let mut family = encoder.encode_descriptor(name, help, unit, kind)?;
    for (labels, value) in series {
        let metric = family.encode_family(labels)?;
        match counter {
            true => ConstCounter::new(*value).encode(metric)?,
            false => ConstGauge::new(i64::try_from(*value).unwrap_or(i64::MAX)).encode(metric)?,
        }
    }
    Ok(())
}

/// One per-tier family read from each snapshot of type `S`: a counter
/// when `counter`, in bytes when `bytes`.
pub(super) struct TierFamily<S> {
    pub(super) name: &'static str,
    pub(super) help: &'static str,
    pub(super) bytes: bool,
    pub(super) counter: bool,
    pub(super) value: fn(&S) -> u64,
}

impl<S> TierFamily<S> {
    /// Encodes the family with one series per snapshot, labelled by
    /// `labels` of it.
    pub(super) fn encode<L: EncodeLabelSet>(
        &self,
        encoder: &mut DescriptorEncoder,
        snapshots: &[S],
        labels: impl Fn(&S) -> L,
    ) -> Result<(), std::fmt::Error> {
        let series: Vec<(L, u64)> = snapshots
            .iter()
            .map(|s| (labels(s), (self.value)(s)))
            .collect();
        let unit = self.bytes.then_some(&Unit::Bytes);
        encode_per_tier(encoder, self.name, self.help, unit, self.counter, &series)
    }
}
