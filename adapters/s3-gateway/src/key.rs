//! What the gateway forwards of a request LMCache sent (`docs/s3-gateway.md`,
//! "Object keys"): its route ([`route`]: the object key, and the exact
//! upstream path and query that carry it, or the [`Refusal`] to answer) and
//! its headers ([`forwarded_header`]). Only what LMCache's S3 adapter sends
//! is forwarded, since any local user can read the per-launch key.
//!
//! S3 keys are opaque byte strings: `.`, `..`, empty segments, a leading
//! `/`, `+`, `%` and non-ASCII are bytes of the key, never path syntax.
//! LMCache builds keys from the model name (`<model>@<rank>@<group>@<hash>`,
//! `/` kept) and sends `"/" + quote(key)`. The gateway decodes that path
//! once ([`request_key`]) and writes `/<bucket>/<prefix><key>` upstream
//! ([`upstream_path`]) in the one form every S3 store reads the same way:
//! each byte outside `A-Z a-z 0-9 - _ . ~ /` percent-encoded (`+` as
//! `%2B`), `/` and dot segments as they are. That path is also its own
//! SigV4 canonical URI, whether the store takes the path as sent (S3's
//! rule) or decodes and re-encodes it, so the store sees the same key; one
//! that removes dot segments before it checks the signature refuses it.
//! Nothing between the gateway and the store may normalise the path, which
//! is why the gateway's client sends an `http::Uri`, not a WHATWG URL.

use percent_encoding::{percent_decode_str, percent_encode, utf8_percent_encode, AsciiSet};

use super::sigv4::{query_pairs, SIGV4_QUERY};

/// What an S3 key keeps unencoded in a path: SigV4's unreserved
/// characters and `/`.
const KEY_IN_PATH: &AsciiSet = &SIGV4_QUERY.remove(b'/');

/// S3's limit on the UTF-8 length of an object key, in bytes (the tier's
/// prefix included).
pub const MAX_KEY_BYTES: usize = 1024;

/// The methods LMCache's S3 adapter sends (a listing is a `GET`).
const METHODS: &[&str] = &["GET", "HEAD", "PUT", "POST", "DELETE"];

/// The query parameters of the object requests LMCache sends: multipart
/// uploads (create, upload part, complete, abort) and the SDK's operation
/// id.
const OBJECT_PARAMETERS: &[&str] = &["uploads", "uploadId", "partNumber", "x-id"];

/// The query parameters of ListObjectsV2 the gateway forwards. Not
/// `encoding-type` (the answer's keys would be encoded, and the tier's
/// prefix could not be stripped from them), nor `fetch-owner` (the answer
/// would name the real credentials' account).
const LISTING_PARAMETERS: &[&str] = &[
    "list-type",
    "prefix",
    "delimiter",
    "max-keys",
    "continuation-token",
    "start-after",
];

/// Why a request is not forwarded; the gateway answers with this S3 error
/// ([`Refusal::status`], [`Refusal::code`], the text as message) and
/// forwards nothing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    /// The request target does not start with `/` (S3: 400 `InvalidURI`).
    #[error("the request target is not a path")]
    NotAPath,
    /// A `%` in the path or query is not followed by two hex digits (S3:
    /// 400 `InvalidURI`).
    #[error("the path or query has a '%' that is not followed by two hex digits")]
    BadEscape,
    /// The percent-decoded path is not UTF-8 (S3: 400 `InvalidURI`).
    #[error("the object key is not UTF-8 after percent-decoding the path once")]
    NotUtf8,
    /// Prefix and key together exceed [`MAX_KEY_BYTES`] (S3: 400
    /// `KeyTooLongError`).
    #[error(
        "the object key is {bytes} bytes with the tier's s3_key_prefix; S3 allows at most 1024"
    )]
    TooLong {
        /// The UTF-8 length of prefix and key, in bytes.
        bytes: usize,
    },
    /// A method LMCache does not send (501).
    #[error("the gateway does not forward {0} requests")]
    Method(String),
    /// A bucket-level request other than ListObjectsV2 (501).
    #[error("the gateway serves object requests and ListObjectsV2 (GET /?list-type=2) only")]
    NotListV2,
    /// A query parameter LMCache does not send: another subresource of the
    /// object or bucket (501).
    #[error("the gateway does not forward the query parameter {0:?}")]
    Parameter(String),
    /// A header that names another object or grants access (501).
    #[error(
        "the gateway does not forward the header {0} (it names another object or grants access)"
    )]
    Header(String),
    /// A key in the bucket bound's own folder ([`crate::fleet::RESERVED`]:
    /// its lease and the nodes' reports), which only the gateways write
    /// (403): LMCache never names one, and a write there could steer the
    /// fleet's evictions.
    #[error("the key {0:?} is in the bucket bound's own folder, which only the gateways write")]
    Reserved(String),
}

