//! What a bound knows of the bucket, and which objects go: the last
//! listing with this node's changes on top ([`BucketView`]), and the one
//! rule of the victims ([`victims`]) (`docs/s3-gateway.md`, "The bucket
//! bound").

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::rule::BoundSpec;

/// The LMCache objects of one cache identity under the prefix
/// ([`crate::identity`]): its tag (`""` for objects under no identity's
/// segment, written by a gateway without one), objects and bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityUsage {
    /// The identity's tag, 16 hex digits; `""` for none.
    pub tag: String,
    /// Its objects.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// One object of a listing: its key without the tier's prefix, its size
/// and when the store last wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    /// The key inside the tier's prefix.
    pub key: String,
    /// Bytes.
    pub bytes: u64,
    /// The store's `LastModified`.
    pub modified: SystemTime,
}

/// What the bound knows of one object: its size and the store's
/// `LastModified`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Bytes.
    pub bytes: u64,
    /// When the store wrote it: the listing's `LastModified`, or for this
    /// node's own PUTs the `Date` of the store's answer (this node's clock
    /// only where the store sent none). Only listed objects are ordered by
    /// it against each other ([`BucketView::victims`]).
    pub modified: SystemTime,
}

/// The objects to delete from a bucket whose LMCache objects are
/// `objects` (key inside the prefix, entry), `usage_bytes` in all: none
/// below `bound`'s trigger; else the oldest by `modified`, ties by key,
/// until the rest is at or below the target. Every node that sees the same
/// objects chooses the same victims.
pub fn victims<'a>(
    objects: impl IntoIterator<Item = (&'a str, &'a Entry)>,
    usage_bytes: u64,
    bound: &BoundSpec,
) -> Vec<(&'a str, u64)> {
    if usage_bytes < bound.trigger_bytes {
        return Vec::new();
    }
    let mut oldest_first: Vec<(&str, &Entry)> = objects.into_iter().collect();
    oldest_first.sort_unstable_by(|a, b| (a.1.modified, a.0).cmp(&(b.1.modified, b.0)));
    let mut left = usage_bytes;
    oldest_first
        .into_iter()
        .take_while(|(_, entry)| {
            let take = left > bound.target_bytes;
            left = left.saturating_sub(entry.bytes);
            take
        })
        .map(|(key, entry)| (key, entry.bytes))
        .collect()
}

/// A change of this node's while a listing runs, applied again on top of
/// the listing when it ends.
#[derive(Debug, Clone)]
enum Change {
    Stored(String, Entry),
    Removed(String),
}

/// What the bound knows of the bucket: the last listing with this node's
/// changes since on top.
///
/// The victims come from the listing only: an object this node stored
/// since the listing began is counted in the usage but chosen only once a
/// later listing shows it. Other nodes may have written objects since that
/// listing too, which only a listing shows; so the oldest first holds by
/// one clock, the store's `LastModified`, across every node, and a `Date`
/// header is never compared with a `LastModified`.
#[derive(Debug, Default)]
pub struct BucketView {
    objects: HashMap<String, Entry>,
    /// Keys this node stored since the last listing began: not victims
    /// until a listing shows them.
    unlisted: HashSet<String>,
    bytes: u64,
    /// Objects and bytes by cache identity tag (`""` for none).
    identities: BTreeMap<String, (u64, u64)>,
    /// `Some` while a listing runs.
    journal: Option<Vec<Change>>,
    written_since_listing: u64,
}

impl BucketView {
    /// Bytes of the LMCache objects known.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// LMCache objects known.
    pub fn objects(&self) -> usize {
        self.objects.len()
    }

    /// The objects and bytes of each cache identity the view holds, by tag
    /// (`""`, objects under no identity's segment, first).
    pub fn identities(&self) -> Vec<IdentityUsage> {
        self.identities
            .iter()
            .map(|(tag, &(objects, bytes))| IdentityUsage {
                tag: tag.clone(),
                objects,
                bytes,
            })
            .collect()
    }

