//! A Swift-All-In-One for the end-to-end tests: OpenStack Swift 2.30.1
//! (`scripts/setup-swift.sh` installs Debian's packages) on free loopback
//! ports under a test's own directory, as a real path-style S3 store with
//! regions and accounts of its own.
//!
//! ```no_run
//! # let dir = std::path::Path::new("/tmp/t");
//! use lmcache_tier_e2e::swift::{Swift, SwiftOptions, KV, SWIFT_REGION};
//! let swift = Swift::start(dir, SwiftOptions::default());
//! swift.create_bucket(&KV, "kv-cache");
//! // An s3_bucket tier: s3_endpoint = swift.endpoint(), s3_region = SWIFT_REGION,
//! // aws_access_key_id = KV.access_key_id(), aws_secret_access_key = KV.key.
//! let objects = swift.list(&KV, "kv-cache+segments"); // (name, bytes), multipart parts
//! # drop(objects);
//! ```
//!
//! What runs: memcached, the account, container and object servers (one
//! worker each) and the proxy with `s3api` (`location = RegionOne`, no
//! storage domain: path-style only) and `tempauth` (two accounts,
//! [`KV`] and [`OTHER`]; an S3 access key is `account:user`, its secret the
//! user's key), each in a process group of its own, all killed when the
//! [`Swift`] is dropped. One replica, rings of part power 6 built with
//! Swift's `RingBuilder`, one device: a plain directory under `dir` (the
//! tests' ext4 volume: Swift keeps object metadata in user xattrs;
//! `mount_check = false`). [`Swift::start`] returns once every server
//! answers its `/healthcheck`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::{free_port, Proc};

/// The region Swift's s3api answers for (`location`): a tier's `s3_region`.
pub const SWIFT_REGION: &str = "RegionOne";

/// A tempauth account with one user, as S3 credentials.
#[derive(Debug, Clone, Copy)]
pub struct SwiftAccount {
    /// The Swift account (`AUTH_<account>` in native URLs).
    pub account: &'static str,
    /// Its user.
    pub user: &'static str,
    /// The user's key: the S3 secret access key.
    pub key: &'static str,
}

impl SwiftAccount {
    /// The S3 access key id: `account:user`.
    pub fn access_key_id(&self) -> String {
        format!("{}:{}", self.account, self.user)
    }

    /// The tempauth line of the proxy's configuration, with `key`.
    fn tempauth_line(&self, key: &str) -> String {
        format!("user_{}_{} = {key} .admin", self.account, self.user)
    }
}

/// The account the tests' tiers use: access key `kv:node`.
pub const KV: SwiftAccount = SwiftAccount {
    account: "kv",
    user: "node",
    key: "kvSecretKey0123456789abcdefABCDEF012345",
};

/// Another account of the same store: access key `other:node`. Its buckets
/// are not [`KV`]'s.
pub const OTHER: SwiftAccount = SwiftAccount {
    account: "other",
    user: "node",
    key: "otherSecretKey0123456789abcdefABCDEF0123",
};

/// What a test may change in the store's configuration.
#[derive(Debug, Clone, Copy)]
pub struct SwiftOptions {
    /// s3api's `min_segment_size`: the smallest part of a multipart upload
    /// but the last, bytes (Swift's default 5 MiB, as S3's).
    pub min_segment_size: u64,
    /// s3api's `max_upload_part_num`, and the SLO middleware's
    /// `max_manifest_segments` with it (Swift's default 1,000 for both).
    pub max_upload_part_num: u32,
    /// The proxy's `node_timeout`: how long it waits for a storage server's
    /// answer before it gives up on it, seconds (Swift's default 10).
    pub node_timeout_s: u32,
}

impl Default for SwiftOptions {
    fn default() -> Self {
        SwiftOptions {
            min_segment_size: 5 << 20,
            max_upload_part_num: 1000,
            node_timeout_s: 10,
        }
    }
}

/// The ports of one Swift-All-In-One, on 127.0.0.1.
#[derive(Debug, Clone, Copy)]
struct Ports {
    proxy: u16,
    account: u16,
    container: u16,
    object: u16,
    memcached: u16,
}

