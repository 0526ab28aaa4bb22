//! Every command that writes to stdout ends quietly when its reader has gone
//! away (`lmcache-tier size --json | head -c 0`), as Unix tools do: the exit
//! status is the one it has with a reader, and stderr carries no panic and no
//! "Broken pipe".

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

const LMCACHE_TIER: &str = env!("CARGO_BIN_EXE_lmcache-tier");
const EREBINE_LMCACHE: &str = env!("CARGO_BIN_EXE_erebine-lmcache");

/// `bin args` for a node whose cache directory is `dir`, with no server.
fn command(bin: &str, dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .env("EREBINE_AGENT_KV_CACHE_BACKEND", "lmcache")
        .env("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1")
        .env("EREBINE_AGENT_LMCACHE_DISK_PATH", dir.join("cache"))
        .env("EREBINE_AGENT_LMCACHE_HTTP_PORT", "1")
        .env("EREBINE_AGENT_LMCACHE_METRICS_PORT", "0")
        .args(args)
        .stdin(Stdio::null());
    cmd
}

/// Exit status and stderr with stdout going nowhere (`/dev/null`).
fn with_reader(bin: &str, dir: &Path, args: &[&str]) -> Option<i32> {
    let out = command(bin, dir, args)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    out.status.code()
}

/// Exit status and stderr with stdout a pipe whose reader closed before
/// the command started.
fn without_reader(bin: &str, dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let (reader, writer) = nix::unistd::pipe().unwrap();
    drop(reader);
    let mut child = command(bin, dir, args)
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (child.wait().unwrap().code(), stderr)
}

#[test]
fn every_command_ends_quietly_when_its_reader_has_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let path = dir.join("cache");
    std::fs::create_dir_all(&path).unwrap();
    let path = path.display().to_string();
    let housekeep = [
        "housekeep",
        "--path",
        &path,
        "--model",
        "m",
        "--chunk-size",
        "256",
        "--dry-run",
    ];
    let mut housekeep_json = housekeep.to_vec();
    housekeep_json.push("--json");
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (LMCACHE_TIER, vec!["--help"]),
        (LMCACHE_TIER, vec!["--version"]),
        (LMCACHE_TIER, vec!["help", "inspect"]),
        (LMCACHE_TIER, vec!["help", "--help"]),
        (LMCACHE_TIER, vec!["completions", "bash"]),
        (LMCACHE_TIER, vec!["completions", "zsh"]),
        (LMCACHE_TIER, vec!["launch", "--help"]),
        (LMCACHE_TIER, vec!["size", "--help"]),
        (LMCACHE_TIER, vec!["housekeep", "--help"]),
        (LMCACHE_TIER, vec!["inspect", "--help"]),
        (LMCACHE_TIER, vec!["size"]),
        (LMCACHE_TIER, vec!["size", "--json"]),
        (LMCACHE_TIER, vec!["launch", "--model", "m", "--dry-run"]),
        (
            LMCACHE_TIER,
            vec!["launch", "--model", "m", "--dry-run", "--json"],
        ),
        (LMCACHE_TIER, housekeep.to_vec()),
        (LMCACHE_TIER, housekeep_json),
        (LMCACHE_TIER, vec!["inspect"]),
        (LMCACHE_TIER, vec!["inspect", "--json"]),
        (EREBINE_LMCACHE, vec!["--help"]),
    ];
    for (bin, args) in cases {
        let expected = with_reader(bin, dir, &args);
        let (code, stderr) = without_reader(bin, dir, &args);
        let name = Path::new(bin).file_name().unwrap().to_string_lossy();
        assert_eq!(code, expected, "{name} {args:?}: {stderr}");
        assert!(
            !stderr.contains("panicked") && !stderr.to_lowercase().contains("broken pipe"),
            "{name} {args:?}: {stderr}"
        );
    }
}
