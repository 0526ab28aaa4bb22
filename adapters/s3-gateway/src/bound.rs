//! The bucket bound's driver: the gateway of an `s3_bucket` tier with
//! `max_capacity_gb` keeps the LMCache objects under the tier's prefix
//! within that capacity, for every node that shares the prefix
//! (`docs/s3-gateway.md`, "The bucket bound" and "A fleet on one
//! bucket").
//!
//! LMCache 0.5.6's S3 adapter counts its usage from 0 at each start and
//! evicts only keys its own process stored, so its `max_capacity_gb`
//! bounds what one process writes between two restarts, not the bucket.
//! The gateway sees the bucket instead. The decisions are the pure
//! machines of [`crate::fleet`], joined in one [`Node`] (as the fleet
//! simulation runs them); this module runs them against the store:
//!
//! - at start it checks that it may list the prefix (one ListObjectsV2
//!   request of one key through `aws-sdk-s3`) and whether the store takes
//!   conditional writes (three PUTs and a DELETE of a probe object): with
//!   them the fleet elects one evictor through a lease
//!   ([`Mode::Lease`]), without them every node evicts on its own
//!   ([`Mode::EveryNode`], with a warning);
//! - one task keeps the lease and sends this node's reports
//!   ([`Election`], [`Reporter`](crate::fleet::report::Reporter));
//! - another runs the [`Evictor`](crate::fleet::evictor::Evictor) while
//!   this node may delete ([`Node::holds`]): it lists
//!   the prefix (in the background: the gateway already serves), counts
//!   the objects whose keys decode as LMCache's
//!   ([`lmcache_housekeeping::s3_key::parse_s3_key`]), reads the reports
//!   and deletes the oldest objects by the store's `LastModified`, ties by
//!   key ([`victims`]); nothing is evicted before its first listing is in;
//! - `Bound::follow` follows this node's PUTs, multipart completes and
//!   DELETEs, and the 404s of its loads, as they pass.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::credentials::RealCredentials;
use super::spec::{BucketSpecError, BucketTier};
use super::state::Stats;
use super::store::{Fetched, PutAnswer, Store, StoreError};
use crate::fleet::evictor::{EvictCycle, EvictStep};
use crate::fleet::lease::{Election, LeaseAnswer, LeaseBody, LeaseStep};
use crate::fleet::models::Models;
use crate::fleet::node::{LeaseChange, Node};
use crate::fleet::report::{ReportBody, MAX_REPORT_KEYS};
use crate::fleet::sweep::Sweep;
use crate::fleet::{lease_key, report_key, reports_folder, Mode};
use crate::node_id::NodeId;
use lmcache_housekeeping::s3_key::parse_s3_key;

pub use crate::fleet::figures::BoundState;
pub use crate::fleet::rule::{BoundRole, BoundSpec, LISTING_SHARE, MIN_LISTING_GAP};
pub use crate::fleet::view::{victims, BucketView, Entry};

/// How long the start-up check of the listing may take before the gateway
/// serves anyway (the bound then lists in the background).
const CHECK_TIMEOUT: Duration = Duration::from_secs(15);

/// The shortest pause of the sweep's task between two looks.
const MIN_SWEEP_PAUSE: Duration = Duration::from_millis(100);

/// The largest lease or report body the bound reads.
const SMALL_BODY: usize = 64 << 10;

