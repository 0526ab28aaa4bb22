//! The cache identity on the tiers that outlive a server, with the real
//! LMCache server and its CPU bench: a bucket shared by launches of one
//! `--model` keeps each identity's objects apart (s3s-fs and SeaweedFS),
//! and the disk tier is purged, naming the commit, when the weights behind
//! the model change (`docs/configuration.md`, "The cache identity";
//! `docs/s3-gateway.md`, "The cache identity in a bucket").

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use lmcache_s3_gateway::identity;
use lmcache_tier_e2e::bucket::{BucketClient, StoreAccess};
use lmcache_tier_e2e::seaweedfs::SeaweedFs;
use lmcache_tier_e2e::{
    binaries, data_objects, free_port, run_one_layer_bench, stop_launch, wait_for_status, BenchRun,
    Binaries, Proc, S3sFs,
};

const BINS: Binaries = binaries!();
const BUCKET: &str = "kv-cache";
const PREFIX: &str = "fleet/";
const KEY: (&str, &str) = (
    "AKIAE2EIDENTITYKEY01",
    "e2e-identity-secret-0123456789abcdefghij",
);
/// The chunks of the bench's sequences 0..4 at `--chunk-size 32`: 4
/// sequences of 1024 tokens.
const CHUNKS: usize = 4 * 1024 / 32;

/// A launch in `dir/<name>` with the bucket tier alone (so every hit of
/// its bench comes from the bucket) and `extra` engine flags; the CPU
/// bench's sequences 0..4 run against it (one layer: the objects, keys and
/// hits of the default shape at 1/32 of the bytes), and it is stopped once
/// the bucket holds `settled` LMCache objects and has not changed for 5 s
/// (at once where `settled` is `None`: a node that only reads).
fn bench_node(
    dir: &Path,
    name: &str,
    store: &StoreAccess,
    extra: &[&str],
    settled: Option<usize>,
) -> BenchRun {
    let node = dir.join(name);
    std::fs::create_dir_all(&node).unwrap();
    let (mp_port, http_port) = (free_port(), free_port());
    let tier = serde_json::json!({"type": "s3", "s3_endpoint": store.endpoint,
        "s3_bucket": BUCKET, "s3_key_prefix": PREFIX, "s3_region": store.region,
        "disable_tls": true, "aws_access_key_id": store.key_id,
        "aws_secret_access_key": store.secret});
    let mut cmd = BINS.launch_command(&node, mp_port, http_port, extra);
    cmd.env(
        "EREBINE_AGENT_LMCACHE_L2_ADAPTER",
        serde_json::json!([tier]).to_string(),
    )
    .env("EREBINE_AGENT_LMCACHE_EXTRA_ARGS", "--chunk-size 32")
    .env("LMCACHE_TRACK_USAGE", "false");
    let mut launch = Proc::spawn(cmd, &node.join("launch.log"));
    let url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_status(&url, &mut launch, Duration::from_secs(300));
    let run = run_one_layer_bench(&node, mp_port, http_port, 0, 4);
    assert!(
        run.status.success(),
        "{name}: bench failed:\n{}",
        run.output
    );
    if let Some(settled) = settled {
        settle(&BucketClient::new(store, BUCKET), settled);
    }
    stop_launch(&mut launch);
    run
}

/// The LMCache objects under [`PREFIX`] (keys with an `@`).
fn objects(bucket: &BucketClient) -> Vec<String> {
    let listed = bucket.list(PREFIX).unwrap_or_default();
    let keys = listed.into_iter().map(|o| o.key);
    keys.filter(|key| key.contains('@')).collect()
}

/// Waits until the bucket holds at least `expected` LMCache objects and
/// they have not changed for 5 s, at most 120 s.
fn settle(bucket: &BucketClient, expected: usize) {
    let started = Instant::now();
    let mut last = objects(bucket);
    let mut same_since = Instant::now();
    while (last.len() < expected || same_since.elapsed() < Duration::from_secs(5))
        && started.elapsed() < Duration::from_secs(120)
    {
        std::thread::sleep(Duration::from_millis(500));
        let now = objects(bucket);
        if now != last {
            (last, same_since) = (now, Instant::now());
        }
    }
}

/// The identity tags of the objects under [`PREFIX`], each with its count;
/// panics on an object outside an identity's segment.
fn tags(bucket: &BucketClient) -> Vec<(String, usize)> {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for key in objects(bucket) {
        let inside = key.strip_prefix(PREFIX).unwrap();
        let (Some(tag), rest) = identity::split(inside) else {
            panic!("{key} is not under an identity's segment");
        };
        assert!(rest.starts_with("test-model@"), "{key}");
        *counts.entry(tag.to_string()).or_default() += 1;
    }
    counts.into_iter().collect()
}

/// Node A stores the bench's chunks; node B runs the same `--model` with
/// another `--kv-cache-dtype`, and its bench finds none of them (before,
/// it would have read A's bytes as its own); node C runs A's identity and
/// finds every one, so a fleet of one identity still shares.
fn identities_are_kept_apart(dir: &Path, store: &StoreAccess) {
    let bucket = BucketClient::new(store, BUCKET);
    let a = bench_node(dir, "node-a", store, &[], Some(CHUNKS));
    assert_eq!(a.full_cold_hits(), 0, "{}", a.output);
    let after_a = tags(&bucket);
    assert_eq!(after_a.len(), 1, "{after_a:?}");
    assert!(after_a[0].1 >= CHUNKS, "{after_a:?}");
    let b = bench_node(
        dir,
        "node-b",
        store,
        &["--kv-cache-dtype", "fp8"],
        Some(2 * CHUNKS),
    );
    assert_eq!(b.full_cold_hits(), 0, "fp8 read auto's KV:\n{}", b.output);
    let after_b: BTreeSet<String> = tags(&bucket).into_iter().map(|(t, _)| t).collect();
    assert_eq!(after_b.len(), 2, "{after_b:?}");
    let c = bench_node(dir, "node-c", store, &[], None);
    assert_eq!(c.full_cold_hits(), 4, "{}", c.output);
}

