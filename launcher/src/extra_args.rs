//! `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`: flags appended to the end of the
//! `lmcache server` command line.
//!
//! The node's contract (`docs/configuration.md`, `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`): the
//! value is whitespace-separated with no quoting, and "a flag that repeats one
//! the node emits wins". LMCache's `argparse` keeps the last value of a
//! single-value flag but *appends* every `--l2-adapter` (see
//! LMCache 0.5.6's `lmcache server --help`), so the node does the winning itself: the node's
//! own occurrence of a repeated single-value flag is dropped, and
//! `--l2-adapter` in the extra arguments replaces the node's whole cascade
//! instead of adding tiers to it. The plan then describes what the server
//! really gets.

use std::collections::BTreeMap;

use lmcache_adapters::{Cascade, TierSpec};
use serde_json::Value;

use crate::env::{self, ConfigError};

/// The variable this module reads.
pub const VARIABLE: &str = env::LMCACHE_EXTRA_ARGS;

/// Single-value flags the node itself emits; an extra occurrence replaces the
/// node's.
pub const NODE_FLAGS: &[&str] = &[
    "--host",
    "--port",
    "--http-host",
    "--http-port",
    "--chunk-size",
    "--l1-size-gb",
    "--eviction-policy",
    "--l2-store-policy",
    "--max-gpu-workers",
    "--lookup-hash-log-dir",
    "--lookup-hash-log-rotation-interval",
    "--lookup-hash-log-rotation-max-size",
    "--lookup-hash-log-max-files",
];

/// The repeatable flag whose extra occurrences replace the node's cascade.
pub const L2_ADAPTER_FLAG: &str = "--l2-adapter";

/// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`, parsed.
///
/// Flags the node does not emit are passed through untouched (LMCache checks
/// them); flags it does emit are checked here so that a bad value is refused
/// before anything starts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExtraArgs {
    args: Vec<String>,
    overrides: BTreeMap<&'static str, String>,
    l2_adapters: Option<Cascade>,
}

impl ExtraArgs {
    /// Splits `text` on whitespace and checks the flags the node emits.
    ///
    /// A node flag written `--flag=value` is split into `--flag value`. Errors
    /// ([`ConfigError::Invalid`] naming `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`):
    /// a node flag without a value; `--host` or `--http-host` (the node keeps
    /// both listeners on 127.0.0.1, seed: "Bound to localhost"); a port,
    /// chunk size, L1 size or GPU worker count that does not parse; an
    /// `--l2-adapter` value that is not one JSON object with a `type`; an
    /// abbreviation of a node flag (argparse would accept `--chunk` for
    /// `--chunk-size`, and the node could not see it).
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let mut out = ExtraArgs::default();
        let mut tiers = Vec::new();
        let mut tokens = text.split_whitespace();
        while let Some(token) = tokens.next() {
            let (flag, inline) = match token.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_string())),
                _ => (token, None),
            };
            let known = NODE_FLAGS
                .iter()
                .chain([&L2_ADAPTER_FLAG])
                .find(|f| **f == flag);
            let Some(&known) = known else {
                let candidates = abbreviated(flag);
                if let [full] = candidates[..] {
                    return Err(invalid(
                        token,
                        format!("write the flag in full ({full}): the node replaces its own {full} only when it sees the whole name"),
                    ));
                }
                if !candidates.is_empty() {
                    return Err(invalid(
                        token,
                        format!(
                            "write the flag in full: it abbreviates {}",
                            candidates.join(", ")
                        ),
                    ));
                }
                out.args.push(token.to_string());
                continue;
            };
            let value = match inline {
                Some(v) => v,
                None => match tokens.next() {
                    Some(v) if !v.starts_with("--") => v.to_string(),
                    _ => {
                        return Err(invalid(
                            token,
                            format!("{known} needs a value after it, e.g. {known} <value>"),
                        ))
                    }
                },
            };
            check_value(known, &value)?;
            if known == L2_ADAPTER_FLAG {
                tiers.push(parse_tier(&value, tiers.len())?);
            } else {
                out.overrides.insert(known, value.clone());
            }
            out.args.push(known.to_string());
            out.args.push(value);
        }
        if !tiers.is_empty() {
            out.l2_adapters = Some(Cascade(tiers));
        }
        Ok(out)
    }

    /// The arguments to append, in order.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// The last value the extra arguments give a single-value node flag
    /// (one of [`NODE_FLAGS`]), if any.
    pub fn value(&self, flag: &str) -> Option<&str> {
        self.overrides.get(flag).map(String::as_str)
    }

    /// Every node flag the extra arguments set, with its value.
    pub fn overrides(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.overrides.iter().map(|(f, v)| (*f, v.as_str()))
    }

    /// The `--l2-adapter` tiers, in order: `Some` replaces the node's cascade.
    pub fn l2_adapters(&self) -> Option<&Cascade> {
        self.l2_adapters.as_ref()
    }

    /// Whether the extra arguments set `flag` (a node flag or `--l2-adapter`),
    /// so the node must drop its own occurrence.
    pub fn replaces(&self, flag: &str) -> bool {
        if flag == L2_ADAPTER_FLAG {
            self.l2_adapters.is_some()
        } else {
            self.overrides.contains_key(flag)
        }
    }
}

/// The node flags (and `--l2-adapter`) that `flag` is a strict prefix of,
/// as argparse would expand it: one is an abbreviation the node could not
/// see through, several an ambiguous one.
fn abbreviated(flag: &str) -> Vec<&'static str> {
    if !flag.starts_with("--") || flag.len() < 3 {
        return Vec::new();
    }
    NODE_FLAGS
        .iter()
        .chain([&L2_ADAPTER_FLAG])
        .filter(|f| f.len() > flag.len() && f.starts_with(flag))
        .copied()
        .collect()
}

