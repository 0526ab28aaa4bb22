//! Every key LMCache can send reaches the upstream exactly as
//! `/<bucket>/<prefix><key>`, signed so that a strict SigV4 check (the path
//! as sent, never normalised) accepts it, and nothing lands outside the
//! tier's prefix (`docs/s3-gateway.md`, "Object keys").
//!
//! The gateway runs in-process in front of a recording upstream: a loopback
//! TCP server that keeps each request's method, raw request target and
//! headers and answers `200` with no body. It checks nothing itself, so the
//! test sees the bytes the gateway sent; the strict check is
//! [`sigv4::verify`] with the real key, the check that AWS's signing suite
//! drives in `sigv4_suite.rs`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use lmcache_s3_gateway::sigv4::{self, KeyPair, Signed};
use lmcache_s3_gateway::Gateways;
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use proptest::prelude::*;

const BUCKET: &str = "kv-cache";
const REGION: &str = "us-east-1";
const PREFIXES: &[&str] = &["", "lmcache/node-a/", "run1-", "a.b/c..d/"];

/// What Python's `urllib.parse.quote` leaves unencoded (LMCache sends
/// `"/" + quote(key)`): letters, digits, `_ . - ~` and `/`.
const PYTHON_QUOTE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'_')
    .remove(b'.')
    .remove(b'-')
    .remove(b'~')
    .remove(b'/');

/// One request as the upstream received it.
#[derive(Debug, Clone)]
struct Received {
    method: String,
    target: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

/// A loopback upstream that records every request and answers 200.
fn recording_upstream() -> (SocketAddr, Arc<Mutex<Vec<Received>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let log = log.clone();
            std::thread::spawn(move || serve_recording(stream, &log));
        }
    });
    (addr, seen)
}

fn serve_recording(stream: TcpStream, log: &Mutex<Vec<Received>>) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    while let Some(mut received) = read_head(&mut reader) {
        let Some(body) = read_body(&mut reader, &received.headers) else {
            return;
        };
        received.body = body;
        log.lock().unwrap().push(received);
        let _ = writer.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
    }
}

/// A request body framed by `content-length` or chunked.
fn read_body(reader: &mut impl BufRead, headers: &HeaderMap) -> Option<Vec<u8>> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if header("transfer-encoding") == Some("chunked") {
        let mut body = Vec::new();
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                return Some(body);
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    let length = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(body)
}

fn read_head(reader: &mut impl BufRead) -> Option<Received> {
    let mut line = String::new();
    reader.read_line(&mut line).ok().filter(|n| *n > 0)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers = HeaderMap::new();
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let Some((name, value)) = line.trim_end().split_once(':') else {
            break;
        };
        headers.append(
            HeaderName::from_bytes(name.as_bytes()).ok()?,
            HeaderValue::from_str(value.trim()).ok()?,
        );
    }
    Some(Received {
        method,
        target,
        headers,
        body: Vec::new(),
    })
}

/// A running gateway for one prefix, in front of a recording upstream.
struct Tier {
    prefix: &'static str,
    gateway: SocketAddr,
    local_key: KeyPair,
    seen: Arc<Mutex<Vec<Received>>>,
    _gateways: Gateways,
}

fn real_key() -> KeyPair {
    KeyPair {
        access_key_id: "AKIAREALOPERATORKEY1".into(),
        secret_access_key: "real-secret-real-secret-real-secret-0123".into(),
        session_token: None,
    }
}

fn start_tier(runtime: &tokio::runtime::Runtime, prefix: &'static str) -> Tier {
    start_tier_as(runtime, prefix, None)
}

/// [`start_tier`] with the tier's `cache_identity` set to `identity`.
fn start_tier_as(
    runtime: &tokio::runtime::Runtime,
    prefix: &'static str,
    identity: Option<&str>,
) -> Tier {
    let (upstream, seen) = recording_upstream();
    let real = real_key();
    let mut spec = serde_json::json!({
        "type": "s3", "s3_endpoint": upstream.to_string(), "s3_bucket": BUCKET,
        "s3_key_prefix": prefix, "s3_region": REGION, "disable_tls": true,
        "aws_access_key_id": real.access_key_id, "aws_secret_access_key": real.secret_access_key,
    });
    if let Some(tag) = identity {
        spec["cache_identity"] = tag.into();
    }
    let args = vec!["--l2-adapter".to_string(), spec.to_string()];
    let (out, gateways) = runtime
        .block_on(Gateways::start_args(&args, &|_| None, None))
        .unwrap();
    let rewritten: serde_json::Value = serde_json::from_str(&out[1]).unwrap();
    assert!(
        rewritten.get("aws_secret_access_key").is_none(),
        "{rewritten}"
    );
    assert!(rewritten.get("cache_identity").is_none(), "{rewritten}");
    let local_key = gateways.key().unwrap().clone();
    seen.lock().unwrap().clear();
    Tier {
        prefix,
        gateway: gateways.addresses()[0].1,
        local_key,
        seen,
        _gateways: gateways,
    }
}

