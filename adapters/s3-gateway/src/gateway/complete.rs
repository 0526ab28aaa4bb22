//! A multipart complete the store is slow to answer: answered `200` by the
//! gateway itself and kept alive with spaces until the store's result.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};

use crate::client::{self, Body, BoxError};
use lmcache_tier_spec::error_chain;

use super::body::read_whole;
use super::counting::Counting;
use super::error::xml_escape;
use super::limits::COMPLETE_SILENCE;

/// How often the gateway sends a space on a complete it answered itself
/// ([`COMPLETE_SILENCE`]).
const COMPLETE_KEEP_ALIVE: Duration = Duration::from_secs(5);

/// The largest result of a multipart complete read whole (with spaces).
const MAX_COMPLETE_BYTES: usize = 1 << 20;

/// The XML declaration that starts a complete the gateway keeps alive.
const XML_DECLARATION: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";

/// The upstream answer of a multipart complete, owned.
pub(super) type Answer =
    Pin<Box<dyn Future<Output = Result<Response<Incoming>, client::SendError>> + Send>>;

/// The gateway's own `200` to a multipart complete the store has not
/// answered within [`UPSTREAM_SILENCE`](super::limits::UPSTREAM_SILENCE) ([`COMPLETE_SILENCE`]): an XML
/// declaration, a space every [`COMPLETE_KEEP_ALIVE`] while `answer` comes
/// and its body is read, then that body without its declaration and
/// leading spaces: the `CompleteMultipartUploadResult`, or the store's
/// `<Error>` (S3's answer to a complete that fails after its `200`). No
/// answer, or one cut off, ends the body with an `InternalError`, which S3
/// clients retry.
pub(super) fn kept_alive(counting: Counting, method: Method, answer: Answer) -> Response<Body> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
