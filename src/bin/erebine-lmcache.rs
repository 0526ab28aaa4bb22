//! `erebine-lmcache`: the image entrypoint, a drop-in for the `lmcache`
//! command. `erebine-lmcache server <flags>` runs the real `lmcache server`
//! with the same flags under supervision, with a capacity guard for every
//! `--l2-adapter` filesystem tier that has `max_capacity_gb`
//! ([`lmcache_launcher::run::guards`]); a command whose `--l2-adapter` specs name
//! an `s3_bucket` (`server`, `bench l2`) gets them rewritten to a path-style
//! gateway that runs here for the life of the child; every other subcommand
//! is handed to the stock `lmcache` unchanged. Every `--l2-adapter` value
//! must be one JSON object with a `type`, and the flag must be written in
//! full: what this process cannot read would reach LMCache unguarded.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

use lmcache_capacity_guard::capacity::CapacityError;
use lmcache_launcher::run::drop_in::{self, DropIn, DropInError};
use lmcache_launcher::node::env::process_vars;
use lmcache_launcher::exit::{ExitStatus, HasExitStatus};
use lmcache_launcher::run::guards::{check_guards, without_launch_guarded};
use lmcache_launcher::plan::locate::{find_stock_lmcache, NotFound};
use lmcache_launcher::output;
use lmcache_launcher::process::ProcessError;
use lmcache_s3_gateway::spec::{orphan_keys, BucketSpecError};
use lmcache_tier_spec::{L2AdapterArgs, SpecError};

const ABOUT: &str = "\
erebine-lmcache: drop-in for the `lmcache` command on an inference node.

  erebine-lmcache server <lmcache server flags>   run the real LMCache server
  erebine-lmcache <any other lmcache subcommand>  handed to the stock lmcache

An `s3` `--l2-adapter` spec with \"s3_bucket\" (also in `bench l2`) is served
path-style through a gateway on 127.0.0.1 that this process runs; LMCache gets
the gateway's address and a key pair made for this run, never the real keys
(see docs/s3-gateway.md). Exit 2: such a spec cannot work.

The stock lmcache is looked up in the active Python environment ($VIRTUAL_ENV,
$CONDA_PREFIX), then beside the vllm executable, then on PATH. `server` runs it
in its own process group, forwards every terminating signal it can catch
(SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, ...: docs/operations.md), never
leaves it orphaned, and exits with its status (128+N when signal N ended it).
An `fs` or `fs_native` --l2-adapter with max_capacity_gb gets a capacity
guard once the server listens (help and rejected command lines touch
nothing): LRU eviction at the spec's eviction watermark, usage counted from
disk at its start, state in <base_path>/.lmcache-tier-guard.json.
With EREBINE_AGENT_LMCACHE_METRICS_PORT set (and _HOST, default 127.0.0.1),
`server` serves Prometheus metrics of its guards, gateways and server there
(docs/metrics.md); unset or 0, it listens on no port of its own, as the
stock server does.
Every --l2-adapter value must be one JSON object with a \"type\" (NaN,
Infinity and 1e400 are not JSON), and the flag must be written in full
(argparse would take an abbreviation such as --l2-adapt, which this process
does not read).
Exit 127: the stock lmcache was not found; 2: an --l2-adapter value or
abbreviation as above, a max_capacity_gb that is unusable, two guarded
tiers in one directory, or a bad metrics variable; 4: the metrics port is
taken.
The stock lmcache's own help follows when it is found.
";

/// One line of this process's own on stderr, dropped if stderr is gone.
macro_rules! say {
    ($($arg:tt)*) => {
        output::stderr_line(&format!("erebine-lmcache: {}", format_args!($($arg)*)))
    };
}