/// SigV4 headers for `method` on `target` (path and query as sent), as an
/// S3 client signs them: no normalisation, no second encoding.
fn sign_headers(method: &str, host: &str, target: &str, key: &KeyPair) -> Vec<(String, String)> {
    let uri = format!("http://{host}{target}");
    let headers = [("host", host)];
    let mut out = vec![("host".to_string(), host.to_string())];
    out.extend(
        sigv4::s3_signature(
            method,
            &uri,
            &headers,
            "UNSIGNED-PAYLOAD",
            &key.credentials(),
            REGION,
            SystemTime::now(),
        )
        .unwrap(),
    );
    out
}

/// Sends `method target` to the gateway, signed with its per-launch key,
/// over a raw connection (no client-side URL type in between). Returns the
/// status and body.
fn send(tier: &Tier, method: &str, target: &str) -> (u16, String) {
    send_raw(tier, method, target, target, "\r\n")
}

/// As [`send`], signed for `signed_target`, with `rest` after the signed
/// headers (more header lines, the empty line, a body).
fn send_raw(
    tier: &Tier,
    method: &str,
    target: &str,
    signed_target: &str,
    rest: &str,
) -> (u16, String) {
    let host = tier.gateway.to_string();
    let mut request = format!("{method} {target} HTTP/1.1\r\nconnection: close\r\n");
    for (name, value) in sign_headers(method, &host, signed_target, &tier.local_key) {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(rest);
    let mut stream = TcpStream::connect(tier.gateway).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// The upstream's last request, checked strictly with the real key.
fn last_forwarded(tier: &Tier) -> Received {
    let received = tier
        .seen
        .lock()
        .unwrap()
        .pop()
        .expect("a forwarded request");
    let (path, query) = received
        .target
        .split_once('?')
        .unwrap_or((&received.target, ""));
    let signed = Signed {
        method: &received.method,
        path,
        query,
        headers: &received.headers,
    };
    let verified = sigv4::verify(&signed, &real_key(), REGION, SystemTime::now());
    assert!(verified.is_ok(), "{received:?}: {verified:?}");
    received
}

/// The object key an upstream request names: its path after `/<bucket>/`,
/// percent-decoded once.
fn stored_key(target: &str) -> String {
    let path = target.split('?').next().unwrap();
    let rest = path
        .strip_prefix(&format!("/{BUCKET}/"))
        .unwrap_or_else(|| panic!("{path} is not in /{BUCKET}/"));
    String::from_utf8(percent_decode_str(rest).collect()).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// A model-name segment: path syntax, reserved and non-ASCII characters,
/// or anything but `@` (which LMCache never puts in a model name).
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "",
            ".",
            "..",
            "m",
            "org",
            "Qwen2.5-7B",
            "m+lora v2",
            "模型",
            "é",
            "a%2Fb",
            "%2E%2E",
            "x~y",
            "!*'()",
            "a;b=c",
            "#?&",
            "./",
        ])
        .prop_map(String::from),
        "[^@]{0,10}",
    ]
}

/// An object key as LMCache builds it: `<model>@<kv_rank>@<group>@<hash>`
/// and an optional `@<salt>`.
fn lmcache_key() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(segment(), 1..5),
        any::<u32>(),
        0u8..4,
        prop::collection::vec(any::<u8>(), 16..=32),
        prop::option::of("[^@]{1,8}"),
    )
        .prop_map(|(model, rank, group, hash, salt)| {
            let hash: String = hash.iter().map(|b| format!("{b:02x}")).collect();
            let mut key = format!("{}@{rank:08x}@{group:x}@{hash}", model.join("/"));
            if let Some(salt) = salt {
                key.push('@');
                key.push_str(&salt);
            }
            key
        })
}

