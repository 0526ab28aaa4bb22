//! The evictor's schedule: when the node that may delete lists the
//! prefix, reads the reports and evicts (`docs/s3-gateway.md`, "A fleet
//! on one bucket").
//!
//! In [`Mode::Lease`] only the lease's holder runs it. It lists the whole
//! prefix when it takes the lease and then once a [`Timing::listing`];
//! it reads the reports once a [`Timing::read_reports`]. The reports are
//! untrusted ([`Tally`]): when what they add on top of the listing
//! ([`Evictor::known_bytes`]) reaches the trigger, the evictor lists
//! again (at most once a reading period, and once per
//! [`RELIST_GAP_LISTINGS`] listing lengths); it evicts only on what the
//! store's own listings show ([`Evictor::justified_bytes`]: the last
//! listing, its own changes since, and the growth the last two listings
//! showed, as a rate, over [`Timing::horizon`]). In
//! [`Mode::EveryNode`] every node runs it on its own view, listing after
//! writing a fiftieth of the capacity (at most once a
//! [`MIN_LISTING_GAP`]) or once a [`Timing::listing`].
//!
//! Deletions that fail are not sent again at once: after a cycle that
//! deleted nothing, the next waits [`EVICT_BACKOFF`], doubled at each such
//! cycle up to [`MAX_EVICT_BACKOFF`], each pause drawn between half of
//! that and all of it, so that nodes refused together do not come back
//! together. A cycle that deleted some (a store that fails a share of its
//! requests) is followed by the next at once.

use std::time::Duration;

use super::report::{ReportBody, Tally};
use super::rule::{BoundSpec, MIN_LISTING_GAP};
use super::view::{BucketView, Entry, StoredObject};
use super::{Mode, Timing};

/// The pause after an eviction cycle with a failed deletion.
pub const EVICT_BACKOFF: Duration = Duration::from_secs(1);
/// The longest pause between two eviction cycles that fail.
pub const MAX_EVICT_BACKOFF: Duration = Duration::from_secs(60);
/// The longest pause between two tries of a listing that fails.
pub const LISTING_RETRY: Duration = Duration::from_secs(10);
/// With a lease, a listing the reports bring (or a starved evictor's)
/// starts at least this many times the last listing's length after that
/// listing began, so that such listings take at most a fifth of the
/// evictor's time: a bucket of 10^6 objects lists in about 1,000 pages.
pub const RELIST_GAP_LISTINGS: u32 = 5;

/// Deletions of one eviction cycle in flight at once, in either driver.
pub const DELETES_IN_FLIGHT: usize = 8;

/// One eviction cycle's deletions, as every driver sends them
/// (`docs/s3-gateway.md`, "Eviction cycles on a failing store"): the
/// victims in their order, [`DELETES_IN_FLIGHT`] in flight, a new one as
/// each answer comes, none once the store has failed more of them than it
/// took. The driver sends what [`EvictCycle::send`] gives, tells each
/// answer to [`EvictCycle::answered`], and hands
/// [`EvictCycle::results`] to [`Evictor::evicted`] when
/// [`EvictCycle::send`] gives nothing and no answer is awaited.
#[derive(Debug, Clone, Default)]
pub struct EvictCycle {
    left: std::collections::VecDeque<(String, u64)>,
    in_flight: usize,
    deleted: u64,
    failed: u64,
    results: Vec<(String, u64, bool)>,
}

impl EvictCycle {
    /// The cycle of `victims` (key inside the prefix, bytes), in the order
    /// [`EvictStep::Evict`] gave them.
    pub fn new(victims: Vec<(String, u64)>) -> Self {
        EvictCycle {
            left: victims.into(),
            ..EvictCycle::default()
        }
    }

    /// The next deletion to send now: `None` while [`DELETES_IN_FLIGHT`]
    /// are in flight, when none is left, or once more answers have failed
    /// than succeeded (then none is sent again).
    pub fn send(&mut self) -> Option<(String, u64)> {
        if self.failed > self.deleted {
            self.left.clear();
        }
        if self.in_flight >= DELETES_IN_FLIGHT {
            return None;
        }
        let next = self.left.pop_front()?;
        self.in_flight += 1;
        Some(next)
    }

