//! Which tiers the capacity guard bounds, and with which numbers.
//!
//! LMCache 0.5.6's `fs` adapter has no `max_capacity_gb`: it never evicts,
//! so the tier only grows. Its `fs_native` adapter counts usage from 0 at
//! every start, so a restart lets a full tier grow past its capacity (LMCache
//! 0.5.6's adapters as read from the wheel; `docs/capacity-guard.md`). The guard
//! ([`crate::Guard`]) closes both gaps from outside the server:
//!
//! - an `fs` tier with `max_capacity_gb` > 0 is evicted by the guard alone
//!   ([`GuardRole::Evictor`]), LRU, at the spec's `eviction.trigger_watermark`
//!   reclaiming `eviction.eviction_ratio` of the capacity (0.8 and 0.2 when
//!   absent, LMCache's defaults);
//! - an `fs_native` tier with `max_capacity_gb` > 0 and an `eviction` block is
//!   evicted by LMCache at its watermark on what LMCache counts; the guard is a
//!   hard bound behind it ([`GuardRole::HardBound`]) that acts only when the
//!   true usage reaches halfway between that watermark and the capacity, which
//!   after a restart (LMCache counting from 0) or on a tier other writers fill
//!   is the only thing that holds the capacity. Without an `eviction` block
//!   LMCache only counts, so the guard is the evictor, as for `fs`.
//!
//! Capacities are GiB (1024^3 bytes), as LMCache reads `max_capacity_gb`.

use std::path::{Path, PathBuf};

use serde_json::Value;

use lmcache_housekeeping::GuardBound;
use lmcache_tier_spec::capacity::{BoundKeyError, CapacityRule, GIB};
use lmcache_tier_spec::{Cascade, TierKind, TierSpec};

/// Whether the guard is a tier's only evictor ([`GuardRole::Evictor`]:
/// `fs`, or `fs_native` without an `eviction` block) or a bound behind
/// LMCache's own ([`GuardRole::HardBound`]: `fs_native` with an `eviction`
/// block); the rule is `lmcache-tier-spec`'s, shared with the bucket bound.
pub use lmcache_tier_spec::capacity::BoundRole as GuardRole;

/// A tier the guard bounds: where, how large, and when it evicts.
#[derive(Debug, Clone, PartialEq)]
pub struct GuardSpec {
    /// Position of the tier in the cascade (0-based).
    pub position: usize,
    /// The adapter type, `fs` or `fs_native`.
    pub adapter_type: String,
    /// The tier directory (`base_path`).
    pub base_path: PathBuf,
    /// `max_capacity_gb` in bytes (GiB x 1024^3, rounded down; `u64::MAX`
    /// for more than that, which no volume holds).
    pub capacity_bytes: u64,
    /// `max_capacity_gb` as written (JSON), for messages.
    pub max_capacity_gb: String,
    /// `eviction.trigger_watermark` of the spec (0.8 when absent), in (0, 1].
    pub trigger_watermark: f64,
    /// `eviction.eviction_ratio` of the spec (0.2 when absent), in (0, 1].
    pub eviction_ratio: f64,
    /// `"shared": true`: other nodes write the directory, so it is rescanned
    /// periodically besides being watched.
    pub shared: bool,
    /// Evictor or hard bound.
    pub role: GuardRole,
}

impl GuardSpec {
    /// The usage in bytes at which the guard starts an eviction cycle: the
    /// watermark times the capacity for an [`GuardRole::Evictor`], halfway
    /// from the watermark to the capacity for a [`GuardRole::HardBound`].
    pub fn trigger_bytes(&self) -> u64 {
        self.rule().trigger_bytes()
    }

    /// The usage in bytes a cycle that starts at or above the trigger ends
    /// at (or below, by whole objects): the trigger less `eviction_ratio` x
    /// capacity ([`GuardSpec::reclaim_bytes`]).
    pub fn target_bytes(&self) -> u64 {
        self.rule().target_bytes()
    }

    /// The shared capacity rule of this tier's numbers.
    fn rule(&self) -> CapacityRule {
        CapacityRule {
            capacity_bytes: self.capacity_bytes,
            trigger_watermark: self.trigger_watermark,
            eviction_ratio: self.eviction_ratio,
            role: self.role,
        }
    }

