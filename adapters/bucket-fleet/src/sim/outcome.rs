//! What a simulation gives: the bound's peak, the requests an hour by
//! class, and the lease's figures, with a table row for each run
//! (`docs/s3-gateway.md`, "A fleet on one bucket").

use std::fmt;
use std::time::Duration;

use super::{Checks, Config, MemStore, Requests};
use crate::Mode;

/// How long an evictor takes, once there is one again, to bring the
/// bucket back under its trigger: half a lease before a new lease's
/// creator deletes (`docs/s3-gateway.md`, "The election", rule 1), and a
/// listing and deletions through the slowest answers of the seeded
/// faults (5 s).
pub const SETTLE: Duration = Duration::from_secs(20);

/// The lease's figures of a run on a store with conditional writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseFigures {
    /// Times a node took the lease: its creation, then each takeover.
    pub took: u64,
    /// Simulated time with no running node awake that
    /// [`Node::holds`](crate::node::Node::holds) (a stalled holder deletes
    /// nothing); the start's election included.
    pub no_holder: Duration,
    /// The longest such stretch.
    pub longest_no_holder: Duration,
    /// Moments (the simulation's events) at which two running nodes or
    /// more held the lease.
    pub two_holders: u64,
}

impl LeaseFigures {
    /// The evictor's changes: the takings after the first.
    pub fn takeovers(&self) -> u64 {
        self.took.saturating_sub(1)
    }
}

/// The lease's figures as they accrue: the state between two events is
/// the one sampled at the later (a holder appears only at an event; one
/// whose hold ran out between two events is counted gone from the
/// earlier, so the stretches are counted long, never short).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Watch {
    figures: LeaseFigures,
    last: Duration,
    last_awake: usize,
    stretch: Duration,
}

impl Watch {
    /// A node took the lease.
    pub(super) fn took(&mut self) {
        self.figures.took += 1;
    }

    /// `holding` running nodes hold the lease at `at`, `awake` of them not
    /// stalled: a stalled holder deletes nothing, so the time without an
    /// evictor counts until a holder is awake.
    pub(super) fn sample(&mut self, at: Duration, holding: usize, awake: usize) {
        let span = at.saturating_sub(self.last);
        if self.last_awake == 0 || awake == 0 {
            self.figures.no_holder += span;
            self.stretch += span;
            let longest = &mut self.figures.longest_no_holder;
            *longest = (*longest).max(self.stretch);
        }
        if awake > 0 {
            self.stretch = Duration::ZERO;
        }
        if holding > 1 {
            self.figures.two_holders += 1;
        }
        self.last = at;
        self.last_awake = awake;
    }
}

/// One run's results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Nodes at the start.
    pub nodes: usize,
    /// Nodes started in all: restarts and joins too.
    pub started: usize,
    /// Of those, nodes that ran [`Mode::EveryNode`].
    pub every_node: usize,
    /// The most nodes that ran at once.
    pub most_running: usize,
    /// What one node writes, bytes a second.
    pub node_bytes_per_s: u64,
    /// The bound's capacity, bytes.
    pub capacity_bytes: u64,
    /// Its trigger, bytes.
    pub trigger_bytes: u64,
    /// The size of LMCache's objects, bytes.
    pub object_bytes: u64,
    /// The most bytes of LMCache objects the prefix held.
    pub peak_bytes: u64,
    /// LMCache objects deleted.
    pub evicted: u64,
    /// The requests of the whole run.
    pub requests: Requests,
    /// The simulated time.
    pub duration: Duration,
    /// The lease's figures; `None` on a store without conditional writes.
    pub lease: Option<LeaseFigures>,
    /// The evictors' deletions against the rules.
    pub checks: Checks,
}

impl Outcome {
    pub(super) fn new(config: &Config, store: &MemStore, modes: &[Mode], watch: Watch) -> Self {
        Outcome {
            nodes: config.nodes,
            started: modes.len(),
            every_node: modes.iter().filter(|&&m| m == Mode::EveryNode).count(),
            most_running: config.nodes,
            node_bytes_per_s: config.fleet_bytes_per_s / config.nodes.max(1) as u64,
            capacity_bytes: config.spec.capacity_bytes,
            trigger_bytes: config.spec.trigger_bytes,
            object_bytes: config.object_bytes,
            peak_bytes: store.peak_bytes(),
            evicted: store.evicted(),
            requests: store.requests(),
            duration: config.duration,
            lease: config.conditional_writes.then_some(watch.figures),
            checks: store.checks(),
        }
    }

    /// The bound the bucket keeps with an evictor at work: 1.05 times the
    /// capacity and one object per node started (`docs/s3-gateway.md`, "A
    /// fleet on one bucket").
    pub fn goal_bytes(&self) -> u64 {
        let goal = self.capacity_bytes + self.capacity_bytes / 20;
        goal + self.started as u64 * self.object_bytes
    }