#[test]
fn launches_of_one_model_with_another_kv_dtype_never_read_each_others_objects_in_s3s_fs() {
    lmcache_tier_e2e::require_lmcache!();
    lmcache_tier_e2e::require_s3s_fs!();
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3sFs::start(tmp.path(), free_port(), KEY, &[BUCKET]);
    let store = StoreAccess {
        endpoint: format!("127.0.0.1:{}", s3.port),
        region: "us-east-1".into(),
        key_id: KEY.0.into(),
        secret: KEY.1.into(),
    };
    identities_are_kept_apart(tmp.path(), &store);
}

#[test]
fn launches_of_one_model_with_another_kv_dtype_never_read_each_others_objects_in_seaweedfs() {
    lmcache_tier_e2e::require_lmcache!();
    lmcache_tier_e2e::require_seaweedfs!();
    let tmp = tempfile::tempdir().unwrap();
    let seaweed = SeaweedFs::start(tmp.path(), KEY, &[BUCKET]);
    identities_are_kept_apart(tmp.path(), &seaweed.access());
}

/// A hub id whose `main` moves to another commit between two launches (the
/// engine would load other weights under the same `--model`): the second
/// launch purges the disk tier and names both commits, where before it
/// kept every object.
#[test]
fn a_hub_id_at_a_new_commit_purges_the_disk_tier_naming_both_commits() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let hub = dir.join("hub");
    let refs = hub.join("models--test-model").join("refs");
    std::fs::create_dir_all(&refs).unwrap();
    let (old, new) = ("a1".repeat(20), "c3".repeat(20));
    let launch = |commit: &str| {
        std::fs::write(refs.join("main"), commit).unwrap();
        let (mp_port, http_port) = (free_port(), free_port());
        let mut cmd = BINS.launch_command(dir, mp_port, http_port, &[]);
        cmd.env("HF_HUB_CACHE", &hub)
            .env("HF_HUB_OFFLINE", "1")
            .env("LMCACHE_TRACK_USAGE", "false");
        let mut launch = Proc::spawn(cmd, &dir.join(format!("launch-{commit}.log")));
        let url = format!("http://127.0.0.1:{http_port}/status");
        wait_for_status(&url, &mut launch, Duration::from_secs(300));
        (launch, mp_port, http_port)
    };
    let (mut first, mp_port, http_port) = launch(&old);
    let run = run_one_layer_bench(dir, mp_port, http_port, 0, 2);
    assert!(run.status.success(), "{}", run.output);
    let cache = dir.join("cache");
    let started = Instant::now();
    while data_objects(&cache).is_empty() && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
    }
    stop_launch(&mut first);
    let stored = data_objects(&cache);
    assert!(!stored.is_empty(), "{}", first.output());
    let (mut second, ..) = launch(&new);
    stop_launch(&mut second);
    let log = second.output();
    let change = format!(r#"weights "commit {old}" -> "commit {new}""#);
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("purged 100%") && l.contains(&change)),
        "{log}"
    );
    assert!(
        data_objects(&cache).is_empty(),
        "{:?}",
        data_objects(&cache)
    );
}

/// An operator's own `fs` tier: the first launch adopts it and writes its
/// manifest; a launch with another `--kv-cache-dtype` purges it whole,
/// naming the field, before its server starts.
#[test]
fn a_custom_fs_tier_is_fenced_by_its_manifest_and_purged_under_another_kv_dtype() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let tier = dir.join("operator-tier");
    let launch = |extra: &[&str], name: &str| {
        let (mp_port, http_port) = (free_port(), free_port());
        let mut cmd = BINS.launch_command(dir, mp_port, http_port, extra);
        cmd.env(
            "EREBINE_AGENT_LMCACHE_L2_ADAPTER",
            serde_json::json!([{"type": "fs", "base_path": tier}]).to_string(),
        )
        .env("LMCACHE_TRACK_USAGE", "false");
        let mut launch = Proc::spawn(cmd, &dir.join(format!("{name}.log")));
        let url = format!("http://127.0.0.1:{http_port}/status");
        wait_for_status(&url, &mut launch, Duration::from_secs(300));
        (launch, mp_port, http_port)
    };
    let (mut first, mp_port, http_port) = launch(&[], "first");
    assert!(tier.join(".lmcache-tier-identity.json").is_file());
    let run = run_one_layer_bench(dir, mp_port, http_port, 0, 2);
    assert!(run.status.success(), "{}", run.output);
    let started = Instant::now();
    while data_objects(&tier).is_empty() && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
    }
    stop_launch(&mut first);
    assert!(!data_objects(&tier).is_empty(), "{}", first.output());
    let (mut second, ..) = launch(&["--kv-cache-dtype", "fp8"], "second");
    stop_launch(&mut second);
    let log = second.output();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("L2 tier 0")
            && l.contains(r#"kv_cache_dtype "auto" -> "fp8""#)),
        "{log}"
    );
    assert!(data_objects(&tier).is_empty(), "{:?}", data_objects(&tier));
}
