//! LMCache's `raw_block` tiers: the device each names, measured once with
//! the other facts ([`measure`]), and what the plan says of it
//! ([`warning`]). The device and its size reach the plan's JSON, the
//! launch's metrics and `inspect` (which reads the running server's own
//! account, `RawBlockCore.report_status`).
//!
//! Source: LMCache 0.5.6's `RawBlockL2AdapterConfig` (`device_path`: a raw
//! device or a pre-sized file, or with `use_uring_cmd` an NVMe generic
//! character device, written through its Rust raw-block extension, which
//! [`crate::plan::server_python::RAW_BLOCK_IO`] checks) and
//! `RawBlockCore._ensure_capacity_and_layout` (a device no larger than its
//! metadata region is refused at start).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use lmcache_tier_spec::{Cascade, TierSpec};
use serde::{Deserialize, Serialize};

/// What a `raw_block` tier's `device_path` is on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// A block device: the tier's size is the device's.
    Block,
    /// A regular file, pre-sized: the tier's size is its length.
    File,
    /// A character device: what LMCache takes with `use_uring_cmd` (an
    /// NVMe generic namespace, `/dev/ng<ctrl>n<ns>`, which it checks
    /// itself); its size is not read.
    Char,
    /// Nothing is there.
    Missing,
    /// Something else (a directory, a FIFO, a socket), or a path this
    /// process cannot `stat`.
    Other,
}

/// The device of one `raw_block` tier, as measured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierDevice {
    /// The tier's position in the cascade (0 first).
    pub position: usize,
    /// Its `device_path`, as written.
    pub device_path: PathBuf,
    /// What is at that path.
    pub kind: DeviceKind,
    /// Its size in bytes: a block device's (`/sys/dev/block/<major>:<minor>/size`,
    /// in 512-byte sectors), a file's length; `None` otherwise.
    pub size_bytes: Option<u64>,
    /// What else uses a block device, each in words: a mount of it or of
    /// one of its partitions (`/proc/self/mountinfo`), a holder of it or of
    /// a partition (its sysfs `holders`: LVM, md, dm-crypt). Empty for a
    /// device nothing else uses, and for what is not a block device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_use: Vec<String>,
    /// It is the character device `/dev/null` (1:3) or `/dev/zero` (1:5),
    /// under whatever name.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sink: bool,
}

/// The device of every `raw_block` tier of `cascade` that names one
/// (`device_path`), read without opening it (a `stat`, and sysfs for a
/// block device's size).
pub fn measure(cascade: &Cascade) -> Vec<TierDevice> {
    let tiers = cascade.tiers().iter().enumerate();
    tiers
        .filter_map(|(position, tier)| {
            let path = Path::new(tier.device_path()?);
            let (kind, size_bytes) = what_is_at(path);
            let rdev = std::fs::metadata(path).map(|m| m.rdev()).ok();
            let in_use = match (kind, rdev) {
                (DeviceKind::Block, Some(rdev)) => users_of(rdev),
                _ => Vec::new(),
            };
            let sink = kind == DeviceKind::Char
                && rdev.is_some_and(|r| libc::major(r) == 1 && matches!(libc::minor(r), 3 | 5));
            Some(TierDevice {
                position,
                device_path: path.to_path_buf(),
                kind,
                size_bytes,
                in_use,
                sink,
            })
        })
        .collect()
}

/// What else uses the block device `rdev`, from this process's mount table
/// and the device's sysfs directory ([`in_use`]).
fn users_of(rdev: u64) -> Vec<String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    in_use(
        &format!("{major}:{minor}"),
        &mountinfo,
        Path::new(&format!("/sys/dev/block/{major}:{minor}")),
    )
}

