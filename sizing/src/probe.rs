//! Host probes that feed the sizing rules: volume statistics, memory,
//! physical cores, and the O_DIRECT test write.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::cgroup;
use crate::mountinfo::unescape_octal;
use crate::rules::{MemoryFacts, OdirectProbe, VolumeStats, ODIRECT_ALIGN_BYTES};
use crate::volume::Filesystem;

/// Reads the statistics of the volume that holds `path` (statvfs).
///
/// Errors: the `statvfs` error for `path` (it must exist).
pub fn volume_stats(path: &Path) -> io::Result<VolumeStats> {
    let st = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
    let frag = st.fragment_size() as u64;
    Ok(VolumeStats {
        total_bytes: (st.blocks() as u64).saturating_mul(frag),
        free_bytes: (st.blocks_available() as u64).saturating_mul(frag),
        block_size: st.block_size() as u64,
    })
}

/// The type, mount source and read-only flag of the filesystem that holds
/// `path` (which must exist): the type and source from the
/// `/proc/self/mountinfo` entry of the path's device, else the type from
/// statfs `f_type` (btrfs subvolumes, for one, report a device of their
/// own) and no source.
///
/// Errors: the `statvfs`, `stat` or `statfs` error for `path`.
pub fn filesystem(path: &Path) -> io::Result<Filesystem> {
    use std::os::unix::fs::MetadataExt;
    let flags = nix::sys::statvfs::statvfs(path)
        .map_err(io::Error::from)?
        .flags();
    let dev = fs::metadata(path)?.dev();
    let device = format!("{}:{}", libc::major(dev), libc::minor(dev));
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let (fs_type, source) = match mount_entry(&table, &device) {
        Some(entry) => entry,
        None => {
            let magic = nix::sys::statfs::statfs(path)
                .map_err(io::Error::from)?
                .filesystem_type();
            (magic_name(magic.0 as u64), None)
        }
    };
    Ok(Filesystem {
        fs_type,
        read_only: flags.contains(nix::sys::statvfs::FsFlags::ST_RDONLY),
        source,
        own_volume: whole_filesystem_at(&table, path, &device),
    })
}

/// Whether `path` is the mount point of a whole filesystem on `device`
/// (`major:minor`): the last entry of the mountinfo `table` mounted there
/// has the root `/` (a bind mount of a directory has that directory as its
/// root).
fn whole_filesystem_at(table: &str, path: &Path, device: &str) -> bool {
    let Ok(path) = path.canonicalize() else {
        return false;
    };
    table
        .lines()
        .map(|line| line.split(' ').collect::<Vec<_>>())
        .rfind(|fields| fields.len() > 4 && Path::new(&unescape_octal(fields[4])) == path)
        .is_some_and(|fields| fields[2] == device && fields[3] == "/")
}

/// The filesystem type and mount source of the last entry of the mountinfo
/// `table` for `device` (`major:minor`; fields: id, parent, major:minor,
/// root, mount point, options, optional fields, `-`, type, source, super
/// options).
fn mount_entry(table: &str, device: &str) -> Option<(String, Option<String>)> {
    table
        .lines()
        .filter(|line| line.split(' ').nth(2) == Some(device))
        .filter_map(|line| {
            let mut tail = line.split(" - ").nth(1)?.split(' ');
            let fs_type = tail.next()?.to_string();
            let source = tail.next().map(unescape_octal);
            Some((fs_type, source))
        })
        .next_back()
}

/// A name for a statfs magic number (`linux/magic.h`).
fn magic_name(magic: u64) -> String {
    let name = match magic {
        0xEF53 => "ext2/ext3/ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x2FC1_2FC1 => "zfs",
        0x0102_1994 => "tmpfs",
        0x8584_58F6 => "ramfs",
        0x794C_7630 => "overlay",
        0x6573_5546 => "fuse",
        0x6969 => "nfs",
        0xFF53_4D42 => "cifs",
        0xFE53_4D42 => "smb2",
        0x0102_1997 => "9p",
        0x00C3_6400 => "ceph",
        0x7371_7368 => "squashfs",
        0x9FA0 => "proc",
        0x6265_6572 => "sysfs",
        0x6367_7270 => "cgroup2",
        _ => return format!("unknown (statfs magic {magic:#x})"),
    };
    name.to_string()
}

