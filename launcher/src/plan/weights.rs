//! The weights behind the engine's `--model`, measured once with the facts
//! (`docs/configuration.md`, "The cache identity"): what the KV of a prefix
//! is computed from, fingerprinted without reading any weight data.
//!
//! - A path that exists where the launch runs (a directory, or one file
//!   such as a GGUF) is what vLLM loads (it takes `--model` as a local path
//!   when `os.path.exists` finds it): its `.json` files by content (the
//!   `config.json` with its RoPE scaling, the safetensors index, the
//!   quantization configs) and its weight and code files by name, size and
//!   modification time, or by the content address a Hugging Face snapshot's
//!   links carry (their target's file name is the blob's hash, the same on
//!   every node) or a `--local-dir` download records (its etag, while the
//!   file is as downloaded).
//! - A hub id is the commit its revision (`--revision`, else `main`)
//!   resolves to in the Hugging Face cache (`--download-dir`, else
//!   `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `HF_HOME/hub`,
//!   `XDG_CACHE_HOME/huggingface/hub`, `~/.cache/huggingface/hub`, as
//!   `huggingface_hub` reads them); a `--revision` that is a commit is that
//!   commit.
//! - What the node agent knows ([`Source::given`]) is taken as given.
//!
//! What cannot be seen (no such path, a hub id not downloaded yet, a
//! directory the launch may not read) is [`Weights::Unseen`]: a warning
//! that names what is unprotected, never an error.

use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::node::env::{text_var, Vars};

/// The largest `.json` file of a model directory read by content, in bytes;
/// a larger one (a tokenizer's vocabulary) counts by name, size and
/// modification time.
pub const JSON_MAX_BYTES: u64 = 4 << 20;

/// The file name endings of a model directory that count: configuration
/// (by content), weights in every format vLLM loads, and remote code.
pub const COUNTED_SUFFIXES: &[&str] = &[
    ".json",
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".gguf",
    ".ckpt",
    ".h5",
    ".msgpack",
    ".npz",
    ".py",
];

/// Where the engine's weights come from: its flags, as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source<'a> {
    /// vLLM's `--model`: a path, or a hub id.
    pub model: &'a str,
    /// vLLM's `--revision` of a hub id; `None`: `main`.
    pub revision: Option<&'a str>,
    /// vLLM's `--download-dir`, the Hugging Face cache it uses.
    pub download_dir: Option<&'a str>,
    /// The node agent's own fingerprint, taken instead of measuring.
    pub given: Option<&'a str>,
}

/// What the launch knows of the weights behind `--model`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum Weights {
    /// The node agent's own fingerprint, taken as given.
    Given {
        /// The fingerprint.
        fingerprint: String,
    },
    /// A hub id resolved to a commit in the Hugging Face cache.
    HubCommit {
        /// The hub id (`org/name`).
        repo_id: String,
        /// The revision resolved (`--revision`, else `main`).
        revision: String,
        /// The commit, 40 lowercase hex digits.
        commit: String,
        /// The cache directory looked in.
        cache_dir: PathBuf,
        /// Whether the engine loads exactly this commit: the revision is
        /// the commit itself, or the engine runs offline (the first of
        /// `HF_HUB_OFFLINE` and `TRANSFORMERS_OFFLINE` that is set is `1`,
        /// `ON`, `YES` or `TRUE`, as `huggingface_hub` reads them), so it
        /// cannot resolve a newer one.
        pinned: bool,
    },
    /// A local directory or file, fingerprinted by its files.
    Files {
        /// The path as `--model` gave it.
        path: PathBuf,
        /// The files counted.
        files: u32,
        /// Their sizes together, in bytes.
        bytes: u64,
        /// blake3 of their description, the first 32 hex digits.
        digest: String,
    },
    /// The weights could not be seen where the launch runs.
    Unseen {
        /// What was looked for, and why it was not found.
        problem: String,
    },
}

