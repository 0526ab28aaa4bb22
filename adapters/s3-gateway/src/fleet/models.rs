//! Which objects under the prefix a bound counts and may delete: keys that
//! decode as LMCache's ([`parse_s3_key`]) whose model the prefix's nodes
//! write (`docs/s3-gateway.md`, "The bucket bound").
//!
//! A prefix is a string, not a boundary: under a prefix `p/` (or none) a
//! key `q/m@...` of another tier decodes as LMCache's too, for the model
//! `q/m`. So a bound counts only the models it knows are written here:
//! those of its tier's `bucket_bound.models`, those this node stored, those
//! other nodes report ([`super::report::ReportBody::models`]) and those
//! the lease's holder publishes ([`super::lease::LeaseBody::models`]).

use std::collections::BTreeSet;

use lmcache_housekeeping::s3_key::parse_s3_key;

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

    /// Adds the model of the LMCache key `key` (inside the prefix); true
    /// when it is new. A key that does not decode adds nothing.
    pub fn learn_key(&mut self, key: &str) -> bool {
        parse_s3_key(key).is_ok_and(|name| self.learn(&name.model))
    }

    /// Adds each of `models`; true when one is new.
    pub fn learn_all(&mut self, models: &[String]) -> bool {
        let added = models.iter().filter(|model| self.learn(model)).count();
        added > 0
    }

    /// Whether the bound counts the object `key` (inside the prefix): it
    /// decodes as LMCache's and its model is known.
    pub fn counts(&self, key: &str) -> bool {
        parse_s3_key(key).is_ok_and(|name| self.known.contains(&name.model))
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

    #[test]
    fn a_report_naming_endless_models_adds_no_more_than_the_most() {
        let mut models = Models::default();
        let many: Vec<String> = (0..MAX_MODELS + 10).map(|i| format!("m{i}")).collect();
        assert!(models.learn_all(&many));
        assert_eq!(models.names().len(), MAX_MODELS);
        assert!(!models.learn("one-more"));
    }
}
