//! The gateway's own requests to a tier's store, for the bucket bound
//! ([`super::bound`]): the listing of the tier's prefix, the deletion of
//! victims, the size of a multipart object just completed, the lease and
//! the reports (conditional PUTs and GETs of small objects), and the sweep
//! of uploads left behind. They go
//! through `aws-sdk-s3`, path-style (`force_path_style`), to the tier's
//! endpoint and region, signed with the tier's credentials (the same
//! [`RealCredentials`] the forwarded requests use); pagination, XML,
//! retries and error types are the SDK's.
//!
//! TLS: rustls with ring, trusting the system's root certificates and the
//! tier's `s3_ca_bundle` (`docs/s3-gateway.md`, "The bucket bound").

use std::time::{Duration, SystemTime};

use aws_credential_types::provider::{self, error::CredentialsError, ProvideCredentials};
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::operation::RequestId;
use aws_sdk_s3::types::EncodingType;
use aws_smithy_http_client::tls;

use super::credentials::RealCredentials;
use super::spec::BucketTier;
use crate::fleet::lease::Condition;
use crate::fleet::sweep::Upload;

/// How long one attempt of one of the gateway's own requests may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts per request (the SDK's standard retries, with backoff).
const ATTEMPTS: u32 = 3;

pub use crate::fleet::view::StoredObject;

/// A listing of the tier's prefix and what it cost.
#[derive(Debug, Default)]
pub struct Listing {
    /// The objects kept, in the store's (key) order.
    pub objects: Vec<StoredObject>,
    /// ListObjectsV2 pages fetched (one request each).
    pub pages: u64,
    /// Keys listed and not kept: not the filter's, without a size or date,
    /// or not decodable (the bound's own objects, under
    /// [`RESERVED`](crate::fleet::RESERVED), are not counted).
    pub skipped: u64,
    /// Kept keys whose listed size is past [`MAX_OBJECT_BYTES`] (key,
    /// bytes): the store's fault, neither counted nor evicted.
    pub oversized: Vec<(String, u64)>,
}

/// The largest object S3 stores (5 TiB): a listed size past it is the
/// store's fault (`docs/s3-gateway.md`, "The bucket bound").
pub const MAX_OBJECT_BYTES: u64 = 5 << 40;

/// How far one listing of the prefix may go before it fails
/// (`docs/s3-gateway.md`, "The bucket bound"): it keeps the gateway's
/// memory bounded (about 150 bytes an object kept) and its time finite
/// whatever a store answers.
#[derive(Debug, Clone, Copy)]
pub struct ListingLimits {
    /// ListObjectsV2 pages (requests).
    pub pages: u64,
    /// Objects kept (LMCache's of the models counted).
    pub objects: usize,
    /// Time from the first request.
    pub time: Duration,
}

/// The limits of every listing: 5,000 pages (5 million keys on S3),
/// 1,000,000 objects kept (4 TB of 4 MiB chunks; about 150 MB), 10
/// minutes.
pub const LISTING_LIMITS: ListingLimits = ListingLimits {
    pages: 5_000,
    objects: 1_000_000,
    time: Duration::from_secs(600),
};

impl ListingLimits {
    /// Whether `listing`, `elapsed` after its start, may fetch one more
    /// page.
    ///
    /// # Errors
    /// A [`StoreError`] naming the limit passed.
    fn check(&self, listing: &Listing, elapsed: Duration) -> Result<(), StoreError> {
        let passed = if listing.pages >= self.pages {
            format!("{} pages", self.pages)
        } else if listing.objects.len() >= self.objects {
            format!("{} objects", self.objects)
        } else if elapsed >= self.time {
            format!("{} s", self.time.as_secs())
        } else {
            return Ok(());
        };
        Err(StoreError {
            operation: "ListObjectsV2",
            status: None,
            detail: format!(
                "the listing passed its limit of {passed} ({} pages, {} objects kept, {} keys skipped, {:.0} s) and was dropped: nothing is evicted on it",
                listing.pages,
                listing.objects.len(),
                listing.skipped,
                elapsed.as_secs_f64()
            ),
        })
    }
}

/// A listed key as stored: URL-decoded when the answer says it encoded
/// its keys (`+` is a space there, as S3 writes it); `None` when that
/// decoding does not give UTF-8.
fn listed_key(key: &str, encoded: bool) -> Option<std::borrow::Cow<'_, str>> {
    if !encoded {
        return Some(key.into());
    }
    let spaced = key.replace('+', " ");
    let decoded = percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .ok()?;
    Some(decoded.into_owned().into())
}