    /// The answer to the deletion of `key` (`bytes`) came: `deleted`
    /// when the store took it.
    pub fn answered(&mut self, key: String, bytes: u64, deleted: bool) {
        self.in_flight = self.in_flight.saturating_sub(1);
        match deleted {
            true => self.deleted += 1,
            false => self.failed += 1,
        }
        self.results.push((key, bytes, deleted));
    }

    /// Each deletion sent, in the order of its answer: key, bytes and
    /// whether the store took it.
    pub fn results(self) -> Vec<(String, u64, bool)> {
        self.results
    }
}

/// What the evictor asks of the store next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictStep {
    /// List the whole prefix.
    List,
    /// List the reports' folder and read the reports [`Evictor::to_read`]
    /// picks.
    ReadReports,
    /// Delete these objects (key inside the prefix, bytes).
    Evict(Vec<(String, u64)>),
    /// Delete the reports of these nodes (they left).
    DeleteReports(Vec<String>),
    /// Nothing until this time, unless woken.
    Wait(Duration),
}

/// One node's evictor.
#[derive(Debug)]
pub struct Evictor {
    spec: BoundSpec,
    mode: Mode,
    view: BucketView,
    tally: Tally,
    active: bool,
    listed: bool,
    last_listing: Option<Duration>,
    list_after: Duration,
    list_retry: Duration,
    last_read: Option<Duration>,
    evict_after: Duration,
    evict_backoff: Duration,
    jitter: u64,
    relist: bool,
    /// When the listing in flight began, and the one before it.
    listing_began: Option<Duration>,
    previous_began: Option<Duration>,
    /// The growth the last two listings showed, bytes a second.
    listed_rate: u64,
    /// How long the last listing that came in took.
    listing_took: Duration,
}

impl Evictor {
    /// The evictor of `spec` in `mode`, at `now`; `seed` draws its
    /// backoff's jitter (the node's own, so that nodes differ).
    pub fn new(spec: BoundSpec, mode: Mode, now: Duration, seed: u64) -> Self {
        Evictor {
            spec,
            mode,
            view: BucketView::default(),
            tally: Tally::new(spec.capacity_bytes),
            active: mode == Mode::EveryNode,
            listed: false,
            last_listing: None,
            list_after: now,
            list_retry: MIN_LISTING_GAP,
            last_read: None,
            evict_after: now,
            evict_backoff: EVICT_BACKOFF,
            jitter: seed | 1,
            relist: false,
            listing_began: None,
            previous_began: None,
            listed_rate: 0,
            listing_took: Duration::ZERO,
        }
    }

    /// The models counted grew: the next step lists again (once this
    /// evictor has listed), to count their objects.
    pub fn relist(&mut self) {
        self.relist = self.listed;
    }

    /// How the fleet shares the eviction.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether a listing is in (the view holds the bucket's objects).
    pub fn listed(&self) -> bool {
        self.listed
    }

    /// The view (the last listing and this node's changes since).
    pub fn view(&self) -> &BucketView {
        &self.view
    }

    /// Bytes the bucket holds as far as this evictor knows: its view and
    /// what the reports added since its last listing.
    pub fn known_bytes(&self) -> u64 {
        self.view
            .bytes()
            .saturating_add(self.tally.unlisted_bytes())
    }

    /// Nodes whose reports it reads.
    pub fn reporters(&self) -> usize {
        self.tally.reporters()
    }

    /// The fleet's write rate at `now` as the reports show it, bytes a
    /// second, over two report periods.
    pub fn fleet_rate(&mut self, now: Duration) -> u64 {
        self.tally.rate(now, self.timing().report * 2)
    }

    /// The usage it deletes on: its view (the last listing and its own
    /// changes since) and, in [`Mode::Lease`], the growth the last two
    /// listings showed, as a rate, over [`Timing::horizon`]. Nothing a
    /// report says is in it.
    pub fn justified_bytes(&self) -> u64 {
        if self.mode == Mode::EveryNode {
            return self.view.bytes();
        }
        let ahead = self.listed_rate as f64 * self.timing().horizon().as_secs_f64();
        self.view.bytes().saturating_add(ahead as u64)
    }

    /// The growth the last two listings showed, bytes a second: what the
    /// later one found that this node had not stored, over the time
    /// between their starts.
    pub fn listed_rate(&self) -> u64 {
        self.listed_rate
    }

