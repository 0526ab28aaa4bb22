//! Checking the AWS Signature Version 4 of a request that arrives at the
//! gateway, against the per-launch key.
//!
//! The rule is AWS's "Create a signed AWS API request" (SigV4, header form):
//! canonical request = method, the URI path as sent (S3 does not encode it a
//! second time), the query with names and values URI-encoded and sorted, the
//! signed headers `name:trimmed value` in `SignedHeaders` order, the
//! `SignedHeaders` list and the payload hash (`x-amz-content-sha256`); string to
//! sign = `AWS4-HMAC-SHA256`, `x-amz-date`, the credential scope and the
//! hex SHA-256 of the canonical request; signature = HMAC-SHA256 with the key
//! derived from the secret, date, region and service. The key derivation and
//! the final HMAC are `aws-sigv4`'s.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use http::HeaderMap;
use percent_encoding::{percent_decode_str, AsciiSet, NON_ALPHANUMERIC};
use sha2::{Digest, Sha256};

/// A key pair for SigV4: the operator's real one, or the one made for a
/// launch. `Debug` never prints the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPair {
    /// The access key id.
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: String,
    /// A session token of temporary credentials.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPair")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

impl KeyPair {
    /// The pair as `aws-sigv4` signs with it.
    pub fn credentials(&self) -> Credentials {
        Credentials::new(
            &self.access_key_id,
            &self.secret_access_key,
            self.session_token.clone(),
            None,
            "key pair",
        )
    }

    /// A fresh random pair for one launch: a 20-character id starting with
    /// `EREBINE` and a 40-character secret, from the OS random source.
    /// Errors only when the OS has no random source.
    pub fn random() -> std::io::Result<Self> {
        const ID_CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
        const SECRET_CHARS: &[u8] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut bytes = [0u8; 53];
        getrandom::getrandom(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
        let id: String = bytes[..13]
            .iter()
            .map(|b| ID_CHARS[usize::from(*b) % ID_CHARS.len()] as char)
            .collect();
        let secret: String = bytes[13..]
            .iter()
            .map(|b| SECRET_CHARS[usize::from(*b) % SECRET_CHARS.len()] as char)
            .collect();
        Ok(KeyPair {
            access_key_id: format!("EREBINE{id}"),
            secret_access_key: secret,
            session_token: None,
        })
    }
}

/// Characters SigV4 leaves unencoded: `A-Z a-z 0-9 - _ . ~`.
pub(crate) const SIGV4_QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// How far a request's `x-amz-date` may be from our clock (AWS allows 15 min).
const MAX_SKEW: Duration = Duration::from_secs(15 * 60);

/// Why a request's signature is not accepted (the gateway answers 403 with
/// this text as the S3 error message).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Rejection {
    /// No `Authorization` header, or not in the SigV4 header form.
    #[error("missing or malformed SigV4 Authorization header")]
    Malformed,
    /// Signed with another access key id.
    #[error("the access key id is not this gateway's")]
    UnknownKey,
    /// The scope names another region or service (`region/service`
    /// expected).
    #[error("the credential scope is not <date>/{0}/aws4_request")]
    Scope(String),
    /// `x-amz-date` missing, malformed, or too far from now.
    #[error("x-amz-date is missing or more than 15 minutes from the gateway's clock")]
    Time,
    /// The signature does not match.
    #[error("the request signature does not match")]
    Signature,
}

/// The parts of a request the signature covers.
pub struct Signed<'a> {
    /// The HTTP method, e.g. `PUT`.
    pub method: &'a str,
    /// The path exactly as received, e.g. `/model%40...`.
    pub path: &'a str,
    /// The query exactly as received, without `?`; `""` for none.
    pub query: &'a str,
    /// The request headers.
    pub headers: &'a HeaderMap,
}

/// Why a request could not be signed (a header value or URI that SigV4
/// cannot take).
#[derive(Debug, thiserror::Error)]
#[error("cannot sign the request: {0}")]
pub struct SigningFailed(String);

