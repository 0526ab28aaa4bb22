//! The command-line suite's kit: one case runner ([`Case`]: a node's whole
//! environment in a temporary home, with a stand-in `lmcache` that marks
//! it if it ever runs), one port helper ([`free_port`], the end-to-end
//! kit's: ports below the ephemeral range, and the slice
//! `scripts/test.sh` gives each job), and the checks of a failed command.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

pub(crate) use lmcache_tier_e2e::free_port;

/// A node environment in a temp dir with a stand-in stock `lmcache` (and a
/// `python3` that imports anything), for commands that must fail or plan
/// before any server would run.
pub(crate) struct Case {
    /// Its home, where the stand-in environment and the cache directory are.
    pub(crate) dir: tempfile::TempDir,
    /// Its whole environment: nothing else is inherited.
    pub(crate) vars: BTreeMap<OsString, OsString>,
}

impl Case {
    /// A node environment in a temp dir with a stand-in stock lmcache.
    pub(crate) fn new() -> Case {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("venv/bin");
        fs::create_dir_all(&bin).unwrap();
        let marker = dir.path().join("stand-in-ran");
        fs::write(
            bin.join("lmcache"),
            format!("#!/bin/sh\ntouch {}\nexit 99\n", marker.display()),
        )
        .unwrap();
        fs::set_permissions(bin.join("lmcache"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(bin.join("python3"), "#!/bin/sh\nexit 0\n").unwrap();
        fs::set_permissions(bin.join("python3"), fs::Permissions::from_mode(0o755)).unwrap();
        let mut vars: BTreeMap<OsString, OsString> = BTreeMap::new();
        vars.insert("PATH".into(), "/usr/bin:/bin".into());
        vars.insert("HOME".into(), dir.path().as_os_str().to_owned());
        vars.insert(
            "VIRTUAL_ENV".into(),
            dir.path().join("venv").into_os_string(),
        );
        vars.insert(
            "EREBINE_AGENT_LMCACHE_DISK_PATH".into(),
            dir.path().join("cache").into_os_string(),
        );
        vars.insert("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB".into(), "1".into());
        vars.insert("EREBINE_AGENT_KV_CACHE_BACKEND".into(), "lmcache".into());
        // Cases run side by side: none may take the default metrics port.
        vars.insert("EREBINE_AGENT_LMCACHE_METRICS_PORT".into(), "0".into());
        Case { dir, vars }
    }

    /// Free ports of its own for the server's ZMQ and HTTP listeners: a
    /// launch checks the default ones first, and cases run side by side.
    pub(crate) fn own_ports(&mut self) -> &mut Self {
        self.set("EREBINE_AGENT_LMCACHE_MP_PORT", free_port().to_string())
            .set("EREBINE_AGENT_LMCACHE_HTTP_PORT", free_port().to_string())
    }

    /// Sets the variable `k` to `v`.
    pub(crate) fn set(&mut self, k: &str, v: impl Into<OsString>) -> &mut Self {
        self.vars.insert(k.into(), v.into());
        self
    }

    /// `lmcache-tier args` in this environment, from its home; asserts
    /// that the stand-in server never ran.
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        let out = Command::new(env!("CARGO_BIN_EXE_lmcache-tier"))
            .env_clear()
            .envs(&self.vars)
            .current_dir(self.path())
            .args(args)
            .output()
            .unwrap();
        assert!(
            !self.dir.path().join("stand-in-ran").exists(),
            "the server was started"
        );
        out
    }

    /// Its home.
    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// What a command printed on stderr.
pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `out` failed with `code`, its stderr holds each of `needles`, and no
/// panic.
#[track_caller]
pub(crate) fn assert_fails(out: &Output, code: i32, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{err}");
    for n in needles {
        assert!(err.contains(n), "expected {n:?} in:\n{err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}