impl Weights {
    /// The fingerprint the cache identity records
    /// ([`lmcache_housekeeping::LaunchIdentity::weights`]): `commit <40
    /// hex>`, `files <32 hex>` or the given one; `None` when unseen.
    pub fn fingerprint(&self) -> Option<String> {
        match self {
            Weights::Given { fingerprint } => Some(fingerprint.clone()),
            Weights::HubCommit { commit, .. } => Some(format!("commit {commit}")),
            Weights::Files { digest, .. } => Some(format!("files {digest}")),
            Weights::Unseen { .. } => None,
        }
    }

    /// The commit the engine must load for the cache to be what it
    /// computes: that of a hub id the engine could resolve otherwise (not
    /// [`Weights::HubCommit::pinned`]). The node agent passes it to the
    /// engine as `--revision`.
    pub fn revision_to_pin(&self) -> Option<&str> {
        match self {
            Weights::HubCommit {
                commit,
                pinned: false,
                ..
            } => Some(commit),
            _ => None,
        }
    }

    /// The plan's warning, if any: weights not seen (what is unprotected),
    /// or a hub id whose revision the engine may resolve to a newer commit
    /// than the launch found.
    pub fn warning(&self, model: &str) -> Option<String> {
        match self {
            Weights::Unseen { problem } => Some(format!(
                "the cache identity does not cover the weights of --model {model:?}: {problem}. Tiers that outlive the server keep their objects if other weights are put under the same --model; give the launch a path it can read, or the engine's --revision as a commit (docs/configuration.md, \"The cache identity\")"
            )),
            Weights::HubCommit {
                repo_id,
                revision,
                commit,
                pinned: false,
                ..
            } => Some(format!(
                "--model {repo_id:?} is at commit {commit} in the Hugging Face cache, but the engine resolves the revision {revision:?} itself when it starts and may load a newer commit than the cache was written for: give the engine and the launch --revision {commit}, or run the engine with HF_HUB_OFFLINE=1 (docs/configuration.md, \"The cache identity\")"
            )),
            _ => None,
        }
    }
}

/// Measures the weights `source` names ([`Weights`]); `vars` give the
/// Hugging Face cache's variables. Never fails: what cannot be read is
/// [`Weights::Unseen`].
pub fn measure(source: Source<'_>, vars: &Vars) -> Weights {
    if let Some(fingerprint) = source.given {
        return Weights::Given {
            fingerprint: fingerprint.to_string(),
        };
    }
    let path = Path::new(source.model);
    match fs::metadata(path) {
        Ok(_) => files(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match hub_id(source.model) {
                true => hub_commit(source, vars),
                false => Weights::Unseen {
                    problem: format!(
                        "{} does not exist where the launch runs (another mount namespace or container?) and is not a hub id",
                        path.display()
                    ),
                },
            }
        }
        Err(e) => Weights::Unseen {
            problem: format!("cannot read {}: {e}", path.display()),
        },
    }
}

/// Whether `model` can be a Hugging Face hub id: `name` or `org/name`, each
/// of `A-Z a-z 0-9 _ . -`, neither `--` nor `..`, not starting or ending
/// with `-` or `.` (`huggingface_hub`'s `validate_repo_id`).
pub fn hub_id(model: &str) -> bool {
    let parts: Vec<&str> = model.split('/').collect();
    let part_ok = |part: &&str| {
        !part.is_empty()
            && part.len() <= 96
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
            && !part.starts_with(['-', '.'])
            && !part.ends_with(['-', '.'])
    };
    parts.len() <= 2 && parts.iter().all(part_ok) && !model.contains("--") && !model.contains("..")
}

/// The Hugging Face cache the engine reads: `--download-dir`, else the
/// variables `huggingface_hub` reads, in its order.
pub fn hub_cache_dir(source: Source<'_>, vars: &Vars) -> PathBuf {
    let var = |name: &str| text_var(vars, name).filter(|v| !v.is_empty());
    if let Some(dir) = source.download_dir {
        return PathBuf::from(dir);
    }
    if let Some(dir) = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
        return PathBuf::from(dir);
    }
    if let Some(home) = var("HF_HOME") {
        return Path::new(&home).join("hub");
    }
    let cache = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(&var("HOME").unwrap_or_default()).join(".cache"));
    cache.join("huggingface").join("hub")
}

