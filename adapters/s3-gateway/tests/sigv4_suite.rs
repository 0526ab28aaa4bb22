//! The gateway's SigV4 check against AWS's own signing test suite, which
//! `aws-sigv4` ships in its crate source (`aws-signing-test-suite/v4/<case>`).
//! The gateway must build the same canonical request as AWS's reference, on
//! S3's rules, or real S3 clients' signatures would be refused.
//!
//! A case applies to S3 when:
//! 1. its signed request (`header-signed-request.txt`) is a valid HTTP/1.1
//!    request, as `httparse` (hyper's parser) reads it once its line ends
//!    are `\r\n`: folded header lines, a raw space in the request target, a
//!    request line without a version or a header section without its closing
//!    empty line are not (UTF-8 in the target is accepted, as hyper does); and
//! 2. the path in its canonical request (`header-canonical-request.txt`) is
//!    the request target's path exactly, since S3 signs the path as sent:
//!    never normalised, never encoded a second time.
//!
//! For each applicable case, [`canonical_request`] must equal AWS's, [`check`]
//! must accept the signed request with the case's credentials, scope and
//! time, and must refuse it once one byte of the path, the query, a signed
//! header's value or the signature is changed. The suite is found through
//! `cargo metadata`; a missing suite fails the test.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use http::{HeaderMap, HeaderName, HeaderValue};
use lmcache_s3_gateway::sigv4::{canonical_request, check, KeyPair, Rejection, Scope, Signed};
use sha2::{Digest, Sha256};

/// Cases that must be among the applied ones, so the test cannot pass with
/// none.
const MUST_APPLY: &[&str] = &[
    "get-vanilla",
    "get-vanilla-query-order-key-case",
    "get-slash-dot-slash-unnormalized",
    "get-slashes-unnormalized",
    "get-relative-relative-unnormalized",
    "get-vanilla-with-session-token",
    "post-x-www-form-urlencoded",
];

/// A signed request of the suite, as the gateway would receive it.
#[derive(Clone)]
struct Request {
    method: String,
    path: String,
    query: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Request {
    fn signed(&self) -> Signed<'_> {
        let (method, path, query) = (&self.method, &self.path, &self.query);
        Signed {
            method,
            path,
            query,
            headers: &self.headers,
        }
    }
}

/// The credentials, scope and time of a case (`context.json`).
struct Context {
    key: KeyPair,
    region: String,
    service: String,
    now: SystemTime,
}

impl Context {
    fn check(&self, request: &Request, payload_hash: &str) -> Result<(), Rejection> {
        let scope = Scope {
            region: &self.region,
            service: &self.service,
        };
        check(&request.signed(), &self.key, &scope, payload_hash, self.now)
    }
}

/// `aws-sigv4`'s `aws-signing-test-suite/v4`, located via `cargo metadata`.
fn suite_dir() -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo metadata: {stderr}");
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let dirs: Vec<PathBuf> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| p["name"] == "aws-sigv4")
        .filter_map(|p| p["manifest_path"].as_str())
        .map(|manifest| Path::new(manifest).with_file_name("aws-signing-test-suite/v4"))
        .collect();
    let found = dirs.iter().find(|d| d.is_dir()).cloned();
    found.unwrap_or_else(|| panic!("no AWS signing test suite in aws-sigv4's source: {dirs:?}"))
}

fn read(case: &Path, file: &str) -> String {
    let path = case.join(file);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Parses a suite request (`\n` line ends) as HTTP/1.1; `Err` says why it
/// is not a valid one. Header names become lower-case, repeated ones are
/// appended in order.
fn parse_request(text: &str) -> Result<Request, String> {
    let (head, body) = match text.split_once("\n\n") {
        Some((head, body)) => (format!("{head}\n\n"), body),
        None => (text.to_string(), ""),
    };
    let head = head.replace('\n', "\r\n");
    let mut slots = [httparse::EMPTY_HEADER; 32];
    let mut parsed = httparse::Request::new(&mut slots);
    match parsed.parse(head.as_bytes()) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err("header section never ends".into()),
        Err(e) => return Err(format!("not HTTP/1.1 ({e})")),
    }
    let mut headers = HeaderMap::new();
    for h in parsed.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).expect("header name");
        headers.append(
            name,
            HeaderValue::from_bytes(h.value).expect("header value"),
        );
    }
    let target = parsed.path.expect("complete request has a target");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Ok(Request {
        method: parsed.method.expect("method").to_string(),
        path: path.to_string(),
        query: query.to_string(),
        headers,
        body: body.as_bytes().to_vec(),
    })
}