    /// When the guard evicts and where it leaves the tier, for the
    /// housekeeping that runs before it ([`lmcache_housekeeping::TierPolicy::guard`]).
    pub fn bound(&self) -> GuardBound {
        GuardBound {
            trigger_bytes: self.trigger_bytes(),
            target_bytes: self.target_bytes(),
        }
    }

    /// Bytes one eviction cycle frees when it starts at `usage_bytes`:
    /// `eviction_ratio` x capacity, or more when the usage overshot the
    /// trigger, so that a cycle always ends at or below the trigger less
    /// `eviction_ratio` x capacity (a restart on a tier far over capacity is
    /// brought back in one cycle).
    pub fn reclaim_bytes(&self, usage_bytes: u64) -> u64 {
        let rule = self.rule();
        rule.ratio_bytes()
            .max(usage_bytes.saturating_sub(rule.target_bytes()))
    }

    /// Checks the capacity against the size of the volume that holds
    /// `base_path`, or would hold it: a missing directory is measured at its
    /// nearest existing ancestor, and nothing is created (the guard creates
    /// it once the server runs). A volume that reports a size of 0 has none
    /// to compare with (a tmpfs mounted with `size=0`, ramfs, some FUSE
    /// filesystems) and passes.
    ///
    /// # Errors
    /// [`CapacityError::LargerThanVolume`]; [`CapacityError::Directory`] when
    /// the volume cannot be measured.
    pub fn check_volume(&self) -> Result<(), CapacityError> {
        let measured = nearest_existing(&self.base_path);
        let volume = volume_bytes(measured).map_err(|errno| CapacityError::Directory {
            position: self.position,
            base_path: self.base_path.display().to_string(),
            measured: measured.to_path_buf(),
            errno,
        })?;
        if !fits_volume(self.capacity_bytes, volume) {
            return Err(CapacityError::LargerThanVolume {
                position: self.position,
                base_path: self.base_path.display().to_string(),
                max_capacity_gb: self.max_capacity_gb.clone(),
                volume_gib: volume as f64 / GIB,
            });
        }
        Ok(())
    }
}

/// Whether a capacity of `capacity_bytes` fits a volume whose statistics
/// give `volume_bytes`; a volume that reports 0 bytes reports no size (a
/// tmpfs without a size limit, ramfs, a FUSE daemon with no figures), and
/// anything fits it as far as the guard can tell.
fn fits_volume(capacity_bytes: u64, volume_bytes: u64) -> bool {
    volume_bytes == 0 || capacity_bytes <= volume_bytes
}

/// `path`, or its nearest ancestor that exists (`.` when none does).
fn nearest_existing(path: &Path) -> &Path {
    path.ancestors()
        .find(|dir| dir.exists())
        .unwrap_or(Path::new("."))
}

/// The size of the volume holding the existing directory `dir`, in bytes.
fn volume_bytes(dir: &Path) -> nix::Result<u64> {
    let vfs = nix::sys::statvfs::statvfs(dir)?;
    Ok(vfs.blocks().saturating_mul(vfs.fragment_size()))
}

