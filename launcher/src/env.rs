//! The node's `EREBINE_AGENT_*` variables, read in one place.
//!
//! [`NodeEnv`] is built from a map the caller passes (the agent hands its own
//! environment; the binaries pass the process environment), never from the
//! process environment implicitly. Every value is checked here: a bad value is
//! a [`ConfigError`] that names the variable, quotes the value and says what
//! to write instead. Defaults and seed sources are in `docs/configuration.md`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use lmcache_adapters::{Cascade, SpecError};
use lmcache_sizing::gib_to_bytes;

/// L1 budget in GiB, total across tensor-parallel ranks.
pub const KV_OFFLOAD_SIZE_GB: &str = "EREBINE_AGENT_KV_OFFLOAD_SIZE_GB";
/// Number of nodes sharing this host (divides the host's RAM).
pub const HOST_AGENT_COUNT: &str = "EREBINE_AGENT_HOST_AGENT_COUNT";
/// Cache directory of the disk tier.
pub const DISK_PATH: &str = "EREBINE_AGENT_LMCACHE_DISK_PATH";
/// Disk tier capacity in GiB; `0` disables the tier.
pub const DISK_SIZE_GB: &str = "EREBINE_AGENT_LMCACHE_DISK_SIZE_GB";
/// Chunk size in tokens.
pub const CHUNK_SIZE: &str = "EREBINE_AGENT_LMCACHE_CHUNK_SIZE";
/// ZMQ port the engine uses to reach the server.
pub const MP_PORT: &str = "EREBINE_AGENT_LMCACHE_MP_PORT";
/// Port of the server's HTTP frontend (`/status`).
pub const HTTP_PORT: &str = "EREBINE_AGENT_LMCACHE_HTTP_PORT";
/// Executable that starts the cache server.
pub const LMCACHE_PATH: &str = "EREBINE_AGENT_LMCACHE_PATH";
/// The operator's L2 adapter JSON (object or array).
pub const L2_ADAPTER: &str = "EREBINE_AGENT_LMCACHE_L2_ADAPTER";
/// Log level of the LMCache server.
pub const LMCACHE_LOG_LEVEL: &str = "EREBINE_AGENT_LMCACHE_LOG_LEVEL";
/// The agent's own log level, the default of [`LMCACHE_LOG_LEVEL`].
pub const AGENT_LOG_LEVEL: &str = "EREBINE_AGENT_LOG_LEVEL";

/// Default ZMQ port of the server (seed, "LMCache Environment Variables").
pub const DEFAULT_MP_PORT: u16 = 6555;
/// Default HTTP port of the server (seed, "LMCache Environment Variables").
pub const DEFAULT_HTTP_PORT: u16 = 8090;

/// A variable with a value the node cannot use.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A value that does not parse or is out of range.
    #[error("{variable}={value:?} is not valid: {expected}")]
    Invalid {
        /// The variable (or flag) at fault.
        variable: String,
        /// The value as given.
        value: String,
        /// What to write instead.
        expected: String,
    },
    /// The adapter JSON is unusable.
    #[error(transparent)]
    Adapter(#[from] SpecError),
}

/// The node's configuration variables, parsed and range-checked.
///
/// Sizes are bytes; `None` means "derive it".
#[derive(Debug, Clone, PartialEq)]
pub struct NodeEnv {
    /// `EREBINE_AGENT_KV_OFFLOAD_SIZE_GB` in bytes.
    pub kv_offload_bytes: Option<u64>,
    /// `EREBINE_AGENT_HOST_AGENT_COUNT`, default 1, at least 1.
    pub host_agent_count: u32,
    /// `EREBINE_AGENT_LMCACHE_DISK_PATH`, default `~/.cache/erebine/lmcache`.
    pub disk_path: PathBuf,
    /// `EREBINE_AGENT_LMCACHE_DISK_SIZE_GB` in bytes.
    pub disk_size_bytes: Option<u64>,
    /// `EREBINE_AGENT_LMCACHE_CHUNK_SIZE` in tokens, at least 1.
    pub chunk_size: Option<u32>,
    /// `EREBINE_AGENT_LMCACHE_MP_PORT`, default 6555.
    pub mp_port: u16,
    /// `EREBINE_AGENT_LMCACHE_HTTP_PORT`, default 8090.
    pub http_port: u16,
    /// `EREBINE_AGENT_LMCACHE_PATH`: the executable that starts the server.
    pub lmcache_path: Option<PathBuf>,
    /// `EREBINE_AGENT_LMCACHE_L2_ADAPTER`: replaces the built-in tier.
    pub l2_adapter: Option<Cascade>,
    /// `LMCACHE_LOG_LEVEL` for the server: `EREBINE_AGENT_LMCACHE_LOG_LEVEL`,
    /// else `EREBINE_AGENT_LOG_LEVEL`, else unset (LMCache's default).
    pub lmcache_log_level: Option<String>,
}

