//! Which objects under the prefix a bound counts and may delete: keys that
//! decode as LMCache's ([`parse_s3_key`]) whose model the prefix's nodes
//! write (`docs/s3-gateway.md`, "The bucket bound"), under any cache
//! identity ([`crate::identity`]): one budget for every identity of a model.
//!
//! A prefix is a string, not a boundary: under a prefix `p/` (or none) a
//! key `q/m@...` of another tier decodes as LMCache's too, for the model
//! `q/m`. So a bound counts only the models it knows are written here:
//! those of its tier's `bucket_bound.models`, those this node stored, those
//! other nodes report ([`super::report::ReportBody::models`]) and those
//! the lease's holder publishes ([`super::lease::LeaseBody::models`]).
//!
//! Reports and the lease are untrusted input, so a model they name is
//! only a candidate until a listing shows a key of it: at most
//! [`MAX_MODELS`] are known, a candidate gives way to a new one when the
//! set is full, and a listing forgets the candidates it does not confirm
//! once they are [`CANDIDATE_AGE`] old. A confirmed model (this node
//! stored it, or a listing showed it) is forgotten once no listing nor
//! write has shown it for [`MODEL_AGE`]. The configured models stay.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use lmcache_housekeeping::s3_key::parse_s3_key;

use crate::identity::model_of;

/// The most models one bound knows, the configured ones included.
pub const MAX_MODELS: usize = 256;
/// A model a report or the lease named and no listing showed since is
/// forgotten by the first listing past this age.
pub const CANDIDATE_AGE: Duration = Duration::from_secs(600);
/// A model seen in the store that no listing nor write has shown for this
/// long is forgotten.
pub const MODEL_AGE: Duration = Duration::from_secs(24 * 3600);

/// A learned model: whether the store showed a key of it, and when it was
/// last shown (or first named, for a candidate), on the node's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Learned {
    in_store: bool,
    at: Duration,
}

impl Learned {
    /// Shown by the store (a listing, or this node's own write) at `at`.
    fn shown(at: Duration) -> Self {
        Learned { in_store: true, at }
    }
}

/// The models a bound counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Models {
    configured: BTreeSet<String>,
    learned: BTreeMap<String, Learned>,
}

impl Models {
    /// The models of the tier's `bucket_bound.models` (at most
    /// [`MAX_MODELS`]).
    pub fn new(configured: impl IntoIterator<Item = String>) -> Self {
        Models {
            configured: configured.into_iter().take(MAX_MODELS).collect(),
            learned: BTreeMap::new(),
        }
    }

    fn knows(&self, model: &str) -> bool {
        self.configured.contains(model) || self.learned.contains_key(model)
    }

    /// Makes room for one more model: a candidate gives way, the oldest
    /// named first. False when every model is confirmed.
    fn room(&mut self) -> bool {
        if self.configured.len() + self.learned.len() < MAX_MODELS {
            return true;
        }
        let oldest = self
            .learned
            .iter()
            .filter(|(_, l)| !l.in_store)
            .min_by_key(|(name, l)| (l.at, name.as_str()))
            .map(|(name, _)| name.clone());
        oldest.is_some_and(|name| self.learned.remove(&name).is_some())
    }

    /// `model` was named at `now` by a report or the lease: a candidate
    /// when new. True when it is new.
    pub fn named(&mut self, model: &str, now: Duration) -> bool {
        if self.knows(model) || !self.room() {
            return false;
        }
        let candidate = Learned {
            in_store: false,
            at: now,
        };
        self.learned.insert(model.to_string(), candidate);
        true
    }

    /// Names each of `models` at `now` ([`Models::named`]); true when one
    /// is new.
    pub fn named_all(&mut self, models: &[String], now: Duration) -> bool {
        let added = models.iter().filter(|m| self.named(m, now)).count();
        added > 0
    }

    /// This node stored the LMCache key `key` (inside the prefix, its
    /// cache identity's segment left out: [`model_of`]) at `now`: its
    /// model is confirmed. True when it is new. A key that does not
    /// decode adds nothing.
    pub fn stored_key(&mut self, key: &str, now: Duration) -> bool {
        let Ok(name) = parse_s3_key(key) else {
            return false;
        };
        let model = model_of(&name.model);
        if self.configured.contains(model) {
            return false;
        }
        let new = !self.learned.contains_key(model);
        if new && !self.room() {
            return false;
        }
        self.learned.insert(model.to_string(), Learned::shown(now));
        new
    }

    /// A listing of the prefix ended at `now` with `objects` (`key` gives
    /// each one's key inside the prefix), each key decoded once: the objects of models this bound does not count are
    /// left out; the learned models it shows an object of are confirmed;
    /// candidates it does not show are forgotten past [`CANDIDATE_AGE`],
    /// confirmed models past [`MODEL_AGE`]. Returns the models forgotten.
    pub fn listed<T>(
        &mut self,
        now: Duration,
        objects: &mut Vec<T>,
        key: impl Fn(&T) -> &str,
    ) -> Vec<String> {
        let mut shown: BTreeSet<String> = BTreeSet::new();
        let (configured, learned) = (&self.configured, &mut self.learned);
        objects.retain(|object| {
            let Ok(name) = parse_s3_key(key(object)) else {
                return false;
            };
            let model = model_of(&name.model);
            let Some(seen) = learned.get_mut(model) else {
                return configured.contains(model);
            };
            *seen = Learned::shown(now);
            if !shown.contains(model) {
                shown.insert(model.to_string());
            }
            true
        });
        let old = |l: &Learned| {
            let age = if l.in_store { MODEL_AGE } else { CANDIDATE_AGE };
            now.saturating_sub(l.at) >= age
        };
        let gone: Vec<String> = self
            .learned
            .iter()
            .filter(|(name, l)| !shown.contains(*name) && old(l))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &gone {
            self.learned.remove(name);
        }
        gone
    }

