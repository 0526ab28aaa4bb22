//! The pure planner: inventory + identity + manifest + policy -> what to
//! delete and why. It touches no file.
//!
//! Rules, in this order, each object getting the first reason that applies:
//! 1. [`Reason::OtherModel`]: its model is not the one LMCache writes for
//!    the launch ([`LaunchIdentity::lmcache_model_name`]);
//! 2. [`Reason::OtherWorldSize`]: the world size in its kv_rank is not the
//!    launch's ([`LaunchIdentity::kv_world_size`]);
//! 3. [`Reason::ManifestMismatch`]: the manifest records another identity
//!    (the first differing field is named; dtype, block size and chunk size
//!    are in no object name, so every object goes);
//! 4. [`Reason::NoManifest`]: no usable manifest, so the objects' dtype,
//!    block size and chunk size are unknown and reading them back could hand
//!    the engine garbage;
//! 5. [`Reason::Trim`]: of the objects left, the least recently used go
//!    first until their allocated bytes fit the capacity. A tier with a
//!    capacity guard ([`TierPolicy::guard`]) whose objects left reach the
//!    guard's trigger is trimmed further, to where the guard's first cycle
//!    would leave it (`docs/capacity-guard.md`, "Housekeeping and the
//!    guard"): one pass of deletions before the server starts, not a trim
//!    to the capacity followed at once by the guard's own cycle.
//!
//! A purge by identity (rules 1 to 4) that takes more than half of the
//! tier's object bytes is described in [`Plan::identity_purge`]: what the
//! objects were written under against this launch's identity, field by
//! field, so a launch that names the model otherwise than its engine does
//! says so before its cache is gone (`docs/operations.md`, "The cache is
//! empty after a restart").
//!
//! A fenced tier ([`TierPolicy::fence_only`], an operator's own disk tier)
//! gets rules 3 and 4 only, rule 4 only for an unusable manifest: a tier
//! without one is adopted.
//!
//! Stale temp files always go ([`Reason::StaleTemp`]), except on a shared
//! tier. A shared tier (`"shared": true`, or any tier other than the node's
//! own disk path) is never purged by identity and its temp files are kept
//! (other nodes write there, perhaps at this moment); only the trim applies,
//! and only if the caller passes a capacity.
//!
//! Trim order ([`TrimOrder`]): where the volume records access times, an
//! object's last use is max(atime, mtime). With `relatime` (the Linux
//! default) atime moves at least once a day after a read, so objects read on
//! different days are ordered correctly and fresh writes stay fresh through
//! mtime; with `strictatime` the order is exact. On a `noatime` volume atime
//! says nothing, so mtime alone is used. Ties are broken by directory order.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::Serialize;

use crate::codec::ModelId;
use crate::identity::{IdentityField, LaunchIdentity, ManifestRead, ManifestWarning};
use crate::scan::{CountBytes, Inventory, ObjectEntry};
use crate::tier_dir::AccessTimes;

/// What the caller knows about the tier beyond its contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierPolicy {
    /// Capacity in bytes the objects must fit after the purge; `None` = no
    /// trim.
    pub capacity_bytes: Option<u64>,
    /// Other nodes write here: no purge by identity, temp files kept.
    pub shared: bool,
    /// Only the identity manifest decides (an operator's own `fs` or
    /// `fs_native` tier): every object goes when the manifest records
    /// another identity, or is unusable; objects are kept when there is no
    /// manifest (the tier is adopted, and the manifest written), and never
    /// purged for their model or world size (LMCache never reads another
    /// model's objects; they only take room, which the tier's bound
    /// evicts). `docs/configuration.md`, "The cache identity".
    pub fence_only: bool,
    /// Where the tier's capacity guard leaves it, when one bounds the tier
    /// once the server runs.
    pub guard: Option<GuardBound>,
}

/// When a tier's capacity guard evicts and where its cycle ends
/// (`docs/capacity-guard.md`, "Which tiers, and who evicts what"): once the
/// objects reach `trigger_bytes` it deletes the least recently used down to
/// `target_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GuardBound {
    /// The usage at which the guard starts a cycle, in bytes.
    pub trigger_bytes: u64,
    /// The usage a cycle started at or above the trigger ends at, in bytes
    /// (at most: the trigger less `eviction_ratio` x capacity).
    pub target_bytes: u64,
}

