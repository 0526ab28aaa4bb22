//! End to end: one bucket shared by a fleet (`docs/s3-gateway.md`, "The
//! bucket bound"). Three launches (nodes with their own ports and
//! directories, one model) share one bucket under one key prefix, each
//! storing its own chunks with the real CPU bench through the real LMCache
//! server; all three are stopped and launched again for a second round,
//! and one node loads chunks another stored. Then a fourth node serving
//! another model writes under the same prefix.
//!
//! A sampler lists the bucket every second all along (as an operator
//! would, with the store's own key): its LMCache bytes never pass 1.05 x
//! the capacity plus one object, although the nodes write several times
//! the capacity and LMCache's own count (from 0 at each start, its own
//! keys only) never reaches its watermark. An object of the prefix that is
//! not LMCache's, and objects outside the prefix, stay byte-identical.
//!
//! The store is a parameter ([`Store`]): the same test runs on s3s-fs and
//! on OpenStack Swift's `s3api` (a Swift-All-In-One, the bucket a
//! container of the tempauth account `kv`, signed for `RegionOne`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use lmcache_housekeeping::s3_key::parse_s3_key;
use lmcache_s3_gateway::fleet::Mode;
use lmcache_s3_gateway::state::{GatewayState, STATE_PATH};
use lmcache_tier_e2e::bucket::{BucketClient, Listed, StoreAccess};
use lmcache_tier_e2e::swift::{Swift, SwiftOptions, KV, SWIFT_REGION};
use lmcache_tier_e2e::{
    binaries, free_port, get_json, run_bench_with, stop_launch, wait_for_status, BenchOptions,
    Binaries, Proc, S3sFs, ONE_LAYER,
};

const BINS: Binaries = binaries!();

const KEY_ID: &str = "AKIAE2EBUCKETBOUND01";
const SECRET: &str = "e2e-bucket-bound-secret-0123456789abcdef";
const BUCKET: &str = "kv-cache";
const PREFIX: &str = "fleet/";
const GIB: f64 = (1u64 << 30) as f64;
/// The bound's periods: the capacity below takes about 4 s of the three
/// nodes' writes, so the holder reads the reports every second, the nodes
/// report every second, and a lease left by a stopped round is taken over
/// after 3 s (`docs/s3-gateway.md`, "A fleet on one bucket"). A store
/// without conditional writes (Swift) has no lease and no reports: every
/// node lists and evicts on its own there, counting only the models its
/// block names besides its own, so there the block names both models of
/// the test (`docs/s3-gateway.md`, "Nodes of other models under one
/// prefix").
fn bucket_bound(every_node: bool) -> serde_json::Value {
    let mut block =
        serde_json::json!({"lease_seconds": 3, "report_seconds": 1, "read_reports_seconds": 1});
    if every_node {
        block["models"] = serde_json::json!(["test-model", OTHER_MODEL]);
    }
    block
}
/// The tier's `max_capacity_gb`: 53.7 MB, 12.8 objects.
const CAPACITY_GB: f64 = 0.05;
/// One chunk of the CPU bench with [`ONE_LAYER`] (4 KiB of KV a token) at
/// the launch's 1024-token chunks, one a sequence: one PUT each.
const OBJECT_BYTES: u64 = 4 << 20;
/// Seconds between two sequences of one bench: at most 4.2 MB/s a node,
/// so that the three nodes together write at most 12.6 MB in the second
/// between two listings of a writing gateway (`MIN_LISTING_GAP`), about
/// the 12.3 MB from the gateway's trigger (0.9 x capacity) to the limit
/// this test checks (`docs/s3-gateway.md`, "What it sees, and when").
const INTERVAL: &str = "1";
/// Sequences (one object each) a node stores per round: 25 MB, below
/// LMCache's own watermark (0.8 x capacity), so every eviction is the
/// gateway's.
const SEQUENCES: u32 = 6;
/// Sequences of the fourth node: 33.5 MB, below the gateway's trigger by
/// itself, and below its target, so none of them is ever the oldest.
const OTHER_SEQUENCES: u32 = 8;
/// The fourth node's model.
const OTHER_MODEL: &str = "other-model";

