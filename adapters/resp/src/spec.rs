//! A `resp` tier's keys as LMCache 0.5.6 reads them
//! (`RESPL2AdapterConfig.from_dict`: `host` a non-empty string, `port` a
//! positive integer, `num_workers` a positive integer, `username` and
//! `password` strings, `max_capacity_gb` a number of GiB, 0 or more),
//! checked before anything starts so that a bad one is named here rather
//! than in a Python traceback. Pure: no I/O.

use std::net::Ipv6Addr;

use lmcache_tier_spec::capacity::{BoundKeyError, MAX_CAPACITY_GB};
use lmcache_tier_spec::{shown_value, Cascade, TierSpec};
use serde_json::Value;

use crate::RespError;

/// The key of the Redis host.
pub const HOST: &str = "host";
/// The key of the Redis port.
pub const PORT: &str = "port";
/// The key of LMCache's I/O threads for the tier.
pub const NUM_WORKERS: &str = "num_workers";
/// The key of the ACL user name.
pub const USERNAME: &str = "username";
/// The key of the password.
pub const PASSWORD: &str = "password";
/// The variable LMCache 0.5.6 reads the user name from when the spec has
/// none (`_create_resp_l2_adapter`).
pub const USERNAME_ENV: &str = "LMCACHE_RESP_USERNAME";
/// The variable LMCache 0.5.6 reads the password from when the spec has
/// none.
pub const PASSWORD_ENV: &str = "LMCACHE_RESP_PASSWORD";

/// The credentials of a tier: from its spec, or from the environment the
/// server gets. Never printed: `Debug` shows only which are set.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// The ACL user; `None` for Redis's `default` user.
    pub username: Option<String>,
    /// The password; `None` for a Redis without one.
    pub password: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username.as_ref().map(|_| "<redacted>"))
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Credentials {
    /// Whether either is set.
    pub fn any(&self) -> bool {
        self.username.is_some() || self.password.is_some()
    }

    /// These, each one left out taken from `env` ([`USERNAME_ENV`],
    /// [`PASSWORD_ENV`]; an empty value is none), field by field as LMCache
    /// 0.5.6 falls back to them (`config.password or os.environ.get(...)`).
    pub fn or_from(&self, env: &dyn Fn(&str) -> Option<String>) -> Credentials {
        let from_env = |name: &str| env(name).filter(|v| !v.is_empty());
        Credentials {
            username: self.username.clone().or_else(|| from_env(USERNAME_ENV)),
            password: self.password.clone().or_else(|| from_env(PASSWORD_ENV)),
        }
    }
}

/// One `resp` tier of a cascade, its keys checked.
#[derive(Debug, Clone, PartialEq)]
pub struct RespTier {
    /// Its 0-based position in the cascade.
    pub position: usize,
    /// The Redis host: a name or an IPv4 address.
    pub host: String,
    /// The Redis port.
    pub port: u16,
    /// The credentials its spec gives (none: the server's environment's).
    pub credentials: Credentials,
    /// `num_workers`: the connections LMCache's client opens to it
    /// (LMCache's default 8).
    pub num_workers: u64,
    /// `max_capacity_gb` in bytes, when above 0: LMCache then counts the
    /// tier's bytes and, with an `eviction` block, deletes its own keys.
    pub max_capacity_bytes: Option<u64>,
}

