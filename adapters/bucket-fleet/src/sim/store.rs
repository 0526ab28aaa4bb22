//! The simulation's store: one prefix of a bucket in memory, with S3's
//! answers to what the bound and LMCache send it, and every request
//! counted by class (`docs/s3-gateway.md`, "A fleet on one bucket", "What
//! it costs").

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ops::Bound::{Excluded, Included, Unbounded};
use std::time::{Duration, SystemTime};

use lmcache_housekeeping::s3_key::parse_s3_key;

use crate::lease::{Condition, LeaseAnswer, LeaseBody};
use crate::report::ReportBody;
use crate::view::StoredObject;

/// Keys a ListObjectsV2 page holds at most (S3's default and maximum).
pub const PAGE: usize = 1000;

/// Requests by class, as S3 bills them; LMCache's own PUTs apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requests {
    /// ListObjectsV2 requests, one a page (the start-up checks, the full
    /// listings, the listings of the reports' folder).
    pub list: u64,
    /// The bound's PUTs: the start-up probes, the lease, the reports.
    pub put: u64,
    /// The bound's GETs: the lease, the reports.
    pub get: u64,
    /// The bound's DELETEs: the probes, the evictions (of objects gone
    /// already too), the reports of nodes that left.
    pub delete: u64,
    /// LMCache's PUTs of its objects.
    pub data_put: u64,
}

/// What an object holds, as far as the simulation reads it back.
#[derive(Debug, Clone)]
enum Payload {
    /// An LMCache object or a probe: never read back.
    Opaque,
    /// The lease.
    Lease(LeaseBody),
    /// A node's report.
    Report(ReportBody),
}

#[derive(Debug, Clone)]
struct Object {
    bytes: u64,
    modified: SystemTime,
    etag: String,
    /// Whether its key decodes as LMCache's (decoded once, at its PUT).
    lmcache: bool,
    payload: Payload,
}

/// The store's answer to a PUT of the bound's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutAnswer {
    /// Stored, with the object's new ETag.
    Written(String),
    /// `412`: the condition does not hold.
    Conflict,
    /// `501`: the store takes no conditional writes (OpenStack Swift's
    /// `s3api`).
    Unsupported,
}

/// What the store saw of the evictors' deletions, against the rules
/// (`docs/s3-gateway.md`, "The simulation's faults").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checks {
    /// Deletions of keys that are not LMCache objects of the counted
    /// model: the bound's own keys, other tiers' objects, other models'.
    pub foreign_deleted: u64,
    /// Deletions of an object while an older one of the counted model,
    /// written before the deleting evictor's last listing began and never
    /// chosen by it, stayed: victims out of the stated order.
    pub out_of_order: u64,
}

/// One prefix in memory; keys are inside the tier's prefix.
#[derive(Debug)]
pub struct MemStore {
    objects: BTreeMap<String, Object>,
    conditional_writes: bool,
    etags: u64,
    requests: Requests,
    lmcache_bytes: u64,
    peak_bytes: u64,
    evicted: u64,
    whole_seconds: bool,
    /// The counted model's key prefix (`<model>@`), its objects by date,
    /// and those an evictor chose whose deletion failed.
    counted: String,
    by_date: BTreeSet<(SystemTime, String)>,
    spared: HashSet<String>,
    checks: Checks,
}

impl MemStore {
    /// An empty prefix; `conditional_writes` false answers every
    /// conditional PUT `501`.
    pub fn new(conditional_writes: bool) -> Self {
        MemStore {
            objects: BTreeMap::new(),
            conditional_writes,
            etags: 0,
            requests: Requests::default(),
            lmcache_bytes: 0,
            peak_bytes: 0,
            evicted: 0,
            whole_seconds: false,
            counted: String::new(),
            by_date: BTreeSet::new(),
            spared: HashSet::new(),
            checks: Checks::default(),
        }
    }

    /// Dates objects in whole seconds from now on, as SeaweedFS lists them.
    pub fn whole_seconds(&mut self) {
        self.whole_seconds = true;
    }

    /// Checks the evictors' deletions against the objects of `model`
    /// ([`MemStore::evict`]).
    pub fn count_model(&mut self, model: &str) {
        self.counted = format!("{model}@");
    }