/// Why an entry is deleted. Serialised as `{"reason": "other_model"}`,
/// `{"reason": "manifest_mismatch", "field": "chunk_size"}`, ...
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Reason {
    /// Written for another model.
    OtherModel,
    /// Written by an engine of another world size (TP x PP).
    OtherWorldSize,
    /// The manifest records another identity; `field` is the first that
    /// differs.
    ManifestMismatch {
        /// The first differing identity field.
        field: IdentityField,
    },
    /// No usable manifest: the objects' identity is unknown.
    NoManifest,
    /// A temp file from an interrupted write.
    StaleTemp,
    /// Trimmed, oldest first, to fit the capacity.
    Trim,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OtherModel => f.write_str("other_model"),
            Self::OtherWorldSize => f.write_str("other_world_size"),
            Self::ManifestMismatch { field } => write!(f, "manifest_mismatch({field})"),
            Self::NoManifest => f.write_str("no_manifest"),
            Self::StaleTemp => f.write_str("stale_temp"),
            Self::Trim => f.write_str("trim"),
        }
    }
}

/// An entry of the inventory, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `inventory.objects()[i]`.
    Object(u32),
    /// `inventory.temps()[i]`.
    Temp(u32),
}

/// One planned deletion (12 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deletion {
    /// What to delete.
    pub target: Target,
    /// Why.
    pub reason: Reason,
}

/// How objects were ordered for the trim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrimOrder {
    /// max(atime, mtime), oldest first.
    LastAccess,
    /// mtime, oldest first (`noatime` volume).
    Modification,
}

/// The identity field that changed since the manifest was written, with both
/// values, so "the cache is empty after a restart" explains itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ManifestChange {
    /// The first field that differs.
    pub field: IdentityField,
    /// Its value in the manifest.
    pub recorded: String,
    /// Its value for this launch.
    pub current: String,
}

/// One field of an [`IdentityPurge`]: what the tier's objects were
/// written under, and what this launch writes under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IdentityChange {
    /// The field: an [`IdentityField`] name, or `kv_world_size` (the world
    /// size in the objects' kv_rank).
    pub field: &'static str,
    /// Its value in the tier (in the purged objects' names, or in the
    /// manifest).
    pub stored: String,
    /// Its value for this launch.
    pub current: String,
}

/// A purge by identity that takes more than half of the tier's object bytes
/// (the rule in the module docs). `Display` gives what goes and why, each
/// cause with its own count: `100% of the tier (7 of 7 objects, 7.0 MiB),
/// because the launch identity differs from what the tier holds: 4 objects
/// (4.0 MiB) of another model (model "other" -> "this"); 3 objects (3.0
/// MiB) with no usable identity manifest ... . ...`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IdentityPurge {
    /// The objects deleted by identity (other model, other world size,
    /// another manifest identity, no manifest), with their allocated bytes.
    pub purged: CountBytes,
    /// Every object of the tier before the purge.
    pub objects: CountBytes,
    /// The fields that differ. Empty when only the manifest is missing or
    /// unusable: then nothing records what the objects were written for.
    pub changes: Vec<IdentityChange>,
    /// The purged objects by cause, in rule order, each with its own
    /// count, bytes and the fields that differ for it.
    pub causes: Vec<PurgeCause>,
}

/// The objects of an [`IdentityPurge`] deleted for one cause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PurgeCause {
    /// The cause (flattened: `"reason": "other_model"`, ...).
    #[serde(flatten)]
    pub reason: Reason,
    /// The objects deleted for it.
    pub count: u64,
    /// Their allocated bytes.
    pub bytes: u64,
    /// The fields that differ for these objects (none for
    /// [`Reason::NoManifest`]).
    pub changes: Vec<IdentityChange>,
}

impl fmt::Display for PurgeCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.reason {
            Reason::OtherModel => "of another model",
            Reason::OtherWorldSize => "of another world size (TP x PP)",
            Reason::ManifestMismatch { .. } => {
                "under an identity manifest that records another identity"
            }
            _ => "with no usable identity manifest, so nothing records what they were written for",
        };
        let noun = if self.count == 1 { "object" } else { "objects" };
        write!(f, "{} {noun} ({}) {what}", self.count, mib(self.bytes))?;
        for (i, change) in self.changes.iter().enumerate() {
            let sep = if i == 0 { " (" } else { ", " };
            write!(
                f,
                "{sep}{} {:?} -> {:?}",
                change.field, change.stored, change.current
            )?;
        }
        if !self.changes.is_empty() {
            f.write_str(")")?;
        }
        Ok(())
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

impl fmt::Display for IdentityPurge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let percent = match self.objects.bytes {
            0 => self.purged.count as f64 * 100.0 / self.objects.count.max(1) as f64,
            total => self.purged.bytes as f64 * 100.0 / total as f64,
        };
        write!(
            f,
            "{percent:.0}% of the tier ({} of {} objects, {}), because the launch identity differs from what the tier holds",
            self.purged.count,
            self.objects.count,
            mib(self.purged.bytes)
        )?;
        for (i, cause) in self.causes.iter().enumerate() {
            let sep = if i == 0 { ": " } else { "; " };
            write!(f, "{sep}{cause}")?;
        }
        f.write_str(". If the engine did not change, give the launch the engine's own flags (vLLM's --model, not --served-model-name): docs/configuration.md, \"The launch identity\"")
    }
}

