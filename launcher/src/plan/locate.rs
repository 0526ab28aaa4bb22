//! Finding the executables: the stock `lmcache` that `erebine-lmcache` wraps,
//! and the executable `lmcache-tier launch` starts the server with.
//!
//! Order (`docs/configuration.md`, "Finding the executables"): the active
//! Python environment, then beside the `vllm` executable, then `PATH`; never
//! `erebine-lmcache` itself.

use std::env::split_paths;
use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::node::env::Vars;

/// No executable was found; `looked` lists every place tried, in order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot find {what}; looked in:\n{}\n{fix}", looked.iter().map(|l| format!("  - {l}")).collect::<Vec<_>>().join("\n"))]
pub struct NotFound {
    /// What was looked for.
    pub what: String,
    /// Every candidate tried, with why it was passed over.
    pub looked: Vec<String>,
    /// What to do.
    pub fix: String,
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Searches `PATH` (as given in `vars`) for `name`.
pub fn which(name: &str, vars: &Vars) -> Option<PathBuf> {
    let path = vars.get(OsStr::new("PATH"))?;
    split_paths(path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// Finds the stock `lmcache` command: `$VIRTUAL_ENV/bin`, `$CONDA_PREFIX/bin`,
/// the directory of the `vllm` executable on `PATH` (and of its resolved
/// target), then `PATH`. Candidates that resolve to `own_exe` are skipped.
pub fn find_stock_lmcache(vars: &Vars, own_exe: &Path) -> Result<PathBuf, NotFound> {
    let own = own_exe
        .canonicalize()
        .unwrap_or_else(|_| own_exe.to_path_buf());
    let mut candidates: Vec<(String, PathBuf)> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        match vars.get(OsStr::new(var)).filter(|v| !v.is_empty()) {
            Some(prefix) => candidates.push((
                format!("the active Python environment (${var})"),
                Path::new(prefix).join("bin/lmcache"),
            )),
            None => candidates.push((format!("${var} (unset)"), PathBuf::new())),
        }
    }
    match which("vllm", vars) {
        Some(vllm) => {
            let mut dirs = vec![vllm.parent().map(Path::to_path_buf)];
            if let Ok(real) = vllm.canonicalize() {
                dirs.push(real.parent().map(Path::to_path_buf));
            }
            for dir in dirs.into_iter().flatten() {
                candidates.push(("beside vllm".into(), dir.join("lmcache")));
            }
        }
        None => candidates.push(("beside vllm (no vllm on PATH)".into(), PathBuf::new())),
    }
    if let Some(path) = vars.get(OsStr::new("PATH")) {
        for dir in split_paths(path) {
            candidates.push(("PATH".into(), dir.join("lmcache")));
        }
    }
    let mut looked = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (place, candidate) in candidates {
        if !candidate.as_os_str().is_empty() && !seen.insert(candidate.clone()) {
            continue;
        }
        if candidate.as_os_str().is_empty() {
            looked.push(place);
            continue;
        }
        if !is_executable(&candidate) {
            looked.push(format!("{} ({place}): not there", candidate.display()));
            continue;
        }
        if candidate.canonicalize().ok().as_deref() == Some(own.as_path()) {
            looked.push(format!(
                "{} ({place}): is erebine-lmcache itself",
                candidate.display()
            ));
            continue;
        }
        return Ok(candidate);
    }
    Err(NotFound {
        what: "the stock `lmcache` command (pip package lmcache==0.5.6)".into(),
        looked,
        fix: "Install it in a Python virtual environment and activate it (or set VIRTUAL_ENV), e.g. `python3 -m venv V && V/bin/pip install lmcache==0.5.6`; scripts/setup-lmcache.sh in this project's clone installs it in $EREBINE_LMCACHE_VENV, default ~/.cache/erebine/lmcache-0.5.6, and prints that path (then `export VIRTUAL_ENV=<that path>`)".into(),
    })
}

/// The stock `lmcache` a launch with the server `executable` runs: the
/// executable itself when it is a script (`EREBINE_AGENT_LMCACHE_PATH`
/// naming the stock command: [`shebang`]), else the one `erebine-lmcache`
/// will find ([`find_stock_lmcache`], skipping `executable`).
///
/// Errors: [`NotFound`], with every place looked.
pub fn stock_of(executable: &Path, vars: &Vars) -> Result<PathBuf, NotFound> {
    match shebang(executable) {
        Some(_) => Ok(executable.to_path_buf()),
        None => find_stock_lmcache(vars, executable),
    }
}

/// The executable `lmcache-tier launch` starts the server with: the one
/// `EREBINE_AGENT_LMCACHE_PATH` names, else `erebine-lmcache` beside
/// `own_exe`, else `erebine-lmcache` on `PATH`.
pub fn server_executable(
    configured: Option<&Path>,
    vars: &Vars,
    own_exe: &Path,
) -> Result<PathBuf, NotFound> {
    if let Some(path) = configured {
        if is_executable(path) {
            return Ok(path.to_path_buf());
        }
        return Err(NotFound {
            what: "the server executable EREBINE_AGENT_LMCACHE_PATH names".into(),
            looked: vec![format!("{}: not an executable file", path.display())],
            fix: "Point EREBINE_AGENT_LMCACHE_PATH at erebine-lmcache or lmcache, or unset it"
                .into(),
        });
    }
    let mut looked = Vec::new();
    if let Some(dir) = own_exe.parent() {
        let beside = dir.join("erebine-lmcache");
        if is_executable(&beside) {
            return Ok(beside);
        }
        looked.push(format!(
            "{} (beside lmcache-tier): not there",
            beside.display()
        ));
    }
    if let Some(found) = which("erebine-lmcache", vars) {
        return Ok(found);
    }
    looked.push("erebine-lmcache on PATH: not there".into());
    Err(NotFound {
        what: "erebine-lmcache".into(),
        looked,
        fix: "Install erebine-lmcache beside lmcache-tier (cargo build puts both in target/<profile>/), or set EREBINE_AGENT_LMCACHE_PATH".into(),
    })
}

/// The LMCache versions the end-to-end tests have passed on
/// (`docs/configuration.md`, "LMCache versions").
pub const TESTED_LMCACHE_VERSIONS: &[&str] = &["0.5.4", "0.5.5", "0.5.6", "0.5.7rc2"];

/// An installed LMCache: where its `lmcache` command is and which version
/// its Python environment holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LmcacheInstall {
    /// The stock `lmcache` command.
    pub path: PathBuf,
    /// The installed version (`lmcache-<version>.dist-info`), `None` when
    /// it cannot be read.
    pub version: Option<String>,
    /// Whether `version` is one of [`TESTED_LMCACHE_VERSIONS`].
    pub tested: bool,
}

impl LmcacheInstall {
    /// Reads the version of the LMCache that the stock command at `stock`
    /// runs ([`lmcache_version`]).
    pub fn at(stock: &Path) -> Self {
        Self::with_version(stock, lmcache_version(stock))
    }

