//! The LMCache server's HTTP API key (LMCache 0.5.7 on; `docs/configuration.md`,
//! "The server's API key"). With a key, the server answers every route but
//! `/` and `/healthcheck` with 401 unless the request carries
//! `Authorization: Bearer <key>`, so each request of ours to its HTTP port
//! (the launch's `/status` polls, `inspect`) carries one of the keys it
//! accepts. LMCache reads its keys from `--api-key-file PATH` (repeatable;
//! alias `--http-api-key-file`), then `LMCACHE_API_KEY_FILE` (else
//! `LMCACHE_HTTP_API_KEY_FILE`), then `LMCACHE_API_KEY` (else
//! `LMCACHE_HTTP_API_KEY`): each file holds one line
//! (`lmcache/security/api_key.py`). Keys are read here and kept in memory
//! only; they are never put on a command line or in a log.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The server's flag that names a key file, and its alias.
pub const FLAGS: [&str; 2] = ["--api-key-file", "--http-api-key-file"];

/// The server's variables, in the order LMCache prefers them: each new name
/// before its legacy one, files before values.
const VARIABLES: [(&str, bool); 4] = [
    ("LMCACHE_API_KEY_FILE", true),
    ("LMCACHE_HTTP_API_KEY_FILE", true),
    ("LMCACHE_API_KEY", false),
    ("LMCACHE_HTTP_API_KEY", false),
];

/// Where a key the server accepts is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiKeySource {
    /// A key file given to the server (`--api-key-file`, or a `*_FILE`
    /// variable of its environment).
    File(PathBuf),
    /// A variable of the server's environment holding the key itself.
    Variable(&'static str),
}

impl fmt::Display for ApiKeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiKeySource::File(path) => write!(f, "the key file {}", path.display()),
            ApiKeySource::Variable(name) => write!(f, "the server's {name}"),
        }
    }
}

/// A key: its text is shown nowhere (`Debug` prints `<redacted>`).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// The `Authorization` header's value: `Bearer <key>`.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// A key that cannot be read or made. The messages name the file or the
/// variable, never the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiKeyError {
    /// The key file cannot be read, or created where it is missing.
    #[error("the LMCache API key file {}: {detail}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What failed and what to do.
        detail: String,
    },
    /// The variable holds no usable key.
    #[error("the server's {name} {detail}")]
    Variable {
        /// The variable.
        name: &'static str,
        /// What is wrong and what to do.
        detail: String,
    },
}

/// The first key source of a server started with `args` in an environment
/// read by `lookup`, in LMCache's order; `None` when the server has no key.
/// `--api-key-file=PATH` and `--api-key-file PATH` are both read.
pub fn source(args: &[String], lookup: &dyn Fn(&str) -> Option<String>) -> Option<ApiKeySource> {
    if let Some(path) = flag_files(args).into_iter().next() {
        return Some(ApiKeySource::File(path));
    }
    VARIABLES.iter().find_map(|&(name, file)| {
        let value = lookup(name).filter(|v| !v.is_empty())?;
        Some(match file {
            true => ApiKeySource::File(PathBuf::from(value)),
            false => ApiKeySource::Variable(name),
        })
    })
}

/// Every key file `args` names with [`FLAGS`], in order
/// (`--api-key-file=PATH` and `--api-key-file PATH` alike).
fn flag_files(args: &[String]) -> Vec<PathBuf> {
    let named = args.iter().enumerate().filter_map(|(i, arg)| {
        FLAGS.iter().find_map(|flag| match arg.strip_prefix(flag) {
            Some("") => args.get(i + 1).cloned(),
            Some(value) => value.strip_prefix('=').map(str::to_string),
            None => None,
        })
    });
    named.map(PathBuf::from).collect()
}

