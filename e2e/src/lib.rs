//! Harness of the end-to-end suite (`tests/e2e/`, one test binary with a
//! module per concern, and the `watch_poll` bench of the workspace's root
//! package `lmcache-tier`): runs the shipped binaries Cargo
//! built for the calling test ([`binaries!`]), finds the real LMCache that
//! `scripts/setup-lmcache.sh` installed, picks free loopback ports, and runs
//! processes that cannot outlive a test.
//!
//! Nothing here fakes LMCache: every test drives the real `lmcache server`
//! and the real `lmcache bench` commands.

use std::collections::BTreeSet;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};

pub mod bucket;
pub mod fault_proxy;
pub mod hostile_store;
pub mod podman;
pub mod redis;
pub mod seaweedfs;
pub mod swift;
use nix::unistd::Pid;

/// Where the virtual environment holding `lmcache==0.5.6` is looked for:
/// `$EREBINE_TEST_LMCACHE_VENV`, else the default of
/// `scripts/setup-lmcache.sh` (`~/.cache/erebine/lmcache-0.5.6`).
fn lmcache_venv_path() -> PathBuf {
    std::env::var_os("EREBINE_TEST_LMCACHE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            Path::new(&home).join(".cache/erebine/lmcache-0.5.6")
        })
}

/// Why the real LMCache cannot be run here, in one line naming where it
/// was looked for and what to run; `None` when it can. The end-to-end tests
/// skip with this line ([`require_lmcache!`]).
pub fn lmcache_missing() -> Option<String> {
    let venv = lmcache_venv_path();
    (!venv.join("bin/lmcache").is_file()).then(|| {
        format!(
            "no lmcache in {}: run scripts/test.sh (it installs lmcache==0.5.6), or set EREBINE_TEST_LMCACHE_VENV",
            venv.display()
        )
    })
}

/// The wall time of one end-to-end test, from [`time_test!`] to the end
/// of the test's body (passed or failed), appended as one line
/// `<test>\t<seconds>` to the file `$EREBINE_TEST_TIMES` names
/// (`scripts/test.sh` sets it and prints the slowest tests from it);
/// nothing without that variable. The test is named by its thread, as the
/// test harness names it (`<module>::<test>`), else by its module.
#[derive(Debug)]
pub struct TestTime {
    test: String,
    started: Instant,
}

impl TestTime {
    /// Starts the clock of the test running on this thread, in `module`;
    /// `None` without `$EREBINE_TEST_TIMES`.
    pub fn start(module: &str) -> Option<TestTime> {
        std::env::var_os("EREBINE_TEST_TIMES")?;
        let thread = std::thread::current();
        let test = thread.name().filter(|n| *n != "main").unwrap_or(module);
        Some(TestTime {
            test: test.to_string(),
            started: Instant::now(),
        })
    }
}

impl Drop for TestTime {
    fn drop(&mut self) {
        use std::io::Write;
        let Some(path) = std::env::var_os("EREBINE_TEST_TIMES") else {
            return;
        };
        let line = format!(
            "{}\t{:.1}\n",
            self.test,
            self.started.elapsed().as_secs_f64()
        );
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path);
        // One short write with O_APPEND: lines of tests that end together
        // do not mix.
        let _ = file.and_then(|mut f| f.write_all(line.as_bytes()));
    }
}

/// Starts the clock of this test ([`TestTime`]), kept until the end of the
/// calling block: the first statement of every end-to-end test, through
/// [`require_lmcache!`] or on its own.
#[macro_export]
macro_rules! time_test {
    () => {
        let _test_time = $crate::TestTime::start(::core::module_path!());
    };
}

/// The first statement of an end-to-end test: without the real LMCache
/// ([`lmcache_missing`]) the test writes `skipped (<module>): <why>` to
/// stderr, past the test harness's capture so that `cargo test` shows it,
/// and returns; so `cargo test` on a machine without LMCache passes and
/// says what it skipped. `scripts/test.sh` installs it: there every test
/// runs.
#[macro_export]
macro_rules! require_lmcache {
    () => {
        $crate::time_test!();
        if let Some(why) = $crate::lmcache_missing() {
            $crate::say_skipped(::core::module_path!(), &why);
            return;
        }
    };
}

/// Writes `skipped (<module>): <why>` to the process's stderr itself, which
/// the test harness does not capture (it captures `eprintln!`).
pub fn say_skipped(module: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipped ({module}): {why}");
}

/// The virtual environment holding `lmcache==0.5.6` ([`lmcache_missing`]
/// says where it is looked for). Panics with what to run when it is
/// missing: a test calls [`require_lmcache!`] first.
pub fn lmcache_venv() -> PathBuf {
    if let Some(why) = lmcache_missing() {
        panic!("{why}");
    }
    lmcache_venv_path()
}

/// The shipped binaries under test, as Cargo built them for the calling
/// integration test or bench of the root package `lmcache-tier` (with its profile: release
/// for `cargo bench`). Make one with [`binaries!`].
#[derive(Clone, Copy, Debug)]
pub struct Binaries {
    lmcache_tier: &'static str,
    erebine_lmcache: &'static str,
}

/// The [`Binaries`] Cargo built for the integration test or bench that
/// expands it: `CARGO_BIN_EXE_lmcache-tier` and
/// `CARGO_BIN_EXE_erebine-lmcache`, which Cargo sets only when it compiles a
/// test or bench target of the root package `lmcache-tier`, which builds them. A constant expression:
/// `const BINS: Binaries = binaries!();`.
#[macro_export]
macro_rules! binaries {
    () => {
        $crate::Binaries::new(
            ::core::env!("CARGO_BIN_EXE_lmcache-tier"),
            ::core::env!("CARGO_BIN_EXE_erebine-lmcache"),
        )
    };
}