    /// Whether the bound counts the object `key` (inside the prefix): it
    /// decodes as LMCache's and its model, under whichever cache identity
    /// ([`model_of`]), is known.
    pub fn counts(&self, key: &str) -> bool {
        parse_s3_key(key).is_ok_and(|name| self.knows(model_of(&name.model)))
    }

    /// The models to publish in the lease and in reports, in order: the
    /// configured ones and those the store showed, never a candidate (a
    /// name only a report gave, which every reader would name on).
    pub fn confirmed(&self) -> Vec<String> {
        let shown = self.learned.iter().filter(|(_, l)| l.in_store);
        let all: BTreeSet<&String> = self
            .configured
            .iter()
            .chain(shown.map(|(n, _)| n))
            .collect();
        all.into_iter().cloned().collect()
    }

    /// The models, in order: the configured and the learned, candidates
    /// included.
    pub fn names(&self) -> Vec<String> {
        let all: BTreeSet<&String> = self.configured.iter().chain(self.learned.keys()).collect();
        all.into_iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "00ff";
    const T0: Duration = Duration::ZERO;

    fn key(model: &str) -> String {
        format!("{model}@01000100@0@{HASH}")
    }

    #[test]
    fn only_known_models_count_whatever_shape_a_foreign_key_has() {
        let mut models = Models::new(["test-model".to_string()]);
        assert!(models.counts(&key("test-model")));
        for foreign in [
            key("2/test-model"),
            key("xtest-model"),
            key("other-tier/test-model"),
            key("test-model/x"),
            "test-model".to_string(),
            format!("test-model@01000100@0@{HASH}\u{1}"),
            ".lmcache-tier/lease".to_string(),
        ] {
            assert!(!models.counts(&foreign), "{foreign:?} counted");
        }
        assert!(models.stored_key(&key("meta-llama/Llama-3.1-8B"), T0));
        assert!(!models.stored_key(&key("meta-llama/Llama-3.1-8B"), T0));
        assert!(!models.stored_key("notes.txt", T0));
        assert!(models.counts(&key("meta-llama/Llama-3.1-8B")));
        assert_eq!(models.names(), ["meta-llama/Llama-3.1-8B", "test-model"]);
    }

    /// A rolling upgrade: the objects of a model under its old identity
    /// and its new one are one budget, and a key of another model under an
    /// identity segment counts only once that model is known.
    #[test]
    fn every_cache_identity_of_a_known_model_counts_as_that_model() {
        let old = crate::identity::segment("0123456789abcdef");
        let new = crate::identity::segment("fedcba9876543210");
        let mut models = Models::new(["org/m".to_string()]);
        assert!(models.counts(&key(&format!("{old}org/m"))));
        assert!(models.counts(&key(&format!("{new}org/m"))));
        assert!(models.counts(&key("org/m")));
        assert!(!models.counts(&key(&format!("{new}org/other"))));
        assert!(models.stored_key(&key(&format!("{new}org/other")), T0));
        assert!(models.counts(&key(&format!("{old}org/other"))));
        assert_eq!(models.names(), ["org/m", "org/other"]);
        assert!(!models.counts(&key("cache-identity-0123/org/m")));
    }

    /// 256 made-up models named by a report fill the set only with
    /// candidates: a model written here still enters, a listing that
    /// shows none of them forgets them, and a named model the listing
    /// shows stays.
    #[test]
    fn made_up_models_give_way_and_a_listing_forgets_them() {
        let mut models = Models::new(["mine".to_string()]);
        let many: Vec<String> = (0..MAX_MODELS + 10)
            .map(|i| format!("fake{i:03}"))
            .collect();
        assert!(models.named_all(&many, T0));
        assert_eq!(models.names().len(), MAX_MODELS);
        assert!(models.named("real", T0 + Duration::from_secs(1)));
        assert!(models.stored_key(&key("written"), T0));
        assert_eq!(models.names().len(), MAX_MODELS);
        assert!(models.counts(&key("real")) && models.counts(&key("written")));
        assert_eq!(
            models.confirmed(),
            ["mine", "written"],
            "candidates unpublished"
        );
        let listing = || {
            let keys = [key("mine"), key("real"), key("fake100"), key("stranger")];
            keys.to_vec()
        };
        let mut kept = listing();
        let gone = models.listed(T0 + CANDIDATE_AGE / 2, &mut kept, String::as_str);
        assert_eq!(kept.len(), 3, "the stranger's object left out");
        assert!(gone.is_empty(), "young candidates wait a listing");
        let later = T0 + CANDIDATE_AGE * 2;
        let gone = models.listed(later, &mut listing(), String::as_str);
        assert_eq!(gone.len(), MAX_MODELS - 4, "fakes not shown; two gave way");
        assert_eq!(models.names(), ["fake100", "mine", "real", "written"]);
        assert!(!models.counts(&key("stranger")), "a listing never adds");
        assert_eq!(models.confirmed(), ["fake100", "mine", "real", "written"]);
        let gone = models.listed(later + MODEL_AGE, &mut Vec::<String>::new(), String::as_str);
        assert_eq!(gone, ["fake100", "real", "written"]);
        assert_eq!(models.names(), ["mine"], "the configured model stays");
    }

    #[test]
    fn a_set_of_confirmed_models_takes_no_candidate() {
        let mut models = Models::default();
        for i in 0..MAX_MODELS {
            assert!(models.stored_key(&key(&format!("m{i}")), T0));
        }
        assert!(!models.named("one-more", T0));
        assert!(!models.stored_key(&key("one-more"), T0));
        assert_eq!(models.names().len(), MAX_MODELS);
    }
}
