//! End to end: `s3` tiers with `s3_bucket` reach a path-style S3 server (moto
//! on loopback) through the gateway, from LMCache's own S3 adapter, and the
//! operator's real keys never reach the LMCache process.

use std::process::Command;
use std::time::{Duration, Instant};

use lmcache_tier_e2e::{
    binary, children_of, cmdline_and_environ, data_objects, free_port, launch_command,
    lmcache_venv, run_bench, stop_launch, wait_for_status, Proc, S3Server,
};

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
        if let (Some(port), Some(&child)) = (port, children_of(proc.pid()).first()) {
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
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s3 = S3Server::start(dir, free_port());
    s3.create_bucket("kv-cache");
    let spec = serde_json::json!({
        "type": "s3",
        "s3_endpoint": format!("127.0.0.1:{}", s3.port),
        "s3_bucket": "kv-cache",
        "s3_key_prefix": "node-a/",
        "s3_region": "us-east-1",
        "disable_tls": true,
    });
    let mut cmd = Command::new(binary("erebine-lmcache"));
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
    let key_id = seen
        .split("\"aws_access_key_id\":\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap()
        .to_string();
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
    let tmp = tempfile::tempdir().unwrap();
    let spec = r#"{"type":"s3","s3_endpoint":"127.0.0.1:9","s3_bucket":"Not_A_Bucket","s3_region":"us-east-1","disable_tls":true,"aws_access_key_id":"A","aws_secret_access_key":"S"}"#;
    let out = Command::new(binary("erebine-lmcache"))
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
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s3_port = free_port();
    let s3 = S3Server::start(dir, s3_port);
    s3.create_bucket("kv-cache");
    let fs_dir = dir.join("fs-tier");
    std::fs::create_dir_all(&fs_dir).unwrap();
    let cascade = serde_json::json!([
        {"type": "fs", "base_path": fs_dir, "max_capacity_gb": 50,
         "eviction": {"eviction_policy": "LRU", "trigger_watermark": 0.8, "eviction_ratio": 0.2}},
        {"shared": true, "type": "s3", "s3_endpoint": format!("127.0.0.1:{s3_port}"),
         "s3_bucket": "kv-cache", "s3_region": "us-east-1", "s3_prefer_http2": false,
         "disable_tls": true, "aws_access_key_id": REAL_KEY_ID,
         "aws_secret_access_key": REAL_SECRET, "max_capacity_gb": 20,
         "eviction": {"eviction_policy": "LRU", "trigger_watermark": 0.8, "eviction_ratio": 0.2}}
    ]);
    let (mp_port, http_port) = (free_port(), free_port());
    let mut cmd = launch_command(dir, mp_port, http_port, &[]);
    cmd.env("EREBINE_AGENT_LMCACHE_L2_ADAPTER", cascade.to_string())
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

    let bench = run_bench(dir, mp_port, http_port, 0, 3);
    assert!(bench.status.success(), "bench failed:\n{}", bench.output);
    assert!(!data_objects(&fs_dir).is_empty(), "nothing in the fs tier");
    let in_bucket = wait_for_keys(&s3, 1);
    assert!(
        in_bucket.iter().all(|k| k.starts_with("test-model@")),
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
    assert_eq!(gateway["credential_source"], "spec");
    let requests = &gateway["requests"];
    let stores = requests["put"].as_u64().unwrap() + requests["post"].as_u64().unwrap();
    assert!(stores >= 1, "no store counted: {gateway:#}");
    assert!(gateway["bytes_up"].as_u64().unwrap() > 0, "{gateway:#}");
    assert_eq!(gateway["upstream_unreachable"], 0, "{gateway:#}");

    // Outage: the bucket goes away mid-run; the node keeps serving from the
    // fs tier and the S3 errors do not hang it.
    s3.kill();
    let during = run_bench(dir, mp_port, http_port, 3, 6);
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
    let after = run_bench(dir, mp_port, http_port, 6, 9);
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
}

/// `lmcache-tier inspect --json --url <url>` for the node in `dir`: its exit
/// status and standard output.
fn inspect_json(dir: &std::path::Path, url: &str) -> (Option<i32>, String) {
    let out = Command::new(binary("lmcache-tier"))
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
        let keys = s3.list_keys("kv-cache");
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
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(tmp.path(), free_port());
    s3.create_bucket("kv-cache");
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
    let (args, _gateways) = runtime
        .block_on(lmcache_adapters::s3::Gateways::start(&args, &|_| None))
        .unwrap();
    let local: serde_json::Value = serde_json::from_str(&args[1]).unwrap();
    let host = local["s3_endpoint"].as_str().unwrap().to_string();
    let key_id = local["aws_access_key_id"].as_str().unwrap().to_string();
    let secret = local["aws_secret_access_key"].as_str().unwrap().to_string();
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
