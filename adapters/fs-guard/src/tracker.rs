//! The guard's LRU bookkeeping of one tier: which objects it holds, their
//! allocated bytes, and the order in which they were last used.
//!
//! Memory: 44 bytes an object in a dense array (the chunk hash inline, a
//! 4-byte id of the rest of the name, allocated bytes in 512-byte blocks, a
//! 4-byte use tick), which grows by a sixteenth and gives back what it holds
//! beyond an eighth, plus an index of 4-byte buckets 45% to 80% full
//! (`adapters/fs-guard/src/index.rs`): at most 64 bytes per tracked object at any count
//! (`docs/performance.md`, "Capacity guard"). The rest of a name (model,
//! kv_rank, object group, salt, hash length) is a "family" interned once,
//! with the model and salt in the housekeeping codec's [`NameTable`]: a
//! tier holds few families.
//!
//! Order: a logical clock, one tick per use; the least recently used object
//! has the smallest tick. Eviction sorts the ticks (no list to keep up on
//! every read). When the 32-bit clock runs out, ticks are renumbered in order.
//!
//! Links: an object whose file has other hard links (`st_nlink` > 1 when the
//! guard last looked) is marked; deleting it frees nothing on the volume
//! while another link keeps its blocks, so an eviction for the free space
//! passes over it ([`Tracker::take_lru_freeing`]).
//!
//! Undeletable: an object the guard failed to delete (an immutable file,
//! `chattr +i`; a read-only remount) stays tracked and counted, at its
//! place, marked; no take chooses it, so eviction goes around it, until
//! it is written anew or the guard tries again
//! ([`Tracker::retry_undeletable`]).

use std::hash::BuildHasher;

use lmcache_housekeeping::codec::{
    ChunkHash, KvRank, ModelId, NameTable, ObjectNameRef, SaltId, MAX_HASH_BYTES,
};
use lmcache_housekeeping::tier_dir::AccessTimes;
use lmcache_housekeeping::{Inventory, ObjectKey};

use crate::index::SlotIndex;

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

/// The bit of [`Entry::blocks`] that marks an object linked elsewhere.
const LINKED: u32 = 1 << 31;
/// The bit of [`Entry::blocks`] that marks an object the guard could not
/// delete.
const UNDELETABLE: u32 = 1 << 30;
/// The bits of [`Entry::blocks`] that count blocks.
const BLOCKS: u32 = UNDELETABLE - 1;

/// One tracked object: 44 bytes.
#[derive(Debug, Clone, Copy)]
struct Entry {
    hash: [u8; MAX_HASH_BYTES],
    family: u32,
    /// Allocated bytes / 512 (`st_blocks`), saturating at 512 GiB,
    /// [`LINKED`] when the file has other hard links, and [`UNDELETABLE`]
    /// when the guard could not delete it.
    blocks: u32,
    tick: u32,
}

impl Entry {
    fn bytes(&self) -> u64 {
        u64::from(self.blocks & BLOCKS) * 512
    }

    fn linked(&self) -> bool {
        self.blocks & LINKED != 0
    }

    fn undeletable(&self) -> bool {
        self.blocks & UNDELETABLE != 0
    }
}

/// An object taken out of the tracker by [`Tracker::take_lru`], to delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Victim {
    /// Its name; [`Tracker::file_name`] writes it out.
    pub key: ObjectKey,
    /// Its allocated bytes when it was last seen.
    pub bytes: u64,
    /// Its place in the use order, for [`Tracker::put_back`].
    tick: u32,
}

/// The objects of one tier in least-recently-used order (see the module docs).
#[derive(Debug)]
pub struct Tracker {
    names: NameTable,
    families: Vec<Family>,
    family_ids: hashbrown::HashMap<Family, u32, foldhash::fast::RandomState>,
    entries: Vec<Entry>,
    index: SlotIndex,
    hasher: foldhash::fast::RandomState,
    clock: u32,
    /// What the tracked entries add up to.
    counts: Tally,
}

impl Default for Tracker {
    fn default() -> Self {
        Self::new()
    }
}

fn blocks_of(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(512)).map_or(BLOCKS, |b| b.min(BLOCKS))
}

/// Entries the array grows by when full: a sixteenth, at least 16.
fn growth(len: usize) -> usize {
    (len / 16).max(16)
}

