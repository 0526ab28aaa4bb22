//! The command line of `lmcache-tier`, one test binary with a module per
//! concern: bad input, help, pipes, `size` in a cgroup, `housekeep` and
//! `inspect`, each against the binary Cargo built for it. None needs the
//! real LMCache server.

mod bad_input;
mod cgroup_memory;
mod cli_help;
mod cli_housekeep;
mod cli_pipes;
mod inspect_cli;
mod inspect_watch_cli;
mod one_verdict;
mod pid_one;
