//! Sixteen real gateways on one prefix of a real store (s3s-fs, and
//! SeaweedFS with its three volume servers), each a process of its own, as
//! sixteen nodes of a fleet would run them (`docs/s3-gateway.md`, "A fleet
//! on one bucket"): the bound's lease, reports and evictions go through
//! the store only, and the test kills and freezes the evictor to see the
//! election work on real processes and real answers, not on the
//! simulation's store in memory.
//!
//! **The run.** One tier spec for all: `max_capacity_gb` 64 MiB (no
//! `eviction` block: the gateway evicts from 0.8 of it down to 0.6), and
//! short periods in its `bucket_bound` block (lease 3 s, reports 1 s,
//! readings of the reports 1 s, listings 10 s). A writer per gateway PUTs
//! one 1 MiB LMCache object (`test-model@01000100@0@<64 hex>`) through it
//! every 4 s, signed with its per-launch key as LMCache signs: the fleet
//! writes 4 MiB/s, and the evictor's projection (its view, the reports,
//! and the fleet's rate over the 2 s the reports lag) reaches the trigger
//! after about 11 s. Then:
//!
//! 1. once the bound has evicted, the gateway whose state says
//!    `evictor: true` is killed (SIGKILL); another must hold the lease
//!    within `L + L/3` (4 s) plus [`TAKEOVER_MARGIN`] of the kill; a
//!    replacement process then joins;
//! 2. the new evictor, once it has evicted and a lease has passed, is
//!    stopped (SIGSTOP) for [`STOP_FOR`] (two leases); another must hold
//!    the lease within the same time of the stop. Right after SIGCONT every
//!    running gateway is asked for its state (one more sample, the resumed
//!    one's first answer among them), and the resumed one must say, within
//!    a lease, that it lost the lease and is no evictor. A PUT its writer
//!    had sent it is held by the stop; one that then fails (the store gave
//!    up on the upload meanwhile) is printed, not failed;
//! 3. the fleet writes on for [`AFTER_RESUME`] and until the evictor has
//!    evicted again, then stops. Each store's run takes about 45 s.
//!
//! A sampler lists the bucket from outside every second (the kit's
//! [`BucketClient`], with the store's own key) and asks every gateway that
//! runs (not killed, not stopped) for its state; the run's timeline (the
//! bucket's LMCache bytes, and what the evictor of the moment knows and
//! projects with) is printed at the end.
//!
//! **What must hold.**
//!
//! - The bucket's LMCache bytes under the prefix stay at or below
//!   1.05 x the capacity plus one object per writing gateway (16 MiB):
//!   83.2 MiB at every sample. The fleet's writes while no node evicts
//!   (up to `L + L/3` after a kill or a stop, and the new holder's first
//!   listing: about 20 MiB at 4 MiB/s) on top of the trigger (51.2 MiB)
//!   stay well inside it. The peak must pass the target (38.4 MiB), so
//!   the bound was at work (the bucket itself seldom reaches the trigger:
//!   the evictor acts on its projection). Every other PUT must succeed.
//! - Objects outside the prefix (another prefix, and a sibling prefix
//!   `fleet-archive/` that only starts like it) and objects under it
//!   whose keys are not LMCache's are byte-identical at the end.
//! - At every sample (and the one right after SIGCONT) at most one running
//!   gateway says `evictor: true`. On
//!   s3s-fs, whose `If-Match` is not atomic (two nodes taking the lease
//!   over with one ETag can both win, until the next renewal), a sample
//!   with two is printed, not failed; on SeaweedFS it fails.
//! - The fleet's LIST requests (`listing_pages`, summed over every
//!   gateway) are what one evictor makes, not sixteen times it: a gateway
//!   that never held the lease made none, and the sum is within one
//!   evictor's most ([`one_evictors_pages`]: a reading of the reports'
//!   folder and a full listing a second at most, plus one listing per
//!   takeover).
//!
//! The requests each class made (summed over the gateways, the killed one
//! as last seen before its kill) are printed at the end with `eprintln!`
//! (`--nocapture` shows them), to compare with the fleet simulation.
//!
//! **Why processes, and how.** Each gateway is this test binary run again
//! ([`std::env::current_exe`]) on its hidden test [`fleet_gateway_process`]
//! (`--ignored --exact`) with the tier spec in [`CHILD_SPEC`]: it starts
//! the gateway with [`Gateways::start_args`], prints its address and its
//! per-launch key on one stdout line, and serves until SIGTERM. The
//! default harness keeps `cargo test`'s filters, `--nocapture` and
//! skip lines for the two real tests; a `harness = false` main would have
//! to make them again for nothing. Run without [`CHILD_SPEC`] (`cargo test
//! -- --ignored`), the hidden test returns at once. Every child is killed
//! (SIGKILL, which also ends a stopped one) and reaped when its handle is
//! dropped, on a panic too, and asks the kernel for SIGKILL should the
//! thread that started it end first (`PR_SET_PDEATHSIG`), so none outlives
//! the test even when the test process is killed. The children run as the
//! test's uid, so their peer check serves the writers.
//!
//! The two tests take turns (a lock): two fleets at once on 2 cores would
//! measure the machine, not the election.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lmcache_housekeeping::s3_key::parse_s3_key;
use lmcache_s3_gateway::bound::{BoundState, MIN_LISTING_GAP};
use lmcache_s3_gateway::state;
use lmcache_s3_gateway::Gateways;
use lmcache_tier_e2e::bucket::{BucketClient, StoreAccess};
use lmcache_tier_e2e::seaweedfs::SeaweedFs;
use lmcache_tier_e2e::{free_port, S3sFs};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

