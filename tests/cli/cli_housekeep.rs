//! `lmcache-tier housekeep` knows the node as `launch` does: with no flags
//! it cleans the tier a launch on the same variables and engine flags
//! would, under the same launch identity and capacity.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// `lmcache-tier <args> --dry-run --json` for a node with home `home`, the
/// `lmcache` backend, and `vars`; its JSON.
fn dry_run(home: &Path, vars: &[(&str, &str)], args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_lmcache-tier"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .env("EREBINE_AGENT_KV_CACHE_BACKEND", "lmcache")
        .env("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1")
        .envs(vars.iter().copied())
        .args(args)
        .args(["--dry-run", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?} {vars:?}: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {stderr}"))
}

/// Variables of a case.
type Vars<'a> = &'a [(&'a str, &'a str)];

#[test]
fn housekeep_cleans_the_tier_launch_plans_under_the_same_identity() {
    let home = tempfile::tempdir().unwrap();
    for dir in [".cache/erebine/lmcache", "other"] {
        std::fs::create_dir_all(home.path().join(dir)).unwrap();
    }
    let engine = [
        "--model",
        "org/Model-7B",
        "--tensor-parallel-size",
        "2",
        "--kv-cache-dtype",
        "fp8",
        "--block-size",
        "32",
        "--max-num-batched-tokens",
        "4096",
    ];
    let hybrid = [
        "--hybrid-attention",
        "--block-size",
        "48",
        "--max-num-batched-tokens",
        "1000",
    ];
    let cases: [(Vars, &[&str]); 7] = [
        (&[], &[]),
        (&[("EREBINE_AGENT_LMCACHE_CHUNK_SIZE", "768")], &[]),
        (
            &[("EREBINE_AGENT_LMCACHE_EXTRA_ARGS", "--chunk-size 384")],
            &[],
        ),
        (&[], &engine),
        (&[], &hybrid),
        (&[("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "1.5")], &[]),
        (&[("EREBINE_AGENT_LMCACHE_DISK_PATH", "~/other")], &[]),
    ];
    for (vars, flags) in cases {
        // A derived capacity follows the volume's free space, which other
        // processes' writes move between the two runs: the two must agree
        // within 1% (a different rule is off by far more), and a pair that
        // does not is taken again, up to three times, before it fails.
        let (mut launch, mut housekeep) = (Value::Null, Value::Null);
        for _ in 0..3 {
            launch = dry_run(home.path(), vars, &[&["launch"][..], flags].concat());
            housekeep = dry_run(home.path(), vars, &[&["housekeep"][..], flags].concat());
            if within_one_percent(&housekeep["report"], &launch["housekeeping"]) {
                break;
            }
        }
        let planned = &launch["housekeeping"];
        assert!(planned.is_object(), "{vars:?} {flags:?}: {launch:#}");
        assert_eq!(
            housekeep["identity"], planned["identity"],
            "{vars:?} {flags:?}"
        );
        assert_eq!(
            housekeep["report"]["path"], planned["path"],
            "{vars:?} {flags:?}"
        );
        assert!(
            within_one_percent(&housekeep["report"], planned),
            "{vars:?} {flags:?}: housekeep {}, launch {}",
            housekeep["report"]["capacity_bytes"],
            planned["capacity_bytes"]
        );
    }
    // A node whose plan has no built-in disk tier has nothing a launch
    // would clean; an object of another model stays.
    let cache = home.path().join(".cache/erebine/lmcache");
    let object = cache.join(format!("other-model@0x01000100@0@{:064x}.data", 1));
    std::fs::write(&object, b"kv").unwrap();
    for vars in [
        [("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "0")],
        [("EREBINE_AGENT_LMCACHE_L2_ADAPTER", "[]")],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_lmcache-tier"))
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", home.path())
            .env("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1")
            .envs(vars)
            .args(["housekeep", "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{vars:?}");
        let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(said["nothing_to_clean"].is_string(), "{said:#}");
        assert!(object.exists(), "{vars:?}");
    }

    // Flags override the node: the path, the chunk size, the capacity.
    let other = home.path().join("other");
    let flags = [
        "housekeep",
        "--path",
        other.to_str().unwrap(),
        "--chunk-size",
        "128",
        "--capacity-gb",
        "0.5",
    ];
    let housekeep = dry_run(home.path(), &[], &flags);
    assert_eq!(housekeep["identity"]["chunk_size"], 128);
    assert_eq!(housekeep["report"]["path"], other.to_str().unwrap());
    assert_eq!(housekeep["report"]["capacity_bytes"], 1u64 << 29);
}

/// The command line wins over every other source of a value, and each
/// source is said; what housekeeping never uses is never refused over: a
/// port clash, a missing server executable.
#[test]
fn housekeep_flags_win_and_unused_settings_are_not_judged() {
    let home = tempfile::tempdir().unwrap();
    let cache = home.path().join(".cache/erebine/lmcache");
    std::fs::create_dir_all(&cache).unwrap();
    let extra = [("EREBINE_AGENT_LMCACHE_EXTRA_ARGS", "--chunk-size 256")];
    let noise = [
        ("EREBINE_AGENT_LMCACHE_MP_PORT", "7000"),
        ("EREBINE_AGENT_LMCACHE_HTTP_PORT", "7000"),
        ("EREBINE_AGENT_LMCACHE_PATH", "/nonexistent/erebine-lmcache"),
    ];
    let both: Vec<(&str, &str)> = extra.iter().chain(&noise).copied().collect();
    for vars in [&extra[..], &both[..]] {
        let flag = dry_run(home.path(), vars, &["housekeep", "--chunk-size", "512"]);
        assert_eq!(flag["identity"]["chunk_size"], 512, "{vars:?}");
        assert_eq!(flag["sources"]["chunk_size"], "--chunk-size");
        let node = dry_run(home.path(), vars, &["housekeep"]);
        assert_eq!(node["identity"]["chunk_size"], 256, "{vars:?}");
        let source = node["sources"]["chunk_size"].as_str().unwrap();
        assert!(
            source.contains("EREBINE_AGENT_LMCACHE_EXTRA_ARGS"),
            "{source}"
        );
        assert_eq!(node["sources"]["path"], "EREBINE_AGENT_LMCACHE_DISK_PATH");
        assert!(node["sources"]["capacity"].is_string(), "{node:#}");
    }
}

/// A dry run reads a directory it cannot write (a read-only volume) and
/// plans; only the real run is refused there. Needs root for the mount.
#[test]
fn housekeep_dry_run_plans_a_read_only_tier() {
    let home = tempfile::tempdir().unwrap();
    let volume = lmcache_tier_e2e::Tmpfs::mount(&home.path().join("ro"), 4096);
    let tier = volume.path().join("tier");
    std::fs::create_dir(&tier).unwrap();
    let object = tier.join(format!("m@0x01000100@0@{:064x}.data", 1));
    std::fs::write(&object, b"kv").unwrap();
    let remount = Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(volume.path())
        .status()
        .unwrap();
    assert!(remount.success());
    let tier_flag = [
        "housekeep",
        "--model",
        "other",
        "--path",
        tier.to_str().unwrap(),
    ];
    let planned = dry_run(home.path(), &[], &tier_flag);
    assert_eq!(
        planned["report"]["deleted_total"]["count"], 1,
        "{planned:#}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_lmcache-tier"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home.path())
        .args(tier_flag)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not writable"));
    assert!(object.exists());
}

/// A purge of several causes counts each apart, in the WARN line and in
/// the JSON: objects of another model are not blamed for the ones that
/// go because the tier has no identity manifest.
#[test]
fn housekeep_counts_each_cause_of_a_purge_apart() {
    let home = tempfile::tempdir().unwrap();
    let tier = home.path().join("tier");
    std::fs::create_dir_all(&tier).unwrap();
    for (model, n) in [("test-model", 3), ("other-model", 4)] {
        for i in 0..n {
            let name = format!("{model}@0x01000100@0@{:064x}.data", i + 1);
            std::fs::write(tier.join(name), b"kv").unwrap();
        }
    }
    let args = ["housekeep", "--model", "test-model", "--path"];
    let out = Command::new(env!("CARGO_BIN_EXE_lmcache-tier"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home.path())
        .env("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1")
        .args(args)
        .arg(&tier)
        .args(["--dry-run", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let causes = &json["report"]["identity_purge"]["causes"];
    let counts: Vec<(&str, u64)> = causes
        .as_array()
        .unwrap_or_else(|| panic!("{json:#}"))
        .iter()
        .map(|c| (c["reason"].as_str().unwrap(), c["count"].as_u64().unwrap()))
        .collect();
    assert_eq!(counts, [("other_model", 4), ("no_manifest", 3)], "{json:#}");
    assert_eq!(json["report"]["identity_purge"]["purged"]["count"], 7);
    let warning = stderr
        .lines()
        .find(|l| l.contains("a launch would purge"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        warning.contains(
            r#"4 objects (0.0 MiB) of another model (model "other-model" -> "test-model")"#
        ) && warning.contains("3 objects (0.0 MiB) with no usable identity manifest"),
        "{warning}"
    );
}

/// Whether two reports' `capacity_bytes` agree within 1%.
fn within_one_percent(ours: &Value, theirs: &Value) -> bool {
    match (
        ours["capacity_bytes"].as_f64(),
        theirs["capacity_bytes"].as_f64(),
    ) {
        (Some(ours), Some(theirs)) => (ours - theirs).abs() <= theirs / 100.0,
        _ => false,
    }
}