/// The SigV4 headers an S3 client adds to a request: `x-amz-date`,
/// `x-amz-content-sha256` (= `payload_hash`: the body's hex SHA-256, or
/// `UNSIGNED-PAYLOAD`), `authorization`, and `x-amz-security-token` for
/// temporary credentials. `headers` (`host` among them) are signed, and the
/// path and query of `uri` are signed exactly as given: never normalised,
/// never encoded a second time (S3's rule). Service `s3` in `region` at
/// `time`.
pub fn s3_signature(
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    payload_hash: &str,
    credentials: &Credentials,
    region: &str,
    time: SystemTime,
) -> Result<Vec<(String, String)>, SigningFailed> {
    let failed = |e: &dyn std::fmt::Display| SigningFailed(e.to_string());
    let identity = credentials.clone().into();
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("s3")
        .time(time)
        .settings(settings)
        .build()
        .map_err(|e| failed(&e))?
        .into();
    let signable = SignableRequest::new(
        method,
        uri,
        headers.iter().copied(),
        SignableBody::Precomputed(payload_hash.to_string()),
    )
    .map_err(|e| failed(&e))?;
    let (instructions, _) = sign(signable, &params)
        .map_err(|e| failed(&e))?
        .into_parts();
    Ok(instructions
        .headers()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect())
}

/// Checks an S3 request against `key` and `region` at time `now`. Returns
/// the payload hash it was signed with (`x-amz-content-sha256`, which S3
/// requires and the gateway forwards upstream).
pub fn verify(
    request: &Signed<'_>,
    key: &KeyPair,
    region: &str,
    now: SystemTime,
) -> Result<String, Rejection> {
    let payload_hash = header(request, "x-amz-content-sha256").ok_or(Rejection::Malformed)?;
    let scope = Scope {
        region,
        service: "s3",
    };
    check(request, key, &scope, payload_hash, now)?;
    Ok(payload_hash.to_string())
}

/// Where a signature is valid: the region and service of its credential
/// scope (`<date>/<region>/<service>/aws4_request`).
pub struct Scope<'a> {
    /// The region, e.g. `us-east-1`.
    pub region: &'a str,
    /// The service, `s3` for the gateway.
    pub service: &'a str,
}

/// Checks the header-form SigV4 signature of `request` against `key` in
/// `scope` at time `now`, for a body whose hash is `payload_hash` (hex
/// SHA-256, or `UNSIGNED-PAYLOAD`). The canonical request is
/// [`canonical_request`]'s: the path exactly as sent, never normalised.
pub fn check(
    request: &Signed<'_>,
    key: &KeyPair,
    scope: &Scope<'_>,
    payload_hash: &str,
    now: SystemTime,
) -> Result<(), Rejection> {
    let auth = Authorization::parse(request)?;
    let (key_id, credential_scope) = auth
        .credential
        .split_once('/')
        .ok_or(Rejection::Malformed)?;
    if !constant_time_eq(key_id.as_bytes(), key.access_key_id.as_bytes()) {
        return Err(Rejection::UnknownKey);
    }
    let amz_date = header(request, "x-amz-date").ok_or(Rejection::Time)?;
    let signed_at = parse_amz_date(amz_date).ok_or(Rejection::Time)?;
    let skew = now
        .duration_since(signed_at)
        .or_else(|_| signed_at.duration_since(now))
        .unwrap_or(Duration::MAX);
    if skew > MAX_SKEW {
        return Err(Rejection::Time);
    }
    let (region, service) = (scope.region, scope.service);
    if credential_scope != format!("{}/{region}/{service}/aws4_request", &amz_date[..8]) {
        return Err(Rejection::Scope(format!("{region}/{service}")));
    }
    let canonical = canonical_request(request, payload_hash)?;
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{credential_scope}\n{}",
        hex(&Sha256::digest(canonical.as_bytes()))
    );
    let signing_key = aws_sigv4::sign::v4::generate_signing_key(
        &key.secret_access_key,
        signed_at,
        region,
        service,
    );
    let expected = aws_sigv4::sign::v4::calculate_signature(signing_key, string_to_sign.as_bytes());
    if constant_time_eq(expected.as_bytes(), auth.signature.as_bytes()) {
        Ok(())
    } else {
        Err(Rejection::Signature)
    }
}

