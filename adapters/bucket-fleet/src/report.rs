//! What each node wrote, told to the evictor through the store
//! (`docs/s3-gateway.md`, "A fleet on one bucket").
//!
//! A node that is not the evictor keeps no view of the bucket: it counts
//! the bytes of the LMCache objects it stores and PUTs its count in its
//! own report object ([`super::report_key`]) once a [`Timing::report`]
//! while it writes, or sooner once it wrote [`REPORT_SHARE`] of the
//! capacity since its last report (at most once a [`MIN_REPORT_GAP`]).
//! The evictor reads the reports ([`Tally`]): what they add since its last
//! listing is counted on top of the listing, and their sum over time is
//! the fleet's write rate.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Timing;

/// A node reports early once it wrote 1/50 of the capacity since its last
/// report.
pub const REPORT_SHARE: u64 = 50;
/// The shortest time between two reports of one node.
pub const MIN_REPORT_GAP: Duration = Duration::from_secs(1);
/// A report unchanged this long is a node that left: the evictor deletes
/// it and forgets the node.
pub const STALE_REPORT: Duration = Duration::from_secs(3600);
/// The most reports one reading GETs; the others wait for the next
/// reading (a fleet of 1,000 nodes changes about 170 a reading).
pub const MAX_REPORTS_READ: usize = 1000;
/// The most nodes a tally follows. Any writer of the prefix can create
/// report keys, so the tally's memory is bounded by this, not by the keys
/// in the store ([`MAX_REPORT_KEYS`] caps a reading's listing too): past
/// it, a new node's report is not read until a followed one goes stale.
/// Its writes then bring no listing sooner; the periodic listing still
/// counts them.
pub const MAX_REPORTERS: usize = 10_000;
/// The most keys a reading lists of the reports' folder: the first
/// [`MAX_REPORTERS`] in key order (ten pages of 1,000). A reading holds at
/// most these, whatever the folder holds; a folder filled with more by
/// another writer can hide a node's report from the evictor, which then
/// counts its writes at the next periodic listing.
pub const MAX_REPORT_KEYS: usize = MAX_REPORTERS;

/// One node's report (JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportBody {
    /// The node's id (16 hex digits).
    pub node: String,
    /// Bytes of LMCache objects it stored since its start.
    pub written_bytes: u64,
    /// Of those, the bytes stored since its previous report.
    pub recent_bytes: u64,
    /// Reports it sent before this one.
    pub reports: u64,
    /// The models whose objects it counts (`docs/s3-gateway.md`, "The
    /// bucket bound"): the evictor counts them too.
    #[serde(default)]
    pub models: Vec<String>,
}

/// A node's count of what it wrote, and when to report it.
#[derive(Debug, Clone)]
pub struct Reporter {
    node: String,
    every: Duration,
    share_bytes: u64,
    written: u64,
    unreported: u64,
    last_sent: Option<Duration>,
    reports: u64,
}

impl Reporter {
    /// The reporter of `node` on a capacity of `capacity_bytes`.
    pub fn new(node: String, timing: &Timing, capacity_bytes: u64) -> Self {
        Reporter {
            node,
            every: timing.report,
            share_bytes: (capacity_bytes / REPORT_SHARE).max(1),
            written: 0,
            unreported: 0,
            last_sent: None,
            reports: 0,
        }
    }

    /// This node stored an LMCache object of `bytes`.
    pub fn written(&mut self, bytes: u64) {
        self.written = self.written.saturating_add(bytes);
        self.unreported = self.unreported.saturating_add(bytes);
    }

    /// This node is the evictor: what it wrote is in its own view, so
    /// there is nothing to report.
    pub fn absorb(&mut self) {
        self.unreported = 0;
    }

    /// Reports sent.
    pub fn reports(&self) -> u64 {
        self.reports
    }

    /// The report to send at `now`, if one is due: something is
    /// unreported and a [`Timing::report`] has passed, or a share of the
    /// capacity is unreported and [`MIN_REPORT_GAP`] has passed.
    pub fn due(&self, now: Duration) -> Option<ReportBody> {
        if self.unreported == 0 {
            return None;
        }
        let since = self
            .last_sent
            .map_or(Duration::MAX, |t| now.saturating_sub(t));
        let due =
            since >= self.every || (self.unreported >= self.share_bytes && since >= MIN_REPORT_GAP);
        due.then(|| ReportBody {
            node: self.node.clone(),
            written_bytes: self.written,
            recent_bytes: self.unreported,
            reports: self.reports,
            models: Vec::new(),
        })
    }

    /// When the next report may be due, from `now` (the driver also wakes
    /// on a write).
    pub fn next_at(&self, now: Duration) -> Duration {
        if self.unreported == 0 {
            return now + self.every;
        }
        self.last_sent.map_or(now, |t| t + self.every).max(now)
    }

