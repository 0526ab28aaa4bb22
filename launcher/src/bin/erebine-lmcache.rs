//! `erebine-lmcache`: the image entrypoint, a drop-in for the `lmcache`
//! command. `erebine-lmcache server <flags>` runs the real `lmcache server`
//! with the same flags under supervision, with a capacity guard for every
//! `--l2-adapter` filesystem tier that has `max_capacity_gb`
//! ([`lmcache_launcher::guards`]); a command whose `--l2-adapter` specs name
//! an `s3_bucket` (`server`, `bench l2`) gets them rewritten to a path-style
//! gateway that runs here for the life of the child; every other subcommand
//! is handed to the stock `lmcache` unchanged. Every `--l2-adapter` value
//! must be one JSON object with a `type`, and the flag must be written in
//! full: what this process cannot read would reach LMCache unguarded.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use lmcache_capacity_guard::capacity::GuardSpec;
use lmcache_launcher::env::{process_vars, Vars};
use lmcache_launcher::guards::{check_guards, start_guards, without_launch_guarded};
use lmcache_launcher::locate::find_stock_lmcache;
use lmcache_launcher::output;
use lmcache_launcher::supervise::{exit_code, Output, Supervised, TerminatingSignals};
use lmcache_s3_gateway::spec::orphan_keys;
use lmcache_s3_gateway::{needs_gateway, Gateways};
use lmcache_tier_spec::L2AdapterArgs;
use nix::sys::signal::Signal;

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
Every --l2-adapter value must be one JSON object with a \"type\" (NaN,
Infinity and 1e400 are not JSON), and the flag must be written in full
(argparse would take an abbreviation such as --l2-adapt, which this process
does not read).
Exit 127: the stock lmcache was not found; 2: an --l2-adapter value or
abbreviation as above, a max_capacity_gb that is unusable, or two guarded
tiers in one directory.
The stock help follows.
";

/// One line of this process's own on stderr, dropped if stderr is gone.
macro_rules! say {
    ($($arg:tt)*) => {
        output::stderr_line(&format!("erebine-lmcache: {}", format_args!($($arg)*)))
    };
}

fn main() -> ExitCode {
    output::init_logging(false);
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
    if let Err(e) = check_args(&args, &text_args, &specs) {
        say!("{e}");
        return ExitCode::from(2);
    }
    let own = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("erebine-lmcache"));
    let stock = match find_stock_lmcache(&vars, &own) {
        Ok(path) => path,
        Err(e) => {
            say!("{e}");
            return ExitCode::from(127);
        }
    };
    if !runs_here(first, &specs) || asks_for_help(&args) {
        let err = std::process::Command::new(&stock).args(&args).exec();
        say!("cannot run {}: {err}", stock.display());
        return ExitCode::from(126);
    }
    let guards = match check_guards(&specs) {
        Ok(guards) => without_launch_guarded(guards, &vars),
        Err(e) => {
            say!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say!("cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let command = Server {
        stock,
        args,
        text_args,
        specs,
        guards,
    };
    let code = runtime.block_on(serve(command, vars));
    ExitCode::from(u8::try_from(code).unwrap_or(1))
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
fn check_args(given: &[OsString], args: &[String], specs: &L2AdapterArgs) -> Result<(), String> {
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
            return Err(format!(
                "argument {} ({flag}) abbreviates --l2-adapter: LMCache would take it, but \
                 this process reads only the full flag, so the tier would run without its \
                 capacity guard or S3 gateway: write --l2-adapter in full",
                i + 1
            ));
        }
    }
    for (position, arg) in specs.0.iter().enumerate() {
        if given.get(arg.index).is_some_and(|a| a.to_str().is_none()) {
            return Err(format!(
                "argument {} (--l2-adapter #{}) is not UTF-8 text: write the JSON in UTF-8",
                arg.index + 1,
                position + 1
            ));
        }
    }
    specs.check().map_err(|e| e.to_string())?;
    for (position, arg) in specs.0.iter().enumerate() {
        if let Ok(spec) = &arg.spec {
            orphan_keys(spec, position).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
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
            .any(needs_gateway)
}

/// A command that runs under this process: the stock `lmcache`, its
/// arguments, and what was read from them.
struct Server {
    stock: PathBuf,
    /// The arguments as given.
    args: Vec<OsString>,
    /// `args` as text, for [`Gateways::start_parsed`] (`--l2-adapter`
    /// values are UTF-8, [`check_args`] made sure).
    text_args: Vec<String>,
    /// The parsed `--l2-adapter` values.
    specs: L2AdapterArgs,
    /// The capacity guards to start once the server runs.
    guards: Vec<GuardSpec>,
}

/// How often a server that has not yet opened a listener is checked for
/// one, to start its capacity guards.
const LISTEN_CHECK: Duration = Duration::from_millis(200);

/// Runs `lmcache <args>` with the gateways its `s3_bucket` tiers need,
/// starts the capacity guards once the server listens (a help request or a
/// command line LMCache rejects never gets that far, so it touches
/// nothing), and forwards every terminating signal until it exits.
async fn serve(server: Server, vars: Vars) -> i32 {
    let mut signals = match TerminatingSignals::install() {
        Ok(signals) => signals,
        Err(e) => {
            say!("{e}");
            return 1;
        }
    };
    let env = |k: &str| {
        vars.get(std::ffi::OsStr::new(k))
            .and_then(|v| v.to_str())
            .map(str::to_string)
    };
    let (rewritten, gateways) =
        match Gateways::start_parsed(&server.text_args, &server.specs, &env).await {
            Ok(started) => started,
            Err(e) => {
                say!("{e}");
                return 2;
            }
        };
    let args = server.args.iter().zip(&server.text_args).zip(rewritten);
    let args = args.map(|((given, read), sent)| match *read == sent {
        true => given.clone(),
        false => OsString::from(sent),
    });
    let mut command = tokio::process::Command::new(&server.stock);
    command.args(args);
    for variable in gateways.env_to_remove() {
        command.env_remove(variable);
    }
    command.env_remove(lmcache_launcher::launch::GUARDED_BY_LAUNCH);
    let mut child = match Supervised::spawn(command, Output::Inherit) {
        Ok(s) => s,
        Err(e) => {
            say!("cannot start {}: {e}", server.stock.display());
            return 126;
        }
    };
    let mut pending = Some(server.guards).filter(|g| !g.is_empty());
    // Stopped (last status written) when dropped, after the server exits.
    let mut _guards = Vec::new();
    loop {
        tokio::select! {
            status = child.wait() => {
                // Whatever the server left in its group goes with it.
                child.signal(Signal::SIGKILL);
                return match status {
                    Ok(status) => exit_code(status),
                    Err(e) => {
                        say!("lost track of the server: {e}");
                        1
                    }
                };
            }
            number = signals.recv() => child.forward(number),
            _ = tokio::time::sleep(LISTEN_CHECK), if pending.is_some() => {
                if child.listens() {
                    match start_guards(pending.take().unwrap_or_default()) {
                        Ok(started) => _guards = started,
                        Err(e) => {
                            say!("{e}; stopping the server");
                            let _ = child.stop(STOP_GRACE).await;
                            return 2;
                        }
                    }
                }
            }
        }
    }
}

/// How long a server stopped because its guard could not start is given
/// after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(30);

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

    fn check(args: &[&str]) -> Result<(), String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let given: Vec<OsString> = args.iter().map(OsString::from).collect();
        check_args(&given, &args, &L2AdapterArgs::parse(&args))
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
            check_args(&given, &text, &L2AdapterArgs::parse(&text))
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
