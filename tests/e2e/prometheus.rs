//! End to end with a real Prometheus (Debian's package): it scrapes two
//! launches of the real LMCache 0.5.6 server, one on the built-in disk tier
//! and one with an `fs` tier and an `s3_bucket` tier through the S3 gateway,
//! on both targets each (this project's endpoint and LMCache's own
//! `/metrics`), with the shipped alerting rules loaded. Its HTTP API then
//! shows the guards' usage, the gateway's requests rising, the servers up,
//! and a restart after a server is killed; and every PromQL expression of
//! the shipped Grafana dashboards parses and returns a series. A second
//! test gives a gateway a known workload and reads a quantile of its
//! answer histogram back from Prometheus.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lmcache_tier_e2e::{
    binaries, children_of, free_port, get_json, get_openmetrics, get_text, prometheus_binary,
    run_one_layer_bench, stop_launch, strict_openmetrics, wait_for_status, Binaries, Proc,
    S3Server, S3sFs,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

const BINS: Binaries = binaries!();

/// A file the project ships under `deploy/`.
fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

/// One launch: its ports and the process.
struct Node {
    http_port: u16,
    mp_port: u16,
    metrics_port: u16,
    launch: Proc,
}

fn launch_node(dir: &Path, name: &str, vars: &[(&str, String)]) -> Node {
    let home = dir.join(name);
    std::fs::create_dir_all(&home).unwrap();
    let (mp_port, http_port, metrics_port) = (free_port(), free_port(), free_port());
    let mut cmd = BINS.launch_command(&home, mp_port, http_port, &[]);
    cmd.env(
        "EREBINE_AGENT_LMCACHE_METRICS_PORT",
        metrics_port.to_string(),
    )
    .args(["--fast-failure-window", "1"]);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let mut launch = Proc::spawn(cmd, &home.join("launch.log"));
    let url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_status(&url, &mut launch, Duration::from_secs(180));
    Node {
        http_port,
        mp_port,
        metrics_port,
        launch,
    }
}

/// A Prometheus on 127.0.0.1 scraping `nodes` every second, with the
/// shipped alerting rules; its API's base URL.
fn start_prometheus(dir: &Path, nodes: &[&Node]) -> (Proc, String) {
    let metrics: Vec<u16> = nodes.iter().map(|n| n.metrics_port).collect();
    let servers: Vec<u16> = nodes.iter().map(|n| n.http_port).collect();
    start_prometheus_on(dir, &metrics, &servers)
}

