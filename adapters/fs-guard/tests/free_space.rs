//! The capacity guard keeps the free-space line on its tier's volume: each
//! test mounts a tmpfs of its own (the tests need root), so the volume's
//! free space is what the test makes it.
//!
//! - A tier that grows to its capacity alone never crosses the line.
//! - Another writer that takes the volume below the line makes the guard
//!   evict the tier's least recently used objects until the line is back,
//!   and nothing else.
//! - A full volume (a writer got `ENOSPC`) is freed, and writes resume.
//! - Objects with other hard links free nothing when deleted: the guard
//!   leaves them, counts what its deletions free as the filesystem does,
//!   and says so when nothing else is left.
//! - Another writer that uses up the volume's inodes (bytes to spare) costs
//!   the tier its oldest objects until the inode line is back, and writes
//!   resume.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lmcache_capacity_guard::status::GuardStatus;
use lmcache_capacity_guard::{Guard, GuardOptions};
use lmcache_tier_e2e::Tmpfs;

mod common;
use common::{
    object_name, objects_on_disk, start_guard, store, store_all, store_paced, try_store,
    wait_status,
};

const KIB: u64 = 1024;

/// A tmpfs of `size_kib` KiB mounted in a temporary directory.
struct Volume {
    tmpfs: Tmpfs,
    mount: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Volume {
    fn mount(size_kib: u64) -> Volume {
        Volume::mount_with(&format!("size={size_kib}k"))
    }

    /// A tmpfs with the mount options `options`.
    fn mount_with(options: &str) -> Volume {
        let tmp = tempfile::tempdir().unwrap();
        let mount = tmp.path().join("volume");
        Volume {
            tmpfs: Tmpfs::mount_with(&mount, options),
            mount,
            _tmp: tmp,
        }
    }

    fn free(&self) -> u64 {
        self.tmpfs.free_bytes()
    }

    /// Makes the tier directory `tier` on the volume, starts a guard on it
    /// ([`start`]) and waits for its first free-space line: the directory,
    /// the guard and that status.
    fn guarded_tier(&self) -> (PathBuf, Guard, GuardStatus) {
        let dir = self.mount.join("tier");
        fs::create_dir(&dir).unwrap();
        let guard = start(&dir);
        let first = wait_status(&dir, "start", |s| s.free_space.is_some());
        (dir, guard, first)
    }
}

/// Stores objects 0..`n` into `dir` ([`store_all`]) and waits until the
/// guard tracks `n` objects; the assertion names `what`. That status.
fn store_counted(dir: &Path, n: u32, what: &str) -> GuardStatus {
    store_all(dir, 0..n);
    wait_status(dir, what, |s| s.tracked.objects == u64::from(n))
}

/// A guard on `dir` with a capacity of 16 objects (1 MiB), the default
/// watermark (0.8) and a free-space check every 20 ms.
fn start(dir: &Path) -> Guard {
    let options = GuardOptions {
        status_interval: Duration::from_millis(10),
        free_check: Duration::from_millis(20),
        ..GuardOptions::default()
    };
    start_guard("", dir, options)
}

#[test]
fn a_tier_that_grows_to_its_capacity_alone_never_crosses_the_line() {
    let volume = Volume::mount(4096);
    let (dir, guard, first) = volume.guarded_tier();
    let line = first.free_space.unwrap();
    // 4 MiB volume: reserve 409.6 KiB; free 4 MiB - capacity 1 MiB leaves more.
    assert_eq!(line.reserve_bytes, 4096 * KIB / 10, "{first:#?}");
    assert_eq!(line.line_bytes, line.reserve_bytes, "{first:#?}");
    store_paced(&dir, 0..64, Duration::from_millis(2));
    wait_status(&dir, "evicted for capacity", |s| {
        s.evictions.cycles > 0 && s.tracked.bytes < s.trigger_bytes
    });
    // Ten free-space checks later, still no eviction for it.
    std::thread::sleep(Duration::from_millis(200));
    let status = wait_status(&dir, "settled", |_| true);
    let kept = status.free_space.unwrap();
    assert_eq!(kept.evictions.cycles, 0, "{status:#?}");
    assert!(volume.free() >= kept.line_bytes);
    guard.stop();
}

#[test]
fn another_writer_below_the_line_costs_the_tier_its_oldest_objects_only() {
    let volume = Volume::mount(4096);
    let (dir, guard, _) = volume.guarded_tier();
    let filled = store_counted(&dir, 10, "ten objects");
    let line = filled.free_space.unwrap().line_bytes;
    // Leave a quarter of the line free: the guard frees the other three
    // quarters, five or six 64 KiB objects, the oldest first.
    let outside = volume.mount.join("model.safetensors");
    let take = volume.free() - line / 4;
    assert_eq!(volume.tmpfs.fill(&outside, take), take);
    let status = wait_status(&dir, "back at the line", |s| {
        s.free_space
            .is_some_and(|f| f.evictions.cycles > 0 && f.free_bytes >= line)
    });
    let kept = status.free_space.unwrap();
    assert!(volume.free() >= line, "{status:#?}");
    let left = objects_on_disk(&dir);
    assert!(left.len() < 10 && left.len() >= 3, "{left:?}");
    assert!(left.contains(&object_name(9)), "the newest stays: {left:?}");
    assert!(!left.contains(&object_name(0)), "the oldest goes: {left:?}");
    assert_eq!(kept.evictions.deleted.objects as usize, 10 - left.len());
    assert_eq!(
        status.evictions.cycles, 0,
        "no capacity eviction: {status:#?}"
    );
    assert_eq!(fs::metadata(&outside).unwrap().len(), take);
    guard.stop();
}

#[test]
fn a_full_volume_is_freed_and_writes_resume() {
    let volume = Volume::mount(4096);
    let (dir, guard, _) = volume.guarded_tier();
    store_counted(&dir, 12, "twelve objects");
    let outside = volume.mount.join("download.part");
    let written = volume.tmpfs.fill(&outside, u64::MAX);
    let full = Instant::now();
    let mut next = 100;
    let resumed = loop {
        match try_store(&dir, next) {
            Ok(()) => break full.elapsed(),
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => {}
            Err(e) => panic!("store: {e}"),
        }
        assert!(
            full.elapsed() < Duration::from_secs(20),
            "stores did not resume"
        );
        next += 1;
        std::thread::sleep(Duration::from_millis(5));
    };
    let status = wait_status(&dir, "freed", |s| {
        s.free_space.is_some_and(|f| f.evictions.cycles > 0)
    });
    assert!(
        objects_on_disk(&dir).contains(&object_name(next)),
        "{status:#?}"
    );
    assert_eq!(fs::metadata(&outside).unwrap().len(), written);
    eprintln!("stores resumed {resumed:?} after the volume was full");
    guard.stop();
}

#[test]
fn with_nothing_left_to_evict_the_guard_says_the_volume_is_short() {
    let volume = Volume::mount(4096);
    let (dir, guard, _) = volume.guarded_tier();
    // Leave a little room: the guard's status file needs a page.
    let outside = volume.mount.join("logs");
    let line = wait_status(&dir, "line", |s| s.free_space.is_some())
        .free_space
        .unwrap()
        .line_bytes;
    volume.tmpfs.fill(&outside, volume.free() - line / 4);
    let status = wait_status(&dir, "short", |s| {
        s.free_space
            .is_some_and(|f| f.short_since_unix_ms.is_some())
    });
    assert_eq!(status.free_space.unwrap().evictions.cycles, 0);
    fs::remove_file(&outside).unwrap();
    let back = wait_status(&dir, "back", |s| {
        s.free_space
            .is_some_and(|f| f.short_since_unix_ms.is_none())
    });
    assert_eq!(back.free_space.unwrap().shortages, 1, "{back:#?}");
    guard.stop();
}

/// A volume remounted without a size limit mid-run reports no size, and
/// no free space: the guard holds no line then, and deletes nothing for it.
#[test]
fn a_volume_remounted_without_a_size_costs_the_tier_nothing() {
    let volume = Volume::mount(4096);
    let (dir, guard, _) = volume.guarded_tier();
    store_counted(&dir, 6, "six objects");
    let remount = Command::new("mount")
        .args(["-o", "remount,size=0"])
        .arg(&volume.mount)
        .status()
        .unwrap();
    assert!(remount.success());
    assert_eq!(
        nix::sys::statvfs::statvfs(&volume.mount).unwrap().blocks(),
        0
    );
    // Twenty checks later, still everything there.
    std::thread::sleep(Duration::from_millis(400));
    let status = wait_status(&dir, "settled", |_| true);
    assert_eq!(objects_on_disk(&dir).len(), 6, "{status:#?}");
    assert_eq!(status.free_space.unwrap().evictions.cycles, 0);
    guard.stop();
}

/// A tier directory replaced, mid-run, by a symlink to a directory on
/// another filesystem is not followed there: nothing on that filesystem is
/// counted or deleted.
#[test]
fn a_tier_replaced_by_a_link_to_another_filesystem_is_not_followed() {
    let volume = Volume::mount(4096);
    let (dir, guard, _) = volume.guarded_tier();
    let elsewhere = volume._tmp.path().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    store_all(&elsewhere, 0..40);
    fs::rename(&dir, volume.mount.join("tier.old")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
    // The guard looks at its directory every fallback interval (1 s).
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(objects_on_disk(&elsewhere).len(), 40);
    guard.stop();
}

/// Allocated bytes of one stored object on this volume.
fn object_bytes(dir: &Path, i: u32) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(dir.join(object_name(i))).unwrap().blocks() * 512
}

/// Objects 0..4 get two more links outside the tier (three in all),
/// objects 4..8 one more (two in all), 8 and 9 none. Another writer takes
/// the volume half an object below the line: the guard deletes objects
/// 8 and 9 only, the two whose deletion frees anything, and counts what
/// that freed on the volume, not the bytes of the objects it passed over.
#[test]
fn objects_with_other_links_are_passed_over_when_the_volume_needs_space() {
    let volume = Volume::mount(4096);
    let (backup, second) = (volume.mount.join("backup"), volume.mount.join("second"));
    for d in [&backup, &second] {
        fs::create_dir(d).unwrap();
    }
    let (dir, guard, _) = volume.guarded_tier();
    store_all(&dir, 0..10);
    let each = object_bytes(&dir, 0);
    for i in 0..8 {
        fs::hard_link(dir.join(object_name(i)), backup.join(object_name(i))).unwrap();
    }
    for i in 0..4 {
        fs::hard_link(dir.join(object_name(i)), second.join(object_name(i))).unwrap();
    }
    let filled = wait_status(&dir, "ten objects", |s| s.tracked.objects == 10);
    let line = filled.free_space.unwrap().line_bytes;
    let outside = volume.mount.join("model.safetensors");
    let take = volume.free() - line + each / 2;
    assert_eq!(volume.tmpfs.fill(&outside, take), take);
    let status = wait_status(&dir, "back at the line", |s| {
        s.free_space
            .is_some_and(|f| f.evictions.cycles > 0 && f.free_bytes >= line)
    });
    let kept = status.free_space.unwrap();
    let left: Vec<String> = (0..8).map(object_name).collect();
    assert_eq!(objects_on_disk(&dir), left, "{status:#?}");
    assert_eq!(kept.evictions.deleted.objects, 2, "{status:#?}");
    assert_eq!(kept.evictions.deleted.bytes, 2 * each, "{status:#?}");
    assert!(volume.free() >= line);
    assert_eq!(objects_on_disk(&backup).len(), 8);
    assert_eq!(objects_on_disk(&second).len(), 4);
    guard.stop();
}

/// The example: with every object of the tier linked elsewhere, the guard
/// deleted all of them in under a second while the free space did not
/// move, and reported their bytes as freed. Now it deletes none and says
/// the volume is short.
#[test]
fn a_tier_whose_every_object_is_linked_elsewhere_gives_nothing_up_for_the_free_space() {
    let volume = Volume::mount(4096);
    let backup = volume.mount.join("backup");
    fs::create_dir(&backup).unwrap();
    let (dir, guard, _) = volume.guarded_tier();
    for i in 0..10 {
        store(&dir, i);
        fs::hard_link(dir.join(object_name(i)), backup.join(object_name(i))).unwrap();
    }
    let filled = wait_status(&dir, "ten objects", |s| s.tracked.objects == 10);
    let line = filled.free_space.unwrap().line_bytes;
    let outside = volume.mount.join("logs");
    volume.tmpfs.fill(&outside, volume.free() - line / 4);
    let status = wait_status(&dir, "short", |s| {
        s.free_space
            .is_some_and(|f| f.short_since_unix_ms.is_some())
    });
    let kept = status.free_space.unwrap();
    assert_eq!(kept.evictions.cycles, 0, "{status:#?}");
    assert_eq!(kept.evictions.deleted.bytes, 0, "{status:#?}");
    assert_eq!(objects_on_disk(&dir).len(), 10);
    assert_eq!(status.tracked.objects, 10, "{status:#?}");
    guard.stop();
}

/// A volume of 64 inodes with bytes to spare: another writer makes empty
/// files until no inode is left, and every store fails with `ENOSPC`. The
/// guard keeps an inode line (a tenth of the inodes), evicts the tier's
/// oldest objects until it is back, and stores resume; the other writer's
/// files stay.
#[test]
fn another_writer_that_uses_up_the_inodes_costs_the_tier_its_oldest_objects() {
    let volume = Volume::mount_with("size=4096k,nr_inodes=64");
    let (dir, guard, first) = volume.guarded_tier();
    let inodes = first
        .free_space
        .unwrap()
        .inodes
        .expect("tmpfs counts inodes");
    assert_eq!(
        (inodes.volume_inodes, inodes.reserve_inodes),
        (64, 6),
        "{first:#?}"
    );
    assert_eq!(inodes.line_inodes, 6, "{first:#?}");
    store_counted(&dir, 10, "ten objects");
    let others = volume.mount.join("many-small-files");
    fs::create_dir(&others).unwrap();
    let mut made = 0;
    loop {
        match fs::File::create(others.join(made.to_string())) {
            Ok(_) => made += 1,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
            Err(e) => panic!("another writer: {e}"),
        }
    }
    assert!(volume.free() > 2 << 20, "bytes to spare: {}", volume.free());
    let status = wait_status(&dir, "back at the inode line", |s| {
        s.free_space.is_some_and(|f| {
            f.evictions.cycles > 0 && f.inodes.is_some_and(|i| i.free_inodes >= i.line_inodes)
        })
    });
    assert!(volume.tmpfs.free_inodes() >= 6, "{status:#?}");
    let left = objects_on_disk(&dir);
    assert!(left.len() <= 4, "six inodes back: {left:?}");
    assert!(left.contains(&object_name(9)), "the newest stays: {left:?}");
    assert!(!left.contains(&object_name(0)), "the oldest goes: {left:?}");
    try_store(&dir, 100).expect("a store after the inodes were used up");
    assert_eq!(fs::read_dir(&others).unwrap().count(), made);
    guard.stop();
}

/// A tmpfs without an inode limit reports no inodes: the guard keeps its
/// free-space line there and no inode line.
#[test]
fn a_volume_that_reports_no_inodes_gets_no_inode_line() {
    let volume = Volume::mount_with("size=4096k,nr_inodes=0");
    let (_, guard, status) = volume.guarded_tier();
    let line = status.free_space.unwrap();
    assert_eq!(line.volume_bytes, 4096 * KIB, "{status:#?}");
    assert_eq!(line.inodes, None, "{status:#?}");
    guard.stop();
}
