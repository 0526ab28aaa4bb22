//! The free space and free inodes a guard keeps on its volume, and the
//! evictions that restore them (`docs/capacity-guard.md`, "Free space").

use std::fmt::Write as _;
use std::sync::Mutex;

use lmcache_housekeeping::TierDir;
use lmcache_sizing::rules::{free_space_line, volume_reserve};

use super::{gib, size, unix_ms, Runner};
use crate::status::{FreeInodes, FreeSpace};

/// The inode reserve of a volume of `inodes` inodes: 10% of them, at most
/// a million (`docs/capacity-guard.md`, "The free-space line at run time").
/// A million free inodes let anything on a node create files; the cache's
/// objects are large, so a capacity's worth of them takes few.
pub(super) fn inode_reserve(inodes: u64) -> u64 {
    (inodes / 10).min(1_000_000)
}

/// The inode line kept on `volume`: `None` on a volume that reports no
/// inodes.
fn inode_line(volume: &VolumeSpace) -> Option<FreeInodes> {
    (volume.inodes > 0).then(|| {
        let reserve_inodes = inode_reserve(volume.inodes);
        FreeInodes {
            volume_inodes: volume.inodes,
            reserve_inodes,
            line_inodes: reserve_inodes.min(volume.free_inodes),
            free_inodes: volume.free_inodes,
        }
    })
}

/// What an eviction for the free space must give back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shortfall {
    /// Bytes to free.
    pub(super) bytes: u64,
    /// Inodes to free (objects whose last link goes).
    pub(super) inodes: u64,
}

/// What an eviction for the free space must give back, `None` at or above
/// both lines. Below the space line, or on a volume with no free byte
/// (stores fail with `ENOSPC` there, whatever the line): what the free
/// space lacks to reach the line. Below the inode line, or with no free
/// inode: what the free inodes lack. Either way at least `regular_cycle`
/// bytes, so that a tier giving way to another writer evicts in cycles, as
/// at its watermark, not an object at each check while LMCache goes on
/// storing. `inodes` is (free, line), `None` on a volume that reports no
/// inodes.
pub(super) fn shortfall(
    free: u64,
    line: u64,
    inodes: Option<(u64, u64)>,
    regular_cycle: u64,
) -> Option<Shortfall> {
    let space_short = free == 0 || free < line;
    let inodes_short = inodes.is_some_and(|(free, line)| free == 0 || free < line);
    if !space_short && !inodes_short {
        return None;
    }
    Some(Shortfall {
        bytes: line.saturating_sub(free).max(regular_cycle),
        inodes: inodes.map_or(0, |(free, line)| line.saturating_sub(free)),
    })
}

impl Runner {
    /// The free-space line of the tier's volume, measured now, after the
    /// count: `None` (and a log line) when the volume reports no size or
    /// cannot be measured. The inode line is kept beside it on a volume
    /// that reports inodes.
    pub(super) fn measure_line(&mut self) -> Option<FreeSpace> {
        let volume = self.sized_volume()?;
        let reserve_bytes = volume_reserve(volume.total);
        let line_bytes = free_space_line(
            reserve_bytes,
            volume.free,
            self.tracker.usage(),
            self.spec.capacity_bytes,
        );
        let inodes = inode_line(&volume);
        let inode_line = match &inodes {
            Some(i) => format!(
                " and {} free inodes of {} (reserve {}; {} free at start)",
                i.line_inodes, i.volume_inodes, i.reserve_inodes, i.free_inodes
            ),
            None => String::from(" (it reports no inodes, so no inode line)"),
        };
        tracing::info!(
            "{}: keeps {} free on the {} volume (reserve {}; free {} + tier {} - capacity {} at start){inode_line}; evicts below that",
            self.label(),
            gib(line_bytes),
            gib(volume.total),
            gib(reserve_bytes),
            gib(volume.free),
            gib(self.tracker.usage()),
            gib(self.spec.capacity_bytes),
        );
        if self.spec.capacity_bytes > volume.total {
            tracing::warn!(
                "{}: the capacity {} is larger than the {} volume the tier is on now; the free-space line bounds it there",
                self.label(),
                gib(self.spec.capacity_bytes),
                gib(volume.total)
            );
        }
        Some(FreeSpace {
            volume_bytes: volume.total,
            reserve_bytes,
            line_bytes,
            free_bytes: volume.free,
            inodes,
            ..FreeSpace::default()
        })
    }

    /// The tier's volume, when it reports a size; `None` (said in the log)
    /// when it reports none or cannot be measured.
    fn sized_volume(&self) -> Option<VolumeSpace> {
        match volume_space(&self.dir) {
            Ok(volume) if volume.total > 0 => Some(volume),
            Ok(_) => {
                tracing::info!(
                    "{}: the volume reports no size (tmpfs without a size limit, ramfs); no free-space line is kept",
                    self.label()
                );
                None
            }
            Err(e) => {
                tracing::warn!(
                    "{}: cannot measure the volume ({e}); no free-space line is kept",
                    self.label()
                );
                None
            }
        }
    }

