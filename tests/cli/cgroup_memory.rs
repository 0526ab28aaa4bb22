//! Sizing sees the memory a container sees: `lmcache-tier size` run inside
//! a real cgroup v1 memory cgroup takes the tightest limit on its way to
//! the root, a parent's included, and names the file it came from. Needs
//! root and a v1 memory controller (this test's machine); elsewhere it says
//! why and returns. Other layouts (v2 nested, hybrid, a container's
//! namespace) are unit-tested on recorded bodies (`sizing/src/cgroup.rs`).

use std::process::Command;

use lmcache_tier_e2e::MemoryCgroup;

const GIB: u64 = 1 << 30;

/// `lmcache-tier size --json` run inside `cgroup`: the memory it sized
/// from, in bytes, and why.
fn memory_decision(cgroup: &MemoryCgroup, home: &std::path::Path) -> (u64, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lmcache-tier"));
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .args(["size", "--json"]);
    cgroup.enter(&mut cmd);
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        report["memory_bytes"].as_u64().unwrap(),
        report["memory_reason"].as_str().unwrap().to_string(),
    )
}

#[test]
fn a_limit_on_the_cgroup_or_a_parent_binds_the_plan() {
    let parent = match MemoryCgroup::make("sizing-test") {
        Ok(cgroup) => cgroup,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let home = tempfile::tempdir().unwrap();
    parent
        .write("memory.limit_in_bytes", &(8 * GIB).to_string())
        .unwrap();
    let node = parent.child("node").unwrap();
    for (cgroup, file) in [
        (&parent, parent.path("memory.limit_in_bytes")),
        (&node, parent.path("memory.limit_in_bytes")),
    ] {
        let (bytes, reason) = memory_decision(cgroup, home.path());
        assert_eq!(bytes, 8 * GIB, "{reason}");
        assert!(reason.contains(&file.display().to_string()), "{reason}");
    }
    // The child's own, tighter limit wins.
    node.write("memory.limit_in_bytes", &(6 * GIB).to_string())
        .unwrap();
    let (bytes, reason) = memory_decision(&node, home.path());
    assert_eq!(bytes, 6 * GIB, "{reason}");
    assert!(
        reason.contains(&node.path("memory.limit_in_bytes").display().to_string()),
        "{reason}"
    );
    drop(node);
}
