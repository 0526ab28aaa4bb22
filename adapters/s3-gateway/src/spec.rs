//! The `s3_bucket` extension of LMCache's `s3` adapter spec: which tiers need
//! the path-style gateway, what the gateway needs to know about the real
//! upstream, and the spec LMCache gets instead.
//!
//! Keys (`docs/s3-gateway.md`, "Object keys"): `s3_bucket` (the bucket, addressed
//! as `/<bucket>/<key>` on the plain `s3_endpoint` host), `s3_key_prefix`
//! (objects live under this prefix in the bucket), `s3_ca_bundle` (PEM file
//! of a private CA for the upstream TLS). LMCache's own keys keep their meaning: `s3_endpoint` (`host[:port]`),
//! `s3_region`, `disable_tls`, `aws_access_key_id`, `aws_secret_access_key`,
//! `aws_session_token`.

use serde_json::Value;

use super::credentials::{ChainSettings, CredentialSource};
use super::sigv4::KeyPair;
use crate::TierSpec;
use lmcache_bucket_fleet::rule::BoundSpecError;
use lmcache_tier_spec::{shown_value, TierKind};

/// Keys this project adds to the `s3` adapter; LMCache never sees them.
pub const EXTENSION_KEYS: &[&str] = &[
    "s3_bucket",
    "s3_key_prefix",
    "s3_ca_bundle",
    "bucket_bound",
    crate::identity::CACHE_IDENTITY,
];

/// The operator's credential keys; replaced by the per-launch pair.
const CREDENTIAL_KEYS: &[&str] = &[
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
];

/// A spec with `s3_bucket` that cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("L2 tier {position} (s3): {key}: {problem}. {fix}")]
pub struct BucketSpecError {
    /// The tier's 0-based position in the cascade.
    pub position: usize,
    /// The key at fault.
    pub key: &'static str,
    /// What is wrong (never quotes a secret).
    pub problem: String,
    /// What to do.
    pub fix: String,
}

impl From<BoundSpecError> for BucketSpecError {
    /// A key the bucket bound reads, at fault: the same tier, key, problem
    /// and fix.
    fn from(e: BoundSpecError) -> Self {
        let BoundSpecError {
            position,
            key,
            problem,
            fix,
        } = e;
        BucketSpecError {
            position,
            key,
            problem,
            fix,
        }
    }
}

/// Everything the gateway needs about one `s3` tier with `s3_bucket`.
#[derive(Debug, Clone)]
pub struct BucketTier {
    /// The tier's 0-based position in the cascade.
    pub position: usize,
    /// The upstream `host[:port]` (`s3_endpoint`).
    pub endpoint: String,
    /// `https` unless the spec sets `disable_tls`.
    pub scheme: &'static str,
    /// The bucket (`s3_bucket`).
    pub bucket: String,
    /// The key prefix inside the bucket (`s3_key_prefix`), `""` for none.
    pub key_prefix: String,
    /// The tag of the cache identity LMCache's objects are kept under
    /// (`cache_identity`, [`crate::identity`]); `None`: directly under
    /// [`Self::key_prefix`].
    pub cache_identity: Option<String>,
    /// The SigV4 region (`s3_region`).
    pub region: String,
    /// PEM text of a private CA for the upstream TLS (`s3_ca_bundle`).
    pub ca_bundle_pem: Option<Vec<u8>>,
    /// Where the real credentials for the upstream come from.
    pub credentials: CredentialSource,
}

/// Whether [`BucketTier`] reads the files a spec names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Files {
    Read,
    Skip,
}

