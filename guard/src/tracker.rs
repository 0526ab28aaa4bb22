//! The guard's LRU bookkeeping of one tier: which objects it holds, their
//! allocated bytes, and the order in which they were last used.
//!
//! Memory: 44 bytes an object in a dense array (the chunk hash inline, a
//! 4-byte id of the rest of the name, allocated bytes in 512-byte blocks, a
//! 4-byte use tick) plus a `hashbrown` index of 4-byte slots (about 5 to 10
//! bytes an object at its load factor): at most 64 bytes per tracked object
//! (`docs/performance.md`, "Capacity guard"). The rest of a name (model, kv_rank, object group, salt, hash
//! length) is a "family" interned once, with the model and salt in the
//! housekeeping codec's [`NameTable`]: a tier holds few families.
//!
//! Order: a logical clock, one tick per use; the least recently used object
//! has the smallest tick. Eviction sorts the ticks (no list to keep up on
//! every read). When the 32-bit clock runs out, ticks are renumbered in order.

use std::hash::BuildHasher;

use hashbrown::HashTable;
use lmcache_housekeeping::codec::{
    ChunkHash, KvRank, ModelId, NameTable, ObjectNameRef, SaltId, MAX_HASH_BYTES,
};
use lmcache_housekeeping::tier_dir::AccessTimes;
use lmcache_housekeeping::{Inventory, ObjectKey};

/// Everything in an object name but its chunk hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Family {
    model: ModelId,
    kv_rank: KvRank,
    object_group: u64,
    salt: Option<SaltId>,
    hash_len: u8,
}

impl Family {
    fn of(key: &ObjectKey) -> Self {
        Self {
            model: key.model,
            kv_rank: key.kv_rank,
            object_group: key.object_group,
            salt: key.salt,
            hash_len: key.chunk_hash.as_bytes().len() as u8,
        }
    }
}

/// One tracked object: 44 bytes.
#[derive(Debug, Clone, Copy)]
struct Entry {
    hash: [u8; MAX_HASH_BYTES],
    family: u32,
    /// Allocated bytes / 512 (`st_blocks`), saturating at 2 TiB.
    blocks: u32,
    tick: u32,
}

impl Entry {
    fn bytes(&self) -> u64 {
        u64::from(self.blocks) * 512
    }
}

/// An object taken out of the tracker by [`Tracker::take_lru`], to delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Victim {
    /// Its name; [`Tracker::file_name`] writes it out.
    pub key: ObjectKey,
    /// Its allocated bytes when it was last seen.
    pub bytes: u64,
}

/// The objects of one tier in least-recently-used order (see the module docs).
#[derive(Debug)]
pub struct Tracker {
    names: NameTable,
    families: Vec<Family>,
    family_ids: hashbrown::HashMap<Family, u32, foldhash::fast::RandomState>,
    entries: Vec<Entry>,
    index: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    clock: u32,
    usage: u64,
}

impl Default for Tracker {
    fn default() -> Self {
        Self::new()
    }
}

fn blocks_of(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(512)).unwrap_or(u32::MAX)
}

/// When an inventory says an object was last used: its atime or mtime,
/// whichever is later, where the volume records access times, else mtime
/// (the order housekeeping trims in).
fn last_use_ns(stats: &lmcache_housekeeping::scan::EntryStats, times: AccessTimes) -> i64 {
    match times {
        AccessTimes::Recorded => stats.accessed_ns.max(stats.modified_ns),
        AccessTimes::NotRecorded => stats.modified_ns,
    }
}

