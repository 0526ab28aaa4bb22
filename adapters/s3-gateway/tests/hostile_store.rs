//! The bucket bound against stores that refuse or lie (`docs/s3-gateway.md`,
//! "The bucket bound"): a real S3 server (s3s-fs, which checks every
//! signature, or moto, which lists keys as AWS does) behind the e2e kit's
//! hostile store where the fault is one no real server produces on demand
//! (pages that never end, refused deletions, sizes past any object's, slow
//! pages).
//!
//! - A prefix counts only its own: another tier's keys nested under it, or
//!   beside it under a longer prefix, are neither counted nor deleted.
//! - A listing is bounded: pages that never end fail it, loudly, and
//!   nothing is evicted on it.
//! - Refused deletions back off, are said once a minute, and the log holds
//!   none of the store's headers.
//! - A key XML cannot carry is listed URL-encoded and skipped as foreign.
//! - Listed sizes past 5 TiB are the store's fault: said once, never summed.
//! - A slow or failing store is named for what it is, not for a
//!   permission.
//!
//! The tests share one log (the gateway logs through `tracing`), so they run
//! one at a time.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use lmcache_s3_gateway::bound::BoundState;
use lmcache_s3_gateway::Gateways;
use lmcache_tier_e2e::hostile_store::{
    HostileStore, StoreFault, HUGE_SIZE, NOISY_HEADER, REQUEST_ID,
};
use lmcache_tier_e2e::{free_port, S3sFs};

const KEY_ID: &str = "AKIAHOSTILESTORE0001";
const SECRET: &str = "hostile-store-secret-0123456789abcdefghij";
const BUCKET: &str = "kv-cache";
const MIB: usize = 1 << 20;

/// What the gateways of this binary logged.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

/// The log, emptied, and this test's turn: one test at a time.
fn turn() -> (MutexGuard<'static, ()>, Log) {
    static TURN: Mutex<()> = Mutex::new(());
    static LOG: OnceLock<Log> = OnceLock::new();
    let guard = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let log = LOG
        .get_or_init(|| {
            let log = Log::default();
            let writer = log.clone();
            tracing_subscriber::fmt()
                .with_writer(move || writer.clone())
                .with_ansi(false)
                .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
                .init();
            log
        })
        .clone();
    log.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    (guard, log)
}

/// An LMCache key of `model`.
fn key(model: &str, i: usize) -> String {
    format!("{model}@01000100@0@{i:064x}")
}

/// Writes `bytes` at `path` (a key under s3s-fs's bucket directory) with
/// `age` before now as its `LastModified`.
fn write_aged(path: &Path, bytes: &[u8], age: Duration) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - age).unwrap();
}

/// The tier spec of a bound of `capacity_mib` on `endpoint`, under
/// `prefix`, counting `test-model` from its start.
fn spec(endpoint: &str, prefix: &str, capacity_mib: usize) -> serde_json::Value {
    serde_json::json!({"type": "s3", "s3_endpoint": endpoint, "s3_bucket": BUCKET,
        "s3_key_prefix": prefix, "s3_region": "us-east-1", "disable_tls": true,
        "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET,
        "max_capacity_gb": capacity_mib as f64 / 1024.0,
        "bucket_bound": {"models": ["test-model"], "lease_seconds": 3}})
}

/// A runtime that serves gateways while the test blocks.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn start(runtime: &tokio::runtime::Runtime, spec: &serde_json::Value) -> Gateways {
    let args = vec!["--l2-adapter".to_string(), spec.to_string()];
    runtime
        .block_on(Gateways::start_args(&args, &|_| None, None))
        .expect("the gateway starts")
        .1
}

fn figures(gateways: &Gateways) -> BoundState {
    gateways.view().states()[0]
        .bucket_bound
        .clone()
        .expect("the bound's figures")
}

