//! What each LMCache version accepts, and how the plan renders the server's
//! command line and its `--l2-adapter` JSON for the version it finds
//! (`docs/configuration.md`, "LMCache versions"). The version is a fact,
//! read once from the installed wheel's metadata
//! ([`crate::plan::locate::lmcache_version`]); the rules here are pure.
//!
//! The differences, from the wheels of LMCache 0.5.6 and 0.5.7rc2:
//! - `affinity_tag` in an `--l2-adapter` JSON is refused from 0.5.7
//!   (`ValueError("affinity_tag was removed ...")`,
//!   `lmcache/v1/distributed/l2_adapters/config.py`): the plan drops it and
//!   warns;
//! - `--api-key-file` exists from 0.5.7 (`lmcache/security/api_key.py`):
//!   with a key, every HTTP route but `/` and `/healthcheck` wants
//!   `Authorization: Bearer <key>`;
//! - `--l2-prefetch-max-in-flight` is ignored from 0.5.7, in favour of
//!   `--l2-prefetch-inflight-watermark` (a fraction of L1): a repeat of it in
//!   `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` is warned about.

use std::cmp::Ordering;
use std::fmt;

use lmcache_tier_spec::Cascade;

/// The first release (major, minor, patch) with the changes above.
const NEXT: (u32, u32, u32) = (0, 5, 7);

/// An LMCache version as its wheel states it (PEP 440): `0.5.6`,
/// `0.5.7rc2`, `0.5.7.dev12+g1a2b3c`, `1!0.5.6`. Ordered by the epoch, then
/// the release numbers, a pre-release or development build before its
/// release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LmcacheRelease {
    /// The PEP 440 epoch (`N!` before the release numbers; 0 without one):
    /// a version of a higher epoch is later than any of a lower one.
    pub epoch: u32,
    /// Major, minor and patch numbers (a missing one reads as 0).
    pub numbers: (u32, u32, u32),
    /// Whether it is a pre-release (`a`, `b`, `rc`) or a development build
    /// (`.dev`) of `numbers`.
    pub pre_release: bool,
    /// The version as the wheel wrote it.
    pub text: String,
}

impl LmcacheRelease {
    /// Reads `text`; `None` when it does not start with a release number
    /// (after an optional epoch `N!`).
    pub fn parse(text: &str) -> Option<Self> {
        let (epoch, version) = match text.split_once('!') {
            Some((epoch, version)) => (epoch.parse::<u32>().ok()?, version),
            None => (0, text),
        };
        let end = version
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(version.len());
        let (release, rest) = version.split_at(end);
        let release = release.trim_end_matches('.');
        let mut numbers = release.split('.').map(str::parse::<u32>);
        let major = numbers.next()?.ok()?;
        let minor = numbers.next().transpose().ok()?.unwrap_or(0);
        let patch = numbers.next().transpose().ok()?.unwrap_or(0);
        let pre_release = ["a", "b", "rc", "dev"].iter().any(|p| rest.starts_with(p));
        Some(LmcacheRelease {
            epoch,
            numbers: (major, minor, patch),
            pre_release,
            text: text.to_string(),
        })
    }

    /// Whether this release has the changes of `numbers`: a pre-release of
    /// `numbers` has them (they are what it previews).
    fn has(&self, numbers: (u32, u32, u32)) -> bool {
        (self.epoch, self.numbers).cmp(&(0, numbers)) != Ordering::Less
    }
}

impl fmt::Display for LmcacheRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)?;
        if self.pre_release {
            f.write_str(" (a pre-release)")?;
        }
        Ok(())
    }
}

/// How the plan renders for one LMCache version ([`rendering`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rendering {
    /// `--api-key-file` exists (0.5.7 on).
    pub api_key_file: bool,
    /// An `--l2-adapter` with `affinity_tag` is refused at start (0.5.7 on).
    pub refuses_affinity_tag: bool,
    /// `--l2-prefetch-max-in-flight` is accepted but ignored (0.5.7 on).
    pub ignores_prefetch_max_in_flight: bool,
    /// The server's flags are 0.5.7rc2's
    /// ([`crate::node::server_flags::next_server_flags`]), not 0.5.6's.
    pub next_flags: bool,
}

/// The rendering for `release`; an unreadable version gets that of the
/// newest tested stable release, 0.5.6 (the launch says the version could
/// not be read).
pub fn rendering(release: Option<&LmcacheRelease>) -> Rendering {
    let next = release.is_some_and(|r| r.has(NEXT));
    Rendering {
        api_key_file: next,
        refuses_affinity_tag: next,
        ignores_prefetch_max_in_flight: next,
        next_flags: next,
    }
}

/// The `affinity_tag` key an `--l2-adapter` may carry (0.5.6 and before).
const AFFINITY_TAG: &str = "affinity_tag";

