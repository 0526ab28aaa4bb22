//! The fleet simulation: N gateways on one prefix, each a [`Node`] (the
//! real [`Election`](super::lease::Election),
//! [`Reporter`](super::report::Reporter),
//! [`Evictor`](super::evictor::Evictor) and [`victims`](super::view::victims)),
//! driven as the gateway's driver (`bound.rs` of `lmcache-s3-gateway`) drives them, against
//! a store in memory ([`MemStore`]) on a simulated clock
//! (`docs/s3-gateway.md`, "A fleet on one bucket").
//!
//! Each node runs the driver's three tasks as state machines: LMCache's
//! writer (a PUT of an object of [`Config::object_bytes`] at its share of
//! [`Config::fleet_bytes_per_s`], followed by the node as the gateway
//! follows it), the lease-and-reports task and the evictor's task. Every
//! request takes [`Config::latency`]: a listing's pages and a reading's
//! GETs go one after another, deletions eight at a time
//! ([`DELETES_IN_FLIGHT`](crate::evictor::DELETES_IN_FLIGHT)). A task
//! that waits is woken as the driver's
//! `Notify` wakes it (a write wakes the evictor, and the reports' task
//! when a report is due). The loop is discrete-event: a heap of the
//! tasks' wake times, so an hour of 1,000 nodes takes seconds.
//!
//! At its start a node does what the gateway's start does: one LIST, and
//! the probe of conditional writes (three PUTs and a DELETE); a store
//! without them ([`Config::conditional_writes`] false) answers `501`, and
//! the node runs [`Mode::EveryNode`]. The [`Config::scenario`] kills
//! nodes (restarted with a new id, or with the id the launch kept),
//! stops them for a while
//! (as SIGSTOP: their monotonic clocks go on), adds and removes nodes.
//! Each node's monotonic clock has its own origin, and its wall clock its
//! own offset from the store's: neither changes a decision.
//!
//! [`Config::faults`] gives each request a fate drawn from the seed
//! ([`Faults`]: slow, lost, late, refused), and the scenario can delete
//! the lease, make it unreadable or forge reports; [`chaos`] draws both
//! from one seed. The store checks every deletion of an evictor against
//! the rules ([`Checks`]).
//!
//! [`run`] gives an [`Outcome`]: the peak of the prefix's LMCache bytes
//! (sampled after every change of the store), the requests by class, and
//! with a lease its takeovers, the time without a node that
//! [`Node::holds`] and the moments with two.

mod faults;
mod outcome;
mod store;
mod tasks;

pub use faults::{chaos, Fate, Faults};
pub use outcome::{LeaseFigures, Outcome, SETTLE};
pub use store::{Checks, MemStore, PutAnswer, Requests, PAGE};

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, SystemTime};

use super::lease::{Condition, LeaseStep};
use super::models::Models;
use super::node::Node;
use super::report::ReportBody;
use super::rule::{BoundRole, BoundSpec};
use super::{lease_key, probe_key, report_key, Mode};
use outcome::Watch;

/// The model of every object the simulated fleet writes, which every node
/// counts from its start (as a launch names its own model).
const SIM_MODEL: &str = "sim-model";
/// Objects under the prefix older than every LMCache object of the fleet
/// that no node may delete: another tier's file, an LMCache object of a
/// model no node writes, and keys that look like the bound's own.
const FOREIGN: [&str; 4] = [
    "other-tier/notes.txt",
    "other-model@00000000@0@00ff",
    ".lmcache-tier/reports-old",
    "sim-model",
];
use tasks::{EvictWork, LeaseWork};

/// LMCache's object size by default: 4 MiB, bytes.
pub const OBJECT_BYTES: u64 = 4 << 20;
/// The store's clock at the simulation's start, since the Unix epoch.
const STORE_EPOCH: Duration = Duration::from_secs(1_750_000_000);

