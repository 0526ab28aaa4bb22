//! The `s3_bucket` gateway in front of a failing upstream: its memory while
//! the upstream stalls under 32 MiB PUTs and GETs, side by side with a
//! healthy upstream in the same run, and the time to the first error of
//! each fault. Run by `benches/gateway-faults.sh`, which starts the
//! upstream; results in `docs/performance.md`.
//!
//! Environment: `GATEWAY_BENCH_UPSTREAM` (`host:port` of a path-style S3
//! server over plain http), `GATEWAY_BENCH_BUCKET` (an existing bucket),
//! `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (its credentials),
//! optional `GATEWAY_BENCH_STREAMS` (concurrent 32 MiB requests, default
//! 8), `GATEWAY_BENCH_OBJECTS` (objects moved with the healthy upstream,
//! default 32), `GATEWAY_BENCH_FAULT_SECONDS` (how long each stalled phase
//! keeps sending, default 30), `GATEWAY_BENCH_TRIALS` (requests timed per
//! fault, default 3), and `GATEWAY_BENCH_AWSCRT_PYTHON` (a Python with
//! `awscrt`, e.g. LMCache's virtual environment: then LMCache's own S3
//! client is timed against each fault too, with
//! `benches/gateway-faults-awscrt.py`).
//!
//! The faults come from [`FaultProxy`] between the gateway and the
//! upstream. The gateway runs in a child process (this program started
//! with `--serve-gateway`), so that its resident memory is its own: `VmRSS`
//! is sampled every 50 ms during each phase, and `VmHWM` (the peak) is
//! reset before each phase by writing `5` to `/proc/<pid>/clear_refs`.

use std::io::{BufRead, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use aws_credential_types::Credentials;
use bytes::Bytes;
use lmcache_s3_gateway::sigv4::s3_signature;
use lmcache_s3_gateway::Gateways;
use lmcache_tier_e2e::fault_proxy::{Fault, FaultProxy};
use lmcache_tier_e2e::free_port;

const MIB: usize = 1 << 20;
const OBJECT: usize = 32 * MIB;
const REGION: &str = "us-east-1";

type Error = Box<dyn std::error::Error + Send + Sync>;

fn env(name: &str) -> Result<String, Error> {
    std::env::var(name)
        .map_err(|_| format!("{name} is not set (run benches/gateway-faults.sh)").into())
}

fn env_or(name: &str, default: usize) -> Result<usize, Error> {
    match std::env::var(name) {
        Ok(v) => Ok(v
            .parse()
            .map_err(|_| format!("{name}={v} is not a number"))?),
        Err(_) => Ok(default),
    }
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if args.iter().any(|a| a == "--serve-gateway") {
        return runtime.block_on(serve_gateway());
    }
    if args.iter().any(|a| a == "--list") {
        // `cargo bench -- --list`: no test harness here.
        return Ok(());
    }
    let upstream: u16 = env("GATEWAY_BENCH_UPSTREAM")?
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or("GATEWAY_BENCH_UPSTREAM is not host:port")?;
    let proxy = FaultProxy::start(free_port(), upstream);
    runtime.block_on(measure(&proxy))
}

/// `spec` (a rewritten one) with the gateways' per-launch key in it: what
/// this bench's client signs with. LMCache gets the key from its
/// environment instead ([`Gateways::server_env`]).
fn with_key(spec: &str, gateways: &Gateways) -> Result<String, Error> {
    let mut spec: serde_json::Value = serde_json::from_str(spec)?;
    let key = gateways.key().ok_or("no gateway started")?;
    spec["aws_access_key_id"] = key.access_key_id.clone().into();
    spec["aws_secret_access_key"] = key.secret_access_key.clone().into();
    Ok(spec.to_string())
}

/// Child mode: starts the gateway for `GATEWAY_BENCH_UPSTREAM`, prints the
/// rewritten spec with its key, and serves until stdin closes.
async fn serve_gateway() -> Result<(), Error> {
    let spec = serde_json::json!({
        "type": "s3",
        "s3_endpoint": env("GATEWAY_BENCH_UPSTREAM")?,
        "s3_bucket": env("GATEWAY_BENCH_BUCKET")?,
        "s3_region": REGION,
        "disable_tls": true,
    });
    let args = vec!["--l2-adapter".to_string(), spec.to_string()];
    let (rewritten, gateways) =
        Gateways::start_args(&args, &|k| std::env::var(k).ok(), None).await?;
    println!("{}", with_key(&rewritten[1], &gateways)?);
    std::io::stdout().flush()?;
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
    })
    .await?;
    Ok(())
}