/// The object store the fleet shares, reached path-style over http on
/// loopback, and the server behind it (kept running while this lives).
struct Store {
    access: StoreAccess,
    /// Whether the store lacks conditional writes, so that every node
    /// evicts on its own (`Mode::EveryNode`).
    every_node: bool,
    _server: Box<dyn std::any::Any>,
}

impl Store {
    /// s3s-fs with the bucket, objects under `root/s3s-fs`.
    fn s3s_fs(root: &Path) -> Store {
        let server = S3sFs::start(root, free_port(), (KEY_ID, SECRET), &[BUCKET]);
        Store {
            access: StoreAccess {
                endpoint: format!("127.0.0.1:{}", server.port),
                region: "us-east-1".into(),
                key_id: KEY_ID.into(),
                secret: SECRET.into(),
            },
            every_node: false,
            _server: Box::new(server),
        }
    }

    /// A Swift-All-In-One with the bucket in account [`KV`], its servers'
    /// files under `root/swift`.
    fn swift(root: &Path) -> Store {
        let server = Swift::start(root, SwiftOptions::default());
        server.create_bucket(&KV, BUCKET);
        Store {
            access: StoreAccess {
                endpoint: server.endpoint(),
                region: SWIFT_REGION.into(),
                key_id: KV.access_key_id(),
                secret: KV.key.into(),
            },
            every_node: true,
            _server: Box::new(server),
        }
    }

    fn client(&self) -> BucketClient {
        BucketClient::new(&self.access, BUCKET)
    }

    /// The shared tier: an `eviction` block, so LMCache evicts its own keys
    /// at its watermark and the gateway is the hard bound.
    fn tier(&self) -> serde_json::Value {
        serde_json::json!([{"shared": true, "type": "s3",
            "s3_endpoint": self.access.endpoint, "s3_bucket": BUCKET,
            "s3_key_prefix": PREFIX, "s3_region": self.access.region, "s3_prefer_http2": false,
            "disable_tls": true, "aws_access_key_id": self.access.key_id,
            "aws_secret_access_key": self.access.secret, "max_capacity_gb": CAPACITY_GB,
            "eviction": {"eviction_policy": "LRU", "trigger_watermark": 0.8, "eviction_ratio": 0.2},
            "bucket_bound": bucket_bound(self.every_node)}])
    }
}

/// The LMCache objects of a listing of [`PREFIX`]: key inside the prefix
/// to the object.
fn lmcache_objects(listed: Vec<Listed>) -> BTreeMap<String, Listed> {
    listed
        .into_iter()
        .filter_map(|o| {
            let key = o.key.strip_prefix(PREFIX)?.to_string();
            parse_s3_key(&key).ok()?;
            Some((key, o))
        })
        .collect()
}

/// The model of an LMCache key inside the prefix, its cache identity's
/// segment left out (`docs/s3-gateway.md`, "The cache identity in a
/// bucket").
fn model(key: &str) -> String {
    let model = parse_s3_key(key).expect("an LMCache key").model;
    lmcache_s3_gateway::identity::model_of(&model).to_string()
}

