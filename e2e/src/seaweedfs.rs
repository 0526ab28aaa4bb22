//! A SeaweedFS cluster for the tests: SeaweedFS 4.48 (its one `weed`
//! binary, which `scripts/setup-seaweedfs.sh` installs) on free loopback
//! ports under a test's own directory, as a real S3 store that checks
//! every SigV4 signature and keeps its objects in volumes of its own.
//!
//! ```no_run
//! # let dir = std::path::Path::new("/tmp/t");
//! use lmcache_tier_e2e::bucket::BucketClient;
//! use lmcache_tier_e2e::seaweedfs::{SeaweedFs, SEAWEEDFS_REGION};
//! let store = SeaweedFs::start(dir, ("AKIAKEY", "secret"), &["kv-cache"]);
//! // An s3_bucket tier: s3_endpoint = store.endpoint(), s3_region = SEAWEEDFS_REGION,
//! // aws_access_key_id = "AKIAKEY", aws_secret_access_key = "secret".
//! let bucket = BucketClient::new(&store.access(), "kv-cache");
//! # drop(bucket);
//! ```
//!
//! What runs, each a `weed` process in a process group of its own ([`Proc`]),
//! started in this order, each once the one before is ready: the master
//! (single-master, no replication, 64 MiB volumes, no telemetry), three
//! volume servers (8 volumes each at most), the filer (its metadata in a
//! local store) and the S3 server, with one identity: the key given to
//! [`SeaweedFs::start`], allowed everything. Every HTTP and gRPC port is
//! picked with [`free_port`] (`weed`'s defaults, 9333, 8080, 8888 and 8333
//! and their gRPC ports at +10000, are never used), every server binds
//! 127.0.0.1 only, and every file is under `dir/seaweedfs` (data, logs, the
//! unix sockets `weed` otherwise puts in `/tmp`). The cluster is stopped
//! in the reverse order when the [`SeaweedFs`] is dropped, and no process
//! of it is left.
//!
//! How it differs from S3, as measured with 4.48: a listing comes in
//! folder order (a key's `/`-separated parts, each in byte order), not in
//! the keys' byte order; `LastModified` in ListObjectsV2 has second
//! precision; any region is accepted in a signature. Conditional PUTs
//! (`If-None-Match: *`, `If-Match`) are honoured atomically.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::bucket::{BucketClient, StoreAccess};
use crate::{free_port, Proc};

/// The region the tests sign for: SeaweedFS's S3 server accepts any region
/// in a signature; this is its default and a tier's `s3_region`.
pub const SEAWEEDFS_REGION: &str = "us-east-1";

/// The `weed` binary: `$EREBINE_TEST_SEAWEEDFS` (what
/// `scripts/setup-seaweedfs.sh` prints, set by `scripts/test.sh`). Panics
/// with what to run when it is missing: a test calls
/// [`crate::require_seaweedfs!`] first.
pub fn seaweedfs_binary() -> PathBuf {
    if let Some(why) = seaweedfs_missing() {
        panic!("{why}");
    }
    std::env::var_os("EREBINE_TEST_SEAWEEDFS")
        .map(PathBuf::from)
        .expect("EREBINE_TEST_SEAWEEDFS")
}

/// Why the SeaweedFS tests cannot run here, in one line naming the
/// variable and what to run; `None` when they can.
pub fn seaweedfs_missing() -> Option<String> {
    let Some(bin) = std::env::var_os("EREBINE_TEST_SEAWEEDFS").map(PathBuf::from) else {
        return Some(
            "EREBINE_TEST_SEAWEEDFS is not set: run scripts/test.sh, or set it to what scripts/setup-seaweedfs.sh prints".to_string(),
        );
    };
    (!bin.is_file()).then(|| {
        format!(
            "no weed at EREBINE_TEST_SEAWEEDFS={}: run scripts/setup-seaweedfs.sh (it installs SeaweedFS 4.48)",
            bin.display()
        )
    })
}

/// The first statement of a test that needs SeaweedFS: without it
/// ([`seaweedfs::seaweedfs_missing`](crate::seaweedfs::seaweedfs_missing))
/// the test writes `skipped (<module>): <why>` and returns.
#[macro_export]
macro_rules! require_seaweedfs {
    () => {
        if let Some(why) = $crate::seaweedfs::seaweedfs_missing() {
            $crate::say_skipped(::core::module_path!(), &why);
            return;
        }
    };
}

/// Volume servers in a cluster.
const VOLUME_SERVERS: usize = 3;

/// How long the whole start may take (it takes about 2 s on 2 cores).
const START_LIMIT: Duration = Duration::from_secs(60);

/// How long a stage of the stop waits after its SIGTERM before its
/// processes are killed (SIGKILL to their groups): the S3 server, the
/// volume servers and the master each stop in about 2 s.
const STOP_LIMIT: Duration = Duration::from_secs(5);

/// [`STOP_LIMIT`] for the filer, which takes 10-17 s to end its gRPC
/// server after a SIGTERM, or hangs: it is killed after 3 s.
const FILER_STOP_LIMIT: Duration = Duration::from_secs(3);

