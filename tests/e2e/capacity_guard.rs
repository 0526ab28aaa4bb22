//! End to end with the real server: the capacity guard holds a disk tier
//! while the CPU bench worker stores more than three times its capacity, across
//! a restart, for an `fs` tier given through EREBINE_AGENT_LMCACHE_L2_ADAPTER
//! and for the node's built-in `fs_native` tier; the same bound on a volume
//! mounted over a running tier's directory (root: it mounts a tmpfs); and a
//! launch on a built-in tier at or over its capacity trims it once, to where
//! the guard leaves it.
//!
//! L1 is 1 GiB and keeps chunks after they reach L2, so the hits after a
//! restart (L1 empty) are what the disk tier kept; the bound is sampled on
//! the disk itself, `du`-style (allocated blocks of every entry, temp files
//! in flight included) every 200 ms. An `fs` tier is 0.5 GiB and the
//! bench's KV has 16 layers (half its default): the guard's bound scales
//! with the capacity and the object, so half the bytes on half the capacity
//! are the same test at half the cost. The built-in tier is 1 GiB, the least
//! the launch gives it, with the same 16 MiB objects: each fill stores 1.75
//! times its capacity, 3.5 times across the restart.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use lmcache_tier_e2e::{
    binaries, free_port, get_text, run_bench_with, stop_launch, wait_for_status, BenchOptions,
    BenchRun, Binaries, Proc, Tmpfs,
};

const BINS: Binaries = binaries!();

const GIB: u64 = 1 << 30;
/// Sequences per fill: 28 x 4 chunks of 16 MiB, 1.75 GiB: 3.5 capacities of
/// [`FS_TIER`], 1.75 of [`BUILT_IN`].
const FILL: u32 = 28;

/// A tier's capacity and the bench's objects for it.
struct Scale {
    /// The capacity in bytes.
    capacity: u64,
    /// The capacity as `max_capacity_gb` or the disk size variable gives
    /// it, in GiB.
    capacity_gb: &'static str,
    /// The bench's KV shape (`--kvcache-shape-spec`).
    shape: &'static str,
    /// One object: a 256-token chunk of `shape`, in bytes.
    object: u64,
}

/// An `fs` tier: 0.5 GiB, 16 MiB objects (16 layers, 64 KiB of KV a
/// token): 1.75 GiB a fill.
const FS_TIER: Scale = Scale {
    capacity: GIB / 2,
    capacity_gb: "0.5",
    shape: "(2,1024,16,8,128):float16:16",
    object: 16 << 20,
};

/// The built-in tier: 1 GiB, the least the launch gives it (below it the
/// server runs L1 only), 16 MiB objects as [`FS_TIER`]'s.
const BUILT_IN: Scale = Scale {
    capacity: GIB,
    capacity_gb: "1",
    shape: FS_TIER.shape,
    object: FS_TIER.object,
};

/// The objects a trimmed tier is filled with: one chunk of the bench's
/// default shape (32 layers), 32 MiB.
const TRIMMED_OBJECT: u64 = 32 << 20;

/// The CPU bench's sequences `start..end` in `node`'s shape against it.
fn bench(node: &Node, start: u32, end: u32) -> BenchRun {
    let options = BenchOptions {
        kvcache_shape_spec: Some(node.scale.shape),
        ..BenchOptions::default()
    };
    run_bench_with(
        &node.dir,
        node.mp_port,
        node.http_port,
        start,
        end,
        &options,
    )
}

/// Allocated bytes of every entry of `dir`, as `du` counts them (entries that
/// vanish while counted are skipped).
fn du(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| fs::symlink_metadata(e.path()).ok())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}

/// Allocated bytes and count of the `.data` objects in `dir`.
fn objects(dir: &Path) -> (u64, u64) {
    let mut found = (0, 0);
    for entry in fs::read_dir(dir).unwrap().filter_map(Result::ok) {
        if entry.file_name().to_string_lossy().ends_with(".data") {
            if let Ok(m) = fs::symlink_metadata(entry.path()) {
                found.0 += 1;
                found.1 += m.blocks() * 512;
            }
        }
    }
    found
}

/// Samples `du` of a directory every 200 ms until dropped; keeps the largest.
struct Sampler {
    stop: Arc<AtomicBool>,
    most: Arc<AtomicU64>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(dir: &Path) -> Sampler {
        let (stop, most) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (s, m, d) = (stop.clone(), most.clone(), dir.to_path_buf());
        let thread = thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                m.fetch_max(du(&d), Ordering::Relaxed);
                thread::sleep(Duration::from_millis(200));
            }
        });
        Sampler {
            stop,
            most,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.most.load(Ordering::Relaxed)
    }
}

