//! The plan's families: its numbers, and one info series with the rule that
//! chose each (`docs/metrics.md`, "The plan"; the rules are
//! `docs/sizing.md`'s).

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use super::names;
use crate::plan::launch_plan::{Decisions, LaunchPlan};

/// The plan's decisions: the numbers, and one info series with the rule
/// that chose each.
pub(super) fn register_plan(registry: &mut Registry, plan: &LaunchPlan) {
    let d = &plan.decisions;
    let disk = d.disk.as_ref();
    let gauge = |value: u64| {
        let gauge = Gauge::<i64>::default();
        gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
        gauge
    };
    registry.register_with_unit(
        names::PLAN_L1.name,
        "The L1 (CPU memory) the server gets",
        Unit::Bytes,
        gauge(d.l1_size.value),
    );
    let capacity = disk.map_or(0, |disk| disk.capacity.value);
    registry.register_with_unit(
        names::PLAN_DISK_CAPACITY.name,
        "Capacity of the built-in disk tier; 0 when there is none",
        Unit::Bytes,
        gauge(capacity),
    );
    if let Some(disk) = disk {
        registry.register(
            names::PLAN_IO_WORKERS.name,
            "I/O worker threads of the built-in disk tier",
            gauge(u64::from(disk.io_workers.value)),
        );
        registry.register(
            names::PLAN_ODIRECT.name,
            "1 when the built-in disk tier uses O_DIRECT",
            gauge(u64::from(disk.use_odirect.value)),
        );
    }
    registry.register(
        names::PLAN.name,
        "The rule that chose each number of the plan (docs/sizing.md)",
        Info::new(rules(d)),
    );
}

/// The info series' labels: the rule of each number of the plan, `none`
/// for a number of the built-in disk tier when there is none.
fn rules(d: &Decisions) -> Vec<(String, String)> {
    let disk = d.disk.as_ref();
    let rule = |decision: Option<&'static str>| decision.unwrap_or("none").to_string();
    vec![
        ("l1_rule".to_string(), d.l1_size.rule.to_string()),
        (
            "cascade_source".to_string(),
            d.cascade_source.rule.to_string(),
        ),
        (
            "capacity_rule".to_string(),
            rule(disk.map(|x| x.capacity.rule)),
        ),
        (
            "volume_kind".to_string(),
            rule(disk.map(|x| x.volume_kind.rule)),
        ),
        (
            "io_workers_rule".to_string(),
            rule(disk.map(|x| x.io_workers.rule)),
        ),
        (
            "odirect_rule".to_string(),
            rule(disk.map(|x| x.use_odirect.rule)),
        ),
        ("chunk_size_rule".to_string(), d.chunk_size.rule.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{a_plan, sample};
    use super::super::{Format, NodeMetrics};
    use lmcache_sizing::GIB;

    #[test]
    fn the_plan_is_exported_with_the_rule_of_each_number() {
        let text = NodeMetrics::new(Some(&a_plan()))
            .render(Format::OpenMetrics)
            .unwrap();
        assert_eq!(
            sample(&text, "lmcache_tier_plan_l1_bytes"),
            8.0 * GIB as f64
        );
        assert_eq!(
            sample(&text, "lmcache_tier_plan_disk_capacity_bytes"),
            128.0 * GIB as f64
        );
        assert_eq!(sample(&text, "lmcache_tier_plan_io_workers"), 8.0);
        assert_eq!(sample(&text, "lmcache_tier_plan_odirect"), 1.0);
        let info = text
            .lines()
            .find(|l| l.starts_with("lmcache_tier_plan_info{"))
            .unwrap();
        for label in [
            r#"l1_rule="explicit""#,
            r#"capacity_rule="derived-12.5pct-volume""#,
            r#"volume_kind="local""#,
            r#"odirect_rule="probe-succeeded""#,
        ] {
            assert!(info.contains(label), "{label} not in {info}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
