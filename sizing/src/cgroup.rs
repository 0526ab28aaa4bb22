//! The memory cgroup a process is in, and the memory limit that binds it
//! (`docs/sizing.md`, "Memory").
//!
//! Facts first: [`memory_cgroup`] and [`tightest_limit`] are pure functions
//! of the files' contents (unit-tested on recorded bodies of each layout);
//! [`crate::probe::memory`] reads the files.
//!
//! - cgroup v1 mounts the `memory` controller's hierarchy on its own
//!   (`/sys/fs/cgroup/memory`); a cgroup's limit is `memory.limit_in_bytes`,
//!   and `memory.stat` holds `hierarchical_memory_limit`, the tightest limit
//!   of the cgroup and every ancestor, those a container's cgroup namespace
//!   hides included. "No limit" is a huge sentinel (`PAGE_COUNTER_MAX` in
//!   bytes: 9223372036854771712 with 4 KiB pages).
//! - cgroup v2 mounts one tree (`cgroup2`); a cgroup's hard limit is
//!   `memory.max` and its throttle point `memory.high` (`max` in either is
//!   none). Both count: above `memory.high` the kernel throttles the cgroup
//!   and reclaims from it at every allocation, so a cache sized above it
//!   would stall the server rather than serve it. A child cannot get more
//!   than its ancestors allow, so every level up to the mount's root is
//!   read.
//! - A hybrid host mounts both: the memory controller is then bound to its
//!   v1 hierarchy (the v2 tree has none), so a process with a v1 `memory`
//!   line in `/proc/<pid>/cgroup` is read through v1.

use std::path::{Path, PathBuf};

use crate::mountinfo::unescape_octal;

/// The cgroup version whose memory controller holds a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// cgroup v1: the `memory` controller's own hierarchy.
    V1,
    /// cgroup v2: the unified tree.
    V2,
}

/// Where a process's memory cgroup is in this mount namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryCgroup {
    /// The cgroup's directory (`<mount point>/<path below the mount's
    /// root>`).
    pub dir: PathBuf,
    /// The mount point of its hierarchy: the topmost directory this
    /// namespace shows.
    pub mount_point: PathBuf,
    /// Which hierarchy.
    pub version: CgroupVersion,
}

/// Why a process's memory cgroup cannot be found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CgroupError {
    /// `/proc/<pid>/cgroup` names neither a v1 `memory` cgroup nor a v2
    /// one.
    #[error("the process's /proc/<pid>/cgroup names no memory cgroup")]
    NoMemoryCgroup,
    /// The process has a cgroup of that version, but no mount of it here
    /// shows that cgroup.
    #[error("no {what} mount in /proc/self/mountinfo shows the process's cgroup {cgroup}")]
    NotMounted {
        /// `cgroup v1 memory controller` or `cgroup2`.
        what: &'static str,
        /// The cgroup's path, as `/proc/<pid>/cgroup` gives it.
        cgroup: String,
    },
}

/// The memory cgroup of the process whose `/proc/<pid>/cgroup` is
/// `proc_cgroup`, found through the mounts of `mountinfo`
/// (`/proc/self/mountinfo`; fields: id, parent, major:minor, root, mount
/// point, options, optional fields, `-`, type, source, super options).
///
/// A v1 `memory` line (`<id>:<controllers>:<path>` whose controllers include
/// `memory`) wins over the v2 line (`0::<path>`): on a hybrid host the
/// memory controller is the v1 one. The cgroup's directory is the mount
/// point of the first mount of that hierarchy whose root holds the path,
/// with the root taken off the path (a mount of `/docker/abc` shows the
/// cgroup `/docker/abc/x` as `<mount point>/x`).
///
/// # Errors
/// [`CgroupError::NoMemoryCgroup`] or [`CgroupError::NotMounted`].
pub fn memory_cgroup(proc_cgroup: &str, mountinfo: &str) -> Result<MemoryCgroup, CgroupError> {
    let mut v1 = None;
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        } else if id == "0" && controllers.is_empty() {
            v2 = Some(path);
        }
    }
    let (cgroup, version) = match (v1, v2) {
        (Some(path), _) => (path, CgroupVersion::V1),
        (None, Some(path)) => (path, CgroupVersion::V2),
        (None, None) => return Err(CgroupError::NoMemoryCgroup),
    };
    let what = match version {
        CgroupVersion::V1 => "cgroup v1 memory controller",
        CgroupVersion::V2 => "cgroup2",
    };
    mountinfo
        .lines()
        .filter_map(Mount::parse)
        .filter(|m| match version {
            CgroupVersion::V1 => {
                m.fs_type == "cgroup" && m.super_options.split(',').any(|o| o == "memory")
            }
            CgroupVersion::V2 => m.fs_type == "cgroup2",
        })
        .find_map(|m| {
            Some(MemoryCgroup {
                dir: m.directory_of(cgroup)?,
                mount_point: PathBuf::from(&m.mount_point),
                version,
            })
        })
        .ok_or_else(|| CgroupError::NotMounted {
            what,
            cgroup: cgroup.to_string(),
        })
}

