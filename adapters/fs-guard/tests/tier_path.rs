//! The directory a capacity guard guards is the one its tier path names,
//! which is the one the server writes to (LMCache opens `base_path/<name>`
//! at every store), and nothing else, for as long as the guard runs:
//!
//! - a volume mounted over the tier directory (a tmpfs), or another
//!   directory bind-mounted over it, is counted and bounded, and the
//!   directory under it is guarded again once it is unmounted (these tests
//!   mount, so they need root);
//! - a tier named through a symlink follows the link when the operator
//!   points it at another directory, on the same volume or another;
//! - a symlink put at a path that was a directory when the guard started is
//!   never followed: nothing behind it is counted, deleted or written, and
//!   the directory moved away from the path is left alone too.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lmcache_capacity_guard::status::{Following, GuardStatus, GUARD_STATUS_FILE_NAME};
use lmcache_capacity_guard::{Guard, GuardOptions};
use lmcache_tier_e2e::Tmpfs;

mod common;
mod temp_tier;
use common::{object_name, objects_on_disk, start_guard, store_paced, wait_status};
use temp_tier::{allocated, fast, wait_bounded, Scratch};

/// How often the guard looks at its path in these tests.
const LOOK: Duration = Duration::from_millis(50);

fn names(range: std::ops::Range<u32>) -> Vec<String> {
    let mut names: Vec<String> = range.map(object_name).collect();
    names.sort();
    names
}

/// A guard on `path` with a capacity of 16 objects (1 MiB) that looks at
/// its path every [`LOOK`].
fn start(path: &Path) -> Guard {
    start_guard(
        "",
        path,
        GuardOptions {
            fallback_rescan: LOOK,
            ..fast()
        },
    )
}

/// Makes the tier directory `tier` in `scratch`, holding objects 0..4, and
/// starts a guard on it ([`start`]): the directory, the guard, and its
/// status once its start counted the four.
fn guarded_tier(scratch: &Scratch) -> (PathBuf, Guard, GuardStatus) {
    let dir = scratch.dir("tier", 0..4);
    let guard = start(&dir);
    let status = wait_status(&dir, "start count", |s| s.start.found.objects == 4);
    (dir, guard, status)
}

/// Asserts that `dir` holds the objects [`guarded_tier`] stored, and no
/// other: nothing under a mount over it was touched.
fn assert_untouched_under(dir: &Path) {
    assert_eq!(
        objects_on_disk(dir),
        names(0..4),
        "nothing under it touched"
    );
}

/// Stores objects `range` through `path`, a few milliseconds apart, and
/// waits until the guard holds what is there under its capacity.
fn fill_and_wait_bounded(path: &Path, range: std::ops::Range<u32>, what: &str) {
    let last = range.end - 1;
    store_paced(path, range, Duration::from_millis(5));
    wait_bounded(path, what);
    assert!(
        objects_on_disk(path).contains(&object_name(last)),
        "{what}: the newest object was evicted"
    );
}

/// The example: a tmpfs mounted over the tier directory while the guard
/// runs took 1.2 GiB on a 1 GiB tier, unguarded, and the guard's status
/// (and so its metrics) was gone from the path. (Needs root.)
#[test]
fn a_volume_mounted_over_the_tier_directory_is_guarded_and_so_is_the_one_under_it_after() {
    let scratch = Scratch::hold();
    let (dir, guard, under) = guarded_tier(&scratch);
    let mounted = Tmpfs::mount(&dir, 8192);
    fill_and_wait_bounded(&dir, 100..140, "the mounted volume bounded");
    let status = wait_status(&dir, "its own line", |s| s.free_space.is_some());
    let line = status.free_space.unwrap();
    assert_eq!(
        line.volume_bytes,
        8 << 20,
        "measured on the tmpfs: {status:#?}"
    );
    assert_eq!(status.following, Following::Inotify, "{status:#?}");
    drop(mounted);
    let back = wait_status(&dir, "back on the directory under it", |s| {
        s.free_space.is_some_and(|f| f.volume_bytes != 8 << 20) && s.tracked.objects == 4
    });
    assert_eq!(
        back.free_space.unwrap().volume_bytes,
        under.free_space.unwrap().volume_bytes
    );
    assert_untouched_under(&dir);
    guard.stop();
}