mod support;
use support::Signer;

const KEY_ID: &str = "AKIAFLEETGATEWAYS001";
const SECRET: &str = "fleet-gateways-secret-0123456789abcdefgh";
const BUCKET: &str = "kv-cache";
const PREFIX: &str = "fleet/";
/// The region of both stores' signatures (s3s-fs's and SeaweedFS's
/// default).
const REGION: &str = "us-east-1";
/// Gateways at the start; one more replaces the killed one.
const GATEWAYS: usize = 16;
const MIB: u64 = 1 << 20;
/// The size of every LMCache object the writers store.
const OBJECT_BYTES: u64 = MIB;
/// The tier's `max_capacity_gb`, in MiB.
const CAPACITY_MIB: u64 = 64;
/// The lease period (`bucket_bound.lease_seconds`).
const LEASE: Duration = Duration::from_secs(3);
/// `bucket_bound.report_seconds`.
const REPORT_SECONDS: u64 = 1;
/// `bucket_bound.read_reports_seconds`.
const READ_REPORTS_SECONDS: u64 = 1;
/// `bucket_bound.listing_seconds`.
const LISTING_SECONDS: u64 = 10;
/// Each writer stores one object through its gateway this often.
const WRITE_EVERY: Duration = Duration::from_secs(4);
/// What the takeover may take beyond `L + L/3`: the poll of the states
/// (100 ms), a lease request's round trip, and 17 processes and a store
/// scheduled on 2 cores.
const TAKEOVER_MARGIN: Duration = Duration::from_secs(2);
/// How long the evictor stays stopped: two leases.
const STOP_FOR: Duration = Duration::from_secs(6);
/// How long the fleet writes on after the stopped evictor resumes (and
/// until the evictor has evicted again).
const AFTER_RESUME: Duration = Duration::from_secs(15);
/// The environment variable that makes [`fleet_gateway_process`] serve a
/// gateway for the tier spec it holds.
const CHILD_SPEC: &str = "EREBINE_FLEET_GATEWAY_SPEC";
/// The environment variable that gives [`fleet_gateway_process`] a
/// directory to keep its node id in (`Gateways::start`'s `node_dir`).
const CHILD_NODE_DIR: &str = "EREBINE_FLEET_GATEWAY_NODE_DIR";
/// The first word of a child's line on stdout once it serves:
/// `fleet-gateway <address> <access key id> <secret>`.
const READY: &str = "fleet-gateway";

/// One gateway, served until SIGTERM, when [`CHILD_SPEC`] holds a tier
/// spec (the fleet tests run this in each of their child processes);
/// nothing otherwise.
#[test]
#[ignore = "one gateway of the fleet tests, in a process of its own: they run it"]
fn fleet_gateway_process() {
    let Ok(spec) = std::env::var(CHILD_SPEC) else {
        return;
    };
    // Dies with the thread that started it, should that end without
    // killing it first.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).expect("PR_SET_PDEATHSIG");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("SIGTERM handler");
        let args = vec!["--l2-adapter".to_string(), spec];
        let node_dir = std::env::var_os(CHILD_NODE_DIR).map(PathBuf::from);
        let (_, gateways) = Gateways::start_args(&args, &|_| None, node_dir.as_deref())
            .await
            .expect("the gateway starts");
        let addr = gateways.addresses()[0].1;
        let key = gateways.key().expect("the per-launch key");
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{READY} {addr} {} {}",
            key.access_key_id, key.secret_access_key
        )
        .and_then(|()| out.flush())
        .expect("stdout");
        drop(out);
        terminate.recv().await;
    });
}

/// One fleet at a time on this machine.
fn one_fleet_at_a_time() -> MutexGuard<'static, ()> {
    static FLEET: Mutex<()> = Mutex::new(());
    FLEET.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn sixteen_gateways_keep_one_bound_on_s3s_fs() {
    lmcache_tier_e2e::require_s3s_fs!();
    let _turn = one_fleet_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let store = S3sFs::start(tmp.path(), free_port(), (KEY_ID, SECRET), &[BUCKET]);
    let access = StoreAccess {
        endpoint: format!("127.0.0.1:{}", store.port),
        region: REGION.to_string(),
        key_id: KEY_ID.to_string(),
        secret: SECRET.to_string(),
    };
    run_fleet("s3s-fs", &access, false, tmp.path());
}

#[test]
fn sixteen_gateways_keep_one_bound_on_seaweedfs() {
    lmcache_tier_e2e::require_seaweedfs!();
    let _turn = one_fleet_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let store = SeaweedFs::start(tmp.path(), (KEY_ID, SECRET), &[BUCKET]);
    let access = store.access();
    assert_eq!(access.region, REGION);
    run_fleet("SeaweedFS", &access, true, tmp.path());
}