/// A Prometheus on 127.0.0.1 scraping the node endpoints on the ports
/// `metrics` and LMCache's own `/metrics` on `servers` every second, with
/// the shipped alerting rules; its API's base URL.
fn start_prometheus_on(dir: &Path, metrics: &[u16], servers: &[u16]) -> (Proc, String) {
    let targets = |ports: &[u16]| {
        let list: Vec<String> = ports
            .iter()
            .map(|port| format!("\"127.0.0.1:{port}\""))
            .collect();
        list.join(", ")
    };
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: lmcache-node\n    static_configs:\n      - targets: [{}]\n  - job_name: lmcache-server\n    static_configs:\n      - targets: [{}]\n",
        deploy("prometheus/lmcache-node-alerts.yml").display(),
        targets(metrics),
        targets(servers),
    );
    let config_file = dir.join("prometheus.yml");
    std::fs::write(&config_file, config).unwrap();
    let port = free_port();
    let mut cmd = std::process::Command::new(prometheus_binary());
    cmd.arg(format!("--config.file={}", config_file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"));
    let prometheus = Proc::spawn(cmd, &dir.join("prometheus.log"));
    let base = format!("http://127.0.0.1:{port}");
    let start = Instant::now();
    while get_text(&format!("{base}/-/ready")).is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "Prometheus not ready:\n{}",
            prometheus.output()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (prometheus, base)
}

/// The API's answer to the instant query `promql`: its result vector.
fn query(base: &str, promql: &str) -> Vec<Value> {
    let url =
        reqwest::Url::parse_with_params(&format!("{base}/api/v1/query"), &[("query", promql)])
            .unwrap();
    let answer = get_json(url.as_str()).unwrap_or_else(|| panic!("Prometheus refused {promql:?}"));
    assert_eq!(answer["status"], "success", "{promql}: {answer}");
    answer["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Queries `promql` until it returns at least `n` series, or panics after
/// `limit`.
fn until_series(base: &str, promql: &str, n: usize, limit: Duration) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let result = query(base, promql);
        if result.len() >= n {
            return result;
        }
        assert!(
            start.elapsed() < limit,
            "{promql}: {} series after {limit:?}, wanted {n}",
            result.len()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Every `expr` of the Grafana dashboard `file`, with its variables set
/// for this test (every node, a one-minute rate window).
fn dashboard_exprs(file: &Path) -> Vec<String> {
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            t["expr"]
                .as_str()
                .unwrap()
                .replace("$instance", ".+")
                .replace("$__rate_interval", "1m")
        })
        .collect()
}

#[test]
fn prometheus_scrapes_two_nodes_and_every_dashboard_query_returns_a_series() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s3_port = free_port();
    let s3 = S3Server::start(dir, s3_port);
    s3.create_bucket("kv-cache");

    // Node A: the built-in tier, holding an object of another model that
    // its housekeeping deletes.
    let cache = dir.join("a/cache");
    std::fs::create_dir_all(&cache).unwrap();
    let stale = format!("other-model@0x01000100@0@{}.data", "ab".repeat(32));
    std::fs::write(cache.join(stale), vec![7u8; 4096]).unwrap();
    let mut a = launch_node(
        dir,
        "a",
        &[("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "2".into())],
    );
    // Node B: an fs tier and an s3_bucket tier.
    let fs_dir = dir.join("b/fs-tier");
    std::fs::create_dir_all(&fs_dir).unwrap();
    let cascade = serde_json::json!([
        {"type": "fs", "base_path": fs_dir, "max_capacity_gb": 5},
        {"type": "s3", "s3_endpoint": format!("127.0.0.1:{s3_port}"), "s3_bucket": "kv-cache",
         "s3_region": "us-east-1", "s3_prefer_http2": false, "disable_tls": true,
         "aws_access_key_id": "AKIDPROMTEST", "aws_secret_access_key": "prom-test-secret"}
    ]);
    let mut b = launch_node(
        dir,
        "b",
        &[("EREBINE_AGENT_LMCACHE_L2_ADAPTER", cascade.to_string())],
    );
    let (_prometheus, base) = start_prometheus(dir, &[&a, &b]);

    until_series(
        &base,
        r#"up{job="lmcache-server"} == 1"#,
        2,
        Duration::from_secs(30),
    );
    until_series(
        &base,
        "lmcache_tier_server_up == 1",
        2,
        Duration::from_secs(30),
    );
    for node in [&a, &b] {
        let bench = run_one_layer_bench(dir, node.mp_port, node.http_port, 0, 2);
        assert!(bench.status.success(), "bench failed:\n{}", bench.output);
    }
    let long = Duration::from_secs(60);
    until_series(&base, "lmcache_tier_guard_usage_bytes > 0", 2, long);
    until_series(
        &base,
        "increase(lmcache_tier_gateway_requests_total[1m]) > 0",
        1,
        long,
    );
    until_series(
        &base,
        r#"lmcache_tier_housekeeping_deleted_objects_total{reason="other_model"} == 1"#,
        1,
        long,
    );

    // Node A's server, SIGKILLed: a restart.
    let wrapper = children_of(a.launch.pid())[0];
    kill(Pid::from_raw(wrapper), Signal::SIGKILL).unwrap();
    let restarted = format!(
        r#"lmcache_tier_server_restarts_total{{instance="127.0.0.1:{}"}} == 1"#,
        a.metrics_port
    );
    until_series(&base, &restarted, 1, Duration::from_secs(120));
    until_series(
        &base,
        "lmcache_tier_server_up == 1",
        2,
        Duration::from_secs(120),
    );

    for file in ["grafana/lmcache-node.json", "grafana/lmcache-fleet.json"] {
        for expr in dashboard_exprs(&deploy(file)) {
            until_series(&base, &expr, 1, Duration::from_secs(30));
        }
    }
    let rules = get_json(&format!("{base}/api/v1/rules")).unwrap();
    let loaded: Vec<&Value> = rules["data"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    let shipped = std::fs::read_to_string(deploy("prometheus/lmcache-node-alerts.yml"))
        .unwrap()
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert: "))
        .count();
    assert_eq!(loaded.len(), shipped, "{rules:#}");
    assert!(loaded.iter().all(|r| r["health"] == "ok"), "{rules:#}");

    stop_launch(&mut a.launch);
    stop_launch(&mut b.launch);
}

/// s3s-fs's key for the known workload.
const KEY_ID: &str = "AKIAE2EPROMHISTOGRAM";
const SECRET: &str = "e2e-prometheus-histogram-secret-0123456789";

/// Sends `GET /m%40absent` to the gateway on `host`, unsigned: it answers
/// 403 without asking the store.
fn unsigned_get(host: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    stream
        .write_all(
            format!("GET /m%40absent HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// A signed `PUT` through the gateway on `host` (with the per-launch
/// `key`) whose head announces 32 MiB, of which 1 MiB is sent, then
/// nothing: the gateway answers 400 `RequestTimeout` once the store has
/// waited [`lmcache_s3_gateway::UPSTREAM_SILENCE`] for the rest.
fn stalled_put(host: &str, key: &lmcache_s3_gateway::sigv4::KeyPair) -> String {
    use aws_credential_types::Credentials;
    use std::io::{Read, Write};
    let url = format!("http://{host}/m%40stalled");
    let credentials = Credentials::new(
        &key.access_key_id,
        &key.secret_access_key,
        None,
        None,
        "test",
    );
    let signature = lmcache_s3_gateway::sigv4::s3_signature(
        "PUT",
        &url,
        &[("host", host)],
        "UNSIGNED-PAYLOAD",
        &credentials,
        "us-east-1",
        std::time::SystemTime::now(),
    )
    .unwrap();
    let mut head = format!(
        "PUT /m%40stalled HTTP/1.1\r\nhost: {host}\r\ncontent-length: {}\r\n",
        32 << 20
    );
    for (name, value) in signature {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&vec![0x5a; 1 << 20]).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

#[test]
fn prometheus_reads_the_workloads_quantile_from_the_gateway_answer_histogram() {
    lmcache_tier_e2e::require_lmcache!();
    use lmcache_launcher::metrics::{MetricsEndpoint, NodeMetrics};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s3 = S3sFs::start(dir, free_port(), (KEY_ID, SECRET), &["kv-cache"]);
    let spec = serde_json::json!({"type": "s3", "s3_endpoint": format!("127.0.0.1:{}", s3.port),
        "s3_bucket": "kv-cache", "s3_region": "us-east-1", "disable_tls": true,
        "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET});
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let args = vec!["--l2-adapter".to_string(), spec.to_string()];
    let (args, gateways) = runtime
        .block_on(lmcache_s3_gateway::Gateways::start_args(
            &args,
            &|_| None,
            None,
        ))
        .unwrap();
    let local: Value = serde_json::from_str(&args[1]).unwrap();
    let host = local["s3_endpoint"].as_str().unwrap().to_string();
    let metrics = std::sync::Arc::new(NodeMetrics::new(None));
    metrics.watch_gateways(gateways.view());
    let endpoint = MetricsEndpoint::start("127.0.0.1:0".parse().unwrap(), "TEST", metrics).unwrap();

    // The known workload: 3 answers within 5 s (403s, the gateway's own)
    // and 1 between 5 s and 10 s (an upload its client stalled).
    for _ in 0..3 {
        let answer = unsigned_get(&host);
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    }
    let answer = stalled_put(&host, gateways.key().unwrap());
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");

    // The page a strict OpenMetrics parser takes, and Prometheus's
    // quantile of it: rank 0.9 x 4 = 3.6 falls in the (5, 10] bucket,
    // which holds the fourth answer: 5 + 5 x 0.6 = 8.
    let url = format!("http://{}/metrics", endpoint.address());
    let page = get_openmetrics(&url).expect("the page");
    assert!(
        strict_openmetrics(&page).is_ok(),
        "{:?}\n{page}",
        strict_openmetrics(&page)
    );
    let (_prometheus, base) = start_prometheus_on(dir, &[endpoint.address().port()], &[]);
    until_series(
        &base,
        "lmcache_tier_gateway_answer_duration_seconds_count == 4",
        1,
        Duration::from_secs(60),
    );
    let inf = query(
        &base,
        r#"lmcache_tier_gateway_answer_duration_seconds_bucket{le="+Inf"}"#,
    );
    assert_eq!(inf[0]["value"][1], "4", "{inf:?}");
    let p90 = query(
        &base,
        "histogram_quantile(0.9, lmcache_tier_gateway_answer_duration_seconds_bucket)",
    );
    let value: f64 = p90[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!((value - 8.0).abs() < 1e-9, "{p90:?}");
}