impl Refusal {
    /// The HTTP status the gateway answers with.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::Method(_)
            | Refusal::NotListV2
            | Refusal::Parameter(_)
            | Refusal::Header(_) => 501,
            Refusal::Reserved(_) => 403,
            _ => 400,
        }
    }

    /// The S3 error code the gateway answers with.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::NotAPath | Refusal::BadEscape | Refusal::NotUtf8 => "InvalidURI",
            Refusal::TooLong { .. } => "KeyTooLongError",
            Refusal::Reserved(_) => "AccessDenied",
            _ => "NotImplemented",
        }
    }
}

/// Where a request goes upstream: its path and query, encoded, ready to
/// send and sign.
#[derive(Debug, PartialEq, Eq)]
pub struct Route {
    /// `/<bucket>/<prefix + key>`, or `/<bucket>` for a listing.
    pub path: String,
    /// The query, re-encoded; `""` for none.
    pub query: String,
    /// Whether it is a ListObjectsV2 request, whose answer loses the prefix.
    pub listing: bool,
}

/// The route of a request LMCache sent to the gateway: `method`, `path` and
/// `query` as received, and the names of its headers. `/` with `GET
/// ?list-type=2` is the bucket's listing inside `key_prefix`
/// ([`listing_query`]); any other path an object ([`request_key`],
/// [`upstream_path`], [`object_query`]). Errors with the [`Refusal`] to
/// answer.
pub fn route<'a>(
    method: &str,
    path: &str,
    query: &str,
    mut header_names: impl Iterator<Item = &'a str>,
    bucket: &str,
    key_prefix: &str,
) -> Result<Route, Refusal> {
    if !METHODS.contains(&method) {
        return Err(Refusal::Method(method.to_string()));
    }
    if !path.starts_with('/') {
        return Err(Refusal::NotAPath);
    }
    if !escapes_ok(path) || !escapes_ok(query) {
        return Err(Refusal::BadEscape);
    }
    if let Some(name) = header_names.find(|name| refused_header(name)) {
        return Err(Refusal::Header(name.to_string()));
    }
    if path == "/" {
        if method != "GET" {
            return Err(Refusal::NotListV2);
        }
        return Ok(Route {
            path: format!("/{bucket}"),
            query: listing_query(query, key_prefix)?,
            listing: true,
        });
    }
    let key = request_key(path)?;
    Ok(Route {
        path: upstream_path(bucket, key_prefix, &key)?,
        query: object_query(query)?,
        listing: false,
    })
}

/// Refuses the object request for `path` (as received) when its key,
/// under the tier's `object_prefix` (the key prefix and the cache
/// identity's segment), names the bucket bound's folder
/// ([`crate::fleet::RESERVED`] under `key_prefix`: its lease and the
/// nodes' reports) or a key in it: as S3 reads keys (bytes), or as a store
/// that maps keys to files reads them (`.` and empty segments dropped,
/// `..` taking one back, also above the key's own start). With `p/` as
/// both prefixes, `.lmcache-tier/lease`, `./.lmcache-tier/lease`,
/// `x/../.lmcache-tier/lease` and `../p/.lmcache-tier/lease` are all
/// refused.
///
/// # Errors
/// [`Refusal::Reserved`] (403), or the path's own [`request_key`] error.
pub fn refuse_reserved(path: &str, key_prefix: &str, object_prefix: &str) -> Result<(), Refusal> {
    let key = request_key(path)?;
    let full = format!("{object_prefix}{key}");
    let folder = format!("{key_prefix}{}", crate::fleet::RESERVED);
    let within = resolved(&full).starts_with(&resolved(&folder));
    if full.starts_with(&folder) || within {
        return Err(Refusal::Reserved(key));
    }
    Ok(())
}

/// The segments of `key` as a store that maps keys to files resolves them.
fn resolved(key: &str) -> Vec<&str> {
    let mut segments = Vec::new();
    for segment in key.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            other => segments.push(other),
        }
    }
    segments
}