    /// The nodes whose reports were absurd since the last call
    /// ([`Tally::absurd`]), each with the bytes it claimed.
    pub fn absurd_reports(&mut self) -> Vec<(String, u64)> {
        self.tally.absurd()
    }

    fn timing(&self) -> Timing {
        self.spec.timing
    }

    /// This node stored (or learned of) an object; followed only while
    /// the view is kept (this node evicts, or a listing runs).
    pub fn stored(&mut self, key: String, entry: Entry) {
        if self.active {
            self.view.stored(key, entry);
        }
    }

    /// This node deleted an object, or found it gone.
    pub fn removed(&mut self, key: &str) {
        if self.active {
            self.view.removed(key);
        }
    }

    /// What to do at `now`; `holds` tells whether this node may delete
    /// ([`super::lease::Election::holds`]; always in [`Mode::EveryNode`]).
    pub fn next(&mut self, now: Duration, holds: bool) -> EvictStep {
        let holds = holds || self.mode == Mode::EveryNode;
        if !holds {
            self.forget();
            return EvictStep::Wait(now + self.timing().renew());
        }
        self.active = true;
        if now >= self.list_after && self.listing_due(now) {
            self.view.begin_listing();
            self.tally.listing_began();
            self.previous_began = self.listing_began.replace(now);
            return EvictStep::List;
        }
        if !self.listed {
            return EvictStep::Wait(self.list_after);
        }
        let read_at = self
            .last_read
            .map_or(now, |t| t + self.timing().read_reports);
        if self.mode == Mode::Lease && now >= read_at {
            return EvictStep::ReadReports;
        }
        if now >= self.evict_after {
            let usage = self.justified_bytes();
            let chosen = self.view.victims(usage, &self.spec);
            if !chosen.is_empty() {
                return EvictStep::Evict(chosen);
            }
        }
        let stale = self.tally.stale(now);
        if !stale.is_empty() {
            return EvictStep::DeleteReports(stale);
        }
        EvictStep::Wait(self.wake_at(now, read_at))
    }

    fn listing_due(&mut self, now: Duration) -> bool {
        let Some(last) = self.last_listing.filter(|_| self.listed && !self.relist) else {
            return true;
        };
        if now >= last + self.timing().listing {
            return true;
        }
        let gap = MIN_LISTING_GAP.max(self.timing().read_reports);
        let began = self.listing_began.unwrap_or(last);
        let relist_at = (last + gap).max(began + self.listing_took * RELIST_GAP_LISTINGS);
        if now < relist_at && self.mode == Mode::Lease {
            return false;
        }
        let usage = self.justified_bytes();
        let trigger = self.spec.trigger_bytes;
        let starved = usage >= trigger && self.view.victims(usage, &self.spec).is_empty();
        match self.mode {
            Mode::EveryNode => {
                now >= last + MIN_LISTING_GAP
                    && (starved || self.view.listing_due(self.spec.listing_every_bytes))
            }
            Mode::Lease => starved || (usage < trigger && self.known_bytes() >= trigger),
        }
    }

    fn wake_at(&self, now: Duration, read_at: Duration) -> Duration {
        let listing_at = self
            .last_listing
            .map_or(now, |t| t + self.timing().listing)
            .max(self.list_after);
        let mut at = listing_at;
        if self.mode == Mode::Lease {
            at = at.min(read_at);
        }
        if self.evict_after > now {
            at = at.min(self.evict_after);
        }
        if self.mode == Mode::EveryNode {
            at = at.min(now + MIN_LISTING_GAP.max(Duration::from_millis(100)));
        }
        at.max(now)
    }

    fn forget(&mut self) {
        if self.active {
            self.view = BucketView::default();
            self.tally = Tally::new(self.spec.capacity_bytes);
            self.active = false;
            self.listed = false;
            self.last_read = None;
            self.listing_began = None;
            self.listed_rate = 0;
            self.listing_took = Duration::ZERO;
        }
    }