/// What to delete from a tier and why; [`crate::execute()`] carries it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The deletions, objects in inventory order then trims oldest first,
    /// then temps.
    pub deletions: Vec<Deletion>,
    /// The objects left after it, and their allocated bytes.
    pub kept_objects: CountBytes,
    /// The trim order used.
    pub trim_order: TrimOrder,
    /// The policy planned for.
    pub policy: TierPolicy,
    /// Set when the manifest records another identity.
    pub manifest_change: Option<ManifestChange>,
    /// Set when a manifest was there but unusable.
    pub manifest_warning: Option<ManifestWarning>,
    /// Set when the purge by identity takes more than half of the tier's
    /// object bytes.
    pub identity_purge: Option<IdentityPurge>,
    /// Set when the objects left reached the capacity guard's trigger: the
    /// bytes they were trimmed to, the guard's target
    /// ([`GuardBound::target_bytes`]).
    pub trimmed_for_guard: Option<u64>,
}

impl Plan {
    /// Allocated bytes a deletion frees, as scanned.
    pub fn bytes_of(inventory: &Inventory, target: Target) -> u64 {
        match target {
            Target::Object(i) => inventory.objects()[i as usize].stats.allocated_bytes,
            Target::Temp(i) => inventory.temps()[i as usize].stats.allocated_bytes,
        }
    }
}

/// Plans the housekeeping of `inventory` for a launch of `identity` (see the
/// module docs for the rules). `identity` should have passed
/// [`LaunchIdentity::validate`].
pub fn plan(
    inventory: &Inventory,
    identity: &LaunchIdentity,
    manifest: &ManifestRead,
    policy: TierPolicy,
) -> Plan {
    let (identity_verdict, manifest_change, manifest_warning) = match manifest {
        ManifestRead::Found(found) => {
            let change =
                found
                    .identity
                    .differences(identity)
                    .next()
                    .map(|(field, recorded, current)| ManifestChange {
                        field,
                        recorded,
                        current,
                    });
            let verdict = change
                .as_ref()
                .map(|c| Reason::ManifestMismatch { field: c.field });
            (verdict, change, None)
        }
        ManifestRead::Missing => (Some(Reason::NoManifest), None, None),
        ManifestRead::Unusable(warning) => (Some(Reason::NoManifest), None, Some(warning.clone())),
    };
    let trim_order = match inventory.access_times() {
        AccessTimes::Recorded => TrimOrder::LastAccess,
        AccessTimes::NotRecorded => TrimOrder::Modification,
    };
    let model = inventory.names().model_id(&identity.lmcache_model_name());
    let world_size = identity.kv_world_size();

    let mut deletions = Vec::new();
    let mut survivors: Vec<(i64, u32)> = Vec::new();
    let mut kept = CountBytes::default();
    for (index, object) in inventory.objects().iter().enumerate() {
        let index = index as u32;
        let reason = if policy.shared {
            None
        } else if policy.fence_only {
            identity_verdict.filter(|_| !matches!(manifest, ManifestRead::Missing))
        } else if Some(object.key.model) != model {
            Some(Reason::OtherModel)
        } else if u64::from(object.key.kv_rank.world_size()) != world_size {
            Some(Reason::OtherWorldSize)
        } else {
            identity_verdict
        };
        match reason {
            Some(reason) => deletions.push(Deletion {
                target: Target::Object(index),
                reason,
            }),
            None => {
                survivors.push((last_use(object, trim_order), index));
                kept.add(object.stats.allocated_bytes);
            }
        }
    }
    let mut limit = policy.capacity_bytes;
    let mut trimmed_for_guard = None;
    if let Some(guard) = policy.guard.filter(|g| kept.bytes >= g.trigger_bytes) {
        limit = Some(limit.map_or(guard.target_bytes, |c| c.min(guard.target_bytes)));
        trimmed_for_guard = Some(guard.target_bytes);
    }
    if let Some(limit) = limit {
        if kept.bytes > limit {
            survivors.sort_unstable();
            for (_, index) in survivors {
                if kept.bytes <= limit {
                    break;
                }
                let bytes = inventory.objects()[index as usize].stats.allocated_bytes;
                kept.count -= 1;
                kept.bytes -= bytes;
                deletions.push(Deletion {
                    target: Target::Object(index),
                    reason: Reason::Trim,
                });
            }
        }
    }
    let identity_purge = identity_purge(inventory, identity, manifest, &deletions);
    if !policy.shared {
        deletions.extend((0..inventory.temps().len() as u32).map(|i| Deletion {
            target: Target::Temp(i),
            reason: Reason::StaleTemp,
        }));
    }
    Plan {
        deletions,
        kept_objects: kept,
        trim_order,
        policy,
        manifest_change,
        manifest_warning,
        identity_purge,
        trimmed_for_guard,
    }
}

