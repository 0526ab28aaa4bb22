//! Eviction cycles: the least recently used objects deleted until a cycle
//! has taken what it must, each deletion by `fstatat` and `unlinkat`
//! relative to the directory (`docs/capacity-guard.md`, "Eviction").

use std::fmt::Write as _;
use std::time::Instant;

use lmcache_housekeeping::TierDir;
use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::libc;
use nix::sys::stat::fstatat;
use nix::unistd::{unlinkat, UnlinkatFlags};

use super::free_space::Shortfall;
use super::{gib, unix_ms, Runner, DRAIN_EVERY};
use crate::status::Cycle;
use crate::tracker::Victim;

impl Runner {
    pub(super) fn evict_if_needed(&mut self, buffer: &mut [u8]) {
        let usage = self.tracker.usage();
        if usage < self.spec.trigger_bytes() {
            return;
        }
        let (stuck, stuck_bytes) = self.tracker.undeletable();
        if stuck == self.tracker.len() {
            if !std::mem::replace(&mut self.warned.only_undeletable, true) {
                tracing::warn!(
                    "{}: the tier is over its trigger ({} of {}) and holds only objects the guard cannot delete ({stuck}, {}): nothing to evict until they can be deleted (tried again every {} s)",
                    self.label(),
                    gib(usage),
                    gib(self.spec.trigger_bytes()),
                    gib(stuck_bytes),
                    self.options.undeletable_retry.as_secs()
                );
            }
            return;
        }
        let run = self.evict(self.spec.reclaim_bytes(usage), buffer);
        self.evictions.add(run.cycle);
        tracing::info!(
            "{}: evicted {} least recently used objects ({} freed{}) in {} ms at usage {} of capacity {}; now {} objects, {}{}",
            self.label(),
            run.cycle.deleted.objects,
            gib(run.cycle.deleted.bytes),
            run.links_deleted(),
            run.cycle.millis,
            gib(usage),
            gib(self.spec.capacity_bytes),
            self.tracker.len(),
            gib(self.tracker.usage()),
            run.misses()
        );
        self.write_status();
    }

    /// One eviction cycle for the capacity: deletes the least recently used
    /// objects until `bytes` are taken from the tier or it is empty.
    ///
    /// An object it cannot delete stays counted (its file is on the disk)
    /// and the cycle takes the next ones instead, so the usage still comes
    /// down by `bytes` where the tier holds enough other objects.
    pub(super) fn evict(&mut self, bytes: u64, buffer: &mut [u8]) -> EvictionRun {
        let started = Instant::now();
        let mut run = EvictionRun::default();
        let target = self.tracker.usage().saturating_sub(bytes);
        loop {
            let now = self.tracker.usage() + run.undeletable_bytes();
            let victims = self.tracker.take_lru(now.saturating_sub(target));
            if now <= target || victims.is_empty() {
                break;
            }
            self.delete(&victims, false, &mut run, buffer);
        }
        self.put_back(&mut run);
        run.finish(started);
        self.dirty = true;
        run
    }

    /// Tracks again what a run left on the disk: objects with other hard
    /// links (marked linked) and objects it could not delete (marked
    /// undeletable), at their places in the use order.
    pub(super) fn put_back(&mut self, run: &mut EvictionRun) {
        for victim in std::mem::take(&mut run.linked) {
            self.tracker.put_back(&victim);
        }
        for victim in std::mem::take(&mut run.undeletable) {
            self.tracker.put_back_undeletable(&victim);
        }
    }

    /// One eviction for the free space: deletes the least recently used
    /// objects whose deletion frees something until `want` is freed, as
    /// the filesystem counts it, or nothing such is left. Objects found
    /// with other hard links stay, tracked at their place and marked.
    pub(super) fn evict_freeing(&mut self, want: Shortfall, buffer: &mut [u8]) -> EvictionRun {
        let started = Instant::now();
        let mut run = EvictionRun::default();
        loop {
            let bytes = want.bytes.saturating_sub(run.cycle.deleted.bytes);
            let inodes = want.inodes.saturating_sub(run.freed_inodes);
            let victims = self.tracker.take_lru_freeing(bytes, inodes);
            if victims.is_empty() {
                break;
            }
            self.delete(&victims, true, &mut run, buffer);
        }
        self.put_back(&mut run);
        run.finish(started);
        self.dirty = true;
        run
    }

    /// Deletes `victims` into `run`; with `keep_linked`, a victim whose
    /// file has other hard links is left in place and listed in
    /// `run.linked`.
    pub(super) fn delete(
        &mut self,
        victims: &[Victim],
        keep_linked: bool,
        run: &mut EvictionRun,
        buffer: &mut [u8],
    ) {
        for (i, victim) in victims.iter().enumerate() {
            self.name.clear();
            // Writing into a String cannot fail.
            let _ = write!(self.name, "{}", self.tracker.file_name(&victim.key));
            match delete_object(&self.dir, &self.name, keep_linked) {
                Ok(Deleted::Freed(bytes)) => {
                    run.cycle.deleted.objects += 1;
                    run.cycle.deleted.bytes += bytes;
                    run.freed_inodes += 1;
                }
                Ok(Deleted::Unlinked) => {
                    run.cycle.deleted.objects += 1;
                    run.linked_deleted += 1;
                }
                Ok(Deleted::Linked) => {
                    run.linked_kept += 1;
                    run.linked.push(*victim);
                }
                Ok(Deleted::Gone) => run.vanished += 1,
                Err(e) => {
                    run.failed += 1;
                    run.undeletable.push(*victim);
                    if !std::mem::replace(&mut self.warned.delete, true) {
                        tracing::warn!(
                            "{}: cannot delete {}: {e}; the file stays, still counted in the tier's usage, and the guard evicts other objects around it (tried again every {} s; this warning is given once)",
                            self.label(),
                            self.dir.entry_path(&self.name).display(),
                            self.options.undeletable_retry.as_secs()
                        );
                    }
                }
            }
            if i % DRAIN_EVERY == DRAIN_EVERY - 1 {
                self.drain(buffer);
            }
        }
    }
}

