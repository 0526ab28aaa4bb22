//! What `lmcache-tier inspect` does: finds the node's `/status` URL, its
//! disk tiers, the LMCache a launch would run and the node's API key as a
//! launch would, then reads the server, its gateways and its launch's
//! metrics once, or redraws them on a terminal (`docs/inspect.md`).

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::CommandError;
use crate::inspect::{self, live, InspectError, Inspection};
use crate::node::env::{text_var, NodeEnv, Vars};
use crate::node::ports;
use crate::plan::{api_key, gpu, locate};
use crate::process::runtime;
use crate::status::StatusClient;

/// How long `inspect` waits for one S3 gateway's state, and for the
/// launch's metrics (both answer from memory on loopback, so this only
/// bounds a port that does not answer).
const GATEWAY_TIMEOUT: Duration = Duration::from_secs(1);

/// What `lmcache-tier inspect` was asked for.
#[derive(Debug, Clone, Default)]
pub struct InspectRequest {
    /// The server's `/status` URL (`--url`); default: the HTTP port a launch
    /// on these variables plans.
    pub url: Option<String>,
    /// Redraw every this often (`--watch`) instead of reading once.
    pub watch: Option<Duration>,
}

/// Reads the node `vars` describe as [`InspectRequest`] asks: `None` when
/// it redrew the view until stopped (`--watch`), else the one reading,
/// whose [`Inspection::verdict`] is the command's status.
///
/// Errors: a bad variable ([`CommandError::Config`]), a bad URL, `--watch`
/// without a terminal, an unusable API key ([`CommandError::Inspect`]), or
/// no runtime ([`CommandError::Process`]).
pub fn inspect(request: InspectRequest, vars: &Vars) -> Result<Option<Inspection>, CommandError> {
    let node = NodeEnv::from_vars(vars)?;
    let url = request.url.unwrap_or_else(|| {
        format!(
            "http://127.0.0.1:{}/status",
            ports::http_listener(&node).port
        )
    });
    inspect::check_url(&url)?;
    if request.watch.is_some() {
        live::check_terminal()?;
    }
    let (disk_dirs, declares_capacity) = disk_tiers(&node);
    // What a launch would run, if it can be found; inspect needs no LMCache.
    let own = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("lmcache-tier"));
    let stock = locate::server_executable(node.lmcache_path.as_deref(), vars, &own)
        .and_then(|executable| locate::find_stock_lmcache(vars, &executable))
        .ok();
    let lmcache = stock.as_deref().map(locate::LmcacheInstall::at);
    let gpu = stock.and_then(|stock| gpu::measure(&stock, vars));
    let lookup = |name: &str| text_var(vars, name);
    let key =
        api_key::for_client(node.api_key_file.as_deref(), &lookup).map_err(InspectError::from)?;
    let client = StatusClient::new(url.clone()).with_api_key(key);
    let read = async || {
        let poll = client.poll().await;
        let mut report = Inspection::build(&url, &poll, &disk_dirs, Some(&declares_capacity));
        report.lmcache = lmcache.clone();
        report.gpu = gpu.clone();
        report.read_gateways(GATEWAY_TIMEOUT).await;
        report.read_launch(node.metrics, GATEWAY_TIMEOUT).await;
        report
    };
    let runtime = runtime()?;
    if let Some(interval) = request.watch {
        runtime.block_on(live::run(interval, read))?;
        return Ok(None);
    }
    Ok(Some(runtime.block_on(read())))
}

/// The directories of the node's disk tiers (the built-in one, or each
/// `fs`/`fs_native` tier of its cascade with a `base_path`), and, per tier
/// of the cascade, whether LMCache bounds it itself.
fn disk_tiers(node: &NodeEnv) -> (Vec<PathBuf>, Vec<bool>) {
    match node.custom_cascade() {
        None => (vec![node.disk_path.clone()], vec![true]),
        Some(cascade) => (
            cascade
                .tiers()
                .iter()
                .filter(|t| t.is_disk_tier())
                .filter_map(|t| t.base_path().map(PathBuf::from))
                .collect(),
            cascade.tiers().iter().map(|t| t.lmcache_evicts()).collect(),
        ),
    }
}
