//! Whose metrics serve the capacity guards `erebine-lmcache server` runs
//! beside the real server
//! ([`lmcache_capacity_guard::adapter::GuardTiers::of_server`]: one for
//! every `--l2-adapter` spec that
//! [`lmcache_capacity_guard::capacity::guard_specs`] selects, `fs` and
//! `fs_native` tiers with `max_capacity_gb` > 0, numbered by the position
//! of the flag, less those the launch that started it runs itself, which
//! the adapter leaves out).
//!
//! The specs reach LMCache unchanged, `max_capacity_gb` included: LMCache
//! 0.5.6's `fs` adapter reads only its own keys (`FSL2AdapterConfig.from_dict`)
//! and declares no capacity, so its eviction controller skips the tier even
//! with an `eviction` block; on `fs_native` the key is LMCache's own. Stripping
//! it would only make `/status` and the logs disagree with the operator's spec.

use lmcache_capacity_guard::adapter::GUARD_OWNER;

use crate::node::env::text_var;

/// The owner the launch that started this process gives its guards
/// ([`GUARD_OWNER`] in `vars`), if one did.
pub(crate) fn launch_guard_owner(vars: &crate::Vars) -> Option<String> {
    text_var(vars, GUARD_OWNER).filter(|v| !v.is_empty())
}
