//! End to end: `lmcache-tier launch` runs the real LMCache 0.5.6 server with
//! the built-in fs_native disk tier sized from the volume, and real KV traffic
//! from `lmcache bench server --mode cpu` lands in it.

use std::time::{Duration, Instant};

use lmcache_launcher::plan::locate::lmcache_version;
use lmcache_tier_e2e::{
    binaries, data_objects, free_port, get_json, lmcache_venv, processes_mentioning, run_bench,
    stop_launch, wait_for_status, Binaries, Proc,
};
use nix::sys::signal::Signal;

const BINS: Binaries = binaries!();

#[test]
fn launch_runs_the_real_server_with_a_sized_fs_native_tier_and_stores_kv() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (mp_port, http_port) = (free_port(), free_port());
    let flags = [
        "--max-num-batched-tokens",
        "512",
        "--kv-bytes-per-token",
        "8192",
        "--disk-read-gbps",
        "probe",
    ];

    let mut dry = BINS.launch_command(dir, mp_port, http_port, &flags);
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
    assert!(
        plan["decisions"]["disk"]["load"].is_null(),
        "a dry run does not probe the volume: {plan:#}"
    );

    let mut launch = Proc::spawn(
        BINS.launch_command(dir, mp_port, http_port, &flags),
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

    let bench = run_bench(dir, mp_port, http_port, 0, 3);
    assert!(bench.status.success(), "bench failed:\n{}", bench.output);
    assert_eq!(
        bench.output.matches("CHECKSUM MATCH OK").count(),
        3,
        "{}",
        bench.output
    );
    assert!(!bench.output.contains("MISMATCH"), "{}", bench.output);
    assert_eq!(bench.most_tracked, 1, "the bench worker was never tracked");
    let objects = data_objects(&dir.join("cache"));
    assert!(
        objects.len() >= 3,
        "expected .data objects in the disk tier, found {objects:?}"
    );

    let log = launch.output();
    assert!(log.contains("lmcache launch: l2_adapters="), "{log}");
    assert!(log.contains("use_odirect="), "{log}");
    // The read test ran at start (or said why not), and left no file.
    assert!(
        log.contains("disk_load=") || log.contains("the read test in"),
        "{log}"
    );
    let probe_files: Vec<_> = std::fs::read_dir(dir.join("cache"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("read-probe"))
        .collect();
    assert!(probe_files.is_empty(), "{probe_files:?}");
    assert!(log.contains("ready"), "{log}");

    stop_launch(&mut launch);
    std::thread::sleep(Duration::from_millis(500));
    let left = processes_mentioning(&dir.display().to_string());
    assert!(left.is_empty(), "processes left after SIGTERM: {left:?}");
}

/// A launcher killed outright (SIGKILL: no chance to clean up) takes the
/// server down with it: the parent-death signal reaches `erebine-lmcache`,
/// which stops the real server.
#[test]
fn a_killed_launcher_leaves_no_server_behind() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (mp_port, http_port) = (free_port(), free_port());
    let mut launch = Proc::spawn(
        BINS.launch_command(dir, mp_port, http_port, &[]),
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

#[test]
fn a_server_that_cannot_import_its_modules_is_named_with_the_import() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Modules LMCache imports, broken the way a missing dependency breaks
    // them: `openai`, which the command line of 0.5.4 and 0.5.5 imports at
    // start, and `msgspec`, which the server of 0.5.6 imports.
    for module in ["openai", "msgspec"] {
        let shadow = dir.join("shadow").join(module);
        std::fs::create_dir_all(&shadow).unwrap();
        std::fs::write(
            shadow.join("__init__.py"),
            format!("raise ModuleNotFoundError(\"No module named '{module}'\")\n"),
        )
        .unwrap();
    }
    let mut cmd = BINS.launch_command(dir, free_port(), free_port(), &[]);
    cmd.env("PYTHONPATH", dir.join("shadow"));
    let mut launch = Proc::spawn(cmd, &dir.join("launch.log"));
    let status = launch
        .wait_timeout(Duration::from_secs(120))
        .expect("the launch ends");
    let log = launch.output();
    assert_eq!(status.code(), Some(5), "{log}");
    let version = lmcache_version(&lmcache_venv().join("bin/lmcache")).expect("a version");
    assert!(
        log.contains(&format!("LMCache {version} (")),
        "the version is logged:\n{log}"
    );
    // LMCache 0.5.6 warns about the import and refuses its flags; older
    // versions end with the import's traceback: either way it is named.
    let named = log
        .lines()
        .find(|l| l.contains("exited before it was ready (exit status"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        named.contains("No module named 'openai')") || named.contains("No module named 'msgspec')"),
        "{log}"
    );
}

/// A tier on tmpfs is memory: the plan bounds it so that L1 and the tier
/// leave the engine its headroom, the real server gets exactly that
/// capacity, and KV traffic lands in RAM.
#[test]
fn a_tier_on_dev_shm_is_bounded_by_memory_and_the_real_server_gets_that_capacity() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let dir = tmp.path();
    let (mp_port, http_port) = (free_port(), free_port());
    // Two nodes share the host, so the memory bound, not the volume,
    // decides on a host whose /dev/shm is the usual half or all of RAM.
    let shared = |mut cmd: std::process::Command| {
        cmd.env("EREBINE_AGENT_HOST_AGENT_COUNT", "2");
        cmd
    };
    let mut dry = shared(BINS.launch_command(dir, mp_port, http_port, &[]));
    dry.args(["--dry-run", "--json"]);
    let out = dry.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let decisions = &plan["decisions"];
    assert_eq!(decisions["disk"]["volume_kind"]["value"], "memory");
    let memory = decisions["host"]["memory"]["value"].as_u64().unwrap();
    let share = memory / 2;
    let budget = share - (share / 4).max(8 << 30);
    let capacity = decisions["disk"]["capacity"]["value"].as_u64().unwrap();
    assert!(capacity >= 1 << 30, "no tier planned: {decisions:#}");
    assert!(
        (1 << 30) + capacity <= budget,
        "L1 1 GiB + tier {capacity} > budget {budget}: {decisions:#}"
    );
    assert!(stderr.contains("is RAM beside the 1.00 GiB L1"), "{stderr}");

    let mut launch = Proc::spawn(
        shared(BINS.launch_command(dir, mp_port, http_port, &[])),
        &dir.join("launch.log"),
    );
    let url = format!("http://127.0.0.1:{http_port}/status");
    let status = wait_for_status(&url, &mut launch, Duration::from_secs(180));
    let evicted = &status["storage_manager"]["l2_eviction_controller"]["adapters"];
    let served = evicted[0]["total_capacity_bytes"].as_u64().unwrap();
    assert_eq!(served >> 20, capacity >> 20, "{status:#}");
    let bench = run_bench(dir, mp_port, http_port, 0, 2);
    assert!(bench.status.success(), "bench failed:\n{}", bench.output);
    assert!(!data_objects(&dir.join("cache")).is_empty());
    let log = launch.output();
    assert!(log.contains("volume=memory-backed (tmpfs"), "{log}");
    stop_launch(&mut launch);
}

/// A ramfs mounted for the test, unmounted when dropped. The end-to-end
/// tests run as root (`scripts/test.sh` on the CI machine), which mounting
/// needs.
struct Ramfs(std::path::PathBuf);

impl Ramfs {
    fn mount(at: &std::path::Path) -> Ramfs {
        std::fs::create_dir_all(at).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "ramfs", "erebine-test"])
            .arg(at)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mounting a ramfs needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ramfs(at.to_path_buf())
    }
}

