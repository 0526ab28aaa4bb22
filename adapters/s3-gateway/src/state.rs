//! What a gateway says about itself: counters kept while it serves, and the
//! JSON it answers on [`STATE_PATH`] for `lmcache-tier inspect`.
//!
//! The route takes an unsigned `GET`: `inspect` holds no key, and the state
//! carries nothing secret (no credential, no header, no query string), only
//! what the operator's spec names: bucket, key prefix, upstream host, region.
//! The gateway listens on 127.0.0.1 only, so only local processes can ask.
//!
//! [`STATE_PATH`] never collides with an object: every key LMCache's S3
//! adapter writes has the form `<model>@<kv_rank>@<group>@<hash>[@<salt>]`
//! (LMCache 0.5.6; `fixtures/lmcache-0.5.6/`), so its path holds a `@`
//! (`%40`), and this one holds none.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use http::Method;
use serde::{Deserialize, Serialize};

use super::spec::BucketTier;
use lmcache_tier_spec::redact_endpoint;

/// The path on which a gateway answers `GET` with its [`GatewayState`].
pub const STATE_PATH: &str = "/.well-known/erebine-s3-gateway";

/// One gateway's identity and counters since it started (the JSON of
/// [`STATE_PATH`]; fields are added, never renamed or removed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayState {
    /// The tier's 0-based position in the cascade.
    pub tier: usize,
    /// The bucket (`s3_bucket`).
    pub bucket: String,
    /// The key prefix inside the bucket (`s3_key_prefix`), `""` for none.
    pub key_prefix: String,
    /// The tag of the cache identity LMCache's objects are kept under
    /// (`cache_identity`: `<key_prefix>cache-identity-<tag>/`); `None`:
    /// directly under the key prefix.
    #[serde(default)]
    pub cache_identity: Option<String>,
    /// The upstream as `<scheme>://<host>[:port]`, without user info or query.
    pub upstream: String,
    /// The SigV4 region (`s3_region`).
    pub region: String,
    /// Where the real credentials came from: `spec` (the tier's own
    /// `aws_access_key_id`) or `aws_default_chain` (the launcher's AWS
    /// default credential chain). Never the key itself.
    pub credential_source: String,
    /// When the gateway started, RFC 3339 UTC.
    pub started_at: String,
    /// Requests LMCache sent that passed the signature check, by method
    /// (the state route and refused requests not counted).
    pub requests: RequestCounts,
    /// Requests refused with 403 (bad or missing signature, unknown key).
    pub rejected: u64,
    /// Upstream answers with a 5xx status, and answers that broke off.
    pub upstream_errors: u64,
    /// Requests the upstream did not answer at all (the gateway said 503).
    pub upstream_unreachable: u64,
    /// Request body bytes forwarded to the upstream.
    pub bytes_up: u64,
    /// Response body bytes received from the upstream.
    pub bytes_down: u64,
    /// The last upstream error or unreachable request, if any.
    pub last_upstream_error: Option<UpstreamError>,
    /// The gateway's answers to LMCache, by status class.
    #[serde(default)]
    pub answers: StatusClasses,
    /// The 403 refusals ([`GatewayState::rejected`]) by reason.
    #[serde(default)]
    pub rejected_by_reason: Rejections,
    /// Seconds from a request's arrival to the gateway's answer's headers
    /// (a streamed body goes on after), as a histogram.
    #[serde(default)]
    pub answer_seconds: Histogram,
    /// When the real credentials in use expire, Unix seconds; `None` for
    /// credentials that do not expire (static keys).
    #[serde(default)]
    pub credential_expiry_unix: Option<u64>,
    /// Requests refused with 403 `AccessDenied` because their connection
    /// does not come from the LMCache server's uid, or its owner could not
    /// be found (`docs/s3-gateway.md`, "Who may use the gateway"); not
    /// counted in [`GatewayState::requests`] or [`GatewayState::rejected`].
    #[serde(default)]
    pub peer_refused: u64,
    /// Uploads that their own client (LMCache) ended: it stopped sending
    /// the body, or the body broke off, while the upstream waited for it.
    /// Answered 400 by the gateway, and counted neither in
    /// [`GatewayState::upstream_unreachable`] nor in
    /// [`GatewayState::last_upstream_error`]: the object store did nothing
    /// wrong.
    #[serde(default)]
    pub client_upload_failures: ClientUploadFailures,
    /// Upstream answers 401 or 403 to LMCache's requests: the store refused
    /// the real credentials while the gateway ran (revoked, rotated, or
    /// without the permission a request needs), passed back to LMCache as
    /// they are; counted apart from [`GatewayState::upstream_errors`]
    /// (`docs/s3-gateway.md`, "Credentials refused while running").
    #[serde(default)]
    pub upstream_denied: u64,
    /// The last of those, if any (method, upstream host and status).
    #[serde(default)]
    pub last_upstream_denied: Option<UpstreamError>,
    /// The bucket bound's figures; `None` for a tier without
    /// `max_capacity_gb` (`docs/s3-gateway.md`, "The bucket bound").
    #[serde(default)]
    pub bucket_bound: Option<crate::fleet::figures::BoundState>,
}

