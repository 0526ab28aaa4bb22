//! The bucket bound against a real S3 server (s3s-fs, which checks every
//! signature and reports each object's file time as its `LastModified`):
//! a bucket left over its capacity (by earlier runs, or other nodes) is
//! brought down to the target at the gateway's start, oldest objects
//! first, and two gateways started on it at once derive the same victims,
//! so together they delete no more than one would. The objects of every
//! model the bound counts (its `bucket_bound.models`, and those written
//! through it) share its capacity; objects that are not LMCache's, those
//! of another tier nested under the prefix, and objects outside the
//! prefix, are left alone. The first listing runs
//! while the gateway already serves, and the bound acts once it is in.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use lmcache_s3_gateway::bound::BoundState;
use lmcache_s3_gateway::Gateways;
use lmcache_tier_e2e::{free_port, S3sFs};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

mod support;
use support::Signer;

const KEY_ID: &str = "AKIAGATEWAYBOUND0001";
const SECRET: &str = "gateway-bound-secret-0123456789abcdefghij";
const MIB: usize = 1 << 20;
/// LMCache objects left in the prefix, 1 MiB each.
const OBJECTS: usize = 10;
/// The lease of the tests that wait for a first holder, which evicts from
/// half a lease after it takes a new lease: 10 s instead of the default
/// 30 (the hand-over test keeps 30, against which "at once" is measured).
const LEASE: u64 = 10;

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
    Gateways::start_args(&args, &|_| None, None)
        .await
        .unwrap()
        .1
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

/// The bound's figures once its usage is at or below its target (at most
/// 60 s): the lease's holder has listed and evicted; another node shows
/// what the holder last published in the lease once it has listed (a
/// usage above 0: the prefix holds objects in this test).
async fn settled(gateways: &Gateways) -> BoundState {
    let started = Instant::now();
    loop {
        let state = gateways.view().states().remove(0);
        let bound = state.bucket_bound.expect("the bound's figures");
        let follower = !bound.lease_holder.is_empty() && bound.lease_holder != bound.node;
        let published = follower && bound.usage_bytes > 0;
        if (bound.listings > 0 || published) && bound.usage_bytes <= bound.spec.target_bytes {
            return bound;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not at the target within 60 s: {bound:?}"
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
        (
            prefix_dir.join("nested-tier").join(key(0)),
            vec![3u8; 2 * MIB],
        ),
        (bucket.join("fleet2").join(key(1)), vec![4u8; MIB]),
    ];
    for (path, bytes) in &foreign {
        write_aged(path, bytes, Duration::from_secs(3600));
    }
    // 8 MiB without an `eviction` block: the gateway evicts from 80%
    // (6.4 MiB) down to 60% (4.8 MiB): of the 10 MiB, the 6 oldest go.
    let spec = serde_json::json!({"type": "s3", "s3_endpoint": format!("127.0.0.1:{}", s3.port),
        "s3_bucket": "kv-cache", "s3_key_prefix": "fleet/", "s3_region": "us-east-1",
        "disable_tls": true, "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET,
        "max_capacity_gb": 8.0 / 1024.0,
        "bucket_bound": {"models": ["test-model", "meta-llama/Llama-3.1-8B"], "lease_seconds": LEASE}});
    let (a, b) = tokio::join!(gateway(&spec), gateway(&spec));
    let (a, b) = tokio::join!(settled(&a), settled(&b));
    // One takes the prefix's lease, lists in the background and evicts;
    // the other only follows the lease, whose body shows the holder's
    // usage.
    for bound in [&a, &b] {
        assert_eq!(bound.spec.capacity_bytes, 8 * MIB as u64, "{bound:?}");
        assert_eq!(bound.eviction_failures, 0, "{bound:?}");
        assert!(bound.evicted_objects <= 6, "{bound:?}");
        assert_eq!(bound.usage_bytes, 4 * MIB as u64, "{bound:?}");
    }
    assert_eq!(a.evicted_objects.max(b.evicted_objects), 6, "{a:?} {b:?}");
    assert_eq!(left(&prefix_dir), [2, 4, 6, 8]);
    for (path, bytes) in &foreign {
        assert_eq!(&std::fs::read(path).unwrap(), bytes, "{}", path.display());
    }
}

/// A TCP proxy in front of a real S3 server that holds every whole
/// listing (a `list-type=2` request without `max-keys=1`) until
/// [`ListingGate::release`], and passes every other request and every
/// answer unchanged. It stands in for a store whose listing takes minutes
/// (a prefix of millions of objects), which s3s-fs cannot be made to be on
/// demand. It reads each request's head and its `content-length` body, so
/// the requests of one kept-alive connection are told apart.
struct ListingGate {
    port: u16,
    open: watch::Sender<bool>,
    held: Arc<AtomicU64>,
}

impl ListingGate {
    async fn start(upstream: u16) -> ListingGate {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (open, watched) = watch::channel(false);
        let held = Arc::new(AtomicU64::new(0));
        let counted = held.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(("127.0.0.1", upstream)).await.unwrap();
                tokio::spawn(relay(client, server, watched.clone(), counted.clone()));
            }
        });
        ListingGate { port, open, held }
    }

    /// Whole listings held so far.
    fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Lets the held listings, and all later ones, through.
    fn release(&self) {
        self.open.send_replace(true);
    }
}

