//! The loopback gateway of one `s3` tier with `s3_bucket`: LMCache's S3
//! adapter talks virtual-hosted style to `127.0.0.1:<port>` with the
//! per-launch key; the gateway checks that signature, maps `/<key>` to
//! `/<bucket>/<prefix><key>` with the key's bytes exact (and
//! `GET /?list-type=2` to the bucket listing inside the prefix; [`key`]) on
//! the operator's endpoint, signs again with the real credentials, and
//! streams bodies both ways.
//!
//! Answers of its own (S3 XML error bodies): 403 for a bad signature; 400
//! and 501 for what it does not forward ([`key::Refusal`]: keys it cannot
//! carry exactly, and requests LMCache never sends); 501 for aws-chunked
//! payloads; 503 when the upstream cannot be reached or is silent for
//! [`UPSTREAM_SILENCE`]: LMCache's S3 client gets a status it retries and
//! reports as an S3 error, never a dropped connection, which its circuit
//! breaker would count towards switching the tier off. An upload that its
//! own client stops sending for that long, or that breaks off, is the
//! client's: 400 `RequestTimeout` or `IncompleteBody`, as S3 answers them,
//! counted apart from the upstream's failures ([`Upload`]).
//!
//! Each connection is checked once, when it is accepted: the owner of the
//! connecting socket must be the LMCache server's uid ([`Peers`]); every
//! request on a connection that is not gets 403 `AccessDenied`.
//!
//! An unsigned `GET` on [`STATE_PATH`] answers the gateway's own state as
//! JSON ([`super::state`]), whoever asks; every other request is counted in
//! [`Stats`].