    /// Records an object this node stored (or learned of), replacing one
    /// of the same key.
    pub fn stored(&mut self, key: String, entry: Entry) {
        self.written_since_listing = self.written_since_listing.saturating_add(entry.bytes);
        if let Some(journal) = &mut self.journal {
            journal.push(Change::Stored(key.clone(), entry));
        }
        self.unlisted.insert(key.clone());
        self.insert(key, entry);
    }

    /// Forgets an object this node deleted, or found gone.
    pub fn removed(&mut self, key: &str) {
        if let Some(journal) = &mut self.journal {
            journal.push(Change::Removed(key.to_string()));
        }
        self.unlisted.remove(key);
        self.remove(key);
    }

    /// Whether a listing is due: this node wrote `every_bytes` or more
    /// since the last one began.
    pub fn listing_due(&self, every_bytes: u64) -> bool {
        self.written_since_listing >= every_bytes.max(1)
    }

    /// A listing starts: this node's changes from now on are kept to be
    /// applied on top of it.
    pub fn begin_listing(&mut self) {
        self.journal = Some(Vec::new());
        self.written_since_listing = 0;
    }

    /// The listing failed: the view goes on as it was.
    pub fn listing_failed(&mut self) {
        self.journal = None;
    }

    /// The listing ended with `listed` (LMCache's objects only): it replaces the view, with this node's changes since its
    /// start on top. Returns the objects and bytes it holds that the view
    /// did not know (what other nodes wrote).
    pub fn finish_listing(&mut self, listed: Vec<StoredObject>) -> (u64, u64) {
        let journal = self.journal.take().unwrap_or_default();
        let mut others = (0, 0);
        let before = std::mem::take(&mut self.objects);
        self.unlisted.clear();
        self.bytes = 0;
        self.identities.clear();
        for object in listed {
            if !before.contains_key(&object.key) {
                others.0 += 1;
                others.1 = u64::saturating_add(others.1, object.bytes);
            }
            let entry = Entry {
                bytes: object.bytes,
                modified: object.modified,
            };
            self.insert(object.key, entry);
        }
        for change in journal {
            match change {
                Change::Stored(key, entry) => {
                    self.unlisted.insert(key.clone());
                    self.insert(key, entry);
                }
                Change::Removed(key) => {
                    self.unlisted.remove(&key);
                    self.remove(&key);
                }
            }
        }
        others
    }

    /// The victims of [`victims`] among this view's listed objects (not
    /// those this node stored since the listing) for a usage of
    /// `usage_bytes` (the view's bytes, or more where the bucket is known
    /// to hold more than the view's objects). Fewer than the usage calls
    /// for, or none, when the listed objects run out: a new listing
    /// brings the rest in order.
    pub fn victims(&self, usage_bytes: u64, bound: &BoundSpec) -> Vec<(String, u64)> {
        let objects = self
            .objects
            .iter()
            .filter(|(k, _)| !self.unlisted.contains(*k))
            .map(|(k, e)| (k.as_str(), e));
        victims(objects, usage_bytes, bound)
            .into_iter()
            .map(|(key, bytes)| (key.to_string(), bytes))
            .collect()
    }

    fn insert(&mut self, key: String, entry: Entry) {
        let tag = crate::identity::split(&key)
            .0
            .unwrap_or_default()
            .to_string();
        let old = self.objects.insert(key, entry);
        let old_bytes = old.map_or(0, |e| e.bytes);
        self.bytes = self
            .bytes
            .saturating_sub(old_bytes)
            .saturating_add(entry.bytes);
        let usage = self.identities.entry(tag).or_default();
        usage.0 += u64::from(old.is_none());
        usage.1 = usage
            .1
            .saturating_sub(old_bytes)
            .saturating_add(entry.bytes);
    }

