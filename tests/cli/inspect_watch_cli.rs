//! `lmcache-tier inspect --watch` refuses what it cannot do before it polls
//! anything: a stdout that is not a terminal (exit 2 at once, nothing
//! drawn), `--json` beside it, and intervals that are not positive seconds
//! (clap's exit 2, naming the flag). The view itself is tested under tmux
//! in `tests/e2e/inspect_watch.rs`.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `lmcache-tier inspect <args>` for a node with no server, stdout and
/// stderr captured (pipes), killed if it runs past 60 s.
fn inspect(args: &[&str]) -> Output {
    let home = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lmcache-tier"))
        .env_clear()
        .env("HOME", home.path())
        .env("EREBINE_AGENT_LMCACHE_HTTP_PORT", "1")
        .env("EREBINE_AGENT_LMCACHE_METRICS_PORT", "0")
        .arg("inspect")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "inspect {args:?} still ran after 60 s; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn watch_with_stdout_not_a_terminal_exits_2_at_once_and_draws_nothing() {
    for args in [&["--watch"][..], &["--watch", "0.5"]] {
        let out = inspect(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("--watch") && stderr.contains("stdout is not a terminal"),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: {:?}", out.stdout);
    }
}

#[test]
fn watch_with_json_is_refused_with_exit_2() {
    let out = inspect(&["--watch", "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("'--watch [<SECONDS>]' cannot be used with '--json'"),
        "{stderr}"
    );
    let document: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(document["error"]["exit_status"], 2, "{document:#}");
}

#[test]
fn watch_intervals_that_are_not_positive_seconds_are_refused_with_exit_2() {
    for value in ["0", "-1", "NaN", "0.01", "soon"] {
        let out = inspect(&["--watch", value]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{value}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "invalid value '{value}' for '--watch [<SECONDS>]'"
            )) && stderr.contains("is not a refresh interval"),
            "{value}: {stderr}"
        );
    }
}