    /// The stock `lmcache` at `stock` whose version was read already
    /// ([`crate::Facts::lmcache_version`]).
    pub fn with_version(stock: &Path, version: Option<String>) -> Self {
        let tested = version
            .as_deref()
            .is_some_and(|v| TESTED_LMCACHE_VERSIONS.contains(&v));
        LmcacheInstall {
            path: stock.to_path_buf(),
            version,
            tested,
        }
    }

    /// One line for the log: `LMCache 0.5.6 (/venv/bin/lmcache)`, with a
    /// warning when the version is not a tested one.
    pub fn describe(&self) -> String {
        let tested = TESTED_LMCACHE_VERSIONS.join(", ");
        match (&self.version, self.tested) {
            (Some(v), true) => format!("LMCache {v} ({})", self.path.display()),
            (Some(v), false) => format!(
                "LMCache {v} ({}) is not a tested version ({tested}): it may work, or fail at start or at run time",
                self.path.display()
            ),
            (None, _) => format!(
                "the LMCache version of {} cannot be read (no lmcache-*.dist-info in its Python environment); tested versions: {tested}",
                self.path.display()
            ),
        }
    }
}

/// The version of LMCache installed for the stock `lmcache` command at
/// `stock` ([`package_version`]).
pub fn lmcache_version(stock: &Path) -> Option<String> {
    package_version(stock, "lmcache")
}

/// The version of the Python package `package` (e.g. `vllm`) installed for
/// the command at `command`, from the `Version:` line of
/// `<package>-<version>.dist-info/METADATA` in the `site-packages` of the
/// Python its `#!` line names (else of the environment `<command>/../..`).
/// Reads files only: no Python is started.
pub fn package_version(command: &Path, package: &str) -> Option<String> {
    let prefixes = [
        interpreter(command).and_then(|python| Some(python.parent()?.parent()?.to_path_buf())),
        command
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf),
    ];
    prefixes.into_iter().flatten().find_map(|prefix| {
        std::fs::read_dir(prefix.join("lib"))
            .ok()?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
            .find_map(|python| dist_info_version(&python.path().join("site-packages"), package))
    })
}

