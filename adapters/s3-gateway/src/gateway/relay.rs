//! One exchange with the store: the answer's head within the exchange's
//! silence bound, then its body streamed back (a listing inside a key
//! prefix read whole, the prefix stripped from its keys), every answer
//! counted.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};

use crate::client::{Body, BoxError, Progress};
use crate::key::Route;
use crate::state::Stats;
use lmcache_tier_spec::error_chain;

use super::body::{full, read_whole, stalling, ListingError, Upload};
use super::complete::{kept_alive, Answer};
use super::counting::Counting;
use super::error::ForwardError;
use super::limits::{COMPLETE_SILENCE, UPSTREAM_SILENCE};
use super::upstream::Upstream;

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

/// What one exchange's request body did: when it last moved, and what its
/// client did ([`Upload`]).
#[derive(Clone, Copy)]
pub(super) struct Exchange<'a> {
    pub(super) progress: &'a Progress,
    pub(super) upload: &'a Upload,
}

/// Sends `request` upstream and passes the answer back as it streams in
/// (a listing inside a key prefix is read whole, to strip the prefix from
/// its keys); failures and 5xx answers are counted in `stats`. The head
/// must come within [`UPSTREAM_SILENCE`] of the last progress of
/// `exchange` (the request body's last byte). An exchange that ends with
/// no answer while the request body waited on its client, or after that
/// body broke off, is the client's, not the upstream's.
pub(super) async fn relay(
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
    let key_prefix = upstream.tier.object_prefix();
    let rewrite_listing = route.listing && !key_prefix.is_empty() && response.status().is_success();
    if rewrite_listing {
        listing_back(response, &key_prefix, stats, method).await
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
pub(super) fn is_complete(method: &Method, route: &Route) -> bool {
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
}