impl Drop for Ramfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A memory-backed volume that reports no size (ramfs, a tmpfs mounted
/// with `size=0`) is bounded by memory alone, and the launch's capacity
/// check takes a size of 0 as "no size", so the real server starts.
#[test]
fn a_tier_on_a_ramfs_without_a_size_is_bounded_by_memory_and_starts() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ramfs = Ramfs::mount(&dir.join("ram"));
    let (mp_port, http_port) = (free_port(), free_port());
    let command = || {
        let mut cmd = BINS.launch_command(dir, mp_port, http_port, &[]);
        cmd.env("EREBINE_AGENT_LMCACHE_DISK_PATH", ramfs.0.join("cache"))
            .env("EREBINE_AGENT_HOST_AGENT_COUNT", "2");
        cmd
    };
    let out = command().args(["--dry-run", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let disk = &plan["decisions"]["disk"];
    assert_eq!(
        disk["volume_kind"]["reason"],
        "ramfs is memory-backed: its pages are this node's RAM"
    );
    assert_eq!(disk["capacity"]["rule"], "memory-bound", "{disk:#}");
    let capacity = disk["capacity"]["value"].as_u64().unwrap();

    let mut launch = Proc::spawn(command(), &dir.join("launch.log"));
    let url = format!("http://127.0.0.1:{http_port}/status");
    let status = wait_for_status(&url, &mut launch, Duration::from_secs(180));
    let evicted = &status["storage_manager"]["l2_eviction_controller"]["adapters"];
    let served = evicted[0]["total_capacity_bytes"].as_u64().unwrap();
    assert_eq!(served >> 20, capacity >> 20, "{status:#}");
    stop_launch(&mut launch);
}
