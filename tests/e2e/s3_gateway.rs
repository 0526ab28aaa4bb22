//! End to end: `s3` tiers with `s3_bucket` reach a path-style S3 server (moto
//! on loopback) through the gateway, from LMCache's own S3 adapter, and the
//! operator's real keys never reach the LMCache process.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lmcache_tier_e2e::{
    binaries, children_of, cmdline_and_environ, data_objects, free_port, get_text, lmcache_venv,
    run_one_layer_bench, stop_launch, wait_for_status, Binaries, Proc, S3Server, TlsFiles,
};

const BINS: Binaries = binaries!();

const REAL_KEY_ID: &str = "AKIAOPERATORREALKEY1";
const REAL_SECRET: &str = "operator-real-secret-DO-NOT-LEAK-0123456789";

/// Waits until `proc` has a child process and has printed the gateway's
/// address; returns (child pid, gateway port).
fn child_and_gateway(proc: &mut Proc) -> (i32, u16) {
    let start = Instant::now();
    loop {
        let output = proc.output();
        let port = output
            .split("listening on 127.0.0.1:")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|p| p.parse().ok());
        // A child that has not yet exec'd LMCache still shows this
        // process's command line and environment.
        let exec_done = |child: i32| {
            let exe = |pid: i32| std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            exe(child).is_some_and(|e| Some(e) != exe(proc.pid()))
        };
        // Not the check that LMCache's Python imports boto3.
        let is_server = |pid: &i32| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            !String::from_utf8_lossy(&cmdline).contains("import boto3")
        };
        let child = children_of(proc.pid()).into_iter().find(is_server);
        if let (Some(port), Some(child)) = (port, child.filter(|&c| exec_done(c))) {
            return (child, port);
        }
        if let Some(status) = proc.try_status() {
            panic!("exited ({status}) before the gateway started:\n{output}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no gateway and child within 60 s:\n{output}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A request to the gateway signed as the per-launch key id but with a
/// signature made up by the caller.
fn forged_request(gateway: u16, key_id: &str) -> reqwest::blocking::Response {
    let now = Command::new("date")
        .args(["-u", "+%Y%m%dT%H%M%SZ"])
        .output()
        .unwrap();
    let now = String::from_utf8(now.stdout).unwrap().trim().to_string();
    let auth = format!(
        "AWS4-HMAC-SHA256 Credential={key_id}/{}/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={}",
        &now[..8],
        "0".repeat(64)
    );
    reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://127.0.0.1:{gateway}/bench-model%40x"))
        .header("authorization", auth)
        .header("x-amz-date", now)
        .header("x-amz-content-sha256", "UNSIGNED-PAYLOAD")
        .send()
        .unwrap()
}

#[test]
fn bench_l2_through_s3_bucket_stores_and_loads_32_mib_objects_path_style_without_real_keys_in_lmcache(
) {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s3 = S3Server::with_bucket(dir, "kv-cache");
    let spec = serde_json::json!({
        "type": "s3",
        "s3_endpoint": format!("127.0.0.1:{}", s3.port),
        "s3_bucket": "kv-cache",
        "s3_key_prefix": "node-a/",
        "s3_region": "us-east-1",
        "disable_tls": true,
    });
    let mut cmd = Command::new(BINS.erebine_lmcache());
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .env("VIRTUAL_ENV", lmcache_venv())
        .env("LMCACHE_TRACK_USAGE", "false")
        .env("AWS_ACCESS_KEY_ID", REAL_KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", REAL_SECRET)
        .args(["bench", "l2", "--l2-adapter", &spec.to_string()])
        .args(["--num-keys", "4", "--rounds", "1", "--warmup-rounds", "0"])
        .args(["--data-size-kb", "32768"]);
    let mut bench = Proc::spawn(cmd, &dir.join("bench-l2.log"));
    let (lmcache, gateway) = child_and_gateway(&mut bench);

    let seen = cmdline_and_environ(lmcache);
    assert!(
        seen.contains(&format!("\"s3_endpoint\":\"127.0.0.1:{gateway}\"")),
        "{seen}"
    );
    for secret in [REAL_KEY_ID, REAL_SECRET, "kv-cache", "node-a/"] {
        assert!(!seen.contains(secret), "{secret} reached LMCache: {seen}");
    }
    let (key_id, secret) = gateway_key_of(lmcache);
    assert!(
        !seen.contains("aws_access_key_id"),
        "a key in the spec: {seen}"
    );
    assert_on_no_command_line(&[&key_id, &secret]);
    let forged = forged_request(gateway, &key_id);
    assert_eq!(forged.status().as_u16(), 403);
    assert!(forged.text().unwrap().contains("SignatureDoesNotMatch"));
    let unsigned = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://127.0.0.1:{gateway}/?list-type=2"))
        .send()
        .unwrap();
    assert_eq!(unsigned.status().as_u16(), 403);

    let status = bench
        .wait_timeout(Duration::from_secs(300))
        .unwrap_or_else(|| panic!("bench l2 still running:\n{}", bench.output()));
    let output = bench.output();
    assert!(status.success(), "{output}");
    assert!(output.contains("success_keys=4/4"), "{output}");
    assert!(output.contains("loaded=4/4"), "{output}");
    assert!(!output.contains(REAL_SECRET), "the real secret in the log");
    let mut keys = s3.list_keys("kv-cache");
    keys.sort();
    let expected: Vec<String> = (0..4)
        .map(|i| format!("node-a/bench-model@{i:08x}@0@{i:032x}"))
        .collect();
    assert_eq!(keys, expected);
}

#[test]
fn a_bad_s3_bucket_tier_stops_bench_l2_before_lmcache_starts() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let spec = r#"{"type":"s3","s3_endpoint":"127.0.0.1:9","s3_bucket":"Not_A_Bucket","s3_region":"us-east-1","disable_tls":true,"aws_access_key_id":"A","aws_secret_access_key":"S"}"#;
    let out = Command::new(BINS.erebine_lmcache())
        .env("VIRTUAL_ENV", lmcache_venv())
        .env("HOME", tmp.path())
        .args(["bench", "l2", "--l2-adapter", spec])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("L2 tier 0 (s3): s3_bucket: \"Not_A_Bucket\""),
        "{err}"
    );
}

#[test]
fn launch_with_fs_then_s3_bucket_cascade_stores_in_both_keeps_keys_off_lmcache_and_survives_an_outage(
) {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s3_port = free_port();
    let s3 = S3Server::start(dir, s3_port);
    s3.create_bucket("kv-cache");
    let fs_dir = dir.join("fs-tier");
    std::fs::create_dir_all(&fs_dir).unwrap();
    let cascade = serde_json::json!([
        {"type": "fs", "base_path": fs_dir, "max_capacity_gb": 8,
         "eviction": {"eviction_policy": "LRU", "trigger_watermark": 0.8, "eviction_ratio": 0.2}},
        {"shared": true, "type": "s3", "s3_endpoint": format!("127.0.0.1:{s3_port}"),
         "s3_bucket": "kv-cache", "s3_region": "us-east-1", "s3_prefer_http2": false,
         "disable_tls": true, "aws_access_key_id": REAL_KEY_ID,
         "aws_secret_access_key": REAL_SECRET, "max_capacity_gb": 20,
         "eviction": {"eviction_policy": "LRU", "trigger_watermark": 0.8, "eviction_ratio": 0.2}}
    ]);
    let (mp_port, http_port, metrics_port) = (free_port(), free_port(), free_port());
    let mut cmd = BINS.launch_command(dir, mp_port, http_port, &[]);
    cmd.env("EREBINE_AGENT_LMCACHE_L2_ADAPTER", cascade.to_string())
        .env(
            "EREBINE_AGENT_LMCACHE_METRICS_PORT",
            metrics_port.to_string(),
        )
        .env("LMCACHE_TRACK_USAGE", "false");
    let mut launch = Proc::spawn(cmd, &dir.join("launch.log"));
    let url = format!("http://127.0.0.1:{http_port}/status");
    let status = wait_for_status(&url, &mut launch, Duration::from_secs(180));
    let types: Vec<&str> = status["storage_manager"]["l2_adapters"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["type"].as_str())
        .collect();
    assert_eq!(types, ["FSL2Adapter", "S3L2Adapter"], "{status:#}");

    // Everything below the launcher: erebine-lmcache and the LMCache server.
    let mut below = children_of(launch.pid());
    let mut i = 0;
    while i < below.len() {
        below.extend(children_of(below[i]));
        i += 1;
    }
    assert!(below.len() >= 2, "expected erebine-lmcache and the server");
    for pid in &below {
        let seen = cmdline_and_environ(*pid);
        assert!(!seen.contains(REAL_SECRET), "the real secret in pid {pid}");
        assert!(!seen.contains(REAL_KEY_ID), "the real key id in pid {pid}");
    }
    // The per-launch key is in the server's environment and on no
    // process's command line on the machine.
    let server = *below.last().unwrap();
    let (key_id, secret) = gateway_key_of(server);
    assert_on_no_command_line(&[&key_id, &secret]);

    let bench = run_one_layer_bench(dir, mp_port, http_port, 0, 3);
    assert!(bench.status.success(), "bench failed:\n{}", bench.output);
    assert!(!data_objects(&fs_dir).is_empty(), "nothing in the fs tier");
    let gateway_port = gateway_port_of(&launch.output());
    let refused = refused_from_another_uid(gateway_port, &key_id, &secret);
    let in_bucket = wait_for_keys(&s3, 1);
    // Under the launch's cache identity (docs/s3-gateway.md, "The cache
    // identity in a bucket").
    assert!(
        in_bucket.iter().all(|k| {
            let (tag, key) = lmcache_s3_gateway::identity::split(k);
            tag.is_some() && key.starts_with("test-model@")
        }),
        "{in_bucket:?}"
    );

    // `inspect` shows the gateway's state under the S3 tier, without secrets.
    let (code, text) = inspect_json(dir, &url);
    assert_eq!(code, Some(0), "{text}");
    for secret in [REAL_SECRET, REAL_KEY_ID] {
        assert!(!text.contains(secret), "{secret} in inspect: {text}");
    }
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(report["tiers"][0]["gateway"].is_null(), "{report:#}");
    let gateway = &report["tiers"][1]["gateway"];
    assert_eq!(gateway["bucket"], "kv-cache", "{report:#}");
    assert_eq!(gateway["tier"], 1);
    assert_eq!(gateway["upstream"], format!("http://127.0.0.1:{s3_port}"));
    assert_eq!(gateway["credential_source"], "the tier's aws_access_key_id");
    // The bound's node id is kept in the fenced disk tier's directory, for
    // a restart after a crash (docs/s3-gateway.md, "Node ids").
    let kept: Vec<PathBuf> = std::fs::read_dir(&fs_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with(lmcache_s3_gateway::node_id::FILE_PREFIX)
        })
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let body: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&kept[0]).unwrap()).unwrap();
    assert_eq!(body["node"], gateway["bucket_bound"]["node"], "{body}");
    let requests = &gateway["requests"];
    let stores = requests["put"].as_u64().unwrap() + requests["post"].as_u64().unwrap();
    assert!(stores >= 1, "no store counted: {gateway:#}");
    assert!(gateway["bytes_up"].as_u64().unwrap() > 0, "{gateway:#}");
    assert_eq!(gateway["upstream_unreachable"], 0, "{gateway:#}");
    assert_eq!(gateway["peer_refused"], refused, "{gateway:#}");

    // The metrics show the same counters, and the fs tier's guard (run by
    // erebine-lmcache beside the server) from its status file.
    let metrics = get_text(&format!("http://127.0.0.1:{metrics_port}/metrics")).unwrap();
    let sample = |series: &str| -> f64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
            .parse()
            .unwrap()
    };
    let put = r#"lmcache_tier_gateway_requests_total{tier="1",method="PUT"}"#;
    let post = r#"lmcache_tier_gateway_requests_total{tier="1",method="POST"}"#;
    assert!(sample(put) + sample(post) >= stores as f64, "{metrics}");
    assert!(sample(r#"lmcache_tier_gateway_sent_bytes_total{tier="1"}"#) > 0.0);
    assert_eq!(
        sample(r#"lmcache_tier_gateway_peer_refused_total{tier="1"}"#),
        refused as f64
    );
    assert!(
        metrics.contains(
            r#"lmcache_tier_gateway_info{tier="1",bucket="kv-cache",credential_source="spec"} 1"#
        ),
        "{metrics}"
    );
    assert_eq!(
        sample(r#"lmcache_tier_guard_capacity_bytes{tier="0"}"#),
        (8u64 << 30) as f64
    );
    for secret in [REAL_SECRET, REAL_KEY_ID] {
        assert!(!metrics.contains(secret), "{secret} in the metrics");
    }

    // Outage: the bucket goes away mid-run; the node keeps serving from the
    // fs tier and the S3 errors do not hang it.
    s3.kill();
    let during = run_one_layer_bench(dir, mp_port, http_port, 3, 6);
    assert!(
        during.status.success(),
        "bench during the outage:\n{}",
        during.output
    );
    assert!(
        wait_for_status(&url, &mut launch, Duration::from_secs(30))["is_healthy"]
            .as_bool()
            .is_some(),
        "/status stopped answering"
    );
    let report: serde_json::Value = serde_json::from_str(&inspect_json(dir, &url).1).unwrap();
    let gateway = &report["tiers"][1]["gateway"];
    assert!(
        gateway["upstream_unreachable"].as_u64().unwrap() >= 1,
        "the outage was not counted: {gateway:#}"
    );
    let last = gateway["last_upstream_error"]["message"].as_str().unwrap();
    assert!(
        last.contains(&format!("http://127.0.0.1:{s3_port}")),
        "{last}"
    );

    // The upstream returns (empty, as moto keeps nothing): new chunks reach it.
    let s3 = S3Server::start(dir, s3_port);
    s3.create_bucket("kv-cache");
    let after = run_one_layer_bench(dir, mp_port, http_port, 6, 9);
    assert!(
        after.status.success(),
        "bench after the outage:\n{}",
        after.output
    );
    wait_for_keys(&s3, 1);

    stop_launch(&mut launch);
    let log = launch.output();
    assert!(
        !log.contains(REAL_SECRET),
        "the real secret in the launch log"
    );
    assert!(
        log.contains("S3 gateway for kv-cache listening on"),
        "{log}"
    );
    assert!(
        !log.contains(&secret),
        "the per-launch secret in the launch log"
    );
    if refused > 0 {
        assert!(
            log.contains("S3 gateway refused a connection from 127.0.0.1:")
                && log.contains("belongs to uid 65534, not to the LMCache server's uid 0"),
            "{log}"
        );
    }
}

/// The gateways' per-launch key pair in the environment of the process
/// `pid` (the LMCache server): its `AWS_ACCESS_KEY_ID` and
/// `AWS_SECRET_ACCESS_KEY`.
fn gateway_key_of(pid: i32) -> (String, String) {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let vars: Vec<String> = environ
        .split(|b| *b == 0)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    let var = |name: &str| {
        vars.iter()
            .find_map(|v| v.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in the server's environment: {vars:?}"))
            .to_string()
    };
    let (key_id, secret) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY"));
    assert!(key_id.starts_with("EREBINE"), "{key_id}");
    assert_eq!(secret.len(), 40);
    (key_id, secret)
}

/// Asserts that no process on the machine has any of `secrets` on its
/// command line (`/proc/*/cmdline`).
fn assert_on_no_command_line(secrets: &[&str]) {
    let mut read = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline);
        read += 1;
        for secret in secrets {
            assert!(
                !cmdline.contains(secret),
                "a per-launch secret on the command line of {}: {cmdline}",
                entry.path().display()
            );
        }
    }
    assert!(read > 3, "only {read} command lines read");
}

/// The port of the first gateway the launch log names.
fn gateway_port_of(log: &str) -> u16 {
    log.split("listening on 127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no gateway address in the launch log:\n{log}"))
}

/// Sends a listing signed with the per-launch key from uid 65534 (nobody,
/// with `setpriv`) and from this process's uid, both with curl: the first
/// must get 403 `AccessDenied` naming the uid, the second not, and the
/// state route must answer uid 65534. Returns the requests refused (1),
/// or 0 with a printed reason when this test does not run as root.
fn refused_from_another_uid(gateway: u16, key_id: &str, secret: &str) -> u64 {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped the request from another uid: setpriv needs root");
        return 0;
    }
    let host = format!("127.0.0.1:{gateway}");
    let url = format!("http://{host}/?list-type=2&max-keys=1");
    let curl = |as_nobody: bool, url: &str, signed: bool| {
        let mut cmd = Command::new(if as_nobody { "setpriv" } else { "curl" });
        if as_nobody {
            cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "curl"]);
        }
        cmd.args(["-s", "--noproxy", "*", "-w", "\n%{http_code}", url]);
        if signed {
            for (name, value) in &sign_as_client("GET", url, &host, key_id, secret) {
                cmd.arg("-H")
                    .arg(format!("{name}: {}", value.to_str().unwrap()));
            }
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
        (status.to_string(), body.to_string())
    };
    let (status, body) = curl(true, &url, true);
    assert_eq!(status, "403", "{body}");
    assert!(
        body.contains("<Code>AccessDenied</Code>")
            && body.contains("belongs to uid 65534, not to the LMCache server's uid 0"),
        "{body}"
    );
    let (status, body) = curl(false, &url, true);
    assert_eq!(
        status, "200",
        "the same request from the server's uid: {body}"
    );
    let state = format!("http://{host}/.well-known/erebine-s3-gateway");
    let (status, body) = curl(true, &state, false);
    assert_eq!(status, "200", "the state route from uid 65534: {body}");
    assert!(body.contains("\"peer_refused\":1"), "{body}");
    1
}

