//! `lmcache-tier`: the operator's tool for the LMCache tiers of an inference
//! node. `launch` is the node's main job; `size` is the standalone sizing
//! tool.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};
use lmcache_housekeeping::tier_dir::replace_control_file;
use lmcache_launcher::cli::housekeep::HousekeepOutcome;
use lmcache_launcher::cli::size::SizeReport;
use lmcache_launcher::cli::{self, CommandError, UsageError};
use lmcache_launcher::exit::{exit_status_help, ExitStatus, HasExitStatus, LMCACHE_TIER_STATUSES};
use lmcache_launcher::inspect;
use lmcache_launcher::node::env::{self, ConfigError, DiskRead, NodeEnv, Vars};
use lmcache_launcher::output;
use lmcache_launcher::process::ProcessError;
use lmcache_launcher::run::launch::{self, RestartPolicy, RunOptions};
use lmcache_launcher::run::supervise::{self, TerminatingSignals};
use lmcache_launcher::run::watch::{WatchConfig, UNRESPONSIVE_TIMEOUT};
use lmcache_launcher::DiskAccess;
use lmcache_launcher::EngineFacts;
use lmcache_launcher::{KvCacheBackend, Planned};
use lmcache_sizing::gib_to_bytes;
use serde_json::json;

/// The statuses each subcommand can end with, for its `--help`; the top
/// level lists them all once. `launch` ends with every one but the two of
/// `inspect` (no answer, unhealthy), which close the list.
const LAUNCH_STATUSES: &[ExitStatus] = LMCACHE_TIER_STATUSES
    .split_at(LMCACHE_TIER_STATUSES.len() - 2)
    .0;
const SIZE_STATUSES: [ExitStatus; 3] = [
    ExitStatus::Success,
    ExitStatus::Failure,
    ExitStatus::BadInput,
];
const HOUSEKEEP_STATUSES: [ExitStatus; 5] = [
    ExitStatus::Success,
    ExitStatus::Failure,
    ExitStatus::BadInput,
    ExitStatus::TierLocked,
    ExitStatus::HousekeepingFailed,
];
const INSPECT_STATUSES: [ExitStatus; 5] = [
    ExitStatus::Success,
    ExitStatus::Failure,
    ExitStatus::BadInput,
    ExitStatus::NoAnswer,
    ExitStatus::Unhealthy,
];

#[derive(Parser)]
#[command(
    name = "lmcache-tier",
    version,
    about = "Size, launch and inspect the LMCache tiers of an inference node",
    long_about = "Size, launch and inspect the LMCache KV cache server of an inference node.\n\n\
The node's settings come from EREBINE_AGENT_* variables (see docs/configuration.md); \
engine facts come from flags. Sizes are GiB (1024^3 bytes) wherever a name says GB.",
    after_help = exit_status_help(&LMCACHE_TIER_STATUSES),
    disable_help_subcommand = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Plan and run the node's LMCache server: size the tiers, start the server
    /// through erebine-lmcache, wait for /status, run until SIGTERM, SIGINT or another terminating signal.
    #[command(after_help = exit_status_help(LAUNCH_STATUSES))]
    Launch(LaunchArgs),
    /// Print the disk tier and L1 sizing decisions, each with its reason.
    #[command(after_help = exit_status_help(&SIZE_STATUSES))]
    Size(SizeArgs),
    /// Clean a disk tier exactly as a launch does: delete objects written
    /// under another launch identity (model, TP/PP size, KV dtype, block size,
    /// chunk size) and stale temp files, trim the rest oldest-first to the
    /// capacity, record the identity. Only files that decode as cache objects
    /// (or temp files) are deleted; anything else is counted and left alone.
    #[command(after_help = exit_status_help(&HOUSEKEEP_STATUSES))]
    Housekeep(HousekeepArgs),
    /// Show what the node's tiers hold and do: each L2 tier in cascade order
    /// (type, path or endpoint, health, workers, O_DIRECT, capacity, usage),
    /// L1, the store controller, worker liveness, the state of the S3
    /// gateways of `s3_bucket` tiers, and the disk tier's identity manifest,
    /// on-disk usage and capacity guard (read from disk, so it works with
    /// the server down). Secrets are never printed.
    #[command(after_help = exit_status_help(&INSPECT_STATUSES))]
    Inspect(InspectArgs),
    /// Print this help, or the help of the subcommand named
    /// (`lmcache-tier help inspect`).
    #[command(after_help = exit_status_help(&SIZE_STATUSES))]
    Help(HelpArgs),
    /// Print a shell completion script on stdout. Install it where your
    /// shell looks, e.g. `lmcache-tier completions bash >
    /// /etc/bash_completion.d/lmcache-tier`, `lmcache-tier completions zsh >
    /// "${fpath[1]}/_lmcache-tier"`, `lmcache-tier completions fish >
    /// ~/.config/fish/completions/lmcache-tier.fish`.
    #[command(after_help = exit_status_help(&SIZE_STATUSES))]
    Completions(CompletionsArgs),
    /// Write the man pages (roff) of lmcache-tier and of each subcommand
    /// into a directory, e.g. `lmcache-tier man --dir
    /// /usr/local/share/man/man1`, then `man lmcache-tier-launch`.
    #[command(after_help = exit_status_help(&SIZE_STATUSES))]
    Man(ManArgs),
}

