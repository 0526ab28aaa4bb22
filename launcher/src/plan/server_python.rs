//! The Python the LMCache server runs on, asked before anything starts:
//! whether it can import the modules the cascade's tier kinds need (here),
//! and on a GPU node whether LMCache's compiled extensions load
//! ([`crate::plan::gpu`]), each run bounded in time ([`run_bounded`]).
//!
//! The modules ([`needed_module`]):
//! - boto3, for a tier behind an S3 gateway: it reaches LMCache with no key
//!   in its spec, and LMCache 0.5.6's S3 adapter then resolves its
//!   credentials through boto3's default chain, which reads the gateways'
//!   per-launch key from the server's environment (`docs/s3-gateway.md`,
//!   "The per-launch key");
//! - `lmcache_rust_raw_block_io`, for a `raw_block` tier: LMCache 0.5.6's
//!   raw-block core imports it when the adapter starts and raises "Rust
//!   raw-block extension is not installed" without it; LMCache's wheel does
//!   not ship it.
//!
//! Without the module the server would fail at start; the launch refuses
//! instead, naming the fix.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use lmcache_tier_spec::{TierKind, TierSpec};

use crate::node::env::Vars;

/// A Python module a tier kind needs in the server's Python, and what to
/// say when it is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeededModule {
    /// The module imported, e.g. `boto3`.
    pub module: &'static str,
    /// The Python statement that imports what the server uses of it, as
    /// the server does (`import boto3`).
    pub import: &'static str,
    /// The tiers that need it, as a message names them: `the s3_bucket tiers`.
    pub needed_by: &'static str,
    /// What the module is, as a message names it.
    pub what: &'static str,
    /// What to do when a Python cannot import it; `{python}` stands for
    /// that Python.
    pub fix: &'static str,
}

/// boto3, which LMCache's S3 adapter reads the gateways' key through.
pub static BOTO3: NeededModule = NeededModule {
    module: "boto3",
    import: "import boto3",
    needed_by: "the s3_bucket tiers",
    what: "boto3",
    fix: "Install it: `{python} -m pip install boto3` (scripts/setup-lmcache.sh installs it too)",
};

/// LMCache's Rust raw-block extension, which its `raw_block` adapter
/// opens the device through (`RawBlockCore._rawdev` in LMCache 0.5.6).
pub static RAW_BLOCK_IO: NeededModule = NeededModule {
    module: "lmcache_rust_raw_block_io",
    import: "from lmcache_rust_raw_block_io import RawBlockDevice",
    needed_by: "the raw_block tiers",
    what: "lmcache_rust_raw_block_io (LMCache's Rust raw-block extension, which LMCache's wheel does not ship)",
    fix: "Build it from LMCache's sources (rust_raw_block_io) and install it where {python} imports from, or take the raw_block tier out of the cascade",
};

/// LMCache's native RESP client, which its `resp` adapter writes through
/// (`_create_resp_l2_adapter` in LMCache 0.5.6; its wheel ships it).
pub static RESP_CLIENT: NeededModule = NeededModule {
    module: "lmcache.lmcache_redis",
    import: "from lmcache.lmcache_redis import LMCacheRedisClient",
    needed_by: "the resp tiers",
    what: "lmcache.lmcache_redis (LMCache's native RESP client, which its wheel ships)",
    fix: "Install an LMCache wheel that ships it (0.5.6 does) where {python} imports from, or take the resp tier out of the cascade",
};

/// The module a tier of `kind` needs in the server's Python, if any.
pub fn needed_module(kind: TierKind<'_>) -> Option<&'static NeededModule> {
    match kind {
        TierKind::Bucket => Some(&BOTO3),
        TierKind::RawBlock => Some(&RAW_BLOCK_IO),
        TierKind::Resp => Some(&RESP_CLIENT),
        TierKind::Disk { .. } | TierKind::Object | TierKind::Other(_) => None,
    }
}

/// The modules `tiers` need in the server's Python ([`needed_module`]),
/// each once, in the order of the first tier that needs it.
pub fn needed_modules<'a>(
    tiers: impl IntoIterator<Item = &'a TierSpec>,
) -> Vec<&'static NeededModule> {
    let mut needed = Vec::new();
    for need in tiers.into_iter().filter_map(|t| needed_module(t.kind())) {
        if !needed.contains(&need) {
            needed.push(need);
        }
    }
    needed
}