/// A running SeaweedFS cluster ([the module](self)).
pub struct SeaweedFs {
    /// The S3 server's port on 127.0.0.1 ([`SeaweedFs::endpoint`]).
    pub port: u16,
    key: (String, String),
    /// The processes by role, in start order; [`Drop`] takes them in the
    /// reverse order.
    master: Option<Proc>,
    volumes: Vec<Proc>,
    filer: Option<Proc>,
    s3: Option<Proc>,
    client: reqwest::blocking::Client,
}

impl SeaweedFs {
    /// Starts a cluster under `dir/seaweedfs` (data in `master/`, `volume-<i>/`
    /// and `filer/`, each process's log in `<role>.log`, the S3 identities in
    /// `s3.json`) on free ports, with `key` (access key id, secret) as its
    /// one S3 identity, and creates `buckets` with it. Returns once the S3
    /// server answers and the buckets exist; panics with every log when a
    /// process exits first or the start takes over 60 s.
    pub fn start(dir: &Path, key: (&str, &str), buckets: &[&str]) -> SeaweedFs {
        let started = Instant::now();
        let bin = seaweedfs_binary();
        let root = dir.join("seaweedfs");
        std::fs::create_dir_all(&root).expect("seaweedfs directory");
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(2))
            .no_proxy()
            .build()
            .expect("http client");
        let mut store = SeaweedFs {
            port: free_port(),
            key: (key.0.to_string(), key.1.to_string()),
            master: None,
            volumes: Vec::new(),
            filer: None,
            s3: None,
            client,
        };
        // A peer is named `host:port.grpcPort`: with a plain `host:port`,
        // `weed` dials the gRPC port at port + 10000.
        let (master_http, master_grpc) = (free_port(), free_port());
        let master = format!("-master=127.0.0.1:{master_http}.{master_grpc}");
        let mut cmd = weed(&bin, "master", master_http, master_grpc);
        cmd.arg(dir_flag("-mdir", &root.join("master"))).args([
            "-ip=127.0.0.1",
            "-peers=none",
            "-volumeSizeLimitMB=64",
            "-defaultReplication=000",
            "-telemetry=false",
        ]);
        store.master = Some(Proc::spawn(cmd, &root.join("master.log")));
        let status = format!("http://127.0.0.1:{master_http}/cluster/status");
        store.wait(started, "the master leads", |s| {
            s.get(&status)
                .is_some_and(|(_, body)| body.contains("\"IsLeader\":true"))
        });

        for i in 0..VOLUME_SERVERS {
            let mut cmd = weed(&bin, "volume", free_port(), free_port());
            cmd.arg(dir_flag("-dir", &root.join(format!("volume-{i}"))))
                .arg(&master)
                .args([
                    "-ip=127.0.0.1",
                    "-max=8",
                    "-minFreeSpace=1",
                    "-preStopSeconds=0",
                ]);
            store
                .volumes
                .push(Proc::spawn(cmd, &root.join(format!("volume-{i}.log"))));
        }
        let topology = format!("http://127.0.0.1:{master_http}/dir/status");
        store.wait(started, "the master knows every volume server", |s| {
            s.get(&topology)
                .is_some_and(|(_, body)| body.matches("\"Url\"").count() == VOLUME_SERVERS)
        });

        let (filer_http, filer_grpc) = (free_port(), free_port());
        let mut cmd = weed(&bin, "filer", filer_http, filer_grpc);
        cmd.arg(dir_flag("-defaultStoreDir", &root.join("filer")))
            .arg(&master)
            .arg("-ip=127.0.0.1")
            .arg(socket_flag(&root.join("filer.sock")));
        store.filer = Some(Proc::spawn(cmd, &root.join("filer.log")));
        let filer_url = format!("http://127.0.0.1:{filer_http}/");
        store.wait(started, "the filer answers", |s| {
            s.get(&filer_url).is_some()
        });

