//! End to end: an `s3_bucket` gateway in front of a failing object store.
//! For each fault (a stall before the answer or in the middle of a body, a
//! reset mid-body, `503 SlowDown`, `500 InternalError`, a closed port) the
//! client gets its error within [`UPSTREAM_SILENCE`] plus a margin, the
//! gateway's state counts it, the gateway keeps no connection to the
//! failing store, and the next request after the store recovers succeeds (`docs/s3-gateway.md`, "A failing upstream").
//!
//! The store is s3s-fs, which checks every signature; the faults it cannot
//! produce come from [`FaultProxy`] in front of it. A second test runs the
//! real LMCache server through an outage of the store itself.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use aws_credential_types::Credentials;
use lmcache_s3_gateway::sigv4::s3_signature;
use lmcache_s3_gateway::state::{GatewayState, ANSWER_SECONDS_BOUNDS, STATE_PATH};
use lmcache_s3_gateway::{Gateways, UPSTREAM_SILENCE};
use lmcache_tier_e2e::fault_proxy::{Fault, FaultProxy};
use lmcache_tier_e2e::{
    binaries, free_port, get_json, run_bench, stop_launch, wait_for_status, Binaries, Proc, S3sFs,
};

const BINS: Binaries = binaries!();

const KEY_ID: &str = "AKIAE2EFAULTSKEY0001";
const SECRET: &str = "e2e-faults-secret-0123456789abcdefghijkl";
const REGION: &str = "us-east-1";
/// Room on top of [`UPSTREAM_SILENCE`] for a loaded 2-core machine: a
/// fault's error must come within both.
const MARGIN: Duration = Duration::from_secs(20);
const MIB: usize = 1 << 20;

/// The per-launch endpoint and key of a gateway.
struct Local {
    host: String,
    key_id: String,
    secret: String,
}

/// What became of one request.
#[derive(Debug)]
enum Outcome {
    /// A whole answer: status and body.
    Answered(u16, Vec<u8>),
    /// The head came (with this status) but the body broke off.
    BodyCut(u16),
    /// No answer at all.
    Failed(String),
}