/// Lists the prefix every second until stopped: the most LMCache bytes
/// seen, and every LMCache key seen with its size.
struct Sampler {
    stop: Arc<AtomicBool>,
    most: Arc<Mutex<u64>>,
    seen: Arc<Mutex<BTreeMap<String, u64>>>,
    samples: Arc<Mutex<(u64, Vec<String>)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(client: BucketClient) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let most = Arc::new(Mutex::new(0));
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let samples = Arc::new(Mutex::new((0, Vec::new())));
        let (s, m, k, n) = (stop.clone(), most.clone(), seen.clone(), samples.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match client.list(PREFIX) {
                    Ok(listed) => {
                        let objects = lmcache_objects(listed);
                        let bytes: u64 = objects.values().map(|o| o.bytes).sum();
                        let mut most = m.lock().unwrap();
                        *most = (*most).max(bytes);
                        drop(most);
                        k.lock()
                            .unwrap()
                            .extend(objects.into_iter().map(|(key, o)| (key, o.bytes)));
                        n.lock().unwrap().0 += 1;
                    }
                    Err(e) => n.lock().unwrap().1.push(e),
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        Sampler {
            stop,
            most,
            seen,
            samples,
            thread: Some(thread),
        }
    }

    /// The most bytes seen, the bytes of every key seen, and how many
    /// listings were made; panics if one failed.
    fn finish(mut self) -> (u64, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        let (samples, failures) = std::mem::take(&mut *self.samples.lock().unwrap());
        assert!(
            failures.is_empty(),
            "the sampler's listings failed: {failures:?}"
        );
        let most = *self.most.lock().unwrap();
        let written = self.seen.lock().unwrap().values().sum();
        (most, written, samples)
    }
}

/// One node: its directory, ports and model.
struct Node {
    dir: PathBuf,
    mp_port: u16,
    http_port: u16,
    model: &'static str,
}

impl Node {
    fn new(root: &Path, name: &str, model: &'static str) -> Node {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        Node {
            dir,
            mp_port: free_port(),
            http_port: free_port(),
            model,
        }
    }

    /// Starts the node's launch with the shared tier (its server is
    /// waited for with [`Node::wait`]). Several servers start at once on a
    /// small machine: each may take longer than the launch's default 180 s.
    fn launch(&self, tier: &serde_json::Value, round: u32) -> Proc {
        let extra = ["--ready-timeout", "540"];
        let mut cmd =
            BINS.launch_command_for(&self.dir, self.mp_port, self.http_port, self.model, &extra);
        cmd.env("EREBINE_AGENT_LMCACHE_L2_ADAPTER", tier.to_string())
            .env("LMCACHE_TRACK_USAGE", "false");
        Proc::spawn(cmd, &self.dir.join(format!("launch-{round}.log")))
    }

    /// Waits until the server of `launch` answers.
    fn wait(&self, launch: &mut Proc) {
        let url = format!("http://127.0.0.1:{}/status", self.http_port);
        wait_for_status(&url, launch, Duration::from_secs(600));
    }

