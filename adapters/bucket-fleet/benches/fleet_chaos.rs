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

use std::time::{Duration, Instant};

use lmcache_bucket_fleet::sim::{self, Config, Happening, Outcome, Target, What};

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
    let (mut over_goal, mut over_stated, mut broken) = (0u64, 0u64, 0u64);
    let mut settled = Worst::default();
    let mut peaks = Vec::new();
    for seed in 0..seeds {
        let out = sim::run(&Config::chaos(seed));
        let lease = out.lease.expect("a lease");
        Worst::see(&mut peak, out.peak_share(), seed, &out);
        Worst::see(&mut none, lease.longest_no_holder.as_secs_f64(), seed, &out);
        Worst::see(&mut two, lease.two_holders as f64, seed, &out);
        Worst::see(&mut foreign, out.checks.foreign_deleted as f64, seed, &out);
        Worst::see(&mut order, out.checks.out_of_order as f64, seed, &out);
        let goal = out.goal_bytes();
        over_goal += u64::from(out.peak_bytes > goal);
        over_stated += u64::from(out.peak_bytes > out.stated_bound_bytes());
        if out.peak_bytes > goal {
            let rate = (out.node_bytes_per_s * out.most_running as u64).max(1) as f64;
            let beyond = out.peak_bytes.saturating_sub(out.trigger_bytes) as f64 / rate;
            let settle = beyond - lease.longest_no_holder.as_secs_f64();
            Worst::see(&mut settled, settle, seed, &out);
        }
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
    println!(
        "seeds past the stated bound (trigger + the fleet's writes over the longest stretch without an evictor + {} s): {over_stated}; of the seeds past 1.05 x, the most time past that stretch: {:.1} s (seed {})",
        sim::SETTLE.as_secs(),
        settled.value,
        settled.seed
    );
    single_faults(seeds / 20);
    println!("wall time {:.1} s", started.elapsed().as_secs_f64());
}

/// One event at 5 minutes into each of `seeds` seeds of store faults, per
/// kind of event: the longest stretch without an evictor after it (the
/// stretch that holds the event's time), and the peak.
fn single_faults(seeds: u64) {
    let lease = Config::chaos(0).spec.timing.lease;
    let kinds = [
        (
            "holder crashed",
            What::Crash {
                node: Target::Holder,
                restart_after: None,
            },
        ),
        (
            "holder crashed, a new id after 5 s",
            What::Crash {
                node: Target::Holder,
                restart_after: Some(Duration::from_secs(5)),
            },
        ),
        (
            "holder killed, back with its id after 5 s",
            What::Kill {
                node: Target::Holder,
                restart_after: Duration::from_secs(5),
            },
        ),
        (
            "holder stalled for two leases",
            What::Stall {
                node: Target::Holder,
                length: lease * 2,
            },
        ),
        (
            "holder restarted cleanly",
            What::Restart {
                node: Target::Holder,
                after: Duration::from_secs(5),
            },
        ),
        (
            "holder left",
            What::Leave {
                node: Target::Holder,
            },
        ),
        (
            "another node crashed",
            What::Crash {
                node: Target::Other(1),
                restart_after: None,
            },
        ),
        ("a node joined", What::Join),
        ("lease deleted", What::DeleteLease),
        ("lease made unreadable", What::UnreadableLease),
        ("absurd reports forged", What::ForgedReport { models: 0 }),
        ("300 models forged", What::ForgedReport { models: 300 }),
    ];
    println!("one event at 300 s on {seeds} seeds of store faults each: the longest stretch without an evictor, s; the peak / capacity");
    for (name, what) in kinds {
        let (mut longest, mut peak) = (0f64, 0f64);
        for seed in 0..seeds {
            let mut config = Config::chaos(seed);
            config.scenario = vec![Happening {
                at: Duration::from_secs(300),
                what,
            }];
            let out = sim::run(&config);
            let figures = out.lease.expect("a lease");
            longest = longest.max(figures.longest_no_holder.as_secs_f64());
            peak = peak.max(out.peak_share());
        }
        println!("{name:<40} {longest:>6.1} {peak:>6.3}");
    }
}
