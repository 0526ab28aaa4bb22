//! Whether the kernel OOM-killed the server, from the kernel's own record:
//! the count of OOM kills of the server's memory cgroup, read when the
//! server is spawned and again after it exits (`docs/inspect.md`, "How an
//! exit is told"). A SIGKILL alone says nothing: `kill -9`, a supervisor
//! and the OOM killer all send it.
//!
//! The kernel keeps the count in one file per memory cgroup:
//! - cgroup v1: `oom_kill` in `memory.oom_control` (Linux 4.13 and later),
//!   under the mount of the `memory` controller's hierarchy;
//! - cgroup v2: `oom_kill` in `memory.events`, under the `cgroup2` mount
//!   (it counts the cgroup and its descendants).
//!
//! A hybrid host mounts both: the memory controller is then bound to its v1
//! hierarchy and the v2 tree has no `memory.events`, so a process with a
//! v1 `memory` line in `/proc/<pid>/cgroup` is read through v1.
//!
//! Facts first: [`counter_file`] and [`oom_kill_count`] are pure functions
//! of the file contents (unit-tested on recorded bodies); [`OomBaseline`]
//! reads the files.

use std::path::{Path, PathBuf};

pub use lmcache_sizing::cgroup::CgroupVersion;
use lmcache_sizing::cgroup::{memory_cgroup, CgroupError};

/// The file in which the kernel counts the OOM kills of a process's memory
/// cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomCounterFile {
    /// `<memory mount>/<cgroup>/memory.oom_control` (v1) or
    /// `<cgroup2 mount>/<cgroup>/memory.events` (v2).
    pub path: PathBuf,
    /// Which of the two it is.
    pub version: CgroupVersion,
}

/// Why the OOM-kill count of a process's cgroup cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OomCounterError {
    /// A file under `/proc` or the cgroup file could not be read.
    #[error("cannot read {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error, in words.
        error: String,
    },
    /// The process's memory cgroup cannot be found.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// The file has no `oom_kill` line (cgroup v1 before Linux 4.13).
    #[error("{} has no oom_kill line", .path.display())]
    NoCount {
        /// The file.
        path: PathBuf,
    },
}

/// The file that counts OOM kills for the process whose `/proc/<pid>/cgroup`
/// is `proc_cgroup`, found through the mounts of `mountinfo`
/// ([`lmcache_sizing::cgroup::memory_cgroup`]): `memory.oom_control` in its
/// v1 memory cgroup, else `memory.events` in its v2 one.
///
/// # Errors
/// [`OomCounterError::Cgroup`]: no memory cgroup, or none mounted here.
pub fn counter_file(proc_cgroup: &str, mountinfo: &str) -> Result<OomCounterFile, OomCounterError> {
    let cgroup = memory_cgroup(proc_cgroup, mountinfo)?;
    let file = match cgroup.version {
        CgroupVersion::V1 => "memory.oom_control",
        CgroupVersion::V2 => "memory.events",
    };
    Ok(OomCounterFile {
        path: cgroup.dir.join(file),
        version: cgroup.version,
    })
}

/// The `oom_kill` count in the contents of a `memory.oom_control` (v1:
/// `oom_kill_disable 0`, `under_oom 0`, `oom_kill N`) or a `memory.events`
/// (v2: `low`, `high`, `max`, `oom`, `oom_kill N`, `oom_group_kill`):
/// both are `key value` lines. `None` without such a line.
pub fn oom_kill_count(contents: &str) -> Option<u64> {
    contents.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == "oom_kill").then(|| value.trim().parse().ok())?
    })
}

/// What the OOM-kill count of the server's cgroup says about one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OomReading {
    /// The count rose while the server ran: the kernel OOM-killed a process
    /// of its memory cgroup.
    Rose {
        /// The counter file.
        file: PathBuf,
        /// The count at the spawn.
        before: u64,
        /// The count after the exit.
        after: u64,
    },
    /// The count did not move: the kernel OOM-killed nothing there.
    Unchanged {
        /// The counter file.
        file: PathBuf,
        /// The count.
        count: u64,
    },
    /// The count could not be read at the spawn or after the exit.
    Unreadable {
        /// Why, in words.
        why: String,
    },
}