    /// The listing [`EvictStep::List`] asked for ended at `now`: `Some`
    /// with LMCache's objects under the prefix, `None` when it failed
    /// (tried again after a pause that doubles up to [`LISTING_RETRY`]).
    /// Returns the objects and bytes it found that the view did not know.
    pub fn listed_at(&mut self, now: Duration, listing: Option<Vec<StoredObject>>) -> (u64, u64) {
        let Some(objects) = listing else {
            self.view.listing_failed();
            self.tally.listing_failed();
            self.listing_began = self.previous_began;
            self.list_after = now + self.list_retry;
            self.list_retry = (self.list_retry * 2).min(LISTING_RETRY);
            return (0, 0);
        };
        let others = self.view.finish_listing(objects);
        self.tally.listing_done();
        self.listed_rate = match (self.listed, self.listing_began, self.previous_began) {
            // Newly counted models: what it found is not growth.
            (true, _, _) if self.relist => self.listed_rate,
            (true, Some(began), Some(before)) if began > before => {
                (others.1 as f64 / (began - before).as_secs_f64()) as u64
            }
            _ => 0,
        };
        self.listing_took = self
            .listing_began
            .map_or(Duration::ZERO, |b| now.saturating_sub(b));
        self.listed = true;
        self.relist = false;
        self.last_listing = Some(now);
        self.list_after = now;
        self.list_retry = MIN_LISTING_GAP;
        others
    }

    /// Of the reports listed as (node, ETag), the nodes whose report to
    /// read ([`Tally::to_read`]).
    pub fn to_read<'a>(&self, listed: &'a [(String, Option<String>)]) -> Vec<&'a str> {
        self.tally.to_read(listed)
    }

    /// The reports read at `now` (ETag, body); an empty slice when the
    /// reading failed (tried again a period later).
    pub fn reports_read(&mut self, now: Duration, reports: &[(Option<String>, ReportBody)]) {
        self.last_read = Some(now);
        for (etag, body) in reports {
            self.tally.read(now, etag.clone(), body);
        }
        self.tally.reading_done();
    }

    /// The deletions of [`EvictStep::Evict`] ended at `now`: each key, its
    /// bytes and whether the store deleted it. A cycle that deleted none
    /// backs off; one that deleted some is followed by the next at once.
    pub fn evicted(&mut self, now: Duration, results: &[(String, u64, bool)]) {
        let refused = !results.is_empty() && results.iter().all(|(_, _, ok)| !ok);
        for (key, _, _) in results.iter().filter(|(_, _, ok)| *ok) {
            self.view.removed(key);
        }
        if refused {
            self.evict_after = now + self.jittered(self.evict_backoff);
            self.evict_backoff = (self.evict_backoff * 2).min(MAX_EVICT_BACKOFF);
        } else {
            self.evict_after = now;
            self.evict_backoff = EVICT_BACKOFF;
        }
    }
}