/// One simulation's fleet, store and events.
#[derive(Debug, Clone)]
pub struct Config {
    /// Nodes at the start.
    pub nodes: usize,
    /// The bound: capacity, trigger and target (bytes), and its periods.
    pub spec: BoundSpec,
    /// Whether the store takes conditional writes; without them every
    /// node's probe is answered `501` and it runs [`Mode::EveryNode`].
    pub conditional_writes: bool,
    /// The size of LMCache's objects, bytes.
    pub object_bytes: u64,
    /// What the nodes of the start write together, bytes a second. Each
    /// node writes its share of it, joined ones too.
    pub fleet_bytes_per_s: u64,
    /// The LMCache objects in the prefix at the start, a share of the
    /// capacity, written one a second over the time before.
    pub prefill: f64,
    /// The simulated time.
    pub duration: Duration,
    /// Each request's time from its sending to its answer.
    pub latency: Duration,
    /// How far ahead of the store's clock the nodes' wall clocks are: up
    /// to this, and by all of it on the first node (the first holder).
    pub wall_clock_spread: Duration,
    /// What the nodes' monotonic clocks read at their start (a machine's
    /// uptime): up to this.
    pub uptime_spread: Duration,
    /// What happens, and when.
    pub scenario: Vec<Happening>,
    /// The store's faults ([`Faults::NONE`] by default).
    pub faults: Faults,
    /// The seed of the keys, of the nodes' ids and write phases, and of
    /// the requests' fates.
    pub seed: u64,
}

impl Config {
    /// `nodes` nodes for an hour on a capacity of `capacity_objects`
    /// objects of [`OBJECT_BYTES`] (trigger 0.8, target 0.6 of it, the
    /// default periods) filled to 0.7 of it, on a store with conditional
    /// writes, writing 10 objects a second together, 20 ms a request, all
    /// clocks alike, nothing happening.
    pub fn new(nodes: usize, capacity_objects: u64) -> Self {
        let spec = BoundSpec::new(
            capacity_objects * OBJECT_BYTES,
            0.8,
            0.2,
            BoundRole::Evictor,
        );
        Config {
            nodes,
            spec,
            conditional_writes: true,
            object_bytes: OBJECT_BYTES,
            fleet_bytes_per_s: 10 * OBJECT_BYTES,
            prefill: 0.7,
            duration: Duration::from_secs(3600),
            latency: Duration::from_millis(20),
            wall_clock_spread: Duration::ZERO,
            uptime_spread: Duration::ZERO,
            scenario: Vec::new(),
            faults: Faults::NONE,
            seed: 1,
        }
    }
}

impl Config {
    /// The fleet of the seeded runs (`tests/fleet.rs`,
    /// `benches/fleet_chaos.rs`): 4 nodes on a capacity of 1,000 objects
    /// writing 4 objects a second together (14 capacities an hour), 15
    /// simulated minutes, wall clocks up to 10 min ahead of the store's and
    /// monotonic clocks of origins up to 30 days apart, with the faults and
    /// events [`chaos`] draws from `seed`.
    pub fn chaos(seed: u64) -> Self {
        let base = Config::new(4, 1000);
        let minutes = Duration::from_secs(900);
        let (faults, scenario) = chaos(seed, minutes, base.spec.timing.lease);
        Config {
            fleet_bytes_per_s: 4 * OBJECT_BYTES,
            duration: minutes,
            faults,
            scenario,
            seed,
            wall_clock_spread: Duration::from_secs(600),
            uptime_spread: Duration::from_secs(30 * 86_400),
            ..base
        }
    }
}

/// Which node an event hits, at its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The lease's holder (the oldest running node without a lease).
    Holder,
    /// The `n`th running node other than the holder, in start order
    /// (modulo their number).
    Other(usize),
}

