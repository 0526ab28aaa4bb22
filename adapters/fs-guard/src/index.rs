//! The tracker's index: from the hash of an object's name to its slot in
//! the tracker's entry array, 4 bytes a bucket.
//!
//! Open addressing with linear probing; an object's home bucket is
//! `hash x buckets / 2^64`, so the table can have any number of buckets and
//! grows or shrinks by a fraction instead of doubling. It holds between 45%
//! and 80% of its buckets (60% after a resize), so it costs at most 8.9
//! bytes an object at any count (`docs/performance.md`, "Capacity guard":
//! at most 64 bytes per tracked object, the entries included). A removal
//! shifts the slots after it back toward their homes (no tombstones), so
//! lookups stay as short after a million removals as after none.
//!
//! The index stores only slots; the hash of a slot already in the table is
//! recomputed from its entry when a resize or a removal moves it (the
//! `hash_of` argument), and a lookup compares entries (the `eq` argument).

/// A bucket that holds no slot.
const EMPTY: u32 = u32::MAX;
/// The fewest buckets of a table that holds anything.
const MIN_BUCKETS: usize = 16;

/// Buckets for `len` slots at 60% load.
fn buckets_for(len: usize) -> usize {
    (len * 5 / 3).max(MIN_BUCKETS)
}

/// Slots of the tracker's entries by the hash of their names (see the
/// module docs).
#[derive(Debug, Default, Clone)]
pub(crate) struct SlotIndex {
    buckets: Vec<u32>,
    len: usize,
}

