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
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
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
    /// The variable holds no key.
    #[error("{0} is empty: LMCache would ignore it; set it to the key or unset it")]
    EmptyVariable(&'static str),
}

/// The first key source of a server started with `args` in an environment
/// read by `lookup`, in LMCache's order; `None` when the server has no key.
/// `--api-key-file=PATH` and `--api-key-file PATH` are both read.
pub fn source(args: &[String], lookup: &dyn Fn(&str) -> Option<String>) -> Option<ApiKeySource> {
    let flag = args.iter().enumerate().find_map(|(i, arg)| {
        FLAGS.iter().find_map(|flag| match arg.strip_prefix(flag) {
            Some("") => args.get(i + 1).cloned(),
            Some(value) => value.strip_prefix('=').map(str::to_string),
            None => None,
        })
    });
    if let Some(path) = flag {
        return Some(ApiKeySource::File(PathBuf::from(path)));
    }
    VARIABLES.iter().find_map(|&(name, file)| {
        let value = lookup(name).filter(|v| !v.is_empty())?;
        Some(match file {
            true => ApiKeySource::File(PathBuf::from(value)),
            false => ApiKeySource::Variable(name),
        })
    })
}

/// The key a client of the node's server sends (`inspect`): the node's
/// `EREBINE_AGENT_LMCACHE_API_KEY_FILE` (`node_file`), else LMCache's own
/// variables in the client's environment (`lookup`), as the server would
/// read them; `None` when none is set. The file is only read, never made.
///
/// Errors: as [`ApiKeySource::read`].
pub fn for_client(
    node_file: Option<&Path>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<ApiKey>, ApiKeyError> {
    let source = match node_file {
        Some(file) => Some(ApiKeySource::File(file.to_path_buf())),
        None => source(&[], lookup),
    };
    source.map(|s| s.read(lookup)).transpose()
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
            ApiKeySource::Variable(name) => lookup(name)
                .filter(|v| !v.is_empty())
                .map(ApiKey)
                .ok_or(ApiKeyError::EmptyVariable(name)),
        }
    }
}

fn read_file(path: &Path) -> Result<ApiKey, ApiKeyError> {
    let problem = |detail: String| ApiKeyError::File {
        path: path.to_path_buf(),
        detail,
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        problem(format!(
            "cannot be read ({e}); give this user read access, or name another file"
        ))
    })?;
    let key = text.trim();
    match key.lines().count() {
        0 => Err(problem(
            "is empty; write one key on one line, or remove the file to have the launch create one"
                .into(),
        )),
        1 => Ok(ApiKey(key.to_string())),
        n => Err(problem(format!(
            "holds {n} lines; LMCache takes one key on one line"
        ))),
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
            Err(ApiKeyError::EmptyVariable(_))
        ));
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
        for (name, text, says) in [
            ("empty", "", "is empty"),
            ("blank", " \n\n", "is empty"),
            ("two", "secret-one\nsecret-two\n", "holds 2 lines"),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            let e = ensure_file(&path).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains(name), "{e}");
            assert!(!e.contains("secret"), "{e}");
        }
        let padded = dir.path().join("padded");
        std::fs::write(&padded, "  key \n").unwrap();
        let key = ApiKeySource::File(padded).read(&|_| None).unwrap();
        assert_eq!(key.bearer(), "Bearer key");
        let missing = ApiKeySource::File(dir.path().join("none")).read(&|_| None);
        assert!(missing.unwrap_err().to_string().contains("cannot be read"));
    }
}
