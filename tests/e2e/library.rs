//! End to end through the library, as the node agent uses it: plan from an
//! environment map, start the real server with `launch::start`, receive the
//! liveness events, stop through the handle.

use std::time::Duration;

use lmcache_launcher::plan::launch_plan::LaunchPlan;
use lmcache_launcher::run::launch::{self, RunOptions};
use lmcache_launcher::status::events::Event;
use lmcache_launcher::{plan, DiskAccess, EngineFacts, Facts, HostFacts, Planned, Vars};
use lmcache_tier_e2e::{
    binaries, free_port, get_json, lmcache_venv, processes_mentioning, Binaries,
};

const BINS: Binaries = binaries!();

#[tokio::test(flavor = "current_thread")]
async fn the_agent_starts_watches_and_stops_a_server_through_the_handle() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let http_port = free_port();
    let plan = plan_server(&node_vars(dir, http_port, free_port()));

    let mut handle = launch::start(*plan, RunOptions::default());
    let first = tokio::time::timeout(Duration::from_secs(180), handle.events.recv())
        .await
        .expect("an event within 180 s");
    assert!(
        matches!(first, Some(Event::Ready)),
        "first event: {first:?}"
    );
    let url = format!("http://127.0.0.1:{http_port}/status");
    let status = tokio::task::spawn_blocking(move || get_json(&url))
        .await
        .unwrap();
    assert!(status.is_some(), "the server answers /status once Ready");

    handle.stop();
    let ended = tokio::time::timeout(Duration::from_secs(60), handle.wait())
        .await
        .expect("the launch ends within 60 s of stop()");
    assert!(ended.is_ok(), "{ended:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left = processes_mentioning(&dir.display().to_string());
    assert!(left.is_empty(), "processes left after stop(): {left:?}");
}

/// The metrics port of the launch of
/// [`the_endpoint_answers_while_the_launch_housekeeps`].
static METRICS_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
/// What a scrape made during that launch's housekeeping got.
static DURING_HOUSEKEEPING: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// A [`RunOptions::progress`] that scrapes the launch's endpoint before it
/// runs the housekeeping `work`: on the launch's runtime thread, which is
/// blocked meanwhile as by the housekeeping itself.
fn scrape_first(message: &str, work: &mut dyn FnMut()) {
    use std::io::{Read, Write};
    if message.starts_with("housekeeping") {
        let port = METRICS_PORT.load(std::sync::atomic::Ordering::Relaxed);
        let mut answer = String::new();
        let scraped = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut stream| {
            stream.set_read_timeout(Some(Duration::from_secs(60)))?;
            stream.write_all(b"GET /metrics HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")?;
            stream.read_to_string(&mut answer)
        });
        let seen = match scraped {
            Ok(_) => answer,
            Err(e) => format!("no answer: {e}"),
        };
        *DURING_HOUSEKEEPING.lock().unwrap() = Some(seen);
    }
    work()
}

#[tokio::test(flavor = "current_thread")]
async fn the_endpoint_answers_while_the_launch_housekeeps() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let metrics_port = free_port();
    METRICS_PORT.store(metrics_port, std::sync::atomic::Ordering::Relaxed);
    let plan = plan_server(&node_vars(dir, free_port(), metrics_port));
    assert!(
        plan.housekeeping.is_some(),
        "the built-in tier is housekept"
    );
    // As the command-line launch runs: on a runtime of one thread.
    let options = RunOptions {
        progress: scrape_first,
        ..RunOptions::default()
    };
    let handle = launch::start(*plan, options);
    let started = std::time::Instant::now();
    let seen = loop {
        if let Some(seen) = DURING_HOUSEKEEPING.lock().unwrap().clone() {
            break seen;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no housekeeping"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    handle.stop();
    let ended = tokio::time::timeout(Duration::from_secs(60), handle.wait()).await;
    assert!(ended.is_ok(), "the launch ends within 60 s of stop()");
    assert!(seen.starts_with("HTTP/1.1 200 OK"), "{seen}");
    assert!(
        seen.contains("lmcache_tier_plan_l1_bytes 1073741824"),
        "{seen}"
    );
}

/// The node's variables for a launch through the library: the real
/// LMCache's venv, 1 GiB of L1, the built-in tier (2 GiB) in `dir/cache`,
/// the server's HTTP port `http_port` and the metrics on `metrics_port`.
fn node_vars(dir: &std::path::Path, http_port: u16, metrics_port: u16) -> Vars {
    [
        ("PATH", "/usr/bin:/bin".to_string()),
        ("VIRTUAL_ENV", lmcache_venv().display().to_string()),
        ("EREBINE_AGENT_KV_CACHE_BACKEND", "lmcache".into()),
        ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1".into()),
        (
            "EREBINE_AGENT_LMCACHE_DISK_PATH",
            dir.join("cache").display().to_string(),
        ),
        ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "2".into()),
        ("EREBINE_AGENT_LMCACHE_MP_PORT", free_port().to_string()),
        ("EREBINE_AGENT_LMCACHE_HTTP_PORT", http_port.to_string()),
        (
            "EREBINE_AGENT_LMCACHE_METRICS_PORT",
            metrics_port.to_string(),
        ),
        (
            "EREBINE_AGENT_LMCACHE_PATH",
            BINS.erebine_lmcache().display().to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.into()))
    .collect()
}

/// The server's plan for a small engine (`test-model`, one GPU, 512
/// batched tokens) on the node `vars`, measured as a launch measures it.
fn plan_server(vars: &Vars) -> Box<LaunchPlan> {
    let facts = EngineFacts {
        model: "test-model".into(),
        tensor_parallel_size: 1,
        pipeline_parallel_size: 1,
        data_parallel_size: 1,
        kv_cache_dtype: "auto".into(),
        block_size: 16,
        max_num_batched_tokens: Some(512),
        hybrid_attention: false,
        ..EngineFacts::default()
    };
    let measured = Facts::measure(&facts, vars, DiskAccess::Create).unwrap();
    let host = HostFacts::from(&measured);
    drop(measured);
    let Planned::Server(plan) = plan(&facts, vars, &host).unwrap() else {
        panic!("the lmcache backend plans a server");
    };
    plan
}
