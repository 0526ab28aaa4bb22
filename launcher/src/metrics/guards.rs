//! The capacity guards' families, read from their status files at every
//! scrape (`docs/metrics.md`, "Capacity guards").

use lmcache_capacity_guard::status::{Following, GuardStatus};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use super::names;
use super::tier_family::{encode_per_tier, TierFamily, TierLabels};

/// The status of one of this launch's guards, and whether its tier is
/// shared.
pub(super) struct ServedGuard {
    pub(super) status: GuardStatus,
    pub(super) shared: bool,
}

/// The capacity guards' families, from their status files.
const GUARD_FAMILIES: [TierFamily<GuardStatus>; 11] = [
    TierFamily {
        name: "guard_usage",
        help: "Allocated bytes of the tier's cache objects, as the capacity guard counts them",
        bytes: true,
        counter: false,
        value: |s| s.tracked.bytes,
    },
    TierFamily {
        name: "guard_usage_objects",
        help: "Cache objects in the tier, as the capacity guard counts them",
        bytes: false,
        counter: false,
        value: |s| s.tracked.objects,
    },
    TierFamily {
        name: "guard_undeletable",
        help: "Allocated bytes of the tier's objects the capacity guard could not delete, counted in guard_usage",
        bytes: true,
        counter: false,
        value: |s| s.undeletable.bytes,
    },
    TierFamily {
        name: "guard_undeletable_objects",
        help: "The tier's objects the capacity guard could not delete (still on the disk and counted)",
        bytes: false,
        counter: false,
        value: |s| s.undeletable.objects,
    },
    TierFamily {
        name: "guard_capacity",
        help: "The tier's capacity",
        bytes: true,
        counter: false,
        value: |s| s.capacity_bytes,
    },
    TierFamily {
        name: "guard_trigger",
        help: "Usage at which the capacity guard starts an eviction cycle",
        bytes: true,
        counter: false,
        value: |s| s.trigger_bytes,
    },
    TierFamily {
        name: "guard_eviction_cycles",
        help: "Eviction cycles the capacity guard ran",
        bytes: false,
        counter: true,
        value: |s| s.evictions.cycles,
    },
    TierFamily {
        name: "guard_evicted_objects",
        help: "Cache objects the capacity guard deleted",
        bytes: false,
        counter: true,
        value: |s| s.evictions.deleted.objects,
    },
    TierFamily {
        name: "guard_evicted",
        help: "Bytes the capacity guard's deletions freed on the volume (nothing for a file with other hard links)",
        bytes: true,
        counter: true,
        value: |s| s.evictions.deleted.bytes,
    },
    TierFamily {
        name: "guard_rescans",
        help: "Full rescans of the tier (inotify queue overflows, rescans instead of inotify)",
        bytes: false,
        counter: true,
        value: |s| s.rescans,
    },
    TierFamily {
        name: "guard_inotify_overflows",
        help: "inotify queue overflows (IN_Q_OVERFLOW) of the guard's watch, each followed by a rescan",
        bytes: false,
        counter: true,
        value: |s| s.overflows,
    },
];

/// The families of the free space each guard keeps on its volume, for the
/// guards whose volume reports a size (read only from statuses that have
/// [`GuardStatus::free_space`]).
const FREE_SPACE_FAMILIES: [TierFamily<GuardStatus>; 5] = [
    TierFamily {
        name: "guard_volume_free",
        help: "Free space on the tier's volume at the guard's last check",
        bytes: true,
        counter: false,
        value: |s| s.free_space.unwrap_or_default().free_bytes,
    },
    TierFamily {
        name: "guard_free_space_line",
        help: "Free space the guard keeps on the volume: min(reserve, free + tier - capacity at start); below it the guard evicts",
        bytes: true,
        counter: false,
        value: |s| s.free_space.unwrap_or_default().line_bytes,
    },
    TierFamily {
        name: "guard_free_space_eviction_cycles",
        help: "Eviction cycles run because the volume's free space or inodes fell below the line",
        bytes: false,
        counter: true,
        value: |s| s.free_space.unwrap_or_default().evictions.cycles,
    },
    TierFamily {
        name: "guard_free_space_evicted_objects",
        help: "Cache objects deleted because the volume's free space or inodes fell below the line",
        bytes: false,
        counter: true,
        value: |s| s.free_space.unwrap_or_default().evictions.deleted.objects,
    },
    TierFamily {
        name: "guard_free_space_evicted",
        help: "Bytes freed on the volume by deletions because its free space or inodes fell below the line",
        bytes: true,
        counter: true,
        value: |s| s.free_space.unwrap_or_default().evictions.deleted.bytes,
    },
];

