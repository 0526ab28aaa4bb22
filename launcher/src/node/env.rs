//! The node's `EREBINE_AGENT_*` variables, read in one place.
//!
//! [`NodeEnv`] is built from a map the caller passes (the agent hands its own
//! environment; the binaries pass the process environment), never from the
//! process environment implicitly. Every value is checked here: a bad value is
//! a [`ConfigError`] that names the variable, quotes the value and says what
//! to write instead. Every variable, its default and range are in
//! `docs/configuration.md`.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::PathBuf;

use lmcache_tier_spec::Cascade;
use serde::Serialize;
use serde_json::{Map, Value};

pub(crate) use crate::node::config_error::{parse_gib, parse_whole};
pub use crate::node::config_error::{ConfigError, MAX_GIB};
use crate::node::extra_args::ExtraArgs;

/// Which KV cache backend the node runs: `native`, `lmcache` or `none`.
pub const KV_CACHE_BACKEND: &str = "EREBINE_AGENT_KV_CACHE_BACKEND";

/// L1 budget in GiB, total across tensor-parallel ranks.
pub const KV_OFFLOAD_SIZE_GB: &str = "EREBINE_AGENT_KV_OFFLOAD_SIZE_GB";
/// Number of nodes sharing this host (divides the host's RAM).
pub(crate) const HOST_AGENT_COUNT: &str = "EREBINE_AGENT_HOST_AGENT_COUNT";
/// Cache directory of the disk tier.
pub const DISK_PATH: &str = "EREBINE_AGENT_LMCACHE_DISK_PATH";
/// Disk tier capacity in GiB; `0` disables the tier.
pub const DISK_SIZE_GB: &str = "EREBINE_AGENT_LMCACHE_DISK_SIZE_GB";
/// Chunk size in tokens.
pub(crate) const CHUNK_SIZE: &str = "EREBINE_AGENT_LMCACHE_CHUNK_SIZE";
/// ZMQ port the engine uses to reach the server.
pub(crate) const MP_PORT: &str = "EREBINE_AGENT_LMCACHE_MP_PORT";
/// Port of the server's HTTP frontend (`/status`).
pub(crate) const HTTP_PORT: &str = "EREBINE_AGENT_LMCACHE_HTTP_PORT";
/// Port of the node's Prometheus metrics endpoint; `0` turns it off.
pub const METRICS_PORT: &str = "EREBINE_AGENT_LMCACHE_METRICS_PORT";
/// Address the metrics endpoint listens on (default 127.0.0.1).
pub(crate) const METRICS_HOST: &str = "EREBINE_AGENT_LMCACHE_METRICS_HOST";
/// Executable that starts the cache server.
pub const LMCACHE_PATH: &str = "EREBINE_AGENT_LMCACHE_PATH";
/// The operator's L2 adapter JSON (object or array).
pub(crate) const L2_ADAPTER: &str = "EREBINE_AGENT_LMCACHE_L2_ADAPTER";
/// Log level of the LMCache server.
pub const LMCACHE_LOG_LEVEL: &str = "EREBINE_AGENT_LMCACHE_LOG_LEVEL";
/// The agent's own log level, the default of [`LMCACHE_LOG_LEVEL`].
pub(crate) const AGENT_LOG_LEVEL: &str = "EREBINE_AGENT_LOG_LEVEL";
/// Whitespace-separated flags appended to the server's command line.
pub(crate) const LMCACHE_EXTRA_ARGS: &str = crate::node::extra_args::VARIABLE;
/// JSON object merged into the engine's connector configuration.
pub(crate) const LMCACHE_EXTRA_CONFIG: &str = "EREBINE_AGENT_LMCACHE_EXTRA_CONFIG";
/// Bytes of KV a token of the engine's model (all layers, keys and values):
/// what the disk tier's read rate is turned into tokens a second with.
pub const KV_BYTES_PER_TOKEN: &str = "EREBINE_AGENT_LMCACHE_KV_BYTES_PER_TOKEN";
/// The cache volume's read rate in GB/s, or `probe` to measure it at start.
pub const DISK_READ_GBPS: &str = "EREBINE_AGENT_LMCACHE_DISK_READ_GBPS";
/// A file holding the LMCache server's HTTP API key (LMCache 0.5.7 on):
/// passed as `--api-key-file`, created (0600, a new key) when missing.
pub const API_KEY_FILE: &str = "EREBINE_AGENT_LMCACHE_API_KEY_FILE";
/// The fastest read rate [`DISK_READ_GBPS`] takes, GB/s: more is a typing
/// mistake (a PCIe 6 x16 link moves about 128 GB/s).
const MAX_READ_GBPS: f64 = 1000.0;
/// Lookup-hash records: a boolean (under the disk path) or an absolute path.
pub(crate) const LOOKUP_HASH_LOG_DIR: &str = "EREBINE_AGENT_LMCACHE_LOOKUP_HASH_LOG_DIR";
/// Seconds before a lookup-hash log file is rotated.
pub(crate) const LOOKUP_HASH_LOG_ROTATION_INTERVAL: &str =
    "EREBINE_AGENT_LMCACHE_LOOKUP_HASH_LOG_ROTATION_INTERVAL";
/// Bytes after which a lookup-hash log file is rotated.
pub(crate) const LOOKUP_HASH_LOG_ROTATION_MAX_SIZE: &str =
    "EREBINE_AGENT_LMCACHE_LOOKUP_HASH_LOG_ROTATION_MAX_SIZE";
/// Lookup-hash log files kept.
pub(crate) const LOOKUP_HASH_LOG_MAX_FILES: &str =
    "EREBINE_AGENT_LMCACHE_LOOKUP_HASH_LOG_MAX_FILES";

/// Default rotation interval of the lookup-hash log, seconds (6 h;
/// `docs/configuration.md`).
pub(crate) const DEFAULT_LOOKUP_HASH_LOG_ROTATION_INTERVAL: u64 = 21_600;
/// Default rotation size of the lookup-hash log, bytes (100 MiB;
/// `docs/configuration.md`).
pub(crate) const DEFAULT_LOOKUP_HASH_LOG_ROTATION_MAX_SIZE: u64 = 104_857_600;
/// Default number of lookup-hash log files kept (`docs/configuration.md`;
/// LMCache 0.5.6's own default is 100, the node passes 10).
pub(crate) const DEFAULT_LOOKUP_HASH_LOG_MAX_FILES: u32 = 10;
/// Directory under the disk path that a truthy
/// `EREBINE_AGENT_LMCACHE_LOOKUP_HASH_LOG_DIR` selects.
pub(crate) const LOOKUP_HASH_SUBDIR: &str = "lookup_hashes";