/// Why `erebine-lmcache` ends before the server it runs does; each error
/// knows its exit status ([`HasExitStatus`]).
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// The command line would reach LMCache unguarded ([`check_args`]).
    #[error(transparent)]
    Args(#[from] ArgsError),
    /// The stock `lmcache` is not found (127, as a shell says of a missing
    /// command).
    #[error(transparent)]
    StockNotFound(NotFound),
    /// The stock `lmcache` cannot be run in this process's place (126).
    #[error("cannot run {}: {source}", .stock.display())]
    CannotRun {
        /// The stock `lmcache`.
        stock: PathBuf,
        /// The `exec` error.
        #[source]
        source: std::io::Error,
    },
    /// A command that runs here ended before its server did
    /// ([`drop_in::serve`]).
    #[error(transparent)]
    DropIn(#[from] DropInError),
    /// A guarded tier's capacity is unusable.
    #[error(transparent)]
    Guards(#[from] CapacityError),
    /// This process itself failed.
    #[error(transparent)]
    Process(#[from] ProcessError),
}

impl HasExitStatus for Failure {
    fn exit_status(&self) -> ExitStatus {
        match self {
            Failure::Args(e) => e.exit_status(),
            Failure::StockNotFound(_) => ExitStatus::CommandNotFound,
            Failure::CannotRun { .. } => ExitStatus::CannotRun,
            Failure::DropIn(e) => e.exit_status(),
            Failure::Guards(e) => e.exit_status(),
            Failure::Process(e) => e.exit_status(),
        }
    }
}

fn main() -> ExitCode {
    output::init_logging(false);
    match run() {
        Ok(status) => status.into(),
        Err(e) => {
            say!("{e}");
            e.exit_status().into()
        }
    }
}

/// Runs the command: the server's own status once it ran, else why not.
fn run() -> Result<ExitStatus, Failure> {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let vars = process_vars();
    let first = args.first().and_then(|a| a.to_str());
    if matches!(first, None | Some("-h" | "--help")) {
        let _ = output::stdout_text(&format!("{ABOUT}\n"));
    }
    // Read as text only to find the `--l2-adapter` values; the server gets
    // `args` byte for byte, except the specs a gateway rewrites.
    let text_args: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let specs = L2AdapterArgs::parse(&text_args);
    check_args(&args, &text_args, &specs)?;
    let own = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("erebine-lmcache"));
    let stock = match find_stock_lmcache(&vars, &own) {
        Ok(stock) => stock,
        // Our own help stands without LMCache: it was printed above.
        Err(e) if matches!(first, Some("-h" | "--help")) => {
            say!("the stock lmcache's own help cannot follow: {e}");
            return Ok(ExitStatus::Success);
        }
        Err(e) => return Err(Failure::StockNotFound(e)),
    };
    if !runs_here(first, &specs) || asks_for_help(&args) {
        let source = std::process::Command::new(&stock).args(&args).exec();
        return Err(Failure::CannotRun { stock, source });
    }
    let guards = without_launch_guarded(check_guards(&specs)?, &vars);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ProcessError::Runtime)?;
    let command = DropIn {
        stock,
        args,
        text_args,
        specs,
        guards,
    };
    Ok(runtime.block_on(drop_in::serve(command, vars))?)
}

/// Whether the command line asks LMCache for its help (`-h` or `--help`
/// before any `--`): the stock command prints it and exits, so it runs
/// without gateways or guards.
fn asks_for_help(args: &[OsString]) -> bool {
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
fn check_args(given: &[OsString], args: &[String], specs: &L2AdapterArgs) -> Result<(), ArgsError> {
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
enum ArgsError {
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

impl HasExitStatus for ArgsError {
    fn exit_status(&self) -> ExitStatus {
        match self {
            ArgsError::Abbreviated { .. } | ArgsError::NotUtf8 { .. } => ExitStatus::BadInput,
            ArgsError::Spec(e) => e.exit_status(),
            ArgsError::OrphanKey(e) => e.exit_status(),
        }
    }
}

/// Whether the command runs under this process (`server`, or any command
/// with an `--l2-adapter` spec that needs a gateway, decided from the parsed
/// specs) rather than being handed to the stock `lmcache` with `exec`.
fn runs_here(first: Option<&str>, specs: &L2AdapterArgs) -> bool {
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
