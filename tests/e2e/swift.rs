//! End to end: OpenStack Swift (s3api, tempauth) as the store of `s3_bucket`
//! tiers (`docs/s3-gateway.md`, "OpenStack Swift"). A Swift-All-In-One of
//! the test's own ([`Swift`]) behind real launches with LMCache's CPU bench
//! and behind `erebine-lmcache bench l2`, and one test per way Swift differs
//! from S3 that the gateway must handle: completes it answers slowly, parts
//! it keeps after an overwrite, credentials it revokes, and the region and
//! account its start-up check meets.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use aws_credential_types::Credentials;
use lmcache_s3_gateway::sigv4::s3_signature;
use lmcache_s3_gateway::state::{GatewayState, STATE_PATH};
use lmcache_s3_gateway::Gateways;
use lmcache_tier_e2e::swift::{Swift, SwiftOptions, KV, OTHER, SWIFT_REGION};
use lmcache_tier_e2e::{
    bench_command, binaries, free_port, get_json, get_text, lmcache_venv, run_one_layer_bench,
    stop_launch, wait_for_status, BenchRun, Binaries, Proc,
};

const BINS: Binaries = binaries!();
const BUCKET: &str = "kv-cache";

/// An `s3_bucket` tier on `swift` in [`BUCKET`], signed as [`KV`].
fn swift_tier(swift: &Swift) -> serde_json::Value {
    serde_json::json!({"type": "s3", "s3_endpoint": swift.endpoint(), "s3_bucket": BUCKET,
        "s3_region": SWIFT_REGION, "disable_tls": true, "s3_prefer_http2": false,
        "aws_access_key_id": KV.access_key_id(), "aws_secret_access_key": KV.key})
}

/// The LMCache objects of [`BUCKET`] (keys with an `@`), by name.
fn lmcache_objects(swift: &Swift) -> Vec<(String, u64)> {
    swift
        .list(&KV, BUCKET)
        .into_iter()
        .filter(|(name, _)| name.contains('@'))
        .collect()
}

#[test]
fn a_launch_stores_and_loads_the_cpu_benchs_chunks_in_swift_and_bench_l2_round_trips() {
    lmcache_tier_e2e::require_lmcache!();
    lmcache_tier_e2e::require_swift!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let swift = Swift::start(dir, SwiftOptions::default());
    swift.create_bucket(&KV, BUCKET);

    // bench l2: 4 objects of 32 MiB (multipart uploads), stored and loaded.
    let mut cmd = Command::new(BINS.erebine_lmcache());
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .env("VIRTUAL_ENV", lmcache_venv())
        .env("LMCACHE_TRACK_USAGE", "false")
        .args([
            "bench",
            "l2",
            "--l2-adapter",
            &swift_tier(&swift).to_string(),
        ])
        .args(["--num-keys", "4", "--rounds", "1", "--warmup-rounds", "0"])
        .args(["--data-size-kb", "32768", "--no-skip-verify"]);
    let mut bench = Proc::spawn(cmd, &dir.join("bench-l2.log"));
    let status = bench
        .wait_timeout(Duration::from_secs(300))
        .unwrap_or_else(|| panic!("bench l2 still running:\n{}", bench.output()));
    let output = bench.output();
    assert!(status.success(), "{output}");
    assert!(output.contains("success_keys=4/4"), "{output}");
    assert!(output.contains("loaded=4/4"), "{output}");
    let stored = lmcache_objects(&swift);
    assert_eq!(stored.len(), 4, "{stored:?}");
    assert!(
        stored.iter().all(|(_, bytes)| *bytes == 32 << 20),
        "{stored:?}"
    );

    // A launch: the CPU bench stores through the gateway into Swift; a
    // second node, with a cache directory of its own, loads every chunk
    // from there.
    let expected = stored.len() + 4 * SEQUENCE_CHUNKS;
    let store = run_node(dir, &swift, "node-a", 0, 4, Some(expected));
    assert!(store.status.success(), "bench failed:\n{}", store.output);
    let after_store = lmcache_objects(&swift);
    assert_eq!(after_store.len(), expected, "{after_store:?}");
    let load = run_node(dir, &swift, "node-b", 0, 4, None);
    assert!(load.status.success(), "bench failed:\n{}", load.output);
    assert_eq!(load.full_cold_hits(), 4, "{}", load.output);
}

/// The chunks of one CPU-bench sequence at the launches' `--chunk-size 32`
/// (1024 tokens a sequence): one LMCache object each in the bucket.
const SEQUENCE_CHUNKS: usize = 1024 / 32;