/// Default ZMQ port of the server (`docs/configuration.md`).
pub(crate) const DEFAULT_MP_PORT: u16 = 6555;
/// Default HTTP port of the server (`docs/configuration.md`).
pub(crate) const DEFAULT_HTTP_PORT: u16 = 8090;
/// Default port of the node's metrics endpoint (`docs/metrics.md`): beside
/// the server's HTTP port 8090, clear of LMCache's Prometheus fallback port
/// 9090, of vLLM's 8000 and of the kernel's ephemeral range.
pub const DEFAULT_METRICS_PORT: u16 = 8091;

/// An environment as the OS gives it: variable name -> value, bytes that
/// need not be UTF-8. Variables the node forwards to the server keep their
/// bytes; the `EREBINE_AGENT_*` values it reads must be text
/// ([`ConfigError::NotText`]).
pub type Vars = BTreeMap<OsString, OsString>;

/// The value of `name` in `vars` as text; `None` when it is unset or not
/// UTF-8.
pub fn text_var(vars: &Vars, name: &str) -> Option<String> {
    vars.get(OsStr::new(name))?.to_str().map(str::to_string)
}

/// This process's environment as [`Vars`].
pub fn process_vars() -> Vars {
    std::env::vars_os().collect()
}

/// [`Vars`] from text pairs (tests, and callers that hold a text map).
pub fn text_vars<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vars {
    pairs
        .into_iter()
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .collect()
}

/// The node's KV cache backend (`docs/configuration.md`,
/// `EREBINE_AGENT_KV_CACHE_BACKEND`): only [`KvCacheBackend::Lmcache`] runs
/// an LMCache server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheBackend {
    /// vLLM's built-in paged attention with CPU offload (the default): no
    /// cache server.
    #[default]
    Native,
    /// An LMCache server beside vLLM: L1 in CPU memory plus L2 tiers.
    Lmcache,
    /// No KV cache backend.
    None,
}

impl KvCacheBackend {
    /// Parses `native`, `lmcache` or `none` (ASCII case ignored); `variable`
    /// names the variable or flag in the error.
    pub fn parse(variable: &str, value: &str) -> Result<Self, ConfigError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "native" => Ok(KvCacheBackend::Native),
            "lmcache" => Ok(KvCacheBackend::Lmcache),
            "none" => Ok(KvCacheBackend::None),
            _ => Err(ConfigError::Invalid {
                variable: variable.to_string(),
                value: value.to_string(),
                expected: "write native, lmcache or none".to_string(),
            }),
        }
    }
}

impl fmt::Display for KvCacheBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvCacheBackend::Native => "native",
            KvCacheBackend::Lmcache => "lmcache",
            KvCacheBackend::None => "none",
        })
    }
}

/// Where and how the server writes lookup-hash records
/// (`--lookup-hash-log-*`; `docs/configuration.md`). The records fingerprint
/// prompt content: the directory is created at mode 0700.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LookupHashLog {
    /// The directory: `<disk path>/lookup_hashes` for a truthy value, else the
    /// absolute path given.
    pub dir: PathBuf,
    /// Seconds before a file is rotated (default 21600).
    pub rotation_interval_secs: u64,
    /// Bytes after which a file is rotated (default 104857600).
    pub rotation_max_size_bytes: u64,
    /// Files kept (default 10).
    pub max_files: u32,
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
    /// The metrics endpoint's address: `EREBINE_AGENT_LMCACHE_METRICS_HOST`
    /// (default 127.0.0.1) and `EREBINE_AGENT_LMCACHE_METRICS_PORT`
    /// (default 8091); `None` when the port is 0 ([`metrics_address`]).
    pub metrics: Option<std::net::SocketAddr>,
    /// `EREBINE_AGENT_LMCACHE_PATH`: the executable that starts the server.
    pub lmcache_path: Option<PathBuf>,
    /// `EREBINE_AGENT_LMCACHE_L2_ADAPTER`: replaces the built-in tier.
    pub l2_adapter: Option<Cascade>,
    /// `LMCACHE_LOG_LEVEL` for the server: `EREBINE_AGENT_LMCACHE_LOG_LEVEL`,
    /// else `EREBINE_AGENT_LOG_LEVEL`, else unset (LMCache's default), as
    /// the upper-case Python level name LMCache looks up (see
    /// [`lmcache_level`]).
    pub lmcache_log_level: Option<String>,
    /// `EREBINE_AGENT_KV_CACHE_BACKEND`, default `native`.
    pub kv_cache_backend: KvCacheBackend,
    /// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`, appended to the server's argv.
    pub extra_args: ExtraArgs,
    /// `EREBINE_AGENT_LMCACHE_EXTRA_CONFIG`: keys merged into the connector's
    /// `kv_connector_extra_config` (they win over the node's).
    pub extra_config: Map<String, Value>,
    /// `EREBINE_AGENT_LMCACHE_LOOKUP_HASH_LOG_DIR` and its rotation
    /// variables; `None` when off (the default).
    pub lookup_hash_log: Option<LookupHashLog>,
    /// `EREBINE_AGENT_LMCACHE_KV_BYTES_PER_TOKEN`, at least 1.
    pub kv_bytes_per_token: Option<u64>,
    /// `EREBINE_AGENT_LMCACHE_DISK_READ_GBPS`: the volume's read rate.
    pub disk_read: Option<DiskRead>,
    /// `EREBINE_AGENT_LMCACHE_API_KEY_FILE`: the server's API key file, an
    /// absolute path (`docs/configuration.md`, "The server's API key").
    pub api_key_file: Option<PathBuf>,
}

/// The cache volume's read rate as `EREBINE_AGENT_LMCACHE_DISK_READ_GBPS`
/// gives it (`docs/sizing.md`, "What the disk tier delivers").
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DiskRead {
    /// The operator's figure, bytes a second (the variable is in GB/s,
    /// 10^9 bytes).
    Stated(u64),
    /// `probe`: a launch (and `size`) measure it with a test file
    /// ([`lmcache_sizing::disk_load::probe_read`]).
    Probe,
}

impl DiskRead {
    /// Parses `value` of `variable`: `probe`, or GB/s above 0 up to 1000.
    ///
    /// Errors: [`ConfigError::Invalid`] naming the variable and the value.
    pub fn parse(variable: &str, value: &str) -> Result<Self, ConfigError> {
        if value.eq_ignore_ascii_case("probe") {
            return Ok(DiskRead::Probe);
        }
        match value.parse::<f64>() {
            Ok(gbps) if gbps > 0.0 && gbps <= MAX_READ_GBPS => Ok(DiskRead::Stated((gbps * 1e9) as u64)),
            _ => Err(ConfigError::Invalid {
                variable: variable.to_string(),
                value: value.to_string(),
                expected: format!("write the volume's read rate in GB/s (10^9 bytes a second) above 0 and up to {MAX_READ_GBPS}, e.g. 2.5, or `probe` to measure it at start"),
            }),
        }
    }
}