/// The key a client of the node's server sends (`inspect`): the node's
/// `EREBINE_AGENT_LMCACHE_API_KEY_FILE` (`node_file`), else LMCache's own
/// variables in the client's environment (`lookup`), as the server would
/// read them; `None` when none is set, or the node's file does not exist
/// (the launch makes it only for an LMCache version that takes a key). The
/// file is only read, never made.
///
/// Errors: as [`ApiKeySource::read`].
pub fn for_client(
    node_file: Option<&Path>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<ApiKey>, ApiKeyError> {
    let source = match node_file {
        // The launch makes it only for an LMCache that takes a key: a node
        // whose server has none has no file either.
        Some(file) if std::fs::symlink_metadata(file).is_err() => return Ok(None),
        Some(file) => Some(ApiKeySource::File(file.to_path_buf())),
        None => source(&[], lookup),
    };
    source.map(|s| s.read(lookup)).transpose()
}

/// Checks, before a launch creates anything, each key a server that takes
/// one would read at start: the node's key file (`node_file`) where it
/// exists, every `--api-key-file` (or its alias) in `extra_args` (the
/// operator's extra server arguments), and the file or value of the first
/// of LMCache's own variables that `lookup` has set, in LMCache's order
/// (LMCache reads it beside the flag, and refuses a missing or empty one
/// at start). A node key file that does not exist yet must have a
/// directory, or a place for one, above it: the launch makes it. Warns
/// when an existing key file can be read by other users.
///
/// Errors: the first key the server would refuse ([`ApiKeyError`]).
pub fn check_sources(
    node_file: Option<&Path>,
    extra_args: &[String],
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ApiKeyError> {
    if let Some(file) = node_file {
        match std::fs::symlink_metadata(file) {
            Ok(_) => {
                read_file(file)?;
                warn_if_exposed(file);
            }
            Err(_) => check_room_for(file)?,
        }
    }
    for file in flag_files(extra_args) {
        read_file(&file)?;
        warn_if_exposed(&file);
    }
    if let Some(source) = source(&[], lookup) {
        source.read(lookup)?;
        if let ApiKeySource::File(file) = &source {
            warn_if_exposed(file);
        }
    }
    Ok(())
}

/// Refuses a key file to be made at `path` whose nearest existing
/// ancestor is not a directory.
fn check_room_for(path: &Path) -> Result<(), ApiKeyError> {
    let above = path
        .ancestors()
        .skip(1)
        .find(|a| std::fs::metadata(a).is_ok());
    match above {
        Some(dir) if !dir.is_dir() => Err(ApiKeyError::File {
            path: path.to_path_buf(),
            detail: format!(
                "cannot be created: {} exists and is not a directory; name a file under a directory",
                dir.display()
            ),
        }),
        _ => Ok(()),
    }
}

/// A WARN for each way other users can reach the key file at `path`
/// ([`exposures`]).
fn warn_if_exposed(path: &Path) {
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    let euid = nix::unistd::geteuid().as_raw();
    for problem in exposures(meta.permissions().mode(), meta.uid(), euid) {
        tracing::warn!("the LMCache API key file {} {problem}", path.display());
    }
}

/// How a key file of `mode` owned by `owner` is open to other users than
/// `euid` (this process's): readable by the group or others (they learn
/// the key), or owned by another user than this one or root (that user can
/// change the key the server checks). Each as the end of a sentence that
/// names the file, with what to do.
fn exposures(mode: u32, owner: u32, euid: u32) -> Vec<String> {
    let mut found = Vec::new();
    let mode = mode & 0o777;
    if mode & 0o077 != 0 {
        found.push(format!(
            "has mode {mode:04o}, so other users can read the key: chmod 600 it"
        ));
    }
    if owner != euid && owner != 0 {
        found.push(format!(
            "is owned by uid {owner}, not by this user (uid {euid}) or root, so that user can change the key the server checks: chown it to uid {euid}"
        ));
    }
    found
}

impl ApiKeySource {
    /// Reads the key: a file's one line (surrounding whitespace trimmed, as
    /// LMCache trims it), or the variable's value.
    ///
    /// Errors: a file that cannot be read, is empty or holds several lines
    /// (LMCache refuses it at start), an empty variable.
    pub fn read(&self, lookup: &dyn Fn(&str) -> Option<String>) -> Result<ApiKey, ApiKeyError> {
        match self {
            ApiKeySource::File(path) => read_file(path),
            ApiKeySource::Variable(name) => {
                let value = lookup(name).unwrap_or_default();
                check_key(value.as_bytes()).map_err(|detail| ApiKeyError::Variable { name, detail })
            }
        }
    }
}

/// The most bytes a key file may hold: a key is a few dozen characters.
const MAX_KEY_FILE_BYTES: u64 = 4096;

fn read_file(path: &Path) -> Result<ApiKey, ApiKeyError> {
    let problem = |detail: String| ApiKeyError::File {
        path: path.to_path_buf(),
        detail,
    };
    // Non-blocking, so that a FIFO or a device cannot hold the launch in
    // its open; only a regular file is read.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            problem(format!(
                "cannot be read ({e}); give this user read access, or name another file"
            ))
        })?;
    let meta = file
        .metadata()
        .map_err(|e| problem(format!("cannot be read ({e})")))?;
    if !meta.is_file() {
        return Err(problem(
            "is not a regular file; name a file that holds one key on one line".into(),
        ));
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(file, MAX_KEY_FILE_BYTES + 1),
        &mut bytes,
    )
    .map_err(|e| problem(format!("cannot be read ({e})")))?;
    if bytes.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(problem(format!(
            "holds more than {MAX_KEY_FILE_BYTES} bytes; a key is one short line"
        )));
    }
    check_key(bytes.trim_ascii()).map_err(problem)
}