/// How long the server's Python may take to import a module (about 0.2 s on
/// an idle 2-core machine; a cold page cache or a busy host take longer).
pub const IMPORT_TIMEOUT: Duration = Duration::from_secs(30);

/// The most of each output stream of the server's Python that is kept.
const OUTPUT_MAX_BYTES: usize = 16 << 10;

/// Why the server's Python is not known to import a [`NeededModule`].
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// The Python ran and could not import it.
    #[error("{} need {} in the LMCache server's Python, and {python} cannot import it ({detail}). {}", .need.needed_by, .need.what, .need.fix.replace("{python}", python))]
    Missing {
        /// The module.
        need: &'static NeededModule,
        /// The Python.
        python: String,
        /// The last line it printed, e.g. `ModuleNotFoundError: No module named 'boto3'`.
        detail: String,
    },
    /// The Python could not be run.
    #[error("{} need {} in the LMCache server's Python, and {python} cannot be run to check for it: {detail}", .need.needed_by, .need.module)]
    NotRun {
        /// The module.
        need: &'static NeededModule,
        /// The Python.
        python: String,
        /// The OS error.
        detail: String,
    },
    /// The import did not finish in time; the Python was killed.
    #[error("{} need {} in the LMCache server's Python, and {python} did not import it within {} ms", .need.needed_by, .need.module, .timeout.as_millis())]
    TimedOut {
        /// The module.
        need: &'static NeededModule,
        /// The Python.
        python: String,
        /// The time limit ([`IMPORT_TIMEOUT`]).
        timeout: Duration,
    },
}

/// The Python that the stock `lmcache` command at `stock` runs on: `python3`
/// or `python` beside it (a virtual environment's or conda's `bin/`), else
/// the interpreter its `#!` line names, with that line's arguments, when
/// that is a Python (`/usr/bin/env python3` included), else `python3` on
/// `PATH` (a wrapper such as `#!/bin/sh` says nothing of its Python).
pub fn python_of(stock: &Path) -> Vec<PathBuf> {
    let dir = stock.parent().unwrap_or(Path::new("."));
    for name in ["python3", "python"] {
        if dir.join(name).is_file() {
            return vec![dir.join(name)];
        }
    }
    let is_python = |word: &PathBuf| {
        word.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("python"))
    };
    crate::plan::locate::shebang(stock)
        .filter(|words| words.iter().any(is_python))
        .unwrap_or_else(|| vec![PathBuf::from("python3")])
}

/// Checks that `python` (a command and its arguments, [`python_of`]) can
/// run the import of `need` ([`NeededModule::import`]) in the environment `vars` (the server's;
/// empty: this process's), within [`IMPORT_TIMEOUT`]. Like the server, it
/// runs without the operator's AWS credential variables
/// ([`lmcache_s3_gateway::server_env_removed`]).
///
/// # Errors
/// [`ModuleError`]: the import fails, the Python cannot be run, or it takes
/// longer than [`IMPORT_TIMEOUT`].
pub fn check_module(
    python: &[PathBuf],
    vars: &Vars,
    need: &'static NeededModule,
) -> Result<(), ModuleError> {
    check_within(python, vars, need, IMPORT_TIMEOUT)
}

/// [`check_module`] with the time limit `timeout`.
fn check_within(
    python: &[PathBuf],
    vars: &Vars,
    need: &'static NeededModule,
    timeout: Duration,
) -> Result<(), ModuleError> {
    let shown = shown(python);
    let mut command = command(python, vars);
    for name in lmcache_s3_gateway::server_env_removed() {
        command.env_remove(name);
    }
    command.args(["-c", need.import]);
    let ran = run_bounded(command, timeout).map_err(|e| match e {
        RunError::NotRun(detail) => ModuleError::NotRun {
            need,
            python: shown.clone(),
            detail,
        },
        RunError::TimedOut => ModuleError::TimedOut {
            need,
            python: shown.clone(),
            timeout,
        },
    })?;
    if ran.status.success() {
        return Ok(());
    }
    let detail = ran
        .stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map_or_else(
            || format!("it exited with {}", ran.status),
            |l| l.trim().to_string(),
        );
    Err(ModuleError::Missing {
        need,
        python: shown,
        detail,
    })
}

