//! How long one scrape of the node's metrics takes with 4 tiers (target
//! <= 5 ms, `docs/performance.md`): 4 `fs` tiers, each with a running
//! capacity guard (its status file read at every scrape), and 4 `s3_bucket`
//! gateways (their counters read at every scrape), against a loopback
//! stand-in store that answers 200.
//!
//! Measured: `NodeMetrics::render` alone in both formats, and a whole HTTP
//! scrape of the endpoint (connect, request, render, answer) from a client
//! on the same host. Run: `cargo bench -p lmcache-launcher --bench
//! metrics_scrape` (`SCRAPES` changes the sample count, default 1000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lmcache_capacity_guard::capacity::guard_specs;
use lmcache_capacity_guard::{Guard, GuardOptions};
use lmcache_launcher::metrics::{Format, MetricsEndpoint, NodeMetrics};
use lmcache_s3_gateway::Gateways;
use lmcache_tier_e2e::answering_store;
use lmcache_tier_spec::Cascade;

/// Median, 99th percentile and maximum of `samples`, in milliseconds.
fn summary(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    format!(
        "median {:.3} ms, p99 {:.3} ms, max {:.3} ms ({} samples)",
        ms(at(0.5)),
        ms(at(0.99)),
        ms(*samples.last().unwrap()),
        samples.len()
    )
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let scrapes: usize = std::env::var("SCRAPES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dirs: Vec<_> = (0..4)
        .map(|i| tmp.path().join(format!("tier-{i}")))
        .collect();
    for dir in &dirs {
        std::fs::create_dir(dir).unwrap();
    }
    let fs_tiers: Vec<String> = dirs
        .iter()
        .map(|d| {
            format!(
                r#"{{"type":"fs","base_path":"{}","max_capacity_gb":1}}"#,
                d.display()
            )
        })
        .collect();
    let cascade = Cascade::parse(&format!("[{}]", fs_tiers.join(",")), "BENCH").unwrap();
    let specs = guard_specs(&cascade).unwrap();
    let metrics = Arc::new(NodeMetrics::new(None));
    let options = GuardOptions {
        owner: Some(metrics.guard_owner()),
        ..GuardOptions::default()
    };
    let guards: Vec<Guard> = specs
        .iter()
        .map(|spec| Guard::start(spec.clone(), options.clone()).unwrap())
        .collect();
    let store = answering_store("200 OK");
    let mut args = Vec::new();
    for bucket in ["kv-a", "kv-b", "kv-c", "kv-d"] {
        args.push("--l2-adapter".to_string());
        args.push(format!(
            r#"{{"type":"s3","s3_endpoint":"127.0.0.1:{store}","s3_bucket":"{bucket}","s3_region":"r","disable_tls":true,"aws_access_key_id":"A","aws_secret_access_key":"S"}}"#
        ));
    }
    let (_, gateways) = runtime.block_on(Gateways::start(&args, &|_| None)).unwrap();
    metrics.watch_guards(specs);
    metrics.watch_gateways(gateways.view());
    // Every guard has written its status file.
    let started = Instant::now();
    while metrics
        .render(Format::Prometheus)
        .unwrap()
        .matches("lmcache_tier_guard_capacity_bytes{")
        .count()
        < 4
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no guard status"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let body = metrics.render(Format::Prometheus).unwrap();
    println!(
        "4 guarded fs tiers, 4 s3_bucket gateways: {} series, {} bytes per scrape",
        body.lines().filter(|l| !l.starts_with('#')).count(),
        body.len()
    );
    for format in [Format::Prometheus, Format::OpenMetrics] {
        let samples = (0..scrapes)
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(metrics.render(format).unwrap());
                start.elapsed()
            })
            .collect();
        println!("render {format:?}: {}", summary(samples));
    }
    let endpoint =
        MetricsEndpoint::start("127.0.0.1:0".parse().unwrap(), "BENCH", metrics.clone()).unwrap();
    let url = format!("http://{}/metrics", endpoint.address());
    let client = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap();
    let samples = (0..scrapes)
        .map(|_| {
            let start = Instant::now();
            let text = client.get(&url).send().unwrap().text().unwrap();
            std::hint::black_box(text);
            start.elapsed()
        })
        .collect();
    println!("HTTP scrape (keep-alive): {}", summary(samples));
    drop(guards);
}