/// A gateway killed (SIGKILL) and started again with the same node
/// directory comes back with the same node id and takes its own lease back
/// at once (`docs/s3-gateway.md`, "Node ids"), where a gateway with a new
/// id must wait for the lease to lapse: a whole lease of the same ETag.
/// The lease is 10 s here, so the two differ by far more than a process
/// start on a busy machine (0.1 s against 10.1 s on the 2-core
/// development VM).
#[test]
fn a_gateway_killed_and_started_again_takes_its_own_lease_back_at_once_on_s3s_fs() {
    lmcache_tier_e2e::require_s3s_fs!();
    let _turn = one_fleet_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let store = S3sFs::start(tmp.path(), free_port(), (KEY_ID, SECRET), &[BUCKET]);
    let lease = Duration::from_secs(10);
    let spec = serde_json::json!({"type": "s3", "s3_endpoint": format!("127.0.0.1:{}", store.port),
        "s3_bucket": BUCKET, "s3_key_prefix": PREFIX, "s3_region": REGION,
        "disable_tls": true, "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET,
        "max_capacity_gb": 0.0625, "bucket_bound": {"lease_seconds": lease.as_secs()}})
    .to_string();
    let node_dir = tmp.path().join("tier");
    std::fs::create_dir(&node_dir).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Starts a gateway and waits until it holds the lease: its node id
    // and the time from its serving to its holding.
    let run = |name: &str, dir: Option<&Path>| {
        let log = tmp.path().join(format!("{name}.log"));
        let starting = spawn_gateway_in(&spec, log, dir);
        let (process, slot) = starting.serving(Instant::now() + Duration::from_secs(60));
        let serving = Instant::now();
        let slots: Slots = Arc::new(Mutex::new(vec![slot]));
        let (_, state) = wait_for_slot(
            &runtime,
            &slots,
            serving + Duration::from_secs(60),
            name,
            |states| {
                states[0]
                    .as_ref()
                    .filter(|s| s.lease_holder == s.node)
                    .map(|_| 0)
            },
        );
        (process, state.node, serving.elapsed())
    };
    let (first, id, _) = run("first", Some(&node_dir));
    first.signal(Signal::SIGKILL);
    drop(first);
    let (again, same, took) = run("again", Some(&node_dir));
    eprintln!(
        "restarted with the kept id {same}: held the lease {:.1} s after serving",
        took.as_secs_f64()
    );
    assert_eq!(same, id, "the kept id");
    // The bound reads the lease before the gateway serves, so a wait for
    // the lapse may show up to a start's time under a lease here: half a
    // lease tells the two apart.
    assert!(
        took < lease / 2,
        "took its own lease back at once: {took:?}"
    );
    again.signal(Signal::SIGKILL);
    drop(again);
    let (_fresh, other, waited) = run("fresh", None);
    eprintln!(
        "restarted with a new id {other}: held the lease {:.1} s after serving",
        waited.as_secs_f64()
    );
    assert_ne!(other, id);
    assert!(
        waited >= lease,
        "a new id waits for the lease to lapse: {waited:?}"
    );
}

/// Where a gateway is in the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Running,
    Stopped,
    Killed,
}

/// What the writers, the sampler and the orchestration know of one
/// gateway.
#[derive(Debug, Clone)]
struct Slot {
    addr: SocketAddr,
    key_id: String,
    secret: String,
    status: Status,
    /// Times it was stopped (SIGSTOP).
    stops: u32,
}

/// The fleet's gateways, by slot (the replacement is the last).
type Slots = Arc<Mutex<Vec<Slot>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The slots as they are now, the lock released: a guard kept while the
/// runtime runs (a temporary of the statement that calls `block_on`) would
/// block the writer tasks that lock the slots on the runtime's workers, and
/// with them the I/O that `block_on` waits for.
fn snapshot(slots: &Slots) -> Vec<Slot> {
    lock(slots).clone()
}

/// A gateway's process: killed (SIGKILL) and reaped when dropped.
struct GatewayProcess {
    child: Child,
    log: PathBuf,
}

impl GatewayProcess {
    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).unwrap_or_else(|e| panic!("{signal} to {}: {e}", self.pid()));
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child started but not known to serve yet: its ready line comes on
/// `ready`.
struct Starting {
    process: GatewayProcess,
    ready: mpsc::Receiver<String>,
}

/// Starts a gateway process for `spec`, its stderr in `log`. Called on the
/// test's thread only: the child dies with the thread that started it.
fn spawn_gateway(spec: &str, log: PathBuf) -> Starting {
    spawn_gateway_in(spec, log, None)
}

/// [`spawn_gateway`], keeping the gateway's node id in `node_dir`.
fn spawn_gateway_in(spec: &str, log: PathBuf, node_dir: Option<&Path>) -> Starting {
    let stderr = std::fs::File::create(&log).expect("the child's log");
    let mut command = Command::new(std::env::current_exe().expect("this test binary"));
    if let Some(dir) = node_dir {
        command.env(CHILD_NODE_DIR, dir);
    }
    let mut child = command
        .args(["--ignored", "--exact", "fleet_gateway_process"])
        .args(["--nocapture", "--test-threads=1", "-q"])
        .env(CHILD_SPEC, spec)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn a gateway process");
    let stdout = child.stdout.take().expect("the child's stdout");
    let (tx, ready) = mpsc::channel();
    // Reads to the end, so that the child never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with(READY) {
                let _ = tx.send(line);
            }
        }
    });
    Starting {
        process: GatewayProcess { child, log },
        ready,
    }
}