impl Binaries {
    /// The binaries at these paths (what [`binaries!`] passes).
    pub const fn new(lmcache_tier: &'static str, erebine_lmcache: &'static str) -> Binaries {
        Binaries {
            lmcache_tier,
            erebine_lmcache,
        }
    }

    /// `lmcache-tier`: `launch`, `inspect`, `size`, `housekeep`.
    pub fn lmcache_tier(&self) -> &'static Path {
        Path::new(self.lmcache_tier)
    }

    /// `erebine-lmcache`: the image entrypoint that supervises the server.
    pub fn erebine_lmcache(&self) -> &'static Path {
        Path::new(self.erebine_lmcache)
    }

    /// `lmcache-tier launch` for a node whose home, disk path and log live in
    /// `dir`, on the given loopback ports, with a 1 GiB L1, model
    /// `test-model` (the name the CPU bench worker writes under) and the
    /// given extra flags.
    pub fn launch_command(
        &self,
        dir: &Path,
        mp_port: u16,
        http_port: u16,
        extra: &[&str],
    ) -> Command {
        self.launch_command_for(dir, mp_port, http_port, "test-model", extra)
    }

    /// `lmcache-tier inspect --json` for the node of
    /// [`Binaries::launch_command`] in `dir` (its disk path), in an
    /// environment of only the node's HTTP and metrics ports: the report as
    /// JSON.
    pub fn inspect_json(&self, dir: &Path, http_port: u16, metrics_port: u16) -> serde_json::Value {
        let out = Command::new(self.lmcache_tier())
            .env_clear()
            .env("EREBINE_AGENT_LMCACHE_HTTP_PORT", http_port.to_string())
            .env(
                "EREBINE_AGENT_LMCACHE_METRICS_PORT",
                metrics_port.to_string(),
            )
            .env("EREBINE_AGENT_LMCACHE_DISK_PATH", dir.join("cache"))
            .args(["inspect", "--json"])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// [`Binaries::launch_command`] with `--model model`: the launch
    /// identity of a node serving another model (its bench names its
    /// objects after it with [`BenchOptions::model`]).
    pub fn launch_command_for(
        &self,
        dir: &Path,
        mp_port: u16,
        http_port: u16,
        model: &str,
        extra: &[&str],
    ) -> Command {
        let mut cmd = Command::new(self.lmcache_tier());
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", dir)
            .env("VIRTUAL_ENV", lmcache_venv())
            .env("EREBINE_AGENT_KV_CACHE_BACKEND", "lmcache")
            .env("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1")
            .env("EREBINE_AGENT_LMCACHE_DISK_PATH", dir.join("cache"))
            .env("EREBINE_AGENT_LMCACHE_MP_PORT", mp_port.to_string())
            .env("EREBINE_AGENT_LMCACHE_HTTP_PORT", http_port.to_string())
            .env(
                "EREBINE_AGENT_LMCACHE_METRICS_PORT",
                free_port().to_string(),
            )
            .args(["launch", "--model", model])
            .args(extra);
        cmd
    }
}

/// A loopback port nobody listens on right now, one this test process has
/// not handed out before, and one no ephemeral bind can take before the
/// test's server binds it: drawn below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`), which every `bind` to port
/// 0 (a gateway, a store, a client's own end of a connection) draws from.
/// A port from that range, released and then given to the server, could
/// be taken meanwhile by such a bind. Where the range leaves no room below
/// it (it starts under 12,000), an ephemeral port is the fallback.
///
/// Where `EREBINE_TEST_PORTS` names a range (`first-last`, inclusive; set by
/// `scripts/test.sh` to a slice of its own for each test process it runs
/// beside others), ports are drawn from that range only, so two test
/// processes never draw the same port (once it is all in use, an
/// ephemeral port is the fallback). A value that does not parse is a panic
/// naming it.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let (first, end) = match std::env::var("EREBINE_TEST_PORTS") {
        Ok(range) => port_range(&range).unwrap_or_else(|| {
            panic!("EREBINE_TEST_PORTS={range:?}: expected first-last, e.g. 10000-14999")
        }),
        Err(_) => match u32::from(ephemeral_start().unwrap_or(32768)) {
            low if low >= 12_000 => (10_000, low),
            _ => (0, 0),
        },
    };
    if end > first {
        let span = end - first;
        let mut draw = std::process::id().wrapping_mul(2_654_435_761)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
        for _ in 0..span {
            draw = draw.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let port = (first + (draw >> 8) % span) as u16;
            if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.insert(port);
                return port;
            }
        }
    }
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("an ephemeral port");
        if given.insert(port) {
            return port;
        }
    }
}

/// `first-last` (inclusive) as `(first, last + 1)`, if it is a range of
/// ports.
fn port_range(range: &str) -> Option<(u32, u32)> {
    let (first, last) = range.trim().split_once('-')?;
    let (first, last): (u16, u16) = (first.trim().parse().ok()?, last.trim().parse().ok()?);
    (first > 0 && first <= last).then_some((first.into(), u32::from(last) + 1))
}

/// The first port of the kernel's ephemeral range, if it can be read.
fn ephemeral_start() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