/// `lmcache-tier inspect --json --url <url>` for the node in `dir`: its exit
/// status and standard output.
fn inspect_json(dir: &std::path::Path, url: &str) -> (Option<i32>, String) {
    let out = Command::new(BINS.lmcache_tier())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("EREBINE_AGENT_LMCACHE_DISK_PATH", dir.join("cache"))
        .args(["inspect", "--json", "--url", url])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Waits up to 60 s for at least `n` objects in the bucket.
fn wait_for_keys(s3: &S3Server, n: usize) -> Vec<String> {
    let start = Instant::now();
    loop {
        let keys = cache_keys(s3);
        if keys.len() >= n {
            return keys;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "fewer than {n} objects in the bucket after 60 s: {keys:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The keys of the bucket `kv-cache` but the bucket bound's own objects
/// (its lease, reports and probes in `<prefix>.lmcache-tier/`, which a
/// tier with `max_capacity_gb` writes: `docs/s3-gateway.md`, "A fleet on
/// one bucket").
fn cache_keys(s3: &S3Server) -> Vec<String> {
    s3.list_keys("kv-cache")
        .into_iter()
        .filter(|key| !key.contains(lmcache_s3_gateway::fleet::RESERVED))
        .collect()
}

/// SigV4 headers (unsigned payload) as an S3 client would send them.
fn sign_as_client(
    method: &str,
    url: &str,
    host: &str,
    key_id: &str,
    secret: &str,
) -> reqwest::header::HeaderMap {
    use aws_sigv4::http_request::{
        sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
        SigningSettings,
    };
    let identity =
        aws_credential_types::Credentials::new(key_id, secret, None, None, "test").into();
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("s3")
        .time(std::time::SystemTime::now())
        .settings(settings)
        .build()
        .unwrap()
        .into();
    let request = SignableRequest::new(
        method,
        url,
        [("host", host)].into_iter(),
        SignableBody::UnsignedPayload,
    )
    .unwrap();
    let (instructions, _) = sign(request, &params).unwrap().into_parts();
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in instructions.headers() {
        headers.insert(
            reqwest::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    headers
}

#[test]
fn listings_page_through_the_key_prefix_and_an_unreachable_upstream_answers_503() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::with_bucket(tmp.path(), "kv-cache");
    let client = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap();
    for key in ["p/a@1", "p/a@2", "p/a@3", "p/a@4", "p/a@5", "other@1"] {
        let url = format!(
            "http://127.0.0.1:{}/kv-cache/{}",
            s3.port,
            key.replace('@', "%40")
        );
        assert!(client
            .put(url)
            .body(key.to_string())
            .send()
            .unwrap()
            .status()
            .is_success());
    }
    let spec = serde_json::json!({"type": "s3", "s3_endpoint": format!("127.0.0.1:{}", s3.port),
        "s3_bucket": "kv-cache", "s3_key_prefix": "p/", "s3_region": "us-east-1", "disable_tls": true,
        "aws_access_key_id": REAL_KEY_ID, "aws_secret_access_key": REAL_SECRET});
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let args = vec!["--l2-adapter".to_string(), spec.to_string()];
    let (args, gateways) = runtime
        .block_on(lmcache_s3_gateway::Gateways::start_args(
            &args,
            &|_| None,
            None,
        ))
        .unwrap();
    let local: serde_json::Value = serde_json::from_str(&args[1]).unwrap();
    let host = local["s3_endpoint"].as_str().unwrap().to_string();
    let key = gateways.key().unwrap();
    let (key_id, secret) = (key.access_key_id.clone(), key.secret_access_key.clone());
    let get = |path_and_query: &str| {
        let url = format!("http://{host}{path_and_query}");
        let headers = sign_as_client("GET", &url, &host, &key_id, &secret);
        client.get(url).headers(headers).send().unwrap()
    };

    let mut keys = Vec::new();
    let mut token: Option<String> = None;
    for _page in 0..10 {
        let mut query = "/?list-type=2&max-keys=2".to_string();
        if let Some(t) = &token {
            let encoded: String = t
                .bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect();
            query.push_str(&format!("&continuation-token={encoded}"));
        }
        let response = get(&query);
        assert_eq!(response.status().as_u16(), 200);
        let xml = response.text().unwrap();
        keys.extend(
            xml.split("<Key>")
                .skip(1)
                .filter_map(|p| p.split_once("</Key>").map(|(k, _)| k.to_string())),
        );
        token = xml.split("<NextContinuationToken>").nth(1).and_then(|p| {
            p.split_once("</NextContinuationToken>")
                .map(|(t, _)| t.to_string())
        });
        if token.is_none() {
            break;
        }
    }
    assert_eq!(keys, ["a@1", "a@2", "a@3", "a@4", "a@5"]);
    assert_eq!(get("/a%403").text().unwrap(), "p/a@3");

    s3.kill();
    let start = Instant::now();
    let response = get("/a%403");
    assert_eq!(response.status().as_u16(), 503);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "503 took {:?}",
        start.elapsed()
    );
}

/// `erebine-lmcache bench l2` with one `s3` tier `spec` (2 keys of 256 KiB)
/// and only the environment given here (plus PATH, HOME = `dir`, the
/// LMCache environment): no AWS variable of the test process reaches it.
fn small_bench_l2(dir: &Path, spec: &serde_json::Value, env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(BINS.erebine_lmcache());
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .env("VIRTUAL_ENV", lmcache_venv())
        .env("LMCACHE_TRACK_USAGE", "false")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args(["bench", "l2", "--l2-adapter", &spec.to_string()])
        .args(["--num-keys", "2", "--rounds", "1", "--warmup-rounds", "0"])
        .args(["--data-size-kb", "256"]);
    cmd
}

/// Runs `cmd` (a [`small_bench_l2`]) to the end and checks that every store
/// and load went through the gateway that signed with credentials from
/// `source` (the start of the log's `credentials=` field), that `secrets`
/// appear neither in its output nor in the LMCache process, which gets no
/// variable of the credential chain but the per-launch key pair (on no
/// command line), and that the objects are in bucket `kv-cache` on `s3`. `during` runs once LMCache has started, with the
/// gateway's port and LMCache's command line and environment.
fn assert_bench_through_gateway(
    cmd: Command,
    log: &Path,
    source: &str,
    secrets: &[&str],
    s3: &S3Server,
    during: &dyn Fn(u16, &str),
) {
    let mut bench = Proc::spawn(cmd, log);
    let (lmcache, gateway) = child_and_gateway(&mut bench);
    let seen = cmdline_and_environ(lmcache);
    for secret in secrets {
        assert!(!seen.contains(secret), "{secret} reached LMCache: {seen}");
    }
    let key = gateway_key_of(lmcache);
    assert_on_no_command_line(&[&key.0, &key.1]);
    let key_pair = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"];
    for variable in lmcache_s3_gateway::server_env_removed() {
        assert!(
            key_pair.contains(&variable) || !seen.contains(&format!("{variable}=")),
            "{variable} reached LMCache: {seen}"
        );
    }
    during(gateway, &seen);
    let status = bench
        .wait_timeout(Duration::from_secs(300))
        .unwrap_or_else(|| panic!("bench l2 still running:\n{}", bench.output()));
    let output = bench.output();
    assert!(status.success(), "{output}");
    assert!(output.contains("success_keys=2/2"), "{output}");
    assert!(output.contains("loaded=2/2"), "{output}");
    assert!(
        output.contains(&format!("credentials={source}")),
        "not signed with {source}:\n{output}"
    );
    for secret in secrets {
        assert!(!output.contains(secret), "{secret} in the log:\n{output}");
    }
    let mut keys = cache_keys(s3);
    keys.sort();
    assert_eq!(
        keys,
        [
            "bench-model@00000000@0@00000000000000000000000000000000",
            "bench-model@00000001@0@00000000000000000000000000000001"
        ]
    );
}

fn bucket_spec(s3: &S3Server) -> serde_json::Value {
    serde_json::json!({
        "type": "s3",
        "s3_endpoint": format!("127.0.0.1:{}", s3.port),
        "s3_bucket": "kv-cache",
        "s3_region": "us-east-1",
        "disable_tls": true,
    })
}

#[test]
fn bench_l2_signs_with_the_profile_named_by_aws_profile_in_aws_shared_credentials_file() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s3 = S3Server::with_bucket(dir, "kv-cache");
    let credentials = dir.join("aws-credentials");
    std::fs::write(
        &credentials,
        "[default]\naws_access_key_id = AKIADEFAULTPROFILE01\naws_secret_access_key = default-profile-secret-0123456789\n\n\
         [kv-node]\naws_access_key_id = AKIAKVNODEPROFILE001\naws_secret_access_key = kv-node-profile-secret-0123456789\n",
    )
    .unwrap();
    let cmd = small_bench_l2(
        dir,
        &bucket_spec(&s3),
        &[
            (
                "AWS_SHARED_CREDENTIALS_FILE",
                credentials.display().to_string(),
            ),
            ("AWS_PROFILE", "kv-node".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ],
    );
    assert_bench_through_gateway(
        cmd,
        &dir.join("bench-profile.log"),
        &format!("profile \"kv-node\" in {}", credentials.display()),
        &["kv-node-profile-secret-0123456789", "AKIAKVNODEPROFILE001"],
        &s3,
        &|_, _| {},
    );
}

#[test]
fn bench_l2_signs_with_web_identity_credentials_from_sts() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s3 = S3Server::with_bucket(dir, "kv-cache");
    let token = dir.join("web-identity-token");
    // moto's STS takes any token and role; the gateway's HEAD and every
    // request after it are signed with the credentials it hands out.
    std::fs::write(&token, "eyJhbGciOiJSUzI1NiJ9.e30.test-token").unwrap();
    let role = "arn:aws:iam::123456789012:role/kv-cache-writer";
    let cmd = small_bench_l2(
        dir,
        &bucket_spec(&s3),
        &[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token.display().to_string()),
            ("AWS_ROLE_ARN", role.into()),
            ("AWS_ENDPOINT_URL_STS", s3.url.clone()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ],
    );
    assert_bench_through_gateway(
        cmd,
        &dir.join("bench-web-identity.log"),
        &format!("web identity (role {role}"),
        &["test-token"],
        &s3,
        &|_, _| {},
    );
}

/// A fake EC2 instance metadata service on 127.0.0.1, IMDSv2 only: `PUT
/// /latest/api/token`, then the role `kv-role` and its credentials, which
/// expire `lifetime` after each fetch and carry the fetch's number in their
/// key id (`AKIAFAKEIMDS000<n>`). It is a fake because moto's instance
/// metadata answers the token request without the
/// `x-aws-ec2-metadata-token-ttl-seconds` header, which `aws-config`
/// requires. Returns its URL and the number of credential fetches so far.
fn fake_imds(lifetime: Duration) -> (String, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let fetches = Arc::new(AtomicUsize::new(0));
    let counter = fetches.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let request = String::from_utf8_lossy(&request).to_ascii_lowercase();
            let line = request.lines().next().unwrap_or("").to_string();
            let has_token = request.contains("x-aws-ec2-metadata-token: fake-imdsv2-token");
            let (status, headers, body) = if line.starts_with("put /latest/api/token ") {
                (
                    "200 OK",
                    "x-aws-ec2-metadata-token-ttl-seconds: 21600\r\n",
                    "fake-imdsv2-token".to_string(),
                )
            } else if !has_token {
                ("401 Unauthorized", "", String::new())
            } else if line.starts_with("get /latest/meta-data/iam/security-credentials/ ") {
                ("200 OK", "", "kv-role".to_string())
            } else if line.starts_with("get /latest/meta-data/iam/security-credentials/kv-role ") {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                let expiry = Command::new("date")
                    .args(["-u", "-d", &format!("+{} seconds", lifetime.as_secs())])
                    .arg("+%Y-%m-%dT%H:%M:%SZ")
                    .output()
                    .unwrap();
                let expiry = String::from_utf8(expiry.stdout).unwrap();
                (
                    "200 OK",
                    "",
                    serde_json::json!({"Code": "Success", "Type": "AWS-HMAC",
                        "AccessKeyId": format!("AKIAFAKEIMDS000{n}"),
                        "SecretAccessKey": "fake-imds-secret-0123456789", "Token": "fake-imds-token",
                        "Expiration": expiry.trim()})
                    .to_string(),
                )
            } else {
                ("404 Not Found", "", String::new())
            };
            let _ = stream.write_all(
                format!(
                    "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
    });
    (url, fetches)
}

#[test]
fn bench_l2_signs_with_instance_metadata_credentials() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s3 = S3Server::with_bucket(dir, "kv-cache");
    // Temporary credentials (4 minutes) as instance metadata hands them out.
    // Their refresh before expiry is covered by the credentials module's
    // unit tests: a small bench l2 may end before the gateway's shortest
    // refetch interval (10 s), so it cannot be relied on to show one here.
    let (imds, fetches) = fake_imds(Duration::from_secs(240));
    let cmd = small_bench_l2(
        dir,
        &bucket_spec(&s3),
        &[("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.clone())],
    );
    assert_bench_through_gateway(
        cmd,
        &dir.join("bench-imds.log"),
        &format!("EC2 instance metadata at {imds}"),
        &["fake-imds-secret-0123456789", "fake-imds-token"],
        &s3,
        &|_, _| assert!(fetches.load(Ordering::SeqCst) >= 1, "no fetch from IMDS"),
    );
}

#[test]
fn without_credentials_bench_l2_stops_naming_the_tier_and_the_sources_tried() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir(dir.join(".aws")).unwrap();
    std::fs::write(dir.join(".aws/config"), "[default]\nregion = us-east-1\n").unwrap();
    let spec = serde_json::json!({"type": "s3", "s3_endpoint": "127.0.0.1:9", "s3_bucket": "kv-cache",
        "s3_region": "us-east-1", "disable_tls": true});
    let out = small_bench_l2(dir, &spec, &[("AWS_EC2_METADATA_DISABLED", "true".into())])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "L2 tier 0 (s3): aws_access_key_id: no credentials: the tier has no aws_access_key_id, AWS_ACCESS_KEY_ID is not set, and the AWS default chain found none; tried: profile \"default\" in {}/.aws/config",
            dir.display()
        )),
        "{err}"
    );
}