/// A capacity setting the guard cannot use. Each names the tier by position
/// and `base_path`, the key and the value, and says what to write.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CapacityError {
    /// A value that is not a number in range.
    #[error(
        "L2 tier {position} (base_path {base_path}): {key} = {value} is not valid: {expected}"
    )]
    Invalid {
        /// Position of the tier in the cascade (0-based).
        position: usize,
        /// Its `base_path` as written.
        base_path: String,
        /// The key at fault, e.g. `max_capacity_gb`, `eviction.eviction_ratio`.
        key: &'static str,
        /// The value as JSON.
        value: String,
        /// What to write instead.
        expected: &'static str,
    },
    /// A capacity the volume cannot hold.
    #[error("L2 tier {position} (base_path {base_path}): max_capacity_gb = {max_capacity_gb} is larger than the volume holding the directory ({volume_gib:.2} GiB): give a capacity the volume can hold, or move base_path to a larger volume")]
    LargerThanVolume {
        /// Position of the tier in the cascade (0-based).
        position: usize,
        /// Its `base_path`.
        base_path: String,
        /// The capacity asked for, in GiB, as written.
        max_capacity_gb: String,
        /// The volume's size, in GiB.
        volume_gib: f64,
    },
    /// A filesystem tier with a capacity but no `base_path`.
    #[error("L2 tier {position} ({adapter_type}) has max_capacity_gb but no \"base_path\" string: name the tier directory")]
    NoBasePath {
        /// Position of the tier in the cascade (0-based).
        position: usize,
        /// Its adapter type.
        adapter_type: String,
    },
    /// Two guarded tiers in one directory: their guards would evict from
    /// it against two capacities and race on one state file.
    #[error("L2 tiers {first} (base_path {first_base_path}) and {second} (base_path {second_base_path}) are the same directory and both have a max_capacity_gb: give each guarded tier its own base_path, or one of them no max_capacity_gb")]
    SameDirectory {
        /// Position of the first of the two tiers (0-based).
        first: usize,
        /// Its `base_path` as written.
        first_base_path: String,
        /// Position of the second.
        second: usize,
        /// Its `base_path` as written.
        second_base_path: String,
    },
    /// The volume of the directory cannot be measured.
    #[error(
        "L2 tier {position} (base_path {base_path}): statvfs of {} failed: {errno}; fix the path or its permissions",
        .measured.display()
    )]
    Directory {
        /// Position of the tier in the cascade (0-based).
        position: usize,
        /// Its `base_path`.
        base_path: String,
        /// The directory measured: `base_path`, or its nearest existing
        /// ancestor.
        measured: PathBuf,
        /// The `statvfs` error.
        errno: nix::errno::Errno,
    },
}

/// The guard's settings for every tier of `cascade` it bounds: `fs` and
/// `fs_native` tiers with `max_capacity_gb` > 0, in cascade order. Checks the
/// values, and that no two of the tiers share a directory;
/// [`GuardSpec::check_volume`] checks them against the disk.
///
/// # Errors
/// [`CapacityError::Invalid`] for a `max_capacity_gb` that is negative, not a
/// finite number, or above 0 but less than one byte, or an `eviction` block
/// whose `trigger_watermark` or `eviction_ratio` is not a number in (0, 1];
/// [`CapacityError::NoBasePath`]; [`CapacityError::SameDirectory`] for two
/// guarded tiers whose `base_path`s name one directory (compared
/// canonicalized, `/d` and `/d/` or a symlink to `/d` included).
pub fn guard_specs(cascade: &Cascade) -> Result<Vec<GuardSpec>, CapacityError> {
    specs_keyed(cascade, same_directory_key)
}

/// What [`guard_specs`] checks that needs no filesystem: the values, and
/// that no two guarded tiers' `base_path`s are one path written two ways
/// (`/d`, `/d/`, `/d/.`). Symlinks are not resolved: [`guard_specs`] finds
/// a tier named through one.
///
/// # Errors
/// As [`guard_specs`].
pub fn check_guard_keys(cascade: &Cascade) -> Result<(), CapacityError> {
    specs_keyed(cascade, lexical_directory_key).map(drop)
}

/// The guard specs of `cascade`, two of them refused when `key` gives their
/// `base_path`s the same directory key.
fn specs_keyed(
    cascade: &Cascade,
    key: fn(&Path) -> PathBuf,
) -> Result<Vec<GuardSpec>, CapacityError> {
    let mut specs: Vec<(PathBuf, GuardSpec)> = Vec::new();
    for (position, tier) in cascade.tiers().iter().enumerate() {
        if let Some(spec) = guard_spec(position, tier)? {
            let directory = key(&spec.base_path);
            if let Some((_, first)) = specs.iter().find(|(other, _)| *other == directory) {
                return Err(CapacityError::SameDirectory {
                    first: first.position,
                    first_base_path: first.base_path.display().to_string(),
                    second: spec.position,
                    second_base_path: spec.base_path.display().to_string(),
                });
            }
            specs.push((directory, spec));
        }
    }
    Ok(specs.into_iter().map(|(_, spec)| spec).collect())
}

