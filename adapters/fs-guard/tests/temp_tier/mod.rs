//! What the tests of tier directories in a temporary directory share
//! (`guard.rs`, `tier_path.rs`; `free_space.rs` mounts volumes of its own).

use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use lmcache_capacity_guard::status::GuardStatus;
use lmcache_capacity_guard::GuardOptions;

use crate::common::{objects_on_disk, store_all, wait_status};

/// A temporary directory on the volume the tests share, held by the test
/// while it lives: a guard keeps a free-space line on its volume, so one
/// test's writes would be another's volume filling up (and a cause of
/// evictions its assertions do not expect) on a volume short of its
/// reserve. The directory is removed, then the volume let go, when dropped.
pub struct Scratch {
    tmp: tempfile::TempDir,
    _volume: MutexGuard<'static, ()>,
}

impl Scratch {
    /// Waits for the shared volume, then makes the temporary directory.
    pub fn hold() -> Scratch {
        static VOLUME: Mutex<()> = Mutex::new(());
        let volume = VOLUME.lock().unwrap_or_else(|e| e.into_inner());
        Scratch {
            tmp: tempfile::tempdir().unwrap(),
            _volume: volume,
        }
    }

    /// The temporary directory.
    pub fn path(&self) -> &Path {
        self.tmp.path()
    }

    /// Makes the directory `name` in the temporary directory and stores
    /// objects `objects` into it ([`store_all`]); its path.
    pub fn dir(&self, name: &str, objects: Range<u32>) -> PathBuf {
        let dir = self.path().join(name);
        fs::create_dir(&dir).unwrap();
        store_all(&dir, objects);
        dir
    }
}

/// A status written every 10 ms and a rescan (a look at the tier path)
/// every 50 ms.
pub fn fast() -> GuardOptions {
    GuardOptions {
        status_interval: Duration::from_millis(10),
        fallback_rescan: Duration::from_millis(50),
        ..GuardOptions::default()
    }
}

/// Allocated bytes of the regular files named as objects (a symlink with
/// an object's name is not one: a long target takes a block of its own).
pub fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    objects_on_disk(dir)
        .iter()
        .filter(|n| n.starts_with("test-model@"))
        .filter_map(|n| fs::symlink_metadata(dir.join(n)).ok())
        .filter(|m| m.file_type().is_file())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// The guard's status in `dir` once it has run a capacity cycle and counts
/// what is on the disk ([`allocated`]).
pub fn wait_evicted(dir: &Path, what: &str) -> GuardStatus {
    wait_status(dir, what, |s| {
        s.evictions.cycles > 0 && s.tracked.bytes == allocated(dir)
    })
}

/// [`wait_evicted`], asserting that the tier is then below its trigger.
pub fn wait_bounded(dir: &Path, what: &str) -> GuardStatus {
    let status = wait_evicted(dir, what);
    assert!(
        status.tracked.bytes < status.trigger_bytes,
        "{what}: {status:#?}"
    );
    status
}