/// The continuation token of a truncated page, remembered in `followed`.
///
/// # Errors
/// A page without a token, or with one the listing already followed: a
/// store that would list forever.
fn next_token(
    followed: &mut std::collections::HashSet<u64>,
    token: Option<&str>,
) -> Result<String, StoreError> {
    let fault = |what: &str| StoreError {
        operation: "ListObjectsV2",
        status: None,
        detail: format!("the store answered a truncated page {what}: the listing was dropped"),
    };
    let token = token.ok_or_else(|| fault("without a continuation token"))?;
    let hash = {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        BuildHasherDefault::<DefaultHasher>::default().hash_one(token)
    };
    if !followed.insert(hash) {
        return Err(fault("with a continuation token it gave before"));
    }
    Ok(token.to_string())
}

/// Why a request of the gateway's own failed, in a few words: the store's
/// status, S3 error code, message and request id, or why no answer came
/// (never a header, a body or the credentials).
#[derive(Debug, thiserror::Error)]
#[error("{operation} failed: {detail}")]
pub struct StoreError {
    /// The S3 request: `ListObjectsV2`, `DeleteObject`, `HeadObject`,
    /// `PutObject`, `GetObject`, `ListMultipartUploads` or
    /// `AbortMultipartUpload`.
    pub operation: &'static str,
    /// The store's HTTP status, where it answered.
    pub status: Option<u16>,
    /// What happened, capped.
    pub detail: String,
}

/// The tier's store, as the gateway itself talks to it.
pub(crate) struct Store {
    client: aws_sdk_s3::Client,
    bucket: String,
    key_prefix: String,
}

/// The tier's credentials as the SDK asks for them.
struct TierCredentials(RealCredentials);

/// Names no key (the SDK may log its provider).
impl std::fmt::Debug for TierCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TierCredentials")
    }
}

impl ProvideCredentials for TierCredentials {
    fn provide_credentials<'a>(&'a self) -> provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        provider::future::ProvideCredentials::new(async move {
            self.0
                .current()
                .await
                .map(|(credentials, _)| credentials)
                .map_err(CredentialsError::provider_error)
        })
    }
}

