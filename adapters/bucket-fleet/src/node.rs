//! One node's decisions on a shared prefix: its side of the lease, its
//! reports and its evictor, and the rules that join them
//! (`docs/s3-gateway.md`, "A fleet on one bucket").
//!
//! The gateway's driver (`bound.rs` of `lmcache-s3-gateway`) and the fleet simulation
//! ([`super::sim`]) both run a [`Node`]: they send what it asks to a store
//! (the real one, or one in memory) and give it the answers, and decide
//! nothing themselves. The rules of the glue:
//!
//! - a node may delete while it holds the lease ([`Election::holds`]), and
//!   always in [`Mode::EveryNode`], where there is no lease;
//! - what this node stores counts for its reports and, while its evictor
//!   keeps a view, in that view;
//! - the lease's body publishes the evictor's figures;
//! - while this node holds the lease, what it wrote is in its own view:
//!   its reports are absorbed, none is sent.

use std::time::Duration;

use super::evictor::{EvictStep, Evictor};
use super::lease::{Election, LeaseAnswer, LeaseBody, LeaseStep};
use super::models::Models;
use super::report::{ReportBody, Reporter};
use super::rule::BoundSpec;
use super::view::{Entry, StoredObject};
use super::Mode;

/// The decisions of one node (one start of a gateway) on a prefix.
#[derive(Debug)]
pub struct Node {
    /// Its side of the lease; `None` in [`Mode::EveryNode`].
    pub election: Option<Election>,
    /// Its count of what it wrote, and when to report it.
    pub reporter: Reporter,
    /// Its listings, readings of the reports and evictions.
    pub evictor: Evictor,
    /// The models whose objects it counts ([`Models`]).
    pub models: Models,
}

/// What an answer to a lease request changed for this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseChange {
    /// It took the lease (created it, or took it over).
    Took,
    /// It lost the lease to another node.
    Lost,
    /// It holds the lease as before, or still does not.
    Kept,
}

impl Node {
    /// The node `node` (its id: 16 hex digits) of the bound `spec` in
    /// `mode`, at `now` on its monotonic clock, counting the objects of
    /// `models` and of those it learns.
    pub fn new(node: String, spec: BoundSpec, mode: Mode, now: Duration, models: Models) -> Self {
        let election = (mode == Mode::Lease).then(|| Election::new(node.clone(), spec.timing, now));
        let seed = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        Node {
            election,
            reporter: Reporter::new(node, &spec.timing, spec.capacity_bytes),
            evictor: Evictor::new(spec, mode, now, seed),
            models,
        }
    }

    /// Names `models` (a report's or the lease's) at `now` as candidates
    /// to count ([`Models::named`]); the evictor lists again when one is
    /// new, to count its objects.
    fn learn(&mut self, models: &[String], now: Duration) {
        if self.models.named_all(models, now) {
            self.evictor.relist();
        }
    }

    /// A listing ended at `now` ([`Evictor::listed_at`]): it confirms or
    /// ages the models ([`Models::listed`]), and the objects of models
    /// this node does not count are left out.
    pub fn listed_at(&mut self, now: Duration, listing: Option<Vec<StoredObject>>) -> (u64, u64) {
        let counted = listing.map(|mut objects| {
            self.models.listed(now, &mut objects, |o| o.key.as_str());
            objects
        });
        self.evictor.listed_at(now, counted)
    }

    /// The reports read at `now` ([`Evictor::reports_read`]); the models
    /// they name are candidates from now on.
    pub fn reports_read(&mut self, now: Duration, reports: &[(Option<String>, ReportBody)]) {
        for (_, body) in reports {
            self.learn(&body.models, now);
        }
        self.evictor.reports_read(now, reports);
    }

    /// Whether this node may delete at `now`: it holds the lease
    /// ([`Election::holds`]), or there is no lease ([`Mode::EveryNode`]).
    pub fn holds(&self, now: Duration) -> bool {
        self.election.as_ref().is_none_or(|e| e.holds(now))
    }

    /// This node stored an LMCache object `key` (`entry.bytes` bytes) at
    /// `now`: counted for its reports and in its evictor's view. Returns
    /// whether a report is due, to wake the task that sends them.
    pub fn stored(&mut self, now: Duration, key: String, entry: Entry) -> bool {
        if self.models.stored_key(&key, now) {
            self.evictor.relist();
        }
        self.reporter.written(entry.bytes);
        self.evictor.stored(key, entry);
        self.reporter.due(now).is_some()
    }

