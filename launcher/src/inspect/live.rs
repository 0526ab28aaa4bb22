//! `lmcache-tier inspect --watch [SECONDS]`: the text view redrawn in place
//! on the terminal, as `watch(1)` does, with a usage bar per tier and the
//! rows that changed since the previous refresh marked (the frame is
//! `watch_view`'s), until SIGINT (Ctrl-C) or SIGTERM.
//!
//! It draws on the terminal's alternate screen with the cursor hidden, and
//! gives both back however it stops: a signal, or a write that fails.
//! Each refresh reads everything again (`/status`, the disk tiers, the
//! gateways, the launch's metrics); a server that does not answer is shown
//! as such and the refreshes go on. `docs/inspect.md`, "`inspect --watch`".

use std::io::{self, IsTerminal};
use std::time::{Duration, SystemTime};

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::{sleep_until, Instant};

use super::watch_view::{frame, Snapshot};
use super::{InspectError, Inspection};
use crate::output;
use crate::process::ProcessError;

/// The shortest refresh interval `--watch` takes: 0.1 s, `watch(1)`'s.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The longest refresh interval `--watch` takes: one day (86 400 s).
pub const MAX_INTERVAL: Duration = Duration::from_secs(86_400);

/// A `--watch` value that is not a refresh interval (clap exits 2 and names
/// the flag).
#[derive(Debug, thiserror::Error)]
#[error("{} is not a refresh interval: give seconds from 0.1 to 86400, such as 2 or 0.5", lmcache_tier_spec::shown_value(.0))]
pub struct NotAnInterval(
    /// The value as given.
    pub String,
);

/// Parses the seconds of `--watch`: a number, fractions allowed, from
/// [`MIN_INTERVAL`] to [`MAX_INTERVAL`]; 0, negative numbers, `NaN` and
/// infinities are refused.
///
/// # Errors
/// [`NotAnInterval`].
pub fn interval(text: &str) -> Result<Duration, NotAnInterval> {
    text.trim()
        .parse::<f64>()
        .ok()
        .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
        .filter(|d| (MIN_INTERVAL..=MAX_INTERVAL).contains(d))
        .ok_or_else(|| NotAnInterval(text.to_string()))
}

/// Checks that stdout is a terminal, which `--watch` redraws.
///
/// # Errors
/// [`InspectError::NotATerminal`] (exit 2) for a pipe, a file or
/// `/dev/null`.
pub fn check_terminal() -> Result<(), InspectError> {
    match io::stdout().is_terminal() {
        true => Ok(()),
        false => Err(InspectError::NotATerminal),
    }
}

/// Redraws the report `read` makes every `interval` (the pause after each
/// frame is drawn) until SIGINT or SIGTERM, then gives the terminal back
/// and returns `Ok`. A resized terminal is redrawn at once; Ctrl-Z gives
/// the terminal back while the process is stopped, and redraws on `fg`.
///
/// # Errors
/// [`ProcessError::Signals`] when the signals cannot be caught,
/// [`ProcessError::Stdout`] when the terminal cannot be written.
pub async fn run(
    interval: Duration,
    mut read: impl AsyncFnMut() -> Inspection,
) -> Result<(), ProcessError> {
    let mut signals = Signals::install().map_err(ProcessError::Signals)?;
    let screen = Screen::enter().map_err(ProcessError::Stdout)?;
    let mut before: Option<Snapshot> = None;
    loop {
        let report = tokio::select! {
            report = read() => report,
            stopped = signals.stop(&screen) => return stopped,
        };
        let now = Snapshot::of(&report, now_rfc3339());
        if !show(&screen, &mut signals, (&now, before.as_ref()), interval).await? {
            return Ok(());
        }
        before = Some(now);
    }
}

/// Draws `now` (changes since `before` marked) and waits `interval`,
/// redrawing on a resize; `false` when a stop was asked for.
async fn show(
    screen: &Screen,
    signals: &mut Signals,
    (now, before): (&Snapshot, Option<&Snapshot>),
    interval: Duration,
) -> Result<bool, ProcessError> {
    let draw = || screen.draw(&frame(now, before, interval, terminal_size()));
    draw().map_err(ProcessError::Stdout)?;
    let deadline = Instant::now() + interval;
    loop {
        tokio::select! {
            () = sleep_until(deadline) => return Ok(true),
            wake = signals.next() => match wake {
                Wake::Stop => return Ok(false),
                Wake::Resize => draw().map_err(ProcessError::Stdout)?,
                Wake::Suspend => {
                    screen.suspend().map_err(ProcessError::Stdout)?;
                    draw().map_err(ProcessError::Stdout)?;
                }
            },
        }
    }
}

