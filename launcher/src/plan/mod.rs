//! The plan, facts first: what a launch measures once (the host, the
//! volume, the tier's scan, the executables; [`facts`]), the inputs the
//! rules read ([`inputs`]), and the pure plan made from them
//! ([`launch_plan`], with the housekeeping it runs and the checks of the
//! keys this project adds to LMCache's tier specs). `docs/design.md`, "One
//! launch".

pub mod api_key;
pub mod bucket_warnings;
mod command_line;
mod disk_tier;
pub mod extensions;
pub mod facts;
pub mod gpu;
pub mod housekeep;
pub mod inputs;
mod l1;
pub mod launch_plan;
pub mod lmcache_versions;
pub mod locate;
pub mod server_python;
pub mod verdict;
