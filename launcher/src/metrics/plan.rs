//! The plan's families: its numbers, and one info series with the rule that
//! chose each (`docs/metrics.md`, "The plan"; the rules are
//! `docs/sizing.md`'s).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use super::names;
use crate::plan::launch_plan::{Decisions, LaunchPlan};
use crate::plan::raw_block::TierDevice;

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
    register_raw_block_devices(registry, &d.host.raw_block_devices);
    registry.register(
        names::PLAN.name,
        "The rule that chose each number of the plan (docs/sizing.md)",
        Info::new(rules(d)),
    );
}

/// A `raw_block` tier's labels: its position and its device.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    tier: String,
    device: String,
}

/// One series per `raw_block` tier: its device's size as the plan measured
/// it (0 when it could not be read: nothing there, not a block device);
/// no family on a node without one.
fn register_raw_block_devices(registry: &mut Registry, devices: &[TierDevice]) {
    if devices.is_empty() {
        return;
    }
    let family = Family::<DeviceLabels, Gauge<i64>>::default();
    for device in devices {
        let labels = DeviceLabels {
            tier: device.position.to_string(),
            device: device.device_path.display().to_string(),
        };
        let bytes = device.size_bytes.unwrap_or(0);
        family
            .get_or_create(&labels)
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
    registry.register_with_unit(
        names::PLAN_RAW_BLOCK_DEVICE.name,
        "Size of each raw_block tier's device as the plan measured it; 0 when it could not be read",
        Unit::Bytes,
        family,
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
    use crate::plan::raw_block::{DeviceKind, TierDevice};
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
        assert!(!text.contains("raw_block"), "{text}");
    }

    #[test]
    fn each_raw_block_tier_s_device_is_exported_with_its_size() {
        let mut plan = a_plan();
        plan.decisions.host.raw_block_devices = vec![
            TierDevice {
                position: 1,
                device_path: "/dev/nvme1n1".into(),
                kind: DeviceKind::Block,
                size_bytes: Some(3 << 40),
                in_use: Vec::new(),
                sink: false,
            },
            TierDevice {
                position: 2,
                device_path: "/dev/gone\"\n".into(),
                kind: DeviceKind::Missing,
                size_bytes: None,
                in_use: Vec::new(),
                sink: false,
            },
        ];
        let text = NodeMetrics::new(Some(&plan))
            .render(Format::OpenMetrics)
            .unwrap();
        let series = r#"lmcache_tier_plan_raw_block_device_bytes{tier="1",device="/dev/nvme1n1"}"#;
        assert_eq!(sample(&text, series), (3u64 << 40) as f64);
        // A label value is escaped, as every label value of the page is.
        let gone = r#"lmcache_tier_plan_raw_block_device_bytes{tier="2",device="/dev/gone\"\n"}"#;
        assert_eq!(sample(&text, gone), 0.0);
    }
}
