//! What the guard's integration tests share.

use std::fs;
use std::io::Write;
use std::ops::Range;
use std::path::Path;
use std::time::{Duration, Instant};

use lmcache_capacity_guard::capacity::{guard_specs, GuardSpec};
use lmcache_capacity_guard::status::{read_status, GuardStatus};
use lmcache_capacity_guard::{Guard, GuardOptions};
use lmcache_housekeeping::{Access, TierDir};
use lmcache_tier_spec::Cascade;

/// The size of every object the tests store, in bytes (64 KiB).
pub const OBJECT: usize = 64 * 1024;

/// The guard's status in `dir` once `ok` holds for it, read every 10 ms for
/// at most 20 s; the assertion names `what` and the last status.
pub fn wait_status(dir: &Path, what: &str, ok: impl Fn(&GuardStatus) -> bool) -> GuardStatus {
    let started = Instant::now();
    let tier = TierDir::open(dir, Access::ReadOnly).unwrap();
    loop {
        let status = read_status(&tier).unwrap();
        if let Some(status) = status.as_ref().filter(|s| ok(s)) {
            return status.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{what}: last status {status:#?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The file name LMCache gives object `i` of model `test-model`.
pub fn object_name(i: u32) -> String {
    format!("test-model@0x01000100@0@{i:064x}.data")
}

/// Writes object `i` ([`OBJECT`] bytes) into `dir` as LMCache does: a
/// `.tmp` file, closed, then renamed into place. Its times are `i` seconds
/// after a fixed instant, so a scan orders the objects as they were
/// written (a burst of real writes shares one coarse timestamp). A write
/// that fails (`ENOSPC`) removes the `.tmp` file and returns its error.
pub fn try_store(dir: &Path, i: u32) -> std::io::Result<()> {
    let tmp = dir.join(object_name(i).replace(".data", ".tmp"));
    let mut file = fs::File::create(&tmp)?;
    if let Err(e) = file.write_all(&vec![7u8; OBJECT]) {
        drop(file);
        fs::remove_file(&tmp)?;
        return Err(e);
    }
    let at = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + u64::from(i));
    file.set_times(fs::FileTimes::new().set_accessed(at).set_modified(at))?;
    drop(file);
    fs::rename(&tmp, dir.join(object_name(i)))
}

/// [`try_store`] of object `i`, which must succeed.
pub fn store(dir: &Path, i: u32) {
    try_store(dir, i).unwrap();
}

/// Stores objects `objects` into `dir` one after another ([`store`]).
pub fn store_all(dir: &Path, objects: Range<u32>) {
    for i in objects {
        store(dir, i);
    }
}

/// Stores objects `objects` into `dir` ([`store`]), sleeping `pause` after
/// each one.
pub fn store_paced(dir: &Path, objects: Range<u32>, pause: Duration) {
    for i in objects {
        store(dir, i);
        std::thread::sleep(pause);
    }
}

/// The names in `dir` that end `.data`, sorted.
pub fn objects_on_disk(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".data"))
        .collect();
    names.sort();
    names
}

/// The spec of a guard on the fs tier at `dir` with a capacity of 16
/// objects (1 MiB), the tier after `before` in its cascade: the JSON of the
/// tiers before it, each followed by a comma (`""` for none).
pub fn capacity_spec(before: &str, dir: &Path) -> GuardSpec {
    let json = format!(
        r#"[{before}{{"type":"fs","base_path":"{}","max_capacity_gb":{}}}]"#,
        dir.display(),
        1.0 / 1024.0
    );
    guard_specs(&Cascade::parse(&json, "V").unwrap())
        .unwrap()
        .remove(0)
}

/// A guard with `options` started on [`capacity_spec`]`(before, dir)`.
pub fn start_guard(before: &str, dir: &Path, options: GuardOptions) -> Guard {
    Guard::start(capacity_spec(before, dir), options).unwrap()
}