/// The families of the free inodes each guard keeps on its volume, for the
/// guards whose volume reports inodes (read only from statuses that have
/// [`FreeSpace::inodes`](lmcache_capacity_guard::status::FreeSpace::inodes)).
const INODE_FAMILIES: [TierFamily<GuardStatus>; 2] = [
    TierFamily {
        name: "guard_volume_free_inodes",
        help: "Free inodes on the tier's volume at the guard's last check",
        bytes: false,
        counter: false,
        value: |s| free_inodes(s).free_inodes,
    },
    TierFamily {
        name: "guard_free_space_line_inodes",
        help: "Free inodes the guard keeps on the volume: min(10% of its inodes, 1,000,000, free at start); below it the guard evicts",
        bytes: false,
        counter: false,
        value: |s| free_inodes(s).line_inodes,
    },
];

fn free_inodes(status: &GuardStatus) -> lmcache_capacity_guard::status::FreeInodes {
    status.free_space.and_then(|f| f.inodes).unwrap_or_default()
}

pub(super) fn encode_guards(
    encoder: &mut DescriptorEncoder,
    guards: &[ServedGuard],
) -> Result<(), std::fmt::Error> {
    let statuses: Vec<GuardStatus> = guards.iter().map(|g| g.status.clone()).collect();
    encode_info(encoder, guards)?;
    for family in &GUARD_FAMILIES {
        family.encode(encoder, &statuses, tier_labels)?;
    }
    let measured: Vec<GuardStatus> = statuses
        .iter()
        .filter(|s| s.free_space.is_some())
        .cloned()
        .collect();
    for family in &FREE_SPACE_FAMILIES {
        family.encode(encoder, &measured, tier_labels)?;
    }
    let counted: Vec<GuardStatus> = measured
        .into_iter()
        .filter(|s| s.free_space.is_some_and(|f| f.inodes.is_some()))
        .collect();
    for family in &INODE_FAMILIES {
        family.encode(encoder, &counted, tier_labels)?;
    }
    encode_event_lags(encoder, &statuses)
}

/// The labels of a guard's per-tier series.
fn tier_labels(status: &GuardStatus) -> TierLabels {
    TierLabels {
        tier: status.tier.to_string(),
    }
}

/// The info family: one series per guard, how it follows its tier and
/// whether the tier is shared.
fn encode_info(
    encoder: &mut DescriptorEncoder,
    guards: &[ServedGuard],
) -> Result<(), std::fmt::Error> {
    let info: Vec<(Vec<(String, String)>, u64)> = guards
        .iter()
        .map(|g| {
            let following = match g.status.following {
                Following::Inotify => "inotify",
                Following::Rescans => "rescans",
            };
            let labels = vec![
                ("tier".to_string(), g.status.tier.to_string()),
                ("following".to_string(), following.to_string()),
                ("shared".to_string(), g.shared.to_string()),
            ];
            (labels, 1)
        })
        .collect();
    let help = "One series per capacity guard: how it follows its tier (following: inotify, or rescans when inotify cannot watch it) and whether the tier is shared (shared: true, rescanned every 10 s or more by design)";
    encode_per_tier(encoder, names::GUARD_INFO.name, help, None, false, &info)
}

