//! Running a plan: the launch that starts, supervises, restarts and stops
//! the server ([`launch`], over [`supervise`]'s process groups and
//! signals), the capacity guards it starts ([`guards`]), its `/status`
//! client ([`status`]) and liveness events ([`watch`], [`oom`]), and what
//! `erebine-lmcache` runs in the stock `lmcache`'s place ([`drop_in`]).

pub mod drop_in;
pub mod guards;
pub mod launch;
pub mod oom;
pub mod status;
pub mod supervise;
pub mod watch;
