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

use lmcache_tier_spec::{Cascade, TierSpec};
use serde_json::Value;

use crate::node::config_error::{parse_gib, parse_whole, ConfigError};
use crate::node::server_flags::{next_server_flags, python_number, server_flags};

/// The variable this module reads.
pub(crate) const VARIABLE: &str = "EREBINE_AGENT_LMCACHE_EXTRA_ARGS";

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
    "--l2-prefetch-policy",
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
    /// Splits `text` on whitespace and reads it as LMCache's server parser
    /// would ([`crate::node::server_flags`]): abbreviations resolved, `--flag=value`
    /// kept together, every value typed and checked against its choices.
    ///
    /// Errors ([`ConfigError`] naming `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`):
    /// anything the server would refuse ([`ConfigError::ExtraArgs`]: an
    /// unknown flag, a stray word, a missing or mistyped value, a help
    /// request); `--host` or `--http-host` (the node keeps both listeners on
    /// 127.0.0.1: `docs/configuration.md`, "The server command line"); a
    /// port, chunk size, L1 size or GPU worker count out of range; an
    /// `--l2-adapter` value that is not one JSON object with a `type`.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let tokens: Vec<&str> = text.split_whitespace().collect();
        let mut out = ExtraArgs::default();
        let mut tiers = Vec::new();
        // Read as 0.5.6 reads it, else as 0.5.7 does: the plan, which knows
        // the installed version, reads them again with its table
        // (`docs/configuration.md`, "LMCache versions").
        let occurrences = match server_flags().read(&tokens) {
            Ok(occurrences) => occurrences,
            Err(e) => next_server_flags().read(&tokens).map_err(|_| e)?,
        };
        for occurrence in occurrences {
            let flag = occurrence.flag.as_str();
            let node_flag = NODE_FLAGS.iter().find(|f| **f == flag);
            for value in &occurrence.values {
                if let Some(known) = node_flag {
                    let read = check_value(known, value)?;
                    out.overrides.insert(known, read);
                }
                if flag == L2_ADAPTER_FLAG {
                    tiers.push(parse_tier(value, tiers.len())?);
                }
            }
            out.push(flag, &occurrence.values);
        }
        if !tiers.is_empty() {
            out.l2_adapters = Some(Cascade(tiers));
        }
        Ok(out)
    }

    /// Appends `flag` and its `values` as the server will read them: a
    /// single value that starts with `-` is joined to the flag with `=`,
    /// where argparse takes it as the value and not as a flag.
    fn push(&mut self, flag: &str, values: &[String]) {
        match values {
            [value] if value.starts_with('-') => self.args.push(format!("{flag}={value}")),
            _ => {
                self.args.push(flag.to_string());
                self.args.extend(values.iter().cloned());
            }
        }
    }

    /// The arguments to append, in order.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// Whether the extra arguments give `flag` (its full name, as
    /// [`ExtraArgs::parse`] resolves abbreviations), node flag or not.
    pub fn sets(&self, flag: &str) -> bool {
        self.args.iter().any(|a| {
            a.strip_prefix(flag)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('='))
        })
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

/// Checks the value of a node flag and returns it as the node reads it:
/// a number in Python's syntax (`+5`, `1_000`, already checked by
/// [`server_flags`]) without its sign and underscores.
fn check_value(flag: &'static str, value: &str) -> Result<String, ConfigError> {
    let read = match flag {
        "--port" | "--http-port" | "--chunk-size" | "--max-gpu-workers" | "--l1-size-gb" => {
            python_number(value)
        }
        _ => value.to_string(),
    };
    check_read_value(flag, &read).map(|()| read)
}