/// The [`IdentityPurge`] of `deletions` (objects only), if it takes more
/// than half of the tier's object bytes. The stored model and world size
/// are those of the objects of another model or world size holding the
/// most bytes; the manifest's fields follow.
fn identity_purge(
    inventory: &Inventory,
    identity: &LaunchIdentity,
    manifest: &ManifestRead,
    deletions: &[Deletion],
) -> Option<IdentityPurge> {
    let mut purged = CountBytes::default();
    let mut by_cause: BTreeMap<Reason, CountBytes> = BTreeMap::new();
    let mut by_writer: HashMap<(ModelId, u8), u64> = HashMap::new();
    for deletion in deletions.iter().filter(|d| d.reason != Reason::Trim) {
        let Target::Object(i) = deletion.target else {
            continue;
        };
        let object = &inventory.objects()[i as usize];
        purged.add(object.stats.allocated_bytes);
        by_cause
            .entry(deletion.reason)
            .or_default()
            .add(object.stats.allocated_bytes);
        if matches!(deletion.reason, Reason::OtherModel | Reason::OtherWorldSize) {
            *by_writer
                .entry((object.key.model, object.key.kv_rank.world_size()))
                .or_default() += object.stats.allocated_bytes;
        }
    }
    let objects = inventory.totals().objects;
    let most = match objects.bytes {
        0 => purged.count * 2 > objects.count,
        total => purged.bytes.saturating_mul(2) > total,
    };
    if !most {
        return None;
    }
    let writer = writer_changes(inventory, identity, by_writer);
    let recorded = manifest_changes(manifest, identity);
    let causes = by_cause
        .into_iter()
        .map(|(reason, cb)| PurgeCause {
            reason,
            count: cb.count,
            bytes: cb.bytes,
            changes: match reason {
                Reason::OtherModel => field_changes(&writer, &["model"]),
                Reason::OtherWorldSize => field_changes(&writer, &["kv_world_size"]),
                Reason::ManifestMismatch { .. } => recorded.clone(),
                _ => Vec::new(),
            },
        })
        .collect();
    let mut changes = writer;
    for change in recorded {
        if !changes.iter().any(|c| c.field == change.field) {
            changes.push(change);
        }
    }
    Some(IdentityPurge {
        purged,
        objects,
        changes,
        causes,
    })
}

/// The model and world size of the writer holding the most bytes among
/// `by_writer`, against this launch's.
fn writer_changes(
    inventory: &Inventory,
    identity: &LaunchIdentity,
    by_writer: HashMap<(ModelId, u8), u64>,
) -> Vec<IdentityChange> {
    let mut changes = Vec::new();
    let writer = by_writer
        .into_iter()
        .max_by_key(|&((model, world), bytes)| (bytes, std::cmp::Reverse((model, world))));
    if let Some(((model, world), _)) = writer {
        let current = identity.lmcache_model_name();
        if inventory.names().model_id(&current) != Some(model) {
            changes.push(IdentityChange {
                field: IdentityField::Model.as_str(),
                stored: inventory.names().model(model).into_owned(),
                current: current.into_owned(),
            });
        }
        if u64::from(world) != identity.kv_world_size() {
            changes.push(IdentityChange {
                field: "kv_world_size",
                stored: world.to_string(),
                current: identity.kv_world_size().to_string(),
            });
        }
    }
    changes
}

/// The fields the manifest records otherwise than this launch.
fn manifest_changes(manifest: &ManifestRead, identity: &LaunchIdentity) -> Vec<IdentityChange> {
    let ManifestRead::Found(found) = manifest else {
        return Vec::new();
    };
    found
        .identity
        .differences(identity)
        .map(|(field, stored, current)| IdentityChange {
            field: field.as_str(),
            stored,
            current,
        })
        .collect()
}

/// The changes of `changes` whose field is one of `fields`.
fn field_changes(changes: &[IdentityChange], fields: &[&str]) -> Vec<IdentityChange> {
    changes
        .iter()
        .filter(|c| fields.contains(&c.field))
        .cloned()
        .collect()
}