    /// Whether the store holds `key`.
    pub fn holds(&self, key: &str) -> bool {
        self.objects.contains_key(key)
    }

    /// The checks so far.
    pub fn checks(&self) -> Checks {
        self.checks
    }

    /// `at` as the store dates it.
    pub fn date(&self, at: SystemTime) -> SystemTime {
        if !self.whole_seconds {
            return at;
        }
        let since = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        SystemTime::UNIX_EPOCH + Duration::from_secs(since.as_secs())
    }

    /// An evictor's DELETE of `key`, whose last listing began at `listed`
    /// (store time); `applied` false for one the store refused (`500`):
    /// its object is then spared by the order check until deleted.
    /// Checked: the key is an LMCache object of the counted model, and no
    /// older one written before `listed` stays unchosen.
    pub fn evict(&mut self, key: &str, listed: SystemTime, applied: bool) {
        let object = self.objects.get(key);
        let ours = object.is_some_and(|o| o.lmcache) && key.starts_with(&self.counted);
        if object.is_some() && !ours {
            self.checks.foreign_deleted += 1;
        }
        if let Some(modified) = object.filter(|_| ours).map(|o| o.modified) {
            let before = modified.min(self.date(listed));
            let older = self
                .by_date
                .iter()
                .take_while(|(at, _)| *at < before)
                .any(|(_, k)| k != key && !self.spared.contains(k));
            self.checks.out_of_order += u64::from(older);
        }
        if applied {
            self.delete(key);
        } else {
            self.requests.delete += 1;
            self.spared.insert(key.to_string());
        }
    }

    /// Someone deletes the lease by hand: no request of the bound's.
    pub fn drop_lease(&mut self, key: &str) {
        self.objects.remove(key);
    }

    /// Someone rewrites the lease with a body no node can read (over the
    /// read's cap, or sent without a length): a new ETag.
    pub fn spoil_lease(&mut self, key: &str, at: SystemTime) {
        if self.objects.contains_key(key) {
            self.store(key.to_string(), 300 << 20, at, Payload::Opaque);
        }
    }

    /// Another writer's report at `key`: no request of the bound's.
    pub fn forge_report(&mut self, key: &str, at: SystemTime, body: &ReportBody) {
        let payload = Payload::Report(body.clone());
        self.store(key.to_string(), json_bytes(body), at, payload);
    }

    /// The requests so far.
    pub fn requests(&self) -> Requests {
        self.requests
    }

    /// Bytes of the LMCache objects stored now.
    pub fn lmcache_bytes(&self) -> u64 {
        self.lmcache_bytes
    }

    /// The most bytes of LMCache objects the prefix held, sampled after
    /// every change.
    pub fn peak_bytes(&self) -> u64 {
        self.peak_bytes
    }

    /// LMCache objects deleted (DELETEs of objects gone already not
    /// counted).
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// LMCache's PUT of `key` (`bytes` bytes) at `at` by the store's clock.
    pub fn put_data(&mut self, key: String, bytes: u64, at: SystemTime) {
        self.requests.data_put += 1;
        self.store(key, bytes, at, Payload::Opaque);
    }

    /// An object left by earlier writers, at the start: no request.
    pub fn prefill(&mut self, key: String, bytes: u64, at: SystemTime) {
        self.store(key, bytes, at, Payload::Opaque);
    }

    /// The start-up check of the listing: one ListObjectsV2 request of
    /// one key.
    pub fn check_listing(&mut self) {
        self.requests.list += 1;
    }

    /// A PUT of the bound's: `condition` as `If-None-Match: *` or
    /// `If-Match`, answered `501` by a store without conditional writes.
    /// An `If-Match` of a key that does not exist is a `412` here (S3
    /// answers `404`, as [`MemStore::put_lease`] does).
    pub fn put(
        &mut self,
        key: &str,
        condition: Option<&Condition>,
        at: SystemTime,
        bytes: u64,
    ) -> PutAnswer {
        self.put_payload(key, condition, at, bytes, Payload::Opaque)
    }