/// Uploads ended by their own client, by how.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientUploadFailures {
    /// It sent no byte of the body for [`crate::UPSTREAM_SILENCE`] (5 s)
    /// while the upstream waited for one (answered 400 `RequestTimeout`).
    pub stalled: u64,
    /// Its body broke off (answered 400 `IncompleteBody`, if the client is
    /// still there to read it).
    pub broke_off: u64,
}

/// Answers by HTTP status class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusClasses {
    /// 2xx.
    pub success: u64,
    /// 3xx.
    pub redirection: u64,
    /// 4xx.
    pub client_error: u64,
    /// 5xx.
    pub server_error: u64,
    /// Any other status.
    pub other: u64,
}

/// 403 refusals by reason ([`crate::sigv4::Rejection`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejections {
    /// No `Authorization` header, or not in the SigV4 form.
    pub malformed: u64,
    /// Signed with another access key id.
    pub unknown_key: u64,
    /// Another region or service in the credential scope.
    pub scope: u64,
    /// `x-amz-date` missing, malformed or too far from the gateway's clock.
    pub time: u64,
    /// The signature does not match.
    pub signature: u64,
}

/// The upper bounds, in seconds, of [`Histogram`]'s buckets (the last,
/// `+Inf`, is implied).
pub const ANSWER_SECONDS_BOUNDS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A histogram of durations: cumulative counts per upper bound, as
/// Prometheus takes them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// Upper bounds in seconds ([`ANSWER_SECONDS_BOUNDS`]).
    pub bounds: Vec<f64>,
    /// Observations at or below each bound, cumulative.
    pub cumulative: Vec<u64>,
    /// Sum of all observations, seconds.
    pub sum: f64,
    /// All observations.
    pub count: u64,
}

/// The sum is a sum of durations, never NaN.
impl Eq for Histogram {}

/// Requests by method.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCounts {
    /// `HEAD` (lookups).
    pub head: u64,
    /// `GET` (loads and listings).
    pub get: u64,
    /// `PUT` (stores and multipart parts).
    pub put: u64,
    /// `POST` (multipart create and complete).
    pub post: u64,
    /// `DELETE`.
    pub delete: u64,
    /// Any other method.
    pub other: u64,
}

/// One upstream failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamError {
    /// When, RFC 3339 UTC.
    pub at: String,
    /// Method, upstream host and cause, e.g. `PUT http://10.0.0.5:9000:
    /// error sending request: connection refused`; no path or query.
    pub message: String,
}

/// The largest gateway state read: a gateway's is under 2 KiB.
const STATE_MAX_BYTES: usize = 64 << 10;