        let identities = serde_json::json!({"identities": [{"name": "kv",
            "credentials": [{"accessKey": key.0, "secretKey": key.1}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]});
        let config = root.join("s3.json");
        std::fs::write(&config, identities.to_string()).expect("s3.json");
        let mut cmd = weed(&bin, "s3", store.port, free_port());
        cmd.arg(format!("-filer=127.0.0.1:{filer_http}.{filer_grpc}"))
            .arg(format!("-config={}", config.display()))
            .args(["-port.iceberg=0", "-port.lance=0"])
            .arg(socket_flag(&root.join("s3.sock")));
        store.s3 = Some(Proc::spawn(cmd, &root.join("s3.log")));
        let s3_url = format!("http://{}/", store.endpoint());
        // Unsigned, it answers 403.
        store.wait(started, "the S3 server answers", |s| {
            s.get(&s3_url).is_some()
        });

        for bucket in buckets {
            BucketClient::new(&store.access(), bucket).create_bucket();
        }
        eprintln!(
            "SeaweedFS on {} answered with {} bucket(s) {:?} after its start",
            store.endpoint(),
            buckets.len(),
            started.elapsed()
        );
        store
    }

    /// `127.0.0.1:<port>`: a tier's `s3_endpoint` (with `disable_tls`).
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Where the store is and its key, for the kit's bucket client
    /// ([`BucketClient::new`]), signing for [`SEAWEEDFS_REGION`].
    pub fn access(&self) -> StoreAccess {
        StoreAccess {
            endpoint: self.endpoint(),
            region: SEAWEEDFS_REGION.to_string(),
            key_id: self.key.0.clone(),
            secret: self.key.1.clone(),
        }
    }

    /// GET `url`: its status and body, whatever the status; `None` when
    /// nothing answers.
    fn get(&self, url: &str) -> Option<(u16, String)> {
        let resp = self.client.get(url).send().ok()?;
        let status = resp.status().as_u16();
        Some((status, resp.text().unwrap_or_default()))
    }

    /// Polls `ready` every 50 ms; panics with every log when a process
    /// exited or the start has taken [`START_LIMIT`].
    fn wait(&mut self, started: Instant, what: &str, ready: impl Fn(&SeaweedFs) -> bool) {
        while !ready(self) {
            let exited = self.procs_mut().any(|p| p.try_status().is_some());
            if exited || started.elapsed() > START_LIMIT {
                let logs: Vec<String> = self
                    .procs()
                    .map(|p| format!("== {}\n{}", p.log.display(), p.output()))
                    .collect();
                panic!(
                    "SeaweedFS did not start: waiting until {what}, a process exited or {} s passed:\n{}",
                    START_LIMIT.as_secs(),
                    logs.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn procs(&self) -> impl Iterator<Item = &Proc> {
        self.master
            .iter()
            .chain(&self.volumes)
            .chain(&self.filer)
            .chain(&self.s3)
    }

    fn procs_mut(&mut self) -> impl Iterator<Item = &mut Proc> {
        self.master
            .iter_mut()
            .chain(&mut self.volumes)
            .chain(&mut self.filer)
            .chain(&mut self.s3)
    }
}

impl Drop for SeaweedFs {
    /// Stops the S3 server, then the filer, then the volume servers, then
    /// the master: SIGTERM, and SIGKILL to the process group of each one
    /// still running after its stage's limit (3 s for the filer, 5 s for
    /// the others); each process is reaped, so none is left.
    fn drop(&mut self) {
        let started = Instant::now();
        let mut killed = Vec::new();
        let stages = [
            (self.s3.take().into_iter().collect::<Vec<_>>(), STOP_LIMIT),
            (self.filer.take().into_iter().collect(), FILER_STOP_LIMIT),
            (std::mem::take(&mut self.volumes), STOP_LIMIT),
            (self.master.take().into_iter().collect(), STOP_LIMIT),
        ];
        for (procs, limit) in stages {
            killed.extend(stop(procs, limit));
        }
        eprintln!(
            "SeaweedFS on 127.0.0.1:{} stopped in {:?}{}",
            self.port,
            started.elapsed(),
            match killed.is_empty() {
                true => String::new(),
                false => format!(" (killed after their limit: {})", killed.join(", ")),
            }
        );
    }
}

/// SIGTERM to each of `procs`, then waits up to `limit` for them all; the
/// ones still running are killed with their groups when dropped here.
/// Returns the log file names of those killed.
fn stop(mut procs: Vec<Proc>, limit: Duration) -> Vec<String> {
    for proc in &procs {
        proc.signal(Signal::SIGTERM);
    }
    let started = Instant::now();
    while started.elapsed() < limit && procs.iter_mut().any(|p| p.try_status().is_none()) {
        std::thread::sleep(Duration::from_millis(20));
    }
    procs
        .iter_mut()
        .filter_map(|p| {
            let running = p.try_status().is_none();
            running.then(|| {
                p.log
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            })
        })
        .collect()
}

/// `weed -logtostderr <role>` bound to 127.0.0.1 on the `http` and `grpc`
/// ports (`-logtostderr` before the subcommand, or `weed` writes log files
/// into `/tmp`).
fn weed(bin: &Path, role: &str, http: u16, grpc: u16) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["-logtostderr", role, "-ip.bind=127.0.0.1"])
        .arg(format!("-port={http}"))
        .arg(format!("-port.grpc={grpc}"));
    cmd
}

/// `<flag>=<dir>`, the directory created.
fn dir_flag(flag: &str, dir: &Path) -> String {
    std::fs::create_dir_all(dir).expect("seaweedfs data directory");
    format!("{flag}={}", dir.display())
}

/// `-localSocket=<path>`, which `weed` otherwise puts in `/tmp`. Panics
/// when the path does not fit a unix socket's address (107 bytes).
fn socket_flag(path: &Path) -> String {
    assert!(
        path.as_os_str().len() <= 107,
        "{} is too long for a unix socket: start SeaweedFS in a shorter directory",
        path.display()
    );
    format!("-localSocket={}", path.display())
}
