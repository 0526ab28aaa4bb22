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
//!
//! A request takes the path in this order, one module a step: the
//! connection admitted once ([`peers`]); the signature checked
//! ([`authenticate`]) and the key mapped into the bucket ([`route`]); the
//! request signed again for the store ([`re_sign`], [`upstream`]); the
//! exchange ([`relay`](mod@relay)), with both bodies streamed ([`body`]) and a
//! slow multipart complete kept alive ([`complete`]). The gateway's own
//! error answers are in [`error`](mod@error); its state route and its
//! refusal of another uid's connection are here.

mod body;
mod complete;
mod counting;
mod error;
mod limits;
mod peers;
mod relay;
mod upstream;

pub use limits::{COMPLETE_SILENCE, UPSTREAM_SILENCE};
pub(crate) use peers::Peers;
pub(crate) use upstream::Upstream;

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::client::{Body, Progress};
use crate::key::{self, Route};
use crate::sigv4::{self, Signed};
use crate::spec::BucketTier;
use crate::state::{Stats, STATE_PATH};

use body::{full, upstream_body, Upload};
use error::{error, ForwardError};
use peers::{Connection, PeerRefusal};
use relay::{is_complete, relay, Exchange};

/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

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
/// the bucket, [`re_sign`] it with the real credentials, [`relay()`] it and
/// the answer.
async fn forward(
    upstream: &Upstream,
    stats: &Arc<Stats>,
    request: Request<Incoming>,
) -> Result<Response<Body>, ForwardError> {
    let (parts, body) = request.into_parts();
    let payload_hash = authenticate(upstream, stats, &parts)?;
    stats.request(&parts.method);
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
        let date = store_date(response.headers());
        bound.follow(&parts, route.listing, response.status(), date);
        return Ok(response);
    }
    // The object exists once the complete's answer is whole: a slow one
    // keeps its 200 alive with spaces while the store assembles the parts.
    let (head, body) = response.into_parts();
    let status = head.status;
    let body = when_whole(body, move || bound.follow(&parts, false, status, None));
    Ok(Response::from_parts(head, body))
}

/// The store's `Date` header of an answer (an HTTP date, whole seconds):
/// the bucket bound dates an object this node stored by the store's clock,
/// as the listings date the others' (`docs/s3-gateway.md`, "A fleet on one
/// bucket").
fn store_date(headers: &http::HeaderMap) -> Option<std::time::SystemTime> {
    use aws_sdk_s3::primitives::{DateTime, DateTimeFormat};
    let text = headers.get(http::header::DATE)?.to_str().ok()?;
    let date = DateTime::from_str(text, DateTimeFormat::HttpDate).ok()?;
    std::time::SystemTime::try_from(date).ok()
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

/// Where the request goes in the bucket: its key under the tier's object
/// prefix (the key prefix and the cache identity's segment,
/// [`BucketTier::object_prefix`]), or the listing inside it
/// ([`key::route`]); a key in the bucket bound's own folder is refused
/// ([`key::refuse_reserved`]). A refusal is logged.
fn route(tier: &BucketTier, parts: &http::request::Parts) -> Result<Route, ForwardError> {
    let path = parts.uri.path();
    let names = parts.headers.keys().map(|name| name.as_str());
    key::route(
        parts.method.as_str(),
        path,
        parts.uri.query().unwrap_or(""),
        names,
        &tier.bucket,
        &tier.object_prefix(),
    )
    .and_then(|route| {
        if !route.listing {
            key::refuse_reserved(path, &tier.key_prefix, &tier.object_prefix())?;
        }
        Ok(route)
    })
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