#[derive(Args)]
struct HelpArgs {
    /// The subcommand (and its subcommands) whose help to print; none for
    /// this program's.
    #[arg(value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(Args)]
struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Args)]
struct ManArgs {
    /// The directory to write the pages into (made if missing): one
    /// `<command>.1` file per command.
    #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    dir: PathBuf,
}

#[derive(Args)]
struct InspectArgs {
    /// The server's /status URL (default: the HTTP port a launch plans:
    /// --http-port in EREBINE_AGENT_LMCACHE_EXTRA_ARGS, else
    /// EREBINE_AGENT_LMCACHE_HTTP_PORT).
    #[arg(long)]
    url: Option<String>,
    /// Print one JSON object (field names: docs/inspect.md).
    #[arg(long)]
    json: bool,
    /// Redraw the view in place every SECONDS (default 2, fractions such as
    /// 0.5 allowed, 0.1 to 86400), with a usage bar per tier and the rows
    /// that changed since the last refresh marked `*`, until Ctrl-C or
    /// SIGTERM (exit 0). Needs a terminal on stdout (exit 2 otherwise).
    #[arg(
        long,
        value_name = "SECONDS",
        num_args = 0..=1,
        default_missing_value = "2",
        value_parser = inspect::live::interval,
        allow_negative_numbers = true,
        conflicts_with = "json"
    )]
    watch: Option<Duration>,
}

