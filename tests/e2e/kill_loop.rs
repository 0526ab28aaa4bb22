//! End to end with the real binaries: `kill -9` at random moments of the
//! deletions that change a tier, each kill followed by the next run, which
//! must find the tier whole.
//!
//! Three kinds of kill take turns:
//! - `erebine-lmcache server` (the real LMCache server beside it) while the
//!   capacity guard of an `fs` tier evicts: the big cycle at its start (the
//!   tier filled far past its trigger while no guard ran), or the cycles a
//!   fill under the running guard sets off;
//! - `lmcache-tier housekeep` while it purges another model's objects, stale
//!   temps and, after an identity change, everything, and trims to a
//!   capacity;
//! - `lmcache-tier launch` while its housekeeping purges the node's built-in
//!   tier.
//!
//! The moment is random: once a random fraction of the planned deletions is
//! done, or (for `housekeep` and `launch`) after a random delay from the
//! start, which also lands in planning, scanning or the manifest write.
//! After every kill the next run checks that: no foreign entry changed (files
//! that do not decode, a symlink to a file outside, a symlink named like an
//! object, a subdirectory, hard links to a file outside at the temp names
//! of the manifest and the guard's status, files outside the tier); the
//! guard's status after the next start counts what `du` of the decoded
//! objects says; the usage is within the capacity once it settles; the
//! identity manifest is usable and records the run's identity, or, when the
//! test garbled it before the run (every second `housekeep` or `launch`
//! kill), the run says it ignored it and purges.
//!
//! `EREBINE_KILL_LOOP_COUNT` kills (default 8; `scripts/kill-loop.sh` runs
//! 50), the random choices from `EREBINE_KILL_LOOP_SEED` (default: the
//! clock), printed at the start and in any failure so it can be replayed
//! (the choices replay; the timing of a loaded machine does not).

use std::collections::BTreeMap;
use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::os::unix::fs::{symlink, MetadataExt};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use lmcache_capacity_guard::status::{read_status, GuardStatus, GUARD_STATUS_TEMP_FILE_NAME};
use lmcache_housekeeping::codec::parse_object_name;
use lmcache_housekeeping::identity::{MANIFEST_FILE_NAME, MANIFEST_TEMP_FILE_NAME};
use lmcache_housekeeping::{read_manifest, Access, ManifestRead, TierDir};
use lmcache_tier_e2e::{
    binaries, free_port, lmcache_venv, processes_mentioning, stop_launch, Binaries, Proc,
};
use nix::sys::signal::Signal;

const BINS: Binaries = binaries!();

/// Kills when `EREBINE_KILL_LOOP_COUNT` is not set.
const DEFAULT_COUNT: u64 = 8;
/// The `fs` tier's `max_capacity_gb`: 2 MiB, about 500 one-block objects.
const GUARD_CAPACITY_GB: &str = "0.002";
/// Objects the guarded tier holds before a guard's start-up eviction.
const GUARD_FILL: usize = 3000;
/// `--capacity-gb` of `lmcache-tier housekeep`: 4 MiB.
const HOUSEKEEP_CAPACITY_GB: &str = "0.004";
/// Foreign entries of a tier named `*.data`: a name that does not decode
/// and a symlink named like an object.
const FOREIGN_DATA_NAMES: usize = 2;
/// The longest a run may take to get to its deletions, or to settle.
const LIMIT: Duration = Duration::from_secs(240);

/// Bytes of a `*_gb` value as written (GiB, as the tier specs read it).
fn gib_bytes(gb: &str) -> u64 {
    (gb.parse::<f64>().unwrap() * (1u64 << 30) as f64) as u64
}

/// SplitMix64: a small seeded generator, so that a failing run's choices
/// can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in [0, 1).
    fn fraction(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Decoded objects of `tier`, as `du` counts them: regular files whose
/// names decode, and their allocated bytes.
fn du_objects(tier: &Path) -> (u64, u64) {
    let mut found = (0, 0);
    for entry in fs::read_dir(tier).unwrap().filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if parse_object_name(name).is_err() {
            continue;
        }
        if let Ok(meta) = fs::symlink_metadata(entry.path()) {
            if meta.is_file() {
                found.0 += 1;
                found.1 += meta.blocks() * 512;
            }
        }
    }
    found
}