/// One line of `/proc/self/mountinfo`, the fields used here.
struct Mount<'a> {
    /// The mount's root within its filesystem (escapes undone).
    root: String,
    /// Where it is mounted (escapes undone).
    mount_point: String,
    fs_type: &'a str,
    super_options: &'a str,
}

impl<'a> Mount<'a> {
    fn parse(line: &'a str) -> Option<Mount<'a>> {
        let (head, tail) = line.split_once(" - ")?;
        let mut head = head.split(' ');
        let root = unescape_octal(head.nth(3)?);
        let mount_point = unescape_octal(head.next()?);
        let mut tail = tail.split(' ');
        let fs_type = tail.next()?;
        let super_options = tail.nth(1).unwrap_or("");
        Some(Mount {
            root,
            mount_point,
            fs_type,
            super_options,
        })
    }

    /// The directory of `cgroup` under this mount, when its root holds it.
    fn directory_of(&self, cgroup: &str) -> Option<PathBuf> {
        let root = self.root.trim_end_matches('/');
        let below = match cgroup.strip_prefix(root) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
            _ => return None,
        };
        Some(Path::new(&self.mount_point).join(below.trim_start_matches('/')))
    }
}

/// A memory limit in bytes and the file it was read from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryLimit {
    /// The limit, in bytes.
    pub bytes: u64,
    /// The file that holds it (`.../memory.max`, `.../memory.high`,
    /// `.../memory.limit_in_bytes`, or `.../memory.stat` for v1's
    /// `hierarchical_memory_limit`).
    pub file: PathBuf,
}

/// Values at or above this are cgroup v1's "no limit" (the sentinel is
/// `PAGE_COUNTER_MAX` pages in bytes, just under 2^63, whatever the page
/// size): 2^62 bytes, far above any machine's memory.
pub const V1_NO_LIMIT_FROM: u64 = 1 << 62;