#[derive(Args)]
struct HousekeepArgs {
    /// The engine facts the launch identity comes from, as `launch` takes
    /// them.
    #[command(flatten)]
    engine: EngineArgs,
    /// The tier directory (default: the node's, as `launch` plans it:
    /// EREBINE_AGENT_LMCACHE_DISK_PATH, else ~/.cache/erebine/lmcache; a
    /// leading ~/ is expanded).
    #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    path: Option<PathBuf>,
    /// LMCache chunk size in tokens (default: the one `launch` plans:
    /// EREBINE_AGENT_LMCACHE_CHUNK_SIZE, --chunk-size in
    /// EREBINE_AGENT_LMCACHE_EXTRA_ARGS, else half of
    /// --max-num-batched-tokens).
    #[arg(long)]
    chunk_size: Option<u32>,
    /// Trim the remaining objects oldest-first to this many GiB (default:
    /// the capacity `launch` plans for the tier; no trim without a disk
    /// tier).
    #[arg(long, value_name = "GIB", value_parser = non_negative_gib, allow_negative_numbers = true)]
    capacity_gb: Option<f64>,
    /// Plan only: delete nothing, take no lock, write no manifest.
    #[arg(long)]
    dry_run: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

/// What the engine (vLLM) runs with; defaults are vLLM's. Give the flags
/// the engine itself was given: LMCache names every object after them
/// (docs/configuration.md, "The launch identity").
#[derive(Args)]
struct EngineArgs {
    /// vLLM's --model, exactly as the engine gets it (a hub id or a path):
    /// LMCache writes every object under it, and objects of another model
    /// are purged at the next launch.
    #[arg(long, default_value = "default-model")]
    model: String,
    /// vLLM's --served-model-name (what clients send). Not part of any
    /// object name, so it does not change the launch identity.
    #[arg(long, value_name = "NAME")]
    served_model_name: Option<String>,
    /// Tensor-parallel size of the engine.
    #[arg(long, default_value_t = 1)]
    tensor_parallel_size: u32,
    /// Pipeline-parallel size of the engine.
    #[arg(long, default_value_t = 1)]
    pipeline_parallel_size: u32,
    /// Data-parallel size of the engine.
    #[arg(long, default_value_t = 1)]
    data_parallel_size: u32,
    /// Decode-context-parallel size of the engine (vLLM's -dcp).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    decode_context_parallel_size: u32,
    /// The engine's --cp-kv-cache-interleave-size (or its older spelling
    /// --dcp-kv-cache-interleave-size, which vLLM 0.26 lets win when above
    /// 1); with a DCP size above 1, LMCache writes it into the model name.
    #[arg(long, alias = "dcp-kv-cache-interleave-size", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    cp_kv_cache_interleave_size: u32,
    /// KV cache dtype of the engine.
    #[arg(long, default_value = "auto")]
    kv_cache_dtype: String,
    /// KV cache block size of the engine, in tokens.
    #[arg(long, default_value_t = 16)]
    block_size: u32,
    /// Max batched tokens per engine step; the chunk size defaults to half of
    /// it. Default: vLLM's own for `vllm serve` on this node's first GPU
    /// (2048, 8192 from 70 GiB, 16384 from 160 GiB with vLLM 0.28 or later;
    /// docs/configuration.md). Give the engine's value when it sets one.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_num_batched_tokens: Option<u32>,
    /// The model is hybrid-attention: the chunk size is raised to a multiple
    /// of --block-size.
    #[arg(long)]
    hybrid_attention: bool,
    /// The model uses multi-head latent attention (DeepSeek-V2/V3 and
    /// their kind): LMCache stores its KV once per pipeline stage, not once
    /// per TP rank, and names objects so.
    #[arg(long)]
    mla: bool,
    /// vLLM's --revision of a hub id (branch, tag or commit; default main):
    /// the cache identity records the commit it resolves to in the Hugging
    /// Face cache.
    #[arg(long, value_name = "REVISION")]
    revision: Option<String>,
    /// vLLM's --download-dir: the Hugging Face cache the engine loads a hub
    /// id from (default: HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub).
    #[arg(long, value_name = "DIR")]
    download_dir: Option<String>,
    /// The weights' fingerprint, where you know it (a content hash, a
    /// release name): taken instead of measuring the weights. Give every
    /// node of the same weights the same text.
    #[arg(long, value_name = "TEXT")]
    weights_fingerprint: Option<String>,
    /// vLLM's --dtype: part of the cache identity (it changes the KV's
    /// bytes).
    #[arg(long, value_name = "DTYPE")]
    dtype: Option<String>,
    /// vLLM's --quantization: part of the cache identity.
    #[arg(long, value_name = "METHOD")]
    quantization: Option<String>,
    /// vLLM's --hf-overrides (RoPE scaling and friends), as the engine gets
    /// it: part of the cache identity.
    #[arg(long, value_name = "JSON")]
    hf_overrides: Option<String>,
    /// vLLM's --hf-config-path: part of the cache identity.
    #[arg(long, value_name = "PATH")]
    hf_config_path: Option<String>,
    /// vLLM's --load-format: part of the cache identity.
    #[arg(long, value_name = "FORMAT")]
    load_format: Option<String>,
    /// vLLM's --code-revision (the model's remote code): part of the cache
    /// identity.
    #[arg(long, value_name = "REVISION")]
    code_revision: Option<String>,
    /// vLLM's --model-impl: part of the cache identity.
    #[arg(long, value_name = "IMPL")]
    model_impl: Option<String>,
    /// vLLM's --calculate-kv-scales (fp8 KV scales computed at run time):
    /// part of the cache identity.
    #[arg(long)]
    calculate_kv_scales: bool,
    /// vLLM's --enable-lora: part of the cache identity (LMCache's keys do
    /// not name the adapter; docs/configuration.md, "The cache identity").
    #[arg(long)]
    enable_lora: bool,
}

#[derive(Args)]
struct LaunchArgs {
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    disk_load: DiskLoadArgs,
    /// Disk tier capacity in GiB (overrides EREBINE_AGENT_LMCACHE_DISK_SIZE_GB; 0 disables the tier).
    #[arg(long, value_name = "GIB", value_parser = non_negative_gib, allow_negative_numbers = true)]
    lmcache_disk_size_gb: Option<f64>,
    /// KV cache backend: lmcache plans the server; native and none have
    /// nothing to launch (exit 0). Overrides EREBINE_AGENT_KV_CACHE_BACKEND
    /// (default native).
    #[arg(long, value_name = "BACKEND", value_parser = backend)]
    kv_cache_backend: Option<KvCacheBackend>,
    /// Print the plan (argv, env, connector config, every decision) and start nothing.
    #[arg(long)]
    dry_run: bool,
    /// With --dry-run: print the plan as one JSON object.
    #[arg(long, requires = "dry_run")]
    json: bool,
    /// Seconds the server may take to answer /status.
    #[arg(long, default_value_t = 180, value_name = "SECONDS", value_parser = seconds())]
    ready_timeout: u64,
    /// Seconds a stop waits after SIGTERM before SIGKILL.
    #[arg(long, default_value_t = 30, value_name = "SECONDS", value_parser = seconds())]
    stop_grace: u64,
    /// Seconds before restarting a server that exited after it was ready
    /// once; doubled after each restart, up to 30 s (or this value if
    /// larger). 0 restarts at once.
    #[arg(long, default_value_t = 1, value_name = "SECONDS", value_parser = seconds())]
    restart_backoff: u64,
    /// A server run shorter than this many seconds is a fast failure; 3 in
    /// a row end the launch with exit 5.
    #[arg(long, default_value_t = 120, value_name = "SECONDS", value_parser = seconds())]
    fast_failure_window: u64,
    /// Seconds a server that was ready may give no HTTP answer at all
    /// before the launch stops it (SIGTERM and SIGCONT, SIGKILL after
    /// --stop-grace) and starts it again under the restart policy; 0 never
    /// does.
    #[arg(long, default_value_t = UNRESPONSIVE_TIMEOUT.as_secs(), value_name = "SECONDS", value_parser = seconds())]
    unresponsive_timeout: u64,
    /// Test hook: one more argument appended verbatim to the server's command
    /// line (repeat it for several). Not for production nodes.
    #[arg(long, hide = true, value_name = "ARG", allow_hyphen_values = true)]
    server_arg: Vec<String>,
}

/// What the plan turns into the disk tier's tokens a second
/// (docs/sizing.md, "What the disk tier delivers").
#[derive(Args)]
struct DiskLoadArgs {
    /// Bytes of KV a token of the model: 2 x layers x KV heads x head size
    /// x bytes of the KV dtype, e.g. 57344 for Qwen2-7B in bf16 (overrides
    /// EREBINE_AGENT_LMCACHE_KV_BYTES_PER_TOKEN).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    kv_bytes_per_token: Option<u64>,
    /// The cache volume's read rate in GB/s, or `probe` to measure it with a
    /// test file of at most 512 MiB in the cache directory, about 5 s
    /// (overrides EREBINE_AGENT_LMCACHE_DISK_READ_GBPS; a dry run does not
    /// probe).
    #[arg(long, value_name = "GBPS|probe", value_parser = disk_read)]
    disk_read_gbps: Option<DiskRead>,
}

impl DiskLoadArgs {
    /// Puts the flags given into `vars`, over the variables.
    fn apply(&self, vars: &mut Vars) {
        if let Some(bytes) = self.kv_bytes_per_token {
            vars.insert(env::KV_BYTES_PER_TOKEN.into(), bytes.to_string().into());
        }
        let rate = match self.disk_read_gbps {
            Some(DiskRead::Stated(bytes_per_s)) => (bytes_per_s as f64 / 1e9).to_string(),
            Some(DiskRead::Probe) => "probe".to_string(),
            None => return,
        };
        vars.insert(env::DISK_READ_GBPS.into(), rate.into());
    }
}

fn disk_read(s: &str) -> Result<DiskRead, ConfigError> {
    DiskRead::parse("--disk-read-gbps", s)
}

#[derive(Args)]
struct SizeArgs {
    /// Cache directory to size (default: EREBINE_AGENT_LMCACHE_DISK_PATH, else ~/.cache/erebine/lmcache).
    #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    path: Option<PathBuf>,
    /// L1 budget in GiB (default: EREBINE_AGENT_KV_OFFLOAD_SIZE_GB, else 25% of this node's share of RAM).
    #[arg(long, value_name = "GIB", value_parser = non_negative_gib, allow_negative_numbers = true)]
    l1_gb: Option<f64>,
    /// Disk tier capacity in GiB (default: EREBINE_AGENT_LMCACHE_DISK_SIZE_GB, else derived).
    #[arg(long, value_name = "GIB", value_parser = non_negative_gib, allow_negative_numbers = true)]
    disk_size_gb: Option<f64>,
    #[command(flatten)]
    disk_load: DiskLoadArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn backend(s: &str) -> Result<KvCacheBackend, ConfigError> {
    KvCacheBackend::parse("--kv-cache-backend", s)
}

/// The longest time a launch flag takes: 7 days in seconds. Longer ones
/// are typing mistakes, and would overflow the clock arithmetic.
const MAX_SECONDS: u64 = 7 * 24 * 3600;

/// Parses a launch flag's seconds, 0 to [`MAX_SECONDS`].
fn seconds() -> clap::builder::RangedU64ValueParser {
    clap::value_parser!(u64).range(..=MAX_SECONDS)
}

/// A GiB flag's value that is not a non-negative number, or too large
/// (clap exits 2).
#[derive(Debug, thiserror::Error)]
enum NotGib {
    /// Not a non-negative number.
    #[error("{} is not a size in GiB: give a non-negative number such as 16 or 0.5", lmcache_tier_spec::shown_value(.0))]
    NotASize(
        /// The value as given.
        String,
    ),
    /// Its bytes pass 64 bits.
    #[error("{} is too large: give a size in GiB from 0 to {}", lmcache_tier_spec::shown_value(.0), env::MAX_GIB)]
    TooLarge(
        /// The value as given.
        String,
    ),
}

fn non_negative_gib(s: &str) -> Result<f64, NotGib> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && gib_to_bytes(v).is_some() => Ok(v),
        Ok(v)
            if v > 0.0
                && !v.is_nan()
                && s.trim()
                    .starts_with(|c: char| c.is_ascii_digit() || c == '.') =>
        {
            Err(NotGib::TooLarge(s.to_string()))
        }
        _ => Err(NotGib::NotASize(s.to_string())),
    }
}