    /// Reads the volume's free space and inodes and, below a line, evicts
    /// LRU objects of the tier for the difference, at least a regular
    /// cycle ([`shortfall`]). With nothing left whose deletion frees
    /// anything it says so once, until the volume is back above the lines.
    pub(super) fn keep_free_space(&mut self, buffer: &mut [u8]) {
        let Some(mut kept) = self.free_space else {
            return;
        };
        // One guard at a time in this process measures and evicts, so that
        // two tiers on one volume do not both evict for one shortfall.
        static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some(volume) = self.free_now() else {
            return;
        };
        // Published when it moves by a MiB or more, or by 1% of the
        // volume's inodes (the status is written at most once per status
        // interval).
        self.dirty |= volume.free.abs_diff(kept.free_bytes) >= 1 << 20;
        kept.free_bytes = volume.free;
        if let Some(inodes) = &mut kept.inodes {
            self.dirty |= volume.free_inodes.abs_diff(inodes.free_inodes) * 100
                >= inodes.volume_inodes.max(100);
            inodes.free_inodes = volume.free_inodes;
        }
        let regular_cycle = self.spec.reclaim_bytes(self.tracker.usage());
        let inodes = kept.inodes.map(|i| (i.free_inodes, i.line_inodes));
        match shortfall(kept.free_bytes, kept.line_bytes, inodes, regular_cycle) {
            None => self.back_above(&mut kept),
            Some(_) if self.tracker.unlinked() == 0 => self.nothing_to_evict(&mut kept),
            Some(want) => {
                if self.evict_for_free_space(&mut kept, want, buffer) == 0 {
                    self.nothing_to_evict(&mut kept);
                }
            }
        }
        self.free_space = Some(kept);
    }

    /// The volume's size, free space and inodes; `None`, warned once, when
    /// it cannot be measured or reports no size.
    pub(super) fn free_now(&mut self) -> Option<VolumeSpace> {
        match volume_space(&self.dir) {
            Ok(volume) if volume.total == 0 => {
                if !std::mem::replace(&mut self.warned.no_size, true) {
                    tracing::warn!("{}: the volume reports no size now (remounted without a size limit?); the free-space line is not held while it does (this warning is given once)", self.label());
                }
                None
            }
            Ok(volume) => Some(volume),
            Err(e) => {
                if !std::mem::replace(&mut self.warned.statvfs, true) {
                    tracing::warn!("{}: cannot measure the volume's free space ({e}); the free-space line is not held meanwhile (this warning is given once)", self.label());
                }
                None
            }
        }
    }

    pub(super) fn back_above(&mut self, kept: &mut FreeSpace) {
        if kept.short_since_unix_ms.take().is_some() {
            tracing::info!(
                "{}: the volume is back above its lines ({})",
                self.label(),
                describe_volume(kept)
            );
            self.dirty = true;
        }
    }

    pub(super) fn nothing_to_evict(&mut self, kept: &mut FreeSpace) {
        if kept.short_since_unix_ms.is_none() {
            kept.short_since_unix_ms = Some(unix_ms());
            kept.shortages += 1;
            let left = match self.tracker.len() {
                0 => String::new(),
                n => format!(
                    " that would free anything: its {n} objects left have other hard links, which keep their blocks"
                ),
            };
            tracing::warn!(
                "{}: {} and the tier holds nothing more to evict{left}: something else fills the volume; free space there",
                self.label(),
                shortage(kept, "is below")
            );
            self.dirty = true;
        }
    }

    /// One eviction for the free space; returns the objects it deleted.
    pub(super) fn evict_for_free_space(
        &mut self,
        kept: &mut FreeSpace,
        want: Shortfall,
        buffer: &mut [u8],
    ) -> u64 {
        let before = shortage(kept, "fell below");
        let run = self.evict_freeing(want, buffer);
        if run.cycle.deleted.objects == 0 {
            return 0;
        }
        kept.evictions.add(run.cycle);
        if let Ok(volume) = volume_space(&self.dir) {
            kept.free_bytes = volume.free;
            if let Some(inodes) = &mut kept.inodes {
                inodes.free_inodes = volume.free_inodes;
            }
        }
        let passed = match run.linked_kept {
            0 => String::new(),
            n => format!(
                "; {n} objects with other hard links left in place (deleting them frees nothing)"
            ),
        };
        tracing::warn!(
            "{}: {before} (something else is filling the volume); evicted {} least recently used objects ({} freed) in {} ms; now {}, the tier {} objects, {}{passed}{}",
            self.label(),
            run.cycle.deleted.objects,
            size(run.cycle.deleted.bytes),
            run.cycle.millis,
            describe_volume(kept),
            self.tracker.len(),
            size(self.tracker.usage()),
            run.misses()
        );
        run.cycle.deleted.objects
    }
}