impl NodeEnv {
    /// Reads every variable from `vars` (name -> value). Empty values count
    /// as unset. `HOME` locates the default cache directory. Reads nothing
    /// but `vars`: a custom cascade's keys are checked here as far as no
    /// file is needed ([`crate::node::extensions::check_extension_keys`]); the
    /// rest is [`NodeEnv::check_tiers`].
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        let text = |name: &str| -> Result<Option<String>, ConfigError> {
            match vars.get(OsStr::new(name)).map(|v| v.to_str()) {
                None => Ok(None),
                Some(Some(value)) => Ok(Some(value.trim())
                    .filter(|v| !v.is_empty())
                    .map(str::to_string)),
                Some(None) => Err(ConfigError::NotText {
                    variable: name.to_string(),
                    why: text_reason(name),
                }),
            }
        };
        for name in TEXT_VARIABLES {
            text(name)?;
        }
        let get = |name: &str| text(name).ok().flatten();
        let get_path = |name: &str| {
            vars.get(OsStr::new(name))
                .filter(|v| !v.as_encoded_bytes().trim_ascii().is_empty())
                .map(PathBuf::from)
        };
        let disk_path = match get(DISK_PATH) {
            Some(p) => absolute_disk_path(&p, vars)?,
            None => default_disk_path(vars)?,
        };
        let env = NodeEnv {
            kv_offload_bytes: get(KV_OFFLOAD_SIZE_GB)
                .map(|v| parse_gib(KV_OFFLOAD_SIZE_GB, &v))
                .transpose()?,
            host_agent_count: get(HOST_AGENT_COUNT)
                .map(|v| parse_positive(HOST_AGENT_COUNT, &v, "the number of nodes on this host"))
                .transpose()?
                .unwrap_or(1),
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
            metrics: metrics_address(vars, DEFAULT_METRICS_PORT)?,
            lmcache_path: get_path(LMCACHE_PATH),
            l2_adapter: get(L2_ADAPTER)
                .map(|v| Cascade::parse(&v, L2_ADAPTER))
                .transpose()?,
            lmcache_log_level: {
                let agent = get(AGENT_LOG_LEVEL)
                    .map(|level| lmcache_level(AGENT_LOG_LEVEL, &level))
                    .transpose()?;
                match get(LMCACHE_LOG_LEVEL) {
                    Some(level) => Some(lmcache_level(LMCACHE_LOG_LEVEL, &level)?),
                    None => agent,
                }
            },
            kv_cache_backend: get(KV_CACHE_BACKEND)
                .map(|v| KvCacheBackend::parse(KV_CACHE_BACKEND, &v))
                .transpose()?
                .unwrap_or_default(),
            extra_args: get(LMCACHE_EXTRA_ARGS)
                .map(|v| ExtraArgs::parse(&v))
                .transpose()?
                .unwrap_or_default(),
            extra_config: get(LMCACHE_EXTRA_CONFIG)
                .map(|v| parse_json_object(LMCACHE_EXTRA_CONFIG, &v))
                .transpose()?
                .unwrap_or_default(),
            lookup_hash_log: lookup_hash_log(&get, &disk_path)?,
            kv_bytes_per_token: get(KV_BYTES_PER_TOKEN)
                .map(|v| {
                    parse_positive_u64(
                        KV_BYTES_PER_TOKEN,
                        &v,
                        "the bytes of KV a token of the model: 2 x layers x KV heads x head size x bytes of the KV dtype, e.g. 57344 for Qwen2-7B in bf16",
                    )
                })
                .transpose()?,
            disk_read: get(DISK_READ_GBPS)
                .map(|v| DiskRead::parse(DISK_READ_GBPS, &v))
                .transpose()?,
            api_key_file: get(API_KEY_FILE).map(|v| api_key_file(&v)).transpose()?,
            disk_path,
        };
        env.check_control_characters()?;
        if let Some((variable, tiers)) = env.custom_tiers() {
            crate::node::extensions::check_extension_keys(tiers, &get)
                .map_err(|problem| ConfigError::Tier { variable, problem })?;
        }
        Ok(env)
    }
}

impl NodeEnv {
    /// Checks the keys this project adds to a custom cascade
    /// (`EREBINE_AGENT_LMCACHE_L2_ADAPTER`, or `--l2-adapter` in
    /// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`) as the server's start would
    /// ([`crate::node::extensions::check_extensions`]; `vars` gives the `AWS_*`
    /// variables the server will get). It reads what the tiers name (an
    /// `s3_ca_bundle` file, the AWS files the variables point at) and
    /// resolves guarded `base_path`s, so it belongs to measuring
    /// ([`crate::Facts::measure`]), not to the pure plan. Writes nothing.
    ///
    /// Errors: [`ConfigError::Tier`], naming the variable, the tier and the
    /// key.
    pub fn check_tiers(&self, vars: &Vars) -> Result<(), ConfigError> {
        let Some(custom) = self.custom_tiers() else {
            return Ok(());
        };
        let get = |name: &str| {
            vars.get(OsStr::new(name))
                .and_then(|v| v.to_str())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        let (variable, tiers) = custom;
        crate::node::extensions::check_extensions(tiers, &get)
            .map_err(|problem| ConfigError::Tier { variable, problem })
    }

    /// Refuses every path the plan takes that holds a control character
    /// (`docs/configuration.md`, "Variables"): the disk path, the
    /// lookup-hash log directory and the `base_path` of each tier of a
    /// custom cascade. A newline, carriage return, tab, escape or delete
    /// in a path would split or colour the log's lines.
    ///
    /// Errors: [`ConfigError::Invalid`] naming the variable (and the tier).
    fn check_control_characters(&self) -> Result<(), ConfigError> {
        let mut paths = vec![(DISK_PATH.to_string(), self.disk_path.to_string_lossy())];
        if let Some(log) = &self.lookup_hash_log {
            paths.push((LOOKUP_HASH_LOG_DIR.to_string(), log.dir.to_string_lossy()));
        }
        if let Some(file) = &self.api_key_file {
            paths.push((API_KEY_FILE.to_string(), file.to_string_lossy()));
        }
        if let Some((variable, tiers)) = self.custom_tiers() {
            let base_paths = tiers.tiers().iter().enumerate();
            paths.extend(base_paths.filter_map(|(position, tier)| {
                let named = format!("{variable} (L2 tier {position} base_path)");
                tier.base_path().map(|path| (named, path.into()))
            }));
        }
        match paths.into_iter().find(|(_, path)| path.chars().any(char::is_control)) {
            Some((variable, path)) => Err(ConfigError::Invalid {
                variable,
                value: path.into_owned(),
                expected: "give a path without control characters: a newline, carriage return, tab, escape or delete in a path would split or colour the log's lines".to_string(),
            }),
            None => Ok(()),
        }
    }

    /// The custom cascade and the variable it came from, if any.
    pub(crate) fn custom_tiers(&self) -> Option<(&'static str, &Cascade)> {
        match (self.extra_args.l2_adapters(), &self.l2_adapter) {
            (Some(tiers), _) => Some((LMCACHE_EXTRA_ARGS, tiers)),
            (None, Some(tiers)) => Some((L2_ADAPTER, tiers)),
            (None, None) => None,
        }
    }

    /// Whether the node runs its built-in `fs_native` disk tier: no custom
    /// cascade (`EREBINE_AGENT_LMCACHE_L2_ADAPTER`, or `--l2-adapter` in
    /// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`) replaces it.
    pub(crate) fn builtin_tier(&self) -> bool {
        self.l2_adapter.is_none() && self.extra_args.l2_adapters().is_none()
    }

    /// The lookup-hash log directory the server gets: the node's, unless
    /// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` passes `--lookup-hash-log-dir`.
    pub(crate) fn lookup_hash_log_dir(&self) -> Option<&std::path::Path> {
        self.lookup_hash_log
            .as_ref()
            .filter(|_| !self.extra_args.replaces("--lookup-hash-log-dir"))
            .map(|log| log.dir.as_path())
    }

    /// The cascade that replaces the built-in disk tier, as a launch plans
    /// it: the `--l2-adapter`s of `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`, else
    /// `EREBINE_AGENT_LMCACHE_L2_ADAPTER`; `None`: the built-in `fs_native`
    /// tier in [`NodeEnv::disk_path`].
    pub fn custom_cascade(&self) -> Option<&Cascade> {
        self.extra_args.l2_adapters().or(self.l2_adapter.as_ref())
    }
}

/// Parses a boolean: `1`, `true`, `yes` or `0`, `false`, `no` (ASCII case
/// ignored). Anything else is an error naming `variable`, never read as off
/// (`docs/configuration.md`, "Variables").
pub(crate) fn parse_bool(variable: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        _ => Err(ConfigError::Invalid {
            variable: variable.to_string(),
            value: value.to_string(),
            expected: "write 1, true or yes to turn it on, 0, false or no to turn it off"
                .to_string(),
        }),
    }
}