/// Waits until the objects in `tier` have not changed for 2 s (at least
/// 3 s, at most 30 s).
fn settle(tier: &Path) {
    let started = std::time::Instant::now();
    let (mut last, mut still_since) = (objects(tier), std::time::Instant::now());
    while started.elapsed() < Duration::from_secs(30) {
        thread::sleep(Duration::from_millis(250));
        let now = objects(tier);
        if now != last {
            (last, still_since) = (now, std::time::Instant::now());
        } else if still_since.elapsed() >= Duration::from_secs(2)
            && started.elapsed() >= Duration::from_secs(3)
        {
            return;
        }
    }
}

fn status(tier: &Path) -> serde_json::Value {
    let text = fs::read_to_string(tier.join(".lmcache-tier-guard.json"))
        .unwrap_or_else(|e| panic!("no guard status in {}: {e}", tier.display()));
    serde_json::from_str(&text).unwrap()
}

/// The guard's bound: 5% over the capacity, or one object, whichever is larger.
fn bound(scale: &Scale) -> u64 {
    scale.capacity + (scale.capacity / 20).max(scale.object)
}

/// Checks that `most`, the largest `du` of the tier a fill saw, stayed
/// within the guard's bound for `scale`; the guard's status `seen` and the
/// launch's log are in the message.
fn assert_within_bound(most: u64, scale: &Scale, seen: &serde_json::Value, launch: &Proc) {
    assert!(
        most <= bound(scale),
        "du reached {most} bytes, over the bound {}: {seen:#}\n{}",
        bound(scale),
        launch.output()
    );
}

/// Checks that the guard whose status is `seen` ran an eviction cycle.
fn assert_evicted(seen: &serde_json::Value) {
    assert!(
        seen["evictions"]["cycles"].as_u64().unwrap() > 0,
        "{seen:#}"
    );
}

struct Node {
    scale: &'static Scale,
    dir: PathBuf,
    tier: PathBuf,
    mp_port: u16,
    http_port: u16,
    env: Vec<(&'static str, String)>,
}

impl Node {
    fn launch(&self, name: &str) -> Proc {
        let mut cmd = BINS.launch_command(
            &self.dir,
            self.mp_port,
            self.http_port,
            &["--max-num-batched-tokens", "512"],
        );
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut launch = Proc::spawn(cmd, &self.dir.join(format!("{name}.log")));
        let url = format!("http://127.0.0.1:{}/status", self.http_port);
        wait_for_status(&url, &mut launch, Duration::from_secs(180));
        launch
    }

    /// Stores sequences `start..start + FILL` while sampling `du`; returns the
    /// largest sample.
    fn fill(&self, start: u32) -> u64 {
        let sampler = Sampler::start(&self.tier);
        let run = bench(self, start, start + FILL);
        assert!(run.status.success(), "{}", run.output);
        // Let the last stores reach the disk before the samples end:
        // LMCache writes to L2 behind the bench, later on a loaded host.
        settle(&self.tier);
        sampler.finish()
    }