/// A child process in its own process group, killed with its whole group
/// when dropped, whose output goes to a log file.
pub struct Proc {
    child: Child,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(mut cmd: Command, log: &Path) -> Proc {
        let out = std::fs::File::create(log).expect("log file");
        let err = out.try_clone().expect("log file");
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = cmd.spawn().expect("spawn");
        Proc {
            child,
            log: log.to_path_buf(),
        }
    }

    /// Process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `sig` to the process (not its group).
    pub fn signal(&self, sig: Signal) {
        let _ = nix::sys::signal::kill(Pid::from_raw(self.pid()), sig);
    }

    /// Waits up to `limit` for the process to exit.
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }

    /// Whether it has exited (without reaping a running process).
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Everything it printed so far.
    pub fn output(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.pid()), Signal::SIGKILL);
        let _ = self.child.wait();
        remove_bench_shm(self.pid());
    }
}

/// Removes the POSIX shared-memory segments a CPU bench worker with process
/// id `pid` leaves in `/dev/shm` when it does not end cleanly
/// (`lmcache_kv_<pid>_<n>`, 64 MiB each, 2 GiB a worker: a test that kills
/// the worker would otherwise fill `/dev/shm` over a few runs).
fn remove_bench_shm(pid: i32) {
    let prefix = format!("lmcache_kv_{pid}_");
    for entry in std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
    {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// GETs `url` and parses JSON; `None` on any failure or non-200 answer.
pub fn get_json(url: &str) -> Option<serde_json::Value> {
    serde_json::from_str(&get_text(url)?).ok()
}

/// GET `url` (loopback): the body of a 200 answer as text, else `None`.
pub fn get_text(url: &str) -> Option<String> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .no_proxy()
        .build()
        .ok()?;
    let resp = client.get(url).send().ok()?;
    if resp.status().as_u16() != 200 {
        return None;
    }
    resp.text().ok()
}

/// The page at `url` as Prometheus asks for it (`Accept:
/// application/openmetrics-text`); `None` when nothing answers 200 within
/// 10 s.
pub fn get_openmetrics(url: &str) -> Option<String> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .ok()?;
    let resp = client
        .get(url)
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        )
        .send()
        .ok()?;
    if resp.status().as_u16() != 200 {
        return None;
    }
    resp.text().ok()
}

/// Parses `text` with a strict OpenMetrics 1.0 parser, that of the
/// Python `prometheus_client` in the LMCache environment
/// (`prometheus_client.openmetrics.parser.text_string_to_metric_families`,
/// which also checks a histogram's buckets against its count): the number
/// of families, or the parser's error. `promtool check metrics` checks
/// less (it takes a histogram whose `+Inf` bucket is not its count).
pub fn strict_openmetrics(text: &str) -> Result<usize, String> {
    let python = lmcache_venv().join("bin/python");
    let script = "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families as parse\nprint(len(list(parse(sys.stdin.read()))))\n";
    let mut child = Command::new(&python)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let mut stdin = child.stdin.take().expect("a pipe");
    std::io::Write::write_all(&mut stdin, text.as_bytes()).expect("the page written");
    drop(stdin);
    let out = child.wait_with_output().expect("the parser ends");
    match out.status.success() {
        true => String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|e| format!("{e}")),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// Prometheus's `promtool`: `$EREBINE_TEST_PROMTOOL`, else `promtool` on
/// `PATH`. Panics with what to run when it is missing.
pub fn promtool() -> PathBuf {
    let tool = std::env::var_os("EREBINE_TEST_PROMTOOL")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|dir| dir.join("promtool"))
                .find(|p| p.is_file())
        });
    match tool {
        Some(tool) if tool.is_file() => tool,
        _ => panic!(
            "no promtool: run scripts/test.sh (scripts/setup-prometheus.sh installs Debian's prometheus package), or set EREBINE_TEST_PROMTOOL"
        ),
    }
}

/// The `prometheus` server beside [`promtool`] (Debian's `prometheus`
/// package has both).
pub fn prometheus_binary() -> PathBuf {
    let server = promtool().with_file_name("prometheus");
    assert!(
        server.is_file(),
        "no prometheus beside promtool at {}: run scripts/setup-prometheus.sh",
        server.display()
    );
    server
}

/// Calls `done` every 250 ms until it returns true or `limit` has passed;
/// returns its last answer (it is asked once more at the limit).
pub fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    done()
}

/// Waits for the server of `launch` (an `lmcache-tier launch`) to answer
/// `url` (within 180 s), then for the launch to log that it saw it ready
/// (`LMCache server ready in`, within 30 s): the launch supervises a
/// server as ready (restarts it, watches it) only from that line on.
/// Panics with the launch's output otherwise.
pub fn wait_for_ready_launch(url: &str, launch: &mut Proc) {
    wait_for_status(url, launch, Duration::from_secs(180));
    assert!(
        wait_until(Duration::from_secs(30), || launch
            .output()
            .contains("LMCache server ready in")),
        "{}",
        launch.output()
    );
}