impl BucketTier {
    /// Reads the gateway settings of `spec`, the tier at `position`.
    ///
    /// Returns `Ok(None)` for a spec that is not `type: s3` or has no
    /// `s3_bucket`: it passes through untouched. Without a static key in
    /// the spec, `env` looks up `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`
    /// and `AWS_SESSION_TOKEN`, and without those the settings of the rest
    /// of the AWS default chain ([`ChainSettings::from_env`]); whether that
    /// chain has credentials is only known when the gateway starts.
    ///
    /// Errors name the tier and the key: a missing `s3_region`, a bucket
    /// name outside the S3 rules (3-63 of `a-z 0-9 . -`, starting and ending
    /// with a letter or digit), an `s3_endpoint` with a scheme or a path, a
    /// key prefix that is not a stable key prefix
    /// ([`super::key::check_key_prefix`]),
    /// an unreadable CA bundle, only one of `aws_access_key_id` and
    /// `aws_secret_access_key`; an `s3` spec with `s3_key_prefix` or
    /// `s3_ca_bundle` but no `s3_bucket` (LMCache would ignore them).
    pub fn from_spec(
        spec: &TierSpec,
        position: usize,
        env: &(dyn Fn(&str) -> Option<String> + Sync),
    ) -> Result<Option<Self>, BucketSpecError> {
        Self::read(spec, position, env, Files::Read)
    }

    /// What [`BucketTier::from_spec`] checks that needs no file: every
    /// error it names but an unreadable CA bundle (the bundle's path must
    /// still be a string). The AWS files the environment names are not
    /// looked at either.
    ///
    /// # Errors
    /// As [`BucketTier::from_spec`].
    pub fn check_keys(
        spec: &TierSpec,
        position: usize,
        env: &(dyn Fn(&str) -> Option<String> + Sync),
    ) -> Result<(), BucketSpecError> {
        Self::read(spec, position, env, Files::Skip).map(drop)
    }

