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

pub mod cgroup;
pub mod disk_load;
pub mod engine;
pub mod mountinfo;
pub mod probe;
pub mod rules;
pub mod volume;

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

/// Formats a byte count as GiB with two decimals, e.g. `"12.50 GiB"`; a
/// count above 0 that would show as 0.00 is `"<0.01 GiB"`, so that no
/// size shows as nothing.
pub fn fmt_gib(bytes: u64) -> String {
    let gib = bytes as f64 / GIB as f64;
    if bytes > 0 && gib < 0.005 {
        return "<0.01 GiB".to_string();
    }
    format!("{gib:.2} GiB")
}

/// Converts a size in GiB (as operators write it, possibly fractional) into
/// bytes, rounding down to whole bytes; a size above 0 is at least 1 byte,
/// so that it never reads as 0 ("off" for some variables). `None` when
/// the value is negative, not finite, or does not fit in `u64`.
pub fn gib_to_bytes(gib: f64) -> Option<u64> {
    if !gib.is_finite() || gib < 0.0 {
        return None;
    }
    let bytes = gib * GIB as f64;
    if bytes >= u64::MAX as f64 {
        return None;
    }
    Some(match bytes as u64 {
        0 if gib > 0.0 => 1,
        whole => whole,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_positive_size_never_reads_or_shows_as_zero() {
        assert_eq!(gib_to_bytes(1e-300), Some(1));
        assert_eq!(gib_to_bytes(f64::MIN_POSITIVE), Some(1));
        assert_eq!(gib_to_bytes(0.0), Some(0));
        assert_eq!(gib_to_bytes(-0.0), Some(0));
        assert_eq!(gib_to_bytes(1.5), Some(3 * GIB / 2));
        assert_eq!(gib_to_bytes(-1e-300), None);
        assert_eq!(fmt_gib(0), "0.00 GiB");
        assert_eq!(fmt_gib(1), "<0.01 GiB");
        assert_eq!(fmt_gib(GIB / 100), "0.01 GiB");
        assert_eq!(fmt_gib(3 * GIB / 2), "1.50 GiB");
    }
}
