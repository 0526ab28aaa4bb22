//! A simulated node's tasks, as the gateway's driver runs them
//! ([`crate::bound`]): LMCache's writer, the lease and reports, the
//! evictor. Each sends its [`Node`](crate::fleet::node::Node)'s requests
//! to the store in memory one after another, each answered
//! [`Config::latency`](super::Config::latency) later.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Kind, Sim, DELETES_IN_FLIGHT};
use crate::fleet::evictor::EvictStep;
use crate::fleet::lease::{LeaseAnswer, LeaseBody, LeaseStep};
use crate::fleet::node::LeaseChange;
use crate::fleet::report::ReportBody;
use crate::fleet::view::{Entry, StoredObject};
use crate::fleet::{report_key, reports_folder};

/// Where the lease-and-reports task is.
#[derive(Debug, Default)]
pub(super) enum LeaseWork {
    /// It steps its election next.
    #[default]
    Idle,
    /// A lease request was sent: its answer, and the body of a write.
    Answer(LeaseAnswer, Option<LeaseBody>),
    /// A report was sent; then it waits until the election's time (the
    /// node's monotonic clock).
    Reported(ReportBody, Duration),
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
    /// The reports to GET, and those read.
    Reading(VecDeque<String>, Vec<(Option<String>, ReportBody)>),
    /// The victims left, and the deletions done (key, bytes, deleted).
    Evicting(VecDeque<(String, u64)>, Vec<(String, u64, bool)>),
    /// The reports of nodes that left, to delete.
    Dropping(VecDeque<String>),
}

impl Sim<'_> {
    /// LMCache writes an object through the node at `at`, and the node
    /// follows the PUT, dated by the store's clock (its `Date`).
    pub(super) fn write(&mut self, slot: usize, at: Duration) {
        let key = self.rng.lmcache_key();
        let bytes = self.config.object_bytes;
        let modified = self.store_time(at);
        self.store.put_data(key.clone(), bytes, modified);
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
            LeaseWork::Reported(body, until) => {
                m.node.reporter.sent(now, &body, true);
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
        let work = match step {
            LeaseStep::Read => LeaseWork::Answer(self.store.get_lease(&self.lease_key), None),
            LeaseStep::Write { condition, body } => {
                let stamp = self.store_time(at);
                let answer = self
                    .store
                    .put_lease(&self.lease_key, &condition, stamp, &body);
                LeaseWork::Answer(answer, Some(body))
            }
            LeaseStep::Wait(until) => return self.report(slot, at, until),
        };
        self.members[slot].lease_work = work;
        self.resume(slot, Kind::Lease, at + self.config.latency);
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
        self.store.put_report(&report_key(&body.node), stamp, &body);
        self.members[slot].lease_work = LeaseWork::Reported(body, until);
        self.resume(slot, Kind::Lease, at + self.config.latency);
    }

    /// The evictor's task at `at`: goes on with its step, or takes the
    /// next one.
    pub(super) fn evict(&mut self, slot: usize, at: Duration) {
        let m = &mut self.members[slot];
        let work = match std::mem::take(&mut m.evict_work) {
            EvictWork::Idle => match m.node.evict_step(m.local(at)) {
                EvictStep::List => EvictWork::Listing(Vec::new(), Cursor::Start),
                EvictStep::ReadReports => EvictWork::Folder(Vec::new(), Cursor::Start),
                EvictStep::Evict(chosen) => EvictWork::Evicting(chosen.into(), Vec::new()),
                EvictStep::DeleteReports(nodes) => EvictWork::Dropping(nodes.into()),
                EvictStep::Wait(until) => {
                    let until = m.global(until);
                    return self.wait(slot, Kind::Evict, at, until);
                }
            },
            going => going,
        };
        match self.send(slot, at, work) {
            Some(work) => {
                self.members[slot].evict_work = work;
                self.resume(slot, Kind::Evict, at + self.config.latency);
            }
            None => {
                self.members[slot].tasks[Kind::Evict as usize].permit = true;
                self.resume(slot, Kind::Evict, at);
            }
        }
    }

    /// Sends `work`'s next request at `at` and returns where it is then;
    /// `None` once its answers are all in and given to the evictor.
    fn send(&mut self, slot: usize, at: Duration, work: EvictWork) -> Option<EvictWork> {
        let now = self.members[slot].local(at);
        match work {
            EvictWork::Idle => None,
            EvictWork::Listing(found, Cursor::Done) => {
                self.members[slot].node.listed_at(now, Some(found));
                None
            }
            EvictWork::Listing(mut found, cursor) => {
                let (page, next) = self.store.list_page(after(&cursor));
                found.extend(page);
                Some(EvictWork::Listing(found, Cursor::after(next)))
            }
            EvictWork::Folder(listed, Cursor::Done) => {
                let evictor = &self.members[slot].node.evictor;
                let wanted = evictor.to_read(&listed).into_iter().map(str::to_string);
                let reading = EvictWork::Reading(wanted.collect(), Vec::new());
                self.send(slot, at, reading)
            }
            EvictWork::Folder(mut listed, cursor) => {
                let folder = reports_folder();
                let (page, next) = self.store.list_folder_page(&folder, after(&cursor));
                listed.extend(page);
                Some(EvictWork::Folder(listed, Cursor::after(next)))
            }
            EvictWork::Reading(mut wanted, mut read) => match wanted.pop_front() {
                Some(node) => {
                    let report = self.store.get_report(&report_key(&node));
                    read.extend(report.map(|(etag, body)| (Some(etag), body)));
                    Some(EvictWork::Reading(wanted, read))
                }
                None => {
                    self.members[slot].node.reports_read(now, &read);
                    None
                }
            },
            EvictWork::Evicting(left, results) => self.delete_some(slot, at, left, results),
            EvictWork::Dropping(mut left) => {
                let node = left.pop_front()?;
                self.store.delete(&report_key(&node));
                Some(EvictWork::Dropping(left))
            }
        }
    }

    /// Sends the next [`DELETES_IN_FLIGHT`] deletions of a cycle at `at`,
    /// each only while the node holds the lease (as the driver checks
    /// before each one); `None` once the cycle's answers are all in.
    fn delete_some(
        &mut self,
        slot: usize,
        at: Duration,
        mut left: VecDeque<(String, u64)>,
        mut results: Vec<(String, u64, bool)>,
    ) -> Option<EvictWork> {
        let m = &mut self.members[slot];
        let now = m.local(at);
        if left.is_empty() {
            m.node.evictor.evicted(now, &results);
            return None;
        }
        for _ in 0..DELETES_IN_FLIGHT {
            let Some((key, bytes)) = left.pop_front() else {
                break;
            };
            let holds = self.members[slot].node.holds(now);
            if holds {
                self.store.delete(&key);
            }
            results.push((key, bytes, holds));
        }
        Some(EvictWork::Evicting(left, results))
    }
}

fn after(cursor: &Cursor) -> Option<&str> {
    match cursor {
        Cursor::After(key) => Some(key),
        Cursor::Start | Cursor::Done => None,
    }
}
