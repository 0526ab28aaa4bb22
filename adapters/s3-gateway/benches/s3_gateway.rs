//! Throughput and latency of the `s3_bucket` gateway against the same
//! upstream reached directly. Run by
//! `benches/s3-gateway.sh`, which starts the upstream; see
//! `docs/performance.md` for results.
//!
//! Environment: `GATEWAY_BENCH_UPSTREAM` (`host:port` of a path-style S3
//! server over plain http), `GATEWAY_BENCH_BUCKET` (an existing bucket),
//! `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (its credentials),
//! optional `GATEWAY_BENCH_OBJECTS` (32 MiB objects per run, default 32),
//! `GATEWAY_BENCH_STREAMS` (default 8), `GATEWAY_BENCH_SMALL` (small
//! requests per side, default 300), `GATEWAY_BENCH_ROUNDS` (default 2; the
//! sides run in reverse order every other round).
//!
//! The gateway runs in a child process (this program started with
//! `--serve-gateway`) so that its resident memory is its own. The child
//! also serves a third side, `tcp relay`: a plain TCP relay to the upstream
//! (tokio's `copy_bidirectional` with 256 KiB buffers, the gateway's
//! forward chunk; no HTTP, no signing, the real key), the floor of what any
//! gateway that adds a loopback hop can reach. A fourth side, `scraped`,
//! is a second gateway whose counters a thread reads every
//! `GATEWAY_BENCH_SCRAPE_MS` (default 10 ms), as the metrics endpoint does
//! at each scrape: the cost of metrics on the data path, side by side with
//! `gateway`. A fifth side, `bounded`, is a gateway with a bucket bound
//! (`docs/s3-gateway.md`, "The bucket bound") on a prefix of its own that
//! starts full: before the child starts, [`prefill`] writes old objects of
//! the bench's size to the prefix up to the bound's trigger, so from its
//! first listing on the bound evicts old objects as the bench writes new
//! ones (a cycle of 0.2 x capacity each time the usage reaches the
//! trigger) and lists again after every 2% of its capacity written, as in
//! a full bucket in steady state. Its capacity ([`bound_capacity`])
//! keeps every object the bench writes above the old ones, so none of them
//! is a victim before it is read back. Every side writes LMCache-shaped
//! keys (`bench-model@00000000@0@<round><i>`), which the bound counts.
//!
//! Each phase prints the CPU seconds per GiB moved of the client (this
//! process), the child (`hop`: gateway or relay), the upstream (when
//! `GATEWAY_BENCH_UPSTREAM_PID` is set) and the machine's idle time.

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use aws_credential_types::Credentials;
use bytes::Bytes;
use lmcache_s3_gateway::sigv4::s3_signature;
use lmcache_s3_gateway::Gateways;

const MIB: usize = 1 << 20;
const GIB: f64 = (1u64 << 30) as f64;
const OBJECT: usize = 32 * MIB;
const REGION: &str = "us-east-1";
/// The bounded side's key prefix in the bucket.
const BOUND_PREFIX: &str = "bounded/";
/// The bound's `trigger_watermark` and `eviction_ratio` (no `eviction`
/// block: the gateway is the evictor, at 0.8 down to 0.6 of the capacity).
const BOUND_TRIGGER: f64 = 0.8;
const BOUND_TARGET: f64 = 0.6;
/// The variable through which the child learns the bounded side's
/// capacity, in GiB.
const BOUND_GB_VAR: &str = "GATEWAY_BENCH_BOUND_GB";

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One S3 endpoint and the key it accepts.
struct Side {
    name: &'static str,
    endpoint: String,
    /// Path prefix before the key: `/<bucket>/` direct, `/` via the gateway.
    base: String,
    key_id: String,
    secret: String,
}