/// Why nothing answered on a gateway's address ([`fetch`]): the gateway, or
/// whatever should listen there, is down. Causes never carry the URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The HTTP client could not be made.
    #[error("cannot make an HTTP client: {0}")]
    Client(
        /// reqwest's reason.
        String,
    ),
    /// Nothing answered within the time limit.
    #[error("no answer within {} ms", .0.as_millis())]
    TimedOut(
        /// The time limit.
        Duration,
    ),
    /// The connection was refused or broke.
    #[error("{0}")]
    NoAnswer(
        /// The cause chain, e.g. `error sending request: ... Connection refused`.
        String,
    ),
}

/// Asks the gateway that may listen on `addr` for its state: `Ok(Some)`
/// from a gateway of ours; `Ok(None)` when something else answers (not a
/// 200 with a [`GatewayState`]).
///
/// # Errors
/// [`FetchError`]: nothing answers within `timeout` (refused, reset,
/// silent), with the cause, for the operator (the gateway, or whatever
/// should listen there, is down).
pub async fn fetch(
    addr: SocketAddr,
    timeout: Duration,
) -> Result<Option<GatewayState>, FetchError> {
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| FetchError::Client(e.to_string()))?;
    let response = client
        .get(format!("http://{addr}{STATE_PATH}"))
        .send()
        .await
        .map_err(|e| {
            if e.is_timeout() {
                FetchError::TimedOut(timeout)
            } else {
                FetchError::NoAnswer(lmcache_tier_spec::error_chain(&e.without_url()))
            }
        })?;
    if response.status() != reqwest::StatusCode::OK {
        return Ok(None);
    }
    let Ok(body) = crate::capped_body(response, STATE_MAX_BYTES).await else {
        return Ok(None);
    };
    let Ok(mut state) = serde_json::from_slice::<GatewayState>(&body) else {
        return Ok(None);
    };
    // Whatever answers on that port is not trusted to have redacted it.
    state.upstream = redact_endpoint(&state.upstream);
    Ok(Some(state))
}

/// The live counters of one gateway.
pub(crate) struct Stats {
    identity: GatewayState,
    requests: [AtomicU64; 6],
    rejected: AtomicU64,
    upstream_errors: AtomicU64,
    upstream_unreachable: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    last_upstream_error: Mutex<Option<UpstreamError>>,
    answers: [AtomicU64; 5],
    rejections: [AtomicU64; 5],
    /// Per bucket (not cumulative), the last one `+Inf`.
    answer_buckets: [AtomicU64; ANSWER_SECONDS_BOUNDS.len() + 1],
    answer_micros: AtomicU64,
    credential_expiry_unix: AtomicU64,
    peer_refused: AtomicU64,
    /// [`ClientUploadFailures`]: stalled, broke off.
    client_faults: [AtomicU64; 2],
    /// The bound's figures as last published, and until when (if at all)
    /// their `evictor` stays true: a holder's right to delete lapses with
    /// time, also while its tasks do not run (a stopped process).
    bucket_bound: Mutex<Option<(crate::fleet::figures::BoundState, Option<Instant>)>>,
    upstream_denied: AtomicU64,
    last_upstream_denied: Mutex<Option<UpstreamError>>,
    /// [`Stats::upstream_denied`]'s count at its last warning, and when
    /// (milliseconds after the gateway started; `u64::MAX` before any).
    denied_warned: Mutex<(u64, u64)>,
}

/// How often the gateway warns about credentials the store refuses.
pub(crate) const DENIED_WARNING_EVERY: Duration = Duration::from_secs(60);

