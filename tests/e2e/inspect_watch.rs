//! End to end under tmux: `lmcache-tier inspect --watch` runs in a detached
//! tmux session (a real terminal, 160 x 50) and the tests read its screen
//! with `tmux capture-pane`: against the real server while the CPU bench
//! worker stores into it (the bars, and a change mark with the usage's
//! delta), and against a port where nothing answers (the view says so and
//! keeps refreshing). Ctrl-C and SIGTERM end it with exit status 0 and the
//! terminal given back (normal screen, cursor shown).
//!
//! Each session has a tmux server of its own (`tmux -S`, its socket in the
//! test's directory), killed when the test ends, whatever happens. The command runs under `sh`, which prints
//! its exit status (`exit=N`) and then sleeps, so that the pane stays
//! alive and tmux still tells the terminal's state after the command ended;
//! the shell traps SIGINT, so Ctrl-C in the pane reaches the command's
//! process group and ends only the command.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::thread;
use std::time::{Duration, Instant};

use lmcache_tier_e2e::{
    bench_command, binaries, children_of, free_port, stop_launch, wait_for_status, Binaries, Proc,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const BINS: Binaries = binaries!();

/// tmux from `PATH`, which these tests need (`scripts/setup-tmux.sh`
/// installs it).
fn tmux_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join("tmux"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("tmux is not installed: run scripts/setup-tmux.sh (or apt-get install tmux)")
        })
}

/// A detached tmux session running one command, on a tmux server of its
/// own; the server is killed on drop.
struct Tmux {
    socket: PathBuf,
    session: String,
}