    /// The bound the bucket keeps (`docs/s3-gateway.md`, "The simulation's
    /// faults"): 1.05 times the capacity and one object per node started,
    /// or, where the nodes went without an evictor, the trigger and what
    /// the most nodes that ran write over the longest stretch without one
    /// and [`SETTLE`] more, whichever is more.
    pub fn stated_bound_bytes(&self) -> u64 {
        let goal = self.goal_bytes();
        let Some(lease) = self.lease else {
            return goal;
        };
        let rate = self.node_bytes_per_s * self.most_running as u64;
        let unbounded = (lease.longest_no_holder + SETTLE).as_secs_f64() * rate as f64;
        goal.max(self.trigger_bytes + unbounded as u64)
    }

    /// The capacity in objects.
    pub fn capacity_objects(&self) -> u64 {
        self.capacity_bytes / self.object_bytes.max(1)
    }

    /// The peak over the capacity (1.0: full).
    pub fn peak_share(&self) -> f64 {
        self.peak_bytes as f64 / self.capacity_bytes.max(1) as f64
    }

    /// Objects the peak held past the capacity (0 at or below it).
    pub fn over_objects(&self) -> u64 {
        self.peak_bytes
            .saturating_sub(self.capacity_bytes)
            .div_ceil(self.object_bytes.max(1))
    }

    /// `count` requests of the run, an hour.
    pub fn per_hour(&self, count: u64) -> u64 {
        let seconds = self.duration.as_secs_f64().max(1.0);
        (count as f64 * 3600.0 / seconds).round() as u64
    }

    /// The table's header over [`Outcome`]'s rows (its `Display`).
    pub fn header() -> String {
        format!(
            "{:>5} {:<10} {:>9} {:>5} {:>5} {:>8} {:>7} {:>9} {:>10} {:>10} {:>9} {:>5} {:>7} {:>7} {:>3}",
            "nodes",
            "mode",
            "capacity",
            "peak",
            "over",
            "LIST/h",
            "PUT/h",
            "GET/h",
            "DELETE/h",
            "data PUT/h",
            "evicted",
            "takes",
            "no ev.",
            "longest",
            "two",
        )
    }
}

impl fmt::Display for Outcome {
    /// One row: nodes at the start, mode, capacity (objects), peak /
    /// capacity, objects past the capacity, the bound's requests an hour
    /// (LIST, PUT, GET, DELETE), LMCache's PUTs an hour, objects evicted,
    /// and with a lease the takeovers, the seconds without an evictor and
    /// the longest stretch of them, and the moments with two.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.every_node {
            0 => "lease",
            n if n == self.started => "every_node",
            _ => "mixed",
        };
        let r = self.requests;
        let hour = |n| thousands(self.per_hour(n));
        let (takes, none, longest, two) = match self.lease {
            Some(l) => (
                l.takeovers().to_string(),
                format!("{:.1}", l.no_holder.as_secs_f64()),
                format!("{:.1}", l.longest_no_holder.as_secs_f64()),
                l.two_holders.to_string(),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        write!(
            f,
            "{:>5} {:<10} {:>9} {:>5.3} {:>5} {:>8} {:>7} {:>9} {:>10} {:>10} {:>9} {:>5} {:>7} {:>7} {:>3}",
            thousands(self.nodes as u64),
            mode,
            thousands(self.capacity_objects()),
            self.peak_share(),
            self.over_objects(),
            hour(r.list),
            hour(r.put),
            hour(r.get),
            hour(r.delete),
            hour(r.data_put),
            thousands(self.evicted),
            takes,
            none,
            longest,
            two,
        )
    }
}

/// `n` with a comma every three digits.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn stretches_without_a_holder_are_counted_from_the_last_moment_one_was_seen() {
        let mut w = Watch::default();
        w.sample(2 * S, 0, 0);
        w.sample(3 * S, 1, 1);
        w.sample(10 * S, 1, 1);
        w.sample(12 * S, 0, 0);
        w.sample(20 * S, 0, 0);
        w.sample(21 * S, 2, 2);
        assert_eq!(w.figures.no_holder, 3 * S + 11 * S);
        assert_eq!(w.figures.longest_no_holder, 11 * S);
        assert_eq!(w.figures.two_holders, 1);
        w.sample(25 * S, 1, 0);
        w.sample(30 * S, 2, 1);
        assert_eq!(w.figures.longest_no_holder, 11 * S, "{:?}", w.figures);
        assert_eq!(
            w.figures.no_holder,
            14 * S + 9 * S,
            "a stalled holder deletes nothing"
        );
        assert_eq!(w.figures.two_holders, 2);
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(999), "999");
    }
}
