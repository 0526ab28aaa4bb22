//! A simulated node's tasks, as the gateway's driver runs them
//! ([`crate::bound`]): LMCache's writer, the lease and reports, the
//! evictor. Each sends its [`Node`](crate::node::Node)'s requests
//! to the store in memory one after another, each answered
//! [`Config::latency`](super::Config::latency) later.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, SystemTime};

use super::faults::{draw, Fate};
use super::{Due, Kind, Sim};
use crate::evictor::{EvictCycle, EvictStep};
use crate::lease::{Condition, LeaseAnswer, LeaseBody, LeaseStep};
use crate::node::LeaseChange;
use crate::report::{ReportBody, MAX_REPORT_KEYS};
use crate::view::{Entry, StoredObject};
use crate::{report_key, reports_folder};

/// Where the lease-and-reports task is.
#[derive(Debug, Default)]
pub(super) enum LeaseWork {
    /// It steps its election next.
    #[default]
    Idle,
    /// A lease request was sent: its answer, and the body of a write.
    Answer(LeaseAnswer, Option<LeaseBody>),
    /// A report was sent, and whether the node saw it stored; then it
    /// waits until the election's time (the node's monotonic clock).
    Reported(ReportBody, bool, Duration),
}

/// A write the store applies late ([`Fate::Late`]).
#[derive(Debug)]
pub(super) enum LateWrite {
    /// A write of the lease.
    Lease(Condition, LeaseBody),
    /// A node's report.
    Report(ReportBody),
}

/// Where a listing is: not begun, after a key, or all its pages in.
#[derive(Debug)]
pub(super) enum Cursor {
    Start,
    After(String),
    Done,
}

impl Cursor {
    fn after(next: Option<String>) -> Self {
        next.map_or(Cursor::Done, Cursor::After)
    }
}

/// A deletion's answer to come: when, its sending's number, key, bytes
/// and whether the store deleted it.
type Answer = (Duration, u64, String, u64, bool);

/// An eviction cycle in the simulation: the driver's rule
/// ([`EvictCycle`]) and the answers not yet come, by time, then by
/// sending.
#[derive(Debug, Default)]
pub(super) struct Cycle {
    cycle: EvictCycle,
    pending: BinaryHeap<Reverse<Answer>>,
    sent: u64,
}

/// Where the evictor's task is: the step it works through.
#[derive(Debug, Default)]
pub(super) enum EvictWork {
    /// It steps its evictor next.
    #[default]
    Idle,
    /// A listing of the prefix, its LMCache objects so far.
    Listing(Vec<StoredObject>, Cursor),
    /// A listing of the reports' folder, (node, ETag) so far.
    Folder(Vec<(String, Option<String>)>, Cursor),
    /// The listing failed: the evictor is told so.
    ListingFailed,
    /// The reports to GET, and those read.
    Reading(VecDeque<String>, Vec<(Option<String>, ReportBody)>),
    /// An eviction cycle's deletions in flight.
    Evicting(Box<Cycle>),
    /// The reports of nodes that left, to delete.
    Dropping(VecDeque<String>),
}

