//! How a guard runs: its timings, its owner, whether it watches with
//! inotify (`docs/capacity-guard.md`).

use std::time::Duration;

/// Timing of a guard.
#[derive(Debug, Clone)]
pub struct GuardOptions {
    /// Least time between two writes of the status file while the usage
    /// changes. Default 1 s.
    pub status_interval: Duration,
    /// Least time between periodic rescans of a `"shared": true` tier.
    /// Default 10 s.
    pub shared_rescan: Duration,
    /// Least time between rescans of a tier inotify cannot watch, and
    /// between two looks at what the tier path names (a directory made,
    /// moved or mounted there; `docs/capacity-guard.md`, "The directory it
    /// guards"). Default 1 s.
    pub fallback_rescan: Duration,
    /// Follow the tier with inotify (default); `false` follows it by rescans
    /// only, as when inotify is unavailable.
    pub inotify: bool,
    /// Time between two reads of the volume's free space (a `statvfs`,
    /// microseconds). Default 250 ms: how soon stores that failed on a full
    /// volume find room again.
    pub free_check: Duration,
    /// Who runs the guard: a token of the launch, or of the `erebine-lmcache`
    /// process, that started it, written into the status file as
    /// [`GuardStatus::owner`](crate::status::GuardStatus::owner) so that its metrics serve only its own guards'
    /// statuses, never one an earlier launch left in the directory
    /// (`docs/metrics.md`, "Capacity guards"). Default `None`.
    pub owner: Option<String>,
    /// Time between two tries again of the objects the guard could not
    /// delete (`docs/capacity-guard.md`, "How it counts and follows the tier"): each
    /// try is one failed `unlink` an object. Default 60 s.
    pub undeletable_retry: Duration,
}

impl Default for GuardOptions {
    fn default() -> Self {
        Self {
            status_interval: Duration::from_secs(1),
            shared_rescan: Duration::from_secs(10),
            fallback_rescan: Duration::from_secs(1),
            inotify: true,
            free_check: Duration::from_millis(250),
            owner: None,
            undeletable_retry: Duration::from_secs(60),
        }
    }
}
