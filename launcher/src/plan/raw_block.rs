//! LMCache's `raw_block` tiers: the device each names, measured once with
//! the other facts ([`measure`]), and what the plan says of it
//! ([`warning`]). The device and its size reach the plan's JSON, the
//! launch's metrics and `inspect` (which reads the running server's own
//! account, `RawBlockCore.report_status`).
//!
//! Source: LMCache 0.5.6's `RawBlockL2AdapterConfig` (`device_path`, a
//! whole block device the tier writes through its Rust raw-block
//! extension, which [`crate::plan::server_python::RAW_BLOCK_IO`] checks).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use lmcache_tier_spec::Cascade;
use serde::{Deserialize, Serialize};

/// What a `raw_block` tier's `device_path` is on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// A block device: the tier's size is the device's.
    Block,
    /// A regular file (a test stand-in for a device).
    File,
    /// Nothing is there.
    Missing,
    /// Something else: a directory, a character device, a FIFO, or a
    /// path that cannot be read.
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
            Some(TierDevice {
                position,
                device_path: path.to_path_buf(),
                kind,
                size_bytes,
            })
        })
        .collect()
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
    (DeviceKind::Other, None)
}

/// The size of the block device `rdev`, from its sysfs `size` (always in
/// 512-byte sectors, whatever the device's block size).
fn block_device_bytes(rdev: u64) -> Option<u64> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let text = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/size")).ok()?;
    text.trim().parse::<u64>().ok()?.checked_mul(512)
}

/// The plan's WARN for a device that is not one LMCache can use as the
/// tier: nothing at the path, or something that is neither a block device
/// nor a file. `None` for a block device or a file.
pub fn warning(device: &TierDevice) -> Option<String> {
    let what = match device.kind {
        DeviceKind::Block | DeviceKind::File => return None,
        DeviceKind::Missing => "nothing is there",
        DeviceKind::Other => "it is not a block device",
    };
    Some(format!(
        "L2 tier {} (raw_block) names device_path {}, and {what}: LMCache will fail to open it; name the whole block device the tier may overwrite (e.g. /dev/nvme1n1)",
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
            r#"[{{"type":"raw_block","device_path":"{}"}},{{"type":"fs","base_path":"{}"}},
                {{"type":"raw_block","device_path":"{}"}},{{"type":"raw_block","device_path":"{}"}},
                {{"type":"raw_block","device_path":"{}"}},{{"type":"raw_block"}},
                {{"type":"raw_block","device_path":"/dev/null"}}]"#,
            file.display(),
            dir.path().display(),
            link.display(),
            missing.display(),
            dir.path().display(),
        );
        let devices = measure(&cascade(&json));
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
                (6, DeviceKind::Other, None),
            ]
        );
        let warned: Vec<usize> = devices
            .iter()
            .filter_map(|d| warning(d).map(|_| d.position))
            .collect();
        assert_eq!(warned, [3, 4, 6]);
        let text = warning(&devices[2]).unwrap();
        assert!(
            text.starts_with("L2 tier 3 (raw_block) names device_path ")
                && text.contains("nothing is there"),
            "{text}"
        );
    }

    #[test]
    fn a_block_device_s_size_comes_from_sysfs() {
        // A loop device of a known size (as root; elsewhere nothing to check).
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
        assert!(attached.status.success(), "{attached:?}");
        let device = String::from_utf8(attached.stdout)
            .unwrap()
            .trim()
            .to_string();
        let measured = what_is_at(Path::new(&device));
        let detached = std::process::Command::new("losetup")
            .args(["--detach", &device])
            .status()
            .unwrap();
        assert_eq!(measured, (DeviceKind::Block, Some(3 << 20)), "{device}");
        assert!(detached.success());
    }
}