/// Relays one connection: answers as they come, requests one at a time,
/// each whole listing once the gate is open.
async fn relay(
    client: TcpStream,
    server: TcpStream,
    mut open: watch::Receiver<bool>,
    held: Arc<AtomicU64>,
) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    tokio::spawn(async move { tokio::io::copy(&mut from_server, &mut to_client).await });
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let head_end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            match from_client.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let target = head.split(' ').nth(1).unwrap_or_default();
        let query = target.split_once('?').map_or("", |(_, q)| q);
        let params: Vec<&str> = query.split('&').collect();
        if params.contains(&"list-type=2") && !params.contains(&"max-keys=1") {
            held.fetch_add(1, Ordering::Relaxed);
            let _ = open.wait_for(|open| *open).await;
        }
        let body: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let mut request: Vec<u8> = buf.drain(..head_end).collect();
        while buf.len() < body {
            match from_client.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        request.extend(buf.drain(..body));
        if to_server.write_all(&request).await.is_err() {
            return;
        }
    }
}

/// PUTs `bytes` at `key` through the gateway, signed with its per-launch
/// key as LMCache signs; the answer's status.
async fn put_through(gateways: &Gateways, key: &str, bytes: Vec<u8>) -> u16 {
    let addr = gateways.addresses()[0].1.to_string();
    let pair = gateways.key().unwrap();
    let signer = Signer {
        addr: &addr,
        key_id: &pair.access_key_id,
        secret: &pair.secret_access_key,
        region: "us-east-1",
    };
    let request = signer.request(&reqwest::Client::new(), "PUT", key, bytes);
    request.send().await.unwrap().status().as_u16()
}

