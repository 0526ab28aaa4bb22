//! How a run of `lmcache-tier` or `erebine-lmcache` ends: the exit statuses
//! both binaries use ([`ExitStatus`], the table of `lmcache-tier --help`
//! and `docs/configuration.md`, "Exit status"), and the one mapping from
//! each error a run can end with to its status ([`HasExitStatus`]).
//!
//! Each binary ends with one error type of the library
//! ([`crate::cli::CommandError`] for `lmcache-tier`,
//! [`crate::run::drop_in::Failure`] for `erebine-lmcache`), whose status is
//! mapped here like every other; only `erebine-lmcache` running the stock
//! `lmcache` in its place has statuses of its own (126 and 127, as a shell
//! says of a command it cannot run or find).

use lmcache_capacity_guard::capacity::CapacityError;
use lmcache_housekeeping::{HousekeepingError, LockError};
use lmcache_s3_gateway::spec::BucketSpecError;
use lmcache_tier_spec::SpecError;

use crate::cli::CommandError;
use crate::inspect::{InspectError, Inspection};
use crate::metrics::MetricsError;
use crate::node::config_error::ConfigError;
use crate::node::ports::ListenError;
use crate::plan::inputs::PlanError;
use crate::plan::locate::NotFound;
use crate::plan::server_python::ModuleError;
use crate::process::ProcessError;
use crate::run::drop_in::args::ArgsError;
use crate::run::drop_in::{DropInError, Ended, Failure};
use crate::run::launch::LaunchError;
use crate::run::tiers::AdapterError;

/// How a run ends. Command-line errors that `clap` reports (an unknown
/// flag, a value that does not parse) end with 2 too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// 0: success; for `launch`, the server was stopped on request, or
    /// there is nothing to launch.
    Success,
    /// 1: this process itself failed ([`ProcessError`]: its runtime,
    /// signals, stdout, the host's memory size, the server it lost track of).
    Failure,
    /// 2: bad input: a flag, a variable, the cache directory, a tier spec
    /// (a capacity guard's or an S3 gateway's settings): the message names it.
    BadInput,
    /// 3: an executable is missing: `erebine-lmcache`, or the stock
    /// `lmcache` (every place looked is listed).
    MissingExecutable,
    /// 4: a port the server needs is in use on 127.0.0.1.
    PortInUse,
    /// 5: the server exited, or did not answer `/status` in time; after it
    /// was ready once: it failed fast too many times in a row.
    ServerFailed,
    /// 6: another launch or housekeeping holds the disk tier's lock.
    TierLocked,
    /// 7: housekeeping failed part-way.
    HousekeepingFailed,
    /// 8: `inspect`: the server does not answer.
    NoAnswer,
    /// 9: `inspect`: the server answers but is not healthy.
    Unhealthy,
    /// 126: `erebine-lmcache`: the stock `lmcache` was found but cannot be
    /// run.
    CannotRun,
    /// 127: `erebine-lmcache`: the stock `lmcache` was not found.
    CommandNotFound,
    /// `erebine-lmcache`: the server's own status, passed on (128+N when
    /// signal N ended it).
    Server(
        /// The server's status.
        u8,
    ),
}

impl ExitStatus {
    /// The process exit status.
    pub fn code(self) -> u8 {
        match self {
            ExitStatus::Success => 0,
            ExitStatus::Failure => 1,
            ExitStatus::BadInput => 2,
            ExitStatus::MissingExecutable => 3,
            ExitStatus::PortInUse => 4,
            ExitStatus::ServerFailed => 5,
            ExitStatus::TierLocked => 6,
            ExitStatus::HousekeepingFailed => 7,
            ExitStatus::NoAnswer => 8,
            ExitStatus::Unhealthy => 9,
            ExitStatus::CannotRun => 126,
            ExitStatus::CommandNotFound => 127,
            ExitStatus::Server(code) => code,
        }
    }