impl Stats {
    /// Zeroed counters for `tier`, started now; the credential source is
    /// set by [`Stats::with_credential_source`] once it is known.
    pub(crate) fn new(tier: &BucketTier) -> Self {
        Stats {
            identity: GatewayState {
                tier: tier.position,
                bucket: tier.bucket.clone(),
                key_prefix: tier.key_prefix.clone(),
                cache_identity: tier.cache_identity.clone(),
                upstream: redact_endpoint(&format!("{}://{}", tier.scheme, tier.endpoint)),
                region: tier.region.clone(),
                credential_source: String::new(),
                started_at: now(),
                requests: RequestCounts::default(),
                rejected: 0,
                upstream_errors: 0,
                upstream_unreachable: 0,
                bytes_up: 0,
                bytes_down: 0,
                last_upstream_error: None,
                answers: StatusClasses::default(),
                rejected_by_reason: Rejections::default(),
                answer_seconds: Histogram::default(),
                credential_expiry_unix: None,
                peer_refused: 0,
                client_upload_failures: ClientUploadFailures::default(),
                bucket_bound: None,
                upstream_denied: 0,
                last_upstream_denied: None,
            },
            requests: Default::default(),
            rejected: AtomicU64::new(0),
            upstream_errors: AtomicU64::new(0),
            upstream_unreachable: AtomicU64::new(0),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
            last_upstream_error: Mutex::new(None),
            answers: Default::default(),
            rejections: Default::default(),
            answer_buckets: Default::default(),
            answer_micros: AtomicU64::new(0),
            credential_expiry_unix: AtomicU64::new(0),
            peer_refused: AtomicU64::new(0),
            client_faults: Default::default(),
            bucket_bound: Mutex::new(None),
            upstream_denied: AtomicU64::new(0),
            last_upstream_denied: Mutex::new(None),
            denied_warned: Mutex::new((0, u64::MAX)),
        }
    }

    /// Records the bucket bound's figures as of now; their `evictor`
    /// reads false from `evictor_until` on (the lease's hold lapsing
    /// before the bound's task wakes to publish it).
    pub(crate) fn set_bound(
        &self,
        figures: crate::fleet::figures::BoundState,
        evictor_until: Option<Instant>,
    ) {
        if let Ok(mut slot) = self.bucket_bound.lock() {
            *slot = Some((figures, evictor_until));
        }
    }

    /// The bucket bound's figures as they stand now.
    fn bound_now(&self) -> Option<crate::fleet::figures::BoundState> {
        let slot = self.bucket_bound.lock().ok()?;
        let (figures, until) = slot.as_ref()?;
        let mut figures = figures.clone();
        if until.is_some_and(|until| Instant::now() >= until) {
            figures.evictor = false;
        }
        Some(figures)
    }

    /// The same counters, reporting `source` (where the start-up check got
    /// the real credentials, e.g. `the tier's aws_access_key_id` or
    /// `profile`; never a key) as the credential source.
    pub(crate) fn with_credential_source(mut self, source: &str) -> Self {
        self.identity.credential_source = source.to_string();
        self
    }

