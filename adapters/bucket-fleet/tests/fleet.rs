//! The bucket bound's machines in a fleet, through the simulation
//! (`lmcache_bucket_fleet::sim`): gateways on one prefix of about
//! 10^4 objects of capacity, a simulated hour each, through crashes,
//! stalls and restarts (`docs/s3-gateway.md`, "A fleet on one bucket").
//! With conditional writes the bucket stays within its bound and the
//! fleet's listings do not grow with its size; no two nodes evict at once;
//! the prefix goes without an evictor for at most a lease and a follow;
//! clocks minutes apart change nothing. Without them every node evicts on
//! its own, within a larger bound. Under seeded store faults and node
//! events (`sim::chaos`), 200 seeds keep the rules of
//! `docs/s3-gateway.md`, "The simulation's faults".

use std::time::Duration;

use lmcache_bucket_fleet::sim::{self, Config, Happening, Outcome, Target, What};

/// The capacity, objects of 4 MiB (41.9 GB).
const CAPACITY_OBJECTS: u64 = 10_000;
/// A step: the requests of a takeover (a read and a write, 20 ms each)
/// and the simulation's sampling of the holders (at each event: writes
/// of the fleet come ten a second).
const STEP: Duration = Duration::from_secs(1);

/// `nodes` nodes writing 10 objects a second together (3.6 capacities an
/// hour) through the scenario of `fleet::sim::scenario` (the holder
/// killed and restarted, the holder stopped past its lease, another node
/// killed and restarted, joins and leaves), wall clocks up to 10 min
/// ahead of the store's (the first holder's by all of it), monotonic
/// clocks of origins up to 30 days apart.
fn fleet(nodes: usize) -> Config {
    Config {
        scenario: sim::scenario(),
        wall_clock_spread: Duration::from_secs(600),
        uptime_spread: Duration::from_secs(30 * 86_400),
        ..Config::new(nodes, CAPACITY_OBJECTS)
    }
}

/// LIST requests an hour but the start-up checks (one per start).
fn steady_lists(out: &Outcome) -> u64 {
    out.per_hour(out.requests.list - out.started as u64)
}

/// The stated bound of [`steady_lists`] with a lease, which does not grow
/// with the number of nodes: the holder reads the reports' folder once a
/// reading period (one page per 1,000 reports), and lists the whole
/// prefix when it takes the lease and once a listing period after (in an
/// hour, 3,600 / the period, plus one per taking), each listing of one
/// page per 1,000 keys: the LMCache objects (at most the peak's), the
/// reports and the lease. (The holder lists sooner only when its view
/// holds nothing to evict at the trigger, which this fleet, writing 7% of
/// the capacity in a horizon, never makes.)
fn list_bound(config: &Config, out: &Outcome) -> u64 {
    let t = config.spec.timing;
    let hour = Duration::from_secs(3600);
    let reports = out.started as u64;
    let folder = hour.as_secs() / t.read_reports.as_secs() * reports.div_ceil(1000).max(1);
    let keys = out.peak_bytes.div_ceil(out.object_bytes) + reports + 1;
    let took = out.lease.expect("a lease").took;
    folder + (hour.as_secs() / t.listing.as_secs() + took) * keys.div_ceil(1000)
}

#[test]
fn a_hundred_nodes_keep_the_bucket_within_its_bound_through_crashes_stalls_and_restarts() {
    let config = fleet(100);
    let out = sim::run(&config);
    println!("{}\n{out}", Outcome::header());
    assert_eq!(out.every_node, 0);
    assert!(out.peak_bytes <= out.goal_bytes(), "{out}");
    assert!(out.evicted > 3 * CAPACITY_OBJECTS / 2, "{out}");
    let lease = out.lease.expect("a lease");
    assert!(
        lease.takeovers() >= 2,
        "the holder's crash and stall: {out}"
    );
    assert_eq!(lease.two_holders, 0, "{out}");
    let t = config.spec.timing;
    assert!(
        lease.longest_no_holder <= t.lease + t.follow() + STEP,
        "{lease:?}"
    );
}