/// The gateway as a client sees it: endpoint and per-launch key.
#[derive(Clone)]
struct Gateway {
    endpoint: String,
    key_id: String,
    secret: String,
}

/// What became of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// A whole answer with this status.
    Answered(u16),
    /// The head (with this status) came, then the body broke off.
    BodyCut(u16),
    /// No answer.
    Failed,
}

impl Outcome {
    fn ok(self) -> bool {
        matches!(self, Outcome::Answered(200))
    }
}

/// Every phase against the gateway behind `proxy`, printed as it ends.
async fn measure(proxy: &FaultProxy) -> Result<(), Error> {
    let streams = env_or("GATEWAY_BENCH_STREAMS", 8)?;
    let objects = env_or("GATEWAY_BENCH_OBJECTS", 32)?;
    let seconds = Duration::from_secs(env_or("GATEWAY_BENCH_FAULT_SECONDS", 30)? as u64);
    let trials = env_or("GATEWAY_BENCH_TRIALS", 3)?;
    let (mut child, gateway) = start_child(proxy.port)?;
    let client = reqwest::Client::builder().no_proxy().build()?;
    let data = Bytes::from(vec![0x5au8; OBJECT]);
    let pid = child.id();
    println!(
        "gateway pid {pid}; {streams} concurrent streams of 32 MiB; stalled phases {} s each",
        seconds.as_secs()
    );

    let phase = Phase {
        client: &client,
        gateway: &gateway,
        data: &data,
        streams,
        stored: objects.max(1),
        pid,
    };
    phase
        .run("healthy upstream, PUT", Load::Count(objects), true)
        .await?;
    phase
        .run("healthy upstream, GET", Load::Count(objects), false)
        .await?;
    for (fault, put) in [
        (Fault::Stall, true),
        (Fault::Stall, false),
        (Fault::StallMidBody, false),
    ] {
        proxy.set(fault);
        let name = format!("{fault:?}, {}", if put { "PUT" } else { "GET" });
        phase.run(&name, Load::For(seconds), put).await?;
    }
    proxy.set(Fault::Pass);
    phase
        .run("healthy again, GET", Load::Count(objects), false)
        .await?;

    first_errors(proxy, &client, &gateway, &data, trials).await?;
    if let Ok(python) = std::env::var("GATEWAY_BENCH_AWSCRT_PYTHON") {
        awscrt_errors(proxy, &python, &gateway)?;
    }
    drop(child.stdin.take());
    child.wait()?;
    Ok(())
}

/// Starts the gateway's child process for the upstream behind the proxy on
/// `port`, and reads its endpoint and key.
fn start_child(port: u16) -> Result<(Child, Gateway), Error> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("--serve-gateway")
        .env("GATEWAY_BENCH_UPSTREAM", format!("127.0.0.1:{port}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    let spec: serde_json::Value = serde_json::from_str(&line)?;
    let field = |k: &str| spec[k].as_str().unwrap_or_default().to_string();
    let gateway = Gateway {
        endpoint: field("s3_endpoint"),
        key_id: field("aws_access_key_id"),
        secret: field("aws_secret_access_key"),
    };
    Ok((child, gateway))
}

/// How much one phase sends.
#[derive(Clone, Copy)]
enum Load {
    /// This many objects, then stop.
    Count(usize),
    /// New requests for this long.
    For(Duration),
}

/// What every phase shares.
struct Phase<'a> {
    client: &'a reqwest::Client,
    gateway: &'a Gateway,
    data: &'a Bytes,
    streams: usize,
    /// How many objects the first phase stores (GETs cycle through them).
    stored: usize,
    pid: u32,
}