/// Checks that the bound may list the bucket of `tier` with its real
/// `credentials` (those of the tier's gateway), finds out
/// whether the store takes conditional writes, and starts it ([`Bound::run`]
/// on the current runtime, which makes the first listing in the
/// background).
///
/// # Errors
/// The store refused the check with a 4xx (credentials, bucket): named as
/// a problem of `max_capacity_gb` (the bound that needs it), with the
/// store's answer and what to do. A store that fails (5xx) or does not
/// answer within [`CHECK_TIMEOUT`] is a warning: the gateway serves, and
/// the bound lists once the store answers.
pub(crate) async fn start(
    tier: &BucketTier,
    credentials: RealCredentials,
    spec: BoundSpec,
    models: Models,
    node: NodeId,
    stats: Arc<Stats>,
) -> Result<Arc<Bound>, BucketSpecError> {
    let started = Instant::now();
    let err = |e: StoreError| BucketSpecError {
        position: tier.position,
        key: "max_capacity_gb",
        problem: format!(
            "the bucket bound cannot list {}/{} ({:.1} s): {e}",
            tier.bucket,
            tier.key_prefix,
            started.elapsed().as_secs_f64()
        ),
        fix: listing_advice(e.status).to_string(),
    };
    let store = Store::new(tier, credentials).map_err(err)?;
    let checked = tokio::time::timeout(CHECK_TIMEOUT, store.check_listing()).await;
    let failure = match checked {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some(StoreError {
            operation: "ListObjectsV2",
            status: None,
            detail: format!("no answer within {} s", CHECK_TIMEOUT.as_secs()),
        }),
    };
    match failure {
        Some(e) if e.status.is_some_and(|s| (400..500).contains(&s)) => return Err(err(e)),
        Some(e) => tracing::warn!(
            tier = tier.position,
            "S3 gateway bucket bound: the start-up check of the listing failed after {:.1} s ({e}); the gateway serves, and the bound lists in the background until the store answers. {}",
            started.elapsed().as_secs_f64(),
            listing_advice(e.status)
        ),
        None => {}
    }
    let probe = tokio::time::timeout(CHECK_TIMEOUT, store.takes_conditional_writes(&node.id));
    let probe = probe.await;
    let probe = probe.unwrap_or_else(|_| {
        Err(StoreError {
            operation: "PutObject",
            status: None,
            detail: format!("no answer within {} s", CHECK_TIMEOUT.as_secs()),
        })
    });
    let mode = match probe {
        Ok(true) => Mode::Lease,
        Ok(false) => {
            tracing::warn!(
                tier = tier.position,
                "S3 gateway bucket bound: the store does not take conditional writes (If-None-Match, If-Match), so no evictor can be elected: every node lists and evicts on its own, and the bucket can pass its trigger by about a fiftieth of the capacity per writing node (docs/s3-gateway.md, \"A fleet on one bucket\")"
            );
            Mode::EveryNode
        }
        Err(e) => {
            tracing::warn!(
                tier = tier.position,
                "S3 gateway bucket bound: the check of conditional writes failed ({e}); every node lists and evicts on its own"
            );
            Mode::EveryNode
        }
    };
    let bound = Bound::new(spec, store, tier, node, mode, models, stats);
    tokio::spawn(bound.clone().run());
    Ok(bound)
}

/// What to do when the start-up listing failed, by the store's status
/// (`None`: no answer).
fn listing_advice(status: Option<u16>) -> &'static str {
    match status {
        Some(401 | 403) => "Give the credentials s3:ListBucket on the bucket (the gateway lists the tier's prefix to keep the bucket within max_capacity_gb).",
        Some(404) => "Check s3_bucket and s3_endpoint: the store knows no such bucket.",
        Some(500..=599) => "The store failed the listing: see its logs. A store that cannot list a key under the prefix (one holding a control character, where the store does not take encoding-type=url) is one known cause: remove that object.",
        Some(_) => "Check s3_endpoint, s3_region and s3_bucket: the store refused the listing.",
        None => "Check that s3_endpoint is reachable from this node and answers a listing page within 30 s.",
    }
}

/// The running bound of one gateway.
pub(crate) struct Bound {
    spec: BoundSpec,
    store: Store,
    tier: usize,
    /// The cache identity's segment LMCache's keys are stored under
    /// ([`crate::identity::segment`]), `""` for none.
    segment: String,
    origin: Instant,
    core: Mutex<Node>,
    figures: Mutex<BoundState>,
    wake: tokio::sync::Notify,
    wake_reports: tokio::sync::Notify,
    stats: Arc<Stats>,
    /// Refused deletions since the last warning, and when that was.
    refusals: Mutex<Refusals>,
    said_oversized: std::sync::atomic::AtomicBool,
    said_oversized_report: std::sync::atomic::AtomicBool,
    said_no_evictor: std::sync::atomic::AtomicBool,
    /// This node's id, and the file that keeps it for a restart, held
    /// while the bound runs.
    _node: NodeId,
}

/// Deletions the store refused, said at most once a [`REFUSAL_WARNING`].
#[derive(Default)]
struct Refusals {
    since_warning: u64,
    warned_at: Option<Instant>,
}

