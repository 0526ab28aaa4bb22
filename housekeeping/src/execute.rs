//! Carrying out a [`Plan`] and reporting what happened (counts and bytes
//! per reason; JSON).
//!
//! Each deletion is `unlinkat` relative to the directory descriptor, never
//! `AT_REMOVEDIR`, after an `fstatat(AT_SYMLINK_NOFOLLOW)` re-check that the
//! entry is still a regular file on the directory's filesystem. Object names
//! are rebuilt from their keys, so only names that decode are ever unlinked.
//! Should an entry be swapped between the re-check and the unlink, `unlinkat`
//! without `AT_REMOVEDIR` cannot remove a directory and removes a symlink
//! itself, never its target: nothing outside the directory can be harmed.
//! Two threads share the work.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::PathBuf;
use std::thread;

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::libc;
use nix::sys::stat::fstatat;
use nix::unistd::{unlinkat, UnlinkatFlags};
use serde::Serialize;

use crate::plan::{
    Deletion, IdentityPurge, ManifestChange, Plan, Reason, Target, TierPolicy, TrimOrder,
};
use crate::scan::{CountBytes, Inventory};
use crate::tier_dir::{TierDir, TierDirError};

/// Failures listed by name in a report; the rest are only counted.
pub const MAX_LISTED_FAILURES: usize = 20;

/// Deletions of one reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ReasonTotal {
    /// The reason (flattened: `"reason": "manifest_mismatch", "field": ...`).
    #[serde(flatten)]
    pub reason: Reason,
    /// Entries deleted (or to delete, in a dry run).
    pub count: u64,
    /// Their allocated bytes.
    pub bytes: u64,
}

/// A deletion that failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeleteFailure {
    /// The file.
    pub path: PathBuf,
    /// The `unlinkat`/`fstatat` error.
    pub error: String,
}

/// What housekeeping did (or, for a dry run, would do) to a tier.
/// Serialises to JSON; `Display` is the one-line launch log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The tier directory.
    pub path: PathBuf,
    /// True when nothing was deleted because this is the plan only.
    pub dry_run: bool,
    /// Whether the tier is shared (no purge by identity).
    pub shared: bool,
    /// Capacity trimmed to, in bytes.
    pub capacity_bytes: Option<u64>,
    /// Set when the objects left reached the capacity guard's trigger: the
    /// bytes they were trimmed to instead, where the guard's first cycle
    /// would leave the tier ([`crate::plan::GuardBound`]).
    pub trimmed_for_guard: Option<u64>,
    /// How objects were ordered for the trim.
    pub trim_order: TrimOrder,
    /// Deletions per reason, in reason order, reasons with none left out.
    pub deleted: Vec<ReasonTotal>,
    /// All deletions.
    pub deleted_total: CountBytes,
    /// Objects kept.
    pub kept_objects: CountBytes,
    /// Foreign entries, never touched.
    pub foreign: CountBytes,
    /// Entries skipped by the scan because they are on another filesystem.
    pub other_filesystem_entries: u64,
    /// The identity change that emptied the cache, if any.
    pub manifest_change: Option<ManifestChange>,
    /// Why an existing manifest was ignored, if it was.
    pub manifest_warning: Option<String>,
    /// The purge by identity, when it takes more than half of the tier's
    /// object bytes ([`Report::purge_warning`] is its warning line).
    pub identity_purge: Option<IdentityPurge>,
    /// Planned deletions already gone when their turn came.
    pub vanished: u64,
    /// Planned deletions skipped because the entry is no longer a regular
    /// file on this filesystem.
    pub changed: u64,
    /// The first [`MAX_LISTED_FAILURES`] failures.
    pub failures: Vec<DeleteFailure>,
    /// All failures.
    pub failures_total: u64,
}

impl Report {
    fn new(inventory: &Inventory, plan: &Plan, dry_run: bool) -> Self {
        let TierPolicy {
            capacity_bytes,
            shared,
            guard: _,
            fence_only: _,
        } = plan.policy;
        let totals = inventory.totals();
        Self {
            path: inventory.path().to_path_buf(),
            dry_run,
            shared,
            capacity_bytes,
            trimmed_for_guard: plan.trimmed_for_guard,
            trim_order: plan.trim_order,
            deleted: Vec::new(),
            deleted_total: CountBytes::default(),
            kept_objects: plan.kept_objects,
            foreign: totals.foreign,
            other_filesystem_entries: totals.other_filesystem_entries,
            manifest_change: plan.manifest_change.clone(),
            manifest_warning: plan.manifest_warning.as_ref().map(ToString::to_string),
            identity_purge: plan.identity_purge.clone(),
            vanished: 0,
            changed: 0,
            failures: Vec::new(),
            failures_total: 0,
        }
    }

    fn set_deleted(&mut self, per_reason: BTreeMap<Reason, CountBytes>) {
        self.deleted_total = CountBytes::default();
        self.deleted = per_reason
            .into_iter()
            .map(|(reason, cb)| {
                self.deleted_total.count += cb.count;
                self.deleted_total.bytes += cb.bytes;
                ReasonTotal {
                    reason,
                    count: cb.count,
                    bytes: cb.bytes,
                }
            })
            .collect();
    }
}