/// Whether an array of `capacity` entries holding `len` holds more than
/// an eighth (and 16) spare, and so gives the rest back.
fn too_roomy(capacity: usize, len: usize) -> bool {
    capacity > len + len / 8 + 16
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
            index: SlotIndex::default(),
            hasher: foldhash::fast::RandomState::default(),
            clock: 0,
            counts: Tally::default(),
        }
    }

    /// The objects of a scan, ordered by last use (atime or mtime, see
    /// [`lmcache_housekeeping::plan()`]'s trim order; ties by chunk hash),
    /// oldest first. The tracker takes over the scan's [`NameTable`], so the
    /// scan's keys are used as they are, without decoding names again. No
    /// object is marked linked: a scan does not read link counts, and a
    /// deletion finds them ([`Tracker::put_back`]).
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

    /// [`Tracker::from_inventory`] less the objects at `deleted` (indices
    /// into `inventory.objects()`, e.g. what housekeeping deleted since the
    /// scan), taken out in one pass. Indices past the inventory are
    /// ignored.
    pub fn from_inventory_less(inventory: &Inventory, deleted: &[u32]) -> Self {
        let mut tracker = Self::from_inventory(inventory);
        // Entry i is object i after `fill`.
        let slots: Vec<usize> = deleted
            .iter()
            .map(|&i| i as usize)
            .filter(|&i| i < tracker.len())
            .collect();
        tracker.remove_many(&slots);
        tracker
    }

    /// Adds a scan's objects to an empty tracker, in the scan's order
    /// (entry i is object i), tick 0; the entry array is reserved for
    /// exactly that many. One scan's keys are distinct (names decode
    /// exactly and a directory holds a name once), so none is looked up
    /// before it is inserted.
    fn fill(&mut self, objects: &[lmcache_housekeeping::scan::ObjectEntry]) {
        self.entries.reserve_exact(objects.len());
        let mut hashes = Vec::with_capacity(objects.len());
        for object in objects {
            let family = self.family_id(&object.key);
            let hash = inline_hash(&object.key.chunk_hash);
            hashes.push(self.hash_entry(family, &hash));
            let blocks = blocks_of(object.stats.allocated_bytes);
            self.counts.bytes += u64::from(blocks) * 512;
            self.entries.push(Entry {
                hash,
                family,
                blocks,
                tick: 0,
            });
        }
        self.index_all(hashes);
    }

    /// A new index of every entry, `hashes[i]` the hash of entry i.
    ///
    /// The index is filled grouped by the top byte of each hash, which
    /// orders the home buckets (`adapters/fs-guard/src/index.rs`), so it is written
    /// front to back: inserting a million objects in scan order costs a
    /// cache miss or two each (200-450 ns an object here), grouped about a
    /// tenth of that. Only speed depends on the grouping; any order is
    /// correct.
    fn index_all(&mut self, hashes: Vec<u64>) {
        const REGION_BITS: u32 = 8;
        let region = |h: u64| (h >> (64 - REGION_BITS)) as usize;
        let mut starts = vec![0usize; (1 << REGION_BITS) + 1];
        for &h in &hashes {
            starts[region(h) + 1] += 1;
        }
        for r in 1..starts.len() {
            starts[r] += starts[r - 1];
        }
        let mut grouped = vec![(0u64, 0u32); hashes.len()];
        for (slot, h) in hashes.into_iter().enumerate() {
            let next = &mut starts[region(h)];
            grouped[*next] = (h, slot as u32);
            *next += 1;
        }
        let (entries, hasher) = (&self.entries, &self.hasher);
        let hash_of = |s: u32| {
            let e = &entries[s as usize];
            hasher.hash_one((e.family, &e.hash))
        };
        // The old table goes before the new one is made.
        self.index = SlotIndex::default();
        self.index.reserve(grouped.len(), hash_of);
        for (h, slot) in grouped {
            self.index.insert(h, slot, hash_of);
        }
    }

    /// Removes the entries at `slots` at once: the array is compacted in
    /// order and the index built anew ([`Tracker::index_all`]), which costs
    /// less than removing a large share one by one (a lookup, a shift and
    /// a fix-up of the moved entry each, most of them cache misses).
    fn remove_many(&mut self, slots: &[usize]) {
        if slots.is_empty() {
            return;
        }
        let mut gone = vec![false; self.entries.len()];
        for &slot in slots {
            gone[slot] = true;
        }
        let mut out = Tally::default();
        let mut at = 0usize;
        self.entries.retain(|e| {
            let keep = !gone[at];
            at += 1;
            if !keep {
                out.add(e);
            }
            keep
        });
        self.counts.take_out(&out);
        if too_roomy(self.entries.capacity(), self.entries.len()) {
            let len = self.entries.len();
            self.entries.shrink_to(len + growth(len));
        }
        let hashes = self
            .entries
            .iter()
            .map(|e| self.hasher.hash_one((e.family, &e.hash)))
            .collect();
        self.index_all(hashes);
    }

    /// Objects tracked.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no object is tracked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Objects tracked that are not marked linked: those whose deletion
    /// would free their blocks, as far as the guard knows.
    pub fn unlinked(&self) -> usize {
        self.entries.len() - self.counts.linked
    }

    /// Allocated bytes of the tracked objects.
    pub fn usage(&self) -> u64 {
        self.counts.bytes
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

    /// The index bucket of an entry, found by its family and hash.
    fn bucket(&self, family: u32, hash: &[u8; MAX_HASH_BYTES]) -> Option<usize> {
        let h = self.hash_entry(family, hash);
        self.index.find(h, |slot| {
            let e = &self.entries[slot as usize];
            e.family == family && e.hash == *hash
        })
    }

    fn slot(&self, family: u32, hash: &[u8; MAX_HASH_BYTES]) -> Option<usize> {
        self.bucket(family, hash)
            .map(|bucket| self.index.get(bucket) as usize)
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
    /// allocated bytes and whether its file has other hard links: inserted,
    /// or its size and marks set anew (an undeletable mark comes off: the
    /// file was written); either way it becomes the most recently used.
    pub fn upsert(&mut self, name: &ObjectNameRef<'_>, bytes: u64, linked: bool) {
        let key = self.names.intern(name);
        let family = self.family_id(&key);
        let hash = inline_hash(&key.chunk_hash);
        let tick = self.next_tick();
        self.set(
            family,
            hash,
            blocks_of(bytes) | if linked { LINKED } else { 0 },
            tick,
        );
    }

    /// Tracks the object of `family` and `hash` with `blocks` (and its
    /// [`LINKED`] mark) at `tick`: inserted, or updated in place.
    fn set(&mut self, family: u32, hash: [u8; MAX_HASH_BYTES], blocks: u32, tick: u32) {
        match self.slot(family, &hash) {
            Some(slot) => {
                self.reblock(slot, blocks);
                self.entries[slot].tick = tick;
            }
            None => self.push(family, hash, blocks, tick),
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

    /// Adds an object that is not tracked yet, last used at `tick`. The
    /// entry array grows by [`growth`], never doubling.
    fn push(&mut self, family: u32, hash: [u8; MAX_HASH_BYTES], blocks: u32, tick: u32) {
        if self.entries.len() == self.entries.capacity() {
            self.entries.reserve_exact(growth(self.entries.len()));
        }
        let slot = self.entries.len() as u32;
        let entry = Entry {
            hash,
            family,
            blocks,
            tick,
        };
        self.entries.push(entry);
        self.counts.add(&entry);
        let h = self.hash_entry(family, &hash);
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.index.insert(h, slot, |s| {
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
        let bucket = self.bucket(family, &hash)?;
        Some(self.remove_at(bucket))
    }

    /// Removes the entry whose slot is in index `bucket` (the last entry
    /// moves into its place) and returns its bytes; an array left roomier
    /// than [`too_roomy`] gives memory back.
    fn remove_at(&mut self, bucket: usize) -> u64 {
        let slot = self.index.get(bucket) as usize;
        let entry = self.entries[slot];
        let last = self.entries.len() - 1;
        {
            let (entries, hasher) = (&self.entries, &self.hasher);
            let hash_of = |s: u32| {
                let e = &entries[s as usize];
                hasher.hash_one((e.family, &e.hash))
            };
            self.index.remove(bucket, hash_of);
            if slot != last {
                let moved = hash_of(last as u32);
                if let Some(bucket) = self.index.find(moved, |s| s as usize == last) {
                    self.index.set(bucket, slot as u32);
                }
            }
        }
        self.entries.swap_remove(slot);
        if too_roomy(self.entries.capacity(), self.entries.len()) {
            let len = self.entries.len();
            self.entries.shrink_to(len + growth(len));
        }
        let mut out = Tally::default();
        out.add(&entry);
        self.counts.take_out(&out);
        entry.bytes()
    }

    /// Gives the entry at `slot` new `blocks` (size and marks), counted.
    fn reblock(&mut self, slot: usize, blocks: u32) {
        let mut out = Tally::default();
        out.add(&self.entries[slot]);
        self.counts.take_out(&out);
        self.entries[slot].blocks = blocks;
        let entry = self.entries[slot];
        self.counts.add(&entry);
    }

    /// Takes the least recently used objects out of the tracker until their
    /// bytes reach `reclaim_bytes` (or none is left), oldest first, passing
    /// over the objects marked undeletable. The caller deletes them.
    pub fn take_lru(&mut self, reclaim_bytes: u64) -> Vec<Victim> {
        self.take(reclaim_bytes, 0, false)
    }

    /// As [`Tracker::take_lru`], passing over the objects marked linked
    /// (whose deletion frees nothing), until the bytes reach `bytes` and
    /// the objects `objects` (each deletion gives the volume an inode back).
    pub fn take_lru_freeing(&mut self, bytes: u64, objects: u64) -> Vec<Victim> {
        self.take(bytes, objects, true)
    }

    fn take(&mut self, bytes: u64, objects: u64, skip_linked: bool) -> Vec<Victim> {
        let mut order: Vec<u64> = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| !(e.undeletable() || skip_linked && e.linked()))
            .map(|(slot, e)| u64::from(e.tick) << 32 | slot as u64)
            .collect();
        order.sort_unstable();
        let mut chosen = Vec::new();
        let mut freed = 0u64;
        for packed in order {
            if freed >= bytes && chosen.len() as u64 >= objects {
                break;
            }
            let slot = (packed & u64::from(u32::MAX)) as usize;
            freed += self.entries[slot].bytes();
            chosen.push(slot);
        }
        let victims: Vec<Victim> = chosen
            .iter()
            .map(|&slot| {
                let entry = self.entries[slot];
                Victim {
                    key: self.key_of(&entry),
                    bytes: entry.bytes(),
                    tick: entry.tick,
                }
            })
            .collect();
        // A thirty-second of the tier or more at once; fewer one by one.
        if chosen.len() * 32 >= self.entries.len() {
            self.remove_many(&chosen);
        } else {
            for victim in &victims {
                let family = self.family_id(&victim.key);
                let hash = inline_hash(&victim.key.chunk_hash);
                let bucket = self
                    .bucket(family, &hash)
                    .expect("a chosen entry is tracked until removed here");
                self.remove_at(bucket);
            }
        }
        victims
    }

    /// Tracks a victim again, at its place in the use order, marked linked:
    /// its file has other hard links, so it was left in place. An object
    /// tracked again since it was taken (written anew) keeps that state.
    pub fn put_back(&mut self, victim: &Victim) {
        self.put_back_marked(victim, LINKED);
    }

    /// Tracks a victim again, at its place in the use order, marked
    /// undeletable: its deletion failed, so its file is still on the disk
    /// and counted, and no take chooses it until it is no longer marked.
    /// An object tracked again since it was taken keeps that state.
    pub fn put_back_undeletable(&mut self, victim: &Victim) {
        self.put_back_marked(victim, UNDELETABLE);
    }

    fn put_back_marked(&mut self, victim: &Victim, mark: u32) {
        let family = self.family_id(&victim.key);
        let hash = inline_hash(&victim.key.chunk_hash);
        if self.slot(family, &hash).is_none() {
            self.push(family, hash, blocks_of(victim.bytes) | mark, victim.tick);
        }
    }

    /// Objects marked undeletable, and their allocated bytes (counted in
    /// [`Tracker::usage`]).
    pub fn undeletable(&self) -> (usize, u64) {
        self.counts.undeletable
    }

    /// Takes the undeletable mark off every object, so that takes may
    /// choose them again (the guard's retry). Returns how many were marked.
    pub fn retry_undeletable(&mut self) -> usize {
        let marked = self.counts.undeletable.0;
        if marked > 0 {
            for entry in &mut self.entries {
                entry.blocks &= !UNDELETABLE;
            }
            self.counts.undeletable = (0, 0);
        }
        marked
    }

    /// Brings the tracker in line with a fresh scan: objects the scan did not
    /// find are forgotten, sizes are taken from the scan, objects already
    /// tracked keep their place in the order (and their marks), and new
    /// ones are added as the most recently used, in the order of their times.
    pub fn reconcile(&mut self, inventory: &Inventory) {
        let mut seen = vec![false; self.entries.len()];
        let mut new = Vec::new();
        for (i, object) in inventory.objects().iter().enumerate() {
            let name = inventory.names().name(&object.key);
            match self.locate(&name).and_then(|(f, h)| self.slot(f, &h)) {
                Some(slot) => {
                    seen[slot] = true;
                    let marks = self.entries[slot].blocks & !BLOCKS;
                    self.reblock(slot, blocks_of(object.stats.allocated_bytes) | marks);
                }
                None => new.push(i as u32),
            }
        }
        let unseen: Vec<usize> = (0..seen.len()).filter(|&slot| !seen[slot]).collect();
        self.remove_many(&unseen);
        for i in use_order(inventory, new.into_iter()) {
            let object = &inventory.objects()[i as usize];
            let name = inventory.names().name(&object.key);
            self.upsert(&name, object.stats.allocated_bytes, false);
        }
    }
}

/// What a set of entries adds up to: the tracker's own counts, and a set
/// of entries to take out of them at once.
#[derive(Debug, Default)]
struct Tally {
    /// Allocated bytes.
    bytes: u64,
    /// Entries marked linked.
    linked: usize,
    /// Entries marked [`UNDELETABLE`] and their bytes.
    undeletable: (usize, u64),
}

impl Tally {
    /// Counts `entry` in.
    fn add(&mut self, entry: &Entry) {
        self.bytes += entry.bytes();
        self.linked += usize::from(entry.linked());
        if entry.undeletable() {
            self.undeletable.0 += 1;
            self.undeletable.1 += entry.bytes();
        }
    }

    /// Takes what `out` tallied out of these counts.
    fn take_out(&mut self, out: &Tally) {
        self.bytes -= out.bytes;
        self.linked -= out.linked;
        self.undeletable.0 -= out.undeletable.0;
        self.undeletable.1 -= out.undeletable.1;
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
        t.upsert(&parse_object_name(&name(i)).unwrap(), bytes, false);
    }

    /// Heap bytes of the entry array and the index.
    fn table_bytes(t: &Tracker) -> usize {
        t.entries.capacity() * std::mem::size_of::<Entry>() + t.index.heap_bytes()
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

    /// The tables stay within 58.5 bytes an object (and a few hundred
    /// bytes more at any size) at every count, growing one object at a
    /// time and shrinking one at a time: no doubling leaves half of them
    /// empty.
    #[test]
    fn the_tables_stay_within_the_memory_budget_at_every_count() {
        let mut t = Tracker::new();
        let within = |t: &Tracker| {
            let bytes = table_bytes(t);
            assert!(
                bytes as f64 <= 58.5 * t.len() as f64 + 1024.0,
                "{bytes} bytes for {} objects",
                t.len()
            );
        };
        for i in 0..150_000 {
            upsert(&mut t, i, 4096);
            within(&t);
        }
        for i in 0..149_000 {
            assert_eq!(t.remove(&parse_object_name(&name(i)).unwrap()), Some(4096));
            within(&t);
        }
        // Half taken at once (the array compacted, the index built anew).
        for i in 149_000..200_000 {
            upsert(&mut t, i, 4096);
        }
        let usage = t.usage();
        assert_eq!(t.take_lru(usage / 2).len(), 25_500);
        within(&t);
        // A start-up count is reserved exactly.
        let entries: Vec<(u32, i64, u64)> = (0..70_000).map(|i| (i, 0, 4096)).collect();
        let counted = Tracker::from_inventory(&inventory(&entries));
        assert_eq!(counted.entries.capacity(), 70_000);
        within(&counted);
    }

    /// An object whose file has other links frees nothing when deleted: an
    /// eviction for the free space passes over it, one for the capacity
    /// does not; put back, it keeps its place in the order.
    #[test]
    fn linked_objects_are_passed_over_when_freeing_and_kept_in_order() {
        let mut t = Tracker::new();
        for i in 0..6 {
            t.upsert(&parse_object_name(&name(i)).unwrap(), 1024, i % 2 == 0);
        }
        assert_eq!(t.unlinked(), 3);
        assert_eq!(t.usage(), 6 * 1024);
        let freeing = t.take_lru_freeing(2048, 0);
        let names: Vec<String> = freeing
            .iter()
            .map(|v| t.file_name(&v.key).to_string())
            .collect();
        assert_eq!(names, [name(1), name(3)]);
        assert_eq!(t.unlinked(), 1);
        // At least three objects: only one unlinked is left.
        let more = t.take_lru_freeing(0, 3);
        assert_eq!(more.len(), 1);
        assert_eq!(t.unlinked(), 0);
        assert!(t.take_lru_freeing(u64::MAX, u64::MAX).is_empty());
        // Object 1 turned out to be linked when it came to deleting it.
        t.put_back(&freeing[0]);
        assert_eq!((t.len(), t.unlinked()), (4, 0));
        assert_eq!(
            victims(&mut t, u64::MAX),
            [name(0), name(1), name(2), name(4)]
        );
        assert_eq!((t.usage(), t.counts.linked), (0, 0));
    }

    #[test]
    fn undeletable_objects_stay_counted_and_takes_go_around_them() {
        let mut t = Tracker::new();
        for i in 0..5 {
            upsert(&mut t, i, 1024);
        }
        // The two oldest could not be deleted.
        let taken = t.take_lru(2048);
        for victim in &taken {
            t.put_back_undeletable(victim);
        }
        assert_eq!(
            (t.len(), t.usage(), t.undeletable()),
            (5, 5 * 1024, (2, 2048))
        );
        assert_eq!(victims(&mut t, 2048), [name(2), name(3)]);
        assert_eq!(victims(&mut t, u64::MAX), [name(4)]);
        assert!(t.take_lru_freeing(u64::MAX, u64::MAX).is_empty());
        assert_eq!((t.len(), t.usage()), (2, 2048));
        // A rewrite takes the mark off, and so does the guard's retry.
        upsert(&mut t, 1, 4096);
        assert_eq!((t.undeletable(), t.usage()), ((1, 1024), 5120));
        assert_eq!(t.retry_undeletable(), 1);
        assert_eq!(t.undeletable(), (0, 0));
        assert_eq!(victims(&mut t, u64::MAX), [name(0), name(1)]);
        assert_eq!(
            (t.usage(), t.counts.linked, t.undeletable()),
            (0, 0, (0, 0))
        );
    }

    #[test]
    fn a_rescan_keeps_the_undeletable_mark_and_takes_the_new_size() {
        let tmp = tempfile::tempdir().unwrap();
        for i in 0..3 {
            std::fs::write(tmp.path().join(name(i)), vec![7u8; 4096]).unwrap();
        }
        let dir = lmcache_housekeeping::tier_dir::TierDir::open(
            tmp.path(),
            lmcache_housekeeping::tier_dir::Access::ReadOnly,
        )
        .unwrap();
        let inventory = lmcache_housekeeping::scan::scan(&dir).unwrap();
        let mut t = Tracker::from_inventory(&inventory);
        let taken = t.take_lru(1);
        t.put_back_undeletable(&taken[0]);
        t.reconcile(&inventory);
        assert_eq!(t.len(), 3);
        assert_eq!(t.undeletable(), (1, t.usage() / 3));
        assert_eq!(victims(&mut t, u64::MAX).len(), 2);
    }

    #[test]
    fn a_rewrite_clears_or_sets_the_link_mark() {
        let mut t = Tracker::new();
        t.upsert(&parse_object_name(&name(1)).unwrap(), 512, true);
        assert_eq!(t.unlinked(), 0);
        t.upsert(&parse_object_name(&name(1)).unwrap(), 1024, false);
        assert_eq!((t.len(), t.unlinked(), t.usage()), (1, 1, 1024));
        t.upsert(&parse_object_name(&name(1)).unwrap(), 1024, true);
        assert_eq!(t.unlinked(), 0);
        assert_eq!(t.remove(&parse_object_name(&name(1)).unwrap()), Some(1024));
        assert_eq!((t.len(), t.counts.linked), (0, 0));
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
    fn a_start_up_count_less_the_deleted_keeps_the_rest_in_order() {
        let entries: Vec<(u32, i64, u64)> = (0..10).map(|i| (i, 10 - i64::from(i), 512)).collect();
        // Objects 2 and 5 deleted (5 named twice), and an index past the end.
        let t = &mut Tracker::from_inventory_less(&inventory(&entries), &[2, 5, 5, 99]);
        assert_eq!((t.len(), t.usage()), (8, 8 * 512));
        let kept: Vec<String> = [9, 8, 7, 6, 4, 3, 1, 0].into_iter().map(name).collect();
        assert_eq!(victims(t, u64::MAX), kept);
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
