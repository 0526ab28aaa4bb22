//! Running a child server process so that it never outlives us: its own
//! process group (so a stop reaches every process it started), a parent-death
//! signal (so it dies with us even when we are SIGKILLed), forwarded
//! signals, and a bounded graceful stop.
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

use crate::status::oom::{OomBaseline, OomReading};

/// How many of the server's last output lines are kept for error messages.
pub const TAIL_LINES: usize = 40;

/// The variable every supervised child's environment carries, so that its
/// descendants can be told apart from any other process's once they are
/// orphaned: the ids of the [`Supervised`] spawns it descends from,
/// `:`-separated (`4242.1:4300.1` for a server that `erebine-lmcache`
/// started under a launch).
pub const TREE_VARIABLE: &str = "EREBINE_SUPERVISED_BY";

/// The number of the next [`Supervised`] spawn of this process.
static NEXT_TREE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A child process in its own process group.
pub struct Supervised {
    child: Child,
    pgid: Pid,
    /// This spawn's id in [`TREE_VARIABLE`].
    tree: String,
    tail: Arc<Mutex<VecDeque<String>>>,
    /// The tasks copying the child's stdout and stderr into `tail`.
    readers: Vec<tokio::task::JoinHandle<()>>,
    /// The OOM-kill count of the child's memory cgroup at the spawn.
    oom: OomBaseline,
}