/// The reading of a run from the counts at its spawn and after its exit. A
/// count that fell belongs to another cgroup than the one read at the spawn
/// (removed and made again), so it tells nothing.
pub fn compare(
    file: &Path,
    before: Result<u64, OomCounterError>,
    after: Result<u64, OomCounterError>,
) -> OomReading {
    match (before, after) {
        (Err(e), _) => OomReading::Unreadable {
            why: format!("at the start: {e}"),
        },
        (_, Err(e)) => OomReading::Unreadable {
            why: format!("after the exit: {e}"),
        },
        (Ok(before), Ok(after)) if after > before => OomReading::Rose {
            file: file.to_path_buf(),
            before,
            after,
        },
        (Ok(before), Ok(after)) if after == before => OomReading::Unchanged {
            file: file.to_path_buf(),
            count: after,
        },
        (Ok(before), Ok(after)) => OomReading::Unreadable {
            why: format!(
                "oom_kill in {} fell from {before} to {after}: the cgroup was made again",
                file.display()
            ),
        },
    }
}

/// The OOM-kill count of a process's memory cgroup, read when it was
/// spawned; [`OomBaseline::after_exit`] reads it again.
#[derive(Debug, Clone)]
pub struct OomBaseline {
    file: Result<OomCounterFile, OomCounterError>,
    count: Result<u64, OomCounterError>,
}

impl OomBaseline {
    /// Reads the counter of process `pid`'s memory cgroup, from
    /// `/proc/<pid>/cgroup` and `/proc/self/mountinfo`.
    pub(crate) fn of_process(pid: u32) -> OomBaseline {
        let file = read(Path::new(&format!("/proc/{pid}/cgroup")))
            .and_then(|cgroup| counter_file(&cgroup, &read(Path::new("/proc/self/mountinfo"))?));
        let count = file.as_ref().map_err(Clone::clone).and_then(read_count);
        OomBaseline { file, count }
    }

    /// The counter file, when one was found.
    pub fn file(&self) -> Option<&OomCounterFile> {
        self.file.as_ref().ok()
    }

    /// Reads the counter again, once the process has exited, and compares.
    pub fn after_exit(&self) -> OomReading {
        match &self.file {
            Err(e) => OomReading::Unreadable {
                why: format!("at the start: {e}"),
            },
            Ok(file) => compare(&file.path, self.count.clone(), read_count(file)),
        }
    }
}

fn read(path: &Path) -> Result<String, OomCounterError> {
    std::fs::read_to_string(path).map_err(|e| OomCounterError::Read {
        path: path.to_path_buf(),
        error: e.to_string(),
    })
}

