//! One evictor per prefix, elected through the store: the lease object
//! (`docs/s3-gateway.md`, "A fleet on one bucket").
//!
//! The rules, for a lease of `L` ([`Timing::lease`]):
//!
//! - a node that finds no lease creates it with `If-None-Match: *`; of
//!   several at once the store lets one win (`412` for the others);
//! - the holder renews it every `L/6` with `If-Match: <its etag>`, and
//!   deletes only within `L/2` of sending the last renewal the store took
//!   ([`Election::holds`]); a `412` means another node took it over;
//! - the others read it every `L/3`. A node that sees the same ETag for
//!   `L` by its own monotonic clock, counted from the answer in which it
//!   first saw that ETag, takes it over with `If-Match: <that etag>`;
//! - a holder that stops releases the lease ([`Election::release`]: a body
//!   with `released` set, written with `If-Match: <its etag>`), and a node
//!   that reads a released lease takes it over at once, so a restart hands
//!   the prefix over in one reading period, not a lease;
//! - a write whose answer is unknown (a timeout, a `5xx`, a dropped
//!   connection: the store may have applied it) is followed by a read
//!   before the holder writes again: a lease whose body names this node
//!   is its own (the write was applied), and the holder goes on with that
//!   ETag; a lease that is gone (`404`, deleted by hand) is created again
//!   at once.
//!
//! No two evictors: a renewal the store applied at `t` was sent before
//! `t`, so its holder stops deleting before `t + L/2`, and no node saw its
//! ETag before `t`, so none takes over before `t + L`. Only the rate of
//! the nodes' clocks enters, never their offsets. A store whose checks are
//! not atomic (s3s-fs lets two writers of one `If-Match` both win) can
//! give two holders until the next renewal, when one gets `412`: both
//! delete the oldest objects by one rule, so the bucket only holds a few
//! objects less for a moment.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Timing;

/// The lease object's body (JSON): who holds it and what it sees, for the
/// other nodes' state and `inspect`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseBody {
    /// The holder's node id.
    pub holder: String,
    /// Renewals by this holder since it took the lease.
    pub renewals: u64,
    /// When the holder took the lease, by its own clock (Unix seconds;
    /// shown, never compared).
    pub since_unix: u64,
    /// The holder's usage of the prefix: the last listing with what the
    /// reports say was written since, bytes.
    pub usage_bytes: u64,
    /// LMCache objects in its view.
    pub objects: u64,
    /// The fleet's write rate as the reports show it, bytes a second.
    pub fleet_write_bytes_per_s: u64,
    /// Nodes whose reports it reads.
    pub reporters: u64,
    /// The models whose objects it counts: a node that takes the lease
    /// over counts them too.
    #[serde(default)]
    pub models: Vec<String>,
    /// The holder stopped and gave the lease up: any node takes it over
    /// at once ([`Election::release`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
    /// With `released`: how long the node that takes the lease over waits
    /// before it deletes, milliseconds from its reading of this body: what
    /// was left of the releaser's own wait (a creator deletes only from
    /// half a lease after its creation, rule 1 of `docs/s3-gateway.md`,
    /// "The election"), 0 for none; never more than half a lease is waited,
    /// whatever it says. Durations only: no clock is compared.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub wait_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The condition of a write of the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// `If-None-Match: *`: only if there is no lease.
    Absent,
    /// `If-Match: <etag>`: only if the lease is still this one.
    Matches(String),
}

/// What the node asks of the store next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStep {
    /// GET the lease.
    Read,
    /// PUT the lease with `body` under `condition`.
    Write {
        /// `If-None-Match` or `If-Match`.
        condition: Condition,
        /// The new body.
        body: LeaseBody,
    },
    /// Nothing until this time (the node's monotonic clock).
    Wait(Duration),
}