    fn remove(&mut self, key: &str) {
        if let Some(old) = self.objects.remove(key) {
            self.bytes = self.bytes.saturating_sub(old.bytes);
            let tag = crate::identity::split(key).0.unwrap_or_default();
            if let Some(usage) = self.identities.get_mut(tag) {
                usage.0 = usage.0.saturating_sub(1);
                usage.1 = usage.1.saturating_sub(old.bytes);
                if usage.0 == 0 {
                    self.identities.remove(tag);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::BoundRole;
    use proptest::prelude::*;
    use std::time::Duration;

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn below_the_trigger_nothing_is_chosen_and_above_it_the_oldest_go_first() {
        let bound = BoundSpec::new(100, 0.8, 0.2, BoundRole::Evictor);
        assert_eq!((bound.trigger_bytes, bound.target_bytes), (80, 60));
        let e = |bytes, s| Entry {
            bytes,
            modified: at(s),
        };
        let objects = [("c", e(30, 5)), ("b", e(30, 7)), ("a", e(19, 9))];
        let refs = objects.iter().map(|(k, e)| (*k, e));
        assert!(victims(refs, 79, &bound).is_empty());
        let refs = objects.iter().map(|(k, e)| (*k, e));
        assert_eq!(victims(refs, 79 + 1, &bound), [("c", 30)]);
        let tie = [("b", e(30, 5)), ("a", e(30, 5)), ("c", e(30, 5))];
        let refs = tie.iter().map(|(k, e)| (*k, e));
        assert_eq!(victims(refs, 90, &bound), [("a", 30)]);
    }

    /// A rolling upgrade as the view sees it: the old identity's objects
    /// shrink as they are removed, the new one's grow, and objects under
    /// no identity's segment are counted apart.
    #[test]
    fn the_view_counts_each_cache_identity_apart() {
        let (old, new) = ("0123456789abcdef", "fedcba9876543210");
        let key = |tag: &str, n: u32| match tag {
            "" => format!("m@{n}"),
            tag => format!("{}m@{n}", crate::identity::segment(tag)),
        };
        let e = |bytes| Entry {
            bytes,
            modified: at(1),
        };
        let mut view = BucketView::default();
        view.begin_listing();
        view.stored(key(new, 9), e(5));
        let listed = [(old, 1), (old, 2), ("", 3)].map(|(tag, n)| StoredObject {
            key: key(tag, n),
            bytes: 10,
            modified: at(0),
        });
        view.finish_listing(listed.to_vec());
        let usage = |view: &BucketView| {
            view.identities()
                .into_iter()
                .map(|u| (u.tag, u.objects, u.bytes))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            usage(&view),
            [
                (String::new(), 1, 10),
                (old.to_string(), 2, 20),
                (new.to_string(), 1, 5)
            ]
        );
        view.stored(key(new, 9), e(7));
        view.removed(&key(old, 1));
        view.removed(&key(old, 1));
        view.removed(&key(old, 2));
        assert_eq!(
            usage(&view),
            [(String::new(), 1, 10), (new.to_string(), 1, 7)]
        );
        assert_eq!((view.objects(), view.bytes()), (2, 17));
    }

    /// The store's `Date` 10 minutes behind its `LastModified`, and other
    /// nodes' writes the view does not hold yet: this node's newest
    /// objects (dated by `Date`, so they look oldest) are never chosen
    /// before the listing shows them, and once it does the order is the
    /// listing's alone.
    #[test]
    fn objects_this_node_stored_since_the_listing_wait_for_the_next_one() {
        let bound = BoundSpec::new(100, 0.8, 0.2, BoundRole::Evictor);
        let object = |key: &str, s| StoredObject {
            key: key.into(),
            bytes: 10,
            modified: at(s),
        };
        let mut view = BucketView::default();
        view.begin_listing();
        view.finish_listing(
            (0..5)
                .map(|i| object(&format!("old{i}"), 1000 + i))
                .collect(),
        );
        for i in 0..4 {
            let date = Entry {
                bytes: 10,
                modified: at(400 + i),
            };
            view.stored(format!("mine{i}"), date);
        }
        let chosen = view.victims(95, &bound);
        assert!(
            chosen.iter().all(|(k, _)| k.starts_with("old")),
            "{chosen:?}"
        );
        assert_eq!(chosen.len(), 4);
        for (key, _) in view.victims(200, &bound) {
            view.removed(&key);
        }
        assert!(view.victims(200, &bound).is_empty());
        view.begin_listing();
        let mut listed: Vec<StoredObject> = (0..4)
            .map(|i| object(&format!("mine{i}"), 2000 + i))
            .collect();
        listed.push(object("other", 1500));
        view.finish_listing(listed);
        let chosen = view.victims(85, &bound);
        assert_eq!(
            chosen,
            [
                ("other".to_string(), 10),
                ("mine0".to_string(), 10),
                ("mine1".to_string(), 10)
            ]
        );
    }

    #[test]
    fn a_listing_replaces_the_view_under_the_changes_made_while_it_ran() {
        let object = |key: &str, bytes| StoredObject {
            key: key.into(),
            bytes,
            modified: at(1),
        };
        let mut view = BucketView::default();
        view.stored(
            "mine".into(),
            Entry {
                bytes: 5,
                modified: at(0),
            },
        );
        view.begin_listing();
        view.stored(
            "new".into(),
            Entry {
                bytes: 7,
                modified: at(2),
            },
        );
        view.removed("gone");
        let others = view.finish_listing(vec![
            object("mine", 5),
            object("theirs", 11),
            object("gone", 3),
        ]);
        assert_eq!(others, (2, 14));
        assert_eq!((view.objects(), view.bytes()), (3, 5 + 11 + 7));
    }

    #[test]
    fn a_listing_is_due_once_the_node_wrote_a_fiftieth_of_the_capacity() {
        let bound = BoundSpec::new(5000, 0.8, 0.2, BoundRole::Evictor);
        assert_eq!(bound.listing_every_bytes, 100);
        let mut view = BucketView::default();
        view.begin_listing();
        view.finish_listing(Vec::new());
        let entry = |bytes| Entry {
            bytes,
            modified: at(0),
        };
        view.stored("a".into(), entry(60));
        view.stored("b".into(), entry(39));
        assert!(!view.listing_due(bound.listing_every_bytes));
        view.stored("c".into(), entry(1));
        assert!(view.listing_due(bound.listing_every_bytes));
        view.begin_listing();
        assert!(!view.listing_due(bound.listing_every_bytes));
    }

    proptest! {
        /// The victims are a prefix of the objects oldest first (ties by
        /// key), leave the usage at or below the target, and would leave it
        /// above the target without the last one; the same objects in any
        /// order give the same victims.
        #[test]
        fn victims_are_the_oldest_just_enough_and_independent_of_order(
            sizes in proptest::collection::vec((1u64..50, 0u64..20), 0..40),
            capacity in 1u64..2000,
            watermark in 0.05f64..1.0,
            ratio in 0.05f64..1.0,
            hard in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let role = if hard { BoundRole::HardBound } else { BoundRole::Evictor };
            let bound = BoundSpec::new(capacity, watermark, ratio, role);
            let objects: Vec<(String, Entry)> = sizes
                .iter()
                .enumerate()
                .map(|(i, (bytes, s))| (format!("k{i:03}"), Entry { bytes: *bytes, modified: at(*s) }))
                .collect();
            let usage: u64 = objects.iter().map(|(_, e)| e.bytes).sum();
            let chosen = victims(objects.iter().map(|(k, e)| (k.as_str(), e)), usage, &bound);
            let mut shuffled = objects.clone();
            let n = shuffled.len().max(1);
            shuffled.rotate_left((seed as usize) % n);
            shuffled.reverse();
            let again = victims(shuffled.iter().map(|(k, e)| (k.as_str(), e)), usage, &bound);
            prop_assert_eq!(&chosen, &again);
            if usage < bound.trigger_bytes {
                prop_assert!(chosen.is_empty());
                return Ok(());
            }
            let mut sorted: Vec<&(String, Entry)> = objects.iter().collect();
            sorted.sort_by(|a, b| (a.1.modified, &a.0).cmp(&(b.1.modified, &b.0)));
            let expected: Vec<(&str, u64)> = sorted.iter().take(chosen.len()).map(|(k, e)| (k.as_str(), e.bytes)).collect();
            prop_assert_eq!(&chosen, &expected);
            let freed: u64 = chosen.iter().map(|(_, b)| b).sum();
            prop_assert!(usage - freed <= bound.target_bytes);
            if let Some((_, last)) = chosen.last() {
                prop_assert!(usage - freed + last > bound.target_bytes);
            }
        }
    }
}
