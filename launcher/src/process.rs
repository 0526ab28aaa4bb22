//! What keeps this process itself from working, whichever binary it is:
//! its runtime, its signals, stdout, the server it waits on. Every one ends
//! a run with exit 1 (`crate::exit`).

use std::io;

/// What keeps this process itself from working (not its input, not the
/// server): exit 1.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The async runtime cannot start.
    #[error("cannot start the runtime: {0}")]
    Runtime(
        /// The OS error.
        #[source]
        io::Error,
    ),
    /// A terminating signal cannot be caught.
    #[error("cannot catch the terminating signals: {0}")]
    Signals(
        /// The error naming the signal.
        #[source]
        io::Error,
    ),
    /// Stdout cannot be written (a closed pipe is not this error).
    #[error("cannot write to stdout: {0}")]
    Stdout(
        /// The write error.
        #[source]
        io::Error,
    ),
    /// The report cannot be written as JSON.
    #[error("cannot print the report as JSON: {0}")]
    Json(
        /// The serialisation error.
        #[source]
        serde_json::Error,
    ),
    /// Waiting on the server failed.
    #[error("lost track of the server: {0}")]
    LostServer(
        /// The OS error.
        #[source]
        io::Error,
    ),
}

/// A current-thread tokio runtime for one command, with I/O and timers.
///
/// Errors: [`ProcessError::Runtime`].
pub fn runtime() -> Result<tokio::runtime::Runtime, ProcessError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ProcessError::Runtime)
}