impl Tracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self {
            names: NameTable::new(),
            families: Vec::new(),
            family_ids: hashbrown::HashMap::default(),
            entries: Vec::new(),
            index: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            clock: 0,
            usage: 0,
        }
    }

    /// The objects of a scan, ordered by last use (atime or mtime, see
    /// [`lmcache_housekeeping::plan()`]'s trim order; ties by chunk hash),
    /// oldest first. The tracker takes over the scan's [`NameTable`], so the
    /// scan's keys are used as they are, without decoding names again.
    pub fn from_inventory(inventory: &Inventory) -> Self {
        let mut tracker = Self::new();
        tracker.names = inventory.names().clone();
        let objects = inventory.objects();
        // The use order is sorted on a second thread while this one builds
        // the entries and the index; each entry's tick is then its
        // object's rank in that order.
        std::thread::scope(|scope| {
            let ranks = scope.spawn(|| {
                let mut ranks = vec![0u32; objects.len()];
                for (rank, i) in use_order(inventory, 0..objects.len() as u32)
                    .into_iter()
                    .enumerate()
                {
                    ranks[i as usize] = rank as u32;
                }
                ranks
            });
            tracker.fill(objects);
            let ranks = ranks.join().expect("sorting the use order does not panic");
            for (entry, rank) in tracker.entries.iter_mut().zip(ranks) {
                entry.tick = rank;
            }
        });
        tracker.clock = objects.len() as u32;
        tracker
    }

    /// Adds a scan's objects to an empty tracker, in the scan's order
    /// (entry i is object i), tick 0.
    ///
    /// The index is filled grouped by where each hash lands in it
    /// (hashbrown starts probing at `hash & (buckets - 1)`), so it is
    /// written front to back: inserting a million objects in scan order
    /// costs a cache miss or two each (200-450 ns an object here), grouped
    /// about a tenth of that. Only speed depends on the grouping; any order
    /// is correct. One scan's keys are distinct (names decode exactly and a
    /// directory holds a name once), so none is looked up before it is
    /// inserted.
    fn fill(&mut self, objects: &[lmcache_housekeeping::scan::ObjectEntry]) {
        const REGION_BITS: u32 = 8;
        let n = objects.len();
        self.entries.reserve_exact(n);
        self.index.reserve(n, |_| 0);
        let bucket_bits = (self.index.capacity() / 7 * 8)
            .next_power_of_two()
            .trailing_zeros();
        let shift = bucket_bits.saturating_sub(REGION_BITS);
        let region = |h: u64| ((h & ((1u64 << bucket_bits) - 1)) >> shift) as usize;
        let mut hashes = Vec::with_capacity(n);
        let mut starts = vec![0usize; (1 << REGION_BITS) + 1];
        for object in objects {
            let family = self.family_id(&object.key);
            let hash = inline_hash(&object.key.chunk_hash);
            let h = self.hash_entry(family, &hash);
            let blocks = blocks_of(object.stats.allocated_bytes);
            self.usage += u64::from(blocks) * 512;
            self.entries.push(Entry {
                hash,
                family,
                blocks,
                tick: 0,
            });
            starts[region(h) + 1] += 1;
            hashes.push(h);
        }
        for r in 1..starts.len() {
            starts[r] += starts[r - 1];
        }
        let mut grouped = vec![(0u64, 0u32); n];
        for (slot, h) in hashes.into_iter().enumerate() {
            let next = &mut starts[region(h)];
            grouped[*next] = (h, slot as u32);
            *next += 1;
        }
        let (entries, hasher) = (&self.entries, &self.hasher);
        for (h, slot) in grouped {
            self.index.insert_unique(h, slot, |&s| {
                let e = &entries[s as usize];
                hasher.hash_one((e.family, &e.hash))
            });
        }
    }

    /// Objects tracked.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no object is tracked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Allocated bytes of the tracked objects.
    pub fn usage(&self) -> u64 {
        self.usage
    }

    /// The file name a key stands for (`Display`), from this tracker's table.
    pub fn file_name(&self, key: &ObjectKey) -> ObjectNameRef<'_> {
        self.names.name(key)
    }

    fn hash_entry(&self, family: u32, hash: &[u8; MAX_HASH_BYTES]) -> u64 {
        self.hasher.hash_one((family, hash))
    }

    fn key_of(&self, entry: &Entry) -> ObjectKey {
        let family = self.families[entry.family as usize];
        ObjectKey {
            model: family.model,
            kv_rank: family.kv_rank,
            object_group: family.object_group,
            chunk_hash: ChunkHash::from_bytes(&entry.hash[..usize::from(family.hash_len)])
                .expect("a family's hash length is 1..=32"),
            salt: family.salt,
        }
    }

    /// The family id and inline hash of a name, interning nothing.
    fn locate(&self, name: &ObjectNameRef<'_>) -> Option<(u32, [u8; MAX_HASH_BYTES])> {
        let key = self.names.lookup(name)?;
        let family = *self.family_ids.get(&Family::of(&key))?;
        Some((family, inline_hash(&key.chunk_hash)))
    }

    fn slot(&self, family: u32, hash: &[u8; MAX_HASH_BYTES]) -> Option<usize> {
        let h = self.hash_entry(family, hash);
        self.index
            .find(h, |&slot| {
                let e = &self.entries[slot as usize];
                e.family == family && e.hash == *hash
            })
            .map(|&slot| slot as usize)
    }

    fn next_tick(&mut self) -> u32 {
        if self.clock == u32::MAX {
            self.renumber();
        }
        let tick = self.clock;
        self.clock += 1;
        tick
    }

    /// Gives the objects ticks 0..n in their present order.
    fn renumber(&mut self) {
        let mut order: Vec<u32> = (0..self.entries.len() as u32).collect();
        order.sort_unstable_by_key(|&slot| self.entries[slot as usize].tick);
        for (tick, slot) in order.into_iter().enumerate() {
            self.entries[slot as usize].tick = tick as u32;
        }
        self.clock = self.entries.len() as u32;
    }

    /// Records an object as just written (or seen by a rescan), with its
    /// allocated bytes: inserted, or its size updated; either way it becomes
    /// the most recently used.
    pub fn upsert(&mut self, name: &ObjectNameRef<'_>, bytes: u64) {
        let key = self.names.intern(name);
        self.upsert_key(&key, bytes);
    }

    /// [`Tracker::upsert`] of a key made from this tracker's name table.
    fn upsert_key(&mut self, key: &ObjectKey, bytes: u64) {
        let family = self.family_id(key);
        let hash = inline_hash(&key.chunk_hash);
        let h = self.hash_entry(family, &hash);
        let entries = &self.entries;
        let found = self.index.find(h, |&s| {
            let e = &entries[s as usize];
            e.family == family && e.hash == hash
        });
        match found.copied() {
            Some(slot) => {
                let tick = self.next_tick();
                let blocks = blocks_of(bytes);
                let entry = &mut self.entries[slot as usize];
                self.usage = self.usage - entry.bytes() + u64::from(blocks) * 512;
                entry.blocks = blocks;
                entry.tick = tick;
            }
            None => {
                let tick = self.next_tick();
                self.push(h, family, hash, bytes, tick);
            }
        }
    }

    /// The id of a key's family, added if new.
    fn family_id(&mut self, key: &ObjectKey) -> u32 {
        let family = Family::of(key);
        match self.family_ids.get(&family) {
            Some(&id) => id,
            None => {
                let id = self.families.len() as u32;
                self.families.push(family);
                self.family_ids.insert(family, id);
                id
            }
        }
    }

    /// Adds an object that is not tracked yet, last used at `tick`; `h` is
    /// [`Tracker::hash_entry`] of `family` and `hash`.
    fn push(&mut self, h: u64, family: u32, hash: [u8; MAX_HASH_BYTES], bytes: u64, tick: u32) {
        let blocks = blocks_of(bytes);
        let slot = self.entries.len() as u32;
        self.entries.push(Entry {
            hash,
            family,
            blocks,
            tick,
        });
        self.usage += u64::from(blocks) * 512;
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.index.insert_unique(h, slot, |&s| {
            let e = &entries[s as usize];
            hasher.hash_one((e.family, &e.hash))
        });
    }

    /// Marks a tracked object as just used (read). Returns false when it is
    /// not tracked.
    pub fn touch(&mut self, name: &ObjectNameRef<'_>) -> bool {
        let Some((family, hash)) = self.locate(name) else {
            return false;
        };
        let Some(slot) = self.slot(family, &hash) else {
            return false;
        };
        let tick = self.next_tick();
        self.entries[slot].tick = tick;
        true
    }

    /// Forgets an object (deleted or renamed away). Returns its bytes, or
    /// `None` when it was not tracked.
    pub fn remove(&mut self, name: &ObjectNameRef<'_>) -> Option<u64> {
        let (family, hash) = self.locate(name)?;
        let slot = self.slot(family, &hash)?;
        Some(self.remove_slot(slot))
    }

    fn remove_slot(&mut self, slot: usize) -> u64 {
        let entry = self.entries[slot];
        let h = self.hash_entry(entry.family, &entry.hash);
        if let Ok(found) = self.index.find_entry(h, |&s| s as usize == slot) {
            found.remove();
        }
        let last = self.entries.len() - 1;
        if slot != last {
            let moved = self.entries[last];
            let h = self.hash_entry(moved.family, &moved.hash);
            if let Some(s) = self.index.find_mut(h, |&s| s as usize == last) {
                *s = slot as u32;
            }
        }
        self.entries.swap_remove(slot);
        self.usage -= entry.bytes();
        entry.bytes()
    }

    /// Takes the least recently used objects out of the tracker until their
    /// bytes reach `reclaim_bytes` (or none is left), oldest first. The caller
    /// deletes them.
    pub fn take_lru(&mut self, reclaim_bytes: u64) -> Vec<Victim> {
        let mut order: Vec<u64> = self
            .entries
            .iter()
            .enumerate()
            .map(|(slot, e)| u64::from(e.tick) << 32 | slot as u64)
            .collect();
        order.sort_unstable();
        let mut chosen = Vec::new();
        let mut freed = 0u64;
        for packed in order {
            if freed >= reclaim_bytes {
                break;
            }
            let entry = self.entries[(packed & u64::from(u32::MAX)) as usize];
            freed += entry.bytes();
            chosen.push(entry);
        }
        chosen
            .into_iter()
            .map(|entry| {
                let key = self.key_of(&entry);
                let slot = self
                    .slot(entry.family, &entry.hash)
                    .expect("a chosen entry is tracked until removed here");
                Victim {
                    key,
                    bytes: self.remove_slot(slot),
                }
            })
            .collect()
    }

    /// Brings the tracker in line with a fresh scan: objects the scan did not
    /// find are forgotten, sizes are taken from the scan, objects already
    /// tracked keep their place in the order, and new ones are added as the
    /// most recently used, in the order of their times.
    pub fn reconcile(&mut self, inventory: &Inventory) {
        let mut seen = vec![false; self.entries.len()];
        let mut new = Vec::new();
        for (i, object) in inventory.objects().iter().enumerate() {
            let name = inventory.names().name(&object.key);
            match self.locate(&name).and_then(|(f, h)| self.slot(f, &h)) {
                Some(slot) => {
                    seen[slot] = true;
                    let entry = &mut self.entries[slot];
                    let blocks = blocks_of(object.stats.allocated_bytes);
                    self.usage = self.usage - entry.bytes() + u64::from(blocks) * 512;
                    entry.blocks = blocks;
                }
                None => new.push(i as u32),
            }
        }
        for slot in (0..seen.len()).rev() {
            if !seen[slot] {
                self.remove_slot(slot);
            }
        }
        for i in use_order(inventory, new.into_iter()) {
            let object = &inventory.objects()[i as usize];
            let name = inventory.names().name(&object.key);
            self.upsert(&name, object.stats.allocated_bytes);
        }
    }
}

