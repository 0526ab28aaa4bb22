//! End to end: a restart that loses the engine's workers. A CPU bench worker
//! is attached to the real LMCache 0.5.6 server when the Python server (the
//! process that listens on the HTTP port, not the `erebine-lmcache` wrapper)
//! is SIGKILLed by hand. `launch` restarts it; LMCache's workers do not
//! register with a new server, so once the reap grace after the restart's
//! Ready has passed (the reap timeout, 30 s here) the launch says
//! `WorkersLost` with the cause `server_restarted`, at WARN, in the metrics
//! and in `inspect`; the exit's cause is `signal`, never `oom_kill`, since
//! the kernel recorded no OOM kill.

use std::time::{Duration, Instant, SystemTime};

use lmcache_tier_e2e::{
    bench_command, binaries, children_of, free_port, get_json, get_text, listeners_of, stop_launch,
    wait_for_status, wait_until, Binaries, Proc,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const BINS: Binaries = binaries!();

/// Both reap flags at 30 s, the least LMCache accepts: the reap grace of
/// the restart is then 30 s.
const REAP_FLAGS: [&str; 4] = [
    "--server-arg=--worker-reap-timeout-seconds",
    "--server-arg=30",
    "--server-arg=--worker-registration-grace-seconds",
    "--server-arg=30",
];

const LOST_LINE: &str = "engine workers lost: 1 -> 0: they did not register with the restarted server within the reap grace";

/// The time stamp that starts a log line of the launch (RFC 3339, UTC).
fn stamp(line: &str) -> SystemTime {
    let text = line.split_whitespace().next().unwrap_or_default();
    humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// The value of `series` (a name with its labels) in a scrape.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

#[test]
fn workers_a_restart_loses_are_reported_and_a_hand_sent_sigkill_is_a_signal() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (mp_port, http_port, metrics_port) = (free_port(), free_port(), free_port());
    let mut cmd = BINS.launch_command(dir, mp_port, http_port, &REAP_FLAGS);
    cmd.env(
        "EREBINE_AGENT_LMCACHE_METRICS_PORT",
        metrics_port.to_string(),
    );
    let mut launch = Proc::spawn(cmd, &dir.join("launch.log"));
    let url = format!("http://127.0.0.1:{http_port}/status");
    let metrics = format!("http://127.0.0.1:{metrics_port}/metrics");
    wait_for_status(&url, &mut launch, Duration::from_secs(180));

    let mut bench = Proc::spawn(
        bench_command(mp_port, http_port, 0, 100_000, "2"),
        &dir.join("bench.log"),
    );
    assert!(
        wait_until(Duration::from_secs(180), || launch
            .output()
            .contains("engine workers attached: 1")),
        "the bench worker never attached:\n{}\n{}",
        launch.output(),
        bench.output()
    );

    let wrapper = children_of(launch.pid());
    let servers = listeners_of(http_port);
    assert!(!servers.is_empty(), "nothing listens on {http_port}");
    assert!(
        servers.iter().all(|p| !wrapper.contains(p)),
        "the wrapper {wrapper:?} holds the port: {servers:?}"
    );
    for pid in &servers {
        kill(Pid::from_raw(*pid), Signal::SIGKILL).unwrap();
    }
    let killed = Instant::now();
    assert!(
        wait_until(Duration::from_secs(240), || launch
            .output()
            .matches("LMCache server ready in")
            .count()
            == 2),
        "the server was not restarted:\n{}",
        launch.output()
    );
    let ready_again = killed.elapsed();
    assert!(
        wait_until(Duration::from_secs(90), || launch
            .output()
            .contains(LOST_LINE)),
        "no WorkersLost after the restart:\n{}",
        launch.output()
    );
    let lost = killed.elapsed();
    let log = launch.output();
    let ready_line = log
        .lines()
        .filter(|l| l.contains("LMCache server ready in"))
        .nth(1)
        .unwrap();
    let lost_line = log.lines().find(|l| l.contains(LOST_LINE)).unwrap();
    let after_ready = stamp(lost_line).duration_since(stamp(ready_line)).unwrap();
    eprintln!(
        "server SIGKILLed; ready again {ready_again:?} later; WorkersLost {lost:?} after the kill, {after_ready:?} after the restarted server was ready"
    );
    assert!(lost_line.contains(" WARN "), "{lost_line}");
    assert!(
        after_ready >= Duration::from_secs(29),
        "reported before the 30 s reap grace had passed: {after_ready:?}\n{log}"
    );
    assert!(
        log.contains("(signal SIGKILL)") && log.contains("the kernel recorded no OOM kill"),
        "{log}"
    );
    assert!(!log.contains("OOM-killed it"), "{log}");
    // The bench worker runs on, but never registers with the new server.
    assert!(bench.try_status().is_none(), "{}", bench.output());
    assert_eq!(
        get_json(&url).unwrap()["worker_liveness"]["tracked_instances"],
        0
    );

    let text = get_text(&metrics).expect("the launch's metrics answer");
    for (series, value) in [
        (r#"lmcache_tier_server_exits_total{cause="signal"}"#, 1.0),
        (r#"lmcache_tier_server_exits_total{cause="oom_kill"}"#, 0.0),
        (
            r#"lmcache_tier_engine_workers_lost_total{cause="server_restarted"}"#,
            1.0,
        ),
        (
            r#"lmcache_tier_engine_workers_lost_total{cause="reaped"}"#,
            0.0,
        ),
        ("lmcache_tier_server_restarts_total", 1.0),
    ] {
        assert_eq!(sample(&text, series), Some(value), "{series}\n{text}");
    }
    let report = BINS.inspect_json(dir, http_port, metrics_port);
    let figures = &report["launch"]["figures"];
    assert_eq!(figures["workers_lost"], 1, "{report:#}");
    assert_eq!(
        figures["workers_lost_by_cause"]["server_restarted"], 1,
        "{report:#}"
    );
    assert_eq!(figures["exits"]["signal"], 1, "{report:#}");

    bench.signal(Signal::SIGKILL);
    stop_launch(&mut launch);
}