/// The SigV4 canonical request of `request` as S3 builds it: method; the
/// URI path exactly as sent (no normalisation, no second encoding); the
/// query with names and values URI-encoded and sorted; each header in the
/// `Authorization` header's `SignedHeaders` as `name:value` (values
/// trimmed, inner whitespace runs as one space, repeated headers joined by
/// `,`); the `SignedHeaders` list; `payload_hash`.
///
/// Errors: no SigV4 `Authorization` header, `host` not signed
/// ([`Rejection::Malformed`]), a signed header missing
/// ([`Rejection::Signature`]).
pub fn canonical_request(request: &Signed<'_>, payload_hash: &str) -> Result<String, Rejection> {
    let signed_headers = Authorization::parse(request)?.signed_headers;
    if !signed_headers.split(';').any(|h| h == "host") {
        return Err(Rejection::Malformed);
    }
    let path = if request.path.is_empty() {
        "/"
    } else {
        request.path
    };
    let mut canonical = format!(
        "{}\n{path}\n{}\n",
        request.method,
        canonical_query(request.query)
    );
    for name in signed_headers.split(';') {
        let values: Vec<String> = request
            .headers
            .get_all(name)
            .iter()
            .map(|v| {
                String::from_utf8_lossy(v.as_bytes())
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        if values.is_empty() {
            return Err(Rejection::Signature);
        }
        canonical.push_str(&format!("{name}:{}\n", values.join(",")));
    }
    canonical.push_str(&format!("\n{signed_headers}\n{payload_hash}"));
    Ok(canonical)
}

/// The fields of a SigV4 `Authorization` header.
struct Authorization<'a> {
    credential: &'a str,
    signed_headers: &'a str,
    signature: &'a str,
}

impl<'a> Authorization<'a> {
    fn parse(request: &Signed<'a>) -> Result<Self, Rejection> {
        let fields = header(request, "authorization")
            .and_then(|auth| auth.strip_prefix("AWS4-HMAC-SHA256 "))
            .ok_or(Rejection::Malformed)?;
        let (mut credential, mut signed_headers, mut signature) = (None, None, None);
        for field in fields.split(',') {
            match field.trim().split_once('=') {
                Some(("Credential", v)) => credential = Some(v),
                Some(("SignedHeaders", v)) => signed_headers = Some(v),
                Some(("Signature", v)) => signature = Some(v),
                _ => {}
            }
        }
        match (credential, signed_headers, signature) {
            (Some(credential), Some(signed_headers), Some(signature)) => Ok(Authorization {
                credential,
                signed_headers,
                signature,
            }),
            _ => Err(Rejection::Malformed),
        }
    }
}

/// The trimmed text of header `name` of `request`, if it has one.
fn header<'a>(request: &Signed<'a>, name: &str) -> Option<&'a str> {
    request
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// The parameters of a raw query, each `(name, value)` form-decoded once
/// (`+` is a space, then `%XX` sequences), as AWS's signer and S3 read a
/// query; `None` for a parameter without `=`.
pub fn query_pairs(query: &str) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let decode = |part: &str| -> Vec<u8> { percent_decode_str(&part.replace('+', " ")).collect() };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) => (decode(name), Some(decode(value))),
            None => (decode(pair), None),
        })
        .collect()
}