/// The command the `#!` line of the script at `script` names: the
/// interpreter and its arguments; `None` for a file without one.
pub fn shebang(script: &Path) -> Option<Vec<PathBuf>> {
    let text = read_small_file(script)?;
    let line = text.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line.strip_prefix(b"#!")?).ok()?;
    let words: Vec<PathBuf> = line.split_whitespace().map(PathBuf::from).collect();
    (!words.is_empty()).then_some(words)
}

/// The interpreter the `#!` line of the script `path` names (its first
/// word), e.g. `/venv/bin/python3`; `None` for a file without one.
fn interpreter(path: &Path) -> Option<PathBuf> {
    shebang(path)?.into_iter().next()
}

fn dist_info_version(site_packages: &Path, package: &str) -> Option<String> {
    let prefix = format!("{package}-");
    std::fs::read_dir(site_packages)
        .ok()?
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().to_lowercase();
            name.starts_with(&prefix) && name.ends_with(".dist-info")
        })
        .find_map(|e| metadata_version(&e.path()).or_else(|| name_version(&e.file_name(), &prefix)))
}

/// The `Version:` of the `METADATA` in the `.dist-info` directory `dist`.
fn metadata_version(dist: &Path) -> Option<String> {
    let metadata = read_small_file(&dist.join("METADATA"))?;
    String::from_utf8_lossy(&metadata)
        .lines()
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.strip_prefix("Version: "))
        .map(|v| v.trim().to_string())
}

/// The version in the name of a `<package>-<version>.dist-info` directory
/// (`prefix` is `<package>-`), for one whose `METADATA` is missing or
/// unreadable: the wheel format names the directory after the version it
/// installs.
fn name_version(name: &std::ffi::OsStr, prefix: &str) -> Option<String> {
    let name = name.to_str()?;
    let version = name.get(prefix.len()..)?.strip_suffix(".dist-info")?;
    (!version.is_empty()).then(|| version.to_string())
}

/// The largest file read to find a version: a METADATA file is a few KiB.
const METADATA_MAX_BYTES: u64 = 1 << 20;

