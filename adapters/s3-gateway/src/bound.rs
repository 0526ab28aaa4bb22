//! The bucket bound: the gateway of an `s3_bucket` tier with
//! `max_capacity_gb` keeps the LMCache objects under the tier's prefix
//! within that capacity, for every node that shares the prefix
//! (`docs/s3-gateway.md`, "The bucket bound").
//!
//! LMCache 0.5.6's S3 adapter counts its usage from 0 at each start and
//! evicts only keys its own process stored, so its `max_capacity_gb`
//! bounds what one process writes between two restarts, not the bucket.
//! The gateway sees the bucket instead:
//!
//! - at start it checks that it may list the prefix (one ListObjectsV2
//!   request of one key through `aws-sdk-s3`), then lists the whole prefix
//!   in the background while the gateway already serves, and counts the
//!   objects whose keys decode as LMCache's
//!   ([`lmcache_housekeeping::s3_key::parse_s3_key`]), and their bytes; it
//!   evicts nothing before that first listing is in;
//! - it follows this node's PUTs, multipart completes and DELETEs, and the
//!   404s of its loads, as they pass;
//! - it lists again once this node has written [`LISTING_SHARE`] of the
//!   capacity since the last listing, and at least every [`IDLE_LISTING`]
//!   ([`BucketView::listing_due`]), to see what other nodes wrote;
//! - at or above the trigger it deletes the oldest objects by the store's
//!   `LastModified`, ties by key, down to the target ([`victims`]).
//!
//! Nodes do not talk to each other: each derives its victims from its view
//! of the same bucket with the same rule, so they choose the same objects
//! from the old end, and a DELETE of an object another node deleted first
//! is a success (S3's DELETE is idempotent).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::spec::BucketSpecError;
use super::state::Stats;
use super::store::{Store, StoredObject};
use lmcache_housekeeping::s3_key::parse_s3_key;
use lmcache_tier_spec::capacity::{
    capacity_bytes, capacity_gib, eviction_fraction, CapacityRule, DEFAULT_EVICTION_RATIO,
    DEFAULT_TRIGGER_WATERMARK, EVICTION, EVICTION_RATIO, MAX_CAPACITY_GB, TRIGGER_WATERMARK,
};
use lmcache_tier_spec::TierSpec;

/// The share of the capacity (1/50, 2%) this node writes after which the
/// gateway lists again. Every node of the fleet does the same, so between
/// two listings of a writing node the bucket grows by about 2% of the
/// capacity per writing node past what that node sees. The cost: a full
/// bucket of N objects lists in N/1,000 pages (ListObjectsV2 requests),
/// and the node wrote N/50 objects (PUT requests, the same price class on
/// S3) in between, so the listings add at most 5% to the node's own
/// request bill, whatever the bucket's size (`docs/s3-gateway.md`, "The
/// bucket bound").
pub const LISTING_SHARE: u64 = 50;
/// The longest a gateway goes without listing, to see what other nodes
/// wrote while this one writes nothing: 12 listings an hour (768 LIST
/// requests at 64,000 objects).
pub const IDLE_LISTING: Duration = Duration::from_secs(300);

/// The longest pause between two tries of a first listing that fails
/// (`docs/s3-gateway.md`, "The bucket bound"): the bound evicts nothing
/// until one is in, so a store that answers again is listed within this.
pub const FIRST_LISTING_RETRY: Duration = Duration::from_secs(10);
/// The shortest time between two listings, however fast this node writes.
pub const MIN_LISTING_GAP: Duration = Duration::from_secs(1);
/// Deletions of one eviction cycle in flight at once.
const DELETES_IN_FLIGHT: usize = 8;

/// Who acts first on the tier: LMCache ([`BoundRole::HardBound`]: it
/// evicts the keys its process stored at its watermark, and the gateway
/// acts halfway from there to the capacity, on what the bucket holds) or
/// the gateway ([`BoundRole::Evictor`]: no `eviction` block); the rule is
/// `lmcache-tier-spec`'s, shared with the capacity guard.
pub use lmcache_tier_spec::capacity::BoundRole;

