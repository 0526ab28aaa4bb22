//! The name of every family the node's endpoint registers or encodes
//! itself, spelled once (`docs/metrics.md` lists them): the metrics code
//! registers each by [`FamilyName::name`], and `inspect`, which reads the
//! endpoint's page back, finds its samples by [`FamilyName::sample`]. The
//! per-tier families read from a guard's status or a gateway's state are
//! named in their own tables (`guards.rs`, `gateways.rs`, `bucket.rs`).

/// The prefix of every family, without its `_` separator.
macro_rules! prefix {
    () => {
        "lmcache_tier"
    };
}

/// The group of the housekeeping families (a sub-registry's prefix).
macro_rules! housekeeping {
    () => {
        "housekeeping"
    };
}

/// A [`FamilyName`] from the registered name and the suffix its samples
/// carry (`_bytes`, `_seconds` from the unit, then `_total` on counters,
/// `_info` on info families); `housekeeping` before the name puts it in
/// the housekeeping group.
macro_rules! family {
    (housekeeping $name:literal $suffix:literal) => {
        FamilyName {
            name: $name,
            sample: concat!(prefix!(), "_", housekeeping!(), "_", $name, $suffix),
        }
    };
    ($name:literal $suffix:literal) => {
        FamilyName {
            name: $name,
            sample: concat!(prefix!(), "_", $name, $suffix),
        }
    };
}

/// The prefix of every family (`lmcache_tier`; samples start with
/// `lmcache_tier_`).
pub const PREFIX: &str = prefix!();

/// The prefix of the housekeeping families within [`PREFIX`].
pub(crate) const HOUSEKEEPING: &str = housekeeping!();

/// A family's two spellings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FamilyName {
    /// As registered: without [`PREFIX`] (or [`HOUSEKEEPING`] for the
    /// housekeeping families), the unit's suffix or `_total`.
    pub(crate) name: &'static str,
    /// Its samples' name in a scrape, in both text formats: the prefix,
    /// the name, the unit's suffix and `_total` on a counter (`_info` on an
    /// info family). A histogram's samples add `_bucket`, `_sum` and
    /// `_count` to it.
    pub(crate) sample: &'static str,
}

/// The plan's L1 size, bytes.
pub(crate) const PLAN_L1: FamilyName = family!("plan_l1" "_bytes");
/// The built-in disk tier's capacity, bytes.
pub(crate) const PLAN_DISK_CAPACITY: FamilyName = family!("plan_disk_capacity" "_bytes");
/// The built-in disk tier's I/O workers.
pub(crate) const PLAN_IO_WORKERS: FamilyName = family!("plan_io_workers" "");
/// Whether the built-in disk tier uses O_DIRECT.
pub(crate) const PLAN_ODIRECT: FamilyName = family!("plan_odirect" "");
/// The size of each `raw_block` tier's device, bytes (labels `tier`,
/// `device`).
pub(crate) const PLAN_RAW_BLOCK_DEVICE: FamilyName = family!("plan_raw_block_device" "_bytes");
/// The rule of each number of the plan (an info family).
pub(crate) const PLAN: FamilyName = family!("plan" "_info");

/// 1 while the server answers `/status` healthily.
pub(crate) const SERVER_UP: FamilyName = family!("server_up" "");
/// Starts of the server (a counter).
pub(crate) const SERVER_STARTS: FamilyName = family!("server_starts" "_total");
/// Restarts of the server (a counter).
pub(crate) const SERVER_RESTARTS: FamilyName = family!("server_restarts" "_total");
/// Ends of the server process by cause (a counter).
pub(crate) const SERVER_EXITS: FamilyName = family!("server_exits" "_total");
/// The server's liveness state.
pub(crate) const SERVER_LIVENESS: FamilyName = family!("server_liveness" "");
/// Engine workers attached.
pub(crate) const ENGINE_WORKERS: FamilyName = family!("engine_workers" "");
/// Engine workers lost by cause (a counter).
pub(crate) const ENGINE_WORKERS_LOST: FamilyName = family!("engine_workers_lost" "_total");
/// Engine workers that unregistered (a counter).
pub(crate) const ENGINE_WORKERS_DETACHED: FamilyName = family!("engine_workers_detached" "_total");
/// Seconds from the last start to the first healthy `/status`.
pub(crate) const SERVER_READY: FamilyName = family!("server_ready" "_seconds");

/// Entries housekeeping deleted, by reason (a counter).
pub(crate) const HOUSEKEEPING_DELETED_OBJECTS: FamilyName =
    family!(housekeeping "deleted_objects" "_total");
/// Bytes housekeeping deleted, by reason (a counter).
pub(crate) const HOUSEKEEPING_DELETED: FamilyName = family!(housekeeping "deleted" "_bytes_total");
/// Cache objects housekeeping kept.
pub(crate) const HOUSEKEEPING_KEPT_OBJECTS: FamilyName = family!(housekeeping "kept_objects" "");
/// Bytes of the cache objects housekeeping kept.
pub(crate) const HOUSEKEEPING_KEPT: FamilyName = family!(housekeeping "kept" "_bytes");
/// Foreign entries of the tier directory.
pub(crate) const HOUSEKEEPING_FOREIGN_ENTRIES: FamilyName =
    family!(housekeeping "foreign_entries" "");
