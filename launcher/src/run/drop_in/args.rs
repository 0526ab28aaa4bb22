//! The command-line rules of `erebine-lmcache`: which commands run under it
//! rather than the stock `lmcache` ([`runs_here`], [`asks_for_help`]), and
//! what it refuses because it would reach LMCache without the guard or
//! gateway its specs ask for ([`check_args`], following LMCache 0.5.6's
//! argparse: `docs/configuration.md`, "Extra arguments").

use std::ffi::OsString;

use lmcache_s3_gateway::spec::{orphan_keys, BucketSpecError};
use lmcache_tier_spec::{L2AdapterArgs, SpecError};

/// Whether the command line asks LMCache for its help (`-h` or `--help`
/// before any `--`): the stock command prints it and exits, so it runs
/// without gateways or guards.
pub fn asks_for_help(args: &[OsString]) -> bool {
    args.iter()
        .take_while(|a| *a != "--")
        .any(|a| a == "-h" || a == "--help")
}

/// The flag whose values this process reads.
const L2_ADAPTER_FLAG: &str = "--l2-adapter";

/// Refuses what would reach LMCache without the guard or gateway its spec
/// asks for: an abbreviation of `--l2-adapter` that LMCache 0.5.6's argparse
/// resolves to it (any strict prefix from `--l2-a` on: `server` also has
/// `--l2-store-policy`, `--l2-prefetch-policy` and
/// `--l2-prefetch-max-in-flight`, so `--l2` and `--l2-` are ambiguous there
/// and argparse refuses them itself; `bench l2` has no other `--l2` flag, so
/// there from `--l2` on), alone or with `=value`; an `--l2-adapter` value
/// that is not one JSON object with a `type` ([`L2AdapterArgs::check`]); and
/// an `s3` spec with `s3_key_prefix` or `s3_ca_bundle` but no `s3_bucket`
/// ([`orphan_keys`]), which LMCache would take and ignore.
/// An `--l2-adapter` value that is not UTF-8 (`given`: the arguments as
/// the OS gave them; `args`: the same as text) is refused too: it is JSON.
/// The messages name the argument, never a value (it may hold keys).
pub fn check_args(
    given: &[OsString],
    args: &[String],
    specs: &L2AdapterArgs,
) -> Result<(), ArgsError> {
    let shortest = match (args.first(), args.get(1)) {
        (Some(bench), Some(l2)) if bench == "bench" && l2 == "l2" => "--l2",
        _ => "--l2-a",
    };
    for (i, arg) in args.iter().enumerate() {
        let flag = arg.split_once('=').map_or(arg.as_str(), |(flag, _)| flag);
        if flag.len() >= shortest.len()
            && flag.len() < L2_ADAPTER_FLAG.len()
            && L2_ADAPTER_FLAG.starts_with(flag)
        {
            return Err(ArgsError::Abbreviated {
                argument: i + 1,
                flag: flag.to_string(),
            });
        }
    }
    for (position, arg) in specs.0.iter().enumerate() {
        if given.get(arg.index).is_some_and(|a| a.to_str().is_none()) {
            return Err(ArgsError::NotUtf8 {
                argument: arg.index + 1,
                spec: position + 1,
            });
        }
    }
    specs.check()?;
    for (position, arg) in specs.0.iter().enumerate() {
        if let Ok(spec) = &arg.spec {
            orphan_keys(spec, position)?;
        }
    }
    Ok(())
}

/// A command line [`check_args`] refuses: it would reach LMCache without
/// the guard or gateway its specs ask for.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// An abbreviation of `--l2-adapter` that argparse would take.
    #[error(
        "argument {argument} ({flag}) abbreviates --l2-adapter: LMCache would take it, but \
         this process reads only the full flag, so the tier would run without its \
         capacity guard or S3 gateway: write --l2-adapter in full"
    )]
    Abbreviated {
        /// The argument's position, 1 first.
        argument: usize,
        /// The flag as written, without any `=value`.
        flag: String,
    },
    /// An `--l2-adapter` value that is not UTF-8.
    #[error(
        "argument {argument} (--l2-adapter #{spec}) is not UTF-8 text: write the JSON in UTF-8"
    )]
    NotUtf8 {
        /// The value's position among the arguments, 1 first.
        argument: usize,
        /// The spec's position among the `--l2-adapter` values, 1 first.
        spec: usize,
    },
    /// An `--l2-adapter` value that is not one JSON object with a `type`.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// `s3_key_prefix` or `s3_ca_bundle` on an `s3` spec without `s3_bucket`.
    #[error(transparent)]
    OrphanKey(#[from] BucketSpecError),
}