/// `path` made absolute, without `.` components or repeated and trailing
/// slashes.
fn lexical_directory_key(path: &Path) -> PathBuf {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .components()
        .collect()
}

/// `path` canonicalized as far as it exists (symlinks resolved), the rest
/// appended without `.` components or repeated and trailing slashes: two
/// paths with equal keys name one directory.
fn same_directory_key(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(canonical) = existing.canonicalize() {
            return rest
                .iter()
                .rev()
                .fold(canonical, |key, part| key.join(part));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return absolute.components().collect(),
        }
    }
}

/// The guard's settings for one tier at `position` of its cascade: `None`
/// when the guard does not bound it (not `fs` or `fs_native`, no
/// `max_capacity_gb`, or 0). Checks the values as [`guard_specs`] does, and
/// looks at no filesystem.
///
/// # Errors
/// [`CapacityError::Invalid`] and [`CapacityError::NoBasePath`], as
/// [`guard_specs`].
pub fn guard_spec(position: usize, tier: &TierSpec) -> Result<Option<GuardSpec>, CapacityError> {
    let TierKind::Disk { native } = tier.kind() else {
        return Ok(None);
    };
    let invalid = Invalid {
        position,
        base_path: tier.base_path().unwrap_or("(none)"),
    };
    let Some(bound) = tier.bound().map_err(|e| invalid.bound_error(e))? else {
        return Ok(None);
    };
    let Some(path) = tier.base_path() else {
        return Err(CapacityError::NoBasePath {
            position,
            adapter_type: tier.adapter_type().to_string(),
        });
    };
    let role = if native && bound.eviction.is_some() {
        GuardRole::HardBound
    } else {
        GuardRole::Evictor
    };
    Ok(Some(GuardSpec {
        position,
        adapter_type: tier.adapter_type().to_string(),
        base_path: PathBuf::from(path),
        capacity_bytes: bound.capacity_bytes,
        max_capacity_gb: bound.max_capacity_gb.to_string(),
        trigger_watermark: bound.trigger_watermark,
        eviction_ratio: bound.eviction_ratio,
        shared: tier.as_object().get("shared").and_then(Value::as_bool) == Some(true),
        role,
    }))
}

/// The tier an invalid value is reported for.
struct Invalid<'a> {
    position: usize,
    base_path: &'a str,
}