/// The first [`METADATA_MAX_BYTES`] of `path` if it is a regular file (a
/// FIFO or a device named METADATA would block or never end), opened
/// without blocking.
fn read_small_file(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(METADATA_MAX_BYTES).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn exe(dir: &Path, name: &str) -> PathBuf {
        fs::create_dir_all(dir).unwrap();
        let p = dir.join(name);
        fs::write(&p, "#!/bin/sh\n").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    fn vars(pairs: &[(&str, String)]) -> Vars {
        pairs.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    #[test]
    fn virtual_env_comes_first_then_vllm_then_path() {
        let t = tempfile::tempdir().unwrap();
        let own = exe(&t.path().join("own"), "erebine-lmcache");
        let venv = exe(&t.path().join("venv/bin"), "lmcache");
        exe(&t.path().join("vllmenv"), "vllm");
        let beside_vllm = exe(&t.path().join("vllmenv"), "lmcache");
        let on_path = exe(&t.path().join("path"), "lmcache");
        let path = format!(
            "{}:{}",
            t.path().join("vllmenv").display(),
            t.path().join("path").display()
        );
        let v = vars(&[
            ("VIRTUAL_ENV", t.path().join("venv").display().to_string()),
            ("PATH", path.clone()),
        ]);
        assert_eq!(find_stock_lmcache(&v, &own).unwrap(), venv);
        let v = vars(&[("PATH", path)]);
        assert_eq!(find_stock_lmcache(&v, &own).unwrap(), beside_vllm);
        let v = vars(&[("PATH", t.path().join("path").display().to_string())]);
        assert_eq!(find_stock_lmcache(&v, &own).unwrap(), on_path);
    }

    #[test]
    fn never_finds_itself_and_lists_every_place() {
        let t = tempfile::tempdir().unwrap();
        let own = exe(&t.path().join("bin"), "erebine-lmcache");
        std::os::unix::fs::symlink(&own, t.path().join("bin/lmcache")).unwrap();
        let v = vars(&[("PATH", t.path().join("bin").display().to_string())]);
        let err = find_stock_lmcache(&v, &own).unwrap_err().to_string();
        assert!(err.contains("is erebine-lmcache itself"), "{err}");
        assert!(err.contains("VIRTUAL_ENV"), "{err}");
        assert!(err.contains("vllm"), "{err}");
        assert!(err.contains("pip install lmcache==0.5.6"), "{err}");
        let bin = t.path().join("bin").display().to_string();
        let twice = vars(&[("PATH", format!("{bin}:{bin}/:{bin}"))]);
        let err = find_stock_lmcache(&twice, &own).unwrap_err().to_string();
        assert_eq!(
            err.matches("is erebine-lmcache itself").count(),
            1,
            "a directory on PATH more than once is listed once: {err}"
        );
    }

    #[test]
    fn server_executable_prefers_the_configured_path() {
        let t = tempfile::tempdir().unwrap();
        let own = exe(t.path(), "lmcache-tier");
        let beside = exe(t.path(), "erebine-lmcache");
        let v = vars(&[]);
        assert_eq!(server_executable(None, &v, &own).unwrap(), beside);
        let custom = exe(&t.path().join("x"), "lmcache");
        assert_eq!(server_executable(Some(&custom), &v, &own).unwrap(), custom);
        let err = server_executable(Some(Path::new("/nonexistent/x")), &v, &own).unwrap_err();
        assert!(err.to_string().contains("EREBINE_AGENT_LMCACHE_PATH"));
    }

    #[test]
    fn the_lmcache_version_is_read_from_the_environment_the_command_runs_in() {
        let t = tempfile::tempdir().unwrap();
        let venv = t.path().join("venv");
        let dist = venv.join("lib/python3.11/site-packages/lmcache-0.5.5.dist-info");
        fs::create_dir_all(&dist).unwrap();
        fs::write(
            dist.join("METADATA"),
            "Metadata-Version: 2.1\nName: lmcache\nVersion: 0.5.5\n\nVersion: 9\n",
        )
        .unwrap();
        let python = exe(&venv.join("bin"), "python3");
        // The command elsewhere, its #! naming the environment's Python.
        let elsewhere = t.path().join("bin/lmcache");
        fs::create_dir_all(elsewhere.parent().unwrap()).unwrap();
        fs::write(
            &elsewhere,
            format!("#!{} -s\nimport sys\n", python.display()),
        )
        .unwrap();
        let install = LmcacheInstall::at(&elsewhere);
        assert_eq!(install.version.as_deref(), Some("0.5.5"));
        assert!(install.tested);
        assert!(install.describe().starts_with("LMCache 0.5.5 ("));
        // Inside the environment, with a #! that names nothing useful.
        let inside = exe(&venv.join("bin"), "lmcache");
        assert_eq!(lmcache_version(&inside).as_deref(), Some("0.5.5"));
        fs::write(dist.join("METADATA"), "Name: lmcache\nVersion: 0.4.0\n").unwrap();
        let old = LmcacheInstall::at(&inside);
        assert!(!old.tested);
        assert!(old
            .describe()
            .contains("is not a tested version (0.5.4, 0.5.5, 0.5.6, 0.5.7rc2)"));
        // What is not a small regular file is not read: the directory's
        // name gives the version then, as it does without a METADATA.
        fs::remove_file(dist.join("METADATA")).unwrap();
        assert_eq!(lmcache_version(&inside).as_deref(), Some("0.5.5"));
        std::os::unix::fs::symlink("/dev/zero", dist.join("METADATA")).unwrap();
        assert_eq!(lmcache_version(&inside).as_deref(), Some("0.5.5"));
        fs::remove_file(dist.join("METADATA")).unwrap();
        nix::unistd::mkfifo(&dist.join("METADATA"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(lmcache_version(&inside).as_deref(), Some("0.5.5"));
        let site = dist.parent().unwrap().to_path_buf();
        fs::remove_dir_all(&dist).unwrap();
        for (name, version) in [
            ("lmcache-1!0.5.6.dist-info", Some("1!0.5.6")),
            ("LMCache-0.5.7rc2.dist-info", Some("0.5.7rc2")),
            ("lmcache-.dist-info", None),
            ("lmcache_extra-9.0.dist-info", None),
        ] {
            fs::create_dir(site.join(name)).unwrap();
            assert_eq!(lmcache_version(&inside).as_deref(), version, "{name}");
            fs::remove_dir(site.join(name)).unwrap();
        }
        let none = LmcacheInstall::at(&exe(&t.path().join("bare/bin"), "lmcache"));
        assert_eq!(none.version, None);
        assert!(none.describe().contains("cannot be read"));
    }
}