    /// A PUT of the lease, answered as the driver reads it: an `If-Match`
    /// of a lease that is gone is S3's `404`, read as absent.
    pub fn put_lease(
        &mut self,
        key: &str,
        condition: &Condition,
        at: SystemTime,
        body: &LeaseBody,
    ) -> LeaseAnswer {
        let bytes = json_bytes(body);
        let payload = Payload::Lease(body.clone());
        let matches = matches!(condition, Condition::Matches(_));
        if matches && self.conditional_writes && !self.objects.contains_key(key) {
            self.requests.put += 1;
            return LeaseAnswer::Absent;
        }
        match self.put_payload(key, Some(condition), at, bytes, payload) {
            PutAnswer::Written(etag) => LeaseAnswer::Written(etag),
            PutAnswer::Conflict => LeaseAnswer::Conflict,
            PutAnswer::Unsupported => LeaseAnswer::Failed,
        }
    }

    /// A plain PUT of a node's report; always stored.
    pub fn put_report(&mut self, key: &str, at: SystemTime, body: &ReportBody) {
        let payload = Payload::Report(body.clone());
        self.put_payload(key, None, at, json_bytes(body), payload);
    }

    fn put_payload(
        &mut self,
        key: &str,
        condition: Option<&Condition>,
        at: SystemTime,
        bytes: u64,
        payload: Payload,
    ) -> PutAnswer {
        self.requests.put += 1;
        if condition.is_some() && !self.conditional_writes {
            return PutAnswer::Unsupported;
        }
        let etag = self.objects.get(key).map(|o| o.etag.as_str());
        let holds = match condition {
            None => true,
            Some(Condition::Absent) => etag.is_none(),
            Some(Condition::Matches(wanted)) => etag == Some(wanted.as_str()),
        };
        if !holds {
            return PutAnswer::Conflict;
        }
        PutAnswer::Written(self.store(key.to_string(), bytes, at, payload))
    }

    /// A GET of the lease, answered as the driver reads it.
    pub fn get_lease(&mut self, key: &str) -> LeaseAnswer {
        self.requests.get += 1;
        match self.objects.get(key) {
            None => LeaseAnswer::Absent,
            Some(o) => match &o.payload {
                Payload::Lease(body) => LeaseAnswer::Found(o.etag.clone(), Some(body.clone())),
                _ => LeaseAnswer::Found(o.etag.clone(), None),
            },
        }
    }

    /// A GET of a report: its ETag and body, `None` when it is gone (or
    /// is not a report).
    pub fn get_report(&mut self, key: &str) -> Option<(String, ReportBody)> {
        self.requests.get += 1;
        match self.objects.get(key) {
            Some(Object {
                etag,
                payload: Payload::Report(body),
                ..
            }) => Some((etag.clone(), body.clone())),
            _ => None,
        }
    }

    /// A DELETE; one of a key that is gone succeeds too, as on S3.
    pub fn delete(&mut self, key: &str) {
        self.requests.delete += 1;
        self.spared.remove(key);
        if let Some(gone) = self.objects.remove(key) {
            self.by_date.remove(&(gone.modified, key.to_string()));
            if gone.lmcache {
                self.lmcache_bytes -= gone.bytes;
                self.evicted += 1;
            }
        }
    }

    /// One ListObjectsV2 page of the whole prefix after the key `after`:
    /// the LMCache objects on it (the driver keeps those whose keys decode
    /// as LMCache's) and the key to go on after, `None` on the last page.
    pub fn list_page(&mut self, after: Option<&str>) -> (Vec<StoredObject>, Option<String>) {
        let (page, next) = self.page("", after);
        let objects = page
            .into_iter()
            .filter(|(_, o)| o.lmcache)
            .map(|(key, o)| StoredObject {
                key: key.to_string(),
                bytes: o.bytes,
                modified: o.modified,
            })
            .collect();
        (objects, next)
    }

    /// One ListObjectsV2 page of the objects under `folder` after the key
    /// `after`: their names inside the folder and ETags, and the key to go
    /// on after, `None` on the last page.
    pub fn list_folder_page(
        &mut self,
        folder: &str,
        after: Option<&str>,
    ) -> (Vec<(String, Option<String>)>, Option<String>) {
        let (page, next) = self.page(folder, after);
        let listed = page
            .into_iter()
            .map(|(key, o)| (key[folder.len()..].to_string(), Some(o.etag.clone())))
            .collect();
        (listed, next)
    }