fn env(name: &str) -> Result<String, Error> {
    std::env::var(name).map_err(|_| format!("{name} is not set (run benches/s3-gateway.sh)").into())
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
    runtime.block_on(compare())
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

/// Child mode: starts the gateways for the upstream (plain, scraped,
/// bounded), prints their rewritten specs with their keys and the relay's
/// address, and serves until stdin closes.
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
    let (scraped, scraped_gateways) =
        Gateways::start_args(&args, &|k| std::env::var(k).ok(), None).await?;
    let mut bounded_spec = spec.clone();
    bounded_spec["s3_key_prefix"] = BOUND_PREFIX.into();
    bounded_spec["max_capacity_gb"] = env(BOUND_GB_VAR)?.parse::<f64>()?.into();
    let bounded_args = vec!["--l2-adapter".to_string(), bounded_spec.to_string()];
    let (bounded, bounded_gateways) =
        Gateways::start_args(&bounded_args, &|k| std::env::var(k).ok(), None).await?;
    let every = Duration::from_millis(env_or("GATEWAY_BENCH_SCRAPE_MS", 10)? as u64);
    let view = scraped_gateways.view();
    std::thread::spawn(move || loop {
        std::hint::black_box(view.states());
        std::thread::sleep(every);
    });
    let relay = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    println!("{}", with_key(&rewritten[1], &gateways)?);
    println!("{}", relay.local_addr()?);
    println!("{}", with_key(&scraped[1], &scraped_gateways)?);
    println!("{}", with_key(&bounded[1], &bounded_gateways)?);
    let upstream = env("GATEWAY_BENCH_UPSTREAM")?;
    tokio::spawn(async move {
        while let Ok((mut client, _)) = relay.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let buffer = 256 << 10;
                    let _ = tokio::io::copy_bidirectional_with_sizes(
                        &mut client,
                        &mut server,
                        buffer,
                        buffer,
                    )
                    .await;
                }
            });
        }
    });
    std::io::stdout().flush()?;
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
    })
    .await?;
    Ok(())
}

async fn compare() -> Result<(), Error> {
    let upstream = env("GATEWAY_BENCH_UPSTREAM")?;
    let bucket = env("GATEWAY_BENCH_BUCKET")?;
    let objects = env_or("GATEWAY_BENCH_OBJECTS", 32)?;
    let streams = env_or("GATEWAY_BENCH_STREAMS", 8)?;
    let small = env_or("GATEWAY_BENCH_SMALL", 300)?;
    let rounds = env_or("GATEWAY_BENCH_ROUNDS", 2)?;
    let client = reqwest::Client::builder().no_proxy().build()?;
    let data = Bytes::from(vec![0x5au8; OBJECT]);
    let direct = Side {
        name: "direct",
        endpoint: upstream,
        base: format!("/{bucket}/"),
        key_id: env("AWS_ACCESS_KEY_ID")?,
        secret: env("AWS_SECRET_ACCESS_KEY")?,
    };
    let capacity = bound_capacity(rounds * objects);
    let old = prefill(&client, &direct, &data, capacity, streams).await?;
    println!(
        "bounded side: capacity {:.3} GiB, {old} old objects of 32 MiB under {BOUND_PREFIX} (up to the trigger)",
        capacity as f64 / GIB
    );

    let mut child = Command::new(std::env::current_exe()?)
        .arg("--serve-gateway")
        .env(BOUND_GB_VAR, (capacity as f64 / GIB).to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?);
    let mut lines = [(); 4].map(|()| String::new());
    for line in &mut lines {
        out.read_line(line)?;
    }
    let [line, relay, scraped_line, bounded_line] = lines;
    let through = |name: &'static str, line: &str| -> Result<Side, Error> {
        let spec: serde_json::Value = serde_json::from_str(line)?;
        let field = |k: &str| spec[k].as_str().unwrap_or_default().to_string();
        Ok(Side {
            name,
            endpoint: field("s3_endpoint"),
            base: "/".into(),
            key_id: field("aws_access_key_id"),
            secret: field("aws_secret_access_key"),
        })
    };
    let relay = Side {
        name: "tcp relay",
        endpoint: relay.trim().to_string(),
        base: format!("/{bucket}/"),
        key_id: env("AWS_ACCESS_KEY_ID")?,
        secret: env("AWS_SECRET_ACCESS_KEY")?,
    };
    let gateway = through("gateway", &line)?;
    let scraped = through("scraped", &scraped_line)?;
    let bounded = through("bounded", &bounded_line)?;
    println!(
        "{objects} objects of 32 MiB, {streams} concurrent streams; {small} small requests per side"
    );
    // Interleaved, so no side always meets a warmer upstream.
    let gib = (objects * OBJECT) as f64 / (1u64 << 30) as f64;
    let upstream_pid: Option<u32> = std::env::var("GATEWAY_BENCH_UPSTREAM_PID")
        .ok()
        .and_then(|p| p.parse().ok());
    let me = std::process::id();
    let mut rates: Vec<(&str, f64, f64)> = Vec::new();
    for round in 1..=rounds {
        // Every other round in reverse, so no side always runs after the
        // same one.
        let mut order = [&direct, &relay, &gateway, &scraped, &bounded];
        if round % 2 == 0 {
            order.reverse();
        }
        for side in order {
            let before = Budget::take(me, child.id(), upstream_pid)?;
            let put = transfer(&client, side, &data, objects, streams, true, round).await?;
            let middle = Budget::take(me, child.id(), upstream_pid)?;
            let get = transfer(&client, side, &data, objects, streams, false, round).await?;
            let after = Budget::take(me, child.id(), upstream_pid)?;
            println!(
                "round {round} {:<9} PUT {put:>7.1} MiB/s  GET {get:>7.1} MiB/s",
                side.name
            );
            rates.push((side.name, put, get));
            println!(
                "  CPU s/GiB PUT: {}",
                middle.since(&before, gib, side.name != "direct")
            );
            println!(
                "  CPU s/GiB GET: {}",
                after.since(&middle, gib, side.name != "direct")
            );
        }
    }
    let mean = |name: &str, get: bool| {
        let picked: Vec<f64> = rates
            .iter()
            .filter(|r| r.0 == name)
            .map(|r| if get { r.2 } else { r.1 })
            .collect();
        picked.iter().sum::<f64>() / picked.len() as f64
    };
    println!(
        "scraped / gateway (metrics on / off), mean of {rounds} rounds: PUT {:.3}x  GET {:.3}x",
        mean("scraped", false) / mean("gateway", false),
        mean("scraped", true) / mean("gateway", true)
    );
    println!(
        "bounded / gateway (bound on / off), mean of {rounds} rounds: PUT {:.3}x  GET {:.3}x",
        mean("bounded", false) / mean("gateway", false),
        mean("bounded", true) / mean("gateway", true)
    );
    println!("bounded side's bound: {}", bound_figures(&bounded).await?);
    let rss = peak_rss_kib(child.id())?;
    for side in [&direct, &relay, &gateway, &scraped, &bounded] {
        let median = small_requests(&client, side, small, rounds).await?;
        println!(
            "{:<9} small HEAD median {:.3} ms",
            side.name,
            median.as_secs_f64() * 1e3
        );
    }
    println!(
        "gateway peak RSS (VmHWM) after the 8-stream runs: {:.1} MiB",
        rss as f64 / 1024.0
    );
    drop(child.stdin.take());
    child.wait()?;
    Ok(())
}