impl Tmux {
    /// Starts `command` in a 160 x 50 session named after `name`.
    fn start(dir: &Path, name: &str, command: &[String]) -> Tmux {
        let config = dir.join(format!("{name}.tmux.conf"));
        std::fs::write(&config, "set -g default-shell /bin/sh\n").unwrap();
        let tmux = Tmux {
            socket: dir.join(format!("{name}.tmux")),
            session: name.to_string(),
        };
        let line = shlex::try_join(command.iter().map(String::as_str)).unwrap();
        let out = Command::new(tmux_binary())
            .arg("-S")
            .arg(&tmux.socket)
            .arg("-f")
            .arg(&config)
            .args(["new-session", "-d", "-s", name, "-x", "160", "-y", "50"])
            .arg(format!(
                "trap : INT; {line}; echo \"exit=$?\"; exec sleep 3600"
            ))
            .output()
            .unwrap();
        assert!(out.status.success(), "tmux: {}", text(&out.stderr));
        tmux
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(tmux_binary())
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    /// The pane as it shows now.
    fn screen(&self) -> String {
        text(
            &self
                .run(&["capture-pane", "-p", "-t", &self.session])
                .stdout,
        )
    }

    /// A tmux format of the pane (`#{pane_dead}`, ...).
    fn format(&self, format: &str) -> String {
        let out = self.run(&["list-panes", "-t", &self.session, "-F", format]);
        text(&out.stdout).trim().to_string()
    }

    /// Polls the screen every 100 ms until `seen` holds for it; panics
    /// after `limit` with the last screen and `what`.
    fn wait_for(&self, what: &str, limit: Duration, seen: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        loop {
            let screen = self.screen();
            if seen(&screen) {
                return screen;
            }
            assert!(
                started.elapsed() < limit,
                "no {what} within {limit:?}; the screen:\n{screen}"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// The pid of the command the pane's shell runs.
    fn command_pid(&self) -> i32 {
        let shell: i32 = self.format("#{pane_pid}").parse().unwrap();
        let children = children_of(shell);
        assert_eq!(children.len(), 1, "the shell's children: {children:?}");
        children[0]
    }

    /// Waits until the command has exited; its exit status, and the
    /// terminal's state: `0 1` when it is back on its normal screen
    /// (alternate screen off) with the cursor shown.
    fn wait_for_exit(&self, limit: Duration) -> (String, String) {
        let screen = self.wait_for("exit status", limit, |s| s.contains("exit="));
        let status = screen.split("exit=").nth(1).unwrap_or_default();
        let status = status.lines().next().unwrap_or_default().to_string();
        (status, self.format("#{alternate_on} #{cursor_flag}"))
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The `EREBINE_AGENT_*` variables and `HOME` that `launch` is given.
fn node_vars(launch: &Command) -> Vec<(String, String)> {
    launch
        .get_envs()
        .filter_map(|(key, value)| {
            let key = key.to_string_lossy().into_owned();
            let value = value?.to_string_lossy().into_owned();
            (key.starts_with("EREBINE_AGENT_") || key == "HOME").then_some((key, value))
        })
        .collect()
}

/// `lmcache-tier inspect --watch <seconds>` with exactly the variables
/// `vars` (and a `PATH`).
fn watch_command(vars: &[(String, String)], seconds: &str) -> Vec<String> {
    let mut line = vec!["env".to_string(), "-i".into(), "PATH=/usr/bin:/bin".into()];
    line.extend(vars.iter().map(|(key, value)| format!("{key}={value}")));
    line.push(BINS.lmcache_tier().display().to_string());
    line.extend(["inspect".into(), "--watch".into(), seconds.into()]);
    line
}

/// A usage bar whose usage grew since the previous refresh: marked, with
/// its positive delta.
fn grown_bar(line: &str) -> bool {
    line.starts_with("* ") && line.contains("] ") && line.contains(" GiB  +")
}

#[test]
fn watch_shows_the_bars_marks_what_the_bench_stores_and_stops_on_ctrl_c() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (mp_port, http_port) = (free_port(), free_port());
    let mut node = BINS.launch_command(dir, mp_port, http_port, &[]);
    node.env("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "1");
    let watch = watch_command(&node_vars(&node), "0.5");
    let mut launch = Proc::spawn(node, &dir.join("launch.log"));
    let url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_status(&url, &mut launch, Duration::from_secs(180));

    let tmux = Tmux::start(dir, "up", &watch);
    let minute = Duration::from_secs(60);
    let screen = tmux.wait_for("header and bars", minute, |s| {
        s.contains("every 0.5 s; server up; Ctrl-C to stop")
            && s.lines()
                .any(|l| l.contains("L2 tier 0 FSNativeL2Adapter ") && l.contains("] "))
            && s.lines()
                .any(|l| l.contains(" guard ") && l.contains(" of 1.00 GiB"))
    });
    assert!(
        screen.starts_with("lmcache-tier inspect --watch: read "),
        "{screen}"
    );
    tmux.wait_for("a frame without changes (idle server)", minute, |s| {
        s.contains("server up") && !s.lines().any(|l| l.starts_with("* "))
    });

    let mut bench = Proc::spawn(
        bench_command(mp_port, http_port, 0, 12, "0.1"),
        &dir.join("bench.log"),
    );
    // Until 30 s after the bench ended: LMCache writes to L2 behind it.
    let (started, mut bench_ended) = (Instant::now(), None::<Instant>);
    let marked = loop {
        let screen = tmux.screen();
        if screen.lines().any(grown_bar) {
            break screen;
        }
        if bench_ended.is_none() && bench.try_status().is_some() {
            bench_ended = Some(Instant::now());
        }
        let waited = bench_ended.is_some_and(|t| t.elapsed() > Duration::from_secs(30));
        assert!(
            started.elapsed() < Duration::from_secs(600) && !waited,
            "no bar marked as grown while the bench stored; the screen:\n{screen}\nbench:\n{}",
            bench.output()
        );
        thread::sleep(Duration::from_millis(100));
    };
    assert!(
        marked
            .lines()
            .any(|l| l.starts_with("* ") && !l.contains("] ")),
        "the view's rows that changed are marked too:\n{marked}"
    );
    let done = bench.wait_timeout(Duration::from_secs(600));
    assert!(done.is_some_and(|s| s.success()), "{}", bench.output());

    tmux.run(&["send-keys", "-t", "up", "C-c"]);
    let (status, terminal) = tmux.wait_for_exit(minute);
    assert_eq!(status, "0", "the screen:\n{}", tmux.screen());
    assert_eq!(
        terminal,
        "0 1",
        "terminal not given back:\n{}",
        tmux.screen()
    );
    stop_launch(&mut launch);
}

#[test]
fn watch_keeps_refreshing_while_the_server_is_down_and_stops_on_sigterm() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let vars = [
        ("HOME", dir.display().to_string()),
        ("EREBINE_AGENT_LMCACHE_HTTP_PORT", free_port().to_string()),
        (
            "EREBINE_AGENT_LMCACHE_DISK_PATH",
            dir.join("cache").display().to_string(),
        ),
        ("EREBINE_AGENT_LMCACHE_METRICS_PORT", "0".to_string()),
    ]
    .map(|(key, value)| (key.to_string(), value));
    let tmux = Tmux::start(dir, "down", &watch_command(&vars, "0.2"));
    let minute = Duration::from_secs(60);
    let first = tmux.wait_for("the server shown down", minute, |s| {
        s.contains("every 0.2 s; server DOWN (no answer), still refreshing; Ctrl-C to stop")
            && s.lines()
                .any(|l| l.starts_with("  server ") && l.contains("no answer ("))
            && s.contains("  disk tier ")
    });
    let read_at = |screen: &str| {
        screen
            .lines()
            .next()
            .and_then(|l| l.split(", every").next())
            .unwrap_or_default()
            .to_string()
    };
    let before = read_at(&first);
    tmux.wait_for("a later refresh", minute, |s| {
        s.contains("server DOWN") && read_at(s) != before
    });

    // Ctrl-Z (SIGTSTP, sent to the watch alone: the pane's shell has no job
    // control) gives the terminal back while stopped; `fg` (SIGCONT) takes
    // it again and redraws.
    let watch = Pid::from_raw(tmux.command_pid());
    kill(watch, Signal::SIGTSTP).unwrap();
    let terminal_becomes = |wanted: &str, what: &str| {
        let started = Instant::now();
        while tmux.format("#{alternate_on} #{cursor_flag}") != wanted {
            assert!(started.elapsed() < minute, "{what}:\n{}", tmux.screen());
            thread::sleep(Duration::from_millis(50));
        }
    };
    terminal_becomes("0 1", "Ctrl-Z did not give the terminal back");
    let stat = std::fs::read_to_string(format!("/proc/{watch}/stat")).unwrap();
    assert!(stat.contains(") T "), "not stopped: {stat}");
    kill(watch, Signal::SIGCONT).unwrap();
    terminal_becomes("1 0", "the alternate screen was not taken again on fg");
    let stopped_at = read_at(&tmux.screen());
    tmux.wait_for("a refresh after fg", minute, |s| {
        s.contains("server DOWN") && read_at(s) != stopped_at
    });

    kill(watch, Signal::SIGTERM).unwrap();
    let (status, terminal) = tmux.wait_for_exit(minute);
    assert_eq!(status, "0", "the screen:\n{}", tmux.screen());
    assert_eq!(
        terminal,
        "0 1",
        "terminal not given back:\n{}",
        tmux.screen()
    );
    assert!(
        !tmux.screen().contains("inspect --watch: read"),
        "the view stays on the alternate screen, not on the operator's:\n{}",
        tmux.screen()
    );
}
