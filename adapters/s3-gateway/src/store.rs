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
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::DisplayErrorContext;
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
#[derive(Debug)]
pub struct Listing {
    /// Every object under the prefix, in the store's (key) order.
    pub objects: Vec<StoredObject>,
    /// ListObjectsV2 pages fetched (one request each).
    pub pages: u64,
}

/// Why a request of the gateway's own failed: the SDK's error with its
/// whole context (never the credentials).
#[derive(Debug, thiserror::Error)]
#[error("{operation} failed: {detail}")]
pub struct StoreError {
    /// The S3 request: `ListObjectsV2`, `DeleteObject`, `HeadObject`,
    /// `PutObject`, `GetObject`, `ListMultipartUploads` or
    /// `AbortMultipartUpload`.
    pub operation: &'static str,
    /// The SDK's error and its causes.
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

    /// Every object under the tier's prefix (ListObjectsV2, paged; 1,000
    /// keys a page on S3). Objects without a size or date are skipped.
    ///
    /// # Errors
    /// [`StoreError`] of the first page that failed after retries.
    pub(crate) async fn list(&self) -> Result<Listing, StoreError> {
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(&self.key_prefix)
            .into_paginator()
            .send();
        let mut listing = Listing {
            objects: Vec::new(),
            pages: 0,
        };
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| failed("ListObjectsV2", e))?;
            listing.pages += 1;
            for object in page.contents() {
                if let Some(found) = self.stored(object) {
                    listing.objects.push(found);
                }
            }
        }
        Ok(listing)
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
            .max_keys(1)
            .send()
            .await
            .map_err(|e| failed("ListObjectsV2", e))?;
        Ok(())
    }

    fn stored(&self, object: &aws_sdk_s3::types::Object) -> Option<StoredObject> {
        let key = object.key()?.strip_prefix(self.key_prefix.as_str())?;
        Some(StoredObject {
            key: key.to_string(),
            bytes: u64::try_from(object.size()?).ok()?,
            modified: SystemTime::try_from(*object.last_modified()?).ok()?,
        })
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
                Some(501) => Ok(PutAnswer::Unsupported),
                Some(400) if condition.is_some() => Ok(PutAnswer::Unsupported),
                _ => Err(failed("PutObject", e)),
            },
        }
    }

    /// The ETag and body of `key` (inside the tier's prefix), at most
    /// `limit` bytes of it; `None` when it does not exist.
    ///
    /// # Errors
    /// [`StoreError`] after retries, or a body over `limit`.
    pub(crate) async fn get(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<Option<(String, Vec<u8>)>, StoreError> {
        let answer = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(format!("{}{key}", self.key_prefix))
            .send()
            .await;
        let out = match answer {
            Ok(out) => out,
            Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 404) => {
                return Ok(None)
            }
            Err(e) => return Err(failed("GetObject", e)),
        };
        if out.content_length().is_some_and(|n| n > limit as i64) {
            return Err(StoreError {
                operation: "GetObject",
                detail: format!("{key} is larger than {limit} bytes"),
            });
        }
        let etag = out.e_tag().unwrap_or_default().to_string();
        let body = out
            .body
            .collect()
            .await
            .map_err(|e| failed("GetObject", e))?;
        Ok(Some((etag, body.to_vec())))
    }

    /// The keys (inside `folder`, itself inside the tier's prefix) and
    /// ETags of the objects under `folder` (ListObjectsV2, paged), and the
    /// pages it took. The ETag is `None` where the listing gives none
    /// (s3s-fs).
    ///
    /// # Errors
    /// [`StoreError`] of the first page that failed after retries.
    pub(crate) async fn list_folder(
        &self,
        folder: &str,
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
        while let Some(page) = pages.next().await {
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

fn failed(operation: &'static str, e: impl std::error::Error) -> StoreError {
    StoreError {
        operation,
        detail: DisplayErrorContext(e).to_string(),
    }
}