impl Starting {
    /// Waits until `deadline` for the child's ready line.
    fn serving(mut self, deadline: Instant) -> (GatewayProcess, Slot) {
        let wait = deadline.saturating_duration_since(Instant::now());
        let line = match self.ready.recv_timeout(wait) {
            Ok(line) => line,
            Err(e) => {
                let exited = self.process.child.try_wait().ok().flatten();
                panic!(
                    "a gateway process did not serve ({e}; exited: {exited:?}):\n{}",
                    std::fs::read_to_string(&self.process.log).unwrap_or_default()
                );
            }
        };
        let fields: Vec<&str> = line.split(' ').collect();
        let [_, addr, key_id, secret] = fields[..] else {
            panic!("not a ready line: {line}");
        };
        let slot = Slot {
            addr: addr.parse().expect("the gateway's address"),
            key_id: key_id.to_string(),
            secret: secret.to_string(),
            status: Status::Running,
            stops: 0,
        };
        (self.process, slot)
    }
}

/// The `n`th LMCache object's key.
fn lmcache_key(n: u64) -> String {
    format!("test-model@01000100@0@{n:064x}")
}

/// PUTs `body` at `key` through the gateway of `slot`, signed with its
/// per-launch key as LMCache signs; the answer's status.
async fn put_through(
    client: &reqwest::Client,
    slot: &Slot,
    key: &str,
    body: bytes::Bytes,
) -> Result<u16, String> {
    let addr = slot.addr.to_string();
    let signer = Signer {
        addr: &addr,
        key_id: &slot.key_id,
        secret: &slot.secret,
        region: REGION,
    };
    let request = signer.request(client, "PUT", key, body);
    let answer = request.send().await.map_err(|e| e.to_string())?;
    Ok(answer.status().as_u16())
}

/// What the writers share.
struct Writing {
    slots: Slots,
    stop: AtomicBool,
    next_key: AtomicU64,
    stored: AtomicU64,
    body: bytes::Bytes,
    client: reqwest::Client,
    /// PUTs answered other than 200 by a gateway that was not killed, nor
    /// stopped while they ran, with the gateway's last upstream error.
    failures: Mutex<Vec<String>>,
    /// The same, of PUTs that a stop of their gateway held.
    held_by_stop: Mutex<Vec<String>>,
}

/// Stores an object through the gateway of `slot` every [`WRITE_EVERY`],
/// first after `phase`, until the run stops or the gateway is killed. A
/// stopped gateway holds its PUT until it runs again, as a frozen node's
/// LMCache would.
async fn writer(writing: Arc<Writing>, slot: usize, phase: Duration) {
    let start = tokio::time::Instant::now() + phase;
    let mut tick = tokio::time::interval_at(start, WRITE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let target = lock(&writing.slots)[slot].clone();
        if writing.stop.load(Ordering::Relaxed) || target.status == Status::Killed {
            return;
        }
        let key = lmcache_key(writing.next_key.fetch_add(1, Ordering::Relaxed));
        let answer = put_through(&writing.client, &target, &key, writing.body.clone()).await;
        let after = lock(&writing.slots)[slot].clone();
        if answer == Ok(200) {
            writing.stored.fetch_add(1, Ordering::Relaxed);
        } else if after.status != Status::Killed {
            let upstream = state::fetch(target.addr, Duration::from_secs(2))
                .await
                .ok()
                .flatten()
                .and_then(|s| s.last_upstream_error)
                .map(|e| e.message);
            let failure =
                format!("slot {slot} PUT {key}: {answer:?}; last upstream error: {upstream:?}");
            let held = target.status == Status::Stopped || after.stops != target.stops;
            let list = if held {
                &writing.held_by_stop
            } else {
                &writing.failures
            };
            lock(list).push(failure);
        }
    }
}

/// The states of the running gateways (`None` for the others, and for one
/// that did not answer within 2 s).
async fn states(slots: &[Slot]) -> Vec<Option<BoundState>> {
    let mut asked = tokio::task::JoinSet::new();
    for (i, slot) in slots.iter().enumerate() {
        if slot.status == Status::Running {
            let addr = slot.addr;
            asked.spawn(async move {
                let state = state::fetch(addr, Duration::from_secs(2)).await;
                (i, state.ok().flatten().and_then(|s| s.bucket_bound))
            });
        }
    }
    let mut out = vec![None; slots.len()];
    while let Some(Ok((i, state))) = asked.join_next().await {
        out[i] = state;
    }
    out
}

/// One sample: the bucket as listed from outside, and who says it evicts.
#[derive(Debug, Clone)]
struct Sample {
    at: Duration,
    /// Bytes of LMCache objects under the prefix; `None` when the listing
    /// failed.
    lmcache_bytes: Option<u64>,
    objects: usize,
    /// Running gateways whose state says `evictor: true`, with what
    /// they see.
    evictors: Vec<EvictorSeen>,
    /// Running gateways that did not answer.
    silent: Vec<usize>,
}

