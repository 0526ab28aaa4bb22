//! The command line teaches once: the top-level help lists every exit
//! status, each subcommand's help only those it can end with, `help` has a
//! help of its own, `erebine-lmcache --help` needs no LMCache, and shell
//! completions and man pages cover every subcommand.

use std::process::{Command, Output};

const SUBCOMMANDS: [&str; 7] = [
    "launch",
    "size",
    "housekeep",
    "inspect",
    "help",
    "completions",
    "man",
];

fn lmcache_tier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lmcache-tier"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(args)
        .output()
        .unwrap()
}

fn stdout_of(args: &[&str]) -> String {
    let out = lmcache_tier(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The exit statuses a help text lists (`  <n>  ` at a line's start).
fn statuses(help: &str) -> Vec<u32> {
    help.split_once("Exit status:")
        .map(|(_, table)| table)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("  ")?.split("  ").next()?.parse().ok())
        .collect()
}

#[test]
fn exit_statuses_are_listed_once_at_the_top_and_per_subcommand_what_it_returns() {
    let top = stdout_of(&["--help"]);
    assert_eq!(statuses(&top), (0..=9).collect::<Vec<_>>(), "{top}");
    assert!(top.lines().all(|l| l.chars().count() <= 100), "{top}");
    for (sub, expected) in [
        ("launch", vec![0, 1, 2, 3, 4, 5, 6, 7]),
        ("size", vec![0, 1, 2]),
        ("housekeep", vec![0, 1, 2, 6, 7]),
        ("inspect", vec![0, 1, 2, 8, 9]),
    ] {
        let help = stdout_of(&[sub, "--help"]);
        assert_eq!(statuses(&help), expected, "{sub}: {help}");
        assert_eq!(help.matches("Exit status:").count(), 1, "{sub}: {help}");
    }
}

#[test]
fn help_has_a_help_and_names_a_subcommand_it_does_not_know() {
    let own = stdout_of(&["help", "--help"]);
    assert!(own.contains("Usage: lmcache-tier help"), "{own}");
    let inspect = stdout_of(&["help", "inspect"]);
    assert!(inspect.contains("Usage: lmcache-tier inspect"), "{inspect}");
    assert_eq!(inspect, stdout_of(&["inspect", "--help"]));
    let unknown = lmcache_tier(&["help", "no-such"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("\"no-such\" is not a subcommand"));
}

#[test]
fn erebine_lmcache_help_stands_without_lmcache() {
    let out = Command::new(env!("CARGO_BIN_EXE_erebine-lmcache"))
        .env_clear()
        .env("PATH", "/nonexistent")
        .arg("--help")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("--l2-adapter"));
    assert!(stderr.contains("own help cannot follow"), "{stderr}");
}

#[test]
fn completions_and_man_pages_cover_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout_of(&["completions", shell]);
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell}: no {sub}");
        }
        assert!(script.contains("--max-num-batched-tokens"), "{shell}");
    }
    // Bash completes the options of a subcommand.
    let script = stdout_of(&["completions", "bash"]);
    let completed = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{script}\nCOMP_WORDS=(lmcache-tier housekeep --dr); COMP_CWORD=2; \
             _lmcache__tier lmcache-tier --dr housekeep; echo \"${{COMPREPLY[@]}}\""
        ))
        .output()
        .unwrap();
    let words = String::from_utf8_lossy(&completed.stdout);
    assert_eq!(words.trim(), "--dry-run", "{words}");
    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man1");
    stdout_of(&["man", "--dir", pages.to_str().unwrap()]);
    for page in std::iter::once("lmcache-tier".to_string())
        .chain(SUBCOMMANDS.iter().map(|s| format!("lmcache-tier-{s}")))
    {
        let text = std::fs::read_to_string(pages.join(format!("{page}.1")))
            .unwrap_or_else(|e| panic!("{page}.1: {e}"));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page}");
        assert!(text.contains(&page), "{page}");
    }
    let refused = lmcache_tier(&["man", "--dir", "/proc/no-such/man1"]);
    assert_eq!(refused.status.code(), Some(2));
}

/// Pages go to temp files renamed into place: a symlink (or a hard link)
/// already at a page's name is replaced, never written through.
#[test]
fn man_pages_never_write_through_a_link_at_their_name() {
    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man1");
    std::fs::create_dir(&pages).unwrap();
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, b"keep").unwrap();
    std::os::unix::fs::symlink(&victim, pages.join("lmcache-tier-size.1")).unwrap();
    std::fs::hard_link(&victim, pages.join("lmcache-tier-inspect.1")).unwrap();
    stdout_of(&["man", "--dir", pages.to_str().unwrap()]);
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    let page = std::fs::symlink_metadata(pages.join("lmcache-tier-size.1")).unwrap();
    assert!(page.file_type().is_file());
    let blocked = dir.path().join("blocked");
    std::fs::create_dir_all(blocked.join("lmcache-tier-launch.1")).unwrap();
    let out = lmcache_tier(&["man", "--dir", blocked.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lmcache-tier-launch.1"), "{stderr}");
    assert!(
        !blocked.join(".lmcache-tier-launch.1.tmp").exists(),
        "a page that could not be put in place left its temp file"
    );
}

/// A volume too full for a page: refused naming the page, and no temp
/// file left behind. Needs root for the mount.
#[test]
fn man_pages_on_a_full_volume_leave_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let volume = lmcache_tier_e2e::Tmpfs::mount(&dir.path().join("full"), 64);
    volume.fill_at_once(&volume.path().join("filler"));
    let out = lmcache_tier(&["man", "--dir", volume.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("No space left"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(volume.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temp files left: {left:?}");
}

/// Completions offer directories, not files, for the flags that take one.
#[test]
fn directory_flags_complete_directories() {
    let zsh = stdout_of(&["completions", "zsh"]);
    for flag in ["--dir", "--path"] {
        let lines: Vec<&str> = zsh
            .lines()
            .filter(|l| l.contains(&format!("'{flag}=")))
            .collect();
        assert!(!lines.is_empty(), "{flag} not in the zsh script");
        for line in lines {
            assert!(line.contains("_files -/"), "{flag}: {line}");
        }
    }
}