/// An event of the scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    /// The node is killed: its lease and report stay in the store. With
    /// `restart_after`, a new node (a new id, as a gateway without a
    /// directory to keep its id picks) starts that much later.
    Crash {
        /// The node.
        node: Target,
        /// When its replacement starts, after the crash.
        restart_after: Option<Duration>,
    },
    /// The node is killed and its launch starts again on the same machine
    /// `restart_after` later, with the node id it kept (`docs/s3-gateway.md`,
    /// "Node ids"): its lease and report stay in the store, and requests it
    /// sent before the kill may still land.
    Kill {
        /// The node.
        node: Target,
        /// When it starts again, after the kill.
        restart_after: Duration,
    },
    /// The node is stopped (SIGSTOP) for `length`, then goes on with its
    /// old state; its monotonic clock goes on meanwhile.
    Stall {
        /// The node.
        node: Target,
        /// How long.
        length: Duration,
    },
    /// The node stops cleanly (SIGTERM): a holder releases the lease
    /// ([`Node::release`]), and a new node starts `after` later, as a
    /// restarted gateway.
    Restart {
        /// The node.
        node: Target,
        /// When the new node starts, after the stop.
        after: Duration,
    },
    /// A new node starts.
    Join,
    /// The node goes for good, cleanly: a holder releases the lease.
    Leave {
        /// The node.
        node: Target,
    },
    /// Someone deletes the lease object by hand.
    DeleteLease,
    /// Someone rewrites the lease with a body no node can read (over the
    /// read's cap, or without a length).
    UnreadableLease,
    /// Another writer forges a report that claims 10^15 bytes more at each
    /// of ten writes, 10 s apart, naming `models` made-up models.
    ForgedReport {
        /// Made-up model names in it.
        models: usize,
    },
}

/// An event of the scenario at its time from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Happening {
    /// When, from the simulation's start.
    pub at: Duration,
    /// What.
    pub what: What,
}

/// The scenario of `tests/fleet.rs` and `benches/fleet_sim.rs`, for an
/// hour: the holder killed at 10 min (restarted 60 s later), the holder
/// stopped for 90 s at 20 min (past the lease: it is taken over and its
/// next renewal gets `412`), another node killed at 30 min (restarted 30
/// s later), one stopped for 20 s at 35 min, two nodes joining at 40 and
/// 42 min, two leaving at 45 and 50 min, and the holder stopped for 10 s
/// at 52 min (within its hold: it keeps the lease).
pub fn scenario() -> Vec<Happening> {
    let min = |m: u64| Duration::from_secs(60 * m);
    let s = Duration::from_secs;
    let at = |at, what| Happening { at, what };
    vec![
        at(
            min(10),
            What::Crash {
                node: Target::Holder,
                restart_after: Some(s(60)),
            },
        ),
        at(
            min(20),
            What::Stall {
                node: Target::Holder,
                length: s(90),
            },
        ),
        at(
            min(30),
            What::Crash {
                node: Target::Other(0),
                restart_after: Some(s(30)),
            },
        ),
        at(
            min(35),
            What::Stall {
                node: Target::Other(1),
                length: s(20),
            },
        ),
        at(min(40), What::Join),
        at(min(42), What::Join),
        at(
            min(45),
            What::Leave {
                node: Target::Other(2),
            },
        ),
        at(
            min(50),
            What::Leave {
                node: Target::Other(3),
            },
        ),
        at(
            min(52),
            What::Stall {
                node: Target::Holder,
                length: s(10),
            },
        ),
    ]
}

/// Runs `config` to its end.
pub fn run(config: &Config) -> Outcome {
    Sim::new(config).run()
}

/// A task of a node: LMCache's writer, the lease and reports, the evictor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Write,
    Lease,
    Evict,
}

/// What is due at a time of the heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    /// A node starts.
    Start,
    /// A node starts again with the id of the node of this slot.
    StartAs(usize),
    /// The scenario's event of this index.
    Happening(usize),
    /// The late write of this index reaches the store.
    Late(usize),
    /// The `n`th write of the forged report of this index.
    Forge(usize, u32),
    /// A task of the node of this slot goes on, if its generation is
    /// still this one.
    Task(usize, Kind, u64),
}

/// A task's wake-ups: only the heap's entry of its current generation
/// counts; a notification wakes a task that waits, or makes its next wait
/// return at once (as `tokio::sync::Notify::notify_one`).
#[derive(Debug, Clone, Copy, Default)]
struct Task {
    generation: u64,
    waiting: bool,
    permit: bool,
}