fn parse_json_object(variable: &str, value: &str) -> Result<Map<String, Value>, ConfigError> {
    let invalid = |expected: String| ConfigError::Invalid {
        variable: variable.to_string(),
        value: value.to_string(),
        expected,
    };
    match serde_json::from_str::<Value>(value) {
        Ok(Value::Object(object)) => match lmcache_tier_spec::repeated::repeated_key(value) {
            Some(found) => Err(invalid(format!(
                "{}: write each key once (a JSON parser keeps only the last one)",
                found.detail
            ))),
            None => Ok(object),
        },
        Ok(_) => Err(invalid(
            "write one JSON object, e.g. {\"lmcache.mp.timeout\":30}".to_string(),
        )),
        Err(e) => Err(invalid(format!(
            "write one JSON object on one line without surrounding quotes ({e})"
        ))),
    }
}

fn lookup_hash_log(
    get: &dyn Fn(&str) -> Option<String>,
    disk_path: &std::path::Path,
) -> Result<Option<LookupHashLog>, ConfigError> {
    let rotation_interval_secs = get(LOOKUP_HASH_LOG_ROTATION_INTERVAL)
        .map(|v| parse_positive_u64(LOOKUP_HASH_LOG_ROTATION_INTERVAL, &v, "seconds, e.g. 21600"))
        .transpose()?
        .unwrap_or(DEFAULT_LOOKUP_HASH_LOG_ROTATION_INTERVAL);
    let rotation_max_size_bytes = get(LOOKUP_HASH_LOG_ROTATION_MAX_SIZE)
        .map(|v| {
            parse_positive_u64(
                LOOKUP_HASH_LOG_ROTATION_MAX_SIZE,
                &v,
                "bytes, e.g. 104857600",
            )
        })
        .transpose()?
        .unwrap_or(DEFAULT_LOOKUP_HASH_LOG_ROTATION_MAX_SIZE);
    let max_files = get(LOOKUP_HASH_LOG_MAX_FILES)
        .map(|v| parse_positive(LOOKUP_HASH_LOG_MAX_FILES, &v, "files kept, e.g. 10"))
        .transpose()?
        .unwrap_or(DEFAULT_LOOKUP_HASH_LOG_MAX_FILES);
    let Some(value) = get(LOOKUP_HASH_LOG_DIR) else {
        return Ok(None);
    };
    let dir = if value.starts_with('/') {
        PathBuf::from(&value)
    } else {
        match parse_bool(LOOKUP_HASH_LOG_DIR, &value) {
            Ok(true) => disk_path.join(LOOKUP_HASH_SUBDIR),
            Ok(false) => return Ok(None),
            Err(_) => {
                return Err(ConfigError::Invalid {
                    variable: LOOKUP_HASH_LOG_DIR.to_string(),
                    value,
                    expected: "write 1, true or yes (records under <disk path>/lookup_hashes), an absolute path, or 0, false or no (off)".to_string(),
                })
            }
        }
    };
    Ok(Some(LookupHashLog {
        dir,
        rotation_interval_secs,
        rotation_max_size_bytes,
        max_files,
    }))
}

/// `EREBINE_AGENT_LMCACHE_API_KEY_FILE`: an absolute path.
fn api_key_file(value: &str) -> Result<PathBuf, ConfigError> {
    match value.starts_with('/') {
        true => Ok(PathBuf::from(value)),
        false => Err(ConfigError::Invalid {
            variable: API_KEY_FILE.to_string(),
            value: value.to_string(),
            expected: "write the absolute path of a file holding one key on one line (the launch creates it, 0600, with a new key when it is missing)".to_string(),
        }),
    }
}

fn parse_positive_u64(variable: &str, value: &str, what: &str) -> Result<u64, ConfigError> {
    parse_whole(variable, value, 1, u64::MAX, what)
}

fn expand_home(path: &str, vars: &Vars) -> PathBuf {
    match (path.strip_prefix("~/"), vars.get(OsStr::new("HOME"))) {
        (Some(rest), Some(home)) if !home.is_empty() => PathBuf::from(home).join(rest),
        _ => PathBuf::from(path),
    }
}