fn last_use(object: &ObjectEntry, order: TrimOrder) -> i64 {
    match order {
        TrimOrder::LastAccess => object.stats.accessed_ns.max(object.stats.modified_ns),
        TrimOrder::Modification => object.stats.modified_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{ChunkHash, KvRank, ObjectName};
    use crate::identity::Manifest;
    use crate::scan::{EntryStats, TempOrigin};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const MIB: u64 = 1 << 20;

    fn identity() -> LaunchIdentity {
        LaunchIdentity {
            model: "org/model".into(),
            tensor_parallel_size: 2,
            pipeline_parallel_size: 2,
            kv_cache_dtype: "bfloat16".into(),
            block_size: 16,
            chunk_size: 256,
            decode_context_parallel_size: 1,
            cp_kv_cache_interleave_size: 1,
            mla_only: false,
            weights: None,
            engine_settings: Default::default(),
        }
    }

    fn manifest_of(identity: &LaunchIdentity) -> ManifestRead {
        ManifestRead::Found(Manifest {
            schema_version: 1,
            identity: identity.clone(),
            identity_digest: identity.digest(),
            writer: "test".into(),
            written_at: "2025-01-01T00:00:00Z".into(),
        })
    }

    fn object(model: &str, world_size: u8, n: u16) -> ObjectName {
        ObjectName {
            model: model.into(),
            kv_rank: KvRank::new(world_size, 0, world_size, 0),
            object_group: 0,
            chunk_hash: ChunkHash::from_bytes(&n.to_be_bytes()).unwrap(),
            salt: None,
        }
    }

    fn stats(mib: u64, modified_s: i64, accessed_s: i64) -> EntryStats {
        EntryStats {
            allocated_bytes: mib * MIB,
            modified_ns: modified_s * 1_000_000_000,
            accessed_ns: accessed_s * 1_000_000_000,
        }
    }

    fn reasons(inventory: &Inventory, plan: &Plan) -> BTreeMap<String, Reason> {
        plan.deletions
            .iter()
            .map(|d| {
                let name = match d.target {
                    Target::Object(i) => inventory
                        .names()
                        .name(&inventory.objects()[i as usize].key)
                        .to_string(),
                    Target::Temp(i) => inventory.temps()[i as usize].name.to_string(),
                };
                (name, d.reason)
            })
            .collect()
    }

    fn mixed() -> Inventory {
        let mut inv = Inventory::new("/tier", AccessTimes::Recorded);
        inv.add_object(&object("org/model", 4, 1), stats(1, 10, 10));
        inv.add_object(&object("org/other", 4, 2), stats(1, 10, 10));
        inv.add_object(&object("org/model", 2, 3), stats(1, 10, 10));
        inv.add_object(&object("test-model", 1, 4), stats(1, 10, 10));
        inv.add_temp(
            "org-SEP-model@0x04000400@0@0005.tmp",
            TempOrigin::Lmcache,
            stats(1, 1, 1),
        );
        inv
    }

    #[test]
    fn same_identity_keeps_its_objects_and_purges_the_others() {
        let inv = mixed();
        let plan = plan(
            &inv,
            &identity(),
            &manifest_of(&identity()),
            TierPolicy::default(),
        );
        let got = reasons(&inv, &plan);
        assert_eq!(got.len(), 4);
        assert_eq!(
            got[&object("org/other", 4, 2).to_string()],
            Reason::OtherModel
        );
        assert_eq!(
            got[&object("test-model", 1, 4).to_string()],
            Reason::OtherModel
        );
        assert_eq!(
            got[&object("org/model", 2, 3).to_string()],
            Reason::OtherWorldSize
        );
        assert_eq!(
            got["org-SEP-model@0x04000400@0@0005.tmp"],
            Reason::StaleTemp
        );
        assert_eq!(
            plan.kept_objects,
            CountBytes {
                count: 1,
                bytes: MIB
            }
        );
        assert_eq!(plan.manifest_change, None);
    }

    #[test]
    fn a_changed_chunk_size_purges_every_object_and_names_the_field() {
        let inv = mixed();
        let mut recorded = identity();
        recorded.chunk_size = 512;
        let plan = plan(
            &inv,
            &identity(),
            &manifest_of(&recorded),
            TierPolicy::default(),
        );
        let got = reasons(&inv, &plan);
        assert_eq!(
            got[&object("org/model", 4, 1).to_string()],
            Reason::ManifestMismatch {
                field: IdentityField::ChunkSize
            }
        );
        assert_eq!(plan.kept_objects, CountBytes::default());
        let change = plan.manifest_change.unwrap();
        assert_eq!(
            (change.recorded.as_str(), change.current.as_str()),
            ("512", "256")
        );
    }

    /// Other weights under the same model (a checkpoint rewritten in
    /// place, a hub id at a new commit): every object goes, and the purge
    /// says which weights it was written from.
    #[test]
    fn other_weights_purge_every_object_and_say_which() {
        let mut inv = Inventory::new("/tier", AccessTimes::Recorded);
        for n in 0..3 {
            inv.add_object(&object("org/model", 4, n), stats(2, 10, 10));
        }
        let recorded = LaunchIdentity {
            weights: Some("commit a1b2".into()),
            ..identity()
        };
        let current = LaunchIdentity {
            weights: Some("commit c3d4".into()),
            ..identity()
        };
        let plan = plan(
            &inv,
            &current,
            &manifest_of(&recorded),
            TierPolicy::default(),
        );
        assert_eq!(plan.kept_objects, CountBytes::default());
        let got = reasons(&inv, &plan);
        assert!(got.values().all(|r| *r
            == Reason::ManifestMismatch {
                field: IdentityField::Weights
            }));
        let line = plan.identity_purge.expect("all purged").to_string();
        assert!(
            line.contains(r#"weights "commit a1b2" -> "commit c3d4""#),
            "{line}"
        );
    }

    /// A fenced tier: kept whole without a manifest (adopted), kept with
    /// other models' objects under its own identity, purged whole under
    /// another identity or an unusable manifest.
    #[test]
    fn a_fenced_tier_is_purged_only_by_its_manifest() {
        let inv = mixed();
        let fenced = TierPolicy {
            fence_only: true,
            ..TierPolicy::default()
        };
        let all = inv.objects().len() as u64;
        let kept =
            |manifest: &ManifestRead| plan(&inv, &identity(), manifest, fenced).kept_objects.count;
        assert_eq!(kept(&ManifestRead::Missing), all);
        assert_eq!(kept(&manifest_of(&identity())), all);
        let other = LaunchIdentity {
            weights: Some("commit a1b2".into()),
            ..identity()
        };
        assert_eq!(kept(&manifest_of(&other)), 0);
        let unusable = ManifestRead::Unusable(ManifestWarning {
            path: "/tier/.lmcache-tier-identity.json".into(),
            problem: "bad".into(),
        });
        assert_eq!(kept(&unusable), 0);
    }

    #[test]
    fn no_manifest_or_an_unusable_one_purges_every_object() {
        let inv = mixed();
        let warning = ManifestWarning {
            path: "/tier/.lmcache-tier-identity.json".into(),
            problem: "bad".into(),
        };
        for manifest in [
            ManifestRead::Missing,
            ManifestRead::Unusable(warning.clone()),
        ] {
            let plan = plan(&inv, &identity(), &manifest, TierPolicy::default());
            let got = reasons(&inv, &plan);
            assert_eq!(
                got[&object("org/model", 4, 1).to_string()],
                Reason::NoManifest
            );
            assert_eq!(
                got[&object("org/other", 4, 2).to_string()],
                Reason::OtherModel
            );
            assert_eq!(plan.kept_objects.count, 0);
            assert_eq!(
                plan.manifest_warning.is_some(),
                matches!(manifest, ManifestRead::Unusable(_))
            );
        }
    }

    #[test]
    fn a_purge_of_most_of_the_tier_names_what_the_objects_were_written_under() {
        let mut inv = Inventory::new("/tier", AccessTimes::Recorded);
        for n in 0..3 {
            inv.add_object(&object("/models/model", 4, n), stats(2, 10, 10));
        }
        inv.add_object(&object("org/model", 4, 9), stats(1, 10, 10));
        let recorded = LaunchIdentity {
            model: "/models/model".into(),
            chunk_size: 512,
            ..identity()
        };
        let plan = plan(
            &inv,
            &identity(),
            &manifest_of(&recorded),
            TierPolicy::default(),
        );
        let purge = plan.identity_purge.expect("7 of 7 MiB purged");
        assert_eq!(
            (purge.purged, purge.objects),
            (
                CountBytes {
                    count: 4,
                    bytes: 7 * MIB
                },
                CountBytes {
                    count: 4,
                    bytes: 7 * MIB
                }
            )
        );
        let changes: Vec<_> = purge
            .changes
            .iter()
            .map(|c| (c.field, c.stored.as_str(), c.current.as_str()))
            .collect();
        assert_eq!(
            changes,
            vec![
                ("model", "/models/model", "org/model"),
                ("chunk_size", "512", "256"),
            ]
        );
        let line = purge.to_string();
        assert!(
            line.starts_with("100% of the tier (4 of 4 objects, 7.0 MiB)")
                && line.contains(r#"model "/models/model" -> "org/model""#),
            "{line}"
        );
    }

    #[test]
    fn each_cause_of_a_purge_has_its_own_count() {
        let mut inv = Inventory::new("/tier", AccessTimes::Recorded);
        for n in 0..3 {
            inv.add_object(&object("org/model", 4, n), stats(1, 10, 10));
        }
        for n in 3..7 {
            inv.add_object(&object("org/other", 4, n), stats(1, 10, 10));
        }
        let plan = plan(
            &inv,
            &identity(),
            &ManifestRead::Missing,
            TierPolicy::default(),
        );
        let purge = plan.identity_purge.expect("7 of 7 MiB purged");
        let causes: Vec<_> = purge
            .causes
            .iter()
            .map(|c| (c.reason, c.count, c.changes.len()))
            .collect();
        assert_eq!(
            causes,
            [(Reason::OtherModel, 4, 1), (Reason::NoManifest, 3, 0)]
        );
        let line = purge.to_string();
        assert!(
            line.contains(r#": 4 objects (4.0 MiB) of another model (model "org/other" -> "org/model"); 3 objects (3.0 MiB) with no usable identity manifest"#),
            "{line}"
        );
    }

    #[test]
    fn a_purge_of_half_the_tier_or_less_is_not_flagged() {
        let mut inv = Inventory::new("/tier", AccessTimes::Recorded);
        inv.add_object(&object("org/model", 4, 1), stats(2, 10, 10));
        inv.add_object(&object("org/other", 4, 2), stats(2, 10, 10));
        let manifest = manifest_of(&identity());
        let half = plan(&inv, &identity(), &manifest, TierPolicy::default());
        assert_eq!(half.deletions.len(), 1);
        assert_eq!(half.identity_purge, None);
        inv.add_object(&object("org/other", 2, 3), stats(1, 10, 10));
        let most = plan(&inv, &identity(), &manifest, TierPolicy::default());
        let changes = most.identity_purge.expect("3 of 5 MiB").changes;
        assert_eq!(changes[0].field, "model");
        assert_eq!(changes[0].stored, "org/other");
        let trimmed = plan(
            &inv,
            &identity(),
            &manifest,
            TierPolicy {
                capacity_bytes: Some(0),
                ..TierPolicy::default()
            },
        );
        assert_eq!(
            trimmed.identity_purge.map(|p| p.purged.count),
            Some(2),
            "trimmed objects are not counted as purged by identity"
        );
    }

    #[test]
    fn objects_are_matched_by_the_name_and_world_size_lmcache_writes() {
        let dcp = LaunchIdentity {
            tensor_parallel_size: 4,
            pipeline_parallel_size: 1,
            decode_context_parallel_size: 2,
            cp_kv_cache_interleave_size: 16,
            ..identity()
        };
        let mla = LaunchIdentity {
            tensor_parallel_size: 8,
            pipeline_parallel_size: 2,
            mla_only: true,
            ..identity()
        };
        let mut inv = Inventory::new("/tier", AccessTimes::Recorded);
        inv.add_object(
            &object("org/model##lmcache-dcp-layout-v1-d2-interleave16", 4, 1),
            stats(1, 10, 10),
        );
        inv.add_object(&object("org/model", 2, 2), stats(1, 10, 10));
        let kept_by = |identity: &LaunchIdentity| {
            let plan = plan(
                &inv,
                identity,
                &manifest_of(identity),
                TierPolicy::default(),
            );
            let deleted: Vec<Target> = plan.deletions.iter().map(|d| d.target).collect();
            (0..2)
                .filter(|i| !deleted.contains(&Target::Object(*i)))
                .collect::<Vec<u32>>()
        };
        assert_eq!(kept_by(&dcp), vec![0]);
        assert_eq!(kept_by(&mla), vec![1]);
    }

    #[test]
    fn shared_tiers_are_never_purged_by_identity_and_keep_temps() {
        let inv = mixed();
        let policy = TierPolicy {
            shared: true,
            ..TierPolicy::default()
        };
        let plan = plan(&inv, &identity(), &ManifestRead::Missing, policy);
        assert!(plan.deletions.is_empty());
        assert_eq!(plan.kept_objects.count, 4);
    }

    #[test]
    fn trim_takes_the_least_recently_used_first_until_it_fits() {
        let mut inv = Inventory::new("/tier", AccessTimes::Recorded);
        // (n, MiB, mtime, atime): last use = max(atime, mtime)
        for (n, mib, m, a) in [
            (1, 4, 100, 100),
            (2, 4, 50, 400),
            (3, 4, 300, 0),
            (4, 4, 200, 200),
        ] {
            inv.add_object(&object("org/model", 4, n), stats(mib, m, a));
        }
        let policy = TierPolicy {
            capacity_bytes: Some(9 * MIB),
            ..TierPolicy::default()
        };
        let plan = plan(&inv, &identity(), &manifest_of(&identity()), policy);
        let trimmed: Vec<_> = plan
            .deletions
            .iter()
            .map(|d| (d.target, d.reason))
            .collect();
        assert_eq!(
            trimmed,
            vec![
                (Target::Object(0), Reason::Trim),
                (Target::Object(3), Reason::Trim)
            ]
        );
        assert_eq!(plan.trim_order, TrimOrder::LastAccess);
        assert_eq!(
            plan.kept_objects,
            CountBytes {
                count: 2,
                bytes: 8 * MIB
            }
        );
    }

    /// A tier at or above its guard's trigger is trimmed to the guard's
    /// target: at its capacity (the example: trimmed to 100%, then the
    /// guard deleted 30% more), over it, and exactly at the trigger; below
    /// the trigger, to the capacity as before (nothing).
    #[test]
    fn a_tier_at_the_guards_trigger_is_trimmed_to_where_the_guard_leaves_it() {
        // Capacity 100 MiB, trigger 0.9, target 0.7 (a built-in tier's
        // hard bound: watermark 0.8, ratio 0.2).
        let guard = GuardBound {
            trigger_bytes: 90 * MIB,
            target_bytes: 70 * MIB,
        };
        let policy = TierPolicy {
            capacity_bytes: Some(100 * MIB),
            guard: Some(guard),
            ..TierPolicy::default()
        };
        for (objects, kept, trimmed_for_guard) in [
            (100, 70, Some(70 * MIB)),
            (130, 70, Some(70 * MIB)),
            (90, 70, Some(70 * MIB)),
            (89, 89, None),
            (10, 10, None),
        ] {
            let mut inv = Inventory::new("/tier", AccessTimes::Recorded);
            for n in 0..objects {
                inv.add_object(&object("org/model", 4, n), stats(1, i64::from(n), 0));
            }
            let plan = plan(&inv, &identity(), &manifest_of(&identity()), policy);
            assert_eq!(plan.kept_objects.bytes, kept * MIB, "{objects} objects");
            assert_eq!(
                plan.trimmed_for_guard, trimmed_for_guard,
                "{objects} objects"
            );
            // The oldest go: what is kept is the newest `kept`.
            let deleted: Vec<u32> = plan
                .deletions
                .iter()
                .map(|d| match d.target {
                    Target::Object(i) => i,
                    Target::Temp(_) => unreachable!("no temps here"),
                })
                .collect();
            assert_eq!(
                deleted,
                (0..(u32::from(objects) - kept as u32)).collect::<Vec<_>>()
            );
        }
        // Without a capacity, the guard's bound still applies.
        let mut inv = Inventory::new("/tier", AccessTimes::Recorded);
        for n in 0..95 {
            inv.add_object(&object("org/model", 4, n), stats(1, i64::from(n), 0));
        }
        let bound_only = TierPolicy {
            guard: Some(guard),
            ..TierPolicy::default()
        };
        let plan = plan(&inv, &identity(), &manifest_of(&identity()), bound_only);
        assert_eq!(plan.kept_objects.bytes, 70 * MIB);
    }

    #[test]
    fn on_a_noatime_volume_trim_goes_by_modification_time() {
        let mut inv = Inventory::new("/tier", AccessTimes::NotRecorded);
        inv.add_object(&object("org/model", 4, 1), stats(1, 100, 900));
        inv.add_object(&object("org/model", 4, 2), stats(1, 200, 0));
        let policy = TierPolicy {
            capacity_bytes: Some(MIB),
            ..TierPolicy::default()
        };
        let plan = plan(&inv, &identity(), &manifest_of(&identity()), policy);
        assert_eq!(plan.trim_order, TrimOrder::Modification);
        assert_eq!(plan.deletions[0].target, Target::Object(0));
    }

    proptest! {
        #[test]
        fn trim_never_deletes_a_newer_object_while_keeping_an_older_one(
            objects in proptest::collection::vec((1u64..8, 0i64..1000, 0i64..1000), 0..40),
            capacity_mib in 0u64..100,
        ) {
            let mut inv = Inventory::new("/tier", AccessTimes::Recorded);
            for (n, (mib, m, a)) in objects.iter().enumerate() {
                inv.add_object(&object("org/model", 4, n as u16), stats(*mib, *m, *a));
            }
            let policy = TierPolicy { capacity_bytes: Some(capacity_mib * MIB), ..TierPolicy::default() };
            let plan = plan(&inv, &identity(), &manifest_of(&identity()), policy);
            prop_assert!(plan.kept_objects.bytes <= capacity_mib * MIB);
            let deleted: std::collections::HashSet<u32> = plan.deletions.iter().map(|d| match d.target {
                Target::Object(i) => i,
                Target::Temp(_) => unreachable!("no temps in this inventory"),
            }).collect();
            let use_of = |i: usize| objects[i].1.max(objects[i].2);
            let newest_deleted = deleted.iter().map(|&i| use_of(i as usize)).max();
            let oldest_kept = (0..objects.len()).filter(|i| !deleted.contains(&(*i as u32))).map(use_of).min();
            if let (Some(d), Some(k)) = (newest_deleted, oldest_kept) {
                prop_assert!(d <= k);
            }
            let kept_bytes: u64 = (0..objects.len())
                .filter(|i| !deleted.contains(&(*i as u32)))
                .map(|i| objects[i].0 * MIB)
                .sum();
            prop_assert_eq!(kept_bytes, plan.kept_objects.bytes);
        }
    }
}