/// The bound's figures now.
fn figures(gateways: &Gateways) -> BoundState {
    gateways.view().states()[0]
        .bucket_bound
        .clone()
        .expect("the bound's figures")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_serves_while_its_first_listing_runs_and_evicts_once_it_is_in() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3sFs::start(tmp.path(), free_port(), (KEY_ID, SECRET), &["kv-cache"]);
    let prefix_dir = tmp.path().join("s3s-fs/kv-cache/fleet");
    // The old objects, oldest first in key order.
    for i in 0..OBJECTS {
        let age = Duration::from_secs(60 * (OBJECTS - i) as u64);
        write_aged(&prefix_dir.join(key(i)), &vec![i as u8; MIB], age);
    }
    let gate = ListingGate::start(s3.port).await;
    let spec = serde_json::json!({"type": "s3", "s3_endpoint": format!("127.0.0.1:{}", gate.port),
        "s3_bucket": "kv-cache", "s3_key_prefix": "fleet/", "s3_region": "us-east-1",
        "disable_tls": true, "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET,
        "max_capacity_gb": 8.0 / 1024.0,
        "bucket_bound": {"models": ["test-model", "meta-llama/Llama-3.1-8B"], "lease_seconds": LEASE}});
    let gateways = tokio::time::timeout(Duration::from_secs(120), gateway(&spec))
        .await
        .expect("the gateway did not start while its first listing was held");
    // The node alone takes the prefix's lease and starts its first listing
    // (held); from then on its view follows its stores.
    let started = Instant::now();
    while gate.held() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no listing within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // It serves, and follows this node's stores, before the listing is in:
    // 7 MiB of its own, over the trigger (6.4 MiB), and nothing evicted,
    // since its view does not hold the bucket's oldest objects yet.
    let new_key = |i: usize| format!("test-model@01000100@0@{:064x}", 0x100 + i);
    for i in 0..7 {
        assert_eq!(
            put_through(&gateways, &new_key(i), vec![0xa0 + i as u8; MIB]).await,
            200
        );
    }
    let before = figures(&gateways);
    assert_eq!(before.listings, 0, "{before:?}");
    assert_eq!(before.usage_bytes, 7 * MIB as u64, "{before:?}");
    assert_eq!(before.evicted_objects, 0, "{before:?}");
    assert!(gate.held() >= 1, "no listing reached the store");
    assert_eq!(left(&prefix_dir), (0..OBJECTS).collect::<Vec<_>>());
    gate.release();
    // Once in: 17 MiB, brought down to 4.8 MiB or less, oldest first: the
    // 10 old objects the listing showed at once; the new ones, stored while
    // it ran, once the next listing shows them (with their LastModified,
    // not the Date of their PUTs' answers): then the 3 oldest of them.
    let first = after_first_cycle(&gateways).await;
    assert_eq!(first.evicted_objects, 10, "{first:?}");
    let after = until(&gateways, Duration::from_secs(60), |b| {
        b.evicted_objects >= 13 && b.usage_bytes <= b.spec.target_bytes
    })
    .await;
    assert!(after.listings >= 2, "{after:?}");
    assert_eq!(after.evicted_objects, 13, "{after:?}");
    assert_eq!(after.usage_bytes, 4 * MIB as u64, "{after:?}");
    assert!(left(&prefix_dir).is_empty());
    let new_left: Vec<usize> = (0..7)
        .filter(|i| prefix_dir.join(new_key(*i)).exists())
        .collect();
    assert_eq!(new_left, [3, 4, 5, 6]);
}

/// The bound's figures once `done` holds for them (at most `within`).
async fn until(
    gateways: &Gateways,
    within: Duration,
    done: impl Fn(&BoundState) -> bool,
) -> BoundState {
    let started = Instant::now();
    loop {
        let bound = figures(gateways);
        if done(&bound) {
            return bound;
        }
        assert!(
            started.elapsed() < within,
            "not within {within:?}: {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The tier spec of an 8 MiB bound on `fleet/` of the bucket `kv-cache` of
/// the s3s-fs on `port`, with `bucket_bound` as its block.
fn small_bound(port: u16, bucket_bound: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"type": "s3", "s3_endpoint": format!("127.0.0.1:{port}"),
        "s3_bucket": "kv-cache", "s3_key_prefix": "fleet/", "s3_region": "us-east-1",
        "disable_tls": true, "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET,
        "max_capacity_gb": 8.0 / 1024.0, "bucket_bound": bucket_bound})
}

/// A gateway that stops releases the prefix's lease, and the next one to
/// start (here on the same node, as after a restart) takes it over at its
/// first reading, not after the lease (30 s) and a reading period (10 s)
/// as it must for a holder that vanished without a word. Three restarts in
/// a row, each holder writing through its gateway before it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_gateway_hands_the_lease_to_the_next_start_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3sFs::start(tmp.path(), free_port(), (KEY_ID, SECRET), &["kv-cache"]);
    let lease = tmp.path().join("s3s-fs/kv-cache/fleet/.lmcache-tier/lease");
    let spec = small_bound(s3.port, serde_json::json!({"lease_seconds": 30}));
    let holds = |b: &BoundState| b.evictor && b.lease_holder == b.node;
    for run in 0..3 {
        let gateways = gateway(&spec).await;
        let started = Instant::now();
        let bound = until(&gateways, Duration::from_secs(40), holds).await;
        let took = started.elapsed();
        // The first start creates the lease and deletes from half a lease
        // (15 s) after; the next ones take the released lease over.
        let within = Duration::from_secs(if run == 0 { 25 } else { 10 });
        assert!(took < within, "run {run}: took {took:?}");
        assert!(run > 0 || took >= Duration::from_secs(15), "{took:?}");
        assert_eq!(put_through(&gateways, &key(run), vec![1; MIB]).await, 200);
        drop(gateways);
        let body: serde_json::Value = serde_json::from_slice(&std::fs::read(&lease).unwrap())
            .expect("the lease's body is JSON");
        assert_eq!(body["released"], true, "run {run}: {body}");
        assert_eq!(body["holder"], bound.node.as_str(), "run {run}: {body}");
    }
}