    /// The holder's figures at `now` for the lease's body: the evictor's
    /// usage (bytes), objects, the fleet's write rate (bytes a second) and
    /// reporters; [`Election::next`] sets the rest.
    pub fn published(&mut self, now: Duration) -> LeaseBody {
        LeaseBody {
            usage_bytes: self.evictor.known_bytes(),
            objects: self.evictor.view().objects() as u64,
            fleet_write_bytes_per_s: self.evictor.fleet_rate(now),
            reporters: self.evictor.reporters() as u64,
            models: self.models.confirmed(),
            ..LeaseBody::default()
        }
    }

    /// The lease request to send at `now` (`unix_now`: this node's wall
    /// clock, Unix seconds, shown in the body and never compared), with
    /// [`Node::published`] as the body of a write; `None` in
    /// [`Mode::EveryNode`].
    pub fn lease_step(&mut self, now: Duration, unix_now: u64) -> Option<LeaseStep> {
        let published = self.published(now);
        let election = self.election.as_mut()?;
        Some(election.next(now, &published, unix_now))
    }

    /// Gives the lease up as this node stops ([`Election::release`]): the
    /// write to send once, its body the evictor's figures at `now`; `None`
    /// unless this node holds the lease. It deletes no more from here on.
    pub fn release(&mut self, now: Duration) -> Option<LeaseStep> {
        let published = self.published(now);
        self.election.as_mut()?.release(now, &published)
    }

    /// The store answered the lease request at `now`; `written` is the
    /// body of a write. Returns whether this node took or lost the lease.
    pub fn lease_answered(
        &mut self,
        now: Duration,
        answer: LeaseAnswer,
        written: Option<&LeaseBody>,
    ) -> LeaseChange {
        let Some(election) = self.election.as_mut() else {
            return LeaseChange::Kept;
        };
        let was = election.is_holder();
        election.answered(now, answer, written);
        let is = election.is_holder();
        let published = election.holder().map(|b| b.models.clone());
        self.learn(&published.unwrap_or_default(), now);
        match (was, is) {
            (false, true) => LeaseChange::Took,
            (true, false) => LeaseChange::Lost,
            _ => LeaseChange::Kept,
        }
    }

    /// What the evictor does at `now`, deleting only while this node
    /// [`Node::holds`].
    pub fn evict_step(&mut self, now: Duration) -> EvictStep {
        let holds = self.holds(now);
        self.evictor.next(now, holds)
    }

