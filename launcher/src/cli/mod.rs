//! What the subcommands of `lmcache-tier` do: launch, size, housekeep and
//! inspect, each returning a typed report its binary prints, and the one
//! error type they end with ([`CommandError`], its exit status mapped in
//! `crate::exit`).

pub mod housekeep;
pub mod inspect;
pub mod launch;
pub mod size;

use std::path::PathBuf;

use lmcache_housekeeping::HousekeepingError;

use crate::inspect::InspectError;
use crate::node::env::{self, ConfigError};
use crate::plan::inputs::PlanError;
use crate::plan::locate::NotFound;
use crate::process::ProcessError;
use crate::run::launch::LaunchError;

/// Why a subcommand of `lmcache-tier` failed; each variant knows its exit
/// status (`HasExitStatus`, in `crate::exit`).
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// A variable or flag with a bad value.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The launch cannot be planned.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The stock `lmcache` or the server's executable is missing.
    #[error(transparent)]
    NotFound(#[from] NotFound),
    /// The launch ended without a requested stop.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// Housekeeping failed.
    #[error(transparent)]
    Housekeeping(#[from] HousekeepingError),
    /// `inspect` found no healthy server, or was given a bad URL.
    #[error(transparent)]
    Inspect(#[from] InspectError),
    /// This process itself failed.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// `help` or `man` was asked for something it cannot do.
    #[error(transparent)]
    Usage(#[from] UsageError),
}

/// What `help` and `man` refuse: exit 2, naming the subcommand or the
/// directory.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// `help` named no subcommand of this program.
    #[error("help: {name:?} is not a subcommand of {parent}: see `{parent} --help` for them")]
    NoSuchCommand {
        /// The name given.
        name: String,
        /// The command it was looked for under.
        parent: String,
    },
    /// The man pages cannot be written there.
    #[error("man --dir {}: cannot write {} there: {source}", .dir.display(), .page.as_deref().unwrap_or("the man pages"))]
    ManDir {
        /// The directory given.
        dir: PathBuf,
        /// The page that could not be written, if it got that far.
        page: Option<String>,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// `e`, naming `--path` instead of `EREBINE_AGENT_LMCACHE_DISK_PATH` when
/// the flag set the variable (`given`): the operator wrote the flag.
pub fn path_flag(e: ConfigError, given: bool) -> ConfigError {
    match e {
        ConfigError::Invalid {
            variable,
            value,
            expected,
        } if given && variable == env::DISK_PATH => ConfigError::Invalid {
            variable: "--path".to_string(),
            value,
            expected,
        },
        other => other,
    }
}
