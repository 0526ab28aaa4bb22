//! Uploads left behind (`docs/s3-gateway.md`, "Uploads left behind"),
//! against real stores that list multipart uploads: SeaweedFS
//! (`lmcache_tier_e2e::seaweedfs`) and moto (`lmcache_tier_e2e::S3Server`,
//! from the LMCache environment). s3s-fs answers ListMultipartUploads
//! `501`, so it gets no sweep and no test here.
//!
//! An upload of an LMCache key started before the gateway (a server killed
//! mid-upload) is aborted once the evictor has seen it for the tier's
//! `bucket_bound.abandoned_upload_seconds`; an upload started after the
//! evictor's first sweep is still live when the first goes, and completes
//! whole; an unfinished upload of a key that is not LMCache's, under the
//! prefix, is never aborted.

use std::time::{Duration, Instant};

use lmcache_s3_gateway::bound::BoundState;
use lmcache_s3_gateway::Gateways;
use lmcache_tier_e2e::bucket::{BucketClient, StoreAccess};
use lmcache_tier_e2e::seaweedfs::{SeaweedFs, SEAWEEDFS_REGION};
use lmcache_tier_e2e::{free_port, S3Server};

const KEY_ID: &str = "AKIAUPLOADSWEEP00001";
const SECRET: &str = "upload-sweep-secret-0123456789abcdefghijk";
const BUCKET: &str = "kv-cache";
const PREFIX: &str = "fleet/";
/// The age after which the evictor aborts an upload it keeps seeing.
const AGE_SECONDS: u64 = 6;

/// An LMCache key inside the prefix.
fn lmcache_key(i: u64) -> String {
    format!("test-model@01000100@0@{i:064x}")
}

/// The bound's figures now.
fn figures(gateways: &Gateways) -> BoundState {
    gateways.view().states()[0]
        .bucket_bound
        .clone()
        .expect("the bound's figures")
}

/// Polls the bound's figures every 50 ms until `ready` (at most 60 s).
fn wait_for(gateways: &Gateways, what: &str, ready: impl Fn(&BoundState) -> bool) -> BoundState {
    let started = Instant::now();
    loop {
        let bound = figures(gateways);
        if ready(&bound) {
            return bound;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not {what} within 60 s: {bound:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The test on a store at `access` holding [`BUCKET`].
fn an_abandoned_upload_is_aborted_after_the_age_and_a_live_one_is_not(access: &StoreAccess) {
    let bucket = BucketClient::new(access, BUCKET);
    let abandoned = format!("{PREFIX}{}", lmcache_key(1));
    let foreign = format!("{PREFIX}notes/unfinished.bin");
    let part = vec![7u8; 5 << 20];
    let abandoned_id = bucket.start_upload(&abandoned, &part);
    let foreign_id = bucket.start_upload(&foreign, &part);

    // The gateway serves on this runtime's threads while the test blocks.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let spec = serde_json::json!({"type": "s3", "s3_endpoint": access.endpoint,
        "s3_bucket": BUCKET, "s3_key_prefix": PREFIX, "s3_region": access.region,
        "disable_tls": true, "aws_access_key_id": access.key_id,
        "aws_secret_access_key": access.secret, "max_capacity_gb": 1,
        "bucket_bound": {"lease_seconds": 3, "abandoned_upload_seconds": AGE_SECONDS,
            "models": ["test-model"]}});
    let args = vec!["--l2-adapter".to_string(), spec.to_string()];
    let (_, gateways) = runtime
        .block_on(Gateways::start_args(&args, &|_| None, None))
        .unwrap();

    wait_for(&gateways, "swept once", |b| b.upload_listings >= 1);
    let live = format!("{PREFIX}{}", lmcache_key(2));
    let live_id = bucket.start_upload(&live, &part);
    let swept = Instant::now();
    let bound = wait_for(&gateways, "aborted the upload left behind", |b| {
        b.uploads_aborted >= 1
    });
    assert!(
        swept.elapsed() >= Duration::from_secs(AGE_SECONDS) - Duration::from_secs(2),
        "aborted {:?} after the first sweep, before its age of {AGE_SECONDS} s",
        swept.elapsed()
    );
    assert_eq!(
        (bound.uploads_aborted, bound.upload_abort_failures),
        (1, 0),
        "{bound:?}"
    );
    let left = bucket.uploads(PREFIX);
    assert!(
        !left.contains(&(abandoned.clone(), abandoned_id)),
        "{left:?}"
    );
    assert!(left.contains(&(live.clone(), live_id.clone())), "{left:?}");
    assert!(left.contains(&(foreign.clone(), foreign_id)), "{left:?}");

    bucket.complete_upload(&live, &live_id);
    assert!(
        bucket.get(&live) == part,
        "the live upload completed to other bytes"
    );
    // The foreign upload outlives several ages: it is never the sweep's.
    std::thread::sleep(Duration::from_secs(AGE_SECONDS + 2));
    let left = bucket.uploads(PREFIX);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].0, foreign);
    drop(gateways);
}

#[test]
fn on_seaweedfs() {
    lmcache_tier_e2e::require_seaweedfs!();
    let tmp = tempfile::tempdir().unwrap();
    let store = SeaweedFs::start(tmp.path(), (KEY_ID, SECRET), &[BUCKET]);
    assert_eq!(store.access().region, SEAWEEDFS_REGION);
    an_abandoned_upload_is_aborted_after_the_age_and_a_live_one_is_not(&store.access());
}

#[test]
fn on_moto() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(tmp.path(), free_port());
    let access = StoreAccess {
        endpoint: format!("127.0.0.1:{}", server.port),
        region: "us-east-1".to_string(),
        key_id: KEY_ID.to_string(),
        secret: SECRET.to_string(),
    };
    BucketClient::new(&access, BUCKET).create_bucket();
    an_abandoned_upload_is_aborted_after_the_age_and_a_live_one_is_not(&access);
}
