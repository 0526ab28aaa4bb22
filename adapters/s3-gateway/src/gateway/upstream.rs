//! The store behind one gateway: its client, the real credentials, the
//! start-up check of the bucket (with the likely cause of a refusal named),
//! requests signed again for it, and the DELETE of the object a multipart
//! complete replaces.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::BodyExt;

use crate::client::{self, Body, BoxError, Progress, UpstreamClient};
use crate::credentials::RealCredentials;
use crate::key::Route;
use crate::sigv4::{self, KeyPair};
use crate::spec::{BucketSpecError, BucketTier};
use crate::state::Stats;
use lmcache_tier_spec::error_chain;

use super::limits::UPSTREAM_SILENCE;

/// How long the start-up check of the bucket (a HEAD) may wait for its
/// answer: as long as a credential source may take (30 s, `credentials`),
/// since a failure stops the launch and no request waits on it.
const BUCKET_CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// The most of the store's answer to `GET /<bucket>?location` read at start.
const LOCATION_ANSWER_BYTES: usize = 64 << 10;

/// One tier's gateway, ready to serve: what it forwards to and with which keys.
pub(crate) struct Upstream {
    pub(super) tier: BucketTier,
    pub(super) client: UpstreamClient,
    /// The real credentials, refreshed before they expire.
    pub(super) credentials: RealCredentials,
    /// The key LMCache signs with.
    pub(super) local_key: KeyPair,
    /// The bucket bound, for a tier with `max_capacity_gb`.
    pub(crate) bound: Option<Arc<crate::bound::Bound>>,
    /// When the gateway was made.
    pub(super) started: std::time::Instant,
}

impl Upstream {
    /// The tier and its credentials, for the bucket bound's own client.
    pub(crate) fn tier_and_credentials(&self) -> (&BucketTier, RealCredentials) {
        (&self.tier, self.credentials.clone())
    }

    /// Records in `stats` when the real credentials in use expire.
    pub(crate) async fn note_credential_expiry(&self, stats: &Stats) {
        if let Ok((credentials, _)) = self.credentials.current().await {
            stats.credentials_expire(credentials.expiry());
        }
    }

