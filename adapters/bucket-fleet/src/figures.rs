//! The bucket bound's figures as one node sees them: what the gateway's
//! state (`inspect`) and the metrics show (`docs/inspect.md`,
//! `docs/metrics.md`).

use serde::{Deserialize, Serialize};

use super::lease::ElectionFigures;
use super::rule::BoundSpec;
use super::view::IdentityUsage;
use super::Mode;

/// The bound's figures, in the gateway's state (its `bucket_bound`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundState {
    /// The bound's numbers.
    pub spec: BoundSpec,
    /// How the fleet shares the eviction: `lease` (one evictor) or
    /// `every_node` (the store takes no conditional writes).
    pub mode: Mode,
    /// This node's id in the lease and the reports (kept across restarts
    /// of one boot where the gateway has a directory for it).
    pub node: String,
    /// Whether this node holds the lease and may delete now.
    pub evictor: bool,
    /// The lease's holder as last seen (this node's id when it holds it);
    /// empty when none is known.
    pub lease_holder: String,
    /// When that holder took the lease, by its clock (Unix seconds).
    pub lease_holder_since_unix: u64,
    /// The lease's own figures (taken, lost, reads, writes, failures).
    pub lease: ElectionFigures,
    /// How long the lease has gone unchanged as this node sees it,
    /// milliseconds ([`Election::unchanged_for`](super::lease::Election::unchanged_for)); `None` in
    /// [`Mode::EveryNode`] and before the first reading. Past the lease
    /// period plus a third of it, the prefix has no evictor.
    pub lease_unchanged_millis: Option<u64>,
    /// Reports this node sent.
    pub reports_sent: u64,
    /// Reports that failed.
    pub report_failures: u64,
    /// Reports the evictor read (this node, while it held the lease).
    pub reports_read: u64,
    /// Nodes whose reports the evictor reads.
    pub reporters: u64,
    /// The fleet's write rate as the evictor sees it, bytes a second.
    pub fleet_write_bytes_per_s: u64,
    /// Bytes of LMCache objects under the prefix: for the evictor its
    /// view (the last listing, its changes since, what the reports add);
    /// for another node what the holder last published.
    pub usage_bytes: u64,
    /// LMCache objects under the prefix, counted as `usage_bytes`.
    pub objects: u64,
    /// Listings done (each of one or more ListObjectsV2 pages).
    pub listings: u64,
    /// ListObjectsV2 requests sent, all listings together (the reports'
    /// folder included).
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
    /// Deletions that failed (the next cycle waits, backing off).
    pub eviction_failures: u64,
    /// Listings of the unfinished multipart uploads under the prefix
    /// (`docs/s3-gateway.md`, "Uploads left behind").
    pub upload_listings: u64,
    /// Uploads left behind that this node aborted.
    pub uploads_aborted: u64,
    /// Aborts that failed (tried again at the next sweep).
    pub upload_abort_failures: u64,
    /// The models whose objects the bound counts
    /// ([`Models`](super::models::Models)).
    #[serde(default)]
    pub models: Vec<String>,
    /// The LMCache objects under the prefix by cache identity
    /// ([`IdentityUsage`]: tag, objects, bytes), from this node's view:
    /// the whole prefix on the evictor (or on every node in `every_node`),
    /// empty on another node (`docs/s3-gateway.md`, "The cache identity in
    /// a bucket").
    #[serde(default)]
    pub identities: Vec<IdentityUsage>,
    /// Keys under the prefix the last listing did not count: not LMCache's,
    /// of a model not counted, or not decodable.
    #[serde(default)]
    pub listing_skipped: u64,
    /// Objects the last listing gave a size past any real object's (5 TiB):
    /// the store's fault, neither counted nor evicted.
    #[serde(default)]
    pub oversized_objects: u64,
    /// Nodes whose report claimed more than the capacity written since
    /// the evictor's last reading ([`Tally`](super::report::Tally)), each
    /// counted once while this node evicts: the report counts as the
    /// capacity, and the node is named once in the log.
    #[serde(default)]
    pub absurd_reports: u64,
    /// How long this node has seen no evictor make progress, milliseconds
    /// ([`Election::no_evictor_for`](super::lease::Election::no_evictor_for));
    /// `None` in [`Mode::EveryNode`]. Past twice the lease the log says
    /// so and the alert `LMCacheBucketWithoutEvictor` fires.
    #[serde(default)]
    pub no_evictor_millis: Option<u64>,
}

impl BoundState {
    /// The figures of node `node` before its first listing or lease
    /// reading: all counts zero, not the evictor.
    pub fn new(spec: BoundSpec, mode: Mode, node: String) -> Self {
        BoundState {
            spec,
            mode,
            node,
            evictor: false,
            lease_holder: String::new(),
            lease_holder_since_unix: 0,
            lease: ElectionFigures::default(),
            lease_unchanged_millis: None,
            reports_sent: 0,
            report_failures: 0,
            reports_read: 0,
            reporters: 0,
            fleet_write_bytes_per_s: 0,
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
            upload_listings: 0,
            uploads_aborted: 0,
            upload_abort_failures: 0,
            models: Vec::new(),
            identities: Vec::new(),
            listing_skipped: 0,
            oversized_objects: 0,
            absurd_reports: 0,
            no_evictor_millis: None,
        }
    }
}
