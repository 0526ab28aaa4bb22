//! The liveness events of a launch: what the watcher ([`crate::run::watch`])
//! and the supervisor report about the server, as the agent, the log, the
//! metrics and `inspect` read them (`docs/inspect.md`, "Liveness events").
//! The types only: who sends them lives in `run/`.

use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde::Serialize;

use crate::status::oom::OomReading;

/// Why engine workers were lost ([`Event::WorkersLost`]'s `cause`; the
/// `cause` label of `engine_workers_lost_total`, `docs/metrics.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LossCause {
    /// LMCache's reaper dropped them after they went silent while the
    /// server answered (`reaped`).
    Reaped,
    /// They were attached to the server before it restarted and did not
    /// register with the restarted one within the reap grace
    /// (`server_restarted`): LMCache 0.5.6's engine workers do not
    /// reconnect to a new server.
    ServerRestarted,
}

impl LossCause {
    /// Every cause, in the order the metrics list them.
    pub(crate) const ALL: [LossCause; 2] = [LossCause::Reaped, LossCause::ServerRestarted];

    /// The serialised name: `reaped`, `server_restarted`.
    pub fn as_str(self) -> &'static str {
        match self {
            LossCause::Reaped => "reaped",
            LossCause::ServerRestarted => "server_restarted",
        }
    }
}

/// How a server process ended ([`Event::Exited`]'s `cause`; the `cause`
/// label of `server_exits_total`, `docs/metrics.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitCause {
    /// It exited with a status of its own (`status`).
    Status,
    /// A signal ended it, and the kernel recorded no OOM kill for it, or
    /// its count could not be read (`signal`).
    Signal,
    /// SIGKILL ended it and the kernel's OOM-kill count of its memory
    /// cgroup rose while it ran (`oom_kill`; [`crate::status::oom`]).
    OomKill,
    /// The launch stopped it after it gave no HTTP answer for
    /// [`WatchConfig::restart_unresponsive_after`](crate::run::watch::WatchConfig::restart_unresponsive_after) (`unresponsive`).
    Unresponsive,
}

impl ExitCause {
    /// Every cause, in the order the metrics list them.
    pub(crate) const ALL: [ExitCause; 4] = [
        ExitCause::Status,
        ExitCause::Signal,
        ExitCause::OomKill,
        ExitCause::Unresponsive,
    ];

    /// The serialised name: `status`, `signal`, `oom_kill`, `unresponsive`.
    pub fn as_str(self) -> &'static str {
        match self {
            ExitCause::Status => "status",
            ExitCause::Signal => "signal",
            ExitCause::OomKill => "oom_kill",
            ExitCause::Unresponsive => "unresponsive",
        }
    }
}