impl SlotIndex {
    /// Slots held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Heap bytes of the table.
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<u32>()
    }

    fn home(&self, h: u64) -> usize {
        ((u128::from(h) * self.buckets.len() as u128) >> 64) as usize
    }

    fn next(&self, bucket: usize) -> usize {
        match bucket + 1 {
            n if n == self.buckets.len() => 0,
            n => n,
        }
    }

    /// The bucket of the first slot under `h` for which `eq` holds.
    pub(crate) fn find(&self, h: u64, mut eq: impl FnMut(u32) -> bool) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mut bucket = self.home(h);
        loop {
            match self.buckets[bucket] {
                EMPTY => return None,
                slot if eq(slot) => return Some(bucket),
                _ => bucket = self.next(bucket),
            }
        }
    }

    /// The slot in `bucket` (from [`SlotIndex::find`]).
    pub(crate) fn get(&self, bucket: usize) -> u32 {
        self.buckets[bucket]
    }

    /// Puts `slot` in `bucket` in place of the slot there (an entry that
    /// moved in the entry array).
    pub(crate) fn set(&mut self, bucket: usize, slot: u32) {
        self.buckets[bucket] = slot;
    }

    /// Makes room for `len` slots in all, so that inserting up to that many
    /// resizes no more.
    pub(crate) fn reserve(&mut self, len: usize, hash_of: impl Fn(u32) -> u64) {
        if len * 5 > self.buckets.len() * 4 {
            self.resize(buckets_for(len), hash_of);
        }
    }

    /// Adds `slot`, which is not in the index, under `h`.
    pub(crate) fn insert(&mut self, h: u64, slot: u32, hash_of: impl Fn(u32) -> u64) {
        self.reserve(self.len + 1, hash_of);
        self.place(h, slot);
        self.len += 1;
    }

    fn place(&mut self, h: u64, slot: u32) {
        let mut bucket = self.home(h);
        while self.buckets[bucket] != EMPTY {
            bucket = self.next(bucket);
        }
        self.buckets[bucket] = slot;
    }

    /// Removes the slot in `bucket`: each slot after it in its run moves
    /// back into the gap unless its home lies between the gap and itself.
    /// A table left less than 45% full shrinks to 60%.
    pub(crate) fn remove(&mut self, bucket: usize, hash_of: impl Fn(u32) -> u64) {
        let mut gap = bucket;
        let mut at = self.next(bucket);
        loop {
            let slot = self.buckets[at];
            if slot == EMPTY {
                break;
            }
            let home = self.home(hash_of(slot));
            let stays = match gap <= at {
                true => gap < home && home <= at,
                false => gap < home || home <= at,
            };
            if !stays {
                self.buckets[gap] = slot;
                gap = at;
            }
            at = self.next(at);
        }
        self.buckets[gap] = EMPTY;
        self.len -= 1;
        if self.buckets.len() > MIN_BUCKETS && self.len * 20 < self.buckets.len() * 9 {
            self.resize(buckets_for(self.len), hash_of);
        }
    }

    fn resize(&mut self, buckets: usize, hash_of: impl Fn(u32) -> u64) {
        let old = std::mem::replace(&mut self.buckets, vec![EMPTY; buckets]);
        for slot in old.into_iter().filter(|&s| s != EMPTY) {
            self.place(hash_of(slot), slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Hashes that collide in runs: keys k and k + 1000 share a hash.
    fn hash(key: u32) -> u64 {
        u64::from(key % 1000).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u32),
        Remove(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..3000u32).prop_map(Op::Insert),
            (0..3000u32).prop_map(Op::Remove),
        ]
    }

    proptest! {
        /// Against a `HashMap` of keys (the slot is the key here): the same
        /// keys are found, removals leave no holes in a run (every key stays
        /// reachable from its home), and the table stays between its loads.
        #[test]
        fn holds_what_a_hash_map_holds(ops in proptest::collection::vec(op(), 1..2000)) {
            let mut index = SlotIndex::default();
            let mut model: HashMap<u32, ()> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k) if !model.contains_key(&k) => {
                        index.insert(hash(k), k, hash);
                        model.insert(k, ());
                    }
                    Op::Insert(_) => {}
                    Op::Remove(k) => {
                        let found = index.find(hash(k), |s| s == k);
                        prop_assert_eq!(found.is_some(), model.remove(&k).is_some());
                        if let Some(bucket) = found {
                            prop_assert_eq!(index.get(bucket), k);
                            index.remove(bucket, hash);
                        }
                    }
                }
                prop_assert_eq!(index.len(), model.len());
                let buckets = index.buckets.len();
                prop_assert!(index.len() * 5 <= buckets * 4, "over 80%: {} in {}", index.len(), buckets);
                prop_assert!(
                    buckets <= MIN_BUCKETS || index.len() * 20 >= buckets * 9,
                    "under 45%: {} in {}", index.len(), buckets
                );
            }
            for k in 0..3000u32 {
                prop_assert_eq!(index.find(hash(k), |s| s == k).is_some(), model.contains_key(&k));
            }
        }
    }

    #[test]
    fn a_slot_set_in_place_is_found_under_its_hash() {
        let mut index = SlotIndex::default();
        for k in 0..100 {
            index.insert(hash(k), k, hash);
        }
        let bucket = index.find(hash(7), |s| s == 7).unwrap();
        // Entry 7 moved to slot 1007 of the array: same name, same hash.
        index.set(bucket, 1007);
        assert_eq!(index.find(hash(7), |s| s == 1007), Some(bucket));
        assert_eq!(index.find(hash(7), |s| s == 7), None);
    }

    #[test]
    fn an_emptied_index_shrinks_to_its_least_size() {
        let mut index = SlotIndex::default();
        for k in 0..10_000 {
            index.insert(u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15), k, |s| {
                u64::from(s).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            });
        }
        assert!(index.heap_bytes() <= 10_000 * 4 * 5 / 3 + 64);
        for k in 0..10_000u32 {
            let h = u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let bucket = index.find(h, |s| s == k).unwrap();
            index.remove(bucket, |s| u64::from(s).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        assert_eq!(index.len(), 0);
        assert_eq!(index.buckets.len(), MIN_BUCKETS);
    }
}
