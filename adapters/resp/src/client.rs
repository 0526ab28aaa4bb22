//! The adapter's own connection to a tier's Redis: one blocking RESP
//! connection with a timeout on connecting, reading and writing, through
//! the `redis` crate (`AUTH` with the tier's credentials as it connects).

use std::time::Duration;

use redis::{Connection, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};

use crate::info::RedisInfo;
use crate::spec::{Credentials, RespTier};

/// How long a connect, a read or a write may take at start.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(5);
/// The same for a scrape's read: a Redis that stalls costs a scrape at
/// most this much.
pub(crate) const SCRAPE_TIMEOUT: Duration = Duration::from_secs(1);

/// A connection to `tier`'s Redis as `credentials`, with `timeout` on each
/// step.
///
/// # Errors
/// The client's error, its text with any credential cut out
/// ([`detail`]).
pub(crate) fn connect(
    tier: &RespTier,
    credentials: &Credentials,
    timeout: Duration,
) -> Result<Connection, String> {
    let mut settings = RedisConnectionInfo::default().set_skip_set_lib_name();
    if let Some(username) = &credentials.username {
        settings = settings.set_username(username);
    }
    if let Some(password) = &credentials.password {
        settings = settings.set_password(password);
    }
    let connected = ConnectionAddr::Tcp(tier.host.clone(), tier.port)
        .into_connection_info()
        .map(|info| info.set_redis_settings(settings))
        .and_then(redis::Client::open)
        .and_then(|client| client.get_connection_with_timeout(timeout))
        .and_then(|connection| {
            connection.set_read_timeout(Some(timeout))?;
            connection.set_write_timeout(Some(timeout))?;
            Ok(connection)
        });
    connected.map_err(|e| detail(&e, credentials))
}

/// Why `INFO` gave no answer.
pub(crate) enum InfoFailed {
    /// The Redis answered with an error: the command is renamed away or
    /// the user may not run it (`ERR unknown command`, `NOPERM`). The
    /// tier may still work; only what `INFO` says is unknown.
    Refused(String),
    /// No answer (the connection failed, broke or timed out), or no
    /// credentials it takes (`NOAUTH`, `WRONGPASS`): LMCache could not use
    /// it either.
    Unreachable(String),
}

/// The Redis's `INFO` (its default sections).
///
/// # Errors
/// [`InfoFailed`], its text as [`detail`] gives it.
pub(crate) fn info(
    connection: &mut Connection,
    credentials: &Credentials,
) -> Result<RedisInfo, InfoFailed> {
    redis::cmd("INFO")
        .query::<String>(connection)
        .map(|text| RedisInfo::parse(&text))
        .map_err(|e| match e.code() {
            Some("NOAUTH" | "WRONGPASS") | None => InfoFailed::Unreachable(detail(&e, credentials)),
            Some(_) => InfoFailed::Refused(detail(&e, credentials)),
        })
}

/// `error` as a message says it, with the credentials replaced by
/// `<redacted>` should the client ever quote them.
pub(crate) fn detail(error: &redis::RedisError, credentials: &Credentials) -> String {
    let mut text = error.to_string();
    for secret in [&credentials.password, &credentials.username]
        .into_iter()
        .flatten()
    {
        text = text.replace(secret.as_str(), "<redacted>");
    }
    text
}