use std::convert::Infallible;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyDataStream, BodyExt, Full, StreamBody};
use hyper::body::{Body as _, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::client::{self, Body, BoxError, Progress, UpstreamClient};
use super::credentials::{NoCredentials, RealCredentials};
use super::key::{self, Route};
use super::peer::{self, PeerError};
use super::sigv4::{self, KeyPair, Signed};
use super::spec::{BucketSpecError, BucketTier};
use super::state::{Stats, STATE_PATH};
use lmcache_tier_spec::error_chain;

/// The longest an exchange with the upstream may make no progress before
/// the gateway gives up on it, in seconds: no request-body byte taken, no
/// response head once the body is sent, no response-body byte. A request
/// that gets no head in time is answered `503 ServiceUnavailable`; a
/// response body that stops is cut off. The bound is on silence, not on
/// the whole transfer: a slow upload or download that keeps moving is
/// never cut.
///
/// Why 5 s: LMCache 0.5.6's S3 adapter (awscrt 0.38.1) drops a connection
/// that has been silent for about 30 s and tries each request 6 times, so
/// a stalled upstream behind a bound near 30 s costs a load about 190 s
/// and reaches LMCache as a dropped connection instead of a status. At 5 s
/// each attempt gets its 503 and LMCache's load fails after about 40 s in
/// all (6 x 5 s plus its backoff; `docs/performance.md`, "S3 gateway: a
/// failing upstream"). A KV chunk whose first byte is 5 s late is worth
/// less than recomputing it. 5 s is also the connect timeout of the
/// gateway's client and the default transport timeout of LMCache's
/// SageMaker HyperPod L2 adapter (`timeout_ms` 5000).
pub const UPSTREAM_SILENCE: Duration = Duration::from_secs(5);
/// The longest a multipart complete (`POST /<key>?uploadId=`) may make no
/// progress upstream, in place of [`UPSTREAM_SILENCE`]: for its response
/// head and between the bytes of its body. A store may take minutes to
/// assemble the parts ("Processing of a Complete Multipart Upload request
/// could take several minutes", AWS's API reference). S3 keeps the answer
/// alive with an early `200` and spaces; OpenStack Swift's s3api (2.30)
/// sends nothing for its first 10 s, and spaces only while it checks the
/// parts, not while it writes the manifest: 25 s and more without a byte on
/// a loaded host. So a complete the store has not answered within
/// [`UPSTREAM_SILENCE`] is answered `200` by the gateway itself, kept alive
/// with a space every 5 s (LMCache 0.5.6's awscrt drops
/// a connection silent for about 30 s), and ends with the store's result
/// or error in the body, as S3 answers a complete that fails late
/// (`docs/s3-gateway.md`, "OpenStack Swift").
pub const COMPLETE_SILENCE: Duration = Duration::from_secs(120);
/// How often the gateway sends a space on a complete it answered itself
/// ([`COMPLETE_SILENCE`]).
const COMPLETE_KEEP_ALIVE: Duration = Duration::from_secs(5);
/// The largest result of a multipart complete read whole (with spaces).
const MAX_COMPLETE_BYTES: usize = 1 << 20;
/// The XML declaration that starts a complete the gateway keeps alive.
const XML_DECLARATION: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
/// How long the start-up check of the bucket (a HEAD) may wait for its
/// answer: as long as a credential source may take (30 s, `credentials`),
/// since a failure stops the launch and no request waits on it.
const BUCKET_CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of the store's answer to `GET /<bucket>?location` read at start.
const LOCATION_ANSWER_BYTES: usize = 64 << 10;
/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The smallest chunk of a request body written to the upstream (bar the last).
const FORWARD_CHUNK: usize = 256 << 10;
/// The largest listing page translated in memory (S3 pages hold 1000 keys).
const MAX_LISTING_BYTES: usize = 16 << 20;

/// Response headers not passed back: hop-by-hop ones.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// One tier's gateway, ready to serve: what it forwards to and with which keys.
pub(crate) struct Upstream {
    tier: BucketTier,
    client: UpstreamClient,
    /// The real credentials, refreshed before they expire.
    credentials: RealCredentials,
    /// The key LMCache signs with.
    local_key: KeyPair,
    /// The bucket bound, for a tier with `max_capacity_gb`.
    pub(crate) bound: Option<Arc<super::bound::Bound>>,
    /// When the gateway was made.
    started: std::time::Instant,
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
        let no_credentials = |e: super::credentials::NoCredentials| {
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
        let bucket = Route {
            path: format!("/{}", upstream.tier.bucket),
            query: String::new(),
            listing: false,
        };
        let path = &bucket.path;
        let request = upstream
            .signed(
                &current,
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
        let url = format!(
            "{}://{}{path}",
            upstream.tier.scheme, upstream.tier.endpoint
        );
        let started = client::Progress::new();
        let response = upstream
            .client
            .send(request, &started, BUCKET_CHECK_TIMEOUT)
            .await
            .map_err(|e| {
            let detail = error_chain(&e);
            if upstream.tier.scheme == "https" && refused_certificate(&e) {
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
            return Ok((upstream, source));
        }
        Err(upstream
            .refused_check(&current, &url, response.status())
            .await)
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
    async fn delete_replaced(&self, route: &Route) {
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
    fn signed(
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

/// Who may use a gateway: connections to `addr` whose socket belongs to
/// `server_uid`, the uid the LMCache server runs as (`docs/s3-gateway.md`,
/// "Who may use the gateway").
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peers {
    /// The uid of the LMCache server.
    pub(crate) server_uid: u32,
    /// The gateway's listening address (`127.0.0.1:<port>`).
    pub(crate) addr: SocketAddr,
}

/// Why a connection is not served.
#[derive(Debug, thiserror::Error)]
enum PeerRefusal {
    /// Its socket belongs to another uid.
    #[error("its socket belongs to uid {uid}, not to the LMCache server's uid {server_uid}")]
    OtherUid {
        /// The socket's owner.
        uid: u32,
        /// The LMCache server's uid.
        server_uid: u32,
    },
    /// Its socket's owner cannot be found.
    #[error("the owner of its socket cannot be found: {0}")]
    Unknown(
        /// Why not.
        PeerError,
    ),
}

/// One accepted connection: where it comes from and, when it may not use
/// the gateway, why.
struct Connection {
    peer: SocketAddr,
    refusal: Option<PeerRefusal>,
    /// Whether the refusal was logged (once per connection).
    logged: AtomicBool,
}

impl Peers {
    /// The connection from `peer`, checked: its socket's owner looked up
    /// once ([`peer::socket_owner`]) and compared with the server's uid.
    /// The `sock_diag` lookup runs here; the socket tables, where it is not
    /// to be had, are read on a blocking thread, never on the runtime's
    /// (the launch runs one: a read of a busy table takes milliseconds).
    async fn check(self, peer: SocketAddr) -> Connection {
        let local = self.addr;
        let owner = match peer::socket_owner_by_diag(peer, local) {
            Some(owner) => owner,
            None => tokio::task::spawn_blocking(move || peer::socket_owner_in_tables(peer, local))
                .await
                .unwrap_or_else(|e| {
                    Err(PeerError::Table {
                        path: "/proc/net/tcp".into(),
                        problem: format!("the lookup did not finish: {e}"),
                    })
                }),
        };
        let refusal = match owner {
            Ok(uid) if uid == self.server_uid => None,
            Ok(uid) => Some(PeerRefusal::OtherUid {
                uid,
                server_uid: self.server_uid,
            }),
            Err(e) => Some(PeerRefusal::Unknown(e)),
        };
        Connection {
            peer,
            refusal,
            logged: AtomicBool::new(false),
        }
    }
}

/// Serves `upstream` on `listener` to the connections `peers` admits
/// until the runtime shuts down, counting in `stats`.
pub(crate) async fn serve(
    listener: TcpListener,
    peers: Peers,
    upstream: Arc<Upstream>,
    stats: Arc<Stats>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(
                    tier = upstream.tier.position,
                    "S3 gateway accept failed: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let upstream = upstream.clone();
        let stats = stats.clone();
        tokio::spawn(async move {
            let connection = Arc::new(peers.check(peer).await);
            let service = service_fn(move |request| {
                handle(upstream.clone(), stats.clone(), connection.clone(), request)
            });
            if let Err(e) = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!("S3 gateway connection ended: {e}");
            }
        });
    }
}

/// Binds the gateway's loopback listener on an ephemeral port.
pub(crate) async fn bind() -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let addr = listener.local_addr()?;
    Ok((listener, addr))
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

/// Why a request is answered by the gateway itself instead of the upstream:
/// an S3 XML error ([`ForwardError::response`]).
#[derive(Debug, thiserror::Error)]
enum ForwardError {
    /// The request is not signed with the per-launch key (403).
    #[error(transparent)]
    Unauthenticated(
        /// What is wrong with the signature.
        sigv4::Rejection,
    ),
    /// The payload is aws-chunked, which the gateway does not re-sign (501).
    #[error("aws-chunked payloads are not supported by the gateway")]
    Chunked,
    /// A key the gateway cannot carry exactly, or a request LMCache never
    /// sends (400 or 501, [`key::Refusal::status`]).
    #[error(transparent)]
    Unroutable(
        /// Why it is not forwarded.
        key::Refusal,
    ),
    /// The real credentials cannot be had (503).
    #[error("the gateway has no credentials for the upstream: {0}")]
    NoCredentials(
        /// Why not.
        NoCredentials,
    ),
    /// The upstream request cannot be signed (500).
    #[error("cannot sign the upstream request: {0}")]
    Sign(
        /// Why not.
        BoxError,
    ),
    /// The request's own client stopped sending its body, or its body
    /// broke off, while the upstream waited for it (400).
    #[error(transparent)]
    Client(
        /// Which.
        ClientFault,
    ),
    /// The upstream did not answer (503).
    #[error("the upstream object store did not answer: {0}")]
    Unreachable(
        /// The cause chain, with no path or query.
        String,
    ),
    /// A listing answer could not be read whole (503).
    #[error(transparent)]
    Listing(
        /// What went wrong.
        ListingError,
    ),
    /// The upstream's response head cannot be passed back (502).
    #[error("bad upstream response: {0}")]
    Response(
        /// Why not.
        http::Error,
    ),
}

impl ForwardError {
    /// The HTTP status of the gateway's answer.
    fn status(&self) -> StatusCode {
        match self {
            ForwardError::Unauthenticated(_) => StatusCode::FORBIDDEN,
            ForwardError::Client(_) => StatusCode::BAD_REQUEST,
            ForwardError::Chunked => StatusCode::NOT_IMPLEMENTED,
            ForwardError::Unroutable(refusal) => {
                StatusCode::from_u16(refusal.status()).unwrap_or(StatusCode::BAD_REQUEST)
            }
            ForwardError::NoCredentials(_)
            | ForwardError::Unreachable(_)
            | ForwardError::Listing(_) => StatusCode::SERVICE_UNAVAILABLE,
            ForwardError::Sign(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ForwardError::Response(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// The S3 error code of the gateway's answer.
    fn code(&self) -> &'static str {
        match self {
            ForwardError::Unauthenticated(sigv4::Rejection::UnknownKey) => "InvalidAccessKeyId",
            ForwardError::Unauthenticated(sigv4::Rejection::Signature) => "SignatureDoesNotMatch",
            ForwardError::Unauthenticated(_) => "AccessDenied",
            ForwardError::Client(ClientFault::Stalled(_)) => "RequestTimeout",
            ForwardError::Client(ClientFault::BrokeOff(_)) => "IncompleteBody",
            ForwardError::Chunked => "NotImplemented",
            ForwardError::Unroutable(refusal) => refusal.code(),
            ForwardError::NoCredentials(_)
            | ForwardError::Unreachable(_)
            | ForwardError::Listing(_) => "ServiceUnavailable",
            ForwardError::Sign(_) | ForwardError::Response(_) => "InternalError",
        }
    }

    /// The gateway's S3 XML answer.
    fn response(&self) -> Response<Body> {
        error(self.status(), self.code(), &self.to_string())
    }
}

async fn handle(
    upstream: Arc<Upstream>,
    stats: Arc<Stats>,
    connection: Arc<Connection>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    if method == Method::GET && path == STATE_PATH {
        return Ok(state_response(&stats));
    }
    if let Some(refusal) = &connection.refusal {
        return Ok(refuse_peer(
            upstream.tier.position,
            &stats,
            &connection,
            refusal,
        ));
    }
    stats.request(&method);
    let arrived = std::time::Instant::now();
    let (response, own_error) = match forward(&upstream, &stats, request).await {
        Ok(response) => (response, None),
        Err(e) => (e.response(), Some(e)),
    };
    let status = response.status();
    stats.answered(status, arrived.elapsed());
    if let Some(ForwardError::Client(fault)) = &own_error {
        tracing::warn!(tier = upstream.tier.position, %method, %path, %status, "S3 gateway request ended by its client, not the upstream: {fault}");
    } else if status.is_server_error() {
        let cause = match own_error {
            Some(e) => e.to_string(),
            None => "the upstream answered it".to_string(),
        };
        tracing::warn!(tier = upstream.tier.position, %method, %path, %status, "S3 gateway request failed: {cause}");
    } else {
        tracing::debug!(tier = upstream.tier.position, %method, %path, %status, "S3 gateway request");
    }
    Ok(response)
}

/// The answer to a request on a connection the gateway does not serve:
/// 403 `AccessDenied` naming the reason, counted in `stats`; the first on
/// the connection is logged with it.
fn refuse_peer(
    tier: usize,
    stats: &Stats,
    connection: &Connection,
    refusal: &PeerRefusal,
) -> Response<Body> {
    stats.peer_refused();
    if !connection.logged.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            tier,
            "S3 gateway refused a connection from {}: {refusal}",
            connection.peer
        );
    }
    let message = format!(
        "the S3 gateway serves only the node's LMCache server, and this connection is not its: {refusal}"
    );
    error(StatusCode::FORBIDDEN, "AccessDenied", &message)
}

/// Forwards one request of LMCache's: [`authenticate`] it, [`route`] it into
/// the bucket, [`re_sign`] it with the real credentials, [`relay`] it and
/// the answer.
async fn forward(
    upstream: &Upstream,
    stats: &Arc<Stats>,
    request: Request<Incoming>,
) -> Result<Response<Body>, ForwardError> {
    let (parts, body) = request.into_parts();
    let payload_hash = authenticate(upstream, stats, &parts)?;
    let route = route(&upstream.tier, &parts)?;
    let progress = Progress::new();
    let upload = Upload::default();
    let body = upstream_body(body, stats.clone(), progress.clone(), upload.clone());
    let complete = is_complete(&parts.method, &route);
    if complete {
        upstream.delete_replaced(&route).await;
    }
    let request = re_sign(upstream, stats, &parts, &route, &payload_hash, body).await?;
    let exchange = Exchange {
        progress: &progress,
        upload: &upload,
    };
    let response = relay(upstream, stats, &parts.method, &route, request, exchange).await?;
    let Some(bound) = upstream.bound.clone() else {
        return Ok(response);
    };
    if !complete {
        bound.follow(&parts, route.listing, response.status());
        return Ok(response);
    }
    // The object exists once the complete's answer is whole: a slow one
    // keeps its 200 alive with spaces while the store assembles the parts.
    let (head, body) = response.into_parts();
    let status = head.status;
    let body = when_whole(body, move || bound.follow(&parts, false, status));
    Ok(Response::from_parts(head, body))
}

/// `body`, calling `done` once its last frame has been read (not when it
/// breaks off or its reader goes away).
fn when_whole(body: Body, done: impl FnOnce() + Send + 'static) -> Body {
    let mut done = Some(done);
    let end = futures_util::stream::poll_fn(move |_| {
        if let Some(done) = done.take() {
            done();
        }
        Poll::Ready(None)
    });
    let frames = http_body_util::BodyStream::new(body).chain(end);
    StreamBody::new(frames).boxed_unsync()
}

/// Checks the request's SigV4 signature against the per-launch key (a
/// refusal is counted in `stats`). Returns the payload hash it signed,
/// which the upstream request carries on.
fn authenticate(
    upstream: &Upstream,
    stats: &Stats,
    parts: &http::request::Parts,
) -> Result<String, ForwardError> {
    let signed = Signed {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: parts.uri.query().unwrap_or(""),
        headers: &parts.headers,
    };
    let payload_hash = sigv4::verify(
        &signed,
        &upstream.local_key,
        &upstream.tier.region,
        SystemTime::now(),
    )
    .map_err(|rejection| {
        stats.rejected(&rejection);
        ForwardError::Unauthenticated(rejection)
    })?;
    if payload_hash.starts_with("STREAMING-") {
        return Err(ForwardError::Chunked);
    }
    Ok(payload_hash)
}

/// Where the request goes in the bucket: its key under the tier's key
/// prefix, or the listing inside it ([`key::route`]). A refusal is logged.
fn route(tier: &BucketTier, parts: &http::request::Parts) -> Result<Route, ForwardError> {
    let path = parts.uri.path();
    let names = parts.headers.keys().map(|name| name.as_str());
    key::route(
        parts.method.as_str(),
        path,
        parts.uri.query().unwrap_or(""),
        names,
        &tier.bucket,
        &tier.key_prefix,
    )
    .map_err(|refusal| {
        tracing::warn!(
            tier = tier.position,
            code = refusal.code(),
            "S3 gateway refused {} {path}: {refusal}",
            parts.method
        );
        ForwardError::Unroutable(refusal)
    })
}

/// The upstream request for `route`: the headers worth forwarding and
/// `body`, signed with the real credentials for the payload hash LMCache
/// signed.
async fn re_sign(
    upstream: &Upstream,
    stats: &Arc<Stats>,
    parts: &http::request::Parts,
    route: &Route,
    payload_hash: &str,
    body: Body,
) -> Result<Request<Body>, ForwardError> {
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if key::forwarded_header(name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    let (credentials, _) = upstream
        .credentials
        .current()
        .await
        .map_err(ForwardError::NoCredentials)?;
    stats.credentials_expire(credentials.expiry());
    upstream
        .signed(
            &credentials,
            parts.method.clone(),
            route,
            headers,
            payload_hash,
            body,
        )
        .map_err(ForwardError::Sign)
}

/// What one exchange's request body did: when it last moved, and what its
/// client did ([`Upload`]).
#[derive(Clone, Copy)]
struct Exchange<'a> {
    progress: &'a Progress,
    upload: &'a Upload,
}

/// Sends `request` upstream and passes the answer back as it streams in
/// (a listing inside a key prefix is read whole, to strip the prefix from
/// its keys); failures and 5xx answers are counted in `stats`. The head
/// must come within [`UPSTREAM_SILENCE`] of the last progress of
/// `exchange` (the request body's last byte). An exchange that ends with
/// no answer while the request body waited on its client, or after that
/// body broke off, is the client's, not the upstream's.
async fn relay(
    upstream: &Upstream,
    stats: &Arc<Stats>,
    method: &Method,
    route: &Route,
    request: Request<Body>,
    exchange: Exchange<'_>,
) -> Result<Response<Body>, ForwardError> {
    let silence = silence_bound(method, route);
    let answer = if is_complete(method, route) {
        let client = upstream.client.clone();
        let progress = exchange.progress.clone();
        let mut answer: Answer =
            Box::pin(async move { client.send(request, &progress, COMPLETE_SILENCE).await });
        match tokio::time::timeout(UPSTREAM_SILENCE, answer.as_mut()).await {
            Ok(answered) => answered,
            Err(_) if exchange.upload.fault().is_none() => {
                return Ok(kept_alive(
                    Counting::of(upstream, stats),
                    method.clone(),
                    answer,
                ));
            }
            Err(_) => answer.await,
        }
    } else {
        upstream
            .client
            .send(request, exchange.progress, silence)
            .await
    };
    let response = answer.map_err(|e| match exchange.upload.fault() {
        Some(fault) => {
            stats.client_fault(&fault);
            ForwardError::Client(fault)
        }
        None => {
            let cause = error_chain(&e);
            stats.unreachable(method, &cause);
            ForwardError::Unreachable(cause)
        }
    })?;
    Counting::of(upstream, stats).status(method, response.status());
    let key_prefix = &upstream.tier.key_prefix;
    let rewrite_listing = route.listing && !key_prefix.is_empty() && response.status().is_success();
    if rewrite_listing {
        listing_back(response, key_prefix, stats, method).await
    } else {
        streamed_back(
            response,
            stats.clone(),
            method.clone(),
            upstream.tier.position,
            silence,
        )
    }
}

/// What counting an upstream answer needs of a gateway, owned: a complete
/// kept alive ([`kept_alive`]) is counted by a task of its own.
#[derive(Clone)]
struct Counting {
    stats: Arc<Stats>,
    tier: usize,
    /// `<bucket> of <host:port>`, for the warnings.
    place: String,
    started: std::time::Instant,
}

impl Counting {
    fn of(upstream: &Upstream, stats: &Arc<Stats>) -> Counting {
        Counting {
            stats: stats.clone(),
            tier: upstream.tier.position,
            place: format!("{} of {}", upstream.tier.bucket, upstream.tier.endpoint),
            started: upstream.started,
        }
    }

    /// Counts the upstream's answer `status` to `method`: a 5xx as an
    /// upstream error, a 401 or 403 as refused credentials, warned about
    /// at most once a minute ([`super::state::DENIED_WARNING_EVERY`]) with
    /// the refusals since the last warning.
    fn status(&self, method: &Method, status: StatusCode) {
        if status.is_server_error() {
            self.stats
                .upstream_error(method, &format!("answered {status}"));
            return;
        }
        if !matches!(status, StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED) {
            return;
        }
        let since = self
            .stats
            .upstream_denied(method, status, self.started.elapsed());
        if let Some(count) = since {
            tracing::warn!(
                tier = self.tier,
                %method,
                %status,
                refusals = count,
                "S3 gateway: the object store refuses the real credentials ({}; {count} refusals since the last warning): they were revoked or rotated, or lack a permission; LMCache gets the 403 and stores nothing on this tier until they are fixed",
                self.place,
            );
        }
    }
}

/// The upstream answer of a multipart complete, owned.
type Answer = Pin<Box<dyn Future<Output = Result<Response<Incoming>, client::SendError>> + Send>>;

/// The gateway's own `200` to a multipart complete the store has not
/// answered within [`UPSTREAM_SILENCE`] ([`COMPLETE_SILENCE`]): an XML
/// declaration, a space every [`COMPLETE_KEEP_ALIVE`] while `answer` comes
/// and its body is read, then that body without its declaration and
/// leading spaces: the `CompleteMultipartUploadResult`, or the store's
/// `<Error>` (S3's answer to a complete that fails after its `200`). No
/// answer, or one cut off, ends the body with an `InternalError`, which S3
/// clients retry.
fn kept_alive(counting: Counting, method: Method, answer: Answer) -> Response<Body> {
    let (sender, mut receiver) = tokio::sync::mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        if sender
            .send(Bytes::from_static(XML_DECLARATION.as_bytes()))
            .await
            .is_err()
        {
            return;
        }
        let outcome = async {
            let response = answer.await.map_err(|e| error_chain(&e))?;
            counting.status(&method, response.status());
            let body = response.into_body();
            read_whole(body, COMPLETE_SILENCE, MAX_COMPLETE_BYTES)
                .await
                .map_err(|e| e.to_string())
        };
        let Some(outcome) = with_spaces(outcome, &sender).await else {
            return;
        };
        let tail = match outcome {
            Ok(text) => without_declaration(&text).to_string(),
            Err(cause) => {
                counting.stats.upstream_error(&method, &cause);
                tracing::warn!(tier = counting.tier, %method, "S3 gateway: a multipart complete kept alive failed: {cause}");
                format!("<Error><Code>InternalError</Code><Message>the upstream object store did not complete the upload: {}</Message></Error>", xml_escape(&cause))
            }
        };
        let _ = sender.send(Bytes::from(tail)).await;
    });
    let frames = futures_util::stream::poll_fn(move |cx| {
        receiver
            .poll_recv(cx)
            .map(|chunk| chunk.map(|data| Ok::<_, BoxError>(Frame::data(data))))
    });
    let mut response = Response::new(StreamBody::new(frames).boxed_unsync());
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    response
}

/// Awaits `work`, sending a space on `sender` every [`COMPLETE_KEEP_ALIVE`]
/// meanwhile; `None` once the receiver is gone (LMCache hung up).
async fn with_spaces<T>(
    work: impl Future<Output = T>,
    sender: &tokio::sync::mpsc::Sender<Bytes>,
) -> Option<T> {
    let mut work = std::pin::pin!(work);
    loop {
        match tokio::time::timeout(COMPLETE_KEEP_ALIVE, work.as_mut()).await {
            Ok(done) => return Some(done),
            Err(_) => sender.send(Bytes::from_static(b" ")).await.ok()?,
        }
    }
}

/// `text` without leading whitespace and an XML declaration, which the
/// kept-alive answer has sent already.
fn without_declaration(text: &str) -> &str {
    let text = text.trim_start();
    let text = match text.strip_prefix("<?xml") {
        Some(rest) => rest.split_once("?>").map_or(text, |(_, after)| after),
        None => text,
    };
    text.trim_start()
}

/// A body read whole as text, each piece within `silence` of the last, at
/// most `limit` bytes.
async fn read_whole(
    body: Incoming,
    silence: Duration,
    limit: usize,
) -> Result<String, ListingError> {
    let mut stream = std::pin::pin!(stalling(body, silence));
    let mut text = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(ListingError::Cut)?;
        if text.len() + chunk.len() > limit {
            return Err(ListingError::TooLarge);
        }
        text.extend_from_slice(&chunk);
    }
    String::from_utf8(text).map_err(|_| ListingError::NotUtf8)
}

/// The request body LMCache sent, as the upstream gets it: in chunks of at
/// least [`FORWARD_CHUNK`] bytes ([`coalesce`]), counted in `stats`. Each
/// piece read from LMCache moves `progress`: the upstream takes the body
/// as fast as it reads, so a stalled upstream stops the reading. `upload`
/// follows whether the reading waits on LMCache.
fn upstream_body(body: Incoming, stats: Arc<Stats>, progress: Progress, upload: Upload) -> Body {
    if body.is_end_stream() {
        return client::empty();
    }
    let mut data = BodyDataStream::new(body);
    let watched = futures_util::stream::poll_fn(move |cx| {
        let polled = data.poll_next_unpin(cx);
        upload.saw(&polled);
        polled
    });
    let pieces = watched.inspect(move |_| progress.moved());
    let chunks = coalesce(pieces).map(move |chunk| match chunk {
        Ok(data) => {
            stats.sent(data.len());
            Ok(Frame::data(data))
        }
        Err(e) => Err(Box::new(e) as BoxError),
    });
    StreamBody::new(chunks).boxed_unsync()
}

/// The upstream's response head (hop-by-hop headers dropped, and
/// `Content-Length` when the body is rewritten).
fn response_head(response: &Response<Incoming>, rewritten: bool) -> http::response::Builder {
    let mut out = Response::builder().status(response.status());
    for (name, value) in response.headers() {
        let skip = HOP_BY_HOP.contains(&name.as_str())
            || (rewritten && name == http::header::CONTENT_LENGTH);
        if !skip {
            out = out.header(name, value);
        }
    }
    out
}

/// How long an exchange for `route` may make no progress: [`COMPLETE_SILENCE`]
/// for a multipart complete, [`UPSTREAM_SILENCE`] for every other request.
fn silence_bound(method: &Method, route: &Route) -> Duration {
    if is_complete(method, route) {
        COMPLETE_SILENCE
    } else {
        UPSTREAM_SILENCE
    }
}

/// Whether `method` on `route` is a multipart complete
/// (`POST /<key>?uploadId=...`).
fn is_complete(method: &Method, route: &Route) -> bool {
    *method == Method::POST
        && !route.listing
        && route
            .query
            .split('&')
            .any(|p| p.split('=').next() == Some("uploadId"))
}

/// The upstream's response passed back as it streams in, counted in
/// `stats`; an answer that breaks off or stays silent for `silence`
/// is cut off (the client sees a short body), logged, and counted as an
/// upstream error of `method` on tier `tier`.
fn streamed_back(
    response: Response<Incoming>,
    stats: Arc<Stats>,
    method: Method,
    tier: usize,
    silence: Duration,
) -> Result<Response<Body>, ForwardError> {
    let head = response_head(&response, false);
    let frames = stalling(response.into_body(), silence).map(move |chunk| match chunk {
        Ok(data) => {
            stats.received(data.len());
            Ok(Frame::data(data))
        }
        Err(cause) => {
            tracing::warn!(tier, %method, "S3 gateway cut off an answer: {cause}");
            stats.upstream_error(&method, &cause.to_string());
            Err(BoxError::from(cause))
        }
    });
    finish(head, StreamBody::new(frames).boxed_unsync())
}

/// A ListObjectsV2 answer read whole (at most [`MAX_LISTING_BYTES`]) and
/// passed back with `key_prefix` stripped from its keys and prefixes.
async fn listing_back(
    response: Response<Incoming>,
    key_prefix: &str,
    stats: &Stats,
    method: &Method,
) -> Result<Response<Body>, ForwardError> {
    let head = response_head(&response, true);
    let text = read_listing(response.into_body()).await.map_err(|e| {
        stats.upstream_error(method, &e.to_string());
        ForwardError::Listing(e)
    })?;
    stats.received(text.len());
    let stripped = strip_prefix(&text, key_prefix);
    let head = head.header(http::header::CONTENT_LENGTH, stripped.len());
    finish(head, full(stripped))
}

fn finish(head: http::response::Builder, body: Body) -> Result<Response<Body>, ForwardError> {
    head.body(body).map_err(ForwardError::Response)
}

/// Why an upload ended by its own client's doing ([`Upload::fault`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClientFault {
    /// The client sent no byte of the body for [`UPSTREAM_SILENCE`] while
    /// the upstream waited for one.
    #[error("it sent no byte of the request body for {} s while the upstream waited for one", .0.as_secs())]
    Stalled(
        /// [`UPSTREAM_SILENCE`].
        Duration,
    ),
    /// The client's body broke off (its connection closed or failed before
    /// the body was whole).
    #[error("its request body broke off: {0}")]
    BrokeOff(
        /// The cause chain.
        String,
    ),
}

/// What the client's side of one request body did, to tell whose silence
/// or failure ended an exchange. The upstream's client reads the body only
/// when it can send more, so a read that waits on the client means the
/// upstream was ready for bytes the client did not send; a stalled
/// upstream instead stops the reading with the last read answered.
#[derive(Clone, Default)]
struct Upload(Arc<UploadState>);

#[derive(Default)]
struct UploadState {
    /// The last read of the body waits for the client.
    waiting: AtomicBool,
    /// Why the body broke off, if it did.
    broke: std::sync::Mutex<Option<String>>,
}

impl Upload {
    /// Records what a read of the body gave.
    fn saw(&self, polled: &Poll<Option<Result<Bytes, hyper::Error>>>) {
        self.0.waiting.store(polled.is_pending(), Ordering::Relaxed);
        if let Poll::Ready(Some(Err(e))) = polled {
            if let Ok(mut broke) = self.0.broke.lock() {
                *broke = Some(error_chain(e));
            }
        }
    }

    /// The client's fault in an exchange that got no answer: its body broke
    /// off, or the upstream was waiting on it; `None` when the upstream was
    /// the one that stopped.
    fn fault(&self) -> Option<ClientFault> {
        let broke = self.0.broke.lock().ok().and_then(|b| b.clone());
        match broke {
            Some(cause) => Some(ClientFault::BrokeOff(cause)),
            None if self.0.waiting.load(Ordering::Relaxed) => {
                Some(ClientFault::Stalled(UPSTREAM_SILENCE))
            }
            None => None,
        }
    }
}

/// Why an upstream answer's body ended early.
#[derive(Debug, thiserror::Error)]
enum BodyCut {
    /// The connection broke.
    #[error("the answer broke off: {0}")]
    BrokeOff(
        /// The cause chain, with no path or query.
        String,
    ),
    /// No data came for the exchange's bound ([`UPSTREAM_SILENCE`], or
    /// [`COMPLETE_SILENCE`] for a multipart complete).
    #[error("the answer stalled for {} s", .0.as_secs())]
    Stalled(
        /// The bound.
        Duration,
    ),
}

/// Why an answer read whole (a listing page, a kept-alive complete's
/// result; [`read_whole`]) could not be.
#[derive(Debug, thiserror::Error)]
enum ListingError {
    /// Its body ended early.
    #[error("the answer: {0}")]
    Cut(
        /// How.
        BodyCut,
    ),
    /// It is larger than [`MAX_LISTING_BYTES`].
    #[error("the answer is larger than the gateway reads whole (16 MiB for a listing page, 1 MiB for a complete)")]
    TooLarge,
    /// It is not UTF-8 text.
    #[error("the answer is not UTF-8")]
    NotUtf8,
}

/// The data of a response body; an error (the cause, with no path or query)
/// when it breaks off or stays silent for `silence`, then the end.
///
/// One timer per body, armed at the last frame's time + `silence` and
/// moved on only when it fires early: a frame costs a clock read, not a
/// timer.
fn stalling(
    body: Incoming,
    silence: Duration,
) -> impl futures_util::Stream<Item = Result<Bytes, BodyCut>> {
    let mut body = Some(body);
    let mut last_frame = tokio::time::Instant::now();
    let mut timer = Box::pin(tokio::time::sleep_until(last_frame + silence));
    futures_util::stream::poll_fn(move |cx| {
        let Some(incoming) = body.as_mut() else {
            return Poll::Ready(None);
        };
        let outcome = 'frames: loop {
            match Pin::new(&mut *incoming).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    last_frame = tokio::time::Instant::now();
                    if let Ok(data) = frame.into_data() {
                        return Poll::Ready(Some(Ok(data)));
                    }
                }
                Poll::Ready(Some(Err(e))) => break Some(Err(BodyCut::BrokeOff(error_chain(&e)))),
                Poll::Ready(None) => break None,
                Poll::Pending => {
                    while timer.as_mut().poll(cx).is_ready() {
                        if last_frame.elapsed() >= silence {
                            break 'frames Some(Err(BodyCut::Stalled(silence)));
                        }
                        timer.as_mut().reset(last_frame + silence);
                    }
                    return Poll::Pending;
                }
            }
        };
        body = None;
        Poll::Ready(outcome)
    })
}

/// The request body as a stream of chunks of at least [`FORWARD_CHUNK`]
/// bytes (the last may be shorter): fewer, larger writes to the upstream.
fn coalesce<S>(pieces: S) -> impl futures_util::Stream<Item = Result<Bytes, hyper::Error>>
where
    S: futures_util::Stream<Item = Result<Bytes, hyper::Error>> + Unpin,
{
    futures_util::stream::unfold(Some(pieces), |state| async move {
        let mut stream = state?;
        let mut buffer = bytes::BytesMut::new();
        loop {
            match stream.next().await {
                Some(Ok(chunk)) if buffer.is_empty() && chunk.len() >= FORWARD_CHUNK => {
                    return Some((Ok(chunk), Some(stream)))
                }
                Some(Ok(chunk)) => {
                    buffer.extend_from_slice(&chunk);
                    if buffer.len() >= FORWARD_CHUNK {
                        return Some((Ok(buffer.freeze()), Some(stream)));
                    }
                }
                Some(Err(e)) => return Some((Err(e), None)),
                None if buffer.is_empty() => return None,
                None => return Some((Ok(buffer.freeze()), None)),
            }
        }
    })
}

/// Removes `key_prefix` from the keys, prefixes and start-after of a
/// ListObjectsV2 result (the prefix has no XML-escaped characters).
fn strip_prefix(xml: &str, key_prefix: &str) -> String {
    ["Key", "Prefix", "StartAfter"]
        .iter()
        .fold(xml.to_string(), |text, tag| {
            text.replace(&format!("<{tag}>{key_prefix}"), &format!("<{tag}>"))
        })
}

/// A listing answer's body, whole, as text.
async fn read_listing(body: Incoming) -> Result<String, ListingError> {
    read_whole(body, UPSTREAM_SILENCE, MAX_LISTING_BYTES).await
}

fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// `text` with `&`, `<` and `>` escaped for XML.
fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The answer of [`STATE_PATH`]: the gateway's state as JSON.
fn state_response(stats: &Stats) -> Response<Body> {
    let json = serde_json::to_vec(&stats.snapshot()).unwrap_or_default();
    let mut response = Response::new(full(json));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// An S3 XML error response of the gateway's own.
fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let message = xml_escape(message);
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message><Resource>lmcache-tier S3 gateway</Resource></Error>"
    );
    let mut response = Response::new(full(xml));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_answers_lose_the_key_prefix() {
        let xml =
            "<Prefix>p/</Prefix><Contents><Key>p/a@1</Key></Contents><StartAfter>p/a</StartAfter>";
        assert_eq!(
            strip_prefix(xml, "p/"),
            "<Prefix></Prefix><Contents><Key>a@1</Key></Contents><StartAfter>a</StartAfter>"
        );
    }

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
    fn only_multipart_completes_get_the_longer_silence_bound() {
        let route = |query: &str| Route {
            path: "/b/m@1".into(),
            query: query.into(),
            listing: false,
        };
        assert_eq!(
            silence_bound(&Method::POST, &route("uploadId=a%2Fb")),
            COMPLETE_SILENCE
        );
        assert_eq!(
            silence_bound(&Method::POST, &route("uploads")),
            UPSTREAM_SILENCE
        );
        let part = route("partNumber=1&uploadId=a");
        assert_eq!(silence_bound(&Method::PUT, &part), UPSTREAM_SILENCE);
        assert_eq!(
            silence_bound(&Method::DELETE, &route("uploadId=a")),
            UPSTREAM_SILENCE
        );
    }

    #[test]
    fn a_kept_alive_complete_drops_the_stores_own_declaration() {
        let swift = "<?xml version='1.0' encoding='UTF-8'?>\n<CompleteMultipartUploadResult/>";
        assert_eq!(
            without_declaration(swift),
            "<CompleteMultipartUploadResult/>"
        );
        let spaced = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n   \n<Error><Code>InvalidPart</Code></Error>";
        assert_eq!(
            without_declaration(spaced),
            "<Error><Code>InvalidPart</Code></Error>"
        );
        assert_eq!(without_declaration("  <Error/>"), "<Error/>");
    }

    #[test]
    fn swift_keys_are_account_colon_user() {
        assert!(swift_account_key("kv:node"));
        assert!(!swift_account_key("AKIAIOSFODNN7EXAMPLE"));
        assert!(!swift_account_key(":node"));
    }

    #[test]
    fn gateway_errors_are_s3_xml() {
        let r = error(StatusCode::FORBIDDEN, "SignatureDoesNotMatch", "a <b>");
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert_eq!(r.headers()[http::header::CONTENT_TYPE], "application/xml");
    }
}