impl Store {
    /// The client for `tier`, signing with `credentials`.
    ///
    /// # Errors
    /// The TLS set-up with the tier's CA bundle failed (a bundle the
    /// forwarding client took is not refused here in practice).
    pub(crate) fn new(tier: &BucketTier, credentials: RealCredentials) -> Result<Self, StoreError> {
        let mut trust = tls::TrustStore::default();
        if let Some(pem) = &tier.ca_bundle_pem {
            trust.add_pem_certificate(pem.clone());
        }
        let context = tls::TlsContext::builder()
            .with_trust_store(trust)
            .build()
            .map_err(|e| StoreError {
                operation: "TLS set-up",
                status: None,
                detail: lmcache_tier_spec::error_chain(&e),
            })?;
        let http_client = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::Ring,
            ))
            .tls_context(context)
            .build_https();
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(tier.region.clone()))
            .endpoint_url(format!("{}://{}", tier.scheme, tier.endpoint))
            .force_path_style(true)
            .credentials_provider(TierCredentials(credentials))
            .http_client(http_client)
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .retry_config(RetryConfig::standard().with_max_attempts(ATTEMPTS))
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_attempt_timeout(ATTEMPT_TIMEOUT)
                    .build(),
            )
            .build();
        Ok(Store {
            client: aws_sdk_s3::Client::from_conf(config),
            bucket: tier.bucket.clone(),
            key_prefix: tier.key_prefix.clone(),
        })
    }

    /// The objects under the tier's prefix whose keys (inside the prefix)
    /// `keep` accepts (ListObjectsV2, paged; 1,000 keys a page on S3), the
    /// others counted. Keys are asked URL-encoded (`encoding-type=url`),
    /// so that a key holding a character XML cannot carry (`\x01`) is
    /// listed too, and decoded where the store's answer says it encoded
    /// them. Objects without a size or date are skipped; a size past
    /// [`MAX_OBJECT_BYTES`] is the store's fault: skipped and counted.
    ///
    /// The listing is bounded ([`LISTING_LIMITS`]): past its pages, kept
    /// objects or time it fails, as it does when a truncated page carries
    /// no continuation token or one the listing already followed.
    ///
    /// # Errors
    /// [`StoreError`] of the first page that failed after retries, or of
    /// a limit passed.
    pub(crate) async fn list(&self, keep: impl Fn(&str) -> bool) -> Result<Listing, StoreError> {
        let started = std::time::Instant::now();
        let mut listing = Listing::default();
        let mut tokens = std::collections::HashSet::new();
        let mut token = None;
        loop {
            LISTING_LIMITS.check(&listing, started.elapsed())?;
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&self.key_prefix)
                .encoding_type(EncodingType::Url)
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| failed("ListObjectsV2", e))?;
            listing.pages += 1;
            let encoded = page.encoding_type() == Some(&EncodingType::Url);
            for object in page.contents() {
                self.sort(&mut listing, object, encoded, &keep);
            }
            if page.is_truncated() != Some(true) {
                return Ok(listing);
            }
            token = Some(next_token(&mut tokens, page.next_continuation_token())?);
        }
    }

    /// Puts one listed object where it belongs in `listing`.
    fn sort(
        &self,
        listing: &mut Listing,
        object: &aws_sdk_s3::types::Object,
        encoded: bool,
        keep: &impl Fn(&str) -> bool,
    ) {
        let key = object.key().and_then(|k| listed_key(k, encoded));
        let inside = key
            .as_deref()
            .and_then(|k| k.strip_prefix(self.key_prefix.as_str()));
        if inside.is_some_and(|k| k.starts_with(crate::fleet::RESERVED)) {
            return;
        }
        let Some(key) = inside.filter(|k| keep(k)) else {
            listing.skipped += 1;
            return;
        };
        let bytes = object.size().and_then(|n| u64::try_from(n).ok());
        let modified = object
            .last_modified()
            .and_then(|d| SystemTime::try_from(*d).ok());
        match (bytes, modified) {
            (Some(bytes), _) if bytes > MAX_OBJECT_BYTES => {
                listing.oversized.push((key.into(), bytes))
            }
            (Some(bytes), Some(modified)) => listing.objects.push(StoredObject {
                key: key.to_string(),
                bytes,
                modified,
            }),
            _ => listing.skipped += 1,
        }
    }

    /// Whether the tier's prefix can be listed: one ListObjectsV2 request
    /// for at most one key, before the gateway serves (the whole listing
    /// follows in the background).
    ///
    /// # Errors
    /// [`StoreError`] after retries: no `s3:ListBucket`, no such bucket,
    /// an unreachable endpoint.
    pub(crate) async fn check_listing(&self) -> Result<(), StoreError> {
        self.client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(&self.key_prefix)
            .encoding_type(EncodingType::Url)
            .max_keys(1)
            .send()
            .await
            .map_err(|e| failed("ListObjectsV2", e))?;
        Ok(())
    }

    /// Deletes `key` (inside the tier's prefix). Deleting a key that is
    /// gone already succeeds: S3's DELETE is idempotent, and a 404 from a
    /// store that answers one for a missing key is taken as that success.
    ///
    /// # Errors
    /// [`StoreError`] after retries.
    pub(crate) async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let answer = self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(format!("{}{key}", self.key_prefix))
            .send()
            .await;
        match answer {
            Ok(_) => Ok(()),
            Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 404) => Ok(()),
            Err(e) => Err(failed("DeleteObject", e)),
        }
    }

    /// The size and date of `key` (inside the tier's prefix); `None` when
    /// it does not exist.
    ///
    /// # Errors
    /// [`StoreError`] after retries.
    pub(crate) async fn head(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        let answer = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(format!("{}{key}", self.key_prefix))
            .send()
            .await;
        let head = match answer {
            Ok(head) => head,
            Err(e) if e.as_service_error().is_some_and(|e| e.is_not_found()) => return Ok(None),
            Err(e) => return Err(failed("HeadObject", e)),
        };
        let bytes = head.content_length().and_then(|n| u64::try_from(n).ok());
        let modified = head
            .last_modified()
            .and_then(|d| SystemTime::try_from(*d).ok());
        Ok(bytes.map(|bytes| StoredObject {
            key: key.to_string(),
            bytes,
            modified: modified.unwrap_or_else(SystemTime::now),
        }))
    }
}

