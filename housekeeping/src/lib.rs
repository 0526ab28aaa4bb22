//! Housekeeping of an LMCache disk tier before the server starts:
//! decode object names ([`codec`]), remember the launch identity in a
//! manifest ([`identity`]), scan the directory ([`mod@scan`]), plan what to
//! delete and why ([`mod@plan`], pure), delete it ([`mod@execute`]), all under a lock
//! that keeps two launches off one directory ([`lock`]).
//!
//! [`housekeep`] runs the whole sequence the way a launch does:
//! ```no_run
//! use lmcache_housekeeping::{housekeep, LaunchIdentity, Mode, TierPolicy};
//! let identity = LaunchIdentity {
//!     model: "meta-llama/Llama-3.1-8B".into(),
//!     tensor_parallel_size: 1,
//!     pipeline_parallel_size: 1,
//!     kv_cache_dtype: "auto".into(),
//!     block_size: 16,
//!     chunk_size: 256,
//!     decode_context_parallel_size: 1,
//!     cp_kv_cache_interleave_size: 1,
//!     mla_only: false,
//!     weights: None,
//!     engine_settings: Default::default(),
//! };
//! let policy = TierPolicy { capacity_bytes: Some(100 << 30), ..TierPolicy::default() };
//! let done = housekeep("/data/lmcache", &identity, policy, Mode::Apply)?;
//! println!("{}", done.report); // one line for the launch log
//! // keep `done.lock` alive for the life of the server
//! # Ok::<(), lmcache_housekeeping::HousekeepingError>(())
//! ```

pub mod codec;
pub mod execute;
pub mod identity;
pub mod lock;
pub mod plan;
pub mod s3_key;
pub mod scan;
pub mod tier_dir;

use std::path::Path;

pub use codec::{KvRank, ObjectKey, ObjectName};
pub use execute::{dry_run_report, execute, Report};
pub use identity::{read_manifest, write_manifest, LaunchIdentity, Manifest, ManifestRead};
pub use lock::{LockError, TierLock};
pub use plan::{
    plan, GuardBound, IdentityChange, IdentityPurge, Plan, PurgeCause, Reason, TierPolicy,
};
pub use scan::{scan, Inventory, InventoryTotals, ScanError};
pub use tier_dir::{Access, TierDir, TierDirError};

/// Whether [`housekeep`] deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Scan and plan only; the directory is opened read-only and not locked.
    DryRun,
    /// Lock, scan, plan, delete, write the manifest; the lock is returned.
    Apply,
}

/// The result of [`housekeep`].
#[derive(Debug)]
pub struct Housekeeping {
    /// What was (or would be) deleted and kept.
    pub report: Report,
    /// What the scan found before any deletion.
    pub scanned: InventoryTotals,
    /// The lock, held until dropped: keep it for the life of the launch
    /// `None` for a dry run.
    pub lock: Option<TierLock>,
    /// The manifest written (`None` for a dry run or a shared tier, which
    /// holds other nodes' identities).
    pub manifest: Option<Manifest>,
    /// Indices into the scan's objects ([`Inventory::objects`]) of the
    /// objects deleted (none for a dry run).
    pub deleted_objects: Vec<u32>,
}