#[test]
fn the_fleets_listings_an_hour_do_not_grow_with_its_nodes() {
    let (ten, hundred) = (fleet(10), fleet(100));
    let outs = [sim::run(&ten), sim::run(&hundred)];
    println!("{}\n{}\n{}", Outcome::header(), outs[0], outs[1]);
    for (config, out) in [(&ten, &outs[0]), (&hundred, &outs[1])] {
        assert!(
            steady_lists(out) <= list_bound(config, out),
            "{} > {}: {out}",
            steady_lists(out),
            list_bound(config, out)
        );
    }
    let t = hundred.spec.timing;
    let took = outs[1].lease.expect("a lease").took;
    let listings = 3600 / t.listing.as_secs() + took;
    let apart = steady_lists(&outs[0]).abs_diff(steady_lists(&outs[1]));
    assert!(
        apart <= listings,
        "{apart} LIST an hour apart: more than a page per full listing"
    );
}

#[test]
fn clocks_ten_minutes_apart_and_monotonic_origins_change_nothing() {
    let apart = fleet(100);
    let alike = Config {
        wall_clock_spread: Duration::ZERO,
        uptime_spread: Duration::ZERO,
        ..fleet(100)
    };
    assert_eq!(sim::run(&apart), sim::run(&alike));
}

#[test]
fn no_two_nodes_hold_the_lease_whatever_the_length_of_the_holders_stalls() {
    let seconds = [5, 14, 16, 25, 29, 31, 40, 60];
    let scenario = seconds
        .iter()
        .enumerate()
        .map(|(i, &length)| Happening {
            at: Duration::from_secs(120 + 180 * i as u64),
            what: What::Stall {
                node: Target::Holder,
                length: Duration::from_secs(length),
            },
        })
        .collect();
    let config = Config {
        duration: Duration::from_secs(1800),
        scenario,
        ..fleet(10)
    };
    let out = sim::run(&config);
    let lease = out.lease.expect("a lease");
    assert_eq!(lease.two_holders, 0, "{out}");
    assert!(lease.takeovers() >= 2, "the stalls past the lease: {out}");
    let t = config.spec.timing;
    assert!(
        lease.longest_no_holder <= t.lease + t.follow() + STEP,
        "{lease:?}"
    );
    assert!(out.peak_bytes <= out.goal_bytes(), "{out}");
}

/// Without conditional writes every node lists after writing a fiftieth
/// of the capacity, or once a listing period: what the others wrote
/// since is past what it sees, at most a fiftieth of the capacity per
/// node, and at most what the fleet writes in a listing period; and one
/// object in flight per node.
#[test]
fn a_store_without_conditional_writes_gets_every_node_evicting_within_its_larger_bound() {
    let config = Config {
        conditional_writes: false,
        ..fleet(10)
    };
    let out = sim::run(&config);
    println!("{}\n{out}", Outcome::header());
    assert_eq!((out.every_node, out.lease), (out.started, None));
    let spec = config.spec;
    let nodes = out.started as u64;
    let fleet_rate = config.fleet_bytes_per_s * nodes / config.nodes as u64;
    let unseen = (nodes * spec.listing_every_bytes).min(fleet_rate * spec.timing.listing.as_secs());
    let bound = spec.trigger_bytes + unseen + nodes * config.object_bytes;
    assert!(out.peak_bytes <= bound, "{out}");
    assert!(out.peak_bytes > spec.trigger_bytes, "{out}");
    assert!(out.evicted > 3 * CAPACITY_OBJECTS / 2, "{out}");
}

/// A holder that stops cleanly releases the lease, so the prefix goes
/// without an evictor only until another node reads the lease (a follow
/// period, a third of the lease), not for a lease and a follow as after a
/// crash: the holder restarted cleanly six times, each restart 5 s after
/// its stop, and two leaving, in a fleet of ten.
#[test]
fn a_holder_that_stops_cleanly_hands_the_lease_over_within_a_follow() {
    let mut scenario: Vec<Happening> = (0..6)
        .map(|i| Happening {
            at: Duration::from_secs(120 + 240 * i),
            what: What::Restart {
                node: Target::Holder,
                after: Duration::from_secs(5),
            },
        })
        .collect();
    for at in [1700, 1760] {
        scenario.push(Happening {
            at: Duration::from_secs(at),
            what: What::Leave {
                node: Target::Holder,
            },
        });
    }
    let config = Config {
        duration: Duration::from_secs(1800),
        scenario,
        ..fleet(10)
    };
    let out = sim::run(&config);
    let lease = out.lease.expect("a lease");
    assert_eq!(lease.two_holders, 0, "{out}");
    assert!(lease.takeovers() >= 8, "each clean stop hands over: {out}");
    // The longest stretch is the start's (the lease's creator deletes from
    // half a lease on); the handovers after it take a follow at most each.
    let t = config.spec.timing;
    assert!(lease.longest_no_holder <= t.hold() + STEP, "{lease:?}");
    let handovers = lease.no_holder.saturating_sub(t.hold() + STEP);
    assert!(
        handovers <= (t.follow() + STEP) * lease.takeovers() as u32,
        "{lease:?}"
    );
    assert!(out.peak_bytes <= out.goal_bytes(), "{out}");
}

