//! End to end: the bucket bound (`docs/s3-gateway.md`, "The bucket bound").
//! Two launches (nodes with their own ports and directories) share one
//! bucket on s3s-fs under one key prefix, each storing its own chunks with
//! the real CPU bench through the real LMCache server, and both are
//! restarted for a second round. The bucket's LMCache bytes, sampled on
//! s3s-fs's directory all along, never pass 1.05 x the capacity plus one
//! object, although the nodes write twice the capacity and LMCache's own
//! count (from 0 at each start, its own keys only) never reaches its
//! watermark; an object of the prefix that is not LMCache's, and objects
//! outside the prefix, stay byte-identical; and one node loads chunks the
//! other stored.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lmcache_s3_gateway::state::{GatewayState, STATE_PATH};
use lmcache_tier_e2e::{
    binaries, free_port, get_json, run_bench, stop_launch, wait_for_status, Binaries, Proc, S3sFs,
};

const BINS: Binaries = binaries!();

const KEY_ID: &str = "AKIAE2EBUCKETBOUND01";
const SECRET: &str = "e2e-bucket-bound-secret-0123456789abcdef";
const GIB: u64 = 1 << 30;
/// The tier's `max_capacity_gb`.
const CAPACITY_GB: u64 = 2;
/// One chunk of the CPU bench at `--chunk-size 32`: one PUT each (larger
/// objects are multipart uploads, whose completes s3s-fs answers slowly on
/// a loaded machine).
const OBJECT_BYTES: u64 = 4 << 20;
/// Sequences each node stores per round: 8 x 32 x 4 MiB = 1 GiB.
const SEQUENCES: u32 = 8;

/// The sizes of the LMCache objects under `dir` (s3s-fs's directory of the
/// tier's prefix), by key; files whose names hold no `@` are not LMCache's.
fn lmcache_objects(dir: &Path) -> BTreeMap<String, u64> {
    let mut found = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&at) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            let path = entry.path();
            let name = path.strip_prefix(dir).unwrap().display().to_string();
            if meta.is_dir() {
                pending.push(path);
            } else if name.contains('@') {
                found.insert(name, meta.len());
            }
        }
    }
    found
}

/// Samples the LMCache bytes under `dir` every 200 ms until stopped:
/// the most seen, and every key seen with its size.
struct Sampler {
    stop: Arc<AtomicBool>,
    most: Arc<Mutex<u64>>,
    seen: Arc<Mutex<BTreeMap<String, u64>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(dir: PathBuf) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let most = Arc::new(Mutex::new(0));
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let (s, m, k) = (stop.clone(), most.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let objects = lmcache_objects(&dir);
                let bytes: u64 = objects.values().sum();
                let mut most = m.lock().unwrap();
                *most = (*most).max(bytes);
                k.lock().unwrap().extend(objects);
                drop(most);
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        Sampler {
            stop,
            most,
            seen,
            thread: Some(thread),
        }
    }

    /// The most bytes seen, and the bytes of every key seen.
    fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        let most = *self.most.lock().unwrap();
        let written = self.seen.lock().unwrap().values().sum();
        (most, written)
    }
}

/// One node: its directory and ports.
struct Node {
    dir: PathBuf,
    mp_port: u16,
    http_port: u16,
}

impl Node {
    fn new(root: &Path, name: &str) -> Node {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        Node {
            dir,
            mp_port: free_port(),
            http_port: free_port(),
        }
    }

    /// Starts the node's launch with the shared tier and waits for its
    /// server.
    fn launch(&self, tier: &serde_json::Value, round: u32) -> Proc {
        let mut cmd = BINS.launch_command(&self.dir, self.mp_port, self.http_port, &[]);
        cmd.env("EREBINE_AGENT_LMCACHE_L2_ADAPTER", tier.to_string())
            .env("EREBINE_AGENT_LMCACHE_EXTRA_ARGS", "--chunk-size 32")
            .env("LMCACHE_TRACK_USAGE", "false");
        let mut launch = Proc::spawn(cmd, &self.dir.join(format!("launch-{round}.log")));
        let url = format!("http://127.0.0.1:{}/status", self.http_port);
        wait_for_status(&url, &mut launch, Duration::from_secs(300));
        launch
    }

    /// The node's S3 tier as `lmcache-tier inspect --json` shows it.
    fn inspect_tier(&self) -> serde_json::Value {
        let url = format!("http://127.0.0.1:{}/status", self.http_port);
        let out = std::process::Command::new(BINS.lmcache_tier())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("EREBINE_AGENT_LMCACHE_DISK_PATH", self.dir.join("cache"))
            .args(["inspect", "--json", "--url", &url])
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("inspect --json: {e}: {out:?}"));
        assert!(report["tiers"][0].is_object(), "{report:#}");
        report["tiers"][0].clone()
    }
}