/// A running Swift-All-In-One ([the module](self)).
pub struct Swift {
    /// The proxy's port on 127.0.0.1: the S3 endpoint.
    pub port: u16,
    ports: Ports,
    etc: PathBuf,
    /// memcached and the storage servers.
    servers: Vec<Proc>,
    proxy: Option<Proc>,
    client: reqwest::blocking::Client,
    /// Keys given by [`Swift::set_key`], by account: the kit's own
    /// requests sign with them.
    rotated: std::collections::BTreeMap<&'static str, String>,
}

/// A Swift server stopped by [`Swift::pause_object_server`]; it goes on
/// when this is dropped.
#[must_use = "the server goes on as soon as this is dropped"]
pub struct Paused {
    group: Pid,
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = killpg(self.group, Signal::SIGCONT);
    }
}

/// Where the object server is in [`Swift`]'s servers: memcached, then the
/// account, container and object servers.
const OBJECT_SERVER: usize = 3;

/// The servers' binaries: `$EREBINE_TEST_SWIFT` (the directory
/// `scripts/setup-swift.sh` prints), else `None`.
pub fn swift_bin_dir() -> Option<PathBuf> {
    std::env::var_os("EREBINE_TEST_SWIFT").map(PathBuf::from)
}

/// Why the Swift tests cannot run here, in one line; `None` when they can.
pub fn swift_missing() -> Option<String> {
    let Some(dir) = swift_bin_dir() else {
        return Some(
            "EREBINE_TEST_SWIFT is not set: run scripts/test.sh, or set it to what scripts/setup-swift.sh prints".to_string(),
        );
    };
    let missing: Vec<&str> = BINARIES
        .iter()
        .copied()
        .filter(|bin| !dir.join(bin).is_file())
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "no {} in EREBINE_TEST_SWIFT={}: run scripts/setup-swift.sh",
            missing.join(", "),
            dir.display()
        )
    })
}

/// The first statement of a test that needs Swift, after
/// [`crate::require_lmcache!`]: without it ([`swift_missing`]) the test
/// writes `skipped (<module>): <why>` and returns.
#[macro_export]
macro_rules! require_swift {
    () => {
        if let Some(why) = $crate::swift::swift_missing() {
            $crate::say_skipped(::core::module_path!(), &why);
            return;
        }
    };
}

const BINARIES: &[&str] = &[
    "swift-proxy-server",
    "swift-account-server",
    "swift-container-server",
    "swift-object-server",
    "memcached",
];

/// How long the servers may take to answer their health checks.
const START_LIMIT: Duration = Duration::from_secs(60);

impl Swift {
    /// Starts a Swift-All-In-One under `dir` (configurations in
    /// `dir/swift/etc`, the device in `dir/swift/srv/d1`, logs in
    /// `dir/swift/*.log`) on free ports, and waits until every server
    /// answers. Panics with the servers' logs when one does not within 60 s.
    pub fn start(dir: &Path, options: SwiftOptions) -> Swift {
        let started = Instant::now();
        let bin = swift_bin_dir().expect("EREBINE_TEST_SWIFT (require_swift! first)");
        let root = dir.join("swift");
        let etc = root.join("etc");
        let device = root.join("srv/d1");
        std::fs::create_dir_all(&etc).expect("swift etc");
        std::fs::create_dir_all(&device).expect("swift device");
        let ports = Ports {
            proxy: free_port(),
            account: free_port(),
            container: free_port(),
            object: free_port(),
            memcached: free_port(),
        };
        build_rings(&etc, &ports);
        write_configs(&root, &ports, &options);
        let mut memcached = Command::new(bin.join("memcached"));
        memcached.args(["-l", "127.0.0.1", "-U", "0", "-m", "64"]);
        memcached.args(["-p", &ports.memcached.to_string()]);
        if nix::unistd::getuid().is_root() {
            memcached.args(["-u", "root"]);
        }
        let mut servers = vec![Proc::spawn(memcached, &root.join("memcached.log"))];
        for server in ["account", "container", "object"] {
            servers.push(spawn_server(&bin, &root, server));
        }
        let proxy = spawn_server(&bin, &root, "proxy");
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .no_proxy()
            .build()
            .expect("http client");
        let mut swift = Swift {
            port: ports.proxy,
            ports,
            etc,
            servers,
            proxy: Some(proxy),
            client,
            rotated: Default::default(),
        };
        swift.wait_healthy();
        eprintln!(
            "Swift-All-In-One on 127.0.0.1:{} answered {:?} after its start",
            swift.port,
            started.elapsed()
        );
        swift
    }

