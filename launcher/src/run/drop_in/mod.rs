//! What `erebine-lmcache` does with a command that runs under it (`server`,
//! or any command whose `--l2-adapter` specs need an S3 gateway): the
//! gateways of its `s3_bucket` tiers ([`lmcache_s3_gateway::Gateways`]),
//! the stock `lmcache` started with the rewritten specs in its own process
//! group and supervised by [`Supervised`] (every terminating signal
//! forwarded, its process group killed once it exits, its status passed
//! on), the capacity guards of its `fs` tiers once it listens, and, with
//! `EREBINE_AGENT_LMCACHE_METRICS_PORT` set, a metrics endpoint
//! (`docs/metrics.md`). [`run`] checks the command line ([`args`]), finds
//! the stock `lmcache` and hands it what does not run here; [`serve`] does
//! the rest. The binary prints its help and the outcome.
//!
//! Unlike [`crate::run::launch`], a drop-in never restarts the server and polls
//! no `/status`: it stands where the stock command stood, so the server's
//! own exit status is its own (`docs/operations.md`).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lmcache_capacity_guard::adapter::GuardTiers;
use lmcache_capacity_guard::capacity::{guard_specs, CapacityError};
use lmcache_tier_spec::L2AdapterArgs;
use nix::sys::signal::Signal;

use crate::metrics::{MetricsEndpoint, MetricsError, NodeMetrics};
use crate::node::env::{metrics_address, text_var, ConfigError, Vars, METRICS_PORT};
use crate::node::server_flags::server_flags;
use crate::plan::locate::{find_stock_lmcache, NotFound};
use crate::plan::server_python::{check_module, needed_modules, python_of, ModuleError};
use crate::process::ProcessError;
use crate::run::guards::launch_guard_owner;
use crate::run::supervise::{
    exit_code, reap_exited_children, Output, Supervised, TerminatingSignals,
};
use crate::run::tiers::{AdapterError, RunningAdapters, TierAdapters};
use crate::status::events::Event;

/// One line of `erebine-lmcache`'s own on stderr (`erebine-lmcache: <line>`),
/// dropped if stderr is gone.
pub fn say(line: &str) {
    crate::output::stderr_line(&format!("erebine-lmcache: {line}"));
}

pub mod args;

use args::{asks_for_help, check_args, runs_here, ArgsError};

/// How a command that ran under `erebine-lmcache` ended; its exit status is
/// mapped in `crate::exit`.
#[derive(Debug)]
pub enum Ended {
    /// Only our own help was asked for (printed by the binary), and the
    /// stock `lmcache` whose help would follow is not found (said): 0.
    HelpWithoutStock,
    /// The server exited with this code ([`crate::run::supervise::exit_code`]).
    Server(i32),
    /// What an adapter left for the server's start (the capacity guards)
    /// could not start once the server listened: said, and the server
    /// stopped.
    AdapterFailed(DropInError),
    /// This terminating signal came while the tiers' adapters started (a
    /// gateway's start-up checks can take seconds): what had started was
    /// stopped, and the server never started: 128 + the signal's number,
    /// as if the server had ended on it.
    StoppedBeforeStart(i32),
}