/// What uses the block device numbered `devnum` (`major:minor`), whose
/// sysfs directory is `sys`: each mount in `mountinfo` (the kernel's
/// `/proc/<pid>/mountinfo`, whose third field is the device's number) of
/// it or of a partition of it (a subdirectory of `sys` with a `partition`
/// file, numbered by its `dev` file), and each entry of the `holders`
/// directory of it or of a partition. In words, for the plan's refusal.
pub fn in_use(devnum: &str, mountinfo: &str, sys: &Path) -> Vec<String> {
    let mut parts = vec![(devnum.to_string(), None, sys.to_path_buf())];
    for entry in std::fs::read_dir(sys).into_iter().flatten().flatten() {
        let dir = entry.path();
        if !dir.join("partition").is_file() {
            continue;
        }
        let Ok(number) = std::fs::read_to_string(dir.join("dev")) else {
            continue;
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        parts.push((number.trim().to_string(), Some(name), dir));
    }
    let mut found = Vec::new();
    for (number, name, dir) in &parts {
        let what = name
            .as_ref()
            .map_or_else(|| "it".to_string(), |n| format!("its partition {n}"));
        for line in mountinfo.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.get(2) == Some(&number.as_str()) {
                found.push(format!(
                    "{what} is mounted at {}",
                    fields.get(4).unwrap_or(&"?")
                ));
            }
        }
        for holder in std::fs::read_dir(dir.join("holders"))
            .into_iter()
            .flatten()
            .flatten()
        {
            found.push(format!(
                "{what} is held by {} (LVM, md, dm-crypt or another device-mapper user)",
                holder.file_name().to_string_lossy()
            ));
        }
    }
    found
}

/// The plan's refusal of a `raw_block` tier whose block device something
/// else uses ([`TierDevice::in_use`]): LMCache overwrites the device whole,
/// from its first byte, so a mounted filesystem or a volume on it would be
/// destroyed. `None` for a device nothing else uses.
pub fn refusal(device: &TierDevice) -> Option<String> {
    (!device.in_use.is_empty()).then(|| {
        format!(
            "L2 tier {} (raw_block): device_path {} is in use: {}. LMCache overwrites a raw_block device whole, from its first byte. Name a device that holds nothing (no filesystem mounted, no partition in use, no LVM or md member)",
            device.position,
            lmcache_tier_spec::shown_path(&device.device_path.display().to_string()),
            device.in_use.join("; ")
        )
    })
}

/// The kind and size of what `path` names, following a symlink (such as
/// `/dev/disk/by-id/...`) as LMCache's open would.
fn what_is_at(path: &Path) -> (DeviceKind, Option<u64>) {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (DeviceKind::Missing, None),
        Err(_) => return (DeviceKind::Other, None),
    };
    let file_type = metadata.file_type();
    if file_type.is_block_device() {
        return (DeviceKind::Block, block_device_bytes(metadata.rdev()));
    }
    if file_type.is_file() {
        return (DeviceKind::File, Some(metadata.len()));
    }
    if file_type.is_char_device() {
        return (DeviceKind::Char, None);
    }
    (DeviceKind::Other, None)
}

/// The size of the block device `rdev`, from its sysfs `size` (always in
/// 512-byte sectors, whatever the device's block size).
fn block_device_bytes(rdev: u64) -> Option<u64> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let text = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/size")).ok()?;
    text.trim().parse::<u64>().ok()?.checked_mul(512)
}

/// LMCache's default `meta_total_bytes`, the metadata region at the start
/// of a `raw_block` device (256 MiB; `RawBlockL2AdapterConfig`).
const DEFAULT_META_TOTAL_BYTES: u64 = 256 << 20;