/// `python` ([`python_of`]) as one line for messages.
pub fn shown(python: &[PathBuf]) -> String {
    python
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `python` ([`python_of`]: a command and its arguments) ready to take a
/// script: the environment `vars` (empty: this process's), stdin closed.
pub fn command(python: &[PathBuf], vars: &Vars) -> Command {
    let mut command = Command::new(python.first().map_or(Path::new("python3"), |p| p));
    if !vars.is_empty() {
        command.env_clear().envs(vars);
    }
    command
        .args(&python[1.min(python.len())..])
        .stdin(Stdio::null());
    command
}

/// What a [`run_bounded`] run left: how it ended and what it printed (each
/// stream up to 16 KiB).
#[derive(Debug)]
pub struct Ran {
    /// How it ended.
    pub status: ExitStatus,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// Why a [`run_bounded`] run left nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
    /// It could not be started, or waited for: the OS error.
    NotRun(String),
    /// It ran past its time limit and was killed.
    TimedOut,
}

/// Runs `command` with its output captured, killing it once `timeout` has
/// passed. Output is read until `timeout` at most: a process it started that
/// keeps the streams open past its exit does not hold the caller.
///
/// # Errors
/// [`RunError`]: it could not run, or ran past `timeout`.
pub fn run_bounded(mut command: Command, timeout: Duration) -> Result<Ran, RunError> {
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = command
        .spawn()
        .map_err(|e| RunError::NotRun(e.to_string()))?;
    let _group = KillGroupOnDrop(child.id());
    let stdout = read_in_background(child.stdout.take());
    let stderr = read_in_background(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError::TimedOut);
            }
            Err(e) => return Err(RunError::NotRun(e.to_string())),
        }
    };
    let remaining = || deadline.saturating_duration_since(Instant::now());
    Ok(Ran {
        status,
        stdout: stdout.recv_timeout(remaining()).unwrap_or_default(),
        stderr: stderr.recv_timeout(remaining()).unwrap_or_default(),
    })
}