impl Sim<'_> {
    /// LMCache writes an object through the node at `at`, and the node
    /// follows the PUT, dated by the store's clock (its `Date`).
    pub(super) fn write(&mut self, slot: usize, at: Duration) {
        let key = self.rng.lmcache_key();
        let bytes = self.config.object_bytes;
        let stamp = self.store_time(at);
        self.store.put_data(key.clone(), bytes, stamp);
        let modified = stamp - self.config.faults.date_behind;
        let m = &mut self.members[slot];
        let now = m.local(at);
        if m.node.stored(now, key, Entry { bytes, modified }) {
            self.notify(slot, Kind::Lease, at);
        }
        self.notify(slot, Kind::Evict, at);
        if let Some(every) = self.write_every {
            self.resume(slot, Kind::Write, at + every);
        }
    }

    /// The lease-and-reports task at `at`: applies the answer in, then
    /// steps the election.
    pub(super) fn lease(&mut self, slot: usize, at: Duration) {
        let m = &mut self.members[slot];
        let now = m.local(at);
        match std::mem::take(&mut m.lease_work) {
            LeaseWork::Idle => {}
            LeaseWork::Answer(answer, written) => {
                let change = m.node.lease_answered(now, answer, written.as_ref());
                self.lease_changed(slot, change);
                self.notify(slot, Kind::Evict, at);
            }
            LeaseWork::Reported(body, stored, until) => {
                m.node.reporter.sent(now, &body, stored);
                let report_at = m.node.reporter.next_at(now);
                let until = m.global(until.min(report_at));
                self.notify(slot, Kind::Evict, at);
                self.wait(slot, Kind::Lease, at, until);
                return;
            }
        }
        self.lease_step(slot, at);
    }

    fn lease_changed(&mut self, slot: usize, change: LeaseChange) {
        match change {
            LeaseChange::Took => {
                self.watch.took();
                self.holders.push(slot);
            }
            LeaseChange::Lost => self.holders.retain(|&s| s != slot),
            LeaseChange::Kept => {}
        }
    }

    fn lease_step(&mut self, slot: usize, at: Duration) {
        let unix_now = self.unix_now(slot, at);
        let now = self.members[slot].local(at);
        let Some(step) = self.members[slot].node.lease_step(now, unix_now) else {
            return;
        };
        let (work, fate) = match step {
            LeaseStep::Read => {
                let fate = self.lease_fate(false);
                let answer = match fate {
                    Fate::Answered(_) => self.store.get_lease(&self.lease_key),
                    _ => LeaseAnswer::Failed,
                };
                (LeaseWork::Answer(answer, None), fate)
            }
            LeaseStep::Write { condition, body } => {
                let fate = self.lease_fate(true);
                let stamp = self.store_time(at);
                let answer = match fate {
                    Fate::Answered(_) | Fate::Lost(_) => {
                        self.store
                            .put_lease(&self.lease_key, &condition, stamp, &body)
                    }
                    Fate::Late(after, _) => {
                        self.late_write(at + after, LateWrite::Lease(condition, body.clone()));
                        LeaseAnswer::Failed
                    }
                    Fate::Refused(_) => LeaseAnswer::Failed,
                };
                let answer = if fate.answered() {
                    answer
                } else {
                    LeaseAnswer::Failed
                };
                (LeaseWork::Answer(answer, Some(body)), fate)
            }
            LeaseStep::Wait(until) => return self.report(slot, at, until),
        };
        self.members[slot].lease_work = work;
        let after = fate.after();
        self.resume(slot, Kind::Lease, at + after);
    }

    /// The fate of a request ([`draw`]).
    pub(super) fn fate(&mut self, late_ok: bool) -> Fate {
        let f = &self.config.faults;
        draw(f, self.config.latency, &mut self.rng, late_ok, f.timeout)
    }

    /// The fate of a lease request, which the driver gives up after a
    /// renewal period.
    fn lease_fate(&mut self, late_ok: bool) -> Fate {
        let f = &self.config.faults;
        let renew = self.config.spec.timing.renew();
        draw(f, self.config.latency, &mut self.rng, late_ok, renew)
    }

    fn late_write(&mut self, at: Duration, write: LateWrite) {
        self.late.push(Some(write));
        let i = self.late.len() - 1;
        self.push(at, Due::Late(i));
    }

    /// The late write `i` reaches the store at `at`.
    pub(super) fn land(&mut self, i: usize, at: Duration) {
        let stamp = self.store_time(at);
        match self.late[i].take() {
            Some(LateWrite::Lease(condition, body)) => {
                self.store
                    .put_lease(&self.lease_key, &condition, stamp, &body);
            }
            Some(LateWrite::Report(body)) => {
                self.store.put_report(&report_key(&body.node), stamp, &body);
            }
            None => {}
        }
    }

    /// The election waits until `until` (the node's clock): the node
    /// sends its report first if one is due, and waits no longer than
    /// until the next may be due.
    fn report(&mut self, slot: usize, at: Duration, until: Duration) {
        let m = &mut self.members[slot];
        let now = m.local(at);
        let Some(body) = m.node.report_due(now) else {
            let report_at = m.node.reporter.next_at(now);
            let until = m.global(until.min(report_at));
            return self.wait(slot, Kind::Lease, at, until);
        };
        let stamp = self.store_time(at);
        let fate = self.fate(true);
        match fate {
            Fate::Answered(_) | Fate::Lost(_) => {
                self.store.put_report(&report_key(&body.node), stamp, &body);
            }
            Fate::Late(after, _) => self.late_write(at + after, LateWrite::Report(body.clone())),
            Fate::Refused(_) => {}
        }
        self.members[slot].lease_work = LeaseWork::Reported(body, fate.answered(), until);
        let after = fate.after();
        self.resume(slot, Kind::Lease, at + after);
    }

    /// The evictor's task at `at`: goes on with its step, or takes the
    /// next one.
    pub(super) fn evict(&mut self, slot: usize, at: Duration) {
        let m = &mut self.members[slot];
        let work = match std::mem::take(&mut m.evict_work) {
            EvictWork::Idle => match m.node.evict_step(m.local(at)) {
                EvictStep::List => {
                    m.listing_from = SystemTime::UNIX_EPOCH + super::STORE_EPOCH + at;
                    EvictWork::Listing(Vec::new(), Cursor::Start)
                }
                EvictStep::ReadReports => EvictWork::Folder(Vec::new(), Cursor::Start),
                EvictStep::Evict(chosen) => EvictWork::Evicting(Box::new(Cycle {
                    cycle: EvictCycle::new(chosen),
                    ..Cycle::default()
                })),
                EvictStep::DeleteReports(nodes) => EvictWork::Dropping(nodes.into()),
                EvictStep::Wait(until) => {
                    let until = m.global(until);
                    return self.wait(slot, Kind::Evict, at, until);
                }
            },
            going => going,
        };
        match self.send(slot, at, work) {
            Some((work, after)) => {
                self.members[slot].evict_work = work;
                self.resume(slot, Kind::Evict, at + after);
            }
            None => {
                self.members[slot].tasks[Kind::Evict as usize].permit = true;
                self.resume(slot, Kind::Evict, at);
            }
        }
    }

    /// Sends `work`'s next request at `at` and returns where it is then
    /// and when its answer comes; `None` once its answers are all in and
    /// given to the evictor.
    fn send(
        &mut self,
        slot: usize,
        at: Duration,
        work: EvictWork,
    ) -> Option<(EvictWork, Duration)> {
        let now = self.members[slot].local(at);
        let latency = self.config.latency;
        match work {
            EvictWork::Idle => None,
            EvictWork::ListingFailed => {
                self.members[slot].node.listed_at(now, None);
                None
            }
            EvictWork::Listing(found, Cursor::Done) => {
                let m = &mut self.members[slot];
                m.listed_from = m.listing_from;
                m.node.listed_at(now, Some(found));
                None
            }
            EvictWork::Listing(mut found, cursor) => {
                let fate = self.fate(false);
                if !fate.answered() {
                    self.store.check_listing();
                    return Some((EvictWork::ListingFailed, fate.after()));
                }
                let (page, next) = self.store.list_page(after(&cursor));
                found.extend(page);
                Some((EvictWork::Listing(found, Cursor::after(next)), fate.after()))
            }
            EvictWork::Folder(listed, Cursor::Done) => {
                let evictor = &self.members[slot].node.evictor;
                let wanted = evictor.to_read(&listed).into_iter().map(str::to_string);
                let reading = EvictWork::Reading(wanted.collect(), Vec::new());
                self.send(slot, at, reading)
            }
            EvictWork::Folder(mut listed, cursor) => {
                let fate = self.fate(false);
                if !fate.answered() {
                    self.store.check_listing();
                    let none = EvictWork::Reading(VecDeque::new(), Vec::new());
                    return Some((none, fate.after()));
                }
                let folder = reports_folder();
                let (page, next) = self.store.list_folder_page(&folder, after(&cursor));
                listed.extend(page);
                let next = next.filter(|_| listed.len() < MAX_REPORT_KEYS);
                Some((EvictWork::Folder(listed, Cursor::after(next)), fate.after()))
            }
            EvictWork::Reading(mut wanted, mut read) => match wanted.pop_front() {
                Some(node) => {
                    let fate = self.fate(false);
                    let report = self.store.get_report(&report_key(&node));
                    if fate.answered() {
                        read.extend(report.map(|(etag, mut body)| {
                            body.node = node;
                            (Some(etag), body)
                        }));
                    }
                    Some((EvictWork::Reading(wanted, read), fate.after()))
                }
                None => {
                    self.members[slot].node.reports_read(now, &read);
                    None
                }
            },
            EvictWork::Evicting(cycle) => self.delete_some(slot, at, cycle),
            EvictWork::Dropping(mut left) => {
                let node = left.pop_front()?;
                self.store.delete(&report_key(&node));
                Some((EvictWork::Dropping(left), latency))
            }
        }
    }

    /// Goes on with an eviction cycle at `at`, as the driver does, through
    /// the same [`EvictCycle`]: takes the answers come by then, sends what
    /// the cycle gives (each with its own fate, each only while the node
    /// holds the lease at its sending; the store applies each at once),
    /// and waits for the next answer, while the node's other tasks go on.
    /// Once no answer is awaited, gives the results to the evictor.
    fn delete_some(
        &mut self,
        slot: usize,
        at: Duration,
        mut c: Box<Cycle>,
    ) -> Option<(EvictWork, Duration)> {
        let listed = self.members[slot].listed_from;
        loop {
            while c.pending.peek().is_some_and(|Reverse(p)| p.0 <= at) {
                let Reverse((_, _, key, bytes, deleted)) = c.pending.pop()?;
                c.cycle.answered(key, bytes, deleted);
            }
            let mut answered_now = false;
            while let Some((key, bytes)) = c.cycle.send() {
                c.sent += 1;
                let m = &self.members[slot];
                let (mut deleted, mut answer) = (false, at);
                if m.node.holds(m.local(at)) {
                    let fate = self.fate(false);
                    self.store.evict(&key, listed, fate.applied());
                    deleted = fate.answered();
                    answer = at + fate.after();
                }
                answered_now |= answer <= at;
                c.pending
                    .push(Reverse((answer, c.sent, key, bytes, deleted)));
            }
            if !answered_now {
                break;
            }
        }
        match c.pending.peek() {
            Some(Reverse(next)) => {
                let after = next.0 - at;
                Some((EvictWork::Evicting(c), after))
            }
            None => {
                let m = &mut self.members[slot];
                let now = m.local(at);
                m.node.evictor.evicted(now, &c.cycle.results());
                None
            }
        }
    }
}

fn after(cursor: &Cursor) -> Option<&str> {
    match cursor {
        Cursor::After(key) => Some(key),
        Cursor::Start | Cursor::Done => None,
    }
}
