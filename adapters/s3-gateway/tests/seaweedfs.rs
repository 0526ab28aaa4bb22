//! The gateway against SeaweedFS (`lmcache_tier_e2e::seaweedfs`: a master,
//! three volume servers, a filer and the S3 server of the test's own on
//! loopback, checking every signature): an object PUT through the gateway
//! with its per-launch key is read back through it and is in the bucket,
//! under the tier's prefix, as a client with the store's real key sees it;
//! once the store is dropped, none of its processes is left.

use std::time::{Duration, Instant};

use lmcache_s3_gateway::Gateways;
use lmcache_tier_e2e::bucket::BucketClient;
use lmcache_tier_e2e::processes_mentioning;
use lmcache_tier_e2e::seaweedfs::{SeaweedFs, SEAWEEDFS_REGION};

mod support;
use support::Signer;

const KEY_ID: &str = "AKIASEAWEEDGATEWAY01";
const SECRET: &str = "seaweed-gateway-secret-0123456789abcdefgh";
const BUCKET: &str = "kv-cache";
const PREFIX: &str = "fleet/";

/// `method` on `key` through the gateway, signed with its per-launch key
/// as LMCache signs: the answer's status and body.
async fn through(gateways: &Gateways, method: &str, key: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    let addr = gateways.addresses()[0].1.to_string();
    let pair = gateways.key().unwrap();
    let signer = Signer {
        addr: &addr,
        key_id: &pair.access_key_id,
        secret: &pair.secret_access_key,
        region: SEAWEEDFS_REGION,
    };
    let request = signer.request(&reqwest::Client::new(), method, key, body);
    let answer = request.send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.bytes().await.unwrap().to_vec())
}

#[test]
fn an_object_put_through_the_gateway_is_in_seaweedfs_and_reads_back() {
    lmcache_tier_e2e::require_seaweedfs!();
    let tmp = tempfile::tempdir().unwrap();
    let store = SeaweedFs::start(tmp.path(), (KEY_ID, SECRET), &[BUCKET]);
    // The gateway serves on this runtime's threads while the test blocks.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let spec = serde_json::json!({"type": "s3", "s3_endpoint": store.endpoint(),
        "s3_bucket": BUCKET, "s3_key_prefix": PREFIX, "s3_region": SEAWEEDFS_REGION,
        "disable_tls": true, "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET});
    let args = vec!["--l2-adapter".to_string(), spec.to_string()];
    let (_, gateways) = runtime
        .block_on(Gateways::start_args(&args, &|_| None, None))
        .unwrap();

    let key = format!("test-model@01000100@0@{:064x}", 0x5eed);
    let bytes: Vec<u8> = (0..(1u32 << 20) + 17).map(|i| (i % 251) as u8).collect();
    let (status, body) = runtime.block_on(through(&gateways, "PUT", &key, bytes.clone()));
    assert_eq!(status, 200, "PUT: {}", String::from_utf8_lossy(&body));
    let (status, body) = runtime.block_on(through(&gateways, "GET", &key, Vec::new()));
    assert_eq!(status, 200, "GET: {}", String::from_utf8_lossy(&body));
    assert!(body == bytes, "GET answered {} other bytes", body.len());

    let bucket = BucketClient::new(&store.access(), BUCKET);
    let stored = format!("{PREFIX}{key}");
    let listed = bucket.list(PREFIX).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].key, stored);
    assert_eq!(listed[0].bytes, bytes.len() as u64);
    assert!(bucket.get(&stored) == bytes, "the store holds other bytes");

    drop(gateways);
    drop(runtime);
    let stopping = Instant::now();
    drop(store);
    assert!(stopping.elapsed() < Duration::from_secs(30));
    let left = processes_mentioning(&tmp.path().display().to_string());
    assert!(left.is_empty(), "SeaweedFS processes left: {left:?}");
}
