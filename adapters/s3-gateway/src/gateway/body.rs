//! Bodies both ways: LMCache's upload as the store gets it (coalesced,
//! counted, and watched for whose silence ends it), and the store's
//! answers with their silence bound.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyDataStream, BodyExt, Full, StreamBody};
use hyper::body::{Body as _, Frame, Incoming};

use crate::client::{self, Body, BoxError, Progress};
use crate::state::Stats;
use lmcache_tier_spec::error_chain;

use super::limits::UPSTREAM_SILENCE;
use crate::client_fault::ClientFault;

/// The smallest chunk of a request body written to the upstream (bar the last).
const FORWARD_CHUNK: usize = 256 << 10;

/// A body read whole as text, each piece within `silence` of the last, at
/// most `limit` bytes.
pub(super) async fn read_whole(
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
pub(super) fn upstream_body(
    body: Incoming,
    stats: Arc<Stats>,
    progress: Progress,
    upload: Upload,
) -> Body {
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

/// What the client's side of one request body did, to tell whose silence
/// or failure ended an exchange. The upstream's client reads the body only
/// when it can send more, so a read that waits on the client means the
/// upstream was ready for bytes the client did not send; a stalled
/// upstream instead stops the reading with the last read answered.
#[derive(Clone, Default)]
pub(super) struct Upload(Arc<UploadState>);

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
    pub(super) fn fault(&self) -> Option<ClientFault> {
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
pub(super) enum BodyCut {
    /// The connection broke.
    #[error("the answer broke off: {0}")]
    BrokeOff(
        /// The cause chain, with no path or query.
        String,
    ),
    /// No data came for the exchange's bound ([`UPSTREAM_SILENCE`], or
    /// [`COMPLETE_SILENCE`](super::limits::COMPLETE_SILENCE) for a multipart complete).
    #[error("the answer stalled for {} s", .0.as_secs())]
    Stalled(
        /// The bound.
        Duration,
    ),
}

/// Why an answer read whole (a listing page, a kept-alive complete's
/// result; [`read_whole`]) could not be.
#[derive(Debug, thiserror::Error)]
pub(super) enum ListingError {
    /// Its body ended early.
    #[error("the answer: {0}")]
    Cut(
        /// How.
        BodyCut,
    ),
    /// It is larger than the limit of its reading (a listing page's or a
    /// complete's).
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
pub(super) fn stalling(
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

pub(super) fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}