impl Invalid<'_> {
    /// [`CapacityError::Invalid`] for `key` = `value`, saying `expected`.
    fn error(&self, key: &'static str, value: &Value, expected: &'static str) -> CapacityError {
        CapacityError::Invalid {
            position: self.position,
            base_path: self.base_path.to_string(),
            key,
            value: value.to_string(),
            expected,
        }
    }

    /// The guard's words for a bound the spec's keys cannot give
    /// ([`TierSpec::bound`]).
    fn bound_error(&self, error: BoundKeyError<'_>) -> CapacityError {
        match error {
            BoundKeyError::Capacity(value) => self.error(
                "max_capacity_gb",
                value,
                "a JSON number of GiB (1024^3 bytes), 0 or more, e.g. 150 (0 means no capacity)",
            ),
            BoundKeyError::TooLarge(value) => self.error(
                "max_capacity_gb",
                value,
                "less than 2^64 bytes (about 1.7e10 GiB; LMCache cannot count more): give the capacity in GiB, e.g. 150",
            ),
            BoundKeyError::UnderAByte(value) => self.error(
                "max_capacity_gb",
                value,
                "at least one byte (1e-9 GiB is about 1 byte; 0 means no capacity): give the capacity in GiB, e.g. 150",
            ),
            BoundKeyError::Block(value) => self.error(
                "eviction",
                value,
                "an object such as {\"eviction_policy\":\"LRU\",\"trigger_watermark\":0.8,\"eviction_ratio\":0.2}",
            ),
            BoundKeyError::Fraction { key, value } => {
                self.error(key, value, "a JSON number above 0 and at most 1, e.g. 0.8")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs(json: &str) -> Result<Vec<GuardSpec>, CapacityError> {
        guard_specs(&Cascade::parse(json, "V").unwrap())
    }

    #[test]
    fn only_filesystem_tiers_with_a_capacity_are_guarded() {
        let got = specs(
            r#"[{"type":"s3","max_capacity_gb":5},{"type":"fs","base_path":"/a"},
                {"type":"fs","base_path":"/b","max_capacity_gb":0},
                {"type":"fs","base_path":"/c","max_capacity_gb":1.5,"shared":true},
                {"type":"fs_native","base_path":"/d","max_capacity_gb":2,
                 "eviction":{"eviction_policy":"LRU","trigger_watermark":0.6,"eviction_ratio":0.3}},
                {"type":"fs_native","base_path":"/e","max_capacity_gb":2}]"#,
        )
        .unwrap();
        let summary: Vec<_> = got
            .iter()
            .map(|s| (s.position, s.base_path.to_str().unwrap(), s.role, s.shared))
            .collect();
        assert_eq!(
            summary,
            [
                (3, "/c", GuardRole::Evictor, true),
                (4, "/d", GuardRole::HardBound, false),
                (5, "/e", GuardRole::Evictor, false),
            ]
        );
        assert_eq!(got[0].capacity_bytes, 3 << 29);
        assert_eq!(
            (got[0].trigger_watermark, got[0].eviction_ratio),
            (0.8, 0.2)
        );
        assert_eq!(
            (got[1].trigger_watermark, got[1].eviction_ratio),
            (0.6, 0.3)
        );
    }

    #[test]
    fn watermark_arithmetic() {
        let mut spec = specs(r#"{"type":"fs","base_path":"/a","max_capacity_gb":1}"#)
            .unwrap()
            .remove(0);
        let gib = 1u64 << 30;
        assert_eq!(spec.trigger_bytes(), (0.8 * gib as f64).ceil() as u64);
        let ratio = (0.2 * gib as f64).ceil() as u64;
        assert_eq!(spec.reclaim_bytes(spec.trigger_bytes()), ratio);
        assert_eq!(
            spec.reclaim_bytes(3 * gib),
            3 * gib - (spec.trigger_bytes() - ratio),
            "an overshoot is brought back to the trigger less the ratio in one cycle"
        );
        assert_eq!(spec.target_bytes(), spec.trigger_bytes() - ratio);
        spec.role = GuardRole::HardBound;
        assert_eq!(spec.trigger_bytes(), (0.9 * gib as f64).ceil() as u64);
        // The built-in tier's bound: evicts at 0.9, leaves 0.7.
        let bound = spec.bound();
        assert_eq!(bound.trigger_bytes, spec.trigger_bytes());
        assert_eq!(bound.target_bytes, spec.trigger_bytes() - ratio);
        for usage in [spec.trigger_bytes(), gib, 2 * gib] {
            assert_eq!(
                usage - spec.reclaim_bytes(usage),
                bound.target_bytes,
                "a cycle from {usage} ends at the target"
            );
        }
    }

    #[test]
    fn bad_values_name_the_tier_the_key_and_the_value() {
        for (json, key, value) in [
            (
                r#"[{"type":"s3"},{"type":"fs","base_path":"/x","max_capacity_gb":-1}]"#,
                "max_capacity_gb",
                "-1",
            ),
            (
                r#"[{"type":"s3"},{"type":"fs","base_path":"/x","max_capacity_gb":"10"}]"#,
                "max_capacity_gb",
                "\"10\"",
            ),
            (
                r#"[{"type":"s3"},{"type":"fs","base_path":"/x","max_capacity_gb":null}]"#,
                "max_capacity_gb",
                "null",
            ),
            (
                r#"[{"type":"s3"},{"type":"fs","base_path":"/x","max_capacity_gb":1,"eviction":{"eviction_ratio":0}}]"#,
                "eviction.eviction_ratio",
                "0",
            ),
            (
                r#"[{"type":"s3"},{"type":"fs_native","base_path":"/x","max_capacity_gb":1,"eviction":{"trigger_watermark":1.5}}]"#,
                "eviction.trigger_watermark",
                "1.5",
            ),
            (
                r#"[{"type":"s3"},{"type":"fs","base_path":"/x","max_capacity_gb":1,"eviction":"LRU"}]"#,
                "eviction",
                "\"LRU\"",
            ),
        ] {
            let e = specs(json).unwrap_err();
            let text = e.to_string();
            assert!(text.contains("L2 tier 1 (base_path /x)"), "{text}");
            assert!(
                text.contains(&format!("{key} = {value} is not valid")),
                "{text}"
            );
        }
        let e = specs(r#"{"type":"fs","max_capacity_gb":1}"#).unwrap_err();
        assert!(e.to_string().contains("no \"base_path\""), "{e}");
    }

    #[test]
    fn a_capacity_below_one_byte_is_refused_and_minus_zero_is_zero() {
        let e = specs(r#"[{"type":"s3"},{"type":"fs","base_path":"/x","max_capacity_gb":1e-12}]"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "L2 tier 1 (base_path /x): max_capacity_gb = 1e-12 is not valid: at least one byte"
            ),
            "{e}"
        );
        let none = specs(r#"{"type":"fs","base_path":"/x","max_capacity_gb":-0}"#).unwrap();
        assert!(none.is_empty(), "-0 is 0: no capacity, no guard");
        let none = specs(r#"{"type":"fs","base_path":"/x","max_capacity_gb":-0.0}"#).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn two_guarded_tiers_in_one_directory_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tier");
        std::fs::create_dir(&dir).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let missing = tmp.path().join("new");
        for (a, b) in [
            (dir.display().to_string(), format!("{}/", dir.display())),
            (dir.display().to_string(), format!("{}/./", link.display())),
            (
                missing.display().to_string(),
                format!("{}//new/", tmp.path().display()),
            ),
        ] {
            let json = format!(
                r#"[{{"type":"fs","base_path":"{a}","max_capacity_gb":0.01}},{{"type":"s3"}},
                    {{"type":"fs","base_path":"{b}"}},
                    {{"type":"fs_native","base_path":"{b}","max_capacity_gb":0.5}}]"#
            );
            let e = specs(&json).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!(
                    "L2 tiers 0 (base_path {a}) and 3 (base_path {b}) are the same directory"
                )),
                "{e}"
            );
        }
        let json = format!(
            r#"[{{"type":"fs","base_path":"{}","max_capacity_gb":1}},
                {{"type":"fs","base_path":"{}","max_capacity_gb":1}}]"#,
            dir.display(),
            missing.display()
        );
        assert_eq!(specs(&json).unwrap().len(), 2);
    }

    #[test]
    fn a_volume_that_reports_no_size_takes_any_capacity_and_others_their_size() {
        assert!(fits_volume(u64::MAX, 0));
        assert!(fits_volume(1 << 30, 1 << 30));
        assert!(!fits_volume((1 << 30) + 1, 1 << 30));
        assert!(fits_volume(0, 1));
    }

    #[test]
    fn a_capacity_larger_than_the_volume_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("new-tier");
        let json = format!(
            r#"{{"type":"fs","base_path":"{}","max_capacity_gb":1000000000}}"#,
            path.display()
        );
        let spec = specs(&json).unwrap().remove(0);
        let e = spec.check_volume().unwrap_err().to_string();
        assert!(e.contains("L2 tier 0"), "{e}");
        assert!(
            e.contains("max_capacity_gb = 1000000000 is larger than the volume"),
            "{e}"
        );
        let json = format!(
            r#"{{"type":"fs","base_path":"{}","max_capacity_gb":1e300}}"#,
            path.display()
        );
        let e = specs(&json).unwrap_err().to_string();
        assert!(
            e.contains("max_capacity_gb")
                && e.contains("1e+300")
                && e.contains("less than 2^64 bytes"),
            "the value as written, refused before the volume is asked: {e}"
        );
        assert!(!path.exists(), "the check creates nothing");
        let json = format!(
            r#"{{"type":"fs","base_path":"{}","max_capacity_gb":0.001}}"#,
            path.display()
        );
        specs(&json).unwrap()[0].check_volume().unwrap();
    }
}