    /// The report to send at `now`, if one is due; none while this node
    /// holds the lease (what it wrote is in its own view, so its count is
    /// absorbed).
    pub fn report_due(&mut self, now: Duration) -> Option<ReportBody> {
        if self.holds(now) {
            self.reporter.absorb();
        }
        let mut body = self.reporter.due(now)?;
        body.models = self.models.confirmed();
        Some(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::BoundRole;
    use std::time::SystemTime;

    const S: Duration = Duration::from_secs(1);

    fn spec() -> BoundSpec {
        BoundSpec::new(5000, 0.8, 0.2, BoundRole::Evictor)
    }

    fn entry(bytes: u64) -> Entry {
        Entry {
            bytes,
            modified: SystemTime::UNIX_EPOCH,
        }
    }

    /// Takes the lease for `n` at `now` as the store would answer a node
    /// after another released it: the released lease, then its takeover.
    fn take(n: &mut Node, now: Duration) -> LeaseChange {
        assert_eq!(n.lease_step(now, 0), Some(LeaseStep::Read));
        let released = LeaseBody {
            holder: "z".into(),
            released: true,
            ..LeaseBody::default()
        };
        n.lease_answered(now, LeaseAnswer::Found("e0".into(), Some(released)), None);
        let Some(LeaseStep::Write { body, .. }) = n.lease_step(now, 0) else {
            panic!("no write")
        };
        n.lease_answered(now, LeaseAnswer::Written("e1".into()), Some(&body))
    }

    #[test]
    fn every_node_deletes_without_a_lease_and_a_lease_node_only_while_it_holds() {
        let mut alone = Node::new(
            "a".into(),
            spec(),
            Mode::EveryNode,
            Duration::ZERO,
            Models::default(),
        );
        assert!(alone.holds(Duration::ZERO) && alone.election.is_none());
        assert_eq!(alone.lease_step(Duration::ZERO, 0), None);
        let mut n = Node::new(
            "b".into(),
            spec(),
            Mode::Lease,
            Duration::ZERO,
            Models::default(),
        );
        assert!(!n.holds(Duration::ZERO));
        assert!(matches!(n.evict_step(Duration::ZERO), EvictStep::Wait(_)));
        assert_eq!(take(&mut n, Duration::ZERO), LeaseChange::Took);
        assert!(n.holds(Duration::ZERO));
        assert_eq!(n.evict_step(Duration::ZERO), EvictStep::List);
        let Some(LeaseStep::Write { .. }) = n.lease_step(5 * S, 0) else {
            panic!("no renewal")
        };
        assert_eq!(
            n.lease_answered(5 * S, LeaseAnswer::Conflict, None),
            LeaseChange::Lost
        );
        assert!(!n.holds(5 * S));
    }

    #[test]
    fn a_followers_writes_are_reported_and_the_holders_absorbed() {
        let mut n = Node::new(
            "b".into(),
            spec(),
            Mode::Lease,
            Duration::ZERO,
            Models::default(),
        );
        assert!(n.stored(Duration::ZERO, "k".into(), entry(10)));
        assert_eq!(n.evictor.view().objects(), 0);
        let report = n.report_due(Duration::ZERO).expect("a follower reports");
        assert_eq!((report.node.as_str(), report.recent_bytes), ("b", 10));
        take(&mut n, Duration::ZERO);
        assert_eq!(n.report_due(Duration::ZERO), None);
        n.evict_step(Duration::ZERO);
        n.stored(S, "l".into(), entry(200));
        assert_eq!(n.evictor.view().objects(), 1);
        assert_eq!(n.report_due(2 * S), None);
    }

    #[test]
    fn the_lease_body_publishes_the_evictors_view() {
        let mut n = Node::new(
            "a".into(),
            spec(),
            Mode::Lease,
            Duration::ZERO,
            Models::default(),
        );
        take(&mut n, Duration::ZERO);
        assert_eq!(n.evict_step(Duration::ZERO), EvictStep::List);
        n.evictor.listed_at(Duration::ZERO, Some(Vec::new()));
        n.stored(S, "k".into(), entry(300));
        let Some(LeaseStep::Write { body, .. }) = n.lease_step(5 * S, 7) else {
            panic!("no renewal")
        };
        assert_eq!((body.holder.as_str(), body.renewals), ("a", 1));
        assert_eq!((body.usage_bytes, body.objects), (300, 1));
    }

    fn object(key: &str, bytes: u64) -> StoredObject {
        StoredObject {
            key: key.into(),
            bytes,
            modified: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_node_counts_only_the_models_written_here_and_lists_again_for_a_new_one() {
        let mine = "test-model@01000100@0@00aa";
        let theirs = "org/m2@01000100@0@00bb";
        let nested = "p2/test-model@01000100@0@00cc";
        let mut n = Node::new(
            "a".into(),
            spec(),
            Mode::EveryNode,
            Duration::ZERO,
            Models::new(["test-model".to_string()]),
        );
        assert_eq!(n.evict_step(Duration::ZERO), EvictStep::List);
        let listing = || {
            Some(vec![
                object(mine, 10),
                object(theirs, 20),
                object(nested, 40),
            ])
        };
        n.listed_at(Duration::ZERO, listing());
        assert_eq!(
            (n.evictor.view().objects(), n.evictor.known_bytes()),
            (1, 10)
        );
        assert!(!matches!(n.evict_step(S * 2), EvictStep::List));
        let report = ReportBody {
            node: "b".into(),
            models: vec!["org/m2".into()],
            ..ReportBody::default()
        };
        n.reports_read(S * 2, &[(None, report)]);
        assert_eq!(
            n.evict_step(S * 3),
            EvictStep::List,
            "a new model is listed at once"
        );
        n.listed_at(S * 3, listing());
        assert_eq!(
            (n.evictor.view().objects(), n.evictor.known_bytes()),
            (2, 30)
        );
        n.stored(S * 4, "third@01000100@0@00dd".into(), entry(5));
        assert_eq!(n.models.names(), ["org/m2", "test-model", "third"]);
    }

    #[test]
    fn the_holder_publishes_its_models_and_the_reports_carry_the_nodes_own() {
        let mut holder = Node::new(
            "a".into(),
            spec(),
            Mode::Lease,
            Duration::ZERO,
            Models::new(["m1".to_string()]),
        );
        take(&mut holder, Duration::ZERO);
        let Some(LeaseStep::Write { body, .. }) = holder.lease_step(5 * S, 0) else {
            panic!("no renewal")
        };
        assert_eq!(body.models, ["m1"]);
        let mut follower = Node::new(
            "b".into(),
            spec(),
            Mode::Lease,
            Duration::ZERO,
            Models::default(),
        );
        assert_eq!(
            follower.lease_step(Duration::ZERO, 0),
            Some(LeaseStep::Read)
        );
        follower.lease_answered(
            Duration::ZERO,
            LeaseAnswer::Found("e1".into(), Some(body)),
            None,
        );
        assert_eq!(follower.models.names(), ["m1"]);
        follower.stored(S, "m2@01000100@0@00aa".into(), entry(7));
        let report = follower.report_due(S).expect("a follower reports");
        assert_eq!(
            report.models,
            ["m2"],
            "its own; a name it only read stays a candidate, never passed on"
        );
    }
}