/// What the watcher reports. `Display` gives the log line; `Serialize`
/// gives an object tagged `event` (`docs/inspect.md`, "Liveness events").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// `/status` answered 200 for the first time since the server started.
    Ready,
    /// `worker_liveness.tracked_instances` rose to `count` (with an expected
    /// count: reached it or more).
    WorkersAttached {
        /// Engine workers attached now.
        count: u64,
    },
    /// Engine workers no longer reach the cache: the engine should be
    /// restarted. With [`LossCause::Reaped`], LMCache's reaper dropped
    /// workers that stopped sending heartbeats while the server still
    /// answers: `worker_liveness.tracked_instances` fell from `before` to
    /// `now` and the reaper's runs (its summary `reaped=N`) account for the
    /// fall (also sent for a fall the watcher cannot explain because the
    /// reaper's route did not answer). With [`LossCause::ServerRestarted`],
    /// `before` workers were attached when the previous start ended and
    /// only `now` registered with the restarted server within the reap
    /// grace after it was ready.
    WorkersLost {
        /// Workers attached before (the high-water mark since the last
        /// report; after a restart, the previous start's).
        before: u64,
        /// Workers attached now (after a restart: those that came back).
        now: u64,
        /// Why they are lost.
        cause: LossCause,
    },
    /// Workers unregistered cleanly: `tracked_instances` fell from `before`
    /// to `now` and no reaper run accounts for it (or reaping is off, so only
    /// an unregistration can lower it). Nothing to restart.
    WorkersDetached {
        /// Workers attached before.
        before: u64,
        /// Workers attached now.
        now: u64,
    },
    /// The server answered, but not healthily, for `polls` polls in a row.
    Unhealthy {
        /// Polls in a row.
        polls: u32,
        /// The last bad poll: `HTTP 503`, an unusable body, or the parts that
        /// report `is_healthy: false`.
        reason: String,
    },
    /// No HTTP answer for `polls` polls in a row after the server was ready.
    Unresponsive {
        /// Polls in a row.
        polls: u32,
        /// The last error (refused, timed out, ...).
        error: String,
    },
    /// A healthy answer after [`Event::Unhealthy`] or [`Event::Unresponsive`].
    Recovered,
    /// The supervised server process ended.
    Exited {
        /// Its exit code, when it exited normally.
        status: Option<i32>,
        /// The signal that ended it: directly, or through a wrapper such as
        /// `erebine-lmcache` that exits with 128+N when signal N ended its child.
        signal: Option<i32>,
        /// How it ended, from the status, the signal and the kernel's
        /// OOM-kill count.
        cause: ExitCause,
        /// What happened and where to look: for SIGKILL, whether the
        /// kernel recorded an OOM kill (the counter file and its counts);
        /// for [`ExitCause::Unresponsive`], how long it gave no answer.
        hint: Option<String>,
    },
}

impl Event {
    /// The [`Event::Exited`] for a server that ended with `status` by
    /// itself, `oom` being what its memory cgroup's OOM-kill count says of
    /// the run ([`crate::status::oom::OomBaseline::after_exit`]). SIGKILL (directly,
    /// or as a wrapper's 128+9) with a rise is [`ExitCause::OomKill`];
    /// without one it is [`ExitCause::Signal`], and the hint says whether
    /// the kernel recorded no OOM kill (something sent the signal) or its
    /// count could not be read.
    pub fn exited(status: ExitStatus, oom: &OomReading) -> Event {
        let (code, signal) = status_and_signal(status);
        let sigkill = signal == Some(Signal::SIGKILL as i32);
        let cause = match signal {
            None => ExitCause::Status,
            Some(_) if sigkill && matches!(oom, OomReading::Rose { .. }) => ExitCause::OomKill,
            Some(_) => ExitCause::Signal,
        };
        let hint = match oom {
            OomReading::Rose { file, before, after } if sigkill => Some(format!(
                "killed by SIGKILL, and the kernel OOM-killed it: oom_kill in {} rose from {before} to {after} while it ran. Lower L1 (EREBINE_AGENT_KV_OFFLOAD_SIZE_GB) or a memory-backed disk tier; `dmesg -T | grep -i -e oom -e 'killed process'` names what was killed",
                file.display()
            )),
            OomReading::Rose { file, before, after } => Some(format!(
                "the kernel OOM-killed a process of its memory cgroup while it ran (oom_kill in {} rose from {before} to {after}): one it started, or another process of that cgroup",
                file.display()
            )),
            OomReading::Unchanged { file, count } if sigkill => Some(format!(
                "killed by SIGKILL, and the kernel recorded no OOM kill (oom_kill in {} stayed at {count}): something sent it the signal (kill -9, a supervisor, a stop that timed out), not the OOM killer",
                file.display()
            )),
            OomReading::Unreadable { why } if sigkill => Some(format!(
                "killed by SIGKILL; whether the kernel OOM-killed it is unknown, its OOM-kill count cannot be read ({why}). Look at `dmesg -T | grep -i -e oom -e 'killed process'` or `journalctl -k`"
            )),
            _ => None,
        };
        Event::Exited {
            status: code,
            signal,
            cause,
            hint,
        }
    }