impl NodeEnv {
    /// Reads every variable from `vars` (name -> value). Empty values count
    /// as unset. `HOME` locates the default cache directory.
    pub fn from_vars(vars: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let get = |name: &str| {
            vars.get(name)
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        let disk_path = match get(DISK_PATH) {
            Some(p) => expand_home(&p, vars),
            None => expand_home("~/.cache/erebine/lmcache", vars),
        };
        Ok(NodeEnv {
            kv_offload_bytes: get(KV_OFFLOAD_SIZE_GB)
                .map(|v| parse_gib(KV_OFFLOAD_SIZE_GB, &v))
                .transpose()?,
            host_agent_count: get(HOST_AGENT_COUNT)
                .map(|v| parse_positive(HOST_AGENT_COUNT, &v, "the number of nodes on this host"))
                .transpose()?
                .unwrap_or(1),
            disk_path,
            disk_size_bytes: get(DISK_SIZE_GB)
                .map(|v| parse_gib(DISK_SIZE_GB, &v))
                .transpose()?,
            chunk_size: get(CHUNK_SIZE)
                .map(|v| parse_positive(CHUNK_SIZE, &v, "a chunk size in tokens, e.g. 256"))
                .transpose()?,
            mp_port: get(MP_PORT)
                .map(|v| parse_port(MP_PORT, &v))
                .transpose()?
                .unwrap_or(DEFAULT_MP_PORT),
            http_port: get(HTTP_PORT)
                .map(|v| parse_port(HTTP_PORT, &v))
                .transpose()?
                .unwrap_or(DEFAULT_HTTP_PORT),
            lmcache_path: get(LMCACHE_PATH).map(PathBuf::from),
            l2_adapter: get(L2_ADAPTER)
                .map(|v| Cascade::parse(&v, L2_ADAPTER))
                .transpose()?,
            lmcache_log_level: get(LMCACHE_LOG_LEVEL).or_else(|| get(AGENT_LOG_LEVEL)),
        })
    }
}

fn expand_home(path: &str, vars: &BTreeMap<String, String>) -> PathBuf {
    match (path.strip_prefix("~/"), vars.get("HOME")) {
        (Some(rest), Some(home)) if !home.is_empty() => PathBuf::from(home).join(rest),
        _ => PathBuf::from(path),
    }
}

/// Parses a size in GiB (`"16"`, `"0.5"`, `"0"`) into bytes. `variable`
/// names the variable or flag in the error.
pub fn parse_gib(variable: &str, value: &str) -> Result<u64, ConfigError> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .and_then(gib_to_bytes)
        .ok_or_else(|| ConfigError::Invalid {
            variable: variable.to_string(),
            value: value.to_string(),
            expected: "write a non-negative size in GiB, e.g. 16 or 0.5 (0 turns the tier off)"
                .to_string(),
        })
}

fn parse_positive(variable: &str, value: &str, what: &str) -> Result<u32, ConfigError> {
    match value.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(ConfigError::Invalid {
            variable: variable.to_string(),
            value: value.to_string(),
            expected: format!("write a whole number of at least 1: {what}"),
        }),
    }
}

fn parse_port(variable: &str, value: &str) -> Result<u16, ConfigError> {
    match value.trim().parse::<u16>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(ConfigError::Invalid {
            variable: variable.to_string(),
            value: value.to_string(),
            expected: "write a TCP port from 1 to 65535".to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmcache_sizing::GIB;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults() {
        let env = NodeEnv::from_vars(&vars(&[("HOME", "/home/n")])).unwrap();
        assert_eq!(
            env.disk_path,
            PathBuf::from("/home/n/.cache/erebine/lmcache")
        );
        assert_eq!((env.mp_port, env.http_port), (6555, 8090));
        assert_eq!(env.host_agent_count, 1);
        assert_eq!(env.kv_offload_bytes, None);
        assert_eq!(env.disk_size_bytes, None);
        assert_eq!(env.l2_adapter, None);
        assert_eq!(env.lmcache_log_level, None);
    }

    #[test]
    fn sizes_are_gib_and_may_be_fractional() {
        let env =
            NodeEnv::from_vars(&vars(&[(KV_OFFLOAD_SIZE_GB, "1.5"), (DISK_SIZE_GB, "0")])).unwrap();
        assert_eq!(env.kv_offload_bytes, Some(3 * GIB / 2));
        assert_eq!(env.disk_size_bytes, Some(0));
    }

    #[test]
    fn bad_values_name_the_variable_and_the_fix() {
        for (var, val) in [
            (KV_OFFLOAD_SIZE_GB, "abc"),
            (KV_OFFLOAD_SIZE_GB, "-1"),
            (DISK_SIZE_GB, "NaN"),
            (DISK_SIZE_GB, "inf"),
            (CHUNK_SIZE, "0"),
            (CHUNK_SIZE, "12.5"),
            (MP_PORT, "70000"),
            (HTTP_PORT, "0"),
            (HOST_AGENT_COUNT, "0"),
        ] {
            let err = NodeEnv::from_vars(&vars(&[(var, val)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(var), "{var}={val}: {err}");
            assert!(err.contains("write"), "{var}={val}: {err}");
        }
    }

    #[test]
    fn log_level_falls_back_to_the_agent_level() {
        let env = NodeEnv::from_vars(&vars(&[(AGENT_LOG_LEVEL, "debug")])).unwrap();
        assert_eq!(env.lmcache_log_level.as_deref(), Some("debug"));
        let env = NodeEnv::from_vars(&vars(&[
            (AGENT_LOG_LEVEL, "debug"),
            (LMCACHE_LOG_LEVEL, "info"),
        ]))
        .unwrap();
        assert_eq!(env.lmcache_log_level.as_deref(), Some("info"));
    }

    #[test]
    fn adapter_json_errors_name_the_variable() {
        let err = NodeEnv::from_vars(&vars(&[(L2_ADAPTER, "{not json")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(L2_ADAPTER), "{err}");
    }

    #[test]
    fn empty_values_count_as_unset() {
        let env = NodeEnv::from_vars(&vars(&[(MP_PORT, ""), (DISK_PATH, " ")])).unwrap();
        assert_eq!(env.mp_port, 6555);
    }
}
