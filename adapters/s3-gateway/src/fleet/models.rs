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

use std::collections::BTreeSet;

use lmcache_housekeeping::s3_key::parse_s3_key;

use crate::identity::model_of;

/// The most models one bound knows; a report or lease naming more adds
/// none past it.
pub const MAX_MODELS: usize = 256;

/// The models a bound counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Models {
    known: BTreeSet<String>,
}

impl Models {
    /// The models of the tier's `bucket_bound.models`.
    pub fn new(configured: impl IntoIterator<Item = String>) -> Self {
        let mut models = Models::default();
        for model in configured {
            models.learn(&model);
        }
        models
    }

    /// Adds `model`; true when it is new.
    pub fn learn(&mut self, model: &str) -> bool {
        if self.known.len() >= MAX_MODELS || self.known.contains(model) {
            return false;
        }
        self.known.insert(model.to_string())
    }

    /// Adds the model of the LMCache key `key` (inside the prefix, its
    /// cache identity's segment left out: [`model_of`]); true when it is
    /// new. A key that does not decode adds nothing.
    pub fn learn_key(&mut self, key: &str) -> bool {
        parse_s3_key(key).is_ok_and(|name| self.learn(model_of(&name.model)))
    }

    /// Adds each of `models`; true when one is new.
    pub fn learn_all(&mut self, models: &[String]) -> bool {
        let added = models.iter().filter(|model| self.learn(model)).count();
        added > 0
    }

    /// Whether the bound counts the object `key` (inside the prefix): it
    /// decodes as LMCache's and its model, under whichever cache identity
    /// ([`model_of`]), is known.
    pub fn counts(&self, key: &str) -> bool {
        parse_s3_key(key).is_ok_and(|name| self.known.contains(model_of(&name.model)))
    }

    /// The models, in order.
    pub fn names(&self) -> Vec<String> {
        self.known.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "00ff";

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
        assert!(models.learn_key(&key("meta-llama/Llama-3.1-8B")));
        assert!(!models.learn_key(&key("meta-llama/Llama-3.1-8B")));
        assert!(!models.learn_key("notes.txt"));
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
        assert!(models.learn_key(&key(&format!("{new}org/other"))));
        assert!(models.counts(&key(&format!("{old}org/other"))));
        assert_eq!(models.names(), ["org/m", "org/other"]);
        assert!(!models.counts(&key("cache-identity-0123/org/m")));
    }

    #[test]
    fn a_report_naming_endless_models_adds_no_more_than_the_most() {
        let mut models = Models::default();
        let many: Vec<String> = (0..MAX_MODELS + 10).map(|i| format!("m{i}")).collect();
        assert!(models.learn_all(&many));
        assert_eq!(models.names().len(), MAX_MODELS);
        assert!(!models.learn("one-more"));
    }
}