/// Moves `objects` 32 MiB objects with `streams` in flight; MiB/s.
async fn transfer(
    client: &reqwest::Client,
    side: &Side,
    data: &Bytes,
    objects: usize,
    streams: usize,
    put: bool,
    round: usize,
) -> Result<f64, Error> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let (client, next, data) = (client.clone(), next.clone(), data.clone());
        let (endpoint, base) = (side.endpoint.clone(), side.base.clone());
        let (key_id, secret) = (side.key_id.clone(), side.secret.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= objects {
                    return Ok::<(), Error>(());
                }
                let path = format!("{base}{}", bench_key(round, i));
                let method = if put { "PUT" } else { "GET" };
                let headers = signed(method, &endpoint, &path, &key_id, &secret)?;
                let request = client
                    .request(method.parse()?, format!("http://{endpoint}{path}"))
                    .headers(headers);
                let request = if put {
                    request.body(data.clone())
                } else {
                    request
                };
                let response = request.send().await?;
                let status = response.status();
                let body = response.bytes().await?;
                if !status.is_success() || (!put && body.len() != OBJECT) {
                    return Err(format!("{method} {path}: {status}, {} bytes", body.len()).into());
                }
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok((objects * OBJECT) as f64 / MIB as f64 / start.elapsed().as_secs_f64())
}

/// The path of the bench's `i`th object of `round` (`@` percent-encoded,
/// as LMCache sends it): an LMCache key of model `bench-model`, world
/// size 1, which the bucket bound counts.
fn bench_key(round: usize, i: usize) -> String {
    format!("bench-model%4000000000%400%40{round:04x}{i:08x}")
}

/// The capacity of the bounded side, bytes: its target (0.6 x capacity)
/// holds the `written` objects of all rounds and one more, so the old
/// objects ([`prefill`]) are always the oldest and the bench's own are
/// never evicted before they are read back.
fn bound_capacity(written: usize) -> u64 {
    let target = ((written + 1) * OBJECT) as f64;
    ((target / BOUND_TARGET) / GIB).ceil() as u64 * (1 << 30)
}

/// Writes objects of the bench's size under [`BOUND_PREFIX`] directly,
/// up to the trigger of a bound of `capacity` bytes; returns how many.
async fn prefill(
    client: &reqwest::Client,
    direct: &Side,
    data: &Bytes,
    capacity: u64,
    streams: usize,
) -> Result<usize, Error> {
    let count = (capacity as f64 * BOUND_TRIGGER / OBJECT as f64).ceil() as usize;
    let old = Side {
        name: "prefill",
        endpoint: direct.endpoint.clone(),
        base: format!("{}{BOUND_PREFIX}", direct.base),
        key_id: direct.key_id.clone(),
        secret: direct.secret.clone(),
    };
    // Round 0: keys no round of the bench writes.
    transfer(client, &old, data, count, streams, true, 0).await?;
    Ok(count)
}