    fn read(
        spec: &TierSpec,
        position: usize,
        env: &(dyn Fn(&str) -> Option<String> + Sync),
        files: Files,
    ) -> Result<Option<Self>, BucketSpecError> {
        let object = spec.as_object();
        let err = |key: &'static str, problem: String, fix: &str| BucketSpecError {
            position,
            key,
            problem,
            fix: fix.to_string(),
        };
        if !spec.kind().is_bucket() {
            return orphan_keys(spec, position).map(|()| None);
        }
        let string = |key: &'static str| -> Result<Option<String>, BucketSpecError> {
            match object.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(err(
                    key,
                    "is not a string".into(),
                    "Write it as a JSON string.",
                )),
            }
        };
        let bucket = string("s3_bucket")?.unwrap_or_default();
        check_bucket_name(&bucket).map_err(|problem| {
            err(
                "s3_bucket",
                format!("{bucket:?} {problem}"),
                "Give the bucket's name as the object store knows it (S3 naming rules: 3-63 characters of a-z, 0-9, '.', '-').",
            )
        })?;
        let region = string("s3_region")?.filter(|r| !r.is_empty()).ok_or_else(|| {
            err(
                "s3_region",
                "is missing".into(),
                "Set \"s3_region\" to the region the object store signs for (for stores without regions, usually \"us-east-1\").",
            )
        })?;
        let endpoint = string("s3_endpoint")?.unwrap_or_default();
        check_endpoint(&endpoint).map_err(|problem| {
            err(
                "s3_endpoint",
                format!("{:?} {problem}", lmcache_tier_spec::redact_endpoint(&endpoint)),
                "Give the plain endpoint host, optionally with a port (e.g. \"swift.example.net\" or \"10.0.0.5:9000\"); use \"disable_tls\": true for plain http.",
            )
        })?;
        let key_prefix = string("s3_key_prefix")?.unwrap_or_default();
        super::key::check_key_prefix(&key_prefix).map_err(|problem| {
            err(
                "s3_key_prefix",
                format!("{key_prefix:?} {problem}"),
                "Use letters, digits and ! - _ . * ( ) /, not starting with '/', with no empty, '.' or '..' segment (e.g. \"lmcache/node-a/\"); docs/s3-gateway.md, \"Object keys\".",
            )
        })?;
        let cache_identity = string(crate::identity::CACHE_IDENTITY)?;
        if let Some(tag) = &cache_identity {
            crate::identity::check_tag(tag).map_err(|problem| {
                err(
                    crate::identity::CACHE_IDENTITY,
                    problem,
                    "Leave it out (a launch sets it from its cache identity), or give the 16 hex digits of the identity whose objects this tier shares (docs/s3-gateway.md, \"The cache identity in a bucket\").",
                )
            })?;
        }
        let disable_tls = match object.get("disable_tls") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(err(
                    "disable_tls",
                    "is not a boolean".into(),
                    "Write true or false.",
                ))
            }
        };
        let fix_pair = "Set both \"aws_access_key_id\" and \"aws_secret_access_key\" in the tier, or neither (then the AWS default chain is used, see docs/s3-gateway.md).";
        let static_keys = static_credentials(&string, env)
            .map_err(|(key, problem)| err(key, problem, fix_pair))?;
        if files == Files::Skip {
            string("s3_ca_bundle")?;
            return Ok(None);
        }
        let ca_bundle_pem = match string("s3_ca_bundle")? {
            None => None,
            Some(path) => {
                let pem = std::fs::read(&path).map_err(|e| {
                    err(
                        "s3_ca_bundle",
                        format!("cannot read {path:?}: {e}"),
                        "Point it at a readable PEM file holding the CA certificates of the object store.",
                    )
                })?;
                if let Err(problem) = super::client::ca_certificates(&pem) {
                    return Err(err(
                        "s3_ca_bundle",
                        format!("{path:?} {problem}"),
                        "Point it at a PEM file with at least one \"BEGIN CERTIFICATE\" block.",
                    ));
                }
                Some(pem)
            }
        };
        let credentials = static_keys
            .unwrap_or_else(|| CredentialSource::Chain(ChainSettings::from_env(env, &region)));
        Ok(Some(BucketTier {
            position,
            endpoint,
            scheme: if disable_tls { "http" } else { "https" },
            bucket,
            key_prefix,
            cache_identity,
            region,
            ca_bundle_pem,
            credentials,
        }))
    }

    /// Where LMCache's objects are in the bucket: [`Self::key_prefix`],
    /// then the identity's segment ([`crate::identity::segment`]) when the
    /// tier has one. The bound's own objects and its listings stay under
    /// [`Self::key_prefix`].
    pub fn object_prefix(&self) -> String {
        match &self.cache_identity {
            Some(tag) => format!("{}{}", self.key_prefix, crate::identity::segment(tag)),
            None => self.key_prefix.clone(),
        }
    }

    /// The spec LMCache gets: every key of `spec` in its order, except the
    /// [`EXTENSION_KEYS`] and the operator's credentials; `s3_endpoint` =
    /// `gateway` (`127.0.0.1:<port>`), `disable_tls` true and
    /// `s3_prefer_http2` false (the gateway speaks HTTP/1.1 only). It holds
    /// no key: LMCache 0.5.6's S3 adapter then resolves its credentials
    /// through boto3's default chain, which reads the per-launch key from
    /// the server's environment ([`crate::Gateways::server_env`]).
    pub fn rewrite(spec: &TierSpec, gateway: std::net::SocketAddr) -> TierSpec {
        let dropped: Vec<&str> = EXTENSION_KEYS
            .iter()
            .chain(CREDENTIAL_KEYS)
            .copied()
            .collect();
        spec.rewritten(
            &dropped,
            [
                ("s3_endpoint", gateway.to_string().into()),
                ("disable_tls", true.into()),
                ("s3_prefer_http2", false.into()),
            ],
        )
    }
}

/// Whether LMCache signs the `s3` tier `spec` with keys of its own: both
/// `aws_access_key_id` and `aws_secret_access_key` set and not empty (LMCache
/// 0.5.6's S3 adapter uses them then, and the default chain otherwise).
fn has_own_keys(spec: &TierSpec) -> bool {
    let set = |key: &str| {
        spec.as_object()
            .get(key)
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty())
    };
    set("aws_access_key_id") && set("aws_secret_access_key")
}

