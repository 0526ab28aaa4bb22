//! The counting of the store's answers to the requests the gateway
//! forwards: 5xx as upstream errors, 401 and 403 as refused credentials
//! (`docs/s3-gateway.md`, "Credentials refused while running").

use std::sync::Arc;

use http::{Method, StatusCode};

use crate::state::Stats;

use super::upstream::Upstream;

/// What counting an upstream answer needs of a gateway, owned: a complete
/// kept alive (`complete::kept_alive`) is counted by a task of its own.
#[derive(Clone)]
pub(super) struct Counting {
    pub(super) stats: Arc<Stats>,
    pub(super) tier: usize,
    /// `<bucket> of <host:port>`, for the warnings.
    place: String,
    started: std::time::Instant,
}

impl Counting {
    pub(super) fn of(upstream: &Upstream, stats: &Arc<Stats>) -> Counting {
        Counting {
            stats: stats.clone(),
            tier: upstream.tier.position,
            place: format!("{} of {}", upstream.tier.bucket, upstream.tier.endpoint),
            started: upstream.started,
        }
    }

    /// Counts the upstream's answer `status` to `method`: a 5xx as an
    /// upstream error, a 401 or 403 as refused credentials, warned about
    /// at most once a minute ([`crate::state::DENIED_WARNING_EVERY`]) with
    /// the refusals since the last warning.
    pub(super) fn status(&self, method: &Method, status: StatusCode) {
        if status.is_server_error() {
            self.stats
                .upstream_error(method, &format!("answered {status}"));
            return;
        }
        if !matches!(status, StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED) {
            return;
        }
        let since = self
            .stats
            .upstream_denied(method, status, self.started.elapsed());
        if let Some(count) = since {
            tracing::warn!(
                tier = self.tier,
                %method,
                %status,
                refusals = count,
                "S3 gateway: the object store refuses the real credentials ({}; {count} refusals since the last warning): they were revoked or rotated, or lack a permission; LMCache gets the 403 and stores nothing on this tier until they are fixed",
                self.place,
            );
        }
    }
}