impl Phase<'_> {
    /// Sends 32 MiB PUTs (or GETs of the objects the first phase stored)
    /// on every stream, sampling the gateway's memory; prints the outcome.
    async fn run(&self, name: &str, load: Load, put: bool) -> Result<(), Error> {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5")?;
        let (rss_start, _) = memory_kib(self.pid)?;
        let sampling = Arc::new(AtomicBool::new(true));
        let peak_rss = Arc::new(AtomicU64::new(rss_start));
        let sampler = sample_rss(self.pid, sampling.clone(), peak_rss.clone());
        let start = Instant::now();
        let outcomes = self.send_all(load, put).await?;
        let took = start.elapsed();
        sampling.store(false, Ordering::SeqCst);
        sampler.await?;
        let (rss_end, hwm) = memory_kib(self.pid)?;
        let ok = outcomes.iter().filter(|o| o.ok()).count();
        let mib = |kib: u64| kib as f64 / 1024.0;
        println!(
            "{name:<24} {} requests in {:.1} s: {ok} ok, {} errors {:?}; VmRSS start {:.1} / max {:.1} / end {:.1} MiB, VmHWM {:.1} MiB; {} open files",
            outcomes.len(),
            took.as_secs_f64(),
            outcomes.len() - ok,
            error_kinds(&outcomes),
            mib(rss_start),
            mib(peak_rss.load(Ordering::SeqCst)),
            mib(rss_end),
            mib(hwm),
            open_files(self.pid)?,
        );
        Ok(())
    }

    async fn send_all(&self, load: Load, put: bool) -> Result<Vec<Outcome>, Error> {
        let next = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..self.streams {
            let (client, gateway) = (self.client.clone(), self.gateway.clone());
            let (data, next, stored) = (self.data.clone(), next.clone(), self.stored);
            tasks.push(tokio::spawn(async move {
                let mut outcomes = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let more = match load {
                        Load::Count(n) => i < n,
                        Load::For(limit) => start.elapsed() < limit,
                    };
                    if !more {
                        return outcomes;
                    }
                    let key = format!("faults%40{:04}", i % stored);
                    let body = put.then(|| data.clone());
                    outcomes.push(send(&client, &gateway, &key, body).await);
                }
            }));
        }
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await?);
        }
        Ok(all)
    }
}

/// Counts of each kind of failed outcome.
fn error_kinds(outcomes: &[Outcome]) -> Vec<(Outcome, usize)> {
    let mut kinds: Vec<(Outcome, usize)> = Vec::new();
    for outcome in outcomes.iter().filter(|o| !o.ok()) {
        match kinds.iter_mut().find(|(k, _)| k == outcome) {
            Some((_, n)) => *n += 1,
            None => kinds.push((*outcome, 1)),
        }
    }
    kinds
}