    /// Stores (and reads back) sequences `start..end`; returns the cold
    /// lookups that hit every chunk.
    fn bench(&self, start: u32, end: u32) -> usize {
        let options = BenchOptions {
            interval: INTERVAL,
            kvcache_shape_spec: Some(ONE_LAYER),
            model: (self.model != "test-model").then_some(self.model),
        };
        let run = run_bench_with(
            &self.dir,
            self.mp_port,
            self.http_port,
            start,
            end,
            &options,
        );
        assert!(run.status.success(), "bench failed:\n{}", run.output);
        run.full_cold_hits()
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

/// Launches every node at once, then waits for each.
fn launch_all(nodes: &[&Node], tier: &serde_json::Value, round: u32) -> Vec<Proc> {
    let mut launches: Vec<Proc> = nodes.iter().map(|n| n.launch(tier, round)).collect();
    for (node, launch) in nodes.iter().zip(&mut launches) {
        node.wait(launch);
    }
    launches
}

/// Checks what a node's gateway and `inspect` say, stops the node, and
/// returns the objects its gateway evicted.
fn check_and_stop(node: &Node, mut launch: Proc, stored: u32) -> u64 {
    let state = gateway_state(&launch);
    let bound = state.bucket_bound.expect("the bucket bound's figures");
    // The lease's holder lists; another node of a store with conditional
    // writes only reports (`docs/s3-gateway.md`, "A fleet on one bucket").
    let follower = bound.mode == Mode::Lease && bound.lease_holder != bound.node;
    assert!(bound.listings >= 1 || follower, "{bound:?}");
    assert_eq!(bound.eviction_failures, 0, "{bound:?}");
    // `inspect` shows the bucket's usage as listed, LMCache's own count
    // (this process's stores only) beside it.
    let tier = node.inspect_tier();
    assert_eq!(tier["used_source"], "bucket", "{tier:#}");
    let lmcache = tier["lmcache_used_bytes"]
        .as_u64()
        .expect("LMCache's count");
    assert!(lmcache <= u64::from(stored) * OBJECT_BYTES, "{tier:#}");
    stop_launch(&mut launch);
    bound.evicted_objects
}

/// The first sequence node `i` stores in `round`.
fn first(round: u32, i: usize) -> u32 {
    1000 * (3 * round + i as u32)
}

/// One fleet at a time: the module's tests run side by side, and two
/// fleets (six LMCache servers, their benches and two stores) on a small
/// machine would slow every listing, which the bound's margin is measured
/// against, with the other fleet's load instead of this one's writes.
static ONE_FLEET: Mutex<()> = Mutex::new(());

/// Three nodes over two rounds with restarts between, then a node of
/// another model, on `store`.
fn a_fleet_keeps_one_bucket_within_its_capacity(store: &Store, root: &Path) {
    let client = store.client();
    // Not LMCache's, under the prefix; LMCache's name, outside it (also
    // under a prefix that only starts like the tier's).
    let foreign: Vec<(String, Vec<u8>)> = vec![
        (
            format!("{PREFIX}notes.txt"),
            b"operator's notes\n".repeat(1000),
        ),
        (
            "other/test-model@01000100@0@00ff".into(),
            vec![7u8; 3 << 20],
        ),
        (
            "fleet-b/test-model@01000100@0@01ff".into(),
            vec![8u8; 1 << 20],
        ),
        ("top-level.bin".into(), vec![9u8; 1 << 20]),
    ];
    for (key, bytes) in &foreign {
        client.put(key, bytes);
    }
    let tier = store.tier();
    let model = "test-model";
    let nodes = [
        Node::new(root, "node-a", model),
        Node::new(root, "node-b", model),
        Node::new(root, "node-c", model),
    ];
    let sampler = Sampler::start(store.client());
    let mut evicted = 0;
    for round in 0..2u32 {
        let launches = launch_all(&nodes.each_ref(), &tier, round);
        std::thread::scope(|scope| {
            for (i, node) in nodes.iter().enumerate() {
                let start = first(round, i);
                scope.spawn(move || node.bench(start, start + SEQUENCES));
            }
        });
        let mut stored = [SEQUENCES; 3];
        if round == 1 {
            // Node B loads chunks node A stored last (newest in the
            // bucket; B never stored them, and its L1 and disk tier
            // never held them): every cold lookup hits, from the bucket
            // through B's own gateway.
            let (a, b) = (&nodes[0], &nodes[1]);
            let extra = first(round, 0) + SEQUENCES;
            a.bench(extra, extra + 2);
            stored[0] += 2;
            let gets = gateway_state(&launches[1]).requests.get;
            assert_eq!(
                b.bench(extra, extra + 2),
                2,
                "node B did not load node A's chunks"
            );
            let loaded = gateway_state(&launches[1]).requests.get - gets;
            assert!(loaded >= 2, "node B's gateway forwarded {loaded} GETs");
        }
        for ((node, launch), stored) in nodes.iter().zip(launches).zip(stored) {
            evicted += check_and_stop(node, launch, stored);
        }
    }
    assert!(evicted > 0, "the gateways evicted nothing");
    other_model_shares_the_bound(store, root, &tier);
    let (most, written, samples) = sampler.finish();
    let capacity = (CAPACITY_GB * GIB) as u64;
    assert!(
        written > capacity * 2,
        "the nodes wrote {written} bytes: too little to test a capacity of {capacity}"
    );
    let limit = capacity + capacity / 20 + OBJECT_BYTES;
    assert!(
        most <= limit,
        "the bucket held {most} bytes, past 1.05 x {capacity} + one object"
    );
    for (key, bytes) in &foreign {
        assert_eq!(&client.get(key), bytes, "{key}");
    }
    eprintln!(
        "bucket bound: capacity {capacity}, written {written}, most held {most} in {samples} samples, evicted {evicted} objects by the first three nodes"
    );
}

/// A fourth node, serving another model, writes under the same prefix:
/// its launch leaves the others' objects alone (the disk tier's purge of
/// other identities does not reach the bucket), its objects count in the
/// same bound, and the oldest objects go first whichever model wrote
/// them: here the first three nodes' oldest, none of its own.
fn other_model_shares_the_bound(store: &Store, root: &Path, tier: &serde_json::Value) {
    let client = store.client();
    let node = Node::new(root, "node-d", OTHER_MODEL);
    let before = lmcache_objects(client.list(PREFIX).unwrap());
    assert!(
        before.keys().all(|k| model(k) == "test-model"),
        "{before:?}"
    );
    let mut launch = node.launch(tier, 0);
    node.wait(&mut launch);
    let at_start = lmcache_objects(client.list(PREFIX).unwrap());
    assert_eq!(
        at_start.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "the launch of another model changed the bucket"
    );
    node.bench(0, OTHER_SEQUENCES);
    let state = gateway_state(&launch);
    let bound = state.bucket_bound.expect("the bucket bound's figures");
    // Its own objects (33.5 MB) stay below the trigger (48.3 MB): it
    // evicted because it counts the other model's objects too.
    assert!(bound.evicted_objects > 0, "{bound:?}");
    assert_eq!(bound.eviction_failures, 0, "{bound:?}");
    stop_launch(&mut launch);
    let after = lmcache_objects(client.list(PREFIX).unwrap());
    let ours: Vec<&String> = after.keys().filter(|k| model(k) == OTHER_MODEL).collect();
    assert_eq!(ours.len(), OTHER_SEQUENCES as usize, "{after:?}");
    // The objects gone are the oldest of those before, by LastModified
    // then key: the rule every gateway applies, whatever the model.
    let mut oldest_first: Vec<(&SystemTime, &String)> =
        before.iter().map(|(k, o)| (&o.modified, k)).collect();
    oldest_first.sort();
    let gone: Vec<bool> = oldest_first
        .iter()
        .map(|(_, k)| !after.contains_key(*k))
        .collect();
    let kept_from = gone.iter().position(|g| !g).unwrap_or(gone.len());
    assert!(kept_from > 0, "none of the first model's objects went");
    assert!(
        gone[kept_from..].iter().all(|g| !g),
        "objects went that were newer than some kept: {oldest_first:?} gone {gone:?}"
    );
}

#[test]
fn three_nodes_restarted_and_a_fourth_model_keep_a_shared_bucket_within_its_capacity_on_s3s_fs() {
    lmcache_tier_e2e::require_lmcache!();
    let _one_fleet = ONE_FLEET.lock().unwrap_or_else(PoisonError::into_inner);
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::s3s_fs(tmp.path());
    a_fleet_keeps_one_bucket_within_its_capacity(&store, tmp.path());
}

#[test]
fn three_nodes_restarted_and_a_fourth_model_keep_a_shared_bucket_within_its_capacity_on_swift() {
    lmcache_tier_e2e::require_lmcache!();
    lmcache_tier_e2e::require_swift!();
    let _one_fleet = ONE_FLEET.lock().unwrap_or_else(PoisonError::into_inner);
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::swift(tmp.path());
    a_fleet_keeps_one_bucket_within_its_capacity(&store, tmp.path());
}
