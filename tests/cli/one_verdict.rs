//! One judgement of a node's sizes: `size`, `launch --dry-run`, `launch`
//! and `housekeep` refuse and warn alike for the same inputs
//! (`docs/sizing.md`, "L1 judged against memory"). Each row of the table
//! is run through every command; the exit statuses, the refusal and the
//! WARN lines are compared. The real launch runs a stand-in `lmcache` that
//! exits at once (exit 5 once planned): its verdicts come before it.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::kit::free_port;

/// What one command said: its exit status, its ERROR lines and its WARN
/// lines, without timestamps and targets.
#[derive(Debug, PartialEq)]
struct Said {
    status: Option<i32>,
    errors: Vec<String>,
    warnings: BTreeSet<String>,
}

/// The message of a log line at `level`, if it is one, with the volume's
/// free space masked.
fn message(line: &str, level: &str) -> Option<String> {
    let (_, rest) = line.split_once(&format!(" {level} "))?;
    Some(mask_free_space(rest.split_once(": ")?.1))
}

/// `text` with each "<figure> GiB free" read as "_ GiB free": other
/// processes' writes (the build beside the tests) move the volume's free
/// space between two commands, and only the verdicts must agree.
fn mask_free_space(text: &str) -> String {
    let mut parts = text.split(" GiB free").peekable();
    let mut out = String::new();
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            out.push_str(part);
            break;
        }
        let figure = part.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
        out.push_str(figure);
        out.push_str("_ GiB free");
    }
    out
}

fn run(home: &std::path::Path, vars: &[(&str, &str)], args: &[&str]) -> Said {
    let out = Command::new(env!("CARGO_BIN_EXE_lmcache-tier"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .env("VIRTUAL_ENV", home.join("venv"))
        .env("EREBINE_AGENT_KV_CACHE_BACKEND", "lmcache")
        .env("HF_HUB_OFFLINE", "1")
        .env("EREBINE_AGENT_LMCACHE_METRICS_PORT", "0")
        .env("EREBINE_AGENT_LMCACHE_MP_PORT", free_port().to_string())
        .env("EREBINE_AGENT_LMCACHE_HTTP_PORT", free_port().to_string())
        .envs(vars.iter().copied())
        .args(args)
        .args(
            ["--ready-timeout", "20"]
                .iter()
                .filter(|_| args == ["launch"]),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    Said {
        status: out.status.code(),
        errors: stderr.lines().filter_map(|l| message(l, "ERROR")).collect(),
        warnings: stderr.lines().filter_map(|l| message(l, "WARN")).collect(),
    }
}

/// A home with the node's cache directory (housekeeping cleans only one
/// that exists), a stand-in stock `lmcache` (it exits 1 at once) and a
/// `python3` beside it.
fn home() -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    fs::create_dir_all(home.path().join(".cache/erebine/lmcache")).unwrap();
    // The weights of the commands' --model (default-model), at one commit
    // in the Hugging Face cache: a launch and housekeeping see them, so
    // the only verdicts are the sizes' (`size` does not read the weights).
    let refs = home
        .path()
        .join(".cache/huggingface/hub/models--default-model/refs");
    fs::create_dir_all(&refs).unwrap();
    fs::write(
        refs.join("main"),
        "0123456789abcdef0123456789abcdef01234567",
    )
    .unwrap();
    let bin = home.path().join("venv/bin");
    fs::create_dir_all(&bin).unwrap();
    for (name, script) in [
        ("lmcache", "#!/bin/sh\nexit 1\n"),
        ("python3", "#!/bin/sh\nexit 0\n"),
    ] {
        fs::write(bin.join(name), script).unwrap();
        fs::set_permissions(bin.join(name), fs::Permissions::from_mode(0o755)).unwrap();
    }
    home
}

#[test]
fn the_free_space_figure_is_masked_and_nothing_else() {
    assert_eq!(
        mask_free_space("(30.96 GiB free / 2 nodes, 1.50 GiB) 0.25 GiB free"),
        "(_ GiB free / 2 nodes, 1.50 GiB) _ GiB free"
    );
    assert_eq!(mask_free_space("no figure"), "no figure");
}

#[test]
fn every_command_gives_the_same_verdicts_for_the_same_inputs() {
    // Rows that hold on any host with more than 1 GiB of memory.
    let rows: [&[(&str, &str)]; 8] = [
        &[("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "4294967295")],
        &[(
            "EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
            "--l1-size-gb 4294967295",
        )],
        &[
            ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1"),
            ("EREBINE_AGENT_HOST_AGENT_COUNT", "100000"),
        ],
        &[("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "0.5")],
        &[
            ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "0"),
            ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "0"),
        ],
        &[
            ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1"),
            ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "2"),
            ("EREBINE_AGENT_HOST_AGENT_COUNT", "100000"),
        ],
        &[("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1")],
        &[
            ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1"),
            ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "0.5"),
        ],
    ];
    for vars in rows {
        let home = home();
        // Besides the free space (masked), a share of it can round
        // differently when other processes write between the commands:
        // three that disagree are run again, up to three times.
        let three = || {
            (
                run(home.path(), vars, &["size"]),
                run(home.path(), vars, &["launch", "--dry-run"]),
                run(home.path(), vars, &["housekeep", "--dry-run"]),
            )
        };
        let mut said = three();
        for _ in 1..3 {
            if said.1 == said.0 && said.2 == said.0 {
                break;
            }
            said = three();
        }
        let (size, dry_run, housekeep) = said;
        assert_eq!(dry_run, size, "{vars:?}: launch --dry-run against size");
        assert_eq!(housekeep, size, "{vars:?}: housekeep against size");
        let launch = run(home.path(), vars, &["launch"]);
        match size.status {
            Some(0) => {
                assert_eq!(launch.status, Some(5), "{vars:?}: {launch:?}");
                assert!(
                    launch.warnings.is_superset(&size.warnings),
                    "{vars:?}: {launch:?}"
                );
            }
            _ => assert_eq!(launch, size, "{vars:?}: launch against size"),
        }
    }
}