impl RespTier {
    /// `host:port`.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// The `resp` tiers of `cascade`, in cascade order, each checked.
///
/// # Errors
/// The first tier with a key LMCache would refuse or we cannot act on
/// ([`RespError::Spec`]), or whose credentials differ from an earlier
/// tier's ([`RespError::Credentials`]).
pub fn resp_tiers(cascade: &Cascade) -> Result<Vec<RespTier>, RespError> {
    let tiers = cascade
        .tiers()
        .iter()
        .enumerate()
        .filter(|(_, tier)| tier.kind().is_resp())
        .map(|(position, tier)| resp_tier(position, tier))
        .collect::<Result<Vec<_>, _>>()?;
    same_credentials(&tiers)?;
    Ok(tiers)
}

/// One tier's keys, checked.
fn resp_tier(position: usize, tier: &TierSpec) -> Result<RespTier, RespError> {
    let object = tier.as_object();
    let problem = |key: &'static str, problem: String, fix: &'static str| RespError::Spec {
        position,
        key,
        problem,
        fix,
    };
    let host = host(object.get(HOST)).map_err(|p| {
        problem(HOST, p, "Give the Redis host alone: a name or an IPv4 address, without a scheme, a user, a port or a path (e.g. \"host\": \"10.0.0.5\", \"port\": 6379)")
    })?;
    let port = port(object.get(PORT)).map_err(|p| {
        problem(
            PORT,
            p,
            "Give the Redis port as a whole number from 1 to 65535 (e.g. \"port\": 6379)",
        )
    })?;
    let num_workers = match object.get(NUM_WORKERS) {
        None => 8,
        Some(value) => value.as_u64().filter(|n| *n > 0).ok_or_else(|| {
            problem(NUM_WORKERS, format!("{value} is not a whole number above 0"), "Give LMCache's I/O threads for the tier as a whole number (LMCache's default is 8), or leave the key out")
        })?,
    };
    let credentials = Credentials {
        username: text(object.get(USERNAME)).map_err(|p| {
            problem(
                USERNAME,
                p,
                "Give the Redis ACL user as a string, or leave it out for Redis's default user",
            )
        })?,
        password: text(object.get(PASSWORD)).map_err(|p| {
            problem(
                PASSWORD,
                p,
                "Give the password as a string, or leave it out and set LMCACHE_RESP_PASSWORD",
            )
        })?,
    };
    let max_capacity_bytes = tier
        .capacity()
        .map_err(|e| {
            let text = match e {
                BoundKeyError::UnderAByte(value) => format!("{value} is less than a byte"),
                BoundKeyError::TooLarge(value) => format!("{value} is 2^64 bytes or more"),
                BoundKeyError::Capacity(value)
                | BoundKeyError::Block(value)
                | BoundKeyError::Fraction { value, .. } => {
                    format!("{value} is not a number of GiB, 0 or more")
                }
            };
            let fix =
                "Give the most LMCache may keep in the Redis, in GiB (e.g. 8), or leave it out";
            problem(MAX_CAPACITY_GB, text, fix)
        })?
        .map(|(_, bytes)| bytes);
    Ok(RespTier {
        position,
        host,
        port,
        credentials,
        num_workers,
        max_capacity_bytes,
    })
}

/// `host`: a non-empty string that is a host name or an IPv4 address and
/// nothing else. LMCache 0.5.6's native RESP client resolves it for IPv4
/// only (`getaddrinfo ... Address family for hostname not supported` for
/// an IPv6 address, and every store fails), so an IPv6 address is refused
/// here. A value that may hold credentials (a URL, a `user@`) is not
/// quoted.
fn host(value: Option<&Value>) -> Result<String, String> {
    let host = match value {
        None => return Err("is missing".into()),
        Some(Value::String(host)) => host,
        Some(other) => return Err(format!("{other} is not a string")),
    };
    let shown = shown_value(host);
    if host.is_empty() {
        return Err("is empty".into());
    }
    if host.contains("://") || host.contains('@') {
        return Err("is a URL or holds a user (not shown: it may hold a password)".into());
    }
    let bare = host.split('%').next().unwrap_or_default();
    if bare.trim_matches(['[', ']']).parse::<Ipv6Addr>().is_ok() {
        return Err(format!(
            "{shown} is an IPv6 address, and LMCache 0.5.6's RESP client connects over IPv4 only"
        ));
    }
    if host.contains(':') {
        return Err(format!("{shown} holds a port (give it in \"port\")"));
    }
    let bad = |c: char| c.is_whitespace() || c.is_control() || "/?#@[]".contains(c);
    match host.chars().any(bad) {
        true => Err(format!("{shown} is not a host name or an IP address")),
        false => Ok(host.clone()),
    }
}

/// `port`: a JSON integer from 1 to 65535.
fn port(value: Option<&Value>) -> Result<u16, String> {
    match value {
        None => Err("is missing".into()),
        Some(value) => value
            .as_u64()
            .and_then(|port| u16::try_from(port).ok())
            .filter(|port| *port > 0)
            .ok_or_else(|| format!("{value} is not a port")),
    }
}

/// An optional string key; an empty string is none, as LMCache reads it.
fn text(value: Option<&Value>) -> Result<Option<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone()).filter(|t| !t.is_empty())),
        Some(_) => Err("is not a string".into()),
    }
}

