//! The node: its `EREBINE_AGENT_*` variables read from a map
//! (`docs/configuration.md`), `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` read as
//! LMCache's argparse reads it, the server's flag table, the checks of the
//! keys this project adds to LMCache's tier specs ([`extensions`]), and the
//! ports a launch listens on. Pure, but for the checks that read what a
//! tier names (a CA bundle, the AWS files, its directories:
//! [`extensions::check_extensions`]) and those of the ports.

pub mod config_error;
pub mod env;
pub mod extensions;
pub mod extra_args;
pub mod ports;
pub mod server_flags;