/// LMCache's per-launch key reaches no key of the bound's own folder:
/// neither the lease nor a report can be written through the gateway, in
/// any spelling of the key, and the store's copy of the lease is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_s_own_keys_are_out_of_reach_of_the_per_launch_key() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3sFs::start(tmp.path(), free_port(), (KEY_ID, SECRET), &["kv-cache"]);
    let lease = tmp.path().join("s3s-fs/kv-cache/fleet/.lmcache-tier/lease");
    let spec = small_bound(s3.port, serde_json::json!({"lease_seconds": LEASE}));
    let gateways = gateway(&spec).await;
    until(&gateways, Duration::from_secs(20), |b| b.evictor).await;
    let before = std::fs::read(&lease).unwrap();
    let forged = br#"{"node":"ffffffffffffffff","written_bytes":1000000000000000}"#.to_vec();
    for key in [
        ".lmcache-tier/lease",
        ".lmcache-tier/reports/ffffffffffffffff",
        "./.lmcache-tier/lease",
        "m/../.lmcache-tier/lease",
    ] {
        assert_eq!(
            put_through(&gateways, key, forged.clone()).await,
            403,
            "{key}"
        );
    }
    assert_eq!(std::fs::read(&lease).unwrap(), before);
    assert!(!tmp
        .path()
        .join("s3s-fs/kv-cache/fleet/.lmcache-tier/reports/ffffffffffffffff")
        .exists());
}

/// Reports are untrusted input: two whose counters grow by 10^15 bytes at
/// each write, written into the store as any process with the bucket's
/// credentials could (the first reading of a report is the evictor's
/// baseline; growth after it counts), bring listings, and each node is
/// named once; the prefix, below its trigger by its listing, loses
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_that_lies_brings_listings_and_deletes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let prefix_dir = tmp.path().join("s3s-fs/kv-cache/fleet");
    for i in 0..4 {
        let age = Duration::from_secs(600 - i as u64);
        write_aged(&prefix_dir.join(key(2 * i)), &[7; MIB], age);
    }
    let s3 = S3sFs::start(tmp.path(), free_port(), (KEY_ID, SECRET), &["kv-cache"]);
    let spec = small_bound(
        s3.port,
        serde_json::json!({"read_reports_seconds": 1, "models": ["test-model"], "lease_seconds": LEASE}),
    );
    let gateways = gateway(&spec).await;
    let first = until(&gateways, Duration::from_secs(20), |b| b.evictor).await;
    assert_eq!(first.usage_bytes, 4 * MIB as u64, "{first:?}");
    let reports = prefix_dir.join(".lmcache-tier/reports");
    std::fs::create_dir_all(&reports).unwrap();
    let lie = |node: &str, written: u64| {
        let body = serde_json::json!({"node": "not-its-key", "written_bytes": written,
            "recent_bytes": written, "reports": 1, "models": []});
        std::fs::write(reports.join(node), body.to_string()).unwrap();
    };
    let started = Instant::now();
    let mut round = 1;
    while started.elapsed() < Duration::from_secs(8) {
        lie("1111111111111111", round * 10u64.pow(15));
        lie("2222222222222222", round * 10u64.pow(15));
        round += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let after = until(&gateways, Duration::from_secs(20), |b| {
        b.absurd_reports >= 2
    })
    .await;
    assert_eq!(after.absurd_reports, 2, "each node once: {after:?}");
    assert!(after.listings >= first.listings + 2, "{after:?}");
    assert_eq!(after.evicted_objects, 0, "{after:?}");
    let kept = (0..4)
        .filter(|i| prefix_dir.join(key(2 * i)).exists())
        .count();
    assert_eq!(kept, 4);
}