/// When any tier of `tiers` (the cascade, in order) goes through a gateway,
/// checks that every other `s3` tier has keys of its own: the server's
/// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` then hold the gateways'
/// per-launch key, which LMCache's default chain would sign such a tier's
/// requests with (`docs/s3-gateway.md`, "The per-launch key").
///
/// # Errors
/// The first `s3` tier without `s3_bucket` and without both keys, named by
/// its position, under the key `aws_access_key_id`.
pub fn check_default_chain<'a>(
    tiers: impl IntoIterator<Item = &'a TierSpec> + Clone,
) -> Result<(), BucketSpecError> {
    if !tiers.clone().into_iter().any(|t| t.kind().is_bucket()) {
        return Ok(());
    }
    let relies_on_chain = |spec: &TierSpec| spec.kind() == TierKind::Object && !has_own_keys(spec);
    match tiers.into_iter().position(relies_on_chain) {
        None => Ok(()),
        Some(position) => Err(BucketSpecError {
            position,
            key: "aws_access_key_id",
            problem: "is not in the tier, and the server's AWS_ACCESS_KEY_ID holds the per-launch key of this launch's S3 gateways (another tier has s3_bucket): LMCache would sign this tier's requests with it".into(),
            fix: "Give this tier \"aws_access_key_id\" and \"aws_secret_access_key\", or \"s3_bucket\" so that it goes through a gateway too (docs/s3-gateway.md, \"The per-launch key\").".into(),
        }),
    }
}

/// Checks that no two `s3_bucket` tiers of `tiers` (the cascade, in order)
/// share a place in one bucket: on the same `s3_endpoint` and `s3_bucket`,
/// one tier's `s3_key_prefix` may not start with another's (an empty
/// prefix starts every key). Such tiers would read each other's objects
/// as their own, and a bucket bound would count and evict the other
/// tier's (`docs/s3-gateway.md`, "The bucket bound").
///
/// # Errors
/// The later tier of the first such pair, named by its position, under
/// `s3_key_prefix`, with the earlier tier's position and prefix.
pub fn check_overlapping_prefixes(tiers: &[TierSpec]) -> Result<(), BucketSpecError> {
    let text = |spec: &TierSpec, key: &str| {
        spec.as_object()
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let places: Vec<(usize, String, String, String)> = tiers
        .iter()
        .enumerate()
        .filter(|(_, spec)| spec.kind().is_bucket())
        .map(|(i, spec)| {
            let place = (text(spec, "s3_endpoint"), text(spec, "s3_bucket"));
            (i, place.0, place.1, text(spec, "s3_key_prefix"))
        })
        .collect();
    for (later, b) in places.iter().enumerate() {
        for a in &places[..later] {
            let same_bucket = (&a.1, &a.2) == (&b.1, &b.2);
            if same_bucket && (a.3.starts_with(&b.3) || b.3.starts_with(&a.3)) {
                return Err(BucketSpecError {
                    position: b.0,
                    key: "s3_key_prefix",
                    problem: format!(
                        "{} overlaps the prefix {} of L2 tier {} in the same bucket {}: each tier would take the other's objects for its own, and a bucket bound would evict them",
                        shown_value(&b.3),
                        shown_value(&a.3),
                        a.0,
                        shown_value(&b.2)
                    ),
                    fix: "Give each tier of a bucket a prefix of its own that is not the start of another's, ending with /, such as \"node-a/\" and \"node-b/\".".into(),
                });
            }
        }
    }
    Ok(())
}

/// Checks that an `s3` spec without `s3_bucket` has none of the other
/// [`EXTENSION_KEYS`]: LMCache would ignore them, and a tier meant to live
/// under `s3_key_prefix` would write at the bucket's root. Errors name the
/// tier at `position` and the key.
pub fn orphan_keys(spec: &TierSpec, position: usize) -> Result<(), BucketSpecError> {
    if spec.kind() != TierKind::Object {
        return Ok(());
    }
    match EXTENSION_KEYS
        .iter()
        .find(|key| spec.as_object().contains_key(**key))
    {
        Some(key) => Err(BucketSpecError {
            position,
            key,
            problem: "is set without s3_bucket, and LMCache itself would ignore it".into(),
            fix: "Add \"s3_bucket\" (then the tier goes through the path-style gateway, docs/s3-gateway.md), or remove it.".into(),
        }),
        None => Ok(()),
    }
}

type StringKey<'a> = dyn Fn(&'static str) -> Result<Option<String>, BucketSpecError> + 'a;

