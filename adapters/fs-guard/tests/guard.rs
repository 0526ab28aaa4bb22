//! The capacity guard on a real directory: it counts what is there at start,
//! follows writes, reads and deletions, evicts least recently used objects,
//! leaves everything that is not an object alone, and publishes its state.

use std::fs;
use std::path::Path;
use std::time::Duration;

use lmcache_capacity_guard::status::{CountBytes, Following, GuardStatus};
use lmcache_capacity_guard::{Guard, GuardOptions, PriorScan, Watch};
use lmcache_housekeeping::{scan, Access, TierDir};

mod common;
mod temp_tier;
use common::{
    capacity_spec, object_name, objects_on_disk, start_guard, store, store_all, store_paced,
    wait_status, OBJECT,
};
use temp_tier::{allocated, fast, wait_bounded, wait_evicted, Scratch};

/// Stores object `i` into a tier of [`start`]'s capacity, waits until its
/// guard has counted what is on the disk (the status's usage is the
/// allocated bytes, so any cycle the write called for has run), and checks
/// that the tier holds at most its capacity plus one object. The guard
/// paces the writer: how fast it keeps up with a fast one is a benchmark's
/// figure (`docs/performance.md`), not a test's.
fn store_within_capacity(dir: &Path, i: u32) -> GuardStatus {
    store(dir, i);
    let status = wait_status(dir, &format!("object {i} counted"), |s| {
        s.tracked.bytes == allocated(dir)
    });
    assert!(
        allocated(dir) <= 17 * OBJECT as u64,
        "usage above capacity + one object after object {i}: {status:#?}"
    );
    status
}