/// The repeat of this flag in `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` that 0.5.7
/// ignores.
pub(crate) const PREFETCH_MAX_IN_FLIGHT: &str = "--l2-prefetch-max-in-flight";

/// `cascade` as `release` accepts it: without `affinity_tag` where the
/// version refuses it, with one warning per tier that lost it.
pub(crate) fn cascade_for(
    cascade: Cascade,
    render: Rendering,
    release: Option<&LmcacheRelease>,
) -> (Cascade, Vec<String>) {
    if !render.refuses_affinity_tag {
        return (cascade, Vec::new());
    }
    let version = release.map_or_else(String::new, |r| format!(" {r}"));
    let mut warnings = Vec::new();
    let tiers = cascade
        .0
        .into_iter()
        .enumerate()
        .map(|(position, tier)| {
            if !tier.as_object().contains_key(AFFINITY_TAG) {
                return tier;
            }
            warnings.push(format!(
                "L2 tier {position} ({}): \"{AFFINITY_TAG}\" dropped: LMCache{version} refuses it at start (\"affinity_tag was removed; L1 affinity is resolved from memory tags\"); remove it from the tier",
                tier.adapter_type()
            ));
            tier.rewritten(&[AFFINITY_TAG], [])
        })
        .collect();
    (Cascade(tiers), warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(text: &str) -> LmcacheRelease {
        LmcacheRelease::parse(text).unwrap()
    }

    #[test]
    fn versions_of_every_shape_are_read() {
        assert_eq!(release("0.5.6").numbers, (0, 5, 6));
        assert!(!release("0.5.6").pre_release);
        for pre in ["0.5.7rc2", "0.5.7a1", "0.5.7b3", "0.5.7.dev12+g1a2b3c"] {
            let r = release(pre);
            assert_eq!(r.numbers, (0, 5, 7), "{pre}");
            assert!(r.pre_release, "{pre}");
        }
        assert_eq!(release("1").numbers, (1, 0, 0));
        assert_eq!(release("0.6").numbers, (0, 6, 0));
        assert_eq!(release("0.5.6+cu128").numbers, (0, 5, 6));
        assert!(!release("0.5.6+cu128").pre_release);
        let epoch = release("1!0.5.6");
        assert_eq!((epoch.epoch, epoch.numbers), (1, (0, 5, 6)));
        assert_eq!(release("0!0.5.7rc2").numbers, (0, 5, 7));
        assert!(release("0!0.5.7rc2").pre_release);
        for bad in ["", "v0.5.6", "dev", ".5", "x!0.5.6", "1!", "!0.5.6"] {
            assert_eq!(LmcacheRelease::parse(bad), None, "{bad}");
        }
        assert_eq!(release("0.5.7rc2").to_string(), "0.5.7rc2 (a pre-release)");
    }

    #[test]
    fn the_changes_start_at_0_5_7_and_its_pre_releases() {
        for old in ["0.5.4", "0.5.5", "0.5.6", "0.5.6.post1", "0.4.9"] {
            let r = rendering(Some(&release(old)));
            assert!(!r.api_key_file && !r.refuses_affinity_tag, "{old}");
        }
        for old in ["0!0.5.6", "0!0.4.9"] {
            assert!(!rendering(Some(&release(old))).next_flags, "{old}");
        }
        for new in [
            "0.5.7rc2", "0.5.7", "0.5.8", "0.6.0", "1.0", "1!0.5.6", "0!0.5.7",
        ] {
            let r = rendering(Some(&release(new)));
            assert!(r.api_key_file && r.refuses_affinity_tag, "{new}");
            assert!(r.ignores_prefetch_max_in_flight, "{new}");
        }
        assert_eq!(rendering(None), rendering(Some(&release("0.5.6"))));
    }

    #[test]
    fn affinity_tag_is_dropped_only_where_the_version_refuses_it() {
        let cascade = Cascade::parse(
            r#"[{"type":"fs_native","base_path":"/c","affinity_tag":"x"},{"type":"mock","max_size_gb":1}]"#,
            "EREBINE_AGENT_LMCACHE_L2_ADAPTER",
        )
        .unwrap();
        let old = release("0.5.6");
        let (same, warnings) = cascade_for(cascade.clone(), rendering(Some(&old)), Some(&old));
        assert_eq!(same, cascade);
        assert!(warnings.is_empty());
        let new = release("0.5.7rc2");
        let (rendered, warnings) = cascade_for(cascade, rendering(Some(&new)), Some(&new));
        assert!(!rendered.tiers()[0].as_object().contains_key(AFFINITY_TAG));
        assert_eq!(rendered.tiers()[0].base_path(), Some("/c"));
        assert_eq!(rendered.tiers()[1].adapter_type(), "mock");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("L2 tier 0 (fs_native)") && warnings[0].contains("0.5.7rc2"),
            "{warnings:?}"
        );
    }
}
