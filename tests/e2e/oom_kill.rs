//! End to end: a real OOM kill is counted as one. The launch runs in a
//! fresh cgroup v1 memory cgroup of its own, made below this test's memory
//! cgroup (and removed at the end, also when the test fails). Once the real
//! LMCache 0.5.6 server is ready, the Python server gets `oom_score_adj`
//! 1000, the cgroup's limit is lowered to a little above its usage, and a
//! bounded memory hog (300 MiB, then it exits) runs in the same cgroup: the
//! kernel OOM-kills the server. The launch reads the cgroup's
//! `memory.oom_control` at the spawn and after the exit, so the exit's cause
//! is `oom_kill` in the metrics and the log's hint names the file and the
//! counts; the server is then started again.
//!
//! Needs root and a cgroup v1 memory controller (this test's machine: v1,
//! on a hybrid host); elsewhere it says why and returns. The cgroup v2
//! reading is unit-tested on recorded bodies (`launcher/src/status/oom.rs`).

use std::process::Command;
use std::time::{Duration, Instant};

use lmcache_launcher::status::oom::oom_kill_count;
use lmcache_tier_e2e::{
    binaries, free_port, get_text, listeners_of, lmcache_venv, stop_launch, wait_for_ready_launch,
    wait_until, Binaries, MemoryCgroup, Proc,
};

const BINS: Binaries = binaries!();

/// The kernel's count of OOM kills in `cgroup`.
fn oom_kills(cgroup: &MemoryCgroup) -> u64 {
    oom_kill_count(&cgroup.read("memory.oom_control")).expect("an oom_kill line (Linux 4.13+)")
}

#[test]
fn a_server_the_kernel_oom_kills_is_counted_as_an_oom_kill() {
    lmcache_tier_e2e::require_lmcache!();
    let cgroup = match MemoryCgroup::make("oom-test") {
        Ok(cgroup) => cgroup,
        Err(why) => {
            eprintln!("skipped the OOM kill test: {why}");
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (mp_port, http_port, metrics_port) = (free_port(), free_port(), free_port());
    // Time to give the cgroup its room back before the restart.
    let mut cmd = BINS.launch_command(dir, mp_port, http_port, &["--restart-backoff", "5"]);
    cmd.env(
        "EREBINE_AGENT_LMCACHE_METRICS_PORT",
        metrics_port.to_string(),
    );
    cgroup.enter(&mut cmd);
    let mut launch = Proc::spawn(cmd, &dir.join("launch.log"));
    let url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_ready_launch(&url, &mut launch);
    let servers = listeners_of(http_port);
    let members = cgroup.members();
    assert!(
        !servers.is_empty() && servers.iter().all(|p| members.contains(p)),
        "the server {servers:?} is not in the cgroup: {members:?}"
    );

    // The OOM killer's victim is the server: the highest oom_score_adj.
    // The launch is made unkillable where this process may lower a score
    // (CAP_SYS_RESOURCE); without it the launch keeps 0, and its few MiB
    // leave the server the victim all the same.
    for pid in &servers {
        std::fs::write(format!("/proc/{pid}/oom_score_adj"), "1000").unwrap();
    }
    let _ = std::fs::write(format!("/proc/{}/oom_score_adj", launch.pid()), "-1000");
    let before = oom_kills(&cgroup);
    let usage = cgroup.bytes("memory.usage_in_bytes");
    let limit = usage + (32 << 20);
    // No swapping instead of the OOM kill, where the host swaps.
    let _ = cgroup.write("memory.swappiness", "0");
    cgroup
        .write("memory.limit_in_bytes", &limit.to_string())
        .unwrap();
    let _ = cgroup.write("memory.memsw.limit_in_bytes", &limit.to_string());

    let mut hog = Command::new(lmcache_venv().join("bin/python"));
    hog.args(["-c", "b = b'x' * (300 << 20)"]);
    cgroup.enter(&mut hog);
    let hog_started = Instant::now();
    let hog_status = hog.status().expect("the memory hog runs");
    let hog_ran = hog_started.elapsed();
    let _ = cgroup.write("memory.memsw.limit_in_bytes", "-1");
    cgroup.write("memory.limit_in_bytes", "-1").unwrap();
    let after = oom_kills(&cgroup);
    assert!(
        after > before,
        "the kernel OOM-killed nothing (oom_kill {before} -> {after}; usage {usage}, limit {limit}, hog {hog_status})"
    );

    let hint = "killed by SIGKILL, and the kernel OOM-killed it: oom_kill in";
    assert!(
        wait_until(Duration::from_secs(30), || launch.output().contains(hint)),
        "no OOM kill in the log:\n{}",
        launch.output()
    );
    let oom_seen = hog_started.elapsed();
    let log = launch.output();
    let line = log.lines().find(|l| l.contains(hint)).unwrap();
    let file = cgroup.path("memory.oom_control").display().to_string();
    assert!(
        line.contains(&format!("{file} rose from {before} to ")),
        "{line}"
    );
    let metrics = get_text(&format!("http://127.0.0.1:{metrics_port}/metrics")).unwrap();
    for series in [
        r#"lmcache_tier_server_exits_total{cause="oom_kill"} 1"#,
        r#"lmcache_tier_server_exits_total{cause="signal"} 0"#,
    ] {
        assert!(metrics.lines().any(|l| l == series), "{series}\n{metrics}");
    }
    assert!(
        wait_until(Duration::from_secs(240), || launch
            .output()
            .matches("LMCache server ready in")
            .count()
            == 2),
        "the server was not started again:\n{}",
        launch.output()
    );
    eprintln!(
        "cgroup usage {:.0} MiB, limit {:.0} MiB; the hog ran {hog_ran:?} ({hog_status}); the OOM kill was in the log {oom_seen:?} after the hog started; ready again {:?} after it",
        usage as f64 / (1 << 20) as f64,
        limit as f64 / (1 << 20) as f64,
        hog_started.elapsed()
    );
    stop_launch(&mut launch);
}