/// One node of the fleet, from its start.
#[derive(Debug)]
struct Member {
    /// Its node id.
    id: String,
    node: Node,
    /// When its monotonic clock read `uptime` (its start).
    start: Duration,
    uptime: Duration,
    /// How far its wall clock is ahead of the store's.
    wall_ahead: Duration,
    running: bool,
    stopped_until: Duration,
    tasks: [Task; 3],
    lease_work: LeaseWork,
    evict_work: EvictWork,
    /// When its listing in flight began and its last listing began, by the
    /// store's clock.
    listing_from: SystemTime,
    listed_from: SystemTime,
}

impl Member {
    /// Its monotonic clock at the simulation's time `at`.
    fn local(&self, at: Duration) -> Duration {
        self.uptime + at.saturating_sub(self.start)
    }

    /// The simulation's time when its monotonic clock reads `local`.
    fn global(&self, local: Duration) -> Duration {
        self.start + local.saturating_sub(self.uptime)
    }
}

/// The simulation's state.
struct Sim<'a> {
    config: &'a Config,
    store: MemStore,
    members: Vec<Member>,
    heap: BinaryHeap<Reverse<(Duration, u64, Due)>>,
    pushed: u64,
    rng: SplitMix,
    write_every: Option<Duration>,
    /// Slots of the running nodes that hold the lease by their election.
    holders: Vec<usize>,
    watch: Watch,
    lease_key: String,
    /// Writes the store applies late ([`Fate::Late`]), by index.
    late: Vec<Option<tasks::LateWrite>>,
    /// The most nodes that ran at once.
    most_running: usize,
}

impl<'a> Sim<'a> {
    fn new(config: &'a Config) -> Self {
        let share = config.fleet_bytes_per_s as f64 / config.nodes.max(1) as f64;
        let write_every =
            (share > 0.0).then(|| Duration::from_secs_f64(config.object_bytes as f64 / share));
        let mut sim = Sim {
            config,
            store: MemStore::new(config.conditional_writes),
            members: Vec::new(),
            heap: BinaryHeap::new(),
            pushed: 0,
            rng: SplitMix(config.seed),
            write_every,
            holders: Vec::new(),
            watch: Watch::default(),
            lease_key: lease_key(),
            late: Vec::new(),
            most_running: 0,
        };
        if config.faults.whole_seconds {
            sim.store.whole_seconds();
        }
        sim.store.count_model(SIM_MODEL);
        sim.prefill();
        for _ in 0..config.nodes {
            sim.push(Duration::ZERO, Due::Start);
        }
        for (i, happening) in config.scenario.iter().enumerate() {
            sim.push(happening.at, Due::Happening(i));
        }
        sim
    }

    fn prefill(&mut self) {
        let objects = (self.config.spec.capacity_bytes as f64 * self.config.prefill) as u64
            / self.config.object_bytes.max(1);
        for i in 0..objects {
            let at = self.store_time(Duration::ZERO) - Duration::from_secs(objects - i);
            let key = self.rng.lmcache_key();
            self.store.prefill(key, self.config.object_bytes, at);
        }
        let oldest = self.store_time(Duration::ZERO) - Duration::from_secs(objects + 60);
        for foreign in FOREIGN {
            self.store.prefill(foreign.to_string(), 1 << 20, oldest);
        }
    }

    fn run(mut self) -> Outcome {
        while let Some(Reverse((at, _, due))) = self.heap.pop() {
            if at > self.config.duration {
                break;
            }
            match due {
                Due::Start => self.start(at, None),
                Due::StartAs(slot) => self.start(at, Some(slot)),
                Due::Happening(i) => self.happen(i, at),
                Due::Late(i) => self.land(i, at),
                Due::Forge(i, n) => self.forge(i, n, at),
                Due::Task(slot, kind, generation) => self.wake(slot, kind, generation, at),
            }
            self.sample(at);
        }
        self.sample(self.config.duration);
        let foreign_left = FOREIGN.iter().filter(|k| self.store.holds(k)).count();
        let modes = self.members_modes();
        let mut outcome = Outcome::new(self.config, &self.store, &modes, self.watch);
        outcome.most_running = self.most_running;
        outcome.checks.foreign_deleted += (FOREIGN.len() - foreign_left) as u64;
        outcome
    }