/// The default disk tier directory, `$HOME/.cache/erebine/lmcache`. `HOME`
/// must then be an absolute UTF-8 path: the directory goes into LMCache's
/// JSON spec, and a relative one would be read against the current
/// directory.
fn default_disk_path(vars: &Vars) -> Result<PathBuf, ConfigError> {
    const DEFAULT: &str = "~/.cache/erebine/lmcache";
    let home = vars.get(OsStr::new("HOME")).filter(|h| !h.is_empty());
    let invalid = |value: String, expected: &str| ConfigError::Invalid {
        variable: "HOME".to_string(),
        value,
        expected: format!(
            "{expected}: the default disk tier directory is {DEFAULT}; or set {DISK_PATH}"
        ),
    };
    match home.map(|h| h.to_str()) {
        None => Err(invalid(String::new(), "set HOME to an absolute path")),
        Some(None) => Err(ConfigError::NotText {
            variable: "HOME".to_string(),
            why: "the default disk tier directory is under it, and LMCache takes it inside a JSON spec (or set EREBINE_AGENT_LMCACHE_DISK_PATH)",
        }),
        Some(Some(home)) if !home.starts_with('/') => {
            Err(invalid(home.to_string(), "give HOME as an absolute path"))
        }
        Some(Some(_)) => Ok(expand_home(DEFAULT, vars)),
    }
}

/// `EREBINE_AGENT_LMCACHE_DISK_PATH` as given, `~/` expanded from `HOME`:
/// it must then be absolute, whatever the backend, so that `launch`,
/// `inspect` and `size` never read it against the current directory.
fn absolute_disk_path(value: &str, vars: &Vars) -> Result<PathBuf, ConfigError> {
    let path = expand_home(value, vars);
    if path.to_str().is_none() {
        return Err(ConfigError::NotText {
            variable: "HOME".to_string(),
            why: "EREBINE_AGENT_LMCACHE_DISK_PATH starts with ~/, and LMCache takes the directory inside a JSON spec",
        });
    }
    match path.is_absolute() {
        true => Ok(path),
        false => Err(ConfigError::Invalid {
            variable: DISK_PATH.to_string(),
            value: value.to_string(),
            expected: "give an absolute path (a leading ~/ is expanded from HOME)".to_string(),
        }),
    }
}

/// The `EREBINE_AGENT_*` variables whose values must be UTF-8 text: every
/// one but [`LMCACHE_PATH`], an executable the node runs by its bytes.
const TEXT_VARIABLES: &[&str] = &[
    KV_CACHE_BACKEND,
    KV_OFFLOAD_SIZE_GB,
    HOST_AGENT_COUNT,
    DISK_PATH,
    DISK_SIZE_GB,
    CHUNK_SIZE,
    MP_PORT,
    HTTP_PORT,
    METRICS_PORT,
    METRICS_HOST,
    L2_ADAPTER,
    LMCACHE_LOG_LEVEL,
    AGENT_LOG_LEVEL,
    LMCACHE_EXTRA_ARGS,
    LMCACHE_EXTRA_CONFIG,
    LOOKUP_HASH_LOG_DIR,
    LOOKUP_HASH_LOG_ROTATION_INTERVAL,
    LOOKUP_HASH_LOG_ROTATION_MAX_SIZE,
    LOOKUP_HASH_LOG_MAX_FILES,
    KV_BYTES_PER_TOKEN,
    DISK_READ_GBPS,
];

/// Why variable `name` of [`TEXT_VARIABLES`] must be text.
fn text_reason(name: &str) -> &'static str {
    match name {
        DISK_PATH => "LMCache takes the disk tier's directory inside a JSON spec",
        LOOKUP_HASH_LOG_DIR => "it is read as a boolean or as an absolute path",
        L2_ADAPTER | LMCACHE_EXTRA_CONFIG => "it is JSON",
        LMCACHE_EXTRA_ARGS => "it is read as flags for LMCache's command line",
        _ => "it is a number or a name",
    }
}

/// The Python logging level name LMCache 0.5.6 reads from
/// `LMCACHE_LOG_LEVEL` for a level written in any case: `DEBUG`, `INFO`,
/// `WARNING`, `ERROR`, `CRITICAL`, with the agent's `trace` as `DEBUG` and
/// `warn`/`fatal` as `WARNING`/`CRITICAL`. LMCache itself (`lmcache/logging.py`)
/// falls back to `INFO` without a word for a name it does not know, so a typo
/// is an error here instead.
pub fn lmcache_level(variable: &str, value: &str) -> Result<String, ConfigError> {
    let level = match value.trim().to_ascii_lowercase().as_str() {
        "trace" | "debug" => "DEBUG",
        "info" => "INFO",
        "warn" | "warning" => "WARNING",
        "error" => "ERROR",
        "fatal" | "critical" => "CRITICAL",
        _ => {
            return Err(ConfigError::Invalid {
                variable: variable.to_string(),
                value: value.to_string(),
                expected: "write one of debug, info, warning, error, critical".to_string(),
            })
        }
    };
    Ok(level.to_string())
}

fn parse_positive(variable: &str, value: &str, what: &str) -> Result<u32, ConfigError> {
    parse_whole(variable, value, 1, u32::MAX, what)
}

/// Where a metrics endpoint listens, from
/// `EREBINE_AGENT_LMCACHE_METRICS_PORT` (else `default_port`) and
/// `EREBINE_AGENT_LMCACHE_METRICS_HOST` alone; `None` when the port is 0.
/// A launch's default is [`DEFAULT_METRICS_PORT`]; `erebine-lmcache` run
/// alone, which reads no other node variable, passes 0: the drop-in
/// behaves as the stock `lmcache server` does unless asked for more, and
/// listens on no port of its own by default (`docs/metrics.md`).
///
/// Errors: [`ConfigError::Invalid`] for a bad port or address, or one that
/// is not UTF-8 text.
pub fn metrics_address(
    vars: &Vars,
    default_port: u16,
) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    let text = |name: &str| -> Result<Option<String>, ConfigError> {
        match vars.get(OsStr::new(name)).map(|v| v.to_str()) {
            None => Ok(None),
            Some(Some(v)) => Ok(Some(v.trim()).filter(|v| !v.is_empty()).map(str::to_string)),
            Some(None) => Err(ConfigError::NotText {
                variable: name.to_string(),
                why: text_reason(name),
            }),
        }
    };
    let port = match text(METRICS_PORT)? {
        Some(v) => parse_port_or_off(METRICS_PORT, &v)?,
        None => default_port,
    };
    let host = match text(METRICS_HOST)? {
        Some(v) => parse_host(METRICS_HOST, &v)?,
        None => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
    };
    Ok((port > 0).then_some(std::net::SocketAddr::new(host, port)))
}

/// A port, or 0 for "off".
fn parse_port_or_off(variable: &str, value: &str) -> Result<u16, ConfigError> {
    match value.trim() {
        "0" => Ok(0),
        _ => parse_port(variable, value).map_err(|_| ConfigError::Invalid {
            variable: variable.to_string(),
            value: value.to_string(),
            expected: "write a TCP port from 1 to 65535, or 0 to turn it off".to_string(),
        }),
    }
}

