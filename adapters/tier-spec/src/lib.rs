//! The LMCache L2 adapter spec model.
//!
//! A [`TierSpec`] is one `--l2-adapter` JSON object, kept as the operator
//! wrote it: keys in their order, unknown keys verbatim (LMCache ignores keys it
//! does not know, and later LMCache versions add keys we must pass through). A
//! [`Cascade`] is the ordered list of tiers: LMCache stores every chunk to
//! every tier and loads from the first tier, by position, that holds it
//! (LMCache's L2 cascade; `docs/configuration.md`).
//!
//! This crate is the model only: it reads and writes JSON and does no I/O.
//! The keys our extensions add are checked where they are acted on:
//! `max_capacity_gb` on `fs` tiers by the capacity guard
//! (`lmcache-capacity-guard`), `s3_bucket` on `s3` tiers by the S3 gateway
//! (`lmcache-s3-gateway`).

pub mod adapter;
pub mod capacity;
pub mod kind;
pub mod repeated;

use serde_json::{Map, Value};
use std::path::Path;

use capacity::GIB;
pub use kind::TierKind;

/// Parts of key names whose values are secrets: never logged, never printed
/// by `inspect` or `--dry-run` (`aws_access_key_id`, `aws_secret_access_key`,
/// `aws_session_token`, `password`, `token`, ...), at any depth.
const SECRET_KEY_PARTS: &[&str] = &[
    "secret",
    "password",
    "passwd",
    "token",
    "access_key",
    "credential",
    "private_key",
];

fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_KEY_PARTS.iter().any(|part| key.contains(part))
}

/// `value` with secrets replaced by `"<redacted>"`: values of secret keys
/// (see [`SECRET_KEY_PARTS`]), and the `user:password@` and query string of
/// every URL-like string (`...://...`, or any value of a key naming an
/// endpoint or URL), at any depth.
fn redact_value(value: &Value) -> Value {
    match value {
        Value::Object(object) => Value::Object(
            object
                .iter()
                .map(|(k, v)| {
                    let v = if is_secret_key(k) {
                        Value::String("<redacted>".into())
                    } else {
                        match v {
                            Value::String(text)
                                if text.contains("://")
                                    || k.contains("endpoint")
                                    || k.contains("url") =>
                            {
                                Value::String(redact_endpoint(text))
                            }
                            other => redact_value(other),
                        }
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact_value).collect()),
        Value::String(text) if text.contains("://") => Value::String(redact_endpoint(text)),
        other => other.clone(),
    }
}

/// An error and its causes as one line, `error: cause: cause`, innermost
/// last. reqwest's and aws-config's own messages name only the operation
/// ("error sending request for url ..."); the cause says what happened
/// ("connection refused", "timed out").
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The most characters of an input value an error message quotes
/// ([`shown_value`]).
pub const SHOWN_VALUE_CHARS: usize = 80;

/// An input value as an error message quotes it: in double quotes, its
/// control characters escaped (`\n`, `\t`, `\u{1b}`: a value never splits or
/// colours a log line), and past [`SHOWN_VALUE_CHARS`] characters cut, with
/// `…` and its whole length in bytes after it (`"{\"a\":…" (102400
/// bytes)`), so that a long value never fills a log line. Every error that
/// quotes an operator's value quotes it so (`docs/operations.md`, "Log
/// lines").
pub fn shown_value(value: &str) -> String {
    let head: String = value.chars().take(SHOWN_VALUE_CHARS).collect();
    let quoted = format!("{head:?}");
    match head.len() < value.len() {
        true => format!("{}…\" ({} bytes)", &quoted[..quoted.len() - 1], value.len()),
        false => quoted,
    }
}

/// A path as an error message shows it: as written when it is short and
/// holds no control character, double quote or backslash, else as
/// [`shown_value`] quotes it.
pub fn shown_path(path: &str) -> String {
    let plain = path.chars().count() <= SHOWN_VALUE_CHARS
        && !path
            .chars()
            .any(|c| c.is_control() || c == '"' || c == '\\');
    match plain {
        true => path.to_string(),
        false => shown_value(path),
    }
}

/// An endpoint or URL without its `user:password@` or query string (both
/// may carry credentials, e.g. a presigned `X-Amz-Signature`), each replaced
/// by `<redacted>`.
pub fn redact_endpoint(endpoint: &str) -> String {
    let without_query = endpoint.split(['?', '#']).next().unwrap_or_default();
    let (scheme, rest) = match without_query.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), without_query),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("<redacted>@{host}"),
        None => authority.to_string(),
    };
    let query = if without_query.len() < endpoint.len() {
        "?<redacted>"
    } else {
        ""
    };
    format!("{scheme}{authority}{path}{query}")
}

