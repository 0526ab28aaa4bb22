//! Uploads left behind: the evictor aborts the multipart uploads under the
//! tier's prefix that nobody completed or aborted (`docs/s3-gateway.md`,
//! "Uploads left behind").
//!
//! An LMCache server killed in the middle of a multipart upload leaves its
//! parts in the store (S3's incomplete uploads, OpenStack Swift's
//! `<bucket>+segments`), where no listing of objects counts them. The node
//! that evicts lists the prefix's uploads (ListMultipartUploads) once a
//! [`Sweep::every`] and aborts each it has seen in every listing for
//! [`Timing::abandoned_upload`] (an hour by default; no live upload of an
//! LMCache chunk takes minutes). The age is counted on this node's
//! monotonic clock from the listing that first showed the upload, never
//! from the store's `Initiated` date, so a node's clock that is off by any
//! amount aborts nothing early; a new evictor counts from its own first
//! listing, so an upload goes at most [`Timing::abandoned_upload`] plus a
//! period after the evictor that keeps the lease first sees it.

use std::collections::HashMap;
use std::time::Duration;

use super::Timing;

/// An upload: its key inside the tier's prefix and its upload id.
pub type Upload = (String, String);

/// The sweeps of one evictor.
#[derive(Debug, Clone)]
pub struct Sweep {
    age: Duration,
    first_seen: HashMap<Upload, Duration>,
    next_at: Duration,
}

impl Sweep {
    /// The sweeps of `timing`, the first due at `now`.
    pub fn new(timing: &Timing, now: Duration) -> Self {
        Sweep {
            age: timing.abandoned_upload,
            first_seen: HashMap::new(),
            next_at: now,
        }
    }

    /// The period of the sweeps: a quarter of the age, at least a second
    /// and at most ten minutes.
    pub fn every(&self) -> Duration {
        (self.age / 4).clamp(Duration::from_secs(1), Duration::from_secs(600))
    }

    /// When the next sweep is due.
    pub fn next_at(&self) -> Duration {
        self.next_at
    }

    /// Whether a sweep is due at `now`.
    pub fn due(&self, now: Duration) -> bool {
        now >= self.next_at
    }

    /// The uploads a listing at `now` found: returns those to abort (seen
    /// for the age or longer). Uploads no longer listed are forgotten.
    pub fn listed(&mut self, now: Duration, uploads: Vec<Upload>) -> Vec<Upload> {
        let before = std::mem::take(&mut self.first_seen);
        let mut abort = Vec::new();
        for upload in uploads {
            let seen = before.get(&upload).copied().unwrap_or(now);
            if now.saturating_sub(seen) >= self.age {
                abort.push(upload);
            } else {
                self.first_seen.insert(upload, seen);
            }
        }
        self.next_at = now + self.every();
        abort
    }

    /// The abort of `upload` failed at `now`: it is tried again at the next
    /// sweep that still lists it, not a whole age later.
    pub fn abort_failed(&mut self, now: Duration, upload: Upload) {
        self.first_seen.insert(upload, now.saturating_sub(self.age));
    }

    /// A listing at `now` failed: tried again a period later.
    pub fn failed(&mut self, now: Duration) {
        self.next_at = now + self.every();
    }

    /// This node stopped evicting: what it saw is forgotten, and a sweep is
    /// due as soon as it evicts again.
    pub fn forget(&mut self, now: Duration) {
        self.first_seen.clear();
        self.next_at = now;
    }

    /// Uploads seen and not yet old enough.
    pub fn watched(&self) -> usize {
        self.first_seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn upload(key: &str, id: &str) -> Upload {
        (key.to_string(), id.to_string())
    }

    #[test]
    fn an_upload_is_aborted_once_seen_for_the_age_and_a_younger_one_is_kept() {
        let timing = Timing {
            abandoned_upload: 8 * S,
            ..Timing::default()
        };
        let mut sweep = Sweep::new(&timing, Duration::ZERO);
        assert_eq!(sweep.every(), 2 * S);
        assert!(sweep.due(Duration::ZERO));
        let old = upload("m@1@0@aa", "u1");
        assert!(sweep.listed(Duration::ZERO, vec![old.clone()]).is_empty());
        assert!(!sweep.due(S) && sweep.due(2 * S));
        let young = upload("m@1@0@bb", "u2");
        assert!(sweep
            .listed(6 * S, vec![old.clone(), young.clone()])
            .is_empty());
        assert_eq!(sweep.listed(8 * S, vec![old.clone(), young.clone()]), [old]);
        assert_eq!(sweep.watched(), 1);
        assert_eq!(sweep.listed(14 * S, vec![young.clone()]), [young]);
        assert_eq!(sweep.watched(), 0);
    }

    #[test]
    fn a_completed_upload_is_forgotten_and_a_new_evictor_counts_from_its_own_listing() {
        let timing = Timing {
            abandoned_upload: 4 * S,
            ..Timing::default()
        };
        let mut sweep = Sweep::new(&timing, Duration::ZERO);
        let a = upload("m@1@0@aa", "u1");
        sweep.listed(Duration::ZERO, vec![a.clone()]);
        sweep.listed(2 * S, Vec::new());
        assert!(sweep.listed(4 * S, vec![a.clone()]).is_empty());
        sweep.forget(5 * S);
        assert!(sweep.due(5 * S));
        assert!(sweep.listed(6 * S, vec![a.clone()]).is_empty());
        assert_eq!(
            sweep.listed(10 * S, vec![a.clone()]),
            std::slice::from_ref(&a)
        );
        sweep.abort_failed(10 * S, a.clone());
        assert_eq!(sweep.listed(11 * S, vec![a.clone()]), [a]);
    }
}