    fn members_modes(&self) -> Vec<Mode> {
        self.members.iter().map(|m| m.node.evictor.mode()).collect()
    }

    fn push(&mut self, at: Duration, due: Due) {
        self.pushed += 1;
        self.heap.push(Reverse((at, self.pushed, due)));
    }

    /// The store's clock at `at`.
    fn store_time(&self, at: Duration) -> SystemTime {
        SystemTime::UNIX_EPOCH + STORE_EPOCH + at
    }

    /// A node's wall clock at `at`, Unix seconds.
    fn unix_now(&self, slot: usize, at: Duration) -> u64 {
        (STORE_EPOCH + at + self.members[slot].wall_ahead).as_secs()
    }

    /// A node starts at `at`: the gateway's start-up checks (one LIST; the
    /// probe of conditional writes, as the gateway's store sends it), then
    /// its tasks.
    /// A node starts at `at`: with the id of the node of slot `as_slot`,
    /// or a new one.
    fn start(&mut self, at: Duration, as_slot: Option<usize>) {
        let slot = self.members.len();
        let id = match as_slot {
            Some(kept) => self.members[kept].id.clone(),
            None => format!("{:016x}", self.rng.next()),
        };
        self.store.check_listing();
        let (mode, requests) = self.probe(&id, at);
        let ready = at + self.config.latency * (1 + requests);
        let uptime = self
            .config
            .uptime_spread
            .mul_f64(spread(slot, 0x9e37_79b9_7f4a_7c15));
        let wall_ahead = match slot {
            0 => self.config.wall_clock_spread,
            _ => self
                .config
                .wall_clock_spread
                .mul_f64(spread(slot, 0xbf58_476d_1ce4_e5b9)),
        };
        let running = 1 + self.members.iter().filter(|m| m.running).count();
        self.most_running = self.most_running.max(running);
        self.members.push(Member {
            id: id.clone(),
            node: Node::new(
                id,
                self.config.spec,
                mode,
                uptime,
                Models::new([SIM_MODEL.to_string()]),
            ),
            start: ready,
            uptime,
            wall_ahead,
            running: true,
            stopped_until: Duration::ZERO,
            tasks: [Task::default(); 3],
            lease_work: LeaseWork::Idle,
            evict_work: EvictWork::Idle,
            listing_from: SystemTime::UNIX_EPOCH,
            listed_from: SystemTime::UNIX_EPOCH,
        });
        self.resume(slot, Kind::Evict, ready);
        if mode == Mode::Lease {
            self.resume(slot, Kind::Lease, ready);
        }
        if let Some(every) = self.write_every {
            let phase = every.mul_f64(self.rng.unit());
            self.resume(slot, Kind::Write, ready + phase);
        }
    }

    /// The probe of conditional writes of node `id` at `at`: the mode it
    /// gives and the requests it took.
    fn probe(&mut self, id: &str, at: Duration) -> (Mode, u32) {
        let key = probe_key(id);
        let now = self.store_time(at);
        let absent = Some(&Condition::Absent);
        let first = self.store.put(&key, absent, now, 2);
        let mut requests = 1;
        let mut ok = matches!(first, PutAnswer::Written(_));
        if ok {
            requests += 1;
            ok = self.store.put(&key, absent, now, 2) == PutAnswer::Conflict;
        }
        if ok {
            requests += 1;
            let other = Condition::Matches("\"not-this-one\"".into());
            ok = self.store.put(&key, Some(&other), now, 2) == PutAnswer::Conflict;
        }
        if first != PutAnswer::Unsupported {
            requests += 1;
            self.store.delete(&key);
        }
        let mode = if ok { Mode::Lease } else { Mode::EveryNode };
        (mode, requests)
    }