impl Command {
    /// Whether the command was asked for JSON (`--json`).
    fn json(&self) -> bool {
        match self {
            Command::Launch(a) => a.json,
            Command::Size(a) => a.json,
            Command::Housekeep(a) => a.json,
            Command::Inspect(a) => a.json,
            Command::Help(_) | Command::Completions(_) | Command::Man(_) => false,
        }
    }
}

/// `println!` for results on stdout: a closed pipe ends the output quietly,
/// any other failed write is exit 1 ([`output::stdout_text`]).
macro_rules! outln {
    ($($arg:tt)*) => {
        write_out(format!("{}\n", format_args!($($arg)*)))?
    };
}

fn write_out(text: String) -> Result<(), ProcessError> {
    output::stdout_text(&text).map_err(ProcessError::Stdout)
}

fn main() -> ExitCode {
    lmcache_launcher::output::init_logging(std::io::stderr().is_terminal());
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return refused_command_line(e),
    };
    let vars = env::process_vars();
    let json = cli.command.json();
    let result = match cli.command {
        Command::Launch(args) => launch_cmd(args, vars),
        Command::Size(args) => size_cmd(args, vars),
        Command::Housekeep(args) => housekeep_cmd(args, vars),
        Command::Inspect(args) => inspect_cmd(args, vars),
        Command::Help(args) => help_cmd(args),
        Command::Completions(args) => completions_cmd(args),
        Command::Man(args) => man_cmd(args),
    };
    match result {
        Ok(()) => ExitStatus::Success.into(),
        Err(f) => {
            tracing::error!("{f}");
            if json {
                print_error_document(&f.to_string(), f.exit_status());
            }
            f.exit_status().into()
        }
    }
}

