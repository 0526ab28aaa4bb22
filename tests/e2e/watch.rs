//! End to end: `lmcache-tier launch` watches the real LMCache 0.5.6 server.
//! A CPU bench worker that finishes and unregisters is reported detached,
//! never lost; another attaches and `inspect` shows it; it is SIGKILLed and,
//! once LMCache reaps it, the watcher reports it lost; the
//! server is SIGKILLed by hand and `launch` reports the exit, saying that
//! the kernel recorded no OOM kill, and starts it again; SIGTERM leaves
//! nothing behind.
//! A server that fails at every restart makes `launch` give up after three
//! fast failures (exit 5), quoting its last lines.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lmcache_tier_e2e::{
    bench_command, binaries, free_port, get_json, lmcache_venv, processes_mentioning, run_bench,
    stop_launch, wait_for_ready_launch, wait_for_status, wait_until, Binaries, Proc,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const BINS: Binaries = binaries!();

/// Both reap flags at 30 s, the least LMCache accepts: the bench client
/// sends no PING, so it is reaped after the registration grace.
const REAP_FLAGS: [&str; 4] = [
    "--server-arg=--worker-reap-timeout-seconds",
    "--server-arg=30",
    "--server-arg=--worker-registration-grace-seconds",
    "--server-arg=30",
];

/// The watcher's poll interval and request timeout (`WatchConfig` defaults).
const POLL: Duration = Duration::from_secs(2);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

fn tracked(url: &str) -> Option<u64> {
    get_json(url)?["worker_liveness"]["tracked_instances"].as_u64()
}

/// `lmcache-tier inspect --url <url>` for the node whose disk tier is `cache`.
fn inspect(url: &str, cache: &Path, json: bool) -> (Option<i32>, String) {
    let mut cmd = Command::new(BINS.lmcache_tier());
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("EREBINE_AGENT_LMCACHE_DISK_PATH", cache)
        .args(["inspect", "--url", url]);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().expect("inspect runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Pids of the real `lmcache server` processes (not the erebine-lmcache
/// wrapper) started for the node in `dir`.
fn real_servers(dir: &str) -> Vec<i32> {
    let stock = format!("{}/bin/lmcache server", lmcache_venv().display());
    processes_mentioning(dir)
        .into_iter()
        .filter(|(_, cmd)| cmd.contains(&stock))
        .filter(|(_, cmd)| {
            !cmd.split_whitespace()
                .next()
                .unwrap_or_default()
                .ends_with("erebine-lmcache")
        })
        .map(|(pid, _)| pid)
        .collect()
}

#[test]
fn launch_reports_lost_workers_and_restarts_a_killed_server() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dir_text = dir.display().to_string();
    let cache = dir.join("cache");
    let (mp_port, http_port) = (free_port(), free_port());
    let mut flags = vec!["--lmcache-disk-size-gb", "2"];
    flags.extend(REAP_FLAGS);
    let mut launch = Proc::spawn(
        BINS.launch_command(dir, mp_port, http_port, &flags),
        &dir.join("launch.log"),
    );
    let url = format!("http://127.0.0.1:{http_port}/status");
    let status = wait_for_status(&url, &mut launch, Duration::from_secs(180));
    assert_eq!(
        status["worker_liveness"]["registration_grace_seconds"],
        30.0
    );

    // A bench worker that finishes unregisters: a clean detach, not a loss.
    let short = run_bench(dir, mp_port, http_port, 0, 3);
    assert!(short.status.success(), "{}", short.output);
    assert!(
        short.output.contains("UNREGISTER_KV_CACHE: OK"),
        "{}",
        short.output
    );
    let detached_at = Instant::now();
    assert!(
        wait_until(3 * (POLL + REQUEST_TIMEOUT), || launch
            .output()
            .contains("engine workers detached: 1 -> 0 (unregistered cleanly)")),
        "no WorkersDetached within three polls of the bench's exit:\n{}",
        launch.output()
    );
    eprintln!(
        "clean detach reported {:?} after the bench exited",
        detached_at.elapsed()
    );
    let log = launch.output();
    assert!(!log.contains("engine workers lost"), "{log}");
    let detach = log.lines().find(|l| l.contains("engine workers detached"));
    assert!(
        detach.is_some_and(|l| l.contains(" INFO ")),
        "a clean detach is news, not a warning: {detach:?}"
    );

    // Attach one CPU bench worker that keeps running (a long --end).
    let bench_cmd = bench_command(mp_port, http_port, 0, 100_000, "2");
    let mut bench = Proc::spawn(bench_cmd, &dir.join("bench.log"));
    assert!(
        wait_until(Duration::from_secs(120), || tracked(&url) == Some(1)),
        "the bench worker never attached:\n{}",
        bench.output()
    );
    assert!(
        wait_until(Duration::from_secs(10), || launch
            .output()
            .matches("engine workers attached: 1")
            .count()
            == 2),
        "{}",
        launch.output()
    );

    let (code, text) = inspect(&url, &cache, true);
    assert_eq!(code, Some(0), "{text}");
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(report["server"]["healthy"], true, "{report:#}");
    assert_eq!(report["worker_liveness"]["tracked_instances"], 1);
    assert_eq!(report["tiers"][0]["type"], "FSNativeL2Adapter");
    assert_eq!(
        report["tiers"][0]["location"],
        dir.join("cache").display().to_string()
    );
    assert_eq!(report["tiers"][0]["capacity_bytes"], 2u64 << 30);
    assert_eq!(report["disk"][0]["manifest"], "found");
    assert_eq!(report["disk"][0]["identity"]["model"], "test-model");
    let (code, text) = inspect(&url, &cache, false);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("1 tracked") && text.contains("FSNativeL2Adapter"),
        "{text}"
    );

    // SIGKILL the worker: LMCache reaps it after the 30 s grace, and the
    // watcher reports it within two polls of that.
    bench.signal(Signal::SIGKILL);
    assert!(bench.wait_timeout(Duration::from_secs(10)).is_some());
    assert!(
        wait_until(Duration::from_secs(120), || tracked(&url) == Some(0)),
        "LMCache never reaped the killed worker"
    );
    let reaped_seen = Instant::now();
    assert!(
        wait_until(2 * (POLL + REQUEST_TIMEOUT), || launch
            .output()
            .contains("engine workers lost: 1 -> 0: LMCache reaped them")),
        "no WorkersLost within two polls of the reap ({:?} later):\n{}",
        reaped_seen.elapsed(),
        launch.output()
    );

    // SIGKILL the real server by hand: the kernel counts no OOM kill.
    let servers = real_servers(&dir_text);
    assert!(!servers.is_empty(), "{:?}", processes_mentioning(&dir_text));
    for pid in &servers {
        kill(Pid::from_raw(*pid), Signal::SIGKILL).unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(30), || launch
            .output()
            .contains("the kernel recorded no OOM kill")),
        "no Exited event with the hint that no OOM kill was recorded:\n{}",
        launch.output()
    );
    let log = launch.output();
    assert!(log.contains("signal SIGKILL"), "{log}");
    assert!(log.contains("restarting it in"), "{log}");
    assert!(
        wait_until(Duration::from_secs(180), || launch
            .output()
            .matches("LMCache server ready in")
            .count()
            == 2),
        "the server was not restarted:\n{}",
        launch.output()
    );
    assert!(get_json(&url).is_some());
    let restarted = real_servers(&dir_text);
    assert!(
        !restarted.is_empty() && restarted.iter().all(|p| !servers.contains(p)),
        "old {servers:?}, now {restarted:?}"
    );

    stop_launch(&mut launch);
    std::thread::sleep(Duration::from_millis(500));
    let left = processes_mentioning(&dir_text);
    assert!(left.is_empty(), "processes left after SIGTERM: {left:?}");
    let (code, text) = inspect(&url, &cache, false);
    assert_eq!(code, Some(8), "{text}");
    assert!(
        text.contains("UNREACHABLE") && text.contains("model test-model"),
        "{text}"
    );
}