/// What is wrong with an adapter spec or cascade.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// The text is not JSON; the message carries serde_json's line and column.
    #[error("{source_name} is not valid JSON: {detail}. Write one JSON object (one tier) or an array of objects (a cascade), on one line without surrounding quotes")]
    InvalidJson {
        /// Where the text came from, e.g. `EREBINE_AGENT_LMCACHE_L2_ADAPTER`.
        source_name: String,
        /// The parser's message with its line and column.
        detail: String,
    },
    /// JSON of the wrong shape (not an object or array of objects).
    #[error("{source_name}: {detail}")]
    Shape {
        /// Where the text came from.
        source_name: String,
        /// What is wrong and where (tier position).
        detail: String,
    },
    /// A tier that writes a key twice: JSON parsers keep the last one
    /// without a word, so the tier would not be the one written.
    #[error("{source_name}: L2 tier {position}: {detail}: write each key once (a JSON parser, LMCache's too, would keep only the last one)")]
    RepeatedKey {
        /// Where the text came from.
        source_name: String,
        /// The tier's position in the cascade (0-based).
        position: usize,
        /// The key and where it is written again (line and column).
        detail: String,
    },
    /// An `--l2-adapter` value that is not one JSON object with a `type`.
    #[error("--l2-adapter #{number} (L2 tier {position}) {detail}: give each --l2-adapter one JSON object with a \"type\" string (one tier), e.g. {{\"type\":\"fs\",\"base_path\":\"/data/kv\",\"max_capacity_gb\":100}}; NaN, Infinity and numbers out of range such as 1e400 are not JSON")]
    L2AdapterValue {
        /// Position of the flag among the `--l2-adapter` flags (0-based),
        /// the tier's position in the cascade.
        position: usize,
        /// `position` + 1, as LMCache numbers the flags.
        number: usize,
        /// What is wrong, e.g. `is not valid JSON (expected value at line 1 column 9)`.
        detail: String,
    },
}

impl SpecError {
    /// The [`SpecError::RepeatedKey`] of `text`, a tier spec or cascade
    /// from `source_name`, when one of its objects writes a key twice
    /// ([`repeated::repeated_key`]); `position` is the tier's when `text`
    /// is one tier, else the array element's.
    pub fn repeated_key(text: &str, source_name: &str, position: usize) -> Option<Self> {
        let found = repeated::repeated_key(text)?;
        Some(SpecError::RepeatedKey {
            source_name: source_name.to_string(),
            position: found.element.unwrap_or(position),
            detail: found.detail,
        })
    }
}

/// One L2 adapter spec: a JSON object with at least a `type` key.
#[derive(Debug, Clone, PartialEq)]
pub struct TierSpec(Map<String, Value>);

impl TierSpec {
    /// Wraps a JSON object as a spec. Errors when `type` is missing or not a
    /// string; `position` (0-based) and `source_name` name the tier in the error.
    pub fn from_object(
        object: Map<String, Value>,
        source_name: &str,
        position: usize,
    ) -> Result<Self, SpecError> {
        match object.get("type") {
            Some(Value::String(_)) => Ok(TierSpec(object)),
            _ => Err(SpecError::Shape {
                source_name: source_name.to_string(),
                detail: format!(
                    "tier {position} has no \"type\" string (e.g. \"fs_native\", \"fs\", \"s3\")"
                ),
            }),
        }
    }