/// Whether every `%` in `text` starts a `%XX` escape.
fn escapes_ok(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.iter().enumerate().all(|(i, b)| {
        *b != b'%'
            || bytes
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    })
}

/// Headers that copy from another object or change who may read one, in
/// either spelling (`-` or `_`: some servers read both as the same name).
fn refused_header(name: &str) -> bool {
    let name = name.replace('_', "-");
    name.starts_with("x-amz-copy-source") || name == "x-amz-acl" || name.starts_with("x-amz-grant-")
}

/// The request headers of LMCache's S3 adapter that reach the upstream:
/// framing and content (`content-length`, `content-type`, `content-md5`),
/// conditions (`range`, `if-*`), and multipart sizes and checksums
/// (`x-amz-mp-object-size`, `x-amz-checksum-*`, `x-amz-sdk-checksum-algorithm`).
/// Every other header is dropped: the client's signature, date and token
/// (the gateway signs again), hop-by-hop headers, and whatever would set
/// more than the object's bytes (object lock, tagging, storage class,
/// encryption keys, redirects, user metadata).
pub fn forwarded_header(name: &str) -> bool {
    matches!(
        name,
        "content-length"
            | "content-type"
            | "content-md5"
            | "range"
            | "if-match"
            | "if-none-match"
            | "if-modified-since"
            | "if-unmodified-since"
            | "x-amz-mp-object-size"
            | "x-amz-sdk-checksum-algorithm"
            | "x-amz-checksum-algorithm"
            | "x-amz-checksum-type"
    ) || name.starts_with("x-amz-checksum-")
}

/// The object key of a request path as received (`/<key>`, percent-encoded):
/// everything after the first `/`, percent-decoded once. `%2F` and `%2E`
/// become `/` and `.` of the key; `+` stays `+`.
pub fn request_key(path: &str) -> Result<String, Refusal> {
    let encoded = path.strip_prefix('/').unwrap_or(path);
    let bytes: Vec<u8> = percent_decode_str(encoded).collect();
    String::from_utf8(bytes).map_err(|_| Refusal::NotUtf8)
}

/// The upstream path of `key` in `bucket` under `key_prefix`:
/// `/<bucket>/<prefix + key>`, encoded as the module doc says. Decoding the
/// part after `/<bucket>/` once gives back `key_prefix + key`.
///
/// Errors when prefix and key together exceed [`MAX_KEY_BYTES`].
pub fn upstream_path(bucket: &str, key_prefix: &str, key: &str) -> Result<String, Refusal> {
    let bytes = key_prefix.len() + key.len();
    if bytes > MAX_KEY_BYTES {
        return Err(Refusal::TooLong { bytes });
    }
    Ok(format!(
        "/{bucket}/{}{}",
        utf8_percent_encode(key_prefix, KEY_IN_PATH),
        utf8_percent_encode(key, KEY_IN_PATH)
    ))
}

/// One query parameter as the upstream gets it: name and value decoded
/// once, re-encoded in SigV4's form (only `A-Z a-z 0-9 - _ . ~` unencoded),
/// so no URL parser re-encodes it and the store decodes the same bytes.
/// A parameter without `=` stays without one.
fn encode_pair(name: &[u8], value: Option<&[u8]>) -> String {
    let name = percent_encode(name, SIGV4_QUERY).to_string();
    match value {
        Some(value) => format!("{name}={}", percent_encode(value, SIGV4_QUERY)),
        None => name,
    }
}

/// The first parameter of `pairs` whose name is not in `allowed`.
fn unknown_parameter(
    pairs: &[(Vec<u8>, Option<Vec<u8>>)],
    allowed: &[&str],
) -> Result<(), Refusal> {
    match pairs
        .iter()
        .find(|(name, _)| !allowed.iter().any(|a| a.as_bytes() == name.as_slice()))
    {
        Some((name, _)) => Err(Refusal::Parameter(
            String::from_utf8_lossy(name).into_owned(),
        )),
        None => Ok(()),
    }
}

/// The upstream query of an object request: its parameters (only
/// `uploads`, `uploadId`, `partNumber`, `x-id`), in order, with their bytes
/// ([`query_pairs`]) re-encoded in SigV4's form.
pub fn object_query(query: &str) -> Result<String, Refusal> {
    let pairs = query_pairs(query);
    unknown_parameter(&pairs, OBJECT_PARAMETERS)?;
    Ok(pairs
        .iter()
        .map(|(n, v)| encode_pair(n, v.as_deref()))
        .collect::<Vec<_>>()
        .join("&"))
}