    /// `lmcache-tier inspect --json` for this node.
    fn inspect(&self) -> serde_json::Value {
        let mut cmd = Command::new(BINS.lmcache_tier());
        cmd.env_clear()
            .env(
                "EREBINE_AGENT_LMCACHE_HTTP_PORT",
                self.http_port.to_string(),
            )
            .env("EREBINE_AGENT_LMCACHE_DISK_PATH", self.dir.join("cache"))
            .args(["inspect", "--json"]);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn cold_hits(&self, start: u32, end: u32) -> usize {
        let run = bench(self, start, end);
        assert!(run.status.success(), "{}", run.output);
        run.full_cold_hits()
    }
}

/// Fill, restart, check the count and the hits, fill again.
fn holds_the_capacity_across_a_restart(node: &Node, must_evict_first_fill: bool) {
    let outside = node.dir.join("outside.bin");
    fs::write(&outside, b"not in the tier").unwrap();
    fs::create_dir_all(&node.tier).unwrap();
    let foreign = node.tier.join("model.safetensors");
    fs::write(&foreign, b"weights").unwrap();

    let mut launch = node.launch("launch-1");
    let most = node.fill(0);
    let first = status(&node.tier);
    let capacity = first["capacity_bytes"].as_u64().unwrap();
    assert_eq!(capacity, node.scale.capacity, "{first:#}");
    assert_within_bound(most, node.scale, &first, &launch);
    let stored =
        first["evictions"]["bytes"].as_u64().unwrap() + first["tracked"]["bytes"].as_u64().unwrap();
    if must_evict_first_fill {
        assert_evicted(&first);
        assert!(
            stored >= 3 * capacity,
            "only {stored} bytes stored: {first:#}"
        );
    }
    let inspected = node.inspect();
    let disk = inspected["disk"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["path"] == node.tier.display().to_string())
        .unwrap_or_else(|| {
            panic!(
                "inspect lists no disk tier {}: {inspected:#}",
                node.tier.display()
            )
        });
    assert_eq!(disk["guard"]["capacity_bytes"], capacity, "{inspected:#}");
    // The tier's row shows its capacity whether LMCache evicts it (fs_native
    // with an eviction block) or only the guard does (fs).
    let tier = inspected["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["location"] == node.tier.display().to_string())
        .unwrap_or_else(|| panic!("no tier row for {}: {inspected:#}", node.tier.display()));
    assert_eq!(tier["capacity_bytes"], capacity, "{inspected:#}");
    stop_launch(&mut launch);
    let (count, bytes) = objects(&node.tier);
    assert!(count > 0, "nothing stayed in the tier");

    let mut launch = node.launch("launch-2");
    let restarted = loop {
        let s = status(&node.tier);
        if s["pid"] != first["pid"] {
            break s;
        }
        thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        restarted["start"]["objects"].as_u64(),
        Some(count),
        "{restarted:#}"
    );
    assert_eq!(
        restarted["start"]["bytes"].as_u64(),
        Some(bytes),
        "{restarted:#}"
    );
    assert_eq!(
        node.cold_hits(FILL - 2, FILL),
        2,
        "the most recent sequences should hit on the disk tier after a restart"
    );
    let most = node.fill(100);
    let second = status(&node.tier);
    assert_within_bound(most, node.scale, &second, &launch);
    assert_evicted(&second);
    assert!(launch.output().contains("capacity guard, L2 tier 0"));
    stop_launch(&mut launch);
    assert_eq!(fs::read(&outside).unwrap(), b"not in the tier");
    assert_eq!(fs::read(&foreign).unwrap(), b"weights");
}

#[test]
fn an_fs_tier_with_max_capacity_gb_stays_within_it() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let tier = dir.join("fs-tier");
    let adapter = format!(
        r#"{{"type":"fs","base_path":"{}","max_capacity_gb":{}}}"#,
        tier.display(),
        FS_TIER.capacity_gb
    );
    let node = Node {
        scale: &FS_TIER,
        dir,
        tier,
        mp_port: free_port(),
        http_port: free_port(),
        env: vec![("EREBINE_AGENT_LMCACHE_L2_ADAPTER", adapter)],
    };
    holds_the_capacity_across_a_restart(&node, true);
}

#[test]
fn the_builtin_fs_native_tier_stays_within_its_capacity_across_a_restart() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let node = Node {
        scale: &BUILT_IN,
        tier: dir.join("cache"),
        dir,
        mp_port: free_port(),
        http_port: free_port(),
        env: vec![(
            "EREBINE_AGENT_LMCACHE_DISK_SIZE_GB",
            BUILT_IN.capacity_gb.into(),
        )],
    };
    // LMCache evicts on its own count first; the guard is the bound behind it.
    holds_the_capacity_across_a_restart(&node, false);
}

/// Writes `count` objects of the launch identity (`test-model`, TP 1) of
/// [`TRIMMED_OBJECT`]'s allocated bytes each into `tier`, oldest first.
fn fill_with_objects(tier: &Path, count: u32) {
    use nix::fcntl::{fallocate, FallocateFlags};
    for i in 0..count {
        let path = tier.join(format!("test-model@0x01000100@0@{i:064x}.data"));
        let file = fs::File::create(&path).unwrap();
        fallocate(&file, FallocateFlags::empty(), 0, TRIMMED_OBJECT as i64).unwrap();
        let at = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + u64::from(i));
        file.set_times(fs::FileTimes::new().set_accessed(at).set_modified(at))
            .unwrap();
    }
}

