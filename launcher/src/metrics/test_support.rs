//! What the metrics' unit tests share: a launch's plan, a sample read from
//! a page, and pages rendered from given states.

use std::time::Duration;

use lmcache_s3_gateway::state::GatewayState;
use lmcache_sizing::rules::{OdirectProbe, VolumeStats};
use lmcache_sizing::volume::Filesystem;
use lmcache_sizing::{Decision, GIB};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use super::gateways::encode_gateways;
use super::{Format, NodeMetrics, PREFIX};
use crate::node::env::text_vars;
use crate::plan::inputs::DiskFacts;
use crate::plan::inputs::{EngineFacts, HostFacts};
use crate::plan::launch_plan::LaunchPlan;
use crate::plan::{plan, Planned};

/// The plan of a node with an 8 GiB L1 and the built-in tier on a
/// 1 TiB xfs volume.
pub(super) fn a_plan() -> LaunchPlan {
    let vars = text_vars([
        ("EREBINE_AGENT_KV_CACHE_BACKEND", "lmcache"),
        ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "8"),
        ("EREBINE_AGENT_LMCACHE_DISK_PATH", "/cache"),
        ("EREBINE_AGENT_LMCACHE_PATH", "/bin/sh"),
    ]);
    let engine = EngineFacts {
        model: "m".into(),
        tensor_parallel_size: 1,
        pipeline_parallel_size: 1,
        data_parallel_size: 1,
        kv_cache_dtype: "auto".into(),
        block_size: 16,
        max_num_batched_tokens: Some(2048),
        hybrid_attention: false,
        ..EngineFacts::default()
    };
    let host = HostFacts {
        memory: Decision::new(64 * GIB, "given", "test"),
        physical_cores: 16,
        executable: None,
        disk: Some(DiskFacts {
            measured_at: "/cache".into(),
            volume: VolumeStats {
                total_bytes: 1024 * GIB,
                free_bytes: 1024 * GIB,
                block_size: 4096,
            },
            filesystem: Filesystem {
                fs_type: "xfs".into(),
                read_only: false,
                source: None,
                own_volume: false,
            },
            reclaimable_bytes: 0,
            odirect: OdirectProbe::Succeeded,
            read_probe: None,
            tier: Default::default(),
        }),
        gpu: None,
        engine_gpu: None,
        odirect_tiers: Vec::new(),
        raw_block_devices: Vec::new(),
        lmcache_version: None,
        weights: None,
        node: None,
    };
    match plan(&engine, &vars, &host).unwrap() {
        Planned::Server(plan) => *plan,
        Planned::NothingToLaunch(why) => panic!("{}", why.reason),
    }
}

/// The value of the one sample of `series` (a name with its labels).
pub(super) fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .parse()
        .unwrap()
}

/// Renders `metrics` until `done` holds for the page (a guard writes its
/// status once it has counted its tier), or panics after 20 s.
pub(super) fn render_until(metrics: &NodeMetrics, done: impl Fn(&str) -> bool) -> String {
    let started = std::time::Instant::now();
    loop {
        let text = metrics.render(Format::OpenMetrics).unwrap();
        if done(&text) {
            return text;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A gateway's state on `tier` whose answers fell `per_bucket` into the
/// buckets of [`ANSWER_SECONDS_BOUNDS`] and `over` above the last, for
/// `sum` seconds in all.
pub(super) fn answered(tier: usize, per_bucket: &[u64], over: u64, sum: f64) -> GatewayState {
    use lmcache_s3_gateway::state::{Histogram, ANSWER_SECONDS_BOUNDS};
    let mut running = 0;
    let cumulative = ANSWER_SECONDS_BOUNDS
        .iter()
        .enumerate()
        .map(|(i, _)| {
            running += per_bucket.get(i).copied().unwrap_or(0);
            running
        })
        .collect();
    GatewayState {
        tier,
        bucket: "kv".into(),
        key_prefix: String::new(),
        cache_identity: None,
        upstream: "http://127.0.0.1:9".into(),
        region: "r".into(),
        credential_source: "the tier's aws_access_key_id".into(),
        started_at: "2026-12-01T00:00:00Z".into(),
        requests: Default::default(),
        rejected: 0,
        upstream_errors: 0,
        upstream_unreachable: 0,
        bytes_up: 0,
        bytes_down: 0,
        last_upstream_error: None,
        answers: Default::default(),
        rejected_by_reason: Default::default(),
        answer_seconds: Histogram {
            bounds: ANSWER_SECONDS_BOUNDS.to_vec(),
            cumulative,
            sum,
            count: running + over,
        },
        credential_expiry_unix: None,
        peer_refused: 0,
        client_upload_failures: Default::default(),
        upstream_denied: 0,
        last_upstream_denied: None,
        bucket_bound: None,
    }
}

/// The gateway families of `states` in `format`, as a scrape renders
/// them.
pub(super) fn gateway_page(states: Vec<GatewayState>, format: Format) -> String {
    #[derive(Debug)]
    struct States(Vec<GatewayState>);
    impl Collector for States {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            encode_gateways(&mut encoder, &self.0)
        }
    }
    let mut registry = Registry::with_prefix(PREFIX);
    registry.register_collector(Box::new(States(states)));
    let mut text = String::new();
    match format {
        Format::OpenMetrics => {
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap()
        }
        Format::Prometheus => {
            prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap()
        }
    }
    text
}

/// The metrics of a launch whose housekeeping purged the whole tier (one
/// object of model `/models/m`) because the launch's model is `m`.
pub(super) fn purged_by_identity() -> NodeMetrics {
    use lmcache_housekeeping::{housekeep, Mode, TierPolicy};
    let tmp = tempfile::tempdir().unwrap();
    let name = format!("-SEP-models-SEP-m@0x01000100@0@{}.data", "ab".repeat(32));
    std::fs::write(tmp.path().join(name), vec![1u8; 8192]).unwrap();
    let identity = EngineFacts {
        model: "m".into(),
        ..EngineFacts::default()
    }
    .launch_identity(256, None);
    let done = housekeep(tmp.path(), &identity, TierPolicy::default(), Mode::Apply).unwrap();
    let metrics = NodeMetrics::new(Some(&a_plan()));
    metrics.housekept(&done.report, Duration::from_millis(10));
    metrics
}
