//! The gateway's own answers: S3 XML errors for what it refuses or cannot
//! forward, with the status and code an S3 client retries or reports.

use http::{HeaderValue, Response, StatusCode};

use crate::client::{Body, BoxError};
use crate::credentials::NoCredentials;
use crate::key::{self};
use crate::sigv4::{self};

use super::body::{full, ListingError};
use crate::client_fault::ClientFault;

/// Why a request is answered by the gateway itself instead of the upstream:
/// an S3 XML error ([`ForwardError::response`]).
#[derive(Debug, thiserror::Error)]
pub(super) enum ForwardError {
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
    pub(super) fn response(&self) -> Response<Body> {
        error(self.status(), self.code(), &self.to_string())
    }
}

/// `text` with `&`, `<` and `>` escaped for XML.
pub(super) fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// An S3 XML error response of the gateway's own.
pub(super) fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
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
    fn gateway_errors_are_s3_xml() {
        let r = error(StatusCode::FORBIDDEN, "SignatureDoesNotMatch", "a <b>");
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert_eq!(r.headers()[http::header::CONTENT_TYPE], "application/xml");
    }
}