/// The example: a launch on a tier at its capacity trimmed it to 100%, and
/// the guard then deleted another 30% within seconds. Now housekeeping
/// trims it to the guard's target (0.7 of the 1 GiB built-in tier: its hard
/// bound evicts at 0.9 with a ratio of 0.2) and the guard evicts nothing:
/// for a tier at its capacity (32 objects of 32 MiB) and one over it (40).
#[test]
fn a_launch_on_a_full_tier_trims_it_once_to_where_the_guard_leaves_it() {
    lmcache_tier_e2e::require_lmcache!();
    for count in [32, 40] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let node = Node {
            scale: &BUILT_IN,
            tier: dir.join("cache"),
            dir,
            mp_port: free_port(),
            http_port: free_port(),
            env: vec![(
                "EREBINE_AGENT_LMCACHE_DISK_SIZE_GB",
                BUILT_IN.capacity_gb.into(),
            )],
        };
        // A first launch records the identity the objects are written under.
        let mut launch = node.launch("launch-1");
        stop_launch(&mut launch);
        fill_with_objects(&node.tier, count);
        assert_eq!(objects(&node.tier).1, u64::from(count) * TRIMMED_OBJECT);

        let mut launch = node.launch("launch-2");
        let first = status(&node.tier);
        let kept = first["start"]["bytes"].as_u64().unwrap();
        let ratio = (0.2 * first["capacity_bytes"].as_u64().unwrap() as f64).ceil() as u64;
        let target = first["trigger_bytes"].as_u64().unwrap() - ratio;
        assert!(
            kept <= target && kept + TRIMMED_OBJECT > target,
            "{count} objects: {first:#}"
        );
        // The guard's first status is written after any cycle at its start.
        assert_eq!(
            first["evictions"]["cycles"], 0,
            "{count} objects: {first:#}"
        );
        assert_eq!(objects(&node.tier).1, kept);
        assert!(
            launch
                .output()
                .contains("where the capacity guard leaves a tier"),
            "{}",
            launch.output()
        );
        stop_launch(&mut launch);
    }
}

/// The value of the series `series` in a metrics page, if it is there.
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// The example: a volume mounted over a running tier's directory was never
/// guarded (1.2 GiB on a 1 GiB tier, and the guard's status and metrics
/// gone from the path). The server writes into the mount (LMCache opens
/// `base_path/<name>` at every store); the guard takes it up, holds the
/// bench's 1.75 GiB to the capacity there, measures its line on that volume,
/// and the metrics endpoint serves its series. Mounts a 2 GiB tmpfs: root.
#[test]
fn a_volume_mounted_over_a_running_tiers_directory_is_guarded_with_its_metrics() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let tier = dir.join("fs-tier");
    let adapter = format!(
        r#"{{"type":"fs","base_path":"{}","max_capacity_gb":{}}}"#,
        tier.display(),
        FS_TIER.capacity_gb
    );
    let metrics_port = free_port();
    let node = Node {
        scale: &FS_TIER,
        dir,
        tier,
        mp_port: free_port(),
        http_port: free_port(),
        env: vec![
            ("EREBINE_AGENT_LMCACHE_L2_ADAPTER", adapter),
            (
                "EREBINE_AGENT_LMCACHE_METRICS_PORT",
                metrics_port.to_string(),
            ),
        ],
    };
    fs::create_dir_all(&node.tier).unwrap();
    let mut launch = node.launch("launch");
    let started = std::time::Instant::now();
    while !node.tier.join(".lmcache-tier-guard.json").exists() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no guard status:\n{}",
            launch.output()
        );
        thread::sleep(Duration::from_millis(100));
    }
    let volume = Tmpfs::mount(&node.tier, 2 << 20);
    let most = node.fill(0);
    let guarded = status(&node.tier);
    assert_within_bound(most, &FS_TIER, &guarded, &launch);
    assert_evicted(&guarded);
    assert_eq!(
        guarded["free_space"]["volume_bytes"],
        2 * GIB,
        "{guarded:#}"
    );
    let page = get_text(&format!("http://127.0.0.1:{metrics_port}/metrics"))
        .expect("the metrics endpoint answers");
    let usage = sample(&page, r#"lmcache_tier_guard_usage_bytes{tier="0"}"#)
        .unwrap_or_else(|| panic!("no guard usage series:\n{page}"));
    assert!(usage <= FS_TIER.capacity as f64, "{usage}");
    // The free space of the mounted volume, not of the one under it.
    let free = sample(&page, r#"lmcache_tier_guard_volume_free_bytes{tier="0"}"#)
        .unwrap_or_else(|| panic!("no free space series:\n{page}"));
    assert!(free > 0.0 && free <= (2 * GIB) as f64, "{free}");
    assert!(
        launch
            .output()
            .contains("the tier path names another directory now on another filesystem"),
        "{}",
        launch.output()
    );
    stop_launch(&mut launch);
    drop(volume);
}
