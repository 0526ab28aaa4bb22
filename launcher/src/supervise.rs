//! Running a child server process so that it never outlives us: its own
//! process group (so a stop reaches every process it started), a parent-death
//! signal (so it dies with us even when we are SIGKILLed), forwarded
//! SIGTERM/SIGINT, and a bounded graceful stop.
//!
//! Spawn from a current-thread tokio runtime: Linux delivers the parent-death
//! signal when the *thread* that forked the child exits.

use std::collections::VecDeque;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

/// How many of the server's last output lines are kept for error messages.
pub const TAIL_LINES: usize = 40;

/// A child process in its own process group.
pub struct Supervised {
    child: Child,
    pgid: Pid,
    tail: Arc<Mutex<VecDeque<String>>>,
}

/// Whether the child's output is passed through untouched or also kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The child writes to our stdout/stderr directly (a drop-in wrapper).
    Inherit,
    /// Each line of the child's stdout and stderr is copied to our stderr and
    /// the last [`TAIL_LINES`] are kept for [`Supervised::tail`], except the
    /// lines LMCache writes for every `/status` poll (`POLL_NOISE`).
    Tee,
}

impl Supervised {
    /// Starts `command` in a new process group with SIGTERM as its
    /// parent-death signal and stdin closed.
    pub fn spawn(mut command: Command, output: Output) -> io::Result<Self> {
        let parent = nix::unistd::getpid();
        command
            .stdin(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        if output == Output::Tee {
            command.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        // SAFETY: the closure only makes async-signal-safe system calls.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect.
                if libc::getppid() != parent.as_raw() {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let mut child = command.spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| io::Error::other("child exited at once"))?;
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
        if let Some(out) = child.stdout.take() {
            tokio::spawn(copy_lines(out, tail.clone()));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(copy_lines(err, tail.clone()));
        }
        Ok(Supervised {
            child,
            pgid: Pid::from_raw(pid as i32),
            tail,
        })
    }

    /// The child's process id (also its process group id).
    pub fn pid(&self) -> i32 {
        self.pgid.as_raw()
    }

    /// Sends `signal` to the child's whole process group. A group that is
    /// already gone is not an error.
    pub fn signal(&self, signal: Signal) {
        let _ = killpg(self.pgid, signal);
    }

    /// Waits for the child to exit.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Stops the child: SIGTERM to its group, up to `grace` to exit, then
    /// SIGKILL. Whatever else is left in the group is killed afterwards.
    pub async fn stop(&mut self, grace: Duration) -> io::Result<ExitStatus> {
        self.signal(Signal::SIGTERM);
        let status = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status?,
            Err(_) => {
                tracing::warn!(
                    pid = self.pid(),
                    "server did not stop within {}s of SIGTERM; sending SIGKILL",
                    grace.as_secs()
                );
                self.signal(Signal::SIGKILL);
                self.child.wait().await?
            }
        };
        self.signal(Signal::SIGKILL);
        Ok(status)
    }

    /// The last lines the child printed (with [`Output::Tee`]).
    pub fn tail(&self) -> Vec<String> {
        self.tail
            .lock()
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Server lines that every `/status` poll produces (LMCache 0.5.6 logs the
/// HTTP access and an allocator check for each request): at one poll every
/// 2 s they would be 150 lines a minute of the launcher's log, so they are
/// neither echoed nor kept in the tail. They cannot be turned off at the
/// source: the MP server builds its uvicorn server with `access_log=True`
/// and `log_level="info"` fixed (`lmcache/v1/multiprocess/http_server.py`),
/// and the allocator check logs at info level, the level the rest of the
/// server's useful lines need.
const POLL_NOISE: &[&str] = &[
    "\"GET /status HTTP/1.1\"",
    "Checking memory allocator consistency",
    " - Total active allocations",
    " - Total allocated size",
    " - Total free size",
];

async fn copy_lines(stream: impl AsyncRead + Unpin, tail: Arc<Mutex<VecDeque<String>>>) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if POLL_NOISE.iter().any(|noise| line.contains(noise)) {
            continue;
        }
        eprintln!("{line}");
        if let Ok(mut t) = tail.lock() {
            if t.len() == TAIL_LINES {
                t.pop_front();
            }
            t.push_back(line);
        }
    }
}

/// Whether the TCP listener on `port` (IPv4, any local address) belongs to a
/// process in the tree rooted at `root` (the server we started and its
/// descendants). `Some(false)`: another process listens there; `None`: no
/// listener found, or `/proc` could not tell.
///
/// Reads `/proc/net/tcp` for the listening socket's inode, then the `fd`
/// links of the tree's processes.
pub fn listener_owned_by_tree(port: u16, root: i32) -> Option<bool> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f.get(1)?.rsplit(':').next()?;
            let listening = *f.get(3)? == "0A";
            (listening && u16::from_str_radix(local_port, 16).ok()? == port)
                .then(|| format!("socket:[{}]", f.get(9).unwrap_or(&"")))
        })
        .collect();
    if inodes.is_empty() {
        return None;
    }
    let owned = process_tree(root).into_iter().any(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    });
    Some(owned)
}

