//! The bucket bound's node id, kept across restarts of one boot
//! (`docs/s3-gateway.md`, "The election", "Node ids"): a gateway that a
//! crash or `kill -9` ended, started again on the same machine, comes back
//! with the id it had, so it takes its own lease back at once instead of
//! waiting for it to lapse (the lease and a follow period: 40 s).
//!
//! The id is kept in a file of the launch's state directory (the disk
//! tier's directory, which the launch holds under its lock), one per
//! bucket and prefix, held with an exclusive `flock` for as long as the
//! gateway runs. So no two processes of one machine ever share an id: a
//! second gateway on the same prefix, or a frozen one that still holds the
//! file, leaves the newcomer a fresh id. The file names the machine's boot
//! (`/proc/sys/kernel/random/boot_id`) and host name; an id written under
//! another boot or host (a volume copied to another machine, a reboot) is
//! not reused, so two machines never share one either. Whatever fails
//! (no state directory, a file that is not a plain file or cannot be
//! written, a held lock) gives a fresh id, said in a log line: the id is
//! an optimisation of the takeover, never a condition of the start.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The start of the name of a node id file in the state directory; the
/// rest is 16 hex digits of the bucket's endpoint, name and prefix.
/// Housekeeping counts these files as the project's own.
pub use lmcache_housekeeping::scan::BUCKET_NODE_FILE_PREFIX as FILE_PREFIX;

/// The most bytes read of a node id file (it holds about 200).
const MOST_READ: u64 = 4096;

/// What a node id file holds (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Kept {
    /// The node id: 16 lowercase hex digits.
    node: String,
    /// The boot it was written in.
    boot_id: String,
    /// The host it was written on.
    hostname: String,
    /// The file's device and inode when it was written: a copy of the
    /// file (a copied directory or volume) is another file, whose id is
    /// not reused.
    dev: u64,
    ino: u64,
}

/// Why a node id is not kept: it is new, and a crash costs a lapse of the
/// lease.
#[derive(Debug, thiserror::Error)]
enum KeepError {
    #[error("cannot open it: {0}")]
    Open(std::io::Error),
    #[error("it is not a plain file with one link (a symbolic link, a directory, a hard link to another file)")]
    NotPlain,
    #[error("another process of this machine holds it (a gateway of an earlier start still running, stopped or exiting)")]
    Held,
    #[error("cannot lock it: {0}")]
    Lock(std::io::Error),
    #[error("this machine's boot id cannot be read from /proc/sys/kernel/random/boot_id")]
    NoBootId,
    #[error("cannot write it: {0}")]
    Write(std::io::Error),
}

/// A node id, and the held file that keeps it (none for a fresh id that
/// is not kept).
#[derive(Debug)]
pub(crate) struct NodeId {
    /// 16 lowercase hex digits.
    pub(crate) id: String,
    /// The file, locked for as long as this value lives.
    _held: Option<File>,
}

/// Where the node id of the bound on `endpoint`/`bucket`/`key_prefix` is
/// kept in `dir`.
pub(crate) fn file_in(dir: &Path, endpoint: &str, bucket: &str, key_prefix: &str) -> PathBuf {
    let digest = Sha256::digest(format!("{endpoint}\n{bucket}\n{key_prefix}"));
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{FILE_PREFIX}{hex}"))
}

/// The node id kept at `path` when this boot and host wrote it into this
/// very file and no other process holds it; else a fresh one, written
/// there when it can be (`path` `None`: a fresh one, not kept). Never
/// fails; says in a log line what it did, naming `tier`. Blocking file
/// I/O: call it off the runtime's threads.
pub(crate) fn claim(path: Option<&Path>, tier: usize) -> NodeId {
    let Some(path) = path else {
        let id = fresh();
        tracing::info!(
            tier,
            "S3 gateway bucket bound: node id {id}: new, not kept (no disk tier to keep it in)"
        );
        return NodeId { id, _held: None };
    };
    match keep(path) {
        Ok((id, held, reused)) => {
            let how = match reused {
                true => "the same as before this start (its lease is taken back at once)",
                false => "new, kept for a restart of this boot",
            };
            tracing::info!(
                tier,
                "S3 gateway bucket bound: node id {id}: {how}, in {}",
                path.display()
            );
            NodeId {
                id,
                _held: Some(held),
            }
        }
        Err(problem) => {
            let id = fresh();
            tracing::warn!(
                tier,
                "S3 gateway bucket bound: node id {id} is new and not kept ({}: {problem}); after a crash, the next start waits for this lease to lapse",
                path.display()
            );
            NodeId { id, _held: None }
        }
    }
}

/// Opens and locks `path`, and returns the id it keeps, or a fresh one
/// written into it; with the held file and whether the id was kept.
fn keep(path: &Path) -> Result<(String, File, bool), KeepError> {
    let mut file = open_locked(path)?;
    let here = this_machine()?;
    let meta = file.metadata().map_err(KeepError::Open)?;
    let (dev, ino) = (meta.dev(), meta.ino());
    let kept = read_kept(&mut file).filter(|k| {
        let place = (&k.boot_id, &k.hostname, k.dev, k.ino);
        is_node_id(&k.node) && place == (&here.0, &here.1, dev, ino)
    });
    if let Some(kept) = kept {
        return Ok((kept.node, file, true));
    }
    let body = Kept {
        node: fresh(),
        boot_id: here.0,
        hostname: here.1,
        dev,
        ino,
    };
    write_kept(&mut file, &body).map_err(KeepError::Write)?;
    Ok((body.node, file, false))
}