/// A launch named `name` under `dir` with the tier on `swift` alone, the
/// CPU bench's sequences `start..end` run against it (one layer: the
/// objects, keys and hits of the default shape at 1/32 of the bytes), and
/// the launch stopped once the bucket holds `expected` LMCache objects and
/// has settled ([`settle`]), or at once where `expected` is `None` (a node
/// that only reads).
fn run_node(
    dir: &Path,
    swift: &Swift,
    name: &str,
    start: u32,
    end: u32,
    expected: Option<usize>,
) -> BenchRun {
    let node = dir.join(name);
    std::fs::create_dir_all(&node).unwrap();
    let (mp_port, http_port) = (free_port(), free_port());
    let mut launch = launch(&node, mp_port, http_port, &swift_tier(swift), &[]);
    let run = run_one_layer_bench(&node, mp_port, http_port, start, end);
    if let Some(expected) = expected {
        settle(swift, expected);
    }
    stop_launch(&mut launch);
    run
}

/// Waits until Swift holds at least `expected` LMCache objects and they
/// have not changed for 5 s (LMCache stores to L2 behind the bench's back,
/// and on a loaded host its store controller can pause for longer than
/// that between objects), at most 120 s.
fn settle(swift: &Swift, expected: usize) {
    let started = Instant::now();
    let mut last = lmcache_objects(swift);
    let mut same_since = Instant::now();
    while (last.len() < expected || same_since.elapsed() < Duration::from_secs(5))
        && started.elapsed() < Duration::from_secs(120)
    {
        std::thread::sleep(Duration::from_millis(500));
        let now = lmcache_objects(swift);
        if now != last {
            last = now;
            same_since = Instant::now();
        }
    }
}

/// `lmcache-tier launch` in `node` with `tier` as its only L2 tier and `env`
/// besides, once its server answers.
fn launch(
    node: &Path,
    mp_port: u16,
    http_port: u16,
    tier: &serde_json::Value,
    env: &[(&str, String)],
) -> Proc {
    let mut cmd = BINS.launch_command(node, mp_port, http_port, &[]);
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd.env(
        "EREBINE_AGENT_LMCACHE_L2_ADAPTER",
        serde_json::json!([tier]).to_string(),
    )
    .env("EREBINE_AGENT_LMCACHE_EXTRA_ARGS", "--chunk-size 32")
    .env("LMCACHE_TRACK_USAGE", "false");
    let mut launch = Proc::spawn(cmd, &node.join("launch.log"));
    let url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_status(&url, &mut launch, Duration::from_secs(300));
    launch
}

/// The URL of the state route of the gateway the launch log names.
fn gateway_state_url(launch: &Proc) -> String {
    let log = launch.output();
    let port: u16 = log
        .split("listening on 127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no gateway address in the launch log:\n{log}"));
    format!("http://127.0.0.1:{port}{STATE_PATH}")
}

/// A gateway of this process in front of `swift` ([`Gateways::start`]), with
/// the per-launch key to sign as LMCache does.
struct Local {
    host: String,
    key_id: String,
    secret: String,
    client: reqwest::blocking::Client,
    _gateways: Gateways,
}

/// A key LMCache could have written (`<model>@<kv_rank>@<group>@<hash>`),
/// which the bucket bound counts.
fn lmcache_key(n: u32) -> String {
    format!("test-model@00000000@0@{n:032x}")
}