/// Polls `url` until it answers 200 with JSON, or panics after `limit` with
/// `proc`'s output (the process is checked for an early exit each round).
pub fn wait_for_status(url: &str, proc: &mut Proc, limit: Duration) -> serde_json::Value {
    let start = Instant::now();
    loop {
        if let Some(body) = get_json(url) {
            return body;
        }
        if let Some(status) = proc.try_status() {
            panic!(
                "process exited ({status}) before {url} answered:\n{}",
                proc.output()
            );
        }
        assert!(
            start.elapsed() < limit,
            "{url} did not answer within {limit:?}:\n{}",
            proc.output()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Pids of live processes whose command line contains `needle` (excluding
/// this test process).
pub fn processes_mentioning(needle: &str) -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push((pid, cmdline));
        }
    }
    found
}

/// What one run of the real CPU bench worker did.
pub struct BenchRun {
    /// Its exit status.
    pub status: ExitStatus,
    /// Everything it printed.
    pub output: String,
    /// The most `worker_liveness.tracked_instances` seen while it ran.
    pub most_tracked: u64,
}

impl BenchRun {
    /// Cold lookups that hit every chunk of the request (`LOOKUP: 4/4 chunks
    /// hit` on a `cold` line): the request's KV was already in the server.
    pub fn full_cold_hits(&self) -> usize {
        self.output
            .lines()
            .filter(|l| l.contains("/cold] LOOKUP:"))
            .filter(|l| {
                l.split("LOOKUP:")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|frac| frac.split_once('/'))
                    .is_some_and(|(hit, all)| hit == all && hit != "0")
            })
            .count()
    }
}

/// `lmcache bench server --mode cpu --transfer-mode lmcache_driven` for
/// sequences `start..end` of 1024 tokens, one every `interval` seconds,
/// against the server on the given loopback ports.
pub fn bench_command(
    mp_port: u16,
    http_port: u16,
    start: u32,
    end: u32,
    interval: &str,
) -> Command {
    let options = BenchOptions {
        interval,
        ..BenchOptions::default()
    };
    bench_command_with(Path::new("."), mp_port, http_port, start, end, &options)
}

/// How a CPU bench run differs from [`run_bench`]'s.
#[derive(Clone, Copy, Debug)]
pub struct BenchOptions<'a> {
    /// Seconds between two sequences (`--interval`): 0.1 for [`run_bench`].
    pub interval: &'a str,
    /// `--kvcache-shape-spec`: `None` for the bench's default,
    /// `(2,1024,16,8,128):float16:32` (32 layers, 128 KiB of KV a token);
    /// `(2,1024,16,8,128):float16:1` (one layer) makes it 4 KiB a token,
    /// so a sequence (1025 tokens) at the launch's 1024-token chunks is one
    /// 4 MiB object.
    pub kvcache_shape_spec: Option<&'a str>,
    /// The model the bench worker registers and names its objects after:
    /// `None` for LMCache's `test-model`; another through the wrapper of
    /// [`venv_with_bench_model`] (in the run's directory).
    pub model: Option<&'a str>,
}

impl Default for BenchOptions<'_> {
    fn default() -> Self {
        BenchOptions {
            interval: "0.1",
            kvcache_shape_spec: None,
            model: None,
        }
    }
}

/// The arguments of `lmcache bench server --mode cpu --transfer-mode
/// lmcache_driven` for sequences `start..end` of 1024 tokens against the
/// server on the given loopback ports, with `options`' interval and shape
/// (its model is the caller's: an environment variable).
pub fn bench_args(
    mp_port: u16,
    http_port: u16,
    start: u32,
    end: u32,
    options: &BenchOptions<'_>,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "bench",
        "server",
        "--mode",
        "cpu",
        "--transfer-mode",
        "lmcache_driven",
    ]
    .map(String::from)
    .to_vec();
    args.extend([
        "--rpc-url".into(),
        format!("tcp://127.0.0.1:{mp_port}"),
        "--url".into(),
        format!("http://127.0.0.1:{http_port}"),
        "--start".into(),
        start.to_string(),
        "--end".into(),
        end.to_string(),
        "--interval".into(),
        options.interval.into(),
        "--num-tokens".into(),
        "1024".into(),
    ]);
    if let Some(shape) = options.kvcache_shape_spec {
        args.extend(["--kvcache-shape-spec".into(), shape.into()]);
    }
    args
}

/// [`bench_command`] with `options`; `dir` holds the wrapper environment
/// of [`BenchOptions::model`].
pub fn bench_command_with(
    dir: &Path,
    mp_port: u16,
    http_port: u16,
    start: u32,
    end: u32,
    options: &BenchOptions<'_>,
) -> Command {
    let venv = match options.model {
        Some(_) => venv_with_bench_model(dir),
        None => lmcache_venv(),
    };
    let mut cmd = Command::new(venv.join("bin/lmcache"));
    cmd.args(bench_args(mp_port, http_port, start, end, options))
        .env("LMCACHE_TRACK_USAGE", "false")
        .env("LMCACHE_DISABLE_BANNER", "1");
    if let Some(model) = options.model {
        cmd.env("BENCH_MODEL", model);
    }
    cmd
}

/// Runs [`bench_command`] for sequences `start..end` (0.1 s apart), watching
/// `/status` while it runs (at most 600 s: a loaded 2-core machine takes over
/// a minute just to start the bench).
///
/// The bench gives its registration with the server a fixed 10 s
/// (`REGISTER_KV_CACHE failed`, before any chunk is sent), which a server
/// on a loaded 2-core machine can miss; such a run is started again, up to
/// twice, and said on stderr. Every other failure is the caller's.
pub fn run_bench(dir: &Path, mp_port: u16, http_port: u16, start: u32, end: u32) -> BenchRun {
    run_bench_with(
        dir,
        mp_port,
        http_port,
        start,
        end,
        &BenchOptions::default(),
    )
}

/// A one-layer KV shape for the CPU bench (`--kvcache-shape-spec`): 4 KiB
/// of KV a token, 1/32 of the bench's default, with the same chunks,
/// objects, keys and hits. Tests that count objects, keys or hits rather
/// than bytes use it ([`run_one_layer_bench`]): every byte they would
/// move is copied, signed and stored by real servers (some in Python) on a
/// small machine.
pub const ONE_LAYER: &str = "(2,1024,16,8,128):float16:1";