/// The host's RAM and the tightest memory limit of this process's cgroup
/// and its ancestors (cgroup v1, v2 or hybrid, found from
/// `/proc/self/cgroup` and `/proc/self/mountinfo`; [`crate::cgroup`]), for
/// [`crate::rules::memory`]. A process whose memory cgroup cannot be found
/// has no limit read.
///
/// # Errors
/// The host's RAM cannot be read (`sysinfo`).
pub fn memory() -> io::Result<MemoryFacts> {
    let info = nix::sys::sysinfo::sysinfo().map_err(io::Error::from)?;
    let read = |path: &Path| fs::read_to_string(path).ok();
    let cgroup_limit = read(Path::new("/proc/self/cgroup"))
        .zip(read(Path::new("/proc/self/mountinfo")))
        .and_then(|(cgroup, mounts)| cgroup::memory_cgroup(&cgroup, &mounts).ok())
        .and_then(|cgroup| cgroup::tightest_limit(&cgroup, read));
    Ok(MemoryFacts {
        ram_bytes: info.ram_total(),
        cgroup_limit,
    })
}

/// Number of physical cores of the host (hyper-threads of one core count once).
pub fn physical_cores() -> u32 {
    u32::try_from(num_cpus::get_physical()).unwrap_or(u32::MAX)
}

/// Name of the probe file [`probe_odirect`] creates (and removes) under the
/// cache directory; housekeeping treats it as a temp file of ours.
pub const ODIRECT_PROBE_FILE: &str = ".erebine-odirect-probe";

/// Tries one O_DIRECT write of an aligned 4096-byte buffer to a probe file
/// under `dir`, then removes the file. The outcome says which call failed
/// and with which error.
pub fn probe_odirect(dir: &Path) -> OdirectProbe {
    let path = dir.join(format!("{ODIRECT_PROBE_FILE}.{}", std::process::id()));
    let outcome = write_direct(&path);
    let _ = fs::remove_file(&path);
    match outcome {
        Ok(()) => OdirectProbe::Succeeded,
        Err(refused) => refused,
    }
}

fn write_direct(path: &Path) -> Result<(), OdirectProbe> {
    use std::io::Write;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| {
            let why = format!("open with O_DIRECT: {e}");
            match e.raw_os_error() {
                Some(libc::EACCES | libc::EPERM | libc::EROFS) => OdirectProbe::NotWritable(why),
                _ => refused(&e, why),
            }
        })?;
    let len = ODIRECT_ALIGN_BYTES as usize;
    let buf = AlignedBuf::new(len);
    file.write_all(buf.as_slice())
        .map_err(|e| refused(&e, format!("aligned 4096-byte write: {e}")))?;
    file.sync_all()
        .map_err(|e| refused(&e, format!("fsync: {e}")))
}

/// A failed step of the test: a full volume (or quota) says nothing about
/// O_DIRECT; anything else is the filesystem refusing it.
fn refused(e: &std::io::Error, why: String) -> OdirectProbe {
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => OdirectProbe::VolumeFull(why),
        _ => OdirectProbe::Failed(why),
    }
}

