//! The command line of `lmcache-tier`, one test binary with a module per
//! concern: bad input, help, pipes, `size` in a cgroup, `housekeep` and
//! `inspect`, each against the binary Cargo built for it. None needs the
//! real LMCache server.

/// The shared case runner and port helper.
mod kit;

/// Bad variables, flags, paths and tier specs: a clear error naming them,
/// the exit status, nothing started or deleted.
mod bad_input;
/// `size` inside a real cgroup v1 memory cgroup: the tightest limit wins.
mod cgroup_memory;
/// `--help`, exit statuses, completions and man pages.
mod cli_help;
/// `housekeep` cleans what a launch on the same inputs would.
mod cli_housekeep;
/// Every command ends quietly when its stdout's reader is gone.
mod cli_pipes;
/// `inspect` trusts nothing it is answered, and never prints a secret.
mod inspect_cli;
/// `inspect --watch` refuses what it cannot draw.
mod inspect_watch_cli;
/// `size`, `launch --dry-run`, `launch` and `housekeep` judge alike.
mod one_verdict;
/// `erebine-lmcache` as PID 1 reaps orphans.
mod pid_one;