/// The store's answer to a [`LeaseStep`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseAnswer {
    /// A read: no lease; or a write `If-Match` answered `404`: the lease
    /// is gone.
    Absent,
    /// A read: the lease, with its ETag; `None` for a body that is not a
    /// lease (a torn or foreign write, or one over the read's cap).
    Found(String, Option<LeaseBody>),
    /// A write was applied; the lease's new ETag.
    Written(String),
    /// A write was refused: `412` (or `409`), the lease is another's.
    Conflict,
    /// The request failed (network, `5xx`, a timeout): nothing learned;
    /// a write may or may not have been applied.
    Failed,
}

#[derive(Debug, Clone)]
enum Role {
    Follower {
        /// The ETag last seen and when it was first seen.
        seen: Option<(String, Duration)>,
        /// The write to send next, if any.
        want: Option<Condition>,
    },
    Holder {
        etag: String,
        /// When the last renewal the store took was sent.
        renewed_at: Duration,
        since_unix: u64,
        renewals: u64,
        /// A write's answer was unknown: read the lease before the next
        /// write.
        verify: bool,
        /// It deletes from this time on: half a lease after it created the
        /// lease (or took back one of its own, which may have been its
        /// creation), at once after it took another's over.
        deletes_from: Duration,
    },
    /// This node released the lease as it stops ([`Election::release`]):
    /// it asks nothing more, and an answer to a request sent before (a
    /// renewal, a read) changes nothing, so a release can never be taken
    /// back by this node's own task.
    Released,
}

/// The election's figures, for the gateway's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElectionFigures {
    /// Times this node took the lease.
    pub taken: u64,
    /// Times it lost it (a renewal answered `412`).
    pub lost: u64,
    /// Lease requests that failed.
    pub failures: u64,
    /// Lease reads (GET).
    pub reads: u64,
    /// Lease writes (PUT).
    pub writes: u64,
}

/// One node's side of the election.
#[derive(Debug, Clone)]
pub struct Election {
    node: String,
    timing: Timing,
    role: Role,
    next_at: Duration,
    sent_at: Duration,
    holder: Option<LeaseBody>,
    figures: ElectionFigures,
    /// When this node started, and when it last saw an evictor progress.
    created: Duration,
    progress_at: Option<Duration>,
    /// The holder and renewal count of the last body read.
    seen_renewals: Option<(String, u64)>,
    /// The write it wants takes back a lease of its own (one whose answer
    /// was lost): it may have been its creation, so it waits as a creator.
    own: bool,
    /// The write it wants takes over a released lease whose releaser was
    /// still waiting to delete: it waits until then too.
    wait_until: Duration,
}

impl Election {
    /// A node `node` that knows nothing of the lease yet, at `now`.
    pub fn new(node: String, timing: Timing, now: Duration) -> Self {
        Election {
            node,
            timing,
            role: Role::Follower {
                seen: None,
                want: None,
            },
            next_at: now,
            sent_at: now,
            holder: None,
            figures: ElectionFigures::default(),
            created: now,
            progress_at: None,
            seen_renewals: None,
            own: false,
            wait_until: Duration::ZERO,
        }
    }

    /// How long, at `now`, this node has seen no evictor make progress:
    /// since its own last renewal that the store took while it holds the
    /// lease, or since it read a body that is not released and whose
    /// holder or renewal count changed (a body rewritten with a new ETag
    /// and the same count is no progress), or since its start
    /// before either. `None` once it released the lease. Past twice the
    /// lease the prefix has no evictor (`docs/s3-gateway.md`, "A fleet on
    /// one bucket": the longest time without one after a fault ends is
    /// [`Timing::lease`] plus [`Timing::follow`]).
    pub fn no_evictor_for(&self, now: Duration) -> Option<Duration> {
        if matches!(self.role, Role::Released) {
            return None;
        }
        Some(now.saturating_sub(self.progress_at.unwrap_or(self.created)))
    }

    /// A body read at `now`: progress when its holder changed or counts
    /// other renewals than the last one read (more, or fewer: a holder
    /// that created the lease again after it was deleted counts from 0).
    fn progress_of(&mut self, now: Duration, body: Option<&LeaseBody>) {
        let Some(body) = body.filter(|b| !b.released) else {
            return;
        };
        let moved = self
            .seen_renewals
            .as_ref()
            .is_none_or(|(holder, renewals)| *holder != body.holder || body.renewals != *renewals);
        if moved {
            if self.seen_renewals.is_some() {
                self.progress_at = Some(now);
            }
            self.seen_renewals = Some((body.holder.clone(), body.renewals));
        }
    }

