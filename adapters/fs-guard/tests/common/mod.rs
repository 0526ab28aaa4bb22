//! What the guard's integration tests share.

use std::path::Path;
use std::time::{Duration, Instant};

use lmcache_capacity_guard::status::{read_status, GuardStatus};
use lmcache_housekeeping::{Access, TierDir};

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