/// An IP address to listen on (no host names: nothing is resolved; no
/// multicast or broadcast address, which a listener can bind but nothing
/// can connect to).
fn parse_host(variable: &str, value: &str) -> Result<std::net::IpAddr, ConfigError> {
    let unusable = |ip: &std::net::IpAddr| match ip {
        std::net::IpAddr::V4(v4) => v4.is_multicast() || v4.is_broadcast(),
        std::net::IpAddr::V6(v6) => v6.is_multicast(),
    };
    value
        .trim()
        .parse()
        .ok()
        .filter(|ip| !unusable(ip))
        .ok_or_else(|| ConfigError::Invalid {
            variable: variable.to_string(),
            value: value.to_string(),
            expected: "write an IP address to listen on: 127.0.0.1 (the default, this host only), 0.0.0.0 or :: (every interface), or one of the host's unicast addresses".to_string(),
        })
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
    use std::path::Path;

    /// `pairs` on top of `HOME=/home/n`.
    fn vars(pairs: &[(&str, &str)]) -> Vars {
        text_vars(
            [("HOME", "/home/n")]
                .into_iter()
                .chain(pairs.iter().copied()),
        )
    }

    #[test]
    fn the_api_key_file_is_an_absolute_path_of_one_line() {
        let env = NodeEnv::from_vars(&vars(&[(API_KEY_FILE, "/run/keys/lmcache")])).unwrap();
        assert_eq!(env.api_key_file, Some(PathBuf::from("/run/keys/lmcache")));
        assert_eq!(NodeEnv::from_vars(&vars(&[])).unwrap().api_key_file, None);
        for value in ["keys/lmcache", "./k", "~/k", "/run/k\nX", "/run/k\x1b[31m"] {
            let e = NodeEnv::from_vars(&vars(&[(API_KEY_FILE, value)])).unwrap_err();
            assert!(e.to_string().contains(API_KEY_FILE), "{value:?}: {e}");
        }
    }

    #[test]
    fn the_disk_read_rate_is_gb_per_s_or_probe_and_anything_else_is_named() {
        for (value, read) in [
            ("2.5", DiskRead::Stated(2_500_000_000)),
            ("0.1", DiskRead::Stated(100_000_000)),
            ("1000", DiskRead::Stated(1_000_000_000_000)),
            ("probe", DiskRead::Probe),
            ("PROBE", DiskRead::Probe),
        ] {
            let env = NodeEnv::from_vars(&vars(&[(DISK_READ_GBPS, value)])).unwrap();
            assert_eq!(env.disk_read, Some(read), "{value}");
        }
        for value in ["0", "-1", "NaN", "inf", "1e400", "1001", "fast", "2.5GB/s"] {
            let e = NodeEnv::from_vars(&vars(&[(DISK_READ_GBPS, value)])).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains(DISK_READ_GBPS) && text.contains("`probe`"),
                "{value}: {text}"
            );
        }
        assert_eq!(NodeEnv::from_vars(&vars(&[])).unwrap().disk_read, None);
        let env = NodeEnv::from_vars(&vars(&[(KV_BYTES_PER_TOKEN, "57344")])).unwrap();
        assert_eq!(env.kv_bytes_per_token, Some(57_344));
        for value in ["0", "-5", "1.5", "lots"] {
            let e = NodeEnv::from_vars(&vars(&[(KV_BYTES_PER_TOKEN, value)])).unwrap_err();
            assert!(e.to_string().contains(KV_BYTES_PER_TOKEN), "{value}: {e}");
        }
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
        assert_eq!(env.kv_cache_backend, KvCacheBackend::Native);
        assert_eq!(env.extra_args, ExtraArgs::default());
        assert!(env.extra_config.is_empty());
        assert_eq!(env.lookup_hash_log, None);
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

    /// Whatever the variable, an error quotes at most the first 80
    /// characters of its value, escaped, with the value's length.
    #[test]
    fn errors_quote_a_value_cut_and_escaped() {
        let long_json = format!("{{\"a\":\"{}\"", "x".repeat(100_000));
        let long_word = format!("--chunk-size 1{}", "0".repeat(5_000));
        let cases = [
            (LMCACHE_EXTRA_CONFIG, long_json.as_str()),
            (KV_OFFLOAD_SIZE_GB, &long_json[..50_000]),
            (LMCACHE_EXTRA_ARGS, long_word.as_str()),
            (LMCACHE_LOG_LEVEL, "info\u{1b}[31m\nFAKE LINE"),
            (KV_CACHE_BACKEND, "lmcache\r\u{7f}"),
        ];
        for (var, val) in cases {
            let err = NodeEnv::from_vars(&vars(&[(var, val)]))
                .unwrap_err()
                .to_string();
            assert!(err.len() < 700, "{var}: {} bytes: {err}", err.len());
            assert!(!err.chars().any(char::is_control), "{var}: {err:?}");
            if val.len() > 80 {
                assert!(
                    err.contains("…\" (") && err.contains(" bytes)"),
                    "{var}: {err}"
                );
            }
        }
    }

    /// A number too large for its type is refused as too large, naming
    /// the largest value accepted.
    #[test]
    fn values_too_large_for_their_type_name_the_largest_accepted() {
        let cases = [
            (CHUNK_SIZE, "4294967296", "4294967295"),
            (HOST_AGENT_COUNT, "4294967296", "4294967295"),
            (HOST_AGENT_COUNT, "99999999999999999999999", "4294967295"),
            (LOOKUP_HASH_LOG_MAX_FILES, "4294967296", "4294967295"),
            (
                LOOKUP_HASH_LOG_ROTATION_INTERVAL,
                "18446744073709551616",
                "18446744073709551615",
            ),
            (
                LOOKUP_HASH_LOG_ROTATION_MAX_SIZE,
                "+99999999999999999999",
                "18446744073709551615",
            ),
            (KV_OFFLOAD_SIZE_GB, "99999999999", "17179869183"),
            (DISK_SIZE_GB, "1e30", "17179869183"),
            (LMCACHE_EXTRA_ARGS, "--chunk-size 4294967296", "4294967295"),
            (
                LMCACHE_EXTRA_ARGS,
                "--max-gpu-workers 1_0000000000",
                "4294967295",
            ),
            (
                LMCACHE_EXTRA_ARGS,
                "--l1-size-gb 99999999999",
                "17179869183",
            ),
        ];
        for (var, val, largest) in cases {
            let err = NodeEnv::from_vars(&vars(&[(var, val)]))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(var) && err.contains("too large"),
                "{var}={val}: {err}"
            );
            assert!(err.contains(largest), "{var}={val}: {err}");
        }
        let fits = NodeEnv::from_vars(&vars(&[
            (CHUNK_SIZE, "4294967295"),
            (KV_OFFLOAD_SIZE_GB, "17179869183"),
        ]))
        .unwrap();
        assert_eq!(fits.chunk_size, Some(u32::MAX));
    }

    #[test]
    fn log_level_falls_back_to_the_agent_level() {
        let env = NodeEnv::from_vars(&vars(&[(AGENT_LOG_LEVEL, "trace")])).unwrap();
        assert_eq!(env.lmcache_log_level.as_deref(), Some("DEBUG"));
        let env = NodeEnv::from_vars(&vars(&[
            (AGENT_LOG_LEVEL, "debug"),
            (LMCACHE_LOG_LEVEL, "Info"),
        ]))
        .unwrap();
        assert_eq!(env.lmcache_log_level.as_deref(), Some("INFO"));
    }

    #[test]
    fn an_unknown_log_level_names_the_variable_it_came_from() {
        for (var, other) in [
            (LMCACHE_LOG_LEVEL, AGENT_LOG_LEVEL),
            (AGENT_LOG_LEVEL, LMCACHE_LOG_LEVEL),
        ] {
            let err = NodeEnv::from_vars(&vars(&[(var, "verbose"), (other, "info")]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(var) && err.contains("verbose"), "{err}");
            assert!(err.contains("debug, info, warning"), "{err}");
        }
    }

    #[test]
    fn adapter_json_errors_name_the_variable() {
        let err = NodeEnv::from_vars(&vars(&[(L2_ADAPTER, "{not json")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(L2_ADAPTER), "{err}");
    }

    /// Every variable: a good value and what it becomes.
    #[test]
    fn every_variable_is_read() {
        type Check = fn(&NodeEnv) -> bool;
        let cases: &[(&str, &str, Check)] = &[
            (KV_CACHE_BACKEND, "lmcache", |e| {
                e.kv_cache_backend == KvCacheBackend::Lmcache
            }),
            (KV_CACHE_BACKEND, "None", |e| {
                e.kv_cache_backend == KvCacheBackend::None
            }),
            (KV_CACHE_BACKEND, "native", |e| {
                e.kv_cache_backend == KvCacheBackend::Native
            }),
            (KV_OFFLOAD_SIZE_GB, "16", |e| {
                e.kv_offload_bytes == Some(16 * GIB)
            }),
            (HOST_AGENT_COUNT, "4", |e| e.host_agent_count == 4),
            (DISK_PATH, "/data/c", |e| {
                e.disk_path == Path::new("/data/c")
            }),
            (DISK_PATH, "~/c", |e| e.disk_path == Path::new("/home/n/c")),
            (DISK_SIZE_GB, "150", |e| {
                e.disk_size_bytes == Some(150 * GIB)
            }),
            (CHUNK_SIZE, "512", |e| e.chunk_size == Some(512)),
            (MP_PORT, "7555", |e| e.mp_port == 7555),
            (HTTP_PORT, "9090", |e| e.http_port == 9090),
            (LMCACHE_PATH, "/usr/local/bin/erebine-lmcache", |e| {
                e.lmcache_path.as_deref() == Some(Path::new("/usr/local/bin/erebine-lmcache"))
            }),
            (L2_ADAPTER, "[]", |e| {
                e.l2_adapter == Some(Cascade::default())
            }),
            (L2_ADAPTER, r#"{"type":"fs","base_path":"/x"}"#, |e| {
                e.l2_adapter.as_ref().map(|c| c.tiers().len()) == Some(1)
            }),
            (LMCACHE_LOG_LEVEL, "warning", |e| {
                e.lmcache_log_level.as_deref() == Some("WARNING")
            }),
            (AGENT_LOG_LEVEL, "debug", |e| {
                e.lmcache_log_level.as_deref() == Some("DEBUG")
            }),
            (LMCACHE_EXTRA_ARGS, "--chunk-size 512 --quiet", |e| {
                e.extra_args.value("--chunk-size") == Some("512") && e.extra_args.args().len() == 3
            }),
            (LMCACHE_EXTRA_CONFIG, r#"{"lmcache.mp.timeout":30}"#, |e| {
                e.extra_config.get("lmcache.mp.timeout") == Some(&Value::from(30))
            }),
            (LOOKUP_HASH_LOG_DIR, "1", |e| {
                e.lookup_hash_log.as_ref().map(|l| l.dir.clone())
                    == Some(PathBuf::from(
                        "/home/n/.cache/erebine/lmcache/lookup_hashes",
                    ))
            }),
            (LOOKUP_HASH_LOG_DIR, "YES", |e| e.lookup_hash_log.is_some()),
            (LOOKUP_HASH_LOG_DIR, "true", |e| e.lookup_hash_log.is_some()),
            (LOOKUP_HASH_LOG_DIR, "/var/log/lh", |e| {
                e.lookup_hash_log.as_ref().map(|l| l.dir.clone())
                    == Some(PathBuf::from("/var/log/lh"))
            }),
            (LOOKUP_HASH_LOG_DIR, "0", |e| e.lookup_hash_log.is_none()),
            (LOOKUP_HASH_LOG_DIR, "no", |e| e.lookup_hash_log.is_none()),
            (LOOKUP_HASH_LOG_DIR, "False", |e| {
                e.lookup_hash_log.is_none()
            }),
            (LOOKUP_HASH_LOG_ROTATION_INTERVAL, "3600", |e| {
                e.lookup_hash_log.is_none()
            }),
        ];
        for (var, val, check) in cases {
            let env = NodeEnv::from_vars(&vars(&[("HOME", "/home/n"), (var, val)]))
                .unwrap_or_else(|e| panic!("{var}={val}: {e}"));
            assert!(check(&env), "{var}={val}: {env:#?}");
        }
    }

    #[test]
    fn lookup_hash_rotation_defaults_and_overrides() {
        let on = NodeEnv::from_vars(&vars(&[(LOOKUP_HASH_LOG_DIR, "/l")])).unwrap();
        assert_eq!(
            on.lookup_hash_log,
            Some(LookupHashLog {
                dir: PathBuf::from("/l"),
                rotation_interval_secs: 21_600,
                rotation_max_size_bytes: 104_857_600,
                max_files: 10,
            })
        );
        let tuned = NodeEnv::from_vars(&vars(&[
            (LOOKUP_HASH_LOG_DIR, "/l"),
            (LOOKUP_HASH_LOG_ROTATION_INTERVAL, "60"),
            (LOOKUP_HASH_LOG_ROTATION_MAX_SIZE, "1048576"),
            (LOOKUP_HASH_LOG_MAX_FILES, "3"),
        ]))
        .unwrap()
        .lookup_hash_log
        .unwrap();
        assert_eq!(
            (
                tuned.rotation_interval_secs,
                tuned.rotation_max_size_bytes,
                tuned.max_files
            ),
            (60, 1_048_576, 3)
        );
    }

    /// Every variable: bad values are refused with the variable's name and
    /// what to write.
    #[test]
    fn every_variable_refuses_bad_values() {
        let cases = [
            (KV_CACHE_BACKEND, "vllm", "native, lmcache or none"),
            (KV_CACHE_BACKEND, "1", "native, lmcache or none"),
            (LMCACHE_EXTRA_CONFIG, "[1]", "one JSON object"),
            (LMCACHE_EXTRA_CONFIG, "{\"a\":", "one JSON object"),
            (LMCACHE_EXTRA_CONFIG, "'{}'", "without surrounding quotes"),
            (LMCACHE_EXTRA_ARGS, "--chunk-size x", "write a whole number"),
            (LMCACHE_EXTRA_ARGS, "--chunk-size 0", "at least 1"),
            (
                LMCACHE_EXTRA_ARGS,
                "--foo",
                "not a flag of `lmcache server`",
            ),
            (LMCACHE_EXTRA_ARGS, "--host 0.0.0.0", "127.0.0.1"),
            (LOOKUP_HASH_LOG_DIR, "on", "an absolute path"),
            (LOOKUP_HASH_LOG_DIR, "logs/lh", "an absolute path"),
            (LOOKUP_HASH_LOG_ROTATION_INTERVAL, "6h", "seconds"),
            (LOOKUP_HASH_LOG_ROTATION_INTERVAL, "0", "at least 1"),
            (LOOKUP_HASH_LOG_ROTATION_MAX_SIZE, "100MB", "bytes"),
            (LOOKUP_HASH_LOG_MAX_FILES, "-1", "files kept"),
            (L2_ADAPTER, "[{\"type\":\"fs\",}]", "column"),
            (L2_ADAPTER, "[3]", "not a JSON object"),
            (
                L2_ADAPTER,
                r#"{"type":"fs","base_path":"/t","max_capacity_gb":-5}"#,
                "L2 tier 0 (base_path /t): max_capacity_gb = -5",
            ),
            (
                L2_ADAPTER,
                r#"[{"type":"fs","base_path":"/t","max_capacity_gb":1},{"type":"fs","base_path":"/t/","max_capacity_gb":2}]"#,
                "L2 tiers 0 (base_path /t) and 1 (base_path /t/) are the same directory",
            ),
            (
                L2_ADAPTER,
                r#"[{"type":"s3","s3_endpoint":"s.example","s3_bucket":"Bad_Name","s3_region":"r"}]"#,
                "L2 tier 0 (s3): s3_bucket",
            ),
            (
                L2_ADAPTER,
                r#"{"type":"s3","s3_endpoint":"s.example","s3_bucket":"b1b"}"#,
                "s3_region: is missing",
            ),
            (
                LMCACHE_EXTRA_ARGS,
                r#"--l2-adapter {"type":"fs","base_path":"/t","max_capacity_gb":"x"}"#,
                "max_capacity_gb",
            ),
        ];
        for (var, val, needle) in cases {
            let err = NodeEnv::from_vars(&vars(&[(var, val)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(var), "{var}={val}: {err}");
            assert!(err.contains(needle), "{var}={val}: {err}");
        }
    }

    #[test]
    fn booleans_take_three_spellings_each_and_nothing_else() {
        for (value, expected) in [
            ("1", true),
            ("true", true),
            ("yes", true),
            ("TRUE", true),
            ("0", false),
            ("false", false),
            ("no", false),
            ("No", false),
        ] {
            assert_eq!(parse_bool("V", value), Ok(expected), "{value}");
        }
        for value in ["on", "off", "2", "y", "n", ""] {
            let err = parse_bool("EREBINE_AGENT_X", value)
                .unwrap_err()
                .to_string();
            assert!(err.contains("EREBINE_AGENT_X"), "{err}");
            assert!(err.contains("write 1, true or yes"), "{err}");
        }
    }

    #[test]
    fn a_relative_disk_path_is_refused_whatever_the_backend() {
        for backend in ["native", "none", "lmcache"] {
            for (home, path) in [("/h", "cache"), ("/h", "./cache"), ("rel", "~/c")] {
                let err = NodeEnv::from_vars(&vars(&[
                    ("HOME", home),
                    (KV_CACHE_BACKEND, backend),
                    (DISK_PATH, path),
                ]))
                .unwrap_err()
                .to_string();
                assert!(err.contains(DISK_PATH), "{err}");
                assert!(err.contains("give an absolute path"), "{err}");
            }
            // The default directory is under HOME: it must be absolute too.
            for home in ["", "rel", "."] {
                let err = NodeEnv::from_vars(&vars(&[("HOME", home), (KV_CACHE_BACKEND, backend)]))
                    .unwrap_err()
                    .to_string();
                assert!(err.starts_with("HOME="), "{err}");
                assert!(err.contains("absolute path"), "{err}");
            }
            let mut no_home = vars(&[(KV_CACHE_BACKEND, backend)]);
            no_home.remove(OsStr::new("HOME"));
            let err = NodeEnv::from_vars(&no_home).unwrap_err().to_string();
            assert!(err.contains("set HOME to an absolute path"), "{err}");
        }
    }

    #[test]
    fn text_variables_that_are_not_utf8_are_refused_by_name() {
        use std::os::unix::ffi::OsStringExt;
        for name in TEXT_VARIABLES {
            let mut given = vars(&[("HOME", "/home/n")]);
            given.insert(name.into(), OsString::from_vec(b"/tmp/nu\xff".to_vec()));
            let err = NodeEnv::from_vars(&given).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("{name} is not UTF-8 text")),
                "{err}"
            );
        }
        let mut given = vars(&[]);
        let exe = OsString::from_vec(b"/opt/bin/erebine-lmcache\xff".to_vec());
        given.insert(LMCACHE_PATH.into(), exe.clone());
        let env = NodeEnv::from_vars(&given).unwrap();
        assert_eq!(env.lmcache_path, Some(PathBuf::from(exe)));
        given.insert("HOME".into(), OsString::from_vec(b"/home/\xff".to_vec()));
        let err = NodeEnv::from_vars(&given).unwrap_err().to_string();
        assert!(err.starts_with("HOME is not UTF-8 text"), "{err}");
        given.insert(DISK_PATH.into(), "~/cache".into());
        let err = NodeEnv::from_vars(&given).unwrap_err().to_string();
        assert!(err.starts_with("HOME is not UTF-8 text"), "{err}");
        given.insert(DISK_PATH.into(), "/data/cache".into());
        assert_eq!(
            NodeEnv::from_vars(&given).unwrap().disk_path,
            Path::new("/data/cache")
        );
    }

    #[test]
    fn empty_values_count_as_unset() {
        let env = NodeEnv::from_vars(&vars(&[(MP_PORT, ""), (DISK_PATH, " ")])).unwrap();
        assert_eq!(env.mp_port, 6555);
    }
}