/// The key in `bytes` (surrounding whitespace already trimmed): one word of
/// printable ASCII, which an `Authorization` header carries as it is and
/// LMCache reads as one line. Errors say where, never what, the key is.
fn check_key(bytes: &[u8]) -> Result<ApiKey, String> {
    if bytes.is_empty() {
        return Err("is empty; write one key on one line".into());
    }
    let lines = 1 + bytes.iter().filter(|&&b| b == b'\n').count();
    if lines > 1 {
        return Err(format!(
            "holds {lines} lines; LMCache takes one key on one line"
        ));
    }
    match bytes.iter().position(|b| !b.is_ascii_graphic()) {
        Some(at) => Err(format!(
            "holds a byte other than printable ASCII (0x{:02x}, at byte {at}): a space, a control character (LMCache also ends a line at \\r, \\v and \\f) or a non-ASCII letter cannot pass in an Authorization header as LMCache compares it; write the key in printable ASCII",
            bytes[at]
        )),
        None => Ok(ApiKey(String::from_utf8_lossy(bytes).into_owned())),
    }
}

/// Makes sure the key file at `path` exists: a missing one is created with
/// a new key (32 random bytes, in hex) and mode 0600, its directory with
/// mode 0700 where that is missing too. Returns whether it was created.
/// An existing file is left as it is and read to check it ([`ApiKeySource::read`]).
///
/// Errors: the directory or the file cannot be made, the system has no
/// randomness, an existing file cannot be read or is not one key.
pub fn ensure_file(path: &Path) -> Result<bool, ApiKeyError> {
    let problem = |detail: String| ApiKeyError::File {
        path: path.to_path_buf(),
        detail,
    };
    if std::fs::symlink_metadata(path).is_ok() {
        read_file(path)?;
        return Ok(false);
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| problem(format!("its directory cannot be created ({e})")))?;
    }
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| problem(format!("no randomness for a new key ({e})")))?;
    let key: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| problem(format!("cannot be created ({e})")))?;
    // The mode asked for is cut by the umask only: make it exactly 0600.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .and_then(|()| writeln!(file, "{key}"))
        .map_err(|e| problem(format!("cannot be written ({e})")))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn the_flag_wins_then_files_then_values_each_new_name_first() {
        let none = |_: &str| None;
        assert_eq!(source(&args("server --port 1"), &none), None);
        for (line, path) in [
            ("server --api-key-file /k --port 1", "/k"),
            ("server --http-api-key-file /h", "/h"),
            ("server --api-key-file=/e", "/e"),
        ] {
            assert_eq!(
                source(&args(line), &none),
                Some(ApiKeySource::File(path.into())),
                "{line}"
            );
        }
        let env = |name: &str| match name {
            "LMCACHE_HTTP_API_KEY_FILE" => Some("/legacy".to_string()),
            "LMCACHE_API_KEY" => Some("k".to_string()),
            "LMCACHE_API_KEY_FILE" => Some(String::new()),
            _ => None,
        };
        assert_eq!(
            source(&args("server"), &env),
            Some(ApiKeySource::File("/legacy".into()))
        );
        assert_eq!(
            source(&args("server --api-key-file /k"), &env),
            Some(ApiKeySource::File("/k".into()))
        );
        let value = |name: &str| (name == "LMCACHE_HTTP_API_KEY").then(|| "v".to_string());
        let found = source(&args("server"), &value).unwrap();
        assert_eq!(found, ApiKeySource::Variable("LMCACHE_HTTP_API_KEY"));
        assert_eq!(found.read(&value).unwrap().bearer(), "Bearer v");
        assert!(matches!(
            found.read(&|_| Some(String::new())),
            Err(ApiKeyError::Variable { .. })
        ));
    }

    #[test]
    fn the_keys_a_server_would_read_are_checked_before_anything_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let none = |_: &str| None;
        let good = dir.path().join("good");
        std::fs::write(&good, "k3y\n").unwrap();
        assert_eq!(check_sources(Some(&good), &[], &none), Ok(()));
        // Not made yet, under a directory or a place for one: the launch makes it.
        let later = dir.path().join("keys/node.key");
        assert_eq!(check_sources(Some(&later), &[], &none), Ok(()));
        assert!(!later.exists());
        let e = check_sources(Some(dir.path()), &[], &none).unwrap_err();
        assert!(e.to_string().contains("is not a regular file"), "{e}");
        let under_a_file = good.join("node.key");
        let e = check_sources(Some(&under_a_file), &[], &none).unwrap_err();
        assert!(e.to_string().contains("is not a directory"), "{e}");
        let missing = dir.path().join("missing");
        let lookup =
            |name: &str| (name == "LMCACHE_API_KEY_FILE").then(|| missing.display().to_string());
        let e = check_sources(Some(&good), &[], &lookup).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        let lookup = |name: &str| (name == "LMCACHE_API_KEY").then(|| "two words".to_string());
        let e = check_sources(None, &[], &lookup).unwrap_err();
        assert!(e.to_string().contains("LMCACHE_API_KEY"), "{e}");
        // Every file the operator's extra arguments name, in both spellings.
        let second = format!("--http-api-key-file={}", dir.path().display());
        let extra = args(&format!("--api-key-file {} {second}", good.display()));
        let e = check_sources(None, &extra, &none).unwrap_err();
        assert!(e.to_string().contains("is not a regular file"), "{e}");
    }

    #[test]
    fn a_missing_file_is_created_private_and_an_existing_one_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/server.key");
        assert!(ensure_file(&path).unwrap());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        let key = ApiKeySource::File(path.clone()).read(&|_| None).unwrap();
        assert_eq!(key.bearer().len(), "Bearer ".len() + 64);
        assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
        assert!(!ensure_file(&path).unwrap());
        let again = ApiKeySource::File(path.clone()).read(&|_| None).unwrap();
        assert_eq!(again, key, "an existing key is kept");
    }

    #[test]
    fn key_files_of_every_bad_shape_are_named_without_their_contents() {
        let dir = tempfile::tempdir().unwrap();
        let huge = "k".repeat(5000);
        for (name, text, says) in [
            ("empty", "", "is empty"),
            ("blank", " \n\n", "is empty"),
            ("two", "secret-one\nsecret-two\n", "holds 2 lines"),
            ("cr", "secret\rtwo\n", "0x0d, at byte 6"),
            ("formfeed", "secret\x0ctwo", "0x0c"),
            ("space", "secret two", "0x20"),
            ("accent", "secr\u{e9}t", "0xc3"),
            ("huge", huge.as_str(), "more than 4096 bytes"),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            let e = ensure_file(&path).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains(name), "{e}");
            assert!(!e.contains("secret"), "{e}");
        }
        let latin1 = dir.path().join("latin1");
        std::fs::write(&latin1, b"secr\xe9t\n").unwrap();
        let e = ensure_file(&latin1).unwrap_err().to_string();
        assert!(e.contains("printable ASCII") && !e.contains("secr"), "{e}");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = ensure_file(&fifo).unwrap_err().to_string();
        assert!(
            e.contains("is not a regular file"),
            "a FIFO is refused, not waited on: {e}"
        );
        let e = ensure_file(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("is not a regular file") || e.contains("cannot be read"),
            "{e}"
        );
        let missing = dir.path().join("made-only-for-0.5.7");
        assert_eq!(for_client(Some(&missing), &|_| None).unwrap(), None);
        let padded = dir.path().join("padded");
        std::fs::write(&padded, "  key \n").unwrap();
        let key = ApiKeySource::File(padded).read(&|_| None).unwrap();
        assert_eq!(key.bearer(), "Bearer key");
        let missing = ApiKeySource::File(dir.path().join("none")).read(&|_| None);
        assert!(missing.unwrap_err().to_string().contains("cannot be read"));
    }

    #[test]
    fn a_key_file_open_to_other_users_is_said_each_way() {
        let me = 1000;
        assert!(exposures(0o100600, me, me).is_empty());
        assert!(exposures(0o600, 0, me).is_empty());
        let read = exposures(0o644, me, me);
        assert_eq!(read.len(), 1);
        assert!(read[0].starts_with("has mode 0644") && read[0].ends_with("chmod 600 it"));
        let owned = exposures(0o600, 1001, me);
        assert_eq!(owned.len(), 1);
        assert!(owned[0].contains("owned by uid 1001, not by this user (uid 1000)"));
        assert_eq!(exposures(0o660, 1001, me).len(), 2);
    }
}