/// What a gateway that says `evictor: true` sees.
#[derive(Debug, Clone)]
struct EvictorSeen {
    slot: usize,
    /// Its view: the last listing, its own changes since, and what the
    /// reports added (`usage_bytes`).
    known_bytes: u64,
    /// The fleet's write rate it projects with.
    rate: u64,
    /// Objects it evicted so far.
    evicted: u64,
}

impl std::fmt::Display for EvictorSeen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "slot {} (knows {:.1} MiB, rate {:.1} MiB/s, evicted {})",
            self.slot,
            mib(self.known_bytes),
            mib(self.rate),
            self.evicted
        )
    }
}

/// The gateways whose state says `evictor: true`.
fn evictors(states: &[Option<BoundState>]) -> Vec<EvictorSeen> {
    states
        .iter()
        .enumerate()
        .filter_map(|(slot, s)| {
            let s = s.as_ref().filter(|s| s.evictor)?;
            Some(EvictorSeen {
                slot,
                known_bytes: s.usage_bytes,
                rate: s.fleet_write_bytes_per_s,
                evicted: s.evicted_objects,
            })
        })
        .collect()
}

/// Samples the bucket and the gateways' states every second until `stop`.
fn sampler(access: StoreAccess, slots: Slots, stop: Arc<AtomicBool>, t0: Instant) -> Vec<Sample> {
    let bucket = BucketClient::new(&access, BUCKET);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("the sampler's runtime");
    let mut samples = Vec::new();
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let at = t0.elapsed();
        let listed = bucket.list(PREFIX).ok();
        let lmcache: Vec<u64> = listed
            .iter()
            .flatten()
            .filter(|o| parse_s3_key(&o.key[PREFIX.len()..]).is_ok())
            .map(|o| o.bytes)
            .collect();
        let slots_now = lock(&slots).clone();
        let states = runtime.block_on(states(&slots_now));
        let running = |status: &Status| *status == Status::Running;
        samples.push(Sample {
            at,
            lmcache_bytes: listed.is_some().then(|| lmcache.iter().sum()),
            objects: lmcache.len(),
            evictors: evictors(&states),
            // One stopped or killed while it was asked is not silent.
            silent: (0..states.len())
                .filter(|i| states[*i].is_none() && running(&slots_now[*i].status))
                .filter(|i| running(&lock(&slots)[*i].status))
                .collect(),
        });
        next += Duration::from_secs(1);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    samples
}

/// The most ListObjectsV2 requests one evictor makes over `run` with
/// `takeovers` takeovers of the lease: a listing of the reports' folder
/// every `read_reports_seconds` and a full listing at most every
/// `max(1 s, read_reports_seconds)` (one page each below 1,000 objects),
/// and one full listing at each takeover.
fn one_evictors_pages(run: Duration, takeovers: u64) -> u64 {
    let seconds = run.as_secs_f64().ceil() as u64;
    let full_gap = MIN_LISTING_GAP.as_secs().max(READ_REPORTS_SECONDS);
    seconds / READ_REPORTS_SECONDS + seconds / full_gap + takeovers
}

/// The non-LMCache objects the fleet must leave as they are: outside the
/// prefix, in a sibling prefix that only starts like it, and under it with
/// keys that do not decode as LMCache's.
fn foreign_objects() -> Vec<(String, Vec<u8>)> {
    let hash = format!("{:064x}", 0xf0_u64);
    let pattern = |seed: u8, len: usize| -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    };
    let objects = vec![
        (
            format!("other/test-model@01000100@0@{hash}"),
            pattern(1, MIB as usize),
        ),
        (
            format!("fleet-archive/test-model@01000100@0@{hash}"),
            pattern(2, MIB as usize + 3),
        ),
        (format!("{PREFIX}notes.txt"), pattern(3, 3 * MIB as usize)),
        (
            format!("{PREFIX}test-model@1@0@{hash}"),
            pattern(4, MIB as usize),
        ),
    ];
    for (key, _) in &objects {
        let inside = key.strip_prefix(PREFIX);
        assert!(
            inside.is_none_or(|k| parse_s3_key(k).is_err()),
            "{key} decodes as LMCache's"
        );
    }
    objects
}

