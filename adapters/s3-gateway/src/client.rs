//! The gateway's HTTP client for the upstream object store: hyper over TCP
//! or rustls, HTTP/1.1, no proxy.
//!
//! Requests carry an `http::Uri`, which keeps a path byte for byte. A URL
//! type that follows the WHATWG rules (reqwest's `Url`) removes `.` and `..`
//! segments, and those are bytes of S3 keys ([`super::key`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio::net::TcpStream;

/// An error of a body stream.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of requests and responses on both sides of the gateway.
pub(crate) type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// How long a connection to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a request got no answer from the upstream.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// No connection, a refused TLS handshake, or a connection that broke.
    #[error(transparent)]
    Failed(#[from] hyper_util::client::legacy::Error),
    /// No progress for the time limit: no connection, no request-body
    /// bytes taken, or no response head.
    #[error("no progress for {} s (no answer, or the request body not taken)", .0.as_secs())]
    Silent(Duration),
}

/// When one upstream exchange last made progress: it started, or a byte of
/// its request body moved ([`Progress::moved`]). [`UpstreamClient::send`]
/// gives up once it has been silent too long.
#[derive(Clone, Debug)]
pub(crate) struct Progress(Arc<ProgressClock>);

#[derive(Debug)]
struct ProgressClock {
    started: tokio::time::Instant,
    /// Milliseconds after `started` of the last progress.
    last_ms: AtomicU64,
}

impl Progress {
    /// A clock that last moved now.
    pub(crate) fn new() -> Self {
        Progress(Arc::new(ProgressClock {
            started: tokio::time::Instant::now(),
            last_ms: AtomicU64::new(0),
        }))
    }

    /// Records progress now.
    pub(crate) fn moved(&self) {
        let ms = self.0.started.elapsed().as_millis();
        self.0
            .last_ms
            .fetch_max(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// When the exchange last made progress.
    fn last(&self) -> tokio::time::Instant {
        self.0.started + Duration::from_millis(self.0.last_ms.load(Ordering::Relaxed))
    }
}

/// Why a tier's `s3_ca_bundle` holds no usable certificate
/// ([`ca_certificates`]); the message follows the bundle's path.
#[derive(Debug, thiserror::Error)]
pub enum CaBundleError {
    /// The file is not PEM text.
    #[error("is not a PEM bundle: {0}")]
    NotPem(
        /// The PEM parser's error.
        #[source]
        rustls::pki_types::pem::Error,
    ),
    /// The file is PEM text without a `CERTIFICATE` block.
    #[error("holds no PEM certificate")]
    NoCertificate,
}

/// Why the upstream client could not be built ([`UpstreamClient::new`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// The CA bundle holds no usable certificate.
    #[error(transparent)]
    Bundle(#[from] CaBundleError),
    /// A certificate of the bundle cannot be a trust anchor.
    #[error(transparent)]
    Anchor(
        /// rustls' reason.
        rustls::Error,
    ),
    /// The TLS configuration is refused (no protocol version in common
    /// with the crypto provider).
    #[error(transparent)]
    Tls(
        /// rustls' reason.
        rustls::Error,
    ),
}

/// A client for one tier's upstream.
#[derive(Clone)]
pub(crate) struct UpstreamClient {
    inner: Client<HttpsConnector<GuardedConnector>, Body>,
}

impl UpstreamClient {
    /// A client that trusts the built-in web PKI roots and the certificates
    /// of `ca_bundle_pem` (the tier's `s3_ca_bundle`), and drops a
    /// connection whose writes the upstream has not taken for `silence`
    /// ([`StallGuard`]).
    ///
    /// # Errors
    /// [`ClientError`]: the bundle holds no certificate or one that is not
    /// valid.
    pub(crate) fn new(
        ca_bundle_pem: Option<&[u8]>,
        silence: Duration,
    ) -> Result<Self, ClientError> {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        if let Some(pem) = ca_bundle_pem {
            for cert in ca_certificates(pem)? {
                roots.add(cert).map_err(ClientError::Anchor)?;
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(ClientError::Tls)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(GuardedConnector { tcp, silence });
        Ok(UpstreamClient {
            inner: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// Sends `request` and waits for the response head while the exchange
    /// is silent for less than `limit`: the wait starts again whenever
    /// `progress` moves (the request body's bytes move it), so a slow
    /// upload that keeps going is never cut, and a stalled one is cut
    /// `limit` after its last byte.
    pub(crate) async fn send(
        &self,
        request: Request<Body>,
        progress: &Progress,
        limit: Duration,
    ) -> Result<Response<Incoming>, SendError> {
        let mut answer = std::pin::pin!(self.inner.request(request));
        loop {
            match tokio::time::timeout_at(progress.last() + limit, answer.as_mut()).await {
                Ok(result) => return result.map_err(SendError::from),
                Err(_) if progress.last() + limit <= tokio::time::Instant::now() => {
                    return Err(SendError::Silent(limit))
                }
                Err(_) => {}
            }
        }
    }
}

/// [`HttpConnector`] whose connections are wrapped in a [`StallGuard`].
#[derive(Clone)]
pub(crate) struct GuardedConnector {
    tcp: HttpConnector,
    silence: Duration,
}

impl tower_service::Service<Uri> for GuardedConnector {
    type Response = StallGuard<TokioIo<TcpStream>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.tcp.poll_ready(cx).map_err(BoxError::from)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.tcp.call(uri);
        let silence = self.silence;
        Box::pin(async move {
            let stream = connecting.await?;
            Ok(StallGuard {
                inner: stream,
                silence,
                stalled: None,
            })
        })
    }
}

/// An upstream connection whose writes fail once the upstream has taken no
/// byte for `silence`.
///
/// Why: the gateway gives up on a request after that long
/// ([`UpstreamClient::send`]), but hyper's connection task, blocked in a
/// write the upstream never takes, does not notice; it would keep the
/// socket, its buffers and the request body (with LMCache's connection
/// behind it) for as long as the upstream stays hung: about 2 sockets and
/// 1 MiB for every stalled 32 MiB upload. A failed write ends that task.
/// Reads are not guarded: an idle pooled connection waits in a read, and a
/// request whose answer stalls is given up on by [`UpstreamClient::send`]
/// and the gateway's response stream, which hyper does notice.
pub(crate) struct StallGuard<T> {
    inner: T,
    silence: Duration,
    /// Armed at the first write that could not proceed since the last one
    /// that did.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// The error of a write the upstream did not take in time ([`StallGuard`]).
#[derive(Debug, thiserror::Error)]
#[error("the upstream took no request bytes for {} s", .0.as_secs())]
pub(crate) struct WriteStalled(Duration);

impl<T> StallGuard<T> {
    /// `outcome` of a write or flush, turned into an error once writes
    /// have been waiting for `silence`.
    fn watch<R>(
        &mut self,
        outcome: Poll<std::io::Result<R>>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<R>> {
        if outcome.is_ready() {
            self.stalled = None;
            return outcome;
        }
        let silence = self.silence;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(silence)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                WriteStalled(silence),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for StallGuard<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for StallGuard<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(outcome, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(outcome, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(outcome, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<T: Connection> Connection for StallGuard<T> {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}

/// The certificates of a PEM bundle.
///
/// # Errors
/// [`CaBundleError`]: it holds none, or one that cannot be read.
pub fn ca_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, CaBundleError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(CaBundleError::NotPem)?;
    if certs.is_empty() {
        return Err(CaBundleError::NoCertificate);
    }
    Ok(certs)
}

/// A body of nothing.
pub(crate) fn empty() -> Body {
    use http_body_util::BodyExt;
    http_body_util::Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}
