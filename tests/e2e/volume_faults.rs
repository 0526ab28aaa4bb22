//! End to end with the real server: a tier whose volume something else fills
//! while the CPU bench worker stores and loads.
//!
//! Each test mounts a tmpfs of its own (root), so its free space is what the
//! test makes it:
//! - an `fs` tier (`EREBINE_AGENT_LMCACHE_L2_ADAPTER`) grows to its capacity
//!   without crossing the free-space line, then another writer takes the
//!   volume below the line and the capacity guard evicts the tier's oldest
//!   objects until the line is back;
//! - an `fs` tier on a volume another writer fills to the last byte at once (LMCache's stores fail with `ENOSPC`): the node keeps
//!   serving, the guard frees room, stores resume without a restart, and
//!   `inspect` shows it. The test prints the time from the full volume to
//!   the first store after it.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use lmcache_tier_e2e::{
    binaries, data_objects, free_port, run_bench, stop_launch, wait_for_status, BenchRun, Binaries,
    Proc, Tmpfs,
};

const BINS: Binaries = binaries!();

const MIB: u64 = 1 << 20;
/// One stored chunk: 256 tokens of the CPU bench's KV shape.
const OBJECT: u64 = 32 * MIB;
/// Sequences of one bench of [`Node::bench_until`]: 512 MiB, about 5 s
/// alone.
const BATCH: u32 = 4;

struct Node {
    dir: PathBuf,
    tier: PathBuf,
    volume: Tmpfs,
    mp_port: u16,
    http_port: u16,
    env: Vec<(&'static str, String)>,
}

impl Node {
    /// A node whose tier `tier_name` lies on a tmpfs of `volume_mib` MiB.
    fn new(dir: &Path, volume_mib: u64, tier_name: &str) -> Node {
        let volume = Tmpfs::mount(&dir.join("volume"), volume_mib * 1024);
        Node {
            dir: dir.to_path_buf(),
            tier: volume.path().join(tier_name),
            volume,
            mp_port: free_port(),
            http_port: free_port(),
            env: vec![(
                "EREBINE_AGENT_LMCACHE_METRICS_PORT",
                free_port().to_string(),
            )],
        }
    }

    fn launch(&self) -> Proc {
        let mut cmd = BINS.launch_command(
            &self.dir,
            self.mp_port,
            self.http_port,
            &["--max-num-batched-tokens", "512"],
        );
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut launch = Proc::spawn(cmd, &self.dir.join("launch.log"));
        let url = format!("http://127.0.0.1:{}/status", self.http_port);
        wait_for_status(&url, &mut launch, Duration::from_secs(180));
        launch
    }

    /// The bench storing sequences `start..end` on a thread of its own.
    fn bench(&self, start: u32, end: u32) -> thread::JoinHandle<BenchRun> {
        let (dir, mp, http) = (self.dir.clone(), self.mp_port, self.http_port);
        thread::spawn(move || run_bench(&dir, mp, http, start, end))
    }

    /// Benches of [`BATCH`] sequences each, from sequence `first` on, one
    /// after another on a thread of its own until `done` is set or a run
    /// fails: stores go on however long the faults take on a loaded host.
    /// Returns every run (a failed one last).
    fn bench_until(&self, first: u32, done: Arc<AtomicBool>) -> thread::JoinHandle<Vec<BenchRun>> {
        let (dir, mp, http) = (self.dir.clone(), self.mp_port, self.http_port);
        thread::spawn(move || {
            let mut runs = Vec::new();
            for start in (first..).step_by(BATCH as usize) {
                if done.load(Ordering::Relaxed) {
                    break;
                }
                let run = run_bench(&dir, mp, http, start, start + BATCH);
                let failed = !run.status.success();
                runs.push(run);
                if failed {
                    break;
                }
            }
            runs
        })
    }

    /// The guard's status file, `null` while there is none.
    fn status(&self) -> serde_json::Value {
        fs::read_to_string(self.tier.join(".lmcache-tier-guard.json"))
            .map(|text| serde_json::from_str(&text).unwrap())
            .unwrap_or_default()
    }