/// Polls the bound's figures every 50 ms until `ready` (at most `limit`).
fn wait_for(
    gateways: &Gateways,
    limit: Duration,
    what: &str,
    ready: impl Fn(&BoundState) -> bool,
) -> BoundState {
    let started = Instant::now();
    loop {
        let bound = figures(gateways);
        if ready(&bound) {
            return bound;
        }
        assert!(
            started.elapsed() < limit,
            "not {what} within {limit:?}: {bound:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// s3s-fs with `own` objects of `test-model` (1 MiB each, oldest first)
/// under `prefix`.
fn filled_store(dir: &Path, prefix: &str, own: usize) -> S3sFs {
    let s3 = S3sFs::start(dir, free_port(), (KEY_ID, SECRET), &[BUCKET]);
    let bucket = dir.join("s3s-fs").join(BUCKET);
    for i in 0..own {
        let age = Duration::from_secs(600 - 10 * i as u64);
        write_aged(
            &bucket.join(format!("{prefix}{}", key("test-model", i))),
            &[i as u8; MIB],
            age,
        );
    }
    s3
}

#[test]
fn a_bound_counts_and_deletes_only_its_own_tiers_keys_whatever_its_prefix() {
    lmcache_tier_e2e::require_s3s_fs!();
    let (_turn, _log) = turn();
    for prefix in ["p/", ""] {
        let tmp = tempfile::tempdir().unwrap();
        let s3 = filled_store(tmp.path(), prefix, 10);
        let bucket = tmp.path().join("s3s-fs").join(BUCKET);
        // Other tiers' objects, older than all of this tier's: a tier
        // nested under the prefix, one under a longer prefix that starts
        // like it, one whose model starts like this one's.
        let others = [
            format!("{prefix}nested/{}", key("test-model", 0)),
            format!("p2/{}", key("test-model", 1)),
            format!("px{}", key("test-model", 2)),
            format!("{prefix}{}", key("xtest-model", 3)),
        ];
        for other in &others {
            write_aged(&bucket.join(other), &[7; MIB], Duration::from_secs(3600));
        }
        let runtime = runtime();
        // 10 MiB of its own on 10 MiB: from 8 MiB down to 6 MiB, the 4
        // oldest of its own go, and nothing of the others.
        let gateways = start(
            &runtime,
            &spec(&format!("127.0.0.1:{}", s3.port), prefix, 10),
        );
        wait_for(&gateways, Duration::from_secs(60), "evicted", |b| {
            b.evicted_objects >= 4
        });
        std::thread::sleep(Duration::from_secs(1));
        let bound = figures(&gateways);
        assert_eq!(
            (bound.evicted_objects, bound.objects),
            (4, 6),
            "{prefix:?}: {bound:?}"
        );
        assert_eq!(bound.usage_bytes, 6 * MIB as u64, "{prefix:?}: {bound:?}");
        assert!(bound.listing_skipped >= 2, "{prefix:?}: {bound:?}");
        for other in &others {
            assert!(bucket.join(other).is_file(), "{prefix:?}: {other} deleted");
        }
        drop(gateways);
        drop(runtime);
    }
}

#[test]
fn a_store_whose_pages_never_end_fails_the_listing_loudly_and_nothing_is_evicted() {
    lmcache_tier_e2e::require_s3s_fs!();
    let (_turn, log) = turn();
    let tmp = tempfile::tempdir().unwrap();
    let s3 = filled_store(tmp.path(), "p/", 10);
    let store = HostileStore::start(s3.port);
    for (fresh_tokens, limit) in [
        (false, "a continuation token it gave before"),
        (true, "limit of 5000 pages"),
    ] {
        store.set(StoreFault::EndlessPages { fresh_tokens });
        let runtime = runtime();
        let gateways = start(
            &runtime,
            &spec(&format!("127.0.0.1:{}", store.port), "p/", 10),
        );
        let bound = wait_for(
            &gateways,
            Duration::from_secs(120),
            "a failed listing",
            |b| b.listing_failures >= 1,
        );
        assert_eq!((bound.listings, bound.evicted_objects), (0, 0), "{bound:?}");
        assert!(
            log.text().contains(limit),
            "no {limit:?} in the log:\n{}",
            log.text()
        );
        drop(gateways);
        drop(runtime);
    }
    assert!(
        store.listing_pages() <= 5_000 + 10,
        "{} pages: the listing was not bounded",
        store.listing_pages()
    );
}

#[test]
fn refused_deletions_back_off_are_said_once_a_minute_and_no_header_is_logged() {
    lmcache_tier_e2e::require_s3s_fs!();
    let (_turn, log) = turn();
    for status in [403, 500] {
        log.0.lock().unwrap().clear();
        let tmp = tempfile::tempdir().unwrap();
        let s3 = filled_store(tmp.path(), "p/", 40);
        let store = HostileStore::start(s3.port);
        store.set(StoreFault::RefuseDeletes(status));
        let runtime = runtime();
        let gateways = start(
            &runtime,
            &spec(&format!("127.0.0.1:{}", store.port), "p/", 10),
        );
        std::thread::sleep(Duration::from_secs(15));
        let bound = figures(&gateways);
        let deletes = store.deletes();
        drop(gateways);
        drop(runtime);
        // The start-up probe's one DELETE, then, backing off from 1 s (at
        // least half of 1, 2, 4 and 8 s), at most 5 cycles in 15 s, each
        // ended by its first batch of 8 (the SDK tries a 500 three times).
        let attempts = if status == 500 { 3 } else { 1 };
        assert!(deletes >= 8, "{status}: {deletes} DELETEs");
        assert!(
            deletes <= (1 + 5 * 8) * attempts,
            "{status}: {deletes} DELETEs in 15 s"
        );
        assert_eq!(bound.evicted_objects, 0, "{bound:?}");
        assert!(bound.eviction_failures >= 8, "{bound:?}");
        let text = log.text();
        let warnings = text
            .lines()
            .filter(|l| l.contains("refused") && l.contains("deletions"))
            .count();
        assert_eq!(
            warnings, 1,
            "{status}: said {warnings} times in 15 s:\n{text}"
        );
        assert!(text.contains(&format!("answered {status}")), "{text}");
        assert!(text.contains(&format!("request id {REQUEST_ID}")), "{text}");
        assert!(
            !text.contains(NOISY_HEADER.1),
            "a header in the log:\n{text}"
        );
        assert!(
            text.lines().all(|l| l.len() < 1_000),
            "a long line:\n{text}"
        );
    }
}

#[test]
fn listed_sizes_past_any_objects_are_said_once_and_never_summed() {
    lmcache_tier_e2e::require_s3s_fs!();
    let (_turn, log) = turn();
    let tmp = tempfile::tempdir().unwrap();
    let s3 = filled_store(tmp.path(), "p/", 3);
    let store = HostileStore::start(s3.port);
    store.set(StoreFault::HugeSizes);
    let runtime = runtime();
    let gateways = start(
        &runtime,
        &spec(&format!("127.0.0.1:{}", store.port), "p/", 10),
    );
    let bound = wait_for(&gateways, Duration::from_secs(60), "listed", |b| {
        b.listings >= 1
    });
    assert_eq!(
        (bound.oversized_objects, bound.objects, bound.usage_bytes),
        (3, 0, 0),
        "{bound:?}"
    );
    assert_eq!(bound.evicted_objects, 0, "{bound:?}");
    let text = log.text();
    assert_eq!(text.matches("sizes past 5 TiB").count(), 1, "{text}");
    assert!(text.contains(&HUGE_SIZE.to_string()), "{text}");
}

#[test]
fn a_slow_store_is_named_for_its_time_and_serves_while_the_bound_waits() {
    lmcache_tier_e2e::require_s3s_fs!();
    let (_turn, log) = turn();
    let tmp = tempfile::tempdir().unwrap();
    let s3 = filled_store(tmp.path(), "p/", 2);
    let store = HostileStore::start(s3.port);
    store.set(StoreFault::SlowPages(Duration::from_secs(20)));
    let runtime = runtime();
    let started = Instant::now();
    let gateways = start(
        &runtime,
        &spec(&format!("127.0.0.1:{}", store.port), "p/", 10),
    );
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "started after {:?}",
        started.elapsed()
    );
    let text = log.text();
    assert!(text.contains("no answer within 15 s"), "{text}");
    assert!(
        !text.contains("s3:ListBucket"),
        "a permission guess:\n{text}"
    );
    let bound = wait_for(&gateways, Duration::from_secs(60), "listed", |b| {
        b.listings >= 1
    });
    assert_eq!(bound.objects, 2, "{bound:?}");
}

#[test]
fn a_key_xml_cannot_carry_is_listed_encoded_and_skipped_as_foreign() {
    lmcache_tier_e2e::require_lmcache!();
    let (_turn, _log) = turn();
    let tmp = tempfile::tempdir().unwrap();
    let moto = lmcache_tier_e2e::S3Server::start(tmp.path(), free_port());
    moto.create_bucket(BUCKET);
    let access = lmcache_tier_e2e::bucket::StoreAccess {
        endpoint: format!("127.0.0.1:{}", moto.port),
        region: "us-east-1".into(),
        key_id: KEY_ID.into(),
        secret: SECRET.into(),
    };
    let bucket = lmcache_tier_e2e::bucket::BucketClient::new(&access, BUCKET);
    bucket.put("p/foreign\u{1}key", b"x");
    bucket.put("p/a+b c%41", b"x");
    for i in 0..3 {
        bucket.put(&format!("p/{}", key("test-model", i)), &[1; 1024]);
    }
    let runtime = runtime();
    let gateways = start(&runtime, &spec(&access.endpoint, "p/", 10));
    let bound = wait_for(&gateways, Duration::from_secs(60), "listed", |b| {
        b.listings >= 1
    });
    assert_eq!(
        (bound.objects, bound.usage_bytes),
        (3, 3 * 1024),
        "{bound:?}"
    );
    assert_eq!(bound.listing_skipped, 2, "{bound:?}");
    assert_eq!(bound.listing_failures, 0, "{bound:?}");
}