/// [`run_bench`] with the [`ONE_LAYER`] shape: a sequence of 1024 tokens
/// is 4 MiB of KV instead of 128 MiB.
pub fn run_one_layer_bench(
    dir: &Path,
    mp_port: u16,
    http_port: u16,
    start: u32,
    end: u32,
) -> BenchRun {
    let options = BenchOptions {
        kvcache_shape_spec: Some(ONE_LAYER),
        ..BenchOptions::default()
    };
    run_bench_with(dir, mp_port, http_port, start, end, &options)
}

/// [`run_bench`] with `options` ([`bench_command_with`]).
pub fn run_bench_with(
    dir: &Path,
    mp_port: u16,
    http_port: u16,
    start: u32,
    end: u32,
    options: &BenchOptions<'_>,
) -> BenchRun {
    let mut tries = 1;
    loop {
        let run = run_bench_once(dir, mp_port, http_port, start, end, options, tries);
        if run.status.success() || !run.output.contains(REGISTER_TIMED_OUT) || tries == 3 {
            return run;
        }
        eprintln!(
            "bench {start}..{end}: the bench's 10 s registration timed out ({REGISTER_TIMED_OUT}); running it again"
        );
        tries += 1;
    }
}

/// What the bench prints when its registration with the server timed out.
pub const REGISTER_TIMED_OUT: &str = "REGISTER_KV_CACHE failed";

fn run_bench_once(
    dir: &Path,
    mp_port: u16,
    http_port: u16,
    start: u32,
    end: u32,
    options: &BenchOptions<'_>,
    attempt: u32,
) -> BenchRun {
    let cmd = bench_command_with(dir, mp_port, http_port, start, end, options);
    let log = match attempt {
        1 => dir.join(format!("bench-{start}-{end}.log")),
        n => dir.join(format!("bench-{start}-{end}-{n}.log")),
    };
    let mut bench = Proc::spawn(cmd, &log);
    let url = format!("http://127.0.0.1:{http_port}/status");
    let mut most_tracked = 0;
    let started = Instant::now();
    let status = loop {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "bench still running after 600 s:\n{}",
            bench.output()
        );
        if let Some(body) = get_json(&url) {
            let tracked = body["worker_liveness"]["tracked_instances"]
                .as_u64()
                .unwrap_or(0);
            most_tracked = most_tracked.max(tracked);
        }
        if let Some(status) = bench.wait_timeout(Duration::from_millis(200)) {
            break status;
        }
    };
    BenchRun {
        status,
        output: bench.output(),
        most_tracked,
    }
}

/// Sends SIGTERM to a launcher and asserts it stops cleanly within 60 s.
pub fn stop_launch(launch: &mut Proc) {
    launch.signal(Signal::SIGTERM);
    let exit = launch
        .wait_timeout(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("launch did not stop on SIGTERM:\n{}", launch.output()));
    assert!(
        exit.success(),
        "launch exited with {exit}:\n{}",
        launch.output()
    );
}

/// Names of the `.data` objects in `dir`.
pub fn data_objects(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".data"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A real S3 server on loopback for the gateway tests: moto in server mode
/// from the LMCache virtual environment (`scripts/setup-lmcache.sh` installs
/// `moto[server]`), path-style, accepting any credentials. The same server
/// answers STS (`AssumeRoleWithWebIdentity`) and EC2 instance metadata
/// (`/latest/api/token`, `/latest/meta-data/iam/security-credentials/`).
/// Killed with its process group when dropped.
pub struct S3Server {
    proc: Proc,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// `http://127.0.0.1:<port>`, or `https://` with [`S3Server::start_tls`].
    pub url: String,
    client: reqwest::blocking::Client,
}

/// The TLS files of an https [`S3Server`] (PEM).
pub struct TlsFiles<'a> {
    /// The server's certificate.
    pub cert: &'a Path,
    /// The server's private key.
    pub key: &'a Path,
    /// The CA that signed the certificate, which the harness's client trusts.
    pub ca: &'a Path,
}

impl S3Server {
    /// Starts `moto_server` on `port` (log in `dir`) and waits until it
    /// answers (at most 60 s).
    pub fn start(dir: &Path, port: u16) -> S3Server {
        S3Server::spawn(dir, port, None)
    }

    /// [`S3Server::start`] on a free port, with `bucket` created.
    pub fn with_bucket(dir: &Path, bucket: &str) -> S3Server {
        let s3 = S3Server::start(dir, free_port());
        s3.create_bucket(bucket);
        s3
    }

    /// As [`S3Server::start`], serving https only with `tls`.
    pub fn start_tls(dir: &Path, port: u16, tls: &TlsFiles<'_>) -> S3Server {
        S3Server::spawn(dir, port, Some(tls))
    }