/// Entries of `tier` named `*.data`: cheap enough to poll while a run
/// deletes (the foreign ones named so stay, and count the same before and
/// after).
fn data_names(tier: &Path) -> usize {
    fs::read_dir(tier)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.file_name().as_encoded_bytes().ends_with(b".data"))
                .count()
        })
        .unwrap_or(0)
}

/// Writes `count` one-byte objects of `model` named from `serial` (every
/// call gets new names) and `temps` stale temps of it.
fn write_objects(tier: &Path, model: &str, serial: &mut u64, count: usize, temps: usize) {
    for i in 0..count + temps {
        *serial += 1;
        let suffix = if i < count { "data" } else { "tmp" };
        let name = format!("{model}@0x01000100@0@{:032x}.{suffix}", *serial);
        fs::write(tier.join(name), b"k").unwrap();
    }
}

/// What is not a cache object, in and beside a tier: each entry's kind and
/// content (or link target), compared after every run.
struct Foreign {
    tier: PathBuf,
    outside: PathBuf,
    /// Our temp names, each a hard link to a file outside: a writer must
    /// unlink it, never write through it.
    linked_temps: Vec<&'static str>,
    snapshot: BTreeMap<PathBuf, String>,
}

impl Foreign {
    fn plant(tier: &Path, outside: &Path, linked_temps: Vec<&'static str>) -> Foreign {
        fs::create_dir_all(tier).unwrap();
        fs::create_dir_all(outside).unwrap();
        let weights: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(tier.join("model.safetensors"), weights).unwrap();
        fs::write(tier.join("README"), b"operator notes\n").unwrap();
        fs::write(
            tier.join("test-model@0x01000100@0@ABCD.data"),
            b"upper case",
        )
        .unwrap();
        fs::create_dir(tier.join("sub")).unwrap();
        fs::write(
            tier.join("sub/test-model@0x01000100@0@00ee.data"),
            b"in a subdirectory",
        )
        .unwrap();
        fs::write(outside.join("precious.data"), b"outside the tier").unwrap();
        fs::write(outside.join("linked.bin"), b"hard-linked from the tier").unwrap();
        symlink(outside.join("precious.data"), tier.join("link-to-outside")).unwrap();
        symlink(
            outside.join("precious.data"),
            tier.join("test-model@0x01000100@0@00ff.data"),
        )
        .unwrap();
        symlink(
            outside.join("precious.data"),
            tier.join("test-model@0x01000100@0@00dd.tmp"),
        )
        .unwrap();
        let mut foreign = Foreign {
            tier: tier.to_path_buf(),
            outside: outside.to_path_buf(),
            linked_temps,
            snapshot: BTreeMap::new(),
        };
        foreign.snapshot = foreign.take();
        foreign
    }

    /// Puts the hard links back at the temp names a run removed.
    fn relink(&self) {
        for name in &self.linked_temps {
            let at = self.tier.join(name);
            if fs::symlink_metadata(&at).is_err() {
                fs::hard_link(self.outside.join("linked.bin"), at).unwrap();
            }
        }
    }

