//! Host probes that feed the sizing rules: volume statistics, memory,
//! physical cores, and the O_DIRECT test write.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::rules::{OdirectProbe, VolumeStats, ODIRECT_ALIGN_BYTES};
use crate::{fmt_gib, Decision};

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

/// The memory this process may use, in bytes: the host's total RAM, or the
/// cgroup v2 memory limit of this container when that is lower (a node in a
/// container must not size L1 from RAM it cannot have).
pub fn memory_bytes() -> io::Result<Decision<u64>> {
    let info = nix::sys::sysinfo::sysinfo().map_err(io::Error::from)?;
    let ram = info.ram_total();
    let limit = fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    Ok(match limit {
        Some(limit) if limit < ram => Decision::new(
            limit,
            "cgroup-limit",
            format!(
                "cgroup memory limit {} (host RAM {})",
                fmt_gib(limit),
                fmt_gib(ram)
            ),
        ),
        _ => Decision::new(ram, "host-ram", format!("host RAM {}", fmt_gib(ram))),
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
        Err(e) => OdirectProbe::Failed(e),
    }
}

fn write_direct(path: &Path) -> Result<(), String> {
    use std::io::Write;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| format!("open with O_DIRECT: {e}"))?;
    let len = ODIRECT_ALIGN_BYTES as usize;
    let buf = AlignedBuf::new(len);
    file.write_all(buf.as_slice())
        .map_err(|e| format!("aligned 4096-byte write: {e}"))?;
    file.sync_all().map_err(|e| format!("fsync: {e}"))
}

/// A zeroed buffer aligned to its own length (a power of two).
struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let layout = Layout::from_size_align(len, len).expect("power-of-two length");
        // SAFETY: layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, layout }
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of layout.size() zeroed bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
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
    fn odirect_probe_in_a_missing_dir_fails_with_the_open_error() {
        match probe_odirect(Path::new("/nonexistent/erebine")) {
            OdirectProbe::Failed(why) => assert!(why.starts_with("open with O_DIRECT"), "{why}"),
            OdirectProbe::Succeeded => panic!("a write into a missing directory cannot succeed"),
        }
    }

    #[test]
    fn memory_and_cores_are_positive() {
        assert!(memory_bytes().unwrap().value > 0);
        assert!(physical_cores() > 0);
    }
}
