//! Watcher CPU per poll and `inspect` latency (targets in
//! `docs/performance.md`), against the real LMCache 0.5.6 server started by
//! `lmcache-tier launch` (release build) with a few real objects in its disk
//! tier:
//! - CPU per `/status` poll in the watcher (client + parse + state machine,
//!   with the reaper route read as reaping is on), process CPU time (user +
//!   system, all threads) over back-to-back polls: target <= 1 ms; beside it
//!   in the same run, the same loop reading `/status` alone, which is what a
//!   poll cost before the reaper route was read;
//! - `lmcache-tier inspect --json` wall time, process start to exit: target
//!   <= 200 ms.
//!
//! Run: `EREBINE_TEST_LMCACHE_VENV=... cargo bench -p lmcache-tier --bench watch_poll`
//! (`POLLS` and `INSPECTS` change the sample counts). Results are printed;
//! docs/performance.md records them.

use std::process::Command;
use std::time::{Duration, Instant};

use lmcache_launcher::run::watch::{WatchConfig, Watcher};
use lmcache_launcher::status::{Poll, ServerStatus, StatusClient};
use lmcache_tier_e2e::{
    binaries, free_port, run_bench, stop_launch, wait_for_status, Binaries, Proc,
};
use nix::sys::resource::{getrusage, UsageWho};

const BINS: Binaries = binaries!();

fn cpu_time() -> Duration {
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let t = |tv: nix::sys::time::TimeVal| {
        Duration::from_secs(tv.tv_sec() as u64) + Duration::from_micros(tv.tv_usec() as u64)
    };
    t(usage.user_time()) + t(usage.system_time())
}

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let polls = count("POLLS", 500);
    let inspects = count("INSPECTS", 30);
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    let (mp_port, http_port) = (free_port(), free_port());
    let mut launch = Proc::spawn(
        BINS.launch_command(dir, mp_port, http_port, &["--lmcache-disk-size-gb", "2"]),
        &dir.join("launch.log"),
    );
    let url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_status(&url, &mut launch, Duration::from_secs(180));
    let bench = run_bench(dir, mp_port, http_port, 0, 3);
    assert!(bench.status.success(), "{}", bench.output);

    // The watcher's cost per poll: the real client, body parse and state machine.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = StatusClient::new(url.clone());
    let mut watcher = Watcher::new(WatchConfig::default());
    // Warm up: connection pool and allocator.
    runtime.block_on(async {
        for _ in 0..20 {
            watcher.observe(&client.poll().await);
        }
    });
    let cpu0 = cpu_time();
    let wall0 = Instant::now();
    let mut up = 0;
    runtime.block_on(async {
        for _ in 0..polls {
            let poll = client.poll().await;
            up += usize::from(matches!(poll, Poll::Up(_)));
            watcher.observe(&poll);
        }
    });
    let cpu = (cpu_time() - cpu0) / polls as u32;
    let wall = wall0.elapsed() / polls as u32;
    assert_eq!(up, polls, "every poll should see the server up");

    // The same loop reading /status alone: a poll without the reaper route.
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let status_only = || async {
        let body = http.get(&url).send().await.ok()?.bytes().await.ok()?;
        ServerStatus::parse(&body).ok()
    };
    runtime.block_on(async {
        for _ in 0..20 {
            status_only().await;
        }
    });
    let cpu2 = cpu_time();
    runtime.block_on(async {
        for _ in 0..polls {
            let status = status_only().await.expect("the server answers");
            watcher.observe(&Poll::Up(Box::new(status)));
        }
    });
    let status_only_cpu = (cpu_time() - cpu2) / polls as u32;

    // Parse + state machine alone on the recorded body (no HTTP).
    let body = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/lmcache-0.5.6/status/status-worker-attached.json"
    ))
    .expect("fixture");
    let n = 2000;
    let cpu1 = cpu_time();
    for _ in 0..n {
        let status = ServerStatus::parse(&body).expect("fixture parses");
        watcher.observe(&Poll::Up(Box::new(status)));
    }
    let parse_cpu = (cpu_time() - cpu1) / n;

    // inspect, as an operator runs it.
    let mut times = Vec::with_capacity(inspects);
    for _ in 0..inspects {
        let start = Instant::now();
        let out = Command::new(BINS.lmcache_tier())
            .env("EREBINE_AGENT_LMCACHE_DISK_PATH", dir.join("cache"))
            .args(["inspect", "--json", "--url", &url])
            .output()
            .expect("inspect runs");
        times.push(start.elapsed());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    times.sort();
    let objects = std::fs::read_dir(dir.join("cache"))
        .map(|rd| rd.count())
        .unwrap_or(0);

    stop_launch(&mut launch);
    println!("watcher, real server, {polls} polls back to back:");
    println!("  CPU per poll          {:.3} ms (target <= 1 ms)", ms(cpu));
    println!("  wall per poll         {:.3} ms", ms(wall));
    println!(
        "  /status alone         {:.3} ms CPU (no reaper route)",
        ms(status_only_cpu)
    );
    println!(
        "  parse + observe only  {:.3} ms CPU (recorded body, {} bytes)",
        ms(parse_cpu),
        body.len()
    );
    println!("inspect --json, {inspects} runs, disk tier with {objects} entries:");
    println!(
        "  median {:.1} ms, p95 {:.1} ms, max {:.1} ms (target <= 200 ms)",
        ms(percentile(&times, 0.5)),
        ms(percentile(&times, 0.95)),
        ms(percentile(&times, 1.0))
    );
}