/// Why `erebine-lmcache` ends before the server it runs does, or without
/// one; each knows its exit status (`HasExitStatus`, in `crate::exit`).
#[derive(Debug, thiserror::Error)]
pub enum Failure {
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
    /// A command that runs here ended before its server did ([`serve`]).
    #[error(transparent)]
    DropIn(#[from] DropInError),
    /// A guarded tier's capacity key is unusable.
    #[error(transparent)]
    Guards(#[from] CapacityError),
    /// A tier's adapter refused it before anything started
    /// ([`TierAdapters::check`]).
    #[error(transparent)]
    Check(AdapterError),
    /// This process itself failed.
    #[error(transparent)]
    Process(#[from] ProcessError),
}

/// What `erebine-lmcache <args>` does, `vars` being its environment: checks
/// the command line ([`check_args`]), finds the stock `lmcache`
/// ([`find_stock_lmcache`]), hands it every command that does not run here
/// (`exec`: this returns only when that fails), and serves the rest
/// ([`serve`]) with its tiers' adapters, checked ([`TierAdapters`]).
///
/// # Errors
/// [`Failure`]: a refused command line, no stock `lmcache`, an `exec` that
/// failed, a tier its adapter refused, or what kept the server from running.
pub fn run(args: Vec<OsString>, vars: Vars) -> Result<Ended, Failure> {
    let first = args.first().and_then(|a| a.to_str());
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
        // Our own help stands without LMCache: the binary printed it.
        Err(e) if matches!(first, Some("-h" | "--help")) => {
            say(&format!("the stock lmcache's own help cannot follow: {e}"));
            return Ok(Ended::HelpWithoutStock);
        }
        Err(e) => return Err(Failure::StockNotFound(e)),
    };
    if !runs_here(first, &specs) || asks_for_help(&args) {
        let source = std::process::Command::new(&stock).args(&args).exec();
        return Err(Failure::CannotRun { stock, source });
    }
    let adapters = server_adapters(&specs, &vars)?;
    let runtime = crate::process::runtime()?;
    let command = DropIn {
        stock,
        args,
        text_args,
        specs,
        adapters,
    };
    Ok(runtime.block_on(serve(command, vars))?)
}

/// The adapters of the command's tiers ([`TierAdapters`]), checked: its
/// guarded tiers those of a server, less the ones the launch that started
/// this process guards itself ([`GuardTiers::of_server`]).
///
/// # Errors
/// A guarded tier's capacity key is unusable ([`Failure::Guards`]), or an
/// adapter refused its tiers ([`Failure::Check`]).
fn server_adapters(specs: &L2AdapterArgs, vars: &Vars) -> Result<TierAdapters, Failure> {
    let cascade = specs.cascade();
    let env = |name: &str| text_var(vars, name);
    let guards = GuardTiers::of_server(guard_specs(&cascade)?, &env);
    let adapters = TierAdapters::new(&cascade, guards, None);
    adapters.check().map_err(Failure::Check)?;
    Ok(adapters)
}

/// Why a drop-in command ends before the server it runs does; each error
/// knows its exit status (`HasExitStatus`, in `crate::exit`).
#[derive(Debug, thiserror::Error)]
pub enum DropInError {
    /// The stock `lmcache` cannot be started as the server (126).
    #[error("cannot start {}: {source}", .stock.display())]
    CannotStart {
        /// The stock `lmcache`.
        stock: PathBuf,
        /// The spawn error.
        #[source]
        source: std::io::Error,
    },
    /// A terminating signal cannot be caught (1).
    #[error(transparent)]
    Signals(std::io::Error),
    /// A tier's adapter could not start (an `s3_bucket` tier cannot work).
    #[error(transparent)]
    Adapter(#[from] AdapterError),
    /// The stock `lmcache`'s Python cannot import a module the tiers need
    /// ([`needed_modules`]: boto3 for `s3_bucket` tiers, LMCache's Rust
    /// raw-block extension for `raw_block` ones) (2).
    #[error(transparent)]
    ServerModule(#[from] ModuleError),
    /// What an adapter left for the server's start (the capacity guards)
    /// could not start once the server listened; the server is stopped.
    #[error("{0}; stopping the server")]
    Listening(
        /// Why it did not start.
        AdapterError,
    ),
    /// A variable is unusable: the metrics endpoint's, or the stop grace
    /// a launch passes (2).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The metrics endpoint cannot listen (4), or its thread cannot start
    /// (1).
    #[error("{0}; the server was not started")]
    Metrics(#[from] MetricsError),
    /// This process itself failed.
    #[error(transparent)]
    Process(#[from] ProcessError),
}

/// A command that runs under `erebine-lmcache`: the stock `lmcache`, its
/// arguments, and what was read from them.
#[derive(Debug)]
pub struct DropIn {
    /// The stock `lmcache` ([`crate::plan::locate::find_stock_lmcache`]).
    pub stock: PathBuf,
    /// The arguments as given.
    pub args: Vec<OsString>,
    /// `args` as text, for [`L2AdapterArgs::render`] (`--l2-adapter`
    /// values are UTF-8: the caller checks).
    pub text_args: Vec<String>,
    /// The parsed `--l2-adapter` values.
    pub specs: L2AdapterArgs,
    /// The adapters of its tiers, checked.
    pub adapters: TierAdapters,
}

/// How often a server that has not yet opened a listener is checked for
/// one, to start what its adapters left for then.
const LISTEN_CHECK: Duration = Duration::from_millis(200);

/// Runs `lmcache <args>` with its tiers' adapters started (the gateways its
/// `s3_bucket` tiers need), tells them once the server listens (the
/// capacity guards start then: a help request or a command line LMCache
/// rejects never gets that far, so it touches nothing), and forwards every
/// terminating signal until it exits.
///
/// Returns the status the run ends with once the server ran: its own, or
/// that of a guard that could not start (said, and the server stopped).
///
/// # Errors
/// [`DropInError`]: what kept the server from running, or from being
/// waited on.
pub async fn serve(server: DropIn, vars: Vars) -> Result<Ended, DropInError> {
    let mut signals = TerminatingSignals::install().map_err(DropInError::Signals)?;
    let metrics = Arc::new(NodeMetrics::new(None));
    if let Some(owner) = launch_guard_owner(&vars) {
        metrics.serve_guards_of(&owner);
    }
    let _endpoint = start_metrics(&server, &vars, &metrics)?;
    let grace = stop_grace(&vars)?;
    let (command, adapters) = tokio::select! {
        biased;
        number = signals.recv() => return Ok(stopped_before_start(number)),
        prepared = prepare_server(server, &vars, &metrics) => prepared?,
    };
    if let Some(number) = signals.already_received().await {
        return Ok(stopped_before_start(number));
    }
    let mut child = spawn_server(command)?;
    metrics.server().started(1);
    let mut run = Run {
        child: &mut child,
        signals: &mut signals,
        metrics: &metrics,
        grace,
    };
    run.supervise(adapters).await
}

/// How long a server told to stop has before its processes are killed:
/// the launch's `--stop-grace` ([`crate::run::launch::STOP_GRACE`]), else
/// [`STOP_GRACE`].
///
/// # Errors
/// A value that is not a whole number of seconds.
fn stop_grace(vars: &Vars) -> Result<Duration, DropInError> {
    let Some(value) = vars.get(std::ffi::OsStr::new(crate::run::launch::STOP_GRACE)) else {
        return Ok(STOP_GRACE);
    };
    value
        .to_str()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs)
        .ok_or_else(|| {
            DropInError::Config(ConfigError::Invalid {
                variable: crate::run::launch::STOP_GRACE.to_string(),
                value: value.to_string_lossy().into_owned(),
                expected: "write a whole number of seconds, such as 30".to_string(),
            })
        })
}

/// A terminating signal came before the server started: said, and the
/// adapters that had started are stopped as the caller drops them.
fn stopped_before_start(number: i32) -> Ended {
    say(&format!(
        "{} came while the tiers' adapters started: the server is not started",
        crate::run::supervise::signal_name(number)
    ));
    Ended::StoppedBeforeStart(number)
}

/// Starts the adapters of the command's tiers and checks the server's
/// Python for the modules they need; returns the stock `lmcache`'s command,
/// ready to spawn, with the specs the adapters rewrote (every other
/// argument byte for byte) and the environment they need (the gateways'
/// per-launch key), and the adapters, which serve until dropped.
///
/// # Errors
/// An adapter that cannot start, or a module the server lacks.
async fn prepare_server(
    server: DropIn,
    vars: &Vars,
    metrics: &NodeMetrics,
) -> Result<(ServerCommand, RunningAdapters), DropInError> {
    let env = |name: &str| text_var(vars, name);
    let cascade = server.specs.cascade();
    let adapters = server
        .adapters
        .start(&env, &metrics.guard_owner(), None, metrics)
        .await?;
    let rewritten = server
        .specs
        .render(&server.text_args, &adapters.server_tiers(&cascade));
    // Each module the tiers need in the server's Python (boto3, through
    // which LMCache gets the gateways' key; the raw-block extension): the
    // adapters are stopped with this process if one is missing.
    let python = python_of(&server.stock);
    for need in needed_modules(cascade.tiers()) {
        check_module(&python, vars, need)?;
    }
    let args = server.args.iter().zip(&server.text_args).zip(rewritten);
    let args = args.map(|((given, read), sent)| match *read == sent {
        true => given.clone(),
        false => OsString::from(sent),
    });
    let mut command = tokio::process::Command::new(&server.stock);
    command.args(args);
    for (variable, value) in adapters.server_env() {
        match value {
            Some(value) => command.env(variable, value),
            None => command.env_remove(variable),
        };
    }
    let stock = server.stock;
    Ok((ServerCommand { stock, command }, adapters))
}

/// The stock `lmcache` and its command, ready to spawn.
struct ServerCommand {
    stock: PathBuf,
    command: tokio::process::Command,
}

/// Spawns the server's command under supervision.
///
/// # Errors
/// [`DropInError::CannotStart`].
fn spawn_server(server: ServerCommand) -> Result<Supervised, DropInError> {
    let ServerCommand { stock, command } = server;
    Supervised::spawn(command, Output::Inherit)
        .map_err(|source| DropInError::CannotStart { stock, source })
}

/// A running server and what its supervision needs.
struct Run<'a> {
    child: &'a mut Supervised,
    signals: &'a mut TerminatingSignals,
    metrics: &'a NodeMetrics,
    /// How long the server has, once told to stop, before its processes
    /// are killed.
    grace: Duration,
}

impl Run<'_> {
    /// Waits for the server to exit, forwarding every terminating signal
    /// (the first one arms the grace: past it, SIGKILL to every process of
    /// the server, so that none outlives this run), and tells `adapters`
    /// once it listens; returns its status, or that of an adapter that could
    /// not start what waited (said, and the server stopped).
    async fn supervise(&mut self, mut adapters: RunningAdapters) -> Result<Ended, DropInError> {
        let mut listening = false;
        let mut kill_at: Option<tokio::time::Instant> = None;
        // As a container's PID 1 this process adopts every orphan of the
        // container, and must reap them (`docs/operations.md`,
        // "Stopping").
        let init = std::process::id() == 1;
        let mut children = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
            .map_err(DropInError::Signals)?;
        // `adapters` are stopped (guards' last status written) when
        // dropped, after the server exits.
        loop {
            let killing = kill_at.unwrap_or_else(tokio::time::Instant::now);
            tokio::select! {
                status = self.child.wait() => return self.exited(status),
                _ = children.recv(), if init => {
                    reap_exited_children(self.child.pid());
                }
                number = self.signals.recv() => {
                    self.child.forward(number);
                    kill_at.get_or_insert_with(|| self.told_to_stop(number));
                }
                _ = tokio::time::sleep_until(killing), if kill_at.is_some() => {
                    say(&format!(
                        "the server did not stop within {} s of the signal; sending SIGKILL to its processes",
                        self.grace.as_secs()
                    ));
                    self.child.kill_all();
                    kill_at = Some(tokio::time::Instant::now() + self.grace);
                }
                _ = tokio::time::sleep(LISTEN_CHECK), if !listening => {
                    if self.child.listens() {
                        // Listening is this process's "ready": it does not
                        // poll /status, the launch does.
                        listening = true;
                        self.metrics.server().observe(&Event::Ready);
                        if let Err(e) = adapters.server_listens() {
                            return Ok(self.adapter_failed(DropInError::Listening(e)).await);
                        }
                    }
                }
            }
        }
    }

    /// Says that signal `number` was forwarded; returns when the server's
    /// processes are killed if it has not exited by then.
    fn told_to_stop(&self, number: i32) -> tokio::time::Instant {
        say(&format!(
            "{} received: forwarded to the server (pid {}); its processes are killed if it has not exited within {} s",
            crate::run::supervise::signal_name(number),
            self.child.pid(),
            self.grace.as_secs()
        ));
        tokio::time::Instant::now() + self.grace
    }

    /// The server exited with `status`: whatever it left in its group goes
    /// with it.
    fn exited(
        &mut self,
        status: std::io::Result<std::process::ExitStatus>,
    ) -> Result<Ended, DropInError> {
        self.child.signal(Signal::SIGKILL);
        let status = status.map_err(ProcessError::LostServer)?;
        self.metrics
            .server()
            .observe(&Event::exited(status, &self.child.oom_reading()));
        Ok(Ended::Server(exit_code(status)))
    }

    /// What an adapter left for the server's start could not start: said,
    /// then the server stopped.
    async fn adapter_failed(&mut self, failure: DropInError) -> Ended {
        // Said before the stop, which may take the grace.
        say(&failure.to_string());
        let _ = self.child.stop(self.grace).await;
        Ended::AdapterFailed(failure)
    }
}

/// The metrics endpoint of a `server` run alone
/// (`EREBINE_AGENT_LMCACHE_METRICS_PORT`, `_HOST`; `docs/metrics.md`): the
/// guards' and gateways' families and the server's exits. Under
/// `lmcache-tier launch` the launch serves them and sets the port to 0
/// here. `None` for other commands (`bench l2`), or with the port unset or
/// 0.
fn start_metrics(
    server: &DropIn,
    vars: &Vars,
    metrics: &Arc<NodeMetrics>,
) -> Result<Option<MetricsEndpoint>, DropInError> {
    let is_server = server.text_args.first().map(String::as_str) == Some("server");
    // Unset: no endpoint, as the stock server has none.
    let Some(address) = metrics_address(vars, 0)?.filter(|_| is_server) else {
        return Ok(None);
    };
    for (flag, role, port) in server_ports(&server.text_args) {
        if port == address.port() {
            return Err(DropInError::Config(ConfigError::PortClash {
                first: format!("{METRICS_PORT}={port} (the metrics endpoint)"),
                second: format!("{flag} {port} ({role})"),
                port,
            }));
        }
    }
    let endpoint = MetricsEndpoint::start(address, METRICS_PORT, metrics.clone())?;
    say(&format!("metrics on http://{}/metrics", endpoint.address()));
    Ok(Some(endpoint))
}

/// The server's own ports, as LMCache's parser reads `args` (`server`
/// first): `--port` (LMCache 0.5.6's default 5555) and `--http-port`
/// (8080), each with its role. Arguments LMCache would refuse give the
/// defaults: the server refuses them itself.
fn server_ports(args: &[String]) -> [(&'static str, &'static str, u16); 2] {
    let flags: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    let read = server_flags().read(&flags).unwrap_or_default();
    let last = |flag: &str| {
        read.iter()
            .rev()
            .find(|o| o.flag == flag)
            .and_then(|o| o.values.last()?.parse().ok())
    };
    [
        (
            "--port",
            "the server's ZMQ port",
            last("--port").unwrap_or(5555),
        ),
        (
            "--http-port",
            "the server's HTTP port",
            last("--http-port").unwrap_or(8080),
        ),
    ]
}

/// How long a server told to stop has before its processes are killed,
/// without a launch's [`crate::run::launch::STOP_GRACE`]: the launch's own
/// default `--stop-grace`.
const STOP_GRACE: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_tiers_are_refused_by_key_then_by_adapter_less_the_launchs() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().display().to_string();
        let check = |tiers: &[String], vars: &[(&str, &str)]| {
            let args: Vec<String> = tiers
                .iter()
                .flat_map(|t| ["--l2-adapter".to_string(), t.clone()])
                .collect();
            let vars = crate::node::env::text_vars(vars.iter().copied());
            server_adapters(&L2AdapterArgs::parse(&args), &vars).map(|_| ())
        };
        let tier = |path: &str, gb: &str| {
            format!(r#"{{"type":"fs","base_path":"{path}","max_capacity_gb":{gb}}}"#)
        };
        let negative = [
            r#"{"type":"s3"}"#.to_string(),
            tier("/nonexistent/tier", "-5"),
        ];
        let e = check(&negative, &[]).unwrap_err();
        assert!(matches!(e, Failure::Guards(_)), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("L2 tier 1 (base_path /nonexistent/tier)"),
            "{text}"
        );
        assert!(text.contains("max_capacity_gb = -5"), "{text}");
        let too_large = [tier(&base, "1e9")];
        let e = check(&too_large, &[]).unwrap_err();
        assert!(matches!(e, Failure::Check(AdapterError::Guard(_))), "{e:?}");
        assert!(e.to_string().contains("L2 tier 0"), "{e}");
        let listed = format!(r#"["{base}"]"#);
        let guarded_by_launch = [(
            lmcache_capacity_guard::adapter::GUARDED_BY_LAUNCH,
            listed.as_str(),
        )];
        assert!(
            check(&too_large, &guarded_by_launch).is_ok(),
            "the launch checked it"
        );
    }

    #[test]
    fn the_servers_ports_are_read_as_lmcache_reads_them() {
        let ports = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            server_ports(&args).map(|(_, _, port)| port)
        };
        assert_eq!(ports(&["server"]), [5555, 8080]);
        assert_eq!(
            ports(&["server", "--port", "7000", "--http-port=7001"]),
            [7000, 7001]
        );
        assert_eq!(
            ports(&["server", "--http-p", "9000", "--port", "1", "--port", "2"]),
            [2, 9000]
        );
    }
}