    /// `body` was sent at `now`; `stored` tells whether the store took it
    /// (a report that failed is sent again, whole, at the next period).
    pub fn sent(&mut self, now: Duration, body: &ReportBody, stored: bool) {
        self.last_sent = Some(now);
        if stored {
            self.reports += 1;
            self.unreported = self.unreported.saturating_sub(body.recent_bytes);
        }
    }
}

/// A node's report as the evictor last read it.
#[derive(Debug, Clone)]
struct Seen {
    etag: Option<String>,
    written_bytes: u64,
    reports: u64,
    changed_at: Duration,
    read_at: Duration,
}

/// The evictor's reading of the reports.
///
/// A report is untrusted input: any process that can write the prefix can
/// write one. What the reports add only brings a listing sooner
/// ([`super::evictor::Evictor`]); no deletion follows from them alone.
/// One that adds more than the capacity in one reading is absurd (no node
/// writes a whole bound between two readings without the listing showing
/// it): it adds the capacity and its node is named once
/// ([`Tally::absurd`]).
#[derive(Debug, Clone, Default)]
pub struct Tally {
    capacity_bytes: u64,
    absurd: Vec<(String, u64)>,
    named: std::collections::HashSet<String>,
    seen: HashMap<String, Seen>,
    unlisted_bytes: u64,
    /// What the reports had added when the listing in flight began: added
    /// back if it fails.
    before_listing: u64,
    window: VecDeque<(Duration, u64)>,
    /// Whether a first reading is in: the reports of that reading were
    /// written before the evictor's first listing, which holds their bytes.
    primed: bool,
}

impl Tally {
    /// The tally of a bound of `capacity_bytes`.
    pub fn new(capacity_bytes: u64) -> Self {
        Tally {
            capacity_bytes,
            ..Tally::default()
        }
    }

    /// The nodes whose reports were absurd since the last call, each with
    /// the bytes its report claimed in one reading; each node once per
    /// tally.
    pub fn absurd(&mut self) -> Vec<(String, u64)> {
        std::mem::take(&mut self.absurd)
    }

    /// A whole reading of the reports ended. The first one after this
    /// evictor started is its baseline: it adds nothing and no rate (what
    /// the reports say was written before then is in the listing that
    /// came just before), so a new evictor does not count the fleet's
    /// last reports twice.
    pub fn reading_done(&mut self) {
        self.primed = true;
    }

    /// A listing begins: what the reports add from now on is on top of it.
    /// What a node wrote between its last report and the listing's start
    /// is then counted twice (in the listing and in its next report) until
    /// the next listing: more than the bucket holds, never less.
    pub fn listing_began(&mut self) {
        self.before_listing = std::mem::take(&mut self.unlisted_bytes);
    }

    /// The listing in flight failed: what the reports added before it
    /// began is unlisted still, and counts again.
    pub fn listing_failed(&mut self) {
        let before = std::mem::take(&mut self.before_listing);
        self.unlisted_bytes = self.unlisted_bytes.saturating_add(before);
    }

    /// The listing in flight is in: it holds what the reports had added
    /// before it began.
    pub fn listing_done(&mut self) {
        self.before_listing = 0;
    }

    /// Bytes the reports say were written since the last listing began.
    pub fn unlisted_bytes(&self) -> u64 {
        self.unlisted_bytes
    }

    /// Nodes whose reports are known.
    pub fn reporters(&self) -> usize {
        self.seen.len()
    }