/// Whether the command runs under this process (`server`, or any command
/// with an `--l2-adapter` spec that needs a gateway, decided from the parsed
/// specs) rather than being handed to the stock `lmcache` with `exec`.
pub fn runs_here(first: Option<&str>, specs: &L2AdapterArgs) -> bool {
    first == Some("server")
        || specs
            .0
            .iter()
            .filter_map(|a| a.spec.as_ref().ok())
            .any(|t| t.kind().is_bucket())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs(args: &[&str]) -> L2AdapterArgs {
        L2AdapterArgs::parse(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn only_a_parsed_s3_spec_with_s3_bucket_keeps_a_non_server_command_here() {
        let bench = |spec: &str| specs(&["bench", "l2", "--l2-adapter", spec]);
        let fs = bench(r#"{"type":"fs","base_path":"/data/s3_bucket/tier"}"#);
        assert!(!runs_here(Some("bench"), &fs));
        let fs_with_key = bench(r#"{"type":"fs","base_path":"/x","s3_bucket":"kvc"}"#);
        assert!(!runs_here(Some("bench"), &fs_with_key));
        let bucket = specs(&[
            "bench",
            "l2",
            r#"--l2-adapter={"type":"s3","s3_bucket":"kvc"}"#,
        ]);
        assert!(runs_here(Some("bench"), &bucket));
        assert!(runs_here(Some("server"), &specs(&["server"])));
    }

    /// [`check_args`] of `args`, its error as the operator reads it.
    fn check(args: &[&str]) -> Result<(), String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let given: Vec<OsString> = args.iter().map(OsString::from).collect();
        check_args(&given, &args, &L2AdapterArgs::parse(&args)).map_err(|e| e.to_string())
    }

    #[test]
    fn an_l2_adapter_value_that_is_not_utf8_is_refused_and_other_bytes_pass() {
        use std::os::unix::ffi::OsStringExt;
        let check_bytes = |flag: &str, value: &[u8]| {
            let given = vec![
                "server".into(),
                flag.into(),
                OsString::from_vec(value.to_vec()),
            ];
            let text: Vec<String> = given
                .iter()
                .map(|a: &OsString| a.to_string_lossy().into_owned())
                .collect();
            check_args(&given, &text, &L2AdapterArgs::parse(&text)).map_err(|e| e.to_string())
        };
        assert_eq!(
            check_bytes(
                "--l2-adapter",
                b"{\"type\":\"fs\",\"base_path\":\"/t/\xff\"}"
            ),
            Err("argument 3 (--l2-adapter #1) is not UTF-8 text: write the JSON in UTF-8".into())
        );
        assert_eq!(check_bytes("--lookup-hash-log-dir", b"/logs/\xff"), Ok(()));
    }

    #[test]
    fn an_abbreviated_l2_adapter_is_refused_where_argparse_would_take_it() {
        let spec = r#"{"type":"s3","s3_bucket":"kvc","aws_secret_access_key":"SK"}"#;
        for (command, flag) in [
            (&["server"][..], "--l2-adapt"),
            (&["server"], "--l2-a"),
            (&["server"], "--l2-adapte"),
            (&["bench", "l2"], "--l2"),
            (&["bench", "l2"], "--l2-"),
            (&["bench", "l2"], "--l2-ad"),
        ] {
            for inline in [false, true] {
                let mut args = command.to_vec();
                let joined = format!("{flag}={spec}");
                if inline {
                    args.push(&joined);
                } else {
                    args.extend([flag, spec]);
                }
                let e = check(&args).unwrap_err();
                let position = command.len() + 1;
                assert!(
                    e.starts_with(&format!(
                        "argument {position} ({flag}) abbreviates --l2-adapter"
                    )),
                    "{e}"
                );
                assert!(e.contains("write --l2-adapter in full"), "{e}");
                assert!(!e.contains("SK"), "{e}");
            }
        }
        let inline = format!("--l2-adapter={spec}");
        for args in [
            &["server", "--l2", "x"][..],
            &["server", "--l2-", "x"],
            &["server", "--l2-store-policy", "skip_l1"],
            &["bench", "l2", "--l"],
            &["server", "--l2-adapter", spec],
            &["server", &inline],
        ] {
            assert_eq!(check(args), Ok(()), "{args:?}");
        }
    }

    #[test]
    fn an_l2_adapter_value_that_is_not_one_json_object_is_refused() {
        let e = check(&[
            "server",
            "--l2-adapter",
            r#"{"type":"fs","base_path":"/tmp/x","max_capacity_gb":NaN}"#,
        ])
        .unwrap_err();
        assert!(
            e.starts_with("--l2-adapter #1 (L2 tier 0) is not valid JSON"),
            "{e}"
        );
        let e = check(&["bench", "l2", "--l2-adapter=s3_bucket"]).unwrap_err();
        assert!(
            e.contains("--l2-adapter #1 (L2 tier 0) is not valid JSON"),
            "{e}"
        );
    }

    #[test]
    fn gateway_keys_without_s3_bucket_are_refused_for_every_command() {
        for command in [&["server"][..], &["bench", "l2"]] {
            for key in ["s3_key_prefix", "s3_ca_bundle"] {
                let spec = format!(
                    r#"{{"type":"s3","s3_endpoint":"b.example.net","s3_region":"r","{key}":"x/"}}"#
                );
                let mut args = command.to_vec();
                args.extend(["--l2-adapter", &spec]);
                let e = check(&args).unwrap_err();
                assert!(
                    e.starts_with(&format!("L2 tier 0 (s3): {key}: is set without s3_bucket")),
                    "{command:?}: {e}"
                );
            }
        }
    }
}