/// The tightest memory limit on `cgroup` and its ancestors up to its mount
/// point, reading each file with `read` (`None`: missing or unreadable, no
/// limit there); `None` when nothing limits it. See the module docs for
/// the files of each version.
pub fn tightest_limit(
    cgroup: &MemoryCgroup,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<MemoryLimit> {
    let mut found: Vec<MemoryLimit> = Vec::new();
    let limit = |file: PathBuf, text: Option<String>| {
        let bytes = text?.trim().parse::<u64>().ok()?;
        (bytes < V1_NO_LIMIT_FROM).then_some(MemoryLimit { bytes, file })
    };
    let files: &[&str] = match cgroup.version {
        CgroupVersion::V1 => &["memory.limit_in_bytes"],
        CgroupVersion::V2 => &["memory.max", "memory.high"],
    };
    for dir in cgroup
        .dir
        .ancestors()
        .take_while(|dir| dir.starts_with(&cgroup.mount_point))
    {
        for name in files {
            let file = dir.join(name);
            let text = read(&file);
            found.extend(limit(file, text));
        }
    }
    if cgroup.version == CgroupVersion::V1 {
        let stat = cgroup.dir.join("memory.stat");
        let hierarchical = read(&stat).and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("hierarchical_memory_limit "))
                .map(str::to_string)
        });
        found.extend(limit(stat, hierarchical));
    }
    // The first of the tightest: the deepest level names its own file.
    found
        .into_iter()
        .reduce(|a, b| if b.bytes < a.bytes { b } else { a })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Recorded on this project's cgroup v1 host (Linux 6.18), which also
    /// mounts an empty cgroup2 tree at `/sys/fs/cgroup/unified`: a hybrid.
    const HYBRID_MOUNTINFO: &str = "\
23 1 253:0 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_CGROUP: &str = "\
9:name=systemd:/
4:memory:/process_api/28a7297c/node
1:cpu:/
0::/
";
    const NO_LIMIT_V1: &str = "9223372036854771712";

    /// A pure v2 host with a container's cgroup namespace: the mount's root
    /// is the container's cgroup.
    const V2_MOUNTINFO: &str = "\
1000 990 0:60 /kubepods/pod1/ctr /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw,nsdelegate
";

    fn files(pairs: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let map: HashMap<PathBuf, String> = pairs
            .iter()
            .map(|(p, v)| (PathBuf::from(p), v.to_string()))
            .collect();
        move |path| map.get(path).cloned()
    }

    #[test]
    fn v1_a_parent_that_holds_the_limit_binds_the_child() {
        let cgroup = memory_cgroup(HYBRID_CGROUP, HYBRID_MOUNTINFO).unwrap();
        assert_eq!(
            cgroup.dir,
            Path::new("/sys/fs/cgroup/memory/process_api/28a7297c/node")
        );
        assert_eq!(cgroup.version, CgroupVersion::V1);
        let m = "/sys/fs/cgroup/memory";
        let read = files(&[
            (
                &format!("{m}/process_api/28a7297c/node/memory.limit_in_bytes"),
                NO_LIMIT_V1,
            ),
            (
                &format!("{m}/process_api/28a7297c/memory.limit_in_bytes"),
                "8589934592\n",
            ),
            (
                &format!("{m}/process_api/memory.limit_in_bytes"),
                "17179869184",
            ),
            (&format!("{m}/memory.limit_in_bytes"), NO_LIMIT_V1),
        ]);
        let limit = tightest_limit(&cgroup, read).unwrap();
        assert_eq!(limit.bytes, 8 << 30);
        assert_eq!(
            limit.file,
            Path::new("/sys/fs/cgroup/memory/process_api/28a7297c/memory.limit_in_bytes")
        );
    }

    #[test]
    fn v1_the_hierarchical_limit_covers_ancestors_a_namespace_hides() {
        let mountinfo =
            "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let cgroup = memory_cgroup("4:memory:/docker/abc\n0::/\n", mountinfo).unwrap();
        assert_eq!(cgroup.dir, Path::new("/sys/fs/cgroup/memory"));
        let stat = "cache 0\nhierarchical_memory_limit 4294967296\nhierarchical_memsw_limit 9223372036854771712\n";
        let read = files(&[
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", NO_LIMIT_V1),
            ("/sys/fs/cgroup/memory/memory.stat", stat),
        ]);
        let limit = tightest_limit(&cgroup, read).unwrap();
        assert_eq!(limit.bytes, 4 << 30);
        assert_eq!(limit.file, Path::new("/sys/fs/cgroup/memory/memory.stat"));
    }

    #[test]
    fn v1_no_limit_anywhere_is_none() {
        let cgroup = memory_cgroup(HYBRID_CGROUP, HYBRID_MOUNTINFO).unwrap();
        let stat = "hierarchical_memory_limit 9223372036854771712\n";
        let read = files(&[
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", NO_LIMIT_V1),
            (
                "/sys/fs/cgroup/memory/process_api/28a7297c/node/memory.stat",
                stat,
            ),
        ]);
        assert_eq!(tightest_limit(&cgroup, read), None);
    }

    #[test]
    fn v2_every_level_and_memory_high_count_and_max_is_none() {
        let cgroup = memory_cgroup("0::/kubepods/pod1/ctr/node\n", V2_MOUNTINFO).unwrap();
        assert_eq!(cgroup.dir, Path::new("/sys/fs/cgroup/node"));
        assert_eq!(cgroup.version, CgroupVersion::V2);
        let read = files(&[
            ("/sys/fs/cgroup/node/memory.max", "max\n"),
            ("/sys/fs/cgroup/node/memory.high", "max\n"),
            ("/sys/fs/cgroup/memory.max", "8589934592\n"),
            ("/sys/fs/cgroup/memory.high", "6442450944\n"),
        ]);
        let limit = tightest_limit(&cgroup, read).unwrap();
        assert_eq!(limit.bytes, 6 << 30);
        assert_eq!(limit.file, Path::new("/sys/fs/cgroup/memory.high"));
        let unlimited = files(&[("/sys/fs/cgroup/node/memory.max", "max\n")]);
        assert_eq!(tightest_limit(&cgroup, unlimited), None);
    }

    #[test]
    fn a_hybrid_host_reads_memory_through_v1_and_a_missing_mount_is_named() {
        let cgroup = memory_cgroup(HYBRID_CGROUP, HYBRID_MOUNTINFO).unwrap();
        assert_eq!(cgroup.version, CgroupVersion::V1);
        let v2_only = memory_cgroup("0::/a\n", HYBRID_MOUNTINFO).unwrap();
        assert_eq!(v2_only.dir, Path::new("/sys/fs/cgroup/unified/a"));
        assert_eq!(
            memory_cgroup("1:cpu:/\n", HYBRID_MOUNTINFO),
            Err(CgroupError::NoMemoryCgroup)
        );
        assert!(matches!(
            memory_cgroup("4:memory:/x\n", "41 31 0:38 / /u rw - cgroup2 cgroup2 rw\n"),
            Err(CgroupError::NotMounted { .. })
        ));
    }
}