/// Why [`housekeep`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum HousekeepingError {
    /// The identity cannot describe a launch.
    #[error("invalid launch identity: {0}")]
    Identity(#[from] identity::IdentityError),
    /// The directory cannot be used; nothing was deleted.
    #[error(transparent)]
    Dir(#[from] TierDirError),
    /// Another launch holds the directory; nothing was deleted.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The directory could not be read; nothing was deleted.
    #[error(transparent)]
    Scan(#[from] ScanError),
    /// Some deletions failed, so the manifest was not written (objects of an
    /// old identity may remain); the report lists them.
    #[error("housekeeping of {} incomplete: {} deletions failed (first: {}); the identity manifest was not written, fix the cause and launch again", .report.path.display(), .report.failures_total, first_failure(.report))]
    Incomplete {
        /// What was done.
        report: Box<Report>,
    },
    /// The manifest could not be written after the deletions.
    #[error(transparent)]
    Manifest(#[from] identity::ManifestError),
}

fn first_failure(report: &Report) -> String {
    report
        .failures
        .first()
        .map(|f| format!("{}: {}", f.path.display(), f.error))
        .unwrap_or_default()
}

/// A tier directory opened and scanned once, with its lock when it was
/// opened for deleting: what a launch sizes the tier from and then
/// housekeeps from ([`ScannedTier::housekeep`]), without a second scan.
#[derive(Debug)]
pub struct ScannedTier {
    /// The directory.
    pub dir: TierDir,
    /// The lock, taken before the scan; `None` for a read-only look.
    pub lock: Option<TierLock>,
    /// What the scan found.
    pub inventory: Inventory,
}

impl ScannedTier {
    /// Opens the tier at `path` (read-only for [`Mode::DryRun`]; for
    /// [`Mode::Apply`] read-write and locked), then scans it.
    ///
    /// # Errors
    /// [`HousekeepingError::Dir`], [`HousekeepingError::Lock`] (another
    /// launch holds it) or [`HousekeepingError::Scan`].
    pub fn open(path: impl AsRef<Path>, mode: Mode) -> Result<Self, HousekeepingError> {
        let (dir, lock) = Self::lock(path, mode)?;
        let inventory = scan(&dir)?;
        Ok(Self {
            dir,
            lock,
            inventory,
        })
    }

    /// The first half of [`ScannedTier::open`]: the directory, opened as
    /// `mode` needs, and its lock for [`Mode::Apply`]. A caller that must
    /// do something between locking and scanning (watch the directory)
    /// builds the [`ScannedTier`] itself from these and [`scan()`].
    ///
    /// # Errors
    /// [`HousekeepingError::Dir`] or [`HousekeepingError::Lock`].
    pub fn lock(
        path: impl AsRef<Path>,
        mode: Mode,
    ) -> Result<(TierDir, Option<TierLock>), HousekeepingError> {
        let access = match mode {
            Mode::DryRun => Access::ReadOnly,
            Mode::Apply => Access::ReadWrite,
        };
        let dir = TierDir::open(path, access)?;
        let lock = match mode {
            Mode::DryRun => None,
            Mode::Apply => Some(TierLock::acquire(&dir)?),
        };
        Ok((dir, lock))
    }

    /// Housekeeps the tier from its scan: reads the manifest, plans, and
    /// for [`Mode::Apply`] deletes and then writes the manifest for
    /// `identity` (not on a shared tier). The lock stays here: the returned
    /// [`Housekeeping::lock`] is `None`. Applying needs a tier opened with
    /// [`Mode::Apply`].
    ///
    /// # Errors
    /// [`HousekeepingError`]; every variant but `Incomplete` and `Manifest`
    /// is returned before anything is deleted.
    pub fn housekeep(
        &self,
        identity: &LaunchIdentity,
        policy: TierPolicy,
        mode: Mode,
    ) -> Result<Housekeeping, HousekeepingError> {
        identity.validate()?;
        let manifest = read_manifest(&self.dir);
        let plan = plan(&self.inventory, identity, &manifest, policy);
        let scanned = self.inventory.totals();
        if mode == Mode::DryRun {
            return Ok(Housekeeping {
                report: dry_run_report(&self.inventory, &plan),
                scanned,
                lock: None,
                manifest: None,
                deleted_objects: Vec::new(),
            });
        }
        let report = execute(&self.dir, &self.inventory, &plan)?;
        if report.failures_total > 0 {
            return Err(HousekeepingError::Incomplete {
                report: Box::new(report),
            });
        }
        let manifest = match manifest {
            _ if policy.shared => None,
            // Already this identity, in this schema: not written again, so
            // that a restart on a full volume is not stopped by it.
            ManifestRead::Found(found)
                if found.identity == *identity
                    && found.schema_version == identity::MANIFEST_SCHEMA_VERSION =>
            {
                Some(found)
            }
            _ => Some(write_manifest(&self.dir, identity)?),
        };
        let deleted_objects = plan
            .deletions
            .iter()
            .filter_map(|d| match d.target {
                plan::Target::Object(i) => Some(i),
                plan::Target::Temp(_) => None,
            })
            .collect();
        Ok(Housekeeping {
            report,
            scanned,
            lock: None,
            manifest,
            deleted_objects,
        })
    }
}

/// Runs a launch's housekeeping of the tier at `path` (what a launch does
/// to the disk tier): lock, scan, read the manifest, plan, and
/// for [`Mode::Apply`] delete and then write the manifest for `identity`
/// (not on a shared tier). Killed at any point, the next run completes the
/// job: the manifest is written only after every deletion succeeded.
///
/// # Errors
/// [`HousekeepingError`]; every variant but `Incomplete` and `Manifest` is
/// returned before anything is deleted.
pub fn housekeep(
    path: impl AsRef<Path>,
    identity: &LaunchIdentity,
    policy: TierPolicy,
    mode: Mode,
) -> Result<Housekeeping, HousekeepingError> {
    identity.validate()?;
    let mut tier = ScannedTier::open(path, mode)?;
    let mut done = tier.housekeep(identity, policy, mode)?;
    done.lock = tier.lock.take();
    Ok(done)
}