    /// What the status means, as `--help` and `docs/operations.md` say it.
    pub fn meaning(self) -> &'static str {
        match self {
            ExitStatus::Success => "success (launch: the server was stopped on request; inspect: the server is healthy)",
            ExitStatus::Failure => "this process failed: its runtime, its signals, writing stdout, or reading the host",
            ExitStatus::BadInput => "bad input: a flag, an EREBINE_AGENT_* variable or the cache directory (the message names it)",
            ExitStatus::MissingExecutable => "an executable is missing: erebine-lmcache or the stock lmcache",
            ExitStatus::PortInUse => "a port the server needs is in use",
            ExitStatus::ServerFailed => "the LMCache server exited, or did not become ready in time (its last lines are quoted)",
            ExitStatus::TierLocked => "another launch or housekeeping holds the disk tier's lock (the holder is named)",
            ExitStatus::HousekeepingFailed => "housekeeping failed part-way (what failed is listed; run it again once fixed)",
            ExitStatus::NoAnswer => "inspect: the server does not answer (what the disk tier holds is still printed)",
            ExitStatus::Unhealthy => "inspect: the server answers but is not healthy (the parts at fault are named)",
            ExitStatus::CannotRun => "erebine-lmcache: the stock lmcache was found but cannot be run",
            ExitStatus::CommandNotFound => "erebine-lmcache: the stock lmcache was not found",
            ExitStatus::Server(_) => "erebine-lmcache: the server's own status (128+N when signal N ended it)",
        }
    }

    /// The status's name for scripts, the `kind` of the error document a
    /// `--json` run that fails prints (`docs/inspect.md`): `bad_input`,
    /// `tier_locked`, ...; `server_exit` for a server's own status.
    pub fn name(self) -> &'static str {
        match self {
            ExitStatus::Success => "success",
            ExitStatus::Failure => "failure",
            ExitStatus::BadInput => "bad_input",
            ExitStatus::MissingExecutable => "missing_executable",
            ExitStatus::PortInUse => "port_in_use",
            ExitStatus::ServerFailed => "server_failed",
            ExitStatus::TierLocked => "tier_locked",
            ExitStatus::HousekeepingFailed => "housekeeping_failed",
            ExitStatus::NoAnswer => "no_answer",
            ExitStatus::Unhealthy => "unhealthy",
            ExitStatus::CannotRun => "cannot_run",
            ExitStatus::CommandNotFound => "command_not_found",
            ExitStatus::Server(_) => "server_exit",
        }
    }

    /// The status of a server that ended with `code`
    /// ([`crate::run::supervise::exit_code`]); one outside 0 to 255 is a failure.
    pub(crate) fn of_server(code: i32) -> Self {
        u8::try_from(code).map_or(ExitStatus::Failure, ExitStatus::Server)
    }
}

impl From<ExitStatus> for std::process::ExitCode {
    fn from(status: ExitStatus) -> Self {
        std::process::ExitCode::from(status.code())
    }
}

/// Every status `lmcache-tier` can end with, for its top-level `--help`.
pub const LMCACHE_TIER_STATUSES: [ExitStatus; 10] = [
    ExitStatus::Success,
    ExitStatus::Failure,
    ExitStatus::BadInput,
    ExitStatus::MissingExecutable,
    ExitStatus::PortInUse,
    ExitStatus::ServerFailed,
    ExitStatus::TierLocked,
    ExitStatus::HousekeepingFailed,
    ExitStatus::NoAnswer,
    ExitStatus::Unhealthy,
];

/// Columns an exit-status section of `--help` fits in.
const HELP_COLUMNS: usize = 79;

/// The `Exit status:` section of a `--help` for `statuses`: one entry each,
/// its meaning wrapped at 79 columns under itself, so that it reads at an
/// 80-column terminal and wider.
pub fn exit_status_help(statuses: &[ExitStatus]) -> String {
    let mut text = String::from("Exit status:");
    for status in statuses {
        let code = status.code().to_string();
        let indent = 2 + code.len() + 2;
        text.push_str(&format!(
            "
  {code}  "
        ));
        let mut column = indent;
        for (i, word) in status.meaning().split(' ').enumerate() {
            if i > 0 && column + 1 + word.len() > HELP_COLUMNS {
                text.push('\n');
                text.push_str(&" ".repeat(indent));
                column = indent;
            } else if i > 0 {
                text.push(' ');
                column += 1;
            }
            text.push_str(word);
            column += word.len();
        }
    }
    text
}

