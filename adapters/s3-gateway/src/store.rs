//! The gateway's own requests to a tier's store, for the bucket bound
//! ([`super::bound`]): the listing of the tier's prefix, the deletion of
//! victims and the size of a multipart object just completed. They go
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

/// How long one attempt of one of the gateway's own requests may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts per request (the SDK's standard retries, with backoff).
const ATTEMPTS: u32 = 3;

/// One object of a listing: its key without the tier's prefix, its size
/// and when the store last wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    /// The key inside the tier's prefix.
    pub key: String,
    /// Bytes.
    pub bytes: u64,
    /// The store's `LastModified`.
    pub modified: SystemTime,
}

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
    /// `ListObjectsV2`, `DeleteObject` or `HeadObject`.
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

fn failed(operation: &'static str, e: impl std::error::Error) -> StoreError {
    StoreError {
        operation,
        detail: DisplayErrorContext(e).to_string(),
    }
}
