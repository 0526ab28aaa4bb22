//! [`ConfigError`], the error of every variable the node reads, and the
//! parsers of values that more than one variable shares. It sits below the
//! modules that read variables ([`crate::env`], [`crate::extra_args`]).

use lmcache_sizing::gib_to_bytes;
use lmcache_tier_spec::SpecError;

/// A variable with a value the node cannot use.
#[derive(Debug, thiserror::Error, PartialEq)]
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
    /// A value that is not UTF-8 text, for a variable whose meaning is text
    /// (a number, JSON, a log level, a path LMCache takes inside JSON).
    #[error("{variable} is not UTF-8 text: {why}; write it in UTF-8")]
    NotText {
        /// The variable at fault.
        variable: String,
        /// Why this variable must be text.
        why: &'static str,
    },
    /// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` holds what LMCache's server
    /// parser would refuse.
    #[error("EREBINE_AGENT_LMCACHE_EXTRA_ARGS: {0}; LMCache's server would refuse it at start")]
    ExtraArgs(#[from] crate::server_flags::ArgError),
    /// The adapter JSON is unusable.
    #[error(transparent)]
    Adapter(#[from] SpecError),
    /// Two listeners of the launch on one port ([`crate::ports`]).
    #[error("{first} and {second} both ask for port {port} on 127.0.0.1: only one could listen there, and the server would fail at start. Give each its own port")]
    PortClash {
        /// The first setting with its value and role.
        first: String,
        /// The second setting with its value and role.
        second: String,
        /// The port both ask for.
        port: u16,
    },
    /// A tier the server would refuse at start: a bad `max_capacity_gb` or
    /// `eviction` block, two guarded tiers in one directory, or unusable
    /// `s3_bucket` settings ([`crate::extensions::check_extensions`]).
    #[error("{variable}: {problem}")]
    Tier {
        /// The variable whose cascade holds the tier.
        variable: &'static str,
        /// The problem, naming the tier, the key and what to write.
        problem: crate::extensions::ExtensionError,
    },
}

/// Parses a size in GiB (`"16"`, `"0.5"`, `"0"`) into bytes. `variable`
/// names the variable or flag in the error.
pub(crate) fn parse_gib(variable: &str, value: &str) -> Result<u64, ConfigError> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .and_then(gib_to_bytes)
        .ok_or_else(|| ConfigError::Invalid {
            variable: variable.to_string(),
            value: value.to_string(),
            expected: "write a non-negative size in GiB, e.g. 16 or 0.5".to_string(),
        })
}
