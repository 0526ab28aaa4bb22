//! [`ConfigError`], the error of every variable the node reads, and the
//! parsers of values that more than one variable shares. It sits below the
//! modules that read variables ([`crate::node::env`], [`crate::node::extra_args`]).

use lmcache_sizing::gib_to_bytes;
use lmcache_tier_spec::{shown_value, SpecError};

/// A variable with a value the node cannot use.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    /// A value that does not parse or is out of range.
    #[error("{variable}={} is not valid: {expected}", shown_value(value))]
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
    ExtraArgs(#[from] crate::node::server_flags::ArgError),
    /// The adapter JSON is unusable.
    #[error(transparent)]
    Adapter(#[from] SpecError),
    /// Two listeners of the launch on one port ([`crate::node::ports`]).
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
    /// `s3_bucket` settings ([`crate::node::extensions::check_extensions`]).
    #[error("{variable}: {problem}")]
    Tier {
        /// The variable whose cascade holds the tier.
        variable: &'static str,
        /// The problem, naming the tier, the key and what to write.
        problem: crate::node::extensions::ExtensionError,
    },
}

/// The largest size in GiB a variable or flag takes: the largest whole
/// number of GiB whose bytes fit in 64 bits (`docs/configuration.md`,
/// "Variables").
pub const MAX_GIB: u64 = u64::MAX / lmcache_sizing::GIB;

/// Parses a size in GiB (`"16"`, `"0.5"`, `"0"`) into bytes. `variable`
/// names the variable or flag in the error; a size whose bytes pass 64 bits
/// is refused as too large, naming [`MAX_GIB`].
pub(crate) fn parse_gib(variable: &str, value: &str) -> Result<u64, ConfigError> {
    let invalid = |expected: String| ConfigError::Invalid {
        variable: variable.to_string(),
        value: value.to_string(),
        expected,
    };
    let number = value.trim().parse::<f64>().ok();
    if let Some(bytes) = number.and_then(gib_to_bytes) {
        return Ok(bytes);
    }
    let spelled_in_digits = value
        .trim()
        .starts_with(|c: char| c.is_ascii_digit() || c == '.' || c == '+');
    match number {
        Some(gib) if gib > 0.0 && spelled_in_digits => Err(invalid(format!(
            "it is too large: write a size in GiB from 0 to {MAX_GIB}, e.g. 16 or 0.5"
        ))),
        _ => Err(invalid(
            "write a non-negative size in GiB, e.g. 16 or 0.5".to_string(),
        )),
    }
}

/// Parses a whole number from `min` to `max` of type `T` (`what` says what
/// it counts, e.g. "a chunk size in tokens, e.g. 256"). `variable` names
/// the variable or flag in the error; a number above `max` is refused as
/// too large, naming `max`.
pub(crate) fn parse_whole<T>(
    variable: &str,
    value: &str,
    min: T,
    max: T,
    what: &str,
) -> Result<T, ConfigError>
where
    T: Copy + Into<u64> + TryFrom<u64> + std::fmt::Display,
{
    let invalid = |expected: String| ConfigError::Invalid {
        variable: variable.to_string(),
        value: value.to_string(),
        expected,
    };
    let text = value.trim();
    let digits = text.strip_prefix('+').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(format!(
            "write a whole number of at least {min}: {what}"
        )));
    }
    let number = digits.parse::<u64>().ok().filter(|n| *n <= max.into());
    match number.and_then(|n| T::try_from(n).ok()) {
        Some(n) if n.into() >= min.into() => Ok(n),
        Some(_) => Err(invalid(format!(
            "write a whole number of at least {min}: {what}"
        ))),
        None => Err(invalid(format!(
            "it is too large: write a whole number from {min} to {max}: {what}"
        ))),
    }
}