/// A guard on `dir` with a capacity of 16 objects (1 MiB), the second tier
/// of its cascade (after an s3 one).
fn start(dir: &Path, options: GuardOptions) -> Guard {
    start_guard(r#"{"type":"s3"},"#, dir, options)
}

/// The guard of a launch starts from the launch's scan: the objects it
/// found, less the ones housekeeping deleted since, plus what was written
/// after the watch was added; and it bounds the tier from there.
#[test]
fn a_guard_started_from_a_prior_scan_counts_it_less_the_deleted_plus_the_new() {
    let scratch = Scratch::hold();
    let dir = scratch.dir("tier", 0..10);
    let tier = TierDir::open(&dir, Access::ReadWrite).unwrap();
    let watch = Watch::add(&tier).unwrap();
    let inventory = scan(&tier).unwrap();
    // Housekeeping deletes three of the scanned objects; a writer adds one.
    let deleted: Vec<u32> = inventory
        .objects()
        .iter()
        .enumerate()
        .filter(|(_, o)| {
            let name = inventory.names().name(&o.key).to_string();
            [1, 2, 3].iter().any(|&i| name == object_name(i))
        })
        .map(|(i, _)| i as u32)
        .collect();
    assert_eq!(deleted.len(), 3);
    for i in 1..4 {
        fs::remove_file(dir.join(object_name(i))).unwrap();
    }
    store(&dir, 10);
    let spec = capacity_spec("", &dir);
    let prior = PriorScan {
        dir: tier,
        watch: Some(watch),
        inventory,
        deleted,
    };
    let guard = Guard::start_from_scan(spec, fast(), prior).unwrap();
    let status = wait_status(&dir, "taken over", |s| s.tracked.objects == 8);
    assert_eq!(status.start.found.objects, 7, "{status:#?}");
    assert_eq!(status.tracked.bytes, allocated(&dir));
    store_paced(&dir, 11..40, Duration::from_millis(5));
    wait_bounded(&dir, "bounded");
    guard.stop();
}

/// A tier named through a symlink to its directory is watched like the
/// directory itself.
#[test]
fn a_tier_named_through_a_symlink_is_followed_by_inotify() {
    let scratch = Scratch::hold();
    let dir = scratch.dir("tier", 0..1);
    let link = scratch.path().join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let guard = start(&link, fast());
    let status = wait_status(&link, "start count", |s| s.start.found.objects == 1);
    assert_eq!(status.following, Following::Inotify, "{status:#?}");
    store(&dir, 1);
    wait_status(&link, "a write through the directory", |s| {
        s.tracked.objects == 2
    });
    guard.stop();
}

#[test]
fn evicts_the_least_recently_used_and_touches_nothing_else() {
    let scratch = Scratch::hold();
    let dir = scratch.dir("tier", 0..4);
    let outside = scratch.path().join("weights.safetensors");
    fs::write(&outside, b"weights").unwrap();
    std::os::unix::fs::symlink(&outside, dir.join(object_name(1000))).unwrap();
    fs::write(dir.join("model.safetensors"), b"foreign").unwrap();
    fs::write(dir.join("notes.data"), b"foreign").unwrap();

    let guard = start(&dir, fast());
    let status = wait_status(&dir, "start count", |s| s.start.found.objects == 4);
    assert_eq!(status.start.found.bytes, allocated(&dir));
    assert_eq!(status.tier, 1);

    // Reading object 0 keeps it recently used.
    for i in 4..40 {
        fs::read(dir.join(object_name(0))).unwrap();
        store_within_capacity(&dir, i);
    }
    let status = wait_bounded(&dir, "evicted");
    assert_eq!(status.following, Following::Inotify);
    // Objects written since the start were counted by their events, soon
    // after they were written; no event was lost.
    let lag = status
        .event_lag_ms
        .expect("an event lag once objects were written");
    assert!(lag < 10_000, "{status:#?}");
    assert_eq!(status.overflows, 0);
    let kept = objects_on_disk(&dir);
    assert!(
        kept.contains(&object_name(0)),
        "the read object was evicted"
    );
    assert!(
        kept.contains(&object_name(39)),
        "the newest object was evicted"
    );
    assert!(
        !kept.contains(&object_name(1)),
        "the oldest object was kept"
    );
    guard.stop();

    assert_eq!(fs::read(&outside).unwrap(), b"weights");
    assert!(fs::symlink_metadata(dir.join(object_name(1000))).is_ok());
    assert_eq!(fs::read(dir.join("model.safetensors")).unwrap(), b"foreign");
    assert_eq!(fs::read(dir.join("notes.data")).unwrap(), b"foreign");
}

#[test]
fn deletions_by_others_are_forgotten_and_a_restart_counts_the_disk() {
    let scratch = Scratch::hold();
    let dir = scratch.path();
    let guard = start(dir, fast());
    wait_status(dir, "start", |_| true);
    store_all(dir, 0..10);
    fs::remove_file(dir.join(object_name(3))).unwrap();
    fs::rename(dir.join(object_name(4)), scratch.path().join("moved-away")).unwrap();
    wait_status(dir, "deletions seen", |s| {
        s.tracked.objects == 8 && s.tracked.bytes == allocated(dir)
    });
    guard.stop();
    store_all(dir, 10..14);
    let guard = start(dir, fast());
    let status = wait_status(dir, "recount", |s| s.start.found.objects == 12);
    assert_eq!(status.start.found.bytes, allocated(dir));
    guard.stop();
}

#[test]
fn without_inotify_rescans_hold_the_capacity() {
    let scratch = Scratch::hold();
    let dir = scratch.path();
    let guard = start(
        dir,
        GuardOptions {
            inotify: false,
            ..fast()
        },
    );
    store_all(dir, 0..30);
    let status = wait_status(dir, "rescans evicted", |s| {
        s.evictions.cycles > 0 && s.tracked.bytes == allocated(dir) && s.rescans > 0
    });
    assert_eq!(status.following, Following::Rescans);
    assert!(allocated(dir) < status.trigger_bytes);
    assert!(objects_on_disk(dir).contains(&object_name(29)));
    guard.stop();
}

/// A tier directory removed and made again while its guard runs (an
/// operator's cleanup, a job that recreates it): the guard follows the new
/// directory, and the bound holds there.
#[test]
fn a_tier_directory_removed_and_made_again_is_followed_and_bounded() {
    let scratch = Scratch::hold();
    let dir = scratch.dir("tier", 0..4);
    let guard = start(&dir, fast());
    wait_status(&dir, "start count", |s| s.start.found.objects == 4);
    // The guard may write its status file while the directory is emptied.
    let mut tries = 0;
    while let Err(e) = fs::remove_dir_all(&dir) {
        tries += 1;
        assert!(tries < 50, "cannot remove the tier directory: {e}");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    fs::create_dir(&dir).unwrap();
    store_paced(&dir, 100..140, Duration::from_millis(5));
    let status = wait_bounded(&dir, "the new directory bounded");
    assert_eq!(
        status.following,
        Following::Inotify,
        "watching the new directory"
    );
    assert!(objects_on_disk(&dir).contains(&object_name(139)));
    guard.stop();
}

/// Sets `fs.inotify.max_queued_events` for as long as it lives, and puts
/// the old value back when dropped. The kernel reads it when an inotify
/// instance is made, so only watches added meanwhile get the small queue.
struct QueueLimit {
    old: String,
}

const MAX_QUEUED_EVENTS: &str = "/proc/sys/fs/inotify/max_queued_events";

impl QueueLimit {
    fn set(events: u32) -> QueueLimit {
        let old = fs::read_to_string(MAX_QUEUED_EVENTS).unwrap();
        fs::write(MAX_QUEUED_EVENTS, events.to_string())
            .unwrap_or_else(|e| panic!("{MAX_QUEUED_EVENTS} needs root: {e}"));
        QueueLimit { old }
    }
}

impl Drop for QueueLimit {
    fn drop(&mut self) {
        let _ = fs::write(MAX_QUEUED_EVENTS, self.old.trim());
    }
}

/// An inotify queue of 16 events overflows under a burst of writes: the
/// guard counts the overflow, rescans, and the bound holds on what the
/// rescan found.
#[test]
fn an_inotify_queue_overflow_is_rescanned_and_the_bound_holds() {
    let scratch = Scratch::hold();
    let dir = scratch.path();
    let guard = {
        let _limit = QueueLimit::set(16);
        start(dir, fast())
    };
    store_all(dir, 0..200);
    let status = wait_status(dir, "overflowed, rescanned, bounded", |s| {
        s.overflows > 0 && s.rescans > 0 && s.tracked.bytes == allocated(dir)
    });
    assert!(status.tracked.bytes < status.trigger_bytes, "{status:#?}");
    assert_eq!(status.following, Following::Inotify, "{status:#?}");
    // Which of the burst's objects the rescan ranks newest depends on which
    // events the kernel dropped (objects a rescan finds untracked enter as
    // just used: docs/capacity-guard.md); one stored after it is the
    // newest whether it is followed or found by a later rescan, and kept.
    store(dir, 200);
    let status = wait_status(dir, "followed after the rescan, bounded", |s| {
        s.tracked.bytes == allocated(dir) && s.tracked.bytes < s.trigger_bytes
    });
    assert!(
        objects_on_disk(dir).contains(&object_name(200)),
        "{status:#?}"
    );
    guard.stop();
}

/// A capacity cycle deletes the least recently used objects whatever
/// their links (the tier's usage is what it holds), but counts what that
/// freed as the filesystem does: nothing for the ten objects with another
/// link outside the tier, their blocks for the others. The outside links
/// keep their content.
#[test]
fn a_capacity_cycle_counts_what_its_deletions_free_on_the_volume() {
    use std::os::unix::fs::MetadataExt;
    let scratch = Scratch::hold();
    let dir = scratch.dir("tier", 0..10);
    let backup = scratch.dir("backup", 0..0);
    for i in 0..10 {
        fs::hard_link(dir.join(object_name(i)), backup.join(object_name(i))).unwrap();
    }
    let each = fs::metadata(dir.join(object_name(0))).unwrap().blocks() * 512;
    let guard = start(&dir, fast());
    wait_status(&dir, "start count", |s| s.start.found.objects == 10);
    store_paced(&dir, 10..40, Duration::from_millis(5));
    wait_evicted(&dir, "evicted");
    guard.stop();
    // The status written when the guard stopped: every cycle it ran.
    let status = wait_status(&dir, "the last status", |_| true);
    let kept = objects_on_disk(&dir);
    let evicted: Vec<u32> = (0..40)
        .filter(|&i| !kept.contains(&object_name(i)))
        .collect();
    assert!(
        evicted.iter().any(|&i| i < 10),
        "the linked ones are the oldest: {evicted:?}"
    );
    let freeing = evicted.iter().filter(|&&i| i >= 10).count() as u64;
    assert_eq!(
        status.evictions.deleted.objects,
        evicted.len() as u64,
        "{status:#?}"
    );
    assert_eq!(
        status.evictions.deleted.bytes,
        freeing * each,
        "{status:#?}"
    );
    for i in 0..10 {
        assert_eq!(
            fs::read(backup.join(object_name(i))).unwrap(),
            vec![7u8; OBJECT]
        );
    }
}

/// Sets or clears the immutable attribute of `paths` (`chattr`).
fn chattr(flag: &str, paths: &[std::path::PathBuf]) {
    let out = std::process::Command::new("chattr")
        .arg(flag)
        .args(paths)
        .output()
        .expect("chattr (e2fsprogs) runs");
    assert!(
        out.status.success(),
        "chattr {flag} needs root and a filesystem with file attributes (ext4, xfs, tmpfs): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Clears the immutable attribute when dropped, so the temporary
/// directory can be removed whatever the test did.
struct Immutable(Vec<std::path::PathBuf>);

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .args(&self.0)
            .output();
    }
}

/// Objects the guard cannot delete (immutable files) stay counted, so the
/// tier stays within its capacity around them; one whose attribute is
/// cleared is evicted once the guard tries again.
#[test]
fn objects_it_cannot_delete_stay_counted_and_the_tier_stays_within_its_capacity() {
    let scratch = Scratch::hold();
    let dir = scratch.dir("tier", 0..10);
    // The eight oldest, half the capacity, cannot be deleted.
    let stuck: Vec<_> = (0..8).map(|i| dir.join(object_name(i))).collect();
    chattr("+i", &stuck);
    let _clear = Immutable(stuck.clone());

    let options = GuardOptions {
        undeletable_retry: Duration::from_millis(300),
        ..fast()
    };
    let guard = start(&dir, options);
    wait_status(&dir, "start count", |s| s.start.found.objects == 10);
    // The marks come off at every try (300 ms here) and go on again at the
    // next cycle that tries those objects: look at every status.
    let mut most_marked = CountBytes::default();
    for i in 10..40 {
        let status = store_within_capacity(&dir, i);
        if status.undeletable.objects > most_marked.objects {
            most_marked = status.undeletable;
        }
    }
    assert_eq!(
        most_marked,
        CountBytes {
            objects: 8,
            bytes: 8 * OBJECT as u64
        }
    );
    wait_bounded(&dir, "evicted around the undeletable");
    let kept = objects_on_disk(&dir);
    assert!(stuck.iter().all(|p| p.exists()), "{kept:?}");
    assert!(kept.contains(&object_name(39)), "{kept:?}");

    // Cleared, the oldest is the first to go at a cycle after a try; the
    // others stay.
    chattr("-i", &stuck[..1]);
    let mut next = 40;
    while stuck[0].exists() {
        assert!(next < 1040, "the cleared object was never evicted");
        store_within_capacity(&dir, next);
        next += 1;
    }
    assert!(stuck[1..].iter().all(|p| p.exists()));
    guard.stop();
}