/// Whether `text` is a full git commit: 40 hex digits.
fn commit_like(text: &str) -> bool {
    text.len() == 40 && text.chars().all(|c| c.is_ascii_hexdigit())
}

/// The commit `source`'s revision of its hub id resolves to in the cache.
fn hub_commit(source: Source<'_>, vars: &Vars) -> Weights {
    let cache_dir = hub_cache_dir(source, vars);
    let revision = source.revision.unwrap_or("main").to_string();
    // `HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE`: the first that is set
    // and not empty decides.
    let offline = ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"]
        .iter()
        .find_map(|name| text_var(vars, name).filter(|v| !v.is_empty()))
        .is_some_and(|v| ["1", "ON", "YES", "TRUE"].contains(&&*v.to_ascii_uppercase()));
    let found = |commit: String| Weights::HubCommit {
        repo_id: source.model.to_string(),
        revision: revision.clone(),
        pinned: offline || commit_like(&revision),
        commit,
        cache_dir: cache_dir.clone(),
    };
    if commit_like(&revision) {
        return found(revision.to_ascii_lowercase());
    }
    let repo = cache_dir.join(format!("models--{}", source.model.replace('/', "--")));
    let unseen = |what: String| {
        Weights::Unseen {
        problem: format!(
            "the hub id's revision {revision:?} is {what} in the Hugging Face cache {}, so the engine downloads it when it starts, after the launch",
            cache_dir.display()
        ),
    }
    };
    if revision
        .split('/')
        .any(|part| part.is_empty() || part == "..")
    {
        return unseen("not a revision name that can be looked up".into());
    }
    let reference = repo.join("refs").join(&revision);
    match read_small(&reference, 256) {
        Ok(text) if commit_like(text.trim()) => found(text.trim().to_ascii_lowercase()),
        Ok(_) => unseen(format!(
            "not a commit ({} holds something else)",
            reference.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => unseen("not".into()),
        Err(e) => unseen(format!("unreadable ({}: {e})", reference.display())),
    }
}

/// Reads the text file `path`, at most `max` bytes.
fn read_small(path: &Path, max: u64) -> std::io::Result<String> {
    String::from_utf8(read_regular(path, max)?)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// The bytes of the regular file `path`, refused past `max`: opened
/// without blocking (a FIFO or a device put there is refused, never waited
/// on) and checked to be a regular file once open.
fn read_regular(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    match bytes.len() as u64 > max {
        true => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        )),
        false => Ok(bytes),
    }
}

/// The fingerprint of the directory or file `path` (the module docs say
/// what counts).
fn files(path: &Path) -> Weights {
    match describe(path) {
        Ok((files, bytes, text)) if files > 0 => Weights::Files {
            path: path.to_path_buf(),
            files,
            bytes,
            digest: blake3::hash(text.as_bytes()).to_hex()[..32].to_string(),
        },
        Ok(_) => Weights::Unseen {
            problem: format!(
                "{} holds no configuration and no weight file ({})",
                path.display(),
                COUNTED_SUFFIXES.join(" ")
            ),
        },
        Err(problem) => Weights::Unseen { problem },
    }
}

/// The files of `path` that count, in name order: their number, bytes and
/// description (a line each).
fn describe(path: &Path) -> Result<(u32, u64, String), String> {
    let unreadable = |at: &Path, e: std::io::Error| format!("cannot read {}: {e}", at.display());
    let meta = fs::metadata(path).map_err(|e| unreadable(path, e))?;
    let mut entries: Vec<(String, PathBuf)> = match meta.is_dir() {
        false => vec![(file_name(path), path.to_path_buf())],
        true => fs::read_dir(path)
            .map_err(|e| unreadable(path, e))?
            .map(|entry| {
                let entry = entry.map_err(|e| unreadable(path, e))?;
                Ok((file_name(&entry.path()), entry.path()))
            })
            .collect::<Result<_, String>>()?,
    };
    entries.sort();
    let (mut files, mut bytes, mut text) = (0u32, 0u64, String::new());
    for (name, entry) in entries {
        if name.starts_with('.') || !COUNTED_SUFFIXES.iter().any(|s| name.ends_with(s)) {
            continue;
        }
        let meta = fs::metadata(&entry).map_err(|e| unreadable(&entry, e))?;
        if !meta.is_file() {
            continue;
        }
        text.push_str(&describe_file(&name, &entry, &meta).map_err(|e| unreadable(&entry, e))?);
        files += 1;
        bytes = bytes.saturating_add(meta.len());
    }
    Ok((files, bytes, text))
}

/// One file's line: a small `.json` by its content's hash, a link to a
/// content-addressed blob by the blob's name, any other by size and
/// modification time (nanoseconds).
fn describe_file(name: &str, path: &Path, meta: &fs::Metadata) -> std::io::Result<String> {
    let size = meta.len();
    if name.ends_with(".json") && size <= JSON_MAX_BYTES {
        let content = read_regular(path, JSON_MAX_BYTES)?;
        return Ok(format!("json {name:?} {}\n", blake3::hash(&content)));
    }
    if let Some(blob) = blob_name(path) {
        return Ok(format!("blob {name:?} {size} {blob}\n"));
    }
    if let Some(etag) = downloaded_etag(path, name, meta) {
        return Ok(format!("blob {name:?} {size} {etag}\n"));
    }
    Ok(format!(
        "file {name:?} {size} {}.{:09}\n",
        meta.mtime(),
        meta.mtime_nsec()
    ))
}

/// The etag `huggingface_hub` recorded for the file `name` of a directory
/// it downloaded into (`--local-dir`: `.cache/huggingface/download/<name>.metadata`,
/// three lines: commit, etag, download time in seconds), while the file
/// is as downloaded (its modification time at most a second past that
/// time, the rule `huggingface_hub` keeps the record by): the content's
/// address, the same on every node that downloaded the same file.
fn downloaded_etag(path: &Path, name: &str, meta: &fs::Metadata) -> Option<String> {
    let record = path
        .parent()?
        .join(".cache/huggingface/download")
        .join(format!("{name}.metadata"));
    let text = read_small(&record, 4096).ok()?;
    let mut lines = text.lines().map(str::trim);
    let (_commit, etag, at) = (lines.next()?, lines.next()?, lines.next()?);
    let at: f64 = at.parse().ok()?;
    let modified = meta.mtime() as f64 + f64::from(meta.mtime_nsec() as u32) / 1e9;
    let sane = !etag.is_empty() && etag.len() <= 128 && !etag.contains(char::is_whitespace);
    (sane && modified - 1.0 <= at).then(|| etag.to_string())
}

/// The target's file name of a link to a content-addressed blob (a
/// Hugging Face snapshot's `../../blobs/<sha256 or git sha1>`).
fn blob_name(path: &Path) -> Option<String> {
    let target = fs::read_link(path).ok()?;
    let name = target.file_name()?.to_str()?;
    let hex = name.chars().all(|c| c.is_ascii_hexdigit());
    (hex && (name.len() == 40 || name.len() == 64)).then(|| name.to_string())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Each kind of weights the launch meets, replayed in a scratch directory:
/// real files, links and Hugging Face cache trees laid out as
/// `huggingface_hub` writes them (`models--<org>--<name>/refs/<revision>`,
/// `snapshots/<commit>/<file>` linked to `blobs/<hash>`).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::env::text_vars;
    use std::time::{Duration, SystemTime};

    const COMMIT_A: &str = "1111111111111111111111111111111111111111";
    const COMMIT_B: &str = "2222222222222222222222222222222222222222";

    fn source(model: &str) -> Source<'_> {
        Source {
            model,
            revision: None,
            download_dir: None,
            given: None,
        }
    }

    fn measured(model: &Path) -> Weights {
        measure(source(model.to_str().unwrap()), &Vars::new())
    }

    fn fingerprint(model: &Path) -> String {
        measured(model)
            .fingerprint()
            .unwrap_or_else(|| panic!("{model:?}: {:?}", measured(model)))
    }

    /// A model directory of `shards` weight files of `size` bytes (sparse)
    /// and a `config.json`, each file dated `mtime`.
    fn model_dir(root: &Path, shards: u32, size: u64) -> PathBuf {
        let dir = root.join("model");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("config.json"), r#"{"rope_scaling":null}"#).unwrap();
        fs::write(dir.join("README.md"), "notes").unwrap();
        for i in 1..=shards {
            let shard = dir.join(format!("model-{i:05}-of-{shards:05}.safetensors"));
            fs::File::create(&shard).unwrap().set_len(size).unwrap();
            set_mtime(&shard, 1_700_000_000);
        }
        dir
    }

    fn set_mtime(path: &Path, secs: u64) {
        let file = fs::OpenOptions::new().write(true).open(path).unwrap();
        file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
            .unwrap();
    }

    /// A Hugging Face cache with `org/name` at the given refs.
    fn hub_cache(root: &Path, refs: &[(&str, &str)]) -> PathBuf {
        let repo = root.join("hub").join("models--org--name");
        fs::create_dir_all(repo.join("refs")).unwrap();
        for (revision, commit) in refs {
            fs::write(repo.join("refs").join(revision), commit).unwrap();
        }
        root.join("hub")
    }

    #[test]
    fn a_hub_id_is_the_commit_its_revision_resolves_to_in_the_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let hub = hub_cache(tmp.path(), &[("main", COMMIT_A), ("v2", COMMIT_B)]);
        let vars = text_vars([("HF_HUB_CACHE", hub.to_str().unwrap())]);
        let main = measure(source("org/name"), &vars);
        let v2 = measure(
            Source {
                revision: Some("v2"),
                ..source("org/name")
            },
            &vars,
        );
        assert_eq!(main.fingerprint(), Some(format!("commit {COMMIT_A}")));
        assert_eq!(v2.fingerprint(), Some(format!("commit {COMMIT_B}")));
        fs::write(hub.join("models--org--name/refs/main"), COMMIT_B).unwrap();
        assert_eq!(
            measure(source("org/name"), &vars).fingerprint(),
            v2.fingerprint(),
            "main moved to v2's commit"
        );
        for (name, value) in [
            ("HF_HOME", tmp.path().to_str().unwrap()),
            ("HUGGINGFACE_HUB_CACHE", hub.to_str().unwrap()),
        ] {
            let found = measure(source("org/name"), &text_vars([(name, value)]));
            assert_eq!(found.fingerprint(), v2.fingerprint(), "{name}");
        }
        let download_dir = Source {
            download_dir: hub.to_str(),
            ..source("org/name")
        };
        assert_eq!(
            measure(download_dir, &text_vars([("HF_HUB_CACHE", "/nonexistent")])).fingerprint(),
            v2.fingerprint(),
            "--download-dir wins over the variables"
        );
    }

    #[test]
    fn a_revision_left_to_the_engine_is_warned_of_and_a_commit_is_pinned() {
        let tmp = tempfile::tempdir().unwrap();
        let hub = hub_cache(tmp.path(), &[("main", COMMIT_A)]);
        let hub = hub.to_str().unwrap();
        let unpinned = measure(source("org/name"), &text_vars([("HF_HUB_CACHE", hub)]));
        assert_eq!(unpinned.revision_to_pin(), Some(COMMIT_A));
        let warning = unpinned.warning("org/name").unwrap();
        assert!(
            warning.contains(&format!("--revision {COMMIT_A}")),
            "{warning}"
        );
        for offline in ["1", "ON", "yes", "True"] {
            let vars = text_vars([("HF_HUB_CACHE", hub), ("HF_HUB_OFFLINE", offline)]);
            let pinned = measure(source("org/name"), &vars);
            assert_eq!(
                (pinned.revision_to_pin(), pinned.warning("org/name")),
                (None, None)
            );
        }
        let vars = text_vars([("HF_HUB_CACHE", hub), ("HF_HUB_OFFLINE", "0")]);
        assert!(measure(source("org/name"), &vars)
            .revision_to_pin()
            .is_some());
        // A commit needs no cache at all: it is what the engine loads.
        let commit = Source {
            revision: Some(COMMIT_B),
            ..source("org/never-downloaded")
        };
        let pinned = measure(commit, &Vars::new());
        assert_eq!(pinned.fingerprint(), Some(format!("commit {COMMIT_B}")));
        assert_eq!(pinned.warning("org/never-downloaded"), None);
    }

    /// Two nodes that each downloaded the same files with `--local-dir`
    /// (other modification times, the same etags) share a fingerprint; a
    /// file changed after its download counts by its modification time.
    #[test]
    fn local_dir_downloads_are_fingerprinted_by_the_etags_huggingface_hub_recorded() {
        let node = |root: &Path, mtime: u64| {
            let dir = model_dir(root, 1, 4096);
            let shard = dir.join("model-00001-of-00001.safetensors");
            set_mtime(&shard, mtime);
            let records = dir.join(".cache/huggingface/download");
            fs::create_dir_all(&records).unwrap();
            fs::write(
                records.join("model-00001-of-00001.safetensors.metadata"),
                format!("{COMMIT_A}\n{}\n{}.5\n", "e".repeat(64), mtime),
            )
            .unwrap();
            (dir, shard)
        };
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (on_a, _) = node(a.path(), 1_700_000_000);
        let (on_b, shard_b) = node(b.path(), 1_800_000_000);
        assert_eq!(fingerprint(&on_a), fingerprint(&on_b));
        set_mtime(&shard_b, 1_800_000_100);
        assert_ne!(
            fingerprint(&on_a),
            fingerprint(&on_b),
            "rewritten after download"
        );
    }

    /// A FIFO where a ref or a config should be is refused at once, never
    /// waited on; the directory's FIFO is no weight file.
    #[test]
    fn a_fifo_in_the_cache_or_the_model_is_never_waited_on() {
        let tmp = tempfile::tempdir().unwrap();
        let hub = hub_cache(tmp.path(), &[]);
        let fifo = |path: &Path| nix::unistd::mkfifo(path, nix::sys::stat::Mode::S_IRWXU).unwrap();
        fifo(&hub.join("models--org--name/refs/main"));
        let vars = text_vars([("HF_HUB_CACHE", hub.to_str().unwrap())]);
        let weights = measure(source("org/name"), &vars);
        assert!(
            matches!(&weights, Weights::Unseen { problem } if problem.contains("not a regular file")),
            "{weights:?}"
        );
        let dir = model_dir(tmp.path(), 1, 4096);
        let before = fingerprint(&dir);
        fifo(&dir.join("extra.json"));
        assert_eq!(fingerprint(&dir), before);
    }

    #[test]
    fn the_first_offline_variable_set_decides_as_huggingface_hub_reads_them() {
        let tmp = tempfile::tempdir().unwrap();
        let hub = hub_cache(tmp.path(), &[("main", COMMIT_A)]);
        let hub = hub.to_str().unwrap();
        for (hf, transformers, pinned) in [
            ("", "1", true),
            ("0", "1", false),
            ("1", "0", true),
            ("", "", false),
        ] {
            let vars = text_vars([
                ("HF_HUB_CACHE", hub),
                ("HF_HUB_OFFLINE", hf),
                ("TRANSFORMERS_OFFLINE", transformers),
            ]);
            let weights = measure(source("org/name"), &vars);
            assert_eq!(
                weights.revision_to_pin().is_none(),
                pinned,
                "{hf:?} {transformers:?}"
            );
        }
    }

    #[test]
    fn a_hub_id_not_downloaded_yet_is_unseen_and_says_where_it_looked() {
        let tmp = tempfile::tempdir().unwrap();
        let hub = hub_cache(tmp.path(), &[("main", "not a commit")]);
        let vars = text_vars([("HF_HUB_CACHE", hub.to_str().unwrap())]);
        for (model, revision, expected) in [
            ("org/other", None, "is not in the Hugging Face cache"),
            ("org/name", None, "is not a commit"),
            ("org/name", Some("../main"), "not a revision name"),
        ] {
            let weights = measure(
                Source {
                    revision,
                    ..source(model)
                },
                &vars,
            );
            let Weights::Unseen { problem } = &weights else {
                panic!("{model}: {weights:?}");
            };
            assert!(problem.contains(expected), "{problem}");
            assert!(problem.contains(hub.to_str().unwrap()), "{problem}");
            assert!(weights.warning(model).unwrap().contains(model));
        }
    }

    #[test]
    fn a_shard_rewritten_with_the_same_size_changes_the_fingerprint() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = model_dir(tmp.path(), 3, 1 << 20);
        let before = fingerprint(&dir);
        assert_eq!(fingerprint(&dir), before, "measuring twice agrees");
        let shard = dir.join("model-00002-of-00003.safetensors");
        fs::write(&shard, vec![7u8; 1 << 20]).unwrap();
        set_mtime(&shard, 1_700_000_001);
        assert_ne!(fingerprint(&dir), before);
        set_mtime(&shard, 1_700_000_000);
        assert_eq!(
            fingerprint(&dir),
            before,
            "name, size and mtime are what is read: no weight data"
        );
        fs::write(dir.join("README.md"), "other notes").unwrap();
        assert_eq!(fingerprint(&dir), before, "a README is not the model");
        let Weights::Files { files, bytes, .. } = measured(&dir) else {
            panic!()
        };
        assert_eq!((files, bytes), (4, 3 * (1 << 20) + 21));
    }

    #[test]
    fn a_config_changed_only_in_its_rope_scaling_changes_the_fingerprint() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = model_dir(tmp.path(), 1, 4096);
        let before = fingerprint(&dir);
        fs::write(
            dir.join("config.json"),
            r#"{"rope_scaling":{"rope_type":"yarn","factor":4.0}}"#,
        )
        .unwrap();
        assert_ne!(fingerprint(&dir), before);
    }

    #[test]
    fn a_gguf_file_is_fingerprinted_by_itself() {
        let tmp = tempfile::tempdir().unwrap();
        let gguf = tmp.path().join("model-Q4_K_M.gguf");
        fs::File::create(&gguf).unwrap().set_len(5 << 30).unwrap();
        set_mtime(&gguf, 1_700_000_000);
        let Weights::Files { files, bytes, .. } = measured(&gguf) else {
            panic!("{:?}", measured(&gguf))
        };
        assert_eq!((files, bytes), (1, 5 << 30));
        let before = fingerprint(&gguf);
        set_mtime(&gguf, 1_700_000_002);
        assert_ne!(fingerprint(&gguf), before);
    }

    /// A snapshot whose files link to content-addressed blobs is the same
    /// fingerprint on every node that holds the same blobs, whatever their
    /// dates; a new blob behind a name changes it.
    #[test]
    fn a_symlinked_snapshot_is_fingerprinted_by_its_blobs() {
        let snapshot = |root: &Path, blob: &str, mtime: u64| {
            let repo = root.join("models--org--name");
            let snap = repo.join("snapshots").join(COMMIT_A);
            fs::create_dir_all(&snap).unwrap();
            fs::create_dir_all(repo.join("blobs")).unwrap();
            let blob_path = repo.join("blobs").join(blob);
            fs::File::create(&blob_path)
                .unwrap()
                .set_len(1 << 20)
                .unwrap();
            set_mtime(&blob_path, mtime);
            let link = snap.join("model.safetensors");
            let _ = fs::remove_file(&link);
            std::os::unix::fs::symlink(format!("../../blobs/{blob}"), &link).unwrap();
            snap
        };
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let blob = "a".repeat(64);
        let on_a = snapshot(a.path(), &blob, 1_700_000_000);
        let on_b = snapshot(b.path(), &blob, 1_800_000_000);
        assert_eq!(fingerprint(&on_a), fingerprint(&on_b));
        let other = snapshot(b.path(), &"b".repeat(64), 1_800_000_000);
        assert_ne!(fingerprint(&other), fingerprint(&on_a));
        // The snapshot directory itself through a link is the same model.
        let linked = a.path().join("current");
        std::os::unix::fs::symlink(&on_a, &linked).unwrap();
        assert_eq!(fingerprint(&linked), fingerprint(&on_a));
    }

    /// What the launch cannot read is a warning naming it, never an error:
    /// a link loop as the model, a shard that is a link loop, and (where
    /// the test does not run as root, who reads everything) a directory
    /// without read permission.
    #[test]
    fn unreadable_weights_are_unseen_with_the_path_named() {
        let tmp = tempfile::tempdir().unwrap();
        let looped = tmp.path().join("loop");
        std::os::unix::fs::symlink(&looped, &looped).unwrap();
        let dir = model_dir(tmp.path(), 1, 4096);
        let bad_shard = dir.join("model-00002-of-00002.safetensors");
        std::os::unix::fs::symlink(&bad_shard, &bad_shard).unwrap();
        let mut cases = vec![looped, dir];
        if !nix::unistd::geteuid().is_root() {
            let closed = model_dir(&tmp.path().join("closed"), 1, 4096);
            fs::set_permissions(&closed, std::os::unix::fs::PermissionsExt::from_mode(0o000))
                .unwrap();
            cases.push(closed);
        }
        for path in cases {
            let weights = measured(&path);
            let Weights::Unseen { problem } = &weights else {
                panic!("{path:?}: {weights:?}");
            };
            assert!(problem.starts_with("cannot read "), "{problem}");
            assert_eq!(weights.fingerprint(), None);
        }
    }

    #[test]
    fn a_model_path_that_does_not_exist_here_is_unseen() {
        for model in [
            "/models/Qwen3-8B",
            "./model",
            "../m",
            "org/name/extra",
            "a--b",
        ] {
            let weights = measure(source(model), &Vars::new());
            let Weights::Unseen { problem } = &weights else {
                panic!("{model}: {weights:?}");
            };
            assert!(
                problem.contains("does not exist where the launch runs"),
                "{problem}"
            );
        }
        let empty = tempfile::tempdir().unwrap();
        let weights = measured(empty.path());
        assert!(
            matches!(&weights, Weights::Unseen { problem } if problem.contains("holds no configuration")),
            "{weights:?}"
        );
    }

    #[test]
    fn the_agents_fingerprint_is_taken_as_given() {
        let given = Source {
            given: Some("release 2026-12-01"),
            ..source("/not/here")
        };
        let weights = measure(given, &Vars::new());
        assert_eq!(weights.fingerprint().as_deref(), Some("release 2026-12-01"));
        assert_eq!(weights.warning("/not/here"), None);
    }

    #[test]
    fn hub_ids_are_told_from_paths_as_huggingface_hub_does() {
        for id in [
            "gpt2",
            "org/name",
            "Qwen/Qwen3-8B",
            "a.b/c_d-e",
            "test-model",
        ] {
            assert!(hub_id(id), "{id}");
        }
        for not in [
            "", "/abs", "a/b/c", "a--b", "a..b", "-a", "a.", "org/", "a b", "é",
        ] {
            assert!(!hub_id(not), "{not}");
        }
    }
}