/// The SigV4 canonical query string of a raw query: each `name=value`
/// ([`query_pairs`]) URI-encoded, sorted by name, then value.
pub(crate) fn canonical_query(query: &str) -> String {
    let encode = |bytes: &[u8]| percent_encoding::percent_encode(bytes, SIGV4_QUERY).to_string();
    let mut pairs: Vec<(String, String)> = query_pairs(query)
        .iter()
        .map(|(name, value)| (encode(name), encode(value.as_deref().unwrap_or_default())))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Parses `YYYYMMDDTHHMMSSZ` (UTC).
fn parse_amz_date(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(range)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (y, m, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (hh, mm, ss) = (num(9..11)?, num(11..13)?, num(13..15)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Days from the civil date (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> KeyPair {
        KeyPair {
            access_key_id: "EREBINEABCDEFGHIJKLM".into(),
            secret_access_key: "secretsecretsecretsecretsecretsecret1234".into(),
            session_token: None,
        }
    }

    /// Signs like an S3 client: aws-sigv4 with S3's settings.
    fn signed_headers(
        method: &str,
        uri: &str,
        key: &KeyPair,
        region: &str,
        at: SystemTime,
    ) -> HeaderMap {
        let host = [("host", "127.0.0.1:9")];
        let signature = s3_signature(
            method,
            uri,
            &host,
            "UNSIGNED-PAYLOAD",
            &key.credentials(),
            region,
            at,
        )
        .unwrap();
        let mut map = HeaderMap::new();
        for (name, value) in host
            .iter()
            .copied()
            .chain(signature.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        {
            map.insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    fn check(
        method: &str,
        uri: &str,
        headers: &HeaderMap,
        now: SystemTime,
    ) -> Result<String, Rejection> {
        let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
        verify(
            &Signed {
                method,
                path,
                query,
                headers,
            },
            &key(),
            "r1",
            now,
        )
    }

    #[test]
    fn a_request_signed_with_the_key_is_accepted() {
        let now = SystemTime::now();
        let uri = "http://127.0.0.1:9/m%40000@0@abc?partNumber=2&uploadId=a%2Fb";
        let headers = signed_headers("PUT", uri, &key(), "r1", now);
        let path_and_query = "/m%40000@0@abc?partNumber=2&uploadId=a%2Fb";
        assert_eq!(
            check("PUT", path_and_query, &headers, now),
            Ok("UNSIGNED-PAYLOAD".into())
        );
        let list = signed_headers(
            "GET",
            "http://127.0.0.1:9/?list-type=2&prefix=a%40b",
            &key(),
            "r1",
            now,
        );
        assert!(check("GET", "/?list-type=2&prefix=a%40b", &list, now).is_ok());
    }

    #[test]
    fn wrong_key_region_time_or_tampering_is_rejected() {
        let now = SystemTime::now();
        let uri = "http://127.0.0.1:9/obj";
        let mut other = key();
        other.secret_access_key = "x".repeat(40);
        let h = signed_headers("GET", uri, &other, "r1", now);
        assert_eq!(check("GET", "/obj", &h, now), Err(Rejection::Signature));
        let h = signed_headers("GET", uri, &key(), "r1", now);
        assert_eq!(check("PUT", "/obj", &h, now), Err(Rejection::Signature));
        assert_eq!(check("GET", "/obj2", &h, now), Err(Rejection::Signature));
        assert_eq!(
            check("GET", "/obj", &h, now + Duration::from_secs(3600)),
            Err(Rejection::Time)
        );
        let h = signed_headers("GET", uri, &key(), "elsewhere", now);
        assert!(matches!(
            check("GET", "/obj", &h, now),
            Err(Rejection::Scope(_))
        ));
        let mut stranger = key();
        stranger.access_key_id = "AKIAOTHER00000000000".into();
        let h = signed_headers("GET", uri, &stranger, "r1", now);
        assert_eq!(check("GET", "/obj", &h, now), Err(Rejection::UnknownKey));
        assert_eq!(
            check("GET", "/obj", &HeaderMap::new(), now),
            Err(Rejection::Malformed)
        );
    }

    #[test]
    fn amz_dates_parse_to_utc() {
        let t = parse_amz_date("20240229T235959Z").unwrap();
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap().as_secs(),
            1_709_251_199
        );
        assert!(parse_amz_date("2024-02-29T23:59:59Z").is_none());
        assert!(parse_amz_date("20241301T000000Z").is_none());
    }

    #[test]
    fn canonical_queries_are_sorted_and_encoded() {
        assert_eq!(
            canonical_query("uploadId=a/b&partNumber=1&uploads"),
            "partNumber=1&uploadId=a%2Fb&uploads="
        );
    }

    #[test]
    fn random_key_pairs_differ_and_debug_hides_the_secret() {
        let a = KeyPair::random().unwrap();
        let b = KeyPair::random().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.access_key_id.len(), 20);
        assert_eq!(a.secret_access_key.len(), 40);
        assert!(!format!("{a:?}").contains(&a.secret_access_key));
    }
}