    /// The [`Event::Exited`] for a server the launch stopped (`status`)
    /// because it stayed silent too long ([`Watcher::unresponsive_too_long`](crate::run::watch::Watcher::unresponsive_too_long)).
    pub(crate) fn stopped_unresponsive(status: ExitStatus, silence: Silence) -> Event {
        let Silence { silent, limit } = silence;
        let (code, signal) = status_and_signal(status);
        Event::Exited {
            status: code,
            signal,
            cause: ExitCause::Unresponsive,
            hint: Some(format!(
                "stopped by the launch: no HTTP answer for {:.0}s, over the {}s a ready server may go without one (--unresponsive-timeout); restarted under the restart policy",
                silent.as_secs_f64(),
                limit.as_secs()
            )),
        }
    }
}

/// The exit code of `status`, and the signal that ended it: directly, or
/// through a wrapper's 128+N.
fn status_and_signal(status: ExitStatus) -> (Option<i32>, Option<i32>) {
    let code = status.code();
    let signal = status.signal().or_else(|| {
        code.filter(|c| (129..=128 + 64).contains(c))
            .map(|c| c - 128)
    });
    (code, signal)
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Ready => write!(f, "server ready: /status answers"),
            Event::WorkersAttached { count } => {
                write!(f, "engine workers attached: {count}")
            }
            Event::WorkersLost {
                before,
                now,
                cause: LossCause::Reaped,
            } => write!(
                f,
                "engine workers lost: {before} -> {now}: LMCache reaped them after they went silent while the server still answers; restart the engine"
            ),
            Event::WorkersLost {
                before,
                now,
                cause: LossCause::ServerRestarted,
            } => write!(
                f,
                "engine workers lost: {before} -> {now}: they did not register with the restarted server within the reap grace; LMCache's engine workers do not reconnect to a new server; restart the engine"
            ),
            Event::WorkersDetached { before, now } => write!(
                f,
                "engine workers detached: {before} -> {now} (unregistered cleanly)"
            ),
            Event::Unhealthy { polls, reason } => {
                write!(f, "server unhealthy for {polls} polls in a row: {reason}")
            }
            Event::Unresponsive { polls, error } => {
                write!(f, "server unresponsive for {polls} polls in a row: {error}")
            }
            Event::Recovered => write!(f, "server healthy again"),
            Event::Exited {
                status,
                signal,
                hint,
                ..
            } => {
                write!(f, "server exited")?;
                if let Some(code) = status {
                    write!(f, " with status {code}")?;
                }
                if let Some(sig) = signal {
                    match Signal::try_from(*sig) {
                        Ok(s) => write!(f, " (signal {s})")?,
                        Err(_) => write!(f, " (signal {sig})")?,
                    }
                }
                if let Some(hint) = hint {
                    write!(f, ": {hint}")?;
                }
                Ok(())
            }
        }
    }
}