/// How long the last housekeeping took, seconds.
pub(crate) const HOUSEKEEPING_DURATION: FamilyName = family!(housekeeping "duration" "_seconds");
/// When the last housekeeping ended, Unix seconds.
pub(crate) const HOUSEKEEPING_LAST_RUN: FamilyName =
    family!(housekeeping "last_run_timestamp" "_seconds");
/// 1 after a purge of most of the tier by launch identity.
pub(crate) const HOUSEKEEPING_IDENTITY_PURGE: FamilyName =
    family!(housekeeping "identity_purge" "");
/// The identity fields that differed in that purge.
pub(crate) const HOUSEKEEPING_IDENTITY_CHANGE: FamilyName =
    family!(housekeeping "identity_change" "");

/// One series per capacity guard: how it follows its tier.
pub(crate) const GUARD_INFO: FamilyName = family!("guard_info" "");
/// A guard's event lag, seconds.
pub(crate) const GUARD_EVENT_LAG: FamilyName = family!("guard_event_lag" "_seconds");

/// Gateway requests by method (a counter).
pub(crate) const GATEWAY_REQUESTS: FamilyName = family!("gateway_requests" "_total");
/// Gateway answers by status class (a counter).
pub(crate) const GATEWAY_RESPONSES: FamilyName = family!("gateway_responses" "_total");
/// Uploads their client ended, by reason (a counter).
pub(crate) const GATEWAY_CLIENT_UPLOAD_FAILURES: FamilyName =
    family!("gateway_client_upload_failures" "_total");
/// Requests the gateway refused with 403, by reason (a counter).
pub(crate) const GATEWAY_REJECTED: FamilyName = family!("gateway_rejected" "_total");
/// The gateway's answer durations (a histogram), seconds.
pub(crate) const GATEWAY_ANSWER_DURATION: FamilyName =
    family!("gateway_answer_duration" "_seconds");
/// When a gateway's real credentials expire, Unix seconds.
pub(crate) const GATEWAY_CREDENTIAL_EXPIRY: FamilyName =
    family!("gateway_credential_expiry_timestamp" "_seconds");
/// One series per gateway: its bucket and credential source.
pub(crate) const GATEWAY_INFO: FamilyName = family!("gateway_info" "");
/// How long a bucket bound's last listing took, seconds.
pub(crate) const GATEWAY_BUCKET_LAST_LISTING_DURATION: FamilyName =
    family!("gateway_bucket_last_listing_duration" "_seconds");
/// How long a bucket bound's lease has gone unchanged as its node sees it,
/// seconds.
pub(crate) const GATEWAY_BUCKET_LEASE_UNCHANGED: FamilyName =
    family!("gateway_bucket_lease_unchanged" "_seconds");
/// How long a bucket bound's node has seen no evictor make progress,
/// seconds.
pub(crate) const GATEWAY_BUCKET_NO_EVICTOR: FamilyName =
    family!("gateway_bucket_no_evictor" "_seconds");
/// A bucket bound's lease period, seconds.
pub(crate) const GATEWAY_BUCKET_LEASE_PERIOD: FamilyName =
    family!("gateway_bucket_lease_period" "_seconds");
/// The fleet's write rate as a bucket bound's evictor sees it, bytes a
/// second.
pub(crate) const GATEWAY_BUCKET_FLEET_WRITE_RATE: FamilyName =
    family!("gateway_bucket_fleet_write_bytes_per_second" "");

/// Connections the endpoint closed before their client did (a counter).
pub(crate) const ENDPOINT_CLOSED_CONNECTIONS: FamilyName =
    family!("metrics_endpoint_closed_connections" "_total");
/// Connections the endpoint holds open now, by state.
pub(crate) const ENDPOINT_CONNECTIONS: FamilyName = family!("metrics_endpoint_connections" "");

#[cfg(test)]
mod tests {
    use super::super::test_support::purged_by_identity;
    use super::super::Format;
    use super::*;

    /// Every family a launch registers, after a housekeeping that purged
    /// by identity (so each labelled family has a series).
    const REGISTERED: [FamilyName; 23] = [
        PLAN_L1,
        PLAN_DISK_CAPACITY,
        PLAN_IO_WORKERS,
        PLAN_ODIRECT,
        PLAN,
        SERVER_UP,
        SERVER_STARTS,
        SERVER_RESTARTS,
        SERVER_EXITS,
        SERVER_LIVENESS,
        ENGINE_WORKERS,
        ENGINE_WORKERS_LOST,
        ENGINE_WORKERS_DETACHED,
        SERVER_READY,
        HOUSEKEEPING_DELETED_OBJECTS,
        HOUSEKEEPING_DELETED,
        HOUSEKEEPING_KEPT_OBJECTS,
        HOUSEKEEPING_KEPT,
        HOUSEKEEPING_FOREIGN_ENTRIES,
        HOUSEKEEPING_DURATION,
        HOUSEKEEPING_LAST_RUN,
        HOUSEKEEPING_IDENTITY_PURGE,
        HOUSEKEEPING_IDENTITY_CHANGE,
    ];

    #[test]
    fn each_registered_family_has_samples_under_its_sample_name() {
        let metrics = purged_by_identity();
        for format in [Format::OpenMetrics, Format::Prometheus] {
            let page = metrics.render(format).unwrap();
            for family in REGISTERED {
                let sampled = page.lines().any(|line| {
                    line.strip_prefix(family.sample)
                        .is_some_and(|rest| rest.starts_with([' ', '{']))
                });
                assert!(sampled, "{format:?}: no {} in\n{page}", family.sample);
            }
        }
    }
}