fn context(case: &Path) -> Context {
    let json: serde_json::Value = serde_json::from_str(&read(case, "context.json")).expect("JSON");
    let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
    let creds = &json["credentials"];
    let timestamp = json["timestamp"].as_str().expect("timestamp");
    Context {
        key: KeyPair {
            access_key_id: text(&creds["access_key_id"]).expect("access_key_id"),
            secret_access_key: text(&creds["secret_access_key"]).expect("secret_access_key"),
            session_token: text(&creds["token"]),
        },
        region: text(&json["region"]).expect("region"),
        service: text(&json["service"]).expect("service"),
        now: humantime::parse_rfc3339(timestamp).expect("RFC 3339 timestamp"),
    }
}

/// `s` with the character at byte `at` (the last if `None`) changed to
/// `0`, or to `1` if it was `0`.
fn tweak(s: &str, at: Option<usize>) -> String {
    let at = at.unwrap_or(s.len() - 1);
    let new = if s[at..].starts_with('0') { "1" } else { "0" };
    let mut s = s.to_string();
    s.replace_range(at..at + 1, new);
    s
}

/// Replaces the (first) value of header `name` with `edit` of it.
fn edit_header(request: &mut Request, name: &str, edit: impl Fn(&str) -> String) {
    let value = request.headers.get_mut(name).expect("header present");
    *value = HeaderValue::from_str(&edit(value.to_str().expect("ASCII"))).expect("value");
}

/// Copies of `request` with one byte changed: `(what, request)`.
fn tampered(request: &Request, signed_headers: &str) -> Vec<(String, Request)> {
    let mut path = request.clone();
    path.path.push('x');
    let mut query = request.clone();
    query.query = match request.query.as_str() {
        "" => "tampered=1".into(),
        q => tweak(q, None),
    };
    let mut signature = request.clone();
    let digit = |auth: &str| auth.find("Signature=").expect("Signature") + "Signature=".len();
    edit_header(&mut signature, "authorization", |a| {
        tweak(a, Some(digit(a)))
    });
    let mut out = vec![("path".into(), path), ("query".into(), query)];
    out.push(("signature".into(), signature));
    if let Some(name) = signed_headers.split(';').rfind(|h| *h != "x-amz-date") {
        let mut header = request.clone();
        edit_header(&mut header, name, |v| tweak(v, None));
        out.push((format!("header {name}"), header));
    }
    out
}

/// Checks one applicable case against AWS's canonical request `expected`;
/// returns its failures.
fn check_case(name: &str, case: &Path, request: &Request, expected: &str) -> Vec<String> {
    let ctx = context(case);
    let mut failures = Vec::new();
    let hash = format!("{:x}", Sha256::digest(&request.body));
    if expected.lines().last() != Some(hash.as_str()) {
        failures.push(format!("{name}: body hash {hash} is not AWS's"));
    }
    let canonical = canonical_request(&request.signed(), &hash);
    if canonical.as_deref() != Ok(expected) {
        let got = canonical.unwrap_or_else(|e| format!("{e:?}"));
        failures.push(format!(
            "{name}: canonical request\nAWS:\n{expected}\ngateway:\n{got}"
        ));
    }
    if let Err(e) = ctx.check(request, &hash) {
        failures.push(format!("{name}: check refused the signed request: {e:?}"));
    }
    let signed_headers = expected.lines().rev().nth(1).unwrap_or_default();
    for (what, t) in tampered(request, signed_headers) {
        let verdict = ctx.check(&t, &hash);
        if verdict != Err(Rejection::Signature) {
            failures.push(format!("{name}: {what} changed by one byte: {verdict:?}"));
        }
    }
    failures
}

/// The request of a case if it applies to S3 (see the module doc), else
/// why not.
fn applicable(case: &Path, expected: &str) -> Result<Request, String> {
    let request = parse_request(&read(case, "header-signed-request.txt"))?;
    let canonical_path = expected.lines().nth(1).unwrap_or_default();
    if canonical_path != request.path {
        let target = &request.path;
        return Err(format!(
            "AWS signs path {canonical_path:?} for target path {target:?}"
        ));
    }
    Ok(request)
}

#[test]
fn the_gateway_check_agrees_with_aws_signing_suite_on_s3_cases() {
    let suite = suite_dir();
    let mut names: Vec<String> = fs::read_dir(&suite)
        .expect("suite dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let (mut applied, mut failures) = (Vec::new(), Vec::new());
    for name in names {
        let case = suite.join(&name);
        let expected = read(&case, "header-canonical-request.txt");
        match applicable(&case, &expected) {
            Ok(request) => {
                eprintln!("applied {name}");
                failures.extend(check_case(&name, &case, &request, &expected));
                applied.push(name);
            }
            Err(why) => eprintln!("skipped {name}: {why}"),
        }
    }
    eprintln!("{} cases applied", applied.len());
    for must in MUST_APPLY {
        assert!(applied.iter().any(|a| a == must), "{must} did not apply");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