/// A server that keeps failing right after each restart: the first start
/// becomes ready; then its `fs` tier directory is replaced by a file and the
/// server is SIGKILLed, and every restart of the real server dies at start
/// (`FileExistsError` creating `base_path`, exit 3). `launch` gives up after
/// the third fast failure in a row with exit 5, quoting the server's last
/// lines, and leaves nothing running.
#[test]
fn launch_gives_up_after_three_fast_failures_quoting_the_servers_last_lines() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dir_text = dir.display().to_string();
    let tier = dir.join("fs-tier");
    let (mp_port, http_port) = (free_port(), free_port());
    // A window far above any start-up time here, so every run counts as
    // fast however loaded the machine is; restarts at once.
    let flags = ["--restart-backoff", "0", "--fast-failure-window", "1800"];
    let mut cmd = BINS.launch_command(dir, mp_port, http_port, &flags);
    cmd.env(
        "EREBINE_AGENT_LMCACHE_L2_ADAPTER",
        serde_json::json!({"type": "fs", "base_path": tier}).to_string(),
    );
    let mut launch = Proc::spawn(cmd, &dir.join("launch.log"));
    let url = format!("http://127.0.0.1:{http_port}/status");
    // Only a server `launch` itself saw ready is restarted.
    wait_for_ready_launch(&url, &mut launch);

    std::fs::remove_dir_all(&tier).unwrap();
    std::fs::write(&tier, "not a directory").unwrap();
    let servers = real_servers(&dir_text);
    assert!(!servers.is_empty(), "{:?}", processes_mentioning(&dir_text));
    for pid in &servers {
        kill(Pid::from_raw(*pid), Signal::SIGKILL).unwrap();
    }

    let status = launch
        .wait_timeout(Duration::from_secs(600))
        .unwrap_or_else(|| panic!("launch still running:\n{}", launch.output()));
    let log = launch.output();
    assert_eq!(status.code(), Some(5), "{log}");
    assert_eq!(
        log.matches("LMCache server started; waiting for").count(),
        3,
        "{log}"
    );
    let error = log
        .split("the LMCache server failed 3 times in a row")
        .nth(1)
        .unwrap_or_else(|| panic!("no give-up error:\n{log}"));
    for line in [
        "FileExistsError: [Errno 17] File exists",
        "Application startup failed",
    ] {
        assert!(error.contains(line), "{line:?} not quoted:\n{error}");
    }
    std::thread::sleep(Duration::from_millis(500));
    let left = processes_mentioning(&dir_text);
    assert!(left.is_empty(), "processes left after giving up: {left:?}");
}