    /// Of the reports listed as (node, ETag), those to read: new ones and
    /// those whose ETag changed (all of them when the store lists no
    /// ETag, as s3s-fs), at most [`MAX_REPORTS_READ`]: new ones first,
    /// then those read longest ago, so that every report is read within
    /// a few readings however many changed. New nodes only up to
    /// [`MAX_REPORTERS`] followed in all.
    pub fn to_read<'a>(&self, listed: &'a [(String, Option<String>)]) -> Vec<&'a str> {
        let mut room = MAX_REPORTERS.saturating_sub(self.seen.len());
        let mut wanted: Vec<(Option<Duration>, &str)> = listed
            .iter()
            .filter(|(node, etag)| match self.seen.get(node) {
                Some(s) => etag.is_none() || s.etag != *etag,
                None if room > 0 => {
                    room -= 1;
                    true
                }
                None => false,
            })
            .map(|(node, _)| (self.seen.get(node).map(|s| s.read_at), node.as_str()))
            .collect();
        wanted.sort();
        wanted
            .into_iter()
            .take(MAX_REPORTS_READ)
            .map(|(_, node)| node)
            .collect()
    }

    /// The report of `body.node` (the node its key names; ETag `etag`)
    /// read at `now`: the bytes it adds since the last reading, at most
    /// the capacity. A node seen for the first time, or restarted (a count
    /// of bytes or of reports below the last: a node keeps its id across a
    /// restart, its counts start again), adds its `recent_bytes`.
    /// A new node past [`MAX_REPORTERS`] is not followed.
    pub fn read(&mut self, now: Duration, etag: Option<String>, body: &ReportBody) {
        if self.seen.len() >= MAX_REPORTERS && !self.seen.contains_key(&body.node) {
            return;
        }
        let claimed = match self.seen.get(&body.node) {
            Some(s) if s.written_bytes <= body.written_bytes && s.reports <= body.reports => {
                body.written_bytes - s.written_bytes
            }
            _ if !self.primed => 0,
            _ => body.recent_bytes,
        };
        let added = claimed.min(self.capacity_bytes.max(1));
        if added < claimed && self.named.insert(body.node.clone()) {
            self.absurd.push((body.node.clone(), claimed));
        }
        let changed_at = match self.seen.get(&body.node) {
            Some(s) if added == 0 && s.etag == etag => s.changed_at,
            _ => now,
        };
        self.seen.insert(
            body.node.clone(),
            Seen {
                etag,
                written_bytes: body.written_bytes,
                reports: body.reports,
                changed_at,
                read_at: now,
            },
        );
        self.unlisted_bytes = self.unlisted_bytes.saturating_add(added);
        if added > 0 {
            self.window.push_back((now, added));
        }
    }

    /// The fleet's write rate at `now`, bytes a second: what the reports
    /// added over the last `window`, over the whole window (a first
    /// reading of a node adds what it wrote over up to a report period, so
    /// a shorter span would overstate the rate after a takeover).
    pub fn rate(&mut self, now: Duration, window: Duration) -> u64 {
        while self
            .window
            .front()
            .is_some_and(|(t, _)| now.saturating_sub(*t) > window)
        {
            self.window.pop_front();
        }
        let bytes = self
            .window
            .iter()
            .fold(0u64, |sum, (_, b)| sum.saturating_add(*b));
        (bytes as f64 / window.max(Duration::from_secs(1)).as_secs_f64()) as u64
    }

    /// Nodes whose report has not changed for [`STALE_REPORT`] at `now`:
    /// forgotten here, their reports to delete.
    pub fn stale(&mut self, now: Duration) -> Vec<String> {
        let stale: Vec<String> = self
            .seen
            .iter()
            .filter(|(_, s)| now.saturating_sub(s.changed_at) >= STALE_REPORT)
            .map(|(node, _)| node.clone())
            .collect();
        for node in &stale {
            self.seen.remove(node);
            self.named.remove(node);
        }
        stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_node_reports_once_a_period_or_after_a_share_of_the_capacity() {
        let timing = Timing::default();
        let mut r = Reporter::new("n".into(), &timing, 5000);
        assert_eq!(r.due(Duration::ZERO), None);
        r.written(10);
        let first = r.due(Duration::ZERO).unwrap();
        assert_eq!((first.written_bytes, first.recent_bytes), (10, 10));
        r.sent(Duration::ZERO, &first, true);
        r.written(50);
        assert_eq!(r.due(30 * S), None);
        r.written(50);
        assert_eq!(r.due(Duration::from_millis(500)), None);
        let early = r.due(2 * S).unwrap();
        assert_eq!((early.written_bytes, early.recent_bytes), (110, 100));
        r.sent(2 * S, &early, false);
        assert_eq!(r.due(2 * S + S / 2), None);
        assert_eq!(r.due(62 * S).unwrap().recent_bytes, 100);
    }

    #[test]
    fn the_tally_adds_what_each_report_adds_and_a_restart_its_recent_bytes() {
        let mut t = Tally::new(5000);
        let body = |node: &str, written, recent| ReportBody {
            node: node.into(),
            written_bytes: written,
            recent_bytes: recent,
            reports: 0,
            models: Vec::new(),
        };
        t.read(Duration::ZERO, Some("0".into()), &body("z", 70, 70));
        t.reading_done();
        assert_eq!(t.unlisted_bytes(), 0, "the first reading is the baseline");
        t.read(Duration::ZERO, Some("1".into()), &body("a", 1000, 10));
        t.read(Duration::ZERO, Some("1".into()), &body("b", 5, 5));
        assert_eq!(t.unlisted_bytes(), 15);
        t.read(10 * S, Some("2".into()), &body("a", 1030, 30));
        assert_eq!(t.unlisted_bytes(), 45);
        t.read(20 * S, Some("3".into()), &body("a", 7, 7));
        assert_eq!(t.unlisted_bytes(), 52);
        t.listing_began();
        assert_eq!(t.unlisted_bytes(), 0);
        assert_eq!(t.rate(20 * S, 20 * S), 52 / 20);
        assert_eq!(t.rate(31 * S, 25 * S), 37 / 25);
        let listed = vec![
            ("a".to_string(), Some("3".to_string())),
            ("b".to_string(), Some("9".to_string())),
            ("c".to_string(), None),
        ];
        assert_eq!(t.to_read(&listed), ["c", "b"], "new ones first");
        let mut stale = t.stale(3600 * S);
        stale.sort();
        assert_eq!(stale, ["b", "z"]);
        assert_eq!(t.reporters(), 1);
        assert!(t.absurd().is_empty());
    }

    fn report(node: &str, written: u64) -> ReportBody {
        ReportBody {
            node: node.into(),
            written_bytes: written,
            recent_bytes: written,
            reports: 0,
            models: Vec::new(),
        }
    }

    #[test]
    fn a_node_back_with_its_id_is_a_restart_by_its_count_of_reports() {
        let mut t = Tally::new(5000);
        t.reading_done();
        let before = ReportBody {
            reports: 3,
            recent_bytes: 0,
            ..report("n", 100)
        };
        t.read(S, None, &before);
        let unlisted = t.unlisted_bytes();
        t.read(2 * S, None, &report("n", 900));
        assert_eq!(
            t.unlisted_bytes() - unlisted,
            900,
            "more bytes than before, but its first report: all recent"
        );
    }

    #[test]
    fn what_the_reports_added_before_a_failed_listing_counts_again() {
        let mut t = Tally::new(5000);
        t.read(Duration::ZERO, None, &report("a", 0));
        t.reading_done();
        t.read(S, None, &report("a", 300));
        t.listing_began();
        t.read(2 * S, None, &report("a", 350));
        assert_eq!(t.unlisted_bytes(), 50);
        t.listing_failed();
        assert_eq!(
            t.unlisted_bytes(),
            350,
            "the failed listing holds none of it"
        );
        t.listing_began();
        t.listing_failed();
        assert_eq!(t.unlisted_bytes(), 350, "nor does the next that fails");
        t.listing_began();
        t.read(3 * S, None, &report("a", 360));
        t.listing_done();
        t.listing_failed();
        assert_eq!(t.unlisted_bytes(), 10, "a listing that is in holds it");
    }

    #[test]
    fn a_tally_follows_at_most_its_number_of_nodes_whatever_the_store_holds() {
        let mut t = Tally::new(5000);
        t.reading_done();
        for i in 0..MAX_REPORTERS {
            t.read(S, None, &report(&format!("n{i}"), 1));
        }
        let listed = vec![
            ("n0".to_string(), None),
            ("x1".to_string(), None),
            ("x2".to_string(), None),
        ];
        assert_eq!(t.to_read(&listed), ["n0"], "no room for new nodes");
        let before = t.unlisted_bytes();
        t.read(2 * S, None, &report("x1", 4000));
        assert_eq!((t.reporters(), t.unlisted_bytes()), (MAX_REPORTERS, before));
        t.read(3 * S, None, &report("n0", 9000));
        assert_eq!(t.absurd().len(), 1);
        assert_eq!(t.stale(3603 * S).len(), MAX_REPORTERS);
        assert!(t.named.is_empty(), "a stale node is forgotten whole");
        assert_eq!(t.to_read(&listed).len(), 3);
    }

    #[test]
    fn an_absurd_report_adds_the_capacity_and_its_node_is_named_once() {
        let mut t = Tally::new(1000);
        let body = |node: &str, written: u64| ReportBody {
            node: node.into(),
            written_bytes: written,
            recent_bytes: written,
            reports: 0,
            models: Vec::new(),
        };
        t.reading_done();
        for (i, claimed) in [u64::MAX, 10u64.pow(15), 1001].into_iter().enumerate() {
            let before = t.unlisted_bytes();
            let node = format!("liar{i}");
            t.read(S, Some("1".into()), &body(&node, claimed));
            assert_eq!(t.unlisted_bytes() - before, 1000, "{claimed}");
            assert_eq!(t.absurd(), [(node.clone(), claimed)]);
            t.read(2 * S, Some("2".into()), &body(&node, 0));
            t.read(3 * S, Some("3".into()), &body(&node, claimed));
            assert!(t.absurd().is_empty(), "{node} named once");
        }
        t.read(S, Some("1".into()), &body("honest", 1000));
        assert!(t.absurd().is_empty());
        let many: Vec<(String, Option<String>)> = (0..MAX_REPORTS_READ + 5)
            .map(|i| (format!("n{i:04}"), None))
            .collect();
        let first = t.to_read(&many);
        assert_eq!(first.len(), MAX_REPORTS_READ);
        for node in &first {
            t.read(4 * S, None, &body(node, 1));
        }
        let next = t.to_read(&many);
        assert_eq!(&next[..5], ["n1000", "n1001", "n1002", "n1003", "n1004"]);
    }
}