/// The tier's static key pair: `aws_access_key_id` and
/// `aws_secret_access_key` (and `aws_session_token`) from the spec, else
/// `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` from `env`; `None` when
/// neither has one (the rest of the AWS default chain then applies). Errors
/// (key, problem) when the spec or the environment has only half a key
/// pair, or a key is not a string.
fn static_credentials(
    string: &StringKey<'_>,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Option<CredentialSource>, (&'static str, String)> {
    let id = string("aws_access_key_id").map_err(|e| (e.key, e.problem))?;
    let secret = string("aws_secret_access_key").map_err(|e| (e.key, e.problem))?;
    let token = string("aws_session_token").map_err(|e| (e.key, e.problem))?;
    match (id, secret) {
        (Some(id), Some(secret)) => Ok(Some(CredentialSource::Spec(KeyPair {
            access_key_id: id,
            secret_access_key: secret,
            session_token: token,
        }))),
        (Some(_), None) => Err((
            "aws_secret_access_key",
            "is missing while aws_access_key_id is set".into(),
        )),
        (None, Some(_)) => Err((
            "aws_access_key_id",
            "is missing while aws_secret_access_key is set".into(),
        )),
        (None, None) => match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(id), Some(secret)) if !id.is_empty() && !secret.is_empty() => {
                Ok(Some(CredentialSource::Environment(KeyPair {
                    access_key_id: id,
                    secret_access_key: secret,
                    session_token: env("AWS_SESSION_TOKEN").filter(|t| !t.is_empty()),
                })))
            }
            (Some(id), _) if !id.is_empty() => Err((
                "aws_access_key_id",
                "is not in the tier, and AWS_ACCESS_KEY_ID is set in the environment without AWS_SECRET_ACCESS_KEY".into(),
            )),
            (_, Some(secret)) if !secret.is_empty() => Err((
                "aws_access_key_id",
                "is not in the tier, and AWS_SECRET_ACCESS_KEY is set in the environment without AWS_ACCESS_KEY_ID".into(),
            )),
            _ => Ok(None),
        },
    }
}

fn check_bucket_name(name: &str) -> Result<(), &'static str> {
    if !(3..=63).contains(&name.len()) {
        return Err("is not 3-63 characters long");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    {
        return Err("has characters other than a-z, 0-9, '.' and '-'");
    }
    let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !edge(name.bytes().next()) || !edge(name.bytes().last()) {
        return Err("does not start and end with a letter or digit");
    }
    if name.contains("..") {
        return Err("has two adjacent periods");
    }
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return Err("is formatted as an IP address");
    }
    Ok(())
}