impl Report {
    /// The warning line of a purge by identity that takes most of the tier
    /// (`housekeeping <path>: purged 100% of the tier (8 of 8 objects,
    /// 64.0 MiB), because ...: model "/models/Qwen3-8B" -> "Qwen3-8B". ...`;
    /// `a launch would purge` in a dry run), logged at WARN by a launch and
    /// by the dry runs.
    pub fn purge_warning(&self) -> Option<String> {
        let purge = self.identity_purge.as_ref()?;
        let verb = match self.dry_run {
            true => "a launch would purge",
            false => "purged",
        };
        Some(format!(
            "housekeeping {}: {verb} {purge}",
            self.path.display()
        ))
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = if self.dry_run {
            "would delete"
        } else {
            "deleted"
        };
        write!(
            f,
            "housekeeping {}: {verb} {} entries ({})",
            self.path.display(),
            self.deleted_total.count,
            gib(self.deleted_total.bytes)
        )?;
        if !self.deleted.is_empty() {
            let parts: Vec<String> = self
                .deleted
                .iter()
                .map(|t| format!("{} {} ({})", t.reason, t.count, gib(t.bytes)))
                .collect();
            write!(f, " [{}]", parts.join(", "))?;
        }
        if let Some(change) = &self.manifest_change {
            write!(
                f,
                "; {} changed from {} to {}",
                change.field, change.recorded, change.current
            )?;
        }
        write!(
            f,
            "; kept {} objects ({})",
            self.kept_objects.count,
            gib(self.kept_objects.bytes)
        )?;
        if let Some(capacity) = self.capacity_bytes {
            write!(f, " of capacity {}", gib(capacity))?;
        }
        if let Some(target) = self.trimmed_for_guard {
            write!(
                f,
                " (trimmed to {}, where the capacity guard leaves a tier that reaches its trigger)",
                gib(target)
            )?;
        }
        if self.shared {
            f.write_str(" (shared tier: no purge by identity)")?;
        }
        write!(f, "; {} foreign entries left untouched", self.foreign.count)?;
        if self.other_filesystem_entries > 0 {
            write!(
                f,
                "; {} entries on another filesystem skipped",
                self.other_filesystem_entries
            )?;
        }
        if self.vanished + self.changed > 0 {
            write!(
                f,
                "; {} already gone, {} changed meanwhile",
                self.vanished, self.changed
            )?;
        }
        if self.failures_total > 0 {
            write!(f, "; {} deletions FAILED", self.failures_total)?;
            if let Some(first) = self.failures.first() {
                write!(f, " (first: {}: {})", first.path.display(), first.error)?;
            }
        }
        if let Some(warning) = &self.manifest_warning {
            write!(f, "; warning: {warning}")?;
        }
        Ok(())
    }
}

/// The report of a plan without carrying it out (`--dry-run`).
pub fn dry_run_report(inventory: &Inventory, plan: &Plan) -> Report {
    let mut report = Report::new(inventory, plan, true);
    let mut per_reason: BTreeMap<Reason, CountBytes> = BTreeMap::new();
    for deletion in &plan.deletions {
        per_reason
            .entry(deletion.reason)
            .or_default()
            .add(Plan::bytes_of(inventory, deletion.target));
    }
    report.set_deleted(per_reason);
    report
}