/// A private CA and a certificate for 127.0.0.1 and localhost signed by
/// it, written to `dir`: (CA certificate, server certificate, server key).
fn private_ca_and_server_cert(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "lmcache-tier test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&server_key, &ca)
        .unwrap();
    let paths = (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server-key.pem"),
    );
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, server.pem()).unwrap();
    std::fs::write(&paths.2, server_key.serialize_pem()).unwrap();
    paths
}

#[test]
fn an_https_upstream_with_a_private_ca_works_with_s3_ca_bundle_and_fails_clearly_without() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (ca, cert, key) = private_ca_and_server_cert(dir);
    let s3 = S3Server::start_tls(
        dir,
        free_port(),
        &TlsFiles {
            cert: &cert,
            key: &key,
            ca: &ca,
        },
    );
    s3.create_bucket("kv-cache");
    let keys = [
        ("AWS_ACCESS_KEY_ID", REAL_KEY_ID.to_string()),
        ("AWS_SECRET_ACCESS_KEY", REAL_SECRET.to_string()),
    ];
    // With a capacity, the gateway's own listing of the bucket (aws-sdk-s3)
    // must trust the CA too.
    let mut spec = serde_json::json!({
        "type": "s3",
        "s3_endpoint": format!("127.0.0.1:{}", s3.port),
        "s3_bucket": "kv-cache",
        "s3_region": "us-east-1",
        "max_capacity_gb": 1,
    });

    // Without the CA: the start-up HEAD fails on the certificate; LMCache
    // never starts.
    let out = small_bench_l2(dir, &spec, &keys).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "L2 tier 0 (s3): s3_ca_bundle: HEAD https://127.0.0.1:{}/kv-cache: the store's TLS certificate is not trusted: ",
            s3.port
        )),
        "{err}"
    );
    assert!(err.contains("UnknownIssuer"), "{err}");
    assert!(out.stdout.is_empty(), "LMCache ran: {err}");

    spec["s3_ca_bundle"] = ca.display().to_string().into();
    assert_bench_through_gateway(
        small_bench_l2(dir, &spec, &keys),
        &dir.join("bench-tls.log"),
        "AWS_ACCESS_KEY_ID",
        &[REAL_SECRET],
        &s3,
        &|_, _| {},
    );
}