/// An error a run can end with: the status it ends with.
pub trait HasExitStatus: std::error::Error {
    /// The exit status of a run that ends with this error.
    fn exit_status(&self) -> ExitStatus;
}

impl HasExitStatus for ProcessError {
    fn exit_status(&self) -> ExitStatus {
        ExitStatus::Failure
    }
}

impl HasExitStatus for ConfigError {
    fn exit_status(&self) -> ExitStatus {
        ExitStatus::BadInput
    }
}

impl HasExitStatus for SpecError {
    fn exit_status(&self) -> ExitStatus {
        ExitStatus::BadInput
    }
}

impl HasExitStatus for NotFound {
    fn exit_status(&self) -> ExitStatus {
        ExitStatus::MissingExecutable
    }
}

impl HasExitStatus for PlanError {
    fn exit_status(&self) -> ExitStatus {
        match self {
            PlanError::Config(e) => e.exit_status(),
            PlanError::Executable(e) => e.exit_status(),
            PlanError::ServerModule { source, .. } => source.exit_status(),
            PlanError::ApiKey(_) => ExitStatus::BadInput,
            PlanError::Listen(e) => e.exit_status(),
            PlanError::Tier(e) => e.exit_status(),
            PlanError::Memory(_) | PlanError::NotMeasured => ExitStatus::Failure,
            PlanError::DiskPath { .. }
            | PlanError::Sizing { .. }
            | PlanError::NothingToCache { .. }
            | PlanError::Engine { .. }
            | PlanError::HostFact { .. }
            | PlanError::L1AboveMemory(_) => ExitStatus::BadInput,
        }
    }
}

impl HasExitStatus for HousekeepingError {
    fn exit_status(&self) -> ExitStatus {
        match self {
            HousekeepingError::Identity(_) | HousekeepingError::Dir(_) => ExitStatus::BadInput,
            HousekeepingError::Lock(LockError::Held { .. }) => ExitStatus::TierLocked,
            // The lock file cannot be made or locked (a directory, a
            // symlink or a hard link from elsewhere in its place, a
            // read-only tier): the tier is at fault.
            HousekeepingError::Lock(
                LockError::Dir(_) | LockError::Io { .. } | LockError::NotPlain { .. },
            ) => ExitStatus::BadInput,
            HousekeepingError::Scan(_)
            | HousekeepingError::Incomplete { .. }
            | HousekeepingError::Manifest(_) => ExitStatus::HousekeepingFailed,
        }
    }
}

/// The server's Python lacks a module the tiers need (boto3, LMCache's
/// Rust raw-block extension), or cannot be asked: its environment is the
/// input at fault.
impl HasExitStatus for ModuleError {
    fn exit_status(&self) -> ExitStatus {
        ExitStatus::BadInput
    }
}

impl HasExitStatus for BucketSpecError {
    fn exit_status(&self) -> ExitStatus {
        ExitStatus::BadInput
    }
}

impl HasExitStatus for CapacityError {
    fn exit_status(&self) -> ExitStatus {
        ExitStatus::BadInput
    }
}

/// Every adapter's error is its tier's, whatever the kind: a spec that
/// cannot work, or what it needs beside the server cannot start (a
/// gateway's bucket out of reach, a guard's directory or capacity, a Redis
/// that is down or would refuse stores). A kind needs no line here.
impl HasExitStatus for AdapterError {
    fn exit_status(&self) -> ExitStatus {
        ExitStatus::BadInput
    }
}

impl HasExitStatus for DropInError {
    fn exit_status(&self) -> ExitStatus {
        match self {
            DropInError::CannotStart { .. } => ExitStatus::CannotRun,
            DropInError::Signals(_) => ExitStatus::Failure,
            DropInError::Adapter(e) => e.exit_status(),
            DropInError::ServerModule(e) => e.exit_status(),
            DropInError::Listening(e) => e.exit_status(),
            DropInError::Config(e) => e.exit_status(),
            DropInError::Metrics(e) => e.exit_status(),
            DropInError::Process(e) => e.exit_status(),
        }
    }
}