/// `root` and every live descendant of it, from the parent ids in `/proc`.
fn process_tree(root: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid ...: comm may hold spaces and parentheses.
            let ppid = stat
                .get(stat.rfind(')')? + 2..)?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    tree
}

/// The exit code a wrapper reports for a child's status: its code, or
/// 128 + the signal number that killed it (the shell's convention).
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Describes how a child ended, e.g. `"exit status 1"` or `"killed by
/// SIGKILL"`.
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => match Signal::try_from(sig) {
            Ok(s) => format!("killed by {s}"),
            Err(_) => format!("killed by signal {sig}"),
        },
        _ => "ended".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn stop_ends_the_whole_group_and_reports_the_status() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo 'INFO: 127.0.0.1:1 - \"GET /status HTTP/1.1\" 200 OK'; sleep 30 & echo started; wait",
        ]);
        let mut child = Supervised::spawn(cmd, Output::Tee).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let status = child.stop(Duration::from_secs(5)).await.unwrap();
        assert_eq!(describe(status), "killed by SIGTERM");
        assert_eq!(exit_code(status), 143);
        assert_eq!(child.tail(), vec!["started".to_string()]);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            live_members(child.pid()),
            0,
            "a process of the group survived the stop"
        );
    }

    /// Processes of group `pgid` that are not zombies (a killed orphan stays a
    /// zombie until init reaps it).
    fn live_members(pgid: i32) -> usize {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
            .filter(|stat| {
                // pid (comm) state ppid pgrp ...
                let rest = &stat[stat.rfind(')').unwrap() + 2..];
                let fields: Vec<&str> = rest.split_whitespace().collect();
                fields[0] != "Z" && fields[2] == pgid.to_string()
            })
            .count()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_child_that_ignores_sigterm_is_killed_after_the_grace() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "trap '' TERM; echo ready; sleep 30"]);
        let mut child = Supervised::spawn(cmd, Output::Tee).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let status = child.stop(Duration::from_millis(300)).await.unwrap();
        assert_eq!(describe(status), "killed by SIGKILL");
    }

    #[test]
    fn a_listener_is_attributed_to_the_process_tree_that_holds_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id() as i32;
        assert_eq!(listener_owned_by_tree(port, me), Some(true));
        // A child does not hold the socket (Rust opens it close-on-exec).
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert_eq!(listener_owned_by_tree(port, child.id() as i32), Some(false));
        let _ = child.kill();
        let _ = child.wait();
        drop(listener);
        assert_eq!(listener_owned_by_tree(port, me), None);
    }

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(describe(ExitStatus::from_raw(3 << 8)), "exit status 3");
    }
}
