//! What the gateway's per-connection peer check costs: the time of one
//! [`socket_owner`] lookup (one `sock_diag` request), and of
//! [`socket_owner_in_tables`] (`/proc/net/tcp` read up to the entry, where
//! `sock_diag` is not available), with the machine's own sockets and with
//! more open loopback connections. Run with `cargo bench -p lmcache-s3-gateway --bench
//! peer_check`; results in `docs/performance.md`.
//!
//! Environment: `PEER_BENCH_LOOKUPS` (connections looked up per table size,
//! default 2000), `PEER_BENCH_EXTRA` (comma-separated numbers of extra open
//! connections, default `0,1000,5000`), `PEER_BENCH_STALL_LOOKUPS`
//! (connections looked up in the runtime-stall rows, default 200).
//!
//! The runtime-stall rows, at the largest table: how late a 1 ms timer of
//! a one-thread tokio runtime (the launch runs one) fires while
//! connections are looked up in the socket tables one after another, on
//! the runtime's own thread (as the gateway did) and on a blocking thread
//! (`spawn_blocking`, as the gateway does).

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use lmcache_s3_gateway::peer::{socket_owner, socket_owner_in_tables};

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let lookups: usize = std::env::var("PEER_BENCH_LOOKUPS").map_or(Ok(2000), |v| v.parse())?;
    let extras: Vec<usize> = std::env::var("PEER_BENCH_EXTRA")
        .unwrap_or_else(|_| "0,1000,5000".into())
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let mut held = Vec::new();
    println!("lookups per row: {lookups}; per-connection cost of the peer check, microseconds");
    println!("| other open connections | lines in /proc/net/tcp | sock_diag median | p90 | p99 | /proc/net/tcp median | p90 | p99 |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for extra in extras {
        while held.len() < extra {
            let client = TcpStream::connect(addr)?;
            let (server, _) = listener.accept()?;
            held.push((client, server));
        }
        let mut diag = Vec::with_capacity(lookups);
        let mut tables = Vec::with_capacity(lookups);
        for _ in 0..lookups {
            let client = TcpStream::connect(addr)?;
            let (server, peer) = listener.accept()?;
            let local = server.local_addr()?;
            let started = Instant::now();
            std::hint::black_box(socket_owner(peer, local)?);
            diag.push(started.elapsed());
            let started = Instant::now();
            std::hint::black_box(socket_owner_in_tables(peer, local)?);
            tables.push(started.elapsed());
            drop((client, server));
        }
        let lines = std::fs::read_to_string("/proc/net/tcp")?.lines().count() - 1;
        println!(
            "| {extra} | {lines} | {} | {} |",
            quantiles(diag),
            quantiles(tables)
        );
    }
    let stall_lookups: usize =
        std::env::var("PEER_BENCH_STALL_LOOKUPS").map_or(Ok(200), |v| v.parse())?;
    println!();
    println!("timer lateness on a one-thread runtime while {stall_lookups} connections are looked up in /proc/net/tcp, milliseconds");
    println!("| where the lookup runs | median | p99 | max | lookups took, s |");
    println!("| --- | --- | --- | --- | --- |");
    for (name, blocking) in [("the runtime's thread", false), ("a blocking thread", true)] {
        let (late, took) = runtime_stall(&listener, stall_lookups, blocking)?;
        println!(
            "| {name} | {} | {:.2} |",
            late_quantiles(late),
            took.as_secs_f64()
        );
    }
    Ok(())
}

/// Looks `lookups` fresh connections to `listener` up in the socket
/// tables, one after another, on a one-thread runtime whose 1 ms timer
/// records how late it fires; with `blocking`, each lookup runs on a
/// blocking thread. Returns the lateness of every tick and the time all
/// the lookups took.
fn runtime_stall(
    listener: &TcpListener,
    lookups: usize,
    blocking: bool,
) -> Result<(Vec<Duration>, Duration), Error> {
    let addr = listener.local_addr()?;
    let mut pairs = Vec::with_capacity(lookups);
    for _ in 0..lookups {
        let client = TcpStream::connect(addr)?;
        let (server, peer) = listener.accept()?;
        let local = server.local_addr()?;
        pairs.push((client, server, peer, local));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    runtime.block_on(async move {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ticker = tokio::spawn(tick_until(done.clone()));
        let started = Instant::now();
        for (_, _, peer, local) in &pairs {
            let (peer, local) = (*peer, *local);
            let owner = if blocking {
                tokio::task::spawn_blocking(move || socket_owner_in_tables(peer, local)).await?
            } else {
                socket_owner_in_tables(peer, local)
            };
            std::hint::black_box(owner?);
            tokio::task::yield_now().await;
        }
        let took = started.elapsed();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok((ticker.await?, took))
    })
}

/// Sleeps 1 ms at a time until `done`, recording how late each wake-up was.
async fn tick_until(done: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Vec<Duration> {
    let tick = Duration::from_millis(1);
    let mut late = Vec::new();
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        let asleep = Instant::now();
        tokio::time::sleep(tick).await;
        late.push(asleep.elapsed().saturating_sub(tick));
    }
    late
}

/// The median, p99 and largest of `late` in milliseconds, as table cells.
fn late_quantiles(mut late: Vec<Duration>) -> String {
    if late.is_empty() {
        return "- | - | -".into();
    }
    late.sort();
    let at = |q: f64| late[((late.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    format!("{:.2} | {:.2} | {:.2}", at(0.5), at(0.99), at(1.0))
}

/// The median, p90 and p99 of `took` in microseconds, as table cells.
fn quantiles(mut took: Vec<Duration>) -> String {
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    format!("{:.1} | {:.1} | {:.1}", at(0.5), at(0.9), at(0.99))
}
