//! Faults of the store, as stores show them (`docs/s3-gateway.md`, "A
//! fleet on one bucket", "The simulation's faults"): slow answers, answers
//! lost although the store applied the request (a timeout, a dropped
//! connection), writes the store applies after the client gave up, `500`
//! and `503` answers, listings dated in whole seconds and a `Date` header
//! that disagrees with `LastModified`. The scenario's events add the lease
//! deleted or made unreadable and reports forged by another writer
//! ([`super::What`]).
//!
//! Each request of the bound draws its fate from the simulation's seed
//! ([`Fate`]), so a run repeats exactly. [`chaos`] draws a whole schedule
//! of faults and events from one seed: the tests run hundreds of them,
//! the bench thousands.

use std::time::Duration;

use super::{Happening, SplitMix, Target, What};

/// The store's faults, as shares of the bound's requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// Requests answered slowly: after a time drawn up to
    /// [`Faults::slow_up_to`] instead of the latency.
    pub slow: f64,
    /// The longest slow answer.
    pub slow_up_to: Duration,
    /// Requests the store applies whose answer is lost: the node sees a
    /// failure after the latency.
    pub lost: f64,
    /// Writes of the lease and of reports that the store applies late, at
    /// a time drawn up to [`Faults::timeout`], whose answer never comes:
    /// the node sees a failure at its timeout.
    pub late: f64,
    /// Requests answered `500` or `503` and not applied.
    pub errors: f64,
    /// The store's longest delay, and the node's request timeout but for
    /// the lease's (the gateway's SDK gives up on an attempt after 30 s;
    /// the driver on a lease request after a renewal period).
    pub timeout: Duration,
    /// The store dates objects in whole seconds (SeaweedFS's listings).
    pub whole_seconds: bool,
    /// How far the store's `Date` header runs behind its `LastModified`
    /// clock: the nodes date their own writes by it.
    pub date_behind: Duration,
}

impl Faults {
    /// No fault: every request answered after the latency.
    pub const NONE: Faults = Faults {
        slow: 0.0,
        slow_up_to: Duration::ZERO,
        lost: 0.0,
        late: 0.0,
        errors: 0.0,
        timeout: Duration::from_secs(30),
        whole_seconds: false,
        date_behind: Duration::ZERO,
    };
}

/// What becomes of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Applied; answered after this.
    Answered(Duration),
    /// Applied; its answer lost: a failure after this.
    Lost(Duration),
    /// Applied this long after its sending; a failure seen after the
    /// second time (the node's timeout).
    Late(Duration, Duration),
    /// Not applied; a `500` or `503` after this.
    Refused(Duration),
}

impl Fate {
    /// When the node sees the answer, after the sending.
    pub fn after(self) -> Duration {
        match self {
            Fate::Answered(d) | Fate::Lost(d) | Fate::Refused(d) | Fate::Late(_, d) => d,
        }
    }

    /// Whether the node sees a success.
    pub fn answered(self) -> bool {
        matches!(self, Fate::Answered(_))
    }

    /// Whether the store applies the request (now, or late).
    pub fn applied(self) -> bool {
        !matches!(self, Fate::Refused(_))
    }
}

/// Draws the fate of a request whose node gives up after `timeout`:
/// `late_ok` for the writes that can be applied late (the lease's and the
/// reports').
pub(super) fn draw(
    faults: &Faults,
    latency: Duration,
    rng: &mut SplitMix,
    late_ok: bool,
    timeout: Duration,
) -> Fate {
    let mut latency = latency;
    if rng.unit() < faults.slow {
        latency = latency.max(faults.slow_up_to.mul_f64(rng.unit()));
    }
    if latency >= timeout {
        return Fate::Lost(timeout);
    }
    let roll = rng.unit();
    if roll < faults.errors {
        Fate::Refused(latency)
    } else if roll < faults.errors + faults.lost {
        Fate::Lost(latency)
    } else if late_ok && roll < faults.errors + faults.lost + faults.late {
        Fate::Late(faults.timeout.mul_f64(rng.unit()), timeout)
    } else {
        Fate::Answered(latency)
    }
}