/// A command line clap refuses: its message and usage on stderr, and with
/// `--json` among the arguments also the error document on stdout; exit 2.
/// Help and version requests print as usual.
fn refused_command_line(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
        || !std::env::args_os().any(|a| a == "--json")
    {
        e.exit()
    }
    let _ = e.print();
    // clap's message is its first paragraph; a list of missing arguments
    // follows on lines of its own.
    let rendered = e.render().to_string();
    let message = rendered
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ");
    let message = message.trim_start_matches("error: ");
    print_error_document(&format!("{message} (see --help)"), ExitStatus::BadInput);
    ExitStatus::BadInput.into()
}

/// Prints `{"error": {"message", "exit_status", "kind"}}` on stdout when
/// nothing was printed there yet, so that a `--json` run prints one JSON
/// document whatever happens (`docs/inspect.md`).
fn print_error_document(message: &str, status: ExitStatus) {
    if output::stdout_written() {
        return;
    }
    let document = json!({
        "error": {
            "message": message,
            "exit_status": status.code(),
            "kind": status.name(),
        }
    });
    let _ = output::stdout_text(&format!("{document:#}\n"));
}

/// This program's clap command, built (subcommands know their full names,
/// `lmcache-tier inspect`), for help, completions and man pages.
fn built_command() -> clap::Command {
    let mut command = Cli::command();
    command.build();
    command
}