/// A holder killed and started again with the node id it kept takes its
/// lease back at its first reading, then deletes from half a lease on
/// (`docs/s3-gateway.md`, "The election", rule 7); one that comes back
/// with a new id waits, like every other node, for the lease to lapse.
#[test]
fn a_holder_killed_and_back_with_its_id_takes_its_lease_back_at_once() {
    let t = Config::new(1, 1).spec.timing;
    let back = Duration::from_secs(5);
    let run = |what| {
        let config = Config {
            duration: Duration::from_secs(600),
            scenario: vec![Happening {
                at: Duration::from_secs(300),
                what,
            }],
            ..fleet(10)
        };
        sim::run(&config)
    };
    let kept = run(What::Kill {
        node: Target::Holder,
        restart_after: back,
    });
    let new = run(What::Crash {
        node: Target::Holder,
        restart_after: Some(back),
    });
    let (k, n) = (kept.lease.expect("a lease"), new.lease.expect("a lease"));
    assert_eq!((k.two_holders, n.two_holders), (0, 0), "{kept}\n{new}");
    assert!(k.longest_no_holder <= back + t.hold() + STEP * 2, "{k:?}");
    assert!(n.longest_no_holder >= t.lease, "{n:?}");
    assert!(kept.peak_bytes <= kept.goal_bytes(), "{kept}");
}

/// What every seeded run keeps (`docs/s3-gateway.md`, "The simulation's
/// faults"): never two nodes that may delete at once; nothing deleted
/// that is not an LMCache object of the counted model; victims oldest
/// first by `LastModified` among what the evictor's last listing showed;
/// no more than three leases without an evictor while a node runs; and
/// the bucket within its stated bound ([`Outcome::stated_bound_bytes`]:
/// 1.05 times the capacity and an object a node, or the trigger and what
/// the fleet writes over the longest stretch without an evictor and
/// [`sim::SETTLE`] more).
fn kept(seed: u64, out: &Outcome) -> Result<(), String> {
    let lease = out.lease.ok_or("no lease")?;
    let t = Config::new(1, 1).spec.timing;
    let broken = [
        (lease.two_holders > 0, "two nodes may delete at once"),
        (out.checks.foreign_deleted > 0, "a foreign key deleted"),
        (out.checks.out_of_order > 0, "victims out of order"),
        (
            lease.longest_no_holder > t.lease * 3,
            "no evictor for over three leases",
        ),
        (
            out.peak_bytes > out.stated_bound_bytes(),
            "the bucket past its stated bound",
        ),
    ];
    match broken.iter().find(|(bad, _)| *bad) {
        Some((_, what)) => Err(format!("seed {seed}: {what}: {:?} {out}", out.checks)),
        None => Ok(()),
    }
}

/// 200 seeds of faults and events, each checked at every step of the
/// simulation: the rules above hold on every one.
#[test]
fn two_hundred_seeds_of_store_faults_and_node_events_keep_the_rules() {
    let failures: Vec<String> = std::thread::scope(|s| {
        let half = |from: u64| {
            s.spawn(move || {
                (from..from + 100)
                    .filter_map(|seed| kept(seed, &sim::run(&Config::chaos(seed))).err())
                    .collect::<Vec<_>>()
            })
        };
        let (a, b) = (half(0), half(100));
        let mut all = a.join().unwrap();
        all.extend(b.join().unwrap());
        all
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The checks can fail: a store that fails every request (no lease is
/// ever taken, nothing evicted) breaks the bounds on the time without an
/// evictor and on the bucket. (The store's own checks of each deletion
/// are unit-tested in `fleet::sim::store`.)
#[test]
fn the_seeded_checks_catch_a_bucket_past_its_bound() {
    let config = Config {
        faults: sim::Faults {
            errors: 1.0,
            ..sim::Faults::NONE
        },
        ..Config::chaos(1)
    };
    let out = sim::run(&config);
    assert!(kept(1, &out).is_err(), "{out}");
}