/// The volume's free space and inodes against their lines, for log lines:
/// `free 10.0 MiB (line 20.0 MiB), 0 free inodes (line 20)`.
pub(super) fn describe_volume(kept: &FreeSpace) -> String {
    let mut text = format!(
        "free {} (line {})",
        size(kept.free_bytes),
        size(kept.line_bytes)
    );
    if let Some(inodes) = &kept.inodes {
        let _ = write!(
            text,
            ", {} free inodes (line {})",
            inodes.free_inodes, inodes.line_inodes
        );
    }
    text
}

/// What is short on the volume, for log lines: `the volume's free space
/// 1.0 MiB <verb> the 2.0 MiB line`, `the volume's free inodes 0 <verb> the
/// 20 line`, or both; the free space when neither is.
pub(super) fn shortage(kept: &FreeSpace, verb: &str) -> String {
    let space = format!(
        "the volume's free space {} {verb} the {} line",
        size(kept.free_bytes),
        size(kept.line_bytes)
    );
    let space_short = kept.free_bytes == 0 || kept.free_bytes < kept.line_bytes;
    let inodes = kept
        .inodes
        .filter(|i| i.free_inodes == 0 || i.free_inodes < i.line_inodes)
        .map(|i| {
            format!(
                "the volume's free inodes {} {verb} the {} line",
                i.free_inodes, i.line_inodes
            )
        });
    match (space_short, inodes) {
        (true, Some(inodes)) => format!("{space} and {inodes}"),
        (false, Some(inodes)) => inodes,
        (_, None) => space,
    }
}

/// Size, free space and inodes of a volume.
pub(super) struct VolumeSpace {
    /// Blocks x fragment size, in bytes.
    pub(super) total: u64,
    /// Blocks available to an unprivileged writer x fragment size, in
    /// bytes, as the launch's sizing measures free space.
    pub(super) free: u64,
    /// Inodes (`f_files`); 0 on a volume that reports none.
    pub(super) inodes: u64,
    /// Inodes available to an unprivileged writer (`f_favail`).
    pub(super) free_inodes: u64,
}

/// The size, free space and inodes of the volume that holds `dir`.
pub(super) fn volume_space(dir: &TierDir) -> nix::Result<VolumeSpace> {
    let st = nix::sys::statvfs::fstatvfs(dir.fd())?;
    let fragment = st.fragment_size() as u64;
    Ok(VolumeSpace {
        total: (st.blocks() as u64).saturating_mul(fragment),
        free: (st.blocks_available() as u64).saturating_mul(fragment),
        inodes: st.files() as u64,
        free_inodes: st.files_available() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn below_the_line_a_cycle_covers_the_deficit_and_at_least_a_regular_cycle() {
        let bytes = |free, line, cycle| shortfall(free, line, None, cycle).map(|s| s.bytes);
        assert_eq!(bytes(300 * MIB, 200 * MIB, 50 * MIB), None);
        assert_eq!(bytes(200 * MIB, 200 * MIB, 50 * MIB), None);
        assert_eq!(bytes(190 * MIB, 200 * MIB, 50 * MIB), Some(50 * MIB));
        assert_eq!(bytes(100 * MIB, 200 * MIB, 50 * MIB), Some(100 * MIB));
        // A full volume: stores fail whatever the line.
        assert_eq!(bytes(0, 200 * MIB, 50 * MIB), Some(200 * MIB));
        assert_eq!(bytes(0, 0, 50 * MIB), Some(50 * MIB));
        assert_eq!(bytes(1, 0, 50 * MIB), None);
    }

    #[test]
    fn below_the_inode_line_a_cycle_frees_the_inodes_missing_and_a_regular_cycle() {
        let room = 300 * MIB;
        let short = |free_inodes, line_inodes| {
            shortfall(room, 200 * MIB, Some((free_inodes, line_inodes)), 50 * MIB)
        };
        assert_eq!(short(1_000, 100), None);
        assert_eq!(short(100, 100), None);
        assert_eq!(
            short(40, 100),
            Some(Shortfall {
                bytes: 50 * MIB,
                inodes: 60
            })
        );
        // No free inode: stores fail whatever the line.
        assert_eq!(
            short(0, 0),
            Some(Shortfall {
                bytes: 50 * MIB,
                inodes: 0
            })
        );
        // Short of both.
        assert_eq!(
            shortfall(100 * MIB, 200 * MIB, Some((0, 20)), 50 * MIB),
            Some(Shortfall {
                bytes: 100 * MIB,
                inodes: 20
            })
        );
        assert_eq!(shortfall(room, 200 * MIB, Some((1, 0)), 50 * MIB), None);
    }

    #[test]
    fn the_inode_reserve_is_a_tenth_of_the_inodes_and_at_most_a_million() {
        assert_eq!(inode_reserve(0), 0);
        assert_eq!(inode_reserve(200), 20);
        assert_eq!(inode_reserve(2_097_152), 209_715);
        assert_eq!(inode_reserve(61_054_976), 1_000_000);
    }
}