    /// This spec without the keys in `drop` (never `type`), then with each
    /// of `set` inserted: a key already present keeps its place and takes
    /// the new value, a new key goes last.
    pub fn rewritten(
        &self,
        drop: &[&str],
        set: impl IntoIterator<Item = (&'static str, Value)>,
    ) -> TierSpec {
        let mut object: Map<String, Value> = self
            .0
            .iter()
            .filter(|(k, _)| k.as_str() == "type" || !drop.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (key, value) in set {
            object.insert(key.to_string(), value);
        }
        TierSpec(object)
    }

    /// The adapter type, e.g. `"fs_native"`.
    pub fn adapter_type(&self) -> &str {
        self.0.get("type").and_then(Value::as_str).unwrap_or("")
    }

    /// What this tier is: a disk tier, a bucket through our gateway,
    /// LMCache's own S3 client, or a kind passed through ([`TierKind`]).
    pub fn kind(&self) -> TierKind<'_> {
        TierKind::of(self.adapter_type(), self.0.contains_key("s3_bucket"))
    }

    /// Whether this is one of LMCache 0.5.6's disk tiers: `fs` (its file
    /// L2 adapter) or `fs_native` (its native one), each with a
    /// `base_path` on a local volume.
    pub fn is_disk_tier(&self) -> bool {
        self.kind().is_disk()
    }

    /// The `base_path` of a filesystem tier, if any.
    pub fn base_path(&self) -> Option<&str> {
        self.0.get("base_path").and_then(Value::as_str)
    }

    /// The device of a `raw_block` tier (its `device_path`: a block
    /// device, a pre-sized file, or with `use_uring_cmd` an NVMe generic
    /// character device); `None` for every other kind, and when the key is
    /// missing, empty or not a string (LMCache refuses such a tier at start).
    pub fn device_path(&self) -> Option<&str> {
        match self.kind() {
            TierKind::RawBlock => self
                .0
                .get("device_path")
                .and_then(Value::as_str)
                .filter(|p| !p.is_empty()),
            _ => None,
        }
    }

    /// Whether LMCache 0.5.6 evicts this tier itself, and so lists it in
    /// `/status`'s `l2_eviction_controller`: the spec has an `eviction`
    /// block, and its policy is `IsolatedLRU` or the adapter has a capacity
    /// (`max_capacity_gb` above 0; the `fs` adapter never reports one; a
    /// `raw_block` tier always has one, its device's slots, whatever its
    /// `max_capacity_gb`). Source: `StorageManager._should_enable_l2_eviction`
    /// and `RawBlockL2Adapter.__init__` in LMCache 0.5.6.
    pub fn lmcache_evicts(&self) -> bool {
        let Some(eviction) = self.0.get(capacity::EVICTION) else {
            return false;
        };
        let isolated =
            eviction.get("eviction_policy").and_then(Value::as_str) == Some("IsolatedLRU");
        let capacity = self.max_capacity_bytes().is_some();
        let kind = self.kind();
        isolated
            || kind == TierKind::RawBlock
            || (capacity && kind != TierKind::Disk { native: false })
    }

    /// The spec's JSON object, keys in the operator's order.
    pub fn as_object(&self) -> &Map<String, Value> {
        &self.0
    }

    /// The compact JSON text passed as one `--l2-adapter` argument.
    pub fn to_arg(&self) -> String {
        Value::Object(self.0.clone()).to_string()
    }

    /// The spec with every secret value replaced by `"<redacted>"`: what logs
    /// and `inspect` may print.
    pub fn redacted(&self) -> Value {
        redact_value(&Value::Object(self.0.clone()))
    }
}

/// The ordered L2 tiers of one server; empty means L1-only.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Cascade(pub Vec<TierSpec>);

impl Cascade {
    /// Parses an operator's adapter JSON: an object is one tier, an array is a
    /// cascade in array order, `[]` is no L2 tier.
    ///
    /// `source_name` names the variable or flag in errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, SpecError> {
        let value: Value =
            serde_json::from_str(text.trim()).map_err(|e| SpecError::InvalidJson {
                source_name: source_name.to_string(),
                detail: e.to_string(),
            })?;
        if let Some(repeated) = SpecError::repeated_key(text.trim(), source_name, 0) {
            return Err(repeated);
        }
        let shape = |detail: String| SpecError::Shape {
            source_name: source_name.to_string(),
            detail,
        };
        match value {
            Value::Object(object) => Ok(Cascade(vec![TierSpec::from_object(
                object,
                source_name,
                0,
            )?])),
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::Object(object) => TierSpec::from_object(object, source_name, i),
                    other => Err(shape(format!(
                        "tier {i} is {}, not a JSON object",
                        json_kind(&other)
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Cascade),
            other => Err(shape(format!(
                "expected a JSON object or array, found {}",
                json_kind(&other)
            ))),
        }
    }

    /// The tiers, in cascade order.
    pub fn tiers(&self) -> &[TierSpec] {
        &self.0
    }

    /// The cascade with secrets redacted, as one JSON array.
    pub fn redacted(&self) -> Value {
        Value::Array(self.0.iter().map(TierSpec::redacted).collect())
    }
}

/// The flag that adds one L2 tier (LMCache's argparse `append`).
const L2_ADAPTER_FLAG: &str = "--l2-adapter";

/// One `--l2-adapter` value among the arguments of an `lmcache` command.
#[derive(Debug, Clone, PartialEq)]
pub struct L2AdapterArg {
    /// Index, in the arguments, of the argument that holds the JSON.
    pub index: usize,
    /// Written `--l2-adapter=JSON` (the JSON shares its argument with the
    /// flag) rather than `--l2-adapter JSON`.
    pub inline: bool,
    /// The spec, or why the value is not one JSON object with a `type`
    /// ([`SpecError::L2AdapterValue`]).
    pub spec: Result<TierSpec, SpecError>,
}

/// The `--l2-adapter` values of one command line, parsed once, in the order
/// of the flags (the cascade order); the launcher's guards and gateways both
/// decide from it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct L2AdapterArgs(pub Vec<L2AdapterArg>);

impl L2AdapterArgs {
    /// Finds every `--l2-adapter JSON` and `--l2-adapter=JSON` in `args`. A
    /// trailing `--l2-adapter` without a value is ignored.
    pub fn parse(args: &[String]) -> Self {
        let mut found = Vec::new();
        let mut index = 0;
        while index < args.len() {
            let arg = &args[index];
            let (value_index, value, inline) = if arg == L2_ADAPTER_FLAG {
                index += 1;
                match args.get(index) {
                    Some(value) => (index, value.as_str(), false),
                    None => break,
                }
            } else if let Some(json) = arg.strip_prefix("--l2-adapter=") {
                (index, json, true)
            } else {
                index += 1;
                continue;
            };
            let position = found.len();
            let invalid = |detail: String| SpecError::L2AdapterValue {
                position,
                number: position + 1,
                detail,
            };
            let spec = match serde_json::from_str::<Value>(value) {
                Ok(Value::Object(object)) => {
                    let source = format!("{L2_ADAPTER_FLAG} #{}", position + 1);
                    match SpecError::repeated_key(value, &source, position) {
                        Some(repeated) => Err(repeated),
                        None => TierSpec::from_object(object, L2_ADAPTER_FLAG, position)
                            .map_err(|_| invalid("has no \"type\" string".into())),
                    }
                }
                Ok(other) => Err(invalid(format!(
                    "is {}, not a JSON object",
                    json_kind(&other)
                ))),
                Err(e) => Err(invalid(format!("is not valid JSON ({e})"))),
            };
            found.push(L2AdapterArg {
                index: value_index,
                inline,
                spec,
            });
            index += 1;
        }
        L2AdapterArgs(found)
    }

