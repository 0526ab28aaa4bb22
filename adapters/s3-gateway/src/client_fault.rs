//! Why an upload ended by its own client's doing, not the store's: the
//! gateway answers it 400 as S3 does and counts it apart from the
//! upstream's failures (`docs/s3-gateway.md`, "A failing upstream").

use std::time::Duration;

/// Why an upload ended by its own client's doing (the gateway's reading
/// of the request body tells it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClientFault {
    /// The client sent no byte of the body for [`UPSTREAM_SILENCE`](crate::UPSTREAM_SILENCE) while
    /// the upstream waited for one.
    #[error("it sent no byte of the request body for {} s while the upstream waited for one", .0.as_secs())]
    Stalled(
        /// [`UPSTREAM_SILENCE`](crate::UPSTREAM_SILENCE).
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