/// The upstream query of a ListObjectsV2 request (`GET /?list-type=2...`,
/// every `list-type` 2, only `LISTING_PARAMETERS`): every `prefix` and
/// `start-after` moved under `key_prefix` (a `prefix` of `key_prefix` added
/// when there is none), everything else (continuation tokens, max-keys,
/// delimiter, ...) kept with its bytes. Parameter names are compared after
/// decoding, as the store reads them.
pub fn listing_query(query: &str, key_prefix: &str) -> Result<String, Refusal> {
    let pairs = query_pairs(query);
    let list_types: Vec<_> = pairs.iter().filter(|(n, _)| n == b"list-type").collect();
    if list_types.is_empty() || list_types.iter().any(|(_, v)| v.as_deref() != Some(b"2")) {
        return Err(Refusal::NotListV2);
    }
    unknown_parameter(&pairs, LISTING_PARAMETERS)?;
    let mut out: Vec<String> = pairs
        .iter()
        .map(|(name, value)| {
            if name == b"prefix" || name == b"start-after" {
                let mut moved = key_prefix.as_bytes().to_vec();
                moved.extend_from_slice(value.as_deref().unwrap_or_default());
                encode_pair(name, Some(&moved))
            } else {
                encode_pair(name, value.as_deref())
            }
        })
        .collect();
    if !pairs.iter().any(|(n, _)| n == b"prefix") && !key_prefix.is_empty() {
        out.push(encode_pair(b"prefix", Some(key_prefix.as_bytes())));
    }
    Ok(out.join("&"))
}

/// Why an `s3_key_prefix` cannot be a stable key prefix
/// ([`check_key_prefix`]); the message follows the quoted prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyPrefixError {
    /// It starts with `/`.
    #[error("starts with '/'")]
    Absolute,
    /// It is longer than half of [`MAX_KEY_BYTES`].
    #[error("is longer than 512 bytes")]
    TooLong,
    /// It has a byte outside `A-Z a-z 0-9 ! - _ . * ( ) /`.
    #[error("has characters outside the S3 safe set")]
    UnsafeCharacter,
    /// It has a `.` or `..` segment.
    #[error("has the dot segment {segment:?}")]
    DotSegment {
        /// The segment, `.` or `..`.
        segment: String,
    },
    /// It has an empty segment (`a//b`).
    #[error("has an empty segment ('//')")]
    EmptySegment,
}