    fn spawn(dir: &Path, port: u16, tls: Option<&TlsFiles<'_>>) -> S3Server {
        let mut cmd = Command::new(lmcache_venv().join("bin/moto_server"));
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        let mut client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(10))
            .no_proxy();
        let scheme = match tls {
            Some(tls) => {
                cmd.arg("-c").arg(tls.cert).arg("-k").arg(tls.key);
                let pem = std::fs::read(tls.ca).expect("CA file");
                let ca = reqwest::Certificate::from_pem(&pem).expect("a PEM CA certificate");
                client = client.add_root_certificate(ca);
                "https"
            }
            None => "http",
        };
        let client = client.build().expect("http client");
        let url = format!("{scheme}://127.0.0.1:{port}");
        let log = dir.join(format!("moto-{port}-{}.log", std::process::id()));
        let mut proc = Proc::spawn(cmd, &log);
        let start = Instant::now();
        while client.get(format!("{url}/")).send().is_err() {
            if let Some(status) = proc.try_status() {
                panic!("moto_server exited ({status}):\n{}", proc.output());
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "moto_server did not answer within 60 s:\n{}",
                proc.output()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        S3Server {
            proc,
            port,
            url,
            client,
        }
    }

    /// Creates `bucket` (path-style `PUT /<bucket>`).
    pub fn create_bucket(&self, bucket: &str) {
        let resp = self
            .client
            .put(format!("{}/{bucket}", self.url))
            .send()
            .expect("moto answers");
        assert!(resp.status().is_success(), "create bucket: {resp:?}");
    }

    /// The object keys in `bucket`, listed path-style
    /// (`GET /<bucket>?list-type=2`) by a client that is not LMCache.
    pub fn list_keys(&self, bucket: &str) -> Vec<String> {
        let xml = self
            .client
            .get(format!("{}/{bucket}?list-type=2&max-keys=1000", self.url))
            .send()
            .and_then(|r| r.text())
            .expect("moto answers a listing");
        xml.split("<Key>")
            .skip(1)
            .filter_map(|part| part.split_once("</Key>").map(|(k, _)| k.to_string()))
            .collect()
    }

    /// Stops the server (an upstream outage); its objects are lost.
    pub fn kill(mut self) {
        let _ = killpg(Pid::from_raw(self.proc.pid()), Signal::SIGKILL);
        let _ = self.proc.wait_timeout(Duration::from_secs(10));
    }
}

/// Pids of the live children of `pid`.
pub fn children_of(pid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
        if rest.split_whitespace().nth(1) == Some(&pid.to_string()) {
            found.push(child);
        }
    }
    found
}

/// Pids of the processes that hold the listening TCP socket on `port`
/// (IPv4 or IPv6, any local address): for a launch's HTTP port, the real
/// Python `lmcache server`, not the `erebine-lmcache` wrapper above it.
pub fn listeners_of(port: u16) -> Vec<i32> {
    let sockets: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let local = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
                    let inode = f.get(9)?;
                    (local == port && *f.get(3)? == "0A").then(|| format!("socket:[{inode}]"))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let holds = std::fs::read_dir(entry.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|target| sockets.iter().any(|s| target.as_os_str() == s.as_str()));
        if holds {
            found.push(pid);
        }
    }
    found
}

/// The command line and environment of `pid`, NULs as spaces: what another
/// local user with the same uid (or root) can read of it.
pub fn cmdline_and_environ(pid: i32) -> String {
    ["cmdline", "environ"]
        .iter()
        .map(|f| std::fs::read(format!("/proc/{pid}/{f}")).unwrap_or_default())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where the `s3s-fs` binary is looked for: `$EREBINE_TEST_S3S_FS`, else
/// the default of `scripts/setup-s3s-fs.sh`.
fn s3s_fs_path() -> PathBuf {
    std::env::var_os("EREBINE_TEST_S3S_FS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            Path::new(&home).join(".cache/erebine/s3s-fs-0.14.1/bin/s3s-fs")
        })
}

/// Why the s3s-fs tests cannot run here, in one line naming where it was
/// looked for and what to run; `None` when they can.
pub fn s3s_fs_missing() -> Option<String> {
    let bin = s3s_fs_path();
    (!bin.is_file()).then(|| {
        format!(
            "no s3s-fs at {}: run scripts/test.sh (it installs s3s-fs 0.14.1), or set EREBINE_TEST_S3S_FS",
            bin.display()
        )
    })
}

/// The first statement of a test that may skip without s3s-fs
/// ([`s3s_fs_missing`]): it writes `skipped (<module>): <why>` and returns.
#[macro_export]
macro_rules! require_s3s_fs {
    () => {
        if let Some(why) = $crate::s3s_fs_missing() {
            $crate::say_skipped(::core::module_path!(), &why);
            return;
        }
    };
}

/// The `s3s-fs` binary ([`s3s_fs_missing`] says where). Panics with what
/// to run when it is missing.
pub fn s3s_fs_binary() -> PathBuf {
    if let Some(why) = s3s_fs_missing() {
        panic!("{why}");
    }
    s3s_fs_path()
}