    fn page(
        &mut self,
        prefix: &str,
        after: Option<&str>,
    ) -> (Vec<(&str, &Object)>, Option<String>) {
        self.requests.list += 1;
        let from = match after {
            Some(key) => Excluded(key),
            None if prefix.is_empty() => Unbounded,
            None => Included(prefix),
        };
        let mut keys = self
            .objects
            .range::<str, _>((from, Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, o)| (key.as_str(), o));
        let page: Vec<(&str, &Object)> = keys.by_ref().take(PAGE).collect();
        let more = keys.next().is_some();
        let next = more.then(|| page[page.len() - 1].0.to_string());
        (page, next)
    }

    fn store(&mut self, key: String, bytes: u64, at: SystemTime, payload: Payload) -> String {
        self.etags += 1;
        let etag = format!("\"{}\"", self.etags);
        let lmcache = parse_s3_key(&key).is_ok();
        let at = self.date(at);
        if lmcache && !self.counted.is_empty() && key.starts_with(&self.counted) {
            self.by_date.insert((at, key.clone()));
        }
        let object = Object {
            bytes,
            modified: at,
            etag: etag.clone(),
            lmcache,
            payload,
        };
        if let Some(old) = self.objects.insert(key.clone(), object) {
            if old.modified != at {
                self.by_date.remove(&(old.modified, key));
            }
            if old.lmcache {
                self.lmcache_bytes -= old.bytes;
            }
        }
        if lmcache {
            self.lmcache_bytes += bytes;
            self.peak_bytes = self.peak_bytes.max(self.lmcache_bytes);
        }
        etag
    }
}

fn json_bytes(body: &impl serde::Serialize) -> u64 {
    serde_json::to_vec(body).map_or(0, |v| v.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const T: SystemTime = SystemTime::UNIX_EPOCH;

    fn key(i: u64) -> String {
        format!("m@00000000@0@{i:064x}")
    }

    #[test]
    fn conditional_puts_hold_atomically_or_are_refused_with_501() {
        let mut s = MemStore::new(true);
        let absent = Condition::Absent;
        let PutAnswer::Written(etag) = s.put("l", Some(&absent), T, 2) else {
            panic!("not created")
        };
        assert_eq!(s.put("l", Some(&absent), T, 2), PutAnswer::Conflict);
        let other = Condition::Matches("\"x\"".into());
        assert_eq!(s.put("l", Some(&other), T, 2), PutAnswer::Conflict);
        let mine = Condition::Matches(etag);
        assert!(matches!(
            s.put("l", Some(&mine), T, 2),
            PutAnswer::Written(_)
        ));
        let mut swift = MemStore::new(false);
        assert_eq!(swift.put("l", Some(&absent), T, 2), PutAnswer::Unsupported);
        assert_eq!(swift.requests().put, 1);
    }

    #[test]
    fn listings_page_by_a_thousand_and_count_only_lmcache_bytes() {
        let mut s = MemStore::new(true);
        for i in 0..2500 {
            s.put_data(key(i), 10, T + Duration::from_secs(i));
        }
        s.put("a/r1", None, T, 5);
        s.put("a/r2", None, T, 5);
        s.put("b", None, T, 5);
        assert_eq!((s.lmcache_bytes(), s.peak_bytes()), (25_000, 25_000));
        let (mut all, mut after) = (Vec::new(), None);
        loop {
            let (page, next) = s.list_page(after.as_deref());
            all.extend(page);
            after = next;
            if after.is_none() {
                break;
            }
        }
        assert_eq!((all.len(), s.requests().list), (2500, 3));
        assert_eq!(s.list_folder_page("a/", None).0.len(), 2);
        s.delete(&key(0));
        s.delete(&key(0));
        assert_eq!((s.lmcache_bytes(), s.evicted()), (24_990, 1));
        assert_eq!(s.requests().delete, 2);
        assert_eq!(s.requests().data_put, 2500);
    }
}