/// The store's answer to a PUT of the bound's own ([`Store::put`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PutAnswer {
    /// Stored; the object's new ETag (empty where the store sent none).
    Written(String),
    /// `412 Precondition Failed` or `409 Conflict`: the condition does
    /// not hold.
    Conflict,
    /// `501 Not Implemented` (OpenStack Swift's `s3api` for any
    /// conditional PUT) or a `400` naming the condition: the store does not
    /// take conditional writes.
    Unsupported,
    /// `404 Not Found` to a PUT with `If-Match`: the object is gone.
    Missing,
}

/// A small object of the bound's own read whole ([`Store::get`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fetched {
    /// No such object (`404`).
    Absent,
    /// Its ETag (empty where the store sent none) and body.
    Body(String, Vec<u8>),
    /// Its ETag; its body passed the read's cap (by its `Content-Length`,
    /// or while it was read, whatever the headers said) and was not kept.
    Oversized(String),
}

impl Store {
    /// PUTs `body` at `key` (inside the tier's prefix), under `condition`
    /// when given (`If-None-Match: *` or `If-Match: <etag>`).
    ///
    /// # Errors
    /// [`StoreError`] after retries, for an answer that is not one of
    /// [`PutAnswer`]'s.
    pub(crate) async fn put(
        &self,
        key: &str,
        body: Vec<u8>,
        condition: Option<&Condition>,
    ) -> Result<PutAnswer, StoreError> {
        let mut request = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(format!("{}{key}", self.key_prefix))
            .content_type("application/json")
            .body(body.into());
        request = match condition {
            Some(Condition::Absent) => request.if_none_match("*"),
            Some(Condition::Matches(etag)) => request.if_match(etag),
            None => request,
        };
        match request.send().await {
            Ok(out) => Ok(PutAnswer::Written(
                out.e_tag().unwrap_or_default().to_string(),
            )),
            Err(e) => match e.raw_response().map(|r| r.status().as_u16()) {
                Some(409 | 412) => Ok(PutAnswer::Conflict),
                Some(404) if matches!(condition, Some(Condition::Matches(_))) => {
                    Ok(PutAnswer::Missing)
                }
                Some(501) => Ok(PutAnswer::Unsupported),
                Some(400) if condition.is_some() => Ok(PutAnswer::Unsupported),
                _ => Err(failed("PutObject", e)),
            },
        }
    }

    /// The ETag and body of `key` (inside the tier's prefix), read to at
    /// most `limit` bytes whatever its `Content-Length` says (a body
    /// without one, or longer than it says, stops there).
    ///
    /// # Errors
    /// [`StoreError`] after retries, or a body that broke off.
    pub(crate) async fn get(&self, key: &str, limit: usize) -> Result<Fetched, StoreError> {
        let answer = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(format!("{}{key}", self.key_prefix))
            .send()
            .await;
        let mut out = match answer {
            Ok(out) => out,
            Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 404) => {
                return Ok(Fetched::Absent)
            }
            Err(e) => return Err(failed("GetObject", e)),
        };
        let etag = out.e_tag().unwrap_or_default().to_string();
        if out.content_length().is_some_and(|n| n > limit as i64) {
            return Ok(Fetched::Oversized(etag));
        }
        let mut body = Vec::new();
        while let Some(chunk) = out.body.next().await {
            let chunk = chunk.map_err(|e| StoreError {
                operation: "GetObject",
                status: None,
                detail: format!(
                    "the body broke off: {}",
                    capped(&lmcache_tier_spec::error_chain(&e))
                ),
            })?;
            if body.len() + chunk.len() > limit {
                return Ok(Fetched::Oversized(etag));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Fetched::Body(etag, body))
    }

    /// The keys (inside `folder`, itself inside the tier's prefix) and
    /// ETags of the objects under `folder` (ListObjectsV2, paged; no page
    /// more once `most` keys are in), and the pages it took. The ETag is
    /// `None` where the listing gives none (s3s-fs).
    ///
    /// # Errors
    /// [`StoreError`] of the first page that failed after retries.
    pub(crate) async fn list_folder(
        &self,
        folder: &str,
        most: usize,
    ) -> Result<(Vec<(String, Option<String>)>, u64), StoreError> {
        let full = format!("{}{folder}", self.key_prefix);
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(&full)
            .into_paginator()
            .send();
        let (mut found, mut count) = (Vec::new(), 0);
        while found.len() < most {
            let Some(page) = pages.next().await else {
                break;
            };
            let page = page.map_err(|e| failed("ListObjectsV2", e))?;
            count += 1;
            for object in page.contents() {
                if let Some(name) = object.key().and_then(|k| k.strip_prefix(full.as_str())) {
                    found.push((name.to_string(), object.e_tag().map(str::to_string)));
                }
            }
        }
        Ok((found, count))
    }