/// A zeroed buffer aligned to its own length (a power of two), as
/// O_DIRECT needs.
pub(crate) struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl AlignedBuf {
    pub(crate) fn new(len: usize) -> Self {
        let layout = Layout::from_size_align(len, len).expect("power-of-two length");
        // SAFETY: layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, layout }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of layout.size() zeroed bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of layout.size() bytes, borrowed
        // mutably through self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_stats_of_a_temp_dir_are_plausible() {
        let dir = tempfile::tempdir().unwrap();
        let v = volume_stats(dir.path()).unwrap();
        assert!(v.total_bytes > 0);
        assert!(v.free_bytes <= v.total_bytes);
        assert!(v.block_size > 0);
    }

    #[test]
    fn volume_stats_of_a_missing_path_is_an_error() {
        assert!(volume_stats(Path::new("/nonexistent/erebine/probe")).is_err());
    }

    #[test]
    fn odirect_probe_leaves_no_file_behind() {
        let dir = tempfile::tempdir().unwrap();
        let _ = probe_odirect(dir.path());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn odirect_probe_on_a_full_volume_says_so_and_not_that_odirect_failed() {
        let tmp = tempfile::tempdir().unwrap();
        let volume = lmcache_tier_e2e::Tmpfs::mount(&tmp.path().join("volume"), 1024);
        volume.fill(&volume.path().join("filler"), u64::MAX);
        match probe_odirect(volume.path()) {
            OdirectProbe::VolumeFull(why) => assert!(why.contains("No space left"), "{why}"),
            other => panic!("a full volume: {other:?}"),
        }
    }

    #[test]
    fn odirect_probe_in_a_missing_dir_fails_with_the_open_error() {
        match probe_odirect(Path::new("/nonexistent/erebine")) {
            OdirectProbe::Failed(why) => assert!(why.starts_with("open with O_DIRECT"), "{why}"),
            OdirectProbe::NotWritable(why) => {
                panic!("a missing directory is no permission problem: {why}")
            }
            OdirectProbe::VolumeFull(why) => panic!("a missing directory is no full volume: {why}"),
            OdirectProbe::Succeeded => panic!("a write into a missing directory cannot succeed"),
        }
    }

    #[test]
    fn the_filesystem_of_a_temp_dir_and_of_proc_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let here = filesystem(dir.path()).unwrap();
        assert!(
            !here.fs_type.is_empty() && !here.fs_type.starts_with("unknown"),
            "{here:?}"
        );
        assert!(!here.read_only);
        assert_eq!(filesystem(Path::new("/proc")).unwrap().fs_type, "proc");
    }

    /// A tmpfs mounted on a directory is a volume of its own there, not
    /// below it; a bind mount of one of its directories is not (needs
    /// root to mount; skipped otherwise).
    #[test]
    fn a_mount_point_of_a_whole_filesystem_is_a_volume_of_its_own() {
        let t = tempfile::tempdir().unwrap();
        assert!(!filesystem(t.path()).unwrap().own_volume);
        let (disk, bind) = (t.path().join("disk"), t.path().join("bind"));
        fs::create_dir_all(&disk).unwrap();
        fs::create_dir_all(&bind).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
            .arg(&disk)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: cannot mount a tmpfs (needs root)");
            return;
        }
        fs::create_dir_all(disk.join("sub")).unwrap();
        let bound = std::process::Command::new("mount")
            .arg("--bind")
            .arg(disk.join("sub"))
            .arg(&bind)
            .status()
            .unwrap();
        let own = filesystem(&disk).unwrap().own_volume;
        let below = filesystem(&disk.join("sub")).unwrap().own_volume;
        let of_bind = filesystem(&bind).unwrap().own_volume;
        let _ = std::process::Command::new("umount").arg(&bind).status();
        let _ = std::process::Command::new("umount").arg(&disk).status();
        assert!(bound.success());
        assert!(own, "the mount point of a tmpfs");
        assert!(!below, "a directory below the mount point");
        assert!(!of_bind, "a bind mount of a directory");
    }

    #[test]
    fn the_source_of_dev_shm_is_named() {
        let shm = filesystem(Path::new("/dev/shm")).unwrap();
        assert_eq!(shm.fs_type, "tmpfs");
        assert!(shm.source.is_some(), "{shm:?}");
    }

    #[test]
    fn statfs_magic_numbers_have_names() {
        assert_eq!(magic_name(0x0102_1994), "tmpfs");
        assert_eq!(magic_name(0x6573_5546), "fuse");
        assert_eq!(magic_name(0x1234), "unknown (statfs magic 0x1234)");
    }

    #[test]
    fn memory_and_cores_are_positive() {
        assert!(crate::rules::memory(&memory().unwrap()).value > 0);
        assert!(physical_cores() > 0);
    }
}