    /// Whether this node may delete at `now`: it holds the lease and sent
    /// its last renewal that the store took less than [`Timing::hold`] ago;
    /// and, when it created the lease (none was there), it sent that
    /// creation [`Timing::hold`] ago or more. A lease is absent at start,
    /// or because something deleted it under its holder, which may go on
    /// deleting for up to [`Timing::hold`] from its last renewal: the
    /// creator waits that out.
    pub fn holds(&self, now: Duration) -> bool {
        matches!(self.role, Role::Holder { renewed_at, deletes_from, .. }
            if now >= deletes_from && now < renewed_at + self.timing.hold())
    }

    /// Until when (on the same clock as `now`) this node may delete if
    /// no renewal lands before: the last renewal the store took plus
    /// [`Timing::hold`]; `None` unless it holds the lease.
    pub fn holds_until(&self) -> Option<Duration> {
        match self.role {
            Role::Holder { renewed_at, .. } => Some(renewed_at + self.timing.hold()),
            Role::Follower { .. } | Role::Released => None,
        }
    }

    /// Whether this node holds the lease (it may have stopped deleting
    /// while its renewals fail: [`Election::holds`]).
    pub fn is_holder(&self) -> bool {
        matches!(self.role, Role::Holder { .. })
    }

    /// How long the lease has gone unchanged as this node sees it at
    /// `now`: for the holder, since it sent the last renewal the store
    /// took; for another node, since it first saw the lease's current
    /// ETag. `None` before this node has seen a lease. Over
    /// [`Timing::lease`] plus [`Timing::follow`], the prefix has no
    /// evictor (`docs/s3-gateway.md`, "A fleet on one bucket").
    pub fn unchanged_for(&self, now: Duration) -> Option<Duration> {
        match &self.role {
            Role::Holder { renewed_at, .. } => Some(now.saturating_sub(*renewed_at)),
            Role::Follower { seen, .. } => seen
                .as_ref()
                .map(|(_, first_seen)| now.saturating_sub(*first_seen)),
            Role::Released => None,
        }
    }

    /// The last lease body read (another holder's), or this node's own.
    pub fn holder(&self) -> Option<&LeaseBody> {
        self.holder.as_ref()
    }

    /// This node's id.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The figures so far.
    pub fn figures(&self) -> ElectionFigures {
        self.figures
    }

    /// What to ask at `now`; `published` is the holder's view for the body
    /// of a write (its `holder`, `renewals` and `since_unix` are set here).
    pub fn next(&mut self, now: Duration, published: &LeaseBody, unix_now: u64) -> LeaseStep {
        if now < self.next_at {
            return LeaseStep::Wait(self.next_at);
        }
        self.sent_at = now;
        let body = |renewals, since_unix| LeaseBody {
            holder: self.node.clone(),
            renewals,
            since_unix,
            ..published.clone()
        };
        match &self.role {
            Role::Released => LeaseStep::Wait(Duration::MAX),
            Role::Follower { want: None, .. } => {
                self.figures.reads += 1;
                LeaseStep::Read
            }
            Role::Follower {
                want: Some(condition),
                ..
            } => {
                self.figures.writes += 1;
                LeaseStep::Write {
                    condition: condition.clone(),
                    body: body(0, unix_now),
                }
            }
            Role::Holder { verify: true, .. } => {
                self.figures.reads += 1;
                LeaseStep::Read
            }
            Role::Holder {
                etag,
                renewals,
                since_unix,
                ..
            } => {
                self.figures.writes += 1;
                LeaseStep::Write {
                    condition: Condition::Matches(etag.clone()),
                    body: body(renewals + 1, *since_unix),
                }
            }
        }
    }