impl Local {
    /// Starts the gateway of `tier`, or returns its start-up error.
    fn start(tier: &serde_json::Value) -> Result<Local, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let args = vec!["--l2-adapter".to_string(), tier.to_string()];
        let (args, gateways) = runtime
            .block_on(Gateways::start_args(&args, &|_| None, None))
            .map_err(|e| e.to_string())?;
        let local: serde_json::Value = serde_json::from_str(&args[1]).unwrap();
        let key = gateways.key().unwrap();
        Ok(Local {
            host: local["s3_endpoint"].as_str().unwrap().to_string(),
            key_id: key.access_key_id.clone(),
            secret: key.secret_access_key.clone(),
            client: reqwest::blocking::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(600))
                .build()
                .unwrap(),
            _gateways: gateways,
        })
    }

    /// `method` on `/<key>?<query>` with `body`, signed with the per-launch
    /// key (unsigned payload): the status, the headers and the whole body.
    fn send(
        &self,
        method: &str,
        key: &str,
        query: &str,
        body: Vec<u8>,
    ) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
        let mut url = format!("http://{}/{}", self.host, key.replace('@', "%40"));
        if !query.is_empty() {
            url = format!("{url}?{query}");
        }
        let credentials = Credentials::new(&self.key_id, &self.secret, None, None, "test");
        let host = [("host", self.host.as_str())];
        let signature = s3_signature(
            method,
            &url,
            &host,
            "UNSIGNED-PAYLOAD",
            &credentials,
            SWIFT_REGION,
            SystemTime::now(),
        )
        .unwrap();
        let mut request = self.client.request(method.parse().unwrap(), &url);
        for (name, value) in signature {
            request = request.header(name, value);
        }
        let response = request.body(body).send().expect("the gateway answers");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        (
            status,
            headers,
            response.bytes().expect("a whole answer").to_vec(),
        )
    }

    /// The gateway's state.
    fn state(&self) -> GatewayState {
        let json = get_json(&format!("http://{}{STATE_PATH}", self.host)).expect("the state");
        serde_json::from_value(json).unwrap()
    }

    /// Uploads `parts` (bodies) as one multipart object `key`, `threads`
    /// part uploads at a time, and completes it: the complete's status and
    /// body, and the upload id.
    fn multipart(&self, key: &str, parts: &[Vec<u8>], threads: usize) -> (u16, String, String) {
        self.multipart_with(key, parts, threads, || ())
    }

    /// [`Local::multipart`], calling `before_complete` once the parts are
    /// stored, just before the complete is sent.
    fn multipart_with(
        &self,
        key: &str,
        parts: &[Vec<u8>],
        threads: usize,
        before_complete: impl FnOnce(),
    ) -> (u16, String, String) {
        let (status, _, created) = self.send("POST", key, "uploads", Vec::new());
        let created = String::from_utf8(created).unwrap();
        assert_eq!(status, 200, "create: {created}");
        let upload = between(&created, "<UploadId>", "</UploadId>").to_string();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let etags = std::sync::Mutex::new(vec![String::new(); parts.len()]);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(part) = parts.get(i) else { return };
                    let query = format!("partNumber={}&uploadId={upload}", i + 1);
                    let (status, headers, body) = self.send("PUT", key, &query, part.clone());
                    assert_eq!(
                        status,
                        200,
                        "part {}: {}",
                        i + 1,
                        String::from_utf8_lossy(&body)
                    );
                    let etag = headers["etag"].to_str().unwrap().to_string();
                    etags.lock().unwrap()[i] = etag;
                });
            }
        });
        let xml: String = etags
            .into_inner()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, etag)| {
                format!(
                    "<Part><PartNumber>{}</PartNumber><ETag>{etag}</ETag></Part>",
                    i + 1
                )
            })
            .collect();
        let xml = format!("<CompleteMultipartUpload>{xml}</CompleteMultipartUpload>");
        let query = format!("uploadId={upload}");
        before_complete();
        let started = Instant::now();
        let (status, _, body) = self.send("POST", key, &query, xml.into_bytes());
        eprintln!(
            "{} parts: the complete took {:?}",
            parts.len(),
            started.elapsed()
        );
        (status, String::from_utf8(body).unwrap(), upload)
    }

    /// Waits (the bound learns a completed object with a HEAD of its own)
    /// until `done` holds of the state; panics after 60 s.
    fn state_until(&self, what: &str, done: impl Fn(&GatewayState) -> bool) -> GatewayState {
        let started = Instant::now();
        loop {
            let state = self.state();
            if done(&state) {
                return state;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{what}: {state:#?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The text between `start` and `end` in `text`.
fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    text.split_once(start)
        .and_then(|(_, rest)| rest.split_once(end))
        .map(|(inside, _)| inside)
        .unwrap_or_else(|| panic!("no {start}...{end} in {text}"))
}

/// [`swift_tier`] with a bucket bound of 1 GiB.
fn bounded_tier(swift: &Swift) -> serde_json::Value {
    let mut tier = swift_tier(swift);
    tier["max_capacity_gb"] = 1.into();
    tier
}

#[test]
fn a_complete_swift_answers_slowly_is_kept_alive_by_the_gateway_and_tracked_by_the_bound() {
    lmcache_tier_e2e::require_lmcache!();
    lmcache_tier_e2e::require_swift!();
    let tmp = tempfile::tempdir().unwrap();
    // The proxy waits for its storage servers longer than the object
    // server stays stopped, so nothing in Swift gives up.
    let options = SwiftOptions {
        min_segment_size: 1,
        node_timeout_s: 60,
        ..SwiftOptions::default()
    };
    let swift = Swift::start(tmp.path(), options);
    swift.create_bucket(&KV, BUCKET);
    let local = Local::start(&bounded_tier(&swift)).unwrap();
    let parts: Vec<Vec<u8>> = (0..8).map(|i| vec![i; 16]).collect();
    let key = lmcache_key(1);
    // The object server stops once the parts are stored and goes on after
    // PAUSE: the gateway's DELETE of the object the complete replaces
    // (none here) gets no answer within its 5 s and is given up; the
    // complete then gets no answer for more than twice the gateway's 5 s,
    // so the gateway answers 200 itself and keeps it alive with at least
    // one space before Swift's result. When the server goes on, Swift
    // finishes the given-up DELETE (one HEAD, then the DELETE, stamped
    // then) well before the complete (its marker's HEAD, 8 parts' HEADs,
    // then the manifest's PUT, stamped later), so the completed object
    // stays: checked below, and again once the bound has counted it.
    let started = Instant::now();
    let (status, body, _) = std::thread::scope(|scope| {
        local.multipart_with(&key, &parts, 4, || {
            let paused = swift.pause_object_server();
            scope.spawn(move || {
                std::thread::sleep(PAUSE);
                drop(paused);
            });
        })
    });
    eprintln!(
        "the parts uploaded and the complete answered in {:?}",
        started.elapsed()
    );
    assert_eq!(status, 200, "{body}");
    let after_spaces = body
        .strip_prefix("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n ")
        .map(str::trim_start);
    assert!(
        after_spaces.is_some_and(|rest| rest.starts_with("<CompleteMultipartUploadResult")),
        "not the gateway's kept-alive answer with Swift's result: {body:?}"
    );
    let size = (parts.len() * 16) as u64;
    assert_eq!(lmcache_objects(&swift), [(key.clone(), size)]);
    let state = local.state_until("the bound counts the object", |s| {
        s.bucket_bound.as_ref().is_some_and(|b| b.objects == 1)
    });
    assert_eq!(state.bucket_bound.unwrap().usage_bytes, size);
    assert_eq!((state.upstream_unreachable, state.upstream_errors), (0, 0));
    assert_eq!(lmcache_objects(&swift), [(key, size)]);
}

/// How long the object server stays stopped in the slow complete's test:
/// past the gateway's 5 s for the DELETE before the complete, then 5 s for
/// the complete's head and 5 s more to its first space (15 s), with 7 s to
/// spare for a loaded host's late timers; well within the proxy's 60 s
/// and the gateway's 120 s for a complete.
const PAUSE: Duration = Duration::from_secs(22);

#[test]
fn overwriting_a_multipart_object_leaves_no_parts_of_the_old_one_in_swifts_segments() {
    lmcache_tier_e2e::require_lmcache!();
    lmcache_tier_e2e::require_swift!();
    let tmp = tempfile::tempdir().unwrap();
    let options = SwiftOptions {
        min_segment_size: 1,
        ..SwiftOptions::default()
    };
    let swift = Swift::start(tmp.path(), options);
    swift.create_bucket(&KV, BUCKET);
    let local = Local::start(&bounded_tier(&swift)).unwrap();
    let segments = format!("{BUCKET}+segments");
    let key = lmcache_key(2);
    let first: Vec<Vec<u8>> = (0..3).map(|i| vec![i; 64 << 10]).collect();
    let (status, body, old) = local.multipart(&key, &first, 3);
    assert_eq!(status, 200, "{body}");
    let second: Vec<Vec<u8>> = (0..2).map(|i| vec![i + 10; 96 << 10]).collect();
    let (status, body, new) = local.multipart(&key, &second, 2);
    assert_eq!(status, 200, "{body}");
    let kept = swift.list(&KV, &segments);
    let expected: Vec<(String, u64)> = (1..=2)
        .map(|part| (format!("{key}/{new}/{part}"), 96 << 10))
        .collect();
    assert_eq!(kept, expected, "the parts of upload {old} stayed behind");
    assert_eq!(lmcache_objects(&swift), [(key.clone(), 192 << 10)]);
    let state = local.state_until("the bound counts the new object", |s| {
        s.bucket_bound
            .as_ref()
            .is_some_and(|b| b.usage_bytes == 192 << 10)
    });
    assert_eq!(state.bucket_bound.unwrap().objects, 1);
    // LMCache's DELETE (the bound's too) takes the parts with the object.
    let (status, _, _) = local.send("DELETE", &key, "", Vec::new());
    assert_eq!(status, 204);
    assert_eq!(swift.list(&KV, &segments), []);
}

#[test]
fn a_wrong_region_and_another_accounts_credentials_are_named_at_start() {
    lmcache_tier_e2e::require_lmcache!();
    lmcache_tier_e2e::require_swift!();
    let tmp = tempfile::tempdir().unwrap();
    let swift = Swift::start(tmp.path(), SwiftOptions::default());
    swift.create_bucket(&KV, BUCKET);
    let mut tier = swift_tier(&swift);
    tier["s3_region"] = "us-east-1".into();
    let error = Local::start(&tier)
        .err()
        .expect("a start with the wrong region fails");
    assert!(
        error.contains("s3_region")
            && error.contains("expects region \"RegionOne\", not \"us-east-1\"")
            && error.contains("Set \"s3_region\" to \"RegionOne\""),
        "{error}"
    );
    let mut tier = swift_tier(&swift);
    tier["aws_access_key_id"] = OTHER.access_key_id().into();
    tier["aws_secret_access_key"] = OTHER.key.into();
    let error = Local::start(&tier)
        .err()
        .expect("another account's start fails");
    assert!(
        error.contains("s3_bucket")
            && error.contains("account:user")
            && error.contains("another account's"),
        "{error}"
    );
    // Its own bucket of that name is found.
    swift.create_bucket(&OTHER, BUCKET);
    assert!(Local::start(&tier).is_ok());
    for secret in [KV.key, OTHER.key] {
        assert!(!error.contains(secret), "{error}");
    }
}

#[test]
fn credentials_swift_revokes_while_a_launch_runs_are_warned_counted_shown_and_exported() {
    lmcache_tier_e2e::require_lmcache!();
    lmcache_tier_e2e::require_swift!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut swift = Swift::start(dir, SwiftOptions::default());
    swift.create_bucket(&KV, BUCKET);
    let (mp_port, http_port, metrics_port) = (free_port(), free_port(), free_port());
    let metrics = [(
        "EREBINE_AGENT_LMCACHE_METRICS_PORT",
        metrics_port.to_string(),
    )];
    let mut launch = launch(dir, mp_port, http_port, &swift_tier(&swift), &metrics);
    let stored = run_one_layer_bench(dir, mp_port, http_port, 0, 2);
    assert!(stored.status.success(), "bench failed:\n{}", stored.output);
    let before = lmcache_objects(&swift).len();
    assert!(before > 0, "nothing stored before the key was rotated");

    // The operator rotates the key at the store; the node still has the old one.
    swift.set_key(&KV, "rotatedKey0123456789abcdefABCDEF01234567");
    // LMCache's stores and lookups now get 403 (its bench waits on them:
    // it is stopped once the gateway has passed on a few).
    let bench = Proc::spawn(
        bench_command(mp_port, http_port, 100, 104, "0.1"),
        &dir.join("bench-refused.log"),
    );
    let gateway = gateway_state_url(&launch);
    let started = Instant::now();
    while get_json(&gateway)
        .and_then(|s| s["upstream_denied"].as_u64())
        .unwrap_or(0)
        < 2
    {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no refusal passed on within 300 s:\n{}",
            bench.output()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(bench);
    let url = format!("http://127.0.0.1:{http_port}/status");
    let out = Command::new(BINS.lmcache_tier())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("EREBINE_AGENT_LMCACHE_DISK_PATH", dir.join("cache"))
        .args(["inspect", "--url", &url])
        .output()
        .unwrap();
    let inspect = String::from_utf8_lossy(&out.stdout).to_string();
    let row = inspect
        .lines()
        .find(|l| l.trim_start().starts_with("upstream denied"))
        .unwrap_or_else(|| panic!("no upstream denied row:\n{inspect}"));
    let denied: u64 = row
        .split_whitespace()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{row}"));
    assert!(denied >= 2, "{inspect}");
    assert!(row.contains("answered 403 Forbidden"), "{row}");
    let page = get_text(&format!("http://127.0.0.1:{metrics_port}/metrics")).expect("metrics");
    let exported: u64 = page
        .lines()
        .find_map(|l| l.strip_prefix("lmcache_tier_gateway_upstream_denied_total{tier=\"0\"} "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no upstream denied family:\n{page}"));
    assert!(exported >= denied, "{exported} < {denied}");
    assert!(
        page.contains("lmcache_tier_gateway_upstream_errors_total{tier=\"0\"} 0"),
        "{page}"
    );
    stop_launch(&mut launch);
    // Warned about, a line at a time at most once a minute, never the key.
    let log = launch.output();
    let warnings = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("refuses the real credentials"))
        .count();
    assert!(
        warnings >= 1 && (warnings as u64) < denied,
        "{warnings} warnings for {denied} refusals:\n{log}"
    );
    assert!(!log.contains(KV.key), "the secret in the log");
    assert_eq!(
        lmcache_objects(&swift).len(),
        before,
        "stored with revoked credentials"
    );
}