/// Another directory bind-mounted over the tier directory: the server
/// writes into it, so it is bounded; the directory under the mount is
/// left as it was. (Needs root.)
#[test]
fn a_directory_bind_mounted_over_the_tier_directory_is_guarded_and_the_one_under_it_kept() {
    let scratch = Scratch::hold();
    let other = scratch.dir("other", 0..0);
    let (dir, guard, _) = guarded_tier(&scratch);
    let bound = Tmpfs::bind(&other, &dir);
    fill_and_wait_bounded(&dir, 100..140, "the bind-mounted directory bounded");
    assert_eq!(objects_on_disk(&other), objects_on_disk(&dir));
    drop(bound);
    wait_status(&dir, "back on the directory under it", |s| {
        s.tracked.objects == 4 && s.tracked.bytes == allocated(&dir)
    });
    assert_untouched_under(&dir);
    guard.stop();
}

/// A tier the operator names through a symlink: pointed at another
/// directory, then at a directory on another volume, the guard follows
/// the link each time (the server does), and leaves the directories it
/// pointed at before alone. (The second step mounts a tmpfs: root.)
#[test]
fn a_tier_named_through_a_link_follows_it_when_it_is_pointed_elsewhere() {
    let scratch = Scratch::hold();
    let (a, b) = (scratch.dir("a", 0..4), scratch.dir("b", 0..0));
    let link = scratch.path().join("tier");
    std::os::unix::fs::symlink(&a, &link).unwrap();
    let guard = start(&link);
    wait_status(&link, "start count", |s| s.start.found.objects == 4);
    // As `ln -sfn` does: a new link renamed over the old one.
    let point_at = |target: &Path| {
        let new = scratch.path().join("tier.new");
        std::os::unix::fs::symlink(target, &new).unwrap();
        fs::rename(&new, &link).unwrap();
    };
    point_at(&b);
    fill_and_wait_bounded(&link, 100..140, "the link's new directory bounded");
    assert_eq!(objects_on_disk(&a), names(0..4));
    let volume = Tmpfs::mount(&scratch.path().join("volume"), 8192);
    point_at(volume.path());
    fill_and_wait_bounded(&link, 200..240, "the directory on another volume bounded");
    let status = wait_status(&link, "its line", |s| s.free_space.is_some());
    assert_eq!(status.free_space.unwrap().volume_bytes, 8 << 20);
    let in_b = objects_on_disk(&b);
    assert!(in_b.iter().all(|n| names(100..140).contains(n)), "{in_b:?}");
    assert_eq!(objects_on_disk(&a), names(0..4));
    guard.stop();
}

/// The example: a symlink put at the tier path took the guard into another
/// directory, where it evicted 18 objects. It is never followed: the
/// objects behind it stay, no status is written there, and the directory
/// moved away from the path is left alone; a directory made at the path
/// again is guarded.
#[test]
fn a_symlink_put_at_the_tier_path_is_never_followed() {
    let scratch = Scratch::hold();
    let elsewhere = scratch.dir("elsewhere", 1000..1040);
    let (dir, guard, _) = guarded_tier(&scratch);
    let moved = scratch.path().join("tier.moved");
    fs::rename(&dir, &moved).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
    // Ten looks at the path later, nothing behind the link was touched.
    std::thread::sleep(LOOK * 10);
    assert_eq!(objects_on_disk(&elsewhere), names(1000..1040));
    assert!(!elsewhere.join(GUARD_STATUS_FILE_NAME).exists());
    // The link goes and a directory comes: that one is guarded.
    fs::remove_file(&dir).unwrap();
    fs::create_dir(&dir).unwrap();
    fill_and_wait_bounded(&dir, 100..140, "the directory made at the path bounded");
    assert_eq!(objects_on_disk(&elsewhere), names(1000..1040));
    assert!(!elsewhere.join(GUARD_STATUS_FILE_NAME).exists());
    assert_eq!(objects_on_disk(&moved), names(0..4));
    guard.stop();
}

/// A symlink put at the tier path that leads back to the directory the
/// guard holds (the directory moved, and linked from its old path): the
/// server still writes there, and the guard goes on bounding it.
#[test]
fn a_symlink_put_at_the_tier_path_to_the_same_directory_changes_nothing() {
    let scratch = Scratch::hold();
    let (dir, guard, _) = guarded_tier(&scratch);
    let real = scratch.path().join("tier.real");
    fs::rename(&dir, &real).unwrap();
    std::os::unix::fs::symlink(&real, &dir).unwrap();
    fill_and_wait_bounded(&dir, 100..140, "bounded through the link");
    let status = wait_status(&dir, "watched again", |s| s.following == Following::Inotify);
    assert_eq!(status.tracked.bytes, allocated(&real));
    guard.stop();
}