    fn take(&self) -> BTreeMap<PathBuf, String> {
        let mut snap = BTreeMap::new();
        let mut look = |path: PathBuf| {
            let meta = fs::symlink_metadata(&path).unwrap();
            let what = if meta.is_symlink() {
                format!("symlink to {}", fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                "directory".to_owned()
            } else {
                let mut hasher = DefaultHasher::new();
                fs::read(&path).unwrap().hash(&mut hasher);
                format!("file of hash {:x}", hasher.finish())
            };
            snap.insert(path, what);
        };
        for entry in fs::read_dir(&self.outside).unwrap() {
            look(entry.unwrap().path());
        }
        for name in [
            "model.safetensors",
            "README",
            "test-model@0x01000100@0@ABCD.data",
            "sub",
            "sub/test-model@0x01000100@0@00ee.data",
            "link-to-outside",
            "test-model@0x01000100@0@00ff.data",
            "test-model@0x01000100@0@00dd.tmp",
        ] {
            look(self.tier.join(name));
        }
        snap
    }

    fn assert_untouched(&self) {
        let now = self.take();
        let changed: Vec<String> = self
            .snapshot
            .iter()
            .filter(|(path, was)| now.get(*path) != Some(was))
            .map(|(path, was)| format!("{}: {was} -> {:?}", path.display(), now.get(path)))
            .chain(
                now.keys()
                    .filter(|path| !self.snapshot.contains_key(*path))
                    .map(|path| format!("{}: new", path.display())),
            )
            .collect();
        assert!(changed.is_empty(), "foreign entries changed: {changed:#?}");
        for name in &self.linked_temps {
            let at = self.tier.join(name);
            if let Ok(meta) = fs::symlink_metadata(&at) {
                assert!(
                    meta.nlink() == 2 && !meta.is_symlink(),
                    "{} is neither the planted link nor gone",
                    at.display()
                );
            }
        }
    }
}

/// Where a kill landed.
struct Kill {
    /// `*.data` entries when the run started, right after the kill, and at
    /// most once the run's deletions are all done.
    before: usize,
    left: usize,
    done_at_most: usize,
    /// The run had exited by itself before the kill.
    exited_first: bool,
}

impl Kill {
    fn mid_delete(&self) -> bool {
        !self.exited_first && self.left < self.before && self.left > self.done_at_most
    }

    fn describe(&self) -> String {
        let when = if self.exited_first {
            "after it exited"
        } else if self.left == self.before {
            "before its deletions"
        } else if self.mid_delete() {
            "mid-delete"
        } else {
            "after its deletions"
        };
        format!(
            "{when}: {} of {} entries named *.data left (done at <= {})",
            self.left, self.before, self.done_at_most
        )
    }
}

/// Allocated bytes of a one-byte object in `tier` (one block of its
/// filesystem).
fn object_bytes(tier: &Path) -> u64 {
    let probe = tier.join("test-model@0x01000100@0@ff.data");
    fs::write(&probe, b"k").unwrap();
    let bytes = fs::symlink_metadata(&probe).unwrap().blocks() * 512;
    fs::remove_file(&probe).unwrap();
    bytes.max(512)
}

/// Decoded objects of `model` in `tier`.
fn objects_of(tier: &Path, model: &str) -> usize {
    fs::read_dir(tier)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| parse_object_name(n).ok())
                .is_some_and(|o| o.model() == model)
        })
        .count()
}

/// How a run is killed: once the `*.data` entries drop to `threshold`, or
/// after `delay`.
enum Moment {
    Progress(usize),
    Delay(Duration),
}