/// When the gateway evicts from a bucket, and to where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundSpec {
    /// `max_capacity_gb` in bytes (GiB, rounded down).
    pub capacity_bytes: u64,
    /// Usage at or above which a cycle starts.
    pub trigger_bytes: u64,
    /// Usage a cycle ends at or below: the trigger less `eviction_ratio` x
    /// capacity, as LMCache's own cycles free.
    pub target_bytes: u64,
    /// Bytes this node writes after which it lists again: the capacity
    /// over [`LISTING_SHARE`].
    pub listing_every_bytes: u64,
    /// Evictor or hard bound.
    pub role: BoundRole,
}

impl BoundSpec {
    /// The bound of the `s3` tier `spec` at `position`: `None` without a
    /// `max_capacity_gb` above 0 (nothing to bound). The role is
    /// [`BoundRole::HardBound`] when LMCache evicts the tier itself
    /// ([`TierSpec::lmcache_evicts`]), else [`BoundRole::Evictor`];
    /// `eviction.trigger_watermark` and `eviction.eviction_ratio` default
    /// to LMCache's 0.8 and 0.2.
    ///
    /// # Errors
    /// A `max_capacity_gb`, `eviction.trigger_watermark` or
    /// `eviction.eviction_ratio` that is not a number in range, naming it.
    pub fn from_spec(spec: &TierSpec, position: usize) -> Result<Option<Self>, BucketSpecError> {
        let object = spec.as_object();
        let err = |key: &'static str, value: &Value, range: &str| BucketSpecError {
            position,
            key,
            problem: format!("{value} is not a number {range}"),
            fix: format!("Give {key} as a number {range}."),
        };
        let gb = match object.get(MAX_CAPACITY_GB) {
            None | Some(Value::Null) => return Ok(None),
            Some(value) => capacity_gib(value)
                .ok_or_else(|| err("max_capacity_gb", value, "of GiB, 0 or more"))?,
        };
        if gb == 0.0 {
            return Ok(None);
        }
        let eviction = object.get(EVICTION);
        let fraction = |key: &'static str, name: &str, default: f64| {
            eviction_fraction(eviction, name, default).map_err(|v| err(key, v, "in (0, 1]"))
        };
        let watermark = fraction(
            "eviction.trigger_watermark",
            TRIGGER_WATERMARK,
            DEFAULT_TRIGGER_WATERMARK,
        )?;
        let ratio = fraction(
            "eviction.eviction_ratio",
            EVICTION_RATIO,
            DEFAULT_EVICTION_RATIO,
        )?;
        let role = if spec.lmcache_evicts() {
            BoundRole::HardBound
        } else {
            BoundRole::Evictor
        };
        Ok(Some(Self::new(capacity_bytes(gb), watermark, ratio, role)))
    }

    /// The bound of a capacity of `capacity_bytes` evicted at `watermark`
    /// (for an [`BoundRole::Evictor`]; halfway from it to 1 for a
    /// [`BoundRole::HardBound`]) by `ratio` of the capacity per cycle.
    pub fn new(capacity_bytes: u64, watermark: f64, ratio: f64, role: BoundRole) -> Self {
        let rule = CapacityRule {
            capacity_bytes,
            trigger_watermark: watermark,
            eviction_ratio: ratio,
            role,
        };
        BoundSpec {
            capacity_bytes,
            trigger_bytes: rule.trigger_bytes(),
            target_bytes: rule.target_bytes(),
            listing_every_bytes: capacity_bytes / LISTING_SHARE,
            role,
        }
    }
}

/// What the bound knows of one object: its size and the store's
/// `LastModified`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Bytes.
    pub bytes: u64,
    /// When the store wrote it (this node's clock for its own PUTs until
    /// the next listing gives the store's).
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
#[derive(Debug, Default)]
pub struct BucketView {
    objects: HashMap<String, Entry>,
    bytes: u64,
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

