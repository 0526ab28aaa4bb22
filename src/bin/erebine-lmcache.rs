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
use std::process::ExitCode;

use lmcache_launcher::exit::{ExitStatus, HasExitStatus};
use lmcache_launcher::node::env::process_vars;
use lmcache_launcher::output;
use lmcache_launcher::run::drop_in;

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
tiers in one directory, an s3_bucket tier that cannot work, a module the
tiers need that the server's Python cannot import (boto3 for s3_bucket
tiers, LMCache's raw-block extension for raw_block ones), or a bad metrics
variable; 4: the metrics port is taken.
The stock lmcache's own help follows when it is found.
";

fn main() -> ExitCode {
    output::init_logging(false);
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if matches!(
        args.first().and_then(|a| a.to_str()),
        None | Some("-h" | "--help")
    ) {
        let _ = output::stdout_text(&format!("{ABOUT}\n"));
    }
    let status = match drop_in::run(args, process_vars()) {
        Ok(ended) => ExitStatus::from(&ended),
        Err(e) => {
            drop_in::say(&e.to_string());
            e.exit_status()
        }
    };
    status.into()
}