    /// The store answered the step [`Election::next`] gave at its `now`;
    /// `now` is when the answer came; `written` is the body of a write.
    pub fn answered(&mut self, now: Duration, answer: LeaseAnswer, written: Option<&LeaseBody>) {
        if matches!(self.role, Role::Released) {
            return;
        }
        let timing = self.timing;
        let mine = match &answer {
            LeaseAnswer::Found(_, Some(body)) => self.mine(body),
            _ => false,
        };
        match (&mut self.role, answer) {
            (Role::Follower { .. }, LeaseAnswer::Absent) => {
                self.holder = None;
                self.follow(None, Some(Condition::Absent), now);
            }
            (Role::Follower { seen, .. }, LeaseAnswer::Found(etag, body)) => {
                let seen = seen.take();
                self.saw(now, seen, etag, body);
            }
            (Role::Follower { want, .. }, LeaseAnswer::Written(etag)) => {
                self.figures.taken += 1;
                self.progress_at = Some(self.sent_at);
                let created = matches!(want, Some(Condition::Absent)) || self.own;
                let body = written.cloned().unwrap_or_default();
                self.role = Role::Holder {
                    etag,
                    renewed_at: self.sent_at,
                    since_unix: body.since_unix,
                    renewals: body.renewals,
                    verify: false,
                    deletes_from: (self.sent_at + timing.hold() * u32::from(created))
                        .max(self.wait_until),
                };
                self.holder = Some(body);
                self.next_at = self.sent_at + timing.renew();
            }
            (
                Role::Holder {
                    etag,
                    renewed_at,
                    renewals,
                    verify,
                    ..
                },
                LeaseAnswer::Written(new),
            ) => {
                *etag = new;
                *renewed_at = self.sent_at;
                *renewals += 1;
                *verify = false;
                self.progress_at = Some(self.sent_at);
                self.holder = written.cloned();
                self.next_at = self.sent_at + timing.renew();
            }
            (Role::Holder { .. }, LeaseAnswer::Conflict) => {
                self.figures.lost += 1;
                self.follow(None, None, now);
            }
            (Role::Follower { seen, .. }, LeaseAnswer::Conflict) => {
                let seen = seen.take();
                self.follow(seen, None, now);
            }
            (Role::Holder { verify, .. }, LeaseAnswer::Failed) => {
                self.figures.failures += 1;
                *verify = true;
                self.next_at = now + timing.renew().min(timing.follow());
            }
            (Role::Follower { want, .. }, LeaseAnswer::Failed) => {
                self.figures.failures += 1;
                *want = None;
                self.next_at = now + timing.renew().min(timing.follow());
            }
            (Role::Holder { .. }, LeaseAnswer::Absent) => {
                self.figures.lost += 1;
                self.holder = None;
                self.follow(None, Some(Condition::Absent), now);
            }
            (
                Role::Holder {
                    etag,
                    verify: verify @ true,
                    ..
                },
                LeaseAnswer::Found(found, body),
            ) => {
                if mine {
                    *etag = found;
                    *verify = false;
                    self.next_at = now;
                } else {
                    self.figures.lost += 1;
                    self.saw(now, None, found, body);
                }
            }
            (Role::Holder { verify: false, .. }, LeaseAnswer::Found(..)) | (Role::Released, _) => {}
        }
    }

    /// Gives the lease up as this node stops: the write that releases it
    /// (its body with `released` set, `If-Match` its ETag), for the driver
    /// to send once; `None` unless it holds the lease. Either way this node
    /// is done: it deletes no more ([`Election::holds`] is false), asks
    /// nothing more, and ignores answers to requests sent before, so none
    /// can make it a holder again. Any node that reads the released lease
    /// takes it over at once.
    pub fn release(&mut self, now: Duration, published: &LeaseBody) -> Option<LeaseStep> {
        let role = std::mem::replace(&mut self.role, Role::Released);
        let Role::Holder {
            etag,
            renewals,
            since_unix,
            deletes_from,
            ..
        } = role
        else {
            return None;
        };
        self.next_at = Duration::MAX;
        let wait = deletes_from.saturating_sub(now);
        Some(LeaseStep::Write {
            condition: Condition::Matches(etag),
            body: LeaseBody {
                holder: self.node.clone(),
                renewals,
                since_unix,
                released: true,
                wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                ..published.clone()
            },
        })
    }

