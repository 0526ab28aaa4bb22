//! The fleet simulation under faults: thousands of seeds, each a schedule
//! of store faults and node events drawn by `fleet::sim::chaos` (slow
//! answers, answers lost after the store applied the request, writes
//! applied late, 500 and 503 answers, whole-second dates, a `Date` 10
//! minutes behind, crashes, stalls, restarts, joins, leaves, the lease
//! deleted or made unreadable, forged reports), on the fleet of
//! `fleet::sim::Config::chaos` (as `adapters/bucket-fleet/tests/fleet.rs`):
//! 4 nodes, a capacity of 1,000 objects of 4 MiB, 4 objects a second, 15
//! simulated minutes. Prints the worst seed of each figure and the rules broken
//! (`docs/s3-gateway.md`, "The simulation's faults"; results in
//! `docs/performance.md`, "The fleet simulation under faults").
//!
//! Run: `cargo bench -p lmcache-bucket-fleet --bench fleet_chaos`
//! (`FLEET_CHAOS_SEEDS` sets the number of seeds, 2,000 by default).

use std::time::Instant;

use lmcache_bucket_fleet::sim::{self, Config, Outcome};

/// The worst seed of one figure: its value and the seed's row.
#[derive(Default)]
struct Worst {
    value: f64,
    seed: u64,
    row: String,
}

impl Worst {
    fn see(&mut self, value: f64, seed: u64, out: &Outcome) {
        if value > self.value || self.row.is_empty() {
            *self = Worst {
                value,
                seed,
                row: out.to_string(),
            };
        }
    }
}

fn main() {
    let seeds: u64 = std::env::var("FLEET_CHAOS_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let started = Instant::now();
    let (mut peak, mut none, mut two, mut foreign, mut order) = Default::default();
    let (mut over_goal, mut broken) = (0u64, 0u64);
    let mut peaks = Vec::new();
    for seed in 0..seeds {
        let out = sim::run(&Config::chaos(seed));
        let lease = out.lease.expect("a lease");
        Worst::see(&mut peak, out.peak_share(), seed, &out);
        Worst::see(&mut none, lease.longest_no_holder.as_secs_f64(), seed, &out);
        Worst::see(&mut two, lease.two_holders as f64, seed, &out);
        Worst::see(&mut foreign, out.checks.foreign_deleted as f64, seed, &out);
        Worst::see(&mut order, out.checks.out_of_order as f64, seed, &out);
        let goal =
            out.capacity_bytes + out.capacity_bytes / 20 + out.started as u64 * out.object_bytes;
        over_goal += u64::from(out.peak_bytes > goal);
        broken +=
            u64::from(lease.two_holders + out.checks.foreign_deleted + out.checks.out_of_order > 0);
        peaks.push(out.peak_share());
    }
    peaks.sort_by(f64::total_cmp);
    let at = |q: f64| peaks[((peaks.len() - 1) as f64 * q) as usize];
    println!("{seeds} seeds of 4 nodes, capacity 1,000 objects, 4 objects/s, 15 simulated minutes");
    println!("{}", Outcome::header());
    for (name, worst) in [
        ("peak / capacity", &peak),
        ("longest without an evictor, s", &none),
        ("moments with two holders", &two),
        ("foreign keys deleted", &foreign),
        ("victims out of order", &order),
    ] {
        println!(
            "worst {name}: {:.3} (seed {})\n{}",
            worst.value, worst.seed, worst.row
        );
    }
    println!(
        "peak / capacity: median {:.3}, p99 {:.3}, max {:.3}; seeds past 1.05 x capacity + one object per node: {over_goal}; seeds breaking a safety rule: {broken}",
        at(0.5),
        at(0.99),
        at(1.0)
    );
    println!("wall time {:.1} s", started.elapsed().as_secs_f64());
}
