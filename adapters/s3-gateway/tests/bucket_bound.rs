//! The bucket bound against a real S3 server (s3s-fs, which checks every
//! signature and reports each object's file time as its `LastModified`):
//! a bucket left over its capacity (by earlier runs, or other nodes) is
//! brought down to the target at the gateway's start, oldest objects
//! first, and two gateways started on it at once derive the same victims,
//! so together they delete no more than one would. Every model's objects
//! under the prefix share its capacity; objects that are not LMCache's,
//! and objects outside the prefix, are left alone.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use lmcache_s3_gateway::bound::BoundState;
use lmcache_s3_gateway::Gateways;
use lmcache_tier_e2e::{free_port, S3sFs};

const KEY_ID: &str = "AKIAGATEWAYBOUND0001";
const SECRET: &str = "gateway-bound-secret-0123456789abcdefghij";
const MIB: usize = 1 << 20;
/// LMCache objects left in the prefix, 1 MiB each.
const OBJECTS: usize = 10;

/// The `i`th LMCache object's key: the odd ones of another model (a node
/// that serves another model under the same prefix).
fn key(i: usize) -> String {
    let model = match i % 2 {
        0 => "test-model",
        _ => "meta-llama/Llama-3.1-8B",
    };
    format!("{model}@01000100@0@{i:064x}")
}

/// Writes `bytes` at `path` with `age` before now as its file time (what
/// s3s-fs lists as `LastModified`).
fn write_aged(path: &Path, bytes: &[u8], age: Duration) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - age).unwrap();
}

/// Starts one gateway for the tier `spec`.
async fn gateway(spec: &serde_json::Value) -> Gateways {
    let args = vec!["--l2-adapter".to_string(), spec.to_string()];
    Gateways::start_args(&args, &|_| None).await.unwrap().1
}

/// The bound's figures once its first eviction cycle has ended (at most
/// 60 s).
async fn after_first_cycle(gateways: &Gateways) -> BoundState {
    let started = Instant::now();
    loop {
        let state = gateways.view().states().remove(0);
        let bound = state.bucket_bound.expect("the bound's figures");
        if bound.evicted_objects + bound.eviction_failures > 0 {
            return bound;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no eviction within 60 s: {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The LMCache objects left in `prefix_dir`, by index.
fn left(prefix_dir: &Path) -> Vec<usize> {
    (0..OBJECTS)
        .filter(|i| prefix_dir.join(key(*i)).exists())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_over_its_capacity_loses_its_oldest_objects_once_at_start_of_two_gateways() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3sFs::start(tmp.path(), free_port(), (KEY_ID, SECRET), &["kv-cache"]);
    let bucket: PathBuf = tmp.path().join("s3s-fs/kv-cache");
    let prefix_dir = bucket.join("fleet");
    // Oldest first, in an order that is not the keys' order.
    let by_age = [3, 7, 1, 9, 5, 0, 2, 4, 6, 8];
    for (rank, i) in by_age.into_iter().enumerate() {
        let age = Duration::from_secs(60 * (OBJECTS - rank) as u64);
        write_aged(&prefix_dir.join(key(i)), &vec![i as u8; MIB], age);
    }
    let foreign = [
        (prefix_dir.join("notes.txt"), vec![1u8; 3 * MIB]),
        (bucket.join("other").join(key(0)), vec![2u8; MIB]),
    ];
    for (path, bytes) in &foreign {
        write_aged(path, bytes, Duration::from_secs(3600));
    }
    // 8 MiB without an `eviction` block: the gateway evicts from 80%
    // (6.4 MiB) down to 60% (4.8 MiB): of the 10 MiB, the 6 oldest go.
    let spec = serde_json::json!({"type": "s3", "s3_endpoint": format!("127.0.0.1:{}", s3.port),
        "s3_bucket": "kv-cache", "s3_key_prefix": "fleet/", "s3_region": "us-east-1",
        "disable_tls": true, "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET,
        "max_capacity_gb": 8.0 / 1024.0});
    let (a, b) = tokio::join!(gateway(&spec), gateway(&spec));
    let (a, b) = tokio::join!(after_first_cycle(&a), after_first_cycle(&b));
    for bound in [&a, &b] {
        assert_eq!(bound.spec.capacity_bytes, 8 * MIB as u64, "{bound:?}");
        assert_eq!(bound.eviction_failures, 0, "{bound:?}");
        assert_eq!(bound.evicted_objects, 6, "{bound:?}");
        assert_eq!(bound.usage_bytes, 4 * MIB as u64, "{bound:?}");
    }
    assert_eq!(left(&prefix_dir), [2, 4, 6, 8]);
    for (path, bytes) in &foreign {
        assert_eq!(&std::fs::read(path).unwrap(), bytes, "{}", path.display());
    }
}