#[test]
fn every_key_lmcache_can_send_reaches_the_upstream_exactly_under_the_prefix() {
    let runtime = runtime();
    let tiers: Vec<Tier> = PREFIXES.iter().map(|p| start_tier(&runtime, p)).collect();
    let config = ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    };
    proptest!(config, |(key in lmcache_key(), which in 0..PREFIXES.len(), method in prop::sample::select(vec!["GET", "HEAD", "PUT", "DELETE"]))| {
        let tier = &tiers[which];
        let target = format!("/{}", utf8_percent_encode(&key, PYTHON_QUOTE));
        let (status, body) = send(tier, method, &target);
        prop_assert_eq!(status, 200, "{} {}: {}", method, target, body);
        let received = last_forwarded(tier);
        prop_assert_eq!(&received.method, method);
        prop_assert_eq!(stored_key(&received.target), format!("{}{key}", tier.prefix));
    });
}

#[test]
fn encoded_path_syntax_in_the_request_is_key_bytes_decoded_once() {
    let runtime = runtime();
    let tier = start_tier(&runtime, "lmcache/node-a/");
    for (target, upstream) in [
        (
            "/./m%40k%400%40aa",
            "/kv-cache/lmcache/node-a/./m%40k%400%40aa",
        ),
        (
            "/../../other-bucket/x%40k%400%40aa",
            "/kv-cache/lmcache/node-a/../../other-bucket/x%40k%400%40aa",
        ),
        ("//abs/m%40k", "/kv-cache/lmcache/node-a//abs/m%40k"),
        ("/a%2F%2E%2E%2Fb%40k", "/kv-cache/lmcache/node-a/a/../b%40k"),
        (
            "/org/m+lora%20v2%40k",
            "/kv-cache/lmcache/node-a/org/m%2Blora%20v2%40k",
        ),
        ("/%25%2B%40k", "/kv-cache/lmcache/node-a/%25%2B%40k"),
        (
            "/m%40k?partNumber=2&uploadId=a%2Fb+c",
            "/kv-cache/lmcache/node-a/m%40k?partNumber=2&uploadId=a%2Fb%20c",
        ),
    ] {
        let (status, body) = send(&tier, "PUT", target);
        assert_eq!(status, 200, "{target}: {body}");
        assert_eq!(last_forwarded(&tier).target, upstream, "{target}");
    }
}

/// A tier with a cache identity: every object request of LMCache, a
/// multipart one too, and every listing go to the identity's segment under
/// the prefix, and LMCache's spec never carries the tag.
#[test]
fn a_tiers_cache_identity_puts_every_request_under_its_segment() {
    let runtime = runtime();
    let tag = "0123456789abcdef";
    for prefix in ["", "lmcache/node-a/"] {
        let tier = start_tier_as(&runtime, prefix, Some(tag));
        let under = format!("{prefix}cache-identity-{tag}/");
        for method in ["GET", "HEAD", "PUT", "DELETE"] {
            let (status, body) = send(&tier, method, "/org/m%40k%400%40aa");
            assert_eq!(status, 200, "{method}: {body}");
            let received = last_forwarded(&tier);
            assert_eq!(stored_key(&received.target), format!("{under}org/m@k@0@aa"));
        }
        let (status, body) = send(&tier, "PUT", "/m%40k?partNumber=2&uploadId=u");
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            stored_key(&last_forwarded(&tier).target),
            format!("{under}m@k")
        );
        let (status, body) = send(&tier, "GET", "/?list-type=2&prefix=org%2F");
        assert_eq!(status, 200, "{body}");
        let listing = last_forwarded(&tier).target;
        let encoded = under.replace('/', "%2F");
        assert_eq!(
            listing,
            format!("/{BUCKET}?list-type=2&prefix={encoded}org%2F"),
            "{prefix}"
        );
    }
}

#[test]
fn listings_stay_inside_the_prefix_with_their_bytes() {
    let runtime = runtime();
    let tier = start_tier(&runtime, "lmcache/node-a/");
    for (target, upstream) in [
        (
            "/?list-type=2",
            "/kv-cache?list-type=2&prefix=lmcache%2Fnode-a%2F",
        ),
        (
            "/?list-type=2&prefix=..%2F..%2Fother&start-after=%2Fa+b&continuation-token=t%2Bk%3D",
            "/kv-cache?list-type=2&prefix=lmcache%2Fnode-a%2F..%2F..%2Fother&start-after=lmcache%2Fnode-a%2F%2Fa%20b&continuation-token=t%2Bk%3D",
        ),
        (
            "/?list-type=2&pre%66ix=x",
            "/kv-cache?list-type=2&prefix=lmcache%2Fnode-a%2Fx",
        ),
    ] {
        let (status, body) = send(&tier, "GET", target);
        assert_eq!(status, 200, "{target}: {body}");
        assert_eq!(last_forwarded(&tier).target, upstream, "{target}");
    }
    let (status, body) = send(&tier, "GET", "/?list-type=2&encoding-type=url");
    assert_eq!(status, 501, "{body}");
    assert!(tier.seen.lock().unwrap().is_empty(), "forwarded: {body}");
}