/// How long [`Supervised::wait`] waits, once the child exited, for its
/// last output to be read: a child that dies at once (a refused command
/// line) exits before its message is copied, and the message is the reason
/// the launch reports. A grandchild keeping the pipe open ends the wait.
const OUTPUT_DRAIN: Duration = Duration::from_millis(500);

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
    /// parent-death signal and stdin closed, and reads the OOM-kill count of
    /// its memory cgroup ([`Supervised::oom_reading`]).
    pub fn spawn(mut command: Command, output: Output) -> io::Result<Self> {
        let parent = nix::unistd::getpid();
        let tree = format!(
            "{parent}.{}",
            NEXT_TREE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let inherited = command
            .as_std()
            .get_envs()
            .find(|(k, _)| *k == TREE_VARIABLE)
            .map(|(_, v)| v.map(|v| v.to_os_string()))
            .unwrap_or_else(|| std::env::var_os(TREE_VARIABLE));
        let mut marker = inherited.unwrap_or_default();
        if !marker.is_empty() {
            marker.push(":");
        }
        marker.push(&tree);
        command
            .env(TREE_VARIABLE, marker)
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
        let oom = OomBaseline::of_process(pid);
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(tokio::spawn(copy_lines(out, tail.clone())));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(tokio::spawn(copy_lines(err, tail.clone())));
        }
        Ok(Supervised {
            child,
            pgid: Pid::from_raw(pid as i32),
            tree,
            tail,
            readers,
            oom,
        })
    }

    /// What the kernel's OOM-kill count of the child's memory cgroup says
    /// of this run: read at the spawn and again now (call it once the child
    /// has exited; `crate::status::oom`).
    pub fn oom_reading(&self) -> OomReading {
        self.oom.after_exit()
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

    /// Sends signal `number` (any, real-time ones included) to the child's
    /// whole process group, as a wrapper forwards what it receives.
    pub(crate) fn forward(&self, number: i32) {
        // SAFETY: killpg has no memory effects.
        let _ = unsafe { libc::killpg(self.pgid.as_raw(), number) };
    }

    /// Whether a process of the child's tree listens on a TCP port: the
    /// server got past its command line and runs.
    pub fn listens(&self) -> bool {
        tree_listens(self.pid())
    }

    /// Waits for the child to exit, and then (at most 500 ms)
    /// for its last output to reach [`Supervised::tail`].
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.child.wait().await?;
        let deadline = tokio::time::Instant::now() + OUTPUT_DRAIN;
        for reader in std::mem::take(&mut self.readers) {
            let _ = tokio::time::timeout_at(deadline, reader).await;
        }
        Ok(status)
    }

    /// Stops the child: SIGTERM to its group and SIGCONT to every process
    /// of its tree (a process stopped by SIGSTOP acts on the SIGTERM only
    /// once continued, and `erebine-lmcache` runs the server in a group of
    /// its own), up to `grace` to exit, then SIGKILL to the tree and the
    /// group. Whatever else is left in the group is killed afterwards.
    pub async fn stop(&mut self, grace: Duration) -> io::Result<ExitStatus> {
        self.signal(Signal::SIGTERM);
        self.signal_tree(Signal::SIGCONT);
        let status = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status?,
            Err(_) => {
                tracing::warn!(
                    pid = self.pid(),
                    "server did not stop within {}s of SIGTERM; sending SIGKILL",
                    grace.as_secs()
                );
                self.kill_all();
                self.child.wait().await?
            }
        };
        self.signal(Signal::SIGKILL);
        Ok(status)
    }

    /// SIGKILL to the child, each of its live descendants (in whatever
    /// process group) and its process group.
    pub fn kill_all(&self) {
        self.signal_tree(Signal::SIGKILL);
        self.signal(Signal::SIGKILL);
    }

    /// Sends `signal` to the child and each of its live descendants (found
    /// from the parent ids in `/proc`).
    fn signal_tree(&self, signal: Signal) {
        for pid in process_tree(self.pid()) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
        }
    }

    /// The last lines the child printed (with [`Output::Tee`]).
    pub fn tail(&self) -> Vec<String> {
        self.tail
            .lock()
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Server lines that every poll produces (LMCache 0.5.6 logs the HTTP access
/// of `/status` and of the reaper route the watcher reads beside it, and an
/// allocator check for each request): at one poll every 2 s they would be
/// 150 lines a minute of the launcher's log, so they are
/// neither echoed nor kept in the tail. They cannot be turned off at the
/// source: the MP server builds its uvicorn server with `access_log=True`
/// and `log_level="info"` fixed (`lmcache/v1/multiprocess/http_server.py`),
/// and the allocator check logs at info level, the level the rest of the
/// server's useful lines need.
const POLL_NOISE: &[&str] = &[
    "\"GET /status HTTP/1.1\"",
    "\"GET /periodic-threads/lmcache-mp-worker-reaper HTTP/1.1\"",
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
        crate::output::stderr_line(&line);
        if let Ok(mut t) = tail.lock() {
            if t.len() == TAIL_LINES {
                t.pop_front();
            }
            t.push_back(line);
        }
    }
}

/// The signals that end a process by default, that it may catch, and that
/// come from outside it (`kill`, a terminal, a service manager, a resource
/// limit): SIGHUP, SIGINT, SIGQUIT, SIGABRT, SIGUSR1, SIGUSR2, SIGALRM,
/// SIGTERM, SIGSTKFLT, SIGXCPU, SIGXFSZ, SIGVTALRM, SIGPROF, SIGIO, SIGPWR
/// and the real-time signals SIGRTMIN..=SIGRTMAX (signal(7)). A supervisor
/// treats each as SIGTERM (`docs/operations.md`, "Stopping").
///
/// Not here: SIGKILL and SIGSTOP (no process can catch them; the server's
/// parent-death signal covers SIGKILL), SIGILL, SIGFPE, SIGSEGV, SIGBUS,
/// SIGSYS and SIGTRAP (a fault of this process itself, or a debugger),
/// SIGPIPE (ignored, so that a closed output stream is a failed write, see
/// [`crate::output`]), and the job-control and informational signals, whose
/// default action does not end a process.
pub fn terminating_signals() -> Vec<i32> {
    let named = [
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGABRT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGTERM,
        libc::SIGSTKFLT,
        libc::SIGXCPU,
        libc::SIGXFSZ,
        libc::SIGVTALRM,
        libc::SIGPROF,
        libc::SIGIO,
        libc::SIGPWR,
    ];
    named
        .into_iter()
        .chain(libc::SIGRTMIN()..=libc::SIGRTMAX())
        .collect()
}

/// The name of signal `number`: `SIGHUP`, or `SIGRTMIN+3` for a real-time
/// signal.
pub fn signal_name(number: i32) -> String {
    match Signal::try_from(number) {
        Ok(signal) => signal.as_str().to_string(),
        Err(_) if number >= libc::SIGRTMIN() => format!("SIGRTMIN+{}", number - libc::SIGRTMIN()),
        Err(_) => format!("signal {number}"),
    }
}

/// Every [`terminating_signals`] signal this process receives, in order,
/// from the moment [`TerminatingSignals::install`] returns: each one is
/// caught, so none of them ends the process before its server is stopped.
pub struct TerminatingSignals {
    received: tokio::sync::mpsc::UnboundedReceiver<i32>,
}

impl TerminatingSignals {
    /// Catches every [`terminating_signals`] signal; call it from inside a
    /// tokio runtime. Errors: a signal that cannot be caught (the message
    /// names it).
    pub fn install() -> io::Result<Self> {
        let (tx, received) = tokio::sync::mpsc::unbounded_channel();
        for number in terminating_signals() {
            let mut stream =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(number))
                    .map_err(|e| {
                        io::Error::other(format!("cannot catch {}: {e}", signal_name(number)))
                    })?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    if tx.send(number).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(TerminatingSignals { received })
    }

    /// Waits for the next signal and returns its number.
    pub async fn recv(&mut self) -> i32 {
        match self.received.recv().await {
            Some(number) => number,
            None => std::future::pending().await,
        }
    }

    /// A signal that arrived while this thread was busy (blocking work such
    /// as housekeeping, before anything new starts), if any: the runtime is
    /// given a moment to read its pending signals.
    pub(crate) async fn already_received(&mut self) -> Option<i32> {
        tokio::time::timeout(Duration::from_millis(20), self.recv())
            .await
            .ok()
    }
}

/// Set once [`become_subreaper`] has made this process a subreaper.
static SUBREAPER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes this process the reaper of its orphaned descendants
/// (`PR_SET_CHILD_SUBREAPER`): when a wrapper between it and the server (an
/// `erebine-lmcache` killed by SIGKILL, an OOM kill) dies first, the
/// server's processes become this process's children, and
/// [`Supervised::reap_orphans`] waits for them before the tier's lock is
/// released.
///
/// Safe in any process, an agent that runs several launches or other
/// children included: [`Supervised::reap_orphans`] stops only the adopted
/// processes of the server it is called for (those whose environment
/// carries its spawn's id in [`TREE_VARIABLE`]), never another child. A
/// descendant that cleared its environment is not recognised and is left
/// running (the safe side), as it would be without a subreaper.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    SUBREAPER.store(true, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

impl Supervised {
    /// Stops and reaps, once this child has exited, the processes of its
    /// tree this process adopted as a subreaper (see [`become_subreaper`]):
    /// the children of this process whose environment names this spawn in
    /// [`TREE_VARIABLE`]. Each gets SIGTERM (and its process group too) at
    /// once, SIGKILL after `grace`. Returns at once when this process is not
    /// a subreaper.
    pub async fn reap_orphans(&self, grace: Duration) {
        if SUBREAPER.load(std::sync::atomic::Ordering::SeqCst) {
            reap_tree(&self.tree, grace).await;
        }
    }
}

/// Whether the environment of `pid` names the spawn `tree` in
/// [`TREE_VARIABLE`].
fn descends_from(pid: i32, tree: &str) -> bool {
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let prefix = format!("{TREE_VARIABLE}=");
    environ
        .split(|b| *b == 0)
        .filter_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .any(|ids| ids.split(|b| *b == b':').any(|id| id == tree.as_bytes()))
}

async fn reap_tree(tree: &str, grace: Duration) {
    let started = std::time::Instant::now();
    let mut told: Vec<(i32, i32)> = Vec::new();
    loop {
        // One already told stays ours once it has exited (a zombie's
        // environment reads empty) until it is reaped.
        let children: Vec<i32> = children_of(std::process::id() as i32)
            .into_iter()
            .filter(|pid| told.iter().any(|(p, _)| p == pid) || descends_from(*pid, tree))
            .collect();
        if children.is_empty() {
            return;
        }
        let signal = match started.elapsed() >= grace {
            true => libc::SIGKILL,
            false => libc::SIGTERM,
        };
        for pid in children {
            if !told.contains(&(pid, signal)) {
                tracing::warn!(
                    pid,
                    "a process of the LMCache server outlived its wrapper; sending {}",
                    signal_name(signal)
                );
                // SAFETY: kill and killpg have no memory effects.
                unsafe {
                    libc::kill(pid, signal);
                    libc::killpg(pid, signal);
                }
                told.push((pid, signal));
            }
            // SAFETY: reaps `pid` only if it has exited; no memory effects.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reaps this process's children that have exited, but `keep` (the
/// server, which its own [`Supervised::wait`] reaps): orphans adopted by
/// a process that runs as PID 1 in a container, whose exit nobody else
/// waits for, so that they do not stay zombies. A child is reaped only
/// once `/proc` shows it exited (state `Z`), never waited on while it
/// runs. It takes the exit status of every
/// child but `keep`: call it only while this process waits on no other
/// child of its own.
pub(crate) fn reap_exited_children(keep: i32) {
    let me = std::process::id() as i32;
    for (pid, _, _) in process_stats()
        .into_iter()
        .filter(|&(pid, ppid, state)| ppid == me && pid != keep && state == 'Z')
    {
        let _ = nix::sys::wait::waitpid(
            Pid::from_raw(pid),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        );
    }
}

/// The processes whose parent is `parent`, from `/proc`.
fn children_of(parent: i32) -> Vec<i32> {
    process_parents()
        .into_iter()
        .filter(|(_, ppid)| *ppid == parent)
        .map(|(pid, _)| pid)
        .collect()
}

/// Whether the TCP listener on `port` (IPv4, any local address) belongs to a
/// process in the tree rooted at `root` (the server we started and its
/// descendants). `Some(false)`: another process listens there; `None`: no
/// listener found, or `/proc` could not tell.
pub(crate) fn listener_owned_by_tree(port: u16, root: i32) -> Option<bool> {
    let inodes = listening_sockets(&["/proc/net/tcp"], Some(port));
    if inodes.is_empty() {
        return None;
    }
    Some(tree_holds(root, &inodes))
}

/// Whether any process in the tree rooted at `root` holds a listening TCP
/// socket (IPv4 or IPv6).
pub(crate) fn tree_listens(root: i32) -> bool {
    let inodes = listening_sockets(&["/proc/net/tcp", "/proc/net/tcp6"], None);
    !inodes.is_empty() && tree_holds(root, &inodes)
}

/// The `socket:[inode]` link targets of the listening sockets in the
/// kernel's socket `tables`, on `port` or on any port.
fn listening_sockets(tables: &[&str], port: Option<u16>) -> Vec<String> {
    tables
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
                    let listening = *f.get(3)? == "0A";
                    (listening && port.is_none_or(|p| p == local_port))
                        .then(|| format!("socket:[{}]", f.get(9).unwrap_or(&"")))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Whether a process in the tree rooted at `root` has one of `inodes` open,
/// from the `fd` links in `/proc`.
fn tree_holds(root: i32, inodes: &[String]) -> bool {
    process_tree(root).into_iter().any(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    })
}

/// Every process in `/proc` with its parent's id.
fn process_parents() -> Vec<(i32, i32)> {
    process_stats()
        .into_iter()
        .map(|(pid, ppid, _)| (pid, ppid))
        .collect()
}

/// Each process's id, parent id and state letter (`Z` for one that exited
/// and was not reaped), from `/proc/<pid>/stat`.
fn process_stats() -> Vec<(i32, i32, char)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid ...: comm may hold spaces and parentheses.
            let mut fields = stat.get(stat.rfind(')')? + 2..)?.split_whitespace();
            let state = fields.next()?.chars().next()?;
            let ppid = fields.next()?.parse().ok()?;
            Some((pid, ppid, state))
        })
        .collect()
}

/// `root` and every live descendant of it, from the parent ids in `/proc`.
fn process_tree(root: i32) -> Vec<i32> {
    let parents = process_parents();
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
            "echo 'INFO: 127.0.0.1:1 - \"GET /status HTTP/1.1\" 200 OK'; echo 'INFO: 127.0.0.1:2 - \"GET /periodic-threads/lmcache-mp-worker-reaper HTTP/1.1\" 200 OK'; sleep 30 & echo started; wait",
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