/// SIGKILLs `run` (the process only, as an OOM kill or `kill -9` would) at
/// `moment`, and waits for it and every process naming `tier` in its
/// command line (the LMCache server it started ends by its parent-death
/// signal) to be gone.
fn kill_at(run: &mut Proc, tier: &Path, moment: Moment, done_at_most: usize) -> Kill {
    let before = data_names(tier);
    let started = Instant::now();
    let mut exited_first = false;
    loop {
        if run.try_status().is_some() {
            exited_first = true;
            break;
        }
        let due = match moment {
            Moment::Progress(threshold) => data_names(tier) <= threshold,
            Moment::Delay(delay) => started.elapsed() >= delay,
        };
        if due {
            break;
        }
        assert!(
            started.elapsed() < LIMIT,
            "the run did not get to its deletions within {LIMIT:?}:\n{}",
            run.output()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    run.signal(Signal::SIGKILL);
    run.wait_timeout(Duration::from_secs(60))
        .expect("a SIGKILLed process ends");
    let left = data_names(tier);
    let needle = tier.display().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !processes_mentioning(&needle).is_empty() {
        assert!(
            Instant::now() < deadline,
            "processes outlived their killed launcher: {:?}",
            processes_mentioning(&needle)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Kill {
        before,
        left,
        done_at_most,
        exited_first,
    }
}

/// `done_at_most` + a random fraction of the way from there to `before`.
fn progress(rng: &mut Rng, before: usize, done_at_most: usize) -> Moment {
    let span = before.saturating_sub(done_at_most).saturating_sub(1);
    Moment::Progress(done_at_most + (rng.fraction() * span as f64) as usize)
}

/// Kills a housekeeping run (`housekeep`, or `launch` before its server)
/// at a random moment: one time in four after a random delay of up to
/// `max_delay`, so the kill can land in the scan, the manifest write or the
/// server's start, else partway through its deletions. Then, when
/// `garble`, damages the manifest. Returns the kill, the damage, and
/// whether the manifest now reads as unusable.
fn kill_housekeeping(
    rng: &mut Rng,
    run: &mut Proc,
    tier: &Path,
    max_delay: Duration,
    done_at_most: usize,
    garble: bool,
) -> (Kill, Option<String>, bool) {
    let before = data_names(tier);
    let moment = if rng.below(4) == 0 {
        let micros = u64::try_from(max_delay.as_micros()).unwrap_or(u64::MAX);
        Moment::Delay(Duration::from_micros(rng.below(micros)))
    } else {
        progress(rng, before, done_at_most)
    };
    let kill = kill_at(run, tier, moment, done_at_most);
    let garbled = garble.then(|| garble_manifest(rng, tier)).flatten();
    let ignored = matches!(manifest(tier), ManifestRead::Unusable(_));
    (kill, garbled, ignored)
}

/// One line for the report: `command` with its chunk size, and what
/// happened to its identity and manifest.
fn describe_kill(command: &str, chunk_size: u32, changed: bool, garbled: Option<String>) -> String {
    format!(
        "{command} (chunk size {chunk_size}{}){}",
        if changed { ", identity changed" } else { "" },
        garbled.map_or(String::new(), |g| format!(", then its manifest {g}"))
    )
}

/// Damages the tier's manifest as a torn write or a bad disk could: cut
/// at a random length, a random byte flipped, or empty. Returns what was
/// done, or `None` when there is no manifest to damage.
fn garble_manifest(rng: &mut Rng, tier: &Path) -> Option<String> {
    let path = tier.join(MANIFEST_FILE_NAME);
    let mut bytes = fs::read(&path).ok()?;
    let what = match rng.below(3) {
        0 => {
            let len = rng.below(bytes.len() as u64) as usize;
            bytes.truncate(len);
            format!("cut to {len} bytes")
        }
        1 => {
            let at = rng.below(bytes.len() as u64) as usize;
            let flip = 1u8 << rng.below(8);
            bytes[at] ^= flip;
            format!("byte {at} xor {flip:#04x}")
        }
        _ => {
            bytes.clear();
            "emptied".to_owned()
        }
    };
    fs::write(&path, bytes).unwrap();
    Some(what)
}

fn manifest(tier: &Path) -> ManifestRead {
    read_manifest(&TierDir::open(tier, Access::ReadOnly).unwrap())
}

/// Asserts that the tier's manifest records `test-model` and `chunk_size`.
fn assert_manifest(tier: &Path, chunk_size: u32) {
    match manifest(tier) {
        ManifestRead::Found(m) => {
            assert_eq!(m.identity.model, "test-model");
            assert_eq!(m.identity.chunk_size, chunk_size, "{m:?}");
        }
        other => panic!("the run left no usable manifest: {other:?}"),
    }
}

fn guard_status(tier: &Path) -> Option<GuardStatus> {
    read_status(&TierDir::open(tier, Access::ReadOnly).ok()?)
        .unwrap_or_else(|e| panic!("the guard's status cannot be read: {e}"))
}

/// Waits for a status written by the guard in process `pid` that `ready`
/// accepts.
fn wait_for_guard(
    tier: &Path,
    run: &mut Proc,
    ready: impl Fn(&GuardStatus) -> bool,
) -> GuardStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = guard_status(tier) {
            if status.pid == run.pid() as u32 && ready(&status) {
                return status;
            }
        }
        if let Some(exit) = run.try_status() {
            panic!(
                "the run exited ({exit}) before its guard settled:\n{}",
                run.output()
            );
        }
        assert!(
            started.elapsed() < LIMIT,
            "the guard did not settle within {LIMIT:?}: {:?}\n{}",
            guard_status(tier),
            run.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `fs` tier whose guard runs in `erebine-lmcache server`.
struct GuardedTier {
    dir: PathBuf,
    tier: PathBuf,
    foreign: Foreign,
    serial: u64,
    /// The server of the last check, still running and settled.
    live: Option<Proc>,
    runs: u32,
}

impl GuardedTier {
    fn new(root: &Path) -> GuardedTier {
        let dir = root.join("guarded");
        let tier = dir.join("fs-tier");
        let foreign = Foreign::plant(
            &tier,
            &dir.join("outside"),
            vec![GUARD_STATUS_TEMP_FILE_NAME],
        );
        GuardedTier {
            dir,
            tier,
            foreign,
            serial: 0,
            live: None,
            runs: 0,
        }
    }

    fn spawn(&mut self) -> Proc {
        self.runs += 1;
        let spec = format!(
            r#"{{"type":"fs","base_path":"{}","max_capacity_gb":{GUARD_CAPACITY_GB}}}"#,
            self.tier.display()
        );
        let mut cmd = Command::new(BINS.erebine_lmcache());
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &self.dir)
            .env("VIRTUAL_ENV", lmcache_venv())
            .env("LMCACHE_TRACK_USAGE", "false")
            .env("EREBINE_AGENT_LMCACHE_METRICS_PORT", "0")
            .args(["server", "--host", "127.0.0.1"])
            .args(["--port", &free_port().to_string()])
            .args(["--http-host", "127.0.0.1"])
            .args(["--http-port", &free_port().to_string()])
            .args(["--l1-size-gb", "1", "--eviction-policy", "LRU"])
            .args(["--chunk-size", "256"])
            .args(["--l2-adapter", &spec]);
        Proc::spawn(cmd, &self.dir.join(format!("server-{}.log", self.runs)))
    }

    /// The most `*.data` entries a finished eviction cycle leaves: it ends
    /// at or below the trigger (0.8) less the eviction ratio (0.2) of the
    /// capacity (`docs/capacity-guard.md`), 0.6 of it, beside the foreign
    /// ones.
    fn done_at_most(&self) -> usize {
        let capacity = gib_bytes(GUARD_CAPACITY_GB);
        (capacity * 6 / 10 / object_bytes(&self.tier)) as usize + FOREIGN_DATA_NAMES
    }

    /// One kill: of the settled server while a fill under it makes its guard
    /// evict, or of a new server during its start-up eviction. Then the
    /// check, by the next server's start.
    fn iteration(&mut self, rng: &mut Rng) -> (String, Option<Kill>) {
        self.foreign.relink();
        let (what, kill) = match self.live.take() {
            Some(mut live) if rng.below(2) == 0 => {
                let count = 1 + rng.below(GUARD_FILL as u64) as usize;
                write_objects(&self.tier, "test-model", &mut self.serial, count, 0);
                kill_at(&mut live, &self.tier, Moment::Delay(Duration::ZERO), 0);
                (
                    format!(
                        "erebine-lmcache while its guard evicted under a fill of {count} objects, right after the last was written"
                    ),
                    None,
                )
            }
            live => {
                if let Some(mut live) = live {
                    kill_at(&mut live, &self.tier, Moment::Delay(Duration::ZERO), 0);
                }
                let have = du_objects(&self.tier).0 as usize;
                let fill = GUARD_FILL.saturating_sub(have);
                write_objects(&self.tier, "test-model", &mut self.serial, fill, 0);
                let done_at_most = self.done_at_most();
                let mut run = self.spawn();
                let before = data_names(&self.tier);
                let moment = progress(rng, before, done_at_most);
                let kill = kill_at(&mut run, &self.tier, moment, done_at_most);
                (
                    "erebine-lmcache during its guard's start-up eviction".to_owned(),
                    Some(kill),
                )
            }
        };
        self.check();
        (what, kill)
    }

    /// The next server's guard counts what `du` says, evicts to within the
    /// capacity, and counts that too; nothing foreign changed.
    fn check(&mut self) {
        let at_start = du_objects(&self.tier);
        let mut run = self.spawn();
        let settled = wait_for_guard(&self.tier, &mut run, |s| s.tracked.bytes < s.trigger_bytes);
        assert_eq!(
            (settled.start.found.objects, settled.start.found.bytes),
            at_start,
            "the guard's start-up count is not du of the decoded objects: {settled:?}"
        );
        let now = du_objects(&self.tier);
        assert_eq!(
            (settled.tracked.objects, settled.tracked.bytes),
            now,
            "the guard's usage is not du of the decoded objects: {settled:?}"
        );
        assert!(
            now.1 <= settled.capacity_bytes,
            "{} bytes of objects over the capacity: {settled:?}",
            now.1
        );
        assert!(
            fs::symlink_metadata(self.tier.join(GUARD_STATUS_TEMP_FILE_NAME)).is_err(),
            "a status temp file stayed after a settled write"
        );
        self.foreign.assert_untouched();
        self.live = Some(run);
    }
}

/// A tier cleaned by `lmcache-tier housekeep`.
struct HousekeptTier {
    dir: PathBuf,
    tier: PathBuf,
    foreign: Foreign,
    serial: u64,
    runs: u32,
}

impl HousekeptTier {
    fn new(root: &Path) -> HousekeptTier {
        let dir = root.join("housekept");
        let tier = dir.join("tier");
        let foreign = Foreign::plant(&tier, &dir.join("outside"), vec![MANIFEST_TEMP_FILE_NAME]);
        HousekeptTier {
            dir,
            tier,
            foreign,
            serial: 0,
            runs: 0,
        }
    }

    fn command(&self, chunk_size: u32) -> Command {
        let mut cmd = Command::new(BINS.lmcache_tier());
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .arg("housekeep")
            .arg("--path")
            .arg(&self.tier)
            .args(["--model", "test-model"])
            .args(["--chunk-size", &chunk_size.to_string()])
            .args(["--capacity-gb", HOUSEKEEP_CAPACITY_GB, "--json"]);
        cmd
    }

    fn iteration(&mut self, rng: &mut Rng, garble: bool) -> (String, Option<Kill>) {
        self.foreign.relink();
        write_objects(&self.tier, "other-model", &mut self.serial, 1500, 20);
        write_objects(&self.tier, "test-model", &mut self.serial, 1500, 20);
        let chunk_size = [256, 512][rng.below(2) as usize];
        let changed = match manifest(&self.tier) {
            ManifestRead::Found(m) => m.identity.chunk_size != chunk_size,
            _ => true,
        };
        let kept_at_most = if changed {
            0
        } else {
            (gib_bytes(HOUSEKEEP_CAPACITY_GB) / object_bytes(&self.tier)) as usize
        };
        let done_at_most = kept_at_most + FOREIGN_DATA_NAMES;
        self.runs += 1;
        let mut run = Proc::spawn(
            self.command(chunk_size),
            &self.dir.join(format!("housekeep-{}.log", self.runs)),
        );
        let max_delay = Duration::from_millis(600);
        let (kill, garbled, ignored) =
            kill_housekeeping(rng, &mut run, &self.tier, max_delay, done_at_most, garble);
        self.check(chunk_size, ignored);
        let what = describe_kill("lmcache-tier housekeep", chunk_size, changed, garbled);
        (what, Some(kill))
    }

    /// The next `housekeep` completes the job: its report counts what `du`
    /// says, within the capacity, and the manifest records its identity.
    fn check(&mut self, chunk_size: u32, manifest_ignored: bool) {
        let out = self.command(chunk_size).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "housekeep after the kill failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let report = &json["report"];
        let kept = (
            report["kept_objects"]["count"].as_u64().unwrap(),
            report["kept_objects"]["bytes"].as_u64().unwrap(),
        );
        assert_eq!(
            kept,
            du_objects(&self.tier),
            "the report's kept objects are not du: {report:#}"
        );
        let capacity = report["capacity_bytes"].as_u64().unwrap();
        assert!(kept.1 <= capacity, "{report:#}");
        assert_eq!(report["failures_total"], 0, "{report:#}");
        let warning = report["manifest_warning"].as_str().unwrap_or_default();
        if manifest_ignored {
            assert!(
                warning.contains(MANIFEST_FILE_NAME) && warning.contains("ignored"),
                "a garbled manifest must be reported as ignored: {report:#}"
            );
            assert_eq!(
                kept.0, 0,
                "objects of unknown identity were kept: {report:#}"
            );
        } else {
            assert_eq!(warning, "", "{report:#}");
        }
        for entry in fs::read_dir(&self.tier).unwrap().filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let file = entry.file_type().is_ok_and(|t| t.is_file());
            assert!(
                !(name.starts_with("other-model@") || file && name.ends_with(".tmp")),
                "{name} survived the housekeeping after the kill"
            );
        }
        assert_manifest(&self.tier, chunk_size);
        self.foreign.assert_untouched();
    }
}

/// The built-in tier of `lmcache-tier launch`, housekept by the launch.
struct LaunchTier {
    dir: PathBuf,
    tier: PathBuf,
    foreign: Foreign,
    serial: u64,
    runs: u32,
}

impl LaunchTier {
    fn new(root: &Path) -> LaunchTier {
        let dir = root.join("node");
        let tier = dir.join("cache");
        let foreign = Foreign::plant(
            &tier,
            &dir.join("outside"),
            vec![MANIFEST_TEMP_FILE_NAME, GUARD_STATUS_TEMP_FILE_NAME],
        );
        LaunchTier {
            dir,
            tier,
            foreign,
            serial: 0,
            runs: 0,
        }
    }

    fn spawn(&mut self, chunk_size: u32) -> Proc {
        self.runs += 1;
        let batched = (chunk_size * 2).to_string();
        let mut cmd = BINS.launch_command(
            &self.dir,
            free_port(),
            free_port(),
            &["--max-num-batched-tokens", &batched],
        );
        cmd.env("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "1")
            .env("EREBINE_AGENT_LMCACHE_METRICS_PORT", "0");
        Proc::spawn(cmd, &self.dir.join(format!("launch-{}.log", self.runs)))
    }

    fn iteration(&mut self, rng: &mut Rng, garble: bool) -> (String, Option<Kill>) {
        self.foreign.relink();
        write_objects(&self.tier, "other-model", &mut self.serial, 2000, 20);
        write_objects(&self.tier, "test-model", &mut self.serial, 1000, 20);
        let chunk_size = [256, 512][rng.below(2) as usize];
        let changed = match manifest(&self.tier) {
            ManifestRead::Found(m) => m.identity.chunk_size != chunk_size,
            _ => true,
        };
        let kept = if changed {
            0
        } else {
            objects_of(&self.tier, "test-model")
        };
        let done_at_most = kept + FOREIGN_DATA_NAMES;
        let mut run = self.spawn(chunk_size);
        let max_delay = Duration::from_millis(1500);
        let (kill, garbled, ignored) =
            kill_housekeeping(rng, &mut run, &self.tier, max_delay, done_at_most, garble);
        self.check(chunk_size, ignored);
        let what = describe_kill(
            "lmcache-tier launch's housekeeping",
            chunk_size,
            changed,
            garbled,
        );
        (what, Some(kill))
    }

    /// The next launch completes the housekeeping (its log line says so, and
    /// that a garbled manifest was ignored), its guard counts what `du`
    /// says, within the capacity, and the manifest records its identity.
    fn check(&mut self, chunk_size: u32, manifest_ignored: bool) {
        let mut run = self.spawn(chunk_size);
        let status = wait_for_guard(&self.tier, &mut run, |_| true);
        let now = du_objects(&self.tier);
        assert_eq!(
            (status.start.found.objects, status.start.found.bytes),
            now,
            "the guard's start-up count is not du of the decoded objects: {status:?}"
        );
        assert_eq!(
            (status.tracked.objects, status.tracked.bytes),
            now,
            "{status:?}"
        );
        assert!(now.1 <= status.capacity_bytes, "{status:?}");
        let log = run.output();
        let line = log
            .lines()
            .find(|l| l.contains(&format!("housekeeping {}:", self.tier.display())))
            .unwrap_or_else(|| panic!("no housekeeping line:\n{log}"));
        assert!(!line.contains("FAILED"), "{line}");
        if manifest_ignored {
            assert!(
                line.contains(MANIFEST_FILE_NAME) && line.contains("ignored"),
                "a garbled manifest must be logged as ignored: {line}"
            );
            assert_eq!(now.0, 0, "objects of unknown identity were kept: {line}");
        }
        for entry in fs::read_dir(&self.tier).unwrap().filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            assert!(
                !name.starts_with("other-model@"),
                "{name} survived the launch's housekeeping: {line}"
            );
        }
        assert_manifest(&self.tier, chunk_size);
        self.foreign.assert_untouched();
        stop_launch(&mut run);
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a whole number")),
    )
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[test]
fn kill_9_mid_eviction_and_mid_housekeeping_leaves_a_whole_tier() {
    lmcache_tier_e2e::require_lmcache!();
    let count = env_u64("EREBINE_KILL_LOOP_COUNT").unwrap_or(DEFAULT_COUNT);
    let seed = env_u64("EREBINE_KILL_LOOP_SEED").unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    let replay = format!("EREBINE_KILL_LOOP_SEED={seed} EREBINE_KILL_LOOP_COUNT={count}");
    eprintln!("kill loop: {count} kills ({replay})");
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng(seed);
    let mut guarded = GuardedTier::new(tmp.path());
    let mut housekept = HousekeptTier::new(tmp.path());
    let mut launched = LaunchTier::new(tmp.path());
    let (mut mid_delete, mut placed) = (0, 0);
    let started = Instant::now();
    for i in 0..count {
        let began = Instant::now();
        // Every second kill of housekeeping or a launch garbles the manifest.
        let garble = (i / 3) % 2 == 1;
        let done = catch_unwind(AssertUnwindSafe(|| match i % 3 {
            0 => guarded.iteration(&mut rng),
            1 => housekept.iteration(&mut rng, garble),
            _ => launched.iteration(&mut rng, garble),
        }));
        let (what, kill) = done.unwrap_or_else(|panic| {
            panic!(
                "kill {} of {count} failed (replay: {replay}; logs in {}): {}",
                i + 1,
                tmp.path().display(),
                panic_text(panic.as_ref())
            )
        });
        let landed = kill.as_ref().map_or(String::new(), |k| {
            placed += 1;
            mid_delete += usize::from(k.mid_delete());
            format!(", {}", k.describe())
        });
        eprintln!(
            "kill {}/{count}: {what}{landed}; next run checked in {:.1} s",
            i + 1,
            began.elapsed().as_secs_f64()
        );
    }
    drop(guarded.live.take());
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!(
        "kill loop: {count} kills in {elapsed:.0} s ({:.1} s each), {mid_delete} of {placed} placed kills mid-delete ({replay})",
        elapsed / count.max(1) as f64
    );
    assert!(
        count < 2 || mid_delete > 0,
        "no kill landed mid-delete, so the loop tested nothing ({replay})"
    );
}