/// What a subcommand of `lmcache-tier` ends with: its error's status; a
/// refused `help` or `man` is bad input.
impl HasExitStatus for CommandError {
    fn exit_status(&self) -> ExitStatus {
        match self {
            CommandError::Config(e) => e.exit_status(),
            CommandError::Plan(e) => e.exit_status(),
            CommandError::NotFound(e) => e.exit_status(),
            CommandError::Launch(e) => e.exit_status(),
            CommandError::Housekeeping(e) => e.exit_status(),
            CommandError::Inspect(e) => e.exit_status(),
            CommandError::Process(e) => e.exit_status(),
            CommandError::Usage(_) => ExitStatus::BadInput,
        }
    }
}

/// `erebine-lmcache`'s own failures: 127 and 126 as a shell says of a
/// command it cannot find or run.
impl HasExitStatus for Failure {
    fn exit_status(&self) -> ExitStatus {
        match self {
            Failure::Args(e) => e.exit_status(),
            Failure::StockNotFound(_) => ExitStatus::CommandNotFound,
            Failure::CannotRun { .. } => ExitStatus::CannotRun,
            Failure::DropIn(e) => e.exit_status(),
            Failure::Guards(e) => e.exit_status(),
            Failure::Check(e) => e.exit_status(),
            Failure::Process(e) => e.exit_status(),
        }
    }
}

impl HasExitStatus for ArgsError {
    fn exit_status(&self) -> ExitStatus {
        match self {
            ArgsError::Abbreviated { .. } | ArgsError::NotUtf8 { .. } => ExitStatus::BadInput,
            ArgsError::Spec(e) => e.exit_status(),
            ArgsError::OrphanKey(e) => e.exit_status(),
        }
    }
}

/// A drop-in's server passes its own status on (`docs/operations.md`).
impl From<&Ended> for ExitStatus {
    fn from(ended: &Ended) -> Self {
        match ended {
            Ended::HelpWithoutStock => ExitStatus::Success,
            Ended::Server(code) => ExitStatus::of_server(*code),
            Ended::AdapterFailed(e) => e.exit_status(),
            Ended::StoppedBeforeStart(signal) => ExitStatus::of_server(128 + signal),
        }
    }
}

impl HasExitStatus for ListenError {
    fn exit_status(&self) -> ExitStatus {
        match self {
            ListenError::PortInUse { .. } => ExitStatus::PortInUse,
            ListenError::NotAnAddressHere { .. } => ExitStatus::BadInput,
            // Out of descriptors is this process's failure; a privileged
            // port or an unusable address is the setting's.
            ListenError::CannotListen { source, .. } => match source.raw_os_error() {
                Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                    ExitStatus::Failure
                }
                _ => ExitStatus::BadInput,
            },
        }
    }
}

impl HasExitStatus for LaunchError {
    fn exit_status(&self) -> ExitStatus {
        match self {
            LaunchError::Listen(e) => e.exit_status(),
            LaunchError::Metrics(e) => e.exit_status(),
            LaunchError::Spawn { .. } => ExitStatus::MissingExecutable,
            LaunchError::Adapter(e) => e.exit_status(),
            LaunchError::Housekeeping(e) => e.exit_status(),
            LaunchError::ApiKey(_) | LaunchError::FencedTier { .. } => ExitStatus::BadInput,
            LaunchError::ExitedBeforeReady { .. }
            | LaunchError::NotReady { .. }
            | LaunchError::Exited { .. }
            | LaunchError::GaveUp { .. }
            | LaunchError::Io(_) => ExitStatus::ServerFailed,
        }
    }
}

/// Both binaries serve the metrics endpoint: `lmcache-tier launch` and
/// `erebine-lmcache server`.
impl HasExitStatus for MetricsError {
    fn exit_status(&self) -> ExitStatus {
        match self {
            // The metrics port is taken (another process, or an address
            // this host does not have).
            MetricsError::Listen { .. } => ExitStatus::PortInUse,
            // This process could not start the endpoint's thread.
            MetricsError::Thread(_) => ExitStatus::Failure,
        }
    }
}