fn invalid(token: &str, expected: String) -> ConfigError {
    ConfigError::Invalid {
        variable: format!("{VARIABLE} (at {token:?})"),
        value: token.to_string(),
        expected,
    }
}

fn check_value(flag: &'static str, value: &str) -> Result<(), ConfigError> {
    let bad = |expected: &str| ConfigError::Invalid {
        variable: format!("{VARIABLE} ({flag})"),
        value: value.to_string(),
        expected: expected.to_string(),
    };
    match flag {
        "--host" | "--http-host" => Err(bad(
            "remove it: the node keeps the server's listeners on 127.0.0.1 (seed: bound to localhost); use EREBINE_AGENT_LMCACHE_MP_PORT / EREBINE_AGENT_LMCACHE_HTTP_PORT for the ports",
        )),
        "--port" | "--http-port" => match value.parse::<u16>() {
            Ok(p) if p > 0 => Ok(()),
            _ => Err(bad("write a TCP port from 1 to 65535")),
        },
        "--chunk-size" | "--max-gpu-workers" => match value.parse::<u32>() {
            Ok(n) if n > 0 => Ok(()),
            _ => Err(bad("write a whole number of at least 1")),
        },
        "--l1-size-gb" => match env::parse_gib(&format!("{VARIABLE} ({flag})"), value)? {
            0 => Err(bad(
                "a size above 0 bytes (this one is 0, or rounds to 0): LMCache stages every chunk in L1 on its way to the L2 tiers and cannot run without one; for a write-buffer-only L1 set EREBINE_AGENT_KV_OFFLOAD_SIZE_GB=0 and drop the flag (the node then gives L1 1 GiB)",
            )),
            _ => Ok(()),
        },
        _ if value.is_empty() => Err(bad("give the flag a value")),
        _ => Ok(()),
    }
}

fn parse_tier(value: &str, position: usize) -> Result<TierSpec, ConfigError> {
    let source = format!("{VARIABLE} ({L2_ADAPTER_FLAG} number {})", position + 1);
    let parsed: Value =
        serde_json::from_str(value).map_err(|e| lmcache_adapters::SpecError::InvalidJson {
            source_name: source.clone(),
            detail: e.to_string(),
        })?;
    match parsed {
        Value::Object(object) => Ok(TierSpec::from_object(object, &source, position)?),
        _ => Err(lmcache_adapters::SpecError::Shape {
            source_name: source,
            detail:
                "each --l2-adapter takes one JSON object (one tier); repeat the flag for a cascade"
                    .into(),
        }
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_flags_pass_through_in_order() {
        let e =
            ExtraArgs::parse("  --enable-gc-monitor\t--gc-monitor-min-pause-ms 5 --x=y ").unwrap();
        assert_eq!(
            e.args(),
            [
                "--enable-gc-monitor",
                "--gc-monitor-min-pause-ms",
                "5",
                "--x=y"
            ]
        );
        assert_eq!(e.overrides().count(), 0);
        assert!(e.l2_adapters().is_none());
    }

    #[test]
    fn node_flags_are_recorded_last_value_wins_and_equals_is_split() {
        let e = ExtraArgs::parse("--chunk-size 512 --chunk-size=1024 --port 7000").unwrap();
        assert_eq!(e.value("--chunk-size"), Some("1024"));
        assert_eq!(e.value("--port"), Some("7000"));
        assert!(e.replaces("--chunk-size"));
        assert!(!e.replaces("--l2-adapter"));
        assert_eq!(
            e.args(),
            [
                "--chunk-size",
                "512",
                "--chunk-size",
                "1024",
                "--port",
                "7000"
            ]
        );
    }

    #[test]
    fn l2_adapters_form_a_cascade_in_order() {
        let e = ExtraArgs::parse(
            r#"--l2-adapter {"type":"fs","base_path":"/a"} --l2-adapter={"type":"s3","s3_endpoint":"b.example"}"#,
        )
        .unwrap();
        let types: Vec<_> = e
            .l2_adapters()
            .unwrap()
            .tiers()
            .iter()
            .map(TierSpec::adapter_type)
            .collect();
        assert_eq!(types, ["fs", "s3"]);
        assert!(e.replaces("--l2-adapter"));
        assert_eq!(e.args()[2], "--l2-adapter");
    }

    #[test]
    fn bad_values_name_the_variable_the_flag_and_the_fix() {
        for (text, needle) in [
            ("--chunk-size", "needs a value"),
            ("--chunk-size --port 1", "needs a value"),
            ("--chunk-size 0", "at least 1"),
            ("--chunk-size abc", "at least 1"),
            ("--max-gpu-workers -1", "at least 1"),
            ("--port 70000", "TCP port"),
            ("--http-port=0", "TCP port"),
            ("--l1-size-gb lots", "GiB"),
            ("--l1-size-gb=0", "write-buffer-only"),
            ("--host 0.0.0.0", "127.0.0.1"),
            ("--http-host=0.0.0.0", "127.0.0.1"),
            ("--chunk 512", "--chunk-size"),
            ("--l2-adapt {}", "--l2-adapter"),
            ("--l2=x", "abbreviates --l2-store-policy, --l2-adapter"),
            ("--l2-adapter {not-json}", "not valid JSON"),
            ("--l2-adapter [{\"type\":\"fs\"}]", "one JSON object"),
            ("--l2-adapter {\"base_path\":\"/x\"}", "no \"type\""),
            ("--eviction-policy=", "value"),
        ] {
            let err = ExtraArgs::parse(text).unwrap_err().to_string();
            assert!(err.contains(VARIABLE), "{text}: {err}");
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}
