//! What the subcommands of `lmcache-tier` do: launch, size, housekeep,
//! each returning a typed report its binary prints.

pub mod housekeep;
pub mod launch;
pub mod size;