impl HasExitStatus for InspectError {
    fn exit_status(&self) -> ExitStatus {
        match self {
            InspectError::BadUrl { .. } | InspectError::NotATerminal | InspectError::ApiKey(_) => {
                ExitStatus::BadInput
            }
            InspectError::NoAnswer { .. } => ExitStatus::NoAnswer,
            InspectError::Unhealthy { .. } => ExitStatus::Unhealthy,
        }
    }
}

/// Mapped here with every other status, so that nothing `inspect` builds on
/// imports this module.
impl Inspection {
    /// The exit status `inspect` ends with ([`Inspection::verdict`]): 0
    /// healthy, 8 unreachable, 9 answering but unhealthy.
    pub fn exit_code(&self) -> u8 {
        self.verdict()
            .map_or_else(|e| e.exit_status(), |()| ExitStatus::Success)
            .code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codes_are_the_documented_ones() {
        let documented = [
            (ExitStatus::Success, 0),
            (ExitStatus::Failure, 1),
            (ExitStatus::BadInput, 2),
            (ExitStatus::MissingExecutable, 3),
            (ExitStatus::PortInUse, 4),
            (ExitStatus::ServerFailed, 5),
            (ExitStatus::TierLocked, 6),
            (ExitStatus::HousekeepingFailed, 7),
            (ExitStatus::NoAnswer, 8),
            (ExitStatus::Unhealthy, 9),
            (ExitStatus::CannotRun, 126),
            (ExitStatus::CommandNotFound, 127),
            (ExitStatus::Server(143), 143),
        ];
        for (status, code) in documented {
            assert_eq!(status.code(), code, "{status:?}");
        }
        assert_eq!(ExitStatus::of_server(137), ExitStatus::Server(137));
        assert_eq!(ExitStatus::of_server(-1), ExitStatus::Failure);
    }

    #[test]
    fn the_help_section_fits_80_columns_and_keeps_every_word() {
        let text = exit_status_help(&LMCACHE_TIER_STATUSES);
        assert!(text.lines().all(|l| l.chars().count() <= 79), "{text}");
        for status in LMCACHE_TIER_STATUSES {
            let entry = format!("\n  {}  ", status.code());
            assert!(text.contains(&entry), "{text}");
        }
        let words = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
        let meanings: Vec<String> = LMCACHE_TIER_STATUSES
            .iter()
            .map(|s| format!("{} {}", s.code(), s.meaning()))
            .collect();
        assert_eq!(
            words(&text),
            words(&format!("Exit status: {}", meanings.join(" ")))
        );
        // Continuation lines sit under the meaning, not under the code.
        assert!(text.contains("\n     healthy)"), "{text}");
    }

    #[test]
    fn a_missing_executable_is_3_even_inside_a_plan_or_a_launch() {
        let missing = || NotFound {
            what: "erebine-lmcache".into(),
            looked: Vec::new(),
            fix: String::new(),
        };
        assert_eq!(missing().exit_status(), ExitStatus::MissingExecutable);
        assert_eq!(
            PlanError::Executable(missing()).exit_status(),
            ExitStatus::MissingExecutable
        );
        let spawn = LaunchError::Spawn {
            executable: "erebine-lmcache".into(),
            detail: "No such file or directory".into(),
        };
        assert_eq!(spawn.exit_status(), ExitStatus::MissingExecutable);
    }

    #[test]
    fn housekeeping_inside_a_launch_keeps_its_own_status() {
        let held = HousekeepingError::Lock(lmcache_housekeeping::LockError::Held {
            dir: "/t".into(),
            path: "/t/.lock".into(),
            holder: "pid 1".into(),
        });
        assert_eq!(held.exit_status(), ExitStatus::TierLocked);
        assert_eq!(
            LaunchError::Housekeeping(held).exit_status(),
            ExitStatus::TierLocked
        );
    }
}
