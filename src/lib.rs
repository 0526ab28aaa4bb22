//! Harness of the end-to-end suite in `tests/`: builds the shipped binaries,
//! finds the real LMCache that `scripts/setup-lmcache.sh` installed, picks
//! free loopback ports, and runs processes that cannot outlive a test.
//!
//! Nothing here fakes LMCache: every test drives the real `lmcache server`
//! and the real `lmcache bench` commands.

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// The virtual environment holding `lmcache==0.5.6`:
/// `$EREBINE_TEST_LMCACHE_VENV`, else the default of
/// `scripts/setup-lmcache.sh`. Panics with what to run when it is missing.
pub fn lmcache_venv() -> PathBuf {
    let venv = std::env::var_os("EREBINE_TEST_LMCACHE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            Path::new(&home).join(".cache/erebine/lmcache-0.5.6")
        });
    assert!(
        venv.join("bin/lmcache").is_file(),
        "no lmcache in {}: run scripts/test.sh (it installs lmcache==0.5.6), or set EREBINE_TEST_LMCACHE_VENV",
        venv.display()
    );
    venv
}

/// Path of one of the shipped binaries (`lmcache-tier`, `erebine-lmcache`),
/// built once per test process with the test's own profile.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "lmcache-launcher", "--bins"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building the binaries failed");
        let exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/<test> -> target/<profile>
        exe.parent()
            .and_then(Path::parent)
            .expect("test binary lives in target/<profile>/deps")
            .to_path_buf()
    });
    dir.join(name)
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("an ephemeral port")
}

/// A child process in its own process group, killed with its whole group
/// when dropped, whose output goes to a log file.
pub struct Proc {
    child: Child,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(mut cmd: Command, log: &Path) -> Proc {
        let out = std::fs::File::create(log).expect("log file");
        let err = out.try_clone().expect("log file");
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = cmd.spawn().expect("spawn");
        Proc {
            child,
            log: log.to_path_buf(),
        }
    }

    /// Process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `sig` to the process (not its group).
    pub fn signal(&self, sig: Signal) {
        let _ = nix::sys::signal::kill(Pid::from_raw(self.pid()), sig);
    }

    /// Waits up to `limit` for the process to exit.
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }

    /// Whether it has exited (without reaping a running process).
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Everything it printed so far.
    pub fn output(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.pid()), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// GETs `url` and parses JSON; `None` on any failure or non-200 answer.
pub fn get_json(url: &str) -> Option<serde_json::Value> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .no_proxy()
        .build()
        .ok()?;
    let resp = client.get(url).send().ok()?;
    if resp.status().as_u16() != 200 {
        return None;
    }
    resp.json().ok()
}

/// Polls `url` until it answers 200 with JSON, or panics after `limit` with
/// `proc`'s output (the process is checked for an early exit each round).
pub fn wait_for_status(url: &str, proc: &mut Proc, limit: Duration) -> serde_json::Value {
    let start = Instant::now();
    loop {
        if let Some(body) = get_json(url) {
            return body;
        }
        if let Some(status) = proc.try_status() {
            panic!(
                "process exited ({status}) before {url} answered:\n{}",
                proc.output()
            );
        }
        assert!(
            start.elapsed() < limit,
            "{url} did not answer within {limit:?}:\n{}",
            proc.output()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Pids of live processes whose command line contains `needle` (excluding
/// this test process).
pub fn processes_mentioning(needle: &str) -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push((pid, cmdline));
        }
    }
    found
}