/// Carries out `plan` (made from `inventory`, scanned from `dir`).
/// Deletions that fail are listed in the report, not returned as errors.
///
/// # Errors
/// [`TierDirError::NotWritable`] when `dir` was opened read-only.
pub fn execute(dir: &TierDir, inventory: &Inventory, plan: &Plan) -> Result<Report, TierDirError> {
    dir.require_writable()?;
    let half = plan.deletions.len().div_ceil(2);
    let outcomes: Vec<Outcome> = thread::scope(|s| {
        let handles: Vec<_> = plan
            .deletions
            .chunks(half.max(1))
            .map(|chunk| s.spawn(move || delete_all(dir, inventory, chunk)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    let mut report = Report::new(inventory, plan, false);
    let mut per_reason: BTreeMap<Reason, CountBytes> = BTreeMap::new();
    for outcome in outcomes {
        for (reason, cb) in outcome.per_reason {
            let total = per_reason.entry(reason).or_default();
            total.count += cb.count;
            total.bytes += cb.bytes;
        }
        report.vanished += outcome.vanished;
        report.changed += outcome.changed;
        report.failures_total += outcome.failures_total;
        let room = MAX_LISTED_FAILURES - report.failures.len();
        report
            .failures
            .extend(outcome.failures.into_iter().take(room));
    }
    report.set_deleted(per_reason);
    Ok(report)
}

#[derive(Default)]
struct Outcome {
    per_reason: BTreeMap<Reason, CountBytes>,
    vanished: u64,
    changed: u64,
    failures: Vec<DeleteFailure>,
    failures_total: u64,
}

fn delete_all(dir: &TierDir, inventory: &Inventory, deletions: &[Deletion]) -> Outcome {
    let mut outcome = Outcome::default();
    let mut name = String::new();
    for deletion in deletions {
        name.clear();
        match deletion.target {
            Target::Object(i) => {
                let key = &inventory.objects()[i as usize].key;
                // Writing into a String cannot fail.
                let _ = write!(name, "{}", inventory.names().name(key));
            }
            Target::Temp(i) => name.push_str(&inventory.temps()[i as usize].name),
        }
        let fail = |outcome: &mut Outcome, e: Errno| {
            outcome.failures_total += 1;
            if outcome.failures.len() < MAX_LISTED_FAILURES {
                outcome.failures.push(DeleteFailure {
                    path: dir.entry_path(&name),
                    error: e.desc().to_owned(),
                });
            }
        };
        let st = match fstatat(dir.fd(), name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => {
                outcome.vanished += 1;
                continue;
            }
            Err(e) => {
                fail(&mut outcome, e);
                continue;
            }
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_dev != dir.device() {
            outcome.changed += 1;
            continue;
        }
        match unlinkat(dir.fd(), name.as_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) => outcome
                .per_reason
                .entry(deletion.reason)
                .or_default()
                .add(u64::try_from(st.st_blocks).unwrap_or(0) * 512),
            Err(Errno::ENOENT) => outcome.vanished += 1,
            Err(e) => fail(&mut outcome, e),
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{LaunchIdentity, ManifestRead};
    use crate::plan::plan;
    use crate::scan::scan;
    use crate::tier_dir::Access;
    use std::fs;

    fn identity() -> LaunchIdentity {
        LaunchIdentity {
            model: "test-model".into(),
            tensor_parallel_size: 1,
            pipeline_parallel_size: 1,
            kv_cache_dtype: "auto".into(),
            block_size: 16,
            chunk_size: 256,
            decode_context_parallel_size: 1,
            cp_kv_cache_interleave_size: 1,
            mla_only: false,
            weights: None,
            engine_settings: Default::default(),
        }
    }

    #[test]
    fn deletes_as_planned_and_reports_per_reason() {
        let tmp = tempfile::tempdir().unwrap();
        let keep = "test-model@0x01000100@0@00aa.data";
        let other = "bench-model@0x00000000@0@00bb.data";
        let temp = "test-model@0x01000100@0@00cc.tmp";
        for name in [keep, other, temp] {
            fs::write(tmp.path().join(name), vec![7u8; 4096]).unwrap();
        }
        let dir = TierDir::open(tmp.path(), Access::ReadWrite).unwrap();
        let inventory = scan(&dir).unwrap();
        let plan = plan(
            &inventory,
            &identity(),
            &ManifestRead::Missing,
            TierPolicy::default(),
        );
        let dry = dry_run_report(&inventory, &plan);
        assert!(dry.dry_run);
        assert_eq!(dry.deleted_total.count, 3);
        assert!(tmp.path().join(keep).exists(), "a dry run deletes nothing");

        let report = execute(&dir, &inventory, &plan).unwrap();
        assert_eq!(report.deleted_total, dry.deleted_total);
        assert_eq!(report.deleted, dry.deleted);
        assert_eq!(
            report.deleted.iter().map(|t| t.reason).collect::<Vec<_>>(),
            vec![Reason::OtherModel, Reason::NoManifest, Reason::StaleTemp]
        );
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["deleted"][0]["reason"], "other_model");
        assert_eq!(json["deleted"][0]["count"], 1);
        let line = report.to_string();
        assert!(line.contains("deleted 3 entries"), "{line}");
        assert!(line.contains("no_manifest 1"), "{line}");
    }

    #[test]
    fn entries_that_vanished_or_changed_are_counted_not_failed() {
        let tmp = tempfile::tempdir().unwrap();
        let gone = "m@0x01000100@0@01.data";
        let swapped = "m@0x01000100@0@02.data";
        fs::write(tmp.path().join(gone), b"x").unwrap();
        fs::write(tmp.path().join(swapped), b"x").unwrap();
        let dir = TierDir::open(tmp.path(), Access::ReadWrite).unwrap();
        let inventory = scan(&dir).unwrap();
        let plan = plan(
            &inventory,
            &identity(),
            &ManifestRead::Missing,
            TierPolicy::default(),
        );
        fs::remove_file(tmp.path().join(gone)).unwrap();
        fs::remove_file(tmp.path().join(swapped)).unwrap();
        fs::create_dir(tmp.path().join(swapped)).unwrap();
        let report = execute(&dir, &inventory, &plan).unwrap();
        assert_eq!(
            (report.vanished, report.changed, report.failures_total),
            (1, 1, 0)
        );
        assert!(tmp.path().join(swapped).is_dir());
    }

    #[test]
    fn read_only_directories_are_not_executed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = TierDir::open(tmp.path(), Access::ReadOnly).unwrap();
        let inventory = scan(&dir).unwrap();
        let plan = plan(
            &inventory,
            &identity(),
            &ManifestRead::Missing,
            TierPolicy::default(),
        );
        assert!(matches!(
            execute(&dir, &inventory, &plan),
            Err(TierDirError::NotWritable { .. })
        ));
    }
}