/// A real S3 server that checks SigV4 signatures strictly (`s3s-fs`,
/// path-style, one key pair) on 127.0.0.1, storing objects under a local
/// directory in which each subdirectory is a bucket. Killed when dropped.
pub struct S3sFs {
    _proc: Proc,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl S3sFs {
    /// Starts `s3s-fs` on `port` with `buckets` created, objects under
    /// `dir/s3s-fs`, and waits until it accepts connections (at most 30 s).
    pub fn start(dir: &Path, port: u16, key: (&str, &str), buckets: &[&str]) -> S3sFs {
        let root = dir.join("s3s-fs");
        for bucket in buckets {
            std::fs::create_dir_all(root.join(bucket)).expect("bucket directory");
        }
        let mut cmd = Command::new(s3s_fs_binary());
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", key.0, "--secret-key", key.1])
            .arg(&root);
        let mut proc = Proc::spawn(cmd, &dir.join(format!("s3s-fs-{port}.log")));
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = proc.try_status() {
                panic!("s3s-fs exited ({status}):\n{}", proc.output());
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "s3s-fs did not listen within 30 s:\n{}",
                proc.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        S3sFs { _proc: proc, port }
    }
}

/// A virtual environment in `dir` whose `lmcache` runs the real LMCache of
/// [`lmcache_venv`], with one change: `lmcache bench l2` names its keys
/// after the model in `$BENCH_MODEL` instead of `bench-model`, and the
/// worker of `lmcache bench server` registers under that model instead of
/// `test-model`. LMCache 0.5.6 has no flag for either name; the wrapper
/// sets the default of the l2 bench's key generator and the server bench's
/// model constant (`server_bench.helpers._MODEL_NAME`, read when the worker
/// registers and makes its keys), then runs LMCache's own command line, so
/// every store and load still goes through LMCache's real adapter and
/// server. `$BENCH_MODEL` may name several models, one a line: the command
/// then runs once for each, in order, in one process (one import of
/// LMCache), each run after a line `bench model: <model>`; it exits with
/// the first failing run's status. Its `python3` is the real environment's,
/// which the launcher asks for boto3.
pub fn venv_with_bench_model(dir: &Path) -> PathBuf {
    let venv = dir.join("bench-model-venv");
    std::fs::create_dir_all(venv.join("bin")).expect("venv directory");
    let python = lmcache_venv().join("bin/python");
    let script = format!(
        r#"#!/bin/sh
exec {python} -c '
import sys
import lmcache.cli.commands.bench.l2_adapter_bench.data as data
from lmcache.cli.main import main
models = sys.argv.pop(1).split("\n")
sys.argv[0] = "lmcache"
status = 0
for model in models:
    print("bench model: " + model, flush=True)
    data.make_object_keys.__defaults__ = (model, 0)
    if sys.argv[1:3] == ["bench", "server"]:
        import lmcache.cli.commands.bench.server_bench.helpers as helpers
        helpers._MODEL_NAME = model
    try:
        code = main()
    except SystemExit as e:
        code = e.code
    status = status or code
sys.exit(status)
' "$BENCH_MODEL" "$@"
"#,
        python = python.display()
    );
    let lmcache = venv.join("bin/lmcache");
    std::fs::write(&lmcache, script).expect("the lmcache wrapper");
    std::fs::set_permissions(
        &lmcache,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let python3 = venv.join("bin/python3");
    if !python3.exists() {
        std::os::unix::fs::symlink(&python, &python3).expect("the python3 link");
    }
    venv
}

/// A loopback HTTP server that answers every request with `status` (e.g.
/// `"404 Not Found"`) and an empty body, on a thread of its own for the
/// rest of the test process; its port. Stands in for an object store, or
/// for whatever else may hold a port, in tests of what a client makes of
/// the answer.
pub fn answering_store(status: &'static str) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let port = listener.local_addr().expect("a bound address").port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let reply =
                format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            let _ = stream.write_all(reply.as_bytes());
        }
    });
    port
}