    /// `127.0.0.1:<port>`: a tier's `s3_endpoint` (with `disable_tls`).
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Creates `bucket` in `account` (a container, through Swift's own API).
    pub fn create_bucket(&self, account: &SwiftAccount, bucket: &str) {
        let (url, token) = self.token(account);
        let resp = self
            .client
            .put(format!("{url}/{bucket}"))
            .header("x-auth-token", token)
            .send()
            .expect("swift answers");
        assert!(
            resp.status().is_success(),
            "create bucket {bucket}: {resp:?}"
        );
    }

    /// Every object of `container` in `account` with its size in bytes, in
    /// name order: a bucket, or `<bucket>+segments`, where s3api keeps the
    /// parts of multipart uploads (`<key>/<upload id>/<part>`, and an
    /// `<key>/<upload id>` marker while an upload is open). Empty when the
    /// container does not exist.
    pub fn list(&self, account: &SwiftAccount, container: &str) -> Vec<(String, u64)> {
        let (url, token) = self.token(account);
        let mut found = Vec::new();
        loop {
            let marker = found.last().map_or("", |(name, _): &(String, u64)| name);
            let resp = self
                .client
                .get(format!("{url}/{container}"))
                .query(&[("format", "json"), ("marker", marker)])
                .header("x-auth-token", &token)
                .send()
                .expect("swift answers a listing");
            if resp.status().as_u16() == 404 {
                return found;
            }
            assert!(resp.status().is_success(), "list {container}: {resp:?}");
            let page: Vec<serde_json::Value> = resp.json().expect("a JSON listing");
            if page.is_empty() {
                return found;
            }
            found.extend(page.iter().map(|o| {
                let name = o["name"].as_str().expect("name").to_string();
                (name, o["bytes"].as_u64().expect("bytes"))
            }));
        }
    }

    /// Gives `account`'s user the key `key` (its S3 secret): the proxy is
    /// restarted with it on the same port, so requests signed with the old
    /// key are refused with 403 from then on (credentials revoked at the
    /// store); [`Swift::create_bucket`] and [`Swift::list`] use the new key.
    /// Returns once the proxy answers again.
    pub fn set_key(&mut self, account: &SwiftAccount, key: &str) {
        self.rotated.insert(account.account, key.to_string());
        let conf = self.etc.join("proxy-server.conf");
        let text = std::fs::read_to_string(&conf).expect("proxy-server.conf");
        let prefix = format!("user_{}_{} =", account.account, account.user);
        let text: Vec<String> = text
            .lines()
            .map(|line| {
                if line.starts_with(&prefix) {
                    account.tempauth_line(key)
                } else {
                    line.to_string()
                }
            })
            .collect();
        std::fs::write(&conf, text.join("\n") + "\n").expect("proxy-server.conf");
        drop(self.proxy.take());
        let bin = swift_bin_dir().expect("EREBINE_TEST_SWIFT");
        let root = self.etc.parent().expect("swift root").to_path_buf();
        self.proxy = Some(spawn_server(&bin, &root, "proxy"));
        self.wait_healthy();
    }

    /// Stops the object server (SIGSTOP to its process group: the server
    /// and its worker) until the returned guard is dropped (SIGCONT): a
    /// store whose disks hang. The proxy's requests to it wait, up to its
    /// [`SwiftOptions::node_timeout_s`], and are answered once it goes on.
    pub fn pause_object_server(&self) -> Paused {
        let group = Pid::from_raw(self.servers[OBJECT_SERVER].pid());
        killpg(group, Signal::SIGSTOP).expect("SIGSTOP the object server");
        Paused { group }
    }

    /// Panics with `what` and the last lines the proxy and memcached
    /// logged (and whether memcached still runs: tempauth keeps its tokens
    /// there, and answers 503 without it).
    fn fail(&self, what: &str) -> ! {
        let tail = |text: String| {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(20)..].join("\n")
        };
        let proxy = self
            .proxy
            .as_ref()
            .map(|p| tail(p.output()))
            .unwrap_or_default();
        let memcached = &self.servers[0];
        let alive = nix::sys::signal::kill(Pid::from_raw(memcached.pid()), None).is_ok();
        panic!(
            "{what}\n--- the proxy's log, last lines:\n{proxy}\n--- memcached (port {}, {}):\n{}",
            self.ports.memcached,
            if alive { "running" } else { "GONE" },
            tail(memcached.output())
        );
    }