/// What one eviction did. `cycle.deleted` counts the objects deleted and
/// the bytes that freed on the volume.
#[derive(Default)]
pub(super) struct EvictionRun {
    pub(super) cycle: Cycle,
    /// Deleted objects that were their file's last link (each gave the
    /// volume an inode back).
    pub(super) freed_inodes: u64,
    /// Deleted objects whose file has other hard links: nothing freed.
    pub(super) linked_deleted: u64,
    /// Objects with other hard links left in place (free-space evictions).
    pub(super) linked_kept: u64,
    /// Those objects, to track again.
    pub(super) linked: Vec<Victim>,
    /// Victims already gone, or no longer regular files of the volume.
    pub(super) vanished: u64,
    /// Victims that could not be deleted.
    pub(super) failed: u64,
    /// Those victims, to track again.
    pub(super) undeletable: Vec<Victim>,
}

impl EvictionRun {
    /// The bytes of the victims that could not be deleted.
    pub(super) fn undeletable_bytes(&self) -> u64 {
        self.undeletable.iter().map(|v| v.bytes).sum()
    }

    pub(super) fn finish(&mut self, started: Instant) {
        self.cycle.at_unix_ms = unix_ms();
        self.cycle.millis = started.elapsed().as_millis() as u64;
    }

    /// The part of a capacity cycle's log line about deleted objects with
    /// other hard links, if any.
    pub(super) fn links_deleted(&self) -> String {
        match self.linked_deleted {
            0 => String::new(),
            n => format!(
                "; {n} of them had other hard links, which keep their blocks: nothing freed for those"
            ),
        }
    }

    /// The tail of a cycle's log line: victims gone or failed, if any.
    pub(super) fn misses(&self) -> String {
        if self.vanished + self.failed == 0 {
            return String::new();
        }
        format!("; {} already gone, {} failed", self.vanished, self.failed)
    }
}

/// What [`delete_object`] did with one object file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Deleted {
    /// Deleted, and it was the file's last link: the volume got its
    /// allocated bytes (and an inode) back once no process holds it open.
    Freed(u64),
    /// Deleted, but the file has other hard links, which keep its blocks:
    /// nothing freed.
    Unlinked,
    /// Left in place: the file has other hard links, so deleting it would
    /// free nothing (asked for with `keep_linked`).
    Linked,
    /// Already gone, or no longer a regular file on the directory's
    /// filesystem (left alone).
    Gone,
}

/// Deletes one object file, and says what that freed as the filesystem
/// counts it ([`Deleted`]); with `keep_linked`, a file with other hard
/// links is left in place.
pub(super) fn delete_object(
    dir: &TierDir,
    name: &str,
    keep_linked: bool,
) -> Result<Deleted, Errno> {
    let st = match fstatat(dir.fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(Deleted::Gone),
        Err(e) => return Err(e),
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_dev != dir.device() {
        return Ok(Deleted::Gone);
    }
    let linked = st.st_nlink > 1;
    if linked && keep_linked {
        return Ok(Deleted::Linked);
    }
    match unlinkat(dir.fd(), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) if linked => Ok(Deleted::Unlinked),
        Ok(()) => Ok(Deleted::Freed(
            u64::try_from(st.st_blocks).unwrap_or(0) * 512,
        )),
        Err(Errno::ENOENT) => Ok(Deleted::Gone),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmcache_housekeeping::Access;

    #[test]
    fn a_deletion_frees_what_the_filesystem_frees() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tier");
        std::fs::create_dir(&dir).unwrap();
        let tier = TierDir::open(&dir, Access::ReadWrite).unwrap();
        let write = |name: &str| std::fs::write(dir.join(name), vec![1u8; 8192]).unwrap();
        let allocated = |name: &str| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(dir.join(name)).unwrap().blocks() * 512
        };
        write("a.data");
        let bytes = allocated("a.data");
        assert!(bytes >= 8192);
        assert_eq!(
            delete_object(&tier, "a.data", true),
            Ok(Deleted::Freed(bytes))
        );
        assert_eq!(delete_object(&tier, "a.data", true), Ok(Deleted::Gone));
        // Two and three links: one outside the tier, one more inside.
        for extra in [&["outside"][..], &["outside", "b.data"]] {
            write("a.data");
            for name in extra {
                let link = match *name {
                    "outside" => tmp.path().join("outside"),
                    other => dir.join(other),
                };
                let _ = std::fs::remove_file(&link);
                std::fs::hard_link(dir.join("a.data"), &link).unwrap();
            }
            assert_eq!(delete_object(&tier, "a.data", true), Ok(Deleted::Linked));
            assert!(dir.join("a.data").exists());
            assert_eq!(delete_object(&tier, "a.data", false), Ok(Deleted::Unlinked));
            assert!(!dir.join("a.data").exists());
        }
        // b.data now has one link inside the tier and the outside one.
        assert_eq!(delete_object(&tier, "b.data", false), Ok(Deleted::Unlinked));
        std::fs::remove_file(tmp.path().join("outside")).unwrap();
        // A symlink with an object's name is not a file of the tier.
        std::os::unix::fs::symlink(tmp.path(), dir.join("c.data")).unwrap();
        assert_eq!(delete_object(&tier, "c.data", false), Ok(Deleted::Gone));
        assert!(dir.join("c.data").symlink_metadata().is_ok());
    }
}