/// The event lag of each guard whose status has one; no family when none
/// has.
fn encode_event_lags(
    encoder: &mut DescriptorEncoder,
    statuses: &[GuardStatus],
) -> Result<(), std::fmt::Error> {
    let lags: Vec<(TierLabels, f64)> = statuses
        .iter()
        .filter_map(|s| Some((tier_labels(s), s.event_lag_ms? as f64 / 1e3)))
        .collect();
    if lags.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(
        names::GUARD_EVENT_LAG.name,
        "In the guard's last batch of inotify events, the longest time from an object's last change (ctime) to the guard counting it",
        Some(&Unit::Seconds),
        ConstGauge::new(0.0f64).metric_type(),
    )?;
    for (labels, seconds) in &lags {
        ConstGauge::new(*seconds).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{render_until, sample};
    use super::super::{Format, NodeMetrics};
    use lmcache_capacity_guard::status::GuardStatus;
    use lmcache_sizing::GIB;
    use std::path::PathBuf;
    use std::time::Duration;

    #[test]
    fn a_guard_is_read_from_its_status_file_at_every_scrape() {
        use lmcache_capacity_guard::capacity::guard_specs;
        use lmcache_capacity_guard::{Guard, GuardOptions};
        use lmcache_tier_spec::Cascade;

        let tmp = tempfile::tempdir().unwrap();
        let json = format!(
            r#"{{"type":"fs","base_path":"{}","max_capacity_gb":1}}"#,
            tmp.path().display()
        );
        let spec = guard_specs(&Cascade::parse(&json, "V").unwrap())
            .unwrap()
            .remove(0);
        let metrics = NodeMetrics::new(None);
        metrics.watch_guards([spec.clone()]);
        assert!(!metrics
            .render(Format::OpenMetrics)
            .unwrap()
            .contains("guard_"));
        let options = GuardOptions {
            owner: Some(metrics.guard_owner()),
            ..GuardOptions::default()
        };
        let guard = Guard::start(spec, options).unwrap();
        let started = std::time::Instant::now();
        while !metrics
            .render(Format::OpenMetrics)
            .unwrap()
            .contains("lmcache_tier_guard_capacity_bytes")
        {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no guard status"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let text = metrics.render(Format::OpenMetrics).unwrap();
        drop(guard);
        assert_eq!(
            sample(&text, r#"lmcache_tier_guard_capacity_bytes{tier="0"}"#),
            GIB as f64
        );
        assert_eq!(
            sample(&text, r#"lmcache_tier_guard_usage_bytes{tier="0"}"#),
            0.0
        );
        assert_eq!(
            sample(&text, r#"lmcache_tier_guard_evicted_bytes_total{tier="0"}"#),
            0.0
        );
        assert!(
            text.contains("# TYPE lmcache_tier_guard_rescans counter"),
            "{text}"
        );
        assert!(
            sample(
                &text,
                r#"lmcache_tier_guard_free_space_line_bytes{tier="0"}"#
            ) > 0.0
        );
        assert!(sample(&text, r#"lmcache_tier_guard_volume_free_bytes{tier="0"}"#) > 0.0);
        // The free inodes, on a volume that counts them (btrfs reports none).
        if nix::sys::statvfs::statvfs(tmp.path()).unwrap().files() > 0 {
            assert!(sample(&text, r#"lmcache_tier_guard_volume_free_inodes{tier="0"}"#) > 0.0);
            assert!(
                sample(
                    &text,
                    r#"lmcache_tier_guard_free_space_line_inodes{tier="0"}"#
                ) > 0.0
            );
        }
        assert_eq!(
            sample(
                &text,
                r#"lmcache_tier_guard_free_space_eviction_cycles_total{tier="0"}"#
            ),
            0.0
        );
    }

    #[test]
    fn only_the_statuses_of_this_launchs_guards_are_served() {
        use lmcache_capacity_guard::capacity::guard_specs;
        use lmcache_capacity_guard::status::GUARD_STATUS_FILE_NAME;
        use lmcache_capacity_guard::{Guard, GuardOptions};
        use lmcache_tier_spec::Cascade;

        let tmp = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = (0..4).map(|i| tmp.path().join(format!("t{i}"))).collect();
        for dir in &dirs {
            std::fs::create_dir(dir).unwrap();
        }
        // Tiers 0 and 1 of 1 GiB, 2 of 2 GiB, 3 shared.
        let json = format!(
            r#"[{{"type":"fs","base_path":"{}","max_capacity_gb":1}},{{"type":"fs","base_path":"{}","max_capacity_gb":1}},{{"type":"fs","base_path":"{}","max_capacity_gb":2}},{{"type":"fs","base_path":"{}","max_capacity_gb":1,"shared":true}}]"#,
            dirs[0].display(),
            dirs[1].display(),
            dirs[2].display(),
            dirs[3].display()
        );
        let specs = guard_specs(&Cascade::parse(&json, "V").unwrap()).unwrap();
        let metrics = NodeMetrics::new(None);
        metrics.watch_guards(specs.clone());
        let ours = GuardOptions {
            owner: Some(metrics.guard_owner()),
            ..GuardOptions::default()
        };
        let _first = Guard::start(specs[0].clone(), ours.clone()).unwrap();
        let shared = Guard::start(specs[3].clone(), ours.clone()).unwrap();
        let tier = |t: usize| format!(r#"lmcache_tier_guard_capacity_bytes{{tier="{t}"}}"#);
        render_until(&metrics, |text| {
            text.contains(&tier(0)) && text.contains(&tier(3))
        });
        // What other launches left, each claiming tier 0 with other
        // figures: the status of an earlier launch in tier 1 (the same pid,
        // as a container's launch has at every start), and one written
        // before statuses named an owner in tier 2.
        let read = |dir: &PathBuf| {
            let bytes = std::fs::read(dir.join(GUARD_STATUS_FILE_NAME)).unwrap();
            serde_json::from_slice::<GuardStatus>(&bytes).unwrap()
        };
        let mut stale = read(&dirs[0]);
        stale.tier = 0;
        stale.capacity_bytes = 7 * GIB;
        stale.owner = Some("an earlier launch".into());
        let write = |dir: &PathBuf, json: serde_json::Value| {
            std::fs::write(dir.join(GUARD_STATUS_FILE_NAME), json.to_string()).unwrap()
        };
        write(&dirs[1], serde_json::to_value(&stale).unwrap());
        let mut ownerless = serde_json::to_value(&stale).unwrap();
        ownerless.as_object_mut().unwrap().remove("owner");
        write(&dirs[2], ownerless);
        let text = metrics.render(Format::OpenMetrics).unwrap();
        let series = |text: &str, name: &str| {
            let prefix = format!("lmcache_tier_{name}{{");
            text.lines().filter(|l| l.starts_with(&prefix)).count()
        };
        assert_eq!(series(&text, "guard_capacity_bytes"), 2, "{text}");
        assert_eq!(sample(&text, &tier(0)), GIB as f64, "{text}");
        assert!(
            !text.contains(&tier(1)) && !text.contains(&tier(2)),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                r#"lmcache_tier_guard_info{tier="0",following="inotify",shared="false"}"#
            ),
            1.0
        );
        assert_eq!(
            sample(
                &text,
                r#"lmcache_tier_guard_info{tier="3",following="inotify",shared="true"}"#
            ),
            1.0
        );
        // The shared tier's status replaced by a guard of another launch
        // (another node writing the same directory), once this launch's
        // guard there has stopped and written its last.
        drop(shared);
        let mut elsewhere = read(&dirs[3]);
        elsewhere.owner = Some("another node's launch".into());
        write(&dirs[3], serde_json::to_value(&elsewhere).unwrap());
        let text = metrics.render(Format::OpenMetrics).unwrap();
        assert_eq!(series(&text, "guard_capacity_bytes"), 1, "{text}");
        assert_eq!(series(&text, "guard_info"), 1, "{text}");
        // This launch's guard of tier 1 replaces the earlier launch's
        // status with its own.
        let _second = Guard::start(specs[1].clone(), ours).unwrap();
        let text = render_until(&metrics, |text| text.contains(&tier(1)));
        assert_eq!(sample(&text, &tier(1)), GIB as f64, "{text}");
        assert_eq!(series(&text, "guard_usage_bytes"), 2, "{text}");
    }
}
