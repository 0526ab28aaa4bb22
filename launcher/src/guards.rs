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

use std::ffi::OsString;

use lmcache_adapters::capacity::guard_specs;
use lmcache_adapters::guard::{Guard, GuardOptions};
use lmcache_adapters::{Cascade, TierSpec};
use serde_json::Value;

/// The flag that adds one L2 tier (LMCache's argparse `append`).
const L2_ADAPTER: &str = "--l2-adapter";

/// The `--l2-adapter` specs among `args` (`--l2-adapter JSON` or
/// `--l2-adapter=JSON`), in order. A value that is not a JSON object with a
/// `type` is skipped: LMCache rejects it itself, with its own message.
pub fn l2_adapter_specs(args: &[OsString]) -> Cascade {
    let mut tiers = Vec::new();
    let mut args = args.iter().map(|a| a.to_string_lossy());
    while let Some(arg) = args.next() {
        let value = if arg == L2_ADAPTER {
            args.next().map(|v| v.into_owned())
        } else {
            arg.strip_prefix("--l2-adapter=").map(str::to_owned)
        };
        let Some(value) = value else { continue };
        let position = tiers.len();
        if let Ok(Value::Object(object)) = serde_json::from_str::<Value>(&value) {
            if let Ok(tier) = TierSpec::from_object(object, L2_ADAPTER, position) {
                tiers.push(tier);
            }
        }
    }
    Cascade(tiers)
}

/// Starts a guard for every guarded tier among `args`' `--l2-adapter` specs.
///
/// # Errors
/// The first tier whose capacity is unusable (negative, not a number, larger
/// than the volume) or whose directory cannot be used, named by position and
/// `base_path`; guards already started are stopped.
pub fn start_guards(args: &[OsString]) -> Result<Vec<Guard>, String> {
    let specs = guard_specs(&l2_adapter_specs(args)).map_err(|e| e.to_string())?;
    specs
        .into_iter()
        .map(|spec| Guard::start(spec, GuardOptions::default()).map_err(|e| e.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn finds_every_l2_adapter_spec_in_order() {
        let cascade = l2_adapter_specs(&args(&[
            "--l1-size-gb",
            "1",
            "--l2-adapter",
            r#"{"type":"fs_native","base_path":"/a"}"#,
            "--l2-adapter=not json",
            r#"--l2-adapter={"type":"fs","base_path":"/b","max_capacity_gb":2}"#,
            "--l2-adapter",
        ]));
        let paths: Vec<_> = cascade.tiers().iter().map(|t| t.base_path()).collect();
        assert_eq!(paths, [Some("/a"), Some("/b")]);
    }

    #[test]
    fn a_bad_capacity_stops_the_start_and_names_the_tier() {
        let e = start_guards(&args(&[
            "--l2-adapter",
            r#"{"type":"s3"}"#,
            "--l2-adapter",
            r#"{"type":"fs","base_path":"/nonexistent/tier","max_capacity_gb":-5}"#,
        ]))
        .unwrap_err();
        assert!(e.contains("L2 tier 1 (base_path /nonexistent/tier)"), "{e}");
        assert!(e.contains("max_capacity_gb = -5"), "{e}");
    }
}