/// Ends the process group of a [`run_bounded`] run when the run is over, so
/// that nothing the server's Python started outlives the check.
struct KillGroupOnDrop(u32);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Reads `stream` to its end on a thread of its own, so that a full pipe
/// never blocks the child, keeping its last [`OUTPUT_MAX_BYTES`] (where a
/// result line and an error's last line are); the text arrives on the
/// receiver at the stream's end.
fn read_in_background(stream: Option<impl Read + Send + 'static>) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buffer = [0u8; 8192];
        let mut stream = stream;
        while let Some(Ok(n @ 1..)) = stream.as_mut().map(|s| s.read(&mut buffer)) {
            kept.extend_from_slice(&buffer[..n]);
            let excess = kept.len().saturating_sub(OUTPUT_MAX_BYTES);
            kept.drain(..excess);
        }
        let _ = tx.send(String::from_utf8_lossy(&kept).into_owned());
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn the_python_beside_lmcache_comes_before_its_shebang() {
        let dir = tempfile::tempdir().unwrap();
        let stock = dir.path().join("lmcache");
        script(&stock, "#!/bin/sh\n");
        assert_eq!(python_of(&stock), [PathBuf::from("python3")]);
        script(&stock, "#!/usr/bin/env python3\n");
        assert_eq!(
            python_of(&stock),
            [PathBuf::from("/usr/bin/env"), PathBuf::from("python3")]
        );
        script(&stock, "#!/opt/py/bin/python3.11 -E\n");
        assert_eq!(
            python_of(&stock),
            [PathBuf::from("/opt/py/bin/python3.11"), PathBuf::from("-E")]
        );
        script(&dir.path().join("python"), "#!/bin/sh\n");
        assert_eq!(python_of(&stock), [dir.path().join("python")]);
        script(&dir.path().join("python3"), "#!/bin/sh\n");
        assert_eq!(python_of(&stock), [dir.path().join("python3")]);
    }

    #[test]
    fn a_python_that_cannot_import_boto3_is_named_with_its_error_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("python3");
        script(
            &python,
            "#!/bin/sh\necho 'Traceback' >&2\necho \"ModuleNotFoundError: No module named 'boto3'\" >&2\nexit 1\n",
        );
        let e = check_module(std::slice::from_ref(&python), &Vars::new(), &BOTO3).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("ModuleNotFoundError: No module named 'boto3'")
                && text.contains(&format!("`{} -m pip install boto3`", python.display())),
            "{text}"
        );
        script(&python, "#!/bin/sh\n[ \"$1 $2\" = '-c import boto3' ]\n");
        check_module(&[python], &Vars::new(), &BOTO3).unwrap();
        let missing =
            check_module(&[dir.path().join("nothing")], &Vars::new(), &BOTO3).unwrap_err();
        assert!(matches!(missing, ModuleError::NotRun { .. }), "{missing}");
    }

    #[test]
    fn each_tier_kind_needs_its_module_and_a_missing_one_names_its_fix() {
        let kinds = [
            TierKind::Bucket,
            TierKind::RawBlock,
            TierKind::Resp,
            TierKind::Object,
            TierKind::Disk { native: true },
            TierKind::Other("mock"),
        ];
        let needs: Vec<Option<&str>> = kinds
            .into_iter()
            .map(|k| needed_module(k).map(|n| n.module))
            .collect();
        assert_eq!(
            needs,
            [
                Some("boto3"),
                Some("lmcache_rust_raw_block_io"),
                Some("lmcache.lmcache_redis"),
                None,
                None,
                None
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("python3");
        script(
            &python,
            "#!/bin/sh\n[ \"$1 $2\" = '-c import boto3' ] && exit 0\n[ \"$2\" = 'from lmcache_rust_raw_block_io import RawBlockDevice' ] && echo \"ModuleNotFoundError: No module named 'lmcache_rust_raw_block_io'\" >&2\nexit 1\n",
        );
        check_module(std::slice::from_ref(&python), &Vars::new(), &BOTO3).unwrap();
        let e = check_module(std::slice::from_ref(&python), &Vars::new(), &RAW_BLOCK_IO)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("the raw_block tiers need lmcache_rust_raw_block_io (")
                && e.contains("No module named 'lmcache_rust_raw_block_io'")
                && e.contains(&format!(
                    "install it where {} imports from",
                    python.display()
                )),
            "{e}"
        );
    }

    #[test]
    fn a_child_left_holding_the_output_does_not_hold_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("python3");
        script(&python, "#!/bin/sh\nsleep 30 &\necho done\n");
        let started = Instant::now();
        let ran =
            run_bounded(command(&[python], &Vars::new()), Duration::from_millis(500)).unwrap();
        assert!(ran.status.success());
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn long_output_keeps_its_end_and_the_run_its_status() {
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("python3");
        script(
            &python,
            "#!/bin/sh\nhead -c 40000 /dev/zero | tr '\\0' x\necho\necho RESULT\n",
        );
        let ran = run_bounded(command(&[python], &Vars::new()), IMPORT_TIMEOUT).unwrap();
        assert!(ran.status.success(), "{:?}", ran.status);
        assert!(ran.stdout.ends_with("RESULT\n"), "{}", ran.stdout.len());
        assert!(ran.stdout.len() <= OUTPUT_MAX_BYTES);
    }

    #[test]
    fn a_python_that_hangs_is_killed_at_the_time_limit() {
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("python3");
        script(
            &python,
            "#!/bin/sh
exec sleep 30
",
        );
        let started = Instant::now();
        let e =
            check_within(&[python], &Vars::new(), &BOTO3, Duration::from_millis(300)).unwrap_err();
        assert!(matches!(e, ModuleError::TimedOut { .. }), "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn the_import_runs_in_the_environment_given_less_the_aws_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("python3");
        script(
            &python,
            "#!/bin/sh\n[ \"$MARK\" = yes ] && [ -z \"$HOME$AWS_SECRET_ACCESS_KEY$AWS_PROFILE\" ]\n",
        );
        let vars = crate::node::env::text_vars([
            ("MARK", "yes"),
            ("AWS_SECRET_ACCESS_KEY", "REAL"),
            ("AWS_PROFILE", "kv"),
        ]);
        check_module(std::slice::from_ref(&python), &vars, &BOTO3).unwrap();
        let other = crate::node::env::text_vars([("MARK", "no")]);
        assert!(check_module(&[python], &other, &BOTO3).is_err());
    }
}