fn check_endpoint(endpoint: &str) -> Result<(), &'static str> {
    if endpoint.is_empty() {
        return Err("is missing or empty");
    }
    if endpoint.contains("://") {
        return Err("has a scheme");
    }
    if endpoint.contains(['/', '?', '#', '@']) || endpoint.contains(char::is_whitespace) {
        return Err("is not a plain host[:port] (it has a path, query, user or spaces)");
    }
    let uri: http::uri::Authority = endpoint.parse().map_err(|_| "is not a valid host[:port]")?;
    if uri.host().is_empty() {
        return Err("has no host");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::credentials::test_support::{profile_env, resolve};
    use lmcache_tier_spec::Cascade;

    const CHAIN_NO_KEYS: &str = r#"{"type":"s3","s3_endpoint":"h:9000","s3_bucket":"bkt","s3_region":"eu-west-3","disable_tls":true}"#;
    const SPEC_KEYS: &str = r#"{"type":"s3","s3_endpoint":"h:9000","s3_bucket":"bkt","s3_region":"eu-west-3","disable_tls":true,"aws_access_key_id":"AKSPEC","aws_secret_access_key":"SPECSECRET"}"#;

    /// The credential source the gateway gives the tier `json` under `env`.
    fn source(json: &str, env: &HashMap<String, String>) -> CredentialSource {
        BucketTier::from_spec(&tier(json), 0, &|k| env.get(k).cloned())
            .unwrap()
            .unwrap()
            .credentials
    }

    #[tokio::test(flavor = "current_thread")]
    async fn spec_keys_beat_the_environment_which_beats_the_profile() {
        let dir = tempfile::tempdir().unwrap();
        let mut env = profile_env(dir.path());
        env.insert("AWS_ACCESS_KEY_ID".into(), "AKENV".into());
        env.insert("AWS_SECRET_ACCESS_KEY".into(), "ENVSECRET".into());

        let spec = source(SPEC_KEYS, &env);
        assert!(matches!(spec, CredentialSource::Spec(_)), "{spec:?}");
        assert!(!format!("{spec:?}").contains("SPECSECRET"));
        let (id, from) = resolve(&spec).await.unwrap();
        assert_eq!(
            (id.as_str(), from.as_str()),
            ("AKSPEC", "the tier's aws_access_key_id")
        );

        let environment = source(CHAIN_NO_KEYS, &env);
        assert!(!format!("{environment:?}").contains("ENVSECRET"));
        let (id, from) = resolve(&environment).await.unwrap();
        assert_eq!((id.as_str(), from.as_str()), ("AKENV", "AWS_ACCESS_KEY_ID"));

        env.remove("AWS_ACCESS_KEY_ID");
        env.remove("AWS_SECRET_ACCESS_KEY");
        let chain = source(CHAIN_NO_KEYS, &env);
        let (id, from) = resolve(&chain).await.unwrap();
        // The credentials file wins over the config file for one profile.
        assert_eq!(id, "AKPROFILE");
        assert!(from.starts_with("profile \"tier\" in "), "{from}");
    }

    fn tier(json: &str) -> TierSpec {
        Cascade::parse(json, "V").unwrap().tiers()[0].clone()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    const GOOD: &str = r#"{"type":"s3","s3_endpoint":"swift.example.net","s3_bucket":"kv-cache","s3_key_prefix":"node/","s3_region":"r1","s3_num_io_threads":8,"aws_access_key_id":"AKREAL","aws_secret_access_key":"REALSECRET","max_capacity_gb":2000}"#;

    #[test]
    fn tiers_of_one_bucket_whose_prefixes_overlap_are_refused() {
        let tier = |bucket: &str, prefix: Option<&str>| {
            let mut json = serde_json::json!({"type": "s3", "s3_endpoint": "s3.example:9000",
                "s3_bucket": bucket, "s3_region": "r"});
            if let Some(prefix) = prefix {
                json["s3_key_prefix"] = prefix.into();
            }
            crate::TierSpec::from_object(json.as_object().unwrap().clone(), "t", 0).unwrap()
        };
        for (a, b) in [
            (Some("p/"), Some("p/")),
            (Some("p/"), Some("p/q/")),
            (Some("a/b/"), Some("a/")),
            (None, Some("p/")),
            (Some("p/"), None),
            (Some("p"), Some("p2/")),
        ] {
            let tiers = [tier("kv", a), tier("kv", b)];
            let e = check_overlapping_prefixes(&tiers).unwrap_err();
            assert_eq!((e.position, e.key), (1, "s3_key_prefix"), "{a:?} {b:?}");
            assert!(e.problem.contains("L2 tier 0"), "{e}");
        }
        for (a, b) in [(Some("a/"), Some("b/")), (Some("p/"), Some("q/p/"))] {
            assert!(check_overlapping_prefixes(&[tier("kv", a), tier("kv", b)]).is_ok());
        }
        assert!(check_overlapping_prefixes(&[tier("kv", None), tier("other", None)]).is_ok());
    }

    #[test]
    fn our_keys_without_s3_bucket_are_refused_naming_the_key() {
        for key in ["s3_key_prefix", "s3_ca_bundle"] {
            let spec = tier(&format!(
                r#"{{"type":"s3","s3_endpoint":"b.example.net","s3_region":"r","{key}":"x/"}}"#
            ));
            let e = BucketTier::from_spec(&spec, 1, &no_env).unwrap_err();
            assert_eq!(e.key, key);
            assert!(e.to_string().contains("without s3_bucket"), "{e}");
        }
    }

    #[test]
    fn beside_a_gateway_tier_every_other_s3_tier_needs_keys_of_its_own() {
        let gateway = tier(r#"{"type":"s3","s3_bucket":"kvc","s3_endpoint":"h","s3_region":"r"}"#);
        let keyed = tier(
            r#"{"type":"s3","s3_endpoint":"b.h","aws_access_key_id":"A","aws_secret_access_key":"S"}"#,
        );
        let chained = tier(r#"{"type":"s3","s3_endpoint":"b.h","aws_access_key_id":"A"}"#);
        let fs = tier(r#"{"type":"fs","base_path":"/x"}"#);
        assert_eq!(check_default_chain([&fs, &gateway, &keyed]), Ok(()));
        assert_eq!(check_default_chain([&chained, &fs]), Ok(()), "no gateway");
        let e = check_default_chain([&gateway, &fs, &chained]).unwrap_err();
        assert_eq!((e.position, e.key), (2, "aws_access_key_id"));
        assert!(e.to_string().contains("per-launch key"), "{e}");
    }

    #[test]
    fn a_spec_without_s3_bucket_passes_through() {
        let plain = tier(r#"{"type":"s3","s3_endpoint":"b.example.net","s3_region":"r"}"#);
        assert!(BucketTier::from_spec(&plain, 0, &no_env).unwrap().is_none());
        let fs = tier(r#"{"type":"fs","s3_bucket":"x"}"#);
        assert!(BucketTier::from_spec(&fs, 0, &no_env).unwrap().is_none());
    }

    #[test]
    fn the_rewritten_spec_keeps_other_keys_in_order_and_drops_ours_and_the_real_keys() {
        let spec = tier(GOOD);
        let t = BucketTier::from_spec(&spec, 1, &no_env).unwrap().unwrap();
        assert_eq!(
            (t.scheme, t.bucket.as_str(), t.key_prefix.as_str()),
            ("https", "kv-cache", "node/")
        );
        assert!(
            matches!(&t.credentials, CredentialSource::Spec(k) if k.secret_access_key == "REALSECRET"),
            "{:?}",
            t.credentials
        );
        let out = BucketTier::rewrite(&spec, "127.0.0.1:4000".parse().unwrap()).to_arg();
        assert!(
            !out.contains("REALSECRET") && !out.contains("AKREAL"),
            "{out}"
        );
        assert!(
            !out.contains("s3_bucket") && !out.contains("node/"),
            "{out}"
        );
        assert_eq!(
            out,
            r#"{"type":"s3","s3_endpoint":"127.0.0.1:4000","s3_region":"r1","s3_num_io_threads":8,"max_capacity_gb":2000,"disable_tls":true,"s3_prefer_http2":false}"#
        );
    }

    #[test]
    fn without_keys_in_the_spec_the_environment_then_the_default_chain_is_used() {
        let spec = tier(
            r#"{"type":"s3","s3_endpoint":"h:9000","s3_bucket":"bkt","s3_region":"r","disable_tls":true}"#,
        );
        let env = |k: &str| match k {
            "AWS_ACCESS_KEY_ID" => Some("AKENV".to_string()),
            "AWS_SECRET_ACCESS_KEY" => Some("ENVSECRET".to_string()),
            _ => None,
        };
        let t = BucketTier::from_spec(&spec, 0, &env).unwrap().unwrap();
        assert!(
            matches!(&t.credentials, CredentialSource::Environment(k) if k.access_key_id == "AKENV"),
            "{:?}",
            t.credentials
        );
        assert_eq!(t.scheme, "http");
        let t = BucketTier::from_spec(&spec, 0, &no_env).unwrap().unwrap();
        assert!(
            matches!(&t.credentials, CredentialSource::Chain(c) if c.sts_region == "r"),
            "{:?}",
            t.credentials
        );
        let half = |k: &str| (k == "AWS_ACCESS_KEY_ID").then(|| "AKENV".to_string());
        let e = BucketTier::from_spec(&spec, 3, &half).unwrap_err();
        assert_eq!(e.key, "aws_access_key_id");
        assert!(e.problem.contains("without AWS_SECRET_ACCESS_KEY"), "{e}");
        let other_half = |k: &str| (k == "AWS_SECRET_ACCESS_KEY").then(|| "ENVSECRET".to_string());
        let e = BucketTier::from_spec(&spec, 0, &other_half).unwrap_err();
        assert_eq!(e.key, "aws_access_key_id");
        assert!(
            e.problem.contains(
                "AWS_SECRET_ACCESS_KEY is set in the environment without AWS_ACCESS_KEY_ID"
            ),
            "{e}"
        );
        assert!(!e.to_string().contains("ENVSECRET"), "{e}");
    }

    #[test]
    fn a_refused_endpoint_is_quoted_without_its_secrets() {
        for endpoint in [
            "https://AKID:EPSECRETPW@127.0.0.1:9000",
            "AKID:EPSECRETPW@127.0.0.1:9000",
            "h:9000/?X-Amz-Security-Token=EPSECRETPW",
        ] {
            let json = format!(
                r#"{{"type":"s3","s3_bucket":"kvc","s3_region":"r","s3_endpoint":{endpoint:?}}}"#
            );
            let e = BucketTier::from_spec(&tier(&json), 0, &no_env).unwrap_err();
            assert_eq!(e.key, "s3_endpoint");
            assert!(!e.to_string().contains("EPSECRETPW"), "{e}");
        }
    }

    #[test]
    fn bad_input_names_the_tier_and_the_key() {
        let cases = [
            (
                r#""s3_bucket":"Kv_Cache","s3_region":"r","s3_endpoint":"h""#,
                "s3_bucket",
            ),
            (
                r#""s3_bucket":"ab","s3_region":"r","s3_endpoint":"h""#,
                "s3_bucket",
            ),
            (r#""s3_bucket":"kv","s3_endpoint":"h""#, "s3_bucket"),
            (r#""s3_bucket":"kvc","s3_endpoint":"h""#, "s3_region"),
            (
                r#""s3_bucket":"kvc","s3_region":"r","s3_endpoint":"https://h""#,
                "s3_endpoint",
            ),
            (
                r#""s3_bucket":"kvc","s3_region":"r","s3_endpoint":"h/base""#,
                "s3_endpoint",
            ),
            (r#""s3_bucket":"kvc","s3_region":"r""#, "s3_endpoint"),
            (
                r#""s3_bucket":"kvc","s3_region":"r","s3_endpoint":"h","s3_key_prefix":"/a""#,
                "s3_key_prefix",
            ),
            (
                r#""s3_bucket":"kvc","s3_region":"r","s3_endpoint":"h","s3_ca_bundle":"/nonexistent/ca.pem""#,
                "s3_ca_bundle",
            ),
            (
                r#""s3_bucket":"kvc","s3_region":"r","s3_endpoint":"h","aws_access_key_id":"A""#,
                "aws_secret_access_key",
            ),
        ];
        for (keys, key) in cases {
            let spec = if key == "aws_secret_access_key" {
                tier(&format!(r#"{{"type":"s3",{keys}}}"#))
            } else {
                tier(&format!(
                    r#"{{"type":"s3",{keys},"aws_access_key_id":"A","aws_secret_access_key":"S"}}"#
                ))
            };
            let e = BucketTier::from_spec(&spec, 2, &no_env).unwrap_err();
            assert_eq!(e.key, key, "{keys}: {e}");
            let text = e.to_string();
            assert!(
                text.starts_with(&format!("L2 tier 2 (s3): {key}:")),
                "{text}"
            );
            assert!(!text.contains("\"S\""), "a secret in {text}");
        }
    }

    #[test]
    fn a_file_without_certificates_is_not_a_ca_bundle() {
        let dir = std::env::temp_dir().join(format!("ca-test-{}", std::process::id()));
        std::fs::write(&dir, "not a certificate\n").unwrap();
        let spec = tier(&format!(
            r#"{{"type":"s3","s3_bucket":"kvc","s3_region":"r","s3_endpoint":"h","s3_ca_bundle":{:?},"aws_access_key_id":"A","aws_secret_access_key":"S"}}"#,
            dir.display().to_string()
        ));
        let e = BucketTier::from_spec(&spec, 0, &no_env).unwrap_err();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(e.key, "s3_ca_bundle");
        assert!(e.problem.contains("no PEM certificate"), "{e}");
    }
}