/// The bounded side's bound, from its gateway's state route.
async fn bound_figures(side: &Side) -> Result<String, Error> {
    let url = format!(
        "http://{}{}",
        side.endpoint,
        lmcache_s3_gateway::state::STATE_PATH
    );
    let state: serde_json::Value = reqwest::get(url).await?.json().await?;
    let bound = &state["bucket_bound"];
    Ok(format!(
        "{} listings ({} ListObjectsV2 pages, the last {} ms), {} objects evicted ({:.2} GiB), {} failed, {:.2} GiB held",
        bound["listings"],
        bound["listing_pages"],
        bound["last_listing_millis"],
        bound["evicted_objects"],
        bound["evicted_bytes"].as_u64().unwrap_or(0) as f64 / GIB,
        bound["eviction_failures"],
        bound["usage_bytes"].as_u64().unwrap_or(0) as f64 / GIB,
    ))
}

/// Median latency of sequential HEADs of one existing object (the first
/// of the last round, the newest: never evicted).
async fn small_requests(
    client: &reqwest::Client,
    side: &Side,
    n: usize,
    rounds: usize,
) -> Result<Duration, Error> {
    let path = format!("{}{}", side.base, bench_key(rounds, 0));
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let headers = signed("HEAD", &side.endpoint, &path, &side.key_id, &side.secret)?;
        let start = Instant::now();
        let response = client
            .head(format!("http://{}{path}", side.endpoint))
            .headers(headers)
            .send()
            .await?;
        if !response.status().is_success() {
            return Err(format!("HEAD {path}: {}", response.status()).into());
        }
        times.push(start.elapsed());
    }
    times.sort();
    Ok(times[n / 2])
}

/// SigV4 headers (unsigned payload) for one request.
fn signed(
    method: &str,
    endpoint: &str,
    path: &str,
    key_id: &str,
    secret: &str,
) -> Result<reqwest::header::HeaderMap, Error> {
    let credentials = Credentials::new(key_id, secret, None, None, "bench");
    let url = format!("http://{endpoint}{path}");
    let host = [("host", endpoint)];
    let signature = s3_signature(
        method,
        &url,
        &host,
        "UNSIGNED-PAYLOAD",
        &credentials,
        REGION,
        SystemTime::now(),
    )?;
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in signature {
        headers.insert(
            reqwest::header::HeaderName::from_bytes(name.as_bytes())?,
            value.parse()?,
        );
    }
    Ok(headers)
}

/// CPU seconds used so far by the client (this process), the child, the
/// upstream (when its pid is known) and the whole machine's idle time.
struct Budget {
    client: f64,
    hop: f64,
    upstream: Option<f64>,
    idle: f64,
}

impl Budget {
    fn take(me: u32, hop: u32, upstream: Option<u32>) -> Result<Self, Error> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        let idle: f64 = stat
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().nth(4))
            .ok_or("no cpu line in /proc/stat")?
            .parse::<u64>()? as f64
            / 100.0;
        Ok(Self {
            client: cpu_seconds(me)?,
            hop: cpu_seconds(hop)?,
            upstream: upstream.map(cpu_seconds).transpose()?,
            idle,
        })
    }

    /// Seconds per GiB moved since `before`, per part; `hop` when the
    /// child (gateway or relay) carried the traffic.
    fn since(&self, before: &Self, gib: f64, hop: bool) -> String {
        let per = |now: f64, then: f64| (now - then) / gib;
        let mut out = format!("client {:.2}", per(self.client, before.client));
        if hop {
            out += &format!(", hop {:.2}", per(self.hop, before.hop));
        }
        if let (Some(now), Some(then)) = (self.upstream, before.upstream) {
            out += &format!(", upstream {:.2}", per(now, then));
        }
        out + &format!(", machine idle {:.2}", per(self.idle, before.idle))
    }
}

/// User + system CPU seconds `pid` has used (`/proc/<pid>/stat` fields 14
/// and 15, in clock ticks of 1/100 s).
fn cpu_seconds(pid: u32) -> Result<f64, Error> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after_name = stat.rsplit_once(") ").ok_or("no ) in /proc stat")?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    Ok(ticks as f64 / 100.0)
}

/// Peak resident set size of `pid` in KiB (`VmHWM` in /proc/<pid>/status).
fn peak_rss_kib(pid: u32) -> Result<u64, Error> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "no VmHWM in /proc status".into())
}
