//! The fs capacity guards `erebine-lmcache server` starts beside the real
//! server, once it has really started (a listener in its process tree): one for every `--l2-adapter` spec that
//! [`lmcache_capacity_guard::capacity::guard_specs`] selects (`fs` and `fs_native`
//! tiers with `max_capacity_gb` > 0), numbered by the position of the flag.
//!
//! The specs reach LMCache unchanged, `max_capacity_gb` included: LMCache
//! 0.5.6's `fs` adapter reads only its own keys (`FSL2AdapterConfig.from_dict`)
//! and declares no capacity, so its eviction controller skips the tier even
//! with an `eviction` block; on `fs_native` the key is LMCache's own. Stripping
//! it would only make `/status` and the logs disagree with the operator's spec.

use lmcache_capacity_guard::capacity::{guard_specs, CapacityError, GuardSpec};
use lmcache_capacity_guard::{Guard, GuardError, GuardOptions};
use lmcache_tier_spec::L2AdapterArgs;

use crate::node::env::text_var;

/// The guard of every guarded tier among the command's parsed
/// `--l2-adapter` specs (checked with [`L2AdapterArgs::check`] first: a value
/// that is not one JSON object with a `type` would be skipped here), each
/// checked against its volume. Reads only: nothing is created or deleted
/// until [`start_guards`] runs, once the server has really started.
///
/// # Errors
/// [`CapacityError`]: the first tier whose capacity is unusable (negative,
/// not a number, above 0 but under one byte, larger than the volume) or
/// whose directory is another guarded tier's, named by position and
/// `base_path`.
pub fn check_guards(specs: &L2AdapterArgs) -> Result<Vec<GuardSpec>, CapacityError> {
    let specs = guard_specs(&specs.cascade())?;
    for spec in &specs {
        spec.check_volume()?;
    }
    Ok(specs)
}

/// Starts the guards [`check_guards`] returned, with `owner`
/// ([`GuardOptions::owner`]: whose metrics serve their statuses): each
/// creates its directory if missing, counts it, and trims it to its
/// watermark.
///
/// # Errors
/// [`GuardError`]: the first tier whose directory cannot be created,
/// opened or watched; guards already started are stopped.
pub fn start_guards(specs: Vec<GuardSpec>, owner: &str) -> Result<Vec<Guard>, GuardError> {
    let options = GuardOptions {
        owner: Some(owner.to_string()),
        ..GuardOptions::default()
    };
    specs
        .into_iter()
        .map(|spec| Guard::start(spec, options.clone()))
        .collect()
}

/// The owner the launch that started this process gives its guards
/// ([`crate::run::launch::GUARD_OWNER`] in `vars`), if one did.
pub(crate) fn launch_guard_owner(vars: &crate::Vars) -> Option<String> {
    text_var(vars, crate::run::launch::GUARD_OWNER).filter(|v| !v.is_empty())
}

/// `specs` without the tiers whose guard the launch that started this
/// process runs itself (from the launch's scan, so that a launch reads its
/// tier once): the directories [`crate::run::launch::GUARDED_BY_LAUNCH`] lists
/// in `vars`. A value that is not a JSON array of paths guards everything
/// here, as without the variable.
pub fn without_launch_guarded(specs: Vec<GuardSpec>, vars: &crate::Vars) -> Vec<GuardSpec> {
    let listed = text_var(vars, crate::run::launch::GUARDED_BY_LAUNCH)
        .and_then(|v| serde_json::from_str::<Vec<std::path::PathBuf>>(&v).ok())
        .unwrap_or_default();
    specs
        .into_iter()
        .filter(|spec| {
            let elsewhere = listed.contains(&spec.base_path);
            if elsewhere {
                tracing::info!(
                    "capacity guard, L2 tier {} ({}): run by the launch that started this server",
                    spec.position,
                    spec.base_path.display()
                );
            }
            !elsewhere
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_the_launch_guards_are_left_to_it() {
        let args = [
            "--l2-adapter",
            r#"{"type":"fs","base_path":"/a","max_capacity_gb":1}"#,
            "--l2-adapter",
            r#"{"type":"fs","base_path":"/b","max_capacity_gb":1}"#,
        ]
        .map(String::from);
        let specs = || guard_specs(&L2AdapterArgs::parse(&args).cascade()).unwrap();
        let vars =
            crate::node::env::text_vars([(crate::run::launch::GUARDED_BY_LAUNCH, r#"["/b"]"#)]);
        let left: Vec<_> = without_launch_guarded(specs(), &vars)
            .into_iter()
            .map(|s| s.base_path)
            .collect();
        assert_eq!(left, [std::path::PathBuf::from("/a")]);
        let garbled = crate::node::env::text_vars([(crate::run::launch::GUARDED_BY_LAUNCH, "/b")]);
        assert_eq!(without_launch_guarded(specs(), &garbled).len(), 2);
    }

    #[test]
    fn a_bad_capacity_stops_the_start_and_names_the_tier() {
        let args = [
            "--l2-adapter",
            r#"{"type":"s3"}"#,
            "--l2-adapter",
            r#"{"type":"fs","base_path":"/nonexistent/tier","max_capacity_gb":-5}"#,
        ]
        .map(String::from);
        let e = check_guards(&L2AdapterArgs::parse(&args))
            .unwrap_err()
            .to_string();
        assert!(e.contains("L2 tier 1 (base_path /nonexistent/tier)"), "{e}");
        assert!(e.contains("max_capacity_gb = -5"), "{e}");
    }
}