    /// Builds the upstream client (TLS with the built-in roots plus the
    /// tier's `s3_ca_bundle`), gets the real credentials and checks the
    /// bucket with a HEAD signed with them. Returns the gateway and the
    /// name of the credentials' source.
    ///
    /// Errors name the tier and the key: no credentials from any source,
    /// or a source that failed (`aws_access_key_id`, with the sources
    /// tried), the store's certificate is not trusted (`s3_ca_bundle`), the
    /// endpoint cannot be reached (`s3_endpoint`), the credentials are
    /// refused (`aws_access_key_id`), the bucket does not exist
    /// (`s3_bucket`).
    pub(crate) async fn connect(
        tier: BucketTier,
        local_key: KeyPair,
    ) -> Result<(Self, String), BucketSpecError> {
        let position = tier.position;
        let err = |key: &'static str, problem: String, fix: &str| BucketSpecError {
            position,
            key,
            problem,
            fix: fix.to_string(),
        };
        let client = UpstreamClient::new(tier.ca_bundle_pem.as_deref(), UPSTREAM_SILENCE).map_err(
            |problem| {
                err(
                    "s3_ca_bundle",
                    problem.to_string(),
                    "Point it at a PEM file of CA certificates.",
                )
            },
        )?;
        let no_credentials = |e: crate::credentials::NoCredentials| {
            err(
                "aws_access_key_id",
                e.to_string(),
                "Set \"aws_access_key_id\" and \"aws_secret_access_key\" in the tier, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the launcher's environment, a profile (AWS_PROFILE, ~/.aws/credentials), web identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN), or run where instance metadata serves a role (docs/s3-gateway.md, \"Credentials\").",
            )
        };
        let credentials = RealCredentials::new(&tier.credentials).map_err(no_credentials)?;
        let upstream = Upstream {
            tier,
            client,
            credentials,
            local_key,
            bound: None,
            started: std::time::Instant::now(),
        };
        let (current, source) = upstream
            .credentials
            .current()
            .await
            .map_err(no_credentials)?;
        let source = source.to_string();
        upstream.check_bucket(&current).await?;
        Ok((upstream, source))
    }

    /// The start-up check of the bucket: a HEAD signed with `current`.
    /// Errors name the key most likely at fault: a request that cannot be
    /// signed (`aws_access_key_id`), a store that cannot be reached
    /// (`s3_endpoint`, or `s3_ca_bundle` for a certificate that is not
    /// trusted), an answer that is not a success ([`Self::refused_check`]).
    async fn check_bucket(&self, current: &Credentials) -> Result<(), BucketSpecError> {
        let err = |key: &'static str, problem: String, fix: &str| BucketSpecError {
            position: self.tier.position,
            key,
            problem,
            fix: fix.to_string(),
        };
        let bucket = Route {
            path: format!("/{}", self.tier.bucket),
            query: String::new(),
            listing: false,
        };
        let path = &bucket.path;
        let request = self
            .signed(
                current,
                Method::HEAD,
                &bucket,
                HeaderMap::new(),
                "UNSIGNED-PAYLOAD",
                client::empty(),
            )
            .map_err(|e| {
                err(
                    "aws_access_key_id",
                    format!("cannot sign: {e}"),
                    "Check the credentials.",
                )
            })?;
        let url = format!("{}://{}{path}", self.tier.scheme, self.tier.endpoint);
        let started = client::Progress::new();
        let response = self
            .client
            .send(request, &started, BUCKET_CHECK_TIMEOUT)
            .await
            .map_err(|e| {
            let detail = error_chain(&e);
            if self.tier.scheme == "https" && refused_certificate(&e) {
                err(
                    "s3_ca_bundle",
                    format!("HEAD {url}: the store's TLS certificate is not trusted: {detail}"),
                    "Set \"s3_ca_bundle\" to a PEM file with the CA that signed the store's certificate (or check the certificate's host names).",
                )
            } else {
                err(
                    "s3_endpoint",
                    format!("HEAD {url} failed: {detail}"),
                    "Check that the object store is reachable from this node, and \"disable_tls\" (true for plain http).",
                )
            }
        })?;
        if response.status().is_success() {
            return Ok(());
        }
        Err(self.refused_check(current, &url, response.status()).await)
    }

    /// Why the start-up HEAD of the bucket at `url` was answered `status`
    /// (not a success), naming the key most likely at fault: refused
    /// credentials (`aws_access_key_id`), a region the store does not serve
    /// (`s3_region`, with the region the store expects when a signed
    /// `GET /<bucket>?location` names it), a bucket the credentials do not
    /// see (`s3_bucket`; for OpenStack Swift's `account:user` keys, another
    /// account's bucket), or another answer (`s3_endpoint`).
    /// (`docs/s3-gateway.md`, "OpenStack Swift".)
    async fn refused_check(
        &self,
        credentials: &Credentials,
        url: &str,
        status: StatusCode,
    ) -> BucketSpecError {
        let err = |key: &'static str, problem: String, fix: &str| BucketSpecError {
            position: self.tier.position,
            key,
            problem,
            fix: fix.to_string(),
        };
        match status {
            StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => err(
                "aws_access_key_id",
                format!("the object store refused the credentials (HEAD {url}: {status})"),
                "Give a key pair that may read and write the bucket, and check \"s3_region\".",
            ),
            StatusCode::NOT_FOUND if swift_account_key(credentials.access_key_id()) => err(
                "s3_bucket",
                format!("the bucket does not exist for these credentials (HEAD {url}: 404); their access key has OpenStack Swift's account:user form, and each Swift account has buckets of its own: the bucket may be another account's"),
                "Give the credentials of the account that holds the bucket (aws_access_key_id \"<account>:<user>\"), or create the bucket in this one.",
            ),
            StatusCode::NOT_FOUND => err(
                "s3_bucket",
                format!("the bucket does not exist for these credentials (HEAD {url}: 404)"),
                "Create the bucket or name an existing one (on stores with accounts, in the credentials' account).",
            ),
            StatusCode::BAD_REQUEST => self.region_error(credentials, url).await,
            other => err(
                "s3_endpoint",
                format!("HEAD {url} answered {other}"),
                "Check the endpoint and that it serves S3 path-style requests.",
            ),
        }
    }

    /// The error of a start-up HEAD answered 400 at `url`: most likely a
    /// region the store does not serve, named with the one it expects when
    /// its answer to `GET /<bucket>?location` says so (the first 300
    /// characters of that answer otherwise).
    async fn region_error(&self, credentials: &Credentials, url: &str) -> BucketSpecError {
        let said = self.location_answer(credentials).await;
        let region = &self.tier.region;
        let (problem, fix) = match said.as_deref().and_then(expected_region) {
            Some(expected) => (
                format!("the object store expects region \"{expected}\", not \"{region}\" (HEAD {url}: 400)"),
                format!("Set \"s3_region\" to \"{expected}\"."),
            ),
            None => {
                let answer = said
                    .map(|s| format!(" (GET ?location: {})", s.chars().take(300).collect::<String>()))
                    .unwrap_or_default();
                (
                    format!("HEAD {url} answered 400 Bad Request{answer}: the likely cause is a region the store does not serve (\"{region}\"), which a HEAD answer cannot name"),
                    "Set \"s3_region\" to the store's region (OpenStack Swift: the location of its s3api, often RegionOne; stores without regions take us-east-1), and check that the endpoint serves S3 path-style requests.".to_string(),
                )
            }
        };
        BucketSpecError {
            position: self.tier.position,
            key: "s3_region",
            problem,
            fix,
        }
    }

    /// The start of the store's answer to a signed `GET /<bucket>?location`
    /// (at most [`LOCATION_ANSWER_BYTES`]): unlike a HEAD's, an error answer
    /// has a body, which says what was wrong. `None` when it cannot be had.
    async fn location_answer(&self, credentials: &Credentials) -> Option<String> {
        let route = Route {
            path: format!("/{}", self.tier.bucket),
            query: "location".to_string(),
            listing: false,
        };
        let request = self
            .signed(
                credentials,
                Method::GET,
                &route,
                HeaderMap::new(),
                "UNSIGNED-PAYLOAD",
                client::empty(),
            )
            .ok()?;
        let started = client::Progress::new();
        let response = self
            .client
            .send(request, &started, UPSTREAM_SILENCE)
            .await
            .ok()?;
        let body = http_body_util::Limited::new(response.into_body(), LOCATION_ANSWER_BYTES);
        let bytes = tokio::time::timeout(UPSTREAM_SILENCE, body.collect())
            .await
            .ok()?
            .ok()?
            .to_bytes();
        Some(String::from_utf8_lossy(&bytes).trim().to_string())
    }

    /// Deletes the object a multipart complete on `route` is about to
    /// replace, before the complete is forwarded: OpenStack Swift keeps the
    /// parts of a multipart object in `<bucket>+segments`, and an overwrite
    /// leaves the old object's parts there, counted by no listing of the
    /// bucket; a DELETE of the object removes them with it. On stores that
    /// drop them themselves (S3) it costs one request (DELETE requests are
    /// free on S3), and one of a key that does not exist succeeds. A failure
    /// is logged and the complete goes on (`docs/s3-gateway.md`,
    /// "OpenStack Swift").
    pub(super) async fn delete_replaced(&self, route: &Route) {
        let object = Route {
            path: route.path.clone(),
            query: String::new(),
            listing: false,
        };
        let failed = match self.delete_object(&object).await {
            Ok(status) if status.is_success() || status == StatusCode::NOT_FOUND => return,
            Ok(status) => format!("answered {status}"),
            Err(cause) => cause,
        };
        tracing::warn!(
            tier = self.tier.position,
            "S3 gateway could not delete the object a multipart upload replaces ({failed}): on stores that keep parts apart (OpenStack Swift's <bucket>+segments) its parts stay behind"
        );
    }

    /// A DELETE of `object`, signed with the real credentials: the store's
    /// status, or why there was none (no path or query).
    async fn delete_object(&self, object: &Route) -> Result<StatusCode, String> {
        let (credentials, _) = self
            .credentials
            .current()
            .await
            .map_err(|e| e.to_string())?;
        let request = self
            .signed(
                &credentials,
                Method::DELETE,
                object,
                HeaderMap::new(),
                "UNSIGNED-PAYLOAD",
                client::empty(),
            )
            .map_err(|e| format!("cannot sign: {e}"))?;
        let response = self
            .client
            .send(request, &Progress::new(), UPSTREAM_SILENCE)
            .await
            .map_err(|e| error_chain(&e))?;
        Ok(response.status())
    }

    /// A request to the upstream for `route` with `headers`, `body` and
    /// SigV4 headers for `credentials`. The signature covers the path and
    /// query exactly as they are sent: `http::Uri` neither normalises nor
    /// re-encodes them.
    pub(super) fn signed(
        &self,
        credentials: &Credentials,
        method: Method,
        route: &Route,
        mut headers: HeaderMap,
        payload_hash: &str,
        body: Body,
    ) -> Result<Request<Body>, BoxError> {
        let (scheme, endpoint) = (self.tier.scheme, &self.tier.endpoint);
        let Route { path, query, .. } = route;
        let uri = if query.is_empty() {
            format!("{scheme}://{endpoint}{path}")
        } else {
            format!("{scheme}://{endpoint}{path}?{query}")
        };
        headers.insert(http::header::HOST, HeaderValue::from_str(endpoint)?);
        let pairs: Vec<(&str, &str)> = headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))
            .collect();
        let signature = sigv4::s3_signature(
            method.as_str(),
            &uri,
            &pairs,
            payload_hash,
            credentials,
            &self.tier.region,
            SystemTime::now(),
        )?;
        for (name, value) in signature {
            headers.insert(
                HeaderName::from_bytes(name.as_bytes())?,
                HeaderValue::from_str(&value)?,
            );
        }
        let mut request = Request::builder().method(method).uri(uri).body(body)?;
        *request.headers_mut() = headers;
        Ok(request)
    }
}