    /// Records an object this node stored (or learned of), replacing one
    /// of the same key.
    pub fn stored(&mut self, key: String, entry: Entry) {
        self.written_since_listing += entry.bytes;
        if let Some(journal) = &mut self.journal {
            journal.push(Change::Stored(key.clone(), entry));
        }
        self.insert(key, entry);
    }

    /// Forgets an object this node deleted, or found gone.
    pub fn removed(&mut self, key: &str) {
        if let Some(journal) = &mut self.journal {
            journal.push(Change::Removed(key.to_string()));
        }
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
        self.bytes = 0;
        for object in listed {
            if !before.contains_key(&object.key) {
                others.0 += 1;
                others.1 += object.bytes;
            }
            let entry = Entry {
                bytes: object.bytes,
                modified: object.modified,
            };
            self.insert(object.key, entry);
        }
        for change in journal {
            match change {
                Change::Stored(key, entry) => self.insert(key, entry),
                Change::Removed(key) => self.remove(&key),
            }
        }
        others
    }

    /// The victims of [`victims`] for this view.
    pub fn victims(&self, bound: &BoundSpec) -> Vec<(String, u64)> {
        let objects = self.objects.iter().map(|(k, e)| (k.as_str(), e));
        victims(objects, self.bytes, bound)
            .into_iter()
            .map(|(key, bytes)| (key.to_string(), bytes))
            .collect()
    }

    fn insert(&mut self, key: String, entry: Entry) {
        let old = self.objects.insert(key, entry).map_or(0, |e| e.bytes);
        self.bytes = self.bytes - old + entry.bytes;
    }

    fn remove(&mut self, key: &str) {
        if let Some(old) = self.objects.remove(key) {
            self.bytes -= old.bytes;
        }
    }
}

/// The bound's figures, in the gateway's state ([`crate::state::GatewayState::bucket_bound`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundState {
    /// The bound's numbers.
    pub spec: BoundSpec,
    /// Bytes of LMCache objects under the prefix: the last listing with
    /// this node's changes since.
    pub usage_bytes: u64,
    /// LMCache objects under the prefix, counted as `usage_bytes`.
    pub objects: u64,
    /// Listings done (each of one or more ListObjectsV2 pages).
    pub listings: u64,
    /// ListObjectsV2 requests sent, all listings together.
    pub listing_pages: u64,
    /// Listings that failed (the view goes on as it was).
    pub listing_failures: u64,
    /// How long the last listing took, milliseconds.
    pub last_listing_millis: u64,
    /// When the last listing ended, Unix seconds; 0 before the first.
    pub last_listing_unix: u64,
    /// Objects a listing found that this node did not know of (other
    /// nodes' writes), all listings together.
    pub others_added_objects: u64,
    /// Their bytes.
    pub others_added_bytes: u64,
    /// Objects the bound deleted.
    pub evicted_objects: u64,
    /// Their bytes.
    pub evicted_bytes: u64,
    /// Deletions that failed (retried at the next cycle).
    pub eviction_failures: u64,
}

/// Checks that the bound may list the bucket of `upstream` and starts it
/// ([`Bound::run`] on the current runtime, which makes the first listing
/// in the background).
///
/// # Errors
/// The check failed: named as a problem of `max_capacity_gb` (the bound
/// that needs it), with the store's answer.
pub(crate) async fn start(
    upstream: &super::gateway::Upstream,
    spec: BoundSpec,
    stats: Arc<Stats>,
) -> Result<Arc<Bound>, BucketSpecError> {
    let (tier, credentials) = upstream.tier_and_credentials();
    let err = |e: super::store::StoreError| {
        BucketSpecError {
        position: tier.position,
        key: "max_capacity_gb",
        problem: format!("the bucket bound cannot list {}/{}: {e}", tier.bucket, tier.key_prefix),
        fix: "Give the credentials s3:ListBucket on the bucket (the gateway lists the tier's prefix to keep the bucket within max_capacity_gb), or check the endpoint.".to_string(),
    }
    };
    let store = Store::new(tier, credentials).map_err(err)?;
    let bound = Bound::start(spec, store, tier.position, stats)
        .await
        .map_err(err)?;
    tokio::spawn(bound.clone().run());
    Ok(bound)
}