/// Every tier with credentials in its spec gives the same ones, and no
/// tier leaves them out while another gives them (it would get the
/// other's through the environment).
fn same_credentials(tiers: &[RespTier]) -> Result<(), RespError> {
    let Some(first) = tiers.iter().find(|t| t.credentials.any()) else {
        return Ok(());
    };
    match tiers.iter().find(|t| t.credentials != first.credentials) {
        Some(other) => Err(RespError::Credentials {
            position: other.position,
            first: first.position,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiers(json: &str) -> Result<Vec<RespTier>, RespError> {
        resp_tiers(&Cascade::parse(json, "test").unwrap())
    }

    #[test]
    fn each_kind_of_host_is_read_or_named() {
        for host in [
            "redis",
            "10.0.0.5",
            "redis.kv.svc.cluster.local",
            "ÿ-unicode",
        ] {
            let json = format!(r#"[{{"type":"resp","host":{host:?},"port":6379}}]"#);
            let tier = &tiers(&json).unwrap()[0];
            assert_eq!(tier.host, host);
        }
        for (host, said) in [
            (
                r#""redis://kv:hunter2@h:6379/0""#,
                "is a URL or holds a user",
            ),
            (r#""kv:hunter2@10.0.0.5""#, "is a URL or holds a user"),
            (r#""::1""#, "IPv4 only"),
            (r#""[::1]""#, "IPv4 only"),
            (r#""fe80::1%lo""#, "IPv4 only"),
            (r#""h:6379""#, "holds a port"),
            (r#""""#, "is empty"),
            (r#""h/0""#, "not a host name"),
            (r#""a b""#, "not a host name"),
            (r#""u@h""#, "holds a user"),
            ("7", "is not a string"),
        ] {
            let json = format!(
                r#"[{{"type":"fs","base_path":"/x"}},{{"type":"resp","host":{host},"port":6379}}]"#
            );
            let e = tiers(&json).unwrap_err().to_string();
            assert!(e.starts_with("L2 tier 1 (resp): host: "), "{e}");
            assert!(e.contains(said), "{host}: {e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
        let e = tiers(r#"[{"type":"resp","port":6379}]"#).unwrap_err();
        assert!(e.to_string().contains("host: is missing"), "{e}");
    }

    #[test]
    fn ports_workers_and_capacities_are_judged_as_lmcache_reads_them() {
        for port in ["0", "65536", "-1", "6379.5", r#""6379""#, "null"] {
            let json = format!(r#"[{{"type":"resp","host":"h","port":{port}}}]"#);
            let e = tiers(&json).unwrap_err().to_string();
            assert!(
                e.contains("port: ") && e.contains("1 to 65535"),
                "{port}: {e}"
            );
        }
        for workers in ["0", "-2", "1.5", r#""8""#] {
            let json =
                format!(r#"[{{"type":"resp","host":"h","port":1,"num_workers":{workers}}}]"#);
            let e = tiers(&json).unwrap_err().to_string();
            assert!(e.contains("num_workers: "), "{workers}: {e}");
        }
        for gb in ["-1", r#""8""#, "null"] {
            let json = format!(r#"[{{"type":"resp","host":"h","port":1,"max_capacity_gb":{gb}}}]"#);
            let e = tiers(&json).unwrap_err().to_string();
            assert!(e.contains("max_capacity_gb: "), "{gb}: {e}");
        }
        let read = tiers(
            r#"[{"type":"resp","host":"h","port":1,"max_capacity_gb":0.5},
                {"type":"resp","host":"h","port":2,"max_capacity_gb":0}]"#,
        )
        .unwrap();
        assert_eq!(read[0].max_capacity_bytes, Some(1 << 29));
        assert_eq!(read[1].max_capacity_bytes, None, "0 bounds nothing");
    }

    #[test]
    fn credentials_are_one_pair_for_the_server_and_never_shown() {
        let one = tiers(
            r#"[{"type":"resp","host":"a","port":1,"username":"kv","password":"P1"},
                {"type":"resp","host":"b","port":1,"username":"kv","password":"P1"}]"#,
        )
        .unwrap();
        assert_eq!(one[1].credentials.password.as_deref(), Some("P1"));
        assert!(!format!("{one:?}").contains("P1"), "{one:?}");
        for second in [
            r#""password":"P2""#,
            r#""username":"other","password":"P1""#,
            r#""password":"""#,
        ] {
            let json = format!(
                r#"[{{"type":"resp","host":"a","port":1,"username":"kv","password":"P1"}},{{"type":"resp","host":"b","port":1,{second}}}]"#
            );
            let e = tiers(&json).unwrap_err().to_string();
            assert!(
                e.starts_with(
                    "L2 tier 1 (resp): its username and password differ from those of L2 tier 0"
                ),
                "{e}"
            );
            assert!(!e.contains("P1") && !e.contains("P2"), "{e}");
        }
        let e = tiers(r#"[{"type":"resp","host":"a","port":1,"password":5}]"#).unwrap_err();
        assert!(e.to_string().contains("password: is not a string"), "{e}");
        let none = tiers(r#"[{"type":"resp","host":"a","port":1,"password":""}]"#).unwrap();
        assert!(
            !none[0].credentials.any(),
            "an empty password is none, as LMCache reads it"
        );
    }

    #[test]
    fn credentials_left_out_are_the_servers_environments() {
        let env = |name: &str| match name {
            USERNAME_ENV => Some(String::new()),
            PASSWORD_ENV => Some("FROM-ENV".to_string()),
            _ => None,
        };
        let none = Credentials::default().or_from(&env);
        assert_eq!(none.username, None, "an empty variable is none");
        assert_eq!(none.password.as_deref(), Some("FROM-ENV"));
        let own = Credentials {
            username: None,
            password: Some("OWN".into()),
        };
        assert_eq!(own.or_from(&env), own, "the spec's win, as LMCache's do");
        let user_only = Credentials {
            username: Some("kv".into()),
            password: None,
        };
        let paired = user_only.or_from(&env);
        assert_eq!(
            (paired.username.as_deref(), paired.password.as_deref()),
            (Some("kv"), Some("FROM-ENV")),
            "field by field, as LMCache falls back"
        );
    }
}