    fn happen(&mut self, i: usize, at: Duration) {
        match self.config.scenario[i].what {
            What::Crash {
                node,
                restart_after,
            } => {
                if let Some(slot) = self.target(node) {
                    self.stop(slot);
                    if let Some(after) = restart_after {
                        self.push(at + after, Due::Start);
                    }
                }
            }
            What::Stall { node, length } => {
                if let Some(slot) = self.target(node) {
                    let m = &mut self.members[slot];
                    m.stopped_until = m.stopped_until.max(at + length);
                }
            }
            What::Restart { node, after } => {
                if let Some(slot) = self.target(node) {
                    self.release(slot, at);
                    self.stop(slot);
                    self.push(at + after, Due::Start);
                }
            }
            What::Kill {
                node,
                restart_after,
            } => {
                if let Some(slot) = self.target(node) {
                    self.stop(slot);
                    self.push(at + restart_after, Due::StartAs(slot));
                }
            }
            What::Join => self.start(at, None),
            What::Leave { node } => {
                if let Some(slot) = self.target(node) {
                    self.release(slot, at);
                    self.stop(slot);
                }
            }
            What::DeleteLease => self.store.drop_lease(&self.lease_key),
            What::UnreadableLease => {
                let stamp = self.store_time(at);
                self.store.spoil_lease(&self.lease_key, stamp);
            }
            What::ForgedReport { .. } => self.forge(i, 0, at),
        }
    }

    /// The `n`th write of the forged report of the scenario's event `i`.
    fn forge(&mut self, i: usize, n: u32, at: Duration) {
        let What::ForgedReport { models } = self.config.scenario[i].what else {
            return;
        };
        let claimed = 10u64.pow(15) * u64::from(n + 1);
        let body = ReportBody {
            node: format!("forged-{i}"),
            written_bytes: claimed,
            recent_bytes: claimed,
            reports: u64::from(n),
            models: (0..models)
                .map(|m| format!("made-up-{i}-{n}-{m}"))
                .collect(),
        };
        let stamp = self.store_time(at);
        self.store
            .forge_report(&report_key(&format!("forged-{i}")), stamp, &body);
        if n < 9 {
            self.push(at + Duration::from_secs(10), Due::Forge(i, n + 1));
        }
    }

    /// The node at `slot` stops cleanly at `at`: if it holds the lease, it
    /// writes the release the gateway writes as it stops.
    fn release(&mut self, slot: usize, at: Duration) {
        let now = self.members[slot].local(at);
        if let Some(LeaseStep::Write { condition, body }) = self.members[slot].node.release(now) {
            let stamp = self.store_time(at);
            self.store
                .put_lease(&self.lease_key, &condition, stamp, &body);
        }
    }

    fn target(&self, target: Target) -> Option<usize> {
        let running = || (0..self.members.len()).filter(|&s| self.members[s].running);
        let holder = self.holders.first().copied().or_else(|| running().next());
        match target {
            Target::Holder => holder,
            Target::Other(n) => {
                let others: Vec<usize> = running().filter(|&s| Some(s) != holder).collect();
                (!others.is_empty()).then(|| others[n % others.len()])
            }
        }
    }

    fn stop(&mut self, slot: usize) {
        self.members[slot].running = false;
        self.holders.retain(|&s| s != slot);
    }

    /// A task's wake-up at `at`: dropped when its node is gone or a later
    /// one replaced it, put off while its node is stopped.
    fn wake(&mut self, slot: usize, kind: Kind, generation: u64, at: Duration) {
        let m = &mut self.members[slot];
        let task = &mut m.tasks[kind as usize];
        if !m.running || task.generation != generation {
            return;
        }
        if at < m.stopped_until {
            let until = m.stopped_until;
            self.push(until, Due::Task(slot, kind, generation));
            return;
        }
        task.waiting = false;
        match kind {
            Kind::Write => self.write(slot, at),
            Kind::Lease => self.lease(slot, at),
            Kind::Evict => self.evict(slot, at),
        }
    }

    /// The task goes on at `at` (an answer comes, or it steps again).
    fn resume(&mut self, slot: usize, kind: Kind, at: Duration) {
        let task = &mut self.members[slot].tasks[kind as usize];
        task.generation += 1;
        let generation = task.generation;
        self.push(at, Due::Task(slot, kind, generation));
    }