#[test]
fn keys_that_cannot_be_forwarded_exactly_get_an_s3_error_and_nothing_is_forwarded() {
    let runtime = runtime();
    let tier = start_tier(&runtime, "lmcache/node-a/");
    let at_limit = "k".repeat(1024 - tier.prefix.len());
    let (status, body) = send(&tier, "PUT", &format!("/{at_limit}"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(stored_key(&last_forwarded(&tier).target).len(), 1024);
    for (target, code) in [
        (format!("/{at_limit}k"), "KeyTooLongError"),
        ("/m%FF%40k".to_string(), "InvalidURI"),
    ] {
        let (status, body) = send(&tier, "PUT", &target);
        assert_eq!(status, 400, "{body}");
        assert!(body.contains(&format!("<Code>{code}</Code>")), "{body}");
        assert!(tier.seen.lock().unwrap().is_empty(), "{code}: forwarded");
    }
}

#[test]
fn requests_that_would_leave_the_prefix_or_change_access_are_refused_unforwarded() {
    let runtime = runtime();
    let tier = start_tier(&runtime, "");
    for (method, target, signed, rest, code) in [
        ("DELETE", "foo", "/", "\r\n", "InvalidURI"),
        ("PUT", "/k%zz", "/k%zz", "\r\n", "InvalidURI"),
        (
            "PUT",
            "/k",
            "/k",
            "x-amz-copy-source: /other-bucket/secret\r\n\r\n",
            "NotImplemented",
        ),
        (
            "PUT",
            "/k",
            "/k",
            "x-amz-acl: public-read\r\n\r\n",
            "NotImplemented",
        ),
        ("PUT", "/k?acl", "/k?acl", "\r\n", "NotImplemented"),
        (
            "GET",
            "/?list-type=2&policy",
            "/?list-type=2&policy",
            "\r\n",
            "NotImplemented",
        ),
    ] {
        let (status, body) = send_raw(&tier, method, target, signed, rest);
        assert!(
            body.contains(&format!("<Code>{code}</Code>")),
            "{method} {target} {rest:?}: {status} {body}"
        );
        assert!(
            tier.seen.lock().unwrap().is_empty(),
            "{method} {target}: forwarded"
        );
    }
}

#[test]
fn headers_that_would_set_more_than_the_objects_bytes_are_not_forwarded() {
    let runtime = runtime();
    let tier = start_tier(&runtime, "p/");
    let extra = "content-type: application/octet-stream\r\nx-amz-object-lock-mode: COMPLIANCE\r\n\
                 x-amz-tagging: a=b\r\nx-amz-storage-class: DEEP_ARCHIVE\r\n\
                 x-amz-website-redirect-location: https://elsewhere.example/\r\n\
                 x-amz-meta-owner: me\r\ncontent-length: 2\r\n\r\nhi";
    let (status, body) = send_raw(&tier, "PUT", "/h%40k", "/h%40k", extra);
    assert_eq!(status, 200, "{body}");
    let received = last_forwarded(&tier);
    let mut names: Vec<&str> = received.headers.keys().map(|n| n.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "authorization",
            "content-length",
            "content-type",
            "host",
            "x-amz-content-sha256",
            "x-amz-date"
        ]
    );
    assert_eq!(received.body, b"hi");
}

#[test]
fn a_chunked_upload_is_forwarded_with_its_bytes() {
    let runtime = runtime();
    let tier = start_tier(&runtime, "p/");
    let chunked = "transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    let (status, body) = send_raw(&tier, "PUT", "/c%40k", "/c%40k", chunked);
    assert_eq!(status, 200, "{body}");
    let received = last_forwarded(&tier);
    assert_eq!(stored_key(&received.target), "p/c@k");
    assert_eq!(received.body, b"hello world");
}