    /// Waits (at most 300 s) until the guard's status satisfies `ok`.
    fn wait_status(
        &self,
        what: &str,
        launch: &Proc,
        ok: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let started = Instant::now();
        loop {
            let status = self.status();
            if ok(&status) {
                return status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "{what}: {status:#}\n{}",
                launch.output()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (at most 120 s) for an object that was not in the tier when
    /// called; returns how long that took.
    fn next_store(&self, launch: &Proc, what: &str) -> Duration {
        let before: BTreeSet<String> = data_objects(&self.tier).into_iter().collect();
        let started = Instant::now();
        loop {
            if data_objects(&self.tier)
                .iter()
                .any(|name| !before.contains(name))
            {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "{what}: none came: {:#}\n{}",
                self.status(),
                launch.output()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (at most 120 s) until LMCache logs more failed stores than
    /// `before`.
    fn wait_store_failure(&self, launch: &Proc, before: usize) {
        let started = Instant::now();
        while store_failures(&launch.output()) <= before {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "no store failed on the full volume: {:#}\n{}",
                self.status(),
                launch.output()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn inspect(&self) -> serde_json::Value {
        let mut cmd = Command::new(BINS.lmcache_tier());
        cmd.env_clear()
            .env(
                "EREBINE_AGENT_LMCACHE_HTTP_PORT",
                self.http_port.to_string(),
            )
            .env("EREBINE_AGENT_LMCACHE_DISK_PATH", self.dir.join("cache"))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(["inspect", "--json"]);
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// LMCache's log lines of stores to an L2 adapter that failed (0.5.6's
/// store controller: `Store task <n> to adapter <i> failed for keys: ...`).
fn store_failures(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("Store task ") && l.contains(" failed for keys"))
        .count()
}

fn line_of(status: &serde_json::Value) -> u64 {
    status["free_space"]["line_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no free-space line: {status:#}"))
}

#[test]
fn an_fs_tier_gives_way_to_another_writer_at_the_free_space_line() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    // 1.5 GiB volume, 768 MiB tier: the line is the reserve, 153.6 MiB.
    let mut node = Node::new(tmp.path(), 1536, "fs-tier");
    let adapter = format!(
        r#"{{"type":"fs","base_path":"{}","max_capacity_gb":0.75}}"#,
        node.tier.display()
    );
    node.env
        .push(("EREBINE_AGENT_LMCACHE_L2_ADAPTER", adapter.clone()));
    let mut launch = node.launch();

    // Alone, the tier fills to its capacity and no further.
    let run = node.bench(0, 12).join().unwrap();
    assert!(run.status.success(), "{}", run.output);
    let alone = node.wait_status("evicted for capacity", &launch, |s| {
        s["evictions"]["cycles"].as_u64() > Some(0)
    });
    let line = line_of(&alone);
    assert_eq!(line, 1536 * MIB / 10, "{alone:#}");
    assert_eq!(alone["free_space"]["evictions"]["cycles"], 0, "{alone:#}");
    assert!(node.volume.free_bytes() >= line);

    // Another writer leaves a quarter of the line free, while the bench
    // goes on storing: the guard takes the volume back to the line.
    let outside = node.volume.path().join("model.safetensors");
    let bench = node.bench(100, 112);
    let take = node.volume.free_bytes().saturating_sub(line / 4);
    assert_eq!(node.volume.fill(&outside, take), take);
    let run = bench.join().unwrap();
    assert!(run.status.success(), "{}", run.output);
    let after = node.wait_status("evicted for free space", &launch, |s| {
        s["free_space"]["evictions"]["cycles"].as_u64() > Some(0)
            && s["free_space"]["free_bytes"].as_u64() >= Some(line)
    });
    assert!(
        node.volume.free_bytes() + 2 * OBJECT >= line,
        "free {} far below the line {line}: {after:#}",
        node.volume.free_bytes()
    );
    assert_eq!(fs::metadata(&outside).unwrap().len(), take);
    assert!(
        launch.output().contains("fell below the"),
        "{}",
        launch.output()
    );
    stop_launch(&mut launch);
}

#[test]
fn a_full_volume_is_freed_and_the_tier_stores_again_without_a_restart() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    // 2 GiB volume, a 1 GiB `fs` tier. (Not the built-in `fs_native` tier:
    // LMCache 0.5.6 counts that tier's usage itself and never learns of
    // deletions from outside, so once the guard has given up a tier's worth
    // for the free space, LMCache's count refuses its stores until a
    // restart; docs/capacity-guard.md.)
    let mut node = Node::new(tmp.path(), 2048, "fs-tier");
    let adapter = format!(
        r#"{{"type":"fs","base_path":"{}","max_capacity_gb":1}}"#,
        node.tier.display()
    );
    node.env.push(("EREBINE_AGENT_LMCACHE_L2_ADAPTER", adapter));
    let mut launch = node.launch();

    // Some objects stored; then, while the bench stores and loads, another
    // writer fills the volume to the last byte, once.
    let run = node.bench(0, 4).join().unwrap();
    assert!(run.status.success(), "{}", run.output);
    node.wait_status("stored", &launch, |s| {
        s["tracked"]["objects"].as_u64() > Some(4)
    });
    let done = Arc::new(AtomicBool::new(false));
    let bench = node.bench_until(100, done.clone());
    node.next_store(&launch, "the bench's first store");
    let outside = node.volume.path().join("download.part");
    let written = node.volume.fill_at_once(&outside);
    let resumed = node.next_store(&launch, "a store after the volume was full");
    eprintln!("guard freed room: stores resumed {resumed:?} after the volume was full");

    // A writer that takes every byte the guard frees, until the tier is
    // empty: LMCache's stores fail with ENOSPC, the guard says the volume is
    // short; then the writer's files go, and stores resume.
    let failed_before = store_failures(&launch.output());
    let mut runaway = Vec::new();
    let started = Instant::now();
    while !launch.output().contains("holds nothing more to evict") {
        let file = node
            .volume
            .path()
            .join(format!("runaway-{}", runaway.len()));
        node.volume.fill(&file, u64::MAX);
        runaway.push(file);
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the guard never said the volume is short: {:#}\n{}",
            node.status(),
            launch.output()
        );
        thread::sleep(Duration::from_millis(100));
    }
    node.wait_store_failure(&launch, failed_before);
    for file in &runaway {
        fs::remove_file(file).unwrap();
    }
    let resumed = node.next_store(&launch, "a store after the volume was freed");
    eprintln!("volume freed: stores resumed {resumed:?} after");
    done.store(true, Ordering::Relaxed);
    let runs = bench.join().unwrap();
    for run in &runs {
        assert!(run.status.success(), "{}", run.output);
    }
    eprintln!(
        "{} benches of {BATCH} sequences stored through the faults",
        runs.len()
    );

    let status = node.wait_status("freed, and short once", &launch, |s| {
        s["free_space"]["evictions"]["cycles"].as_u64() > Some(0)
            && s["free_space"]["shortages"].as_u64() > Some(0)
    });
    assert_eq!(fs::metadata(&outside).unwrap().len(), written);
    let inspected = node.inspect();
    let figures = &inspected["launch"]["figures"];
    assert_eq!(
        (&figures["starts"], &figures["restarts"]),
        (&1.into(), &0.into()),
        "the server was restarted: {inspected:#}"
    );
    let disk = inspected["disk"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["path"] == node.tier.display().to_string())
        .unwrap_or_else(|| panic!("no disk tier {}: {inspected:#}", node.tier.display()));
    assert!(
        disk["guard"]["free_space"]["evictions"]["cycles"].as_u64() > Some(0),
        "{inspected:#}\n{status:#}"
    );
    stop_launch(&mut launch);
}
