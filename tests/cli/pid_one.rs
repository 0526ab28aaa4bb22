//! `erebine-lmcache` as a container's PID 1 (the image's entrypoint): it
//! reaps the orphans the container's processes leave, as an init must.
//! Run in a PID namespace of its own (`unshare --pid --fork --mount-proc`,
//! util-linux); needs root with CAP_SYS_ADMIN (this test's machine), and
//! elsewhere says why and returns.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

/// The stand-in server leaves three orphans (each a `sleep` whose parent
/// shell exits at once), which the namespace's PID 1 adopts; two seconds
/// later it counts the zombies of the namespace: none stays.
#[test]
fn as_pid_one_it_reaps_the_orphans_the_server_leaves() {
    let namespaces = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !namespaces {
        eprintln!("skipped: no PID namespace here (unshare needs root and CAP_SYS_ADMIN)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("venv/bin");
    fs::create_dir_all(&bin).unwrap();
    let count = dir.path().join("zombies");
    let server = format!(
        "#!/bin/sh\nfor i in 1 2 3; do (sleep 0.2 &); done\nsleep 2\nn=0\nfor s in /proc/[0-9]*/stat; do\n  [ \"$(cut -d' ' -f3 \"$s\" 2>/dev/null)\" = Z ] && n=$((n+1))\ndone\necho $n > {}\n",
        count.display()
    );
    fs::write(bin.join("lmcache"), server).unwrap();
    fs::set_permissions(bin.join("lmcache"), fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_erebine-lmcache"))
        .args(["server", "--l1-size-gb", "1", "--eviction-policy", "LRU"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir.path())
        .env("VIRTUAL_ENV", dir.path().join("venv"))
        .env("EREBINE_AGENT_LMCACHE_METRICS_PORT", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let zombies = fs::read_to_string(&count).expect("the stand-in counted");
    assert_eq!(zombies.trim(), "0", "zombies left under PID 1: {stderr}");
}
