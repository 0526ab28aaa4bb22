//! Running a plan: the launch that starts, supervises, restarts and stops
//! the server ([`launch`], over [`supervise`]'s process groups and
//! signals), the adapters of its tiers ([`tiers`]; which capacity guards
//! `erebine-lmcache` runs: [`guards`]), the watcher that
//! polls `/status` and reports liveness events ([`watch`]; the model and
//! the events are [`crate::status`]'s), and what
//! `erebine-lmcache` runs in the stock `lmcache`'s place ([`drop_in`]).

pub mod drop_in;
pub mod guards;
pub mod launch;
pub mod supervise;
pub mod tiers;
pub mod watch;
