//! Which capacity guards `erebine-lmcache server` runs beside the real
//! server ([`lmcache_capacity_guard::adapter::GuardTiers::of_server`]): one
//! for every `--l2-adapter` spec that
//! [`lmcache_capacity_guard::capacity::guard_specs`] selects (`fs` and
//! `fs_native` tiers with `max_capacity_gb` > 0), numbered by the position
//! of the flag, less those the launch that started it runs itself.
//!
//! The specs reach LMCache unchanged, `max_capacity_gb` included: LMCache
//! 0.5.6's `fs` adapter reads only its own keys (`FSL2AdapterConfig.from_dict`)
//! and declares no capacity, so its eviction controller skips the tier even
//! with an `eviction` block; on `fs_native` the key is LMCache's own. Stripping
//! it would only make `/status` and the logs disagree with the operator's spec.

use lmcache_capacity_guard::adapter::{guarded_by_launch, GUARDED_BY_LAUNCH, GUARD_OWNER};
use lmcache_capacity_guard::capacity::GuardSpec;

use crate::node::env::text_var;

/// The owner the launch that started this process gives its guards
/// ([`GUARD_OWNER`] in `vars`), if one did.
pub(crate) fn launch_guard_owner(vars: &crate::Vars) -> Option<String> {
    text_var(vars, GUARD_OWNER).filter(|v| !v.is_empty())
}

/// `specs` without the tiers whose guard the launch that started this
/// process runs itself (from the launch's scan, so that a launch reads its
/// tier once): the directories [`GUARDED_BY_LAUNCH`] lists
/// in `vars`. A value that is not a JSON array of paths guards everything
/// here, as without the variable.
pub fn without_launch_guarded(specs: Vec<GuardSpec>, vars: &crate::Vars) -> Vec<GuardSpec> {
    let listed = text_var(vars, GUARDED_BY_LAUNCH)
        .map(|v| guarded_by_launch(&v))
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
    use lmcache_capacity_guard::capacity::guard_specs;
    use lmcache_tier_spec::L2AdapterArgs;

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
        let vars = crate::node::env::text_vars([(GUARDED_BY_LAUNCH, r#"["/b"]"#)]);
        let left: Vec<_> = without_launch_guarded(specs(), &vars)
            .into_iter()
            .map(|s| s.base_path)
            .collect();
        assert_eq!(left, [std::path::PathBuf::from("/a")]);
        let garbled = crate::node::env::text_vars([(GUARDED_BY_LAUNCH, "/b")]);
        assert_eq!(without_launch_guarded(specs(), &garbled).len(), 2);
    }
}
