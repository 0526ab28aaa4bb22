//! End to end: a launch of the real LMCache 0.5.6 server serves the node's
//! metrics on its endpoint. A scrape during a CPU bench passes `promtool
//! check metrics` and a strict OpenMetrics parser, and shows the plan, the
//! server up, the capacity guard's usage and the housekeeping; a server
//! SIGKILLed by hand is counted as an exit by `signal` (the kernel recorded
//! no OOM kill) and a restart.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lmcache_tier_e2e::{
    binaries, children_of, free_port, get_openmetrics, get_text, promtool, run_bench, stop_launch,
    strict_openmetrics, wait_for_status, Binaries, Proc,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const BINS: Binaries = binaries!();

/// The value of the one sample of `series` (a name with its labels) in a
/// scrape, if it is there.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
}

/// Scrapes `url` until `done` holds for the scrape, or panics after `limit`
/// with the last scrape.
fn scrape_until(url: &str, limit: Duration, done: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let text = get_text(url).unwrap_or_default();
        if done(&text) {
            return text;
        }
        assert!(start.elapsed() < limit, "not within {limit:?}:\n{text}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `promtool check metrics` of `text`: its findings, empty when it has none.
fn promtool_findings(text: &str) -> String {
    let mut check = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut check.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = check.wait_with_output().unwrap();
    let findings =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{findings}"
    );
    findings
}

#[test]
fn a_launch_serves_its_metrics_and_counts_a_killed_server() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (mp_port, http_port, metrics_port) = (free_port(), free_port(), free_port());
    let cmd = launch_with_metrics(dir, (mp_port, http_port, metrics_port));
    let mut launch = Proc::spawn(cmd, &dir.join("launch.log"));
    let status_url = format!("http://127.0.0.1:{http_port}/status");
    let url = format!("http://127.0.0.1:{metrics_port}/metrics");
    wait_for_status(&status_url, &mut launch, Duration::from_secs(180));

    let bench = run_bench(dir, mp_port, http_port, 0, 2);
    assert!(bench.status.success(), "bench failed:\n{}", bench.output);
    let guarded = r#"lmcache_tier_guard_usage_bytes{tier="0"}"#;
    let text = scrape_until(&url, Duration::from_secs(30), |text| {
        sample(text, guarded).is_some_and(|usage| usage > 0.0)
    });
    assert_eq!(sample(&text, "lmcache_tier_server_up"), Some(1.0));
    assert_eq!(
        sample(&text, "lmcache_tier_plan_disk_capacity_bytes"),
        Some((2u64 << 30) as f64)
    );
    assert_eq!(
        sample(&text, r#"lmcache_tier_guard_capacity_bytes{tier="0"}"#),
        Some((2u64 << 30) as f64)
    );
    assert!(
        sample(
            &text,
            "lmcache_tier_housekeeping_last_run_timestamp_seconds"
        ) > Some(0.0)
    );
    assert!(sample(&text, "lmcache_tier_server_ready_seconds") > Some(0.0));
    let lag = sample(&text, r#"lmcache_tier_guard_event_lag_seconds{tier="0"}"#);
    assert!(lag.is_some_and(|s| (0.0..10.0).contains(&s)), "{text}");
    assert_eq!(
        sample(
            &text,
            r#"lmcache_tier_guard_inotify_overflows_total{tier="0"}"#
        ),
        Some(0.0)
    );
    // A scraper that does not ask for OpenMetrics (promtool, curl) gets
    // the Prometheus text format.
    let findings = promtool_findings(&text);
    assert!(findings.trim().is_empty(), "promtool findings:\n{findings}");
    // What Prometheus gets passes a strict OpenMetrics parser.
    let open = get_openmetrics(&url).expect("an OpenMetrics page");
    assert!(
        strict_openmetrics(&open).is_ok(),
        "{:?}\n{open}",
        strict_openmetrics(&open)
    );

    // The server's wrapper, SIGKILLed by hand: the kernel counts no OOM
    // kill, so the exit's cause is `signal`.
    let wrapper = children_of(launch.pid())[0];
    kill(Pid::from_raw(wrapper), Signal::SIGKILL).unwrap();
    let text = scrape_until(&url, Duration::from_secs(120), |text| {
        sample(text, "lmcache_tier_server_restarts_total") == Some(1.0)
            && sample(text, "lmcache_tier_server_up") == Some(1.0)
    });
    assert_eq!(
        sample(&text, r#"lmcache_tier_server_exits_total{cause="signal"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, "lmcache_tier_server_starts_total"), Some(2.0));

    // `inspect` shows the same figures, read from the endpoint.
    let report = BINS.inspect_json(dir, http_port, metrics_port);
    let seen = &report["launch"];
    assert_eq!(seen["state"], "read", "{report:#}");
    assert_eq!(seen["figures"]["starts"], 2, "{seen:#}");
    assert_eq!(seen["figures"]["restarts"], 1, "{seen:#}");
    assert_eq!(seen["figures"]["exits"]["signal"], 1, "{seen:#}");
    assert_eq!(seen["figures"]["exits"]["oom_kill"], 0, "{seen:#}");
    stop_launch(&mut launch);
    assert!(get_text(&url).is_none(), "the endpoint outlived the launch");
}

/// `erebine-lmcache server` on the given ports with a guarded `fs` tier in
/// `dir`, its metrics endpoint on `metrics_port` when one is given.
fn drop_in(dir: &Path, mp_port: u16, http_port: u16, metrics_port: Option<u16>) -> Command {
    let spec = format!(
        r#"{{"type":"fs","base_path":"{}","max_capacity_gb":1}}"#,
        dir.join("fs-tier").display()
    );
    let mut cmd = Command::new(BINS.erebine_lmcache());
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .env("VIRTUAL_ENV", lmcache_tier_e2e::lmcache_venv())
        .env("LMCACHE_TRACK_USAGE", "false")
        .args(["server", "--host", "127.0.0.1", "--port"])
        .arg(mp_port.to_string())
        .args(["--http-host", "127.0.0.1", "--http-port"])
        .arg(http_port.to_string())
        .args(["--l1-size-gb", "1", "--eviction-policy", "LRU"])
        .args(["--chunk-size", "256", "--l2-adapter", &spec]);
    if let Some(port) = metrics_port {
        cmd.env("EREBINE_AGENT_LMCACHE_METRICS_PORT", port.to_string());
    }
    cmd
}

/// `erebine-lmcache server` run alone (the image entrypoint) serves the
/// families it knows: its capacity guards, its gateways and its server.
#[test]
fn erebine_lmcache_server_alone_serves_its_guards_and_server() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (mp_port, http_port, metrics_port) = (free_port(), free_port(), free_port());
    let cmd = drop_in(dir, mp_port, http_port, Some(metrics_port));
    let mut server = Proc::spawn(cmd, &dir.join("server.log"));
    let status_url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_status(&status_url, &mut server, Duration::from_secs(180));
    let url = format!("http://127.0.0.1:{metrics_port}/metrics");
    let text = scrape_until(&url, Duration::from_secs(30), |text| {
        sample(text, r#"lmcache_tier_guard_capacity_bytes{tier="0"}"#).is_some()
            && sample(text, "lmcache_tier_server_up") == Some(1.0)
    });
    assert_eq!(
        sample(&text, r#"lmcache_tier_guard_capacity_bytes{tier="0"}"#),
        Some((1u64 << 30) as f64)
    );
    assert!(
        !text.contains("lmcache_tier_plan_"),
        "no plan here:\n{text}"
    );
    let findings = promtool_findings(&text);
    assert!(findings.trim().is_empty(), "promtool findings:\n{findings}");
    let open = get_openmetrics(&url).expect("an OpenMetrics page");
    assert!(
        strict_openmetrics(&open).is_ok(),
        "{:?}\n{open}",
        strict_openmetrics(&open)
    );
    server.signal(Signal::SIGTERM);
    server
        .wait_timeout(Duration::from_secs(60))
        .expect("SIGTERM stops erebine-lmcache");
    assert!(get_text(&url).is_none(), "the endpoint outlived the server");
}

/// The drop-in listens on no port of its own unless asked: with the
/// launch's default metrics port taken (by this test, or by a node that
/// runs here), it starts as the stock server does.
#[test]
fn erebine_lmcache_server_alone_takes_no_metrics_port_unless_asked() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Held for the test; if something else holds it, it is taken anyway.
    let _taken = std::net::TcpListener::bind(("127.0.0.1", 8091));
    let (mp_port, http_port) = (free_port(), free_port());
    let mut server = Proc::spawn(
        drop_in(dir, mp_port, http_port, None),
        &dir.join("server.log"),
    );
    let status_url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_status(&status_url, &mut server, Duration::from_secs(180));
    let log = server.output();
    assert!(!log.contains("metrics on"), "{log}");
    server.signal(Signal::SIGTERM);
    server
        .wait_timeout(Duration::from_secs(60))
        .expect("SIGTERM stops erebine-lmcache");
}

/// Descriptors `pid` has open now.
fn open_descriptors(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| fds.count())
        .unwrap_or(0)
}

/// Connects to 127.0.0.1:`port` from the loopback address 127.0.0.`host`
/// (any of 127.0.0.0/8 is this host's: each is another client).
fn connect_from(host: u8, port: u16) -> std::io::Result<std::net::TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.bind(&std::net::SocketAddr::from(([127, 0, 0, host], 0)).into())?;
    socket.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())?;
    Ok(socket.into())
}

/// Clients that keep the endpoint on `port` full until dropped: 600 idle
/// connections from 200 addresses at any time, the oldest replaced every
/// second, and 8 from one address that pipeline requests and read nothing.
struct Flood {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    fn start(port: u16) -> Flood {
        use std::io::Write;
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let request = b"GET /metrics HTTP/1.1\r\nhost: t\r\n\r\n".repeat(1000);
            let mut pipelined = Vec::new();
            for _ in 0..8 {
                if let Ok(mut stream) = connect_from(250, port) {
                    let _ = stream.set_nonblocking(true);
                    let _ = stream.write(&request);
                    pipelined.push(stream);
                }
            }
            let mut idle = std::collections::VecDeque::new();
            let mut next = 0u32;
            while !stopped.load(Ordering::Relaxed) {
                for _ in 0..200 {
                    let host = 2 + (next % 200) as u8;
                    next += 1;
                    if let Ok(stream) = connect_from(host, port) {
                        idle.push_back(stream);
                    }
                }
                while idle.len() > 600 {
                    idle.pop_front();
                }
                for stream in &mut pipelined {
                    let _ = stream.write(&request);
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        Flood {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A launch whose process may open 512 descriptors, its endpoint flooded
/// by more clients than that: it holds no more connections than its bound,
/// so a restart of the server (which needs descriptors for its port check,
/// its pipes and its `/status` polls) goes through, and a scrape is
/// answered throughout.
#[test]
fn a_flooded_endpoint_takes_no_descriptor_the_launch_needs() {
    lmcache_tier_e2e::require_lmcache!();
    use std::os::unix::process::CommandExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (mp_port, http_port, metrics_port) = (free_port(), free_port(), free_port());
    let mut cmd = launch_with_metrics(dir, (mp_port, http_port, metrics_port));
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 512, 512)
                .map_err(std::io::Error::from)
        });
    }
    let mut launch = Proc::spawn(cmd, &dir.join("launch.log"));
    let status_url = format!("http://127.0.0.1:{http_port}/status");
    let url = format!("http://127.0.0.1:{metrics_port}/metrics");
    wait_for_status(&status_url, &mut launch, Duration::from_secs(180));
    scrape_until(&url, Duration::from_secs(30), |text| {
        sample(text, "lmcache_tier_server_up") == Some(1.0)
    });
    let before = open_descriptors(launch.pid());

    let flood = Flood::start(metrics_port);
    let full = scrape_until(&url, Duration::from_secs(60), |text| {
        sample(
            text,
            r#"lmcache_tier_metrics_endpoint_closed_connections_total{reason="evicted"}"#,
        ) > Some(600.0)
    });
    let held = open_descriptors(launch.pid());
    assert!(
        held <= before + 64 + 1,
        "{held} descriptors open, {before} before the flood:\n{full}"
    );
    let connections: f64 = ["idle", "answering"]
        .iter()
        .filter_map(|state| {
            sample(
                &full,
                &format!("lmcache_tier_metrics_endpoint_connections{{state=\"{state}\"}}"),
            )
        })
        .sum();
    assert!(connections <= 64.0, "{full}");

    // The server's wrapper, SIGKILLed while the flood goes on: the launch
    // starts it again.
    let wrapper = children_of(launch.pid())[0];
    kill(Pid::from_raw(wrapper), Signal::SIGKILL).unwrap();
    let text = scrape_until(&url, Duration::from_secs(180), |text| {
        sample(text, "lmcache_tier_server_restarts_total") == Some(1.0)
            && sample(text, "lmcache_tier_server_up") == Some(1.0)
    });
    let held = open_descriptors(launch.pid());
    assert!(
        held <= before + 64 + 1,
        "{held} descriptors, {before} before:\n{text}"
    );
    drop(flood);
    stop_launch(&mut launch);
    let log = launch.output();
    assert!(!log.contains("Too many open files"), "{log}");
}

/// `lmcache-tier launch` for the node in `dir` on the ports (ZMQ, HTTP,
/// metrics), with a 2 GiB built-in tier and a server run of a second or
/// more counted as no fast failure (`--fast-failure-window 1`), so that a
/// killed server is restarted, however often.
fn launch_with_metrics(dir: &std::path::Path, (mp, http, metrics): (u16, u16, u16)) -> Command {
    let mut cmd = BINS.launch_command(dir, mp, http, &[]);
    cmd.env("EREBINE_AGENT_LMCACHE_METRICS_PORT", metrics.to_string())
        .env("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "2")
        .args(["--fast-failure-window", "1"]);
    cmd
}
