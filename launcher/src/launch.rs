//! Running a [`LaunchPlan`]: check the ports, start the server through the
//! planned executable, wait for `/status`, run until SIGTERM/SIGINT, stop.

use std::net::{Ipv4Addr, TcpListener};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use tokio::process::Command;
use tokio::signal::unix::{signal, SignalKind};

use lmcache_housekeeping::Mode;

use crate::env;
use crate::plan::LaunchPlan;
use crate::status::{Poll, StatusClient};
use crate::supervise::{describe, Output, Supervised};

/// Settings of one run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// How long the server may take to answer `/status` with 200.
    pub ready_timeout: Duration,
    /// How often `/status` is polled while waiting.
    pub ready_poll: Duration,
    /// How long a stop waits after SIGTERM before SIGKILL.
    pub stop_grace: Duration,
}

impl Default for RunOptions {
    /// 180 s to become ready (LMCache takes 20-25 s on a small host, mostly
    /// imports), polls every 0.5 s, 30 s of grace on stop.
    fn default() -> Self {
        RunOptions {
            ready_timeout: Duration::from_secs(180),
            ready_poll: Duration::from_millis(500),
            stop_grace: Duration::from_secs(30),
        }
    }
}

/// Why a launch did not run to a requested stop.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A port the server needs is taken.
    #[error("{variable}={port}: port {port} on 127.0.0.1 is already in use ({detail}). Stop what holds it (`ss -ltnp 'sport = :{port}'`) or choose another port with {variable}")]
    PortInUse {
        /// The variable that sets the port.
        variable: &'static str,
        /// The port.
        port: u16,
        /// The bind error.
        detail: String,
    },
    /// The executable could not be started.
    #[error("cannot start {executable}: {detail}")]
    Spawn {
        /// The executable.
        executable: String,
        /// The OS error.
        detail: String,
    },
    /// The server exited before it answered `/status`.
    #[error("the LMCache server exited before it was ready ({status}); its last lines:\n{}", tail.join("\n"))]
    ExitedBeforeReady {
        /// How it ended.
        status: String,
        /// Its last output lines.
        tail: Vec<String>,
    },
    /// The server did not answer `/status` in time.
    #[error("the LMCache server did not answer {url} within {}s (last poll: {last}); it was stopped. Its last lines:\n{}", timeout.as_secs(), tail.join("\n"))]
    NotReady {
        /// The polled URL.
        url: String,
        /// The timeout.
        timeout: Duration,
        /// What the last poll saw.
        last: String,
        /// Its last output lines.
        tail: Vec<String>,
    },
    /// The server exited while it was serving.
    #[error("the LMCache server exited ({status}); its last lines:\n{}", tail.join("\n"))]
    Exited {
        /// How it ended.
        status: String,
        /// Its last output lines.
        tail: Vec<String>,
    },
    /// An `s3` tier with `s3_bucket` cannot work (bad key, unreachable
    /// endpoint, refused credentials); the server was not started.
    #[error("{0}; the server was not started")]
    Gateway(#[from] lmcache_adapters::s3::GatewayError),
    /// Housekeeping of the disk tier failed; the server was not started.
    #[error("housekeeping of the disk tier failed, the server was not started: {0}")]
    Housekeeping(#[from] lmcache_housekeeping::HousekeepingError),
    /// Waiting on the server failed.
    #[error("lost track of the LMCache server: {0}")]
    Io(#[from] std::io::Error),
}

/// Fails when a port the plan binds is already taken on 127.0.0.1.
pub fn check_ports(plan: &LaunchPlan) -> Result<(), LaunchError> {
    for (variable, port) in [
        (env::MP_PORT, plan.mp_port),
        (env::HTTP_PORT, plan.http_port),
    ] {
        if let Err(e) = TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
            return Err(LaunchError::PortInUse {
                variable,
                port,
                detail: e.to_string(),
            });
        }
    }
    Ok(())
}

/// Starts the planned server, waits until `/status` answers, and runs until
/// SIGTERM or SIGINT, then stops it. Returns the server's status after a
/// requested stop.
///
/// Errors: a taken port, an executable that does not start, a server that
/// exits or does not become ready (the error quotes its last lines).
pub async fn run(plan: &LaunchPlan, options: &RunOptions) -> Result<ExitStatus, LaunchError> {
    check_ports(plan)?;
    // Path-style gateways for `s3_bucket` tiers, held until this function
    // returns; the server gets specs with per-launch keys only (issue 5).
    let (args, gateways) =
        lmcache_adapters::s3::Gateways::start(&plan.args, &|k| std::env::var(k).ok()).await?;
    // Held until this function returns: no other launch or housekeeping may
    // touch the directory while the server runs (issue 3, step 5).
    let _housekeeping = match &plan.housekeeping {
        Some(hk) => {
            let done = hk.run(Mode::Apply)?;
            tracing::info!("{}", done.report);
            Some(done)
        }
        None => None,
    };
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut command = Command::new(&plan.executable);
    // The operator's adapter JSON may carry real credentials: the server's
    // environment never does.
    command
        .args(&args)
        .envs(&plan.env)
        .env_remove(env::L2_ADAPTER);
    for variable in gateways.env_to_remove() {
        command.env_remove(variable);
    }
    let mut server = Supervised::spawn(command, Output::Tee).map_err(|e| LaunchError::Spawn {
        executable: plan.executable.display().to_string(),
        detail: e.to_string(),
    })?;
    tracing::info!(pid = server.pid(), executable = %plan.executable.display(), "LMCache server started; waiting for {}", plan.status_url());

    let client = StatusClient::new(plan.status_url());
    let started = Instant::now();
    loop {
        let poll = tokio::select! {
            status = server.wait() => {
                return Err(LaunchError::ExitedBeforeReady { status: describe(status?), tail: server.tail() });
            }
            _ = terminate.recv() => return stop(&mut server, "SIGTERM", options).await,
            _ = interrupt.recv() => return stop(&mut server, "SIGINT", options).await,
            poll = client.poll() => poll,
        };
        let last = match poll {
            Poll::Up(_) => break,
            Poll::NotReady(code) => format!("HTTP {code}"),
            Poll::NoAnswer(e) => e,
        };
        if started.elapsed() >= options.ready_timeout {
            server.stop(options.stop_grace).await?;
            return Err(LaunchError::NotReady {
                url: plan.status_url(),
                timeout: options.ready_timeout,
                last,
                tail: server.tail(),
            });
        }
        tokio::select! {
            status = server.wait() => {
                return Err(LaunchError::ExitedBeforeReady { status: describe(status?), tail: server.tail() });
            }
            _ = tokio::time::sleep(options.ready_poll) => {}
        }
    }
    tracing::info!(
        "LMCache server ready in {:.1}s: {} answers; ZMQ on tcp://127.0.0.1:{}",
        started.elapsed().as_secs_f64(),
        plan.status_url(),
        plan.mp_port
    );
    tokio::select! {
        status = server.wait() => Err(LaunchError::Exited { status: describe(status?), tail: server.tail() }),
        _ = terminate.recv() => stop(&mut server, "SIGTERM", options).await,
        _ = interrupt.recv() => stop(&mut server, "SIGINT", options).await,
    }
}

async fn stop(
    server: &mut Supervised,
    why: &str,
    options: &RunOptions,
) -> Result<ExitStatus, LaunchError> {
    tracing::info!(
        "{why} received: stopping the LMCache server (pid {})",
        server.pid()
    );
    let status = server.stop(options.stop_grace).await?;
    tracing::info!("LMCache server stopped ({})", describe(status));
    Ok(status)
}
