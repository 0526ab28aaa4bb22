//! Why a guard did not start, and why it follows its tier without inotify.

use std::io::{self};

use lmcache_housekeeping::TierDirError;

use crate::capacity::CapacityError;

/// Why a guard did not start. The server should not start either: its tier
/// would be unbounded.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The capacity is unusable (e.g. larger than the volume).
    #[error(transparent)]
    Capacity(#[from] CapacityError),
    /// The tier directory cannot be opened for deleting.
    #[error("L2 tier {position}: {source}")]
    Dir {
        /// Position of the tier in the cascade.
        position: usize,
        /// What is wrong with the directory.
        #[source]
        source: TierDirError,
    },
    /// The guard's thread or its stop channel could not be made.
    #[error("L2 tier {position}: cannot start the capacity guard: {source}")]
    Io {
        /// Position of the tier in the cascade.
        position: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Why a guard follows its tier by rescans instead of inotify.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unwatched {
    /// [`GuardOptions::inotify`] is `false`.
    #[error("inotify disabled by the caller")]
    Disabled,
    /// inotify could not watch the directory.
    #[error(transparent)]
    Failed(
        /// The `inotify_init` or `inotify_add_watch` error.
        io::Error,
    ),
}
