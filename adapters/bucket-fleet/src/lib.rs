//! The bucket bound for a fleet: the decisions of every gateway that
//! shares one prefix, as pure state machines driven by time and the
//! store's answers (`docs/s3-gateway.md`, "A fleet on one bucket"), and
//! the layout of a bound's prefix they read: its reserved folder
//! ([`RESERVED`]) and the cache identity's segments ([`identity`]). No
//! I/O: the S3 gateway (`lmcache-s3-gateway`) sends the requests these
//! machines ask for and hands them the answers.
//!
//! - [`lease::Election`]: one evictor per prefix, elected through the
//!   store itself. A lease object in the reserved key [`lease_key`] is
//!   created with `If-None-Match: *` and renewed with `If-Match: <etag>`;
//!   only its holder lists and deletes. Ages are measured on each node's
//!   own monotonic clock from the moment it saw the lease's ETag change,
//!   never from a wall clock, so clocks that are minutes apart do not
//!   matter.
//! - [`report::Reporter`]: every node publishes the bytes it wrote in a
//!   small object of its own ([`report_key`]), once a
//!   [`Timing::report`] (or sooner after a fiftieth of the capacity);
//!   the evictor reads them ([`report::Tally`]) instead of every node
//!   listing the bucket.
//! - [`evictor::Evictor`]: the holder's schedule: its listings, its
//!   readings of the reports, and its eviction cycles. The reports only
//!   bring a listing sooner; deletions follow the store's own listings,
//!   the holder's changes since and the growth the listings showed
//!   ([`evictor::Evictor::justified_bytes`]).
//!
//! A store without conditional writes (OpenStack Swift's `s3api` answers
//! them `501`) gets [`Mode::EveryNode`]: every gateway its own evictor, as
//! for a node alone, with an overshoot of about a fiftieth of the capacity
//! per writing node.
//!
//! [`node::Node`] joins one node's machines. The gateway's driver
//! (`bound.rs` of `lmcache-s3-gateway`) and the fleet simulation
//! ([`sim`]; run by `tests/fleet.rs`, `benches/fleet_sim.rs` and
//! `benches/fleet_chaos.rs` of this crate) run
//! that same [`node::Node`], one against the real store, one against a
//! store in memory.

pub mod evictor;
pub mod figures;
pub mod identity;
pub mod lease;
pub mod models;
pub mod node;
pub mod report;
pub mod rule;
pub mod sim;
pub mod sweep;
pub mod view;

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The folder of the bound's own objects inside the tier's prefix:
/// `<prefix>.lmcache-tier/`. No LMCache key starts with it (an LMCache
/// key holds `@`; these do not), so the bound neither counts nor evicts
/// them as cache objects.
pub const RESERVED: &str = ".lmcache-tier/";

/// The lease's key inside the tier's prefix.
pub fn lease_key() -> String {
    format!("{RESERVED}lease")
}

/// The folder of the nodes' reports inside the tier's prefix.
pub fn reports_folder() -> String {
    format!("{RESERVED}reports/")
}

/// The report key of `node` inside the tier's prefix.
pub fn report_key(node: &str) -> String {
    format!("{}{node}", reports_folder())
}

/// The key of the start-up check of conditional writes of `node`, inside
/// the tier's prefix (deleted after the check).
pub fn probe_key(node: &str) -> String {
    format!("{RESERVED}probe-{node}")
}

/// How the nodes of a prefix share the eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// One evictor, elected through the lease; the others report.
    Lease,
    /// The store refuses conditional writes: every node lists and evicts
    /// on its own (a fiftieth of the capacity per writing node may pass
    /// the trigger before a listing shows it).
    EveryNode,
}

/// The bound's periods (`docs/s3-gateway.md`, "A fleet on one bucket");
/// the tier's `bucket_bound` block may set them (seconds), and the
/// gateway's state shows them under the block's keys, in whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timing {
    /// A lease whose ETag a node has seen unchanged this long is taken
    /// over: the longest a prefix goes without an evictor after its holder
    /// stops is this plus [`Timing::follow`]. Default 30 s.
    #[serde(rename = "lease_seconds", with = "whole_seconds")]
    pub lease: Duration,
    /// A node reports what it wrote at least this often while it writes.
    /// Default 60 s.
    #[serde(rename = "report_seconds", with = "whole_seconds")]
    pub report: Duration,
    /// The evictor reads the reports this often. Default 10 s.
    #[serde(rename = "read_reports_seconds", with = "whole_seconds")]
    pub read_reports: Duration,
    /// The evictor lists the whole prefix at least this often (and every
    /// node in [`Mode::EveryNode`]). Default 300 s.
    #[serde(rename = "listing_seconds", with = "whole_seconds")]
    pub listing: Duration,
    /// A multipart upload the evictor has seen this long unfinished is
    /// aborted ([`sweep::Sweep`]). Default 3,600 s.
    #[serde(rename = "abandoned_upload_seconds", with = "whole_seconds")]
    pub abandoned_upload: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            lease: Duration::from_secs(30),
            report: Duration::from_secs(60),
            read_reports: Duration::from_secs(10),
            listing: Duration::from_secs(300),
            abandoned_upload: Duration::from_secs(3600),
        }
    }
}

impl Timing {
    /// The holder renews the lease this often: a sixth of the lease.
    pub fn renew(&self) -> Duration {
        self.lease / 6
    }

    /// The others read the lease this often: a third of the lease.
    pub fn follow(&self) -> Duration {
        self.lease / 3
    }

    /// The holder deletes only within this of sending its last renewal
    /// that the store took: half the lease, so it has stopped deleting
    /// for half a lease when another node may first take over.
    pub fn hold(&self) -> Duration {
        self.lease / 2
    }

    /// How far behind the bucket the evictor's reading of the reports can
    /// be: a report period plus a reading period. The evictor counts the
    /// fleet's write rate over this ahead of what it knows.
    pub fn horizon(&self) -> Duration {
        self.report + self.read_reports
    }
}

/// A [`Duration`] as whole seconds in the gateway's state (the periods are
/// whole seconds, [`rule::timing_of`]).
mod whole_seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmcache_housekeeping::s3_key::parse_s3_key;

    #[test]
    fn the_reserved_keys_never_decode_as_lmcache_objects() {
        for key in [
            lease_key(),
            report_key("0123456789abcdef"),
            probe_key("n"),
            reports_folder(),
        ] {
            assert!(key.starts_with(RESERVED));
            assert!(parse_s3_key(&key).is_err(), "{key}");
        }
    }

    #[test]
    fn the_derived_periods_keep_the_holder_inside_its_lease() {
        let t = Timing::default();
        assert!(t.renew() < t.hold() && t.hold() < t.lease);
        assert!(t.follow() < t.lease);
        assert_eq!(t.horizon(), Duration::from_secs(70));
    }

    #[test]
    fn the_periods_show_as_the_blocks_keys_in_whole_seconds() {
        let json = serde_json::to_value(Timing::default()).unwrap();
        assert_eq!(json["lease_seconds"], 30);
        assert_eq!(json["abandoned_upload_seconds"], 3600);
        let back: Timing = serde_json::from_value(json).unwrap();
        assert_eq!(back, Timing::default());
    }
}