/// The plan's WARN for the device of the `raw_block` tier `spec`: nothing
/// at the path, something LMCache cannot use as one (neither a block
/// device, a file nor a character device), or a size no larger than the
/// tier's metadata region (`meta_total_bytes`) and one `slot_bytes`, which
/// LMCache refuses at start or can store nothing in. `None` otherwise.
pub fn warning(device: &TierDevice, spec: &TierSpec) -> Option<String> {
    let number = |key: &str| {
        spec.as_object()
            .get(key)
            .and_then(serde_json::Value::as_u64)
    };
    let meta = number("meta_total_bytes").unwrap_or(DEFAULT_META_TOTAL_BYTES);
    let least = meta.saturating_add(number("slot_bytes").unwrap_or(0));
    let uring = spec
        .as_object()
        .get("use_uring_cmd")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    let what = match (device.kind, device.size_bytes) {
        _ if device.sink && !uring => "it is /dev/null or /dev/zero, which keep nothing LMCache stores (and /dev/zero reads back zeros); give use_uring_cmd only where that is meant".to_string(),
        (DeviceKind::Missing, _) => "nothing is there: LMCache will fail to open it".to_string(),
        (DeviceKind::Other, _) => "it is neither a block device nor a file (or cannot be read): LMCache will fail to open it".to_string(),
        (DeviceKind::Block | DeviceKind::File, Some(size)) if size <= least => format!(
            "it holds {size} bytes, no more than the tier's metadata region (meta_total_bytes {meta}) and one slot_bytes: LMCache refuses it at start or can store nothing"
        ),
        _ => return None,
    };
    Some(format!(
        "L2 tier {} (raw_block) names device_path {}, and {what}; name the device the tier may overwrite whole (e.g. /dev/nvme1n1), or a file pre-sized for it",
        device.position,
        lmcache_tier_spec::shown_path(&device.device_path.display().to_string())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cascade(json: &str) -> Cascade {
        Cascade::parse(json, "t").unwrap()
    }

    #[test]
    fn each_raw_block_device_is_measured_by_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("stand-in");
        std::fs::write(&file, vec![0u8; 8192]).unwrap();
        let link = dir.path().join("by-id");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let missing = dir.path().join("missing");
        let json = format!(
            r#"[{{"type":"raw_block","device_path":"{}","meta_total_bytes":4096,"slot_bytes":2048}},
                {{"type":"fs","base_path":"{}"}},
                {{"type":"raw_block","device_path":"{}","slot_bytes":2048}},
                {{"type":"raw_block","device_path":"{}"}},
                {{"type":"raw_block","device_path":"{}"}},{{"type":"raw_block"}},
                {{"type":"raw_block","device_path":"/dev/null"}},
                {{"type":"raw_block","device_path":""}}]"#,
            file.display(),
            dir.path().display(),
            link.display(),
            missing.display(),
            dir.path().display(),
        );
        let cascade = cascade(&json);
        let devices = measure(&cascade);
        let seen: Vec<(usize, DeviceKind, Option<u64>)> = devices
            .iter()
            .map(|d| (d.position, d.kind, d.size_bytes))
            .collect();
        assert_eq!(
            seen,
            [
                (0, DeviceKind::File, Some(8192)),
                (2, DeviceKind::File, Some(8192)),
                (3, DeviceKind::Missing, None),
                (4, DeviceKind::Other, None),
                (6, DeviceKind::Char, None),
            ]
        );
        let warnings: Vec<(usize, String)> = devices
            .iter()
            .filter_map(|d| Some((d.position, warning(d, &cascade.tiers()[d.position])?)))
            .collect();
        let warned: Vec<usize> = warnings.iter().map(|(p, _)| *p).collect();
        assert_eq!(warned, [2, 3, 4, 6], "{warnings:#?}");
        assert!(
            warnings[3].1.contains("/dev/null or /dev/zero"),
            "{}",
            warnings[3].1
        );
        assert!(devices.iter().all(|d| d.in_use.is_empty()));
        let small = &warnings[0].1;
        assert!(
            small.starts_with("L2 tier 2 (raw_block) names device_path ")
                && small.contains("it holds 8192 bytes, no more than the tier's metadata region (meta_total_bytes 268435456)"),
            "{small}"
        );
        assert!(
            warnings[1].1.contains("nothing is there"),
            "{}",
            warnings[1].1
        );
        assert!(
            warnings[2].1.contains("neither a block device nor a file"),
            "{}",
            warnings[2].1
        );
    }

    #[test]
    fn a_block_device_s_size_comes_from_sysfs() {
        // A loop device of a known size (as root, where loop devices can be
        // attached; elsewhere nothing to check).
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("not root: no loop device to measure");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("device.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(3 << 20)
            .unwrap();
        let attached = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&image)
            .output()
            .unwrap();
        if !attached.status.success() {
            eprintln!("no loop device here: {attached:?}");
            return;
        }
        let device = String::from_utf8(attached.stdout)
            .unwrap()
            .trim()
            .to_string();
        let measured = what_is_at(Path::new(&device));
        let json = format!(r#"[{{"type":"raw_block","device_path":"{device}"}}]"#);
        let free = measure(&cascade(&json));
        let mkfs = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", &device])
            .status()
            .unwrap();
        let mount_point = dir.path().join("mnt");
        std::fs::create_dir(&mount_point).unwrap();
        let mounted = mkfs.success()
            && std::process::Command::new("mount")
                .arg(&device)
                .arg(&mount_point)
                .status()
                .unwrap()
                .success();
        let busy = measure(&cascade(&json));
        if mounted {
            std::process::Command::new("umount")
                .arg(&mount_point)
                .status()
                .unwrap();
        }
        let detached = std::process::Command::new("losetup")
            .args(["--detach", &device])
            .status()
            .unwrap();
        assert_eq!(measured, (DeviceKind::Block, Some(3 << 20)), "{device}");
        assert!(detached.success());
        assert!(
            free[0].in_use.is_empty() && refusal(&free[0]).is_none(),
            "{free:?}"
        );
        assert!(mounted, "{device} could not be formatted and mounted");
        let refused = refusal(&busy[0]).expect("a mounted device is refused");
        assert!(
            refused.contains(&format!(
                "is in use: it is mounted at {}",
                mount_point.display()
            )),
            "{refused}"
        );
    }

    /// A device's users as sysfs and the mount table show them: a mounted
    /// partition, a holder of the device (LVM), a holder of a partition
    /// (md); nothing for a device no line and no holder names.
    #[test]
    fn mounts_and_holders_of_a_device_and_its_partitions_are_found() {
        let sys = tempfile::tempdir().unwrap();
        let dev = sys.path();
        std::fs::create_dir_all(dev.join("holders")).unwrap();
        for (part, number) in [("sdb1", "8:17"), ("sdb2", "8:18")] {
            std::fs::create_dir_all(dev.join(part).join("holders")).unwrap();
            std::fs::write(dev.join(part).join("partition"), "1\n").unwrap();
            std::fs::write(dev.join(part).join("dev"), format!("{number}\n")).unwrap();
        }
        std::fs::create_dir_all(dev.join("queue")).unwrap();
        let mountinfo = "22 1 8:17 / /boot rw,relatime - ext4 /dev/sdb1 rw\n\
                         23 1 8:1 / / rw - ext4 /dev/sda1 rw\n";
        assert_eq!(
            in_use("8:16", mountinfo, dev),
            ["its partition sdb1 is mounted at /boot"]
        );
        std::fs::create_dir(dev.join("sdb2/holders/md0")).unwrap();
        std::fs::create_dir(dev.join("holders/dm-0")).unwrap();
        let found = in_use("8:16", "", dev);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().any(|f| f.starts_with("it is held by dm-0")));
        assert!(found
            .iter()
            .any(|f| f.starts_with("its partition sdb2 is held by md0")));
        let empty = tempfile::tempdir().unwrap();
        assert!(in_use("8:32", mountinfo, empty.path()).is_empty());
        assert_eq!(
            in_use("8:1", mountinfo, empty.path()),
            ["it is mounted at /"]
        );
    }
}