/// The shortest time between two warnings of refused deletions.
const REFUSAL_WARNING: Duration = Duration::from_secs(60);

impl Bound {
    fn new(
        spec: BoundSpec,
        store: Store,
        tier: &BucketTier,
        node: NodeId,
        mode: Mode,
        models: Models,
        stats: Arc<Stats>,
    ) -> Arc<Bound> {
        let core = Node::new(node.id.clone(), spec, mode, Duration::ZERO, models);
        let figures = BoundState::new(spec, mode, node.id.clone());
        let bound = Arc::new(Bound {
            spec,
            store,
            tier: tier.position,
            segment: tier
                .cache_identity
                .as_deref()
                .map(crate::identity::segment)
                .unwrap_or_default(),
            origin: Instant::now(),
            core: Mutex::new(core),
            figures: Mutex::new(figures),
            wake: tokio::sync::Notify::new(),
            wake_reports: tokio::sync::Notify::new(),
            stats,
            refusals: Mutex::new(Refusals::default()),
            said_oversized: std::sync::atomic::AtomicBool::new(false),
            said_oversized_report: std::sync::atomic::AtomicBool::new(false),
            said_no_evictor: std::sync::atomic::AtomicBool::new(false),
            _node: node,
        });
        bound.changed();
        bound
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn core(&self) -> std::sync::MutexGuard<'_, Node> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn figures(&self) -> std::sync::MutexGuard<'_, BoundState> {
        self.figures.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Follows one answered request of LMCache's ([`Bound::observe`]);
    /// listings are not followed. `date` is the store's `Date` header of
    /// the answer: the time of a PUT by the store's clock.
    pub(crate) fn follow(
        self: &Arc<Self>,
        parts: &http::request::Parts,
        listing: bool,
        status: http::StatusCode,
        date: Option<SystemTime>,
    ) {
        let Ok(key) = super::key::request_key(parts.uri.path()) else {
            return;
        };
        let key = format!("{}{key}", self.segment);
        if listing {
            return;
        }
        let bytes = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let query = parts.uri.query().unwrap_or("");
        self.observe(&parts.method, &key, query, bytes, status, date);
    }

    /// Follows one answered request of LMCache's for `key` (inside the
    /// prefix): a PUT (not a part) adds `request_bytes` (dated by the
    /// store's `date`, else this node's clock), a multipart complete adds
    /// what a HEAD finds, a DELETE removes the key, and so does a GET or
    /// HEAD answered 404. Keys that do not decode as LMCache's are not
    /// followed. Reads do not count for recency (`docs/s3-gateway.md`,
    /// "The bucket bound").
    pub(crate) fn observe(
        self: &Arc<Self>,
        method: &http::Method,
        key: &str,
        query: &str,
        request_bytes: Option<u64>,
        status: http::StatusCode,
        date: Option<SystemTime>,
    ) {
        if parse_s3_key(key).is_err() {
            return;
        }
        let multipart = query.split('&').any(|p| p.starts_with("uploadId="));
        match *method {
            http::Method::PUT if status.is_success() && !multipart => {
                if let Some(bytes) = request_bytes {
                    let modified = date.unwrap_or_else(SystemTime::now);
                    self.stored(key.to_string(), Entry { bytes, modified });
                }
            }
            http::Method::POST if status.is_success() && multipart => {
                let bound = self.clone();
                let key = key.to_string();
                tokio::spawn(async move { bound.learn(&key).await });
            }
            http::Method::DELETE if status.is_success() => self.removed(key),
            http::Method::GET | http::Method::HEAD if status == http::StatusCode::NOT_FOUND => {
                self.removed(key)
            }
            _ => {}
        }
    }

    fn stored(&self, key: String, entry: Entry) {
        let report_due = self.core().stored(self.now(), key, entry);
        if report_due {
            self.wake_reports.notify_one();
        }
        self.changed();
    }

    fn removed(&self, key: &str) {
        self.core().evictor.removed(key);
        self.changed();
    }

    /// Adds what a HEAD finds of `key` (a multipart object just completed).
    async fn learn(&self, key: &str) {
        match self.store.head(key).await {
            Ok(Some(object)) => {
                let entry = Entry {
                    bytes: object.bytes,
                    modified: object.modified,
                };
                self.stored(object.key, entry);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(tier = self.tier, "S3 gateway bucket bound: {e}"),
        }
    }

    /// Publishes the figures and wakes the evictor's task.
    fn changed(&self) {
        let now = self.now();
        let (
            evictor,
            evictor_until,
            keeps_view,
            usage,
            objects,
            rate,
            reporters,
            holder,
            lease,
            reports,
            unchanged,
            no_evictor,
            models,
            identities,
        ) = {
            let mut core = self.core();
            let keeps_view = core.holds(now);
            let evictor = keeps_view && core.evictor.listed();
            let evictor_until = core
                .election
                .as_ref()
                .and_then(Election::holds_until)
                .filter(|_| evictor)
                .map(|until| self.origin + until);
            let rate = core.evictor.fleet_rate(now);
            let holder = core.election.as_ref().and_then(|e| e.holder().cloned());
            (
                evictor,
                evictor_until,
                keeps_view,
                core.evictor.known_bytes(),
                core.evictor.view().objects() as u64,
                rate,
                core.evictor.reporters() as u64,
                holder,
                core.election.as_ref().map(Election::figures),
                core.reporter.reports(),
                core.election.as_ref().and_then(|e| e.unchanged_for(now)),
                core.election.as_ref().and_then(|e| e.no_evictor_for(now)),
                core.models.names(),
                match keeps_view {
                    true => core.evictor.view().identities(),
                    false => Vec::new(),
                },
            )
        };
        let state = {
            let mut f = self.figures();
            f.evictor = evictor;
            f.models = models;
            f.identities = identities;
            f.reports_sent = reports;
            f.lease_unchanged_millis = unchanged.map(|d| d.as_millis() as u64);
            f.no_evictor_millis = no_evictor.map(|d| d.as_millis() as u64);
            if let Some(lease) = lease {
                f.lease = lease;
            }
            if let Some(holder) = &holder {
                f.lease_holder.clone_from(&holder.holder);
                f.lease_holder_since_unix = holder.since_unix;
            }
            match holder.filter(|_| !keeps_view && f.mode == Mode::Lease) {
                Some(published) => {
                    f.usage_bytes = published.usage_bytes;
                    f.objects = published.objects;
                    f.fleet_write_bytes_per_s = published.fleet_write_bytes_per_s;
                    f.reporters = published.reporters;
                }
                None => {
                    f.usage_bytes = usage;
                    f.objects = objects;
                    f.fleet_write_bytes_per_s = rate;
                    f.reporters = reporters;
                }
            }
            f.clone()
        };
        self.say_no_evictor(no_evictor, state.spec.timing.lease);
        self.stats.set_bound(state, evictor_until);
        self.wake.notify_one();
    }

    /// Says once when this node has seen no evictor make progress for
    /// twice the lease (`no_evictor`), and once when one does again.
    fn say_no_evictor(&self, no_evictor: Option<Duration>, lease: Duration) {
        let Some(for_) = no_evictor else {
            return;
        };
        let over = for_ > lease * 2;
        let said = self
            .said_no_evictor
            .swap(over, std::sync::atomic::Ordering::Relaxed);
        if over && !said {
            tracing::warn!(
                tier = self.tier,
                "S3 gateway bucket bound: no node of the prefix has renewed its lease for {} s (twice the lease is {} s): nothing keeps the bucket within its capacity. The store may refuse or fail the lease's conditional PUTs, or something else rewrites the lease; lmcache-tier inspect shows the lease as this node sees it",
                for_.as_secs(),
                (lease * 2).as_secs()
            );
        } else if said && !over {
            tracing::info!(
                tier = self.tier,
                "S3 gateway bucket bound: an evictor renews the prefix's lease again"
            );
        }
    }

    /// Runs the bound until the runtime stops: the lease and the reports
    /// on a task of their own (in [`Mode::Lease`]), the evictor here.
    pub(crate) async fn run(self: Arc<Self>) {
        if self.core().election.is_some() {
            tokio::spawn(self.clone().keep_lease());
        }
        tokio::spawn(self.clone().sweep_uploads());
        let mut first = true;
        loop {
            let now = self.now();
            let step = self.core().evict_step(now);
            match step {
                EvictStep::List => {
                    if self.list().await.is_ok() && first {
                        first = false;
                        self.changed();
                        self.say_listed();
                    }
                }
                EvictStep::ReadReports => self.read_reports().await,
                EvictStep::Evict(chosen) => self.evict(chosen).await,
                EvictStep::DeleteReports(nodes) => self.delete_reports(nodes).await,
                EvictStep::Wait(until) => {
                    let pause = until.saturating_sub(now);
                    let _ = tokio::time::timeout(pause, self.wake.notified()).await;
                    self.refresh_evictor();
                    continue;
                }
            }
            self.changed();
        }
    }

    /// Publishes the figures again when whether this node evicts changed
    /// since they were last published (its right to delete lapses with
    /// time, not only with an answer of the store).
    fn refresh_evictor(&self) {
        let now = self.now();
        let evictor = {
            let core = self.core();
            core.holds(now) && core.evictor.listed()
        };
        if self.figures().evictor != evictor {
            self.changed();
        }
    }

    /// Sweeps the uploads left behind under the prefix while this node
    /// evicts ([`Sweep`]), until the runtime stops or the store turns out
    /// not to list uploads.
    async fn sweep_uploads(self: Arc<Self>) {
        let mut sweep = Sweep::new(&self.spec.timing, self.now());
        loop {
            let now = self.now();
            let wait = if !self.core().holds(now) {
                sweep.forget(now);
                self.spec.timing.renew()
            } else if sweep.due(now) {
                if !self.sweep_once(&mut sweep).await {
                    return;
                }
                sweep.next_at().saturating_sub(self.now())
            } else {
                sweep.next_at().saturating_sub(now)
            };
            tokio::time::sleep(wait.max(MIN_SWEEP_PAUSE)).await;
        }
    }

    /// One sweep: lists the uploads, aborts those of LMCache's keys seen
    /// for the age. False when the store does not list uploads (`501`).
    async fn sweep_once(&self, sweep: &mut Sweep) -> bool {
        let listed = match self.store.list_uploads().await {
            Ok(Some((uploads, _pages))) => uploads,
            Ok(None) => {
                tracing::info!(
                    tier = self.tier,
                    "S3 gateway bucket bound: the store does not list multipart uploads (ListMultipartUploads answered 501), so uploads left behind under the prefix are not swept"
                );
                return false;
            }
            Err(e) => {
                tracing::warn!(tier = self.tier, "S3 gateway bucket bound: uploads: {e}");
                sweep.failed(self.now());
                return true;
            }
        };
        self.figures().upload_listings += 1;
        let ours = {
            let core = self.core();
            listed
                .into_iter()
                .filter(|(key, _)| core.models.counts(key))
                .collect()
        };
        let abandoned = sweep.listed(self.now(), ours);
        for (key, id) in abandoned {
            if !self.core().holds(self.now()) {
                break;
            }
            let aborted = self.store.abort_upload(&key, &id).await;
            if aborted.is_err() {
                sweep.abort_failed(self.now(), (key.clone(), id));
            }
            let mut figures = self.figures();
            match aborted {
                Ok(()) => {
                    figures.uploads_aborted += 1;
                    tracing::info!(
                        tier = self.tier,
                        key,
                        "S3 gateway bucket bound aborted an upload left behind"
                    );
                }
                Err(e) => {
                    figures.upload_abort_failures += 1;
                    tracing::warn!(tier = self.tier, "S3 gateway bucket bound: {e}");
                }
            }
        }
        self.changed();
        true
    }

    fn say_listed(&self) {
        let figures = self.figures().clone();
        tracing::info!(
            tier = self.tier,
            usage_bytes = figures.usage_bytes,
            objects = figures.objects,
            capacity_bytes = self.spec.capacity_bytes,
            trigger_bytes = self.spec.trigger_bytes,
            mode = ?figures.mode,
            "S3 gateway bucket bound listed the tier's prefix"
        );
    }

    /// Lists the prefix and replaces the view with what it holds: the
    /// objects of the models this node counts ([`Models`]).
    async fn list(&self) -> Result<(), StoreError> {
        let started = Instant::now();
        let models = self.core().models.clone();
        let listing = self.store.list(|key| models.counts(key)).await;
        let took = started.elapsed();
        let now = self.now();
        let listing = match listing {
            Ok(listing) => listing,
            Err(e) => {
                self.core().listed_at(now, None);
                self.figures().listing_failures += 1;
                tracing::warn!(tier = self.tier, "S3 gateway bucket bound: {e}");
                return Err(e);
            }
        };
        self.say_oversized(&listing.oversized);
        let (objects, bytes) = self.core().listed_at(now, Some(listing.objects));
        let mut figures = self.figures();
        figures.listings += 1;
        figures.listing_pages += listing.pages;
        figures.listing_skipped = listing.skipped;
        figures.oversized_objects = listing.oversized.len() as u64;
        figures.last_listing_millis = took.as_millis() as u64;
        figures.last_listing_unix = unix_now();
        if figures.listings > 1 {
            figures.others_added_objects += objects;
            figures.others_added_bytes = figures.others_added_bytes.saturating_add(bytes);
        }
        Ok(())
    }

    /// Says once per start that a node's report passed the read's cap (a
    /// report is a few hundred bytes): it is skipped, not read whole.
    fn say_oversized_report(&self, node: &str) {
        if !self
            .said_oversized_report
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(
                tier = self.tier,
                "S3 gateway bucket bound: the report of node {node} is larger than {SMALL_BODY} bytes: it is skipped, not read (said once; a report is a few hundred bytes, so something else wrote that key)"
            );
        }
    }

    /// Says once per start that the store listed sizes past any real
    /// object's.
    fn say_oversized(&self, oversized: &[(String, u64)]) {
        let Some((key, bytes)) = oversized.first() else {
            return;
        };
        if self
            .said_oversized
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        tracing::warn!(
            tier = self.tier,
            objects = oversized.len(),
            "S3 gateway bucket bound: the store lists sizes past 5 TiB, the most an S3 object holds ({key:?}: {bytes} bytes): those objects are neither counted nor evicted (said once; bucket_bound.oversized_objects counts them)"
        );
    }

    /// Lists the reports' folder and reads the reports that changed.
    async fn read_reports(&self) {
        let folder = reports_folder();
        let listed = match self.store.list_folder(&folder, MAX_REPORT_KEYS).await {
            Ok((listed, pages)) => {
                self.figures().listing_pages += pages;
                listed
            }
            Err(e) => {
                tracing::warn!(tier = self.tier, "S3 gateway bucket bound: reports: {e}");
                self.core().reports_read(self.now(), &[]);
                return;
            }
        };
        let wanted: Vec<String> = {
            let core = self.core();
            core.evictor
                .to_read(&listed)
                .into_iter()
                .map(str::to_string)
                .collect()
        };
        let mut read = Vec::new();
        for node in wanted {
            match self.store.get(&report_key(&node), SMALL_BODY).await {
                Ok(Fetched::Body(etag, body)) => {
                    if let Ok(mut report) = serde_json::from_slice::<ReportBody>(&body) {
                        report.node = node;
                        read.push((Some(etag).filter(|e| !e.is_empty()), report));
                    }
                }
                Ok(Fetched::Oversized(_)) => self.say_oversized_report(&node),
                Ok(Fetched::Absent) => {}
                Err(e) => tracing::warn!(
                    tier = self.tier,
                    "S3 gateway bucket bound: report {node}: {e}"
                ),
            }
        }
        self.figures().reports_read += read.len() as u64;
        let absurd = {
            let mut core = self.core();
            core.reports_read(self.now(), &read);
            core.evictor.absurd_reports()
        };
        for (node, claimed) in absurd {
            self.figures().absurd_reports += 1;
            tracing::warn!(
                tier = self.tier,
                "S3 gateway bucket bound: the report of node {node:?} claims {claimed} bytes written since the last reading, more than the capacity: it counts as the capacity, and it brings a listing, never a deletion (said once per node; a node's counter is wrong, or something else wrote its report)"
            );
        }
    }

    /// Deletes the reports of nodes that left.
    async fn delete_reports(&self, nodes: Vec<String>) {
        for node in nodes {
            if let Err(e) = self.store.delete(&report_key(&node)).await {
                tracing::warn!(
                    tier = self.tier,
                    "S3 gateway bucket bound: report {node}: {e}"
                );
            }
        }
    }

    /// One eviction cycle: deletes `chosen` as the fleet's
    /// [`EvictCycle`] sends them (in order, eight in flight, a new one as
    /// each answer comes, none once the store has failed more than it
    /// took), each while this node may delete; the next cycle backs off
    /// when this one deleted none
    /// ([`crate::fleet::evictor::Evictor::evicted`]).
    async fn evict(&self, chosen: Vec<(String, u64)>) {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let before = self.core().evictor.known_bytes();
        let mut cycle = EvictCycle::new(chosen);
        let mut flying = FuturesUnordered::new();
        let mut refusal = None;
        loop {
            while let Some((key, bytes)) = cycle.send() {
                flying.push(async move {
                    let done = self.delete_one(&key).await;
                    (key, bytes, done)
                });
            }
            let Some((key, bytes, done)) = flying.next().await else {
                break;
            };
            cycle.answered(key, bytes, done.is_ok());
            if let Err(e) = done {
                refusal.get_or_insert(e);
            }
        }
        let results = cycle.results();
        let deleted = results.iter().filter(|r| r.2).count() as u64;
        let freed = results
            .iter()
            .filter(|r| r.2)
            .fold(0u64, |sum, r| sum.saturating_add(r.1));
        let failed = results.len() as u64 - deleted;
        self.core().evictor.evicted(self.now(), &results);
        self.say_evicted(deleted, freed, before);
        if let Some(e) = refusal {
            self.say_refused(failed, &e);
        }
    }

    /// Deletes one victim, if this node may delete now.
    async fn delete_one(&self, key: &str) -> Result<(), StoreError> {
        if self.core().holds(self.now()) {
            self.store.delete(key).await
        } else {
            Err(StoreError {
                operation: "DeleteObject",
                status: None,
                detail: "not sent: this node no longer holds the lease".into(),
            })
        }
    }

    fn say_evicted(&self, deleted: u64, freed: u64, before: u64) {
        {
            let mut figures = self.figures();
            figures.evicted_objects += deleted;
            figures.evicted_bytes = figures.evicted_bytes.saturating_add(freed);
        }
        if deleted == 0 {
            return;
        }
        let after = self.core().evictor.known_bytes();
        tracing::info!(
            tier = self.tier,
            deleted,
            freed_bytes = freed,
            usage_before = before,
            usage_after = after,
            capacity_bytes = self.spec.capacity_bytes,
            "S3 gateway bucket bound evicted the oldest objects"
        );
    }

    /// Counts `failed` refused deletions and says so at most once a
    /// [`REFUSAL_WARNING`], with the first refusal's answer.
    fn say_refused(&self, failed: u64, first: &StoreError) {
        self.figures().eviction_failures += failed;
        let mut refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        refusals.since_warning += failed;
        if refusals
            .warned_at
            .is_some_and(|at| at.elapsed() < REFUSAL_WARNING)
        {
            return;
        }
        let over = refusals.warned_at.map_or(String::new(), |at| {
            format!(" in the last {} s", at.elapsed().as_secs())
        });
        tracing::warn!(
            tier = self.tier,
            refused = refusals.since_warning,
            "S3 gateway bucket bound: the store refused {} deletions{over} ({first}); eviction cycles back off from 1 s to 60 s while it refuses (said at most once a minute; bucket_bound.eviction_failures counts them)",
            refusals.since_warning
        );
        refusals.since_warning = 0;
        refusals.warned_at = Some(Instant::now());
    }

    /// Keeps the lease and sends this node's reports, until the runtime
    /// stops.
    async fn keep_lease(self: Arc<Self>) {
        loop {
            let now = self.now();
            let Some(step) = self.core().lease_step(now, unix_now()) else {
                return;
            };
            match step {
                LeaseStep::Read => {
                    let answer = self.in_time(self.read_lease()).await;
                    self.answered(answer, None);
                }
                LeaseStep::Write { condition, body } => {
                    let answer = self.in_time(self.write_lease(&condition, &body)).await;
                    self.answered(answer, Some(&body));
                }
                LeaseStep::Wait(until) => {
                    let report_at = self.report().await;
                    let pause = until.min(report_at).saturating_sub(self.now());
                    let _ = tokio::time::timeout(pause, self.wake_reports.notified()).await;
                }
            }
        }
    }

    /// A lease request's answer, or [`LeaseAnswer::Failed`] once it has
    /// taken a renewal period ([`Timing::renew`](crate::fleet::Timing::renew),
    /// 5 s by default, at least 1 s): the holder then reads the lease
    /// before its next write, within its hold, whether or not the store
    /// applied it.
    async fn in_time(
        &self,
        request: impl std::future::Future<Output = LeaseAnswer>,
    ) -> LeaseAnswer {
        let within = self.spec.timing.renew().max(Duration::from_secs(1));
        tokio::time::timeout(within, request)
            .await
            .unwrap_or(LeaseAnswer::Failed)
    }

    /// Gives the prefix's lease up as the gateway stops, if this node
    /// holds it, so that another node (or this one restarted) takes it
    /// over at its next reading instead of after a lease
    /// ([`Election::release`]). This node deletes nothing more; deletions
    /// already sent may still land.
    pub(crate) async fn release(&self) {
        let step = self.core().release(self.now());
        let Some(LeaseStep::Write { condition, body }) = step else {
            return;
        };
        match self.write_lease(&condition, &body).await {
            LeaseAnswer::Written(_) => tracing::info!(
                tier = self.tier,
                "S3 gateway bucket bound: released the prefix's lease as the gateway stops: the next node to read it takes it over at once"
            ),
            _ => tracing::warn!(
                tier = self.tier,
                "S3 gateway bucket bound: the release of the prefix's lease failed as the gateway stops: another node takes it over once it has gone unchanged for lease_seconds"
            ),
        }
        self.changed();
    }

    async fn read_lease(&self) -> LeaseAnswer {
        match self.store.get(&lease_key(), SMALL_BODY).await {
            Ok(Fetched::Absent) => LeaseAnswer::Absent,
            Ok(Fetched::Body(etag, body)) => {
                LeaseAnswer::Found(etag, serde_json::from_slice(&body).ok())
            }
            Ok(Fetched::Oversized(etag)) => LeaseAnswer::Found(etag, None),
            Err(e) => {
                tracing::debug!(tier = self.tier, "S3 gateway bucket bound: lease: {e}");
                LeaseAnswer::Failed
            }
        }
    }

    async fn write_lease(
        &self,
        condition: &crate::fleet::lease::Condition,
        body: &LeaseBody,
    ) -> LeaseAnswer {
        let bytes = serde_json::to_vec(body).unwrap_or_default();
        match self.store.put(&lease_key(), bytes, Some(condition)).await {
            Ok(PutAnswer::Written(etag)) => LeaseAnswer::Written(etag),
            Ok(PutAnswer::Conflict) => LeaseAnswer::Conflict,
            Ok(PutAnswer::Missing) => LeaseAnswer::Absent,
            Ok(PutAnswer::Unsupported) => LeaseAnswer::Failed,
            Err(e) => {
                tracing::debug!(tier = self.tier, "S3 gateway bucket bound: lease: {e}");
                LeaseAnswer::Failed
            }
        }
    }

    /// Applies a lease answer and says when this node took or lost it.
    fn answered(&self, answer: LeaseAnswer, written: Option<&LeaseBody>) {
        let now = self.now();
        let change = self.core().lease_answered(now, answer, written);
        match change {
            LeaseChange::Took => tracing::info!(
                tier = self.tier,
                "S3 gateway bucket bound: this node holds the prefix's lease: it lists and evicts for every node of the prefix"
            ),
            LeaseChange::Lost => tracing::warn!(
                tier = self.tier,
                "S3 gateway bucket bound: this node lost the prefix's lease to another node: it stops evicting"
            ),
            LeaseChange::Kept => {}
        }
        self.changed();
    }

    /// Sends this node's report when one is due (none while it evicts:
    /// what it writes is in its own view); returns when one may next be due.
    async fn report(&self) -> Duration {
        let now = self.now();
        let due = self.core().report_due(now);
        if let Some(body) = due {
            let bytes = serde_json::to_vec(&body).unwrap_or_default();
            let stored = match self.store.put(&report_key(&body.node), bytes, None).await {
                Ok(PutAnswer::Written(_)) => true,
                Ok(_) => false,
                Err(e) => {
                    tracing::debug!(tier = self.tier, "S3 gateway bucket bound: report: {e}");
                    false
                }
            };
            if !stored {
                self.figures().report_failures += 1;
            }
            self.core().reporter.sent(self.now(), &body, stored);
            self.changed();
        }
        self.core().reporter.next_at(self.now())
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
