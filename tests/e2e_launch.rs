//! End to end: `lmcache-tier launch` runs the real LMCache 0.5.6 server with
//! the built-in fs_native disk tier sized from the volume, and real KV traffic
//! from `lmcache bench server --mode cpu` lands in it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lmcache_tier_e2e::{
    binary, free_port, get_json, lmcache_venv, processes_mentioning, wait_for_status, Proc,
};
use nix::sys::signal::Signal;

/// The node's environment for a launch into `dir` on free ports.
fn launch_command(dir: &Path, mp_port: u16, http_port: u16) -> Command {
    let venv = lmcache_venv();
    let mut cmd = Command::new(binary("lmcache-tier"));
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .env("VIRTUAL_ENV", &venv)
        .env("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1")
        .env("EREBINE_AGENT_LMCACHE_DISK_PATH", dir.join("cache"))
        .env("EREBINE_AGENT_LMCACHE_MP_PORT", mp_port.to_string())
        .env("EREBINE_AGENT_LMCACHE_HTTP_PORT", http_port.to_string())
        .args([
            "launch",
            "--model",
            "test-model",
            "--max-num-batched-tokens",
            "512",
        ]);
    cmd
}

#[test]
fn launch_runs_the_real_server_with_a_sized_fs_native_tier_and_stores_kv() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (mp_port, http_port) = (free_port(), free_port());

    let mut dry = launch_command(dir, mp_port, http_port);
    dry.args(["--dry-run", "--json"]);
    let out = dry.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let planned_workers = plan["decisions"]["disk"]["io_workers"]["value"]
        .as_u64()
        .unwrap();
    assert!(
        !dir.join("cache").exists(),
        "--dry-run created the cache directory"
    );

    let mut launch = Proc::spawn(
        launch_command(dir, mp_port, http_port),
        &dir.join("launch.log"),
    );
    let url = format!("http://127.0.0.1:{http_port}/status");
    let status = wait_for_status(&url, &mut launch, Duration::from_secs(180));
    let adapters = status["storage_manager"]["l2_adapters"].as_array().unwrap();
    assert_eq!(adapters.len(), 1, "{status:#}");
    assert_eq!(adapters[0]["type"], "FSNativeL2Adapter");
    assert_eq!(
        adapters[0]["base_path"],
        dir.join("cache").display().to_string()
    );
    assert_eq!(adapters[0]["num_workers"].as_u64(), Some(planned_workers));
    assert_eq!(status["chunk_size"], 256);
    let mode = std::fs::metadata(dir.join("cache")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o700
    );

    let venv = lmcache_venv();
    let mut bench_cmd = Command::new(venv.join("bin/lmcache"));
    bench_cmd
        .args([
            "bench",
            "server",
            "--mode",
            "cpu",
            "--transfer-mode",
            "lmcache_driven",
        ])
        .args(["--rpc-url", &format!("tcp://127.0.0.1:{mp_port}")])
        .args(["--url", &format!("http://127.0.0.1:{http_port}")])
        .args([
            "--start",
            "0",
            "--end",
            "3",
            "--interval",
            "0.1",
            "--num-tokens",
            "1024",
        ])
        .env("LMCACHE_TRACK_USAGE", "false");
    let mut bench = Proc::spawn(bench_cmd, &dir.join("bench.log"));
    // The bench worker unregisters when it ends: watch it while it runs.
    let mut most_tracked = 0;
    let started = Instant::now();
    let bench_exit = loop {
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "bench still running after 180 s:\n{}",
            bench.output()
        );
        if let Some(body) = get_json(&url) {
            let tracked = body["worker_liveness"]["tracked_instances"]
                .as_u64()
                .unwrap_or(0);
            most_tracked = most_tracked.max(tracked);
        }
        if let Some(exit) = bench.wait_timeout(Duration::from_millis(200)) {
            break exit;
        }
    };
    let bench_out = bench.output();
    assert!(bench_exit.success(), "bench failed:\n{bench_out}");
    assert_eq!(
        bench_out.matches("CHECKSUM MATCH OK").count(),
        3,
        "{bench_out}"
    );
    assert!(!bench_out.contains("MISMATCH"), "{bench_out}");
    assert_eq!(most_tracked, 1, "the bench worker was never tracked");

    let objects = std::fs::read_dir(dir.join("cache"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".data"))
        .count();
    assert!(
        objects >= 3,
        "expected .data objects in the disk tier, found {objects}"
    );

    let log = launch.output();
    assert!(log.contains("lmcache launch: l2_adapters="), "{log}");
    assert!(log.contains("use_odirect="), "{log}");
    assert!(log.contains("ready"), "{log}");

    launch.signal(Signal::SIGTERM);
    let exit = launch
        .wait_timeout(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("launch did not stop on SIGTERM:\n{}", launch.output()));
    assert!(
        exit.success(),
        "launch exited with {exit}:\n{}",
        launch.output()
    );
    std::thread::sleep(Duration::from_millis(500));
    let left = processes_mentioning(&dir.display().to_string());
    assert!(left.is_empty(), "processes left after SIGTERM: {left:?}");
}

/// A launcher killed outright (SIGKILL: no chance to clean up) takes the
/// server down with it: the parent-death signal reaches `erebine-lmcache`,
/// which stops the real server.
#[test]
fn a_killed_launcher_leaves_no_server_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (mp_port, http_port) = (free_port(), free_port());
    let mut launch = Proc::spawn(
        launch_command(dir, mp_port, http_port),
        &dir.join("launch.log"),
    );
    let url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_status(&url, &mut launch, Duration::from_secs(180));
    assert!(!processes_mentioning(&dir.display().to_string()).is_empty());

    launch.signal(Signal::SIGKILL);
    launch
        .wait_timeout(Duration::from_secs(10))
        .expect("SIGKILL ends the launcher");
    let started = Instant::now();
    let mut left = processes_mentioning(&dir.display().to_string());
    while !left.is_empty() && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(250));
        left = processes_mentioning(&dir.display().to_string());
    }
    assert!(
        left.is_empty(),
        "orphaned after the launcher was killed: {left:?}"
    );
    assert!(get_json(&url).is_none(), "the server still answers");
}
