//! The gateway's HTTP client for the upstream object store: hyper over TCP
//! or rustls, HTTP/1.1, no proxy.
//!
//! Requests carry an `http::Uri`, which keeps a path byte for byte. A URL
//! type that follows the WHATWG rules (reqwest's `Url`) removes `.` and `..`
//! segments, and those are bytes of S3 keys ([`super::key`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

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
    /// No response head within the time limit.
    #[error("no answer within {} s", .0.as_secs())]
    TimedOut(Duration),
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
    inner: Client<HttpsConnector<HttpConnector>, Body>,
}

impl UpstreamClient {
    /// A client that trusts the built-in web PKI roots and the certificates
    /// of `ca_bundle_pem` (the tier's `s3_ca_bundle`).
    ///
    /// # Errors
    /// [`ClientError`]: the bundle holds no certificate or one that is not
    /// valid.
    pub(crate) fn new(ca_bundle_pem: Option<&[u8]>) -> Result<Self, ClientError> {
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
            .wrap_connector(tcp);
        Ok(UpstreamClient {
            inner: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// Sends `request` and waits at most `limit` for the response head
    /// (the request body's upload included).
    pub(crate) async fn send(
        &self,
        request: Request<Body>,
        limit: Duration,
    ) -> Result<Response<Incoming>, SendError> {
        tokio::time::timeout(limit, self.inner.request(request))
            .await
            .map_err(|_| SendError::TimedOut(limit))?
            .map_err(SendError::from)
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