impl Local {
    /// Sends `method` on the object `key` (with `body` for a PUT), signed
    /// with the per-launch key, and reads the whole answer.
    fn send(
        &self,
        client: &reqwest::blocking::Client,
        method: &str,
        key: &str,
        body: Option<Vec<u8>>,
    ) -> Outcome {
        let url = format!("http://{}/{}", self.host, key.replace('@', "%40"));
        let credentials = Credentials::new(&self.key_id, &self.secret, None, None, "test");
        let host = [("host", self.host.as_str())];
        let signature = s3_signature(
            method,
            &url,
            &host,
            "UNSIGNED-PAYLOAD",
            &credentials,
            REGION,
            SystemTime::now(),
        )
        .unwrap();
        let mut request = client.request(method.parse().unwrap(), &url);
        for (name, value) in signature {
            request = request.header(name, value);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = match request.send() {
            Ok(response) => response,
            Err(e) => return Outcome::Failed(format!("{e:?}")),
        };
        let status = response.status().as_u16();
        match response.bytes() {
            Ok(bytes) => Outcome::Answered(status, bytes.to_vec()),
            Err(_) => Outcome::BodyCut(status),
        }
    }
}

/// The state of the gateway on `host` (its unsigned state route).
fn state(host: &str) -> GatewayState {
    let json = get_json(&format!("http://{host}{STATE_PATH}")).expect("the state");
    serde_json::from_value(json).unwrap()
}

/// One fault, the request that meets it, and what the client must see.
struct Case {
    fault: Fault,
    method: &'static str,
    /// The status of the answer (`503`, `500`), or of the head before the
    /// body broke off (`200`).
    status: u16,
    /// A body cut off after the head, instead of a whole answer.
    cut: bool,
    /// The S3 error code the answer carries, if whole.
    code: &'static str,
    /// Counted as unreachable (no answer) rather than an upstream error.
    unreachable: bool,
}

const CASES: &[Case] = &[
    Case {
        fault: Fault::Stall,
        method: "GET",
        status: 503,
        cut: false,
        code: "ServiceUnavailable",
        unreachable: true,
    },
    Case {
        fault: Fault::Stall,
        method: "PUT",
        status: 503,
        cut: false,
        code: "ServiceUnavailable",
        unreachable: true,
    },
    Case {
        fault: Fault::StallMidBody,
        method: "GET",
        status: 200,
        cut: true,
        code: "",
        unreachable: false,
    },
    Case {
        fault: Fault::ResetMidBody,
        method: "GET",
        status: 200,
        cut: true,
        code: "",
        unreachable: false,
    },
    Case {
        fault: Fault::SlowDown,
        method: "GET",
        status: 503,
        cut: false,
        code: "SlowDown",
        unreachable: false,
    },
    Case {
        fault: Fault::SlowDown,
        method: "PUT",
        status: 503,
        cut: false,
        code: "SlowDown",
        unreachable: false,
    },
    Case {
        fault: Fault::InternalError,
        method: "GET",
        status: 500,
        cut: false,
        code: "InternalError",
        unreachable: false,
    },
    Case {
        fault: Fault::Refuse,
        method: "GET",
        status: 503,
        cut: false,
        code: "ServiceUnavailable",
        unreachable: true,
    },
];

/// Starts the gateway of a tier on `endpoint` in this process.
fn start_gateway(endpoint: &str) -> (Local, Gateways) {
    let spec = serde_json::json!({"type": "s3", "s3_endpoint": endpoint, "s3_bucket": "kv-cache",
        "s3_region": REGION, "disable_tls": true,
        "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET});
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let args = vec!["--l2-adapter".to_string(), spec.to_string()];
    let (args, gateways) = runtime
        .block_on(Gateways::start_args(&args, &|_| None, None))
        .unwrap();
    let local: serde_json::Value = serde_json::from_str(&args[1]).unwrap();
    let key = gateways.key().unwrap();
    let local = Local {
        host: local["s3_endpoint"].as_str().unwrap().to_string(),
        key_id: key.access_key_id.clone(),
        secret: key.secret_access_key.clone(),
    };
    (local, gateways)
}

#[test]
fn each_upstream_fault_is_a_prompt_error_counted_by_the_gateway_and_traffic_resumes_after_it() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3sFs::start(tmp.path(), free_port(), (KEY_ID, SECRET), &["kv-cache"]);
    let proxy = FaultProxy::start(free_port(), s3.port);
    let (local, _gateways) = start_gateway(&format!("127.0.0.1:{}", proxy.port));
    let client = reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    let object: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
    let stored = local.send(&client, "PUT", "m@object", Some(object.clone()));
    assert!(matches!(stored, Outcome::Answered(200, _)), "{stored:?}");
    let bound = UPSTREAM_SILENCE + MARGIN;

    for case in CASES {
        let what = format!("{:?} on {}", case.fault, case.method);
        proxy.set(case.fault);
        let before = state(&local.host);
        let body = (case.method == "PUT").then(|| vec![0x5a; 32 * MIB]);
        let start = Instant::now();
        let outcome = local.send(&client, case.method, "m@object", body);
        let took = start.elapsed();
        assert!(
            took < bound,
            "{what}: the error took {took:?}, over {bound:?}"
        );
        match (&outcome, case.cut) {
            (Outcome::BodyCut(status), true) => assert_eq!(*status, case.status, "{what}"),
            (Outcome::Answered(status, xml), false) => {
                assert_eq!(*status, case.status, "{what}");
                let xml = String::from_utf8_lossy(xml);
                assert!(
                    xml.contains(&format!("<Code>{}</Code>", case.code)),
                    "{what}: {xml}"
                );
            }
            (Outcome::Failed(cause), _) => panic!("{what}: no answer: {cause}"),
            _ => panic!("{what}: {outcome:?}"),
        }
        let after = wait_for_count(&local, &before, case.unreachable, &what);
        assert!(after.last_upstream_error.is_some(), "{what}: {after:?}");
        wait_for_no_connection(&proxy, &what);

        proxy.set(Fault::Pass);
        let read = local.send(&client, "GET", "m@object", None);
        assert!(
            matches!(&read, Outcome::Answered(200, body) if *body == object),
            "{what}: no recovery: {read:?}"
        );
    }
}

/// Waits (the count of a body cut off lands once the gateway sees the cut)
/// until the state counts one more unreachable request, or one more
/// upstream error, than `before`; returns it.
fn wait_for_count(
    local: &Local,
    before: &GatewayState,
    unreachable: bool,
    what: &str,
) -> GatewayState {
    let start = Instant::now();
    loop {
        let now = state(&local.host);
        let counted = if unreachable {
            now.upstream_unreachable > before.upstream_unreachable
        } else {
            now.upstream_errors > before.upstream_errors
        };
        if counted {
            return now;
        }
        assert!(
            start.elapsed() < UPSTREAM_SILENCE + MARGIN,
            "{what}: not counted (unreachable: {unreachable}): {now:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the gateway holds no connection to the failing store: one
/// it gave up on is closed (a stalled upload's included), so neither its
/// socket nor its buffers outlive the request.
fn wait_for_no_connection(proxy: &FaultProxy, what: &str) {
    let start = Instant::now();
    while proxy.open_client_connections() > 0 {
        assert!(
            start.elapsed() < UPSTREAM_SILENCE + MARGIN,
            "{what}: the gateway still holds {} connections to the store",
            proxy.open_client_connections()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The objects LMCache's CPU bench worker stored in `bucket` of s3s-fs:
/// files named `test-model@...` in it or in a cache identity's segment
/// (a directory `cache-identity-<tag>` to s3s-fs, which stores keys as
/// paths; `docs/s3-gateway.md`, "The cache identity in a bucket").
fn stored_objects(bucket: &Path) -> usize {
    let entries = |dir: &Path| -> Vec<std::fs::DirEntry> {
        std::fs::read_dir(dir)
            .map(|entries| entries.flatten().collect())
            .unwrap_or_default()
    };
    let name = |e: &std::fs::DirEntry| e.file_name().to_string_lossy().into_owned();
    let segments = entries(bucket)
        .into_iter()
        .filter(|e| name(e).starts_with(lmcache_s3_gateway::identity::SEGMENT_PREFIX));
    let dirs = std::iter::once(bucket.to_path_buf()).chain(segments.map(|e| e.path()));
    dirs.flat_map(|dir| entries(&dir))
        .filter(|e| name(e).starts_with("test-model@"))
        .count()
}

/// Waits up to 120 s for more than `n` objects in `bucket`.
fn wait_for_objects(bucket: &Path, n: usize) -> usize {
    let start = Instant::now();
    loop {
        let now = stored_objects(bucket);
        if now > n {
            return now;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no more than {n} objects in {} after 120 s",
            bucket.display()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The gateway's port, from the launch's log line.
fn gateway_port(launch: &Proc) -> u16 {
    launch
        .output()
        .split("S3 gateway for kv-cache listening on 127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|port| port.parse().ok())
        .expect("the gateway's log line")
}

/// How many answers of `state` came within `bound` (the histogram bucket
/// whose upper bound is the first at or above it).
fn answered_within(state: &GatewayState, bound: Duration) -> u64 {
    let i = ANSWER_SECONDS_BOUNDS
        .iter()
        .position(|b| *b >= bound.as_secs_f64())
        .expect("a bucket at or above the bound");
    state.answer_seconds.cumulative[i]
}

#[test]
fn lmcache_gets_prompt_errors_while_the_store_is_down_and_stores_again_once_it_is_back() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s3_port = free_port();
    let s3 = S3sFs::start(dir, s3_port, (KEY_ID, SECRET), &["kv-cache"]);
    let bucket = dir.join("s3s-fs/kv-cache");
    let tier = serde_json::json!([{"type": "s3", "s3_endpoint": format!("127.0.0.1:{s3_port}"),
        "s3_bucket": "kv-cache", "s3_region": REGION, "disable_tls": true,
        "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET, "max_capacity_gb": 20}]);
    let (mp_port, http_port) = (free_port(), free_port());
    let mut cmd = BINS.launch_command(dir, mp_port, http_port, &[]);
    cmd.env("EREBINE_AGENT_LMCACHE_L2_ADAPTER", tier.to_string())
        .env("LMCACHE_TRACK_USAGE", "false");
    let mut launch = Proc::spawn(cmd, &dir.join("launch.log"));
    let url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_status(&url, &mut launch, Duration::from_secs(180));
    let gateway = format!("127.0.0.1:{}", gateway_port(&launch));

    let first = run_bench(dir, mp_port, http_port, 0, 3);
    assert!(first.status.success(), "bench failed:\n{}", first.output);
    let healthy = wait_for_objects(&bucket, 0);

    // The store goes away (its port closed): every request LMCache sends
    // gets the gateway's 503 within the bound, and the bench goes on.
    drop(s3);
    let before = state(&gateway);
    let during = run_bench(dir, mp_port, http_port, 3, 6);
    assert!(
        during.status.success(),
        "bench during the outage:\n{}",
        during.output
    );
    let down = state(&gateway);
    assert!(
        down.upstream_unreachable > before.upstream_unreachable,
        "{down:?}"
    );
    assert!(
        down.answers.server_error > before.answers.server_error,
        "{down:?}"
    );
    let bound = UPSTREAM_SILENCE + MARGIN;
    assert_eq!(
        answered_within(&down, bound) - answered_within(&before, bound),
        down.answer_seconds.count - before.answer_seconds.count,
        "an answer during the outage took longer than {bound:?}: {down:?}"
    );

    // The store comes back on the same port with its objects: new chunks
    // reach it, and LMCache's circuit breaker never opened.
    let _s3 = S3sFs::start(dir, s3_port, (KEY_ID, SECRET), &["kv-cache"]);
    let after = run_bench(dir, mp_port, http_port, 6, 9);
    assert!(
        after.status.success(),
        "bench after the outage:\n{}",
        after.output
    );
    wait_for_objects(&bucket, healthy);
    assert!(state(&gateway).answers.success > down.answers.success);
    stop_launch(&mut launch);
    let log = launch.output();
    assert!(!log.contains("S3L2Adapter disabled"), "{log}");
}

/// A signed `PUT` of `key` whose head announces `length` body bytes, sent
/// by hand on a connection of its own; the caller sends what it likes of
/// the body.
fn put_by_hand(local: &Local, key: &str, length: usize) -> std::net::TcpStream {
    use std::io::Write;
    let path = format!("/{}", key.replace('@', "%40"));
    let url = format!("http://{}{path}", local.host);
    let credentials = Credentials::new(&local.key_id, &local.secret, None, None, "test");
    let signature = s3_signature(
        "PUT",
        &url,
        &[("host", local.host.as_str())],
        "UNSIGNED-PAYLOAD",
        &credentials,
        REGION,
        SystemTime::now(),
    )
    .unwrap();
    let mut head = format!(
        "PUT {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: {length}\r\n",
        local.host
    );
    for (name, value) in signature {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut stream = std::net::TcpStream::connect(&local.host).unwrap();
    stream
        .set_read_timeout(Some(UPSTREAM_SILENCE + MARGIN))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    stream
}

/// Waits until `done` holds for the gateway's state, or panics after
/// [`UPSTREAM_SILENCE`] plus [`MARGIN`].
fn state_until(local: &Local, what: &str, done: impl Fn(&GatewayState) -> bool) -> GatewayState {
    let start = Instant::now();
    loop {
        let now = state(&local.host);
        if done(&now) {
            return now;
        }
        assert!(
            start.elapsed() < UPSTREAM_SILENCE + MARGIN,
            "{what}: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_upload_its_own_client_stalls_or_breaks_off_is_the_clients_not_the_object_stores() {
    lmcache_tier_e2e::require_lmcache!();
    use std::io::{Read, Write};
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3sFs::start(tmp.path(), free_port(), (KEY_ID, SECRET), &["kv-cache"]);
    let (local, gateways) = start_gateway(&format!("127.0.0.1:{}", s3.port));
    let metrics = lmcache_launcher::metrics::NodeMetrics::new(None);
    metrics.watch_gateways(gateways.view());
    let part = vec![0x5a; MIB];

    // 1 MiB of a 32 MiB upload, then nothing: the store waited for the
    // rest, and the gateway says so to the client that stalled.
    let mut stalled = put_by_hand(&local, "m@stalled", 32 * MIB);
    stalled.write_all(&part).unwrap();
    let mut answer = Vec::new();
    let _ = stalled.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("<Code>RequestTimeout</Code>"), "{answer}");
    let after = state_until(&local, "the stall", |s| {
        s.client_upload_failures.stalled == 1
    });
    assert_eq!(after.upstream_unreachable, 0, "{after:?}");
    assert_eq!(after.upstream_errors, 0, "{after:?}");
    assert_eq!(after.answers.server_error, 0, "{after:?}");
    assert_eq!(after.last_upstream_error, None, "{after:?}");

    // 1 MiB of a 32 MiB upload, then the connection closed.
    let mut broken = put_by_hand(&local, "m@broken", 32 * MIB);
    broken.write_all(&part).unwrap();
    // Closed only once the gateway has taken the request up: a connection
    // closed before the gateway looks its socket's owner up has no owner,
    // and is refused as any such connection is (peer_refused).
    state_until(&local, "the second upload taken up", |s| {
        s.requests.put == 2
    });
    drop(broken);
    let after = state_until(&local, "the break", |s| {
        s.client_upload_failures.broke_off == 1
    });
    assert_eq!(after.upstream_unreachable, 0, "{after:?}");
    assert_eq!(after.last_upstream_error, None, "{after:?}");

    // The metrics count both as the client's, outside the upstream
    // families the upstream alert reads.
    let page = metrics
        .render(lmcache_launcher::metrics::Format::Prometheus)
        .unwrap();
    for (series, value) in [
        (
            r#"lmcache_tier_gateway_client_upload_failures_total{tier="0",reason="stalled"}"#,
            "1",
        ),
        (
            r#"lmcache_tier_gateway_client_upload_failures_total{tier="0",reason="broke_off"}"#,
            "1",
        ),
        (
            r#"lmcache_tier_gateway_upstream_unreachable_total{tier="0"}"#,
            "0",
        ),
        (
            r#"lmcache_tier_gateway_upstream_errors_total{tier="0"}"#,
            "0",
        ),
    ] {
        assert!(
            page.contains(&format!("{series} {value}\n")),
            "{series}:\n{page}"
        );
    }

    // A whole upload afterwards is stored.
    let client = reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    let stored = local.send(&client, "PUT", "m@whole", Some(part.clone()));
    assert!(matches!(stored, Outcome::Answered(200, _)), "{stored:?}");
}