    /// Counts a request from LMCache.
    pub(crate) fn request(&self, method: &Method) {
        let slot = match *method {
            Method::HEAD => 0,
            Method::GET => 1,
            Method::PUT => 2,
            Method::POST => 3,
            Method::DELETE => 4,
            _ => 5,
        };
        self.requests[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request refused with 403, for `why`.
    pub(crate) fn rejected(&self, why: &crate::sigv4::Rejection) {
        use crate::sigv4::Rejection;
        self.rejected.fetch_add(1, Ordering::Relaxed);
        let slot = match why {
            Rejection::Malformed => 0,
            Rejection::UnknownKey => 1,
            Rejection::Scope(_) => 2,
            Rejection::Time => 3,
            Rejection::Signature => 4,
        };
        self.rejections[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request refused because of the connection it came on
    /// (another uid than the LMCache server's, or no owner found).
    pub(crate) fn peer_refused(&self) {
        self.peer_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the gateway's answer with `status`, `took` after the request
    /// arrived.
    pub(crate) fn answered(&self, status: http::StatusCode, took: Duration) {
        let class = match status.as_u16() / 100 {
            2 => 0,
            3 => 1,
            4 => 2,
            5 => 3,
            _ => 4,
        };
        self.answers[class].fetch_add(1, Ordering::Relaxed);
        let seconds = took.as_secs_f64();
        let bucket = ANSWER_SECONDS_BOUNDS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(ANSWER_SECONDS_BOUNDS.len());
        self.answer_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.answer_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Records when the real credentials in use expire (`None`: never).
    pub(crate) fn credentials_expire(&self, at: Option<SystemTime>) {
        let unix = at
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs().max(1));
        self.credential_expiry_unix.store(unix, Ordering::Relaxed);
    }

    /// Counts a 5xx answer or a broken-off answer of the upstream; `cause`
    /// must not hold a path or query.
    pub(crate) fn upstream_error(&self, method: &Method, cause: &str) {
        self.upstream_errors.fetch_add(1, Ordering::Relaxed);
        self.remember(method, cause);
    }

    /// Counts a request the upstream did not answer; `cause` must not hold
    /// a path or query.
    pub(crate) fn unreachable(&self, method: &Method, cause: &str) {
        self.upstream_unreachable.fetch_add(1, Ordering::Relaxed);
        self.remember(method, cause);
    }

    /// Counts an upload its own client ended (`fault`); the upstream's
    /// counters and last error are left alone.
    pub(crate) fn client_fault(&self, fault: &crate::client_fault::ClientFault) {
        let slot = match fault {
            crate::client_fault::ClientFault::Stalled(_) => 0,
            crate::client_fault::ClientFault::BrokeOff(_) => 1,
        };
        self.client_faults[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts request body bytes sent upstream.
    pub(crate) fn sent(&self, bytes: usize) {
        self.bytes_up.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts response body bytes received from upstream.
    pub(crate) fn received(&self, bytes: usize) {
        self.bytes_down.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts an upstream answer 401 or 403 (`status`) to `method`, at
    /// `elapsed` after the gateway started. Returns the refusals since the
    /// last warning when one is due: the first, then at most one every
    /// [`DENIED_WARNING_EVERY`].
    pub(crate) fn upstream_denied(
        &self,
        method: &Method,
        status: http::StatusCode,
        elapsed: Duration,
    ) -> Option<u64> {
        let total = self.upstream_denied.fetch_add(1, Ordering::Relaxed) + 1;
        let denied = UpstreamError {
            at: now(),
            message: format!("{method} {}: answered {status}", self.identity.upstream),
        };
        if let Ok(mut last) = self.last_upstream_denied.lock() {
            *last = Some(denied);
        }
        let now_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        let mut warned = self.denied_warned.lock().ok()?;
        let (count_then, at) = *warned;
        let due =
            at == u64::MAX || now_ms.saturating_sub(at) >= DENIED_WARNING_EVERY.as_millis() as u64;
        due.then(|| {
            *warned = (total, now_ms);
            total - count_then
        })
    }

    fn remember(&self, method: &Method, cause: &str) {
        let error = UpstreamError {
            at: now(),
            message: format!("{method} {}: {cause}", self.identity.upstream),
        };
        if let Ok(mut last) = self.last_upstream_error.lock() {
            *last = Some(error);
        }
    }

    /// The state as of now.
    pub(crate) fn snapshot(&self) -> GatewayState {
        let count = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let [head, get, put, post, delete, other] = self.requests.each_ref().map(count);
        GatewayState {
            requests: RequestCounts {
                head,
                get,
                put,
                post,
                delete,
                other,
            },
            rejected: count(&self.rejected),
            upstream_errors: count(&self.upstream_errors),
            upstream_unreachable: count(&self.upstream_unreachable),
            bytes_up: count(&self.bytes_up),
            bytes_down: count(&self.bytes_down),
            last_upstream_error: self
                .last_upstream_error
                .lock()
                .ok()
                .and_then(|last| last.clone()),
            answers: {
                let [success, redirection, client_error, server_error, other] =
                    self.answers.each_ref().map(count);
                StatusClasses {
                    success,
                    redirection,
                    client_error,
                    server_error,
                    other,
                }
            },
            rejected_by_reason: {
                let [malformed, unknown_key, scope, time, signature] =
                    self.rejections.each_ref().map(count);
                Rejections {
                    malformed,
                    unknown_key,
                    scope,
                    time,
                    signature,
                }
            },
            answer_seconds: self.histogram(),
            credential_expiry_unix: Some(count(&self.credential_expiry_unix)).filter(|t| *t > 0),
            peer_refused: count(&self.peer_refused),
            client_upload_failures: {
                let [stalled, broke_off] = self.client_faults.each_ref().map(count);
                ClientUploadFailures { stalled, broke_off }
            },
            bucket_bound: self.bound_now(),
            upstream_denied: count(&self.upstream_denied),
            last_upstream_denied: self
                .last_upstream_denied
                .lock()
                .ok()
                .and_then(|l| l.clone()),
            ..self.identity.clone()
        }
    }

    fn histogram(&self) -> Histogram {
        let mut running = 0;
        let per_bucket: Vec<u64> = self
            .answer_buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let cumulative: Vec<u64> = per_bucket[..ANSWER_SECONDS_BOUNDS.len()]
            .iter()
            .map(|n| {
                running += n;
                running
            })
            .collect();
        Histogram {
            bounds: ANSWER_SECONDS_BOUNDS.to_vec(),
            cumulative,
            sum: self.answer_micros.load(Ordering::Relaxed) as f64 / 1e6,
            count: per_bucket.iter().sum(),
        }
    }
}

fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::CredentialSource;
    use crate::sigv4::KeyPair;

    fn tier() -> BucketTier {
        BucketTier {
            position: 1,
            endpoint: "10.0.0.5:9000".into(),
            scheme: "http",
            bucket: "kv-cache".into(),
            key_prefix: "node-a/".into(),
            cache_identity: None,
            region: "us-east-1".into(),
            ca_bundle_pem: None,
            credentials: CredentialSource::Spec(KeyPair {
                access_key_id: "AKIAREALKEYID".into(),
                secret_access_key: "REAL-SECRET".into(),
                session_token: Some("REAL-TOKEN".into()),
            }),
        }
    }

    #[test]
    fn a_published_evictor_lapses_at_its_deadline_without_a_new_publication() {
        use crate::fleet::figures::BoundState;
        use crate::fleet::rule::{BoundRole, BoundSpec};
        use crate::fleet::Mode;
        let stats = Stats::new(&tier());
        let mut figures = BoundState::new(
            BoundSpec::new(1 << 30, 0.8, 0.2, BoundRole::Evictor),
            Mode::Lease,
            "node".into(),
        );
        figures.evictor = true;
        let evictor = |stats: &Stats| stats.snapshot().bucket_bound.map(|b| b.evictor);
        let later = Instant::now() + Duration::from_secs(3600);
        stats.set_bound(figures.clone(), Some(later));
        assert_eq!(evictor(&stats), Some(true), "before its deadline");
        stats.set_bound(figures.clone(), Some(Instant::now()));
        assert_eq!(evictor(&stats), Some(false), "from its deadline on");
        stats.set_bound(figures, None);
        assert_eq!(evictor(&stats), Some(true), "without a lease, no deadline");
    }

    #[test]
    fn refused_credentials_are_counted_apart_and_warned_about_once_a_minute() {
        let stats = Stats::new(&tier());
        let at = Duration::from_secs;
        let forbidden = http::StatusCode::FORBIDDEN;
        assert_eq!(
            stats.upstream_denied(&Method::PUT, forbidden, at(1)),
            Some(1)
        );
        assert_eq!(stats.upstream_denied(&Method::GET, forbidden, at(2)), None);
        assert_eq!(stats.upstream_denied(&Method::PUT, forbidden, at(60)), None);
        assert_eq!(
            stats.upstream_denied(&Method::PUT, forbidden, at(61)),
            Some(3)
        );
        let state = stats.snapshot();
        assert_eq!((state.upstream_denied, state.upstream_errors), (4, 0));
        let last = state.last_upstream_denied.expect("the last refusal");
        assert_eq!(
            last.message,
            "PUT http://10.0.0.5:9000: answered 403 Forbidden"
        );
        assert!(state.last_upstream_error.is_none());
    }

    #[test]
    fn counters_add_up_and_the_state_holds_no_secret() {
        let stats = Stats::new(&tier()).with_credential_source("the tier's aws_access_key_id");
        for method in [Method::HEAD, Method::HEAD, Method::PUT, Method::OPTIONS] {
            stats.request(&method);
        }
        stats.rejected(&crate::sigv4::Rejection::Signature);
        stats.peer_refused();
        stats.sent(100);
        stats.sent(28);
        stats.received(7);
        stats.upstream_error(&Method::PUT, "answered 500 Internal Server Error");
        stats.unreachable(&Method::GET, "error sending request: connection refused");
        use crate::client_fault::ClientFault;
        stats.client_fault(&ClientFault::Stalled(Duration::from_secs(5)));
        stats.client_fault(&ClientFault::BrokeOff("reset".into()));
        stats.client_fault(&ClientFault::Stalled(Duration::from_secs(5)));
        let state = stats.snapshot();
        assert_eq!(
            state.client_upload_failures,
            ClientUploadFailures {
                stalled: 2,
                broke_off: 1
            }
        );
        assert_eq!(
            state.requests,
            RequestCounts {
                head: 2,
                put: 1,
                other: 1,
                ..RequestCounts::default()
            }
        );
        assert_eq!(
            (state.rejected, state.bytes_up, state.bytes_down),
            (1, 128, 7)
        );
        assert_eq!((state.upstream_errors, state.upstream_unreachable), (1, 1));
        assert_eq!(state.peer_refused, 1);
        assert_eq!(
            state.last_upstream_error.as_ref().unwrap().message,
            "GET http://10.0.0.5:9000: error sending request: connection refused"
        );
        assert_eq!(state.upstream, "http://10.0.0.5:9000");
        assert_eq!((state.tier, state.bucket.as_str()), (1, "kv-cache"));
        let json = serde_json::to_string(&state).unwrap();
        for secret in ["AKIAREALKEYID", "REAL-SECRET", "REAL-TOKEN"] {
            assert!(!json.contains(secret), "{json}");
        }
        assert_eq!(serde_json::from_str::<GatewayState>(&json).unwrap(), state);
    }

    #[test]
    fn answers_refusals_durations_and_expiry_are_counted() {
        use crate::sigv4::Rejection;
        use http::StatusCode;
        let stats = Stats::new(&tier());
        stats.answered(StatusCode::OK, Duration::from_micros(800));
        stats.answered(StatusCode::OK, Duration::from_millis(30));
        stats.answered(StatusCode::FORBIDDEN, Duration::from_millis(2));
        stats.answered(StatusCode::SERVICE_UNAVAILABLE, Duration::from_secs(60));
        for why in [
            Rejection::Time,
            Rejection::UnknownKey,
            Rejection::Scope("r/s3".into()),
        ] {
            stats.rejected(&why);
        }
        let state = stats.snapshot();
        assert_eq!(
            state.answers,
            StatusClasses {
                success: 2,
                client_error: 1,
                server_error: 1,
                ..StatusClasses::default()
            }
        );
        assert_eq!(
            state.rejected_by_reason,
            Rejections {
                time: 1,
                unknown_key: 1,
                scope: 1,
                ..Rejections::default()
            }
        );
        let h = &state.answer_seconds;
        assert_eq!(h.count, 4);
        assert_eq!(h.bounds.len(), h.cumulative.len());
        assert_eq!(h.cumulative[0], 1, "0.8 ms <= 1 ms");
        assert_eq!(h.cumulative[1], 2, "2 ms <= 2.5 ms");
        assert_eq!(h.cumulative[4], 2, "30 ms > 25 ms");
        assert_eq!(h.cumulative[5], 3, "30 ms <= 50 ms");
        assert_eq!(*h.cumulative.last().unwrap(), 3, "60 s is only in +Inf");
        assert!((h.sum - 60.0328).abs() < 1e-6, "{}", h.sum);
        assert_eq!(state.credential_expiry_unix, None);
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        stats.credentials_expire(Some(at));
        assert_eq!(stats.snapshot().credential_expiry_unix, Some(1_800_000_000));
        stats.credentials_expire(None);
        assert_eq!(stats.snapshot().credential_expiry_unix, None);
    }
}
