//! End to end: a frozen server is restarted. The real LMCache 0.5.6 Python
//! server (the process that listens on the HTTP port) is stopped with
//! SIGSTOP and never continued by the test; with `--unresponsive-timeout 5`
//! the launch stops it (SIGTERM and SIGCONT, so the stopped process acts
//! on the SIGTERM), says so at WARN, counts the exit as `unresponsive`, and
//! starts it again under the restart policy until it is ready.

use std::time::{Duration, Instant};

use lmcache_tier_e2e::{
    binaries, free_port, get_json, get_text, listeners_of, processes_mentioning, stop_launch,
    wait_for_ready_launch, wait_until, Binaries, Proc,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const BINS: Binaries = binaries!();

/// Whether `pid` is gone or a zombie (it ended).
fn ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat[stat.rfind(')').unwrap_or(0) + 2..].starts_with('Z'),
    }
}

#[test]
fn a_server_stopped_by_sigstop_is_restarted_after_the_unresponsive_timeout() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dir_text = dir.display().to_string();
    let (mp_port, http_port, metrics_port) = (free_port(), free_port(), free_port());
    let mut cmd = BINS.launch_command(dir, mp_port, http_port, &["--unresponsive-timeout", "5"]);
    cmd.env(
        "EREBINE_AGENT_LMCACHE_METRICS_PORT",
        metrics_port.to_string(),
    );
    let mut launch = Proc::spawn(cmd, &dir.join("launch.log"));
    let url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_ready_launch(&url, &mut launch);

    let frozen = listeners_of(http_port);
    assert!(!frozen.is_empty(), "nothing listens on {http_port}");
    for pid in &frozen {
        kill(Pid::from_raw(*pid), Signal::SIGSTOP).unwrap();
    }
    let stopped = Instant::now();
    assert!(
        wait_until(Duration::from_secs(60), || launch
            .output()
            .contains("has given no HTTP answer for")),
        "the frozen server was not stopped:\n{}",
        launch.output()
    );
    let noticed = stopped.elapsed();
    assert!(
        wait_until(Duration::from_secs(240), || launch
            .output()
            .matches("LMCache server ready in")
            .count()
            == 2),
        "the server was not started again:\n{}",
        launch.output()
    );
    let ready_again = stopped.elapsed();
    eprintln!("SIGSTOP; the launch stopped the server {noticed:?} later; ready again after {ready_again:?}");
    let log = launch.output();
    let warning = log
        .lines()
        .find(|l| l.contains("has given no HTTP answer for"))
        .unwrap();
    assert!(
        warning.contains(" WARN ") && warning.contains("over the 5s"),
        "{warning}"
    );
    assert!(
        log.contains("server exited") && log.contains("stopped by the launch: no HTTP answer for"),
        "{log}"
    );
    assert!(
        frozen.iter().all(|pid| ended(*pid)),
        "the frozen server still runs: {frozen:?}"
    );
    assert!(get_json(&url).is_some());
    let restarted = listeners_of(http_port);
    assert!(
        !restarted.is_empty() && restarted.iter().all(|p| !frozen.contains(p)),
        "old {frozen:?}, now {restarted:?}"
    );
    let metrics = get_text(&format!("http://127.0.0.1:{metrics_port}/metrics")).unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l == r#"lmcache_tier_server_exits_total{cause="unresponsive"} 1"#),
        "{metrics}"
    );

    stop_launch(&mut launch);
    std::thread::sleep(Duration::from_millis(500));
    let left = processes_mentioning(&dir_text);
    assert!(left.is_empty(), "processes left after SIGTERM: {left:?}");
}