/// Polls the running gateways' states every 100 ms until `found` picks a
/// slot from them, or panics with `what` at `deadline`.
fn wait_for_slot(
    runtime: &tokio::runtime::Runtime,
    slots: &Slots,
    deadline: Instant,
    what: &str,
    found: impl Fn(&[Option<BoundState>]) -> Option<usize>,
) -> (usize, BoundState) {
    loop {
        let now = snapshot(slots);
        let states = runtime.block_on(states(&now));
        if let Some(i) = found(&states) {
            return (i, states[i].clone().expect("a state"));
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not by the deadline; states: {states:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The slot whose state says `evictor: true`, other than `not`.
fn evictor_other_than(states: &[Option<BoundState>], not: &[usize]) -> Option<usize> {
    (0..states.len()).find(|i| !not.contains(i) && states[*i].as_ref().is_some_and(|s| s.evictor))
}

/// The slot, other than `not`, that holds the lease by its own state (its
/// last lease answer made it the holder).
fn holder_other_than(states: &[Option<BoundState>], not: &[usize]) -> Option<usize> {
    (0..states.len()).find(|i| {
        !not.contains(i)
            && states[*i]
                .as_ref()
                .is_some_and(|s| s.lease_holder == s.node && s.lease.taken > 0)
    })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// The whole run against the store at `access` (`atomic`: its `If-Match`
/// is atomic, so two evictors at once are a failure); files under `dir`.
fn run_fleet(store: &str, access: &StoreAccess, atomic: bool, dir: &Path) {
    let t0 = Instant::now();
    let bucket = BucketClient::new(access, BUCKET);
    let foreign = foreign_objects();
    for (key, bytes) in &foreign {
        bucket.put(key, bytes);
    }
    let capacity = CAPACITY_MIB * MIB;
    assert!(parse_s3_key(&lmcache_key(0)).is_ok(), "not LMCache's key");
    let spec = serde_json::json!({"type": "s3", "s3_endpoint": access.endpoint,
        "s3_bucket": BUCKET, "s3_key_prefix": PREFIX, "s3_region": REGION,
        "disable_tls": true, "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET,
        "max_capacity_gb": CAPACITY_MIB as f64 / 1024.0,
        "bucket_bound": {"lease_seconds": LEASE.as_secs(), "report_seconds": REPORT_SECONDS,
            "read_reports_seconds": READ_REPORTS_SECONDS, "listing_seconds": LISTING_SECONDS}})
    .to_string();
    let bound_bytes = (1.05 * capacity as f64) as u64 + GATEWAYS as u64 * OBJECT_BYTES;
    let takeover_limit = LEASE + LEASE / 3 + TAKEOVER_MARGIN;

    // Every child is started from this thread (see spawn_gateway).
    let started = Instant::now();
    let starting: Vec<Starting> = (0..GATEWAYS)
        .map(|i| spawn_gateway(&spec, dir.join(format!("gateway-{i}.log"))))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut processes, slots): (Vec<GatewayProcess>, Vec<Slot>) =
        starting.into_iter().map(|s| s.serving(deadline)).unzip();
    eprintln!(
        "{store}: {GATEWAYS} gateway processes serve after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let slots: Slots = Arc::new(Mutex::new(slots));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("the writers' runtime");
    let writing = Arc::new(Writing {
        slots: slots.clone(),
        stop: AtomicBool::new(false),
        next_key: AtomicU64::new(0),
        stored: AtomicU64::new(0),
        body: bytes::Bytes::from(vec![0x5a; OBJECT_BYTES as usize]),
        client: reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client"),
        failures: Mutex::new(Vec::new()),
        held_by_stop: Mutex::new(Vec::new()),
    });
    let spread = WRITE_EVERY / GATEWAYS as u32;
    let mut writers: Vec<_> = (0..GATEWAYS)
        .map(|i| runtime.spawn(writer(writing.clone(), i, spread * i as u32)))
        .collect();
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampling = {
        let (access, slots, stop) = (access.clone(), slots.clone(), stop_sampling.clone());
        std::thread::spawn(move || sampler(access, slots, stop, t0))
    };

    // 1. The fleet fills the bucket past the trigger; its evictor evicts.
    let (evictor, _) = wait_for_slot(
        &runtime,
        &slots,
        Instant::now() + Duration::from_secs(60),
        "an evictor that evicted",
        |states| {
            let evicted: u64 = states.iter().flatten().map(|s| s.evicted_objects).sum();
            evictor_other_than(states, &[]).filter(|_| evicted > 0)
        },
    );
    // Its figures as late as they can be read: they die with it.
    let last = runtime
        .block_on(states(&snapshot(&slots)))
        .swap_remove(evictor)
        .expect("the evictor's state before its kill");
    // No `eviction` block: the gateway evicts from 0.8 of the capacity
    // down to 0.6 of it.
    assert_eq!(
        last.spec.capacity_bytes, capacity,
        "{store}: {:?}",
        last.spec
    );
    let (trigger, target) = (last.spec.trigger_bytes, last.spec.target_bytes);
    lock(&slots)[evictor].status = Status::Killed;
    processes[evictor].signal(Signal::SIGKILL);
    let killed_at = Instant::now();
    let (second, _) = wait_for_slot(
        &runtime,
        &slots,
        killed_at + Duration::from_secs(30),
        "a holder of the lease after the kill",
        |states| holder_other_than(states, &[evictor]),
    );
    let kill_takeover = killed_at.elapsed();
    wait_for_slot(
        &runtime,
        &slots,
        killed_at + Duration::from_secs(30),
        "an evictor after the kill",
        |states| evictor_other_than(states, &[evictor]).filter(|i| *i == second),
    );
    let kill_evicting = killed_at.elapsed();
    eprintln!(
        "{store}: killed the evictor (slot {evictor}) at {:.1} s; slot {second} held the lease {:.2} s later and evicted (listed) {:.2} s later",
        (killed_at - t0).as_secs_f64(),
        kill_takeover.as_secs_f64(),
        kill_evicting.as_secs_f64()
    );
    assert!(
        kill_takeover <= takeover_limit,
        "{store}: the lease was taken over {kill_takeover:?} after the kill, over {takeover_limit:?}"
    );

    // A replacement joins.
    let (process, slot) = spawn_gateway(&spec, dir.join(format!("gateway-{GATEWAYS}.log")))
        .serving(Instant::now() + Duration::from_secs(60));
    processes.push(process);
    lock(&slots).push(slot);
    writers.push(runtime.spawn(writer(writing.clone(), GATEWAYS, Duration::ZERO)));

    // 2. The evictor now, once it has evicted and evicted for a lease,
    // is stopped for two leases.
    let evicting_since = killed_at + kill_evicting;
    let (frozen, _) = wait_for_slot(
        &runtime,
        &slots,
        Instant::now() + Duration::from_secs(30),
        "an evictor that evicted, to stop",
        |states| {
            evictor_other_than(states, &[evictor])
                .filter(|i| states[*i].as_ref().is_some_and(|s| s.evicted_objects > 0))
                .filter(|_| evicting_since.elapsed() >= LEASE)
        },
    );
    {
        let mut slots = lock(&slots);
        slots[frozen].status = Status::Stopped;
        slots[frozen].stops += 1;
    }
    processes[frozen].signal(Signal::SIGSTOP);
    let stopped_at = Instant::now();
    let (third, _) = wait_for_slot(
        &runtime,
        &slots,
        stopped_at + Duration::from_secs(30),
        "a holder of the lease while the evictor is stopped",
        |states| holder_other_than(states, &[evictor, frozen]),
    );
    let stop_takeover = stopped_at.elapsed();
    std::thread::sleep(STOP_FOR.saturating_sub(stopped_at.elapsed()));
    processes[frozen].signal(Signal::SIGCONT);
    let resumed_at = Instant::now();
    lock(&slots)[frozen].status = Status::Running;
    // Every running gateway's state at once, the resumed one's its first
    // answer: one more sample of who says it evicts.
    let on_resume = evictors(&runtime.block_on(states(&snapshot(&slots))));
    let (_, resumed) = wait_for_slot(
        &runtime,
        &slots,
        resumed_at + LEASE,
        "the resumed evictor to step down",
        |states| {
            states[frozen]
                .as_ref()
                .filter(|s| !s.evictor && s.lease.lost > 0)
                .map(|_| frozen)
        },
    );
    eprintln!(
        "{store}: stopped the evictor (slot {frozen}) at {:.1} s for {:.1} s; slot {third} held the lease {:.2} s after the stop; right after SIGCONT the states said evictor: {}; it stepped down {:.2} s after SIGCONT (lease lost {} time(s), holder now {})",
        (stopped_at - t0).as_secs_f64(),
        (resumed_at - stopped_at).as_secs_f64(),
        stop_takeover.as_secs_f64(),
        on_resume
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" and "),
        resumed_at.elapsed().as_secs_f64(),
        resumed.lease.lost,
        resumed.lease_holder
    );
    assert!(
        stop_takeover <= takeover_limit,
        "{store}: the lease was taken over {stop_takeover:?} after the stop, over {takeover_limit:?}"
    );

    // 3. The fleet writes on until the evictor has evicted again.
    let evicted_by = |states: &[Option<BoundState>]| -> u64 {
        states.iter().flatten().map(|s| s.evicted_objects).sum()
    };
    let before = evicted_by(&runtime.block_on(states(&snapshot(&slots))));
    wait_for_slot(
        &runtime,
        &slots,
        resumed_at + Duration::from_secs(40),
        "an eviction after the resume",
        |states| {
            evictor_other_than(states, &[evictor])
                .filter(|_| evicted_by(states) > before && resumed_at.elapsed() >= AFTER_RESUME)
        },
    );
    writing.stop.store(true, Ordering::Relaxed);
    for writer in writers {
        runtime
            .block_on(async { tokio::time::timeout(WRITE_EVERY * 10, writer).await })
            .expect("a writer did not end")
            .expect("a writer panicked");
    }
    stop_sampling.store(true, Ordering::Relaxed);
    let samples = sampling.join().expect("the sampler panicked");
    let mut finals = runtime.block_on(states(&snapshot(&slots)));
    let run = started.elapsed();
    finals[evictor] = Some(last);

    // The bound held, and was at work.
    let peak = samples
        .iter()
        .filter_map(|s| Some((s.lmcache_bytes?, s)))
        .max_by_key(|(bytes, _)| *bytes)
        .expect("a sample of the bucket");
    let timeline: Vec<String> = samples
        .iter()
        .map(|s| {
            format!(
                "{:5.1}s {:6.1} MiB {:3} objects, evictor: {}{}",
                s.at.as_secs_f64(),
                mib(s.lmcache_bytes.unwrap_or(0)),
                s.objects,
                s.evictors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" and "),
                if s.silent.is_empty() {
                    String::new()
                } else {
                    format!(" silent {:?}", s.silent)
                }
            )
        })
        .collect();
    eprintln!(
        "{store}: {} samples, peak {:.1} MiB at {:.1} s (bound {:.1} MiB, trigger {:.1} MiB, target {:.1} MiB); the bucket's LMCache bytes from outside, and the evictor's own figures:\n{}",
        samples.len(),
        mib(peak.0),
        peak.1.at.as_secs_f64(),
        mib(bound_bytes),
        mib(trigger),
        mib(target),
        timeline.join("\n")
    );
    // The requests, by class.
    let all: Vec<&BoundState> = finals.iter().flatten().collect();
    assert_eq!(
        all.len(),
        GATEWAYS + 1,
        "{store}: not every gateway's figures"
    );
    let sum = |f: fn(&BoundState) -> u64| -> u64 { all.iter().map(|s| f(s)).sum() };
    let takeovers = sum(|s| s.lease.taken);
    let pages = sum(|s| s.listing_pages);
    let stored = writing.stored.load(Ordering::Relaxed);
    eprintln!(
        "{store}: requests of the fleet over {:.1} s ({} gateways, the killed one as last seen):",
        run.as_secs_f64(),
        all.len()
    );
    eprintln!(
        "  start-up checks          {} x (1 LIST of one key, 3 conditional PUTs, 1 DELETE)",
        all.len()
    );
    for (class, n) in [
        ("LMCache PUTs (1 MiB)", stored),
        ("lease reads (GET)", sum(|s| s.lease.reads)),
        ("lease writes (PUT)", sum(|s| s.lease.writes)),
        ("lease taken", takeovers),
        ("lease lost", sum(|s| s.lease.lost)),
        ("lease failures", sum(|s| s.lease.failures)),
        ("reports sent (PUT)", sum(|s| s.reports_sent)),
        ("report failures", sum(|s| s.report_failures)),
        ("reports read (GET)", sum(|s| s.reports_read)),
        ("full listings", sum(|s| s.listings)),
        ("listing pages (LIST)", pages),
        ("listing failures", sum(|s| s.listing_failures)),
        ("evictions (DELETE)", sum(|s| s.evicted_objects)),
        ("eviction failures", sum(|s| s.eviction_failures)),
        ("upload listings (LIST)", sum(|s| s.upload_listings)),
        ("uploads aborted", sum(|s| s.uploads_aborted)),
    ] {
        eprintln!(
            "  {class:<24} {n:>6}  ({:.2}/s)",
            n as f64 / run.as_secs_f64()
        );
    }
    eprintln!("  per gateway: slot node             reads writes taken lost reports_sent reports_read listings pages evicted");
    for (i, s) in finals.iter().enumerate() {
        if let Some(s) = s {
            eprintln!(
                "    {i:2} {} {:5} {:6} {:5} {:4} {:12} {:12} {:8} {:5} {:7}",
                s.node,
                s.lease.reads,
                s.lease.writes,
                s.lease.taken,
                s.lease.lost,
                s.reports_sent,
                s.reports_read,
                s.listings,
                s.listing_pages,
                s.evicted_objects
            );
        }
    }

    let over: Vec<&String> = samples
        .iter()
        .zip(&timeline)
        .filter(|(s, _)| s.lmcache_bytes.is_some_and(|b| b > bound_bytes))
        .map(|(_, line)| line)
        .collect();
    assert!(
        over.is_empty(),
        "{store}: the bucket passed {:.1} MiB; the run:\n{}",
        mib(bound_bytes),
        timeline.join("\n")
    );
    assert!(
        peak.0 > target,
        "{store}: the bucket never filled past the bound's target; the run:\n{}",
        timeline.join("\n")
    );
    let unlisted = samples.iter().filter(|s| s.lmcache_bytes.is_none()).count();
    assert!(
        unlisted * 10 <= samples.len(),
        "{store}: {unlisted} of {} listings from outside failed",
        samples.len()
    );
    let silent: Vec<&String> = samples
        .iter()
        .zip(&timeline)
        .filter(|(s, _)| !s.silent.is_empty())
        .map(|(_, line)| line)
        .collect();
    assert!(
        silent.is_empty(),
        "{store}: running gateways did not answer:\n{silent:#?}"
    );

    // One evictor at a time.
    let mut doubled: Vec<&String> = samples
        .iter()
        .zip(&timeline)
        .filter(|(s, _)| s.evictors.len() > 1)
        .map(|(_, line)| line)
        .collect();
    let resumed_line = format!(
        "right after SIGCONT of slot {frozen}: evictor: {}",
        on_resume
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" and ")
    );
    if on_resume.len() > 1 {
        doubled.push(&resumed_line);
    }
    if atomic {
        assert!(
            doubled.is_empty(),
            "{store}: samples with two evictors: {doubled:#?}"
        );
    } else if !doubled.is_empty() {
        eprintln!(
            "{store}: samples with two evictors (s3s-fs's If-Match is not atomic): {doubled:#?}"
        );
    }

    // Nothing else touched.
    for (key, bytes) in &foreign {
        assert!(bucket.get(key) == *bytes, "{store}: {key} changed");
    }
    let held = lock(&writing.held_by_stop).clone();
    if !held.is_empty() {
        eprintln!("{store}: PUTs that the stop of their gateway held, failed: {held:#?}");
    }
    let failures = lock(&writing.failures).clone();
    assert!(failures.is_empty(), "{store}: PUTs failed: {failures:#?}");

    // The fleet lists as one evictor does.
    let followers_listing: Vec<String> = all
        .iter()
        .filter(|s| s.lease.taken == 0 && s.listing_pages > 0)
        .map(|s| format!("{} made {} pages", s.node, s.listing_pages))
        .collect();
    assert!(
        followers_listing.is_empty(),
        "{store}: gateways that never held the lease listed: {followers_listing:?}"
    );
    let budget = one_evictors_pages(run, takeovers);
    assert!(
        pages <= budget,
        "{store}: the fleet made {pages} ListObjectsV2 requests in {run:?}, over one evictor's {budget}"
    );
}