impl Evictor {
    /// A pause between half of `pause` and all of it (xorshift of the
    /// node's seed).
    fn jittered(&mut self, pause: Duration) -> Duration {
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        let share = 0.5 + (self.jitter >> 11) as f64 / (1u64 << 53) as f64 / 2.0;
        pause.mul_f64(share)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::BoundRole;
    use std::time::SystemTime;

    const S: Duration = Duration::from_secs(1);

    fn object(key: &str, bytes: u64, age: u64) -> StoredObject {
        StoredObject {
            key: key.into(),
            bytes,
            modified: SystemTime::UNIX_EPOCH + Duration::from_secs(1000 - age),
        }
    }

    fn spec() -> BoundSpec {
        BoundSpec::new(1000, 0.8, 0.2, BoundRole::Evictor)
    }

    #[test]
    fn a_cycle_keeps_eight_in_flight_and_stops_once_failures_lead() {
        let victims: Vec<_> = (0..20).map(|i| (format!("k{i:02}"), 10)).collect();
        let mut cycle = EvictCycle::new(victims);
        let sent: Vec<_> = std::iter::from_fn(|| cycle.send()).collect();
        assert_eq!(sent.len(), DELETES_IN_FLIGHT);
        assert_eq!(sent[0].0, "k00", "oldest first");
        cycle.answered(sent[0].0.clone(), 10, true);
        assert_eq!(
            cycle.send().map(|v| v.0),
            Some("k08".into()),
            "one per answer"
        );
        cycle.answered(sent[1].0.clone(), 10, false);
        assert!(
            cycle.send().is_some(),
            "one failure of two: not more failed"
        );
        cycle.answered(sent[2].0.clone(), 10, false);
        assert_eq!(cycle.send(), None, "two failed, one taken: no more");
        for (key, bytes) in sent[3..].iter().cloned() {
            cycle.answered(key, bytes, true);
        }
        cycle.answered("k08".into(), 10, true);
        cycle.answered("k09".into(), 10, true);
        assert_eq!(cycle.send(), None, "none again, though taken lead again");
        let results = cycle.results();
        assert_eq!(results.len(), 10);
        assert_eq!(results.iter().filter(|r| !r.2).count(), 2);
    }

    #[test]
    fn a_follower_keeps_no_view_and_a_holder_lists_before_it_evicts() {
        let mut e = Evictor::new(spec(), Mode::Lease, Duration::ZERO, 7);
        assert!(matches!(e.next(Duration::ZERO, false), EvictStep::Wait(_)));
        e.stored(
            "a".into(),
            Entry {
                bytes: 5,
                modified: SystemTime::UNIX_EPOCH,
            },
        );
        assert_eq!(e.view().objects(), 0);
        assert_eq!(e.next(S, true), EvictStep::List);
        let objects = (0..9).map(|i| object(&format!("k{i}"), 100, i)).collect();
        e.listed_at(S, Some(objects));
        assert_eq!(e.next(S, true), EvictStep::ReadReports);
        e.reports_read(S, &[]);
        let EvictStep::Evict(victims) = e.next(S, true) else {
            panic!("no eviction at 900 of 1000")
        };
        assert_eq!(victims.len(), 3);
        assert_eq!(victims[0].0, "k8");
        let results: Vec<_> = victims
            .iter()
            .map(|(k, b)| (k.clone(), *b, false))
            .collect();
        e.evicted(S, &results);
        assert!(matches!(e.next(S, true), EvictStep::Wait(t) if t >= S + S / 2 && t <= 2 * S));
        e.next(2 * S, false);
        assert!(!e.listed());
        assert_eq!(e.view().objects(), 0);
    }

    #[test]
    fn refused_cycles_back_off_doubling_to_a_minute_with_each_nodes_own_jitter() {
        let pauses = |seed| {
            let mut e = Evictor::new(spec(), Mode::EveryNode, Duration::ZERO, seed);
            (0..10)
                .map(|_| {
                    e.evicted(Duration::ZERO, &[("k".into(), 1, false)]);
                    e.evict_after
                })
                .collect::<Vec<_>>()
        };
        let (a, b) = (pauses(1), pauses(2));
        assert_ne!(a, b);
        for pauses in [a, b] {
            for (i, pause) in pauses.iter().enumerate() {
                let full = (EVICT_BACKOFF * 2u32.pow(i as u32)).min(MAX_EVICT_BACKOFF);
                assert!(
                    *pause >= full / 2 && *pause <= full,
                    "{i}: {pause:?} of {full:?}"
                );
            }
        }
    }

    fn report(written: u64, recent: u64, reports: u64) -> ReportBody {
        ReportBody {
            node: "b".into(),
            written_bytes: written,
            recent_bytes: recent,
            reports,
            models: Vec::new(),
        }
    }

    /// The reports bring a listing sooner; the listing, not the reports,
    /// justifies the deletions, and the growth two listings show brings
    /// the next eviction forward.
    #[test]
    fn the_reports_bring_a_listing_and_the_listings_justify_the_eviction() {
        let mut e = Evictor::new(spec(), Mode::Lease, Duration::ZERO, 7);
        assert_eq!(e.next(Duration::ZERO, true), EvictStep::List);
        let objects = |n: u64| (0..n).map(|i| object(&format!("k{i}"), 100, i)).collect();
        e.listed_at(Duration::ZERO, Some(objects(5)));
        assert_eq!(e.next(Duration::ZERO, true), EvictStep::ReadReports);
        e.reports_read(Duration::ZERO, &[]);
        e.reports_read(Duration::ZERO, &[(Some("1".into()), report(60, 60, 0))]);
        assert_eq!(e.known_bytes(), 560);
        assert!(matches!(e.next(Duration::ZERO, true), EvictStep::Wait(_)));
        e.reports_read(10 * S, &[(Some("2".into()), report(360, 300, 1))]);
        assert_eq!((e.known_bytes(), e.justified_bytes()), (860, 500));
        assert_eq!(
            e.next(10 * S, true),
            EvictStep::List,
            "the reports: a listing"
        );
        e.listed_at(10 * S, Some(objects(7)));
        assert_eq!(e.listed_rate(), 200 / 10);
        assert_eq!(e.justified_bytes(), 700 + 20 * 70);
        let EvictStep::Evict(victims) = e.next(10 * S, true) else {
            panic!("no eviction on the listing's growth")
        };
        assert_eq!(victims.len(), 7, "all the listed objects, oldest first");
    }

    /// A report claiming 10^15 bytes, the capacity per reading at most,
    /// brings listings, never a deletion the listing does not justify.
    #[test]
    fn a_lying_report_deletes_nothing_the_listing_does_not_justify() {
        let mut e = Evictor::new(spec(), Mode::Lease, Duration::ZERO, 7);
        assert_eq!(e.next(Duration::ZERO, true), EvictStep::List);
        let objects: Vec<_> = (0..5).map(|i| object(&format!("k{i}"), 100, i)).collect();
        e.listed_at(Duration::ZERO, Some(objects.clone()));
        e.reports_read(Duration::ZERO, &[]);
        let mut listings = 0;
        for t in 1..=60u32 {
            let lie = report(10u64.pow(15) * u64::from(t), 10u64.pow(15), t.into());
            e.reports_read(t * S, &[(Some(t.to_string()), lie)]);
            match e.next(t * S, true) {
                EvictStep::List => {
                    listings += 1;
                    e.listed_at(t * S, Some(objects.clone()));
                }
                EvictStep::Evict(v) => panic!("deleted {v:?} on a report"),
                _ => {}
            }
            assert!(!matches!(e.next(t * S, true), EvictStep::Evict(_)));
        }
        assert!(
            (5..=7).contains(&listings),
            "a listing a reading period: {listings}"
        );
        assert_eq!(e.absurd_reports(), [("b".to_string(), 10u64.pow(15))]);
        assert!(e.absurd_reports().is_empty());
    }

    /// On a bucket whose listing takes 20 s (about 1,000 pages), the
    /// listings the reports bring start 100 s apart at least.
    #[test]
    fn listings_the_reports_bring_take_at_most_a_fifth_of_the_time() {
        let mut e = Evictor::new(spec(), Mode::Lease, Duration::ZERO, 7);
        let objects: Vec<_> = (0..5).map(|i| object(&format!("k{i}"), 100, i)).collect();
        let took = 20 * S;
        assert_eq!(e.next(Duration::ZERO, true), EvictStep::List);
        e.listed_at(took, Some(objects.clone()));
        e.reports_read(took, &[]);
        let (mut t, mut began) = (took, vec![Duration::ZERO]);
        for n in 1..=600u32 {
            t += S;
            let lie = report(10u64.pow(15) * u64::from(n), 10u64.pow(15), n.into());
            e.reports_read(t, &[(Some(n.to_string()), lie)]);
            if e.next(t, true) == EvictStep::List {
                began.push(t);
                t += took;
                e.listed_at(t, Some(objects.clone()));
            }
        }
        let gaps: Vec<_> = began.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.iter().all(|g| *g >= took * RELIST_GAP_LISTINGS),
            "{gaps:?}"
        );
        assert!(
            gaps.len() >= 5,
            "the reports still bring listings: {gaps:?}"
        );
    }

    #[test]
    fn every_node_lists_after_a_fiftieth_of_the_capacity_and_never_reads_reports() {
        let mut e = Evictor::new(spec(), Mode::EveryNode, Duration::ZERO, 7);
        assert_eq!(e.next(Duration::ZERO, false), EvictStep::List);
        e.listed_at(Duration::ZERO, Some(Vec::new()));
        assert!(matches!(e.next(Duration::ZERO, false), EvictStep::Wait(_)));
        e.stored(
            "a".into(),
            Entry {
                bytes: 20,
                modified: SystemTime::UNIX_EPOCH,
            },
        );
        assert!(matches!(e.next(Duration::ZERO, false), EvictStep::Wait(_)));
        assert_eq!(e.next(S, false), EvictStep::List);
    }
}