/// The running bound of one gateway.
pub(crate) struct Bound {
    spec: BoundSpec,
    store: Store,
    tier: usize,
    view: Mutex<BucketView>,
    figures: Mutex<BoundState>,
    wake: tokio::sync::Notify,
    stats: Arc<Stats>,
}

impl Bound {
    /// Checks that the tier's prefix can be listed (one request,
    /// [`Store::check_listing`]) and returns the bound, ready to
    /// [`Bound::run`], which makes the first listing.
    ///
    /// # Errors
    /// The check failed: the launch stops, naming the cause.
    pub(crate) async fn start(
        spec: BoundSpec,
        store: Store,
        tier: usize,
        stats: Arc<Stats>,
    ) -> Result<Arc<Bound>, super::store::StoreError> {
        let figures = BoundState {
            spec,
            usage_bytes: 0,
            objects: 0,
            listings: 0,
            listing_pages: 0,
            listing_failures: 0,
            last_listing_millis: 0,
            last_listing_unix: 0,
            others_added_objects: 0,
            others_added_bytes: 0,
            evicted_objects: 0,
            evicted_bytes: 0,
            eviction_failures: 0,
        };
        let bound = Arc::new(Bound {
            spec,
            store,
            tier,
            view: Mutex::new(BucketView::default()),
            figures: Mutex::new(figures),
            wake: tokio::sync::Notify::new(),
            stats,
        });
        bound.store.check_listing().await?;
        bound.changed();
        Ok(bound)
    }

    /// Makes the first listing, again while it fails (after
    /// [`MIN_LISTING_GAP`], doubled at each failure up to
    /// [`FIRST_LISTING_RETRY`]), and logs what it found.
    async fn first_listing(&self) {
        let mut pause = MIN_LISTING_GAP;
        while let Err(e) = self.list().await {
            tracing::warn!(tier = self.tier, "S3 gateway bucket bound: {e}");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(FIRST_LISTING_RETRY);
        }
        let (usage_bytes, objects) = {
            let view = self.view();
            (view.bytes(), view.objects())
        };
        tracing::info!(
            tier = self.tier,
            usage_bytes,
            objects,
            capacity_bytes = self.spec.capacity_bytes,
            trigger_bytes = self.spec.trigger_bytes,
            "S3 gateway bucket bound listed the tier's prefix"
        );
    }

    fn view(&self) -> std::sync::MutexGuard<'_, BucketView> {
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn figures(&self) -> std::sync::MutexGuard<'_, BoundState> {
        self.figures.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Follows one answered request of LMCache's ([`Bound::observe`]);
    /// listings are not followed.
    pub(crate) fn follow(
        self: &Arc<Self>,
        parts: &http::request::Parts,
        listing: bool,
        status: http::StatusCode,
    ) {
        let Ok(key) = super::key::request_key(parts.uri.path()) else {
            return;
        };
        if listing {
            return;
        }
        let bytes = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let query = parts.uri.query().unwrap_or("");
        self.observe(&parts.method, &key, query, bytes, status);
    }