/// The gateway's state, from the port the launch log names.
fn gateway_state(launch: &Proc) -> GatewayState {
    let log = launch.output();
    let port: u16 = log
        .split("listening on 127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no gateway address in the launch log:\n{log}"));
    let state = get_json(&format!("http://127.0.0.1:{port}{STATE_PATH}")).expect("the state");
    serde_json::from_value(state).expect("a gateway state")
}

#[test]
fn two_nodes_restarted_between_rounds_keep_a_shared_bucket_within_its_capacity() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let s3 = S3sFs::start(root, free_port(), (KEY_ID, SECRET), &["kv-cache"]);
    let bucket = root.join("s3s-fs/kv-cache");
    let prefix_dir = bucket.join("fleet");
    // Not LMCache's, under the prefix; LMCache's name, outside it.
    let foreign = [
        (
            prefix_dir.join("notes.txt"),
            b"operator's notes\n".repeat(1000),
        ),
        (
            bucket.join("other/test-model@01000100@0@00ff"),
            vec![7u8; 3 << 20],
        ),
        (bucket.join("top-level.bin"), vec![9u8; 1 << 20]),
    ];
    for (path, bytes) in &foreign {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    let tier = serde_json::json!([{"shared": true, "type": "s3",
        "s3_endpoint": format!("127.0.0.1:{}", s3.port), "s3_bucket": "kv-cache",
        "s3_key_prefix": "fleet/", "s3_region": "us-east-1", "s3_prefer_http2": false,
        "disable_tls": true, "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET,
        "max_capacity_gb": CAPACITY_GB,
        "eviction": {"eviction_policy": "LRU", "trigger_watermark": 0.8, "eviction_ratio": 0.2}}]);
    let nodes = [Node::new(root, "node-a"), Node::new(root, "node-b")];
    let sampler = Sampler::start(prefix_dir.clone());
    let mut evicted = 0;
    for round in 0..2u32 {
        let launches: Vec<Proc> = nodes.iter().map(|n| n.launch(&tier, round)).collect();
        std::thread::scope(|scope| {
            for (i, node) in nodes.iter().enumerate() {
                let start = 1000 * (2 * round + i as u32);
                scope.spawn(move || {
                    let bench = run_bench(
                        &node.dir,
                        node.mp_port,
                        node.http_port,
                        start,
                        start + SEQUENCES,
                    );
                    assert!(bench.status.success(), "bench failed:\n{}", bench.output);
                });
            }
        });
        if round == 1 {
            // Node B loads chunks node A stored (A's last two sequences,
            // the newest in the bucket): every cold lookup hits, from the
            // bucket through B's own gateway.
            let a_end = 1000 * 2 * round + SEQUENCES;
            let b = &nodes[1];
            let loaded = run_bench(&b.dir, b.mp_port, b.http_port, a_end - 2, a_end);
            assert!(loaded.status.success(), "bench failed:\n{}", loaded.output);
            assert_eq!(
                loaded.full_cold_hits(),
                2,
                "node B did not load node A's chunks:\n{}",
                loaded.output
            );
        }
        for (node, mut launch) in nodes.iter().zip(launches) {
            let state = gateway_state(&launch);
            let bound = state.bucket_bound.expect("the bucket bound's figures");
            assert!(bound.listings >= 1, "{bound:?}");
            evicted += bound.evicted_objects;
            // `inspect` shows the bucket's usage as listed, LMCache's own
            // count (this process's stores only) beside it.
            let tier = node.inspect_tier();
            assert_eq!(tier["used_source"], "bucket", "{tier:#}");
            let lmcache = tier["lmcache_used_bytes"]
                .as_u64()
                .expect("LMCache's count");
            assert!(
                lmcache <= u64::from(SEQUENCES) * 32 * OBJECT_BYTES,
                "{tier:#}"
            );
            stop_launch(&mut launch);
        }
    }
    let (most, written) = sampler.finish();
    let capacity = CAPACITY_GB * GIB;
    assert!(
        written > capacity * 3 / 2,
        "the nodes wrote {written} bytes: too little to test a capacity of {capacity}"
    );
    assert!(evicted > 0, "the gateways evicted nothing");
    let limit = capacity + capacity / 20 + OBJECT_BYTES;
    assert!(
        most <= limit,
        "the bucket held {most} bytes, past 1.05 x {capacity} + one object"
    );
    for (path, bytes) in &foreign {
        assert_eq!(&std::fs::read(path).unwrap(), bytes, "{}", path.display());
    }
    eprintln!(
        "bucket bound: capacity {capacity}, written {written}, most held {most}, evicted {evicted} objects"
    );
}