    /// Whether `body` is this node's own lease, not given up: a write of
    /// its own that the store applied although its answer was lost.
    fn mine(&self, body: &LeaseBody) -> bool {
        body.holder == self.node && !body.released
    }

    /// A lease read at `now` with `etag` and `body`, `seen` the ETag this
    /// node saw before and since when: taken over at once when it is
    /// released or this node's own, after a whole lease of the same ETag
    /// otherwise.
    fn saw(
        &mut self,
        now: Duration,
        seen: Option<(String, Duration)>,
        etag: String,
        body: Option<LeaseBody>,
    ) {
        let first_seen = match seen {
            Some((known, since)) if known == etag => since,
            _ => now,
        };
        self.own = body.as_ref().is_some_and(|b| self.mine(b));
        let released = body.as_ref().filter(|b| b.released);
        // A releaser never waits more than half a lease (rule 1); a body
        // from another writer cannot make the taker wait longer.
        let wait = released.map_or(Duration::ZERO, |b| Duration::from_millis(b.wait_ms));
        self.wait_until = now + wait.min(self.timing.hold());
        let free = self.own || released.is_some();
        self.progress_of(now, body.as_ref());
        self.holder = body;
        let due = free || now >= first_seen + self.timing.lease;
        let want = due.then(|| Condition::Matches(etag.clone()));
        self.next_at = if due { now } else { now + self.timing.follow() };
        self.role = Role::Follower {
            seen: Some((etag, first_seen)),
            want,
        };
    }