/// The inventory's objects at `indexes`, oldest last use first; ties (a
/// volume's timestamps are coarse, so a burst of writes shares one) by the
/// first 8 bytes of the chunk hash, then by position in the inventory.
/// Sorts 24-byte records that carry everything compared: a sort that looks
/// into the inventory's entries on a tie misses the cache on each look,
/// which made the start-up count of a million objects seconds slower than
/// the scan.
fn use_order(inventory: &Inventory, indexes: impl Iterator<Item = u32>) -> Vec<u32> {
    let (objects, times) = (inventory.objects(), inventory.access_times());
    let mut order: Vec<(i64, u64, u32)> = indexes
        .map(|i| {
            let object = &objects[i as usize];
            let mut prefix = [0u8; 8];
            let hash = object.key.chunk_hash.as_bytes();
            let n = hash.len().min(8);
            prefix[..n].copy_from_slice(&hash[..n]);
            (
                last_use_ns(&object.stats, times),
                u64::from_be_bytes(prefix),
                i,
            )
        })
        .collect();
    order.sort_unstable();
    order.into_iter().map(|(_, _, i)| i).collect()
}

fn inline_hash(hash: &ChunkHash) -> [u8; MAX_HASH_BYTES] {
    let mut inline = [0u8; MAX_HASH_BYTES];
    inline[..hash.as_bytes().len()].copy_from_slice(hash.as_bytes());
    inline
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmcache_housekeeping::codec::parse_object_name;
    use lmcache_housekeeping::scan::EntryStats;
    use lmcache_housekeeping::ObjectName;
    use proptest::prelude::*;

    fn name(i: u32) -> String {
        let model = ["org-SEP-a", "b", "org-SEP-a"][i as usize % 3];
        let salt = if i.is_multiple_of(4) { "@s" } else { "" };
        let hash = if i.is_multiple_of(5) {
            format!("{i:032x}")
        } else {
            format!("{i:064x}")
        };
        format!("{model}@0x01000100@0@{hash}{salt}.data")
    }

    fn upsert(t: &mut Tracker, i: u32, bytes: u64) {
        t.upsert(&parse_object_name(&name(i)).unwrap(), bytes);
    }

    fn victims(t: &mut Tracker, reclaim: u64) -> Vec<String> {
        let taken = t.take_lru(reclaim);
        taken
            .iter()
            .map(|v| t.file_name(&v.key).to_string())
            .collect()
    }

    #[test]
    fn entries_stay_within_the_memory_budget() {
        assert_eq!(std::mem::size_of::<Entry>(), 44);
    }

    #[test]
    fn evicts_least_recently_used_first_and_reads_count_as_use() {
        let mut t = Tracker::new();
        for i in 0..5 {
            upsert(&mut t, i, 1000);
        }
        assert_eq!(t.usage(), 5 * 1024, "sizes are counted in 512-byte blocks");
        assert!(t.touch(&parse_object_name(&name(0)).unwrap()));
        assert_eq!(victims(&mut t, 2048), [name(1), name(2)]);
        assert_eq!(t.len(), 3);
        assert_eq!(t.usage(), 3 * 1024);
        assert_eq!(
            victims(&mut t, 1),
            [name(3)],
            "at least one byte: one object"
        );
        assert_eq!(victims(&mut t, u64::MAX), [name(4), name(0)]);
        assert!(t.is_empty());
        assert_eq!(t.usage(), 0);
        assert!(t.take_lru(1).is_empty());
    }

    #[test]
    fn a_rewrite_updates_the_size_and_the_order() {
        let mut t = Tracker::new();
        upsert(&mut t, 1, 512);
        upsert(&mut t, 2, 512);
        upsert(&mut t, 1, 4096);
        assert_eq!(t.len(), 2);
        assert_eq!(t.usage(), 512 + 4096);
        assert_eq!(victims(&mut t, 1), [name(2)]);
    }

    #[test]
    fn removed_and_unknown_objects() {
        let mut t = Tracker::new();
        upsert(&mut t, 1, 512);
        upsert(&mut t, 2, 1024);
        upsert(&mut t, 3, 1536);
        assert_eq!(t.remove(&parse_object_name(&name(1)).unwrap()), Some(512));
        assert_eq!(t.remove(&parse_object_name(&name(1)).unwrap()), None);
        let unknown = "never-SEP-seen@0x01000100@0@00.data";
        assert_eq!(t.remove(&parse_object_name(unknown).unwrap()), None);
        assert!(!t.touch(&parse_object_name(unknown).unwrap()));
        assert_eq!(t.usage(), 2560);
        assert_eq!(victims(&mut t, 1), [name(2)]);
    }

    #[test]
    fn the_clock_renumbers_when_it_runs_out() {
        let mut t = Tracker::new();
        t.clock = u32::MAX - 2;
        for i in 0..4 {
            upsert(&mut t, i, 512);
        }
        assert!(t.touch(&parse_object_name(&name(1)).unwrap()));
        assert!(t.clock < 10, "renumbered: {}", t.clock);
        assert_eq!(
            victims(&mut t, u64::MAX),
            [name(0), name(2), name(3), name(1)]
        );
    }

    fn inventory(entries: &[(u32, i64, u64)]) -> Inventory {
        let named: Vec<_> = entries.iter().map(|&(i, t, b)| (name(i), t, b)).collect();
        inventory_of(&named)
    }

    fn inventory_of(entries: &[(String, i64, u64)]) -> Inventory {
        let mut inv = Inventory::new("/t", AccessTimes::NotRecorded);
        for (name, mtime, bytes) in entries {
            let (mtime, bytes) = (*mtime, *bytes);
            let owned: ObjectName = name.parse().unwrap();
            inv.add_object(
                &owned,
                EntryStats {
                    allocated_bytes: bytes,
                    modified_ns: mtime,
                    accessed_ns: 0,
                },
            );
        }
        inv
    }

    #[test]
    fn a_start_up_count_orders_by_time_and_ties_by_chunk_hash() {
        let hashed = |first: &str| format!("b@0x01000100@0@{first}{}.data", "0".repeat(62));
        let t = &mut Tracker::from_inventory(&inventory_of(&[
            (name(7), 30, 512),
            (hashed("ff"), 10, 512),
            (hashed("0a"), 10, 512),
            (name(6), 20, 1024),
        ]));
        assert_eq!(t.usage(), 2560);
        assert_eq!(
            victims(t, u64::MAX),
            [hashed("0a"), hashed("ff"), name(6), name(7)]
        );
    }

    proptest! {
        /// A start-up count of thousands of objects (the index is filled in
        /// groups, see `Tracker::fill`): every object is found by name, the
        /// usage is the sum, and eviction takes them in time order.
        #[test]
        fn a_large_start_up_count_finds_every_object(
            times in proptest::collection::vec(0..1_000i64, 1..3_000)
        ) {
            let entries: Vec<(u32, i64, u64)> = times
                .iter()
                .enumerate()
                .map(|(i, &t)| (i as u32, t, 512 * (1 + i as u64 % 3)))
                .collect();
            let mut t = Tracker::from_inventory(&inventory(&entries));
            prop_assert_eq!(t.len(), entries.len());
            let total: u64 = entries.iter().map(|e| e.2).sum();
            prop_assert_eq!(t.usage(), total);
            for &(i, _, _) in &entries {
                let file = name(i);
                let parsed = parse_object_name(&file).unwrap();
                let slot = t.locate(&parsed).and_then(|(f, h)| t.slot(f, &h));
                prop_assert!(slot.is_some(), "object {} not found", i);
            }
            let time_of: std::collections::HashMap<String, i64> =
                entries.iter().map(|&(i, time, _)| (name(i), time)).collect();
            let taken: Vec<i64> = victims(&mut t, u64::MAX).iter().map(|v| time_of[v]).collect();
            let mut sorted = times.clone();
            sorted.sort_unstable();
            prop_assert_eq!(taken, sorted);
            prop_assert!(t.is_empty());
        }
    }

    #[test]
    fn a_rescan_forgets_vanished_objects_and_keeps_the_order_of_the_rest() {
        let mut t = Tracker::new();
        for i in 0..4 {
            upsert(&mut t, i, 512);
        }
        assert!(t.touch(&parse_object_name(&name(0)).unwrap()));
        // 2 vanished, 3 grew, 10 and 11 are new (11 older than 10).
        t.reconcile(&inventory(&[
            (0, 0, 512),
            (1, 0, 512),
            (3, 0, 2048),
            (10, 9, 512),
            (11, 5, 512),
        ]));
        assert_eq!(t.usage(), 512 * 4 + 2048);
        assert_eq!(
            victims(&mut t, u64::MAX),
            [name(1), name(3), name(0), name(11), name(10)]
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write(u32, u64),
        Read(u32),
        Delete(u32),
        Evict(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..40u32, 0..100_000u64).prop_map(|(i, b)| Op::Write(i, b)),
            (0..40u32).prop_map(Op::Read),
            (0..40u32).prop_map(Op::Delete),
            (0..200_000u64).prop_map(Op::Evict),
        ]
    }

    proptest! {
        /// Against a plain model (a list in use order): the same objects, the
        /// same bytes, and evictions that take exactly the oldest prefix.
        #[test]
        fn behaves_like_a_list_in_use_order(ops in proptest::collection::vec(op(), 1..200)) {
            let mut t = Tracker::new();
            let mut model: Vec<(u32, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Write(i, b) => {
                        upsert(&mut t, i, b);
                        model.retain(|e| e.0 != i);
                        model.push((i, b.div_ceil(512) * 512));
                    }
                    Op::Read(i) => {
                        let found = t.touch(&parse_object_name(&name(i)).unwrap());
                        let pos = model.iter().position(|e| e.0 == i);
                        prop_assert_eq!(found, pos.is_some());
                        if let Some(pos) = pos {
                            let e = model.remove(pos);
                            model.push(e);
                        }
                    }
                    Op::Delete(i) => {
                        let got = t.remove(&parse_object_name(&name(i)).unwrap());
                        let pos = model.iter().position(|e| e.0 == i);
                        prop_assert_eq!(got, pos.map(|p| model.remove(p).1));
                    }
                    Op::Evict(reclaim) => {
                        let got = victims(&mut t, reclaim);
                        let mut want = Vec::new();
                        let mut freed = 0;
                        while freed < reclaim && !model.is_empty() {
                            let (i, b) = model.remove(0);
                            freed += b;
                            want.push(name(i));
                        }
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(t.len(), model.len());
                prop_assert_eq!(t.usage(), model.iter().map(|e| e.1).sum::<u64>());
            }
        }
    }
}
