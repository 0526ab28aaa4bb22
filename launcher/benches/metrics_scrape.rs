//! How long one scrape of the node's metrics takes with 4 tiers (target
//! <= 5 ms, `docs/performance.md`): 4 `fs` tiers, each with a running
//! capacity guard (its status file read at every scrape), and 4 `s3_bucket`
//! gateways (their counters read at every scrape), against a loopback
//! stand-in store that answers 200.
//!
//! Measured: `NodeMetrics::render` alone in both formats, and a whole HTTP
//! scrape of the endpoint (connect, request, render, answer) from a client
//! on the same host. Then the endpoint's bounds: rounds that alternate
//! between no other client and a flood of `FLOOD_IDLE` idle clients (from
//! 250 addresses of 127.0.0.0/8, each address another client, the oldest
//! replaced as new ones come) and `FLOOD_SLOW` slow ones (one per address,
//! pipelining requests and reading nothing), sent by a child process; each
//! round gives the scrape latency on a new connection, the connections the
//! endpoint holds, and the resident memory of the endpoint's process. Run: `cargo bench -p lmcache-launcher
//! --bench metrics_scrape` (`SCRAPES` changes the sample count, default
//! 1000; `ROUNDS` the rounds per side, default 3; `FLOOD_IDLE` and
//! `FLOOD_SLOW`, default 1000 and 48).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
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

/// A setting from the environment, else `default`.
fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A connection to `to` from 127.0.0.`host`.
fn connect_from(host: u8, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.bind(&SocketAddr::from(([127, 0, 0, host], 0)).into())?;
    socket.connect(&to.into())?;
    Ok(socket.into())
}

/// One scrape on a new connection from 127.0.0.1: how long it took, and
/// whether it was answered 200 (else refused).
fn scrape(to: SocketAddr) -> (Duration, bool, String) {
    let start = Instant::now();
    let mut stream = connect_from(1, to).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: b\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut page = String::new();
    let _ = stream.read_to_string(&mut page);
    (start.elapsed(), page.starts_with("HTTP/1.1 200"), page)
}

/// The value of `series` in `page`, 0 when absent.
fn value(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// This process's resident memory, in KiB (`VmRSS`).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Idle and slow clients of the endpoint at `to`, sent by a child process
/// (this bench run with `--flood`), connected until dropped.
struct Flood(std::process::Child);

impl Flood {
    fn start(to: SocketAddr, idle: usize, slow: usize) -> Flood {
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--flood",
                &to.to_string(),
                &idle.to_string(),
                &slow.to_string(),
            ])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        Flood(child)
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

/// The child of [`Flood`]: `idle` clients from 127.0.0.2-251, kept at that
/// count (each one the endpoint closed replaced), and `slow` ones from
/// 127.0.1.2 on, one per address, until its stdin closes.
fn flood(to: SocketAddr, idle: usize, slow: usize) {
    use std::sync::atomic::Ordering;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read(&mut [0u8; 1]);
        stop.store(true, Ordering::Relaxed);
    });
    let requests = b"GET /metrics HTTP/1.1\r\nhost: b\r\n\r\n".repeat(1000);
    let mut pipelining = Vec::new();
    for i in 0..slow {
        let from = SocketAddr::from(([127, 0, 1 + (i / 250) as u8, 2 + (i % 250) as u8], 0));
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        if socket.bind(&from.into()).is_ok() && socket.connect(&to.into()).is_ok() {
            let mut stream: TcpStream = socket.into();
            let _ = stream.set_nonblocking(true);
            let _ = stream.write(&requests);
            pipelining.push(stream);
        }
    }
    let mut waiting = std::collections::VecDeque::new();
    let mut next = 0usize;
    while !stopped.load(Ordering::Relaxed) {
        while waiting.len() < idle {
            if let Ok(stream) = connect_from(2 + (next % 250) as u8, to) {
                waiting.push_back(stream);
            }
            next += 1;
        }
        // The ones the endpoint closed (or refused) are replaced.
        waiting.retain(|s| !closed(s));
        for stream in &mut pipelining {
            let _ = stream.write(&requests);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether the endpoint closed `stream` or answered it (a refusal): a
/// peek finds something, or an end, instead of nothing yet.
fn closed(stream: &TcpStream) -> bool {
    let _ = stream.set_nonblocking(true);
    !matches!(stream.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    if let [_, flag, to, idle, slow] = args.as_slice() {
        if flag == "--flood" {
            flood(
                to.parse().unwrap(),
                idle.parse().unwrap(),
                slow.parse().unwrap(),
            );
            return;
        }
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
    let (_, gateways) = runtime
        .block_on(Gateways::start_args(&args, &|_| None, None))
        .unwrap();
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

    let rounds = setting("ROUNDS", 3);
    let (idle, slow) = (setting("FLOOD_IDLE", 1000), setting("FLOOD_SLOW", 48));
    let per_round = scrapes / 2;
    let address = endpoint.address();
    let connections = |page: &str, state: &str| {
        value(
            page,
            &format!("lmcache_tier_metrics_endpoint_connections{{state=\"{state}\"}}"),
        )
    };
    let rss_before = rss_kib();
    for round in 0..rounds * 2 {
        let flooded = round % 2 == 1;
        let flood = flooded.then(|| Flood::start(address, idle, slow));
        if flooded {
            // The flood in place: as many idle ones connected as it keeps.
            std::thread::sleep(Duration::from_secs(1));
        }
        let mut samples = Vec::new();
        let mut refused = 0;
        let mut last = String::new();
        for _ in 0..per_round {
            let (took, answered, page) = scrape(address);
            match answered {
                true => {
                    samples.push(took);
                    last = page;
                }
                false => refused += 1,
            }
        }
        let rss = rss_kib();
        drop(flood);
        let side = match flooded {
            true => format!("{idle} idle + {slow} slow clients"),
            false => "no other client".to_string(),
        };
        let evicted = value(
            &last,
            r#"lmcache_tier_metrics_endpoint_closed_connections_total{reason="evicted"}"#,
        );
        let refusals = value(
            &last,
            r#"lmcache_tier_metrics_endpoint_closed_connections_total{reason="refused"}"#,
        );
        println!(
            "round {} ({side}): scrape on a new connection {}; {refused} of {per_round} refused; held {} idle + {} answering (this scrape included); RSS {} KiB ({:+} KiB); evicted so far {evicted}, refused so far {refusals}",
            round / 2 + 1,
            if samples.is_empty() { "none answered".to_string() } else { summary(samples) },
            connections(&last, "idle"),
            connections(&last, "answering"),
            rss,
            rss as i64 - rss_before as i64,
        );
        // The flood's connections gone before the next round.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            let (_, answered, page) = scrape(address);
            if answered && connections(&page, "idle") + connections(&page, "answering") <= 1.0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    drop(guards);
}
