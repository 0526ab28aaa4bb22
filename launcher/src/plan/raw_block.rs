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
    let what = match (device.kind, device.size_bytes) {
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
        assert_eq!(warned, [2, 3, 4], "{warnings:#?}");
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
        let detached = std::process::Command::new("losetup")
            .args(["--detach", &device])
            .status()
            .unwrap();
        assert_eq!(measured, (DeviceKind::Block, Some(3 << 20)), "{device}");
        assert!(detached.success());
    }
}