    /// Whether the store takes conditional writes, as the lease needs
    /// them: a PUT with `If-None-Match: *` of a new key succeeds, a second
    /// one gets `412`, and one with `If-Match` of another ETag gets `412`.
    /// The probe object ([`crate::fleet::probe_key`]) is deleted after.
    ///
    /// # Errors
    /// [`StoreError`] of a request that failed after retries.
    pub(crate) async fn takes_conditional_writes(&self, node: &str) -> Result<bool, StoreError> {
        let key = crate::fleet::probe_key(node);
        let body = || b"{}".to_vec();
        let absent = Some(&Condition::Absent);
        let first = self.put(&key, body(), absent).await?;
        let ok = matches!(first, PutAnswer::Written(_))
            && self.put(&key, body(), absent).await? == PutAnswer::Conflict
            && self
                .put(
                    &key,
                    body(),
                    Some(&Condition::Matches("\"not-this-one\"".into())),
                )
                .await?
                == PutAnswer::Conflict;
        if first != PutAnswer::Unsupported {
            self.delete(&key).await?;
        }
        Ok(ok)
    }
}

/// The most pages of one listing of uploads (1,000 uploads a page on S3).
const UPLOAD_PAGES: u64 = 100;

impl Store {
    /// The unfinished multipart uploads under the tier's prefix
    /// (ListMultipartUploads, paged by key and upload id markers, at most
    /// [`UPLOAD_PAGES`] pages): each key inside the prefix with its upload
    /// id, and the pages it took. `None` when the store does not implement
    /// the request (`501`).
    ///
    /// # Errors
    /// [`StoreError`] of the first page that failed after retries.
    pub(crate) async fn list_uploads(&self) -> Result<Option<(Vec<Upload>, u64)>, StoreError> {
        let (mut found, mut pages) = (Vec::new(), 0);
        let (mut key_marker, mut id_marker) = (None::<String>, None::<String>);
        while pages < UPLOAD_PAGES {
            let answer = self
                .client
                .list_multipart_uploads()
                .bucket(&self.bucket)
                .prefix(&self.key_prefix)
                .set_key_marker(key_marker.take())
                .set_upload_id_marker(id_marker.take())
                .send()
                .await;
            let page = match answer {
                Ok(page) => page,
                Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 501) => {
                    return Ok(None)
                }
                Err(e) => return Err(failed("ListMultipartUploads", e)),
            };
            pages += 1;
            for upload in page.uploads() {
                let key = upload
                    .key()
                    .and_then(|k| k.strip_prefix(self.key_prefix.as_str()));
                if let (Some(key), Some(id)) = (key, upload.upload_id()) {
                    found.push((key.to_string(), id.to_string()));
                }
            }
            if page.is_truncated() != Some(true) {
                break;
            }
            key_marker = page.next_key_marker().map(str::to_string);
            id_marker = page.next_upload_id_marker().map(str::to_string);
            if key_marker.is_none() && id_marker.is_none() {
                break;
            }
        }
        Ok(Some((found, pages)))
    }

    /// Aborts the multipart upload `id` of `key` (inside the tier's
    /// prefix); one that is gone already (`404 NoSuchUpload`) counts as
    /// aborted.
    ///
    /// # Errors
    /// [`StoreError`] after retries.
    pub(crate) async fn abort_upload(&self, key: &str, id: &str) -> Result<(), StoreError> {
        let answer = self
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(format!("{}{key}", self.key_prefix))
            .upload_id(id)
            .send()
            .await;
        match answer {
            Ok(_) => Ok(()),
            Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 404) => Ok(()),
            Err(e) => Err(failed("AbortMultipartUpload", e)),
        }
    }
}