fn check_read_value(flag: &'static str, value: &str) -> Result<(), ConfigError> {
    let bad = |expected: &str| ConfigError::Invalid {
        variable: format!("{VARIABLE} ({flag})"),
        value: value.to_string(),
        expected: expected.to_string(),
    };
    match flag {
        "--host" | "--http-host" => Err(bad(
            "remove it: the node keeps the server's listeners on 127.0.0.1 (LMCache's HTTP admin API has no authentication); use EREBINE_AGENT_LMCACHE_MP_PORT / EREBINE_AGENT_LMCACHE_HTTP_PORT for the ports",
        )),
        "--port" | "--http-port" => match value.parse::<u16>() {
            Ok(p) if p > 0 => Ok(()),
            _ => Err(bad("write a TCP port from 1 to 65535")),
        },
        "--chunk-size" | "--max-gpu-workers" => {
            let what = match flag {
                "--chunk-size" => "a chunk size in tokens, e.g. 256",
                _ => "the number of GPU workers",
            };
            parse_whole(&format!("{VARIABLE} ({flag})"), value, 1, u32::MAX, what).map(drop)
        }
        "--l1-size-gb" => match parse_gib(&format!("{VARIABLE} ({flag})"), value)? {
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
        serde_json::from_str(value).map_err(|e| lmcache_tier_spec::SpecError::InvalidJson {
            source_name: source.clone(),
            detail: e.to_string(),
        })?;
    if let Some(repeated) = lmcache_tier_spec::SpecError::repeated_key(value, &source, position) {
        return Err(repeated.into());
    }
    match parsed {
        Value::Object(object) => Ok(TierSpec::from_object(object, &source, position)?),
        _ => Err(lmcache_tier_spec::SpecError::Shape {
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
    fn other_flags_pass_through_in_order_as_the_server_reads_them() {
        let e = ExtraArgs::parse(
            "  --enable-gc-monitor\t--gc-monitor-min-pause 5 --trace-level=events --enable a b -q",
        )
        .unwrap();
        assert_eq!(
            e.args(),
            [
                "--enable-gc-monitor",
                "--gc-monitor-min-pause-ms",
                "5",
                "--trace-level",
                "events",
                "--enable",
                "a",
                "b",
                "-q"
            ]
        );
        assert_eq!(e.overrides().count(), 0);
        assert!(e.l2_adapters().is_none());
    }

    #[test]
    fn a_no_flag_keeps_its_meaning() {
        let e = ExtraArgs::parse("--isolated-ipc --no-isolated-ipc --no-l1-use-l").unwrap();
        assert_eq!(
            e.args(),
            ["--isolated-ipc", "--no-isolated-ipc", "--no-l1-use-lazy"]
        );
    }

    #[test]
    fn node_flags_take_numbers_in_pythons_syntax() {
        let e =
            ExtraArgs::parse("--chunk-size 1_024 --http-port +8_091 --l1-size-gb 1_0.5").unwrap();
        assert_eq!(e.value("--chunk-size"), Some("1024"));
        assert_eq!(e.value("--http-port"), Some("8091"));
        assert_eq!(e.value("--l1-size-gb"), Some("10.5"));
        assert_eq!(e.args()[..2], ["--chunk-size", "1_024"]);
    }

    #[test]
    fn a_value_that_starts_with_a_dash_stays_joined_to_its_flag() {
        let e = ExtraArgs::parse("--lookup-hash-log-dir=-logs --eviction-ratio=-.5").unwrap();
        assert_eq!(
            e.args(),
            ["--lookup-hash-log-dir=-logs", "--eviction-ratio=-.5"]
        );
        assert_eq!(e.value("--lookup-hash-log-dir"), Some("-logs"));
    }

    #[test]
    fn an_abbreviation_is_the_flag_argparse_expands_it_to() {
        let e = ExtraArgs::parse("--chunk 512 --l2-adapt {\"type\":\"fs\",\"base_path\":\"/a\"}")
            .unwrap();
        assert_eq!(e.value("--chunk-size"), Some("512"));
        assert!(e.replaces("--chunk-size"));
        assert!(e.replaces("--l2-adapter"));
        assert_eq!(e.args()[..3], ["--chunk-size", "512", "--l2-adapter"]);
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
            ("--eviction-policy -x", "--eviction-policy needs a value"),
            (
                "--eviction-policy FIFO",
                "write one of LRU, ARC, IsolatedLRU, noop",
            ),
            ("--gc-monitor-min-pause-ms soon", "write a number"),
            ("--no-such-flag", "is not a flag of `lmcache server`"),
            ("--chunk-size 256 512", "\"512\" is not a flag"),
            ("--help", "prints LMCache's help"),
            ("--chunk-size 0", "at least 1"),
            ("--chunk-size abc", "write a whole number"),
            ("--max-gpu-workers -1", "at least 1"),
            ("--port 70000", "TCP port"),
            ("--http-port=0", "TCP port"),
            ("--l1-size-gb lots", "write a number"),
            ("--l1-size-gb -1", "GiB"),
            ("--l1-size-gb=0", "write-buffer-only"),
            ("--host 0.0.0.0", "127.0.0.1"),
            ("--http-host=0.0.0.0", "127.0.0.1"),
            ("--l2-adapt {}", "--l2-adapter"),
            ("--l2=x", "\"--l2\" abbreviates several flags"),
            ("--l2-adapter {not-json}", "not valid JSON"),
            ("--l2-adapter [{\"type\":\"fs\"}]", "one JSON object"),
            ("--l2-adapter {\"base_path\":\"/x\"}", "no \"type\""),
            ("--eviction-policy=", "write one of"),
        ] {
            let err = ExtraArgs::parse(text).unwrap_err().to_string();
            assert!(err.contains(VARIABLE), "{text}: {err}");
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}