    /// `args` (the arguments these values were parsed from) with the usable
    /// specs replaced, in order, by the tiers of `tiers` (one per usable
    /// spec, as [`L2AdapterArgs::cascade`] gave them, e.g. rewritten),
    /// each written as it was (`--l2-adapter=` kept for an inline value).
    /// A value without a tier in `tiers` is kept as it was.
    pub fn render(&self, args: &[String], tiers: &Cascade) -> Vec<String> {
        let mut out = args.to_vec();
        let usable = self.0.iter().filter(|a| a.spec.is_ok());
        for (arg, tier) in usable.zip(tiers.tiers()) {
            let flag = if arg.inline { "--l2-adapter=" } else { "" };
            if let Some(slot) = out.get_mut(arg.index) {
                *slot = format!("{flag}{}", tier.to_arg());
            }
        }
        out
    }

    /// The usable specs as a cascade, in order.
    pub fn cascade(&self) -> Cascade {
        Cascade(self.0.iter().filter_map(|a| a.spec.clone().ok()).collect())
    }

    /// Checks that every value is one JSON object with a `type`: a value
    /// serde_json cannot read (`NaN`, `Infinity`, `1e400`, which Python's
    /// `json.loads` accepts) would otherwise reach LMCache without the
    /// capacity guard or gateway its spec asks for.
    ///
    /// # Errors
    /// The first value that is not, as [`SpecError::L2AdapterValue`].
    pub fn check(&self) -> Result<(), SpecError> {
        self.0
            .iter()
            .try_for_each(|a| a.spec.as_ref().map(|_| ()).map_err(Clone::clone))
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The node's built-in disk tier: LMCache's native filesystem adapter with
/// LRU eviction at an 80% watermark reclaiming 20% per cycle
/// (`docs/sizing.md`, `docs/configuration.md`).
///
/// `capacity_bytes` becomes `max_capacity_gb` in GiB.
pub fn fs_native_tier(
    base_path: &Path,
    num_workers: u32,
    use_odirect: bool,
    capacity_bytes: u64,
) -> TierSpec {
    let mut object = Map::new();
    object.insert("type".into(), "fs_native".into());
    object.insert(
        "base_path".into(),
        base_path.to_string_lossy().into_owned().into(),
    );
    object.insert("num_workers".into(), num_workers.into());
    object.insert("use_odirect".into(), use_odirect.into());
    object.insert(
        capacity::MAX_CAPACITY_GB.into(),
        Value::from(capacity_bytes as f64 / GIB),
    );
    object.insert(
        "eviction".into(),
        serde_json::json!({"eviction_policy": "LRU", "trigger_watermark": 0.8, "eviction_ratio": 0.2}),
    );
    TierSpec(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lmcache_evicts_a_tier_with_an_eviction_block_and_a_capacity() {
        let evicts = |json: &str| Cascade::parse(json, "V").unwrap().tiers()[0].lmcache_evicts();
        let policy = r#""eviction":{"eviction_policy":"LRU"}"#;
        assert!(evicts(&format!(
            r#"{{"type":"fs_native","base_path":"/c","max_capacity_gb":2,{policy}}}"#
        )));
        assert!(evicts(&format!(
            r#"{{"type":"s3","max_capacity_gb":5,{policy}}}"#
        )));
        assert!(!evicts(
            r#"{"type":"fs_native","base_path":"/c","max_capacity_gb":2}"#
        ));
        assert!(!evicts(&format!(
            r#"{{"type":"fs","base_path":"/c","max_capacity_gb":2,{policy}}}"#
        )));
        assert!(!evicts(&format!(
            r#"{{"type":"fs_native","base_path":"/c",{policy}}}"#
        )));
        assert!(evicts(
            r#"{"type":"fs_native","base_path":"/c","eviction":{"eviction_policy":"IsolatedLRU"}}"#
        ));
        // A raw_block tier's capacity is its device's, with or without a
        // max_capacity_gb; without a block it is not evicted.
        assert!(evicts(&format!(
            r#"{{"type":"raw_block","device_path":"/dev/x",{policy}}}"#
        )));
        assert!(!evicts(
            r#"{"type":"raw_block","device_path":"/dev/x","max_capacity_gb":2}"#
        ));
    }

    #[test]
    fn only_fs_and_fs_native_are_disk_tiers() {
        let disk = |kind: &str| {
            let json = format!(r#"{{"type":"{kind}","base_path":"/c"}}"#);
            Cascade::parse(&json, "V").unwrap().tiers()[0].is_disk_tier()
        };
        assert!(disk("fs") && disk("fs_native"));
        assert!(!disk("s3") && !disk("mooncake_store") && !disk("FS") && !disk(""));
    }

    #[test]
    fn finds_every_l2_adapter_value_in_order_with_its_index() {
        let args: Vec<String> = [
            "--l1-size-gb",
            "1",
            "--l2-adapter",
            r#"{"type":"fs_native","base_path":"/a"}"#,
            "--l2-adapter=not json",
            r#"--l2-adapter={"type":"fs","base_path":"/b","max_capacity_gb":2}"#,
            "--l2-adapter",
        ]
        .map(String::from)
        .to_vec();
        let found = L2AdapterArgs::parse(&args);
        let seen: Vec<_> = found
            .0
            .iter()
            .map(|a| {
                (
                    a.index,
                    a.inline,
                    a.spec.as_ref().ok().and_then(|s| s.base_path()),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (3, false, Some("/a")),
                (4, true, None),
                (5, true, Some("/b"))
            ]
        );
        let cascade = found.cascade();
        let paths: Vec<_> = cascade.tiers().iter().map(|t| t.base_path()).collect();
        assert_eq!(paths, [Some("/a"), Some("/b")]);
    }

    #[test]
    fn a_value_that_is_not_one_json_object_with_a_type_is_an_error() {
        for (value, detail) in [
            (
                r#"{"type":"fs","base_path":"/tmp/x","max_capacity_gb":NaN}"#,
                "is not valid JSON (expected value at line 1 column 53)",
            ),
            (
                r#"{"type":"fs","max_capacity_gb":Infinity}"#,
                "is not valid JSON",
            ),
            (
                r#"{"type":"fs","max_capacity_gb":-Infinity}"#,
                "is not valid JSON",
            ),
            (
                r#"{"type":"fs","max_capacity_gb":1e400}"#,
                "number out of range",
            ),
            (r#"[{"type":"fs"}]"#, "is an array, not a JSON object"),
            (r#"{"base_path":"/x"}"#, "has no \"type\" string"),
        ] {
            let args = [
                "--l2-adapter".to_string(),
                r#"{"type":"s3"}"#.to_string(),
                format!("--l2-adapter={value}"),
            ];
            let found = L2AdapterArgs::parse(&args);
            let e = found.check().unwrap_err().to_string();
            assert!(e.starts_with("--l2-adapter #2 (L2 tier 1) "), "{e}");
            assert!(e.contains(detail), "{e}");
            assert_eq!(found.cascade().tiers().len(), 1);
        }
        let fine = ["--l2-adapter", r#"{"type":"fs","max_capacity_gb":1e300}"#].map(String::from);
        assert_eq!(L2AdapterArgs::parse(&fine).check(), Ok(()));
    }

    #[test]
    fn render_puts_each_tier_back_where_its_value_was_written() {
        let args = [
            "bench",
            "l2",
            "--l2-adapter",
            r#"{"type":"s3","s3_bucket":"b"}"#,
            "--l2-adapter=NaN",
            "--num-keys",
            "4",
            r#"--l2-adapter={"type":"fs","base_path":"/a"}"#,
        ]
        .map(String::from);
        let found = L2AdapterArgs::parse(&args);
        let mut tiers = found.cascade();
        tiers.0[0] = TierSpec::from_object(
            serde_json::json!({"type": "s3", "s3_endpoint": "127.0.0.1:9"})
                .as_object()
                .cloned()
                .unwrap(),
            "test",
            0,
        )
        .unwrap();
        let out = found.render(&args, &tiers);
        assert_eq!(out[3], r#"{"type":"s3","s3_endpoint":"127.0.0.1:9"}"#);
        assert_eq!(
            out[4], "--l2-adapter=NaN",
            "an unusable value stays as written"
        );
        assert_eq!(out[7], r#"--l2-adapter={"type":"fs","base_path":"/a"}"#);
        assert_eq!(out[..3], args[..3]);
        assert_eq!(out[5..7], args[5..7]);
        let fewer = Cascade(Vec::new());
        assert_eq!(
            found.render(&args, &fewer),
            args,
            "values without a tier are kept"
        );
    }

    #[test]
    fn a_shown_value_is_escaped_and_cut_with_its_length() {
        assert_eq!(shown_value("abc"), r#""abc""#);
        for (raw, escaped) in [("a\nb", r"a\nb"), ("a\rb", r"a\rb"), ("a\tb", r"a\tb")] {
            assert_eq!(shown_value(raw), format!("\"{escaped}\""));
        }
        for control in ["\u{1b}[31m", "\u{7f}", "\u{0}"] {
            let shown = shown_value(control);
            assert!(!shown.chars().any(char::is_control), "{shown}");
        }
        let long = format!("{{\"a\":\"{}\"}}", "x".repeat(100_000));
        let shown = shown_value(&long);
        assert!(
            shown.ends_with(&format!("…\" ({} bytes)", long.len())),
            "{shown}"
        );
        assert!(shown.chars().count() < SHOWN_VALUE_CHARS + 40, "{shown}");
        assert_eq!(shown_path("/data/kv"), "/data/kv");
        assert_eq!(shown_path("/data/k\nv"), r#""/data/k\nv""#);
        let exact = "y".repeat(SHOWN_VALUE_CHARS);
        assert_eq!(shown_value(&exact), format!("{exact:?}"));
    }

    #[test]
    fn builtin_tier_has_the_documented_shape() {
        let t = fs_native_tier(Path::new("/c"), 4, true, 3 * (1 << 30) / 2);
        assert_eq!(
            t.to_arg(),
            r#"{"type":"fs_native","base_path":"/c","num_workers":4,"use_odirect":true,"max_capacity_gb":1.5,"eviction":{"eviction_policy":"LRU","trigger_watermark":0.8,"eviction_ratio":0.2}}"#
        );
    }

    #[test]
    fn object_is_one_tier_and_array_is_a_cascade_in_order() {
        let one = Cascade::parse(r#"{"type":"fs","base_path":"/a","zz":1,"aa":2}"#, "V").unwrap();
        assert_eq!(one.tiers().len(), 1);
        assert_eq!(
            one.tiers()[0].to_arg(),
            r#"{"type":"fs","base_path":"/a","zz":1,"aa":2}"#,
            "unknown keys and key order are kept"
        );
        let two = Cascade::parse(r#"[{"type":"fs"},{"type":"s3"}]"#, "V").unwrap();
        let types: Vec<_> = two.tiers().iter().map(TierSpec::adapter_type).collect();
        assert_eq!(types, ["fs", "s3"]);
        assert!(Cascade::parse("[]", "V").unwrap().tiers().is_empty());
    }

    #[test]
    fn bad_json_names_the_source_and_position() {
        let e = Cascade::parse(r#"[{"type":"fs",}]"#, "EREBINE_AGENT_LMCACHE_L2_ADAPTER")
            .unwrap_err()
            .to_string();
        assert!(e.contains("EREBINE_AGENT_LMCACHE_L2_ADAPTER"), "{e}");
        assert!(e.contains("column"), "{e}");
    }

    #[test]
    fn wrong_shapes_name_the_tier() {
        let e = Cascade::parse(r#"[{"type":"fs"},3]"#, "V")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tier 1 is a number"), "{e}");
        let e = Cascade::parse(r#"[{"base_path":"/x"}]"#, "V")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tier 0 has no \"type\""), "{e}");
        let e = Cascade::parse(r#""fs""#, "V").unwrap_err().to_string();
        assert!(e.contains("found a string"), "{e}");
    }

    #[test]
    fn secrets_in_nested_keys_and_urls_are_redacted() {
        let c = Cascade::parse(
            r#"{"type":"s3","s3_endpoint":"https://AKIA:PW@b.example.com/?X-Amz-Security-Token=TOK","extra":{"token":"T0K","secret_key":"SK"},"base_path":"/data/kv"}"#,
            "V",
        )
        .unwrap();
        let text = c.redacted().to_string();
        for secret in ["AKIA", "PW", "TOK", "T0K", "SK"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(text.contains("b.example.com"), "{text}");
        assert!(text.contains(r#""base_path":"/data/kv""#), "{text}");
    }

    #[test]
    fn secrets_are_redacted() {
        let c = Cascade::parse(
            r#"{"type":"s3","aws_access_key_id":"AKIA1","aws_secret_access_key":"s3cr3t"}"#,
            "V",
        )
        .unwrap();
        let text = c.redacted().to_string();
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(text.contains("<redacted>"));
    }
}
