//! Writing to stderr and stdout so that a failed write never stops the work.
//!
//! A node's log goes to a pipe, a file or a terminal that may go away while
//! the server runs (`launch 2>&1 | head`, a log collector restarted, a
//! closed descriptor). Rust's `eprintln!` and `println!` panic when a write
//! fails, and `tracing-subscriber` reports its own failed writes with
//! `eprintln!`: a panic there would kill the capacity guard's thread, or the
//! supervisor in the middle of a stop. Here a log line that cannot be
//! written is dropped, and the work goes on (`docs/operations.md`, "Logs").
//!
//! How a run ends, the binaries' last output, is [`crate::exit`].

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// The log filter of both binaries when `RUST_LOG` is not set: `info`, with
/// `aws-config` (the S3 gateways' credential chain) at `warn`, since its
/// `info` lines describe every credential it loads, access key id included,
/// and its profile provider at `error`, since its warning about a failed
/// `credential_process` quotes the process's stderr, which may hold a secret
/// (our own error names the process and its exit status instead).
pub const DEFAULT_LOG_FILTER: &str = "info,aws_config=warn,aws_config::profile::credentials=error";

/// Stderr for log lines: a write that fails (a closed pipe, a full disk
/// under a redirected file) is reported as done and the bytes are dropped.
#[derive(Debug, Clone, Copy, Default)]
pub struct LossyStderr;

impl Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}

/// Opens `/dev/null` on each of stdin, stdout and stderr that the process
/// was started without (`2>&-`). A closed descriptor 2 would otherwise be
/// the number the next file opened gets (an inotify handle, the capacity
/// guard's status file, a socket), and log lines would be written into it.
/// Call it first, before anything opens a file.
pub fn ensure_std_fds() {
    for fd in 0..=2 {
        // SAFETY: F_GETFD only reads the descriptor's flags.
        let closed = unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1;
        if closed {
            // SAFETY: a plain open(2) of a constant path; the lowest free
            // descriptor, `fd`, is the one it returns.
            unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
        }
    }
}

/// Installs the binaries' `tracing` subscriber: plain lines on stderr
/// through [`LossyStderr`], `RUST_LOG` or [`DEFAULT_LOG_FILTER`], colours
/// only when `ansi`, after [`ensure_std_fds`]. The subscriber's own report of a failed write is off:
/// it would be one more write to the same broken stream.
pub fn init_logging(ansi: bool) {
    ensure_std_fds();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    tracing_subscriber::fmt()
        .with_writer(|| LossyStderr)
        .with_ansi(ansi)
        .log_internal_errors(false)
        .with_env_filter(filter)
        .init();
}

/// Writes one line to stderr, dropping it if stderr is gone (the server's
/// own output that a supervisor passes on).
pub fn stderr_line(line: &str) {
    let mut err = io::stderr().lock();
    let _ = err.write_all(line.as_bytes());
    let _ = err.write_all(b"\n");
}

/// Whether [`stdout_text`] has written anything in this process.
static STDOUT_WRITTEN: AtomicBool = AtomicBool::new(false);

/// Whether [`stdout_text`] has written anything yet: a `--json` run that
/// fails prints its error document only on an empty stdout, so that stdout
/// always holds one JSON document.
pub fn stdout_written() -> bool {
    STDOUT_WRITTEN.load(Ordering::Relaxed)
}

/// Writes `text` to stdout and flushes it. A reader that closed the pipe
/// (`| head`) has what it wanted: that is `Ok`. Any other failure is the
/// error, for the caller to report.
pub fn stdout_text(text: &str) -> io::Result<()> {
    STDOUT_WRITTEN.store(true, Ordering::Relaxed);
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// How the library shows long work: `(message, work)`; the binaries pass
/// [`spinner`], the library's own default is [`unseen`].
pub type ShowProgress = fn(&str, &mut dyn FnMut());

/// A [`ShowProgress`] that only runs the work.
pub fn unseen(_: &str, work: &mut dyn FnMut()) {
    work()
}

/// How long work runs before a spinner appears on the terminal.
const PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// Runs `work`, showing `message` with a spinner and the elapsed time on
/// stderr once it has taken longer than a second. Nothing is drawn when
/// stderr is not a terminal (logs and pipes stay clean). Only the binaries
/// draw: the library's long work takes a [`ShowProgress`].
pub fn with_progress<T>(message: &str, work: impl FnOnce() -> T) -> T {
    if !std::io::stderr().is_terminal() {
        return work();
    }
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            if done_rx.recv_timeout(PROGRESS_AFTER).is_ok() {
                return;
            }
            let spinner = ProgressBar::new_spinner().with_message(message.to_string());
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
                spinner.set_style(style);
            }
            spinner.enable_steady_tick(Duration::from_millis(120));
            let _ = done_rx.recv();
            spinner.finish_and_clear();
        });
        let out = work();
        let _ = done_tx.send(());
        out
    })
}

/// [`with_progress`] as a [`ShowProgress`].
pub fn spinner(message: &str, work: &mut dyn FnMut()) {
    with_progress(message, work)
}