fn read_count(file: &OomCounterFile) -> Result<u64, OomCounterError> {
    oom_kill_count(&read(&file.path)?).ok_or_else(|| OomCounterError::NoCount {
        path: file.path.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded on a cgroup v1 host (Linux 6.18) that also mounts an empty
    /// cgroup2 tree at `/sys/fs/cgroup/unified`: a hybrid host.
    const HYBRID_MOUNTINFO: &str = "\
23 1 253:0 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// `/proc/<pid>/cgroup` of a process on that host.
    const HYBRID_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/process_api/bcf09b81f9e64c090afae7f4b61cc8d8
2:cpuacct:/
1:cpu:/
0::/
";

    /// A cgroup v2 host (systemd's unified layout), in the format of
    /// `proc(5)`.
    const V2_MOUNTINFO: &str = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
26 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
    const V2_CGROUP: &str = "0::/system.slice/inference.service\n";

    /// `memory.oom_control` recorded on that host after one OOM kill, and a
    /// `memory.events` in the format of the kernel's cgroup v2
    /// documentation (this host's cgroup2 tree has no memory controller).
    const V1_OOM_CONTROL: &str = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n";
    const V2_EVENTS: &str = "low 0\nhigh 0\nmax 18\noom 2\noom_kill 2\noom_group_kill 0\n";

    #[test]
    fn a_hybrid_host_is_read_through_the_v1_memory_controller() {
        let file = counter_file(HYBRID_CGROUP, HYBRID_MOUNTINFO).unwrap();
        assert_eq!(file.version, CgroupVersion::V1);
        assert_eq!(
            file.path,
            Path::new(
                "/sys/fs/cgroup/memory/process_api/bcf09b81f9e64c090afae7f4b61cc8d8/memory.oom_control"
            )
        );
        assert_eq!(oom_kill_count(V1_OOM_CONTROL), Some(1));
    }

    #[test]
    fn a_v2_host_is_read_through_memory_events() {
        let file = counter_file(V2_CGROUP, V2_MOUNTINFO).unwrap();
        assert_eq!(file.version, CgroupVersion::V2);
        assert_eq!(
            file.path,
            Path::new("/sys/fs/cgroup/system.slice/inference.service/memory.events")
        );
        assert_eq!(oom_kill_count(V2_EVENTS), Some(2));
    }

    #[test]
    fn the_memory_mount_is_found_where_it_is_mounted_and_by_its_root() {
        // Co-mounted controllers, a mount point with a space, and a mount
        // whose root is the container's own cgroup.
        let mountinfo = "\
35 31 0:32 /docker/abc /opt/cg\\040v1 rw - cgroup cgroup rw,cpu,memory
";
        let cgroup = "5:cpu,memory:/docker/abc/job\n";
        let file = counter_file(cgroup, mountinfo).unwrap();
        assert_eq!(file.path, Path::new("/opt/cg v1/job/memory.oom_control"));
        // A cgroup outside the mount's root is not shown by it.
        assert_eq!(
            counter_file("5:cpu,memory:/docker/abcd\n", mountinfo),
            Err(OomCounterError::Cgroup(CgroupError::NotMounted {
                what: "cgroup v1 memory controller",
                cgroup: "/docker/abcd".into()
            }))
        );
    }

    #[test]
    fn missing_lines_and_mounts_say_what_is_missing() {
        assert_eq!(
            counter_file("4:cpu:/\n", HYBRID_MOUNTINFO),
            Err(OomCounterError::Cgroup(CgroupError::NoMemoryCgroup))
        );
        assert!(matches!(
            counter_file(HYBRID_CGROUP, V2_MOUNTINFO),
            Err(OomCounterError::Cgroup(CgroupError::NotMounted {
                what: "cgroup v1 memory controller",
                ..
            }))
        ));
        assert!(matches!(
            counter_file(V2_CGROUP, "23 1 253:0 / / rw - ext4 /dev/vda rw\n"),
            Err(OomCounterError::Cgroup(CgroupError::NotMounted {
                what: "cgroup2",
                ..
            }))
        ));
        // cgroup v1 before Linux 4.13: no oom_kill line.
        assert_eq!(oom_kill_count("oom_kill_disable 0\nunder_oom 0\n"), None);
        assert_eq!(oom_kill_count(""), None);
        assert_eq!(oom_kill_count("oom_kill many\n"), None);
    }

    #[test]
    fn a_rise_an_unchanged_count_and_unreadable_counts_are_told_apart() {
        let file = Path::new("/cg/memory.oom_control");
        assert_eq!(
            compare(file, Ok(0), Ok(1)),
            OomReading::Rose {
                file: file.into(),
                before: 0,
                after: 1
            }
        );
        assert_eq!(
            compare(file, Ok(3), Ok(3)),
            OomReading::Unchanged {
                file: file.into(),
                count: 3
            }
        );
        let gone = OomCounterError::Read {
            path: file.into(),
            error: "No such file or directory (os error 2)".into(),
        };
        match compare(file, Ok(3), Err(gone)) {
            OomReading::Unreadable { why } => {
                assert!(why.starts_with("after the exit: cannot read /cg/"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            compare(
                file,
                Err(OomCounterError::Cgroup(CgroupError::NoMemoryCgroup)),
                Ok(1)
            ),
            OomReading::Unreadable { .. }
        ));
        assert!(matches!(
            compare(file, Ok(5), Ok(1)),
            OomReading::Unreadable { .. }
        ));
    }

    #[test]
    fn missing_files_are_unreadable_and_named() {
        let tmp = tempfile::tempdir().unwrap();
        let file = OomCounterFile {
            path: tmp.path().join("memory.oom_control"),
            version: CgroupVersion::V1,
        };
        assert!(matches!(
            read_count(&file),
            Err(OomCounterError::Read { path, .. }) if path == file.path
        ));
        std::fs::write(&file.path, "oom_kill_disable 0\nunder_oom 0\n").unwrap();
        assert_eq!(
            read_count(&file),
            Err(OomCounterError::NoCount {
                path: file.path.clone()
            })
        );
        // No such process: its /proc/<pid>/cgroup is missing.
        match OomBaseline::of_process(u32::MAX).after_exit() {
            OomReading::Unreadable { why } => {
                assert!(why.contains("/proc/4294967295/cgroup"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }
}