/// Samples the gateway's `VmRSS` every 50 ms into `peak` while `running`.
fn sample_rss(
    pid: u32,
    running: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while running.load(Ordering::SeqCst) {
            if let Ok((rss, _)) = memory_kib(pid) {
                peak.fetch_max(rss, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// How many files (sockets included) `pid` has open.
fn open_files(pid: u32) -> Result<usize, Error> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// `VmRSS` and `VmHWM` of `pid` in KiB (`/proc/<pid>/status`).
fn memory_kib(pid: u32) -> Result<(u64, u64), Error> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64, Error> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no {name} in /proc/{pid}/status").into())
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// The time from sending a request to its error, for each fault: `trials`
/// requests each, printed with their median.
async fn first_errors(
    proxy: &FaultProxy,
    client: &reqwest::Client,
    gateway: &Gateway,
    data: &Bytes,
    trials: usize,
) -> Result<(), Error> {
    let cases = [
        (Fault::Stall, "GET"),
        (Fault::Stall, "PUT"),
        (Fault::StallMidBody, "GET"),
        (Fault::ResetMidBody, "GET"),
        (Fault::SlowDown, "GET"),
        (Fault::SlowDown, "PUT"),
        (Fault::InternalError, "GET"),
        (Fault::Refuse, "GET"),
    ];
    println!("time to the first error, {trials} requests per fault (32 MiB objects):");
    for (fault, method) in cases {
        proxy.set(fault);
        let mut times = Vec::new();
        let mut outcomes = Vec::new();
        for _ in 0..trials {
            let body = (method == "PUT").then(|| data.clone());
            let start = Instant::now();
            outcomes.push(send(client, gateway, "faults%400000", body).await);
            times.push(start.elapsed().as_secs_f64());
        }
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        println!(
            "  {:<28} median {:.3} s (each: {}) -> {:?}",
            format!("{fault:?} {method}"),
            sorted[sorted.len() / 2],
            times
                .iter()
                .map(|t| format!("{t:.3}"))
                .collect::<Vec<_>>()
                .join(", "),
            error_kinds(&outcomes),
        );
        proxy.set(Fault::Pass);
    }
    Ok(())
}

/// LMCache's own S3 client (awscrt, as LMCache 0.5.6's S3 adapter sets it
/// up) against each fault: its time to the error it reports, retries
/// included; last, against the stalled store without the gateway (what
/// any gateway bound above awscrt's own gives LMCache).
fn awscrt_errors(proxy: &FaultProxy, python: &str, gateway: &Gateway) -> Result<(), Error> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../benches/gateway-faults-awscrt.py"
    );
    println!("LMCache's S3 client (awscrt) through the gateway, one GET per fault:");
    for fault in [
        Fault::Pass,
        Fault::Stall,
        Fault::ResetMidBody,
        Fault::SlowDown,
        Fault::Refuse,
    ] {
        proxy.set(fault);
        let before = requests(gateway)?;
        let out = Command::new(python)
            .arg(script)
            .args([&gateway.endpoint, &gateway.key_id, &gateway.secret])
            .arg("faults%400000")
            .output()?;
        println!(
            "  {:<14} {}{}; {} requests reached the gateway",
            format!("{fault:?}"),
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim(),
            requests(gateway)? - before,
        );
    }
    proxy.set(Fault::Stall);
    let direct = format!("127.0.0.1:{}", proxy.port);
    let out = Command::new(python)
        .arg(script)
        .args([
            &direct,
            &env("AWS_ACCESS_KEY_ID")?,
            &env("AWS_SECRET_ACCESS_KEY")?,
        ])
        .arg("bench/faults%400000")
        .output()?;
    println!(
        "  {:<14} {}{} (no gateway: the stalled store reached directly)",
        "Stall, direct",
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim(),
    );
    proxy.set(Fault::Pass);
    Ok(())
}

/// How many requests the gateway has counted (its state route).
fn requests(gateway: &Gateway) -> Result<u64, Error> {
    let url = format!(
        "http://{}{}",
        gateway.endpoint,
        lmcache_s3_gateway::state::STATE_PATH
    );
    let json = lmcache_tier_e2e::get_json(&url).ok_or("no gateway state")?;
    let state: lmcache_s3_gateway::state::GatewayState = serde_json::from_value(json)?;
    let r = state.requests;
    Ok(r.head + r.get + r.put + r.post + r.delete + r.other)
}

/// Sends one signed request (a PUT of `body`, else a GET) and reads the
/// answer whole.
async fn send(
    client: &reqwest::Client,
    gateway: &Gateway,
    key: &str,
    body: Option<Bytes>,
) -> Outcome {
    let method = if body.is_some() { "PUT" } else { "GET" };
    let url = format!("http://{}/{key}", gateway.endpoint);
    let credentials = Credentials::new(&gateway.key_id, &gateway.secret, None, None, "bench");
    let host = [("host", gateway.endpoint.as_str())];
    let Ok(signature) = s3_signature(
        method,
        &url,
        &host,
        "UNSIGNED-PAYLOAD",
        &credentials,
        REGION,
        SystemTime::now(),
    ) else {
        return Outcome::Failed;
    };
    let mut request = client.request(method.parse().unwrap_or_default(), &url);
    for (name, value) in signature {
        request = request.header(name, value);
    }
    if let Some(body) = body {
        request = request.body(body);
    }
    let Ok(response) = request.send().await else {
        return Outcome::Failed;
    };
    let status = response.status().as_u16();
    match response.bytes().await {
        Ok(_) => Outcome::Answered(status),
        Err(_) => Outcome::BodyCut(status),
    }
}