#[test]
fn erebine_lmcache_stops_before_lmcache_starts_when_its_python_cannot_import_a_module_its_tiers_need(
) {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s3 = S3Server::with_bucket(dir, "kv-cache");
    // A stand-in environment: `lmcache` leaves a marker if it ever runs, and
    // `python3` is a real Python without site-packages, so without boto3 or
    // LMCache's raw-block extension.
    let bin = dir.join("venv/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let marker = dir.join("lmcache-ran");
    let script = |name: &str, text: String| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(bin.join(name), text).unwrap();
        std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    script(
        "lmcache",
        format!("#!/bin/sh\ntouch {}\n", marker.display()),
    );
    script("python3", "#!/bin/sh\nexec python3 -I -S \"$@\"\n".into());
    let spec = serde_json::json!({"type": "s3", "s3_endpoint": format!("127.0.0.1:{}", s3.port),
        "s3_bucket": "kv-cache", "s3_region": "us-east-1", "disable_tls": true,
        "aws_access_key_id": REAL_KEY_ID, "aws_secret_access_key": REAL_SECRET});
    let run = |args: &[&str]| {
        Command::new(BINS.erebine_lmcache())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", dir)
            .env("VIRTUAL_ENV", dir.join("venv"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["bench", "l2", "--l2-adapter", &spec.to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("No module named 'boto3'")
            && err.contains(&format!("`{}/python3 -m pip install boto3`", bin.display())),
        "{err}"
    );
    assert!(!err.contains(REAL_SECRET), "{err}");
    assert!(!marker.exists(), "lmcache was started");

    let raw_block = r#"{"type":"raw_block","device_path":"/dev/null"}"#;
    let out = run(&["server", "--l2-adapter", raw_block]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("No module named 'lmcache_rust_raw_block_io'")
            && err.contains(&format!("{}/python3", bin.display())),
        "{err}"
    );
    assert!(!marker.exists(), "lmcache was started");
}