/// Opens `path` (created 0600 if missing; never through a symbolic link,
/// never blocking on a FIFO), checks that it is a plain file with one
/// link, and locks it (`flock`, exclusive, not waiting).
fn open_locked(path: &Path) -> Result<File, KeepError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(KeepError::Open)?;
    let meta = file.metadata().map_err(KeepError::Open)?;
    if !meta.file_type().is_file() || meta.nlink() != 1 {
        return Err(KeepError::NotPlain);
    }
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(KeepError::Held),
        Err(std::fs::TryLockError::Error(e)) => Err(KeepError::Lock(e)),
    }
}

/// What `file` keeps, when it holds one (at most [`MOST_READ`] bytes
/// read; anything else is written over).
fn read_kept(file: &mut File) -> Option<Kept> {
    let mut text = String::new();
    file.take(MOST_READ).read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

/// Writes `body` over `file`'s content, and syncs it.
fn write_kept(file: &mut File, body: &Kept) -> std::io::Result<()> {
    let mut text = serde_json::to_string(body).map_err(std::io::Error::other)?;
    text.push('\n');
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(text.as_bytes())?;
    file.sync_data()
}

/// This machine's boot id and host name (`""` for a host name that
/// cannot be read). No id is kept without the boot id: two kernels could
/// then share one.
fn this_machine() -> Result<(String, String), KeepError> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|b| !b.is_empty())
        .ok_or(KeepError::NoBootId)?;
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok((boot, host))
}

/// Whether `id` is a node id: 16 lowercase hex digits.
fn is_node_id(id: &str) -> bool {
    id.len() == 16
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A new node id: 16 hex digits from the system's random source (the
/// clock where it fails).
pub(crate) fn fresh() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::getrandom(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        bytes = (nanos ^ u64::from(std::process::id())).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn an_id_is_kept_for_the_next_start_and_never_shared_while_held() {
        let d = dir();
        let path = file_in(d.path(), "s3.example.net", "kv", "node/");
        let first = claim(Some(&path), 0);
        assert!(is_node_id(&first.id));
        let beside = claim(Some(&path), 0);
        assert_ne!(beside.id, first.id, "held: a second process gets its own");
        let id = first.id.clone();
        drop(first);
        let again = claim(Some(&path), 0);
        assert_eq!(again.id, id, "a restart takes the kept id");
        let mode = std::fs::metadata(&path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let other = file_in(d.path(), "s3.example.net", "kv", "node2/");
        assert_ne!(other, path, "one file per prefix");
        assert!(path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(FILE_PREFIX));
    }

    #[test]
    fn an_id_of_another_boot_or_host_or_a_file_not_ours_is_not_reused() {
        let d = dir();
        let path = file_in(d.path(), "e", "b", "");
        let (boot, host) = this_machine().unwrap();
        for (text, why) in [
            (
                format!(r#"{{"node":"0123456789abcdef","boot_id":"other","hostname":"{host}"}}"#),
                "another boot",
            ),
            (
                format!(r#"{{"node":"0123456789abcdef","boot_id":"{boot}","hostname":"other"}}"#),
                "another host",
            ),
            (
                format!(r#"{{"node":"../../etc","boot_id":"{boot}","hostname":"{host}"}}"#),
                "not an id",
            ),
            ("\u{0}\u{ff}garbage".to_string(), "not JSON"),
            (
                format!("{{\"node\":\"{}\"}}", "a".repeat(10_000)),
                "too long",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let id = claim(Some(&path), 0);
            assert!(is_node_id(&id.id) && id.id != "0123456789abcdef", "{why}");
            drop(id);
            let kept: Kept =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            assert_eq!(
                (kept.boot_id, kept.hostname),
                (boot.clone(), host.clone()),
                "{why}"
            );
        }
    }

    #[test]
    fn a_copy_of_the_file_elsewhere_gives_a_new_id() {
        let (a, b) = (dir(), dir());
        let path = file_in(a.path(), "e", "b", "p/");
        let first = claim(Some(&path), 0);
        let copy = file_in(b.path(), "e", "b", "p/");
        std::fs::copy(&path, &copy).unwrap();
        let beside = claim(Some(&copy), 0);
        assert_ne!(beside.id, first.id, "a copied directory or volume");
        drop(first);
        std::fs::remove_file(&path).unwrap();
        std::fs::copy(&copy, &path).unwrap();
        assert_ne!(claim(Some(&path), 0).id, beside.id, "copied back");
    }

    #[test]
    fn a_link_a_directory_or_no_directory_gives_a_fresh_id_and_touches_nothing() {
        let d = dir();
        let target = d.path().join("elsewhere");
        std::fs::write(&target, "keep me").unwrap();
        let hard = file_in(d.path(), "e", "b", "hard/");
        std::fs::hard_link(&target, &hard).unwrap();
        let link = file_in(d.path(), "e", "b", "link/");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let dir_path = file_in(d.path(), "e", "b", "dir/");
        std::fs::create_dir(&dir_path).unwrap();
        for path in [
            link.as_path(),
            dir_path.as_path(),
            &d.path().join("no/such/dir/file"),
        ] {
            let id = claim(Some(path), 0);
            assert!(is_node_id(&id.id), "{}", path.display());
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
        assert!(is_node_id(&claim(None, 0).id));
    }
}
