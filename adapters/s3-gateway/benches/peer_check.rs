//! What the gateway's per-connection peer check costs: the time of one
//! [`socket_owner`] lookup (one `sock_diag` request), and of
//! [`socket_owner_in_tables`] (`/proc/net/tcp` read up to the entry, where
//! `sock_diag` is not available), with the machine's own sockets and with
//! more open loopback connections. Run with `cargo bench -p lmcache-s3-gateway --bench
//! peer_check`; results in `docs/performance.md`.
//!
//! Environment: `PEER_BENCH_LOOKUPS` (connections looked up per table size,
//! default 2000), `PEER_BENCH_EXTRA` (comma-separated numbers of extra open
//! connections, default `0,1000,5000`).

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
    Ok(())
}

/// The median, p90 and p99 of `took` in microseconds, as table cells.
fn quantiles(mut took: Vec<Duration>) -> String {
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    format!("{:.1} | {:.1} | {:.1}", at(0.5), at(0.9), at(0.99))
}
