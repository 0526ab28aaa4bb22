//! What the launch's housekeeping did: deletions by reason, what it kept,
//! and a purge by launch identity with the fields that differed
//! (`docs/metrics.md`, "Housekeeping").

use std::time::Duration;

use lmcache_housekeeping::execute::Report;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::names;

/// A housekeeping reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// One field of a purge by identity: its name and both values.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IdentityChangeLabels {
    field: String,
    stored: String,
    current: String,
}

/// What the launch's housekeeping did.
#[derive(Debug, Clone, Default)]
pub(super) struct HousekeepingMetrics {
    deleted_objects: Family<ReasonLabels, Counter>,
    deleted_bytes: Family<ReasonLabels, Counter>,
    kept_objects: Gauge,
    kept_bytes: Gauge,
    foreign_entries: Gauge,
    duration: Gauge<f64, std::sync::atomic::AtomicU64>,
    last_run: Gauge<f64, std::sync::atomic::AtomicU64>,
    identity_purge: Gauge,
    identity_changes: Family<IdentityChangeLabels, Gauge>,
}

impl HousekeepingMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let hk = HousekeepingMetrics::default();
        let sub = registry.sub_registry_with_prefix(names::HOUSEKEEPING);
        sub.register(
            names::HOUSEKEEPING_DELETED_OBJECTS.name,
            "Entries housekeeping deleted, by reason",
            hk.deleted_objects.clone(),
        );
        sub.register_with_unit(
            names::HOUSEKEEPING_DELETED.name,
            "Allocated bytes housekeeping deleted, by reason",
            Unit::Bytes,
            hk.deleted_bytes.clone(),
        );
        sub.register(
            names::HOUSEKEEPING_KEPT_OBJECTS.name,
            "Cache objects housekeeping kept",
            hk.kept_objects.clone(),
        );
        sub.register_with_unit(
            names::HOUSEKEEPING_KEPT.name,
            "Allocated bytes of the cache objects housekeeping kept",
            Unit::Bytes,
            hk.kept_bytes.clone(),
        );
        sub.register(
            names::HOUSEKEEPING_FOREIGN_ENTRIES.name,
            "Entries in the tier directory that are not the cache's, left alone",
            hk.foreign_entries.clone(),
        );
        sub.register_with_unit(
            names::HOUSEKEEPING_DURATION.name,
            "How long the last housekeeping took",
            Unit::Seconds,
            hk.duration.clone(),
        );
        sub.register_with_unit(
            names::HOUSEKEEPING_LAST_RUN.name,
            "When the last housekeeping ended, Unix time",
            Unit::Seconds,
            hk.last_run.clone(),
        );
        sub.register(
            names::HOUSEKEEPING_IDENTITY_PURGE.name,
            "1 when the last housekeeping purged more than half of the tier's bytes because the launch identity differed from what the tier holds",
            hk.identity_purge.clone(),
        );
        sub.register(
            names::HOUSEKEEPING_IDENTITY_CHANGE.name,
            "1 for each identity field that differed in that purge: field, the value the tier held, this launch's",
            hk.identity_changes.clone(),
        );
        hk
    }

    pub(super) fn record(&self, report: &Report, took: Duration) {
        for total in &report.deleted {
            let labels = ReasonLabels {
                reason: total.reason.to_string(),
            };
            self.deleted_objects
                .get_or_create(&labels)
                .inc_by(total.count);
            self.deleted_bytes
                .get_or_create(&labels)
                .inc_by(total.bytes);
        }
        let set = |gauge: &Gauge, value: u64| gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
        set(&self.kept_objects, report.kept_objects.count);
        set(&self.kept_bytes, report.kept_objects.bytes);
        set(&self.foreign_entries, report.foreign.count);
        self.identity_purge
            .set(i64::from(report.identity_purge.is_some()));
        self.identity_changes.clear();
        for change in report.identity_purge.iter().flat_map(|p| &p.changes) {
            let labels = IdentityChangeLabels {
                field: change.field.to_string(),
                stored: change.stored.clone(),
                current: change.current.clone(),
            };
            self.identity_changes.get_or_create(&labels).set(1);
        }
        self.duration.set(took.as_secs_f64());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.last_run.set(now.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{a_plan, purged_by_identity, sample};
    use super::super::{Format, NodeMetrics};
    use std::time::Duration;

    #[test]
    fn housekeeping_is_counted_by_reason() {
        use lmcache_housekeeping::{housekeep, LaunchIdentity, Mode, TierPolicy};
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("notes.txt"), "not ours").unwrap();
        let identity = LaunchIdentity {
            model: "m".into(),
            tensor_parallel_size: 1,
            pipeline_parallel_size: 1,
            kv_cache_dtype: "auto".into(),
            block_size: 16,
            chunk_size: 256,
            decode_context_parallel_size: 1,
            cp_kv_cache_interleave_size: 1,
            mla_only: false,
            weights: None,
            engine_settings: Default::default(),
        };
        let done = housekeep(tmp.path(), &identity, TierPolicy::default(), Mode::Apply).unwrap();
        let metrics = NodeMetrics::new(Some(&a_plan()));
        metrics.housekept(&done.report, Duration::from_millis(1500));
        let text = metrics.render(Format::OpenMetrics).unwrap();
        assert_eq!(
            sample(&text, "lmcache_tier_housekeeping_foreign_entries"),
            1.0
        );
        assert_eq!(sample(&text, "lmcache_tier_housekeeping_kept_objects"), 0.0);
        assert_eq!(
            sample(&text, "lmcache_tier_housekeeping_duration_seconds"),
            1.5
        );
        assert!(
            sample(
                &text,
                "lmcache_tier_housekeeping_last_run_timestamp_seconds"
            ) > 1.7e9
        );
        assert_eq!(
            sample(&text, "lmcache_tier_housekeeping_identity_purge"),
            0.0
        );
    }

    #[test]
    fn a_purge_of_most_of_the_tier_by_identity_is_flagged_with_its_fields() {
        let metrics = purged_by_identity();
        let text = metrics.render(Format::OpenMetrics).unwrap();
        assert_eq!(
            sample(&text, "lmcache_tier_housekeeping_identity_purge"),
            1.0
        );
        assert_eq!(
            sample(
                &text,
                r#"lmcache_tier_housekeeping_identity_change{field="model",stored="/models/m",current="m"}"#
            ),
            1.0,
            "{text}"
        );
    }
}