/// A ready server's silence that is too long
/// ([`Watcher::unresponsive_too_long`](crate::run::watch::Watcher::unresponsive_too_long)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silence {
    /// How long it has given no HTTP answer.
    pub silent: Duration,
    /// How long it may ([`WatchConfig::restart_unresponsive_after`](crate::run::watch::WatchConfig::restart_unresponsive_after)).
    pub limit: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oom_file() -> std::path::PathBuf {
        "/sys/fs/cgroup/memory/node/memory.oom_control".into()
    }

    #[test]
    fn sigkill_is_an_oom_kill_only_when_the_kernel_counted_one() {
        let rose = OomReading::Rose {
            file: oom_file(),
            before: 0,
            after: 1,
        };
        let unchanged = OomReading::Unchanged {
            file: oom_file(),
            count: 2,
        };
        let unreadable = OomReading::Unreadable {
            why: "at the start: the process's /proc/<pid>/cgroup names no memory cgroup".into(),
        };
        // Directly, or through the wrapper's 128+9.
        for raw in [9, 137 << 8] {
            let status = ExitStatus::from_raw(raw);
            match Event::exited(status, &rose) {
                Event::Exited {
                    signal: Some(9),
                    cause: ExitCause::OomKill,
                    hint: Some(hint),
                    ..
                } => assert!(
                    hint.contains("OOM-killed")
                        && hint.contains("memory/node/memory.oom_control rose from 0 to 1"),
                    "{hint}"
                ),
                other => panic!("{raw}: {other:?}"),
            }
            match Event::exited(status, &unchanged) {
                Event::Exited {
                    cause: ExitCause::Signal,
                    hint: Some(hint),
                    ..
                } => assert!(
                    hint.contains("recorded no OOM kill")
                        && hint.contains("stayed at 2")
                        && hint.contains("kill -9"),
                    "{hint}"
                ),
                other => panic!("{raw}: {other:?}"),
            }
            match Event::exited(status, &unreadable) {
                Event::Exited {
                    cause: ExitCause::Signal,
                    hint: Some(hint),
                    ..
                } => assert!(
                    hint.contains("unknown") && hint.contains("names no memory cgroup"),
                    "{hint}"
                ),
                other => panic!("{raw}: {other:?}"),
            }
        }
        let line = Event::exited(ExitStatus::from_raw(137 << 8), &unchanged).to_string();
        assert!(
            line.contains("status 137") && line.contains("SIGKILL"),
            "{line}"
        );
    }

    #[test]
    fn other_endings_are_a_status_or_a_signal_whatever_the_count() {
        let unchanged = OomReading::Unchanged {
            file: oom_file(),
            count: 0,
        };
        assert_eq!(
            Event::exited(ExitStatus::from_raw(15), &unchanged),
            Event::Exited {
                status: None,
                signal: Some(15),
                cause: ExitCause::Signal,
                hint: None
            }
        );
        assert_eq!(
            Event::exited(ExitStatus::from_raw(1 << 8), &unchanged),
            Event::Exited {
                status: Some(1),
                signal: None,
                cause: ExitCause::Status,
                hint: None
            }
        );
        // A rise with another ending: something else of the cgroup was
        // OOM-killed; said, not counted as the server's OOM kill.
        let rose = OomReading::Rose {
            file: oom_file(),
            before: 4,
            after: 5,
        };
        match Event::exited(ExitStatus::from_raw(1 << 8), &rose) {
            Event::Exited {
                cause: ExitCause::Status,
                hint: Some(hint),
                ..
            } => assert!(hint.contains("rose from 4 to 5"), "{hint}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_server_stopped_for_silence_says_so() {
        let event = Event::stopped_unresponsive(
            ExitStatus::from_raw(143 << 8),
            Silence {
                silent: Duration::from_secs(8),
                limit: Duration::from_secs(5),
            },
        );
        match &event {
            Event::Exited {
                cause: ExitCause::Unresponsive,
                signal: Some(15),
                hint: Some(hint),
                ..
            } => assert!(
                hint.contains("no HTTP answer for 8s") && hint.contains("5s"),
                "{hint}"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            serde_json::to_value(&event).unwrap()["cause"],
            "unresponsive"
        );
    }

    #[test]
    fn events_serialize_with_a_tag() {
        let json = serde_json::to_value(Event::WorkersLost {
            before: 1,
            now: 0,
            cause: LossCause::Reaped,
        })
        .unwrap();
        assert_eq!(
            json,
            serde_json::json!({"event": "workers_lost", "before": 1, "now": 0, "cause": "reaped"})
        );
        let after_restart = Event::WorkersLost {
            before: 2,
            now: 1,
            cause: LossCause::ServerRestarted,
        };
        assert_eq!(
            serde_json::to_value(&after_restart).unwrap(),
            serde_json::json!({"event": "workers_lost", "before": 2, "now": 1, "cause": "server_restarted"})
        );
        let exited = Event::exited(
            ExitStatus::from_raw(9),
            &OomReading::Unchanged {
                file: oom_file(),
                count: 0,
            },
        );
        let json = serde_json::to_value(&exited).unwrap();
        assert_eq!(json["event"], "exited");
        assert_eq!(json["signal"], 9);
        assert_eq!(json["cause"], "signal");
        assert!(json["hint"].is_string());
    }
}