    /// Follows one answered request of LMCache's for `key` (inside the
    /// prefix): a PUT (not a part) adds `request_bytes`, a multipart
    /// complete adds what a HEAD finds, a DELETE removes the key, and so
    /// does a GET or HEAD answered 404. Keys that do not decode as
    /// LMCache's are not followed. Reads do not count for recency
    /// (`docs/s3-gateway.md`, "The bucket bound").
    pub(crate) fn observe(
        self: &Arc<Self>,
        method: &http::Method,
        key: &str,
        query: &str,
        request_bytes: Option<u64>,
        status: http::StatusCode,
    ) {
        if parse_s3_key(key).is_err() {
            return;
        }
        let multipart = query.split('&').any(|p| p.starts_with("uploadId="));
        match *method {
            http::Method::PUT if status.is_success() && !multipart => {
                if let Some(bytes) = request_bytes {
                    let modified = SystemTime::now();
                    self.view()
                        .stored(key.to_string(), Entry { bytes, modified });
                    self.changed();
                }
            }
            http::Method::POST if status.is_success() && multipart => {
                let bound = self.clone();
                let key = key.to_string();
                tokio::spawn(async move { bound.learn(&key).await });
            }
            http::Method::DELETE if status.is_success() => {
                self.view().removed(key);
                self.changed();
            }
            http::Method::GET | http::Method::HEAD if status == http::StatusCode::NOT_FOUND => {
                self.view().removed(key);
                self.changed();
            }
            _ => {}
        }
    }

