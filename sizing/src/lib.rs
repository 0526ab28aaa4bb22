//! Sizing rules for the LMCache tiers of one inference node, and the host
//! probes that feed them.
//!
//! Every rule returns a [`Decision`]: the value and the reason that produced
//! it, so the launch log line, `lmcache-tier size --explain` and `inspect` can
//! say why a node chose a number. The rules are pure functions of their inputs
//! ([`rules`]); the probes ([`probe`]) read the host (volume statistics, RAM,
//! physical cores, O_DIRECT).
//!
//! Units: sizes are bytes (`u64`) inside; "GiB" means 1024^3 bytes. Flags and
//! variables named "GB", LMCache's and the node's, are GiB (`docs/sizing.md`).
//!
//! Source of the rules: `docs/sizing.md` and `docs/configuration.md`.

pub mod probe;
pub mod rules;

use serde::Serialize;

/// One GiB in bytes (1024^3).
pub const GIB: u64 = 1 << 30;

/// A derived value together with the rule that produced it.
///
/// `rule` is a short stable identifier for scripts (`"derived-8x-l1"`);
/// `reason` is one sentence for people, with the numbers that decided it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision<T> {
    /// The chosen value.
    pub value: T,
    /// Stable identifier of the rule that chose it.
    pub rule: &'static str,
    /// Why, in words, with the figures that decided it.
    pub reason: String,
}

impl<T> Decision<T> {
    /// A decision of `value` by `rule`, explained by `reason`.
    pub fn new(value: T, rule: &'static str, reason: impl Into<String>) -> Self {
        Decision {
            value,
            rule,
            reason: reason.into(),
        }
    }
}

/// Formats a byte count as GiB with two decimals, e.g. `"12.50 GiB"`.
pub fn fmt_gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / GIB as f64)
}

/// Converts a size in GiB (as operators write it, possibly fractional) into
/// bytes, rounding down to whole bytes. `None` when the value is negative,
/// not finite, or does not fit in `u64`.
pub fn gib_to_bytes(gib: f64) -> Option<u64> {
    if !gib.is_finite() || gib < 0.0 {
        return None;
    }
    let bytes = gib * GIB as f64;
    if bytes >= u64::MAX as f64 {
        return None;
    }
    Some(bytes as u64)
}