/// A schedule of faults and events for `nodes` nodes over `duration`,
/// drawn from `seed`: fault shares up to 5% of `500`/`503`, 3% lost
/// answers, 2% late writes, 10% slow answers of up to 5 s; whole-second
/// dates and a `Date` 10 minutes behind, each on half the seeds; and two
/// to ten events between the first minute and five minutes before the
/// end: crashes (restarted or not, with a new id or the kept one), stalls
/// of up to two leases, clean restarts, joins, leaves, the lease deleted
/// or made unreadable, and reports forged with absurd counts or made-up
/// models.
pub fn chaos(seed: u64, duration: Duration, lease: Duration) -> (Faults, Vec<Happening>) {
    let mut rng = SplitMix(seed ^ 0x5eed_cafe_f00d_d00d);
    let faults = Faults {
        slow: rng.unit() * 0.1,
        slow_up_to: Duration::from_secs(5),
        lost: rng.unit() * 0.03,
        late: rng.unit() * 0.02,
        errors: rng.unit() * 0.05,
        timeout: Duration::from_secs(30),
        whole_seconds: rng.unit() < 0.5,
        date_behind: match rng.unit() < 0.5 {
            true => Duration::from_secs(600),
            false => Duration::ZERO,
        },
    };
    let events = 2 + (rng.next() % 9) as usize;
    let from = Duration::from_secs(60);
    let span = duration.saturating_sub(Duration::from_secs(360));
    let mut happenings: Vec<Happening> = (0..events)
        .map(|_| Happening {
            at: from + span.mul_f64(rng.unit()),
            what: event(&mut rng, lease),
        })
        .collect();
    happenings.sort_by_key(|h| h.at);
    (faults, happenings)
}

fn event(rng: &mut SplitMix, lease: Duration) -> What {
    let node = match rng.next() % 3 {
        0 => Target::Holder,
        n => Target::Other(n as usize),
    };
    let up_to = |rng: &mut SplitMix, d: Duration| d.mul_f64(rng.unit());
    match rng.next() % 11 {
        0 => What::Crash {
            node,
            restart_after: Some(up_to(rng, Duration::from_secs(60))),
        },
        10 => What::Kill {
            node,
            restart_after: up_to(rng, Duration::from_secs(60)),
        },
        1 => What::Crash {
            node,
            restart_after: None,
        },
        2 => What::Stall {
            node,
            length: up_to(rng, lease * 2),
        },
        3 => What::Restart {
            node,
            after: up_to(rng, Duration::from_secs(10)),
        },
        4 => What::Join,
        5 => What::Leave { node },
        6 => What::DeleteLease,
        7 => What::UnreadableLease,
        8 => What::ForgedReport { models: 0 },
        _ => What::ForgedReport { models: 300 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fates_follow_their_shares_and_repeat_with_the_seed() {
        let faults = Faults {
            slow: 0.1,
            slow_up_to: Duration::from_secs(40),
            lost: 0.1,
            late: 0.1,
            errors: 0.1,
            ..Faults::NONE
        };
        let latency = Duration::from_millis(20);
        let draws = |seed| {
            let mut rng = SplitMix(seed);
            (0..10_000)
                .map(|_| draw(&faults, latency, &mut rng, true, faults.timeout))
                .collect::<Vec<_>>()
        };
        let fates = draws(3);
        assert_eq!(fates, draws(3));
        let share = |f: fn(&Fate) -> bool| fates.iter().filter(|x| f(x)).count() as f64 / 1e4;
        assert!((0.08..0.12).contains(&share(|f| matches!(f, Fate::Refused(_)))));
        assert!((0.08..0.15).contains(&share(|f| matches!(f, Fate::Late(..)))));
        let timed_out = share(|f| *f == Fate::Lost(Duration::from_secs(30)));
        assert!(timed_out > 0.0 && timed_out < 0.05, "{timed_out}");
        let mut rng = SplitMix(3);
        let none: Vec<Fate> = (0..100)
            .map(|_| draw(&Faults::NONE, latency, &mut rng, true, Faults::NONE.timeout))
            .collect();
        assert!(none.iter().all(|f| *f == Fate::Answered(latency)));
    }

    #[test]
    fn a_chaos_schedule_repeats_with_its_seed_and_stays_inside_the_run() {
        let hour = Duration::from_secs(3600);
        let lease = Duration::from_secs(30);
        assert_eq!(chaos(9, hour, lease), chaos(9, hour, lease));
        assert_ne!(chaos(9, hour, lease), chaos(10, hour, lease));
        for seed in 0..100 {
            let (faults, events) = chaos(seed, hour, lease);
            assert!(faults.errors <= 0.05 && faults.lost <= 0.03 && faults.late <= 0.02);
            assert!((2..=10).contains(&events.len()));
            assert!(events.windows(2).all(|w| w[0].at <= w[1].at));
            assert!(events.iter().all(
                |h| h.at >= Duration::from_secs(60) && h.at <= hour - Duration::from_secs(300)
            ));
        }
    }
}
