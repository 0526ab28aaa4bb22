//! The fs capacity guards `erebine-lmcache server` starts beside the real
//! server: one for every `--l2-adapter` spec that
//! [`lmcache_adapters::capacity::guard_specs`] selects (`fs` and `fs_native`
//! tiers with `max_capacity_gb` > 0), numbered by the position of the flag.
//!
//! The specs reach LMCache unchanged, `max_capacity_gb` included: LMCache
//! 0.5.6's `fs` adapter reads only its own keys (`FSL2AdapterConfig.from_dict`)
//! and declares no capacity, so its eviction controller skips the tier even
//! with an `eviction` block; on `fs_native` the key is LMCache's own. Stripping
//! it would only make `/status` and the logs disagree with the operator's spec.

use lmcache_adapters::capacity::guard_specs;
use lmcache_adapters::guard::{Guard, GuardOptions};
use lmcache_adapters::L2AdapterArgs;

/// Starts a guard for every guarded tier among the command's parsed
/// `--l2-adapter` specs (checked with [`L2AdapterArgs::check`] first: a value
/// that is not one JSON object with a `type` would be skipped here).
///
/// # Errors
/// The first tier whose capacity is unusable (negative, not a number, above
/// 0 but under one byte, larger than the volume) or whose directory cannot be
/// used or is another guarded tier's, named by position and `base_path`;
/// guards already started are stopped.
pub fn start_guards(specs: &L2AdapterArgs) -> Result<Vec<Guard>, String> {
    let specs = guard_specs(&specs.cascade()).map_err(|e| e.to_string())?;
    specs
        .into_iter()
        .map(|spec| Guard::start(spec, GuardOptions::default()).map_err(|e| e.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_capacity_stops_the_start_and_names_the_tier() {
        let args = [
            "--l2-adapter",
            r#"{"type":"s3"}"#,
            "--l2-adapter",
            r#"{"type":"fs","base_path":"/nonexistent/tier","max_capacity_gb":-5}"#,
        ]
        .map(String::from);
        let e = start_guards(&L2AdapterArgs::parse(&args)).unwrap_err();
        assert!(e.contains("L2 tier 1 (base_path /nonexistent/tier)"), "{e}");
        assert!(e.contains("max_capacity_gb = -5"), "{e}");
    }
}