    /// A tempauth token of `account`: its storage URL and token.
    fn token(&self, account: &SwiftAccount) -> (String, String) {
        let resp = self
            .client
            .get(format!("http://127.0.0.1:{}/auth/v1.0", self.port))
            .header("x-auth-user", account.access_key_id())
            .header(
                "x-auth-key",
                self.rotated
                    .get(account.account)
                    .map_or(account.key, String::as_str),
            )
            .send()
            .expect("tempauth answers");
        if !resp.status().is_success() {
            self.fail(&format!("tempauth: {resp:?}"));
        }
        let header = |name: &str| {
            resp.headers()[name]
                .to_str()
                .expect("an ASCII header")
                .to_string()
        };
        (header("x-storage-url"), header("x-auth-token"))
    }

    /// Waits until every server answers `GET /healthcheck` with 200.
    fn wait_healthy(&mut self) {
        let started = Instant::now();
        let ports = [
            self.ports.account,
            self.ports.container,
            self.ports.object,
            self.ports.proxy,
        ];
        for port in ports {
            let url = format!("http://127.0.0.1:{port}/healthcheck");
            loop {
                let ok = self
                    .client
                    .get(&url)
                    .timeout(Duration::from_secs(2))
                    .send()
                    .is_ok_and(|r| r.status().is_success());
                if ok {
                    break;
                }
                self.assert_running(started);
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Panics with the logs when a server exited or the start took too long.
    fn assert_running(&mut self, started: Instant) {
        let exited = self
            .servers
            .iter_mut()
            .chain(self.proxy.as_mut())
            .any(|p| p.try_status().is_some());
        if exited || started.elapsed() > START_LIMIT {
            let logs: Vec<String> = self
                .servers
                .iter()
                .chain(self.proxy.as_ref())
                .map(|p| format!("== {}\n{}", p.log.display(), p.output()))
                .collect();
            panic!(
                "Swift did not start (a server exited, or {} s passed):\n{}",
                START_LIMIT.as_secs(),
                logs.join("\n")
            );
        }
    }
}

/// Starts `swift-<server>-server` with its configuration, on the console
/// (`-v`: its log lines go to `root/<server>.log`).
fn spawn_server(bin: &Path, root: &Path, server: &str) -> Proc {
    let mut cmd = Command::new(bin.join(format!("swift-{server}-server")));
    cmd.arg(root.join(format!("etc/{server}-server.conf")))
        .arg("-v");
    Proc::spawn(cmd, &root.join(format!("{server}.log")))
}

/// Builds the account, container and object rings in `etc` with Swift's
/// own `RingBuilder` in one run of the system Python (what
/// `swift-ring-builder create 6 1 1`, `add r1z1-127.0.0.1:<port>/d1 100`
/// and `rebalance` write: part power 6, one replica, one device `d1` on
/// 127.0.0.1 at the server's port): one import of Swift instead of nine.
fn build_rings(etc: &Path, ports: &Ports) {
    let out = Command::new("/usr/bin/python3")
        .args(["-c", BUILD_RINGS])
        .arg(format!("account={}", ports.account))
        .arg(format!("container={}", ports.container))
        .arg(format!("object={}", ports.object))
        .current_dir(etc)
        .output()
        .expect("/usr/bin/python3 runs");
    assert!(out.status.success(), "building the rings: {out:?}");
}

/// The rings of [`build_rings`]: one `name=port` argument a ring.
const BUILD_RINGS: &str = r#"
import sys
from swift.common.ring import RingBuilder
for arg in sys.argv[1:]:
    name, port = arg.split("=")
    builder = RingBuilder(6, 1, 1)
    builder.add_dev({"region": 1, "zone": 1, "ip": "127.0.0.1", "port": int(port),
                     "replication_ip": "127.0.0.1", "replication_port": int(port),
                     "device": "d1", "weight": 100, "meta": ""})
    builder.rebalance()
    builder.get_ring().save(name + ".ring.gz")
    builder.save(name + ".builder")
"#;

/// The user the servers run as: the test's own.
fn user() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map_or_else(|| "root".to_string(), |u| u.name)
}

/// Writes `swift.conf` and the four servers' configurations under
/// `root/etc`.
fn write_configs(root: &Path, ports: &Ports, options: &SwiftOptions) {
    let etc = root.join("etc");
    let write = |name: &str, text: String| {
        std::fs::write(etc.join(name), text).expect("swift configuration");
    };
    write(
        "swift.conf",
        "[swift-hash]\nswift_hash_path_suffix = erebine-e2e-suffix\nswift_hash_path_prefix = erebine-e2e-prefix\n\n\
         [storage-policy:0]\nname = gold\ndefault = yes\n"
            .to_string(),
    );
    let common = |port: u16, name: &str| {
        format!(
            "[DEFAULT]\nbind_ip = 127.0.0.1\nbind_port = {port}\nworkers = 1\nuser = {user}\n\
             swift_dir = {etc}\ndevices = {devices}\nmount_check = false\ndisable_fallocate = true\n\
             log_name = {name}\nlog_level = INFO\nlog_address = {dev_log}\n\
             recon_cache_path = {root}\n\n",
            user = user(),
            etc = etc.display(),
            devices = root.join("srv").display(),
            dev_log = root.join("no-syslog").display(),
            root = root.display(),
        )
    };
    // The object server waits for its container update before it answers
    // a PUT or DELETE, up to 10 s (Swift's defaults answer after 1 s and
    // leave an update that takes over 3 s to an object updater, which this
    // store does not run): a listing shows every object whose store was
    // answered, as the tests' samplers and the bucket bound expect.
    for (server, port, options) in [
        ("account", ports.account, ""),
        ("container", ports.container, ""),
        (
            "object",
            ports.object,
            "container_update_timeout = 10\nnode_timeout = 10\n",
        ),
    ] {
        write(
            &format!("{server}-server.conf"),
            format!(
                "{}[pipeline:main]\npipeline = healthcheck {server}-server\n\n\
                 [app:{server}-server]\nuse = egg:swift#{server}\n{options}\n\
                 [filter:healthcheck]\nuse = egg:swift#healthcheck\n",
                common(port, &format!("{server}-server"))
            ),
        );
    }
    let filters = [
        "catch_errors",
        "gatekeeper",
        "healthcheck",
        "proxy_logging",
        "listing_formats",
        "copy",
        "dlo",
    ];
    let mut proxy = common(ports.proxy, "proxy-server");
    proxy.push_str(
        "[pipeline:main]\n\
         pipeline = catch_errors gatekeeper healthcheck proxy_logging cache listing_formats s3api tempauth copy slo dlo proxy_logging proxy-server\n\n\
         [app:proxy-server]\nuse = egg:swift#proxy\naccount_autocreate = true\n",
    );
    proxy.push_str(&format!("node_timeout = {}\n\n", options.node_timeout_s));
    proxy.push_str(&format!(
        "[filter:s3api]\nuse = egg:swift#s3api\nlocation = {SWIFT_REGION}\n\
         min_segment_size = {}\nmax_upload_part_num = {}\n\n",
        options.min_segment_size, options.max_upload_part_num
    ));
    proxy.push_str(&format!(
        "[filter:tempauth]\nuse = egg:swift#tempauth\n{}\n{}\n\n",
        KV.tempauth_line(KV.key),
        OTHER.tempauth_line(OTHER.key)
    ));
    proxy.push_str(&format!(
        "[filter:cache]\nuse = egg:swift#memcache\nmemcache_servers = 127.0.0.1:{}\n\n",
        ports.memcached
    ));
    proxy.push_str(&format!(
        "[filter:slo]\nuse = egg:swift#slo\nmax_manifest_segments = {}\n\n",
        options.max_upload_part_num
    ));
    for filter in filters {
        proxy.push_str(&format!("[filter:{filter}]\nuse = egg:swift#{filter}\n\n"));
    }
    write("proxy-server.conf", proxy);
}