    /// Adds what a HEAD finds of `key` (a multipart object just completed).
    async fn learn(&self, key: &str) {
        match self.store.head(key).await {
            Ok(Some(object)) => {
                let entry = Entry {
                    bytes: object.bytes,
                    modified: object.modified,
                };
                self.view().stored(object.key, entry);
                self.changed();
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(tier = self.tier, "S3 gateway bucket bound: {e}"),
        }
    }

    /// Publishes the figures and wakes the bound's task when a listing is
    /// due or the usage reached the trigger.
    fn changed(&self) {
        let (bytes, objects, due) = {
            let view = self.view();
            (
                view.bytes(),
                view.objects() as u64,
                view.listing_due(self.spec.listing_every_bytes),
            )
        };
        let state = {
            let mut figures = self.figures();
            figures.usage_bytes = bytes;
            figures.objects = objects;
            figures.clone()
        };
        self.stats.set_bound(state);
        if due || bytes >= self.spec.trigger_bytes {
            self.wake.notify_one();
        }
    }

    /// Lists the prefix and replaces the view with what it holds.
    async fn list(&self) -> Result<(), super::store::StoreError> {
        self.view().begin_listing();
        let started = Instant::now();
        let listing = match self.store.list().await {
            Ok(listing) => listing,
            Err(e) => {
                self.view().listing_failed();
                self.figures().listing_failures += 1;
                self.changed();
                return Err(e);
            }
        };
        let took = started.elapsed();
        let ours: Vec<StoredObject> = listing
            .objects
            .into_iter()
            .filter(|o| parse_s3_key(&o.key).is_ok())
            .collect();
        let (objects, bytes) = self.view().finish_listing(ours);
        {
            let mut figures = self.figures();
            figures.listings += 1;
            figures.listing_pages += listing.pages;
            figures.last_listing_millis = took.as_millis() as u64;
            figures.last_listing_unix = unix_now();
            if figures.listings > 1 {
                figures.others_added_objects += objects;
                figures.others_added_bytes += bytes;
            }
        }
        self.changed();
        Ok(())
    }

    /// Makes the first listing, then lists when due and evicts when at
    /// the trigger, until the runtime stops: woken by [`Bound::observe`],
    /// at least every [`IDLE_LISTING`]. Nothing is evicted before the
    /// first listing is in: until then the view holds only this node's
    /// writes, not the bucket's oldest objects.
    pub(crate) async fn run(self: Arc<Self>) {
        self.first_listing().await;
        let mut last_listing = Instant::now();
        self.evict().await;
        loop {
            let _ = tokio::time::timeout(IDLE_LISTING, self.wake.notified()).await;
            let due = self.view().listing_due(self.spec.listing_every_bytes)
                || last_listing.elapsed() >= IDLE_LISTING;
            if due {
                let gap = MIN_LISTING_GAP.saturating_sub(last_listing.elapsed());
                tokio::time::sleep(gap).await;
                if let Err(e) = self.list().await {
                    tracing::warn!(tier = self.tier, "S3 gateway bucket bound: {e}");
                }
                last_listing = Instant::now();
            }
            self.evict().await;
        }
    }

    /// One eviction cycle when the view is at or above the trigger.
    async fn evict(&self) {
        let chosen = self.view().victims(&self.spec);
        if chosen.is_empty() {
            return;
        }
        let before = self.view().bytes();
        let results: Vec<_> = {
            use futures_util::StreamExt;
            futures_util::stream::iter(chosen)
                .map(|(key, bytes)| async move {
                    let done = self.store.delete(&key).await;
                    (key, bytes, done)
                })
                .buffer_unordered(DELETES_IN_FLIGHT)
                .collect()
                .await
        };
        let (mut deleted, mut freed, mut failed) = (0u64, 0u64, 0u64);
        for (key, bytes, done) in results {
            match done {
                Ok(()) => {
                    self.view().removed(&key);
                    deleted += 1;
                    freed += bytes;
                }
                Err(e) => {
                    failed += 1;
                    tracing::warn!(tier = self.tier, "S3 gateway bucket bound: {e}");
                }
            }
        }
        {
            let mut figures = self.figures();
            figures.evicted_objects += deleted;
            figures.evicted_bytes += freed;
            figures.eviction_failures += failed;
        }
        let after = self.view().bytes();
        tracing::info!(
            tier = self.tier,
            deleted,
            freed_bytes = freed,
            usage_before = before,
            usage_after = after,
            capacity_bytes = self.spec.capacity_bytes,
            "S3 gateway bucket bound evicted the oldest objects"
        );
        self.changed();
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmcache_tier_spec::capacity::GIB;
    use proptest::prelude::*;

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    fn spec(json: &str) -> TierSpec {
        lmcache_tier_spec::Cascade::parse(json, "t")
            .unwrap()
            .0
            .remove(0)
    }

    #[test]
    fn the_role_follows_whether_lmcache_evicts_the_tier() {
        let evicting = spec(
            r#"{"type":"s3","max_capacity_gb":1,"eviction":{"eviction_policy":"LRU","trigger_watermark":0.8,"eviction_ratio":0.2}}"#,
        );
        let bound = BoundSpec::from_spec(&evicting, 1).unwrap().unwrap();
        assert_eq!(bound.role, BoundRole::HardBound);
        assert_eq!(bound.capacity_bytes, 1 << 30);
        assert_eq!(bound.trigger_bytes, (0.9 * GIB).ceil() as u64);
        assert_eq!(
            bound.target_bytes,
            bound.trigger_bytes - (0.2 * GIB).ceil() as u64
        );
        let counting = spec(r#"{"type":"s3","max_capacity_gb":2}"#);
        let bound = BoundSpec::from_spec(&counting, 1).unwrap().unwrap();
        assert_eq!(bound.role, BoundRole::Evictor);
        assert_eq!(bound.trigger_bytes, (1.6 * GIB).ceil() as u64);
        let unbounded = spec(r#"{"type":"s3","max_capacity_gb":0}"#);
        assert_eq!(BoundSpec::from_spec(&unbounded, 1).unwrap(), None);
        assert_eq!(
            BoundSpec::from_spec(&spec(r#"{"type":"s3"}"#), 1).unwrap(),
            None
        );
    }

    #[test]
    fn bad_numbers_are_errors_naming_the_key() {
        for (json, key) in [
            (
                r#"{"type":"s3","max_capacity_gb":"big"}"#,
                "max_capacity_gb",
            ),
            (r#"{"type":"s3","max_capacity_gb":-1}"#, "max_capacity_gb"),
            (
                r#"{"type":"s3","max_capacity_gb":1,"eviction":{"trigger_watermark":1.5}}"#,
                "eviction.trigger_watermark",
            ),
            (
                r#"{"type":"s3","max_capacity_gb":1,"eviction":{"eviction_ratio":0}}"#,
                "eviction.eviction_ratio",
            ),
        ] {
            let e = BoundSpec::from_spec(&spec(json), 2).unwrap_err();
            assert_eq!((e.position, e.key), (2, key), "{json}");
        }
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