/// The store's answer in a few words: status, S3 error code, message and
/// request id (each capped, control characters escaped), or why there was
/// no answer; never its headers or body (`docs/s3-gateway.md`, "The
/// bucket bound").
fn failed<E>(operation: &'static str, e: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let status = e.raw_response().map(|r| r.status().as_u16());
    let detail = match &e {
        SdkError::TimeoutError(_) => format!(
            "no answer within {} s ({ATTEMPTS} attempts)",
            ATTEMPT_TIMEOUT.as_secs()
        ),
        SdkError::DispatchFailure(f) => {
            let cause = f
                .as_connector_error()
                .map_or_else(String::new, |c| lmcache_tier_spec::error_chain(c));
            format!("the store could not be reached: {}", capped(&cause))
        }
        _ => {
            let mut words = match status {
                Some(status) => format!("answered {status}"),
                None => "failed".to_string(),
            };
            if let Some(code) = e.code() {
                words.push_str(&format!(" {}", capped(code)));
            }
            if let Some(message) = e.message() {
                words.push_str(&format!(": {}", capped(message)));
            }
            if let Some(id) = e.request_id() {
                words.push_str(&format!(" (request id {})", capped(id)));
            }
            words
        }
    };
    StoreError {
        operation,
        status,
        detail,
    }
}

/// The longest part of a store's answer a log line quotes, in characters.
const QUOTED_CHARS: usize = 160;

/// `text` for a log line: at most [`QUOTED_CHARS`] characters, control
/// characters escaped, and how much was left out.
fn capped(text: &str) -> String {
    let mut out: String = text
        .chars()
        .take(QUOTED_CHARS)
        .flat_map(|c| {
            let escaped: String = if c.is_control() {
                c.escape_default().collect()
            } else {
                c.to_string()
            };
            escaped.chars().collect::<Vec<_>>()
        })
        .collect();
    let count = text.chars().count();
    if count > QUOTED_CHARS {
        out.push_str(&format!("... ({count} characters)"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_keys_are_decoded_only_where_the_answer_says_so() {
        assert_eq!(listed_key("a%01b+c%2Bd", true).unwrap(), "a\u{1}b c+d");
        assert_eq!(listed_key("m%40x/%C3%A9", true).unwrap(), "m@x/\u{e9}");
        assert_eq!(listed_key("a+b%41", false).unwrap(), "a+b%41");
        assert_eq!(listed_key("%FF", true), None);
    }

    #[test]
    fn a_store_that_would_list_forever_is_stopped() {
        let mut followed = std::collections::HashSet::new();
        assert_eq!(next_token(&mut followed, Some("t1")).unwrap(), "t1");
        assert_eq!(next_token(&mut followed, Some("t2")).unwrap(), "t2");
        let again = next_token(&mut followed, Some("t1")).unwrap_err();
        assert!(again.detail.contains("gave before"), "{again}");
        let none = next_token(&mut followed, None).unwrap_err();
        assert!(
            none.detail.contains("without a continuation token"),
            "{none}"
        );
    }

    #[test]
    fn a_listing_past_its_pages_objects_or_time_fails_naming_the_limit() {
        let limits = ListingLimits {
            pages: 3,
            objects: 2,
            time: Duration::from_secs(5),
        };
        let object = StoredObject {
            key: "k".into(),
            bytes: 1,
            modified: SystemTime::UNIX_EPOCH,
        };
        let mut listing = Listing::default();
        assert!(limits.check(&listing, Duration::ZERO).is_ok());
        let late = limits.check(&listing, Duration::from_secs(5)).unwrap_err();
        assert!(late.detail.contains("limit of 5 s"), "{late}");
        listing.objects = vec![object.clone(), object];
        let full = limits.check(&listing, Duration::ZERO).unwrap_err();
        assert!(full.detail.contains("limit of 2 objects"), "{full}");
        listing.pages = 3;
        let long = limits.check(&listing, Duration::ZERO).unwrap_err();
        assert!(long.detail.contains("limit of 3 pages"), "{long}");
        assert!(long.detail.contains("nothing is evicted"), "{long}");
    }

    #[test]
    fn quoted_answers_are_capped_and_their_control_characters_escaped() {
        assert_eq!(capped("AccessDenied"), "AccessDenied");
        assert_eq!(capped("a\nb\u{1b}[31m"), "a\\nb\\u{1b}[31m");
        let long = capped(&"x".repeat(10_000));
        assert!(long.len() < QUOTED_CHARS + 40, "{long}");
        assert!(long.ends_with("(10000 characters)"), "{long}");
    }
}