fn help_cmd(args: HelpArgs) -> Result<(), CommandError> {
    let mut command = built_command();
    let mut target = &mut command;
    for name in &args.command {
        let parent = target.get_bin_name().unwrap_or("lmcache-tier").to_string();
        target = target
            .find_subcommand_mut(name)
            .ok_or_else(|| UsageError::NoSuchCommand {
                name: name.clone(),
                parent,
            })?;
    }
    // Rendered as `<command> --help` renders it, layout included.
    let argv = std::iter::once("lmcache-tier")
        .chain(args.command.iter().map(String::as_str))
        .chain(["--help"]);
    let help = Cli::command()
        .try_get_matches_from(argv)
        .err()
        .map(|shown| shown.render().to_string())
        .unwrap_or_default();
    Ok(write_out(help)?)
}

fn completions_cmd(args: CompletionsArgs) -> Result<(), CommandError> {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "lmcache-tier", &mut script);
    let mut script = String::from_utf8_lossy(&script).into_owned();
    if args.shell == clap_complete::Shell::Bash {
        // clap_complete 4.6's bash script names the case arms of a
        // hyphenated program's subcommands differently from the state its
        // loop sets (a known clap_complete bug), so nothing after a subcommand would
        // complete: one name for both.
        script = script.replace("lmcache__subcmd__tier", "lmcache__tier");
    }
    Ok(write_out(script)?)
}