/// The region an S3 error answer says the store expects: AWS S3's
/// `<Region>` of `AuthorizationHeaderMalformed`, or the `expecting '<region>'`
/// of its message, as OpenStack Swift's s3api words it.
fn expected_region(answer: &str) -> Option<String> {
    let tagged = answer
        .split_once("<Region>")
        .and_then(|(_, rest)| rest.split_once("</Region>"))
        .map(|(region, _)| region);
    let worded = || {
        answer
            .split_once("expecting '")
            .and_then(|(_, rest)| rest.split_once('\''))
            .map(|(region, _)| region)
    };
    tagged
        .or_else(worded)
        .map(str::trim)
        .filter(|r| !r.is_empty() && r.len() <= 64)
        .map(str::to_string)
}

/// Whether `access_key_id` has the `account:user` form of OpenStack
/// Swift's tempauth and keystone S3 keys (AWS key ids have no `:`).
fn swift_account_key(access_key_id: &str) -> bool {
    access_key_id
        .split_once(':')
        .is_some_and(|(account, user)| !account.is_empty() && !user.is_empty())
}

/// Whether rustls refused the upstream's certificate somewhere in `error`'s
/// chain (not signed by a trusted CA, not valid for the host, expired, none
/// sent). The TLS error travels inside `io::Error`s, whose `source()` is the
/// source of the error they wrap, not that error: each is opened.
fn refused_certificate(error: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(tls) = error.downcast_ref::<rustls::Error>() {
        return matches!(
            tls,
            rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
        );
    }
    let wrapped = error
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::get_ref);
    match wrapped {
        Some(inner) => refused_certificate(inner),
        None => error.source().is_some_and(refused_certificate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_certificate_is_found_by_type_inside_nested_io_errors() {
        /// The shape of hyper-util's connect error: the connector's boxed
        /// error as its source.
        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Connect(#[source] BoxError);
        let tls = |e: rustls::Error| {
            let handshake = std::io::Error::new(std::io::ErrorKind::InvalidData, e);
            Connect(Box::new(std::io::Error::other(handshake)))
        };
        let untrusted = rustls::CertificateError::UnknownIssuer;
        assert!(refused_certificate(&tls(
            rustls::Error::InvalidCertificate(untrusted)
        )));
        assert!(refused_certificate(&tls(
            rustls::Error::NoCertificatesPresented
        )));
        assert!(!refused_certificate(&tls(rustls::Error::AlertReceived(
            rustls::AlertDescription::HandshakeFailure
        ))));
        let worded = Connect(Box::new(std::io::Error::other("bad certificate")));
        assert!(!refused_certificate(&worded));
    }

    #[test]
    fn the_expected_region_is_read_from_aws_and_swift_answers() {
        let aws = "<Error><Code>AuthorizationHeaderMalformed</Code><Message>the region 'us-east-1' is wrong; expecting 'eu-west-1'</Message><Region>eu-west-1</Region></Error>";
        assert_eq!(expected_region(aws).as_deref(), Some("eu-west-1"));
        let swift = "<Error><Code>AuthorizationHeaderMalformed</Code><Message>The authorization header is malformed; the region 'us-east-1' is wrong; expecting 'RegionOne'</Message></Error>";
        assert_eq!(expected_region(swift).as_deref(), Some("RegionOne"));
        assert_eq!(
            expected_region("<Error><Code>InvalidArgument</Code></Error>"),
            None
        );
    }

    #[test]
    fn swift_keys_are_account_colon_user() {
        assert!(swift_account_key("kv:node"));
        assert!(!swift_account_key("AKIAIOSFODNN7EXAMPLE"));
        assert!(!swift_account_key(":node"));
    }
}