    /// The task waits from `at` until `until` (simulated time), or until
    /// notified; at once if notified while it worked.
    fn wait(&mut self, slot: usize, kind: Kind, at: Duration, until: Duration) {
        let task = &mut self.members[slot].tasks[kind as usize];
        if std::mem::take(&mut task.permit) {
            self.resume(slot, kind, at);
            return;
        }
        self.resume(slot, kind, until.max(at));
        self.members[slot].tasks[kind as usize].waiting = true;
    }

    /// Wakes the task at `at` if it waits; else its next wait returns at
    /// once.
    fn notify(&mut self, slot: usize, kind: Kind, at: Duration) {
        let task = &mut self.members[slot].tasks[kind as usize];
        if task.waiting {
            self.resume(slot, kind, at);
        } else {
            task.permit = true;
        }
    }

    /// Counts the running nodes that hold the lease at `at`. While no
    /// node runs, none writes, and none need evict: that is not counted
    /// as a time without an evictor.
    fn sample(&mut self, at: Duration) {
        if !self.config.conditional_writes {
            return;
        }
        let holding: Vec<&Member> = self
            .holders
            .iter()
            .map(|&s| &self.members[s])
            .filter(|m| m.node.holds(m.local(at)))
            .collect();
        let awake = holding.iter().filter(|m| m.stopped_until <= at).count();
        let (holding, awake) = match self.members.iter().any(|m| m.running) {
            true => (holding.len(), awake),
            false => (1, 1),
        };
        self.watch.sample(at, holding, awake);
    }
}

/// A deterministic share in [0, 1) for the node of `slot`.
fn spread(slot: usize, odd: u64) -> f64 {
    ((slot as u64).wrapping_mul(odd) >> 11) as f64 / (1u64 << 53) as f64
}

/// SplitMix64: the simulation's deterministic random numbers.
#[derive(Debug, Clone)]
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A key as LMCache writes them: `<model>@<kv_rank>@<group>@<hash>`,
    /// with a hash of 64 hex digits.
    fn lmcache_key(&mut self) -> String {
        let hash: Vec<u64> = (0..4).map(|_| self.next()).collect();
        format!(
            "{SIM_MODEL}@00000000@0@{:016x}{:016x}{:016x}{:016x}",
            hash[0], hash[1], hash[2], hash[3]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmcache_housekeeping::s3_key::parse_s3_key;

    #[test]
    fn the_keys_are_lmcaches_and_the_draws_repeat() {
        let (mut a, mut b) = (SplitMix(7), SplitMix(7));
        let key = a.lmcache_key();
        assert!(parse_s3_key(&key).is_ok(), "{key}");
        assert_eq!(key, b.lmcache_key());
        assert!((0.0..1.0).contains(&a.unit()));
    }

    #[test]
    fn a_node_alone_takes_the_lease_and_keeps_the_prefix_under_its_trigger() {
        // Filled to half: the creator of the lease waits half a lease (15
        // s, 150 objects) before it lists and deletes.
        let config = Config {
            duration: Duration::from_secs(600),
            prefill: 0.5,
            ..Config::new(1, 1000)
        };
        let out = run(&config);
        let lease = out.lease.expect("a lease");
        assert_eq!((out.started, out.every_node, lease.took), (1, 0, 1));
        assert!(out.peak_bytes <= config.spec.trigger_bytes + config.object_bytes);
        assert!(out.evicted > 0);
        assert_eq!(lease.two_holders, 0);
    }

    #[test]
    fn a_crashed_holder_is_replaced_within_a_lease_and_a_follow() {
        let config = Config {
            duration: Duration::from_secs(600),
            scenario: vec![Happening {
                at: Duration::from_secs(120),
                what: What::Crash {
                    node: Target::Holder,
                    restart_after: None,
                },
            }],
            ..Config::new(3, 1000)
        };
        let out = run(&config);
        let lease = out.lease.expect("a lease");
        assert_eq!(lease.took, 2);
        let t = config.spec.timing;
        assert!(lease.longest_no_holder <= t.lease + t.follow() + Duration::from_secs(1));
        assert!(lease.longest_no_holder >= t.lease - t.renew());
    }
}