fn man_cmd(args: ManArgs) -> Result<(), CommandError> {
    let dir = args.dir;
    let failed = |page: Option<&str>, source| UsageError::ManDir {
        dir: dir.clone(),
        page: page.map(str::to_string),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(|e| failed(None, e))?;
    let opened = nix::fcntl::open(
        &dir,
        nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| failed(None, e.into()))?;
    for (name, page) in man_pages() {
        // A temp file renamed into place: an entry already at the page's
        // name (a symlink, a hard link) is replaced, never written through.
        replace_control_file(opened.as_fd(), &format!(".{name}.tmp"), &name, &page)
            .map_err(|e| failed(Some(&name), e.source))?;
    }
    outln!(
        "wrote the man pages of lmcache-tier and its subcommands into {}",
        dir.display()
    );
    Ok(())
}

/// The man page (roff, section 1) of this program and of each subcommand,
/// each with its file name (`lmcache-tier-inspect.1`).
fn man_pages() -> Vec<(String, Vec<u8>)> {
    let command = built_command();
    std::iter::once(&command)
        .chain(command.get_subcommands())
        .map(|cmd| {
            let name = cmd.get_display_name().unwrap_or(cmd.get_name());
            let mut page = Vec::new();
            // Rendering into memory cannot fail.
            let _ = clap_mangen::Man::new(cmd.clone()).render(&mut page);
            (format!("{name}.1"), page)
        })
        .collect()
}

impl EngineArgs {
    /// The engine facts these flags give.
    fn facts(&self) -> EngineFacts {
        EngineFacts {
            model: self.model.clone(),
            served_model_name: self.served_model_name.clone(),
            tensor_parallel_size: self.tensor_parallel_size,
            pipeline_parallel_size: self.pipeline_parallel_size,
            data_parallel_size: self.data_parallel_size,
            decode_context_parallel_size: self.decode_context_parallel_size,
            cp_kv_cache_interleave_size: self.cp_kv_cache_interleave_size,
            kv_cache_dtype: self.kv_cache_dtype.clone(),
            block_size: self.block_size,
            max_num_batched_tokens: self.max_num_batched_tokens,
            hybrid_attention: self.hybrid_attention,
            mla: self.mla,
            revision: self.revision.clone(),
            download_dir: self.download_dir.clone(),
            weights_fingerprint: self.weights_fingerprint.clone(),
            kv_settings: self.kv_settings(),
        }
    }

    /// The flags of [`lmcache_launcher::plan::inputs::KV_SETTINGS`] that
    /// were given, by name.
    fn kv_settings(&self) -> BTreeMap<String, String> {
        let given = [
            ("dtype", self.dtype.clone()),
            ("quantization", self.quantization.clone()),
            ("hf_overrides", self.hf_overrides.clone()),
            ("hf_config_path", self.hf_config_path.clone()),
            ("load_format", self.load_format.clone()),
            ("code_revision", self.code_revision.clone()),
            ("model_impl", self.model_impl.clone()),
            (
                "calculate_kv_scales",
                self.calculate_kv_scales.then(|| "true".into()),
            ),
            ("enable_lora", self.enable_lora.then(|| "true".into())),
        ];
        given
            .into_iter()
            .filter_map(|(name, value)| Some((name.to_string(), value?)))
            .collect()
    }
}

fn launch_cmd(args: LaunchArgs, mut vars: Vars) -> Result<(), CommandError> {
    // Caught before anything is planned or touched: a signal from here on
    // stops the launch cleanly (docs/operations.md, "Stopping").
    let runtime = lmcache_launcher::process::runtime()?;
    let signals = match args.dry_run {
        true => None,
        false => Some(catch_signals(&runtime)?),
    };
    if let Some(gib) = args.lmcache_disk_size_gb {
        vars.insert(env::DISK_SIZE_GB.into(), gib.to_string().into());
    }
    args.disk_load.apply(&mut vars);
    if let Some(backend) = args.kv_cache_backend {
        vars.insert(env::KV_CACHE_BACKEND.into(), backend.to_string().into());
    }
    let access = match args.dry_run {
        true => DiskAccess::Inspect,
        false => DiskAccess::Create,
    };
    let engine = args.engine.facts();
    let launch = cli::launch::plan_node(&engine, &vars, access, args.server_arg.clone())?;
    let plan = match &launch.planned {
        Planned::Server(plan) => plan,
        Planned::NothingToLaunch(why) if !args.dry_run => {
            tracing::info!("nothing to launch: {}", why.reason);
            return Ok(());
        }
        Planned::NothingToLaunch(_) => return show_dry_run(&launch, args.json),
    };
    for note in launch.notes(&engine) {
        match note {
            cli::launch::Note::Warning(line) => tracing::warn!("{line}"),
            cli::launch::Note::Info(line) => tracing::info!("{line}"),
        }
    }
    if args.dry_run {
        return show_dry_run(&launch, args.json);
    }
    tracing::info!("{}", plan.log_line());
    match launch.lmcache() {
        Some(install) if install.tested => tracing::info!("{}", install.describe()),
        Some(install) => tracing::warn!("{}", install.describe()),
        None => {}
    }
    let options = run_options(&args);
    // The tier's scan and lock go on with the plan's housekeeping, if any.
    let cli::launch::NodeLaunch { planned, facts } = launch;
    drop(facts);
    let Planned::Server(plan) = planned else {
        return Ok(());
    };
    match signals {
        Some(signals) => runtime.block_on(launch::run_with_signals(&plan, &options, signals))?,
        None => runtime.block_on(launch::run(&plan, &options))?,
    };
    Ok(())
}

/// Prints `launch --dry-run`'s report ([`cli::launch::DryRun`]): JSON with
/// `--json`, else text; a purge it would make is warned about first.
fn show_dry_run(launch: &cli::launch::NodeLaunch, json: bool) -> Result<(), CommandError> {
    let report = cli::launch::DryRun::of(launch)?;
    if let Some(warning) = report.purge_warning() {
        tracing::warn!("{warning}");
    }
    match json {
        true => outln!("{:#}", report.to_json()),
        false => write_out(report.to_string())?,
    }
    Ok(())
}

/// The run's options from the launch's flags.
fn run_options(args: &LaunchArgs) -> RunOptions {
    let first_backoff = Duration::from_secs(args.restart_backoff);
    let default_restart = RestartPolicy::default();
    RunOptions {
        ready_timeout: Duration::from_secs(args.ready_timeout),
        stop_grace: Duration::from_secs(args.stop_grace),
        watch: WatchConfig {
            restart_unresponsive_after: Some(Duration::from_secs(args.unresponsive_timeout))
                .filter(|limit| !limit.is_zero()),
            ..WatchConfig::default()
        },
        restart: RestartPolicy {
            first_backoff,
            max_backoff: default_restart.max_backoff.max(first_backoff),
            fast_failure: Duration::from_secs(args.fast_failure_window),
            ..default_restart
        },
        progress: lmcache_launcher::output::spinner,
    }
}

/// Catches every terminating signal for the launch and makes this process
/// the reaper of the server's processes ([`supervise::become_subreaper`]):
/// the launch then holds the tier's lock until every one of them is gone.
fn catch_signals(runtime: &tokio::runtime::Runtime) -> Result<TerminatingSignals, ProcessError> {
    let signals = runtime
        .block_on(async { TerminatingSignals::install() })
        .map_err(ProcessError::Signals)?;
    if let Err(e) = supervise::become_subreaper() {
        tracing::warn!("cannot adopt the server's processes if its wrapper dies first: {e}");
    }
    Ok(signals)
}

fn inspect_cmd(args: InspectArgs, vars: Vars) -> Result<(), CommandError> {
    let request = cli::inspect::InspectRequest {
        url: args.url,
        watch: args.watch,
    };
    let Some(report) = cli::inspect::inspect(request, &vars)? else {
        return Ok(());
    };
    if args.json {
        let text = serde_json::to_string_pretty(&report).map_err(ProcessError::Json)?;
        outln!("{text}");
    } else {
        write_out(report.to_text())?;
    }
    Ok(report.verdict()?)
}

fn size_cmd(args: SizeArgs, mut vars: Vars) -> Result<(), CommandError> {
    if let Some(path) = &args.path {
        vars.insert(env::DISK_PATH.into(), path.clone().into_os_string());
    }
    if let Some(gib) = args.l1_gb {
        vars.insert(env::KV_OFFLOAD_SIZE_GB.into(), gib.to_string().into());
    }
    if let Some(gib) = args.disk_size_gb {
        vars.insert(env::DISK_SIZE_GB.into(), gib.to_string().into());
    }
    args.disk_load.apply(&mut vars);
    let node = NodeEnv::from_vars(&vars).map_err(|e| cli::path_flag(e, args.path.is_some()))?;
    let report = SizeReport::measure(&node)?;
    for warning in &report.warnings {
        tracing::warn!("{warning}");
    }
    match args.json {
        true => outln!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(ProcessError::Json)?
        ),
        false => write_out(report.to_string())?,
    }
    Ok(())
}

fn housekeep_cmd(args: HousekeepArgs, vars: Vars) -> Result<(), CommandError> {
    let request = cli::housekeep::HousekeepRequest {
        engine: args.engine.facts(),
        path: args.path,
        chunk_size: args.chunk_size,
        capacity_gb: args.capacity_gb,
        dry_run: args.dry_run,
    };
    let done = cli::housekeep::housekeep(request, vars)?;
    match (&done, args.json) {
        (_, true) => outln!(
            "{}",
            serde_json::to_string_pretty(&done).map_err(ProcessError::Json)?
        ),
        (HousekeepOutcome::NothingToClean { nothing_to_clean }, false) => {
            outln!("{nothing_to_clean}")
        }
        (HousekeepOutcome::Cleaned(cleaned), false) => outln!("{}", cleaned.report),
    }
    if let HousekeepOutcome::Cleaned(cleaned) = &done {
        if let Some(warning) = cleaned.report.purge_warning() {
            tracing::warn!("{warning}");
        }
    }
    Ok(())
}