/// A tmpfs of its own mounted at a directory (tests of a volume that fills
/// up need one whose free space only they change), or a bind mount;
/// unmounted (lazily) when dropped. Mounting needs root.
pub struct Tmpfs {
    mount: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size_kib` KiB at `mount`, made if missing.
    pub fn mount(mount: &Path, size_kib: u64) -> Tmpfs {
        Tmpfs::mount_with(mount, &format!("size={size_kib}k"))
    }

    /// Mounts a tmpfs with the mount options `options` (e.g.
    /// `size=4096k,nr_inodes=64`: 64 inodes, the root directory's
    /// included; `nr_inodes=0`: no limit, and statfs reports no inodes) at
    /// `mount`, made if missing.
    pub fn mount_with(mount: &Path, options: &str) -> Tmpfs {
        std::fs::create_dir_all(mount).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(mount)
            .output()
            .expect("mount(8)");
        assert!(
            out.status.success(),
            "mounting a tmpfs at {} needs root: {}",
            mount.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs {
            mount: mount.to_path_buf(),
        }
    }

    /// Mounts the directory `source` over `mount` as well (`mount
    /// --bind`); unmounted when dropped like a tmpfs. Needs root.
    pub fn bind(source: &Path, mount: &Path) -> Tmpfs {
        let out = Command::new("mount")
            .arg("--bind")
            .arg(source)
            .arg(mount)
            .output()
            .expect("mount(8)");
        assert!(
            out.status.success(),
            "bind-mounting {} at {} needs root: {}",
            source.display(),
            mount.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs {
            mount: mount.to_path_buf(),
        }
    }

    /// Free inodes on it (`f_favail`, as the capacity guard measures
    /// them).
    pub fn free_inodes(&self) -> u64 {
        nix::sys::statvfs::statvfs(&self.mount)
            .unwrap()
            .files_available() as u64
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mount
    }

    /// Free space on it, in bytes (available blocks x fragment size, as the
    /// launch and the capacity guard measure it).
    pub fn free_bytes(&self) -> u64 {
        let st = nix::sys::statvfs::statvfs(&self.mount).unwrap();
        st.blocks_available() as u64 * st.fragment_size() as u64
    }

    /// Writes zeros to `path` until `bytes` are written or the volume is
    /// full (`ENOSPC`, which is not an error here); returns the bytes
    /// written. The file stays, as another writer's would.
    pub fn fill(&self, path: &Path, bytes: u64) -> u64 {
        use std::io::Write;
        let mut file = std::fs::File::create(path).unwrap();
        let chunk = vec![0u8; 1 << 20];
        let mut written = 0;
        while written < bytes {
            let part = &chunk[..chunk.len().min((bytes - written) as usize)];
            match file.write(part) {
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                Err(e) => panic!("writing {}: {e}", path.display()),
            }
        }
        written
    }
}

impl Tmpfs {
    /// Takes every free byte of the volume at one instant, as one
    /// `fallocate` of `path`, and nothing the volume frees afterwards (a
    /// write loop would also take what a capacity guard frees while it
    /// runs, emptying the tier: not the fault a test of one full volume
    /// means). Retries while another writer changes the free space between
    /// the measure and the call; returns the bytes taken. The file stays, as
    /// another writer's would.
    pub fn fill_at_once(&self, path: &Path) -> u64 {
        use nix::fcntl::{fallocate, FallocateFlags};
        let file = std::fs::File::create(path).unwrap();
        loop {
            let free = self.free_bytes();
            if free == 0 {
                return 0;
            }
            match fallocate(&file, FallocateFlags::empty(), 0, free as i64) {
                Ok(()) => return free,
                Err(nix::errno::Errno::ENOSPC) => continue,
                Err(e) => panic!("fallocate {} of {free} bytes: {e}", path.display()),
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("--lazy")
            .arg(&self.mount)
            .status();
    }
}

/// A cgroup v1 memory cgroup made for a test (beside this process's own, or
/// inside another made one); its processes are killed and it is removed
/// when dropped. Making one needs root and a v1 memory controller.
pub struct MemoryCgroup {
    dir: PathBuf,
}

impl MemoryCgroup {
    /// A new cgroup v1 memory cgroup beside this process's own, named after
    /// `name` and this process, or why none can be made here.
    pub fn make(name: &str) -> Result<MemoryCgroup, String> {
        use lmcache_sizing::cgroup::{memory_cgroup, CgroupVersion};
        if !nix::unistd::geteuid().is_root() {
            return Err("making a memory cgroup needs root".into());
        }
        let read = |p: &str| std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}"));
        let own = memory_cgroup(&read("/proc/self/cgroup")?, &read("/proc/self/mountinfo")?)
            .map_err(|e| format!("no memory cgroup to make one in: {e}"))?;
        if own.version != CgroupVersion::V1 {
            return Err(format!(
                "it needs a cgroup v1 memory controller, and this host's memory cgroup is v2 ({})",
                own.dir.display()
            ));
        }
        let parent = own.dir.parent().unwrap_or(Path::new("/"));
        MemoryCgroup::at(parent.join(format!("erebine-{name}-{}", std::process::id())))
    }

    /// A new cgroup inside this one; drop it before this one.
    pub fn child(&self, name: &str) -> Result<MemoryCgroup, String> {
        MemoryCgroup::at(self.dir.join(name))
    }

    fn at(dir: PathBuf) -> Result<MemoryCgroup, String> {
        std::fs::create_dir(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        Ok(MemoryCgroup { dir })
    }

    /// The cgroup's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// One of its files.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// One of its files' contents; panics when it cannot be read.
    pub fn read(&self, file: &str) -> String {
        let path = self.path(file);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Writes one of its files.
    pub fn write(&self, file: &str, value: &str) -> std::io::Result<()> {
        std::fs::write(self.path(file), value)
    }

    /// A file that holds a number of bytes, read.
    pub fn bytes(&self, file: &str) -> u64 {
        self.read(file).trim().parse().unwrap()
    }

    /// Makes `cmd` move itself into this cgroup before it runs.
    pub fn enter(&self, cmd: &mut Command) {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::process::CommandExt;
        let procs = std::ffi::CString::new(self.path("cgroup.procs").as_os_str().as_bytes())
            .expect("a path without NUL");
        // SAFETY: only open, write and close between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let fd = nix::libc::open(procs.as_ptr(), nix::libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0": the writing process itself.
                let written = nix::libc::write(fd, b"0".as_ptr().cast(), 1);
                nix::libc::close(fd);
                match written {
                    1 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            });
        }
    }

    /// The processes in it.
    pub fn members(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = self.write("memory.memsw.limit_in_bytes", "-1");
        let _ = self.write("memory.limit_in_bytes", "-1");
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            for pid in self.members() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports handed out are distinct, bindable, and below the ephemeral
    /// range, so no bind to port 0 can take one before its server binds it.
    #[test]
    fn free_ports_are_distinct_and_out_of_the_ephemeral_range() {
        let low = ephemeral_start().unwrap_or(32768);
        let ports: BTreeSet<u16> = (0..200).map(|_| free_port()).collect();
        assert_eq!(ports.len(), 200);
        for port in &ports {
            assert!(
                low < 12_000 || (10_000..low).contains(port),
                "{port} (range from {low})"
            );
            assert!(TcpListener::bind(("127.0.0.1", *port)).is_ok(), "{port}");
        }
        let ephemeral: Vec<u16> = (0..50)
            .map(|_| {
                TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
                    .port()
            })
            .collect();
        assert!(
            ephemeral.iter().all(|p| !ports.contains(p)),
            "{ephemeral:?}"
        );
    }

    /// A range from `EREBINE_TEST_PORTS` reads as given; anything else is
    /// refused.
    #[test]
    fn a_port_range_reads_first_to_last_inclusive() {
        assert_eq!(port_range("10000-14999"), Some((10_000, 15_000)));
        assert_eq!(port_range(" 20000 - 20000 "), Some((20_000, 20_001)));
        assert_eq!(port_range("1-65535"), Some((1, 65_536)));
        for bad in ["", "10000", "10000-", "-5", "5-4", "0-10", "1-65536", "a-b"] {
            assert_eq!(port_range(bad), None, "{bad:?}");
        }
    }
}
