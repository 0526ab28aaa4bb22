//! The fleet simulation's table: 1, 10, 100 and 1,000 gateways on one
//! prefix for a simulated hour, each the bound's real machines
//! (`lmcache_bucket_fleet::sim`), against a store in memory with
//! conditional writes (mode `lease`) and without them (`every_node`), on
//! two bucket sizes, through the scenario of crashes, stalls, restarts,
//! joins and leaves of `fleet::sim::scenario`, with the nodes' wall clocks
//! up to 10 minutes apart and their monotonic clocks of different origins
//! (`docs/s3-gateway.md`, "A fleet on one bucket"; results in
//! `docs/performance.md`, "The fleet simulation").
//!
//! Run: `cargo bench -p lmcache-bucket-fleet --bench fleet_sim`.

use std::time::{Duration, Instant};

use lmcache_bucket_fleet::sim::{self, Config, Outcome, OBJECT_BYTES};

/// A bucket of the table: its capacity, what the fleet writes into it,
/// and the most nodes simulated without conditional writes.
struct Bucket {
    /// The capacity, objects of 4 MiB.
    objects: u64,
    /// The fleet's writes, objects a second.
    objects_per_s: u64,
    /// Without a lease every node keeps a view of the whole bucket; the
    /// simulation holds them all in one process, about 150 bytes an
    /// object each.
    every_node_up_to: usize,
}

const BUCKETS: [Bucket; 2] = [
    Bucket {
        objects: 10_000,
        objects_per_s: 10,
        every_node_up_to: 1000,
    },
    Bucket {
        objects: 1_000_000,
        objects_per_s: 100,
        every_node_up_to: 10,
    },
];

const NODES: [usize; 4] = [1, 10, 100, 1000];

fn config(nodes: usize, bucket: &Bucket, conditional_writes: bool) -> Config {
    Config {
        conditional_writes,
        fleet_bytes_per_s: bucket.objects_per_s * OBJECT_BYTES,
        scenario: sim::scenario(),
        wall_clock_spread: Duration::from_secs(600),
        uptime_spread: Duration::from_secs(30 * 86_400),
        ..Config::new(nodes, bucket.objects)
    }
}

fn main() {
    let started = Instant::now();
    let example = config(1, &BUCKETS[0], true);
    let t = example.spec.timing;
    println!(
        "A simulated hour; periods: lease {} s, report {} s, reading {} s, listing {} s; {} ms a request, 8 deletions in flight; trigger 0.8, target 0.6 of the capacity; the prefix filled to {} of it at the start with older objects.",
        t.lease.as_secs(),
        t.report.as_secs(),
        t.read_reports.as_secs(),
        t.listing.as_secs(),
        example.latency.as_millis(),
        example.prefill,
    );
    println!("Scenario: {:?}", example.scenario);
    println!("Columns: capacity in objects; peak: the most LMCache bytes over the capacity; over: objects past the capacity; the bound's requests an hour by class (LIST pages, with one per node start); LMCache's own PUTs an hour apart; objects evicted; takes: evictor changes; no ev.: seconds with no node that holds the lease, and the longest stretch; two: moments with two holders; wall: this run's seconds.");
    for bucket in &BUCKETS {
        table(bucket);
    }
    println!("\ntotal wall time {:.1} s", started.elapsed().as_secs_f64());
}

fn table(bucket: &Bucket) {
    let gb = (bucket.objects * OBJECT_BYTES) as f64 / 1e9;
    let mb_s = (bucket.objects_per_s * OBJECT_BYTES) as f64 / 1e6;
    println!(
        "\n{} objects of 4 MiB ({gb:.1} GB); the fleet writes {} objects a second ({mb_s:.1} MB/s), shared by the nodes of the start",
        bucket.objects, bucket.objects_per_s
    );
    println!("{} {:>6}", Outcome::header(), "wall");
    for nodes in NODES {
        for conditional_writes in [true, false] {
            if !conditional_writes && nodes > bucket.every_node_up_to {
                println!(
                    "{nodes:>5} every_node  not run: {nodes} views of {} objects, one a node, do not fit this machine's memory",
                    bucket.objects
                );
                continue;
            }
            let run = Instant::now();
            let outcome = sim::run(&config(nodes, bucket, conditional_writes));
            println!("{outcome} {:>6.1}", run.elapsed().as_secs_f64());
        }
    }
}
