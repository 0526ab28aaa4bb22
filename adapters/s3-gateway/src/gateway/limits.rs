//! How long an exchange with the upstream may go silent: the gateway's
//! two bounds, read by the request path's every step (`docs/s3-gateway.md`,
//! "A failing upstream").

use std::time::Duration;

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