/// Checks that `prefix` can be a stable key prefix.
///
/// The rules: at most 512 bytes (half of [`MAX_KEY_BYTES`], leaving the
/// rest to LMCache's keys), not starting with `/`, only
/// `A-Z a-z 0-9 ! - _ . * ( ) /` (S3's safe characters but `'`, which a
/// listing answer XML-escapes, so the prefix could not be stripped from
/// its keys), and no segment
/// that is empty (`a//b`), `.` or `..`. Keys may hold those (they are
/// LMCache's bytes), but a prefix with them names a place that tools and
/// stores which normalise paths read as another one, so the tier's objects
/// would seem to live elsewhere.
///
/// # Errors
/// [`KeyPrefixError`]: the first rule `prefix` breaks.
pub fn check_key_prefix(prefix: &str) -> Result<(), KeyPrefixError> {
    if prefix.starts_with('/') {
        return Err(KeyPrefixError::Absolute);
    }
    if prefix.len() > MAX_KEY_BYTES / 2 {
        return Err(KeyPrefixError::TooLong);
    }
    if !prefix
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"!-_.*()/".contains(&b))
    {
        return Err(KeyPrefixError::UnsafeCharacter);
    }
    let segments: Vec<&str> = prefix.split('/').collect();
    let last = segments.len() - 1;
    for (i, segment) in segments.iter().enumerate() {
        match *segment {
            "." | ".." => {
                return Err(KeyPrefixError::DotSegment {
                    segment: segment.to_string(),
                })
            }
            "" if i < last => return Err(KeyPrefixError::EmptySegment),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_keys_keep_their_slashes_and_lose_nothing() {
        assert_eq!(
            upstream_path("kvc", "node/", "Qwen/Qwen2.5-7B@00010001@0@ab").unwrap(),
            "/kvc/node/Qwen/Qwen2.5-7B%4000010001%400%40ab"
        );
        assert_eq!(
            upstream_path("kvc", "", "org/m+lora v2@1").unwrap(),
            "/kvc/org/m%2Blora%20v2%401"
        );
        assert_eq!(upstream_path("kvc", "", "é~").unwrap(), "/kvc/%C3%A9~");
    }

    #[test]
    fn dot_and_empty_segments_are_bytes_of_the_key() {
        let cases = [
            ("p/", "./m@k", "/kvc/p/./m%40k"),
            ("p/", "../../other-bucket/x", "/kvc/p/../../other-bucket/x"),
            ("", "/abs/m", "/kvc//abs/m"),
            ("", "a//b/m", "/kvc/a//b/m"),
            ("", "..", "/kvc/.."),
            ("", "%2E%2E", "/kvc/%252E%252E"),
        ];
        for (prefix, key, path) in cases {
            assert_eq!(upstream_path("kvc", prefix, key).unwrap(), path, "{key}");
        }
    }

    #[test]
    fn keys_longer_than_s3_allows_are_refused() {
        let long = "k".repeat(1020);
        assert!(upstream_path("kvc", "", &long).is_ok());
        let e = upstream_path("kvc", "node/", &long).unwrap_err();
        assert_eq!(e, Refusal::TooLong { bytes: 1025 });
        assert_eq!(e.code(), "KeyTooLongError");
        assert_eq!(request_key("/a%FFb").unwrap_err().code(), "InvalidURI");
    }

    #[test]
    fn the_bound_s_own_folder_is_refused_in_every_spelling() {
        let refused = |path: &str, prefix: &str, object: &str| {
            refuse_reserved(path, prefix, object).map_err(|e| (e.status(), e.code()))
        };
        let denied = Err((403, "AccessDenied"));
        for path in [
            "/.lmcache-tier/lease",
            "/%2Elmcache-tier/reports/0123456789abcdef",
            "/.lmcache-tier%2Flease",
            "/./.lmcache-tier/lease",
            "//.lmcache-tier//lease",
            "/m/../.lmcache-tier/lease",
            "/.lmcache-tier",
            "/../p/.lmcache-tier/lease",
            "/a/../../p/./.lmcache-tier/reports/x",
        ] {
            assert_eq!(refused(path, "p/", "p/"), denied, "{path}");
        }
        let identity = "p/cache-identity-0123456789abcdef/";
        for path in [
            "/../.lmcache-tier/lease",
            "/../../p/.lmcache-tier/lease",
            "/x/../../.lmcache-tier/lease",
        ] {
            assert_eq!(refused(path, "p/", identity), denied, "{path}");
        }
        assert_eq!(refused("/.lmcache-tier/lease", "", ""), denied);
        assert_eq!(refused("/../.lmcache-tier/lease", "", ""), denied);
        for (path, prefix, object) in [
            ("/m@1@0@ab/.lmcache-tier/x", "p/", "p/"),
            ("/.lmcache-tiers/x", "p/", "p/"),
            ("/..lmcache-tier/x", "p/", "p/"),
            ("/Qwen/Qwen2.5-7B@00010001@0@ab", "p/", "p/"),
            ("/../models/llama@00010001@0@ab", "p/", "p/"),
            ("/.lmcache-tier/lease", "p/", identity),
            ("/../q/.lmcache-tier/lease", "p/", "p/"),
        ] {
            assert_eq!(
                refused(path, prefix, object),
                Ok(()),
                "{path} under {object}"
            );
        }
    }

    #[test]
    fn request_paths_are_decoded_once() {
        assert_eq!(request_key("/./m%40k").unwrap(), "./m@k");
        assert_eq!(request_key("//abs%2Fm+x%252F").unwrap(), "/abs/m+x%2F");
        assert_eq!(request_key("/%2E%2E/x").unwrap(), "../x");
    }

    #[test]
    fn listings_move_under_the_key_prefix_with_names_read_as_the_store_reads_them() {
        assert_eq!(listing_query("list-type=2", "").unwrap(), "list-type=2");
        assert_eq!(
            listing_query(
                "list-type=2&prefix=m%40x&continuation-token=abc%3D",
                "node/"
            )
            .unwrap(),
            "list-type=2&prefix=node%2Fm%40x&continuation-token=abc%3D"
        );
        assert_eq!(
            listing_query("list-type=2&start-after=k", "p/").unwrap(),
            "list-type=2&start-after=p%2Fk&prefix=p%2F"
        );
        assert_eq!(
            listing_query("list-type=2&pre%66ix=..%2Fx", "p/").unwrap(),
            "list-type=2&prefix=p%2F..%2Fx"
        );
        assert_eq!(
            listing_query("list-type=2&prefix=a+b%2Bc", "").unwrap(),
            "list-type=2&prefix=a%20b%2Bc"
        );
        assert_eq!(listing_query("prefix=x", "p/"), Err(Refusal::NotListV2));
        assert_eq!(
            listing_query("list-type=2&list-type=1", "p/"),
            Err(Refusal::NotListV2)
        );
        for other in ["encoding-type=url", "acl", "policy", "versions", "location"] {
            let e = listing_query(&format!("list-type=2&{other}"), "p/").unwrap_err();
            assert!(matches!(e, Refusal::Parameter(_)), "{other}: {e}");
            assert_eq!((e.status(), e.code()), (501, "NotImplemented"));
        }
    }

    fn route_of(method: &str, target: &str, headers: &[&str]) -> Result<Route, Refusal> {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        route(method, path, query, headers.iter().copied(), "kvc", "p/")
    }

    #[test]
    fn routes_carry_objects_and_listings_and_nothing_else() {
        let object = route_of(
            "PUT",
            "/m%40k?partNumber=1&uploadId=u%2B1",
            &["content-length"],
        );
        assert_eq!(
            object,
            Ok(Route {
                path: "/kvc/p/m%40k".into(),
                query: "partNumber=1&uploadId=u%2B1".into(),
                listing: false
            })
        );
        let listing = route_of("GET", "/?list-type=2", &[]).unwrap();
        assert_eq!((listing.path.as_str(), listing.listing), ("/kvc", true));
        let refused = [
            ("DELETE", "foo", Refusal::NotAPath),
            ("PUT", "", Refusal::NotAPath),
            ("CONNECT", "/x", Refusal::Method("CONNECT".into())),
            ("PATCH", "/x", Refusal::Method("PATCH".into())),
            ("DELETE", "/", Refusal::NotListV2),
            ("PUT", "/?list-type=2", Refusal::NotListV2),
            ("GET", "/a%zz", Refusal::BadEscape),
            ("GET", "/a%", Refusal::BadEscape),
            ("GET", "/a?uploadId=%4", Refusal::BadEscape),
            ("PUT", "/k?acl", Refusal::Parameter("acl".into())),
            ("GET", "/k?tagging", Refusal::Parameter("tagging".into())),
        ];
        for (method, target, refusal) in refused {
            assert_eq!(
                route_of(method, target, &[]),
                Err(refusal),
                "{method} {target}"
            );
        }
        for header in [
            "x-amz-copy-source",
            "x-amz-copy-source-range",
            "x-amz-acl",
            "x-amz-grant-read",
        ] {
            let e = route_of("PUT", "/k", &["content-length", header]).unwrap_err();
            assert_eq!(e, Refusal::Header(header.into()));
            assert_eq!(e.status(), 501);
        }
        assert_eq!(route_of("GET", "/a%2Fb", &[]).unwrap().path, "/kvc/p/a/b");
    }

    #[test]
    fn only_the_headers_of_lmcaches_requests_are_forwarded() {
        for kept in [
            "content-length",
            "range",
            "if-match",
            "x-amz-mp-object-size",
            "x-amz-checksum-crc32c",
        ] {
            assert!(forwarded_header(kept), "{kept}");
        }
        for dropped in [
            "authorization",
            "x-amz-date",
            "x-amz-security-token",
            "host",
            "transfer-encoding",
            "x-amz-object-lock-mode",
            "x-amz-object-lock-legal-hold",
            "x-amz-tagging",
            "x-amz-storage-class",
            "x-amz-website-redirect-location",
            "x-amz-server-side-encryption",
            "x-amz-meta-owner",
            "x_amz_acl",
        ] {
            assert!(!forwarded_header(dropped), "{dropped}");
        }
    }

    #[test]
    fn prefixes_with_path_syntax_are_refused() {
        for good in [
            "",
            "lmcache/",
            "lmcache/node-a/",
            "run1-",
            "a.b/c..d/",
            "..a/",
            "run(1)!/",
        ] {
            assert_eq!(check_key_prefix(good), Ok(()), "{good}");
        }
        for bad in [
            "./", "a/./b/", "../", "a/..", "a//b/", "/a", "a b/", "é/", "it's/",
        ] {
            assert!(check_key_prefix(bad).is_err(), "{bad}");
        }
        assert!(check_key_prefix(&"a".repeat(513)).is_err());
    }
}