/// The time now, RFC 3339 UTC to the second.
fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// What a signal asks of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// SIGINT or SIGTERM: stop.
    Stop,
    /// SIGWINCH: the terminal changed size.
    Resize,
    /// SIGTSTP (Ctrl-Z): give the terminal back, stop, and take it again
    /// when continued.
    Suspend,
}

/// The signals the loop handles.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    resize: Signal,
    suspend: Signal,
}

impl Signals {
    fn install() -> io::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            resize: signal(SignalKind::window_change())?,
            suspend: signal(SignalKind::from_raw(libc::SIGTSTP))?,
        })
    }

    /// The next signal.
    async fn next(&mut self) -> Wake {
        tokio::select! {
            _ = self.interrupt.recv() => Wake::Stop,
            _ = self.terminate.recv() => Wake::Stop,
            _ = self.resize.recv() => Wake::Resize,
            _ = self.suspend.recv() => Wake::Suspend,
        }
    }

    /// Returns when a stop is asked for; resizes are let by (the next frame
    /// is drawn to the new size) and a Ctrl-Z suspends on `screen`.
    async fn stop(&mut self, screen: &Screen) -> Result<(), ProcessError> {
        loop {
            match self.next().await {
                Wake::Stop => return Ok(()),
                Wake::Resize => {}
                Wake::Suspend => screen.suspend().map_err(ProcessError::Stdout)?,
            }
        }
    }
}

/// Switches to the alternate screen and hides the cursor.
const ENTER: &str = "\x1b[?1049h\x1b[?25l";
/// Shows the cursor and switches back to the screen the operator had.
const LEAVE: &str = "\x1b[?25h\x1b[?1049l";

/// The terminal while `--watch` draws on it: the alternate screen with the
/// cursor hidden, given back when dropped.
struct Screen;

impl Screen {
    fn enter() -> io::Result<Screen> {
        output::stdout_text(ENTER)?;
        Ok(Screen)
    }

    fn draw(&self, lines: &[String]) -> io::Result<()> {
        output::stdout_text(&paint(lines))
    }

    /// What Ctrl-Z does to a program that draws on the alternate screen:
    /// the operator's screen and cursor back, the process stopped (SIGSTOP:
    /// SIGTSTP itself is caught here), and the alternate screen again once
    /// it is continued (`fg`); the caller redraws.
    fn suspend(&self) -> io::Result<()> {
        output::stdout_text(LEAVE)?;
        // SAFETY: raise has no memory effects; it returns once continued.
        unsafe { libc::raise(libc::SIGSTOP) };
        output::stdout_text(ENTER)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = output::stdout_text(LEAVE);
    }
}

/// The escapes that draw `lines` over the previous frame: cursor home, each
/// line followed by clear-to-end-of-line, then clear to the end of the
/// screen, so nothing of a longer previous frame stays and nothing flickers.
fn paint(lines: &[String]) -> String {
    let mut out = String::from("\x1b[H");
    out.push_str(&lines.join("\x1b[K\r\n"));
    out.push_str("\x1b[K\x1b[J");
    out
}

/// The terminal's columns and rows, from stdout; 80 x 24 when it does not
/// say.
fn terminal_size() -> (usize, usize) {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into `size`, which outlives
    // the call.
    let asked = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    match (asked, size.ws_col, size.ws_row) {
        (0, columns, rows) if columns > 0 && rows > 0 => (columns.into(), rows.into()),
        _ => (80, 24),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_positive_seconds_with_fractions_within_bounds() {
        assert_eq!(interval("2").unwrap(), Duration::from_secs(2));
        assert_eq!(interval("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(interval("0.1").unwrap(), MIN_INTERVAL);
        assert_eq!(interval("86400").unwrap(), MAX_INTERVAL);
        for refused in ["0", "-1", "NaN", "inf", "0.05", "86401", "", "2s", "1e400"] {
            let e = interval(refused).unwrap_err();
            assert!(
                e.to_string().contains("is not a refresh interval"),
                "{refused}: {e}"
            );
        }
    }

    #[test]
    fn a_frame_is_painted_over_the_previous_one_from_the_top() {
        assert_eq!(
            paint(&["a".into(), "b".into()]),
            "\x1b[Ha\x1b[K\r\nb\x1b[K\x1b[J"
        );
    }
}