    fn follow(&mut self, seen: Option<(String, Duration)>, want: Option<Condition>, now: Duration) {
        self.role = Role::Follower { seen, want };
        self.next_at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn timing() -> Timing {
        Timing {
            lease: 30 * S,
            ..Timing::default()
        }
    }

    fn step(e: &mut Election, now: Duration) -> LeaseStep {
        e.next(now, &LeaseBody::default(), 0)
    }

    fn take(e: &mut Election, now: Duration, etag: &str) {
        assert_eq!(step(e, now), LeaseStep::Read);
        let released = LeaseBody {
            holder: "z".into(),
            released: true,
            ..LeaseBody::default()
        };
        e.answered(now, LeaseAnswer::Found("e0".into(), Some(released)), None);
        let LeaseStep::Write { condition, body } = step(e, now) else {
            panic!("no write")
        };
        assert_eq!(condition, Condition::Matches("e0".into()));
        e.answered(now, LeaseAnswer::Written(etag.into()), Some(&body));
    }

    /// Creates the lease for `e` at `now` (none was there).
    fn create(e: &mut Election, now: Duration, etag: &str) {
        assert_eq!(step(e, now), LeaseStep::Read);
        e.answered(now, LeaseAnswer::Absent, None);
        let LeaseStep::Write { condition, body } = step(e, now) else {
            panic!("no write")
        };
        assert_eq!(condition, Condition::Absent);
        e.answered(now, LeaseAnswer::Written(etag.into()), Some(&body));
    }

    #[test]
    fn a_node_alone_creates_the_lease_renews_it_and_holds_while_it_renews() {
        let mut e = Election::new("a".into(), timing(), Duration::ZERO);
        create(&mut e, Duration::ZERO, "e1");
        assert!(e.is_holder() && !e.holds(Duration::ZERO) && !e.holds(14 * S));
        assert_eq!(step(&mut e, 2 * S), LeaseStep::Wait(5 * S));
        let LeaseStep::Write { condition, body } = step(&mut e, 5 * S) else {
            panic!()
        };
        assert_eq!(condition, Condition::Matches("e1".into()));
        assert_eq!(body.renewals, 1);
        e.answered(6 * S, LeaseAnswer::Written("e2".into()), Some(&body));
        assert!(e.holds(19 * S) && !e.holds(20 * S));
        assert_eq!(e.unchanged_for(26 * S), Some(21 * S));
    }

    #[test]
    fn a_follower_takes_over_only_after_a_whole_lease_of_the_same_etag() {
        let mut f = Election::new("b".into(), timing(), Duration::ZERO);
        let mut now = Duration::ZERO;
        let mut wrote = None;
        while now < 100 * S {
            match step(&mut f, now) {
                LeaseStep::Read => f.answered(now, LeaseAnswer::Found("e1".into(), None), None),
                LeaseStep::Write { condition, .. } => {
                    wrote = Some((now, condition));
                    break;
                }
                LeaseStep::Wait(until) => now = until,
            }
        }
        assert!(f.unchanged_for(now).is_some_and(|d| d >= 30 * S));
        let (at, condition) = wrote.unwrap();
        assert_eq!(condition, Condition::Matches("e1".into()));
        assert!(at >= 30 * S && at <= 40 * S, "{at:?}");
    }

    #[test]
    fn a_changing_etag_keeps_followers_off_and_a_lost_race_makes_a_follower() {
        let mut f = Election::new("b".into(), timing(), Duration::ZERO);
        for i in 0..20u32 {
            let now = i * 10 * S;
            assert_eq!(step(&mut f, now), LeaseStep::Read);
            f.answered(now, LeaseAnswer::Found(format!("e{i}"), None), None);
        }
        let mut h = Election::new("a".into(), timing(), Duration::ZERO);
        take(&mut h, Duration::ZERO, "e1");
        let LeaseStep::Write { .. } = step(&mut h, 5 * S) else {
            panic!()
        };
        h.answered(5 * S, LeaseAnswer::Conflict, None);
        assert!(!h.is_holder() && !h.holds(5 * S));
        assert_eq!(h.figures().lost, 1);
        assert_eq!(step(&mut h, 5 * S), LeaseStep::Read);
    }

    #[test]
    fn a_holder_whose_renewals_fail_stops_deleting_before_anyone_may_take_over() {
        let mut h = Election::new("a".into(), timing(), Duration::ZERO);
        take(&mut h, Duration::ZERO, "e1");
        let mut now = 5 * S;
        while now < 40 * S {
            if let LeaseStep::Write { .. } = step(&mut h, now) {
                h.answered(now + S, LeaseAnswer::Failed, None);
            }
            now += S;
        }
        assert!(h.is_holder());
        assert!(!h.holds(15 * S));
    }

    fn found(holder: &str, released: bool) -> Option<LeaseBody> {
        Some(LeaseBody {
            holder: holder.into(),
            released,
            ..LeaseBody::default()
        })
    }

    #[test]
    fn a_released_lease_is_taken_over_at_the_first_reading() {
        let mut h = Election::new("a".into(), timing(), Duration::ZERO);
        take(&mut h, Duration::ZERO, "e1");
        let Some(LeaseStep::Write { condition, body }) = h.release(S, &LeaseBody::default()) else {
            panic!("no release")
        };
        assert_eq!(condition, Condition::Matches("e1".into()));
        assert!(body.released && body.holder == "a");
        assert!(!h.is_holder() && !h.holds(S));
        assert!(h.release(S, &LeaseBody::default()).is_none());
        // A renewal or a read sent before the release answers after it:
        // nothing changes, and the node asks nothing more.
        for late in [
            LeaseAnswer::Conflict,
            LeaseAnswer::Written("e9".into()),
            LeaseAnswer::Found("e2".into(), Some(body.clone())),
            LeaseAnswer::Absent,
            LeaseAnswer::Failed,
        ] {
            h.answered(8 * S, late.clone(), Some(&LeaseBody::default()));
            assert!(!h.is_holder() && !h.holds(8 * S), "{late:?}");
            assert_eq!(
                step(&mut h, 9 * S),
                LeaseStep::Wait(Duration::MAX),
                "{late:?}"
            );
        }
        for node in ["b", "a"] {
            let mut f = Election::new(node.into(), timing(), 7 * S);
            assert_eq!(step(&mut f, 7 * S), LeaseStep::Read);
            f.answered(
                7 * S,
                LeaseAnswer::Found("e2".into(), Some(body.clone())),
                None,
            );
            let LeaseStep::Write { condition, .. } = step(&mut f, 7 * S) else {
                panic!("{node} waits for a released lease")
            };
            assert_eq!(condition, Condition::Matches("e2".into()));
        }
    }

    /// A creator that stops before its half lease is up passes what is
    /// left of its wait to the node that takes the released lease over:
    /// the holder the lease was deleted under may still delete until then.
    #[test]
    fn a_released_lease_passes_on_what_is_left_of_its_creators_wait() {
        let mut a = Election::new("a".into(), timing(), Duration::ZERO);
        assert_eq!(step(&mut a, Duration::ZERO), LeaseStep::Read);
        a.answered(Duration::ZERO, LeaseAnswer::Absent, None);
        let LeaseStep::Write { condition, body } = step(&mut a, Duration::ZERO) else {
            panic!("no creation")
        };
        assert_eq!(condition, Condition::Absent);
        a.answered(S, LeaseAnswer::Written("e1".into()), Some(&body));
        assert!(a.is_holder() && !a.holds(5 * S), "a creator waits");
        let Some(LeaseStep::Write { body, .. }) = a.release(5 * S, &LeaseBody::default()) else {
            panic!("no release")
        };
        assert_eq!(body.wait_ms, 10_000, "15 s from its sending, 5 s gone");
        let text = serde_json::to_string(&body).unwrap();
        let back: LeaseBody = serde_json::from_str(&text).unwrap();
        assert_eq!(back, body);
        let mut b = Election::new("b".into(), timing(), 6 * S);
        assert_eq!(step(&mut b, 6 * S), LeaseStep::Read);
        b.answered(6 * S, LeaseAnswer::Found("e2".into(), Some(body)), None);
        let LeaseStep::Write { body: taken, .. } = step(&mut b, 6 * S) else {
            panic!("a released lease is taken over at once")
        };
        b.answered(6 * S, LeaseAnswer::Written("e3".into()), Some(&taken));
        assert!(b.is_holder() && !b.holds(15 * S), "it waits what was left");
        assert!(b.holds(16 * S));
        let forged = LeaseBody {
            released: true,
            wait_ms: u64::MAX,
            ..LeaseBody::default()
        };
        let mut c = Election::new("c".into(), timing(), Duration::ZERO);
        step(&mut c, Duration::ZERO);
        let forged = LeaseAnswer::Found("f".into(), Some(forged));
        c.answered(Duration::ZERO, forged, None);
        assert_eq!(c.wait_until, timing().hold(), "a forged wait: half a lease");
    }

    #[test]
    fn a_lost_answer_is_checked_by_a_read_before_the_next_write() {
        for (answer, holds_after, etag_after) in [
            (
                LeaseAnswer::Found("e2".into(), found("a", false)),
                true,
                Some("e2"),
            ),
            (
                LeaseAnswer::Found("e9".into(), found("b", false)),
                false,
                None,
            ),
            (LeaseAnswer::Found("e9".into(), None), false, None),
            (LeaseAnswer::Absent, false, None),
        ] {
            let mut h = Election::new("a".into(), timing(), Duration::ZERO);
            take(&mut h, Duration::ZERO, "e1");
            let LeaseStep::Write { .. } = step(&mut h, 5 * S) else {
                panic!()
            };
            h.answered(6 * S, LeaseAnswer::Failed, None);
            assert!(h.is_holder() && h.holds(6 * S));
            assert_eq!(step(&mut h, 11 * S), LeaseStep::Read, "{answer:?}");
            h.answered(11 * S, answer.clone(), None);
            assert_eq!(h.is_holder(), holds_after, "{answer:?}");
            match (etag_after, step(&mut h, 11 * S)) {
                (Some(etag), LeaseStep::Write { condition, .. }) => {
                    assert_eq!(condition, Condition::Matches(etag.into()))
                }
                (None, LeaseStep::Write { condition, .. }) => {
                    assert_eq!(answer, LeaseAnswer::Absent);
                    assert_eq!(condition, Condition::Absent)
                }
                (None, LeaseStep::Read | LeaseStep::Wait(_)) => {
                    assert_ne!(answer, LeaseAnswer::Absent)
                }
                (Some(_), other) => panic!("{answer:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_renewal_of_a_deleted_lease_creates_it_again_at_once() {
        let mut h = Election::new("a".into(), timing(), Duration::ZERO);
        take(&mut h, Duration::ZERO, "e1");
        let LeaseStep::Write { .. } = step(&mut h, 5 * S) else {
            panic!()
        };
        h.answered(5 * S, LeaseAnswer::Absent, None);
        assert!(!h.holds(5 * S));
        let LeaseStep::Write { condition, body } = step(&mut h, 5 * S) else {
            panic!("no new lease")
        };
        assert_eq!(condition, Condition::Absent);
        h.answered(5 * S, LeaseAnswer::Written("e3".into()), Some(&body));
        assert!(
            h.is_holder() && !h.holds(5 * S),
            "a creator waits half a lease"
        );
        let LeaseStep::Write { body, .. } = step(&mut h, 10 * S) else {
            panic!("no renewal")
        };
        h.answered(10 * S, LeaseAnswer::Written("e4".into()), Some(&body));
        assert!(!h.holds(19 * S) && h.holds(20 * S) && !h.holds(25 * S));
    }

    #[test]
    fn a_late_renewal_answered_412_is_taken_back_as_its_own() {
        let mut h = Election::new("a".into(), timing(), Duration::ZERO);
        take(&mut h, Duration::ZERO, "e1");
        let LeaseStep::Write { .. } = step(&mut h, 5 * S) else {
            panic!()
        };
        h.answered(6 * S, LeaseAnswer::Conflict, None);
        assert!(!h.is_holder());
        assert_eq!(step(&mut h, 6 * S), LeaseStep::Read);
        h.answered(
            6 * S,
            LeaseAnswer::Found("e2".into(), found("a", false)),
            None,
        );
        let LeaseStep::Write { condition, .. } = step(&mut h, 6 * S) else {
            panic!("its own lease waits a whole lease")
        };
        assert_eq!(condition, Condition::Matches("e2".into()));
    }

    /// "No evictor" follows the fleet's progress, not the ETag: a body
    /// rewritten with new ETags and the same renewal count is none, a
    /// holder's renewals are.
    #[test]
    fn no_evictor_counts_from_the_last_progress_not_the_last_etag() {
        let mut f = Election::new("b".into(), timing(), Duration::ZERO);
        let body = |renewals| LeaseBody {
            holder: "a".into(),
            renewals,
            ..LeaseBody::default()
        };
        for i in 0..12u32 {
            let now = i * 10 * S;
            assert_eq!(step(&mut f, now), LeaseStep::Read);
            f.answered(
                now,
                LeaseAnswer::Found(format!("x{i}"), Some(body(3))),
                None,
            );
        }
        assert_eq!(f.no_evictor_for(110 * S), Some(110 * S));
        assert!(
            f.unchanged_for(110 * S) < Some(S),
            "the ETag changed at each read"
        );
        assert_eq!(step(&mut f, 120 * S), LeaseStep::Read);
        f.answered(
            120 * S,
            LeaseAnswer::Found("e5".into(), Some(body(5))),
            None,
        );
        assert_eq!(f.no_evictor_for(125 * S), Some(5 * S));
        assert_eq!(step(&mut f, 130 * S), LeaseStep::Read);
        let again = "the holder created the lease again after it was deleted";
        f.answered(
            130 * S,
            LeaseAnswer::Found("e6".into(), Some(body(0))),
            None,
        );
        assert_eq!(f.no_evictor_for(131 * S), Some(S), "{again}");
        let mut h = Election::new("a".into(), timing(), Duration::ZERO);
        assert_eq!(h.no_evictor_for(4 * S), Some(4 * S), "from its start");
        take(&mut h, 4 * S, "e1");
        assert_eq!(h.no_evictor_for(9 * S), Some(5 * S));
        h.release(S, &LeaseBody::default());
        assert_eq!(h.no_evictor_for(9 * S), None);
    }
}
