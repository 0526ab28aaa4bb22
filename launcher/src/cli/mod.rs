//! What the subcommands of `lmcache-tier` do beyond planning and launching,
//! each returning a typed report its binary prints.

pub mod housekeep;
pub mod size;
